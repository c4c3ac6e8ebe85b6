//! The IETF `RateLimit-Policy` and `RateLimit` fields (draft 10), the
//! legacy `X-RateLimit-*` fields and `Retry-After`.

use http::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use slidegate_core::{Decision, Policy};

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

fn sf_string(out: &mut String, name: &str) {
    out.push('"');
    for c in name.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
}

/// Whole seconds, rounded up.
fn ceil_secs(ns: u64) -> u64 {
    ns.div_ceil(1_000_000_000)
}

/// `t`: seconds until more quota is available. On a refusal that is the
/// retry delay (which `Retry-After` repeats); on an admission, when every
/// counted unit has expired.
fn t_secs(decision: &Decision) -> u64 {
    if decision.allowed() {
        decision.reset_after_secs()
    } else {
        decision
            .retry_after_secs()
            .unwrap_or_else(|| decision.reset_after_secs())
    }
}

/// One limit's decision for the headers.
pub(crate) struct Outcome<'a> {
    pub(crate) name: &'a str,
    pub(crate) policy: &'a Policy,
    pub(crate) decision: Decision,
}

/// Writes `RateLimit-Policy` and `RateLimit` for every limit, and, with
/// `legacy`, `X-RateLimit-*` for the limit with the least remaining
/// (`X-RateLimit-Reset` as a delay in seconds).
pub(crate) fn write(headers: &mut HeaderMap, outcomes: &[Outcome<'_>], legacy: bool) {
    let (mut policies, mut states) = (String::new(), String::new());
    for (i, o) in outcomes.iter().enumerate() {
        if i > 0 {
            policies.push_str(", ");
            states.push_str(", ");
        }
        sf_string(&mut policies, o.name);
        policies.push_str(&format!(
            ";q={};w={}",
            o.policy.limit(),
            ceil_secs(o.policy.window_ns()).max(1)
        ));
        sf_string(&mut states, o.name);
        states.push_str(&format!(";r={};t={}", o.decision.remaining(), t_secs(&o.decision)));
    }
    // Names are checked printable ASCII when limits are built, so these
    // values are always valid; an invalid one would be left out.
    if let Ok(v) = HeaderValue::from_str(&policies) {
        headers.insert(RATELIMIT_POLICY, v);
    }
    if let Ok(v) = HeaderValue::from_str(&states) {
        headers.insert(RATELIMIT, v);
    }
    if legacy && let Some(tightest) = outcomes.iter().min_by_key(|o| o.decision.remaining()) {
        headers.insert(X_RATELIMIT_LIMIT, HeaderValue::from(tightest.policy.limit()));
        headers.insert(X_RATELIMIT_REMAINING, HeaderValue::from(tightest.decision.remaining()));
        headers.insert(X_RATELIMIT_RESET, HeaderValue::from(t_secs(&tightest.decision)));
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

/// Sets `Retry-After`.
pub(crate) fn write_retry_after(headers: &mut HeaderMap, secs: u64) {
    headers.insert(RETRY_AFTER, HeaderValue::from(secs));
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
        let outcomes = [Outcome {
            name: "per \"ip\"",
            policy: &policy,
            decision: first,
        }];
        write(&mut headers, &outcomes, true);
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
            policy: &policy,
            decision: refused,
        }];
        assert_eq!(retry_after(&outcomes), Some(2));
        let mut headers = HeaderMap::new();
        write(&mut headers, &outcomes, false);
        assert_eq!(headers[&RATELIMIT], r#""burst";r=0;t=2"#);
        assert!(headers.get(X_RATELIMIT_LIMIT).is_none());
    }

    #[test]
    fn names_must_be_printable_ascii() {
        assert!(valid_name("per-ip"));
        assert!(!valid_name(""));
        assert!(!valid_name("naïve"));
        assert!(!valid_name("a\nb"));
    }
}
