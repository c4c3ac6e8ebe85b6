//! `deploy/prometheus/slidegate.rules.yaml` and `deploy/grafana/slidegate.json`
//! against a real Prometheus (Debian's `prometheus` package) scraping real
//! `slidegate serve` processes:
//!
//! - `promtool check rules` and `promtool test rules` (the unit tests of
//!   every alert, `slidegate.rules.test.yaml`) pass;
//! - under a short load that trips every alert that can be tripped on one
//!   machine (a scrape target down, invalid requests, refusals, a bad
//!   config reloaded, Redis killed under load, a store too small for its
//!   keys), those alerts fire in Prometheus's `/api/v1/alerts`, every
//!   recording rule returns data, and so does every query of every
//!   dashboard panel and variable.
//!
//! Prometheus scrapes and evaluates every second here, and its copy of the
//! rules has each `for:` set to `0s`: the conditions are the shipped ones,
//! and how long each must hold is what `promtool test rules` checks.
//! `SlidegateUnavailableAnswers`, `SlidegateSlowAnswers`,
//! `SlidegateShedding` and `SlidegateQuotaBucketsUnanswered` are left to
//! those unit tests: the first three cannot be tripped here on purpose
//! without faking the server, and the last needs Envoys' quota streams.

use crate::common::{self, listening_on, next_line, serve_command, spawn_logging};
use crate::{deploy, read, shown, tool};
use serde_json::Value;
use slidegate_conformance::redis::RedisServer;
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::Duration;

const INSTALL: &str = "install Debian's `prometheus` package (apt-get install prometheus), which brings promtool";

#[test]
fn promtool_checks_the_rules_and_their_unit_tests_pass() {
    let dir = deploy("prometheus");
    let check = tool("promtool", INSTALL)
        .args(["check", "rules", "slidegate.rules.yaml"])
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(check.status.success(), "{}", shown(&check));
    let test = tool("promtool", INSTALL)
        .args(["test", "rules", "slidegate.rules.test.yaml"])
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(test.status.success(), "{}", shown(&test));
    // Every alert has a unit test of its own.
    let tests = read("prometheus/slidegate.rules.test.yaml");
    for alert in rule_names("alert") {
        assert!(
            tests.contains(&format!("alertname: {alert}\n")),
            "slidegate.rules.test.yaml has no test of {alert}"
        );
    }
}

/// The names of the rules of `kind` (`alert` or `record`) in the shipped
/// rules file.
fn rule_names(kind: &str) -> Vec<String> {
    let text = read("prometheus/slidegate.rules.yaml");
    let doc = marked_yaml::parse_yaml(0, &text).unwrap();
    let mut names = Vec::new();
    for group in doc.as_mapping().unwrap().get_sequence("groups").unwrap().iter() {
        for rule in group.as_mapping().unwrap().get_sequence("rules").unwrap().iter() {
            if let Some(name) = rule.as_mapping().unwrap().get_scalar(kind) {
                names.push(name.as_str().to_owned());
            }
        }
    }
    assert!(!names.is_empty(), "no {kind} rule");
    names
}

/// The alerts the load below trips, each with a label that says where.
const TRIPPED: &[(&str, &str, &str)] = &[
    ("SlidegateDown", "job", "slidegate"),
    ("SlidegateInvalidRequests", "job", "slidegate"),
    ("SlidegateRefusalsJumped", "domain", "demo"),
    ("SlidegateConfigReloadFailing", "job", "slidegate"),
    ("SlidegateRedisErrors", "job", "slidegate"),
    ("SlidegateFailurePolicyInForce", "source", "fail_open"),
    ("SlidegateEvicting", "job", "slidegate-memory"),
];

/// The alerts no load here can trip (see the module's docs).
const UNIT_TESTED_ONLY: &[&str] = &[
    "SlidegateUnavailableAnswers",
    "SlidegateSlowAnswers",
    "SlidegateShedding",
    "SlidegateQuotaBucketsUnanswered",
];

#[test]
fn a_real_prometheus_fires_the_alerts_and_answers_every_rule_and_panel() {
    // Every alert is either tripped below or said to be unit-tested only.
    let tripped: BTreeSet<&str> = TRIPPED.iter().map(|(name, _, _)| *name).collect();
    for alert in rule_names("alert") {
        assert!(
            tripped.contains(alert.as_str()) || UNIT_TESTED_ONLY.contains(&alert.as_str()),
            "{alert} is neither tripped by this test nor listed as unit-tested only"
        );
    }
    tool("prometheus", INSTALL);

    let dir = common::fresh("deploy-prometheus");
    // slidegate on Redis, the shared limit: 5 a minute per client.
    let redis = RedisServer::start();
    let config = config_folder(&dir.join("config"), "demo", 5);
    let config_arg = config.to_str().unwrap();
    let redis_url = redis.url();
    let mut shared = Server::start(&["--config", config_arg, "--redis", &redis_url]);
    // slidegate in memory, with a store far too small for its keys.
    let flood = config_folder(&dir.join("flood"), "flood", 10);
    let memory = Server::start(&["--config", flood.to_str().unwrap(), "--memory-mib", "1"]);
    // A target where nothing listens: an instance that is down.
    let down = free_port();

    let prometheus = Prometheus::start(
        &dir,
        &[
            ("slidegate", vec![shared.http.clone(), format!("127.0.0.1:{down}")]),
            ("slidegate-memory", vec![memory.http.clone()]),
        ],
    );
    // Let Prometheus see every counter at its start, before the load.
    prometheus.wait_for(
        "count(count by (instance) (slidegate_requests_total)) == 2",
        "both servers scraped",
    );

    // Refusals: 20 requests of one client against 5 a minute.
    for _ in 0..20 {
        shared.decide("demo", &[("client", "alice")]);
    }
    // Invalid requests: bodies that do not parse.
    for _ in 0..10 {
        let answer = common::request(&shared.http, "POST", "/json", "{not json");
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    }
    // A store of 1 MiB holds under 20,000 counters: 25,600 keys evict.
    for batch in 0..400 {
        let keys: Vec<String> = (0..64).map(|i| format!("{batch}-{i}")).collect();
        let entries: Vec<(&str, &str)> = keys.iter().map(|k| ("client", k.as_str())).collect();
        memory.decide_each("flood", &entries);
    }
    // A config that does not load, reloaded.
    std::fs::write(
        config.join("broken.yaml"),
        "domain: broken\ndescriptors:\n  - key: k\n    rate_limit: 7\n",
    )
    .unwrap();
    common::signal("HUP", shared.child());
    shared.wait_log("config reload failed");
    // Redis gone under load: the failure policy (fail_open) decides.
    redis.kill();
    for _ in 0..20 {
        shared.decide("demo", &[("client", "bob")]);
    }

    // The alerts fire (checked after each of Prometheus's scrapes, 60 at
    // most: it evaluates the rules every second, as it scrapes).
    let mut scrapes = 0;
    let missing = loop {
        let alerts = prometheus.get("/api/v1/alerts");
        let firing: Vec<&Value> = alerts["data"]["alerts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["state"] == "firing")
            .collect();
        let missing: Vec<&str> = TRIPPED
            .iter()
            .filter(|(name, label, value)| {
                !firing
                    .iter()
                    .any(|a| a["labels"]["alertname"] == *name && a["labels"][*label] == *value)
            })
            .map(|(name, _, _)| *name)
            .collect();
        if missing.is_empty() || scrapes == 60 {
            break (missing, alerts);
        }
        prometheus.next_scrape();
        scrapes += 1;
    };
    assert!(missing.0.is_empty(), "not firing: {:?}\n{:#}", missing.0, missing.1);
    // The runbook reaches Alertmanager with each alert.
    for alert in missing.1["data"]["alerts"].as_array().unwrap() {
        assert!(
            alert["annotations"]["runbook"].as_str().is_some_and(|r| r.len() > 80),
            "{alert:#}"
        );
    }

    // Every recording rule has data. (A series born with the load, such
    // as a rule's, has a rate only after two scrapes and an evaluation:
    // each query is waited for, bounded.)
    for record in rule_names("record") {
        prometheus.wait_for(&record, &format!("the recording rule {record} has data"));
    }

    // Every query of the dashboard has data: its variables' and its panels'.
    let dashboard: Value = serde_json::from_str(&read("grafana/slidegate.json")).unwrap();
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        if variable["type"] != "query" {
            continue;
        }
        let definition = variable["definition"].as_str().unwrap();
        let (metric, label) = label_values(definition);
        let query = grafana(&format!("group by ({label}) ({metric})"));
        prometheus.wait_for(&query, &format!("the variable {} finds values", variable["name"]));
    }
    let mut queries = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap();
            prometheus.wait_for(&grafana(expr), &format!("the panel {} has data", panel["title"]));
            queries += 1;
        }
    }
    assert!(queries >= 20, "{queries} panel queries");
    drop(prometheus);
    common::terminate(memory.stop());
    common::terminate(shared.stop());
    let _ = std::fs::remove_dir_all(dir);
}

/// `folder`, made, with one config file: the domain `domain`, `limit` a
/// minute per `client`.
fn config_folder(folder: &Path, domain: &str, limit: u32) -> std::path::PathBuf {
    std::fs::create_dir_all(folder).unwrap();
    std::fs::write(
        folder.join(format!("{domain}.yaml")),
        format!("domain: {domain}\ndescriptors:\n  - key: client\n    rate_limit: {{ unit: minute, requests_per_unit: {limit} }}\n"),
    )
    .unwrap();
    folder.to_path_buf()
}

/// The metric and the label of a Grafana `label_values(METRIC, LABEL)`.
fn label_values(definition: &str) -> (&str, &str) {
    let inner = definition
        .strip_prefix("label_values(")
        .and_then(|d| d.strip_suffix(')'))
        .unwrap_or_else(|| panic!("not a label_values query: {definition}"));
    let (metric, label) = inner.rsplit_once(',').unwrap();
    (metric.trim(), label.trim())
}

/// A dashboard query as Grafana sends it with every job and domain chosen
/// ("All", whose value the variables set to `.*`) and a rate interval of a
/// minute (four scrapes at Grafana's default, 60 here).
fn grafana(expr: &str) -> String {
    let expr = expr
        .replace("$__rate_interval", "1m")
        .replace("$job", ".*")
        .replace("$domain", ".*");
    assert!(!expr.contains('$'), "a variable this test does not know: {expr}");
    expr
}

/// A port on 127.0.0.1 where nothing listens (it was free a moment ago).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A `slidegate serve` of this test, killed if the test fails.
struct Server {
    child: Option<Child>,
    log: std::sync::mpsc::Receiver<String>,
    lines: Vec<String>,
    http: String,
}

impl Server {
    fn start(flags: &[&str]) -> Server {
        let (child, log) = spawn_logging(serve_command(&["--drain-delay", "0s"]).args(flags));
        let mut lines = Vec::new();
        let (http, _) = next_line(&log, &mut lines, listening_on);
        Server {
            child: Some(child),
            log,
            lines,
            http,
        }
    }

    /// One `POST /json` of one descriptor; its answer must be a decision
    /// (200 or 429).
    fn decide(&self, domain: &str, entries: &[(&str, &str)]) {
        let answer = common::request(&self.http, "POST", "/json", &body(domain, &[entries]));
        assert!(
            answer.starts_with("HTTP/1.1 200") || answer.starts_with("HTTP/1.1 429"),
            "{answer}"
        );
    }

    /// One `POST /json` with a descriptor of one entry for each of
    /// `entries`.
    fn decide_each(&self, domain: &str, entries: &[(&str, &str)]) {
        let descriptors: Vec<&[(&str, &str)]> = entries.iter().map(std::slice::from_ref).collect();
        let answer = common::request(&self.http, "POST", "/json", &body(domain, &descriptors));
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }

    fn wait_log(&mut self, text: &str) {
        next_line(&self.log, &mut self.lines, |line| line.contains(text).then_some(()));
    }

    /// The process, for the test to stop (SIGTERM) and check.
    fn stop(mut self) -> Child {
        self.child.take().unwrap()
    }

    fn child(&self) -> &Child {
        self.child.as_ref().unwrap()
    }
}

impl Drop for Server {
    /// A test that fails leaves no server behind.
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A `POST /json` body.
fn body(domain: &str, descriptors: &[&[(&str, &str)]]) -> String {
    let descriptors: Vec<Value> = descriptors
        .iter()
        .map(|entries| {
            let entries: Vec<Value> = entries
                .iter()
                .map(|(key, value)| serde_json::json!({ "key": key, "value": value }))
                .collect();
            serde_json::json!({ "entries": entries })
        })
        .collect();
    serde_json::json!({ "domain": domain, "descriptors": descriptors }).to_string()
}

/// A Prometheus of this test, on a free loopback port, killed when dropped.
struct Prometheus {
    child: Child,
    addr: String,
    /// One message per scrape of the test's own target (job `ticks`):
    /// what the test waits on, Prometheus's cadence rather than the
    /// clock's.
    scrapes: Receiver<()>,
}

impl Prometheus {
    /// Scrapes `jobs` (name, targets) every second and evaluates the
    /// shipped rules every second, each `for:` set to `0s`.
    fn start(dir: &Path, jobs: &[(&str, Vec<String>)]) -> Prometheus {
        let rules = read("prometheus/slidegate.rules.yaml");
        let mut changed = 0;
        let rules: String = rules
            .lines()
            .map(|line| {
                let trimmed = line.trim_start();
                if trimmed.starts_with("for: ") {
                    changed += 1;
                    format!("{}for: 0s\n", &line[..line.len() - trimmed.len()])
                } else {
                    format!("{line}\n")
                }
            })
            .collect();
        assert_eq!(changed, rule_names("alert").len(), "every alert has a `for:`");
        std::fs::write(dir.join("rules.yaml"), rules).unwrap();
        let mut config = String::from(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: [rules.yaml]\nscrape_configs:\n",
        );
        let (ticks, scrapes) = scraped_target();
        let ticks = [("ticks", vec![ticks])];
        for (job, targets) in jobs.iter().chain(&ticks) {
            let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
            config.push_str(&format!(
                "  - job_name: {job}\n    static_configs:\n      - targets: [{}]\n",
                targets.join(", ")
            ));
        }
        std::fs::write(dir.join("prometheus.yml"), config).unwrap();
        let check = tool("promtool", INSTALL)
            .args(["check", "config", "prometheus.yml"])
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(check.status.success(), "{}", shown(&check));

        let addr = format!("127.0.0.1:{}", free_port());
        let child = Command::new("prometheus")
            .current_dir(dir)
            .args([
                "--config.file=prometheus.yml".to_owned(),
                "--storage.tsdb.path=data".to_owned(),
                format!("--web.listen-address={addr}"),
            ])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("prometheus.log")).unwrap())
            .spawn()
            .unwrap();
        let prometheus = Prometheus { child, addr, scrapes };
        // It scrapes once its storage is open; ready soon after.
        let mut scrapes = 0;
        while get(&prometheus.addr, "/-/ready").map(|(status, _)| status) != Some(200) {
            assert!(
                scrapes < 30,
                "Prometheus is not ready after 30 scrapes: {}",
                std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default()
            );
            prometheus.next_scrape();
            scrapes += 1;
        }
        prometheus
    }

    /// Waits for Prometheus's next scrape of the test's target (bounded:
    /// 10 s without one fails, as it scrapes every second).
    fn next_scrape(&self) {
        self.scrapes
            .recv_timeout(Duration::from_secs(10))
            .expect("Prometheus scrapes the test's target every second");
    }

    /// A GET of the API, its JSON.
    fn get(&self, path: &str) -> Value {
        let (status, body) = get(&self.addr, path).expect("Prometheus answers");
        assert_eq!(status, 200, "{path}: {body}");
        serde_json::from_str(&body).unwrap()
    }

    /// An instant query's result vector.
    fn query(&self, expr: &str) -> Vec<Value> {
        let answer = self.get(&format!("/api/v1/query?query={}", encode(expr)));
        assert_eq!(answer["status"], "success", "{expr}: {answer}");
        answer["data"]["result"].as_array().unwrap().clone()
    }

    /// Waits until `expr` has a result, asking after each scrape (30 at
    /// most).
    fn wait_for(&self, expr: &str, what: &str) {
        let mut scrapes = 0;
        while self.query(expr).is_empty() {
            assert!(scrapes < 30, "not within 30 scrapes: {what} ({expr})");
            self.next_scrape();
            scrapes += 1;
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A scrape target of the test's own, on a free loopback port: its
/// address, and a message for each scrape, answered with no sample (a
/// thread accepts them until the test's process ends).
fn scraped_target() -> (String, Receiver<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (scraped, scrapes) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            // The request's head, then an empty exposition; the connection
            // closes, so each scrape is a new one.
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).is_ok_and(|n| n == 1) {
                head.push(byte[0]);
            }
            let _ = stream.write_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
            );
            if scraped.send(()).is_err() {
                return;
            }
        }
    });
    (addr, scrapes)
}

/// One HTTP/1.0 GET (so that Prometheus answers without chunks and
/// closes): the status and the body; `None` if nothing answers.
fn get(addr: &str, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    let (head, body) = answer.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some((status, body.to_owned()))
}

/// `text` percent-encoded for a query string.
fn encode(text: &str) -> String {
    let mut out = String::new();
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[test]
fn the_dashboard_reads_as_grafana_expects() {
    let dashboard: Value = serde_json::from_str(&read("grafana/slidegate.json")).unwrap();
    assert_eq!(dashboard["uid"], "slidegate");
    let mut ids = BTreeSet::new();
    let mut seen: Vec<(u64, u64, u64, u64)> = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        let title = panel["title"].as_str().unwrap();
        assert!(!title.is_empty());
        assert!(ids.insert(panel["id"].as_u64().unwrap()), "id twice: {title}");
        let grid = &panel["gridPos"];
        let (x, y, w, h) = (
            grid["x"].as_u64().unwrap(),
            grid["y"].as_u64().unwrap(),
            grid["w"].as_u64().unwrap(),
            grid["h"].as_u64().unwrap(),
        );
        assert!(x + w <= 24, "{title} is wider than the dashboard");
        // No two panels overlap.
        for &(ox, oy, ow, oh) in &seen {
            assert!(
                x >= ox + ow || ox >= x + w || y >= oy + oh || oy >= y + h,
                "{title} overlaps another panel"
            );
        }
        seen.push((x, y, w, h));
        if panel["type"] == "row" {
            continue;
        }
        assert!(panel["description"].as_str().is_some_and(|d| !d.is_empty()), "{title}");
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{title}");
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{title} has no query");
        for target in targets {
            // Every query follows the job selector, and names only metrics
            // slidegate exports (or Prometheus's `up`).
            let expr = target["expr"].as_str().unwrap();
            assert!(expr.contains(r#"job=~"$job""#), "{title}: {expr}");
        }
    }
}

/// Every metric a rule or a panel names is one `slidegate serve` exports
/// (or Prometheus's own `up`): read from a real `/metrics`.
#[test]
fn the_rules_and_the_dashboard_name_only_exported_metrics() {
    // A rule's series appear with its first decision.
    let dir = config_folder(&common::fresh("deploy-exported"), "demo", 5);
    let server = Server::start(&["--config", dir.to_str().unwrap()]);
    server.decide("demo", &[("client", "alice")]);
    let metrics = common::request(&server.http, "GET", "/metrics", "");
    let exported: BTreeSet<String> = metrics
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty() && !l.starts_with("HTTP/") && !l.contains(": "))
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_owned)
        .collect();
    assert!(exported.contains("slidegate_requests_total"), "{metrics}");
    let texts = [read("prometheus/slidegate.rules.yaml"), read("grafana/slidegate.json")];
    for text in &texts {
        for name in metric_names(text) {
            assert!(
                name == "up" || exported.contains(&name),
                "{name} is not exported by slidegate serve"
            );
        }
    }
    common::terminate(server.stop());
    let _ = std::fs::remove_dir_all(dir);
}

/// The metric names (`slidegate_…`, `process_…`, `up{`) a text uses.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = text.as_bytes();
    for prefix in ["slidegate_", "process_"] {
        let mut from = 0;
        while let Some(at) = text[from..].find(prefix) {
            let start = from + at;
            let end = start
                + text[start..]
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(text.len() - start);
            // Skip a name inside a longer word (`slidegate:..._slidegate_x`)
            // and recording rules' names (`slidegate:`).
            let inside = start > 0 && (bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
            if !inside {
                names.insert(text[start..end].to_owned());
            }
            from = end;
        }
    }
    names
}
