//! The answer to one request.

use crate::Policy;
use core::time::Duration;

/// What an algorithm decided for one request, with everything rate-limit
/// headers need.
///
/// Being refused is an outcome, not an error. A decision is a small snapshot
/// of plain integers; the figures that need a division (`remaining`, the
/// estimate, the durations) are worked out when asked for, so that deciding
/// stays cheap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    pub(crate) allowed: bool,
    pub(crate) limit: u64,
    /// The time of the decision, ns.
    pub(crate) now: u64,
    /// When all counted usage has expired, ns.
    pub(crate) reset_at: u64,
    /// When the refused request would pass, ns.
    pub(crate) retry_at: Option<u64>,
    /// `remaining = free − ⌈debt / den⌉`.
    pub(crate) free: u64,
    pub(crate) debt: u64,
    /// `estimate = used + frac / den`.
    pub(crate) used: u64,
    pub(crate) frac: u64,
    /// Denominator of `debt` and `frac`, at least 1.
    pub(crate) den: u64,
}

impl Decision {
    /// Whether the request was admitted (and, for a non-zero cost, counted).
    #[inline]
    pub fn allowed(&self) -> bool {
        self.allowed
    }

    /// The policy's limit.
    #[inline]
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The largest cost that a request at the same instant could have and
    /// still be admitted, after this decision. For the sliding log this is
    /// the budget minus the log's length after the request.
    pub fn remaining(&self) -> u64 {
        if self.debt == 0 {
            self.free
        } else {
            self.free.saturating_sub(self.debt.div_ceil(self.den))
        }
    }

    /// Time until all usage counted so far has expired, so that the full
    /// limit is available again if nothing else arrives. Zero when nothing
    /// is counted.
    pub fn reset_after(&self) -> Duration {
        Duration::from_nanos(self.reset_at.saturating_sub(self.now))
    }

    /// On a refusal: the shortest wait after which the same request (same
    /// cost) would be admitted if nothing else arrived; waiting 1 ns less
    /// would still be refused. `None` when the request was admitted, and
    /// when it can never be admitted (a cost above what the policy can ever
    /// hold).
    pub fn retry_after(&self) -> Option<Duration> {
        if self.allowed {
            return None;
        }
        self.retry_at.map(|t| Duration::from_nanos(t.saturating_sub(self.now)))
    }

    /// The usage the decision was based on: the algorithm's count (or
    /// estimate) of the window before this request.
    pub fn estimate(&self) -> f64 {
        self.used as f64
            + if self.frac == 0 {
                0.0
            } else {
                self.frac as f64 / self.den as f64
            }
    }

    /// `retry_after` in whole seconds, rounded up, for `Retry-After`: a wait
    /// of 300 ms is 1, never 0. `None` when `retry_after` is `None`.
    pub fn retry_after_secs(&self) -> Option<u64> {
        self.retry_after().map(ceil_secs)
    }

    /// `reset_after` in whole seconds, rounded up.
    pub fn reset_after_secs(&self) -> u64 {
        ceil_secs(self.reset_after())
    }

    /// Builds a decision from absolute instants (ns): `reset_at` is when all
    /// counted usage has expired, `retry_at` when the refused request would
    /// pass; the estimate is `whole + num / den` (`den` 0 counts as 1). For
    /// the algorithms here and for stores that decide elsewhere (a Redis
    /// script) and report the same figures.
    #[inline]
    pub fn at(
        policy: &Policy,
        now: u64,
        allowed: bool,
        remaining: u64,
        reset_at: u64,
        retry_at: Option<u64>,
        (whole, num, den): (u64, u64, u64),
    ) -> Decision {
        Decision {
            allowed,
            limit: policy.limit(),
            now,
            reset_at,
            retry_at,
            free: remaining,
            debt: 0,
            used: whole,
            frac: num,
            den: den.max(1),
        }
    }
}

impl Decision {
    /// The same decision with its instants (the decision's time, its
    /// reset and retry times) multiplied by `factor`, saturating: a
    /// decision made on a policy whose window's microseconds were read as
    /// nanoseconds (`factor` 1000) as it reads in nanoseconds. The counts
    /// and the estimate do not change.
    pub fn scale_time(self, factor: u64) -> Decision {
        Decision {
            now: self.now.saturating_mul(factor),
            reset_at: self.reset_at.saturating_mul(factor),
            retry_at: self.retry_at.map(|t| t.saturating_mul(factor)),
            ..self
        }
    }
}

/// A `u128` intermediate clamped into `u64`.
pub(crate) fn saturate(x: u128) -> u64 {
    u64::try_from(x).unwrap_or(u64::MAX)
}

/// The sum of `values`, saturating at `u64::MAX`.
pub(crate) fn saturating_sum(values: impl Iterator<Item = u64>) -> u64 {
    values.fold(0, u64::saturating_add)
}

/// `now − idx·width` when `now` falls in span `idx` of `width` ns (the
/// spans `[idx·width, (idx + 1)·width)`), else `None`: the algorithms' hot
/// paths ask it of the span they last counted in, without a division.
#[inline]
pub(crate) fn elapsed_in(idx: u64, width: u64, now: u64) -> Option<u64> {
    let elapsed = now.checked_sub(idx.saturating_mul(width))?;
    (elapsed < width).then_some(elapsed)
}

/// Whether `cost` more units fit beside `used` under `limit`, without
/// overflow: `used + cost ≤ limit`.
#[inline]
pub(crate) fn fits(limit: u64, used: u64, cost: u64) -> bool {
    used.checked_add(cost).is_some_and(|sum| sum <= limit)
}

/// Whole seconds, rounded up.
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_round_up() {
        assert_eq!(ceil_secs(Duration::from_millis(300)), 1);
        assert_eq!(ceil_secs(Duration::from_secs(2)), 2);
        assert_eq!(ceil_secs(Duration::from_nanos(2_000_000_001)), 3);
        assert_eq!(ceil_secs(Duration::ZERO), 0);
        assert_eq!(ceil_secs(Duration::from_nanos(u64::MAX)), 18_446_744_074);
    }
}
