//! Envoy's rate limit actions (`route.v3.RateLimit.Action`), evaluated
//! for a request as Envoy's router does it: each action of a `rate_limits`
//! entry appends one entry to the descriptor, in order, and if one of them
//! cannot, no descriptor is sent for that entry at all (all or nothing),
//! unless the action says to skip it (`skip_if_absent`).
//!
//! [`descriptor`] is the evaluation, from [`Action`]s and a [`Request`];
//! [`actions`] reads a `rate_limits` entry's actions from YAML, written
//! either as Envoy's configuration writes them (`generic_key: {...}`) or as
//! a Go control plane prints its structs (`ActionSpecifier: GenericKey:
//! {...}`, as Envoy Gateway's translator test data does).
//!
//! What is not modelled panics rather than guessing: a regular expression
//! with special characters, a substitution command other than
//! `%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%` and `%REQ(...)%`, an action
//! kind not listed in [`Action`].
#![allow(dead_code, unreachable_pub)]

use serde_json::Value;
use std::net::IpAddr;

/// One descriptor: its entries, (key, value), in order.
pub type Entries = Vec<(String, String)>;

/// A request as the actions see it: its headers (names in lower case,
/// with the pseudo-headers `:method`, `:path` and `:authority`; `:path`
/// carries the query) and the client's address (Envoy's trusted downstream
/// address).
#[derive(Debug, Clone)]
pub struct Request {
    pub headers: Vec<(String, String)>,
    pub client: IpAddr,
}

impl Request {
    /// A `method` request for `path` (with its query, if any) from
    /// 10.0.0.1.
    pub fn new(method: &str, path: &str) -> Request {
        Request {
            headers: vec![
                (":method".to_owned(), method.to_owned()),
                (":path".to_owned(), path.to_owned()),
                (":authority".to_owned(), "example.com".to_owned()),
            ],
            client: "10.0.0.1".parse().unwrap(),
        }
    }

    /// A GET of `/`.
    pub fn get() -> Request {
        Request::new("GET", "/")
    }

    /// The same request with one more header.
    pub fn header(mut self, name: &str, value: &str) -> Request {
        self.headers.push((name.to_ascii_lowercase(), value.to_owned()));
        self
    }

    /// The same request from `client`.
    pub fn from(mut self, client: &str) -> Request {
        self.client = client.parse().unwrap();
        self
    }

    /// Every value of the header `name`, joined by `,` as Envoy joins them
    /// for matching; `None` when absent.
    fn header_value(&self, name: &str) -> Option<String> {
        let name = name.to_ascii_lowercase();
        let values: Vec<&str> = self
            .headers
            .iter()
            .filter(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
            .collect();
        (!values.is_empty()).then(|| values.join(","))
    }

    /// The first value of the header `name`.
    fn first_header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str())
    }

    /// The first value of the query parameter `name`, percent-decoded.
    fn query_parameter(&self, name: &str) -> Option<String> {
        let path = self.first_header(":path")?;
        let (_, query) = path.split_once('?')?;
        let query = query.split('#').next().unwrap_or("");
        query.split('&').find_map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(key) == name).then(|| percent_decode(value))
        })
    }
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A string matcher (`type.matcher.v3.StringMatcher`).
#[derive(Debug, Clone, PartialEq)]
pub enum Pattern {
    Exact(String),
    Prefix(String),
    Suffix(String),
    Contains(String),
    /// A `safe_regex`, matched against the whole value. Only a regular
    /// expression without special characters (a literal) is modelled.
    Regex(String),
}

#[derive(Debug, Clone, PartialEq)]
pub struct StringMatch {
    pub pattern: Pattern,
    pub ignore_case: bool,
}

impl StringMatch {
    fn matches(&self, value: &str) -> bool {
        let fold = |s: &str| {
            if self.ignore_case {
                s.to_lowercase()
            } else {
                s.to_owned()
            }
        };
        let value = fold(value);
        match &self.pattern {
            Pattern::Exact(p) => value == fold(p),
            Pattern::Prefix(p) => value.starts_with(&fold(p)),
            Pattern::Suffix(p) => value.ends_with(&fold(p)),
            Pattern::Contains(p) => value.contains(&fold(p)),
            Pattern::Regex(re) => {
                assert!(
                    !re.contains(['\\', '.', '*', '+', '?', '(', ')', '[', ']', '{', '}', '|', '^', '$']),
                    "regular expression {re:?}: only literal ones are modelled"
                );
                value == fold(re)
            }
        }
    }
}

/// What a header or query parameter matcher asks of the value.
#[derive(Debug, Clone, PartialEq)]
pub enum ValueMatch {
    /// The value, when present, matches.
    String(StringMatch),
    /// `present_match`: present (true) or absent (false).
    Present(bool),
}

/// A `route.v3.HeaderMatcher`, or a `QueryParameterMatcher` (whose
/// `invert_match` is always false).
#[derive(Debug, Clone, PartialEq)]
pub struct Matcher {
    pub name: String,
    pub value: ValueMatch,
    pub invert: bool,
    /// `treat_missing_header_as_empty`.
    pub missing_as_empty: bool,
}

impl Matcher {
    /// Whether a value (`None`: absent) matches, as Envoy's header
    /// utility decides it.
    fn matches(&self, value: Option<String>) -> bool {
        let value = match value {
            None if self.missing_as_empty => Some(String::new()),
            other => other,
        };
        let matched = match (&self.value, value) {
            (ValueMatch::Present(want), value) => value.is_some() == *want,
            (ValueMatch::String(_), None) => return false,
            (ValueMatch::String(m), Some(value)) => m.matches(&value),
        };
        matched != self.invert
    }
}

/// An IP range, `address_prefix/prefix_len`.
#[derive(Debug, Clone, PartialEq)]
pub struct Cidr {
    pub prefix: IpAddr,
    pub len: u8,
}

impl Cidr {
    fn contains(&self, address: IpAddr) -> bool {
        match (self.prefix, address) {
            (IpAddr::V4(p), IpAddr::V4(a)) => {
                mask(u32::from(p).into(), 32, self.len) == mask(u32::from(a).into(), 32, self.len)
            }
            (IpAddr::V6(p), IpAddr::V6(a)) => mask(u128::from(p), 128, self.len) == mask(u128::from(a), 128, self.len),
            _ => false,
        }
    }
}

/// `bits` of an address of `width` bits, all but the first `len` cleared.
fn mask(bits: u128, width: u32, len: u8) -> u128 {
    let len = u32::from(len).min(width);
    if len == 0 {
        return 0;
    }
    let keep = u128::MAX << (width - len);
    bits & (keep & (u128::MAX >> (128 - width)))
}

/// One action of a `rate_limits` entry.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// `(key, value)`, always; the key defaults to `generic_key`.
    GenericKey { key: String, value: String },
    /// `(key, the header's first value)`; without the header, nothing
    /// (skip_if_absent) or no descriptor.
    RequestHeaders {
        header: String,
        key: String,
        skip_if_absent: bool,
    },
    /// `("remote_address", client address)`.
    RemoteAddress,
    /// `("masked_remote_address", client network/len)`.
    MaskedRemoteAddress { v4_len: u8, v6_len: u8 },
    /// `(key, value)` when every header matcher matches (or, with
    /// `expect_match: false`, when they do not all match); otherwise no
    /// descriptor. The key defaults to `header_match`.
    HeaderValueMatch {
        key: String,
        value: String,
        expect_match: bool,
        headers: Vec<Matcher>,
    },
    /// As [`Action::HeaderValueMatch`], on query parameters; the key
    /// defaults to `query_match`.
    QueryParameterValueMatch {
        key: String,
        value: String,
        expect_match: bool,
        parameters: Vec<Matcher>,
    },
    /// `(key, the parameter's value)`; without it, nothing (skip_if_absent)
    /// or no descriptor.
    QueryParameters {
        parameter: String,
        key: String,
        skip_if_absent: bool,
    },
    /// `(key, value)` when the client address is in one of the ranges
    /// (with `invert`: in none); otherwise no descriptor. The value is a
    /// substitution format; the key defaults to `remote_address_match`.
    RemoteAddressMatch {
        key: String,
        value: String,
        default_value: String,
        ranges: Vec<Cidr>,
        invert: bool,
    },
}

/// The descriptor `actions` produce for `request`, or `None` when Envoy
/// sends none for them.
pub fn descriptor(actions: &[Action], request: &Request) -> Option<Entries> {
    let mut entries = Entries::new();
    for action in actions {
        let entry = match action {
            Action::GenericKey { key, value } => Some((key.clone(), value.clone())),
            Action::RequestHeaders {
                header,
                key,
                skip_if_absent,
            } => match request.first_header(header) {
                Some(value) => Some((key.clone(), value.to_owned())),
                None if *skip_if_absent => None,
                None => return None,
            },
            Action::RemoteAddress => Some(("remote_address".to_owned(), request.client.to_string())),
            Action::MaskedRemoteAddress { v4_len, v6_len } => {
                let masked = match request.client {
                    IpAddr::V4(a) => {
                        let bits = mask(u32::from(a).into(), 32, *v4_len) as u32;
                        format!("{}/{v4_len}", std::net::Ipv4Addr::from(bits))
                    }
                    IpAddr::V6(a) => format!("{}/{v6_len}", std::net::Ipv6Addr::from(mask(a.into(), 128, *v6_len))),
                };
                Some(("masked_remote_address".to_owned(), masked))
            }
            Action::HeaderValueMatch {
                key,
                value,
                expect_match,
                headers,
            } => {
                let all = headers.iter().all(|m| m.matches(request.header_value(&m.name)));
                if all != *expect_match {
                    return None;
                }
                Some((key.clone(), value.clone()))
            }
            Action::QueryParameterValueMatch {
                key,
                value,
                expect_match,
                parameters,
            } => {
                let all = parameters.iter().all(|m| m.matches(request.query_parameter(&m.name)));
                if all != *expect_match {
                    return None;
                }
                Some((key.clone(), value.clone()))
            }
            Action::QueryParameters {
                parameter,
                key,
                skip_if_absent,
            } => match request.query_parameter(parameter) {
                Some(value) => Some((key.clone(), value)),
                None if *skip_if_absent => None,
                None => return None,
            },
            Action::RemoteAddressMatch {
                key,
                value,
                default_value,
                ranges,
                invert,
            } => {
                let inside = ranges.iter().any(|r| r.contains(request.client));
                if inside == *invert {
                    return None;
                }
                let value = match substitute(value, request) {
                    v if !v.is_empty() => v,
                    _ if !default_value.is_empty() => default_value.clone(),
                    _ => return None,
                };
                Some((key.clone(), value))
            }
        };
        entries.extend(entry);
    }
    Some(entries)
}

/// The descriptor `actions` produce when the condition of each holds,
/// each judged alone (two matchers that no one request can meet at once
/// still give their entries): a header or query parameter read is shown
/// as `<name>`, the client as `<client>`, and a `remote_address_match`
/// value is worked out for a client its ranges admit.
pub fn descriptor_when_met(actions: &[Action]) -> Entries {
    actions
        .iter()
        .filter_map(|action| match action {
            Action::GenericKey { key, value }
            | Action::HeaderValueMatch { key, value, .. }
            | Action::QueryParameterValueMatch { key, value, .. } => Some((key.clone(), value.clone())),
            Action::RequestHeaders { header, key, .. } => Some((key.clone(), format!("<{header}>"))),
            Action::QueryParameters { parameter, key, .. } => Some((key.clone(), format!("<{parameter}>"))),
            Action::RemoteAddress => Some(("remote_address".to_owned(), "<client>".to_owned())),
            Action::MaskedRemoteAddress { .. } => Some(("masked_remote_address".to_owned(), "<client>".to_owned())),
            Action::RemoteAddressMatch { ranges, invert, .. } => {
                let candidates = ranges
                    .iter()
                    .map(|r| r.prefix)
                    .chain(["203.0.113.9", "10.1.2.3", "2001:db8::9"].map(|a| a.parse().unwrap()));
                let client = candidates
                    .into_iter()
                    .find(|c| ranges.iter().any(|r| r.contains(*c)) != *invert)
                    .expect("a client the ranges admit");
                let mut request = Request::get();
                request.client = client;
                descriptor(std::slice::from_ref(action), &request)?.pop()
            }
        })
        .collect()
}

/// `format` with its substitution commands replaced: the few that are
/// modelled, an unknown header by nothing.
fn substitute(format: &str, request: &Request) -> String {
    let mut out = String::new();
    let mut rest = format;
    while let Some(start) = rest.find('%') {
        out.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        let end = after
            .find('%')
            .unwrap_or_else(|| panic!("unterminated command in {format:?}"));
        let command = &after[..end];
        if command.is_empty() {
            out.push('%');
        } else if command == "DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT" {
            out.push_str(&request.client.to_string());
        } else if let Some(header) = command.strip_prefix("REQ(").and_then(|c| c.strip_suffix(')')) {
            out.push_str(request.first_header(header).unwrap_or(""));
        } else {
            panic!("substitution command %{command}% is not modelled");
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    out
}

/// The actions of one `rate_limits` entry (its `actions` list), from YAML
/// read into JSON (see [`yaml_to_json`]), in either spelling: Envoy's
/// (`header_value_match: {headers: [{name, string_match: {exact}}]}`) or a
/// Go control plane's (`ActionSpecifier: HeaderValueMatch: {headers:
/// [{HeaderMatchSpecifier: StringMatch: MatchPattern: Exact}]}`).
pub fn actions(list: &Value) -> Vec<Action> {
    let list = normalize(list);
    list.as_array()
        .unwrap_or_else(|| panic!("actions are not a list: {list}"))
        .iter()
        .map(action)
        .collect()
}

/// Field names compared in lower case without `_`, and the one-of
/// wrappers of Go's structs (`ActionSpecifier`, `MatchPattern`…) dissolved
/// into their parent, so that both spellings read the same.
fn normalize(value: &Value) -> Value {
    match value {
        Value::Array(items) => Value::Array(items.iter().map(normalize).collect()),
        Value::Object(map) => {
            let mut out = serde_json::Map::new();
            for (key, value) in map {
                let key = key.replace('_', "").to_ascii_lowercase();
                match normalize(value) {
                    Value::Object(inner) if key.ends_with("specifier") || key == "matchpattern" => out.extend(inner),
                    value => {
                        out.insert(key, value);
                    }
                }
            }
            Value::Object(out)
        }
        other => other.clone(),
    }
}

fn text(value: &Value, field: &str) -> String {
    match value.get(field) {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

fn text_or(value: &Value, field: &str, default: &str) -> String {
    match text(value, field) {
        s if s.is_empty() => default.to_owned(),
        s => s,
    }
}

/// A bool, plain or wrapped (`{value: true}`); `default` when missing.
fn flag(value: &Value, field: &str, default: bool) -> bool {
    let v = match value.get(field) {
        Some(Value::Object(wrapped)) => wrapped.get("value").cloned().unwrap_or(Value::Bool(false)),
        Some(v) => v.clone(),
        None => return default,
    };
    match v {
        Value::Bool(b) => b,
        Value::String(s) => s == "true",
        Value::Null => default,
        other => panic!("{field}: not a bool: {other}"),
    }
}

/// A number, plain or wrapped (`{value: 16}`, `{}` for 0); `None` when
/// missing.
fn number(value: &Value, field: &str) -> Option<u8> {
    let v = match value.get(field)? {
        Value::Object(wrapped) => wrapped.get("value").cloned().unwrap_or(Value::from(0)),
        v => v.clone(),
    };
    Some(match v {
        Value::Number(n) => n.as_u64().and_then(|n| u8::try_from(n).ok()).expect("a prefix length"),
        Value::String(s) => s.parse().expect("a prefix length"),
        other => panic!("{field}: not a number: {other}"),
    })
}

fn string_match(value: &Value) -> StringMatch {
    let pattern = if let Some(p) = value.get("exact") {
        Pattern::Exact(p.as_str().unwrap_or_default().to_owned())
    } else if let Some(p) = value.get("prefix") {
        Pattern::Prefix(p.as_str().unwrap_or_default().to_owned())
    } else if let Some(p) = value.get("suffix") {
        Pattern::Suffix(p.as_str().unwrap_or_default().to_owned())
    } else if let Some(p) = value.get("contains") {
        Pattern::Contains(p.as_str().unwrap_or_default().to_owned())
    } else if let Some(re) = value.get("saferegex") {
        Pattern::Regex(text(re, "regex"))
    } else {
        panic!("string matcher not modelled: {value}")
    };
    StringMatch {
        pattern,
        ignore_case: flag(value, "ignorecase", false),
    }
}

fn matcher(value: &Value) -> Matcher {
    let value_match = if let Some(m) = value.get("stringmatch") {
        ValueMatch::String(string_match(m))
    } else if value.get("presentmatch").is_some() {
        ValueMatch::Present(flag(value, "presentmatch", true))
    } else if [
        "exactmatch",
        "prefixmatch",
        "suffixmatch",
        "containsmatch",
        "saferegexmatch",
    ]
    .iter()
    .any(|k| value.get(*k).is_some())
    {
        panic!("deprecated header matcher not modelled: {value}")
    } else {
        // No specifier: the header must be present.
        ValueMatch::Present(true)
    };
    Matcher {
        name: text(value, "name"),
        value: value_match,
        invert: flag(value, "invertmatch", false),
        missing_as_empty: flag(value, "treatmissingheaderasempty", false),
    }
}

fn list<'a>(value: &'a Value, field: &str) -> &'a [Value] {
    value.get(field).and_then(Value::as_array).map_or(&[], Vec::as_slice)
}

fn action(value: &Value) -> Action {
    let (kind, a) = value
        .as_object()
        .and_then(|m| m.iter().next())
        .unwrap_or_else(|| panic!("not an action: {value}"));
    match kind.as_str() {
        "generickey" => Action::GenericKey {
            key: text_or(a, "descriptorkey", "generic_key"),
            value: text(a, "descriptorvalue"),
        },
        "requestheaders" => Action::RequestHeaders {
            header: text(a, "headername"),
            key: text(a, "descriptorkey"),
            skip_if_absent: flag(a, "skipifabsent", false),
        },
        "remoteaddress" => Action::RemoteAddress,
        "maskedremoteaddress" => Action::MaskedRemoteAddress {
            v4_len: number(a, "v4prefixmasklen").unwrap_or(32),
            v6_len: number(a, "v6prefixmasklen").unwrap_or(128),
        },
        "headervaluematch" => Action::HeaderValueMatch {
            key: text_or(a, "descriptorkey", "header_match"),
            value: text(a, "descriptorvalue"),
            expect_match: flag(a, "expectmatch", true),
            headers: list(a, "headers").iter().map(matcher).collect(),
        },
        "queryparametervaluematch" => Action::QueryParameterValueMatch {
            key: text_or(a, "descriptorkey", "query_match"),
            value: text(a, "descriptorvalue"),
            expect_match: flag(a, "expectmatch", true),
            parameters: list(a, "queryparameters").iter().map(matcher).collect(),
        },
        "queryparameters" => Action::QueryParameters {
            parameter: text(a, "queryparametername"),
            key: text(a, "descriptorkey"),
            skip_if_absent: flag(a, "skipifabsent", false),
        },
        "remoteaddressmatch" => {
            let matcher = a.get("addressmatcher").cloned().unwrap_or_default();
            Action::RemoteAddressMatch {
                key: text_or(a, "descriptorkey", "remote_address_match"),
                value: text(a, "descriptorvalue"),
                default_value: text(a, "defaultvalue"),
                ranges: list(&matcher, "ranges")
                    .iter()
                    .map(|r| {
                        let prefix: IpAddr = text(r, "addressprefix").parse().expect("an address prefix");
                        // Unset, the length is 0.
                        let len = number(r, "prefixlen").unwrap_or(0);
                        Cidr { prefix, len }
                    })
                    .collect(),
                invert: flag(&matcher, "invertmatch", false),
            }
        }
        other => panic!("rate limit action `{other}` not modelled: {value}"),
    }
}

/// A YAML node as JSON: every scalar a string (YAML's plain `null` and
/// `~` a JSON null), maps and lists alike.
pub fn yaml_to_json(node: &marked_yaml::Node) -> Value {
    match node {
        marked_yaml::Node::Scalar(s) => match s.as_str() {
            "null" | "~" if !s.may_coerce() => Value::String(s.as_str().to_owned()),
            "null" | "~" => Value::Null,
            text => Value::String(text.to_owned()),
        },
        marked_yaml::Node::Sequence(items) => Value::Array(items.iter().map(yaml_to_json).collect()),
        marked_yaml::Node::Mapping(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.as_str().to_owned(), yaml_to_json(v)))
                .collect(),
        ),
    }
}
