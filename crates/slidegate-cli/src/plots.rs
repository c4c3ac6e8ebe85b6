//! `slidegate simulate --plot DIR`: for each traffic of a run, the true
//! against the estimated count over time for its busiest clients (one
//! panel per algorithm, each against the true count), the
//! wrong decisions against the number of buckets for both weightings, and
//! the most admitted in any window over the limit, per algorithm; each as
//! SVG and PNG.

use anyhow::{Context, Result};
use slidegate_core::{Algorithm, Policy, Weighting};
use slidegate_plot::Line;
use slidegate_sim::{Metrics, Request, Row};
use slidegate_whatif::policy_label;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Clients drawn in the count-over-time plots.
const BUSIEST: usize = 3;

/// The bucket counts of the error-rate plot.
const BUCKETS: [u32; 8] = [2, 3, 4, 6, 8, 12, 16, 32];

/// A row's algorithm and parameters, as the table writes them.
pub(crate) fn label(row: &Row) -> String {
    match (row.buckets, &row.weighting, row.burst, row.epsilon) {
        (Some(n), Some(w), _, _) => format!("{} n={n} {w}", row.algorithm),
        (_, _, Some(burst), _) => format!("{} burst={burst}", row.algorithm),
        (_, _, _, Some(eps)) => format!("{} ε={eps}", row.algorithm),
        _ => row.algorithm.to_owned(),
    }
}

/// A file-name-safe form of a traffic name.
fn stem(dir: &Path, traffic: &str, what: &str) -> PathBuf {
    let safe: String = traffic
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    dir.join(format!("{safe}-{what}"))
}

/// The policies of the error-rate plot: `sliding_window` with each of
/// [`BUCKETS`], interpolated then conservative, on `first`'s limit and
/// window.
pub(crate) fn error_rate_policies(first: &Policy) -> Result<Vec<Policy>> {
    let window = Duration::from_nanos(first.window_ns());
    let mut policies = Vec::with_capacity(2 * BUCKETS.len());
    for weighting in [Weighting::Interpolated, Weighting::Conservative] {
        for n in BUCKETS {
            let algorithm = Algorithm::SlidingWindow { buckets: n, weighting };
            policies.push(Policy::new(first.limit(), window, algorithm)?);
        }
    }
    Ok(policies)
}

/// The busiest `BUSIEST` clients by their request counts (`counts[c]` for
/// client `c`), most first, ties to the smaller client; none without
/// requests.
pub(crate) fn busiest_of_counts(counts: &[u64]) -> Vec<u32> {
    let mut ranked: Vec<(u32, u64)> = (0u32..).zip(counts.iter().copied()).filter(|&(_, n)| n > 0).collect();
    ranked.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    ranked.into_iter().take(BUSIEST).map(|(client, _)| client).collect()
}

/// Writes the plots of one traffic (`requests`, named `traffic`, with the
/// run's `rows` for it) into `dir`; returns the files written.
pub(crate) fn traffic_plots(
    dir: &Path,
    traffic: &str,
    requests: &[Request],
    policies: &[Policy],
    rows: &[Row],
    client_name: &dyn Fn(u32) -> String,
) -> Result<Vec<PathBuf>> {
    let busiest = slidegate_sim::busiest_clients(requests, BUSIEST);
    let error_rates = match policies.first() {
        Some(first) => error_rate_policies(first)?
            .iter()
            .map(|p| slidegate_sim::evaluate(p, requests))
            .collect(),
        None => Vec::new(),
    };
    let inputs = PlotInputs {
        busiest: &busiest,
        requests,
        error_rates: &error_rates,
    };
    plots_of(dir, traffic, &inputs, policies, rows, client_name)
}

/// What the plots of one traffic are drawn from, besides its rows.
pub(crate) struct PlotInputs<'a> {
    /// The busiest clients, most first.
    pub(crate) busiest: &'a [u32],
    /// Their requests, in time order (other clients' may be there too).
    pub(crate) requests: &'a [Request],
    /// The metrics of [`error_rate_policies`], in their order.
    pub(crate) error_rates: &'a [Metrics],
}

/// Writes the plots of one traffic from `inputs` (named `traffic`, with the
/// run's `rows` for it) into `dir`; returns the files written.
pub(crate) fn plots_of(
    dir: &Path,
    traffic: &str,
    inputs: &PlotInputs<'_>,
    policies: &[Policy],
    rows: &[Row],
    client_name: &dyn Fn(u32) -> String,
) -> Result<Vec<PathBuf>> {
    let requests = inputs.requests;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut written = Vec::new();
    let Some(first) = policies.first() else {
        return Ok(written);
    };
    let limit = first.limit();
    let window = Duration::from_nanos(first.window_ns());

    // True against estimated count, for the busiest clients, with every
    // policy that keeps a window count (gcra keeps none).
    let mut counted: Vec<&Policy> = policies
        .iter()
        .filter(|p| !matches!(p.algorithm(), Algorithm::Gcra { .. }))
        .collect();
    if counted.len() > slidegate_plot::MAX_PANELS {
        eprintln!(
            "plots: the count plots show the first {} of the {} algorithms that keep a count",
            slidegate_plot::MAX_PANELS,
            counted.len()
        );
        counted.truncate(slidegate_plot::MAX_PANELS);
    }
    if let Some(truth_policy) = counted.first() {
        for &client in inputs.busiest {
            let series = |policy: &Policy| {
                slidegate_sim::count_series(policy, requests, &[client])
                    .into_iter()
                    .next()
                    .map(|s| s.points)
                    .unwrap_or_default()
            };
            let truth_points = series(truth_policy);
            let truth = Line::new(
                format!("true count over {}", slidegate_core::duration::format_duration(window)),
                truth_points
                    .iter()
                    .map(|p| (p.time_ns as f64 / 1e9, p.truth as f64))
                    .collect(),
            );
            let estimates: Vec<Line> = counted
                .iter()
                .map(|policy| {
                    Line::new(
                        policy_label(policy),
                        series(policy)
                            .iter()
                            .map(|p| (p.time_ns as f64 / 1e9, p.estimate))
                            .collect(),
                    )
                })
                .collect();
            let name = client_name(client);
            let title = format!("{traffic}: client {name}, true and estimated count before each request");
            let files = slidegate_plot::count_panels(
                &stem(dir, traffic, &format!("count-client-{client}")),
                &title,
                limit as f64,
                &truth,
                &estimates,
            )
            .map_err(|e| anyhow::anyhow!("{e}"))?;
            written.extend(files);
        }
    }

    // Wrong decisions against n, both weightings, on the same requests.
    let mut lines = Vec::new();
    let mut error_rates = inputs.error_rates.iter();
    for weighting in [Weighting::Interpolated, Weighting::Conservative] {
        let mut allowed = Vec::new();
        let mut denied = Vec::new();
        for n in BUCKETS {
            let Some(m) = error_rates.next() else {
                anyhow::bail!("plots: no error rates for sliding_window n={n} {}", weighting.name());
            };
            let pct = |v: Option<u64>| v.unwrap_or(0) as f64 * 100.0 / (m.requests.max(1) as f64);
            allowed.push((f64::from(n), pct(m.wrongly_allowed)));
            denied.push((f64::from(n), pct(m.wrongly_denied)));
        }
        lines.push(Line::new(format!("wrongly allowed, {}", weighting.name()), allowed));
        lines.push(Line::new(format!("wrongly denied, {}", weighting.name()), denied));
    }
    let title = format!(
        "{traffic}: wrong decisions of sliding_window against its buckets (limit {limit} per {})",
        slidegate_core::duration::format_duration(window)
    );
    written.extend(
        slidegate_plot::error_rates_by_buckets(&stem(dir, traffic, "error-rates"), &title, &lines)
            .map_err(|e| anyhow::anyhow!("{e}"))?,
    );

    // The most admitted in any window over the limit, per algorithm.
    let bars: Vec<(String, f64)> = rows.iter().map(|r| (label(r), r.max_window_ratio)).collect();
    if !bars.is_empty() {
        let title = format!("{traffic}: most admitted to one client in any window, over the limit");
        written.extend(
            slidegate_plot::max_window_ratio(&stem(dir, traffic, "max-window"), &title, &bars)
                .map_err(|e| anyhow::anyhow!("{e}"))?,
        );
    }
    Ok(written)
}

/// The most rules drawn one plot each by [`whatif_plots`] (those refused
/// most as configured); every rule is in the plot of all rules.
const WHATIF_RULE_PLOTS: usize = 6;

/// Writes the what-if replay's plots into `dir`: `whatif-refusals`, the
/// refusals over time of every rule as configured, and for the rules
/// refused most (up to [`WHATIF_RULE_PLOTS`]) `whatif-rule-<rule>-refusals`
/// (the rule's name with every character but letters, digits, `-` and `_`
/// as `_`), that
/// rule's refusals as configured, by the exact sliding log and by a fixed
/// window; each as SVG and PNG. Returns the files written.
pub(crate) fn whatif_plots(dir: &Path, report: &slidegate_whatif::Report) -> Result<Vec<PathBuf>> {
    use slidegate_whatif::View;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut written = Vec::new();
    let all = report.rules.iter().flat_map(|r| &r.views).map(|v| &v.series);
    let interval_ns = all.clone().map(|s| s.interval_ns).max().unwrap_or(1);
    let len = all.map(|s| s.aligned(interval_ns, 0).len()).max().unwrap_or(0);
    if len == 0 {
        return Ok(written);
    }
    let per = slidegate_core::duration::format_duration(Duration::from_nanos(interval_ns));
    let line = |label: String, series: &slidegate_whatif::Series| {
        let points = series
            .aligned(interval_ns, len)
            .into_iter()
            .enumerate()
            .map(|(i, n)| ((i as f64 + 0.5) * interval_ns as f64 / 1e9, n as f64))
            .collect();
        Line::new(label, points)
    };
    let configured: Vec<Line> = report
        .rules
        .iter()
        .filter_map(|r| {
            let v = r.views.iter().find(|v| v.view == View::AsConfigured)?;
            Some(line(format!("{}: {}", r.rule, r.limits), &v.series))
        })
        .collect();
    let title = format!("domain {}: refused per {per}, each rule as configured", report.domain);
    written.extend(
        slidegate_plot::refusals_over_time(&dir.join("whatif-refusals"), &title, &configured)
            .map_err(|e| anyhow::anyhow!("{e}"))?,
    );
    let mut rules: Vec<&slidegate_whatif::RuleReport> = report.rules.iter().collect();
    let refused = |r: &slidegate_whatif::RuleReport| r.views.first().map_or(0, |v| v.refused);
    rules.sort_by(|a, b| refused(b).cmp(&refused(a)).then_with(|| a.rule.cmp(&b.rule)));
    for rule in rules.into_iter().take(WHATIF_RULE_PLOTS) {
        let lines: Vec<Line> = rule
            .views
            .iter()
            .map(|v| {
                let label = match v.view {
                    View::AsConfigured => v.algorithm.clone(),
                    other => other.name().to_owned(),
                };
                line(label, &v.series)
            })
            .collect();
        let title = format!("rule {}: refused per {per}, as configured and otherwise", rule.rule);
        written.extend(
            slidegate_plot::refusals_over_time(
                &stem(dir, &format!("whatif-rule-{}", rule.rule), "refusals"),
                &title,
                &lines,
            )
            .map_err(|e| anyhow::anyhow!("{e}"))?,
        );
    }
    Ok(written)
}
