//! Administration of a limiter's keys: forgetting a key's counts.

use crate::{RedisLimiter, RedisStoreError};
use redis::aio::ConnectionLike;

impl<C: ConnectionLike + Clone> RedisLimiter<C> {
    /// Forgets the counts of `key`: deletes its Redis keys
    /// ([`RedisLimiter::redis_keys`]) with one `DEL`, bounded by the
    /// limiter's timeout. True if the key was held. The next decision on
    /// `key` starts afresh. The failure policy does not apply: a failure is
    /// an error, and the `Local` fallback's counts are kept.
    ///
    /// # Errors
    ///
    /// [`RedisStoreError::Timeout`] when Redis does not answer within the
    /// timeout, [`RedisStoreError::Redis`] when the connection or the
    /// server fails.
    pub async fn reset(&self, key: &str) -> Result<bool, RedisStoreError> {
        let mut conn = self.conn.clone();
        let mut del = redis::cmd("DEL");
        del.arg(self.redis_keys(key));
        let deleted: i64 = tokio::time::timeout(self.timeout, del.query_async(&mut conn))
            .await
            .map_err(|_| RedisStoreError::Timeout(self.timeout))??;
        Ok(deleted > 0)
    }
}
