//! `slidegate bench` as a process: every case beside its baseline, in JSON.

use serde_json::Value;
use std::process::Command;

#[test]
fn algorithms_and_store_beside_their_baselines() {
    let out = Command::new(env!("CARGO_BIN_EXE_slidegate"))
        .args([
            "bench",
            "--only",
            "algorithms,store",
            "--time",
            "20ms",
            "--keys",
            "1000",
            "--format",
            "json",
        ])
        .output()
        .expect("the binary runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let cases: Vec<Value> = serde_json::from_slice(&out.stdout).expect("JSON output");
    // The governor baseline, then the six algorithms; two baselines and
    // two store cases.
    assert_eq!(cases.len(), 7 + 4, "{cases:#?}");
    for case in &cases {
        assert!(case["per_second"].as_f64().is_some_and(|v| v > 0.0), "{case}");
        match case["baseline"].as_str() {
            Some(baseline) => {
                let base = cases
                    .iter()
                    .find(|c| c["name"] == baseline)
                    .expect("the baseline is in the run");
                let ratio = case["per_second"].as_f64().unwrap() / base["per_second"].as_f64().unwrap();
                assert!((case["ratio"].as_f64().unwrap() - ratio).abs() < 1e-9, "{case}");
            }
            None => assert!(case["ratio"].is_null(), "{case}"),
        }
    }
    assert!(
        cases
            .iter()
            .any(|c| c["name"] == "sliding_window n=8 conservative check")
    );
    assert!(
        cases
            .iter()
            .any(|c| c["group"] == "store" && c["name"].as_str().unwrap().contains("1000 keys"))
    );
}

#[test]
fn the_service_answers_over_loopback() {
    let out = Command::new(env!("CARGO_BIN_EXE_slidegate"))
        .args([
            "bench",
            "--only",
            "service",
            "--time",
            "100ms",
            "--concurrency",
            "4",
            "--format",
            "json",
        ])
        .output()
        .expect("the binary runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let cases: Vec<Value> = serde_json::from_slice(&out.stdout).expect("JSON output");
    assert_eq!(cases.len(), 2);
    for case in &cases {
        assert!(case["per_second"].as_f64().is_some_and(|v| v > 0.0), "{case}");
        let (p50, p99) = (case["p50_us"].as_f64().unwrap(), case["p99_us"].as_f64().unwrap());
        assert!(p50 > 0.0 && p50 <= p99, "{case}");
    }
}

#[test]
fn bad_flags_are_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_slidegate"))
        .args(["bench", "--keys", "0"])
        .output()
        .expect("the binary runs");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--keys 0"));
}
