//! The trivial service behind the layer in its benchmarks (the criterion
//! group `layer_overhead` and the `layer_calls` example).

use http::{Request, Response};
use std::convert::Infallible;
use std::task::{Context, Poll};
use tower::Service;

/// The service behind the layer: answers at once, as a handler returning
/// text would.
#[derive(Clone)]
pub(crate) struct Hello;

impl Service<Request<String>> for Hello {
    type Response = Response<String>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response<String>, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _request: Request<String>) -> Self::Future {
        // What axum answers for a `&str`: a body and its content type.
        let mut response = Response::new(String::from("hello"));
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        std::future::ready(Ok(response))
    }
}
