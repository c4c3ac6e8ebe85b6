//! The figures of a replay: per rule and per view, the requests matched
//! and refused, from when, the keys refused most, and the refusals over
//! time; and the labels they are written with.

use serde::Serialize;
use slidegate_core::{Algorithm, Policy};
use std::collections::BTreeMap;

/// The most intervals of the refusals-over-time series; past it, two
/// neighbours merge and the interval doubles.
pub const MAX_INTERVALS: usize = 1024;

/// The first interval of the refusals-over-time series.
const FIRST_INTERVAL_NS: u64 = 1_000_000_000;

/// One of the three ways the rules are counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum View {
    /// Each limit's algorithm as the config says.
    AsConfigured,
    /// Every limit as the exact sliding log.
    SlidingLog,
    /// Every limit as a fixed window of the same length.
    FixedWindow,
}

impl View {
    /// The three views, in the reports' order.
    pub const ALL: [View; 3] = [View::AsConfigured, View::SlidingLog, View::FixedWindow];

    /// The view's name in the reports.
    pub fn name(self) -> &'static str {
        match self {
            View::AsConfigured => "as configured",
            View::SlidingLog => "sliding_log (exact)",
            View::FixedWindow => "fixed_window",
        }
    }
}

/// One key among those refused most.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Refused {
    /// The descriptor's entries, `key=value` joined by `,`.
    pub key: String,
    /// Its refusals (exact when `at_most_over` is 0).
    pub refused: u64,
    /// How much `refused` may be above the true count (0: exact).
    pub at_most_over: u64,
}

/// Refusals per interval of log time, the interval doubling (neighbours
/// merged) whenever the series would pass [`MAX_INTERVALS`].
#[derive(Clone, Debug)]
pub struct Series {
    /// The length of an interval, in nanoseconds of log time.
    pub interval_ns: u64,
    /// The refusals of each interval, the first starting at the first
    /// line's time.
    pub counts: Vec<u64>,
}

impl Default for Series {
    fn default() -> Self {
        Series {
            interval_ns: FIRST_INTERVAL_NS,
            counts: Vec::new(),
        }
    }
}

impl Series {
    /// Notes `n` at `t_ns` (log time since the first line); `n` = 0 only
    /// makes the series reach `t_ns`.
    pub(crate) fn add(&mut self, t_ns: u64, n: u64) {
        let mut i = t_ns / self.interval_ns;
        while i >= MAX_INTERVALS as u64 {
            self.counts = self.counts.chunks(2).map(|pair| pair.iter().sum()).collect();
            self.interval_ns = self.interval_ns.saturating_mul(2);
            i = t_ns / self.interval_ns;
        }
        let i = i as usize;
        if self.counts.len() <= i {
            self.counts.resize(i + 1, 0);
        }
        self.counts[i] += n;
    }

    /// The series widened to `interval_ns` (a multiple of its own) and
    /// padded with zeros to at least `len` intervals, so that the series of
    /// one replay line up.
    pub fn aligned(&self, interval_ns: u64, len: usize) -> Vec<u64> {
        let per = (interval_ns / self.interval_ns.max(1)).max(1) as usize;
        let mut out: Vec<u64> = self.counts.chunks(per).map(|c| c.iter().sum()).collect();
        if out.len() < len {
            out.resize(len, 0);
        }
        out
    }
}

/// The figures of one replay.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The domain of every request.
    pub domain: String,
    /// The log lines read.
    pub lines: u64,
    /// The requests sent (lines left with a descriptor).
    pub requests: u64,
    /// The first line's time, RFC 3339 in UTC ([`None`] without lines).
    pub first_line: Option<String>,
    /// The same, in nanoseconds since the Unix epoch: the start of every
    /// [`Series`] (not serialised: `first_line` says it).
    #[serde(skip)]
    pub start_unix_ns: Option<i64>,
    /// From the first line's time to the latest, in nanoseconds (not
    /// serialised).
    #[serde(skip)]
    pub span_ns: u64,
    /// The latest line's time, RFC 3339 in UTC.
    pub last_line: Option<String>,
    /// Lines that came later than the reorder horizon, decided at the
    /// latest time decided.
    pub out_of_order: u64,
    /// The most such a line was late, in nanoseconds.
    #[serde(skip)]
    pub most_late_ns: u64,
    /// The reorder horizon, in nanoseconds.
    #[serde(skip)]
    pub horizon_ns: u64,
    /// Per field, the lines without a value for it (their descriptor left
    /// out).
    pub missing_fields: BTreeMap<String, u64>,
    /// Lines with no descriptor left, which sent no request.
    pub without_descriptor: u64,
    /// Requests the service refused as invalid (as configured).
    pub invalid: u64,
    /// The first of those, with its time and the service's reason.
    pub first_invalid: Option<String>,
    /// Live keys the views' stores evicted (figures that depend on
    /// eviction when above 0).
    pub evictions: u64,
    /// Every rule that matched a request, by name.
    pub rules: Vec<RuleReport>,
}

/// One rule's figures in the three views.
#[derive(Clone, Debug, Serialize)]
pub struct RuleReport {
    /// The rule's name in the metrics.
    pub rule: String,
    /// Its limits as configured, e.g. `10 per minute (sliding_window n=8
    /// conservative)`.
    pub limits: String,
    /// Its figures in each of [`View::ALL`], in that order.
    pub views: Vec<ViewReport>,
}

/// One rule in one view.
#[derive(Clone, Debug, Serialize)]
pub struct ViewReport {
    /// The view.
    pub view: View,
    /// The algorithms the rule's limits are counted by in this view.
    pub algorithm: String,
    /// The requests the rule matched.
    pub matched: u64,
    /// Those it refused (or would have, in shadow mode).
    pub refused: u64,
    /// The first refusal's time, RFC 3339 in UTC.
    pub first_refusal: Option<String>,
    /// The keys refused most, most first.
    pub top_refused: Vec<Refused>,
    /// The refusals over time.
    #[serde(skip)]
    pub series: Series,
}

impl ViewReport {
    /// The share of the matched requests refused, in percent (0 when none
    /// matched).
    pub fn refused_pct(&self) -> f64 {
        if self.matched == 0 {
            0.0
        } else {
            self.refused as f64 * 100.0 / self.matched as f64
        }
    }
}

/// A policy's algorithm with its parameters (`sliding_window n=8 conservative`).
pub fn policy_label(policy: &Policy) -> String {
    match policy.algorithm() {
        Algorithm::SlidingWindow { buckets, weighting } => format!("sliding_window n={buckets} {}", weighting.name()),
        Algorithm::Gcra { burst } => format!("gcra burst={burst}"),
        Algorithm::ExponentialHistogram { epsilon } => format!("exponential_histogram ε={epsilon}"),
        other => other.name().to_owned(),
    }
}

/// Nanoseconds since the Unix epoch as RFC 3339 in UTC, to the
/// millisecond (`2023-11-14T22:13:20.250Z`).
pub(crate) fn format_unix_ns(ns: i64) -> String {
    // Every i64 of nanoseconds is within the calendar `time` knows.
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ns)).unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.millisecond()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_widen_and_align() {
        let mut s = Series::default();
        s.add(0, 1);
        s.add(1_500_000_000, 2);
        assert_eq!((s.interval_ns, s.counts.clone()), (FIRST_INTERVAL_NS, vec![1, 2]));
        // Past MAX_INTERVALS seconds the interval doubles until it fits.
        s.add(MAX_INTERVALS as u64 * 1_000_000_000 * 3, 1);
        assert_eq!(s.interval_ns, 4 * FIRST_INTERVAL_NS);
        assert_eq!(s.counts[0], 3);
        assert_eq!(s.counts.iter().sum::<u64>(), 4);
        assert!(s.counts.len() <= MAX_INTERVALS);
        let wider = s.aligned(8 * FIRST_INTERVAL_NS, 3);
        assert_eq!((wider[0], wider.iter().sum::<u64>()), (3, 4));
        assert_eq!(wider.len(), s.counts.len().div_ceil(2));
        let mut short = Series::default();
        short.add(0, 2);
        assert_eq!(short.aligned(FIRST_INTERVAL_NS, 3), vec![2, 0, 0]);
        assert_eq!(s.aligned(4 * FIRST_INTERVAL_NS, 0).len(), s.counts.len());
    }

    #[test]
    fn times_print_as_rfc3339() {
        assert_eq!(format_unix_ns(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_unix_ns(1_700_000_000_250_000_000), "2023-11-14T22:13:20.250Z");
        assert_eq!(format_unix_ns(951_782_400_000_000_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(format_unix_ns(-1_000_000), "1969-12-31T23:59:59.999Z");
    }
}
