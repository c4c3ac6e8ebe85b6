//! What the rate-limit layer adds to a request: the same trivial service
//! called bare and through the layer, in the same criterion group.
//!
//! Run with `cargo bench -p slidegate-tower --bench overhead`; the results
//! are in `BENCHMARKS.md`. Each iteration builds a request (with a peer
//! address), calls the service and polls its future once (it is ready at
//! once); the layer reads a `MonotonicClock`, as it would in production.
//! The limit (10⁹ per minute) admits every request, so the admitted path
//! is measured, headers included; `layer_refused` measures refusals (limit
//! 1 per hour: every request after the first is answered by the layer
//! with a 429 and a problem body), and `layer_hot_key_no_headers` the
//! admitted path with the headers on admitted answers turned off.

use criterion::{Criterion, criterion_group, criterion_main};
use http::{Request, Response};
use slidegate_core::{Algorithm, MonotonicClock, Policy, Weighting};
use slidegate_memory::Budget;
use slidegate_tower::{PeerIp, RateLimitLayer};
use std::convert::Infallible;
use std::future::Future;
use std::hint::black_box;
use std::net::SocketAddr;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tower::{Layer, Service};

#[path = "support/hello.rs"]
mod hello;
use hello::Hello;

fn request(peer: SocketAddr) -> Request<String> {
    let mut request = Request::new(String::new());
    request.extensions_mut().insert(peer);
    request
}

/// Calls `service` once and polls the answer, which is ready at once.
fn call<S, ResB>(service: &mut S, request: Request<String>) -> Option<Response<ResB>>
where
    S: Service<Request<String>, Response = Response<ResB>, Error = Infallible>,
{
    let mut cx = Context::from_waker(Waker::noop());
    match pin!(service.call(request)).poll(&mut cx) {
        Poll::Ready(Ok(response)) => Some(response),
        Poll::Pending => None,
    }
}

fn layer(limit: u64, window: Duration) -> RateLimitLayer<String> {
    layer_with(limit, window, true)
}

fn layer_with(limit: u64, window: Duration, headers: bool) -> RateLimitLayer<String> {
    let algorithm = Algorithm::SlidingWindow {
        buckets: 2,
        weighting: Weighting::Interpolated,
    };
    let policy = Policy::new(limit, window, algorithm).expect("a valid policy");
    RateLimitLayer::builder(PeerIp::new())
        .limit("per-client", policy, MonotonicClock::new(), Budget::keys(10_000))
        .headers_on_admitted(headers)
        .build()
        .expect("a valid layer")
}

fn overhead(c: &mut Criterion) {
    let mut group = c.benchmark_group("layer_overhead");
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    let peers: Vec<SocketAddr> = (0..1_000u32)
        .map(|i| SocketAddr::from(([10, 0, (i >> 8) as u8, i as u8], 4000)))
        .collect();

    let mut bare = Hello;
    group.bench_function("bare", |b| {
        b.iter(|| black_box(call(&mut bare, request(peers[0]))));
    });

    let mut one = layer(1_000_000_000, Duration::from_secs(60)).layer(Hello);
    group.bench_function("layer_hot_key", |b| {
        b.iter(|| black_box(call(&mut one, request(peers[0]))));
    });

    let mut quiet = layer_with(1_000_000_000, Duration::from_secs(60), false).layer(Hello);
    group.bench_function("layer_hot_key_no_headers", |b| {
        b.iter(|| black_box(call(&mut quiet, request(peers[0]))));
    });

    let mut many = layer(1_000_000_000, Duration::from_secs(60)).layer(Hello);
    let mut i = 0;
    group.bench_function("layer_1k_keys", |b| {
        b.iter(|| {
            i = (i + 1) % peers.len();
            black_box(call(&mut many, request(peers[i])))
        });
    });

    let mut refused = layer(1, Duration::from_secs(3_600)).layer(Hello);
    group.bench_function("layer_refused", |b| {
        b.iter(|| black_box(call(&mut refused, request(peers[0]))));
    });
    group.finish();
}

criterion_group!(benches, overhead);
criterion_main!(benches);
