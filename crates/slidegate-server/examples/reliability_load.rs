//! The bounded loads of RELIABILITY.md against a running `slidegate serve`
//! (gRPC `ShouldRateLimit`), sampling the server's RSS (`/proc/<pid>/status`)
//! and its `/metrics` as they go:
//!
//! ```sh
//! # 10 million distinct keys (`remote_address` values), D descriptors per call:
//! reliability_load flood GRPC HTTP PID KEYS [D] [IN_FLIGHT]
//! # RATE calls per second on a fixed schedule for SECONDS over KEYS keys,
//! # a report line every REPORT seconds (p50, p99, max, errors, RSS):
//! reliability_load soak GRPC HTTP PID RATE SECONDS [KEYS] [REPORT] [IN_FLIGHT]
//! ```
//!
//! GRPC and HTTP are the server's addresses (loopback only), PID its process
//! id. The soak is an open-loop load: each call has a time it is due, and its
//! latency is counted from then, so a stalled server shows in the figures
//! rather than slowing the load down (no coordinated omission). Both stop on
//! their own: the flood after KEYS keys (at most 100 million), the soak after
//! SECONDS (at most an hour).

use slidegate_server::proto::descriptor::RateLimitDescriptor;
use slidegate_server::proto::descriptor::rate_limit_descriptor::Entry;
use slidegate_server::proto::rls::RateLimitRequest;
use slidegate_server::proto::rls::rate_limit_response::Code;
use slidegate_server::proto::rls::rate_limit_service_client::RateLimitServiceClient;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tonic::transport::Channel;

fn arg<T: std::str::FromStr>(args: &[String], i: usize, default: Option<T>) -> T {
    match args.get(i).map(|a| a.parse()) {
        Some(Ok(v)) => v,
        _ => default.unwrap_or_else(|| {
            eprintln!("usage: see the top of crates/slidegate-server/examples/reliability_load.rs");
            std::process::exit(2)
        }),
    }
}

/// The server's resident set, in KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// The store's figures from `/metrics`: keys held, store bytes, evictions.
fn store_figures(http: SocketAddr) -> (f64, f64, f64) {
    let text = (|| {
        let mut stream = TcpStream::connect(http).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(stream, "GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").ok()?;
        let mut text = String::new();
        stream.read_to_string(&mut text).ok()?;
        Some(text)
    })()
    .unwrap_or_default();
    let value = |name: &str| {
        text.lines()
            .find(|l| l.split(' ').next() == Some(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(f64::NAN)
    };
    (
        value("slidegate_keys"),
        value("slidegate_store_bytes"),
        value("slidegate_evictions_total"),
    )
}

fn request(values: impl Iterator<Item = u64>) -> RateLimitRequest {
    RateLimitRequest {
        domain: "edge_proxy".to_owned(),
        descriptors: values
            .map(|v| RateLimitDescriptor {
                entries: vec![Entry {
                    key: "remote_address".to_owned(),
                    value: format!("k{v}"),
                }],
                ..Default::default()
            })
            .collect(),
        hits_addend: 0,
    }
}

async fn clients(grpc: SocketAddr, n: usize) -> Vec<RateLimitServiceClient<Channel>> {
    let mut clients = Vec::new();
    for _ in 0..n {
        let channel = Channel::from_shared(format!("http://{grpc}"))
            .expect("a valid address")
            .connect()
            .await
            .expect("the server answers");
        clients.push(RateLimitServiceClient::new(channel));
    }
    clients
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mode: String = arg(&args, 1, None);
    let grpc: SocketAddr = arg(&args, 2, None);
    let http: SocketAddr = arg(&args, 3, None);
    let pid: u32 = arg(&args, 4, None);
    assert!(
        grpc.ip().is_loopback() && http.ip().is_loopback(),
        "the load only talks to loopback"
    );
    match mode.as_str() {
        "flood" => {
            let keys: u64 = arg::<u64>(&args, 5, None).clamp(1, 100_000_000);
            let per_call: u64 = arg(&args, 6, Some(8u64)).clamp(1, 64);
            let in_flight: usize = arg(&args, 7, Some(32usize)).max(1);
            flood(grpc, http, pid, keys, per_call, in_flight).await;
        }
        "soak" => {
            let rate: f64 = arg(&args, 5, None);
            let seconds: u64 = arg::<u64>(&args, 6, None).clamp(1, 3600);
            let keys: u64 = arg(&args, 7, Some(100_000u64)).max(1);
            let report: u64 = arg(&args, 8, Some(60u64)).max(1);
            let in_flight: usize = arg(&args, 9, Some(64usize)).max(1);
            soak(grpc, http, pid, rate, seconds, keys, report, in_flight).await;
        }
        _ => {
            eprintln!("modes: flood, soak");
            std::process::exit(2);
        }
    }
}

async fn flood(grpc: SocketAddr, http: SocketAddr, pid: u32, keys: u64, per_call: u64, in_flight: usize) {
    let clients = clients(grpc, 4).await;
    let rss_before = rss_kib(pid);
    let (k, b, e) = tokio::task::spawn_blocking(move || store_figures(http)).await.unwrap();
    println!(
        "before: RSS {} MiB; keys {k}, store bytes {b}, evictions {e}",
        rss_before / 1024
    );
    let next = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let max_rss = Arc::new(AtomicU64::new(rss_before));
    let started = Instant::now();
    // The sampler: RSS every 100 ms (its maximum), a line every 10 s.
    let sampler = {
        let (next, done, max_rss) = (Arc::clone(&next), Arc::clone(&done), Arc::clone(&max_rss));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            let mut n = 0u64;
            while !done.load(Ordering::Relaxed) {
                tick.tick().await;
                let rss = rss_kib(pid);
                max_rss.fetch_max(rss, Ordering::Relaxed);
                n += 1;
                if n.is_multiple_of(100) {
                    let (k, b, e) = tokio::task::spawn_blocking(move || store_figures(http)).await.unwrap();
                    println!(
                        "{:>6.1} s: {:>10} keys sent; RSS {} MiB; held {k}, store bytes {b}, evictions {e}",
                        started.elapsed().as_secs_f64(),
                        next.load(Ordering::Relaxed).min(keys),
                        rss / 1024,
                    );
                }
            }
        })
    };
    let mut tasks = Vec::new();
    for task in 0..in_flight {
        let mut client = clients[task % clients.len()].clone();
        let (next, errors) = (Arc::clone(&next), Arc::clone(&errors));
        tasks.push(tokio::spawn(async move {
            loop {
                let first = next.fetch_add(per_call, Ordering::Relaxed);
                if first >= keys {
                    break;
                }
                let call = request(first..(first + per_call).min(keys));
                match client.should_rate_limit(call).await {
                    Ok(r) if r.get_ref().overall_code() == Code::Ok => {}
                    _ => {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    for task in tasks {
        task.await.expect("a flood task");
    }
    let elapsed = started.elapsed().as_secs_f64();
    done.store(true, Ordering::Relaxed);
    sampler.await.unwrap();
    let rss_after = rss_kib(pid);
    let (k, b, e) = tokio::task::spawn_blocking(move || store_figures(http)).await.unwrap();
    println!(
        "flood: {keys} distinct keys ({per_call} per call, {in_flight} calls in flight) in {elapsed:.1} s ({:.0} keys/s), {} errors or refusals",
        keys as f64 / elapsed,
        errors.load(Ordering::Relaxed)
    );
    println!(
        "after: RSS {} MiB (before {} MiB, max while flooding {} MiB); keys held {k}, store bytes {b}, evictions {e}",
        rss_after / 1024,
        rss_before / 1024,
        max_rss.load(Ordering::Relaxed) / 1024
    );
    println!("max_rss_kib={}", max_rss.load(Ordering::Relaxed));
}

/// Latencies in 10 µs buckets up to 1 s, one more for slower calls.
struct Histogram {
    buckets: Vec<AtomicU64>,
    max_us: AtomicU64,
    errors: AtomicU64,
}

impl Histogram {
    const BUCKETS: usize = 100_001;

    fn new() -> Histogram {
        Histogram {
            buckets: (0..Self::BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            max_us: AtomicU64::new(0),
            errors: AtomicU64::new(0),
        }
    }

    fn record(&self, latency: Duration) {
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        let i = usize::try_from(us / 10).unwrap_or(usize::MAX).min(Self::BUCKETS - 1);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.max_us.fetch_max(us, Ordering::Relaxed);
    }

    /// Takes the figures so far and starts afresh: calls, errors, p50 and
    /// p99 (ms, a bucket's upper edge), max (ms).
    fn take(&self) -> (u64, u64, f64, f64, f64) {
        let counts: Vec<u64> = self.buckets.iter().map(|b| b.swap(0, Ordering::Relaxed)).collect();
        let total: u64 = counts.iter().sum();
        let quantile = |q: f64| {
            let rank = (total as f64 * q).ceil() as u64;
            let mut seen = 0;
            for (i, c) in counts.iter().enumerate() {
                seen += c;
                if seen >= rank.max(1) {
                    return (i + 1) as f64 * 0.01;
                }
            }
            0.0
        };
        let max = self.max_us.swap(0, Ordering::Relaxed) as f64 / 1e3;
        (
            total,
            self.errors.swap(0, Ordering::Relaxed),
            quantile(0.5),
            quantile(0.99),
            max,
        )
    }
}

#[allow(clippy::too_many_arguments)]
async fn soak(
    grpc: SocketAddr,
    http: SocketAddr,
    pid: u32,
    rate: f64,
    seconds: u64,
    keys: u64,
    report: u64,
    in_flight: usize,
) {
    assert!(rate > 0.0 && rate.is_finite(), "RATE must be positive");
    let clients = clients(grpc, 4).await;
    let histogram = Arc::new(Histogram::new());
    let start = tokio::time::Instant::now() + Duration::from_millis(100);
    let deadline = start + Duration::from_secs(seconds);
    let period = Duration::from_secs_f64(in_flight as f64 / rate);
    println!(
        "soak: {rate:.0} calls/s for {seconds} s over {keys} keys ({in_flight} schedules, one call each every {period:?}); RSS at start {} MiB",
        rss_kib(pid) / 1024
    );
    println!("interval | calls | calls/s | errors | p50 ms | p99 ms | max ms | RSS MiB | keys held");
    let mut tasks = Vec::new();
    for task in 0..in_flight {
        let mut client = clients[task % clients.len()].clone();
        let histogram = Arc::clone(&histogram);
        tasks.push(tokio::spawn(async move {
            let mut due = start + period.mul_f64(task as f64 / in_flight as f64);
            let mut n = task as u64;
            while due < deadline {
                tokio::time::sleep_until(due).await;
                n = n
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                let call = request(std::iter::once((n >> 33) % keys));
                let ok = matches!(
                    client.should_rate_limit(call).await,
                    Ok(r) if r.get_ref().overall_code() == Code::Ok
                );
                histogram.record(due.elapsed());
                if !ok {
                    histogram.errors.fetch_add(1, Ordering::Relaxed);
                }
                due += period;
            }
        }));
    }
    let mut tick = tokio::time::interval_at(start + Duration::from_secs(report), Duration::from_secs(report));
    let mut interval = 0;
    let mut all = (0u64, 0u64, 0f64, 0f64, u64::MAX, 0u64);
    while tokio::time::Instant::now() < deadline + Duration::from_millis(500) {
        tick.tick().await;
        interval += 1;
        let (calls, errors, p50, p99, max) = histogram.take();
        let rss = rss_kib(pid);
        let (k, _, _) = tokio::task::spawn_blocking(move || store_figures(http)).await.unwrap();
        println!(
            "{interval:>8} | {calls:>9} | {:>7.0} | {errors:>6} | {p50:>6.2} | {p99:>6.2} | {max:>7.1} | {:>7} | {k}",
            calls as f64 / report as f64,
            rss / 1024
        );
        all.0 += calls;
        all.1 += errors;
        if calls > 0 {
            all.2 = all.2.max(p99);
            all.3 = all.3.max(max);
        }
        all.4 = all.4.min(rss);
        all.5 = all.5.max(rss);
    }
    for task in tasks {
        task.await.expect("a soak task");
    }
    let (calls, errors, _, p99, max) = histogram.take();
    all.0 += calls;
    all.1 += errors;
    if calls > 0 {
        all.2 = all.2.max(p99);
        all.3 = all.3.max(max);
    }
    println!(
        "soak: {} calls, {} errors or refusals; worst interval p99 {:.2} ms, max {:.1} ms; RSS {}–{} MiB",
        all.0,
        all.1,
        all.2,
        all.3,
        all.4 / 1024,
        all.5 / 1024
    );
}
