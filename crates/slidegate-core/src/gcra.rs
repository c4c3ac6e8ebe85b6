//! `gcra`: the generic cell rate algorithm.

use crate::decision::saturate;
use crate::{Algorithm, Decision, LimitState, Policy};

/// `gcra`: the generic cell rate algorithm in its virtual-scheduling form,
/// with emission interval `T = ⌈W / limit⌉` ns and burst tolerance
/// `τ = (burst − 1)·T`.
///
/// The state is the theoretical arrival time `TAT`. A request of `cost`
/// units at `t` conforms when `max(TAT, t) + cost·T − t ≤ burst·T`, which
/// for `cost = 1` is the textbook test `TAT ≤ t + τ`; a conforming request
/// sets `TAT = max(TAT, t) + cost·T`. A cost of `c` is admitted exactly when
/// `c` single requests at the same instant would all conform.
///
/// It admits `burst` at once and then one every `T`: with `burst = limit`
/// (the default) up to `2·limit − 1` in a window of length `W`; with
/// `burst = 1`, at most `limit` (rounding `T` up keeps both bounds). A cost
/// above `burst` or above `limit` can never pass and gets
/// `retry_after == None`.
///
/// Time going backwards needs no special rule: `TAT − t` only grows.
///
/// # Memory
///
/// 8 bytes: `TAT`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Gcra {
    tat: u64,
}

impl Gcra {
    /// A state that admits a full burst.
    pub fn new() -> Self {
        Self::default()
    }

    /// The theoretical arrival time.
    pub fn tat(&self) -> u64 {
        self.tat
    }

    /// Whether `cost` units conform at `now`, counted if they do and
    /// `cost > 0`; and `max(TAT, now)` before them.
    #[inline]
    fn conform(&mut self, policy: &Policy, now: u64, cost: u64) -> (bool, u64) {
        let t_ns = u128::from(policy.step_ns());
        let burst = burst(policy);
        let base = self.tat.max(now);
        // Below 2¹²⁸: base − now < 2⁶⁴ and cost·T ≤ (2⁶⁴ − 1)².
        let allowed = cost <= burst.min(policy.limit())
            && u128::from(base - now) + u128::from(cost) * t_ns <= u128::from(burst) * t_ns;
        if allowed && cost > 0 {
            self.tat = saturate(u128::from(base) + u128::from(cost) * t_ns);
        }
        (allowed, base)
    }
}

fn burst(policy: &Policy) -> u64 {
    match policy.algorithm() {
        Algorithm::Gcra { burst } => burst,
        _ => policy.limit(),
    }
}

impl LimitState for Gcra {
    #[inline]
    fn check(&mut self, policy: &Policy, now: u64, cost: u64) -> Decision {
        let step = policy.step();
        let t_ns = u128::from(step.get());
        let burst = burst(policy);
        let most = burst.min(policy.limit());
        let cap = u128::from(burst) * t_ns;
        let (allowed, base) = self.conform(policy, now, cost);
        let backlog = base - now;
        // ⌊(burst·T − backlog) / T⌋ = burst − ⌈backlog / T⌉.
        let (q, r) = step.div_rem(self.tat.max(now) - now);
        let remaining = burst
            .saturating_sub(q)
            .saturating_sub(u64::from(r > 0))
            .min(policy.limit());
        // TAT + cost·T − burst·T ≤ t'  ⇔  the request conforms at t'.
        let retry_at = (!allowed && cost <= most)
            .then(|| saturate((u128::from(base) + u128::from(cost) * t_ns).saturating_sub(cap)));
        let (q, r) = step.div_rem(backlog);
        Decision::at(policy, now, allowed, remaining, self.tat, retry_at, (q, r, step.get()))
    }

    /// [`LimitState::check`]'s decision and new state without working
    /// out the headers.
    #[inline]
    fn admit(&mut self, policy: &Policy, now: u64, cost: u64) -> bool {
        self.conform(policy, now, cost).0
    }

    fn record(&mut self, policy: &Policy, now: u64, cost: u64) {
        let t_ns = u128::from(policy.step_ns());
        self.tat = saturate(u128::from(self.tat.max(now)).saturating_add(u128::from(cost) * t_ns));
    }

    fn expires_at(&self, _policy: &Policy) -> u64 {
        // From `TAT` on, `max(TAT, now) = now`: as a fresh state.
        self.tat
    }

    fn estimate(&self, policy: &Policy, now: u64) -> f64 {
        self.tat.saturating_sub(now) as f64 / policy.step_ns() as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::time::Duration;

    #[test]
    fn burst_then_one_per_interval() {
        // 10 per 100 ns: T = 10, burst 3.
        let p = Policy::new(10, Duration::from_nanos(100), Algorithm::Gcra { burst: 3 }).unwrap();
        let mut s = Gcra::new();
        let d = s.check(&p, 1000, 1);
        assert!(d.allowed());
        assert_eq!(d.remaining(), 2);
        assert!(s.check(&p, 1000, 2).allowed());
        let d = s.check(&p, 1000, 1);
        assert!(!d.allowed());
        assert_eq!(d.retry_after(), Some(Duration::from_nanos(10)));
        assert_eq!(d.reset_after(), Duration::from_nanos(30));
        assert!(!s.check(&p, 1009, 1).allowed());
        assert!(s.check(&p, 1010, 1).allowed());
        assert_eq!(s.check(&p, 1010, 2).retry_after(), Some(Duration::from_nanos(20)));
        assert_eq!(
            s.check(&p, 1010, 4).retry_after(),
            None,
            "cost above the burst never passes"
        );
        s.check(&p, 0, 0);
        s.check(&p, 0, 1);
        assert_eq!(s.tat(), 1040, "peeks and refusals change nothing");
    }
}
