//! `slidegate check`: loads a config exactly as `serve` would, without
//! serving it, so that a bad file is found before a pod starts on it; and
//! `--explain`: which rule a descriptor matches and which limits apply, and
//! which quota bucket rule the same entries match as a bucket id.

use clap::Args as ClapArgs;
use slidegate_server::config::{Config, ConfigError, Domain, Limit, LoadOptions, Rule};
use slidegate_server::engine::check_config_all;
use std::io::Write;
use std::path::PathBuf;

#[derive(ClapArgs, Debug)]
pub(crate) struct Args {
    /// A YAML config file or a folder of them, as `serve --config` takes;
    /// repeat for more. A folder without a config file, or an empty file,
    /// is an error, as it is for `serve`. In the environment, separate
    /// paths with `:`.
    #[arg(long, env = "SLIDEGATE_CONFIG", value_delimiter = ':', required = true)]
    config: Vec<PathBuf>,
    /// Check too that every limit has a Redis form, as `serve --redis`
    /// needs (nothing is connected).
    #[arg(long)]
    redis: bool,
    /// Merge the files of one domain, as `serve --merge-domain-config`.
    #[arg(long, env = "MERGE_DOMAIN_CONFIG", action = clap::ArgAction::SetTrue, value_parser = clap::builder::BoolishValueParser::new())]
    merge_domain_config: bool,
    /// The largest config file read, in bytes, as `serve --max-config-bytes`.
    #[arg(long, env = "SLIDEGATE_MAX_CONFIG_BYTES", default_value_t = 64 << 20, value_name = "BYTES")]
    max_config_bytes: u64,
    /// After checking, say which rule the descriptor DOMAIN KEY=VALUE...
    /// matches and which limits apply to it (nothing is counted); when the
    /// domain has quota_buckets, also which quota rule the entries match
    /// as a bucket id.
    #[arg(long, num_args = 2.., value_names = ["DOMAIN", "KEY=VALUE"])]
    explain: Option<Vec<String>>,
}

/// The errors were printed: exit 1 without printing them again.
#[derive(Debug)]
pub(crate) struct Reported(pub(crate) usize);

impl std::fmt::Display for Reported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the config has {} errors", self.0)
    }
}

impl std::error::Error for Reported {}

/// Loads the config; prints its warnings (on stderr) and a line per domain
/// (on `out`), or every error (file, line, column, key), one per line on
/// stderr, and fails with [`Reported`].
pub(crate) fn run(args: &Args, out: &mut impl Write) -> anyhow::Result<()> {
    let explain = args.explain.as_deref().map(parse_explain).transpose()?;
    let options = LoadOptions::default()
        .merge_domains(args.merge_domain_config)
        .max_file_bytes(args.max_config_bytes);
    let config = match Config::load_all(&args.config, &options) {
        Ok(config) => config,
        Err(errors) => return Err(report(&errors)),
    };
    if args.redis {
        let errors = check_config_all(&config, &slidegate_redis::supports_quota);
        if !errors.is_empty() {
            return Err(report(&errors));
        }
    }
    for warning in config.warnings() {
        eprintln!("warning: {warning}");
    }
    let mut domains = 0;
    for domain in config.domains() {
        domains += 1;
        let (rules, limits) = count(&domain.rules);
        let files: Vec<&str> = config.files_of(&domain.name).collect();
        let quota = match domain.quota_rules.len() {
            0 => String::new(),
            n => format!(", {n} quota rules"),
        };
        writeln!(
            out,
            "domain `{}` ({}): {rules} descriptors, {limits} limits{quota}",
            domain.name,
            files.join(", ")
        )?;
    }
    writeln!(
        out,
        "ok: {domains} domains, {} warnings{}",
        config.warnings().len(),
        if args.redis {
            ", every limit has a Redis form"
        } else {
            ""
        }
    )?;
    if let Some((domain, entries)) = explain {
        let domain = config
            .domain(&domain)
            .ok_or_else(|| anyhow::anyhow!("--explain: no domain `{domain}` in the config"))?;
        explain_descriptor(&config, domain, &entries, out)?;
        if !domain.quota_rules.is_empty() {
            explain_bucket(&config, domain, &entries, out)?;
        }
    }
    Ok(())
}

/// Prints every error on its own line; the error that says so.
pub(crate) fn report(errors: &[ConfigError]) -> anyhow::Error {
    for e in errors {
        eprintln!("error: {e}");
    }
    Reported(errors.len()).into()
}

/// `--explain DOMAIN KEY=VALUE...`: the domain and the entries.
fn parse_explain(words: &[String]) -> anyhow::Result<(String, Vec<(String, String)>)> {
    let (domain, entries) = words
        .split_first()
        .ok_or_else(|| anyhow::anyhow!("--explain: give a domain"))?;
    let entries = entries
        .iter()
        .map(|entry| {
            entry
                .split_once('=')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .filter(|(k, _)| !k.is_empty())
                .ok_or_else(|| anyhow::anyhow!("--explain: `{entry}` is not KEY=VALUE"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok((domain.clone(), entries))
}

/// Which rule `entries` match in `domain` and what it applies, as `serve`
/// would decide it (the limits of one descriptor, `replaces` among them
/// applied).
fn explain_descriptor(
    config: &Config,
    domain: &Domain,
    entries: &[(String, String)],
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let pairs: Vec<(&str, &str)> = entries.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let shown: Vec<String> = entries.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let shown = shown.join(", ");
    let Some(matched) = domain.find(&pairs) else {
        writeln!(
            out,
            "[{shown}] matches no rule of domain `{}`: not limited",
            domain.name
        )?;
        return Ok(());
    };
    let rule = matched.rule;
    let file = top_level_file(config, domain, &pairs).unwrap_or("<config>");
    let pattern = match &rule.value {
        Some(value) => format!("{}={}", rule.key, value.as_str()),
        None => rule.key.clone(),
    };
    writeln!(
        out,
        "[{shown}] matches `{pattern}` at {file}:{}:{}",
        rule.line, rule.column
    )?;
    if rule.unlimited {
        writeln!(out, "  unlimited: every request is admitted")?;
        return Ok(());
    }
    if rule.limits.is_empty() {
        writeln!(out, "  the rule has no limit: not limited")?;
        return Ok(());
    }
    let replaced: Vec<&str> = rule
        .limits
        .iter()
        .flat_map(|l| l.replaces.iter().map(String::as_str))
        .collect();
    for limit in &rule.limits {
        let name = limit.name.as_deref().map(|n| format!(" `{n}`")).unwrap_or_default();
        let what = limit_text(limit);
        let dropped = limit.name.as_deref().is_some_and(|n| replaced.contains(&n));
        let mode = [
            (rule.shadow_mode, " (shadow mode: never refuses)"),
            (rule.quota_mode, " (quota mode)"),
            (dropped, " (replaced by another limit of this rule: does not apply)"),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, text)| *text)
        .collect::<String>();
        writeln!(out, "  limit{name}: {what}{mode}")?;
    }
    writeln!(out, "  counter key: {}", matched.counter_key(&domain.name, &pairs))?;
    Ok(())
}

/// Which quota rule of `domain` the entries match as a bucket id (Envoy's
/// bucket map: a key given twice counts once, its first value), and its
/// limit.
fn explain_bucket(
    config: &Config,
    domain: &Domain,
    entries: &[(String, String)],
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let id: Vec<(&str, &str)> = entries.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let shown: Vec<String> = entries.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let shown = shown.join(", ");
    let Some((index, rule)) = domain.find_quota(&id) else {
        writeln!(
            out,
            "bucket id {{{shown}}}: no quota bucket rule matches: Envoy keeps its no_assignment_behavior"
        )?;
        return Ok(());
    };
    let file = config
        .quota_rule_file(&domain.name, index)
        .or_else(|| config.file_of(&domain.name))
        .unwrap_or("<config>");
    writeln!(
        out,
        "bucket id {{{shown}}} matches quota rule `{}` at {file}:{}:{}",
        rule.name, rule.line, rule.column
    )?;
    match &rule.limit {
        Some(limit) if limit.requests_per_unit == 0 => {
            writeln!(out, "  limit: 0 requests: DENY_ALL, every request refused")?;
        }
        Some(limit) => writeln!(
            out,
            "  limit: {} per {}, shared between the Envoys that report the bucket: together at most that in any window of its length",
            limit.requests_per_unit,
            slidegate_core::duration::format_duration(limit.window),
        )?,
        None => writeln!(out, "  unlimited: ALLOW_ALL, every request admitted")?,
    }
    Ok(())
}

/// A limit as `--explain` shows it: its policy, or that it refuses
/// everything.
fn limit_text(limit: &Limit) -> String {
    match &limit.policy {
        Some(policy) => policy.to_string(),
        None => "0 requests: refuses everything".to_owned(),
    }
}

/// The file of the top-level rule a descriptor starts in (for a merged
/// domain, the file that defines it).
fn top_level_file<'c>(config: &'c Config, domain: &Domain, entries: &[(&str, &str)]) -> Option<&'c str> {
    let (key, value) = entries.first()?;
    // As `Domain::find` picks at a level: the exact value, a pattern, the
    // key alone.
    let rules = &domain.rules;
    let index = rules
        .iter()
        .position(|r| r.key == *key && r.value.as_ref().is_some_and(|p| p.as_str() == *value))
        .or_else(|| {
            rules
                .iter()
                .position(|r| r.key == *key && r.value.as_ref().is_some_and(|p| p.matches(value)))
        })
        .or_else(|| rules.iter().position(|r| r.key == *key && r.value.is_none()))?;
    config
        .rule_file(&domain.name, index)
        .or_else(|| config.file_of(&domain.name))
}

/// The descriptors and limits of `rules` and their children.
fn count(rules: &[Rule]) -> (usize, usize) {
    rules.iter().fold((0, 0), |(r, l), rule| {
        let (cr, cl) = count(&rule.children);
        (r + 1 + cr, l + rule.limits.len() + cl)
    })
}
