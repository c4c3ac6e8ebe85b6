//! The errors of reading a log: why one line is malformed
//! ([`LineError`]), what is kept of a malformed line ([`BadLine`], and
//! what one does: [`OnError`]), why a log could not be read
//! ([`TraceError`]) and why a format string cannot be compiled
//! ([`FormatError`]).

use std::fmt;

/// How many malformed lines a [`Trace`] keeps the details of (in
/// [`Trace::bad_lines`]); the rest are only counted.
///
/// [`Trace`]: crate::Trace
/// [`Trace::bad_lines`]: crate::Trace::bad_lines
pub const REPORTED_BAD_LINES: usize = 20;

/// What to do with a malformed line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum OnError {
    /// Count it, keep the first [`REPORTED_BAD_LINES`] in
    /// [`Trace::bad_lines`], and go on.
    ///
    /// [`Trace::bad_lines`]: crate::Trace::bad_lines
    #[default]
    Skip,
    /// Stop at it with [`TraceError::BadLine`].
    Stop,
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
        ///
        /// [`LogFormat`]: crate::LogFormat
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
        ///
        /// [`LogFormat`]: crate::LogFormat
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
        ///
        /// [`LogFormat`]: crate::LogFormat
        format: String,
        /// The names there are.
        expected: Vec<String>,
    },
    /// More distinct keys than [`TraceOptions::max_clients`].
    ///
    /// [`TraceOptions::max_clients`]: crate::TraceOptions::max_clients
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

/// A format string that cannot be compiled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FormatError {
    /// `nginx`, `apache` or `envoy`.
    pub dialect: &'static str,
    /// The directive or variable at fault (clipped), or the whole string.
    pub directive: String,
    /// Its 1-based byte position in the string.
    pub position: usize,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl fmt::Display for FormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "bad {} log format: `{}` at position {} {}",
            self.dialect, self.directive, self.position, self.reason
        )
    }
}

impl std::error::Error for FormatError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clip_keeps_short_text() {
        assert_eq!(clip("abc"), "abc");
        let long = "é".repeat(70);
        assert_eq!(clip(&long).chars().count(), 61);
    }
}
