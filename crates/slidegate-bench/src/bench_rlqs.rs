//! `slidegate-bench rlqs`: the load of many Envoys' `rate_limit_quota`
//! filters on a `slidegate serve` already running on loopback.
//!
//! `--streams` `StreamRateLimitQuotas` streams over `--connections` HTTP/2
//! connections (round robin), each stream with `--buckets` bucket ids of
//! its own (`{route: ROUTE, tenant: s<stream>-b<n>}`) under one domain.
//! Each stream first sends its first report (every bucket new,
//! `time_elapsed` 0) and waits for its answer; then `--rounds` rounds in
//! which every stream sends its report of all its buckets (`time_elapsed`
//! 5 s, as Envoy's report timer says, with some requests allowed and
//! denied) and waits for its answer, each stream as soon as its last answer
//! came (not paced to 5 s). Every answer must hold one action a bucket.
//! Given `--server-pid`, the server's CPU time (utime + stime of
//! `/proc/PID/stat`) over each phase, per bucket report.
//!
//! Only loopback addresses are loaded; connecting, opening a stream and
//! each answer are bounded by `--timeout`, and the counts by the flags'
//! bounds.

use crate::case::percentile;
use crate::table::thousands;
use anyhow::{Context, Result};
use serde::Serialize;
use slidegate_core::duration::parse_positive_duration;
use slidegate_server::net::admission::DEFAULT_MAX_STREAMS;
use slidegate_server::proto::quota::rate_limit_quota_response::bucket_action::BucketAction as Action;
use slidegate_server::proto::quota::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use slidegate_server::proto::quota::rate_limit_quota_usage_reports::BucketQuotaUsage;
use slidegate_server::proto::quota::{BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports};
use slidegate_server::proto::types::rate_limit_strategy::{BlanketRule, Strategy};
use std::collections::HashMap;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tonic::transport::{Channel, Endpoint};

/// The most streams, buckets a stream and rounds a run may ask for.
const MAX_STREAMS: usize = 10_000;
/// The most buckets a stream: the server's default
/// `--rlqs-max-stream-buckets`.
const MAX_BUCKETS: usize = 10_000;
/// The most rounds.
const MAX_ROUNDS: usize = 1_000;

/// Clock ticks a second of `/proc/PID/stat`'s times (`USER_HZ`, 100 on
/// Linux whatever the kernel's own tick).
const TICKS_PER_SECOND: f64 = 100.0;

/// Flags of `slidegate-bench rlqs`.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct Args {
    /// The gRPC listener of a running `slidegate serve`, on loopback
    #[arg(long, value_name = "ADDR")]
    grpc: SocketAddr,

    /// Streams, one per Envoy and domain
    #[arg(long, value_name = "N", default_value_t = 1_000)]
    streams: usize,

    /// Bucket ids of each stream, its own
    #[arg(long, value_name = "N", default_value_t = 100)]
    buckets: usize,

    /// Rounds after the first reports, each a report from every stream
    #[arg(long, value_name = "N", default_value_t = 10)]
    rounds: usize,

    /// HTTP/2 connections the streams are spread over; no more than the
    /// server's default stream cap (100) on one connection
    #[arg(long, value_name = "N", default_value_t = 20)]
    connections: usize,

    /// The domain of the reports (the rate_limit_quota filter's `domain`)
    #[arg(long, value_name = "NAME", default_value = "rlqs_bench")]
    domain: String,

    /// The value of every bucket id's `route` key
    #[arg(long, value_name = "VALUE", default_value = "checkout")]
    route: String,

    /// The server's process id, to read its CPU time over each phase from
    /// /proc/PID/stat
    #[arg(long, value_name = "PID")]
    server_pid: Option<u32>,

    /// The bound of connecting, of opening a stream and of each answer
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_positive_duration)]
    timeout: Duration,

    /// Output format
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
}

/// `rlqs --format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Format {
    /// A line a phase, with its answers' actions below it
    Text,
    /// One JSON object: the flags' shape and each phase's figures
    Json,
}

/// What the answers said, by kind of action.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq, Eq)]
struct Actions {
    /// Token bucket assignments.
    token_bucket: u64,
    /// `ALLOW_ALL` assignments.
    allow_all: u64,
    /// `DENY_ALL` assignments.
    deny_all: u64,
    /// Assignments of another strategy.
    other: u64,
    /// Abandon actions.
    abandon: u64,
}

impl Actions {
    /// Counts the actions of `answer`.
    fn count(&mut self, answer: &RateLimitQuotaResponse) {
        for action in &answer.bucket_action {
            match &action.bucket_action {
                Some(Action::QuotaAssignmentAction(a)) => {
                    match a.rate_limit_strategy.as_ref().and_then(|s| s.strategy.as_ref()) {
                        Some(Strategy::TokenBucket(_)) => self.token_bucket += 1,
                        Some(Strategy::BlanketRule(r)) if *r == BlanketRule::AllowAll as i32 => self.allow_all += 1,
                        Some(Strategy::BlanketRule(r)) if *r == BlanketRule::DenyAll as i32 => self.deny_all += 1,
                        _ => self.other += 1,
                    }
                }
                Some(Action::AbandonAction(_)) => self.abandon += 1,
                None => self.other += 1,
            }
        }
    }

    /// Adds `other`'s counts.
    fn add(&mut self, other: Actions) {
        self.token_bucket += other.token_bucket;
        self.allow_all += other.allow_all;
        self.deny_all += other.deny_all;
        self.other += other.other;
        self.abandon += other.abandon;
    }
}

/// One phase of the run: the first reports, or the rounds.
#[derive(Debug, Serialize)]
struct Phase {
    /// Usage reports sent (gRPC messages), every one answered.
    reports: u64,
    /// Bucket reports sent: a report's `BucketQuotaUsage`s.
    bucket_reports: u64,
    /// Wall time of the phase, in seconds.
    seconds: f64,
    /// `bucket_reports / seconds`.
    bucket_reports_per_second: f64,
    /// Median time from a report sent to its answer, in milliseconds.
    p50_ms: Option<f64>,
    /// 99th percentile of the same.
    p99_ms: Option<f64>,
    /// The server's CPU time (user and system) over the phase, in seconds
    /// (with `--server-pid`).
    server_cpu_seconds: Option<f64>,
    /// `server_cpu_seconds` per bucket report, in microseconds (none when
    /// the phase was too short for the CPU time to move).
    server_cpu_us_per_bucket_report: Option<f64>,
    /// The answers' actions.
    actions: Actions,
}

/// What `rlqs` prints.
#[derive(Debug, Serialize)]
struct Summary {
    /// `--streams`.
    streams: usize,
    /// `--buckets`.
    buckets: usize,
    /// `--connections`.
    connections: usize,
    /// `--domain`.
    domain: String,
    /// Each stream's first report, every bucket new.
    first: Phase,
    /// The rounds.
    rounds: Phase,
    /// Streams that ended cleanly when their request side closed (the
    /// server's answers ended with status OK within `--timeout`).
    closed_cleanly: usize,
}

/// One open stream: where its reports go, where its answers come from,
/// and its report.
struct Stream {
    reports: mpsc::Sender<RateLimitQuotaUsageReports>,
    answers: tonic::Streaming<RateLimitQuotaResponse>,
    /// Its report of the rounds (`time_elapsed` 5 s).
    report: RateLimitQuotaUsageReports,
}

/// What a stream's task hands back: the stream, its answers' actions and
/// each answer's latency.
type Answered = (Stream, Actions, Vec<Duration>);

/// The report of stream `stream`: `buckets` bucket ids of its own,
/// `elapsed` seconds, and the counts `counts(n)` gives bucket `n`.
fn report(args: &Args, stream: usize, elapsed: i64, counts: impl Fn(u64) -> (u64, u64)) -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports {
        domain: args.domain.clone(),
        bucket_quota_usages: (0..args.buckets)
            .map(|n| {
                let (allowed, denied) = counts(n as u64);
                BucketQuotaUsage {
                    bucket_id: Some(BucketId {
                        bucket: HashMap::from([
                            ("route".to_owned(), args.route.clone()),
                            ("tenant".to_owned(), format!("s{stream}-b{n}")),
                        ]),
                    }),
                    time_elapsed: Some(pbjson_types::Duration {
                        seconds: elapsed,
                        nanos: 0,
                    }),
                    num_requests_allowed: allowed,
                    num_requests_denied: denied,
                }
            })
            .collect(),
    }
}

/// Sends `report` on `stream` and waits for its answer, within `timeout`:
/// the answer's latency, its actions counted in `actions`.
async fn exchange(
    stream: &mut Stream,
    report: RateLimitQuotaUsageReports,
    buckets: usize,
    timeout: Duration,
    actions: &mut Actions,
) -> Result<Duration> {
    let start = Instant::now();
    tokio::time::timeout(timeout, stream.reports.send(report))
        .await
        .context("a report not taken within --timeout")?
        .context("the stream's request side closed")?;
    let answer = tokio::time::timeout(timeout, stream.answers.message())
        .await
        .context("no answer within --timeout")?
        .context("the stream ended with an error")?
        .context("the stream ended without an answer")?;
    let latency = start.elapsed();
    anyhow::ensure!(
        answer.bucket_action.len() == buckets,
        "an answer held {} actions for a report of {buckets} buckets",
        answer.bucket_action.len()
    );
    actions.count(&answer);
    Ok(latency)
}

/// Opens stream `index` on `channel` and exchanges its first report.
async fn open(args: &Args, channel: Channel, index: usize) -> Result<Answered> {
    let (reports, requests) = mpsc::channel(1);
    // Queued before the call, so that the call's first message is there
    // when the stream opens.
    let first = report(args, index, 0, |_| (1, 0));
    let mut client = RateLimitQuotaServiceClient::new(channel);
    let call = client.stream_rate_limit_quotas(tokio_stream::wrappers::ReceiverStream::new(requests));
    let answers = tokio::time::timeout(args.timeout, call)
        .await
        .context("the stream not opened within --timeout")?
        .context("opening a stream")?
        .into_inner();
    let mut stream = Stream {
        reports,
        answers,
        // Some requests allowed and some denied, varying by bucket.
        report: report(args, index, 5, |n| (50 + n % 50, n % 7)),
    };
    let mut actions = Actions::default();
    let latency = exchange(&mut stream, first, args.buckets, args.timeout, &mut actions).await?;
    Ok((stream, actions, vec![latency]))
}

/// Runs `rounds` rounds of `stream`'s report.
async fn rounds(mut stream: Stream, rounds: usize, buckets: usize, timeout: Duration) -> Result<Answered> {
    let mut actions = Actions::default();
    let mut latencies = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let report = stream.report.clone();
        latencies.push(exchange(&mut stream, report, buckets, timeout, &mut actions).await?);
    }
    Ok((stream, actions, latencies))
}

/// The streams back from their tasks, with their actions and latencies
/// together.
async fn gather(
    tasks: Vec<tokio::task::JoinHandle<Result<Answered>>>,
) -> Result<(Vec<Stream>, Actions, Vec<Duration>)> {
    let (mut streams, mut actions, mut latencies) = (Vec::with_capacity(tasks.len()), Actions::default(), Vec::new());
    for task in tasks {
        let (stream, a, l) = task.await.context("a stream's task")??;
        streams.push(stream);
        actions.add(a);
        latencies.extend(l);
    }
    Ok((streams, actions, latencies))
}

/// The CPU time so far (user and system) of process `pid`, from
/// `/proc/PID/stat`.
fn process_cpu(pid: u32) -> Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("--server-pid {pid}: cannot read /proc/{pid}/stat"))?;
    // Fields 14 and 15 (utime, stime), counted after the name in parentheses.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let field = |i: usize| -> Result<u64> {
        fields
            .get(i)
            .and_then(|f| f.parse().ok())
            .with_context(|| format!("/proc/{pid}/stat: no field {}", i + 3))
    };
    let ticks = field(11)? + field(12)?;
    Ok(Duration::from_secs_f64(ticks as f64 / TICKS_PER_SECOND))
}

/// A phase's figures from its counts, times and CPU readings.
fn phase(
    reports: u64,
    buckets: usize,
    wall: Duration,
    mut latencies: Vec<Duration>,
    cpu: Option<(Duration, Duration)>,
    actions: Actions,
) -> Phase {
    latencies.sort_unstable();
    let bucket_reports = reports * buckets as u64;
    let cpu = cpu.map(|(before, after)| after.saturating_sub(before).as_secs_f64());
    Phase {
        reports,
        bucket_reports,
        seconds: wall.as_secs_f64(),
        bucket_reports_per_second: bucket_reports as f64 / wall.as_secs_f64().max(1e-9),
        p50_ms: percentile(&latencies, 0.50).map(|us| us / 1e3),
        p99_ms: percentile(&latencies, 0.99).map(|us| us / 1e3),
        server_cpu_seconds: cpu,
        // None when the reading did not move: too short to measure.
        server_cpu_us_per_bucket_report: cpu
            .filter(|s| bucket_reports > 0 && *s > 0.0)
            .map(|s| s * 1e6 / bucket_reports as f64),
        actions,
    }
}

/// Connects, opens the streams, and runs both phases.
async fn load(args: &Args) -> Result<Summary> {
    let mut channels = Vec::with_capacity(args.connections);
    for _ in 0..args.connections {
        let endpoint = Endpoint::from_shared(format!("http://{}", args.grpc))
            .context("a gRPC address")?
            .connect_timeout(args.timeout);
        let channel = tokio::time::timeout(args.timeout, endpoint.connect())
            .await
            .context("not connected within --timeout")?
            .with_context(|| format!("connecting to {}", args.grpc))?;
        channels.push(channel);
    }
    let cpu = || args.server_pid.map(process_cpu).transpose();

    let before = cpu()?;
    let start = Instant::now();
    let shared = Arc::new(args.clone());
    let tasks = (0..args.streams)
        .map(|s| {
            let (args, channel) = (Arc::clone(&shared), channels[s % channels.len()].clone());
            tokio::spawn(async move { open(&args, channel, s).await })
        })
        .collect();
    let (streams, actions, latencies) = gather(tasks).await?;
    let first = phase(
        args.streams as u64,
        args.buckets,
        start.elapsed(),
        latencies,
        before.zip(cpu()?),
        actions,
    );

    let before = cpu()?;
    let start = Instant::now();
    let (n, buckets, timeout) = (args.rounds, args.buckets, args.timeout);
    let tasks = streams
        .into_iter()
        .map(|stream| tokio::spawn(rounds(stream, n, buckets, timeout)))
        .collect();
    let (streams, actions, latencies) = gather(tasks).await?;
    let rounds = phase(
        (args.streams * args.rounds) as u64,
        args.buckets,
        start.elapsed(),
        latencies,
        before.zip(cpu()?),
        actions,
    );
    let closed_cleanly = close(streams, args.timeout).await;
    Ok(Summary {
        streams: args.streams,
        buckets: args.buckets,
        connections: args.connections,
        domain: args.domain.clone(),
        first,
        rounds,
        closed_cleanly,
    })
}

/// Closes every stream's request side, as an Envoy going away does, and
/// waits for each one's answers to end: how many ended with status OK
/// within `timeout`.
async fn close(streams: Vec<Stream>, timeout: Duration) -> usize {
    let mut answers = Vec::with_capacity(streams.len());
    for stream in streams {
        drop(stream.reports);
        answers.push(stream.answers);
    }
    let mut clean = 0;
    for mut answers in answers {
        if let Ok(Ok(None)) = tokio::time::timeout(timeout, answers.message()).await {
            clean += 1;
        }
    }
    clean
}

/// Checks the flags, runs the load, and writes the summary.
pub(crate) fn run(args: &Args, out: &mut dyn Write) -> Result<()> {
    anyhow::ensure!(
        args.grpc.ip().is_loopback(),
        "--grpc {}: not loopback; benchmarks only talk to loopback servers (127.0.0.1 or ::1)",
        args.grpc
    );
    for (flag, value, max) in [
        ("--streams", args.streams, MAX_STREAMS),
        ("--buckets", args.buckets, MAX_BUCKETS),
        ("--rounds", args.rounds, MAX_ROUNDS),
        ("--connections", args.connections, args.streams.max(1)),
    ] {
        anyhow::ensure!((1..=max).contains(&value), "{flag} {value}: must be from 1 to {max}");
    }
    let per_connection = args.streams.div_ceil(args.connections);
    anyhow::ensure!(
        per_connection <= DEFAULT_MAX_STREAMS as usize,
        "--streams {} over --connections {}: {per_connection} streams on a connection, more than the server's default cap of {DEFAULT_MAX_STREAMS} (`--max-concurrent-streams`); give more connections",
        args.streams,
        args.connections
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let summary = runtime.block_on(load(args))?;
    match args.format {
        Format::Json => writeln!(out, "{}", serde_json::to_string_pretty(&summary)?)?,
        Format::Text => write_text(&summary, out)?,
    }
    out.flush()?;
    Ok(())
}

/// The summary as lines of text: one a phase, then the answers' actions.
fn write_text(summary: &Summary, out: &mut dyn Write) -> Result<()> {
    writeln!(
        out,
        "rlqs: {} streams of {} buckets over {} connections, domain {}",
        summary.streams, summary.buckets, summary.connections, summary.domain
    )?;
    for (name, phase) in [("first reports", &summary.first), ("rounds", &summary.rounds)] {
        let ms = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.2} ms"));
        write!(
            out,
            "{name}: {} bucket reports in {} reports, {:.3} s: {} bucket reports/s, a report answered in p50 {} p99 {}",
            thousands(phase.bucket_reports as f64),
            thousands(phase.reports as f64),
            phase.seconds,
            thousands(phase.bucket_reports_per_second),
            ms(phase.p50_ms),
            ms(phase.p99_ms),
        )?;
        if let (Some(cpu), Some(per)) = (phase.server_cpu_seconds, phase.server_cpu_us_per_bucket_report) {
            write!(out, "; server CPU {cpu:.2} s, {per:.3} µs per bucket report")?;
        }
        writeln!(out)?;
        let a = phase.actions;
        writeln!(
            out,
            "  actions: {} token buckets, {} ALLOW_ALL, {} DENY_ALL, {} abandon, {} other",
            thousands(a.token_bucket as f64),
            thousands(a.allow_all as f64),
            thousands(a.deny_all as f64),
            thousands(a.abandon as f64),
            thousands(a.other as f64),
        )?;
    }
    writeln!(
        out,
        "streams closed cleanly: {} of {}",
        thousands(summary.closed_cleanly as f64),
        thousands(summary.streams as f64)
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use slidegate_server::proto::quota::rate_limit_quota_response::BucketAction;
    use slidegate_server::proto::quota::rate_limit_quota_response::bucket_action::{
        AbandonAction, QuotaAssignmentAction,
    };
    use slidegate_server::proto::types::{RateLimitStrategy, TokenBucket};

    /// Each stream's bucket ids are its own, the first report says 0 s and
    /// the rounds' 5 s.
    #[test]
    fn each_stream_reports_its_own_buckets() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: Args,
        }
        let args = Cli::parse_from(["rlqs", "--grpc", "127.0.0.1:1", "--buckets", "3"]).args;
        let first = report(&args, 7, 0, |_| (1, 0));
        let later = report(&args, 8, 5, |n| (n, 1));
        assert_eq!(first.domain, "rlqs_bench");
        assert_eq!(first.bucket_quota_usages.len(), 3);
        let tenants = |r: &RateLimitQuotaUsageReports| -> Vec<String> {
            r.bucket_quota_usages
                .iter()
                .map(|u| u.bucket_id.as_ref().unwrap().bucket["tenant"].clone())
                .collect()
        };
        assert_eq!(tenants(&first), ["s7-b0", "s7-b1", "s7-b2"]);
        assert_eq!(tenants(&later), ["s8-b0", "s8-b1", "s8-b2"]);
        assert!(first.bucket_quota_usages.iter().all(|u| {
            u.bucket_id.as_ref().unwrap().bucket["route"] == "checkout" && u.time_elapsed.unwrap().seconds == 0
        }));
        assert_eq!(later.bucket_quota_usages[2].time_elapsed.unwrap().seconds, 5);
        assert_eq!(later.bucket_quota_usages[2].num_requests_allowed, 2);
    }

    /// Actions are counted by kind.
    #[test]
    fn actions_are_counted_by_kind() {
        let assign = |strategy| BucketAction {
            bucket_id: None,
            bucket_action: Some(Action::QuotaAssignmentAction(QuotaAssignmentAction {
                assignment_time_to_live: None,
                rate_limit_strategy: Some(RateLimitStrategy {
                    strategy: Some(strategy),
                }),
            })),
        };
        let answer = RateLimitQuotaResponse {
            bucket_action: vec![
                assign(Strategy::TokenBucket(TokenBucket::default())),
                assign(Strategy::TokenBucket(TokenBucket::default())),
                assign(Strategy::BlanketRule(BlanketRule::DenyAll as i32)),
                assign(Strategy::BlanketRule(BlanketRule::AllowAll as i32)),
                BucketAction {
                    bucket_id: None,
                    bucket_action: Some(Action::AbandonAction(AbandonAction {})),
                },
            ],
        };
        let mut actions = Actions::default();
        actions.count(&answer);
        assert_eq!(
            actions,
            Actions {
                token_bucket: 2,
                allow_all: 1,
                deny_all: 1,
                other: 0,
                abandon: 1
            }
        );
    }
}
