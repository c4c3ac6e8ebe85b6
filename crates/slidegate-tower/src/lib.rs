//! tower and axum middleware for slidegate: per-client rate limits with
//! honest headers.
//!
//! [`RateLimitLayer`] counts each request under a key ([`PeerIp`],
//! [`ForwardedFor`] behind trusted proxies, [`HeaderKey`], [`GlobalKey`] or
//! a closure) against one or more named limits, each a [`Policy`] per key
//! in a bounded in-memory store. It decides in `call`, so the clones that
//! axum makes of a service all share one budget.
//!
//! - **Admitted** requests pass on; their responses carry `RateLimit-Policy`
//!   and `RateLimit` (draft 10 of the IETF rate-limit headers), optionally
//!   the legacy `X-RateLimit-*`.
//! - **Refused** requests get `429 Too Many Requests` with an RFC 9457
//!   `application/problem+json` body of type `quota-exceeded`, the same
//!   headers and `Retry-After`, rounded up: waiting that long lets the same
//!   request through if nothing else arrives (a 300 ms wait is
//!   `Retry-After: 1`, never 0).
//! - **gRPC** requests (`content-type: application/grpc...`) are refused
//!   with `grpc-status: 8` (`RESOURCE_EXHAUSTED`) and the wait in
//!   `grpc-retry-pushback-ms`.
//!
//! [`Policy`]: slidegate_core::Policy
#![forbid(unsafe_code)]
// No panics on the request path: the lints are off in unit tests only.
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::indexing_slicing,
        clippy::panic,
        clippy::unreachable,
        clippy::todo,
        clippy::unimplemented
    )
)]

mod body;
mod headers;
mod key;
mod layer;
mod service;

pub use body::Body;
pub use headers::{
    LegacyReset, LimitOutcome, RATELIMIT, RATELIMIT_POLICY, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING,
    X_RATELIMIT_RESET, write_headers,
};
pub use key::{
    ForwardedFor, GlobalKey, HeaderKey, KeyExtractor, KeyText, MissingKey, Network, NetworkError, PeerIp, RequestKey,
};
pub use layer::{LayerError, RateLimitLayer, RateLimitLayerBuilder};
pub use service::{RateLimitService, ResponseFuture};
