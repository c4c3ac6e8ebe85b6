//! `slidegate check`: loads a config exactly as `serve` would, without
//! serving it, so that a bad file is found before a pod starts on it.

use clap::Args as ClapArgs;
use slidegate_server::config::{Config, LoadOptions, Rule};
use slidegate_server::engine::check_config_with;
use std::io::Write;
use std::path::PathBuf;

#[derive(ClapArgs, Debug)]
pub(crate) struct Args {
    /// A YAML config file or a folder of them, as `serve --config` takes;
    /// repeat for more. In the environment, separate paths with `:`.
    #[arg(long, env = "SLIDEGATE_CONFIG", value_delimiter = ':', required = true)]
    config: Vec<PathBuf>,
    /// Check too that every limit has a Redis form, as `serve --redis`
    /// needs (nothing is connected).
    #[arg(long)]
    redis: bool,
    /// Merge the files of one domain, as `serve --merge-domain-config`.
    #[arg(long, env = "MERGE_DOMAIN_CONFIG", action = clap::ArgAction::Set, default_value_t = false, value_parser = clap::builder::BoolishValueParser::new(), value_name = "BOOL")]
    merge_domain_config: bool,
}

/// Loads the config; prints its warnings (on stderr) and a line per domain
/// (on `out`), or fails with the first error (file, line, column, key).
pub(crate) fn run(args: &Args, out: &mut impl Write) -> anyhow::Result<()> {
    let options = LoadOptions::default().merge_domains(args.merge_domain_config);
    let config = Config::load_with(&args.config, &options)?;
    if args.redis {
        check_config_with(&config, &slidegate_redis::supports_quota)?;
    }
    for warning in config.warnings() {
        eprintln!("warning: {warning}");
    }
    let mut domains = 0;
    for domain in config.domains() {
        domains += 1;
        let (rules, limits) = count(&domain.rules);
        let files: Vec<&str> = config.files_of(&domain.name).collect();
        writeln!(
            out,
            "domain `{}` ({}): {rules} descriptors, {limits} limits",
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
    Ok(())
}

/// The descriptors and limits of `rules` and their children.
fn count(rules: &[Rule]) -> (usize, usize) {
    rules.iter().fold((0, 0), |(r, l), rule| {
        let (cr, cl) = count(&rule.children);
        (r + 1 + cr, l + rule.limits.len() + cl)
    })
}
