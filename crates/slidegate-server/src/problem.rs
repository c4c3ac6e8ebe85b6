//! The `application/problem+json` documents (RFC 9457) every error answer
//! of the HTTP API carries, hyper's own answers included (`canned.rs`).

use http::StatusCode;
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
