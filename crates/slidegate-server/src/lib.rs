//! slidegate's rate limit service: a drop-in for Envoy's rate limit service
//! (`envoy.service.ratelimit.v3.RateLimitService` over gRPC, and
//! envoyproxy/ratelimit's YAML config and `POST /json`), with sliding
//! windows, several limits per descriptor, an HTTP API with the IETF
//! `RateLimit` headers, Prometheus metrics and live reload.
//!
//! In layers, each importing only those below it:
//!
//! - [`server`]: starting, draining and stopping; [`reload`]: the config
//!   and TLS files reloaded; [`xds`]: the config from an xDS control
//!   plane instead of files;
//! - [`net`]: listeners, TLS, connections and their caps, canned answers,
//!   worker threads, file watching;
//! - [`api`]: the front ends, gRPC and HTTP, and [`api::wire`], the
//!   conversions between their messages and the service's;
//! - [`service`]: the seam, a wire-independent request in and an answer
//!   out, counted and traced, and what the front ends share;
//! - [`engine`]: the decisions, in one bounded in-memory counter store or
//!   in Redis (built by `slidegate-redis`; [`redis_store`] logs its
//!   outages), shared by every instance on it;
//! - [`config`]: the YAML files, checked with file, line and column.
//!
//! [`quota`] is the Rate Limit Quota Service's engine: how a quota
//! bucket's limit is shared between the Envoys that report it.
//!
//! Beside them: [`metrics`] (the Prometheus registry), [`trace`] (each
//! decision's span, continued from the W3C or B3 trace context of the
//! request), [`proto`] (the wire types), [`headers`] (the answers' header
//! options) and [`log_limit`] (one log line per interval for events a
//! client can repeat).
#![deny(unsafe_code)]
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

pub mod api;
pub mod config;
pub mod engine;
pub mod headers;
pub mod log_limit;
pub mod metrics;
pub mod net;
pub mod proto;
pub mod quota;
pub mod redis_store;
pub mod reload;
pub mod server;
pub mod service;
pub mod trace;
mod trim;
pub mod xds;
