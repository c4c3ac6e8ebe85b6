//! The layer through axum's `Router` and tower's `ServiceExt`, on a manual
//! clock: shared budgets, exact headers, honest `Retry-After`, forged
//! forwarding headers, IPv6 grouping, the no-key rule and gRPC refusals.

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::{Request, Response, StatusCode};
use slidegate_core::{Algorithm, ManualClock, Policy, Weighting};
use slidegate_memory::{Budget, MemoryStore};
use slidegate_tower::{ForwardedFor, GlobalKey, HeaderKey, MissingKey, PeerIp, RateLimitLayer, RequestKey};
use std::net::SocketAddr;
use std::time::Duration;
use tower::ServiceExt;

mod replicas;
mod servers;
mod stores;

fn log(limit: u64, window: Duration) -> Policy {
    Policy::new(limit, window, Algorithm::SlidingLog).unwrap()
}

fn request(peer: &str) -> Request<Body> {
    let mut request = Request::builder().uri("/").body(Body::empty()).unwrap();
    request.extensions_mut().insert(peer.parse::<SocketAddr>().unwrap());
    request
}

fn with_header(mut request: Request<Body>, name: &'static str, value: &str) -> Request<Body> {
    request.headers_mut().append(name, value.parse().unwrap());
    request
}

async fn send(router: &Router, request: Request<Body>) -> Response<Body> {
    router.clone().oneshot(request).await.unwrap()
}

fn header<'a>(response: &'a Response<Body>, name: &str) -> Option<&'a str> {
    response.headers().get(name).map(|v| v.to_str().unwrap())
}

async fn body(response: Response<Body>) -> String {
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
    String::from_utf8(bytes.to_vec()).unwrap()
}

fn router<St: slidegate_store::Store + 'static>(layer: RateLimitLayer<Body, St>) -> Router {
    Router::new().route("/", get(|| async { "hello" })).layer(layer)
}

fn per_ip(limit: u64, window: Duration, clock: &ManualClock) -> RateLimitLayer<Body, MemoryStore<ManualClock>> {
    RateLimitLayer::builder(PeerIp::new())
        .limit("per-ip", log(limit, window), clock.clone(), Budget::keys(1_000))
        .build()
        .unwrap()
}

/// Every clone of the router (axum clones the service per request) counts
/// against one budget, and the headers say exactly what is left.
#[tokio::test]
async fn clones_share_one_budget_with_exact_headers() {
    let clock = ManualClock::new(0);
    let router = router(per_ip(3, Duration::from_secs(60), &clock));
    for remaining in [2, 1, 0] {
        let response = send(&router.clone(), request("192.0.2.1:1000")).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(header(&response, "ratelimit-policy"), Some(r#""per-ip";q=3;w=60"#));
        let expected = format!(r#""per-ip";r={remaining};t=60"#);
        assert_eq!(header(&response, "ratelimit"), Some(expected.as_str()));
        assert_eq!(header(&response, "retry-after"), None);
        assert_eq!(body(response).await, "hello");
    }
    let refused = send(&router, request("192.0.2.1:2000")).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&refused, "retry-after"), Some("60"));
    assert_eq!(header(&refused, "ratelimit"), Some(r#""per-ip";r=0;t=60"#));
    assert_eq!(header(&refused, "content-type"), Some("application/problem+json"));
    let problem = body(refused).await;
    assert!(
        problem.contains(r#""type":"https://iana.org/assignments/http-problem-types#quota-exceeded""#),
        "{problem}"
    );
    assert!(problem.contains(r#""status":429"#), "{problem}");
    // Another client has its own budget.
    assert_eq!(send(&router, request("192.0.2.2:1")).await.status(), StatusCode::OK);
}

/// `Retry-After` is rounded up and honest: at the announced time the same
/// request passes; a moment earlier it does not.
#[tokio::test]
async fn retry_after_is_honest() {
    let clock = ManualClock::new(0);
    let router = router(per_ip(1, Duration::from_millis(1_500), &clock));
    assert_eq!(send(&router, request("192.0.2.1:1")).await.status(), StatusCode::OK);
    clock.advance(Duration::from_millis(300));
    let refused = send(&router, request("192.0.2.1:1")).await;
    // 1.2 s to wait: 2 s, never 1.
    assert_eq!(header(&refused, "retry-after"), Some("2"));
    clock.advance(Duration::from_millis(1_199));
    assert_eq!(
        send(&router, request("192.0.2.1:1")).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    clock.set(300_000_000 + 2_000_000_000);
    assert_eq!(send(&router, request("192.0.2.1:1")).await.status(), StatusCode::OK);
}

/// Forwarding headers count only from trusted proxies; the client is the
/// rightmost address that is not a trusted proxy.
#[tokio::test]
async fn forged_forwarding_headers_are_ignored() {
    let clock = ManualClock::new(0);
    let layer = RateLimitLayer::builder(ForwardedFor::new(["10.0.0.0/8".parse().unwrap()]))
        .limit(
            "per-client",
            log(1, Duration::from_secs(60)),
            clock.clone(),
            Budget::keys(1_000),
        )
        .build()
        .unwrap();
    let router = router(layer);
    // An untrusted client forging a new address every time is still one
    // client.
    let forged = |n: u8| with_header(request("203.0.113.5:1"), "x-forwarded-for", &format!("198.51.100.{n}"));
    assert_eq!(send(&router, forged(1)).await.status(), StatusCode::OK);
    assert_eq!(send(&router, forged(2)).await.status(), StatusCode::TOO_MANY_REQUESTS);
    // Behind the trusted proxy, prepending addresses does not help either.
    let via_proxy = |lie: &str| {
        with_header(
            request("10.0.0.1:1"),
            "x-forwarded-for",
            &format!("{lie}, 198.51.100.7"),
        )
    };
    assert_eq!(send(&router, via_proxy("1.1.1.1")).await.status(), StatusCode::OK);
    assert_eq!(
        send(&router, via_proxy("2.2.2.2")).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // A different client behind the same proxy has its own budget.
    let other = with_header(request("10.0.0.1:1"), "x-forwarded-for", "198.51.100.8");
    assert_eq!(send(&router, other).await.status(), StatusCode::OK);
}

/// IPv6 clients are grouped by /64 by default: rotating the low bits does
/// not buy a new budget; another /64 does.
#[tokio::test]
async fn ipv6_clients_are_grouped() {
    let clock = ManualClock::new(0);
    let router = router(per_ip(1, Duration::from_secs(60), &clock));
    assert_eq!(
        send(&router, request("[2001:db8:1:2::1]:1")).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        send(&router, request("[2001:db8:1:2:ffff::9]:1")).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        send(&router, request("[2001:db8:1:3::1]:1")).await.status(),
        StatusCode::OK
    );
}

/// A request without a key follows the configured rule.
#[tokio::test]
async fn the_no_key_rule() {
    let clock = ManualClock::new(0);
    let api_key = || HeaderKey::new(http::HeaderName::from_static("x-api-key"));
    let build = |rule: MissingKey| {
        router(
            RateLimitLayer::builder(api_key())
                .limit(
                    "per-key",
                    log(1, Duration::from_secs(60)),
                    clock.clone(),
                    Budget::keys(100),
                )
                .missing_key(rule)
                .build()
                .unwrap(),
        )
    };
    let anonymous = || Request::builder().uri("/").body(Body::empty()).unwrap();
    // Refuse (the default rule).
    let refuse = build(MissingKey::Refuse);
    let refused = send(&refuse, anonymous()).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&refused, "retry-after"), None);
    // Allow: unlimited, no headers.
    let allow = build(MissingKey::Allow);
    for _ in 0..3 {
        let passed = send(&allow, anonymous()).await;
        assert_eq!(passed.status(), StatusCode::OK);
        assert_eq!(header(&passed, "ratelimit"), None);
    }
    // A fallback key: all anonymous requests share one budget.
    let fallback = build(MissingKey::Fallback(RequestKey::Text("anonymous".into())));
    assert_eq!(send(&fallback, anonymous()).await.status(), StatusCode::OK);
    assert_eq!(
        send(&fallback, anonymous()).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // Keyed requests are counted under their key.
    let keyed = || with_header(anonymous(), "x-api-key", "k1");
    assert_eq!(send(&fallback, keyed()).await.status(), StatusCode::OK);
    assert_eq!(send(&fallback, keyed()).await.status(), StatusCode::TOO_MANY_REQUESTS);
}

/// Several limits: a request passes only if all admit it, and only then is
/// each charged; costs come from a closure; exempt requests are not counted.
#[tokio::test]
async fn several_limits_costs_and_exemptions() {
    let clock = ManualClock::new(0);
    let window = |buckets| Algorithm::SlidingWindow {
        buckets,
        weighting: Weighting::Conservative,
    };
    let layer = RateLimitLayer::builder(GlobalKey)
        .limit(
            "burst",
            Policy::new(5, Duration::from_secs(1), window(2)).unwrap(),
            clock.clone(),
            Budget::keys(10),
        )
        .limit(
            "hourly",
            log(8, Duration::from_secs(3_600)),
            clock.clone(),
            Budget::keys(10),
        )
        .cost(|r: &Request<Body>| {
            r.headers()
                .get("x-cost")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(1)
        })
        .exempt(|r: &Request<Body>| r.uri().path() == "/health")
        .legacy_headers(true)
        .build()
        .unwrap();
    let router = Router::new()
        .route("/", get(|| async { "hello" }))
        .route("/health", get(|| async { "ok" }))
        .layer(layer);
    let costing = |cost: u64| with_header(request("192.0.2.1:1"), "x-cost", &cost.to_string());
    let first = send(&router, costing(4)).await;
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(
        header(&first, "ratelimit-policy"),
        Some(r#""burst";q=5;w=1, "hourly";q=8;w=3600"#)
    );
    assert_eq!(header(&first, "x-ratelimit-remaining"), Some("1"));
    // 2 more would pass the hourly limit (4 left) but not the burst (1
    // left): refused, and the hourly limit is not charged. The burst limit
    // is conservative over 2 buckets of 1 s: the 4 units count whole until
    // their bucket leaves the ring, 2 s on.
    let refused = send(&router, costing(2)).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        header(&refused, "ratelimit"),
        Some(r#""burst";r=1;t=2, "hourly";r=4;t=3600"#)
    );
    assert_eq!(header(&refused, "retry-after"), Some("2"));
    // Exempt requests pass and count nowhere.
    for _ in 0..10 {
        let health = Request::builder().uri("/health").body(Body::empty()).unwrap();
        let response = send(&router, health).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(header(&response, "ratelimit"), None);
    }
    // After the burst window, 4 more pass: the hourly limit still has 4.
    clock.advance(Duration::from_secs(2));
    assert_eq!(send(&router, costing(4)).await.status(), StatusCode::OK);
    clock.advance(Duration::from_secs(2));
    let spent = send(&router, costing(1)).await;
    assert_eq!(spent.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        header(&spent, "ratelimit"),
        Some(r#""burst";r=5;t=0, "hourly";r=0;t=3596"#)
    );
}

/// gRPC requests are refused the gRPC way: HTTP 200 with
/// `grpc-status: 8` (RESOURCE_EXHAUSTED) and the wait in
/// `grpc-retry-pushback-ms`.
#[tokio::test]
async fn grpc_refusals_are_resource_exhausted() {
    let clock = ManualClock::new(0);
    let router = router(per_ip(1, Duration::from_millis(1_500), &clock));
    let grpc = || with_header(request("192.0.2.1:1"), "content-type", "application/grpc+proto");
    assert_eq!(send(&router, grpc()).await.status(), StatusCode::OK);
    clock.advance(Duration::from_millis(300));
    let refused = send(&router, grpc()).await;
    assert_eq!(refused.status(), StatusCode::OK);
    assert_eq!(header(&refused, "grpc-status"), Some("8"));
    assert_eq!(header(&refused, "grpc-retry-pushback-ms"), Some("1200"));
    assert_eq!(header(&refused, "content-type"), Some("application/grpc"));
    assert!(header(&refused, "grpc-message").unwrap().contains("retry in 2 s"));
    // What a tonic client makes of it.
    let status = tonic::Status::from_header_map(refused.headers()).unwrap();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    assert!(status.message().contains("retry in 2 s"), "{status:?}");
}

/// Bad limit names are refused when the layer is built.
#[test]
fn bad_names_are_refused() {
    let clock = ManualClock::new(0);
    let policy = log(1, Duration::from_secs(1));
    let bad = RateLimitLayer::<Body, _>::builder(GlobalKey)
        .limit("naïve", policy, clock.clone(), Budget::keys(1))
        .build();
    assert!(bad.err().unwrap().to_string().contains("naïve"));
    let twice = RateLimitLayer::<Body, _>::builder(GlobalKey)
        .limit("a", policy, clock.clone(), Budget::keys(1))
        .limit("a", policy, clock.clone(), Budget::keys(1))
        .build();
    assert!(twice.err().unwrap().to_string().contains("\"a\""));
    assert!(
        RateLimitLayer::<Body, MemoryStore<ManualClock>>::builder(GlobalKey)
            .build()
            .is_err()
    );
}
