//! A large config reloaded under load: no request waits on it (the parse
//! and the freeing of the old config happen off the runtime), and the
//! memory it took goes back to the system once a small config replaces
//! it. In a test binary of its own, so that no other test shares the
//! machine's two cores while the probe measures (the tests of this binary
//! run one at a time).
//!
//! And the reloads that would turn limits off (a folder swapped for an
//! empty one, a file caught half written, an empty file, a folder whose
//! file is removed) refused while a key is at its limit: nothing admitted
//! past it, one error line each; a ConfigMap's atomic symlink swap still
//! reloads, and `--allow-empty-reload` lets an emptying reload through.

#![cfg(target_os = "linux")]

mod common;

use common::{exit_code, fresh, listening, next_line, request, serve_command, serve_logging, signal, terminate};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc::Receiver;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Held by each test of this binary: they run one at a time, so that the
/// large reload's probe measures alone.
fn alone() -> MutexGuard<'static, ()> {
    static ALONE: Mutex<()> = Mutex::new(());
    ALONE.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

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
    let _alone = alone();
    let dir = fresh("reload");
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

// ------------------------------------------------- reloads that empty

/// Domain `t`: 5 requests an hour on each value of `k`.
const LIMITED: &str = "domain: t\ndescriptors:\n  - key: k\n    rate_limit: { unit: hour, requests_per_unit: 5 }\n";

/// One `POST /json` for `t` / `k=v`: whether it was admitted (200; 429
/// otherwise).
fn admitted(addr: &str) -> bool {
    let answer = request(
        addr,
        "POST",
        "/json",
        r#"{"domain":"t","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#,
    );
    match answer.split(' ').nth(1) {
        Some("200") => true,
        Some("429") => false,
        _ => panic!("{answer}"),
    }
}

/// The config reloads counted so far: (succeeded, failed).
fn reloads(addr: &str) -> (u64, u64) {
    let text = request(addr, "GET", "/metrics", "");
    let count = |result: &str| {
        let name = format!("slidegate_config_reloads_total{{result=\"{result}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&name))
            .map_or(0, |v| v.trim().parse::<f64>().unwrap() as u64)
    };
    (count("success"), count("failure"))
}

/// A server of the tests below, killed if the test fails before it
/// stops it.
struct Served {
    child: Option<std::process::Child>,
    lines: Receiver<String>,
    addr: String,
}

impl Served {
    /// Sends the signal `name` (`HUP`).
    fn signal(&self, name: &str) {
        signal(name, self.child.as_ref().unwrap());
    }

    /// Stops the server (checking its clean exit); its whole log.
    fn stop(&mut self) -> Vec<String> {
        terminate(self.child.take().unwrap());
        let mut log = Vec::new();
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(10)) {
            log.push(line);
        }
        log
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A server of `LIMITED` (at `--config config`, watched every 100 ms
/// unless `flags` say otherwise) whose key has spent its 5.
fn at_the_limit(config: &Path, flags: &[&str]) -> Served {
    let mut args = vec!["--config", config.to_str().unwrap()];
    if !flags.contains(&"--reload-every") {
        args.extend(["--reload-every", "100ms"]);
    }
    args.extend(flags);
    let (child, lines) = serve_logging(&args);
    let mut served = Served {
        child: Some(child),
        lines,
        addr: String::new(),
    };
    served.addr = next_line(&served.lines, &mut Vec::new(), listening);
    let spent: Vec<bool> = (0..6).map(|_| admitted(&served.addr)).collect();
    assert_eq!(spent, [true, true, true, true, true, false]);
    served
}

/// Requests on the key at its limit until `done` says the reloads
/// counted so far are what was waited for (bounded: 20 s), then for 10
/// more looks of the watcher (1 s): how many were sent and admitted, and
/// the reloads counted.
fn drive_until(addr: &str, done: impl Fn((u64, u64)) -> bool) -> (u32, u32, (u64, u64)) {
    let started = Instant::now();
    let (mut sent, mut passed) = (0, 0);
    let mut settled: Option<Instant> = None;
    loop {
        sent += 1;
        passed += u32::from(admitted(addr));
        let counted = reloads(addr);
        match settled {
            None if done(counted) => settled = Some(Instant::now()),
            Some(at) if at.elapsed() > Duration::from_secs(1) => return (sent, passed, counted),
            _ => {}
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no reload counted in 20 s: {counted:?}"
        );
    }
}

/// The lines of `log` at level ERROR.
fn errors(log: &[String]) -> Vec<&String> {
    log.iter().filter(|l| l.contains(" ERROR ")).collect()
}

/// A change that would turn every limit off, made while the key is at
/// its limit (and followed by a SIGHUP when `hup`): refused in one error
/// line naming `names`, counted as one failed reload, nothing admitted
/// past the limit for 10 more looks of the watcher, the config in force
/// serving on. Then `after` (given the folder and the HTTP address) may
/// go on with the server; the error line must still be the only one.
fn refused(
    name: &str,
    config: impl FnOnce(&Path) -> PathBuf,
    change: impl FnOnce(&Path),
    hup: bool,
    names: &str,
    after: impl FnOnce(&Path, &str),
) {
    let _alone = alone();
    let dir = fresh(name);
    let config = config(&dir);
    let flags: &[&str] = if hup { &["--reload-every", "0s"] } else { &[] };
    let mut served = at_the_limit(&config, flags);
    change(&dir);
    if hup {
        served.signal("HUP");
    }
    // Until the reload is counted, whatever its outcome.
    let (sent, passed, counted) = drive_until(&served.addr, |(good, failed)| good + failed >= 1);
    eprintln!("{name}: {sent} requests after the change, {passed} admitted past the limit; reloads {counted:?}");
    after(&dir, &served.addr);
    let log = served.stop();
    assert_eq!(
        passed, 0,
        "{sent} requests after the change, {passed} admitted: {log:#?}"
    );
    assert_eq!(counted, (0, 1), "{log:#?}");
    let errors = errors(&log);
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(errors[0].contains("config reload failed"), "{}", errors[0]);
    assert!(errors[0].contains(names), "{} lacks {names}", errors[0]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Nothing more after the refusal: the server is stopped.
fn nothing(_: &Path, _: &str) {}

/// The issue's case: the config file replaced by an empty folder, then a
/// SIGHUP.
#[test]
fn a_file_replaced_by_an_empty_folder_is_refused_on_sighup() {
    refused(
        "reload-file-to-folder",
        |dir| {
            let file = dir.join("t.yaml");
            std::fs::write(&file, LIMITED).unwrap();
            file
        },
        |dir| {
            let file = dir.join("t.yaml");
            std::fs::remove_file(&file).unwrap();
            std::fs::create_dir(&file).unwrap();
        },
        true,
        "t.yaml: no config file in this folder",
        nothing,
    );
}

/// A config folder swapped for an empty one (a volume remounted, a
/// deployment that rewrites the folder), seen by the watcher.
#[test]
fn a_folder_swapped_for_an_empty_one_is_refused() {
    refused(
        "reload-empty-folder",
        |dir| {
            let config = dir.join("config");
            std::fs::create_dir(&config).unwrap();
            std::fs::write(config.join("t.yaml"), LIMITED).unwrap();
            config
        },
        |dir| {
            std::fs::rename(dir.join("config"), dir.join("old")).unwrap();
            std::fs::create_dir(dir.join("config")).unwrap();
        },
        false,
        "config: no config file in this folder",
        nothing,
    );
}

/// The folder's one config file removed.
#[test]
fn a_folder_whose_file_is_removed_is_refused() {
    refused(
        "reload-file-removed",
        |dir| {
            std::fs::write(dir.join("t.yaml"), LIMITED).unwrap();
            dir.to_path_buf()
        },
        |dir| std::fs::remove_file(dir.join("t.yaml")).unwrap(),
        false,
        "no config file in this folder",
        nothing,
    );
}

/// The file emptied (truncated by a writer that has not written yet).
#[test]
fn an_empty_file_is_refused() {
    refused(
        "reload-empty-file",
        |dir| {
            std::fs::write(dir.join("t.yaml"), LIMITED).unwrap();
            dir.to_path_buf()
        },
        |dir| std::fs::write(dir.join("t.yaml"), "").unwrap(),
        false,
        "t.yaml:1:1: empty file",
        nothing,
    );
}

/// The file caught half written, `domain: t` alone, for as long as the
/// test looks (10 looks of the watcher after the refusal): refused once;
/// the whole file, once written, reloads.
#[test]
fn a_half_written_file_is_refused_until_it_is_whole() {
    refused(
        "reload-half-written",
        |dir| {
            std::fs::write(dir.join("t.yaml"), LIMITED).unwrap();
            dir.to_path_buf()
        },
        |dir| std::fs::write(dir.join("t.yaml"), "domain: t\n").unwrap(),
        false,
        "t.yaml: reload refused: domain `t` would lose every limit",
        |dir, addr| {
            // Written whole, with 7 an hour: reloaded, the 5 spent kept.
            std::fs::write(dir.join("t.yaml"), LIMITED.replace(": 5 }", ": 7 }")).unwrap();
            let (_, passed, counted) = drive_until(addr, |(good, _)| good >= 1);
            assert_eq!((passed, counted), (2, (1, 1)));
        },
    );
}

/// A Kubernetes ConfigMap's folder: `t.yaml` a link to `..data/t.yaml`,
/// `..data` a link to the version in force; a new version is written
/// beside it and `..data` replaced by a rename, atomically. The watcher
/// reloads it, the new limit in force at once.
#[test]
fn a_config_map_symlink_swap_reloads() {
    let _alone = alone();
    let dir = fresh("reload-config-map");
    let link = |target: &str, at: &str| std::os::unix::fs::symlink(target, dir.join(at)).unwrap();
    std::fs::create_dir(dir.join("..v1")).unwrap();
    std::fs::write(dir.join("..v1/t.yaml"), LIMITED).unwrap();
    link("..v1", "..data");
    link("..data/t.yaml", "t.yaml");
    let mut served = at_the_limit(&dir, &[]);
    // As the kubelet does it.
    std::fs::create_dir(dir.join("..v2")).unwrap();
    std::fs::write(dir.join("..v2/t.yaml"), LIMITED.replace(": 5 }", ": 8 }")).unwrap();
    link("..v2", "..data_tmp");
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    std::fs::remove_dir_all(dir.join("..v1")).unwrap();
    let (sent, passed, counted) = drive_until(&served.addr, |(good, failed)| good + failed >= 1);
    let log = served.stop();
    // 8 an hour now, 5 of them spent: 3 more.
    eprintln!("config map swap: {sent} requests, {passed} admitted; reloads {counted:?}");
    assert_eq!((passed, counted), (3, (1, 0)), "{log:#?}");
    assert!(
        log.iter()
            .any(|l| l.contains("config reloaded") && l.contains("~1 limit")),
        "{log:#?}"
    );
    assert!(errors(&log).is_empty(), "{log:#?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// With `--allow-empty-reload` the folder swapped for an empty one is
/// served: no domain, so nothing limited, and a warning says so.
#[test]
fn allow_empty_reload_lets_an_emptying_reload_through() {
    let _alone = alone();
    let dir = fresh("reload-allowed");
    let config = dir.join("config");
    std::fs::create_dir(&config).unwrap();
    std::fs::write(config.join("t.yaml"), LIMITED).unwrap();
    let mut served = at_the_limit(&config, &["--allow-empty-reload"]);
    std::fs::rename(&config, dir.join("old")).unwrap();
    std::fs::create_dir(&config).unwrap();
    let (_, _, counted) = drive_until(&served.addr, |(good, failed)| good + failed >= 1);
    // No domain now: nothing limited.
    let passed = (0..10).filter(|_| admitted(&served.addr)).count();
    let log = served.stop();
    assert_eq!((counted, passed), ((1, 0), 10), "{log:#?}");
    let warned: Vec<&String> = log
        .iter()
        .filter(|l| l.contains("config reloaded, although it empties"))
        .collect();
    assert_eq!(warned.len(), 1, "{log:#?}");
    assert!(warned[0].contains("-1 domain (t)"), "{}", warned[0]);
    assert!(errors(&log).is_empty(), "{log:#?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `serve --config path`, which should not start: its exit code (`None`
/// if it served, killed after 20 s) and its stderr.
fn start_fails(path: &Path) -> (Option<i32>, String) {
    let mut child = serve_command(&["--config", path.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let read = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let code = exit_code(child);
    (code, read.join().unwrap())
}

/// `serve` does not start from a folder without a config file, nor from
/// an empty file: exit 1, naming it.
#[test]
fn serve_refuses_to_start_from_an_empty_folder_or_file() {
    let _alone = alone();
    let dir = fresh("reload-start-empty");
    let (code, stderr) = start_fails(&dir);
    assert_eq!(code, Some(1), "{stderr}");
    let expected = format!("{}: no config file in this folder", dir.display());
    assert!(stderr.contains(&expected), "{stderr}");
    let file = dir.join("t.yaml");
    std::fs::write(&file, "").unwrap();
    for path in [&dir, &file] {
        let (code, stderr) = start_fails(path);
        assert_eq!(code, Some(1), "{stderr}");
        assert!(
            stderr.contains(&format!("{}:1:1: empty file", file.display())),
            "{stderr}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
