//! The HTTP API: envoyproxy/ratelimit's `POST /json`, slidegate's
//! `POST /v1/check` and `POST /v1/reset`, `GET /healthz` and
//! `GET /metrics`.

use crate::api::problem::Problem;
use crate::api::wire::{
    CheckBody, DecisionBody, answer_headers, answer_json, answer_to_wire, parse_check_body, request_from_wire,
};
use crate::engine::{AdHoc, Answer, Code};
use crate::log_limit::LogLimit;
use crate::metrics::{Api, AuthFailure};
use crate::proto::rls::RateLimitRequest;
use crate::service::Shared;
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http::header::{AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderMap, HeaderValue, StatusCode};
use serde_json::json;
use slidegate_tower::LimitOutcome;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tower::ServiceExt;

/// The routes, over `shared`.
pub(crate) fn router(shared: Arc<Shared>) -> Router {
    // One for the router: its every request shares it.
    let admin_log = Arc::new(LogLimit::new(ADMIN_LOG_EVERY));
    Router::new()
        .route("/json", post(json))
        .route("/v1/check", post(check))
        .route(
            "/v1/reset",
            post(move |state, request| reset(state, request, admin_log)),
        )
        .route("/healthz", get(|| async { "OK\n" }))
        // envoyproxy/ratelimit's health check path.
        .route("/healthcheck", get(healthcheck))
        .route("/readyz", get(ready))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(Arc::clone(&shared), in_flight))
        .with_state(shared)
}

/// What a connection's request is answered with.
type Answering = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

/// The decision routes' handlers, for a request to one of them.
type HotRoutes = dyn Fn(http::Request<Body>) -> Answering + Send + Sync;

/// The service each HTTP connection serves: `POST /json` and `POST
/// /v1/check`, the decision routes, called straight, everything else
/// through [`router`] (which also has them, for callers that embed it). The
/// router's matching, its middleware and their futures cost a decision
/// about 6,400 instructions of 39,800 (BENCHMARKS.md); the answers are the
/// same.
#[derive(Clone)]
pub(crate) struct Routes {
    router: Router,
    hot: Arc<HotRoutes>,
}

impl Routes {
    /// Routes answered by `router` alone, no decision route called
    /// straight (a listener of other endpoints).
    pub(crate) fn only(router: Router) -> Routes {
        let hot_router = router.clone();
        let hot = move |request: http::Request<Body>| -> Answering { Box::pin(hot_router.clone().oneshot(request)) };
        Routes {
            router,
            hot: Arc::new(hot),
        }
    }
}

/// The routes of a server over `shared`.
pub(crate) fn routes(shared: Arc<Shared>) -> Routes {
    let router = router(Arc::clone(&shared));
    let hot = move |request: http::Request<Body>| -> Answering {
        let shared = Arc::clone(&shared);
        Box::pin(async move {
            // As the router's `in_flight` layer counts every other request.
            let _in_flight = shared.service.metrics().http_request();
            let answer = if request.uri().path() == "/json" {
                json(State(shared), request).await
            } else {
                check(State(shared), request).await
            };
            Ok(answer.into_response())
        })
    };
    Routes {
        router,
        hot: Arc::new(hot),
    }
}

impl hyper::service::Service<http::Request<hyper::body::Incoming>> for Routes {
    type Response = Response;
    type Error = Infallible;
    type Future = Answering;

    fn call(&self, request: http::Request<hyper::body::Incoming>) -> Answering {
        let hot = request.method() == http::Method::POST && matches!(request.uri().path(), "/json" | "/v1/check");
        let request = request.map(Body::new);
        if hot {
            (self.hot)(request)
        } else {
            Box::pin(self.router.clone().oneshot(request))
        }
    }
}

/// Ready to take traffic: not draining, (with `--ready-requires-redis`)
/// Redis answered at the last look, and (with `--ready-requires-config`)
/// a config with a domain is in force.
async fn ready(State(shared): State<Arc<Shared>>) -> Result<&'static str, Problem> {
    match shared.not_ready() {
        Some(why) => Err(Problem::new(StatusCode::SERVICE_UNAVAILABLE, why)),
        None => Ok("OK\n"),
    }
}

/// envoyproxy/ratelimit's health check, which its probes (Envoy Gateway's
/// readiness, liveness and startup probes) ask: 503 while draining after
/// SIGTERM (upstream fails it on SIGTERM too), and for every reason
/// `/readyz` has (Redis silent with `--ready-requires-redis`, its
/// `REDIS_HEALTH_CHECK_ACTIVE_CONNECTION`; no config with a domain with
/// `--ready-requires-config`; the xDS client's first snapshot awaited).
async fn healthcheck(State(shared): State<Arc<Shared>>) -> Result<&'static str, Problem> {
    if let Some(why) = shared.not_ready() {
        return Err(Problem::new(StatusCode::SERVICE_UNAVAILABLE, why));
    }
    Ok("OK\n")
}

/// The endpoints, for the answer to a path that is none of them.
const ENDPOINTS: &str =
    "POST /json, POST /v1/check, POST /v1/reset, GET /healthz, GET /healthcheck, GET /readyz, GET /metrics";

/// A path that is no endpoint: 404, as a problem document.
async fn not_found(method: http::Method, uri: http::Uri) -> Problem {
    Problem::new(
        StatusCode::NOT_FOUND,
        format!("no endpoint at {method} {}; the endpoints are {ENDPOINTS}", uri.path()),
    )
}

/// An endpoint asked with the wrong method: 405, as a problem document.
async fn method_not_allowed(method: http::Method, uri: http::Uri) -> Problem {
    Problem::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{} does not take {method}; the endpoints are {ENDPOINTS}", uri.path()),
    )
}

/// Counts the request in `slidegate_http_requests_in_flight` until it is
/// answered.
async fn in_flight(
    State(shared): State<Arc<Shared>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let _guard = shared.service.metrics().http_request();
    next.run(request).await
}

/// The answer to a request that comes when the in-flight budget is spent
/// (`--max-in-flight`, [`crate::net::admission`]): 503 with a problem
/// document, to retry in a second.
pub(crate) fn overloaded() -> Response {
    let mut response = Problem::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "the service has as many requests in flight as it takes (--max-in-flight); retry shortly",
    )
    .into_response();
    response
        .headers_mut()
        .insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

/// Reads the whole body, refusing one over the limit with 413 and one that
/// does not arrive within `timeout` with 408.
async fn read_body(body: Body, headers: &HeaderMap, limit: usize, timeout: Duration) -> Result<bytes::Bytes, Problem> {
    let too_large = || Problem {
        status: StatusCode::PAYLOAD_TOO_LARGE,
        detail: format!("the body is over the limit of {limit} bytes"),
    };
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let Ok(read) = tokio::time::timeout(timeout, axum::body::to_bytes(body, limit)).await else {
        return Err(Problem::new(
            StatusCode::REQUEST_TIMEOUT,
            format!("the body did not arrive within {timeout:?}"),
        ));
    };
    read.map_err(|e| {
        let inner = e.into_inner();
        if inner.is::<http_body_util::LengthLimitError>() {
            too_large()
        } else {
            Problem::bad_request(format!("the body could not be read: {inner}"))
        }
    })
}

/// Whether the request may use an admin endpoint: with no admin token
/// configured, the endpoint is off (404, saying how to turn it on); without
/// `Authorization: Bearer <token>`, 401; with another token, 403.
fn authorize(admin_token: Option<&[u8]>, headers: &HeaderMap, endpoint: &str) -> Result<(), Problem> {
    let Some(token) = admin_token else {
        return Err(Problem::new(
            StatusCode::NOT_FOUND,
            format!(
                "{endpoint} is off: start the service with --admin-token (or SLIDEGATE_ADMIN_TOKEN) and send `Authorization: Bearer <token>`"
            ),
        ));
    };
    let given = headers.get(AUTHORIZATION).and_then(|v| {
        let v = v.as_bytes();
        let scheme = v.get(..7)?;
        let rest = v.get(7..)?;
        scheme.eq_ignore_ascii_case(b"bearer ").then(|| rest.trim_ascii())
    });
    match given {
        None => Err(Problem::new(
            StatusCode::UNAUTHORIZED,
            format!("{endpoint} needs `Authorization: Bearer <the admin token>`"),
        )),
        Some(given) if same_bytes(given, token) => Ok(()),
        Some(_) => Err(Problem::new(StatusCode::FORBIDDEN, "the admin token is wrong")),
    }
}

/// The shortest time between two log lines about refused admin tokens.
const ADMIN_LOG_EVERY: Duration = Duration::from_secs(10);

/// Counts a request refused by [`authorize`] (401 or 403; a 404, the
/// endpoint off, is no token attempt) and logs it at warn, at most once
/// each [`ADMIN_LOG_EVERY`], saying how many were refused since the last
/// line. Nothing the request carried is logged (not its token, nor its
/// address): a client must not be able to write into the log.
fn admin_refused(shared: &Shared, log: &LogLimit, status: StatusCode) {
    let reason = match status {
        StatusCode::UNAUTHORIZED => AuthFailure::Missing,
        StatusCode::FORBIDDEN => AuthFailure::Wrong,
        _ => return,
    };
    shared.service.metrics().admin_auth_failure(reason);
    if let Some(held) = log.hit(tokio::time::Instant::now().into_std()) {
        tracing::warn!(
            refused = held.saturating_add(1),
            last = reason.as_str(),
            "POST /v1/reset refused requests without the right admin token: `refused` of them since the last such line (this line at most once each {} s; slidegate_admin_auth_failures_total counts each, by reason)",
            log.interval().as_secs(),
        );
    }
}

/// Whether `a` and `b` are equal, in time that depends on their lengths
/// only, not on where they first differ (the token's length is not a
/// secret worth the trouble).
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a
        .iter()
        .zip(b)
        .fold(0u8, |acc, (x, y)| std::hint::black_box(acc | (x ^ y)));
    diff == 0
}

fn json_response(status: StatusCode, body: &impl serde::Serialize, mut headers: HeaderMap) -> Response {
    let bytes = serde_json::to_vec(body).unwrap_or_else(|_| b"{}".to_vec());
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    let mut response = Response::new(Body::from(bytes));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
}

fn status_of(answer: &Answer) -> StatusCode {
    match answer.overall {
        Code::Ok => StatusCode::OK,
        Code::OverLimit => StatusCode::TOO_MANY_REQUESTS,
    }
}

/// `POST /json`: proto3 JSON of `RateLimitRequest` in, of
/// `RateLimitResponse` out, 200 or 429, as envoyproxy/ratelimit.
async fn json(State(shared): State<Arc<Shared>>, request: axum::extract::Request) -> Result<Response, Problem> {
    let _timer = shared.service.metrics().time(Api::Json);
    // The headers taken, not copied (axum's `HeaderMap` extractor clones them).
    let (http::request::Parts { headers, .. }, body) = request.into_parts();
    let bytes = read_body(body, &headers, shared.body_limit, shared.body_timeout).await?;
    let wire: RateLimitRequest = serde_json::from_slice(&bytes).map_err(|e| {
        shared.service.invalid(Api::Json);
        Problem::bad_request(format!("the body is not a RateLimitRequest in proto3 JSON: {e}"))
    })?;
    let request = request_from_wire(wire);
    let answer = shared.service.decide(Api::Json, &request, &headers).await?;
    let wire = answer_to_wire(
        &request,
        &answer,
        &shared.grpc_headers,
        shared.engine().settings().dynamic_metadata,
    );
    Ok(json_response(
        status_of(&answer),
        &wire,
        answer_headers(&answer, &shared.http_headers),
    ))
}

/// `POST /v1/check`: descriptors of a configured domain, or an ad-hoc key
/// with its own limit; 200 or 429, the decision as JSON, and the headers.
/// A cost of 0 (or `hits_addend` 0 on a descriptor) peeks.
async fn check(State(shared): State<Arc<Shared>>, request: axum::extract::Request) -> Result<Response, Problem> {
    let mut timer = shared.service.metrics().time(Api::Check);
    // The headers taken, not copied (axum's `HeaderMap` extractor clones them).
    let (http::request::Parts { headers, .. }, body) = request.into_parts();
    let bytes = read_body(body, &headers, shared.body_limit, shared.body_timeout).await?;
    let parsed = parse_check_body(&bytes).inspect_err(|_| {
        shared.service.invalid(Api::Check);
    })?;
    match parsed {
        CheckBody::Descriptors(request) => {
            let answer = shared.service.decide(Api::Check, &request, &headers).await?;
            Ok(json_response(
                status_of(&answer),
                &answer_json(&answer),
                answer_headers(&answer, &shared.http_headers),
            ))
        }
        CheckBody::AdHoc(body) => {
            timer.api = Api::AdHoc;
            let start = Instant::now();
            let policy = body.policy().inspect_err(|_| {
                shared.service.invalid(Api::AdHoc);
            })?;
            let ad_hoc = AdHoc {
                key: body.key,
                policy,
                cost: body.cost.unwrap_or(1),
            };
            let decision = shared.service.decide_ad_hoc(&ad_hoc, &headers, start).await?;
            let mut headers = HeaderMap::new();
            if shared.http_headers.draft || shared.http_headers.legacy.is_some() {
                let limits = [LimitOutcome {
                    name: "key",
                    policy: &ad_hoc.policy,
                    decision: &decision,
                }];
                slidegate_tower::write_headers(&limits, shared.http_headers.legacy, &mut headers);
            }
            let status = if decision.allowed() {
                StatusCode::OK
            } else {
                StatusCode::TOO_MANY_REQUESTS
            };
            Ok(json_response(
                status,
                &DecisionBody::new(&ad_hoc.key, &decision),
                headers,
            ))
        }
    }
}

/// `POST /v1/reset`: forgets the counts of an ad-hoc key, or of every limit
/// the descriptors match; answers how many counters were held. Off unless
/// an admin token is configured; then the request must carry it, and a
/// refusal is counted and logged within `admin_log` ([`admin_refused`]).
async fn reset(
    State(shared): State<Arc<Shared>>,
    request: axum::extract::Request,
    admin_log: Arc<LogLimit>,
) -> Result<Response, Problem> {
    // The headers taken, not copied (axum's `HeaderMap` extractor clones them).
    let (http::request::Parts { headers, .. }, body) = request.into_parts();
    authorize(shared.admin_token.as_deref(), &headers, "POST /v1/reset")
        .inspect_err(|refused| admin_refused(&shared, &admin_log, refused.status))?;
    let bytes = read_body(body, &headers, shared.body_limit, shared.body_timeout).await?;
    let held = match parse_check_body(&bytes)? {
        CheckBody::Descriptors(request) => {
            let mut held = 0;
            for descriptor in &request.descriptors {
                held += shared.engine().reset_descriptor(&request.domain, descriptor).await?;
            }
            held
        }
        CheckBody::AdHoc(body) => {
            if body.cost.is_some() {
                return Err(Problem::bad_request("a reset takes no `cost`"));
            }
            let policy = body.policy()?;
            usize::from(shared.engine().reset_ad_hoc(&body.key, &policy).await?)
        }
    };
    Ok(json_response(
        StatusCode::OK,
        &json!({ "reset": held }),
        HeaderMap::new(),
    ))
}

/// `GET /metrics`: Prometheus text (OpenMetrics).
async fn metrics(State(shared): State<Arc<Shared>>) -> Response {
    let mut response = shared.metrics_text().into_response();
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_authorization(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        headers
    }

    #[test]
    fn tokens_compare_whole() {
        assert!(same_bytes(b"secret", b"secret"));
        assert!(!same_bytes(b"secret", b"secreT"));
        assert!(!same_bytes(b"secret", b"secret2"));
        assert!(!same_bytes(b"", b"secret"));
    }

    #[test]
    fn authorization_statuses() {
        let status = |token: Option<&[u8]>, headers: &HeaderMap| {
            authorize(token, headers, "POST /v1/reset").map_err(|p| p.status)
        };
        let none = HeaderMap::new();
        assert_eq!(
            status(None, &with_authorization("Bearer t")),
            Err(StatusCode::NOT_FOUND)
        );
        assert_eq!(status(Some(b"t"), &none), Err(StatusCode::UNAUTHORIZED));
        assert_eq!(
            status(Some(b"t"), &with_authorization("Basic t")),
            Err(StatusCode::UNAUTHORIZED)
        );
        assert_eq!(
            status(Some(b"t"), &with_authorization("Bearer")),
            Err(StatusCode::UNAUTHORIZED)
        );
        assert_eq!(
            status(Some(b"t"), &with_authorization("Bearer u")),
            Err(StatusCode::FORBIDDEN)
        );
        assert_eq!(status(Some(b"t"), &with_authorization("Bearer t")), Ok(()));
        assert_eq!(status(Some(b"t"), &with_authorization("BEARER  t ")), Ok(()));
    }
}
