//! A bounded gRPC load generator for `slidegate serve`: many
//! `ShouldRateLimit` calls in flight over a few HTTP/2 connections, on one
//! hot key or spread over many keys; prints calls per second and latency
//! percentiles.
//!
//! ```sh
//! cargo run --release -p slidegate-server --example grpc_load -- 127.0.0.1:8081 [keys] [seconds] [connections] [in_flight]
//! ```
//!
//! It only talks to the address given, which must be on loopback, and stops
//! after `seconds` (at most 60).

use slidegate_server::proto::descriptor::RateLimitDescriptor;
use slidegate_server::proto::descriptor::rate_limit_descriptor::Entry;
use slidegate_server::proto::rls::RateLimitRequest;
use slidegate_server::proto::rls::rate_limit_service_client::RateLimitServiceClient;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tonic::transport::Channel;

fn arg<T: std::str::FromStr>(args: &[String], i: usize, default: T) -> T {
    args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default)
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let addr: SocketAddr = arg(&args, 1, SocketAddr::from(([127, 0, 0, 1], 8081)));
    assert!(addr.ip().is_loopback(), "the load generator only talks to loopback");
    let keys: u64 = arg(&args, 2, 1u64).max(1);
    let seconds: u64 = arg(&args, 3, 10u64).clamp(1, 60);
    let connections: usize = arg(&args, 4, 4usize).max(1);
    let in_flight: usize = arg(&args, 5, 64usize).max(1);

    let mut clients = Vec::new();
    for _ in 0..connections {
        let channel = Channel::from_shared(format!("http://{addr}"))
            .expect("a valid address")
            .connect()
            .await
            .expect("the server answers");
        clients.push(RateLimitServiceClient::new(channel));
    }
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for task in 0..in_flight {
        let mut client = clients[task % connections].clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(1 << 16);
            let mut errors = 0u64;
            let mut n = task as u64;
            while Instant::now() < deadline {
                // A cheap, well-spread sequence of keys.
                n = n
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                let key = (n >> 33) % keys;
                let request = RateLimitRequest {
                    domain: "edge_proxy".to_owned(),
                    descriptors: vec![RateLimitDescriptor {
                        entries: vec![Entry {
                            key: "remote_address".to_owned(),
                            value: format!("10.{}.{}.{}", key >> 16 & 255, key >> 8 & 255, key & 255),
                        }],
                        ..Default::default()
                    }],
                    hits_addend: 0,
                };
                let start = Instant::now();
                match client.should_rate_limit(request).await {
                    Ok(_) => latencies.push(start.elapsed()),
                    Err(_) => errors += 1,
                }
            }
            (latencies, errors)
        }));
    }
    let started = Instant::now();
    let mut latencies = Vec::new();
    let mut errors = 0;
    for task in tasks {
        let (l, e) = task.await.expect("a load task");
        latencies.extend(l);
        errors += e;
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort_unstable();
    let pct = |p: f64| {
        latencies
            .get(((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1e3)
    };
    println!(
        "{} calls in {elapsed:.2} s: {:.0} calls/s, {errors} errors; latency p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms ({keys} keys, {connections} connections, {in_flight} in flight)",
        latencies.len(),
        latencies.len() as f64 / elapsed,
        pct(0.50),
        pct(0.99),
        latencies.last().map_or(0.0, |d| d.as_secs_f64() * 1e3),
    );
}
