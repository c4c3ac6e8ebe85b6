//! The keyed store against `governor`'s keyed limiter, in the same run, on
//! the same key sequences: the cost of one check on 1 hot key, 1k keys and
//! 1M keys, on 1 and 2 threads, mostly admitted and mostly refused; the
//! batch calls against one check at a time; and the bytes each key takes.
//!
//! Run with `cargo bench -p slidegate-memory --bench keyed`; the results and
//! how to read them are in `BENCHMARKS.md` at the root of the workspace.
//!
//! # The two limiters
//!
//! - **Ours:** [`KeyedLimiter`] with `sliding_window`, 2 buckets,
//!   interpolated weighting, 1000 per 60 s (it keeps each key in a
//!   `Ring2<u16>`), in a [`Budget::keys`] of exactly the key set's size,
//!   on a [`ManualClock`].
//! - **governor:** `RateLimiter::dashmap_with_clock_and_hasher` with
//!   `Quota::per_minute(1000)` (GCRA, one cell every 60 ms, burst 1000), a
//!   `FakeRelativeClock` and `foldhash::fast::RandomState`, the hasher our
//!   store uses. Both clocks are an `Arc<AtomicU64>` moved by a
//!   compare-and-swap loop.
//!
//! # Traffic
//!
//! A key set (1 key, 1000 keys or 1 000 000 keys, random `u64`s) and a
//! sequence of keys drawn uniformly from it with a seeded `SmallRng`,
//! generated before measuring and walked cyclically. Both limiters of a
//! line see the same sequence from the same position. The 1M-key limiters
//! are filled with every key of the set before anything is measured, so
//! that the lines measure checks of keys already held.
//!
//! An iteration is a chunk of [`CHUNK`] consecutive keys of the sequence:
//! the clock moves by `CHUNK` × the step, then each key is checked at cost 1.
//!
//! - **allowed:** the step is 240 ms divided by the number of keys, so each
//!   key is offered a quarter of its limit on average, and (nearly) every
//!   check is admitted; the bench prints the share admitted after each line.
//! - **refused:** the hot key, the clock moving 1 µs per check: the key is
//!   offered 60 000× its limit and nearly every check is refused (the
//!   refusal path: `retry_after` for `check`, governor's `NotUntil`).
//!
//! With 2 threads both threads check the same limiter and move the same
//! clock, each walking the sequence from its own position (the second
//! starts half-way). Criterion's `iter_custom` times a fixed number of
//! chunks split between two `std::thread::scope` threads, so a line's time
//! per iteration is wall time for the pair, i.e. throughput: divide by
//! `CHUNK` for ns per check.
//!
//! # Lines
//!
//! - `slidegate_admit`: [`KeyedLimiter::admit`], yes or no, as governor's
//!   `check_key` answers.
//! - `slidegate_check`: [`KeyedLimiter::check`], a full decision (remaining,
//!   reset, retry-after), kept with `black_box`.
//! - `slidegate_admit_many` / `slidegate_check_many`: the batch calls, one
//!   call per chunk of [`CHUNK`] keys (the clock is read once per call).
//! - `governor`: `check_key`.
//! - `governor_with_state`: `check_key` with `StateInformationMiddleware`,
//!   asked for the remaining burst on admission and the wait on refusal.
//!
//! # Bytes per key
//!
//! Before the lines, the bench installs the counting allocator of
//! `slidegate-conformance` and reports, for 1M `u64` keys and 1M `String`
//! keys (`"client-000123"`, 13 bytes), the bytes allocated by building a
//! limiter and checking every key once, divided by the number of keys.
//! The allocator counts the bytes requested, not the allocator's overhead,
//! for both libraries alike.

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use governor::clock::{Clock as _, FakeRelativeClock};
use governor::middleware::StateInformationMiddleware;
use governor::state::keyed::DashMapStateStore;
use governor::{Quota, RateLimiter};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use slidegate_conformance::alloc::Counting;
use slidegate_core::{Algorithm, Decision, ManualClock, Policy, Weighting};
use slidegate_memory::{Budget, Key, KeyedLimiter, MemoryError};
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

#[global_allocator]
static ALLOC: Counting = Counting::new();

/// Requests admitted per window.
const LIMIT: u32 = 1000;
/// The window.
const WINDOW: Duration = Duration::from_secs(60);
/// Keys per iteration, per clock move and per batch call.
const CHUNK: usize = 64;
/// The large key set.
const MANY: usize = 1_000_000;
/// The seed of every key set and sequence.
const SEED: u64 = 0x5eed_2026;

/// The hasher of both limiters.
type Hasher = foldhash::fast::RandomState;
/// governor's keyed limiter on a `DashMap`.
type Governor<K, MW = governor::middleware::NoOpMiddleware<governor::nanos::Nanos>> =
    RateLimiter<K, DashMapStateStore<K, Hasher>, FakeRelativeClock, MW>;

fn policy(buckets: u32) -> Policy {
    let algorithm = Algorithm::SlidingWindow {
        buckets,
        weighting: Weighting::Interpolated,
    };
    black_box(Policy::new(u64::from(LIMIT), WINDOW, algorithm).expect("a valid policy"))
}

fn new_ours<K: Key>(buckets: u32, keys: usize) -> (KeyedLimiter<K, ManualClock>, ManualClock) {
    let clock = ManualClock::new(0);
    let limiter = KeyedLimiter::new(policy(buckets), clock.clone(), Budget::keys(keys));
    (limiter, clock)
}

fn new_governor<K: std::hash::Hash + Eq + Clone>() -> (Governor<K>, FakeRelativeClock) {
    let quota = black_box(Quota::per_minute(NonZeroU32::new(LIMIT).expect("a non-zero limit")));
    let clock = FakeRelativeClock::default();
    let limiter = RateLimiter::dashmap_with_clock_and_hasher(quota, clock.clone(), Hasher::default());
    (limiter, clock)
}

/// A key set and a sequence drawn uniformly from it.
struct Traffic {
    /// `hot`, `1k` or `1M`.
    label: &'static str,
    set: Vec<u64>,
    seq: Vec<u64>,
}

impl Traffic {
    fn new(label: &'static str, keys: usize, seq_len: usize, rng: &mut SmallRng) -> Self {
        let set: Vec<u64> = (0..keys).map(|_| rng.random()).collect();
        let seq = (0..seq_len).map(|_| set[rng.random_range(0..keys)]).collect();
        Traffic { label, set, seq }
    }

    /// The clock step per check that offers each key a quarter of its limit.
    fn allowed_step(&self) -> Duration {
        WINDOW * 4 / LIMIT / self.set.len() as u32
    }
}

/// What a line's threads reuse between chunks.
struct Scratch<'k> {
    requests: Vec<(&'k u64, u64)>,
    admitted: Vec<Result<bool, MemoryError>>,
    decisions: Vec<Result<Decision, MemoryError>>,
}

impl Scratch<'_> {
    fn new() -> Self {
        Scratch {
            requests: Vec::with_capacity(CHUNK),
            admitted: Vec::with_capacity(CHUNK),
            decisions: Vec::with_capacity(CHUNK),
        }
    }
}

/// One line: each iteration moves the clock by `CHUNK × step` (`advance`)
/// and runs `run` on the next `CHUNK` keys of `seq`, on `threads` threads.
/// `run` returns how many checks were admitted.
#[allow(clippy::too_many_arguments)]
fn line<'k>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    function: &str,
    case: &str,
    seq: &'k [u64],
    step: Duration,
    threads: usize,
    advance: impl Fn(Duration) + Sync,
    run: impl Fn(&'k [u64], &mut Scratch<'k>) -> u64 + Sync,
) {
    let chunks = seq.len() / CHUNK;
    let cursors: Vec<AtomicUsize> = (0..threads).map(|t| AtomicUsize::new(t * chunks / threads)).collect();
    let (admitted, checked) = (AtomicU64::new(0), AtomicU64::new(0));
    let by = step * CHUNK as u32;
    let work = |t: usize, iters: u64| {
        let mut scratch = Scratch::new();
        let mut c = cursors[t].load(Ordering::Relaxed);
        let mut ok = 0;
        for _ in 0..iters {
            advance(by);
            ok += run(&seq[c * CHUNK..(c + 1) * CHUNK], &mut scratch);
            c += 1;
            if c == chunks {
                c = 0;
            }
        }
        cursors[t].store(c, Ordering::Relaxed);
        admitted.fetch_add(ok, Ordering::Relaxed);
        checked.fetch_add(iters * CHUNK as u64, Ordering::Relaxed);
    };
    let work = &work;
    group.bench_function(BenchmarkId::new(function, case), |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            if threads == 1 {
                work(0, iters);
            } else {
                std::thread::scope(|s| {
                    for t in 0..threads {
                        let n = iters / threads as u64 + u64::from((t as u64) < iters % threads as u64);
                        s.spawn(move || work(t, n));
                    }
                });
            }
            start.elapsed()
        });
    });
    let (admitted, checked) = (admitted.into_inner(), checked.into_inner());
    eprintln!(
        "{function}/{case}: {admitted} of {checked} checks admitted ({:.2} %)",
        100.0 * admitted as f64 / checked.max(1) as f64
    );
}

// The functions below decide one chunk of keys each. They are never inlined,
// so that a profiler attributes every line's cost to one function, called
// once per chunk: e.g. `valgrind --tool=callgrind --toggle-collect='keyed::admit_each'`
// on the bench binary run with `--bench --profile-time 2 slidegate_admit/hot_allowed_1t`
// counts the instructions of 64 checks per call.

#[inline(never)]
fn admit_each(limiter: &KeyedLimiter<u64, ManualClock>, keys: &[u64]) -> u64 {
    keys.iter()
        .map(|k| u64::from(matches!(limiter.admit(k, 1), Ok(true))))
        .sum()
}

#[inline(never)]
fn check_each(limiter: &KeyedLimiter<u64, ManualClock>, keys: &[u64]) -> u64 {
    keys.iter()
        .map(|k| {
            let decision = limiter.check(k, 1);
            let ok = matches!(&decision, Ok(d) if d.allowed());
            black_box(&decision);
            u64::from(ok)
        })
        .sum()
}

#[inline(never)]
fn admit_many<'k>(limiter: &KeyedLimiter<u64, ManualClock>, keys: &'k [u64], s: &mut Scratch<'k>) -> u64 {
    s.requests.clear();
    s.requests.extend(keys.iter().map(|k| (k, 1)));
    s.admitted.clear();
    limiter.admit_many(&s.requests, &mut s.admitted);
    s.admitted.iter().filter(|r| matches!(r, Ok(true))).count() as u64
}

#[inline(never)]
fn check_many<'k>(limiter: &KeyedLimiter<u64, ManualClock>, keys: &'k [u64], s: &mut Scratch<'k>) -> u64 {
    s.requests.clear();
    s.requests.extend(keys.iter().map(|k| (k, 1)));
    s.decisions.clear();
    limiter.check_many(&s.requests, &mut s.decisions);
    let ok = s.decisions.iter().filter(|r| matches!(r, Ok(d) if d.allowed())).count();
    black_box(&s.decisions);
    ok as u64
}

#[inline(never)]
fn governor_each(limiter: &Governor<u64>, keys: &[u64]) -> u64 {
    keys.iter().map(|k| u64::from(limiter.check_key(k).is_ok())).sum()
}

#[inline(never)]
fn governor_with_state_each(
    limiter: &Governor<u64, StateInformationMiddleware>,
    clock: &FakeRelativeClock,
    keys: &[u64],
) -> u64 {
    keys.iter()
        .map(|k| {
            let result = match limiter.check_key(k) {
                Ok(snapshot) => Ok(snapshot.remaining_burst_capacity()),
                Err(not_until) => Err(not_until.wait_time_from(clock.now())),
            };
            let ok = result.is_ok();
            black_box(&result);
            u64::from(ok)
        })
        .sum()
}

/// Checks every key of the set once, moving both clocks as the lines do.
fn fill(traffic: &Traffic, step: Duration, mut check: impl FnMut(&u64), advance: impl Fn(Duration)) {
    for chunk in traffic.set.chunks(CHUNK) {
        advance(step * CHUNK as u32);
        chunk.iter().for_each(&mut check);
    }
}

/// Every line of one key set with `threads` threads and the given step.
#[allow(clippy::too_many_arguments)]
fn lines(
    group: &mut BenchmarkGroup<'_, WallTime>,
    traffic: &Traffic,
    case: &str,
    step: Duration,
    threads: usize,
    limiters: &Limiters,
    batches: bool,
    with_state: bool,
) {
    let seq = &traffic.seq[..];
    let (ours, ours_clock) = (&limiters.ours, &limiters.ours_clock);
    let (gov, gov_clock) = (&limiters.governor, &limiters.governor_clock);
    let (gs, gs_clock) = (&limiters.with_state, &limiters.with_state_clock);
    let ours_advance = |by| ours_clock.advance(by);
    line(
        group,
        "slidegate_admit",
        case,
        seq,
        step,
        threads,
        ours_advance,
        |k, _| admit_each(ours, k),
    );
    line(
        group,
        "slidegate_check",
        case,
        seq,
        step,
        threads,
        ours_advance,
        |k, _| check_each(ours, k),
    );
    if batches {
        line(
            group,
            "slidegate_admit_many",
            case,
            seq,
            step,
            threads,
            ours_advance,
            |k, s| admit_many(ours, k, s),
        );
        line(
            group,
            "slidegate_check_many",
            case,
            seq,
            step,
            threads,
            ours_advance,
            |k, s| check_many(ours, k, s),
        );
    }
    line(
        group,
        "governor",
        case,
        seq,
        step,
        threads,
        |by| gov_clock.advance(by),
        |k, _| governor_each(gov, k),
    );
    if with_state {
        line(
            group,
            "governor_with_state",
            case,
            seq,
            step,
            threads,
            |by| gs_clock.advance(by),
            |k, _| governor_with_state_each(gs, gs_clock, k),
        );
    }
}

/// The limiters of one key set, filled with it.
struct Limiters {
    ours: KeyedLimiter<u64, ManualClock>,
    ours_clock: ManualClock,
    governor: Governor<u64>,
    governor_clock: FakeRelativeClock,
    with_state: Governor<u64, StateInformationMiddleware>,
    with_state_clock: FakeRelativeClock,
}

impl Limiters {
    fn filled(traffic: &Traffic) -> Self {
        let (ours, ours_clock) = new_ours::<u64>(2, traffic.set.len());
        let (governor, governor_clock) = new_governor::<u64>();
        let (with_state, with_state_clock) = new_governor::<u64>();
        let with_state = with_state.with_middleware::<StateInformationMiddleware>();
        let step = traffic.allowed_step();
        fill(
            traffic,
            step,
            |k| {
                let _ = ours.admit(k, 1);
            },
            |by| ours_clock.advance(by),
        );
        fill(
            traffic,
            step,
            |k| {
                let _ = governor.check_key(k);
            },
            |by| governor_clock.advance(by),
        );
        fill(
            traffic,
            step,
            |k| {
                let _ = with_state.check_key(k);
            },
            |by| with_state_clock.advance(by),
        );
        eprintln!(
            "{} keys: ours {}; governor {} keys held",
            traffic.label,
            describe(&ours),
            governor.len()
        );
        Limiters {
            ours,
            ours_clock,
            governor,
            governor_clock,
            with_state,
            with_state_clock,
        }
    }

    fn report(&self, label: &str) {
        eprintln!(
            "after the {label} lines: ours {}; governor {} keys held",
            describe(&self.ours),
            self.governor.len()
        );
    }
}

fn keyed(c: &mut Criterion) {
    bytes_per_key();

    let mut group = c.benchmark_group("keyed");
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_millis(2500))
        .throughput(Throughput::Elements(CHUNK as u64));

    let mut rng = SmallRng::seed_from_u64(SEED);
    let sets = [
        Traffic::new("hot", 1, 4096, &mut rng),
        Traffic::new("1k", 1000, 1 << 20, &mut rng),
        Traffic::new("1M", MANY, 1 << 22, &mut rng),
    ];
    for traffic in &sets {
        let limiters = Limiters::filled(traffic);
        let many = traffic.set.len() == MANY;
        let step = traffic.allowed_step();
        for threads in [1, 2] {
            let case = format!("{}_allowed_{threads}t", traffic.label);
            lines(&mut group, traffic, &case, step, threads, &limiters, many, threads == 1);
        }
        if traffic.set.len() == 1 {
            for threads in [1, 2] {
                let case = format!("{}_refused_{threads}t", traffic.label);
                let step = Duration::from_micros(1);
                lines(
                    &mut group,
                    traffic,
                    &case,
                    step,
                    threads,
                    &limiters,
                    false,
                    threads == 1,
                );
            }
        }
        limiters.report(traffic.label);
    }
    group.finish();
}

/// Bytes allocated by `build` and still held when it returns, per key;
/// also the peak while it ran.
fn bytes_held<T>(label: &str, keys: usize, build: impl FnOnce() -> T, describe: impl FnOnce(&T) -> String) {
    let before = ALLOC.current();
    ALLOC.reset_peak();
    let held = build();
    let (after, peak) = (ALLOC.current(), ALLOC.peak());
    let per_key = after.saturating_sub(before) as f64 / keys as f64;
    let peak_per_key = peak.saturating_sub(before) as f64 / keys as f64;
    eprintln!(
        "bytes per key, {label}: {per_key:.1} (peak while filling {peak_per_key:.1}; {})",
        describe(&held)
    );
    drop(held);
}

fn describe<K: Key>(limiter: &KeyedLimiter<K, ManualClock>) -> String {
    let s = limiter.stats();
    format!(
        "{} keys held, {} evicted, {} reclaimed, capacity {}, stats.bytes {} ({:.1} per key held)",
        s.keys,
        s.evictions,
        s.reclaimed,
        s.capacity,
        s.bytes,
        s.bytes as f64 / s.keys.max(1) as f64
    )
}

/// Bytes per key at 1M keys, `u64` and `String` keys, for governor and for
/// ours at 2 and 8 buckets, in a budget of exactly 1M keys.
fn bytes_per_key() {
    let mut rng = SmallRng::seed_from_u64(SEED ^ 1);
    let ints: Vec<u64> = (0..MANY).map(|_| rng.random()).collect();
    let names: Vec<String> = (0..MANY).map(|i| format!("client-{i:06}")).collect();
    for budget in [MANY] {
        for buckets in [2, 8] {
            bytes_held(
                &format!("slidegate n={buckets}, Budget::keys({budget}), u64"),
                MANY,
                || {
                    let (l, _) = new_ours::<u64>(buckets, budget);
                    for k in &ints {
                        let _ = l.admit(k, 1);
                    }
                    l
                },
                describe,
            );
            bytes_held(
                &format!("slidegate n={buckets}, Budget::keys({budget}), String"),
                MANY,
                || {
                    let (l, _) = new_ours::<String>(buckets, budget);
                    for k in &names {
                        let _ = l.admit(k.as_str(), 1);
                    }
                    l
                },
                describe,
            );
        }
    }
    bytes_held(
        "governor, u64",
        MANY,
        || {
            let (g, _) = new_governor::<u64>();
            for k in &ints {
                let _ = g.check_key(k);
            }
            g
        },
        |g| format!("{} keys held", g.len()),
    );
    bytes_held(
        "governor, String",
        MANY,
        || {
            let (g, _) = new_governor::<String>();
            for k in &names {
                let _ = g.check_key(k);
            }
            g
        },
        |g| format!("{} keys held", g.len()),
    );
}

criterion_group!(benches, keyed);
criterion_main!(benches);
