//! The configs of the repository's `examples/` folder: every one of them
//! loads as `serve` would load it, without a warning (but `warnings.yaml`,
//! which is there to show them, with exactly its four), and what its
//! comments say a request gets is what the engine decides, on a manual
//! clock.
//!
//! The folder is listed, so a new example is loaded at once; it must also
//! be named in [`CHECKED`], with a test of its claims below.

use serde_json::json;
use slidegate_core::ManualClock;
use slidegate_memory::Budget;
use slidegate_server::config::{Config, LoadOptions, Unit};
use slidegate_server::engine::{Answer, Code, Descriptor, Engine, InputLimits, Request, Settings, check_config_with};
use slidegate_server::metrics::Metrics;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Every example, by its name in `examples/`, with a test of its claims
/// below.
const CHECKED: &[&str] = &[
    "algorithms.yaml",
    "anchors.yaml",
    "basic.yaml",
    "merged",
    "metadata.yaml",
    "metric-names.yaml",
    "nested.yaml",
    "redis.yaml",
    "replaces.yaml",
    "several-limits.yaml",
    "shadow-and-quota.yaml",
    "warnings.yaml",
    "wildcards.yaml",
];

/// The one example that exists to show warnings.
const WARNS: &str = "warnings.yaml";

fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

/// Every example of the folder, sorted by name: each YAML file, and each
/// folder (one domain in several files, loaded merged). `README.md` and
/// names starting with a dot are skipped; anything else is a mistake.
fn every_example() -> Vec<(String, PathBuf)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(examples_dir()).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().into_string().unwrap();
        if name == "README.md" || name.starts_with('.') {
            continue;
        }
        let path = entry.path();
        assert!(
            path.is_dir() || name.ends_with(".yaml") || name.ends_with(".yml"),
            "examples/{name} is neither a YAML file nor a folder of them"
        );
        found.push((name, path));
    }
    found.sort();
    found
}

/// Loads one example as `slidegate check --config PATH` does: a folder
/// with `--merge-domain-config`.
fn load(path: &Path) -> Config {
    let options = LoadOptions::default().merge_domains(path.is_dir());
    Config::load_with(&[path.to_path_buf()], &options).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn load_example(name: &str) -> Config {
    load(&examples_dir().join(name))
}

const SECOND: u64 = 1_000_000_000;

/// An example's one domain served by an engine on the in-memory store, on a
/// manual clock starting at 0 (so that windows and buckets start at
/// multiples of their width), with the answers counted in the metrics.
struct Example {
    engine: Engine,
    clock: ManualClock,
    domain: String,
    metrics: Metrics,
    runtime: tokio::runtime::Runtime,
}

impl Example {
    fn new(name: &str) -> Example {
        Example::with_settings(name, Settings::default())
    }

    fn with_settings(name: &str, settings: Settings) -> Example {
        let config = load_example(name);
        let domains: Vec<String> = config.domains().map(|d| d.name.clone()).collect();
        let [domain] = &domains[..] else {
            panic!("{name}: one domain expected, found {domains:?}")
        };
        let domain = domain.clone();
        let clock = ManualClock::new(0);
        let engine = Engine::new(
            config,
            clock.clone(),
            Budget::bytes(1 << 20),
            Budget::bytes(1 << 20),
            InputLimits::default(),
        )
        .with_settings(settings);
        Example {
            engine,
            clock,
            domain,
            metrics: Metrics::new(),
            runtime: tokio::runtime::Builder::new_current_thread().build().unwrap(),
        }
    }

    /// Sets the clock to `t` after its start.
    fn at(&self, t: Duration) {
        self.clock.set(u64::try_from(t.as_nanos()).unwrap());
    }

    /// The answer to one request of these descriptors.
    fn answer(&self, descriptors: &[&[(&str, &str)]]) -> Answer {
        let request = Request {
            domain: self.domain.clone(),
            descriptors: descriptors
                .iter()
                .map(|entries| Descriptor {
                    entries: entries
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect(),
                    ..Descriptor::default()
                })
                .collect(),
            hits_addend: 0,
        };
        let answer = self.runtime.block_on(self.engine.decide(&request)).unwrap();
        self.metrics.answer_request(&self.domain, &request, &answer);
        answer
    }

    /// Whether one request of one descriptor passes.
    fn passes(&self, entries: &[(&str, &str)]) -> bool {
        self.answer(&[entries]).overall == Code::Ok
    }

    /// Sends `n` requests of `descriptors` at the clock's instant; how many
    /// passed, asserting that they were the first ones (none passes after
    /// a refusal).
    fn admitted_of(&self, descriptors: &[&[(&str, &str)]], n: usize) -> usize {
        let passed: Vec<bool> = (0..n).map(|_| self.answer(descriptors).overall == Code::Ok).collect();
        let admitted = passed.iter().take_while(|p| **p).count();
        assert!(
            passed[admitted..].iter().all(|p| !p),
            "{descriptors:?}: a request passed after a refusal: {passed:?}"
        );
        admitted
    }

    /// [`Example::admitted_of`] for one descriptor.
    fn admitted(&self, entries: &[(&str, &str)], n: usize) -> usize {
        self.admitted_of(&[entries], n)
    }

    /// The value of the series `slidegate_rule{stat}_hits_total` of `rule`.
    fn rule_stat(&self, stat: &str, rule: &str) -> Option<u64> {
        let text = self.metrics.render(&self.engine.stats(), false);
        let series = format!(
            "slidegate_rule{stat}_hits_total{{domain=\"{}\",rule=\"{rule}\"}} ",
            self.domain
        );
        text.lines()
            .find_map(|l| l.strip_prefix(&series))
            .map(|v| v.parse().unwrap())
    }
}

// ---------------------------------------------------------------- loading

#[test]
fn every_example_loads_without_a_warning() {
    let examples = every_example();
    assert!(!examples.is_empty());
    for (name, path) in &examples {
        let config = load(path);
        if name == WARNS {
            assert_eq!(config.warnings().len(), 4, "{name}: {:?}", config.warnings());
        } else {
            assert_eq!(config.warnings(), [], "{name} loads with warnings");
        }
        assert!(config.domains().next().is_some(), "{name} has no domain");
    }
}

#[test]
fn every_example_has_its_claims_checked() {
    let found: BTreeSet<String> = every_example().into_iter().map(|(name, _)| name).collect();
    let checked: BTreeSet<String> = CHECKED.iter().map(|n| (*n).to_owned()).collect();
    assert_eq!(
        found, checked,
        "every example needs a test of what its comments claim, named in CHECKED"
    );
}

/// `slidegate serve --config examples/` serves every file at once: one
/// domain each, no two alike, and only the warnings of `warnings.yaml`.
#[test]
fn the_whole_folder_loads_at_once() {
    let config = Config::load(&[examples_dir()]).unwrap();
    let files = every_example().iter().filter(|(_, path)| path.is_file()).count();
    assert_eq!(config.domains().count(), files);
    assert_eq!(config.warnings().len(), 4);
    for warning in config.warnings() {
        assert!(warning.file.ends_with(WARNS), "{warning}");
    }
}

// ---------------------------------------------------------------- basic.yaml

#[test]
fn basic() {
    let e = Example::new("basic.yaml");
    let alice = [("user", "alice")];
    assert_eq!(e.admitted(&alice, 7), 5);
    // Another user has 5 of their own.
    assert_eq!(e.admitted(&[("user", "bob")], 7), 5);
    // The default window: 8 buckets of ⌈60 s / 7⌉; with the five at the
    // start of a bucket, the wait is the whole 8 buckets, exactly.
    let bucket = (60 * SECOND).div_ceil(7);
    let answer = e.answer(&[&alice]);
    assert_eq!(answer.overall, Code::OverLimit);
    assert_eq!(answer.statuses[0].until_reset, Some(Duration::from_nanos(8 * bucket)));
    assert_eq!(8 * bucket, 68_571_428_576);
    e.at(Duration::from_nanos(8 * bucket - 1));
    assert!(!e.passes(&alice));
    e.at(Duration::from_nanos(8 * bucket));
    assert_eq!(e.admitted(&alice, 7), 5);

    assert_eq!(e.admitted(&[("user", "ci-bot")], 102), 100);
    assert!(!e.passes(&[("remote_address", "203.0.113.66")]));
    assert_eq!(e.admitted(&[("remote_address", "198.51.100.7")], 22), 20);

    let answer = e.answer(&[&[("path", "/healthz")], &[("path", "/index.html")]]);
    assert_eq!(answer.overall, Code::Ok);
    let [healthz, other] = &answer.statuses[..] else {
        panic!("{answer:?}")
    };
    assert_eq!((healthz.applied.len(), healthz.remaining), (0, u64::from(u32::MAX)));
    assert_eq!(healthz.metric, None, "an unlimited rule keeps no stats");
    assert_eq!((other.applied.len(), other.remaining), (0, 0));
}

// ---------------------------------------------------------------- algorithms.yaml

#[test]
fn algorithms() {
    let e = Example::new("algorithms.yaml");

    // sliding_window, 16 buckets of 4 s.
    let search = [("search", "shoes")];
    assert_eq!(e.admitted(&search, 32), 30);
    let answer = e.answer(&[&search]);
    assert_eq!(answer.statuses[0].until_reset, Some(Duration::from_secs(64)));
    e.at(Duration::from_nanos(64 * SECOND - 1));
    assert!(!e.passes(&search));
    e.at(Duration::from_secs(64));
    assert!(e.passes(&search));

    // The two-bucket estimate: at 1:30 the previous minute's 10 weigh 5.
    let e = Example::new("algorithms.yaml");
    let upload = [("upload", "u1")];
    assert_eq!(e.admitted(&upload, 12), 10);
    e.at(Duration::from_secs(90));
    assert_eq!(e.admitted(&upload, 7), 5);

    // fixed_window: 10 at 0:59, 10 more at 1:00.
    let e = Example::new("algorithms.yaml");
    let export = [("export", "x")];
    e.at(Duration::from_secs(59));
    assert_eq!(e.admitted(&export, 12), 10);
    e.at(Duration::from_secs(60));
    assert_eq!(e.admitted(&export, 12), 10);

    // sliding_log: refused until exactly 10 minutes after the first.
    let e = Example::new("algorithms.yaml");
    let noon = Duration::from_secs(12 * 3600);
    let reset = [("password_reset", "alice@example.com")];
    let minutes = |m: u64| noon + Duration::from_secs(60 * m);
    for m in [0, 3, 6] {
        e.at(minutes(m));
        assert!(e.passes(&reset), "12:{m:02}");
    }
    e.at(minutes(10) - Duration::from_nanos(1));
    assert!(!e.passes(&reset));
    e.at(minutes(10));
    assert!(e.passes(&reset));
    let answer = e.answer(&[&reset]);
    assert_eq!(
        (answer.overall, answer.statuses[0].until_reset),
        (Code::OverLimit, Some(Duration::from_secs(180)))
    );

    // gcra: a burst of 5, then one a second.
    let e = Example::new("algorithms.yaml");
    let start = Duration::from_secs(20_000);
    let webhook = [("webhook", "w1")];
    e.at(start);
    assert_eq!(e.admitted(&webhook, 5), 5);
    let answer = e.answer(&[&webhook]);
    assert_eq!(
        (answer.overall, answer.statuses[0].until_reset),
        (Code::OverLimit, Some(Duration::from_secs(1)))
    );
    e.at(start + Duration::from_secs(1) - Duration::from_nanos(1));
    assert!(!e.passes(&webhook));
    e.at(start + Duration::from_secs(1));
    assert_eq!(e.admitted(&webhook, 3), 1);
    e.at(start + Duration::from_secs(2));
    assert_eq!(e.admitted(&webhook, 3), 1);

    // exponential_histogram: 100 at once, the 101st refused.
    assert_eq!(e.admitted(&[("event", "signup")], 102), 100);

    // And it has no Redis form: `check --redis` names that limit.
    let errors = check_config_with(&load_example("algorithms.yaml"), &slidegate_redis::supports_quota);
    let e = errors.unwrap_err();
    assert!(
        e.file.ends_with("algorithms.yaml") && e.message.contains("descriptor `event`"),
        "{e}"
    );
    assert!(e.message.contains("exponential_histogram has no Redis form"), "{e}");
}

// ---------------------------------------------------------------- several-limits.yaml

/// How many of four attempts pass at 0, 35, 70 and 105 s.
fn login_bursts(e: &Example) -> Vec<usize> {
    [0, 35, 70, 105]
        .iter()
        .map(|&t| {
            e.at(Duration::from_secs(t));
            e.admitted(&[("account", "a")], 4)
        })
        .collect()
}

#[test]
fn several_limits() {
    let e = Example::new("several-limits.yaml");
    assert_eq!(login_bursts(&e), [3, 3, 3, 1]);
    // The 30 s window has room at 105 s: the hourly limit refuses.
    let answer = e.answer(&[&[("account", "a")]]);
    let status = &answer.statuses[0];
    assert_eq!(status.applied[status.tightest.unwrap()].name, "logins_per_hour");
    // The 30 s window empties within its 8 buckets.
    assert!(8 * (30 * SECOND).div_ceil(7) < 35 * SECOND);
    // Counting the refused attempts spends the hour by the third burst.
    let counting = Example::with_settings(
        "several-limits.yaml",
        Settings {
            stop_increment_when_over_limit: false,
            ..Settings::default()
        },
    );
    assert_eq!(login_bursts(&counting), [3, 3, 2, 0]);

    let phone = [("phone_number", "+15550100")];
    assert_eq!(e.admitted(&phone, 3), 2);
    let answer = e.answer(&[&phone]);
    assert_eq!(answer.statuses[0].applied[0].unit, None, "a window has no unit");

    let token = [("api_token", "t1")];
    let answer = e.answer(&[&token]);
    let units: Vec<Option<Unit>> = answer.statuses[0].applied.iter().map(|a| a.unit).collect();
    assert_eq!(units, [Some(Unit::Second), Some(Unit::Day)]);
    assert_eq!(e.admitted(&token, 21), 19);
}

// ---------------------------------------------------------------- wildcards.yaml

#[test]
fn wildcards() {
    let e = Example::new("wildcards.yaml");
    assert_eq!(e.admitted(&[("path", "/api/v1/users/7")], 3), 2);
    assert_eq!(e.admitted(&[("path", "/api/v2/users/8")], 3), 2);

    for file in ["/downloads/a.iso", "/downloads/b.iso", "/downloads/c.iso"] {
        assert!(e.passes(&[("path", file)]), "{file}");
    }
    assert!(!e.passes(&[("path", "/downloads/d.iso")]));
    assert!(!e.passes(&[("path", "/downloads/a.iso")]));
    assert!(e.passes(&[("path", "/downloads/readme.txt")]));
    assert_eq!(e.admitted(&[("path", "/about")], 51), 50);
}

// ---------------------------------------------------------------- replaces.yaml

#[test]
fn replaces() {
    let e = Example::new("replaces.yaml");
    let free: [&[(&str, &str)]; 2] = [&[("account", "1")], &[("plan", "free"), ("account", "1")]];
    assert_eq!(e.admitted_of(&free, 12), 10);
    let premium: [&[(&str, &str)]; 2] = [&[("account", "2")], &[("plan", "premium"), ("account", "2")]];
    assert_eq!(e.admitted_of(&premium, 52), 50);
    let answer = e.answer(&premium);
    let [account, plan] = &answer.statuses[..] else {
        panic!("{answer:?}")
    };
    assert_eq!((account.applied.len(), account.remaining), (0, 0));
    assert_eq!(plan.applied[0].name, "premium_account");
}

// ---------------------------------------------------------------- shadow-and-quota.yaml

#[test]
fn shadow_and_quota() {
    let e = Example::new("shadow-and-quota.yaml");
    let client = [("client", "c1")];
    assert!(e.passes(&client) && e.passes(&client));
    let third = e.answer(&[&client]);
    assert_eq!(third.overall, Code::Ok);
    assert!(third.statuses[0].shadow_refused);
    assert_eq!(e.rule_stat("_shadow_mode", "client"), Some(1));

    let both: [&[(&str, &str)]; 2] = [&[("user", "u1")], &[("org", "o1")]];
    let answers: Vec<Answer> = (0..5).map(|_| e.answer(&both)).collect();
    let overall: Vec<Code> = answers.iter().map(|a| a.overall).collect();
    assert_eq!(overall, [Code::Ok, Code::Ok, Code::Ok, Code::Ok, Code::OverLimit]);
    // The 3rd passes with the user's own quota over.
    assert_eq!(answers[2].statuses[0].code, Code::OverLimit);
    assert_eq!(answers[2].statuses[1].code, Code::Ok);
}

// ---------------------------------------------------------------- metadata.yaml

#[test]
fn metadata() {
    let expected = json!({
        "owner": "payments-team",
        "runbook": "https://wiki.example.com/runbooks/merchant-limits",
        "tier": { "level": 2, "region": "eu" },
    });
    let e = Example::with_settings(
        "metadata.yaml",
        Settings {
            dynamic_metadata: true,
            ..Settings::default()
        },
    );
    let merchant = [("merchant", "m-1")];
    assert_eq!(e.admitted(&merchant, 30), 30);
    let refused = e.answer(&[&merchant]);
    assert_eq!(refused.overall, Code::OverLimit);
    assert_eq!(refused.statuses[0].metadata.as_ref(), Some(&expected));

    let quiet = Example::new("metadata.yaml");
    let answer = quiet.answer(&[&merchant]);
    assert_eq!((answer.overall, answer.statuses[0].metadata.as_ref()), (Code::Ok, None));
}

// ---------------------------------------------------------------- metric-names.yaml

#[test]
fn metric_names() {
    let e = Example::new("metric-names.yaml");
    e.answer(&[&[("client", "alice")], &[("client", "bob")]]);
    e.answer(&[&[("route", "checkout"), ("method", "POST")]]);
    e.answer(&[&[("page", "/products/42")]]);
    e.answer(&[&[("tenant", "acme"), ("operation", "export")]]);
    for (rule, hits) in [
        ("client", 2),
        ("route_checkout.method", 1),
        ("page_/products/*", 1),
        ("tenant_acme.operation_export", 1),
    ] {
        assert_eq!(e.rule_stat("", rule), Some(hits), "{rule}");
    }
    assert_eq!(e.rule_stat("", "client_alice"), None);
}

// ---------------------------------------------------------------- nested.yaml

#[test]
fn nested() {
    let e = Example::new("nested.yaml");
    let one = [("message_type", "marketing"), ("to_number", "+15550100")];
    assert_eq!(e.admitted(&one, 6), 5);
    assert_eq!(
        e.admitted(&[("message_type", "marketing"), ("to_number", "+15550101")], 6),
        5
    );
    let answer = e.answer(&[
        &[("message_type", "marketing")],
        &[("message_type", "transactional"), ("to_number", "+15550100")],
    ]);
    assert_eq!(answer.overall, Code::Ok);
    assert!(answer.statuses.iter().all(|s| s.applied.is_empty()), "{answer:?}");

    let method = |tenant, method| [("tenant", tenant), ("api", "orders"), ("method", method)];
    assert_eq!(e.admitted(&method("t1", "DELETE"), 3), 2);
    assert_eq!(e.admitted(&method("t1", "GET"), 101), 100);
    assert_eq!(e.admitted(&method("t1", "PATCH"), 21), 20);
    assert_eq!(e.admitted(&method("t2", "DELETE"), 3), 2);
}

// ---------------------------------------------------------------- anchors.yaml

#[test]
fn anchors() {
    let config = load_example("anchors.yaml");
    let domain = config.domain("catalog").unwrap();
    // The limit, but for its name in the headers (its rule's key).
    let limit_of = |entries: &[(&str, &str)]| {
        let mut limit = domain.find(entries).unwrap().rule.limits[0].clone();
        limit.header_name.clear();
        limit
    };
    assert_eq!(limit_of(&[("product_read", "p")]), limit_of(&[("review_read", "p")]));
    let search = limit_of(&[("search", "q")]);
    assert_eq!((search.unit, search.requests_per_unit), (Some(Unit::Second), 30));

    let e = Example::new("anchors.yaml");
    assert_eq!(e.admitted(&[("review_read", "c1")], 4), 3);
    assert_eq!(e.admitted(&[("product_read", "c1")], 4), 3);
    assert_eq!(e.admitted(&[("search", "c1")], 31), 30);
    for list in ["cart", "wishlist"] {
        let item = [(list, "l1"), ("item", "sku-1")];
        let answers: Vec<Answer> = (0..11).map(|_| e.answer(&[&item])).collect();
        assert!(answers.iter().all(|a| a.overall == Code::Ok), "{list}");
        let shadowed: Vec<bool> = answers.iter().map(|a| a.statuses[0].shadow_refused).collect();
        assert_eq!(shadowed.iter().filter(|s| **s).count(), 1, "{list}: {shadowed:?}");
        assert!(shadowed[10], "{list}: the 11th");
    }
}

// ---------------------------------------------------------------- redis.yaml

#[test]
fn redis() {
    let config = load_example("redis.yaml");
    check_config_with(&config, &slidegate_redis::supports_quota).unwrap();

    // 100,000 a day would have no Redis form.
    let path = examples_dir().join("redis.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.matches("requests_per_unit: 90000 ").count(), 1);
    let raised = Config::parse(
        "redis.yaml",
        &text.replace("requests_per_unit: 90000 ", "requests_per_unit: 100000 "),
    )
    .unwrap();
    let e = check_config_with(&raised, &slidegate_redis::supports_quota).unwrap_err();
    assert!(e.message.contains("descriptor `api_key`"), "{e}");

    // The same decisions in memory: a gcra burst of 20, then one every 100 ms.
    let e = Example::new("redis.yaml");
    let device = [("device", "d1")];
    assert_eq!(e.admitted(&device, 20), 20);
    let answer = e.answer(&[&device]);
    assert_eq!(
        (answer.overall, answer.statuses[0].until_reset),
        (Code::OverLimit, Some(Duration::from_millis(100)))
    );
    e.at(Duration::from_millis(100));
    assert_eq!(e.admitted(&device, 2), 1);
    assert_eq!(e.admitted(&[("remote_address", "192.0.2.1")], 101), 100);
}

// ---------------------------------------------------------------- merged/

#[test]
fn merged() {
    let dir = examples_dir().join("merged");
    let config = load(&dir);
    let files: Vec<&str> = config.files_of("storefront").collect();
    assert_eq!(files.len(), 2);
    assert!(
        files[0].ends_with("checkout.yaml") && files[1].ends_with("search.yaml"),
        "{files:?}"
    );
    let keys: Vec<&str> = config
        .domain("storefront")
        .unwrap()
        .rules
        .iter()
        .map(|r| r.key.as_str())
        .collect();
    assert_eq!(keys, ["customer", "remote_address"]);

    // Without merging, the second file is refused, naming the first.
    let e = Config::load(&[dir]).unwrap_err();
    assert!(e.file.ends_with("search.yaml"), "{e}");
    assert!(
        e.message.contains("already defined in") && e.message.contains("checkout.yaml"),
        "{e}"
    );

    let e = Example::new("merged");
    assert_eq!(e.admitted(&[("customer", "c1"), ("route", "/checkout")], 6), 5);
    assert_eq!(
        e.admitted(&[("remote_address", "192.0.2.9"), ("route", "/search")], 21),
        20
    );
}

// ---------------------------------------------------------------- warnings.yaml

#[test]
fn warnings() {
    let config = load_example(WARNS);
    let mut warnings: Vec<_> = config
        .warnings()
        .iter()
        .map(|w| (w.line, w.column, w.key.clone().unwrap_or_default(), w.message.clone()))
        .collect();
    warnings.sort();
    let expected = [
        (13, 39, "rate_limit.replaces[0].name", "replaces nothing"),
        (20, 25, "rate_limit.name", "also used at line 18"),
        (25, 36, "rate_limit.requests_per_unit", "ignored"),
        (31, 7, "rate_limit.requests_per_unit", "read as 0"),
    ];
    assert_eq!(warnings.len(), expected.len(), "{warnings:?}");
    for (got, (line, column, key, says)) in warnings.iter().zip(expected) {
        assert_eq!((got.0, got.1, got.2.as_str()), (line, column, key), "{got:?}");
        assert!(got.3.contains(says), "{got:?} does not say {says:?}");
    }

    let e = Example::new(WARNS);
    // The misspelt `replaces` drops nothing: per_user still applies.
    let answer = e.answer(&[&[("user", "u1")], &[("beta_user", "u1")]]);
    assert_eq!(answer.statuses[0].applied[0].name, "per_user");
    let internal = e.answer(&[&[("internal", "x")]]);
    assert_eq!(internal.statuses[0].remaining, u64::from(u32::MAX));
    assert!(!e.passes(&[("batch", "nightly")]));
}
