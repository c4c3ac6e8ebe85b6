//! The `application/problem+json` documents (RFC 9457) every error answer
//! of the HTTP API carries, hyper's own answers included (`net/canned.rs`).

use crate::engine::EngineError;
use axum::response::{IntoResponse, Response};
use http::header::{CONTENT_TYPE, WWW_AUTHENTICATE};
use http::{HeaderValue, StatusCode};
use serde_json::json;

/// The `application/problem+json` document (RFC 9457) of an error.
pub(crate) fn problem_json(status: StatusCode, detail: &str) -> String {
    json!({
        "type": "about:blank",
        "title": status.canonical_reason().unwrap_or("Error"),
        "status": status.as_u16(),
        "detail": detail,
    })
    .to_string()
}

/// An error answer: an RFC 9457 problem document.
pub(crate) struct Problem {
    pub(crate) status: StatusCode,
    pub(crate) detail: String,
}

impl Problem {
    pub(crate) fn new(status: StatusCode, detail: impl Into<String>) -> Self {
        Problem {
            status,
            detail: detail.into(),
        }
    }

    pub(crate) fn bad_request(detail: impl Into<String>) -> Self {
        Problem::new(StatusCode::BAD_REQUEST, detail)
    }
}

impl From<EngineError> for Problem {
    fn from(e: EngineError) -> Self {
        if e.is_invalid() {
            Problem::bad_request(e.detail())
        } else {
            Problem::new(StatusCode::SERVICE_UNAVAILABLE, e.detail())
        }
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let body = problem_json(self.status, &self.detail);
        let mut response = (self.status, body).into_response();
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        if self.status == StatusCode::UNAUTHORIZED {
            headers.insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}
