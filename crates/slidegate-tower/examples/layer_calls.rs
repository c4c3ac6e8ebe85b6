//! Calls a trivial service through the rate-limit layer N times (the
//! first argument) and prints how many answers were 200: the workload of
//! `bench/load/tower-instructions.sh`, which counts the instructions of
//! `run_calls` alone under callgrind (after one call outside it, so that
//! nothing lazy starts inside). The case
//! (the second argument) is one of `bare` (the service without the
//! layer), `hot` (one key, admitted, headers on),
//! `quiet` (the same without headers on admitted answers), `keys` (1,000
//! keys in turn) and `refused` (limit 1 per hour: all but the first
//! refused), as the `layer_overhead` criterion group measures them.

use http::Request;
use slidegate_core::{Algorithm, MonotonicClock, Policy, Weighting};
use slidegate_memory::Budget;
use slidegate_tower::{PeerIp, RateLimitLayer};
use std::future::Future;
use std::hint::black_box;
use std::net::SocketAddr;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tower::{Layer, Service};

#[path = "../benches/support/hello.rs"]
mod hello;
use hello::Hello;

fn main() {
    let mut args = std::env::args().skip(1);
    let calls: usize = args.next().and_then(|n| n.parse().ok()).unwrap_or(1_000);
    let case = args.next().unwrap_or_else(|| "hot".to_owned());
    let (limit, window, headers) = match case.as_str() {
        "refused" => (1, Duration::from_secs(3_600), true),
        "quiet" => (1_000_000_000, Duration::from_secs(60), false),
        _ => (1_000_000_000, Duration::from_secs(60), true),
    };
    let algorithm = Algorithm::SlidingWindow {
        buckets: 2,
        weighting: Weighting::Interpolated,
    };
    let policy = Policy::new(limit, window, algorithm).expect("a valid policy");
    let mut service = RateLimitLayer::<String>::builder(PeerIp::new())
        .limit("per-client", policy, MonotonicClock::new(), Budget::keys(10_000))
        .headers_on_admitted(headers)
        .build()
        .expect("a valid layer")
        .layer(Hello);
    let peers: Vec<SocketAddr> = (0..1_000u32)
        .map(|i| SocketAddr::from(([10, 0, (i >> 8) as u8, i as u8], 4000)))
        .collect();
    let keys = if case == "keys" { peers.len() } else { 1 };
    if case == "bare" {
        // The service alone, without the layer: what the layer adds is the
        // difference.
        println!("{}", run_calls(&mut Hello, &peers, 1, calls));
        return;
    }
    // One call first: whatever starts lazily (the clock's calibration)
    // starts here, not in the calls counted.
    let first = run_calls(&mut service, &peers, keys, 1);
    println!("{}", first + run_calls(&mut service, &peers, keys, calls));
}

/// Makes `calls` calls through `service`, the peers taken in turn from the
/// first `keys`; returns how many were answered 200. Kept out of line, so
/// that `valgrind --toggle-collect` can count its instructions alone.
#[inline(never)]
fn run_calls<S, B>(service: &mut S, peers: &[SocketAddr], keys: usize, calls: usize) -> usize
where
    S: Service<Request<String>, Response = http::Response<B>>,
{
    let mut cx = Context::from_waker(Waker::noop());
    let mut ok = 0;
    for i in 0..calls {
        let mut request = Request::new(String::new());
        request.extensions_mut().insert(peers[i % keys]);
        if let Poll::Ready(Ok(response)) = pin!(service.call(request)).poll(&mut cx) {
            ok += usize::from(black_box(response).status() == http::StatusCode::OK);
        }
    }
    ok
}
