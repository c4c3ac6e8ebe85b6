//! The IETF `RateLimit-Policy` and `RateLimit` fields (draft 10), the
//! legacy `X-RateLimit-*` fields and `Retry-After`.

use http::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use slidegate_core::{Decision, Policy};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `RateLimit-Policy`.
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit`.
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// `X-RateLimit-Limit`.
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining`.
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `X-RateLimit-Reset`.
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// A policy name usable as a Structured Field string: printable ASCII, with
/// `"` and `\` escaped when written.
pub(crate) fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| (0x20..0x7f).contains(&b))
}

/// The number of decimal digits of `n`.
fn decimal_len(n: u64) -> usize {
    n.checked_ilog10().map_or(1, |log| log as usize + 1)
}

/// `name` as a Structured Field string: quoted, with `"` and `\` escaped.
/// Made once per limit, when the layer is built.
pub(crate) fn sf_string(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 2);
    out.push('"');
    for c in name.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// Appends `n` in decimal (without `core::fmt`, which costs more than the
/// rest of a header).
fn push_u64(out: &mut String, n: u64) {
    out.push_str(itoa::Buffer::new().format(n));
}

/// Whole seconds, rounded up.
fn ceil_secs(ns: u64) -> u64 {
    ns.div_ceil(1_000_000_000)
}

/// `t`: the time until more quota is available. On a refusal that is the
/// retry delay (which `Retry-After` repeats); on an admission, when every
/// counted unit has expired.
fn t_delay(decision: &Decision) -> Duration {
    if decision.allowed() {
        decision.reset_after()
    } else {
        decision.retry_after().unwrap_or_else(|| decision.reset_after())
    }
}

/// `t` in whole seconds, rounded up.
fn t_secs(decision: &Decision) -> u64 {
    ceil_secs(u64::try_from(t_delay(decision).as_nanos()).unwrap_or(u64::MAX))
}

/// How `X-RateLimit-Reset` is written: APIs disagree.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum LegacyReset {
    /// Seconds from now, rounded up, as Envoy's `DRAFT_VERSION_03` headers
    /// and the `RateLimit` field's `t` (the default).
    #[default]
    DelaySeconds,
    /// The Unix time in seconds, rounded up, as GitHub writes it: the
    /// system's wall clock plus the delay.
    EpochSeconds,
}

impl LegacyReset {
    fn value(self, decision: &Decision) -> u64 {
        match self {
            LegacyReset::DelaySeconds => t_secs(decision),
            LegacyReset::EpochSeconds => {
                let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
                let at = now.saturating_add(t_delay(decision));
                at.as_secs() + u64::from(at.subsec_nanos() > 0)
            }
        }
    }
}

/// One limit's decision for the headers.
pub(crate) struct Outcome<'a> {
    pub(crate) name: &'a str,
    /// `name` as a Structured Field string ([`sf_string`]).
    pub(crate) quoted: &'a str,
    pub(crate) policy: &'a Policy,
    pub(crate) decision: &'a Decision,
}

/// `RateLimit-Policy` for a list of limits, given their names quoted by
/// [`sf_string`]: the same on every answer, so it is made once, when the
/// layer is built. `None` if a name cannot be written (names are checked
/// before).
pub(crate) fn policy_value<'a>(limits: impl Iterator<Item = (&'a str, &'a Policy)>) -> Option<HeaderValue> {
    let mut out = String::with_capacity(64);
    for (i, (quoted, policy)) in limits.enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str(quoted);
        out.push_str(";q=");
        push_u64(&mut out, policy.limit());
        out.push_str(";w=");
        push_u64(&mut out, ceil_secs(policy.window_ns()).max(1));
    }
    HeaderValue::try_from(out).ok()
}

/// The rate-limit fields of one answer.
pub(crate) struct Fields {
    policy: HeaderValue,
    state: Option<HeaderValue>,
    /// `X-RateLimit-Limit`, `-Remaining` and `-Reset`; boxed, as they are
    /// off by default, to keep the fields small to move.
    legacy: Option<Box<[HeaderValue; 3]>>,
    retry_after: Option<HeaderValue>,
}

impl Fields {
    /// `RateLimit-Policy` (made once: `policy`), `RateLimit` for every
    /// limit, and, with `legacy`, `X-RateLimit-*` for the limit with the
    /// least remaining (`X-RateLimit-Reset` as a delay in seconds).
    pub(crate) fn new(policy: &HeaderValue, outcomes: &[Outcome<'_>], legacy: Option<LegacyReset>) -> Self {
        // Sized exactly: a `String` whose length is its capacity becomes the
        // `HeaderValue`'s bytes without another allocation.
        let len: usize = outcomes
            .iter()
            .map(|o| {
                o.quoted.len() + ";r=;t=".len() + decimal_len(o.decision.remaining()) + decimal_len(t_secs(o.decision))
            })
            .sum::<usize>()
            + ", ".len() * outcomes.len().saturating_sub(1);
        let mut state = String::with_capacity(len);
        for (i, o) in outcomes.iter().enumerate() {
            if i > 0 {
                state.push_str(", ");
            }
            state.push_str(o.quoted);
            state.push_str(";r=");
            push_u64(&mut state, o.decision.remaining());
            state.push_str(";t=");
            push_u64(&mut state, t_secs(o.decision));
        }
        debug_assert_eq!(state.len(), len);
        let legacy = legacy.and_then(|reset| {
            let tightest = outcomes.iter().min_by_key(|o| o.decision.remaining())?;
            Some(Box::new([
                HeaderValue::from(tightest.policy.limit()),
                HeaderValue::from(tightest.decision.remaining()),
                HeaderValue::from(reset.value(tightest.decision)),
            ]))
        });
        Fields {
            policy: policy.clone(),
            // Names are checked printable ASCII when limits are built, so
            // this is always valid; an invalid value would be left out.
            state: HeaderValue::try_from(state).ok(),
            legacy,
            retry_after: None,
        }
    }

    /// Adds `Retry-After: secs`.
    pub(crate) fn retry_after(&mut self, secs: u64) {
        self.retry_after = Some(HeaderValue::from(secs));
    }

    /// Writes the fields into `headers`.
    pub(crate) fn apply(self, headers: &mut HeaderMap) {
        headers.reserve(if self.legacy.is_some() { 6 } else { 3 });
        headers.insert(RATELIMIT_POLICY, self.policy);
        if let Some(state) = self.state {
            headers.insert(RATELIMIT, state);
        }
        if let Some(legacy) = self.legacy {
            let [limit, remaining, reset] = *legacy;
            headers.insert(X_RATELIMIT_LIMIT, limit);
            headers.insert(X_RATELIMIT_REMAINING, remaining);
            headers.insert(X_RATELIMIT_RESET, reset);
        }
        if let Some(retry) = self.retry_after {
            headers.insert(RETRY_AFTER, retry);
        }
    }
}

/// `Retry-After` for a refusal: the longest wait of the limits that refused,
/// rounded up to whole seconds (never 0 for a wait above 0). `None` if no
/// wait would do (a cost above a limit).
pub(crate) fn retry_after(outcomes: &[Outcome<'_>]) -> Option<u64> {
    let mut most = None;
    for o in outcomes.iter().filter(|o| !o.decision.allowed()) {
        let secs = o.decision.retry_after_secs()?;
        most = Some(most.map_or(secs, |m: u64| m.max(secs)));
    }
    most
}

/// `name` quoted as a Structured Field string, with every character that
/// is not printable ASCII written as `?` (and `?` for an empty name).
fn quote_printable(name: &str) -> String {
    if !name.is_empty()
        && name
            .bytes()
            .all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\')
    {
        let mut out = String::with_capacity(name.len() + 2);
        out.push('"');
        out.push_str(name);
        out.push('"');
        return out;
    }
    let printable: String = name
        .chars()
        .map(|c| if (' '..='~').contains(&c) { c } else { '?' })
        .collect();
    sf_string(if printable.is_empty() { "?" } else { &printable })
}

/// One limit's decision, for [`write_headers`].
#[derive(Clone, Copy, Debug)]
pub struct LimitOutcome<'a> {
    /// The limit's name in the headers: printable ASCII (other bytes are
    /// written as `?`).
    pub name: &'a str,
    /// Its policy.
    pub policy: &'a Policy,
    /// Its decision for this request.
    pub decision: &'a Decision,
}

/// Writes the rate-limit fields of an answer into `headers`, as the layer
/// does, for callers that decide outside it (a rate limit service):
/// `RateLimit-Policy` and `RateLimit` for every limit, `X-RateLimit-*`
/// for the limit with the least remaining when `legacy` is given, and
/// `Retry-After` (rounded up) when a limit refused and waiting can help.
/// Nothing is written for an empty list.
pub fn write_headers(limits: &[LimitOutcome<'_>], legacy: Option<LegacyReset>, headers: &mut HeaderMap) {
    if limits.is_empty() {
        return;
    }
    let names: Vec<String> = limits.iter().map(|l| quote_printable(l.name)).collect();
    let outcomes: Vec<Outcome<'_>> = limits
        .iter()
        .zip(&names)
        .map(|(l, quoted)| Outcome {
            name: l.name,
            quoted,
            policy: l.policy,
            decision: l.decision,
        })
        .collect();
    let Some(policy) = policy_value(outcomes.iter().map(|o| (o.quoted, o.policy))) else {
        return;
    };
    let mut fields = Fields::new(&policy, &outcomes, legacy);
    if outcomes.iter().any(|o| !o.decision.allowed())
        && let Some(secs) = retry_after(&outcomes)
    {
        fields.retry_after(secs);
    }
    fields.apply(headers);
}

#[cfg(test)]
mod tests {
    use super::*;
    use slidegate_core::{Algorithm, LimitState, SlidingLog};
    use std::time::Duration;

    #[test]
    fn draft_10_fields_and_legacy_ones() {
        let policy = Policy::new(2, Duration::from_millis(1500), Algorithm::SlidingLog).unwrap();
        let mut log = SlidingLog::new();
        let first = log.check(&policy, 0, 1);
        let mut headers = HeaderMap::new();
        let name = "per \"ip\"";
        let quoted = sf_string(name);
        assert_eq!(quoted, r#""per \"ip\"""#);
        let outcomes = [Outcome {
            name,
            quoted: &quoted,
            policy: &policy,
            decision: &first,
        }];
        let value = policy_value([(quoted.as_str(), &policy)].into_iter()).unwrap();
        Fields::new(&value, &outcomes, Some(LegacyReset::DelaySeconds)).apply(&mut headers);
        assert_eq!(headers[&RATELIMIT_POLICY], r#""per \"ip\"";q=2;w=2"#);
        assert_eq!(headers[&RATELIMIT], r#""per \"ip\"";r=1;t=2"#);
        assert_eq!(headers[&X_RATELIMIT_LIMIT], "2");
        assert_eq!(headers[&X_RATELIMIT_REMAINING], "1");
        assert_eq!(headers[&X_RATELIMIT_RESET], "2");
        log.check(&policy, 0, 1);
        // 300 ms later the wait is 1.2 s: two seconds, rounded up.
        let refused = log.check(&policy, 300_000_000, 1);
        let outcomes = [Outcome {
            name: "burst",
            quoted: "\"burst\"",
            policy: &policy,
            decision: &refused,
        }];
        assert_eq!(retry_after(&outcomes), Some(2));
        let mut headers = HeaderMap::new();
        let value = policy_value([("\"burst\"", &policy)].into_iter()).unwrap();
        Fields::new(&value, &outcomes, None).apply(&mut headers);
        assert_eq!(headers[&RATELIMIT], r#""burst";r=0;t=2"#);
        assert!(headers.get(X_RATELIMIT_LIMIT).is_none());
    }

    #[test]
    fn headers_for_a_caller_that_decides_itself() {
        let policy = Policy::new(1, Duration::from_millis(1500), Algorithm::SlidingLog).unwrap();
        let mut log = SlidingLog::new();
        let admitted = log.check(&policy, 0, 1);
        let refused = log.check(&policy, 300_000_000, 1);
        let mut headers = HeaderMap::new();
        let limits = [
            LimitOutcome {
                name: "a",
                policy: &policy,
                decision: &admitted,
            },
            LimitOutcome {
                name: "b\u{e9}",
                policy: &policy,
                decision: &refused,
            },
        ];
        write_headers(&limits, None, &mut headers);
        assert_eq!(headers[&RATELIMIT_POLICY], r#""a";q=1;w=2, "b?";q=1;w=2"#);
        assert_eq!(headers[&RATELIMIT], r#""a";r=0;t=2, "b?";r=0;t=2"#);
        assert_eq!(headers[&RETRY_AFTER], "2");
        let mut none = HeaderMap::new();
        write_headers(&[], None, &mut none);
        assert!(none.is_empty());
    }

    #[test]
    fn reset_as_a_unix_time_is_rounded_up() {
        let policy = Policy::new(1, Duration::from_millis(1500), Algorithm::SlidingLog).unwrap();
        let mut log = SlidingLog::new();
        log.check(&policy, 0, 1);
        // 1.2 s to wait.
        let refused = log.check(&policy, 300_000_000, 1);
        let before = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        let epoch = LegacyReset::EpochSeconds.value(&refused);
        let after = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        let earliest = (before + Duration::from_millis(1200)).as_secs_f64().ceil() as u64;
        let latest = (after + Duration::from_millis(1200)).as_secs_f64().ceil() as u64;
        assert!(
            (earliest..=latest).contains(&epoch),
            "{earliest} <= {epoch} <= {latest}"
        );
        assert_eq!(LegacyReset::DelaySeconds.value(&refused), 2);
    }

    #[test]
    fn numbers_in_decimal() {
        for n in [0, 1, 9, 10, 99, 100, 12_345, u64::MAX] {
            let mut out = String::from("x");
            push_u64(&mut out, n);
            assert_eq!(out, format!("x{n}"));
            assert_eq!(decimal_len(n), n.to_string().len());
        }
    }

    #[test]
    fn names_must_be_printable_ascii() {
        assert!(valid_name("per-ip"));
        assert!(!valid_name(""));
        assert!(!valid_name("naïve"));
        assert!(!valid_name("a\nb"));
    }
}
