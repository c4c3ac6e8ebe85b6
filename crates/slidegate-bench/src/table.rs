//! `--format table`: one section per group, each with a header row; every
//! figure with its unit and thousands separators, the baseline's figure in
//! a column of its own beside each row measured against it, and the ratio
//! named for what it divides.

use crate::case::Case;
use anyhow::Result;
use std::io::Write;

/// What a group is measured against, as its section says it.
struct Group {
    /// The line above the section.
    title: &'static str,
    /// The baseline's column: its decisions/s.
    baseline: &'static str,
    /// The ratio's column: what it divides.
    ratio: &'static str,
}

/// The section of `group`.
fn group(name: &str) -> Group {
    match name {
        "algorithms" => Group {
            title: "algorithms: every algorithm's decision on one key, against governor's direct limiter",
            baseline: "governor decisions/s",
            ratio: "slidegate / governor",
        },
        "store" => Group {
            title: "store: the keyed in-memory store, against governor's keyed limiter",
            baseline: "governor decisions/s",
            ratio: "slidegate / governor",
        },
        "service" => Group {
            title: "service: `slidegate serve` in this process, over loopback",
            baseline: "baseline decisions/s",
            ratio: "case / baseline",
        },
        "redis" => Group {
            title: "redis: slidegate's scripts, against plain INCR through the same client",
            baseline: "INCR decisions/s",
            ratio: "script / INCR",
        },
        "hybrid" => Group {
            title: "hybrid: the hybrid mode, against the direct script",
            baseline: "script decisions/s",
            ratio: "hybrid / script",
        },
        _ => Group {
            title: "other cases",
            baseline: "baseline decisions/s",
            ratio: "case / baseline",
        },
    }
}

/// `v` rounded to a whole number, with a comma every three digits
/// (indicatif's `HumanCount`): `49,509,642`.
pub(crate) fn thousands(v: f64) -> String {
    if !v.is_finite() {
        return format!("{v}");
    }
    // Saturating: rates and times are far below u64::MAX.
    let whole = indicatif::HumanCount(v.abs().round() as u64);
    if v < 0.0 && whole.0 > 0 {
        format!("-{whole}")
    } else {
        whole.to_string()
    }
}

/// Nanoseconds per decision at `per_second` decisions a second: one
/// decimal below 100 ns, whole (with separators) above.
pub(crate) fn ns_per_decision(per_second: f64) -> String {
    if per_second <= 0.0 || !per_second.is_finite() {
        return "—".to_owned();
    }
    let ns = 1e9 / per_second;
    if ns < 100.0 { format!("{ns:.1}") } else { thousands(ns) }
}

/// The cases as one table per group, in the order run, then the notes on
/// the figures that have no column and, with a `redis` group, its cases
/// again by calls in flight.
pub(crate) fn write_table(cases: &[Case], out: &mut dyn Write) -> Result<()> {
    let mut groups: Vec<&str> = Vec::new();
    for c in cases {
        if !groups.contains(&c.group) {
            groups.push(c.group);
        }
    }
    for (i, name) in groups.iter().enumerate() {
        if i > 0 {
            writeln!(out)?;
        }
        let rows: Vec<&Case> = cases.iter().filter(|c| c.group == *name).collect();
        write_group(&group(name), &rows, cases, out)?;
    }
    let notes: Vec<String> = cases.iter().flat_map(notes).collect();
    if !notes.is_empty() {
        writeln!(out)?;
        for note in notes {
            writeln!(out, "{note}")?;
        }
    }
    write_redis_matrix(cases, out)
}

/// One group's section: its title, a header row, one row per case (a row
/// measured against a baseline indented under it, with the baseline's
/// decisions/s and the ratio).
fn write_group(group: &Group, rows: &[&Case], all: &[Case], out: &mut dyn Write) -> Result<()> {
    let latencies = rows.iter().any(|c| c.p50_us.is_some() || c.p99_us.is_some());
    let compared = rows.iter().any(|c| c.baseline.is_some());
    let base_of = |c: &Case| {
        let name = c.baseline.as_deref()?;
        all.iter().find(|b| b.name == name).map(|b| b.per_second)
    };
    let mut table: Vec<Vec<String>> = Vec::with_capacity(rows.len() + 1);
    let mut header = vec!["case".to_owned(), "decisions/s".to_owned(), "ns/decision".to_owned()];
    if compared {
        header.push(group.baseline.to_owned());
        header.push(group.ratio.to_owned());
    }
    if latencies {
        header.push("p50 µs".to_owned());
        header.push("p99 µs".to_owned());
    }
    table.push(header);
    let opt = |v: Option<f64>, digits: usize| v.map_or_else(|| "—".to_owned(), |v| format!("{v:.digits$}"));
    for c in rows {
        let indent = if c.baseline.is_some() { "  " } else { "" };
        let mut row = vec![
            format!("{indent}{}", c.name),
            thousands(c.per_second),
            ns_per_decision(c.per_second),
        ];
        if compared {
            row.push(base_of(c).map_or_else(String::new, thousands));
            row.push(c.ratio.map_or_else(String::new, |r| format!("{r:.2}")));
        }
        if latencies {
            row.push(opt(c.p50_us, 1));
            row.push(opt(c.p99_us, 1));
        }
        table.push(row);
    }
    let columns = table[0].len();
    let widths: Vec<usize> = (0..columns)
        .map(|i| table.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    writeln!(out, "{}", group.title)?;
    for row in &table {
        let mut line = String::new();
        for (i, (cell, &width)) in row.iter().zip(&widths).enumerate() {
            if i == 0 {
                line.push_str(&format!("{cell:<width$}"));
            } else {
                line.push_str(&format!("  {cell:>width$}"));
            }
        }
        writeln!(out, "{}", line.trim_end())?;
    }
    Ok(())
}

/// The figures of `c` that have no column, one sentence each.
fn notes(c: &Case) -> Vec<String> {
    let mut notes = Vec::new();
    if let Some(k) = c.commands_per_1000 {
        notes.push(format!("{}: {k:.2} Redis commands per 1,000 decisions", c.name));
    }
    match (c.redis_cpu_us, c.requests_per_call) {
        (Some(us), Some(r)) => notes.push(format!(
            "{}: {us:.2} µs of Redis CPU per decision, {r:.1} requests per script call",
            c.name
        )),
        (Some(us), None) => notes.push(format!("{}: {us:.2} µs of Redis CPU per decision", c.name)),
        _ => {}
    }
    if let Some(us) = c.server_cpu_us {
        notes.push(format!("{}: {us:.2} µs of the service's CPU per decision", c.name));
    }
    if let Some(r) = c.admitted_over_limit {
        notes.push(format!("{}: {r:.3} × the limit", c.name));
    }
    notes
}

/// The `redis` group again, one line per case and one column per
/// concurrency: decisions/s and, for the scripts, script / INCR at that
/// concurrency. Nothing when the run has no `redis` case.
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
    let title = "redis: decisions/s (script / INCR) by calls in flight";
    let cell = |label: &str, c: usize| {
        redis.iter().find(|&&(l, k, _)| l == label && k == c).map_or_else(
            || "—".to_owned(),
            |(_, _, case)| match case.ratio {
                Some(ratio) => format!("{} ({ratio:.2})", thousands(case.per_second)),
                None => thousands(case.per_second),
            },
        )
    };
    let width = labels
        .iter()
        .map(|l| l.chars().count())
        .max()
        .unwrap_or(0)
        .max(title.chars().count());
    let cell_width = concurrencies
        .iter()
        .flat_map(|&c| labels.iter().map(move |&l| (l, c)))
        .map(|(l, c)| cell(l, c).chars().count())
        .chain(concurrencies.iter().map(|c| format!("{c} in flight").len()))
        .max()
        .unwrap_or(0);
    writeln!(out)?;
    write!(out, "{title:<width$}")?;
    for c in &concurrencies {
        write!(out, "  {:>cell_width$}", format!("{c} in flight"))?;
    }
    writeln!(out)?;
    for label in labels {
        write!(out, "{label:<width$}")?;
        for &c in &concurrencies {
            write!(out, "  {:>cell_width$}", cell(label, c))?;
        }
        writeln!(out)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_have_separators_and_units() {
        assert_eq!(thousands(49_509_642.4), "49,509,642");
        assert_eq!(thousands(999.6), "1,000");
        assert_eq!(thousands(12.0), "12");
        assert_eq!(thousands(0.0), "0");
        assert_eq!(thousands(1_000_000.0), "1,000,000");
        assert_eq!(ns_per_decision(49_509_642.0), "20.2");
        assert_eq!(ns_per_decision(20_000.0), "50,000");
        assert_eq!(ns_per_decision(0.0), "—");
    }

    fn against(group: &'static str, name: &str, per_second: f64, base: &Case) -> Case {
        let mut c = Case::new(group, name, per_second);
        c.baseline = Some(base.name.clone());
        c.ratio = Some(per_second / base.per_second);
        c
    }

    /// A section per group, each with its header row; the baseline's
    /// figure in its own column beside the rows measured against it, the
    /// ratio named for what it divides.
    #[test]
    fn each_group_has_a_header_and_the_baseline_beside_its_rows() {
        let governor = Case::new("algorithms", "governor direct check", 30_000_000.0);
        let ours = against(
            "algorithms",
            "sliding_window n=8 conservative admit",
            49_509_642.0,
            &governor,
        );
        let mut http = Case::new("service", "HTTP POST /v1/check", 41_234.0);
        http.p50_us = Some(700.25);
        http.p99_us = Some(1_500.0);
        let cases = [governor, ours, http];
        let mut out = Vec::new();
        write_table(&cases, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let expected = [
            "algorithms: every algorithm's decision on one key, against governor's direct limiter",
            "case                                     decisions/s  ns/decision  governor decisions/s  slidegate / governor",
            "governor direct check                     30,000,000         33.3",
            "  sliding_window n=8 conservative admit   49,509,642         20.2            30,000,000                  1.65",
            "",
            "service: `slidegate serve` in this process, over loopback",
            "case                 decisions/s  ns/decision  p50 µs  p99 µs",
            "HTTP POST /v1/check       41,234       24,252   700.2  1500.0",
        ];
        assert_eq!(lines, expected, "\n{text}");
    }
}
