//! Access logs as people have them: Common and Combined Log Format (with
//! any extra fields), nginx and Apache logs in their configured format,
//! Envoy's default format, JSON lines (Envoy, Caddy, Traefik, or any with a
//! configured time field) and `timestamp,key` CSV, plain or gzip-compressed,
//! read one record at a time in memory independent of the file's length.
//!
//! A line is a [`Record`]: its time and its fields, looked up by name with a
//! [`Field`] resolved once from the [`LogFormat`]. Names are the format's
//! own (nginx variables without `$`, Apache directives as written such as
//! `%{X-Forwarded-For}i`, Envoy commands such as `REQ(:METHOD)`, JSON key
//! paths such as `request.remote_ip`, `remote_host` … `user-agent` and
//! `extra1`, `extra2`, … for Common and Combined logs) or aliases valid in
//! every format: `client`, `user`, `method`, `path`, `request`, `status`,
//! `referer`, `user-agent`, `host`, `forwarded-for` and `key` (CSV).
//!
//! # Streaming a log
//!
//! ```
//! use slidegate_sim::{LogOptions, LogReader};
//! use std::borrow::Cow;
//!
//! let log = "192.0.2.1 - - [10/Oct/2023:13:55:36 +0000] \"GET /a?b=1 HTTP/1.1\" 200 5 \"-\" \"curl/8\" \"-\"\n\
//!            not a log line\n";
//! // `open_log_file(path, &options)` does the same for a file, gzip or not.
//! let mut reader = LogReader::new("access.log", log.as_bytes(), &LogOptions::default())?;
//! assert_eq!(reader.format().map(|f| f.to_string()).as_deref(), Some("a combined log with 1 extra field"));
//! let client = reader.field("client")?;
//! let path = reader.field("path")?;
//! while let Some(record) = reader.next_record()? {
//!     let key = record.get(&client).unwrap_or(Cow::Borrowed("-"));
//!     assert_eq!((record.line(), record.time_unix_ns()), (1, 1_696_946_136_000_000_000));
//!     assert_eq!((key.as_ref(), record.get(&path).as_deref()), ("192.0.2.1", Some("/a")));
//! }
//! assert_eq!((reader.lines(), reader.records(), reader.skipped()), (2, 1, 1));
//! assert_eq!(reader.bad_lines()[0].line, 2);
//! # Ok::<(), slidegate_sim::TraceError>(())
//! ```

mod json;
mod template;

pub use crate::errors::FormatError;
use crate::errors::{BadLine, LineError, OnError, REPORTED_BAD_LINES, TraceError, clip, clip_to};
use crate::line::{is_csv_header, parse_clf_time, parse_csv_line, parse_csv_time, parse_log_spans, parse_rfc3339};
use serde_json::Value;
use std::borrow::Cow;
use std::collections::VecDeque;
use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use template::{Dialect, Template};

/// How many non-empty lines format detection looks at.
pub const DETECTION_LINES: usize = 10;

/// How much of a malformed line a [`BadLine`] keeps, in characters.
pub const BAD_LINE_TEXT: usize = 120;

/// What a field means, whatever the format calls it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Role {
    Client,
    User,
    Method,
    /// A path without a query string.
    Path,
    /// A request target, maybe with a query string.
    Target,
    /// A whole request line.
    Request,
    Status,
    Referer,
    UserAgent,
    Host,
    ForwardedFor,
}

/// The names valid in every format (when the format has the field).
pub const ALIASES: [&str; 11] = [
    "client",
    "user",
    "method",
    "path",
    "request",
    "status",
    "referer",
    "user-agent",
    "host",
    "forwarded-for",
    "key",
];

/// How a JSON log's time is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TimeFormat {
    /// RFC 3339, as `2023-11-14T22:13:20.25Z` or with an offset.
    Rfc3339,
    /// Unix seconds, an integer or with a fraction (`1700000000.25`).
    UnixSeconds,
    /// Unix milliseconds.
    UnixMillis,
    /// Unix microseconds.
    UnixMicros,
    /// Unix nanoseconds.
    UnixNanos,
    /// The Common Log Format's `dd/Mon/yyyy:HH:MM:SS ±hhmm`.
    Clf,
}

impl TimeFormat {
    /// Every format's name, in the order of the variants.
    pub const NAMES: [&'static str; 6] = ["rfc3339", "unix", "unix_ms", "unix_us", "unix_ns", "clf"];

    /// The format's name.
    pub fn name(self) -> &'static str {
        match self {
            TimeFormat::Rfc3339 => "rfc3339",
            TimeFormat::UnixSeconds => "unix",
            TimeFormat::UnixMillis => "unix_ms",
            TimeFormat::UnixMicros => "unix_us",
            TimeFormat::UnixNanos => "unix_ns",
            TimeFormat::Clf => "clf",
        }
    }

    /// The format called `name` (one of [`TimeFormat::NAMES`]).
    pub fn from_name(name: &str) -> Option<TimeFormat> {
        Some(match name {
            "rfc3339" => TimeFormat::Rfc3339,
            "unix" | "unix_s" => TimeFormat::UnixSeconds,
            "unix_ms" => TimeFormat::UnixMillis,
            "unix_us" => TimeFormat::UnixMicros,
            "unix_ns" => TimeFormat::UnixNanos,
            "clf" => TimeFormat::Clf,
            _ => return None,
        })
    }

    /// Nanoseconds since the Unix epoch of a time written as text.
    ///
    /// # Errors
    ///
    /// [`LineError::BadTimestamp`] or [`LineError::BadDate`] saying why.
    pub fn parse(self, s: &str) -> Result<i64, LineError> {
        match self {
            TimeFormat::Rfc3339 => TimeKind::Rfc3339.parse(s),
            TimeFormat::UnixSeconds => TimeKind::UnixSeconds.parse(s),
            TimeFormat::UnixMillis => TimeKind::UnixMillis.parse(s),
            TimeFormat::UnixMicros => TimeKind::UnixMicros.parse(s),
            TimeFormat::UnixNanos => unix_scaled(s, 1),
            TimeFormat::Clf => parse_clf_time(s),
        }
    }
}

impl fmt::Display for TimeFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a template's time field is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum TimeKind {
    Clf,
    ClfBracketed,
    Rfc3339,
    UnixSeconds,
    UnixMillis,
    UnixMicros,
}

impl TimeKind {
    pub(crate) fn parse(self, s: &str) -> Result<i64, LineError> {
        match self {
            TimeKind::Clf => parse_clf_time(s),
            TimeKind::ClfBracketed => {
                let inner = s.strip_prefix('[').and_then(|s| s.strip_suffix(']'));
                parse_clf_time(inner.ok_or(LineError::UnclosedBracket)?)
            }
            TimeKind::Rfc3339 => parse_rfc3339(s).map_err(|reason| LineError::BadTimestamp {
                timestamp: clip(s),
                reason,
            }),
            TimeKind::UnixSeconds => {
                if s.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
                    parse_csv_time(s)
                } else {
                    unix_scaled(s, 1_000_000_000)
                }
            }
            TimeKind::UnixMillis => unix_scaled(s, 1_000_000),
            TimeKind::UnixMicros => unix_scaled(s, 1_000),
        }
    }
}

/// `digits[.digits]` in units of `unit_ns` nanoseconds.
pub(crate) fn unix_scaled(s: &str, unit_ns: i64) -> Result<i64, LineError> {
    let bad = |reason| LineError::BadTimestamp {
        timestamp: clip(s),
        reason,
    };
    const SHAPE: &str = "expected a number of the unit, as 1700000000250";
    let (whole, fraction) = s.split_once('.').unwrap_or((s, ""));
    if whole.is_empty() || !whole.bytes().all(|b| b.is_ascii_digit()) || whole.len() > 20 {
        return Err(bad(SHAPE));
    }
    if !fraction.bytes().all(|b| b.is_ascii_digit()) || s.ends_with('.') {
        return Err(bad(SHAPE));
    }
    let whole: i128 = whole.parse().map_err(|_| bad(SHAPE))?;
    let mut nanos_of_unit: i128 = 0;
    for i in 0..9 {
        nanos_of_unit = nanos_of_unit * 10 + fraction.as_bytes().get(i).map_or(0, |&d| i128::from(d - b'0'));
    }
    let total = whole * i128::from(unit_ns) + nanos_of_unit * i128::from(unit_ns) / 1_000_000_000;
    i64::try_from(total).map_err(|_| bad("after the year 2261"))
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Kind {
    Clf,
    Combined {
        extra_fields: usize,
    },
    Csv,
    Template(Arc<Template>),
    Json {
        time_field: Option<String>,
        time_format: Option<TimeFormat>,
    },
}

/// The format of an access log: how its lines are split into a time and
/// named fields.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LogFormat(Kind);

/// The native names of a Common Log Format line's fields, in order.
const CLF_NAMES: [&str; 9] = [
    "remote_host",
    "ident",
    "remote_user",
    "time",
    "request",
    "status",
    "bytes",
    "referer",
    "user-agent",
];
const CLF_ROLES: [Option<Role>; 9] = [
    Some(Role::Client),
    None,
    Some(Role::User),
    None,
    Some(Role::Request),
    Some(Role::Status),
    None,
    Some(Role::Referer),
    Some(Role::UserAgent),
];

impl LogFormat {
    /// Common Log Format: `host ident authuser [10/Oct/2000:13:55:36 -0700]
    /// "GET /apache_pb.gif HTTP/1.0" 200 2326`, exactly seven fields.
    pub fn clf() -> Self {
        LogFormat(Kind::Clf)
    }

    /// Combined Log Format: the Common Log Format, `"referer"
    /// "user-agent"`, then any number of extra fields, quoted, bracketed
    /// or bare, named `extra1`, `extra2`, …; `extra_fields` is how many
    /// [`LogFormat::fields`] lists (a line may have more or fewer).
    pub fn combined(extra_fields: usize) -> Self {
        LogFormat(Kind::Combined { extra_fields })
    }

    /// `timestamp,key` lines, with an optional `timestamp,key` header; the
    /// timestamp is Unix seconds with an optional fraction or RFC 3339, and
    /// a key holding a comma is double-quoted (`""` inside for one `"`).
    pub fn csv() -> Self {
        LogFormat(Kind::Csv)
    }

    /// Envoy's default access log format (`[%START_TIME%] "%REQ(:METHOD)%
    /// …`). It has no client address: `client` is `REQ(X-FORWARDED-FOR)`.
    pub fn envoy() -> Self {
        match template::envoy(template::ENVOY_DEFAULT) {
            Ok(t) => LogFormat(Kind::Template(Arc::new(t))),
            // The default string compiles (a unit test says so).
            Err(_) => LogFormat(Kind::Clf),
        }
    }

    /// An Envoy format string (`%START_TIME%`, `%REQ(:METHOD)%`, …); the
    /// time is `%START_TIME%` in its default form.
    ///
    /// # Errors
    ///
    /// A [`FormatError`] naming the command at fault and its position.
    pub fn envoy_format(format: &str) -> Result<Self, FormatError> {
        template::envoy(format).map(|t| LogFormat(Kind::Template(Arc::new(t))))
    }

    /// An nginx `log_format` string: `$var` or `${var}`, the time from
    /// `$time_local`, `$time_iso8601` or `$msec`. A field ends where the
    /// literal text after it starts; a double-quoted field may hold `\"`.
    ///
    /// # Errors
    ///
    /// A [`FormatError`] naming the variable at fault and its position.
    pub fn nginx(format: &str) -> Result<Self, FormatError> {
        template::nginx(format).map(|t| LogFormat(Kind::Template(Arc::new(t))))
    }

    /// An Apache `LogFormat` string: `%h %l %u %t "%r" %>s %b
    /// "%{Referer}i" "%{User-Agent}i"` and the other directives; the time
    /// from `%t`, `%{sec}t`, `%{msec}t`, `%{usec}t` or `%{%d/%b/%Y:%H:%M:%S
    /// %z}t`. Fields are named by the directive as written (`%>s`,
    /// `%{X-Forwarded-For}i`; header names in any case).
    ///
    /// # Errors
    ///
    /// A [`FormatError`] naming the directive at fault and its position.
    pub fn apache(format: &str) -> Result<Self, FormatError> {
        template::apache(format).map(|t| LogFormat(Kind::Template(Arc::new(t))))
    }

    /// JSON lines, one object per line. The time is at `time_field` (a
    /// dotted key path) or, when `None`, the first of `start_time` (Envoy),
    /// `ts` (Caddy), `StartUTC` (Traefik), `time`, `timestamp`,
    /// `@timestamp`; written in `time_format`, or when `None` as a number
    /// of Unix seconds or a string of Unix seconds, RFC 3339 or CLF time.
    pub fn json(time_field: Option<&str>, time_format: Option<TimeFormat>) -> Self {
        LogFormat(Kind::Json {
            time_field: time_field.map(str::to_string),
            time_format,
        })
    }

    /// The format's short name: `clf`, `combined`, `csv`, `envoy`,
    /// `nginx`, `apache` or `json`.
    pub fn name(&self) -> &'static str {
        match &self.0 {
            Kind::Clf => "clf",
            Kind::Combined { .. } => "combined",
            Kind::Csv => "csv",
            Kind::Template(t) => t.dialect.name(),
            Kind::Json { .. } => "json",
        }
    }

    /// The names [`LogFormat::field`] knows: the format's own, then the
    /// aliases it has. For JSON, the aliases: any key path is a name too.
    pub fn fields(&self) -> Vec<String> {
        let mut out: Vec<String> = match &self.0 {
            Kind::Csv => return vec!["key".into(), "client".into()],
            Kind::Json { .. } => ALIASES.iter().filter(|&&a| a != "key").map(|a| a.to_string()).collect(),
            Kind::Clf => CLF_NAMES[..7].iter().map(|s| s.to_string()).collect(),
            Kind::Combined { extra_fields } => CLF_NAMES
                .iter()
                .map(|s| s.to_string())
                .chain((1..=*extra_fields).map(|i| format!("extra{i}")))
                .collect(),
            Kind::Template(t) => t.names.clone(),
        };
        if !matches!(self.0, Kind::Json { .. }) {
            for alias in ALIASES {
                if !out.iter().any(|n| n == alias) && self.field(alias).is_some() {
                    out.push(alias.to_string());
                }
            }
        }
        out
    }

    /// The field called `name` (see [`LogFormat::fields`]), or `None` when
    /// the format has none by that name. For JSON, every name is a key path
    /// (aliases first) and this never fails.
    pub fn field(&self, name: &str) -> Option<Field> {
        let get = match &self.0 {
            Kind::Csv => match name {
                "key" | "client" => Getter::CsvKey,
                _ => return None,
            },
            Kind::Json { .. } => match json::alias_paths(name) {
                Some(paths) if name == "path" => Getter::JsonPath(paths),
                Some(paths) => Getter::Json(paths),
                None => Getter::JsonKey(name.to_string()),
            },
            Kind::Clf => {
                let extra = name.strip_prefix("extra").is_some();
                if extra {
                    return None;
                }
                resolve(&CLF_NAMES[..7], &CLF_ROLES[..7], name, false)?
            }
            Kind::Combined { extra_fields } => match name.strip_prefix("extra").and_then(|n| n.parse::<usize>().ok()) {
                Some(n) if n >= 1 && n <= *extra_fields => Getter::Span(8 + n),
                _ => resolve(&CLF_NAMES, &CLF_ROLES, name, false)?,
            },
            Kind::Template(t) => resolve(&t.names, &t.roles, name, t.dialect != Dialect::Nginx)?,
        };
        // `client` is an address without its port (Envoy's and Caddy's
        // remote addresses have one): a client keeps one key across its
        // connections.
        let get = if name == "client" && get != Getter::CsvKey {
            Getter::Address(Box::new(get))
        } else {
            get
        };
        Some(Field {
            name: name.to_string(),
            get,
        })
    }

    /// Parses one line (no line end) into `scratch`; the time.
    fn parse(&self, text: &str, scratch: &mut Scratch) -> Result<i64, LineError> {
        match &self.0 {
            Kind::Clf => parse_log_spans(text, false, &mut scratch.spans),
            Kind::Combined { .. } => parse_log_spans(text, true, &mut scratch.spans),
            Kind::Template(t) => t.parse(text, &mut scratch.spans),
            Kind::Csv => {
                let line = parse_csv_line(text)?;
                scratch.csv_key.clear();
                scratch.csv_key.push_str(&line.key);
                Ok(line.time_unix_ns)
            }
            Kind::Json {
                time_field,
                time_format,
            } => json::parse(text, &mut scratch.json, time_field.as_deref(), *time_format),
        }
    }
}

/// The names of `names`' fields and of the aliases their roles give.
fn resolve(names: &[impl AsRef<str>], roles: &[Option<Role>], name: &str, any_case: bool) -> Option<Getter> {
    if let Some(i) = names
        .iter()
        .position(|n| n.as_ref() == name || (any_case && n.as_ref().eq_ignore_ascii_case(name)))
    {
        return Some(Getter::Span(i));
    }
    let role = |r| roles.iter().position(|x| *x == Some(r));
    let span = |r| role(r).map(Getter::Span);
    match name {
        "client" => span(Role::Client).or_else(|| span(Role::ForwardedFor)),
        "user" => span(Role::User),
        "method" => span(Role::Method).or_else(|| role(Role::Request).map(Getter::RequestMethod)),
        "path" => span(Role::Path)
            .or_else(|| role(Role::Target).map(Getter::TargetPath))
            .or_else(|| role(Role::Request).map(Getter::RequestPath)),
        "request" => span(Role::Request),
        "status" => span(Role::Status),
        "referer" => span(Role::Referer),
        "user-agent" => span(Role::UserAgent),
        "host" => span(Role::Host),
        "forwarded-for" => span(Role::ForwardedFor),
        _ => None,
    }
}

impl fmt::Display for LogFormat {
    /// What the format is, for messages: `a combined log with 1 extra
    /// field`, `an nginx log as `…``.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Kind::Clf => f.write_str("a Common Log Format log"),
            Kind::Combined { extra_fields: 0 } => f.write_str("a combined log"),
            Kind::Combined { extra_fields: 1 } => f.write_str("a combined log with 1 extra field"),
            Kind::Combined { extra_fields } => write!(f, "a combined log with {extra_fields} extra fields"),
            Kind::Csv => f.write_str("a `timestamp,key` CSV"),
            Kind::Template(t) if t.dialect == Dialect::Envoy && t.source == template::ENVOY_DEFAULT => {
                f.write_str("an Envoy log in the default format")
            }
            Kind::Template(t) => {
                let article = if t.dialect == Dialect::Envoy { "an Envoy" } else { "an" };
                let name = match t.dialect {
                    Dialect::Nginx => "nginx",
                    Dialect::Apache => "Apache",
                    Dialect::Envoy => "",
                };
                if name.is_empty() {
                    write!(f, "{article} log as `{}`", clip(&t.source))
                } else {
                    write!(f, "{article} {name} log as `{}`", clip(&t.source))
                }
            }
            Kind::Json {
                time_field: Some(field),
                time_format,
            } => {
                write!(f, "JSON lines with the time at `{field}`")?;
                if let Some(tf) = time_format {
                    write!(f, " as {tf}")?;
                }
                Ok(())
            }
            Kind::Json { time_format, .. } => {
                f.write_str("JSON lines")?;
                if let Some(tf) = time_format {
                    write!(f, " with the time as {tf}")?;
                }
                Ok(())
            }
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Getter {
    Span(usize),
    TargetPath(usize),
    RequestPath(usize),
    RequestMethod(usize),
    CsvKey,
    Json(&'static [&'static str]),
    JsonPath(&'static [&'static str]),
    JsonKey(String),
    /// A field of a log with no line: never found.
    Nothing,
    /// Another getter's address without its port.
    Address(Box<Getter>),
}

/// A field of a [`LogFormat`], resolved from its name once (see
/// [`LogFormat::field`] and [`LogReader::field`]) and looked up in each
/// [`Record`] cheaply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    name: String,
    get: Getter,
}

impl Field {
    /// The name it was asked for by.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// Per-line buffers, reused from line to line.
#[derive(Default)]
struct Scratch {
    spans: Vec<(usize, usize)>,
    csv_key: String,
    json: Value,
}

/// One well-formed line of a log: its number, its time and its fields
/// (see [`Record::get`]). It borrows the reader's buffers.
#[derive(Clone, Copy, Debug)]
pub struct Record<'a> {
    line: u64,
    time_unix_ns: i64,
    text: &'a str,
    spans: &'a [(usize, usize)],
    csv_key: &'a str,
    json: &'a Value,
}

/// The target of a request line (`GET /a?b HTTP/1.1`), or the whole line
/// when it has none (`-`).
fn request_target(request: &str) -> &str {
    let mut words = request.split_ascii_whitespace();
    match (words.next(), words.next()) {
        (Some(_), Some(target)) => target,
        _ => request,
    }
}

fn without_query(target: &str) -> &str {
    target.split('?').next().unwrap_or(target)
}

impl<'a> Record<'a> {
    /// The 1-based line number.
    pub fn line(&self) -> u64 {
        self.line
    }

    /// The time, in nanoseconds since the Unix epoch (UTC).
    pub fn time_unix_ns(&self) -> i64 {
        self.time_unix_ns
    }

    /// The line as read (without its line end).
    pub fn text(&self) -> &'a str {
        self.text
    }

    /// The value of `field`, `None` when this line does not have it (an
    /// `extra3` of a line with two extra fields, a JSON key not in the
    /// object, a JSON null). Text fields are borrowed from the line as
    /// written (a quoted field without its quotes, `\"` escapes kept, `-`
    /// for an empty value); JSON numbers are formatted.
    pub fn get(&self, field: &Field) -> Option<Cow<'a, str>> {
        self.get_by(&field.get)
    }

    fn get_by(&self, getter: &Getter) -> Option<Cow<'a, str>> {
        let span = |i: usize| {
            let &(from, to) = self.spans.get(i)?;
            self.text.get(from..to)
        };
        let json_first = |paths: &[&str]| {
            paths
                .iter()
                .find_map(|p| json::lookup(self.json, p).and_then(json::text))
        };
        match getter {
            Getter::Address(inner) => self.get_by(inner).map(|a| match a {
                Cow::Borrowed(a) => Cow::Borrowed(without_port(a)),
                Cow::Owned(a) => Cow::Owned(without_port(&a).to_owned()),
            }),
            Getter::Span(i) => span(*i).map(Cow::Borrowed),
            Getter::TargetPath(i) => span(*i).map(|t| Cow::Borrowed(without_query(t))),
            Getter::RequestPath(i) => span(*i).map(|r| {
                let target = request_target(r);
                Cow::Borrowed(if target.len() == r.len() {
                    r
                } else {
                    without_query(target)
                })
            }),
            Getter::RequestMethod(i) => span(*i)
                .and_then(|r| r.split_ascii_whitespace().next())
                .map(Cow::Borrowed),
            Getter::CsvKey => Some(Cow::Borrowed(self.csv_key)),
            Getter::Json(paths) => json_first(paths),
            Getter::JsonPath(paths) => json_first(paths).map(|v| match v {
                Cow::Borrowed(s) => Cow::Borrowed(without_query(s)),
                Cow::Owned(s) => Cow::Owned(without_query(&s).to_string()),
            }),
            Getter::JsonKey(path) => json::lookup(self.json, path).and_then(json::text),
            Getter::Nothing => None,
        }
    }
}

/// An address without its port: `192.0.2.1` of `192.0.2.1:51234`, `2001:db8::1`
/// of `[2001:db8::1]:443`; anything else (an address without a port, a bare
/// IPv6 address, a name) as it is.
fn without_port(address: &str) -> &str {
    if let Some(rest) = address.strip_prefix('[')
        && let Some((host, port)) = rest.split_once("]:")
        && !port.is_empty()
        && port.bytes().all(|b| b.is_ascii_digit())
    {
        return host;
    }
    match address.split_once(':') {
        Some((host, port)) if !host.is_empty() && !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => address,
    }
}

/// Which format to read a log as: named, or detected.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum FormatChoice {
    /// Detected from the first [`DETECTION_LINES`] non-empty lines, or
    /// from the format string when one is given (`$`: nginx, `%`: Apache).
    #[default]
    Auto,
    /// [`LogFormat::clf`].
    Clf,
    /// [`LogFormat::combined`], the extra fields counted on the first lines.
    Combined,
    /// [`LogFormat::csv`].
    Csv,
    /// [`LogFormat::envoy`], or [`LogFormat::envoy_format`] with a format
    /// string.
    Envoy,
    /// [`LogFormat::json`].
    Json,
    /// [`LogFormat::nginx`]; needs the format string.
    Nginx,
    /// [`LogFormat::apache`]; needs the format string.
    Apache,
}

impl FormatChoice {
    /// Every choice's name, in the order of the variants.
    pub const NAMES: [&'static str; 8] = ["auto", "clf", "combined", "csv", "envoy", "json", "nginx", "apache"];
}

/// How to open a log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogOptions {
    /// The format, or how to find it.
    pub format: FormatChoice,
    /// An nginx `log_format` or Apache `LogFormat` string (or an Envoy one
    /// with [`FormatChoice::Envoy`]).
    pub log_format: Option<String>,
    /// JSON: the time's key path (see [`LogFormat::json`]).
    pub time_field: Option<String>,
    /// JSON: how the time is written.
    pub time_format: Option<TimeFormat>,
    /// What a malformed line does.
    pub on_error: OnError,
}

/// How the format of a log was found, when it was detected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Detection {
    /// The non-empty lines looked at.
    pub sampled: usize,
    /// How many of them parse in the format chosen.
    pub parsed: usize,
}

/// Reads a log one [`Record`] at a time, counting lines and keeping the
/// first [`REPORTED_BAD_LINES`] malformed ones; its memory does not grow
/// with the log (one line's buffers, the first lines while the format is
/// detected, the bad lines kept).
pub struct LogReader<R> {
    name: String,
    input: R,
    format: Option<LogFormat>,
    detection: Option<Detection>,
    on_error: OnError,
    /// Lines read for detection and not yet returned: (number, bytes).
    pending: VecDeque<(u64, Vec<u8>)>,
    line: String,
    spare: Vec<u8>,
    scratch: Scratch,
    current: u64,
    time: i64,
    lines: u64,
    non_empty: u64,
    records: u64,
    skipped: u64,
    bytes: u64,
    seen_first: bool,
    bad_lines: Vec<BadLine>,
}

impl<R: BufRead> LogReader<R> {
    /// A reader of the log called `name` (for messages) from `input`. The
    /// format is found now: the first [`DETECTION_LINES`] non-empty lines
    /// are read, and parsed again by [`LogReader::next_record`].
    ///
    /// # Errors
    ///
    /// [`TraceError::Io`], [`TraceError::Format`] for a bad format string,
    /// [`TraceError::MissingLogFormat`] for nginx or Apache without one,
    /// and [`TraceError::UnknownFormat`] when nothing fits the first lines.
    pub fn new(name: &str, input: R, options: &LogOptions) -> Result<Self, TraceError> {
        let mut reader = LogReader {
            name: name.to_string(),
            input,
            format: None,
            detection: None,
            on_error: options.on_error,
            pending: VecDeque::new(),
            line: String::new(),
            spare: Vec::new(),
            scratch: Scratch::default(),
            current: 0,
            time: 0,
            lines: 0,
            non_empty: 0,
            records: 0,
            skipped: 0,
            bytes: 0,
            seen_first: false,
            bad_lines: Vec::new(),
        };
        while reader.pending.len() < DETECTION_LINES {
            let mut bytes = Vec::new();
            let n = reader
                .input
                .read_until(b'\n', &mut bytes)
                .map_err(|error| reader.io(error))?;
            if n == 0 {
                break;
            }
            reader.lines += 1;
            reader.bytes += n as u64;
            trim_line(&mut bytes, reader.lines == 1);
            if !is_blank(&bytes) {
                reader.pending.push_back((reader.lines, bytes));
            }
        }
        let samples: Vec<(u64, Cow<'_, str>)> = reader
            .pending
            .iter()
            .map(|(n, b)| (*n, String::from_utf8_lossy(b)))
            .collect();
        let format_error = |error| TraceError::Format {
            file: name.to_string(),
            error,
        };
        let template = |choice: FormatChoice| -> Result<LogFormat, TraceError> {
            let Some(s) = options.log_format.as_deref() else {
                return Err(TraceError::MissingLogFormat {
                    format: if choice == FormatChoice::Nginx {
                        "nginx"
                    } else {
                        "apache"
                    },
                });
            };
            match choice {
                FormatChoice::Nginx => LogFormat::nginx(s),
                _ => LogFormat::apache(s),
            }
            .map_err(format_error)
        };
        let json = || LogFormat::json(options.time_field.as_deref(), options.time_format);
        let format = match options.format {
            FormatChoice::Clf => Some(LogFormat::clf()),
            FormatChoice::Combined => Some(LogFormat::combined(extra_fields(&samples))),
            FormatChoice::Csv => Some(LogFormat::csv()),
            FormatChoice::Envoy => Some(match options.log_format.as_deref() {
                Some(s) => LogFormat::envoy_format(s).map_err(format_error)?,
                None => LogFormat::envoy(),
            }),
            FormatChoice::Json => Some(json()),
            FormatChoice::Nginx | FormatChoice::Apache => Some(template(options.format)?),
            FormatChoice::Auto => match options.log_format.as_deref() {
                Some(s) if s.contains('$') => Some(template(FormatChoice::Nginx)?),
                Some(s) if s.contains('%') => Some(template(FormatChoice::Apache)?),
                Some(s) => {
                    return Err(format_error(FormatError {
                        dialect: "nginx or apache",
                        directive: clip(s),
                        position: 1,
                        reason: "has no `$` variable nor `%` directive",
                    }));
                }
                None if samples.is_empty() => None,
                None => {
                    let (format, parsed) = detect(&samples, json()).ok_or_else(|| TraceError::UnknownFormat {
                        file: name.to_string(),
                        line: samples.first().map_or(1, |s| s.0),
                    })?;
                    reader.detection = Some(Detection {
                        sampled: samples.len(),
                        parsed,
                    });
                    Some(format)
                }
            },
        };
        drop(samples);
        reader.format = format;
        Ok(reader)
    }

    /// The format lines are read as (`None` for a log with no non-empty
    /// line, when it was to be detected).
    pub fn format(&self) -> Option<&LogFormat> {
        self.format.as_ref()
    }

    /// How the format was detected (`None` when it was given).
    pub fn detection(&self) -> Option<&Detection> {
        self.detection.as_ref()
    }

    /// The field called `name` in this log's format.
    ///
    /// # Errors
    ///
    /// [`TraceError::FieldNotInFormat`] listing the names there are. For
    /// JSON, a name that is not an alias must be a key path of one of the
    /// first lines.
    pub fn field(&self, name: &str) -> Result<Field, TraceError> {
        let Some(format) = &self.format else {
            return Ok(Field {
                name: name.to_string(),
                get: Getter::Nothing,
            });
        };
        let missing = |expected: Vec<String>| TraceError::FieldNotInFormat {
            file: self.name.clone(),
            field: name.to_string(),
            format: format.to_string(),
            expected,
        };
        let field = format.field(name).ok_or_else(|| missing(format.fields()))?;
        if let Getter::JsonKey(path) = &field.get {
            let mut first = None;
            let mut found = false;
            for (_, bytes) in &self.pending {
                let Ok(v) = serde_json::from_slice::<Value>(bytes) else {
                    continue;
                };
                found |= json::lookup(&v, path).is_some();
                first.get_or_insert(v);
            }
            if let Some(first) = first
                && !found
            {
                let mut expected = format.fields();
                json::key_paths(&first, "", &mut expected, 40);
                return Err(missing(expected));
            }
        }
        Ok(field)
    }

    /// The next well-formed line, `None` at the end. Malformed lines are
    /// counted and the first few kept ([`LogReader::bad_lines`]) with
    /// [`OnError::Skip`]; blank lines and a CSV header are passed over.
    ///
    /// # Errors
    ///
    /// [`TraceError::Io`], and [`TraceError::BadLine`] at a malformed line
    /// with [`OnError::Stop`].
    pub fn next_record(&mut self) -> Result<Option<Record<'_>>, TraceError> {
        let Some(format) = self.format.clone() else {
            return Ok(None);
        };
        loop {
            let utf8 = match self.next_line()? {
                None => return Ok(None),
                Some(ok) => ok,
            };
            let is_utf8 = utf8.is_ok();
            let first = !self.seen_first;
            self.seen_first = true;
            let parsed = match utf8 {
                Err(error) => Err(error),
                Ok(()) if first && format.0 == Kind::Csv && is_csv_header(&self.line) => continue,
                Ok(()) => format.parse(&self.line, &mut self.scratch),
            };
            match parsed {
                Ok(time) => {
                    self.time = time;
                    self.records += 1;
                    break;
                }
                Err(error) => {
                    let text = if is_utf8 {
                        clip_to(&self.line, BAD_LINE_TEXT)
                    } else {
                        clip_to(&String::from_utf8_lossy(&self.spare), BAD_LINE_TEXT)
                    };
                    match self.on_error {
                        OnError::Stop => {
                            return Err(TraceError::BadLine {
                                file: self.name.clone(),
                                line: self.current,
                                error,
                                format: format.to_string(),
                                text,
                            });
                        }
                        OnError::Skip => {
                            self.skipped += 1;
                            if self.bad_lines.len() < REPORTED_BAD_LINES {
                                self.bad_lines.push(BadLine {
                                    line: self.current,
                                    error,
                                    text,
                                });
                            }
                        }
                    }
                }
            }
        }
        Ok(Some(Record {
            line: self.current,
            time_unix_ns: self.time,
            text: &self.line,
            spans: &self.scratch.spans,
            csv_key: &self.scratch.csv_key,
            json: &self.scratch.json,
        }))
    }

    /// Reads the next non-empty line into `self.line` (or, not UTF-8, into
    /// `self.spare`); `None` at the end.
    fn next_line(&mut self) -> Result<Option<Result<(), LineError>>, TraceError> {
        let mut bytes = std::mem::take(&mut self.line).into_bytes();
        loop {
            if let Some((number, line)) = self.pending.pop_front() {
                self.current = number;
                bytes = line;
            } else {
                bytes.clear();
                let n = self
                    .input
                    .read_until(b'\n', &mut bytes)
                    .map_err(|error| self.io(error))?;
                if n == 0 {
                    self.line = String::from_utf8(bytes).unwrap_or_default();
                    return Ok(None);
                }
                self.lines += 1;
                self.bytes += n as u64;
                self.current = self.lines;
                trim_line(&mut bytes, self.lines == 1);
                if is_blank(&bytes) {
                    continue;
                }
            }
            self.non_empty += 1;
            return Ok(Some(match String::from_utf8(bytes) {
                Ok(line) => {
                    self.line = line;
                    Ok(())
                }
                Err(e) => {
                    let byte = e.utf8_error().valid_up_to() + 1;
                    self.spare = e.into_bytes();
                    Err(LineError::InvalidUtf8 { byte })
                }
            }));
        }
    }

    fn io(&self, error: io::Error) -> TraceError {
        TraceError::Io {
            file: self.name.clone(),
            error,
        }
    }

    /// The log's name, as given.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Lines read so far, blank ones included.
    pub fn lines(&self) -> u64 {
        self.lines
    }

    /// Well-formed lines returned so far.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Malformed lines skipped so far.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    /// Bytes read from the input so far (after decompression).
    pub fn bytes_read(&self) -> u64 {
        self.bytes
    }

    /// The first [`REPORTED_BAD_LINES`] malformed lines skipped.
    pub fn bad_lines(&self) -> &[BadLine] {
        &self.bad_lines
    }

    /// The error to give when the log had no well-formed line: why, with
    /// the first malformed lines.
    pub fn no_requests(&self) -> TraceError {
        TraceError::NoRequests {
            file: self.name.clone(),
            non_empty: self.non_empty,
            malformed: self.skipped,
            format: self.format.as_ref().map(ToString::to_string),
            first: self.bad_lines.iter().take(3).cloned().collect(),
        }
    }
}

/// Drops the line end, and a UTF-8 byte order mark on the first line.
fn trim_line(bytes: &mut Vec<u8>, first: bool) {
    if bytes.last() == Some(&b'\n') {
        bytes.pop();
    }
    if bytes.last() == Some(&b'\r') {
        bytes.pop();
    }
    if first && bytes.starts_with(b"\xEF\xBB\xBF") {
        bytes.drain(..3);
    }
}

fn is_blank(bytes: &[u8]) -> bool {
    bytes.iter().all(u8::is_ascii_whitespace)
}

/// The most extra fields a combined line of `samples` has.
fn extra_fields(samples: &[(u64, Cow<'_, str>)]) -> usize {
    let mut spans = Vec::new();
    samples
        .iter()
        .filter_map(|(_, s)| {
            parse_log_spans(s, true, &mut spans).ok()?;
            Some(spans.len().saturating_sub(9))
        })
        .max()
        .unwrap_or(0)
}

/// The format most of `samples` parse as, and how many do; by their shape
/// when none parses.
fn detect(samples: &[(u64, Cow<'_, str>)], json: LogFormat) -> Option<(LogFormat, usize)> {
    let mut scratch = Scratch::default();
    let candidates = [
        json,
        LogFormat::csv(),
        LogFormat::envoy(),
        LogFormat::combined(extra_fields(samples)),
        LogFormat::clf(),
    ];
    let mut best: Option<(usize, usize)> = None;
    for (i, format) in candidates.iter().enumerate() {
        let parsed = samples
            .iter()
            .enumerate()
            .filter(|(n, (_, s))| {
                (*n == 0 && format.0 == Kind::Csv && is_csv_header(s)) || format.parse(s, &mut scratch).is_ok()
            })
            .count();
        if parsed > 0 && best.is_none_or(|(_, most)| parsed > most) {
            best = Some((i, parsed));
        }
    }
    if let Some((i, parsed)) = best {
        return candidates.into_iter().nth(i).map(|f| (f, parsed));
    }
    // Nothing parses: the first line's shape tells.
    let line = samples.first()?.1.trim_start();
    let quotes = line.bytes().filter(|&b| b == b'"').count();
    let format = if line.starts_with('{') {
        candidates.into_iter().next()?
    } else if line.starts_with('[') && line.as_bytes().get(5) == Some(&b'-') {
        LogFormat::envoy()
    } else if line.contains(['[', ']']) && quotes >= 2 {
        if quotes >= 6 {
            LogFormat::combined(extra_fields(samples))
        } else {
            LogFormat::clf()
        }
    } else if line.contains(',') {
        LogFormat::csv()
    } else {
        return None;
    };
    Some((format, 0))
}

/// A count of bytes read, shared with the reader that counts them.
#[derive(Clone, Debug, Default)]
pub struct ByteCount(Arc<AtomicU64>);

impl ByteCount {
    /// Bytes read so far.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

struct Counting<R> {
    inner: R,
    count: ByteCount,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count.0.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// An opened log file: its lines, decompressed when the file is gzip.
pub struct LogInput {
    inner: Box<dyn BufRead + Send>,
    consumed: ByteCount,
    len: u64,
    gzip: bool,
}

impl LogInput {
    /// Bytes of the file read so far (compressed bytes for gzip): for a
    /// progress bar over [`LogInput::len`].
    pub fn consumed(&self) -> ByteCount {
        self.consumed.clone()
    }

    /// The file's size in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the file is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the file is gzip-compressed.
    pub fn is_gzip(&self) -> bool {
        self.gzip
    }
}

impl Read for LogInput {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.read(buf)
    }
}

impl BufRead for LogInput {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        self.inner.fill_buf()
    }

    fn consume(&mut self, amount: usize) {
        self.inner.consume(amount);
    }
}

/// Opens the log at `path`, gzip-compressed (told by its first bytes,
/// `1f 8b`, whatever its name; several members are read one after the
/// other) or not.
///
/// # Errors
///
/// The file's opening and first read.
pub fn open_log(path: &Path) -> io::Result<LogInput> {
    let file = File::open(path)?;
    let len = file.metadata().map_or(0, |m| m.len());
    let consumed = ByteCount::default();
    let mut raw = BufReader::with_capacity(
        1 << 16,
        Counting {
            inner: file,
            count: consumed.clone(),
        },
    );
    let gzip = raw.fill_buf()?.starts_with(&[0x1f, 0x8b]);
    let inner: Box<dyn BufRead + Send> = if gzip {
        Box::new(BufReader::with_capacity(
            1 << 16,
            flate2::bufread::MultiGzDecoder::new(raw),
        ))
    } else {
        Box::new(raw)
    };
    Ok(LogInput {
        inner,
        consumed,
        len,
        gzip,
    })
}

/// Opens the log at `path` ([`open_log`]) and a [`LogReader`] over it.
///
/// # Errors
///
/// [`TraceError::Io`] when the file cannot be opened, and those of
/// [`LogReader::new`].
pub fn open_log_file(path: &Path, options: &LogOptions) -> Result<LogReader<LogInput>, TraceError> {
    let name = path.display().to_string();
    let input = open_log(path).map_err(|error| TraceError::Io {
        file: name.clone(),
        error,
    })?;
    LogReader::new(&name, input, options)
}

#[cfg(test)]
mod tests;
