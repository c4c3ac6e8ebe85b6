//! Keys of a store as conformance subjects.
//!
//! A subject forks by replaying its key's requests (those of non-zero
//! cost, in order) into a new store of the same kind: decisions are
//! deterministic, so the fork holds the same state.

use slidegate_conformance::Subject;
use slidegate_core::{Decision, ManualClock, Policy};
use slidegate_memory::internals::{KeyState, StateMap};
use slidegate_memory::{Budget, KeyedLimiter, Stats};

/// The key every subject decides for.
const KEY: u64 = 0;

/// Requests of non-zero cost, to replay into a fork.
#[derive(Clone, Debug, Default)]
struct History(Vec<(u64, u64)>);

impl History {
    fn note(&mut self, now: u64, cost: u64) {
        if cost > 0 {
            self.0.push((now, cost));
        }
    }

    fn replay<S: Subject>(&self, policy: &Policy, mut subject: S) -> S {
        for &(now, cost) in &self.0 {
            subject.check(policy, now, cost);
        }
        subject
    }
}

/// One key alone in a store of its own: the store never drops it (idle
/// keys are only swept when another key is inserted), so it decides
/// exactly as the state it keeps, in any order of time.
pub(crate) struct OneKey<St: KeyState> {
    store: StateMap<u64, St>,
    policy: Policy,
    history: History,
}

impl<St: KeyState> OneKey<St> {
    pub(crate) fn new(policy: &Policy) -> Self {
        OneKey {
            store: StateMap::new(Budget::keys(8)),
            policy: *policy,
            history: History::default(),
        }
    }
}

impl<St: KeyState> Subject for OneKey<St> {
    /// Keys held and bytes in use.
    type Snapshot = Stats;

    fn check(&mut self, policy: &Policy, now: u64, cost: u64) -> Decision {
        assert_eq!(policy, &self.policy);
        let d = self.store.check(policy, &KEY, now, cost).expect("a suited policy");
        self.history.note(now, cost);
        d
    }

    fn admit(&mut self, policy: &Policy, now: u64, cost: u64) -> bool {
        assert_eq!(policy, &self.policy);
        let allowed = self.store.admit(policy, &KEY, now, cost).expect("a suited policy");
        self.history.note(now, cost);
        allowed
    }

    fn fork(&self) -> Self {
        self.history.replay(&self.policy, Self::new(&self.policy))
    }

    fn snapshot(&self) -> Stats {
        self.store.stats()
    }
}

/// Keys besides the subject's in a [`Crowded`] store.
const NEIGHBOURS: u64 = 6;

/// One key in a store of a single 8-slot shard crowded with
/// [`NEIGHBOURS`] other keys, each request of the key followed by one of
/// a neighbour at the same time: probe runs collide, and the sweeps of
/// new neighbours drop idle keys (the subject's too) and shift the others
/// back. The shard holds 7 keys, so nothing is ever evicted.
///
/// A key dropped once idle decides like a fresh one only for requests in
/// time order, so this subject runs the `in_order` suite.
pub(crate) struct Crowded<St: KeyState> {
    store: StateMap<u64, St>,
    policy: Policy,
    history: History,
    turn: u64,
}

impl<St: KeyState> Crowded<St> {
    pub(crate) fn new(policy: &Policy) -> Self {
        let store = StateMap::new(Budget::keys(7));
        assert_eq!(store.stats().capacity, 7, "one shard of 8 slots");
        Crowded {
            store,
            policy: *policy,
            history: History::default(),
            turn: 0,
        }
    }

    /// A request of a neighbour, after one of the subject's key at `now`.
    fn neighbour(&mut self, now: u64, cost: u64) {
        if cost == 0 {
            // Peeks may look into the future: a neighbour there would
            // sweep keys that are not idle yet at the present.
            return;
        }
        self.turn += 1;
        let key = 1 + self.turn % NEIGHBOURS;
        self.store
            .check(&self.policy, &key, now, 1 + self.turn % 2)
            .expect("a suited policy");
        assert_eq!(self.store.stats().evictions, 0);
    }
}

impl<St: KeyState> Subject for Crowded<St> {
    /// Nothing: which keys a crowded store holds depends on its hash seed.
    type Snapshot = ();

    fn check(&mut self, policy: &Policy, now: u64, cost: u64) -> Decision {
        assert_eq!(policy, &self.policy);
        let d = self.store.check(policy, &KEY, now, cost).expect("a suited policy");
        self.history.note(now, cost);
        self.neighbour(now, cost);
        d
    }

    fn admit(&mut self, policy: &Policy, now: u64, cost: u64) -> bool {
        assert_eq!(policy, &self.policy);
        let allowed = self.store.admit(policy, &KEY, now, cost).expect("a suited policy");
        self.history.note(now, cost);
        self.neighbour(now, cost);
        allowed
    }

    /// A fork replays the key's requests into a new crowded store (its
    /// neighbours asked again, hashed with another seed): it may drop the
    /// key once idle at other times than this store does, which decides
    /// alike for what-if questions, all asked at or after the present.
    fn fork(&self) -> Self {
        self.history.replay(&self.policy, Self::new(&self.policy))
    }

    fn snapshot(&self) {}
}

/// One key of a [`KeyedLimiter`], which picks the most compact state for
/// the policy, on a manual clock set to each request's time.
pub(crate) struct Keyed {
    limiter: KeyedLimiter<u64, ManualClock>,
    clock: ManualClock,
    history: History,
}

impl Keyed {
    pub(crate) fn new(policy: &Policy) -> Self {
        let clock = ManualClock::new(0);
        Keyed {
            limiter: KeyedLimiter::new(*policy, clock.clone(), Budget::keys(8)),
            clock,
            history: History::default(),
        }
    }
}

impl Subject for Keyed {
    type Snapshot = Stats;

    fn check(&mut self, policy: &Policy, now: u64, cost: u64) -> Decision {
        assert_eq!(policy, self.limiter.policy());
        self.clock.set(now);
        let d = self.limiter.check(&KEY, cost).expect("a small key");
        self.history.note(now, cost);
        d
    }

    fn admit(&mut self, policy: &Policy, now: u64, cost: u64) -> bool {
        assert_eq!(policy, self.limiter.policy());
        self.clock.set(now);
        let allowed = self.limiter.admit(&KEY, cost).expect("a small key");
        self.history.note(now, cost);
        allowed
    }

    fn fork(&self) -> Self {
        let policy = *self.limiter.policy();
        self.history.replay(&policy, Self::new(&policy))
    }

    fn snapshot(&self) -> Stats {
        self.limiter.stats()
    }
}
