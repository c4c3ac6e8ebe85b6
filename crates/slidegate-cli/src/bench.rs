//! `slidegate bench`: throughput measured in this process, each case beside
//! its baseline in the same run: every algorithm's decision against
//! governor's direct limiter, the keyed in-memory store against governor's
//! keyed limiter, the service (HTTP and gRPC) over loopback, and, given
//! `--redis`, the Redis scripts against plain `INCR` (`crate::bench_redis`)
//! and the hybrid mode against the scripts (`crate::bench_hybrid`).

use anyhow::{Context, Result};
use clap::ValueEnum;
use governor::{Quota, RateLimiter};
use serde::Serialize;
use slidegate_core::duration::parse_positive_duration;
use slidegate_core::{Algorithm, Clock, LimitState, MonotonicClock, Policy, State, Weighting};
use slidegate_memory::{Budget, KeyedLimiter};
use std::hint::black_box;
use std::io::Write;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

/// Flags of `slidegate bench`.
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

/// One measured case.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Case {
    /// `algorithms`, `store`, `service`, `redis` or `hybrid`.
    pub(crate) group: &'static str,
    /// What was measured.
    pub(crate) name: String,
    /// Decisions per second.
    pub(crate) per_second: f64,
    /// The case of the same run this one compares with.
    pub(crate) baseline: Option<String>,
    /// `per_second / baseline's per_second`.
    pub(crate) ratio: Option<f64>,
    /// Median latency in microseconds (service and Redis cases).
    pub(crate) p50_us: Option<f64>,
    /// 99th percentile latency in microseconds (service and Redis cases).
    pub(crate) p99_us: Option<f64>,
    /// Requests in flight (service and Redis cases).
    pub(crate) concurrency: Option<usize>,
    /// Redis commands the server processed per 1000 decisions (hybrid
    /// cases).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) commands_per_1000: Option<f64>,
    /// The most admitted in any window over the limit (the hybrid
    /// over-admission case).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) admitted_over_limit: Option<f64>,
}

impl Case {
    pub(crate) fn new(group: &'static str, name: impl Into<String>, per_second: f64) -> Case {
        Case {
            group,
            name: name.into(),
            per_second,
            baseline: None,
            ratio: None,
            p50_us: None,
            p99_us: None,
            concurrency: None,
            commands_per_1000: None,
            admitted_over_limit: None,
        }
    }
}

/// Runs `op` in batches until `time` has passed; operations per second.
fn throughput(time: Duration, mut op: impl FnMut(u64)) -> f64 {
    const BATCH: u64 = 1024;
    let start = Instant::now();
    let mut done = 0u64;
    loop {
        for i in 0..BATCH {
            op(done + i);
        }
        done += BATCH;
        let elapsed = start.elapsed();
        if elapsed >= time {
            return done as f64 / elapsed.as_secs_f64();
        }
    }
}

/// A spread of keys: a fixed, cheap permutation of `0..keys`.
pub(crate) fn key(i: u64, keys: u64) -> u64 {
    i.wrapping_mul(0x9E37_79B9_7F4A_7C15) % keys.max(1)
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

/// Every algorithm's decision on one key, reading the monotonic clock as in
/// production, against governor's direct limiter with its own clock.
fn bench_algorithms(time: Duration, progress: &dyn Fn(&str)) -> Result<Vec<Case>> {
    // A limit no run reaches, so that every decision admits (checked: a row
    // that refused would measure refusals); sliding_log keeps every
    // admitted request, so its window is 1 ms under a limit of 10⁶ (no
    // thread checks 10⁹ times a second), each check dropping what left the
    // window, as a log at its steady state does; gcra spaces admissions by
    // its interval, so its interval is 1 ns.
    let limit = 1_000_000_000;
    let quota = Quota::per_minute(NonZeroU32::new(u32::MAX).context("a non-zero quota")?);
    progress("governor direct check");
    let governor = RateLimiter::direct(quota);
    let base = throughput(time, |_| {
        black_box(governor.check().is_ok());
    });
    let baseline = "governor direct check".to_owned();
    let mut cases = vec![Case::new("algorithms", baseline.clone(), base)];
    let clock = MonotonicClock::new();
    for (name, algorithm) in algorithms() {
        progress(&name);
        let (limit, window, label) = match algorithm {
            Algorithm::SlidingLog => (
                1_000_000,
                Duration::from_millis(1),
                format!("{name} check (a 1 ms window, every check admitted)"),
            ),
            // An emission interval of 1 ns, shorter than any check.
            Algorithm::Gcra { .. } => (
                60_000_000_000,
                Duration::from_secs(60),
                format!("{name} check (a 1 ns interval, every check admitted)"),
            ),
            _ => (limit, Duration::from_secs(60), format!("{name} check")),
        };
        let policy = Policy::new(limit, window, algorithm)?;
        let mut state = State::new(&policy);
        let mut refused = 0u64;
        let per_second = throughput(time, |_| {
            refused += u64::from(!black_box(state.check(&policy, clock.now(), 1).allowed()));
        });
        anyhow::ensure!(
            refused == 0,
            "{label}: {refused} checks refused, so the row would not measure admissions"
        );
        let mut case = Case::new("algorithms", label, per_second);
        case.ratio = Some(per_second / base);
        case.baseline = Some(baseline.clone());
        cases.push(case);
    }
    Ok(cases)
}

/// The keyed store on one hot key and over `keys` keys, against governor's
/// keyed limiter on a `DashMap`, one thread each.
fn bench_store(time: Duration, keys: u64, progress: &dyn Fn(&str)) -> Result<Vec<Case>> {
    let quota = Quota::per_minute(NonZeroU32::new(1_000).context("a non-zero quota")?);
    let algorithm = Algorithm::SlidingWindow {
        buckets: 8,
        weighting: Weighting::Conservative,
    };
    let policy = Policy::new(1_000, Duration::from_secs(60), algorithm)?;
    let slots = usize::try_from(keys.saturating_mul(2)).unwrap_or(usize::MAX);
    let mut cases = Vec::new();
    for (label, spread) in [("one hot key", 1), ("many keys", keys)] {
        let label = if spread == 1 {
            label.to_owned()
        } else {
            format!("{spread} keys")
        };
        progress(&format!("governor keyed, {label}"));
        let governor = RateLimiter::dashmap(quota);
        let base = throughput(time, |i| {
            black_box(governor.check_key(&key(i, spread)).is_ok());
        });
        let baseline = format!("governor keyed check, {label}");
        cases.push(Case::new("store", baseline.clone(), base));
        progress(&format!("slidegate store, {label}"));
        let ours: KeyedLimiter<u64, MonotonicClock> =
            KeyedLimiter::new(policy, MonotonicClock::new(), Budget::keys(slots));
        let per_second = throughput(time, |i| {
            black_box(ours.check(&key(i, spread), 1).is_ok_and(|d| d.allowed()));
        });
        let mut case = Case::new("store", format!("slidegate KeyedLimiter check, {label}"), per_second);
        case.ratio = Some(per_second / base);
        case.baseline = Some(baseline);
        cases.push(case);
    }
    Ok(cases)
}

pub(crate) fn percentile(sorted: &[Duration], p: f64) -> Option<f64> {
    let last = sorted.len().checked_sub(1)?;
    let i = ((sorted.len() as f64 * p) as usize).min(last);
    Some(sorted[i].as_secs_f64() * 1e6)
}

/// The service started in this process on loopback, driven by `concurrency`
/// clients in the same process: HTTP/1.1 keep-alive `POST /v1/check` and
/// gRPC `ShouldRateLimit`, each on one hot key.
fn bench_service(time: Duration, concurrency: usize, progress: &dyn Fn(&str)) -> Result<Vec<Case>> {
    use slidegate_server::server::{self, Options};
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
        let running = server::start(options, MonotonicClock::new()).await?;
        progress("service HTTP /v1/check");
        let (Some(http), Some(grpc)) = (running.http_addr(), running.grpc_addr()) else {
            anyhow::bail!("the service listens on TCP");
        };
        let http = crate::bench_clients::http(http, time, concurrency).await?;
        progress("service gRPC ShouldRateLimit");
        let grpc = crate::bench_clients::grpc(grpc, time, concurrency).await?;
        running.shutdown().await;
        let _ = std::fs::remove_dir_all(&dir);
        let case = |name: &str, (count, mut latencies): (u64, Vec<Duration>)| {
            latencies.sort_unstable();
            let mut case = Case::new("service", name, count as f64 / time.as_secs_f64());
            case.p50_us = percentile(&latencies, 0.50);
            case.p99_us = percentile(&latencies, 0.99);
            case.concurrency = Some(concurrency);
            case
        };
        Ok(vec![
            case(&format!("HTTP POST /v1/check, one hot key, {concurrency} clients in this process"), http),
            case(&format!("gRPC ShouldRateLimit, one hot key, {concurrency} calls in flight in this process"), grpc),
        ])
    })
}

fn write_table(cases: &[Case], out: &mut dyn Write) -> Result<()> {
    let width = cases.iter().map(|c| c.name.chars().count()).max().unwrap_or(4).max(4);
    writeln!(
        out,
        "{:<10}  {:<width$}  {:>14}  {:>8}  {:>10}  {:>10}",
        "group", "case", "decisions/s", "ratio", "p50 µs", "p99 µs"
    )?;
    for c in cases {
        let opt = |v: Option<f64>, digits: usize| v.map_or_else(|| "—".to_owned(), |v| format!("{v:.digits$}"));
        writeln!(
            out,
            "{:<10}  {:<width$}  {:>14.0}  {:>8}  {:>10}  {:>10}",
            c.group,
            c.name,
            c.per_second,
            opt(c.ratio, 2),
            opt(c.p50_us, 1),
            opt(c.p99_us, 1)
        )?;
    }
    writeln!(
        out,
        "ratio: decisions/s of the case over its baseline in the same run (the line above it; \
         in the redis group, the INCR line of the same concurrency)"
    )?;
    for c in cases {
        if let Some(k) = c.commands_per_1000 {
            writeln!(out, "{}: {k:.2} Redis commands per 1000 decisions", c.name)?;
        }
        if let Some(r) = c.admitted_over_limit {
            writeln!(out, "{}: {r:.3} × the limit", c.name)?;
        }
    }
    write_redis_matrix(cases, out)
}

/// The `redis` group again, one line per case and one column per
/// concurrency: decisions/s and, for the scripts, the ratio to `INCR` at
/// that concurrency. Nothing when the run has no `redis` case.
fn write_redis_matrix(cases: &[Case], out: &mut dyn Write) -> Result<()> {
    let redis: Vec<(&str, usize, &Case)> = cases
        .iter()
        .filter(|c| c.group == "redis")
        .filter_map(|c| {
            let concurrency = c.concurrency?;
            let label = [" on their own connections", ""]
                .iter()
                .find_map(|own| c.name.strip_suffix(&format!(", {concurrency} in flight{own}")))
                .unwrap_or(&c.name);
            Some((label, concurrency, c))
        })
        .collect();
    if redis.is_empty() {
        return Ok(());
    }
    let mut labels: Vec<&str> = Vec::new();
    let mut concurrencies: Vec<usize> = Vec::new();
    for &(label, concurrency, _) in &redis {
        if !labels.contains(&label) {
            labels.push(label);
        }
        if !concurrencies.contains(&concurrency) {
            concurrencies.push(concurrency);
        }
    }
    let title = "redis: decisions/s (ratio to INCR) by calls in flight";
    let width = labels
        .iter()
        .map(|l| l.chars().count())
        .max()
        .unwrap_or(0)
        .max(title.chars().count());
    writeln!(out)?;
    write!(out, "{title:<width$}")?;
    for c in &concurrencies {
        write!(out, "  {:>17}", format!("{c} in flight"))?;
    }
    writeln!(out)?;
    for label in labels {
        write!(out, "{label:<width$}")?;
        for &c in &concurrencies {
            let cell = redis.iter().find(|&&(l, k, _)| l == label && k == c).map_or_else(
                || "—".to_owned(),
                |(_, _, case)| match case.ratio {
                    Some(ratio) => format!("{:.0} ({ratio:.2})", case.per_second),
                    None => format!("{:.0}", case.per_second),
                },
            );
            write!(out, "  {cell:>17}")?;
        }
        writeln!(out)?;
    }
    Ok(())
}

/// Runs the chosen groups and writes the summary.
pub(crate) fn run(args: &Args, out: &mut dyn Write) -> Result<()> {
    let chosen = |group: &str| args.only.is_empty() || args.only.iter().any(|g| g == group);
    anyhow::ensure!(args.keys > 0, "--keys 0: must be at least 1");
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
        ("algorithms", 7),
        ("store", 4),
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
        cases.extend(bench_algorithms(args.time, &progress)?);
    }
    if chosen("store") {
        cases.extend(bench_store(args.time, args.keys, &progress)?);
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
        Format::Table => write_table(&cases, out)?,
    }
    out.flush()?;
    Ok(())
}
