//! The xDS config source against an ADS server written here with tonic, on
//! an ephemeral loopback port: snapshots ACKed and deciding requests,
//! counts kept across a change of limit, a bad snapshot NACKed while the
//! old config serves, reconnection after the server restarts, readiness,
//! mutual TLS, the node and the extra headers. Every wait is on an event
//! (a request reaching the server, a stream opening), bounded.

mod common;

use common::ads::{AdsServer, Tls, descriptor_of, within};
use common::envoy_gateway;
use common::harness::{Harness, codes, one};
use http::StatusCode;
use slidegate_server::proto::rls::rate_limit_response::Code;
use slidegate_server::proto::rls_conf::{RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit};
use slidegate_server::server::{XdsBackoff, XdsOptions, XdsTls};
use slidegate_server::xds::RATE_LIMIT_CONFIG_TYPE;
use std::net::SocketAddr;
use std::time::Duration;
use tonic::transport::{Certificate, Identity};

/// A config of one domain with one limit per minute on `client`.
fn config(name: &str, domain: &str, unit: i32, per_minute: u32) -> RateLimitConfig {
    RateLimitConfig {
        name: name.to_owned(),
        domain: domain.to_owned(),
        descriptors: vec![RateLimitDescriptor {
            key: "client".to_owned(),
            rate_limit: Some(RateLimitPolicy {
                unit,
                requests_per_unit: per_minute,
                ..RateLimitPolicy::default()
            }),
            ..RateLimitDescriptor::default()
        }],
    }
}

fn per_minute(domain: &str, limit: u32) -> RateLimitConfig {
    config(
        &format!("gateway/{domain}"),
        domain,
        RateLimitUnit::Minute.into(),
        limit,
    )
}

/// Fast reconnections, without jitter.
fn quick() -> XdsBackoff {
    XdsBackoff {
        initial: Duration::from_millis(20),
        max: Duration::from_millis(100),
        random_factor: 0.0,
        jitter: false,
    }
}

fn xds_to(addr: SocketAddr) -> XdsOptions {
    XdsOptions {
        server: addr.to_string(),
        node_id: "envoy-ratelimit".to_owned(),
        backoff: quick(),
        ..XdsOptions::default()
    }
}

async fn serve_from(ads: &AdsServer, tweak: impl FnOnce(&mut XdsOptions)) -> Harness {
    let mut xds = xds_to(ads.addr);
    tweak(&mut xds);
    Harness::start_with("", |options| options.xds = Some(xds)).await
}

async fn decide(h: &mut Harness, domain: &str) -> Code {
    let response = h.rls(one(domain, &[("client", "a")])).await.unwrap();
    codes(&response)[0]
}

/// A snapshot is applied and ACKed (its version and nonce); a second that
/// changes only a limit keeps the counts; a bad one (an unknown unit, a
/// domain in two resources) is NACKed with the loader's error, the last
/// good version and INVALID_ARGUMENT, and the config in force keeps
/// deciding. Each applied and refused snapshot counts as a reload.
#[tokio::test]
async fn snapshots_are_acked_applied_and_nacked() {
    let mut ads = AdsServer::start("127.0.0.1:0".parse().unwrap(), None).await;
    let mut h = serve_from(&ads, |_| {}).await;
    let first = ads.accept().await;
    assert_eq!(first.type_url, RATE_LIMIT_CONFIG_TYPE);
    assert!(first.resource_names.is_empty(), "a wildcard subscription");
    assert_eq!((first.version_info.as_str(), first.response_nonce.as_str()), ("", ""));

    let (_, ack) = ads.push_and_answer("1", &[per_minute("edge", 3)]).await;
    assert_eq!(ack.version_info, "1");
    assert!(ack.error_detail.is_none());
    assert_eq!(decide(&mut h, "edge").await, Code::Ok);
    assert_eq!(decide(&mut h, "edge").await, Code::Ok);

    // Two hits counted under 3; the limit lowered to 2: the next is over.
    let (_, ack) = ads.push_and_answer("2", &[per_minute("edge", 2)]).await;
    assert_eq!(ack.version_info, "2");
    assert_eq!(decide(&mut h, "edge").await, Code::OverLimit);

    let unknown_unit = config("gateway/bad", "edge", 0, 5);
    let (_, nack) = ads.push_and_answer("3", &[unknown_unit]).await;
    assert_eq!(nack.version_info, "2", "the last good version");
    let error = nack.error_detail.unwrap();
    assert_eq!(error.code, 3);
    assert_eq!(
        error.message,
        "xds:gateway/bad: descriptors[0].rate_limit.unit: unknown unit `UNKNOWN`, expected one of: second, \
         minute, hour, day, week, month, year"
    );
    assert_eq!(decide(&mut h, "edge").await, Code::OverLimit, "the old config decides");

    let (_, nack) = ads
        .push_and_answer(
            "4",
            &[per_minute("edge", 100), per_minute("edge", 100), per_minute("other", 1)],
        )
        .await;
    assert_eq!(nack.version_info, "2");
    let message = nack.error_detail.unwrap().message;
    assert!(
        message.contains("domain `edge` is already defined in xds:gateway/edge"),
        "{message}"
    );
    assert_eq!(decide(&mut h, "edge").await, Code::OverLimit);
    assert_eq!(
        decide(&mut h, "other").await,
        Code::Ok,
        "no rule: other is not configured"
    );

    // A good one again, with two domains.
    let (_, ack) = ads
        .push_and_answer("5", &[per_minute("edge", 100), per_minute("other", 1)])
        .await;
    assert_eq!(ack.version_info, "5");
    assert!(ack.error_detail.is_none());
    assert_eq!(decide(&mut h, "edge").await, Code::Ok);
    assert_eq!(decide(&mut h, "other").await, Code::Ok);
    assert_eq!(decide(&mut h, "other").await, Code::OverLimit);

    assert_eq!(
        h.metric("slidegate_config_reloads_total{result=\"success\"}").await,
        Some(3.0)
    );
    assert_eq!(
        h.metric("slidegate_config_reloads_total{result=\"failure\"}").await,
        Some(2.0)
    );
    assert_eq!(
        h.metric("slidegate_xds_updates_total{result=\"applied\"}").await,
        Some(3.0)
    );
    assert_eq!(
        h.metric("slidegate_xds_updates_total{result=\"rejected\"}").await,
        Some(2.0)
    );
    assert_eq!(h.metric("slidegate_xds_connected ").await, Some(1.0));
    h.running.shutdown().await;
    ads.stop().await;
}

/// A snapshot without a resource (Envoy Gateway's when its last rate
/// limit policy is removed) is applied and ACKed: the limits are gone, as
/// the control plane says, with no `--allow-empty-reload` needed.
#[tokio::test]
async fn a_snapshot_without_limits_is_applied() {
    let mut ads = AdsServer::start("127.0.0.1:0".parse().unwrap(), None).await;
    let mut h = serve_from(&ads, |_| {}).await;
    ads.accept().await;
    ads.push_and_answer("1", &[per_minute("edge", 1)]).await;
    assert_eq!(decide(&mut h, "edge").await, Code::Ok);
    assert_eq!(decide(&mut h, "edge").await, Code::OverLimit);
    let (_, ack) = ads.push_and_answer("2", &[]).await;
    assert_eq!(ack.version_info, "2", "ACKed");
    assert!(ack.error_detail.is_none());
    assert_eq!(decide(&mut h, "edge").await, Code::Ok, "no limit left");
    h.running.shutdown().await;
    ads.stop().await;
}

/// The server stops and comes back on the same port: the client retries
/// (after its backoff) while the config in force keeps deciding, asks the
/// new server with the last version applied, and applies its snapshot.
#[tokio::test]
async fn reconnects_to_a_restarted_server_keeping_the_config() {
    let mut ads = AdsServer::start("127.0.0.1:0".parse().unwrap(), None).await;
    let addr = ads.addr;
    let mut h = serve_from(&ads, |_| {}).await;
    ads.accept().await;
    ads.push_and_answer("v1", &[per_minute("edge", 2)]).await;
    assert_eq!(decide(&mut h, "edge").await, Code::Ok);

    ads.stop().await;
    // Gone: decisions go on with the config in force, counts and all.
    assert_eq!(decide(&mut h, "edge").await, Code::Ok);
    assert_eq!(decide(&mut h, "edge").await, Code::OverLimit);
    assert_eq!(h.get("/readyz").await.0, StatusCode::OK);

    let mut ads = AdsServer::start(addr, None).await;
    let hello = ads.accept().await;
    assert_eq!(hello.version_info, "v1", "the last version applied");
    assert_eq!(h.metric("slidegate_xds_connected ").await, Some(1.0));
    assert_eq!(hello.response_nonce, "");
    let (_, ack) = ads.push_and_answer("v2", &[per_minute("edge", 10)]).await;
    assert_eq!(ack.version_info, "v2");
    assert_eq!(decide(&mut h, "edge").await, Code::Ok, "3 of 10");
    h.running.shutdown().await;
    ads.stop().await;
}

/// A stream the server ends is opened again, with the last version.
#[tokio::test]
async fn a_stream_ended_by_the_server_is_opened_again() {
    let mut ads = AdsServer::start("127.0.0.1:0".parse().unwrap(), None).await;
    let h = serve_from(&ads, |_| {}).await;
    ads.accept().await;
    ads.push_and_answer("7", &[per_minute("edge", 2)]).await;
    ads.open.clear();
    let again = ads.accept().await;
    assert_eq!(again.version_info, "7");
    h.running.shutdown().await;
    ads.stop().await;
}

/// Waiting for the first snapshot (the default): `/readyz`,
/// `/healthcheck` and gRPC health say not ready until one is applied; a
/// bad first snapshot does not make it ready. With force-start, ready at
/// once.
#[tokio::test]
async fn not_ready_until_the_first_snapshot() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

    let mut ads = AdsServer::start("127.0.0.1:0".parse().unwrap(), None).await;
    let h = serve_from(&ads, |_| {}).await;
    let channel = h.channel().await;
    let mut health = HealthClient::new(channel);
    let mut watch = health
        .watch(HealthCheckRequest {
            service: "ratelimit".to_owned(),
        })
        .await
        .unwrap()
        .into_inner();
    let status = |m: Option<tonic_health::pb::HealthCheckResponse>| m.unwrap().status();
    assert_eq!(
        status(within("health", watch.message()).await.unwrap()),
        ServingStatus::NotServing
    );
    ads.accept().await;
    let (status_code, body) = h.get("/readyz").await;
    assert_eq!(status_code, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        body.contains("no config snapshot has come from the xDS server yet"),
        "{body}"
    );
    assert_eq!(h.get("/healthcheck").await.0, StatusCode::SERVICE_UNAVAILABLE);

    let (_, nack) = ads.push_and_answer("1", &[config("bad", "edge", 99, 1)]).await;
    assert!(nack.error_detail.is_some());
    assert_eq!(nack.version_info, "");
    assert_eq!(h.get("/healthcheck").await.0, StatusCode::SERVICE_UNAVAILABLE);

    ads.push_and_answer("2", &[per_minute("edge", 1)]).await;
    assert_eq!(h.get("/readyz").await, (StatusCode::OK, "OK\n".to_owned()));
    assert_eq!(h.get("/healthcheck").await, (StatusCode::OK, "OK\n".to_owned()));
    assert_eq!(
        status(within("health", watch.message()).await.unwrap()),
        ServingStatus::Serving
    );
    // The watch is a call in flight, which a shutdown waits for.
    drop((watch, health));
    h.running.shutdown().await;

    // Force-start: ready before anything comes, with no domain.
    let h = serve_from(&ads, |xds| xds.wait_for_first_snapshot = false).await;
    assert_eq!(h.get("/readyz").await.0, StatusCode::OK);
    assert_eq!(
        h.metric("slidegate_xds_updates_total{result=\"applied\"}").await,
        Some(0.0)
    );
    assert_eq!(h.get("/healthcheck").await.0, StatusCode::OK);
    h.running.shutdown().await;
    ads.stop().await;
}

/// The node (its id, metadata and slidegate's name) and the extra headers
/// reach the server.
#[tokio::test]
async fn node_and_headers_reach_the_server() {
    let mut ads = AdsServer::start("127.0.0.1:0".parse().unwrap(), None).await;
    let h = serve_from(&ads, |xds| {
        xds.node_metadata = vec![("zone".to_owned(), "eu-1".to_owned())];
        xds.headers = vec![
            ("X-Token".to_owned(), "secret".to_owned()),
            ("x-tenant".to_owned(), "blue".to_owned()),
        ];
        // With a scheme, as envoyproxy/ratelimit does not take it.
        xds.server = format!("http://{}", xds.server);
    })
    .await;
    let push = within("a stream", ads.streams.recv()).await.unwrap();
    ads.open.push(push);
    let got = ads.next().await;
    let node = got.request.node.unwrap();
    assert_eq!(node.id, "envoy-ratelimit");
    assert_eq!(node.user_agent_name, "slidegate");
    let zone = &node.metadata.unwrap().fields["zone"];
    assert_eq!(
        zone.kind,
        Some(pbjson_types::value::Kind::StringValue("eu-1".to_owned()))
    );
    assert_eq!(got.headers.get("x-token").unwrap(), "secret");
    assert_eq!(got.headers.get("x-tenant").unwrap(), "blue");
    assert!(!got.client_certificate);
    h.running.shutdown().await;
    ads.stop().await;
}

/// Mutual TLS: the client checks the server's certificate against the CA
/// and the name given, and shows its own, which the server requires.
#[tokio::test]
async fn mutual_tls() {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};

    let dir = common::TempDir::new("xds-tls");
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    ca_params.distinguished_name.push(DnType::CommonName, "xds test CA");
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let leaf = |name: &str| {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec![name.to_owned()])
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    };
    let (server_cert, server_key) = leaf("envoy-gateway.envoy-gateway-system.svc");
    let (client_cert, client_key) = leaf("envoy-ratelimit");
    let ca = dir.write("ca.crt", &ca_cert.pem());
    let cert = dir.write("tls.crt", &client_cert);
    let key = dir.write("tls.key", &client_key);

    let mut ads = AdsServer::start(
        "127.0.0.1:0".parse().unwrap(),
        Some(Tls {
            server: Identity::from_pem(server_cert, server_key),
            client_ca: Certificate::from_pem(ca_cert.pem()),
        }),
    )
    .await;
    let mut h = serve_from(&ads, |xds| {
        xds.tls = Some(XdsTls {
            ca: Some(ca),
            cert: Some(cert),
            key: Some(key),
            server_name: Some("envoy-gateway.envoy-gateway-system.svc".to_owned()),
        });
    })
    .await;
    let push = within("a stream", ads.streams.recv()).await.unwrap();
    ads.open.push(push);
    let got = ads.next().await;
    assert!(got.client_certificate, "the client showed its certificate");
    let (_, ack) = ads.push_and_answer("tls-1", &[per_minute("edge", 1)]).await;
    assert_eq!(ack.version_info, "tls-1");
    assert_eq!(decide(&mut h, "edge").await, Code::Ok);
    assert_eq!(decide(&mut h, "edge").await, Code::OverLimit);
    h.running.shutdown().await;
    ads.stop().await;
}

/// Options that cannot work are refused at start, naming what is wrong.
#[tokio::test]
async fn bad_options_are_refused_at_start() {
    use slidegate_server::server::{Options, start};
    let refused = async |tweak: &dyn Fn(&mut Options)| {
        let mut options = Options {
            http: "127.0.0.1:0".parse().unwrap(),
            grpc: "127.0.0.1:0".parse().unwrap(),
            xds: Some(XdsOptions::default()),
            ..Options::default()
        };
        tweak(&mut options);
        match start(options, slidegate_core::ManualClock::new(0)).await {
            Ok(_) => panic!("started"),
            Err(e) => e.to_string(),
        }
    };
    let both = refused(&|o| o.config = vec!["/etc/ratelimit/config".into()]).await;
    assert!(
        both.starts_with("config files (/etc/ratelimit/config) and an xDS config source were both given"),
        "{both}"
    );
    let no_ca = refused(&|o| {
        if let Some(xds) = o.xds.as_mut() {
            xds.tls = Some(XdsTls::default());
        }
    })
    .await;
    assert!(no_ca.contains("CONFIG_GRPC_XDS_SERVER_TLS_CACERT"), "{no_ca}");
    let missing = refused(&|o| {
        if let Some(xds) = o.xds.as_mut() {
            xds.tls = Some(XdsTls {
                ca: Some("/nonexistent/ca.crt".into()),
                ..XdsTls::default()
            });
        }
    })
    .await;
    assert!(missing.contains("cannot read the CA /nonexistent/ca.crt"), "{missing}");
    let https = refused(&|o| {
        if let Some(xds) = o.xds.as_mut() {
            xds.server = "https://control-plane:18000".to_owned();
        }
    })
    .await;
    assert!(https.contains("https:// needs the xDS TLS settings"), "{https}");
    let header = refused(&|o| {
        if let Some(xds) = o.xds.as_mut() {
            xds.headers = vec![("bad header".to_owned(), "v".to_owned())];
        }
    })
    .await;
    assert!(
        header.starts_with("the xDS request header `bad header` cannot be sent"),
        "{header}"
    );
    let backoff = refused(&|o| {
        if let Some(xds) = o.xds.as_mut() {
            xds.backoff.max = Duration::from_secs(1);
        }
    })
    .await;
    assert!(
        backoff.starts_with("xDS backoff: the maximum backoff interval"),
        "{backoff}"
    );
}

/// The rules with their lines and columns cleared (a file's and a
/// resource's YAML differ there).
fn placeless(rules: &[slidegate_server::config::Rule]) -> Vec<slidegate_server::config::Rule> {
    rules
        .iter()
        .map(|rule| slidegate_server::config::Rule {
            line: 0,
            column: 0,
            children: placeless(&rule.children),
            ..rule.clone()
        })
        .collect()
}

/// Every config of Envoy Gateway's translator test data, sent as its
/// control plane sends them (each case's configs one snapshot, one
/// resource each), is ACKed, and loads as the same file does, rule for
/// rule.
#[tokio::test]
async fn envoy_gateway_configs_load_over_xds_as_from_files() {
    use slidegate_server::config::{Config, LoadOptions};
    let mut ads = AdsServer::start("127.0.0.1:0".parse().unwrap(), None).await;
    let h = serve_from(&ads, |_| {}).await;
    ads.accept().await;
    let names = envoy_gateway::names();
    assert!(names.len() >= 20, "{names:?}");
    for (version, name) in names.iter().enumerate() {
        let documents = envoy_gateway::case_configs(name);
        let from_files = Config::parse_all(
            documents
                .iter()
                .enumerate()
                .map(|(i, yaml)| (format!("{name}#{i}.yaml"), yaml.clone())),
            &LoadOptions::default(),
        )
        .unwrap_or_else(|e| panic!("{name}: {e:?}"));
        let resources: Vec<RateLimitConfig> = from_files
            .domains()
            .map(|domain| RateLimitConfig {
                name: format!("{name}/{}", domain.name),
                domain: domain.name.clone(),
                descriptors: domain.rules.iter().map(descriptor_of).collect(),
            })
            .collect();
        assert_eq!(resources.len(), documents.len(), "{name}: one domain a document");
        let over_xds = slidegate_server::xds::config_from_configs(&resources, &LoadOptions::default())
            .unwrap_or_else(|e| panic!("{name}: {e:?}"));
        assert!(over_xds.warnings().is_empty(), "{name}: {:?}", over_xds.warnings());
        for domain in from_files.domains() {
            let sent = over_xds.domain(&domain.name).unwrap();
            assert_eq!(
                placeless(&sent.rules),
                placeless(&domain.rules),
                "{name}: {}",
                domain.name
            );
        }
        let version = format!("eg-{version}");
        let (_, answer) = ads.push_and_answer(&version, &resources).await;
        assert!(answer.error_detail.is_none(), "{name}: {:?}", answer.error_detail);
        assert_eq!(answer.version_info, version, "{name}");
        for domain in from_files.domains() {
            let served = h.running.shared().engine().config();
            assert_eq!(
                placeless(&served.domain(&domain.name).unwrap().rules),
                placeless(&domain.rules),
                "{name}: {} as served",
                domain.name
            );
        }
    }
    h.running.shutdown().await;
    ads.stop().await;
}
