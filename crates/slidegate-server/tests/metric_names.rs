//! Rules named in the metrics as envoyproxy/ratelimit names their stats,
//! and its per-rule stats counted in hits by its rule, near-limit
//! included: through the public API (`Config::parse_domain`,
//! `Domain::find`, `Match::metric_key`, `Engine`, `Metrics`) and through a
//! real server's `/metrics`.
//!
//! The expected names follow envoyproxy/ratelimit's `GetLimit`
//! (src/config/config_impl.go): its value-to-metric key without
//! `detailed_metric`, its detailed key with it, and the detailed key's
//! share_threshold form when a shared wildcard matched.

use slidegate_core::ManualClock;
use slidegate_memory::Budget;
use slidegate_server::config::{Config, Domain, Match};
use slidegate_server::engine::{Descriptor, Engine, InputLimits, Request};
use slidegate_server::metrics::{self, DEFAULT_NEAR_LIMIT_RATIO, Metrics};

mod common;
use common::harness::{Harness, one};

fn names() -> Domain {
    Config::parse_domain("metric_names.yaml", include_str!("data/metric_names.yaml")).unwrap()
}

/// Each descriptor of `cases` matches a rule of `domain` and is named as
/// given.
fn check(domain: &Domain, cases: &[(&[(&str, &str)], &str)]) {
    for &(entries, name) in cases {
        let m = domain
            .find(entries)
            .unwrap_or_else(|| panic!("{entries:?} matches no rule"));
        assert!(!m.rule.limits.is_empty(), "{entries:?} matched a rule without a limit");
        assert_eq!(m.metric_key(entries), name, "{entries:?}");
    }
}

#[test]
fn a_key_alone_shows_the_value_only_when_asked() {
    check(
        &names(),
        &[
            // No flag: the config's name, whatever the client sends.
            (&[("client", "alice")], "client"),
            (&[("client", "")], "client"),
            // value_to_metric: the value, but no `_` before an empty one.
            (&[("tenant", "t1")], "tenant_t1"),
            (&[("tenant", "")], "tenant"),
            // detailed_metric: `key_value`, the `_` even before an empty
            // value.
            (&[("session", "abc")], "session_abc"),
            (&[("session", "")], "session_"),
        ],
    );
}

#[test]
fn an_exact_value_is_always_shown() {
    check(
        &names(),
        &[
            (&[("client", "vip")], "client_vip"),
            (&[("client", "guest")], "client_guest"),
        ],
    );
}

#[test]
fn a_wildcard_shows_its_pattern_or_the_value() {
    check(
        &names(),
        &[
            // No flag: the pattern.
            (&[("path", "/img/a.png")], "path_/img/*"),
            // value_to_metric: the request's value, in full.
            (&[("path", "/doc/readme")], "path_/doc/readme"),
            (&[("path", "/api/u1/v2/x")], "path_/api/u1/v2/x"),
            // share_threshold: the pattern, value_to_metric or not.
            (&[("path", "/bin/ls")], "path_/bin/*"),
            (&[("path", "/lib/libc.so")], "path_/lib/*"),
            // detailed_metric: the value…
            (&[("path", "/tmp/x")], "path_/tmp/x"),
            (&[("session", "s-9")], "session_s-9"),
            // …but the pattern under share_threshold.
            (&[("path", "/var/log")], "path_/var/*"),
            // A `*` matching an empty value, with value_to_metric: the key.
            (&[("label", "x")], "label_x"),
            (&[("label", "")], "label"),
        ],
    );
}

#[test]
fn nested_levels_each_follow_their_rule() {
    check(
        &names(),
        &[
            // value_to_metric at two levels, one of them a wildcard.
            (
                &[("region", "eu"), ("op", "getfile"), ("item", "i1")],
                "region_eu.op_getfile.item",
            ),
            (&[("region", ""), ("op", "get"), ("item", "i1")], "region.op_get.item"),
            // A level without value_to_metric under one with it.
            (&[("zone", "z1"), ("host", "h1")], "zone.host_h1"),
            // A shared wildcard above a rule without detailed_metric.
            (
                &[("region", "eu"), ("op", "put1"), ("kind", "k")],
                "region_eu.op_put*.kind_k",
            ),
            // No flag at the leaf: the upper value_to_metric still shows.
            (&[("region", "eu"), ("op", "del"), ("kind", "k")], "region_eu.op.kind"),
            (&[("region", ""), ("op", "del"), ("kind", "k")], "region.op.kind"),
        ],
    );
}

#[test]
fn detailed_metric_at_the_leaf_names_every_level() {
    check(
        &names(),
        &[
            // Every value, value_to_metric ignored, a `_` before an empty
            // value.
            (
                &[("region", "eu"), ("op", "del"), ("item", "i1")],
                "region_eu.op_del.item_i1",
            ),
            (
                &[("region", ""), ("op", "del"), ("item", "i1")],
                "region_.op_del.item_i1",
            ),
            // A shared wildcard on the way: its pattern, and no `_` before
            // an empty value anywhere.
            (
                &[("region", "eu"), ("op", "put1"), ("item", "i1")],
                "region_eu.op_put*.item_i1",
            ),
            (&[("region", ""), ("op", "put1"), ("item", "")], "region.op_put*.item"),
            (
                &[("bucket", "b-1"), ("object", "o-1"), ("version", "v1")],
                "bucket_b-*.object_o-*.version_v1",
            ),
            (
                &[("bucket", "b-1"), ("object", "o-1"), ("version", "")],
                "bucket_b-*.object_o-*.version",
            ),
            (&[("bucket", "b-1"), ("object", "x")], "bucket_b-*.object_x"),
            (&[("bucket", "b-1"), ("object", "")], "bucket_b-*.object"),
            // A value that is the pattern itself is an exact match for
            // envoyproxy/ratelimit, not a shared one: the plain detailed
            // name, `_` before the empty value.
            (
                &[("region", "eu"), ("op", "put*"), ("item", "")],
                "region_eu.op_put*.item_",
            ),
            (&[("bucket", "b-*"), ("object", "")], "bucket_b-*.object_"),
        ],
    );
}

#[test]
fn the_names_envoyproxy_ratelimit_documents() {
    // Its README's examples and its tests' names, in configs of our own.
    let domain = Config::parse_domain(
        "docs.yaml",
        "domain: docs
descriptors:
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: read*
        value_to_metric: true
        descriptors:
          - key: resource
            rate_limit: { unit: minute, requests_per_unit: 100 }
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: { unit: minute, requests_per_unit: 60 }
  - key: service
    value: svc/*
    share_threshold: true
    descriptors:
      - key: endpoint
        detailed_metric: true
        rate_limit: { unit: minute, requests_per_unit: 60 }
",
    )
    .unwrap();
    check(
        &domain,
        &[
            (
                &[("user", "alice"), ("action", "readfile"), ("resource", "documents")],
                "user_alice.action_readfile.resource",
            ),
            (
                &[("route", "draw"), ("http_method", "GET"), ("subject_id", "123")],
                "route_draw.http_method_GET.subject_id",
            ),
            (
                &[("route", ""), ("http_method", "GET"), ("subject_id", "123")],
                "route.http_method_GET.subject_id",
            ),
            (
                &[("route", ""), ("http_method", ""), ("subject_id", "123")],
                "route.http_method.subject_id",
            ),
            (
                &[("service", "svc/a"), ("endpoint", "get")],
                "service_svc/*.endpoint_get",
            ),
        ],
    );
}

#[test]
fn a_limit_override_is_named_after_the_request() {
    assert_eq!(
        Match::override_metric_key(&[("client", "alice"), ("path", ""), ("op", "get")]),
        "client_alice.path.op_get"
    );
    assert_eq!(Match::override_metric_key(&[]), "");
}

#[test]
fn stat_names_are_sanitized_as_envoyproxy_ratelimit_does() {
    assert_eq!(metrics::stat_name("remote_address_10.0.0.1"), "remote_address_10_0_0_1");
    assert_eq!(metrics::stat_name("key:a|b"), "key_a_b");
    assert_eq!(metrics::stat_name("path_/img/*"), "path_/img/*");
}

// --- Hits, through the engine and the metrics ---------------------------

const HITS: &str = "domain: n
descriptors:
  - key: single
    rate_limit: { unit: minute, requests_per_unit: 10 }
  - key: batch
    rate_limit: { unit: minute, requests_per_unit: 10 }
  - key: fixed
    rate_limit: { unit: minute, requests_per_unit: 10, algorithm: fixed_window }
  - key: shadow
    shadow_mode: true
    rate_limit: { unit: minute, requests_per_unit: 2 }
  - key: zero
    rate_limit: { unit: minute, requests_per_unit: 0 }
  - key: free
    rate_limit: { unlimited: true }
";

fn engine(yaml: &str) -> Engine {
    let domain = Config::parse_domain("hits.yaml", yaml).unwrap();
    Engine::new(
        Config::from_domains(vec![domain]).unwrap(),
        ManualClock::new(1_000_000_000),
        Budget::bytes(1 << 20),
        Budget::bytes(1 << 20),
        InputLimits::default(),
    )
}

/// A request for one descriptor `key=v`, with the descriptor's own hits.
fn hits(key: &str, hits: Option<u64>) -> Request {
    Request {
        domain: "n".to_owned(),
        descriptors: vec![Descriptor {
            entries: vec![(key.to_owned(), "v".to_owned())],
            limit: None,
            hits_addend: hits,
        }],
        hits_addend: 0,
    }
}

/// Decides `request` and counts it in `metrics`.
async fn send(engine: &Engine, metrics: &Metrics, request: &Request) {
    let answer = engine.decide(request).await.unwrap();
    metrics.answer_request(&request.domain, request, &answer);
}

/// The value of the series `name{labels}` in `text`, if written.
fn value(text: &str, series: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// The five per-rule stats of `rule` in domain `n`: total, within, near,
/// over, shadow.
fn stats(metrics: &Metrics, engine: &Engine, rule: &str) -> [Option<u64>; 5] {
    let text = metrics.render(&engine.stats(), false);
    ["", "_within_limit", "_near_limit", "_over_limit", "_shadow_mode"].map(|stat| {
        value(
            &text,
            &format!("slidegate_rule{stat}_hits_total{{domain=\"n\",rule=\"{rule}\"}}"),
        )
    })
}

#[tokio::test]
async fn one_hit_at_a_time_on_a_limit_of_10() {
    for key in ["single", "fixed"] {
        let e = engine(HITS);
        let m = Metrics::new();
        for _ in 0..12 {
            send(&e, &m, &hits(key, None)).await;
        }
        // Hits 9 and 10 pass 8 (80 % of 10) within the limit; 11 and 12
        // are over it.
        assert_eq!(
            stats(&m, &e, key),
            [Some(12), Some(10), Some(2), Some(2), Some(0)],
            "{key}"
        );
        let text = m.render(&e.stats(), false);
        let decisions = |outcome| {
            value(
                &text,
                &format!("slidegate_rule_decisions_total{{domain=\"n\",rule=\"{key}\",outcome=\"{outcome}\"}}"),
            )
        };
        assert_eq!((decisions("ok"), decisions("over_limit")), (Some(10), Some(2)));
    }
}

#[tokio::test]
async fn several_hits_split_between_the_stats() {
    let e = engine(HITS);
    let m = Metrics::new();
    let mut expected = [0u64; 5];
    // (hits, what they add: total, within, near, over)
    for (n, add) in [
        // 0 → 6: within.
        (6, [6, 6, 0, 0]),
        // 6 → 9: one past 8.
        (3, [3, 3, 1, 0]),
        // 9, +3 refused: one near (9 → 10), two over. A descriptor's own
        // hits are a debit, counted even when refused: 9 → 12.
        (3, [3, 0, 1, 2]),
        // Over the limit already: all over (12 → 13).
        (1, [1, 0, 0, 1]),
        (4, [4, 0, 0, 4]),
        // A check without hits adds nothing.
        (0, [0, 0, 0, 0]),
    ] {
        send(&e, &m, &hits("batch", Some(n))).await;
        for (sum, add) in expected.iter_mut().zip(add) {
            *sum += add;
        }
        assert_eq!(stats(&m, &e, "batch"), expected.map(Some), "after {n} hits");
    }
    // The request's hits_addend counts when the descriptor has none.
    let e = engine(HITS);
    let m = Metrics::new();
    let mut request = hits("batch", None);
    request.hits_addend = 9;
    send(&e, &m, &request).await;
    assert_eq!(stats(&m, &e, "batch"), [Some(9), Some(9), Some(1), Some(0), Some(0)]);
}

#[tokio::test]
async fn shadow_mode_zero_limits_and_unlimited_rules() {
    let e = engine(HITS);
    let m = Metrics::new();
    for _ in 0..3 {
        send(&e, &m, &hits("shadow", None)).await;
    }
    send(&e, &m, &hits("zero", Some(2))).await;
    send(&e, &m, &hits("free", Some(5))).await;
    // A limit of 2: the first hit is within and not near (threshold 1),
    // the second near, the third over, admitted in shadow mode.
    assert_eq!(stats(&m, &e, "shadow"), [Some(3), Some(2), Some(1), Some(1), Some(1)]);
    // A limit of 0 refuses every hit.
    assert_eq!(stats(&m, &e, "zero"), [Some(2), Some(0), Some(0), Some(2), Some(0)]);
    // An unlimited rule has no hits counted, as envoyproxy/ratelimit keeps
    // no stats for it.
    assert_eq!(stats(&m, &e, "free")[0].unwrap_or(0), 0);
}

#[tokio::test]
async fn the_near_limit_ratio_moves_the_threshold() {
    for (ratio, near) in [(0.5, 5), (0.0, 10), (1.0, 0), (DEFAULT_NEAR_LIMIT_RATIO, 2)] {
        let e = engine(HITS);
        let m = Metrics::with_near_limit_ratio(ratio).unwrap();
        for _ in 0..12 {
            send(&e, &m, &hits("single", None)).await;
        }
        assert_eq!(stats(&m, &e, "single")[2], Some(near), "ratio {ratio}");
    }
    let e = Metrics::with_near_limit_ratio(1.5).err().unwrap();
    assert_eq!(e.ratio, 1.5);
    assert_eq!(
        e.to_string(),
        "the near-limit ratio must be a number from 0 to 1, not 1.5"
    );
    assert!(Metrics::with_near_limit_ratio(-0.2).is_err());
    assert!(Metrics::with_near_limit_ratio(f64::NAN).is_err());
}

// --- Through the real server --------------------------------------------

#[tokio::test]
async fn the_server_names_and_counts_rules_as_envoyproxy_ratelimit() {
    let mut h = Harness::start(include_str!("data/metric_names.yaml")).await;
    let request = |entries: &[(&str, &str)]| one("names", entries);
    for _ in 0..12 {
        h.rls(request(&[("region", "eu"), ("op", "getfile"), ("item", "i1")]))
            .await
            .unwrap();
    }
    for path in ["/var/log", "/var/tmp"] {
        h.rls(request(&[("path", path)])).await.unwrap();
    }
    h.rls(request(&[("tenant", "10.1.2.3")])).await.unwrap();
    let text = h.running.shared().metrics_text();
    for (series, expected) in [
        (
            "slidegate_rule_hits_total{domain=\"names\",rule=\"region_eu.op_getfile.item\"}",
            12,
        ),
        (
            "slidegate_rule_within_limit_hits_total{domain=\"names\",rule=\"region_eu.op_getfile.item\"}",
            10,
        ),
        (
            "slidegate_rule_near_limit_hits_total{domain=\"names\",rule=\"region_eu.op_getfile.item\"}",
            2,
        ),
        (
            "slidegate_rule_over_limit_hits_total{domain=\"names\",rule=\"region_eu.op_getfile.item\"}",
            2,
        ),
        (
            "slidegate_rule_decisions_total{domain=\"names\",rule=\"region_eu.op_getfile.item\",outcome=\"over_limit\"}",
            2,
        ),
        // Two values of one shared wildcard count under its pattern.
        ("slidegate_rule_hits_total{domain=\"names\",rule=\"path_/var/*\"}", 2),
        // An address's dots become `_`, as in envoyproxy/ratelimit's stat.
        (
            "slidegate_rule_hits_total{domain=\"names\",rule=\"tenant_10_1_2_3\"}",
            1,
        ),
    ] {
        assert_eq!(value(&text, series), Some(expected), "{series} in\n{text}");
    }
    h.running.shutdown().await;
}
