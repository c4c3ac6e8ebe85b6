//! One policy, one state and a clock: the simplest way to use an algorithm.

use crate::{Clock, Decision, LimitState, Policy, State};

/// A single rate limit (one key) that reads its time from a [`Clock`].
///
/// The keyed, concurrent stores live in other crates; this type is for one
/// limit owned by one task, and for tests with a [`crate::ManualClock`].
#[derive(Clone, Debug)]
pub struct Limiter<C> {
    policy: Policy,
    state: State,
    clock: C,
}

impl<C: Clock> Limiter<C> {
    /// A fresh limiter for `policy` that reads `clock` once per check.
    pub fn new(policy: Policy, clock: C) -> Self {
        Limiter {
            state: State::new(&policy),
            policy,
            clock,
        }
    }

    /// Decides whether `cost` units may pass now, and counts them if so. A
    /// cost of 0 only peeks.
    pub fn check(&mut self, cost: u64) -> Decision {
        let now = self.clock.now();
        self.state.check(&self.policy, now, cost)
    }

    /// [`Limiter::check`] without the headers: whether `cost` units may
    /// pass now (counted if so), the same decision and new state as
    /// `check` at the same instant, without building a [`Decision`] (a
    /// refusal works out no retry-after).
    #[inline]
    pub fn admit(&mut self, cost: u64) -> bool {
        let now = self.clock.now();
        self.state.admit(&self.policy, now, cost)
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The algorithm state.
    pub fn state(&self) -> &State {
        &self.state
    }
}
