//! Faults and floods against the real `slidegate serve` process, each under
//! a bounded load from the test (gRPC `ShouldRateLimit`, a few thousand
//! calls, several in flight): Redis killed, started again on the same port
//! (an empty script cache) and paused (SIGSTOP) for each failure policy; a
//! cluster master killed; the hybrid mode through a kill and a restart; a
//! flood of distinct keys against a small memory budget. Every call must
//! be answered, without a gRPC error, within the Redis timeout and a
//! margin; the service must never panic and must exit 0 on SIGTERM. The
//! tests wait on conditions with bounded deadlines, never for a fixed time.
//! RELIABILITY.md records what each shows.

#![cfg(unix)]

mod common;

use slidegate_conformance::redis::{RedisCluster, RedisServer};
use slidegate_server::proto::descriptor::RateLimitDescriptor;
use slidegate_server::proto::descriptor::rate_limit_descriptor::Entry;
use slidegate_server::proto::rls::RateLimitRequest;
use slidegate_server::proto::rls::rate_limit_response::Code;
use slidegate_server::proto::rls::rate_limit_service_client::RateLimitServiceClient;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tonic::transport::Channel;

/// The `--redis-timeout` of the fault tests.
const TIMEOUT: Duration = Duration::from_millis(200);
/// Room beyond the timeout for a debug build on a busy 2-core machine.
const MARGIN: Duration = Duration::from_secs(1);
/// A call not answered within this has hung.
const HANG: Duration = Duration::from_secs(5);

type Client = RateLimitServiceClient<Channel>;

/// A `slidegate serve` process on free loopback ports, with its stderr
/// kept (to look for panics); killed on drop if still running.
struct Serve {
    child: Option<Child>,
    http: String,
    grpc: String,
    stderr: Arc<Mutex<String>>,
    dir: PathBuf,
}

impl Serve {
    fn start(yaml: &str, extra: &[&str]) -> Serve {
        static DIRS: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "slidegate-reliability-{}-{}",
            std::process::id(),
            DIRS.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("domain.yaml"), yaml).unwrap();
        let mut child = common::slidegate()
            .args([
                "serve",
                "--http",
                "127.0.0.1:0",
                "--grpc",
                "127.0.0.1:0",
                "--reload-every",
                "0s",
            ])
            .arg("--config")
            .arg(&dir)
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the binary starts");
        let mut lines = BufReader::new(child.stderr.take().expect("stderr is piped")).lines();
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut line = None;
        for l in lines.by_ref().map_while(Result::ok) {
            stderr.lock().unwrap().push_str(&format!("{l}\n"));
            if l.starts_with("slidegate: HTTP on ") {
                line = Some(l);
                break;
            }
        }
        let Some(line) = line else {
            panic!("the server never listened: {}", stderr.lock().unwrap());
        };
        // Keep the rest of stderr (and keep draining it).
        let kept = Arc::clone(&stderr);
        std::thread::spawn(move || {
            for l in lines.map_while(Result::ok) {
                kept.lock().unwrap().push_str(&format!("{l}\n"));
            }
        });
        let rest = &line["slidegate: HTTP on ".len()..];
        let (http, grpc) = rest.split_once(", gRPC on ").expect("both addresses");
        Serve {
            child: Some(child),
            http: http.to_owned(),
            grpc: grpc.to_owned(),
            stderr,
            dir,
        }
    }

    async fn client(&self) -> Client {
        let channel = common::channel(&self.grpc).await;
        RateLimitServiceClient::new(channel)
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// `/metrics`, whole.
    fn metrics(&self) -> String {
        let mut stream = TcpStream::connect(&self.http).expect("the server accepts");
        stream.set_read_timeout(Some(HANG)).unwrap();
        write!(stream, "GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").unwrap();
        let mut text = String::new();
        stream.read_to_string(&mut text).unwrap();
        text
    }

    /// The value of the metric named exactly `name` (labels included), 0
    /// when it is not there.
    fn metric(&self, name: &str) -> f64 {
        self.metrics()
            .lines()
            .find(|l| l.rsplit_once(' ').is_some_and(|(n, _)| n == name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    }

    fn fallbacks(&self, source: &str) -> f64 {
        self.metric(&format!("slidegate_redis_fallbacks_total{{source=\"{source}\"}}"))
    }

    /// SIGTERM: the process must exit 0 (within 20 s) and never have
    /// panicked.
    fn stop(mut self) {
        let mut child = self.child.take().unwrap();
        let pid = child.id();
        assert!(signal("TERM", pid), "SIGTERM to the server");
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break Some(status);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::yield_now();
        };
        // The drain thread ends with the pipe; give it a bounded moment.
        let stderr = self.stderr.lock().unwrap().clone();
        assert!(!stderr.contains("panicked"), "the server panicked:\n{stderr}");
        assert_eq!(status.and_then(|s| s.code()), Some(0), "exit after SIGTERM\n{stderr}");
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

fn signal(name: &str, pid: u32) -> bool {
    Command::new("kill")
        .args([format!("-{name}"), pid.to_string()])
        .status()
        .is_ok_and(|s| s.success())
}

/// One call of one descriptor `key=value` in domain `f`: its overall code,
/// or why there is none (a gRPC error, or no answer within [`HANG`]); and
/// how long it took.
async fn hit(client: &mut Client, key: &str, value: &str) -> (Result<Code, String>, Duration) {
    let request = descriptors_request(key, std::iter::once(value.to_owned()), 0);
    let start = Instant::now();
    let answer = match tokio::time::timeout(HANG, client.should_rate_limit(request)).await {
        Ok(Ok(response)) => Ok(response.into_inner().overall_code()),
        Ok(Err(status)) => Err(format!("gRPC error: {status}")),
        Err(_) => Err(format!("no answer within {HANG:?}")),
    };
    (answer, start.elapsed())
}

/// One call in domain `f` of a descriptor `key=value` per value, each
/// counting `hits_addend` (0: one).
fn descriptors_request(key: &str, values: impl Iterator<Item = String>, hits_addend: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: "f".to_owned(),
        descriptors: values
            .map(|value| RateLimitDescriptor {
                entries: vec![Entry {
                    key: key.to_owned(),
                    value,
                }],
                ..Default::default()
            })
            .collect(),
        hits_addend,
    }
}

/// Asks every user `per_user` times, `in_flight` calls at a time; asserts
/// that every call was answered within the timeout and the margin; the
/// number of `OK` answers per user.
async fn round(client: &Client, users: &[String], per_user: usize, in_flight: usize) -> Vec<usize> {
    let next = Arc::new(AtomicUsize::new(0));
    let work: Arc<Vec<usize>> = Arc::new((0..per_user).flat_map(|_| 0..users.len()).collect());
    let users = Arc::new(users.to_vec());
    let mut tasks = Vec::new();
    for _ in 0..in_flight {
        let (next, work, users, mut client) =
            (Arc::clone(&next), Arc::clone(&work), Arc::clone(&users), client.clone());
        tasks.push(tokio::spawn(async move {
            let mut ok = vec![0; users.len()];
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&user) = work.get(i) else { break };
                let (answer, took) = hit(&mut client, "user", &users[user]).await;
                let code = answer.unwrap_or_else(|e| panic!("{}: {e}", users[user]));
                assert!(took < TIMEOUT + MARGIN, "{}: answered after {took:?}", users[user]);
                ok[user] += usize::from(code == Code::Ok);
            }
            ok
        }));
    }
    let mut ok = vec![0; users.len()];
    for task in tasks {
        for (sum, n) in ok.iter_mut().zip(task.await.unwrap()) {
            *sum += n;
        }
    }
    ok
}

/// A load in the background for the whole test, on its own key: calls in
/// a loop (at most 20,000), each checked for an answer without a gRPC
/// error within the timeout and the margin.
struct Background {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<(u64, Duration, Vec<String>)>>,
}

impl Background {
    fn start(client: &Client, tasks: usize) -> Background {
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = (0..tasks)
            .map(|_| {
                let (stop, mut client) = (Arc::clone(&stop), client.clone());
                tokio::spawn(async move {
                    let (mut calls, mut slowest, mut failures) = (0, Duration::ZERO, Vec::new());
                    while !stop.load(Ordering::Relaxed) && calls < 10_000 {
                        let (answer, took) = hit(&mut client, "bg", "load").await;
                        calls += 1;
                        slowest = slowest.max(took);
                        if let Err(e) = answer {
                            failures.push(e);
                        }
                    }
                    (calls, slowest, failures)
                })
            })
            .collect();
        Background { stop, tasks }
    }

    /// Stops the load; asserts every call was answered in time; the calls.
    async fn finish(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        let mut total = 0;
        for task in self.tasks {
            let (calls, slowest, failures) = task.await.unwrap();
            assert!(failures.is_empty(), "background calls failed: {failures:?}");
            assert!(slowest < TIMEOUT + MARGIN, "a background call took {slowest:?}");
            total += calls;
        }
        total
    }
}

/// `user` limited to `limit` an hour, `bg` to 10⁶, by `algorithm` (the
/// default, a sliding window of 8 buckets, when empty).
fn yaml(limit: u64, algorithm: &str) -> String {
    let algorithm = if algorithm.is_empty() {
        String::new()
    } else {
        format!(", algorithm: {algorithm}")
    };
    format!(
        "domain: f\ndescriptors:\n  - key: user\n    rate_limit: {{ unit: hour, requests_per_unit: {limit}{algorithm} }}\n  - key: bg\n    rate_limit: {{ unit: hour, requests_per_unit: 1000000{algorithm} }}\n"
    )
}

fn users(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("val-{i:02}")).collect()
}

/// Waits (bounded) until `done` holds, doing `step` between looks.
async fn until(what: &str, within: Duration, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done().await {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::task::yield_now().await;
    }
}

/// Redis SIGKILLed under load, then started again on the same port (an
/// empty server: no keys, no scripts), for one failure policy; `during`
/// says how many of 25 calls per user (on a limit of 20 an hour, already
/// used up) the policy admits.
async fn kill_and_restart(failure: &str, source: &str, admitted_during: usize) {
    let redis = RedisServer::start();
    let port = redis.port();
    let url = redis.url();
    let serve = Serve::start(
        &yaml(20, "fixed_window"),
        &[
            "--redis",
            &url,
            "--redis-failure",
            failure,
            "--redis-instances",
            "2",
            "--redis-timeout",
            "200ms",
        ],
    );
    let client = serve.client().await;
    let background = Background::start(&client, 2);
    let users = users(8);

    // Healthy: Redis decides, exactly 20 each.
    assert_eq!(
        round(&client, &users, 25, 8).await,
        vec![20; users.len()],
        "{failure}: healthy"
    );
    assert_eq!(serve.metric("slidegate_redis_errors_total"), 0.0);
    assert_eq!(serve.fallbacks(source), 0.0);

    // Killed: every call is the policy's, answered in time.
    redis.kill();
    let during = round(&client, &users, 25, 8).await;
    assert_eq!(during, vec![admitted_during; users.len()], "{failure}: Redis down");
    assert!(serve.metric("slidegate_redis_errors_total") >= 1.0, "{failure}");
    assert!(serve.fallbacks(source) >= (25 * users.len()) as f64, "{failure}");

    // Back on the same port: decisions come from Redis again (the
    // background load finds it), then a round without a fallback; the new
    // server counts from scratch.
    let redis = RedisServer::start_on(port, &[]).expect("the port is free again");
    until(
        &format!("{failure}: a decision counted in the new Redis"),
        Duration::from_secs(20),
        async || !redis.keys_and_ttls().is_empty(),
    )
    .await;
    // A call still in its backoff may fall back once more: let one pass.
    let mut probe = client.clone();
    until(
        &format!("{failure}: a call decided by Redis"),
        Duration::from_secs(20),
        async || {
            let before = serve.fallbacks(source);
            hit(&mut probe, "user", "probe").await.0.unwrap();
            serve.fallbacks(source) == before
        },
    )
    .await;
    let (fallbacks, errors) = (serve.fallbacks(source), serve.metric("slidegate_redis_errors_total"));
    let after = round(&client, &users, 25, 8).await;
    assert_eq!(after, vec![20; users.len()], "{failure}: Redis back");
    let background_calls = background.finish().await;
    assert!(background_calls > 0);
    assert_eq!(
        serve.fallbacks(source),
        fallbacks,
        "{failure}: a fallback after recovery"
    );
    assert_eq!(
        serve.metric("slidegate_redis_errors_total"),
        errors,
        "{failure}: an error after recovery"
    );
    serve.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_and_restarted_fail_open() {
    kill_and_restart("open", "fail_open", 25).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_and_restarted_fail_closed() {
    kill_and_restart("closed", "fail_closed", 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_and_restarted_local() {
    // The instance saw each key at its limit (20) through Redis, so it
    // falls back from its full share (⌈20 / 2⌉ = 10): nothing more.
    kill_and_restart("local", "local", 0).await;
}

/// Redis paused (SIGSTOP) under load: every call waits at most the
/// timeout, then the policy (closed) answers; on SIGCONT the decisions
/// come from Redis again. The calls that timed out were already written to
/// Redis's socket: Redis runs them when it resumes, so each refused call
/// of the pause is charged (the limit tightens; nothing is over-admitted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_paused_fails_closed_then_recovers() {
    let redis = RedisServer::start();
    let url = redis.url();
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query(&mut redis.sync_conn().unwrap())
        .unwrap();
    let redis_pid: u32 = info
        .lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .and_then(|p| p.trim().parse().ok())
        .expect("INFO server names the process");
    let serve = Serve::start(
        &yaml(20, "fixed_window"),
        &["--redis", &url, "--redis-failure", "closed", "--redis-timeout", "200ms"],
    );
    let client = serve.client().await;
    let background = Background::start(&client, 2);
    let users = users(8);
    assert_eq!(round(&client, &users, 5, 8).await, vec![5; users.len()]);

    let resume = Resume(redis_pid);
    assert!(signal("STOP", redis_pid));
    let paused = round(&client, &users, 5, 8).await;
    drop(resume);
    assert_eq!(paused, vec![0; users.len()], "refused while paused");
    assert!(serve.metric("slidegate_redis_errors_total") >= 1.0);
    assert!(serve.fallbacks("fail_closed") >= (5 * users.len()) as f64);

    let mut probe = client.clone();
    until(
        "a call decided by Redis after SIGCONT",
        Duration::from_secs(20),
        async || {
            let before = serve.fallbacks("fail_closed");
            hit(&mut probe, "user", "probe").await.0.unwrap();
            serve.fallbacks("fail_closed") == before
        },
    )
    .await;
    // 20 a user: 5 admitted before, and each of the 5 refused calls of the
    // pause that reached Redis's socket is charged when it resumes.
    let after = round(&client, &users, 20, 8).await;
    let charged: Vec<usize> = after.iter().map(|ok| 15 - ok).collect();
    assert!(
        charged.iter().all(|&c| c <= 5),
        "more charged than refused: {charged:?}"
    );
    eprintln!("paused: refused calls later charged by Redis, per user: {charged:?}");
    background.finish().await;
    serve.stop();
    drop(redis);
}

/// Sends SIGCONT to a paused process when dropped, even when a test
/// fails.
struct Resume(u32);

impl Drop for Resume {
    fn drop(&mut self) {
        assert!(signal("CONT", self.0), "SIGCONT to Redis");
    }
}

/// A three-master cluster, one master SIGKILLed under load: the keys on
/// the other two are still decided by Redis, those of the dead master's
/// slots get the policy (closed), and no call hangs; the same once the
/// others have marked it failed (with `cluster-require-full-coverage no`;
/// with the default `yes` the whole cluster refuses every command from
/// then on, and every key gets the policy).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_master_killed() {
    let mut cluster = RedisCluster::start();
    for node in &cluster.nodes {
        let mut conn = node.sync_conn().unwrap();
        for (name, value) in [
            ("cluster-require-full-coverage", "no"),
            ("cluster-node-timeout", "1000"),
        ] {
            redis::cmd("CONFIG")
                .arg("SET")
                .arg(name)
                .arg(value)
                .query::<()>(&mut conn)
                .unwrap();
        }
    }
    let urls = cluster.urls();
    let mut args = vec!["--redis-failure", "closed", "--redis-timeout", "200ms"];
    for url in &urls {
        args.extend(["--redis", url]);
    }
    let serve = Serve::start(&yaml(40, "fixed_window"), &args);
    let client = serve.client().await;
    let users = users(24);
    assert_eq!(round(&client, &users, 10, 8).await, vec![10; users.len()]);

    // Which users the first master holds.
    let first: Vec<(String, i64)> = cluster.nodes[0].keys_and_ttls();
    let on_first: Vec<bool> = users
        .iter()
        .map(|u| first.iter().any(|(k, _)| k.contains(u.as_str())))
        .collect();
    assert!(
        on_first.iter().any(|&b| b) && !on_first.iter().all(|&b| b),
        "{on_first:?}"
    );
    let dead = on_first.iter().filter(|&&b| b).count();
    // The live users whose slots share no range of 256 with the first
    // master's (0–5460): the limiter backs off per range, so these must be
    // decided by Redis throughout.
    let apart: Vec<bool> = {
        let mut conn = cluster.nodes[1].sync_conn().unwrap();
        let keys: Vec<String> = cluster.nodes[1..]
            .iter()
            .flat_map(|n| n.keys_and_ttls())
            .map(|(k, _)| k)
            .collect();
        users
            .iter()
            .map(|u| {
                keys.iter().find(|k| k.contains(u.as_str())).is_some_and(|k| {
                    let slot: u16 = redis::cmd("CLUSTER").arg("KEYSLOT").arg(k).query(&mut conn).unwrap();
                    usize::from(slot) / 256 * 256 > 5460
                })
            })
            .collect()
    };
    assert!(apart.iter().filter(|&&a| a).count() >= 10, "{apart:?}");

    let killed = cluster.nodes.remove(0);
    let killed_id = {
        let mut conn = killed.sync_conn().unwrap();
        redis::cmd("CLUSTER").arg("MYID").query::<String>(&mut conn).unwrap()
    };
    killed.kill();
    let before = serve.fallbacks("fail_closed");
    let live = check_cluster_round(&round(&client, &users, 10, 8).await, &on_first, &apart, "master killed");
    assert!(serve.fallbacks("fail_closed") - before >= (10 * dead) as f64);

    // Once the others mark it failed, still the same.
    until(
        "the others mark the master failed",
        Duration::from_secs(20),
        async || {
            let mut conn = cluster.nodes[0].sync_conn().unwrap();
            let nodes: String = redis::cmd("CLUSTER").arg("NODES").query(&mut conn).unwrap();
            nodes.lines().any(|l| {
                l.starts_with(&killed_id)
                    && l.split(' ')
                        .nth(2)
                        .is_some_and(|f| f.contains("fail") && !f.contains("fail?"))
            })
        },
    )
    .await;
    let marked = check_cluster_round(
        &round(&client, &users, 10, 8).await,
        &on_first,
        &apart,
        "master marked failed",
    );
    eprintln!(
        "cluster: of {} calls on the live masters' keys, {live} admitted by Redis after the kill and {marked} once the master was marked failed",
        10 * (users.len() - dead)
    );
    serve.stop();
    // The dead master's slots are gone with it; the others' keys expire.
    drop(cluster);
}

/// Checks one round of 10 calls a user after a master died: the dead
/// master's keys get the policy (closed: none admitted), the live ones are
/// never admitted past their limit, and the live keys whose slots are in
/// no range of the dead master's (`apart`) are all admitted by Redis (the
/// limiter backs off per range of 256 slots on a cluster, so a dead master
/// does not take the live masters' keys with it); the calls admitted on
/// live keys.
fn check_cluster_round(ok: &[usize], on_first: &[bool], apart: &[bool], what: &str) -> usize {
    for ((&ok, &dead), &apart) in ok.iter().zip(on_first).zip(apart) {
        assert!(ok <= 10, "{what}: {ok} admitted");
        if dead {
            assert_eq!(ok, 0, "{what}: a dead master's key admitted under fail-closed");
        }
        if apart {
            assert_eq!(ok, 10, "{what}: a live master's key sent to the failure policy");
        }
    }
    ok.iter().zip(on_first).filter(|(_, d)| !**d).map(|(ok, _)| ok).sum()
}

/// Hybrid mode (`--redis-sync-interval 50ms`, closed) through a Redis kill
/// and restart: decisions go on locally while the view is fresh, then,
/// once the syncs have failed for 4 intervals, the policy refuses; when
/// Redis is back the syncs resume, and the counts admitted locally while it
/// was down reach the new server (nothing admitted is lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hybrid_mode_through_a_kill_and_a_restart() {
    let redis = RedisServer::start();
    let (port, url) = (redis.port(), redis.url());
    let serve = Serve::start(
        &yaml(1_000_000, ""),
        &[
            "--redis",
            &url,
            "--redis-failure",
            "closed",
            "--redis-timeout",
            "200ms",
            "--redis-sync-interval",
            "50ms",
        ],
    );
    let mut client = serve.client().await;
    let background = Background::start(&client, 2);
    for _ in 0..20 {
        assert_eq!(hit(&mut client, "user", "hot").await.0, Ok(Code::Ok));
    }
    until("the counts reach Redis", Duration::from_secs(20), async || {
        redis.ring_count("user3:hot") >= 20
    })
    .await;

    redis.kill();
    // Local decisions go on until the view is stale, then the policy.
    let mut admitted_while_down = 0u64;
    let mut first_refusal = None;
    until("the policy takes over", Duration::from_secs(20), async || {
        let (code, took) = hit(&mut client, "user", "hot").await;
        assert!(took < TIMEOUT + MARGIN, "{took:?}");
        match code.unwrap() {
            Code::Ok => admitted_while_down += 1,
            _ => first_refusal = Some(admitted_while_down),
        }
        first_refusal.is_some()
    })
    .await;
    assert!(admitted_while_down >= 1, "no local decision after the kill");
    assert!(serve.fallbacks("fail_closed") >= 1.0);
    assert!(serve.metric("slidegate_redis_errors_total") >= 1.0);

    let redis = RedisServer::start_on(port, &[]).expect("the port is free again");
    until("decisions admit again", Duration::from_secs(20), async || {
        hit(&mut client, "user", "hot").await.0 == Ok(Code::Ok)
    })
    .await;
    // Syncs resume: a fresh key's counts reach the new server, and so do
    // the counts admitted locally while Redis was down.
    for _ in 0..30 {
        assert_eq!(hit(&mut client, "user", "fresh").await.0, Ok(Code::Ok));
    }
    until(
        "the fresh key's counts reach the new Redis",
        Duration::from_secs(20),
        async || redis.ring_count("user5:fresh") == 30,
    )
    .await;
    let hot = redis.ring_count("user3:hot");
    assert!(
        hot >= admitted_while_down,
        "the new Redis holds {hot} for the hot key; {admitted_while_down} were admitted while it was down"
    );
    eprintln!("hybrid: {admitted_while_down} admitted locally while Redis was down; the new Redis holds {hot}");
    background.finish().await;
    serve.stop();
}

/// The server's resident set, in KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap()
}

/// 200,000 distinct keys (64 descriptors a call) through a 1 MiB store:
/// the store stays at its capacity, evicting, and the RSS grows by no
/// more than the budget and a fixed margin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_distinct_keys_stays_in_its_budget() {
    const KEYS: usize = 200_000;
    let serve = Serve::start(&yaml(1000, ""), &["--memory-mib", "1", "--other-memory-mib", "1"]);
    let client = serve.client().await;
    let rss_start = rss_kib(serve.pid());
    let capacity = serve.metric("slidegate_key_capacity");
    assert!(capacity > 0.0 && capacity < 20_000.0, "{capacity}");
    let next = Arc::new(AtomicUsize::new(0));
    let max_rss = Arc::new(AtomicU64::new(rss_start));
    let pid = serve.pid();
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let (next, max_rss, mut client) = (Arc::clone(&next), Arc::clone(&max_rss), client.clone());
            tokio::spawn(async move {
                loop {
                    let first = next.fetch_add(64, Ordering::Relaxed);
                    if first >= KEYS {
                        break;
                    }
                    let request = descriptors_request("user", (first..first + 64).map(|k| format!("flood-{k}")), 0);
                    let answer = tokio::time::timeout(HANG, client.should_rate_limit(request)).await;
                    let code = answer.expect("answered in time").expect("no gRPC error").into_inner();
                    assert_eq!(code.overall_code(), Code::Ok);
                    max_rss.fetch_max(rss_kib(pid), Ordering::Relaxed);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let keys = serve.metric("slidegate_keys");
    let evictions = serve.metric("slidegate_evictions_total");
    let summarised = serve.metric("slidegate_keys_summarised_total");
    let bytes = serve.metric("slidegate_store_bytes");
    let grown = max_rss.load(Ordering::Relaxed).saturating_sub(rss_start);
    eprintln!(
        "flood: {KEYS} keys; held {keys} of {capacity}; {evictions} evictions; store {bytes} bytes; RSS {rss_start} KiB at start, grew {grown} KiB at most"
    );
    assert!(keys <= capacity, "{keys} held, capacity {capacity}");
    // Every key beyond the capacity either evicted one, or was kept in the
    // summary of evicted counters instead.
    assert!(
        evictions + summarised >= KEYS as f64 - capacity,
        "{evictions} evictions, {summarised} summarised"
    );
    assert!(bytes <= (2 << 20) as f64, "{bytes} store bytes");
    // The budget (1 + 1 MiB) and a fixed margin for buffers and the
    // allocator.
    assert!(grown <= 2 * 1024 + 16 * 1024, "the RSS grew by {grown} KiB");
    serve.stop();
}

/// Issue [flood], the attack as a user would make it: a victim at its limit
/// of 5 an hour, then a flood of new keys of a longer window (1,000 a day),
/// each taking 6 at once so that the victim holds least and expires first,
/// through `/json` and through gRPC, each twice what the 1 MiB store holds,
/// then the victim again. Each round is a new process, so a new hash seed
/// and other neighbours for the victim: in none is the victim admitted past
/// its limit, though the flood evicted the store over and over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_new_keys_never_lets_a_limited_client_through() {
    const ROUNDS: usize = 4;
    let yaml = "domain: f\ndescriptors:\n  - key: victim\n    rate_limit: { unit: hour, requests_per_unit: 5 }\n  - key: flood\n    rate_limit: { unit: day, requests_per_unit: 1000 }\n";
    for round in 0..ROUNDS {
        let serve = Serve::start(yaml, &["--memory-mib", "1", "--other-memory-mib", "1"]);
        let mut client = serve.client().await;
        let capacity = serve.metric("slidegate_key_capacity") as usize;
        assert!(capacity > 0 && capacity < 40_000, "{capacity}");
        let json_victim = |serve: &Serve| {
            let body = r#"{"domain":"f","descriptors":[{"entries":[{"key":"victim","value":"by-json"}]}]}"#;
            let answer = common::request(&serve.http, "POST", "/json", body);
            if answer.contains(r#""overallCode":"OK""#) {
                true
            } else {
                assert!(answer.contains(r#""overallCode":"OVER_LIMIT""#), "{answer}");
                false
            }
        };
        let mut admitted = (0, 0);
        for _ in 0..5 {
            admitted.0 += usize::from(json_victim(&serve));
            let (code, _) = hit(&mut client, "victim", "by-grpc").await;
            admitted.1 += usize::from(code.unwrap() == Code::Ok);
        }
        assert_eq!(admitted, (5, 5), "round {round}: each victim at its limit");
        let flood_keys = 2 * capacity;
        for (how, base) in [("json", 0), ("grpc", flood_keys)] {
            for first in (base..base + flood_keys).step_by(64) {
                let descriptors = (first..first + 64)
                    .map(|k| format!(r#"{{"entries":[{{"key":"flood","value":"k{k}"}}]}}"#))
                    .collect::<Vec<_>>()
                    .join(",");
                if how == "json" {
                    let body = format!(r#"{{"domain":"f","descriptors":[{descriptors}],"hitsAddend":6}}"#);
                    let answer = common::request(&serve.http, "POST", "/json", &body);
                    assert!(answer.contains(r#""overallCode":"OK""#), "{answer}");
                } else {
                    let request = descriptors_request("flood", (first..first + 64).map(|k| format!("k{k}")), 6);
                    let answer = tokio::time::timeout(HANG, client.should_rate_limit(request)).await;
                    let answer = answer.expect("answered in time").expect("no gRPC error");
                    assert_eq!(answer.into_inner().overall_code(), Code::Ok);
                }
            }
            for _ in 0..7 {
                assert!(
                    !json_victim(&serve),
                    "round {round}, after the {how} flood: /json victim admitted"
                );
                let (code, _) = hit(&mut client, "victim", "by-grpc").await;
                assert_eq!(
                    code.unwrap(),
                    Code::OverLimit,
                    "round {round}, after the {how} flood: gRPC victim admitted"
                );
            }
        }
        let evictions = serve.metric("slidegate_evictions_total") as usize;
        let seeded = serve.metric("slidegate_keys_seeded_total") as usize;
        let summarised = serve.metric("slidegate_keys_summarised_total") as usize;
        let fill = serve.metric("slidegate_eviction_summary_fill");
        let false_seed = serve.metric("slidegate_eviction_summary_false_seed_ratio");
        assert!(fill > 0.0 && fill <= 1.0, "round {round}: summary fill {fill}");
        // The mean over shards of each one's fill⁴ is at least the mean
        // fill's (and the ratio is the fuller store's).
        assert!(
            false_seed <= 1.0 && false_seed + 1e-6 >= fill.powi(4),
            "round {round}: false-seed ratio {false_seed}, fill {fill}"
        );
        eprintln!(
            "round {round}: capacity {capacity}, {evictions} evictions, {seeded} keys seeded, {summarised} summarised, fill {fill:.3}, false-seed ratio {false_seed:.3}"
        );
        // Every flood key beyond what the store holds evicted a key or was
        // kept in the summary alone.
        assert!(
            evictions + summarised >= 2 * flood_keys - capacity,
            "round {round}: {evictions} evictions, {summarised} summarised"
        );
        serve.stop();
    }
}

/// Issue [lease], the experiment as a user would run it: 2 and then 4
/// `slidegate serve --redis-sync-interval 50ms` on one throw-away Redis, a
/// limit of 200 per 10 s (the default sliding window), each instance
/// flooded for 2 s (or 3,000 calls a client) by one gRPC client and one
/// HTTP `/json` client on one key, all within one window: today's hybrid
/// mode and the bounded one (`--redis-bounded`) taking turns on keys of
/// their own. The bounded mode never admits more than the limit in the
/// window, and comes near it; today's mode is shown beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bounded_hybrid_instances_never_admit_past_the_limit() {
    const LIMIT: usize = 200;
    const CALLS: usize = 3_000;
    let redis = RedisServer::start();
    let url = redis.url();
    let yaml = format!(
        "domain: f\ndescriptors:\n  - key: user\n    rate_limit: {{ window: 10s, requests_per_unit: {LIMIT} }}\n"
    );
    for instances in [2usize, 4] {
        let n = instances.to_string();
        let mut admitted_by_mode = Vec::new();
        for bounded in [false, true] {
            let mut extra = vec![
                "--redis",
                url.as_str(),
                "--redis-sync-interval",
                "50ms",
                "--redis-instances",
                &n,
            ];
            if bounded {
                extra.push("--redis-bounded");
            }
            let servers: Vec<Serve> = (0..instances).map(|_| Serve::start(&yaml, &extra)).collect();
            let value = format!("flood-{instances}-{bounded}");
            let deadline = Instant::now() + Duration::from_secs(2);
            let mut tasks = Vec::new();
            for serve in &servers {
                let mut client = serve.client().await;
                let grpc_value = value.clone();
                tasks.push(tokio::spawn(async move {
                    let mut ok = 0;
                    for _ in 0..CALLS {
                        if Instant::now() >= deadline {
                            break;
                        }
                        let (code, _) = hit(&mut client, "user", &grpc_value).await;
                        ok += usize::from(code.expect("answered") == Code::Ok);
                    }
                    ok
                }));
                let (http, value) = (serve.http.clone(), value.clone());
                tasks.push(tokio::task::spawn_blocking(move || {
                    let body = format!(
                        r#"{{"domain":"f","descriptors":[{{"entries":[{{"key":"user","value":"{value}"}}]}}]}}"#
                    );
                    let mut ok = 0;
                    for _ in 0..CALLS {
                        if Instant::now() >= deadline {
                            break;
                        }
                        let answer = common::request(&http, "POST", "/json", &body);
                        assert!(answer.contains("overallCode"), "{answer}");
                        ok += usize::from(answer.contains(r#""overallCode":"OK""#));
                    }
                    ok
                }));
            }
            let mut admitted = 0;
            for task in tasks {
                admitted += task.await.unwrap();
            }
            let mode = if bounded { "bounded" } else { "today's hybrid" };
            eprintln!(
                "{instances} instances, {mode} mode: {admitted} admitted in one window of a limit of {LIMIT} ({:.2}×)",
                admitted as f64 / LIMIT as f64
            );
            admitted_by_mode.push(admitted);
            let lease_refusals: f64 = servers
                .iter()
                .map(|s| s.metric("slidegate_redis_lease_refusals_total"))
                .sum();
            if bounded {
                assert!(lease_refusals > 0.0, "the flood was refused for want of lease");
            } else {
                assert_eq!(lease_refusals, 0.0, "today's mode holds no lease");
            }
            for serve in servers {
                serve.stop();
            }
        }
        let bounded = admitted_by_mode[1];
        assert!(bounded <= LIMIT, "{instances} instances, bounded: {bounded} admitted");
        assert!(
            bounded >= LIMIT / 2,
            "{instances} instances, bounded: only {bounded} admitted"
        );
    }
}
