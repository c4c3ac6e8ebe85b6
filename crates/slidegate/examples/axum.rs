//! Per-client rate limiting of an axum app in a few lines: 100 requests per
//! minute per client address (IPv6 grouped by /64), in at most 64 MiB,
//! with `RateLimit` headers on every answer and `429` + `Retry-After` on
//! refusals.
//!
//! `cargo run -p slidegate --example axum`, then
//! `curl -i http://127.0.0.1:3000/`.

use axum::{Router, routing::get};
use slidegate::{Algorithm, Budget, MonotonicClock, PeerIp, Policy, RateLimitLayer, Weighting};
use std::{net::SocketAddr, time::Duration};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let sliding = Algorithm::SlidingWindow {
        buckets: 8,
        weighting: Weighting::Conservative,
    };
    let limit = RateLimitLayer::builder(PeerIp::new())
        .limit(
            "per-client",
            Policy::new(100, Duration::from_secs(60), sliding)?,
            MonotonicClock::new(),
            Budget::bytes(64 << 20),
        )
        .build()?;
    let app = Router::new().route("/", get(|| async { "hello\n" })).layer(limit);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
    Ok(())
}
