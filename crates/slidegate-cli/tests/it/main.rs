//! Runs the built `slidegate` binary as a user would.

use serde_json::Value;
use std::process::{Command, Output};

fn slidegate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_slidegate"))
        .args(args)
        .output()
        .expect("the binary runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The end-of-bucket attack: about 2·limit for the interpolated window, at
/// most the limit for the conservative one.
#[test]
fn adversary_doubles_interpolated_but_not_conservative() {
    let out = slidegate(&[
        "simulate",
        "--traffic",
        "adversary",
        "--algorithm",
        "sliding_window",
        "--buckets",
        "8",
        "--weighting",
        "both",
        "--limit",
        "100",
        "--window",
        "60s",
        "--format",
        "json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let rows: Vec<Value> = serde_json::from_slice(&out.stdout).expect("JSON output");
    assert_eq!(rows.len(), 2);
    let ratio = |weighting: &str| {
        let row = rows
            .iter()
            .find(|r| r["weighting"] == weighting)
            .expect("a row per weighting");
        assert_eq!(row["algorithm"], "sliding_window");
        assert_eq!(row["buckets"], 8);
        assert_eq!(row["traffic"], "adversary");
        row["max_window_ratio"].as_f64().expect("a number")
    };
    let interpolated = ratio("interpolated");
    assert!(interpolated > 1.9 && interpolated < 2.0, "{interpolated}");
    let conservative = ratio("conservative");
    assert!(conservative <= 1.0, "{conservative}");
}

#[test]
fn bad_values_fail_with_the_value_named() {
    for (args, value) in [
        (&["simulate", "--window", "5parsecs"][..], "5parsecs"),
        (&["simulate", "--limit", "0"][..], "invalid limit `0`"),
        (&["simulate", "--buckets", "1"][..], "invalid buckets `1`"),
        (&["simulate", "--duration", "10"][..], "missing unit"),
        (&["simulate", "--format", "xml"][..], "xml"),
        (&["simulate", "--algorithm", "leaky_bucket"][..], "leaky_bucket"),
    ] {
        let out = slidegate(args);
        assert!(!out.status.success(), "{args:?} succeeded");
        let err = stderr(&out);
        assert!(err.contains(value), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}: nothing is printed before the error");
    }
}

#[test]
fn csv_and_table_formats() {
    let out = slidegate(&[
        "simulate",
        "--traffic",
        "poisson",
        "--algorithm",
        "sliding_log",
        "--format",
        "csv",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let csv = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 2, "{csv}");
    assert!(lines[0].starts_with("algorithm,buckets,weighting,"));
    assert!(lines[1].starts_with("sliding_log,,,,,poisson,100,60000000000,"));

    let out = slidegate(&[
        "simulate",
        "--traffic",
        "poisson",
        "--algorithm",
        "gcra",
        "--burst",
        "1",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(table.contains("burst=1 "), "{table}");
}
