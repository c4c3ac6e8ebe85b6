//! The answers envoyproxy/ratelimit gives, from the real server over gRPC,
//! call by call: its test suite's and integration scripts' behaviours,
//! and the service settings of its environment. Time is a manual clock.

use slidegate_server::engine::Settings;
use slidegate_server::proto::descriptor::RateLimitDescriptor;
use slidegate_server::proto::descriptor::rate_limit_descriptor::RateLimitOverride;
use slidegate_server::proto::rls::RateLimitResponse;
use slidegate_server::proto::rls::rate_limit_response::{Code, rate_limit};
use slidegate_server::server::ResponseHeaderNames;
use std::time::Duration;

mod common;
use common::harness::*;

/// A descriptor with its own `hits_addend`.
fn with_hits(entries: &[(&str, &str)], hits: u64) -> RateLimitDescriptor {
    let mut d = descriptor(entries);
    d.hits_addend = Some(pbjson_types::UInt64Value { value: hits });
    d
}

/// The headers an answer asks Envoy to add, as (name, value).
fn added(response: &RateLimitResponse) -> Vec<(String, String)> {
    response
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.to_ascii_lowercase(), h.value.clone()))
        .collect()
}

const RULES: &str = "
domain: d
descriptors:
  - key: plain
    rate_limit: { unit: hour, requests_per_unit: 10 }
  - key: named
    rate_limit: { name: the_limit, unit: minute, requests_per_unit: 5 }
  - key: free
    rate_limit: { unlimited: true }
  - key: bare
  - key: shadow
    shadow_mode: true
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: service
    value: service_1
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: service
    value: service_2
    rate_limit: { unit: minute, requests_per_unit: 2 }
  - key: quota
    quota_mode: true
    rate_limit: { unit: minute, requests_per_unit: 2 }
  - key: tagged
    metadata: { team: payments, tier: { level: 1 } }
    rate_limit: { unit: minute, requests_per_unit: 5 }
  - key: tagged2
    metadata: { team: search, tier: { zone: eu } }
    rate_limit: { unit: minute, requests_per_unit: 5 }
";

/// No rule: OK, no current limit, 0 remaining; `unlimited`: OK, no current
/// limit, `u32::MAX` remaining; so a client tells the two apart. An unknown
/// domain and a rule without a limit are "no rule" too.
#[tokio::test]
async fn no_rule_and_unlimited_are_told_apart() {
    let mut h = Harness::start(RULES).await;
    let r = h
        .rls(request(
            "d",
            vec![
                descriptor(&[("nothing", "x")]),
                descriptor(&[("free", "x")]),
                descriptor(&[("bare", "x")]),
            ],
        ))
        .await
        .unwrap();
    assert_eq!(r.overall_code(), Code::Ok);
    let [none, free, bare] = &r.statuses[..] else {
        panic!("three statuses: {r:?}")
    };
    assert_eq!(
        (none.code(), none.current_limit.as_ref(), none.limit_remaining),
        (Code::Ok, None, 0)
    );
    assert_eq!(
        (free.code(), free.current_limit.as_ref(), free.limit_remaining),
        (Code::Ok, None, u32::MAX)
    );
    assert_eq!(
        (bare.code(), bare.current_limit.as_ref(), bare.limit_remaining),
        (Code::Ok, None, 0)
    );
    let r = h.rls(one("elsewhere", &[("plain", "x")])).await.unwrap();
    assert_eq!(
        (r.statuses[0].current_limit.as_ref(), r.statuses[0].limit_remaining),
        (None, 0)
    );
}

/// `current_limit.name` is the config's name, empty when it has none.
#[tokio::test]
async fn current_limit_names_are_the_configs() {
    let mut h = Harness::start(RULES).await;
    let r = h.rls(one("d", &[("plain", "x")])).await.unwrap();
    let limit = r.statuses[0].current_limit.clone().unwrap();
    assert_eq!(
        (limit.name.as_str(), limit.requests_per_unit, limit.unit()),
        ("", 10, rate_limit::Unit::Hour)
    );
    let r = h.rls(one("d", &[("named", "x")])).await.unwrap();
    assert_eq!(r.statuses[0].current_limit.clone().unwrap().name, "the_limit");
}

/// One Envoy request in the peek-then-debit pattern: the peek (`hits_addend`
/// 0 on the request path) and, if it passed, the debit of `cost` when the
/// stream ends. Whether the request passed.
async fn peek_then_debit(h: &mut Harness, peek: &[&[(&str, &str)]], debit: &[(&str, &str)], cost: u64) -> bool {
    let descriptors = peek.iter().map(|e| with_hits(e, 0)).collect();
    let r = h.rls(request("d", descriptors)).await.unwrap();
    if r.overall_code() != Code::Ok {
        return false;
    }
    // Envoy ignores the debit's answer: the response has already gone.
    h.rls(request("d", vec![with_hits(debit, cost)])).await.unwrap();
    true
}

/// envoyproxy/ratelimit's token-quota script: `service_2` allows 2 a
/// minute, debited when the stream ends: requests 1 to 3 pass (the third's
/// peek sees 2, not over 2), the third's debit takes the count to 3, so the
/// fourth is refused; once the counts have left the window (a sliding
/// window of 8 buckets: within a minute and a bucket) the quota is back.
#[tokio::test]
async fn token_quota_admits_three_then_refuses() {
    let mut h = Harness::start(RULES).await;
    let s1: &[(&str, &str)] = &[("service", "service_1")];
    let s2: &[(&str, &str)] = &[("service", "service_2")];
    let passed: Vec<bool> = {
        let mut out = Vec::new();
        for _ in 0..5 {
            out.push(peek_then_debit(&mut h, &[s1, s2], s2, 1).await);
        }
        out
    };
    assert_eq!(passed, [true, true, true, false, false]);
    h.clock.advance(Duration::from_secs(68));
    assert!(peek_then_debit(&mut h, &[s1, s2], s2, 1).await);
}

/// The same pattern on a plain 10 an hour rule admits 11 (the eleventh's
/// peek sees 10), on a quota-mode rule of 2 admits 3; a debit of 5 tokens
/// at once on 10 an hour admits 3 (0, 5, 10 seen by the peeks).
#[tokio::test]
async fn peek_then_debit_on_plain_and_quota_rules() {
    let mut h = Harness::start(RULES).await;
    let plain: &[(&str, &str)] = &[("plain", "a")];
    let mut admitted = 0;
    for _ in 0..15 {
        admitted += usize::from(peek_then_debit(&mut h, &[plain], plain, 1).await);
    }
    assert_eq!(admitted, 11);

    let quota: &[(&str, &str)] = &[("quota", "a")];
    let mut admitted = 0;
    for _ in 0..10 {
        admitted += usize::from(peek_then_debit(&mut h, &[quota], quota, 1).await);
    }
    assert_eq!(admitted, 3);

    let tokens: &[(&str, &str)] = &[("plain", "tokens")];
    let mut admitted = 0;
    for _ in 0..6 {
        admitted += usize::from(peek_then_debit(&mut h, &[tokens], tokens, 5).await);
    }
    assert_eq!(admitted, 3);
}

/// A debit is counted even past the limit, and answered OVER_LIMIT with 0
/// remaining; an ordinary request over the limit counts nothing by default
/// (`STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` on), so a client that waits
/// out its refusals is not held back by them.
#[tokio::test]
async fn debits_count_past_the_limit_ordinary_refusals_do_not() {
    let mut h = Harness::start(RULES).await;
    for _ in 0..5 {
        h.rls(one("d", &[("named", "a")])).await.unwrap();
    }
    let r = h
        .rls(request("d", vec![with_hits(&[("named", "a")], 3)]))
        .await
        .unwrap();
    assert_eq!((r.overall_code(), r.statuses[0].limit_remaining), (Code::OverLimit, 0));
    // 8 counted: a peek now sees more than 5.
    let r = h
        .rls(request("d", vec![with_hits(&[("named", "a")], 0)]))
        .await
        .unwrap();
    assert_eq!(r.overall_code(), Code::OverLimit);

    for _ in 0..5 {
        h.rls(one("d", &[("named", "b")])).await.unwrap();
    }
    for _ in 0..3 {
        let r = h.rls(one("d", &[("named", "b")])).await.unwrap();
        assert_eq!(r.overall_code(), Code::OverLimit);
    }
    // The three refusals counted nothing: the peek sees exactly 5.
    let r = h
        .rls(request("d", vec![with_hits(&[("named", "b")], 0)]))
        .await
        .unwrap();
    assert_eq!((r.overall_code(), r.statuses[0].limit_remaining), (Code::Ok, 0));
}

/// With `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` off, every hit counts, as
/// envoyproxy/ratelimit does by default: three refusals take the count to 8.
#[tokio::test]
async fn every_hit_counts_with_the_stop_setting_off() {
    let mut h = Harness::start_with(RULES, |o| {
        o.settings = Settings {
            stop_increment_when_over_limit: false,
            ..Settings::default()
        };
    })
    .await;
    for _ in 0..8 {
        h.rls(one("d", &[("named", "b")])).await.unwrap();
    }
    let r = h
        .rls(request("d", vec![with_hits(&[("named", "b")], 0)]))
        .await
        .unwrap();
    assert_eq!(r.overall_code(), Code::OverLimit);
    // The fixed-window unit of a minute: after it, counts are gone.
    h.clock.advance(Duration::from_secs(120));
    let r = h.rls(one("d", &[("named", "b")])).await.unwrap();
    assert_eq!(r.overall_code(), Code::Ok);
}

/// A descriptor's own `limit` applies to any descriptor of a known domain,
/// matched by a rule or not; in an unknown domain it applies to nothing.
#[tokio::test]
async fn a_descriptors_own_limit_applies_without_a_rule() {
    let mut h = Harness::start(RULES).await;
    let mut overridden = descriptor(&[("nothing", "x")]);
    overridden.limit = Some(RateLimitOverride {
        requests_per_unit: 2,
        unit: rate_limit::Unit::Second as i32,
    });
    let mut codes_seen = Vec::new();
    for _ in 0..3 {
        let r = h.rls(request("d", vec![overridden.clone()])).await.unwrap();
        codes_seen.push(r.overall_code());
    }
    assert_eq!(codes_seen, [Code::Ok, Code::Ok, Code::OverLimit]);
    let r = h.rls(request("d", vec![overridden.clone()])).await.unwrap();
    let limit = r.statuses[0].current_limit.clone().unwrap();
    assert_eq!((limit.name.as_str(), limit.requests_per_unit), ("", 2));
    let r = h.rls(request("elsewhere", vec![overridden])).await.unwrap();
    assert_eq!(
        (r.overall_code(), r.statuses[0].current_limit.as_ref()),
        (Code::Ok, None)
    );
}

/// A rule in shadow mode that would refuse answers OK, and the headers say
/// what was done: no `Retry-After`.
#[tokio::test]
async fn shadow_mode_answers_carry_no_retry_after() {
    let mut h = Harness::start_with(RULES, |o| o.grpc_headers = true).await;
    h.rls(one("d", &[("shadow", "a")])).await.unwrap();
    let r = h.rls(one("d", &[("shadow", "a")])).await.unwrap();
    assert_eq!((r.overall_code(), r.statuses[0].code()), (Code::Ok, Code::Ok));
    let headers = added(&r);
    assert!(headers.iter().any(|(k, _)| k == "ratelimit"), "{headers:?}");
    assert!(!headers.iter().any(|(k, _)| k == "retry-after"), "{headers:?}");
    let (status, headers, _) = h
        .post(
            "/json",
            r#"{"domain":"d","descriptors":[{"entries":[{"key":"shadow","value":"a"}]}]}"#,
        )
        .await;
    assert_eq!(status, http::StatusCode::OK);
    assert!(headers.get("retry-after").is_none());
    // An ordinary refusal keeps its Retry-After.
    h.rls(one("d", &[("service", "service_1")])).await.unwrap();
    let r = h.rls(one("d", &[("service", "service_1")])).await.unwrap();
    assert_eq!(r.overall_code(), Code::OverLimit);
    assert!(added(&r).iter().any(|(k, _)| k == "retry-after"));
}

/// `SHADOW_MODE`: the overall code is OK, each status still says what its
/// limit decided, and the answers so turned are counted.
#[tokio::test]
async fn the_global_shadow_mode() {
    let mut h = Harness::start_with(RULES, |o| o.settings.shadow_mode = true).await;
    h.rls(one("d", &[("service", "service_1")])).await.unwrap();
    let r = h.rls(one("d", &[("service", "service_1")])).await.unwrap();
    assert_eq!((r.overall_code(), r.statuses[0].code()), (Code::Ok, Code::OverLimit));
    assert_eq!(h.metric("slidegate_global_shadow_mode_total").await, Some(1.0));
}

/// `QUOTA_MODE`: every rule a quota; the answer is over the limit only
/// when every limited descriptor is.
#[tokio::test]
async fn the_global_quota_mode() {
    let mut h = Harness::start_with(RULES, |o| o.settings.quota_mode = true).await;
    h.rls(one("d", &[("service", "service_1")])).await.unwrap();
    let both = || {
        request(
            "d",
            vec![
                descriptor(&[("service", "service_1")]),
                descriptor(&[("service", "service_2")]),
            ],
        )
    };
    let r = h.rls(both()).await.unwrap();
    assert_eq!(r.overall_code(), Code::Ok);
    assert_eq!(codes(&r), [Code::OverLimit, Code::Ok]);
    h.rls(both()).await.unwrap();
    let r = h.rls(both()).await.unwrap();
    assert_eq!(codes(&r), [Code::OverLimit, Code::OverLimit]);
    assert_eq!(r.overall_code(), Code::OverLimit);
}

/// `LIMIT_RESPONSE_HEADERS_ENABLED`: the limit, remaining and seconds to
/// reset of the descriptor closest to its limit, under configurable names.
#[tokio::test]
async fn envoyproxys_response_headers() {
    let mut h = Harness::start_with(RULES, |o| {
        o.response_headers = Some(ResponseHeaderNames {
            limit: http::HeaderName::from_static("x-limit"),
            ..ResponseHeaderNames::default()
        });
    })
    .await;
    let r = h
        .rls(request(
            "d",
            vec![descriptor(&[("plain", "a")]), descriptor(&[("named", "a")])],
        ))
        .await
        .unwrap();
    let headers = added(&r);
    let get = |name: &str| headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    // `named` (5 a minute, 4 left) is closer to its limit than `plain`.
    assert_eq!(get("x-limit").as_deref(), Some("5"));
    assert_eq!(get("ratelimit-remaining").as_deref(), Some("4"));
    // The seconds until the limit's counted usage has expired, rounded up:
    // the status's `duration_until_reset` (for a sliding window, up to a
    // bucket beyond the window; see the table of differences in docs/from-envoyproxy-ratelimit.md).
    let until = r.statuses[1].duration_until_reset.unwrap();
    let secs = until.seconds + i64::from(until.nanos > 0);
    assert!((60..=68).contains(&secs), "{until:?}");
    assert_eq!(get("ratelimit-reset"), Some(secs.to_string()));
    // Off by default.
    let mut plain = Harness::start(RULES).await;
    assert!(added(&plain.rls(one("d", &[("named", "a")])).await.unwrap()).is_empty());
}

/// `RESPONSE_DYNAMIC_METADATA`: the domain, the descriptors, the hits and
/// the `metadata` of the rules that passed, merged (the first wins; maps
/// are merged key by key).
#[tokio::test]
async fn dynamic_metadata_carries_the_rules_metadata() {
    let mut h = Harness::start_with(RULES, |o| o.settings.dynamic_metadata = true).await;
    let mut r = request(
        "d",
        vec![descriptor(&[("tagged", "a")]), with_hits(&[("tagged2", "b")], 2)],
    );
    r.hits_addend = 1;
    let answer = h.rls(r).await.unwrap();
    let metadata = serde_json::to_value(answer.dynamic_metadata.unwrap()).unwrap();
    assert_eq!(
        metadata,
        serde_json::json!({
            "domain": "d",
            "descriptors": [
                { "entries": ["tagged=a"] },
                { "entries": ["tagged2=b"], "hitsAddend": 2.0 },
            ],
            "hitsAddend": 1.0,
            "metadata": { "team": "payments", "tier": { "level": 1.0, "zone": "eu" } },
        })
    );
    // Off by default.
    let mut plain = Harness::start(RULES).await;
    assert!(
        plain
            .rls(one("d", &[("tagged", "a")]))
            .await
            .unwrap()
            .dynamic_metadata
            .is_none()
    );
}

/// `MERGE_DOMAIN_CONFIG`: two files of one domain serve as one; without it
/// the start fails naming both files.
#[tokio::test]
async fn merged_domain_files_serve_as_one() {
    let part = |key: &str| {
        format!(
            "domain: shop\ndescriptors:\n  - key: {key}\n    rate_limit: {{ unit: minute, requests_per_unit: 1 }}\n"
        )
    };
    let merged = common::TempDir::new("merged");
    merged.write("a.yaml", &part("cart"));
    merged.write("b.yaml", &part("search"));
    let mut h = Harness::start_with("", |o| {
        o.merge_domains = true;
        o.config = vec![merged.0.clone()];
    })
    .await;
    for key in ["cart", "search"] {
        assert_eq!(
            h.rls(one("shop", &[(key, "x")])).await.unwrap().overall_code(),
            Code::Ok
        );
        assert_eq!(
            h.rls(one("shop", &[(key, "x")])).await.unwrap().overall_code(),
            Code::OverLimit,
            "{key}"
        );
    }
    let dir = common::TempDir::new("unmerged");
    dir.write("a.yaml", &part("cart"));
    dir.write("b.yaml", &part("search"));
    let options = slidegate_server::server::Options {
        http: "127.0.0.1:0".parse().unwrap(),
        grpc: "127.0.0.1:0".parse().unwrap(),
        config: vec![dir.0.clone()],
        ..Default::default()
    };
    let Err(e) = slidegate_server::server::start(options, slidegate_core::ManualClock::new(0)).await else {
        panic!("two files of one domain started without merging");
    };
    let message = e.to_string();
    assert!(message.contains("a.yaml") && message.contains("b.yaml"), "{message}");
}

/// `NEAR_LIMIT_RATIO` out of 0 to 1 stops the start, naming the value.
#[tokio::test]
async fn a_bad_near_limit_ratio_stops_the_start() {
    let options = slidegate_server::server::Options {
        http: "127.0.0.1:0".parse().unwrap(),
        grpc: "127.0.0.1:0".parse().unwrap(),
        near_limit_ratio: 1.5,
        ..Default::default()
    };
    let Err(e) = slidegate_server::server::start(options, slidegate_core::ManualClock::new(0)).await else {
        panic!("started with a ratio of 1.5");
    };
    assert!(e.to_string().contains("1.5"), "{e}");
}

/// A reload that changes only a limit's `requests_per_unit` keeps its
/// count, as envoyproxy/ratelimit's counters (keyed by descriptor and unit)
/// do; a changed unit, algorithm or `gcra` limit starts afresh.
#[tokio::test]
async fn a_changed_limit_keeps_its_count_across_a_reload() {
    let yaml = |n: u32, unit: &str, extra: &str| {
        format!(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{ unit: {unit}, requests_per_unit: {n}{extra} }}\n"
        )
    };
    let mut h = Harness::start(&yaml(5, "minute", "")).await;
    let send = async |h: &mut Harness| h.rls(one("d", &[("k", "a")])).await.unwrap();
    for _ in 0..4 {
        assert_eq!(send(&mut h).await.overall_code(), Code::Ok);
    }
    let reload = |h: &Harness, text: &str| {
        h.dir.write("domain.yaml", text);
        h.running.reloader().reload().unwrap();
    };
    // 4 counted; the limit goes up to 6: two more pass, not six.
    reload(&h, &yaml(6, "minute", ""));
    let r = send(&mut h).await;
    assert_eq!((r.overall_code(), r.statuses[0].limit_remaining), (Code::Ok, 1));
    assert_eq!(send(&mut h).await.overall_code(), Code::Ok);
    assert_eq!(send(&mut h).await.overall_code(), Code::OverLimit);
    // Down to 3: already over.
    reload(&h, &yaml(3, "minute", ""));
    assert_eq!(send(&mut h).await.overall_code(), Code::OverLimit);
    // Another unit is another count.
    reload(&h, &yaml(3, "hour", ""));
    let r = send(&mut h).await;
    assert_eq!((r.overall_code(), r.statuses[0].limit_remaining), (Code::Ok, 2));
    // gcra's state is in its limit's interval: a new limit starts afresh.
    reload(&h, &yaml(2, "hour", ", algorithm: gcra"));
    assert_eq!(send(&mut h).await.overall_code(), Code::Ok);
    reload(&h, &yaml(3, "hour", ", algorithm: gcra"));
    let r = send(&mut h).await;
    assert_eq!((r.overall_code(), r.statuses[0].limit_remaining), (Code::Ok, 2));
}

/// The server loads what envoyproxy/ratelimit loads: anchors and aliases,
/// a `replaces` naming no limit, a limit without `requests_per_unit` (0,
/// refusing everything), and serves it.
#[tokio::test]
async fn the_server_loads_what_envoyproxy_ratelimit_loads() {
    let yaml = "
domain: d
descriptors:
  - key: a
    rate_limit: &two { unit: minute, requests_per_unit: 2 }
  - key: b
    rate_limit: *two
  - key: ghostly
    rate_limit: { unit: minute, requests_per_unit: 3, replaces: [ { name: nowhere } ] }
  - key: zero
    rate_limit: { unit: minute }
";
    let mut h = Harness::start(yaml).await;
    let config = h.running.shared().engine().config();
    assert_eq!(config.warnings().len(), 2, "{:?}", config.warnings());
    for key in ["a", "b"] {
        let seen: Vec<Code> = {
            let mut out = Vec::new();
            for _ in 0..3 {
                out.push(h.rls(one("d", &[(key, "x")])).await.unwrap().overall_code());
            }
            out
        };
        assert_eq!(seen, [Code::Ok, Code::Ok, Code::OverLimit], "{key}");
    }
    assert_eq!(
        h.rls(one("d", &[("ghostly", "x")])).await.unwrap().overall_code(),
        Code::Ok
    );
    assert_eq!(
        h.rls(one("d", &[("zero", "x")])).await.unwrap().overall_code(),
        Code::OverLimit
    );
}

/// The gRPC health service answers SERVING for `""` and `ratelimit`; on
/// shutdown it turns NOT_SERVING and `/readyz` 503 at once, while the
/// drain delay lets new requests still be answered.
#[tokio::test]
async fn health_turns_not_serving_before_the_listeners_close() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let h = Harness::start_with(RULES, |o| o.drain_delay = Duration::from_secs(3)).await;
    let channel = h.channel().await;
    let mut health = HealthClient::new(channel);
    let status = async |health: &mut HealthClient<tonic::transport::Channel>, name: &str| {
        let request = HealthCheckRequest {
            service: name.to_owned(),
        };
        health.check(request).await.unwrap().into_inner().status()
    };
    for name in ["", "ratelimit"] {
        assert_eq!(status(&mut health, name).await, ServingStatus::Serving, "{name:?}");
    }
    assert_eq!(h.get("/readyz").await.0, http::StatusCode::OK);
    let shared = std::sync::Arc::clone(h.running.shared());
    let http = h.http_addr();
    let Harness { running, mut grpc, .. } = h;
    let stopping = tokio::spawn(running.shutdown());
    // Bounded: the health answer turns within the drain delay.
    let mut turned = false;
    for _ in 0..100 {
        if status(&mut health, "ratelimit").await == ServingStatus::NotServing {
            turned = true;
            break;
        }
        tokio::task::yield_now().await;
    }
    assert!(turned, "health still SERVING while draining");
    assert!(shared.draining());
    // Still answering while draining: gRPC on an open channel, HTTP on a
    // new connection.
    let r = grpc
        .should_rate_limit(one("d", &[("plain", "z")]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code(), Code::Ok);
    let (status_code, body) = common::harness::http_get(http, "/readyz").await;
    assert_eq!(status_code, http::StatusCode::SERVICE_UNAVAILABLE, "{body}");
    stopping.await.unwrap();
}
