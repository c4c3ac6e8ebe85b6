//! The what-if replay of slidegate's rate limit service: "what would this
//! config have refused on this traffic?" (`slidegate simulate --config`).
//!
//! Every line of an access log becomes a rate limit request (its
//! descriptors built from the line's fields, [`Setup`]) decided by the
//! service's own config matching and engine (`slidegate-server`'s `config`
//! and `engine`), on a manual clock set to the line's time; per rule, what
//! the config would have refused, whom, and from when, beside the same
//! rules counted by the exact sliding log and by a fixed window of the same
//! length ([`View`]). Feed a [`Replay`] the lines, then take its
//! [`Report`].
//!
//! The replay streams: what it keeps is the engines' bounded stores, a
//! bounded table of the keys refused most per rule, and refusals per
//! interval (at most [`MAX_INTERVALS`] of them, widened as the log goes
//! on), whatever the log's length. Lines are put in time order by
//! `slidegate-sim`'s bounded reorder buffer.
//!
//! Reading the logs is the caller's (any [`Fields`]); printing and
//! plotting the report too.

#![forbid(unsafe_code)]

mod error;
mod replay;
mod report;
mod setup;

pub use error::WhatIfError;
pub use replay::Replay;
pub use report::{MAX_INTERVALS, Refused, Report, RuleReport, Series, View, ViewReport, policy_label};
pub use setup::{EntrySpec, Fields, Setup, Source};
