//! A decision on the in-memory store, through the store interface, is
//! made when `decide` is called and allocates nothing: no boxing, no
//! buffer, whatever the number of limits (up to the four `Decisions`
//! holds inline). Measured with a counting global allocator: no
//! allocation on the deciding thread (other threads, such as the test
//! harness's, may allocate meanwhile and are not counted).

use slidegate_conformance::alloc::{Counting, allocations_here};
use slidegate_core::{Algorithm, ManualClock, Policy, Weighting};
use slidegate_memory::{Budget, MemoryStore};
use slidegate_store::{Decisions, Quota, Store};
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

#[global_allocator]
static ALLOC: Counting = Counting::new();

/// Polls `f` once: a store that does no IO must be ready at once.
fn now<F: Future>(f: F) -> F::Output {
    let mut cx = Context::from_waker(Waker::noop());
    match pin!(f).poll(&mut cx) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("the in-memory store's future was not ready at once"),
    }
}

#[test]
fn deciding_allocates_nothing_and_never_waits() {
    let clock = ManualClock::new(1_000_000_000);
    let store = MemoryStore::with_clock(Budget::keys(1000), Budget::keys(1000), clock.clone());
    let window = |limit| {
        let algorithm = Algorithm::SlidingWindow {
            buckets: 8,
            weighting: Weighting::Conservative,
        };
        Policy::new(limit, Duration::from_secs(60), algorithm).unwrap()
    };
    let gcra = Policy::new(50, Duration::from_secs(1), Algorithm::Gcra { burst: 5 }).unwrap();
    let quotas = [Quota::new(window(1000)), Quota::new(window(100)), Quota::new(gcra)];
    let mut out = Decisions::new();
    // The keys are made (and so allocated in the budget's table) first.
    for key in ["alice", "bob"] {
        now(store.decide(key, &quotas, 1, &mut out)).unwrap();
    }
    let before = allocations_here();
    for i in 0..10_000u64 {
        clock.advance(Duration::from_micros(7));
        let key = if i % 2 == 0 { "alice" } else { "bob" };
        now(store.decide(key, &quotas, 1, &mut out)).unwrap();
        now(store.decide(key, &quotas[1..2], 0, &mut out)).unwrap();
        assert_eq!(out.len(), 1);
    }
    assert_eq!(allocations_here(), before, "a decision allocated");
}
