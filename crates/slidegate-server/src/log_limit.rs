//! A rate limit for log lines: at most one line per interval for one kind
//! of event, each line saying how many events it stands for.
//!
//! An event an attacker can repeat (a wrong admin token, a connection
//! reset) must not cost a log line each: the log would grow as fast as the
//! attacker sends. [`LogLimit`] lets the first event of an interval log and
//! counts the others, so that the next line can say how many there were:
//!
//! ```
//! use slidegate_server::log_limit::LogLimit;
//! use std::time::{Duration, Instant};
//!
//! let limit = LogLimit::new(Duration::from_secs(10));
//! let start = Instant::now();
//! assert_eq!(limit.hit(start), Some(0)); // logs: the first event
//! assert_eq!(limit.hit(start + Duration::from_secs(1)), None); // counted, not logged
//! assert_eq!(limit.hit(start + Duration::from_secs(2)), None);
//! // Ten seconds after the last line: logs, with the 2 events since.
//! assert_eq!(limit.hit(start + Duration::from_secs(10)), Some(2));
//! ```
//!
//! Time is the caller's: `now` is passed in, from `std::time::Instant::now()`
//! or, to follow tokio's clock (paused in tests),
//! `tokio::time::Instant::now().into_std()`. One limit should be fed from
//! one source.

use parking_lot::Mutex;
use std::time::{Duration, Instant};

/// Allows one log line per interval and counts the events it kept quiet.
///
/// [`LogLimit::hit`] records one event: it answers `Some(n)` when the
/// event may be logged, `n` being the events held back since the last
/// line, and `None` when the event should only be counted (by the caller's
/// metrics, if any: the limit counts for the next line only).
///
/// # Concurrency
///
/// `LogLimit` is `Send + Sync`: share it by reference or in an `Arc`.
/// Each `hit` takes a `parking_lot` mutex for a few instructions (no
/// allocation, no IO, no wait while holding it), so concurrent events are
/// ordered: exactly one of those that arrive once the interval has passed
/// logs, and every other event is in exactly one line's count. An event
/// whose `now` is earlier than the last line's (two threads' clocks read
/// out of order) is counted, never logged.
#[derive(Debug)]
pub struct LogLimit {
    interval: Duration,
    state: Mutex<State>,
}

/// A limit's line and count.
#[derive(Debug, Default)]
struct State {
    /// When the last line was allowed; none before the first.
    last: Option<Instant>,
    /// Events held back since.
    held: u64,
}

impl LogLimit {
    /// A limit of one line per `interval` (a zero interval allows every
    /// line).
    pub const fn new(interval: Duration) -> Self {
        LogLimit {
            interval,
            state: Mutex::new(State { last: None, held: 0 }),
        }
    }

    /// The interval between two lines.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// Records an event at `now`: `Some(n)` if it may be logged (the first
    /// event, or the first one `interval` or more after the last line
    /// allowed), `n` being the events held back since that line; `None` if
    /// it is only counted, for the next line to report.
    pub fn hit(&self, now: Instant) -> Option<u64> {
        let mut state = self.state.lock();
        let due = state
            .last
            .is_none_or(|last| now.checked_duration_since(last).is_some_and(|d| d >= self.interval));
        if due {
            state.last = Some(now);
            Some(std::mem::take(&mut state.held))
        } else {
            state.held = state.held.saturating_add(1);
            None
        }
    }

    /// Events held back since the last line, not yet reported.
    pub fn held(&self) -> u64 {
        self.state.lock().held
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    const SECOND: Duration = Duration::from_secs(1);

    /// The first event logs; those within the interval of the last line are
    /// counted; the first at or past it logs with their count; the interval
    /// runs from the last line, not from the last event.
    #[test]
    fn one_line_per_interval_with_the_count_held_back() {
        let limit = LogLimit::new(10 * SECOND);
        let t = Instant::now();
        assert_eq!(limit.hit(t), Some(0));
        for s in 1..10 {
            assert_eq!(limit.hit(t + s * SECOND), None, "{s} s");
        }
        assert_eq!(limit.held(), 9);
        // 1 ns short of the interval: held.
        assert_eq!(limit.hit(t + 10 * SECOND - Duration::from_nanos(1)), None);
        assert_eq!(limit.hit(t + 10 * SECOND), Some(10));
        assert_eq!(limit.held(), 0);
        // Quiet for a while: the next event logs at once, with nothing held.
        assert_eq!(limit.hit(t + 100 * SECOND), Some(0));
        assert_eq!(limit.hit(t + 105 * SECOND), None);
        assert_eq!(limit.hit(t + 110 * SECOND), Some(1));
    }

    /// A `now` before the last line (clocks read out of order) is counted,
    /// never logged, and does not move the interval.
    #[test]
    fn an_earlier_instant_is_counted() {
        let limit = LogLimit::new(SECOND);
        let t = Instant::now() + 60 * SECOND;
        assert_eq!(limit.hit(t), Some(0));
        assert_eq!(limit.hit(t - 30 * SECOND), None);
        assert_eq!(limit.hit(t + SECOND), Some(1));
    }

    /// A zero interval allows every line.
    #[test]
    fn a_zero_interval_logs_everything() {
        let limit = LogLimit::new(Duration::ZERO);
        let t = Instant::now();
        for _ in 0..3 {
            assert_eq!(limit.hit(t), Some(0));
        }
    }

    /// Threads hitting one limit at one instant: one line, and every other
    /// event in the next line's count.
    #[test]
    fn concurrent_events_are_each_counted_once() {
        let limit = Arc::new(LogLimit::new(SECOND));
        let t = Instant::now();
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let limit = Arc::clone(&limit);
                std::thread::spawn(move || (0..1000).filter(|_| limit.hit(t).is_some()).count())
            })
            .collect();
        let lines: usize = threads.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(lines, 1);
        assert_eq!(limit.hit(t + SECOND), Some(3999));
    }
}
