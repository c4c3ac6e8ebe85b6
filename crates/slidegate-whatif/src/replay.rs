//! The replay: lines put in time order, each decided by the config's
//! three views (as configured, the exact sliding log, a fixed window),
//! each view an engine of the service on a manual clock set to the line's
//! time.

use crate::error::WhatIfError;
use crate::report::{Refused, Report, RuleReport, Series, View, ViewReport, format_unix_ns, policy_label};
use crate::setup::{EntrySpec, Fields, Setup, Source};
use futures_util::FutureExt;
use slidegate_core::{Algorithm, ManualClock};
use slidegate_memory::Budget;
use slidegate_server::config::{Config, LoadOptions};
use slidegate_server::engine::{Code, Descriptor, Engine, InputLimits, Request};
use slidegate_sim::Reorder;
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

/// How many keys refused most a rule's report names.
const TOP: usize = 10;

/// How many refused keys a rule's table keeps exactly before it starts
/// dropping the least refused (then the counts are bounds, and say so).
const TRACKED_KEYS: usize = 4096;

/// The sliding windows' store of the views that count no sliding window.
const UNUSED_STORE_BYTES: usize = 64 << 10;

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
pub struct Replay {
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
    /// The config's errors (file, line, column), a domain it does not
    /// have (naming those it has), no descriptor, or a runtime that does
    /// not start: [`WhatIfError`].
    pub fn new(setup: &Setup) -> Result<Replay, WhatIfError> {
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
    pub fn line(&mut self, time_unix_ns: i64, fields: &(impl Fields + ?Sized)) {
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
    pub fn finish(mut self) -> Report {
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
    fn new(setup: &Setup) -> Result<Decider, WhatIfError> {
        let config = Config::load_with(&setup.config, &LoadOptions::default()).map_err(WhatIfError::Config)?;
        if config.domain(&setup.domain).is_none() {
            return Err(WhatIfError::UnknownDomain {
                domain: setup.domain.clone(),
                known: config.domains().map(|d| d.name.clone()).collect(),
            });
        }
        if setup.descriptors.iter().all(Vec::is_empty) {
            return Err(WhatIfError::NoDescriptor);
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
            .map_err(WhatIfError::Config)?;
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
            .map_err(WhatIfError::Runtime)?;
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
                            self.first_invalid = Some(format!("at {at}: {}", e.detail()));
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
            start_unix_ns: self.start_ns.map(at),
            span_ns: self.start_ns.map_or(0, |start| self.latest_ns.saturating_sub(start)),
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
        let algorithm = a.policy.as_ref().map_or_else(|| "refuses all".to_owned(), policy_label);
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

#[cfg(test)]
mod tests {
    use super::*;
    use slidegate_sim::ReorderOptions;
    use std::path::PathBuf;

    /// The lines of `tests/data/access.log`: seconds after
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
        let data = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/config.yaml");
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

    /// The figures of `tests/data/oracle.py`, which works them out
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
}
