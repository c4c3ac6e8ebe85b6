//! Rate-limiting algorithms as pure, sans-IO state machines.
//!
//! Every algorithm is a per-key state that the caller advances with
//! `(policy, now_ns, cost)` and that answers with a [`Decision`]. Time is a
//! monotonic `u64` of nanoseconds supplied by the caller: this crate never
//! reads a clock and never does IO, so every decision is reproducible and
//! testable with a [`ManualClock`].
//!
//! | algorithm ([`Algorithm`]) | state per key | guarantee |
//! |---|---|---|
//! | `sliding_window`, interpolated | `n` slots + newest index + running total | the estimate is off from the true count of the window by at most the oldest bucket's count |
//! | `sliding_window`, conservative | the same | never admits more than `limit` in any window of length `(n − 1)·b`; may refuse up to one bucket's count early |
//! | `fixed_window` | one count + window index | exact per fixed window; up to 2× across a boundary |
//! | `sliding_log` | ≤ `limit` timestamps | exact over the half-open window `(now − W, now]` |
//! | `gcra` | one timestamp | the textbook virtual-scheduling GCRA with burst `burst` |
//! | `exponential_histogram` | O((1/ε)·log² N) bits | the estimate's relative error is at most ε |
//!
//! See [`SlidingWindow`], [`FixedWindow`], [`SlidingLog`], [`Gcra`] and
//! [`ExponentialHistogram`] for the exact rules, memory per key and proofs.
//!
//! # Five lines
//!
//! ```
//! use slidegate_core::{Algorithm, Limiter, ManualClock, Policy, Weighting};
//! use std::time::Duration;
//!
//! let policy = Policy::new(2, Duration::from_secs(60), Algorithm::SlidingLog).unwrap();
//! let clock = ManualClock::new(0);
//! let mut limiter = Limiter::new(policy, clock.clone());
//! assert!(limiter.check(1).allowed());
//! assert!(limiter.check(1).allowed());
//! let refused = limiter.check(1);
//! assert!(!refused.allowed());
//! assert_eq!(refused.retry_after(), Some(Duration::from_secs(60)));
//! clock.advance(Duration::from_secs(60));
//! assert!(limiter.check(1).allowed());
//! ```
//!
//! # Common rules
//!
//! - `cost` is any `u64`. A cost of 0 peeks: it reports the decision a
//!   zero-cost request would get and never changes the state. A cost above
//!   the limit is refused with `retry_after == None` (it can never pass).
//! - Refused requests are never counted.
//! - Time going backwards never panics: the ring counters put a late event in
//!   its own bucket while that bucket is still in the ring and refuse it
//!   otherwise; the other algorithms judge it at the newest time they have
//!   seen. The newest bucket or timestamp never moves backwards.
//! - All time arithmetic saturates; no input panics.
#![forbid(unsafe_code)]
#![cfg_attr(not(feature = "std"), no_std)]
#![cfg_attr(docsrs, feature(doc_cfg))]

extern crate alloc;

mod clock;
mod decision;
mod div;
pub mod duration;
mod fixed;
mod gcra;
mod histogram;
mod identity;
mod limit_state;
mod limiter;
mod log;
mod policy;
mod state;
mod window;

#[cfg(feature = "std")]
pub use clock::MonotonicClock;
pub use clock::{Clock, ManualClock};
pub use decision::Decision;
pub use fixed::FixedWindow;
pub use gcra::Gcra;
pub use histogram::ExponentialHistogram;
pub use identity::{Identity, IdentityError};
pub use limit_state::LimitState;
pub use limiter::Limiter;
pub use log::SlidingLog;
pub use policy::{Algorithm, AlgorithmSpec, ParseError, Policy, PolicyError, SpecError, Weighting};
pub use state::State;
pub use window::{SlidingWindow, Slot};
