//! tower and axum middleware for slidegate: per-client rate limits with
//! honest headers.
//!
//! [`RateLimitLayer`] counts each request under a key ([`PeerIp`],
//! [`ForwardedFor`] behind trusted proxies, [`HeaderKey`], [`GlobalKey`] or
//! a closure) against one or more named limits, each a [`Policy`] per key,
//! in any [`slidegate_store::Store`]: by default a bounded in-memory
//! [`MemoryStore`] of this process (made by the first
//! [`limit`](RateLimitLayerBuilder::limit)), or a store shared by every
//! replica, such as the Redis store that `slidegate_redis::RedisOptions`
//! builds (as `slidegate serve --redis` does: one server, a Sentinel's
//! primary or a Cluster, the hybrid mode, behind its failure policy),
//! given to [`RateLimitLayer::builder_with_store`] (limits added with
//! [`quota`](RateLimitLayerBuilder::quota)):
//!
//! ```no_run
//! # use slidegate_core::{Algorithm, Policy};
//! # use slidegate_redis::RedisOptions;
//! # use slidegate_store::FailurePolicy;
//! # use slidegate_tower::{PeerIp, RateLimitLayer};
//! # use std::time::Duration;
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! # let sliding = Algorithm::DEFAULT;
//! let options = RedisOptions {
//!     urls: vec!["redis://127.0.0.1:6379".to_owned()],
//!     failure: FailurePolicy::Open,
//!     ..RedisOptions::default()
//! };
//! let limit = RateLimitLayer::<(), _>::builder_with_store(PeerIp::new(), options.connect().await?)
//!     .quota("per-client", Policy::new(100, Duration::from_secs(60), sliding)?)
//!     .build()?;
//! # drop(limit);
//! # Ok(())
//! # }
//! ```
//!
//! (`crates/slidegate/examples/axum_redis.rs` in full.) The layer decides in `call`, so the
//! clones that axum makes of a service all share one budget, with one
//! [`Store::decide`](slidegate_store::Store::decide) per request for all
//! of its limits: all or nothing, atomically. A store that does no IO (the
//! in-memory one) decides at once, with nothing boxed or allocated; the
//! answer of one that does (Redis) is awaited in a boxed future before the
//! inner service is called. The request's key is given to the store as
//! text: `global`, `ip:<address>` or `key:<text>` ([`RequestKey::render`]).
//!
//! When the store cannot answer, the failure policy decides
//! ([`RateLimitLayerBuilder::failure_policy`]: open, closed, or local
//! counts with [`RateLimitLayerBuilder::local_failover`]); without one, a
//! store error is a `503`.
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
//! [`MemoryStore`]: slidegate_memory::MemoryStore
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
mod layer_state;
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
