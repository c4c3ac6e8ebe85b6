//! `slidegate simulate --plot DIR`: for each traffic of a run, the true
//! against the estimated count over time for the clients where its
//! algorithms disagree most, or those named with `--plot-client` (one
//! panel per algorithm, each against the true count), the
//! wrong decisions against the number of buckets for both weightings, and
//! the most admitted in any window over the limit, per algorithm; each as
//! SVG and PNG.

use anyhow::{Context, Result};
use slidegate_core::duration::format_duration;
use slidegate_core::{Algorithm, Policy, Weighting};
use slidegate_plot::{Line, TimeAxis};
use slidegate_sim::{Metrics, Request, Row};
use slidegate_whatif::policy_label;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Clients drawn in the count-over-time plots unless `--plot-client`
/// names them: those where the algorithms disagree most.
pub(crate) const PLOTTED: usize = 3;

/// The longest stretch a count plot shows, in windows: over a longer
/// run, the panels show the stretch where the algorithms disagree most
/// (a window's sawtooth stays a few pixels wide at most).
const ZOOM_WINDOWS: u64 = 12;

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

/// A file-name-safe form of `name`: ASCII letters, digits, `-`, `_` and
/// `.` kept (a leading `.` as `_`), everything else as `_`, at most 100
/// characters.
pub(crate) fn safe_name(name: &str) -> String {
    name.chars()
        .take(100)
        .enumerate()
        .map(|(i, c)| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || (c == '.' && i > 0) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// `<dir>/<traffic>-<what>`, the traffic's name made file-name-safe.
fn stem(dir: &Path, traffic: &str, what: &str) -> PathBuf {
    dir.join(format!("{}-{what}", safe_name(traffic)))
}

/// `n` with a comma every three digits (indicatif's `HumanCount`).
fn thousands(n: u64) -> String {
    indicatif::HumanCount(n).to_string()
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

/// The `k` clients where the algorithms of `metrics` disagree most: by
/// the spread of each client's refused requests (admission view) across
/// the algorithms, the most refused less the least, most first; ties to
/// the client with more requests, then to the smaller number. A client
/// far over its limit, which every algorithm refuses about alike, comes
/// after one that an algorithm lets through where another refuses.
/// `requests` gives each client's requests; a client without any is never
/// chosen.
pub(crate) fn most_disagreed(
    metrics: &[&Metrics],
    requests: impl IntoIterator<Item = (u32, u64)>,
    k: usize,
) -> Vec<u32> {
    let mut refused: HashMap<u32, Vec<u64>> = HashMap::new();
    for (i, m) in metrics.iter().enumerate() {
        for &(client, n) in &m.refused_by_client {
            refused.entry(client).or_insert_with(|| vec![0; metrics.len()])[i] = n;
        }
    }
    let spread = |client: u32| {
        refused.get(&client).map_or(0, |r| {
            let (lo, hi) = r.iter().fold((u64::MAX, 0), |(lo, hi), &n| (lo.min(n), hi.max(n)));
            hi - lo
        })
    };
    let mut ranked: Vec<(u64, u64, u32)> = requests
        .into_iter()
        .filter(|&(_, n)| n > 0)
        .map(|(client, n)| (spread(client), n, client))
        .collect();
    ranked.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)));
    ranked.into_iter().take(k).map(|(_, _, client)| client).collect()
}

/// Writes the plots of one traffic (`requests`, named `traffic`, with the
/// run's `rows` for it) into `dir`, the count plots for the `given`
/// clients, or without them for those where the algorithms disagree most;
/// returns the files written.
pub(crate) fn traffic_plots(
    dir: &Path,
    traffic: &str,
    requests: &[Request],
    policies: &[Policy],
    rows: &[Row],
    given: Option<&[u32]>,
) -> Result<Vec<PathBuf>> {
    let clients = if let Some(given) = given {
        given.to_vec()
    } else {
        let metrics: Vec<Metrics> = policies.iter().map(|p| slidegate_sim::evaluate(p, requests)).collect();
        let mut counts: HashMap<u32, u64> = HashMap::new();
        for r in requests {
            *counts.entry(r.client).or_default() += 1;
        }
        most_disagreed(&metrics.iter().collect::<Vec<_>>(), counts, PLOTTED)
    };
    let error_rates = match policies.first() {
        Some(first) => error_rate_policies(first)?
            .iter()
            .map(|p| slidegate_sim::evaluate(p, requests))
            .collect(),
        None => Vec::new(),
    };
    let inputs = PlotInputs {
        clients: &clients,
        requests,
        error_rates: &error_rates,
        time: TimeAxis::Seconds,
    };
    plots_of(dir, traffic, &inputs, policies, rows, &|c| c.to_string())
}

/// What the plots of one traffic are drawn from, besides its rows.
pub(crate) struct PlotInputs<'a> {
    /// The clients of the count plots, in order.
    pub(crate) clients: &'a [u32],
    /// Their requests, in time order (other clients' may be there too).
    pub(crate) requests: &'a [Request],
    /// The metrics of [`error_rate_policies`], in their order.
    pub(crate) error_rates: &'a [Metrics],
    /// What the time axes show: seconds for a model, a log's clock time.
    pub(crate) time: TimeAxis,
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
    let mut names: Vec<String> = Vec::new();
    for &client in inputs.clients {
        let name = client_name(client);
        // Two keys with one safe form (`a/b` and `a_b`) get two files.
        let mut file = format!("count-client-{}", safe_name(&name));
        let base = file.clone();
        let mut n = 1;
        while names.contains(&file) {
            n += 1;
            file = format!("{base}-{n}");
        }
        names.push(file.clone());
        let Some(panels) = count_panels_of(client, policies, &counted, requests, window) else {
            continue;
        };
        let title = match panels.zoom {
            None => format!("{traffic}: client {name}, true and estimated count before each request"),
            Some((shown, of)) => format!(
                "{traffic}: client {name}, the {} of {} where the algorithms disagree most",
                format_span(shown),
                format_span(of)
            ),
        };
        let files = slidegate_plot::count_panels(
            &stem(dir, traffic, &file),
            &title,
            inputs.time,
            limit as f64,
            &panels.truth,
            &panels.estimates,
        )
        .map_err(|e| anyhow::anyhow!("{e}"))?;
        written.extend(files);
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

/// A span as a title says it: `40 s`, `12 min`, `2 h`, `1.8 h`.
fn format_span(ns: u64) -> String {
    let s = ns as f64 / 1e9;
    if s < 90.0 {
        format!("{s:.0} s")
    } else if s < 5400.0 {
        format!("{:.0} min", s / 60.0)
    } else {
        let h = format!("{:.1}", s / 3600.0);
        format!("{} h", h.strip_suffix(".0").unwrap_or(&h))
    }
}

/// One client's count panels: the true count and each policy's estimate,
/// in seconds since the start, and the stretch shown when it is not all.
struct Panels {
    truth: Line,
    estimates: Vec<Line>,
    /// `(shown, of)`: the stretch shown and the client's whole span, in
    /// nanoseconds, when the panels zoom.
    zoom: Option<(u64, u64)>,
}

/// The times of `client`'s requests that the `policies` do not all
/// admit or all refuse, each deciding the client's requests on its own
/// (the admission view).
fn disagreements(client: u32, policies: &[Policy], requests: &[Request]) -> Vec<u64> {
    use slidegate_core::{LimitState, State};
    let mut states: Vec<State> = policies.iter().map(State::new).collect();
    requests
        .iter()
        .filter(|r| r.client == client)
        .filter_map(|r| {
            let mut admitted = 0;
            for (policy, state) in policies.iter().zip(&mut states) {
                admitted += usize::from(state.check(policy, r.time_ns, r.cost).allowed());
            }
            (admitted != 0 && admitted != policies.len()).then_some(r.time_ns)
        })
        .collect()
}

/// The count panels of `client` over `requests` for the `counted`
/// policies (the first gives the true count); over more than
/// [`ZOOM_WINDOWS`] windows, only the stretch of that many where the run's
/// `policies` disagree on most of its requests (or, where they never do,
/// where it sent most). `None` when the client sent nothing.
fn count_panels_of(
    client: u32,
    policies: &[Policy],
    counted: &[&Policy],
    requests: &[Request],
    window: Duration,
) -> Option<Panels> {
    let series: Vec<Vec<slidegate_sim::Point>> = counted
        .iter()
        .map(|p| {
            slidegate_sim::count_series(p, requests, &[client])
                .into_iter()
                .next()
                .map(|s| s.points)
                .unwrap_or_default()
        })
        .collect();
    let truth_points = series.first()?;
    let (start, end) = (truth_points.first()?.time_ns, truth_points.last()?.time_ns);
    let window_ns = u64::try_from(window.as_nanos()).unwrap_or(u64::MAX);
    let zoom_ns = window_ns.saturating_mul(ZOOM_WINDOWS);
    let range = (end - start > zoom_ns)
        .then(|| {
            let mut times = disagreements(client, policies, requests);
            if times.is_empty() {
                times = truth_points.iter().map(|p| p.time_ns).collect();
            }
            // The stretch of ZOOM_WINDOWS - 2 windows that holds the most…
            let (mut best, mut j) = ((0, 0), 0);
            for (i, &t) in times.iter().enumerate() {
                while j < times.len() && times[j] <= t.saturating_add(zoom_ns - 2 * window_ns) {
                    j += 1;
                }
                if j - i > best.1 - best.0 {
                    best = (i, j);
                }
            }
            // …cut to its busiest run without a silence of two windows (one
            // burst, rather than two far apart), with a window either side.
            let held = &times[best.0..best.1];
            let mut runs: Vec<&[u64]> = Vec::new();
            let mut from = 0;
            for k in 1..=held.len() {
                if k == held.len() || held[k] - held[k - 1] > 2 * window_ns {
                    runs.push(&held[from..k]);
                    from = k;
                }
            }
            let run = runs
                .iter()
                .copied()
                .max_by(|a, b| a.len().cmp(&b.len()).then(b[0].cmp(&a[0])))?;
            let (first, last) = (run.first()?, run.last()?);
            Some(first.saturating_sub(window_ns).max(start)..=last.saturating_add(window_ns).min(end))
        })
        .flatten();
    let line = |label: String, value: &dyn Fn(&slidegate_sim::Point) -> f64, points: &[slidegate_sim::Point]| {
        Line::new(
            label,
            points
                .iter()
                .filter(|p| range.as_ref().is_none_or(|r| r.contains(&p.time_ns)))
                .map(|p| (p.time_ns as f64 / 1e9, value(p)))
                .collect(),
        )
    };
    let truth = line(
        format!("true count over {}", format_duration(window)),
        &|p| p.truth as f64,
        truth_points,
    );
    let estimates = counted
        .iter()
        .zip(&series)
        .map(|(policy, points)| line(policy_label(policy), &|p| p.estimate, points))
        .collect();
    Some(Panels {
        truth,
        estimates,
        zoom: range.map(|r| {
            let shown = truth_points.iter().map(|p| p.time_ns).filter(|t| r.contains(t));
            let (lo, hi) = shown.fold((u64::MAX, 0), |(lo, hi), t| (lo.min(t), hi.max(t)));
            (hi.saturating_sub(lo).max(1_000_000_000), end - start)
        }),
    })
}

/// The most rules drawn one plot each by [`whatif_plots`] (those refused
/// most as configured); every rule is in the plot of all rules.
const WHATIF_RULE_PLOTS: usize = 6;

/// Writes the what-if replay's plots into `dir`: `whatif-refusals`, the
/// requests refused so far over the log's clock time of every rule as
/// configured, and for the rules refused most (up to
/// [`WHATIF_RULE_PLOTS`]) `whatif-rule-<rule>-refusals` (the rule's name
/// made file-name-safe, as [`safe_name`]), that rule's refusals so far as
/// configured, by the exact sliding log and by a fixed window: one rising
/// line per way of counting, its total in the legend. Each as SVG and PNG.
/// Returns the files written.
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
    let time = report
        .start_unix_ns
        .map_or(TimeAxis::Seconds, |start_unix_ns| TimeAxis::Clock { start_unix_ns });
    // Refusals so far at the end of each interval (the last one ends with
    // the log), from zero at the first line.
    let span_s = if report.span_ns == 0 {
        f64::INFINITY
    } else {
        report.span_ns as f64 / 1e9
    };
    let line = |label: String, series: &slidegate_whatif::Series| {
        let mut so_far = 0u64;
        let mut points = vec![(0.0, 0.0)];
        for (i, n) in series.aligned(interval_ns, len).into_iter().enumerate() {
            so_far += n;
            let end = ((i + 1) as f64 * interval_ns as f64 / 1e9).min(span_s);
            points.push((end, so_far as f64));
        }
        points.dedup_by(|b, a| b.0 <= a.0 && b.1 == a.1);
        Line::new(label, points)
    };
    let configured: Vec<Line> = report
        .rules
        .iter()
        .filter_map(|r| {
            let v = r.views.iter().find(|v| v.view == View::AsConfigured)?;
            let label = format!("{}: {}, {} refused", r.rule, r.limits, thousands(v.refused));
            Some(line(label, &v.series))
        })
        .collect();
    let title = format!(
        "domain {}: requests refused so far, each rule as configured",
        report.domain
    );
    written.extend(
        slidegate_plot::cumulative_refusals(&dir.join("whatif-refusals"), &title, time, &configured)
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
                let way = match v.view {
                    View::AsConfigured => format!("as configured ({})", v.algorithm),
                    other => other.name().to_owned(),
                };
                line(format!("{way}: {} refused", thousands(v.refused)), &v.series)
            })
            .collect();
        // The limit without the configured algorithm, which the legend
        // names.
        let limit = rule.limits.split(" (").next().unwrap_or(&rule.limits);
        let title = format!("rule {} ({limit}): requests refused so far", rule.rule);
        written.extend(
            slidegate_plot::cumulative_refusals(
                &stem(dir, &format!("whatif-rule-{}", rule.rule), "refusals"),
                &title,
                time,
                &lines,
            )
            .map_err(|e| anyhow::anyhow!("{e}"))?,
        );
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusing(refused: &[(u32, u64)]) -> Metrics {
        Metrics {
            refused_by_client: refused.to_vec(),
            ..Metrics::default()
        }
    }

    /// By the spread of refusals across the algorithms, not by traffic;
    /// ties to the busier client, then the smaller number.
    #[test]
    fn clients_are_ranked_by_how_much_the_algorithms_disagree() {
        // Client 0: far over the limit, refused alike (spread 2); client 1:
        // refused by one algorithm only (spread 40); clients 2 and 3: a
        // spread of 5 each, 3 busier; client 4: never refused; client 5:
        // disagreed on, but sent nothing in this traffic.
        let a = refusing(&[(0, 900), (2, 5), (3, 5), (5, 50)]);
        let b = refusing(&[(0, 902), (1, 40)]);
        let requests = [(0, 5000), (1, 80), (2, 30), (3, 31), (4, 7000), (5, 0)];
        assert_eq!(most_disagreed(&[&a, &b], requests, 3), [1, 3, 2]);
        assert_eq!(most_disagreed(&[&a, &b], requests, 10), [1, 3, 2, 0, 4]);
        // One algorithm: nothing to disagree on, the busiest first.
        assert_eq!(most_disagreed(&[&a], requests, 2), [4, 0]);
    }

    #[test]
    fn file_names_keep_the_key_where_it_is_safe() {
        assert_eq!(safe_name("10.0.0.1"), "10.0.0.1");
        assert_eq!(safe_name("2001:db8::1"), "2001_db8__1");
        assert_eq!(safe_name("/login"), "_login");
        assert_eq!(safe_name(".."), "_.");
        assert_eq!(safe_name(&"x".repeat(300)).len(), 100);
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(thousands(999), "999");
        assert_eq!(format_span(63_000_000_000), "63 s");
        assert_eq!(format_span(720_000_000_000), "12 min");
        assert_eq!(format_span(7_200_000_000_000), "2 h");
        assert_eq!(format_span(6_603_000_000_000), "1.8 h");
    }
}
