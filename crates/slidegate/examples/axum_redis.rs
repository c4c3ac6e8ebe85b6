//! One limit for every replica of an axum app: 100 requests per minute per
//! client address, counted in Redis, so that three replicas behind a load
//! balancer admit 100 in all, not 300. If Redis is down or slow, requests
//! pass uncounted (`FailurePolicy::Open`) rather than fail.
//!
//! Start Redis (`redis-server`), then
//! `cargo run -p slidegate --features redis --example axum_redis` (on as
//! many ports as you like: `PORT=3001 cargo run ...`) and
//! `curl -i http://127.0.0.1:3000/`.

use axum::{Router, routing::get};
use slidegate::{Algorithm, FailurePolicy, PeerIp, Policy, RateLimitLayer, RedisOptions, Weighting};
use std::{net::SocketAddr, time::Duration};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The store as `slidegate serve --redis` builds it. Every replica uses
    // the same prefix (by default `slidegate:`): they share the counts
    // under it. Each decision is one script call, bounded by the timeout
    // (by default 50 ms). On an outage: pass, without `RateLimit` headers;
    // `Closed` refuses instead, `Local { instances: 3 }` counts a third of
    // the limit in each of three replicas.
    let options = RedisOptions {
        urls: vec!["redis://127.0.0.1:6379".to_owned()],
        failure: FailurePolicy::Open,
        ..RedisOptions::default()
    };
    let store = options.connect().await?;
    let sliding = Algorithm::SlidingWindow {
        buckets: 8,
        weighting: Weighting::Conservative,
    };
    let limit = RateLimitLayer::builder_with_store(PeerIp::new(), store)
        .quota("per-client", Policy::new(100, Duration::from_secs(60), sliding)?)
        .build()?;
    let app = Router::new().route("/", get(|| async { "hello\n" })).layer(limit);
    let port: u16 = std::env::var("PORT").ok().and_then(|p| p.parse().ok()).unwrap_or(3000);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
    Ok(())
}
