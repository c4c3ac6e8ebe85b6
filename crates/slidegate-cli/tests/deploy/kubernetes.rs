//! `deploy/kubernetes/`: every manifest against the Kubernetes OpenAPI
//! schemas (strict), the kustomization against the folder, the
//! objects against each other, and what the Deployment says of slidegate
//! against the built binary: started with the Deployment's command,
//! arguments and environment (the Secret's and the ConfigMap's values
//! resolved, a throw-away Redis for the Secret's placeholder), its probes
//! and scrape path answer, its ConfigMap reloads through the kubelet's
//! `..data` swap, and it drains within the grace period.
//!
//! The helpers marked "also for systemd.rs" serve that module too.

use crate::common::{self, next_line, request};
use crate::{deploy, read, run, shown};
use marked_yaml::Node;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

const VALIDATE: &str = "pip install kubernetes-validate";

/// The Kubernetes versions the manifests are validated against: the oldest
/// they need (1.30: the preStop `sleep` action on by default) and the
/// newest the validator knows offline.
const VERSIONS: [&str; 2] = ["1.30.0", "1.37.0"];

/// The name of the folder's kustomization.
const KUSTOMIZATION: &str = "kustomization.yaml";

/// A YAML text as JSON, every scalar a string (the tests parse numbers
/// where they need them).
fn yaml(text: &str) -> Value {
    fn json(node: &Node) -> Value {
        match node {
            Node::Scalar(s) => Value::String(s.as_str().to_owned()),
            Node::Sequence(items) => Value::Array(items.iter().map(json).collect()),
            Node::Mapping(map) => Value::Object(map.iter().map(|(k, v)| (k.as_str().to_owned(), json(v))).collect()),
        }
    }
    json(&marked_yaml::parse_yaml(0, text).unwrap_or_else(|e| panic!("{e}:\n{text}")))
}

/// The manifest `file` of `deploy/kubernetes/`, as JSON.
fn manifest(file: &str) -> Value {
    yaml(&read(&format!("kubernetes/{file}")))
}

/// The string at `pointer` in `value`; panics naming it when absent.
fn text<'a>(value: &'a Value, pointer: &str) -> &'a str {
    value
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no string at {pointer} in {value:#}"))
}

/// The whole number at `pointer` in `value`.
fn number(value: &Value, pointer: &str) -> u64 {
    let found = text(value, pointer);
    found.parse().unwrap_or_else(|e| panic!("{pointer}: {found:?}: {e}"))
}

/// The strings of the list at `pointer`.
fn strings(value: &Value, pointer: &str) -> Vec<String> {
    value
        .pointer(pointer)
        .and_then(Value::as_array)
        .unwrap_or_else(|| panic!("no list at {pointer} in {value:#}"))
        .iter()
        .map(|v| v.as_str().expect("a string").to_owned())
        .collect()
}

/// The resources the kustomization lists.
fn resources() -> Vec<String> {
    strings(&manifest(KUSTOMIZATION), "/resources")
}

/// The Deployment's one container.
fn container(deployment: &Value) -> &Value {
    let containers = deployment
        .pointer("/spec/template/spec/containers")
        .and_then(Value::as_array)
        .expect("the Deployment has containers");
    assert_eq!(containers.len(), 1, "one container, slidegate");
    &containers[0]
}

/// The container's port named `name`.
fn container_port(container: &Value, name: &str) -> u64 {
    let ports = container["ports"].as_array().expect("the container has ports");
    let port = ports
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("no container port named {name}"));
    number(port, "/containerPort")
}

/// A probe's or a Service's port (a number, or a container port's name)
/// as a number.
fn resolve_port(container: &Value, port: &str) -> u64 {
    port.parse().unwrap_or_else(|_| container_port(container, port))
}

/// The value of `flag` in `args` (`--flag VALUE` or `--flag=VALUE`).
pub(crate) fn flag_value(args: &[String], flag: &str) -> Option<String> {
    let prefix = format!("{flag}=");
    args.iter().enumerate().find_map(|(i, arg)| {
        if arg == flag {
            Some(
                args.get(i + 1)
                    .unwrap_or_else(|| panic!("{flag} without a value"))
                    .clone(),
            )
        } else {
            arg.strip_prefix(&prefix).map(str::to_owned)
        }
    })
}

/// Replaces the value of `flag` in `args` by `value`; panics if it is not
/// there.
pub(crate) fn set_flag(args: &mut [String], flag: &str, value: &str) {
    let prefix = format!("{flag}=");
    let at = args
        .iter()
        .position(|a| a == flag || a.starts_with(&prefix))
        .unwrap_or_else(|| panic!("{flag} is not in {args:?}"));
    if args[at] == flag {
        args[at + 1] = value.to_owned();
    } else {
        args[at] = format!("{flag}={value}");
    }
}

/// The default of `flag` as `slidegate serve --help` gives it (also for
/// systemd.rs).
pub(crate) fn default_of(flag: &str) -> String {
    let help = common::slidegate().args(["serve", "--help"]).output().unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    let mut lines = help
        .lines()
        .skip_while(|l| !l.trim_start().starts_with(&format!("{flag} ")));
    assert!(lines.next().is_some(), "{flag} is not in `slidegate serve --help`");
    lines
        .take_while(|l| !l.trim_start().starts_with("--"))
        .find_map(|l| Some(l.trim().strip_prefix("[default: ")?.strip_suffix(']')?.to_owned()))
        .unwrap_or_else(|| panic!("{flag} has no default in `slidegate serve --help`"))
}

/// A setting of `serve`: `flag` in `args`, else the variable `env` in
/// `environment`, else the flag's default (also for systemd.rs).
pub(crate) fn setting(args: &[String], environment: &BTreeMap<String, String>, flag: &str, env: &str) -> String {
    flag_value(args, flag)
        .or_else(|| environment.get(env).cloned())
        .unwrap_or_else(|| default_of(flag))
}

/// What a stop of `serve` may take (also for systemd.rs): its
/// `--drain-delay` and its `--request-timeout` (the longest request in
/// flight), in seconds.
pub(crate) fn stop_budget(args: &[String], environment: &BTreeMap<String, String>) -> (f64, f64) {
    let drain = seconds(&setting(args, environment, "--drain-delay", "SLIDEGATE_DRAIN_DELAY"));
    let request = seconds(&setting(
        args,
        environment,
        "--request-timeout",
        "SLIDEGATE_REQUEST_TIMEOUT",
    ));
    (drain, request)
}

/// The MiB of `serve`'s in-memory stores: `--memory-mib` and
/// `--other-memory-mib` together.
fn stores_mib(args: &[String], environment: &BTreeMap<String, String>) -> u64 {
    number_of(&setting(args, environment, "--memory-mib", "SLIDEGATE_MEMORY_MIB"))
        + number_of(&setting(
            args,
            environment,
            "--other-memory-mib",
            "SLIDEGATE_OTHER_MEMORY_MIB",
        ))
}

/// A duration as slidegate writes them (`2s`, `500ms`, `5m`, `1h`; systemd's
/// bare seconds too), in seconds (also for systemd.rs).
pub(crate) fn seconds(duration: &str) -> f64 {
    let digits = duration.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let value: f64 = digits.parse().unwrap_or_else(|e| panic!("{duration:?}: {e}"));
    value
        * match &duration[digits.len()..] {
            "" | "s" => 1.0,
            "ms" => 0.001,
            "m" | "min" => 60.0,
            "h" => 3600.0,
            unit => panic!("{duration:?}: unit {unit:?}"),
        }
}

/// A Kubernetes memory quantity (`128Mi`, `1Gi`, `500M`), in bytes.
fn bytes(quantity: &str) -> u64 {
    let digits = quantity.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let value: u64 = digits.parse().unwrap_or_else(|e| panic!("{quantity:?}: {e}"));
    value
        * match &quantity[digits.len()..] {
            "" => 1,
            "Ki" => 1 << 10,
            "Mi" => 1 << 20,
            "Gi" => 1 << 30,
            "k" => 1_000,
            "M" => 1_000_000,
            "G" => 1_000_000_000,
            unit => panic!("{quantity:?}: unit {unit:?}"),
        }
}

/// A log line of `--log-format json`: every line must be one.
fn event(line: &str) -> Value {
    serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line}"))
}

/// The log message of `line`, in either log format (also for systemd.rs).
pub(crate) fn message(line: &str) -> String {
    match serde_json::from_str::<Value>(line) {
        Ok(event) => event["fields"]["message"].as_str().unwrap_or_default().to_owned(),
        // `2026-12-05T10:31:16.143786Z  INFO target: message key=value`.
        Err(_) => line.split_once(": ").map_or(line, |(_, rest)| rest).to_owned(),
    }
}

/// The HTTP and gRPC addresses from the line saying where it listens, in
/// either log format (also for systemd.rs).
pub(crate) fn listening(line: &str) -> Option<(String, String)> {
    if let Ok(event) = serde_json::from_str::<Value>(line) {
        let fields = &event["fields"];
        return (fields["message"] == "listening" && fields["grpc"].is_string()).then(|| {
            let field = |name: &str| fields[name].as_str().unwrap().to_owned();
            (field("http"), field("grpc"))
        });
    }
    common::listening_on(line)
}

/// Waits for the first line whose message starts with `start`; the line.
pub(crate) fn wait_for(lines: &Receiver<String>, log: &mut Vec<String>, start: &str) -> String {
    next_line(lines, log, |line| {
        message(line).starts_with(start).then(|| line.to_owned())
    })
}

/// The status line of an HTTP answer.
pub(crate) fn status(answer: &str) -> &str {
    answer.lines().next().unwrap_or_default()
}

/// The `requests_per_unit` of the limit that `POST /json` at `http`
/// applies to `descriptor` (key, value) in `domain` (also for systemd.rs).
pub(crate) fn limit_applied(http: &str, domain: &str, (key, value): (&str, &str)) -> u64 {
    let body = serde_json::json!({
        "domain": domain,
        "descriptors": [{ "entries": [{ "key": key, "value": value }] }],
    });
    let answer = request(http, "POST", "/json", &body.to_string());
    assert_eq!(status(&answer), "HTTP/1.1 200 OK", "{answer}");
    let json: Value = serde_json::from_str(answer.split_once("\r\n\r\n").unwrap().1).unwrap();
    json["statuses"][0]["currentLimit"]["requestsPerUnit"]
        .as_u64()
        .unwrap_or_else(|| panic!("no limit applied: {answer}"))
}

/// Waits for `child` to exit, at most `within`; its exit code, or `None`
/// (and the child killed) if it did not (also for systemd.rs).
pub(crate) fn exits_within(mut child: Child, within: Duration) -> Option<i32> {
    let pid = child.id();
    let (done, exited) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(child.wait().ok().and_then(|s| s.code()));
    });
    exited.recv_timeout(within).unwrap_or_else(|_| {
        let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
        None
    })
}

/// What the gRPC health service at `grpc` answers for `service`.
fn grpc_health(grpc: &str, service: &str) -> tonic_health::pb::health_check_response::ServingStatus {
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let request = HealthCheckRequest {
            service: service.to_owned(),
        };
        HealthClient::new(common::channel(grpc).await)
            .check(request)
            .await
            .unwrap()
            .into_inner()
            .status()
    })
}

/// Writes `data` (file name to text) into the mounted folder `folder` as
/// the kubelet's atomic writer updates a ConfigMap volume: the files in a
/// new folder `version`, the link `..data` made to it as `..data_tmp` and
/// renamed over the old one at once, each file a link `NAME ->
/// ..data/NAME`, and the previous version removed.
fn kubelet_write(folder: &Path, data: &BTreeMap<String, String>, version: &str) {
    use std::os::unix::fs::symlink;
    std::fs::create_dir_all(folder).unwrap();
    let previous = std::fs::read_link(folder.join("..data")).ok();
    std::fs::create_dir(folder.join(version)).unwrap();
    for (name, text) in data {
        std::fs::write(folder.join(version).join(name), text).unwrap();
    }
    symlink(version, folder.join("..data_tmp")).unwrap();
    std::fs::rename(folder.join("..data_tmp"), folder.join("..data")).unwrap();
    for name in data.keys() {
        if std::fs::symlink_metadata(folder.join(name)).is_err() {
            symlink(Path::new("..data").join(name), folder.join(name)).unwrap();
        }
    }
    if let Some(previous) = previous {
        std::fs::remove_dir_all(folder.join(previous)).unwrap();
    }
}

/// The ConfigMap's data: file name to text.
fn config_map_data() -> BTreeMap<String, String> {
    let data = manifest("configmap.yaml")["data"].clone();
    serde_json::from_value(data).expect("the ConfigMap has data")
}

#[test]
fn every_manifest_passes_strict_schema_validation() {
    let listed = resources();
    let mut files: Vec<String> = std::fs::read_dir(deploy("kubernetes"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.ends_with(".yaml") && name != KUSTOMIZATION)
        .collect();
    files.sort();
    let mut sorted = listed.clone();
    sorted.sort();
    assert_eq!(sorted, files, "the kustomization lists every manifest of the folder");
    let paths: Vec<String> = listed
        .iter()
        .map(|f| deploy(&format!("kubernetes/{f}")).display().to_string())
        .collect();
    for version in VERSIONS {
        let mut args = vec!["--strict", "-k", version];
        args.extend(paths.iter().map(String::as_str));
        let out = run("kubernetes-validate", &args, VALIDATE);
        assert!(out.status.success(), "Kubernetes {version}: {}", shown(&out));
        // An unknown kind is only a warning, exit 0: each file must say
        // that it passed.
        let said = String::from_utf8_lossy(&out.stdout);
        for path in &paths {
            assert!(
                said.contains(&format!("{path} passed for resource")),
                "{path} was not validated against Kubernetes {version}: {}",
                shown(&out)
            );
        }
    }
    // Strict: a misspelt field is refused, not ignored.
    let dir = common::fresh("kubernetes-strict");
    let misspelt = dir.join("deployment.yaml");
    let original = read("kubernetes/deployment.yaml");
    assert!(original.contains("readOnlyRootFilesystem"));
    std::fs::write(
        &misspelt,
        original.replace("readOnlyRootFilesystem", "readOnlyRootFileSystem"),
    )
    .unwrap();
    let out = run(
        "kubernetes-validate",
        &["--strict", "-k", VERSIONS[1], misspelt.to_str().unwrap()],
        VALIDATE,
    );
    assert!(!out.status.success(), "a misspelt field passed: {}", shown(&out));
    std::fs::remove_dir_all(dir).unwrap();
}

/// What `kubectl apply -k` reads: each manifest the kustomization lists
/// (every one of the folder, checked with the schemas above) holds one
/// object, of a kind no other file has. (kubectl is not a package of this
/// machine's distribution, so the kustomization is checked here rather
/// than by `kubectl kustomize`.)
#[test]
fn every_manifest_is_one_object_of_its_own_kind() {
    let listed = resources();
    let mut kinds: Vec<String> = listed.iter().map(|f| text(&manifest(f), "/kind").to_owned()).collect();
    kinds.sort_unstable();
    let count = kinds.len();
    kinds.dedup();
    assert_eq!(kinds.len(), count, "one object of each kind: {kinds:?}");
    for file in &listed {
        let body = read(&format!("kubernetes/{file}"));
        assert!(
            !body.lines().any(|line| line.trim_end() == "---"),
            "{file} holds one object"
        );
    }
}

#[test]
fn the_objects_fit_together() {
    let deployment = manifest("deployment.yaml");
    let service = manifest("service.yaml");
    let pdb = manifest("poddisruptionbudget.yaml");
    let hpa = manifest("horizontalpodautoscaler.yaml");
    let account = manifest("serviceaccount.yaml");
    let secret = manifest("secret.yaml");
    let pod = &deployment["spec"]["template"];
    let c = container(&deployment);

    // Selectors pick the Deployment's pods.
    let labels = pod["metadata"]["labels"].as_object().unwrap();
    let selects = |selector: &Value, what: &str| {
        let selector = selector.as_object().unwrap_or_else(|| panic!("{what} has a selector"));
        assert!(!selector.is_empty(), "{what}");
        for (key, value) in selector {
            assert_eq!(labels.get(key), Some(value), "{what} selects {key}={value}");
        }
    };
    selects(&deployment["spec"]["selector"]["matchLabels"], "the Deployment");
    selects(&service["spec"]["selector"], "the Service");
    selects(&pdb["spec"]["selector"]["matchLabels"], "the PodDisruptionBudget");

    // The autoscaler owns the replica count, and keeps at least two, one
    // more than the disruption budget may take.
    assert_eq!(text(&hpa, "/spec/scaleTargetRef/kind"), "Deployment");
    assert_eq!(
        text(&hpa, "/spec/scaleTargetRef/name"),
        text(&deployment, "/metadata/name")
    );
    assert!(
        deployment["spec"].get("replicas").is_none(),
        "a replicas: would fight the autoscaler"
    );
    assert_eq!(text(&hpa, "/spec/metrics/0/resource/name"), "cpu");
    assert!(
        c.pointer("/resources/requests/cpu").is_some(),
        "CPU utilization is of the request"
    );
    assert!(number(&hpa, "/spec/minReplicas") > number(&pdb, "/spec/maxUnavailable"));

    // References.
    assert_eq!(text(pod, "/spec/serviceAccountName"), text(&account, "/metadata/name"));
    let env = c["env"].as_array().unwrap();
    let redis = env
        .iter()
        .find(|e| e["name"] == "SLIDEGATE_REDIS")
        .expect("SLIDEGATE_REDIS");
    assert_eq!(
        text(redis, "/valueFrom/secretKeyRef/name"),
        text(&secret, "/metadata/name")
    );
    let key = text(redis, "/valueFrom/secretKeyRef/key");
    assert!(secret["stringData"].get(key).is_some(), "the Secret has {key}");
    let volume = &pod["spec"]["volumes"][0];
    assert_eq!(
        text(volume, "/configMap/name"),
        text(&manifest("configmap.yaml"), "/metadata/name")
    );
    let mount = &c["volumeMounts"][0];
    assert_eq!(mount["name"], volume["name"]);
    assert!(
        mount.get("subPath").is_none(),
        "a subPath mount never sees the ConfigMap's updates"
    );
    let args = strings(c, "/args");
    assert_eq!(
        flag_value(&args, "--config").as_deref(),
        Some(text(mount, "/mountPath"))
    );

    // Ports: the listeners, the container ports, the probes and the
    // Service's target ports are the same two.
    let http = container_port(c, "http");
    let grpc = container_port(c, "grpc");
    let port_of = |address: String| address.rsplit_once(':').unwrap().1.parse::<u64>().unwrap();
    assert_eq!(port_of(flag_value(&args, "--http").unwrap()), http);
    assert_eq!(port_of(flag_value(&args, "--grpc").unwrap()), grpc);
    assert_eq!(resolve_port(c, text(c, "/readinessProbe/httpGet/port")), http);
    assert_eq!(resolve_port(c, text(c, "/livenessProbe/httpGet/port")), http);
    assert_eq!(number(c, "/startupProbe/grpc/port"), grpc);
    assert_eq!(
        text(pod, "/metadata/annotations/prometheus.io~1port")
            .parse::<u64>()
            .unwrap(),
        http
    );
    let mut targets: BTreeMap<String, u64> = BTreeMap::new();
    for port in service["spec"]["ports"].as_array().unwrap() {
        targets.insert(
            text(port, "/name").to_owned(),
            resolve_port(c, text(port, "/targetPort")),
        );
    }
    assert_eq!(
        targets,
        BTreeMap::from([("grpc".to_owned(), grpc), ("http".to_owned(), http)])
    );
    let h2c = service["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "grpc")
        .unwrap();
    assert_eq!(text(h2c, "/appProtocol"), "kubernetes.io/h2c");

    // The stop: the grace period covers the preStop sleep, the drain delay
    // and the longest request in flight.
    let environment = BTreeMap::new();
    let pre_stop = number(c, "/lifecycle/preStop/sleep/seconds") as f64;
    let (drain, request) = stop_budget(&args, &environment);
    let grace = number(pod, "/spec/terminationGracePeriodSeconds") as f64;
    assert!(pre_stop > 0.0 && drain > 0.0, "drain-aware: {pre_stop} s, {drain} s");
    assert!(
        grace > pre_stop + drain + request,
        "terminationGracePeriodSeconds {grace} <= preStop {pre_stop} + --drain-delay {drain} + --request-timeout {request}"
    );

    // Memory: the limit holds the in-memory stores, which slidegate
    // refuses to allocate past the cgroup's limit (without Redis).
    let stores = stores_mib(&args, &environment);
    let limit = bytes(text(c, "/resources/limits/memory"));
    assert!(
        limit > stores << 20,
        "limits.memory {limit} B <= the stores' {stores} MiB"
    );

    // Locked down.
    let pod_security = &pod["spec"]["securityContext"];
    assert_eq!(text(pod_security, "/runAsNonRoot"), "true");
    assert_ne!(number(pod_security, "/runAsUser"), 0);
    assert_eq!(text(pod_security, "/seccompProfile/type"), "RuntimeDefault");
    let security = &c["securityContext"];
    assert_eq!(text(security, "/allowPrivilegeEscalation"), "false");
    assert_eq!(text(security, "/readOnlyRootFilesystem"), "true");
    assert_eq!(strings(security, "/capabilities/drop"), ["ALL"]);
    assert_eq!(text(pod, "/spec/automountServiceAccountToken"), "false");
    assert_eq!(text(&account, "/automountServiceAccountToken"), "false");

    // deploy/Dockerfile's image: its entrypoint is the command run here,
    // its user the pod's.
    let dockerfile = read("Dockerfile");
    let line = |instruction: &str| {
        dockerfile
            .lines()
            .find_map(|l| l.strip_prefix(instruction))
            .unwrap_or_else(|| panic!("no {instruction}in deploy/Dockerfile"))
    };
    let entrypoint: Vec<String> = serde_json::from_str(line("ENTRYPOINT ")).unwrap();
    assert_eq!(entrypoint, strings(c, "/command"));
    assert_eq!(line("USER ").split(':').next(), Some(text(pod_security, "/runAsUser")));

    // The image names no registry: the reader pushes it to theirs.
    let image = text(c, "/image");
    assert!(
        !image.split('/').next().unwrap().contains('.'),
        "{image} names a registry"
    );
}

/// A whole number written as text.
fn number_of(text: &str) -> u64 {
    text.parse().unwrap_or_else(|e| panic!("{text:?}: {e}"))
}

/// The Deployment's container command as a `slidegate` process: its
/// arguments with the listeners on free loopback ports and `--config` at
/// `folder`, and its environment with the Secret's and the ConfigMap's
/// values resolved, a `redis://` value replaced by `redis`.
fn deployment_command(deployment: &Value, folder: &Path, redis: &str) -> (Command, BTreeMap<String, String>) {
    let c = container(deployment);
    let program = strings(c, "/command");
    assert_eq!(program.len(), 1, "{program:?}");
    assert_eq!(Path::new(&program[0]).file_name().unwrap(), "slidegate");
    let mut args = strings(c, "/args");
    assert_eq!(args[0], "serve");
    for flag in ["--http", "--grpc"] {
        let address = flag_value(&args, flag).unwrap();
        assert!(
            address.starts_with("0.0.0.0:"),
            "{flag} {address}: every interface of the pod"
        );
        set_flag(&mut args, flag, "127.0.0.1:0");
    }
    set_flag(&mut args, "--config", folder.to_str().unwrap());
    let secret = manifest("secret.yaml");
    let data = config_map_data();
    let mut environment = BTreeMap::new();
    for entry in c["env"].as_array().into_iter().flatten() {
        let name = text(entry, "/name").to_owned();
        let value = if let Some(value) = entry.get("value") {
            value.as_str().unwrap().to_owned()
        } else if let Some(from) = entry.pointer("/valueFrom/secretKeyRef") {
            assert_eq!(text(from, "/name"), text(&secret, "/metadata/name"));
            let value = text(&secret, &format!("/stringData/{}", text(from, "/key")));
            if value.starts_with("redis://") {
                redis.to_owned()
            } else {
                value.to_owned()
            }
        } else if let Some(from) = entry.pointer("/valueFrom/configMapKeyRef") {
            data[text(from, "/key")].clone()
        } else {
            panic!("an environment variable this test cannot resolve: {entry}")
        };
        environment.insert(name, value);
    }
    let mut command = common::slidegate();
    command.args(&args).envs(&environment);
    (command, environment)
}

#[test]
fn the_deployment_serves_reloads_its_config_map_and_drains() {
    use tonic_health::pb::health_check_response::ServingStatus;
    let deployment = manifest("deployment.yaml");
    let c = container(&deployment);
    let pod = &deployment["spec"]["template"];
    let redis = slidegate_conformance::redis::RedisServer::start();
    let dir = common::fresh("kubernetes-deployment");
    let folder = dir.join("config");
    let mut data = config_map_data();
    kubelet_write(&folder, &data, "..2026_12_05_10_00_00.000000001");
    let (mut command, environment) = deployment_command(&deployment, &folder, &redis.url());
    assert_eq!(
        environment.get("SLIDEGATE_REDIS"),
        Some(&redis.url()),
        "counts in Redis"
    );
    let (child, lines) = common::spawn_logging(&mut command);
    let mut log = Vec::new();
    let (http, grpc) = next_line(&lines, &mut log, listening);

    // The probes, and the scrape annotations' path.
    let get = |path: &str| request(&http, "GET", path, "");
    let readiness = text(c, "/readinessProbe/httpGet/path");
    let liveness = text(c, "/livenessProbe/httpGet/path");
    assert_eq!(status(&get(readiness)), "HTTP/1.1 200 OK", "{readiness}");
    assert_eq!(status(&get(liveness)), "HTTP/1.1 200 OK", "{liveness}");
    let startup = text(c, "/startupProbe/grpc/service");
    assert_eq!(grpc_health(&grpc, startup), ServingStatus::Serving);
    let metrics = get(text(pod, "/metadata/annotations/prometheus.io~1path"));
    assert_eq!(status(&metrics), "HTTP/1.1 200 OK");
    assert!(metrics.contains("slidegate_build_info"), "{metrics}");

    // Its memory: under the request with Redis (no stores allocated), and
    // under the limit with the stores it would allocate without Redis.
    let resident: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("process_resident_memory_bytes "))
        .expect("process_resident_memory_bytes")
        .parse()
        .unwrap();
    let args = strings(c, "/args");
    let stores = stores_mib(&args, &environment);
    let requested = bytes(text(c, "/resources/requests/memory"));
    let limit = bytes(text(c, "/resources/limits/memory"));
    assert!(
        resident < requested,
        "resident {resident} B >= requests.memory {requested} B"
    );
    assert!(
        resident + (stores << 20) < limit,
        "resident {resident} B + the stores' {stores} MiB >= limits.memory {limit} B"
    );

    // The ConfigMap's first limit applies; the kubelet's swap of `..data`
    // to a version where it is one more is reloaded, and applies.
    let (file, config) = data.iter().next().expect("a config file");
    let config_yaml = yaml(config);
    let domain = text(&config_yaml, "/domain").to_owned();
    let rule = &config_yaml["descriptors"][0];
    let key = text(rule, "/key").to_owned();
    let before = number(rule, "/rate_limit/requests_per_unit");
    let descriptor = (key.as_str(), "192.0.2.7");
    assert_eq!(limit_applied(&http, &domain, descriptor), before);
    let changed = config.replacen(
        &format!("requests_per_unit: {before}"),
        &format!("requests_per_unit: {}", before + 1),
        1,
    );
    assert_ne!(
        &changed, config,
        "the first limit is written `requests_per_unit: {before}`"
    );
    data.insert(file.clone(), changed);
    kubelet_write(&folder, &data, "..2026_12_05_10_01_00.000000002");
    let reloaded = wait_for(&lines, &mut log, "config reload");
    assert_eq!(message(&reloaded), "config reloaded", "{log:#?}");
    assert_eq!(limit_applied(&http, &domain, descriptor), before + 1);

    // The stop: health NOT_SERVING and the readiness path 503 at once,
    // the liveness path still 200 (a draining pod is not restarted), and
    // exit 0 within what the grace period leaves after the preStop sleep.
    let drain = seconds(&setting(&args, &environment, "--drain-delay", "SLIDEGATE_DRAIN_DELAY"));
    let grace = number(pod, "/spec/terminationGracePeriodSeconds") as f64;
    let pre_stop = number(c, "/lifecycle/preStop/sleep/seconds") as f64;
    let stopping = Instant::now();
    common::signal("TERM", &child);
    wait_for(&lines, &mut log, "draining: health says NOT_SERVING");
    assert_eq!(status(&get(readiness)), "HTTP/1.1 503 Service Unavailable");
    assert_eq!(status(&get(liveness)), "HTTP/1.1 200 OK");
    assert_eq!(grpc_health(&grpc, startup), ServingStatus::NotServing);
    let code = exits_within(child, Duration::from_secs_f64(grace - pre_stop));
    let stopped = stopping.elapsed();
    assert_eq!(code, Some(0), "{log:#?}");
    assert!(
        stopped.as_secs_f64() >= drain,
        "served on for --drain-delay: {stopped:?}"
    );
    // `--log-format json`: every line of the log, one JSON object.
    log.extend(lines.try_iter());
    for line in &log {
        event(line);
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn service_links_stay_off_as_they_would_stop_the_start() {
    let deployment = manifest("deployment.yaml");
    assert_eq!(text(&deployment, "/spec/template/spec/enableServiceLinks"), "false");
    // What a Service named `grpc` in the namespace would add to the pod's
    // environment, were service links on.
    let dir = common::fresh("kubernetes-service-links");
    kubelet_write(
        &dir.join("config"),
        &config_map_data(),
        "..2026_12_05_10_00_00.000000001",
    );
    let (mut command, _) = deployment_command(&deployment, &dir.join("config"), "redis://127.0.0.1:1/");
    let out = command.env("GRPC_PORT", "tcp://127.0.0.1:8081").output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", shown(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("GRPC_PORT"),
        "{}",
        shown(&out)
    );
    std::fs::remove_dir_all(dir).unwrap();
}
