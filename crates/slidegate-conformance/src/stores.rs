//! The conformance suite of the store interface: the properties every
//! [`Store`] must have, written once as async functions of a store built
//! on a manual clock, and the [`store_suite!`](crate::store_suite!) macro
//! that instantiates them as tests for one store (as limitador's
//! `test_with_all_storage_impls!`).
//!
//! Policies are drawn so that a store counting in microseconds (Redis)
//! decides exactly as one counting in nanoseconds: every window is a whole
//! number of microseconds that the bucket count and the limit divide, and
//! the clock moves in whole microseconds.

use crate::Figures;
use proptest::prelude::*;
use slidegate_core::{Algorithm, Decision, LimitState, ManualClock, Policy, State, Weighting};
use slidegate_store::{Decisions, Quota, Store, decide_all};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// Which algorithms a store keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algorithms {
    /// `sliding_window`, `fixed_window`, `sliding_log` and `gcra`.
    All,
    /// `sliding_window` and `fixed_window` (the hybrid mode).
    Windows,
}

/// A policy the suite draws: algorithm, limit and a window whose
/// microseconds the bucket count and the limit divide.
pub fn policy(algorithms: Algorithms) -> impl Strategy<Value = Policy> {
    let window = (2u32..9, any::<bool>()).prop_map(|(buckets, c)| Algorithm::SlidingWindow {
        buckets,
        weighting: if c {
            Weighting::Conservative
        } else {
            Weighting::Interpolated
        },
    });
    let algorithm = match algorithms {
        Algorithms::All => prop_oneof![
            window,
            Just(Algorithm::FixedWindow),
            Just(Algorithm::SlidingLog),
            (1u64..6).prop_map(|burst| Algorithm::Gcra { burst }),
        ]
        .boxed(),
        Algorithms::Windows => prop_oneof![window, Just(Algorithm::FixedWindow)].boxed(),
    };
    (algorithm, 1u64..8, 1u64..20).prop_map(|(algorithm, limit, m)| {
        let parts = match algorithm {
            Algorithm::SlidingWindow { buckets, .. } => u64::from(buckets - 1),
            _ => 1,
        };
        let micros = parts * limit * m * 10;
        let algorithm = match algorithm {
            Algorithm::Gcra { burst } => Algorithm::Gcra {
                burst: burst.min(limit),
            },
            other => other,
        };
        Policy::new(limit, Duration::from_micros(micros), algorithm).unwrap_or_else(|e| panic!("{e}"))
    })
}

/// One step of a run: advance the clock by `advance_us`, then decide (or,
/// with `charge`, charge after the fact) `cost` against the quotas in
/// `mask` (bit j for quota j; at least one).
#[derive(Clone, Debug)]
pub struct Step {
    /// Microseconds to move the clock first.
    pub advance_us: u64,
    /// The cost.
    pub cost: u64,
    /// Which quotas the call names.
    pub mask: u8,
    /// A charge after the fact instead of a decision.
    pub charge: bool,
}

/// Steps of a run.
pub fn steps() -> impl Strategy<Value = Vec<Step>> {
    let step = (
        prop_oneof![3 => 0u64..40, 1 => 0u64..2000],
        0u64..9,
        1u8..8,
        prop::bool::weighted(0.1),
    )
        .prop_map(|(advance_us, cost, mask, charge)| Step {
            advance_us,
            cost,
            mask,
            charge,
        });
    prop::collection::vec(step, 1..40)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("a tokio runtime: {e}"))
}

/// Runs `f` to completion on a fresh runtime.
pub fn block_on<F: Future>(f: F) -> F::Output {
    runtime().block_on(f)
}

/// What a caller sees of a decision, its durations at the resolution all
/// stores share: whole microseconds, rounded up (a Redis store counts in
/// microseconds and rounds its instants up, never early).
fn figures(d: &Decision) -> (bool, u64, u128, Option<u128>) {
    let f = Figures::of(d);
    let micros = |t: Duration| t.as_nanos().div_ceil(1000);
    (f.allowed, f.remaining, micros(f.reset_after), f.retry_after.map(micros))
}

/// Every decision and charge of the store is the core's, header for
/// header, under the all-or-nothing rule over the quotas of each call.
///
/// # Panics
///
/// On the first decision that differs, naming the step.
pub async fn decides_like_the_core<S: Store>(store: &S, clock: &ManualClock, policies: &[Policy], steps: &[Step]) {
    // Equal quotas share one count in every store (a key's counts under a
    // quota are the same in every call): one call names distinct ones.
    let mut distinct: Vec<Policy> = Vec::new();
    for p in policies {
        if !distinct.iter().any(|d| d.tag() == p.tag()) {
            distinct.push(*p);
        }
    }
    let policies = distinct.as_slice();
    let quotas: Vec<Quota> = policies.iter().copied().map(Quota::new).collect();
    let mut states: Vec<State> = policies.iter().map(State::new).collect();
    let mut out = Decisions::new();
    let mut want = Decisions::new();
    for (i, step) in steps.iter().enumerate() {
        clock.advance(Duration::from_micros(step.advance_us));
        let now = slidegate_core::Clock::now(clock);
        let picked: Vec<usize> = (0..quotas.len()).filter(|j| step.mask & (1 << j) != 0).collect();
        let picked = if picked.is_empty() { vec![0] } else { picked };
        let named: Vec<Quota> = picked.iter().map(|&j| quotas[j].clone()).collect();
        if step.charge {
            store
                .charge("k", &named, step.cost)
                .await
                .unwrap_or_else(|e| panic!("step {i}: {e}"));
            for &j in &picked {
                states[j].record(&policies[j], now, step.cost);
            }
            continue;
        }
        store
            .decide("k", &named, step.cost, &mut out)
            .await
            .unwrap_or_else(|e| panic!("step {i}: {e}"));
        decide_all(picked.len(), step.cost, &mut want, |k, cost| {
            let j = picked[k];
            states[j].check(&policies[j], now, cost)
        });
        let got: Vec<_> = out.iter().map(figures).collect();
        let expected: Vec<_> = want.iter().map(figures).collect();
        assert_eq!(got, expected, "step {i} ({step:?}) at {now} ns, policies {policies:?}");
    }
}

/// 16 concurrent requests on one key with two limits (5 per minute and 7
/// per hour) admit exactly the smaller, and the other limit shows exactly
/// that many charged.
///
/// # Panics
///
/// When more or fewer than 5 are admitted, or the counts disagree.
pub async fn multi_limit_is_atomic<S: Store + 'static>(store: Arc<S>) {
    let minute = Policy::new(5, Duration::from_secs(60), Algorithm::FixedWindow).unwrap_or_else(|e| panic!("{e}"));
    let hour = Policy::new(
        7,
        Duration::from_secs(3600),
        Algorithm::SlidingWindow {
            buckets: 8,
            weighting: Weighting::Conservative,
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let quotas: Arc<[Quota]> = vec![Quota::new(minute), Quota::new(hour)].into();
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let (store, quotas) = (Arc::clone(&store), Arc::clone(&quotas));
            tokio::spawn(async move {
                let mut out = Decisions::new();
                store.decide("multi", &quotas, 1, &mut out).await.map(|()| out)
            })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        let out = task
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(out.len(), 2);
        let all = out.iter().all(Decision::allowed);
        admitted += usize::from(all);
        if !all {
            assert!(!out[0].allowed(), "refused by the hour limit alone: {out:?}");
        }
    }
    assert_eq!(admitted, 5, "exactly the smaller limit admitted");
    let mut out = Decisions::new();
    store
        .decide("multi", &quotas, 0, &mut out)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out[0].remaining(), 0);
    assert_eq!(out[1].remaining(), 2, "the hour limit charged exactly 5");
    // The hour limit alone shows the same count.
    store
        .decide("multi", &quotas[1..], 0, &mut out)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out[0].remaining(), 2);
}

/// A charge after the fact takes a count over its limit; the next request
/// is refused; a reset forgets it.
///
/// # Panics
///
/// When the charge is not seen.
pub async fn charge_then_reset<S: Store>(store: &S, algorithms: Algorithms) {
    let algorithm = match algorithms {
        Algorithms::All => Algorithm::SlidingLog,
        Algorithms::Windows => Algorithm::FixedWindow,
    };
    let policy = Policy::new(5, Duration::from_secs(60), algorithm).unwrap_or_else(|e| panic!("{e}"));
    let quotas = [Quota::new(policy)];
    let mut out = Decisions::new();
    store
        .decide("charged", &quotas, 3, &mut out)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(out[0].allowed());
    store
        .charge("charged", &quotas, 10)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    store
        .decide("charged", &quotas, 1, &mut out)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!out[0].allowed(), "over the limit after the charge");
    assert_eq!(out[0].remaining(), 0);
    assert!(store.reset("charged", &quotas).await.unwrap_or_else(|e| panic!("{e}")));
    store
        .decide("charged", &quotas, 5, &mut out)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(out[0].allowed(), "a reset key starts afresh");
    assert!(
        !store
            .reset("never-seen", &quotas)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    );
}

/// Instantiates the store conformance suite in the calling module for the
/// store that `$new` builds: `$new` is a closure taking a
/// [`ManualClock`] (the store's clock) and returning a future of the
/// store. `cases` is the number of property cases; `algorithms` (by
/// default [`Algorithms::All`]) which algorithms the store keeps.
#[macro_export]
macro_rules! store_suite {
    (new: $new:expr, cases: $cases:expr $(,)?) => {
        $crate::store_suite!(new: $new, cases: $cases, algorithms: All);
    };
    (new: $new:expr, cases: $cases:expr, algorithms: $algorithms:ident $(,)?) => {
        $crate::__proptest::proptest! {
            #![proptest_config($crate::strategy::config($cases))]

            /// Every decision is the core's, header for header, over one
            /// to three quotas per call.
            #[test]
            fn store_decides_like_the_core(
                policies in $crate::__proptest::collection::vec($crate::stores::policy($crate::stores::Algorithms::$algorithms), 1..4),
                steps in $crate::stores::steps(),
            ) {
                $crate::stores::block_on(async {
                    let clock = ::slidegate_core::ManualClock::new(1_000_000_000_000);
                    let store = ($new)(clock.clone()).await;
                    $crate::stores::decides_like_the_core(&store, &clock, &policies, &steps).await;
                });
            }
        }

        #[test]
        fn store_multi_limit_is_atomic() {
            $crate::stores::block_on(async {
                let clock = ::slidegate_core::ManualClock::new(1_000_000_000_000);
                let store = ::std::sync::Arc::new(($new)(clock).await);
                $crate::stores::multi_limit_is_atomic(store).await;
            });
        }

        #[test]
        fn store_charge_then_reset() {
            $crate::stores::block_on(async {
                let clock = ::slidegate_core::ManualClock::new(1_000_000_000_000);
                let store = ($new)(clock).await;
                $crate::stores::charge_then_reset(&store, $crate::stores::Algorithms::$algorithms).await;
            });
        }
    };
}
