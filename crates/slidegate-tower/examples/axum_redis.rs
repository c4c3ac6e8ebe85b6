//! One limit for every replica of an axum app: 100 requests per minute per
//! client address, counted in Redis, so that three replicas behind a load
//! balancer admit 100 in all, not 300. If Redis is down or slow, requests
//! pass uncounted (`FailurePolicy::Open`) rather than fail.
//!
//! Start Redis (`redis-server`), then
//! `cargo run -p slidegate-tower --example axum_redis` (on as many ports as
//! you like: `PORT=3001 cargo run ...`) and `curl -i http://127.0.0.1:3000/`.

use axum::{Router, routing::get};
use slidegate_core::{Algorithm, Policy, Weighting};
use slidegate_redis::RedisStore;
use slidegate_store::FailurePolicy;
use slidegate_tower::{PeerIp, RateLimitLayer};
use std::{net::SocketAddr, time::Duration};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Every replica uses the same prefix: they share the counts under it.
    // Each decision is one script call, bounded by 50 ms.
    let store = RedisStore::connect("redis://127.0.0.1:6379", "slidegate:", Duration::from_millis(50)).await?;
    let sliding = Algorithm::SlidingWindow {
        buckets: 8,
        weighting: Weighting::Conservative,
    };
    let limit = RateLimitLayer::builder_with_store(PeerIp::new(), store)
        .quota("per-client", Policy::new(100, Duration::from_secs(60), sliding)?)
        // On an outage: pass, without `RateLimit` headers. `Closed` refuses
        // instead; `local_failover(3, MemoryStore::new(...))` counts a third
        // of the limit in each of three replicas.
        .failure_policy(FailurePolicy::Open)
        .build()?;
    let app = Router::new().route("/", get(|| async { "hello\n" })).layer(limit);
    let port: u16 = std::env::var("PORT").ok().and_then(|p| p.parse().ok()).unwrap_or(3000);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
    Ok(())
}
