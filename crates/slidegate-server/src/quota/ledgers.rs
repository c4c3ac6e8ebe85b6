//! Where the quota buckets' ledgers ([`Ledger`]) are kept: in memory for
//! one replica ([`MemoryLedgers`]), or in Redis for replicas that share
//! their Envoys' limits ([`RedisLedgers`]). Both apply one report's
//! operations, a grant or a leave per bucket, each under its ledger's own
//! lock (memory) or compare-and-set (Redis), so two replicas never both
//! give away the same tokens.

use super::share::{Grant, Ledger, Pools, StreamId, Timing};
use parking_lot::Mutex;
use slidegate_redis::RedisConn;
use std::collections::HashMap;
use std::future::Future;
use std::hash::BuildHasher;
use std::pin::Pin;

/// One bucket's part of a report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LedgerOp {
    /// The stream reported the bucket, wanting `want` tokens a window of
    /// the rule whose pools are `pools`.
    Grant {
        /// The bucket's ledger key (its domain and id).
        key: String,
        /// Tokens a window.
        want: u64,
        /// The rule's pools.
        pools: Pools,
    },
    /// The stream will not report the bucket again.
    Leave {
        /// The bucket's ledger key.
        key: String,
    },
}

/// Why a report's ledgers could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LedgerError {
    /// Redis failed or did not answer.
    #[error("quota ledgers in Redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// A ledger in Redis does not decode (written by another version?).
    #[error("quota ledger `{0}` in Redis does not decode")]
    Corrupt(String),
    /// Other replicas kept changing a ledger.
    #[error("quota ledger `{0}` in Redis kept changing under this replica")]
    Contended(String),
}

/// A boxed future, for `dyn Ledgers`.
pub type LedgerFuture<'a> = Pin<Box<dyn Future<Output = Result<Vec<Grant>, LedgerError>> + Send + 'a>>;

/// Where ledgers live.
pub trait Ledgers: Send + Sync {
    /// Applies `ops` for stream `id` at `now`: one answer per op, in order
    /// (a leave's is [`Grant::Deny`], unused).
    fn apply<'a>(&'a self, id: StreamId, ops: &'a [LedgerOp], now: u64, timing: Timing) -> LedgerFuture<'a>;
}

/// The shards of [`MemoryLedgers`].
const SHARDS: usize = 64;

/// Ledgers in memory, at most a set number of buckets: a new bucket when
/// its shard is full first drops the shard's ledgers that hold nothing,
/// then is denied (`DENY_ALL`) until one expires.
///
/// # Concurrency
///
/// 64 shards, each a `parking_lot` mutex over a map, taken once per op for
/// the few instructions of a grant.
pub struct MemoryLedgers {
    shards: Box<[Mutex<HashMap<String, Ledger>>]>,
    per_shard: usize,
    hasher: foldhash::fast::FixedState,
}

impl MemoryLedgers {
    /// Ledgers for at most about `max_buckets` buckets (rounded up to a
    /// whole number per shard).
    pub fn new(max_buckets: usize) -> MemoryLedgers {
        MemoryLedgers {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            per_shard: max_buckets.div_ceil(SHARDS).max(1),
            hasher: foldhash::fast::FixedState::with_seed(0x5eed),
        }
    }

    /// How many buckets' ledgers are kept.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|shard| shard.lock().len()).sum()
    }

    /// Whether no ledger is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn shard(&self, key: &str) -> Option<&Mutex<HashMap<String, Ledger>>> {
        let index = usize::try_from(self.hasher.hash_one(key) % SHARDS as u64).unwrap_or(0);
        self.shards.get(index)
    }

    fn apply_one(&self, id: StreamId, op: &LedgerOp, now: u64, timing: &Timing) -> Grant {
        let (key, grant) = match op {
            LedgerOp::Grant { key, want, pools } => (key, Some((*want, pools))),
            LedgerOp::Leave { key } => (key, None),
        };
        let Some(shard) = self.shard(key) else {
            return Grant::Deny;
        };
        let mut map = shard.lock();
        if let Some(ledger) = map.get_mut(key.as_str()) {
            let answer = match grant {
                Some((want, pools)) => ledger.grant(id, want, now, pools, timing),
                None => {
                    ledger.leave(id);
                    Grant::Deny
                }
            };
            return answer;
        }
        let Some((want, pools)) = grant else {
            return Grant::Deny;
        };
        if map.len() >= self.per_shard {
            map.retain(|_, ledger| {
                ledger.expire(now);
                !ledger.is_empty()
            });
            if map.len() >= self.per_shard {
                return Grant::Deny;
            }
        }
        let mut ledger = Ledger::new();
        let answer = ledger.grant(id, want, now, pools, timing);
        map.insert(key.clone(), ledger);
        answer
    }
}

impl Ledgers for MemoryLedgers {
    fn apply<'a>(&'a self, id: StreamId, ops: &'a [LedgerOp], now: u64, timing: Timing) -> LedgerFuture<'a> {
        let answers = ops.iter().map(|op| self.apply_one(id, op, now, &timing)).collect();
        Box::pin(std::future::ready(Ok(answers)))
    }
}

/// Sets a ledger if its version is still the one read: `KEYS[1]` the
/// ledger's hash, `ARGV = [version read ("" for none), ledger ("" to
/// delete), time to live in ms]`; 1 if set, 0 if another replica changed
/// it first.
const CAS: &str = r"
local seen = redis.call('HGET', KEYS[1], 'v')
if (seen or '') ~= ARGV[1] then return 0 end
if ARGV[2] == '' then
  redis.call('DEL', KEYS[1])
  return 1
end
redis.call('HSET', KEYS[1], 'v', (tonumber(seen) or 0) + 1, 'l', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
";

/// How many times a report's ledgers are read again when other replicas
/// changed them in between.
const ATTEMPTS: usize = 8;

/// Ledgers in Redis, one hash per bucket (`<prefix>rlqs:<key>`: its
/// version and its encoded ledger), for replicas that share their Envoys'
/// limits. A report reads its buckets' ledgers in one pipeline, grants on
/// them, and writes each back only if no other replica wrote it since
/// (a script comparing versions), reading again those that changed. Each
/// hash expires when its last hold does. The replicas' clocks are compared
/// (each passes its own time): they must agree within the grace.
pub struct RedisLedgers {
    conn: RedisConn,
    prefix: String,
}

impl RedisLedgers {
    /// Ledgers on `conn`, under `prefix`.
    pub fn new(conn: RedisConn, prefix: impl Into<String>) -> RedisLedgers {
        RedisLedgers {
            conn,
            prefix: prefix.into(),
        }
    }

    fn redis_key(&self, key: &str) -> String {
        format!("{}rlqs:{key}", self.prefix)
    }

    async fn apply_all(
        &self,
        id: StreamId,
        ops: &[LedgerOp],
        now: u64,
        timing: Timing,
    ) -> Result<Vec<Grant>, LedgerError> {
        let mut answers = vec![Grant::Deny; ops.len()];
        let mut pending: Vec<usize> = (0..ops.len()).collect();
        let mut conn = self.conn.clone();
        for _ in 0..ATTEMPTS {
            if pending.is_empty() {
                return Ok(answers);
            }
            let mut read = redis::pipe();
            for &i in &pending {
                if let Some(op) = ops.get(i) {
                    read.cmd("HMGET").arg(self.redis_key(op_key(op))).arg("v").arg("l");
                }
            }
            let seen: Vec<(Option<String>, Option<String>)> = read.query_async(&mut conn).await?;
            let mut write = redis::pipe();
            for (&i, (version, text)) in pending.iter().zip(&seen) {
                let Some(op) = ops.get(i) else { continue };
                let mut ledger = match text {
                    Some(text) => Ledger::decode(text).ok_or_else(|| LedgerError::Corrupt(op_key(op).to_owned()))?,
                    None => Ledger::new(),
                };
                let answer = match op {
                    LedgerOp::Grant { want, pools, .. } => ledger.grant(id, *want, now, pools, &timing),
                    LedgerOp::Leave { .. } => {
                        ledger.leave(id);
                        Grant::Deny
                    }
                };
                if let Some(slot) = answers.get_mut(i) {
                    *slot = answer;
                }
                ledger.expire(now);
                let ttl_ms = (ledger.horizon(now).saturating_sub(now) / 1_000_000).max(1);
                let encoded = if ledger.is_empty() {
                    String::new()
                } else {
                    ledger.encode()
                };
                // `EVAL`, not `EVALSHA`: a few hundred bytes a call, and
                // nothing to load again after a restart or a failover.
                write
                    .cmd("EVAL")
                    .arg(CAS)
                    .arg(1)
                    .arg(self.redis_key(op_key(op)))
                    .arg(version.as_deref().unwrap_or(""))
                    .arg(encoded)
                    .arg(ttl_ms);
            }
            let set: Vec<i64> = write.query_async(&mut conn).await?;
            pending = pending
                .iter()
                .zip(&set)
                .filter(|(_, set)| **set == 0)
                .map(|(&i, _)| i)
                .collect();
        }
        match pending.first().and_then(|&i| ops.get(i)) {
            Some(op) => Err(LedgerError::Contended(op_key(op).to_owned())),
            None => Ok(answers),
        }
    }
}

fn op_key(op: &LedgerOp) -> &str {
    match op {
        LedgerOp::Grant { key, .. } | LedgerOp::Leave { key } => key,
    }
}

impl Ledgers for RedisLedgers {
    fn apply<'a>(&'a self, id: StreamId, ops: &'a [LedgerOp], now: u64, timing: Timing) -> LedgerFuture<'a> {
        Box::pin(self.apply_all(id, ops, now, timing))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn a_full_memory_drops_spent_ledgers_then_denies() {
        let ledgers = MemoryLedgers::new(SHARDS);
        let pools = Pools::new(100, 10 * S);
        let id = StreamId { replica: 1, stream: 1 };
        let timing = Timing::DEFAULT;
        // Two keys in one shard: find them.
        let shard_of = |k: &str| ledgers.shard(k).map(|s| s as *const _);
        let first = "a".to_owned();
        let second = (0..)
            .map(|n| format!("b{n}"))
            .find(|k| shard_of(k) == shard_of(&first))
            .unwrap_or_default();
        let grant = |key: &str, now| {
            let op = LedgerOp::Grant {
                key: key.to_owned(),
                want: u64::MAX,
                pools,
            };
            ledgers.apply_one(id, &op, now, &timing)
        };
        assert!(matches!(grant(&first, 0), Grant::Bucket { .. }));
        assert_eq!(grant(&second, S), Grant::Deny);
        assert_eq!(ledgers.len(), 1);
        // The first's holds end at 11 s (rate) and 21 s (burst); its
        // demand at 11 s.
        assert_eq!(grant(&second, 20 * S), Grant::Deny);
        assert!(matches!(grant(&second, 21 * S), Grant::Bucket { .. }));
        assert_eq!(ledgers.len(), 1);
    }
}
