//! What the process tests share: starting `slidegate serve` with its log
//! read line by line, waiting on the log, plain HTTP/1.1 requests, and
//! stopping it with SIGTERM. Each test binary uses a part of it.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

/// One HTTP/1.1 request on a connection of its own; the whole answer.
pub(crate) fn request(addr: &str, method: &str, path: &str, body: &str) -> String {
    request_with(addr, method, path, "", body)
}

/// [`request`] with `extra` header lines (each ending in `\r\n`).
pub(crate) fn request_with(addr: &str, method: &str, path: &str, extra: &str, body: &str) -> String {
    let mut stream = TcpStream::connect(addr).expect("the server accepts");
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-type: application/json\r\n{extra}content-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer
}

/// Waits (bounded: 20 s) for the child to exit; kills it if it does not.
pub(crate) fn exit_code(mut child: std::process::Child) -> Option<i32> {
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

/// Runs `slidegate serve` on free loopback ports with `extra` flags to its
/// end (a start that fails); its exit code and stderr.
pub(crate) fn serve_fails(extra: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_slidegate"))
        .args(["serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
        .args(extra)
        .output()
        .unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Starts `slidegate serve` on free loopback ports with `extra` flags, its
/// log at `RUST_LOG=info` (and no drain delay unless `extra` sets one); the child and its log,
/// line by line, as it comes.
pub(crate) fn serve_logging(extra: &[&str]) -> (std::process::Child, std::sync::mpsc::Receiver<String>) {
    serve_logging_with(extra, &[])
}

/// [`serve_logging`] with `env` set for the process too.
pub(crate) fn serve_logging_with(
    extra: &[&str],
    env: &[(&str, &str)],
) -> (std::process::Child, std::sync::mpsc::Receiver<String>) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_slidegate"));
    command.args(["serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"]);
    if !extra.contains(&"--drain-delay") {
        command.args(["--drain-delay", "0s"]);
    }
    let mut child = command
        .args(extra)
        .env("RUST_LOG", "info")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    (child, lines)
}

/// The first log line that `pick` maps to something, the lines before it
/// kept in `log`; bounded (20 s without a line fails).
pub(crate) fn next_line<T>(
    lines: &std::sync::mpsc::Receiver<String>,
    log: &mut Vec<String>,
    mut pick: impl FnMut(&str) -> Option<T>,
) -> T {
    loop {
        let line = lines
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("the log stopped: {log:#?}"));
        let picked = pick(&line);
        log.push(line);
        if let Some(found) = picked {
            return found;
        }
    }
}

/// The HTTP address from the text log's line saying where it listens.
pub(crate) fn listening(line: &str) -> Option<String> {
    Some(listening_both(line)?.0)
}

/// The HTTP and gRPC addresses from the text log's line saying where it
/// listens.
pub(crate) fn listening_both(line: &str) -> Option<(String, String)> {
    let (http, grpc) = line.strip_prefix("slidegate: HTTP on ")?.split_once(", gRPC on ")?;
    Some((http.to_owned(), grpc.trim().to_owned()))
}

/// Sends SIGTERM and checks the clean exit.
pub(crate) fn terminate(child: std::process::Child) {
    let term = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    assert_eq!(exit_code(child), Some(0));
}
