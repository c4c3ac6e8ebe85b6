//! The store conformance suite (`slidegate_conformance::store_suite!`),
//! instantiated for every Redis form of the store interface: one server,
//! a three-master Redis Cluster, a primary found through Redis Sentinel,
//! the hybrid mode (its algorithms, the windows; one instance decides
//! locally as the core; `hybrid_store.rs` adds syncs at random points), and the failure wrapper over
//! a Redis that has been killed (the local
//! fallback, on a limit shared by one instance, decides as the core).
//! The stores as [`RedisOptions`] builds them for the service (behind the
//! failure policy, as one `Arc<dyn DynStore>`) pass it too: on one server,
//! a Sentinel's primary and a Cluster, and in the hybrid mode (on the
//! windows: a call with a `gcra` or `sliding_log` limit goes to the
//! script, and a key's counts of both meet in Redis only at the next
//! sync). The bounded hybrid mode decides on leases, not as the core: it
//! is checked on its own contract.
//! Each property case gets its own key prefix on a server shared by the
//! cases; the stores read the suite's manual clock.

use slidegate_conformance::redis::{KEY_PREFIX, RedisCluster, RedisSentinel, RedisServer};
use slidegate_memory::{Budget, MemoryStore};
use slidegate_redis::{HybridOptions, HybridStore, RedisClock, RedisOptions, RedisStore};
use slidegate_store::{DynStore, FailOver, FailurePolicy};
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(2);

/// A prefix no other case uses.
fn prefix() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("{KEY_PREFIX}suite:{}:", NEXT.fetch_add(1, Ordering::Relaxed))
}

mod one_server {
    use super::*;

    pub(super) fn server() -> &'static RedisServer {
        static SERVER: OnceLock<RedisServer> = OnceLock::new();
        SERVER.get_or_init(RedisServer::start)
    }

    slidegate_conformance::store_suite! {
        new: |clock| async move {
            RedisStore::connect(&server().url(), prefix(), TIMEOUT)
                .await
                .unwrap()
                .with_clock(RedisClock::client(clock))
        },
        cases: 24,
    }
}

mod cluster {
    use super::*;

    pub(super) fn cluster() -> &'static RedisCluster {
        static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
        CLUSTER.get_or_init(RedisCluster::start)
    }

    slidegate_conformance::store_suite! {
        new: |clock| async move {
            RedisStore::connect_cluster(cluster().urls(), prefix(), TIMEOUT)
                .await
                .unwrap()
                .with_clock(RedisClock::client(clock))
        },
        cases: 12,
    }
}

mod sentinel {
    use super::*;

    pub(super) fn sentinel() -> &'static RedisSentinel {
        static SENTINEL: OnceLock<RedisSentinel> = OnceLock::new();
        SENTINEL.get_or_init(RedisSentinel::start)
    }

    slidegate_conformance::store_suite! {
        new: |clock| async move {
            RedisStore::connect_sentinel(vec![sentinel().url()], RedisSentinel::MASTER, prefix(), TIMEOUT)
                .await
                .unwrap()
                .with_clock(RedisClock::client(clock))
        },
        cases: 12,
    }
}

mod hybrid {
    use super::*;

    fn server() -> &'static RedisServer {
        static SERVER: OnceLock<RedisServer> = OnceLock::new();
        SERVER.get_or_init(RedisServer::start)
    }

    slidegate_conformance::store_suite! {
        new: |clock| async move {
            let client = redis::Client::open(server().url()).unwrap();
            let conn = client.get_multiplexed_async_connection().await.unwrap();
            HybridStore::new(conn, prefix(), TIMEOUT, HybridOptions::every(Duration::from_millis(20)))
                .unwrap()
                .with_clock(RedisClock::client(clock))
        },
        cases: 24,
        algorithms: Windows,
    }
}

mod failover_over_a_dead_redis {
    use super::*;

    /// A Redis that answered once and was then killed.
    fn dead_url() -> &'static str {
        static URL: OnceLock<String> = OnceLock::new();
        URL.get_or_init(|| {
            let server = RedisServer::start();
            let url = server.url();
            server.kill();
            url
        })
    }

    slidegate_conformance::store_suite! {
        new: |clock: slidegate_core::ManualClock| async move {
            // A multiplexed connection made while nothing listens fails at
            // once: the store is built over a client that never connects.
            let client = redis::Client::open(dead_url()).unwrap();
            let config = redis::aio::ConnectionManagerConfig::new().set_connection_timeout(Some(Duration::from_millis(200)));
            let conn = redis::aio::ConnectionManager::new_lazy_with_config(client, config).unwrap();
            let dead = RedisStore::new(conn, prefix(), Duration::from_millis(200))
                .unwrap()
                .with_clock(RedisClock::client(clock.clone()));
            let local = MemoryStore::with_clock(Budget::keys(10_000), Budget::keys(10_000), clock);
            FailOver::local(dead, 1, local)
        },
        cases: 24,
    }
}

/// The store `options` build for the service, on the suite's clock.
async fn built(options: RedisOptions, clock: slidegate_core::ManualClock) -> Arc<dyn DynStore> {
    let options = RedisOptions {
        prefix: prefix(),
        timeout: TIMEOUT,
        ..options
    };
    let (store, probe) = options.connect_on(RedisClock::client(clock)).await.unwrap();
    assert!(probe.answers().await);
    store
}

mod built_one_server {
    use super::*;

    slidegate_conformance::store_suite! {
        new: |clock| built(
            RedisOptions {
                urls: vec![one_server::server().url()],
                failure: FailurePolicy::Local { instances: 1 },
                ..RedisOptions::default()
            },
            clock,
        ),
        cases: 24,
    }
}

mod built_unbatched_closed {
    use super::*;

    slidegate_conformance::store_suite! {
        new: |clock| built(
            RedisOptions {
                urls: vec![one_server::server().url()],
                failure: FailurePolicy::Closed,
                batching: false,
                ..RedisOptions::default()
            },
            clock,
        ),
        cases: 12,
    }
}

mod built_sentinel {
    use super::*;

    slidegate_conformance::store_suite! {
        new: |clock| built(
            RedisOptions {
                urls: vec![sentinel::sentinel().url()],
                sentinel: Some(RedisSentinel::MASTER.to_owned()),
                ..RedisOptions::default()
            },
            clock,
        ),
        cases: 12,
    }
}

mod built_cluster {
    use super::*;

    slidegate_conformance::store_suite! {
        new: |clock| built(
            RedisOptions {
                urls: cluster::cluster().urls(),
                ..RedisOptions::default()
            },
            clock,
        ),
        cases: 12,
    }
}

/// The hybrid mode as built, syncing in the background on the real clock
/// every 20 ms while the suite drives the store on a manual clock (a reset
/// waits for a sync on its way: `hybrid::a_reset_is_not_undone_by_a_sync_on_its_way`).
mod built_hybrid {
    use super::*;

    slidegate_conformance::store_suite! {
        new: |clock| built(
            RedisOptions {
                urls: vec![one_server::server().url()],
                sync_interval: Some(Duration::from_millis(20)),
                ..RedisOptions::default()
            },
            clock,
        ),
        cases: 24,
        algorithms: Windows,
    }
}

/// The bounded hybrid mode as built: not the suite's (it decides on
/// leases, so it refuses before its first lease and may refuse early
/// after; the suite wants the core's decisions), but its own contract,
/// through the same interface: nothing before the lease, then at most the
/// limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn built_bounded_hybrid_decides_on_leases() {
    use slidegate_core::{Algorithm, ManualClock, Policy, Weighting};
    use slidegate_store::{Decisions, Quota, Store};
    let options = RedisOptions {
        urls: vec![one_server::server().url()],
        sync_interval: Some(Duration::from_millis(20)),
        bounded: true,
        ..RedisOptions::default()
    };
    let store = built(options, ManualClock::new(1_700_000_000_000_000_000)).await;
    let ring = Algorithm::SlidingWindow {
        buckets: 8,
        weighting: Weighting::Conservative,
    };
    let quotas = [Quota::new(Policy::new(10, Duration::from_secs(60), ring).unwrap())];
    let mut out = Decisions::new();
    store.decide("leased", &quotas, 1, &mut out).await.unwrap();
    assert!(!out[0].allowed(), "nothing is admitted before the lease");
    // The background sync may have taken the demand first: ask again
    // after each flush until a lease has come.
    let mut admitted = 0;
    for _ in 0..100 {
        store.flush().await.unwrap();
        store.decide("leased", &quotas, 1, &mut out).await.unwrap();
        if out[0].allowed() {
            admitted += 1;
            break;
        }
    }
    for _ in 0..20 {
        store.decide("leased", &quotas, 1, &mut out).await.unwrap();
        admitted += u64::from(out[0].allowed());
    }
    assert!((1..=10).contains(&admitted), "{admitted} admitted on the lease");
}
