//! The line parsers of the Common Log Format, the Combined Log Format
//! and `timestamp,key` CSV, and the times they read.
//!
//! Nothing here panics on any input: every malformed line gives a
//! [`LineError`] that says why.

use crate::errors::{LineError, clip};
use std::borrow::Cow;

/// One line of a Common or Combined Log Format log, its fields borrowed from
/// the line (quoted fields without their quotes, escapes left as they are).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogLine<'a> {
    /// The time, in nanoseconds since the Unix epoch (UTC).
    pub time_unix_ns: i64,
    /// The remote host.
    pub host: &'a str,
    /// The identity from identd, usually `-`.
    pub ident: &'a str,
    /// The authenticated user, `-` when none.
    pub user: &'a str,
    /// The request line, as `GET /apache_pb.gif HTTP/1.0`.
    pub request: &'a str,
    /// The status code.
    pub status: &'a str,
    /// The response size, `-` when none.
    pub bytes: &'a str,
    /// Combined only: the referer.
    pub referer: Option<&'a str>,
    /// Combined only: the user agent.
    pub user_agent: Option<&'a str>,
}

impl<'a> LogLine<'a> {
    /// The request's target without its query string (`/a` for `GET /a?b
    /// HTTP/1.1`), or the whole request when it has no target (`-`).
    pub fn path(&self) -> &'a str {
        let mut words = self.request.split_ascii_whitespace();
        match (words.next(), words.next()) {
            (Some(_), Some(target)) => target.split('?').next().unwrap_or(target),
            _ => self.request,
        }
    }
}

/// A token of a log line.
#[derive(Clone, Copy, Debug)]
enum Token<'a> {
    /// Up to the next space.
    Bare(&'a str),
    /// Between `[` and `]`.
    Bracketed(&'a str),
    /// Between double quotes, `\"` and `\\` escaped.
    Quoted(&'a str),
}

impl<'a> Token<'a> {
    fn text(self) -> &'a str {
        match self {
            Token::Bare(s) | Token::Bracketed(s) | Token::Quoted(s) => s,
        }
    }
}

/// The next token of a log line and the rest of the line after it.
fn next_token(s: &str) -> Result<Option<(Token<'_>, &str)>, LineError> {
    let s = s.trim_start_matches([' ', '\t']);
    let b = s.as_bytes();
    // Every index below is that of an ASCII byte (or the end), so a char
    // boundary.
    match b.first() {
        None => Ok(None),
        Some(b'[') => match b.iter().position(|&c| c == b']' || c == b'"') {
            Some(end) if b[end] == b']' => Ok(Some((Token::Bracketed(&s[1..end]), &s[end + 1..]))),
            _ => Err(LineError::UnclosedBracket),
        },
        Some(b'"') => {
            let mut i = 1;
            while i < b.len() {
                match b[i] {
                    b'\\' => i += 2,
                    b'"' => return Ok(Some((Token::Quoted(&s[1..i]), &s[i + 1..]))),
                    _ => i += 1,
                }
            }
            Err(LineError::UnclosedQuote)
        }
        Some(_) => {
            let end = b.iter().position(|&c| c == b' ' || c == b'\t').unwrap_or(b.len());
            Ok(Some((Token::Bare(&s[..end]), &s[end..])))
        }
    }
}

/// The names of a log line's fields, in order.
const LOG_FIELDS: [&str; 9] = [
    "host",
    "ident",
    "user",
    "time",
    "request",
    "status",
    "bytes",
    "referer",
    "user agent",
];

/// Splits a Common (`combined` false) or Combined Log Format line into
/// `spans`, the byte range of each field in `line` (the Combined one's
/// extra fields after the ninth); returns the time.
pub(crate) fn parse_log_spans(line: &str, combined: bool, spans: &mut Vec<(usize, usize)>) -> Result<i64, LineError> {
    spans.clear();
    let expected = if combined { 9 } else { 7 };
    let mut found = 0;
    let mut rest = line;
    let offset = |s: &str| (s.as_ptr() as usize).saturating_sub(line.as_ptr() as usize);
    while let Some((token, after)) = next_token(rest)? {
        if found < expected {
            let fits = match found {
                3 => matches!(token, Token::Bracketed(_)),
                4 | 7 | 8 => matches!(token, Token::Quoted(_)),
                _ => matches!(token, Token::Bare(_)),
            };
            if !fits {
                return Err(match found {
                    3 => LineError::MissingBracket {
                        found: clip(token.text()),
                    },
                    4 | 7 | 8 => LineError::BadField {
                        field: LOG_FIELDS[found],
                        value: clip(token.text()),
                        expected: "a double-quoted field",
                    },
                    _ => LineError::BadField {
                        field: LOG_FIELDS[found],
                        value: clip(token.text()),
                        expected: "a field without quotes or brackets",
                    },
                });
            }
        }
        // Only combined lines may have more fields: counted, not kept.
        if found < expected || combined {
            let text = token.text();
            spans.push((offset(text), offset(text) + text.len()));
        }
        found += 1;
        rest = after;
    }
    if found < expected || (!combined && found != expected) {
        return Err(LineError::FieldCount { expected, found });
    }
    let field = |i: usize| spans.get(i).and_then(|&(a, b)| line.get(a..b)).unwrap_or("");
    let time_unix_ns = parse_clf_time(field(3))?;
    let (status, bytes) = (field(5), field(6));
    if status.is_empty() || !status.bytes().all(|b| b.is_ascii_digit()) {
        return Err(LineError::BadField {
            field: "status",
            value: clip(status),
            expected: "a number",
        });
    }
    if bytes != "-" && !bytes.bytes().all(|b| b.is_ascii_digit()) {
        return Err(LineError::BadField {
            field: "bytes",
            value: clip(bytes),
            expected: "a number or -",
        });
    }
    Ok(time_unix_ns)
}

fn parse_log(line: &str, combined: bool) -> Result<LogLine<'_>, LineError> {
    let mut spans = Vec::with_capacity(9);
    let time_unix_ns = parse_log_spans(line, combined, &mut spans)?;
    let field = |i: usize| spans.get(i).and_then(|&(a, b)| line.get(a..b)).unwrap_or("");
    let [host, ident, user, _, request, status, bytes, referer, user_agent] = std::array::from_fn(field);
    Ok(LogLine {
        time_unix_ns,
        host,
        ident,
        user,
        request,
        status,
        bytes,
        referer: combined.then_some(referer),
        user_agent: combined.then_some(user_agent),
    })
}

/// Parses a Common Log Format line: `host ident authuser [dd/Mon/yyyy:HH:MM:SS
/// ±hhmm] "request" status bytes`, exactly seven fields separated by spaces
/// or tabs.
///
/// # Errors
///
/// A [`LineError`] naming the first thing wrong.
pub fn parse_clf_line(line: &str) -> Result<LogLine<'_>, LineError> {
    parse_log(line, false)
}

/// Parses a Combined Log Format line: a Common Log Format line followed by
/// `"referer" "user-agent"`, nine fields, then any number of extra fields
/// (ignored here; see [`LogFormat::combined`]).
///
/// # Errors
///
/// A [`LineError`] naming the first thing wrong.
///
/// [`LogFormat::combined`]: crate::LogFormat::combined
pub fn parse_combined_line(line: &str) -> Result<LogLine<'_>, LineError> {
    parse_log(line, true)
}

/// Days from 1970-01-01 to the date (proleptic Gregorian).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// The decimal value of ASCII digits (at most 18 of them).
fn digits(b: &[u8]) -> Option<i64> {
    if b.is_empty() || b.len() > 18 || !b.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(b.iter().fold(0, |n, &d| n * 10 + i64::from(d - b'0')))
}

/// A calendar time and a UTC offset, checked.
struct Civil {
    year: i64,
    month: i64,
    day: i64,
    hour: i64,
    minute: i64,
    second: i64,
    nanos: i64,
    offset_s: i64,
}

impl Civil {
    /// Nanoseconds since the Unix epoch, or why not.
    fn unix_ns(&self) -> Result<i64, &'static str> {
        if !(1..=12).contains(&self.month) {
            return Err("month out of range");
        }
        if self.day < 1 || self.day > days_in_month(self.year, self.month) {
            return Err("day out of range for its month");
        }
        if self.hour > 23 || self.minute > 59 {
            return Err("time of day out of range");
        }
        // 60: a leap second, counted as the first second of the next minute.
        if self.second > 60 {
            return Err("second out of range");
        }
        if self.offset_s.abs() >= 24 * 3600 {
            return Err("time zone offset out of range");
        }
        let days = days_from_civil(self.year, self.month, self.day);
        let seconds = days * 86_400 + self.hour * 3600 + self.minute * 60 + self.second - self.offset_s;
        i64::try_from(i128::from(seconds) * 1_000_000_000 + i128::from(self.nanos))
            .map_err(|_| "outside the years 1678 to 2261")
    }
}

const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// Parses a Common Log Format time, `dd/Mon/yyyy:HH:MM:SS ±hhmm` (the text
/// between the brackets), into nanoseconds since the Unix epoch (UTC).
/// Months are English abbreviations in any case.
///
/// # Errors
///
/// [`LineError::UnknownMonth`] for a month that is not one, and
/// [`LineError::BadDate`] for any other shape or a time that does not
/// exist (31 April, 25 o'clock) or is outside the years 1678 to 2261.
pub fn parse_clf_time(s: &str) -> Result<i64, LineError> {
    let bad = |reason| LineError::BadDate { date: clip(s), reason };
    let b = s.as_bytes();
    const SHAPE: &str = "expected dd/Mon/yyyy:HH:MM:SS ±hhmm";
    let shaped = b.len() == 26
        && s.is_ascii()
        && b[2] == b'/'
        && b[6] == b'/'
        && b[11] == b':'
        && b[14] == b':'
        && b[17] == b':'
        && b[20] == b' '
        && (b[21] == b'+' || b[21] == b'-');
    if !shaped {
        return Err(bad(SHAPE));
    }
    // ASCII throughout: every index is a char boundary.
    let number = |from: usize, to: usize| digits(&b[from..to]).ok_or_else(|| bad(SHAPE));
    let (day, year, hour, minute, second) = (
        number(0, 2)?,
        number(7, 11)?,
        number(12, 14)?,
        number(15, 17)?,
        number(18, 20)?,
    );
    let (zh, zm) = (number(22, 24)?, number(24, 26)?);
    let name = &s[3..6];
    let month = MONTHS
        .iter()
        .position(|m| m.eq_ignore_ascii_case(name))
        .ok_or_else(|| LineError::UnknownMonth {
            month: name.to_string(),
        })?;
    if zm > 59 {
        return Err(bad("time zone offset out of range"));
    }
    let sign = if b[21] == b'-' { -1 } else { 1 };
    Civil {
        year,
        month: month as i64 + 1,
        day,
        hour,
        minute,
        second,
        nanos: 0,
        offset_s: sign * (zh * 3600 + zm * 60),
    }
    .unix_ns()
    .map_err(bad)
}

const TIMESTAMP_SHAPE: &str = "expected Unix seconds (1700000000.250) or RFC 3339 (2023-11-14T22:13:20.25Z)";

/// Parses a CSV timestamp into nanoseconds since the Unix epoch (UTC):
/// Unix seconds with an optional fraction (`1700000000.250`; digits past
/// the ninth are dropped) or RFC 3339 (`2023-11-14T22:13:20.25Z`,
/// `2023-11-14 23:13:20+01:00`).
///
/// # Errors
///
/// [`LineError::BadTimestamp`] saying why.
pub fn parse_csv_time(s: &str) -> Result<i64, LineError> {
    let bad = |reason| LineError::BadTimestamp {
        timestamp: clip(s),
        reason,
    };
    let b = s.as_bytes();
    if !b.is_empty() && b.iter().all(|&c| c.is_ascii_digit() || c == b'.') {
        let (whole, fraction) = match s.split_once('.') {
            Some((w, f)) => (w, Some(f)),
            None => (s, None),
        };
        let seconds = digits(whole.as_bytes()).ok_or_else(|| bad(TIMESTAMP_SHAPE))?;
        let nanos = match fraction {
            None => 0,
            Some(f) => fraction_ns(f.as_bytes()).ok_or_else(|| bad(TIMESTAMP_SHAPE))?,
        };
        return i64::try_from(i128::from(seconds) * 1_000_000_000 + i128::from(nanos))
            .map_err(|_| bad("after the year 2261"));
    }
    if b.len() >= 4 && b[..4].iter().all(u8::is_ascii_digit) && b.get(4) == Some(&b'-') {
        return parse_rfc3339(s).map_err(bad);
    }
    Err(bad(TIMESTAMP_SHAPE))
}

/// The nanoseconds of a fraction's digits (`25` is 250 ms); `None` unless
/// one or more digits.
fn fraction_ns(f: &[u8]) -> Option<i64> {
    if f.is_empty() || !f.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut ns = 0;
    for i in 0..9 {
        ns = ns * 10 + f.get(i).map_or(0, |&d| i64::from(d - b'0'));
    }
    Some(ns)
}

/// `YYYY-MM-DD(T| )HH:MM:SS[.frac](Z|±HH:MM)`.
pub(crate) fn parse_rfc3339(s: &str) -> Result<i64, &'static str> {
    const SHAPE: &str = "expected RFC 3339, as 2023-11-14T22:13:20.25Z";
    let b = s.as_bytes();
    let shaped = s.is_ascii()
        && b.len() >= 19
        && b[4] == b'-'
        && b[7] == b'-'
        && matches!(b[10], b'T' | b't' | b' ')
        && b[13] == b':'
        && b[16] == b':';
    if !shaped {
        return Err(SHAPE);
    }
    let number = |from: usize, to: usize| digits(&b[from..to]).ok_or(SHAPE);
    let (year, month, day) = (number(0, 4)?, number(5, 7)?, number(8, 10)?);
    let (hour, minute, second) = (number(11, 13)?, number(14, 16)?, number(17, 19)?);
    let mut rest = &b[19..];
    let mut nanos = 0;
    if let Some(f) = rest.strip_prefix(b".") {
        let len = f.iter().take_while(|d| d.is_ascii_digit()).count();
        nanos = fraction_ns(&f[..len]).ok_or(SHAPE)?;
        rest = &f[len..];
    }
    let offset_s = match rest {
        b"Z" | b"z" => 0,
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
            let (h, m) = (digits(&[*h1, *h2]).ok_or(SHAPE)?, digits(&[*m1, *m2]).ok_or(SHAPE)?);
            if m > 59 {
                return Err("time zone offset out of range");
            }
            let sign = if *sign == b'-' { -1 } else { 1 };
            sign * (h * 3600 + m * 60)
        }
        [] => return Err("no time zone: RFC 3339 needs Z or an offset such as +01:00"),
        _ => return Err(SHAPE),
    };
    Civil {
        year,
        month,
        day,
        hour,
        minute,
        second,
        nanos,
        offset_s,
    }
    .unix_ns()
}

/// One line of a CSV trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CsvLine<'a> {
    /// The time, in nanoseconds since the Unix epoch (UTC).
    pub time_unix_ns: i64,
    /// The key: borrowed from the line unless it had `""` escapes.
    pub key: Cow<'a, str>,
}

/// The next CSV field and the rest of the line after its comma (`None` when
/// it was the last). Unquoted fields are trimmed of surrounding white space;
/// quoted ones are kept as they are, with `""` read as `"`.
fn next_csv_field(s: &str) -> Result<(Cow<'_, str>, Option<&str>), LineError> {
    let t = s.trim_start_matches([' ', '\t']);
    let Some(q) = t.strip_prefix('"') else {
        return Ok(match t.split_once(',') {
            Some((field, rest)) => (Cow::Borrowed(field.trim_end()), Some(rest)),
            None => (Cow::Borrowed(t.trim_end()), None),
        });
    };
    let b = q.as_bytes();
    let mut owned: Option<String> = None;
    // Indices are those of `"` (ASCII) or the end: char boundaries.
    let (mut from, mut i) = (0, 0);
    loop {
        let Some(at) = b[i..].iter().position(|&c| c == b'"').map(|p| i + p) else {
            return Err(LineError::UnclosedQuote);
        };
        if b.get(at + 1) == Some(&b'"') {
            owned.get_or_insert_with(String::new).push_str(&q[from..=at]);
            i = at + 2;
            from = i;
            continue;
        }
        let field = match owned {
            Some(mut o) => {
                o.push_str(&q[from..at]);
                Cow::Owned(o)
            }
            None => Cow::Borrowed(&q[..at]),
        };
        let after = q[at + 1..].trim_start_matches([' ', '\t']);
        return match after.strip_prefix(',') {
            Some(rest) => Ok((field, Some(rest))),
            None if after.trim_end().is_empty() => Ok((field, None)),
            None => Err(LineError::TextAfterQuote),
        };
    }
}

/// Whether `line` is the CSV header `timestamp,key` (in any case).
pub fn is_csv_header(line: &str) -> bool {
    match next_csv_field(line) {
        Ok((ts, Some(rest))) if ts.eq_ignore_ascii_case("timestamp") => {
            matches!(next_csv_field(rest), Ok((key, None)) if key.eq_ignore_ascii_case("key"))
        }
        _ => false,
    }
}

/// Parses a CSV trace line, `timestamp,key` (see [`LogFormat::csv`]).
///
/// # Errors
///
/// [`LineError::FieldCount`] unless two fields, then the errors of
/// [`parse_csv_time`], [`LineError::EmptyKey`], and the quoting errors
/// [`LineError::UnclosedQuote`] and [`LineError::TextAfterQuote`].
///
/// [`LogFormat::csv`]: crate::LogFormat::csv
pub fn parse_csv_line(line: &str) -> Result<CsvLine<'_>, LineError> {
    let (timestamp, rest) = next_csv_field(line)?;
    let Some(rest) = rest else {
        return Err(LineError::FieldCount { expected: 2, found: 1 });
    };
    let (key, mut more) = next_csv_field(rest)?;
    if more.is_some() {
        let mut found = 2;
        while let Some(rest) = more {
            found += 1;
            more = next_csv_field(rest)?.1;
        }
        return Err(LineError::FieldCount { expected: 2, found });
    }
    let time_unix_ns = parse_csv_time(&timestamp)?;
    if key.is_empty() {
        return Err(LineError::EmptyKey);
    }
    Ok(CsvLine { time_unix_ns, key })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_days() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(days_from_civil(1969, 12, 31), -1);
        assert_eq!(days_from_civil(2024, 2, 29), 19_782);
    }
}
