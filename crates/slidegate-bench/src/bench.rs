//! `slidegate-bench`: throughput measured in this process, each case beside
//! its baseline in the same run: every algorithm's decision against
//! governor's direct limiter, the keyed in-memory store against governor's
//! keyed limiter, the service (HTTP and gRPC) over loopback, and, given
//! `--redis`, the Redis scripts against plain `INCR` (`crate::bench_redis`)
//! and the hybrid mode against the scripts (`crate::bench_hybrid`).

use crate::case::{Case, key, percentile};
use anyhow::{Context, Result};
use clap::ValueEnum;
use governor::{Quota, RateLimiter};
use slidegate_core::duration::parse_positive_duration;
use slidegate_core::{Algorithm, Limiter, MonotonicClock, Policy, Weighting};
use slidegate_memory::{Budget, KeyedLimiter};
use std::hint::black_box;
use std::io::Write;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

/// Flags of `slidegate-bench`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// What to measure; repeat or separate with commas [default: all]
    #[arg(long, value_name = "GROUP", value_delimiter = ',', value_parser = ["algorithms", "store", "service", "redis", "hybrid"])]
    only: Vec<String>,

    /// A loopback Redis server to measure the script path on, against plain
    /// INCR (the `redis` group), and the hybrid mode against the script
    /// path (the `hybrid` group); both run only when given
    #[arg(long, value_name = "URL")]
    redis: Option<String>,

    /// Measuring time of each case
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_positive_duration)]
    time: Duration,

    /// Rounds of the algorithms and store groups: each round runs every
    /// baseline and the rows against it again, and each row reports the
    /// median of its rounds' decisions/s and ratios
    #[arg(long, value_name = "N", default_value_t = 1)]
    rounds: usize,

    /// Distinct keys of the store's many-key cases
    #[arg(long, value_name = "N", default_value_t = 1_000_000)]
    keys: u64,

    /// Concurrent requests of the service cases
    #[arg(long, value_name = "N", default_value_t = 32)]
    concurrency: usize,

    /// Concurrent calls of the Redis cases, one connection shared by that
    /// many tasks: every case at each, `INCR` first; separate with commas
    #[arg(long, value_name = "N,...", value_delimiter = ',', default_value = "1,8,32,128")]
    redis_concurrency: Vec<usize>,

    /// How the Redis cases' tasks reach the server: `shared`, one
    /// multiplexed connection (the calls in flight are pipelined, as the
    /// store does), or `per-call`, a connection per task (no pipelining,
    /// as a pool of connections)
    #[arg(long, value_name = "HOW", value_parser = ["shared", "per-call"], default_value = "shared")]
    redis_connections: String,

    /// Output format
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
}

/// `--format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Format {
    /// Aligned columns
    Table,
    /// A JSON array of cases
    Json,
}

fn algorithms() -> Vec<(String, Algorithm)> {
    vec![
        ("sliding_window n=2 interpolated".to_owned(), Algorithm::TWO_BUCKETS),
        (
            "sliding_window n=8 conservative".to_owned(),
            Algorithm::SlidingWindow {
                buckets: 8,
                weighting: Weighting::Conservative,
            },
        ),
        ("fixed_window".to_owned(), Algorithm::FixedWindow),
        ("sliding_log".to_owned(), Algorithm::SlidingLog),
        ("gcra".to_owned(), Algorithm::Gcra { burst: 1_000 }),
        (
            "exponential_histogram ε=0.01".to_owned(),
            Algorithm::ExponentialHistogram { epsilon: 0.01 },
        ),
    ]
}

/// Runs a group `n` times, its baselines and rows taking turns, and keeps
/// each row's median decisions/s and median ratio (each round's ratio is
/// to that round's baseline).
fn rounds(n: usize, mut group: impl FnMut() -> Result<Vec<Case>>) -> Result<Vec<Case>> {
    let runs = (0..n).map(|_| group()).collect::<Result<Vec<_>>>()?;
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    };
    let Some(first) = runs.first() else {
        return Ok(Vec::new());
    };
    Ok(first
        .iter()
        .enumerate()
        .map(|(i, case)| {
            let of = |f: fn(&Case) -> Option<f64>| median(runs.iter().filter_map(|r| r.get(i).and_then(f)).collect());
            Case {
                per_second: of(|c| Some(c.per_second)).unwrap_or(case.per_second),
                ratio: of(|c| c.ratio),
                ..case.clone()
            }
        })
        .collect())
}

/// What a row expects of its decisions: every one admitted, or every one
/// refused after the first (a row that did otherwise would not measure
/// what its name says).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Expect {
    Admitted,
    Refused,
}

impl Expect {
    /// The limit per minute of governor's quota and of ours: one no run
    /// reaches, or 1.
    fn limit(self) -> u32 {
        match self {
            Expect::Admitted => u32::MAX,
            Expect::Refused => 1,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Expect::Admitted => "",
            Expect::Refused => ", refused",
        }
    }

    /// `Ok` when `admitted` of `done` decisions (over `keys` keys) is what
    /// the row expects.
    fn verify(self, name: &str, admitted: u64, done: u64, keys: u64) -> Result<()> {
        let fits = match self {
            Expect::Admitted => admitted == done,
            Expect::Refused => admitted <= keys,
        };
        anyhow::ensure!(
            fits,
            "{name}: {admitted} of {done} decisions admitted, so the row would not measure what it says"
        );
        Ok(())
    }
}

/// What a row runs: each call decides request `i` and says whether it
/// admitted.
enum Op<'a> {
    /// On this thread (a direct limiter is one thread's).
    Own(&'a mut dyn FnMut(u64) -> bool),
    /// On that many threads at once, sharing the limiter.
    Shared(usize, &'a (dyn Fn(u64) -> bool + Sync)),
    /// On this thread, `BATCH` requests a call from request `i` on,
    /// answering how many it admitted.
    Batches(&'a mut dyn FnMut(u64) -> u64),
}

/// Requests per call of a batch row.
const BATCH: u64 = 16;

/// Runs `op` until `time` has passed: decisions per second over all
/// threads, and the decisions admitted and made.
fn measure(time: Duration, op: Op<'_>) -> (f64, u64, u64) {
    /// Calls between readings of the time.
    const CALLS: u64 = 1024;
    let start = Instant::now();
    // `first` sets where a thread's stretch of the key sequence starts.
    let run = |first: u64, op: &mut dyn FnMut(u64) -> bool| {
        let (mut i, mut admitted, mut done) = (first, 0u64, 0u64);
        loop {
            for _ in 0..CALLS {
                admitted += u64::from(black_box(op(i)));
                i += 1;
            }
            done += CALLS;
            if start.elapsed() >= time {
                return (admitted, done);
            }
        }
    };
    let (admitted, done) = match op {
        Op::Own(op) => run(0, op),
        Op::Batches(op) => {
            let (mut i, mut admitted) = (0u64, 0u64);
            while start.elapsed() < time {
                for _ in 0..CALLS / BATCH {
                    admitted += black_box(op(i));
                    i += BATCH;
                }
            }
            (admitted, i)
        }
        Op::Shared(threads, op) => std::thread::scope(|scope| {
            let workers: Vec<_> = (0..threads as u64)
                .map(|t| scope.spawn(move || run(t << 40, &mut |i| op(i))))
                .collect();
            workers
                .into_iter()
                .map(|w| w.join().unwrap_or((0, 0)))
                .fold((0, 0), |(a, d), (a1, d1)| (a + a1, d + d1))
        }),
    };
    (done as f64 / start.elapsed().as_secs_f64(), admitted, done)
}

/// A baseline row and the rows measured against it, in the order run.
struct Rows<'a> {
    group: &'static str,
    time: Duration,
    progress: &'a dyn Fn(&str),
    cases: Vec<Case>,
}

impl Rows<'_> {
    /// Measures one row; against `baseline` (the name of an earlier row)
    /// when given. `keys` is how many keys the row spreads over.
    fn row(&mut self, name: String, baseline: Option<&str>, expect: Expect, keys: u64, op: Op<'_>) -> Result<()> {
        (self.progress)(&name);
        let (per_second, admitted, done) = measure(self.time, op);
        expect.verify(&name, admitted, done, keys)?;
        let mut case = Case::new(self.group, name, per_second);
        if let Some(baseline) = baseline {
            let base = self
                .cases
                .iter()
                .find(|c| c.name == baseline)
                .map(|c| c.per_second)
                .context("the baseline runs first")?;
            case.ratio = Some(per_second / base);
            case.baseline = Some(baseline.to_owned());
        }
        self.cases.push(case);
        Ok(())
    }
}

/// Rows of the `algorithms` group.
pub(crate) const ALGORITHM_ROWS: u64 = 2 * (1 + 6) + 2 * (1 + 3);

/// Every algorithm's decision on one key, reading the monotonic clock as in
/// production, against governor's direct limiter with its default clock
/// (`quanta`, as its users get it): yes or no (`Limiter::admit` against
/// governor's `check`) and with the headers' figures (`Limiter::check`,
/// reading the remaining count and the retry-after, against governor's
/// `StateInformationMiddleware` and `NotUntil::wait_time_from`), admitted
/// and refused.
fn bench_algorithms(time: Duration, progress: &dyn Fn(&str)) -> Result<Vec<Case>> {
    use governor::clock::DefaultClock;
    use governor::middleware::StateInformationMiddleware;
    let mut rows = Rows {
        group: "algorithms",
        time,
        progress,
        cases: Vec::new(),
    };
    let window = Duration::from_secs(60);
    for expect in [Expect::Admitted, Expect::Refused] {
        let quota = Quota::per_minute(NonZeroU32::new(expect.limit()).context("a non-zero quota")?);
        let clock = DefaultClock::default();
        let plain = RateLimiter::direct_with_clock(quota, clock.clone());
        let with_state =
            RateLimiter::direct_with_clock(quota, clock.clone()).with_middleware::<StateInformationMiddleware>();
        let (base, base_state) = (
            format!("governor direct check{}", expect.label()),
            format!("governor direct check with its state{}", expect.label()),
        );
        rows.row(base.clone(), None, expect, 1, Op::Own(&mut |_| plain.check().is_ok()))?;
        let chosen: Vec<(String, Algorithm)> = match expect {
            Expect::Admitted => algorithms(),
            Expect::Refused => algorithms()
                .into_iter()
                .filter(|(_, a)| matches!(a, Algorithm::SlidingWindow { .. } | Algorithm::Gcra { .. }))
                .collect(),
        };
        let limiter = |name: &str, algorithm: Algorithm| -> Result<(String, Limiter<MonotonicClock>)> {
            let (limit, window, label) = match (expect, algorithm) {
                (Expect::Refused, _) => (1, window, name.to_owned()),
                // sliding_log keeps every admitted request: a 1 ms window
                // under a limit of 10⁶ (no thread checks 10⁹ times a
                // second), each check dropping what left the window, as a
                // log at its steady state does.
                (_, Algorithm::SlidingLog) => (1_000_000, Duration::from_millis(1), format!("{name} (a 1 ms window)")),
                // gcra spaces admissions by its interval: 1 ns.
                (_, Algorithm::Gcra { .. }) => (60_000_000_000, window, format!("{name} (a 1 ns interval)")),
                _ => (u64::from(u32::MAX), window, name.to_owned()),
            };
            // A refused gcra row: a burst of 1, so that only the first
            // request passes.
            let algorithm = match (expect, algorithm) {
                (Expect::Refused, Algorithm::Gcra { .. }) => Algorithm::Gcra { burst: 1 },
                _ => algorithm,
            };
            let policy = Policy::new(limit, window, algorithm)?;
            Ok((label, Limiter::new(policy, MonotonicClock::new())))
        };
        for (name, algorithm) in &chosen {
            let (label, mut limiter) = limiter(name, *algorithm)?;
            let name = format!("{label} admit{}", expect.label());
            rows.row(name, Some(&base), expect, 1, Op::Own(&mut |_| limiter.admit(1)))?;
        }
        rows.row(
            base_state.clone(),
            None,
            expect,
            1,
            Op::Own(&mut |_| read_governor_state(with_state.check(), &clock)),
        )?;
        for (name, algorithm) in &chosen {
            let (label, mut limiter) = limiter(name, *algorithm)?;
            let name = format!("{label} check{}", expect.label());
            rows.row(
                name,
                Some(&base_state),
                expect,
                1,
                Op::Own(&mut |_| read_headers(limiter.check(1))),
            )?;
        }
    }
    Ok(rows.cases)
}

/// Reads what governor's answer gives a response's headers (the remaining
/// burst, or the wait), and says whether it admitted.
fn read_governor_state(
    answer: Result<governor::middleware::StateSnapshot, governor::NotUntil<governor::clock::QuantaInstant>>,
    clock: &governor::clock::DefaultClock,
) -> bool {
    use governor::clock::Clock as _;
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

/// Reads what a response's headers carry, and says whether it admitted.
fn read_headers(decision: slidegate_core::Decision) -> bool {
    black_box(decision.remaining());
    black_box(decision.retry_after());
    decision.allowed()
}

/// Rows of the `store` group.
pub(crate) const STORE_ROWS: u64 = 2 * 7 + 1;

/// The keyed store against governor's keyed limiter on a `DashMap`, both
/// with their default hashers and clocks: one hot key and `keys` keys
/// (filled before measuring), yes or no (`admit` against `check_key`) and
/// with the headers' figures, admitted and refused, 1 and 2 threads.
fn bench_store(time: Duration, keys: u64, progress: &dyn Fn(&str)) -> Result<Vec<Case>> {
    use governor::clock::DefaultClock;
    use governor::middleware::StateInformationMiddleware;
    let algorithm = Algorithm::SlidingWindow {
        buckets: 8,
        weighting: Weighting::Conservative,
    };
    let mut rows = Rows {
        group: "store",
        time,
        progress,
        cases: Vec::new(),
    };
    let slots = usize::try_from(keys.saturating_mul(2)).unwrap_or(usize::MAX);
    let cases: [(u64, Expect, usize, bool); 7] = [
        (1, Expect::Admitted, 1, false),
        (1, Expect::Admitted, 1, true),
        (1, Expect::Refused, 1, false),
        (1, Expect::Admitted, 2, false),
        (keys, Expect::Admitted, 1, false),
        (keys, Expect::Admitted, 1, true),
        (keys, Expect::Admitted, 2, false),
    ];
    for (spread, expect, threads, headers) in cases {
        let what = format!(
            "{}{}{}",
            if spread == 1 {
                "one hot key".to_owned()
            } else {
                format!("{spread} keys")
            },
            expect.label(),
            if threads == 1 {
                String::new()
            } else {
                format!(", {threads} threads")
            }
        );
        let quota = Quota::per_minute(NonZeroU32::new(expect.limit()).context("a non-zero quota")?);
        let policy = Policy::new(u64::from(expect.limit()), Duration::from_secs(60), algorithm)?;
        let ours: KeyedLimiter<u64, MonotonicClock> =
            KeyedLimiter::new(policy, MonotonicClock::new(), Budget::keys(slots));
        let base = if headers {
            let clock = DefaultClock::default();
            let governor =
                RateLimiter::dashmap_with_clock(quota, clock.clone()).with_middleware::<StateInformationMiddleware>();
            let check = |i: u64| read_governor_state(governor.check_key(&key(i, spread)), &clock);
            (0..spread).for_each(|i| {
                check(i);
            });
            let base = format!("governor keyed check with its state, {what}");
            rows.row(base.clone(), None, expect, spread, Op::Shared(threads, &check))?;
            base
        } else {
            let governor = RateLimiter::dashmap(quota);
            let check = |i: u64| governor.check_key(&key(i, spread)).is_ok();
            (0..spread).for_each(|i| {
                check(i);
            });
            let base = format!("governor keyed check, {what}");
            rows.row(base.clone(), None, expect, spread, Op::Shared(threads, &check))?;
            base
        };
        (0..spread).for_each(|i| {
            let _ = ours.admit(&key(i, spread), 1);
        });
        if headers {
            rows.row(
                format!("slidegate KeyedLimiter check, {what}"),
                Some(&base),
                expect,
                spread,
                Op::Shared(threads, &|i| ours.check(&key(i, spread), 1).is_ok_and(read_headers)),
            )?;
        } else {
            rows.row(
                format!("slidegate KeyedLimiter admit, {what}"),
                Some(&base),
                expect,
                spread,
                Op::Shared(threads, &|i| ours.admit(&key(i, spread), 1).unwrap_or(false)),
            )?;
            if spread > 1 && threads == 1 {
                // The same requests BATCH at a time (`admit_many`, which
                // overlaps their memory misses); governor has no batch.
                let (mut keys, mut out) = (Vec::new(), Vec::new());
                let mut batch = |i: u64| {
                    keys.clear();
                    keys.extend((i..i + BATCH).map(|i| key(i, spread)));
                    let requests: Vec<(&u64, u64)> = keys.iter().map(|k| (k, 1)).collect();
                    out.clear();
                    ours.admit_many(&requests, &mut out);
                    out.iter().filter(|r| matches!(r, Ok(true))).count() as u64
                };
                rows.row(
                    format!("slidegate KeyedLimiter admit_many, {BATCH} a call, {what}"),
                    Some(&base),
                    expect,
                    spread,
                    Op::Batches(&mut batch),
                )?;
            }
        }
    }
    Ok(rows.cases)
}

/// The service started in this process on loopback, driven by `concurrency`
/// clients in the same process: HTTP/1.1 keep-alive `POST /v1/check` and
/// gRPC `ShouldRateLimit`, each on one hot key.
fn bench_service(time: Duration, concurrency: usize, progress: &dyn Fn(&str)) -> Result<Vec<Case>> {
    use slidegate_server::server::{self, Options};
    // The service runs on threads of its own, so that its CPU time can be
    // told from its clients'.
    let service_runtime = tokio::runtime::Builder::new_multi_thread()
        .thread_name(SERVICE_THREADS)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        let dir = std::env::temp_dir().join(format!("slidegate-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir).context("a temporary directory")?;
        let config = dir.join("bench.yaml");
        std::fs::write(
            &config,
            "domain: bench\ndescriptors:\n  - key: k\n    rate_limit: { unit: second, requests_per_unit: 1000000000 }\n",
        )?;
        let options = Options {
            config: vec![config],
            http: "127.0.0.1:0".parse()?,
            grpc: "127.0.0.1:0".parse()?,
            budget: Budget::bytes(16 << 20),
            other_budget: Budget::bytes(4 << 20),
            reload_every: None,
            ..Options::default()
        };
        let running = service_runtime
            .spawn(server::start(options, MonotonicClock::new()))
            .await
            .context("the service's start")??;
        progress("service HTTP /v1/check");
        let (Some(http), Some(grpc)) = (running.http_addr(), running.grpc_addr()) else {
            anyhow::bail!("the service listens on TCP");
        };
        let before = threads_cpu(SERVICE_THREADS);
        let http = crate::bench_clients::http(http, time, concurrency).await?;
        let http_cpu = threads_cpu(SERVICE_THREADS).saturating_sub(before);
        progress("service gRPC ShouldRateLimit");
        let before = threads_cpu(SERVICE_THREADS);
        let grpc = crate::bench_clients::grpc(grpc, time, concurrency).await?;
        let grpc_cpu = threads_cpu(SERVICE_THREADS).saturating_sub(before);
        let _ = service_runtime.spawn(running.shutdown()).await;
        let _ = std::fs::remove_dir_all(&dir);
        let case = |name: &str, (count, mut latencies): (u64, Vec<Duration>), cpu: Duration| {
            latencies.sort_unstable();
            let mut case = Case::new("service", name, count as f64 / time.as_secs_f64());
            case.p50_us = percentile(&latencies, 0.50);
            case.p99_us = percentile(&latencies, 0.99);
            case.concurrency = Some(concurrency);
            case.server_cpu_us = (count > 0 && cpu > Duration::ZERO).then(|| cpu.as_secs_f64() * 1e6 / count as f64);
            case
        };
        Ok(vec![
            case(
                &format!("HTTP POST /v1/check, one hot key, {concurrency} clients in this process"),
                http,
                http_cpu,
            ),
            case(
                &format!("gRPC ShouldRateLimit, one hot key, {concurrency} calls in flight in this process"),
                grpc,
                grpc_cpu,
            ),
        ])
    })
}

/// The name of the service's threads in the `service` group.
const SERVICE_THREADS: &str = "sg-bench-server";

/// The CPU time so far of this process's threads named `name`: their
/// run time in nanoseconds from `/proc/self/task/*/schedstat`, else user
/// and system time in clock ticks from `stat`; zero where `/proc` is not
/// there to read.
fn threads_cpu(name: &str) -> Duration {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Duration::ZERO;
    };
    tasks
        .filter_map(|task| {
            let dir = task.ok()?.path();
            let comm = std::fs::read_to_string(dir.join("comm")).ok()?;
            if comm.trim_end() != name {
                return None;
            }
            if let Some(ns) = std::fs::read_to_string(dir.join("schedstat"))
                .ok()
                .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
            {
                return Some(Duration::from_nanos(ns));
            }
            // `stat`: fields 14 and 15 after the name in parentheses;
            // 100 ticks a second on Linux.
            let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
            let rest = stat.rsplit_once(')')?.1;
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
            Some(Duration::from_millis(ticks * 10))
        })
        .sum()
}

/// Runs the chosen groups and writes the summary.
pub(crate) fn run(args: &Args, out: &mut dyn Write) -> Result<()> {
    let chosen = |group: &str| args.only.is_empty() || args.only.iter().any(|g| g == group);
    anyhow::ensure!(args.keys > 0, "--keys 0: must be at least 1");
    anyhow::ensure!(args.rounds > 0, "--rounds 0: must be at least 1");
    anyhow::ensure!(args.concurrency > 0, "--concurrency 0: must be at least 1");
    anyhow::ensure!(
        !args.redis_concurrency.is_empty() && !args.redis_concurrency.contains(&0),
        "--redis-concurrency: every concurrency must be at least 1"
    );
    anyhow::ensure!(
        args.redis.is_some() || !args.only.iter().any(|g| g == "redis" || g == "hybrid"),
        "--only redis or hybrid: needs --redis URL (a loopback Redis server)"
    );
    let redis = args.redis.as_deref().filter(|_| chosen("redis"));
    let hybrid = args.redis.as_deref().filter(|_| chosen("hybrid"));
    let steps = [
        ("algorithms", ALGORITHM_ROWS * args.rounds as u64),
        ("store", STORE_ROWS * args.rounds as u64),
        ("service", 2),
        ("redis", crate::bench_redis::steps(args.redis_concurrency.len())),
        ("hybrid", crate::bench_hybrid::STEPS),
    ]
    .iter()
    .filter(|(g, _)| chosen(g) && (!matches!(*g, "redis" | "hybrid") || args.redis.is_some()))
    .map(|(_, n)| *n)
    .sum::<u64>();
    let shown = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let bar = crate::progress::bar(shown, steps, "{bar:30} {pos}/{len} {msg}");
    let progress = |step: &str| crate::progress::step(&bar, step);
    let mut cases = Vec::new();
    if chosen("algorithms") {
        cases.extend(rounds(args.rounds, || bench_algorithms(args.time, &progress))?);
    }
    if chosen("store") {
        cases.extend(rounds(args.rounds, || bench_store(args.time, args.keys, &progress))?);
    }
    if chosen("service") {
        cases.extend(bench_service(args.time, args.concurrency, &progress)?);
    }
    if let Some(url) = redis {
        cases.extend(crate::bench_redis::bench(
            url,
            args.time,
            &args.redis_concurrency,
            args.redis_connections == "per-call",
            &progress,
        )?);
    }
    if let Some(url) = hybrid {
        cases.extend(crate::bench_hybrid::bench(url, args.time, args.concurrency, &progress)?);
    }
    bar.finish_and_clear();
    match args.format {
        Format::Json => writeln!(out, "{}", serde_json::to_string_pretty(&cases)?)?,
        Format::Table => crate::table::write_table(&cases, out)?,
    }
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each row keeps the median of its rounds: decisions/s, and the ratio
    /// each round had to its own baseline.
    #[test]
    fn rounds_keep_each_rows_medians() {
        let mut round = 0;
        let group = || {
            round += 1;
            let base = Case::new("store", "base", [10.0, 30.0, 20.0][round - 1]);
            let mut ours = Case::new("store", "ours", [15.0, 33.0, 10.0][round - 1]);
            ours.ratio = Some(ours.per_second / base.per_second);
            ours.baseline = Some("base".to_owned());
            Ok(vec![base, ours])
        };
        let cases = rounds(3, group).unwrap();
        assert_eq!(cases.len(), 2);
        assert_eq!(
            (cases[0].name.as_str(), cases[0].per_second, cases[0].ratio),
            ("base", 20.0, None)
        );
        assert_eq!((cases[1].per_second, cases[1].ratio), (15.0, Some(1.1)));
    }
}
