//! Makes a given number of decisions on one limiter, for counting a
//! decision's instructions: `bench/load/library-instructions.sh` runs it
//! under callgrind at two counts and divides the difference by theirs, so
//! that start-up cancels.
//!
//! ```text
//! cargo run --release -p slidegate-memory --example decisions -- CASE COUNT [refused] [headers] [busy]
//! ```
//!
//! `CASE` is one of `governor`, `sw2` (`sliding_window` n=2 interpolated),
//! `sw8` (n=8 conservative), `fixed`, `gcra` (the direct limiters), or
//! `governor-keyed`, `keyed` (n=8 conservative, one hot key). Every
//! limiter reads its real clock on every decision: governor its default
//! (`quanta`) clock, slidegate `MonotonicClock`. `refused` sets a limit of
//! 1, so that every decision after the first is a refusal; `headers` asks
//! for the headers' figures (`check`, and governor's
//! `StateInformationMiddleware`); `busy` gives the direct
//! limiters a window of 1 ms instead of a minute, so that a run crosses
//! hundreds of windows and a sliding window's oldest bucket holds counts,
//! as on a key busy for longer than its window (governor's state is one
//! word either way; it ignores the word). The case's decisions must all
//! be admitted, or all refused after the first: the example fails
//! otherwise.

use governor::clock::{Clock as _, DefaultClock, QuantaInstant};
use governor::middleware::{StateInformationMiddleware, StateSnapshot};
use governor::{NotUntil, Quota, RateLimiter};
use slidegate_core::{Algorithm, Limiter, MonotonicClock, Policy, Weighting};
use slidegate_memory::{Budget, KeyedLimiter};
use std::hint::black_box;
use std::num::NonZeroU32;
use std::process::ExitCode;
use std::time::Duration;

/// One decision: whether it admitted.
type Decide = Box<dyn FnMut() -> bool>;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(case), Some(Ok(count))) = (args.first(), args.get(1).map(|c| c.parse::<u64>())) else {
        eprintln!("usage: decisions CASE COUNT [refused] [headers] [busy]");
        return ExitCode::FAILURE;
    };
    let refused = args.iter().any(|a| a == "refused");
    let headers = args.iter().any(|a| a == "headers");
    let busy = args.iter().any(|a| a == "busy");
    let mut decide = match decider(case, refused, headers, busy) {
        Ok(decide) => decide,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let admitted = (0..count).filter(|_| black_box(decide())).count() as u64;
    let expected = if refused { count.min(1) } else { count };
    if admitted != expected {
        eprintln!("error: {admitted} of {count} admitted, {expected} expected");
        return ExitCode::FAILURE;
    }
    println!("{case}: {count} decisions, {admitted} admitted");
    ExitCode::SUCCESS
}

fn decider(case: &str, refused: bool, headers: bool, busy: bool) -> Result<Decide, String> {
    let per_minute = if refused { 1 } else { u32::MAX };
    let quota = Quota::per_minute(NonZeroU32::new(per_minute).ok_or("a zero quota")?);
    let minute = Duration::from_secs(60);
    let window = if busy { Duration::from_millis(1) } else { minute };
    let n8 = Algorithm::SlidingWindow {
        buckets: 8,
        weighting: Weighting::Conservative,
    };
    let (limit, algorithm) = match case {
        "governor" if headers => {
            let clock = DefaultClock::default();
            let limiter =
                RateLimiter::direct_with_clock(quota, clock.clone()).with_middleware::<StateInformationMiddleware>();
            return Ok(Box::new(move || read_state(limiter.check(), &clock)));
        }
        "governor" => {
            let limiter = RateLimiter::direct(quota);
            return Ok(Box::new(move || limiter.check().is_ok()));
        }
        "governor-keyed" if headers => {
            let clock = DefaultClock::default();
            let limiter =
                RateLimiter::dashmap_with_clock(quota, clock.clone()).with_middleware::<StateInformationMiddleware>();
            return Ok(Box::new(move || read_state(limiter.check_key(&0u64), &clock)));
        }
        "governor-keyed" => {
            let limiter = RateLimiter::dashmap(quota);
            return Ok(Box::new(move || limiter.check_key(&0u64).is_ok()));
        }
        "keyed" => {
            let policy = Policy::new(u64::from(per_minute), minute, n8).map_err(|e| e.to_string())?;
            let limiter: KeyedLimiter<u64, _> = KeyedLimiter::new(policy, MonotonicClock::new(), Budget::keys(2));
            if headers {
                return Ok(Box::new(move || {
                    limiter.check(&0, 1).is_ok_and(|decision| {
                        black_box(decision.remaining());
                        black_box(decision.retry_after());
                        decision.allowed()
                    })
                }));
            }
            return Ok(Box::new(move || limiter.admit(&0, 1).unwrap_or(false)));
        }
        "sw2" => (u64::from(per_minute), Algorithm::TWO_BUCKETS),
        "sw8" => (u64::from(per_minute), n8),
        "fixed" => (u64::from(per_minute), Algorithm::FixedWindow),
        // A 1 ns interval admits one a nanosecond; a refused row a burst of 1.
        "gcra" if refused => (1, Algorithm::Gcra { burst: 1 }),
        "gcra" => (60_000_000_000, Algorithm::Gcra { burst: 60_000_000_000 }),
        other => return Err(format!("unknown case {other:?}")),
    };
    // `black_box`: a policy comes from configuration at run time.
    let policy = black_box(Policy::new(limit, window, algorithm).map_err(|e| e.to_string())?);
    let mut limiter = Limiter::new(policy, MonotonicClock::new());
    Ok(if headers {
        Box::new(move || {
            let decision = limiter.check(1);
            black_box(decision.remaining());
            black_box(decision.retry_after());
            decision.allowed()
        })
    } else {
        Box::new(move || limiter.admit(1))
    })
}

/// Reads what governor's answer gives a response's headers (the remaining
/// burst, or the wait), and says whether it admitted.
fn read_state(answer: Result<StateSnapshot, NotUntil<QuantaInstant>>, clock: &DefaultClock) -> bool {
    match answer {
        Ok(snapshot) => {
            black_box(snapshot.remaining_burst_capacity());
            true
        }
        Err(not_until) => {
            black_box(not_until.wait_time_from(clock.now()));
            false
        }
    }
}
