//! `slidegate simulate --config`: the what-if replay. Every line of an
//! access log becomes a rate limit request (its descriptors built from the
//! line's fields) decided by the service's own config matching and engine,
//! on a manual clock set to the line's time; per rule, what the config
//! would have refused, whom, and from when, beside the same rules counted
//! by the exact sliding log and by a fixed window of the same length.
//!
//! The replay streams: what it keeps is the engines' bounded stores, a
//! bounded table of the keys refused most per rule, and refusals per
//! interval (at most [`MAX_INTERVALS`] of them, widened as the log goes
//! on), whatever the log's length.

use anyhow::{Context, Result, bail};
use futures_util::FutureExt;
use serde::Serialize;
use slidegate_core::{Algorithm, ManualClock};
use slidegate_memory::Budget;
use slidegate_server::config::{Config, LoadOptions};
use slidegate_server::engine::{Code, Descriptor, Engine, EngineError, InputLimits, Request};
use slidegate_sim::{Reorder, ReorderOptions};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

/// How many keys refused most a rule's report names.
pub(crate) const TOP: usize = 10;

/// How many refused keys a rule's table keeps exactly before it starts
/// dropping the least refused (then the counts are bounds, and say so).
const TRACKED_KEYS: usize = 4096;

/// The most intervals of the refusals-over-time series; past it, two
/// neighbours merge and the interval doubles.
pub(crate) const MAX_INTERVALS: usize = 1024;

/// The sliding windows' store of the views that count no sliding window.
const UNUSED_STORE_BYTES: usize = 64 << 10;

/// The first interval of the refusals-over-time series.
const FIRST_INTERVAL_NS: u64 = 1_000_000_000;

/// Where a descriptor entry's value comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    /// A field of the log line.
    Field(String),
    /// This text, on every request.
    Literal(String),
}

/// One descriptor entry of `--descriptor`: `KEY=FIELD` or
/// `KEY=literal:TEXT`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct EntrySpec {
    /// The entry's key.
    pub(crate) key: String,
    /// Its value's source.
    pub(crate) source: Source,
}

impl std::str::FromStr for EntrySpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let Some((key, value)) = s.split_once('=') else {
            return Err(format!(
                "`{s}` is not KEY=FIELD (a log field as the entry's value) or KEY=literal:TEXT (a fixed value)"
            ));
        };
        if key.is_empty() {
            return Err(format!("`{s}` has no key before `=`"));
        }
        let source = match value.strip_prefix("literal:") {
            Some("") => return Err(format!("`{s}`: the literal value is empty")),
            Some(text) => Source::Literal(text.to_owned()),
            None if value.is_empty() => return Err(format!("`{s}` names no field after `=`")),
            None => Source::Field(value.to_owned()),
        };
        Ok(EntrySpec {
            key: key.to_owned(),
            source,
        })
    }
}

/// A log line's fields, by name.
pub(crate) trait Fields {
    /// The field called `name`, if the line has it.
    fn field(&self, name: &str) -> Option<Cow<'_, str>>;
}

impl Fields for [(&str, &str)] {
    fn field(&self, name: &str) -> Option<Cow<'_, str>> {
        self.iter().find(|(n, _)| *n == name).map(|(_, v)| Cow::Borrowed(*v))
    }
}

impl Setup {
    /// The log fields the descriptors read, each once, in order.
    pub(crate) fn fields(&self) -> Vec<&str> {
        let mut names: Vec<&str> = Vec::new();
        for entry in self.descriptors.iter().flatten() {
            if let Source::Field(name) = &entry.source
                && !names.contains(&name.as_str())
            {
                names.push(name);
            }
        }
        names
    }

    /// The descriptors as given, `[key=field key=literal:text]` each.
    pub(crate) fn describe(&self) -> String {
        let list: Vec<String> = self
            .descriptors
            .iter()
            .map(|d| {
                let entries: Vec<String> = d
                    .iter()
                    .map(|e| match &e.source {
                        Source::Field(f) => format!("{}={f}", e.key),
                        Source::Literal(t) => format!("{}=literal:{t}", e.key),
                    })
                    .collect();
                format!("[{}]", entries.join(" "))
            })
            .collect();
        list.join(" ")
    }
}

/// What a what-if replay needs besides the log.
#[derive(Clone, Debug)]
pub(crate) struct Setup {
    /// The config files (or directories), as `serve --config` takes them.
    pub(crate) config: Vec<PathBuf>,
    /// The domain of every request.
    pub(crate) domain: String,
    /// The descriptors of every request, each a list of entries.
    pub(crate) descriptors: Vec<Vec<EntrySpec>>,
    /// Memory of each engine's store (and of its other algorithms' store).
    pub(crate) memory_bytes: usize,
    /// How lines are put in time order.
    pub(crate) order: ReorderOptions,
}

/// One of the three ways the rules are counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum View {
    /// Each limit's algorithm as the config says.
    AsConfigured,
    /// Every limit as the exact sliding log.
    SlidingLog,
    /// Every limit as a fixed window of the same length.
    FixedWindow,
}

impl View {
    pub(crate) const ALL: [View; 3] = [View::AsConfigured, View::SlidingLog, View::FixedWindow];

    /// The view's name in the reports.
    pub(crate) fn name(self) -> &'static str {
        match self {
            View::AsConfigured => "as configured",
            View::SlidingLog => "sliding_log (exact)",
            View::FixedWindow => "fixed_window",
        }
    }
}

/// A bounded table of the keys refused most: exact while it has room;
/// once full, the least refused half is dropped, and a key seen again
/// starts from the most any dropped key had, so that every count kept is
/// at least the key's true count and at most `error` above it.
#[derive(Clone, Debug, Default)]
struct TopKeys {
    counts: HashMap<String, (u64, u64)>,
    /// The most refusals a dropped key had.
    dropped_max: u64,
}

impl TopKeys {
    fn add(&mut self, key: &str) {
        if let Some((count, _)) = self.counts.get_mut(key) {
            *count += 1;
            return;
        }
        if self.counts.len() >= TRACKED_KEYS {
            let mut all: Vec<u64> = self.counts.values().map(|&(c, _)| c).collect();
            let mid = all.len() / 2;
            let (_, &mut cut, _) = all.select_nth_unstable(mid);
            let mut dropped = 0;
            self.counts.retain(|_, &mut (count, _)| {
                let keep = count > cut || (count == cut && dropped >= mid);
                if !keep {
                    dropped += 1;
                }
                keep
            });
            self.dropped_max = self.dropped_max.max(cut);
        }
        self.counts
            .insert(key.to_owned(), (self.dropped_max + 1, self.dropped_max));
    }

    /// The `n` keys refused most, most first (ties by key).
    fn top(&self, n: usize) -> Vec<Refused> {
        let mut all: Vec<Refused> = self
            .counts
            .iter()
            .map(|(key, &(count, error))| Refused {
                key: key.clone(),
                refused: count,
                at_most_over: error,
            })
            .collect();
        all.sort_by(|a, b| b.refused.cmp(&a.refused).then_with(|| a.key.cmp(&b.key)));
        all.truncate(n);
        all
    }
}

/// One key among those refused most.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Refused {
    /// The descriptor's entries, `key=value` joined by `,`.
    pub(crate) key: String,
    /// Its refusals (exact when `at_most_over` is 0).
    pub(crate) refused: u64,
    /// How much `refused` may be above the true count (0: exact).
    pub(crate) at_most_over: u64,
}

/// Refusals per interval of log time, the interval doubling (neighbours
/// merged) whenever the series would pass [`MAX_INTERVALS`].
#[derive(Clone, Debug)]
pub(crate) struct Series {
    pub(crate) interval_ns: u64,
    pub(crate) counts: Vec<u64>,
}

impl Default for Series {
    fn default() -> Self {
        Series {
            interval_ns: FIRST_INTERVAL_NS,
            counts: Vec::new(),
        }
    }
}

impl Series {
    /// Notes `n` at `t_ns` (log time since the first line); `n` = 0 only
    /// makes the series reach `t_ns`.
    fn add(&mut self, t_ns: u64, n: u64) {
        let mut i = t_ns / self.interval_ns;
        while i >= MAX_INTERVALS as u64 {
            self.counts = self.counts.chunks(2).map(|pair| pair.iter().sum()).collect();
            self.interval_ns = self.interval_ns.saturating_mul(2);
            i = t_ns / self.interval_ns;
        }
        let i = i as usize;
        if self.counts.len() <= i {
            self.counts.resize(i + 1, 0);
        }
        self.counts[i] += n;
    }

    /// The series widened to `interval_ns` (a multiple of its own) and
    /// padded with zeros to at least `len` intervals, so that the series of
    /// one replay line up.
    pub(crate) fn aligned(&self, interval_ns: u64, len: usize) -> Vec<u64> {
        let per = (interval_ns / self.interval_ns.max(1)).max(1) as usize;
        let mut out: Vec<u64> = self.counts.chunks(per).map(|c| c.iter().sum()).collect();
        if out.len() < len {
            out.resize(len, 0);
        }
        out
    }
}

/// One rule's figures in one view.
#[derive(Clone, Debug, Default)]
struct RuleFigures {
    matched: u64,
    refused: u64,
    first_refusal_ns: Option<u64>,
    top: TopKeys,
    series: Series,
}

/// One view: its engine and the figures of every rule it matched.
struct ViewState {
    view: View,
    engine: Engine,
    rules: BTreeMap<String, RuleFigures>,
}

/// A rule as the reports name it.
#[derive(Clone, Debug, Default)]
struct RuleInfo {
    /// Its limits as configured, e.g. `10 per minute (sliding_window n=8 conservative)`.
    limits: String,
    /// The algorithms of its limits, each once, e.g. `sliding_window n=8 conservative`.
    algorithms: String,
}

/// The replay under way: feed it lines with [`Replay::line`], then take
/// the [`Report`] with [`Replay::finish`]. Lines are put in time order by
/// a bounded reorder buffer, then decided.
pub(crate) struct Replay {
    order: Reorder<Held>,
    horizon_ns: u64,
    /// The fields the descriptors read, in the order of [`Held`].
    fields: Vec<String>,
    decider: Decider,
}

/// A line held for time order: the values of [`Replay::fields`] it has.
type Held = Vec<Option<Box<str>>>;

/// A held line's fields by name.
struct HeldFields<'a> {
    names: &'a [String],
    values: &'a [Option<Box<str>>],
}

impl Fields for HeldFields<'_> {
    fn field(&self, name: &str) -> Option<Cow<'_, str>> {
        let i = self.names.iter().position(|n| n == name)?;
        self.values.get(i)?.as_deref().map(Cow::Borrowed)
    }
}

impl Replay {
    /// A replay of `setup`'s config.
    ///
    /// # Errors
    ///
    /// Those of [`Decider::new`].
    pub(crate) fn new(setup: &Setup) -> Result<Replay> {
        Ok(Replay {
            order: Reorder::new(setup.order),
            horizon_ns: setup.order.horizon_ns,
            fields: setup.fields().into_iter().map(str::to_owned).collect(),
            decider: Decider::new(setup)?,
        })
    }

    /// Takes one log line at `time_unix_ns`: it is decided once no
    /// earlier line can come within the reorder horizon (see
    /// [`Reorder`]); a line that comes later than that is decided at the
    /// latest time decided, and counted.
    pub(crate) fn line(&mut self, time_unix_ns: i64, fields: &(impl Fields + ?Sized)) {
        let held: Held = self
            .fields
            .iter()
            .map(|name| fields.field(name).map(|v| Box::from(v.as_ref())))
            .collect();
        self.decider.lines += 1;
        let (names, decider) = (&self.fields, &mut self.decider);
        self.order.push(time_unix_ns, held, &mut |t, held| {
            decider.decide(t, &HeldFields { names, values: &held });
        });
    }

    /// Decides the lines still held and gives the figures.
    pub(crate) fn finish(mut self) -> Report {
        let (names, decider) = (&self.fields, &mut self.decider);
        self.order.finish(&mut |t, held| {
            decider.decide(t, &HeldFields { names, values: &held });
        });
        let mut report = self.decider.report();
        report.out_of_order = self.order.late();
        report.most_late_ns = self.order.max_lateness_ns();
        report.horizon_ns = self.horizon_ns;
        report
    }
}

/// Decides lines in time order: the three views' engines and figures.
struct Decider {
    runtime: tokio::runtime::Runtime,
    clock: ManualClock,
    domain: String,
    descriptors: Vec<Vec<EntrySpec>>,
    views: Vec<ViewState>,
    info: BTreeMap<String, RuleInfo>,
    /// The first line's time, in ns since the Unix epoch.
    start_ns: Option<u64>,
    /// The latest line time so far, in ns since the Unix epoch.
    latest_ns: u64,
    lines: u64,
    requests: u64,
    missing: BTreeMap<String, u64>,
    no_descriptor: u64,
    invalid: u64,
    first_invalid: Option<String>,
}

impl Decider {
    /// A decider of `setup`'s config.
    ///
    /// # Errors
    ///
    /// The config's errors (file, line, column), a domain it does not
    /// have (naming those it has), or descriptor entries of no field.
    fn new(setup: &Setup) -> Result<Decider> {
        let config = Config::load_with(&setup.config, &LoadOptions::default()).map_err(|e| anyhow::anyhow!("{e}"))?;
        if config.domain(&setup.domain).is_none() {
            let names: Vec<&str> = config.domains().map(|d| d.name.as_str()).collect();
            bail!(
                "domain `{}` is not in the config: it has {}",
                setup.domain,
                if names.is_empty() {
                    "no domains".to_owned()
                } else {
                    names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
                }
            );
        }
        if setup.descriptors.iter().all(Vec::is_empty) {
            bail!("no descriptor: give its entries with --descriptor KEY=FIELD");
        }
        let clock = ManualClock::new(0);
        let budget = Budget::bytes(setup.memory_bytes);
        // The views that count every limit as a sliding log or a fixed
        // window keep nothing in the sliding windows' store.
        let unused = Budget::bytes(UNUSED_STORE_BYTES);
        // A log's fields may be longer than a proxy sends; the engine
        // still refuses what serve would (see `invalid`).
        let limits = InputLimits::default();
        let mut views = Vec::new();
        for view in View::ALL {
            let config = match view {
                View::AsConfigured => Ok(config.clone()),
                View::SlidingLog => config.with_algorithm(Algorithm::SlidingLog),
                View::FixedWindow => config.with_algorithm(Algorithm::FixedWindow),
            }
            .map_err(|e| anyhow::anyhow!("{e}"))?;
            views.push(ViewState {
                view,
                engine: match view {
                    View::AsConfigured => Engine::new(config, clock.clone(), budget, budget, limits),
                    View::SlidingLog | View::FixedWindow => Engine::new(config, clock.clone(), unused, budget, limits),
                },
                rules: BTreeMap::new(),
            });
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .context("starting the replay's runtime")?;
        Ok(Decider {
            runtime,
            clock,
            domain: setup.domain.clone(),
            descriptors: setup.descriptors.clone(),
            views,
            info: BTreeMap::new(),
            start_ns: None,
            latest_ns: 0,
            lines: 0,
            requests: 0,
            missing: BTreeMap::new(),
            no_descriptor: 0,
            invalid: 0,
            first_invalid: None,
        })
    }

    /// Decides one log line at `time_unix_ns` (lines come in time order;
    /// one earlier than the latest is decided at the latest, so that the
    /// clock never goes back). A descriptor an entry of which has no value
    /// on the line (the field missing, empty or `-`, as logs write an
    /// absent value) is left out of the request, as Envoy leaves out a
    /// descriptor it cannot fill; a line left with no descriptor sends no
    /// request.
    fn decide(&mut self, time_unix_ns: i64, fields: &(impl Fields + ?Sized)) {
        // The clock shows Unix time, so that fixed windows start on the
        // minute, as envoyproxy/ratelimit's do (a time before 1970 reads
        // as 1970).
        let t = u64::try_from(time_unix_ns).unwrap_or(0);
        let start = *self.start_ns.get_or_insert(t);
        self.latest_ns = self.latest_ns.max(t);
        let now = self.latest_ns;
        self.clock.set(now);
        let since_start = now - start;

        let mut request = Request {
            domain: self.domain.clone(),
            descriptors: Vec::with_capacity(self.descriptors.len()),
            hits_addend: 1,
        };
        'descriptors: for spec in &self.descriptors {
            let mut entries = Vec::with_capacity(spec.len());
            for entry in spec {
                let value = match &entry.source {
                    Source::Literal(text) => text.clone(),
                    Source::Field(name) => match fields.field(name) {
                        Some(v) if !v.is_empty() && v != "-" => v.into_owned(),
                        _ => {
                            *self.missing.entry(name.clone()).or_default() += 1;
                            continue 'descriptors;
                        }
                    },
                };
                entries.push((entry.key.clone(), value));
            }
            request.descriptors.push(Descriptor {
                entries,
                limit: None,
                hits_addend: None,
            });
        }
        if request.descriptors.is_empty() {
            self.no_descriptor += 1;
            return;
        }
        self.requests += 1;
        for state in &mut self.views {
            // The in-memory store decides at once: the future is ready on
            // its first poll, without entering the runtime.
            let decided = state.engine.decide(&request).now_or_never();
            let decided = match decided {
                Some(decided) => decided,
                None => self.runtime.block_on(state.engine.decide(&request)),
            };
            let answer = match decided {
                Ok(answer) => answer,
                Err(e) => {
                    if state.view == View::AsConfigured {
                        self.invalid += 1;
                        if self.first_invalid.is_none() {
                            let at = format_unix_ns(i64::try_from(now).unwrap_or(i64::MAX));
                            self.first_invalid = Some(match e {
                                EngineError::Invalid(m) | EngineError::Unavailable(m) => format!("at {at}: {m}"),
                                other => format!("at {at}: {other}"),
                            });
                        }
                    }
                    continue;
                }
            };
            for (status, descriptor) in answer.statuses.iter().zip(&request.descriptors) {
                let Some(metric) = &status.metric else { continue };
                if !status.limited() {
                    continue;
                }
                if state.view == View::AsConfigured && !self.info.contains_key(metric) {
                    self.info.insert(metric.clone(), describe_limits(status));
                }
                let figures = state.rules.entry(metric.clone()).or_default();
                figures.matched += 1;
                let refused = status.code == Code::OverLimit || status.shadow_refused;
                figures.series.add(since_start, u64::from(refused));
                if refused {
                    figures.refused += 1;
                    figures.first_refusal_ns.get_or_insert(now);
                    let key: Vec<String> = descriptor.entries.iter().map(|(k, v)| format!("{k}={v}")).collect();
                    figures.top.add(&key.join(","));
                }
            }
        }
    }

    /// The figures of the lines decided so far (the caller fills in the
    /// out-of-order figures).
    fn report(&self) -> Report {
        let at = |ns: u64| i64::try_from(ns).unwrap_or(i64::MAX);
        let mut rules = Vec::new();
        for (name, info) in &self.info {
            let mut views = Vec::new();
            for state in &self.views {
                let figures = state.rules.get(name).cloned().unwrap_or_default();
                views.push(ViewReport {
                    view: state.view,
                    algorithm: match state.view {
                        View::AsConfigured => info.algorithms.clone(),
                        View::SlidingLog => "sliding_log".to_owned(),
                        View::FixedWindow => "fixed_window".to_owned(),
                    },
                    matched: figures.matched,
                    refused: figures.refused,
                    first_refusal: figures.first_refusal_ns.map(|ns| format_unix_ns(at(ns))),
                    top_refused: figures.top.top(TOP),
                    series: figures.series,
                });
            }
            rules.push(RuleReport {
                rule: name.clone(),
                limits: info.limits.clone(),
                views,
            });
        }
        Report {
            domain: self.domain.clone(),
            lines: self.lines,
            requests: self.requests,
            first_line: self.start_ns.map(|ns| format_unix_ns(at(ns))),
            last_line: self.start_ns.map(|_| format_unix_ns(at(self.latest_ns))),
            out_of_order: 0,
            most_late_ns: 0,
            horizon_ns: 0,
            missing_fields: self.missing.clone(),
            without_descriptor: self.no_descriptor,
            invalid: self.invalid,
            first_invalid: self.first_invalid.clone(),
            evictions: self.views.iter().map(|s| s.engine.stats().evictions).sum(),
            rules,
        }
    }
}

/// A matched rule's limits and their algorithms, as the reports write them.
fn describe_limits(status: &slidegate_server::engine::Status) -> RuleInfo {
    let mut limits = Vec::new();
    let mut algorithms: Vec<String> = Vec::new();
    for a in &status.applied {
        let per = match a.unit {
            Some(unit) => unit.name().to_owned(),
            None => a
                .policy
                .as_ref()
                .map_or_else(String::new, |p| slidegate_core::duration::format_duration(p.window())),
        };
        let algorithm = a
            .policy
            .as_ref()
            .map_or_else(|| "refuses all".to_owned(), crate::plots::policy_label);
        limits.push(format!("{} per {per} ({algorithm})", a.requests_per_unit));
        if algorithms.last() != Some(&algorithm) {
            algorithms.push(algorithm);
        }
    }
    RuleInfo {
        limits: limits.join(" and "),
        algorithms: algorithms.join(" and "),
    }
}

/// The figures of one replay.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Report {
    pub(crate) domain: String,
    pub(crate) lines: u64,
    pub(crate) requests: u64,
    pub(crate) first_line: Option<String>,
    pub(crate) last_line: Option<String>,
    pub(crate) out_of_order: u64,
    #[serde(skip)]
    pub(crate) most_late_ns: u64,
    #[serde(skip)]
    pub(crate) horizon_ns: u64,
    pub(crate) missing_fields: BTreeMap<String, u64>,
    pub(crate) without_descriptor: u64,
    pub(crate) invalid: u64,
    pub(crate) first_invalid: Option<String>,
    pub(crate) evictions: u64,
    pub(crate) rules: Vec<RuleReport>,
}

/// One rule's figures in the three views.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct RuleReport {
    /// The rule's name in the metrics.
    pub(crate) rule: String,
    pub(crate) limits: String,
    pub(crate) views: Vec<ViewReport>,
}

/// One rule in one view.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct ViewReport {
    pub(crate) view: View,
    pub(crate) algorithm: String,
    pub(crate) matched: u64,
    pub(crate) refused: u64,
    pub(crate) first_refusal: Option<String>,
    pub(crate) top_refused: Vec<Refused>,
    #[serde(skip)]
    pub(crate) series: Series,
}

impl ViewReport {
    fn refused_pct(&self) -> f64 {
        if self.matched == 0 {
            0.0
        } else {
            self.refused as f64 * 100.0 / self.matched as f64
        }
    }
}

/// `key (n)`, with `≤` where the count is a bound.
fn refused_list(top: &[Refused]) -> String {
    top.iter()
        .map(|r| {
            if r.at_most_over == 0 {
                format!("{} ({})", r.key, r.refused)
            } else {
                format!("{} (≤{})", r.key, r.refused)
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Nanoseconds since the Unix epoch as RFC 3339 in UTC, to the
/// millisecond (`2023-11-14T22:13:20.250Z`).
pub(crate) fn format_unix_ns(ns: i64) -> String {
    let secs = ns.div_euclid(1_000_000_000);
    let millis = ns.rem_euclid(1_000_000_000) / 1_000_000;
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// The report as a table for people.
pub(crate) fn write_table(report: &Report, heading: &str, out: &mut dyn std::io::Write) -> std::io::Result<()> {
    writeln!(out, "{heading}")?;
    write_notes(report, out)?;
    if report.rules.is_empty() {
        writeln!(out, "no rule of domain `{}` matched any request", report.domain)?;
        return Ok(());
    }
    for rule in &report.rules {
        writeln!(out)?;
        writeln!(out, "rule {}: {}", rule.rule, rule.limits)?;
        let head = ["counted by", "matched", "refused", "refused_%", "first refusal"];
        let rows: Vec<[String; 5]> = rule
            .views
            .iter()
            .map(|v| {
                [
                    match v.view {
                        View::AsConfigured => format!("{} (as configured)", v.algorithm),
                        _ => v.view.name().to_owned(),
                    },
                    v.matched.to_string(),
                    v.refused.to_string(),
                    format!("{:.2}", v.refused_pct()),
                    v.first_refusal.clone().unwrap_or_else(|| "-".to_owned()),
                ]
            })
            .collect();
        let mut widths = head.map(str::len);
        for row in &rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let line = |cells: [&str; 5]| {
            let mut s = String::from("  ");
            for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
                let pad = w.saturating_sub(cell.chars().count());
                if i == 0 || i == 4 {
                    s.push_str(cell);
                    s.push_str(&" ".repeat(pad));
                } else {
                    s.push_str(&" ".repeat(pad));
                    s.push_str(cell);
                }
                s.push_str("  ");
            }
            s.trim_end().to_owned()
        };
        writeln!(out, "{}", line(head))?;
        for row in &rows {
            writeln!(
                out,
                "{}",
                line([&row[0], &row[1], &row[2], &row[3], &row[4]].map(String::as_str))
            )?;
        }
        for v in &rule.views {
            if !v.top_refused.is_empty() {
                writeln!(
                    out,
                    "  refused most, {}: {}",
                    v.view.name(),
                    refused_list(&v.top_refused)
                )?;
            }
        }
    }
    Ok(())
}

/// `1 line` or `n lines`.
fn lines(n: u64) -> String {
    if n == 1 {
        "1 line".to_owned()
    } else {
        format!("{n} lines")
    }
}

/// The replay's caveats, one line each.
fn write_notes(report: &Report, out: &mut dyn std::io::Write) -> std::io::Result<()> {
    let duration = |ns| slidegate_core::duration::format_duration(std::time::Duration::from_nanos(ns));
    if report.out_of_order > 0 {
        writeln!(
            out,
            "note: {} out of order by up to {} (more than the {} reorder horizon), decided at the latest time",
            lines(report.out_of_order),
            duration(report.most_late_ns),
            duration(report.horizon_ns)
        )?;
    }
    for (field, &n) in &report.missing_fields {
        writeln!(
            out,
            "note: {} without a value for field `{field}`: their descriptor was left out",
            lines(n)
        )?;
    }
    if report.without_descriptor > 0 {
        writeln!(
            out,
            "note: {} with no descriptor left sent no request",
            lines(report.without_descriptor)
        )?;
    }
    if let Some(first) = &report.first_invalid {
        writeln!(
            out,
            "note: {} refused by the service as invalid (the first: {first})",
            lines(report.invalid)
        )?;
    }
    if report.evictions > 0 {
        writeln!(
            out,
            "note: the stores were full and evicted {} live keys: raise --memory-mib for figures that do not \
             depend on eviction",
            report.evictions
        )?;
    }
    Ok(())
}

/// The CSV columns, one row per rule and view.
pub(crate) const CSV_COLUMNS: [&str; 8] = [
    "rule",
    "limits",
    "counted_by",
    "matched",
    "refused",
    "refused_pct",
    "first_refusal",
    "top_refused",
];

/// The report as CSV, one row per rule and view.
pub(crate) fn write_csv(report: &Report, out: &mut dyn std::io::Write) -> std::io::Result<()> {
    fn quoted(s: &str) -> String {
        if s.contains([',', '"', '\n']) {
            format!("\"{}\"", s.replace('"', "\"\""))
        } else {
            s.to_owned()
        }
    }
    writeln!(out, "{}", CSV_COLUMNS.join(","))?;
    for rule in &report.rules {
        for v in &rule.views {
            let top: Vec<String> = v
                .top_refused
                .iter()
                .map(|r| {
                    if r.at_most_over == 0 {
                        format!("{} {}", r.key, r.refused)
                    } else {
                        format!("{} <={}", r.key, r.refused)
                    }
                })
                .collect();
            let cells = [
                quoted(&rule.rule),
                quoted(&rule.limits),
                quoted(match v.view {
                    View::AsConfigured => &v.algorithm,
                    _ => v.view.name(),
                }),
                v.matched.to_string(),
                v.refused.to_string(),
                format!("{:.2}", v.refused_pct()),
                v.first_refusal.clone().unwrap_or_default(),
                quoted(&top.join("; ")),
            ];
            writeln!(out, "{}", cells.join(","))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lines of `tests/data/whatif/access.log`: seconds after
    /// 2023-11-14T22:13:00Z, client, path.
    const LOG: [(u64, &str, &str); 16] = [
        (0, "10.0.0.1", "/"),
        (1, "10.0.0.1", "/"),
        (2, "10.0.0.1", "/login"),
        (3, "10.0.0.1", "/login"),
        (4, "10.0.0.1", "/login"),
        (50, "10.0.0.2", "/"),
        (51, "10.0.0.2", "/cart"),
        (52, "10.0.0.2", "/"),
        (61, "10.0.0.1", "/"),
        (61, "10.0.0.2", "/login"),
        (62, "10.0.0.1", "/login"),
        (62, "10.0.0.2", "/login"),
        (63, "10.0.0.2", "/login"),
        (70, "10.0.0.1", "/"),
        (71, "10.0.0.1", "/"),
        (72, "10.0.0.3", "/login"),
    ];

    fn setup() -> Setup {
        let data = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/whatif/config.yaml");
        Setup {
            config: vec![PathBuf::from(data)],
            domain: "shop".into(),
            descriptors: vec![
                vec!["remote_address=client".parse().unwrap()],
                vec!["path=path".parse().unwrap()],
            ],
            memory_bytes: 1 << 20,
            order: ReorderOptions::default(),
        }
    }

    /// (view, matched, refused, first refusal, refused most) of a rule.
    type Figures<'a> = (View, u64, u64, Option<&'a str>, Vec<(&'a str, u64)>);

    fn figures(rule: &RuleReport) -> Vec<Figures<'_>> {
        rule.views
            .iter()
            .map(|v| {
                (
                    v.view,
                    v.matched,
                    v.refused,
                    v.first_refusal.as_deref(),
                    v.top_refused.iter().map(|r| (r.key.as_str(), r.refused)).collect(),
                )
            })
            .collect()
    }

    /// The figures of `tests/data/whatif/oracle.py`, which works them out
    /// from the algorithms' definitions, request by request.
    #[test]
    fn the_committed_log_is_refused_as_worked_out() {
        let mut replay = Replay::new(&setup()).unwrap();
        let t0 = 1_699_999_980_000_000_000_i64;
        for (s, client, path) in LOG {
            let fields = &[("client", client), ("path", path)][..];
            replay.line(t0 + s as i64 * 1_000_000_000, fields);
        }
        let report = replay.finish();
        assert_eq!((report.lines, report.requests, report.out_of_order), (16, 16, 0));
        let names: Vec<&str> = report.rules.iter().map(|r| r.rule.as_str()).collect();
        assert_eq!(names, ["path_/login", "remote_address"]);
        assert_eq!(report.rules[0].limits, "2 per 10s (sliding_window n=2 conservative)");
        assert_eq!(report.rules[1].limits, "3 per minute (sliding_window n=8 conservative)");
        // The login page: the two-bucket ring still counts 22:14:01 and
        // 22:14:02 at 22:14:12 (their bucket is the one before), where the
        // log and the fixed window no longer do.
        let login = "path=/login";
        assert_eq!(
            figures(&report.rules[0]),
            vec![
                (
                    View::AsConfigured,
                    8,
                    4,
                    Some("2023-11-14T22:13:04.000Z"),
                    vec![(login, 4)]
                ),
                (
                    View::SlidingLog,
                    8,
                    3,
                    Some("2023-11-14T22:13:04.000Z"),
                    vec![(login, 3)]
                ),
                (
                    View::FixedWindow,
                    8,
                    3,
                    Some("2023-11-14T22:13:04.000Z"),
                    vec![(login, 3)]
                ),
            ]
        );
        // Per client, 3 a minute: 10.0.0.2's three at 22:13:50-52 and three
        // more at 22:14:01-03 pass the fixed window (a new minute) but
        // neither sliding count; the 8-bucket ring refuses 10.0.0.1 at
        // 22:14:02 (its bucket of 22:13:01-02 still counts whole) and so
        // has room at 22:14:11, where the log is full.
        let (one, two) = ("remote_address=10.0.0.1", "remote_address=10.0.0.2");
        assert_eq!(
            figures(&report.rules[1]),
            vec![
                (
                    View::AsConfigured,
                    16,
                    6,
                    Some("2023-11-14T22:13:03.000Z"),
                    vec![(one, 3), (two, 3)]
                ),
                (
                    View::SlidingLog,
                    16,
                    6,
                    Some("2023-11-14T22:13:03.000Z"),
                    vec![(one, 3), (two, 3)]
                ),
                (
                    View::FixedWindow,
                    16,
                    3,
                    Some("2023-11-14T22:13:03.000Z"),
                    vec![(one, 3)]
                ),
            ]
        );
        // Every refusal is in the series, at its time.
        let series = &report.rules[1].views[2].series;
        assert_eq!(series.counts.iter().sum::<u64>(), 3);
        assert_eq!(series.counts[3..5], [1, 1]);
    }

    #[test]
    fn missing_fields_and_late_lines_are_counted_not_lost() {
        let mut setup = setup();
        setup.order.horizon_ns = 1_000_000_000;
        let mut replay = Replay::new(&setup).unwrap();
        let t0 = 1_699_999_980_000_000_000_i64;
        let s = |n: i64| t0 + n * 1_000_000_000;
        replay.line(s(5), &[("client", "10.0.0.1"), ("path", "-")][..]);
        // Within the horizon: put back in order, not late.
        replay.line(s(4), &[("client", "10.0.0.1"), ("path", "/login")][..]);
        // 7 s releases 5 s; 3 s then comes 2 s after a line decided.
        replay.line(s(7), &[("path", "")][..]);
        replay.line(s(3), &[("client", "10.0.0.1")][..]);
        let report = replay.finish();
        assert_eq!((report.lines, report.requests, report.without_descriptor), (4, 3, 1));
        assert_eq!((report.out_of_order, report.most_late_ns), (1, 2_000_000_000));
        assert_eq!(report.missing_fields.get("path"), Some(&3));
        assert_eq!(report.missing_fields.get("client"), Some(&1));
        // The login line was decided first, at 22:13:04.
        assert_eq!(report.first_line.as_deref(), Some("2023-11-14T22:13:04.000Z"));
        let names: Vec<&str> = report.rules.iter().map(|r| r.rule.as_str()).collect();
        assert_eq!(names, ["path_/login", "remote_address"]);
        assert_eq!(report.rules[1].views[0].matched, 3);
        let mut out = Vec::new();
        write_notes(&report, &mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "note: 1 line out of order by up to 2s (more than the 1s reorder horizon), decided at the latest \
             time\nnote: 1 line without a value for field `client`: their descriptor was left out\nnote: 3 lines \
             without a value for field `path`: their descriptor was left out\nnote: 1 line with no descriptor left \
             sent no request\n"
        );
    }

    #[test]
    fn requests_the_service_refuses_as_invalid_are_counted_with_the_first() {
        let mut replay = Replay::new(&setup()).unwrap();
        let long = "x".repeat(2000);
        replay.line(
            1_700_000_000_000_000_000,
            &[("client", long.as_str()), ("path", "/")][..],
        );
        replay.line(1_700_000_001_000_000_000, &[("client", "10.0.0.1"), ("path", "/")][..]);
        let report = replay.finish();
        assert_eq!((report.requests, report.invalid), (2, 1));
        assert_eq!(
            report.first_invalid.as_deref(),
            Some(
                "at 2023-11-14T22:13:20.000Z: an entry value of descriptor 0 is 2000 bytes, over the limit of 1024 bytes"
            )
        );
        assert_eq!(report.rules[0].views[0].matched, 1);
    }

    #[test]
    fn a_domain_not_in_the_config_is_named_with_those_it_has() {
        let mut setup = setup();
        setup.domain = "nope".into();
        let e = Replay::new(&setup).err().unwrap();
        assert_eq!(e.to_string(), "domain `nope` is not in the config: it has `shop`");
    }

    #[test]
    fn entries_parse_fields_and_literals() {
        let e: EntrySpec = "remote_address=client".parse().unwrap();
        assert_eq!(e.key, "remote_address");
        assert_eq!(e.source, Source::Field("client".into()));
        let e: EntrySpec = "generic_key=literal:api=v1".parse().unwrap();
        assert_eq!(e.source, Source::Literal("api=v1".into()));
        assert_eq!(
            "client".parse::<EntrySpec>().unwrap_err(),
            "`client` is not KEY=FIELD (a log field as the entry's value) or KEY=literal:TEXT (a fixed value)"
        );
        assert_eq!(
            "=client".parse::<EntrySpec>().unwrap_err(),
            "`=client` has no key before `=`"
        );
        assert_eq!("k=".parse::<EntrySpec>().unwrap_err(), "`k=` names no field after `=`");
        assert_eq!(
            "k=literal:".parse::<EntrySpec>().unwrap_err(),
            "`k=literal:`: the literal value is empty"
        );
    }

    #[test]
    fn top_keys_are_exact_until_full_then_bounds() {
        let mut top = TopKeys::default();
        for _ in 0..5 {
            top.add("a");
        }
        top.add("b");
        top.add("b");
        top.add("c");
        let t = top.top(2);
        assert_eq!(
            t,
            vec![
                Refused {
                    key: "a".into(),
                    refused: 5,
                    at_most_over: 0
                },
                Refused {
                    key: "b".into(),
                    refused: 2,
                    at_most_over: 0
                },
            ]
        );
        // A flood of distinct keys each refused once: the heavy key keeps
        // its exact count, the table stays bounded, and a key dropped and
        // seen again is over-counted by at most its stated bound.
        for i in 0..(TRACKED_KEYS * 3) {
            top.add(&format!("k{i}"));
        }
        assert!(top.counts.len() <= TRACKED_KEYS);
        let t = top.top(1);
        assert_eq!((t[0].key.as_str(), t[0].refused, t[0].at_most_over), ("a", 5, 0));
        top.add("k0");
        let k0 = &top.counts["k0"];
        assert!(k0.0 >= 2 && k0.0 - k0.1 <= 2, "{k0:?}");
    }

    #[test]
    fn series_widen_and_align() {
        let mut s = Series::default();
        s.add(0, 1);
        s.add(1_500_000_000, 2);
        assert_eq!((s.interval_ns, s.counts.clone()), (FIRST_INTERVAL_NS, vec![1, 2]));
        // Past MAX_INTERVALS seconds the interval doubles until it fits.
        s.add(MAX_INTERVALS as u64 * 1_000_000_000 * 3, 1);
        assert_eq!(s.interval_ns, 4 * FIRST_INTERVAL_NS);
        assert_eq!(s.counts[0], 3);
        assert_eq!(s.counts.iter().sum::<u64>(), 4);
        assert!(s.counts.len() <= MAX_INTERVALS);
        let wider = s.aligned(8 * FIRST_INTERVAL_NS, 3);
        assert_eq!((wider[0], wider.iter().sum::<u64>()), (3, 4));
        assert_eq!(wider.len(), s.counts.len().div_ceil(2));
        let mut short = Series::default();
        short.add(0, 2);
        assert_eq!(short.aligned(FIRST_INTERVAL_NS, 3), vec![2, 0, 0]);
        assert_eq!(s.aligned(4 * FIRST_INTERVAL_NS, 0).len(), s.counts.len());
    }

    #[test]
    fn times_print_as_rfc3339() {
        assert_eq!(format_unix_ns(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_unix_ns(1_700_000_000_250_000_000), "2023-11-14T22:13:20.250Z");
        assert_eq!(format_unix_ns(951_782_400_000_000_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(format_unix_ns(-1_000_000), "1969-12-31T23:59:59.999Z");
    }
}
