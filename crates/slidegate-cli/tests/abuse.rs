//! Attacks on the real `slidegate serve` process over loopback, each
//! against a legitimate client served at the same time (issue [harden],
//! RELIABILITY.md's "Abuse" rows):
//!
//! - one HTTP/2 connection opening 200,000 streams (headers only), and
//!   one sending 25,000 streams of 60 KB bodies, none ever ended: the
//!   process stays within 100 MB of its size before the attack and the
//!   legitimate gRPC client's p99 under 50 ms;
//! - two connections changing `SETTINGS_INITIAL_WINDOW_SIZE` in a loop
//!   over all the streams they may hold open: the legitimate client loses
//!   no call;
//! - under `ulimit -n 64`, 500 connections that open HTTP/2 and then only
//!   `PING`, reconnecting when closed, and 500 HTTP/1.1 keep-alive
//!   connections making requests as fast as they can (as `wrk -c500`
//!   does): a legitimate gRPC and a legitimate HTTP client are served.
//!
//! The attackers connect from 127.0.0.2 (the clients from 127.0.0.1) and
//! write HTTP/2 frames by hand (`H2Attacker`), as an attacker's tool does, honouring flow control only as far as needed to
//! get their bytes in. Every loop is bounded in count and in time, and
//! every server is one the test started on 127.0.0.1.
//!
//! `SLIDEGATE_UNDER_TEST` names another `slidegate` binary to attack (the
//! build before the change, to see the faults these tests catch).

#![cfg(target_os = "linux")]

mod common;

use slidegate_server::proto::descriptor::RateLimitDescriptor;
use slidegate_server::proto::descriptor::rate_limit_descriptor::Entry;
use slidegate_server::proto::rls::RateLimitRequest;
use slidegate_server::proto::rls::rate_limit_response::Code;
use slidegate_server::proto::rls::rate_limit_service_client::RateLimitServiceClient;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::transport::Channel;

/// The config: the legitimate client's limit is far above what it sends.
const CONFIG: &str = "domain: abuse\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: second\n      requests_per_unit: 1000000\n";

/// The most the process may grow under an attack.
const MEMORY_BOUND: u64 = 100 << 20;
/// The legitimate client's p99 bound under an attack.
const P99_BOUND: Duration = Duration::from_millis(50);

/// The tests take turns: each attack wants the machine's two cores.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The binary under test.
fn binary() -> String {
    std::env::var("SLIDEGATE_UNDER_TEST")
        .ok()
        .filter(|b| !b.is_empty())
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_slidegate").to_owned())
}

/// A `slidegate serve` on free loopback ports; killed on drop.
struct Serve {
    child: Child,
    http: String,
    grpc: String,
    stderr: Arc<Mutex<Vec<String>>>,
    _dir: TempDir,
}

/// A folder removed on drop.
struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Serve {
    /// Starts the server, under `ulimit -n` when given, with `extra` flags.
    fn start(descriptors: Option<u32>, extra: &[&str]) -> Serve {
        static DIRS: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "slidegate-abuse-{}-{}",
            std::process::id(),
            DIRS.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("abuse.yaml"), CONFIG).unwrap();
        let mut args = vec![
            binary(),
            "serve".to_owned(),
            "--http".to_owned(),
            "127.0.0.1:0".to_owned(),
            "--grpc".to_owned(),
            "127.0.0.1:0".to_owned(),
            "--reload-every".to_owned(),
            "0s".to_owned(),
            "--drain-delay".to_owned(),
            "0s".to_owned(),
            "--config".to_owned(),
            dir.join("abuse.yaml").display().to_string(),
        ];
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let mut command = match descriptors {
            // The shell sets the limit and becomes the server.
            Some(n) => {
                let mut c = Command::new("sh");
                c.arg("-c")
                    .arg(format!("ulimit -n {n} && exec \"$@\""))
                    .arg("sh")
                    .args(&args);
                c
            }
            None => {
                let mut c = Command::new(&args[0]);
                c.args(&args[1..]);
                c
            }
        };
        for name in common::RATELIMIT_VARIABLES {
            command.env_remove(name);
        }
        let mut child = command
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the binary starts");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let mut listening = None;
        let mut early = Vec::new();
        for line in lines.by_ref().map_while(Result::ok) {
            if let Some(addrs) = common::listening_on(&line) {
                listening = Some(addrs);
                break;
            }
            early.push(line);
        }
        let (http, grpc) = listening.unwrap_or_else(|| panic!("the server never listened: {early:#?}"));
        let stderr = Arc::new(Mutex::new(early));
        let kept = Arc::clone(&stderr);
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                kept.lock().unwrap().push(line);
            }
        });
        Serve {
            child,
            http,
            grpc,
            stderr,
            _dir: TempDir(dir),
        }
    }

    /// The resident set size, in bytes.
    fn rss(&self) -> u64 {
        rss_of(self.child.id())
    }

    /// The CPU time the process has used (utime + stime), in seconds.
    fn cpu(&self) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap_or_default();
        // The fields after the command name's closing parenthesis.
        let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
        // utime and stime are fields 14 and 15 of the whole line; here
        // 11 and 12 (0-based) after the state.
        (ticks(11) + ticks(12)) / 100.0
    }

    /// A `/metrics` figure (the sum of its series), if present.
    async fn metric(&self, name: &str) -> Option<f64> {
        let text = http_get(&self.http, "/metrics").await?;
        let values: Vec<f64> = text
            .lines()
            .filter(|l| l.starts_with(name) && !l.starts_with('#'))
            .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
            .collect();
        (!values.is_empty()).then(|| values.iter().sum())
    }

    fn log(&self) -> Vec<String> {
        self.stderr.lock().unwrap().clone()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.1 GET on a connection of its own, within 3 s; the body.
async fn http_get(addr: &str, path: &str) -> Option<String> {
    let answer = tokio::time::timeout(Duration::from_secs(3), async {
        let mut stream = TcpStream::connect(addr).await.ok()?;
        let request = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.ok()?;
        Some(String::from_utf8_lossy(&answer).into_owned())
    })
    .await
    .ok()??;
    answer.split_once("\r\n\r\n").map(|(_, body)| body.to_owned())
}

/// The legitimate client's request.
fn legitimate() -> RateLimitRequest {
    RateLimitRequest {
        domain: "abuse".to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".to_owned(),
                value: "legitimate".to_owned(),
            }],
            limit: None,
            hits_addend: None,
        }],
        hits_addend: 0,
    }
}

/// What a legitimate client saw: each call's time, and the calls that
/// failed (an error, or no answer within its 2 s deadline).
#[derive(Debug, Default)]
struct Served {
    times: Vec<Duration>,
    failed: Vec<String>,
}

impl Served {
    fn p99(&self) -> Duration {
        let mut times = self.times.clone();
        times.sort();
        times
            .get((times.len() * 99).div_ceil(100).saturating_sub(1))
            .copied()
            .unwrap_or(Duration::MAX)
    }
}

/// A legitimate client running on a thread and runtime of its own, so
/// that the attackers' tasks in the test's runtime do not delay it; with
/// the number of calls it has made so far.
struct Legitimate {
    thread: std::thread::JoinHandle<Served>,
    made: tokio::sync::watch::Receiver<usize>,
}

impl Legitimate {
    fn spawn<F, Fut>(client: F) -> Legitimate
    where
        F: FnOnce(tokio::sync::watch::Sender<usize>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Served>,
    {
        let (made, seen) = tokio::sync::watch::channel(0);
        let thread = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(client(made))
        });
        Legitimate { thread, made: seen }
    }

    /// Waits until it has made `calls` calls (or ended).
    async fn made(&mut self, calls: usize) {
        let _ = self.made.wait_for(|&n| n >= calls).await;
    }

    async fn finish(self) -> Served {
        let thread = self.thread;
        tokio::task::spawn_blocking(move || thread.join().unwrap())
            .await
            .unwrap()
    }
}

/// How a legitimate client connects.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Connect {
    /// Once, then keeps its connection (a gRPC channel reconnecting as
    /// gRPC clients do, a kept-alive HTTP/1.1 connection opened again once
    /// for the same request when the server closed it), as Envoy does.
    Kept,
    /// A new connection for every call, as a health checker or `curl`.
    Fresh,
}

/// A gRPC client making `calls` calls, one every `every`, each with a 2 s
/// deadline (and 3 s in all, connecting included).
fn grpc_client(addr: String, every: Duration, connect: Connect, calls: usize) -> Legitimate {
    Legitimate::spawn(move |made| async move {
        let channel = || Channel::from_shared(format!("http://{addr}")).unwrap().connect_lazy();
        let mut client = RateLimitServiceClient::new(channel());
        let mut served = Served::default();
        let mut tick = tokio::time::interval(every);
        for _ in 0..calls {
            tick.tick().await;
            if connect == Connect::Fresh {
                client = RateLimitServiceClient::new(channel());
            }
            let started = Instant::now();
            let mut request = tonic::Request::new(legitimate());
            request.set_timeout(Duration::from_secs(2));
            let answer = tokio::time::timeout(Duration::from_secs(3), client.should_rate_limit(request)).await;
            match answer {
                Ok(Ok(answer)) if answer.get_ref().overall_code() == Code::Ok => served.times.push(started.elapsed()),
                Ok(Ok(answer)) => served.failed.push(format!("{:?}", answer.get_ref().overall_code())),
                Ok(Err(status)) => served.failed.push(format!("{status:?}")),
                Err(_) => served.failed.push("no answer in 3 s".to_owned()),
            }
            made.send_modify(|n| *n += 1);
        }
        served
    })
}

/// An HTTP/1.1 client asking `/healthz` `calls` times, one every
/// `every`, within 2 s (a kept-alive connection the server closed is
/// opened again once for the same request).
fn http_client(addr: String, every: Duration, connect: Connect, calls: usize) -> Legitimate {
    Legitimate::spawn(move |made| async move {
        let mut served = Served::default();
        let mut conn: Option<TcpStream> = None;
        let mut tick = tokio::time::interval(every);
        for _ in 0..calls {
            tick.tick().await;
            let started = Instant::now();
            let mut answered = false;
            let tries = if connect == Connect::Kept { 2 } else { 1 };
            for _ in 0..tries {
                let stream = match conn.take() {
                    Some(stream) => stream,
                    None => match tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(&addr)).await {
                        Ok(Ok(stream)) => stream,
                        _ => continue,
                    },
                };
                if let Some(stream) = healthz(stream).await {
                    conn = (connect == Connect::Kept).then_some(stream);
                    answered = true;
                    break;
                }
            }
            if answered {
                served.times.push(started.elapsed());
            } else {
                served.failed.push("no answer in 2 s".to_owned());
            }
            made.send_modify(|n| *n += 1);
        }
        served
    })
}

/// `GET /healthz` on a kept-alive connection, within 2 s: the connection
/// back if answered 200.
async fn healthz(mut stream: TcpStream) -> Option<TcpStream> {
    tokio::time::timeout(Duration::from_secs(2), async {
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .ok()?;
        let mut answer = Vec::new();
        let mut buf = [0u8; 1024];
        loop {
            let n = stream.read(&mut buf).await.ok()?;
            if n == 0 {
                return None;
            }
            answer.extend_from_slice(&buf[..n]);
            if let Some(end) = answer.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&answer[..end]).to_ascii_lowercase();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                if answer.len() >= end + 4 + len {
                    return head.starts_with("http/1.1 200").then_some(());
                }
            }
        }
    })
    .await
    .ok()??;
    Some(stream)
}

/// A process's resident set size, in bytes (0 once it is gone).
fn rss_of(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb << 10)
}

/// Samples the process's size every 20 ms until `stop` is dropped: the
/// largest.
fn peak_rss(pid: u32, stop: std::sync::mpsc::Receiver<()>) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut peak = 0;
        loop {
            peak = peak.max(rss_of(pid));
            if stop.recv_timeout(Duration::from_millis(20)) != Err(std::sync::mpsc::RecvTimeoutError::Timeout) {
                break;
            }
        }
        peak
    })
}

// --- HTTP/2 by hand ---------------------------------------------------

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0;
const HEADERS: u8 = 1;
const SETTINGS: u8 = 4;
const PING: u8 = 6;
const WINDOW_UPDATE: u8 = 8;
const END_HEADERS: u8 = 4;

/// Appends a frame to `out`.
fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = u32::try_from(payload.len()).unwrap();
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

/// The header block of a `ShouldRateLimit` call, in HPACK without
/// indexing (so that every stream's block is the same bytes).
fn call_headers() -> Vec<u8> {
    let mut block = vec![0x83, 0x86]; // :method POST, :scheme http
    let literal = |block: &mut Vec<u8>, index: u8, value: &str| {
        block.push(index);
        block.push(u8::try_from(value.len()).unwrap());
        block.extend_from_slice(value.as_bytes());
    };
    literal(
        &mut block,
        0x04,
        "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
    );
    literal(&mut block, 0x01, "x"); // :authority
    block.extend_from_slice(&[0x0f, 0x10]); // content-type (index 31)
    block.push(16);
    block.extend_from_slice(b"application/grpc");
    block.extend_from_slice(&[0x00, 2]);
    block.extend_from_slice(b"te");
    block.push(8);
    block.extend_from_slice(b"trailers");
    block
}

/// An attacker's HTTP/2 connection: writes frames; a reader task drains
/// what the server sends and adds its connection-level `WINDOW_UPDATE`s
/// to the window, so that DATA is sent only within it.
struct H2Attacker {
    writer: tokio::net::tcp::OwnedWriteHalf,
    window: Arc<AtomicI64>,
    /// Woken when the window grows or the connection closes.
    grown: Arc<tokio::sync::Notify>,
    closed: Arc<AtomicBool>,
    next_stream: u32,
}

/// A connection to `addr` from the attackers' own address, 127.0.0.2 (as
/// an attack comes from other hosts than the clients, on 127.0.0.1).
async fn attacker_connect(addr: &str) -> Option<TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4().ok()?;
    socket.bind("127.0.0.2:0".parse().unwrap()).ok()?;
    let connect = socket.connect(addr.parse().ok()?);
    tokio::time::timeout(Duration::from_secs(2), connect).await.ok()?.ok()
}

impl H2Attacker {
    async fn connect(addr: &str) -> Option<H2Attacker> {
        let stream = attacker_connect(addr).await?;
        let (mut reader, mut writer) = stream.into_split();
        let mut hello = PREFACE.to_vec();
        frame(&mut hello, SETTINGS, 0, 0, &[]);
        writer.write_all(&hello).await.ok()?;
        let window = Arc::new(AtomicI64::new(65_535));
        let closed = Arc::new(AtomicBool::new(false));
        let grown = Arc::new(tokio::sync::Notify::new());
        let (w, c, g) = (Arc::clone(&window), Arc::clone(&closed), Arc::clone(&grown));
        tokio::spawn(async move {
            let mut buf = vec![0u8; 64 << 10];
            let mut pending = Vec::new();
            loop {
                match reader.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => pending.extend_from_slice(&buf[..n]),
                }
                let mut at = 0;
                while pending.len() >= at + 9 {
                    let len = (usize::from(pending[at]) << 16)
                        | (usize::from(pending[at + 1]) << 8)
                        | usize::from(pending[at + 2]);
                    if pending.len() < at + 9 + len {
                        break;
                    }
                    let stream = u32::from_be_bytes(pending[at + 5..at + 9].try_into().unwrap()) & 0x7fff_ffff;
                    if pending[at + 3] == WINDOW_UPDATE && stream == 0 && len == 4 {
                        let add = u32::from_be_bytes(pending[at + 9..at + 13].try_into().unwrap()) & 0x7fff_ffff;
                        w.fetch_add(i64::from(add), Ordering::Relaxed);
                        g.notify_one();
                    }
                    at += 9 + len;
                }
                pending.drain(..at);
            }
            c.store(true, Ordering::Relaxed);
            g.notify_one();
        });
        Some(H2Attacker {
            writer,
            window,
            grown,
            closed,
            next_stream: 1,
        })
    }

    fn closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }

    async fn send(&mut self, bytes: &[u8]) -> bool {
        matches!(
            tokio::time::timeout(Duration::from_secs(2), self.writer.write_all(bytes)).await,
            Ok(Ok(()))
        )
    }

    /// Opens `n` streams (headers only, never ended) in one write.
    async fn open_streams(&mut self, n: u32, block: &[u8]) -> bool {
        let mut out = Vec::with_capacity(n as usize * (block.len() + 9));
        for _ in 0..n {
            frame(&mut out, HEADERS, END_HEADERS, self.next_stream, block);
            self.next_stream += 2;
        }
        self.send(&out).await
    }

    /// Opens a stream and sends `body` bytes on it (never ended), waiting
    /// for the connection's window (at most 2 s).
    async fn stream_with_body(&mut self, block: &[u8], body: usize) -> bool {
        let id = self.next_stream;
        let mut out = Vec::with_capacity(body + 256);
        frame(&mut out, HEADERS, END_HEADERS, id, block);
        self.next_stream += 2;
        let until = tokio::time::Instant::now() + Duration::from_secs(2);
        while self.window.load(Ordering::Relaxed) < body as i64 {
            if self.closed() {
                return false;
            }
            if tokio::time::timeout_at(until, self.grown.notified()).await.is_err() {
                return false;
            }
        }
        self.window.fetch_sub(body as i64, Ordering::Relaxed);
        let chunk = vec![0u8; 15_000];
        let mut left = body;
        while left > 0 {
            let n = left.min(chunk.len());
            frame(&mut out, DATA, 0, id, &chunk[..n]);
            left -= n;
        }
        self.send(&out).await
    }
}

/// Runs `attack` on a fresh server while the legitimate gRPC client makes
/// `calls` calls, one every 10 ms, then stops it; the process's growth
/// (peak over the size before), the client's calls and the server.
async fn under_attack<F, Fut>(attack: F, calls: usize) -> (u64, Served, Serve)
where
    F: FnOnce(String, Arc<AtomicBool>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let serve = Serve::start(None, &[]);
    // Warm: the client's connection and a few calls.
    let warmed = grpc_client(serve.grpc.clone(), Duration::from_millis(10), Connect::Kept, 30)
        .finish()
        .await;
    assert!(
        warmed.failed.is_empty(),
        "not served before the attack: {:?}",
        warmed.failed
    );
    let before = serve.rss();
    let stop = Arc::new(AtomicBool::new(false));
    let (sampling, sampled) = std::sync::mpsc::channel();
    let peak = peak_rss(serve.child.id(), sampled);
    let client = grpc_client(serve.grpc.clone(), Duration::from_millis(10), Connect::Kept, calls);
    let attacking = tokio::spawn(attack(serve.grpc.clone(), Arc::clone(&stop)));
    let served = client.finish().await;
    stop.store(true, Ordering::Relaxed);
    drop(sampling);
    let _ = tokio::time::timeout(Duration::from_secs(5), attacking).await;
    let peak = peak.join().unwrap();
    (peak.saturating_sub(before), served, serve)
}

/// One connection opening 200,000 streams with headers only, none ended
/// (opening a new connection when the server closes one, until 200,000
/// are sent or the time is up).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_connection_opening_200000_streams_costs_only_itself() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let sent = Arc::new(AtomicU64::new(0));
    let connections = Arc::new(AtomicU64::new(0));
    let (s, c) = (Arc::clone(&sent), Arc::clone(&connections));
    let attack = move |addr: String, stop: Arc<AtomicBool>| async move {
        let block = call_headers();
        while !stop.load(Ordering::Relaxed) && s.load(Ordering::Relaxed) < 200_000 {
            let Some(mut conn) = H2Attacker::connect(&addr).await else {
                break;
            };
            c.fetch_add(1, Ordering::Relaxed);
            while !stop.load(Ordering::Relaxed) && s.load(Ordering::Relaxed) < 200_000 && !conn.closed() {
                if !conn.open_streams(1_000, &block).await {
                    break;
                }
                s.fetch_add(1_000, Ordering::Relaxed);
            }
        }
    };
    let (grew, served, serve) = under_attack(attack, 800).await;
    let sent = sent.load(Ordering::Relaxed);
    let figures = format!(
        "{sent} streams on {} connections; grew {} MB; legitimate: {} calls, p99 {:?}, failed {:?}",
        connections.load(Ordering::Relaxed),
        grew >> 20,
        served.times.len(),
        served.p99(),
        served.failed
    );
    eprintln!("200,000 streams: {figures}");
    assert!(sent >= 10_000, "the attack never got going: {figures}");
    assert!(grew < MEMORY_BOUND, "{figures}");
    assert!(served.failed.is_empty(), "{figures}");
    assert!(served.p99() < P99_BOUND, "{figures}");
    // The server's defences were counted, and logged at most a few times.
    let closed = serve.metric("slidegate_connections_closed_total").await.unwrap_or(0.0);
    eprintln!("closed by the defences: {closed}; log: {:?}", serve.log());
    let warnings = serve.log().iter().filter(|l| l.contains("WARN")).count();
    assert!(warnings <= 3, "{:#?}", serve.log());
}

/// One connection sending 25,000 streams of 60 KB each, none ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_connection_sending_25000_bodies_of_60kb_costs_only_itself() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let sent = Arc::new(AtomicU64::new(0));
    let s = Arc::clone(&sent);
    let attack = move |addr: String, stop: Arc<AtomicBool>| async move {
        let block = call_headers();
        // 4,000 streams (240 MB) a second: 25,000 in 6.25 s, leaving the
        // test's own process some of the two cores.
        let mut pace = tokio::time::interval(Duration::from_micros(250));
        while !stop.load(Ordering::Relaxed) && s.load(Ordering::Relaxed) < 25_000 {
            let Some(mut conn) = H2Attacker::connect(&addr).await else {
                break;
            };
            while !stop.load(Ordering::Relaxed) && s.load(Ordering::Relaxed) < 25_000 && !conn.closed() {
                if !conn.stream_with_body(&block, 60_000).await {
                    break;
                }
                s.fetch_add(1, Ordering::Relaxed);
                pace.tick().await;
            }
        }
    };
    let (grew, served, serve) = under_attack(attack, 800).await;
    let sent = sent.load(Ordering::Relaxed);
    let figures = format!(
        "{sent} streams of 60 KB; server CPU {:.1} s; grew {} MB; legitimate: {} calls, p99 {:?}, failed {:?}",
        serve.cpu(),
        grew >> 20,
        served.times.len(),
        served.p99(),
        served.failed
    );
    eprintln!("25,000 bodies: {figures}");
    assert!(sent >= 100, "the attack never got going: {figures}");
    assert!(grew < MEMORY_BOUND, "{figures}");
    assert!(served.failed.is_empty(), "{figures}");
    assert!(served.p99() < P99_BOUND, "{figures}");
}

/// Two connections, each holding all the streams it may open, changing
/// `SETTINGS_INITIAL_WINDOW_SIZE` back and forth: the legitimate client
/// (2 s deadlines) loses no call.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_settings_storm_costs_the_legitimate_client_no_call() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let frames = Arc::new(AtomicU64::new(0));
    let f = Arc::clone(&frames);
    let attack = move |addr: String, stop: Arc<AtomicBool>| async move {
        let block = call_headers();
        let mut storms = Vec::new();
        for _ in 0..2 {
            let (addr, stop, f, block) = (addr.clone(), Arc::clone(&stop), Arc::clone(&f), block.clone());
            storms.push(tokio::spawn(async move {
                let Some(mut conn) = H2Attacker::connect(&addr).await else {
                    return;
                };
                // As many streams as an old server took: 25,000.
                for _ in 0..25 {
                    if !conn.open_streams(1_000, &block).await {
                        return;
                    }
                }
                let mut storm = Vec::new();
                for i in 0..200u32 {
                    let size = if i % 2 == 0 { 1u32 } else { 1 << 20 };
                    let mut payload = vec![0, 4];
                    payload.extend_from_slice(&size.to_be_bytes());
                    frame(&mut storm, SETTINGS, 0, 0, &payload);
                }
                while !stop.load(Ordering::Relaxed) && !conn.closed() {
                    if !conn.send(&storm).await {
                        return;
                    }
                    f.fetch_add(200, Ordering::Relaxed);
                }
            }));
        }
        for storm in storms {
            let _ = storm.await;
        }
    };
    let (_, served, serve) = under_attack(attack, 600).await;
    let cpu = serve.cpu();
    let figures = format!(
        "{} SETTINGS frames; server CPU {cpu:.1} s in all; legitimate: {} calls, p99 {:?}, failed {:?}",
        frames.load(Ordering::Relaxed),
        served.times.len(),
        served.p99(),
        served.failed
    );
    eprintln!("SETTINGS storm: {figures}");
    assert!(
        frames.load(Ordering::Relaxed) > 0,
        "the attack never got going: {figures}"
    );
    assert!(served.failed.is_empty(), "{figures}");
}

/// Under `ulimit -n 64`: 500 connections that open HTTP/2 and then only
/// `PING` (each opened again when the server closes it), and 500 HTTP/1.1
/// keep-alive connections asking `/json` as fast as they can, as
/// `wrk -c500` would: a legitimate gRPC client and a legitimate HTTP client
/// are served throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_64_descriptors_trickling_connections_and_wrk_leave_clients_served() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let serve = Serve::start(Some(64), &[]);
    let stop = Arc::new(AtomicBool::new(false));
    // Clients that keep their connections, connected before the attack
    // (as Envoy's would be), and clients that connect for every call
    // during it.
    let every = Duration::from_millis(50);
    let mut grpc = grpc_client(serve.grpc.clone(), every, Connect::Kept, 160);
    let mut http = http_client(serve.http.clone(), every, Connect::Kept, 160);
    grpc.made(5).await;
    http.made(5).await;
    let fresh_grpc = grpc_client(serve.grpc.clone(), every * 4, Connect::Fresh, 40);
    let fresh_http = http_client(serve.http.clone(), every * 4, Connect::Fresh, 40);
    let mut attackers = Vec::new();
    let wrk_answers = Arc::new(AtomicU64::new(0));
    for _ in 0..500 {
        let (addr, done) = (serve.grpc.clone(), Arc::clone(&stop));
        attackers.push(tokio::spawn(async move {
            let mut ping = Vec::new();
            frame(&mut ping, PING, 0, 0, &[0; 8]);
            // At most a connection every 50 ms, a PING every 500 ms.
            let mut connects = tokio::time::interval(Duration::from_millis(50));
            let mut pings = tokio::time::interval(Duration::from_millis(500));
            while !done.load(Ordering::Relaxed) {
                connects.tick().await;
                let Some(mut conn) = H2Attacker::connect(&addr).await else {
                    continue;
                };
                while !done.load(Ordering::Relaxed) && !conn.closed() {
                    if !conn.send(&ping).await {
                        break;
                    }
                    pings.tick().await;
                }
            }
        }));
        let (addr, done, answers) = (serve.http.clone(), Arc::clone(&stop), Arc::clone(&wrk_answers));
        attackers.push(tokio::spawn(async move {
            let body = r#"{"domain":"abuse","descriptors":[{"entries":[{"key":"user","value":"wrk"}]}]}"#;
            let request = format!(
                "POST /json HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            let mut buf = vec![0u8; 4096];
            // After a connection that could not be made, 50 ms.
            let mut retry = tokio::time::interval(Duration::from_millis(50));
            while !done.load(Ordering::Relaxed) {
                let Some(mut stream) = attacker_connect(&addr).await else {
                    retry.tick().await;
                    continue;
                };
                while !done.load(Ordering::Relaxed) {
                    if stream.write_all(request.as_bytes()).await.is_err() {
                        break;
                    }
                    match tokio::time::timeout(Duration::from_secs(1), stream.read(&mut buf)).await {
                        Ok(Ok(n)) if n > 0 => {
                            answers.fetch_add(1, Ordering::Relaxed);
                        }
                        _ => break,
                    }
                }
            }
        }));
    }
    // The attack lasts as long as the clients' calls (about 8 s).
    let clients = [
        ("gRPC, kept", grpc.finish().await),
        ("HTTP, kept", http.finish().await),
        ("gRPC, fresh", fresh_grpc.finish().await),
        ("HTTP, fresh", fresh_http.finish().await),
    ];
    stop.store(true, Ordering::Relaxed);
    for attacker in attackers {
        let _ = tokio::time::timeout(Duration::from_secs(5), attacker).await;
    }
    let mut figures = format!("wrk answers {}", wrk_answers.load(Ordering::Relaxed));
    for (name, served) in &clients {
        figures += &format!(
            "; {name}: {} served, p99 {:?}, failed {} {:?}",
            served.times.len(),
            served.p99(),
            served.failed.len(),
            served.failed.first()
        );
    }
    eprintln!("ulimit -n 64: {figures}");
    let closed = serve.metric("slidegate_connections_closed_total").await;
    let accept_errors = serve.metric("slidegate_accept_errors_total").await;
    eprintln!("closed by the defences: {closed:?}; accept errors: {accept_errors:?}");
    for (_, served) in &clients {
        assert!(served.failed.is_empty() && !served.times.is_empty(), "{figures}");
    }
    let warnings = serve.log().iter().filter(|l| l.contains("WARN")).count();
    assert!(warnings <= 3, "{:#?}", serve.log());
}
