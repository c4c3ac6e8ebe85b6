//! `deploy/systemd/slidegate.service`: `systemd-analyze verify` on the unit
//! (its ExecStart pointed at the built binary), and the unit's ExecStart,
//! Environment=, ExecReload and KillSignal on the built binary: it starts,
//! reloads on the reload signal, and exits 0 on the stop signal within
//! TimeoutStopSec.

use crate::common::{self, next_line};
use crate::kubernetes::{
    exits_within, flag_value, limit_applied, listening, message, seconds, set_flag, stop_budget, wait_for,
};
use crate::{read, run, shown};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

const SYSTEMD: &str = "apt-get install systemd (for systemd-analyze)";

/// The unit's text.
fn unit_text() -> String {
    read("systemd/slidegate.service")
}

/// The unit's settings, in order: section, key, value (continued lines
/// joined, comments left out).
fn settings(text: &str) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let mut section = String::new();
    let mut pending = String::new();
    for line in text.lines() {
        let line = line.trim();
        if pending.is_empty() && (line.is_empty() || line.starts_with('#') || line.starts_with(';')) {
            continue;
        }
        if let Some(continued) = line.strip_suffix('\\') {
            pending.push_str(continued);
            pending.push(' ');
            continue;
        }
        let whole = std::mem::take(&mut pending) + line;
        if let Some(name) = whole.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_owned();
        } else {
            let (key, value) = whole
                .split_once('=')
                .unwrap_or_else(|| panic!("not KEY=VALUE: {whole}"));
            out.push((section.clone(), key.trim().to_owned(), value.trim().to_owned()));
        }
    }
    out
}

/// Every value of `key` in `[section]`.
fn values(settings: &[(String, String, String)], section: &str, key: &str) -> Vec<String> {
    settings
        .iter()
        .filter(|(s, k, _)| s == section && k == key)
        .map(|(_, _, v)| v.clone())
        .collect()
}

/// The one value of `key` in `[section]`.
fn value(settings: &[(String, String, String)], section: &str, key: &str) -> String {
    let found = values(settings, section, key);
    assert_eq!(found.len(), 1, "[{section}] {key}: {found:?}");
    found[0].clone()
}

/// A command line of the unit, as words: the test reads none with quotes
/// or specifiers, which systemd would expand.
fn words(command: &str) -> Vec<String> {
    assert!(
        !command.contains(['"', '\'', '%']),
        "{command}: quotes and specifiers are not read here"
    );
    command.split_whitespace().map(str::to_owned).collect()
}

#[test]
fn systemd_analyze_verifies_the_unit() {
    let text = unit_text();
    let built = env!("CARGO_BIN_EXE_slidegate");
    // systemd-analyze checks that ExecStart's program exists: the built one.
    let with_built = |text: &str| -> String {
        let mut replaced = 0;
        let lines: Vec<String> = text
            .lines()
            .map(|line| match line.strip_prefix("ExecStart=") {
                Some(command) => {
                    replaced += 1;
                    let (_, args) = command.split_once(' ').unwrap_or((command, ""));
                    format!("ExecStart={built} {args}")
                }
                None => line.to_owned(),
            })
            .collect();
        assert_eq!(replaced, 1, "one ExecStart=");
        lines.join("\n") + "\n"
    };
    let dir = common::fresh("systemd-verify");
    let verify = |text: &str| {
        let path = dir.join("slidegate.service");
        std::fs::write(&path, text).unwrap();
        run("systemd-analyze", &["verify", path.to_str().unwrap()], SYSTEMD)
    };
    let out = verify(&with_built(&text));
    assert!(out.status.success(), "{}", shown(&out));
    // Not a line of warning either: an unknown or misplaced key is only a
    // warning, exit 0.
    assert!(out.stderr.is_empty(), "{}", shown(&out));
    // Which a key misspelt does bring.
    let misspelt = with_built(&text).replace("KillSignal=", "KillSignall=");
    let out = verify(&misspelt);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Unknown key 'KillSignall'"),
        "{}",
        shown(&out)
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn the_unit_starts_reloads_and_stops_slidegate() {
    let unit = settings(&unit_text());
    // The server does not speak sd_notify: systemd must not wait for it.
    let crates = std::fs::read_dir(crate::root().join("crates")).unwrap();
    let sources: Vec<_> = crates
        .map(|c| c.unwrap().path().join("src"))
        .filter(|s| s.is_dir())
        .collect();
    assert!(!sources.is_empty());
    assert!(
        !sources.iter().any(|src| mentions(src, "NOTIFY_SOCKET")),
        "the server speaks sd_notify now: Type=notify"
    );
    assert_eq!(value(&unit, "Service", "Type"), "exec");

    let mut args = words(&value(&unit, "Service", "ExecStart"));
    let program = args.remove(0);
    assert_eq!(program, "/usr/local/bin/slidegate");
    assert_eq!(args[0], "serve");
    // Loopback listeners by default, on free ports here.
    for flag in ["--http", "--grpc"] {
        let address = flag_value(&args, flag).unwrap_or_else(|| panic!("ExecStart sets {flag}"));
        assert!(
            address.starts_with("127.0.0.1:"),
            "{flag} {address}: loopback by default"
        );
        set_flag(&mut args, flag, "127.0.0.1:0");
    }
    let dir = common::fresh("systemd-unit");
    let config = flag_value(&args, "--config").expect("ExecStart sets --config");
    assert_eq!(config, "/etc/slidegate");
    set_flag(&mut args, "--config", dir.to_str().unwrap());
    let file = dir.join("d.yaml");
    let limit = |n: u32| {
        format!("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{ unit: hour, requests_per_unit: {n} }}\n")
    };
    std::fs::write(&file, limit(5)).unwrap();

    let mut environment = BTreeMap::new();
    for line in values(&unit, "Service", "Environment") {
        for assignment in words(&line) {
            let (name, value) = assignment.split_once('=').unwrap();
            environment.insert(name.to_owned(), value.to_owned());
        }
    }
    let file_env = value(&unit, "Service", "EnvironmentFile");
    assert!(
        file_env.starts_with('-'),
        "{file_env}: optional, or a machine without it cannot start"
    );

    // TimeoutStopSec covers the drain delay and the longest request.
    let (drain, request) = stop_budget(&args, &environment);
    let timeout = seconds(&value(&unit, "Service", "TimeoutStopSec"));
    assert!(drain > 0.0, "drain-aware: --drain-delay {drain} s");
    assert!(
        timeout > drain + request,
        "TimeoutStopSec {timeout} <= --drain-delay {drain} + --request-timeout {request}"
    );

    let mut command = common::slidegate();
    command.args(&args).envs(&environment);
    let (child, lines) = common::spawn_logging(&mut command);
    let mut log = Vec::new();
    let (http, _) = next_line(&lines, &mut log, listening);
    assert_eq!(limit_applied(&http, "d", ("k", "v")), 5);

    // ExecReload: `/bin/kill -HUP $MAINPID` reloads the changed file.
    let reload = words(&value(&unit, "Service", "ExecReload"));
    assert_eq!(reload.len(), 3, "{reload:?}");
    assert_eq!(Path::new(&reload[0]).file_name().unwrap(), "kill");
    assert_eq!(reload[2], "$MAINPID");
    let hup = reload[1].strip_prefix('-').expect("kill -SIGNAL");
    std::fs::write(&file, limit(6)).unwrap();
    common::signal(hup, &child);
    wait_for(&lines, &mut log, &format!("SIG{hup}: reloading the config"));
    let reloaded = wait_for(&lines, &mut log, "config reload");
    assert!(message(&reloaded).starts_with("config reloaded"), "{log:#?}");
    assert_eq!(limit_applied(&http, "d", ("k", "v")), 6);

    // KillSignal: a drained stop, exit 0 within TimeoutStopSec.
    let kill = value(&unit, "Service", "KillSignal");
    let term = kill.strip_prefix("SIG").expect("KillSignal=SIGNAME");
    common::signal(term, &child);
    wait_for(&lines, &mut log, "shutting down");
    assert_eq!(
        exits_within(child, Duration::from_secs_f64(timeout)),
        Some(0),
        "{log:#?}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// Whether a Rust source file under `dir` mentions `needle`.
fn mentions(dir: &Path, needle: &str) -> bool {
    std::fs::read_dir(dir).unwrap().any(|entry| {
        let path = entry.unwrap().path();
        if path.is_dir() {
            mentions(&path, needle)
        } else {
            path.extension().is_some_and(|e| e == "rs") && std::fs::read_to_string(&path).unwrap().contains(needle)
        }
    })
}
