//! slidegate in Envoy Gateway's place, as a process: `ratelimit` (a link to
//! the built `slidegate`, as an image's `/bin/ratelimit`) started with no
//! argument and the environment of Envoy Gateway's rendered Deployment
//! (`internal/infrastructure/kubernetes/ratelimit/testdata/deployments/
//! default.yaml` in envoyproxy/gateway), transcribed. What differs, and
//! why:
//!
//! - the files and addresses: the certificates are made here (one CA, as
//!   Envoy Gateway's certgen makes them) and written to a folder of the
//!   test; Redis is a throw-away `redis-server`; the control plane is an
//!   ADS server of the test's; the listeners are on loopback ports the
//!   system picks (`HOST`, `PORT`, `GRPC_HOST`, `GRPC_PORT` of
//!   `common::LOOPBACK`, and `PROMETHEUS_ADDR`), not 8080, 8081 and 19001,
//!   so that tests can run side by side;
//! - a short reconnection backoff (`XDS_CLIENT_BACKOFF_*`), so that the
//!   control plane's restart takes milliseconds, not 10 s;
//! - statsd on (`USE_STATSD=true` to the test's UDP socket), to check the
//!   stat names as a statsd exporter maps them; Envoy Gateway's current
//!   Deployment scrapes the mapped series instead (`USE_PROMETHEUS`), which
//!   the test reads too.
//!
//! There is no Envoy here: a tonic client calls `ShouldRateLimit` over
//! mutual TLS with a certificate of the CA, as Envoy Gateway's Envoys do,
//! with the descriptors their routes' actions make. Every wait is on an
//! event (a log line, a request reaching the ADS server, a datagram),
//! bounded.

#![cfg(unix)]

#[path = "../../slidegate-server/tests/common/ads.rs"]
mod ads;
mod common;

use ads::{AdsServer, Tls, descriptor_of, within};
use common::certs::{Ca, Leaf};
use slidegate_conformance::redis::RedisServer;
use slidegate_server::config::Config;
use slidegate_server::proto::descriptor::RateLimitDescriptor;
use slidegate_server::proto::descriptor::rate_limit_descriptor::Entry;
use slidegate_server::proto::rls::RateLimitRequest;
use slidegate_server::proto::rls::rate_limit_response::Code;
use slidegate_server::proto::rls::rate_limit_service_client::RateLimitServiceClient;
use slidegate_server::proto::rls_conf::RateLimitConfig;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

/// Envoy Gateway's translator output for a route limited per month and one
/// per year (its test data's `month-year-rule`), and the second config of
/// its `multiple-domains` case: two of the configs it sends.
const MONTH_YEAR: &str = include_str!("../../slidegate-server/tests/data/envoy-gateway/month-year-rule.yaml");
const MULTIPLE_DOMAINS: &str = include_str!("../../slidegate-server/tests/data/envoy-gateway/multiple-domains.yaml");

/// The `RateLimitConfig` resources of one YAML document of Envoy Gateway's,
/// as its control plane sends them (a resource per domain, named after it).
fn resources(yaml: &str) -> Vec<RateLimitConfig> {
    let config = Config::parse("eg.yaml", yaml).unwrap();
    config
        .domains()
        .map(|domain| RateLimitConfig {
            name: domain.name.clone(),
            domain: domain.name.clone(),
            descriptors: domain.rules.iter().map(descriptor_of).collect(),
        })
        .collect()
}

/// The documents of a file of several.
fn documents(text: &str) -> Vec<&str> {
    text.split("\n---\n").collect()
}

/// The environment of Envoy Gateway's rendered Deployment, with the
/// changes the module's header lists.
fn envoy_gateways_environment(certs: &Path, ads: &str, redis: u16, statsd: u16) -> BTreeMap<&'static str, String> {
    let cert = |name: &str| certs.join(name).display().to_string();
    BTreeMap::from([
        // As rendered.
        ("RUNTIME_ROOT", "/data".to_owned()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit".to_owned()),
        ("RUNTIME_IGNOREDOTFILES", "true".to_owned()),
        ("RUNTIME_WATCH_ROOT", "false".to_owned()),
        ("LOG_LEVEL", "info".to_owned()),
        ("CONFIG_TYPE", "GRPC_XDS_SOTW".to_owned()),
        ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit".to_owned()),
        ("GRPC_SERVER_USE_TLS", "true".to_owned()),
        ("GRPC_SERVER_TLS_CERT", cert("tls.crt")),
        ("GRPC_SERVER_TLS_KEY", cert("tls.key")),
        ("GRPC_SERVER_TLS_CA_CERT", cert("ca.crt")),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true".to_owned()),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", cert("tls.crt")),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", cert("tls.key")),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", cert("ca.crt")),
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true".to_owned()),
        ("REDIS_SOCKET_TYPE", "tcp".to_owned()),
        ("USE_PROMETHEUS", "true".to_owned()),
        ("PROMETHEUS_MAPPER_YAML", "/etc/statsd-exporter/conf.yaml".to_owned()),
        // The addresses of this test.
        ("CONFIG_GRPC_XDS_SERVER_URL", ads.to_owned()),
        ("REDIS_URL", format!("127.0.0.1:{redis}")),
        ("PROMETHEUS_ADDR", "127.0.0.1:0".to_owned()),
        // A quick reconnection, and statsd to the test's socket.
        ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "50ms".to_owned()),
        ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "200ms".to_owned()),
        ("USE_STATSD", "true".to_owned()),
        ("STATSD_HOST", "127.0.0.1".to_owned()),
        ("STATSD_PORT", statsd.to_string()),
        ("STATS_FLUSH_INTERVAL", "100ms".to_owned()),
    ])
}

/// Envoy: `ShouldRateLimit` over mutual TLS, its certificate signed by the
/// CA, trusting the CA.
async fn envoy(grpc: &str, ca: &Ca, me: &Leaf) -> RateLimitServiceClient<Channel> {
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&ca.pem))
        .identity(Identity::from_pem(&me.pem, &me.key_pem))
        .domain_name("localhost");
    let channel = Channel::from_shared(format!("https://{grpc}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap();
    RateLimitServiceClient::new(channel)
}

/// The overall code for one request with the descriptor `entries`.
async fn decide(client: &mut RateLimitServiceClient<Channel>, domain: &str, entries: &[(&str, &str)]) -> Code {
    let request = RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: entries
                .iter()
                .map(|(key, value)| Entry {
                    key: (*key).to_owned(),
                    value: (*value).to_owned(),
                })
                .collect(),
            ..Default::default()
        }],
        hits_addend: 0,
    };
    let answer = within("a decision", client.should_rate_limit(request)).await;
    answer.unwrap().into_inner().overall_code()
}

/// The descriptor Envoy Gateway's route actions make for a request of the
/// route `route` that its rule's match `rule-0-match-0` takes.
fn route(route: &'static str) -> [(&'static str, &'static str); 2] {
    [(route, route), ("rule-0-match-0", "rule-0-match-0")]
}

/// `GET path` on `addr` (plain HTTP, as the probes ask); the whole answer.
fn get(addr: &str, path: &str) -> String {
    common::request(addr, "GET", path, "")
}

/// Waits (bounded) until the datagrams received hold every name of `want`;
/// all the lines received.
fn statsd_lines(socket: &std::net::UdpSocket, want: &[&str]) -> Vec<String> {
    let mut lines = Vec::new();
    let mut buffer = [0u8; 65_536];
    while !want.iter().all(|w| lines.iter().any(|l: &String| l.starts_with(w))) {
        let n = socket
            .recv(&mut buffer)
            .unwrap_or_else(|e| panic!("no stat within the timeout ({e}): {lines:#?}"));
        lines.extend(String::from_utf8_lossy(&buffer[..n]).lines().map(str::to_owned));
    }
    lines
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slidegate_runs_as_envoy_gateways_rate_limit_service() {
    let dir = common::fresh("gateway");
    let certs = dir.join("certs");
    std::fs::create_dir_all(&certs).unwrap();
    let ca = Ca::new("envoy-gateway CA");
    let ratelimit = ca.both("envoy-ratelimit");
    std::fs::write(certs.join("ca.crt"), &ca.pem).unwrap();
    std::fs::write(certs.join("tls.crt"), &ratelimit.pem).unwrap();
    std::fs::write(certs.join("tls.key"), &ratelimit.key_pem).unwrap();
    let control_plane = ca.server("envoy-gateway");
    let envoy_cert = ca.client("envoy");
    let ads_tls = || Tls {
        server: Identity::from_pem(&control_plane.pem, &control_plane.key_pem),
        client_ca: Certificate::from_pem(&ca.pem),
    };
    let mut ads = AdsServer::start("127.0.0.1:0".parse().unwrap(), Some(ads_tls())).await;
    let ads_addr = ads.addr;
    let redis = RedisServer::start();
    let statsd = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    statsd.set_read_timeout(Some(Duration::from_secs(20))).unwrap();

    // `/bin/ratelimit`, no argument, Envoy Gateway's environment only.
    let link = dir.join("ratelimit");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_slidegate"), &link).unwrap();
    let mut command = Command::new(&link);
    for name in common::RATELIMIT_VARIABLES {
        command.env_remove(name);
    }
    let env = envoy_gateways_environment(
        &certs,
        &ads_addr.to_string(),
        redis.port(),
        statsd.local_addr().unwrap().port(),
    );
    command.envs(&env).envs(common::LOOPBACK).env_remove("RUST_LOG");
    let (child, lines) = common::spawn_logging(&mut command);
    let mut log = Vec::new();
    let (http, grpc) = common::next_line(&lines, &mut log, common::listening_on);
    let metrics = common::next_line(&lines, &mut log, |l| {
        l.strip_prefix("slidegate: metrics on ").map(str::to_owned)
    });
    // Said once each: what Envoy Gateway sets that means nothing here.
    for noted in [
        "RUNTIME_ROOT=/data",
        "PROMETHEUS_MAPPER_YAML=/etc/statsd-exporter/conf.yaml",
    ] {
        let said = log.iter().filter(|l| l.contains(noted)).count();
        assert_eq!(said, 1, "{noted}: {log:#?}");
    }

    // FORCE_START_WITHOUT_INITIAL_CONFIG: ready before any config; the
    // probes ask `GET /healthcheck` on the HTTP port, in the clear.
    assert!(get(&http, "/healthcheck").starts_with("HTTP/1.1 200 OK"));

    // The control plane: a mutual TLS stream (its server wants a client
    // certificate of the CA), the node Envoy Gateway keeps a snapshot for.
    let hello = ads.accept().await;
    assert_eq!(hello.node.as_ref().map(|n| n.id.as_str()), Some("envoy-ratelimit"));
    assert_eq!(
        hello.type_url,
        "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"
    );

    // A first snapshot: two of Envoy Gateway's configs, two domains.
    let month_year = resources(MONTH_YEAR);
    let other_domain = resources(documents(MULTIPLE_DOMAINS)[1]);
    let mut v1 = month_year.clone();
    v1.extend(other_domain.clone());
    let (_, ack) = ads.push_and_answer("v1", &v1).await;
    assert_eq!((ack.version_info.as_str(), ack.error_detail.as_ref()), ("v1", None));

    // Envoy over mutual TLS decides by the pushed config: the second route
    // has 1 a year, the first 5 a month.
    let mut envoy = envoy(&grpc, &ca, &envoy_cert).await;
    let domain = "first-listener";
    assert_eq!(decide(&mut envoy, domain, &route("second-route")).await, Code::Ok);
    assert_eq!(
        decide(&mut envoy, domain, &route("second-route")).await,
        Code::OverLimit
    );
    for _ in 0..2 {
        assert_eq!(decide(&mut envoy, domain, &route("first-route")).await, Code::Ok);
    }
    let policy = [
        (
            "test-namespace/test-policy-1/rule/0",
            "test-namespace/test-policy-1/rule/0",
        ),
        ("rule-0-match-0", "rule-0-match-0"),
    ];
    assert_eq!(
        decide(&mut envoy, "test-namespace/test-policy-1", &policy).await,
        Code::Ok
    );
    // Envoy's certificate is required: a client without one is refused.
    let bare = Channel::from_shared(format!("https://{grpc}"))
        .unwrap()
        .tls_config(
            ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(&ca.pem))
                .domain_name("localhost"),
        )
        .unwrap();
    let refused = match bare.connect().await {
        Err(_) => true,
        Ok(channel) => RateLimitServiceClient::new(channel)
            .should_rate_limit(RateLimitRequest::default())
            .await
            .is_err(),
    };
    assert!(refused, "a client without a certificate was served");

    // A second snapshot lowers the first route's limit to 3: its 2 counted
    // hits stay, so one more passes and the next is refused.
    let mut v2 = v1.clone();
    let first_route = &mut v2[0].descriptors[0].descriptors[0];
    first_route.rate_limit.as_mut().unwrap().requests_per_unit = 3;
    let (_, ack) = ads.push_and_answer("v2", &v2).await;
    assert_eq!((ack.version_info.as_str(), ack.error_detail.as_ref()), ("v2", None));
    assert_eq!(decide(&mut envoy, domain, &route("first-route")).await, Code::Ok);
    assert_eq!(decide(&mut envoy, domain, &route("first-route")).await, Code::OverLimit);

    // A bad snapshot (the domain `first-listener` in two resources) is
    // NACKed with the error, and the config in force keeps deciding.
    let mut bad = month_year.clone();
    bad.extend(resources(documents(MULTIPLE_DOMAINS)[0]));
    let (_, nack) = ads.push_and_answer("v3", &bad).await;
    assert_eq!(nack.version_info, "v2", "the last good version");
    let error = nack.error_detail.expect("a NACK");
    assert_eq!(error.code, 3);
    assert!(error.message.contains("first-listener"), "{}", error.message);
    assert_eq!(
        decide(&mut envoy, domain, &route("second-route")).await,
        Code::OverLimit
    );

    // The control plane restarts: the config stays in force meanwhile, and
    // the new stream asks with the last version applied.
    ads.stop().await;
    assert_eq!(decide(&mut envoy, domain, &route("first-route")).await, Code::OverLimit);
    assert!(get(&http, "/healthcheck").starts_with("HTTP/1.1 200 OK"));
    let mut ads = AdsServer::start(ads_addr, Some(ads_tls())).await;
    let again = ads.accept().await;
    assert_eq!(again.version_info, "v2");
    let (_, ack) = ads.push_and_answer("v4", &v2).await;
    assert_eq!((ack.version_info.as_str(), ack.error_detail.as_ref()), ("v4", None));
    assert_eq!(
        decide(&mut envoy, domain, &route("second-route")).await,
        Code::OverLimit
    );

    // The stats, named as Envoy Gateway's statsd mapping matches them:
    // over statsd, and on the metrics listener it scrapes.
    let key = "ratelimit.service.rate_limit.first-listener.second-route_second-route.rule-0-match-0_rule-0-match-0";
    let stats = statsd_lines(&statsd, &[&format!("{key}.over_limit:"), &format!("{key}.total_hits:")]);
    let over: u64 = stats
        .iter()
        .filter_map(|l| l.strip_prefix(&format!("{key}.over_limit:")))
        .map(|v| v.trim_end_matches("|c").parse::<u64>().unwrap())
        .sum();
    assert!(over >= 1, "{stats:#?}");
    let scraped = get(&metrics, "/metrics");
    let series = "ratelimit_service_rate_limit_over_limit{domain=\"first-listener\",key1=\"second-route_second-route\",key2=\"rule-0-match-0_rule-0-match-0\"}";
    let value = scraped
        .lines()
        .find_map(|l| l.strip_prefix(series))
        .map(|v| v.trim().parse::<f64>().unwrap());
    assert_eq!(value, Some(3.0), "{scraped}");

    // Redis counts them: every key of the limits, each with its expiry.
    assert!(!redis.keys_and_ttls().is_empty());

    // SIGTERM: the probe says 503 while draining, then a clean exit.
    common::signal("TERM", &child);
    common::next_line(&lines, &mut log, |l| l.contains("draining").then_some(()));
    let probe = get(&http, "/healthcheck");
    assert!(probe.starts_with("HTTP/1.1 503"), "{probe}");
    assert_eq!(common::exit_code(child), Some(0));
    let panicked = log
        .iter()
        .chain(lines.try_iter().collect::<Vec<_>>().iter())
        .any(|l| l.contains("panicked"));
    assert!(!panicked, "{log:#?}");
    // The config comes from the control plane: no warning that none was
    // given (before the fix, the start said "no config given").
    assert!(!log.iter().any(|l| l.contains("no config given")), "{log:#?}");
    ads.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
