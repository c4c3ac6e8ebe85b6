//! envoyproxy/ratelimit's stats under its own names, read from the
//! server's counters when they are sent (statsd) or scraped (the Envoy
//! Gateway view): nothing on the request path.
//!
//! Its names, as its stats manager and gRPC interceptor form them:
//!
//! - `ratelimit.service.rate_limit.<stat key>.<stat>` for each rule with a
//!   limit, the stat key being its domain and its metric key
//!   ([`Match::metric_key`](crate::config::Match::metric_key)) joined by a
//!   dot and sanitized together ([`stat_name`]), the stat one of
//!   `total_hits`, `over_limit`, `near_limit`, `within_limit`,
//!   `shadow_mode`;
//! - `ratelimit.service.config_load_success` and `config_load_error`
//!   (the config loaded at the start counts as one success);
//! - `ratelimit.service.global_shadow_mode`;
//! - `ratelimit.service.call.should_rate_limit.redis_error` (a
//!   `ShouldRateLimit` call, over gRPC or `/json`, the store could not
//!   answer) and `service_error` (one refused as invalid);
//! - `ratelimit_server.ShouldRateLimit.total_requests` (gRPC calls).
//!
//! The Envoy Gateway view ([`Metrics::render_envoy_gateway`]) maps these
//! names as Envoy Gateway's `statsd_conf.yaml` (envoyproxy/ratelimit's
//! built-in mapper) has the statsd exporter map them, and writes the result
//! in the Prometheus text format 0.0.4, as that exporter serves it, after
//! slidegate's own metrics.

use super::{Api, Metrics, Outcome, ReloadLabels, ReloadResult, stat_name};
use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;

/// The per-rule stats, in the order [`RuleTotals`] holds them.
pub(crate) const RULE_STATS: [&str; 5] = ["total_hits", "over_limit", "near_limit", "within_limit", "shadow_mode"];

/// A rule's hits: `total_hits`, `over_limit`, `near_limit`,
/// `within_limit`, `shadow_mode`.
type RuleTotals = [u64; 5];

/// The prefix of the per-rule stats.
const RULE_PREFIX: &str = "ratelimit.service.rate_limit.";

impl Metrics {
    /// Counts the config loaded at the start, as envoyproxy/ratelimit counts
    /// its first load in `config_load_success` (a reload counts through
    /// [`Metrics::reload`]).
    pub(crate) fn config_loaded_at_start(&self) {
        self.start_loads.inc();
    }

    /// envoyproxy/ratelimit's stats with their values so far, by statsd
    /// name (without tags), sorted: the per-rule stats of every rule seen
    /// with a hit counted, then the service's.
    pub(crate) fn upstream_stats(&self) -> Vec<(String, u64)> {
        let mut rules: BTreeMap<String, RuleTotals> = BTreeMap::new();
        {
            let known = self.rule_counters.read();
            // Metric keys that sanitize to one name share its counters:
            // each set of counters is read once.
            let mut read: HashSet<(&str, String)> = HashSet::new();
            for (domain, by_rule) in &known.by_domain {
                for (rule, series) in by_rule {
                    if !read.insert((domain, stat_name(rule).into_owned())) {
                        continue;
                    }
                    let totals = [
                        series.total_hits.get(),
                        series.over_limit_hits.get(),
                        series.near_limit_hits.get(),
                        series.within_limit_hits.get(),
                        series.shadow_mode_hits.get(),
                    ];
                    if totals.iter().all(|&n| n == 0) {
                        // A rule without a limit: no stats.
                        continue;
                    }
                    let key = stat_name(&format!("{domain}.{rule}")).into_owned();
                    let sum = rules.entry(key).or_default();
                    for (sum, n) in sum.iter_mut().zip(totals) {
                        *sum = sum.saturating_add(n);
                    }
                }
            }
        }
        let mut out = Vec::with_capacity(rules.len() * RULE_STATS.len() + 6);
        for (key, totals) in rules {
            for (stat, n) in RULE_STATS.iter().zip(totals) {
                out.push((format!("{RULE_PREFIX}{key}.{stat}"), n));
            }
        }
        let requests = |api: Api, outcome: Outcome| {
            self.request_series
                .get(api as usize)
                .and_then(|row| row.get(outcome as usize))
                .map_or(0, prometheus_client::metrics::counter::Counter::get)
        };
        let should_rate_limit =
            |outcome: Outcome| requests(Api::Grpc, outcome).saturating_add(requests(Api::Json, outcome));
        let reloads = |result| self.reloads.get_or_create(&ReloadLabels { result }).get();
        let grpc_calls = Outcome::ALL
            .into_iter()
            .fold(0u64, |sum, outcome| sum.saturating_add(requests(Api::Grpc, outcome)));
        out.extend([
            (
                "ratelimit.service.config_load_success".to_owned(),
                reloads(ReloadResult::Success).saturating_add(self.start_loads.get()),
            ),
            (
                "ratelimit.service.config_load_error".to_owned(),
                reloads(ReloadResult::Failure),
            ),
            (
                "ratelimit.service.global_shadow_mode".to_owned(),
                self.global_shadow.get(),
            ),
            (
                "ratelimit.service.call.should_rate_limit.redis_error".to_owned(),
                should_rate_limit(Outcome::Unavailable),
            ),
            (
                "ratelimit.service.call.should_rate_limit.service_error".to_owned(),
                should_rate_limit(Outcome::Invalid),
            ),
            ("ratelimit_server.ShouldRateLimit.total_requests".to_owned(), grpc_calls),
        ]);
        out
    }

    /// slidegate's metrics and, after them, envoyproxy/ratelimit's stats as
    /// Envoy Gateway's default statsd mapping names them
    /// (`ratelimit_service_rate_limit_over_limit{domain,key1,key2}` and
    /// the like), all in the Prometheus text format 0.0.4.
    pub(crate) fn render_envoy_gateway(&self, own: &str) -> String {
        let mut out = openmetrics_to_text(own);
        write_mapped(&mut out, &self.upstream_stats());
        out
    }
}

/// A series' labels, in the mapping's order.
type Labels = Vec<(&'static str, String)>;

/// A stat as the statsd exporter exposes it under Envoy Gateway's mapping:
/// its metric name and labels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Mapped {
    /// The Prometheus metric name.
    pub(crate) name: String,
    /// The labels, in the mapping's order.
    pub(crate) labels: Labels,
}

/// Maps a statsd name as Envoy Gateway's `statsd_conf.yaml` does: its glob
/// rules first (`*` is one dot-separated field, empty or not), then its
/// regex rules in order (unanchored, as the exporter searches them); a
/// name no rule maps is exposed with every character but letters, digits
/// and `_` turned to `_`, as the exporter exposes unmapped names.
pub(crate) fn map_default(name: &str) -> Mapped {
    let named = |metric: String, labels: Labels| Mapped { name: metric, labels };
    let fields: Vec<&str> = name.split('.').collect();
    match fields.as_slice() {
        ["ratelimit", "service", "rate_limit", domain, key1, stat] if RULE_STATS.contains(stat) => {
            return named(
                format!("ratelimit_service_rate_limit_{stat}"),
                vec![("domain", (*domain).to_owned()), ("key1", (*key1).to_owned())],
            );
        }
        ["ratelimit", "service", "call", "should_rate_limit", err_type] => {
            return named(
                "ratelimit_service_should_rate_limit_error".to_owned(),
                vec![("err_type", (*err_type).to_owned())],
            );
        }
        ["ratelimit_server", method, "total_requests"] => {
            return named(
                "ratelimit_service_total_requests".to_owned(),
                vec![("grpc_method", (*method).to_owned())],
            );
        }
        ["ratelimit", "service", "config_load_success"] => {
            return named("ratelimit_service_config_load_success".to_owned(), Vec::new());
        }
        ["ratelimit", "service", "config_load_error"] => {
            return named("ratelimit_service_config_load_error".to_owned(), Vec::new());
        }
        _ => {}
    }
    // The regex rules: `ratelimit\.service\.rate_limit\.([^\.]*)\.([^\.]*)\.([^\.]*)(\..*)?\.STAT`,
    // one per stat, in the file's order.
    for stat in ["near_limit", "over_limit", "total_hits", "within_limit", "shadow_mode"] {
        if let Some([domain, key1, key2]) = regex_rule(name, stat) {
            return named(
                format!("ratelimit_service_rate_limit_{stat}"),
                vec![
                    ("domain", domain.to_owned()),
                    ("key1", key1.to_owned()),
                    ("key2", key2.to_owned()),
                ],
            );
        }
    }
    named(escape_metric_name(name), Vec::new())
}

/// The captures of `ratelimit\.service\.rate_limit\.([^\.]*)\.([^\.]*)\.([^\.]*)(\..*)?\.<stat>`
/// searched in `name` (leftmost match first): three whole fields after the
/// prefix, then `.<stat>` anywhere after them.
fn regex_rule<'a>(name: &'a str, stat: &str) -> Option<[&'a str; 3]> {
    for (at, _) in name.match_indices(RULE_PREFIX) {
        let rest = name.get(at + RULE_PREFIX.len()..)?;
        let mut parts = rest.splitn(4, '.');
        let (Some(a), Some(b), Some(c), Some(tail)) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        // `tail` follows the third field's dot: `(\..*)?\.<stat>` asks for
        // `<stat>` right after that dot or after a later one.
        let after_dot = std::iter::once(0).chain(tail.match_indices('.').map(|(i, _)| i + 1));
        if after_dot
            .into_iter()
            .any(|i| tail.get(i..).is_some_and(|t| t.starts_with(stat)))
        {
            return Some([a, b, c]);
        }
    }
    None
}

/// A statsd name as the statsd exporter exposes an unmapped one: every
/// character but ASCII letters, digits and `_` becomes `_`, and a leading
/// digit gets a `_` before it.
fn escape_metric_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 1);
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        out.push('_');
    }
    out.extend(
        name.chars()
            .map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }),
    );
    out
}

/// Writes `stats` mapped ([`map_default`]) as counters, each family's
/// series together under one `# HELP` and `# TYPE`.
fn write_mapped(out: &mut String, stats: &[(String, u64)]) {
    let mut families: BTreeMap<String, Vec<(Labels, u64)>> = BTreeMap::new();
    for (name, value) in stats {
        let mapped = map_default(name);
        families.entry(mapped.name).or_default().push((mapped.labels, *value));
    }
    for (name, series) in families {
        let _ = writeln!(
            out,
            "# HELP {name} envoyproxy/ratelimit's stat, as Envoy Gateway's statsd mapping names it"
        );
        let _ = writeln!(out, "# TYPE {name} counter");
        for (labels, value) in series {
            out.push_str(&name);
            if !labels.is_empty() {
                out.push('{');
                for (i, (label, text)) in labels.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(label);
                    out.push_str("=\"");
                    escape_label_value(out, text);
                    out.push('"');
                }
                out.push('}');
            }
            let _ = writeln!(out, " {value}");
        }
    }
}

/// A label value in the text format: `\`, `"` and newlines escaped.
fn escape_label_value(out: &mut String, text: &str) {
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// The OpenMetrics text of the registry in the Prometheus text format
/// 0.0.4, as the statsd exporter (and envoyproxy/ratelimit's Prometheus
/// endpoint) serves: a counter family is named after its samples
/// (`_total`), an info family is a gauge named `_info`, unknown is
/// untyped, and `# UNIT` and `# EOF` go.
pub(crate) fn openmetrics_to_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let lines: Vec<&str> = text.lines().collect();
    let mut i = 0;
    while let Some(&line) = lines.get(i) {
        i += 1;
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        // prometheus-client writes `# HELP` before `# TYPE`: read them as
        // a pair, to rename both.
        let (help, type_line) = match line.strip_prefix("# HELP ") {
            Some(help) => match lines.get(i).and_then(|l| l.strip_prefix("# TYPE ")) {
                Some(type_line) => {
                    i += 1;
                    (Some(help), type_line)
                }
                None => {
                    out.push_str(line);
                    out.push('\n');
                    continue;
                }
            },
            None => match line.strip_prefix("# TYPE ") {
                Some(type_line) => (None, type_line),
                None => {
                    out.push_str(line);
                    out.push('\n');
                    continue;
                }
            },
        };
        let (family, kind) = type_line.split_once(' ').unwrap_or((type_line, "untyped"));
        let (name, kind) = match kind {
            "counter" => (format!("{family}_total"), "counter"),
            "info" => (format!("{family}_info"), "gauge"),
            "unknown" => (family.to_owned(), "untyped"),
            other => (family.to_owned(), other),
        };
        if let Some(help) = help {
            let text = help.split_once(' ').map_or("", |(_, text)| text);
            let _ = writeln!(out, "# HELP {name} {text}");
        }
        let _ = writeln!(out, "# TYPE {name} {kind}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapped(name: &str, labels: &[(&'static str, &str)]) -> Mapped {
        Mapped {
            name: name.to_owned(),
            labels: labels.iter().map(|&(k, v)| (k, v.to_owned())).collect(),
        }
    }

    #[test]
    fn names_map_as_envoy_gateway_maps_them() {
        for (stat, want) in [
            (
                "ratelimit.service.rate_limit.d.k_v.over_limit",
                mapped(
                    "ratelimit_service_rate_limit_over_limit",
                    &[("domain", "d"), ("key1", "k_v")],
                ),
            ),
            (
                "ratelimit.service.rate_limit.d.a.b.total_hits",
                mapped(
                    "ratelimit_service_rate_limit_total_hits",
                    &[("domain", "d"), ("key1", "a"), ("key2", "b")],
                ),
            ),
            // Past two keys, the rest is dropped.
            (
                "ratelimit.service.rate_limit.d.a.b.c.near_limit",
                mapped(
                    "ratelimit_service_rate_limit_near_limit",
                    &[("domain", "d"), ("key1", "a"), ("key2", "b")],
                ),
            ),
            // envoyproxy/ratelimit's README example: a key named over_limit.
            (
                "ratelimit.service.rate_limit.messaging.auth-service.over_limit.total_hits",
                mapped(
                    "ratelimit_service_rate_limit_total_hits",
                    &[
                        ("domain", "messaging"),
                        ("key1", "auth-service"),
                        ("key2", "over_limit"),
                    ],
                ),
            ),
            // The regex rules are searched in order: a key named
            // near_limit wins over the stat at the end.
            (
                "ratelimit.service.rate_limit.d.a.b.near_limit.over_limit",
                mapped(
                    "ratelimit_service_rate_limit_near_limit",
                    &[("domain", "d"), ("key1", "a"), ("key2", "b")],
                ),
            ),
            // Empty fields are fields.
            (
                "ratelimit.service.rate_limit.d..shadow_mode",
                mapped(
                    "ratelimit_service_rate_limit_shadow_mode",
                    &[("domain", "d"), ("key1", "")],
                ),
            ),
            (
                "ratelimit.service.call.should_rate_limit.redis_error",
                mapped(
                    "ratelimit_service_should_rate_limit_error",
                    &[("err_type", "redis_error")],
                ),
            ),
            (
                "ratelimit_server.ShouldRateLimit.total_requests",
                mapped(
                    "ratelimit_service_total_requests",
                    &[("grpc_method", "ShouldRateLimit")],
                ),
            ),
            (
                "ratelimit.service.config_load_success",
                mapped("ratelimit_service_config_load_success", &[]),
            ),
            (
                "ratelimit.service.config_load_error",
                mapped("ratelimit_service_config_load_error", &[]),
            ),
            // Unmapped: escaped.
            (
                "ratelimit.service.global_shadow_mode",
                mapped("ratelimit_service_global_shadow_mode", &[]),
            ),
            ("9a.b-c", mapped("_9a_b_c", &[])),
        ] {
            assert_eq!(map_default(stat), want, "{stat}");
        }
    }

    #[test]
    fn openmetrics_becomes_the_0_0_4_text_format() {
        let om = "# HELP slidegate_requests Requests.\n\
                  # TYPE slidegate_requests counter\n\
                  slidegate_requests_total{api=\"grpc\"} 3\n\
                  # HELP slidegate_keys Keys.\n\
                  # TYPE slidegate_keys gauge\n\
                  # UNIT slidegate_keys keys\n\
                  slidegate_keys 2\n\
                  # HELP b Build.\n\
                  # TYPE b info\n\
                  b_info{v=\"1\"} 1\n\
                  # TYPE u unknown\n\
                  u 1\n\
                  # EOF\n";
        assert_eq!(
            openmetrics_to_text(om),
            "# HELP slidegate_requests_total Requests.\n\
             # TYPE slidegate_requests_total counter\n\
             slidegate_requests_total{api=\"grpc\"} 3\n\
             # HELP slidegate_keys Keys.\n\
             # TYPE slidegate_keys gauge\n\
             slidegate_keys 2\n\
             # HELP b_info Build.\n\
             # TYPE b_info gauge\n\
             b_info{v=\"1\"} 1\n\
             # TYPE u untyped\n\
             u 1\n"
        );
    }

    /// Every sample of the real registry's text, converted, belongs to the
    /// family of the `# TYPE` line above it, as the 0.0.4 parsers require.
    #[test]
    fn the_registry_converted_has_every_sample_in_its_family() {
        let metrics = Metrics::new();
        metrics.reload(true);
        let text = metrics.render_envoy_gateway(&metrics.render(&Default::default(), false));
        assert!(!text.contains("# EOF") && !text.contains("# UNIT"));
        let mut family: Option<(String, String)> = None;
        let mut samples = 0;
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                family = Some((name.to_owned(), kind.to_owned()));
                continue;
            }
            if line.starts_with('#') {
                continue;
            }
            let name = line.split(['{', ' ']).next().unwrap();
            let (family, kind) = family.as_ref().unwrap();
            let ok = match kind.as_str() {
                "histogram" => [
                    family.clone() + "_bucket",
                    family.clone() + "_sum",
                    family.clone() + "_count",
                ]
                .contains(&name.to_owned()),
                _ => name == family,
            };
            assert!(ok, "{name} under # TYPE {family} {kind}");
            samples += 1;
        }
        assert!(samples > 50, "{samples} samples");
        assert!(text.contains("\nratelimit_service_config_load_success 1\n"), "{text}");
    }
}
