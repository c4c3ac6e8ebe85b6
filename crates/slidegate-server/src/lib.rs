//! slidegate's rate limit service: a drop-in for Envoy's rate limit service
//! (`envoy.service.ratelimit.v3.RateLimitService` over gRPC, and
//! envoyproxy/ratelimit's YAML config and `POST /json`), with sliding
//! windows, several limits per descriptor, an HTTP API with the IETF
//! `RateLimit` headers, Prometheus metrics and live reload.
//!
//! - [`config`]: the YAML files, checked with file, line and column;
//! - [`engine`]: the decisions, in one bounded in-memory counter store or
//!   in Redis ([`redis_store`], shared by every instance on it);
//! - [`grpc`] and [`http`](mod@http): the front ends; [`proto`]: the wire types;
//! - [`metrics`]: the Prometheus registry;
//! - [`server`]: starting, reloading and graceful shutdown; [`conn`]: the
//!   connections' timeouts; [`admission`]: the caps on connections,
//!   streams and calls in flight; [`listen`]: TCP addresses and Unix sockets;
//!   [`tls`]: TLS and mutual TLS with rustls, reloaded when the files
//!   change;
//! - [`trace`]: each decision's span, continued from the W3C or B3 trace
//!   context of the request;
//! - [`log_limit`]: one log line per interval for events a client can
//!   repeat.
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

pub mod admission;
mod canned;
pub mod config;
pub mod conn;
pub mod engine;
pub mod grpc;
mod grpc_routes;
mod headers;
pub mod http;
pub mod listen;
pub mod log_limit;
pub mod metrics;
mod problem;
pub mod proto;
pub mod redis_store;
pub mod server;
mod shared;
pub mod tls;
pub mod trace;
mod trim;
mod watch;
mod workers;
