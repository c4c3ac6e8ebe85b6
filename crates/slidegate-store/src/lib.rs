//! The one store interface of slidegate.
//!
//! Every backend — the in-memory store (`slidegate-memory`), Redis and
//! Redis Cluster, the hybrid local-count-and-sync mode (`slidegate-redis`)
//! — implements [`Store`], and every consumer — the tower layer, the
//! service's engine — sees only this trait, never a backend. The failure
//! policy is one wrapper over any store, [`FailOver`].
//!
//! A [`Store`] decides one request on a key against one or several limits
//! ([`Quota`]s), all or nothing: either every limit is charged the cost or
//! none is, atomically with respect to every other call on the same key.
//! It also peeks (cost 0), charges after the fact (a cost known only once
//! the response is out, recorded even past the limit), resets and reports
//! its figures.
//!
//! **Architecture Invariant:** this crate depends on the core only. A
//! decision on a store that does no IO (the in-memory store) is made when
//! `decide` is called: its future is [`std::future::Ready`], so awaiting
//! it costs nothing, and [`Store::decide_now`] offers the same decision
//! without a future at all, for consumers that hold a `dyn` store.
#![forbid(unsafe_code)]
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::indexing_slicing,
        clippy::panic,
        clippy::unreachable,
        clippy::todo,
        clippy::unimplemented
    )
)]

mod dyn_store;
mod failover;

pub use dyn_store::{BoxFuture, DynStore, StoreFuture};
pub use failover::{FailOver, FailOverStats, FailurePolicy, Source, share_of};

use slidegate_core::{Decision, Identity, Policy};
use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

/// One decision per limit, in the order of the limits; inline for up to
/// four limits, so that a decision allocates nothing.
pub type Decisions = smallvec::SmallVec<[Decision; 4]>;

/// A limit as stores keep it: a [`Policy`] and the [`Identity`] every
/// store counts it under (by default its policy's, [`Policy::tag`]):
/// in-memory stores by its [`Identity::digest`], Redis stores by its
/// [`Identity::redis_key`], metric labels by its text. Made once (when a
/// layer is built or a config is loaded), so that a decision neither
/// formats nor hashes the policy. Making one allocates nothing: its
/// digest is hashed as the identity's text is written, and the text is
/// kept the first time a store asks for it.
#[derive(Clone, Debug)]
pub struct Quota {
    policy: Policy,
    identity: OnceLock<Identity>,
    id: u64,
}

impl Quota {
    /// The quota of `policy`, counted under [`Identity::of`]`(policy)`.
    pub fn new(policy: Policy) -> Self {
        Quota {
            policy,
            identity: OnceLock::new(),
            id: Identity::digest_of(&policy),
        }
    }

    /// The quota of `policy`, counted under `identity` instead of its
    /// policy's: stores keep its count where they keep the counts of every
    /// quota of that identity. A consumer gives two policies one identity
    /// so that a count carries over from one to the other (the service
    /// keeps a limit's count when a reload changes only its
    /// `requests_per_unit`: [`Identity::of_count`]); it must never give
    /// one identity to two quotas of one decision, and only to policies
    /// whose states the stores can share (the same algorithm, window and
    /// parameters).
    pub fn with_identity(policy: Policy, identity: Identity) -> Self {
        Quota {
            policy,
            id: identity.digest(),
            identity: OnceLock::from(identity),
        }
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// What the stores count it under.
    pub fn identity(&self) -> &Identity {
        self.identity.get_or_init(|| Identity::of(&self.policy))
    }

    /// The identity's text: the policy's tag, [`Policy::tag`], or the
    /// identity it was given ([`Quota::with_identity`]).
    pub fn tag(&self) -> &str {
        self.identity().as_str()
    }

    /// The identity's digest ([`Identity::digest`]: FNV-1a of its text, the
    /// same in every process), for stores that hash a key together with its
    /// limit.
    pub fn id(&self) -> u64 {
        self.id
    }
}

/// Quotas are equal when their policies and their identities are.
impl PartialEq for Quota {
    fn eq(&self, other: &Self) -> bool {
        self.policy == other.policy && self.id == other.id
    }
}

impl From<Policy> for Quota {
    fn from(policy: Policy) -> Self {
        Quota::new(policy)
    }
}

/// Why a store could not decide. Being refused is a [`Decision`], never an
/// error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The store did not answer in time.
    #[error("the store did not answer within {0:?}")]
    Timeout(Duration),
    /// The store cannot answer now (a connection or server failure, or a
    /// backoff after one); [`FailOver`] applies its policy.
    #[error("the store cannot answer")]
    Unavailable(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// This store cannot keep this limit (an algorithm or a range it has
    /// no form for): the request's or the config's fault, never retried.
    #[error("the limit `{policy}` cannot be kept in this store: {reason}")]
    Unsupported {
        /// The limit.
        policy: String,
        /// Why.
        reason: String,
    },
    /// The store refuses this key: larger than its memory budget's share,
    /// or beyond a bounded buffer.
    #[error("the store cannot hold this key: {0}")]
    KeyRefused(String),
    /// A request named no limit.
    #[error("a decision needs at least one limit")]
    NoQuota,
}

impl StoreError {
    /// An [`StoreError::Unavailable`] from any error.
    pub fn unavailable(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        StoreError::Unavailable(e.into())
    }

    /// Whether the failure is the store's (a timeout or an outage), for
    /// which a failure policy decides instead, rather than the request's.
    pub fn is_outage(&self) -> bool {
        matches!(self, StoreError::Timeout(_) | StoreError::Unavailable(_))
    }
}

/// What a store holds and how it has fared, for metrics. Figures a store
/// does not have are 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreStats {
    /// Keys held in this process's memory.
    pub keys: usize,
    /// Most keys held at once.
    pub capacity: usize,
    /// Live keys evicted to make room.
    pub evictions: u64,
    /// Idle keys dropped.
    pub reclaimed: u64,
    /// Bytes in use in this process.
    pub bytes: usize,
    /// Calls to a remote store that failed (an error or a timeout).
    pub errors: u64,
    /// Hybrid mode: commands the syncs sent.
    pub sync_commands: u64,
    /// Redis: the script calls sent for decisions and charges.
    pub script_calls: u64,
    /// Redis: the requests those calls carried (more than the calls when
    /// requests that waited together went in one).
    pub script_requests: u64,
    /// Hybrid mode: keys whose counts wait for the next sync.
    pub pending_keys: u64,
    /// Bounded hybrid mode: requests refused because this instance's lease
    /// of the key was spent (another instance may hold unused share).
    pub lease_refusals: u64,
    /// The decisions of a [`FailOver`] by who made them.
    pub failover: FailOverStats,
    /// New keys started from the summary of evicted counters (a count it
    /// says they may still hold).
    pub seeded: u64,
    /// New keys the summary vouched for and the store did not hold (their
    /// count went into the summary).
    pub summarised: u64,
    /// The summary's cells, and those holding an unexpired count: their
    /// ratio is how full it is.
    pub summary_cells: u64,
    /// See [`StoreStats::summary_cells`].
    pub summary_live: u64,
    /// The estimated share of new keys, never evicted, that start from a
    /// non-zero estimate, in parts per million (a bound on the share
    /// refused early; of several stores, the largest).
    pub summary_false_seed_ppm: u64,
}

impl StoreStats {
    /// The in-memory figures of a store.
    pub fn memory(keys: usize, capacity: usize, evictions: u64, reclaimed: u64, bytes: usize) -> Self {
        StoreStats {
            keys,
            capacity,
            evictions,
            reclaimed,
            bytes,
            ..StoreStats::default()
        }
    }

    /// These figures with the summary of evicted counters'.
    pub fn with_summary(mut self, seeded: u64, summarised: u64, cells: u64, live: u64, false_seed_ppm: u64) -> Self {
        self.seeded = seeded;
        self.summarised = summarised;
        self.summary_cells = cells;
        self.summary_live = live;
        self.summary_false_seed_ppm = false_seed_ppm;
        self
    }
}

/// Both stores' figures added.
impl std::ops::Add for StoreStats {
    type Output = StoreStats;

    fn add(self, other: StoreStats) -> StoreStats {
        StoreStats {
            keys: self.keys + other.keys,
            capacity: self.capacity + other.capacity,
            evictions: self.evictions + other.evictions,
            reclaimed: self.reclaimed + other.reclaimed,
            bytes: self.bytes + other.bytes,
            errors: self.errors + other.errors,
            sync_commands: self.sync_commands + other.sync_commands,
            script_calls: self.script_calls + other.script_calls,
            script_requests: self.script_requests + other.script_requests,
            lease_refusals: self.lease_refusals + other.lease_refusals,
            pending_keys: self.pending_keys + other.pending_keys,
            failover: self.failover + other.failover,
            seeded: self.seeded + other.seeded,
            summarised: self.summarised + other.summarised,
            summary_cells: self.summary_cells + other.summary_cells,
            summary_live: self.summary_live + other.summary_live,
            summary_false_seed_ppm: self.summary_false_seed_ppm.max(other.summary_false_seed_ppm),
        }
    }
}

/// Decides requests on keys against limits. Implemented by the in-memory
/// store, Redis (one server, Sentinel, Cluster), the hybrid mode and
/// [`FailOver`]; consumers hold `S: Store`, or `Arc<dyn DynStore>` to pick
/// one at run time.
///
/// # Contract
///
/// - `decide` is all or nothing: either every quota is charged `cost`, or
///   none is; it is atomic with respect to every other call on the same
///   key (one lock in memory, one script call in Redis). A quota that
///   would admit while another refuses shows its peek (not charged); a
///   refusing quota shows its own refusal at this cost (with its retry).
/// - `cost == 0` peeks: it changes nothing.
/// - A key's counts under one quota are its counts under that quota in
///   every call, whichever other quotas the call names; equal quotas (one
///   tag) are one count, so a call names distinct quotas (the layer refuses two
///   limits of one policy; the service asks one of them for both).
pub trait Store: Send + Sync {
    /// Decides `cost` on `key` against every quota in `quotas`, pushing
    /// one decision per quota, in order, onto `out` (cleared first).
    ///
    /// # Errors
    ///
    /// A [`StoreError`] when the store cannot decide; nothing is charged
    /// then.
    fn decide<'a>(
        &'a self,
        key: &'a str,
        quotas: &'a [Quota],
        cost: u64,
        out: &'a mut Decisions,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a;

    /// Records `cost` on `key` under every quota even past its limit: for
    /// a cost known only after the response (the tokens of a streamed
    /// answer, Envoy's `apply_on_stream_done`). The next request sees it.
    ///
    /// # Errors
    ///
    /// As [`Store::decide`].
    fn charge<'a>(
        &'a self,
        key: &'a str,
        quotas: &'a [Quota],
        cost: u64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a;

    /// Forgets the counts of `key` under every quota; true if any were held.
    ///
    /// # Errors
    ///
    /// As [`Store::decide`].
    fn reset<'a>(
        &'a self,
        key: &'a str,
        quotas: &'a [Quota],
    ) -> impl Future<Output = Result<bool, StoreError>> + Send + 'a;

    /// What the store holds and how it has fared.
    fn stats(&self) -> StoreStats;

    /// [`Store::decide`] made now, without a future, for stores that do
    /// no IO; `None` (the default) for the others, which must be awaited.
    fn decide_now(
        &self,
        key: &str,
        quotas: &[Quota],
        cost: u64,
        out: &mut Decisions,
    ) -> Option<Result<(), StoreError>> {
        let _ = (key, quotas, cost, out);
        None
    }

    /// Whether this store can keep `quota` (checked when a config is
    /// loaded, so that a bad limit is refused there, not per request).
    ///
    /// # Errors
    ///
    /// [`StoreError::Unsupported`] naming the limit and the reason.
    fn supports(&self, quota: &Quota) -> Result<(), StoreError> {
        let _ = quota;
        Ok(())
    }

    /// Sends what the store holds back (the hybrid mode's counts not yet
    /// synced), at shutdown; nothing to do by default.
    ///
    /// # Errors
    ///
    /// As [`Store::decide`].
    fn flush(&self) -> impl Future<Output = Result<(), StoreError>> + Send + '_ {
        std::future::ready(Ok(()))
    }
}

/// Decides `cost` against `decisions.len()` quotas whose states a store
/// holds under one lock, all or nothing: `check(j, cost)` decides quota
/// `j` (charging if admitted, never when `cost` is 0). The in-memory
/// store's rule, written once for every store that holds its states
/// locally.
///
/// Every quota is first peeked; if `cost` fits every peek's `remaining`,
/// each is charged. Otherwise nothing is charged: each quota that fits
/// shows its peek, each that does not shows its refusal at `cost`. A
/// quota's peek says exactly what a charge of `cost` would decide (the
/// core's headers are exact: `remaining` passes, `remaining + 1` does not),
/// so the charges admit.
pub fn decide_all(quotas: usize, cost: u64, out: &mut Decisions, mut check: impl FnMut(usize, u64) -> Decision) {
    out.clear();
    if quotas == 1 || cost == 0 {
        // One quota: a refused check charges nothing, so no peek is needed.
        for j in 0..quotas {
            out.push(check(j, cost));
        }
        return;
    }
    for j in 0..quotas {
        out.push(check(j, 0));
    }
    let all_fit = out.iter().all(|d| cost <= d.remaining());
    for (j, d) in out.iter_mut().enumerate() {
        if all_fit || cost > d.remaining() {
            *d = check(j, cost);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use slidegate_core::{Algorithm, Weighting};

    #[test]
    fn a_quota_is_its_policys_tag_and_the_tags_fnv_digest() {
        let algorithm = Algorithm::SlidingWindow {
            buckets: 8,
            weighting: Weighting::Conservative,
        };
        let policy = Policy::new(100, Duration::from_secs(60), algorithm).expect("a valid policy");
        let quota = Quota::new(policy);
        assert_eq!(quota.tag(), "v1:sliding_window:100:60000000000:8c");
        // FNV-1a of the tag's text, computed here from its definition (the
        // identity's digest: the in-memory store counts by the same text as
        // Redis).
        let bytes = quota.tag().as_bytes().to_vec();
        let mut fnv: u64 = 0xcbf2_9ce4_8422_2325;
        for b in bytes {
            fnv ^= u64::from(b);
            fnv = fnv.wrapping_mul(0x100_0000_01b3);
        }
        assert_eq!(quota.id(), fnv);
        // A clone made before the tag was asked for, and one after, are equal.
        let early = Quota::new(policy);
        assert_eq!(early, quota);
        assert_eq!(early.tag(), quota.tag());
        let other = Quota::new(Policy::new(101, Duration::from_secs(60), algorithm).expect("a valid policy"));
        assert_ne!(other, quota);
        assert_ne!(other.id(), quota.id());
        // Given an identity: counted as it, whatever the limit.
        let rule = Identity::parse("rule-7").expect("an identity");
        let a = Quota::with_identity(policy, rule.clone());
        let b = Quota::with_identity(*other.policy(), rule);
        assert_eq!((a.tag(), a.id()), (b.tag(), b.id()));
        assert_ne!(a, b);
        assert_ne!(a, quota);
        // A quota given its policy's own identity counts as the policy's.
        let same = Quota::with_identity(policy, Identity::of(&policy));
        assert_eq!((same.tag(), same.id()), (quota.tag(), quota.id()));
        assert_eq!(same, quota);
    }

    #[test]
    fn quotas_of_different_tags_have_different_ids() {
        let w = Duration::from_secs(60);
        let algorithms = [
            Algorithm::SlidingWindow {
                buckets: 8,
                weighting: Weighting::Conservative,
            },
            Algorithm::SlidingWindow {
                buckets: 8,
                weighting: Weighting::Interpolated,
            },
            Algorithm::SlidingWindow {
                buckets: 2,
                weighting: Weighting::Conservative,
            },
            Algorithm::FixedWindow,
            Algorithm::SlidingLog,
            Algorithm::Gcra { burst: 1 },
            Algorithm::Gcra { burst: 10 },
            Algorithm::ExponentialHistogram { epsilon: 0.01 },
            Algorithm::ExponentialHistogram { epsilon: 0.1 },
        ];
        let mut quotas = Vec::new();
        for algorithm in algorithms {
            for (limit, window) in [(10, w), (11, w), (10, w * 2)] {
                quotas.push(Quota::new(
                    Policy::new(limit, window, algorithm).expect("a valid policy"),
                ));
            }
        }
        for (i, a) in quotas.iter().enumerate() {
            for b in &quotas[i + 1..] {
                assert_ne!(a.tag(), b.tag());
                assert_ne!(a.id(), b.id(), "{} and {}", a.tag(), b.tag());
            }
        }
    }
}
