//! Log format strings (nginx `log_format`, Apache `LogFormat`, Envoy
//! format strings) compiled into one template of literal text and fields,
//! and lines matched against it.

use super::{FormatError, Role, TimeKind};
use crate::errors::{LineError, clip};

/// Which server's format string a template was compiled from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Dialect {
    Nginx,
    Apache,
    Envoy,
}

impl Dialect {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Dialect::Nginx => "nginx",
            Dialect::Apache => "apache",
            Dialect::Envoy => "envoy",
        }
    }
}

/// How a field's end is found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Shape {
    /// Up to the literal text that follows (or the end of the line).
    Text,
    /// `[` … `]`, brackets included (Apache's `%t`).
    Bracketed,
    /// Exactly 26 bytes: `dd/Mon/yyyy:HH:MM:SS ±hhmm`.
    ClfTime,
    /// `?` or nothing (nginx's `$is_args`).
    IsArgs,
    /// A query string starting with `?`, or nothing (Apache's `%q`); the
    /// field before it may end where it starts.
    Query,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Item {
    Literal(String),
    Field { index: usize, shape: Shape },
}

/// A compiled format string.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Template {
    pub(crate) dialect: Dialect,
    pub(crate) source: String,
    items: Vec<Item>,
    /// Each field's name, by index.
    pub(crate) names: Vec<String>,
    /// Each field's role, by index.
    pub(crate) roles: Vec<Option<Role>>,
    /// The time field and how to read it.
    pub(crate) time: (usize, TimeKind),
}

/// Envoy's default access log format string.
pub(crate) const ENVOY_DEFAULT: &str = "[%START_TIME%] \"%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% \
     %PROTOCOL%\" %RESPONSE_CODE% %RESPONSE_FLAGS% %BYTES_RECEIVED% %BYTES_SENT% %DURATION% \
     %RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% \"%REQ(X-FORWARDED-FOR)%\" \"%REQ(USER-AGENT)%\" \
     \"%REQ(X-REQUEST-ID)%\" \"%REQ(:AUTHORITY)%\" \"%UPSTREAM_HOST%\"";

struct Builder {
    dialect: Dialect,
    source: String,
    items: Vec<Item>,
    names: Vec<String>,
    roles: Vec<Option<Role>>,
    time: Option<(usize, TimeKind)>,
}

impl Builder {
    fn new(dialect: Dialect, source: &str) -> Self {
        Builder {
            dialect,
            source: source.to_string(),
            items: Vec::new(),
            names: Vec::new(),
            roles: Vec::new(),
            time: None,
        }
    }

    fn error(&self, directive: &str, position: usize, reason: &'static str) -> FormatError {
        FormatError {
            dialect: self.dialect.name(),
            directive: clip(directive),
            position,
            reason,
        }
    }

    fn literal(&mut self, c: char) {
        if let Some(Item::Literal(s)) = self.items.last_mut() {
            s.push(c);
        } else {
            self.items.push(Item::Literal(c.to_string()));
        }
    }

    /// Adds a field; `directive` and `position` name it in errors.
    fn field(
        &mut self,
        name: String,
        role: Option<Role>,
        shape: Shape,
        time: Option<TimeKind>,
        position: usize,
    ) -> Result<(), FormatError> {
        if let Some(Item::Field { shape: before, .. }) = self.items.last() {
            let fits = matches!(shape, Shape::Query | Shape::IsArgs) || *before == Shape::IsArgs;
            if !fits {
                return Err(self.error(&name, position, "follows another field with no text between them"));
            }
        }
        let index = self.names.len();
        if let Some(kind) = time
            && self.time.is_none()
        {
            self.time = Some((index, kind));
        }
        self.names.push(name);
        self.roles.push(role);
        self.items.push(Item::Field { index, shape });
        Ok(())
    }

    fn finish(mut self, no_time: &'static str) -> Result<Template, FormatError> {
        // A format string written with its line end: the line has none.
        if let Some(Item::Literal(s)) = self.items.last_mut() {
            let trimmed = s.trim_end_matches(['\n', '\r']).trim_end_matches("\\n").len();
            s.truncate(trimmed);
            if s.is_empty() {
                self.items.pop();
            }
        }
        let Some(time) = self.time else {
            return Err(FormatError {
                dialect: self.dialect.name(),
                directive: clip(&self.source),
                position: 1,
                reason: no_time,
            });
        };
        Ok(Template {
            dialect: self.dialect,
            source: self.source,
            items: self.items,
            names: self.names,
            roles: self.roles,
            time,
        })
    }
}

/// Compiles an nginx `log_format` string (`$var` and `${var}`).
pub(crate) fn nginx(source: &str) -> Result<Template, FormatError> {
    let mut b = Builder::new(Dialect::Nginx, source);
    let mut chars = source.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        if c != '$' {
            b.literal(c);
            continue;
        }
        let position = at + 1;
        let braced = chars.peek().is_some_and(|&(_, c)| c == '{');
        if braced {
            chars.next();
        }
        let mut name = String::new();
        while let Some(&(_, c)) = chars.peek() {
            if c.is_ascii_alphanumeric() || c == '_' {
                name.push(c);
                chars.next();
            } else {
                break;
            }
        }
        if braced && chars.next().map(|(_, c)| c) != Some('}') {
            return Err(b.error(&format!("${{{name}"), position, "has no closing `}`"));
        }
        if name.is_empty() {
            return Err(b.error("$", position, "is not followed by a variable name"));
        }
        let (role, shape, time) = match name.as_str() {
            "remote_addr" | "realip_remote_addr" => (Some(Role::Client), Shape::Text, None),
            "remote_user" => (Some(Role::User), Shape::Text, None),
            "time_local" => (None, Shape::ClfTime, Some(TimeKind::Clf)),
            "time_iso8601" => (None, Shape::Text, Some(TimeKind::Rfc3339)),
            "msec" => (None, Shape::Text, Some(TimeKind::UnixSeconds)),
            "request" => (Some(Role::Request), Shape::Text, None),
            "request_method" => (Some(Role::Method), Shape::Text, None),
            "uri" | "document_uri" => (Some(Role::Path), Shape::Text, None),
            "request_uri" => (Some(Role::Target), Shape::Text, None),
            "status" => (Some(Role::Status), Shape::Text, None),
            "http_referer" => (Some(Role::Referer), Shape::Text, None),
            "http_user_agent" => (Some(Role::UserAgent), Shape::Text, None),
            "http_x_forwarded_for" => (Some(Role::ForwardedFor), Shape::Text, None),
            "host" | "http_host" | "server_name" => (Some(Role::Host), Shape::Text, None),
            "is_args" => (None, Shape::IsArgs, None),
            _ => (None, Shape::Text, None),
        };
        b.field(name, role, shape, time, position)?;
    }
    b.finish("has no time: expected $time_local, $time_iso8601 or $msec")
}

/// Compiles an Apache `LogFormat` string (`%h`, `%>s`, `%{Referer}i`, …).
pub(crate) fn apache(source: &str) -> Result<Template, FormatError> {
    let mut b = Builder::new(Dialect::Apache, source);
    let mut chars = source.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        if c != '%' {
            b.literal(c);
            continue;
        }
        let position = at + 1;
        if chars.peek().is_some_and(|&(_, c)| c == '%') {
            chars.next();
            b.literal('%');
            continue;
        }
        let mut written = String::from("%");
        // Conditions (`!200,304`) and `<` / `>` modifiers.
        while let Some(&(_, c)) = chars.peek() {
            if c == '<' || c == '>' || c == '!' || c == ',' || c.is_ascii_digit() {
                written.push(c);
                chars.next();
            } else {
                break;
            }
        }
        let mut argument = None;
        if chars.peek().is_some_and(|&(_, c)| c == '{') {
            chars.next();
            let mut arg = String::new();
            let mut closed = false;
            for (_, c) in chars.by_ref() {
                if c == '}' {
                    closed = true;
                    break;
                }
                arg.push(c);
            }
            if !closed {
                return Err(b.error(&format!("%{{{arg}"), position, "has no closing `}`"));
            }
            written.push('{');
            written.push_str(&arg);
            written.push('}');
            argument = Some(arg);
        }
        let Some((_, letter)) = chars.next() else {
            return Err(b.error(&written, position, "has no directive letter"));
        };
        written.push(letter);
        let header = argument.as_deref().map(str::to_ascii_lowercase);
        let (role, shape, time) = match (letter, header.as_deref()) {
            ('h' | 'a', _) => (Some(Role::Client), Shape::Text, None),
            ('u', _) => (Some(Role::User), Shape::Text, None),
            ('t', None) => (None, Shape::Bracketed, Some(TimeKind::ClfBracketed)),
            ('t', Some(format)) => {
                let format = format
                    .strip_prefix("begin:")
                    .or_else(|| format.strip_prefix("end:"))
                    .unwrap_or(format);
                match format {
                    "%d/%b/%y:%h:%m:%s %z" => (None, Shape::ClfTime, Some(TimeKind::Clf)),
                    "sec" => (None, Shape::Text, Some(TimeKind::UnixSeconds)),
                    "msec" => (None, Shape::Text, Some(TimeKind::UnixMillis)),
                    "usec" => (None, Shape::Text, Some(TimeKind::UnixMicros)),
                    _ => {
                        return Err(b.error(
                            &written,
                            position,
                            "is a time format not supported: expected %t, %{sec}t, %{msec}t, %{usec}t or \
                             %{%d/%b/%Y:%H:%M:%S %z}t",
                        ));
                    }
                }
            }
            ('r', None) => (Some(Role::Request), Shape::Text, None),
            ('s', None) => (Some(Role::Status), Shape::Text, None),
            ('m', None) => (Some(Role::Method), Shape::Text, None),
            ('U', None) => (Some(Role::Path), Shape::Text, None),
            ('q', None) => (None, Shape::Query, None),
            ('v' | 'V', None) => (Some(Role::Host), Shape::Text, None),
            ('i', Some("referer")) => (Some(Role::Referer), Shape::Text, None),
            ('i', Some("user-agent")) => (Some(Role::UserAgent), Shape::Text, None),
            ('i', Some("x-forwarded-for")) => (Some(Role::ForwardedFor), Shape::Text, None),
            ('i', Some("host")) => (Some(Role::Host), Shape::Text, None),
            ('i' | 'o' | 'e' | 'n' | 'C' | 'x' | '^', Some(_)) => (None, Shape::Text, None),
            ('p' | 'P' | 'T' | 'D' | 'L', Some(_)) => (None, Shape::Text, None),
            ('b' | 'B' | 'D' | 'f' | 'H' | 'I' | 'k' | 'l' | 'O' | 'p' | 'P' | 'R' | 'S' | 'T' | 'X' | 'L', None) => {
                (None, Shape::Text, None)
            }
            _ => return Err(b.error(&written, position, "is not an Apache log directive")),
        };
        // `%>s` and `%s` are one field for lookups: the written form names it.
        b.field(written, role, shape, time, position)?;
    }
    b.finish("has no time: expected %t or %{...}t")
}

/// Compiles an Envoy format string (`%START_TIME%`, `%REQ(:METHOD)%`, …).
pub(crate) fn envoy(source: &str) -> Result<Template, FormatError> {
    let mut b = Builder::new(Dialect::Envoy, source);
    let mut chars = source.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        if c != '%' {
            b.literal(c);
            continue;
        }
        let position = at + 1;
        let mut command = String::new();
        let mut closed = false;
        for (_, c) in chars.by_ref() {
            if c == '%' {
                closed = true;
                break;
            }
            command.push(c);
        }
        if !closed {
            return Err(b.error(&format!("%{command}"), position, "has no closing `%`"));
        }
        if command.is_empty() {
            b.literal('%');
            continue;
        }
        // `%REQ(USER-AGENT):10%` truncates: the name is the part before.
        let name = match command.rfind(')') {
            Some(close) => command.get(..=close).unwrap_or(&command),
            None => command.split(':').next().unwrap_or(&command),
        };
        let upper = name.to_ascii_uppercase();
        let (role, time) = match upper.as_str() {
            "START_TIME" => (None, Some(TimeKind::Rfc3339)),
            "REQ(:METHOD)" => (Some(Role::Method), None),
            "REQ(X-ENVOY-ORIGINAL-PATH?:PATH)" | "REQ(:PATH)" => (Some(Role::Target), None),
            "REQ(:AUTHORITY)" | "REQ(HOST)" => (Some(Role::Host), None),
            "REQ(X-FORWARDED-FOR)" => (Some(Role::ForwardedFor), None),
            "REQ(USER-AGENT)" => (Some(Role::UserAgent), None),
            "REQ(REFERER)" => (Some(Role::Referer), None),
            "RESPONSE_CODE" => (Some(Role::Status), None),
            "DOWNSTREAM_REMOTE_ADDRESS"
            | "DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT"
            | "DOWNSTREAM_DIRECT_REMOTE_ADDRESS"
            | "DOWNSTREAM_DIRECT_REMOTE_ADDRESS_WITHOUT_PORT" => (Some(Role::Client), None),
            _ if upper.starts_with("START_TIME(") => {
                return Err(b.error(
                    &format!("%{command}%"),
                    position,
                    "is a time format not supported: expected %START_TIME% (RFC 3339)",
                ));
            }
            _ => (None, None),
        };
        if !name.bytes().all(|c| c.is_ascii_graphic()) {
            return Err(b.error(&format!("%{command}%"), position, "is not an Envoy command"));
        }
        b.field(name.to_string(), role, Shape::Text, time, position)?;
    }
    b.finish("has no time: expected %START_TIME%")
}

/// The end of a field starting at `from` that `literal` follows: the first
/// place `literal` starts, skipping `\x` escapes when the field is quoted.
fn find_literal(text: &str, from: usize, literal: &str, quoted: bool) -> Option<usize> {
    let rest = text.get(from..)?;
    if !quoted {
        return rest.find(literal).map(|at| from + at);
    }
    let b = rest.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\\' => i += 2,
            b'"' if rest.get(i..).is_some_and(|r| r.starts_with(literal)) => return Some(from + i),
            _ => i += 1,
        }
    }
    None
}

impl Template {
    /// Matches `text`, writing each field's byte range into `spans` (by
    /// field index); returns the time.
    pub(crate) fn parse(&self, text: &str, spans: &mut Vec<(usize, usize)>) -> Result<i64, LineError> {
        spans.clear();
        spans.resize(self.names.len(), (0, 0));
        let mut pos = 0;
        let mut after = "the start of the line";
        for (i, item) in self.items.iter().enumerate() {
            let rest = text.get(pos..).unwrap_or("");
            match item {
                Item::Literal(literal) => {
                    if !rest.starts_with(literal.as_str()) {
                        return Err(LineError::MissingText {
                            expected: literal.clone(),
                            after: after.to_string(),
                            found: clip(rest),
                        });
                    }
                    pos += literal.len();
                }
                &Item::Field { index, shape } => {
                    let name = self.names.get(index).map_or("", String::as_str);
                    let end = self.field_end(text, pos, i, shape, name)?;
                    if let Some(span) = spans.get_mut(index) {
                        *span = (pos, end);
                    }
                    pos = end;
                    after = name;
                }
            }
        }
        if pos < text.len() {
            return Err(LineError::TrailingText {
                text: clip(text.get(pos..).unwrap_or("")),
            });
        }
        let (index, kind) = self.time;
        let (from, to) = spans.get(index).copied().unwrap_or((0, 0));
        kind.parse(text.get(from..to).unwrap_or(""))
    }

    fn field_end(&self, text: &str, pos: usize, i: usize, shape: Shape, name: &str) -> Result<usize, LineError> {
        let rest = text.get(pos..).unwrap_or("");
        let missing = |expected: &str| LineError::MissingText {
            expected: expected.to_string(),
            after: name.to_string(),
            found: clip(rest),
        };
        match shape {
            Shape::Bracketed => {
                if !rest.starts_with('[') {
                    return Err(LineError::MissingBracket { found: clip(rest) });
                }
                return rest.find(']').map(|at| pos + at + 1).ok_or(LineError::UnclosedBracket);
            }
            Shape::IsArgs => return Ok(if rest.starts_with('?') { pos + 1 } else { pos }),
            Shape::ClfTime => {
                if rest.len() >= 26 && rest.is_char_boundary(26) {
                    return Ok(pos + 26);
                }
                return Err(LineError::BadDate {
                    date: clip(rest),
                    reason: "expected dd/Mon/yyyy:HH:MM:SS ±hhmm",
                });
            }
            Shape::Text | Shape::Query => {}
        }
        let quoted = i > 0
            && matches!(self.items.get(i - 1), Some(Item::Literal(l)) if l.ends_with('"'))
            && matches!(self.items.get(i + 1), Some(Item::Literal(l)) if l.starts_with('"'));
        // The literal text after this field and any query field after it.
        let mut next = i + 1;
        let mut query_follows = false;
        while let Some(Item::Field { shape, .. }) = self.items.get(next) {
            query_follows |= matches!(shape, Shape::Query | Shape::IsArgs);
            next += 1;
        }
        let limit = match self.items.get(next) {
            None => text.len(),
            Some(Item::Literal(l)) => find_literal(text, pos, l, quoted).ok_or_else(|| missing(l))?,
            Some(Item::Field { .. }) => text.len(),
        };
        if query_follows && matches!(self.items.get(i + 1), Some(Item::Field { .. })) {
            let part = text.get(pos..limit).unwrap_or("");
            return Ok(part.find('?').map_or(limit, |at| pos + at));
        }
        Ok(limit)
    }
}
