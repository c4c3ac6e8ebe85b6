//! The Rate Limit Quota Service's figures: streams open, buckets tracked,
//! actions sent by kind, the usage Envoys reported by rule, and the
//! buckets refused an answer by reason. Every unlabelled series and every
//! kind and reason is made at start, so that each shows 0 before its
//! first event; the usage series are made per configured rule as reported
//! (names from the config, never from a bucket id).

use super::Metrics;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The kind of an action sent to Envoy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaAction {
    /// A token bucket.
    TokenBucket,
    /// `ALLOW_ALL`.
    AllowAll,
    /// `DENY_ALL`.
    DenyAll,
    /// `abandon_action`.
    Abandon,
}

impl QuotaAction {
    const ALL: [QuotaAction; 4] = [
        QuotaAction::TokenBucket,
        QuotaAction::AllowAll,
        QuotaAction::DenyAll,
        QuotaAction::Abandon,
    ];

    fn label(self) -> &'static str {
        match self {
            QuotaAction::TokenBucket => "token_bucket",
            QuotaAction::AllowAll => "allow_all",
            QuotaAction::DenyAll => "deny_all",
            QuotaAction::Abandon => "abandon",
        }
    }
}

/// Why a reported bucket got no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaRefusal {
    /// Its id is missing, empty, or past the bounds.
    BucketId,
    /// Its stream already has as many buckets as it may.
    StreamBuckets,
    /// No quota rule matches it.
    Unconfigured,
    /// The open streams track as many buckets as the server takes.
    ServerBuckets,
    /// The ledgers failed (Redis): no answer this time.
    Ledgers,
}

impl QuotaRefusal {
    const ALL: [QuotaRefusal; 5] = [
        QuotaRefusal::BucketId,
        QuotaRefusal::StreamBuckets,
        QuotaRefusal::Unconfigured,
        QuotaRefusal::ServerBuckets,
        QuotaRefusal::Ledgers,
    ];

    fn label(self) -> &'static str {
        match self {
            QuotaRefusal::BucketId => "bucket_id",
            QuotaRefusal::StreamBuckets => "stream_buckets",
            QuotaRefusal::Unconfigured => "unconfigured",
            QuotaRefusal::ServerBuckets => "server_buckets",
            QuotaRefusal::Ledgers => "ledgers",
        }
    }
}

/// How a stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaEnd {
    /// The client closed it.
    Closed,
    /// The client's side failed (a reset, a message that does not decode).
    Failed,
    /// Nothing came within the idle time.
    Idle,
    /// The client left its answers unread.
    NotReading,
    /// A report it cannot go on after (no domain, another domain).
    Refused,
    /// The server stopped.
    Stopping,
}

impl QuotaEnd {
    const ALL: [QuotaEnd; 6] = [
        QuotaEnd::Closed,
        QuotaEnd::Failed,
        QuotaEnd::Idle,
        QuotaEnd::NotReading,
        QuotaEnd::Refused,
        QuotaEnd::Stopping,
    ];

    fn label(self) -> &'static str {
        match self {
            QuotaEnd::Closed => "closed",
            QuotaEnd::Failed => "failed",
            QuotaEnd::Idle => "idle",
            QuotaEnd::NotReading => "not_reading",
            QuotaEnd::Refused => "refused",
            QuotaEnd::Stopping => "stopping",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UsageLabels {
    domain: String,
    rule: String,
    outcome: &'static str,
}

/// The series of [`QuotaAction`] and [`QuotaRefusal`], in their `ALL`
/// order, and the rest.
pub(super) struct QuotaMetrics {
    streams: Gauge,
    ended: [Counter; 6],
    buckets: Gauge,
    actions: [Counter; 4],
    refused: [Counter; 5],
    usage: Family<UsageLabels, Counter>,
}

impl QuotaMetrics {
    pub(super) fn new(registry: &mut Registry) -> Self {
        let streams = Gauge::default();
        registry.register(
            "rlqs_streams",
            "Rate limit quota service streams open (one per Envoy and domain)",
            streams.clone(),
        );
        let ended = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "rlqs_streams_ended",
            "Rate limit quota service streams ended, by reason: closed (by the client), failed, idle (no report within the idle time), not_reading (answers left unread), refused (no domain, or another domain), stopping (the server stopped)",
            ended.clone(),
        );
        let ended = QuotaEnd::ALL.map(|end| ended.get_or_create(&ReasonLabels { reason: end.label() }).clone());
        let buckets = Gauge::default();
        registry.register(
            "rlqs_buckets",
            "Quota buckets tracked, summed over the open streams",
            buckets.clone(),
        );
        let actions = Family::<KindLabels, Counter>::default();
        registry.register(
            "rlqs_actions",
            "Bucket actions sent to Envoys, by kind: token_bucket, allow_all, deny_all, abandon",
            actions.clone(),
        );
        let refused = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "rlqs_buckets_refused",
            "Reported buckets not answered, by reason: bucket_id (missing, empty or too large), stream_buckets (the stream has as many as it may), unconfigured (no quota rule matches), server_buckets (the open streams track --rlqs-max-buckets), ledgers (Redis failed: answered at the next report)",
            refused.clone(),
        );
        let usage = Family::<UsageLabels, Counter>::default();
        registry.register(
            "rlqs_reported_requests",
            "Requests Envoys reported allowed or denied, by domain and quota rule",
            usage.clone(),
        );
        // One statement each: `get_or_create` holds the family's lock until
        // its guard drops.
        let actions = QuotaAction::ALL.map(|kind| actions.get_or_create(&KindLabels { kind: kind.label() }).clone());
        let refused =
            QuotaRefusal::ALL.map(|reason| refused.get_or_create(&ReasonLabels { reason: reason.label() }).clone());
        QuotaMetrics {
            streams,
            ended,
            buckets,
            actions,
            refused,
            usage,
        }
    }
}

impl Metrics {
    /// A quota stream opened (`true`) or closed.
    pub(crate) fn quota_stream(&self, opened: bool) {
        if opened {
            self.quota.streams.inc();
        } else {
            self.quota.streams.dec();
        }
    }

    /// A quota stream ended.
    pub(crate) fn quota_stream_ended(&self, end: QuotaEnd) {
        let index = QuotaEnd::ALL.iter().position(|e| *e == end).unwrap_or(0);
        if let Some(counter) = self.quota.ended.get(index) {
            counter.inc();
        }
    }

    /// The buckets tracked by the open streams changed by `delta`.
    pub(crate) fn quota_buckets(&self, delta: i64) {
        self.quota.buckets.inc_by(delta);
    }

    /// An action sent.
    pub(crate) fn quota_action(&self, kind: QuotaAction) {
        let index = QuotaAction::ALL.iter().position(|k| *k == kind).unwrap_or(0);
        if let Some(counter) = self.quota.actions.get(index) {
            counter.inc();
        }
    }

    /// A reported bucket not answered.
    pub(crate) fn quota_refused(&self, reason: QuotaRefusal) {
        let index = QuotaRefusal::ALL.iter().position(|r| *r == reason).unwrap_or(0);
        if let Some(counter) = self.quota.refused.get(index) {
            counter.inc();
        }
    }

    /// The requests one report says a rule's bucket allowed and denied.
    pub(crate) fn quota_usage(&self, domain: &str, rule: &str, allowed: u64, denied: u64) {
        for (outcome, n) in [("allowed", allowed), ("denied", denied)] {
            if n > 0 {
                let labels = UsageLabels {
                    domain: domain.to_owned(),
                    rule: rule.to_owned(),
                    outcome,
                };
                self.quota.usage.get_or_create(&labels).inc_by(n);
            }
        }
    }
}
