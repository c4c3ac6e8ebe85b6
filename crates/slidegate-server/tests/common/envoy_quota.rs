//! A model of the client side of Envoy's rate limit quota service (RLQS):
//! the `rate_limit_quota` HTTP filter, the global client its workers share,
//! and the token buckets it enforces assignments with. It is transport-free
//! (usage reports out, responses in) and runs on a manual clock (u64
//! nanoseconds passed in by the caller), so that one model drives both an
//! in-process engine and a real gRPC stream.
//!
//! What it follows, and where in Envoy each part comes from (paths under
//! `source/extensions/filters/http/rate_limit_quota/` unless said otherwise;
//! the global client as of envoyproxy/envoy
//! c33e7f824b9946853a80e839d6e80ef2a09f3bb4):
//!
//! - One [`EnvoyQuotaClient`] is one Envoy's client for one domain: Envoy
//!   keeps one global client (one stream, one bucket cache, one report
//!   timer) per (RLQS server, domain), shared by every worker and filter
//!   chain (`filter_persistence.cc`, `GlobalTlsStores::getTlsStore`).
//! - A request whose bucket is not cached is decided by the
//!   `no_assignment_behavior` (only a blanket `DENY_ALL` denies), and the
//!   bucket is created with that request counted; creating it sends a
//!   report of that bucket alone at once, with `time_elapsed` 0 (though
//!   the proto's validation asks for more than 0: Envoy does not validate
//!   what it sends) (`filter.cc`, `recordBucketUsage`;
//!   `global_client_impl.cc`, `createBucketImpl` and
//!   `buildReports(cached_bucket)`).
//! - The first bucket ever created starts the stream and the report timer;
//!   the timer reports every cached bucket every 5 s, whatever the buckets'
//!   `reporting_interval` says (`filter_persistence.cc`, `initTlsStore`:
//!   the interval is hard-coded; `startSendReportsTimerImpl`,
//!   `onSendReportsTimer`). A bucket's `time_elapsed` is the whole seconds
//!   (truncated) since its last report, and its counts restart from 0 at
//!   each report (`getUsageFromBucket`).
//! - A report goes to the open stream; with none open, a timer tick opens
//!   a new one first (`onSendReportsTimer`), but a new bucket's immediate
//!   report is dropped, its counts lost (`sendUsageReportImpl`: only the
//!   first bucket creation ever tries to open the stream).
//! - Responses (`onQuotaResponseImpl`): an action without a bucket id, or
//!   with an empty one, or for a bucket not cached, is dropped; an abandon
//!   action erases the bucket (its next request creates it anew); a
//!   `requests_per_time_unit` or unset strategy is skipped (the bucket keeps
//!   its previous action and expiry); an action whose oneof is unset
//!   replaces the cached action with one that has no strategy (requests
//!   fail open, `filter.cc`, `shouldAllowRequest`) and expires at once.
//!   Every applied action restarts the bucket's expiry timer at its
//!   `assignment_time_to_live.seconds` (nanos ignored; unset is 0:
//!   expires at once) (`startActionExpirationTimer`).
//! - A token bucket assignment keeps the bucket's current token bucket when
//!   the current action is a token bucket equal by `max_tokens`,
//!   `tokens_per_fill` and `fill_interval.nanos` — the seconds of the fill
//!   interval are not compared (`protoTokenBucketsEq`,
//!   `shouldReplaceTokenBucket`); otherwise it makes a new one
//!   (`createTokenBucketFromAction`, see [`ModelTokenBucket::for_assignment`]:
//!   full, or *empty* when the old bucket's ratio of tokens left, times the
//!   new max, truncates to 0). The rate is tokens per fill over the fill
//!   interval in whole seconds: an interval under a second makes the rate
//!   infinite and the bucket always full.
//! - At expiry (`onActionExpirationTimer`): with an
//!   `expired_assignment_behavior` fallback, the fallback becomes the action
//!   (a token bucket fallback by the same keep-or-replace rule) for the
//!   fallback's timeout in whole seconds, then the `no_assignment_behavior`
//!   (`onFallbackExpirationTimer`); without one, straight to the
//!   `no_assignment_behavior`. The token bucket is dropped when the action
//!   is no longer a token bucket.
//! - A request against a token bucket takes one token if a whole one is
//!   there, else is denied; against a blanket rule as the rule says;
//!   `requests_per_time_unit` and a missing strategy allow
//!   (`filter.cc`, `shouldAllowRequest`).
//! - Cached buckets and their assignments survive a stream's end.
//!
//! Token buckets read the clock as floating-point seconds since the
//! monotonic clock's epoch (Envoy's steady clock; here the caller's 0), so
//! they may differ from a real Envoy's in the last bits of a fraction.
//!
//! Timers: every call that takes `now_ns` first fires the timers due at or
//! before `now_ns`, in deadline order (ties in the order they were armed),
//! each at its own deadline, as a simulated clock would; a timer re-armed
//! by its callback counts from its deadline.
//!
//! Not modelled: the filter's request matching (the caller gives the bucket
//! id), per-bucket settings (one [`Behaviours`] for all buckets), preview
//! (`keep_matching`) matches, deny response settings, a stream that fails to
//! open (opening always succeeds here), the asynchrony between workers and
//! the main thread (a bucket is cached as soon as its first request is
//! seen), and the order of buckets in a periodic report (Envoy's is a hash
//! map's; here it is the order of creation).
#![allow(dead_code, unreachable_pub)]

use slidegate_server::proto::quota::rate_limit_quota_response::BucketAction;
use slidegate_server::proto::quota::rate_limit_quota_response::bucket_action::{
    self, AbandonAction, QuotaAssignmentAction,
};
use slidegate_server::proto::quota::rate_limit_quota_usage_reports::BucketQuotaUsage;
use slidegate_server::proto::quota::{BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports};
use slidegate_server::proto::types::{self, RateLimitStrategy, rate_limit_strategy};
use std::collections::HashMap;
use std::time::Duration;

/// Nanoseconds in a second.
pub const NS: u64 = 1_000_000_000;

/// The report timer's period: hard-coded to 5 s in Envoy
/// (`filter_persistence.cc`, `initTlsStore`).
pub const REPORT_INTERVAL_NS: u64 = 5 * NS;

/// The smallest fill rate of Envoy's token buckets: one token a year
/// (`source/common/common/token_bucket_impl.cc`, `kMinFillRate`).
const MIN_FILL_RATE: f64 = 1.0 / (365.0 * 24.0 * 60.0 * 60.0);

/// A bucket id as the model keys it: its (key, value) pairs sorted by key.
pub type BucketKey = Vec<(String, String)>;

/// `RateLimitStrategy.BlanketRule`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blanket {
    AllowAll,
    DenyAll,
}

/// The parts of `envoy.type.v3.TokenBucket` Envoy reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenBucketSpec {
    pub max_tokens: u32,
    /// `tokens_per_fill.value`; 0 when unset, as C++'s accessor reads it.
    pub tokens_per_fill: u32,
    /// `fill_interval.seconds`; 0 when unset.
    pub fill_seconds: i64,
    /// `fill_interval.nanos`; 0 when unset.
    pub fill_nanos: i32,
}

impl TokenBucketSpec {
    /// A token bucket of `max_tokens`, refilled by `tokens_per_fill` every
    /// `fill_interval`.
    pub fn new(max_tokens: u32, tokens_per_fill: u32, fill_interval: Duration) -> TokenBucketSpec {
        TokenBucketSpec {
            max_tokens,
            tokens_per_fill,
            fill_seconds: i64::try_from(fill_interval.as_secs()).expect("fill interval in range"),
            fill_nanos: i32::try_from(fill_interval.subsec_nanos()).expect("nanos in range"),
        }
    }

    /// Envoy's test of "the same token bucket" (`global_client_impl.cc`,
    /// `protoTokenBucketsEq`): max tokens, tokens per fill, and the
    /// *nanos* of the fill interval — not its seconds.
    pub fn same_for_envoy(&self, other: &TokenBucketSpec) -> bool {
        self.max_tokens == other.max_tokens
            && self.tokens_per_fill == other.tokens_per_fill
            && self.fill_nanos == other.fill_nanos
    }

    /// Tokens a second (`createTokenBucketFromAction`): tokens per fill over
    /// the fill interval in whole seconds, truncated toward zero
    /// (`absl::ToInt64Seconds`), in floating point. An interval under a
    /// second divides by 0: an infinite rate (or NaN with 0 tokens per fill).
    pub fn fill_rate(&self) -> f64 {
        let total_ns = i128::from(self.fill_seconds) * i128::from(NS) + i128::from(self.fill_nanos);
        let whole_seconds = (total_ns / i128::from(NS)) as i64;
        f64::from(self.tokens_per_fill) / whole_seconds as f64
    }

    fn from_proto(tb: &types::TokenBucket) -> TokenBucketSpec {
        let interval = tb.fill_interval.unwrap_or_default();
        TokenBucketSpec {
            max_tokens: tb.max_tokens,
            tokens_per_fill: tb.tokens_per_fill.map_or(0, |v| v.value),
            fill_seconds: interval.seconds,
            fill_nanos: interval.nanos,
        }
    }

    fn to_proto(self) -> types::TokenBucket {
        types::TokenBucket {
            max_tokens: self.max_tokens,
            tokens_per_fill: Some(pbjson_types::UInt32Value {
                value: self.tokens_per_fill,
            }),
            fill_interval: Some(pbjson_types::Duration {
                seconds: self.fill_seconds,
                nanos: self.fill_nanos,
            }),
        }
    }
}

/// A `RateLimitStrategy` with its strategy set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Strategy {
    Blanket(Blanket),
    /// A `blanket_rule` number that is neither rule: the filter's switch
    /// falls through and allows.
    UnknownBlanket(i32),
    TokenBucket(TokenBucketSpec),
    /// Not enforced by Envoy: skipped in responses; allows as a fallback.
    RequestsPerTimeUnit,
}

impl Strategy {
    /// The strategy of a proto; `None` when its oneof is unset.
    pub fn from_proto(strategy: &RateLimitStrategy) -> Option<Strategy> {
        Some(match strategy.strategy.as_ref()? {
            rate_limit_strategy::Strategy::BlanketRule(rule) => {
                match rate_limit_strategy::BlanketRule::try_from(*rule) {
                    Ok(rate_limit_strategy::BlanketRule::AllowAll) => Strategy::Blanket(Blanket::AllowAll),
                    Ok(rate_limit_strategy::BlanketRule::DenyAll) => Strategy::Blanket(Blanket::DenyAll),
                    Err(_) => Strategy::UnknownBlanket(*rule),
                }
            }
            rate_limit_strategy::Strategy::RequestsPerTimeUnit(_) => Strategy::RequestsPerTimeUnit,
            rate_limit_strategy::Strategy::TokenBucket(tb) => Strategy::TokenBucket(TokenBucketSpec::from_proto(tb)),
        })
    }

    /// The proto of the strategy (`RequestsPerTimeUnit` as 1 a second).
    pub fn to_proto(&self) -> RateLimitStrategy {
        let strategy = match self {
            Strategy::Blanket(Blanket::AllowAll) => {
                rate_limit_strategy::Strategy::BlanketRule(rate_limit_strategy::BlanketRule::AllowAll as i32)
            }
            Strategy::Blanket(Blanket::DenyAll) => {
                rate_limit_strategy::Strategy::BlanketRule(rate_limit_strategy::BlanketRule::DenyAll as i32)
            }
            Strategy::UnknownBlanket(n) => rate_limit_strategy::Strategy::BlanketRule(*n),
            Strategy::TokenBucket(spec) => rate_limit_strategy::Strategy::TokenBucket(spec.to_proto()),
            Strategy::RequestsPerTimeUnit => {
                rate_limit_strategy::Strategy::RequestsPerTimeUnit(rate_limit_strategy::RequestsPerTimeUnit {
                    requests_per_time_unit: 1,
                    time_unit: types::RateLimitUnit::Second as i32,
                })
            }
        };
        RateLimitStrategy {
            strategy: Some(strategy),
        }
    }
}

/// The filter's per-bucket settings the model applies to every bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Behaviours {
    /// `no_assignment_behavior.fallback_rate_limit` (Envoy's default when
    /// unset: `ALLOW_ALL`).
    pub no_assignment: Blanket,
    /// `expired_assignment_behavior`: its `fallback_rate_limit` and its
    /// `expired_assignment_behavior_timeout`, of which Envoy reads the whole
    /// seconds only (`filter.cc`, `recordBucketUsage`).
    pub expired: Option<(Strategy, Duration)>,
}

/// Requests allowed and denied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub allowed: u64,
    pub denied: u64,
}

/// What decides a cached bucket's requests now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CurrentAction {
    /// No action cached: the `no_assignment_behavior`.
    NoAssignment(Blanket),
    /// The server's assignment; `None` for an action whose oneof was unset.
    Assigned(Option<Strategy>),
    /// The `expired_assignment_behavior` fallback.
    Fallback(Strategy),
}

/// A message the model sends: which stream (0 for the first one opened; a
/// number not seen before means a new stream was opened for it) and the
/// reports.
#[derive(Debug, Clone, PartialEq)]
pub struct Outgoing {
    pub stream: usize,
    pub reports: RateLimitQuotaUsageReports,
}

/// `std::min` of C++ (`b < a ? b : a`): with a NaN `b` it answers `a`.
fn cpp_min(a: f64, b: f64) -> f64 {
    if b < a { b } else { a }
}

/// `std::max` of C++ (`a < b ? b : a`): with a NaN `a` it answers `a`.
fn cpp_max(a: f64, b: f64) -> f64 {
    if a < b { b } else { a }
}

/// A monotonic time in seconds as Envoy's token bucket reads it
/// (`std::chrono::duration<double>` of the nanoseconds).
fn seconds(now_ns: u64) -> f64 {
    now_ns as f64 / 1e9
}

/// Envoy's `AtomicTokenBucketImpl` (`source/common/common/token_bucket_impl.h`
/// and `.cc`, after folly's `TokenBucket`; constructed as `(uint64_t
/// max_tokens, TimeSource&, double fill_rate, bool init_fill)`): the bucket
/// is one stored time `t` (seconds); the tokens at `now` are
/// `min(max, (now - t) * rate)` (C++'s `std::min`, NaN-sensitive as such),
/// and taking tokens moves `t` forward by their worth in time.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelTokenBucket {
    max_tokens: f64,
    fill_rate: f64,
    time: f64,
}

impl ModelTokenBucket {
    /// The constructor: the rate is at least one token a year (its absolute
    /// value); a bucket made with `init_fill` starts full (`t = now -
    /// max / rate`), else empty (`t = now`).
    pub fn new(max_tokens: u64, fill_rate: f64, init_fill: bool, now_ns: u64) -> ModelTokenBucket {
        let fill_rate = cpp_max(fill_rate.abs(), MIN_FILL_RATE);
        let max_tokens = max_tokens as f64;
        let mut time = seconds(now_ns);
        if init_fill {
            time -= max_tokens / fill_rate;
        }
        ModelTokenBucket {
            max_tokens,
            fill_rate,
            time,
        }
    }

    /// The bucket `createTokenBucketFromAction` (`global_client_impl.cc`)
    /// makes for a token bucket assignment replacing `existing` (the cached
    /// bucket's current token bucket, if it has one).
    ///
    /// Envoy computes an integer `initial_tokens`: `max_tokens` with no
    /// existing bucket, else `max_tokens * (remaining / max)` of the
    /// existing one (floating point, truncated to an integer). It passes it
    /// as the constructor's fourth argument, which is `bool init_fill`: the
    /// new bucket starts *full* when that integer is not 0 and *empty* when
    /// it is 0 (e.g. 1 token left of 8 and a new max of 4: 4 * 0.125 = 0.5,
    /// truncated 0: empty; 2 left of 8: 1: full with 4).
    pub fn for_assignment(
        spec: &TokenBucketSpec,
        existing: Option<&ModelTokenBucket>,
        now_ns: u64,
    ) -> ModelTokenBucket {
        let max_tokens = u64::from(spec.max_tokens);
        let initial_tokens = match existing {
            Some(old) => (max_tokens as f64 * (old.remaining(now_ns) / old.max_tokens)) as u64,
            None => max_tokens,
        };
        ModelTokenBucket::new(max_tokens, spec.fill_rate(), initial_tokens != 0, now_ns)
    }

    /// `remainingTokens()`: the tokens at `now_ns`, fractional.
    pub fn remaining(&self, now_ns: u64) -> f64 {
        cpp_min(self.max_tokens, (seconds(now_ns) - self.time) * self.fill_rate)
    }

    /// `consume(1, false)`: takes one token if at least one whole token is
    /// there (the time moves to `now - (tokens - 1) / rate`), else takes
    /// nothing.
    pub fn consume_one(&mut self, now_ns: u64) -> bool {
        let tokens = self.remaining(now_ns);
        // Under one token (or NaN): the callback answers 0, nothing moves.
        if tokens >= 1.0 {
            self.time = seconds(now_ns) - (tokens - 1.0) / self.fill_rate;
            true
        } else {
            false
        }
    }

    /// The tokens a second (after the constructor's minimum).
    pub fn fill_rate(&self) -> f64 {
        self.fill_rate
    }

    /// The capacity.
    pub fn max_tokens(&self) -> f64 {
        self.max_tokens
    }
}

/// Where a cached action came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    Server,
    Fallback,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Cached {
    origin: Origin,
    /// `None`: an action with neither an assignment nor an abandon.
    strategy: Option<Strategy>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TimerKind {
    /// `action_expiration_timer`: the assignment's TTL.
    Assignment,
    /// `fallback_expiration_timer`: the fallback's timeout.
    Fallback,
    /// `send_reports_timer_`: every 5 s.
    Report,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Timer {
    deadline: u64,
    /// Arming order, for ties.
    seq: u64,
    kind: TimerKind,
}

/// One entry of the global client's bucket cache (`CachedBucket`, with its
/// `QuotaUsage`).
#[derive(Debug, Clone)]
struct CachedBucket {
    key: BucketKey,
    /// Since the last report.
    usage: Counts,
    last_report_ns: u64,
    /// `None`: the `no_assignment_behavior` (`default_action`) applies.
    action: Option<Cached>,
    /// Present exactly when the action is a token bucket.
    limiter: Option<ModelTokenBucket>,
    timer: Option<Timer>,
}

impl CachedBucket {
    /// `getUsageFromBucket`: the counts since the last report (then reset)
    /// and the whole seconds since it (then now).
    fn take_usage(&mut self, now_ns: u64) -> BucketQuotaUsage {
        let usage = std::mem::take(&mut self.usage);
        let elapsed = (now_ns - self.last_report_ns) / NS;
        self.last_report_ns = now_ns;
        BucketQuotaUsage {
            bucket_id: Some(bucket_id(&self.key)),
            time_elapsed: Some(pbjson_types::Duration {
                seconds: i64::try_from(elapsed).expect("elapsed in range"),
                nanos: 0,
            }),
            num_requests_allowed: usage.allowed,
            num_requests_denied: usage.denied,
        }
    }

    /// The token bucket for a token bucket action about to replace this
    /// bucket's action (`shouldReplaceTokenBucket`): the current one, kept,
    /// when the current action is a token bucket Envoy deems the same; else
    /// a new one.
    fn next_limiter(&self, spec: &TokenBucketSpec, now_ns: u64) -> ModelTokenBucket {
        if let (
            Some(Cached {
                strategy: Some(Strategy::TokenBucket(current)),
                ..
            }),
            Some(limiter),
        ) = (&self.action, &self.limiter)
            && current.same_for_envoy(spec)
        {
            return limiter.clone();
        }
        ModelTokenBucket::for_assignment(spec, self.limiter.as_ref(), now_ns)
    }
}

/// A bucket id's key, from the pairs the filter's bucket id builder made.
/// Panics on an empty id or a repeated key (not a `BucketId` map).
pub fn bucket_key(bucket: &[(&str, &str)]) -> BucketKey {
    assert!(!bucket.is_empty(), "a bucket id has at least one entry");
    let mut key: BucketKey = bucket.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    key.sort();
    assert!(
        key.windows(2).all(|w| w[0].0 != w[1].0),
        "a key repeated in bucket id {bucket:?}"
    );
    key
}

fn key_of_proto(id: &BucketId) -> BucketKey {
    let mut key: BucketKey = id.bucket.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    key.sort();
    key
}

/// The `BucketId` of a key.
pub fn bucket_id(key: &BucketKey) -> BucketId {
    BucketId {
        bucket: key.iter().cloned().collect(),
    }
}

/// A quota assignment for `bucket`: `strategy` (`None`: unset), for `ttl`
/// (`None`: unset).
pub fn assignment(bucket: &[(&str, &str)], strategy: Option<&Strategy>, ttl: Option<Duration>) -> BucketAction {
    BucketAction {
        bucket_id: Some(bucket_id(&bucket_key(bucket))),
        bucket_action: Some(bucket_action::BucketAction::QuotaAssignmentAction(
            QuotaAssignmentAction {
                assignment_time_to_live: ttl.map(|d| pbjson_types::Duration {
                    seconds: i64::try_from(d.as_secs()).expect("ttl in range"),
                    nanos: i32::try_from(d.subsec_nanos()).expect("nanos in range"),
                }),
                rate_limit_strategy: strategy.map(Strategy::to_proto),
            },
        )),
    }
}

/// An abandon action for `bucket`.
pub fn abandon(bucket: &[(&str, &str)]) -> BucketAction {
    BucketAction {
        bucket_id: Some(bucket_id(&bucket_key(bucket))),
        bucket_action: Some(bucket_action::BucketAction::AbandonAction(AbandonAction {})),
    }
}

/// A response of `actions`.
pub fn response(actions: Vec<BucketAction>) -> RateLimitQuotaResponse {
    RateLimitQuotaResponse { bucket_action: actions }
}

/// A usage report's entry as (bucket key, whole seconds elapsed, allowed,
/// denied), for comparisons.
pub fn usage_row(usage: &BucketQuotaUsage) -> (BucketKey, i64, u64, u64) {
    let elapsed = usage.time_elapsed.expect("time_elapsed is always set");
    assert_eq!(elapsed.nanos, 0, "Envoy reports whole seconds");
    (
        key_of_proto(usage.bucket_id.as_ref().expect("bucket_id is always set")),
        elapsed.seconds,
        usage.num_requests_allowed,
        usage.num_requests_denied,
    )
}

/// One Envoy's RLQS client for one domain: see the module's documentation.
#[derive(Debug, Clone)]
pub struct EnvoyQuotaClient {
    domain: String,
    behaviours: Behaviours,
    /// The bucket cache, in order of creation.
    buckets: Vec<CachedBucket>,
    /// Every bucket's requests ever, across abandons.
    totals: HashMap<BucketKey, Counts>,
    /// `stream_tried_by_bucket_creation_`.
    started: bool,
    report_timer: Option<Timer>,
    next_seq: u64,
    /// The open stream's number.
    stream: Option<usize>,
    streams_opened: usize,
    outbox: Vec<Outgoing>,
    dropped_reports: u64,
    ignored_actions: u64,
    now_ns: u64,
}

impl EnvoyQuotaClient {
    /// A client for `domain` before any request: no stream, no timer.
    pub fn new(domain: &str, behaviours: Behaviours) -> EnvoyQuotaClient {
        EnvoyQuotaClient {
            domain: domain.to_string(),
            behaviours,
            buckets: Vec::new(),
            totals: HashMap::new(),
            started: false,
            report_timer: None,
            next_seq: 0,
            stream: None,
            streams_opened: 0,
            outbox: Vec::new(),
            dropped_reports: 0,
            ignored_actions: 0,
            now_ns: 0,
        }
    }

    /// A request matched into `bucket` at `now_ns` (after the timers due):
    /// allowed or not. A bucket not cached is created, which queues its
    /// immediate report.
    pub fn request(&mut self, bucket: &[(&str, &str)], now_ns: u64) -> bool {
        self.tick(now_ns);
        let key = bucket_key(bucket);
        let allowed = match self.index(&key) {
            Some(i) => {
                let allowed = self.decide(i);
                let usage = &mut self.buckets[i].usage;
                if allowed {
                    usage.allowed += 1;
                } else {
                    usage.denied += 1;
                }
                allowed
            }
            None => {
                // filter.cc, recordBucketUsage / noAssignmentBehaviorShouldAllow.
                let allowed = self.behaviours.no_assignment != Blanket::DenyAll;
                self.create_bucket(key.clone(), allowed);
                allowed
            }
        };
        let total = self.totals.entry(key).or_default();
        if allowed {
            total.allowed += 1;
        } else {
            total.denied += 1;
        }
        allowed
    }

    /// Fires the timers due at or before `now_ns`, in order, each at its
    /// deadline: the report timer and the buckets' expiries.
    pub fn tick(&mut self, now_ns: u64) {
        assert!(now_ns >= self.now_ns, "the clock went back: {now_ns} < {}", self.now_ns);
        while let Some((timer, bucket)) = self.next_due(now_ns) {
            self.now_ns = timer.deadline;
            match (timer.kind, bucket) {
                (TimerKind::Report, _) => self.on_report_timer(),
                (TimerKind::Assignment, Some(i)) => self.on_assignment_expired(i),
                (TimerKind::Fallback, Some(i)) => self.on_fallback_expired(i),
                (_, None) => unreachable!("a bucket's timer without its bucket"),
            }
        }
        self.now_ns = now_ns;
    }

    /// The messages queued since the last call, in order.
    pub fn outbox(&mut self) -> Vec<Outgoing> {
        std::mem::take(&mut self.outbox)
    }

    /// A response from the server at `now_ns` (after the timers due)
    /// (`onQuotaResponseImpl`).
    pub fn receive(&mut self, response: &RateLimitQuotaResponse, now_ns: u64) {
        self.tick(now_ns);
        for action in &response.bucket_action {
            let Some(id) = action.bucket_id.as_ref().filter(|id| !id.bucket.is_empty()) else {
                self.ignored_actions += 1;
                continue;
            };
            let Some(i) = self.index(&key_of_proto(id)) else {
                self.ignored_actions += 1;
                continue;
            };
            match &action.bucket_action {
                Some(bucket_action::BucketAction::AbandonAction(_)) => {
                    self.buckets.remove(i);
                }
                Some(bucket_action::BucketAction::QuotaAssignmentAction(assigned)) => {
                    let strategy = assigned.rate_limit_strategy.as_ref().and_then(Strategy::from_proto);
                    let limiter = match &strategy {
                        Some(Strategy::Blanket(_) | Strategy::UnknownBlanket(_)) => None,
                        Some(Strategy::TokenBucket(spec)) => Some(self.buckets[i].next_limiter(spec, self.now_ns)),
                        Some(Strategy::RequestsPerTimeUnit) | None => {
                            self.ignored_actions += 1;
                            continue;
                        }
                    };
                    let ttl_seconds = assigned.assignment_time_to_live.map_or(0, |ttl| ttl.seconds);
                    self.apply(i, strategy, limiter, ttl_seconds);
                }
                // Neither: cached as an action without a strategy; its TTL
                // reads as 0.
                None => self.apply(i, None, None, 0),
            }
        }
    }

    /// The stream ended (closed by the server, or an error): the next
    /// report tick opens a new one (`onRemoteClose`).
    pub fn stream_closed(&mut self) {
        self.stream = None;
    }

    /// The domain every report carries.
    pub fn domain(&self) -> &str {
        &self.domain
    }

    /// The clock's last value.
    pub fn now_ns(&self) -> u64 {
        self.now_ns
    }

    /// The open stream's number, if one is open.
    pub fn stream(&self) -> Option<usize> {
        self.stream
    }

    /// How many streams were opened.
    pub fn streams_opened(&self) -> usize {
        self.streams_opened
    }

    /// The next timer's deadline: the time worth a [`tick`](Self::tick).
    pub fn next_deadline(&self) -> Option<u64> {
        self.timers().map(|(t, _)| t.deadline).min()
    }

    /// The cached buckets, in order of creation.
    pub fn buckets(&self) -> Vec<BucketKey> {
        self.buckets.iter().map(|b| b.key.clone()).collect()
    }

    /// What decides `bucket`'s requests now; `None` when it is not cached.
    /// (Call [`tick`](Self::tick) first for the expiries due.)
    pub fn action(&self, bucket: &[(&str, &str)]) -> Option<CurrentAction> {
        let b = &self.buckets[self.index(&bucket_key(bucket))?];
        Some(match &b.action {
            None => CurrentAction::NoAssignment(self.behaviours.no_assignment),
            Some(Cached {
                origin: Origin::Server,
                strategy,
            }) => CurrentAction::Assigned(strategy.clone()),
            Some(Cached {
                origin: Origin::Fallback,
                strategy,
            }) => CurrentAction::Fallback(strategy.clone().expect("a fallback has a strategy")),
        })
    }

    /// `bucket`'s token bucket, if its action is one.
    pub fn token_bucket(&self, bucket: &[(&str, &str)]) -> Option<&ModelTokenBucket> {
        self.buckets[self.index(&bucket_key(bucket))?].limiter.as_ref()
    }

    /// The tokens of `bucket`'s token bucket at `now_ns` (fractional), if
    /// its action is a token bucket.
    pub fn remaining_tokens(&self, bucket: &[(&str, &str)], now_ns: u64) -> Option<f64> {
        assert!(now_ns >= self.now_ns, "the clock went back");
        Some(self.token_bucket(bucket)?.remaining(now_ns))
    }

    /// `bucket`'s requests since its last report; `None` when not cached.
    pub fn unreported(&self, bucket: &[(&str, &str)]) -> Option<Counts> {
        Some(self.buckets[self.index(&bucket_key(bucket))?].usage)
    }

    /// Every request ever matched into `bucket`, across abandons.
    pub fn totals(&self, bucket: &[(&str, &str)]) -> Counts {
        self.totals.get(&bucket_key(bucket)).copied().unwrap_or_default()
    }

    /// Reports built while no stream was open, and so lost.
    pub fn dropped_reports(&self) -> u64 {
        self.dropped_reports
    }

    /// Actions dropped or skipped: no bucket id, a bucket not cached, a
    /// `requests_per_time_unit` or unset strategy.
    pub fn ignored_actions(&self) -> u64 {
        self.ignored_actions
    }

    fn index(&self, key: &BucketKey) -> Option<usize> {
        self.buckets.iter().position(|b| &b.key == key)
    }

    fn arm(&mut self, deadline: u64, kind: TimerKind) -> Timer {
        self.next_seq += 1;
        Timer {
            deadline,
            seq: self.next_seq,
            kind,
        }
    }

    /// Every armed timer, with its bucket (`None`: the report timer).
    fn timers(&self) -> impl Iterator<Item = (Timer, Option<usize>)> + '_ {
        let buckets = self
            .buckets
            .iter()
            .enumerate()
            .filter_map(|(i, b)| Some((b.timer?, Some(i))));
        self.report_timer.map(|t| (t, None)).into_iter().chain(buckets)
    }

    fn next_due(&self, now_ns: u64) -> Option<(Timer, Option<usize>)> {
        self.timers()
            .filter(|(t, _)| t.deadline <= now_ns)
            .min_by_key(|(t, _)| (t.deadline, t.seq))
    }

    fn open_stream(&mut self) {
        self.stream = Some(self.streams_opened);
        self.streams_opened += 1;
    }

    /// `sendUsageReportImpl`: onto the open stream, or lost.
    fn send(&mut self, usages: Vec<BucketQuotaUsage>) {
        let reports = RateLimitQuotaUsageReports {
            domain: self.domain.clone(),
            bucket_quota_usages: usages,
        };
        match self.stream {
            Some(stream) => self.outbox.push(Outgoing { stream, reports }),
            None => self.dropped_reports += 1,
        }
    }

    /// `createBucketImpl`.
    fn create_bucket(&mut self, key: BucketKey, allowed: bool) {
        let now = self.now_ns;
        if !self.started {
            self.started = true;
            self.report_timer = Some(self.arm(now + REPORT_INTERVAL_NS, TimerKind::Report));
            self.open_stream();
        }
        let mut bucket = CachedBucket {
            key,
            usage: Counts {
                allowed: u64::from(allowed),
                denied: u64::from(!allowed),
            },
            last_report_ns: now,
            action: None,
            limiter: None,
            timer: None,
        };
        let usage = bucket.take_usage(now);
        self.buckets.push(bucket);
        self.send(vec![usage]);
    }

    /// `onSendReportsTimer`, then the timer re-armed.
    fn on_report_timer(&mut self) {
        let now = self.now_ns;
        let usages = self.buckets.iter_mut().map(|b| b.take_usage(now)).collect();
        if self.stream.is_none() {
            self.open_stream();
        }
        self.send(usages);
        self.report_timer = Some(self.arm(now + REPORT_INTERVAL_NS, TimerKind::Report));
    }

    /// A server action replacing bucket `i`'s, with its expiry.
    fn apply(&mut self, i: usize, strategy: Option<Strategy>, limiter: Option<ModelTokenBucket>, ttl_seconds: i64) {
        let ttl_ns = u64::try_from(ttl_seconds.max(0)).expect("non-negative") * NS;
        let timer = self.arm(self.now_ns + ttl_ns, TimerKind::Assignment);
        let bucket = &mut self.buckets[i];
        bucket.action = Some(Cached {
            origin: Origin::Server,
            strategy,
        });
        bucket.limiter = limiter;
        bucket.timer = Some(timer);
    }

    /// `onActionExpirationTimer`.
    fn on_assignment_expired(&mut self, i: usize) {
        let now = self.now_ns;
        let Some((fallback, timeout)) = self.behaviours.expired.clone() else {
            let bucket = &mut self.buckets[i];
            bucket.action = None;
            bucket.limiter = None;
            bucket.timer = None;
            return;
        };
        let timer = self.arm(now + timeout.as_secs() * NS, TimerKind::Fallback);
        let bucket = &mut self.buckets[i];
        bucket.limiter = match &fallback {
            Strategy::TokenBucket(spec) => Some(bucket.next_limiter(spec, now)),
            _ => None,
        };
        bucket.action = Some(Cached {
            origin: Origin::Fallback,
            strategy: Some(fallback),
        });
        bucket.timer = Some(timer);
    }

    /// `onFallbackExpirationTimer`.
    fn on_fallback_expired(&mut self, i: usize) {
        let bucket = &mut self.buckets[i];
        bucket.action = None;
        bucket.limiter = None;
        bucket.timer = None;
    }

    /// `filter.cc`, `shouldAllowRequest`, for bucket `i`.
    fn decide(&mut self, i: usize) -> bool {
        let now = self.now_ns;
        let no_assignment = self.behaviours.no_assignment;
        let bucket = &mut self.buckets[i];
        let strategy = match &bucket.action {
            None => Some(Strategy::Blanket(no_assignment)),
            Some(cached) => cached.strategy.clone(),
        };
        match strategy {
            Some(Strategy::Blanket(Blanket::DenyAll)) => false,
            Some(Strategy::TokenBucket(_)) => bucket
                .limiter
                .as_mut()
                .expect("a token bucket action has its token bucket")
                .consume_one(now),
            Some(
                Strategy::Blanket(Blanket::AllowAll) | Strategy::UnknownBlanket(_) | Strategy::RequestsPerTimeUnit,
            )
            | None => true,
        }
    }
}
