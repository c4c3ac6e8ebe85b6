//! What the suite tests: anything that decides the requests of one key.

use slidegate_core::{Decision, LimitState, Policy, State};
use std::fmt::Debug;

/// Something that decides `(policy, now, cost) → Decision` for one key: a
/// core [`State`] directly, or one key of a store (the store's crate
/// implements this for a wrapper holding the store and the key).
///
/// A subject is always handed the policy it was built for (by the factory
/// `Fn(&Policy) -> S` that the suite takes).
pub trait Subject: Sized {
    /// What can be compared of two subjects' states: the state itself for a
    /// core state; what a store shows of itself for a store.
    type Snapshot: PartialEq + Debug;

    /// Decides `cost` units at `now`, counting them if admitted. A `cost`
    /// of 0 peeks and must change nothing.
    fn check(&mut self, policy: &Policy, now: u64, cost: u64) -> Decision;

    /// [`Subject::check`] answering only whether the request was admitted.
    fn admit(&mut self, policy: &Policy, now: u64, cost: u64) -> bool;

    /// The count (or estimate) of the window ending at `now`, changing
    /// nothing. By default the estimate of a peek.
    fn estimate(&mut self, policy: &Policy, now: u64) -> f64 {
        self.check(policy, now, 0).estimate()
    }

    /// Another subject in the same state, deciding on its own from now on:
    /// the suite asks it what-if questions.
    fn fork(&self) -> Self;

    /// What can be compared of this subject's state now.
    fn snapshot(&self) -> Self::Snapshot;
}

/// The core's state of any algorithm, directly.
impl Subject for State {
    type Snapshot = State;

    fn check(&mut self, policy: &Policy, now: u64, cost: u64) -> Decision {
        LimitState::check(self, policy, now, cost)
    }

    fn admit(&mut self, policy: &Policy, now: u64, cost: u64) -> bool {
        LimitState::admit(self, policy, now, cost)
    }

    fn estimate(&mut self, policy: &Policy, now: u64) -> f64 {
        LimitState::estimate(self, policy, now)
    }

    fn fork(&self) -> Self {
        self.clone()
    }

    fn snapshot(&self) -> State {
        self.clone()
    }
}
