//! `sliding_window`: the ring of `n` sub-buckets of seed 000 with a running
//! total.

use crate::decision::{elapsed_in, fits, saturate, saturating_sum};
use crate::div::{Divisor, div_wide};
use crate::{Algorithm, Decision, LimitState, Policy, Weighting};
use alloc::boxed::Box;
use alloc::vec;
use core::fmt::Debug;
use core::marker::PhantomData;

/// A counter slot of the ring: `u32` when the limit fits, `u64` otherwise
/// (and `u16`, for keyed stores that keep small limits compact).
///
/// Slots saturate instead of wrapping. An admitted request never makes a
/// slot exceed the limit, so with slots whose [`Slot::MAX`] is at least the
/// limit saturation only happens through [`LimitState::record`].
pub trait Slot: Copy + Default + Debug + Eq + Send + Sync + 'static {
    /// The largest count a slot holds.
    const MAX: u64;
    /// The value as a `u64`.
    fn get(self) -> u64;
    /// `self + v`, saturating at the slot's maximum.
    fn plus(self, v: u64) -> Self;
}

impl Slot for u16 {
    const MAX: u64 = u16::MAX as u64;
    fn get(self) -> u64 {
        u64::from(self)
    }
    fn plus(self, v: u64) -> Self {
        u16::try_from(u64::from(self).saturating_add(v)).unwrap_or(u16::MAX)
    }
}

impl Slot for u32 {
    const MAX: u64 = u32::MAX as u64;
    fn get(self) -> u64 {
        u64::from(self)
    }
    fn plus(self, v: u64) -> Self {
        u32::try_from(u64::from(self).saturating_add(v)).unwrap_or(u32::MAX)
    }
}

impl Slot for u64 {
    const MAX: u64 = u64::MAX;
    fn get(self) -> u64 {
        self
    }
    fn plus(self, v: u64) -> Self {
        self.saturating_add(v)
    }
}

/// `sliding_window`: a ring of `n ≥ 2` sub-buckets of width `b`, with a
/// running total, so that both adding and estimating are O(1) for any `n`.
///
/// Time is cut into buckets `floor(t / b)`; the ring keeps the last `n`
/// bucket counts at `index % n`. The window is `(n − 1)·b`: at time `t`
/// with `e = t mod b` it covers the current bucket, the `n − 2` before it
/// whole, and the part `(b − e)/b` of the oldest one.
///
/// - **Interpolated** weighting (seed 000, Cloudflare): the estimate is
///   `rest + oldest·(b − e)/b` and is off from the true count of the window
///   by at most the oldest bucket's count. An adversary that fills a bucket
///   at its very end can get `2·limit − 1` admitted in one window.
/// - **Conservative** weighting: the oldest bucket counts whole, so no window
///   of length `(n − 1)·b` ever holds more than `limit` admitted units (for
///   non-decreasing time); a request may be refused up to one bucket's count
///   early.
///
/// A request is admitted when `estimate + cost ≤ limit`, computed exactly in
/// integers (scaled by `b`), never in floating point.
///
/// Rules of seed 000: advance before reading; an idle gap zeroes at most `n`
/// slots; `newest` never moves backwards; a late event (time before the
/// newest bucket) is judged as at the start of the newest bucket and counted
/// in its own bucket if that bucket is still in the ring, and refused
/// otherwise (counting it elsewhere, or not at all, could over-admit).
///
/// `retry_after` is exact: it follows the oldest bucket's linear decay and
/// then whole buckets leaving the ring, so the same request passes at
/// `now + retry_after` and not 1 ns earlier. It costs O(buckets scanned) on a
/// refusal only, stopping at the first bucket that frees enough.
///
/// # Memory
///
/// `n` slots of 4 bytes (8 for limits above `u32::MAX`) on the heap, plus
/// 48 bytes inline: the slot pointer and length, the newest bucket index,
/// the running total, the newest bucket's slot, how far behind it the
/// newest non-empty bucket is, and the last refusal's retry instant. Two
/// buckets: 56 bytes; 61 buckets: 292 bytes.
///
/// The slots live in `R`: a boxed slice by default, or storage a keyed store
/// owns (an array, `&mut [u32]`), rebuilt around it with
/// [`SlidingWindow::from_parts`].
///
/// # Cost
///
/// A request in the newest bucket costs one multiplication to find its
/// bucket and no division; crossing into a new bucket costs one
/// division-by-multiplication and zeroes the slots that left (at most `n`,
/// amortised O(1)).
#[derive(Clone, Debug)]
pub struct SlidingWindow<S: Slot = u32, R = Box<[S]>> {
    slots: R,
    /// Absolute index of the newest bucket (`t / b`).
    newest: u64,
    /// Sum of all slots.
    total: u64,
    /// The slot of `newest`: `newest mod n` (`n ≤ 2¹⁶`).
    newest_slot: u16,
    /// `newest` minus the newest bucket counted in, saturating: while
    /// `total > 0` the newest non-empty bucket is `newest − lag`, so that
    /// `reset_after` needs no scan.
    lag: u16,
    /// A hint for `retry_after`: every bucket older than `newest − head` is
    /// empty (saturating, so `u16::MAX` says nothing), so refusals do not
    /// rescan the same empty buckets.
    head: u16,
    /// A hint for refusals in time order: the cost (0: none) whose retry
    /// instant is `retry_at`. Set by such a refusal and cleared by every
    /// change to the counts; while the counts stand, a request of that cost
    /// fits from `retry_at` on and not before (fitting only gets easier as
    /// time passes over the same counts, and advancing the ring clears only
    /// buckets that no longer count), so repeated refusals on a hot key do
    /// not search the ring again.
    retry_cost: u16,
    /// See `retry_cost`.
    retry_at: u64,
    slot: PhantomData<S>,
}

/// Equal rings decide alike forever: every field counts but the `head`
/// and `retry_cost` hints, which only save `retry_after` some scanning.
impl<S: Slot, R: AsRef<[S]>> PartialEq for SlidingWindow<S, R> {
    fn eq(&self, other: &Self) -> bool {
        let Self {
            slots,
            newest,
            total,
            newest_slot,
            lag,
            head: _,
            retry_cost: _,
            retry_at: _,
            slot: _,
        } = self;
        (slots.as_ref(), newest, total, newest_slot, lag)
            == (
                other.slots.as_ref(),
                &other.newest,
                &other.total,
                &other.newest_slot,
                &other.lag,
            )
    }
}

impl<S: Slot, R: AsRef<[S]>> Eq for SlidingWindow<S, R> {}

/// The ring as seen at one instant, after a (virtual) advance.
#[derive(Clone, Copy, Debug)]
struct View {
    /// The request's own bucket.
    own: u64,
    /// The bucket the decision is made in: `max(own, newest)`.
    bucket: u64,
    /// Nanoseconds into `bucket` (0 for a late request).
    elapsed: u64,
    /// `bucket − newest`: buckets that (virtually) entered the ring.
    gap: u64,
    /// Slot of `bucket`.
    slot: usize,
    /// Sum of the ring.
    total: u64,
    /// Count of the oldest bucket, `bucket − (n − 1)`.
    oldest: u64,
}

impl<S: Slot> SlidingWindow<S> {
    /// An empty ring with the number of buckets of `policy` (2 if the policy
    /// is of another algorithm).
    pub fn new(policy: &Policy) -> Self {
        let n = match policy.algorithm() {
            Algorithm::SlidingWindow { buckets, .. } => buckets.clamp(2, Policy::MAX_BUCKETS),
            _ => 2,
        };
        SlidingWindow {
            slots: vec![S::default(); n as usize].into_boxed_slice(),
            newest: 0,
            total: 0,
            newest_slot: 0,
            lag: 0,
            head: u16::MAX,
            retry_cost: 0,
            retry_at: 0,
            slot: PhantomData,
        }
    }

    /// Bytes on the heap: the slots.
    pub fn heap_bytes(&self) -> usize {
        core::mem::size_of_val(self.slots.as_ref())
    }
}

impl<S: Slot, R: AsRef<[S]> + AsMut<[S]>> SlidingWindow<S, R> {
    /// A ring over caller-owned `slots`, whose newest bucket is `newest`:
    /// the inverse of [`SlidingWindow::into_parts`]. The running total and
    /// the hints are recomputed from the slots (O(n)), so a keyed store can
    /// keep just the newest bucket index and the slots, and rebuild the ring
    /// for each decision. `None` unless `2 ≤ slots.len() ≤`
    /// [`Policy::MAX_BUCKETS`].
    pub fn from_parts(newest: u64, slots: R) -> Option<Self> {
        let len = slots.as_ref().len() as u64;
        Self::from_parts_at(newest, newest % len.max(1), slots)
    }

    /// [`SlidingWindow::from_parts`] for a ring of `policy`: the newest
    /// bucket's slot is found with the policy's divisor (two
    /// multiplications) instead of a division when the slot count is the
    /// policy's number of buckets. The same ring.
    pub fn from_parts_in(policy: &Policy, newest: u64, slots: R) -> Option<Self> {
        let newest_slot = slot_of(policy, newest, slots.as_ref().len());
        Self::from_parts_at(newest, newest_slot, slots)
    }

    /// A ring over `slots` (newest bucket `newest`, in slot `newest_slot`)
    /// with a total of 0 and both hints 0, for the caller to fill in;
    /// `None` for a slot count `from_parts` refuses.
    fn bare(newest: u64, newest_slot: u64, slots: R) -> Option<Self> {
        let len = slots.as_ref().len();
        (2..=Policy::MAX_BUCKETS as usize)
            .contains(&len)
            .then_some(SlidingWindow {
                slots,
                newest,
                total: 0,
                newest_slot: newest_slot as u16,
                lag: 0,
                head: 0,
                retry_cost: 0,
                retry_at: 0,
                slot: PhantomData,
            })
    }

    fn from_parts_at(newest: u64, newest_slot: u64, slots: R) -> Option<Self> {
        let len = slots.as_ref().len();
        let mut ring = Self::bare(newest, newest_slot, slots)?;
        // In slot order and without branches on the counts (a store
        // rebuilds a ring per decision): `lag` and `head` are the least and
        // the greatest distance back from the newest bucket of a non-empty
        // slot, both 0 for an empty ring.
        let (newest_slot, mut lag, mut head) = (usize::from(ring.newest_slot), u16::MAX, 0u16);
        for (i, slot) in ring.slots.as_ref().iter().enumerate() {
            let count = slot.get();
            let d = (if i <= newest_slot {
                newest_slot - i
            } else {
                newest_slot + len - i
            }) as u16;
            ring.total = ring.total.saturating_add(count);
            let nonzero = count > 0;
            lag = if nonzero { lag.min(d) } else { lag };
            head = if nonzero { head.max(d) } else { head };
        }
        if ring.total > 0 {
            (ring.lag, ring.head) = (lag, head);
        }
        Some(ring)
    }

    /// [`SlidingWindow::from_parts`], then [`LimitState::admit`], then the
    /// newest bucket written back to `newest`: the same decision and the
    /// same parts, in O(n) additions and no division. A keyed store that
    /// keeps only the parts decides a request without headers with it:
    /// the hints that `from_parts` works out are read only for headers and
    /// expiry, so the ring is built with their widest values (`lag` 0,
    /// `head` n − 1), which bound the true ones. `None` for a slot count
    /// that `from_parts` refuses.
    pub fn admit_parts(policy: &Policy, newest: &mut u64, slots: R, now: u64, cost: u64) -> Option<bool> {
        let len = slots.as_ref().len();
        let mut window = Self::bare(*newest, slot_of(policy, *newest, len), slots)?;
        window.total = sum_of(window.slots.as_ref());
        window.head = (len - 1) as u16;
        let allowed = window.admit(policy, now, cost);
        *newest = window.newest;
        Some(allowed)
    }

    /// The number of buckets `n`.
    pub fn buckets(&self) -> usize {
        self.slots.as_ref().len()
    }

    /// The newest bucket index and the slots: what
    /// [`SlidingWindow::from_parts`] needs to rebuild this ring.
    pub fn into_parts(self) -> (u64, R) {
        (self.newest, self.slots)
    }

    /// The absolute index of the newest bucket seen.
    pub fn newest(&self) -> u64 {
        self.newest
    }

    /// The sum of all slots: every unit the ring holds, whether or not it
    /// still counts. It never counts more at any later instant.
    pub fn total(&self) -> u64 {
        self.total
    }

    fn n(&self) -> u64 {
        self.slots.as_ref().len() as u64
    }

    #[inline]
    fn next(&self, i: usize) -> usize {
        if i + 1 == self.slots.as_ref().len() { 0 } else { i + 1 }
    }

    /// The slot of bucket `newest − d`, for `d < n`.
    #[inline]
    fn slot_back(&self, d: u64) -> usize {
        let (i, d) = (usize::from(self.newest_slot), d as usize);
        if i >= d {
            i - d
        } else {
            i + self.slots.as_ref().len() - d
        }
    }

    /// Moves the ring forward to `bucket ≥ newest`, zeroing the slots that
    /// left it (at most `n`) and keeping the running total; returns the slot
    /// of `bucket`.
    #[inline]
    fn advance_to(&mut self, ring: Divisor, bucket: u64) -> usize {
        let gap = bucket - self.newest;
        if gap == 0 {
            return usize::from(self.newest_slot);
        }
        let n = self.n();
        let i = if gap >= n {
            self.slots.as_mut().fill(S::default());
            self.total = 0;
            (if ring.get() == n { ring.rem(bucket) } else { bucket % n }) as usize
        } else {
            let mut i = usize::from(self.newest_slot);
            for _ in 0..gap {
                i = self.next(i);
                self.total = self.total.saturating_sub(self.slots.as_ref()[i].get());
                self.slots.as_mut()[i] = S::default();
            }
            i
        };
        self.newest = bucket;
        self.newest_slot = i as u16;
        self.lag = sat16(u64::from(self.lag).saturating_add(gap));
        self.head = sat16(u64::from(self.head).saturating_add(gap));
        i
    }

    /// Counts `cost` in bucket `own` (in the ring), in slot `k`.
    #[inline]
    fn add(&mut self, own: u64, k: usize, cost: u64) {
        self.retry_cost = 0;
        let was_empty = self.total == 0;
        let before = self.slots.as_ref()[k].get();
        self.slots.as_mut()[k] = self.slots.as_ref()[k].plus(cost);
        self.total = self.total.saturating_add(self.slots.as_ref()[k].get() - before);
        // `own` is in the ring: less than n ≤ 2¹⁶ behind `newest`.
        let d = sat16(self.newest - own);
        if was_empty {
            (self.lag, self.head) = (d, d);
        } else {
            self.lag = self.lag.min(d);
            self.head = self.head.max(d);
        }
    }

    /// The ring for a request in bucket `own`, `rem` ns into it, computed
    /// without changing the ring.
    #[inline]
    fn view(&self, own: u64, rem: u64, ring: Divisor) -> View {
        let (bucket, elapsed) = if own >= self.newest {
            (own, rem)
        } else {
            (self.newest, 0)
        };
        let n = self.n();
        let gap = bucket - self.newest;
        let (slot, total) = if gap >= n {
            (
                (if ring.get() == n { ring.rem(bucket) } else { bucket % n }) as usize,
                0,
            )
        } else {
            // Buckets newest − n + 1 ..= bucket − n leave the ring; their
            // slots are those of newest + 1 ..= bucket.
            let (mut i, mut total) = (usize::from(self.newest_slot), self.total);
            for _ in 0..gap {
                i = self.next(i);
                total = total.saturating_sub(self.slots.as_ref()[i].get());
            }
            (i, total)
        };
        // The oldest bucket sits in the slot after `bucket`'s; it is a real,
        // kept bucket unless the ring is empty or `bucket < n − 1`.
        let oldest = if gap < n && bucket >= n - 1 {
            self.slots.as_ref()[self.next(slot)].get()
        } else {
            0
        };
        View {
            own,
            bucket,
            elapsed,
            gap,
            slot,
            total,
            oldest,
        }
    }

    fn in_ring(&self, v: &View) -> bool {
        v.bucket - v.own < self.n()
    }

    /// When all counted usage has expired: the newest non-empty bucket
    /// `newest − lag` stops counting `n` buckets later. `total` is the sum
    /// of the ring as `v` sees it.
    #[inline]
    fn reset_at(&self, v: &View, total: u64, b: u64) -> u64 {
        // If the newest non-empty bucket had left the ring, so would every
        // other one, and `total` would be 0.
        if total == 0 || v.gap >= self.n() {
            return 0;
        }
        let last = self.newest - u64::from(self.lag);
        saturate((u128::from(last) + u128::from(self.n())) * u128::from(b))
    }

    /// How many slots forward from slot `i` (0 for `i` itself, wrapping)
    /// the first non-zero slot is, looking at `steps` slots at most.
    fn ahead_to_nonzero(&self, i: usize, steps: usize) -> Option<usize> {
        let near = &self.slots.as_ref()[i..self.slots.as_ref().len().min(i + steps)];
        if let Some(p) = first_nonzero(near) {
            return Some(p);
        }
        let far = &self.slots.as_ref()[..(steps - near.len()).min(i)];
        first_nonzero(far).map(|p| near.len() + p)
    }

    /// The earliest instant at which `cost` units fit, if nothing else
    /// arrives, and a tighter `head` when the scan found one. Requires
    /// `cost ≤ limit`.
    #[inline(never)]
    fn retry_at(&self, v: &View, weighting: Weighting, b: u64, limit: u64, cost: u64) -> (u64, Option<u16>) {
        let n = self.n();
        let fits_at = |rest: u64, oldest: u64, e_from: u64| -> Option<u64> {
            // rest·b + oldest·w(e) + cost·b ≤ limit·b, for the least e ≥ e_from.
            let room = limit.checked_sub(rest)?.checked_sub(cost)?;
            let room = u128::from(room) * u128::from(b);
            let e = match weighting {
                _ if oldest == 0 => e_from,
                Weighting::Conservative => {
                    if u128::from(oldest) * u128::from(b) <= room {
                        e_from
                    } else {
                        return None;
                    }
                }
                Weighting::Interpolated => {
                    // oldest·(b − e) ≤ room  ⇔  e ≥ b − ⌊room / oldest⌋
                    let q = div_wide(room, oldest);
                    let least = if q >= u128::from(b) { 0 } else { b - q as u64 };
                    least.max(e_from)
                }
            };
            (e < b).then_some(e)
        };
        let mut rest = v.total.saturating_sub(v.oldest);
        let mut oldest = v.oldest;
        if !self.in_ring(v) && fits_at(rest, oldest, 0) == Some(0) {
            // Judged as at the start of `bucket`, it fits; it only has to wait
            // until its own bucket is back in the ring.
            return (saturate(u128::from(v.bucket - (n - 1)) * u128::from(b)), None);
        }
        let mut e_from = v.elapsed;
        // At step k the ring has reached bucket + k; its oldest bucket is
        // bucket − n + 1 + k, in slot (slot + 1 + k) mod n. Real buckets lie
        // in lo ≤ k ≤ hi; the others (before 0, or after `newest` in a
        // peek's virtual advance) hold nothing, whatever their slots say.
        let lo = (n - 1).saturating_sub(v.bucket);
        let hi = n - 1 - v.gap.min(n - 1);
        let len = self.slots.as_ref().len();
        let slot_at = |k: u64| {
            let x = v.slot + 1 + k as usize;
            if x >= len { x - len } else { x }
        };
        let all_gone = || (saturate((u128::from(v.bucket) + u128::from(n)) * u128::from(b)), None);
        // The step whose oldest bucket is `newest − head`: the ones before
        // it have empty oldest buckets.
        let k_head = (n - 1).saturating_sub(v.gap).saturating_sub(u64::from(self.head));
        let mut hint = None;
        let mut k = 0;
        loop {
            if let Some(e) = fits_at(rest, oldest, e_from) {
                return (
                    saturate((u128::from(v.bucket) + u128::from(k)) * u128::from(b) + u128::from(e)),
                    hint,
                );
            }
            let failed_empty = oldest == 0;
            k += 1;
            if failed_empty {
                // Steps whose oldest bucket is empty fail the same way:
                // jump to the next non-empty one.
                let from = k.max(lo).max(k_head);
                if from > hi {
                    return all_gone();
                }
                match self.ahead_to_nonzero(slot_at(from), (hi - from + 1) as usize) {
                    Some(d) => {
                        // From the very oldest bucket on, everything before
                        // this one is empty: a tighter head.
                        if k == 1 {
                            hint = Some(sat16(n - 1 - v.gap - (from + d as u64)));
                        }
                        k = from + d as u64;
                    }
                    None => return all_gone(),
                }
            }
            if k >= n {
                return all_gone();
            }
            oldest = if (lo..=hi).contains(&k) {
                self.slots.as_ref()[slot_at(k)].get()
            } else {
                0
            };
            rest = rest.saturating_sub(oldest);
            e_from = 0;
        }
    }
}

/// The sum of `slots`, saturating at `u64::MAX`. Slots of at most 32 bits
/// cannot reach it in a ring (at most 2¹⁶ of them: below 2⁴⁸), so they add
/// plainly, which the compiler can vectorise; a longer slice, which no
/// ring has, and wider slots saturate.
#[inline]
fn sum_of<S: Slot>(slots: &[S]) -> u64 {
    if S::MAX <= u64::from(u32::MAX) && slots.len() <= Policy::MAX_BUCKETS as usize {
        slots.iter().map(|s| s.get()).sum()
    } else {
        saturating_sum(slots.iter().map(|s| s.get()))
    }
}

/// The slot of bucket `bucket` in a ring of `len ≥ 1` slots: with the
/// policy's divisor when `len` is its number of buckets, else a division.
#[inline]
fn slot_of(policy: &Policy, bucket: u64, len: usize) -> u64 {
    let ring = policy.ring();
    if ring.get() == len as u64 {
        ring.rem(bucket)
    } else {
        bucket % (len as u64).max(1)
    }
}

/// `x` as a `u16`, saturating.
fn sat16(x: u64) -> u16 {
    u16::try_from(x).unwrap_or(u16::MAX)
}

/// Slots are scanned in chunks, each OR-ed whole (unrolled, no early exit).
const CHUNK: usize = 16;

/// The index of the first non-zero slot.
fn first_nonzero<S: Slot>(slots: &[S]) -> Option<usize> {
    let (chunks, tail) = slots.as_chunks::<CHUNK>();
    for (c, chunk) in chunks.iter().enumerate() {
        // A fixed-size OR with no early exit, which the compiler unrolls.
        if chunk.iter().fold(0u64, |any, &s| any | s.get()) != 0 {
            return chunk.iter().position(|s| s.get() != 0).map(|p| c * CHUNK + p);
        }
    }
    tail.iter()
        .position(|s| s.get() != 0)
        .map(|p| slots.len() - tail.len() + p)
}

fn weighting(policy: &Policy) -> Weighting {
    match policy.algorithm() {
        Algorithm::SlidingWindow { weighting, .. } => weighting,
        _ => Weighting::Interpolated,
    }
}

/// The oldest bucket's part of the estimate, scaled by `b`: `oldest·w`
/// with `w = b − elapsed` (interpolated) or `b` (conservative).
#[inline]
fn oldest_part(weighting: Weighting, oldest: u64, elapsed: u64, b: u64) -> u128 {
    let w = match weighting {
        Weighting::Conservative => b,
        Weighting::Interpolated => b - elapsed,
    };
    u128::from(oldest) * u128::from(w)
}

/// `rest + part / b` as a float, for reporting.
#[inline]
fn estimate_of(step: Divisor, rest: u64, part: u128) -> f64 {
    let (q, r) = step.div_rem_wide(part);
    let frac = if r == 0 { 0.0 } else { r as f64 / step.get() as f64 };
    rest as f64 + q as f64 + frac
}

/// The arithmetic of an in-order decision.
struct Judgement {
    allowed: bool,
    /// The oldest bucket's count.
    oldest: u64,
    /// Its part of the estimate, scaled by `b`.
    part: u128,
    /// The rest of the ring.
    rest: u64,
    /// `limit − rest`, saturating.
    free: u64,
}

impl<S: Slot, R: AsRef<[S]> + AsMut<[S]>> SlidingWindow<S, R> {
    /// Where `now` falls: its bucket and how far into it, without a division
    /// when that is the newest bucket or the next one.
    #[inline]
    fn locate(&self, policy: &Policy, now: u64) -> (u64, u64) {
        let b = policy.step_ns();
        let start = self.newest.saturating_mul(b);
        if now >= start {
            let rem = now - start;
            if rem < b {
                return (self.newest, rem);
            }
            if rem - b < b {
                return (self.newest + 1, rem - b);
            }
        }
        policy.step().div_rem(now)
    }

    /// Whether `cost` fits at `rem` ns into bucket `own` (the newest, in
    /// slot `slot`): `rest·b + oldest·w + cost·b ≤ limit·b`.
    #[inline]
    fn judge(&self, policy: &Policy, weighting: Weighting, own: u64, rem: u64, slot: usize, cost: u64) -> Judgement {
        let b = policy.step_ns();
        let oldest = if own >= self.n() - 1 {
            self.slots.as_ref()[self.next(slot)].get()
        } else {
            0
        };
        let part = oldest_part(weighting, oldest, rem, b);
        let rest = self.total.saturating_sub(oldest);
        let free = policy.limit().saturating_sub(rest);
        let allowed = cost <= free && part <= u128::from(free - cost) * u128::from(b);
        Judgement {
            allowed,
            oldest,
            part,
            rest,
            free,
        }
    }

    /// The common case, with fewer branches: a request that counts (`cost >
    /// 0`) in time order (`own ≥ newest`). Decides exactly as
    /// [`Self::check_any`] does, which the property tests check.
    #[inline]
    fn check_in_order(&mut self, policy: &Policy, now: u64, own: u64, rem: u64, cost: u64) -> Decision {
        let b = policy.step_ns();
        let limit = policy.limit();
        let weighting = weighting(policy);
        let slot = self.advance_to(policy.ring(), own);
        let n = self.n();
        let Judgement {
            allowed,
            oldest,
            part,
            rest,
            free,
        } = self.judge(policy, weighting, own, rem, slot, cost);
        // remaining = free − ⌈part / b⌉ and estimate = rest + part / b are
        // worked out when asked for; a part beyond u64 is reduced now.
        let (used, frac, free) = match u64::try_from(part) {
            Ok(part) => (rest, part, free),
            Err(_) => {
                let (q, r) = policy.step().div_rem_wide(part);
                (rest.saturating_add(q), r, free.saturating_sub(q))
            }
        };
        if allowed {
            // Counted in bucket `own`, the newest non-empty one now:
            // everything has expired once it leaves the ring, at (own + n)·b.
            self.add(own, slot, cost);
            let reset_at = saturate((u128::from(own) + u128::from(n)) * u128::from(b));
            let free = free - cost;
            return Decision {
                allowed,
                limit,
                now,
                reset_at,
                retry_at: None,
                free,
                debt: frac,
                used,
                frac,
                den: b,
            };
        }
        let v = View {
            own,
            bucket: own,
            elapsed: rem,
            gap: 0,
            slot,
            total: self.total,
            oldest,
        };
        let retry_at = (cost <= limit).then(|| {
            if u64::from(self.retry_cost) == cost && now < self.retry_at {
                return self.retry_at;
            }
            let (at, head) = self.retry_at(&v, weighting, b, limit, cost);
            self.head = head.unwrap_or(self.head);
            (self.retry_cost, self.retry_at) = (u16::try_from(cost).unwrap_or(0), at);
            at
        });
        let reset_at = self.reset_at(&v, self.total, b);
        Decision {
            allowed,
            limit,
            now,
            reset_at,
            retry_at,
            free,
            debt: frac,
            used,
            frac,
            den: b,
        }
    }

    /// [`LimitState::admit`] past its hot path (a bucket crossed, an
    /// interpolated refusal, a late request or a peek): out of line, so
    /// that the hot path's caller keeps a small frame.
    #[inline(never)]
    fn admit_beyond(&mut self, policy: &Policy, now: u64, cost: u64) -> bool {
        let (own, rem) = self.locate(policy, now);
        if cost > 0 && own >= self.newest {
            let slot = self.advance_to(policy.ring(), own);
            let allowed = self.judge(policy, weighting(policy), own, rem, slot, cost).allowed;
            if allowed {
                self.add(own, slot, cost);
            }
            return allowed;
        }
        self.check_any(policy, now, own, rem, cost).allowed()
    }

    /// Any request: late or peeking. Out of line, so that the in-order
    /// path's caller keeps a small frame.
    #[inline(never)]
    fn check_any(&mut self, policy: &Policy, now: u64, own: u64, rem: u64, cost: u64) -> Decision {
        let (step, ring) = (policy.step(), policy.ring());
        let b = step.get();
        let limit = policy.limit();
        let weighting = weighting(policy);
        if cost > 0 && own > self.newest {
            self.advance_to(ring, own);
        }
        let v = self.view(own, rem, ring);
        let rest = v.total.saturating_sub(v.oldest);
        let part = oldest_part(weighting, v.oldest, v.elapsed, b);
        let in_ring = self.in_ring(&v);
        // Units left for the oldest bucket's part and this request:
        // admitted when rest·b + part + cost·b ≤ limit·b.
        let free = limit.checked_sub(rest);
        let allowed = in_ring
            && free
                .and_then(|f| f.checked_sub(cost))
                .is_some_and(|f| part <= u128::from(f) * u128::from(b));
        let mut total = v.total;
        if allowed && cost > 0 {
            self.add(v.own, self.slot_back(v.bucket - v.own), cost);
            total = self.total;
        }
        // ⌊(limit·b − used_after) / b⌋ = free_after − ⌈part / b⌉.
        let (q, r) = step.div_rem_wide(part);
        let remaining = match free {
            Some(f) if in_ring => {
                let f = if allowed { f - cost } else { f };
                f.saturating_sub(q).saturating_sub(u64::from(r > 0))
            }
            _ => 0,
        };
        let retry_at = (!allowed && cost <= limit).then(|| self.retry_at(&v, weighting, b, limit, cost).0);
        let estimate = (rest.saturating_add(q), r, b);
        Decision::at(
            policy,
            now,
            allowed,
            remaining,
            self.reset_at(&v, total, b),
            retry_at,
            estimate,
        )
    }
}

impl<S: Slot, R: AsRef<[S]> + AsMut<[S]>> LimitState for SlidingWindow<S, R> {
    #[inline]
    fn check(&mut self, policy: &Policy, now: u64, cost: u64) -> Decision {
        let (own, rem) = self.locate(policy, now);
        if cost > 0 && own >= self.newest {
            return self.check_in_order(policy, now, own, rem, cost);
        }
        self.check_any(policy, now, own, rem, cost)
    }

    /// The same decision and new state as `check` (but for the `head` hint,
    /// which only speeds up `retry_after`), without building a [`Decision`]
    /// for a request in time order.
    #[inline]
    fn admit(&mut self, policy: &Policy, now: u64, cost: u64) -> bool {
        // The hot path: a request in the newest bucket, which needs no
        // advance. If it fits with every unit of the ring counted whole
        // (the most any weighting counts), it is admitted; if it does not,
        // conservative weighting (which counts the oldest bucket whole)
        // refuses it, and interpolated weighting weighs the oldest bucket.
        if cost > 0
            && let Some(elapsed) = elapsed_in(self.newest, policy.step_ns(), now)
        {
            let (newest, slot) = (self.newest, usize::from(self.newest_slot));
            let allowed = fits(policy.limit(), self.total, cost)
                || (weighting(policy) == Weighting::Interpolated
                    && self
                        .judge(policy, Weighting::Interpolated, newest, elapsed, slot, cost)
                        .allowed);
            if allowed {
                self.add(newest, slot, cost);
            }
            return allowed;
        }
        self.admit_beyond(policy, now, cost)
    }

    fn record(&mut self, policy: &Policy, now: u64, cost: u64) {
        let own = policy.step().div_rem(now).0;
        if own > self.newest {
            self.advance_to(policy.ring(), own);
        }
        if self.newest - own < self.n() && cost > 0 {
            self.add(own, self.slot_back(self.newest - own), cost);
        }
    }

    fn expires_at(&self, policy: &Policy) -> u64 {
        if self.total == 0 {
            return 0;
        }
        // The newest non-empty bucket, `newest − lag`, leaves the ring `n`
        // buckets later; every older one has left by then.
        let last = self.newest - u64::from(self.lag);
        saturate((u128::from(last) + u128::from(self.n())) * u128::from(policy.step_ns()))
    }

    fn estimate(&self, policy: &Policy, now: u64) -> f64 {
        let (own, rem) = policy.step().div_rem(now);
        let v = self.view(own, rem, policy.ring());
        let b = policy.step_ns();
        estimate_of(
            policy.step(),
            v.total.saturating_sub(v.oldest),
            oldest_part(weighting(policy), v.oldest, v.elapsed, b),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::time::Duration;

    fn ring(buckets: u32, window_ns: u64, limit: u64, weighting: Weighting) -> (Policy, SlidingWindow<u32>) {
        let p = Policy::new(
            limit,
            Duration::from_nanos(window_ns),
            Algorithm::SlidingWindow { buckets, weighting },
        )
        .unwrap();
        let s = SlidingWindow::new(&p);
        (p, s)
    }

    /// A ring's sum, by slot width: plain for the narrow slots (a ring's
    /// most slots at their largest included), saturating for `u64`.
    #[test]
    fn slot_sums() {
        let most = Policy::MAX_BUCKETS as usize;
        assert_eq!(sum_of(&vec![u32::MAX; most]), u64::from(u32::MAX) * most as u64);
        assert_eq!(sum_of(&vec![u16::MAX; most]), u64::from(u16::MAX) * most as u64);
        assert_eq!(
            sum_of(&vec![u32::MAX; most + 1]),
            u64::from(u32::MAX) * (most as u64 + 1)
        );
        assert_eq!(sum_of(&[3u32, 0, 4]), 7);
        assert_eq!(sum_of::<u32>(&[]), 0);
        assert_eq!(sum_of(&[u64::MAX - 1, 5, 1]), u64::MAX);
        assert_eq!(sum_of(&[2u64, 5]), 7);
    }

    /// Every assert of seed 000's `main()`.
    #[test]
    fn seed_000_exact_weighting() {
        // 4 buckets of 10 ns: window 30 ns.
        let (p, mut c) = ring(4, 30, 1000, Weighting::Interpolated);
        assert_eq!(p.step_ns(), 10);
        for t in [5, 15, 25, 35] {
            c.record(&p, t, 8);
        }
        assert_eq!(c.estimate(&p, 35), 24.0 + 8.0 * 0.5); // oldest bucket half expired
        assert_eq!(c.estimate(&p, 40), 24.0); // bucket 0 gone, bucket 1 fully in
        assert_eq!(c.estimate(&p, 1_000), 0.0); // idle longer than the window
    }

    #[test]
    fn seed_000_two_buckets_limit() {
        // Two buckets = previous + current. Limit 10 per 1000 ns.
        let (p, mut l) = ring(2, 1000, 10, Weighting::Interpolated);
        for _ in 0..10 {
            assert!(l.check(&p, 999, 1).allowed());
        }
        assert!(!l.check(&p, 1000, 1).allowed()); // a fixed window would reset here and admit 10 more
        assert!(l.check(&p, 1500, 1).allowed()); // previous bucket now weighs 0.5 -> estimate 5
        for _ in 0..4 {
            assert!(l.check(&p, 1500, 1).allowed());
        }
        assert!(!l.check(&p, 1500, 1).allowed());
    }

    #[test]
    fn seed_000_late_events() {
        // Late event goes to its own bucket; too-old event is dropped.
        let (p, mut c) = ring(3, 20, 1000, Weighting::Interpolated);
        c.record(&p, 25, 1);
        c.record(&p, 15, 1);
        c.record(&p, 5, 1); // bucket 0 is still in the ring
        assert_eq!(c.estimate(&p, 25), 1.0 + 1.0 + 0.5); // oldest bucket weighs 0.5
        c.record(&p, 35, 1);
        c.record(&p, 5, 1); // bucket 0 is gone: dropped
        assert_eq!(c.estimate(&p, 35), 1.0 + 1.0 + 0.5); // buckets 3, 2 + half of 1
    }

    /// Seed 003: limit 100, window 10, two buckets.
    #[test]
    fn seed_003_scenario() {
        let (p, mut s) = ring(2, 10, 100, Weighting::Interpolated);
        for t in [0, 1, 2, 10] {
            assert!(s.check(&p, t, 1).allowed());
        }
        assert_eq!(s.estimate(&p, 10), 4.0);
        assert_eq!(s.estimate(&p, 15), 2.5);
    }

    /// Seed 004: previous minute 40, current 30, 30 s in: 30 + 40 × 0.5 = 50.
    /// Seed 002: previous 80, current 30, 15 s in: 80 × 45/60 + 30 = 90; at
    /// 45 s in: 80 × 15/60 + 30 = 50.
    #[test]
    fn seed_002_and_004_worked_examples() {
        let minute = 60_000_000_000;
        let (p, mut s) = ring(2, minute, 100, Weighting::Interpolated);
        s.record(&p, 1, 40);
        s.record(&p, minute, 30);
        assert_eq!(s.estimate(&p, minute + 30_000_000_000), 50.0);

        let mut s = SlidingWindow::<u32>::new(&p);
        s.record(&p, 1, 80);
        s.record(&p, minute, 30);
        assert_eq!(s.estimate(&p, minute + 15_000_000_000), 90.0);
        assert_eq!(s.estimate(&p, minute + 45_000_000_000), 50.0);
        let d = s.check(&p, minute + 15_000_000_000, 1);
        assert!(d.allowed());
        assert_eq!(d.estimate(), 90.0);
        assert_eq!(d.remaining(), 9);
    }

    #[test]
    fn conservative_counts_oldest_whole() {
        let (p, mut s) = ring(2, 1000, 10, Weighting::Conservative);
        for _ in 0..10 {
            assert!(s.check(&p, 999, 1).allowed());
        }
        let d = s.check(&p, 1500, 1);
        assert!(!d.allowed());
        assert_eq!(d.estimate(), 10.0);
        // Everything leaves when bucket 0 leaves the ring, at 2000.
        assert_eq!(d.retry_after(), Some(Duration::from_nanos(500)));
        assert_eq!(d.reset_after(), Duration::from_nanos(500));
        assert!(!s.check(&p, 1999, 1).allowed());
        assert!(s.check(&p, 2000, 1).allowed());
    }

    #[test]
    fn retry_after_follows_linear_decay() {
        // 10 at t = 999; at t = 1000 the oldest weighs 1.0 → estimate 10.
        // One unit fits when 10·(1000 − e)/1000 ≤ 9, i.e. e ≥ 100.
        let (p, mut s) = ring(2, 1000, 10, Weighting::Interpolated);
        assert!(s.check(&p, 999, 10).allowed());
        let d = s.check(&p, 1000, 1);
        assert_eq!(d.retry_after(), Some(Duration::from_nanos(100)));
        assert!(!s.check(&p, 1099, 1).allowed());
        assert!(s.check(&p, 1100, 1).allowed());
        // Reset: bucket 1 (count 1) leaves at 3000.
        assert_eq!(s.check(&p, 1100, 0).reset_after(), Duration::from_nanos(1900));
    }

    #[test]
    fn retry_after_skips_whole_buckets() {
        // 3 buckets of 10 ns, window 20. 5 in bucket 0, 5 in bucket 1, limit 10.
        let (p, mut s) = ring(3, 20, 10, Weighting::Interpolated);
        assert!(s.check(&p, 0, 5).allowed());
        assert!(s.check(&p, 10, 5).allowed());
        // At 12 the ring is buckets −1, 0, 1: the estimate is 10. Cost 6
        // needs the estimate ≤ 4: bucket 0 (5) is the oldest in bucket 2 and
        // gone in bucket 3, where bucket 1 (5) decays: 5·(10 − e)/10 ≤ 4 ⇔
        // e ≥ 2 → 32.
        let d = s.check(&p, 12, 6);
        assert!(!d.allowed());
        assert_eq!(d.estimate(), 10.0);
        assert_eq!(d.retry_after(), Some(Duration::from_nanos(20)));
        assert!(!s.check(&p, 31, 6).allowed());
        assert!(s.check(&p, 32, 6).allowed());
    }

    #[test]
    fn peek_and_oversized_costs() {
        let (p, mut s) = ring(8, 70, 5, Weighting::Interpolated);
        let before = s.clone();
        let d = s.check(&p, 1_000, 0);
        assert!(d.allowed());
        assert_eq!(d.remaining(), 5);
        assert_eq!(d.reset_after(), Duration::ZERO);
        assert_eq!(s, before, "a zero cost never changes the state");
        let d = s.check(&p, 1_000, 6);
        assert!(!d.allowed());
        assert_eq!(d.retry_after(), None);
        let d = s.check(&p, u64::MAX, u64::MAX);
        assert!(!d.allowed());
        assert!(s.check(&p, u64::MAX, 5).allowed());
        assert!(!s.check(&p, u64::MAX, 1).allowed());
    }

    #[test]
    fn late_events_out_of_the_ring_are_refused() {
        let (p, mut s) = ring(2, 10, 5, Weighting::Interpolated);
        assert!(s.check(&p, 35, 1).allowed()); // bucket 3
        let d = s.check(&p, 15, 1); // bucket 1: out of the ring [2, 3]
        assert!(!d.allowed());
        assert_eq!(d.remaining(), 0);
        // It would fit as soon as its own time is back in the ring, at 20.
        assert_eq!(d.retry_after(), Some(Duration::from_nanos(5)));
        assert!(s.check(&p, 20, 1).allowed()); // bucket 2: late, in the ring
        assert_eq!(s.newest(), 3, "newest never moves backwards");
    }

    #[test]
    fn wide_slots_hold_large_limits() {
        let p = Policy::new(u64::MAX, Duration::from_secs(1), Algorithm::TWO_BUCKETS).unwrap();
        let mut s = SlidingWindow::<u64>::new(&p);
        assert!(s.check(&p, 0, u64::MAX - 1).allowed());
        assert!(s.check(&p, 0, 1).allowed());
        assert!(!s.check(&p, 0, 1).allowed());
        assert_eq!(s.estimate(&p, 0), u64::MAX as f64);
    }
}
