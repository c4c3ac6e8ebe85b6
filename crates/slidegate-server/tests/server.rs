//! The real server on ephemeral loopback ports, over real sockets: gRPC
//! through the client generated from the project's proto files, HTTP
//! through hyper's client. Time is a manual clock.
//!
//! One test per row of the behaviour table of Envoy's rate limit service
//! (`envoy-rls-v3.md` in the project's reference), then the HTTP API, the
//! example config, reloads and shutdown.

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use slidegate_core::ManualClock;
use slidegate_server::proto::descriptor::rate_limit_descriptor::RateLimitOverride;
use slidegate_server::proto::rls::rate_limit_response::{Code, rate_limit};
use slidegate_server::server::{self, Options, Timeouts};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

mod common;
use common::TempDir;
use common::harness::*;

const BASIC: &str = "
domain: d
descriptors:
  - key: a
    rate_limit: { unit: second, requests_per_unit: 2, algorithm: sliding_log }
  - key: open
  - key: free
    rate_limit: { unlimited: true }
  - key: shadow
    shadow_mode: true
    rate_limit: { unit: second, requests_per_unit: 1 }
  - key: q1
    quota_mode: true
    rate_limit: { unit: second, requests_per_unit: 1 }
  - key: q2
    quota_mode: true
    rate_limit: { unit: second, requests_per_unit: 1 }
";

/// Row "statuses": one per request descriptor, in the same order; and row
/// "descriptor matches no rule": OK with no current_limit.
#[tokio::test]
async fn one_status_per_descriptor_in_order() {
    let mut h = Harness::start(BASIC).await;
    let r = request(
        "d",
        vec![
            descriptor(&[("a", "1")]),
            descriptor(&[("nothing", "x")]),
            descriptor(&[("open", "y")]),
            descriptor(&[("a", "2")]),
        ],
    );
    let response = h.rls(r).await.unwrap();
    assert_eq!(response.overall_code(), Code::Ok);
    assert_eq!(codes(&response), vec![Code::Ok; 4]);
    let limit = response.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!((limit.requests_per_unit, limit.unit()), (2, rate_limit::Unit::Second));
    assert_eq!(response.statuses[0].limit_remaining, 1);
    assert!(response.statuses[1].current_limit.is_none());
    assert!(response.statuses[2].current_limit.is_none());
    assert_eq!(response.statuses[3].limit_remaining, 1);
    // A domain with no config limits nothing.
    let response = h.rls(one("elsewhere", &[("a", "1")])).await.unwrap();
    assert_eq!(response.overall_code(), Code::Ok);
    assert!(response.statuses[0].current_limit.is_none());
}

/// Row "overall_code": OVER_LIMIT if any status not in shadow mode is;
/// quota-mode descriptors only if all of them are.
#[tokio::test]
async fn overall_code_with_shadow_and_quota_modes() {
    let mut h = Harness::start(BASIC).await;
    for _ in 0..2 {
        h.rls(one("d", &[("a", "1")])).await.unwrap();
    }
    let over = h
        .rls(request("d", vec![descriptor(&[("a", "1")]), descriptor(&[("a", "2")])]))
        .await
        .unwrap();
    assert_eq!(over.overall_code(), Code::OverLimit);
    assert_eq!(codes(&over), vec![Code::OverLimit, Code::Ok]);

    // Shadow mode: counted, refused in the metrics only.
    assert_eq!(
        h.rls(one("d", &[("shadow", "s")])).await.unwrap().overall_code(),
        Code::Ok
    );
    let shadowed = h.rls(one("d", &[("shadow", "s")])).await.unwrap();
    assert_eq!((shadowed.overall_code(), codes(&shadowed)), (Code::Ok, vec![Code::Ok]));
    assert_eq!(
        h.metric("slidegate_shadow_mode_refusals_total{domain=\"d\"}").await,
        Some(1.0)
    );

    // Quota mode: one of two quota descriptors over is not enough.
    let both = || request("d", vec![descriptor(&[("q1", "x")]), descriptor(&[("q2", "x")])]);
    h.rls(one("d", &[("q1", "x")])).await.unwrap();
    let half = h.rls(both()).await.unwrap();
    assert_eq!(codes(&half), vec![Code::OverLimit, Code::Ok]);
    assert_eq!(half.overall_code(), Code::Ok);
    let all = h.rls(both()).await.unwrap();
    assert_eq!(codes(&all), vec![Code::OverLimit, Code::OverLimit]);
    assert_eq!(all.overall_code(), Code::OverLimit);
}

/// Row "`unlimited: true` rule": OK, limit_remaining = 4294967295.
#[tokio::test]
async fn unlimited_rules_answer_the_largest_remaining() {
    let mut h = Harness::start(BASIC).await;
    for _ in 0..5 {
        let response = h.rls(one("d", &[("free", "z")])).await.unwrap();
        assert_eq!(response.overall_code(), Code::Ok);
        assert_eq!(response.statuses[0].limit_remaining, u32::MAX);
        assert!(response.statuses[0].current_limit.is_none());
    }
}

/// Row "hits": a request's hits_addend 0 counts as 1; a descriptor's
/// hits_addend, when set, wins and may be 0 (a peek).
#[tokio::test]
async fn hits_addend_rules() {
    let mut h = Harness::start(
        "domain: h\ndescriptors:\n  - key: k\n    rate_limit: { unit: minute, requests_per_unit: 10 }\n",
    )
    .await;
    let mut r = one("h", &[("k", "v")]);
    assert_eq!(h.rls(r.clone()).await.unwrap().statuses[0].limit_remaining, 9);
    r.hits_addend = 3;
    assert_eq!(h.rls(r.clone()).await.unwrap().statuses[0].limit_remaining, 6);
    let mut peek = r.clone();
    peek.descriptors[0].hits_addend = Some(pbjson_types::UInt64Value { value: 0 });
    for _ in 0..3 {
        assert_eq!(h.rls(peek.clone()).await.unwrap().statuses[0].limit_remaining, 6);
    }
    let mut two = r.clone();
    two.descriptors[0].hits_addend = Some(pbjson_types::UInt64Value { value: 2 });
    assert_eq!(h.rls(two).await.unwrap().statuses[0].limit_remaining, 4);
    // More hits than remain: refused and not counted.
    r.hits_addend = 5;
    let refused = h.rls(r).await.unwrap();
    assert_eq!(
        (refused.overall_code(), refused.statuses[0].limit_remaining),
        (Code::OverLimit, 4)
    );
}

/// Row "descriptor `limit` override": replaces the configured limit.
#[tokio::test]
async fn a_limit_override_replaces_the_configured_limit() {
    let mut h = Harness::start(
        "domain: o\ndescriptors:\n  - key: k\n    rate_limit: { unit: second, requests_per_unit: 100 }\n",
    )
    .await;
    let mut r = one("o", &[("k", "v")]);
    r.descriptors[0].limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: 2, // MINUTE
    });
    let first = h.rls(r.clone()).await.unwrap();
    let limit = first.statuses[0].current_limit.clone().unwrap();
    assert_eq!((limit.requests_per_unit, limit.unit()), (1, rate_limit::Unit::Minute));
    assert_eq!(h.rls(r.clone()).await.unwrap().overall_code(), Code::OverLimit);
    // The configured limit, counted apart, is untouched.
    assert_eq!(
        h.rls(one("o", &[("k", "v")])).await.unwrap().statuses[0].limit_remaining,
        99
    );
    // An override with an unknown unit is invalid.
    r.descriptors[0].limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: 0,
    });
    assert_eq!(h.rls(r).await.unwrap_err().code(), tonic::Code::InvalidArgument);
}

/// Row "duration_until_reset": for a sliding window, until the next unit
/// frees.
#[tokio::test]
async fn duration_until_reset_is_when_quota_frees() {
    let mut h = Harness::start(BASIC).await;
    h.rls(one("d", &[("a", "t")])).await.unwrap();
    h.clock.advance(Duration::from_millis(300));
    h.rls(one("d", &[("a", "t")])).await.unwrap();
    h.clock.advance(Duration::from_millis(100));
    let refused = h.rls(one("d", &[("a", "t")])).await.unwrap();
    assert_eq!(refused.overall_code(), Code::OverLimit);
    let wait = refused.statuses[0].duration_until_reset.unwrap();
    // The first hit leaves the window 1 s after it came: 600 ms from now.
    assert_eq!((wait.seconds, wait.nanos), (0, 600_000_000));
    h.clock.advance(Duration::from_millis(600));
    assert_eq!(h.rls(one("d", &[("a", "t")])).await.unwrap().overall_code(), Code::Ok);
}

/// Row "empty domain or no descriptors": INVALID_ARGUMENT; and the input
/// limits, named in the message.
#[tokio::test]
async fn invalid_requests_are_invalid_argument() {
    let mut h = Harness::start_with(BASIC, |o| o.input.descriptors = 2).await;
    let empty_domain = h.rls(one("", &[("a", "1")])).await.unwrap_err();
    assert_eq!(empty_domain.code(), tonic::Code::InvalidArgument);
    assert!(empty_domain.message().contains("domain"), "{empty_domain:?}");
    let none = h.rls(request("d", vec![])).await.unwrap_err();
    assert_eq!(none.code(), tonic::Code::InvalidArgument);
    let many = h
        .rls(request("d", vec![descriptor(&[("a", "1")]); 3]))
        .await
        .unwrap_err();
    assert_eq!(many.code(), tonic::Code::InvalidArgument);
    assert!(many.message().contains("over the limit of 2"), "{many:?}");
    let long = "x".repeat(2000);
    let too_long = h.rls(one("d", &[("a", &long)])).await.unwrap_err();
    assert!(too_long.message().contains("1024 bytes"), "{too_long:?}");
    let no_entries = h.rls(request("d", vec![descriptor(&[])])).await.unwrap_err();
    assert_eq!(no_entries.code(), tonic::Code::InvalidArgument);
    assert_eq!(
        h.metric("slidegate_requests_total{api=\"grpc\",outcome=\"invalid\"}")
            .await,
        Some(5.0)
    );
}

/// Row "headers": RateLimit headers in response_headers_to_add, when on.
#[tokio::test]
async fn headers_in_the_grpc_answer_when_enabled() {
    let mut off = Harness::start(BASIC).await;
    assert!(
        off.rls(one("d", &[("a", "1")]))
            .await
            .unwrap()
            .response_headers_to_add
            .is_empty()
    );
    let mut on = Harness::start_with(BASIC, |o| o.grpc_headers = true).await;
    let response = on.rls(one("d", &[("a", "1")])).await.unwrap();
    let headers: Vec<(&str, &str)> = response
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.as_str(), h.value.as_str()))
        .collect();
    assert!(headers.contains(&("ratelimit-policy", "\"a\";q=2;w=1")), "{headers:?}");
    assert!(headers.contains(&("ratelimit", "\"a\";r=1;t=1")), "{headers:?}");
}

/// Unnamed limits are named in the headers after their rule's keys, as
/// envoyproxy/ratelimit's stat keys are (`key`, `key_value`, levels
/// joined by `.`), `#j` for the j-th of several; two rules whose paths
/// read alike (`a_b`, and `a` with value `b`) do not share a name, nor
/// does one that reads as another limit's `name`; request values never
/// show.
#[tokio::test]
async fn unnamed_limits_are_named_after_their_keys() {
    let h = Harness::start(
        "
domain: d
descriptors:
  - key: one
    rate_limit: { unit: second, requests_per_unit: 5 }
  - key: two
    rate_limits:
      - { unit: second, requests_per_unit: 3 }
      - { unit: minute, requests_per_unit: 7 }
  - key: a
    value: b
    rate_limit: { unit: second, requests_per_unit: 4 }
  - key: a_b
    rate_limit: { unit: second, requests_per_unit: 6 }
  - key: path
    value: /files/*
    descriptors:
      - key: method
        rate_limit: { unit: hour, requests_per_unit: 9 }
  - key: named
    rate_limit: { name: ip, unit: second, requests_per_unit: 8 }
  - key: ip
    rate_limit: { unit: second, requests_per_unit: 2 }
",
    )
    .await;
    let policy = |descriptors: &str| {
        let body = format!(r#"{{"domain":"d","descriptors":[{descriptors}]}}"#);
        let h = &h;
        async move {
            let (status, headers, text) = h.post("/json", &body).await;
            assert_eq!(status, StatusCode::OK, "{text}");
            headers["ratelimit-policy"].to_str().unwrap().to_owned()
        }
    };
    let one = r#"{"entries":[{"key":"one","value":"x"}]}"#;
    let two = r#"{"entries":[{"key":"two","value":"y"}]}"#;
    assert_eq!(
        policy(&format!("{one},{two}")).await,
        "\"one\";q=5;w=1, \"two#0\";q=3;w=1, \"two#1\";q=7;w=60"
    );
    let a_b = r#"{"entries":[{"key":"a","value":"b"}]},{"entries":[{"key":"a_b","value":"secret"}]}"#;
    assert_eq!(policy(a_b).await, "\"a_b\";q=4;w=1, \"a_b#2\";q=6;w=1");
    let nested = r#"{"entries":[{"key":"path","value":"/files/x"},{"key":"method","value":"GET"}]}"#;
    assert_eq!(policy(nested).await, "\"path_/files/*.method\";q=9;w=3600");
    let named = r#"{"entries":[{"key":"named","value":"v"}]},{"entries":[{"key":"ip","value":"10.0.0.1"}]}"#;
    assert_eq!(policy(named).await, "\"ip\";q=8;w=1, \"ip#2\";q=2;w=1");
}

/// `POST /json` as envoyproxy/ratelimit serves it.
#[tokio::test]
async fn post_json_speaks_proto3_json() {
    let h = Harness::start(BASIC).await;
    let body = r#"{"domain":"d","descriptors":[{"entries":[{"key":"a","value":"j"}]}],"hitsAddend":2}"#;
    let (status, headers, text) = h.post("/json", body).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let answer: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(answer["overallCode"], "OK");
    assert_eq!(answer["statuses"][0]["currentLimit"]["requestsPerUnit"], 2);
    assert_eq!(answer["statuses"][0]["currentLimit"]["unit"], "SECOND");
    assert_eq!(headers["ratelimit"], "\"a\";r=0;t=1");
    let (status, headers, text) = h.post("/json", body).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    let answer: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(answer["overallCode"], "OVER_LIMIT");
    assert_eq!(answer["statuses"][0]["code"], "OVER_LIMIT");
    assert_eq!(headers["retry-after"], "1");
    // Not a RateLimitRequest: 400 naming the problem.
    let (status, _, text) = h
        .post("/json", r#"{"domain":"d","descriptors":[{"entries":[{"kee":"a"}]}]}"#)
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(text.contains("kee"), "{text}");
}

/// `POST /v1/check` with an ad-hoc key: decision, headers, peek and reset.
#[tokio::test]
async fn ad_hoc_checks_peeks_and_resets() {
    let h = Harness::start("").await;
    let check =
        |cost: u64| format!(r#"{{"key":"user-1","limit":2,"window":"10s","algorithm":"sliding_log","cost":{cost}}}"#);
    let (status, headers, text) = h.post("/v1/check", &check(1)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let d: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!((d["allowed"].as_bool(), d["remaining"].as_u64()), (Some(true), Some(1)));
    assert_eq!(headers["ratelimit-policy"], "\"key\";q=2;w=10");
    assert_eq!(headers["ratelimit"], "\"key\";r=1;t=10");
    h.clock.advance(Duration::from_millis(2_500));
    h.post("/v1/check", &check(1)).await;
    // A peek changes nothing.
    for _ in 0..2 {
        let (status, _, text) = h.post("/v1/check", &check(0)).await;
        assert_eq!(status, StatusCode::OK);
        assert!(text.contains("\"remaining\":0"), "{text}");
    }
    let (status, headers, text) = h.post("/v1/check", &check(1)).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert!(text.contains("\"retry_after_ms\":7500"), "{text}");
    assert_eq!(headers["retry-after"], "8");
    // Reset, then the key is fresh.
    let reset = r#"{"key":"user-1","limit":2,"window":"10s","algorithm":"sliding_log"}"#;
    let (status, _, text) = h.reset(reset).await;
    assert_eq!((status, text.as_str()), (StatusCode::OK, r#"{"reset":1}"#));
    assert_eq!(h.post("/v1/check", &check(1)).await.0, StatusCode::OK);
}

/// `POST /v1/check` with an ad-hoc key: `burst` and `epsilon` reach the
/// algorithm, and go only with their own.
#[tokio::test]
async fn ad_hoc_checks_take_burst_and_epsilon() {
    let h = Harness::start("").await;
    let allowed = |text: &str| serde_json::from_str::<serde_json::Value>(text).unwrap()["allowed"].as_bool();
    // gcra bursts the whole limit by default; with `burst: 1`, one at once.
    for (key, burst, second) in [("wide", "", Some(true)), ("narrow", r#","burst":1"#, Some(false))] {
        let body = format!(r#"{{"key":"{key}","limit":10,"window":"10s","algorithm":"gcra"{burst}}}"#);
        let (status, _, text) = h.post("/v1/check", &body).await;
        assert_eq!((status, allowed(&text)), (StatusCode::OK, Some(true)), "{body}: {text}");
        let (_, _, text) = h.post("/v1/check", &body).await;
        assert_eq!(allowed(&text), second, "{body}: {text}");
    }
    let body = r#"{"key":"e","limit":10,"window":"10s","algorithm":"exponential_histogram","epsilon":0.1}"#;
    let (status, _, text) = h.post("/v1/check", body).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    for (body, needle) in [
        (
            r#"{"key":"k","limit":1,"window":"1s","burst":2}"#,
            "`burst` applies only to algorithm gcra, not sliding_window",
        ),
        (
            r#"{"key":"k","limit":1,"window":"1s","algorithm":"gcra","epsilon":0.1}"#,
            "`epsilon` applies only to algorithm exponential_histogram, not gcra",
        ),
        (
            r#"{"key":"k","limit":1,"window":"1s","algorithm":"gcra","burst":0}"#,
            "invalid burst `0`",
        ),
        (
            r#"{"key":"k","limit":1,"window":"1s","algorithm":"exponential_histogram","epsilon":2}"#,
            "invalid epsilon `2`",
        ),
        (
            r#"{"key":"k","limit":1,"window":"1s","algorithm":"gcra","burst":"many"}"#,
            "burst",
        ),
        (r#"{"domain":"d","burst":2}"#, "not the ad-hoc"),
    ] {
        let (status, _, text) = h.post("/v1/check", body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {text}");
        assert!(text.contains(needle), "{body}: {text}");
    }
}

/// `POST /v1/check` with descriptors of a configured domain.
#[tokio::test]
async fn descriptor_checks_answer_slidegate_json() {
    let h = Harness::start(BASIC).await;
    let body = r#"{"domain":"d","descriptors":[{"entries":[{"key":"a","value":"c"}]}],"hits_addend":2}"#;
    let (status, headers, text) = h.post("/v1/check", body).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let d: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(d["allowed"], true);
    assert_eq!(d["statuses"][0]["limits"][0]["algorithm"], "sliding_log");
    assert_eq!(d["statuses"][0]["limits"][0]["remaining"], 0);
    assert_eq!(headers["ratelimit"], "\"a\";r=0;t=1");
    assert_eq!(h.post("/v1/check", body).await.0, StatusCode::TOO_MANY_REQUESTS);
    let (status, _, text) = h
        .reset(r#"{"domain":"d","descriptors":[{"entries":[{"key":"a","value":"c"}]}]}"#)
        .await;
    assert_eq!((status, text.as_str()), (StatusCode::OK, r#"{"reset":1}"#));
    assert_eq!(h.post("/v1/check", body).await.0, StatusCode::OK);
}

/// Bad HTTP input: a clear 400 or 413, never a panic.
#[tokio::test]
async fn bad_http_input_is_refused_with_the_reason() {
    let h = Harness::start_with("", |o| o.body_limit = 256).await;
    let (status, headers, text) = h
        .post("/v1/check", &format!(r#"{{"key":"{}"}}"#, "k".repeat(300)))
        .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(headers["content-type"], "application/problem+json");
    assert!(text.contains("limit of 256 bytes"), "{text}");
    for (body, needle) in [
        ("{", "not JSON"),
        (r#"{"key":"k","limit":1,"window":"1s","colour":"red"}"#, "colour"),
        (r#"{"key":"k","limit":0,"window":"1s"}"#, "limit"),
        (r#"{"key":"k","limit":1,"window":"soon"}"#, "window"),
        (r#"{"key":"k","limit":1,"window":"1s","algorithm":"magic"}"#, "magic"),
        (
            r#"{"key":"k","limit":1,"window":"1s","algorithm":"gcra","buckets":4}"#,
            "buckets",
        ),
        (r#"{"key":"k","limit":-1,"window":"1s"}"#, "limit"),
        (r#"[1,2]"#, "JSON object"),
        (r#"{"key":"k","limit":1}"#, "`window` is missing"),
        (r#"{"domain":"d","key":"k"}"#, "not the ad-hoc"),
    ] {
        let (status, _, text) = h.post("/v1/check", body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {text}");
        assert!(text.contains(needle), "{body}: {text}");
    }
    let (status, _, _) = h
        .post(
            "/v1/check",
            &format!(r#"{{"key":"{}","limit":1,"window":"1s"}}"#, "k".repeat(200)),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
}

/// The example of the YAML reference behaves as its comments say.
#[tokio::test]
async fn the_reference_example_behaves_as_documented() {
    let example = "
domain: edge_proxy
descriptors:
  - key: remote_address               # 10 per second per client address
    rate_limit: { unit: second, requests_per_unit: 10 }
  - key: remote_address               # one address blocked
    value: 50.0.0.5
    rate_limit: { unit: second, requests_per_unit: 0 }
  - key: message_type                 # nested: 5 marketing messages a day per number
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: { unit: day, requests_per_unit: 5 }
  - key: path                         # one shared counter for a wildcard
    value: /files/*
    share_threshold: true
    rate_limit: { unit: hour, requests_per_unit: 100 }
  - key: category
    value: account
    rate_limit: { name: account_default, unit: minute, requests_per_unit: 4 }
  - key: client
    value: vip
    rate_limit:
      replaces: [ { name: account_default } ]
      unit: minute
      requests_per_unit: 40
  - key: ldap
    rate_limit: { unlimited: true }
";
    let mut h = Harness::start(example).await;
    let mut rls = async |entries: &[(&str, &str)]| h.rls(one("edge_proxy", entries)).await.unwrap();
    // 10 per second per address, counted apart.
    for i in 0..10 {
        assert_eq!(
            rls(&[("remote_address", "10.0.0.1")]).await.statuses[0].limit_remaining,
            9 - i
        );
    }
    assert_eq!(
        rls(&[("remote_address", "10.0.0.1")]).await.overall_code(),
        Code::OverLimit
    );
    assert_eq!(rls(&[("remote_address", "10.0.0.2")]).await.overall_code(), Code::Ok);
    // The blocked address.
    assert_eq!(
        rls(&[("remote_address", "50.0.0.5")]).await.overall_code(),
        Code::OverLimit
    );
    // 5 marketing messages a day per number.
    for _ in 0..5 {
        assert_eq!(
            rls(&[("message_type", "marketing"), ("to_number", "111")])
                .await
                .overall_code(),
            Code::Ok
        );
    }
    let sixth = rls(&[("message_type", "marketing"), ("to_number", "111")]).await;
    assert_eq!(sixth.overall_code(), Code::OverLimit);
    assert_eq!(
        sixth.statuses[0].current_limit.as_ref().unwrap().unit(),
        rate_limit::Unit::Day
    );
    assert_eq!(
        rls(&[("message_type", "marketing"), ("to_number", "222")])
            .await
            .overall_code(),
        Code::Ok
    );
    // One counter for every path under /files/.
    assert_eq!(rls(&[("path", "/files/a")]).await.statuses[0].limit_remaining, 99);
    assert_eq!(rls(&[("path", "/files/b")]).await.statuses[0].limit_remaining, 98);
    assert!(rls(&[("path", "/other")]).await.statuses[0].current_limit.is_none());
    // 4 a minute per account; vip replaces it with 40 when both match.
    let account = || descriptor(&[("category", "account")]);
    let vip = || descriptor(&[("client", "vip")]);
    for _ in 0..4 {
        h.rls(request("edge_proxy", vec![account()])).await.unwrap();
    }
    assert_eq!(
        h.rls(request("edge_proxy", vec![account()]))
            .await
            .unwrap()
            .overall_code(),
        Code::OverLimit
    );
    let both = h.rls(request("edge_proxy", vec![account(), vip()])).await.unwrap();
    assert_eq!(both.overall_code(), Code::Ok);
    assert!(both.statuses[0].current_limit.is_none());
    assert_eq!(both.statuses[1].current_limit.as_ref().unwrap().requests_per_unit, 40);
    // ldap is unlimited.
    let ldap = h.rls(one("edge_proxy", &[("ldap", "cn=x")])).await.unwrap();
    assert_eq!(ldap.statuses[0].limit_remaining, u32::MAX);
}

/// A good new config replaces the old one without resetting the limits
/// that did not change or changed only their `requests_per_unit`; a bad one is refused and the old one keeps
/// serving; both are counted.
#[tokio::test]
async fn reload_good_and_bad_files() {
    let first = "domain: r\ndescriptors:\n  - key: keep\n    rate_limit: { unit: minute, requests_per_unit: 5 }\n  - key: change\n    rate_limit: { unit: minute, requests_per_unit: 5 }\n";
    let mut h = Harness::start(first).await;
    for _ in 0..3 {
        h.rls(request(
            "r",
            vec![descriptor(&[("keep", "x")]), descriptor(&[("change", "x")])],
        ))
        .await
        .unwrap();
    }
    let second = "domain: r\ndescriptors:\n  - key: keep\n    rate_limit: { unit: minute, requests_per_unit: 5 }\n  - key: change\n    rate_limit: { unit: minute, requests_per_unit: 50 }\n  - key: new\n    rate_limit: { unit: minute, requests_per_unit: 1 }\n";
    h.dir.write("domain.yaml", second);
    h.running.reloader().reload().unwrap();
    let after = h
        .rls(request(
            "r",
            vec![
                descriptor(&[("keep", "x")]),
                descriptor(&[("change", "x")]),
                descriptor(&[("new", "x")]),
            ],
        ))
        .await
        .unwrap();
    // `keep` went on counting (5 − 4); so did `change`, under its new
    // limit (50 − 4), as envoyproxy/ratelimit's counters do.
    let remaining: Vec<u32> = after.statuses.iter().map(|s| s.limit_remaining).collect();
    assert_eq!(remaining, vec![1, 46, 0]);

    h.dir.write(
        "domain.yaml",
        "domain: r\ndescriptors:\n  - key: keep\n    rate_limit: { unit: fortnight, requests_per_unit: 5 }\n",
    );
    let error = h.running.reloader().reload().unwrap_err();
    assert_eq!((error.line, error.column), (4, 25), "{error}");
    // The old config still serves.
    let still = h.rls(one("r", &[("new", "y")])).await.unwrap();
    assert_eq!(still.statuses[0].current_limit.as_ref().unwrap().requests_per_unit, 1);
    assert_eq!(
        h.metric("slidegate_config_reloads_total{result=\"success\"}").await,
        Some(1.0)
    );
    assert_eq!(
        h.metric("slidegate_config_reloads_total{result=\"failure\"}").await,
        Some(1.0)
    );
    // What an alert reads: 0 while the file on disk is not what serves,
    // 1 again once a reload works.
    assert_eq!(h.metric("slidegate_config_last_reload_successful").await, Some(0.0));
    h.dir.write(
        "domain.yaml",
        "domain: r\ndescriptors:\n  - key: keep\n    rate_limit: { unit: minute, requests_per_unit: 5 }\n",
    );
    h.running.reloader().reload().unwrap();
    assert_eq!(h.metric("slidegate_config_last_reload_successful").await, Some(1.0));
}

/// The watcher notices a changed file by itself.
#[tokio::test]
async fn the_watcher_reloads_a_changed_file() {
    let yaml = "domain: w\ndescriptors:\n  - key: k\n    rate_limit: { unit: minute, requests_per_unit: 5 }\n";
    let mut h = Harness::start_with(yaml, |o| o.reload_every = Some(Duration::from_millis(20))).await;
    assert_eq!(
        h.rls(one("w", &[("k", "v")])).await.unwrap().statuses[0].limit_remaining,
        4
    );
    h.dir.write("domain.yaml", &yaml.replace("5 }", "500 }"));
    // Wait for the reload itself (bounded), not for a fixed time.
    let mut reloads = h.running.reloader().reloads();
    let reloaded = tokio::time::timeout(Duration::from_secs(10), reloads.wait_for(|&n| n >= 1)).await;
    assert!(reloaded.is_ok(), "the watcher did not reload within 10 s");
    assert_eq!(
        h.metric("slidegate_config_reloads_total{result=\"success\"}").await,
        Some(1.0)
    );
    // The new limit, with the count so far (2 of 500).
    assert_eq!(
        h.rls(one("w", &[("k", "v")])).await.unwrap().statuses[0].limit_remaining,
        498
    );
}

/// A config error at start names the file, line and column.
#[tokio::test]
async fn a_bad_config_does_not_start() {
    let dir = TempDir::new("server");
    let path = dir.write("bad.yaml", "domain: b\ndescriptors:\n  - key: k\n    rate_limits: 7\n");
    let options = Options {
        config: vec![path],
        http: "127.0.0.1:0".parse().unwrap(),
        grpc: "127.0.0.1:0".parse().unwrap(),
        ..Options::default()
    };
    let error = server::start(options, ManualClock::new(0))
        .await
        .err()
        .expect("a config error");
    let text = error.to_string();
    assert!(text.contains("bad.yaml:4:"), "{text}");
    assert!(text.contains("rate_limits"), "{text}");
}

/// `GET /healthz` and `GET /metrics`.
#[tokio::test]
async fn health_and_metrics() {
    let mut h = Harness::start(BASIC).await;
    assert_eq!(h.get("/healthz").await, (StatusCode::OK, "OK\n".to_owned()));
    h.rls(one("d", &[("a", "m")])).await.unwrap();
    h.rls(one("nowhere", &[("a", "m")])).await.unwrap();
    let (status, text) = h.get("/metrics").await;
    assert_eq!(status, StatusCode::OK);
    for line in [
        "slidegate_requests_total{api=\"grpc\",outcome=\"ok\"} 2",
        "slidegate_descriptor_decisions_total{domain=\"d\",outcome=\"ok\"} 1",
        "slidegate_descriptor_decisions_total{domain=\"unknown\",outcome=\"ok\"} 1",
        "slidegate_keys 1",
        "slidegate_rule_decisions_total{domain=\"d\",rule=\"a\",outcome=\"ok\"} 1",
        "slidegate_decision_seconds_count 2",
        "slidegate_evictions_total 0",
        "slidegate_store_errors_total 0",
    ] {
        assert!(text.contains(line), "{line} not in\n{text}");
    }
}

/// Shutdown stops accepting and finishes the request in flight.
#[tokio::test]
async fn shutdown_finishes_requests_in_flight() {
    finishes_in_flight(Harness::start("").await).await;
}

/// On worker threads (`Options::workers`), each connection served by one
/// of them: gRPC and HTTP answer from one count whichever worker a
/// connection landed on, and shutdown still finishes the request in
/// flight before the workers stop.
#[tokio::test]
async fn workers_share_one_count_and_finish_requests_in_flight() {
    let mut h = Harness::start_with(BASIC, |o| o.workers = 2).await;
    // Key `a` allows 2 a second: one gRPC call, then HTTP on new
    // connections (each to the next worker), then gRPC again.
    assert_eq!(codes(&h.rls(one("d", &[("a", "x")])).await.unwrap()), [Code::Ok]);
    let body = r#"{"domain":"d","descriptors":[{"entries":[{"key":"a","value":"x"}]}]}"#;
    let (status, _, text) = h.post("/json", body).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(text.contains("\"overallCode\":\"OK\""), "{text}");
    let (_, _, text) = h.post("/json", body).await;
    assert!(text.contains("\"overallCode\":\"OVER_LIMIT\""), "{text}");
    assert_eq!(codes(&h.rls(one("d", &[("a", "x")])).await.unwrap()), [Code::OverLimit]);
    finishes_in_flight(Harness::start_with("", |o| o.workers = 2).await).await;
}

async fn finishes_in_flight(h: Harness) {
    let addr = h.http_addr();
    // A request whose body is still on its way.
    let body = r#"{"key":"k","limit":5,"window":"1m"}"#;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /v1/check HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(&body.as_bytes()[..10]).await.unwrap();
    // Wait until the server is reading it (bounded): one in flight besides
    // the /metrics request asking.
    let mut reading = false;
    for _ in 0..5_000 {
        if h.metric("slidegate_http_requests_in_flight").await == Some(2.0) {
            reading = true;
            break;
        }
    }
    assert!(reading, "the server never started reading the request");
    let shutdown = tokio::spawn(h.running.shutdown());
    // New connections are refused once the listener is closed (bounded wait).
    let mut refused = false;
    for _ in 0..100_000 {
        if TcpStream::connect(addr).await.is_err() {
            refused = true;
            break;
        }
        tokio::task::yield_now().await;
    }
    assert!(refused, "still accepting after shutdown");
    stream.write_all(&body.as_bytes()[10..]).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    assert!(answer.contains("\"remaining\":4"), "{answer}");
    tokio::time::timeout(Duration::from_secs(10), shutdown)
        .await
        .unwrap()
        .unwrap();
}

/// `POST /v1/reset` is off without an admin token (404, saying how to turn
/// it on); with one, it needs `Authorization: Bearer <token>`: 401 without
/// it, 403 with another; every refusal is a problem document and resets
/// nothing.
#[tokio::test]
async fn reset_needs_the_admin_token() {
    let body = r#"{"key":"k","limit":1,"window":"1m"}"#;
    let off = Harness::start_with("", |o| o.admin_token = None).await;
    assert_eq!(off.post("/v1/check", body).await.0, StatusCode::OK);
    let (status, headers, text) = off.reset(body).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(headers["content-type"], "application/problem+json");
    assert!(
        text.contains("--admin-token") && text.contains("SLIDEGATE_ADMIN_TOKEN"),
        "{text}"
    );
    assert_eq!(off.post("/v1/check", body).await.0, StatusCode::TOO_MANY_REQUESTS);

    let on = Harness::start("").await;
    assert_eq!(on.post("/v1/check", body).await.0, StatusCode::OK);
    let (status, headers, text) = on.post("/v1/reset", body).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{text}");
    assert_eq!(headers["www-authenticate"], "Bearer");
    assert_eq!(headers["content-type"], "application/problem+json");
    assert!(text.contains("Authorization: Bearer"), "{text}");
    for wrong in [
        "Bearer test-admin-tokeN",
        "Bearer test-admin-token-and-more",
        "Bearer ",
        "Basic dGVzdC1hZG1pbi10b2tlbg==",
    ] {
        let (status, _, text) = http_post_with(on.http_addr(), "/v1/reset", body, &[("authorization", wrong)]).await;
        assert!(
            status == StatusCode::FORBIDDEN || status == StatusCode::UNAUTHORIZED,
            "{wrong}: {status} {text}"
        );
        assert!(!text.contains(ADMIN), "{text}");
    }
    assert_eq!(on.post("/v1/check", body).await.0, StatusCode::TOO_MANY_REQUESTS);
    // The scheme is case-insensitive.
    let lower = format!("bearer {ADMIN}");
    let (status, _, text) = http_post_with(on.http_addr(), "/v1/reset", body, &[("authorization", &lower)]).await;
    assert_eq!((status, text.as_str()), (StatusCode::OK, r#"{"reset":1}"#));
    assert_eq!(on.post("/v1/check", body).await.0, StatusCode::OK);

    let empty = server::start(
        Options {
            admin_token: Some("  ".to_owned()),
            http: "127.0.0.1:0".parse().unwrap(),
            grpc: "127.0.0.1:0".parse().unwrap(),
            ..Options::default()
        },
        ManualClock::new(0),
    )
    .await;
    assert!(empty.err().unwrap().to_string().contains("admin token is empty"));
}

/// What a test's tracing subscriber writes, kept for it to read.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// The lines written so far.
    fn lines(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

/// Refused admin tokens are counted by reason
/// (`slidegate_admin_auth_failures_total`, 0 before the first) and logged
/// at warn once for a burst, saying how many: never the token, the body
/// or the client's address. The log is this test's thread's (the server
/// runs on the test's runtime); the burst is well within the 10 s between
/// two lines, which `log_limit`'s tests check on a manual clock.
#[tokio::test]
async fn refused_admin_tokens_are_counted_and_logged_once_a_burst() {
    let log = Captured::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    // With one dispatcher alive, tracing caches a callsite's interest as
    // the first thread to reach it sees it (another test's, without a
    // subscriber: never). A second one, alive throughout, makes every
    // callsite ask each thread's own.
    let _second = tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default());
    let _log = tracing::subscriber::set_default(subscriber);
    let h = Harness::start("").await;
    let missing = "slidegate_admin_auth_failures_total{reason=\"missing\"}";
    let wrong = "slidegate_admin_auth_failures_total{reason=\"wrong\"}";
    assert_eq!((h.metric(missing).await, h.metric(wrong).await), (Some(0.0), Some(0.0)));
    let body = r#"{"key":"needle-4b1d","limit":1,"window":"1m"}"#;
    for _ in 0..7 {
        assert_eq!(h.post("/v1/reset", body).await.0, StatusCode::UNAUTHORIZED);
    }
    for wrong in ["Bearer guess-9c2e", "Bearer ", "Basic Z3Vlc3M="] {
        http_post_with(h.http_addr(), "/v1/reset", body, &[("authorization", wrong)]).await;
    }
    for _ in 0..5 {
        let (status, _, _) = http_post_with(
            h.http_addr(),
            "/v1/reset",
            body,
            &[("authorization", "Bearer guess-9c2e")],
        )
        .await;
        assert_eq!(status, StatusCode::FORBIDDEN);
    }
    // `Bearer ` and `Basic` carry no bearer token: missing.
    assert_eq!((h.metric(missing).await, h.metric(wrong).await), (Some(9.0), Some(6.0)));
    // The right token is no failure.
    let (status, _, _) = http_post_with(
        h.http_addr(),
        "/v1/reset",
        body,
        &[("authorization", &format!("Bearer {ADMIN}"))],
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(h.metric(wrong).await, Some(6.0));
    let lines = log.lines();
    // The server's own lines are there: the log is this test's.
    assert!(lines.iter().any(|l| l.contains("serving")), "{lines:#?}");
    let refused: Vec<&String> = lines.iter().filter(|l| l.contains("POST /v1/reset refused")).collect();
    assert_eq!(refused.len(), 1, "{lines:#?}");
    assert!(
        refused[0].contains("WARN") && refused[0].contains("refused=1"),
        "{refused:?}"
    );
    for secret in ["guess-9c2e", "Z3Vlc3M", "needle-4b1d", ADMIN] {
        assert!(
            !lines.iter().any(|l| l.contains(secret)),
            "{secret} in the log: {lines:#?}"
        );
    }
}

/// Oversized input over HTTP, each refused with the limit named: a key or
/// value over `max_text` and too many descriptors or entries are 400, a body
/// over the limit 413.
#[tokio::test]
async fn oversized_http_input_names_the_limit() {
    let h = Harness::start(BASIC).await;
    let long = "k".repeat(1025);
    let cases = [
        (
            "/v1/check".to_owned(),
            format!(r#"{{"key":"{long}","limit":1,"window":"1s"}}"#),
            "over the limit of 1024 bytes",
        ),
        (
            "/v1/check".to_owned(),
            format!(r#"{{"domain":"d","descriptors":[{{"entries":[{{"key":"a","value":"{long}"}}]}}]}}"#),
            "over the limit of 1024 bytes",
        ),
        (
            "/json".to_owned(),
            format!(
                r#"{{"domain":"d","descriptors":[{}]}}"#,
                vec![r#"{"entries":[{"key":"a","value":"1"}]}"#; 65].join(",")
            ),
            "65 descriptors, over the limit of 64",
        ),
        (
            "/v1/check".to_owned(),
            format!(
                r#"{{"domain":"d","descriptors":[{{"entries":[{}]}}]}}"#,
                vec![r#"{"key":"a","value":"1"}"#; 17].join(",")
            ),
            "17 entries, over the limit of 16",
        ),
    ];
    for (path, body, needle) in cases {
        let (status, headers, text) = h.post(&path, &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {text}");
        assert_eq!(headers["content-type"], "application/problem+json");
        assert!(text.contains(needle), "{path}: {text}");
    }
    let (status, _, text) = h.post("/json", &"x".repeat(65 * 1024)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(text.contains("limit of 65536 bytes"), "{text}");
}

/// Oversized input over gRPC: too many descriptors or entries and a long
/// value are `INVALID_ARGUMENT` naming the limit; a message over the body
/// limit is refused by tonic with `OUT_OF_RANGE` before it is decoded. The
/// service answers on after each.
#[tokio::test]
async fn oversized_grpc_requests_are_refused() {
    let mut h = Harness::start(BASIC).await;
    let many = h
        .rls(request("d", vec![descriptor(&[("a", "1")]); 65]))
        .await
        .unwrap_err();
    assert_eq!(many.code(), tonic::Code::InvalidArgument);
    assert!(many.message().contains("over the limit of 64"), "{many:?}");
    let wide = vec![("a", "1"); 17];
    let wide = h.rls(one("d", &wide)).await.unwrap_err();
    assert_eq!(wide.code(), tonic::Code::InvalidArgument);
    assert!(wide.message().contains("over the limit of 16"), "{wide:?}");
    let long = "v".repeat(1025);
    let long = h.rls(one("d", &[("a", &long)])).await.unwrap_err();
    assert_eq!(long.code(), tonic::Code::InvalidArgument);
    assert!(long.message().contains("over the limit of 1024 bytes"), "{long:?}");
    let huge = "v".repeat(70_000);
    let huge = h.rls(one("d", &[("a", &huge)])).await.unwrap_err();
    assert_eq!(huge.code(), tonic::Code::OutOfRange, "{huge:?}");
    assert!(huge.message().contains("65536"), "{huge:?}");
    assert_eq!(h.rls(one("d", &[("a", "1")])).await.unwrap().overall_code(), Code::Ok);
}

/// Short timeouts for the connection tests: headers (and the HTTP/2
/// preface) within 200 ms, a body within 300 ms, no byte for 1 s closes.
fn short_timeouts(options: &mut Options) {
    options.timeouts = Timeouts {
        header: Duration::from_millis(200),
        idle: Duration::from_secs(1),
        request: Duration::from_millis(300),
    };
}

/// Reads until the server closes the connection (EOF or an error), for at
/// most `deadline`: what it sent, or `None` if the connection is still open.
async fn read_until_closed(stream: &mut TcpStream, deadline: Duration) -> Option<Vec<u8>> {
    let until = tokio::time::Instant::now() + deadline;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at(until, stream.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0) | Err(_)) => return Some(got),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// HTTP/1.1: a connection that sends nothing is closed after the header
/// timeout; so is one sending its headers a byte at a time (slowloris), and
/// a kept-alive connection left idle after an answer; a body that does not
/// arrive in time is answered 408. A client that keeps talking keeps its
/// connection past every timeout.
#[tokio::test]
async fn silent_and_slow_http_connections_are_closed() {
    let h = Harness::start_with("", short_timeouts).await;
    let addr = h.http_addr();
    let bound = Duration::from_secs(5);

    let opened = tokio::time::Instant::now();
    let mut silent = TcpStream::connect(addr).await.unwrap();
    assert!(
        read_until_closed(&mut silent, bound).await.is_some(),
        "a silent connection stays open"
    );
    assert!(
        opened.elapsed() >= Duration::from_millis(150),
        "closed before the timeout"
    );

    let mut slowloris = TcpStream::connect(addr).await.unwrap();
    slowloris
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-slow: ")
        .await
        .unwrap();
    let until = tokio::time::Instant::now() + bound;
    let mut buf = [0u8; 1024];
    let closed = loop {
        assert!(tokio::time::Instant::now() < until, "a slowloris connection stays open");
        if slowloris.write_all(b"a").await.is_err() {
            break true;
        }
        // Waits on the socket, 20 ms at most, between two bytes.
        if let Ok(Ok(0) | Err(_)) = tokio::time::timeout(Duration::from_millis(20), slowloris.read(&mut buf)).await {
            break true;
        }
    };
    assert!(closed);

    let mut idle = TcpStream::connect(addr).await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let answer = read_until_closed(&mut idle, bound)
        .await
        .expect("an idle connection stays open");
    assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 200 OK"));

    let mut slow_body = TcpStream::connect(addr).await.unwrap();
    slow_body
        .write_all(b"POST /v1/check HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"key\"")
        .await
        .unwrap();
    let answer = read_until_closed(&mut slow_body, bound)
        .await
        .expect("a slow body stays open");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("application/problem+json"), "{answer}");

    // Requests back to back on one connection, for longer than every
    // timeout: all answered.
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let start = tokio::time::Instant::now();
    let mut answered = 0;
    while start.elapsed() < Duration::from_millis(1_500) {
        let request = Request::get("/healthz")
            .header("host", "localhost")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let response = sender.send_request(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        response.into_body().collect().await.unwrap();
        answered += 1;
    }
    assert!(answered > 1);
}

/// gRPC: a connection that sends nothing, or only part of the HTTP/2
/// preface, is closed after the header timeout; so is one that opens HTTP/2
/// and starts no call (with a `GOAWAY`), even while it trickles `PING`s.
#[tokio::test]
async fn silent_and_idle_grpc_connections_are_closed() {
    let mut h = Harness::start_with(BASIC, short_timeouts).await;
    assert_eq!(h.rls(one("d", &[("a", "1")])).await.unwrap().overall_code(), Code::Ok);
    let addr = h.running.grpc_addr().unwrap();
    let bound = Duration::from_secs(5);
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

    let mut silent = TcpStream::connect(addr).await.unwrap();
    assert!(
        read_until_closed(&mut silent, bound).await.is_some(),
        "a silent connection stays open"
    );

    let mut partial = TcpStream::connect(addr).await.unwrap();
    partial.write_all(&PREFACE[..10]).await.unwrap();
    assert!(
        read_until_closed(&mut partial, bound).await.is_some(),
        "a partial preface stays open"
    );

    let opened = tokio::time::Instant::now();
    let mut idle = TcpStream::connect(addr).await.unwrap();
    idle.write_all(PREFACE).await.unwrap();
    // An empty SETTINGS frame.
    idle.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await.unwrap();
    let sent = read_until_closed(&mut idle, bound)
        .await
        .expect("an idle connection stays open");
    assert!(!sent.is_empty(), "the server never answered the preface");
    assert!(frame_types(&sent).contains(&GOAWAY), "closed without a GOAWAY");
    assert!(
        opened.elapsed() >= Duration::from_millis(150),
        "closed before the header timeout"
    );

    // PINGs every 50 ms, and no call: bytes alone do not keep it.
    let mut pinging = TcpStream::connect(addr).await.unwrap();
    pinging.write_all(PREFACE).await.unwrap();
    pinging.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await.unwrap();
    let until = tokio::time::Instant::now() + bound;
    let mut buf = [0u8; 4096];
    loop {
        assert!(tokio::time::Instant::now() < until, "a pinging connection stays open");
        let ping = [0, 0, 8, 6, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
        if pinging.write_all(&ping).await.is_err() {
            break;
        }
        if let Ok(Ok(0) | Err(_)) = tokio::time::timeout(Duration::from_millis(50), pinging.read(&mut buf)).await {
            break;
        }
    }
}

/// The frame type of a `GOAWAY`.
const GOAWAY: u8 = 7;

/// The types of the whole HTTP/2 frames in `bytes` (a server's, from the
/// start of a connection).
fn frame_types(bytes: &[u8]) -> Vec<u8> {
    let mut types = Vec::new();
    let mut rest = bytes;
    while rest.len() >= 9 {
        let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
        types.push(rest[3]);
        rest = &rest[(9 + len).min(rest.len())..];
    }
    types
}

/// A gRPC client on a fresh connection to `h`'s server that calls any
/// path.
async fn generic_client(h: &Harness) -> tonic::client::Grpc<tonic::transport::Channel> {
    let channel = h.channel().await;
    tonic::client::Grpc::new(channel)
}

/// `RateLimitService`'s messages, as a generic client sends and reads them.
fn rls_codec() -> tonic_prost::ProstCodec<
    slidegate_server::proto::rls::RateLimitRequest,
    slidegate_server::proto::rls::RateLimitResponse,
> {
    tonic_prost::ProstCodec::default()
}

/// A `ShouldRateLimit` call on a fresh connection whose message never
/// comes (a client stream that stays open), with `grpc-timeout` if given:
/// the status the server ends it with. The test fails, rather than hangs,
/// if none comes within a minute.
async fn waiting_call(h: &Harness, client_timeout: Option<Duration>) -> tonic::Status {
    use slidegate_server::proto::rls::RateLimitRequest;
    let mut client = generic_client(h).await;
    client.ready().await.unwrap();
    let mut request = tonic::Request::new(tokio_stream::pending::<RateLimitRequest>());
    if let Some(timeout) = client_timeout {
        request.set_timeout(timeout);
    }
    let path = http::uri::PathAndQuery::from_static("/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit");
    let answer = tokio::time::timeout(
        Duration::from_secs(60),
        client.client_streaming(request, path, rls_codec()),
    )
    .await
    .expect("the server never ended a call waiting for its message");
    answer.expect_err("a call without its message was answered")
}

/// A gRPC call still waiting at the request timeout (its message never
/// sent) is answered `CANCELLED`, "Timeout expired", as tonic's server
/// answers it; the client's `grpc-timeout` bounds it when shorter; a
/// method the server does not have is `UNIMPLEMENTED`; and the server goes
/// on answering on the same connection after each.
#[tokio::test]
async fn grpc_calls_are_bounded_and_unknown_methods_unimplemented() {
    let mut h = Harness::start_with(BASIC, short_timeouts).await;
    let status = waiting_call(&h, None).await;
    assert_eq!(
        (status.code(), status.message()),
        (tonic::Code::Cancelled, "Timeout expired"),
        "{status:?}"
    );
    assert_eq!(h.rls(one("d", &[("a", "1")])).await.unwrap().overall_code(), Code::Ok);

    // The server would wait an hour: only the client's header ends it.
    let mut h = Harness::start_with(BASIC, |o| o.timeouts.request = Duration::from_secs(3600)).await;
    let status = waiting_call(&h, Some(Duration::from_millis(50))).await;
    assert_eq!(
        (status.code(), status.message()),
        (tonic::Code::Cancelled, "Timeout expired"),
        "{status:?}"
    );

    let mut client = generic_client(&h).await;
    for path in [
        "/envoy.service.ratelimit.v3.RateLimitService/NoSuchMethod",
        "/envoy.service.ratelimit.v2.RateLimitService/ShouldRateLimit",
        "/nope",
    ] {
        client.ready().await.unwrap();
        let status = client
            .unary(
                tonic::Request::new(one("d", &[("a", "1")])),
                http::uri::PathAndQuery::from_static(path),
                rls_codec(),
            )
            .await
            .expect_err(path);
        assert_eq!(status.code(), tonic::Code::Unimplemented, "{path}: {status:?}");
    }
    assert_eq!(h.rls(one("d", &[("a", "1")])).await.unwrap().overall_code(), Code::Ok);
}

/// A gRPC answer as it came: its HTTP headers, its data, its trailers.
struct RawAnswer {
    headers: http::HeaderMap,
    data: Bytes,
    trailers: Option<http::HeaderMap>,
}

impl RawAnswer {
    /// The `grpc-status`, from the trailers or (a trailers-only answer)
    /// the headers, and the `grpc-message`, percent-decoded.
    fn status(&self) -> (String, String) {
        let field = |name: &str| {
            let value = self
                .trailers
                .as_ref()
                .and_then(|t| t.get(name))
                .or(self.headers.get(name));
            value.map(|v| v.as_bytes().to_vec()).unwrap_or_default()
        };
        let encoded = field("grpc-message");
        let mut message = Vec::new();
        let mut i = 0;
        while i < encoded.len() {
            match (encoded[i], encoded.get(i + 1..i + 3)) {
                (b'%', Some(hex)) => {
                    message.push(u8::from_str_radix(std::str::from_utf8(hex).unwrap(), 16).unwrap());
                    i += 3;
                }
                (byte, _) => {
                    message.push(byte);
                    i += 1;
                }
            }
        }
        (
            String::from_utf8(field("grpc-status")).unwrap(),
            String::from_utf8(message).unwrap(),
        )
    }
}

/// `ShouldRateLimit` called over a raw HTTP/2 connection, the body sent as
/// `chunks` (each its own data frame), with `headers` beside gRPC's own.
async fn raw_should_rate_limit(h: &Harness, headers: &[(&str, &str)], chunks: Vec<Vec<u8>>) -> RawAnswer {
    raw_call(h, headers, chunks, None).await
}

/// [`raw_should_rate_limit`], the body ending with `trailers` if given.
async fn raw_call(
    h: &Harness,
    headers: &[(&str, &str)],
    chunks: Vec<Vec<u8>>,
    trailers: Option<http::HeaderMap>,
) -> RawAnswer {
    let tcp = TcpStream::connect(h.running.grpc_addr().unwrap()).await.unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(connection);
    let frames = chunks
        .into_iter()
        .map(|c| hyper::body::Frame::data(Bytes::from(c)))
        .chain(trailers.map(hyper::body::Frame::trailers))
        .map(Ok::<_, std::convert::Infallible>);
    let body = http_body_util::StreamBody::new(tokio_stream::iter(frames));
    let mut request = Request::post(format!(
        "http://{}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        h.running.grpc
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let answer = tokio::time::timeout(
        Duration::from_secs(60),
        sender.send_request(request.body(body).unwrap()),
    )
    .await
    .expect("no answer within a minute")
    .unwrap();
    let (parts, body) = answer.into_parts();
    assert_eq!(parts.status, StatusCode::OK);
    let body = body.collect().await.unwrap();
    let trailers = body.trailers().cloned();
    RawAnswer {
        headers: parts.headers,
        data: body.to_bytes(),
        trailers,
    }
}

/// A gRPC message: the compressed flag, the length, the bytes.
fn framed(flag: u8, message: &[u8]) -> Vec<u8> {
    let mut out = vec![flag];
    out.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// A plain `ShouldRateLimit` is answered as tonic answers one (one
/// message, `content-type: application/grpc`, the trailer `grpc-status:
/// 0`) however its message is split into data frames; bodies that are not
/// plain get tonic's own answers: a compressed flag without
/// `grpc-encoding`, an invalid flag, an encoding the server does not take,
/// no message, a message over the size limit; a body of two messages is
/// decided on the first. A body that cannot be decoded is the client's
/// fault, `INVALID_ARGUMENT` (not tonic's `INTERNAL`): bytes that are not
/// the message, a message cut short, a length prefix longer than the body,
/// bytes after the message that are no whole message. The server answers
/// plainly after each.
#[tokio::test]
async fn should_rate_limit_bodies_plain_or_not_get_tonics_answers() {
    use prost::Message;
    let h = Harness::start(BASIC).await;
    let message = one("d", &[("free", "1")]).encode_to_vec();
    let whole = framed(0, &message);
    let plain = raw_should_rate_limit(&h, &[], vec![whole.clone()]).await;
    assert_eq!(plain.status(), ("0".to_owned(), String::new()));
    assert_eq!(plain.headers["content-type"], "application/grpc");
    let decoded = |answer: &RawAnswer| {
        let (prefix, rest) = answer.data.split_at(5);
        assert_eq!(prefix[0], 0);
        assert_eq!(u32::from_be_bytes(prefix[1..].try_into().unwrap()) as usize, rest.len());
        slidegate_server::proto::rls::RateLimitResponse::decode(rest).unwrap()
    };
    let answer = decoded(&plain);
    assert_eq!(answer.overall_code(), Code::Ok);
    assert_eq!(answer.statuses.len(), 1);
    // In pieces: the prefix split, the message split.
    let pieces = vec![whole[..3].to_vec(), whole[3..9].to_vec(), whole[9..].to_vec()];
    let split = raw_should_rate_limit(&h, &[], pieces).await;
    assert_eq!(split.status(), ("0".to_owned(), String::new()));
    assert_eq!(decoded(&split), answer);
    // Two messages: the first is decided (by tonic's server), and the
    // answer is framed alike, field for field but the date.
    let two = raw_should_rate_limit(&h, &[], vec![whole.clone(), whole.clone()]).await;
    assert_eq!(decoded(&two), answer);
    let undated = |answer: &RawAnswer| {
        let mut headers = answer.headers.clone();
        headers.remove("date");
        (headers, answer.trailers.clone())
    };
    assert_eq!(undated(&plain), undated(&two));

    let internal = "13".to_owned();
    let invalid = "3".to_owned();
    // A case: its name, headers, body, and the answer's status and words.
    type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], Vec<u8>, String, &'a str);
    let cut_message = format!("{} of the 256 bytes its prefix gives came", message.len());
    let cases: Vec<Case> = vec![
        (
            "compressed flag",
            &[],
            framed(1, &message),
            internal.clone(),
            "compressed-flag",
        ),
        (
            "flag 2",
            &[],
            framed(2, &message),
            internal.clone(),
            "invalid compression flag",
        ),
        (
            "gzip",
            &[("grpc-encoding", "gzip")],
            whole.clone(),
            "12".to_owned(),
            "gzip",
        ),
        (
            "no message",
            &[],
            Vec::new(),
            internal.clone(),
            "Missing request message.",
        ),
        (
            "cut short",
            &[],
            whole[..whole.len() - 1].to_vec(),
            invalid.clone(),
            "ends inside a message",
        ),
        (
            "cut in the prefix",
            &[],
            whole[..3].to_vec(),
            invalid.clone(),
            "prefix: 3 of its 5 bytes came",
        ),
        (
            "a length longer than the body",
            &[],
            [&[0, 0, 0, 1, 0][..], &message].concat(),
            invalid.clone(),
            &cut_message,
        ),
        (
            "a length over the limit, the body short",
            &[],
            [&[0, 0, 1, 0, 1][..], &message].concat(),
            "11".to_owned(),
            "65536",
        ),
        (
            "trailing bytes",
            &[],
            [whole.clone(), vec![0, 0]].concat(),
            invalid.clone(),
            "ends inside a message's prefix",
        ),
        (
            "not the message",
            &[],
            framed(0, &[0xff; 8]),
            invalid.clone(),
            "not a RateLimitRequest",
        ),
        (
            "garbage in a message",
            &[],
            framed(0, b"GET / HTTP/1.1\r\n\r\n"),
            invalid.clone(),
            "not a RateLimitRequest",
        ),
        (
            "garbage unframed: its first byte an invalid flag, as gRPC's protocol error",
            &[],
            b"GET / HTTP/1.1\r\n\r\n".to_vec(),
            internal.clone(),
            "invalid compression flag",
        ),
        (
            "over the limit",
            &[],
            framed(0, &vec![0; 70_000]),
            "11".to_owned(),
            "65536",
        ),
    ];
    for (name, headers, body, code, message) in cases {
        let refused = raw_should_rate_limit(&h, headers, vec![body]).await;
        let (got, said) = refused.status();
        assert_eq!(got, code, "{name}: {said}");
        assert!(said.contains(message), "{name}: {said}");
        assert!(refused.data.is_empty(), "{name}");
        let after = raw_should_rate_limit(&h, &[], vec![whole.clone()]).await;
        assert_eq!(decoded(&after), answer, "{name}");
    }

    // Trailers send a body to tonic's path: its answers are the same.
    let mut trailers = http::HeaderMap::new();
    trailers.insert("x-note", http::HeaderValue::from_static("1"));
    let tonic_cases: Vec<(&str, Vec<u8>, &str, &str)> = vec![
        ("whole", whole.clone(), "0", ""),
        ("not the message", framed(0, &[0xff; 8]), "3", "not a RateLimitRequest"),
        (
            "cut short",
            whole[..whole.len() - 1].to_vec(),
            "3",
            "ends inside a message",
        ),
        (
            "trailing bytes",
            [whole.clone(), vec![0, 0]].concat(),
            "3",
            "ends inside a message's prefix",
        ),
        ("over the limit", framed(0, &vec![0; 70_000]), "11", "65536"),
        ("no message", Vec::new(), "13", "Missing request message."),
    ];
    for (name, body, code, message) in tonic_cases {
        let answer = raw_call(&h, &[], vec![body], Some(trailers.clone())).await;
        let (got, said) = answer.status();
        assert_eq!(got, code, "{name} with trailers: {said}");
        assert!(said.contains(message), "{name} with trailers: {said}");
    }
    // Past the size limit, the rest is tonic's to read: a first message
    // that does not decode is INVALID_ARGUMENT there too.
    let long = [framed(0, &[0xff; 8]), framed(0, &vec![0; 70_000])].concat();
    let refused = raw_should_rate_limit(&h, &[], vec![long]).await;
    let (got, said) = refused.status();
    assert_eq!(got, "3", "{said}");
    assert!(said.contains("not a RateLimitRequest"), "{said}");
}

/// A path that is no endpoint (404) and an endpoint asked with the wrong
/// method (405) are answered with problem documents naming the endpoints;
/// `/healthcheck` answers as envoyproxy/ratelimit's does.
#[tokio::test]
async fn unknown_paths_and_methods_are_problem_documents() {
    let h = Harness::start(BASIC).await;
    let (status, headers, body) = h.post("/nope", "{}").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(headers["content-type"], "application/problem+json");
    let problem: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(problem["status"], 404);
    assert!(problem["detail"].as_str().unwrap().contains("POST /nope"), "{body}");
    let (status, body) = h.get("/json").await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    let problem: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(problem["status"], 405);
    assert!(
        problem["detail"].as_str().unwrap().contains("/json does not take GET"),
        "{body}"
    );
    assert_eq!(h.get("/healthcheck").await, (StatusCode::OK, "OK\n".to_owned()));
}

/// Requests hyper refuses before the router sees them (malformed, a header
/// section too large, a URI too long) are answered with problem documents
/// too, then the connection is closed; an answer before one on the same
/// connection is untouched.
#[tokio::test]
async fn requests_hyper_refuses_get_problem_documents() {
    let h = Harness::start(BASIC).await;
    let addr = h.http_addr();
    // Well over hyper's buffer (about 400 KiB): a header a little over it
    // may arrive in one read and be parsed whole.
    let huge_header = format!(
        "GET /healthz HTTP/1.1\r\nhost: x\r\nx-big: {}\r\n\r\n",
        "a".repeat(2 << 20)
    );
    let many_headers: String = (0..200).map(|i| format!("x-h{i}: v\r\n")).collect();
    let many_headers = format!("GET /healthz HTTP/1.1\r\nhost: x\r\n{many_headers}\r\n");
    let long_uri = format!("GET /{} HTTP/1.1\r\nhost: x\r\n\r\n", "a".repeat(70_000));
    let cases = [
        ("GET / HTTP/1.1\r\nhost: x\r\nno colon here\r\n\r\n".to_owned(), 400),
        ("NOT HTTP AT ALL\r\n\r\n".to_owned(), 400),
        (huge_header, 431),
        (many_headers, 431),
        (long_uri, 414),
        (
            "GET /healthz HTTP/1.1\r\nhost: x\r\n\r\nGARBAGE\x01\r\n\r\n".to_owned(),
            400,
        ),
    ];
    for (request, status) in cases {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        // The server may answer and close before it has read all of a
        // request too large: the write then fails, the answer is there.
        let _ = stream.write_all(request.as_bytes()).await;
        let answer = read_until_closed(&mut stream, Duration::from_secs(10))
            .await
            .unwrap_or_else(|| panic!("{status}: the connection stays open after {:?}", &request[..40]));
        let answer = String::from_utf8(answer).unwrap();
        // The refusal is the connection's one 4xx answer, and its last.
        let refusal = &answer[answer
            .find("HTTP/1.1 4")
            .unwrap_or_else(|| panic!("{status}: {answer:?}"))..];
        let (head, body) = refusal.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with(&format!("HTTP/1.1 {status} ")), "{head}");
        assert!(head.contains("content-type: application/problem+json"), "{head}");
        assert!(head.contains(&format!("content-length: {}", body.len())), "{head}");
        let problem: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(problem["status"], status);
        assert!(!problem["detail"].as_str().unwrap().is_empty());
        if request.contains("GARBAGE") {
            assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
            assert!(answer.contains("\r\n\r\nOK\n"), "{answer}");
        }
    }
}

/// Past `--max-in-flight`, a call is answered at once (gRPC
/// `RESOURCE_EXHAUSTED`, HTTP 503 with `Retry-After`), counted, rather
/// than queued; once the call in flight ends, calls are decided again.
#[tokio::test]
async fn calls_past_the_in_flight_budget_are_answered_at_once() {
    use slidegate_server::proto::rls::RateLimitRequest;
    let mut h = Harness::start_with(BASIC, |options| {
        short_timeouts(options);
        options.connections.max_in_flight = 1;
    })
    .await;
    // One call in flight: its message never comes (until the 300 ms
    // request timeout).
    let mut client = generic_client(&h).await;
    client.ready().await.unwrap();
    let held = tokio::spawn(async move {
        let request = tonic::Request::new(tokio_stream::pending::<RateLimitRequest>());
        let path = http::uri::PathAndQuery::from_static("/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit");
        client.client_streaming(request, path, rls_codec()).await
    });
    let until = tokio::time::Instant::now() + Duration::from_secs(5);
    while !h
        .running
        .shared()
        .metrics_text()
        .contains("slidegate_calls_in_flight 1")
    {
        assert!(tokio::time::Instant::now() < until, "the held call never started");
        tokio::task::yield_now().await;
    }
    let status = h.rls(one("d", &[("a", "1")])).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    let (code, headers, body) = h
        .post(
            "/json",
            r#"{"domain":"d","descriptors":[{"entries":[{"key":"a","value":"1"}]}]}"#,
        )
        .await;
    assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(headers.get("retry-after").unwrap(), "1");
    assert!(body.contains("--max-in-flight"), "{body}");
    let metrics = h.running.shared().metrics_text();
    assert!(metrics.contains("slidegate_calls_shed_total 2"), "{metrics}");
    // The held call ends at the request timeout; then calls are decided.
    let ended = held.await.unwrap().unwrap_err();
    assert_eq!(ended.code(), tonic::Code::Cancelled);
    assert_eq!(h.rls(one("d", &[("a", "1")])).await.unwrap().overall_code(), Code::Ok);
}

/// `--max-connection-age`: a connection that reaches it is sent a
/// `GOAWAY` and closed, though it keeps making calls.
#[tokio::test]
async fn connections_are_closed_at_their_maximum_age() {
    let h = Harness::start_with(BASIC, |options| {
        options.connections.max_age = Some(Duration::from_millis(300));
    })
    .await;
    let addr = h.http_addr();
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    let driven = tokio::spawn(connection);
    let start = tokio::time::Instant::now();
    let mut answered = 0;
    loop {
        assert!(start.elapsed() < Duration::from_secs(5), "never closed");
        let request = Request::get("/healthz")
            .header("host", "localhost")
            .body(Full::new(Bytes::new()))
            .unwrap();
        match sender.send_request(request).await {
            Ok(response) => {
                response.into_body().collect().await.unwrap();
                answered += 1;
            }
            Err(_) => break,
        }
    }
    assert!(start.elapsed() >= Duration::from_millis(250), "closed before its age");
    assert!(answered > 1);
    assert!(
        driven.await.unwrap().is_ok(),
        "closed without finishing the answer in flight"
    );
    // This connection, and the harness's gRPC channel if it aged too.
    let metrics = h.running.shared().metrics_text();
    let aged = metrics
        .lines()
        .find_map(|l| l.strip_prefix(r#"slidegate_connections_closed_total{reason="age"} "#))
        .and_then(|n| n.parse::<u64>().ok());
    assert!(aged.is_some_and(|n| n >= 1), "{metrics}");
}
