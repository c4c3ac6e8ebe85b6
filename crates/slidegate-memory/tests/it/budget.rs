//! A budget of `n` keys holds `n` keys, and no more.

use slidegate_core::{Algorithm, ManualClock, Policy};
use slidegate_memory::{Budget, KeyedLimiter};
use std::time::Duration;

/// Random-looking distinct keys (an odd multiplier is a bijection).
fn key(i: u64) -> u64 {
    i.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

#[test]
fn a_key_budget_holds_that_many_keys_then_evicts() {
    for n in [1_000usize, 100_000, 1_000_000] {
        let policy = Policy::new(10, Duration::from_secs(60), Algorithm::TWO_BUCKETS).unwrap();
        let limiter: KeyedLimiter<u64, _> = KeyedLimiter::new(policy, ManualClock::new(0), Budget::keys(n));
        for i in 0..n as u64 {
            assert!(limiter.admit(&key(i), 1).unwrap());
        }
        let stats = limiter.stats();
        // Shards fill unevenly; 3/4 load leaves room for that, so all `n`
        // are held (a shard overflowing would show as evictions).
        assert_eq!((stats.keys, stats.evictions), (n, 0), "{n} keys: {stats:?}");
        assert_eq!(stats.capacity, n);
        for i in n as u64..n as u64 + 100 {
            assert!(limiter.admit(&key(i), 1).unwrap());
        }
        let stats = limiter.stats();
        // Each new key evicts one, or (started from the summary of evicted
        // keys, in a full shard) is kept in the summary alone.
        assert_eq!(
            (stats.keys, stats.evictions + stats.summarised),
            (n, 100),
            "{n} keys then 100 more: {stats:?}"
        );
    }
}

/// Every store hashes with its own random seed: small budgets, where keys
/// spread least evenly over the shards, hold all their keys for every seed
/// tried.
#[test]
fn small_key_budgets_hold_their_keys_whatever_the_seed() {
    let policy = Policy::new(10, Duration::from_secs(60), Algorithm::TWO_BUCKETS).unwrap();
    for n in [1usize, 7, 100, 1_000, 5_000] {
        for _ in 0..200 {
            let limiter: KeyedLimiter<u64, _> = KeyedLimiter::new(policy, ManualClock::new(0), Budget::keys(n));
            for i in 0..n as u64 {
                assert!(limiter.admit(&key(i), 1).unwrap());
            }
            let stats = limiter.stats();
            assert_eq!((stats.keys, stats.evictions), (n, 0), "{n} keys: {stats:?}");
        }
    }
}
