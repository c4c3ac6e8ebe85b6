//! Writes the accuracy plots of a synthetic run into a directory:
//!
//! ```text
//! cargo run -p slidegate-plot --example demo -- target/plots
//! ```
//!
//! `count.{svg,png}`: one bursty client's true and estimated counts, and
//! `count_panels.{svg,png}` the same as one panel per estimate;
//! `error_rates.{svg,png}`: wrong decisions against the number of buckets
//! on heavy-tailed clients; `max_window_ratio.{svg,png}`: the end-of-bucket
//! attack against every algorithm.

use slidegate_core::{Algorithm, Policy, Weighting};
use slidegate_plot::{
    Line, PlotError, TimeAxis, count_over_time, count_panels, error_rates_by_buckets, max_window_ratio,
};
use slidegate_sim::{Scenario, Traffic, busiest_clients, count_series, run_many};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

const LIMIT: u64 = 100;
const WINDOW: Duration = Duration::from_secs(60);
const MINUTE_NS: u64 = 60_000_000_000;

fn main() -> ExitCode {
    let Some(dir) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: demo DIRECTORY");
        return ExitCode::from(2);
    };
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("cannot create {}: {e}", dir.display());
        return ExitCode::FAILURE;
    }
    match plots(&dir) {
        Ok(paths) => {
            for p in paths {
                println!("{}", p.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("demo: {e}");
            ExitCode::FAILURE
        }
    }
}

fn policy(algorithm: Algorithm) -> Policy {
    Policy::new(LIMIT, WINDOW, algorithm).expect("a valid policy")
}

fn sliding(buckets: u32, weighting: Weighting) -> Algorithm {
    Algorithm::SlidingWindow { buckets, weighting }
}

/// A short name for an algorithm, as in the CLI's table.
fn name(a: Algorithm) -> String {
    match a {
        Algorithm::SlidingWindow { buckets, weighting } => format!("sliding_window n={buckets} {weighting}"),
        Algorithm::Gcra { burst } => format!("gcra burst={burst}"),
        Algorithm::ExponentialHistogram { epsilon } => format!("exponential_histogram ε={epsilon}"),
        other => other.name().to_string(),
    }
}

fn plots(dir: &Path) -> Result<Vec<PathBuf>, PlotError> {
    let mut written = Vec::new();

    // 1. One bursty client, 5 minutes: the truth and three estimates.
    let scenario = Scenario {
        traffic: Traffic::Bursty,
        duration_ns: 5 * MINUTE_NS,
        clients: 1,
        seed: 7,
    };
    let algorithms = [
        sliding(2, Weighting::Interpolated),
        sliding(2, Weighting::Conservative),
        sliding(8, Weighting::Interpolated),
    ];
    let requests = scenario.requests(&policy(algorithms[0])).expect("traffic");
    let client = busiest_clients(&requests, 1)[0];
    let seconds = |ns: u64| ns as f64 / 1e9;
    let mut truth = Line::new("exact count", Vec::new());
    let mut estimates = Vec::new();
    for a in algorithms {
        let series = count_series(&policy(a), &requests, &[client]).remove(0);
        truth.points = series
            .points
            .iter()
            .map(|p| (seconds(p.time_ns), p.truth as f64))
            .collect();
        estimates.push(Line::new(
            format!("estimate, {}", name(a)),
            series.points.iter().map(|p| (seconds(p.time_ns), p.estimate)).collect(),
        ));
    }
    let title = format!("Requests in the last minute, one bursty client (limit {LIMIT} per minute)");
    written.extend(count_over_time(
        &dir.join("count"),
        &title,
        TimeAxis::Seconds,
        LIMIT as f64,
        &truth,
        &estimates,
    )?);
    written.extend(count_panels(
        &dir.join("count_panels"),
        &title,
        TimeAxis::Seconds,
        LIMIT as f64,
        &truth,
        &estimates,
    )?);

    // 2. Wrong decisions against n, on 1000 heavy-tailed clients.
    let buckets = [2, 3, 4, 8, 16, 32, 64];
    let weightings = [Weighting::Interpolated, Weighting::Conservative];
    let policies: Vec<Policy> = weightings
        .iter()
        .flat_map(|&w| buckets.iter().map(move |&n| policy(sliding(n, w))))
        .collect();
    let scenario = Scenario {
        traffic: Traffic::Clients,
        duration_ns: 10 * MINUTE_NS,
        clients: 1000,
        seed: 1,
    };
    let rows = run_many(&policies, &[scenario], 2).expect("simulation");
    let mut lines = Vec::new();
    for (w, weighting) in weightings.iter().enumerate() {
        let rows = &rows[w * buckets.len()..(w + 1) * buckets.len()];
        let percent = |wrong: Option<u64>, requests: u64| 100.0 * wrong.unwrap_or(0) as f64 / requests as f64;
        lines.push(Line::new(
            format!("wrongly allowed, {weighting}"),
            rows.iter()
                .map(|r| {
                    (
                        f64::from(r.buckets.unwrap_or(0)),
                        percent(r.wrongly_allowed, r.requests),
                    )
                })
                .collect(),
        ));
        lines.push(Line::new(
            format!("wrongly denied, {weighting}"),
            rows.iter()
                .map(|r| (f64::from(r.buckets.unwrap_or(0)), percent(r.wrongly_denied, r.requests)))
                .collect(),
        ));
    }
    written.extend(error_rates_by_buckets(
        &dir.join("error_rates"),
        "Wrong decisions by number of buckets, 1000 heavy-tailed clients",
        &lines,
    )?);

    // 3. The end-of-bucket attack against every algorithm.
    let algorithms = [
        sliding(2, Weighting::Interpolated),
        sliding(8, Weighting::Interpolated),
        sliding(2, Weighting::Conservative),
        sliding(8, Weighting::Conservative),
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::Gcra { burst: LIMIT },
        Algorithm::ExponentialHistogram { epsilon: 0.01 },
    ];
    let policies: Vec<Policy> = algorithms.iter().map(|&a| policy(a)).collect();
    let scenario = Scenario {
        traffic: Traffic::Adversary,
        duration_ns: 10 * MINUTE_NS,
        clients: 1,
        seed: 1,
    };
    let rows = run_many(&policies, &[scenario], 2).expect("simulation");
    let bars: Vec<(String, f64)> = algorithms
        .iter()
        .zip(&rows)
        .map(|(&a, r)| (name(a), r.max_window_ratio))
        .collect();
    written.extend(max_window_ratio(
        &dir.join("max_window_ratio"),
        "Most admitted in any one-minute window under the end-of-bucket attack",
        &bars,
    )?);
    Ok(written)
}
