//! Accuracy plots for slidegate's simulations, written as SVG and PNG.
//!
//! Five plots, each from plain data (no simulation types, so that any
//! caller can convert its own results):
//!
//! - [`count_over_time`]: the true and the estimated count of one key's
//!   window over time, with the limit drawn across;
//! - [`count_panels`]: the same, one small panel per estimate, each against
//!   the true count, on shared axes;
//! - [`cumulative_refusals`]: the requests refused so far over a log's
//!   time, one rising line per rule or way of counting;
//! - [`error_rates_by_buckets`]: wrongly allowed and wrongly denied
//!   requests (% of requests) against the number of buckets, on a log scale;
//! - [`max_window_ratio`]: the most any key got admitted in one window,
//!   divided by the limit, one bar per algorithm, with the limit (1.0) drawn
//!   across.
//!
//! Each writes `<stem>.svg` and `<stem>.png` ([`WIDTH`] × [`HEIGHT`] pixels;
//! [`count_panels`] taller when its panels need more rows) and returns both
//! paths. Every plot has a title, axes labelled with their units, a legend
//! beside the plot naming every series (for [`count_panels`], a legend row
//! above the panels and a title on each; for [`cumulative_refusals`], rows
//! under the plot, so that long labels show whole), and one colour per
//! series (the Okabe–Ito palette, which colour-blind readers can tell
//! apart). The plots over time take their x in seconds and a [`TimeAxis`]:
//! seconds since the start, or a log's clock time (UTC), with ticks on
//! round clock times labelled `HH:MM` (`MM-DD HH:MM` when the plot crosses
//! midnight) and the date in the axis's name.
//!
//! Text is drawn with DejaVu Sans, embedded in the crate: no system font is
//! read at run time. It is registered with plotters (process-wide) as the
//! `sans-serif` family on the first plot; the SVG keeps its text as text,
//! in that family. Both files are drawn in memory first: nothing is written
//! when the input is refused.
//!
//! ```no_run
//! use slidegate_plot::{Line, TimeAxis, count_over_time};
//! use std::path::Path;
//!
//! let truth = Line::new("exact count", vec![(0.0, 0.0), (1.0, 40.0), (2.0, 95.0)]);
//! let estimate = Line::new("2 buckets, interpolated", vec![(0.0, 0.0), (1.0, 35.5), (2.0, 101.0)]);
//! let time = TimeAxis::Seconds;
//! let written = count_over_time(Path::new("plots/count"), "One client", time, 100.0, &truth, &[estimate])?;
//! assert_eq!(written.len(), 2); // plots/count.svg and plots/count.png
//! # Ok::<(), slidegate_plot::PlotError>(())
//! ```

#![forbid(unsafe_code)]

mod bitmap;
mod draw;
mod time;

use std::fmt;
use std::path::{Path, PathBuf};

/// Width of every plot, in pixels (the PNG's; the SVG's in user units).
pub const WIDTH: u32 = 1200;
/// Height of every plot, in pixels.
pub const HEIGHT: u32 = 700;

/// What the x axis of a plot over time shows; x is given in seconds
/// either way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TimeAxis {
    /// Seconds since the start of a run, as numbers (a simulation's time).
    #[default]
    Seconds,
    /// Clock time, UTC: x seconds after `start_unix_ns` (nanoseconds since
    /// the Unix epoch, a log's first request), labelled `HH:MM` (with
    /// seconds when the ticks are under a minute apart, with the month and
    /// day when the plot crosses midnight), the ticks on round clock times
    /// and the date in the axis's name.
    Clock {
        /// The time of x = 0, in nanoseconds since the Unix epoch.
        start_unix_ns: i64,
    },
}

/// One named series of `(x, y)` points, drawn in the order given.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Line {
    /// The name shown in the legend.
    pub label: String,
    /// The points, `(x, y)`; every value must be finite, but for a y of
    /// [`cumulative_refusals`], where NaN means no data.
    pub points: Vec<(f64, f64)>,
}

impl Line {
    /// A series named `label`.
    pub fn new(label: impl Into<String>, points: Vec<(f64, f64)>) -> Line {
        Line {
            label: label.into(),
            points,
        }
    }
}

/// Why a plot could not be made: nothing to draw, a value that is not a
/// finite number, or a file that could not be written. Never a panic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlotError {
    message: String,
}

impl PlotError {
    pub(crate) fn new(message: impl Into<String>) -> PlotError {
        PlotError {
            message: message.into(),
        }
    }

    /// What went wrong, in a sentence for a person.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for PlotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for PlotError {}

/// True vs estimated count over time for one key: x in seconds (shown as
/// `time` says), y in requests; the limit drawn as a horizontal line.
///
/// `truth` is drawn thick and black under the `estimates`, which get one
/// colour each; the limit is a dashed dark-red line named `limit (…)` in
/// the legend. The points are samples (one per request): a line is broken
/// where x jumps by more than 2% of the time axis and ten times its median
/// step, rather than drawn straight across a silence where the count is
/// not known. Writes `<path_stem>.svg` and `<path_stem>.png` and returns
/// their paths, SVG first.
///
/// # Errors
///
/// No estimate, a series without points, a value or a limit that is not
/// finite, values too far apart (or too close) for an axis, or a file that
/// cannot be written.
pub fn count_over_time(
    path_stem: &Path,
    title: &str,
    time: TimeAxis,
    limit: f64,
    truth: &Line,
    estimates: &[Line],
) -> Result<Vec<PathBuf>, PlotError> {
    check_counts(limit, truth, estimates)?;
    draw::render(
        path_stem,
        &draw::CountOverTime {
            title,
            time,
            limit,
            truth,
            estimates,
        },
    )
}

/// The most estimates [`count_panels`] draws, one panel each.
pub const MAX_PANELS: usize = draw::MAX_PANELS;

/// True vs estimated count over time for one key as small multiples: one
/// panel per estimate, each titled with the estimate's label and drawn
/// against the true count; x in seconds (shown as `time` says), y in
/// requests.
///
/// Every panel has the same x and y ranges (those of [`count_over_time`],
/// over the truth, every estimate and the limit), so that panels compare at
/// a glance. In each, the estimate is a wide line in its own colour, the
/// truth a thin black line drawn over it, and the limit a dashed dark-red
/// line. Lines are broken across silences as in [`count_over_time`]. The
/// panels fill a grid of one column for one estimate, two for up to four,
/// three beyond; a legend row under the title names the truth and the
/// limit, and the axes are named once, under and left of the grid. The
/// canvas is [`WIDTH`] wide and [`HEIGHT`] tall, taller when there are more
/// than two rows of panels (every panel keeps at least 230 px of height).
/// Writes `<path_stem>.svg` and `<path_stem>.png` and returns their paths,
/// SVG first.
///
/// # Errors
///
/// No estimate or more than [`MAX_PANELS`], a series without points, a
/// value or a limit that is not finite, values too far apart (or too close)
/// for an axis, or a file that cannot be written.
pub fn count_panels(
    path_stem: &Path,
    title: &str,
    time: TimeAxis,
    limit: f64,
    truth: &Line,
    estimates: &[Line],
) -> Result<Vec<PathBuf>, PlotError> {
    check_counts(limit, truth, estimates)?;
    if estimates.len() > MAX_PANELS {
        return Err(PlotError::new(format!(
            "{} estimates are too many for one figure of panels: at most {MAX_PANELS}",
            estimates.len()
        )));
    }
    draw::render(
        path_stem,
        &draw::CountPanels {
            title,
            time,
            limit,
            truth,
            estimates,
        },
    )
}

/// The requests refused so far over time, one line per rule or way of
/// counting: x is seconds (shown as `time` says), y the number of requests
/// refused from the start to x, so that each line only rises and the lines
/// compare at a glance.
///
/// Give one point per interval, from the start: two points are always
/// joined, however far apart. A point whose y is NaN means "no data" for
/// that interval: the line is broken there (it stops at the point before
/// and starts again at the point after; a point alone between two gaps is
/// a dot). Each line gets its own colour and a legend entry with its
/// label, in rows under the plot across its whole width, so that long
/// labels show whole; the first two lines are drawn wider (6 and 4 px)
/// under the others (2 px), so that lines that coincide all show. The y axis starts at zero. Writes `<path_stem>.svg`
/// and `<path_stem>.png` and returns their paths, SVG first.
///
/// # Errors
///
/// No line, a line without points, an x that is not finite, a y that is
/// negative or infinite, values too far apart (or too close) for an axis,
/// or a file that cannot be written.
pub fn cumulative_refusals(
    path_stem: &Path,
    title: &str,
    time: TimeAxis,
    lines: &[Line],
) -> Result<Vec<PathBuf>, PlotError> {
    if lines.is_empty() {
        return Err(PlotError::new("no line to plot"));
    }
    for line in lines {
        if line.points.is_empty() {
            return Err(PlotError::new(format!("series `{}` has no points", line.label)));
        }
        let bad = |&(x, y): &(f64, f64)| !x.is_finite() || y.is_infinite() || y < 0.0;
        if let Some(i) = line.points.iter().position(bad) {
            let (x, y) = line.points[i];
            return Err(PlotError::new(format!(
                "series `{}`: point {i} is ({x}, {y}); x must be a finite number, y a finite number at or above \
                 zero (or NaN for no data)",
                line.label
            )));
        }
    }
    draw::render(path_stem, &draw::Refusals { title, time, lines })
}

/// Wrongly allowed and wrongly denied (% of requests) against the number of
/// buckets `n`, one line per (rate, weighting): x is `n` on a log₂ scale,
/// with a tick at every `n` that occurs (at the powers of two when there are
/// too many), y is the percentage of requests.
///
/// Each line gets its own colour and marker shape. Writes
/// `<path_stem>.svg` and `<path_stem>.png` and returns their paths, SVG
/// first.
///
/// # Errors
///
/// No line, a line without points, a value that is not finite, a number of
/// buckets that is not above zero, values too far apart (or too close) for
/// an axis, or a file that cannot be written.
pub fn error_rates_by_buckets(path_stem: &Path, title: &str, lines: &[Line]) -> Result<Vec<PathBuf>, PlotError> {
    if lines.is_empty() {
        return Err(PlotError::new("no line to plot"));
    }
    lines.iter().try_for_each(check_line)?;
    for line in lines {
        if let Some(&(n, _)) = line.points.iter().find(|&&(n, _)| n <= 0.0) {
            return Err(PlotError::new(format!(
                "series `{}`: buckets must be above zero for a log scale, got {n}",
                line.label
            )));
        }
    }
    draw::render(path_stem, &draw::ErrorRates { title, lines })
}

/// The most admitted in any window divided by the limit, per algorithm:
/// one horizontal bar per `(name, ratio)`, top to bottom in the order given,
/// with the value printed at its end, and a dashed reference line at 1.0.
///
/// Bars at or below 1.0 are blue, bars above it (the algorithm let a key
/// exceed its limit in some window) are vermilion. Writes
/// `<path_stem>.svg` and `<path_stem>.png` and returns their paths, SVG
/// first.
///
/// # Errors
///
/// No bar, a ratio that is negative, not finite or too large for an axis,
/// or a file that cannot be written.
pub fn max_window_ratio(path_stem: &Path, title: &str, bars: &[(String, f64)]) -> Result<Vec<PathBuf>, PlotError> {
    if bars.is_empty() {
        return Err(PlotError::new("no bar to plot"));
    }
    for (name, ratio) in bars {
        if !ratio.is_finite() || *ratio < 0.0 {
            return Err(PlotError::new(format!(
                "bar `{name}`: the ratio must be a finite number at or above zero, not {ratio}"
            )));
        }
    }
    draw::render(path_stem, &draw::MaxWindowRatio { title, bars })
}

/// A count plot needs a finite limit, an estimate, and series of finite
/// points.
fn check_counts(limit: f64, truth: &Line, estimates: &[Line]) -> Result<(), PlotError> {
    if !limit.is_finite() {
        return Err(PlotError::new(format!(
            "the limit must be a finite number, not {limit}"
        )));
    }
    if estimates.is_empty() {
        return Err(PlotError::new("no estimate to plot against the truth"));
    }
    check_line(truth)?;
    estimates.iter().try_for_each(check_line)
}

/// A series must have points, all finite.
fn check_line(line: &Line) -> Result<(), PlotError> {
    if line.points.is_empty() {
        return Err(PlotError::new(format!("series `{}` has no points", line.label)));
    }
    match line.points.iter().position(|(x, y)| !x.is_finite() || !y.is_finite()) {
        Some(i) => {
            let (x, y) = line.points[i];
            Err(PlotError::new(format!(
                "series `{}`: point {i} is ({x}, {y}), not finite numbers",
                line.label
            )))
        }
        None => Ok(()),
    }
}
