//! Redis faults against the real `slidegate serve` processes, for issue
//! [harden]: the `local` failure policy's stated bound through a pause
//! (SIGSTOP) and an empty restart, with 2 and with 4 instances on one
//! Redis; every decision answered within `--redis-timeout` and a margin
//! (by the failure policy when it must) with Redis slow, lossy and paused,
//! for a timeout of 3 s and of 200 ms; the hybrid mode killed with
//! SIGKILL losing what it had not synced (and stopped with SIGTERM,
//! nothing).
//!
//! The issue asks for Redis behind a network namespace of the test's own
//! with `tc netem` (200 ms of delay, 10 % loss). This machine's kernel has
//! no `sch_netem` (`tc qdisc add dev lo root netem delay 1ms` answers
//! "Specified qdisc kind is unknown"), though `ip netns` and veth pairs
//! work; so the latency and the loss are a TCP proxy of the test's own on
//! 127.0.0.1, between `slidegate serve` and `redis-server` ([`Proxy`]):
//! each chunk it reads is passed on 200 ms later, in order, and one chunk
//! in ten is held 1 s more, as a lost segment waits for its
//! retransmission and holds back what follows it. A pause is a real
//! SIGSTOP of `redis-server`.
//!
//! The tests take turns (one lock), so that the answer times are measured
//! on a machine that runs only one of them; they wait on conditions with
//! bounded deadlines, never for a fixed time. RELIABILITY.md records what
//! they show.

#![cfg(unix)]

mod common;

use slidegate_conformance::redis::RedisServer;
use slidegate_server::proto::descriptor::RateLimitDescriptor;
use slidegate_server::proto::descriptor::rate_limit_descriptor::Entry;
use slidegate_server::proto::rls::RateLimitRequest;
use slidegate_server::proto::rls::rate_limit_response::Code;
use slidegate_server::proto::rls::rate_limit_service_client::RateLimitServiceClient;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::Channel;

type Client = RateLimitServiceClient<Channel>;

/// One test at a time: answer times are bounds checked on a machine that
/// runs one test's processes, not two tests' at once.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The limit of the bound tests, per hour: every phase of a test fits in
/// one window, whatever the machine's speed.
const LIMIT: u64 = 50;

/// Room beyond a timeout for a debug build on a busy 2-core machine: the
/// policy answers in microseconds once the timeout has fired.
const MARGIN: Duration = Duration::from_millis(500);

/// A call not answered within this has hung.
const HANG: Duration = Duration::from_secs(10);

/// A `slidegate serve` process on free loopback ports, its config in a
/// directory of its own; killed on drop if still running.
struct Serve {
    child: Option<Child>,
    log: Receiver<String>,
    http: String,
    grpc: String,
    dir: PathBuf,
}

impl Serve {
    /// `serve --config <dir with yaml>` and `extra`, once it listens.
    fn start(yaml: &str, extra: &[&str]) -> Serve {
        static DIRS: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "slidegate-redis-faults-{}-{}",
            std::process::id(),
            DIRS.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("domain.yaml"), yaml).unwrap();
        let mut args = vec!["--reload-every", "0s", "--config", dir.to_str().unwrap()];
        args.extend_from_slice(extra);
        let (child, log) = common::serve_logging(&args);
        let mut seen = Vec::new();
        let (http, grpc) = common::next_line(&log, &mut seen, common::listening_on);
        Serve {
            child: Some(child),
            log,
            http,
            grpc,
            dir,
        }
    }

    async fn client(&self) -> Client {
        let channel = common::channel(&self.grpc).await;
        RateLimitServiceClient::new(channel)
    }

    /// The value of the metric named exactly `name` (labels included), 0
    /// when it is not there.
    fn metric(&self, name: &str) -> f64 {
        common::request(&self.http, "GET", "/metrics", "")
            .lines()
            .find(|l| l.rsplit_once(' ').is_some_and(|(n, _)| n == name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    }

    fn fallbacks(&self) -> f64 {
        self.metric("slidegate_redis_fallbacks_total{source=\"local\"}")
    }

    /// SIGTERM: a clean exit (0), and no panic in the log.
    fn stop(mut self) {
        let child = self.child.take().unwrap();
        common::terminate(child);
        let log: Vec<String> = self.log.try_iter().collect();
        assert!(!log.iter().any(|l| l.contains("panicked")), "{log:#?}");
    }

    /// SIGKILL: no shutdown, nothing flushed.
    fn kill(mut self) {
        let mut child = self.child.take().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Domain `f`: `user` limited to `limit` an hour (the default algorithm,
/// a sliding window of 8 buckets).
fn yaml(limit: u64) -> String {
    format!("domain: f\ndescriptors:\n  - key: user\n    rate_limit: {{ unit: hour, requests_per_unit: {limit} }}\n")
}

/// What one call answered: admitted or not, and the limit's remaining.
#[derive(Clone, Copy, Debug)]
struct Answer {
    ok: bool,
    remaining: u64,
}

/// One call of descriptor `user=value`; its answer and how long it took.
/// Panics on a gRPC error or a hang.
async fn hit(client: &mut Client, value: &str) -> (Answer, Duration) {
    let request = RateLimitRequest {
        domain: "f".to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".to_owned(),
                value: value.to_owned(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    };
    let start = Instant::now();
    let response = tokio::time::timeout(HANG, client.should_rate_limit(request))
        .await
        .unwrap_or_else(|_| panic!("{value}: no answer within {HANG:?}"))
        .unwrap_or_else(|status| panic!("{value}: gRPC error {status}"))
        .into_inner();
    let took = start.elapsed();
    let ok = response.overall_code() == Code::Ok;
    let remaining = response.statuses.first().map_or(0, |s| u64::from(s.limit_remaining));
    (Answer { ok, remaining }, took)
}

/// The pid of a `redis-server`, from `INFO server`.
fn redis_pid(redis: &RedisServer) -> u32 {
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query(&mut redis.sync_conn().unwrap())
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .and_then(|p| p.trim().parse().ok())
        .expect("INFO server names the process")
}

fn signal(name: &str, pid: u32) -> bool {
    Command::new("kill")
        .args([format!("-{name}"), pid.to_string()])
        .status()
        .is_ok_and(|s| s.success())
}

/// Sends SIGCONT to a paused Redis when dropped, even when a test fails.
struct Resume(u32);

impl Drop for Resume {
    fn drop(&mut self) {
        assert!(signal("CONT", self.0), "SIGCONT to Redis");
    }
}

/// Waits (bounded: 20 s) until each server decides a call from Redis
/// again: a call during which its local fallbacks did not grow.
async fn until_redis_decides(servers: &[Serve], clients: &mut [Client]) {
    for (serve, client) in servers.iter().zip(clients.iter_mut()) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let before = serve.fallbacks();
            hit(client, "probe").await;
            if serve.fallbacks() == before {
                break;
            }
            assert!(Instant::now() < deadline, "Redis never decided again");
        }
    }
}

/// What the instances saw of one key before an outage, and what was
/// admitted of it in all.
struct Key {
    name: String,
    /// Instance `i`'s last answer before the outage (Redis's), if any.
    seen: Vec<Option<Answer>>,
    admitted: u64,
}

impl Key {
    fn new(name: String, instances: usize) -> Key {
        Key {
            name,
            seen: vec![None; instances],
            admitted: 0,
        }
    }

    /// `L × (1 + restarts) + Σᵢ (⌈L/N⌉ − ⌈uᵢ/N⌉)`, `uᵢ` the count Redis
    /// reported to instance `i` (the limit minus the remaining it
    /// answered; 0 when it answered none): the bound of
    /// `FailurePolicy::Local`.
    fn bound(&self, restarts: u64) -> u64 {
        let n = self.seen.len() as u64;
        let share = LIMIT.div_ceil(n);
        let local: u64 = self
            .seen
            .iter()
            .map(|a| share - a.map_or(0, |a| LIMIT - a.remaining).div_ceil(n))
            .sum();
        LIMIT * (1 + restarts) + local
    }
}

/// `calls` calls on `key`, one instance after another of `instances`
/// (indices into `clients`), in order; each answer kept as the instance's
/// last seen when `record`.
async fn spread(clients: &mut [Client], instances: &[usize], key: &mut Key, calls: usize, record: bool) {
    for c in 0..calls {
        let i = instances[c % instances.len()];
        let (answer, _) = hit(&mut clients[i], &key.name).await;
        key.admitted += u64::from(answer.ok);
        if record {
            key.seen[i] = Some(answer);
        }
    }
}

/// The outage's calls: each instance `calls` calls on each key, the
/// instances at once; each answered within the timeout and the margin.
async fn during_outage(clients: &[Client], keys: &mut [Key], calls: usize, timeout: Duration) {
    let names: Arc<Vec<String>> = Arc::new(keys.iter().map(|k| k.name.clone()).collect());
    let tasks: Vec<_> = clients
        .iter()
        .map(|client| {
            let (mut client, names) = (client.clone(), Arc::clone(&names));
            tokio::spawn(async move {
                let mut admitted = vec![0u64; names.len()];
                for _ in 0..calls {
                    for (k, name) in names.iter().enumerate() {
                        let (answer, took) = hit(&mut client, name).await;
                        assert!(took <= timeout + MARGIN, "{name}: answered after {took:?}");
                        admitted[k] += u64::from(answer.ok);
                    }
                }
                admitted
            })
        })
        .collect();
    for task in tasks {
        for (key, admitted) in keys.iter_mut().zip(task.await.unwrap()) {
            key.admitted += admitted;
        }
    }
}

/// Drives three keys through Redis before an outage: `all`, spread over
/// every instance until each has seen it at its limit; `one`, to its limit
/// through the first instance alone (the others never see it); `part`, to
/// a little past half its limit, spread (each instance saw another count).
async fn drive(clients: &mut [Client], prefix: &str) -> Vec<Key> {
    let n = clients.len();
    let every: Vec<usize> = (0..n).collect();
    let mut all = Key::new(format!("{prefix}-all"), n);
    spread(clients, &every, &mut all, LIMIT as usize + n, true).await;
    let mut one = Key::new(format!("{prefix}-one"), n);
    spread(clients, &[0], &mut one, LIMIT as usize, true).await;
    let mut part = Key::new(format!("{prefix}-part"), n);
    spread(clients, &every, &mut part, LIMIT as usize / 2 + 3, true).await;
    assert_eq!(
        (all.admitted, one.admitted, part.admitted),
        (LIMIT, LIMIT, LIMIT / 2 + 3),
        "Redis decides before the outage"
    );
    vec![all, one, part]
}

/// `n` instances with `--redis-failure local --redis-instances n` on one
/// Redis, a limit of 50 an hour: keys driven to their limits through Redis
/// (see [`drive`]), then Redis paused, then resumed, then keys driven again
/// and Redis SIGKILLed and started again on its port, empty; requests
/// spread over every instance throughout. The admitted total of each key in
/// its window stays within `FailurePolicy::Local`'s bound, and a key every
/// instance saw at its limit is admitted `L` through the pause and `2L`
/// through the empty restart.
///
/// Before the seeding (each instance falling back from zero; measured with
/// it turned off) the same run admitted of the `all` key 100 (2
/// instances) and 102 (4) through the pause, 150 and 152 through the empty
/// restart: `L + N⌈L/N⌉` and `2L + N⌈L/N⌉`, whatever Redis had counted.
async fn local_bound(n: usize) {
    let _turn = TURN.lock().await;
    let redis = RedisServer::start();
    let (port, url) = (redis.port(), redis.url());
    let count = n.to_string();
    let servers: Vec<Serve> = (0..n)
        .map(|_| {
            Serve::start(
                &yaml(LIMIT),
                &[
                    "--redis",
                    &url,
                    "--redis-failure",
                    "local",
                    "--redis-instances",
                    &count,
                    "--redis-timeout",
                    "200ms",
                ],
            )
        })
        .collect();
    let mut clients = Vec::new();
    for serve in &servers {
        clients.push(serve.client().await);
    }
    let timeout = Duration::from_millis(200);
    let share = LIMIT.div_ceil(n as u64) as usize;
    let every: Vec<usize> = (0..n).collect();

    // Paused: each instance is asked more than its share of every key.
    let mut paused = drive(&mut clients, "pause").await;
    let pid = redis_pid(&redis);
    let resume = Resume(pid);
    assert!(signal("STOP", pid));
    during_outage(&clients, &mut paused, share + 3, timeout).await;
    drop(resume);
    for serve in &servers {
        assert!(serve.fallbacks() > 0.0, "the policy decided while Redis was paused");
    }
    // Back with its counts: Redis admits what it has left.
    until_redis_decides(&servers, &mut clients).await;
    for key in &mut paused {
        spread(&mut clients, &every, key, LIMIT as usize + n, false).await;
    }

    // Restarted empty: Redis admits the limit again.
    let mut restarted = drive(&mut clients, "restart").await;
    redis.kill();
    during_outage(&clients, &mut restarted, share + 3, timeout).await;
    let redis = RedisServer::start_on(port, &[]).expect("the port is free again");
    until_redis_decides(&servers, &mut clients).await;
    for key in &mut restarted {
        spread(&mut clients, &every, key, LIMIT as usize + n, false).await;
    }

    // Every figure first, then the checks.
    let mut past = Vec::new();
    for (keys, restarts, what) in [(&paused, 0, "paused"), (&restarted, 1, "restarted empty")] {
        for key in keys.iter() {
            let bound = key.bound(restarts);
            eprintln!(
                "{n} instances, Redis {what}: {} admitted {} in one window of {LIMIT} (bound {bound})",
                key.name, key.admitted
            );
            if key.admitted > bound {
                past.push(format!("{}: {} past the bound {bound}", key.name, key.admitted));
            }
        }
    }
    assert!(past.is_empty(), "{n} instances: {past:?}");
    // Every instance saw `all` at its limit: L, and 2L.
    assert_eq!(paused[0].bound(0), LIMIT);
    assert_eq!((paused[0].admitted, restarted[0].admitted), (LIMIT, 2 * LIMIT));
    // `one`: the others fell back from zero, each its share; the bound
    // is reached exactly.
    assert_eq!(paused[1].admitted, paused[1].bound(0));
    assert_eq!(restarted[1].admitted, restarted[1].bound(1));
    for serve in servers {
        serve.stop();
    }
    drop(redis);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_policy_bound_two_instances() {
    local_bound(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_policy_bound_four_instances() {
    local_bound(4).await;
}

/// A TCP proxy on 127.0.0.1 in front of a port, which passes every chunk
/// on at once, or ([`Proxy::set_slow`]) 200 ms late with one chunk in ten
/// held 1 s more, in order each way (what `tc netem delay 200ms loss 10%`
/// would do to a link, a lost segment waiting for its retransmission).
struct Proxy {
    port: u16,
    slow: Arc<AtomicBool>,
    accept: tokio::task::JoinHandle<()>,
}

/// The delay of every chunk while slow.
const DELAY: Duration = Duration::from_millis(200);
/// The extra delay of a "lost" chunk.
const RETRANSMIT: Duration = Duration::from_secs(1);

impl Proxy {
    async fn start(upstream: u16) -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let slow = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&slow);
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await else {
                    continue;
                };
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                tokio::spawn(pipe(client_read, server_write, Arc::clone(&flag)));
                tokio::spawn(pipe(server_read, client_write, Arc::clone(&flag)));
            }
        });
        Proxy { port, slow, accept }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn set_slow(&self, slow: bool) {
        self.slow.store(slow, Ordering::Relaxed);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Copies `from` to `to`, each chunk when it is due: at once, or (while
/// `slow`) after [`DELAY`], every tenth chunk after [`RETRANSMIT`] more;
/// a chunk never overtakes the one before it.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    slow: Arc<AtomicBool>,
) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let reader = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        let mut chunks = 0u64;
        while let Ok(read) = from.read(&mut buf).await {
            if read == 0 {
                break;
            }
            chunks += 1;
            let mut due = tokio::time::Instant::now();
            if slow.load(Ordering::Relaxed) {
                due += DELAY;
                if chunks.is_multiple_of(10) {
                    due += RETRANSMIT;
                }
            }
            if tx.send((due, buf[..read].to_vec())).is_err() {
                break;
            }
        }
    });
    while let Some((due, bytes)) = rx.recv().await {
        tokio::time::sleep_until(due).await;
        if to.write_all(&bytes).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
    reader.abort();
}

/// `calls` calls at once on fresh keys (one each, so that none is
/// refused for its count); how long each took, sorted.
async fn at_once(client: &Client, prefix: &str, calls: usize) -> Vec<Duration> {
    let tasks: Vec<_> = (0..calls)
        .map(|c| {
            let mut client = client.clone();
            let key = format!("{prefix}-{c}");
            tokio::spawn(async move { hit(&mut client, &key).await.1 })
        })
        .collect();
    let mut took = Vec::new();
    for task in tasks {
        took.push(task.await.unwrap());
    }
    took.sort();
    took
}

/// `calls` calls, `in_flight` at a time, on one key each round; how long
/// each took, sorted.
async fn under_load(client: &Client, prefix: &str, calls: usize, in_flight: usize) -> Vec<Duration> {
    let mut took = Vec::new();
    for round in 0..calls.div_ceil(in_flight) {
        took.extend(at_once(client, &format!("{prefix}-{round}"), in_flight).await);
    }
    took.sort();
    took
}

fn summary(took: &[Duration]) -> String {
    let at = |q: f64| took[((took.len() - 1) as f64 * q) as usize];
    format!(
        "{} calls: min {:?}, median {:?}, max {:?}",
        took.len(),
        at(0.0),
        at(0.5),
        at(1.0)
    )
}

/// `--redis-timeout` 3 s and 200 ms, each on its own instance, both
/// reaching Redis through [`Proxy`]: with Redis slow and lossy, and with
/// Redis paused, every call is answered within its instance's timeout and
/// the margin, by the failure policy (`local`) when Redis does not answer
/// in time; paused, the calls wait the whole timeout first — 3 s, not the
/// Redis client's 500 ms (before the fix every call of the 3 s instance
/// was answered at 0.5 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_decision_answers_within_the_redis_timeout() {
    let _turn = TURN.lock().await;
    let redis = RedisServer::start();
    let proxy = Proxy::start(redis.port()).await;
    let url = proxy.url();
    let timeouts = [("3s", Duration::from_secs(3)), ("200ms", Duration::from_millis(200))];
    let servers: Vec<Serve> = timeouts
        .iter()
        .map(|(flag, _)| {
            Serve::start(
                &yaml(1_000_000),
                &["--redis", &url, "--redis-failure", "local", "--redis-timeout", flag],
            )
        })
        .collect();
    let mut clients = Vec::new();
    for serve in &servers {
        clients.push(serve.client().await);
    }

    // Every phase's figures first, then the checks: (what, timeout, the
    // calls' times, sorted, and how many the failure policy answered).
    let mut phases: Vec<(&str, Duration, Vec<Duration>, f64)> = Vec::new();

    // Slow and lossy: 200 ms each way, one chunk in ten 1 s more.
    proxy.set_slow(true);
    for (((_, timeout), serve), client) in timeouts.iter().zip(&servers).zip(&clients) {
        let before = serve.fallbacks();
        let took = under_load(client, &format!("slow-{}", timeout.as_millis()), 40, 8).await;
        phases.push(("slow and lossy", *timeout, took, serve.fallbacks() - before));
    }
    proxy.set_slow(false);
    until_redis_decides(&servers, &mut clients).await;

    // Paused: 20 calls at once on each.
    let pid = redis_pid(&redis);
    let resume = Resume(pid);
    assert!(signal("STOP", pid));
    for (((_, timeout), serve), client) in timeouts.iter().zip(&servers).zip(&clients) {
        let before = serve.fallbacks();
        let took = at_once(client, &format!("paused-{}", timeout.as_millis()), 20).await;
        phases.push(("paused", *timeout, took, serve.fallbacks() - before));
    }
    drop(resume);

    for (what, timeout, took, fallbacks) in &phases {
        eprintln!(
            "{what} Redis, --redis-timeout {timeout:?}: {}, {fallbacks} by the failure policy",
            summary(took)
        );
    }
    for (what, timeout, took, fallbacks) in &phases {
        let (median, slowest, calls) = (took[took.len() / 2], took[took.len() - 1], took.len() as f64);
        assert!(
            slowest <= *timeout + MARGIN,
            "{what}, {timeout:?}: a call took {slowest:?}"
        );
        match *what {
            // No round trip fits in the timeout: the policy answers every
            // call, the first at the timeout, most at once in its backoff.
            "slow and lossy" if *timeout < DELAY * 2 => {
                assert_eq!(*fallbacks, calls, "{what}, {timeout:?}");
                assert!(slowest >= *timeout, "{what}, {timeout:?}: the slowest took {slowest:?}");
            }
            // Round trips of 0.4 s, some 1.4 s or more: Redis decides
            // most.
            "slow and lossy" => assert!(*fallbacks < calls / 2.0, "{what}, {timeout:?}: {fallbacks} fallbacks"),
            // All wait the whole timeout (the first call's, which the
            // others joined), then the policy answers: sent together,
            // answered together, at the timeout (not sooner: at 0.5 s
            // the Redis client's own timeout answered first).
            _ => {
                assert_eq!(*fallbacks, calls, "{what}, {timeout:?}");
                assert!(slowest >= *timeout, "{what}, {timeout:?}: the slowest took {slowest:?}");
                assert!(
                    median >= *timeout * 9 / 10,
                    "{what}, {timeout:?}: half the calls answered within {median:?}"
                );
            }
        }
    }
    for serve in servers {
        serve.stop();
    }
    drop(proxy);
    drop(redis);
}

/// The hybrid mode killed with SIGKILL: the counts it admitted since its
/// last sync never reach Redis (a process killed cannot send them), so
/// another instance admits them again in the same window: 100 admitted in
/// a window of 50. Stopped with SIGTERM it sends them first, and Redis
/// holds every one. The instance killed syncs every 30 s, so that the kill
/// comes before its next sync: what it loses is everything since its last
/// (at most one interval's admissions while Redis answers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hybrid_mode_killed_loses_what_it_had_not_synced() {
    let _turn = TURN.lock().await;
    let redis = RedisServer::start();
    let url = redis.url();
    let hybrid = |interval: &str| {
        Serve::start(
            &yaml(LIMIT),
            &[
                "--redis",
                &url,
                "--redis-sync-interval",
                interval,
                "--redis-failure",
                "closed",
            ],
        )
    };
    let admitted = async |serve: &Serve, key: &str, calls: usize| {
        let mut client = serve.client().await;
        let mut ok = 0;
        for _ in 0..calls {
            ok += u64::from(hit(&mut client, key).await.0.ok);
        }
        ok
    };

    let killed = hybrid("30s");
    let first = admitted(&killed, "killed", LIMIT as usize).await;
    killed.kill();
    let lost = first - redis.ring_count("user6:killed");
    // Another instance, syncing every 50 ms, on the same key.
    let other = hybrid("50ms");
    let second = admitted(&other, "killed", LIMIT as usize + 10).await;
    eprintln!(
        "hybrid mode: {first} admitted, SIGKILL before a sync: {lost} lost; another instance then admitted {second}: {} in one window of {LIMIT}",
        first + second
    );
    // The other instance admits again exactly what Redis never got. The
    // sync task's first round runs as it starts, and may catch the first
    // count (one CI run: 49 lost of 50); the next is 30 s away.
    // The other instance decides locally until its own first sync pulls
    // Redis's count: when the killed one's first round did catch a count,
    // the other's first hits may still come before that pull (one CI run:
    // 49 lost, 50 admitted again). Never fewer than were lost, never more
    // than the limit.
    assert_eq!(first, LIMIT);
    assert!(lost >= LIMIT - 1, "{lost} lost of {first}");
    assert!((lost..=LIMIT).contains(&second), "{second} admitted again, {lost} lost");
    other.stop();

    let stopped = hybrid("30s");
    assert_eq!(admitted(&stopped, "stopped", LIMIT as usize).await, LIMIT);
    stopped.stop();
    assert_eq!(
        redis.ring_count("user7:stopped"),
        LIMIT,
        "SIGTERM sends what was not synced"
    );
    drop(redis);
}
