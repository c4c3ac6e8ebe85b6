//! Proptest configuration and the strategies the suites draw from.

use proptest::prelude::*;
use slidegate_core::{Algorithm, Policy, Weighting};
use std::ops::Range;
use std::time::Duration;

/// Cases per property for a core state, unless `PROPTEST_CASES` says
/// otherwise.
pub const CASES: u32 = 2_000;

/// The environment variable that overrides the number of cases.
pub const CASES_VAR: &str = "PROPTEST_CASES";

/// `default_cases` cases per property, or as many as `PROPTEST_CASES` says.
/// Failures are persisted beside the calling test file, as by default.
pub fn config(default_cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases: cases(std::env::var(CASES_VAR).ok().as_deref(), default_cases),
        ..ProptestConfig::default()
    }
}

/// The number of cases `PROPTEST_CASES` asks for (`var`), or
/// `default_cases` when it is unset or not a number.
pub fn cases(var: Option<&str>, default_cases: u32) -> u32 {
    var.and_then(|c| c.trim().parse().ok()).unwrap_or(default_cases)
}

/// Requests as `(gap since the previous one, cost)`; times never go back.
pub fn requests(max_gap: u64, max_cost: u64) -> impl Strategy<Value = Vec<(u64, u64)>> {
    let cost = prop_oneof![3 => Just(1u64), 2 => 0..=max_cost];
    let gap = prop_oneof![3 => 0..=max_gap, 1 => Just(0u64), 1 => 0..=max_gap * 8];
    prop::collection::vec((gap, cost), 1..120)
}

/// Requests as `(time, cost)` at any time, going backwards too.
pub fn steps() -> impl Strategy<Value = Vec<(u64, u64)>> {
    prop::collection::vec((0u64..300, 0u64..14), 1..80)
}

/// Requests `(time, cost)` with extreme values: 0, 1 and `u64::MAX`.
pub fn extreme_steps() -> impl Strategy<Value = Vec<(u64, u64)>> {
    prop::collection::vec(
        (
            prop_oneof![Just(0u64), Just(u64::MAX), any::<u64>()],
            prop_oneof![Just(0u64), Just(1u64), Just(u64::MAX), any::<u64>()],
        ),
        1..40,
    )
}

/// The `(time, cost)` of requests given as `(gap, cost)`, from `start`.
pub fn times(reqs: &[(u64, u64)], start: u64) -> Vec<(u64, u64)> {
    let mut t = start;
    reqs.iter()
        .map(|&(gap, cost)| {
            t += gap;
            (t, cost)
        })
        .collect()
}

/// A `sliding_window` of `buckets` buckets of `bucket_ns` ns, the window
/// shortened by up to `extra_ns` (so that `n − 1` does not always divide
/// it: the bucket is then rounded up).
///
/// # Panics
///
/// Unless `buckets ≥ 2` and `bucket_ns ≥ 1`.
pub fn ring(limit: u64, buckets: u32, bucket_ns: u64, extra_ns: u64, weighting: Weighting) -> Policy {
    let window = (u64::from(buckets) - 1) * bucket_ns - extra_ns.min(bucket_ns - 1).min(u64::from(buckets) - 2);
    Policy::new(
        limit,
        Duration::from_nanos(window),
        Algorithm::SlidingWindow { buckets, weighting },
    )
    .unwrap()
}

/// Either weighting of the oldest bucket.
pub fn weighting() -> impl Strategy<Value = Weighting> {
    prop_oneof![Just(Weighting::Interpolated), Just(Weighting::Conservative)]
}

/// The policies a subject can serve, and so the ones the suite draws for
/// it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Family {
    /// Every algorithm: a core state, a store of any state.
    Any,
    /// `sliding_window` with a number of buckets in `buckets` and a limit
    /// of at most `max_limit`.
    SlidingWindow {
        /// The bucket counts served.
        buckets: Range<u32>,
        /// The largest limit served.
        max_limit: u64,
    },
    /// `fixed_window` only.
    FixedWindow,
    /// `gcra` only.
    Gcra,
}

impl Family {
    /// Whether a policy is of this family.
    pub fn has(&self, policy: &Policy) -> bool {
        match (self, policy.algorithm()) {
            (Family::Any, _)
            | (Family::FixedWindow, Algorithm::FixedWindow)
            | (Family::Gcra, Algorithm::Gcra { .. }) => true,
            (
                Family::SlidingWindow {
                    buckets: range,
                    max_limit,
                },
                Algorithm::SlidingWindow { buckets, .. },
            ) => range.contains(&buckets) && policy.limit() <= *max_limit,
            _ => false,
        }
    }
}

/// Small policies of every algorithm: limits below 12, windows below 200 ns.
pub fn any_policy() -> impl Strategy<Value = Policy> {
    let algorithm = prop_oneof![
        (2u32..12, weighting()).prop_map(|(buckets, weighting)| Algorithm::SlidingWindow { buckets, weighting }),
        Just(Algorithm::FixedWindow),
        Just(Algorithm::SlidingLog),
        (1u64..12).prop_map(|burst| Algorithm::Gcra { burst }),
        (0.01f64..0.9).prop_map(|epsilon| Algorithm::ExponentialHistogram { epsilon }),
    ];
    small(algorithm)
}

/// Limits below 12 and windows below 200 ns for the algorithms of
/// `algorithm`, with a `gcra` burst clamped to the limit.
fn small(algorithm: impl Strategy<Value = Algorithm>) -> impl Strategy<Value = Policy> {
    (1u64..12, 1u64..200, algorithm).prop_filter_map("valid", |(limit, window, algorithm)| {
        let algorithm = match algorithm {
            Algorithm::Gcra { burst } => Algorithm::Gcra {
                burst: burst.min(limit),
            },
            other => other,
        };
        Policy::new(limit, Duration::from_nanos(window), algorithm).ok()
    })
}

/// Small policies of `family`, as [`any_policy`] draws them.
pub fn policy_in(family: &Family) -> BoxedStrategy<Policy> {
    match family {
        Family::Any => any_policy().boxed(),
        Family::SlidingWindow { buckets, .. } => small(
            (buckets.clone(), weighting())
                .prop_map(|(buckets, weighting)| Algorithm::SlidingWindow { buckets, weighting }),
        )
        .boxed(),
        Family::FixedWindow => small(Just(Algorithm::FixedWindow)).boxed(),
        Family::Gcra => small((1u64..12).prop_map(|burst| Algorithm::Gcra { burst })).boxed(),
    }
}

/// Policies of `family` with extreme values: limits, windows and bursts of
/// 1, `u32::MAX`, `u64::MAX` and anything between.
pub fn extreme_policy_in(family: &Family) -> BoxedStrategy<Policy> {
    let limit = prop_oneof![
        Just(u64::MAX),
        Just(u64::from(u32::MAX)),
        Just(u64::from(u32::MAX) + 1),
        1u64..
    ];
    let window = prop_oneof![Just(1u64), Just(u64::MAX), 1u64..];
    let burst = || prop_oneof![Just(u64::MAX), 1u64..].prop_map(|burst| Algorithm::Gcra { burst });
    let build = |(limit, window, algorithm): (u64, u64, Algorithm)| {
        Policy::new(limit, Duration::from_nanos(window), algorithm).unwrap()
    };
    match family {
        Family::Any => {
            let algorithm = prop_oneof![
                (2u32..70).prop_map(|buckets| Algorithm::SlidingWindow {
                    buckets,
                    weighting: Weighting::Interpolated
                }),
                (2u32..70).prop_map(|buckets| Algorithm::SlidingWindow {
                    buckets,
                    weighting: Weighting::Conservative
                }),
                Just(Algorithm::FixedWindow),
                Just(Algorithm::SlidingLog),
                burst(),
                (1e-6f64..1.0).prop_map(|epsilon| Algorithm::ExponentialHistogram { epsilon }),
            ];
            (limit, window, algorithm).prop_map(build).boxed()
        }
        Family::SlidingWindow { buckets, max_limit } => {
            let limit = prop_oneof![Just(*max_limit), Just(1), 1..=*max_limit];
            let algorithm = (buckets.clone(), weighting())
                .prop_map(|(buckets, weighting)| Algorithm::SlidingWindow { buckets, weighting });
            (limit, window, algorithm).prop_map(build).boxed()
        }
        Family::FixedWindow => (limit, window, Just(Algorithm::FixedWindow)).prop_map(build).boxed(),
        Family::Gcra => (limit, window, burst()).prop_map(build).boxed(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    #[test]
    fn cases_come_from_the_environment_when_it_says_a_number() {
        assert_eq!(cases(None, 7), 7);
        assert_eq!(cases(Some("40"), 7), 40);
        assert_eq!(cases(Some(" 40\n"), 7), 40);
        assert_eq!(cases(Some("many"), 7), 7);
    }

    #[test]
    fn times_accumulate_gaps() {
        assert_eq!(
            times(&[(0, 1), (5, 2), (0, 0), (3, 1)], 10),
            [(10, 1), (15, 2), (15, 0), (18, 1)]
        );
    }

    #[test]
    fn ring_windows_round_the_bucket_up() {
        let p = ring(5, 3, 10, 1, Weighting::Interpolated);
        assert_eq!(p.window_ns(), 19);
        assert_eq!(p.step_ns(), 10);
        assert_eq!(p.effective_window_ns(), 20);
    }

    /// Every strategy of a family draws only policies of that family.
    #[test]
    fn families_draw_their_own_policies() {
        let families = [
            Family::Any,
            Family::SlidingWindow {
                buckets: 2..3,
                max_limit: u64::from(u16::MAX),
            },
            Family::SlidingWindow {
                buckets: 2..9,
                max_limit: u64::from(u32::MAX),
            },
            Family::FixedWindow,
            Family::Gcra,
        ];
        let mut runner = TestRunner::deterministic();
        for family in &families {
            for strategy in [policy_in(family), extreme_policy_in(family)] {
                for _ in 0..500 {
                    let policy = strategy.new_tree(&mut runner).unwrap().current();
                    assert!(family.has(&policy), "{family:?} drew {policy:?}");
                }
            }
        }
    }
}
