//! `slidegate simulate`: every chosen algorithm against every chosen traffic
//! model, in the measurement and the admission view.

use anyhow::{Context, Result};
use clap::builder::PossibleValuesParser;
use clap::{ValueEnum, value_parser};
use slidegate_core::duration::{format_duration, parse_positive_duration};
use slidegate_core::{Algorithm, Policy, Weighting};
use slidegate_sim::{MAX_CLIENTS, Row, Scenario, Traffic};
use std::io::Write;
use std::time::Duration;

/// Flags of `slidegate simulate`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Traffic model; repeat or separate with commas [default: all]
    #[arg(long, value_name = "MODEL", value_delimiter = ',', value_parser = PossibleValuesParser::new(Traffic::NAMES))]
    traffic: Vec<String>,

    /// Algorithm; repeat or separate with commas [default: all]
    #[arg(long, value_name = "NAME", value_delimiter = ',', value_parser = PossibleValuesParser::new(Algorithm::NAMES))]
    algorithm: Vec<String>,

    /// Requests admitted per window, per client
    #[arg(long, value_name = "N", default_value_t = 100)]
    limit: u64,

    /// Window length: an integer and ns, us, ms, s, m, h or d
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_positive_duration)]
    window: Duration,

    /// Sub-buckets of sliding_window (2 is the classic two-bucket estimate)
    #[arg(long, value_name = "N", default_value_t = 2)]
    buckets: u32,

    /// How sliding_window weighs its oldest bucket
    #[arg(long, value_enum, default_value_t = WeightingArg::Both)]
    weighting: WeightingArg,

    /// Clients of the `clients` traffic model
    #[arg(long, value_name = "N", default_value_t = 100,
          value_parser = value_parser!(u32).range(1..=i64::from(MAX_CLIENTS)))]
    clients: u32,

    /// Simulated time
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = parse_positive_duration)]
    duration: Duration,

    /// Seed of the traffic models' random numbers
    #[arg(long, value_name = "N", default_value_t = 1)]
    seed: u64,

    /// Burst of gcra [default: the limit]
    #[arg(long, value_name = "N")]
    burst: Option<u64>,

    /// Relative error bound of exponential_histogram
    #[arg(long, value_name = "F", default_value_t = 0.01)]
    epsilon: f64,

    /// Output format
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
}

/// `--weighting`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum WeightingArg {
    /// The oldest bucket weighted by its part still in the window
    Interpolated,
    /// The oldest bucket counted whole: never more than the limit
    Conservative,
    /// One row for each
    Both,
}

impl WeightingArg {
    fn weightings(self) -> &'static [Weighting] {
        match self {
            WeightingArg::Interpolated => &[Weighting::Interpolated],
            WeightingArg::Conservative => &[Weighting::Conservative],
            WeightingArg::Both => &[Weighting::Interpolated, Weighting::Conservative],
        }
    }
}

/// `--format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Format {
    /// Aligned columns for people.
    Table,
    /// A header line and one line per row.
    Csv,
    /// A list of row objects.
    Json,
}

/// Runs the simulation and writes the rows to `out`.
pub(crate) fn run(args: &Args, out: &mut dyn Write) -> Result<()> {
    let policies = policies(args)?;
    let traffics = chosen(&args.traffic, &Traffic::NAMES)
        .iter()
        .map(|name| name.parse::<Traffic>())
        .collect::<Result<Vec<_>, _>>()?;
    let duration_ns = u64::try_from(args.duration.as_nanos())
        .map_err(|_| anyhow::anyhow!("invalid duration `{:?}`: too long", args.duration))?;
    let scenarios: Vec<Scenario> = traffics
        .into_iter()
        .map(|traffic| Scenario {
            traffic,
            duration_ns,
            clients: args.clients,
            seed: args.seed,
        })
        .collect();
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let rows = slidegate_sim::run_many(&policies, &scenarios, threads)?;
    match args.format {
        Format::Json => {
            let json = serde_json::to_string_pretty(&rows).context("serialising the rows")?;
            writeln!(out, "{json}")?;
        }
        Format::Csv => write_csv(&rows, out)?,
        Format::Table => {
            writeln!(
                out,
                "limit {} per {}, {} simulated, seed {}, {} clients in the `clients` model",
                args.limit,
                format_duration(args.window),
                format_duration(args.duration),
                args.seed,
                args.clients
            )?;
            write_table(&rows, out)?;
        }
    }
    out.flush()?;
    Ok(())
}

/// The names given, without repeats, or all of them when none was given.
fn chosen<'a>(given: &'a [String], all: &'a [&'static str]) -> Vec<&'a str> {
    if given.is_empty() {
        return all.to_vec();
    }
    let mut names: Vec<&str> = Vec::new();
    for name in given {
        if !names.contains(&name.as_str()) {
            names.push(name);
        }
    }
    names
}

/// One validated policy per algorithm configuration, before anything runs,
/// so that a bad value fails fast with its name.
fn policies(args: &Args) -> Result<Vec<Policy>> {
    let mut algorithms = Vec::new();
    for name in chosen(&args.algorithm, &Algorithm::NAMES) {
        match Algorithm::with_defaults(name, args.limit)? {
            Algorithm::SlidingWindow { .. } => algorithms.extend(args.weighting.weightings().iter().map(
                |&weighting| Algorithm::SlidingWindow {
                    buckets: args.buckets,
                    weighting,
                },
            )),
            Algorithm::Gcra { burst } => algorithms.push(Algorithm::Gcra {
                burst: args.burst.unwrap_or(burst),
            }),
            Algorithm::ExponentialHistogram { .. } => {
                algorithms.push(Algorithm::ExponentialHistogram { epsilon: args.epsilon });
            }
            other => algorithms.push(other),
        }
    }
    algorithms
        .into_iter()
        .map(|a| Ok(Policy::new(args.limit, args.window, a)?))
        .collect()
}

const COLUMNS: [&str; 17] = [
    "algorithm",
    "buckets",
    "weighting",
    "burst",
    "epsilon",
    "traffic",
    "limit",
    "window_ns",
    "effective_window_ns",
    "clients",
    "requests",
    "admitted",
    "wrongly_allowed",
    "wrongly_denied",
    "max_window_admitted",
    "max_window_ratio",
    "mean_abs_error",
];

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(String::new, |v| v.to_string())
}

/// Every field of every row, in [`COLUMNS`] order; no field holds a comma.
fn write_csv(rows: &[Row], out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(out, "{}", COLUMNS.join(","))?;
    for r in rows {
        let fields = [
            r.algorithm.to_string(),
            opt(r.buckets),
            opt(r.weighting.as_ref()),
            opt(r.burst),
            opt(r.epsilon),
            r.traffic.clone(),
            r.limit.to_string(),
            r.window_ns.to_string(),
            r.effective_window_ns.to_string(),
            r.clients.to_string(),
            r.requests.to_string(),
            r.admitted.to_string(),
            opt(r.wrongly_allowed),
            opt(r.wrongly_denied),
            r.max_window_admitted.to_string(),
            r.max_window_ratio.to_string(),
            opt(r.mean_abs_error),
        ];
        writeln!(out, "{}", fields.join(","))?;
    }
    Ok(())
}

/// The fields people compare, aligned: text to the left, numbers to the
/// right, `-` where a figure does not apply.
fn write_table(rows: &[Row], out: &mut dyn Write) -> std::io::Result<()> {
    let header = [
        "traffic",
        "algorithm",
        "params",
        "requests",
        "admitted",
        "wrong_allow",
        "wrong_deny",
        "wrong_%",
        "max_ratio",
        "mean_err_%",
    ];
    let left = 3; // the first three columns are text
    let dash = || "-".to_string();
    let mut cells: Vec<Vec<String>> = vec![header.iter().map(|h| h.to_string()).collect()];
    for r in rows {
        let params = match (r.buckets, &r.weighting, r.burst, r.epsilon) {
            (Some(n), Some(w), _, _) => format!("n={n} {w}"),
            (_, _, Some(burst), _) => format!("burst={burst}"),
            (_, _, _, Some(eps)) => format!("epsilon={eps}"),
            _ => dash(),
        };
        let wrong = match (r.wrongly_allowed, r.wrongly_denied) {
            (Some(a), Some(d)) if r.requests > 0 => format!("{:.3}", (a + d) as f64 * 100.0 / r.requests as f64),
            _ => dash(),
        };
        cells.push(vec![
            r.traffic.clone(),
            r.algorithm.to_string(),
            params,
            r.requests.to_string(),
            r.admitted.to_string(),
            r.wrongly_allowed.map_or_else(dash, |v| v.to_string()),
            r.wrongly_denied.map_or_else(dash, |v| v.to_string()),
            wrong,
            format!("{:.3}", r.max_window_ratio),
            r.mean_abs_error.map_or_else(dash, |e| format!("{:.2}", e * 100.0)),
        ]);
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|i| cells.iter().map(|row| row[i].chars().count()).max().unwrap_or(0))
        .collect();
    for row in &cells {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (cell, &w))| {
                if i < left {
                    format!("{cell:<w$}")
                } else {
                    format!("{cell:>w$}")
                }
            })
            .collect();
        writeln!(out, "{}", line.join("  ").trim_end())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn output(argv: &[&str]) -> Result<String> {
        let cli = Cli::try_parse_from(std::iter::once("simulate").chain(argv.iter().copied()))?;
        let mut out = Vec::new();
        run(&cli.args, &mut out)?;
        Ok(String::from_utf8(out)?)
    }

    #[test]
    fn csv_has_a_header_and_one_line_per_configuration() {
        let csv = output(&[
            "--traffic",
            "poisson,adversary",
            "--algorithm",
            "sliding_window",
            "--algorithm",
            "gcra",
            "--format",
            "csv",
            "--duration",
            "2m",
        ])
        .unwrap();
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines[0], COLUMNS.join(","));
        // 2 traffic models × (2 weightings + gcra).
        assert_eq!(lines.len(), 1 + 2 * 3);
        assert!(lines[1].starts_with("sliding_window,2,interpolated,,,poisson,100,60000000000,"));
        assert!(lines[3].starts_with("gcra,,,100,,poisson,"));
        assert!(lines.iter().all(|l| l.split(',').count() == COLUMNS.len()));
    }

    #[test]
    fn table_is_aligned() {
        let table = output(&[
            "--traffic",
            "bursty",
            "--algorithm",
            "gcra,sliding_log,gcra",
            "--duration",
            "1m",
        ])
        .unwrap();
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].starts_with("limit 100 per 1m, 1m simulated, seed 1"));
        assert!(lines[1].starts_with("traffic  algorithm"));
        assert_eq!(lines.len(), 4, "{table}");
        assert_eq!(lines[2].len(), lines[3].len(), "{table}");
        assert!(lines[2].contains("burst=100"));
    }

    #[test]
    fn bad_values_are_named() {
        let err = |argv: &[&str]| format!("{:#}", output(argv).unwrap_err());
        assert_eq!(err(&["--limit", "0"]), "invalid limit `0`: must be at least 1");
        assert_eq!(
            err(&["--buckets", "1"]),
            "invalid buckets `1`: must be between 2 and 65536"
        );
        assert_eq!(
            err(&["--algorithm", "gcra", "--burst", "0"]),
            "invalid burst `0`: must be at least 1"
        );
        assert!(err(&["--epsilon", "2"]).starts_with("invalid epsilon `2`"));
        assert!(err(&["--window", "5parsecs"]).contains("'5parsecs'"));
        assert!(err(&["--duration", "0s"]).contains("must be longer than zero"));
        assert!(err(&["--clients", "0"]).contains("'0'"));
        assert!(err(&["--traffic", "flood"]).contains("'flood'"));
        assert!(err(&["--limit", "-3"]).contains("'-3'"));
        // Flags of algorithms not run are not checked.
        assert!(output(&["--algorithm", "sliding_log", "--buckets", "1", "--duration", "1m"]).is_ok());
        let e = err(&[
            "--limit",
            "4000000000",
            "--traffic",
            "poisson",
            "--algorithm",
            "sliding_log",
        ]);
        assert!(e.starts_with("traffic model `poisson` would send about"), "{e}");
    }
}
