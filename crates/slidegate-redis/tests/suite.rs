//! The store conformance suite (`slidegate_conformance::store_suite!`),
//! instantiated for every Redis form of the store interface: one server,
//! a three-master Redis Cluster, a primary found through Redis Sentinel,
//! the hybrid mode (its algorithms, the windows; one instance decides
//! locally as the core; `hybrid_store.rs` adds syncs at random points), and the failure wrapper over
//! a Redis that has been killed (the local
//! fallback, on a limit shared by one instance, decides as the core).
//! Each property case gets its own key prefix on a server shared by the
//! cases; the stores read the suite's manual clock.

use slidegate_conformance::redis::{KEY_PREFIX, RedisCluster, RedisSentinel, RedisServer};
use slidegate_memory::{Budget, MemoryStore};
use slidegate_redis::{HybridOptions, HybridStore, RedisClock, RedisStore};
use slidegate_store::FailOver;
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

    fn server() -> &'static RedisServer {
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

    fn cluster() -> &'static RedisCluster {
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

    fn sentinel() -> &'static RedisSentinel {
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
