//! A large config reloaded under load: no request waits on it (the parse
//! and the freeing of the old config happen off the runtime), and the
//! memory it took goes back to the system once a small config replaces
//! it. In a test binary of its own, so that no other test shares the
//! machine's two cores while the probe measures.

#![cfg(target_os = "linux")]

mod common;

use common::{exit_code, listening, next_line, serve_logging, signal};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

/// A config of `n` descriptors (about 90 bytes each).
fn config(n: usize) -> String {
    let mut text = String::from(
        "domain: d\ndescriptors:\n  - key: probe\n    rate_limit: { unit: hour, requests_per_unit: 1000000000 }\n",
    );
    for i in 0..n {
        text.push_str(&format!(
            "  - key: k{i}\n    value: v{i}\n    rate_limit: {{ unit: minute, requests_per_unit: {} }}\n",
            i % 1000 + 1
        ));
    }
    text
}

/// The resident memory of process `pid`, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

/// One `POST /json` on a kept-alive connection; how long it took.
fn probe(stream: &mut TcpStream) -> Duration {
    let body = r#"{"domain":"d","descriptors":[{"entries":[{"key":"probe","value":"p"}]}]}"#;
    let started = Instant::now();
    // One write: the request in one segment.
    let request = format!(
        "POST /json HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).unwrap();
    // The answer's head, then its body by its length.
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        stream.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).unwrap();
    started.elapsed()
}

/// Kills the process of this id when dropped: a server left by a test
/// that failed.
struct Reaper(u32);

impl Drop for Reaper {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-KILL", &self.0.to_string()]).status();
    }
}

#[test]
fn a_large_reload_stalls_no_request_and_gives_its_memory_back() {
    let dir = std::env::temp_dir().join(format!("slidegate-cli-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("d.yaml");
    let small = config(1);
    std::fs::write(&file, &small).unwrap();
    let (child, lines) = serve_logging(&[
        "--reload-every",
        "0s",
        "--memory-mib",
        "16",
        "--other-memory-mib",
        "4",
        "--config",
        file.to_str().unwrap(),
    ]);
    let pid = child.id();
    // Killed if the test fails before it stops the server.
    let reaper = Reaper(pid);
    let addr = next_line(&lines, &mut Vec::new(), listening);
    let mut stream = TcpStream::connect(&addr).unwrap();
    stream.set_nodelay(true).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    for _ in 0..200 {
        probe(&mut stream);
    }
    let before = rss(pid);
    let hup = || signal("HUP", &child);
    // Reloads, probing all along; the longest wait, the probes, the log
    // line (bounded: 120 s).
    let reload = |stream: &mut TcpStream| {
        hup();
        let started = Instant::now();
        let (mut worst, mut probes) = (Duration::ZERO, 0u32);
        loop {
            if let Ok(line) = lines.try_recv() {
                assert!(!line.contains("reload failed"), "{line}");
                if line.contains("config reloaded") {
                    return (worst, probes, line);
                }
            }
            worst = worst.max(probe(stream));
            probes += 1;
            assert!(started.elapsed() < Duration::from_secs(120), "no reload in 120 s");
        }
    };
    // 6 MB of YAML: 70,000 descriptors.
    std::fs::write(&file, config(70_000)).unwrap();
    let (worst, probes, line) = reload(&mut stream);
    assert!(line.contains("+69999 limits"), "{line}");
    assert!(probes > 100, "the probe hardly ran during the reload: {probes}");
    assert!(
        worst < Duration::from_millis(50),
        "a request waited {worst:?} during the reload"
    );
    let loaded = rss(pid);
    eprintln!("6 MB reload: {probes} probes, the longest {worst:?}");
    // Back to the small config: the large one's memory goes back.
    std::fs::write(&file, &small).unwrap();
    let (worst, _, line) = reload(&mut stream);
    assert!(line.contains("-69999 limits"), "{line}");
    assert!(
        worst < Duration::from_millis(50),
        "a request waited {worst:?} during the reload"
    );
    let after = rss(pid);
    let mib = |bytes: u64| bytes >> 20;
    eprintln!(
        "resident: {} MiB, {} MiB loaded, {} MiB after",
        mib(before),
        mib(loaded),
        mib(after)
    );
    assert!(
        loaded > before + (64 << 20),
        "the large config took little memory: {} MiB, then {} MiB",
        mib(before),
        mib(loaded)
    );
    assert!(
        after < before + (loaded - before) / 4,
        "the memory was not given back: {} MiB before, {} MiB loaded, {} MiB after",
        mib(before),
        mib(loaded),
        mib(after)
    );
    drop(stream);
    signal("TERM", &child);
    assert_eq!(exit_code(child), Some(0));
    // Gone: its id may be another process's from now on.
    std::mem::forget(reaper);
    let _ = std::fs::remove_dir_all(&dir);
}
