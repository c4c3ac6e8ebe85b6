//! Issue [flood], the failure policy: while the shared store is down,
//! `FailurePolicy::Local` decides in a bounded `MemoryStore`, and a flood
//! of new keys that fills it does not give a client at its local share a
//! fresh count.

use slidegate_conformance::stores::block_on;
use slidegate_core::{Algorithm, ManualClock, Policy, Weighting};
use slidegate_memory::{Budget, MemoryStore};
use slidegate_store::{Decisions, FailOver, Quota, Store, StoreError, StoreStats};
use std::sync::Arc;
use std::time::Duration;

/// A shared store that is always down.
struct Down;

impl Store for Down {
    async fn decide(&self, _key: &str, _quotas: &[Quota], _cost: u64, _out: &mut Decisions) -> Result<(), StoreError> {
        Err(StoreError::unavailable("connection refused"))
    }

    async fn charge(&self, _key: &str, _quotas: &[Quota], _cost: u64) -> Result<(), StoreError> {
        Err(StoreError::unavailable("connection refused"))
    }

    async fn reset(&self, _key: &str, _quotas: &[Quota]) -> Result<bool, StoreError> {
        Err(StoreError::unavailable("connection refused"))
    }

    fn stats(&self) -> StoreStats {
        StoreStats::default()
    }
}

fn quota(limit: u64, window: Duration, algorithm: Algorithm) -> Quota {
    Quota::new(Policy::new(limit, window, algorithm).unwrap())
}

/// The victim's limit of 10 an hour is 5 on each of 2 instances; the
/// flood's keys take longer windows and their whole limits, on a local
/// store of 8 keys a budget, for every algorithm that counts exactly or
/// conservatively.
#[test]
fn a_flood_does_not_reset_a_local_limit_during_an_outage() {
    let hour = Duration::from_secs(3600);
    let victims = [
        Algorithm::SlidingWindow {
            buckets: 8,
            weighting: Weighting::Conservative,
        },
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::Gcra { burst: 10 },
    ];
    let flood = [
        quota(4, hour * 24, Algorithm::SlidingLog),
        quota(4, hour * 24, Algorithm::FixedWindow),
        quota(
            4,
            hour * 24,
            Algorithm::SlidingWindow {
                buckets: 2,
                weighting: Weighting::Conservative,
            },
        ),
    ];
    block_on(async {
        for algorithm in victims {
            let clock = ManualClock::new(1_000_000_000);
            let local = Arc::new(MemoryStore::with_clock(Budget::keys(8), Budget::keys(8), clock.clone()));
            let store = FailOver::local(Down, 2, Arc::clone(&local));
            let victim = [quota(10, hour, algorithm)];
            let mut out = Decisions::new();
            let mut admitted = 0;
            for _ in 0..5 {
                store.decide("victim", &victim, 1, &mut out).await.unwrap();
                admitted += usize::from(out[0].allowed());
            }
            assert_eq!(admitted, 5, "{algorithm:?}: the local share");
            for round in 0..40 {
                clock.advance(Duration::from_secs(10));
                for k in 0..30 {
                    let q = std::slice::from_ref(&flood[k % flood.len()]);
                    for _ in 0..4 {
                        store
                            .decide(&format!("flood-{round}-{k}"), q, 1, &mut out)
                            .await
                            .unwrap();
                    }
                }
                store.decide("victim", &victim, 1, &mut out).await.unwrap();
                assert!(
                    !out[0].allowed(),
                    "{algorithm:?}, round {round}: admitted past the share"
                );
            }
            let memory = local.memory_stats();
            assert!(memory.evictions > 0, "{algorithm:?}: the flood evicted: {memory:?}");
            assert!(
                memory.seeded > 0,
                "{algorithm:?}: the victim came back seeded: {memory:?}"
            );
        }
    });
}
