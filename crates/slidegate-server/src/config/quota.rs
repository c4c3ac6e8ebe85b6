//! A domain's `quota_buckets`: the rules that give the buckets of Envoy's
//! `rate_limit_quota` filter their limits, and how a bucket id finds its
//! rule.
//!
//! A bucket id is Envoy's `BucketId`, a map of keys to values with unique
//! keys. A rule matches it when every key of its `bucket_id` is in the id
//! with a value its pattern matches (`*` alone: any value, the key
//! present), and no key of its `absent` is; the id's other keys may be
//! anything. The first rule in file order that matches wins.

use super::{Domain, Limit, ValuePattern};
use std::collections::HashSet;

/// One rule of `quota_buckets`.
#[derive(Debug, Clone, PartialEq)]
pub struct QuotaRule {
    /// `name`, or the default made from its keys (see
    /// [`QuotaRule::default_name`]), unique in its domain: the rule's name
    /// in metrics and logs.
    pub name: String,
    /// `bucket_id`: each key and the pattern its value must match, sorted
    /// by key.
    pub bucket_id: Vec<(String, ValuePattern)>,
    /// `absent`: keys the bucket id must not have, in file order.
    pub absent: Vec<String>,
    /// `rate_limit`; `None` for `unlimited: true`. Its
    /// [`Limit::header_name`] is the rule's name.
    pub limit: Option<Limit>,
    /// The line where the rule starts, for diagnostics.
    pub line: usize,
    /// The column where the rule starts, for diagnostics.
    pub column: usize,
}

impl QuotaRule {
    /// Whether the bucket id `id` (Envoy's bucket map: its keys are unique)
    /// matches: every key of [`QuotaRule::bucket_id`] is in `id` with a
    /// value its pattern matches, and no key of [`QuotaRule::absent`] is.
    pub fn matches(&self, id: &[(&str, &str)]) -> bool {
        let value = |key: &str| id.iter().find(|(k, _)| *k == key).map(|&(_, v)| v);
        self.bucket_id
            .iter()
            .all(|(key, pattern)| value(key).is_some_and(|v| pattern.matches(v)))
            && self.absent.iter().all(|key| value(key).is_none())
    }

    /// The name of a rule without `name`: its `bucket_id` keys in sorted
    /// order joined by `.`, each `key_value` for an exact value and `key`
    /// for a pattern, as envoyproxy/ratelimit's stat keys are
    /// (`route_checkout.tenant`); `*` when `bucket_id` is empty.
    pub fn default_name(&self) -> String {
        if self.bucket_id.is_empty() {
            return "*".to_owned();
        }
        let parts: Vec<String> = self
            .bucket_id
            .iter()
            .map(|(key, pattern)| match pattern {
                ValuePattern::Exact(value) => format!("{key}_{value}"),
                ValuePattern::Wildcard(_) => key.clone(),
            })
            .collect();
        parts.join(".")
    }
}

impl Domain {
    /// The first of [`Domain::quota_rules`], in file order, that the bucket
    /// id `id` matches ([`QuotaRule::matches`]), with its place in the list.
    /// `None`: no rule matches, and Envoy keeps its
    /// `no_assignment_behavior` for the bucket.
    pub fn find_quota(&self, id: &[(&str, &str)]) -> Option<(usize, &QuotaRule)> {
        self.quota_rules.iter().enumerate().find(|(_, rule)| rule.matches(id))
    }

    /// This domain with `rules` as its [`Domain::quota_rules`].
    #[must_use]
    pub fn with_quota_rules(mut self, rules: Vec<QuotaRule>) -> Domain {
        self.quota_rules = rules;
        self
    }
}

/// `base`, or `base#2`, `base#3`... the first not in `taken`, which
/// takes it: how unnamed limits and quota rules get names unique in their
/// domain.
pub(super) fn unique_name(base: String, taken: &mut HashSet<String>) -> String {
    let mut candidate = base.clone();
    let mut n = 1;
    while taken.contains(&candidate) {
        n += 1;
        candidate = format!("{base}#{n}");
    }
    taken.insert(candidate.clone());
    candidate
}

/// Names the rules of one domain: a rule whose `explicit[i]` is true keeps
/// its name (the caller checked they are unique); every other gets its
/// [`QuotaRule::default_name`], then `#n` (from 2) while that is the name
/// of another rule of the domain, as the limits' header names are made
/// unique.
pub(super) fn name_rules(rules: &mut [QuotaRule], explicit: &[bool]) {
    let is_explicit = |i: usize| explicit.get(i).copied().unwrap_or(false);
    let mut taken: HashSet<String> = rules
        .iter()
        .enumerate()
        .filter(|&(i, _)| is_explicit(i))
        .map(|(_, rule)| rule.name.clone())
        .collect();
    for (i, rule) in rules.iter_mut().enumerate() {
        if !is_explicit(i) {
            rule.name = unique_name(rule.default_name(), &mut taken);
        }
        if let Some(limit) = &mut rule.limit {
            limit.header_name.clone_from(&rule.name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Config, ConfigChanges, LoadOptions};
    use super::*;
    use std::time::Duration;

    const GOOD: &str = "\
domain: edge
quota_buckets:
  - name: checkout
    bucket_id: { route: checkout, tenant: \"*\" }
    absent: [beta]
    rate_limit: { unit: minute, requests_per_unit: 600 }
  - bucket_id:
      tenant: acme
      route: \"api/*\"
    rate_limit: { window: 10s, requests_per_unit: 5, algorithm: gcra, burst: 2 }
  - bucket_id: { route: checkout }
    rate_limit: { unlimited: true }
  - rate_limit: { unit: second, requests_per_unit: 0 }
";

    fn domain(text: &str) -> Domain {
        Config::parse_domain("q.yaml", text).unwrap()
    }

    /// Every error of `text`, as `slidegate check` prints them.
    fn errors(text: &str) -> Vec<String> {
        match Config::parse_all([("q.yaml".to_owned(), text.to_owned())], &LoadOptions::default()) {
            Ok(_) => Vec::new(),
            Err(errors) => errors.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn a_good_file_without_descriptors() {
        let d = domain(GOOD);
        assert!(d.rules.is_empty());
        let names: Vec<&str> = d.quota_rules.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["checkout", "route.tenant_acme", "route_checkout", "*"]);
        let first = &d.quota_rules[0];
        assert_eq!(
            first.bucket_id,
            [
                ("route".to_owned(), ValuePattern::Exact("checkout".to_owned())),
                ("tenant".to_owned(), ValuePattern::Wildcard("*".to_owned())),
            ]
        );
        assert_eq!(first.absent, ["beta"]);
        assert_eq!((first.line, first.column), (3, 5));
        let limit = first.limit.as_ref().unwrap();
        assert_eq!((limit.requests_per_unit, limit.window), (600, Duration::from_secs(60)));
        assert_eq!(limit.header_name, "checkout");
        // Sorted by key, whatever the file's order.
        let second = &d.quota_rules[1];
        assert_eq!(second.bucket_id[0].0, "route");
        let limit = second.limit.as_ref().unwrap();
        assert_eq!(limit.window, Duration::from_secs(10));
        assert_eq!(limit.algorithm, slidegate_core::Algorithm::Gcra { burst: 2 });
        assert_eq!(limit.header_name, "route.tenant_acme");
        // Unlimited: no limit; 0: a limit that refuses everything.
        assert_eq!(d.quota_rules[2].limit, None);
        let deny = d.quota_rules[3].limit.as_ref().unwrap();
        assert_eq!((deny.requests_per_unit, deny.policy), (0, None));
        assert!(d.quota_rules[3].bucket_id.is_empty());
    }

    #[test]
    fn matching_exact_any_absent_first_wins_and_catch_all() {
        let d = domain(GOOD);
        let found = |id: &[(&str, &str)]| d.find_quota(id).map(|(i, r)| (i, r.name.as_str()));
        // `*`: any value, the key present; other keys may be anything.
        assert_eq!(found(&[("route", "checkout"), ("tenant", "t1")]), Some((0, "checkout")));
        assert_eq!(
            found(&[("tenant", ""), ("route", "checkout"), ("x", "y")]),
            Some((0, "checkout"))
        );
        // `absent`: the first rule is passed over, the third matches.
        assert_eq!(
            found(&[("route", "checkout"), ("tenant", "t1"), ("beta", "1")]),
            Some((2, "route_checkout"))
        );
        // No tenant: not the first.
        assert_eq!(found(&[("route", "checkout")]), Some((2, "route_checkout")));
        // A wildcard inside a value.
        assert_eq!(
            found(&[("route", "api/v1"), ("tenant", "acme")]),
            Some((1, "route.tenant_acme"))
        );
        assert_eq!(found(&[("route", "api/v1"), ("tenant", "acme2")]), Some((3, "*")));
        // The catch-all takes the rest, an empty id too.
        assert_eq!(found(&[("other", "x")]), Some((3, "*")));
        assert_eq!(found(&[]), Some((3, "*")));
        let without =
            domain("domain: edge\nquota_buckets:\n  - bucket_id: { a: b }\n    rate_limit: { unlimited: true }\n");
        assert_eq!(without.find_quota(&[("a", "c")]), None);
        assert!(without.quota_rules[0].matches(&[("a", "b")]));
        // A domain without quota_buckets has none.
        let plain = domain("domain: p\n");
        assert!(plain.quota_rules.is_empty() && plain.find_quota(&[("a", "b")]).is_none());
    }

    #[test]
    fn default_names_are_unique_in_the_domain() {
        let d = domain(
            "domain: e\nquota_buckets:\n  - { bucket_id: { a: x }, rate_limit: { unlimited: true } }\n  \
             - { bucket_id: { a: x }, absent: [b], rate_limit: { unlimited: true } }\n  \
             - { name: \"a_x#3\", rate_limit: { unlimited: true } }\n  \
             - { bucket_id: { a: x, c: \"*\" }, rate_limit: { unlimited: true } }\n  \
             - { bucket_id: { a: x }, rate_limit: { unlimited: true } }\n  \
             - { absent: [z], rate_limit: { unlimited: true } }\n  \
             - { rate_limit: { unlimited: true } }\n",
        );
        let names: Vec<&str> = d.quota_rules.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["a_x", "a_x#2", "a_x#3", "a_x.c", "a_x#4", "*", "*#2"]);
    }

    #[test]
    fn every_error_with_its_place_and_key_path() {
        let text = "\
domain: edge
quota_buckets:
  - name: a
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - bucket_id: { route: { x: 1 }, \"\": v, tenant: \"\" }
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - bucket_id: { k: v }
    absent: [k, j]
    bucketid: {}
  - name: b
    absent: [j, j]
    rate_limit: { unit: fortnight, requests_per_unit: 1, name: n }
  - name: a
    rate_limit: { unlimited: true }
  - just a string
  - name: \"\"
    absent: x
    rate_limit: 5
";
        assert_eq!(
            errors(text),
            [
                "q.yaml:5:25: quota_buckets[1].bucket_id.route: expected a value (exact, with `*` wildcards, or \"*\" \
                 for any), found a map",
                "q.yaml:5:35: quota_buckets[1].bucket_id.\"\": an empty key matches no bucket id",
                "q.yaml:5:50: quota_buckets[1].bucket_id.tenant: must not be empty: a bucket id's values never are \
                 (\"*\" matches any value)",
                "q.yaml:9:5: quota_buckets[2].bucketid: unknown key, expected one of: name, bucket_id, absent, \
                 rate_limit",
                "q.yaml:7:5: quota_buckets[2].rate_limit: missing: give the bucket's limit, or `{ unlimited: true }`",
                "q.yaml:8:14: quota_buckets[2].absent[0]: `k` is also in `bucket_id`: a key cannot be both required \
                 and absent",
                "q.yaml:11:17: quota_buckets[3].absent[1]: `j` is listed twice",
                "q.yaml:12:58: quota_buckets[3].rate_limit.name: unknown key, expected one of: unit, \
                 requests_per_unit, unlimited, algorithm, window, buckets, weighting, burst, epsilon",
                "q.yaml:12:25: quota_buckets[3].rate_limit.unit: unknown unit `fortnight`, expected one of: second, \
                 minute, hour, day, week, month, year",
                "q.yaml:13:11: quota_buckets[4].name: quota bucket rule `a` is already defined at line 3 column 11",
                "q.yaml:15:5: quota_buckets[5]: expected a map with `bucket_id` and `rate_limit`, found `just a \
                 string`",
                "q.yaml:16:11: quota_buckets[6].name: must not be empty",
                "q.yaml:17:13: quota_buckets[6].absent: expected a list, found `x`",
                "q.yaml:18:17: quota_buckets[6].rate_limit: expected a map, found `5`",
            ]
        );
        assert_eq!(
            errors("domain: e\nquota_buckets: { a: b }\n"),
            ["q.yaml:2:16: quota_buckets: expected a list, found a map"]
        );
    }

    #[test]
    fn merged_files_share_names_and_know_their_files() {
        let a = "domain: e\nquota_buckets:\n  - { name: n, rate_limit: { unlimited: true } }\n  \
                 - { bucket_id: { k: v }, rate_limit: { unlimited: true } }\n";
        let b = "domain: e\nquota_buckets:\n  - { bucket_id: { k: v }, rate_limit: { unlimited: true } }\n";
        let merge = LoadOptions::default().merge_domains(true);
        let texts = |second: &str| {
            [
                ("a.yaml".to_owned(), a.to_owned()),
                ("b.yaml".to_owned(), second.to_owned()),
            ]
        };
        let config = Config::parse_all(texts(b), &merge).unwrap();
        let d = config.domain("e").unwrap();
        let names: Vec<&str> = d.quota_rules.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["n", "k_v", "k_v#2"]);
        assert_eq!(config.quota_rule_file("e", 1), Some("a.yaml"));
        assert_eq!(config.quota_rule_file("e", 2), Some("b.yaml"));
        assert_eq!(config.quota_rule_file("e", 3), None);
        let twice = "domain: e\nquota_buckets:\n  - { name: n, rate_limit: { unlimited: true } }\n";
        let errors = Config::parse_all(texts(twice), &merge).unwrap_err();
        assert_eq!(
            errors[0].to_string(),
            "b.yaml:3:5: quota_buckets[0].name: quota bucket rule `n` is already defined in domain `e`, in a.yaml \
             at line 3"
        );
    }

    #[test]
    fn with_algorithm_recounts_quota_rules() {
        let config = Config::parse("q.yaml", GOOD).unwrap();
        let log = config.with_algorithm(slidegate_core::Algorithm::SlidingLog).unwrap();
        let rules = &log.domain("edge").unwrap().quota_rules;
        let limit = rules[1].limit.as_ref().unwrap();
        assert_eq!(limit.algorithm, slidegate_core::Algorithm::SlidingLog);
        assert_eq!(
            limit.quota.as_ref().map(|q| q.policy().algorithm()),
            Some(slidegate_core::Algorithm::SlidingLog)
        );
        assert_eq!(
            (rules[2].limit.as_ref(), rules[1].name.as_str()),
            (None, "route.tenant_acme")
        );
    }

    #[test]
    fn reloads_see_quota_rules() {
        let config = |text: &str| Config::parse("q.yaml", text).unwrap();
        let old = config(GOOD);
        let new = config(
            &GOOD
                .replace("600", "60")
                .replace("  - rate_limit: { unit: second, requests_per_unit: 0 }\n", ""),
        );
        let changes = ConfigChanges::between(&old, &new);
        assert_eq!(changes.quota_rules_changed, ["edge: checkout"]);
        assert_eq!(changes.quota_rules_removed, ["edge: *"]);
        assert!(changes.quota_rules_added.is_empty() && changes.limits_changed.is_empty());
        assert_eq!(
            changes.to_string(),
            "-1 quota rule (edge: *), ~1 quota rule (edge: checkout)"
        );
        // Emptied of its quota rules, a domain would limit nothing.
        assert!(Config::check_reload(&old, &config("domain: edge\n")).is_err());
        let unlimited = config("domain: edge\nquota_buckets:\n  - rate_limit: { unlimited: true }\n");
        assert!(Config::check_reload(&old, &unlimited).is_ok());
    }
}
