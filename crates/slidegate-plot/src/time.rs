//! The time axis: seconds since a run's start, or the clock time of a log
//! (UTC), with ticks on round clock steps and labels as `HH:MM` (the
//! date on the first tick and at midnight when the axis crosses one).

use crate::TimeAxis;
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged};
use plotters::coord::types::RangedCoordf64;
use std::ops::Range;

/// Clock steps between ticks, in seconds: the first that keeps the ticks
/// few enough is used.
const STEPS: [i64; 22] = [
    1,
    2,
    5,
    10,
    15,
    30,
    60,
    2 * 60,
    5 * 60,
    10 * 60,
    15 * 60,
    30 * 60,
    3600,
    2 * 3600,
    3 * 3600,
    6 * 3600,
    12 * 3600,
    86_400,
    2 * 86_400,
    7 * 86_400,
    14 * 86_400,
    28 * 86_400,
];

const DAY: i64 = 86_400;

/// A linear axis of seconds whose ticks and labels follow a [`TimeAxis`]:
/// plotters' own for seconds since the start, round clock steps for a
/// clock.
pub(crate) struct TimeCoord {
    inner: RangedCoordf64,
    axis: TimeAxis,
    /// The most ticks wanted (the chart's hint is capped by it).
    most: usize,
}

impl TimeCoord {
    pub(crate) fn new(range: Range<f64>, axis: TimeAxis, most: usize) -> TimeCoord {
        TimeCoord {
            inner: range.into(),
            axis,
            most: most.max(2),
        }
    }

    /// The clock's start in whole seconds and its fraction, for a clock
    /// axis.
    fn start(&self) -> Option<f64> {
        match self.axis {
            TimeAxis::Seconds => None,
            TimeAxis::Clock { start_unix_ns } => Some(start_unix_ns as f64 / 1e9),
        }
    }

    /// The clock step between ticks for at most `most` ticks over the range.
    fn step(&self, most: usize) -> i64 {
        let r = self.inner.range();
        let span = (r.end - r.start).max(0.0);
        STEPS
            .iter()
            .copied()
            .find(|&s| span / s as f64 <= most.max(2) as f64 - 1.0)
            .unwrap_or_else(|| ((span / (most.max(2) - 1) as f64 / DAY as f64).ceil() as i64).max(1) * DAY)
    }

    /// Whether the range crosses midnight (UTC).
    fn crosses_day(&self, start: f64) -> bool {
        let r = self.inner.range();
        let day = |x: f64| ((start + x) / DAY as f64).floor() as i64;
        day(r.start) != day(r.end)
    }

    /// The label of the tick at `x` seconds.
    pub(crate) fn label(&self, x: f64) -> String {
        let Some(start) = self.start() else {
            let r = self.inner.range();
            return tick(x, r.end - r.start);
        };
        let t = (start + x).round() as i64;
        let (date, (h, m, s)) = (civil(t.div_euclid(DAY)), clock(t.rem_euclid(DAY)));
        let step = self.step(self.most);
        let time = if step < 60 {
            format!("{h:02}:{m:02}:{s:02}")
        } else {
            format!("{h:02}:{m:02}")
        };
        // Across midnight, the first tick and the first of each day carry
        // the date.
        let first = x - (step as f64) < self.inner.range().start;
        let new_day = (t - step).div_euclid(DAY) != t.div_euclid(DAY);
        if self.crosses_day(start) && (first || new_day) {
            format!("{:02}-{:02} {time}", date.1, date.2)
        } else {
            time
        }
    }

    /// The axis's name, with its unit or its date.
    pub(crate) fn desc(&self) -> String {
        let Some(start) = self.start() else {
            return "time since the start (s)".to_owned();
        };
        let r = self.inner.range();
        let date = |x: f64| {
            let (y, m, d) = civil(((start + x) / DAY as f64).floor() as i64);
            format!("{y:04}-{m:02}-{d:02}")
        };
        if self.crosses_day(start) {
            format!("time (UTC), {} to {}", date(r.start), date(r.end))
        } else {
            format!("time (UTC) on {}", date(r.start))
        }
    }
}

impl Ranged for TimeCoord {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        self.inner.map(value, limit)
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        let Some(start) = self.start() else {
            return self.inner.key_points(hint);
        };
        if hint.weight().allow_light_points() {
            return Vec::new();
        }
        let most = hint.max_num_points().min(self.most);
        let step = self.step(most) as f64;
        let r = self.inner.range();
        let first = ((start + r.start) / step).ceil() * step;
        (0..)
            .map(|i| first + step * f64::from(i) - start)
            .take_while(|&x| x <= r.end)
            .take(most.max(2) + 1)
            .collect()
    }

    fn range(&self) -> Range<f64> {
        self.inner.range()
    }
}

/// The date `(year, month, day)` of `days` since 1970-01-01 (clamped to
/// the calendar `time` knows, years -9999 to 9999).
pub(crate) fn civil(days: i64) -> (i64, u32, u32) {
    /// The Julian day of 1970-01-01.
    const EPOCH: i64 = 2_440_588;
    let julian = days.saturating_add(EPOCH).clamp(
        i64::from(time::Date::MIN.to_julian_day()),
        i64::from(time::Date::MAX.to_julian_day()),
    );
    let date = i32::try_from(julian)
        .ok()
        .and_then(|j| time::Date::from_julian_day(j).ok())
        .unwrap_or(time::Date::MAX);
    let (y, m, d) = date.to_calendar_date();
    (i64::from(y), u32::from(u8::from(m)), u32::from(d))
}

/// A tick label for `v` on an axis spanning `span`: as many decimals as
/// the span needs, trailing zeros dropped.
pub(crate) fn tick(v: f64, span: f64) -> String {
    let decimals = if span > 0.0 {
        (2 - span.log10().floor() as i32).clamp(0, 9) as usize
    } else {
        2
    };
    let s = format!("{v:.decimals$}");
    let s = if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    };
    if s == "-0" { "0".to_string() } else { s }
}

/// `(hours, minutes, seconds)` of `s` seconds into a day.
fn clock(s: i64) -> (i64, i64, i64) {
    (s / 3600, s / 60 % 60, s % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NS: i64 = 1_000_000_000;

    #[test]
    fn ticks_have_the_decimals_the_span_needs() {
        assert_eq!(tick(20.0, 120.0), "20");
        assert_eq!(tick(2.5, 12.0), "2.5");
        assert_eq!(tick(0.0125, 0.05), "0.0125");
        assert_eq!(tick(-0.0, 1.0), "0");
    }

    #[test]
    fn dates_are_civil() {
        assert_eq!(civil(0), (1970, 1, 1));
        assert_eq!(civil(-1), (1969, 12, 31));
        assert_eq!(civil(19_675), (2023, 11, 14));
        assert_eq!(civil(11_016), (2000, 2, 29));
        // Beyond the calendar: clamped, no panic.
        assert_eq!(civil(i64::MAX), (9999, 12, 31));
        assert_eq!(civil(i64::MIN / 2), (-9999, 1, 1));
    }

    #[test]
    fn clock_ticks_fall_on_round_times_and_read_as_clock_times() {
        // 2023-11-14T22:13:20Z, over two hours: ticks every 15 minutes from
        // 22:15, labelled HH:MM, the date in the axis's name.
        let start = 1_700_000_000 * NS;
        let axis = TimeCoord::new(0.0..7200.0, TimeAxis::Clock { start_unix_ns: start }, 10);
        let ticks = axis.key_points(plotters::coord::ranged1d::BoldPoints(10));
        assert_eq!(ticks.first(), Some(&100.0));
        assert!(ticks.windows(2).all(|w| w[1] - w[0] == 900.0), "{ticks:?}");
        assert_eq!(axis.label(100.0), "11-14 22:15");
        assert_eq!(axis.label(1000.0), "22:30");
        assert_eq!(axis.desc(), "time (UTC), 2023-11-14 to 2023-11-15");
        assert_eq!(axis.label(6400.0), "11-15 00:00");
        // Within a day and under a minute's steps: seconds shown.
        let axis = TimeCoord::new(0.0..40.0, TimeAxis::Clock { start_unix_ns: start }, 10);
        assert_eq!(axis.label(0.0), "22:13:20");
        assert_eq!(axis.desc(), "time (UTC) on 2023-11-14");
        // Seconds since the start keep plotters' ticks.
        let axis = TimeCoord::new(0.0..40.0, TimeAxis::Seconds, 10);
        assert_eq!(axis.desc(), "time since the start (s)");
        assert_eq!(axis.label(20.0), "20");
    }
}
