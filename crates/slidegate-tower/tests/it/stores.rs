//! The layer over stores other than its default: one store call per
//! request for all of its limits, a store that must be awaited, the
//! failure policy on an outage, and the clock and budget of later limits.

use crate::{body, header, log, request, router, send};
use http::StatusCode;
use slidegate_core::ManualClock;
use slidegate_memory::{Budget, MemoryStore};
use slidegate_store::{Decisions, FailurePolicy, Quota, Store, StoreError, StoreStats};
use slidegate_tower::{GlobalKey, PeerIp, RateLimitLayer};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A store that counts the calls made to it and passes them to a memory
/// store; with `awaited`, it offers no `decide_now`, as a store that does
/// IO, so that the layer awaits its future.
struct Counting {
    inner: MemoryStore<ManualClock>,
    awaited: bool,
    calls: AtomicU64,
    /// The number of quotas of the last call.
    quotas: AtomicU64,
}

impl Counting {
    fn new(clock: &ManualClock, awaited: bool) -> Self {
        Counting {
            inner: MemoryStore::with_clock(Budget::keys(100), Budget::keys(100), clock.clone()),
            awaited,
            calls: AtomicU64::new(0),
            quotas: AtomicU64::new(0),
        }
    }

    fn count(&self, quotas: &[Quota]) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.quotas.store(quotas.len() as u64, Ordering::Relaxed);
    }

    fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }
}

impl Store for Counting {
    fn decide<'a>(
        &'a self,
        key: &'a str,
        quotas: &'a [Quota],
        cost: u64,
        out: &'a mut Decisions,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a {
        self.count(quotas);
        async move {
            // A store that does IO answers later.
            tokio::task::yield_now().await;
            self.inner.decide(key, quotas, cost, out).await
        }
    }

    fn charge<'a>(
        &'a self,
        key: &'a str,
        quotas: &'a [Quota],
        cost: u64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a {
        self.inner.charge(key, quotas, cost)
    }

    fn reset<'a>(
        &'a self,
        key: &'a str,
        quotas: &'a [Quota],
    ) -> impl Future<Output = Result<bool, StoreError>> + Send + 'a {
        self.inner.reset(key, quotas)
    }

    fn stats(&self) -> StoreStats {
        self.inner.stats()
    }

    fn decide_now(
        &self,
        key: &str,
        quotas: &[Quota],
        cost: u64,
        out: &mut Decisions,
    ) -> Option<Result<(), StoreError>> {
        if self.awaited {
            return None;
        }
        self.count(quotas);
        self.inner.decide_now(key, quotas, cost, out)
    }
}

fn three_limits<St: Store>(store: St) -> RateLimitLayer<axum::body::Body, St> {
    RateLimitLayer::builder_with_store(PeerIp::new(), store)
        .quota("second", log(2, Duration::from_secs(1)))
        .quota("minute", log(3, Duration::from_secs(60)))
        .quota("hour", log(100, Duration::from_secs(3_600)))
        .build()
        .unwrap()
}

/// Three limits are one store call per request, decided now or awaited,
/// and the answers are the same either way: all or nothing.
#[tokio::test]
async fn several_limits_are_one_store_call() {
    for awaited in [false, true] {
        let clock = ManualClock::new(0);
        let layer = three_limits(Counting::new(&clock, awaited));
        let store = layer.clone();
        let router = router(layer);
        let mut answers = Vec::new();
        for n in 1..=5u64 {
            let response = send(&router, request("192.0.2.1:1")).await;
            assert_eq!(store.store().calls(), n, "awaited: {awaited}");
            assert_eq!(store.store().quotas.load(Ordering::Relaxed), 3);
            answers.push((response.status(), header(&response, "ratelimit").unwrap().to_owned()));
            clock.advance(Duration::from_millis(400));
        }
        let ok = StatusCode::OK;
        let refused = StatusCode::TOO_MANY_REQUESTS;
        // Refused by "second" at 0.8 s: neither other limit is charged
        // (the minute still has 1, the hour 98), so the fourth request, at
        // 1.2 s, is the minute's third; the fifth is refused by the minute
        // alone, and "second" is not charged.
        assert_eq!(
            answers,
            [
                (
                    ok,
                    r#""second";r=1;t=1, "minute";r=2;t=60, "hour";r=99;t=3600"#.to_owned()
                ),
                (
                    ok,
                    r#""second";r=0;t=1, "minute";r=1;t=60, "hour";r=98;t=3600"#.to_owned()
                ),
                (
                    refused,
                    r#""second";r=0;t=1, "minute";r=1;t=60, "hour";r=98;t=3600"#.to_owned()
                ),
                (
                    ok,
                    r#""second";r=0;t=1, "minute";r=0;t=60, "hour";r=97;t=3600"#.to_owned()
                ),
                (
                    refused,
                    r#""second";r=1;t=1, "minute";r=0;t=59, "hour";r=97;t=3600"#.to_owned()
                ),
            ],
            "awaited: {awaited}"
        );
        // Exempt and keyless requests never reach the store.
        let keyless = http::Request::builder()
            .uri("/")
            .body(axum::body::Body::empty())
            .unwrap();
        assert_eq!(send(&router, keyless).await.status(), refused);
        assert_eq!(store.store().calls(), 5);
    }
}

/// A store that is always down, or that refuses every key.
struct Broken {
    outage: bool,
}

impl Broken {
    fn error(&self) -> StoreError {
        if self.outage {
            StoreError::unavailable("connection refused")
        } else {
            StoreError::KeyRefused("too large".to_owned())
        }
    }
}

impl Store for Broken {
    fn decide<'a>(
        &'a self,
        _key: &'a str,
        _quotas: &'a [Quota],
        _cost: u64,
        _out: &'a mut Decisions,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a {
        std::future::ready(Err(self.error()))
    }

    fn charge<'a>(
        &'a self,
        _key: &'a str,
        _quotas: &'a [Quota],
        _cost: u64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a {
        std::future::ready(Err(self.error()))
    }

    fn reset<'a>(
        &'a self,
        _key: &'a str,
        _quotas: &'a [Quota],
    ) -> impl Future<Output = Result<bool, StoreError>> + Send + 'a {
        std::future::ready(Err(self.error()))
    }

    fn stats(&self) -> StoreStats {
        StoreStats::default()
    }
}

fn on_broken(outage: bool) -> slidegate_tower::RateLimitLayerBuilder<axum::body::Body, Broken> {
    RateLimitLayer::builder_with_store(GlobalKey, Broken { outage }).quota("all", log(5, Duration::from_secs(60)))
}

/// On an outage: without a failure policy `503`; open, the request passes
/// without headers; closed, it is refused `429` with `Retry-After: 1`.
/// The wrapper counts both. A key the store refuses is `503` whatever the
/// policy: it is not an outage.
#[tokio::test]
async fn the_failure_policy_decides_on_an_outage() {
    let none = router(on_broken(true).build().unwrap());
    let unavailable = send(&none, request("192.0.2.1:1")).await;
    assert_eq!(unavailable.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(header(&unavailable, "ratelimit"), None);
    let problem = body(unavailable).await;
    assert!(problem.contains("temporary-reduced-capacity"), "{problem}");
    assert!(problem.contains("cannot answer"), "{problem}");

    let open = on_broken(true).failure_policy(FailurePolicy::Open).build().unwrap();
    let app = router(open.clone());
    for _ in 0..3 {
        let passed = send(&app, request("192.0.2.1:1")).await;
        assert_eq!(passed.status(), StatusCode::OK);
        assert_eq!(header(&passed, "ratelimit"), None);
        assert_eq!(header(&passed, "ratelimit-policy"), None);
        assert_eq!(body(passed).await, "hello");
    }
    let stats = open.store().failover_stats();
    assert_eq!((stats.fail_open, stats.fail_closed, stats.outages), (3, 0, 3));

    let closed = on_broken(true).failure_policy(FailurePolicy::Closed).build().unwrap();
    let app = router(closed.clone());
    for _ in 0..2 {
        let refused = send(&app, request("192.0.2.1:1")).await;
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(header(&refused, "retry-after"), Some("1"));
        assert_eq!(header(&refused, "ratelimit"), Some(r#""all";r=0;t=1"#));
    }
    let stats = closed.store().failover_stats();
    assert_eq!((stats.fail_open, stats.fail_closed, stats.outages), (0, 2, 2));
    assert_eq!(closed.store().stats().failover.fallbacks(), 2);

    let refusing = on_broken(false).failure_policy(FailurePolicy::Open).build().unwrap();
    let app = router(refusing.clone());
    assert_eq!(
        send(&app, request("192.0.2.1:1")).await.status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(refusing.store().failover_stats().outages, 0);
}

/// `Local`: on an outage each of 2 instances counts half of the limit in
/// its own memory, with the local figures in the headers.
#[tokio::test]
async fn a_local_failure_policy_counts_a_share() {
    let clock = ManualClock::new(0);
    let local = MemoryStore::with_clock(Budget::keys(10), Budget::keys(10), clock.clone());
    let layer = on_broken(true).local_failover(2, local).build().unwrap();
    let app = router(layer.clone());
    for remaining in [2, 1, 0] {
        let passed = send(&app, request("192.0.2.1:1")).await;
        assert_eq!(passed.status(), StatusCode::OK);
        let expected = format!(r#""all";r={remaining};t=60"#);
        assert_eq!(header(&passed, "ratelimit"), Some(expected.as_str()));
    }
    let refused = send(&app, request("192.0.2.1:1")).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&refused, "retry-after"), Some("60"));
    let stats = layer.store().failover_stats();
    assert_eq!((stats.local_admitted, stats.local_refused, stats.outages), (3, 1, 4));
}

/// `limit` makes the in-memory store from its first clock and budget;
/// later calls' clock and budget are ignored: every limit runs on the
/// first clock.
#[tokio::test]
async fn later_limits_share_the_first_clock() {
    let first = ManualClock::new(0);
    let ignored = ManualClock::new(0);
    let layer = RateLimitLayer::builder(GlobalKey)
        .limit("a", log(1, Duration::from_secs(10)), first.clone(), Budget::keys(10))
        .limit("b", log(2, Duration::from_secs(10)), ignored.clone(), Budget::keys(1))
        .build()
        .unwrap();
    let app = router(layer);
    assert_eq!(send(&app, request("192.0.2.1:1")).await.status(), StatusCode::OK);
    ignored.advance(Duration::from_secs(60));
    let refused = send(&app, request("192.0.2.1:1")).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&refused, "ratelimit"), Some(r#""a";r=0;t=10, "b";r=1;t=10"#));
    first.advance(Duration::from_secs(10));
    assert_eq!(send(&app, request("192.0.2.1:1")).await.status(), StatusCode::OK);
}

/// A store that cannot keep a limit is refused when the layer is built; a
/// layer without a store (no `limit`) too.
#[test]
fn a_limit_the_store_cannot_keep_is_refused_at_build() {
    let none = RateLimitLayer::<axum::body::Body, MemoryStore<ManualClock>>::builder(GlobalKey)
        .quota("a", log(1, Duration::from_secs(1)))
        .build();
    assert!(none.err().unwrap().to_string().contains("store"));
    let same = RateLimitLayer::<axum::body::Body, _>::builder(GlobalKey)
        .limit(
            "a",
            log(1, Duration::from_secs(1)),
            ManualClock::new(0),
            Budget::keys(1),
        )
        .limit(
            "b",
            log(1, Duration::from_secs(1)),
            ManualClock::new(0),
            Budget::keys(1),
        )
        .build();
    assert!(same.err().unwrap().to_string().contains("\"b\" has the same policy"));
}
