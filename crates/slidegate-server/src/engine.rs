//! The decision of a rate limit request against the loaded config, in the
//! shared counter store. gRPC and HTTP both come here, in plain Rust types.
//!
//! The counters are in a [`slidegate_store::Store`], chosen when the
//! service starts and seen only through the interface: the bounded
//! in-memory store, or Redis (wrapped in the failure policy) so that every
//! instance on the same Redis counts together. A descriptor's limits are
//! decided in one call of the store, all or nothing. Deciding is `async`;
//! the in-memory store decides at once ([`Store::decide_now`]), so its
//! decisions cost no boxing and no task switch.

use crate::config::{Config, ConfigError, DEFAULT_ALGORITHM, Limit, Rule, Unit};
use parking_lot::RwLock;
use slidegate_core::{Clock, Decision, Policy};
use slidegate_memory::{Budget, MemoryStore};
use slidegate_store::{Decisions, DynStore, Quota, Store, StoreError, StoreStats};
use smallvec::SmallVec;
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

/// The service's settings that change how requests are decided, as
/// envoyproxy/ratelimit's environment sets them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// A request over a limit counts nothing (envoyproxy/ratelimit's
    /// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`). On by default, as the
    /// seeds ask: a refused request is not counted. Off, every hit is
    /// counted even when refused, as envoyproxy/ratelimit does by default.
    /// A descriptor's own `hits_addend` is counted either way (see
    /// [`Engine::decide`]).
    pub stop_increment_when_over_limit: bool,
    /// Every answer's overall code is OK (`SHADOW_MODE`); the descriptors'
    /// statuses still say what each limit decided.
    pub shadow_mode: bool,
    /// Every rule is in quota mode (`QUOTA_MODE`).
    pub quota_mode: bool,
    /// The matched rules' `metadata` is kept in the statuses for the
    /// answer's dynamic metadata (`RESPONSE_DYNAMIC_METADATA`).
    pub dynamic_metadata: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            stop_increment_when_over_limit: true,
            shadow_mode: false,
            quota_mode: false,
            dynamic_metadata: false,
        }
    }
}

/// A limit that applied to a descriptor, with its decision.
#[derive(Clone, Debug, PartialEq)]
pub struct Applied {
    /// Its name in the headers ([`Limit::header_name`]; for a limit
    /// override, the descriptor's keys joined by `.`).
    pub name: String,
    /// Its name in the config; empty when it has none (Envoy's
    /// `current_limit.name`).
    pub config_name: String,
    /// The limit as configured (or overridden).
    pub requests_per_unit: u64,
    /// Its unit, when it has one.
    pub unit: Option<Unit>,
    /// Its policy; `None` for a limit of 0, which refuses everything.
    pub policy: Option<Policy>,
    /// The decision, as made (before a refused cost was charged all the
    /// same); `None` for a limit of 0.
    pub decision: Option<Decision>,
    /// What a refused cost that was charged all the same (a descriptor's
    /// own `hits_addend`, or every hit with
    /// [`Settings::stop_increment_when_over_limit`] off) left: a peek
    /// after the charge, its count now past the limit (0 remaining, the
    /// wait until it is back within the limit, its reset). The answer
    /// shows it ([`Applied::shown`]); `None` otherwise.
    pub left: Option<Decision>,
}

impl Applied {
    /// Whether the limit admitted the request (as decided: a refused cost
    /// charged all the same stays refused).
    fn allowed(&self) -> bool {
        self.decision.as_ref().is_some_and(Decision::allowed)
    }

    /// The decision whose figures (remaining, reset, retry) the answer
    /// shows: what a refused cost charged all the same left, else the
    /// decision.
    pub fn shown(&self) -> Option<&Decision> {
        self.left.as_ref().or(self.decision.as_ref())
    }

    fn remaining(&self) -> u64 {
        self.shown().map_or(0, Decision::remaining)
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
    /// unlimited rule, 0 when no rule applied (as envoyproxy/ratelimit
    /// answers both).
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
    /// The descriptor counts in quota mode (its rule's `quota_mode`, or
    /// the service's).
    pub quota_mode: bool,
    /// The matched rule's `metadata`, with [`Settings::dynamic_metadata`].
    pub metadata: Option<serde_json::Value>,
}

impl Status {
    /// A descriptor that no rule limits: OK, no current limit, 0
    /// remaining (envoyproxy/ratelimit's answer).
    fn no_rule() -> Self {
        Status {
            code: Code::Ok,
            applied: Vec::new(),
            remaining: 0,
            until_reset: None,
            tightest: None,
            shadow_refused: false,
            metric: None,
            quota_mode: false,
            metadata: None,
        }
    }

    /// A descriptor whose rule is `unlimited`: OK, `u32::MAX` remaining.
    fn unlimited() -> Self {
        Status {
            remaining: u64::from(u32::MAX),
            ..Status::no_rule()
        }
    }

    /// The descriptor is in the answer's counts: a rule with limits
    /// matched it.
    pub fn limited(&self) -> bool {
        !self.applied.is_empty()
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
    /// The service's shadow mode answered OK where a limit refused.
    pub shadowed: bool,
    /// The request's domain has a config (without one, nothing is
    /// limited).
    pub configured: bool,
}

/// Why a request could not be decided. A store's error is kept as the
/// source; [`EngineError::detail`] is what a client is told.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// The request is malformed or over an input limit (gRPC
    /// `INVALID_ARGUMENT`, HTTP 400).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The request brings a limit (an override, an ad-hoc policy) that the
    /// store cannot keep: the request's fault (gRPC `INVALID_ARGUMENT`,
    /// HTTP 400). Said as the store says it.
    #[error(transparent)]
    Unkeepable(StoreError),
    /// The store could not count (gRPC `UNAVAILABLE`, HTTP 503).
    #[error("the counter store cannot answer")]
    Unavailable(#[source] StoreError),
}

impl EngineError {
    /// Whether the request is at fault (not the store).
    pub fn is_invalid(&self) -> bool {
        !matches!(self, EngineError::Unavailable(_))
    }

    /// What a client is told: a malformed request's reason, the store's
    /// reason for a limit it cannot keep, or this error and its causes
    /// (`a: b: c`), each once.
    pub fn detail(&self) -> String {
        match self {
            EngineError::Invalid(reason) => reason.clone(),
            EngineError::Unkeepable(e) => chain(e),
            EngineError::Unavailable(_) => chain(self),
        }
    }
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

/// Decides requests against a config, counting in one store (the clock is
/// the store's: given to [`Engine::new`] for the in-memory store, owned by
/// a store given to [`Engine::with_store`]).
pub struct Engine {
    config: RwLock<Arc<Config>>,
    store: Arc<dyn DynStore>,
    /// Whether the store is shared with other instances (Redis).
    shared: bool,
    /// What the store is, for the decision spans.
    store_name: &'static str,
    limits: InputLimits,
    settings: Settings,
}

impl Engine {
    /// An engine serving `config`, counting in an in-memory store on
    /// `clock`: sliding windows of up to 8 buckets (the default algorithm)
    /// within `budget` and every other algorithm within `other_budget`.
    pub fn new<C: Clock + Send + Sync + 'static>(
        config: Config,
        clock: C,
        budget: Budget,
        other_budget: Budget,
        limits: InputLimits,
    ) -> Self {
        Engine {
            config: RwLock::new(Arc::new(config)),
            store: Arc::new(MemoryStore::with_clock(budget, other_budget, clock)),
            shared: false,
            store_name: "memory",
            limits,
            settings: Settings::default(),
        }
    }

    /// An engine serving `config`, counting in `store`; `shared` says
    /// whether other instances count in it too (for the metrics).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming a limit the store cannot keep
    /// ([`check_config`]).
    pub fn with_store(
        config: Config,
        store: Arc<dyn DynStore>,
        shared: bool,
        limits: InputLimits,
    ) -> Result<Self, ConfigError> {
        check_config(&config, &*store)?;
        Ok(Engine {
            config: RwLock::new(Arc::new(config)),
            store,
            shared,
            store_name: "custom",
            limits,
            settings: Settings::default(),
        })
    }

    /// The engine with `settings` in force.
    #[must_use]
    pub fn with_settings(mut self, settings: Settings) -> Self {
        self.settings = settings;
        self
    }

    /// The settings in force.
    pub fn settings(&self) -> Settings {
        self.settings
    }

    /// The config in force.
    pub fn config(&self) -> Arc<Config> {
        Arc::clone(&self.config.read())
    }

    /// Replaces the config at once. Counters are keyed by the descriptor
    /// and the limit's count identity (its algorithm, window, parameters
    /// and place in its rule, not its `requests_per_unit`; see the config's
    /// quotas), so limits that did not change keep counting where they
    /// were, and so does a limit whose `requests_per_unit` changed (but for
    /// `gcra`, which starts afresh; the hybrid mode drops the counts it has
    /// not yet synced); a changed unit, window, algorithm or parameter
    /// starts afresh.
    ///
    /// Returns the config it replaced, for the caller to free where it
    /// suits (a large config takes long to free: not on a request's
    /// thread).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming a limit the store cannot keep; the config
    /// in force stays.
    pub fn replace_config(&self, config: Config) -> Result<Arc<Config>, ConfigError> {
        check_config(&config, &*self.store)?;
        Ok(std::mem::replace(&mut *self.config.write(), Arc::new(config)))
    }

    /// The store's figures.
    pub fn stats(&self) -> StoreStats {
        self.store.stats()
    }

    /// Names the store (`redis`, `hybrid`) for the decision spans; an
    /// engine of [`Engine::new`] is `memory`, one of [`Engine::with_store`]
    /// `custom` until named.
    pub fn with_store_name(mut self, name: &'static str) -> Self {
        self.store_name = name;
        self
    }

    /// The store's name, as [`Engine::with_store_name`] set it.
    pub fn store_name(&self) -> &'static str {
        self.store_name
    }

    /// Whether the store is shared with other instances (Redis).
    pub fn shared_store(&self) -> bool {
        self.shared
    }

    /// Sends what the store holds back (the hybrid mode's counts not yet
    /// sent to Redis), at shutdown.
    pub async fn flush(&self) {
        if let Err(e) = self.store.flush().await {
            tracing::warn!(error = %chain(&e), "the last sync to Redis failed: counts of the last interval are lost");
        }
    }

    /// Decides `cost` on `key` against `quotas` in the store.
    async fn decide_in_store(
        &self,
        key: &str,
        quotas: &[Quota],
        cost: u64,
        out: &mut Decisions,
    ) -> Result<(), EngineError> {
        self.store.decide(key, quotas, cost, out).await.map_err(store_error)
    }

    /// The input limits.
    pub fn input_limits(&self) -> InputLimits {
        self.limits
    }

    /// `what` names the text in the error; it is formatted only then.
    fn check_text(&self, what: std::fmt::Arguments<'_>, text: &str) -> Result<(), EngineError> {
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
        self.check_text(format_args!("the domain"), &request.domain)?;
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
                self.check_text(format_args!("an entry key of descriptor {i}"), key)?;
                self.check_text(format_args!("an entry value of descriptor {i}"), value)?;
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

    /// Decides `request`, as envoyproxy/ratelimit does:
    ///
    /// - a descriptor that no rule limits (an unknown domain, no match, a
    ///   rule without limits, or limits all replaced) is OK with no
    ///   current limit and 0 remaining; an `unlimited` rule is OK with
    ///   `u32::MAX` remaining;
    /// - a descriptor's own `limit` applies to any descriptor of a known
    ///   domain, whether or not a rule matches, never in shadow mode;
    /// - a request counts on every limit of a descriptor or on none. A
    ///   refused request counts nothing unless
    ///   [`Settings::stop_increment_when_over_limit`] is off; a cost that
    ///   the descriptor gives itself (its own `hits_addend`, Envoy's
    ///   "peek, then debit" with `apply_on_stream_done`) is always
    ///   counted, taking the count over the limit when it must, so that
    ///   the next peek (a `hits_addend` of 0, OK while the count is at
    ///   most the limit) is refused. Such a refusal is answered with what
    ///   the charge left (0 remaining, the wait until the count is back
    ///   within the limit), as a peek after it sees it.
    ///
    /// # Errors
    ///
    /// [`EngineError::Invalid`] for a malformed request or one over the
    /// input limits; [`EngineError::Unavailable`] if the store refuses.
    pub async fn decide(&self, request: &Request) -> Result<Answer, EngineError> {
        self.validate(request)?;
        let config = self.config();
        let Some(domain) = config.domain(&request.domain) else {
            // As envoyproxy/ratelimit: a domain with no config limits nothing.
            return Ok(Answer {
                overall: Code::Ok,
                statuses: request.descriptors.iter().map(|_| Status::no_rule()).collect(),
                shadowed: false,
                configured: false,
            });
        };
        let settings = self.settings;
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
        // A descriptor's own limit wins over any rule.
        let matches: Vec<_> = entries
            .iter()
            .zip(&request.descriptors)
            .map(|(e, d)| if d.limit.is_some() { None } else { domain.find(e) })
            .collect();
        // Limits named in `replaces` by any matched limit are dropped.
        let replaced: Vec<&str> = matches
            .iter()
            .filter_map(|m| m.as_ref())
            .flat_map(|m| m.rule.limits.iter())
            .flat_map(|l| l.replaces.iter().map(String::as_str))
            .collect();

        let mut statuses = Vec::with_capacity(request.descriptors.len());
        let (mut over, mut quota_total, mut quota_over) = (false, 0usize, 0usize);
        for ((descriptor, m), entries) in request.descriptors.iter().zip(&matches).zip(&entries) {
            let hits = descriptor.hits_addend.unwrap_or(hits);
            // A cost the descriptor gives itself is a debit: counted even
            // when it takes the count over the limit.
            let record_refused = descriptor.hits_addend.is_some() || !settings.stop_increment_when_over_limit;
            let mut status = if let Some(o) = descriptor.limit {
                let mut overridden = override_limit(o)?;
                overridden.header_name = override_header_name(entries);
                let counter = override_counter_key(&request.domain, entries);
                let mut status = self.charge(&counter, &[&overridden], hits, record_refused).await?;
                status.metric = Some(crate::config::Match::override_metric_key(entries));
                status.quota_mode = settings.quota_mode;
                status
            } else {
                let Some(m) = m else {
                    statuses.push(Status::no_rule());
                    continue;
                };
                let rule = m.rule;
                if rule.unlimited {
                    // As envoyproxy/ratelimit: no stats for an unlimited rule.
                    statuses.push(Status::unlimited());
                    continue;
                }
                let limits: Vec<&Limit> = rule
                    .limits
                    .iter()
                    .filter(|l| l.name.as_deref().is_none_or(|n| !replaced.contains(&n)))
                    .collect();
                if limits.is_empty() {
                    statuses.push(Status::no_rule());
                    continue;
                }
                let counter = m.counter_key(&request.domain, entries);
                let mut status = self.charge(&counter, &limits, hits, record_refused).await?;
                status.metric = Some(m.metric_key(entries));
                if status.code == Code::OverLimit && rule.shadow_mode {
                    status.code = Code::Ok;
                    status.shadow_refused = true;
                }
                status.quota_mode = rule.quota_mode || settings.quota_mode;
                if settings.dynamic_metadata {
                    status.metadata.clone_from(&rule.metadata);
                }
                status
            };
            if status.quota_mode {
                quota_total += 1;
                quota_over += usize::from(status.code == Code::OverLimit);
            } else if status.code == Code::OverLimit {
                over = true;
            }
            if status.code == Code::OverLimit && settings.shadow_mode {
                // The service's shadow mode: the overall code is OK; the
                // statuses still say what each limit decided.
                status.shadow_refused = true;
            }
            statuses.push(status);
        }
        let refused = over || (quota_total > 0 && quota_over == quota_total);
        let overall = if refused && !settings.shadow_mode {
            Code::OverLimit
        } else {
            Code::Ok
        };
        Ok(Answer {
            overall,
            statuses,
            shadowed: refused && settings.shadow_mode,
            configured: true,
        })
    }

    /// Decides `hits` against every limit of one descriptor in one call
    /// of the store: every limit is charged, or none is. A limit of 0
    /// refuses everything: the others are then only peeked. With
    /// `record_refused`, a refused cost is charged after all (it takes the
    /// counts over their limits), and then peeked, so that the answer
    /// says what the charge left ([`Applied::left`]) rather than the
    /// figures of before it.
    async fn charge(
        &self,
        counter: &str,
        limits: &[&Limit],
        hits: u64,
        record_refused: bool,
    ) -> Result<Status, EngineError> {
        // Two limits of one policy are one count: asked once, both shown.
        // One limit, the common case, is asked without a copy.
        let mut several: SmallVec<[Quota; 4]> = SmallVec::new();
        let quotas: &[Quota] = match limits {
            [one] => one.quota.as_slice(),
            _ => {
                for quota in limits.iter().filter_map(|l| l.quota.as_ref()) {
                    if !several.contains(quota) {
                        several.push(quota.clone());
                    }
                }
                &several
            }
        };
        let zero_limit = limits.iter().any(|l| l.quota.is_none());
        let cost = if zero_limit { 0 } else { hits };
        let mut out = Decisions::new();
        let mut left = Decisions::new();
        if !quotas.is_empty() {
            self.decide_in_store(counter, quotas, cost, &mut out).await?;
            if record_refused && cost > 0 && out.iter().any(|d| !d.allowed()) {
                self.store.charge(counter, quotas, cost).await.map_err(store_error)?;
                // A peek changes nothing. Should it fail, or find the
                // counts back within their limits already (a reset between
                // the two calls), the answer keeps the refusal's figures.
                if self.decide_in_store(counter, quotas, 0, &mut left).await.is_err()
                    || left.len() != out.len()
                    || left.iter().all(Decision::allowed)
                {
                    left.clear();
                }
            }
        }
        let applied = limits
            .iter()
            .map(|l| {
                let k = l
                    .quota
                    .as_ref()
                    .and_then(|quota| quotas.iter().position(|q| q == quota));
                let decision = k.and_then(|k| out.get(k).copied());
                let mut applied = applied(l, decision);
                applied.left = k.and_then(|k| left.get(k).copied());
                applied
            })
            .collect();
        Ok(status_of(applied))
    }

    /// Decides an ad-hoc key with its own policy.
    ///
    /// # Errors
    ///
    /// [`EngineError::Invalid`] for a key over the input limit or a policy
    /// the store cannot keep; [`EngineError::Unavailable`] if the store
    /// cannot answer.
    pub async fn decide_ad_hoc(&self, ad_hoc: &AdHoc) -> Result<Decision, EngineError> {
        self.check_text(format_args!("the key"), &ad_hoc.key)?;
        let quotas = [Quota::new(ad_hoc.policy)];
        let mut out = Decisions::new();
        self.decide_in_store(&ad_hoc_name(&ad_hoc.key), &quotas, ad_hoc.cost, &mut out)
            .await?;
        out.first()
            .copied()
            .ok_or_else(|| EngineError::Unavailable(StoreError::Unavailable("the store gave no decision".into())))
    }

    /// Forgets an ad-hoc key's counts; true if it was held.
    ///
    /// # Errors
    ///
    /// [`EngineError::Unavailable`] if the store cannot answer.
    pub async fn reset_ad_hoc(&self, key: &str, policy: &Policy) -> Result<bool, EngineError> {
        let quotas = [Quota::new(*policy)];
        self.store.reset(&ad_hoc_name(key), &quotas).await.map_err(store_error)
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
        let overridden;
        let (counter, limits): (String, Vec<&Limit>) = match descriptor.limit {
            Some(o) => {
                overridden = override_limit(o)?;
                (override_counter_key(domain, &entries), vec![&overridden])
            }
            None => {
                let Some(m) = domain_config.find(&entries) else {
                    return Ok(0);
                };
                (m.counter_key(domain, &entries), m.rule.limits.iter().collect())
            }
        };
        let mut held = 0;
        for quota in limits.iter().filter_map(|l| l.quota.as_ref()) {
            let one = std::slice::from_ref(quota);
            held += usize::from(self.store.reset(&counter, one).await.map_err(store_error)?);
        }
        Ok(held)
    }
}

/// A limit's part of a status, under its name in the headers.
fn applied(l: &Limit, decision: Option<Decision>) -> Applied {
    Applied {
        name: l.header_name.clone(),
        config_name: l.name.clone().unwrap_or_default(),
        requests_per_unit: l.requests_per_unit,
        unit: l.unit,
        policy: l.policy,
        decision,
        left: None,
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
                a.shown()
                    .map_or(Duration::MAX, |d| d.retry_after().unwrap_or(Duration::MAX))
            })
            .map(|(j, _)| j)
    };
    let (remaining, until_reset) = match tightest.and_then(|j| applied.get(j)) {
        Some(a) => (
            a.remaining(),
            a.shown().map(|d| {
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
        quota_mode: false,
        metadata: None,
    }
}

/// The counter key of a descriptor's own limit: the domain and every entry,
/// in the config's key format (so it never meets a rule's counter, whose
/// key does not end in `!`).
fn override_counter_key(domain: &str, entries: &[(&str, &str)]) -> String {
    let mut out = String::new();
    for part in std::iter::once(domain).chain(entries.iter().flat_map(|(k, v)| [*k, *v])) {
        out.push_str(itoa::Buffer::new().format(part.len()));
        out.push(':');
        out.push_str(part);
    }
    out.push('!');
    out
}

/// The header name of a descriptor's limit override: its keys joined by
/// `.` (never its values, which are the request's).
fn override_header_name(entries: &[(&str, &str)]) -> String {
    let mut name = String::new();
    for (i, (key, _)) in entries.iter().enumerate() {
        if i > 0 {
            name.push('.');
        }
        name.push_str(key);
    }
    name
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
        header_name: String::new(),
        replaces: Vec::new(),
        requests_per_unit: u64::from(o.requests_per_unit),
        unit: Some(unit),
        window,
        algorithm: DEFAULT_ALGORITHM,
        quota: policy.map(Quota::new),
        policy,
    })
}

/// A store failure as the engine says it: a limit the store cannot keep
/// (a limit override or ad-hoc policy out of its range) is the request's
/// fault; anything else is the store's.
fn store_error(e: StoreError) -> EngineError {
    match e {
        StoreError::Unsupported { .. } | StoreError::NoQuota => EngineError::Unkeepable(e),
        e => EngineError::Unavailable(e),
    }
}

/// An error and its sources, each once: `a: b: c`.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// Refuses a config with a limit that `store` cannot keep, naming the
/// file, line and column of its descriptor, the domain, the descriptor's
/// path and the limit.
///
/// # Errors
///
/// A [`ConfigError`] for the first such limit.
pub fn check_config(config: &Config, store: &dyn DynStore) -> Result<(), ConfigError> {
    check_config_with(config, &|quota| store.supports_dyn(quota))
}

/// [`check_config`] against a store's rule for the quotas it keeps
/// (`supports`), without the store: for `slidegate check`, which checks a
/// config's Redis form without connecting.
///
/// # Errors
///
/// A [`ConfigError`] for the first limit `supports` refuses.
pub fn check_config_with(
    config: &Config,
    supports: &dyn Fn(&Quota) -> Result<(), StoreError>,
) -> Result<(), ConfigError> {
    match check_config_all(config, supports).into_iter().next() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Every limit of `config` that `supports` refuses, in config order (none:
/// the config is fit for the store).
pub fn check_config_all(config: &Config, supports: &dyn Fn(&Quota) -> Result<(), StoreError>) -> Vec<ConfigError> {
    let mut errors = Vec::new();
    for domain in config.domains() {
        // A merged domain's rules come from several files: each top-level
        // rule is checked with its own.
        for (i, rule) in domain.rules.iter().enumerate() {
            let file = config
                .rule_file(&domain.name, i)
                .or_else(|| config.file_of(&domain.name))
                .unwrap_or("<config>");
            let mut path = Vec::new();
            let at = Place {
                file,
                domain: &domain.name,
            };
            check_rules(supports, at, std::slice::from_ref(rule), &mut path, &mut errors);
        }
    }
    errors
}

/// Where the rules [`check_rules`] checks come from.
#[derive(Clone, Copy)]
struct Place<'a> {
    file: &'a str,
    domain: &'a str,
}

/// Checks the limits of `rules` and their children; `path` is the
/// descriptor's entries so far (`key` or `key=value`).
fn check_rules(
    supports: &dyn Fn(&Quota) -> Result<(), StoreError>,
    at: Place<'_>,
    rules: &[Rule],
    path: &mut Vec<String>,
    errors: &mut Vec<ConfigError>,
) {
    for rule in rules {
        path.push(match &rule.value {
            Some(value) => format!("{}={}", rule.key, value.as_str()),
            None => rule.key.clone(),
        });
        for (i, limit) in rule.limits.iter().enumerate() {
            let Some(quota) = &limit.quota else { continue };
            if let Err(e) = supports(quota) {
                let name = match &limit.name {
                    Some(name) => format!("limit `{name}`"),
                    None => format!("limit {}", i + 1),
                };
                errors.push(ConfigError {
                    file: at.file.to_owned(),
                    line: rule.line,
                    column: rule.column,
                    key: Some("rate_limit".to_owned()),
                    message: format!(
                        "domain `{}`, descriptor `{}`, {name}: {}",
                        at.domain,
                        path.join(" > "),
                        chain(&e)
                    ),
                });
            }
        }
        check_rules(supports, at, &rule.children, path, errors);
        path.pop();
    }
}

/// An ad-hoc key's counter key: a config counter key starts with
/// a digit (the domain's length), so the two never meet.
fn ad_hoc_name(key: &str) -> String {
    let mut name = String::with_capacity("adhoc:".len() + key.len());
    name.push_str("adhoc:");
    name.push_str(key);
    name
}

#[cfg(test)]
mod tests {
    use super::*;
    use slidegate_core::ManualClock;

    /// An engine on `yaml` (one domain) at a manual clock, with `settings`.
    fn engine(yaml: &str, settings: Settings) -> (Engine, ManualClock) {
        let domain = Config::parse_domain("test.yaml", yaml).unwrap();
        let config = Config::from_domains(vec![domain]).unwrap();
        let clock = ManualClock::new(1_000_000_000_000);
        let engine = Engine::new(
            config,
            clock.clone(),
            Budget::keys(64),
            Budget::keys(64),
            InputLimits::default(),
        )
        .with_settings(settings);
        (engine, clock)
    }

    /// One descriptor `k=v` of domain `d`, with its own `hits_addend` if
    /// given.
    fn request(hits_addend: Option<u64>) -> Request {
        Request {
            domain: "d".to_owned(),
            descriptors: vec![Descriptor {
                entries: vec![("k".to_owned(), "v".to_owned())],
                limit: None,
                hits_addend,
            }],
            hits_addend: 0,
        }
    }

    const LOG: &str = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: minute, requests_per_unit: 5, algorithm: sliding_log }\n";
    const SECOND: Duration = Duration::from_secs(1);

    /// A debit larger than the limit (a descriptor's own `hits_addend`,
    /// charged though refused) answers what it leaves: 0 remaining, and
    /// the wait until the count is back within the limit (when the
    /// debit's own hits leave the window), not the remaining count and
    /// the reset of before the debit. The limit's decision as made (for
    /// the metrics' hit counts) is kept beside it.
    #[tokio::test]
    async fn a_refused_debit_answers_what_it_leaves() {
        let (engine, clock) = engine(LOG, Settings::default());
        let first = engine.decide(&request(None)).await.unwrap();
        assert_eq!((first.overall, first.statuses[0].remaining), (Code::Ok, 4));
        clock.advance(30 * SECOND);
        let debit = engine.decide(&request(Some(10))).await.unwrap();
        let status = &debit.statuses[0];
        assert_eq!(debit.overall, Code::OverLimit);
        assert_eq!(status.remaining, 0, "{status:?}");
        assert_eq!(status.until_reset, Some(60 * SECOND), "{status:?}");
        let applied = &status.applied[0];
        assert_eq!(applied.decision.map(|d| (d.allowed(), d.remaining())), Some((false, 4)));
        let left = applied.left.unwrap();
        assert_eq!((left.remaining(), left.retry_after()), (0, Some(60 * SECOND)));
        // What a peek sees now, and once the debit has left the window.
        let peek = engine.decide(&request(Some(0))).await.unwrap();
        assert_eq!((peek.overall, peek.statuses[0].remaining), (Code::OverLimit, 0));
        assert_eq!(peek.statuses[0].until_reset, status.until_reset);
        clock.advance(60 * SECOND - Duration::from_nanos(1));
        assert_eq!(engine.decide(&request(Some(0))).await.unwrap().overall, Code::OverLimit);
        clock.advance(Duration::from_nanos(1));
        assert_eq!(engine.decide(&request(Some(0))).await.unwrap().overall, Code::Ok);
    }

    /// A debit that fits in what remains is an ordinary admitted request:
    /// no peek after it (`left` is none).
    #[tokio::test]
    async fn an_admitted_debit_is_its_decision() {
        let (engine, _) = engine(LOG, Settings::default());
        let debit = engine.decide(&request(Some(3))).await.unwrap();
        let status = &debit.statuses[0];
        assert_eq!((debit.overall, status.remaining), (Code::Ok, 2));
        assert_eq!(status.applied[0].left, None);
    }

    /// With `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` off, a refused
    /// request is counted all the same, and answered with what it leaves:
    /// 4 hits at 0 s, a request of 3 at 30 s takes the count to 7 (0
    /// remaining, not the 1 of before it), back within the limit when the
    /// first four leave at 60 s.
    #[tokio::test]
    async fn a_refused_request_counted_with_the_stop_setting_off_answers_what_it_leaves() {
        let settings = Settings {
            stop_increment_when_over_limit: false,
            ..Settings::default()
        };
        let (engine, clock) = engine(LOG, settings);
        for _ in 0..4 {
            assert_eq!(engine.decide(&request(None)).await.unwrap().overall, Code::Ok);
        }
        clock.advance(30 * SECOND);
        let three = Request {
            hits_addend: 3,
            ..request(None)
        };
        let refused = engine.decide(&three).await.unwrap();
        let status = &refused.statuses[0];
        assert_eq!((refused.overall, status.remaining), (Code::OverLimit, 0), "{status:?}");
        assert_eq!(status.until_reset, Some(30 * SECOND), "{status:?}");
        assert_eq!(status.applied[0].decision.map(|d| d.remaining()), Some(1));
        clock.advance(30 * SECOND);
        // 3 left of 7: within the limit again.
        let peek = engine.decide(&request(Some(0))).await.unwrap();
        assert_eq!((peek.overall, peek.statuses[0].remaining), (Code::Ok, 2));
    }
}
