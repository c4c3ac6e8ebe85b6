//! Which rate-limit headers an answer carries ([`HeaderOptions`]), for
//! the gRPC and HTTP front ends alike.

use slidegate_tower::LegacyReset;

/// Which rate-limit headers an answer carries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeaderOptions {
    /// `RateLimit-Policy` and `RateLimit` (draft 10).
    pub draft: bool,
    /// `X-RateLimit-*`, with this flavour of `-Reset`.
    pub legacy: Option<LegacyReset>,
    /// envoyproxy/ratelimit's three headers
    /// (`LIMIT_RESPONSE_HEADERS_ENABLED`), under these names.
    pub envoy: Option<ResponseHeaderNames>,
}

/// The names of envoyproxy/ratelimit's response headers: the limit, the
/// remaining count and the seconds until reset of the descriptor closest
/// to its limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResponseHeaderNames {
    /// `LIMIT_LIMIT_HEADER`, by default `RateLimit-Limit`.
    pub limit: http::HeaderName,
    /// `LIMIT_REMAINING_HEADER`, by default `RateLimit-Remaining`.
    pub remaining: http::HeaderName,
    /// `LIMIT_RESET_HEADER`, by default `RateLimit-Reset`.
    pub reset: http::HeaderName,
}

impl Default for ResponseHeaderNames {
    fn default() -> Self {
        ResponseHeaderNames {
            limit: http::HeaderName::from_static("ratelimit-limit"),
            remaining: http::HeaderName::from_static("ratelimit-remaining"),
            reset: http::HeaderName::from_static("ratelimit-reset"),
        }
    }
}
