//! JSON lines: one object per line, fields addressed by dotted key paths.

use super::TimeFormat;
use crate::errors::{LineError, clip};
use crate::line::{parse_clf_time, parse_csv_time};
use serde_json::Value;
use std::borrow::Cow;

/// The time fields tried, in order, when none is configured: Envoy's
/// `start_time`, Caddy's `ts`, Traefik's `StartUTC`, then common names.
pub(crate) const TIME_FIELDS: [&str; 6] = ["start_time", "ts", "StartUTC", "time", "timestamp", "@timestamp"];

/// The key paths each alias is looked up at, first found first (Caddy,
/// Envoy, Traefik, nginx-style names).
pub(crate) fn alias_paths(alias: &str) -> Option<&'static [&'static str]> {
    Some(match alias {
        "client" => &[
            "request.client_ip",
            "request.remote_ip",
            "downstream_remote_address",
            "ClientHost",
            "client_ip",
            "remote_addr",
            "client",
        ],
        "user" => &["user_id", "remote_user", "ClientUsername", "user"],
        "method" => &["request.method", "method", "RequestMethod", "request_method"],
        "path" => &["request.uri", "path", "RequestPath", "uri", "request_uri"],
        "request" => &["request_line", "request"],
        "status" => &["status", "response_code", "DownstreamStatus", "OriginStatus"],
        "referer" => &["request.headers.Referer", "referer", "http_referer", "request_Referer"],
        "user-agent" => &[
            "request.headers.User-Agent",
            "user_agent",
            "http_user_agent",
            "request_User-Agent",
        ],
        "host" => &["request.host", "authority", "RequestHost", "host"],
        "forwarded-for" => &[
            "request.headers.X-Forwarded-For",
            "x_forwarded_for",
            "http_x_forwarded_for",
            "request_X-Forwarded-For",
        ],
        _ => return None,
    })
}

/// The value at a dotted key path: a key holding dots is found as it is
/// first; an array stands for its first element.
pub(crate) fn lookup<'v>(value: &'v Value, path: &str) -> Option<&'v Value> {
    match value {
        Value::Array(items) => lookup(items.first()?, path),
        Value::Object(map) => {
            if let Some(v) = map.get(path) {
                return Some(first(v));
            }
            let mut from = 0;
            while let Some(dot) = path.get(from..)?.find('.') {
                let at = from + dot;
                if let (Some(key), Some(rest)) = (path.get(..at), path.get(at + 1..))
                    && let Some(child) = map.get(key)
                    && let Some(found) = lookup(child, rest)
                {
                    return Some(found);
                }
                from = at + 1;
            }
            None
        }
        _ => None,
    }
}

fn first(v: &Value) -> &Value {
    match v {
        Value::Array(items) => items.first().map_or(v, first),
        _ => v,
    }
}

/// A scalar value as text (`None` for null, objects and empty arrays).
pub(crate) fn text(v: &Value) -> Option<Cow<'_, str>> {
    match first(v) {
        Value::String(s) => Some(Cow::Borrowed(s)),
        Value::Number(n) => Some(Cow::Owned(n.to_string())),
        Value::Bool(b) => Some(Cow::Borrowed(if *b { "true" } else { "false" })),
        _ => None,
    }
}

/// The key paths of an object's scalar values, at most `max` of them.
pub(crate) fn key_paths(v: &Value, prefix: &str, out: &mut Vec<String>, max: usize) {
    if let Value::Object(map) = v {
        for (key, child) in map {
            if out.len() >= max {
                return;
            }
            let path = if prefix.is_empty() {
                key.clone()
            } else {
                format!("{prefix}.{key}")
            };
            match first(child) {
                Value::Object(_) => key_paths(first(child), &path, out, max),
                _ => out.push(path),
            }
        }
    }
}

/// Parses one line into `value`, and its time.
pub(crate) fn parse(
    text_line: &str,
    value: &mut Value,
    time_field: Option<&str>,
    time_format: Option<TimeFormat>,
) -> Result<i64, LineError> {
    *value = serde_json::from_str(text_line).map_err(|e| LineError::NotJson { reason: e.to_string() })?;
    if !value.is_object() {
        return Err(LineError::NotJson {
            reason: "not an object".to_string(),
        });
    }
    let time = match time_field {
        Some(name) => lookup(value, name).ok_or_else(|| LineError::MissingField {
            field: format!("`{name}`"),
        })?,
        None => TIME_FIELDS
            .iter()
            .find_map(|&name| lookup(value, name))
            .ok_or_else(|| LineError::MissingField {
                field: "start_time, ts, StartUTC, time, timestamp or @timestamp".to_string(),
            })?,
    };
    time_of(time, time_format)
}

/// The time a JSON value holds, in `format` or guessed from its type.
pub(crate) fn time_of(v: &Value, format: Option<TimeFormat>) -> Result<i64, LineError> {
    let shown = || clip(&v.to_string());
    match v {
        Value::Number(n) => {
            let unit = match format {
                None | Some(TimeFormat::UnixSeconds) => 1_000_000_000,
                Some(TimeFormat::UnixMillis) => 1_000_000,
                Some(TimeFormat::UnixMicros) => 1_000,
                Some(TimeFormat::UnixNanos) => 1,
                Some(f) => {
                    return Err(LineError::BadTimestamp {
                        timestamp: shown(),
                        reason: if f == TimeFormat::Clf {
                            "expected a string dd/Mon/yyyy:HH:MM:SS ±hhmm"
                        } else {
                            "expected an RFC 3339 string"
                        },
                    });
                }
            };
            let out_of_range = || LineError::BadTimestamp {
                timestamp: shown(),
                reason: "outside the years 1678 to 2261",
            };
            if let Some(i) = n.as_i64() {
                return i64::try_from(i128::from(i) * unit).map_err(|_| out_of_range());
            }
            // A fraction: from its shortest decimal form, exact to the
            // nanosecond where the float was.
            if let Ok(ns) = crate::logs::unix_scaled(&n.to_string(), unit as i64) {
                return Ok(ns);
            }
            let f = n.as_f64().unwrap_or(f64::NAN) * unit as f64;
            if f.is_finite() && f.abs() < 9.2e18 {
                Ok(f.round() as i64)
            } else {
                Err(out_of_range())
            }
        }
        Value::String(s) => match format {
            Some(f) => f.parse(s),
            None if s.contains('/') => parse_clf_time(s),
            None => parse_csv_time(s),
        },
        _ => Err(LineError::BadTimestamp {
            timestamp: shown(),
            reason: "expected a number or a string",
        }),
    }
}
