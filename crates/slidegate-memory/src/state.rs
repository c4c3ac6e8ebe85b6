//! What a store keeps per key: a [`KeyState`], compact where it can be.

use slidegate_core::{Algorithm, Decision, FixedWindow, Gcra, LimitState, Policy, SlidingWindow, Slot, State};

/// A per-key state as a [`StateMap`](crate::internals::StateMap) keeps it.
///
/// The store builds a fresh state for a new key, checks it on every call
/// and drops it once [`KeyState::expires`] has passed. The compact states
/// ([`Ring2`], [`Ring8`], [`FixedWindow`], [`Gcra`]) know nothing of their
/// policy: a store of them must be used with one policy, the one every
/// call passes. [`Timed`] records its own expiry, so a store of
/// `Timed<State>` takes any policy per call.
pub trait KeyState: Send + 'static {
    /// Whether states of this type hold heap memory at all.
    const HEAP: bool = false;

    /// The alignment of a store's slot holding this state: [`CacheLine`]
    /// for a state whose slot (with a key of up to 8 bytes) would
    /// otherwise often straddle two cache lines, so that a decision on a
    /// key not in cache waits for one line, not two; `()` otherwise.
    type Align: Copy + Default + std::fmt::Debug + Send + Sync + 'static;

    /// Whether this type of state can serve `policy` (its algorithm, number
    /// of buckets and slot width).
    fn suits(policy: &Policy) -> bool;

    /// A fresh (empty) state for `policy`, which [`KeyState::suits`] it.
    fn fresh(policy: &Policy) -> Self;

    /// Whether this state was made for a policy of the same shape as
    /// `policy`. A state that does not fit is replaced by a fresh one.
    fn fits(&self, policy: &Policy) -> bool;

    /// The decision for `cost` at `now`, counting it if admitted.
    fn check(&mut self, policy: &Policy, now: u64, cost: u64) -> Decision;

    /// [`KeyState::check`] without the headers.
    fn admit(&mut self, policy: &Policy, now: u64, cost: u64) -> bool;

    /// Counts `cost` at `now` whatever the limit says (a charge after the
    /// fact, [`LimitState::record`]). By default a check, which counts only
    /// what fits: the states of this crate all override it.
    fn record(&mut self, policy: &Policy, now: u64, cost: u64) {
        let _ = self.check(policy, now, cost);
    }

    /// The instant from which the state holds nothing that counts
    /// ([`LimitState::expires_at`]), under `policy` (ignored by states that
    /// record their own expiry).
    fn expires(&self, policy: &Policy) -> u64;

    /// [`KeyState::check`], and [`KeyState::expires`] after it (the ring
    /// states compute both on one rebuilt ring).
    fn check_expiring(&mut self, policy: &Policy, now: u64, cost: u64) -> (Decision, u64) {
        let d = self.check(policy, now, cost);
        (d, self.expires(policy))
    }

    /// [`KeyState::admit`], and [`KeyState::expires`] after it.
    fn admit_expiring(&mut self, policy: &Policy, now: u64, cost: u64) -> (bool, u64) {
        let allowed = self.admit(policy, now, cost);
        (allowed, self.expires(policy))
    }

    /// [`KeyState::record`], and [`KeyState::expires`] after it.
    fn record_expiring(&mut self, policy: &Policy, now: u64, cost: u64) -> u64 {
        self.record(policy, now, cost);
        self.expires(policy)
    }

    /// Bytes the state holds on the heap.
    fn heap_bytes(&self) -> usize {
        0
    }

    /// Every unit the state holds, whether or not it still counts: it
    /// never counts more at any later instant, whatever its policy. When
    /// the store evicts a live key it keeps this (and [`KeyState::expires`])
    /// in its summary, and a key arriving that is not held starts from the
    /// summary's estimate instead of from nothing. The states of this crate
    /// all say; the default, 0, opts a state out (an evicted one starts
    /// afresh). A `gcra` state holds its backlog as its expiry (`TAT`), so
    /// it says 0 too and is seeded from the expiry.
    fn held(&self) -> u64 {
        0
    }
}

/// A zero-sized field that aligns what holds it to a 64-byte cache line
/// ([`KeyState::Align`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(align(64))]
pub struct CacheLine;

/// The number of buckets of a `sliding_window` policy, if it is one.
fn ring_buckets(policy: &Policy) -> Option<usize> {
    match policy.algorithm() {
        Algorithm::SlidingWindow { buckets, .. } => Some(buckets as usize),
        _ => None,
    }
}

/// A `u64` kept as two `u32` halves, so that a state of 4-byte alignment
/// packs tightly beside a key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Split([u32; 2]);

impl Split {
    fn get(self) -> u64 {
        u64::from(self.0[0]) | (u64::from(self.0[1]) << 32)
    }

    fn new(v: u64) -> Self {
        Split([v as u32, (v >> 32) as u32])
    }
}

/// Runs `f` on a [`SlidingWindow`] rebuilt around `slots`, then keeps its
/// newest bucket. `None` only for a ring of fewer than 2 slots, which the
/// ring states never build.
fn with_ring<S: Slot, R: AsRef<[S]> + AsMut<[S]>, T>(
    policy: &Policy,
    newest: &mut Split,
    slots: R,
    f: impl FnOnce(&mut SlidingWindow<S, R>) -> T,
) -> Option<T> {
    let mut ring = SlidingWindow::from_parts_in(policy, newest.get(), slots)?;
    let out = f(&mut ring);
    *newest = Split::new(ring.newest());
    Some(out)
}

/// The expiry of a ring held as parts.
fn ring_expiry<S: Slot>(policy: &Policy, newest: Split, slots: &[S]) -> u64 {
    let mut copy = [S::default(); 8];
    let n = slots.len().min(8);
    copy[..n].copy_from_slice(&slots[..n]);
    SlidingWindow::from_parts_in(policy, newest.get(), &mut copy[..n]).map_or(0, |ring| ring.expires_at(policy))
}

/// The ring states' [`KeyState`] methods. `$slots` borrows the ring's
/// storage from `$this`: an array where the length is fixed, so that the
/// ring's arithmetic on `n` folds into constants.
macro_rules! ring_methods {
    ($slot:ty; |$this:ident| $slots:expr) => {
        fn check(&mut self, policy: &Policy, now: u64, cost: u64) -> Decision {
            self.check_expiring(policy, now, cost).0
        }

        fn admit(&mut self, policy: &Policy, now: u64, cost: u64) -> bool {
            let $this = self;
            let mut newest = $this.newest.get();
            let allowed = SlidingWindow::admit_parts(policy, &mut newest, $slots, now, cost).unwrap_or(false);
            $this.newest = Split::new(newest);
            allowed
        }

        fn record(&mut self, policy: &Policy, now: u64, cost: u64) {
            self.record_expiring(policy, now, cost);
        }

        fn expires(&self, policy: &Policy) -> u64 {
            ring_expiry(policy, self.newest, &self.slots[..self.len()])
        }

        fn held(&self) -> u64 {
            self.slots[..self.len()]
                .iter()
                .fold(0u64, |sum, s| sum.saturating_add(s.get()))
        }

        fn check_expiring(&mut self, policy: &Policy, now: u64, cost: u64) -> (Decision, u64) {
            let $this = self;
            with_ring(policy, &mut $this.newest, $slots, |r| {
                (r.check(policy, now, cost), r.expires_at(policy))
            })
            .unwrap_or_else(|| (SlidingWindow::<$slot>::new(policy).check(policy, now, cost), 0))
        }

        fn admit_expiring(&mut self, policy: &Policy, now: u64, cost: u64) -> (bool, u64) {
            let $this = self;
            with_ring(policy, &mut $this.newest, $slots, |r| {
                (r.admit(policy, now, cost), r.expires_at(policy))
            })
            .unwrap_or((false, 0))
        }

        fn record_expiring(&mut self, policy: &Policy, now: u64, cost: u64) -> u64 {
            let $this = self;
            with_ring(policy, &mut $this.newest, $slots, |r| {
                r.record(policy, now, cost);
                r.expires_at(policy)
            })
            .unwrap_or(0)
        }
    };
}

/// A `sliding_window` of 2 buckets (the two-bucket estimate) held inline:
/// the newest bucket index and two slots, 12 bytes with `u16` slots (limits
/// up to 65 535) and 16 with `u32` slots.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ring2<S> {
    newest: Split,
    slots: [S; 2],
}

impl<S: Slot> Ring2<S> {
    fn len(&self) -> usize {
        2
    }
}

impl<S: Slot> KeyState for Ring2<S> {
    type Align = ();

    fn suits(policy: &Policy) -> bool {
        ring_buckets(policy) == Some(2) && policy.limit() <= S::MAX
    }

    fn fresh(_policy: &Policy) -> Self {
        Self::default()
    }

    fn fits(&self, policy: &Policy) -> bool {
        Self::suits(policy)
    }

    ring_methods!(S; |this| &mut this.slots);
}

/// A `sliding_window` of 3 to 8 buckets held inline: the newest bucket
/// index, eight slots and the number in use; 28 bytes with `u16` slots and
/// 44 with `u32` slots, so that a key of up to 8 bytes and its state fit
/// one 64-byte cache line (a store aligns the `u32` ring's slots to one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ring8<S> {
    newest: Split,
    slots: [S; 8],
    /// Slots in use: 2 to 8.
    len: u8,
}

impl<S: Slot> Ring8<S> {
    fn len(&self) -> usize {
        usize::from(self.len)
    }
}

/// `Ring8`'s [`KeyState`] for one slot width, with the alignment of the
/// store's slot holding it.
macro_rules! ring8_state {
    ($slot:ty, $align:ty) => {
        impl KeyState for Ring8<$slot> {
            type Align = $align;

            fn suits(policy: &Policy) -> bool {
                ring_buckets(policy).is_some_and(|n| (2..=8).contains(&n)) && policy.limit() <= <$slot as Slot>::MAX
            }

            fn fresh(policy: &Policy) -> Self {
                Ring8 {
                    newest: Split::default(),
                    slots: [0; 8],
                    len: ring_buckets(policy).unwrap_or(2).clamp(2, 8) as u8,
                }
            }

            fn fits(&self, policy: &Policy) -> bool {
                Self::suits(policy) && ring_buckets(policy) == Some(usize::from(self.len))
            }

            ring_methods!($slot; |this| &mut this.slots[..usize::from(this.len)]);
        }
    };
}

// With `u16` slots a key of 8 bytes and the ring take a 40-byte slot, kept
// compact (a line is 64); with `u32` slots they take 56 bytes, which would
// straddle two cache lines at 7 of 8 offsets: a whole line each costs 8
// bytes and makes a decision on a key not in cache wait for one line
// (about a sixth less time a decision at 1,000,000 keys, BENCHMARKS.md).
ring8_state!(u16, ());
ring8_state!(u32, CacheLine);
ring8_state!(u64, ());

/// The [`KeyState`] methods of a core state.
macro_rules! core_methods {
    () => {
        fn check(&mut self, policy: &Policy, now: u64, cost: u64) -> Decision {
            LimitState::check(self, policy, now, cost)
        }

        fn admit(&mut self, policy: &Policy, now: u64, cost: u64) -> bool {
            LimitState::admit(self, policy, now, cost)
        }

        fn record(&mut self, policy: &Policy, now: u64, cost: u64) {
            LimitState::record(self, policy, now, cost);
        }

        fn expires(&self, policy: &Policy) -> u64 {
            self.expires_at(policy)
        }
    };
}

impl KeyState for FixedWindow {
    type Align = ();

    fn suits(policy: &Policy) -> bool {
        matches!(policy.algorithm(), Algorithm::FixedWindow)
    }

    fn held(&self) -> u64 {
        self.count()
    }

    fn fresh(_policy: &Policy) -> Self {
        FixedWindow::new()
    }

    fn fits(&self, policy: &Policy) -> bool {
        Self::suits(policy)
    }

    core_methods!();
}

impl KeyState for Gcra {
    type Align = ();

    fn suits(policy: &Policy) -> bool {
        matches!(policy.algorithm(), Algorithm::Gcra { .. })
    }

    fn fresh(_policy: &Policy) -> Self {
        Gcra::new()
    }

    fn fits(&self, policy: &Policy) -> bool {
        Self::suits(policy)
    }

    core_methods!();
}

/// Any algorithm: the core's [`State`], whose ring and logs live on the
/// heap.
impl KeyState for State {
    const HEAP: bool = true;
    type Align = ();

    fn suits(_policy: &Policy) -> bool {
        true
    }

    fn fresh(policy: &Policy) -> Self {
        State::new(policy)
    }

    fn fits(&self, policy: &Policy) -> bool {
        match (self, policy.algorithm()) {
            (State::SlidingWindow(s), Algorithm::SlidingWindow { buckets, .. }) => {
                s.buckets() == buckets as usize && policy.limit() <= u64::from(u32::MAX)
            }
            (State::SlidingWindowWide(s), Algorithm::SlidingWindow { buckets, .. }) => {
                s.buckets() == buckets as usize && policy.limit() > u64::from(u32::MAX)
            }
            (State::FixedWindow(_), Algorithm::FixedWindow)
            | (State::SlidingLog(_), Algorithm::SlidingLog)
            | (State::Gcra(_), Algorithm::Gcra { .. })
            | (State::ExponentialHistogram(_), Algorithm::ExponentialHistogram { .. }) => true,
            _ => false,
        }
    }

    core_methods!();

    fn heap_bytes(&self) -> usize {
        self.bytes() - core::mem::size_of::<State>()
    }

    fn held(&self) -> u64 {
        match self {
            State::SlidingWindow(s) => s.total(),
            State::SlidingWindowWide(s) => s.total(),
            State::FixedWindow(s) => s.count(),
            State::SlidingLog(s) => s.total(),
            State::ExponentialHistogram(s) => s.total(),
            State::Gcra(_) => 0,
        }
    }
}

/// A state that records when it expires, under the policy of its last
/// check, so that a store of them takes a different policy on every call
/// and still drops each key only once its own counts have expired.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Timed<St> {
    expires: Split,
    state: St,
}

impl<St: KeyState> KeyState for Timed<St> {
    const HEAP: bool = St::HEAP;
    type Align = St::Align;

    fn suits(policy: &Policy) -> bool {
        St::suits(policy)
    }

    fn fresh(policy: &Policy) -> Self {
        Timed {
            expires: Split::default(),
            state: St::fresh(policy),
        }
    }

    fn fits(&self, policy: &Policy) -> bool {
        self.state.fits(policy)
    }

    fn check(&mut self, policy: &Policy, now: u64, cost: u64) -> Decision {
        let (d, expires) = self.state.check_expiring(policy, now, cost);
        self.expires = Split::new(expires);
        d
    }

    fn admit(&mut self, policy: &Policy, now: u64, cost: u64) -> bool {
        let (allowed, expires) = self.state.admit_expiring(policy, now, cost);
        self.expires = Split::new(expires);
        allowed
    }

    fn record(&mut self, policy: &Policy, now: u64, cost: u64) {
        self.expires = Split::new(self.state.record_expiring(policy, now, cost));
    }

    fn expires(&self, _policy: &Policy) -> u64 {
        self.expires.get()
    }

    fn heap_bytes(&self) -> usize {
        self.state.heap_bytes()
    }

    fn held(&self) -> u64 {
        self.state.held()
    }
}
