//! Per-client rate limiting of a tonic gRPC server: 10 calls per minute
//! per client address, keyed by the peer that tonic records for every
//! connection (`TcpConnectInfo`, read by `PeerIp` with the `tonic`
//! feature). Calls past the limit end with `grpc-status: 8`
//! (`RESOURCE_EXHAUSTED`) and the wait in `grpc-retry-pushback-ms`.
//!
//! `cargo run -p slidegate --features tonic --example tonic`, then call
//! the health service eleven times, for instance with grpcurl:
//! `grpcurl -plaintext 127.0.0.1:50051 grpc.health.v1.Health/Check`.
//! Behind proxies, key by `ForwardedFor::new([...trusted networks])`
//! instead of `PeerIp::new()`.

use slidegate::{Algorithm, Budget, MonotonicClock, PeerIp, Policy, RateLimitLayer, Weighting};
use std::time::Duration;
use tonic::transport::Server;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let sliding = Algorithm::SlidingWindow {
        buckets: 8,
        weighting: Weighting::Conservative,
    };
    let limit = RateLimitLayer::builder(PeerIp::new())
        .limit(
            "per-client",
            Policy::new(10, Duration::from_secs(60), sliding)?,
            MonotonicClock::new(),
            Budget::bytes(64 << 20),
        )
        .build()?;
    // Any generated service goes here; the health service needs no codegen.
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    Server::builder()
        .layer(limit)
        .add_service(health)
        .serve("127.0.0.1:50051".parse()?)
        .await?;
    Ok(())
}
