//! The compose demo (deploy/compose), checked without Docker or Envoy:
//! the route's `rate_limits` actions of envoy.yaml, evaluated for a few
//! requests as Envoy evaluates them (slidegate-server's model of Envoy's
//! actions), produce the descriptors meant, and `slidegate check --explain`
//! puts each on the rule of config/demo.yaml meant for it; the names, ports
//! and paths that compose.yaml, envoy.yaml and prometheus.yml share agree,
//! and every file compose mounts is in the repository; and the demo config,
//! served as compose serves it (with a Redis), refuses a request's
//! descriptors the time after its limit, which is the 429 `curl` shows
//! through Envoy.

#[path = "../../../slidegate-server/tests/common/envoy_actions.rs"]
mod envoy_actions;

use crate::{common, deploy, read, root, shown, tool};
use envoy_actions::{Entries, Request};
use serde_json::Value;
use slidegate_conformance::redis::RedisServer;
use std::path::PathBuf;

/// A file of deploy/ as JSON (every scalar a string).
fn yaml(path: &str) -> Value {
    let node = marked_yaml::parse_yaml(0, read(path)).unwrap_or_else(|e| panic!("deploy/{path}: {e}"));
    envoy_actions::yaml_to_json(&node)
}

fn list(value: &Value) -> &[Value] {
    value.as_array().map_or(&[], Vec::as_slice)
}

fn text(value: &Value) -> &str {
    value.as_str().unwrap_or_else(|| panic!("not a string: {value}"))
}

/// The parts of envoy.yaml the demo depends on.
struct Envoy {
    /// The ratelimit filter's config.
    filter: Value,
    /// The names of the front listener's HTTP filters, in order.
    filters: Vec<String>,
    /// The front listener's port.
    port: u16,
    /// Its route that has `rate_limits`.
    route: Value,
    /// The clusters, by name.
    clusters: Vec<Value>,
    /// The admin interface's port.
    admin_port: u16,
}

fn port(socket: &Value) -> u16 {
    text(&socket["socket_address"]["port_value"]).parse().unwrap()
}

fn envoy() -> Envoy {
    let config = yaml("compose/envoy.yaml");
    let mut fronts = Vec::new();
    for listener in list(&config["static_resources"]["listeners"]) {
        for chain in list(&listener["filter_chains"]) {
            for network in list(&chain["filters"]) {
                let hcm = &network["typed_config"];
                let http: Vec<String> = list(&hcm["http_filters"])
                    .iter()
                    .map(|f| text(&f["name"]).to_owned())
                    .collect();
                if let Some(filter) = list(&hcm["http_filters"])
                    .iter()
                    .find(|f| f["name"] == "envoy.filters.http.ratelimit")
                {
                    fronts.push((listener, hcm, filter["typed_config"].clone(), http));
                }
            }
        }
    }
    let [(listener, hcm, filter, filters)] = &fronts[..] else {
        panic!("one listener with the rate limit filter, not {}", fronts.len())
    };
    let routes: Vec<&Value> = list(&hcm["route_config"]["virtual_hosts"])
        .iter()
        .flat_map(|host| list(&host["routes"]))
        .filter(|route| route["route"].get("rate_limits").is_some())
        .collect();
    let [route] = routes[..] else {
        panic!("one route with rate_limits, not {}", routes.len())
    };
    Envoy {
        filter: filter.clone(),
        filters: filters.clone(),
        port: port(&listener["address"]),
        route: route.clone(),
        clusters: list(&config["static_resources"]["clusters"]).to_vec(),
        admin_port: port(&config["admin"]["address"]),
    }
}

impl Envoy {
    /// The descriptors Envoy sends for `request`: one per `rate_limits`
    /// entry whose actions all produce their entry.
    fn descriptors(&self, request: &Request) -> Vec<Entries> {
        list(&self.route["route"]["rate_limits"])
            .iter()
            .filter_map(|limit| envoy_actions::descriptor(&envoy_actions::actions(&limit["actions"]), request))
            .collect()
    }

    fn cluster(&self, name: &str) -> &Value {
        self.clusters
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no cluster {name} in envoy.yaml"))
    }
}

/// The demo's slidegate config: its text parsed with places, and as JSON.
struct Limits {
    node: marked_yaml::Node,
}

impl Limits {
    fn load() -> Limits {
        let node = marked_yaml::parse_yaml(0, read("compose/config/demo.yaml")).unwrap();
        Limits { node }
    }

    fn domain(&self) -> String {
        envoy_actions::yaml_to_json(&self.node)["domain"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// The rule at `path` (each step `key` or `key=value`, from the top):
    /// where `slidegate check --explain` says it is written (`line:column`
    /// of its `key`), and its limit as `--explain` prints it (`5 per 60s`).
    fn rule(&self, path: &[&str]) -> (String, String) {
        let mut level = self.node.as_mapping().unwrap();
        let mut found = None;
        for step in path {
            let (key, value) = step.split_once('=').unwrap_or((step, ""));
            let descriptors = level.get_sequence("descriptors").expect("descriptors");
            let rule = descriptors
                .iter()
                .filter_map(|d| d.as_mapping())
                .find(|d| {
                    d.get_scalar("key").map(|k| k.as_str()) == Some(key)
                        && d.get_scalar("value").map_or("", |v| v.as_str()) == value
                })
                .unwrap_or_else(|| panic!("no rule {step} in demo.yaml"));
            found = Some(rule);
            level = rule;
        }
        let rule = found.expect("a path of one step or more");
        let (key, _) = rule.iter().find(|(k, _)| k.as_str() == "key").unwrap();
        let at = key.span().start().unwrap();
        let limit = envoy_actions::yaml_to_json(&rule.get_node("rate_limit").unwrap().clone());
        let seconds = match text(&limit["unit"]) {
            "second" => 1,
            "minute" => 60,
            "hour" => 3600,
            "day" => 86400,
            other => panic!("unit {other}"),
        };
        (
            format!("{}:{}", at.line(), at.column()),
            format!("{} per {seconds}s", text(&limit["requests_per_unit"])),
        )
    }
}

fn entries(pairs: &[(&str, &str)]) -> Entries {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

/// `slidegate check --explain` of one descriptor against the demo's
/// config folder: the place of the rule it matches (`line:column`) and its
/// limit (`5 per 60s`).
fn explain(domain: &str, descriptor: &Entries) -> (String, String) {
    let folder = deploy("compose/config");
    let mut command = common::slidegate();
    command
        .arg("check")
        .arg("--config")
        .arg(&folder)
        .args(["--explain", domain]);
    for (key, value) in descriptor {
        command.arg(format!("{key}={value}"));
    }
    let out = command.output().unwrap();
    assert!(out.status.success(), "{}", shown(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut lines = stdout.lines().skip_while(|l| !l.starts_with('['));
    let matched = lines
        .next()
        .unwrap_or_else(|| panic!("no explanation: {}", shown(&out)));
    let (_, place) = matched
        .split_once("` at ")
        .unwrap_or_else(|| panic!("{descriptor:?} matches no rule: {matched}"));
    let (file, at) = place.split_once(".yaml:").unwrap();
    assert!(file.ends_with("demo"), "{matched}");
    let limit = lines
        .next()
        .and_then(|l| l.trim().strip_prefix("limit: "))
        .unwrap_or_else(|| panic!("no limit: {}", shown(&out)));
    let limit = limit.split(" by ").next().unwrap();
    (at.to_owned(), limit.to_owned())
}

/// A descriptor and the rule of demo.yaml meant for it (its path of
/// `key` or `key=value` steps).
type Meant = (Entries, Vec<&'static str>);

/// The requests of the demo, the descriptors Envoy makes of them, and the
/// rule of demo.yaml each descriptor is meant for.
fn demo_requests() -> Vec<(&'static str, Request, Vec<Meant>)> {
    let client = [("remote_address", "10.0.0.1")];
    vec![
        (
            "GET /",
            Request::get(),
            vec![(entries(&client), vec!["remote_address"])],
        ),
        (
            "GET / with an API key",
            Request::get().header("x-api-key", "alice"),
            vec![
                (entries(&client), vec!["remote_address"]),
                (entries(&[("api_key", "alice")]), vec!["api_key"]),
            ],
        ),
        (
            "POST /login",
            Request::new("POST", "/login"),
            vec![
                (entries(&client), vec!["remote_address"]),
                (
                    entries(&[("path", "/login"), ("remote_address", "10.0.0.1")]),
                    vec!["path=/login", "remote_address"],
                ),
            ],
        ),
        (
            "POST /login from another client, with an API key",
            Request::new("POST", "/login")
                .from("192.0.2.7")
                .header("x-api-key", "bob"),
            vec![
                (entries(&[("remote_address", "192.0.2.7")]), vec!["remote_address"]),
                (entries(&[("api_key", "bob")]), vec!["api_key"]),
                (
                    entries(&[("path", "/login"), ("remote_address", "192.0.2.7")]),
                    vec!["path=/login", "remote_address"],
                ),
            ],
        ),
        (
            "GET /login?next=/ (not the login path: the query is part of :path)",
            Request::new("GET", "/login?next=/"),
            vec![(entries(&client), vec!["remote_address"])],
        ),
    ]
}

/// Each demo request makes the descriptors meant, and each lands on its
/// rule, with that rule's limit.
#[test]
fn each_request_of_the_demo_lands_on_the_rule_meant_for_it() {
    let envoy = envoy();
    let limits = Limits::load();
    assert_eq!(
        text(&envoy.filter["domain"]),
        limits.domain(),
        "the filter's domain is the config's"
    );
    for (what, request, expected) in demo_requests() {
        let want: Vec<Entries> = expected.iter().map(|(e, _)| e.clone()).collect();
        assert_eq!(envoy.descriptors(&request), want, "{what}: the descriptors Envoy sends");
        for (descriptor, rule) in &expected {
            assert_eq!(
                explain(&limits.domain(), descriptor),
                limits.rule(rule),
                "{what}: {descriptor:?} should land on {rule:?}"
            );
        }
    }
}

/// The filter asks slidegate as the demo needs: the rate limit filter
/// before the router, over gRPC v3 to the cluster `slidegate` over HTTP/2,
/// letting requests through when slidegate cannot answer, with the
/// x-ratelimit headers.
#[test]
fn the_filter_asks_the_slidegate_cluster_over_http2() {
    let envoy = envoy();
    assert_eq!(
        envoy.filters,
        ["envoy.filters.http.ratelimit", "envoy.filters.http.router"],
        "the rate limit filter, then the router"
    );
    let filter = &envoy.filter;
    assert_eq!(filter["failure_mode_deny"], "false");
    assert_eq!(filter["enable_x_ratelimit_headers"], "DRAFT_VERSION_03");
    let service = &filter["rate_limit_service"];
    assert_eq!(service["transport_api_version"], "V3");
    let cluster = envoy.cluster(text(&service["grpc_service"]["envoy_grpc"]["cluster_name"]));
    assert_eq!(cluster["name"], "slidegate");
    let options =
        &cluster["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"];
    assert!(
        options["explicit_http_config"].get("http2_protocol_options").is_some(),
        "gRPC needs HTTP/2 to the cluster: {cluster}"
    );
    // The route goes to a cluster (the rate limit filter asks nothing for a
    // direct_response route), which is defined.
    let upstream = text(&envoy.route["route"]["cluster"]);
    assert_ne!(upstream, "slidegate");
    envoy.cluster(upstream);
}

/// A bind mount of compose.yaml: the service, the host path (resolved
/// against deploy/compose), the container path.
#[derive(Debug)]
struct Mount {
    service: String,
    host: PathBuf,
    container: String,
}

fn mounts(compose: &Value) -> Vec<Mount> {
    let mut out = Vec::new();
    for (service, config) in compose["services"].as_object().unwrap() {
        for volume in list(&config["volumes"]) {
            let parts: Vec<&str> = text(volume).split(':').collect();
            let (host, container) = (parts[0], parts[1]);
            assert!(
                host.starts_with('.') || host.starts_with('/'),
                "{service}: {host} is a named volume"
            );
            out.push(Mount {
                service: service.clone(),
                host: deploy("compose").join(host),
                container: container.to_owned(),
            });
        }
    }
    out
}

/// The host path compose mounts where `service` sees `path`.
fn host_path(mounts: &[Mount], service: &str, path: &str) -> PathBuf {
    mounts
        .iter()
        .filter(|m| m.service == service)
        .find_map(|m| {
            let rest = path.strip_prefix(&m.container)?;
            match rest.strip_prefix('/') {
                _ if rest.is_empty() => Some(m.host.clone()),
                Some(inside) => Some(m.host.join(inside)),
                None => None,
            }
        })
        .unwrap_or_else(|| panic!("{service}: nothing is mounted at {path}"))
}

/// The value after `flag` in `command`.
fn flag<'a>(command: &'a [String], flag: &str) -> &'a str {
    let at = command
        .iter()
        .position(|a| a == flag)
        .unwrap_or_else(|| panic!("{flag} is not in {command:?}"));
    &command[at + 1]
}

fn address_port(address: &str) -> u16 {
    address
        .rsplit_once(':')
        .unwrap()
        .1
        .trim_end_matches('/')
        .parse()
        .unwrap()
}

/// slidegate's command in compose.yaml.
fn slidegate_command(compose: &Value) -> Vec<String> {
    list(&compose["services"]["slidegate"]["command"])
        .iter()
        .map(|a| text(a).to_owned())
        .collect()
}

/// The container ports a service publishes.
fn published(compose: &Value, service: &str) -> Vec<u16> {
    list(&compose["services"][service]["ports"])
        .iter()
        .map(|p| {
            let container = text(p).rsplit(':').next().unwrap();
            container.trim_end_matches("/tcp").parse().unwrap()
        })
        .collect()
}

/// compose.yaml, envoy.yaml and prometheus.yml name the same services,
/// ports and files; every file compose mounts is in the repository; the
/// Prometheus config, with its rule files where compose mounts them, is
/// what `promtool check config` accepts.
#[test]
fn compose_envoy_and_prometheus_agree() {
    let compose = yaml("compose/compose.yaml");
    let services: Vec<&str> = compose["services"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    for needed in ["envoy", "slidegate", "redis", "prometheus"] {
        assert!(services.contains(&needed), "no service {needed}: {services:?}");
    }
    let mounts = mounts(&compose);
    for mount in &mounts {
        assert!(
            mount.host.exists(),
            "{}: {} is not in the repository",
            mount.service,
            mount.host.display()
        );
    }

    // slidegate is built from deploy/Dockerfile with the repository's root
    // as context, and serves the mounted demo config.
    let build = &compose["services"]["slidegate"]["build"];
    let context = deploy("compose").join(text(&build["context"]));
    assert_eq!(
        std::fs::canonicalize(&context).unwrap(),
        std::fs::canonicalize(root()).unwrap()
    );
    assert_eq!(
        std::fs::canonicalize(context.join(text(&build["dockerfile"]))).unwrap(),
        std::fs::canonicalize(deploy("Dockerfile")).unwrap()
    );
    let command = slidegate_command(&compose);
    assert_eq!(command[0], "serve");
    let config = host_path(&mounts, "slidegate", flag(&command, "--config"));
    assert_eq!(
        std::fs::canonicalize(config).unwrap(),
        std::fs::canonicalize(deploy("compose/config")).unwrap()
    );
    let redis = flag(&command, "--redis");
    let host = redis
        .strip_prefix("redis://")
        .and_then(|r| r.split(':').next())
        .unwrap();
    assert!(services.contains(&host), "--redis {redis}: no service {host}");
    assert_eq!(address_port(redis), 6379, "Redis's port");
    let (http, grpc) = (
        address_port(flag(&command, "--http")),
        address_port(flag(&command, "--grpc")),
    );

    // Envoy reads envoy.yaml where the image's command reads its config,
    // reaches slidegate's gRPC port by its service name, and its front
    // listener is published.
    let envoy = envoy();
    assert_eq!(
        std::fs::canonicalize(host_path(&mounts, "envoy", "/etc/envoy/envoy.yaml")).unwrap(),
        std::fs::canonicalize(deploy("compose/envoy.yaml")).unwrap()
    );
    let socket =
        &envoy.cluster("slidegate")["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"];
    assert_eq!(socket["socket_address"]["address"], "slidegate");
    assert_eq!(
        port(socket),
        grpc,
        "envoy.yaml's slidegate cluster and slidegate's --grpc"
    );
    assert!(
        published(&compose, "envoy").contains(&envoy.port),
        "the front listener's port {} is not published",
        envoy.port
    );

    // Prometheus scrapes slidegate's HTTP port and Envoy's admin port, and
    // loads the rules compose mounts from deploy/prometheus.
    let prometheus_yml = host_path(&mounts, "prometheus", "/etc/prometheus/prometheus.yml");
    assert_eq!(
        std::fs::canonicalize(&prometheus_yml).unwrap(),
        std::fs::canonicalize(deploy("compose/prometheus.yml")).unwrap()
    );
    let prometheus = yaml("compose/prometheus.yml");
    let job = |name: &str| {
        list(&prometheus["scrape_configs"])
            .iter()
            .find(|j| j["job_name"] == name)
            .unwrap_or_else(|| panic!("no scrape job {name}"))
            .clone()
    };
    let slidegate_job = job("slidegate");
    assert!(matches!(
        slidegate_job["metrics_path"].as_str(),
        None | Some("/metrics")
    ));
    let targets: Vec<&str> = list(&slidegate_job["static_configs"][0]["targets"])
        .iter()
        .map(text)
        .collect();
    assert_eq!(targets, [format!("slidegate:{http}")]);
    let envoy_job = job("envoy");
    let envoy_targets: Vec<&str> = list(&envoy_job["static_configs"][0]["targets"])
        .iter()
        .map(text)
        .collect();
    assert_eq!(envoy_targets, [format!("envoy:{}", envoy.admin_port)]);
    let mut checked = read("compose/prometheus.yml");
    let rule_files: Vec<&str> = list(&prometheus["rule_files"]).iter().map(text).collect();
    assert!(
        rule_files.contains(&"/etc/prometheus/rules/slidegate.rules.yaml"),
        "{rule_files:?}"
    );
    for rules in rule_files {
        let host = host_path(&mounts, "prometheus", rules);
        assert!(host.is_file(), "{rules}: {} is not a file", host.display());
        checked = checked.replace(rules, host.to_str().unwrap());
    }
    let dir = common::fresh("deploy-compose-prometheus");
    let copy = dir.join("prometheus.yml");
    std::fs::write(&copy, checked).unwrap();
    let out = tool("promtool", "apt-get install prometheus")
        .args(["check", "config"])
        .arg(&copy)
        .output()
        .unwrap();
    assert!(out.status.success(), "promtool check config: {}", shown(&out));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The demo config served as compose serves it (its command, its Redis):
/// the descriptors of a request with an API key, sent over `POST /json` one
/// time more than the key's limit, are refused that time, on the key's
/// descriptor: what `curl` through Envoy shows as a 429.
#[test]
fn the_demo_refuses_the_request_after_its_limit() {
    let compose = yaml("compose/compose.yaml");
    let mounts = mounts(&compose);
    let redis = RedisServer::start();
    let mut args = Vec::new();
    let command = slidegate_command(&compose);
    let mut given = command.iter();
    while let Some(arg) = given.next() {
        args.push(arg.clone());
        match arg.as_str() {
            "--http" | "--grpc" => {
                given.next();
                args.push("127.0.0.1:0".to_owned());
            }
            "--config" => {
                let host = host_path(&mounts, "slidegate", given.next().unwrap());
                args.push(host.to_str().unwrap().to_owned());
            }
            "--redis" => {
                given.next();
                args.push(redis.url());
            }
            _ => {}
        }
    }
    let (child, lines) = common::spawn_logging(common::slidegate().args(&args).args(["--drain-delay", "0s"]));
    let mut log = Vec::new();
    let (http, _) = common::next_line(&lines, &mut log, common::listening_on);

    let envoy = envoy();
    let limits = Limits::load();
    let request = Request::get().header("x-api-key", "alice");
    let descriptors = envoy.descriptors(&request);
    let key = descriptors
        .iter()
        .position(|d| d[0].0 == "api_key")
        .expect("the request's API key descriptor");
    let (_, limit) = limits.rule(&["api_key"]);
    let n: usize = limit.split(' ').next().unwrap().parse().unwrap();
    let body = serde_json::json!({
        "domain": text(&envoy.filter["domain"]),
        "descriptors": descriptors
            .iter()
            .map(|d| serde_json::json!({
                "entries": d.iter().map(|(k, v)| serde_json::json!({"key": k, "value": v})).collect::<Vec<_>>()
            }))
            .collect::<Vec<_>>(),
    })
    .to_string();
    for time in 1..=n + 1 {
        let answer = common::request(&http, "POST", "/json", &body);
        let (_, json) = answer.split_once("\r\n\r\n").unwrap();
        let json: Value = serde_json::from_str(json).unwrap();
        let codes: Vec<&str> = list(&json["statuses"]).iter().map(|s| text(&s["code"])).collect();
        if time <= n {
            assert!(answer.starts_with("HTTP/1.1 200"), "time {time}: {answer}");
            assert_eq!(json["overallCode"], "OK", "time {time}: {answer}");
        } else {
            assert!(answer.starts_with("HTTP/1.1 429"), "time {time}: {answer}");
            assert_eq!(json["overallCode"], "OVER_LIMIT", "{answer}");
            let over: Vec<usize> = (0..codes.len()).filter(|i| codes[*i] == "OVER_LIMIT").collect();
            assert_eq!(over, [key], "only the API key is over its limit: {answer}");
        }
    }
    // The counts are in Redis, as compose's slidegate keeps them.
    assert!(!redis.keys_and_ttls().is_empty(), "nothing was counted in Redis");
    common::terminate(child);
}

/// `--explain` and the place of a rule are compared as the same text:
/// a rule written elsewhere would not compare equal.
#[test]
fn explain_and_the_rule_place_read_alike() {
    let limits = Limits::load();
    let domain = limits.domain();
    let nested = limits.rule(&["path=/login", "remote_address"]);
    let top = limits.rule(&["remote_address"]);
    assert_ne!(nested.0, top.0);
    assert_eq!(explain(&domain, &entries(&[("remote_address", "10.0.0.1")])), top);
}
