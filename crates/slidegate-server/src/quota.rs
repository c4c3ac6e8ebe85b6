//! The Rate Limit Quota Service's engine: Envoy's `rate_limit_quota`
//! filter reports each quota bucket's use on a stream, and gets back for
//! each a token bucket, a blanket rule or an abandon ([`Quotas::report`]).
//! [`share`] decides how one bucket's limit is split between the streams
//! that report it; [`ledgers`] keeps those decisions, in memory or in Redis
//! for replicas that share their Envoys.
//!
//! What a stream may send is bounded: a bucket id of at most
//! [`MAX_BUCKET_ENTRIES`] entries and [`MAX_BUCKET_BYTES`] bytes, at most
//! [`QuotaOptions::max_stream_buckets`] buckets a stream. A bucket past a
//! bound gets no action (Envoy keeps its `no_assignment_behavior`) and is
//! counted, never an error that would end the stream: only a report
//! without a domain, or naming another domain than the stream's first, is.

pub mod ledgers;
pub mod share;

use crate::log_limit::LogLimit;
use crate::metrics::{Metrics, QuotaAction, QuotaRefusal};
use crate::proto::quota::rate_limit_quota_response::BucketAction;
use crate::proto::quota::rate_limit_quota_response::bucket_action::{
    AbandonAction, BucketAction as Action, QuotaAssignmentAction,
};
use crate::proto::quota::{BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports};
use crate::proto::types::rate_limit_strategy::{BlanketRule, Strategy};
use crate::proto::types::{RateLimitStrategy, TokenBucket};
use ledgers::{LedgerError, LedgerOp, Ledgers};
use share::{Grant, Pools, StreamId, Timing};
use slidegate_core::Clock;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// The most entries a bucket id may have.
pub const MAX_BUCKET_ENTRIES: usize = 32;
/// The most bytes a bucket id's keys and values may have together.
pub const MAX_BUCKET_BYTES: usize = 1024;

/// What a quota rule does with the buckets it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaPolicy {
    /// `unlimited`: `ALLOW_ALL`.
    AllowAll,
    /// A limit of 0: `DENY_ALL`.
    DenyAll,
    /// `limit` requests in any window of `window_ns`, shared.
    Limited {
        /// The requests a window.
        limit: u64,
        /// The window, in ns.
        window_ns: u64,
    },
}

/// The rule a bucket id matched: its name (for metrics and logs) and
/// policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaMatch<'a> {
    /// The rule's name.
    pub rule: &'a str,
    /// What it does.
    pub policy: QuotaPolicy,
}

/// Where bucket ids find their rules: the config ([`crate::config::Config`]
/// implements it), or a test's own.
pub trait QuotaRules {
    /// The rule of `domain` that the bucket id `bucket` (its entries,
    /// sorted by key) matches.
    fn quota_rule(&self, domain: &str, bucket: &[(&str, &str)]) -> Option<QuotaMatch<'_>>;
}

/// How the engine answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaOptions {
    /// The TTL of assignments and how long grants are held.
    pub timing: Timing,
    /// The most buckets one stream may report (more are not answered).
    pub max_stream_buckets: usize,
    /// A bucket reported without a request for this long is abandoned.
    pub idle_bucket: Duration,
    /// A stream that sends nothing for this long is closed.
    pub idle_stream: Duration,
    /// The most buckets the open streams track together, and whose
    /// ledgers are kept in memory (without Redis): a bucket past it gets no
    /// answer (tracked) or `DENY_ALL` (a ledger) until room is made.
    pub max_buckets: usize,
}

impl Default for QuotaOptions {
    fn default() -> Self {
        QuotaOptions {
            timing: Timing::DEFAULT,
            max_stream_buckets: 10_000,
            idle_bucket: Duration::from_secs(300),
            idle_stream: Duration::from_secs(30),
            max_buckets: 100_000,
        }
    }
}

/// Why a stream is ended.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QuotaError {
    /// The first report names no domain.
    #[error("the first usage report names no domain: set the rate_limit_quota filter's `domain`")]
    NoDomain,
    /// A report names another domain than the stream's first.
    #[error("a usage report names domain `{then}`, but this stream's first named `{first}`: one domain a stream")]
    OtherDomain {
        /// The stream's domain.
        first: String,
        /// The other.
        then: String,
    },
}

/// The engine: ledgers, a clock, options, and this replica's id.
pub struct Quotas {
    ledgers: Box<dyn Ledgers>,
    clock: Arc<dyn Clock + Send + Sync>,
    options: QuotaOptions,
    replica: u64,
    streams: AtomicU64,
    /// The buckets every open stream tracks, together (at most
    /// [`QuotaOptions::max_buckets`]).
    tracked: AtomicUsize,
    /// One log line per interval when the ledgers fail.
    ledger_log: LogLimit,
}

/// One stream's state: its domain, and the buckets it reported.
#[derive(Debug)]
pub struct QuotaStream {
    id: StreamId,
    /// Opened with its Envoy's id ([`Quotas::open_as`]): its holds are the
    /// Envoy's, for its next stream to go on with.
    identified: bool,
    domain: Option<String>,
    buckets: HashMap<String, Tracked>,
}

impl QuotaStream {
    /// Its domain, once its first report named it.
    pub fn domain(&self) -> Option<&str> {
        self.domain.as_deref()
    }

    /// How many buckets it has reported and still has.
    pub fn buckets(&self) -> usize {
        self.buckets.len()
    }
}

/// One bucket of one stream.
#[derive(Debug, Clone, Copy)]
struct Tracked {
    /// The last report with a request (or the first).
    last_used: u64,
    /// Its ledger holds a grant of this stream.
    in_ledger: bool,
}

impl Quotas {
    /// An engine keeping its ledgers in `ledgers`, on `clock` (with Redis
    /// ledgers, the time since the UNIX epoch, which replicas share).
    pub fn new(ledgers: Box<dyn Ledgers>, clock: Arc<dyn Clock + Send + Sync>, options: QuotaOptions) -> Quotas {
        Quotas {
            ledgers,
            clock,
            options,
            replica: rand::random(),
            streams: AtomicU64::new(0),
            tracked: AtomicUsize::new(0),
            ledger_log: LogLimit::new(Duration::from_secs(10)),
        }
    }

    /// Its options.
    pub fn options(&self) -> &QuotaOptions {
        &self.options
    }

    /// Counts one more bucket tracked by a stream, unless that would pass
    /// [`QuotaOptions::max_buckets`].
    fn track(&self) -> bool {
        let before = self.tracked.fetch_add(1, Ordering::Relaxed);
        if before >= self.options.max_buckets {
            self.tracked.fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Counts `n` buckets no longer tracked.
    fn untrack(&self, n: usize, metrics: &Metrics) {
        self.tracked.fetch_sub(n, Ordering::Relaxed);
        metrics.quota_buckets(-i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// A new stream, of an Envoy slidegate cannot tell from any other:
    /// what its earlier streams hold counts against it until it expires.
    pub fn open(&self) -> QuotaStream {
        QuotaStream {
            id: StreamId {
                replica: self.replica,
                stream: self.streams.fetch_add(1, Ordering::Relaxed),
            },
            identified: false,
            domain: None,
            buckets: HashMap::new(),
        }
    }

    /// A new stream of the Envoy whose id is `envoy` (sent by the Envoy as
    /// `x-slidegate-envoy-id`, unique to it): every stream of one id, on
    /// any replica, is one holder of the ledgers, so a stream that replaces
    /// a broken one goes on with what the Envoy was given. Two Envoys that
    /// share an id share one share, each admitting all of it: ids must be
    /// unique.
    pub fn open_as(&self, envoy: &str) -> QuotaStream {
        QuotaStream {
            id: StreamId {
                replica: fnv1a(envoy, 0xcbf2_9ce4_8422_2325),
                stream: fnv1a(envoy, 0x6c62_272e_07bb_0142),
            },
            identified: true,
            domain: None,
            buckets: HashMap::new(),
        }
    }

    /// Answers one usage report of `stream`: an action for each bucket
    /// that gets one (see the module docs), counted in `metrics`.
    ///
    /// # Errors
    ///
    /// [`QuotaError`]: no domain, or another domain; the stream should
    /// end. When the ledgers fail (Redis), the buckets that needed them get
    /// no action (Envoy keeps its assignments until their TTL) and the
    /// stream goes on.
    pub async fn report(
        &self,
        stream: &mut QuotaStream,
        rules: &impl QuotaRules,
        reports: RateLimitQuotaUsageReports,
        metrics: &Metrics,
    ) -> Result<RateLimitQuotaResponse, QuotaError> {
        let now = self.clock.now();
        let domain = match (&stream.domain, reports.domain.as_str()) {
            (None, "") => return Err(QuotaError::NoDomain),
            (None, named) => stream.domain.insert(named.to_owned()).clone(),
            (Some(first), then) if !then.is_empty() && then != first => {
                return Err(QuotaError::OtherDomain {
                    first: first.clone(),
                    then: then.to_owned(),
                });
            }
            (Some(first), _) => first.clone(),
        };
        let timing = self.options.timing;
        let ttl = pbjson_types::Duration {
            seconds: i64::try_from(timing.ttl_ns / 1_000_000_000).unwrap_or(i64::MAX),
            nanos: 0,
        };
        let mut actions: Vec<BucketAction> = Vec::new();
        // Actions waiting for their ledger's grant: the op's index, the
        // bucket id and the window.
        let mut ops: Vec<LedgerOp> = Vec::new();
        let mut granted: Vec<(Option<BucketId>, u64)> = Vec::new();
        for usage in reports.bucket_quota_usages {
            let Some(id) = usage.bucket_id else {
                metrics.quota_refused(QuotaRefusal::BucketId);
                continue;
            };
            let mut pairs: Vec<(&str, &str)> = id.bucket.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let bytes: usize = pairs.iter().map(|(k, v)| k.len() + v.len()).sum();
            if pairs.is_empty() || pairs.len() > MAX_BUCKET_ENTRIES || bytes > MAX_BUCKET_BYTES {
                metrics.quota_refused(QuotaRefusal::BucketId);
                continue;
            }
            pairs.sort_unstable();
            let key = ledger_key(&domain, &pairs);
            let allowed = usage.num_requests_allowed;
            let denied = usage.num_requests_denied;
            let elapsed = usage.time_elapsed.map_or(0, |d| u64::try_from(d.seconds).unwrap_or(0));
            let Some(rule) = rules.quota_rule(&domain, &pairs) else {
                // No longer configured: abandoned once, then left to
                // Envoy's no_assignment_behavior.
                if let Some(tracked) = stream.buckets.remove(&key) {
                    self.untrack(1, metrics);
                    if tracked.in_ledger {
                        ops.push(LedgerOp::Leave { key });
                        granted.push((None, 0));
                    }
                    metrics.quota_action(QuotaAction::Abandon);
                    actions.push(abandon(id));
                }
                metrics.quota_refused(QuotaRefusal::Unconfigured);
                continue;
            };
            let known = stream.buckets.contains_key(&key);
            if !known && stream.buckets.len() >= self.options.max_stream_buckets {
                metrics.quota_refused(QuotaRefusal::StreamBuckets);
                continue;
            }
            if !known && !self.track() {
                metrics.quota_refused(QuotaRefusal::ServerBuckets);
                continue;
            }
            metrics.quota_usage(&domain, rule.rule, allowed, denied);
            if !known {
                metrics.quota_buckets(1);
            }
            let tracked = stream.buckets.entry(key.clone()).or_insert(Tracked {
                last_used: now,
                in_ledger: false,
            });
            if allowed > 0 || denied > 0 {
                tracked.last_used = now;
            } else if now.saturating_sub(tracked.last_used) >= duration_ns(self.options.idle_bucket) {
                let in_ledger = tracked.in_ledger;
                stream.buckets.remove(&key);
                self.untrack(1, metrics);
                if in_ledger {
                    ops.push(LedgerOp::Leave { key });
                    granted.push((None, 0));
                }
                metrics.quota_action(QuotaAction::Abandon);
                actions.push(abandon(id));
                continue;
            }
            match rule.policy {
                QuotaPolicy::AllowAll | QuotaPolicy::DenyAll => {
                    if tracked.in_ledger {
                        tracked.in_ledger = false;
                        ops.push(LedgerOp::Leave { key });
                        granted.push((None, 0));
                    }
                    let (rule, kind) = if rule.policy == QuotaPolicy::AllowAll {
                        (BlanketRule::AllowAll, QuotaAction::AllowAll)
                    } else {
                        (BlanketRule::DenyAll, QuotaAction::DenyAll)
                    };
                    metrics.quota_action(kind);
                    actions.push(assign(id, ttl, Strategy::BlanketRule(rule as i32)));
                }
                QuotaPolicy::Limited { limit, window_ns } => {
                    tracked.in_ledger = true;
                    let want = share::want(allowed, denied, elapsed, window_ns);
                    ops.push(LedgerOp::Grant {
                        key,
                        want,
                        pools: Pools::new(limit, window_ns),
                    });
                    granted.push((Some(id), window_ns));
                }
            }
        }
        let grants = if ops.is_empty() {
            Vec::new()
        } else {
            match self.ledgers.apply(stream.id, &ops, now, timing).await {
                Ok(grants) => grants,
                Err(e) => {
                    // No answer for those buckets: Envoy keeps what it was
                    // sent until its TTL, and the next report tries again.
                    for _ in granted.iter().filter(|(id, _)| id.is_some()) {
                        metrics.quota_refused(QuotaRefusal::Ledgers);
                    }
                    if let Some(held) = self.ledger_log.hit(std::time::Instant::now()) {
                        tracing::warn!(error = %e, held_back = held, "quota ledgers failed: the buckets of this report keep their assignments until their TTL");
                    }
                    Vec::new()
                }
            }
        };
        {
            for ((id, window_ns), grant) in granted.into_iter().zip(grants) {
                let Some(id) = id else { continue };
                let strategy = match grant {
                    Grant::Deny => {
                        metrics.quota_action(QuotaAction::DenyAll);
                        Strategy::BlanketRule(BlanketRule::DenyAll as i32)
                    }
                    Grant::Bucket { max_tokens, per_window } => {
                        metrics.quota_action(QuotaAction::TokenBucket);
                        let (max_tokens, per_fill, fill_secs) = share::token_bucket(max_tokens, per_window, window_ns);
                        Strategy::TokenBucket(TokenBucket {
                            max_tokens,
                            tokens_per_fill: Some(pbjson_types::UInt32Value { value: per_fill }),
                            fill_interval: Some(pbjson_types::Duration {
                                seconds: i64::try_from(fill_secs).unwrap_or(i64::MAX),
                                nanos: 0,
                            }),
                        })
                    }
                };
                actions.push(assign(id, ttl, strategy));
            }
        }
        Ok(RateLimitQuotaResponse { bucket_action: actions })
    }

    /// The stream ended: its buckets' demand stops counting (their holds
    /// stay until they expire, as Envoy keeps its assignments until their
    /// TTL). A stream of an identified Envoy leaves the ledgers as they
    /// are, for its next stream.
    ///
    /// # Errors
    ///
    /// The ledgers failed (Redis): the holds then end by themselves.
    pub async fn close(&self, stream: QuotaStream, metrics: &Metrics) -> Result<(), LedgerError> {
        self.untrack(stream.buckets.len(), metrics);
        if stream.identified {
            // Its Envoy may go on on another stream, with its holds: its
            // demand stops counting when its reports stop.
            return Ok(());
        }
        let ops: Vec<LedgerOp> = stream
            .buckets
            .into_iter()
            .filter(|(_, tracked)| tracked.in_ledger)
            .map(|(key, _)| LedgerOp::Leave { key })
            .collect();
        if ops.is_empty() {
            return Ok(());
        }
        self.ledgers
            .apply(stream.id, &ops, self.clock.now(), self.options.timing)
            .await
            .map(|_| ())
    }
}

/// The time since the UNIX epoch, in ns: what replicas sharing ledgers
/// in Redis compare (their clocks must agree within the grace, 1 s).
#[derive(Debug, Clone, Copy, Default)]
pub struct EpochClock;

impl Clock for EpochClock {
    fn now(&self) -> u64 {
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        duration_ns(since)
    }
}

impl QuotaRules for crate::config::Config {
    fn quota_rule(&self, domain: &str, bucket: &[(&str, &str)]) -> Option<QuotaMatch<'_>> {
        let (_, rule) = self.domain(domain)?.find_quota(bucket)?;
        let policy = match &rule.limit {
            None => QuotaPolicy::AllowAll,
            Some(limit) if limit.requests_per_unit == 0 => QuotaPolicy::DenyAll,
            Some(limit) => QuotaPolicy::Limited {
                limit: limit.requests_per_unit,
                window_ns: duration_ns(limit.window),
            },
        };
        Some(QuotaMatch {
            rule: &rule.name,
            policy,
        })
    }
}

/// FNV-1a of `text` from `basis`: the same on every replica and version,
/// for the ledgers' holder of an Envoy id.
fn fnv1a(text: &str, basis: u64) -> u64 {
    text.bytes().fold(basis, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The nanoseconds of `d`, saturating.
fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A bucket's ledger key: its domain and sorted entries, each with its
/// length first, so that no two buckets share one.
fn ledger_key(domain: &str, pairs: &[(&str, &str)]) -> String {
    let mut key =
        String::with_capacity(domain.len() + 8 + pairs.iter().map(|(k, v)| k.len() + v.len() + 8).sum::<usize>());
    let mut number = itoa::Buffer::new();
    key.push_str(number.format(domain.len()));
    key.push(':');
    key.push_str(domain);
    for (k, v) in pairs {
        key.push('|');
        key.push_str(number.format(k.len()));
        key.push(':');
        key.push_str(k);
        key.push_str(number.format(v.len()));
        key.push(':');
        key.push_str(v);
    }
    key
}

fn abandon(id: BucketId) -> BucketAction {
    BucketAction {
        bucket_id: Some(id),
        bucket_action: Some(Action::AbandonAction(AbandonAction {})),
    }
}

fn assign(id: BucketId, ttl: pbjson_types::Duration, strategy: Strategy) -> BucketAction {
    BucketAction {
        bucket_id: Some(id),
        bucket_action: Some(Action::QuotaAssignmentAction(QuotaAssignmentAction {
            assignment_time_to_live: Some(ttl),
            rate_limit_strategy: Some(RateLimitStrategy {
                strategy: Some(strategy),
            }),
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ledger_keys_never_collide_on_separators() {
        assert_ne!(
            ledger_key("d", &[("a", "b|1:c")]),
            ledger_key("d", &[("a", "b"), ("c", "")])
        );
        assert_eq!(ledger_key("edge", &[("route", "x")]), "4:edge|5:route1:x");
    }
}
