//! `slidegate simulate --config`: the what-if replay's report
//! (`slidegate_whatif::Report`) printed as a table for people and as CSV.

use slidegate_whatif::{Refused, Report, View};

/// `key (n)`, with `≤` where the count is a bound.
fn refused_list(top: &[Refused]) -> String {
    top.iter()
        .map(|r| {
            if r.at_most_over == 0 {
                format!("{} ({})", r.key, r.refused)
            } else {
                format!("{} (≤{})", r.key, r.refused)
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The report as a table for people.
pub(crate) fn write_table(report: &Report, heading: &str, out: &mut dyn std::io::Write) -> std::io::Result<()> {
    writeln!(out, "{heading}")?;
    write_notes(report, out)?;
    if report.rules.is_empty() {
        writeln!(out, "no rule of domain `{}` matched any request", report.domain)?;
        return Ok(());
    }
    for rule in &report.rules {
        writeln!(out)?;
        writeln!(out, "rule {}: {}", rule.rule, rule.limits)?;
        let head = ["counted by", "matched", "refused", "refused_%", "first refusal"];
        let rows: Vec<[String; 5]> = rule
            .views
            .iter()
            .map(|v| {
                [
                    match v.view {
                        View::AsConfigured => format!("{} (as configured)", v.algorithm),
                        _ => v.view.name().to_owned(),
                    },
                    v.matched.to_string(),
                    v.refused.to_string(),
                    format!("{:.2}", v.refused_pct()),
                    v.first_refusal.clone().unwrap_or_else(|| "-".to_owned()),
                ]
            })
            .collect();
        let mut widths = head.map(str::len);
        for row in &rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let line = |cells: [&str; 5]| {
            let mut s = String::from("  ");
            for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
                let pad = w.saturating_sub(cell.chars().count());
                if i == 0 || i == 4 {
                    s.push_str(cell);
                    s.push_str(&" ".repeat(pad));
                } else {
                    s.push_str(&" ".repeat(pad));
                    s.push_str(cell);
                }
                s.push_str("  ");
            }
            s.trim_end().to_owned()
        };
        writeln!(out, "{}", line(head))?;
        for row in &rows {
            writeln!(
                out,
                "{}",
                line([&row[0], &row[1], &row[2], &row[3], &row[4]].map(String::as_str))
            )?;
        }
        for v in &rule.views {
            if !v.top_refused.is_empty() {
                writeln!(
                    out,
                    "  refused most, {}: {}",
                    v.view.name(),
                    refused_list(&v.top_refused)
                )?;
            }
        }
    }
    Ok(())
}

/// `1 line` or `n lines`.
fn lines(n: u64) -> String {
    if n == 1 {
        "1 line".to_owned()
    } else {
        format!("{n} lines")
    }
}

/// The replay's caveats, one line each.
fn write_notes(report: &Report, out: &mut dyn std::io::Write) -> std::io::Result<()> {
    let duration = |ns| slidegate_core::duration::format_duration(std::time::Duration::from_nanos(ns));
    if report.out_of_order > 0 {
        writeln!(
            out,
            "note: {} out of order by up to {} (more than the {} reorder horizon), decided at the latest time",
            lines(report.out_of_order),
            duration(report.most_late_ns),
            duration(report.horizon_ns)
        )?;
    }
    for (field, &n) in &report.missing_fields {
        writeln!(
            out,
            "note: {} without a value for field `{field}`: their descriptor was left out",
            lines(n)
        )?;
    }
    if report.without_descriptor > 0 {
        writeln!(
            out,
            "note: {} with no descriptor left sent no request",
            lines(report.without_descriptor)
        )?;
    }
    if let Some(first) = &report.first_invalid {
        writeln!(
            out,
            "note: {} refused by the service as invalid (the first: {first})",
            lines(report.invalid)
        )?;
    }
    if report.evictions > 0 {
        writeln!(
            out,
            "note: the stores were full and evicted {} live keys: raise --memory-mib for figures that do not \
             depend on eviction",
            report.evictions
        )?;
    }
    Ok(())
}

/// The CSV columns, one row per rule and view.
pub(crate) const CSV_COLUMNS: [&str; 8] = [
    "rule",
    "limits",
    "counted_by",
    "matched",
    "refused",
    "refused_pct",
    "first_refusal",
    "top_refused",
];

/// The report as CSV, one row per rule and view.
pub(crate) fn write_csv(report: &Report, out: &mut dyn std::io::Write) -> std::io::Result<()> {
    fn quoted(s: &str) -> String {
        if s.contains([',', '"', '\n']) {
            format!("\"{}\"", s.replace('"', "\"\""))
        } else {
            s.to_owned()
        }
    }
    writeln!(out, "{}", CSV_COLUMNS.join(","))?;
    for rule in &report.rules {
        for v in &rule.views {
            let top: Vec<String> = v
                .top_refused
                .iter()
                .map(|r| {
                    if r.at_most_over == 0 {
                        format!("{} {}", r.key, r.refused)
                    } else {
                        format!("{} <={}", r.key, r.refused)
                    }
                })
                .collect();
            let cells = [
                quoted(&rule.rule),
                quoted(&rule.limits),
                quoted(match v.view {
                    View::AsConfigured => &v.algorithm,
                    _ => v.view.name(),
                }),
                v.matched.to_string(),
                v.refused.to_string(),
                format!("{:.2}", v.refused_pct()),
                v.first_refusal.clone().unwrap_or_default(),
                quoted(&top.join("; ")),
            ];
            writeln!(out, "{}", cells.join(","))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use slidegate_sim::ReorderOptions;
    use slidegate_whatif::{Replay, Setup};
    use std::path::PathBuf;

    fn setup() -> Setup {
        let data = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../slidegate-whatif/tests/data/config.yaml"
        );
        Setup {
            config: vec![PathBuf::from(data)],
            domain: "shop".into(),
            descriptors: vec![
                vec!["remote_address=client".parse().unwrap()],
                vec!["path=path".parse().unwrap()],
            ],
            memory_bytes: 1 << 20,
            order: ReorderOptions::default(),
        }
    }

    #[test]
    fn missing_fields_and_late_lines_are_counted_not_lost() {
        let mut setup = setup();
        setup.order.horizon_ns = 1_000_000_000;
        let mut replay = Replay::new(&setup).unwrap();
        let t0 = 1_699_999_980_000_000_000_i64;
        let s = |n: i64| t0 + n * 1_000_000_000;
        replay.line(s(5), &[("client", "10.0.0.1"), ("path", "-")][..]);
        // Within the horizon: put back in order, not late.
        replay.line(s(4), &[("client", "10.0.0.1"), ("path", "/login")][..]);
        // 7 s releases 5 s; 3 s then comes 2 s after a line decided.
        replay.line(s(7), &[("path", "")][..]);
        replay.line(s(3), &[("client", "10.0.0.1")][..]);
        let report = replay.finish();
        assert_eq!((report.lines, report.requests, report.without_descriptor), (4, 3, 1));
        assert_eq!((report.out_of_order, report.most_late_ns), (1, 2_000_000_000));
        assert_eq!(report.missing_fields.get("path"), Some(&3));
        assert_eq!(report.missing_fields.get("client"), Some(&1));
        // The login line was decided first, at 22:13:04.
        assert_eq!(report.first_line.as_deref(), Some("2023-11-14T22:13:04.000Z"));
        let names: Vec<&str> = report.rules.iter().map(|r| r.rule.as_str()).collect();
        assert_eq!(names, ["path_/login", "remote_address"]);
        assert_eq!(report.rules[1].views[0].matched, 3);
        let mut out = Vec::new();
        write_notes(&report, &mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "note: 1 line out of order by up to 2s (more than the 1s reorder horizon), decided at the latest \
             time\nnote: 1 line without a value for field `client`: their descriptor was left out\nnote: 3 lines \
             without a value for field `path`: their descriptor was left out\nnote: 1 line with no descriptor left \
             sent no request\n"
        );
    }
}
