//! The service counting in Redis: throw-away `redis-server` processes on
//! free loopback ports (`slidegate_conformance::redis`), the real server on
//! ephemeral ports, gRPC through the generated client. The scripts read
//! Redis's clock, so the tests assert counts, never times; they wait on
//! conditions with a bounded deadline, never for a fixed time.

use slidegate_conformance::redis::RedisServer;
use slidegate_core::{Algorithm, ManualClock, Policy};
use slidegate_server::engine::{AdHoc, Descriptor};
use slidegate_server::proto::descriptor::RateLimitDescriptor;
use slidegate_server::proto::descriptor::rate_limit_descriptor::Entry;
use slidegate_server::proto::rls::rate_limit_response::Code;
use slidegate_server::proto::rls::rate_limit_service_client::RateLimitServiceClient;
use slidegate_server::proto::rls::{RateLimitRequest, RateLimitResponse};
use slidegate_server::redis_store::RedisOptions;
use slidegate_server::server::{self, Options, Running, StartError};
use slidegate_store::FailurePolicy;
use std::time::{Duration, Instant};
use tonic::transport::Channel;

mod common;
use common::TempDir;

/// One instance of the service on a Redis.
struct Instance {
    running: Running,
    grpc: RateLimitServiceClient<Channel>,
    dir: TempDir,
}

fn redis_options(url: String, failure: FailurePolicy, timeout: Duration) -> RedisOptions {
    RedisOptions {
        urls: vec![url],
        failure,
        timeout,
        ..RedisOptions::default()
    }
}

async fn start(yaml: &str, redis: RedisOptions) -> Result<Instance, StartError> {
    let dir = TempDir::new("redis");
    dir.write("domain.yaml", yaml);
    let options = Options {
        config: vec![dir.0.clone()],
        http: "127.0.0.1:0".parse().unwrap(),
        grpc: "127.0.0.1:0".parse().unwrap(),
        reload_every: None,
        redis: Some(redis),
        ..Options::default()
    };
    let running = server::start(options, ManualClock::new(1_000_000_000_000)).await?;
    let channel = common::harness::channel_to(&running).await;
    Ok(Instance {
        running,
        grpc: RateLimitServiceClient::new(channel),
        dir,
    })
}

impl Instance {
    /// Serves `yaml` on the Redis at `server`, failing open, 2 s per call.
    async fn on(server: &RedisServer, yaml: &str) -> Instance {
        start(
            yaml,
            redis_options(server.url(), FailurePolicy::Open, Duration::from_secs(2)),
        )
        .await
        .unwrap()
    }

    /// One request of one descriptor with `hits_addend` (`None`: the
    /// request's, 1); the answer.
    async fn ask(&mut self, domain: &str, entries: &[(&str, &str)], hits: Option<u64>) -> RateLimitResponse {
        let mut descriptor = common::harness::descriptor(entries);
        descriptor.hits_addend = hits.map(|value| pbjson_types::UInt64Value { value });
        let request = common::harness::request(domain, vec![descriptor]);
        self.grpc.should_rate_limit(request).await.unwrap().into_inner()
    }

    /// One request of one descriptor; its overall code.
    async fn hit(&mut self, domain: &str, entries: &[(&str, &str)]) -> Code {
        self.ask(domain, entries, None).await.overall_code()
    }

    /// The remaining count of one descriptor, peeked (`hits_addend` 0).
    async fn remaining(&mut self, domain: &str, entries: &[(&str, &str)]) -> u32 {
        self.ask(domain, entries, Some(0)).await.statuses[0].limit_remaining
    }

    /// The value of the metric line starting with `line_start`.
    fn metric(&self, line_start: &str) -> f64 {
        self.running
            .shared()
            .metrics_text()
            .lines()
            .find(|l| l.starts_with(line_start))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    }
}

fn limit_yaml(domain: &str, limit: u64, algorithm: Option<&str>) -> String {
    let algorithm = algorithm.map_or(String::new(), |a| format!(", algorithm: {a}"));
    format!(
        "domain: {domain}\ndescriptors:\n  - key: user\n    rate_limit: {{ unit: hour, requests_per_unit: {limit}{algorithm} }}\n"
    )
}

/// Two instances on one Redis admit exactly the limit between them, for
/// the exact algorithms and the default (a conservative sliding window,
/// which never admits more than the limit and, within one bucket, exactly
/// the limit).
#[tokio::test]
async fn two_instances_share_one_limit() {
    let redis = RedisServer::start();
    for algorithm in [Some("fixed_window"), Some("sliding_log"), Some("gcra"), None] {
        let yaml = limit_yaml("shared", 7, algorithm);
        let mut a = Instance::on(&redis, &yaml).await;
        let mut b = Instance::on(&redis, &yaml).await;
        let mut admitted = 0;
        for i in 0..20 {
            let instance = if i % 2 == 0 { &mut a } else { &mut b };
            admitted += u32::from(instance.hit("shared", &[("user", "alice")]).await == Code::Ok);
        }
        assert_eq!(admitted, 7, "{algorithm:?}");
        // Another value is another counter.
        assert_eq!(b.hit("shared", &[("user", "bob")]).await, Code::Ok);
        // Neither fell back.
        assert_eq!(a.metric("slidegate_redis_errors_total"), 0.0);
        let keys = redis.keys_and_ttls();
        assert!(keys.iter().all(|(k, _)| k.starts_with("slidegate:")), "{keys:?}");
        redis::cmd("FLUSHALL")
            .query::<()>(&mut redis.sync_conn().unwrap())
            .unwrap();
    }
}

/// A descriptor of two limits on two instances, 24 concurrent gRPC calls:
/// exactly the smaller limit is admitted in total (every call is one
/// script for both limits, all or nothing), and the larger limit counts
/// exactly as many.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_limits_on_two_instances_admit_exactly_the_smaller() {
    let redis = RedisServer::start();
    let yaml = "domain: two\ndescriptors:\n  - key: user\n    rate_limits:\n      - { unit: minute, requests_per_unit: 5, algorithm: fixed_window }\n      - { unit: hour, requests_per_unit: 7 }\n";
    let a = Instance::on(&redis, yaml).await;
    let b = Instance::on(&redis, yaml).await;
    let calls: Vec<_> = (0..24)
        .map(|i| {
            let mut grpc = if i % 2 == 0 { a.grpc.clone() } else { b.grpc.clone() };
            tokio::spawn(async move {
                let request = RateLimitRequest {
                    domain: "two".to_owned(),
                    descriptors: vec![RateLimitDescriptor {
                        entries: vec![Entry {
                            key: "user".to_owned(),
                            value: "carol".to_owned(),
                        }],
                        ..Default::default()
                    }],
                    ..Default::default()
                };
                grpc.should_rate_limit(request)
                    .await
                    .unwrap()
                    .into_inner()
                    .overall_code()
            })
        })
        .collect();
    let mut admitted = 0;
    for call in calls {
        admitted += u32::from(call.await.unwrap() == Code::Ok);
    }
    assert_eq!(admitted, 5, "exactly the smaller limit");
    let mut a = a;
    let peek = a.ask("two", &[("user", "carol")], Some(0)).await;
    assert_eq!(peek.statuses[0].limit_remaining, 0, "the minute limit is spent");
    // One script call for both limits of each decision, or of several
    // decisions that waited together for a call in flight: 25 decisions
    // (24 and the peek) in the calls the instances counted, each of which
    // ran once, as a Redis function (a first `FCALL` may fail, the
    // function not loaded yet, and be sent again, loaded).
    let stats = redis.cli(&["INFO", "commandstats"]);
    let figure = |command: &str, field: &str| -> u64 {
        stats
            .lines()
            .find(|l| l.starts_with(&format!("cmdstat_{command}:")))
            .and_then(|l| l.split([':', ',']).find_map(|kv| kv.strip_prefix(&format!("{field}="))))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    let ran =
        |command: &str| figure(command, "calls") - figure(command, "failed_calls") - figure(command, "rejected_calls");
    let calls = a.metric("slidegate_redis_script_calls_total") + b.metric("slidegate_redis_script_calls_total");
    let requests =
        a.metric("slidegate_redis_script_requests_total") + b.metric("slidegate_redis_script_requests_total");
    assert_eq!(requests, 25.0);
    assert!((2.0..=25.0).contains(&calls), "{calls} calls");
    assert_eq!(ran("fcall") as f64, calls, "{stats}");
    assert_eq!(ran("evalsha") + ran("eval"), 0, "{stats}");
    // Inside the scripts (counted too), the time is read once per call,
    // for both limits and every decision in it.
    assert_eq!(figure("time", "calls") as f64, calls, "{stats}");
    // The hour limit alone (7) shows exactly 5 charged, through the store.
    let keys = redis.keys_and_ttls();
    assert_eq!(keys.len(), 2, "one key per limit: {keys:?}");
    let charged = redis.ring_count("sliding_window");
    assert_eq!(charged, 5, "the hour limit charged exactly 5");
    assert_eq!(a.metric("slidegate_redis_errors_total"), 0.0);
}

/// Counts survive a reload in Redis too: an unchanged limit keeps counting,
/// a limit whose `requests_per_unit` changed keeps its count under the new
/// limit, and a changed unit starts afresh.
#[tokio::test]
async fn counts_survive_a_reload_for_unchanged_limits() {
    let redis = RedisServer::start();
    let rules = |change: u32, unit: &str| {
        format!(
            "domain: r\ndescriptors:\n  - key: keep\n    rate_limit: {{ unit: hour, requests_per_unit: 5, algorithm: fixed_window }}\n  - key: change\n    rate_limit: {{ unit: {unit}, requests_per_unit: {change}, algorithm: fixed_window }}\n"
        )
    };
    let mut h = Instance::on(&redis, &rules(5, "hour")).await;
    for _ in 0..4 {
        assert_eq!(h.hit("r", &[("keep", "x")]).await, Code::Ok);
        assert_eq!(h.hit("r", &[("change", "x")]).await, Code::Ok);
    }
    h.dir.write("domain.yaml", &rules(6, "hour"));
    h.running.reloader().reload().unwrap();
    // `keep` has one left; `change` has 4 counted of its new 6.
    assert_eq!(h.hit("r", &[("keep", "x")]).await, Code::Ok);
    assert_eq!(h.hit("r", &[("keep", "x")]).await, Code::OverLimit);
    for _ in 0..2 {
        assert_eq!(h.hit("r", &[("change", "x")]).await, Code::Ok);
    }
    assert_eq!(h.hit("r", &[("change", "x")]).await, Code::OverLimit);
    // Another unit is another count: 6 more.
    h.dir.write("domain.yaml", &rules(6, "day"));
    h.running.reloader().reload().unwrap();
    for _ in 0..6 {
        assert_eq!(h.hit("r", &[("change", "x")]).await, Code::Ok);
    }
    assert_eq!(h.hit("r", &[("change", "x")]).await, Code::OverLimit);
}

/// A limit without a Redis form is refused at start and at reload, naming
/// the domain, the descriptor and the limit; the old config keeps serving.
#[tokio::test]
async fn a_limit_without_a_redis_form_is_refused() {
    let redis = RedisServer::start();
    let histogram = "domain: h\ndescriptors:\n  - key: user\n    value: alice\n    rate_limits:\n      - { unit: hour, requests_per_unit: 5 }\n      - { name: spiky, unit: second, requests_per_unit: 5, algorithm: exponential_histogram }\n";
    let options = redis_options(redis.url(), FailurePolicy::Open, Duration::from_secs(2));
    let Err(error) = start(histogram, options).await else {
        panic!("a config with exponential_histogram started on Redis");
    };
    let text = error.to_string();
    for part in [
        "domain.yaml:3:",
        "domain `h`",
        "descriptor `user=alice`",
        "limit `spiky`",
        "exponential_histogram",
    ] {
        assert!(text.contains(part), "{part} not in: {text}");
    }

    let mut h = Instance::on(&redis, &limit_yaml("h", 1, None)).await;
    h.dir.write("domain.yaml", histogram);
    let error = h.running.reloader().reload().unwrap_err();
    assert!(error.to_string().contains("limit `spiky`"), "{error}");
    // The old config still serves: one admitted, then refused.
    assert_eq!(h.hit("h", &[("user", "alice")]).await, Code::Ok);
    assert_eq!(h.hit("h", &[("user", "alice")]).await, Code::OverLimit);
    assert_eq!(h.metric("slidegate_config_reloads_total{result=\"failure\"}"), 1.0);

    // Without Redis the same config serves.
    let dir = TempDir::new("histogram");
    dir.write("domain.yaml", histogram);
    let options = Options {
        config: vec![dir.0.clone()],
        http: "127.0.0.1:0".parse().unwrap(),
        grpc: "127.0.0.1:0".parse().unwrap(),
        reload_every: None,
        ..Options::default()
    };
    let running = server::start(options, ManualClock::new(0)).await.unwrap();
    running.shutdown().await;
}

/// A reset deletes the counter in Redis, for a descriptor and for an
/// ad-hoc key; an ad-hoc policy out of the Redis ranges is an invalid
/// request, not a failure.
#[tokio::test]
async fn reset_deletes_the_keys_in_redis() {
    let redis = RedisServer::start();
    let mut h = Instance::on(&redis, &limit_yaml("d", 2, Some("sliding_log"))).await;
    assert_eq!(h.hit("d", &[("user", "alice")]).await, Code::Ok);
    assert_eq!(h.hit("d", &[("user", "alice")]).await, Code::Ok);
    assert_eq!(h.hit("d", &[("user", "alice")]).await, Code::OverLimit);
    // The log and its sum.
    assert_eq!(redis.keys_and_ttls().len(), 2);
    let shared = std::sync::Arc::clone(h.running.shared());
    let engine = shared.engine();
    let alice = Descriptor {
        entries: vec![("user".to_owned(), "alice".to_owned())],
        ..Default::default()
    };
    assert_eq!(engine.reset_descriptor("d", &alice).await.unwrap(), 1);
    assert!(redis.keys_and_ttls().is_empty());
    assert_eq!(engine.reset_descriptor("d", &alice).await.unwrap(), 0);
    assert_eq!(h.hit("d", &[("user", "alice")]).await, Code::Ok);

    let policy = Policy::new(1, Duration::from_secs(60), Algorithm::FixedWindow).unwrap();
    let ad_hoc = AdHoc {
        key: "job".to_owned(),
        policy,
        cost: 1,
    };
    assert!(engine.decide_ad_hoc(&ad_hoc).await.unwrap().allowed());
    assert!(!engine.decide_ad_hoc(&ad_hoc).await.unwrap().allowed());
    assert_eq!(redis.keys_and_ttls().len(), 3);
    assert!(engine.reset_ad_hoc("job", &policy).await.unwrap());
    assert_eq!(redis.keys_and_ttls().len(), 2);
    assert!(engine.decide_ad_hoc(&ad_hoc).await.unwrap().allowed());

    let histogram = Policy::new(
        1,
        Duration::from_secs(1),
        Algorithm::ExponentialHistogram { epsilon: 0.1 },
    )
    .unwrap();
    let refused = engine
        .decide_ad_hoc(&AdHoc {
            policy: histogram,
            ..ad_hoc
        })
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("no Redis form"), "{refused}");
}

/// Redis killed: the failure policy answers within the timeout, the
/// metrics count the fallbacks; Redis started again on the same port: the
/// decisions come from Redis again (the connection manager reconnects).
async fn outage(failure: FailurePolicy, source: &str, during: impl Fn(usize, Code)) {
    const TIMEOUT: Duration = Duration::from_millis(300);
    let redis = RedisServer::start();
    let port = redis.port();
    let mut h = start(
        &limit_yaml("o", 4, Some("fixed_window")),
        redis_options(redis.url(), failure, TIMEOUT),
    )
    .await
    .unwrap();
    assert_eq!(h.hit("o", &[("user", "alice")]).await, Code::Ok);
    redis.kill();

    for i in 0..6 {
        let start = Instant::now();
        let code = h.hit("o", &[("user", "alice")]).await;
        // The timeout, and some room for gRPC on a busy machine.
        assert!(
            start.elapsed() < TIMEOUT + Duration::from_secs(1),
            "{source}: {:?}",
            start.elapsed()
        );
        during(i, code);
    }
    let fallbacks = format!("slidegate_redis_fallbacks_total{{source=\"{source}\"}}");
    assert_eq!(h.metric(&fallbacks), 6.0, "{source}");
    assert!(h.metric("slidegate_redis_errors_total") >= 1.0, "{source}");
    // The same decisions by source and outcome; the one before the kill
    // was the store's, admitted.
    let by_source = |outcome: &str| {
        h.metric(&format!(
            "slidegate_store_decisions_total{{source=\"{source}\",outcome=\"{outcome}\"}}"
        ))
    };
    assert_eq!(by_source("admitted") + by_source("refused"), 6.0, "{source}");
    assert_eq!(
        h.metric("slidegate_store_decisions_total{source=\"store\",outcome=\"admitted\"}"),
        1.0
    );

    let redis = RedisServer::start_on(port, &[]).expect("the port is free again");
    let deadline = Instant::now() + Duration::from_secs(30);
    // Asked until a decision is counted in Redis: the backoff and the
    // reconnection take their time (each call within the backoff answers
    // at once).
    while redis.keys_and_ttls().is_empty() {
        assert!(Instant::now() < deadline, "{source}: no decision came from Redis again");
        h.hit("o", &[("user", "alice")]).await;
        tokio::task::yield_now().await;
    }
    // The new Redis counts from scratch: 4 in all, the first one included.
    let mut admitted = 1;
    for _ in 0..6 {
        admitted += u32::from(h.hit("o", &[("user", "alice")]).await == Code::Ok);
    }
    assert_eq!(admitted, 4, "{source}");
}

#[tokio::test]
async fn redis_down_fails_open() {
    outage(FailurePolicy::Open, "fail_open", |_, code| assert_eq!(code, Code::Ok)).await;
}

#[tokio::test]
async fn redis_down_fails_closed() {
    outage(FailurePolicy::Closed, "fail_closed", |_, code| {
        assert_eq!(code, Code::OverLimit);
    })
    .await;
}

#[tokio::test]
async fn redis_down_counts_locally() {
    // A limit of 4 shared by 2 instances: 2 each while Redis is down,
    // from this instance's share of what Redis had counted (1 before the
    // kill: ⌈1 / 2⌉ = 1), so 1 more.
    outage(FailurePolicy::Local { instances: 2 }, "local", |i, code| {
        let expected = if i < 1 { Code::Ok } else { Code::OverLimit };
        assert_eq!(code, expected, "call {i}");
    })
    .await;
}

/// Waits (bounded) until `done` holds.
async fn until(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done().await {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::task::yield_now().await;
    }
}

/// Hybrid mode: decisions are local, their counts reach Redis with the
/// background sync, an instance's view learns the others' counts with its
/// next sync, and shutdown sends what is still pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hybrid_mode_decides_locally_and_syncs() {
    let redis = RedisServer::start();
    let yaml = limit_yaml("hybrid", 7, None);
    let key = "alice";
    let hybrid = |interval| RedisOptions {
        sync_interval: Some(interval),
        ..redis_options(redis.url(), FailurePolicy::Closed, Duration::from_secs(2))
    };
    let mut a = start(&yaml, hybrid(Duration::from_millis(20))).await.unwrap();
    for _ in 0..5 {
        assert_eq!(a.hit("hybrid", &[("user", "alice")]).await, Code::Ok);
    }
    until("A's counts reach Redis", async || redis.ring_count(key) == 5).await;
    assert!(a.metric("slidegate_redis_sync_commands_total") >= 1.0);

    let mut b = start(&yaml, hybrid(Duration::from_millis(20))).await.unwrap();
    // B's first decision is its own (its view is empty); its sync brings
    // back A's counts.
    assert_eq!(b.hit("hybrid", &[("user", "alice")]).await, Code::Ok);
    until("B's view holds the global count", async || {
        b.remaining("hybrid", &[("user", "alice")]).await == 1
    })
    .await;
    assert_eq!(b.hit("hybrid", &[("user", "alice")]).await, Code::Ok);
    assert_eq!(b.hit("hybrid", &[("user", "alice")]).await, Code::OverLimit);
    assert_eq!(b.metric("slidegate_redis_fallbacks_total"), 0.0);
    until("B's counts reach Redis", async || redis.ring_count(key) == 7).await;
    a.running.shutdown().await;
    b.running.shutdown().await;

    // Counts still pending at shutdown are sent before it returns.
    let mut c = start(&yaml, hybrid(Duration::from_secs(3600))).await.unwrap();
    for _ in 0..3 {
        assert_eq!(c.hit("hybrid", &[("user", "bob")]).await, Code::Ok);
    }
    c.running.shutdown().await;
    assert_eq!(redis.ring_count("bob"), 3);
    drop((a.dir, b.dir, c.dir));
}
