//! `slidegate serve` as a process: it starts, answers, and stops cleanly on
//! SIGTERM and on SIGINT; a bad config or flag stops it at once with the
//! reason.

#![cfg(unix)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Starts `slidegate serve` on free loopback ports; returns the child and
/// its HTTP address, read from the line it prints once it listens.
fn serve(extra: &[&str]) -> (std::process::Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_slidegate"))
        .args(["serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
        .args(extra)
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
    let mut stream = TcpStream::connect(addr).expect("the server accepts");
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer
}

/// Waits (bounded: 20 s) for the child to exit; kills it if it does not.
fn exit_code(mut child: std::process::Child) -> Option<i32> {
    let pid = child.id();
    let (done, exited) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(child.wait().ok().and_then(|s| s.code()));
    });
    match exited.recv_timeout(Duration::from_secs(20)) {
        Ok(code) => code,
        Err(_) => {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
            None
        }
    }
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
    let dir = std::env::temp_dir().join(format!("slidegate-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("bad.yaml");
    std::fs::write(
        &file,
        "domain: x\ndescriptors:\n  - key: k\n    rate_limit: { unit: second, requests_per_unit: ten }\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_slidegate"))
        .args(["serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("bad.yaml:4:"), "{stderr}");
    assert!(stderr.contains("requests_per_unit"), "{stderr}");

    let out = Command::new(env!("CARGO_BIN_EXE_slidegate"))
        .args(["serve", "--max-body", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--max-body 0"));
}

#[test]
fn flags_come_from_the_environment_too() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_slidegate"))
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
