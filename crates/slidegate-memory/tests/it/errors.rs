//! What the store refuses, and what it forgets.

use slidegate_core::{Algorithm, Policy, State, Weighting};
use slidegate_memory::internals::{Ring2, Ring8, StateMap, Timed};
use slidegate_memory::{Budget, MemoryError};
use std::time::Duration;

fn policy(limit: u64, algorithm: Algorithm) -> Policy {
    Policy::new(limit, Duration::from_secs(1), algorithm).unwrap()
}

fn buckets(n: u32) -> Algorithm {
    Algorithm::SlidingWindow {
        buckets: n,
        weighting: Weighting::Interpolated,
    }
}

/// A key larger than a shard's share of the byte budget is refused with
/// the sizes named, and nothing of it is kept or counted.
#[test]
fn a_key_larger_than_the_shard_allowance_is_refused() {
    let store: StateMap<String, Ring2<u16>> = StateMap::new(Budget::bytes(64 << 10));
    let p = policy(3, buckets(2));
    let empty = store.stats();
    let huge = "k".repeat(64 << 10);
    let err = store.check(&p, huge.as_str(), 0, 1).unwrap_err();
    let MemoryError::KeyTooLarge { bytes, max } = err.clone() else {
        panic!("{err:?}")
    };
    assert_eq!(bytes, huge.len());
    assert!(max < bytes && max > 0, "allowance {max}");
    assert_eq!(
        err.to_string(),
        format!("key of {bytes} bytes exceeds the store's per-shard allowance of {max} bytes")
    );
    assert_eq!(store.stats(), empty, "nothing kept");
    // Just within the allowance is fine, and counted.
    let fits = "k".repeat(max);
    assert!(store.check(&p, fits.as_str(), 0, 1).unwrap().allowed());
    assert_eq!(store.stats().keys, 1);
    assert_eq!(store.stats().bytes, empty.bytes + max);
    // The refused key was never counted: refused again, for every request.
    for _ in 0..5 {
        assert!(matches!(
            store.admit(&p, huge.as_str(), 0, 1),
            Err(MemoryError::KeyTooLarge { .. })
        ));
    }
    assert_eq!(store.stats().keys, 1);
}

/// A policy the store's states cannot serve is refused, naming it, and
/// nothing is kept.
#[test]
fn a_policy_the_states_cannot_serve_is_refused() {
    let ring2: StateMap<u64, Ring2<u16>> = StateMap::new(Budget::keys(100));
    let ring8: StateMap<u64, Ring8<u32>> = StateMap::new(Budget::keys(100));
    let fixed: StateMap<u64, slidegate_core::FixedWindow> = StateMap::new(Budget::keys(100));
    let gcra: StateMap<u64, slidegate_core::Gcra> = StateMap::new(Budget::keys(100));
    let unsuited = |algorithm: &'static str, limit| Err(MemoryError::Unsuited { algorithm, limit });
    assert_eq!(
        ring2.check(&policy(5, Algorithm::SlidingLog), &1, 0, 1),
        unsuited("sliding_log", 5)
    );
    assert_eq!(
        ring2.check(&policy(5, buckets(3)), &1, 0, 1),
        unsuited("sliding_window", 5)
    );
    assert_eq!(
        ring2.check(&policy(70_000, buckets(2)), &1, 0, 1),
        unsuited("sliding_window", 70_000)
    );
    assert_eq!(
        ring2.admit(&policy(5, Algorithm::FixedWindow), &1, 0, 1),
        Err(MemoryError::Unsuited {
            algorithm: "fixed_window",
            limit: 5
        })
    );
    assert!(ring2.check(&policy(65_535, buckets(2)), &1, 0, 1).unwrap().allowed());
    assert_eq!(
        ring8.check(&policy(5, buckets(9)), &1, 0, 1),
        unsuited("sliding_window", 5)
    );
    let wide = u64::from(u32::MAX) + 1;
    assert_eq!(
        ring8.check(&policy(wide, buckets(8)), &1, 0, 1),
        unsuited("sliding_window", wide)
    );
    assert_eq!(
        fixed.check(&policy(5, Algorithm::Gcra { burst: 1 }), &1, 0, 1),
        unsuited("gcra", 5)
    );
    assert_eq!(
        gcra.check(&policy(5, Algorithm::FixedWindow), &1, 0, 1),
        unsuited("fixed_window", 5)
    );
    let message = unsuited("sliding_log", 5).unwrap_err().to_string();
    assert_eq!(
        message,
        "this store's states cannot serve a sliding_log policy with limit 5"
    );
    assert_eq!(ring2.stats().keys, 1, "only the suited request kept its key");
    assert_eq!((ring8.stats().keys, fixed.stats().keys, gcra.stats().keys), (0, 0, 0));
    // In a batch, each request answers for itself.
    let mut out = Vec::new();
    ring8.check_many(&policy(5, buckets(9)), 0, &[(&1, 1), (&2, 1)], &mut out);
    assert_eq!(out, [unsuited("sliding_window", 5), unsuited("sliding_window", 5)]);
}

/// `reset` forgets a key: its next request starts afresh.
#[test]
fn reset_forgets_a_key() {
    let store: StateMap<String, Ring8<u16>> = StateMap::new(Budget::keys(100));
    let p = policy(2, buckets(4));
    for _ in 0..2 {
        assert!(store.check(&p, "alice", 10, 1).unwrap().allowed());
    }
    assert!(store.check(&p, "bob", 10, 1).unwrap().allowed());
    assert!(!store.check(&p, "alice", 10, 1).unwrap().allowed());
    assert_eq!(store.stats().keys, 2);
    assert!(store.reset("alice"));
    assert_eq!(store.stats().keys, 1);
    assert!(!store.reset("alice"), "already forgotten");
    assert!(!store.reset("carol"), "never held");
    let d = store.check(&p, "alice", 10, 1).unwrap();
    assert!(d.allowed());
    assert_eq!(d.remaining(), 1);
    // bob was left alone.
    assert_eq!(store.check(&p, "bob", 10, 0).unwrap().remaining(), 1);
}

/// A peek (cost 0) of an unknown key answers as a fresh key would and
/// stores nothing; a refused new key is not stored either.
#[test]
fn a_peek_or_a_refusal_of_an_unknown_key_stores_nothing() {
    let store: StateMap<u64, Timed<State>> = StateMap::new(Budget::keys(100));
    let empty = store.stats();
    for algorithm in [
        buckets(2),
        buckets(20),
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::Gcra { burst: 3 },
        Algorithm::ExponentialHistogram { epsilon: 0.1 },
    ] {
        let p = policy(3, algorithm);
        let d = store.check(&p, &7, 1_000, 0).unwrap();
        assert!(d.allowed(), "{algorithm}");
        assert_eq!(d.remaining(), 3, "{algorithm}");
        assert_eq!(d.reset_after(), Duration::ZERO, "{algorithm}");
        assert!(!store.check(&p, &7, 1_000, 4).unwrap().allowed(), "{algorithm}");
        assert_eq!(store.stats(), empty, "{algorithm}");
    }
}

/// A key asked under a policy of another shape starts afresh in a state
/// for that policy, and the bytes its states hold stay counted exactly:
/// after `reset`, the store is back to its empty size.
#[test]
fn a_key_under_another_policy_starts_afresh_and_its_bytes_stay_counted() {
    let store: StateMap<u64, Timed<State>> = StateMap::new(Budget::keys(100));
    let empty = store.stats();
    let ring = policy(2, buckets(40));
    let log = policy(50, Algorithm::SlidingLog);
    let gcra = policy(2, Algorithm::Gcra { burst: 2 });
    let heap = |p: &Policy| {
        let mut s = State::new(p);
        slidegate_core::LimitState::check(&mut s, p, 0, 1);
        s.bytes() - size_of::<State>()
    };
    assert!(heap(&ring) > 0);

    for _ in 0..2 {
        assert!(store.check(&ring, &1, 0, 1).unwrap().allowed());
    }
    assert!(!store.check(&ring, &1, 0, 1).unwrap().allowed());
    assert_eq!(store.stats().bytes, empty.bytes + heap(&ring));

    // Another shape: a fresh gcra state, holding nothing on the heap.
    assert!(store.check(&gcra, &1, 0, 1).unwrap().allowed());
    assert_eq!(store.stats().bytes, empty.bytes, "the ring's bytes are gone");

    // Back to a ring: fresh again, its bytes counted again.
    assert!(store.check(&ring, &1, 0, 1).unwrap().allowed());
    assert_eq!(store.stats().bytes, empty.bytes + heap(&ring));

    // A log that grows, then a ring: the log's bytes go with it.
    for t in 0..30 {
        assert!(store.check(&log, &1, t, 1).unwrap().allowed());
    }
    assert!(store.stats().bytes > empty.bytes);
    assert!(store.check(&ring, &1, 30, 1).unwrap().allowed());
    assert_eq!(store.stats().bytes, empty.bytes + heap(&ring));

    assert!(store.reset(&1));
    assert_eq!(store.stats(), empty);
}
