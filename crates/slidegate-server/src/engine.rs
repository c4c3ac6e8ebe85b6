//! The decision of a rate limit request against the loaded config, in the
//! shared counter store. gRPC and HTTP both come here, in plain Rust types.
//!
//! The counters are in one of two backends: bounded in-memory stores
//! (keyed by a hash of the counter key and the policy), or Redis
//! ([`RedisStore`]: keyed by the readable counter key under a prefix that
//! names the policy, so that every instance on the same Redis counts
//! together). Deciding is `async` for both; the memory backend never
//! awaits, so its decisions cost what they did when they were plain
//! functions (no boxing, no task switch).

use crate::config::{Config, ConfigError, DEFAULT_ALGORITHM, Limit, Unit};
use crate::redis_store::{RedisStats, RedisStore};
use parking_lot::RwLock;
use slidegate_core::{Algorithm, Clock, Decision, Policy, State, Weighting};
use slidegate_memory::{Budget, KeyState, Ring8, Stats, Store, StoreError, Timed};
use slidegate_redis::RedisStoreError;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

/// Limits on what one request may carry. A request beyond them is refused
/// as invalid, naming the limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InputLimits {
    /// Descriptors in one request.
    pub descriptors: usize,
    /// Entries in one descriptor.
    pub entries: usize,
    /// Bytes in a domain, an entry's key or value, or an ad-hoc key.
    pub text: usize,
}

impl Default for InputLimits {
    fn default() -> Self {
        InputLimits {
            descriptors: 64,
            entries: 16,
            text: 1024,
        }
    }
}

/// A descriptor's `limit` override: replaces the configured limits for
/// this request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Override {
    /// Requests per unit.
    pub requests_per_unit: u32,
    /// The unit; `None` for an unknown unit, which makes the override
    /// invalid.
    pub unit: Option<Unit>,
}

/// One descriptor of a request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Descriptor {
    /// Its (key, value) entries, in order.
    pub entries: Vec<(String, String)>,
    /// The `limit` override.
    pub limit: Option<Override>,
    /// The descriptor's own hits, which win over the request's when set
    /// (0 checks without counting).
    pub hits_addend: Option<u64>,
}

/// A rate limit request (Envoy's `RateLimitRequest`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Request {
    /// The config domain.
    pub domain: String,
    /// What to check.
    pub descriptors: Vec<Descriptor>,
    /// Hits per descriptor; 0 means 1.
    pub hits_addend: u32,
}

/// OK or over the limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    /// Within every limit (or in shadow mode).
    Ok,
    /// Over a limit.
    OverLimit,
}

/// A limit that applied to a descriptor, with its decision.
#[derive(Clone, Debug, PartialEq)]
pub struct Applied {
    /// Its name in the headers: the configured name, or `d<i>` (and `.j`
    /// for the j-th of several limits).
    pub name: String,
    /// The limit as configured (or overridden).
    pub requests_per_unit: u64,
    /// Its unit, when it has one.
    pub unit: Option<Unit>,
    /// Its policy; `None` for a limit of 0, which refuses everything.
    pub policy: Option<Policy>,
    /// The decision; `None` for a limit of 0.
    pub decision: Option<Decision>,
}

impl Applied {
    fn allowed(&self) -> bool {
        self.decision.as_ref().is_some_and(Decision::allowed)
    }

    fn remaining(&self) -> u64 {
        self.decision.as_ref().map_or(0, Decision::remaining)
    }
}

/// The answer for one descriptor.
#[derive(Clone, Debug, PartialEq)]
pub struct Status {
    /// OK or over the limit (always OK in shadow mode).
    pub code: Code,
    /// The limits that applied; empty when none did.
    pub applied: Vec<Applied>,
    /// The remaining count of the tightest limit; `u32::MAX` for an
    /// unlimited rule and when no limit applied.
    pub remaining: u64,
    /// How long until the tightest limit frees quota: the retry delay when
    /// refused, the time until all counted usage expires when admitted.
    pub until_reset: Option<Duration>,
    /// The index into `applied` of the tightest limit.
    pub tightest: Option<usize>,
    /// The rule was in shadow mode and would have refused.
    pub shadow_refused: bool,
    /// The matched rule's name in the metrics
    /// ([`Match::metric_key`](crate::config::Match::metric_key)), when a
    /// rule with a limit (or `unlimited`) matched.
    pub metric: Option<String>,
}

impl Status {
    fn unlimited() -> Self {
        Status {
            code: Code::Ok,
            applied: Vec::new(),
            remaining: u64::from(u32::MAX),
            until_reset: None,
            tightest: None,
            shadow_refused: false,
            metric: None,
        }
    }
}

/// The answer for a request.
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    /// OVER_LIMIT if any status not in shadow mode is, except that
    /// quota-mode descriptors count only when all of them are over.
    pub overall: Code,
    /// One per request descriptor, in order.
    pub statuses: Vec<Status>,
}

/// Why a request could not be decided.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// The request is malformed or over an input limit (gRPC
    /// `INVALID_ARGUMENT`, HTTP 400).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The store could not count (gRPC `UNAVAILABLE`, HTTP 503).
    #[error("the counter store cannot answer: {0}")]
    Unavailable(String),
}

/// An ad-hoc check: a key with its own policy, outside any config.
#[derive(Clone, Debug, PartialEq)]
pub struct AdHoc {
    /// The key.
    pub key: String,
    /// The policy.
    pub policy: Policy,
    /// The cost (0 peeks).
    pub cost: u64,
}

/// The counters: sliding windows of 2 to 8 buckets with limits that fit
/// 32 bits (the default algorithm) inline in their slot, every other
/// policy in the core's `State`. Each store is bounded by its own budget.
struct Counters {
    ring: Store<u64, Timed<Ring8<u32>>>,
    other: Store<u64, Timed<State>>,
}

impl Counters {
    fn check(&self, policy: &Policy, key: u64, now: u64, cost: u64) -> Result<Decision, StoreError> {
        if Timed::<Ring8<u32>>::suits(policy) {
            self.ring.check(policy, &key, now, cost)
        } else {
            self.other.check(policy, &key, now, cost)
        }
    }

    fn reset(&self, key: u64) -> bool {
        // A key lives in one store; asking both is cheaper than knowing which.
        self.ring.reset(&key) | self.other.reset(&key)
    }

    fn stats(&self) -> Stats {
        let (a, b) = (self.ring.stats(), self.other.stats());
        Stats {
            keys: a.keys + b.keys,
            capacity: a.capacity + b.capacity,
            evictions: a.evictions + b.evictions,
            reclaimed: a.reclaimed + b.reclaimed,
            bytes: a.bytes + b.bytes,
        }
    }
}

/// Where the counters are. A hybrid mode (local counting synced with
/// Redis) would be a third variant.
enum Backend {
    /// This process's bounded stores.
    Memory(Counters),
    /// Redis, shared by every instance on it.
    Redis(RedisStore),
}

/// Where one limit of a request counts: a hashed key in memory, or a
/// readable counter key in Redis.
#[derive(Clone, Copy)]
enum Slot<'a> {
    Memory(u64),
    Redis(&'a str),
}

/// Decides requests against a config, counting in bounded in-memory stores
/// or in Redis.
pub struct Engine<C> {
    config: RwLock<Arc<Config>>,
    backend: Backend,
    clock: C,
    hash: foldhash::fast::RandomState,
    limits: InputLimits,
}

impl<C: Clock> Engine<C> {
    /// An engine serving `config`, counting sliding windows of up to 8
    /// buckets (the default algorithm) within `budget` and every other
    /// algorithm within `other_budget`.
    pub fn new(config: Config, clock: C, budget: Budget, other_budget: Budget, limits: InputLimits) -> Self {
        Engine {
            config: RwLock::new(Arc::new(config)),
            backend: Backend::Memory(Counters {
                ring: Store::new(budget),
                other: Store::new(other_budget),
            }),
            clock,
            hash: Default::default(),
            limits,
        }
    }

    /// An engine serving `config`, counting in Redis (`clock` is unused:
    /// the scripts read Redis's `TIME`, one clock for every instance).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming a limit without a Redis form
    /// ([`RedisStore::check_config`]).
    pub fn with_redis(config: Config, clock: C, store: RedisStore, limits: InputLimits) -> Result<Self, ConfigError> {
        RedisStore::check_config(&config)?;
        Ok(Engine {
            config: RwLock::new(Arc::new(config)),
            backend: Backend::Redis(store),
            clock,
            hash: Default::default(),
            limits,
        })
    }

    /// The config in force.
    pub fn config(&self) -> Arc<Config> {
        Arc::clone(&self.config.read())
    }

    /// Replaces the config at once. Counters are keyed by the descriptor
    /// and the limit's policy, so limits that did not change keep counting
    /// where they were; changed limits start afresh.
    ///
    /// # Errors
    ///
    /// With Redis, a [`ConfigError`] naming a limit without a Redis form;
    /// the config in force stays.
    pub fn replace_config(&self, config: Config) -> Result<(), ConfigError> {
        if let Backend::Redis(_) = self.backend {
            RedisStore::check_config(&config)?;
        }
        *self.config.write() = Arc::new(config);
        Ok(())
    }

    /// The in-memory store's figures (all 0 with Redis).
    pub fn stats(&self) -> Stats {
        match &self.backend {
            Backend::Memory(counters) => counters.stats(),
            Backend::Redis(_) => Stats::default(),
        }
    }

    /// Sends the counts the hybrid mode has not yet sent to Redis (at
    /// shutdown); nothing to do otherwise.
    pub async fn flush(&self) {
        if let Backend::Redis(store) = &self.backend
            && let Err(e) = store.flush().await
        {
            tracing::warn!(error = %e, "the last sync to Redis failed: counts of the last interval are lost");
        }
    }

    /// The Redis store's failures and fallbacks; `None` without Redis.
    pub fn redis_stats(&self) -> Option<RedisStats> {
        match &self.backend {
            Backend::Memory(_) => None,
            Backend::Redis(store) => Some(store.stats()),
        }
    }

    /// Where `limit` of `counter` counts.
    fn slot<'a>(&self, counter: &'a str, limit: &Limit) -> Slot<'a> {
        match self.backend {
            Backend::Memory(_) => Slot::Memory(self.key(|h| {
                counter.hash(&mut HashAdapter(h));
                policy_fingerprint(limit, &mut HashAdapter(h));
            })),
            Backend::Redis(_) => Slot::Redis(counter),
        }
    }

    /// Decides `cost` under `policy` (`None`: a limit of 0) in `slot`.
    async fn check(
        &self,
        policy: Option<&Policy>,
        slot: Slot<'_>,
        now: u64,
        cost: u64,
    ) -> Result<Option<Decision>, EngineError> {
        let Some(policy) = policy else { return Ok(None) };
        match (&self.backend, slot) {
            (Backend::Memory(counters), Slot::Memory(key)) => counters
                .check(policy, key, now, cost)
                .map(Some)
                .map_err(|e| store_error(&e)),
            (Backend::Redis(store), Slot::Redis(counter)) => store
                .decide(policy, counter, cost)
                .await
                .map(Some)
                .map_err(|e| redis_error(policy, e)),
            _ => Err(EngineError::Unavailable("the counter is not in this store".to_owned())),
        }
    }

    /// Forgets the counts of `policy` in `slot`; true if they were held.
    async fn reset(&self, policy: Option<&Policy>, slot: Slot<'_>) -> Result<bool, EngineError> {
        match (&self.backend, slot) {
            (Backend::Memory(counters), Slot::Memory(key)) => Ok(counters.reset(key)),
            (Backend::Redis(store), Slot::Redis(counter)) => match policy {
                Some(policy) => store.reset(policy, counter).await.map_err(|e| redis_error(policy, e)),
                None => Ok(false),
            },
            _ => Ok(false),
        }
    }

    /// The input limits.
    pub fn input_limits(&self) -> InputLimits {
        self.limits
    }

    /// A 64-bit key for a counter, from a hash seeded at random when the
    /// engine is built: two counters share a key with a probability of
    /// about `keys² / 2⁶⁵` (one in 17 million with a million keys held), and
    /// a client cannot aim for a collision without knowing the seed.
    fn key(&self, parts: impl Fn(&mut dyn Hasher)) -> u64 {
        let mut h = self.hash.build_hasher();
        parts(&mut h);
        h.finish()
    }

    fn check_text(&self, what: &str, text: &str) -> Result<(), EngineError> {
        if text.len() > self.limits.text {
            return Err(EngineError::Invalid(format!(
                "{what} is {} bytes, over the limit of {} bytes",
                text.len(),
                self.limits.text
            )));
        }
        Ok(())
    }

    fn validate(&self, request: &Request) -> Result<(), EngineError> {
        if request.domain.is_empty() {
            return Err(EngineError::Invalid("the domain is empty".to_owned()));
        }
        self.check_text("the domain", &request.domain)?;
        if request.descriptors.is_empty() {
            return Err(EngineError::Invalid("the request has no descriptors".to_owned()));
        }
        if request.descriptors.len() > self.limits.descriptors {
            return Err(EngineError::Invalid(format!(
                "{} descriptors, over the limit of {} per request",
                request.descriptors.len(),
                self.limits.descriptors
            )));
        }
        for (i, d) in request.descriptors.iter().enumerate() {
            if d.entries.is_empty() {
                return Err(EngineError::Invalid(format!("descriptor {i} has no entries")));
            }
            if d.entries.len() > self.limits.entries {
                return Err(EngineError::Invalid(format!(
                    "descriptor {i} has {} entries, over the limit of {} per descriptor",
                    d.entries.len(),
                    self.limits.entries
                )));
            }
            for (key, value) in &d.entries {
                if key.is_empty() {
                    return Err(EngineError::Invalid(format!(
                        "descriptor {i} has an entry with an empty key"
                    )));
                }
                self.check_text(&format!("an entry key of descriptor {i}"), key)?;
                self.check_text(&format!("an entry value of descriptor {i}"), value)?;
            }
            if let Some(o) = d.limit
                && o.unit.is_none()
            {
                return Err(EngineError::Invalid(format!(
                    "descriptor {i} overrides the limit with an unknown unit"
                )));
            }
        }
        Ok(())
    }

    /// Decides `request`.
    ///
    /// # Errors
    ///
    /// [`EngineError::Invalid`] for a malformed request or one over the
    /// input limits; [`EngineError::Unavailable`] if the store refuses.
    pub async fn decide(&self, request: &Request) -> Result<Answer, EngineError> {
        self.validate(request)?;
        let config = self.config();
        let now = self.clock.now();
        let Some(domain) = config.domain(&request.domain) else {
            // As envoyproxy/ratelimit: a domain with no config limits nothing.
            return Ok(Answer {
                overall: Code::Ok,
                statuses: request.descriptors.iter().map(|_| Status::unlimited()).collect(),
            });
        };
        let hits = if request.hits_addend == 0 {
            1
        } else {
            u64::from(request.hits_addend)
        };
        let entries: Vec<Vec<(&str, &str)>> = request
            .descriptors
            .iter()
            .map(|d| d.entries.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect())
            .collect();
        let matches: Vec<_> = entries.iter().map(|e| domain.find(e)).collect();
        // Limits named in `replaces` by any matched limit are dropped.
        let replaced: Vec<&str> = matches
            .iter()
            .zip(&request.descriptors)
            .filter(|(_, d)| d.limit.is_none())
            .filter_map(|(m, _)| m.as_ref())
            .flat_map(|m| m.rule.limits.iter())
            .flat_map(|l| l.replaces.iter().map(String::as_str))
            .collect();

        let mut statuses = Vec::with_capacity(request.descriptors.len());
        let (mut over, mut quota_total, mut quota_over) = (false, 0usize, 0usize);
        for (i, ((descriptor, m), entries)) in request.descriptors.iter().zip(&matches).zip(&entries).enumerate() {
            let Some(m) = m else {
                statuses.push(Status::unlimited());
                continue;
            };
            let rule = m.rule;
            if rule.unlimited {
                statuses.push(Status {
                    metric: Some(m.metric_key(entries)),
                    ..Status::unlimited()
                });
                continue;
            }
            let overridden;
            let limits: Vec<&Limit> = match descriptor.limit {
                Some(o) => {
                    overridden = override_limit(o)?;
                    vec![&overridden]
                }
                None => rule
                    .limits
                    .iter()
                    .filter(|l| l.name.as_deref().is_none_or(|n| !replaced.contains(&n)))
                    .collect(),
            };
            if limits.is_empty() {
                statuses.push(Status::unlimited());
                continue;
            }
            let counter = m.counter_key(&request.domain, entries);
            let hits = descriptor.hits_addend.unwrap_or(hits);
            let mut status = self.charge(i, &counter, &limits, hits, now).await?;
            status.metric = Some(m.metric_key(entries));
            if status.code == Code::OverLimit && rule.shadow_mode {
                status.code = Code::Ok;
                status.shadow_refused = true;
            }
            if rule.quota_mode {
                quota_total += 1;
                quota_over += usize::from(status.code == Code::OverLimit);
            } else if status.code == Code::OverLimit {
                over = true;
            }
            statuses.push(status);
        }
        let overall = if over || (quota_total > 0 && quota_over == quota_total) {
            Code::OverLimit
        } else {
            Code::Ok
        };
        Ok(Answer { overall, statuses })
    }

    /// Decides `hits` against every limit of one descriptor: all are asked
    /// first (a peek), and each is charged only if all admit.
    async fn charge(
        &self,
        index: usize,
        counter: &str,
        limits: &[&Limit],
        hits: u64,
        now: u64,
    ) -> Result<Status, EngineError> {
        if let [only] = limits {
            // One limit: a refused check charges nothing, so no peek is needed.
            let decision = self
                .check(only.policy.as_ref(), self.slot(counter, only), now, hits)
                .await?;
            return Ok(status_of(vec![applied(index, 0, 1, only, decision)]));
        }
        let slots: Vec<Slot<'_>> = limits.iter().map(|l| self.slot(counter, l)).collect();
        let mut peeks: Vec<Option<Decision>> = Vec::with_capacity(limits.len());
        for (l, &slot) in limits.iter().zip(&slots) {
            peeks.push(self.check(l.policy.as_ref(), slot, now, 0).await?);
        }
        let all_fit = peeks.iter().all(|p| p.as_ref().is_some_and(|d| hits <= d.remaining()));
        let mut applied = Vec::with_capacity(limits.len());
        for (j, ((l, &slot), peek)) in limits.iter().zip(&slots).zip(peeks).enumerate() {
            let decision = if hits == 0 {
                peek
            } else if all_fit || peek.as_ref().is_some_and(|d| hits > d.remaining()) {
                // Charged when all fit; asked again (not charged) when this
                // one refuses, for its retry delay at this cost.
                self.check(l.policy.as_ref(), slot, now, hits).await?
            } else {
                // It would admit, but another limit refuses: not charged.
                peek
            };
            applied.push(self::applied(index, j, limits.len(), l, decision));
        }
        Ok(status_of(applied))
    }

    /// Decides an ad-hoc key with its own policy.
    ///
    /// # Errors
    ///
    /// [`EngineError::Invalid`] for a key over the input limit;
    /// [`EngineError::Unavailable`] if the store refuses.
    pub async fn decide_ad_hoc(&self, ad_hoc: &AdHoc) -> Result<Decision, EngineError> {
        self.check_text("the key", &ad_hoc.key)?;
        let name;
        let slot = match self.backend {
            Backend::Memory(_) => Slot::Memory(self.ad_hoc_key(&ad_hoc.key, &ad_hoc.policy)),
            Backend::Redis(_) => {
                name = ad_hoc_name(&ad_hoc.key);
                Slot::Redis(&name)
            }
        };
        let decision = self
            .check(Some(&ad_hoc.policy), slot, self.clock.now(), ad_hoc.cost)
            .await?;
        decision.ok_or_else(|| EngineError::Unavailable("no decision".to_owned()))
    }

    /// Forgets an ad-hoc key's counts; true if it was held.
    ///
    /// # Errors
    ///
    /// [`EngineError::Unavailable`] if Redis cannot answer.
    pub async fn reset_ad_hoc(&self, key: &str, policy: &Policy) -> Result<bool, EngineError> {
        let name;
        let slot = match self.backend {
            Backend::Memory(_) => Slot::Memory(self.ad_hoc_key(key, policy)),
            Backend::Redis(_) => {
                name = ad_hoc_name(key);
                Slot::Redis(&name)
            }
        };
        self.reset(Some(policy), slot).await
    }

    /// Forgets the counts of every limit a descriptor of `domain` matches;
    /// the number of counters that were held.
    ///
    /// # Errors
    ///
    /// [`EngineError::Invalid`] for a malformed descriptor.
    pub async fn reset_descriptor(&self, domain: &str, descriptor: &Descriptor) -> Result<usize, EngineError> {
        self.validate(&Request {
            domain: domain.to_owned(),
            descriptors: vec![descriptor.clone()],
            hits_addend: 0,
        })?;
        let config = self.config();
        let Some(domain_config) = config.domain(domain) else {
            return Ok(0);
        };
        let entries: Vec<(&str, &str)> = descriptor
            .entries
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let Some(m) = domain_config.find(&entries) else {
            return Ok(0);
        };
        let counter = m.counter_key(domain, &entries);
        let mut held = 0;
        let overridden;
        let limits: Vec<&Limit> = match descriptor.limit {
            Some(o) => {
                overridden = override_limit(o)?;
                vec![&overridden]
            }
            None => m.rule.limits.iter().collect(),
        };
        for l in limits {
            held += usize::from(self.reset(l.policy.as_ref(), self.slot(&counter, l)).await?);
        }
        Ok(held)
    }

    fn ad_hoc_key(&self, key: &str, policy: &Policy) -> u64 {
        self.key(|h| {
            // A tag no config counter key starts with.
            0xad_u8.hash(&mut HashAdapter(h));
            key.hash(&mut HashAdapter(h));
            fingerprint(policy, &mut HashAdapter(h));
        })
    }
}

/// A limit's part of a status: its name in the headers (the configured
/// name, or `d<i>`, with `.j` for the j-th of several unnamed limits).
fn applied(index: usize, j: usize, of: usize, l: &Limit, decision: Option<Decision>) -> Applied {
    let name = match &l.name {
        Some(name) => name.clone(),
        None if of == 1 => format!("d{index}"),
        None => format!("d{index}.{j}"),
    };
    Applied {
        name,
        requests_per_unit: l.requests_per_unit,
        unit: l.unit,
        policy: l.policy,
        decision,
    }
}

/// A descriptor's status from its limits' decisions.
fn status_of(applied: Vec<Applied>) -> Status {
    let allowed = applied.iter().all(Applied::allowed);
    // The tightest limit: a refusing one with the longest wait, or the
    // one with the least remaining.
    let tightest = if allowed {
        applied
            .iter()
            .enumerate()
            .min_by_key(|(_, a)| a.remaining())
            .map(|(j, _)| j)
    } else {
        applied
            .iter()
            .enumerate()
            .filter(|(_, a)| !a.allowed())
            .max_by_key(|(_, a)| {
                a.decision
                    .as_ref()
                    .map_or(Duration::MAX, |d| d.retry_after().unwrap_or(Duration::MAX))
            })
            .map(|(j, _)| j)
    };
    let (remaining, until_reset) = match tightest.and_then(|j| applied.get(j)) {
        Some(a) => (
            a.remaining(),
            a.decision.as_ref().map(|d| {
                if d.allowed() {
                    d.reset_after()
                } else {
                    d.retry_after().unwrap_or(d.reset_after())
                }
            }),
        ),
        None => (u64::from(u32::MAX), None),
    };
    Status {
        code: if allowed { Code::Ok } else { Code::OverLimit },
        applied,
        remaining,
        until_reset,
        tightest,
        shadow_refused: false,
        metric: None,
    }
}

/// The limit an override stands for: the default algorithm over one unit.
fn override_limit(o: Override) -> Result<Limit, EngineError> {
    let unit = o
        .unit
        .ok_or_else(|| EngineError::Invalid("a limit override has an unknown unit".to_owned()))?;
    let window = unit.duration();
    let policy = match o.requests_per_unit {
        0 => None,
        n => Some(
            Policy::new(u64::from(n), window, DEFAULT_ALGORITHM)
                .map_err(|e| EngineError::Invalid(format!("a limit override is invalid: {e}")))?,
        ),
    };
    Ok(Limit {
        name: None,
        replaces: Vec::new(),
        requests_per_unit: u64::from(o.requests_per_unit),
        unit: Some(unit),
        window,
        algorithm: DEFAULT_ALGORITHM,
        policy,
    })
}

fn store_error(e: &StoreError) -> EngineError {
    EngineError::Unavailable(e.to_string())
}

/// A Redis failure as the engine says it: a policy without a Redis form
/// (a limit override or ad-hoc policy out of range) is the request's
/// fault; anything else is the store's.
fn redis_error(policy: &Policy, e: RedisStoreError) -> EngineError {
    match e {
        RedisStoreError::Unsupported { reason, .. } => {
            EngineError::Invalid(format!("the limit `{policy}` has no Redis form: {reason}"))
        }
        e => EngineError::Unavailable(e.to_string()),
    }
}

/// An ad-hoc key's counter key in Redis: a config counter key starts with
/// a digit (the domain's length), so the two never meet.
fn ad_hoc_name(key: &str) -> String {
    format!("adhoc:{key}")
}

/// `&mut dyn Hasher` as a `Hasher`, for `Hash::hash`.
struct HashAdapter<'a>(&'a mut dyn Hasher);

impl Hasher for HashAdapter<'_> {
    fn finish(&self) -> u64 {
        self.0.finish()
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0.write(bytes);
    }
}

/// What identifies a limit's counter besides the descriptor: its policy.
/// A reload that keeps the policy keeps the counts.
fn policy_fingerprint(limit: &Limit, h: &mut impl Hasher) {
    match &limit.policy {
        Some(p) => fingerprint(p, h),
        None => 0u8.hash(h),
    }
}

fn fingerprint(policy: &Policy, h: &mut impl Hasher) {
    policy.limit().hash(h);
    policy.window_ns().hash(h);
    match policy.algorithm() {
        Algorithm::SlidingWindow { buckets, weighting } => {
            1u8.hash(h);
            buckets.hash(h);
            matches!(weighting, Weighting::Conservative).hash(h);
        }
        Algorithm::FixedWindow => 2u8.hash(h),
        Algorithm::SlidingLog => 3u8.hash(h),
        Algorithm::Gcra { burst } => {
            4u8.hash(h);
            burst.hash(h);
        }
        Algorithm::ExponentialHistogram { epsilon } => {
            5u8.hash(h);
            epsilon.to_bits().hash(h);
        }
        // Algorithms added later hash by name.
        #[allow(unreachable_patterns)]
        other => other.name().hash(h),
    }
}
