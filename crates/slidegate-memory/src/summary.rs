//! What evicted keys still held: a small conservative sketch per shard.
//!
//! A count-min sketch of [`ROWS`] rows of `width` cells, indexed by
//! independent mixes of the key's (seeded) hash. Each cell keeps the most
//! units any key folded into it still held and the latest instant those
//! units stop counting; cells combine with `max`, and a cell whose instant
//! has passed reads as empty. A key's estimate is the least of its cells
//! over the rows, so it is never below what the key held when it was
//! evicted, until that expired: collisions only over-count.

/// Rows of the sketch: a key is over-counted only if each of its cells is
/// shared with a key that held more.
pub(crate) const ROWS: usize = 4;

/// Cells per row for a shard of `slots` slots: one per 16 slots, 8 to 256
/// (so a row never costs more than 3/4 of a byte per slot).
pub(crate) fn width_for(slots: usize) -> usize {
    (slots / 16).clamp(8, 256).next_power_of_two()
}

/// Bytes of a sketch of `width` cells per row.
pub(crate) fn bytes_for(width: usize) -> usize {
    ROWS * width * (size_of::<u32>() + size_of::<u64>())
}

/// What the summary says a key not in the table may still hold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Seed {
    /// Units that may still count (0: none known).
    pub(crate) count: u64,
    /// The instant until which they may count, at the latest (0: none).
    pub(crate) until: u64,
}

/// One shard's sketch of what its evicted keys held.
#[derive(Debug)]
pub(crate) struct Summary {
    /// Units held, row after row; `u32::MAX` reads as "any number".
    count: Box<[u32]>,
    /// Until when each cell's units count.
    until: Box<[u64]>,
    /// `64 − log₂(width)`: a row's cell is the top bits of a mix.
    shift: u32,
    width: usize,
    /// The latest `until` of any cell: from then on every cell is empty,
    /// and an estimate needs no look at them.
    latest: u64,
}

/// splitmix64's finalizer: every output bit depends on every input bit.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Summary {
    /// An empty sketch of `width` (a power of two) cells per row.
    pub(crate) fn new(width: usize) -> Self {
        let width = width.max(1).next_power_of_two();
        Summary {
            count: vec![0; ROWS * width].into_boxed_slice(),
            until: vec![0; ROWS * width].into_boxed_slice(),
            shift: 64 - width.ilog2(),
            width,
            latest: 0,
        }
    }

    /// Bytes the sketch takes (allocated whole when it is built).
    pub(crate) fn bytes(&self) -> usize {
        bytes_for(self.width)
    }

    /// Cells in all.
    pub(crate) fn cells(&self) -> usize {
        self.count.len()
    }

    /// The cell of `hash` in each row.
    fn cells_of(&self, hash: u64) -> [usize; ROWS] {
        let mut cells = [0; ROWS];
        for (row, cell) in cells.iter_mut().enumerate() {
            // A shift of 64 (one cell per row) would overflow: mask instead.
            let x = mix(hash.wrapping_add((row as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)));
            let col = x.checked_shr(self.shift).unwrap_or(0) as usize & (self.width - 1);
            *cell = row * self.width + col;
        }
        cells
    }

    /// Folds in a key evicted at `now` that still held `count` units,
    /// counting until `until` at the latest.
    pub(crate) fn fold(&mut self, hash: u64, count: u64, until: u64, now: u64) {
        if until <= now {
            return;
        }
        let count = u32::try_from(count).unwrap_or(u32::MAX);
        self.latest = self.latest.max(until);
        for c in self.cells_of(hash) {
            // An expired cell holds nothing: its old count must not revive.
            let old = if self.until[c] > now { self.count[c] } else { 0 };
            self.count[c] = old.max(count);
            self.until[c] = self.until[c].max(until);
        }
    }

    /// What a key of `hash` arriving at `now` may still hold: the least of
    /// its cells, an expired cell reading as empty.
    pub(crate) fn estimate(&self, hash: u64, now: u64) -> Seed {
        if now >= self.latest {
            return Seed::default();
        }
        let mut seed = Seed {
            count: u64::MAX,
            until: u64::MAX,
        };
        for c in self.cells_of(hash) {
            let (count, until) = if self.until[c] > now {
                let count = self.count[c];
                let count = if count == u32::MAX { u64::MAX } else { u64::from(count) };
                (count, self.until[c])
            } else {
                (0, 0)
            };
            seed.count = seed.count.min(count);
            seed.until = seed.until.min(until);
        }
        seed
    }

    /// Cells that still hold something at `now`.
    pub(crate) fn live(&self, now: u64) -> usize {
        self.until.iter().filter(|&&u| u > now).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn sizes() {
        assert_eq!(width_for(8), 8);
        assert_eq!(width_for(64), 8);
        assert_eq!(width_for(1 << 12), 256);
        assert_eq!(width_for(1 << 15), 256);
        assert_eq!(Summary::new(256).bytes(), 12 << 10);
        assert!(bytes_for(width_for(1 << 11)) <= 3 << 11);
    }

    /// A key folded in reads back at least what it held, until it expires,
    /// then as empty.
    #[test]
    fn reads_back_until_expiry() {
        let mut s = Summary::new(8);
        s.fold(42, 7, 100, 10);
        assert_eq!(s.estimate(42, 10), Seed { count: 7, until: 100 });
        assert_eq!(s.estimate(42, 99), Seed { count: 7, until: 100 });
        assert_eq!(s.estimate(42, 100), Seed::default());
        assert_eq!(s.live(99), ROWS);
        assert_eq!(s.live(100), 0);
        // A fold already expired changes nothing.
        s.fold(43, 5, 10, 10);
        assert_eq!(s.live(0), ROWS);
    }

    /// An expired cell's count does not come back with a new fold.
    #[test]
    fn expired_counts_do_not_revive() {
        let mut s = Summary::new(8);
        s.fold(1, 50, 100, 0);
        s.fold(1, 2, 300, 200);
        assert_eq!(s.estimate(1, 200), Seed { count: 2, until: 300 });
    }

    /// Counts past `u32::MAX` read as any number, never fewer.
    #[test]
    fn huge_counts_saturate_upwards() {
        let mut s = Summary::new(8);
        s.fold(1, u64::MAX - 1, 100, 0);
        assert_eq!(s.estimate(1, 0).count, u64::MAX);
    }

    proptest! {
        /// Any folds: every key's estimate is at least what it held and
        /// lasts at least as long, while that counts; keys sharing cells
        /// only over-count.
        #[test]
        fn never_under_counts(
            width in prop::sample::select(vec![1usize, 8, 64]),
            folds in prop::collection::vec((0u64..40, 0u64..100, 0u64..500), 1..200),
            at in 0u64..600,
        ) {
            let mut s = Summary::new(width);
            let mut truth: std::collections::HashMap<u64, (u64, u64)> = Default::default();
            for (i, &(key, count, life)) in folds.iter().enumerate() {
                let now = i as u64;
                let hash = key.wrapping_mul(0x2545_f491_4f6c_dd1d);
                s.fold(hash, count, now + life, now);
                // The latest fold of a key is what it holds.
                truth.insert(key, (count, now + life));
            }
            let now = (folds.len() as u64).max(at);
            for (&key, &(count, until)) in &truth {
                let e = s.estimate(key.wrapping_mul(0x2545_f491_4f6c_dd1d), now);
                if until > now {
                    prop_assert!(e.count >= count && e.until >= until, "key {key}: {e:?} below {count} until {until}");
                }
            }
        }
    }
}
