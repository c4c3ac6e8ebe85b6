//! `slidegate check` as a process: a good config, a bad one, one with a
//! warning, and one without a Redis form.

use std::process::Command;

/// Runs `slidegate check` on `yaml` (one file) with `extra` flags; the exit
/// code, stdout and stderr.
fn check(name: &str, yaml: &str, extra: &[&str]) -> (Option<i32>, String, String) {
    check_files(name, &[("d.yaml", yaml)], extra)
}

/// Runs `slidegate check` on `files` (name, text), each given with
/// `--config`, with `extra` flags.
fn check_files(name: &str, files: &[(&str, &str)], extra: &[&str]) -> (Option<i32>, String, String) {
    let dir = std::path::PathBuf::from(dir(name));
    std::fs::create_dir_all(&dir).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_slidegate"));
    command.arg("check");
    for (file, yaml) in files {
        std::fs::write(dir.join(file), yaml).unwrap();
        command.arg("--config").arg(dir.join(file));
    }
    let out = command.args(extra).output().unwrap();
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

#[test]
fn every_error_of_every_file_is_printed_once_in_file_order() {
    let first = "domain: shop\ndescriptors:\n  - key: user\n    rate_limit: { unit: fortnight, requests_per_unit: 5 }\n  - key: ok\n    rate_limit: { unit: minute, requests_per_unit: 3 }\n    descriptors:\n      - key: sub\n        rate_limit: { unit: second, requests_per_unit: 1, bogus: 2 }\n  - key: ok\n    rate_limit: { unit: minute, requests_per_unit: 1 }\n";
    let second = "domain: api\ndescriptors:\n  - key: path\n    rate_limit: { unit: minute, requests_per_unit: -3 }\n";
    let good = "domain: web\ndescriptors: []\n";
    let (code, stdout, stderr) = check_files(
        "every",
        &[
            ("a.yaml", first),
            ("b.yaml", second),
            ("c.yaml", good),
            ("d.yaml", good),
        ],
        &[],
    );
    assert_eq!(code, Some(1));
    assert!(stdout.is_empty(), "{stdout}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 5, "{stderr}");
    assert!(lines.iter().all(|l| l.starts_with("error: ")), "{stderr}");
    let places = [
        "a.yaml:4:25: rate_limit.unit",
        "a.yaml:9:",
        "a.yaml:10:",
        "b.yaml:4:",
        "d.yaml:1:",
    ];
    for (line, place) in lines.iter().zip(places) {
        assert!(line.contains(place), "{line} lacks {place}");
    }
    assert!(lines[1].contains("bogus"), "{}", lines[1]);
    assert!(lines[2].contains("duplicate descriptor"), "{}", lines[2]);
    assert!(lines[4].contains("already defined"), "{}", lines[4]);
}

/// A descriptor with several errors (an unknown key, a bad unit and a
/// negative number) has each printed once, with its file, line, column
/// and field, in file order.
#[test]
fn every_error_of_one_descriptor_is_printed_once() {
    let (code, stdout, stderr) = check("several", SEVERAL_ERRORS, &[]);
    assert_eq!(code, Some(1));
    assert!(stdout.is_empty(), "{stdout}");
    let lines: Vec<&str> = stderr.lines().collect();
    let places = [
        "d.yaml:4:5: bogus: unknown key",
        "d.yaml:5:25: rate_limit.unit: unknown unit `fortnight`",
        "d.yaml:5:55: rate_limit.requests_per_unit:",
    ];
    assert_eq!(lines.len(), places.len(), "{stderr}");
    for (line, place) in lines.iter().zip(places) {
        assert!(
            line.starts_with("error: ") && line.contains(place),
            "{line} lacks {place}"
        );
    }
}

/// One descriptor, three errors.
const SEVERAL_ERRORS: &str = "domain: shop\ndescriptors:\n  - key: user\n    bogus: 1\n    rate_limit: { unit: fortnight, requests_per_unit: -5 }\n";

#[test]
fn every_limit_without_a_redis_form_is_named() {
    let yaml = "domain: shop\ndescriptors:\n  - key: a\n    rate_limit: { unit: minute, requests_per_unit: 5, algorithm: exponential_histogram }\n  - key: b\n    rate_limit: { unit: minute, requests_per_unit: 5 }\n  - key: c\n    rate_limit: { unit: hour, requests_per_unit: 5, algorithm: exponential_histogram }\n";
    let (code, _, stderr) = check("redis-all", yaml, &["--redis"]);
    assert_eq!(code, Some(1));
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 2, "{stderr}");
    assert!(
        lines[0].contains("d.yaml:3:") && lines[0].contains("descriptor `a`"),
        "{stderr}"
    );
    assert!(
        lines[1].contains("d.yaml:7:") && lines[1].contains("descriptor `c`"),
        "{stderr}"
    );
}

/// A domain with a wildcard rule, a nested rule, a replacement and an
/// unlimited value.
const EXPLAINED: &str = "domain: api\ndescriptors:\n  - key: user\n    value: \"*\"\n    rate_limit: { unit: minute, requests_per_unit: 5, name: per_user }\n    descriptors:\n      - key: plan\n        value: free\n        rate_limits:\n          - { unit: second, requests_per_unit: 1, name: burst }\n          - { unit: hour, requests_per_unit: 100, replaces: [{ name: burst }] }\n  - key: user\n    value: alice\n    rate_limit: { unlimited: true }\n";

#[test]
fn explain_names_the_rule_and_the_limits_that_apply() {
    let explain = |words: &[&str]| {
        let mut args = vec!["--explain"];
        args.extend_from_slice(words);
        let (code, stdout, stderr) = check("explain", EXPLAINED, &args);
        assert_eq!(code, Some(0), "{stderr}");
        stdout.lines().skip(2).map(str::to_owned).collect::<Vec<_>>()
    };
    assert_eq!(
        explain(&["api", "user=bob"]),
        [
            "[user=bob] matches `user=*` at DIR/d.yaml:3:5".to_owned(),
            "  limit `per_user`: 5 per 60s by sliding_window(buckets=8, weighting=conservative)".to_owned(),
            "  counter key: 3:api4:user3:bob".to_owned(),
        ]
        .map(|l| l.replace("DIR/", &format!("{}/", dir("explain"))))
    );
    let nested = explain(&["api", "user=bob", "plan=free"]);
    assert!(
        nested[0].starts_with("[user=bob, plan=free] matches `plan=free` at "),
        "{nested:?}"
    );
    assert!(nested[0].ends_with("d.yaml:7:9"), "{nested:?}");
    assert!(
        nested[1].contains("`burst`: 1 per 1s") && nested[1].contains("does not apply"),
        "{nested:?}"
    );
    assert!(
        nested[2].contains("100 per 3600s") && !nested[2].contains("does not apply"),
        "{nested:?}"
    );
    let alice = explain(&["api", "user=alice"]);
    assert_eq!(alice[1], "  unlimited: every request is admitted", "{alice:?}");
    assert_eq!(
        explain(&["api", "path=/x"]),
        ["[path=/x] matches no rule of domain `api`: not limited"]
    );
    let (code, _, stderr) = check("explain-bad", EXPLAINED, &["--explain", "nowhere", "a=b"]);
    assert_eq!(
        (code, stderr.trim_end()),
        (Some(1), "error: --explain: no domain `nowhere` in the config")
    );
    let (code, _, stderr) = check("explain-bad", EXPLAINED, &["--explain", "api", "user"]);
    assert_eq!(
        (code, stderr.trim_end()),
        (Some(1), "error: --explain: `user` is not KEY=VALUE")
    );
}

/// A domain with a descriptor and quota bucket rules.
const QUOTA: &str = "domain: edge\ndescriptors:\n  - key: route\n    rate_limit: { unit: second, requests_per_unit: 9 }\nquota_buckets:\n  - name: checkout\n    bucket_id: { route: checkout, tenant: \"*\" }\n    absent: [beta]\n    rate_limit: { unit: minute, requests_per_unit: 600 }\n  - bucket_id: { route: free }\n    rate_limit: { unlimited: true }\n";

#[test]
fn explain_names_the_quota_rule_of_a_bucket_id() {
    let explain = |words: &[&str]| {
        let mut args = vec!["--explain"];
        args.extend_from_slice(words);
        let (code, stdout, stderr) = check("explain-quota", QUOTA, &args);
        assert_eq!(code, Some(0), "{stderr}");
        assert!(
            stdout.contains("domain `edge` (") && stdout.contains("): 1 descriptors, 1 limits, 2 quota rules"),
            "{stdout}"
        );
        stdout
            .lines()
            .skip(2)
            .map(|l| l.replace(&format!("{}/", dir("explain-quota")), "DIR/"))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        explain(&["edge", "route=checkout", "tenant=acme"]),
        [
            "[route=checkout, tenant=acme] matches no rule of domain `edge`: not limited",
            "bucket id {route=checkout, tenant=acme} matches quota rule `checkout` at DIR/d.yaml:6:5",
            "  limit: 600 per 1m, shared between the Envoys that report the bucket: together at most that in any window of its length",
        ]
    );
    assert_eq!(
        explain(&["edge", "route=free"]),
        [
            "[route=free] matches `route` at DIR/d.yaml:3:5",
            "  limit: 9 per 1s by sliding_window(buckets=8, weighting=conservative)",
            "  counter key: 4:edge5:route4:free",
            "bucket id {route=free} matches quota rule `route_free` at DIR/d.yaml:10:5",
            "  unlimited: ALLOW_ALL, every request admitted",
        ]
    );
    assert_eq!(
        explain(&["edge", "route=checkout", "tenant=acme", "beta=1"])[1],
        "bucket id {route=checkout, tenant=acme, beta=1}: no quota bucket rule matches: Envoy keeps its \
         no_assignment_behavior"
    );
}

/// The folder [`check_files`] writes `name`'s files to.
fn dir(name: &str) -> String {
    std::env::temp_dir()
        .join(format!("slidegate-check-{name}-{}", std::process::id()))
        .display()
        .to_string()
}

/// A folder without a config file, or an empty file, is an error naming
/// it, as `serve` refuses to start from it (not `ok: 0 domains`).
#[test]
fn an_empty_folder_or_file_is_an_error_naming_it() {
    let folder = std::path::PathBuf::from(dir("empty-folder"));
    std::fs::create_dir_all(&folder).unwrap();
    let check = |path: &std::path::Path| {
        let out = Command::new(env!("CARGO_BIN_EXE_slidegate"))
            .arg("check")
            .arg("--config")
            .arg(path)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, stdout, stderr) = check(&folder);
    assert_eq!((code, stdout.as_str()), (Some(1), ""), "{stderr}");
    assert_eq!(
        stderr.trim_end(),
        format!(
            "error: {}: no config file in this folder (a `*.yaml` or `*.yml` file whose name does not start with \
             `.`): it would serve no limit",
            folder.display()
        )
    );
    let file = folder.join("d.yaml");
    std::fs::write(&file, "").unwrap();
    for path in [&folder, &file] {
        let (code, stdout, stderr) = check(path);
        assert_eq!((code, stdout.as_str()), (Some(1), ""), "{stderr}");
        assert_eq!(
            stderr.trim_end(),
            format!(
                "error: {}:1:1: empty file: expected a mapping with `domain`",
                file.display()
            )
        );
    }
    let _ = std::fs::remove_dir_all(&folder);
}
