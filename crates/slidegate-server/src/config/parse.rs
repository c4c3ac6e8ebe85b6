//! From a file's YAML text to a [`Domain`], with the position of every
//! error.
//!
//! The YAML is read into marked-yaml's nodes by [`super::yaml`], which
//! keeps the line and column of every node, resolves anchors, aliases and
//! merge keys, refuses duplicate keys and does not read quoted scalars as
//! numbers or bools, so `"10"` is not an integer and `"true"` not a bool.

use super::quota::{QuotaRule, name_rules, unique_name};
use super::{ConfigError, ConfigWarning, Domain, Limit, MAX_DEPTH, Rule, Unit, ValuePattern};
use marked_yaml::types::{MarkedMappingNode, MarkedScalarNode, MarkedSequenceNode};
use marked_yaml::{Node, Span};
use slidegate_core::duration::parse_positive_duration;
use slidegate_core::{AlgorithmSpec, Policy, PolicyError, SpecError, Weighting};
use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// The most levels of lists and maps inside `metadata`.
const MAX_METADATA_DEPTH: usize = 32;

/// The most leading spaces and block indicators (`-`, `?` or `:` followed
/// by a space) a line may have.
///
/// The YAML parser recurses once per level of nesting. A block level needs
/// at least one more column than its parent (or the same column, for a list
/// in a map), and the parser caps flow levels at 255: this bounds the
/// nesting to 2 × 129 + 255 levels, which an unoptimised build parses in
/// less than 1.25 MiB of stack, so that a hostile file cannot overflow a
/// 2 MiB thread.
const MAX_INDENT: usize = 128;

/// A position in the text, from 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Pos {
    line: usize,
    column: usize,
}

fn start(span: &Span) -> Pos {
    span.start().map_or(Pos { line: 0, column: 0 }, |m| Pos {
        line: m.line(),
        column: m.column(),
    })
}

/// Where a map starts. marked-yaml puts a block map at the `:` after its
/// first key; its first key (or its `{`) is where a reader looks.
fn map_pos(map: &MarkedMappingNode) -> Pos {
    let own = start(map.span());
    match map.keys().next() {
        Some(key) => own.min(start(key.span())),
        None => own,
    }
}

/// Where a value is; for an empty value (`key:` and nothing), its key.
fn value_pos(key: &MarkedScalarNode, value: &Node) -> Pos {
    match value {
        Node::Scalar(s) if s.as_str().is_empty() && s.may_coerce() => start(key.span()),
        Node::Mapping(map) => map_pos(map),
        other => match start(other.span()) {
            Pos { line: 0, .. } => start(key.span()),
            pos => pos,
        },
    }
}

/// A plain `~`, `null` or nothing: the same as an absent key.
fn is_null(node: &Node) -> bool {
    matches!(node, Node::Scalar(s) if s.may_coerce() && matches!(s.as_str(), "" | "~" | "null" | "Null" | "NULL"))
}

fn describe(node: &Node) -> String {
    match node {
        Node::Mapping(_) => "a map".to_owned(),
        Node::Sequence(_) => "a list".to_owned(),
        Node::Scalar(s) if s.may_coerce() && s.as_str().is_empty() => "nothing".to_owned(),
        Node::Scalar(s) if s.may_coerce() => format!("`{}`", s.as_str()),
        Node::Scalar(s) => format!("the quoted string \"{}\"", s.as_str()),
    }
}

/// The parsed domain, with where its name is, its limit names and
/// `replaces` entries (checked against each other once every file of the
/// domain is read, by [`name_warnings`]) and the warnings of the file.
pub(super) struct Parsed {
    pub(super) domain: Domain,
    pub(super) line: usize,
    pub(super) column: usize,
    pub(super) names: Vec<Named>,
    pub(super) replaces: Vec<Named>,
    pub(super) warnings: Vec<ConfigWarning>,
    /// Whether each of the domain's quota rules has its own `name`.
    pub(super) quota_explicit: Vec<bool>,
}

/// A limit name or a `replaces` entry, with where it is.
pub(super) struct Named {
    name: String,
    file: String,
    pos: Pos,
    key: String,
}

struct Parser<'f> {
    file: &'f str,
    /// Every limit `name` of the file, in file order.
    names: Vec<Named>,
    /// Every `replaces` entry, in file order.
    replaces: Vec<Named>,
    warnings: Vec<ConfigWarning>,
    /// The errors of descriptors passed over so far, in file order: a bad
    /// descriptor is left out and the parse goes on, so that every error
    /// of a file can be reported at once.
    errors: Vec<ConfigError>,
}

/// Parses one domain file.
pub(super) fn parse(file: &str, text: &str) -> Result<Parsed, ConfigError> {
    parse_all(file, text).map_err(first)
}

/// The first of `errors` (which [`parse_all`] never leaves empty).
pub(super) fn first(errors: Vec<ConfigError>) -> ConfigError {
    errors.into_iter().next().unwrap_or_else(|| ConfigError {
        file: String::new(),
        line: 0,
        column: 0,
        key: None,
        message: "invalid config".to_owned(),
    })
}

/// Parses one domain file, with every error it has, in file order: each
/// descriptor at fault (every error of each), and the file's own
/// (syntax, `domain`).
pub(super) fn parse_all(file: &str, text: &str) -> Result<Parsed, Vec<ConfigError>> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let error = |pos: Pos, key: Option<String>, message: String| ConfigError {
        file: file.to_owned(),
        line: pos.line,
        column: pos.column,
        key,
        message,
    };
    check_indentation(text).map_err(|pos| {
        vec![error(
            pos,
            None,
            format!("indented too deeply: at most {MAX_INDENT} columns of spaces and block indicators"),
        )]
    })?;
    let root = super::yaml::load(text).map_err(|e| {
        vec![error(
            Pos {
                line: e.line,
                column: e.column,
            },
            e.key,
            e.message,
        )]
    })?;
    let Node::Mapping(root) = root else {
        return Err(vec![error(
            start(root.span()),
            None,
            "expected a mapping with `domain`".to_owned(),
        )]);
    };
    if root.is_empty() && root.span().start() == root.span().end() {
        return Err(vec![error(
            Pos { line: 1, column: 1 },
            None,
            "empty file: expected a mapping with `domain`".to_owned(),
        )]);
    }
    let mut parser = Parser {
        file,
        names: Vec::new(),
        replaces: Vec::new(),
        warnings: Vec::new(),
        errors: Vec::new(),
    };
    let parsed = parser.domain(&root);
    let mut errors = std::mem::take(&mut parser.errors);
    match parsed {
        Ok(parsed) if errors.is_empty() => Ok(parsed),
        Ok(_) => Err(errors),
        Err(e) => {
            errors.push(e);
            Err(errors)
        }
    }
}

/// The warnings about the limit names of one domain (`names` and
/// `replaces` of all its files, in load order), as envoyproxy/ratelimit
/// loads both cases: a name used twice (a `replaces` of it drops every
/// limit of that name), and a `replaces` entry naming no limit (it drops
/// nothing).
pub(super) fn name_warnings(names: &[Named], replaces: &[Named]) -> Vec<ConfigWarning> {
    let mut warnings = Vec::new();
    let mut first: HashMap<&str, &Named> = HashMap::new();
    for named in names {
        match first.entry(named.name.as_str()) {
            Entry::Occupied(slot) => {
                let earlier = slot.get();
                let place = if earlier.file == named.file {
                    String::new()
                } else {
                    format!("in {} ", earlier.file)
                };
                warnings.push(named.warning(format!(
                    "limit name `{}` is also used {place}at line {} column {}: a `replaces` of `{}` drops every \
                     limit of that name",
                    named.name, earlier.pos.line, earlier.pos.column, named.name
                )));
            }
            Entry::Vacant(slot) => {
                slot.insert(named);
            }
        }
    }
    for entry in replaces {
        if !first.contains_key(entry.name.as_str()) {
            warnings.push(entry.warning(format!(
                "no limit of this domain is named `{}`, so this entry replaces nothing (probably a mistake)",
                entry.name
            )));
        }
    }
    warnings
}

impl Named {
    fn warning(&self, message: String) -> ConfigWarning {
        ConfigWarning {
            file: self.file.clone(),
            line: self.pos.line,
            column: self.pos.column,
            key: Some(self.key.clone()),
            message,
        }
    }
}

/// The first line with more than [`MAX_INDENT`] leading spaces and block
/// indicators.
fn check_indentation(text: &str) -> Result<(), Pos> {
    // Lines are counted by `\n`; a lone `\r` also breaks lines for YAML.
    for (i, line) in text.split('\n').enumerate() {
        for piece in line.split('\r') {
            let mut chars = piece.chars().peekable();
            let mut prefix = 0;
            while let Some(c) = chars.next() {
                let indicator = matches!(c, '-' | '?' | ':') && matches!(chars.peek(), None | Some(' ' | '\t'));
                if !(indicator || c == ' ' || c == '\t') || prefix > MAX_INDENT {
                    break;
                }
                prefix += 1;
            }
            if prefix > MAX_INDENT {
                return Err(Pos {
                    line: i + 1,
                    column: MAX_INDENT + 1,
                });
            }
        }
    }
    Ok(())
}

/// A key of `prefix` (`rate_limit.`, `rate_limits[1].`, or nothing).
fn qualified(prefix: &str, key: &str) -> String {
    format!("{prefix}{key}")
}

/// `name` is accepted and ignored, as envoyproxy/ratelimit does (its key
/// check is one set for every level, `name` in it); Envoy Gateway writes
/// one at the top of every config it sends.
const DOMAIN_KEYS: &[&str] = &["domain", "descriptors", "quota_buckets", "name"];
const RULE_KEYS: &[&str] = &[
    "key",
    "value",
    "rate_limit",
    "rate_limits",
    "shadow_mode",
    "quota_mode",
    "share_threshold",
    "detailed_metric",
    "value_to_metric",
    "metadata",
    "descriptors",
];
const LIMIT_KEYS: &[&str] = &[
    "unit",
    "requests_per_unit",
    "unlimited",
    "name",
    "replaces",
    "algorithm",
    "window",
    "buckets",
    "weighting",
    "burst",
    "epsilon",
];
const REPLACES_KEYS: &[&str] = &["name"];
const QUOTA_KEYS: &[&str] = &["name", "bucket_id", "absent", "rate_limit"];
/// A quota rule's `rate_limit`: a descriptor's, without `name` and
/// `replaces` (the rule has its own `name`; there is nothing to replace).
const QUOTA_LIMIT_KEYS: &[&str] = &[
    "unit",
    "requests_per_unit",
    "unlimited",
    "algorithm",
    "window",
    "buckets",
    "weighting",
    "burst",
    "epsilon",
];

/// A map's entries that are not null, after checking that every key is one
/// of `known`.
type Fields<'n> = Vec<(&'n str, &'n MarkedScalarNode, &'n Node)>;

/// A limit being read: its values and where they were.
#[derive(Default)]
struct LimitFields<'n> {
    unit: Option<(Unit, &'n MarkedScalarNode)>,
    requests_per_unit: Option<(u64, &'n MarkedScalarNode)>,
    unlimited: Option<(bool, &'n MarkedScalarNode)>,
    name: Option<String>,
    replaces: Vec<String>,
    window: Option<(Duration, &'n MarkedScalarNode)>,
    algorithm: Option<(&'n str, At<'n>)>,
    buckets: Option<(u32, At<'n>)>,
    weighting: Option<(Weighting, At<'n>)>,
    burst: Option<(u64, At<'n>)>,
    epsilon: Option<(f64, At<'n>)>,
}

/// A key and its value.
type At<'n> = (&'n MarkedScalarNode, &'n Node);

impl<'n> LimitFields<'n> {
    /// The algorithm as given, for the core to read.
    fn spec(&self) -> AlgorithmSpec<'n> {
        AlgorithmSpec {
            name: self.algorithm.map(|(name, _)| name),
            buckets: self.buckets.map(|(n, _)| n),
            weighting: self.weighting.map(|(w, _)| w),
            burst: self.burst.map(|(n, _)| n),
            epsilon: self.epsilon.map(|(e, _)| e),
        }
    }

    /// The keys of the algorithm and its parameters that were given.
    fn algorithm_keys(&self) -> [Option<(&'static str, At<'n>)>; 5] {
        [
            self.algorithm.map(|(_, at)| ("algorithm", at)),
            self.buckets.map(|(_, at)| ("buckets", at)),
            self.weighting.map(|(_, at)| ("weighting", at)),
            self.burst.map(|(_, at)| ("burst", at)),
            self.epsilon.map(|(_, at)| ("epsilon", at)),
        ]
    }
}

impl Parser<'_> {
    fn error(&self, pos: Pos, key: Option<String>, message: impl Into<String>) -> ConfigError {
        ConfigError {
            file: self.file.to_owned(),
            line: pos.line,
            column: pos.column,
            key,
            message: message.into(),
        }
    }

    /// An error about `key`, at the key.
    fn key_error(&self, prefix: &str, key: &MarkedScalarNode, message: &str) -> ConfigError {
        self.error(start(key.span()), Some(qualified(prefix, key)), message)
    }

    /// An error about `key`'s value, at the value.
    fn bad(&self, prefix: &str, key: &MarkedScalarNode, value: &Node, message: impl Into<String>) -> ConfigError {
        self.error(value_pos(key, value), Some(qualified(prefix, key)), message)
    }

    /// The entries of `map` whose value is not null, in file order; an
    /// unknown key is an error at the key.
    fn fields<'n>(
        &mut self,
        map: &'n MarkedMappingNode,
        prefix: &str,
        known: &[&'static str],
    ) -> Result<Fields<'n>, ConfigError> {
        let mut fields = Vec::with_capacity(map.len());
        for (key, value) in map.iter() {
            let Some(&name) = known.iter().find(|&&k| k == key.as_str()) else {
                // Kept, and the known keys read on: the map's other errors
                // are reported with it.
                let e = self.error(
                    start(key.span()),
                    Some(qualified(prefix, key)),
                    format!("unknown key, expected one of: {}", known.join(", ")),
                );
                self.errors.push(e);
                continue;
            };
            if !is_null(value) {
                fields.push((name, key, value));
            }
        }
        Ok(fields)
    }

    /// A scalar's text.
    fn string<'n>(&self, prefix: &str, key: &MarkedScalarNode, value: &'n Node) -> Result<&'n str, ConfigError> {
        match value {
            Node::Scalar(s) => Ok(s.as_str()),
            other => Err(self.bad(
                prefix,
                key,
                value,
                format!("expected a string, found {}", describe(other)),
            )),
        }
    }

    /// A scalar's text, which must not be empty.
    fn non_empty<'n>(&self, prefix: &str, key: &MarkedScalarNode, value: &'n Node) -> Result<&'n str, ConfigError> {
        match self.string(prefix, key, value)? {
            "" => Err(self.bad(prefix, key, value, "must not be empty")),
            s => Ok(s),
        }
    }

    /// `true` or `false` (or `True`, `TRUE`, `False`, `FALSE`), unquoted.
    fn boolean(&self, prefix: &str, key: &MarkedScalarNode, value: &Node) -> Result<bool, ConfigError> {
        match value {
            Node::Scalar(s) if s.may_coerce() => match s.as_str() {
                "true" | "True" | "TRUE" => return Ok(true),
                "false" | "False" | "FALSE" => return Ok(false),
                _ => {}
            },
            _ => {}
        }
        Err(self.bad(
            prefix,
            key,
            value,
            format!("expected true or false, found {}", describe(value)),
        ))
    }

    /// A non-negative decimal integer of at most `max`, unquoted.
    fn integer(&self, prefix: &str, key: &MarkedScalarNode, value: &Node, max: u64) -> Result<u64, ConfigError> {
        let expected = || format!("expected a non-negative integer, found {}", describe(value));
        let Node::Scalar(s) = value else {
            return Err(self.bad(prefix, key, value, expected()));
        };
        let text = s.as_str();
        let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
        if !s.may_coerce() {
            return Err(self.bad(prefix, key, value, expected()));
        }
        if let Some(rest) = text.strip_prefix('-')
            && digits(rest)
            && rest.bytes().any(|b| b != b'0')
        {
            return Err(self.bad(prefix, key, value, format!("must not be negative, found `{text}`")));
        }
        if !digits(text.strip_prefix('-').unwrap_or(text)) {
            return Err(self.bad(prefix, key, value, expected()));
        }
        match text.trim_start_matches('-').parse::<u64>() {
            Ok(n) if n <= max => Ok(n),
            _ => Err(self.bad(
                prefix,
                key,
                value,
                format!("out of range: at most {max}, found `{text}`"),
            )),
        }
    }

    /// A finite decimal number such as `0.01` or `1e-3`, unquoted.
    fn number(&self, prefix: &str, key: &MarkedScalarNode, value: &Node) -> Result<f64, ConfigError> {
        if let Node::Scalar(s) = value
            && s.may_coerce()
            && is_float(s.as_str())
            && let Ok(n) = s.as_str().parse::<f64>()
            && n.is_finite()
        {
            return Ok(n);
        }
        Err(self.bad(
            prefix,
            key,
            value,
            format!("expected a number, found {}", describe(value)),
        ))
    }

    fn sequence<'n>(
        &self,
        prefix: &str,
        key: &MarkedScalarNode,
        value: &'n Node,
    ) -> Result<&'n MarkedSequenceNode, ConfigError> {
        match value {
            Node::Sequence(list) => Ok(list),
            other => Err(self.bad(
                prefix,
                key,
                value,
                format!("expected a list, found {}", describe(other)),
            )),
        }
    }

    fn mapping<'n>(
        &self,
        prefix: &str,
        key: &MarkedScalarNode,
        value: &'n Node,
    ) -> Result<&'n MarkedMappingNode, ConfigError> {
        match value {
            Node::Mapping(map) => Ok(map),
            other => Err(self.bad(prefix, key, value, format!("expected a map, found {}", describe(other)))),
        }
    }

    fn domain(&mut self, root: &MarkedMappingNode) -> Result<Parsed, ConfigError> {
        let mut name = None;
        let mut rules = Vec::new();
        let mut quota = Vec::new();
        for (field, key, value) in self.fields(root, "", DOMAIN_KEYS)? {
            match field {
                "domain" => name = Some((self.non_empty("", key, value)?.to_owned(), value_pos(key, value))),
                "name" => {
                    self.string("", key, value)?;
                }
                "quota_buckets" => {
                    let list = self.sequence("", key, value)?;
                    quota = self.quota_rules(list);
                }
                _ => {
                    let list = self.sequence("", key, value)?;
                    rules = self.rules(list, "descriptors", 1)?;
                }
            }
        }
        let Some((name, pos)) = name else {
            return Err(self.error(map_pos(root), Some("domain".to_owned()), "missing"));
        };
        let mut rules = rules;
        name_counts(&mut rules);
        name_limits(&mut rules);
        let quota_explicit: Vec<bool> = quota.iter().map(|(_, explicit)| *explicit).collect();
        let mut quota: Vec<QuotaRule> = quota.into_iter().map(|(rule, _)| rule).collect();
        name_rules(&mut quota, &quota_explicit);
        Ok(Parsed {
            domain: Domain::new(name, rules).with_quota_rules(quota),
            line: pos.line,
            column: pos.column,
            names: std::mem::take(&mut self.names),
            replaces: std::mem::take(&mut self.replaces),
            warnings: std::mem::take(&mut self.warnings),
            quota_explicit,
        })
    }

    /// The rules of `quota_buckets`, each with whether it has its own
    /// `name`; a bad rule is left out, its errors kept.
    fn quota_rules(&mut self, list: &MarkedSequenceNode) -> Vec<(QuotaRule, bool)> {
        let mut rules: Vec<(QuotaRule, bool)> = Vec::with_capacity(list.len());
        // Each explicit name: where it is.
        let mut names: HashMap<String, Pos> = HashMap::new();
        for (i, item) in list.iter().enumerate() {
            let at = format!("quota_buckets[{i}]");
            let Node::Mapping(map) = item else {
                let e = self.error(
                    start(item.span()),
                    Some(at),
                    format!(
                        "expected a map with `bucket_id` and `rate_limit`, found {}",
                        describe(item)
                    ),
                );
                self.errors.push(e);
                continue;
            };
            match self.quota_rule(map, &format!("{at}.")) {
                Ok((rule, Some((name_pos, name_key)))) => {
                    match names.entry(rule.name.clone()) {
                        Entry::Occupied(first) => {
                            let first = *first.get();
                            let e = self.error(
                                name_pos,
                                Some(name_key),
                                format!(
                                    "quota bucket rule `{}` is already defined at line {} column {}",
                                    rule.name, first.line, first.column
                                ),
                            );
                            self.errors.push(e);
                            continue;
                        }
                        Entry::Vacant(slot) => {
                            slot.insert(name_pos);
                        }
                    }
                    rules.push((rule, true));
                }
                Ok((rule, None)) => rules.push((rule, false)),
                Err(e) => self.errors.push(e),
            }
        }
        rules
    }

    /// One rule of `quota_buckets` (its keys under `prefix`,
    /// `quota_buckets[i].`), and where its own `name` is, if it has one.
    fn quota_rule(
        &mut self,
        map: &MarkedMappingNode,
        prefix: &str,
    ) -> Result<(QuotaRule, Option<(Pos, String)>), ConfigError> {
        let pos = map_pos(map);
        let mut rule = QuotaRule {
            name: String::new(),
            bucket_id: Vec::new(),
            absent: Vec::new(),
            limit: None,
            line: pos.line,
            column: pos.column,
        };
        let mut name = None;
        let mut limit = None;
        let mut limit_given = false;
        // Where each `absent` entry is.
        let mut absent_at = Vec::new();
        let before = self.errors.len();
        for (field, key, value) in self.fields(map, prefix, QUOTA_KEYS)? {
            // Every bad field is reported, as for a descriptor.
            let mut one = || -> Result<(), ConfigError> {
                match field {
                    "name" => {
                        rule.name = self.non_empty(prefix, key, value)?.to_owned();
                        name = Some((value_pos(key, value), qualified(prefix, key)));
                    }
                    "bucket_id" => rule.bucket_id = self.bucket_id(prefix, key, value)?,
                    "absent" => {
                        (rule.absent, absent_at) = self.absent(prefix, key, value)?.into_iter().unzip();
                    }
                    _ => {
                        limit_given = true;
                        let map = self.mapping(prefix, key, value)?;
                        let inner = format!("{prefix}rate_limit.");
                        limit = Some(self.limit(map, &inner, QUOTA_LIMIT_KEYS)?);
                    }
                }
                Ok(())
            };
            if let Err(e) = one() {
                self.errors.push(e);
            }
        }
        if !limit_given {
            let e = self.error(
                pos,
                Some(qualified(prefix, "rate_limit")),
                "missing: give the bucket's limit, or `{ unlimited: true }`",
            );
            self.errors.push(e);
        }
        // A key both required and refused matches nothing.
        for (index, (absent, &at)) in rule.absent.iter().zip(&absent_at).enumerate() {
            if rule.bucket_id.iter().any(|(key, _)| key == absent) {
                let e = self.error(
                    at,
                    Some(format!("{prefix}absent[{index}]")),
                    format!("`{absent}` is also in `bucket_id`: a key cannot be both required and absent"),
                );
                self.errors.push(e);
            }
        }
        if self.errors.len() > before {
            // The rule's last error, for the caller to keep.
            return Err(self
                .errors
                .pop()
                .unwrap_or_else(|| self.error(pos, None, "invalid quota bucket rule")));
        }
        rule.limit = limit.flatten();
        Ok((rule, name))
    }

    /// `bucket_id`: each key and its value pattern, sorted by key.
    fn bucket_id(
        &mut self,
        prefix: &str,
        key: &MarkedScalarNode,
        value: &Node,
    ) -> Result<Vec<(String, ValuePattern)>, ConfigError> {
        let map = self.mapping(prefix, key, value)?;
        let inner = format!("{prefix}bucket_id.");
        let mut out = Vec::with_capacity(map.len());
        let mut failed = None;
        for (k, v) in map.iter() {
            let one = || -> Result<(String, ValuePattern), ConfigError> {
                if k.as_str().is_empty() {
                    return Err(self.error(
                        start(k.span()),
                        Some(format!("{inner}\"\"")),
                        "an empty key matches no bucket id",
                    ));
                }
                let text = match v {
                    Node::Scalar(s) if !is_null(v) => s.as_str(),
                    other => {
                        return Err(self.bad(
                            &inner,
                            k,
                            v,
                            format!(
                                "expected a value (exact, with `*` wildcards, or \"*\" for any), found {}",
                                describe(other)
                            ),
                        ));
                    }
                };
                if text.is_empty() {
                    return Err(self.bad(
                        &inner,
                        k,
                        v,
                        "must not be empty: a bucket id's values never are (\"*\" matches any value)",
                    ));
                }
                Ok((k.as_str().to_owned(), ValuePattern::new(text)))
            };
            match one() {
                Ok(entry) => out.push(entry),
                Err(e) => {
                    if let Some(earlier) = failed.replace(e) {
                        self.errors.push(earlier);
                    }
                }
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// `absent`: a list of keys, each with where it is.
    fn absent(
        &mut self,
        prefix: &str,
        key: &MarkedScalarNode,
        value: &Node,
    ) -> Result<Vec<(String, Pos)>, ConfigError> {
        let list = self.sequence(prefix, key, value)?;
        let mut out: Vec<(String, Pos)> = Vec::with_capacity(list.len());
        let mut failed = None;
        for (i, item) in list.iter().enumerate() {
            let at = format!("{prefix}absent[{i}]");
            let e = match item {
                Node::Scalar(s) if !is_null(item) && !s.as_str().is_empty() => {
                    if out.iter().any(|(k, _)| k == s.as_str()) {
                        self.error(
                            start(item.span()),
                            Some(at),
                            format!("`{}` is listed twice", s.as_str()),
                        )
                    } else {
                        out.push((s.as_str().to_owned(), start(item.span())));
                        continue;
                    }
                }
                Node::Scalar(_) => self.error(
                    value_pos(key, item),
                    Some(at),
                    "an empty key: a bucket id's keys never are",
                ),
                other => self.error(
                    start(item.span()),
                    Some(at),
                    format!("expected a key, found {}", describe(other)),
                ),
            };
            if let Some(earlier) = failed.replace(e) {
                self.errors.push(earlier);
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    /// A warning at `pos`.
    fn warn(&mut self, pos: Pos, key: String, message: impl Into<String>) {
        self.warnings.push(ConfigWarning {
            file: self.file.to_owned(),
            line: pos.line,
            column: pos.column,
            key: Some(key),
            message: message.into(),
        });
    }

    /// The descriptors of one level (`depth` from 1).
    fn rules(&mut self, list: &MarkedSequenceNode, key: &str, depth: usize) -> Result<Vec<Rule>, ConfigError> {
        let mut rules: Vec<Rule> = Vec::with_capacity(list.len());
        let mut seen: HashMap<(String, Option<String>), Pos> = HashMap::new();
        for item in list.iter() {
            let Node::Mapping(map) = item else {
                let e = self.error(
                    start(item.span()),
                    Some(key.to_owned()),
                    format!("expected a map with `key`, found {}", describe(item)),
                );
                self.errors.push(e);
                continue;
            };
            // A bad descriptor is left out, its error kept, and the parse
            // goes on with the next.
            let rule = match self.rule(map, depth) {
                Ok(rule) => rule,
                Err(e) => {
                    self.errors.push(e);
                    continue;
                }
            };
            let pos = Pos {
                line: rule.line,
                column: rule.column,
            };
            let composite = (rule.key.clone(), rule.value.as_ref().map(|v| v.as_str().to_owned()));
            match seen.entry(composite) {
                Entry::Occupied(first) => {
                    let (k, v) = first.key();
                    let what = match v {
                        Some(v) => format!("`{k}` with value `{v}`"),
                        None => format!("`{k}` without value"),
                    };
                    let e = self.error(
                        pos,
                        Some("key".to_owned()),
                        format!(
                            "duplicate descriptor {what} at line {}, first defined at line {}",
                            pos.line,
                            first.get().line
                        ),
                    );
                    self.errors.push(e);
                    continue;
                }
                Entry::Vacant(slot) => {
                    slot.insert(pos);
                }
            }
            rules.push(rule);
        }
        Ok(rules)
    }

    fn rule(&mut self, map: &MarkedMappingNode, depth: usize) -> Result<Rule, ConfigError> {
        let pos = map_pos(map);
        let mut rule = Rule::at(pos.line, pos.column);
        let mut unlimited_at = None;
        let mut share_threshold_at = None;
        let mut limited = false;
        let before = self.errors.len();
        // The errors of nested descriptors, left out on their own.
        let mut nested = 0;
        for (field, key, value) in self.fields(map, "", RULE_KEYS)? {
            // A bad field is kept, and the next read: every error of the
            // descriptor is reported.
            let mut one = || -> Result<(), ConfigError> {
                match field {
                    "key" => rule.key = self.non_empty("", key, value)?.to_owned(),
                    "value" => {
                        let text = self.string("", key, value)?;
                        // As upstream: an empty value is no value.
                        rule.value = (!text.is_empty()).then(|| ValuePattern::new(text));
                    }
                    "rate_limit" => {
                        let limit = self.mapping("", key, value)?;
                        match self.limit(limit, "rate_limit.", LIMIT_KEYS)? {
                            Some(limit) => {
                                limited = true;
                                rule.limits.push(limit);
                            }
                            None => unlimited_at = unlimited_at.or(Some(key)),
                        }
                    }
                    "rate_limits" => {
                        for (i, item) in self.sequence("", key, value)?.iter().enumerate() {
                            let prefix = format!("rate_limits[{i}].");
                            let Node::Mapping(limit) = item else {
                                return Err(self.error(
                                    start(item.span()),
                                    Some(format!("rate_limits[{i}]")),
                                    format!("expected a map like `rate_limit`, found {}", describe(item)),
                                ));
                            };
                            match self.limit(limit, &prefix, LIMIT_KEYS)? {
                                Some(limit) => {
                                    limited = true;
                                    rule.limits.push(limit);
                                }
                                None => unlimited_at = unlimited_at.or(Some(key)),
                            }
                        }
                    }
                    "shadow_mode" => rule.shadow_mode = self.boolean("", key, value)?,
                    "quota_mode" => rule.quota_mode = self.boolean("", key, value)?,
                    "share_threshold" => {
                        rule.share_threshold = self.boolean("", key, value)?;
                        share_threshold_at = Some(key);
                    }
                    "detailed_metric" => rule.detailed_metric = self.boolean("", key, value)?,
                    "value_to_metric" => rule.value_to_metric = self.boolean("", key, value)?,
                    "metadata" => {
                        self.mapping("", key, value)?;
                        rule.metadata = Some(self.json(value, 0)?);
                    }
                    _ => {
                        let list = self.sequence("", key, value)?;
                        if depth >= MAX_DEPTH && !list.is_empty() {
                            return Err(self.bad(
                                "",
                                key,
                                value,
                                format!("descriptors nested more than {MAX_DEPTH} levels deep"),
                            ));
                        }
                        let errors = self.errors.len();
                        rule.children = self.rules(list, "descriptors", depth + 1)?;
                        nested += self.errors.len() - errors;
                    }
                }
                Ok(())
            };
            if let Err(e) = one() {
                self.errors.push(e);
            }
        }
        if rule.key.is_empty() {
            let e = self.error(pos, Some("key".to_owned()), "missing");
            self.errors.push(e);
        }
        if self.errors.len() > before + nested {
            // The descriptor's last error, for the caller to keep (the
            // others are kept already, in file order).
            return Err(self
                .errors
                .pop()
                .unwrap_or_else(|| self.error(pos, None, "invalid descriptor")));
        }
        // As upstream, which looks for the `*` in `key_value` (or `key`
        // alone without a value).
        let wildcard = rule.key.contains('*') || rule.value.as_ref().is_some_and(|v| v.as_str().contains('*'));
        if let Some(at) = share_threshold_at
            && rule.share_threshold
            && !wildcard
        {
            let found = match &rule.value {
                Some(value) => format!("found the value `{}`", value.as_str()),
                None => "found no value".to_owned(),
            };
            return Err(self.error(
                start(at.span()),
                Some("share_threshold".to_owned()),
                format!("can only be used with a wildcard value (containing `*`), {found}"),
            ));
        }
        if let Some(at) = unlimited_at {
            if limited {
                return Err(self.error(
                    start(at.span()),
                    Some(at.as_str().to_owned()),
                    "`unlimited: true` cannot be combined with other limits on one descriptor",
                ));
            }
            rule.unlimited = true;
        }
        Ok(rule)
    }

    /// A `rate_limit` map of the `known` keys; `None` for `unlimited:
    /// true`.
    fn limit(
        &mut self,
        map: &MarkedMappingNode,
        prefix: &str,
        known: &[&'static str],
    ) -> Result<Option<Limit>, ConfigError> {
        let mut f = LimitFields::default();
        let before = self.errors.len();
        for (field, key, value) in self.fields(map, prefix, known)? {
            // As for a descriptor's fields: every bad one reported.
            let mut one = || -> Result<(), ConfigError> {
                match field {
                    "unit" => {
                        let text = self.string(prefix, key, value)?;
                        let unit = Unit::from_name(text).ok_or_else(|| {
                            self.bad(
                            prefix,
                            key,
                            value,
                            format!(
                                "unknown unit `{text}`, expected one of: second, minute, hour, day, week, month, year"
                            ),
                        )
                        })?;
                        f.unit = Some((unit, key));
                    }
                    "requests_per_unit" => {
                        let n = self.integer(prefix, key, value, u64::from(u32::MAX))?;
                        f.requests_per_unit = Some((n, key));
                    }
                    "unlimited" => f.unlimited = Some((self.boolean(prefix, key, value)?, key)),
                    "name" => {
                        // An empty name is no name, as envoyproxy/ratelimit
                        // reads it (Envoy Gateway writes `name: ""`).
                        let name = self.string(prefix, key, value)?;
                        if !name.is_empty() {
                            self.names.push(Named {
                                name: name.to_owned(),
                                file: self.file.to_owned(),
                                pos: value_pos(key, value),
                                key: qualified(prefix, key),
                            });
                            f.name = Some(name.to_owned());
                        }
                    }
                    "replaces" => f.replaces = self.replaces(prefix, key, value)?,
                    "algorithm" => f.algorithm = Some((self.string(prefix, key, value)?, (key, value))),
                    "window" => {
                        let text = self.string(prefix, key, value)?;
                        let window = parse_positive_duration(text)
                            .map_err(|e| self.bad(prefix, key, value, format!("invalid duration `{text}`: {e}")))?;
                        f.window = Some((window, key));
                    }
                    "buckets" => {
                        let n = self.integer(prefix, key, value, u64::from(u32::MAX))?;
                        f.buckets = Some((u32::try_from(n).unwrap_or(u32::MAX), (key, value)));
                    }
                    "weighting" => {
                        let text = self.string(prefix, key, value)?;
                        let weighting = text
                            .parse::<Weighting>()
                            .map_err(|e| self.bad(prefix, key, value, e.to_string()))?;
                        f.weighting = Some((weighting, (key, value)));
                    }
                    "burst" => f.burst = Some((self.integer(prefix, key, value, u64::MAX)?, (key, value))),
                    _ => f.epsilon = Some((self.number(prefix, key, value)?, (key, value))),
                }
                Ok(())
            };
            if let Err(e) = one() {
                self.errors.push(e);
            }
        }
        if self.errors.len() > before {
            // The limit's last error, for the caller to keep.
            let pos = map_pos(map);
            return Err(self
                .errors
                .pop()
                .unwrap_or_else(|| self.error(pos, None, "invalid limit")));
        }
        self.build_limit(map, prefix, f)
    }

    fn replaces(&mut self, prefix: &str, key: &MarkedScalarNode, value: &Node) -> Result<Vec<String>, ConfigError> {
        let mut names = Vec::new();
        for (i, item) in self.sequence(prefix, key, value)?.iter().enumerate() {
            let at = format!("{prefix}replaces[{i}]");
            let Node::Mapping(map) = item else {
                return Err(self.error(
                    start(item.span()),
                    Some(at),
                    format!("expected a map with `name`, found {}", describe(item)),
                ));
            };
            let inner = format!("{at}.");
            let mut name = None;
            for (_, key, value) in self.fields(map, &inner, REPLACES_KEYS)? {
                name = Some((self.non_empty(&inner, key, value)?.to_owned(), value_pos(key, value)));
            }
            let Some((name, pos)) = name else {
                return Err(self.error(map_pos(map), Some(format!("{inner}name")), "missing"));
            };
            self.replaces.push(Named {
                name: name.clone(),
                file: self.file.to_owned(),
                pos,
                key: format!("{inner}name"),
            });
            names.push(name);
        }
        Ok(names)
    }

    fn build_limit(
        &mut self,
        map: &MarkedMappingNode,
        prefix: &str,
        f: LimitFields<'_>,
    ) -> Result<Option<Limit>, ConfigError> {
        if let Some((true, _)) = f.unlimited {
            let conflicting = [f.unit.map(|(_, k)| k), f.window.map(|(_, k)| k)]
                .into_iter()
                .chain(f.algorithm_keys().map(|given| given.map(|(_, (key, _))| key)));
            if let Some(key) = conflicting.flatten().min_by_key(|k| start(k.span())) {
                return Err(self.key_error(prefix, key, "cannot be combined with `unlimited: true`"));
            }
            // As upstream, which refuses only a `unit` here.
            if let Some((_, key)) = f.requests_per_unit {
                self.warn(
                    start(key.span()),
                    qualified(prefix, key),
                    "ignored: a limit with `unlimited: true` counts nothing",
                );
            }
            // `name` and `replaces` are allowed, as upstream, but an
            // unlimited descriptor is never counted, so they do nothing.
            return Ok(None);
        }
        let (unit, window) = match (f.unit, f.window) {
            (Some(_), Some((_, key))) => {
                return Err(self.key_error(prefix, key, "`unit` and `window` cannot both be given"));
            }
            (Some((unit, key)), None) => (Some(unit), (unit.duration(), key)),
            (None, Some(window)) => (None, window),
            (None, None) => {
                return Err(self.error(
                    map_pos(map),
                    Some(qualified(prefix, "unit")),
                    "missing: give `unit` (or `window`), or `unlimited: true`",
                ));
            }
        };
        let (requests_per_unit, rpu_key) = match f.requests_per_unit {
            Some((n, key)) => (n, Some(key)),
            None => {
                // As upstream, which reads a missing number as 0.
                self.warn(
                    map_pos(map),
                    qualified(prefix, "requests_per_unit"),
                    "missing: read as 0, which refuses every request; give `requests_per_unit` \
                     (or `unlimited: true`)",
                );
                (0, None)
            }
        };
        if let Some(name) = &f.name
            && f.replaces.contains(name)
            && let Some(key) = map.keys().find(|k| k.as_str() == "replaces")
        {
            return Err(self.key_error(prefix, key, "a limit cannot replace itself"));
        }
        let algorithm = f
            .spec()
            .algorithm(requests_per_unit)
            .map_err(|e| self.spec_error(map, prefix, &f, &e))?;
        let policy = match (requests_per_unit, rpu_key) {
            (0, _) | (_, None) => None,
            (limit, Some(rpu_key)) => Some(
                Policy::new(limit, window.0, algorithm)
                    .map_err(|e| self.key_error(prefix, policy_key(&e, rpu_key, window.1), &e.to_string()))?,
            ),
        };
        Ok(Some(Limit {
            // Named by `name_limits` once the domain's rules are known.
            header_name: f.name.clone().unwrap_or_default(),
            name: f.name,
            replaces: f.replaces,
            requests_per_unit,
            unit,
            window: window.0,
            algorithm,
            quota: policy.map(slidegate_store::Quota::new),
            policy,
        }))
    }

    /// A [`SpecError`] at the key it names: at the key for a parameter the
    /// algorithm does not take, at the value for a bad value.
    fn spec_error(&self, map: &MarkedMappingNode, prefix: &str, f: &LimitFields<'_>, e: &SpecError) -> ConfigError {
        let given = f
            .algorithm_keys()
            .into_iter()
            .flatten()
            .find(|&(name, _)| name == e.parameter());
        match (given, e) {
            (Some((_, (key, _))), SpecError::NotApplicable { .. }) => {
                self.error(start(key.span()), Some(qualified(prefix, key)), e.to_string())
            }
            (Some((_, (key, value))), _) => self.bad(prefix, key, value, e.to_string()),
            // Every error is about a parameter given, or the name.
            (None, _) => self.error(map_pos(map), Some(qualified(prefix, e.parameter())), e.to_string()),
        }
    }

    /// `metadata` as JSON.
    fn json(&self, node: &Node, depth: usize) -> Result<serde_json::Value, ConfigError> {
        use serde_json::Value;
        if depth > MAX_METADATA_DEPTH {
            return Err(self.error(
                start(node.span()),
                Some("metadata".to_owned()),
                format!("nested more than {MAX_METADATA_DEPTH} levels deep"),
            ));
        }
        Ok(match node {
            Node::Scalar(s) => scalar_json(s),
            Node::Sequence(list) => Value::Array(
                list.iter()
                    .map(|item| self.json(item, depth + 1))
                    .collect::<Result<_, _>>()?,
            ),
            Node::Mapping(map) => Value::Object(
                map.iter()
                    .map(|(k, v)| Ok((k.as_str().to_owned(), self.json(v, depth + 1)?)))
                    .collect::<Result<_, ConfigError>>()?,
            ),
        })
    }
}

/// The key a [`PolicyError`] of [`Policy::new`] is about: its algorithm's
/// parameters were checked before, so the limit or the window.
fn policy_key<'n>(
    e: &PolicyError,
    requests_per_unit: &'n MarkedScalarNode,
    window: &'n MarkedScalarNode,
) -> &'n MarkedScalarNode {
    match e.field {
        "window" => window,
        _ => requests_per_unit,
    }
}

/// A scalar as JSON: quoted scalars are strings; plain ones may be null,
/// a bool, an integer or a finite number (YAML 1.2's core schema, decimal).
fn scalar_json(s: &MarkedScalarNode) -> serde_json::Value {
    use serde_json::Value;
    let text = s.as_str();
    if !s.may_coerce() {
        return Value::String(text.to_owned());
    }
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return Value::Null,
        "true" | "True" | "TRUE" => return Value::Bool(true),
        "false" | "False" | "FALSE" => return Value::Bool(false),
        _ => {}
    }
    if is_integer(text) {
        if let Ok(n) = text.parse::<i64>() {
            return Value::from(n);
        }
        if let Ok(n) = text.trim_start_matches('+').parse::<u64>() {
            return Value::from(n);
        }
    }
    if is_float(text)
        && let Some(n) = text.parse::<f64>().ok().and_then(serde_json::Number::from_f64)
    {
        return Value::Number(n);
    }
    Value::String(text.to_owned())
}

/// `[-+]?[0-9]+`.
fn is_integer(text: &str) -> bool {
    let digits = text.strip_prefix(['-', '+']).unwrap_or(text);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

/// `[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?`.
fn is_float(text: &str) -> bool {
    let body = text.strip_prefix(['-', '+']).unwrap_or(text);
    let (mantissa, exponent) = match body.find(['e', 'E']) {
        Some(at) => (body.get(..at).unwrap_or(""), body.get(at + 1..)),
        None => (body, None),
    };
    let (whole, fraction) = match mantissa.split_once('.') {
        Some((w, f)) => (w, Some(f)),
        None => (mantissa, None),
    };
    let all_digits = |t: &str| t.bytes().all(|b| b.is_ascii_digit());
    let mantissa_ok = match fraction {
        Some(f) => all_digits(whole) && all_digits(f) && !(whole.is_empty() && f.is_empty()),
        None => !whole.is_empty() && all_digits(whole),
    };
    let exponent_ok = exponent.is_none_or(is_integer);
    mantissa_ok && exponent_ok
}

/// Gives each limit's quota the identity its count is kept under: its
/// algorithm, window and parameters and its place in its rule, without its
/// `requests_per_unit`, so that a reload that changes only the limit keeps
/// the count (the limits of one rule are always charged together, so
/// their places tell their counts apart). `gcra`'s state is measured in the
/// limit's emission interval: its identity keeps the limit, and a changed
/// limit starts afresh. The descriptor itself is the store's key, not
/// part of the identity.
pub(super) fn name_counts(rules: &mut [Rule]) {
    for rule in rules {
        for (j, limit) in rule.limits.iter_mut().enumerate() {
            if let Some(policy) = limit.policy {
                limit.quota = Some(slidegate_store::Quota::with_identity(
                    policy,
                    slidegate_core::Identity::of_count(&policy, j),
                ));
            }
        }
        name_counts(&mut rule.children);
    }
}

/// Names each unnamed limit of a domain's `rules` in the headers after its
/// rule's keys ([`Limit::header_name`]), unique among the domain's limits.
pub(super) fn name_limits(rules: &mut [Rule]) {
    fn explicit(rules: &[Rule], taken: &mut HashSet<String>) {
        for rule in rules {
            taken.extend(rule.limits.iter().filter_map(|l| l.name.clone()));
            explicit(&rule.children, taken);
        }
    }
    fn name(rules: &mut [Rule], path: &str, taken: &mut HashSet<String>) {
        for rule in rules {
            let mut here = String::with_capacity(path.len() + rule.key.len() + 8);
            if !path.is_empty() {
                here.push_str(path);
                here.push('.');
            }
            here.push_str(&rule.key);
            if let Some(value) = &rule.value {
                here.push('_');
                here.push_str(value.as_str());
            }
            let unnamed = rule.limits.iter().filter(|l| l.name.is_none()).count();
            for (j, limit) in rule.limits.iter_mut().filter(|l| l.name.is_none()).enumerate() {
                let base = if unnamed > 1 {
                    format!("{here}#{j}")
                } else {
                    here.clone()
                };
                limit.header_name = unique_name(base, taken);
            }
            name(&mut rule.children, &here, taken);
        }
    }
    let mut taken = HashSet::new();
    explicit(rules, &mut taken);
    name(rules, "", &mut taken);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn numbers_in_metadata() {
        for (text, expected) in [
            ("1", json!(1)),
            ("-1", json!(-1)),
            ("+1", json!(1)),
            ("18446744073709551615", json!(u64::MAX)),
            ("1.5", json!(1.5)),
            (".5", json!(0.5)),
            ("1.", json!(1.0)),
            ("1e3", json!(1000.0)),
            ("-2.5E-1", json!(-0.25)),
            ("1e400", json!("1e400")),
            ("99999999999999999999", json!(1e20)),
            (".", json!(".")),
            ("inf", json!("inf")),
            ("nan", json!("nan")),
            ("1e", json!("1e")),
            ("0x10", json!("0x10")),
            ("1_000", json!("1_000")),
            ("~", json!(null)),
            ("True", json!(true)),
            ("yes", json!("yes")),
        ] {
            let node = MarkedScalarNode::new(Span::new_blank(), text);
            assert_eq!(scalar_json(&node), expected, "{text}");
        }
        let mut quoted = MarkedScalarNode::new(Span::new_blank(), "1");
        quoted.set_coerce(false);
        assert_eq!(scalar_json(&quoted), json!("1"));
    }

    #[test]
    fn indentation_bound() {
        assert!(check_indentation("a:\n  - - - b\n").is_ok());
        let deep = format!("a:\n{}b\n", "- ".repeat(MAX_INDENT));
        assert_eq!(
            check_indentation(&deep),
            Err(Pos {
                line: 2,
                column: MAX_INDENT + 1
            })
        );
    }
}
