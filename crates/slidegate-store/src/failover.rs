//! The failure policy, as one wrapper over any store.

use crate::{Decisions, Quota, Store, StoreError, StoreStats};
use slidegate_core::{Algorithm, Decision, Policy};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// What [`FailOver`] does when its store cannot answer (an outage: an
/// error or a timeout, [`StoreError::is_outage`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Admit, counting nothing (as Envoy, Kong and Stripe do by default):
    /// the service stays up, unlimited while the store is down.
    #[default]
    Open,
    /// Refuse, with a retry after [`FailOver::with_retry_after`]: nothing
    /// passes unlimited, nothing passes at all while the store is down.
    Closed,
    /// Decide in a local store of this process, on each limit divided by
    /// `instances` (rounded up, at least 1; a `gcra` burst too), the number
    /// of instances sharing the limit: together they admit about the limit
    /// while the shared store is down. `instances` 0 counts as 1.
    Local {
        /// How many instances share the limit.
        instances: u64,
    },
}

impl FailurePolicy {
    /// The policy's name in flags and metrics: `open`, `closed`, `local`.
    pub fn name(self) -> &'static str {
        match self {
            FailurePolicy::Open => "open",
            FailurePolicy::Closed => "closed",
            FailurePolicy::Local { .. } => "local",
        }
    }
}

/// Who made a decision of a [`FailOver`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Source {
    /// The wrapped store.
    Store,
    /// [`FailurePolicy::Open`]: admitted without counting.
    FailOpen,
    /// [`FailurePolicy::Closed`], or a key the local store could not hold.
    FailClosed,
    /// [`FailurePolicy::Local`]: the local store.
    Local,
}

impl Source {
    /// The source's name in metrics.
    pub fn name(self) -> &'static str {
        match self {
            Source::Store => "store",
            Source::FailOpen => "fail_open",
            Source::FailClosed => "fail_closed",
            Source::Local => "local",
        }
    }
}

/// The decisions of a [`FailOver`] by source and outcome, and the
/// outages it saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FailOverStats {
    /// Decisions of the store, admitted.
    pub store_admitted: u64,
    /// Decisions of the store, refused.
    pub store_refused: u64,
    /// Admitted by [`FailurePolicy::Open`].
    pub fail_open: u64,
    /// Refused by [`FailurePolicy::Closed`] (or a key the local store
    /// could not hold).
    pub fail_closed: u64,
    /// Decisions of the local store, admitted.
    pub local_admitted: u64,
    /// Decisions of the local store, refused.
    pub local_refused: u64,
    /// Calls that met an outage of the store.
    pub outages: u64,
}

impl FailOverStats {
    /// The decisions made without the store.
    pub fn fallbacks(&self) -> u64 {
        self.fail_open + self.fail_closed + self.local_admitted + self.local_refused
    }
}

impl std::ops::Add for FailOverStats {
    type Output = FailOverStats;

    fn add(self, o: FailOverStats) -> FailOverStats {
        FailOverStats {
            store_admitted: self.store_admitted + o.store_admitted,
            store_refused: self.store_refused + o.store_refused,
            fail_open: self.fail_open + o.fail_open,
            fail_closed: self.fail_closed + o.fail_closed,
            local_admitted: self.local_admitted + o.local_admitted,
            local_refused: self.local_refused + o.local_refused,
            outages: self.outages + o.outages,
        }
    }
}

#[derive(Default)]
struct Counters {
    store_admitted: AtomicU64,
    store_refused: AtomicU64,
    fail_open: AtomicU64,
    fail_closed: AtomicU64,
    local_admitted: AtomicU64,
    local_refused: AtomicU64,
    outages: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Any store with a failure policy: on an outage of `S` (an error or a
/// timeout), [`FailurePolicy`] decides — open, closed, or the local store
/// `L` on each limit shared by the instances. Every decision is counted
/// by source and outcome ([`FailOverStats`], in [`Store::stats`]).
///
/// A request's own fault ([`StoreError::Unsupported`]) is not an outage:
/// it is passed on as the error it is. A store that backs off after a
/// failure (the Redis store does) answers its outage at once, so a dead
/// store costs no timeout per call.
pub struct FailOver<S, L = S> {
    inner: S,
    policy: FailurePolicy,
    local: Option<L>,
    retry_after: Duration,
    counters: Counters,
}

impl<S: Store> FailOver<S, S> {
    /// `inner` with [`FailurePolicy::Open`] or [`FailurePolicy::Closed`]
    /// (a `Local` policy without a local store refuses, as `Closed`; see
    /// [`FailOver::local`]).
    pub fn new(inner: S, policy: FailurePolicy) -> Self {
        FailOver {
            inner,
            policy,
            local: None,
            retry_after: Duration::from_millis(100),
            counters: Counters::default(),
        }
    }
}

impl<S: Store, L: Store> FailOver<S, L> {
    /// `inner` with [`FailurePolicy::Local`] over `local` (an in-memory
    /// store of this process).
    pub fn local(inner: S, instances: u64, local: L) -> Self {
        FailOver {
            inner,
            policy: FailurePolicy::Local { instances },
            local: Some(local),
            retry_after: Duration::from_millis(100),
            counters: Counters::default(),
        }
    }

    /// The same wrapper whose closed refusals say to retry after `wait`
    /// (100 ms by default).
    #[must_use]
    pub fn with_retry_after(mut self, wait: Duration) -> Self {
        self.retry_after = wait;
        self
    }

    /// The failure policy.
    pub fn policy(&self) -> FailurePolicy {
        self.policy
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// The decisions so far by source and outcome.
    pub fn failover_stats(&self) -> FailOverStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        FailOverStats {
            store_admitted: get(&c.store_admitted),
            store_refused: get(&c.store_refused),
            fail_open: get(&c.fail_open),
            fail_closed: get(&c.fail_closed),
            local_admitted: get(&c.local_admitted),
            local_refused: get(&c.local_refused),
            outages: get(&c.outages),
        }
    }

    fn count(&self, source: Source, out: &Decisions) {
        let admitted = out.iter().all(Decision::allowed);
        let c = &self.counters;
        bump(match (source, admitted) {
            (Source::Store, true) => &c.store_admitted,
            (Source::Store, false) => &c.store_refused,
            (Source::FailOpen, _) => &c.fail_open,
            (Source::FailClosed, _) => &c.fail_closed,
            (Source::Local, true) => &c.local_admitted,
            (Source::Local, false) => &c.local_refused,
        });
    }

    /// The failure policy's decisions, and who made them.
    async fn fall_back(&self, key: &str, quotas: &[Quota], cost: u64, out: &mut Decisions) -> Source {
        bump(&self.counters.outages);
        out.clear();
        if let (FailurePolicy::Local { instances }, Some(local)) = (self.policy, &self.local) {
            let shares: Vec<Quota> = quotas
                .iter()
                .map(|q| Quota::new(share_of(q.policy(), instances)))
                .collect();
            if local.decide(key, &shares, cost, out).await.is_ok() {
                return Source::Local;
            }
            out.clear();
        }
        let open = self.policy == FailurePolicy::Open;
        let retry = u64::try_from(self.retry_after.as_nanos()).unwrap_or(u64::MAX);
        out.extend(quotas.iter().map(|q| {
            let p = q.policy();
            if open {
                // Admitted, nothing counted.
                Decision::at(p, 0, true, p.limit(), 0, None, (0, 0, 1))
            } else {
                // Refused until the store is tried again.
                Decision::at(p, 0, false, 0, retry, Some(retry), (0, 0, 1))
            }
        }));
        if open { Source::FailOpen } else { Source::FailClosed }
    }
}

/// One instance's share of `policy`: its limit (and a `gcra` burst)
/// divided by `instances`, rounded up, at least 1 (`instances` 0 counts as
/// 1). The local failure policy decides on it, and the hybrid mode on a
/// key not yet synced.
pub fn share_of(policy: &Policy, instances: u64) -> Policy {
    let n = instances.max(1);
    let share = |x: u64| x.div_ceil(n).max(1);
    let algorithm = match policy.algorithm() {
        Algorithm::Gcra { burst } => Algorithm::Gcra { burst: share(burst) },
        other => other,
    };
    Policy::new(share(policy.limit()), policy.window(), algorithm).unwrap_or(*policy)
}

impl<S: Store, L: Store> Store for FailOver<S, L> {
    async fn decide(&self, key: &str, quotas: &[Quota], cost: u64, out: &mut Decisions) -> Result<(), StoreError> {
        let source = match self.inner.decide(key, quotas, cost, out).await {
            Ok(()) => Source::Store,
            Err(e) if e.is_outage() => self.fall_back(key, quotas, cost, out).await,
            Err(e) => return Err(e),
        };
        self.count(source, out);
        Ok(())
    }

    async fn charge(&self, key: &str, quotas: &[Quota], cost: u64) -> Result<(), StoreError> {
        match self.inner.charge(key, quotas, cost).await {
            Err(e) if e.is_outage() => {
                bump(&self.counters.outages);
                if let (FailurePolicy::Local { instances }, Some(local)) = (self.policy, &self.local) {
                    let shares: Vec<Quota> = quotas
                        .iter()
                        .map(|q| Quota::new(share_of(q.policy(), instances)))
                        .collect();
                    // Counted locally, as the local decisions are.
                    let _ = local.charge(key, &shares, cost).await;
                }
                Ok(())
            }
            other => other,
        }
    }

    /// Resets in the store; while it is down, a `Local` policy forgets the
    /// local counts (the shared ones stay), the others report the outage.
    async fn reset(&self, key: &str, quotas: &[Quota]) -> Result<bool, StoreError> {
        match self.inner.reset(key, quotas).await {
            Err(e) if e.is_outage() => match (self.policy, &self.local) {
                (FailurePolicy::Local { instances }, Some(local)) => {
                    let shares: Vec<Quota> = quotas
                        .iter()
                        .map(|q| Quota::new(share_of(q.policy(), instances)))
                        .collect();
                    local.reset(key, &shares).await
                }
                _ => Err(e),
            },
            other => other,
        }
    }

    fn stats(&self) -> StoreStats {
        let mut stats = self.inner.stats();
        stats.failover = stats.failover + self.failover_stats();
        stats
    }

    fn decide_now(
        &self,
        key: &str,
        quotas: &[Quota],
        cost: u64,
        out: &mut Decisions,
    ) -> Option<Result<(), StoreError>> {
        // A store that decides without IO (in memory, the hybrid mode's
        // local views) decides now; an outage it reports (the hybrid
        // mode's stale syncs) goes the awaited way, through the policy.
        match self.inner.decide_now(key, quotas, cost, out)? {
            Err(e) if e.is_outage() => None,
            done => Some(done.inspect(|()| self.count(Source::Store, out))),
        }
    }

    fn supports(&self, quota: &Quota) -> Result<(), StoreError> {
        self.inner.supports(quota)
    }

    fn flush(&self) -> impl Future<Output = Result<(), StoreError>> + Send + '_ {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    /// A store that is down, or (when up) admits everything; it remembers
    /// whether it was asked.
    #[derive(Default)]
    struct Flaky {
        down: AtomicBool,
        unsupported: bool,
    }

    impl Store for Flaky {
        async fn decide(
            &self,
            _key: &str,
            quotas: &[Quota],
            _cost: u64,
            out: &mut Decisions,
        ) -> Result<(), StoreError> {
            if self.unsupported {
                return Err(StoreError::Unsupported {
                    policy: "p".to_owned(),
                    reason: "no form".to_owned(),
                });
            }
            if self.down.load(Ordering::Relaxed) {
                return Err(StoreError::unavailable("connection refused"));
            }
            out.clear();
            out.extend(
                quotas
                    .iter()
                    .map(|q| Decision::at(q.policy(), 0, true, 1, 0, None, (0, 0, 1))),
            );
            Ok(())
        }

        async fn charge(&self, _key: &str, _quotas: &[Quota], _cost: u64) -> Result<(), StoreError> {
            Err(StoreError::unavailable("connection refused"))
        }

        async fn reset(&self, _key: &str, _quotas: &[Quota]) -> Result<bool, StoreError> {
            Err(StoreError::unavailable("connection refused"))
        }

        fn stats(&self) -> StoreStats {
            StoreStats::default()
        }
    }

    fn quotas() -> Vec<Quota> {
        let p = |limit| Policy::new(limit, Duration::from_secs(60), Algorithm::Gcra { burst: 3 }).unwrap();
        vec![Quota::new(p(10)), Quota::new(p(4))]
    }

    fn block_on<F: Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    fn down() -> Flaky {
        Flaky {
            down: AtomicBool::new(true),
            unsupported: false,
        }
    }

    #[test]
    fn open_admits_every_limit_counting_nothing() {
        let store = FailOver::new(down(), FailurePolicy::Open);
        let mut out = Decisions::new();
        block_on(store.decide("k", &quotas(), 1, &mut out)).unwrap();
        assert!(out.iter().all(Decision::allowed));
        assert_eq!(out[0].remaining(), 10);
        let stats = store.stats().failover;
        assert_eq!((stats.fail_open, stats.outages, stats.fallbacks()), (1, 1, 1));
        // Back up: the store decides again, counted as the store's.
        store.inner().down.store(false, Ordering::Relaxed);
        block_on(store.decide("k", &quotas(), 1, &mut out)).unwrap();
        assert_eq!(store.failover_stats().store_admitted, 1);
    }

    #[test]
    fn closed_refuses_with_a_retry() {
        let store = FailOver::new(down(), FailurePolicy::Closed).with_retry_after(Duration::from_millis(250));
        let mut out = Decisions::new();
        block_on(store.decide("k", &quotas(), 1, &mut out)).unwrap();
        assert!(out.iter().all(|d| !d.allowed()));
        assert_eq!(out[1].retry_after(), Some(Duration::from_millis(250)));
        assert_eq!(store.failover_stats().fail_closed, 1);
        // A charge during an outage is not an error; a reset is.
        block_on(store.charge("k", &quotas(), 5)).unwrap();
        assert!(block_on(store.reset("k", &quotas())).is_err());
        assert_eq!(store.failover_stats().outages, 2);
    }

    #[test]
    fn local_decides_on_each_instances_share() {
        let local = Flaky::default();
        let store = FailOver::local(down(), 4, local);
        let mut out = Decisions::new();
        block_on(store.decide("k", &quotas(), 1, &mut out)).unwrap();
        // The local store saw the limits divided by 4, rounded up.
        assert_eq!(out[0].limit(), 3);
        assert_eq!(out[1].limit(), 1);
        assert_eq!(store.failover_stats().local_admitted, 1);
        let shared = share_of(quotas()[0].policy(), 4);
        assert_eq!(shared.algorithm(), Algorithm::Gcra { burst: 1 });
        assert_eq!(share_of(quotas()[0].policy(), 0).limit(), 10, "0 instances count as 1");
    }

    /// A store that decides without IO and reports an outage (the hybrid
    /// mode's stale syncs) gets the failure policy too.
    struct StaleLocal;

    impl Store for StaleLocal {
        async fn decide(
            &self,
            _key: &str,
            _quotas: &[Quota],
            _cost: u64,
            _out: &mut Decisions,
        ) -> Result<(), StoreError> {
            Err(StoreError::unavailable("stale syncs"))
        }

        async fn charge(&self, _key: &str, _quotas: &[Quota], _cost: u64) -> Result<(), StoreError> {
            Ok(())
        }

        async fn reset(&self, _key: &str, _quotas: &[Quota]) -> Result<bool, StoreError> {
            Ok(false)
        }

        fn stats(&self) -> StoreStats {
            StoreStats::default()
        }

        fn decide_now(
            &self,
            _key: &str,
            _quotas: &[Quota],
            _cost: u64,
            _out: &mut Decisions,
        ) -> Option<Result<(), StoreError>> {
            Some(Err(StoreError::unavailable("stale syncs")))
        }
    }

    #[test]
    fn an_outage_decided_now_goes_to_the_policy() {
        let store = std::sync::Arc::new(FailOver::new(StaleLocal, FailurePolicy::Open));
        let mut out = Decisions::new();
        assert!(store.decide_now("k", &quotas(), 1, &mut out).is_none());
        // Through `dyn`, as the service holds it.
        let dynamic: std::sync::Arc<dyn crate::DynStore> = store.clone();
        block_on(dynamic.decide("k", &quotas(), 1, &mut out)).unwrap();
        assert!(out.iter().all(Decision::allowed));
        assert_eq!(store.failover_stats().fail_open, 1);
    }

    #[test]
    fn a_request_fault_is_no_outage() {
        let store = FailOver::new(
            Flaky {
                down: AtomicBool::new(false),
                unsupported: true,
            },
            FailurePolicy::Open,
        );
        let mut out = Decisions::new();
        let e = block_on(store.decide("k", &quotas(), 1, &mut out)).unwrap_err();
        assert!(matches!(e, StoreError::Unsupported { .. }), "{e}");
        assert_eq!(store.failover_stats(), FailOverStats::default());
    }
}
