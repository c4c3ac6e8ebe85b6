//! The Redis servers and cluster of the tests (from
//! `slidegate_conformance::redis`), and the limiters the tests get from
//! them.

#![allow(dead_code, unreachable_pub, async_fn_in_trait)]

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
pub use slidegate_conformance::redis::{RedisCluster, RedisServer};
use slidegate_core::Policy;
use slidegate_redis::{RedisClock, RedisLimiter};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Barrier;

/// The prefix of every key the tests' limiters write.
pub const PREFIX: &str = "slidegate:test:";

/// Where the tests get their limiters: a single server or a cluster.
pub trait Store {
    /// The connection the limiters run over.
    type Conn: ConnectionLike + Clone + Send + Sync + 'static;

    /// A connection of its own.
    async fn conn(&self) -> Self::Conn;

    /// A limiter of `policy` with a timeout of 2 s on `clock`.
    async fn limiter(&self, policy: Policy, clock: RedisClock) -> RedisLimiter<Self::Conn> {
        RedisLimiter::new(self.conn().await, policy, PREFIX, Duration::from_secs(2))
            .unwrap()
            .with_clock(clock)
    }
}

/// 64 tasks, each with its own connection, hit one key at once: exactly
/// `limit` are admitted.
pub async fn exactly_limit_admitted<S: Store>(store: &S, policy: Policy, clock: RedisClock) {
    const TASKS: usize = 64;
    let mut limiters = Vec::new();
    for _ in 0..TASKS {
        limiters.push(store.limiter(policy, clock.clone()).await);
    }
    let barrier = Arc::new(Barrier::new(TASKS));
    let tasks: Vec<_> = limiters
        .into_iter()
        .map(|limiter| {
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                limiter.check("hot", 1).await.unwrap().allowed()
            })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        admitted += u64::from(task.await.unwrap());
    }
    assert_eq!(admitted, policy.limit(), "{policy}");
}

impl Store for RedisServer {
    type Conn = MultiplexedConnection;

    async fn conn(&self) -> MultiplexedConnection {
        RedisServer::conn(self).await
    }
}

impl Store for RedisCluster {
    type Conn = ClusterConnection;

    async fn conn(&self) -> ClusterConnection {
        ClusterClient::new(self.urls())
            .unwrap()
            .get_async_connection()
            .await
            .unwrap()
    }
}
