//! The Redis servers and cluster of the tests (from
//! `slidegate_conformance::redis`), and the stores the tests get from
//! them.

#![allow(dead_code, unreachable_pub, async_fn_in_trait)]

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
pub use slidegate_conformance::redis::{RedisCluster, RedisServer};
use slidegate_core::{Decision, Policy};
use slidegate_redis::{RedisClock, RedisStore};
use slidegate_store::{Decisions, Quota, Store, StoreError};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Barrier;

/// The prefix of every key the tests' stores write.
pub const PREFIX: &str = "slidegate:test:";

/// Where the tests get their stores: a single server or a cluster.
pub trait Backend {
    /// The connection the stores run over.
    type Conn: ConnectionLike + Clone + Send + Sync + 'static;

    /// A connection of its own.
    async fn conn(&self) -> Self::Conn;

    /// The prefix of the stores' keys.
    fn prefix(&self) -> String {
        PREFIX.to_owned()
    }

    /// A store with a timeout of 2 s on `clock`.
    async fn store(&self, clock: RedisClock) -> RedisStore<Self::Conn> {
        RedisStore::new(self.conn().await, self.prefix(), Duration::from_secs(2))
            .unwrap()
            .with_clock(clock)
    }

    /// A store of its own deciding `policy` alone.
    async fn limiter(&self, policy: Policy, clock: RedisClock) -> One<Self::Conn> {
        One::new(self.store(clock).await, policy)
    }
}

/// A [`RedisStore`] deciding one limit: what most tests ask of it.
#[derive(Clone)]
pub struct One<C = MultiplexedConnection> {
    pub store: RedisStore<C>,
    pub quota: Quota,
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> One<C> {
    pub fn new(store: RedisStore<C>, policy: Policy) -> Self {
        One {
            store,
            quota: Quota::new(policy),
        }
    }

    /// The store's decision of `cost` on `key` under the one limit.
    pub async fn check(&self, key: &str, cost: u64) -> Result<Decision, StoreError> {
        let mut out = Decisions::new();
        self.store
            .decide(key, std::slice::from_ref(&self.quota), cost, &mut out)
            .await?;
        assert_eq!(out.len(), 1);
        Ok(out[0])
    }

    /// The first Redis key of `key`'s state (`…:log` for `sliding_log`).
    pub fn redis_key(&self, key: &str) -> String {
        self.redis_keys(key).remove(0)
    }

    /// Every Redis key of `key`'s state.
    pub fn redis_keys(&self, key: &str) -> Vec<String> {
        self.store.redis_keys(key, &self.quota)
    }

    /// Forgets `key`'s counts.
    pub async fn reset(&self, key: &str) -> Result<bool, StoreError> {
        self.store.reset(key, std::slice::from_ref(&self.quota)).await
    }
}

/// 64 tasks, each with its own connection, hit one key at once: exactly
/// `limit` are admitted.
pub async fn exactly_limit_admitted<B: Backend>(backend: &B, policy: Policy, clock: RedisClock) {
    const TASKS: usize = 64;
    let mut limiters = Vec::new();
    for _ in 0..TASKS {
        limiters.push(backend.limiter(policy, clock.clone()).await);
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

impl Backend for RedisServer {
    type Conn = MultiplexedConnection;

    async fn conn(&self) -> MultiplexedConnection {
        RedisServer::conn(self).await
    }
}

impl Backend for RedisCluster {
    type Conn = ClusterConnection;

    async fn conn(&self) -> ClusterConnection {
        ClusterClient::new(self.urls())
            .unwrap()
            .get_async_connection()
            .await
            .unwrap()
    }
}
