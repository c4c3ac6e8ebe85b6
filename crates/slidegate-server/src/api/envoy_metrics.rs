//! The routes of the metrics listener
//! ([`MetricsListener`](crate::server::MetricsListener)):
//! envoyproxy/ratelimit's Prometheus endpoint as Envoy Gateway scrapes it.
//!
//! `GET <path>` answers slidegate's metrics, then envoyproxy/ratelimit's
//! stats as Envoy Gateway's default statsd mapping names them, in the
//! Prometheus text format 0.0.4 (`Metrics::render_envoy_gateway`), every
//! figure read when scraped.

use crate::api::http::Routes;
use crate::service::Shared;
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::header::{ALLOW, CONTENT_TYPE};
use http::{HeaderValue, Method, StatusCode};
use std::sync::Arc;

/// What the listener's connections are answered with.
struct View {
    shared: Arc<Shared>,
    path: String,
}

/// The routes of the metrics listener over `shared`, the metrics at
/// `path`.
pub(crate) fn routes(shared: Arc<Shared>, path: &str) -> Routes {
    let view = Arc::new(View {
        shared,
        path: path.to_owned(),
    });
    // Every request goes to one handler, which compares the path itself:
    // any path the user gives is served as written.
    let router = Router::new().fallback(answer).with_state(view);
    Routes::only(router)
}

/// `GET <path>` (and `HEAD`): the metrics; another method there: 405; any
/// other path: 404.
async fn answer(State(view): State<Arc<View>>, method: Method, request: http::Request<Body>) -> Response {
    if request.uri().path() != view.path {
        let text = format!(
            "no endpoint at {}; the metrics are at GET {}\n",
            request.uri().path(),
            view.path
        );
        return (StatusCode::NOT_FOUND, text).into_response();
    }
    if method != Method::GET && method != Method::HEAD {
        let mut response = (StatusCode::METHOD_NOT_ALLOWED, "GET only\n").into_response();
        response
            .headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    let own = view.shared.metrics_text();
    let text = view.shared.service.metrics().render_envoy_gateway(&own);
    let mut response = text.into_response();
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}
