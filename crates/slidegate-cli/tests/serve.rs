//! `slidegate serve` as a process: it starts, answers, and stops cleanly on
//! SIGTERM and on SIGINT; a bad config or flag stops it at once with the
//! reason; two processes on one Redis share their limits, and a Redis that
//! cannot be reached at start stops it with the reason.

#![cfg(unix)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;
mod common;
use common::{
    exit_code, fresh, listening, listening_on, next_line, request, request_with, serve_fails, serve_logging, signal,
    terminate,
};

/// Starts `slidegate serve` on free loopback ports; returns the child and
/// its HTTP address, read from the line it prints once it listens.
fn serve(extra: &[&str]) -> (std::process::Child, String) {
    let mut command = common::slidegate();
    command
        .args(["serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
        .args(extra);
    spawn_serve(command)
}

/// Spawns `command` (a `slidegate serve`); the child and its HTTP address,
/// read from the line it prints once it listens.
fn spawn_serve(mut command: Command) -> (std::process::Child, String) {
    let mut child = command
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    let stderr = child.stderr.take().expect("stderr is piped");
    let mut lines = BufReader::new(stderr).lines();
    let line = lines
        .by_ref()
        .map_while(Result::ok)
        .find(|l| l.starts_with("slidegate: HTTP on "))
        .expect("the server says where it listens");
    // Keep draining stderr so the child never blocks on it.
    std::thread::spawn(move || for _ in lines {});
    let addr = line["slidegate: HTTP on ".len()..]
        .split(',')
        .next()
        .expect("an address")
        .to_owned();
    (child, addr)
}

fn get(addr: &str, path: &str) -> String {
    request(addr, "GET", path, "")
}

/// What the gRPC health service at `grpc` answers for `name`, by the
/// generated health client.
fn grpc_health(grpc: &str, name: &str) -> tonic_health::pb::health_check_response::ServingStatus {
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let channel = common::channel(grpc).await;
        let request = HealthCheckRequest {
            service: name.to_owned(),
        };
        HealthClient::new(channel)
            .check(request)
            .await
            .unwrap()
            .into_inner()
            .status()
    })
}

/// The status line of an HTTP answer.
fn status_line(answer: &str) -> &str {
    answer.lines().next().unwrap_or_default()
}

#[test]
fn stops_cleanly_on_sigterm_and_sigint() {
    for signal in ["TERM", "INT"] {
        let (child, addr) = serve(&[]);
        assert!(get(&addr, "/healthz").starts_with("HTTP/1.1 200 OK"));
        let killed = Command::new("kill")
            .args([format!("-{signal}"), child.id().to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        assert_eq!(exit_code(child), Some(0), "after SIG{signal}");
    }
}

#[test]
fn a_bad_config_or_flag_stops_it_with_the_reason() {
    let dir = fresh("bad-config");
    let file = dir.join("bad.yaml");
    std::fs::write(
        &file,
        "domain: x\ndescriptors:\n  - key: k\n    rate_limit: { unit: second, requests_per_unit: ten }\n",
    )
    .unwrap();
    let out = common::slidegate()
        .args(["serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("bad.yaml:4:"), "{stderr}");
    assert!(stderr.contains("requests_per_unit"), "{stderr}");
    // Printed once: one line, the file named once.
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert_eq!(stderr.matches("bad.yaml").count(), 1, "{stderr}");

    let out = common::slidegate().args(["serve", "--max-body", "0"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--max-body 0"));
}

/// A config with several errors in one descriptor stops it with each of
/// them, once, one per line, as `check` prints them.
#[test]
fn a_config_with_several_errors_stops_it_with_every_one() {
    let dir = fresh("several");
    let file = dir.join("several.yaml");
    std::fs::write(
        &file,
        "domain: shop\ndescriptors:\n  - key: user\n    bogus: 1\n    rate_limit: { unit: fortnight, requests_per_unit: -5 }\n",
    )
    .unwrap();
    let (code, stderr) = serve_fails(&["--config", file.to_str().unwrap()]);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(code, Some(1), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    let places = [
        "several.yaml:4:5: bogus",
        "several.yaml:5:25: rate_limit.unit",
        "several.yaml:5:55: rate_limit.requests_per_unit",
    ];
    assert_eq!(lines.len(), places.len(), "{stderr}");
    for (line, place) in lines.iter().zip(places) {
        assert!(
            line.starts_with("error: ") && line.contains(place),
            "{line} lacks {place}"
        );
    }
}

/// Without `--config` (or `SLIDEGATE_CONFIG`) the server says once, before
/// it listens, that nothing is limited, naming the flag and the variable;
/// it serves all the same.
#[test]
fn without_a_config_it_warns_once_that_nothing_is_limited() {
    let mut child = common::slidegate()
        .args(["serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
        .env_remove("SLIDEGATE_CONFIG")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    let stderr = child.stderr.take().expect("stderr is piped");
    let mut before = Vec::new();
    let mut listening = None;
    let mut lines = BufReader::new(stderr).lines();
    for line in lines.by_ref().map_while(Result::ok) {
        if let Some(rest) = line.strip_prefix("slidegate: HTTP on ") {
            listening = rest.split(',').next().map(str::to_owned);
            break;
        }
        before.push(line);
    }
    // Keep draining stderr so the child never blocks on it.
    std::thread::spawn(move || for _ in lines {});
    let addr = listening.expect("the server says where it listens");
    let warnings: Vec<&String> = before.iter().filter(|l| l.contains("no config given")).collect();
    assert_eq!(warnings.len(), 1, "{before:#?}");
    assert!(
        warnings[0].contains("--config") && warnings[0].contains("SLIDEGATE_CONFIG"),
        "{}",
        warnings[0]
    );
    assert_eq!(status_line(&get(&addr, "/healthz")), "HTTP/1.1 200 OK");
    terminate(child);
}

#[test]
fn flags_come_from_the_environment_too() {
    let mut child = common::slidegate()
        .arg("serve")
        .env("SLIDEGATE_HTTP", "127.0.0.1:0")
        .env("SLIDEGATE_GRPC", "127.0.0.1:0")
        .env("SLIDEGATE_MAX_TEXT", "nope")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut pipe = child.stderr.take().unwrap();
    assert_eq!(exit_code(child), Some(2));
    let mut stderr = String::new();
    pipe.read_to_string(&mut stderr).unwrap();
    assert!(stderr.contains("nope"), "{stderr}");
}

/// Two processes on one Redis admit the limit once between them; one reads
/// its flags from the environment, and sends one script call per decision
/// (`SLIDEGATE_REDIS_BATCHING=off`) where the other batches.
#[test]
fn two_processes_share_one_redis() {
    let redis = slidegate_conformance::redis::RedisServer::start();
    let url = redis.url();
    let (a, a_addr) = serve(&["--redis", &url, "--redis-failure", "closed", "--admin-token", "t0ken"]);
    let mut b = common::slidegate();
    b.arg("serve")
        .env("SLIDEGATE_HTTP", "127.0.0.1:0")
        .env("SLIDEGATE_GRPC", "127.0.0.1:0")
        .env("SLIDEGATE_REDIS", &url)
        .env("SLIDEGATE_REDIS_TIMEOUT", "1s")
        .env("SLIDEGATE_REDIS_BATCHING", "off");
    let (b, b_addr) = spawn_serve(b);
    let body = r#"{"key":"shared","limit":5,"window":"1h","algorithm":"fixed_window"}"#;
    let admitted = (0..12)
        .filter(|i| {
            let addr = if i % 2 == 0 { &a_addr } else { &b_addr };
            request(addr, "POST", "/v1/check", body).starts_with("HTTP/1.1 200")
        })
        .count();
    assert_eq!(admitted, 5);
    let keys = redis.keys_and_ttls();
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert!(
        keys[0].0.starts_with("slidegate:v1:fixed_window:5:3600000000000:{"),
        "{keys:?}"
    );
    let reset = request_with(
        &a_addr,
        "POST",
        "/v1/reset",
        "authorization: Bearer t0ken\r\n",
        r#"{"key":"shared","limit":5,"window":"1h","algorithm":"fixed_window"}"#,
    );
    assert!(reset.contains(r#""reset":1"#), "{reset}");
    assert!(redis.keys_and_ttls().is_empty());
    for child in [a, b] {
        assert!(
            Command::new("kill")
                .arg(child.id().to_string())
                .status()
                .unwrap()
                .success()
        );
        assert_eq!(exit_code(child), Some(0));
    }
}

/// A bad `--redis` URL, and a Redis that does not answer, stop `serve` at
/// start with status 1 and the reason.
#[test]
fn an_unreachable_or_bad_redis_stops_it_with_the_reason() {
    let (code, stderr) = serve_fails(&["--redis", "nope://x"]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("bad Redis URL `nope://x`"), "{stderr}");
    assert_eq!(stderr.matches("nope://x").count(), 1, "{stderr}");

    // A port nothing listens on (a server started and killed).
    let port = slidegate_conformance::redis::RedisServer::start().kill();
    let url = format!("redis://127.0.0.1:{port}/");
    let (code, stderr) = serve_fails(&["--redis", &url]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains(&format!("cannot reach Redis at {url}")), "{stderr}");
    assert_eq!(stderr.matches(&url).count(), 1, "{stderr}");
}

/// A `SLIDEGATE_REDIS_BATCHING` that is no boolean, or `--no-redis-batching`
/// without `--redis`, stops `serve` at start with the reason.
#[test]
fn a_bad_redis_batching_stops_it_with_the_reason() {
    let out = common::serve_command(&["--redis", "redis://127.0.0.1:1/"])
        .env("SLIDEGATE_REDIS_BATCHING", "sometimes")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("invalid value 'sometimes' for '--redis-batching'"),
        "{stderr}"
    );
    let (code, stderr) = serve_fails(&["--no-redis-batching"]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("--redis <"), "{stderr}");
}

/// An absurd `--workers` stops `serve` at start, naming the flag once.
#[test]
fn too_many_workers_stop_it_with_the_reason() {
    let (code, stderr) = serve_fails(&["--workers", "100000"]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("--workers 100000: at most 1024"), "{stderr}");
    assert_eq!(stderr.matches("--workers").count(), 1, "{stderr}");
}

#[test]
fn a_taken_address_stops_it_with_the_reason_once() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = common::slidegate()
        .args(["serve", "--http", &addr, "--grpc", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("cannot listen on {addr}")), "{stderr}");
    assert_eq!(stderr.matches(&addr).count(), 1, "{stderr}");
    assert_eq!(stderr.matches("in use").count(), 1, "{stderr}");
}

/// At the default log level (info), nothing a request carries is logged:
/// not its keys or values, valid or not, nor its client's address; and the
/// admin token never shows, in the log or in `--help`.
#[test]
fn requests_leave_no_trace_at_info() {
    const NEEDLE: &str = "needle-7f3a9c";
    let mut command = common::slidegate();
    command
        .args(["serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
        .env("SLIDEGATE_ADMIN_TOKEN", "token-0d1e2f")
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = command.spawn().expect("the binary starts");
    let stderr = child.stderr.take().expect("stderr is piped");
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let log = std::thread::spawn(move || {
        let mut log = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(rest) = line.strip_prefix("slidegate: HTTP on ") {
                let _ = addr_tx.send(rest.split(',').next().unwrap_or_default().to_owned());
            }
            log.push_str(&line);
            log.push('\n');
        }
        log
    });
    let addr = addr_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the server says where it listens");
    let ad_hoc = format!(r#"{{"key":"{NEEDLE}","limit":1,"window":"1m"}}"#);
    let descriptors = format!(r#"{{"domain":"d","descriptors":[{{"entries":[{{"key":"k","value":"{NEEDLE}"}}]}}]}}"#);
    for (path, body, extra) in [
        ("/v1/check", ad_hoc.as_str(), ""),
        ("/v1/check", ad_hoc.as_str(), ""),
        ("/json", descriptors.as_str(), ""),
        ("/v1/check", descriptors.as_str(), ""),
        ("/v1/check", &format!(r#"{{"key":"{NEEDLE}","colour":1}}"#), ""),
        ("/v1/reset", ad_hoc.as_str(), ""),
        ("/v1/reset", ad_hoc.as_str(), "authorization: Bearer wrong-5e6f\r\n"),
        ("/v1/reset", ad_hoc.as_str(), "authorization: Bearer token-0d1e2f\r\n"),
        ("/nowhere", ad_hoc.as_str(), ""),
    ] {
        let answer = request_with(&addr, "POST", path, extra, body);
        assert!(answer.starts_with("HTTP/1.1 "), "{path}: {answer}");
    }
    assert!(
        Command::new("kill")
            .arg(child.id().to_string())
            .status()
            .unwrap()
            .success()
    );
    assert_eq!(exit_code(child), Some(0));
    let log = log.join().unwrap();
    assert!(log.contains("serving"), "the info log is on: {log}");
    for secret in [NEEDLE, "token-0d1e2f", "wrong-5e6f"] {
        assert!(!log.contains(secret), "{secret} in the log:\n{log}");
    }
    let help = common::slidegate()
        .args(["serve", "--help"])
        .env("SLIDEGATE_ADMIN_TOKEN", "token-0d1e2f")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("--admin-token"), "{help}");
    assert!(
        help.contains("--header-timeout") && help.contains("--idle-timeout"),
        "{help}"
    );
    assert!(!help.contains("token-0d1e2f"), "{help}");
}

/// SIGHUP reloads the config at once (no watcher here: `--reload-every
/// 0s`), and the process lives on.
#[test]
fn sighup_reloads_the_config_and_the_process_survives() {
    let dir = fresh("hup");
    let file = dir.join("d.yaml");
    let yaml = |n: u32| {
        format!("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{ unit: hour, requests_per_unit: {n} }}\n")
    };
    std::fs::write(&file, yaml(1)).unwrap();
    let (child, lines) = serve_logging(&["--reload-every", "0s", "--config", file.to_str().unwrap()]);
    let mut log = Vec::new();
    let addr = next_line(&lines, &mut log, listening);
    let body = r#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#;
    let status = |answer: String| answer.lines().next().unwrap_or_default().to_owned();
    assert_eq!(status(request(&addr, "POST", "/json", body)), "HTTP/1.1 200 OK");
    assert_eq!(
        status(request(&addr, "POST", "/json", body)),
        "HTTP/1.1 429 Too Many Requests"
    );
    std::fs::write(&file, yaml(3)).unwrap();
    let hup = Command::new("kill")
        .args(["-HUP", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(hup.success());
    // The reload logs what it changed once done.
    let changed = next_line(&lines, &mut log, |l| {
        l.contains("config reloaded").then(|| l.to_owned())
    });
    assert!(changed.contains("~1 limit (d: k [0])"), "{changed}");
    // One request is counted (the refused one is not), so the new limit
    // of 3 admits two more.
    assert_eq!(status(request(&addr, "POST", "/json", body)), "HTTP/1.1 200 OK");
    assert_eq!(status(request(&addr, "POST", "/json", body)), "HTTP/1.1 200 OK");
    assert_eq!(
        status(request(&addr, "POST", "/json", body)),
        "HTTP/1.1 429 Too Many Requests"
    );
    terminate(child);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Stores larger than the machine's memory are refused before anything is
/// allocated, naming the flag and the memory there is.
#[test]
fn memory_beyond_the_machine_is_refused() {
    let (code, stderr) = serve_fails(&["--memory-mib", "99999999"]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("--memory-mib 99999999"), "{stderr}");
    assert!(stderr.contains("MiB: give less"), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
}

/// `--log-format json`: every line of the log is a JSON object, the line
/// saying where it listens included.
#[test]
fn json_logs_parse_line_by_line() {
    let (child, lines) = serve_logging(&["--log-format", "json"]);
    let json = |line: &str| serde_json::from_str::<serde_json::Value>(line).unwrap_or_else(|e| panic!("{e}: {line}"));
    let addr = next_line(&lines, &mut Vec::new(), |line| {
        let event = json(line);
        (event["fields"]["message"] == "listening").then(|| event["fields"]["http"].as_str().unwrap().to_owned())
    });
    assert!(get(&addr, "/healthz").starts_with("HTTP/1.1 200 OK"));
    terminate(child);
    // The rest of the log, to the end (the sender is gone once the
    // process has exited): every line JSON.
    let rest: Vec<String> = lines.iter().collect();
    assert!(!rest.is_empty());
    for line in &rest {
        assert!(json(line)["level"].is_string(), "{line}");
    }
}

/// A Redis outage is logged once when it starts, naming the failure policy,
/// and once when Redis answers again, however many requests meet it.
#[test]
fn a_redis_outage_is_logged_once_each_way() {
    let redis = slidegate_conformance::redis::RedisServer::start();
    let url = redis.url();
    let (child, lines) = serve_logging(&["--redis", &url, "--redis-timeout", "200ms"]);
    let mut log = Vec::new();
    let addr = next_line(&lines, &mut log, listening);
    let body = r#"{"key":"k","limit":1000000,"window":"1h"}"#;
    // Requests until `pattern` shows in the log: a few, then a wait of up
    // to 100 ms for the next log line (the log looks once a second);
    // bounded: 200 rounds.
    let until = |pattern: &str, log: &mut Vec<String>| {
        for _ in 0..200 {
            for _ in 0..5 {
                let _ = request(&addr, "POST", "/v1/check", body);
            }
            if let Ok(line) = lines.recv_timeout(Duration::from_millis(100)) {
                log.push(line);
            }
            log.extend(lines.try_iter());
            if log.iter().any(|l| l.contains(pattern)) {
                return;
            }
        }
        panic!("no `{pattern}` in the log: {log:#?}");
    };
    let port = redis.kill();
    until("Redis is failing", &mut log);
    // Without `--ready-requires-redis`, readiness ignores Redis.
    assert_eq!(status_line(&get(&addr, "/readyz")), "HTTP/1.1 200 OK");
    let restarted = slidegate_conformance::redis::RedisServer::start_on(port, &[]).unwrap();
    until("Redis answers again", &mut log);
    let failing: Vec<&String> = log.iter().filter(|l| l.contains("Redis is failing")).collect();
    assert_eq!(failing.len(), 1, "{log:#?}");
    assert!(failing[0].contains("open (admit)"), "{}", failing[0]);
    assert_eq!(
        log.iter().filter(|l| l.contains("Redis answers again")).count(),
        1,
        "{log:#?}"
    );
    terminate(child);
    drop(restarted);
}

/// With `--ready-requires-redis`, readiness follows Redis: `/readyz` 503
/// and gRPC health NOT_SERVING while it does not answer, both back when
/// it does; each change logged once.
#[test]
fn readiness_follows_redis_with_the_flag() {
    use tonic_health::pb::health_check_response::ServingStatus;
    let redis = slidegate_conformance::redis::RedisServer::start();
    let url = redis.url();
    let (child, lines) = serve_logging(&["--redis", &url, "--ready-requires-redis"]);
    let mut log = Vec::new();
    let (http, grpc) = next_line(&lines, &mut log, listening_on);
    let ready = |expected: &str, health: ServingStatus| {
        let answer = get(&http, "/readyz");
        assert_eq!(status_line(&answer), expected, "{answer}");
        for name in ["", "ratelimit"] {
            assert_eq!(grpc_health(&grpc, name), health, "{name:?}");
        }
        answer
    };
    ready("HTTP/1.1 200 OK", ServingStatus::Serving);
    let port = redis.kill();
    next_line(&lines, &mut log, |l| {
        l.contains("Redis does not answer: not ready").then_some(())
    });
    let answer = ready("HTTP/1.1 503 Service Unavailable", ServingStatus::NotServing);
    assert!(
        answer.contains("application/problem+json") && answer.contains("Redis does not answer"),
        "{answer}"
    );
    let restarted = slidegate_conformance::redis::RedisServer::start_on(port, &[]).unwrap();
    next_line(&lines, &mut log, |l| {
        l.contains("Redis answers: ready again").then_some(())
    });
    ready("HTTP/1.1 200 OK", ServingStatus::Serving);
    terminate(child);
    drop(restarted);
}

/// SIGTERM drains: health NOT_SERVING and `/readyz` 503 at once while new
/// connections are still answered for the drain delay; then the listeners
/// close, and a request in flight (its body not yet sent) is still
/// answered before the process exits 0.
#[test]
fn a_drain_answers_in_flight_requests_after_the_listeners_close() {
    use tonic_health::pb::health_check_response::ServingStatus;
    let dir = fresh("drain");
    let file = dir.join("d.yaml");
    std::fs::write(
        &file,
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: hour, requests_per_unit: 5 }\n",
    )
    .unwrap();
    let (child, lines) = serve_logging(&["--config", file.to_str().unwrap(), "--drain-delay", "3s"]);
    let mut log = Vec::new();
    let (http, grpc) = next_line(&lines, &mut log, listening_on);
    assert_eq!(grpc_health(&grpc, "ratelimit"), ServingStatus::Serving);
    // A request in flight: its headers sent, its body held back.
    let body = r#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#;
    let mut in_flight = TcpStream::connect(&http).unwrap();
    in_flight.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(
        in_flight,
        "POST /json HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
    .unwrap();
    in_flight.flush().unwrap();
    signal("TERM", &child);
    next_line(&lines, &mut log, |l| {
        l.contains("draining: health says NOT_SERVING").then_some(())
    });
    // Draining: not ready, but still answering new connections.
    for name in ["", "ratelimit"] {
        assert_eq!(grpc_health(&grpc, name), ServingStatus::NotServing, "{name:?}");
    }
    assert_eq!(status_line(&get(&http, "/readyz")), "HTTP/1.1 503 Service Unavailable");
    assert_eq!(status_line(&request(&http, "POST", "/json", body)), "HTTP/1.1 200 OK");
    next_line(&lines, &mut log, |l| {
        l.contains("the HTTP listener is closed").then_some(())
    });
    // New connections are refused from now on (bounded: the listener's
    // socket is closed as the line is written).
    let refused = (0..10_000).any(|_| TcpStream::connect(&http).is_err());
    assert!(refused, "the HTTP listener still accepts");
    // The request in flight is answered.
    in_flight.write_all(body.as_bytes()).unwrap();
    let mut answer = String::new();
    in_flight.read_to_string(&mut answer).unwrap();
    assert_eq!(status_line(&answer), "HTTP/1.1 200 OK", "{answer}");
    assert!(answer.contains("\"overallCode\":\"OK\""), "{answer}");
    assert_eq!(exit_code(child), Some(0), "{log:#?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// With `--ready-requires-config` (envoyproxy/ratelimit's
/// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`, given here as that
/// variable), a config folder without a config file starts, not ready:
/// `/readyz` and `/healthcheck` 503, gRPC health NOT_SERVING; a config
/// written into it is picked up by the watcher, and both turn ready.
#[test]
fn with_healthy_with_at_least_one_config_loaded_it_is_ready_once_a_config_is() {
    use common::serve_logging_with;
    use tonic_health::pb::health_check_response::ServingStatus;
    let dir = fresh("wait-config");
    let (child, lines) = serve_logging_with(
        &["--config", dir.to_str().unwrap(), "--reload-every", "50ms"],
        &[("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true")],
    );
    let mut log = Vec::new();
    let (http, grpc) = next_line(&lines, &mut log, listening_on);
    let ready = |expected: &str, health: ServingStatus| {
        for path in ["/readyz", "/healthcheck"] {
            let answer = get(&http, path);
            assert_eq!(status_line(&answer), expected, "{path}: {answer}");
        }
        for name in ["", "ratelimit"] {
            assert_eq!(grpc_health(&grpc, name), health, "{name:?}");
        }
    };
    ready("HTTP/1.1 503 Service Unavailable", ServingStatus::NotServing);
    assert!(log.iter().any(|l| l.contains("not ready until one does")), "{log:#?}");
    // Alive all the same.
    assert_eq!(status_line(&get(&http, "/healthz")), "HTTP/1.1 200 OK");
    std::fs::write(
        dir.join("d.yaml"),
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: hour, requests_per_unit: 5 }\n",
    )
    .unwrap();
    next_line(&lines, &mut log, |l| {
        l.contains("a config with a domain loaded: ready").then_some(())
    });
    ready("HTTP/1.1 200 OK", ServingStatus::Serving);
    terminate(child);
    let _ = std::fs::remove_dir_all(&dir);

    // Without a config to wait for, it refuses to start.
    let (code, stderr) = serve_fails(&["--ready-requires-config"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("needs --config"), "{stderr}");
}

/// A scrape right after start shows every labelled series a dashboard or
/// an alert reads, at 0 (the APIs and outcomes, the reload results, the
/// failure policy's sources, the configured domains and "unknown", the
/// request durations), `slidegate_build_info`, and the process's own
/// metrics.
#[test]
fn a_first_scrape_shows_every_series_at_zero() {
    let dir = fresh("scrape");
    let file = dir.join("d.yaml");
    std::fs::write(
        &file,
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: hour, requests_per_unit: 5 }\n",
    )
    .unwrap();
    let (child, addr) = serve(&["--config", file.to_str().unwrap()]);
    let metrics = get(&addr, "/metrics");
    terminate(child);
    let _ = std::fs::remove_dir_all(&dir);
    let mut zero = Vec::new();
    for api in ["grpc", "json", "check", "ad_hoc"] {
        for outcome in ["ok", "over_limit", "invalid", "unavailable"] {
            zero.push(format!(
                "slidegate_requests_total{{api=\"{api}\",outcome=\"{outcome}\"}} 0"
            ));
        }
        zero.push(format!("slidegate_request_duration_seconds_count{{api=\"{api}\"}} 0"));
    }
    for result in ["success", "failure"] {
        zero.push(format!("slidegate_config_reloads_total{{result=\"{result}\"}} 0"));
    }
    for source in ["fail_open", "fail_closed", "local"] {
        zero.push(format!("slidegate_redis_fallbacks_total{{source=\"{source}\"}} 0"));
    }
    for (source, outcome) in [("store", "admitted"), ("store", "refused"), ("local", "refused")] {
        zero.push(format!(
            "slidegate_store_decisions_total{{source=\"{source}\",outcome=\"{outcome}\"}} 0"
        ));
    }
    for domain in ["d", "unknown"] {
        for outcome in ["ok", "over_limit"] {
            zero.push(format!(
                "slidegate_descriptor_decisions_total{{domain=\"{domain}\",outcome=\"{outcome}\"}} 0"
            ));
        }
        zero.push(format!("slidegate_shadow_mode_refusals_total{{domain=\"{domain}\"}} 0"));
    }
    for reason in ["missing", "wrong"] {
        zero.push(format!("slidegate_admin_auth_failures_total{{reason=\"{reason}\"}} 0"));
    }
    for series in &zero {
        assert!(metrics.lines().any(|l| l == series), "{series} missing:\n{metrics}");
    }
    let version = env!("CARGO_PKG_VERSION");
    assert!(
        metrics.contains(&format!("slidegate_build_info{{version=\"{version}\"}} 1")),
        "{metrics}"
    );
    if cfg!(target_os = "linux") {
        for name in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_virtual_memory_bytes ",
            "process_open_fds ",
            "process_max_fds ",
            "process_start_time_seconds ",
        ] {
            assert!(
                metrics.lines().any(|l| l.starts_with(name)),
                "{name} missing:\n{metrics}"
            );
        }
    }
}

/// `slidegate serve` answers Envoy's rate limit quota service on its gRPC
/// listener: a usage report of a configured bucket gets a token bucket,
/// and the stream's start and end are logged, its domain as configured.
#[test]
fn it_answers_the_rate_limit_quota_service_and_logs_each_stream() {
    use slidegate_server::proto::quota::rate_limit_quota_response::bucket_action::BucketAction;
    use slidegate_server::proto::quota::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
    use slidegate_server::proto::quota::rate_limit_quota_usage_reports::BucketQuotaUsage;
    use slidegate_server::proto::quota::{BucketId, RateLimitQuotaUsageReports};
    use slidegate_server::proto::types::rate_limit_strategy::Strategy;
    let dir = fresh("rlqs");
    let file = dir.join("edge.yaml");
    std::fs::write(
        &file,
        "domain: edge\nquota_buckets:\n  - bucket_id: { route: checkout }\n    rate_limit: { unit: minute, requests_per_unit: 600 }\n",
    )
    .unwrap();
    let (child, lines) = serve_logging(&["--config", file.to_str().unwrap()]);
    let mut log = Vec::new();
    let (_, grpc) = next_line(&lines, &mut log, listening_on);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let strategy = runtime.block_on(async {
        let channel = common::channel(&grpc).await;
        let report = RateLimitQuotaUsageReports {
            domain: "edge".to_owned(),
            bucket_quota_usages: vec![BucketQuotaUsage {
                bucket_id: Some(BucketId {
                    bucket: [("route".to_owned(), "checkout".to_owned())].into(),
                }),
                time_elapsed: Some(pbjson_types::Duration { seconds: 0, nanos: 0 }),
                num_requests_allowed: 1,
                num_requests_denied: 0,
            }],
        };
        let mut answers = RateLimitQuotaServiceClient::new(channel)
            .stream_rate_limit_quotas(tokio_stream::iter([report]))
            .await
            .unwrap()
            .into_inner();
        let answer = answers.message().await.unwrap().unwrap();
        match answer.bucket_action.into_iter().next().and_then(|a| a.bucket_action) {
            Some(BucketAction::QuotaAssignmentAction(a)) => a.rate_limit_strategy.and_then(|s| s.strategy),
            other => panic!("{other:?}"),
        }
    });
    match strategy {
        Some(Strategy::TokenBucket(bucket)) => {
            assert_eq!(bucket.fill_interval.map(|d| d.seconds), Some(60));
            assert!(bucket.tokens_per_fill.is_some_and(|n| n.value > 0 && n.value <= 600));
        }
        other => panic!("expected a token bucket, got {other:?}"),
    }
    next_line(&lines, &mut log, |l| {
        (l.contains("rate limit quota stream started") && l.contains("domain=\"edge\"")).then_some(())
    });
    next_line(&lines, &mut log, |l| {
        l.contains("rate limit quota stream ended").then_some(())
    });
    // The client's connection closes with its runtime.
    drop(runtime);
    terminate(child);
}
