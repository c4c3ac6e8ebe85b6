use super::*;
use std::io::Write;

const S: i64 = 1_000_000_000;
/// 10/Oct/2023:13:55:36 UTC.
const T: i64 = 1_696_946_136 * S;

fn opts(format: FormatChoice, log_format: Option<&str>) -> LogOptions {
    LogOptions {
        format,
        log_format: log_format.map(str::to_string),
        ..LogOptions::default()
    }
}

fn auto() -> LogOptions {
    LogOptions::default()
}

/// Every record of `input`: (line, time, the values of `fields`).
fn records(input: &str, options: &LogOptions, fields: &[&str]) -> Vec<(u64, i64, Vec<Option<String>>)> {
    let mut reader = LogReader::new("t.log", input.as_bytes(), options).unwrap();
    let fields: Vec<Field> = fields.iter().map(|f| reader.field(f).unwrap()).collect();
    let mut out = Vec::new();
    while let Some(r) = reader.next_record().unwrap() {
        let values = fields.iter().map(|f| r.get(f).map(Cow::into_owned)).collect();
        out.push((r.line(), r.time_unix_ns(), values));
    }
    out
}

/// The values of `fields` in the one record of `line`.
fn one(line: &str, options: &LogOptions, fields: &[&str]) -> (i64, Vec<String>) {
    let mut all = records(line, options, fields);
    assert_eq!(all.len(), 1, "{line}");
    let (_, time, values) = all.remove(0);
    (
        time,
        values
            .into_iter()
            .map(|v| v.unwrap_or_else(|| "<none>".into()))
            .collect(),
    )
}

/// The error of the one malformed line `line` read as `options` say.
fn error(line: &str, options: &LogOptions) -> String {
    let mut reader = LogReader::new("t.log", line.as_bytes(), options).unwrap();
    assert!(reader.next_record().unwrap().is_none(), "{line}");
    reader.bad_lines()[0].error.to_string()
}

fn format_of(input: &str) -> String {
    let reader = LogReader::new("t.log", input.as_bytes(), &auto()).unwrap();
    reader.format().map(ToString::to_string).unwrap_or_default()
}

const COMBINED: &str =
    r#"192.0.2.1 - bob [10/Oct/2023:13:55:36 +0000] "GET /a/b?c=1 HTTP/1.1" 200 512 "https://r.example/" "curl/8.4.0""#;
const NGINX_MAIN: &str = r#"$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent "$http_referer" "$http_user_agent" "$http_x_forwarded_for""#;

#[test]
fn clf_lines_and_their_fields() {
    let line = r#"192.0.2.1 - - [10/Oct/2023:19:25:36 +0530] "POST /login HTTP/1.0" 401 -"#;
    let (time, v) = one(
        line,
        &auto(),
        &["client", "remote_host", "user", "method", "path", "status", "request"],
    );
    assert_eq!(time, T);
    assert_eq!(
        v,
        [
            "192.0.2.1",
            "192.0.2.1",
            "-",
            "POST",
            "/login",
            "401",
            "POST /login HTTP/1.0"
        ]
    );
    assert_eq!(format_of(line), "a Common Log Format log");
}

#[test]
fn combined_with_extra_fields() {
    let fields = [
        "client",
        "user",
        "path",
        "referer",
        "user-agent",
        "extra1",
        "extra2",
        "extra3",
    ];
    let (time, v) = one(COMBINED, &auto(), &fields[..5]);
    assert_eq!(time, T);
    assert_eq!(v, ["192.0.2.1", "bob", "/a/b", "https://r.example/", "curl/8.4.0"]);
    assert_eq!(format_of(COMBINED), "a combined log");

    // nginx's `main` format: one quoted extra field.
    let one_extra = format!("{COMBINED} \"203.0.113.7, 10.0.0.1\"");
    let (_, v) = one(&one_extra, &auto(), &["client", "extra1"]);
    assert_eq!(v, ["192.0.2.1", "203.0.113.7, 10.0.0.1"]);
    assert_eq!(format_of(&one_extra), "a combined log with 1 extra field");

    // Three: quoted, bare and bracketed.
    let three = format!("{COMBINED} \"-\" 0.004 [upstream a]");
    let (_, v) = one(&three, &auto(), &fields);
    assert_eq!(v[5..], ["-", "0.004", "upstream a"]);
    assert_eq!(format_of(&three), "a combined log with 3 extra fields");
    let reader = LogReader::new("t.log", three.as_bytes(), &auto()).unwrap();
    assert_eq!(
        reader.format().unwrap().fields(),
        [
            "remote_host",
            "ident",
            "remote_user",
            "time",
            "request",
            "status",
            "bytes",
            "referer",
            "user-agent",
            "extra1",
            "extra2",
            "extra3",
            "client",
            "user",
            "method",
            "path",
        ]
    );
    let err = reader.field("extra9").map(|_| ()).unwrap_err().to_string();
    assert!(
        err.starts_with(
            "field `extra9` is not in t.log, a combined log with 3 extra fields: expected one of remote_host, "
        ),
        "{err}"
    );
    assert_eq!(
        reader.field("host").unwrap_err().to_string(),
        "field `host` is not in t.log, a combined log with 3 extra fields: expected one of remote_host, ident, \
         remote_user, time, request, status, bytes, referer, user-agent, extra1, extra2, extra3, client, user, \
         method, path"
    );
    // Given as `combined`, the extra fields are counted on the first lines too.
    let r = LogReader::new("t.log", one_extra.as_bytes(), &opts(FormatChoice::Combined, None)).unwrap();
    assert_eq!(r.format(), Some(&LogFormat::combined(1)));
}

#[test]
fn unusual_time_zones() {
    for zone in ["19:25:36 +0530", "04:25:36 -0930"] {
        let line = format!(r#"h - - [10/Oct/2023:{zone}] "GET / HTTP/1.1" 200 1"#);
        assert_eq!(one(&line, &auto(), &[]).0, T, "{zone}");
    }
    let line = r#"h - - [11/Oct/2023:03:55:36 +1400] "GET / HTTP/1.1" 200 1"#;
    assert_eq!(one(line, &auto(), &[]).0, T);
    let json = |t: &str| format!(r#"{{"time":"{t}","client":"a"}}"#);
    assert_eq!(one(&json("2023-10-10T19:25:36+05:30"), &auto(), &[]).0, T);
    assert_eq!(one(&json("2023-10-10T04:25:36-09:30"), &auto(), &[]).0, T);
    assert_eq!(one(&json("2023-10-11T03:55:36+14:00"), &auto(), &[]).0, T);
}

#[test]
fn nginx_main_by_its_format_string() {
    let line = format!("{COMBINED} \"203.0.113.7\"");
    for options in [
        opts(FormatChoice::Nginx, Some(NGINX_MAIN)),
        opts(FormatChoice::Auto, Some(NGINX_MAIN)),
    ] {
        let (time, v) = one(
            &line,
            &options,
            &[
                "client",
                "remote_addr",
                "http_x_forwarded_for",
                "forwarded-for",
                "method",
                "path",
                "status",
                "user-agent",
            ],
        );
        assert_eq!(time, T);
        assert_eq!(
            v,
            [
                "192.0.2.1",
                "192.0.2.1",
                "203.0.113.7",
                "203.0.113.7",
                "GET",
                "/a/b",
                "200",
                "curl/8.4.0"
            ]
        );
    }
    let format = LogFormat::nginx(NGINX_MAIN).unwrap();
    assert_eq!(format.name(), "nginx");
    assert!(
        format
            .to_string()
            .starts_with("an nginx log as `$remote_addr - $remote_user")
    );
    // Quotes escaped inside quoted fields, `-` fields, the ${var} form and
    // the ISO 8601 time.
    let braced = r#"${remote_addr} [${time_iso8601}] "$request" ${status} "$http_user_agent""#;
    let line = r#"198.51.100.2 [2023-10-10T13:55:36+00:00] "GET /q?s=\"x\" HTTP/1.1" 200 "agent \"007\"""#;
    let (time, v) = one(
        line,
        &opts(FormatChoice::Nginx, Some(braced)),
        &["client", "path", "user-agent", "request"],
    );
    assert_eq!(time, T);
    assert_eq!(
        v,
        ["198.51.100.2", "/q", r#"agent \"007\""#, r#"GET /q?s=\"x\" HTTP/1.1"#]
    );
    // $msec, and $uri$is_args$args.
    let msec = r#"$msec $remote_addr $uri$is_args$args $status"#;
    let (time, v) = one(
        "1696946136.250 10.0.0.1 /a/b?c=1 204",
        &opts(FormatChoice::Nginx, Some(msec)),
        &["uri", "is_args", "args", "path"],
    );
    assert_eq!(time, T + 250_000_000);
    assert_eq!(v, ["/a/b", "?", "c=1", "/a/b"]);
}

#[test]
fn apache_format_with_forwarded_for_and_duration() {
    let format = r#"%h %l %u %t "%r" %>s %b "%{Referer}i" "%{User-Agent}i" "%{X-Forwarded-For}i" %D"#;
    let line = format!("{COMBINED} \"203.0.113.7\" 1234");
    let (time, v) = one(
        &line,
        &opts(FormatChoice::Apache, Some(format)),
        &[
            "client",
            "%{X-Forwarded-For}i",
            "%{x-forwarded-for}i",
            "forwarded-for",
            "%D",
            "%>s",
            "status",
            "path",
        ],
    );
    assert_eq!(time, T);
    assert_eq!(
        v,
        [
            "192.0.2.1",
            "203.0.113.7",
            "203.0.113.7",
            "203.0.113.7",
            "1234",
            "200",
            "200",
            "/a/b"
        ]
    );
    // %a, %v, %m %U%q %H, %T and a time in milliseconds.
    let format = "%a %v [%{msec}t] \"%m %U%q %H\" %>s %T";
    let line = r#"10.1.1.1 shop.example [1696946136250] "GET /cart?id=3 HTTP/2.0" 200 0"#;
    let (time, v) = one(
        line,
        &opts(FormatChoice::Auto, Some(format)),
        &["client", "host", "method", "path", "%q", "%H"],
    );
    assert_eq!(time, T + 250_000_000);
    assert_eq!(v, ["10.1.1.1", "shop.example", "GET", "/cart", "?id=3", "HTTP/2.0"]);
}

#[test]
fn bad_format_strings_name_the_directive() {
    let e = |r: Result<LogFormat, FormatError>| r.unwrap_err().to_string();
    assert_eq!(
        e(LogFormat::apache("%h %Z %t")),
        "bad apache log format: `%Z` at position 4 is not an Apache log directive"
    );
    assert_eq!(
        e(LogFormat::apache("%h %{Referer i")),
        "bad apache log format: `%{Referer i` at position 4 has no closing `}`"
    );
    assert_eq!(
        e(LogFormat::apache("%{%Y}t %h")),
        "bad apache log format: `%{%Y}t` at position 1 is a time format not supported: expected %t, %{sec}t, \
         %{msec}t, %{usec}t or %{%d/%b/%Y:%H:%M:%S %z}t"
    );
    assert_eq!(
        e(LogFormat::nginx("$remote_addr $ [$time_local]")),
        "bad nginx log format: `$` at position 14 is not followed by a variable name"
    );
    assert_eq!(
        e(LogFormat::nginx("${remote_addr [$time_local]")),
        "bad nginx log format: `${remote_addr` at position 1 has no closing `}`"
    );
    assert_eq!(
        e(LogFormat::nginx("$remote_addr$status [$time_local]")),
        "bad nginx log format: `status` at position 13 follows another field with no text between them"
    );
    assert_eq!(
        e(LogFormat::nginx("$remote_addr $status")),
        "bad nginx log format: `$remote_addr $status` at position 1 has no time: expected $time_local, \
         $time_iso8601 or $msec"
    );
    assert_eq!(
        e(LogFormat::envoy_format("[%START_TIME%] %REQ(:METHOD)")),
        "bad envoy log format: `%REQ(:METHOD)` at position 16 has no closing `%`"
    );
}

const ENVOY_LINE: &str = r#"[2023-10-10T13:55:36.123Z] "GET /api/items?x=1 HTTP/1.1" 200 - 0 512 7 5 "203.0.113.9" "curl/8.4.0" "9a1b-req" "api.example.com" "10.0.0.5:8080""#;

#[test]
fn envoy_default_format() {
    let (time, v) = one(
        ENVOY_LINE,
        &auto(),
        &[
            "client",
            "method",
            "path",
            "host",
            "status",
            "user-agent",
            "REQ(X-REQUEST-ID)",
            "UPSTREAM_HOST",
        ],
    );
    assert_eq!(time, T + 123_000_000);
    assert_eq!(
        v,
        [
            "203.0.113.9",
            "GET",
            "/api/items",
            "api.example.com",
            "200",
            "curl/8.4.0",
            "9a1b-req",
            "10.0.0.5:8080"
        ]
    );
    assert_eq!(format_of(ENVOY_LINE), "an Envoy log in the default format");
    // Its own format strings too.
    let format = "[%START_TIME%] %DOWNSTREAM_REMOTE_ADDRESS% %REQ(:PATH)% %RESPONSE_CODE%\n";
    let (_, v) = one(
        "[2023-10-10T13:55:36Z] 10.0.0.1:4000 /x?y 503",
        &opts(FormatChoice::Envoy, Some(format)),
        &["client", "path", "RESPONSE_CODE", "DOWNSTREAM_REMOTE_ADDRESS"],
    );
    // The client without its port; the field by its own name as written.
    assert_eq!(v, ["10.0.0.1", "/x", "503", "10.0.0.1:4000"]);
}

#[test]
fn json_lines_of_envoy_caddy_and_traefik() {
    let envoy = r#"{"start_time":"2023-10-10T13:55:36.123Z","method":"GET","path":"/api/items?x=1","response_code":200,"downstream_remote_address":"198.51.100.4:51234","user_agent":"curl/8.4.0","authority":"api.example.com","x_forwarded_for":"203.0.113.9"}"#;
    let (time, v) = one(
        envoy,
        &auto(),
        &[
            "client",
            "method",
            "path",
            "status",
            "host",
            "forwarded-for",
            "user-agent",
        ],
    );
    assert_eq!(time, T + 123_000_000);
    assert_eq!(
        v,
        [
            "198.51.100.4",
            "GET",
            "/api/items",
            "200",
            "api.example.com",
            "203.0.113.9",
            "curl/8.4.0"
        ]
    );
    assert_eq!(format_of(envoy), "JSON lines");

    let caddy = r#"{"level":"info","ts":1696946136.5,"logger":"http.log.access","msg":"handled request","request":{"remote_ip":"192.0.2.7","remote_port":"51000","client_ip":"192.0.2.8","proto":"HTTP/2.0","method":"GET","host":"example.com","uri":"/blog/?page=2","headers":{"User-Agent":["Mozilla/5.0","second"],"Accept":["*/*"]}},"status":200,"size":1024}"#;
    let (time, v) = one(
        caddy,
        &auto(),
        &[
            "client",
            "request.remote_ip",
            "method",
            "path",
            "host",
            "user-agent",
            "status",
            "request.headers.Accept",
        ],
    );
    assert_eq!(time, T + 500_000_000);
    assert_eq!(
        v,
        [
            "192.0.2.8",
            "192.0.2.7",
            "GET",
            "/blog/",
            "example.com",
            "Mozilla/5.0",
            "200",
            "*/*"
        ]
    );

    let traefik = r#"{"ClientHost":"192.0.2.9","RequestMethod":"POST","RequestPath":"/login?next=/","RequestHost":"example.com","DownstreamStatus":401,"StartUTC":"2023-10-10T13:55:36.000000001Z","request_User-Agent":"curl/8"}"#;
    let (time, v) = one(
        traefik,
        &auto(),
        &["client", "method", "path", "host", "status", "user-agent"],
    );
    assert_eq!(time, T + 1);
    assert_eq!(v, ["192.0.2.9", "POST", "/login", "example.com", "401", "curl/8"]);

    // A key path not in the first lines is refused with those there are.
    let reader = LogReader::new("t.log", traefik.as_bytes(), &auto()).unwrap();
    let err = reader.field("ClientAddr").unwrap_err().to_string();
    assert!(
        err.starts_with("field `ClientAddr` is not in t.log, JSON lines: expected one of client, user,"),
        "{err}"
    );
    assert!(
        err.contains(", ClientHost,") && err.contains("request_User-Agent"),
        "{err}"
    );
}

#[test]
fn json_time_field_in_every_format() {
    let cases: [(&str, TimeFormat, i64); 9] = [
        (
            r#""2023-10-10T19:25:36.25+05:30""#,
            TimeFormat::Rfc3339,
            T + 250_000_000,
        ),
        ("1696946136", TimeFormat::UnixSeconds, T),
        ("1696946136.25", TimeFormat::UnixSeconds, T + 250_000_000),
        (r#""1696946136.25""#, TimeFormat::UnixSeconds, T + 250_000_000),
        ("1696946136250", TimeFormat::UnixMillis, T + 250_000_000),
        ("1696946136250001", TimeFormat::UnixMicros, T + 250_001_000),
        ("1696946136250000001", TimeFormat::UnixNanos, T + 250_000_001),
        (r#""1696946136250000001""#, TimeFormat::UnixNanos, T + 250_000_001),
        (r#""10/Oct/2023:04:25:36 -0930""#, TimeFormat::Clf, T),
    ];
    for (value, format, expect) in cases {
        let line = format!(r#"{{"meta":{{"when":{value}}},"ip":"10.0.0.1"}}"#);
        let options = LogOptions {
            format: FormatChoice::Json,
            time_field: Some("meta.when".into()),
            time_format: Some(format),
            ..LogOptions::default()
        };
        let (time, v) = one(&line, &options, &["ip"]);
        assert_eq!((time, v[0].as_str()), (expect, "10.0.0.1"), "{value} as {format}");
    }
    let options = LogOptions {
        time_field: Some("when".into()),
        time_format: Some(TimeFormat::Rfc3339),
        ..LogOptions::default()
    };
    assert_eq!(
        error(r#"{"when":1696946136}"#, &options),
        "bad timestamp `1696946136`: expected an RFC 3339 string"
    );
    assert_eq!(error(r#"{"at":1}"#, &options), "no time field: expected `when`");
    assert_eq!(
        error(r#"{"when":"2023-10-10T13:55:36"}"#, &options),
        "bad timestamp `2023-10-10T13:55:36`: no time zone: RFC 3339 needs Z or an offset such as +01:00"
    );
}

#[test]
fn malformed_lines_say_why() {
    let nginx = opts(FormatChoice::Nginx, Some(NGINX_MAIN));
    assert_eq!(
        error(&format!("{COMBINED} \"x\" more"), &nginx),
        "text after the last field: ` more`"
    );
    assert_eq!(
        error(&format!("{COMBINED} 203.0.113.7"), &nginx),
        "expected `\" \"` after http_user_agent, found `curl/8.4.0\" 203.0.113.7`"
    );
    assert_eq!(
        error(
            r#"192.0.2.1 - - [10/Oct/2023:13:55:36 +0000] "GET / HTTP/1.1 200 1 "-" "-" "-""#,
            &nginx
        ),
        "expected ` \"` after body_bytes_sent, found `\"-\"`"
    );
    assert_eq!(
        error(
            r#"192.0.2.1 - - 10/Oct/2023:13:55:36 +0000] "GET /" 200 1 "-" "-" "-""#,
            &nginx
        ),
        "expected ` [` after remote_user, found `- 10/Oct/2023:13:55:36 +0000] \"GET /\" 200 1 \"-\" \"-\" \"-\"`"
    );
    assert_eq!(
        error(
            r#"192.0.2.1 - - [10/Okt/2023:13:55:36 +0000] "GET /" 200 1 "-" "-" "-""#,
            &nginx
        ),
        "unknown month `Okt`"
    );
    assert_eq!(
        error(
            &ENVOY_LINE.replace("2023-10-10T13:55:36.123Z", "2023-10-10 13:55:36"),
            &opts(FormatChoice::Envoy, None)
        ),
        "bad timestamp `2023-10-10 13:55:36`: no time zone: RFC 3339 needs Z or an offset such as +01:00"
    );
    assert_eq!(
        error("{\"ts\": 1", &opts(FormatChoice::Json, None)),
        "not a JSON object: EOF while parsing an object at line 1 column 8"
    );
    assert_eq!(
        error("[1]", &opts(FormatChoice::Json, None)),
        "not a JSON object: not an object"
    );
    assert_eq!(
        error(r#"{"client":"a"}"#, &opts(FormatChoice::Json, None)),
        "no time field: expected start_time, ts, StartUTC, time, timestamp or @timestamp"
    );
    // Never "wrong field count" for a combined line with extra fields.
    assert_eq!(
        error(
            r#"h - - [10/Oct/2023:13:55:36 +0000] "GET /" 200 1 "-""#,
            &opts(FormatChoice::Combined, None)
        ),
        "wrong field count: expected 9, found 8"
    );
}

#[test]
fn bad_lines_keep_their_text_clipped() {
    let long = "x".repeat(300);
    let input = format!("{COMBINED}\n{long}\ncafé {long}\n");
    let mut reader = LogReader::new("t.log", input.as_bytes(), &auto()).unwrap();
    while reader.next_record().unwrap().is_some() {}
    let bad = reader.bad_lines();
    assert_eq!((bad[0].line, bad[1].line), (2, 3));
    assert_eq!(bad[0].text, format!("{}…", "x".repeat(120)));
    assert_eq!(bad[1].text.chars().count(), 121);
    let stop = LogOptions {
        on_error: OnError::Stop,
        ..auto()
    };
    let mut reader = LogReader::new("t.log", "h - - [1] \"GET /\" 200 1 \"-\" \"-\"\n".as_bytes(), &stop).unwrap();
    assert_eq!(
        reader.next_record().map(|_| ()).unwrap_err().to_string(),
        "t.log:1: bad date `1`: expected dd/Mon/yyyy:HH:MM:SS ±hhmm (read as a combined log): `h - - [1] \"GET /\" \
         200 1 \"-\" \"-\"`"
    );
}

#[test]
fn detection_picks_what_most_lines_parse_as() {
    let csv = "timestamp,key\n1696946136,a\n1696946137,b\n";
    assert_eq!(format_of(csv), "a `timestamp,key` CSV");
    // Most lines are combined with one extra field; one is malformed.
    let mixed = format!("garbage\n{COMBINED} \"a\"\n{COMBINED} \"b\"\n");
    let reader = LogReader::new("t.log", mixed.as_bytes(), &auto()).unwrap();
    assert_eq!(reader.format(), Some(&LogFormat::combined(1)));
    assert_eq!(reader.detection(), Some(&Detection { sampled: 3, parsed: 2 }));
    assert_eq!(records(&mixed, &auto(), &["extra1"]).len(), 2);
    // Records past the first lines sampled come in order.
    let many: String = (0..25).map(|i| format!("{},k{i}\n", 1_696_946_136 + i)).collect();
    let got = records(&many, &auto(), &["key"]);
    assert_eq!(got.len(), 25);
    assert!(
        got.iter()
            .enumerate()
            .all(|(i, r)| r.0 == i as u64 + 1 && r.2[0].as_deref() == Some(&*format!("k{i}")))
    );
}

#[test]
fn nothing_parses_says_what_was_assumed() {
    let input = format!("{COMBINED} \"a\"\n").replace("[10/Oct", "[10/Okt").repeat(4);
    let err = crate::read_trace("t.log", input.as_bytes(), &crate::TraceOptions::default(), &mut |_| {})
        .unwrap_err()
        .to_string();
    let text = r#"192.0.2.1 - bob [10/Okt/2023:13:55:36 +0000] "GET /a/b?c=1 HTTP/1.1" 200 512 "https://r.example/" "curl/8.4.0" "a""#;
    assert_eq!(
        err,
        format!(
            "no requests in t.log: all 4 non-empty lines are malformed as a combined log; line 1: \
             unknown month `Okt`: `{text}`; line 2: unknown month `Okt`: `{text}`; line 3: unknown month `Okt`: \
             `{text}`"
        )
    );
}

#[test]
fn gzip_is_read_by_its_magic_bytes() {
    let dir = std::env::temp_dir().join(format!("slidegate-logs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Two gzip members, as logrotate's `cat a.gz b.gz` gives, named .log.
    let path = dir.join("access.log");
    let mut bytes = Vec::new();
    for part in [format!("{COMBINED}\n"), format!("{COMBINED}\n")] {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(part.as_bytes()).unwrap();
        bytes.extend(gz.finish().unwrap());
    }
    std::fs::write(&path, &bytes).unwrap();
    let input = open_log(&path).unwrap();
    assert!(input.is_gzip());
    assert_eq!(input.len(), bytes.len() as u64);
    let consumed = input.consumed();
    let mut reader = LogReader::new("access.log", input, &auto()).unwrap();
    let mut n = 0;
    while reader.next_record().unwrap().is_some() {
        n += 1;
    }
    assert_eq!((n, consumed.get()), (2, bytes.len() as u64));
    let plain = dir.join("plain.gz");
    std::fs::write(&plain, COMBINED).unwrap();
    let mut reader = open_log_file(&plain, &auto()).unwrap();
    assert!(reader.next_record().unwrap().is_some());
    let _ = std::fs::remove_dir_all(&dir);
}

/// An endless-looking log made on the fly: `n` lines, every tenth malformed.
struct Generated {
    next: u64,
    n: u64,
    line: Vec<u8>,
    at: usize,
}

impl Read for Generated {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let available = self.fill_buf()?;
        let n = available.len().min(buf.len());
        buf[..n].copy_from_slice(&available[..n]);
        self.consume(n);
        Ok(n)
    }
}

impl BufRead for Generated {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        if self.at == self.line.len() && self.next < self.n {
            self.line.clear();
            let i = self.next;
            if i % 10 == 9 {
                writeln!(self.line, "broken line {i}")?;
            } else {
                writeln!(
                    self.line,
                    "10.0.{}.{} - - [10/Oct/2023:13:55:36 +0000] \"GET /{i} HTTP/1.1\" 200 1 \"-\" \"ua\" \"x\"",
                    i % 256,
                    i % 7
                )?;
            }
            self.next += 1;
            self.at = 0;
        }
        Ok(&self.line[self.at..])
    }

    fn consume(&mut self, amount: usize) {
        self.at = (self.at + amount).min(self.line.len());
    }
}

#[test]
fn a_million_lines_in_bounded_memory() {
    let n = 1_000_000;
    let input = Generated {
        next: 0,
        n,
        line: Vec::new(),
        at: 0,
    };
    let mut reader = LogReader::new("generated", input, &auto()).unwrap();
    assert_eq!(reader.format(), Some(&LogFormat::combined(1)));
    let client = reader.field("client").unwrap();
    let (mut records, mut last_line, mut longest) = (0u64, 0, 0);
    while let Some(r) = reader.next_record().unwrap() {
        records += 1;
        last_line = r.line();
        longest = longest.max(r.get(&client).map_or(0, |c| c.len()));
    }
    assert_eq!((records, last_line, reader.lines()), (900_000, n - 1, n));
    assert_eq!(reader.skipped(), 100_000);
    // Only the first bad lines are kept, and the buffers are one line's.
    assert_eq!(reader.bad_lines().len(), REPORTED_BAD_LINES);
    assert_eq!(reader.bad_lines()[0].line, 10);
    assert!(reader.pending.is_empty());
    assert!(reader.line.capacity() < 1024 && reader.scratch.spans.capacity() <= 16);
    assert!(longest <= "10.0.255.6".len());
}

#[test]
fn envoy_default_compiles() {
    let f = LogFormat::envoy();
    assert_eq!(f.name(), "envoy");
    assert!(f.field("REQ(:METHOD)").is_some() && f.field("forwarded-for").is_some());
}

#[test]
fn client_addresses_lose_their_port() {
    for (address, client) in [
        ("198.51.100.4:51234", "198.51.100.4"),
        ("[2001:db8::1]:443", "2001:db8::1"),
        ("2001:db8::1", "2001:db8::1"),
        ("198.51.100.4", "198.51.100.4"),
        ("host:name", "host:name"),
        (":80", ":80"),
    ] {
        let line = format!(r#"{{"start_time":"2023-10-10T13:55:36Z","downstream_remote_address":"{address}"}}"#);
        let (_, v) = one(&line, &auto(), &["client", "downstream_remote_address"]);
        assert_eq!(v, [client, address], "{address}");
    }
}
