//! The cost of one `check` on one hot key, for every algorithm of this crate
//! and for `governor`'s direct limiter as the baseline.
//!
//! Run with `cargo bench -p slidegate-core --bench check`; the results and
//! how to read them are in `BENCHMARKS.md` at the root of the workspace.
//!
//! # Traffic pattern (the same for every line)
//!
//! The limit is 1000 per 60 s, so the sustainable rate is one request every
//! 60 ms. Every iteration moves a manual clock forward by [`STEP`] = 50 ms,
//! reads it once and checks one request of cost 1: the key is offered 1.2×
//! its limit. Once the first window has filled (criterion's warm-up runs far
//! past it) about 5 requests in 6 are admitted and 1 in 6 is refused, so
//! both the admit path and the refusal path (`retry_after`) are measured.
//! The same clock step crosses a `sliding_window` bucket every 1200 checks
//! with n = 2, every 171 with n = 8, every 20 with n = 61 and on about 6
//! checks in 7 with n = 1024 (buckets of ⌈60 s / (n − 1)⌉).
//!
//! The lines `real_clock/*` are the exception: governor's direct limiter
//! with its default `quanta` clock against our `Limiter` on
//! `MonotonicClock`, each reading its real clock on every check, under a
//! limit no run reaches.
//!
//! Each iteration includes advancing and reading the clock, for our states
//! (`ManualClock`) as for `governor` (`FakeRelativeClock`): both are an
//! `Arc<AtomicU64>` updated with a compare-and-swap loop. The line
//! `clock_only` measures that floor alone.

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, BenchmarkId, Criterion, criterion_group, criterion_main};
use governor::clock::{Clock as _, FakeRelativeClock};
use governor::middleware::StateInformationMiddleware;
use governor::{Quota, RateLimiter};
use slidegate_core::{
    Algorithm, Clock, ExponentialHistogram, FixedWindow, Gcra, LimitState, ManualClock, Policy, SlidingLog,
    SlidingWindow, State, Weighting,
};
use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Duration;

/// Requests admitted per window.
const LIMIT: u32 = 1000;
/// The window.
const WINDOW: Duration = Duration::from_secs(60);
/// How far the clock moves before each check: 1.2× the sustainable rate.
const STEP: Duration = Duration::from_millis(50);
/// The `sliding_window` ring sizes measured.
const BUCKETS: [u32; 4] = [2, 8, 61, 1024];
/// Checks run once before measuring, to report the share admitted.
const PROBE_CHECKS: u32 = 120_000;

fn policy(algorithm: Algorithm) -> Policy {
    // `black_box` keeps the compiler from folding the policy's fields (the
    // bucket width, the limit) into constants: a real policy comes from
    // configuration at run time.
    black_box(Policy::new(u64::from(LIMIT), WINDOW, algorithm).expect("a valid policy"))
}

fn sliding_window(buckets: u32, weighting: Weighting) -> Algorithm {
    Algorithm::SlidingWindow { buckets, weighting }
}

/// Prints the share of [`PROBE_CHECKS`] checks admitted under the traffic
/// pattern, from a fresh state, so that the pattern is visible in the output.
fn probe<S: LimitState>(name: &str, policy: &Policy, mut state: S) {
    let clock = ManualClock::new(0);
    let mut admitted = 0u32;
    for _ in 0..PROBE_CHECKS {
        clock.advance(STEP);
        admitted += u32::from(state.check(policy, clock.now(), 1).allowed());
    }
    eprintln!("{name}: {admitted} of {PROBE_CHECKS} checks admitted");
}

/// `function/parameter` as a criterion id, so that results are filed under
/// `target/criterion/check_hot_key/<function>/<parameter>/`.
fn id(label: &str) -> BenchmarkId {
    match label.split_once('/') {
        Some((function, parameter)) => BenchmarkId::new(function, parameter),
        None => BenchmarkId::from_parameter(label),
    }
}

/// One check of cost 1 on `state` per iteration, the clock moving [`STEP`].
fn bench_state<S: LimitState>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    label: &str,
    algorithm: Algorithm,
    new_state: impl Fn(&Policy) -> S,
) {
    let policy = policy(algorithm);
    probe(label, &policy, new_state(&policy));
    let mut state = black_box(new_state(&policy));
    let clock = ManualClock::new(0);
    group.bench_function(id(label), |b| {
        b.iter(|| {
            clock.advance(STEP);
            let decision = state.check(&policy, clock.now(), black_box(1));
            black_box(&decision);
        });
    });
}

fn check_hot_key(c: &mut Criterion) {
    let mut group = c.benchmark_group("check_hot_key");
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));

    for n in BUCKETS {
        bench_state(
            &mut group,
            &format!("sliding_window_interpolated/{n}"),
            sliding_window(n, Weighting::Interpolated),
            SlidingWindow::<u32>::new,
        );
    }
    // The same checks without headers: `admit` answers only yes or no, as
    // governor's `check` does.
    for n in BUCKETS {
        let policy = policy(sliding_window(n, Weighting::Interpolated));
        let mut state = black_box(SlidingWindow::<u32>::new(&policy));
        let clock = ManualClock::new(0);
        group.bench_function(id(&format!("sliding_window_interpolated_admit/{n}")), |b| {
            b.iter(|| {
                clock.advance(STEP);
                black_box(state.admit(&policy, clock.now(), black_box(1)))
            });
        });
    }
    bench_state(
        &mut group,
        "sliding_window_conservative/8",
        sliding_window(8, Weighting::Conservative),
        SlidingWindow::<u32>::new,
    );
    // What `Limiter` pays: the `State` enum over all algorithms.
    bench_state(
        &mut group,
        "state_enum_sliding_window_interpolated/2",
        sliding_window(2, Weighting::Interpolated),
        State::new,
    );
    bench_state(&mut group, "fixed_window", Algorithm::FixedWindow, |_| {
        FixedWindow::new()
    });
    bench_state(&mut group, "sliding_log", Algorithm::SlidingLog, |_| SlidingLog::new());
    bench_state(
        &mut group,
        "gcra_burst/1000",
        Algorithm::Gcra {
            burst: u64::from(LIMIT),
        },
        |_| Gcra::new(),
    );
    bench_state(
        &mut group,
        "exponential_histogram_epsilon/0.01",
        Algorithm::ExponentialHistogram { epsilon: 0.01 },
        |_| ExponentialHistogram::new(),
    );

    // The baseline: governor's GCRA, 1000 per minute with a burst of 1000
    // (one cell every 60 ms), on its own manual clock moved by the same step.
    let burst = NonZeroU32::new(LIMIT).expect("a non-zero limit");
    let quota = black_box(Quota::per_minute(burst));
    {
        let clock = FakeRelativeClock::default();
        let limiter = RateLimiter::direct_with_clock(quota, clock.clone());
        let mut admitted = 0u32;
        for _ in 0..PROBE_CHECKS {
            clock.advance(STEP);
            admitted += u32::from(limiter.check().is_ok());
        }
        eprintln!("governor_direct: {admitted} of {PROBE_CHECKS} checks admitted");
    }
    let clock = FakeRelativeClock::default();
    let limiter = RateLimiter::direct_with_clock(quota, clock.clone());
    group.bench_function(id("governor_direct"), |b| {
        b.iter(|| {
            clock.advance(STEP);
            let result = limiter.check();
            black_box(&result);
        });
    });

    // The same baseline asked for what our `Decision` carries: the remaining
    // burst on admission (governor's `StateInformationMiddleware`) and the
    // wait on refusal.
    let clock = FakeRelativeClock::default();
    let limiter = RateLimiter::direct_with_clock(quota, clock.clone()).with_middleware::<StateInformationMiddleware>();
    group.bench_function(id("governor_direct_with_state"), |b| {
        b.iter(|| {
            clock.advance(STEP);
            let result = match limiter.check() {
                Ok(snapshot) => Ok(snapshot.remaining_burst_capacity()),
                Err(not_until) => Err(not_until.wait_time_from(clock.now())),
            };
            black_box(&result);
        });
    });

    // Each library on its real clock, as its users get it: governor's
    // default `quanta` clock and our `MonotonicClock` (the TSC through
    // the same crate), every check reading it, a limit no run reaches.
    let unlimited = Quota::per_minute(NonZeroU32::MAX);
    let governor = RateLimiter::direct(unlimited);
    group.bench_function(id("real_clock/governor_direct"), |b| {
        b.iter(|| black_box(governor.check().is_ok()));
    });
    let huge = black_box(
        Policy::new(u64::from(u32::MAX), WINDOW, sliding_window(2, Weighting::Interpolated)).expect("a valid policy"),
    );
    let mut limiter = slidegate_core::Limiter::new(huge, slidegate_core::MonotonicClock::new());
    group.bench_function(id("real_clock/sliding_window_interpolated_admit_2"), |b| {
        b.iter(|| black_box(limiter.admit(black_box(1))));
    });
    let mut limiter = slidegate_core::Limiter::new(huge, slidegate_core::MonotonicClock::new());
    group.bench_function(id("real_clock/sliding_window_interpolated_check_2"), |b| {
        b.iter(|| black_box(limiter.check(black_box(1))));
    });

    // The floor included in every line above: advancing and reading the
    // clock, and nothing else.
    let clock = ManualClock::new(0);
    group.bench_function(id("clock_only"), |b| {
        b.iter(|| {
            clock.advance(STEP);
            black_box(clock.now())
        });
    });
    let fake = FakeRelativeClock::default();
    group.bench_function(id("clock_only_governor"), |b| {
        b.iter(|| {
            fake.advance(STEP);
            black_box(fake.now())
        });
    });

    group.finish();
}

criterion_group!(benches, check_hot_key);
criterion_main!(benches);
