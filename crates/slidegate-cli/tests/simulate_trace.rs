//! `slidegate simulate --trace` as a process: the committed access log
//! replayed through the algorithms, malformed lines skipped or stopped at,
//! and files with no request refused.

use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Output};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../slidegate-sim/tests/data/access.log");

fn slidegate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_slidegate"))
        .args(args)
        .output()
        .expect("the binary runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A file in this test binary's scratch directory, written with `contents`.
fn scratch(name: &str, contents: &[u8]) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("simulate_trace-{name}"));
    std::fs::write(&path, contents).expect("the scratch file is written");
    path
}

fn rows(out: &Output) -> Vec<Value> {
    assert!(out.status.success(), "{}", stderr(out));
    serde_json::from_slice(&out.stdout).expect("JSON output")
}

#[test]
fn sliding_log_on_the_fixture_is_exact() {
    let out = slidegate(&[
        "simulate",
        "--trace",
        FIXTURE,
        "--algorithm",
        "sliding_log",
        "--limit",
        "5",
        "--window",
        "10s",
        "--format",
        "json",
    ]);
    let rows = rows(&out);
    assert_eq!(rows.len(), 1);
    let r = &rows[0];
    assert_eq!(r["algorithm"], "sliding_log");
    assert_eq!(r["traffic"], "access.log");
    assert_eq!(
        (r["limit"].as_u64(), r["window_ns"].as_u64()),
        (Some(5), Some(10_000_000_000))
    );
    // 39 lines, 3 malformed: 36 requests from 3 clients. The steady client
    // gets its 10 in, the burst 8 of 15, alice 10 of 11.
    assert_eq!(r["clients"], 3);
    assert_eq!(r["requests"], 36);
    assert_eq!(r["admitted"], 28);
    assert_eq!(r["wrongly_allowed"], 0);
    assert_eq!(r["wrongly_denied"], 0);
    assert_eq!(r["max_window_admitted"], 5);
    assert_eq!(r["max_window_ratio"], 1.0);
    assert_eq!(r["mean_abs_error"], 0.0);
    // The malformed lines, on stderr with their file and number; no
    // progress bar, stderr being a pipe.
    let err = stderr(&out);
    let warnings: Vec<&str> = err.lines().collect();
    assert_eq!(warnings.len(), 3, "{err}");
    assert!(
        warnings[0].starts_with("warning: ")
            && warnings[0].contains("access.log:16: missing `[` before the time, found `10/Oct/2023:13:55:10`: `"),
        "{err}"
    );
    assert!(warnings[1].contains("access.log:24: unknown month `Okt`: `"), "{err}");
    assert!(
        warnings[2].contains("access.log:34: wrong field count: expected 9, found 6: `"),
        "{err}"
    );
    assert!(!err.contains('\u{1b}') && !err.contains('\r'), "{err:?}");
}

#[test]
fn two_interpolated_buckets_on_the_fixture() {
    let out = slidegate(&[
        "simulate",
        "--trace",
        FIXTURE,
        "--algorithm",
        "sliding_window",
        "--buckets",
        "2",
        "--weighting",
        "interpolated",
        "--limit",
        "5",
        "--window",
        "10s",
        "--format",
        "json",
    ]);
    let rows = rows(&out);
    assert_eq!(rows.len(), 1);
    let r = &rows[0];
    assert_eq!(
        (r["buckets"].as_u64(), r["weighting"].as_str()),
        (Some(2), Some("interpolated"))
    );
    assert_eq!(r["requests"], 36);
    assert_eq!(r["admitted"], 31);
    assert_eq!(r["wrongly_allowed"], 1);
    assert_eq!(r["wrongly_denied"], 1);
    // The burst at the end of the first bucket weighs little in the next:
    // 8 of its requests in one 10 s window.
    assert_eq!(r["max_window_admitted"], 8);
    assert_eq!(r["max_window_ratio"], 1.6);
}

#[test]
fn on_error_stop_ends_at_the_first_bad_line() {
    let out = slidegate(&["simulate", "--trace", FIXTURE, "--on-error", "stop", "--format", "json"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    let line = std::fs::read_to_string(FIXTURE)
        .unwrap()
        .lines()
        .nth(15)
        .unwrap()
        .to_string();
    let clipped: String = line.chars().take(120).collect();
    let clipped = if clipped.len() < line.len() {
        format!("{clipped}…")
    } else {
        clipped
    };
    assert_eq!(
        err.trim_end(),
        format!(
            "error: {FIXTURE}:16: missing `[` before the time, found `10/Oct/2023:13:55:10` (read as a combined \
             log): `{clipped}`"
        )
    );
    assert!(out.stdout.is_empty());
}

#[test]
fn files_without_requests_are_refused() {
    let empty = scratch("empty.log", b"");
    let bad = scratch(
        "bad.log",
        b"a - - [10/Okt/2000:13:55:36 -0700] \"GET / HTTP/1.0\" 200 1\n\n",
    );
    for (path, why) in [
        (&empty, "it has no non-empty line".to_string()),
        (
            &bad,
            "all 1 non-empty line is malformed as a Common Log Format log; line 1: unknown month `Okt`: `a - - \
             [10/Okt/2000:13:55:36 -0700] \"GET / HTTP/1.0\" 200 1`; name the format with --trace-format (and \
             --log-format for an nginx or Apache format string)"
                .to_string(),
        ),
    ] {
        let path = path.to_str().unwrap();
        let out = slidegate(&["simulate", "--trace", path]);
        assert_eq!(out.status.code(), Some(1), "{path}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.ends_with(&format!("error: no requests in {path}: {why}\n")),
            "{err}"
        );
        assert!(!err.contains("panicked"), "{err}");
        assert!(out.stdout.is_empty(), "{path}: no empty table");
    }
}

#[test]
fn at_most_twenty_bad_lines_are_reported() {
    let mut csv = String::from("timestamp,key\n1700000000,a\n");
    for i in 0..30 {
        csv.push_str(&format!("later{i},a\n"));
    }
    let path = scratch("many-bad.csv", csv.as_bytes());
    let path = path.to_str().unwrap();
    let out = slidegate(&[
        "simulate",
        "--trace",
        path,
        "--algorithm",
        "sliding_log",
        "--format",
        "csv",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 21, "{err}");
    assert!(
        lines[0].starts_with(&format!("warning: {path}:3: bad timestamp `later0`")),
        "{err}"
    );
    assert!(
        lines[19].starts_with(&format!("warning: {path}:22: bad timestamp `later19`")),
        "{err}"
    );
    assert_eq!(
        lines[20],
        format!("warning: {path}: 10 more malformed lines skipped, 30 in all")
    );
    let csv = String::from_utf8(out.stdout).unwrap();
    assert!(
        csv.lines()
            .nth(1)
            .unwrap()
            .starts_with("sliding_log,,,,,simulate_trace-many-bad.csv,100,"),
        "{csv}"
    );
}

#[test]
fn trace_and_traffic_models_do_not_mix() {
    for extra in [
        ["--traffic", "poisson"],
        ["--duration", "1m"],
        ["--seed", "7"],
        ["--clients", "5"],
    ] {
        let out = slidegate(&["simulate", "--trace", FIXTURE, extra[0], extra[1]]);
        assert_eq!(out.status.code(), Some(2), "{extra:?}");
        assert!(
            stderr(&out).contains("cannot be used with"),
            "{extra:?}: {}",
            stderr(&out)
        );
    }
    let out = slidegate(&["simulate", "--on-error", "stop"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--trace <FILE>"), "{}", stderr(&out));
}

/// `--plot DIR` writes the three kinds of plot, as SVG and PNG, for the
/// trace: three clients' counts named by their key, the error rates and
/// the most admitted in a window.
#[test]
fn plots_are_written_for_a_trace() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("simulate_trace-plots");
    let _ = std::fs::remove_dir_all(&dir);
    let out = slidegate(&[
        "simulate",
        "--trace",
        FIXTURE,
        "--limit",
        "5",
        "--window",
        "10s",
        "--buckets",
        "2,8",
        "--format",
        "json",
        "--plot",
        dir.to_str().expect("a UTF-8 path"),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("the plot folder")
        .map(|e| e.expect("an entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    for kind in ["error-rates", "max-window"] {
        for ext in ["png", "svg"] {
            let name = format!("access.log-{kind}.{ext}");
            assert!(names.contains(&name), "{name} not in {names:?}");
        }
    }
    let counts: Vec<&String> = names.iter().filter(|n| n.contains("-count-client-")).collect();
    assert_eq!(counts.len(), 6, "three clients, two formats: {names:?}");
    for name in &names {
        let bytes = std::fs::read(dir.join(name)).expect("a plot file");
        assert!(bytes.len() > 1000, "{name} is {} bytes", bytes.len());
        if name.ends_with(".png") {
            assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "{name} is not a PNG");
        } else {
            let svg = String::from_utf8_lossy(&bytes);
            assert!(svg.contains("<svg"), "{name} is not an SVG");
        }
    }
    // The count plots name the client by its key, and the SVG carries the
    // axis labels and legend as text.
    let svgs: Vec<String> = counts
        .iter()
        .filter(|n| n.ends_with(".svg"))
        .map(|n| std::fs::read_to_string(dir.join(n)).expect("an SVG"))
        .collect();
    for svg in &svgs {
        // The log's clock time (UTC) on the x axis.
        assert!(svg.contains("time (UTC) on 2023-10-10") && svg.contains("true count over 10s"));
        // One panel per algorithm that keeps a count, titled with it.
        for panel in ["sliding_window n=2", "sliding_window n=8", "limit (5)"] {
            assert!(svg.contains(panel), "no `{panel}` in a count plot");
        }
    }
    // The bursting client of the fixture is drawn, by key, in the file
    // named by it.
    let svg = std::fs::read_to_string(dir.join("access.log-count-client-198.51.100.7.svg")).unwrap();
    assert!(svg.contains("access.log: client 198.51.100.7,"));
    let _ = std::fs::remove_dir_all(&dir);
}

const NGINX_MAIN: &str = r#"$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent "$http_referer" "$http_user_agent" "$http_x_forwarded_for""#;

/// nginx's stock `main` format: a combined log with one extra field.
fn nginx_main_log() -> String {
    let mut log = String::new();
    for i in 0..12 {
        let forwarded = if i % 3 == 0 { "203.0.113.1" } else { "203.0.113.2" };
        log.push_str(&format!(
            "10.0.0.1 - - [10/Oct/2023:13:55:{i:02} +0000] \"GET /a HTTP/1.1\" 200 5 \"-\" \"curl/8\" \"{forwarded}\"\n"
        ));
    }
    log
}

fn clients_of(args: &[&str]) -> Value {
    let mut all = vec!["simulate", "--algorithm", "sliding_log", "--format", "json"];
    all.extend_from_slice(args);
    let out = slidegate(&all);
    rows(&out)[0]["clients"].clone()
}

#[test]
fn nginx_main_format_by_detection_and_by_its_string() {
    let path = scratch("nginx.log", nginx_main_log().as_bytes());
    let path = path.to_str().unwrap();
    assert_eq!(clients_of(&["--trace", path]), 1);
    assert_eq!(clients_of(&["--trace", path, "--key-by", "extra1"]), 2);
    assert_eq!(
        clients_of(&["--trace", path, "--log-format", NGINX_MAIN, "--key-by", "forwarded-for"]),
        2
    );
    assert_eq!(
        clients_of(&[
            "--trace",
            path,
            "--trace-format",
            "nginx",
            "--log-format",
            NGINX_MAIN,
            "--key-by",
            "http_x_forwarded_for"
        ]),
        2
    );
    let out = slidegate(&["simulate", "--trace", path, "--key-by", "host"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out).trim_end(),
        format!(
            "error: field `host` is not in {path}, a combined log with 1 extra field: expected one of remote_host, \
             ident, remote_user, time, request, status, bytes, referer, user-agent, extra1, client, user, method, path"
        )
    );
    let out = slidegate(&["simulate", "--trace", path, "--trace-format", "nginx"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out).trim_end(),
        "error: the nginx format needs its format string (nginx's `log_format`, Apache's `LogFormat`): give it with \
         --log-format"
    );
    let out = slidegate(&[
        "simulate",
        "--trace",
        path,
        "--log-format",
        "$remote_addr $ [$time_local]",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out).trim_end(),
        format!("error: reading {path}: bad nginx log format: `$` at position 14 is not followed by a variable name")
    );
}

#[test]
fn gzip_and_json_traces() {
    use std::io::Write;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(nginx_main_log().as_bytes()).unwrap();
    let path = scratch("nginx.log.1", &gz.finish().unwrap());
    assert_eq!(
        clients_of(&["--trace", path.to_str().unwrap(), "--key-by", "extra1"]),
        2
    );

    let mut json = String::new();
    for i in 0..6 {
        json.push_str(&format!(
            "{{\"at\":{},\"who\":{{\"ip\":\"10.0.0.{}\"}}}}\n",
            1_696_946_136_000u64 + i * 250,
            i % 2
        ));
    }
    let path = scratch("app.json", json.as_bytes());
    let path = path.to_str().unwrap();
    let args = [
        "--trace",
        path,
        "--trace-format",
        "json",
        "--time-field",
        "at",
        "--time-format",
        "unix_ms",
    ];
    let mut with_key = args.to_vec();
    with_key.extend(["--key-by", "who.ip"]);
    assert_eq!(clients_of(&with_key), 2);
    let out = slidegate(&[
        "simulate",
        "--trace",
        path,
        "--trace-format",
        "json",
        "--time-field",
        "at",
        "--time-format",
        "unix_ms",
        "--key-by",
        "who.ip",
        "--algorithm",
        "sliding_log",
        "--format",
        "json",
    ]);
    assert_eq!(rows(&out)[0]["requests"], 6);
}

const SHOP: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/shop.log.gz");

/// The count plots of a `--plot` run in `dir`: each SVG's client key, from
/// its file name, and its title's key, from its text.
fn count_plots(dir: &std::path::Path, traffic: &str) -> Vec<(String, String)> {
    let prefix = format!("{traffic}-count-client-");
    let mut plots: Vec<(String, String)> = std::fs::read_dir(dir)
        .expect("the plot folder")
        .map(|e| e.expect("an entry").file_name().to_string_lossy().into_owned())
        .filter_map(|name| {
            let key = name.strip_prefix(&prefix)?.strip_suffix(".svg")?.to_owned();
            assert!(dir.join(format!("{prefix}{key}.png")).exists(), "{key}: no PNG");
            let svg = std::fs::read_to_string(dir.join(&name)).expect("an SVG");
            let title = svg
                .split(&format!("{traffic}: client "))
                .nth(1)
                .and_then(|rest| rest.split(',').next())
                .expect("a title naming the client")
                .to_owned();
            Some((key, title))
        })
        .collect();
    plots.sort();
    plots
}

/// The count plots show the clients where the algorithms disagree most:
/// on the committed two-hour log, the three whose refusals differ most
/// between the algorithms, worked out here client by client with each
/// algorithm's own evaluation, and not the three busiest (a health check
/// that every algorithm admits whole is busier than a client that a fixed
/// window lets through twice as often); each file named by the client's
/// key as its title shows it.
#[test]
fn count_plots_show_the_clients_where_the_algorithms_disagree_most() {
    use slidegate_core::{Algorithm, Policy, Weighting};
    use std::collections::HashMap;
    use std::io::Read;
    let mut log = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(SHOP).unwrap())
        .read_to_string(&mut log)
        .unwrap();
    let trace = slidegate_sim::read_trace("shop", log.as_bytes(), &Default::default(), &mut |_| {}).unwrap();
    let minute = std::time::Duration::from_secs(60);
    let algorithms = [
        Algorithm::SlidingWindow {
            buckets: 8,
            weighting: Weighting::Conservative,
        },
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
    ];
    let policies: Vec<Policy> = algorithms.map(|a| Policy::new(20, minute, a).unwrap()).to_vec();
    let mut by_client: HashMap<u32, Vec<slidegate_sim::Request>> = HashMap::new();
    for r in &trace.requests {
        by_client.entry(r.client).or_default().push(*r);
    }
    // (spread of refusals, requests, client) of every client.
    let mut ranked: Vec<(u64, u64, u32)> = by_client
        .iter()
        .map(|(&client, requests)| {
            let refused: Vec<u64> = policies
                .iter()
                .map(|p| requests.len() as u64 - slidegate_sim::evaluate(p, requests).admitted)
                .collect();
            let spread = refused.iter().max().unwrap() - refused.iter().min().unwrap();
            (spread, requests.len() as u64, client)
        })
        .collect();
    ranked.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)));
    let key = |c: u32| trace.keys[c as usize].clone();
    let mut expected: Vec<String> = ranked[..3].iter().map(|&(_, _, c)| key(c)).collect();
    // By design of the log: the client bursting across a minute's end,
    // which a fixed window lets through twice, is one of them; the quiet
    // clients are not; and the busiest is not the choice for being busy.
    assert!(expected.contains(&"198.51.100.23".to_owned()), "{ranked:?}");
    assert!(ranked[3].0 < ranked[2].0, "a tie at the third place: {ranked:?}");
    assert!(expected.iter().all(|k| !k.starts_with("10.1.")), "{ranked:?}");
    let mut busiest: Vec<(u64, u32)> = ranked.iter().map(|&(_, n, c)| (n, c)).collect();
    busiest.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let busiest: Vec<String> = busiest[..3].iter().map(|&(_, c)| key(c)).collect();
    assert!(busiest.contains(&"192.0.2.200".to_owned()) && !expected.contains(&"192.0.2.200".to_owned()));
    expected.sort();

    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("simulate_trace-disagree");
    let _ = std::fs::remove_dir_all(&dir);
    let out = slidegate(&[
        "simulate",
        "--trace",
        SHOP,
        "--limit",
        "20",
        "--window",
        "1m",
        "--algorithm",
        "sliding_window,fixed_window,sliding_log",
        "--format",
        "json",
        "--plot",
        dir.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let plots = count_plots(&dir, "shop.log.gz");
    let keys: Vec<String> = plots.iter().map(|(k, _)| k.clone()).collect();
    assert_eq!(keys, expected);
    for (file, title) in &plots {
        assert_eq!(file, title);
    }
    // Two hours shown whole would be a solid block of sawteeth: the panels
    // show the stretch where the algorithms disagree, on the log's clock.
    let svg = std::fs::read_to_string(dir.join("shop.log.gz-count-client-198.51.100.23.svg")).unwrap();
    assert!(svg.contains("where the algorithms disagree most"), "{svg:.400}");
    assert!(svg.contains("time (UTC) on 2023-11-14"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--plot-client KEY` (repeatable) picks the count plots' clients; a key
/// that no request has is an error naming it, and a key that is not a safe
/// file name is written in a safe form, its title keeping the key.
#[test]
fn plot_client_picks_the_clients_by_key() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("simulate_trace-plot-client");
    let run = |extra: &[&str]| {
        let _ = std::fs::remove_dir_all(&dir);
        let mut args = vec![
            "simulate",
            "--trace",
            SHOP,
            "--limit",
            "20",
            "--window",
            "1m",
            "--algorithm",
            "sliding_window,fixed_window",
            "--plot",
            dir.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        slidegate(&args)
    };
    let out = run(&["--plot-client", "10.1.3.13", "--plot-client", "203.0.113.9"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let plots = count_plots(&dir, "shop.log.gz");
    assert_eq!(
        plots,
        [
            ("10.1.3.13".to_owned(), "10.1.3.13".to_owned()),
            ("203.0.113.9".to_owned(), "203.0.113.9".to_owned())
        ]
    );

    let out = run(&["--key-by", "path", "--plot-client", "/login"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        count_plots(&dir, "shop.log.gz"),
        [("_login".to_owned(), "/login".to_owned())]
    );

    let out = run(&["--plot-client", "192.0.2.99"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("--plot-client 192.0.2.99: no request has this key"),
        "{}",
        stderr(&out)
    );
    assert!(
        !dir.join("shop.log.gz-error-rates.svg").exists(),
        "nothing drawn before the error"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
