//! Durations as people write them in the CLI, YAML and JSON: an integer
//! and a unit, as in `60s`.

use alloc::format;
use alloc::string::{String, ToString};
use core::fmt;
use core::time::Duration;

/// The units, with their length in nanoseconds.
const UNITS: [(&str, u64); 8] = [
    ("ns", 1),
    ("us", 1_000),
    ("µs", 1_000),
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
    ("d", 86_400_000_000_000),
];

/// Why a duration did not parse. The caller names the value.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DurationError {
    /// No digits before the unit.
    NoNumber,
    /// No unit, or one that is not known.
    Unit(String),
    /// More than `u64::MAX` nanoseconds.
    TooLong,
    /// Zero, where a length is needed.
    Zero,
}

impl fmt::Display for DurationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const HINT: &str = "expected an integer followed by ns, us, ms, s, m, h or d, as in 60s or 500ms";
        match self {
            DurationError::NoNumber => write!(f, "{HINT}"),
            DurationError::Unit(u) if u.is_empty() => write!(f, "missing unit: {HINT}"),
            DurationError::Unit(u) => write!(f, "unknown unit `{u}`: {HINT}"),
            DurationError::TooLong => f.write_str("longer than u64::MAX nanoseconds (about 584 years)"),
            DurationError::Zero => f.write_str("must be longer than zero"),
        }
    }
}

impl core::error::Error for DurationError {}

/// Parses `<integer><unit>` with a unit of `ns`, `us` (or `µs`), `ms`, `s`,
/// `m`, `h` or `d`; surrounding whitespace is ignored.
pub fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    if digits.is_empty() {
        return Err(DurationError::NoNumber);
    }
    let per = UNITS
        .iter()
        .find(|&&(name, _)| name == unit)
        .map(|&(_, ns)| ns)
        .ok_or_else(|| DurationError::Unit(unit.to_string()))?;
    // Digits only: the parse fails only on overflow.
    let n: u64 = digits.parse().map_err(|_| DurationError::TooLong)?;
    n.checked_mul(per)
        .map(Duration::from_nanos)
        .ok_or(DurationError::TooLong)
}

/// [`parse_duration`], refusing zero: for windows and run lengths.
pub fn parse_positive_duration(s: &str) -> Result<Duration, DurationError> {
    match parse_duration(s)? {
        Duration::ZERO => Err(DurationError::Zero),
        d => Ok(d),
    }
}

/// The shortest exact spelling of `d` that [`parse_duration`] reads back.
pub fn format_duration(d: Duration) -> String {
    let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    let (name, per) = UNITS
        .iter()
        .rev()
        .filter(|&&(name, _)| name != "µs")
        .find(|&&(_, per)| ns % per == 0 && ns > 0)
        .copied()
        .unwrap_or(("ns", 1));
    format!("{}{name}", ns / per)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_unit() {
        let ok = |s: &str| parse_duration(s).unwrap();
        assert_eq!(ok("60s"), Duration::from_secs(60));
        assert_eq!(ok("500ms"), Duration::from_millis(500));
        assert_eq!(ok("1m"), Duration::from_secs(60));
        assert_eq!(ok("2h"), Duration::from_secs(7200));
        assert_eq!(ok("1d"), Duration::from_secs(86_400));
        assert_eq!(ok("7us"), Duration::from_micros(7));
        assert_eq!(ok("7µs"), Duration::from_micros(7));
        assert_eq!(ok(" 3ns "), Duration::from_nanos(3));
        assert_eq!(ok("0s"), Duration::ZERO);
    }

    #[test]
    fn refuses_with_a_reason() {
        let err = |s: &str| parse_duration(s).unwrap_err().to_string();
        assert!(err("5parsecs").starts_with("unknown unit `parsecs`"));
        assert!(err("60").starts_with("missing unit"));
        assert!(err("s").starts_with("expected an integer"));
        assert!(err("").starts_with("expected an integer"));
        assert!(err("-5s").starts_with("expected an integer"));
        assert!(err("1.5s").starts_with("unknown unit `.5s`"));
        assert_eq!(err("300000d"), "longer than u64::MAX nanoseconds (about 584 years)");
        assert_eq!(
            err("99999999999999999999999s"),
            "longer than u64::MAX nanoseconds (about 584 years)"
        );
        assert_eq!(parse_positive_duration("0ms").unwrap_err(), DurationError::Zero);
    }

    #[test]
    fn formats_back() {
        for s in ["10m", "2h", "1d", "500ms", "7us", "3ns", "90s", "0ns"] {
            assert_eq!(format_duration(parse_duration(s).unwrap()), s);
        }
        assert_eq!(format_duration(Duration::from_secs(60)), "1m");
        assert_eq!(format_duration(Duration::from_nanos(8_571_428_572)), "8571428572ns");
    }
}
