//! The common interface of the algorithms.

use crate::{Decision, Policy};

/// A per-key algorithm state: a pure state machine over caller-supplied time.
///
/// `check` is `(state, policy, now_ns, cost) -> (decision, new state)`.
/// Handing a state a policy of another algorithm gives meaningless decisions
/// but never a panic; [`State::new`](crate::State::new) picks the right
/// state for a policy.
pub trait LimitState {
    /// Decides whether `cost` units at `now` ns fit the policy; if they do
    /// and `cost > 0`, counts them. A `cost` of 0 never changes the state.
    fn check(&mut self, policy: &Policy, now: u64, cost: u64) -> Decision;

    /// [`LimitState::check`] without the headers: the same decision and the
    /// same new state, answering only whether the request was admitted. For
    /// callers that send no rate-limit headers; `sliding_window`,
    /// `fixed_window` and `gcra` make it cheaper than a full check.
    #[inline]
    fn admit(&mut self, policy: &Policy, now: u64, cost: u64) -> bool {
        self.check(policy, now, cost).allowed()
    }

    /// Counts `cost` units at `now` whatever the limit says: the
    /// measurement view of a simulation, where every request is counted.
    fn record(&mut self, policy: &Policy, now: u64, cost: u64);

    /// The algorithm's count (or estimate) of the window ending at `now`,
    /// without changing the state.
    fn estimate(&self, policy: &Policy, now: u64) -> f64;

    /// The instant from which this state holds nothing that counts: for
    /// every `now ≥ expires_at` it decides every request at `now` or later
    /// as a fresh state would (0 when it holds nothing already). A keyed
    /// store may drop a state once its clock has passed this instant, and
    /// the state's key loses nothing; only requests late by more than the
    /// window, which the state would refuse, pass instead.
    fn expires_at(&self, policy: &Policy) -> u64;

    /// Whether the state holds nothing that counts at `now`:
    /// `expires_at(policy) ≤ now`.
    #[inline]
    fn is_idle(&self, policy: &Policy, now: u64) -> bool {
        self.expires_at(policy) <= now
    }
}
