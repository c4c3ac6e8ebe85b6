//! The core's state machines under `(time, cost)` sequences.

use crate::Bytes;
use slidegate_conformance::suite;
use slidegate_core::{Algorithm, LimitState, Policy, State, Weighting};
use std::time::Duration;

/// Most requests in one sequence: the oracles are quadratic.
const MAX_STEPS: usize = 64;

/// Derives a property of `slidegate-conformance`'s suite (or the extreme
/// values check) from the first byte, its parameters from the next ones and
/// a sequence of `(gap or time, cost)` from the rest, and runs it on the
/// core's [`State`].
///
/// # Panics
///
/// When a property fails: a decision differs from its exact oracle
/// (sliding_log against the exact log, fixed_window per window, gcra
/// against the textbook GCRA, sliding_window against the seed's counter),
/// conservative sliding_window admits more than the limit in a window, a
/// header lies (`remaining`, `reset_after`, `retry_after`: waiting it
/// admits, 1 ns less does not), a refusal or a zero cost changes the
/// state, or anything above the limit is admitted.
pub fn core_states(data: &[u8]) {
    let mut bytes = Bytes::new(data);
    let which = bytes.u8();
    let result = match which % 11 {
        0 => {
            let (limit, window) = (bytes.range(1, 16), bytes.range(1, 256));
            suite::sliding_log_is_exact(State::new, limit, window, &gaps(&mut bytes, 40, 20))
        }
        1 => suite::conservative_never_over_admits(State::new, ring_params(&mut bytes), &gaps(&mut bytes, 40, 12)),
        2 => {
            let params = ring_params(&mut bytes);
            let start = bytes.range(0, 1000);
            suite::interpolated_admission_within_oldest_bucket(State::new, params, &gaps(&mut bytes, 40, 12), start)
        }
        3 => {
            let (limit, window) = (bytes.range(1, 16), bytes.range(1, 256));
            suite::fixed_window_is_exact_per_window(State::new, limit, window, &gaps(&mut bytes, 40, 20))
        }
        4 => {
            let params = (bytes.range(1, 16), bytes.range(1, 256), bytes.range(1, 16));
            let start = bytes.range(0, 1000);
            suite::gcra_matches_textbook(State::new, params, &gaps(&mut bytes, 40, 20), start)
        }
        // exponential_histogram's `remaining` was one too low after a push
        // that merged the straddling bucket (limit 63, epsilon 0.26; limit
        // 48, epsilon 0.9: `fuzz/regressions/core_states/`), fixed.
        5 => {
            let limit = bytes.range(1, 64);
            let epsilon = bytes.range(1, 99) as f64 / 100.0;
            let window = bytes.range(1, 256);
            suite::exponential_histogram_headers(State::new, (limit, epsilon, window), &gaps(&mut bytes, 40, 20))
        }
        6 => match small_policy(&mut bytes) {
            Some(policy) => suite::time_going_backwards(State::new, &policy, &steps(&mut bytes, 300, 14)),
            None => Ok(()),
        },
        7 => match small_policy(&mut bytes) {
            Some(policy) => {
                let monotone = bytes.u8() & 1 == 0;
                suite::admit_is_check_without_headers(State::new, &policy, &steps(&mut bytes, 300, 14), monotone)
            }
            None => Ok(()),
        },
        8 => {
            let params = (bytes.range(1, 16), bytes.range(2, 12) as u32, bytes.range(1, 64));
            suite::sliding_window_decides_like_the_seed(State::new, params, &gaps(&mut bytes, 40, 1))
        }
        9 => match small_policy(&mut bytes) {
            Some(policy) => {
                let wait = bytes.range(0, 300);
                let before = gaps(&mut bytes, 40, 14);
                let after = gaps(&mut bytes, 40, 14);
                suite::expired_states_decide_like_fresh_ones(State::new, &policy, &before, &after, wait)
            }
            None => Ok(()),
        },
        _ => {
            extreme(&mut bytes);
            Ok(())
        }
    };
    if let Err(e) = result {
        panic!("property {} failed: {e}", which % 11);
    }
}

/// `(limit, buckets, bucket_ns, extra)` for the suite's `ring` policies.
fn ring_params(bytes: &mut Bytes<'_>) -> (u64, u32, u64, u64) {
    let limit = bytes.range(1, 16);
    let buckets = bytes.range(2, 12) as u32;
    let bucket_ns = bytes.range(1, 64);
    let extra = bytes.range(0, 64);
    (limit, buckets, bucket_ns, extra)
}

/// Requests as `(gap since the previous one, cost)`.
fn gaps(bytes: &mut Bytes<'_>, max_gap: u64, max_cost: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    while !bytes.is_empty() && out.len() < MAX_STEPS {
        let gap = match bytes.u8() {
            // Mostly small gaps, sometimes long ones.
            g if g >= 240 => u64::from(g - 240) * max_gap,
            g => u64::from(g) % (max_gap + 1),
        };
        let cost = match bytes.u8() {
            c if c >= 128 => 1,
            c => u64::from(c) % (max_cost + 1),
        };
        out.push((gap, cost));
    }
    out
}

/// Requests as `(time, cost)`, times going backwards too.
fn steps(bytes: &mut Bytes<'_>, max_time: u64, max_cost: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    while !bytes.is_empty() && out.len() < MAX_STEPS {
        let t = u64::from(bytes.u16()) % max_time;
        let cost = u64::from(bytes.u8()) % max_cost;
        out.push((t, cost));
    }
    out
}

/// Any algorithm with small numbers.
fn small_policy(bytes: &mut Bytes<'_>) -> Option<Policy> {
    let algorithm = algorithm(bytes, 12, 12);
    let limit = bytes.range(1, 20);
    let window = bytes.range(1, 200);
    Policy::new(limit, Duration::from_nanos(window), algorithm).ok()
}

fn algorithm(bytes: &mut Bytes<'_>, max_buckets: u64, max_burst: u64) -> Algorithm {
    match bytes.u8() % 6 {
        0 => Algorithm::SlidingWindow {
            buckets: bytes.range(2, max_buckets) as u32,
            weighting: Weighting::Interpolated,
        },
        1 => Algorithm::SlidingWindow {
            buckets: bytes.range(2, max_buckets) as u32,
            weighting: Weighting::Conservative,
        },
        2 => Algorithm::FixedWindow,
        3 => Algorithm::SlidingLog,
        4 => Algorithm::Gcra {
            burst: bytes.range(1, max_burst),
        },
        _ => Algorithm::ExponentialHistogram {
            epsilon: bytes.range(1, 999) as f64 / 1000.0,
        },
    }
}

/// A number that is often at an edge: 0, 1, `u64::MAX`, a power of two or
/// its neighbours, or any.
fn edgy(bytes: &mut Bytes<'_>) -> u64 {
    match bytes.u8() % 8 {
        0 => 0,
        1 => 1,
        2 => u64::MAX,
        3 => u64::MAX - u64::from(bytes.u8()),
        4 => 1u64 << (bytes.u8() % 64),
        5 => (1u64 << (bytes.u8() % 64))
            .wrapping_add(u64::from(bytes.u8() % 3))
            .wrapping_sub(1),
        6 => u64::from(bytes.u8()),
        _ => bytes.u64(),
    }
}

/// Any policy (limits and windows up to `u64::MAX`, up to 65536 buckets)
/// and any times and costs: no panic, nothing above the limit admitted,
/// `remaining ≤ limit`, a zero cost changes nothing, a refusal counts
/// nothing (a peek sees what it saw before), a
/// refused request with a `retry_after` passes once it has been waited (if
/// the time can be written), and an admitted one has no `retry_after`.
fn extreme(bytes: &mut Bytes<'_>) {
    let algorithm = match bytes.u8() % 6 {
        0 | 1 => Algorithm::SlidingWindow {
            buckets: match bytes.u8() % 4 {
                0 => 65536,
                _ => bytes.range(2, 300) as u32,
            },
            weighting: if bytes.u8() & 1 == 0 {
                Weighting::Interpolated
            } else {
                Weighting::Conservative
            },
        },
        2 => Algorithm::FixedWindow,
        3 => Algorithm::SlidingLog,
        4 => Algorithm::Gcra { burst: edgy(bytes) },
        _ => Algorithm::ExponentialHistogram {
            epsilon: f64::from(bytes.u16()) / 65536.0,
        },
    };
    let mut limit = edgy(bytes);
    // A sliding log holds up to `limit` timestamps: keep its memory small.
    if algorithm == Algorithm::SlidingLog {
        limit %= 1 << 12;
    }
    let window = edgy(bytes);
    let Ok(policy) = Policy::new(limit, Duration::from_nanos(window), algorithm) else {
        return;
    };
    let mut state = State::new(&policy);
    let mut steps = 0;
    while !bytes.is_empty() && steps < MAX_STEPS {
        steps += 1;
        let now = edgy(bytes);
        let cost = edgy(bytes);
        let before = state.clone();
        let d = LimitState::check(&mut state, &policy, now, cost);
        let at = format!("{policy:?} at {now} cost {cost}: {d:?}");
        assert_eq!(d.limit(), policy.limit(), "{at}");
        assert!(d.remaining() <= policy.limit(), "remaining over the limit: {at}");
        assert!(!d.allowed() || cost <= policy.limit(), "admitted over the limit: {at}");
        if cost == 0 {
            assert_eq!(state, before, "a peek changed the state: {at}");
        } else if !d.allowed() {
            // A refusal may move a window forward, but counts nothing: a
            // peek sees what it saw before.
            let (was, is) = (
                LimitState::check(&mut before.clone(), &policy, now, 0),
                LimitState::check(&mut state.clone(), &policy, now, 0),
            );
            assert_eq!(was.estimate(), is.estimate(), "a refusal counted: {at}");
            assert_eq!(was.remaining(), is.remaining(), "a refusal counted: {at}");
        }
        let _ = LimitState::estimate(&state, &policy, now);
        let _ = state.expires_at(&policy);
        if d.allowed() {
            assert_eq!(d.retry_after(), None, "{at}");
        } else if let Some(wait) = d.retry_after() {
            let wait = u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX);
            // A wait that reaches `u64::MAX` is saturated: the time it
            // stands for cannot be written.
            if let Some(then) = now.checked_add(wait).filter(|&t| t < u64::MAX) {
                assert!(
                    LimitState::check(&mut before.clone(), &policy, then, cost).allowed(),
                    "refused after waiting retry_after: {at}"
                );
            }
        }
    }
}
