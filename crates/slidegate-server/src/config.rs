//! envoyproxy/ratelimit's YAML configuration: loading with the exact
//! position of every error, and the matching of request descriptors.
//!
//! One file holds one domain:
//!
//! ```yaml
//! domain: edge_proxy
//! descriptors:
//!   - key: remote_address
//!     rate_limit: { unit: second, requests_per_unit: 10 }
//!   - key: path
//!     value: /files/*
//!     share_threshold: true
//!     rate_limit: { unit: hour, requests_per_unit: 100 }
//! ```
//!
//! A file may also have `quota_buckets` (then `descriptors` may be left
//! out): the rules that give the buckets of Envoy's `rate_limit_quota`
//! filter their limits ([`QuotaRule`], [`Domain::find_quota`]).
//!
//! ```yaml
//! domain: edge
//! quota_buckets:
//!   - name: checkout
//!     bucket_id: { route: checkout, tenant: "*" }
//!     absent: [beta]
//!     rate_limit: { unit: minute, requests_per_unit: 600 }
//! ```
//!
//! On top of the original format, slidegate reads a few optional keys in a
//! `rate_limit`: `algorithm` (one of [`Algorithm::NAMES`], by default
//! [`DEFAULT_ALGORITHM`]), `window` (a duration such as `30s`, instead of
//! `unit`), and the algorithm's parameters: `buckets` and `weighting` (for
//! `sliding_window`; 8 and `conservative` unless given), `burst` (for
//! `gcra`; the limit unless given) and `epsilon` (for
//! `exponential_histogram`; 0.01 unless given). They are read by the core's
//! [`AlgorithmSpec`](slidegate_core::AlgorithmSpec), as the CLI and the
//! JSON API read them; a parameter of another algorithm is an error at its
//! key. A descriptor may have several limits in `rate_limits`, a list of
//! maps like `rate_limit`.
//!
//! ```yaml
//! domain: api
//! descriptors:
//!   - key: user
//!     rate_limit: { unit: minute, requests_per_unit: 60, algorithm: gcra, burst: 5 }
//! ```
//!
//! Anchors and aliases may share a part of a file (`rate_limit: &common
//! {...}`, then `rate_limit: *common`), and a merge key takes a shared map
//! with changes (`rate_limit: { <<: *common, requests_per_unit: 9 }`), as
//! envoyproxy/ratelimit's YAML library reads them; the aliases of a file
//! may copy a bounded number of nodes. What envoyproxy/ratelimit loads but
//! is probably a mistake loads with a [`ConfigWarning`]
//! ([`Config::warnings`]).
//!
//! ```
//! use slidegate_server::config::Config;
//!
//! let domain = Config::parse_domain(
//!     "edge.yaml",
//!     "domain: edge\ndescriptors:\n  - key: client\n    rate_limit: { unit: second, requests_per_unit: 10 }\n",
//! )
//! .unwrap();
//! let m = domain.find(&[("client", "alice")]).unwrap();
//! assert_eq!(m.rule.limits[0].requests_per_unit, 10);
//! ```

mod parse;
mod quota;
mod yaml;

pub use quota::QuotaRule;

use slidegate_core::{Algorithm, Policy};
use std::collections::btree_map::Entry;
use std::collections::hash_map::Entry as HashEntry;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The most levels of nested `descriptors` a domain may have (and so the
/// most entries a request descriptor can match).
pub const MAX_DEPTH: usize = 64;

/// The default algorithm when `algorithm` is not given: the core's
/// [`Algorithm::DEFAULT`].
pub const DEFAULT_ALGORITHM: Algorithm = Algorithm::DEFAULT;

/// Where and why a config is wrong.
///
/// Displayed as `{file}:{line}:{column}: {key}: {message}`, without the
/// `{key}: ` part when there is no key. Lines and columns count from 1;
/// both are 0 when the error is not inside the text (an unreadable file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file, as given to [`Config::load`] or [`Config::parse_domain`].
    pub file: String,
    /// The line, from 1 (0: not inside the text).
    pub line: usize,
    /// The column, from 1, in characters (0: not inside the text).
    pub column: usize,
    /// The YAML key at fault, qualified by its map within the descriptor:
    /// `domain`, `key`, `value`, `rate_limit.unit`,
    /// `rate_limits[1].requests_per_unit`, `rate_limit.replaces[0].name`…
    pub key: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // An error about the whole file (it cannot be read, it is not a
        // regular file) has no line to show.
        if self.line == 0 {
            write!(f, "{}: ", self.file)?;
        } else {
            write!(f, "{}:{}:{}: ", self.file, self.line, self.column)?;
        }
        if let Some(key) = &self.key {
            write!(f, "{key}: ")?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for ConfigError {}

/// Something in a config that loads, as envoyproxy/ratelimit loads it, but
/// is probably a mistake: a `replaces` naming no limit, a limit name used
/// twice, `requests_per_unit` beside `unlimited: true`, a `rate_limit`
/// without `requests_per_unit`.
///
/// Displayed as a [`ConfigError`] is: `{file}:{line}:{column}: {key}:
/// {message}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigWarning {
    /// The file, as given to [`Config::load`] or [`Config::parse`].
    pub file: String,
    /// The line, from 1.
    pub line: usize,
    /// The column, from 1, in characters.
    pub column: usize,
    /// The YAML key, qualified as in [`ConfigError::key`].
    pub key: Option<String>,
    /// What is probably wrong, and what the config does instead.
    pub message: String,
}

impl fmt::Display for ConfigWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}: ", self.file, self.line, self.column)?;
        if let Some(key) = &self.key {
            write!(f, "{key}: ")?;
        }
        f.write_str(&self.message)
    }
}

/// How [`Config::load_with`] reads its files.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LoadOptions {
    /// Merge the files of one domain into one domain, as
    /// envoyproxy/ratelimit's `MERGE_DOMAIN_CONFIG`: their top-level
    /// descriptors are joined in load order, and a top-level descriptor
    /// (key and value) defined in two of them is an error. Without it, a
    /// domain in two files is an error.
    pub merge_domains: bool,
    /// The largest file read, in bytes (`None`: [`DEFAULT_MAX_FILE_BYTES`]);
    /// a larger one is refused before it is read.
    pub max_file_bytes: Option<u64>,
    /// A folder without a config file loads as no domains. Without it (the
    /// default) such a folder is an error naming it, for an empty folder
    /// serves no limit at all: a volume not mounted yet, a path mistyped, a
    /// folder emptied while a deployment rewrites it.
    pub allow_empty_folders: bool,
}

/// The largest config file read by default: 64 MiB, far beyond any
/// hand-written config, and bounded so that a wrong path (a log, a disk
/// image) is refused rather than read whole.
pub const DEFAULT_MAX_FILE_BYTES: u64 = 64 << 20;

impl LoadOptions {
    /// These options with [`LoadOptions::max_file_bytes`] set to `bytes`.
    #[must_use]
    pub fn max_file_bytes(mut self, bytes: u64) -> LoadOptions {
        self.max_file_bytes = Some(bytes);
        self
    }

    /// These options with [`LoadOptions::merge_domains`] set to `merge`.
    #[must_use]
    pub fn merge_domains(mut self, merge: bool) -> LoadOptions {
        self.merge_domains = merge;
        self
    }

    /// These options with [`LoadOptions::allow_empty_folders`] set to
    /// `allow`.
    #[must_use]
    pub fn allow_empty_folders(mut self, allow: bool) -> LoadOptions {
        self.allow_empty_folders = allow;
        self
    }
}

/// Every domain, loaded from files.
#[derive(Debug, Clone, Default)]
pub struct Config {
    domains: BTreeMap<String, Domain>,
    /// The files each domain was loaded from.
    sources: BTreeMap<String, Sources>,
    warnings: Vec<ConfigWarning>,
}

/// The files of one domain, in load order, and the file of each top-level
/// rule and of each quota rule (an index into `files`).
#[derive(Debug, Clone, Default)]
struct Sources {
    files: Vec<String>,
    rule_files: Vec<usize>,
    quota_rule_files: Vec<usize>,
}

impl Sources {
    /// Where something was first defined: `FILE at line N`, from its
    /// (file index, line).
    fn place(&self, (file, line): (usize, usize)) -> String {
        let file = self.files.get(file).map_or("another file", String::as_str);
        format!("{file} at line {line}")
    }
}

/// A domain being loaded: its limit names and `replaces` entries, checked
/// once all its files are read, and its top-level descriptors, for merging.
#[derive(Default)]
struct Loading {
    names: Vec<parse::Named>,
    replaces: Vec<parse::Named>,
    /// Key and value of each top-level rule: the file (index) and line.
    top: HashMap<(String, Option<String>), (usize, usize)>,
    /// Whether each quota rule has its own `name`, in load order.
    quota_explicit: Vec<bool>,
    /// Each explicit quota rule name: the file (index) and line.
    quota_names: HashMap<String, (usize, usize)>,
}

impl Config {
    /// Loads every path: a YAML file, or a directory whose `*.yaml` and
    /// `*.yml` files (not recursive, sorted by name; names starting with a
    /// dot are skipped, as a shell glob does) are each one domain. A
    /// directory without such a file is an error (see
    /// [`LoadOptions::allow_empty_folders`]), and so is an empty file. What
    /// loads but is probably a mistake is in [`Config::warnings`].
    ///
    /// # Errors
    ///
    /// An unreadable path or a directory without a config file (line and
    /// column 0), any error of [`Config::parse_domain`] (an empty file
    /// among them), or a domain defined in two files (on the second file,
    /// naming the first).
    pub fn load(paths: &[PathBuf]) -> Result<Config, ConfigError> {
        Config::load_with(paths, &LoadOptions::default())
    }

    /// Loads every path as [`Config::load`] does, with `options`: with
    /// [`LoadOptions::merge_domains`], the files of one domain make one
    /// domain, their top-level descriptors in load order.
    ///
    /// # Errors
    ///
    /// Those of [`Config::load`]; when merging, a top-level descriptor (key
    /// and value) of a domain defined in two files instead of a domain
    /// defined in two files (on the second, naming the first).
    pub fn load_with(paths: &[PathBuf], options: &LoadOptions) -> Result<Config, ConfigError> {
        Config::load_all(paths, options).map_err(parse::first)
    }

    /// Loads every path as [`Config::load_with`] does, but on an error goes
    /// on to the next descriptor and the next file, to report every error
    /// at once (as `slidegate check` does).
    ///
    /// # Errors
    ///
    /// Every error [`Config::load_with`] would meet, in load order (never
    /// empty): every error of each descriptor at fault, of each file
    /// that does not parse, of each unreadable path.
    pub fn load_all(paths: &[PathBuf], options: &LoadOptions) -> Result<Config, Vec<ConfigError>> {
        let mut errors = Vec::new();
        let mut files = Vec::new();
        for path in paths {
            match std::fs::metadata(path) {
                Err(e) => errors.push(io_error(path, &e)),
                Ok(metadata) if metadata.is_dir() => match domain_files(path) {
                    Ok(found) if found.is_empty() && !options.allow_empty_folders => {
                        errors.push(file_error(path, NO_CONFIG_FILE.to_owned()));
                    }
                    Ok(found) => files.extend(found),
                    Err(e) => errors.push(e),
                },
                Ok(_) => files.push(path.clone()),
            }
        }
        let max = options.max_file_bytes.unwrap_or(DEFAULT_MAX_FILE_BYTES);
        let texts = files
            .into_iter()
            .map(|path| (path.display().to_string(), read_file(&path, max)));
        Config::from_texts(texts, options, errors)
    }

    /// Parses texts, each one domain named in errors and warnings by its
    /// `file` (the first of each pair), as [`Config::load_all`] loads files
    /// (the same checks, the same errors; with
    /// [`LoadOptions::merge_domains`], the texts of one domain are merged):
    /// for a config that comes from elsewhere than files, such as the xDS
    /// client's. [`LoadOptions::max_file_bytes`] and
    /// [`LoadOptions::allow_empty_folders`] do not apply.
    ///
    /// # Errors
    ///
    /// Every error of every text, in order (never empty).
    pub fn parse_all(
        texts: impl IntoIterator<Item = (String, String)>,
        options: &LoadOptions,
    ) -> Result<Config, Vec<ConfigError>> {
        let texts = texts.into_iter().map(|(file, text)| (file, Ok(text)));
        Config::from_texts(texts, options, Vec::new())
    }

    /// The config of `texts` (each a file's name and its text, or why it
    /// could not be read), after the `errors` found before them.
    fn from_texts(
        texts: impl Iterator<Item = (String, Result<String, Vec<ConfigError>>)>,
        options: &LoadOptions,
        mut errors: Vec<ConfigError>,
    ) -> Result<Config, Vec<ConfigError>> {
        let mut config = Config::default();
        let mut loading: BTreeMap<String, Loading> = BTreeMap::new();
        for (file, text) in texts {
            match text.and_then(|text| parse::parse_all(&file, &text)) {
                Ok(parsed) => {
                    if let Err(e) = config.add(parsed, file, &mut loading, options.merge_domains) {
                        errors.push(e);
                    }
                }
                Err(found) => errors.extend(found),
            }
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        for names in loading.values() {
            config
                .warnings
                .extend(parse::name_warnings(&names.names, &names.replaces));
        }
        config.index_now();
        Ok(config)
    }

    /// Parses one file's text as a config of its one domain, with its
    /// warnings; `file` names it in errors and warnings.
    ///
    /// # Errors
    ///
    /// Those of [`Config::parse_domain`].
    pub fn parse(file: &str, text: &str) -> Result<Config, ConfigError> {
        let mut config = Config::default();
        let mut loading = BTreeMap::new();
        config.add(parse::parse(file, text)?, file.to_owned(), &mut loading, false)?;
        for names in loading.values() {
            config
                .warnings
                .extend(parse::name_warnings(&names.names, &names.replaces));
        }
        config.index_now();
        Ok(config)
    }

    /// Adds one parsed file, loaded from `file`: a new domain, or, when
    /// `merge`, more top-level rules for a domain already loaded.
    fn add(
        &mut self,
        parsed: parse::Parsed,
        file: String,
        loading: &mut BTreeMap<String, Loading>,
        merge: bool,
    ) -> Result<(), ConfigError> {
        let parse::Parsed {
            domain,
            line,
            column,
            names,
            replaces,
            warnings,
            quota_explicit,
        } = parsed;
        let sources = self.sources.entry(domain.name.clone()).or_default();
        if let Some(first) = sources.files.first()
            && !merge
        {
            return Err(ConfigError {
                file,
                line,
                column,
                key: Some("domain".to_owned()),
                message: format!(
                    "domain `{}` is already defined in {first}; to join the files of one domain, \
                     give --merge-domain-config (MERGE_DOMAIN_CONFIG=true)",
                    domain.name
                ),
            });
        }
        let state = loading.entry(domain.name.clone()).or_default();
        let index = sources.files.len();
        // As upstream: the descriptors of a merged file are loaded into the
        // domain's top level, where a key and value defined twice is an
        // error, whichever file they come from.
        for rule in &domain.rules {
            let composite = (rule.key.clone(), rule.value.as_ref().map(|v| v.as_str().to_owned()));
            match state.top.entry(composite) {
                HashEntry::Occupied(first) => {
                    let (k, v) = first.key();
                    let what = match v {
                        Some(v) => format!("`{k}` with value `{v}`"),
                        None => format!("`{k}` without value"),
                    };
                    let first = sources.place(*first.get());
                    return Err(ConfigError {
                        file,
                        line: rule.line,
                        column: rule.column,
                        key: Some("key".to_owned()),
                        message: format!(
                            "duplicate descriptor {what} in domain `{}`, first defined in {first} (merged files \
                             may not define one top-level descriptor twice)",
                            domain.name
                        ),
                    });
                }
                HashEntry::Vacant(slot) => {
                    slot.insert((index, rule.line));
                }
            }
        }
        // A quota rule's own name is unique in its domain, across merged
        // files too.
        for (i, rule) in domain.quota_rules.iter().enumerate() {
            if !quota_explicit.get(i).copied().unwrap_or(false) {
                continue;
            }
            match state.quota_names.entry(rule.name.clone()) {
                HashEntry::Occupied(first) => {
                    let first = sources.place(*first.get());
                    return Err(ConfigError {
                        file,
                        line: rule.line,
                        column: rule.column,
                        key: Some(format!("quota_buckets[{i}].name")),
                        message: format!(
                            "quota bucket rule `{}` is already defined in domain `{}`, in {first}",
                            rule.name, domain.name
                        ),
                    });
                }
                HashEntry::Vacant(slot) => {
                    slot.insert((index, rule.line));
                }
            }
        }
        sources.files.push(file);
        sources
            .rule_files
            .extend(std::iter::repeat_n(index, domain.rules.len()));
        sources
            .quota_rule_files
            .extend(std::iter::repeat_n(index, domain.quota_rules.len()));
        state.names.extend(names);
        state.replaces.extend(replaces);
        state.quota_explicit.extend(quota_explicit);
        self.warnings.extend(warnings);
        match self.domains.entry(domain.name.clone()) {
            Entry::Occupied(mut slot) => {
                let merged = slot.get_mut();
                merged.rules.extend(domain.rules);
                if !domain.quota_rules.is_empty() {
                    merged.quota_rules.extend(domain.quota_rules);
                    // The default names of the files made unique together.
                    quota::name_rules(&mut merged.quota_rules, &state.quota_explicit);
                }
            }
            Entry::Vacant(slot) => {
                slot.insert(domain);
            }
        }
        Ok(())
    }

    /// Parses one file's text; `file` names it in errors.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] at the line and column at fault: YAML syntax,
    /// unknown keys, wrong types, out-of-range numbers, bad units or
    /// durations, contradictory keys, duplicate descriptors, a limit
    /// replacing itself, `share_threshold` on a value without `*`. The
    /// warnings are dropped: [`Config::parse`] keeps them.
    pub fn parse_domain(file: &str, text: &str) -> Result<Domain, ConfigError> {
        parse::parse(file, text).map(|parsed| parsed.domain)
    }

    /// A config of these domains.
    ///
    /// # Errors
    ///
    /// Two domains of the same name (the error has the file `<config>` and
    /// line and column 0).
    pub fn from_domains(domains: Vec<Domain>) -> Result<Config, ConfigError> {
        let mut config = Config::default();
        for domain in domains {
            match config.domains.entry(domain.name.clone()) {
                Entry::Occupied(_) => {
                    return Err(ConfigError {
                        file: "<config>".to_owned(),
                        line: 0,
                        column: 0,
                        key: Some("domain".to_owned()),
                        message: format!("domain `{}` is defined twice", domain.name),
                    });
                }
                Entry::Vacant(slot) => {
                    slot.insert(domain);
                }
            }
        }
        config.index_now();
        Ok(config)
    }

    /// Indexes every domain's larger levels, on this thread (a load's).
    fn index_now(&self) {
        for domain in self.domains.values() {
            domain.index_now();
        }
    }

    /// The domain called `name`.
    pub fn domain(&self, name: &str) -> Option<&Domain> {
        self.domains.get(name)
    }

    /// The file the domain called `name` was loaded from, the first one
    /// of a merged domain (`None` for a domain not loaded from a file).
    pub fn file_of(&self, name: &str) -> Option<&str> {
        self.sources.get(name)?.files.first().map(String::as_str)
    }

    /// Every file the domain called `name` was loaded from, in load order:
    /// one, or several for a merged domain (none for a domain not loaded
    /// from a file).
    pub fn files_of(&self, name: &str) -> impl Iterator<Item = &str> {
        self.sources
            .get(name)
            .into_iter()
            .flat_map(|sources| sources.files.iter().map(String::as_str))
    }

    /// The file of the domain's top-level rule `rule` (an index into
    /// [`Domain::rules`]), and so of every rule under it: where its line
    /// and column are (`None` for a domain not loaded from a file).
    pub fn rule_file(&self, domain: &str, rule: usize) -> Option<&str> {
        let sources = self.sources.get(domain)?;
        let file = sources.rule_files.get(rule)?;
        sources.files.get(*file).map(String::as_str)
    }

    /// The file of the domain's quota rule `rule` (an index into
    /// [`Domain::quota_rules`]): where its line and column are (`None` for
    /// a domain not loaded from a file).
    pub fn quota_rule_file(&self, domain: &str, rule: usize) -> Option<&str> {
        let sources = self.sources.get(domain)?;
        let file = sources.quota_rule_files.get(rule)?;
        sources.files.get(*file).map(String::as_str)
    }

    /// What loaded but is probably a mistake, in load order: to log once
    /// at every load.
    pub fn warnings(&self) -> &[ConfigWarning] {
        &self.warnings
    }

    /// Rewrites each warning with `rewrite` (the xDS client names its
    /// resources' descriptors by path rather than by line).
    pub(crate) fn rewrite_warnings(&mut self, rewrite: impl FnMut(&mut ConfigWarning)) {
        self.warnings.iter_mut().for_each(rewrite);
    }

    /// Every domain, by name.
    pub fn domains(&self) -> impl Iterator<Item = &Domain> {
        self.domains.values()
    }

    /// The same config with every limit (of a descriptor or a quota rule)
    /// counted by `algorithm` instead of its own: the same rules, limits and
    /// windows (`slidegate simulate`'s
    /// what-if replay sets one config's rules beside the exact
    /// `sliding_log` and a `fixed_window` of the same length). A limit of 0
    /// stays one.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] at the rule of a limit that `algorithm` cannot
    /// keep (a `sliding_window` whose buckets would be narrower than a
    /// nanosecond, say), naming the policy's complaint.
    pub fn with_algorithm(&self, algorithm: Algorithm) -> Result<Config, ConfigError> {
        /// `limit` counted by `algorithm`; an error at `line`, `column`.
        fn recount(
            limit: &mut Limit,
            algorithm: Algorithm,
            (domain, file, line, column): (&str, &str, usize, usize),
        ) -> Result<(), ConfigError> {
            limit.algorithm = algorithm;
            if let Some(policy) = limit.policy {
                let policy = Policy::new(policy.limit(), limit.window, algorithm).map_err(|e| ConfigError {
                    file: file.to_owned(),
                    line,
                    column,
                    key: Some("algorithm".to_owned()),
                    message: format!("domain `{domain}`: {} cannot count this limit: {e}", algorithm.name()),
                })?;
                limit.policy = Some(policy);
            }
            Ok(())
        }
        fn rewrite(domain: &str, file: &str, rules: &mut [Rule], algorithm: Algorithm) -> Result<(), ConfigError> {
            for rule in rules.iter_mut() {
                for limit in &mut rule.limits {
                    recount(limit, algorithm, (domain, file, rule.line, rule.column))?;
                }
                rewrite(domain, file, &mut rule.children, algorithm)?;
            }
            Ok(())
        }
        let mut config = self.clone();
        for (name, domain) in &mut config.domains {
            let file = self.file_of(name).unwrap_or("<config>");
            rewrite(name, file, &mut domain.rules, algorithm)?;
            parse::name_counts(&mut domain.rules);
            for (i, rule) in domain.quota_rules.iter_mut().enumerate() {
                let file = self.quota_rule_file(name, i).unwrap_or(file);
                if let Some(limit) = &mut rule.limit {
                    recount(limit, algorithm, (name, file, rule.line, rule.column))?;
                    limit.quota = limit.policy.map(slidegate_store::Quota::new);
                }
            }
        }
        config.index_now();
        Ok(config)
    }

    /// The reload rule: whether `new` may replace `old` without silently
    /// turning limits off. It may not when
    ///
    /// - `new` has no domain and `old` has one (every limit would go), or
    /// - a domain of `old` with at least one limit (of a descriptor or a
    ///   quota rule) is still named in `new` but says nothing there: no
    ///   limit and no `unlimited: true` anywhere in its descriptors, and no
    ///   quota rule. A file caught half written (`domain: t` alone) or
    ///   emptied of its descriptors looks like that; a deliberate change
    ///   says `unlimited: true`, or removes the domain's file.
    ///
    /// Anything else may: a domain whose file is gone while others remain
    /// (the log names it), and any change that leaves each domain of `old`
    /// at least one limit, `unlimited` rule or quota rule.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] on the file of the first domain emptied (line and
    /// column 0), counting the others, or on `<config>` when every domain
    /// would go.
    pub fn check_reload(old: &Config, new: &Config) -> Result<(), ConfigError> {
        const ALLOW: &str = "to serve it anyway, allow emptying reloads (`--allow-empty-reload`)";
        if new.domains.is_empty() && !old.domains.is_empty() {
            return Err(ConfigError {
                file: "<config>".to_owned(),
                line: 0,
                column: 0,
                key: None,
                message: format!(
                    "reload refused: the new config has no domain, which would remove every limit of the {} \
                     domains in force; {ALLOW}",
                    old.domains.len()
                ),
            });
        }
        let mut emptied = old.domains().filter_map(|domain| {
            let had = limit_count(&domain.rules) + domain.quota_rules.iter().filter(|r| r.limit.is_some()).count();
            let now = new.domain(&domain.name)?;
            let says = states_anything(&now.rules) || !now.quota_rules.is_empty();
            (had > 0 && !says).then_some((domain.name.as_str(), had))
        });
        let Some((name, had)) = emptied.next() else {
            return Ok(());
        };
        let others: Vec<&str> = emptied.map(|(name, _)| name).collect();
        let more = match others.len() {
            0 => String::new(),
            1 => format!(" (and domain `{}` alike)", others.join("")),
            n => format!(" (and {n} more domains alike: {})", others.join(", ")),
        };
        Err(ConfigError {
            file: new.file_of(name).unwrap_or("<config>").to_owned(),
            line: 0,
            column: 0,
            key: None,
            message: format!(
                "reload refused: domain `{name}` would lose every limit ({had} in force, none in the new \
                 file: emptied, or caught half written){more}; {ALLOW}"
            ),
        })
    }
}

/// The limits of `rules` and of their children.
fn limit_count(rules: &[Rule]) -> usize {
    rules
        .iter()
        .map(|rule| rule.limits.len() + limit_count(&rule.children))
        .sum()
}

/// Whether any of `rules` or their children has a limit or is
/// `unlimited`.
fn states_anything(rules: &[Rule]) -> bool {
    rules
        .iter()
        .any(|rule| !rule.limits.is_empty() || rule.unlimited || states_anything(&rule.children))
}

/// The text of the config file at `path`: only a regular file (a FIFO
/// or a device would block the load or never end) of at most `max` bytes.
fn read_file(path: &Path, max: u64) -> Result<String, Vec<ConfigError>> {
    let metadata = std::fs::metadata(path).map_err(|e| vec![io_error(path, &e)])?;
    if !metadata.is_file() {
        return Err(vec![file_error(
            path,
            "not a regular file (a config is a YAML file or a folder of them)".to_owned(),
        )]);
    }
    if metadata.len() > max {
        return Err(vec![file_error(
            path,
            format!(
                "{} bytes, over the limit of {max} bytes for a config file",
                metadata.len()
            ),
        )]);
    }
    std::fs::read_to_string(path).map_err(|e| vec![io_error(path, &e)])
}

fn io_error(path: &Path, e: &std::io::Error) -> ConfigError {
    file_error(path, format!("cannot read: {e}"))
}

/// An error about a whole file (line and column 0).
fn file_error(path: &Path, message: String) -> ConfigError {
    ConfigError {
        file: path.display().to_string(),
        line: 0,
        column: 0,
        key: None,
        message,
    }
}

/// Why a folder without a config file is refused.
const NO_CONFIG_FILE: &str = "no config file in this folder (a `*.yaml` or `*.yml` file whose name does not start \
                              with `.`): it would serve no limit";

/// The `*.yaml` and `*.yml` files of `dir`, sorted by name.
fn domain_files(dir: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| io_error(dir, &e))? {
        let entry = entry.map_err(|e| io_error(dir, &e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.starts_with('.') || !(name.ends_with(".yaml") || name.ends_with(".yml")) {
            continue;
        }
        let path = entry.path();
        // Follows symbolic links, as Kubernetes' mounted ConfigMaps use them.
        if std::fs::metadata(&path).map_err(|e| io_error(&path, &e))?.is_file() {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// One domain: its name and its tree of rules.
#[derive(Debug, Clone, PartialEq)]
pub struct Domain {
    /// The `domain` of the file.
    pub name: String,
    /// The top-level `descriptors`, in file order.
    pub rules: Vec<Rule>,
    /// The `quota_buckets`, in file order (see [`Domain::find_quota`]).
    pub quota_rules: Vec<QuotaRule>,
    /// The rules of its larger levels by key and value, made by the
    /// first [`Domain::find`] (a config loaded from files has it made at
    /// load).
    index: Index,
}

/// The levels of a domain's rule tree with at least [`INDEXED`] rules, by
/// the address of their first rule: each level's rules by key, and by
/// value for exact values, so that a lookup in a level of 100,000 rules
/// costs two hash lookups rather than a scan.
#[derive(Default)]
struct Index(std::sync::OnceLock<HashMap<usize, Level>>);

/// A level of rules with fewer is scanned.
const INDEXED: usize = 16;

/// One level's rules (by their place in the level) under one key.
#[derive(Default)]
struct KeyRules {
    /// The rules with an exact value, by value (the first of each).
    exact: HashMap<String, usize>,
    /// The rules with a wildcard value or none, in file order.
    rest: Vec<usize>,
}

/// One indexed level.
struct Level {
    /// Its number of rules, to tell it from a level since changed.
    len: usize,
    by_key: HashMap<String, KeyRules>,
}

impl Index {
    fn levels(&self, rules: &[Rule]) -> &HashMap<usize, Level> {
        self.0.get_or_init(|| {
            let mut levels = HashMap::new();
            index_levels(rules, &mut levels);
            levels
        })
    }
}

/// Indexes `rules` and the levels below it, the large ones.
fn index_levels(rules: &[Rule], levels: &mut HashMap<usize, Level>) {
    if rules.len() >= INDEXED {
        let mut by_key: HashMap<String, KeyRules> = HashMap::new();
        for (i, rule) in rules.iter().enumerate() {
            let slot = by_key.entry(rule.key.clone()).or_default();
            match &rule.value {
                Some(ValuePattern::Exact(value)) => {
                    slot.exact.entry(value.clone()).or_insert(i);
                }
                _ => slot.rest.push(i),
            }
        }
        levels.insert(
            rules.as_ptr() as usize,
            Level {
                len: rules.len(),
                by_key,
            },
        );
    }
    for rule in rules {
        index_levels(&rule.children, levels);
    }
}

impl Clone for Index {
    /// A copy is indexed again when first used.
    fn clone(&self) -> Self {
        Index::default()
    }
}

impl PartialEq for Index {
    /// An index is what the rules make it.
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl fmt::Debug for Index {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let levels = self.0.get().map_or(0, HashMap::len);
        write!(f, "Index({levels} levels)")
    }
}

/// One descriptor of the config: a key, maybe a value, its limits and its
/// nested descriptors.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// The entry's key.
    pub key: String,
    /// The entry's value, exact or a wildcard; `None` matches any value.
    pub value: Option<ValuePattern>,
    /// From `rate_limit` and/or `rate_limits` (a list, slidegate's
    /// extension), in file order; empty means no limit.
    pub limits: Vec<Limit>,
    /// `rate_limit: { unlimited: true }`.
    pub unlimited: bool,
    /// `shadow_mode`: evaluate and count, but always answer OK.
    pub shadow_mode: bool,
    /// `quota_mode`: a soft limit.
    pub quota_mode: bool,
    /// `share_threshold`: all values matched by this wildcard share one
    /// counter.
    pub share_threshold: bool,
    /// `detailed_metric`.
    pub detailed_metric: bool,
    /// `value_to_metric`.
    pub value_to_metric: bool,
    /// `metadata`, as JSON (any YAML map converted: strings, numbers,
    /// bools, null, lists, maps).
    pub metadata: Option<serde_json::Value>,
    /// The nested `descriptors`, in file order.
    pub children: Vec<Rule>,
    /// The line where the rule starts, for diagnostics.
    pub line: usize,
    /// The column where the rule starts, for diagnostics.
    pub column: usize,
}

impl Rule {
    /// A rule at `line`, `column` with no key, value, limits, flags or
    /// children yet.
    pub(crate) fn at(line: usize, column: usize) -> Rule {
        Rule {
            key: String::new(),
            value: None,
            limits: Vec::new(),
            unlimited: false,
            shadow_mode: false,
            quota_mode: false,
            share_threshold: false,
            detailed_metric: false,
            value_to_metric: false,
            metadata: None,
            children: Vec::new(),
            line,
            column,
        }
    }
}

/// A rule's `value`: exact, or with `*` wildcards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValuePattern {
    /// The value must be exactly this.
    Exact(String),
    /// `*` matches any run of characters (possibly empty), anywhere, any
    /// number of times; the rest must match exactly.
    Wildcard(String),
}

impl ValuePattern {
    /// A wildcard if `text` has a `*`, else an exact value.
    pub fn new(text: impl Into<String>) -> ValuePattern {
        let text = text.into();
        if text.contains('*') {
            ValuePattern::Wildcard(text)
        } else {
            ValuePattern::Exact(text)
        }
    }

    /// Whether `value` matches.
    pub fn matches(&self, value: &str) -> bool {
        match self {
            ValuePattern::Exact(exact) => exact == value,
            ValuePattern::Wildcard(pattern) => wildcard_matches(pattern, value),
        }
    }

    /// The text as written.
    pub fn as_str(&self) -> &str {
        match self {
            ValuePattern::Exact(s) | ValuePattern::Wildcard(s) => s,
        }
    }
}

/// Matches `pattern`, where `*` stands for any run of characters, against
/// `value`: the first piece must be a prefix, the last a suffix, and the
/// pieces between are found leftmost first, which is optimal for `*` alone.
fn wildcard_matches(pattern: &str, value: &str) -> bool {
    let mut pieces = pattern.split('*');
    let first = pieces.next().unwrap_or("");
    let Some(mut rest) = value.strip_prefix(first) else {
        return false;
    };
    let Some(last) = pieces.next_back() else {
        // No `*` at all: an exact match.
        return rest.is_empty();
    };
    for piece in pieces {
        match rest.find(piece) {
            Some(at) => rest = rest.get(at + piece.len()..).unwrap_or(""),
            None => return false,
        }
    }
    rest.ends_with(last)
}

/// One limit of a rule.
#[derive(Debug, Clone, PartialEq)]
pub struct Limit {
    /// `name`, which other limits' `replaces` refer to.
    pub name: Option<String>,
    /// Its name in the answers' `RateLimit-Policy` and `RateLimit` headers:
    /// `name`, or without one the path of its rule's keys, `key` or
    /// `key_value` per level (the value as the config writes it, never a
    /// request's) joined by `.` as envoyproxy/ratelimit's stat keys are
    /// (`remote_address`, `path_/files/*.method_GET`), then `#j` for the
    /// j-th of several unnamed limits of the rule; then `#n` (counting on)
    /// should that still be the name of another limit of the domain.
    pub header_name: String,
    /// The names of the limits dropped when this one applies.
    pub replaces: Vec<String>,
    /// `requests_per_unit` as written (may be 0: refuses everything; 0 when
    /// missing, as envoyproxy/ratelimit reads it, with a warning).
    pub requests_per_unit: u64,
    /// The unit if one was given (the answer's `current_limit` needs it);
    /// `None` when `window` was used.
    pub unit: Option<Unit>,
    /// The window: the unit's length, or `window`.
    pub window: Duration,
    /// The algorithm and its parameters.
    pub algorithm: Algorithm,
    /// `None` when `requests_per_unit` is 0 ([`Policy`] needs a limit of at
    /// least 1); such a limit refuses everything.
    pub policy: Option<Policy>,
    /// The policy as stores keep it (its tag made once, at load).
    pub quota: Option<slidegate_store::Quota>,
}

/// The `unit` of a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// One second.
    Second,
    /// 60 seconds.
    Minute,
    /// 3600 seconds.
    Hour,
    /// 86 400 seconds.
    Day,
    /// 7 days.
    Week,
    /// 30 days.
    Month,
    /// 365 days.
    Year,
}

impl Unit {
    /// Every unit, shortest first.
    pub const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

    /// Its length: a month is 30 days, a year 365 days, a week 7 days.
    pub fn duration(self) -> Duration {
        const DAY: u64 = 86_400;
        Duration::from_secs(match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => DAY,
            Unit::Week => 7 * DAY,
            Unit::Month => 30 * DAY,
            Unit::Year => 365 * DAY,
        })
    }

    /// The name in the YAML, lower case: `second`, `minute`…
    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }

    /// The unit called `name`, in any case.
    pub fn from_name(name: &str) -> Option<Unit> {
        Unit::ALL.into_iter().find(|u| u.name().eq_ignore_ascii_case(name))
    }
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A request descriptor matched against a domain.
#[derive(Clone, Copy)]
pub struct Match<'a> {
    /// The rule at the depth of the descriptor's last entry.
    pub rule: &'a Rule,
    /// The domain's top-level rules, to find the patterns of shared levels.
    root: &'a [Rule],
    /// The domain's index of its larger levels.
    levels: &'a HashMap<usize, Level>,
    /// Bit `i`: entry `i` was matched by a wildcard with `share_threshold`.
    shared: u64,
}

impl fmt::Debug for Match<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Match")
            .field("rule", self.rule)
            .field("shared", &format_args!("{:#b}", self.shared))
            .finish()
    }
}

impl Match<'_> {
    /// The counter key: unique per domain and every (key, value) of the
    /// request's `entries` (those given to [`Domain::find`]), except that at
    /// a level matched by a wildcard rule with `share_threshold` the value
    /// is replaced by the pattern, so that all its values share one counter.
    ///
    /// Every part is written as its length in bytes, a separator and the
    /// text (`:` for names and values, `*` for a shared pattern), so
    /// different descriptors never give the same key. The key does not tell
    /// the limits of a rule apart.
    pub fn counter_key(&self, domain: &str, entries: &[(&str, &str)]) -> String {
        let capacity = entries.iter().map(|(k, v)| k.len() + v.len() + 8).sum::<usize>();
        let mut out = String::with_capacity(domain.len() + 4 + capacity);
        push_part(&mut out, ':', domain);
        let mut rules = self.root;
        for (level, &(key, value)) in entries.iter().enumerate() {
            push_part(&mut out, ':', key);
            if self.shared == 0 {
                push_part(&mut out, ':', value);
                continue;
            }
            let step = step(rules, key, value, self.levels.get(&(rules.as_ptr() as usize)));
            match step {
                Some((rule, true)) if level < 64 && self.shared & (1 << level) != 0 => {
                    let pattern = rule.value.as_ref().map_or(value, ValuePattern::as_str);
                    push_part(&mut out, '*', pattern);
                }
                _ => push_part(&mut out, ':', value),
            }
            rules = step.map_or(&[], |(rule, _)| rule.children.as_slice());
        }
        out
    }
}

impl Match<'_> {
    /// The rule's name in the metrics: envoyproxy/ratelimit's stat key
    /// (`RateLimitStats.Key`, built in `GetLimit`) without its leading
    /// `domain.`. One part per entry, joined by `.`, each the entry's key,
    /// then `_` and a value when there is one:
    ///
    /// - Without `detailed_metric` on the matched rule, a level shows what
    ///   the config says: an exact rule its value; a wildcard rule its
    ///   pattern (`path_/files/*`), or the request's value if the rule has
    ///   `value_to_metric` and not `share_threshold`; a rule with the key
    ///   alone nothing, or the request's value with `value_to_metric`. An
    ///   empty value shown adds no `_` (`route`, not `route_`).
    /// - With `detailed_metric` on the matched rule (the last level's),
    ///   every level shows the request's value, `_` included even when the
    ///   value is empty (`route_`), and `value_to_metric` is ignored…
    /// - …unless some level was matched by a wildcard with
    ///   `share_threshold`: then those levels show the pattern
    ///   (`service_svc/*`) and the others the request's value, with no `_`
    ///   for an empty value.
    ///
    /// A request value equal to a wildcard rule's pattern is, for
    /// envoyproxy/ratelimit, an exact match (its exact lookup comes
    /// first), so such a level is not a shared one here either.
    ///
    /// Without `detailed_metric` and `value_to_metric` the name comes from
    /// the config alone, so clients cannot grow the label set. The name is
    /// the key before envoyproxy/ratelimit sanitizes it into a stat name
    /// ([`crate::metrics::stat_name`]).
    pub fn metric_key(&self, entries: &[(&str, &str)]) -> String {
        let capacity = entries.iter().map(|(k, v)| k.len() + v.len() + 2).sum::<usize>();
        let mut out = String::with_capacity(capacity);
        let detailed = self.rule.detailed_metric;
        let any_shared =
            detailed && metric_levels(self.root, self.levels, entries).any(|l| shared_pattern(l).is_some());
        for (i, (&(key, value), level)) in entries
            .iter()
            .zip(metric_levels(self.root, self.levels, entries))
            .enumerate()
        {
            if i > 0 {
                out.push('.');
            }
            out.push_str(key);
            // What follows the key, and whether the `_` is written even
            // before an empty value.
            let (shown, always) = if detailed && !any_shared {
                // `detailedMetricFullKey`: `key_value`, always with the `_`.
                (value, true)
            } else if detailed {
                // The share_threshold form of the detailed key.
                (shared_pattern(level).unwrap_or(value), false)
            } else {
                // `valueToMetricFullKey`.
                let shown = match level {
                    Some(MetricLevel { rule, wildcard: true }) => match shared_pattern(level) {
                        Some(pattern) => pattern,
                        None if rule.value_to_metric => value,
                        None => rule.value.as_ref().map_or(value, ValuePattern::as_str),
                    },
                    // An exact value (the same text), or the key alone.
                    Some(MetricLevel { rule, wildcard: false }) if rule.value.is_some() || rule.value_to_metric => {
                        value
                    }
                    Some(_) | None => "",
                };
                (shown, false)
            };
            if always || !shown.is_empty() {
                out.push('_');
                out.push_str(shown);
            }
        }
        out
    }

    /// The metric name of a descriptor whose `limit` override replaces the
    /// configured limits: envoyproxy/ratelimit names its stats after the
    /// request alone (`descriptorKey`), `key_value` per entry (`key` for an
    /// empty value) joined by `.`, whatever rule matched, and even when
    /// none did.
    pub fn override_metric_key(entries: &[(&str, &str)]) -> String {
        let capacity = entries.iter().map(|(k, v)| k.len() + v.len() + 2).sum::<usize>();
        let mut out = String::with_capacity(capacity);
        for (i, &(key, value)) in entries.iter().enumerate() {
            if i > 0 {
                out.push('.');
            }
            out.push_str(key);
            if !value.is_empty() {
                out.push('_');
                out.push_str(value);
            }
        }
        out
    }
}

/// How one entry of a descriptor was matched, as the metric name needs it.
#[derive(Clone, Copy)]
struct MetricLevel<'a> {
    /// The rule of the level.
    rule: &'a Rule,
    /// Matched as a wildcard. A value that is the pattern as written is
    /// not: envoyproxy/ratelimit's exact lookup of `key_value` finds the
    /// rule first.
    wildcard: bool,
}

/// The rule of each entry along the walk of [`Domain::find`] (`None` from
/// a level the walk cannot step, which a [`Match`] never has).
fn metric_levels<'a>(
    root: &'a [Rule],
    levels: &'a HashMap<usize, Level>,
    entries: &'a [(&str, &str)],
) -> impl Iterator<Item = Option<MetricLevel<'a>>> {
    entries.iter().scan(root, |rules, &(key, value)| {
        let level =
            step(rules, key, value, levels.get(&(rules.as_ptr() as usize))).map(|(rule, wildcard)| MetricLevel {
                rule,
                wildcard: wildcard && rule.value.as_ref().is_none_or(|p| p.as_str() != value),
            });
        *rules = level.map_or(&[], |l| l.rule.children.as_slice());
        Some(level)
    })
}

/// The pattern a level shows when a wildcard with `share_threshold`
/// matched it.
fn shared_pattern(level: Option<MetricLevel<'_>>) -> Option<&str> {
    match level {
        Some(MetricLevel { rule, wildcard: true }) if rule.share_threshold => {
            rule.value.as_ref().map(ValuePattern::as_str)
        }
        _ => None,
    }
}

fn push_part(out: &mut String, separator: char, text: &str) {
    out.push_str(itoa::Buffer::new().format(text.len()));
    out.push(separator);
    out.push_str(text);
}

/// The rule among `rules` for one entry: the exact `key`+`value` rule, else
/// the first wildcard (in file order) that matches `value`, else the rule
/// with the key alone. The flag tells a wildcard match.
fn step<'a>(rules: &'a [Rule], key: &str, value: &str, level: Option<&Level>) -> Option<(&'a Rule, bool)> {
    if let Some(level) = level.filter(|l| l.len == rules.len()) {
        let under = level.by_key.get(key)?;
        if let Some(&i) = under.exact.get(value) {
            return rules.get(i).map(|r| (r, false));
        }
        let mut key_only = None;
        for rule in under.rest.iter().filter_map(|&i| rules.get(i)) {
            match &rule.value {
                Some(pattern) if pattern.matches(value) => return Some((rule, true)),
                Some(_) => {}
                None => key_only = key_only.or(Some(rule)),
            }
        }
        return key_only.map(|r| (r, false));
    }
    let mut wildcard = None;
    let mut key_only = None;
    for rule in rules.iter().filter(|r| r.key == key) {
        match &rule.value {
            Some(ValuePattern::Exact(exact)) => {
                if exact == value {
                    return Some((rule, false));
                }
            }
            Some(pattern @ ValuePattern::Wildcard(_)) => {
                if wildcard.is_none() && pattern.matches(value) {
                    wildcard = Some(rule);
                }
            }
            None => {
                if key_only.is_none() {
                    key_only = Some(rule);
                }
            }
        }
    }
    wildcard.map(|r| (r, true)).or(key_only.map(|r| (r, false)))
}

impl Domain {
    /// A domain of these rules, without quota rules
    /// ([`Domain::with_quota_rules`] adds them). Its larger levels are
    /// indexed by the first [`Domain::find`]: the rules are not to change
    /// after it.
    pub fn new(name: String, rules: Vec<Rule>) -> Domain {
        Domain {
            name,
            rules,
            quota_rules: Vec::new(),
            index: Index::default(),
        }
    }

    /// Makes the index [`Domain::find`] uses now, rather than on the
    /// first request (at load, off the request path).
    fn index_now(&self) {
        self.index.levels(&self.rules);
    }

    /// Matches a request descriptor: walks the rule tree one level per
    /// entry; at each level an exact key+value rule wins, then a wildcard
    /// value rule (the first in file order that matches), then a rule with
    /// the key alone. The match must use all entries (a two-entry
    /// descriptor only matches a rule at depth two), and it does not go
    /// back to try another rule of a level. `None` if nothing matches or
    /// there are no entries.
    ///
    /// As in envoyproxy/ratelimit, a matched rule may have no limits (a
    /// rule without `rate_limit`): the descriptor is then not limited.
    pub fn find<'a>(&'a self, entries: &[(&str, &str)]) -> Option<Match<'a>> {
        if entries.len() > MAX_DEPTH {
            return None;
        }
        let levels = self.index.levels(&self.rules);
        let mut rules = self.rules.as_slice();
        let mut shared = 0u64;
        let mut found = None;
        for (level, &(key, value)) in entries.iter().enumerate() {
            let indexed = levels.get(&(rules.as_ptr() as usize));
            let (rule, wildcard) = step(rules, key, value, indexed)?;
            if wildcard && rule.share_threshold {
                shared |= 1 << level;
            }
            found = Some(rule);
            rules = &rule.children;
        }
        found.map(|rule| Match {
            rule,
            root: &self.rules,
            levels,
            shared,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_algorithm_recounts_every_limit_and_keeps_the_rest() {
        let config = Config::parse(
            "a.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: minute, requests_per_unit: 3 }\n    \
             descriptors:\n      - key: n\n        rate_limits:\n          - { window: 10s, requests_per_unit: 2, \
             algorithm: gcra }\n          - { unit: hour, requests_per_unit: 0 }\n",
        )
        .unwrap();
        let log = config.with_algorithm(Algorithm::SlidingLog).unwrap();
        let domain = log.domain("d").unwrap();
        let top = &domain.rules[0].limits[0];
        let nested = &domain.rules[0].children[0].limits;
        let policy = |l: &Limit| l.policy.map(|p| (p.limit(), p.window(), p.algorithm()));
        assert_eq!(policy(top), Some((3, Duration::from_secs(60), Algorithm::SlidingLog)));
        assert_eq!(
            policy(&nested[0]),
            Some((2, Duration::from_secs(10), Algorithm::SlidingLog))
        );
        // A limit of 0 still refuses everything; units, names and the
        // quotas' identities follow the new algorithm.
        assert_eq!((nested[1].policy, nested[1].unit), (None, Some(Unit::Hour)));
        assert_eq!(
            top.quota.as_ref().map(|q| q.policy().algorithm()),
            Some(Algorithm::SlidingLog)
        );
        assert_ne!(top.quota, config.domain("d").unwrap().rules[0].limits[0].quota);
        // The original is untouched, and the copy matches as it does.
        assert_eq!(
            config.domain("d").unwrap().rules[0].children[0].limits[0].algorithm,
            Algorithm::Gcra { burst: 2 }
        );
        assert!(domain.find(&[("k", "x"), ("n", "y")]).is_some());
    }

    fn rule(key: &str, value: Option<&str>, children: Vec<Rule>) -> Rule {
        Rule {
            key: key.to_owned(),
            value: value.map(ValuePattern::new),
            children,
            ..Rule::at(0, 0)
        }
    }

    proptest::proptest! {
        /// The index finds what a scan of the level finds: exact values
        /// first, then the first wildcard that matches, then the key alone,
        /// on levels large enough to be indexed, nested too.
        #[test]
        fn the_index_finds_what_a_scan_finds(
            level in proptest::collection::vec((0..4u8, proptest::option::of(0..6u8)), INDEXED..60),
            lookups in proptest::collection::vec((0..5u8, 0..8u8), 1..40),
        ) {
            let values = ["a", "b", "ab", "*", "a*", "*b"];
            let rules: Vec<Rule> = level
                .iter()
                .map(|&(k, v)| rule(&format!("k{k}"), v.map(|v| values[usize::from(v)]), Vec::new()))
                .collect();
            // The same level again under a parent, to index a nested level.
            let domain = Domain::new("d".to_owned(), vec![rule("top", None, rules.clone())]);
            let flat = Domain::new("f".to_owned(), rules.clone());
            let asked = ["a", "b", "ab", "abb", "*", "", "ba", "x"];
            for (k, v) in lookups {
                let key = format!("k{k}");
                let value = asked[usize::from(v)];
                let scanned = step(&rules, &key, value, None).map(|(r, w)| (r.key.clone(), r.value.clone(), w));
                let found = flat.find(&[(&key, value)]).map(|m| (m.rule.key.clone(), m.rule.value.clone()));
                proptest::prop_assert_eq!(found, scanned.clone().map(|(k, v, _)| (k, v)));
                let nested = domain.find(&[("top", "t"), (&key, value)]).map(|m| (m.rule.key.clone(), m.rule.value.clone()));
                proptest::prop_assert_eq!(nested, scanned.map(|(k, v, _)| (k, v)));
            }
            let shown = format!("{:?}", flat.index);
            proptest::prop_assert!(shown.contains("1 levels"), "{}", shown);
        }
    }

    #[test]
    fn wildcards() {
        let cases = [
            ("*", "", true),
            ("*", "anything", true),
            ("a*", "a", true),
            ("a*", "ba", false),
            ("*a", "ba", true),
            ("*a", "ab", false),
            ("a*b", "ab", true),
            ("a*b", "axxb", true),
            ("a*b", "axxbc", false),
            ("a*a", "a", false),
            ("a*a", "aa", true),
            ("**", "x", true),
            ("/api/*/users/*", "/api/v1/users/7", true),
            ("/api/*/users/*", "/api/v1/groups/7", false),
            ("/api/*/users/*", "/api/v1/users/", true),
            ("*ab*ab*", "xabab", true),
            ("*ab*ab*", "xaab", false),
            ("*aab", "aaab", true),
            ("é*é", "éxé", true),
            ("é*é", "é", false),
        ];
        for (pattern, value, expected) in cases {
            assert_eq!(
                ValuePattern::new(pattern).matches(value),
                expected,
                "{pattern:?} against {value:?}"
            );
        }
        assert!(ValuePattern::new("a").matches("a"));
        assert!(!ValuePattern::new("a").matches("ab"));
        assert_eq!(ValuePattern::new("x*").as_str(), "x*");
    }

    #[test]
    fn wildcard_matches_is_the_naive_definition() {
        // Every pattern over {a, b, *} up to length 5 against every value
        // over {a, b} up to length 6, against a naive recursive matcher.
        fn naive(p: &[u8], v: &[u8]) -> bool {
            match p.split_first() {
                None => v.is_empty(),
                Some((b'*', rest)) => (0..=v.len()).any(|i| naive(rest, &v[i..])),
                Some((c, rest)) => v.first() == Some(c) && naive(rest, &v[1..]),
            }
        }
        fn all(alphabet: &[u8], max: usize) -> Vec<String> {
            let mut out = vec![String::new()];
            let mut layer = vec![String::new()];
            for _ in 0..max {
                layer = layer
                    .iter()
                    .flat_map(|s| alphabet.iter().map(move |&c| format!("{s}{}", c as char)))
                    .collect();
                out.extend(layer.iter().cloned());
            }
            out
        }
        let values = all(b"ab", 6);
        for p in all(b"ab*", 5) {
            for v in &values {
                assert_eq!(
                    wildcard_matches(&p, v),
                    naive(p.as_bytes(), v.as_bytes()),
                    "{p:?} {v:?}"
                );
            }
        }
    }

    #[test]
    fn precedence_and_depth() {
        let domain = Domain::new(
            "d".to_owned(),
            vec![
                rule("k", None, vec![]),
                rule("k", Some("a*"), vec![rule("n", None, vec![])]),
                rule("k", Some("ab"), vec![]),
                rule("k", Some("*b"), vec![]),
            ],
        );
        let at = |entries: &[(&str, &str)]| domain.find(entries).map(|m| (m.rule.key.clone(), m.rule.value.clone()));
        assert_eq!(at(&[("k", "ab")]).unwrap().1, Some(ValuePattern::new("ab")));
        assert_eq!(at(&[("k", "axb")]).unwrap().1, Some(ValuePattern::new("a*")));
        assert_eq!(at(&[("k", "xb")]).unwrap().1, Some(ValuePattern::new("*b")));
        assert_eq!(at(&[("k", "zz")]).unwrap().1, None);
        assert_eq!(at(&[("k", "ax"), ("n", "1")]).unwrap().0, "n");
        // No going back: `ab` matched exactly, which has no children.
        assert!(at(&[("k", "ab"), ("n", "1")]).is_none());
        assert!(at(&[]).is_none());
        assert!(at(&[("other", "x")]).is_none());
    }

    #[test]
    fn counter_keys_are_unambiguous() {
        let mut shared = rule("p", Some("/f/*"), vec![rule("q", None, vec![])]);
        shared.share_threshold = true;
        let domain = Domain::new(
            "d".to_owned(),
            vec![rule("a", None, vec![rule("b", None, vec![])]), shared],
        );
        let key = |entries: &[(&str, &str)]| domain.find(entries).unwrap().counter_key("d", entries);
        assert_eq!(key(&[("a", "x")]), "1:d1:a1:x");
        assert_ne!(key(&[("a", "x:1"), ("b", "y")]), key(&[("a", "x"), ("b", "1:y")]));
        assert_eq!(key(&[("p", "/f/1")]), key(&[("p", "/f/2")]));
        assert_eq!(key(&[("p", "/f/1")]), "1:d1:p4*/f/*");
        assert_ne!(key(&[("p", "/f/*")]), "1:d1:p4:/f/*");
        assert_eq!(key(&[("p", "/f/1"), ("q", "3")]), "1:d1:p4*/f/*1:q1:3");
        assert_ne!(key(&[("p", "/f/1"), ("q", "3")]), key(&[("p", "/f/1"), ("q", "4")]));
    }

    #[test]
    fn units() {
        for unit in Unit::ALL {
            assert_eq!(Unit::from_name(&unit.name().to_uppercase()), Some(unit));
        }
        assert_eq!(Unit::Month.duration(), Duration::from_secs(30 * 86_400));
        assert_eq!(Unit::Year.duration(), Duration::from_secs(365 * 86_400));
        assert_eq!(Unit::Week.duration(), Duration::from_secs(7 * 86_400));
        assert_eq!(Unit::from_name("fortnight"), None);
    }

    /// A fresh empty folder under the system's temporary one, removed when
    /// dropped.
    struct Folder(PathBuf);

    impl Folder {
        fn new(name: &str) -> Folder {
            static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
            let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let dir = std::env::temp_dir().join(format!("slidegate-config-{name}-{}-{n}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Folder(dir)
        }

        fn write(&self, name: &str, text: &str) -> PathBuf {
            let path = self.0.join(name);
            std::fs::write(&path, text).unwrap();
            path
        }
    }

    impl Drop for Folder {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    const LIMITED: &str = "domain: t\ndescriptors:\n  - key: k\n    rate_limit: { unit: hour, requests_per_unit: 5 }\n";

    #[test]
    fn a_folder_without_a_config_file_is_an_error_naming_it() {
        let empty = Folder::new("empty");
        let e = Config::load(std::slice::from_ref(&empty.0)).unwrap_err();
        assert_eq!(
            (e.file.as_str(), e.line, e.column, e.key.as_deref()),
            (empty.0.display().to_string().as_str(), 0, 0, None)
        );
        assert!(e.message.starts_with("no config file in this folder"), "{e}");
        // Files that are not configs do not count.
        empty.write("README.txt", "domain: x\n");
        empty.write(".hidden.yaml", LIMITED);
        std::fs::create_dir(empty.0.join("sub.yaml")).unwrap();
        assert!(Config::load(std::slice::from_ref(&empty.0)).is_err());
        // Every such folder is reported, beside the good paths.
        let good = Folder::new("good");
        let file = good.write("t.yaml", LIMITED);
        let other = Folder::new("other");
        let paths = [empty.0.clone(), file, other.0.clone()];
        let errors = Config::load_all(&paths, &LoadOptions::default()).unwrap_err();
        let files: Vec<&str> = errors.iter().map(|e| e.file.as_str()).collect();
        assert_eq!(files, [empty.0.display().to_string(), other.0.display().to_string()]);
        // Allowed, such a folder is no domain.
        let allowed = LoadOptions::default().allow_empty_folders(true);
        assert_eq!(Config::load_with(&paths, &allowed).unwrap().domains().count(), 1);
        // No path at all is no config, not an error: `serve` without one.
        assert_eq!(Config::load(&[]).unwrap().domains().count(), 0);
    }

    #[test]
    fn an_empty_file_is_an_error_naming_it() {
        let folder = Folder::new("empty-file");
        for text in ["", "\n\n", "# nothing yet\n", "\u{feff}"] {
            let file = folder.write("t.yaml", text);
            for path in [&folder.0, &file] {
                let e = Config::load(std::slice::from_ref(path)).unwrap_err();
                assert_eq!(e.file, file.display().to_string(), "{text:?}");
                assert!(e.message.starts_with("empty file"), "{text:?}: {e}");
            }
        }
    }

    /// A Kubernetes ConfigMap's folder: the files are symbolic links
    /// through `..data`, itself a link to the folder of the version in
    /// force; the dotted names are not configs.
    #[cfg(unix)]
    #[test]
    fn a_config_map_folder_loads_through_its_links() {
        let folder = Folder::new("config-map");
        std::fs::create_dir(folder.0.join("..v1")).unwrap();
        folder.write("..v1/t.yaml", LIMITED);
        std::os::unix::fs::symlink("..v1", folder.0.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/t.yaml", folder.0.join("t.yaml")).unwrap();
        let config = Config::load(std::slice::from_ref(&folder.0)).unwrap();
        let domains: Vec<&str> = config.domains().map(|d| d.name.as_str()).collect();
        assert_eq!(domains, ["t"]);
        assert_eq!(
            config.file_of("t"),
            Some(folder.0.join("t.yaml").display().to_string().as_str())
        );
    }

    /// A case of the reload rule: its name, the new config's files (name
    /// and text), and the file of the refusal (`None`: accepted).
    type ReloadCase<'a> = (&'a str, &'a [(&'a str, &'a str)], Option<&'a str>);

    #[test]
    fn the_reload_rule() {
        // A config of `files`, loaded from a folder of its own (none: no
        // domain).
        let config = |files: &[(&str, &str)]| {
            let folder = Folder::new("reload-rule");
            for (file, text) in files {
                folder.write(file, text);
            }
            let options = LoadOptions::default().allow_empty_folders(true);
            let mut config = Config::load_with(std::slice::from_ref(&folder.0), &options).unwrap();
            // The files by their names alone.
            let prefix = format!("{}/", folder.0.display());
            for sources in config.sources.values_mut() {
                for file in &mut sources.files {
                    *file = file.trim_start_matches(&prefix).to_owned();
                }
            }
            config
        };
        let other = "domain: o\ndescriptors:\n  - key: a\n    rate_limit: { unit: second, requests_per_unit: 1 }\n";
        let nested = "domain: t\ndescriptors:\n  - key: k\n    descriptors:\n      - key: n\n        rate_limit: { \
                      unit: hour, requests_per_unit: 5 }\n";
        let old = config(&[("t.yaml", LIMITED), ("o.yaml", other)]);
        let refused = |new: &[(&str, &str)]| Config::check_reload(&old, &config(new)).err();
        let cases: [ReloadCase<'_>; 8] = [
            ("unchanged", &[("t.yaml", LIMITED), ("o.yaml", other)], None),
            (
                "a limit lowered",
                &[("t.yaml", &LIMITED.replace('5', "1")), ("o.yaml", other)],
                None,
            ),
            ("a limit moved deeper", &[("t.yaml", nested), ("o.yaml", other)], None),
            ("a domain's file removed", &[("o.yaml", other)], None),
            (
                "unlimited on purpose",
                &[
                    (
                        "t.yaml",
                        "domain: t\ndescriptors:\n  - key: k\n    rate_limit: { unlimited: true }\n",
                    ),
                    ("o.yaml", other),
                ],
                None,
            ),
            (
                "half written",
                &[("t.yaml", "domain: t\n"), ("o.yaml", other)],
                Some("t.yaml"),
            ),
            (
                "descriptors without limits",
                &[("t.yaml", "domain: t\ndescriptors:\n  - key: k\n"), ("o.yaml", other)],
                Some("t.yaml"),
            ),
            ("every domain gone", &[], Some("<config>")),
        ];
        for (case, new, expected) in cases {
            let error = refused(new);
            assert_eq!(error.as_ref().map(|e| e.file.as_str()), expected, "{case}: {error:?}");
            if let Some(e) = error {
                assert!(e.message.starts_with("reload refused: "), "{case}: {e}");
                assert!(e.message.contains("--allow-empty-reload"), "{case}: {e}");
            }
        }
        let half = refused(&[("t.yaml", "domain: t\n"), ("o.yaml", "domain: o\n")]).unwrap();
        assert_eq!(
            half.to_string(),
            "o.yaml: reload refused: domain `o` would lose every limit (1 in force, none in the new file: emptied, \
             or caught half written) (and domain `t` alike); to serve it anyway, allow emptying reloads \
             (`--allow-empty-reload`)"
        );
        // A domain that limited nothing may go on limiting nothing; a first
        // config from nothing is no loss.
        let bare = config(&[("t.yaml", "domain: t\n")]);
        assert!(Config::check_reload(&bare, &bare).is_ok());
        assert!(Config::check_reload(&Config::default(), &bare).is_ok());
        assert!(Config::check_reload(&Config::default(), &Config::default()).is_ok());
    }

    #[test]
    fn display() {
        let mut e = ConfigError {
            file: "a.yaml".to_owned(),
            line: 3,
            column: 7,
            key: Some("rate_limit.unit".to_owned()),
            message: "bad".to_owned(),
        };
        assert_eq!(e.to_string(), "a.yaml:3:7: rate_limit.unit: bad");
        e.key = None;
        assert_eq!(e.to_string(), "a.yaml:3:7: bad");
    }
}

/// What a reload changes: the domains, the limits (by domain, descriptor
/// path and place in their rule) and the quota rules (by domain and name)
/// added, removed and changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigChanges {
    /// Domains in the new config only.
    pub domains_added: Vec<String>,
    /// Domains in the old config only.
    pub domains_removed: Vec<String>,
    /// Limits in the new config only, as `domain: path [j]`.
    pub limits_added: Vec<String>,
    /// Limits in the old config only.
    pub limits_removed: Vec<String>,
    /// Limits in both whose policy, name or `replaces` differ.
    pub limits_changed: Vec<String>,
    /// Quota rules in the new config only, as `domain: name`.
    pub quota_rules_added: Vec<String>,
    /// Quota rules in the old config only.
    pub quota_rules_removed: Vec<String>,
    /// Quota rules in both whose bucket id patterns, `absent` keys, limit
    /// or place in the domain's list differ.
    pub quota_rules_changed: Vec<String>,
}

impl ConfigChanges {
    /// The changes from `old` to `new`.
    pub fn between(old: &Config, new: &Config) -> ConfigChanges {
        let limits = |config: &Config| {
            let mut out = BTreeMap::new();
            for domain in config.domains() {
                collect_limits(&domain.name, &domain.rules, &mut Vec::new(), &mut out);
            }
            out
        };
        let (before, after) = (limits(old), limits(new));
        let names = |config: &Config| {
            config
                .domains()
                .map(|d| d.name.clone())
                .collect::<std::collections::BTreeSet<_>>()
        };
        let (old_domains, new_domains) = (names(old), names(new));
        let (limits_added, limits_removed, limits_changed) = diff(&before, &after);
        let (quota_before, quota_after) = (quota_shapes(old), quota_shapes(new));
        let (quota_rules_added, quota_rules_removed, quota_rules_changed) = diff(&quota_before, &quota_after);
        ConfigChanges {
            domains_added: new_domains.difference(&old_domains).cloned().collect(),
            domains_removed: old_domains.difference(&new_domains).cloned().collect(),
            limits_added,
            limits_removed,
            limits_changed,
            quota_rules_added,
            quota_rules_removed,
            quota_rules_changed,
        }
    }

    /// Nothing changed.
    pub fn is_empty(&self) -> bool {
        *self == ConfigChanges::default()
    }
}

impl fmt::Display for ConfigChanges {
    /// `+2 domains (a, b), -1 limit (d: k [0]), ~1 limit (...)`; at most five
    /// names per kind.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (sign, what, list) in [
            ("+", "domain", &self.domains_added),
            ("-", "domain", &self.domains_removed),
            ("+", "limit", &self.limits_added),
            ("-", "limit", &self.limits_removed),
            ("~", "limit", &self.limits_changed),
            ("+", "quota rule", &self.quota_rules_added),
            ("-", "quota rule", &self.quota_rules_removed),
            ("~", "quota rule", &self.quota_rules_changed),
        ] {
            if list.is_empty() {
                continue;
            }
            if !first {
                f.write_str(", ")?;
            }
            first = false;
            let plural = if list.len() == 1 { "" } else { "s" };
            let shown: Vec<&str> = list.iter().take(5).map(String::as_str).collect();
            let more = if list.len() > 5 { ", ..." } else { "" };
            write!(f, "{sign}{} {what}{plural} ({}{more})", list.len(), shown.join(", "))?;
        }
        if first {
            f.write_str("no change")?;
        }
        Ok(())
    }
}

/// What a quota rule's change is judged by: its place in its domain's
/// list (the first match wins), its bucket id patterns, its `absent` keys,
/// and its limit's policy and `requests_per_unit` (`None`: unlimited).
type QuotaShape = (
    usize,
    Vec<(String, ValuePattern)>,
    Vec<String>,
    Option<(Option<Policy>, u64)>,
);

/// Every quota rule of `config`, by `domain: name`.
fn quota_shapes(config: &Config) -> BTreeMap<String, QuotaShape> {
    let mut out = BTreeMap::new();
    for domain in config.domains() {
        for (i, rule) in domain.quota_rules.iter().enumerate() {
            let limit = rule.limit.as_ref().map(|l| (l.policy, l.requests_per_unit));
            out.insert(
                format!("{}: {}", domain.name, rule.name),
                (i, rule.bucket_id.clone(), rule.absent.clone(), limit),
            );
        }
    }
    out
}

/// The keys only in `after`, only in `before`, and in both with another
/// value, each in order.
fn diff<V: PartialEq>(
    before: &BTreeMap<String, V>,
    after: &BTreeMap<String, V>,
) -> (Vec<String>, Vec<String>, Vec<String>) {
    let added = after.keys().filter(|k| !before.contains_key(*k)).cloned().collect();
    let removed = before.keys().filter(|k| !after.contains_key(*k)).cloned().collect();
    let changed = after
        .iter()
        .filter(|(k, v)| before.get(*k).is_some_and(|old| old != *v))
        .map(|(k, _)| k.clone())
        .collect();
    (added, removed, changed)
}

/// What a limit's change is judged by: its policy, `requests_per_unit`,
/// name, `replaces`, and its rule's `unlimited`.
type LimitShape = (Option<Policy>, u64, Option<String>, Vec<String>, bool);

/// Every limit of `rules` under `domain`, by `domain: path [j]`, with what
/// a change of it means.
fn collect_limits(domain: &str, rules: &[Rule], path: &mut Vec<String>, out: &mut BTreeMap<String, LimitShape>) {
    for rule in rules {
        path.push(match &rule.value {
            Some(value) => format!("{}={}", rule.key, value.as_str()),
            None => rule.key.clone(),
        });
        for (j, l) in rule.limits.iter().enumerate() {
            out.insert(
                format!("{domain}: {} [{j}]", path.join(" > ")),
                (
                    l.policy,
                    l.requests_per_unit,
                    l.name.clone(),
                    l.replaces.clone(),
                    rule.unlimited,
                ),
            );
        }
        collect_limits(domain, &rule.children, path, out);
        path.pop();
    }
}
