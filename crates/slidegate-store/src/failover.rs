//! The failure policy, as one wrapper over any store.

use crate::{Decisions, Quota, Store, StoreError, StoreStats};
use slidegate_core::{Algorithm, Decision, Policy};
use smallvec::SmallVec;
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Waker};
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
    /// of instances sharing the limit. `instances` 0 counts as 1.
    ///
    /// Each instance falls back from its share of what the store last told
    /// it, not from zero: after every decision the store answers, the local
    /// count of each limit is raised (never lowered; it leaves the local
    /// window as any count does) to `⌈used / N⌉`, where `used` is the
    /// store's count in that decision (the limit minus what remains) and
    /// `N` is `instances`.
    ///
    /// # Bound
    ///
    /// Take one key, one limit `L` of a window (`sliding_window`,
    /// `fixed_window`, `sliding_log`; a `gcra` falls back likewise from its
    /// share of the backlog the store reported, in units of its burst or
    /// limit, whichever is smaller), `N` instances, and `uᵢ` the largest
    /// count the store reported to instance `i` for the key in the window
    /// before the instance's first local decision there (for one outage,
    /// the count it last saw before it; 0 if none). From that
    /// report on, its local count holds at least `⌈uᵢ/N⌉` through the
    /// window, so instance `i` admits at most `⌈L/N⌉ − ⌈uᵢ/N⌉` locally in
    /// the window, however many outages it meets; the store admits at most
    /// `L` in the window each time it starts counting afresh. So the `N`
    /// instances together admit in one window at most
    ///
    /// ```text
    /// L × (1 + R) + Σᵢ (⌈L/N⌉ − ⌈uᵢ/N⌉)
    /// ```
    ///
    /// where `R` is how many times the store came back empty in the window
    /// (0 for a store paused or unreachable that keeps its counts, 1 for
    /// one restart without persistence). When every instance saw the key at
    /// its limit (`uᵢ = L`) that is `L` through a pause and `2L` through an
    /// empty restart; when none saw it, `L + N⌈L/N⌉ ≤ 2L + N − 1` and
    /// `2L + N⌈L/N⌉`, as if each fell back from zero (which all did before
    /// this seeding: 100 and 150 with 2 instances on a limit of 50). An
    /// instance the bound does not count (more instances than `N`) adds
    /// `⌈L/N⌉`; a `sliding_window` holds the bound as closely as it holds
    /// its limit.
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
/// by source and outcome ([`FailOverStats`], in [`Store::stats`]). Under
/// [`FailurePolicy::Local`] every decision of `S` also raises the local
/// count to this instance's share of `S`'s (a peek of `L`, and a charge
/// when the share grew), so that an outage starts from it (see the
/// policy's bound).
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

    /// The local store and the instances, under [`FailurePolicy::Local`].
    fn local_policy(&self) -> Option<(&L, u64)> {
        match (self.policy, &self.local) {
            (FailurePolicy::Local { instances }, Some(local)) => Some((local, instances)),
            _ => None,
        }
    }

    /// Under [`FailurePolicy::Local`], raises the local count of each of
    /// `quotas`' shares to this instance's share of the store's count in
    /// `decided` (the store's decisions on them): `⌈used / N⌉`, where
    /// `used` is what the store's decision says is held. A local count
    /// already as high stays. Costs a peek of the local store per
    /// decision, and a charge when the share grew.
    async fn seed(&self, key: &str, quotas: &[Quota], decided: &Decisions) {
        let Some((local, instances)) = self.local_policy() else {
            return;
        };
        let n = instances.max(1);
        let wanted: SmallVec<[u64; 4]> = quotas
            .iter()
            .zip(decided)
            .map(|(q, d)| held(q.policy(), d).div_ceil(n))
            .collect();
        if wanted.iter().all(|&w| w == 0) {
            return;
        }
        let shares = shares(quotas, instances);
        let mut seen = Decisions::new();
        if local.decide(key, &shares, 0, &mut seen).await.is_err() {
            return;
        }
        let mut charged = Decisions::new();
        for ((share, seen), &wanted) in shares.iter().zip(&seen).zip(&wanted) {
            // What is missing, within what the share can still take now
            // (a decision of exactly `remaining` admits).
            let missing = wanted.saturating_sub(held(share.policy(), seen)).min(seen.remaining());
            if missing > 0 {
                let _ = local
                    .decide(key, std::slice::from_ref(share), missing, &mut charged)
                    .await;
            }
        }
    }

    /// The failure policy's decisions, and who made them.
    async fn fall_back(&self, key: &str, quotas: &[Quota], cost: u64, out: &mut Decisions) -> Source {
        bump(&self.counters.outages);
        out.clear();
        if let Some((local, instances)) = self.local_policy() {
            let shares = shares(quotas, instances);
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

/// The quotas of each of `quotas`' shares (see [`share_of`]), which the
/// local store counts: inline for up to four.
fn shares(quotas: &[Quota], instances: u64) -> SmallVec<[Quota; 4]> {
    quotas
        .iter()
        .map(|q| Quota::new(share_of(q.policy(), instances)))
        .collect()
}

/// The units `decision` (on `policy`) says are held: what its policy can
/// hold at most (the limit, or a `gcra`'s burst if smaller) minus what
/// remains. Never more than the state holds (a `gcra` whose burst exceeds
/// its limit may hold more).
fn held(policy: &Policy, decision: &Decision) -> u64 {
    let most = match policy.algorithm() {
        Algorithm::Gcra { burst } => burst.min(policy.limit()),
        _ => policy.limit(),
    };
    most.saturating_sub(decision.remaining())
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
            Ok(()) => {
                self.seed(key, quotas, out).await;
                Source::Store
            }
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
                if let Some((local, instances)) = self.local_policy() {
                    // Counted locally, as the local decisions are.
                    let _ = local.charge(key, &shares(quotas, instances), cost).await;
                }
                Ok(())
            }
            other => other,
        }
    }

    /// Resets in the store, and a `Local` policy's local counts with it
    /// (the share seeded from the store's count goes too); while the store
    /// is down, a `Local` policy forgets the local counts (the shared ones
    /// stay), the others report the outage.
    async fn reset(&self, key: &str, quotas: &[Quota]) -> Result<bool, StoreError> {
        let answer = self.inner.reset(key, quotas).await;
        let Some((local, instances)) = self.local_policy() else {
            return answer;
        };
        match answer {
            Err(e) if e.is_outage() => local.reset(key, &shares(quotas, instances)).await,
            Ok(held) => {
                let _ = local.reset(key, &shares(quotas, instances)).await;
                Ok(held)
            }
            Err(e) => Err(e),
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
            Err(e) => Some(Err(e)),
            Ok(()) => {
                // The local store does no IO (it is in memory): its seed is
                // made in this one poll. One that must wait is not seeded.
                let seed = pin!(self.seed(key, quotas, out));
                let _ = seed.poll(&mut Context::from_waker(Waker::noop()));
                self.count(Source::Store, out);
                Some(Ok(()))
            }
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

    /// Exact counts per key and quota that never expire (a window longer
    /// than any test): as the shared store (clones share the counts; it
    /// can be down, or restart empty) and as the local store.
    #[derive(Clone, Default)]
    struct Counter {
        counts: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<(String, u64), u64>>>,
        down: std::sync::Arc<AtomicBool>,
    }

    impl Counter {
        fn set_down(&self, down: bool) {
            self.down.store(down, Ordering::Relaxed);
        }

        /// Restarts empty: every count forgotten.
        fn restart_empty(&self) {
            self.counts.lock().unwrap().clear();
            self.set_down(false);
        }

        fn count(&self, key: &str, quota: &Quota) -> u64 {
            let counts = self.counts.lock().unwrap();
            counts.get(&(key.to_owned(), quota.id())).copied().unwrap_or(0)
        }

        fn decide_sync(&self, key: &str, quotas: &[Quota], cost: u64, out: &mut Decisions) -> Result<(), StoreError> {
            if self.down.load(Ordering::Relaxed) {
                return Err(StoreError::unavailable("connection refused"));
            }
            let mut counts = self.counts.lock().unwrap();
            let used = |q: &Quota| counts.get(&(key.to_owned(), q.id())).copied().unwrap_or(0);
            let fits = quotas.iter().all(|q| used(q) + cost <= q.policy().limit());
            out.clear();
            for q in quotas {
                let count = counts.entry((key.to_owned(), q.id())).or_insert(0);
                if fits {
                    *count += cost;
                }
                let p = q.policy();
                out.push(Decision::at(p, 0, fits, p.limit() - *count, 0, None, (*count, 0, 1)));
            }
            Ok(())
        }
    }

    impl Store for Counter {
        async fn decide(&self, key: &str, quotas: &[Quota], cost: u64, out: &mut Decisions) -> Result<(), StoreError> {
            self.decide_sync(key, quotas, cost, out)
        }

        async fn charge(&self, key: &str, quotas: &[Quota], cost: u64) -> Result<(), StoreError> {
            let mut counts = self.counts.lock().unwrap();
            for q in quotas {
                *counts.entry((key.to_owned(), q.id())).or_insert(0) += cost;
            }
            Ok(())
        }

        async fn reset(&self, key: &str, quotas: &[Quota]) -> Result<bool, StoreError> {
            let mut counts = self.counts.lock().unwrap();
            let mut held = false;
            for q in quotas {
                held |= counts.remove(&(key.to_owned(), q.id())).is_some();
            }
            Ok(held)
        }

        fn stats(&self) -> StoreStats {
            StoreStats::default()
        }

        fn decide_now(
            &self,
            key: &str,
            quotas: &[Quota],
            cost: u64,
            out: &mut Decisions,
        ) -> Option<Result<(), StoreError>> {
            Some(self.decide_sync(key, quotas, cost, out))
        }
    }

    /// `n` instances with the local policy on one shared store.
    fn instances(shared: &Counter, n: u64) -> Vec<FailOver<Counter, Counter>> {
        (0..n)
            .map(|_| FailOver::local(shared.clone(), n, Counter::default()))
            .collect()
    }

    fn limit(l: u64) -> Quota {
        Quota::new(Policy::new(l, Duration::from_secs(3600), Algorithm::FixedWindow).unwrap())
    }

    /// `calls` decisions of one unit on `key`, instance after instance,
    /// starting with the first; how many were admitted.
    fn spread(instances: &[FailOver<Counter, Counter>], key: &str, quota: &Quota, calls: usize) -> u64 {
        let mut out = Decisions::new();
        let mut admitted = 0;
        for i in 0..calls {
            let instance = &instances[i % instances.len()];
            block_on(instance.decide(key, std::slice::from_ref(quota), 1, &mut out)).unwrap();
            admitted += u64::from(out[0].allowed());
        }
        admitted
    }

    /// The local count of instance `i`'s share of `quota`.
    fn local_count(instances: &[FailOver<Counter, Counter>], i: usize, key: &str, quota: &Quota) -> u64 {
        let n = instances.len() as u64;
        let share = Quota::new(share_of(quota.policy(), n));
        instances[i].local.as_ref().unwrap().count(key, &share)
    }

    #[test]
    fn each_instance_falls_back_from_its_share_of_the_store_count() {
        // Two instances, 50 per window. Each sees the limit reached: the
        // last of 52 calls spread over both are refused by the store.
        let shared = Counter::default();
        let two = instances(&shared, 2);
        let quota = limit(50);
        assert_eq!(spread(&two, "k", &quota, 52), 50);
        assert_eq!(local_count(&two, 0, "k", &quota), 25);
        assert_eq!(local_count(&two, 1, "k", &quota), 25);
        // Paused: nothing more (it was 25 each, 100 in all, from zero).
        shared.set_down(true);
        assert_eq!(spread(&two, "k", &quota, 60), 0);
        assert_eq!(two[0].failover_stats().local_refused, 30);
        // Back with its counts: still the limit in all.
        shared.set_down(false);
        assert_eq!(spread(&two, "k", &quota, 10), 0);
        // Restarted empty: the store admits the limit again, 2L in all
        // (it was 150, from zero); down again, the instances stay at their
        // share: the store's new count never lowers it.
        shared.restart_empty();
        assert_eq!(spread(&two, "k", &quota, 60), 50);
        shared.set_down(true);
        assert_eq!(spread(&two, "k", &quota, 60), 0);
        // A key one instance never saw: that one falls back from zero,
        // L + (N − 1)⌈L/N⌉ in all.
        shared.set_down(false);
        assert_eq!(spread(&two[..1], "one", &quota, 50), 50);
        shared.set_down(true);
        assert_eq!(spread(&two, "one", &quota, 60), 25);
        assert_eq!(
            (local_count(&two, 0, "one", &quota), local_count(&two, 1, "one", &quota)),
            (25, 25)
        );
    }

    #[test]
    fn the_bound_with_rounded_shares() {
        // Four instances, 50 per window: shares of ⌈50/4⌉ = 13. 26 calls
        // through the store, one instance after another: the last counts
        // the instances saw were 25, 26, 23 and 24, seeded as ⌈u/4⌉.
        let shared = Counter::default();
        let four = instances(&shared, 4);
        let quota = limit(50);
        assert_eq!(spread(&four, "k", &quota, 26), 26);
        let seeded: Vec<u64> = (0..4).map(|i| local_count(&four, i, "k", &quota)).collect();
        assert_eq!(seeded, [7, 7, 6, 6]);
        // Paused: Σ (13 − ⌈uᵢ/4⌉) = 26 locally; back, the store admits
        // what it has left, 24: L + Σ (⌈L/N⌉ − ⌈uᵢ/N⌉) = 76 in all.
        shared.set_down(true);
        assert_eq!(spread(&four, "k", &quota, 80), 26);
        shared.set_down(false);
        assert_eq!(spread(&four, "k", &quota, 80), 24);
        assert_eq!(26 + 26 + 24, 50 + (4 * 13 - (7 + 7 + 6 + 6)));
        // A count that does not divide: 50 seen by all, ⌈50/4⌉ = 13 each,
        // nothing left locally.
        assert_eq!(spread(&four, "full", &quota, 54), 50);
        let seeded: Vec<u64> = (0..4).map(|i| local_count(&four, i, "full", &quota)).collect();
        assert_eq!(seeded, [13; 4]);
        shared.set_down(true);
        assert_eq!(spread(&four, "full", &quota, 80), 0);
    }

    #[test]
    fn a_decision_made_now_seeds_too_and_a_reset_forgets_the_seed() {
        let shared = Counter::default();
        let two = instances(&shared, 2);
        let quotas = [limit(50), limit(10)];
        let mut out = Decisions::new();
        for _ in 0..7 {
            two[0].decide_now("k", &quotas, 1, &mut out).unwrap().unwrap();
        }
        // Shares ⌈7/2⌉ = 4 of each: local counts 4 of 25 and 4 of 5.
        assert_eq!(local_count(&two, 0, "k", &quotas[0]), 4);
        assert_eq!(local_count(&two, 0, "k", &quotas[1]), 4);
        assert_eq!(two[0].failover_stats().store_admitted, 7);
        // A reset in the store resets the local counts too.
        assert!(block_on(two[0].reset("k", &quotas)).unwrap());
        assert_eq!(local_count(&two, 0, "k", &quotas[0]), 0);
        assert_eq!(shared.count("k", &quotas[0]), 0);
        // Past the smaller limit: refused by the store, which reports 10
        // held of it; the share is 5, all of the local share.
        assert_eq!(spread(&two[..1], "k", &quotas[1], 12), 10);
        assert_eq!(local_count(&two, 0, "k", &quotas[1]), 5);
    }

    #[test]
    fn what_a_decision_says_is_held() {
        let gcra = |limit, burst| Policy::new(limit, Duration::from_secs(60), Algorithm::Gcra { burst }).unwrap();
        let d = |p: &Policy, remaining| Decision::at(p, 0, true, remaining, 0, None, (0, 0, 1));
        let window = Policy::new(10, Duration::from_secs(60), Algorithm::FixedWindow).unwrap();
        assert_eq!(held(&window, &d(&window, 3)), 7);
        // A gcra holds its backlog out of its burst.
        let small_burst = gcra(10, 4);
        assert_eq!(held(&small_burst, &d(&small_burst, 1)), 3);
        // A burst above the limit: its remaining is capped at the limit,
        // so what is read is never more than is held.
        let big_burst = gcra(5, 10);
        assert_eq!(held(&big_burst, &d(&big_burst, 5)), 0);
        assert_eq!(held(&big_burst, &d(&big_burst, 3)), 2);
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
