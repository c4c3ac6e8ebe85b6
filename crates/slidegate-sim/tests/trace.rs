//! Access logs as traffic: the parsers, the trace → requests conversion,
//! and the committed fixture's figures, checked against a brute-force count
//! written here from the definitions.

use proptest::prelude::*;
use slidegate_core::{Algorithm, Policy, Weighting};
use slidegate_sim::{
    FormatChoice, LineError, LogFormat, LogOptions, OnError, ReorderOptions, Request, Row, Trace, TraceError,
    TraceOptions, evaluate, evaluate_stream, is_csv_header, parse_clf_line, parse_clf_time, parse_combined_line,
    parse_csv_line, parse_csv_time, read_trace, run_requests, stream_trace, trace_requests_of,
};
use std::time::Duration;

const S: i64 = 1_000_000_000;
const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/access.log");

fn fixture() -> Vec<u8> {
    std::fs::read(FIXTURE).unwrap()
}

#[allow(clippy::result_large_err)] // the library's error, as it is
fn read(input: &[u8], options: TraceOptions) -> Result<Trace, TraceError> {
    read_trace("test.log", input, &options, &mut |_| {})
}

fn options(format: FormatChoice, key_by: &str, on_error: OnError) -> TraceOptions {
    TraceOptions {
        log: LogOptions {
            format,
            on_error,
            ..LogOptions::default()
        },
        key_by: key_by.to_string(),
        ..TraceOptions::default()
    }
}

fn skip() -> TraceOptions {
    TraceOptions::default()
}

fn stop() -> TraceOptions {
    options(FormatChoice::Auto, "client", OnError::Stop)
}

// ---------------------------------------------------------------- parsers

#[test]
fn clf_line_with_a_negative_offset() {
    let l = parse_clf_line(r#"127.0.0.1 - frank [10/Oct/2000:13:55:36 -0700] "GET /apache_pb.gif HTTP/1.0" 200 2326"#)
        .unwrap();
    // 13:55:36 at UTC−7 is 20:55:36 UTC.
    assert_eq!(l.time_unix_ns, 971_211_336 * S);
    assert_eq!(
        (l.host, l.ident, l.user, l.request, l.status, l.bytes),
        ("127.0.0.1", "-", "frank", "GET /apache_pb.gif HTTP/1.0", "200", "2326")
    );
    assert_eq!((l.referer, l.user_agent), (None, None));
    assert_eq!(l.path(), "/apache_pb.gif");
}

#[test]
fn clf_times() {
    let t = |s| parse_clf_time(s).unwrap();
    assert_eq!(t("10/Oct/2000:20:55:36 +0000"), 971_211_336 * S);
    assert_eq!(t("10/Oct/2000:22:25:36 +0130"), 971_211_336 * S);
    assert_eq!(t("01/Jan/1970:00:00:00 +0000"), 0);
    assert_eq!(t("31/Dec/1969:23:59:59 +0000"), -S);
    assert_eq!(t("29/Feb/2024:00:00:00 +0000"), 1_709_164_800 * S);
    assert_eq!(t("01/jan/2000:00:59:59 +0100"), 946_684_799 * S);
}

#[test]
fn combined_line() {
    let line = r#"203.0.113.5 - alice [10/Oct/2023:13:55:05 -0700] "GET /api/orders?id=1 HTTP/1.1" 200 311 "https://example.com/a?b=1" "curl/8.4.0 \"x\"""#;
    let l = parse_combined_line(line).unwrap();
    assert_eq!(l.time_unix_ns, 1_696_971_305 * S);
    assert_eq!(l.path(), "/api/orders");
    assert_eq!(l.referer, Some("https://example.com/a?b=1"));
    assert_eq!(l.user_agent, Some(r#"curl/8.4.0 \"x\""#));
    // A combined line is not a CLF line, nor the reverse.
    assert_eq!(
        parse_clf_line(line).unwrap_err(),
        LineError::FieldCount { expected: 7, found: 9 }
    );
    let clf = r#"h - - [10/Oct/2023:13:55:05 -0700] "-" 400 -"#;
    assert_eq!(
        parse_combined_line(clf).unwrap_err(),
        LineError::FieldCount { expected: 9, found: 7 }
    );
    // No request target: the path is the request itself.
    assert_eq!(parse_clf_line(clf).unwrap().path(), "-");
}

#[test]
fn csv_lines() {
    let l = parse_csv_line("1700000000.250,client-1").unwrap();
    assert_eq!(
        (l.time_unix_ns, l.key.as_ref()),
        (1_700_000_000 * S + 250_000_000, "client-1")
    );
    let l = parse_csv_line("2023-11-14T22:13:20.25Z,k").unwrap();
    assert_eq!(l.time_unix_ns, 1_700_000_000 * S + 250_000_000);
    let l = parse_csv_line(r#"1700000000,"a,b ""quoted"" key""#).unwrap();
    assert_eq!(
        (l.time_unix_ns, l.key.as_ref()),
        (1_700_000_000 * S, r#"a,b "quoted" key"#)
    );
    let l = parse_csv_line(r#" 1700000000 , "x,y" "#).unwrap();
    assert_eq!(l.key, "x,y");
    assert!(is_csv_header("timestamp,key"));
    assert!(is_csv_header("Timestamp, Key"));
    assert!(!is_csv_header("1700000000,key"));
}

#[test]
fn csv_times() {
    let t = |s| parse_csv_time(s).unwrap();
    assert_eq!(t("1700000000"), 1_700_000_000 * S);
    assert_eq!(t("1700000000.5"), 1_700_000_000 * S + 500_000_000);
    assert_eq!(t("0.000000001"), 1);
    assert_eq!(t("1.1234567899"), S + 123_456_789);
    assert_eq!(t("2023-11-14T23:13:20+01:00"), 1_700_000_000 * S);
    assert_eq!(t("2023-11-14 17:13:20.000000001-05:00"), 1_700_000_000 * S + 1);
    assert_eq!(t("2023-11-14t22:13:20z"), 1_700_000_000 * S);
    let reason = |s| match parse_csv_time(s).unwrap_err() {
        LineError::BadTimestamp { reason, .. } => reason,
        other => panic!("{other:?}"),
    };
    assert!(reason("2023-11-14T22:13:20").starts_with("no time zone"));
    assert_eq!(reason("2023-02-29T00:00:00Z"), "day out of range for its month");
    assert_eq!(reason("2023-11-14T24:00:00Z"), "time of day out of range");
    assert!(reason("now").starts_with("expected Unix seconds"));
    assert!(reason("1700000000.").starts_with("expected Unix seconds"));
    assert!(reason("-5").starts_with("expected Unix seconds"));
    assert!(reason("").starts_with("expected Unix seconds"));
    assert_eq!(reason("99999999999"), "after the year 2261");
}

#[test]
fn malformed_lines_say_why() {
    let clf = |l| parse_clf_line(l).unwrap_err().to_string();
    assert_eq!(
        clf(r#"h - - [32/Oct/2000:13:55:36 -0700] "GET / HTTP/1.0" 200 1"#),
        "bad date `32/Oct/2000:13:55:36 -0700`: day out of range for its month"
    );
    assert_eq!(
        clf(r#"h - - [10/Oct/2000:13:55 -0700] "GET / HTTP/1.0" 200 1"#),
        "bad date `10/Oct/2000:13:55 -0700`: expected dd/Mon/yyyy:HH:MM:SS ±hhmm"
    );
    assert_eq!(
        clf(r#"h - - [10/Okt/2000:13:55:36 -0700] "GET / HTTP/1.0" 200 1"#),
        "unknown month `Okt`"
    );
    assert_eq!(
        clf(r#"h - - 10/Oct/2000:13:55:36 -0700] "GET / HTTP/1.0" 200 1"#),
        "missing `[` before the time, found `10/Oct/2000:13:55:36`"
    );
    assert_eq!(
        clf(r#"h - - [10/Oct/2000:13:55:36 -0700 "GET / HTTP/1.0" 200 1"#),
        "missing `]` after the time"
    );
    assert_eq!(
        clf(r#"h - - [10/Oct/2000:13:55:36 -0700] "GET / HTTP/1.0" 200"#),
        "wrong field count: expected 7, found 6"
    );
    assert_eq!(
        clf(r#"h - - [10/Oct/2000:13:55:36 -0700] GET / HTTP/1.0 200 1"#),
        "bad request `GET`: expected a double-quoted field"
    );
    assert_eq!(
        clf(r#"h - - [10/Oct/2000:13:55:36 -0700] "GET / HTTP/1.0 200 1"#),
        "a quoted field has no closing `\"`"
    );
    assert_eq!(
        clf(r#"h - - [10/Oct/2000:13:55:36 -0700] "GET /" OK 1"#),
        "bad status `OK`: expected a number"
    );
    assert_eq!(clf(""), "wrong field count: expected 7, found 0");
    let csv = |l| parse_csv_line(l).unwrap_err().to_string();
    assert_eq!(
        csv("yesterday,k"),
        "bad timestamp `yesterday`: expected Unix seconds (1700000000.250) or RFC 3339 (2023-11-14T22:13:20.25Z)"
    );
    assert_eq!(csv("1700000000"), "wrong field count: expected 2, found 1");
    assert_eq!(csv("1700000000,a,b"), "wrong field count: expected 2, found 3");
    assert_eq!(csv("1700000000,"), "empty key");
    assert_eq!(csv(r#"1700000000,"a"b"#), "text after a quoted field's closing `\"`");
    assert_eq!(csv(r#"1700000000,"ab"#), "a quoted field has no closing `\"`");
}

// ---------------------------------------------------------------- reading

#[test]
fn csv_trace_with_a_header_sorted_stably() {
    let input = b"timestamp,key\r\n\
                  1700000002,b\r\n\
                  \r\n\
                  1700000000.5,a\r\n\
                  2023-11-14T22:13:22Z,c\r\n\
                  1700000000,\"b\"\r\n";
    let t = read(input, skip()).unwrap();
    assert_eq!(t.format, LogFormat::csv());
    assert_eq!((t.lines, t.skipped, t.clients), (6, 0, 3));
    assert_eq!(t.start_unix_ns, 1_700_000_000 * S);
    let r = |time_ns: u64, client| Request {
        time_ns,
        client,
        cost: 1,
    };
    // b is client 0, a 1, c 2 (first appearance); b and c at the same time
    // keep their order in the file.
    assert_eq!(
        t.requests,
        vec![r(0, 0), r(500_000_000, 1), r(2_000_000_000, 0), r(2_000_000_000, 2)]
    );
    assert_eq!(t.span_ns(), 2_000_000_000);
}

#[test]
fn skipped_lines_are_numbered_with_their_reason() {
    let mut input = Vec::new();
    input.extend_from_slice(b"\xEF\xBB\xBF1700000000,a\n");
    input.extend_from_slice(b"1700000001,b\n");
    input.extend_from_slice(b"soon,c\n");
    input.extend_from_slice(b"\n");
    input.extend_from_slice(b"1700000002,caf\xC3\xA9\n");
    input.extend_from_slice(b"1700000003,caf\xE9\n");
    input.extend_from_slice(b"1700000004\n");
    let t = read(&input, skip()).unwrap();
    assert_eq!((t.requests.len(), t.clients, t.skipped), (3, 3, 3));
    let lines: Vec<(u64, String)> = t.bad_lines.iter().map(|b| (b.line, b.error.to_string())).collect();
    assert_eq!(
        lines,
        vec![
            (
                3,
                "bad timestamp `soon`: expected Unix seconds (1700000000.250) or RFC 3339 (2023-11-14T22:13:20.25Z)"
                    .to_string()
            ),
            (6, "invalid UTF-8 at byte 15".to_string()),
            (7, "wrong field count: expected 2, found 1".to_string()),
        ]
    );
    // The same with --on-error stop: the first one ends the read.
    let err = read(&input, stop()).unwrap_err();
    assert!(
        matches!(
            &err,
            TraceError::BadLine {
                line: 3,
                error: LineError::BadTimestamp { .. },
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().starts_with("test.log:3: bad timestamp `soon`"), "{err}");
}

#[test]
fn bad_dates_are_numbered_with_their_reason() {
    let input = b"h - - [10/Oct/2000:13:55:36 -0700] \"GET / HTTP/1.0\" 200 1\n\
                  h - - [31/Sep/2000:13:55:36 -0700] \"GET / HTTP/1.0\" 200 1\n\
                  \n\
                  h - - [10/Oct/2000:13:55:37 -0700] \"GET / HTTP/1.0\" 200 1\n\
                  h - - [10/Oct/2000:25:00:00 -0700] \"GET / HTTP/1.0\" 200 1\n\
                  h - - [10/Oct/2000:13:55:38 +2400] \"GET / HTTP/1.0\" 200 1\n";
    let t = read(input, skip()).unwrap();
    assert_eq!((t.format, t.requests.len(), t.skipped), (LogFormat::clf(), 2, 3));
    let lines: Vec<(u64, String)> = t.bad_lines.iter().map(|b| (b.line, b.error.to_string())).collect();
    assert_eq!(
        lines,
        vec![
            (
                2,
                "bad date `31/Sep/2000:13:55:36 -0700`: day out of range for its month".to_string()
            ),
            (
                5,
                "bad date `10/Oct/2000:25:00:00 -0700`: time of day out of range".to_string()
            ),
            (
                6,
                "bad date `10/Oct/2000:13:55:38 +2400`: time zone offset out of range".to_string()
            ),
        ]
    );
    let err = read(input, stop()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "test.log:2: bad date `31/Sep/2000:13:55:36 -0700`: day out of range for its month (read as a Common Log \
         Format log): `h - - [31/Sep/2000:13:55:36 -0700] \"GET / HTTP/1.0\" 200 1`"
    );
}

#[test]
fn only_the_first_bad_lines_are_kept() {
    let mut input = String::from("1700000000,a\n");
    for _ in 0..30 {
        input.push_str("x,a\n");
    }
    let t = read(input.as_bytes(), skip()).unwrap();
    assert_eq!((t.requests.len(), t.skipped, t.bad_lines.len()), (1, 30, 20));
    assert_eq!(t.bad_lines[19].line, 21);
}

#[test]
fn no_requests_is_an_error() {
    for (input, message) in [
        (&b""[..], "no requests in test.log: it has no non-empty line"),
        (b"\n\n  \r\n", "no requests in test.log: it has no non-empty line"),
        (b"\xEF\xBB\xBF", "no requests in test.log: it has no non-empty line"),
        (b"timestamp,key\n", "no requests in test.log: it has only a header line"),
        (
            b"x,a\ny,b\n",
            "no requests in test.log: all 2 non-empty lines are malformed as a `timestamp,key` CSV; line 1: bad \
             timestamp `x`: expected Unix seconds (1700000000.250) or RFC 3339 (2023-11-14T22:13:20.25Z): `x,a`; \
             line 2: bad timestamp `y`: expected Unix seconds (1700000000.250) or RFC 3339 \
             (2023-11-14T22:13:20.25Z): `y,b`",
        ),
    ] {
        let err = read(input, skip()).unwrap_err();
        assert!(matches!(err, TraceError::NoRequests { .. }), "{input:?}: {err:?}");
        assert_eq!(err.to_string(), message);
    }
}

#[test]
fn format_detection() {
    let clf = br#"h - - [10/Oct/2000:13:55:36 -0700] "GET / HTTP/1.0" 200 1"#;
    assert_eq!(read(clf, skip()).unwrap().format, LogFormat::clf());
    assert_eq!(read(&fixture(), skip()).unwrap().format, LogFormat::combined(0));
    // A malformed first line does not hide the format of the others.
    let bad_first = b"h - - [10/Okt/2000:13:55:36 -0700] \"GET / HTTP/1.0\" 200 1\n\
                      h - - [10/Oct/2000:13:55:36 -0700] \"GET / HTTP/1.0\" 200 1\n";
    let t = read(bad_first, skip()).unwrap();
    assert_eq!((t.format, t.requests.len(), t.skipped), (LogFormat::clf(), 1, 1));
    let err = read(b"\nhello\n", skip()).unwrap_err();
    assert!(matches!(err, TraceError::UnknownFormat { line: 2, .. }), "{err:?}");
    // A format given is not second-guessed: every line is checked against it.
    let err = read(clf, options(FormatChoice::Combined, "client", OnError::Stop)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "test.log:1: wrong field count: expected 9, found 7 (read as a combined log): `h - - [10/Oct/2000:13:55:36 \
         -0700] \"GET / HTTP/1.0\" 200 1`"
    );
}

#[test]
fn keys_must_be_fields_of_the_format() {
    let clf = br#"h - - [10/Oct/2000:13:55:36 -0700] "GET / HTTP/1.0" 200 1"#;
    let err = read(clf, options(FormatChoice::Auto, "user-agent", OnError::Skip)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "field `user-agent` is not in test.log, a Common Log Format log: expected one of remote_host, ident, \
         remote_user, time, request, status, bytes, client, user, method, path"
    );
    let err = read(b"1,a\n", options(FormatChoice::Auto, "path", OnError::Skip)).unwrap_err();
    assert!(matches!(err, TraceError::FieldNotInFormat { .. }));
    assert_eq!(
        read(b"1,a\n", options(FormatChoice::Auto, "key", OnError::Skip))
            .unwrap()
            .clients,
        1
    );
}

#[test]
fn keys_of_the_fixture() {
    let clients = |key_by| {
        read(&fixture(), options(FormatChoice::Auto, key_by, OnError::Skip))
            .unwrap()
            .clients
    };
    assert_eq!(clients("client"), 3);
    assert_eq!(clients("remote_host"), 3);
    // `-` is a key like any other: everyone but alice.
    assert_eq!(clients("user"), 2);
    assert_eq!(clients("user-agent"), 3);
    // "-" and three pages.
    assert_eq!(clients("referer"), 4);
    // GET, POST and DELETE.
    assert_eq!(clients("method"), 3);
    // /index.html /static/app.css /api/orders /static/app.js /api/search
    // /favicon.ico /about.html /contact.html /static/logo.png
    // /api/orders/17 /api/orders/18 /blog/
    assert_eq!(clients("path"), 12);
}

#[test]
fn too_many_clients_names_the_count() {
    let input: String = (0..10).map(|i| format!("{i},k{i}\n")).collect();
    let limited = TraceOptions {
        max_clients: 4,
        ..TraceOptions::default()
    };
    let err = read(input.as_bytes(), limited).unwrap_err();
    assert_eq!(
        err.to_string(),
        "test.log has 10 distinct keys by client, more than the 4 clients allowed"
    );
    let raised = TraceOptions {
        max_clients: 10,
        ..TraceOptions::default()
    };
    assert_eq!(read(input.as_bytes(), raised).unwrap().clients, 10);
}

#[test]
fn progress_reaches_the_end() {
    let data = fixture();
    let mut last = 0;
    read_trace("f", data.as_slice(), &skip(), &mut |n| last = n).unwrap();
    assert_eq!(last, data.len() as u64);
}

proptest! {
    /// Any bytes: a trace or an error, never a panic.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        for format in [FormatChoice::Auto, FormatChoice::Clf, FormatChoice::Combined, FormatChoice::Csv,
                       FormatChoice::Envoy, FormatChoice::Json] {
            let _ = read(&bytes, options(format, "client", OnError::Skip));
        }
    }

    /// Every prefix of a good line, and a good line with any byte replaced.
    #[test]
    fn mangled_lines_never_panic(at in 0usize..200, byte in any::<u8>()) {
        let lines = [
            &br#"203.0.113.5 - alice [10/Oct/2023:13:55:05 -0700] "GET /a?b HTTP/1.1" 200 311 "-" "curl/8.4.0""#[..],
            b"2023-11-14T22:13:20.25+01:00,\"a,\"\"b\"",
        ];
        for line in lines {
            let mut mangled = line.to_vec();
            if let Some(b) = mangled.get_mut(at) {
                *b = byte;
            }
            for input in [&line[..at.min(line.len())], &mangled[..]] {
                if let Ok(s) = std::str::from_utf8(input) {
                    let _ = parse_clf_line(s);
                    let _ = parse_combined_line(s);
                    let _ = parse_csv_line(s);
                }
                let _ = read(input, skip());
            }
        }
    }
}

// ---------------------------------------------------------------- the fixture

/// The fixture's requests, read by hand: (seconds after 20:55:00 UTC, client)
/// in time order, lines at the same second in file order. Clients by first
/// appearance: 192.0.2.10, 203.0.113.5 (alice, whose lines at :21 and :22
/// are also written at +0000 and +0200), 198.51.100.7 (the burst).
const FIXTURE_REQUESTS: [(u64, u32); 36] = {
    const A: u32 = 0;
    const C: u32 = 1;
    const B: u32 = 2;
    [
        (0, A),
        (3, A),
        (5, C),
        (6, A),
        (8, B),
        (8, C),
        (8, B),
        (9, B),
        (9, B),
        (9, B),
        (9, C),
        (9, B),
        (9, C),
        (9, B),
        (9, A),
        (12, B),
        (12, C),
        (12, A),
        (13, C),
        (14, B),
        (15, B),
        (15, A),
        (16, B),
        (17, B),
        (18, A),
        (19, B),
        (21, C),
        (21, A),
        (21, C),
        (22, B),
        (22, C),
        (22, C),
        (23, B),
        (24, A),
        (27, A),
        (31, C),
    ]
};

#[test]
fn fixture_reads_as_written_by_hand() {
    let t = read(&fixture(), skip()).unwrap();
    assert_eq!((t.lines, t.skipped, t.clients), (39, 3, 3));
    // 10/Oct/2023:13:55:00 -0700.
    assert_eq!(t.start_unix_ns, 1_696_971_300 * S);
    let expect: Vec<Request> = FIXTURE_REQUESTS
        .iter()
        .map(|&(s, client)| Request {
            time_ns: s * 1_000_000_000,
            client,
            cost: 1,
        })
        .collect();
    assert_eq!(t.requests, expect);
    let bad: Vec<(u64, String)> = t.bad_lines.iter().map(|b| (b.line, b.error.to_string())).collect();
    assert_eq!(
        bad,
        vec![
            (
                16,
                "missing `[` before the time, found `10/Oct/2023:13:55:10`".to_string()
            ),
            (24, "unknown month `Okt`".to_string()),
            (34, "wrong field count: expected 9, found 6".to_string()),
        ]
    );
    assert!(matches!(
        read(&fixture(), stop()).unwrap_err(),
        TraceError::BadLine {
            line: 16,
            error: LineError::MissingBracket { .. },
            ..
        }
    ));
}

/// Figures of one policy from the definitions, for one client's times.
#[derive(Debug, Default, PartialEq)]
struct Brute {
    admitted: u64,
    wrongly_allowed: u64,
    wrongly_denied: u64,
    max_window_admitted: u64,
}

/// `sliding_log` or two interpolated buckets (`b = W`) over every client,
/// counted from scratch for every request.
fn brute(requests: &[(u64, u32)], limit: u64, w: u64, two_buckets: bool) -> Brute {
    // The count of `times` in (t − w, t].
    let in_window = |times: &[u64], t: u64| times.iter().filter(|&&u| u <= t && u + w > t).count() as u64;
    // Estimate + 1 ≤ limit, scaled by b = w: cur·b + old·(b − e) + b ≤ limit·b.
    let allows = |times: &[u64], t: u64| {
        if two_buckets {
            let (k, e) = (t / w, t % w);
            let cur = times.iter().filter(|&&u| u / w == k).count() as u64;
            let old = times.iter().filter(|&&u| k > 0 && u / w == k - 1).count() as u64;
            cur * w + old * (w - e) + w <= limit * w
        } else {
            in_window(times, t) < limit
        }
    };
    let mut out = Brute::default();
    for client in 0..3 {
        let times: Vec<u64> = requests.iter().filter(|r| r.1 == client).map(|r| r.0).collect();
        let mut admitted: Vec<u64> = Vec::new();
        for (i, &t) in times.iter().enumerate() {
            let seen = &times[..i];
            match (allows(seen, t), in_window(seen, t) < limit) {
                (true, false) => out.wrongly_allowed += 1,
                (false, true) => out.wrongly_denied += 1,
                _ => {}
            }
            if allows(&admitted, t) {
                admitted.push(t);
            }
        }
        out.admitted += admitted.len() as u64;
        let most = admitted.iter().map(|&t| in_window(&admitted, t)).max().unwrap_or(0);
        out.max_window_admitted = out.max_window_admitted.max(most);
    }
    out
}

fn figures(row: &Row) -> Brute {
    Brute {
        admitted: row.admitted,
        wrongly_allowed: row.wrongly_allowed.unwrap(),
        wrongly_denied: row.wrongly_denied.unwrap(),
        max_window_admitted: row.max_window_admitted,
    }
}

#[test]
fn fixture_figures_match_the_definitions() {
    let t = read(&fixture(), skip()).unwrap();
    let window = Duration::from_secs(10);
    let log = Policy::new(5, window, Algorithm::SlidingLog).unwrap();
    let two = Policy::new(
        5,
        window,
        Algorithm::SlidingWindow {
            buckets: 2,
            weighting: Weighting::Interpolated,
        },
    )
    .unwrap();
    let rows = run_requests(&[log, two], "access.log", &t.requests, 2, &|| {});
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0], Row::new(&log, "access.log", evaluate(&log, &t.requests)));
    for r in &rows {
        assert_eq!((r.traffic.as_str(), r.requests, r.clients), ("access.log", 36, 3));
    }
    let hand: Vec<(u64, u32)> = FIXTURE_REQUESTS.iter().map(|&(s, c)| (s * 1_000_000_000, c)).collect();
    let w = 10_000_000_000;

    // sliding_log is exact: no wrong decision, never over the limit. The
    // burst gets 8 of its 15 in, alice 10 of her 11, the steady client all 10.
    let expect = Brute {
        admitted: 28,
        wrongly_allowed: 0,
        wrongly_denied: 0,
        max_window_admitted: 5,
    };
    assert_eq!(brute(&hand, 5, w, false), expect);
    assert_eq!(figures(&rows[0]), expect);
    assert_eq!(rows[0].mean_abs_error, Some(0.0));

    // Two interpolated buckets: the burst at the end of the first bucket
    // weighs less and less in the second, so 8 of the burst's requests land
    // in one window; alice's early and late requests in a bucket give one
    // wrong decision each way.
    let expect = Brute {
        admitted: 31,
        wrongly_allowed: 1,
        wrongly_denied: 1,
        max_window_admitted: 8,
    };
    assert_eq!(brute(&hand, 5, w, true), expect);
    assert_eq!(figures(&rows[1]), expect);
    assert_eq!(rows[1].max_window_ratio, 1.6);
}

#[test]
fn run_requests_matches_evaluate_on_any_threads() {
    let t = read(&fixture(), skip()).unwrap();
    let policies: Vec<Policy> = [
        Algorithm::TWO_BUCKETS,
        Algorithm::FixedWindow,
        Algorithm::Gcra { burst: 5 },
        Algorithm::ExponentialHistogram { epsilon: 0.1 },
    ]
    .into_iter()
    .map(|a| Policy::new(5, Duration::from_secs(10), a).unwrap())
    .collect();
    let expect: Vec<Row> = policies
        .iter()
        .map(|p| Row::new(p, "t", evaluate(p, &t.requests)))
        .collect();
    for threads in [0, 1, 2, 8] {
        let done = std::sync::atomic::AtomicUsize::new(0);
        let rows = run_requests(&policies, "t", &t.requests, threads, &|| {
            done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        });
        assert_eq!(rows, expect, "{threads} threads");
        assert_eq!(done.into_inner(), policies.len());
    }
}

// ------------------------------------------------------------- streaming

/// The fixture's out-of-order lines are a few seconds late: streamed with
/// the default 60 s horizon, it gives the requests of the full sort, and
/// the same rows.
#[test]
#[allow(clippy::result_large_err)] // the library's error, as it is
fn streaming_the_fixture_gives_the_sorted_requests() {
    let t = read(&fixture(), skip()).unwrap();
    let mut streamed = Vec::new();
    let summary = stream_trace(
        "test.log",
        fixture().as_slice(),
        &skip(),
        ReorderOptions::default(),
        &mut |_| {},
        &mut |r| streamed.push(r),
    )
    .unwrap();
    assert_eq!(streamed, t.requests);
    assert_eq!((summary.requests, summary.clients, summary.late), (36, 3, 0));
    assert_eq!((summary.span_ns, summary.start_unix_ns), (t.span_ns(), t.start_unix_ns));
    assert_eq!((summary.keys.clone(), summary.skipped), (t.keys.clone(), t.skipped));
    assert_eq!(summary.requests_per_client.iter().sum::<u64>(), 36);
    let policies: Vec<Policy> = [
        Algorithm::TWO_BUCKETS,
        Algorithm::SlidingLog,
        Algorithm::Gcra { burst: 5 },
    ]
    .into_iter()
    .map(|a| Policy::new(5, Duration::from_secs(10), a).unwrap())
    .collect();
    let rows = run_requests(&policies, "t", &t.requests, 1, &|| {});
    for threads in [1, 2, 3] {
        let (metrics, summary) = evaluate_stream(&policies, threads, |sink| {
            stream_trace(
                "test.log",
                fixture().as_slice(),
                &skip(),
                ReorderOptions::default(),
                &mut |_| {},
                sink,
            )
        })
        .unwrap();
        assert_eq!(summary.requests, 36);
        let streamed: Vec<Row> = policies.iter().zip(metrics).map(|(p, m)| Row::new(p, "t", m)).collect();
        assert_eq!(streamed, rows, "{threads} threads");
    }
    // The busiest client's requests, read again alone.
    let busiest = (0..3u32)
        .max_by_key(|&c| summary.requests_per_client[c as usize])
        .unwrap();
    let key = summary.keys[busiest as usize].clone();
    let mine = trace_requests_of(
        "test.log",
        fixture().as_slice(),
        &skip(),
        ReorderOptions::default(),
        &[(key, busiest)],
        &mut |_| {},
    )
    .unwrap();
    let expect: Vec<Request> = t.requests.iter().filter(|r| r.client == busiest).copied().collect();
    assert_eq!(mine, expect);
    assert_eq!(mine.len() as u64, summary.requests_per_client[busiest as usize]);
}

/// A line later than the horizon is decided at the latest time released,
/// and counted with how late it was.
#[test]
fn lines_later_than_the_horizon_are_counted() {
    let csv = "timestamp,key\n1000,a\n1001,b\n1000.5,a\n1100,a\n1030,b\n1101,b\n";
    let order = ReorderOptions {
        horizon_ns: 60 * S as u64,
        max_pending: 100,
    };
    let mut requests = Vec::new();
    let summary = stream_trace("t.csv", csv.as_bytes(), &skip(), order, &mut |_| {}, &mut |r| {
        requests.push((r.time_ns, r.client))
    })
    .unwrap();
    // 1000.5 is put back in its place; 1030 comes after 1100 released
    // 1000, 1000.5 and 1001 only, so it is in time; none is late.
    assert_eq!(summary.late, 0);
    let s = S as u64;
    assert_eq!(
        requests,
        [(0, 0), (s / 2, 0), (s, 1), (30 * s, 1), (100 * s, 0), (101 * s, 1)]
    );
    // With a 10 s horizon, 1111 releases 1100, and 1020 comes after it: it
    // is decided at 1100, 80 s late.
    let csv = "timestamp,key\n1000,a\n1100,a\n1111,b\n1020,b\n1112,a\n";
    let order = ReorderOptions {
        horizon_ns: 10 * S as u64,
        max_pending: 100,
    };
    let mut requests = Vec::new();
    let summary = stream_trace("t.csv", csv.as_bytes(), &skip(), order, &mut |_| {}, &mut |r| {
        requests.push((r.time_ns, r.client))
    })
    .unwrap();
    assert_eq!((summary.late, summary.max_lateness_ns), (1, 80 * s));
    assert_eq!(
        requests,
        [(0, 0), (100 * s, 0), (100 * s, 1), (111 * s, 1), (112 * s, 0)]
    );
    assert_eq!((summary.requests, summary.span_ns), (5, 112 * s));
}
