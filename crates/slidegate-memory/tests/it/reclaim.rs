//! Idle keys are dropped by ordinary calls, with no background thread;
//! a dropped key, idle or evicted, starts afresh.

use crate::common::accounts_for;
use slidegate_core::{Algorithm, Clock, ManualClock, Policy, State, Weighting};
use slidegate_memory::internals::{Ring2, StateMap, Timed};
use slidegate_memory::{Budget, KeyedLimiter};
use std::time::Duration;

const WINDOW: Duration = Duration::from_millis(10);

fn two_buckets(limit: u64) -> Policy {
    let algorithm = Algorithm::SlidingWindow {
        buckets: 2,
        weighting: Weighting::Interpolated,
    };
    Policy::new(limit, WINDOW, algorithm).unwrap()
}

/// Keys whose window has passed stay until ordinary calls sweep them:
/// nothing happens while no call comes. Then a stream of new keys, each
/// idle by the time the next one comes, drops the idle keys as it goes:
/// nothing live is ever evicted, and the store ends far below full.
#[test]
fn idle_keys_are_reclaimed_by_ordinary_calls() {
    let clock = ManualClock::new(0);
    let limiter: KeyedLimiter<u64, _> = KeyedLimiter::new(two_buckets(3), clock.clone(), Budget::keys(2_000));
    let capacity = limiter.stats().capacity;
    // Fill the store at one instant: more keys than it holds.
    let first = 2 * capacity as u64;
    // Past the capacity a new key may start from the summary of evicted
    // keys, and be kept there alone (it never evicts): the last key stored
    // is the last one that was not.
    let mut last_stored = 0;
    for key in 0..first {
        let before = limiter.stats().summarised;
        let _ = limiter.check(&key, 1).unwrap();
        if limiter.stats().summarised == before {
            last_stored = key;
        }
    }
    let full = limiter.stats();
    assert!(full.evictions > 0 && full.keys > capacity * 9 / 10, "{full:?}");
    accounts_for(full, first);

    // Time passes; with no calls, nothing is dropped.
    clock.advance(100 * WINDOW);
    assert_eq!(limiter.stats(), full, "no background work");
    // Calls on a held key (the last one stored) do not sweep either.
    for _ in 0..3 {
        assert!(limiter.check(&last_stored, 1).unwrap().allowed());
    }
    assert_eq!(limiter.stats(), full);

    // A stream of new keys, the clock moving on by two windows each time.
    let stream = 4 * capacity as u64;
    let mut most = 0;
    for key in first..first + stream {
        clock.advance(2 * WINDOW);
        assert!(limiter.check(&key, 1).unwrap().allowed());
        let stats = limiter.stats();
        most = most.max(stats.keys);
        assert_eq!(stats.evictions, full.evictions, "only idle keys are dropped");
    }
    let end = limiter.stats();
    accounts_for(end, first + stream);
    assert!(end.reclaimed >= full.keys as u64, "{end:?}");
    assert!(most <= full.keys + 1, "the store never grew");
    assert!(end.keys < capacity * 3 / 4, "idle keys dropped: {end:?}");
}

/// A store of `Timed` states drops each key by its own policy's expiry:
/// keys under a long window stay (and keep refusing) while keys under a
/// short one are swept.
#[test]
fn timed_states_expire_by_their_own_policy() {
    let store: StateMap<u64, Timed<State>> = StateMap::new(Budget::keys(1_000));
    let long = Policy::new(2, Duration::from_secs(3_600), Algorithm::SlidingLog).unwrap();
    let short = Policy::new(2, Duration::from_millis(1), Algorithm::SlidingLog).unwrap();
    let hour = 3_600_000_000_000;
    for key in 0..20 {
        for _ in 0..2 {
            assert!(store.admit(&long, &key, 0, 1).unwrap());
            assert!(store.admit(&short, &(1_000 + key), 0, 1).unwrap());
        }
    }
    // New keys under the short policy, each idle by the next one's time.
    let mut now = 1_000_000_000;
    for key in 10_000..12_000u64 {
        now += 2_000_000;
        assert!(store.admit(&short, &key, now, 1).unwrap());
    }
    assert!(now < hour);
    let stats = store.stats();
    assert_eq!(stats.evictions, 0);
    assert!(stats.reclaimed >= 20, "{stats:?}");
    for key in 0..20 {
        assert!(
            !store.admit(&long, &key, now, 1).unwrap(),
            "long key {key} kept its counts"
        );
    }
    for key in 1_000..1_020 {
        assert!(store.admit(&short, &key, now, 2).unwrap(), "short key {key} is fresh");
    }
}

/// A key dropped once idle starts afresh: its whole limit again.
#[test]
fn a_reclaimed_key_starts_afresh() {
    let clock = ManualClock::new(0);
    // One shard of 64 slots (the fewest a shard gets when the bytes allow),
    // the store holding at most 7 keys in it.
    let limiter: KeyedLimiter<u64, _> = KeyedLimiter::new(two_buckets(3), clock.clone(), Budget::keys(7));
    assert_eq!(limiter.stats().capacity, 7);
    for _ in 0..3 {
        assert!(limiter.admit(&1, 1).unwrap());
    }
    assert!(!limiter.admit(&1, 1).unwrap());
    // New keys, each at a later time, so that every key held is idle when
    // the next comes. Every one sweeps 4 slots from the cursor, and 32 more
    // once the store is full: 40 take the cursor around the 64 slots more
    // than once. The sweep can miss every idle key (keys stored behind the
    // cursor, as the hasher's seed places them); the full store then drops
    // the soonest-expiring of the keys near the new one's home, which is
    // idle too, and counts it as reclaimed: no live key is ever evicted.
    for key in 100..140 {
        clock.advance(3 * WINDOW);
        assert!(limiter.admit(&key, 1).unwrap());
        let stats = limiter.stats();
        assert!(stats.keys <= 7 && stats.evictions == 0, "{stats:?}");
    }
    accounts_for(limiter.stats(), 41);
    assert!(!limiter.reset(&1), "key 1 was swept");
    let d = limiter.check(&1, 3).unwrap();
    assert!(d.allowed());
    assert_eq!(d.remaining(), 0);
}

/// A live key evicted to make room keeps its counts (issue [flood]): the
/// store's summary of evicted keys seeds it when it comes back, so a flood
/// of other keys cannot reset it. The eviction is counted, and so is the
/// seeded start. Once its window has passed it has its whole limit again.
#[test]
fn an_evicted_key_keeps_its_counts() {
    let clock = ManualClock::new(0);
    let store: StateMap<u64, Ring2<u16>> = StateMap::new(Budget::keys(64));
    let p = two_buckets(3);
    assert!(store.admit(&p, &1, clock.now(), 3).unwrap());
    assert!(!store.admit(&p, &1, clock.now(), 1).unwrap());
    // 2000 keys holding as much as key 1, at the same instant: key 1 is
    // evicted at some point (and seeded when it asks again), and never
    // admitted. Once the summary is full of such keys, new keys start from
    // it too, are refused, and are not stored (nothing more is evicted).
    for key in 100..2_100 {
        let _ = store.admit(&p, &key, clock.now(), 3).unwrap();
        assert!(
            !store.admit(&p, &1, clock.now(), 1).unwrap(),
            "key 1 gained from eviction"
        );
    }
    let stats = store.stats();
    assert!(stats.evictions > 0 && stats.seeded > 0, "{stats:?}");
    assert_eq!(stats.reclaimed, 0, "nothing was idle");
    assert!(stats.keys <= stats.capacity, "{stats:?}");
    clock.advance(2 * WINDOW);
    assert!(
        store.admit(&p, &1, clock.now(), 3).unwrap(),
        "key 1's window has passed"
    );
}
