//! Access logs as traffic: the line parsers of the Common Log Format, the
//! Combined Log Format and `timestamp,key` CSV, the errors of every format
//! (see [`crate::logs`] for the others and the streaming reader), and the
//! conversion of a log into a time-sorted request stream (see
//! [`read_trace`]).
//!
//! Nothing here panics on any input: every malformed line gives a
//! [`LineError`] that says why.

use crate::logs::{Field, FormatError, LogFormat, LogOptions, LogReader};
use crate::stream::{Reorder, ReorderOptions};
use crate::traffic::{MAX_CLIENTS, Request};
use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::io::BufRead;

/// How many malformed lines a [`Trace`] keeps the details of (in
/// [`Trace::bad_lines`]); the rest are only counted.
pub const REPORTED_BAD_LINES: usize = 20;

/// What to do with a malformed line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum OnError {
    /// Count it, keep the first [`REPORTED_BAD_LINES`] in
    /// [`Trace::bad_lines`], and go on.
    #[default]
    Skip,
    /// Stop at it with [`TraceError::BadLine`].
    Stop,
}

/// How to read a trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceOptions {
    /// The format and what a malformed line does.
    pub log: LogOptions,
    /// The field that is the client: a name of the format's or an alias
    /// (see [`crate::logs`]).
    pub key_by: String,
    /// The most distinct keys the trace may have.
    pub max_clients: u32,
}

impl Default for TraceOptions {
    /// Detected format, keyed by client, malformed lines skipped, at most
    /// [`MAX_CLIENTS`] clients.
    fn default() -> Self {
        TraceOptions {
            log: LogOptions::default(),
            key_by: "client".to_string(),
            max_clients: MAX_CLIENTS,
        }
    }
}

/// Why one line of a trace is malformed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LineError {
    /// The line is not UTF-8.
    InvalidUtf8 {
        /// The 1-based position in the line of the first byte that is not.
        byte: usize,
    },
    /// Not as many fields as the format has.
    FieldCount {
        /// The format's number of fields.
        expected: usize,
        /// The line's.
        found: usize,
    },
    /// A log line's time does not start with `[`.
    MissingBracket {
        /// What stands where the time should (clipped).
        found: String,
    },
    /// A log line's time has no closing `]`.
    UnclosedBracket,
    /// A double-quoted field has no closing quote.
    UnclosedQuote,
    /// A field that is not what its place needs.
    BadField {
        /// The field's name.
        field: &'static str,
        /// Its value (clipped).
        value: String,
        /// What it should be.
        expected: &'static str,
    },
    /// A log line's date has a month that is not `Jan` … `Dec`.
    UnknownMonth {
        /// The month as written (clipped).
        month: String,
    },
    /// A log line's date that is not `dd/Mon/yyyy:HH:MM:SS ±hhmm`, or not a
    /// real time.
    BadDate {
        /// The date as written (clipped).
        date: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A CSV timestamp that is neither Unix seconds nor RFC 3339.
    BadTimestamp {
        /// The timestamp as written (clipped).
        timestamp: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A CSV line with text after a quoted field's closing quote.
    TextAfterQuote,
    /// A CSV line whose key is empty.
    EmptyKey,
    /// A line of a format string's log without the literal text the
    /// format puts after a field.
    MissingText {
        /// The text expected.
        expected: String,
        /// The field it should follow (or the start of the line).
        after: String,
        /// What stands there (clipped).
        found: String,
    },
    /// Text after the last field of a format string's log.
    TrailingText {
        /// The text (clipped).
        text: String,
    },
    /// A JSON line that is not a JSON object.
    NotJson {
        /// What is wrong.
        reason: String,
    },
    /// A JSON line without its time field.
    MissingField {
        /// The field (or the fields tried).
        field: String,
    },
}

impl fmt::Display for LineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LineError::InvalidUtf8 { byte } => write!(f, "invalid UTF-8 at byte {byte}"),
            LineError::FieldCount { expected, found } => {
                write!(f, "wrong field count: expected {expected}, found {found}")
            }
            LineError::MissingBracket { found } => write!(f, "missing `[` before the time, found `{found}`"),
            LineError::UnclosedBracket => f.write_str("missing `]` after the time"),
            LineError::UnclosedQuote => f.write_str("a quoted field has no closing `\"`"),
            LineError::BadField { field, value, expected } => {
                write!(f, "bad {field} `{value}`: expected {expected}")
            }
            LineError::UnknownMonth { month } => write!(f, "unknown month `{month}`"),
            LineError::BadDate { date, reason } => write!(f, "bad date `{date}`: {reason}"),
            LineError::BadTimestamp { timestamp, reason } => write!(f, "bad timestamp `{timestamp}`: {reason}"),
            LineError::TextAfterQuote => f.write_str("text after a quoted field's closing `\"`"),
            LineError::EmptyKey => f.write_str("empty key"),
            LineError::MissingText { expected, after, found } => {
                write!(f, "expected `{expected}` after {after}, found `{found}`")
            }
            LineError::TrailingText { text } => write!(f, "text after the last field: `{text}`"),
            LineError::NotJson { reason } => write!(f, "not a JSON object: {reason}"),
            LineError::MissingField { field } => write!(f, "no time field: expected {field}"),
        }
    }
}

impl std::error::Error for LineError {}

/// At most 60 characters of `s`, for messages.
pub(crate) fn clip(s: &str) -> String {
    clip_to(s, 60)
}

/// At most `max` characters of `s`, and `…` when there were more.
pub(crate) fn clip_to(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", s.get(..at).unwrap_or(s)),
        None => s.to_string(),
    }
}

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

/// A malformed line that was skipped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadLine {
    /// Its 1-based line number.
    pub line: u64,
    /// Why it is malformed.
    pub error: LineError,
    /// The line, clipped to [`crate::logs::BAD_LINE_TEXT`] characters.
    pub text: String,
}

impl fmt::Display for BadLine {
    /// The line number, the reason, then the text in backquotes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}: `{}`", self.line, self.error, self.text)
    }
}

/// A trace read into a request stream (see [`read_trace`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trace {
    /// The name it was read under (for messages).
    pub name: String,
    /// Its format, as given or detected.
    pub format: LogFormat,
    /// Its requests, sorted by time (stably: lines at the same time keep
    /// their order), time 0 being the earliest; each costs 1.
    pub requests: Vec<Request>,
    /// Each client's key, by client number.
    pub keys: Vec<String>,
    /// Distinct keys: the clients are `0..clients`, numbered in the order
    /// they first appear in the file.
    pub clients: u32,
    /// The time of the earliest request, in nanoseconds since the Unix
    /// epoch: time 0 of [`Trace::requests`].
    pub start_unix_ns: i64,
    /// Lines read, blank ones included.
    pub lines: u64,
    /// Malformed lines skipped (with [`OnError::Skip`]).
    pub skipped: u64,
    /// The first [`REPORTED_BAD_LINES`] malformed lines skipped.
    pub bad_lines: Vec<BadLine>,
}

impl Trace {
    /// Time from the earliest request to the latest, in nanoseconds.
    pub fn span_ns(&self) -> u64 {
        self.requests.last().map_or(0, |r| r.time_ns)
    }
}

/// Why a log could not be read.
#[derive(Debug)]
#[non_exhaustive]
pub enum TraceError {
    /// Reading failed.
    Io {
        /// The log's name.
        file: String,
        /// The error.
        error: std::io::Error,
    },
    /// A malformed line, with [`OnError::Stop`].
    BadLine {
        /// The log's name.
        file: String,
        /// The 1-based line number.
        line: u64,
        /// Why it is malformed.
        error: LineError,
        /// The format it was read as (as [`LogFormat`] displays it).
        format: String,
        /// The line (clipped).
        text: String,
    },
    /// No well-formed line: the log is empty, blank or all malformed.
    NoRequests {
        /// The log's name.
        file: String,
        /// Its non-empty lines.
        non_empty: u64,
        /// Its malformed lines.
        malformed: u64,
        /// The format it was read as (as [`LogFormat`] displays it), if
        /// any.
        format: Option<String>,
        /// The first three malformed lines.
        first: Vec<BadLine>,
    },
    /// The format was to be detected, and the first lines fit none.
    UnknownFormat {
        /// The log's name.
        file: String,
        /// The first non-empty line's number.
        line: u64,
    },
    /// The field asked for is not one of the log's format.
    FieldNotInFormat {
        /// The log's name.
        file: String,
        /// The field asked for.
        field: String,
        /// The format (as [`LogFormat`] displays it).
        format: String,
        /// The names there are.
        expected: Vec<String>,
    },
    /// More distinct keys than [`TraceOptions::max_clients`].
    TooManyClients {
        /// The log's name.
        file: String,
        /// The key's field.
        key_by: String,
        /// How many distinct keys the log has.
        clients: u64,
        /// The most allowed.
        max: u32,
    },
    /// A bad nginx, Apache or Envoy format string.
    Format {
        /// The log's name.
        file: String,
        /// What is wrong with the string.
        error: FormatError,
    },
    /// nginx or Apache chosen without a format string.
    MissingLogFormat {
        /// `nginx` or `apache`.
        format: &'static str,
    },
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TraceError::Io { file, error } => write!(f, "reading {file}: {error}"),
            TraceError::BadLine {
                file,
                line,
                error,
                format,
                text,
            } => write!(f, "{file}:{line}: {error} (read as {format}): `{text}`"),
            TraceError::NoRequests {
                file,
                non_empty,
                malformed,
                format,
                first,
            } => {
                write!(f, "no requests in {file}")?;
                if *non_empty == 0 {
                    return f.write_str(": it has no non-empty line");
                }
                if *malformed == 0 {
                    return f.write_str(": it has only a header line");
                }
                let all = if malformed == non_empty { "all " } else { "" };
                let s = if *malformed == 1 { " is" } else { "s are" };
                write!(f, ": {all}{malformed} non-empty line{s} malformed")?;
                if let Some(format) = format {
                    write!(f, " as {format}")?;
                }
                for bad in first {
                    write!(f, "; {bad}")?;
                }
                Ok(())
            }
            TraceError::UnknownFormat { file, line } => write!(
                f,
                "cannot tell the format of {file} from its first lines (line {line} on): expected a Common or \
                 Combined Log Format line (with extra fields or not), an Envoy default-format line, a JSON object \
                 or `timestamp,key` CSV"
            ),
            TraceError::FieldNotInFormat {
                file,
                field,
                format,
                expected,
            } => write!(
                f,
                "field `{field}` is not in {file}, {format}: expected one of {}",
                expected.join(", ")
            ),
            TraceError::TooManyClients {
                file,
                key_by,
                clients,
                max,
            } => write!(
                f,
                "{file} has {clients} distinct keys by {key_by}, more than the {max} clients allowed"
            ),
            TraceError::Format { file, error } => write!(f, "reading {file}: {error}"),
            TraceError::MissingLogFormat { format } => write!(
                f,
                "the {format} format needs its format string (nginx's `log_format`, Apache's `LogFormat`)"
            ),
        }
    }
}

/// The message names the cause itself: there is no `source`.
impl std::error::Error for TraceError {}

/// How many lines between two calls of the progress callback.
const PROGRESS_LINES: u64 = 4096;

/// A trace streamed by [`stream_trace`]: everything about it but its
/// requests, which went to the sink.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceSummary {
    /// The name it was read under (for messages).
    pub name: String,
    /// Its format, as given or detected.
    pub format: LogFormat,
    /// Each client's key, by client number.
    pub keys: Vec<String>,
    /// Distinct keys: the clients are `0..clients`, numbered in the order
    /// they first appear in the file.
    pub clients: u32,
    /// Requests sent to the sink.
    pub requests: u64,
    /// Requests of each client, by client number.
    pub requests_per_client: Vec<u64>,
    /// The time of the first request released, in nanoseconds since the
    /// Unix epoch: time 0 of the requests.
    pub start_unix_ns: i64,
    /// Time from the first request released to the last, in nanoseconds.
    pub span_ns: u64,
    /// Lines read, blank ones included.
    pub lines: u64,
    /// Malformed lines skipped (with [`OnError::Skip`]).
    pub skipped: u64,
    /// The first [`REPORTED_BAD_LINES`] malformed lines skipped.
    pub bad_lines: Vec<BadLine>,
    /// Lines that came later than the reorder buffer could wait for (see
    /// [`Reorder`]): they were decided at the latest time released.
    pub late: u64,
    /// The most one of them was earlier than that time, in nanoseconds.
    pub max_lateness_ns: u64,
}

/// What one pass over a log released.
struct Released {
    /// The first time released.
    start: Option<i64>,
    /// The last.
    last: i64,
    late: u64,
    max_lateness_ns: u64,
}

/// One pass over the records of `reader`: each record's key (its
/// `key_field`, `-` when absent) goes through `classify`, and what it gives
/// (when anything) through a [`Reorder`] buffer to `release`, with the
/// record's time counted from the first time released.
fn pass<R: BufRead, T>(
    reader: &mut LogReader<R>,
    key_field: &Field,
    order: ReorderOptions,
    progress: &mut dyn FnMut(u64),
    classify: &mut dyn FnMut(Cow<'_, str>) -> Option<T>,
    release: &mut dyn FnMut(u64, T),
) -> Result<Released, TraceError> {
    let mut buffer = Reorder::new(order);
    let mut start: Option<i64> = None;
    let mut last = 0i64;
    let mut out = |time: i64, item: T| {
        let first = *start.get_or_insert(time);
        last = time;
        // Released times never go below the first: the difference of two
        // i64 fits a u64.
        release((i128::from(time) - i128::from(first)) as u64, item);
    };
    let mut next_progress = PROGRESS_LINES;
    while let Some(record) = reader.next_record()? {
        let time = record.time_unix_ns();
        let key = record.get(key_field).unwrap_or(Cow::Borrowed("-"));
        if let Some(item) = classify(key) {
            buffer.push(time, item, &mut out);
        }
        if reader.lines() >= next_progress {
            next_progress = reader.lines() + PROGRESS_LINES;
            progress(reader.bytes_read());
        }
    }
    buffer.finish(&mut out);
    progress(reader.bytes_read());
    Ok(Released {
        start,
        last,
        late: buffer.late(),
        max_lateness_ns: buffer.max_lateness_ns(),
    })
}

/// Streams the trace called `name` from `input` into `sink`, one request
/// at a time, in memory that does not grow with the log: the clients' keys
/// and counts, and what the reorder buffer holds.
///
/// The lines are read by a [`LogReader`] (see it for the formats, their
/// detection, blank lines, a byte order mark and a CSV header). Every
/// well-formed line is one request of cost 1 from the client its
/// `options.key_by` field names (a field that is `-` or absent is the key
/// `-`); the clients are numbered in the order their keys first appear.
/// The requests are put in time order by a [`Reorder`] buffer with `order`
/// (stably: lines at the same time keep their order; a line later than the
/// buffer could wait for is decided at the latest time released, and
/// counted in [`TraceSummary::late`]); time 0 is the first one released.
///
/// `progress` is called now and then, and at the end, with the number of
/// bytes read so far. The sink may have been given requests when an error
/// comes.
///
/// # Errors
///
/// - [`TraceError::BadLine`] at the first malformed line with
///   [`OnError::Stop`] (with [`OnError::Skip`], malformed lines are counted
///   in [`TraceSummary::skipped`] and the first few kept in
///   [`TraceSummary::bad_lines`]);
/// - [`TraceError::NoRequests`] when no line is a request, with why;
/// - [`TraceError::FieldNotInFormat`], [`TraceError::TooManyClients`] (at
///   the end, with the count of every distinct key; past the limit, no
///   request goes to the sink) and those of [`LogReader::new`].
pub fn stream_trace(
    name: &str,
    input: impl BufRead,
    options: &TraceOptions,
    order: ReorderOptions,
    progress: &mut dyn FnMut(u64),
    sink: &mut dyn FnMut(Request),
) -> Result<TraceSummary, TraceError> {
    let mut reader = LogReader::new(name, input, &options.log)?;
    let key_field = reader.field(&options.key_by)?;
    let mut keys: HashMap<String, u32> = HashMap::new();
    let mut distinct: u64 = 0;
    let mut per_client: Vec<u64> = Vec::new();
    let mut requests: u64 = 0;
    let max = u64::from(options.max_clients);
    let released = pass(
        &mut reader,
        &key_field,
        order,
        progress,
        &mut |key| {
            let client = match keys.get(key.as_ref()) {
                Some(&client) => client,
                None => {
                    distinct += 1;
                    let client = u32::try_from(keys.len()).unwrap_or(u32::MAX);
                    keys.insert(key.into_owned(), client);
                    client
                }
            };
            // Past the limit, only count the keys: the run will fail.
            (distinct <= max).then_some(client)
        },
        &mut |time_ns, client| {
            requests += 1;
            if let Some(n) = per_client.get_mut(client as usize) {
                *n += 1;
            } else {
                per_client.resize(client as usize, 0);
                per_client.push(1);
            }
            sink(Request {
                time_ns,
                client,
                cost: 1,
            });
        },
    )?;
    if distinct > max {
        return Err(TraceError::TooManyClients {
            file: name.to_string(),
            key_by: options.key_by.clone(),
            clients: distinct,
            max: options.max_clients,
        });
    }
    let (Some(format), Some(start)) = (reader.format(), released.start) else {
        return Err(reader.no_requests());
    };
    let mut names = vec![String::new(); keys.len()];
    for (key, client) in keys {
        if let Some(slot) = names.get_mut(client as usize) {
            *slot = key;
        }
    }
    per_client.resize(names.len(), 0);
    Ok(TraceSummary {
        name: name.to_string(),
        format: format.clone(),
        keys: names,
        clients: u32::try_from(distinct).unwrap_or(u32::MAX),
        requests,
        requests_per_client: per_client,
        start_unix_ns: start,
        span_ns: (i128::from(released.last) - i128::from(start)) as u64,
        lines: reader.lines(),
        skipped: reader.skipped(),
        bad_lines: reader.bad_lines().to_vec(),
        late: released.late,
        max_lateness_ns: released.max_lateness_ns,
    })
}

/// The requests of a few clients of a trace, as [`stream_trace`] with the
/// same `options` and `order` sends them (the same times, the same order):
/// `clients` are their keys and the client numbers they are given. For the
/// plots of the busiest clients, in a second pass over the log: memory
/// grows with those clients' requests only.
///
/// # Errors
///
/// Those of [`stream_trace`] but [`TraceError::TooManyClients`] and
/// [`TraceError::NoRequests`] (an empty list then).
pub fn trace_requests_of(
    name: &str,
    input: impl BufRead,
    options: &TraceOptions,
    order: ReorderOptions,
    clients: &[(String, u32)],
    progress: &mut dyn FnMut(u64),
) -> Result<Vec<Request>, TraceError> {
    let mut reader = LogReader::new(name, input, &options.log)?;
    let key_field = reader.field(&options.key_by)?;
    let wanted: HashMap<&str, u32> = clients.iter().map(|(k, c)| (k.as_str(), *c)).collect();
    let mut requests = Vec::new();
    pass(
        &mut reader,
        &key_field,
        order,
        progress,
        // Every record goes through the buffer, so that it releases the
        // wanted ones exactly as in the full pass.
        &mut |key| Some(wanted.get(key.as_ref()).copied()),
        &mut |time_ns, client| {
            if let Some(client) = client {
                requests.push(Request {
                    time_ns,
                    client,
                    cost: 1,
                });
            }
        },
    )?;
    Ok(requests)
}

/// Reads the trace called `name` from `input` into a request stream held
/// in memory: [`stream_trace`] with [`ReorderOptions::FULL_SORT`] (the
/// requests sorted by time, stably; time 0 is the earliest one's), its
/// requests collected.
///
/// # Errors
///
/// Those of [`stream_trace`].
pub fn read_trace(
    name: &str,
    input: impl BufRead,
    options: &TraceOptions,
    progress: &mut dyn FnMut(u64),
) -> Result<Trace, TraceError> {
    let mut requests = Vec::new();
    let summary = stream_trace(name, input, options, ReorderOptions::FULL_SORT, progress, &mut |r| {
        requests.push(r)
    })?;
    Ok(Trace {
        name: summary.name,
        format: summary.format,
        requests,
        keys: summary.keys,
        clients: summary.clients,
        start_unix_ns: summary.start_unix_ns,
        lines: summary.lines,
        skipped: summary.skipped,
        bad_lines: summary.bad_lines,
    })
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

    #[test]
    fn clip_keeps_short_text() {
        assert_eq!(clip("abc"), "abc");
        let long = "é".repeat(70);
        assert_eq!(clip(&long).chars().count(), 61);
    }
}
