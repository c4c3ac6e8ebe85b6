//! `slidegate check` as a process: a good config, a bad one, one with a
//! warning, and one without a Redis form.

use std::process::Command;

/// Runs `slidegate check` on `yaml` (one file) with `extra` flags; the exit
/// code, stdout and stderr.
fn check(name: &str, yaml: &str, extra: &[&str]) -> (Option<i32>, String, String) {
    let dir = std::env::temp_dir().join(format!("slidegate-check-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("d.yaml");
    std::fs::write(&file, yaml).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_slidegate"))
        .arg("check")
        .arg("--config")
        .arg(&file)
        .args(extra)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_good_config_is_summed_up() {
    let yaml = "domain: shop\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 5 }\n    descriptors:\n      - key: path\n        rate_limit: { unit: second, requests_per_unit: 1 }\n";
    let (code, stdout, stderr) = check("good", yaml, &[]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("domain `shop`"), "{stdout}");
    assert!(stdout.contains("2 descriptors, 2 limits"), "{stdout}");
    assert!(stdout.contains("ok: 1 domains, 0 warnings"), "{stdout}");
    assert!(stderr.is_empty(), "{stderr}");
}

#[test]
fn a_bad_config_fails_with_the_place_once() {
    let yaml = "domain: shop\ndescriptors:\n  - key: user\n    rate_limit: { unit: fortnight, requests_per_unit: 5 }\n";
    let (code, stdout, stderr) = check("bad", yaml, &[]);
    assert_eq!(code, Some(1));
    assert!(stdout.is_empty(), "{stdout}");
    assert!(stderr.contains("d.yaml:4:"), "{stderr}");
    assert!(stderr.contains("fortnight"), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
}

#[test]
fn warnings_are_printed_and_the_config_passes() {
    let yaml = "domain: shop\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute }\n";
    let (code, stdout, stderr) = check("warn", yaml, &[]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.starts_with("warning: "), "{stderr}");
    assert!(stderr.contains("requests_per_unit"), "{stderr}");
    assert!(stdout.contains("1 warnings"), "{stdout}");
}

#[test]
fn redis_forms_are_checked_without_connecting() {
    let yaml = "domain: shop\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 5, algorithm: exponential_histogram }\n";
    assert_eq!(check("memory", yaml, &[]).0, Some(0));
    let (code, _, stderr) = check("redis", yaml, &["--redis"]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("d.yaml:3:"), "{stderr}");
    assert!(stderr.contains("exponential_histogram"), "{stderr}");
    let fine = "domain: shop\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 5 }\n";
    let (code, stdout, _) = check("redis-ok", fine, &["--redis"]);
    assert_eq!(code, Some(0));
    assert!(stdout.contains("every limit has a Redis form"), "{stdout}");
}
