//! Two replicas of an axum app on loopback ports, each with its own
//! `RedisStore` (or, in the hybrid mode, `HybridStore`) on one throw-away
//! `redis-server`: one limit for both, however the requests are spread;
//! and a layer over the store as `RedisOptions` builds it for the service.

use axum::Router;
use axum::routing::get;
use http::StatusCode;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use slidegate_conformance::redis::{KEY_PREFIX, RedisServer};
use slidegate_core::{Algorithm, Policy, Weighting};
use slidegate_redis::{HybridOptions, HybridStore, RedisOptions, RedisStore};
use slidegate_store::{FailurePolicy, Store};
use slidegate_tower::{PeerIp, RateLimitLayer};
use std::net::SocketAddr;
use std::time::Duration;

/// A replica: its own connection to Redis, its own port.
async fn replica(url: &str) -> SocketAddr {
    let store = RedisStore::connect(url, KEY_PREFIX, Duration::from_secs(2))
        .await
        .unwrap();
    let sliding = Algorithm::SlidingWindow {
        buckets: 4,
        weighting: Weighting::Conservative,
    };
    let layer = RateLimitLayer::builder_with_store(PeerIp::new(), store)
        .quota("per-client", Policy::new(10, Duration::from_secs(60), sliding).unwrap())
        .failure_policy(FailurePolicy::Closed)
        .build()
        .unwrap();
    let app = Router::new().route("/", get(|| async { "hello" })).layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
            .await
            .unwrap();
    });
    addr
}

/// 30 requests from one client, spread over both replicas at once: 10 are
/// admitted in all, each with its own `remaining` (9 down to 0), and the
/// 20 others are refused with `Retry-After`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_one_limit_in_redis() {
    let server = RedisServer::start();
    let replicas = [replica(&server.url()).await, replica(&server.url()).await];
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let requests = (0..30).map(|i| {
        let client = client.clone();
        let uri: http::Uri = format!("http://{}/", replicas[i % 2]).parse().unwrap();
        tokio::spawn(async move {
            let response = client.get(uri).await.unwrap();
            let (parts, body) = response.into_parts();
            let body = body.collect().await.unwrap().to_bytes();
            (parts.status, parts.headers, body)
        })
    });
    let mut remaining = Vec::new();
    let mut refused = 0;
    let mut waits = Vec::new();
    for answer in requests.collect::<Vec<_>>() {
        let (status, headers, body) = answer.await.unwrap();
        let text = |name: &str| headers.get(name).map(|v| v.to_str().unwrap().to_owned());
        assert_eq!(text("ratelimit-policy").as_deref(), Some(r#""per-client";q=10;w=60"#));
        let state = text("ratelimit").unwrap();
        let (r, t) = parse_state(&state);
        // A conservative window counts a unit whole until its bucket
        // leaves the ring: up to a window and a bucket from now.
        assert!((1..=120).contains(&t), "{state}");
        waits.push(t);
        match status {
            StatusCode::OK => {
                assert_eq!(body, "hello");
                assert_eq!(text("retry-after"), None);
                remaining.push(r);
            }
            StatusCode::TOO_MANY_REQUESTS => {
                refused += 1;
                assert_eq!(r, 0, "{state}");
                let retry: u64 = text("retry-after").unwrap().parse().unwrap();
                assert_eq!(retry, t, "{state}");
                assert!(String::from_utf8_lossy(&body).contains("quota-exceeded"));
            }
            other => panic!("unexpected {other}: {headers:?}"),
        }
    }
    remaining.sort_unstable();
    assert_eq!(remaining, (0..10).collect::<Vec<u64>>(), "one count for both replicas");
    assert_eq!(refused, 20);
    // Decided within moments of each other, on one count: the same wait,
    // give or take the rounding to a second.
    let (least, most) = (waits.iter().min().unwrap(), waits.iter().max().unwrap());
    assert!(most - least <= 1, "{waits:?}");
    server.assert_every_key_expires();
}

/// `r` and `t` of a one-limit `RateLimit` field.
fn parse_state(state: &str) -> (u64, u64) {
    let field = |name: &str| -> u64 {
        state
            .split(';')
            .find_map(|p| p.strip_prefix(name))
            .unwrap()
            .parse()
            .unwrap()
    };
    (field("r="), field("t="))
}

/// A replica in the hybrid mode: decisions local to the process, counts
/// sent to Redis when the test flushes (its background sync is not
/// started), a new key decided on the limit's share of 2 instances.
async fn hybrid_replica(url: &str) -> (SocketAddr, RateLimitLayer<axum::body::Body, HybridStore>) {
    let client = redis::Client::open(url).unwrap();
    let conn = client.get_multiplexed_async_connection().await.unwrap();
    let options = HybridOptions {
        instances: 2,
        ..HybridOptions::every(Duration::from_millis(50))
    };
    let store = HybridStore::new(conn, KEY_PREFIX, Duration::from_secs(2), options).unwrap();
    let sliding = Algorithm::SlidingWindow {
        buckets: 4,
        weighting: Weighting::Conservative,
    };
    let layer = RateLimitLayer::builder_with_store(PeerIp::new(), store)
        .quota("per-client", Policy::new(10, Duration::from_secs(60), sliding).unwrap())
        .build()
        .unwrap();
    let app = Router::new().route("/", get(|| async { "hello" })).layer(layer.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
            .await
            .unwrap();
    });
    (addr, layer)
}

/// The same two replicas in the hybrid mode: each decides a key it has
/// not synced on its share (10 / 2), so together they admit exactly the
/// limit, every answer with its headers; once both have synced, Redis
/// holds the 10 admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hybrid_replicas_admit_the_limit_in_all() {
    let server = RedisServer::start();
    let (a, layer_a) = hybrid_replica(&server.url()).await;
    let (b, layer_b) = hybrid_replica(&server.url()).await;
    let replicas = [a, b];
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let requests = (0..30).map(|i| {
        let client = client.clone();
        let uri: http::Uri = format!("http://{}/", replicas[i % 2]).parse().unwrap();
        tokio::spawn(async move {
            let response = client.get(uri).await.unwrap();
            (response.status(), response.headers().clone())
        })
    });
    let mut admitted = 0;
    for answer in requests.collect::<Vec<_>>() {
        let (status, headers) = answer.await.unwrap();
        let state = headers.get("ratelimit").unwrap().to_str().unwrap().to_owned();
        let (r, t) = parse_state(&state);
        assert!((1..=120).contains(&t), "{state}");
        match status {
            StatusCode::OK => admitted += 1,
            StatusCode::TOO_MANY_REQUESTS => {
                assert_eq!(r, 0, "{state}");
                assert!(headers.contains_key("retry-after"));
            }
            other => panic!("unexpected {other}: {headers:?}"),
        }
    }
    assert_eq!(admitted, 10, "each replica its share of a new key");
    layer_a.store().flush().await.unwrap();
    layer_b.store().flush().await.unwrap();
    assert_eq!(
        server.ring_count("sliding_window"),
        10,
        "every admitted count reached Redis"
    );
    server.assert_every_key_expires();
}

/// A layer over the store as `RedisOptions` builds it (behind its failure
/// policy, as `slidegate serve` runs it) decides: 3 of 5 requests pass,
/// with the headers of what Redis counted, then 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layer_over_the_built_store_decides() {
    let server = RedisServer::start();
    let options = RedisOptions {
        urls: vec![server.url()],
        prefix: format!("{KEY_PREFIX}built:"),
        timeout: Duration::from_secs(2),
        failure: FailurePolicy::Closed,
        ..RedisOptions::default()
    };
    let store = options.connect().await.unwrap();
    let layer = RateLimitLayer::builder_with_store(slidegate_tower::GlobalKey, store)
        .quota(
            "global",
            Policy::new(3, Duration::from_secs(60), Algorithm::FixedWindow).unwrap(),
        )
        .build()
        .unwrap();
    let app = Router::new().route("/", get(|| async { "hello" })).layer(layer);
    let mut statuses = Vec::new();
    for _ in 0..5 {
        let request = http::Request::builder()
            .uri("/")
            .body(axum::body::Body::empty())
            .unwrap();
        let response = tower::ServiceExt::oneshot(app.clone(), request).await.unwrap();
        statuses.push(response.status());
        if response.status() == StatusCode::OK {
            assert!(response.headers().contains_key("ratelimit"));
        }
    }
    let ok = StatusCode::OK;
    let refused = StatusCode::TOO_MANY_REQUESTS;
    assert_eq!(statuses, [ok, ok, ok, refused, refused]);
    // The counts are Redis's: the window's key holds the three.
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{KEY_PREFIX}built:*"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
}
