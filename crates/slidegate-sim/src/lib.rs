//! Traffic models, the exact oracle and accuracy metrics for slidegate's
//! algorithms: "how wrong is a two-bucket estimate on this traffic?"
//!
//! A run takes a [`Policy`] and a request stream (from a [`Traffic`] model,
//! see [`generate`]) and gives every client its own limit state and its own
//! exact oracle ([`ExactWindow`]: the true count of the half-open window
//! `(t − W, t]`, with `W = policy.effective_window_ns()`). It looks at the
//! algorithm in two ways, and reports both in one [`Row`].
//!
//! # The measurement view (Cloudflare's analysis)
//!
//! Every request is counted, admitted or not (`LimitState::record`), in the
//! algorithm's state and in the oracle alike, so both see the same traffic.
//! Before request `i` at `t` is counted, the algorithm's estimate of the
//! window is compared with the true count:
//!
//! - a *wrong decision* is one where `estimate + cost > limit` and
//!   `truth + cost > limit` disagree: `wrongly_allowed` when only the truth
//!   would refuse, `wrongly_denied` when only the estimate would;
//! - `mean_abs_error` is the mean of `|estimate − truth| / truth` over the
//!   requests whose true count is above zero.
//!
//! This isolates the estimate's error from its feedback on the traffic: it
//! is the number Cloudflare published (0.003% wrong decisions, 6% mean
//! difference, two buckets). `gcra` keeps no window count, so its three
//! measurement figures are `None`.
//!
//! # The admission view
//!
//! A fresh state per client decides every request with `LimitState::check`;
//! refused requests are not counted, as in production. `admitted` counts the
//! admitted requests, and `max_window_ratio` is the largest number of units
//! one client got admitted in any window of length `W`, divided by the
//! limit. Above 1.0, the algorithm let a client exceed its limit in some
//! window: the interpolated sliding window reaches about 2.0 under
//! [`Traffic::Adversary`], the conservative one never exceeds 1.0.
//!
//! # Example
//!
//! ```
//! use slidegate_core::{Algorithm, Policy, Weighting};
//! use slidegate_sim::{Scenario, Traffic, run};
//! use std::time::Duration;
//!
//! let sliding = |weighting| Algorithm::SlidingWindow { buckets: 8, weighting };
//! let scenario = Scenario { traffic: Traffic::Adversary, duration_ns: 600_000_000_000, clients: 1, seed: 1 };
//! let window = Duration::from_secs(60);
//!
//! let interpolated = Policy::new(100, window, sliding(Weighting::Interpolated)).unwrap();
//! assert!(run(&interpolated, &scenario).unwrap().max_window_ratio > 1.9);
//!
//! let conservative = Policy::new(100, window, sliding(Weighting::Conservative)).unwrap();
//! assert!(run(&conservative, &scenario).unwrap().max_window_ratio <= 1.0);
//! ```
//!
//! Everything is deterministic: the same seed gives the same rows, and no
//! clock is read.

#![forbid(unsafe_code)]
// A log's errors (`TraceError`) carry the file, the line and its text for
// the message; they are made once per file, never on a hot path, so their
// size does not matter.
#![allow(clippy::result_large_err)]

mod errors;
mod line;
pub mod logs;
mod metrics;
mod oracle;
mod series;
mod stream;
mod trace;
mod traffic;

pub use errors::{BadLine, LineError, OnError, REPORTED_BAD_LINES, TraceError};
pub use line::{
    CsvLine, LogLine, is_csv_header, parse_clf_line, parse_clf_time, parse_combined_line, parse_csv_line,
    parse_csv_time,
};
pub use logs::{
    ByteCount, Detection, Field, FormatChoice, FormatError, LogFormat, LogInput, LogOptions, LogReader, Record,
    TimeFormat, open_log, open_log_file,
};
pub use metrics::Metrics;
pub use oracle::{ExactWindow, max_window_sum};
pub use series::{ClientSeries, Point, busiest_clients, count_series};
pub use stream::{
    Evaluation, REORDER_HORIZON_NS, REORDER_MAX_PENDING, Reorder, ReorderOptions, evaluate, evaluate_stream,
};
pub use trace::{Trace, TraceOptions, TraceSummary, read_trace, stream_trace, trace_requests_of};
pub use traffic::{
    FEW_CLIENTS, MANY_SOURCES_SCALE, MAX_CLIENTS, MAX_REQUESTS, PARETO_ALPHA, Request, Traffic, generate,
};

use serde::Serialize;
use slidegate_core::{Algorithm, Policy};
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};

/// What to simulate besides the policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scenario {
    /// The traffic model.
    pub traffic: Traffic,
    /// Length of the simulated time, in nanoseconds.
    pub duration_ns: u64,
    /// Number of clients for [`Traffic::Clients`]; ignored by the others.
    pub clients: u32,
    /// The seed of the traffic's random numbers.
    pub seed: u64,
}

/// One line of results: one policy on one traffic model, in both views (see
/// the crate docs). Serialises to JSON with the field names below.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    /// The algorithm's name, as in `Algorithm::NAMES`.
    pub algorithm: &'static str,
    /// `sliding_window`: the number of buckets `n`.
    pub buckets: Option<u32>,
    /// `sliding_window`: `interpolated` or `conservative`.
    pub weighting: Option<String>,
    /// `gcra`: the burst.
    pub burst: Option<u64>,
    /// `exponential_histogram`: ε.
    pub epsilon: Option<f64>,
    /// The traffic model's name.
    pub traffic: String,
    /// The policy's limit.
    pub limit: u64,
    /// The window asked for, in nanoseconds.
    pub window_ns: u64,
    /// The window the algorithm enforces, over which the oracle counts
    /// (`Policy::effective_window_ns`).
    pub effective_window_ns: u64,
    /// Distinct clients in the traffic.
    pub clients: u64,
    /// Requests sent.
    pub requests: u64,
    /// Admission view: requests admitted.
    pub admitted: u64,
    /// Measurement view: admitted by the estimate, refused by the truth.
    pub wrongly_allowed: Option<u64>,
    /// Measurement view: refused by the estimate, admitted by the truth.
    pub wrongly_denied: Option<u64>,
    /// Admission view: the most units one client got in any window.
    pub max_window_admitted: u64,
    /// Admission view: `max_window_admitted / limit`.
    pub max_window_ratio: f64,
    /// Measurement view: mean relative error of the estimate.
    pub mean_abs_error: Option<f64>,
}

impl Row {
    /// The row of `policy` on the traffic called `traffic`, with `metrics`
    /// from [`evaluate`].
    pub fn new(policy: &Policy, traffic: impl Into<String>, metrics: Metrics) -> Row {
        let algorithm = policy.algorithm();
        let (buckets, weighting) = match algorithm {
            Algorithm::SlidingWindow { buckets, weighting } => (Some(buckets), Some(weighting.name().to_string())),
            _ => (None, None),
        };
        Row {
            algorithm: algorithm.name(),
            buckets,
            weighting,
            burst: match algorithm {
                Algorithm::Gcra { burst } => Some(burst),
                _ => None,
            },
            epsilon: match algorithm {
                Algorithm::ExponentialHistogram { epsilon } => Some(epsilon),
                _ => None,
            },
            traffic: traffic.into(),
            limit: policy.limit(),
            window_ns: policy.window_ns(),
            effective_window_ns: policy.effective_window_ns(),
            clients: metrics.clients,
            requests: metrics.requests,
            admitted: metrics.admitted,
            wrongly_allowed: metrics.wrongly_allowed,
            wrongly_denied: metrics.wrongly_denied,
            max_window_admitted: metrics.max_window_admitted,
            max_window_ratio: metrics.max_window_ratio,
            mean_abs_error: metrics.mean_abs_error,
        }
    }
}

impl Scenario {
    /// The scenario's request stream for `policy` (see [`generate`]).
    ///
    /// # Errors
    ///
    /// The errors of [`generate`].
    pub fn requests(&self, policy: &Policy) -> Result<Vec<Request>, SimError> {
        generate(self.traffic, policy, self.duration_ns, self.clients, self.seed)
    }
}

/// Generates the scenario's traffic for `policy` and evaluates the policy on
/// it.
///
/// # Errors
///
/// The errors of [`generate`].
pub fn run(policy: &Policy, scenario: &Scenario) -> Result<Row, SimError> {
    let requests = scenario.requests(policy)?;
    Ok(Row::new(policy, scenario.traffic.name(), evaluate(policy, &requests)))
}

/// Runs every policy on every scenario: the rows come scenario by scenario,
/// each with one row per policy in the order given, exactly as [`run`] would
/// give them.
///
/// Traffic is generated once per scenario and shared by the policies it
/// does not depend on (only [`Traffic::Adversary`] depends on the algorithm
/// and bucket width), and the policies are evaluated on up to `threads`
/// threads (at least one).
///
/// # Errors
///
/// The first error of [`generate`], before any policy is evaluated on that
/// scenario.
pub fn run_many(policies: &[Policy], scenarios: &[Scenario], threads: usize) -> Result<Vec<Row>, SimError> {
    let mut rows = Vec::with_capacity(policies.len() * scenarios.len());
    for scenario in scenarios {
        // One stream per distinct generation key, and each policy's stream.
        let mut streams: Vec<(traffic::Key, Vec<Request>)> = Vec::new();
        let mut stream_of = Vec::with_capacity(policies.len());
        for policy in policies {
            let key = traffic::key(scenario.traffic, policy);
            let i = match streams.iter().position(|(k, _)| *k == key) {
                Some(i) => i,
                None => {
                    let requests = scenario.requests(policy)?;
                    streams.push((key, requests));
                    streams.len() - 1
                }
            };
            stream_of.push(i);
        }
        let metrics = parallel_map(policies.len(), threads, |p| {
            evaluate(&policies[p], &streams[stream_of[p]].1)
        });
        rows.extend(
            policies
                .iter()
                .zip(metrics)
                .map(|(policy, m)| Row::new(policy, scenario.traffic.name(), m)),
        );
    }
    Ok(rows)
}

/// Evaluates every policy on one request stream, such as a [`Trace`]'s:
/// one row per policy, in the order given, each named `traffic`, exactly as
/// `Row::new(policy, traffic, evaluate(policy, requests))` would give it.
///
/// The policies are evaluated on up to `threads` threads (at least one);
/// `done` is called once each policy is evaluated, from the thread that
/// evaluated it (for a progress bar: pass `&|| {}` for none).
pub fn run_requests(
    policies: &[Policy],
    traffic: &str,
    requests: &[Request],
    threads: usize,
    done: &(dyn Fn() + Sync),
) -> Vec<Row> {
    let metrics = parallel_map(policies.len(), threads, |p| {
        let m = evaluate(&policies[p], requests);
        done();
        m
    });
    policies
        .iter()
        .zip(metrics)
        .map(|(policy, m)| Row::new(policy, traffic, m))
        .collect()
}

/// `(0..n).map(f)` on up to `threads` scoped threads, in order.
fn parallel_map<T: Send>(n: usize, threads: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let threads = threads.clamp(1, n.max(1));
    if threads == 1 {
        return (0..n).map(f).collect();
    }
    let next = AtomicUsize::new(0);
    let mut done: Vec<(usize, T)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut out = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= n {
                            return out;
                        }
                        out.push((i, f(i)));
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            // A worker only panics if `f` does; pass the panic on.
            .flat_map(|w| w.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    });
    done.sort_unstable_by_key(|&(i, _)| i);
    done.into_iter().map(|(_, t)| t).collect()
}

/// Why a simulation could not run.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum SimError {
    /// A traffic model name that does not exist.
    UnknownTraffic {
        /// The unknown name.
        value: String,
    },
    /// The `clients` model was asked for zero clients.
    NoClients,
    /// The `clients` model was asked for more than [`MAX_CLIENTS`] clients.
    TooManyClients {
        /// The number asked for.
        clients: u32,
        /// [`MAX_CLIENTS`].
        max: u32,
    },
    /// The traffic would hold more than [`MAX_REQUESTS`] requests.
    TooManyRequests {
        /// The model.
        traffic: Traffic,
        /// About how many requests it would send.
        expected: f64,
        /// [`MAX_REQUESTS`].
        max: u64,
    },
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SimError::UnknownTraffic { value } => write!(
                f,
                "unknown traffic model `{value}`, expected one of: {}",
                Traffic::NAMES.join(", ")
            ),
            SimError::NoClients => f.write_str("invalid clients `0`: must be at least 1"),
            SimError::TooManyClients { clients, max } => {
                write!(f, "invalid clients `{clients}`: must be at most {max}")
            }
            SimError::TooManyRequests { traffic, expected, max } => {
                write!(f, "traffic model `{traffic}` would send about ")?;
                if *expected < 1e12 {
                    write!(f, "{expected:.0}")?
                } else {
                    write!(f, "{expected:.2e}")?
                }
                write!(
                    f,
                    " requests, more than the {max} a run may hold: shorten the duration or lower the limit"
                )
            }
        }
    }
}

impl std::error::Error for SimError {}

#[cfg(test)]
mod tests {
    use super::*;
    use slidegate_core::Weighting;
    use std::time::Duration;

    const TEN_MINUTES: u64 = 600_000_000_000;

    fn row(algorithm: Algorithm, traffic: Traffic) -> Row {
        let policy = Policy::new(100, Duration::from_secs(60), algorithm).unwrap();
        run(
            &policy,
            &Scenario {
                traffic,
                duration_ns: TEN_MINUTES,
                clients: 100,
                seed: 1,
            },
        )
        .unwrap()
    }

    fn sliding(buckets: u32, weighting: Weighting) -> Algorithm {
        Algorithm::SlidingWindow { buckets, weighting }
    }

    #[test]
    fn adversary_doubles_the_interpolated_window_only() {
        for buckets in [2, 3, 8, 11] {
            let r = row(sliding(buckets, Weighting::Interpolated), Traffic::Adversary);
            assert!(r.max_window_ratio > 1.9, "n = {buckets}: {r:?}");
            assert!(r.max_window_admitted <= 199, "n = {buckets}: {r:?}");
            let r = row(sliding(buckets, Weighting::Conservative), Traffic::Adversary);
            assert!(r.max_window_ratio <= 1.0, "n = {buckets}: {r:?}");
            assert!(r.admitted > 0);
        }
    }

    #[test]
    fn adversary_against_the_other_algorithms() {
        // Fixed window: the burst and the start of the next window.
        assert_eq!(row(Algorithm::FixedWindow, Traffic::Adversary).max_window_admitted, 200);
        assert_eq!(row(Algorithm::SlidingLog, Traffic::Adversary).max_window_admitted, 100);
        // GCRA with burst = limit: up to 2·limit − 1.
        let r = row(Algorithm::Gcra { burst: 100 }, Traffic::Adversary);
        assert!(r.max_window_admitted > 190 && r.max_window_admitted <= 199, "{r:?}");
        assert!(row(Algorithm::Gcra { burst: 1 }, Traffic::Adversary).max_window_ratio <= 1.0);
    }

    #[test]
    fn sliding_log_measures_without_error() {
        for traffic in Traffic::ALL {
            let r = row(Algorithm::SlidingLog, traffic);
            assert!(r.requests > 0, "{traffic}");
            assert_eq!(r.wrongly_allowed, Some(0), "{traffic}");
            assert_eq!(r.wrongly_denied, Some(0), "{traffic}");
            assert_eq!(r.mean_abs_error, Some(0.0), "{traffic}");
            assert!(r.max_window_ratio <= 1.0, "{traffic}");
        }
    }

    #[test]
    fn conservative_never_exceeds_the_limit() {
        for traffic in Traffic::ALL {
            for buckets in [2, 5] {
                let r = row(sliding(buckets, Weighting::Conservative), traffic);
                assert!(r.max_window_ratio <= 1.0, "{traffic}, n = {buckets}: {r:?}");
            }
        }
    }

    #[test]
    fn estimates_have_the_expected_errors() {
        // Two interpolated buckets on heavy-tailed clients: a few percent of
        // mean error and some wrong decisions, as Cloudflare and the access
        // log study found.
        let r = row(Algorithm::TWO_BUCKETS, Traffic::Clients);
        let err = r.mean_abs_error.unwrap();
        assert!(err > 0.0 && err < 0.2, "{r:?}");
        assert!(r.wrongly_allowed.unwrap() + r.wrongly_denied.unwrap() > 0, "{r:?}");
        // More buckets, smaller error.
        let fine = row(sliding(11, Weighting::Interpolated), Traffic::Clients);
        assert!(fine.mean_abs_error.unwrap() < err, "{fine:?}");
        // The histogram is within ε.
        let eh = row(Algorithm::ExponentialHistogram { epsilon: 0.01 }, Traffic::Clients);
        assert!(eh.mean_abs_error.unwrap() <= 0.01, "{eh:?}");
    }

    #[test]
    fn gcra_has_no_measurement_view() {
        let r = row(Algorithm::Gcra { burst: 100 }, Traffic::Poisson);
        assert_eq!(
            (r.wrongly_allowed, r.wrongly_denied, r.mean_abs_error),
            (None, None, None)
        );
        assert!(r.admitted > 0 && r.admitted < r.requests);
        assert_eq!((r.burst, r.buckets, r.weighting), (Some(100), None, None));
    }

    #[test]
    fn rows_describe_their_policy() {
        let r = row(sliding(8, Weighting::Conservative), Traffic::Poisson);
        assert_eq!(r.algorithm, "sliding_window");
        assert_eq!((r.buckets, r.weighting.as_deref()), (Some(8), Some("conservative")));
        assert_eq!(
            (r.limit, r.window_ns, r.effective_window_ns),
            (100, 60_000_000_000, 60_000_000_004)
        );
        assert_eq!((r.traffic.as_str(), r.clients), ("poisson", u64::from(FEW_CLIENTS)));
        let r = row(Algorithm::ExponentialHistogram { epsilon: 0.05 }, Traffic::Bursty);
        assert_eq!(r.epsilon, Some(0.05));
    }

    #[test]
    fn run_many_matches_run() {
        let window = Duration::from_secs(60);
        let policies: Vec<Policy> = [
            sliding(2, Weighting::Interpolated),
            sliding(8, Weighting::Conservative),
            Algorithm::SlidingLog,
            Algorithm::Gcra { burst: 10 },
        ]
        .into_iter()
        .map(|a| Policy::new(100, window, a).unwrap())
        .collect();
        let scenarios: Vec<Scenario> = Traffic::ALL
            .into_iter()
            .map(|traffic| Scenario {
                traffic,
                duration_ns: TEN_MINUTES / 4,
                clients: 20,
                seed: 3,
            })
            .collect();
        let expect: Vec<Row> = scenarios
            .iter()
            .flat_map(|s| policies.iter().map(|p| run(p, s).unwrap()))
            .collect();
        for threads in [0, 1, 2, 3, 64] {
            assert_eq!(
                run_many(&policies, &scenarios, threads).unwrap(),
                expect,
                "{threads} threads"
            );
        }
        assert_eq!(run_many(&[], &scenarios, 2).unwrap(), vec![]);
        let bad = Scenario {
            traffic: Traffic::Clients,
            duration_ns: 1,
            clients: 0,
            seed: 0,
        };
        assert_eq!(run_many(&policies, &[bad], 2), Err(SimError::NoClients));
    }

    #[test]
    fn empty_traffic_gives_an_empty_row() {
        let policy = Policy::new(1, Duration::from_secs(1), Algorithm::TWO_BUCKETS).unwrap();
        let r = run(
            &policy,
            &Scenario {
                traffic: Traffic::Clients,
                duration_ns: 0,
                clients: 3,
                seed: 0,
            },
        )
        .unwrap();
        assert_eq!(
            (r.requests, r.admitted, r.max_window_ratio, r.mean_abs_error),
            (0, 0, 0.0, None)
        );
        assert_eq!((r.wrongly_allowed, r.wrongly_denied), (Some(0), Some(0)));
    }
}
