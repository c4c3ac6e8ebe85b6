//! envoyproxy/ratelimit's stats as Envoy Gateway reads them: sent to a
//! statsd server (a UDP socket here) and mapped by Envoy Gateway's
//! `statsd_conf.yaml`, and served on the metrics listener as the statsd
//! exporter embedded in envoyproxy/ratelimit serves them, under the names
//! Envoy Gateway's dashboard and end-to-end tests query.

use regex::Regex;
use slidegate_server::proto::rls::rate_limit_response::Code;
use slidegate_server::server::{MetricsListener, StatsdOptions};
use std::collections::BTreeMap;
use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

mod common;
use common::harness::{Harness, codes, http_get, one, request};

/// Rules of the shapes Envoy Gateway's translator writes: a route's key
/// and value, then its matches, the limit at the leaf.
const CONFIG: &str = "domain: first-listener
descriptors:
  - key: first-route
    value: first-route
    descriptors:
      - key: masked_remote_address
        value: 0.0.0.0/0
        rate_limit: { unit: hour, requests_per_unit: 2 }
  - key: second-route
    value: second-route
    descriptors:
      - key: rule-0-match-0
        value: rule-0-match-0
        descriptors:
          - key: remote_address
            rate_limit: { unit: hour, requests_per_unit: 10 }
  - key: global
    rate_limit: { unit: hour, requests_per_unit: 100 }
";

/// The mapped name and labels of a stat.
type Series = (String, BTreeMap<String, String>);

/// Labels as written: name and value.
type LabelList = &'static [(&'static str, &'static str)];

/// Envoy Gateway's statsd mapping
/// (internal/infrastructure/kubernetes/ratelimit/statsd_conf.yaml in
/// envoyproxy/gateway), transcribed: its glob rules (`*` one field), then
/// its regex rules, each as match, name and labels.
const GLOBS: &[(&str, &str, LabelList)] = &[
    (
        "ratelimit.service.rate_limit.*.*.near_limit",
        "ratelimit_service_rate_limit_near_limit",
        &[("domain", "$1"), ("key1", "$2")],
    ),
    (
        "ratelimit.service.rate_limit.*.*.over_limit",
        "ratelimit_service_rate_limit_over_limit",
        &[("domain", "$1"), ("key1", "$2")],
    ),
    (
        "ratelimit.service.rate_limit.*.*.total_hits",
        "ratelimit_service_rate_limit_total_hits",
        &[("domain", "$1"), ("key1", "$2")],
    ),
    (
        "ratelimit.service.rate_limit.*.*.within_limit",
        "ratelimit_service_rate_limit_within_limit",
        &[("domain", "$1"), ("key1", "$2")],
    ),
    (
        "ratelimit.service.rate_limit.*.*.shadow_mode",
        "ratelimit_service_rate_limit_shadow_mode",
        &[("domain", "$1"), ("key1", "$2")],
    ),
    (
        "ratelimit.service.call.should_rate_limit.*",
        "ratelimit_service_should_rate_limit_error",
        &[("err_type", "$1")],
    ),
    (
        "ratelimit_server.*.total_requests",
        "ratelimit_service_total_requests",
        &[("grpc_method", "$1")],
    ),
    (
        "ratelimit_server.*.response_time",
        "ratelimit_service_response_time_seconds",
        &[("grpc_method", "$1")],
    ),
    (
        "ratelimit.service.config_load_success",
        "ratelimit_service_config_load_success",
        &[],
    ),
    (
        "ratelimit.service.config_load_error",
        "ratelimit_service_config_load_error",
        &[],
    ),
];

const REGEXES: &[(&str, &str)] = &[
    (
        r"ratelimit\.service\.rate_limit\.([^\.]*)\.([^\.]*)\.([^\.]*)(\..*)?\.near_limit",
        "ratelimit_service_rate_limit_near_limit",
    ),
    (
        r"ratelimit\.service\.rate_limit\.([^\.]*)\.([^\.]*)\.([^\.]*)(\..*)?\.over_limit",
        "ratelimit_service_rate_limit_over_limit",
    ),
    (
        r"ratelimit\.service\.rate_limit\.([^\.]*)\.([^\.]*)\.([^\.]*)(\..*)?\.total_hits",
        "ratelimit_service_rate_limit_total_hits",
    ),
    (
        r"ratelimit\.service\.rate_limit\.([^\.]*)\.([^\.]*)\.([^\.]*)(\..*)?\.within_limit",
        "ratelimit_service_rate_limit_within_limit",
    ),
    (
        r"ratelimit\.service\.rate_limit\.([^\.]*)\.([^\.]*)\.([^\.]*)(\..*)?\.shadow_mode",
        "ratelimit_service_rate_limit_shadow_mode",
    ),
];

/// A statsd name mapped as the statsd exporter maps it with Envoy
/// Gateway's file: the first glob rule whose fields match, else the first
/// regex rule found in the name (labels domain, key1, key2); `None` if
/// unmapped.
fn map(name: &str) -> Option<Series> {
    let fields: Vec<&str> = name.split('.').collect();
    for (pattern, metric, labels) in GLOBS {
        let parts: Vec<&str> = pattern.split('.').collect();
        if parts.len() != fields.len() {
            continue;
        }
        let mut captures = Vec::new();
        if parts.iter().zip(&fields).all(|(p, f)| {
            if *p == "*" {
                captures.push(*f);
                true
            } else {
                p == f
            }
        }) {
            let labels = labels
                .iter()
                .map(|(k, v)| {
                    let n: usize = v[1..].parse().unwrap();
                    ((*k).to_owned(), captures[n - 1].to_owned())
                })
                .collect();
            return Some(((*metric).to_owned(), labels));
        }
    }
    for (pattern, metric) in REGEXES {
        if let Some(c) = Regex::new(pattern).unwrap().captures(name) {
            let labels = [("domain", 1), ("key1", 2), ("key2", 3)]
                .into_iter()
                .map(|(k, i)| (k.to_owned(), c[i].to_owned()))
                .collect();
            return Some(((*metric).to_owned(), labels));
        }
    }
    None
}

fn series(metric: &str, labels: &[(&str, &str)]) -> Series {
    (
        metric.to_owned(),
        labels.iter().map(|&(k, v)| (k.to_owned(), v.to_owned())).collect(),
    )
}

/// The rules' series and what the calls of [`calls`] add to them.
fn rule_series(hits: &[(&str, LabelList, u64)]) -> BTreeMap<Series, u64> {
    hits.iter()
        .map(|&(stat, labels, n)| (series(&format!("ratelimit_service_rate_limit_{stat}"), labels), n))
        .collect()
}

const FIRST: LabelList = &[
    ("domain", "first-listener"),
    ("key1", "first-route_first-route"),
    ("key2", "masked_remote_address_0_0_0_0/0"),
];
const SECOND: LabelList = &[
    ("domain", "first-listener"),
    ("key1", "second-route_second-route"),
    ("key2", "rule-0-match-0_rule-0-match-0"),
];
const GLOBAL: LabelList = &[("domain", "first-listener"), ("key1", "global")];

/// Three calls over a limit of 2 on the first route, one on each other
/// rule, one invalid call: six gRPC calls.
async fn calls(h: &mut Harness) {
    let first = one(
        "first-listener",
        &[("first-route", "first-route"), ("masked_remote_address", "0.0.0.0/0")],
    );
    let mut got = Vec::new();
    for _ in 0..3 {
        got.extend(codes(&h.rls(first.clone()).await.unwrap()));
    }
    assert_eq!(got, [Code::Ok, Code::Ok, Code::OverLimit]);
    let second = one(
        "first-listener",
        &[
            ("second-route", "second-route"),
            ("rule-0-match-0", "rule-0-match-0"),
            ("remote_address", "10.0.0.1"),
        ],
    );
    assert_eq!(codes(&h.rls(second).await.unwrap()), [Code::Ok]);
    assert_eq!(
        codes(&h.rls(one("first-listener", &[("global", "x")])).await.unwrap()),
        [Code::Ok]
    );
    assert!(h.rls(request("", Vec::new())).await.is_err());
}

/// What those calls and a good and a bad reload add, by mapped series.
fn expected() -> BTreeMap<Series, u64> {
    let mut want = rule_series(&[
        ("total_hits", FIRST, 3),
        ("within_limit", FIRST, 2),
        ("near_limit", FIRST, 1),
        ("over_limit", FIRST, 1),
        ("total_hits", SECOND, 1),
        ("within_limit", SECOND, 1),
        ("total_hits", GLOBAL, 1),
        ("within_limit", GLOBAL, 1),
    ]);
    want.insert(series("ratelimit_service_config_load_success", &[]), 2);
    want.insert(series("ratelimit_service_config_load_error", &[]), 1);
    want.insert(
        series(
            "ratelimit_service_total_requests",
            &[("grpc_method", "ShouldRateLimit")],
        ),
        6,
    );
    want.insert(
        series(
            "ratelimit_service_should_rate_limit_error",
            &[("err_type", "service_error")],
        ),
        1,
    );
    want
}

/// A reload that works (the limit of `global` changed) and one that fails.
fn reloads(h: &Harness) {
    h.dir.write("domain.yaml", &CONFIG.replace("100 }", "200 }"));
    h.running.reloader().reload().unwrap();
    h.dir.write("domain.yaml", "domain: first-listener\ndescriptors: [");
    assert!(h.running.reloader().reload().is_err());
}

/// The lines of every datagram waiting on `socket`.
fn received(socket: &UdpSocket) -> Vec<String> {
    let mut buf = [0u8; 65_536];
    let mut lines = Vec::new();
    while let Ok(n) = socket.recv(&mut buf) {
        assert!(n <= 1432, "a datagram of {n} bytes");
        lines.extend(String::from_utf8(buf[..n].to_vec()).unwrap().lines().map(str::to_owned));
    }
    lines
}

/// Each counter line (`name:n|c`) mapped, the values of one series added.
fn mapped(lines: &[String]) -> BTreeMap<Series, u64> {
    let mut out = BTreeMap::new();
    for line in lines {
        let (name, rest) = line.rsplit_once(':').unwrap();
        let value: u64 = rest
            .strip_suffix("|c")
            .unwrap_or_else(|| panic!("{line} is no counter"))
            .parse()
            .unwrap();
        let series = map(name).unwrap_or_else(|| panic!("{name} is not mapped by Envoy Gateway's statsd_conf.yaml"));
        *out.entry(series).or_default() += value;
    }
    out
}

fn statsd_receiver() -> (UdpSocket, StatsdOptions) {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.set_nonblocking(true).unwrap();
    let options = StatsdOptions {
        // Flushed by hand: no flush falls within the test.
        flush_interval: Duration::from_secs(3600),
        ..StatsdOptions::new("127.0.0.1", socket.local_addr().unwrap().port())
    };
    (socket, options)
}

#[tokio::test]
async fn statsd_lines_map_as_envoy_gateway_maps_them() {
    let (socket, options) = statsd_receiver();
    let mut h = Harness::start_with(CONFIG, |o| o.statsd = Some(options)).await;
    calls(&mut h).await;
    reloads(&h);
    let sent = h.running.flush_stats();
    let lines = received(&socket);
    assert_eq!(sent, lines.len());
    assert_eq!(mapped(&lines), expected(), "{lines:#?}");
    // The statsd names themselves, as envoyproxy/ratelimit forms them.
    for line in [
        "ratelimit.service.rate_limit.first-listener.first-route_first-route.masked_remote_address_0_0_0_0/0.over_limit:1|c",
        "ratelimit.service.rate_limit.first-listener.global.total_hits:1|c",
        "ratelimit.service.config_load_success:2|c",
        "ratelimit_server.ShouldRateLimit.total_requests:6|c",
    ] {
        assert!(lines.iter().any(|l| l == line), "{line} not in {lines:#?}");
    }

    // The next flush sends only what grew since.
    assert_eq!(h.running.flush_stats(), 0);
    assert!(received(&socket).is_empty());
    let first = one(
        "first-listener",
        &[("first-route", "first-route"), ("masked_remote_address", "0.0.0.0/0")],
    );
    assert_eq!(codes(&h.rls(first).await.unwrap()), [Code::OverLimit]);
    let mut want = rule_series(&[("total_hits", FIRST, 1), ("over_limit", FIRST, 1)]);
    want.insert(
        series(
            "ratelimit_service_total_requests",
            &[("grpc_method", "ShouldRateLimit")],
        ),
        1,
    );
    h.running.flush_stats();
    assert_eq!(mapped(&received(&socket)), want);

    // And the counts of the stop's flush.
    assert_eq!(
        codes(&h.rls(one("first-listener", &[("global", "x")])).await.unwrap()),
        [Code::Ok]
    );
    h.running.shutdown().await;
    let mut want = rule_series(&[("total_hits", GLOBAL, 1), ("within_limit", GLOBAL, 1)]);
    want.insert(
        series(
            "ratelimit_service_total_requests",
            &[("grpc_method", "ShouldRateLimit")],
        ),
        1,
    );
    assert_eq!(mapped(&received(&socket)), want);
}

#[tokio::test]
async fn statsd_tags_in_both_formats() {
    for (dogstatsd, want) in [
        (
            false,
            "ratelimit.service.config_load_success.__env=prod.__zone=eu_1:1|c",
        ),
        (true, "ratelimit.service.config_load_success:1|c|#env:prod,zone:eu_1"),
    ] {
        let (socket, mut options) = statsd_receiver();
        options.extra_tags = StatsdOptions::parse_extra_tags("zone:eu.1,env:prod").unwrap();
        options.dogstatsd = dogstatsd;
        let h = Harness::start_with(CONFIG, |o| o.statsd = Some(options)).await;
        h.running.flush_stats();
        assert_eq!(received(&socket), [want]);
    }
}

/// One sample of the text format: its name, labels and value.
fn parse_sample(line: &str) -> (String, BTreeMap<String, String>, f64) {
    let (head, value) = line.rsplit_once(' ').unwrap();
    let value = value.parse().unwrap();
    let Some((name, labels)) = head.split_once('{') else {
        return (head.to_owned(), BTreeMap::new(), value);
    };
    let mut out = BTreeMap::new();
    let mut rest = labels.strip_suffix('}').unwrap();
    while !rest.is_empty() {
        let (label, after) = rest.split_once("=\"").unwrap();
        let mut text = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next().unwrap() {
                (_, '\\') => match chars.next().unwrap().1 {
                    'n' => text.push('\n'),
                    c => text.push(c),
                },
                (i, '"') => break i,
                (_, c) => text.push(c),
            }
        };
        out.insert(label.to_owned(), text);
        rest = after[end + 1..].trim_start_matches(',');
    }
    (name.to_owned(), out, value)
}

#[tokio::test]
async fn the_metrics_listener_serves_envoy_gateways_names() {
    let listener = MetricsListener::new("127.0.0.1:0".parse::<SocketAddr>().unwrap());
    let mut h = Harness::start_with(CONFIG, |o| o.metrics_listener = Some(listener)).await;
    let addr = h.running.metrics.as_ref().and_then(|e| e.tcp()).unwrap();
    calls(&mut h).await;
    reloads(&h);
    let (status, text) = http_get(addr, "/metrics").await;
    assert_eq!(status, 200);
    let mut types = BTreeMap::new();
    let mut samples: BTreeMap<Series, f64> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            assert!(
                types.insert(name.to_owned(), kind.to_owned()).is_none(),
                "{name} typed twice"
            );
        } else if !line.starts_with('#') {
            let (name, labels, value) = parse_sample(line);
            samples.insert((name, labels), value);
        }
    }
    for (series, n) in expected() {
        assert_eq!(
            types.get(&series.0).map(String::as_str),
            Some("counter"),
            "{}",
            series.0
        );
        assert_eq!(samples.get(&series), Some(&(n as f64)), "{series:?}");
    }
    // The series the dashboard and Envoy Gateway's end-to-end test query
    // are there at 0 too; no error of Redis without Redis.
    assert_eq!(
        samples.get(&series("ratelimit_service_rate_limit_shadow_mode", FIRST)),
        Some(&0.0)
    );
    assert_eq!(
        samples.get(&series(
            "ratelimit_service_should_rate_limit_error",
            &[("err_type", "redis_error")]
        )),
        Some(&0.0)
    );
    // slidegate's own metrics, counters named as their samples.
    assert_eq!(
        types.get("slidegate_requests_total").map(String::as_str),
        Some("counter")
    );
    assert!(samples.keys().any(|(name, _)| name == "process_resident_memory_bytes"));
    assert!(!text.contains("# EOF"));

    let (status, _) = http_get(addr, "/other").await;
    assert_eq!(status, 404);
    // The HTTP listener's /metrics stays OpenMetrics, without them.
    let (_, own) = h.get("/metrics").await;
    assert!(own.ends_with("# EOF\n") && !own.contains("ratelimit_service_"));
}

#[tokio::test]
async fn the_metrics_path_is_checked() {
    let listener = MetricsListener::new("127.0.0.1:0".parse::<SocketAddr>().unwrap()).path("stats");
    let options = slidegate_server::server::Options {
        http: "127.0.0.1:0".parse().unwrap(),
        grpc: "127.0.0.1:0".parse().unwrap(),
        metrics_listener: Some(listener),
        ..Default::default()
    };
    let e = slidegate_server::server::start(options, slidegate_core::ManualClock::new(0))
        .await
        .err()
        .unwrap();
    assert_eq!(e.to_string(), "the metrics path \"stats\" must start with /");
}
