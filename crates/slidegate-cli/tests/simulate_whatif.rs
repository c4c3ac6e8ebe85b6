//! `slidegate simulate --config` as a process: the what-if replay of the
//! committed nginx log (`slidegate-whatif`'s `tests/data/access.log`,
//! nginx's stock `main` format) through the committed config, in the three
//! output formats, and its errors.
//!
//! The expected figures are those of `tests/data/oracle.py` there, which
//! works them out from the algorithms' definitions request by request,
//! apart from slidegate's code:
//!
//! - rule `remote_address` (3 a minute per client, sliding_window n=8
//!   conservative): 10.0.0.1 is refused at 22:13:03 and :04 by all three;
//!   10.0.0.2's three requests at 22:14:01-03 follow three at 22:13:50-52,
//!   refused by both sliding counts but not by the fixed window (a new
//!   minute); the ring refuses 10.0.0.1 at 22:14:02, where its bucket of
//!   22:13:01-02 still counts whole, and so admits it at 22:14:11, where
//!   the exact log is full;
//! - rule `path_/login` (2 every 10 s, two conservative buckets): all three
//!   refuse 22:13:04 and two of the four at 22:14:01-03; only the ring
//!   still counts 22:14:01-02 at 22:14:12.

use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Output};

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../slidegate-whatif/tests/data");

fn data(name: &str) -> String {
    format!("{DATA}/{name}")
}

fn slidegate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_slidegate"))
        .args(args)
        .output()
        .expect("the binary runs")
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A file in this test binary's scratch directory, written with `contents`.
fn scratch(name: &str, contents: &[u8]) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("simulate_whatif-{name}"));
    std::fs::write(&path, contents).expect("the scratch file is written");
    path
}

/// The what-if replay of the committed log with `more` flags.
fn whatif(log: &str, more: &[&str]) -> Output {
    let config = data("config.yaml");
    let mut args = vec![
        "simulate",
        "--config",
        &config,
        "--domain",
        "shop",
        "--descriptor",
        "remote_address=client",
        "--other-descriptor",
        "path=path",
        "--trace",
        log,
    ];
    args.extend_from_slice(more);
    slidegate(&args)
}

#[test]
fn the_table_shows_every_rule_in_three_views() {
    let log = data("access.log");
    let out = stdout(&whatif(&log, &[]));
    let expected = format!(
        "what-if replay of domain `shop` of {config}, descriptors [remote_address=client] [path=path]
{log}: a combined log with 1 extra field, 16 lines
16 requests from 2023-11-14T22:13:00.000Z to 2023-11-14T22:14:12.000Z

rule path_/login: 2 per 10s (sliding_window n=2 conservative)
  counted by                                       matched  refused  refused_%  first refusal
  sliding_window n=2 conservative (as configured)        8        4      50.00  2023-11-14T22:13:04.000Z
  sliding_log (exact)                                    8        3      37.50  2023-11-14T22:13:04.000Z
  fixed_window                                           8        3      37.50  2023-11-14T22:13:04.000Z
  refused most, as configured: path=/login (4)
  refused most, sliding_log (exact): path=/login (3)
  refused most, fixed_window: path=/login (3)

rule remote_address: 3 per minute (sliding_window n=8 conservative)
  counted by                                       matched  refused  refused_%  first refusal
  sliding_window n=8 conservative (as configured)       16        6      37.50  2023-11-14T22:13:03.000Z
  sliding_log (exact)                                   16        6      37.50  2023-11-14T22:13:03.000Z
  fixed_window                                          16        3      18.75  2023-11-14T22:13:03.000Z
  refused most, as configured: remote_address=10.0.0.1 (3), remote_address=10.0.0.2 (3)
  refused most, sliding_log (exact): remote_address=10.0.0.1 (3), remote_address=10.0.0.2 (3)
  refused most, fixed_window: remote_address=10.0.0.1 (3)
",
        config = data("config.yaml")
    );
    assert_eq!(out, expected);
}

#[test]
fn csv_has_a_row_per_rule_and_view() {
    let out = stdout(&whatif(&data("access.log"), &["--format", "csv"]));
    assert_eq!(
        out,
        "rule,limits,counted_by,matched,refused,refused_pct,first_refusal,top_refused
path_/login,2 per 10s (sliding_window n=2 conservative),sliding_window n=2 conservative,8,4,50.00,2023-11-14T22:13:04.000Z,path=/login 4
path_/login,2 per 10s (sliding_window n=2 conservative),sliding_log (exact),8,3,37.50,2023-11-14T22:13:04.000Z,path=/login 3
path_/login,2 per 10s (sliding_window n=2 conservative),fixed_window,8,3,37.50,2023-11-14T22:13:04.000Z,path=/login 3
remote_address,3 per minute (sliding_window n=8 conservative),sliding_window n=8 conservative,16,6,37.50,2023-11-14T22:13:03.000Z,remote_address=10.0.0.1 3; remote_address=10.0.0.2 3
remote_address,3 per minute (sliding_window n=8 conservative),sliding_log (exact),16,6,37.50,2023-11-14T22:13:03.000Z,remote_address=10.0.0.1 3; remote_address=10.0.0.2 3
remote_address,3 per minute (sliding_window n=8 conservative),fixed_window,16,3,18.75,2023-11-14T22:13:03.000Z,remote_address=10.0.0.1 3
"
    );
}

#[test]
fn json_carries_the_same_figures() {
    let out = stdout(&whatif(&data("access.log"), &["--format", "json"]));
    let report: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(
        (report["lines"].as_u64(), report["requests"].as_u64()),
        (Some(16), Some(16))
    );
    let figures: Vec<(String, String, u64, u64, Value)> = report["rules"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|rule| {
            rule["views"].as_array().unwrap().iter().map(move |v| {
                (
                    rule["rule"].as_str().unwrap().to_owned(),
                    v["view"].as_str().unwrap().to_owned(),
                    v["matched"].as_u64().unwrap(),
                    v["refused"].as_u64().unwrap(),
                    v["top_refused"].clone(),
                )
            })
        })
        .collect();
    let top = |pairs: &[(&str, u64)]| -> Value {
        pairs
            .iter()
            .map(|(key, n)| serde_json::json!({"key": key, "refused": n, "at_most_over": 0}))
            .collect()
    };
    let (one, two) = ("remote_address=10.0.0.1", "remote_address=10.0.0.2");
    let expect =
        |rule: &str, view: &str, matched, refused, t: Value| (rule.to_owned(), view.to_owned(), matched, refused, t);
    assert_eq!(
        figures,
        vec![
            expect("path_/login", "as_configured", 8, 4, top(&[("path=/login", 4)])),
            expect("path_/login", "sliding_log", 8, 3, top(&[("path=/login", 3)])),
            expect("path_/login", "fixed_window", 8, 3, top(&[("path=/login", 3)])),
            expect("remote_address", "as_configured", 16, 6, top(&[(one, 3), (two, 3)])),
            expect("remote_address", "sliding_log", 16, 6, top(&[(one, 3), (two, 3)])),
            expect("remote_address", "fixed_window", 16, 3, top(&[(one, 3)])),
        ]
    );
}

#[test]
fn a_gzip_log_and_a_literal_entry_replay_alike() {
    use flate2::{Compression, write::GzEncoder};
    use std::io::Write;
    let text = std::fs::read(data("access.log")).unwrap();
    let mut gz = GzEncoder::new(Vec::new(), Compression::default());
    gz.write_all(&text).unwrap();
    let log = scratch("access.log.gz", &gz.finish().unwrap());
    let config = data("config.yaml");
    // One descriptor of two entries: no rule matches it, and the second
    // descriptor is the login rule's, from a fixed value.
    let out = stdout(&slidegate(&[
        "simulate",
        "--config",
        &config,
        "--domain",
        "shop",
        "--descriptor",
        "remote_address=client",
        "--descriptor",
        "method=method",
        "--other-descriptor",
        "path=literal:/login",
        "--trace",
        log.to_str().unwrap(),
        "--format",
        "csv",
    ]));
    let rows: Vec<&str> = out.lines().skip(1).collect();
    // Every request is a /login request now: 16 matched.
    assert_eq!(rows.len(), 3, "{out}");
    assert!(
        rows[0]
            .starts_with("path_/login,2 per 10s (sliding_window n=2 conservative),sliding_window n=2 conservative,16,")
    );
}

#[test]
fn plots_are_written_per_rule() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("simulate_whatif-plots");
    let _ = std::fs::remove_dir_all(&dir);
    let out = whatif(&data("access.log"), &["--plot", dir.to_str().unwrap()]);
    stdout(&out);
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            "whatif-refusals.png",
            "whatif-refusals.svg",
            "whatif-rule-path__login-refusals.png",
            "whatif-rule-path__login-refusals.svg",
            "whatif-rule-remote_address-refusals.png",
            "whatif-rule-remote_address-refusals.svg",
        ]
    );
    let svg = std::fs::read_to_string(dir.join("whatif-rule-remote_address-refusals.svg")).unwrap();
    // One line per way of counting, its total (the table's) in the legend,
    // whole; the log's clock time across.
    for label in [
        "as configured (sliding_window n=8 conservative): 6 refused",
        "sliding_log (exact): 6 refused",
        "fixed_window: 3 refused",
        "rule remote_address (3 per minute): requests refused so far",
        "refused requests so far",
        "time (UTC) on 2023-11-14",
    ] {
        assert!(svg.contains(&format!(">\n{label}\n</text>")), "`{label}` missing");
    }
    // Each line only rises (SVG's y grows downwards): refusals so far.
    let lines: Vec<Vec<i64>> = svg
        .lines()
        .filter(|l| l.starts_with("<polyline"))
        .filter_map(|l| {
            let points = l.split("points=\"").nth(1)?.split('"').next()?;
            let ys: Vec<i64> = points
                .split_whitespace()
                .filter_map(|p| p.split(',').nth(1)?.parse().ok())
                .collect();
            // Not a legend swatch (two points on one row).
            (ys.len() > 2).then_some(ys)
        })
        .collect();
    assert_eq!(lines.len(), 3, "{svg:.2000}");
    for ys in &lines {
        assert!(ys.windows(2).all(|w| w[1] <= w[0]), "{ys:?}");
    }
}

#[test]
fn errors_name_what_is_wrong() {
    let log = data("access.log");
    let config = data("config.yaml");
    // Exit code 2 for what the flags' parser refuses, 1 for the rest.
    let run = |args: &[&str]| {
        let out = slidegate(args);
        let e = stderr(&out);
        let usage = e.contains("For more information, try '--help'.");
        assert_eq!(out.status.code(), Some(if usage { 2 } else { 1 }), "{e}");
        e
    };
    // A what-if replay of `config` with one descriptor entry, as given.
    let whatif_of = |config: &str, domain: Option<&str>, entry: &str, log: &str, more: &[&str]| {
        let mut args = vec!["simulate", "--config", config];
        if let Some(domain) = domain {
            args.extend(["--domain", domain]);
        }
        args.extend(["--descriptor", entry, "--trace", log]);
        args.extend_from_slice(more);
        run(&args)
    };
    // A domain the config does not have.
    let e = whatif_of(&config, Some("nope"), "a=client", &log, &[]);
    assert_eq!(e, "error: domain `nope` is not in the config: it has `shop`\n");
    // A field the log's format does not have.
    let e = whatif_of(&config, Some("shop"), "a=cookie", &log, &[]);
    assert!(
        e.starts_with(&format!(
            "error: field `cookie` is not in {log}, a combined log with 1 extra field: expected one of "
        )),
        "{e}"
    );
    // A descriptor entry that is not KEY=FIELD.
    let e = whatif_of(&config, Some("shop"), "client", &log, &[]);
    assert!(e.contains("`client` is not KEY=FIELD"), "{e}");
    // --config without --domain, and with the accuracy flags.
    let e = whatif_of(&config, None, "a=client", &log, &[]);
    assert!(e.contains("--domain <NAME>"), "{e}");
    let e = whatif_of(&config, Some("shop"), "a=client", &log, &["--limit", "5"]);
    assert!(e.contains("'--config <PATH>' cannot be used with '--limit <N>'"), "{e}");
    // A config that does not load: its file, line and reason.
    let bad = scratch(
        "bad.yaml",
        b"domain: shop\ndescriptors:\n  - key: a\n    rate_limit: { unit: fortnight, requests_per_unit: 1 }\n",
    );
    let e = whatif_of(bad.to_str().unwrap(), Some("shop"), "a=client", &log, &[]);
    assert!(e.starts_with(&format!("error: {}:4", bad.display())), "{e}");
    // A log of unreadable lines: what was assumed, and why each failed.
    let empty = scratch(
        "junk.log",
        b"1.2.3.4 - - [10/Okt/2023:13:55:36 +0000] \"GET / HTTP/1.1\" 200 5\n",
    );
    let e = whatif_of(&config, Some("shop"), "a=client", empty.to_str().unwrap(), &[]);
    assert_eq!(
        e,
        format!(
            "error: no requests in {}: all 1 non-empty line is malformed as a Common Log Format log; line 1: unknown month \
             `Okt`: `1.2.3.4 - - [10/Okt/2023:13:55:36 +0000] \"GET / HTTP/1.1\" 200 5`; name the format with \
             --trace-format (and --log-format for an nginx or Apache format string)\n",
            empty.display()
        )
    );
}
