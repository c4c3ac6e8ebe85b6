//! The Rate Limit Quota Service over real gRPC streams: clients that
//! behave as Envoy's `rate_limit_quota` filter (`common::envoy_quota`, one
//! stream per Envoy and domain, its reports every 5 s, its token buckets
//! and TTLs) against `slidegate serve`'s gRPC listener, on the server's
//! manual clock; and the reports an attacker would send.

mod common;

use common::envoy_quota::{Behaviours, Blanket, CurrentAction, EnvoyQuotaClient, Strategy, bucket_id};
use common::harness::Harness;
use slidegate_server::proto::quota::rate_limit_quota_response::bucket_action::BucketAction as Action;
use slidegate_server::proto::quota::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use slidegate_server::proto::quota::rate_limit_quota_usage_reports::BucketQuotaUsage;
use slidegate_server::proto::quota::{BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports};
use slidegate_server::proto::types::rate_limit_strategy::Strategy as WireStrategy;
use std::collections::HashMap;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

const S: u64 = 1_000_000_000;
/// The harness's clock starts here; the models' time is counted from it.
const BASE: u64 = 1_000_000_000_000;
/// How long a test waits for an answer the server owes it (a hang guard,
/// never reached when the server works).
const ANSWER: Duration = Duration::from_secs(10);

const CONFIG: &str = r#"
domain: edge
quota_buckets:
  - name: checkout
    bucket_id: {route: checkout, tenant: "*"}
    rate_limit: {unit: minute, requests_per_unit: 600}
  - name: health
    bucket_id: {route: health}
    rate_limit: {unlimited: true}
  - name: closed
    bucket_id: {route: admin}
    rate_limit: {unit: second, requests_per_unit: 0}
"#;

const CHECKOUT: &[(&str, &str)] = &[("route", "checkout"), ("tenant", "a")];

/// One gRPC stream: its sending side and its answers.
struct Wire {
    send: mpsc::Sender<RateLimitQuotaUsageReports>,
    answers: tonic::Streaming<RateLimitQuotaResponse>,
}

impl Wire {
    async fn open(channel: &Channel) -> Wire {
        Wire::open_as(channel, None).await
    }

    /// A stream carrying `envoy` as its `x-slidegate-envoy-id`, if given.
    async fn open_as(channel: &Channel, envoy: Option<&str>) -> Wire {
        let (send, queue) = mpsc::channel(64);
        let mut request = tonic::Request::new(ReceiverStream::new(queue));
        if let Some(envoy) = envoy {
            request
                .metadata_mut()
                .insert("x-slidegate-envoy-id", envoy.parse().expect("an ASCII id"));
        }
        let answers = RateLimitQuotaServiceClient::new(channel.clone())
            .stream_rate_limit_quotas(request)
            .await
            .expect("the stream opens")
            .into_inner();
        Wire { send, answers }
    }

    /// Sends `reports` and waits for their answer.
    async fn ask(&mut self, reports: RateLimitQuotaUsageReports) -> Result<RateLimitQuotaResponse, tonic::Status> {
        self.send.send(reports).await.expect("the stream takes reports");
        match tokio::time::timeout(ANSWER, self.answers.message()).await {
            Ok(Ok(Some(answer))) => Ok(answer),
            Ok(Ok(None)) => Err(tonic::Status::cancelled("the stream ended without an answer")),
            Ok(Err(status)) => Err(status),
            Err(_) => panic!("no answer within {ANSWER:?}"),
        }
    }
}

/// An Envoy: the model and its streams on its own connection.
struct Envoy {
    model: EnvoyQuotaClient,
    channel: Channel,
    wires: HashMap<usize, Wire>,
    /// The `x-slidegate-envoy-id` its streams carry, if any.
    id: Option<String>,
}

impl Envoy {
    async fn new(h: &Harness, behaviours: Behaviours) -> Envoy {
        Envoy {
            model: EnvoyQuotaClient::new("edge", behaviours),
            channel: h.channel().await,
            wires: HashMap::new(),
            id: None,
        }
    }

    /// Sends what the model has to send, each on its stream, and hands
    /// each answer back to the model.
    async fn pump(&mut self, t: u64) {
        for out in self.model.outbox() {
            if !self.wires.contains_key(&out.stream) {
                let wire = Wire::open_as(&self.channel, self.id.as_deref()).await;
                self.wires.insert(out.stream, wire);
            }
            let wire = self.wires.get_mut(&out.stream).expect("opened above");
            let answer = wire.ask(out.reports).await.expect("a report is answered");
            self.model.receive(&answer, t);
        }
    }

    async fn request(&mut self, bucket: &[(&str, &str)], t: u64) -> bool {
        let allowed = self.model.request(bucket, t);
        self.pump(t).await;
        allowed
    }

    async fn tick(&mut self, t: u64) {
        self.model.tick(t);
        self.pump(t).await;
    }

    /// Whether `bucket` holds a token bucket (its share) now.
    fn has_token_bucket(&self, bucket: &[(&str, &str)]) -> bool {
        matches!(
            self.model.action(bucket),
            Some(CurrentAction::Assigned(Some(Strategy::TokenBucket(_))))
        )
    }

    /// Its streams go away (a reset, a slidegate restart behind a load
    /// balancer): Envoy keeps its assignments, and its next timer opens
    /// another stream.
    fn lose_streams(&mut self) {
        self.wires.clear();
        self.model.stream_closed();
    }
}

fn deny_first() -> Behaviours {
    Behaviours {
        no_assignment: Blanket::DenyAll,
        expired: None,
    }
}

/// The most in any window of `window` among sorted times.
fn most_in_a_window(times: &[u64], window: u64) -> usize {
    let mut end = 0;
    let mut most = 0;
    for (start, t) in times.iter().enumerate() {
        while end < times.len() && times[end] < t + window {
            end += 1;
        }
        most = most.max(end - start);
    }
    most
}

#[tokio::test]
async fn three_envoys_share_one_limit_and_blanket_rules_apply() {
    let h = Harness::start(CONFIG).await;
    let mut envoys = Vec::new();
    for _ in 0..3 {
        envoys.push(Envoy::new(&h, deny_first()).await);
    }
    // Requests a second: 660 a minute together, over the 600 allowed.
    let rates = [5u64, 5, 1];
    let mut admitted: Vec<u64> = Vec::new();
    let mut per_envoy = [0u64; 3];
    let step = S / 10;
    for n in 0..1800u64 {
        let t = n * step;
        h.clock.set(BASE + t);
        for (i, envoy) in envoys.iter_mut().enumerate() {
            // Evenly spread: a request every 1/rate s.
            let every = 10 / rates[i];
            if n % every == 0 && envoy.request(CHECKOUT, t).await {
                admitted.push(t);
                per_envoy[i] += 1;
            }
            envoy.tick(t).await;
        }
    }
    admitted.sort_unstable();
    let most = most_in_a_window(&admitted, 60 * S);
    assert!(most <= 600, "{most} admitted in one minute: over the limit of 600");
    // The light Envoy (1/s) is never starved once shares settle: it
    // admitted nearly its 180.
    assert!(per_envoy[2] >= 150, "the light Envoy admitted {}", per_envoy[2]);
    // Every Envoy holds a token bucket.
    for envoy in &envoys {
        match envoy.model.action(CHECKOUT) {
            Some(CurrentAction::Assigned(Some(Strategy::TokenBucket(spec)))) => {
                assert!(spec.max_tokens >= 1);
                assert_eq!(spec.fill_seconds, 60);
            }
            other => panic!("expected a token bucket, found {other:?}"),
        }
    }
    // The unlimited and the zero rule.
    let t = 180 * S;
    let envoy = &mut envoys[0];
    assert!(
        !envoy.request(&[("route", "health")], t).await,
        "DENY_ALL before any answer"
    );
    assert!(envoy.request(&[("route", "health")], t).await, "then ALLOW_ALL");
    assert!(!envoy.request(&[("route", "admin")], t).await);
    assert_eq!(
        envoy.model.action(&[("route", "admin")]),
        Some(CurrentAction::Assigned(Some(Strategy::Blanket(Blanket::DenyAll))))
    );
    assert!(!envoy.request(&[("route", "admin")], t).await);
    assert_eq!(h.metric("slidegate_rlqs_streams ").await, Some(3.0));
    assert_eq!(h.metric("slidegate_rlqs_buckets ").await, Some(5.0));
    assert!(
        h.metric("slidegate_rlqs_actions_total{kind=\"token_bucket\"}")
            .await
            .unwrap()
            > 3.0
    );
    assert_eq!(
        h.metric("slidegate_rlqs_actions_total{kind=\"allow_all\"}").await,
        Some(1.0)
    );
    assert_eq!(
        h.metric("slidegate_rlqs_actions_total{kind=\"deny_all\"}")
            .await
            .map(|n| n >= 1.0),
        Some(true)
    );
    let reported = h
        .metric("slidegate_rlqs_reported_requests_total{domain=\"edge\",rule=\"checkout\",outcome=\"allowed\"}")
        .await
        .unwrap();
    // Everything allowed up to the last reports (every 5 s).
    assert!(
        reported >= (admitted.len() as f64) * 0.9 && reported <= admitted.len() as f64,
        "{reported}"
    );
}

#[tokio::test]
async fn a_reload_keeps_what_was_assigned_and_abandons_what_is_no_longer_configured() {
    let h = Harness::start(CONFIG).await;
    let mut first = Envoy::new(&h, deny_first()).await;
    let mut second = Envoy::new(&h, deny_first()).await;
    assert!(!first.request(CHECKOUT, 0).await);
    assert!(first.has_token_bucket(CHECKOUT));
    // A reload changing another rule keeps the ledgers: what the first
    // Envoy was given is still held, so the second, asking a second
    // later, gets DENY_ALL until that hold ends.
    let changed = CONFIG.replace("requests_per_unit: 0", "requests_per_unit: 5");
    h.dir.write("domain.yaml", &changed);
    h.running.reloader().reload().unwrap();
    h.clock.set(BASE + S);
    assert!(!second.request(CHECKOUT, S).await);
    assert_eq!(
        second.model.action(CHECKOUT),
        Some(CurrentAction::Assigned(Some(Strategy::Blanket(Blanket::DenyAll))))
    );
    // A reload without a rule for the bucket: abandoned at the next
    // report; the next request recreates it, reported at once, and gets no
    // action: Envoy keeps its no_assignment_behavior.
    let without = changed.replace("tenant: \"*\"}", "tenant: \"*\", beta: \"x\"}");
    assert_ne!(without, changed);
    h.dir.write("domain.yaml", &without);
    h.running.reloader().reload().unwrap();
    h.clock.set(BASE + 5 * S);
    first.tick(5 * S).await;
    assert_eq!(first.model.action(CHECKOUT), None, "abandoned");
    assert!(!first.request(CHECKOUT, 5 * S).await);
    assert_eq!(
        first.model.action(CHECKOUT),
        Some(CurrentAction::NoAssignment(Blanket::DenyAll))
    );
    assert_eq!(
        h.metric("slidegate_rlqs_actions_total{kind=\"abandon\"}").await,
        Some(1.0)
    );
}

#[tokio::test]
async fn a_new_stream_waits_for_its_old_streams_hold_and_envoy_keeps_its_assignment_meanwhile() {
    let h = Harness::start(CONFIG).await;
    let mut envoy = Envoy::new(&h, deny_first()).await;
    envoy.request(CHECKOUT, 0).await;
    assert!(envoy.has_token_bucket(CHECKOUT));
    // The stream goes away; Envoy keeps its assignment, and its next timer
    // opens another stream and reports there.
    envoy.lose_streams();
    h.clock.set(BASE + S);
    assert!(envoy.has_token_bucket(CHECKOUT));
    // slidegate cannot tell the new stream's Envoy from another: what the
    // old stream was given stays held until its TTL and grace end (11 s),
    // so the new stream is refused until then.
    h.clock.set(BASE + 5 * S);
    envoy.tick(5 * S).await;
    assert_eq!(envoy.model.streams_opened(), 2);
    assert_eq!(
        envoy.model.action(CHECKOUT),
        Some(CurrentAction::Assigned(Some(Strategy::Blanket(Blanket::DenyAll))))
    );
    h.clock.set(BASE + 15 * S);
    envoy.tick(15 * S).await;
    assert!(envoy.has_token_bucket(CHECKOUT));
    assert_eq!(h.metric("slidegate_rlqs_streams ").await, Some(1.0));
}

#[tokio::test]
async fn an_envoy_that_names_itself_goes_on_on_a_new_stream_without_waiting() {
    let h = Harness::start(CONFIG).await;
    let mut envoy = Envoy::new(&h, deny_first()).await;
    envoy.id = Some("envoy-a".to_owned());
    // 20 requests a second, more than the limit's rate: a steady demand.
    for n in 0..100 {
        let t = n * S / 20;
        h.clock.set(BASE + t);
        envoy.request(CHECKOUT, t).await;
    }
    assert!(envoy.has_token_bucket(CHECKOUT));
    let assigned = envoy.model.action(CHECKOUT);
    envoy.lose_streams();
    // The new stream carries the same id: the same holder, so the same
    // token bucket comes back and Envoy carries its tokens over.
    h.clock.set(BASE + 5 * S);
    envoy.tick(5 * S).await;
    assert_eq!(envoy.model.streams_opened(), 2);
    assert_eq!(envoy.model.action(CHECKOUT), assigned);
    // Another Envoy, named otherwise, still waits for that share.
    let mut other = Envoy::new(&h, deny_first()).await;
    other.id = Some("envoy-b".to_owned());
    assert!(!other.request(CHECKOUT, 5 * S).await);
    assert_eq!(
        other.model.action(CHECKOUT),
        Some(CurrentAction::Assigned(Some(Strategy::Blanket(Blanket::DenyAll))))
    );
}

fn usage(bucket: BucketId, allowed: u64, denied: u64, seconds: i64) -> BucketQuotaUsage {
    BucketQuotaUsage {
        bucket_id: Some(bucket),
        time_elapsed: Some(pbjson_types::Duration { seconds, nanos: 0 }),
        num_requests_allowed: allowed,
        num_requests_denied: denied,
    }
}

fn reports(domain: &str, usages: Vec<BucketQuotaUsage>) -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports {
        domain: domain.to_owned(),
        bucket_quota_usages: usages,
    }
}

fn id(pairs: &[(&str, &str)]) -> BucketId {
    bucket_id(&pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect())
}

fn kinds(answer: &RateLimitQuotaResponse) -> Vec<&'static str> {
    answer
        .bucket_action
        .iter()
        .map(|a| match &a.bucket_action {
            Some(Action::AbandonAction(_)) => "abandon",
            Some(Action::QuotaAssignmentAction(q)) => {
                match q.rate_limit_strategy.as_ref().and_then(|s| s.strategy.as_ref()) {
                    Some(WireStrategy::TokenBucket(_)) => "token_bucket",
                    Some(WireStrategy::BlanketRule(0)) => "allow_all",
                    Some(WireStrategy::BlanketRule(_)) => "deny_all",
                    _ => "other",
                }
            }
            None => "none",
        })
        .collect()
}

#[tokio::test]
async fn bad_reports_get_clear_errors_or_the_documented_policy() {
    let h = Harness::start(CONFIG).await;
    let channel = h.channel().await;

    // A first report without a domain ends the stream, naming the field.
    let mut wire = Wire::open(&channel).await;
    let error = wire
        .ask(reports("", vec![usage(id(CHECKOUT), 1, 0, 0)]))
        .await
        .unwrap_err();
    assert_eq!(error.code(), tonic::Code::InvalidArgument);
    assert!(error.message().contains("names no domain"), "{}", error.message());

    // Another domain later ends it too.
    let mut wire = Wire::open(&channel).await;
    let other_tenant = id(&[("route", "checkout"), ("tenant", "z")]);
    wire.ask(reports("edge", vec![usage(other_tenant, 1, 0, 0)]))
        .await
        .unwrap();
    let error = wire.ask(reports("other", vec![])).await.unwrap_err();
    assert_eq!(error.code(), tonic::Code::InvalidArgument);
    assert!(error.message().contains("`other`"), "{}", error.message());

    // Empty, missing and huge bucket ids, absurd counts and times: those
    // buckets get no action, the others theirs, the stream goes on.
    let mut wire = Wire::open(&channel).await;
    let huge = "x".repeat(2000);
    let answer = wire
        .ask(reports(
            "edge",
            vec![
                usage(id(&[]), 1, 0, 5),
                BucketQuotaUsage {
                    bucket_id: None,
                    ..usage(id(CHECKOUT), 0, 0, 0)
                },
                usage(id(&[("route", "checkout"), ("tenant", &huge)]), 1, 0, 5),
                usage(id(CHECKOUT), u64::MAX, u64::MAX, -7),
                usage(
                    id(&[("route", "checkout"), ("tenant", "b")]),
                    u64::MAX,
                    u64::MAX,
                    i64::MAX,
                ),
                usage(id(&[("route", "nowhere")]), 1, 0, 5),
            ],
        ))
        .await
        .unwrap();
    assert_eq!(kinds(&answer), ["token_bucket", "token_bucket"]);
    let answer = wire
        .ask(reports("edge", vec![usage(id(CHECKOUT), 3, 0, 5)]))
        .await
        .unwrap();
    assert_eq!(kinds(&answer), ["token_bucket"]);
    assert_eq!(
        h.metric("slidegate_rlqs_buckets_refused_total{reason=\"bucket_id\"}")
            .await,
        Some(3.0)
    );
    assert_eq!(
        h.metric("slidegate_rlqs_buckets_refused_total{reason=\"unconfigured\"}")
            .await,
        Some(1.0)
    );
    assert_eq!(
        h.metric("slidegate_rlqs_streams_ended_total{reason=\"refused\"}").await,
        Some(2.0)
    );
}

#[tokio::test]
async fn a_silent_stream_is_closed() {
    let h = Harness::start_with(CONFIG, |o| o.quota.idle_stream = Duration::from_millis(200)).await;
    let channel = h.channel().await;
    let mut wire = Wire::open(&channel).await;
    // Nothing sent: the server ends the stream once the idle time passes.
    let end = tokio::time::timeout(ANSWER, wire.answers.message())
        .await
        .expect("ended in time");
    let status = end.unwrap_err();
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
    assert!(status.message().contains("no usage report"), "{}", status.message());
    assert_eq!(
        h.metric("slidegate_rlqs_streams_ended_total{reason=\"idle\"}").await,
        Some(1.0)
    );
    assert_eq!(h.metric("slidegate_rlqs_streams ").await, Some(0.0));
}

#[tokio::test]
async fn a_client_that_never_reads_is_cut_off_and_others_go_on() {
    let h = Harness::start(CONFIG).await;
    let reader = h.channel().await;
    let mut good = Wire::open(&reader).await;
    // The client that never reads, on its own connection: reports of 2,000
    // buckets each, whose answers fill its windows and then the queue.
    let greedy = h.channel().await;
    let (send, queue) = mpsc::channel(1024);
    let _unread = RateLimitQuotaServiceClient::new(greedy)
        .stream_rate_limit_quotas(ReceiverStream::new(queue))
        .await
        .unwrap()
        .into_inner();
    let buckets: Vec<BucketQuotaUsage> = (0..2000)
        .map(|n| usage(id(&[("route", "checkout"), ("tenant", &format!("t{n}"))]), 1, 0, 5))
        .collect();
    let mut ended = false;
    for _ in 0..200 {
        if send.send(reports("edge", buckets.clone())).await.is_err() {
            ended = true;
            break;
        }
        // The other stream is answered meanwhile.
        let answer = good
            .ask(reports("edge", vec![usage(id(CHECKOUT), 1, 0, 5)]))
            .await
            .unwrap();
        assert_eq!(kinds(&answer), ["token_bucket"]);
        if h.metric("slidegate_rlqs_streams_ended_total{reason=\"not_reading\"}")
            .await
            == Some(1.0)
        {
            ended = true;
            break;
        }
    }
    assert!(ended, "the stream that is not read was not ended");
    assert_eq!(
        h.metric("slidegate_rlqs_streams_ended_total{reason=\"not_reading\"}")
            .await,
        Some(1.0)
    );
    let answer = good
        .ask(reports("edge", vec![usage(id(CHECKOUT), 1, 0, 5)]))
        .await
        .unwrap();
    assert_eq!(kinds(&answer), ["token_bucket"]);
}

#[tokio::test]
async fn a_million_bucket_ids_stay_within_the_bound() {
    let h = Harness::start(CONFIG).await;
    let channel = h.channel().await;
    let mut flood = Wire::open(&channel).await;
    // 1,000,000 distinct ids, 10,000 a report: the first 10,000 (the
    // default --rlqs-max-stream-buckets) are tracked, the rest refused.
    for batch in 0..100u32 {
        let usages = (0..10_000u32)
            .map(|n| {
                let tenant = format!("t{}", batch * 10_000 + n);
                usage(id(&[("route", "checkout"), ("tenant", &tenant)]), 1, 0, 5)
            })
            .collect();
        let answer = flood.ask(reports("edge", usages)).await.unwrap();
        assert_eq!(answer.bucket_action.len(), if batch == 0 { 10_000 } else { 0 });
    }
    assert_eq!(h.metric("slidegate_rlqs_buckets ").await, Some(10_000.0));
    assert_eq!(
        h.metric("slidegate_rlqs_buckets_refused_total{reason=\"stream_buckets\"}")
            .await,
        Some(990_000.0)
    );
    // Another stream is answered as before.
    let mut other = Wire::open(&h.channel().await).await;
    let answer = other
        .ask(reports("edge", vec![usage(id(CHECKOUT), 1, 0, 0)]))
        .await
        .unwrap();
    assert_eq!(kinds(&answer), ["token_bucket"]);
}

#[tokio::test]
async fn the_buckets_of_every_stream_together_stay_within_the_bound() {
    let h = Harness::start_with(CONFIG, |o| o.quota.max_buckets = 3).await;
    let channel = h.channel().await;
    let mut first = Wire::open(&channel).await;
    let tenants = |range: std::ops::Range<u32>| -> Vec<BucketQuotaUsage> {
        range
            .map(|n| usage(id(&[("route", "checkout"), ("tenant", &format!("t{n}"))]), 1, 0, 0))
            .collect()
    };
    let answer = first.ask(reports("edge", tenants(0..2))).await.unwrap();
    assert_eq!(answer.bucket_action.len(), 2);
    let mut second = Wire::open(&channel).await;
    let answer = second.ask(reports("edge", tenants(10..12))).await.unwrap();
    assert_eq!(answer.bucket_action.len(), 1, "one more bucket: 3 in all");
    assert_eq!(
        h.metric("slidegate_rlqs_buckets_refused_total{reason=\"server_buckets\"}")
            .await,
        Some(1.0)
    );
    // The first stream ends: its buckets make room.
    drop(first);
    let mut third = Wire::open(&channel).await;
    let mut answered = 0;
    for _ in 0..100 {
        answered = third
            .ask(reports("edge", tenants(20..22)))
            .await
            .unwrap()
            .bucket_action
            .len();
        if answered == 2 {
            break;
        }
        // The server notices the reset on its own time: ask again.
        tokio::task::yield_now().await;
    }
    assert_eq!(answered, 2);
}

#[tokio::test]
async fn a_redis_outage_leaves_envoys_on_their_assignments() {
    use slidegate_conformance::redis::RedisServer;
    use slidegate_server::redis_store::RedisOptions;
    let redis = RedisServer::start();
    let url = redis.url();
    let h = Harness::start_with(CONFIG, |o| {
        o.redis = Some(RedisOptions {
            urls: vec![url],
            timeout: Duration::from_millis(200),
            ..RedisOptions::default()
        });
    })
    .await;
    let mut envoy = Envoy::new(&h, deny_first()).await;
    envoy.request(CHECKOUT, 0).await;
    assert!(envoy.has_token_bucket(CHECKOUT));
    let assigned = envoy.model.action(CHECKOUT);
    redis.kill();
    // The next report is answered without an action for the bucket: Envoy
    // keeps its token bucket until its TTL, and the stream goes on.
    h.clock.set(BASE + 5 * S);
    envoy.tick(5 * S).await;
    assert_eq!(envoy.model.action(CHECKOUT), assigned);
    assert_eq!(envoy.model.streams_opened(), 1);
    assert_eq!(
        h.metric("slidegate_rlqs_buckets_refused_total{reason=\"ledgers\"}")
            .await,
        Some(1.0)
    );
}

/// The guide's config loads as written, and its rules are what the guide
/// says they are.
#[test]
fn the_guides_config_loads_as_written() {
    use slidegate_server::config::Config;
    use slidegate_server::quota::{QuotaPolicy, QuotaRules};
    let guide = include_str!("../../../docs/rate-limit-quota.md");
    let yaml: String = guide
        .split("```yaml\n")
        .skip(1)
        .filter_map(|block| block.split("```").next())
        .find(|block| block.starts_with("domain: edge"))
        .expect("the guide has a config")
        .to_owned();
    let config = Config::parse("rate-limit-quota.md", &yaml).unwrap();
    let rule = |pairs: &[(&str, &str)]| config.quota_rule("edge", pairs).map(|m| (m.rule.to_owned(), m.policy));
    assert_eq!(
        rule(&[("route", "checkout"), ("tenant", "acme")]),
        Some((
            "checkout".to_owned(),
            QuotaPolicy::Limited {
                limit: 600,
                window_ns: 60 * S
            }
        ))
    );
    assert_eq!(
        rule(&[("route", "health")]),
        Some(("health".to_owned(), QuotaPolicy::AllowAll))
    );
    assert_eq!(
        rule(&[("route", "admin")]),
        Some(("admin".to_owned(), QuotaPolicy::DenyAll))
    );
    assert_eq!(rule(&[("route", "checkout")]), None, "no tenant");
}

#[tokio::test]
async fn a_stopping_server_ends_every_stream_for_envoy_to_reconnect() {
    let h = Harness::start(CONFIG).await;
    let channel = h.channel().await;
    let mut wire = Wire::open(&channel).await;
    wire.ask(reports("edge", vec![usage(id(CHECKOUT), 1, 0, 0)]))
        .await
        .unwrap();
    let stopping = tokio::spawn(h.running.shutdown());
    let end = tokio::time::timeout(ANSWER, wire.answers.message())
        .await
        .expect("the stream ends");
    let status = end.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert!(status.message().contains("stopping"), "{}", status.message());
    tokio::time::timeout(ANSWER, stopping)
        .await
        .expect("the server stops")
        .unwrap();
}
