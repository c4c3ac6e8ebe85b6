//! Exact references to test against, written as plainly as possible.

/// Every event `(time, cost)` kept forever; counts are recomputed by brute
/// force over the half-open window `(t − w, t]`.
#[derive(Clone, Debug, Default)]
pub struct ExactLog {
    /// The events, in the order they were pushed.
    pub events: Vec<(u64, u64)>,
}

impl ExactLog {
    /// Adds an event of `cost` at `t`.
    pub fn push(&mut self, t: u64, cost: u64) {
        self.events.push((t, cost));
    }

    /// Sum of costs with time in `(t − w, t]`.
    pub fn count(&self, t: u64, w: u64) -> u64 {
        let from = i128::from(t) - i128::from(w);
        self.events
            .iter()
            .filter(|&&(s, _)| i128::from(s) > from && s <= t)
            .map(|&(_, c)| c)
            .sum()
    }

    /// Sum of costs with time in `[from, to)`.
    pub fn between(&self, from: i128, to: i128) -> u64 {
        self.events
            .iter()
            .filter(|&&(s, _)| i128::from(s) >= from && i128::from(s) < to)
            .map(|&(_, c)| c)
            .sum()
    }

    /// The largest sum in any window `(s, s + w]`: it is reached by a window
    /// ending at an event.
    pub fn max_in_any_window(&self, w: u64) -> u64 {
        self.events.iter().map(|&(t, _)| self.count(t, w)).max().unwrap_or(0)
    }

    /// The largest sum in any fixed window `[k·w, (k + 1)·w)`.
    pub fn max_in_any_fixed_window(&self, w: u64) -> u64 {
        self.events
            .iter()
            .map(|&(t, _)| {
                let k = i128::from(t / w) * i128::from(w);
                self.between(k, k + i128::from(w))
            })
            .max()
            .unwrap_or(0)
    }
}

/// Seed 000's `SlidingCounter`, verbatim but for `f64` → exact checks in
/// the callers: the O(n) estimate straight from the slots.
#[derive(Clone, Debug)]
pub struct SeedCounter {
    slots: Vec<u64>,
    bucket_ns: u64,
    newest: u64,
}

impl SeedCounter {
    /// A counter of `n_slots ≥ 2` buckets of `bucket_ns > 0` ns.
    ///
    /// # Panics
    ///
    /// On arguments outside those ranges.
    pub fn new(n_slots: usize, bucket_ns: u64) -> Self {
        assert!(n_slots >= 2 && bucket_ns > 0);
        SeedCounter {
            slots: vec![0; n_slots],
            bucket_ns,
            newest: 0,
        }
    }

    fn advance(&mut self, b: u64) {
        if b > self.newest {
            let n = self.slots.len() as u64;
            for i in 1..=(b - self.newest).min(n) {
                self.slots[((self.newest + i) % n) as usize] = 0;
            }
            self.newest = b;
        }
    }

    /// Counts `count` at `now_ns` (dropped if its bucket has left the ring).
    pub fn add(&mut self, now_ns: u64, count: u64) {
        let b = now_ns / self.bucket_ns;
        self.advance(b);
        let n = self.slots.len() as u64;
        if self.newest - b < n {
            self.slots[(b % n) as usize] += count;
        }
    }

    /// The seed's estimate of the window ending at `now_ns`: every bucket
    /// but the oldest, plus the part of the oldest still in the window.
    pub fn estimate(&mut self, now_ns: u64) -> f64 {
        let b = (now_ns / self.bucket_ns).max(self.newest);
        self.advance(b);
        let n = self.slots.len() as u64;
        let elapsed = if now_ns / self.bucket_ns >= b {
            now_ns % self.bucket_ns
        } else {
            0
        };
        let oldest = self.slots[((b + 1) % n) as usize] as f64;
        let rest: u64 = self.slots.iter().sum::<u64>() - oldest as u64;
        let kept = (self.bucket_ns - elapsed) as f64 / self.bucket_ns as f64;
        rest as f64 + oldest * kept
    }
}

/// The textbook GCRA (virtual scheduling): a cell at `t` conforms when
/// `TAT ≤ t + τ`, and then `TAT = max(TAT, t) + T`. A request of `cost`
/// cells passes when all of them, one after the other at `t`, conform.
#[derive(Clone, Debug)]
pub struct TextbookGcra {
    /// The theoretical arrival time of the next cell.
    pub tat: u128,
    /// The emission interval `T`.
    pub interval: u128,
    /// The tolerance `τ`.
    pub tau: u128,
}

impl TextbookGcra {
    /// Whether `cost` cells at `t` conform; if they do, they are counted.
    pub fn request(&mut self, t: u64, cost: u64) -> bool {
        let t = u128::from(t);
        let mut tat = self.tat;
        for _ in 0..cost {
            if tat > t + self.tau {
                return false;
            }
            tat = tat.max(t) + self.interval;
        }
        self.tat = tat;
        true
    }
}
