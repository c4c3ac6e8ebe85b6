//! From envoyproxy/ratelimit's xDS resource, `RateLimitConfig`, to a
//! [`Config`]: each resource is written out as the YAML of a config file
//! and read by the loader, so that a resource passes exactly the checks of
//! a file and fails with the same messages (envoyproxy/ratelimit does the
//! same: it turns each resource into its YAML structure and loads that).
//!
//! A resource is named `xds:<name>` in errors and warnings (`xds:<domain>`
//! when it has no name), and a descriptor by its path in the resource
//! (`descriptors[0].descriptors[2]`), not by a line of the YAML it was
//! written as.

use super::RATE_LIMIT_CONFIG_TYPE;
use crate::config::{Config, ConfigError, ConfigWarning, LoadOptions, MAX_DEPTH};
use crate::proto::rls_conf::{RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit};
use pbjson_types::value::Kind;
use prost::Message;
use std::collections::HashMap;
use std::fmt::Write as _;

/// Decodes every resource of a snapshot and loads them as one config, one
/// domain per resource, as [`Config::parse_all`] loads files (with
/// [`LoadOptions::merge_domains`], the resources of one domain are
/// merged; without it, a domain in two resources is an error).
///
/// # Errors
///
/// Every error found, in resource order (never empty): a resource of
/// another type or that does not decode, and every error the loader finds
/// in the resources, each named `xds:<resource name or domain>` with the
/// path of its descriptor in the key (line and column 0).
pub fn config_from_resources(
    resources: &[pbjson_types::Any],
    options: &LoadOptions,
) -> Result<Config, Vec<ConfigError>> {
    let mut errors = Vec::new();
    let mut configs = Vec::with_capacity(resources.len());
    for (i, resource) in resources.iter().enumerate() {
        if resource.type_url != RATE_LIMIT_CONFIG_TYPE {
            errors.push(resource_error(
                format!("xds:#{i}"),
                None,
                format!(
                    "a resource of type `{}`, expected `{RATE_LIMIT_CONFIG_TYPE}`",
                    resource.type_url
                ),
            ));
            continue;
        }
        match RateLimitConfig::decode(resource.value.as_ref()) {
            Ok(config) => configs.push(config),
            Err(e) => errors.push(resource_error(
                format!("xds:#{i}"),
                None,
                format!("cannot decode a RateLimitConfig: {e}"),
            )),
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    config_from_configs(&configs, options)
}

/// Loads decoded resources as one config, as [`config_from_resources`]
/// does.
///
/// # Errors
///
/// Those of [`config_from_resources`] but for decoding.
pub fn config_from_configs(configs: &[RateLimitConfig], options: &LoadOptions) -> Result<Config, Vec<ConfigError>> {
    let mut errors = Vec::new();
    let mut texts = Vec::with_capacity(configs.len());
    // The descriptors' lines in each resource's text, by its file name.
    let mut spans: HashMap<String, Vec<Span>> = HashMap::with_capacity(configs.len());
    for (i, config) in configs.iter().enumerate() {
        let mut file = resource_file(config, i);
        if spans.contains_key(&file) {
            // Two resources of one name: told apart by their place.
            file = format!("{file}#{i}");
        }
        match Yaml::of(config) {
            Ok(yaml) => {
                spans.insert(file.clone(), yaml.spans);
                texts.push((file, yaml.text));
            }
            Err(e) => errors.push(resource_error(file, Some(e.path), e.message)),
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    let mut config = Config::parse_all(texts, options)
        .map_err(|found| found.into_iter().map(|e| locate_error(e, &spans)).collect::<Vec<_>>())?;
    config.rewrite_warnings(|warning| locate_warning(warning, &spans));
    Ok(config)
}

/// The YAML of a config file that loads as `config` does (for a test, or to
/// see what a control plane sends).
///
/// # Errors
///
/// A descriptor nested more than [`MAX_DEPTH`] levels deep, or metadata
/// holding a number JSON cannot carry (NaN, an infinity): the path of the
/// descriptor and the reason.
pub fn yaml_of(config: &RateLimitConfig) -> Result<String, String> {
    Yaml::of(config)
        .map(|yaml| yaml.text)
        .map_err(|e| format!("{}: {}", e.path, e.message))
}

/// How a resource is named in errors: `xds:` and its name, its domain
/// when it has none, or its place in the snapshot when it has neither.
fn resource_file(config: &RateLimitConfig, index: usize) -> String {
    if !config.name.is_empty() {
        format!("xds:{}", config.name)
    } else if !config.domain.is_empty() {
        format!("xds:{}", config.domain)
    } else {
        format!("xds:#{index}")
    }
}

fn resource_error(file: String, key: Option<String>, message: String) -> ConfigError {
    ConfigError {
        file,
        line: 0,
        column: 0,
        key,
        message,
    }
}

/// The lines of one descriptor in a resource's text, from 1, both
/// included, and its path.
#[derive(Debug, Clone)]
struct Span {
    first: usize,
    last: usize,
    path: String,
}

/// The path of the innermost descriptor at `line`.
fn path_at(spans: &[Span], line: usize) -> Option<&str> {
    spans
        .iter()
        .filter(|s| s.first <= line && line <= s.last)
        .min_by_key(|s| s.last - s.first)
        .map(|s| s.path.as_str())
}

/// An error of the loader, about a line of a resource's text, about the
/// descriptor's path instead.
fn locate_error(e: ConfigError, spans: &HashMap<String, Vec<Span>>) -> ConfigError {
    let (key, message) = locate(&e.file, e.line, e.key, &e.message, spans);
    ConfigError {
        file: e.file,
        line: 0,
        column: 0,
        key,
        message,
    }
}

/// A warning, likewise. A warning has a line and column (never 0), so its
/// position becomes line 1 column 1 and the path goes to its key.
fn locate_warning(w: &mut ConfigWarning, spans: &HashMap<String, Vec<Span>>) {
    let (key, message) = locate(&w.file, w.line, w.key.take(), &w.message, spans);
    w.key = key;
    w.message = message;
    w.line = 1;
    w.column = 1;
}

/// The key qualified by the path of the descriptor at `line` of `file`,
/// and the message with each `line N` (and `line N column M`) naming a
/// line of a resource's text replaced by the path there.
fn locate(
    file: &str,
    line: usize,
    key: Option<String>,
    message: &str,
    spans: &HashMap<String, Vec<Span>>,
) -> (Option<String>, String) {
    let own = spans.get(file).map_or(&[][..], Vec::as_slice);
    let path = (line > 0).then(|| path_at(own, line)).flatten();
    let key = match (path, key) {
        (Some(path), Some(key)) => Some(format!("{path}.{key}")),
        (Some(path), None) => Some(path.to_owned()),
        (None, key) => key,
    };
    (key, rewrite_lines(message, own, spans))
}

/// `message` with every `line N` (and a ` column M` after it) that falls
/// in a descriptor replaced by its path: in the resource named just
/// before (`in xds:other at line N`), else in `own`.
fn rewrite_lines(message: &str, own: &[Span], spans: &HashMap<String, Vec<Span>>) -> String {
    const LINE: &str = "line ";
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(at) = rest.find(LINE) {
        let (before, after) = rest.split_at(at);
        out.push_str(before);
        let digits = after.get(LINE.len()..).unwrap_or("");
        let len = digits.bytes().take_while(u8::is_ascii_digit).count();
        let number = digits.get(..len).and_then(|d| d.parse::<usize>().ok());
        let in_other = spans
            .iter()
            .find(|(file, _)| out.ends_with(&format!("in {file} at ")))
            .map(|(_, spans)| spans.as_slice());
        match number.and_then(|n| path_at(in_other.unwrap_or(own), n)) {
            Some(path) => {
                out.push_str(path);
                let mut tail = digits.get(len..).unwrap_or("");
                if let Some(column) = tail.strip_prefix(" column ") {
                    let skip = column.bytes().take_while(u8::is_ascii_digit).count();
                    tail = column.get(skip..).unwrap_or("");
                }
                rest = tail;
            }
            None => {
                out.push_str(LINE);
                rest = digits;
            }
        }
    }
    out.push_str(rest);
    out
}

/// A resource written as a config file's YAML, and where its descriptors
/// are.
struct Yaml {
    text: String,
    /// Lines written so far.
    lines: usize,
    spans: Vec<Span>,
}

/// Why a resource cannot be written as YAML.
struct YamlError {
    path: String,
    message: String,
}

impl Yaml {
    fn of(config: &RateLimitConfig) -> Result<Yaml, YamlError> {
        let mut yaml = Yaml {
            text: String::new(),
            lines: 0,
            spans: Vec::new(),
        };
        yaml.line(0, &format!("domain: {}", quote(&config.domain)));
        if config.descriptors.is_empty() {
            yaml.line(0, "descriptors: []");
        } else {
            yaml.line(0, "descriptors:");
            for (i, descriptor) in config.descriptors.iter().enumerate() {
                yaml.descriptor(descriptor, 0, format!("descriptors[{i}]"), 1)?;
            }
        }
        Ok(yaml)
    }

    fn line(&mut self, indent: usize, text: &str) {
        self.text.extend(std::iter::repeat_n(' ', indent));
        self.text.push_str(text);
        self.text.push('\n');
        self.lines += 1;
    }

    /// A descriptor at depth `depth` (from 1), its `- ` at column
    /// `indent`: block style, two columns a level (as the loader's
    /// indentation bound allows every level it takes), `rate_limit` and
    /// `metadata` in flow style on one line.
    fn descriptor(
        &mut self,
        d: &RateLimitDescriptor,
        indent: usize,
        path: String,
        depth: usize,
    ) -> Result<(), YamlError> {
        let first = self.lines + 1;
        self.line(indent, &format!("- key: {}", quote(&d.key)));
        let inner = indent + 2;
        // As upstream, an empty value is no value.
        if !d.value.is_empty() {
            self.line(inner, &format!("value: {}", quote(&d.value)));
        }
        if let Some(policy) = &d.rate_limit {
            self.line(inner, &format!("rate_limit: {}", rate_limit(policy)));
        }
        for (key, on) in [
            ("shadow_mode", d.shadow_mode),
            ("quota_mode", d.quota_mode),
            ("detailed_metric", d.detailed_metric),
        ] {
            if on {
                self.line(inner, &format!("{key}: true"));
            }
        }
        if let Some(metadata) = &d.metadata {
            let mut text = String::from("metadata: ");
            flow_struct(metadata, &mut text).map_err(|message| YamlError {
                path: format!("{path}.metadata"),
                message,
            })?;
            self.line(inner, &text);
        }
        if !d.descriptors.is_empty() {
            if depth >= MAX_DEPTH {
                // The loader's message, before the YAML would be indented
                // past its bound.
                return Err(YamlError {
                    path: format!("{path}.descriptors"),
                    message: format!("descriptors nested more than {MAX_DEPTH} levels deep"),
                });
            }
            self.line(inner, "descriptors:");
            for (i, child) in d.descriptors.iter().enumerate() {
                self.descriptor(child, inner, format!("{path}.descriptors[{i}]"), depth + 1)?;
            }
        }
        self.spans.push(Span {
            first,
            last: self.lines,
            path,
        });
        Ok(())
    }
}

/// A `rate_limit` map in flow style, with what envoyproxy/ratelimit reads
/// of the policy: the unit by name (`UNKNOWN`, or the number of a unit
/// this proto does not know, are refused by the loader as unknown units),
/// left out for an unlimited policy without one (as upstream reads it);
/// `requests_per_unit` (left out for an unlimited policy with 0); `name`
/// when not empty; `replaces`.
fn rate_limit(policy: &RateLimitPolicy) -> String {
    let mut fields = Vec::new();
    let unit = match RateLimitUnit::try_from(policy.unit) {
        Ok(RateLimitUnit::Unknown) => (!policy.unlimited).then(|| "UNKNOWN".to_owned()),
        Ok(unit) => Some(unit.as_str_name().to_ascii_lowercase()),
        Err(_) => Some(policy.unit.to_string()),
    };
    if let Some(unit) = unit {
        fields.push(format!("unit: {}", quote(&unit)));
    }
    if !policy.unlimited || policy.requests_per_unit != 0 {
        fields.push(format!("requests_per_unit: {}", policy.requests_per_unit));
    }
    if policy.unlimited {
        fields.push("unlimited: true".to_owned());
    }
    if !policy.name.is_empty() {
        fields.push(format!("name: {}", quote(&policy.name)));
    }
    if !policy.replaces.is_empty() {
        let names: Vec<String> = policy
            .replaces
            .iter()
            .map(|r| format!("{{name: {}}}", quote(&r.name)))
            .collect();
        fields.push(format!("replaces: [{}]", names.join(", ")));
    }
    format!("{{{}}}", fields.join(", "))
}

/// `google.protobuf.Struct` as a YAML flow map, keys sorted.
fn flow_struct(s: &pbjson_types::Struct, out: &mut String) -> Result<(), String> {
    let mut keys: Vec<&String> = s.fields.keys().collect();
    keys.sort();
    out.push('{');
    for (i, key) in keys.into_iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str(&quote(key));
        out.push_str(": ");
        if let Some(value) = s.fields.get(key) {
            flow_value(value, out)?;
        }
    }
    out.push('}');
    Ok(())
}

/// A `google.protobuf.Value` in YAML flow style: `null`, a bool, a
/// number, a quoted string, a list or a map.
fn flow_value(value: &pbjson_types::Value, out: &mut String) -> Result<(), String> {
    match &value.kind {
        None | Some(Kind::NullValue(_)) => out.push_str("null"),
        Some(Kind::BoolValue(b)) => out.push_str(if *b { "true" } else { "false" }),
        Some(Kind::NumberValue(n)) => match serde_json::Number::from_f64(*n) {
            Some(number) => {
                let _ = write!(out, "{number}");
            }
            None => return Err(format!("the number {n} cannot be carried by JSON metadata")),
        },
        Some(Kind::StringValue(s)) => out.push_str(&quote(s)),
        Some(Kind::StructValue(s)) => flow_struct(s, out)?,
        Some(Kind::ListValue(list)) => {
            out.push('[');
            for (i, item) in list.values.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                flow_value(item, out)?;
            }
            out.push(']');
        }
    }
    Ok(())
}

/// `text` as a YAML double-quoted scalar: printable ASCII as is, `"` and
/// `\` escaped, every other character as `\uXXXX` or `\UXXXXXXXX`, so that
/// any string reads back as itself.
fn quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            ' '..='~' => out.push(c),
            c if u32::from(c) <= 0xFFFF => {
                let _ = write!(out, "\\u{:04X}", u32::from(c));
            }
            c => {
                let _ = write!(out, "\\U{:08X}", u32::from(c));
            }
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Unit;
    use crate::proto::rls_conf::RateLimitReplace;
    use pbjson_types::{ListValue, Struct, Value};
    use serde_json::json;
    use std::time::Duration;

    fn descriptor(key: &str, value: &str) -> RateLimitDescriptor {
        RateLimitDescriptor {
            key: key.to_owned(),
            value: value.to_owned(),
            ..RateLimitDescriptor::default()
        }
    }

    fn policy(unit: RateLimitUnit, requests_per_unit: u32) -> Option<RateLimitPolicy> {
        Some(RateLimitPolicy {
            unit: unit.into(),
            requests_per_unit,
            ..RateLimitPolicy::default()
        })
    }

    fn resource(name: &str, domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitConfig {
        RateLimitConfig {
            name: name.to_owned(),
            domain: domain.to_owned(),
            descriptors,
        }
    }

    fn any(config: &RateLimitConfig) -> pbjson_types::Any {
        pbjson_types::Any {
            type_url: RATE_LIMIT_CONFIG_TYPE.to_owned(),
            value: config.encode_to_vec().into(),
        }
    }

    fn load(configs: &[RateLimitConfig]) -> Result<Config, Vec<String>> {
        let resources: Vec<_> = configs.iter().map(any).collect();
        config_from_resources(&resources, &LoadOptions::default())
            .map_err(|errors| errors.iter().map(ToString::to_string).collect())
    }

    fn value(kind: Kind) -> Value {
        Value { kind: Some(kind) }
    }

    /// Every field of the proto reaches the config: each unit (WEEK is 7
    /// in the enum, after MONTH and YEAR), unlimited, name (an empty one
    /// is none), replaces, the three flags, metadata of every JSON kind,
    /// nested descriptors, an empty value as no value.
    #[test]
    fn every_field_is_read() {
        let units = [
            (RateLimitUnit::Second, Unit::Second),
            (RateLimitUnit::Minute, Unit::Minute),
            (RateLimitUnit::Hour, Unit::Hour),
            (RateLimitUnit::Day, Unit::Day),
            (RateLimitUnit::Week, Unit::Week),
            (RateLimitUnit::Month, Unit::Month),
            (RateLimitUnit::Year, Unit::Year),
        ];
        let mut descriptors: Vec<RateLimitDescriptor> = units
            .iter()
            .enumerate()
            .map(|(i, (unit, _))| RateLimitDescriptor {
                rate_limit: policy(*unit, 10 + i as u32),
                ..descriptor("unit", unit.as_str_name())
            })
            .collect();
        let metadata = Struct {
            fields: [
                ("text".to_owned(), value(Kind::StringValue("a \"b\"".to_owned()))),
                ("number".to_owned(), value(Kind::NumberValue(2.5))),
                ("whole".to_owned(), value(Kind::NumberValue(3.0))),
                ("yes".to_owned(), value(Kind::BoolValue(true))),
                ("nothing".to_owned(), value(Kind::NullValue(0))),
                (
                    "list".to_owned(),
                    value(Kind::ListValue(ListValue {
                        values: vec![value(Kind::StringValue("x".to_owned())), value(Kind::BoolValue(false))],
                    })),
                ),
                (
                    "map".to_owned(),
                    value(Kind::StructValue(Struct {
                        fields: [("inner".to_owned(), value(Kind::NumberValue(-1.0)))].into(),
                    })),
                ),
            ]
            .into(),
        };
        descriptors.push(RateLimitDescriptor {
            shadow_mode: true,
            quota_mode: true,
            detailed_metric: true,
            metadata: Some(metadata),
            rate_limit: Some(RateLimitPolicy {
                name: "parent".to_owned(),
                ..policy(RateLimitUnit::Minute, 100).unwrap()
            }),
            descriptors: vec![
                RateLimitDescriptor {
                    rate_limit: Some(RateLimitPolicy {
                        name: "child".to_owned(),
                        replaces: vec![RateLimitReplace {
                            name: "parent".to_owned(),
                        }],
                        ..policy(RateLimitUnit::Second, 5).unwrap()
                    }),
                    ..descriptor("inner", "")
                },
                RateLimitDescriptor {
                    rate_limit: Some(RateLimitPolicy {
                        unlimited: true,
                        ..RateLimitPolicy::default()
                    }),
                    ..descriptor("free", "*")
                },
                RateLimitDescriptor {
                    // An empty name is no name; 0 refuses everything.
                    rate_limit: policy(RateLimitUnit::Hour, 0),
                    ..descriptor("zero", "")
                },
            ],
            ..descriptor("flags", "all")
        });
        let config = load(&[resource("gateway/one", "edge", descriptors)]).unwrap();
        assert!(config.warnings().is_empty(), "{:?}", config.warnings());
        assert_eq!(config.file_of("edge"), Some("xds:gateway/one"));
        let domain = config.domain("edge").unwrap();
        assert_eq!(domain.rules.len(), units.len() + 1);
        for (i, (rule, (proto, unit))) in domain.rules.iter().zip(units).enumerate() {
            assert_eq!(rule.key, "unit");
            assert_eq!(rule.value.as_ref().unwrap().as_str(), proto.as_str_name());
            let limit = &rule.limits[0];
            assert_eq!(limit.unit, Some(unit));
            assert_eq!(limit.window, unit.duration());
            assert_eq!(limit.requests_per_unit, 10 + i as u64);
            assert_eq!(limit.name, None);
        }
        assert_eq!(Unit::Week.duration(), Duration::from_secs(7 * 86_400));

        let flags = domain.rules.last().unwrap();
        assert!(flags.shadow_mode && flags.quota_mode && flags.detailed_metric);
        assert!(!flags.unlimited && !flags.share_threshold && !flags.value_to_metric);
        assert_eq!(flags.limits[0].name.as_deref(), Some("parent"));
        assert_eq!(
            flags.metadata,
            Some(json!({
                "text": "a \"b\"", "number": 2.5, "whole": 3.0, "yes": true, "nothing": null,
                "list": ["x", false], "map": {"inner": -1.0}
            }))
        );
        let [inner, free, zero] = &flags.children[..] else {
            panic!("{:?}", flags.children)
        };
        assert_eq!((inner.key.as_str(), inner.value.as_ref()), ("inner", None));
        assert_eq!(inner.limits[0].name.as_deref(), Some("child"));
        assert_eq!(inner.limits[0].replaces, ["parent"]);
        assert_eq!(inner.limits[0].unit, Some(Unit::Second));
        assert!(free.unlimited && free.limits.is_empty());
        assert_eq!(free.value.as_ref().unwrap().as_str(), "*");
        assert_eq!(zero.limits[0].requests_per_unit, 0);
        assert_eq!(zero.limits[0].name, None);
        assert!(zero.limits[0].policy.is_none(), "a limit of 0 refuses everything");
    }

    /// Any string reads back as itself, whatever it holds.
    #[test]
    fn strings_read_back_as_themselves() {
        let odd = "a\"b\\c: #d {e} [f], 'g' é\u{7f}\u{85}\u{feff}\u{1F600}\n\t";
        let config = load(&[resource(
            "",
            odd,
            vec![RateLimitDescriptor {
                rate_limit: policy(RateLimitUnit::Second, 1),
                ..descriptor(odd, &format!("{odd}*"))
            }],
        )])
        .unwrap();
        let domain = config.domain(odd).unwrap();
        assert_eq!(domain.rules[0].key, odd);
        assert_eq!(domain.rules[0].value.as_ref().unwrap().as_str(), format!("{odd}*"));
        // Without a name, a resource is named by its domain.
        assert_eq!(config.file_of(odd), Some(format!("xds:{odd}").as_str()));
    }

    /// The loader's checks and messages, each error naming its resource
    /// and the path of its descriptor rather than a line.
    #[test]
    fn errors_name_the_resource_and_the_descriptor() {
        let bad_unit = |unit: i32| {
            let mut limit = policy(RateLimitUnit::Second, 1);
            if let Some(l) = limit.as_mut() {
                l.unit = unit;
            }
            resource(
                "route/a",
                "d",
                vec![
                    descriptor("ok", ""),
                    RateLimitDescriptor {
                        descriptors: vec![RateLimitDescriptor {
                            rate_limit: limit,
                            ..descriptor("k", "v")
                        }],
                        ..descriptor("outer", "")
                    },
                ],
            )
        };
        assert_eq!(
            load(&[bad_unit(0)]).unwrap_err(),
            [
                "xds:route/a: descriptors[1].descriptors[0].rate_limit.unit: unknown unit `UNKNOWN`, expected one \
                 of: second, minute, hour, day, week, month, year"
            ]
        );
        assert!(load(&[bad_unit(42)]).unwrap_err()[0].contains("unknown unit `42`"));

        let duplicate = resource(
            "dup",
            "d",
            vec![RateLimitDescriptor {
                descriptors: vec![descriptor("k", "v"), descriptor("x", ""), descriptor("k", "v")],
                ..descriptor("outer", "")
            }],
        );
        assert_eq!(
            load(&[duplicate]).unwrap_err(),
            [
                "xds:dup: descriptors[0].descriptors[2].key: duplicate descriptor `k` with value `v` at \
                 descriptors[0].descriptors[2], first defined at descriptors[0].descriptors[0]"
            ]
        );

        let unlimited_with_unit = resource(
            "u",
            "d",
            vec![RateLimitDescriptor {
                rate_limit: Some(RateLimitPolicy {
                    unlimited: true,
                    ..policy(RateLimitUnit::Minute, 0).unwrap()
                }),
                ..descriptor("k", "")
            }],
        );
        assert_eq!(
            load(&[unlimited_with_unit]).unwrap_err(),
            ["xds:u: descriptors[0].rate_limit.unit: cannot be combined with `unlimited: true`"]
        );

        assert_eq!(
            load(&[resource("e", "d", vec![descriptor("", "v")])]).unwrap_err(),
            // As the loader says of a file with `key: ""`.
            [
                "xds:e: descriptors[0].key: must not be empty",
                "xds:e: descriptors[0].key: missing"
            ]
        );
        assert_eq!(
            load(&[resource("nameless", "", vec![])]).unwrap_err(),
            ["xds:nameless: domain: must not be empty"]
        );

        // Two resources of one domain, without merging.
        let one = resource("first", "same", vec![descriptor("a", "")]);
        let two = resource("second", "same", vec![descriptor("b", "")]);
        let errors = load(&[one.clone(), two.clone()]).unwrap_err();
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0].starts_with("xds:second: domain: domain `same` is already defined in xds:first;"),
            "{errors:?}"
        );
        // Merged, a top-level descriptor defined in both is named in each.
        let merged = config_from_configs(&[one.clone(), two], &LoadOptions::default().merge_domains(true)).unwrap();
        assert_eq!(merged.domain("same").unwrap().rules.len(), 2);
        let clash = resource("third", "same", vec![descriptor("x", ""), descriptor("a", "")]);
        let errors = config_from_configs(&[one, clash], &LoadOptions::default().merge_domains(true)).unwrap_err();
        assert_eq!(
            errors[0].to_string(),
            "xds:third: descriptors[1].key: duplicate descriptor `a` without value in domain `same`, first \
             defined in xds:first at descriptors[0] (merged files may not define one top-level descriptor twice)"
        );
    }

    /// Warnings are located alike.
    #[test]
    fn warnings_name_the_descriptor() {
        let named = |name: &str| RateLimitPolicy {
            name: name.to_owned(),
            ..policy(RateLimitUnit::Second, 1).unwrap()
        };
        let config = load(&[resource(
            "w",
            "d",
            vec![
                RateLimitDescriptor {
                    rate_limit: Some(named("twice")),
                    ..descriptor("a", "")
                },
                RateLimitDescriptor {
                    rate_limit: Some(named("twice")),
                    ..descriptor("b", "")
                },
            ],
        )])
        .unwrap();
        let warnings: Vec<String> = config.warnings().iter().map(ToString::to_string).collect();
        assert_eq!(
            warnings,
            [
                "xds:w:1:1: descriptors[1].rate_limit.name: limit name `twice` is also used at descriptors[0]: a \
              `replaces` of `twice` drops every limit of that name"
            ]
        );
    }

    /// What is not a RateLimitConfig, and what the YAML cannot carry.
    #[test]
    fn undecodable_resources_are_refused() {
        let wrong_type = pbjson_types::Any {
            type_url: "type.googleapis.com/envoy.config.cluster.v3.Cluster".to_owned(),
            value: Vec::new().into(),
        };
        let garbage = pbjson_types::Any {
            type_url: RATE_LIMIT_CONFIG_TYPE.to_owned(),
            value: vec![0xff, 0xff, 0xff].into(),
        };
        let errors = config_from_resources(&[wrong_type, garbage], &LoadOptions::default()).unwrap_err();
        assert_eq!(errors.len(), 2);
        assert!(
            errors[0]
                .to_string()
                .starts_with("xds:#0: a resource of type `type.googleapis.com/envoy.config.cluster.v3.Cluster`")
        );
        assert!(
            errors[1]
                .to_string()
                .starts_with("xds:#1: cannot decode a RateLimitConfig: ")
        );

        let nan = RateLimitDescriptor {
            metadata: Some(Struct {
                fields: [("n".to_owned(), value(Kind::NumberValue(f64::NAN)))].into(),
            }),
            ..descriptor("k", "")
        };
        assert_eq!(
            load(&[resource("m", "d", vec![nan])]).unwrap_err(),
            ["xds:m: descriptors[0].metadata: the number NaN cannot be carried by JSON metadata"]
        );

        // 64 levels load; 65 are refused with the loader's message.
        let nested = |levels: usize| {
            let mut d = RateLimitDescriptor {
                rate_limit: policy(RateLimitUnit::Second, 1),
                ..descriptor("k", "")
            };
            for _ in 1..levels {
                d = RateLimitDescriptor {
                    descriptors: vec![d],
                    ..descriptor("k", "")
                };
            }
            resource("deep", "d", vec![d])
        };
        assert!(load(&[nested(MAX_DEPTH)]).is_ok());
        let errors = load(&[nested(MAX_DEPTH + 1)]).unwrap_err();
        assert!(
            errors[0].ends_with(".descriptors: descriptors nested more than 64 levels deep"),
            "{errors:?}"
        );
    }

    /// The YAML of a resource is a config file that loads as it does.
    #[test]
    fn yaml_of_a_resource_loads_as_a_file() {
        let config = resource(
            "r",
            "files",
            vec![RateLimitDescriptor {
                rate_limit: policy(RateLimitUnit::Week, 7),
                ..descriptor("k", "v")
            }],
        );
        let yaml = yaml_of(&config).unwrap();
        assert_eq!(
            yaml,
            "domain: \"files\"\ndescriptors:\n- key: \"k\"\n  value: \"v\"\n  rate_limit: {unit: \"week\", requests_per_unit: 7}\n"
        );
        let from_file = Config::parse("r.yaml", &yaml).unwrap();
        let from_xds = load(&[config]).unwrap();
        assert_eq!(from_file.domain("files"), from_xds.domain("files"));
    }
}
