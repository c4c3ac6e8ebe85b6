//! Prometheus metrics, in one registry per server (no globals, so that
//! several servers in one process, as in the tests, count apart).
//!
//! Besides the service's own figures, every matched rule has the stats
//! envoyproxy/ratelimit keeps per rule (`total_hits`, `within_limit`,
//! `near_limit`, `over_limit`, `shadow_mode`), counted in hits by its rule,
//! under the label `rule` that names the rule as its stat names it
//! ([`Match::metric_key`](crate::config::Match::metric_key), sanitized by
//! [`stat_name`]).

mod process;
mod quota;
mod statsd;
mod upstream;
mod xds;

pub use quota::{QuotaAction, QuotaEnd, QuotaRefusal};
pub use statsd::{ExtraTagsError, StatsdError, StatsdOptions};
pub(crate) use statsd::{Statsd, spawn_flushes};

use crate::engine::{Answer, Code, Request, Status};
use parking_lot::Mutex;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use slidegate_store::StoreStats;
use std::borrow::Cow;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

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

impl Api {
    /// `AdHoc` is the last variant.
    const COUNT: usize = Api::AdHoc as usize + 1;
    /// Every variant.
    const ALL: [Api; Api::COUNT] = [Api::Grpc, Api::Json, Api::Check, Api::AdHoc];
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

impl Outcome {
    /// `Unavailable` is the last variant.
    const COUNT: usize = Outcome::Unavailable as usize + 1;
    /// Every variant.
    const ALL: [Outcome; Outcome::COUNT] = [Outcome::Ok, Outcome::OverLimit, Outcome::Invalid, Outcome::Unavailable];
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    api: Api,
    outcome: Outcome,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ApiLabel {
    api: Api,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuleHitLabels {
    domain: String,
    rule: String,
}

/// envoyproxy/ratelimit's default `NEAR_LIMIT_RATIO`: hits past 80 % of a
/// limit count as near it.
pub const DEFAULT_NEAR_LIMIT_RATIO: f64 = 0.8;

/// A near-limit ratio that is not a number from 0 to 1.
///
/// envoyproxy/ratelimit reads `NEAR_LIMIT_RATIO` unchecked, on its
/// documented 0-1 scale; above 1 its `near_limit` count wraps around, below
/// 0 its threshold is undefined, so slidegate refuses both (and NaN).
#[derive(Clone, Copy, Debug, PartialEq, thiserror::Error)]
#[error("the near-limit ratio must be a number from 0 to 1, not {ratio}")]
#[non_exhaustive]
pub struct NearLimitRatioError {
    /// The ratio refused.
    pub ratio: f64,
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

/// The series of `slidegate_store_decisions_total`, in the order `render`
/// reads them.
const DECISIONS: [(DecisionSource, DecisionOutcome); 6] = [
    (DecisionSource::Store, DecisionOutcome::Admitted),
    (DecisionSource::Store, DecisionOutcome::Refused),
    (DecisionSource::FailOpen, DecisionOutcome::Admitted),
    (DecisionSource::FailClosed, DecisionOutcome::Refused),
    (DecisionSource::Local, DecisionOutcome::Admitted),
    (DecisionSource::Local, DecisionOutcome::Refused),
];

/// The server's metrics.
pub struct Metrics {
    registry: Registry,
    /// Handles on `slidegate_requests_total`'s series, every one made at
    /// start: the hot path takes no lock and hashes no label.
    request_series: [[Counter; Outcome::COUNT]; Api::COUNT],
    /// `slidegate_request_duration_seconds` by API, in `Api` order.
    durations: [Histogram; Api::COUNT],
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
    /// Keys started from the summary of evicted counters, and keys it
    /// vouched for that were not held; the last figures seen of each.
    seeded: Counter,
    summarised: Counter,
    summary_seen: Mutex<(u64, u64)>,
    /// The share of the summary's cells holding a count.
    summary_fill: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// The estimated share of never-evicted new keys started from a
    /// non-zero estimate: a bound on those refused early.
    false_seed: Gauge<f64, std::sync::atomic::AtomicU64>,
    store_errors: Counter,
    admin_auth: AdminAuthMetrics,
    xds: xds::XdsMetrics,
    quota: quota::QuotaMetrics,
    reloads: Family<ReloadLabels, Counter>,
    last_reload_ok: Gauge,
    redis_errors: Counter,
    redis_fallbacks: Family<FallbackLabels, Counter>,
    store_decisions: Family<DecisionLabels, Counter>,
    redis_sync_commands: Counter,
    redis_script_calls: Counter,
    redis_script_requests: Counter,
    redis_lease_refusals: Counter,
    redis_pending_keys: Gauge,
    /// The Redis store's figures at the last scrape.
    redis_seen: Mutex<Seen>,
    in_flight: Gauge,
    connections: ConnectionMetrics,
    rules: Family<RuleLabels, Counter>,
    rule_hits: RuleHitFamilies,
    /// The near-limit ratio, as envoyproxy/ratelimit keeps it (`float32`).
    near_limit_ratio: f32,
    /// The rule counters seen, by domain and rule name.
    rule_counters: parking_lot::RwLock<RuleCounters>,
    /// The descriptor counters of each domain seen, by name.
    domains: parking_lot::RwLock<foldhash::HashMap<String, DomainCounters>>,
    /// Configs loaded at the start (envoyproxy/ratelimit counts them in
    /// `config_load_success`; not registered).
    start_loads: Counter,
}

/// The rule counters seen: by domain, then by rule name (the metric key
/// before [`stat_name`]), with the number of rules in all.
#[derive(Default)]
struct RuleCounters {
    by_domain: foldhash::HashMap<String, foldhash::HashMap<String, RuleSeries>>,
    len: usize,
}

/// The families of envoyproxy/ratelimit's per-rule stats, in hits.
#[derive(Default)]
struct RuleHitFamilies {
    total: Family<RuleHitLabels, Counter>,
    within: Family<RuleHitLabels, Counter>,
    near: Family<RuleHitLabels, Counter>,
    over: Family<RuleHitLabels, Counter>,
    shadow: Family<RuleHitLabels, Counter>,
}

/// One rule's counters (handles on the same atomics as the families').
struct RuleSeries {
    /// Descriptors admitted.
    ok: Counter,
    /// Descriptors over the limit.
    over_limit: Counter,
    total_hits: Counter,
    within_limit_hits: Counter,
    near_limit_hits: Counter,
    over_limit_hits: Counter,
    shadow_mode_hits: Counter,
}

impl RuleSeries {
    fn add(&self, over: bool, hits: Option<Hits>) {
        if over {
            self.over_limit.inc();
        } else {
            self.ok.inc();
        }
        if let Some(h) = hits {
            self.total_hits.inc_by(h.total);
            self.within_limit_hits.inc_by(h.within);
            self.near_limit_hits.inc_by(h.near);
            self.over_limit_hits.inc_by(h.over);
            self.shadow_mode_hits.inc_by(h.shadow);
        }
    }
}

/// One domain's counters (handles on the same atomics as the families').
#[derive(Clone)]
pub(crate) struct DomainCounters {
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
    /// Every metric, registered under `slidegate_`, with envoyproxy/ratelimit's
    /// default near-limit ratio ([`DEFAULT_NEAR_LIMIT_RATIO`]).
    pub fn new() -> Self {
        Self::with_ratio(DEFAULT_NEAR_LIMIT_RATIO as f32)
    }

    /// Every metric, with hits past `ratio` of a limit (and within it)
    /// counted as near the limit, as envoyproxy/ratelimit's
    /// `NEAR_LIMIT_RATIO` does. 0 counts every hit within a limit as near
    /// it; 1 none.
    ///
    /// The ratio is kept as a 32-bit float, as envoyproxy/ratelimit keeps
    /// it, so that a limit's near-limit threshold is the same number.
    ///
    /// # Errors
    ///
    /// [`NearLimitRatioError`] for a ratio below 0, above 1 or NaN.
    pub fn with_near_limit_ratio(ratio: f64) -> Result<Self, NearLimitRatioError> {
        if !(0.0..=1.0).contains(&ratio) {
            return Err(NearLimitRatioError { ratio });
        }
        Ok(Self::with_ratio(ratio as f32))
    }

    /// The near-limit ratio in force.
    pub fn near_limit_ratio(&self) -> f64 {
        f64::from(self.near_limit_ratio)
    }

    fn with_ratio(near_limit_ratio: f32) -> Self {
        // The process's standard metrics unprefixed, the service's own
        // under `slidegate_`.
        let mut root = Registry::default();
        root.register_collector(Box::new(process::ProcessCollector));
        let registry = root.sub_registry_with_prefix("slidegate");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register("requests", "Rate limit requests by API and outcome", requests.clone());
        // Every series there from the start, at 0, so that a rate over
        // them sees the first request. One statement each:
        // `get_or_create` holds the family's lock until its guard drops.
        let request_series = Api::ALL
            .map(|api| Outcome::ALL.map(|outcome| requests.get_or_create(&RequestLabels { api, outcome }).clone()));
        let duration_family =
            Family::<ApiLabel, Histogram>::new_with_constructor(|| Histogram::new(exponential_buckets(1e-6, 2.0, 20)));
        registry.register(
            "request_duration_seconds",
            "Time from a decision request's arrival (its headers read) to its answer, by API, the body's reading and the answer's making included",
            duration_family.clone(),
        );
        let durations = Api::ALL.map(|api| duration_family.get_or_create(&ApiLabel { api }).clone());
        let build = Family::<BuildLabels, Gauge>::default();
        registry.register(
            "build_info",
            "1, labelled with the version of slidegate that serves",
            build.clone(),
        );
        build
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
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
        let rule_hits = RuleHitFamilies::default();
        for (name, help, family) in [
            (
                "rule_hits",
                "Hits on a rule with a limit, by domain and rule (envoyproxy/ratelimit's total_hits)",
                &rule_hits.total,
            ),
            (
                "rule_within_limit_hits",
                "Hits of admitted descriptors (envoyproxy/ratelimit's within_limit)",
                &rule_hits.within,
            ),
            (
                "rule_near_limit_hits",
                "Hits past the near-limit ratio of a limit and within it (envoyproxy/ratelimit's near_limit)",
                &rule_hits.near,
            ),
            (
                "rule_over_limit_hits",
                "Hits past a limit (envoyproxy/ratelimit's over_limit)",
                &rule_hits.over,
            ),
            (
                "rule_shadow_mode_hits",
                "Hits past a limit of a rule in shadow mode, admitted (envoyproxy/ratelimit's shadow_mode)",
                &rule_hits.shadow,
            ),
        ] {
            registry.register(name, help, family.clone());
        }
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
        let seeded = Counter::default();
        registry.register(
            "keys_seeded",
            "New counters started from the summary of evicted ones (never below what they may still hold)",
            seeded.clone(),
        );
        let summarised = Counter::default();
        registry.register(
            "keys_summarised",
            "New counters the summary of evicted ones vouched for, kept in it rather than in the table",
            summarised.clone(),
        );
        let summary_fill = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        registry.register(
            "eviction_summary_fill",
            "Share of the cells of the summary of evicted counters that hold a count",
            summary_fill.clone(),
        );
        let false_seed = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        registry.register(
            "eviction_summary_false_seed_ratio",
            "Estimated share of new keys, never evicted, that start from a non-zero estimate of the summary of evicted counters (its fill to the power of its rows): a bound on the share refused early",
            false_seed.clone(),
        );
        let store_errors = Counter::default();
        registry.register(
            "store_errors",
            "Decisions the store could not make",
            store_errors.clone(),
        );
        let admin_auth = AdminAuthMetrics::new(registry);
        let xds = xds::XdsMetrics::new(registry);
        let quota = quota::QuotaMetrics::new(registry);
        let reloads = Family::<ReloadLabels, Counter>::default();
        registry.register("config_reloads", "Config reloads by result", reloads.clone());
        for result in [ReloadResult::Success, ReloadResult::Failure] {
            let _ = reloads.get_or_create(&ReloadLabels { result });
        }
        // 1 from the start: a server starts only with its config loaded
        // (or with none, which no reload has yet failed to replace).
        let last_reload_ok = Gauge::default();
        last_reload_ok.set(1);
        registry.register(
            "config_last_reload_successful",
            "1 when the last config reload worked (or none was tried yet), 0 while the served config is older than a file that failed to load",
            last_reload_ok.clone(),
        );
        let redis_errors = Counter::default();
        registry.register(
            "redis_errors",
            "Calls to Redis that failed or timed out (0 without --redis)",
            redis_errors.clone(),
        );
        let redis_fallbacks = Family::<FallbackLabels, Counter>::default();
        for source in [
            FallbackSource::FailOpen,
            FallbackSource::FailClosed,
            FallbackSource::Local,
        ] {
            let _ = redis_fallbacks.get_or_create(&FallbackLabels { source });
        }
        registry.register(
            "redis_fallbacks",
            "Decisions made without Redis by the failure policy, by source (fail_open, fail_closed, local)",
            redis_fallbacks.clone(),
        );
        let store_decisions = Family::<DecisionLabels, Counter>::default();
        for (source, outcome) in DECISIONS {
            let _ = store_decisions.get_or_create(&DecisionLabels { source, outcome });
        }
        registry.register(
            "store_decisions",
            "Decisions of the shared store's failure policy wrapper, by source (store, fail_open, fail_closed, local) and outcome (0 without --redis)",
            store_decisions.clone(),
        );
        let redis_sync_commands = Counter::default();
        registry.register(
            "redis_sync_commands",
            "Hybrid mode: commands the syncs sent to Redis, one per key per sync, one per batch with --redis-bounded (0 without --redis-sync-interval)",
            redis_sync_commands.clone(),
        );
        let redis_script_calls = Counter::default();
        registry.register(
            "redis_script_calls",
            "Script calls sent to Redis for decisions and charges (0 without --redis)",
            redis_script_calls.clone(),
        );
        let redis_script_requests = Counter::default();
        registry.register(
            "redis_script_requests",
            "The requests those script calls carried: more than the calls when requests that waited together for a call in flight went in one",
            redis_script_requests.clone(),
        );
        let redis_lease_refusals = Counter::default();
        registry.register(
            "redis_lease_refusals",
            "Bounded hybrid mode: requests refused because this instance's lease of the key was spent, while another instance may hold unused share (0 without --redis-bounded)",
            redis_lease_refusals.clone(),
        );
        let redis_pending_keys = Gauge::default();
        registry.register(
            "redis_pending_keys",
            "Hybrid mode: keys whose counts wait for the next sync",
            redis_pending_keys.clone(),
        );
        let connections = ConnectionMetrics::new(registry);
        let in_flight = Gauge::default();
        registry.register(
            "http_requests_in_flight",
            "HTTP requests received and not yet answered",
            in_flight.clone(),
        );
        Metrics {
            connections,
            rules,
            rule_hits,
            near_limit_ratio,
            rule_counters: Default::default(),
            domains: Default::default(),
            in_flight,
            registry: root,
            request_series,
            durations,
            descriptors,
            shadow,
            global_shadow,
            latency,
            keys,
            capacity,
            bytes,
            evictions,
            evictions_seen: Mutex::new(0),
            seeded,
            summarised,
            summary_seen: Mutex::new((0, 0)),
            summary_fill,
            false_seed,
            store_errors,
            admin_auth,
            xds,
            quota,
            reloads,
            last_reload_ok,
            redis_errors,
            redis_fallbacks,
            store_decisions,
            redis_sync_commands,
            redis_script_calls,
            redis_script_requests,
            redis_lease_refusals,
            redis_pending_keys,
            redis_seen: Mutex::new(Seen::default()),
            start_loads: Counter::default(),
        }
    }

    /// Counts a request that ended with `outcome` after `elapsed`.
    pub fn request(&self, api: Api, outcome: Outcome, elapsed: Duration) {
        // Always there: the arrays have a cell for every variant.
        if let Some(series) = self
            .request_series
            .get(api as usize)
            .and_then(|row| row.get(outcome as usize))
        {
            series.inc();
        }
        self.latency.observe(elapsed.as_secs_f64());
        if outcome == Outcome::Unavailable {
            self.store_errors.inc();
        }
    }

    /// Counts the answer to `request` under `domain` (the caller passes
    /// "unknown" for a domain that is not configured, so that clients
    /// cannot grow the label set), each descriptor with its hits as the
    /// engine charged them: its own `hits_addend` when set (0 included),
    /// else the request's, 0 meaning 1.
    pub fn answer_request(&self, domain: &str, request: &Request, answer: &Answer) {
        let default = u64::from(request.hits_addend.max(1));
        let hits = |i: usize| {
            request
                .descriptors
                .get(i)
                .and_then(|d| d.hits_addend)
                .unwrap_or(default)
        };
        if answer.shadowed {
            self.global_shadow.inc();
        }
        for (i, status) in answer.statuses.iter().enumerate() {
            if let Some(rule) = &status.metric {
                let counted = rule_hits(status, hits(i), self.near_limit_ratio);
                self.rule(domain, rule, status.code == Code::OverLimit, counted);
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
        add(&self.declare_domain(domain));
    }

    /// Makes the series of `domain` (a configured domain, or "unknown"),
    /// at 0 until it is counted, so that they are there from the start;
    /// a handle on its counters.
    pub(crate) fn declare_domain(&self, domain: &str) -> DomainCounters {
        if let Some(counters) = self.domains.read().get(domain) {
            return counters.clone();
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
        self.domains.write().insert(domain.to_owned(), counters.clone());
        counters
    }

    /// Makes the descriptor series of every domain of `config`, and of
    /// "unknown", at 0 until counted.
    pub(crate) fn declare_domains(&self, config: &crate::config::Config) {
        self.declare_domain("unknown");
        for domain in config.domains() {
            self.declare_domain(&domain.name);
        }
    }

    /// Times a decision request from now (its arrival) until the guard
    /// drops (its answer made), under `api` (which the guard may still
    /// change, once the request says which it is).
    pub(crate) fn time(&self, api: Api) -> Timer<'_> {
        Timer {
            metrics: self,
            api,
            start: Instant::now(),
        }
    }

    /// Counts one decision of `rule` in `domain`, with its hits.
    fn rule(&self, domain: &str, rule: &str, over: bool, hits: Option<Hits>) {
        if let Some(series) = self
            .rule_counters
            .read()
            .by_domain
            .get(domain)
            .and_then(|m| m.get(rule))
        {
            series.add(over, hits);
            return;
        }
        let mut known = self.rule_counters.write();
        let rule = if known.len >= MAX_RULE_SERIES { "overflow" } else { rule };
        if let Some(series) = known.by_domain.get(domain).and_then(|m| m.get(rule)) {
            series.add(over, hits);
            return;
        }
        // Two metric keys that sanitize to one stat name share its series,
        // as they share one stat in envoyproxy/ratelimit.
        let name = stat_name(rule).into_owned();
        let label = |outcome| RuleLabels {
            domain: domain.to_owned(),
            rule: name.clone(),
            outcome,
        };
        let one = RuleHitLabels {
            domain: domain.to_owned(),
            rule: name.clone(),
        };
        // One statement each: `get_or_create` holds the family's lock until
        // its guard drops.
        let ok = self.rules.get_or_create(&label(Outcome::Ok)).clone();
        let over_limit = self.rules.get_or_create(&label(Outcome::OverLimit)).clone();
        let total_hits = self.rule_hits.total.get_or_create(&one).clone();
        let within_limit_hits = self.rule_hits.within.get_or_create(&one).clone();
        let near_limit_hits = self.rule_hits.near.get_or_create(&one).clone();
        let over_limit_hits = self.rule_hits.over.get_or_create(&one).clone();
        let shadow_mode_hits = self.rule_hits.shadow.get_or_create(&one).clone();
        let series = RuleSeries {
            ok,
            over_limit,
            total_hits,
            within_limit_hits,
            near_limit_hits,
            over_limit_hits,
            shadow_mode_hits,
        };
        series.add(over, hits);
        known
            .by_domain
            .entry(domain.to_owned())
            .or_default()
            .insert(rule.to_owned(), series);
        known.len += 1;
    }

    /// Takes in the connections' figures (at each scrape).
    pub fn connections(&self, now: &AdmissionStats) {
        self.connections.observe(now);
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
        self.last_reload_ok.set(i64::from(ok));
    }

    /// The text exposition (OpenMetrics), with the store's figures (and
    /// the Redis store's, with Redis) read now.
    pub fn render(&self, stats: &StoreStats, shared: bool) -> String {
        if shared {
            let now = Seen {
                errors: stats.errors,
                sync_commands: stats.sync_commands,
                script_calls: stats.script_calls,
                script_requests: stats.script_requests,
                lease_refusals: stats.lease_refusals,
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
            add(&self.redis_script_calls, now.script_calls, &mut seen.script_calls);
            add(
                &self.redis_script_requests,
                now.script_requests,
                &mut seen.script_requests,
            );
            add(&self.redis_lease_refusals, now.lease_refusals, &mut seen.lease_refusals);
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
            let counts = [
                f.store_admitted,
                f.store_refused,
                f.fail_open,
                f.fail_closed,
                f.local_admitted,
                f.local_refused,
            ];
            for (((source, outcome), now), seen) in DECISIONS.into_iter().zip(counts).zip(seen.decisions.iter_mut()) {
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
        {
            let mut seen = self.summary_seen.lock();
            self.seeded.inc_by(stats.seeded.saturating_sub(seen.0));
            self.summarised.inc_by(stats.summarised.saturating_sub(seen.1));
            *seen = (seen.0.max(stats.seeded), seen.1.max(stats.summarised));
        }
        #[allow(clippy::cast_precision_loss)]
        let fill = if stats.summary_cells == 0 {
            0.0
        } else {
            stats.summary_live as f64 / stats.summary_cells as f64
        };
        #[allow(clippy::cast_precision_loss)]
        self.false_seed.set(stats.summary_false_seed_ppm as f64 / 1e6);
        self.summary_fill.set(fill);
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// What one descriptor's hits add to its rule's stats.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Hits {
    total: u64,
    within: u64,
    near: u64,
    over: u64,
    shadow: u64,
}

/// A limit's near-limit threshold, as envoyproxy/ratelimit computes it:
/// `floor(float32(limit) * ratio)`, the product in 32-bit floats.
fn near_limit_threshold(limit: u64, ratio: f32) -> u64 {
    // A float to integer cast saturates (and the ratio is from 0 to 1).
    f64::from(limit as f32 * ratio).floor() as u64
}

/// A descriptor's hits as envoyproxy/ratelimit counts them
/// (`GetResponseDescriptorStatus`, `checkOverLimitThreshold` and
/// `checkNearLimitThreshold` in its src/limiter/base_limiter.go), on the
/// limit that decided (the status's tightest); `None` when no limit applied
/// (an unlimited rule, or every limit replaced), which has no stats there.
///
/// envoyproxy/ratelimit counts in a fixed window that also counts refused
/// hits; here the count before the request is the limit minus what the
/// decision left (`remaining`): after an admission it includes the hits,
/// after a refusal nothing was counted. With `hits` of 1 and a fixed window
/// both count alike.
fn rule_hits(status: &Status, hits: u64, ratio: f32) -> Option<Hits> {
    let applied = status.applied.get(status.tightest?)?;
    let limit = applied.requests_per_unit;
    // A limit of 0 has no decision: it refuses everything.
    let (refused, remaining) = applied
        .decision
        .as_ref()
        .map_or((true, 0), |d| (!d.allowed(), d.remaining()));
    let used = limit.saturating_sub(remaining);
    let before = if refused { used } else { used.saturating_sub(hits) };
    Some(count_hits(
        limit,
        near_limit_threshold(limit, ratio),
        before,
        hits,
        refused,
        status.shadow_refused,
    ))
}

/// envoyproxy/ratelimit's rule, for `hits` on a count of `before` against
/// `limit` and its near-limit threshold `near`:
///
/// - every hit counts in `total_hits`;
/// - refused: if the count was already at the limit, every hit is over
///   it; otherwise the hits past the limit are over it and those between
///   the threshold (or the count, if higher) and the limit are near it
///   (`within_limit` gets none of them);
/// - admitted: every hit is within the limit, and those past the
///   threshold are near it (all of them if the count was already past it);
/// - in shadow mode, a refusal's over-limit hits also count in
///   `shadow_mode`.
///
/// Subtractions saturate where envoyproxy/ratelimit's would wrap (a limit
/// above 2²⁴ whose threshold rounds up past it).
fn count_hits(limit: u64, near: u64, before: u64, hits: u64, refused: bool, shadow: bool) -> Hits {
    let after = before.saturating_add(hits);
    let mut out = Hits {
        total: hits,
        ..Hits::default()
    };
    if refused {
        if before >= limit {
            out.over = hits;
        } else {
            out.over = after.saturating_sub(limit);
            out.near = limit.saturating_sub(near.max(before));
        }
        if shadow {
            out.shadow = out.over;
        }
    } else {
        out.within = hits;
        if after > near {
            out.near = if before >= near { hits } else { after - near };
        }
    }
    out
}

/// envoyproxy/ratelimit's stat name for a metric key
/// (`utils.SanitizeStatName`): `:` and `|` become `_`, and so do the dots of
/// anything that looks like an IPv4 address (four runs of 1 to 3 digits
/// joined by dots, found leftmost first): `remote_address_10.0.0.1` becomes
/// `remote_address_10_0_0_1`. envoyproxy/ratelimit sanitizes the domain and
/// the key together; here the key alone, which differs only when digits of
/// the domain's end would join an address at the key's start.
pub fn stat_name(key: &str) -> Cow<'_, str> {
    let bytes = key.as_bytes();
    let mut dots = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        match ipv4_at(bytes, at) {
            Some((end, found)) => {
                dots.extend_from_slice(&found);
                at = end;
            }
            None => at += 1,
        }
    }
    if dots.is_empty() && !key.contains([':', '|']) {
        return Cow::Borrowed(key);
    }
    let out = key
        .char_indices()
        .map(|(i, c)| match c {
            ':' | '|' => '_',
            '.' if dots.contains(&i) => '_',
            c => c,
        })
        .collect();
    Cow::Owned(out)
}

/// An IPv4-like run starting at `at`, as Go's `\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}`
/// finds it: where it ends and where its three dots are.
fn ipv4_at(bytes: &[u8], at: usize) -> Option<(usize, [usize; 3])> {
    let digits = |from: usize| {
        bytes
            .get(from..)
            .unwrap_or(&[])
            .iter()
            .take(3)
            .take_while(|b| b.is_ascii_digit())
            .count()
    };
    let mut dots = [0; 3];
    let mut pos = at;
    for dot in &mut dots {
        // Digits then a dot: a fourth digit where the dot should be fails,
        // whichever shorter run the greedy `\d{1,3}` backs off to.
        let n = digits(pos);
        if n == 0 || bytes.get(pos + n) != Some(&b'.') {
            return None;
        }
        *dot = pos + n;
        pos += n + 1;
    }
    let n = digits(pos);
    (n > 0).then_some((pos + n, dots))
}

/// The store's counters as last rendered, so that each rendering adds
/// what is new.
#[derive(Default)]
struct Seen {
    /// The decisions by source and outcome, in the order `render` lists them.
    decisions: [u64; 6],
    errors: u64,
    sync_commands: u64,
    script_calls: u64,
    script_requests: u64,
    lease_refusals: u64,
    fail_open: u64,
    fail_closed: u64,
    local: u64,
}

/// A decision request being answered: observed in
/// `slidegate_request_duration_seconds` when this drops.
pub(crate) struct Timer<'a> {
    metrics: &'a Metrics,
    /// The API it is counted under.
    pub(crate) api: Api,
    start: Instant,
}

impl Drop for Timer<'_> {
    fn drop(&mut self) {
        if let Some(histogram) = self.metrics.durations.get(self.api as usize) {
            histogram.observe(self.start.elapsed().as_secs_f64());
        }
    }
}

/// An HTTP request in flight, counted until this drops.
pub struct InFlight(Gauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Label values in snake case, as Prometheus names go (also the value's
/// `as_str`, which the decision spans share).
macro_rules! label_values {
    ($($t:ty { $($variant:ident => $text:literal),* $(,)? })*) => {$(
        impl $t {
            /// The label value.
            pub(crate) fn as_str(&self) -> &'static str {
                match self {
                    $(Self::$variant => $text,)*
                }
            }
        }

        impl EncodeLabelValue for $t {
            fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
                encoder.write_str(self.as_str())
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

/// Why a request to an admin endpoint (`POST /v1/reset`) was refused for
/// its token.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub(crate) enum AuthFailure {
    /// No `Authorization: Bearer` token: 401.
    Missing,
    /// Another token than the admin token: 403.
    Wrong,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AuthFailureLabels {
    reason: AuthFailure,
}

label_values! {
    AuthFailure { Missing => "missing", Wrong => "wrong" }
}

/// `slidegate_admin_auth_failures_total{reason}`: both series made at
/// once, so that they show 0 before the first failure (an alert on their
/// rate sees it).
struct AdminAuthMetrics {
    missing: Counter,
    wrong: Counter,
}

impl AdminAuthMetrics {
    fn new(registry: &mut Registry) -> Self {
        let family = Family::<AuthFailureLabels, Counter>::default();
        registry.register(
            "admin_auth_failures",
            "Requests to POST /v1/reset refused for their admin token, by reason: missing (no Authorization: Bearer, 401) or wrong (another token, 403)",
            family.clone(),
        );
        // One statement each: `get_or_create` holds the family's lock until
        // its guard drops.
        let missing = family
            .get_or_create(&AuthFailureLabels {
                reason: AuthFailure::Missing,
            })
            .clone();
        let wrong = family
            .get_or_create(&AuthFailureLabels {
                reason: AuthFailure::Wrong,
            })
            .clone();
        AdminAuthMetrics { missing, wrong }
    }
}

impl Metrics {
    /// Counts a request to an admin endpoint refused for its token.
    pub(crate) fn admin_auth_failure(&self, reason: AuthFailure) {
        match reason {
            AuthFailure::Missing => self.admin_auth.missing.inc(),
            AuthFailure::Wrong => self.admin_auth.wrong.inc(),
        };
    }
}

/// What the admission control (the network layer's caps on connections
/// and calls in flight) counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct AdmissionStats {
    /// Connections open now.
    pub open: u64,
    /// New connections closed at once: the cap was reached and every open
    /// connection had a call in flight.
    pub shed: u64,
    /// Connections closed to make room for a new one.
    pub evicted: u64,
    /// Connections closed for starting no call in time.
    pub idle: u64,
    /// Connections closed at the maximum age.
    pub aged: u64,
    /// Connections that ended with an HTTP/2 protocol error, the server's
    /// defences included (too many resets, a flood of frames).
    pub protocol_errors: u64,
    /// Calls in flight now.
    pub in_flight: u64,
    /// Calls answered at once because the in-flight budget was spent.
    pub calls_shed: u64,
    /// `accept` failures (out of descriptors, most often).
    pub accept_errors: u64,
}

/// What the network layer reports of its connections and calls, read when
/// the metrics are rendered (implemented by its admission control, above
/// this module, which does not import it).
pub trait ConnectionStats: Send + Sync {
    /// What was counted so far, and what is open and in flight now.
    fn connection_stats(&self) -> AdmissionStats;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `count_hits` on limit 10 with threshold 8: (before, hits, refused)
    /// and the stats they add (total, within, near, over).
    #[test]
    fn hits_as_envoyproxy_ratelimit_counts_them() {
        let cases = [
            // One hit at a time.
            ((0, 1, false), (1, 1, 0, 0)),
            ((7, 1, false), (1, 1, 0, 0)),
            ((8, 1, false), (1, 1, 1, 0)),
            ((9, 1, false), (1, 1, 1, 0)),
            ((10, 1, true), (1, 0, 0, 1)),
            // Several hits: only those past the threshold are near it…
            ((6, 3, false), (3, 3, 1, 0)),
            ((8, 2, false), (2, 2, 2, 0)),
            ((0, 10, false), (10, 10, 2, 0)),
            // …and a refusal from below the limit splits its hits into
            // near and over, none within.
            ((9, 3, true), (3, 0, 1, 2)),
            ((5, 10, true), (10, 0, 2, 5)),
            ((10, 3, true), (3, 0, 0, 3)),
            // A check without hits adds nothing.
            ((9, 0, false), (0, 0, 0, 0)),
        ];
        for ((before, hits, refused), (total, within, near, over)) in cases {
            let got = count_hits(10, 8, before, hits, refused, false);
            assert_eq!(
                got,
                Hits {
                    total,
                    within,
                    near,
                    over,
                    shadow: 0
                },
                "before {before}, {hits} hits, refused {refused}"
            );
        }
        // Shadow mode counts the over-limit hits again.
        assert_eq!(count_hits(10, 8, 9, 3, true, true).shadow, 2);
        assert_eq!(count_hits(10, 8, 10, 3, true, true).shadow, 3);
        assert_eq!(count_hits(10, 8, 9, 1, false, true).shadow, 0);
        // A limit of 0 refuses every hit, all over it.
        assert_eq!(count_hits(0, 0, 0, 4, true, false).over, 4);
        // A threshold above the limit (a limit above 2^24 rounded up as a
        // 32-bit float) saturates where envoyproxy/ratelimit wraps.
        assert_eq!(count_hits(16_777_219, 16_777_220, 0, 16_777_220, true, false).near, 0);
    }

    #[test]
    fn near_limit_thresholds_in_32_bit_floats() {
        for (limit, ratio, threshold) in [
            (10, 0.8, 8),
            (1, 0.8, 0),
            (3, 0.8, 2),
            (100, 0.8, 80),
            (10, 0.0, 0),
            (10, 1.0, 10),
            (0, 0.8, 0),
            // 2^24 + 1 is not a 32-bit float: it rounds to 2^24.
            (16_777_217, 1.0, 16_777_216),
            (16_777_219, 1.0, 16_777_220),
        ] {
            assert_eq!(near_limit_threshold(limit, ratio), threshold, "{limit} × {ratio}");
        }
    }

    #[test]
    fn stat_names_as_envoyproxy_ratelimit_sanitizes_them() {
        for (key, name) in [
            ("remote_address", "remote_address"),
            ("remote_address_10.0.0.1", "remote_address_10_0_0_1"),
            ("a:b|c", "a_b_c"),
            ("path_/files/*", "path_/files/*"),
            ("v_1.2.3", "v_1.2.3"),
            ("v_1.2.3.4.5", "v_1_2_3_4.5"),
            ("v_1234.5.6.7", "v_1234_5_6_7"),
            ("v_1.2.3.4567", "v_1_2_3_4567"),
            ("v_1.2.3.4567.8.9.1", "v_1_2_3_4567_8_9_1"),
            ("v_1.2.3.4.5.6.7.8", "v_1_2_3_4.5_6_7_8"),
            ("a_1.2.3.4.b_5.6.7.8", "a_1_2_3_4.b_5_6_7_8"),
            ("v_1..2.3.4", "v_1..2.3.4"),
            ("é_1.2.3.4:x", "é_1_2_3_4_x"),
        ] {
            assert_eq!(stat_name(key), name, "{key}");
        }
        assert!(matches!(stat_name("a.b_c"), Cow::Borrowed(_)));
    }

    #[test]
    fn near_limit_ratios_from_0_to_1() {
        assert_eq!(Metrics::new().near_limit_ratio(), f64::from(0.8f32));
        for ok in [0.0, 0.5, 1.0] {
            assert_eq!(Metrics::with_near_limit_ratio(ok).map(|m| m.near_limit_ratio()), Ok(ok));
        }
        for bad in [-0.1, 1.01, f64::NAN, f64::INFINITY] {
            let e = Metrics::with_near_limit_ratio(bad).err().unwrap();
            assert!(e.ratio.is_nan() || e.ratio == bad);
            assert!(
                e.to_string()
                    .starts_with("the near-limit ratio must be a number from 0 to 1"),
                "{e}"
            );
        }
    }
}

/// Why connections were closed by the server's defences.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum CloseReason {
    Shed,
    Evicted,
    Idle,
    Age,
    ProtocolError,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CloseLabels {
    reason: CloseReason,
}

label_values! {
    CloseReason { Shed => "shed", Evicted => "evicted", Idle => "idle", Age => "age", ProtocolError => "protocol_error" }
}

/// The connections' and the in-flight budget's figures
/// ([`crate::net::admission`]), taken in at each scrape.
struct ConnectionMetrics {
    open: Gauge,
    in_flight: Gauge,
    closed: Family<CloseLabels, Counter>,
    calls_shed: Counter,
    accept_errors: Counter,
    seen: Mutex<AdmissionStats>,
}

impl ConnectionMetrics {
    fn new(registry: &mut Registry) -> Self {
        let open = Gauge::default();
        registry.register(
            "connections_open",
            "Connections open, HTTP and gRPC (at most --max-connections, but for those closing)",
            open.clone(),
        );
        let in_flight = Gauge::default();
        registry.register(
            "calls_in_flight",
            "Calls (HTTP requests and gRPC calls) in flight, at most --max-in-flight",
            in_flight.clone(),
        );
        let closed = Family::<CloseLabels, Counter>::default();
        registry.register(
            "connections_closed",
            "Connections the server closed by its defences: shed (new, every place busy), evicted (to make room), idle (no call started in time), age (--max-connection-age), protocol_error (HTTP/2 errors and floods)",
            closed.clone(),
        );
        let calls_shed = Counter::default();
        registry.register(
            "calls_shed",
            "Calls answered at once with HTTP 503 or gRPC RESOURCE_EXHAUSTED because --max-in-flight were in flight",
            calls_shed.clone(),
        );
        let accept_errors = Counter::default();
        registry.register(
            "accept_errors",
            "Failed accepts (out of file descriptors, most often)",
            accept_errors.clone(),
        );
        ConnectionMetrics {
            open,
            in_flight,
            closed,
            calls_shed,
            accept_errors,
            seen: Mutex::new(AdmissionStats::default()),
        }
    }

    fn observe(&self, now: &AdmissionStats) {
        let gauge = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        self.open.set(gauge(now.open));
        self.in_flight.set(gauge(now.in_flight));
        let mut guard = self.seen.lock();
        let seen = &mut *guard;
        let add = |counter: &Counter, now: u64, seen: &mut u64| {
            counter.inc_by(now.saturating_sub(*seen));
            *seen = (*seen).max(now);
        };
        for (reason, now, seen) in [
            (CloseReason::Shed, now.shed, &mut seen.shed),
            (CloseReason::Evicted, now.evicted, &mut seen.evicted),
            (CloseReason::Idle, now.idle, &mut seen.idle),
            (CloseReason::Age, now.aged, &mut seen.aged),
            (
                CloseReason::ProtocolError,
                now.protocol_errors,
                &mut seen.protocol_errors,
            ),
        ] {
            add(&self.closed.get_or_create(&CloseLabels { reason }), now, seen);
        }
        add(&self.calls_shed, now.calls_shed, &mut seen.calls_shed);
        add(&self.accept_errors, now.accept_errors, &mut seen.accept_errors);
    }
}
