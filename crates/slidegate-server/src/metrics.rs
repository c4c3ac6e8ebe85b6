//! Prometheus metrics, in one registry per server (no globals, so that
//! several servers in one process, as in the tests, count apart).

use crate::engine::{Answer, Code};
use parking_lot::Mutex;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use slidegate_store::StoreStats;
use std::fmt::Write as _;
use std::time::Duration;

/// Which front end a request came through.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Api {
    /// gRPC `ShouldRateLimit`.
    Grpc,
    /// `POST /json`.
    Json,
    /// `POST /v1/check` with a domain.
    Check,
    /// `POST /v1/check` with an ad-hoc key.
    AdHoc,
}

/// How a request ended.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Outcome {
    /// Admitted.
    Ok,
    /// Over a limit.
    OverLimit,
    /// Refused as malformed or over an input limit.
    Invalid,
    /// The store could not answer.
    Unavailable,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    api: Api,
    outcome: Outcome,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DescriptorLabels {
    domain: String,
    outcome: Outcome,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuleLabels {
    domain: String,
    rule: String,
    outcome: Outcome,
}

/// Most rule series kept; beyond, decisions count under `rule="overflow"`
/// (only `detailed_metric` and `value_to_metric` can name rules after
/// request values).
const MAX_RULE_SERIES: usize = 10_000;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DomainLabel {
    domain: String,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum ReloadResult {
    Success,
    Failure,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadLabels {
    result: ReloadResult,
}

/// Who decided without Redis.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum FallbackSource {
    FailOpen,
    FailClosed,
    Local,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FallbackLabels {
    source: FallbackSource,
}

/// Who made a decision of the shared store's failure wrapper.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum DecisionSource {
    Store,
    FailOpen,
    FailClosed,
    Local,
}

/// Whether a decision admitted.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum DecisionOutcome {
    Admitted,
    Refused,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    source: DecisionSource,
    outcome: DecisionOutcome,
}

/// The server's metrics.
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    descriptors: Family<DescriptorLabels, Counter>,
    shadow: Family<DomainLabel, Counter>,
    global_shadow: Counter,
    latency: Histogram,
    keys: Gauge,
    capacity: Gauge,
    bytes: Gauge,
    evictions: Counter,
    /// The store's eviction count at the last scrape.
    evictions_seen: Mutex<u64>,
    store_errors: Counter,
    reloads: Family<ReloadLabels, Counter>,
    redis_errors: Counter,
    redis_fallbacks: Family<FallbackLabels, Counter>,
    store_decisions: Family<DecisionLabels, Counter>,
    redis_sync_commands: Counter,
    redis_pending_keys: Gauge,
    /// The Redis store's figures at the last scrape.
    redis_seen: Mutex<Seen>,
    in_flight: Gauge,
    rules: Family<RuleLabels, Counter>,
    /// The rule counters seen (ok, over limit), by domain and rule name.
    rule_counters: parking_lot::RwLock<RuleCounters>,
    /// The descriptor counters of each domain seen, by name.
    domains: parking_lot::RwLock<std::collections::HashMap<String, DomainCounters>>,
}

/// The rule counters seen (ok, over limit): by domain, then by rule name,
/// with the number of rules in all.
#[derive(Default)]
struct RuleCounters {
    by_domain: std::collections::HashMap<String, std::collections::HashMap<String, (Counter, Counter)>>,
    len: usize,
}

/// One domain's counters (handles on the same atomics as the families').
struct DomainCounters {
    ok: Counter,
    over: Counter,
    shadow: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Every metric, registered under `slidegate_`.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("slidegate");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register("requests", "Rate limit requests by API and outcome", requests.clone());
        let descriptors = Family::<DescriptorLabels, Counter>::default();
        registry.register(
            "descriptor_decisions",
            "Descriptor decisions by configured domain (\"unknown\" for others) and outcome",
            descriptors.clone(),
        );
        let rules = Family::<RuleLabels, Counter>::default();
        registry.register(
            "rule_decisions",
            "Descriptor decisions by domain, matched rule (named as envoyproxy/ratelimit names its stats) and outcome",
            rules.clone(),
        );
        let shadow = Family::<DomainLabel, Counter>::default();
        registry.register(
            "shadow_mode_refusals",
            "Descriptors that a shadow-mode rule would have refused",
            shadow.clone(),
        );
        let global_shadow = Counter::default();
        registry.register(
            "global_shadow_mode",
            "Answers that the service's shadow mode (SHADOW_MODE) turned from over the limit to OK",
            global_shadow.clone(),
        );
        // 1 µs to about 0.5 s.
        let latency = Histogram::new(exponential_buckets(1e-6, 2.0, 20));
        registry.register(
            "decision_seconds",
            "Time to decide one request, in the engine",
            latency.clone(),
        );
        let keys = Gauge::default();
        registry.register("keys", "Counters held in the store", keys.clone());
        let capacity = Gauge::default();
        registry.register("key_capacity", "Counters the store can hold", capacity.clone());
        let bytes = Gauge::default();
        registry.register("store_bytes", "Bytes the store holds", bytes.clone());
        let evictions = Counter::default();
        registry.register(
            "evictions",
            "Counters evicted before they expired, to make room",
            evictions.clone(),
        );
        let store_errors = Counter::default();
        registry.register(
            "store_errors",
            "Decisions the store could not make",
            store_errors.clone(),
        );
        let reloads = Family::<ReloadLabels, Counter>::default();
        registry.register("config_reloads", "Config reloads by result", reloads.clone());
        let redis_errors = Counter::default();
        registry.register(
            "redis_errors",
            "Calls to Redis that failed or timed out (0 without --redis)",
            redis_errors.clone(),
        );
        let redis_fallbacks = Family::<FallbackLabels, Counter>::default();
        registry.register(
            "redis_fallbacks",
            "Decisions made without Redis by the failure policy, by source (fail_open, fail_closed, local)",
            redis_fallbacks.clone(),
        );
        let store_decisions = Family::<DecisionLabels, Counter>::default();
        registry.register(
            "store_decisions",
            "Decisions of the shared store's failure policy wrapper, by source (store, fail_open, fail_closed, local) and outcome (0 without --redis)",
            store_decisions.clone(),
        );
        let redis_sync_commands = Counter::default();
        registry.register(
            "redis_sync_commands",
            "Hybrid mode: commands the syncs sent to Redis, one per key per sync (0 without --redis-sync-interval)",
            redis_sync_commands.clone(),
        );
        let redis_pending_keys = Gauge::default();
        registry.register(
            "redis_pending_keys",
            "Hybrid mode: keys whose counts wait for the next sync",
            redis_pending_keys.clone(),
        );
        let in_flight = Gauge::default();
        registry.register(
            "http_requests_in_flight",
            "HTTP requests received and not yet answered",
            in_flight.clone(),
        );
        Metrics {
            rules,
            rule_counters: Default::default(),
            domains: Default::default(),
            in_flight,
            registry,
            requests,
            descriptors,
            shadow,
            global_shadow,
            latency,
            keys,
            capacity,
            bytes,
            evictions,
            evictions_seen: Mutex::new(0),
            store_errors,
            reloads,
            redis_errors,
            redis_fallbacks,
            store_decisions,
            redis_sync_commands,
            redis_pending_keys,
            redis_seen: Mutex::new(Seen::default()),
        }
    }

    /// Counts a request that ended with `outcome` after `elapsed`.
    pub fn request(&self, api: Api, outcome: Outcome, elapsed: Duration) {
        self.requests.get_or_create(&RequestLabels { api, outcome }).inc();
        self.latency.observe(elapsed.as_secs_f64());
        if outcome == Outcome::Unavailable {
            self.store_errors.inc();
        }
    }

    /// Counts an answer's descriptors under `domain` (the caller passes
    /// "unknown" for a domain that is not configured, so that clients
    /// cannot grow the label set).
    pub fn answer(&self, domain: &str, answer: &Answer) {
        if answer.shadowed {
            self.global_shadow.inc();
        }
        for status in &answer.statuses {
            if let Some(rule) = &status.metric {
                self.rule(domain, rule, status.code == Code::OverLimit);
            }
        }
        let over = answer.statuses.iter().filter(|s| s.code == Code::OverLimit).count() as u64;
        let ok = answer.statuses.len() as u64 - over;
        let shadow = answer.statuses.iter().filter(|s| s.shadow_refused).count() as u64;
        let add = |c: &DomainCounters| {
            c.ok.inc_by(ok);
            c.over.inc_by(over);
            c.shadow.inc_by(shadow);
        };
        // The counters of a domain are looked up by `&str`: no label to
        // build on the hot path once a domain has been seen.
        if let Some(counters) = self.domains.read().get(domain) {
            add(counters);
            return;
        }
        // One statement each: `get_or_create` holds the family's lock until
        // its guard drops, and creating the next series needs that lock.
        let label = |outcome| DescriptorLabels {
            domain: domain.to_owned(),
            outcome,
        };
        let ok_counter = self.descriptors.get_or_create(&label(Outcome::Ok)).clone();
        let over_counter = self.descriptors.get_or_create(&label(Outcome::OverLimit)).clone();
        let shadow_counter = self
            .shadow
            .get_or_create(&DomainLabel {
                domain: domain.to_owned(),
            })
            .clone();
        let counters = DomainCounters {
            ok: ok_counter,
            over: over_counter,
            shadow: shadow_counter,
        };
        add(&counters);
        self.domains.write().insert(domain.to_owned(), counters);
    }

    /// Counts one decision of `rule` in `domain`.
    fn rule(&self, domain: &str, rule: &str, over: bool) {
        let inc = |(ok, over_limit): &(Counter, Counter)| {
            if over {
                over_limit.inc();
            } else {
                ok.inc();
            }
        };
        if let Some(counters) = self
            .rule_counters
            .read()
            .by_domain
            .get(domain)
            .and_then(|m| m.get(rule))
        {
            inc(counters);
            return;
        }
        let mut known = self.rule_counters.write();
        let rule = if known.len >= MAX_RULE_SERIES { "overflow" } else { rule };
        if let Some(counters) = known.by_domain.get(domain).and_then(|m| m.get(rule)) {
            inc(counters);
            return;
        }
        let label = |outcome| RuleLabels {
            domain: domain.to_owned(),
            rule: rule.to_owned(),
            outcome,
        };
        let ok = self.rules.get_or_create(&label(Outcome::Ok)).clone();
        let over_limit = self.rules.get_or_create(&label(Outcome::OverLimit)).clone();
        let counters = (ok, over_limit);
        inc(&counters);
        known
            .by_domain
            .entry(domain.to_owned())
            .or_default()
            .insert(rule.to_owned(), counters);
        known.len += 1;
    }

    /// An HTTP request started; it ends when the guard drops.
    pub fn http_request(&self) -> InFlight {
        self.in_flight.inc();
        InFlight(self.in_flight.clone())
    }

    /// Counts a config reload.
    pub fn reload(&self, ok: bool) {
        let result = if ok {
            ReloadResult::Success
        } else {
            ReloadResult::Failure
        };
        self.reloads.get_or_create(&ReloadLabels { result }).inc();
    }

    /// The text exposition (OpenMetrics), with the store's figures (and
    /// the Redis store's, with Redis) read now.
    pub fn render(&self, stats: &StoreStats, shared: bool) -> String {
        if shared {
            let now = Seen {
                errors: stats.errors,
                sync_commands: stats.sync_commands,
                fail_open: stats.failover.fail_open,
                fail_closed: stats.failover.fail_closed,
                local: stats.failover.local_admitted + stats.failover.local_refused,
                ..Seen::default()
            };
            let mut guard = self.redis_seen.lock();
            let seen = &mut *guard;
            let add = |counter: &Counter, now: u64, seen: &mut u64| {
                counter.inc_by(now.saturating_sub(*seen));
                *seen = (*seen).max(now);
            };
            add(&self.redis_errors, now.errors, &mut seen.errors);
            add(&self.redis_sync_commands, now.sync_commands, &mut seen.sync_commands);
            self.redis_pending_keys
                .set(i64::try_from(stats.pending_keys).unwrap_or(i64::MAX));
            for (source, now, seen) in [
                (FallbackSource::FailOpen, now.fail_open, &mut seen.fail_open),
                (FallbackSource::FailClosed, now.fail_closed, &mut seen.fail_closed),
                (FallbackSource::Local, now.local, &mut seen.local),
            ] {
                let counter = self.redis_fallbacks.get_or_create(&FallbackLabels { source }).clone();
                add(&counter, now, seen);
            }
            let f = stats.failover;
            let decided = [
                (DecisionSource::Store, DecisionOutcome::Admitted, f.store_admitted),
                (DecisionSource::Store, DecisionOutcome::Refused, f.store_refused),
                (DecisionSource::FailOpen, DecisionOutcome::Admitted, f.fail_open),
                (DecisionSource::FailClosed, DecisionOutcome::Refused, f.fail_closed),
                (DecisionSource::Local, DecisionOutcome::Admitted, f.local_admitted),
                (DecisionSource::Local, DecisionOutcome::Refused, f.local_refused),
            ];
            for ((source, outcome, now), seen) in decided.into_iter().zip(seen.decisions.iter_mut()) {
                let counter = self
                    .store_decisions
                    .get_or_create(&DecisionLabels { source, outcome })
                    .clone();
                add(&counter, now, seen);
            }
        }
        self.keys.set(i64::try_from(stats.keys).unwrap_or(i64::MAX));
        self.capacity.set(i64::try_from(stats.capacity).unwrap_or(i64::MAX));
        self.bytes.set(i64::try_from(stats.bytes).unwrap_or(i64::MAX));
        {
            let mut seen = self.evictions_seen.lock();
            let now = stats.evictions;
            self.evictions.inc_by(now.saturating_sub(*seen));
            *seen = (*seen).max(now);
        }
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// The store's counters as last rendered, so that each rendering adds
/// what is new.
#[derive(Default)]
struct Seen {
    /// The decisions by source and outcome, in the order `render` lists them.
    decisions: [u64; 6],
    errors: u64,
    sync_commands: u64,
    fail_open: u64,
    fail_closed: u64,
    local: u64,
}

/// An HTTP request in flight, counted until this drops.
pub struct InFlight(Gauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Label values in snake case, as Prometheus names go.
macro_rules! label_values {
    ($($t:ty { $($variant:ident => $text:literal),* $(,)? })*) => {$(
        impl EncodeLabelValue for $t {
            fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
                encoder.write_str(match self {
                    $(Self::$variant => $text,)*
                })
            }
        }
    )*};
}

label_values! {
    Api { Grpc => "grpc", Json => "json", Check => "check", AdHoc => "ad_hoc" }
    Outcome { Ok => "ok", OverLimit => "over_limit", Invalid => "invalid", Unavailable => "unavailable" }
    ReloadResult { Success => "success", Failure => "failure" }
    FallbackSource { FailOpen => "fail_open", FailClosed => "fail_closed", Local => "local" }
    DecisionSource { Store => "store", FailOpen => "fail_open", FailClosed => "fail_closed", Local => "local" }
    DecisionOutcome { Admitted => "admitted", Refused => "refused" }
}
