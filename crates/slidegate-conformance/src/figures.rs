//! What a decision shows, for comparing decisions that were built apart.

use slidegate_core::Decision;
use std::time::Duration;

/// Every figure a [`Decision`] shows its caller. Two decisions with equal
/// figures are the same answer, even when they were built differently (a
/// store that decides elsewhere, such as a Redis script, builds its own with
/// [`Decision::at`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Figures {
    /// [`Decision::allowed`].
    pub allowed: bool,
    /// [`Decision::limit`].
    pub limit: u64,
    /// [`Decision::remaining`].
    pub remaining: u64,
    /// [`Decision::reset_after`].
    pub reset_after: Duration,
    /// [`Decision::retry_after`].
    pub retry_after: Option<Duration>,
    /// [`Decision::estimate`].
    pub estimate: f64,
}

impl Figures {
    /// The figures of `d`.
    pub fn of(d: &Decision) -> Self {
        Figures {
            allowed: d.allowed(),
            limit: d.limit(),
            remaining: d.remaining(),
            reset_after: d.reset_after(),
            retry_after: d.retry_after(),
            estimate: d.estimate(),
        }
    }

    /// The same figures with the durations multiplied by `k`: a decision
    /// made in another unit of time (microseconds read as nanoseconds, with
    /// `k = 1000`) as it reads in nanoseconds.
    pub fn scaled(self, k: u32) -> Self {
        Figures {
            reset_after: self.reset_after * k,
            retry_after: self.retry_after.map(|d| d * k),
            ..self
        }
    }
}
