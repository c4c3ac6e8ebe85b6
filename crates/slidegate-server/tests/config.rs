//! envoyproxy/ratelimit's YAML: loading, error positions and matching.

use serde_json::json;
use slidegate_core::{Algorithm, Policy, Weighting};
use slidegate_server::config::{
    Config, ConfigError, ConfigWarning, DEFAULT_ALGORITHM, Domain, Limit, LoadOptions, Unit, ValuePattern,
};
use std::path::{Path, PathBuf};
use std::time::Duration;

mod common;
use common::TempDir;

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name)
}

fn edge_proxy() -> Domain {
    let config = Config::load(&[data("edge_proxy.yaml")]).unwrap();
    config.domain("edge_proxy").unwrap().clone()
}

fn parse(text: &str) -> Domain {
    Config::parse_domain("t.yaml", text).unwrap_or_else(|e| panic!("{e}"))
}

fn error(text: &str) -> ConfigError {
    match Config::parse_domain("t.yaml", text) {
        Ok(domain) => panic!("parsed: {domain:?}"),
        Err(e) => e,
    }
}

/// Asserts the error's position, key and that its message contains `what`.
#[track_caller]
fn assert_error(text: &str, line: usize, column: usize, key: Option<&str>, what: &str) {
    let e = error(text);
    assert_eq!(
        (e.file.as_str(), e.line, e.column, e.key.as_deref()),
        ("t.yaml", line, column, key),
        "{e}"
    );
    assert!(e.message.contains(what), "{e} does not say {what:?}");
}

/// The only limit of the rule matched by `entries`.
fn limit<'a>(domain: &'a Domain, entries: &[(&str, &str)]) -> &'a Limit {
    let m = domain
        .find(entries)
        .unwrap_or_else(|| panic!("{entries:?} matches nothing"));
    assert_eq!(m.rule.limits.len(), 1, "{entries:?}");
    &m.rule.limits[0]
}

/// A domain with one descriptor `k` whose `rate_limit` is `limit`.
fn one_limit(limit: &str) -> String {
    format!("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {limit}\n")
}

// ---------------------------------------------------------------- the example

#[test]
fn example_loads() {
    let domain = edge_proxy();
    assert_eq!(domain.name, "edge_proxy");
    assert_eq!(domain.rules.len(), 7);
    let first = &domain.rules[0];
    assert_eq!((first.line, first.column), (3, 5));
    assert_eq!(first.key, "remote_address");
    assert_eq!(first.value, None);
    assert_eq!(domain.rules[1].value, Some(ValuePattern::Exact("50.0.0.5".to_owned())));
    assert_eq!(
        domain.rules[3].value,
        Some(ValuePattern::Wildcard("/files/*".to_owned()))
    );
    assert_eq!(
        (domain.rules[2].children[0].line, domain.rules[2].children[0].column),
        (11, 9)
    );
}

#[test]
fn example_remote_address() {
    let domain = edge_proxy();
    let l = limit(&domain, &[("remote_address", "1.2.3.4")]);
    assert_eq!(
        (l.requests_per_unit, l.unit, l.window),
        (10, Some(Unit::Second), Duration::from_secs(1))
    );
    assert_eq!(l.algorithm, DEFAULT_ALGORITHM);
    let policy = l.policy.unwrap();
    assert_eq!((policy.limit(), policy.window()), (10, Duration::from_secs(1)));
    assert_eq!(policy.algorithm(), DEFAULT_ALGORITHM);

    let blocked = limit(&domain, &[("remote_address", "50.0.0.5")]);
    assert_eq!((blocked.requests_per_unit, blocked.policy), (0, None));
    assert_eq!(blocked.unit, Some(Unit::Second));

    let m = domain.find(&[("remote_address", "1.2.3.4")]).unwrap();
    let other = domain.find(&[("remote_address", "1.2.3.5")]).unwrap();
    assert_ne!(
        m.counter_key("edge_proxy", &[("remote_address", "1.2.3.4")]),
        other.counter_key("edge_proxy", &[("remote_address", "1.2.3.5")])
    );
}

#[test]
fn example_nested_marketing() {
    let domain = edge_proxy();
    let a = [("message_type", "marketing"), ("to_number", "123")];
    let b = [("message_type", "marketing"), ("to_number", "456")];
    let l = limit(&domain, &a);
    assert_eq!((l.requests_per_unit, l.unit), (5, Some(Unit::Day)));
    assert_eq!(l.window, Duration::from_secs(86_400));
    let key_a = domain.find(&a).unwrap().counter_key("edge_proxy", &a);
    let key_b = domain.find(&b).unwrap().counter_key("edge_proxy", &b);
    assert_ne!(key_a, key_b);
    // One entry stops at the parent, which has no limit (not limited, as
    // upstream); another message type matches nothing.
    let parent = domain.find(&[("message_type", "marketing")]).unwrap();
    assert_eq!(parent.rule.key, "message_type");
    assert!(parent.rule.limits.is_empty());
    assert!(!parent.rule.unlimited);
    assert!(domain.find(&[("message_type", "news"), ("to_number", "123")]).is_none());
    // The match must use every entry.
    assert!(
        domain
            .find(&[("message_type", "marketing"), ("to_number", "1"), ("x", "y")])
            .is_none()
    );
    assert!(
        domain
            .find(&[("remote_address", "1.2.3.4"), ("to_number", "1")])
            .is_none()
    );
    assert!(domain.find(&[("to_number", "123")]).is_none());
}

#[test]
fn example_shared_wildcard() {
    let domain = edge_proxy();
    let a = [("path", "/files/a")];
    let b = [("path", "/files/b")];
    let ma = domain.find(&a).unwrap();
    let mb = domain.find(&b).unwrap();
    assert!(ma.rule.share_threshold);
    assert_eq!(ma.rule.limits[0].requests_per_unit, 100);
    assert_eq!(ma.rule.limits[0].unit, Some(Unit::Hour));
    assert_eq!(ma.counter_key("edge_proxy", &a), mb.counter_key("edge_proxy", &b));
    assert!(domain.find(&[("path", "/other")]).is_none());
    // Another domain never shares the counter.
    assert_ne!(ma.counter_key("edge_proxy", &a), ma.counter_key("other", &a));
}

#[test]
fn example_names_and_replaces() {
    let domain = edge_proxy();
    let account = limit(&domain, &[("category", "account")]);
    assert_eq!(account.name.as_deref(), Some("account_default"));
    assert_eq!((account.requests_per_unit, account.unit), (4, Some(Unit::Minute)));
    assert!(account.replaces.is_empty());
    let vip = limit(&domain, &[("client", "vip")]);
    assert_eq!((vip.requests_per_unit, vip.unit), (40, Some(Unit::Minute)));
    assert_eq!(vip.replaces, ["account_default"]);
    assert_eq!(vip.name, None);
    assert!(domain.find(&[("client", "other")]).is_none());
}

#[test]
fn example_unlimited() {
    let domain = edge_proxy();
    let m = domain.find(&[("ldap", "anything")]).unwrap();
    assert!(m.rule.unlimited);
    assert!(m.rule.limits.is_empty());
}

/// A config written the way Envoy Gateway's translator writes them loads:
/// a `name` beside the domain (ignored), an empty limit name (no name), a
/// `rate_limit: null` on the levels above, the unit in capitals, and every
/// flag and list spelt out even when empty or false.
#[test]
fn a_config_as_envoy_gateway_writes_it() {
    let domain = parse(
        "name: gw/listener\n\
         domain: gw/listener\n\
         descriptors:\n\
         \x20 - key: route-a\n\
         \x20   value: route-a\n\
         \x20   rate_limit: null\n\
         \x20   shadow_mode: false\n\
         \x20   descriptors:\n\
         \x20     - key: by-client\n\
         \x20       value: \"\"\n\
         \x20       rate_limit:\n\
         \x20         requests_per_unit: 7\n\
         \x20         unit: MINUTE\n\
         \x20         unlimited: false\n\
         \x20         name: \"\"\n\
         \x20         replaces: []\n\
         \x20       descriptors: []\n\
         \x20       quota_mode: false\n\
         \x20       detailed_metric: false\n\
         \x20       value_to_metric: false\n\
         \x20       share_threshold: false\n",
    );
    assert_eq!(domain.name, "gw/listener");
    let limit = limit(&domain, &[("route-a", "route-a"), ("by-client", "10.0.0.9")]);
    assert_eq!((limit.requests_per_unit, limit.unit), (7, Some(Unit::Minute)));
    assert_eq!(limit.name, None, "an empty name is no name");
    assert!(limit.replaces.is_empty());
    // The top-level `name` is a scalar like the rest; a map there is an error.
    assert_error("name: { a: 1 }\ndomain: d\n", 1, 7, Some("name"), "expected");
}

// ---------------------------------------------------------------- matching

#[test]
fn wildcards_anywhere_and_precedence() {
    let domain = parse(
        "domain: d
descriptors:
  - key: path
    value: /api/*/users/*
    rate_limit: { unit: second, requests_per_unit: 1 }
  - key: any
    value: '*'
    rate_limit: { unit: second, requests_per_unit: 2 }
  - key: k
    rate_limit: { unit: second, requests_per_unit: 3 }
  - key: k
    value: a*
    rate_limit: { unit: second, requests_per_unit: 4 }
  - key: k
    value: ab
    rate_limit: { unit: second, requests_per_unit: 5 }
  - key: k
    value: '*b'
    rate_limit: { unit: second, requests_per_unit: 6 }
",
    );
    let n = |entries: &[(&str, &str)]| domain.find(entries).map(|m| m.rule.limits[0].requests_per_unit);
    assert_eq!(n(&[("path", "/api/v1/users/7")]), Some(1));
    assert_eq!(n(&[("path", "/api/v1/groups/7")]), None);
    assert_eq!(n(&[("any", "")]), Some(2));
    assert_eq!(n(&[("any", "whatever it is")]), Some(2));
    // Exact beats wildcard beats key alone; wildcards in file order.
    assert_eq!(n(&[("k", "ab")]), Some(5));
    assert_eq!(n(&[("k", "axb")]), Some(4));
    assert_eq!(n(&[("k", "xb")]), Some(6));
    assert_eq!(n(&[("k", "x")]), Some(3));
    // Without share_threshold, every value has its own counter.
    let a = [("path", "/api/v1/users/7")];
    let b = [("path", "/api/v1/users/8")];
    assert_ne!(
        domain.find(&a).unwrap().counter_key("d", &a),
        domain.find(&b).unwrap().counter_key("d", &b)
    );
    let pattern = ValuePattern::Wildcard("/api/*/users/*".to_owned());
    assert!(pattern.matches("/api/v1/users/7"));
    assert!(!pattern.matches("/api/v1/groups/7"));
    assert_eq!(pattern.as_str(), "/api/*/users/*");
}

#[test]
fn scalar_values_are_text() {
    let domain = parse(
        "domain: 42
descriptors:
  - key: 200
    value: 200
  - key: ip
    value: 50.0.0.5
  - key: f
    value: 1.50
  - key: b
    value: true
  - key: e
    value: ''
",
    );
    assert_eq!(domain.name, "42");
    assert!(domain.find(&[("200", "200")]).is_some());
    assert!(domain.find(&[("ip", "50.0.0.5")]).is_some());
    assert!(domain.find(&[("f", "1.50")]).is_some());
    assert!(domain.find(&[("f", "1.5")]).is_none());
    assert!(domain.find(&[("b", "true")]).is_some());
    // An empty value is no value, as upstream.
    assert_eq!(domain.rules[4].value, None);
    assert!(domain.find(&[("e", "x")]).is_some());
}

// ---------------------------------------------------------------- extensions

#[test]
fn several_limits() {
    let domain = parse(
        "domain: d
descriptors:
  - key: k
    rate_limits: [{unit: second, requests_per_unit: 10}, {unit: hour, requests_per_unit: 1000}]
  - key: both
    rate_limit: { unit: minute, requests_per_unit: 1 }
    rate_limits:
      - { unit: day, requests_per_unit: 2, name: daily }
",
    );
    let limits = &domain.find(&[("k", "v")]).unwrap().rule.limits;
    assert_eq!(limits.len(), 2);
    assert_eq!((limits[0].requests_per_unit, limits[0].unit), (10, Some(Unit::Second)));
    assert_eq!((limits[1].requests_per_unit, limits[1].unit), (1000, Some(Unit::Hour)));
    assert_eq!(limits[1].policy.unwrap().window(), Duration::from_secs(3600));
    let both = &domain.find(&[("both", "v")]).unwrap().rule.limits;
    assert_eq!(both.len(), 2);
    assert_eq!(both[0].unit, Some(Unit::Minute));
    assert_eq!(both[1].name.as_deref(), Some("daily"));
}

#[test]
fn window_instead_of_unit() {
    let domain = parse(&one_limit("{ window: 30s, requests_per_unit: 7 }"));
    let l = limit(&domain, &[("k", "v")]);
    assert_eq!(
        (l.unit, l.window, l.requests_per_unit),
        (None, Duration::from_secs(30), 7)
    );
    assert_eq!(l.policy.unwrap().window(), Duration::from_secs(30));
    let domain = parse(&one_limit("{ window: 5m, requests_per_unit: 7 }"));
    assert_eq!(limit(&domain, &[("k", "v")]).window, Duration::from_secs(300));
}

#[test]
fn algorithms() {
    let of = |limit: &str| {
        let domain = parse(&one_limit(limit));
        let l = limit_of(&domain);
        assert_eq!(l.policy.map(|p| p.algorithm()), Some(l.algorithm));
        l.algorithm
    };
    fn limit_of(domain: &Domain) -> Limit {
        domain.rules[0].limits[0].clone()
    }
    assert_eq!(of("{ unit: second, requests_per_unit: 5 }"), DEFAULT_ALGORITHM);
    assert_eq!(
        DEFAULT_ALGORITHM,
        Algorithm::SlidingWindow {
            buckets: 8,
            weighting: Weighting::Conservative
        }
    );
    assert_eq!(
        of("{ unit: second, requests_per_unit: 5, algorithm: sliding_log }"),
        Algorithm::SlidingLog
    );
    assert_eq!(
        of("{ unit: second, requests_per_unit: 5, algorithm: gcra }"),
        Algorithm::Gcra { burst: 5 }
    );
    assert_eq!(
        of("{ unit: second, requests_per_unit: 5, algorithm: fixed_window }"),
        Algorithm::FixedWindow
    );
    assert_eq!(
        of("{ unit: second, requests_per_unit: 5, algorithm: exponential_histogram }"),
        Algorithm::ExponentialHistogram { epsilon: 0.01 }
    );
    // With `algorithm: sliding_window`, its defaults: the default algorithm.
    assert_eq!(
        of("{ unit: second, requests_per_unit: 5, algorithm: sliding_window }"),
        Algorithm::SlidingWindow {
            buckets: 8,
            weighting: Weighting::Conservative
        }
    );
    assert_eq!(
        of("{ unit: second, requests_per_unit: 5, algorithm: sliding_window, buckets: 2, weighting: interpolated }"),
        Algorithm::TWO_BUCKETS
    );
    assert_eq!(
        of("{ unit: second, requests_per_unit: 5, algorithm: gcra, burst: 3 }"),
        Algorithm::Gcra { burst: 3 }
    );
    assert_eq!(
        of("{ unit: second, requests_per_unit: 5, algorithm: exponential_histogram, epsilon: 0.05 }"),
        Algorithm::ExponentialHistogram { epsilon: 0.05 }
    );
    assert_eq!(
        of("{ unit: second, requests_per_unit: 5, algorithm: exponential_histogram, epsilon: 1e-3 }"),
        Algorithm::ExponentialHistogram { epsilon: 0.001 }
    );
    assert_eq!(
        of("{ unit: second, requests_per_unit: 5, algorithm: sliding_window, buckets: 4, weighting: interpolated }"),
        Algorithm::SlidingWindow {
            buckets: 4,
            weighting: Weighting::Interpolated
        }
    );
    // Without `algorithm`, buckets and weighting change the default.
    assert_eq!(
        of("{ unit: second, requests_per_unit: 5, buckets: 4, weighting: interpolated }"),
        Algorithm::SlidingWindow {
            buckets: 4,
            weighting: Weighting::Interpolated
        }
    );
    assert_eq!(
        of("{ unit: second, requests_per_unit: 5, buckets: 65536 }"),
        Algorithm::SlidingWindow {
            buckets: Policy::MAX_BUCKETS,
            weighting: Weighting::Conservative
        }
    );
    // A zero limit keeps its algorithm (a burst of at least 1) but has no
    // policy.
    let domain = parse(&one_limit("{ unit: second, requests_per_unit: 0, algorithm: gcra }"));
    assert_eq!(domain.rules[0].limits[0].algorithm, Algorithm::Gcra { burst: 1 });
    assert_eq!(domain.rules[0].limits[0].policy, None);
}

#[test]
fn units_in_any_case() {
    for (text, unit, secs) in [
        ("SECOND", Unit::Second, 1),
        ("Minute", Unit::Minute, 60),
        ("hour", Unit::Hour, 3600),
        ("day", Unit::Day, 86_400),
        ("week", Unit::Week, 7 * 86_400),
        ("MONTH", Unit::Month, 30 * 86_400),
        ("year", Unit::Year, 365 * 86_400),
    ] {
        let domain = parse(&one_limit(&format!("{{ unit: {text}, requests_per_unit: 1 }}")));
        let l = limit(&domain, &[("k", "v")]);
        assert_eq!((l.unit, l.window), (Some(unit), Duration::from_secs(secs)));
        assert_eq!(unit.duration(), Duration::from_secs(secs));
        assert_eq!(unit.name(), text.to_lowercase());
    }
    let domain = parse(&one_limit("{ unit: second, requests_per_unit: 4294967295 }"));
    assert_eq!(limit(&domain, &[("k", "v")]).requests_per_unit, u64::from(u32::MAX));
}

#[test]
fn flags_and_metadata() {
    let domain = parse(
        "domain: d
descriptors:
  - key: k
    shadow_mode: true
    quota_mode: True
    detailed_metric: false
    value_to_metric: TRUE
    share_threshold: false
    metadata:
      owner: team-a
      count: 3
      ratio: 0.5
      on: true
      quoted: \"3\"
      nothing: ~
      tags: [a, 1, { nested: yes }]
    rate_limit: { unit: second, requests_per_unit: 1 }
  - key: empty
    rate_limit:
    descriptors:
",
    );
    let rule = &domain.rules[0];
    assert!(rule.shadow_mode && rule.quota_mode && rule.value_to_metric);
    assert!(!rule.detailed_metric && !rule.share_threshold);
    assert_eq!(
        rule.metadata,
        Some(json!({
            "owner": "team-a",
            "count": 3,
            "ratio": 0.5,
            "on": true,
            "quoted": "3",
            "nothing": null,
            "tags": ["a", 1, { "nested": "yes" }],
        }))
    );
    // Null values are absent keys.
    let empty = &domain.rules[1];
    assert!(empty.limits.is_empty() && empty.children.is_empty() && !empty.unlimited);
    assert_eq!(empty.metadata, None);
}

#[test]
fn empty_descriptors() {
    assert!(parse("domain: d\n").rules.is_empty());
    assert!(parse("domain: d\ndescriptors: []\n").rules.is_empty());
}

// ---------------------------------------------------------------- errors

#[test]
fn error_display() {
    let e = error(&one_limit("{ unit: second, requests_per_unit: 10, leak: 5 }"));
    assert_eq!(
        e.to_string(),
        "t.yaml:4:56: rate_limit.leak: unknown key, expected one of: unit, requests_per_unit, unlimited, name, \
         replaces, algorithm, window, buckets, weighting, burst, epsilon"
    );
    let e = error("domain: [a\n");
    assert_eq!(e.key, None);
    assert!(e.to_string().starts_with("t.yaml:2:1: invalid YAML: "), "{e}");
}

#[test]
fn unknown_keys() {
    assert_error(
        &one_limit("{ unit: second, requests_per_unit: 10, leak: 5 }"),
        4,
        56,
        Some("rate_limit.leak"),
        "unknown key",
    );
    assert_error("domain: d\ncolour: red\n", 2, 1, Some("colour"), "unknown key");
    assert_error(
        "domain: d\ndescriptors:\n  - key: k\n    limit: 3\n",
        4,
        5,
        Some("limit"),
        "expected one of: key, value",
    );
    assert_error(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n      - unit: second\n        per: 3\n",
        6,
        9,
        Some("rate_limits[0].per"),
        "unknown key",
    );
    assert_error(
        "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        valeu: x\n",
        6,
        9,
        Some("valeu"),
        "unknown key",
    );
    assert_error(
        &one_limit("{ unit: second, requests_per_unit: 1, name: a, replaces: [{ name: a, why: no }] }"),
        4,
        86,
        Some("rate_limit.replaces[0].why"),
        "unknown key, expected one of: name",
    );
}

#[test]
fn bad_values() {
    assert_error(
        &one_limit("{ unit: fortnight, requests_per_unit: 1 }"),
        4,
        25,
        Some("rate_limit.unit"),
        "unknown unit `fortnight`",
    );
    assert_error(
        &one_limit("{ unit: second, requests_per_unit: -5 }"),
        4,
        52,
        Some("rate_limit.requests_per_unit"),
        "must not be negative",
    );
    assert_error(
        &one_limit("{ unit: second, requests_per_unit: \"ten\" }"),
        4,
        52,
        Some("rate_limit.requests_per_unit"),
        "expected a non-negative integer, found the quoted string \"ten\"",
    );
    assert_error(
        &one_limit("{ unit: second, requests_per_unit: ten }"),
        4,
        52,
        Some("rate_limit.requests_per_unit"),
        "expected a non-negative integer, found `ten`",
    );
    assert_error(
        &one_limit("{ unit: second, requests_per_unit: \"10\" }"),
        4,
        52,
        Some("rate_limit.requests_per_unit"),
        "quoted string",
    );
    assert_error(
        &one_limit("{ unit: second, requests_per_unit: 1.5 }"),
        4,
        52,
        Some("rate_limit.requests_per_unit"),
        "non-negative integer",
    );
    assert_error(
        &one_limit("{ unit: second, requests_per_unit: 4294967296 }"),
        4,
        52,
        Some("rate_limit.requests_per_unit"),
        "out of range: at most 4294967295",
    );
    assert_error(
        &one_limit("{ unit: second, requests_per_unit: [1] }"),
        4,
        52,
        Some("rate_limit.requests_per_unit"),
        "found a list",
    );
    assert_error(
        &one_limit("{ unit: second, requests_per_unit: 1, buckets: 1 }"),
        4,
        64,
        Some("rate_limit.buckets"),
        "invalid buckets `1`: must be between 2 and 65536",
    );
    assert_error(
        &one_limit("{ unit: second, requests_per_unit: 1, buckets: 65537 }"),
        4,
        64,
        Some("rate_limit.buckets"),
        "must be between 2 and 65536",
    );
    assert_error(
        &one_limit("{ unit: second, requests_per_unit: 1, algorithm: nope }"),
        4,
        66,
        Some("rate_limit.algorithm"),
        "unknown algorithm `nope`, expected one of: sliding_window, fixed_window",
    );
    assert_error(
        &one_limit("{ unit: second, requests_per_unit: 1, algorithm: gcra, burst: 0 }"),
        4,
        79,
        Some("rate_limit.burst"),
        "invalid burst `0`: must be at least 1",
    );
    assert_error(
        &one_limit("{ unit: second, requests_per_unit: 1, algorithm: gcra, burst: -2 }"),
        4,
        79,
        Some("rate_limit.burst"),
        "must not be negative",
    );
    assert_error(
        &one_limit("{ unit: second, requests_per_unit: 1, algorithm: exponential_histogram, epsilon: 1.5 }"),
        4,
        98,
        Some("rate_limit.epsilon"),
        "invalid epsilon `1.5`: must be at least 0.000001 and below 1",
    );
    assert_error(
        &one_limit("{ unit: second, requests_per_unit: 1, algorithm: exponential_histogram, epsilon: \"0.1\" }"),
        4,
        98,
        Some("rate_limit.epsilon"),
        "expected a number, found the quoted string \"0.1\"",
    );
    assert_error(
        &one_limit("{ unit: second, requests_per_unit: 1, algorithm: exponential_histogram, epsilon: often }"),
        4,
        98,
        Some("rate_limit.epsilon"),
        "expected a number",
    );
    assert_error(
        &one_limit("{ unit: second, requests_per_unit: 1, weighting: both }"),
        4,
        66,
        Some("rate_limit.weighting"),
        "unknown weighting `both`",
    );
    assert_error(
        &one_limit("{ window: 30, requests_per_unit: 1 }"),
        4,
        27,
        Some("rate_limit.window"),
        "invalid duration `30`: missing unit",
    );
    assert_error(
        &one_limit("{ window: 0s, requests_per_unit: 1 }"),
        4,
        27,
        Some("rate_limit.window"),
        "must be longer than zero",
    );
    assert_error(
        "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: yes\n",
        4,
        18,
        Some("shadow_mode"),
        "expected true or false, found `yes`",
    );
    assert_error(
        "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: \"true\"\n",
        4,
        18,
        Some("shadow_mode"),
        "expected true or false",
    );
    assert_error(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: [1]\n",
        4,
        17,
        Some("rate_limit"),
        "expected a map, found a list",
    );
    assert_error(
        "domain: d\ndescriptors:\n  - key: k\n    metadata: 3\n",
        4,
        15,
        Some("metadata"),
        "expected a map",
    );
    assert_error(
        "domain: d\ndescriptors: {}\n",
        2,
        14,
        Some("descriptors"),
        "expected a list",
    );
    assert_error(
        "domain: d\ndescriptors:\n  - k\n",
        3,
        5,
        Some("descriptors"),
        "expected a map with `key`",
    );
    assert_error("domain: [d]\n", 1, 9, Some("domain"), "expected a string, found a list");
    assert_error(
        "domain: d\ndescriptors:\n  - key: k\n    value: [x]\n",
        4,
        12,
        Some("value"),
        "expected a string",
    );
}

#[test]
fn contradictions() {
    assert_error(
        &one_limit("{ unit: second, window: 30s, requests_per_unit: 1 }"),
        4,
        33,
        Some("rate_limit.window"),
        "`unit` and `window` cannot both be given",
    );
    assert_error(
        &one_limit("{ unlimited: true, unit: second }"),
        4,
        36,
        Some("rate_limit.unit"),
        "cannot be combined with `unlimited: true`",
    );
    assert_error(
        &one_limit("{ unlimited: true, window: 5m }"),
        4,
        36,
        Some("rate_limit.window"),
        "cannot be combined",
    );
    assert_error(
        &one_limit("{ requests_per_unit: 3 }"),
        4,
        17,
        Some("rate_limit.unit"),
        "missing",
    );
    assert_error(
        &one_limit("{ unit: second, requests_per_unit: 1, algorithm: gcra, buckets: 4 }"),
        4,
        72,
        Some("rate_limit.buckets"),
        "applies only to algorithm sliding_window, not gcra",
    );
    assert_error(
        &one_limit("{ unit: second, requests_per_unit: 1, burst: 3 }"),
        4,
        55,
        Some("rate_limit.burst"),
        "`burst` applies only to algorithm gcra, not sliding_window",
    );
    assert_error(
        &one_limit("{ unit: second, requests_per_unit: 1, algorithm: sliding_log, epsilon: 0.1 }"),
        4,
        79,
        Some("rate_limit.epsilon"),
        "`epsilon` applies only to algorithm exponential_histogram, not sliding_log",
    );
    assert_error(
        &one_limit("{ unit: second, requests_per_unit: 1, algorithm: exponential_histogram, burst: 2 }"),
        4,
        89,
        Some("rate_limit.burst"),
        "`burst` applies only to algorithm gcra, not exponential_histogram",
    );
    assert_error(
        &one_limit("{ unlimited: true, burst: 2 }"),
        4,
        36,
        Some("rate_limit.burst"),
        "cannot be combined with `unlimited: true`",
    );
    assert_error(
        &one_limit("{ unit: second, requests_per_unit: 1, weighting: interpolated, algorithm: sliding_log }"),
        4,
        55,
        Some("rate_limit.weighting"),
        "applies only to algorithm sliding_window",
    );
    assert_error(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unlimited: true }\n    rate_limits: [{ unit: second, requests_per_unit: 1 }]\n",
        4,
        5,
        Some("rate_limit"),
        "`unlimited: true` cannot be combined with other limits",
    );
}

#[test]
fn structure_errors() {
    assert_error("descriptors: []\n", 1, 1, Some("domain"), "missing");
    assert_error("domain: ''\n", 1, 9, Some("domain"), "must not be empty");
    assert_error("domain:\n", 1, 1, Some("domain"), "missing");
    assert_error("{}", 1, 1, Some("domain"), "missing");
    assert_error("", 1, 1, None, "empty file: expected a mapping with `domain`");
    assert_error(
        "# nothing\n\n",
        1,
        1,
        None,
        "empty file: expected a mapping with `domain`",
    );
    assert_error("- domain: d\n", 1, 1, None, "expected a mapping with `domain`");
    assert_error("just text\n", 1, 1, None, "expected a mapping with `domain`");
    assert_error(
        "domain: d\ndescriptors:\n  - value: v\n    rate_limit: { unit: second, requests_per_unit: 1 }\n",
        3,
        5,
        Some("key"),
        "missing",
    );
    assert_error(
        "domain: d\ndescriptors:\n  - key: \"\"\n",
        3,
        10,
        Some("key"),
        "must not be empty",
    );
}

#[test]
fn yaml_syntax_errors() {
    assert_error(
        "domain: d\ndescriptors:\n  - key: x\n   value: y\n",
        4,
        9,
        None,
        "invalid YAML: ",
    );
    assert_error("domain: 'd\n", 1, 9, None, "invalid YAML: ");
    assert_error("domain: !!str d\n", 1, 15, None, "tags");
    assert_error(
        "domain: d\n  x: y\n",
        2,
        4,
        None,
        "invalid YAML: mapping values are not allowed",
    );
    assert_error("domain: d\n? [a]\n: b\n", 2, 3, None, "a key must be a string");
}

#[test]
fn crlf_and_byte_order_mark() {
    let text = std::fs::read_to_string(data("edge_proxy.yaml")).unwrap();
    let crlf = format!("\u{feff}{}", text.replace('\n', "\r\n"));
    assert_eq!(parse(&crlf), edge_proxy());
    assert_error(
        "\u{feff}domain: d\r\ndescriptors:\r\n  - key: k\r\n    rate_limit: { unit: eon, requests_per_unit: 1 }\r\n",
        4,
        25,
        Some("rate_limit.unit"),
        "unknown unit `eon`",
    );
}

#[test]
fn duplicate_keys() {
    assert_error(
        "domain: d\ndomain: e\n",
        2,
        1,
        Some("domain"),
        "duplicate key, first at line 1 column 1",
    );
    assert_error(
        &one_limit("{ unit: second, unit: minute, requests_per_unit: 1 }"),
        4,
        33,
        Some("unit"),
        "duplicate key, first at line 4 column 19",
    );
}

#[test]
fn duplicate_descriptors() {
    assert_error(
        "domain: d
descriptors:
  - key: a
    value: x
  - key: b
  - key: a
    value: x
",
        6,
        5,
        Some("key"),
        "duplicate descriptor `a` with value `x` at line 6, first defined at line 3",
    );
    assert_error(
        "domain: d\ndescriptors:\n  - key: a\n  - key: a\n",
        4,
        5,
        Some("key"),
        "duplicate descriptor `a` without value at line 4, first defined at line 3",
    );
    // The same key and value at different levels or under different
    // parents is fine.
    parse(
        "domain: d
descriptors:
  - key: a
    descriptors:
      - key: a
  - key: b
    descriptors:
      - key: a
  - key: a
    value: x
",
    );
    assert_error(
        "domain: d
descriptors:
  - key: a
    descriptors:
      - { key: b, value: '1*' }
      - { key: b, value: '1*' }
",
        6,
        9,
        Some("key"),
        "first defined at line 5",
    );
}

#[test]
fn limit_names() {
    // A name used later in the file is known.
    let config = Config::parse(
        "t.yaml",
        "domain: d
descriptors:
  - key: a
    rate_limit: { unit: second, requests_per_unit: 1, replaces: [{ name: later }] }
  - key: b
    rate_limit: { name: later, unit: second, requests_per_unit: 1 }
",
    )
    .unwrap();
    assert_eq!(config.warnings(), []);
    assert_error(
        &one_limit("{ name: n, unit: second, requests_per_unit: 1, replaces: [{ name: n }] }"),
        4,
        64,
        Some("rate_limit.replaces"),
        "a limit cannot replace itself",
    );
    assert_error(
        &one_limit("{ unit: second, requests_per_unit: 1, replaces: [{ name: '' }] }"),
        4,
        74,
        Some("rate_limit.replaces[0].name"),
        "must not be empty",
    );
    assert_error(
        &one_limit("{ unit: second, requests_per_unit: 1, replaces: [{}] }"),
        4,
        66,
        Some("rate_limit.replaces[0].name"),
        "missing",
    );
    assert_error(
        &one_limit("{ unit: second, requests_per_unit: 1, replaces: [n] }"),
        4,
        66,
        Some("rate_limit.replaces[0]"),
        "expected a map with `name`",
    );
}

#[test]
fn unlimited_may_have_a_name() {
    // As upstream: accepted, and an unlimited descriptor is never counted.
    let domain = parse(
        "domain: d
descriptors:
  - key: a
    rate_limit: { unlimited: true, name: free, replaces: [{ name: paid }] }
  - key: b
    rate_limit: { name: paid, unit: second, requests_per_unit: 1, replaces: [{ name: free }] }
",
    );
    assert!(domain.rules[0].unlimited && domain.rules[0].limits.is_empty());
}

#[test]
fn depth_limit() {
    let mut text = String::from("domain: d\ndescriptors:\n");
    for _ in 0..65 {
        text.push_str("- key: k\n  descriptors:\n");
    }
    // Flow style keeps the indentation small.
    let mut flow = String::from("domain: d\ndescriptors: ");
    for _ in 0..65 {
        flow.push_str("[{key: k, descriptors: ");
    }
    flow.push_str("[]");
    for _ in 0..65 {
        flow.push_str("}]");
    }
    let e = error(&flow);
    assert_eq!(e.key.as_deref(), Some("descriptors"), "{e}");
    assert!(e.message.contains("nested more than 64 levels"), "{e}");
    let mut ok = String::from("domain: d\ndescriptors: ");
    for _ in 0..64 {
        ok.push_str("[{key: k, descriptors: ");
    }
    ok.push_str("[]");
    for _ in 0..64 {
        ok.push_str("}]");
    }
    let domain = parse(&ok);
    let entries = vec![("k", "v"); 64];
    assert!(domain.find(&entries).is_some());
    assert!(domain.find(&vec![("k", "v"); 65]).is_none());
}

#[test]
fn hostile_nesting_is_an_error_not_a_crash() {
    // Runs on a test thread (2 MiB of stack) on purpose.
    let deep = format!("domain: d\nx:\n  {}x\n", "- ".repeat(100_000));
    assert_error(&deep, 3, 129, None, "indented too deeply");
    let deep = format!(
        "domain: d\nx:\n{}",
        (0..100_000)
            .map(|i| format!("{}-\n", " ".repeat(i % 200)))
            .collect::<String>()
    );
    assert_error(&deep, 131, 129, None, "indented too deeply");
    let cr = format!(
        "domain: d\rx:\r{}",
        (0..300).map(|i| format!("{}-\r", " ".repeat(i))).collect::<String>()
    );
    assert_error(&cr, 1, 129, None, "indented too deeply");
    // The deepest nesting allowed: two levels per column, then flow.
    let mut text = String::from("domain: d\nmetadata:\n");
    for i in 0..128 {
        text.push_str(&format!("{}k:\n{}-\n", " ".repeat(i), " ".repeat(i)));
    }
    text.push_str(&" ".repeat(128));
    text.push_str(&"[".repeat(255));
    text.push_str(&"]".repeat(255));
    text.push('\n');
    let e = error(&text);
    assert_eq!((e.line, e.column), (2, 1), "{e}");
    let metadata = format!(
        "domain: d\ndescriptors: [{{key: k, metadata: {{a: {}{}}}}}]\n",
        "[".repeat(40),
        "]".repeat(40)
    );
    assert_error(&metadata, 2, 70, Some("metadata"), "nested more than 32 levels");
}

#[test]
fn no_input_panics() {
    // Every prefix of the example, and the example with bytes changed,
    // give a domain or an error.
    let text = std::fs::read_to_string(data("edge_proxy.yaml")).unwrap();
    for end in (0..=text.len()).filter(|&i| text.is_char_boundary(i)) {
        let _ = Config::parse_domain("t.yaml", &text[..end]);
    }
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let alphabet = b" -:{}[],'\"*&!#?|>\n\t0a~.";
    for _ in 0..3000 {
        let mut bytes = text.clone().into_bytes();
        for _ in 0..(next() % 4 + 1) {
            let at = (next() % bytes.len() as u64) as usize;
            bytes[at] = alphabet[(next() % alphabet.len() as u64) as usize];
        }
        if let Ok(mutated) = String::from_utf8(bytes) {
            let _ = Config::parse_domain("t.yaml", &mutated);
        }
    }
}

// ------------------------------------- loaded as envoyproxy/ratelimit loads

/// The one domain of `text` and the warnings it loads with.
fn warned(text: &str) -> (Domain, Vec<ConfigWarning>) {
    let config = Config::parse("t.yaml", text).unwrap_or_else(|e| panic!("{e}"));
    let domain = config.domains().next().expect("one domain").clone();
    (domain, config.warnings().to_vec())
}

/// Asserts a warning's position, key and that its message contains `what`.
#[track_caller]
fn assert_warning(warning: &ConfigWarning, line: usize, column: usize, key: &str, what: &str) {
    assert_eq!(
        (
            warning.file.as_str(),
            warning.line,
            warning.column,
            warning.key.as_deref()
        ),
        ("t.yaml", line, column, Some(key)),
        "{warning}"
    );
    assert!(warning.message.contains(what), "{warning} does not say {what:?}");
}

#[test]
fn a_replaces_naming_no_limit_is_a_warning() {
    let (domain, warnings) = warned(
        "domain: d
descriptors:
  - key: a
    rate_limit: { name: n, unit: second, requests_per_unit: 1, replaces: [{ name: ghost }] }
",
    );
    assert_eq!(limit(&domain, &[("a", "1")]).replaces, ["ghost"]);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(
        warnings[0].to_string(),
        "t.yaml:4:83: rate_limit.replaces[0].name: no limit of this domain is named `ghost`, so this entry \
         replaces nothing (probably a mistake)"
    );
    // `Config::parse_domain` loads it too, without the warnings.
    assert_eq!(parse("domain: d\ndescriptors: [{ key: a, rate_limit: { unit: second, requests_per_unit: 1, replaces: [{ name: x }] } }]\n").rules.len(), 1);
}

#[test]
fn a_limit_name_used_twice_is_a_warning() {
    let (domain, warnings) = warned(
        "domain: d
descriptors:
  - key: a
    rate_limit: { name: n, unit: second, requests_per_unit: 1 }
    descriptors:
      - key: b
        rate_limits: [{ name: n, unit: second, requests_per_unit: 2 }]
  - key: c
    rate_limit: { name: n, unit: minute, requests_per_unit: 3 }
",
    );
    assert_eq!(limit(&domain, &[("a", "1")]).name.as_deref(), Some("n"));
    assert_eq!(limit(&domain, &[("a", "1"), ("b", "2")]).name.as_deref(), Some("n"));
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert_warning(
        &warnings[0],
        7,
        31,
        "rate_limits[0].name",
        "limit name `n` is also used at line 4 column 25: a `replaces` of `n` drops every limit of that name",
    );
    assert_warning(&warnings[1], 9, 25, "rate_limit.name", "also used at line 4 column 25");
}

#[test]
fn a_replaces_of_a_name_used_twice_drops_every_limit_of_that_name() {
    use slidegate_core::ManualClock;
    use slidegate_memory::Budget;
    use slidegate_server::engine::{Code, Descriptor, Engine, InputLimits, Request};
    let config = Config::parse(
        "t.yaml",
        "domain: d
descriptors:
  - key: a
    rate_limit: { name: shared, unit: minute, requests_per_unit: 0 }
  - key: b
    rate_limit: { name: shared, unit: minute, requests_per_unit: 0 }
  - key: c
    rate_limit: { replaces: [{ name: shared }], unit: minute, requests_per_unit: 5 }
",
    )
    .unwrap();
    assert_eq!(config.warnings().len(), 1);
    let engine = Engine::new(
        config,
        ManualClock::new(0),
        Budget::keys(64),
        Budget::keys(64),
        InputLimits::default(),
    );
    let descriptor = |key: &str| Descriptor {
        entries: vec![(key.to_owned(), "x".to_owned())],
        ..Descriptor::default()
    };
    let request = |keys: &[&str]| Request {
        domain: "d".to_owned(),
        descriptors: keys.iter().map(|k| descriptor(k)).collect(),
        ..Request::default()
    };
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let decide = |keys: &[&str]| runtime.block_on(engine.decide(&request(keys))).unwrap();
    // Alone, each limit of 0 refuses.
    assert_eq!(decide(&["a"]).overall, Code::OverLimit);
    assert_eq!(decide(&["b"]).overall, Code::OverLimit);
    // With `c`, both limits called `shared` are dropped.
    let answer = decide(&["a", "b", "c"]);
    assert_eq!(answer.overall, Code::Ok);
    assert!(answer.statuses[0].applied.is_empty() && answer.statuses[1].applied.is_empty());
    assert_eq!(answer.statuses[2].applied.len(), 1);
}

#[test]
fn requests_per_unit_beside_unlimited_is_a_warning() {
    let (domain, warnings) = warned(&one_limit("{ requests_per_unit: 3, unlimited: true }"));
    let m = domain.find(&[("k", "v")]).unwrap();
    assert!(m.rule.unlimited && m.rule.limits.is_empty());
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(
        warnings[0].to_string(),
        "t.yaml:4:19: rate_limit.requests_per_unit: ignored: a limit with `unlimited: true` counts nothing"
    );
    // A unit is refused, as upstream refuses it; so are slidegate's own
    // keys, which only a counted limit has.
    assert_error(
        "domain: d
descriptors:
  - key: k
    rate_limit:
      unlimited: true
      unit: hour
      requests_per_unit: 7
",
        6,
        7,
        Some("rate_limit.unit"),
        "cannot be combined with `unlimited: true`",
    );
    let (_, quiet) = warned(&one_limit("{ unlimited: true, requests_per_unit: 0 }"));
    assert_eq!(quiet.len(), 1, "a 0 is still a number that does nothing");
    let (_, none) = warned(&one_limit("{ unlimited: true }"));
    assert_eq!(none, []);
}

#[test]
fn a_rate_limit_without_requests_per_unit_is_a_limit_of_0() {
    let (domain, warnings) = warned("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n");
    let l = limit(&domain, &[("k", "v")]);
    assert_eq!(
        (l.requests_per_unit, l.unit, l.policy, l.quota.is_none()),
        (0, Some(Unit::Second), None, true)
    );
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_warning(
        &warnings[0],
        5,
        7,
        "rate_limit.requests_per_unit",
        "missing: read as 0, which refuses every request",
    );
    // In a list, with slidegate's `window`, and with a name that replaces.
    let (domain, warnings) = warned(
        "domain: d
descriptors:
  - key: k
    rate_limits:
      - { window: 10s }
      - { name: b, unit: minute, requests_per_unit: 1 }
  - key: j
    rate_limit: { name: a, replaces: [{ name: b }], unit: day }
",
    );
    let m = domain.find(&[("k", "v")]).unwrap();
    assert_eq!(m.rule.limits[0].requests_per_unit, 0);
    assert_eq!(m.rule.limits[0].window, Duration::from_secs(10));
    assert_eq!(limit(&domain, &[("j", "v")]).replaces, ["b"]);
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert_warning(&warnings[0], 5, 9, "rate_limits[0].requests_per_unit", "missing");
    assert_warning(&warnings[1], 8, 17, "rate_limit.requests_per_unit", "missing");
    // Without a unit it is still refused, as upstream refuses it.
    assert_error(
        &one_limit("{ requests_per_unit: 3 }"),
        4,
        17,
        Some("rate_limit.unit"),
        "missing",
    );
}

#[test]
fn share_threshold_needs_a_wildcard() {
    assert_error(
        "domain: d
descriptors:
  - key: path
    value: /static/logo.png
    share_threshold: true
    rate_limit: { unit: second, requests_per_unit: 1 }
",
        5,
        5,
        Some("share_threshold"),
        "can only be used with a wildcard value (containing `*`), found the value `/static/logo.png`",
    );
    assert_error(
        "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - { key: b, share_threshold: true }\n",
        5,
        19,
        Some("share_threshold"),
        "found no value",
    );
    // `false` needs nothing; a `*` anywhere in the value is a wildcard.
    parse("domain: d\ndescriptors:\n  - { key: a, value: exact, share_threshold: false }\n");
    let domain = parse("domain: d\ndescriptors:\n  - { key: a, value: 'v*1', share_threshold: true }\n");
    assert!(domain.rules[0].share_threshold);
}

#[test]
fn a_clean_config_has_no_warnings() {
    let config = Config::load(&[data("edge_proxy.yaml")]).unwrap();
    assert_eq!(config.warnings(), []);
}

// ---------------------------------------------------------------- files

#[test]
fn load_a_directory() {
    let dir = TempDir::new("two");
    dir.write(
        "b.yml",
        "domain: beta\ndescriptors: [{ key: k, rate_limit: { unit: second, requests_per_unit: 2 } }]\n",
    );
    dir.write("a.yaml", "domain: alpha\n");
    dir.write("README.txt", "not YAML: [\n");
    dir.write(".hidden.yaml", "not: [valid\n");
    std::fs::create_dir(dir.0.join("nested.yaml")).unwrap();
    std::fs::create_dir(dir.0.join("sub")).unwrap();
    dir.write("sub/c.yaml", "domain: gamma\n");
    let config = Config::load(std::slice::from_ref(&dir.0)).unwrap();
    let names: Vec<&str> = config.domains().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["alpha", "beta"]);
    assert_eq!(config.domain("beta").unwrap().rules[0].limits[0].requests_per_unit, 2);
    assert!(config.domain("gamma").is_none());

    // A directory and a file together.
    let config = Config::load(&[dir.0.clone(), data("edge_proxy.yaml")]).unwrap();
    assert_eq!(config.domains().count(), 3);
    assert!(config.domain("edge_proxy").is_some());
}

#[test]
fn load_errors() {
    let dir = TempDir::new("dup");
    let first = dir.write("1.yaml", "domain: same\n");
    let second = dir.write("2.yaml", "# again\ndomain:   same\n");
    let e = Config::load(std::slice::from_ref(&dir.0)).unwrap_err();
    assert_eq!(
        (e.file.as_str(), e.line, e.column, e.key.as_deref()),
        (second.display().to_string().as_str(), 2, 11, Some("domain")),
        "{e}"
    );
    assert!(e.message.contains(&first.display().to_string()), "{e}");

    let bad = dir.write("3.yaml", "domain: x\nnope: 1\n");
    let e = Config::load(std::slice::from_ref(&bad)).unwrap_err();
    assert_eq!((e.file, e.line, e.column), (bad.display().to_string(), 2, 1));

    let missing = dir.0.join("missing.yaml");
    let e = Config::load(std::slice::from_ref(&missing)).unwrap_err();
    assert_eq!(
        (e.file, e.line, e.column, e.key),
        (missing.display().to_string(), 0, 0, None)
    );
    assert!(e.message.contains("cannot read"), "{}", e.message);

    // A folder without a config file serves no limit: an error naming it,
    // unless allowed.
    let empty = TempDir::new("empty");
    let e = Config::load(std::slice::from_ref(&empty.0)).unwrap_err();
    assert_eq!((e.file, e.line), (empty.0.display().to_string(), 0));
    assert!(e.message.starts_with("no config file in this folder"), "{}", e.message);
    let allowed = LoadOptions::default().allow_empty_folders(true);
    assert_eq!(
        Config::load_with(std::slice::from_ref(&empty.0), &allowed)
            .unwrap()
            .domains()
            .count(),
        0
    );
    assert_eq!(Config::load(&[]).unwrap().domains().count(), 0);
}

#[test]
fn from_domains() {
    let a = parse("domain: a\n");
    let config = Config::from_domains(vec![a.clone(), parse("domain: b\n")]).unwrap();
    assert_eq!(config.domains().count(), 2);
    assert_eq!(config.domain("a"), Some(&a));
    let e = Config::from_domains(vec![a.clone(), a]).unwrap_err();
    assert_eq!(e.key.as_deref(), Some("domain"));
    assert!(e.message.contains("`a`"), "{e}");
    assert_eq!(Config::default().domains().count(), 0);
}

#[test]
fn metric_keys_as_envoyproxy_ratelimit_names_its_stats() {
    let d = edge_proxy();
    let key = |entries: &[(&str, &str)]| d.find(entries).unwrap().metric_key(entries);
    // A rule without a value hides the request's value: no label per client.
    assert_eq!(key(&[("remote_address", "10.0.0.1")]), "remote_address");
    assert_eq!(key(&[("remote_address", "50.0.0.5")]), "remote_address_50.0.0.5");
    assert_eq!(
        key(&[("message_type", "marketing"), ("to_number", "123")]),
        "message_type_marketing.to_number"
    );
    assert_eq!(key(&[("path", "/files/a")]), "path_/files/*");

    let d = parse(
        "domain: m
descriptors:
  - key: user
    value_to_metric: true
    rate_limit: { unit: second, requests_per_unit: 1 }
  - key: tenant
    descriptors:
      - key: route
        detailed_metric: true
        rate_limit: { unit: second, requests_per_unit: 1 }
",
    );
    let key = |entries: &[(&str, &str)]| d.find(entries).unwrap().metric_key(entries);
    assert_eq!(key(&[("user", "alice")]), "user_alice");
    assert_eq!(key(&[("tenant", "t1"), ("route", "/a")]), "tenant_t1.route_/a");
}

// ---------------------------------------------------------------- merging

fn merging() -> LoadOptions {
    LoadOptions::default().merge_domains(true)
}

#[test]
fn without_merging_a_domain_in_two_files_is_an_error() {
    for e in [
        Config::load(&[data("merge")]).unwrap_err(),
        Config::load_with(&[data("merge")], &LoadOptions::default()).unwrap_err(),
    ] {
        let second = data("merge/2-search.yaml").display().to_string();
        assert_eq!(
            (e.file.as_str(), e.line, e.column, e.key.as_deref()),
            (second.as_str(), 2, 9, Some("domain")),
            "{e}"
        );
        let first = data("merge/1-checkout.yaml").display().to_string();
        assert_eq!(
            e.message,
            format!(
                "domain `shop` is already defined in {first}; to join the files of one domain, \
                 give --merge-domain-config (MERGE_DOMAIN_CONFIG=true)"
            )
        );
    }
}

#[test]
fn merging_joins_the_files_of_a_domain_in_load_order() {
    let config = Config::load_with(&[data("merge")], &merging()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(config.domains().count(), 2);
    let shop = config.domain("shop").unwrap();
    let rules: Vec<(&str, Option<&str>)> = shop
        .rules
        .iter()
        .map(|r| (r.key.as_str(), r.value.as_ref().map(ValuePattern::as_str)))
        .collect();
    assert_eq!(
        rules,
        [
            ("route", Some("/checkout/*")),
            ("tenant", None),
            ("route", Some("/search")),
            ("route", Some("/*"))
        ]
    );
    // The first wildcard in load order wins, across files.
    assert_eq!(
        limit(shop, &[("route", "/checkout/7")]).name.as_deref(),
        Some("checkout")
    );
    assert_eq!(limit(shop, &[("route", "/search")]).requests_per_unit, 8);
    assert_eq!(limit(shop, &[("route", "/help")]).requests_per_unit, 50);
    assert_eq!(
        limit(shop, &[("tenant", "t1"), ("plan", "trial")]).unit,
        Some(Unit::Hour)
    );
    // A `replaces` may name a limit of another file of the domain.
    assert_eq!(config.warnings(), []);

    let file = |name: &str| data(name).display().to_string();
    let files: Vec<&str> = config.files_of("shop").collect();
    assert_eq!(files, [file("merge/1-checkout.yaml"), file("merge/2-search.yaml")]);
    assert_eq!(config.file_of("shop"), Some(file("merge/1-checkout.yaml").as_str()));
    assert_eq!(
        config.rule_file("shop", 1),
        Some(file("merge/1-checkout.yaml").as_str())
    );
    assert_eq!(config.rule_file("shop", 2), Some(file("merge/2-search.yaml").as_str()));
    assert_eq!(config.rule_file("shop", 4), None);
    assert_eq!(
        config.rule_file("back_office", 0),
        Some(file("merge/3-other.yaml").as_str())
    );
    assert_eq!(config.files_of("nowhere").count(), 0);
    // Positions stay those of each file.
    assert_eq!((shop.rules[2].line, shop.rules[2].column), (4, 5));
}

#[test]
fn merged_files_may_not_define_one_top_level_descriptor_twice() {
    let e = Config::load_with(&[data("merge"), data("merge_clash.yaml")], &merging()).unwrap_err();
    let clash = data("merge_clash.yaml").display().to_string();
    assert_eq!(
        (e.file.as_str(), e.line, e.column, e.key.as_deref()),
        (clash.as_str(), 7, 5, Some("key")),
        "{e}"
    );
    let first = data("merge/1-checkout.yaml").display().to_string();
    assert_eq!(
        e.message,
        format!(
            "duplicate descriptor `tenant` without value in domain `shop`, first defined in {first} at line 7 \
             (merged files may not define one top-level descriptor twice)"
        )
    );
    // The same file twice clashes at its first descriptor.
    let one = data("merge/3-other.yaml");
    let e = Config::load_with(&[one.clone(), one], &merging()).unwrap_err();
    assert_eq!((e.line, e.column), (3, 5), "{e}");
    assert!(
        e.message
            .contains("duplicate descriptor `user` without value in domain `back_office`"),
        "{e}"
    );
    // Below the top level, two files never meet: their parents differ.
    let dir = TempDir::new("merge-nested");
    dir.write(
        "a.yaml",
        "domain: m\ndescriptors:\n  - { key: p, value: a, descriptors: [{ key: c }] }\n",
    );
    dir.write(
        "b.yaml",
        "domain: m\ndescriptors:\n  - { key: p, value: b, descriptors: [{ key: c }] }\n",
    );
    let config = Config::load_with(std::slice::from_ref(&dir.0), &merging()).unwrap();
    assert_eq!(config.domain("m").unwrap().rules.len(), 2);
}

#[test]
fn limit_names_are_checked_across_merged_files() {
    let dir = TempDir::new("merge-names");
    dir.write(
        "a.yaml",
        "domain: m\ndescriptors:\n  - key: a\n    rate_limit: { name: n, unit: second, requests_per_unit: 1 }\n",
    );
    let b = dir.write(
        "b.yaml",
        "domain: m
descriptors:
  - key: b
    rate_limit: { name: n, unit: second, requests_per_unit: 1, replaces: [{ name: gone }] }
",
    );
    let config = Config::load_with(std::slice::from_ref(&dir.0), &merging()).unwrap();
    let warnings = config.warnings();
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    let a = dir.0.join("a.yaml").display().to_string();
    let b = b.display().to_string();
    assert_eq!(
        warnings[0].to_string(),
        format!(
            "{b}:4:25: rate_limit.name: limit name `n` is also used in {a} at line 4 column 25: a `replaces` of `n` \
             drops every limit of that name"
        )
    );
    assert_eq!((warnings[1].file.as_str(), warnings[1].line), (b.as_str(), 4));
    assert!(warnings[1].message.contains("`gone`"), "{}", warnings[1]);
}

// ---------------------------------------------------------------- anchors

#[test]
fn anchors_aliases_and_merge_keys() {
    let config = Config::load(&[data("anchors.yaml")]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(config.warnings(), []);
    let mail = config.domain("mail").unwrap();
    let sender = limit(mail, &[("sender", "a")]);
    let recipient = limit(mail, &[("recipient", "b")]);
    // The same limit, named apart in the headers after their keys.
    assert_eq!(
        (sender.header_name.as_str(), recipient.header_name.as_str()),
        ("sender", "recipient")
    );
    let unnamed = |l: &Limit| Limit {
        header_name: String::new(),
        ..l.clone()
    };
    assert_eq!(unnamed(sender), unnamed(recipient));
    assert_eq!((sender.requests_per_unit, sender.unit), (20, Some(Unit::Minute)));
    // A key written beside `<<` wins over the merged one.
    let domain = limit(mail, &[("domain", "example.org")]);
    assert_eq!((domain.requests_per_unit, domain.unit), (200, Some(Unit::Minute)));
    // Of a list, the earlier map wins; the later ones add their keys.
    let large = limit(mail, &[("attachment", "large")]);
    assert_eq!((large.requests_per_unit, large.unit), (20, Some(Unit::Minute)));
    assert_eq!(large.name.as_deref(), Some("large_attachments"));
    assert!(mail.rules[4].shadow_mode);
    // An alias's copy keeps the lines of its anchor.
    let text = "domain: d
descriptors:
  - &one { key: a, value: x }
  - key: b
    descriptors: [*one]
";
    let d = parse(text);
    let copy = &d.rules[1].children[0];
    assert_eq!((copy.key.as_str(), copy.line, copy.column), ("a", 3, 10));
    // Anchors on scalars, and quoted text stays text through an alias.
    let d = parse("domain: &name d\ndescriptors: [{ key: *name, value: &v '10' }, { key: k, value: *v }]\n");
    assert_eq!((d.name.as_str(), d.rules[0].key.as_str()), ("d", "d"));
    assert_eq!(d.rules[1].value, Some(ValuePattern::Exact("10".to_owned())));
    assert_error(
        "domain: d\nlimit: &n '5'\ndescriptors: [{ key: k, rate_limit: { unit: second, requests_per_unit: *n } }]\n",
        2,
        1,
        Some("limit"),
        "unknown key",
    );
    assert_error(
        &one_limit("{ unit: second, requests_per_unit: &n '5' }"),
        4,
        55,
        Some("rate_limit.requests_per_unit"),
        "expected a non-negative integer, found the quoted string \"5\"",
    );
}

#[test]
fn alias_errors() {
    assert_error(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: *missing\n",
        4,
        17,
        None,
        "unknown alias `*missing`: no anchor `&missing` before it",
    );
    // An alias before its anchor is unknown too.
    assert_error(
        "domain: d\ndescriptors: [*later, &later { key: k }]\n",
        2,
        15,
        None,
        "unknown alias `*later`",
    );
    assert_error(
        "domain: d\ndescriptors: &loop [{ key: k, descriptors: *loop }]\n",
        2,
        44,
        None,
        "an alias cannot refer to an anchor that contains it",
    );
    // Duplicate keys are still refused, also through a merge.
    assert_error(
        "domain: d\ndescriptors:\n  - { <<: { key: a }, value: x, value: y }\n",
        3,
        33,
        Some("value"),
        "duplicate key, first at line 3 column 23",
    );
    assert_error(
        "domain: d\ndescriptors:\n  - { <<: { key: a }, <<: { key: b } }\n",
        3,
        23,
        Some("<<"),
        "duplicate key",
    );
    assert_error(
        "domain: d\ndescriptors:\n  - { key: a, <<: [{ value: x }, 3] }\n",
        3,
        34,
        Some("<<"),
        "a merge key needs a map or a list of maps",
    );
    // A quoted `<<` is a key like any other.
    assert_error(
        "domain: d\ndescriptors:\n  - { key: a, '<<': { value: x } }\n",
        3,
        15,
        Some("<<"),
        "unknown key",
    );
}

#[test]
fn a_billion_laughs_is_refused() {
    let mut text = String::from("domain: d\na0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for level in 1..10 {
        let previous = format!("*a{}", level - 1);
        let list = [previous.as_str(); 10].join(", ");
        text.push_str(&format!("a{level}: &a{level} [{list}]\n"));
    }
    let e = error(&text);
    assert_eq!((e.line, e.key.as_deref()), (5, None), "{e}");
    assert_eq!(
        e.message,
        "aliases expand to more than 10000 nodes (at most 10000, or one per byte of the file when that is more)"
    );
    // A larger file may copy as many nodes as it has bytes.
    let mut text = String::from(
        "domain: d\ndescriptors:\n  - &k { key: k0, rate_limit: { unit: second, requests_per_unit: 1 } }\n",
    );
    for i in 1..2000 {
        text.push_str(&format!("  - {{ <<: *k, key: k{i} }}\n"));
    }
    assert!(text.len() > 50_000);
    assert_eq!(parse(&text).rules.len(), 2000);
}

/// A config path that is not a regular file (a FIFO would block the load
/// for ever) and a file over the size limit are refused before they are
/// read, naming the file once, with no line.
#[test]
fn fifos_and_oversized_files_are_refused() {
    use slidegate_server::config::LoadOptions;
    let dir = TempDir::new("special-files");
    let fifo = dir.0.join("pipe.yaml");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let e = Config::load(std::slice::from_ref(&fifo)).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "{}: not a regular file (a config is a YAML file or a folder of them)",
            fifo.display()
        )
    );
    let big = dir.write("big.yaml", "domain: d\ndescriptors: []\n");
    let options = LoadOptions::default().max_file_bytes(10);
    let e = Config::load_with(std::slice::from_ref(&big), &options).unwrap_err();
    assert!(
        e.to_string()
            .ends_with("26 bytes, over the limit of 10 bytes for a config file"),
        "{e}"
    );
    assert_eq!(e.to_string().matches("big.yaml").count(), 1, "{e}");
    assert!(Config::load(std::slice::from_ref(&big)).is_ok());
}

/// What a reload changes, as the log says it: domains and limits added,
/// removed and changed (a new `requests_per_unit` is a change).
#[test]
fn the_changes_between_two_configs() {
    use slidegate_server::config::ConfigChanges;
    let old = Config::parse(
        "a.yaml",
        "domain: a\ndescriptors:\n  - key: k\n    rate_limit: { unit: minute, requests_per_unit: 5 }\n  - key: gone\n    rate_limit: { unit: minute, requests_per_unit: 1 }\n",
    )
    .unwrap();
    let new = Config::parse(
        "a.yaml",
        "domain: a\ndescriptors:\n  - key: k\n    rate_limit: { unit: minute, requests_per_unit: 6 }\n  - key: fresh\n    value: v\n    rate_limit: { unit: hour, requests_per_unit: 1 }\n",
    )
    .unwrap();
    let changes = ConfigChanges::between(&old, &new);
    assert_eq!(changes.limits_added, ["a: fresh=v [0]"]);
    assert_eq!(changes.limits_removed, ["a: gone [0]"]);
    assert_eq!(changes.limits_changed, ["a: k [0]"]);
    assert!(changes.domains_added.is_empty() && changes.domains_removed.is_empty());
    assert_eq!(
        changes.to_string(),
        "+1 limit (a: fresh=v [0]), -1 limit (a: gone [0]), ~1 limit (a: k [0])"
    );
    assert!(ConfigChanges::between(&new, &new).is_empty());
    assert_eq!(ConfigChanges::between(&new, &new).to_string(), "no change");
    let other = Config::parse("b.yaml", "domain: b\ndescriptors: []\n").unwrap();
    assert_eq!(
        ConfigChanges::between(&new, &other).to_string(),
        "+1 domain (b), -1 domain (a), -2 limits (a: fresh=v [0], a: k [0])"
    );
}
