//! Every plot writes a readable SVG and a decodable PNG, and bad input is an
//! error, never a panic.

use slidegate_plot::{
    HEIGHT, Line, MAX_PANELS, PlotError, TimeAxis, WIDTH, count_over_time, count_panels, cumulative_refusals,
    error_rates_by_buckets, max_window_ratio,
};
use std::path::{Path, PathBuf};

/// A fresh directory for one test.
fn dir(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("slidegate-plot").join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The SVG's text, after checking both files are there and non-empty.
fn check_files(written: &[PathBuf], stem: &Path) -> String {
    check_files_of(written, stem, HEIGHT)
}

/// [`check_files`] for a figure `height` px tall.
fn check_files_of(written: &[PathBuf], stem: &Path, height: u32) -> String {
    let mut svg_path = stem.as_os_str().to_owned();
    svg_path.push(".svg");
    let mut png_path = stem.as_os_str().to_owned();
    png_path.push(".png");
    assert_eq!(written, [PathBuf::from(svg_path), PathBuf::from(png_path)]);
    let svg = std::fs::read_to_string(&written[0]).unwrap();
    assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(200)]);
    assert!(svg.contains(&format!("width=\"{WIDTH}\"")) && svg.contains(&format!("height=\"{height}\"")));
    assert!(svg.trim_end().ends_with("</svg>"));
    let png = std::fs::read(&written[1]).unwrap();
    check_png_of(&png, height);
    svg
}

/// The PNG's signature and header, by hand, then a full decode: an RGB
/// image of WIDTH × HEIGHT with something drawn on the white.
fn check_png(png: &[u8]) -> Vec<u8> {
    check_png_of(png, HEIGHT)
}

/// [`check_png`] for an image `height` px tall.
fn check_png_of(png: &[u8], height: u32) -> Vec<u8> {
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    assert_eq!(&png[12..16], b"IHDR");
    let be = |b: &[u8]| u32::from_be_bytes(b.try_into().unwrap());
    assert_eq!((be(&png[16..20]), be(&png[20..24])), (WIDTH, height));
    let mut reader = png::Decoder::new(std::io::Cursor::new(png)).read_info().unwrap();
    let mut pixels = vec![0; reader.output_buffer_size().unwrap()];
    let frame = reader.next_frame(&mut pixels).unwrap();
    assert_eq!((frame.width, frame.height), (WIDTH, height));
    assert_eq!(frame.color_type, png::ColorType::Rgb);
    pixels.truncate(frame.buffer_size());
    assert!(pixels.iter().filter(|&&b| b != 255).count() > 10_000);
    pixels
}

/// Whether the RGB image has at least `n` pixels of exactly `rgb`.
fn has_colour(pixels: &[u8], rgb: [u8; 3], n: usize) -> bool {
    pixels.chunks_exact(3).filter(|p| *p == rgb).count() >= n
}

/// The text of SVG `<text>` elements contains `s` (escaped as SVG does).
fn has_text(svg: &str, s: &str) -> bool {
    let escaped = s
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&apos;");
    svg.contains(&format!(">\n{escaped}\n</text>"))
}

fn ramp(label: &str, slope: f64) -> Line {
    Line::new(
        label,
        (0..200).map(|i| (f64::from(i) * 0.5, slope * f64::from(i))).collect(),
    )
}

#[test]
fn count_over_time_writes_both_files() {
    let stem = dir("count").join("count");
    let truth = ramp("exact count", 1.0);
    let estimates = [ramp("two buckets", 1.1), ramp("eight buckets", 0.97)];
    let written = count_over_time(
        &stem,
        "One client's window",
        TimeAxis::Seconds,
        150.0,
        &truth,
        &estimates,
    )
    .unwrap();
    let svg = check_files(&written, &stem);
    for s in [
        "One client's window",
        "time since the start (s)",
        "requests in the window",
        "exact count",
        "two buckets",
        "eight buckets",
        "limit (150)",
    ] {
        assert!(has_text(&svg, s), "no `{s}` in the SVG");
    }
    let png = std::fs::read(&written[1]).unwrap();
    let pixels = check_png(&png);
    // The truth in black, the first estimate in the palette's blue, the
    // limit in dark red.
    assert!(has_colour(&pixels, [0, 0, 0], 500));
    assert!(has_colour(&pixels, [0, 114, 178], 200));
    assert!(has_colour(&pixels, [170, 0, 0], 200));
}

/// The height the PNG's header gives.
fn png_height(path: &Path) -> u32 {
    let png = std::fs::read(path).unwrap();
    u32::from_be_bytes(png[20..24].try_into().unwrap())
}

/// The texts of the SVG's `<text>` elements.
fn texts(svg: &str) -> Vec<&str> {
    svg.split("</text>")
        .filter_map(|chunk| chunk.rsplit_once('>'))
        .map(|(_, t)| t.trim())
        .collect()
}

/// The SVG's polylines (`<polyline … points="…"/>`) stroked in `colour`
/// (`#RRGGBB`) through more than two points, by their points: the data's
/// lines, not the axes, ticks or legend swatches (two points each).
fn polylines<'a>(svg: &'a str, colour: &str) -> Vec<&'a str> {
    svg.split("<polyline")
        .skip(1)
        .filter(|p| p.contains(&format!("stroke=\"{colour}\"")))
        .filter_map(|p| p.split("points=\"").nth(1)?.split('"').next())
        .filter(|points| points.split_whitespace().count() > 2)
        .collect()
}

/// Seven estimates of a count with a silence from 40 s to 70 s: the
/// truth, then the estimates, each off by its own factor.
fn seven_estimates() -> (Line, Vec<Line>) {
    let xs: Vec<f64> = (0..160)
        .map(|i| f64::from(i) * 0.5)
        .filter(|x| !(40.0..70.0).contains(x))
        .collect();
    let count = |x: f64| 60.0 + 50.0 * (x / 9.0).sin();
    let truth = Line::new("true count over 1m", xs.iter().map(|&x| (x, count(x))).collect());
    let names = [
        "sliding_window n=2 interpolated",
        "sliding_window n=8 interpolated",
        "sliding_window n=2 conservative",
        "sliding_window n=8 conservative",
        "fixed_window",
        "sliding_log",
        "exponential_histogram ε=0.01",
    ];
    let estimates = names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let f = 0.85 + 0.05 * i as f64;
            Line::new(*name, xs.iter().map(|&x| (x, count(x) * f)).collect())
        })
        .collect();
    (truth, estimates)
}

#[test]
fn count_panels_writes_one_panel_per_estimate() {
    let stem = dir("panels").join("count");
    let (truth, estimates) = seven_estimates();
    let written = count_panels(
        &stem,
        "One client's window, per algorithm",
        TimeAxis::Seconds,
        100.0,
        &truth,
        &estimates,
    )
    .unwrap();
    // Three rows of three: taller than the other plots.
    let height = png_height(&written[1]);
    assert!(height > HEIGHT, "{height}");
    let svg = check_files_of(&written, &stem, height);
    for s in [
        "One client's window, per algorithm",
        "time since the start (s)",
        "requests in the window",
        "true count over 1m",
        "limit (100)",
    ] {
        assert!(has_text(&svg, s), "no `{s}` in the SVG");
    }
    // One title per panel, each once.
    let all = texts(&svg);
    for e in &estimates {
        assert_eq!(all.iter().filter(|t| **t == e.label).count(), 1, "{}", e.label);
    }
    // Shared axes: every tick label is in every panel (a label used on both
    // axes, like 0, twice in each).
    let ticks: Vec<&str> = all.iter().copied().filter(|t| t.parse::<f64>().is_ok()).collect();
    assert!(ticks.len() >= 7 * 6, "{ticks:?}");
    for t in &ticks {
        let n = ticks.iter().filter(|u| *u == t).count();
        assert_eq!(
            n % 7,
            0,
            "tick `{t}` is in {n} places, not the same in each of 7 panels"
        );
    }
    // The truth in every panel, in two pieces around the silence; each
    // estimate in its own panel and colour, also in two pieces.
    let truth_lines = polylines(&svg, "#000000");
    assert_eq!(truth_lines.len(), 7 * 2, "{}", truth_lines.len());
    for colour in [
        "#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#6E6E6E",
    ] {
        assert_eq!(polylines(&svg, colour).len(), 2, "{colour}");
    }
    // The limit, dashed, in every panel: dark red dashes.
    assert!(svg.matches("stroke=\"#AA0000\"").count() >= 7 * 10);
    let pixels = check_png_of(&std::fs::read(&written[1]).unwrap(), height);
    assert!(has_colour(&pixels, [0, 0, 0], 7 * 100));
    assert!(has_colour(&pixels, [0, 114, 178], 200));
    assert!(has_colour(&pixels, [170, 0, 0], 7 * 100));
}

#[test]
fn count_panels_of_few_estimates_keep_the_usual_size() {
    let stem = dir("panels-few").join("count");
    let (truth, estimates) = seven_estimates();
    for n in 1..=6 {
        let written = count_panels(&stem, "t", TimeAxis::Seconds, 100.0, &truth, &estimates[..n]).unwrap();
        let svg = check_files(&written, &stem);
        assert_eq!(polylines(&svg, "#000000").len(), n * 2, "{n} panels");
    }
    // A panel's long title is cut to its panel.
    let long = Line::new("y".repeat(200), truth.points.clone());
    let written = count_panels(&stem, "t", TimeAxis::Seconds, 100.0, &truth, &[long.clone(), long]).unwrap();
    let svg = check_files(&written, &stem);
    assert!(!svg.contains(&"y".repeat(200)) && svg.contains("yyy…"));
}

#[test]
fn cumulative_refusals_writes_both_files() {
    let stem = dir("refusals").join("refusals");
    let minute = |i: u32| f64::from(i) * 60.0;
    let rising = |label: &str, per: u32| {
        Line::new(
            label,
            (0..60).map(|i| (minute(i), f64::from(i * per))).collect::<Vec<_>>(),
        )
    };
    // Labels as long as the what-if's: each shows whole, under the plot.
    let configured = rising("as configured, sliding_window n=8 conservative: 1,770 refused", 30);
    let log = rising("sliding_log (exact): 1,711 refused", 29);
    let none = Line::new("fixed_window: 0 refused", (0..60).map(|i| (minute(i), 0.0)).collect());
    // No data from minute 20 to 29.
    let broken = Line::new(
        "rule search: 10 per 1s, as configured",
        (0..60)
            .map(|i| (minute(i), if (20..30).contains(&i) { f64::NAN } else { f64::from(i) }))
            .collect(),
    );
    // 2023-11-14T22:13:20Z: an hour from there crosses no midnight.
    let time = TimeAxis::Clock {
        start_unix_ns: 1_700_000_000_000_000_000,
    };
    let lines = [configured, log, none, broken];
    let written = cumulative_refusals(&stem, "What if: refusals so far", time, &lines).unwrap();
    let svg = check_files(&written, &stem);
    for s in [
        "What if: refusals so far",
        "time (UTC) on 2023-11-14",
        "refused requests so far",
        "22:20",
        "22:30",
    ] {
        assert!(has_text(&svg, s), "no `{s}` in the SVG");
    }
    for line in &lines {
        assert!(has_text(&svg, &line.label), "no `{}` in the SVG", line.label);
    }
    // One line each, the fourth cut in two at its missing minutes; the
    // zeros drawn.
    assert_eq!(polylines(&svg, "#0072B2").len(), 1);
    assert_eq!(polylines(&svg, "#E69F00").len(), 1);
    assert_eq!(polylines(&svg, "#009E73").len(), 1);
    assert_eq!(polylines(&svg, "#CC79A7").len(), 2);
    let pixels = check_png(&std::fs::read(&written[1]).unwrap());
    for rgb in [[0, 114, 178], [230, 159, 0], [0, 158, 115]] {
        assert!(has_colour(&pixels, rgb, 200), "{rgb:?}");
    }
}

#[test]
fn refusals_without_data_or_refusals_still_plot() {
    let stem = dir("refusals-empty").join("refusals");
    let lines = [
        Line::new("no data", vec![(0.0, f64::NAN), (60.0, f64::NAN)]),
        Line::new("all allowed", vec![(0.0, 0.0), (60.0, 0.0)]),
        Line::new("one interval", vec![(0.0, f64::NAN), (60.0, 3.0), (120.0, f64::NAN)]),
    ];
    let svg = check_files(
        &cumulative_refusals(&stem, "", TimeAxis::Seconds, &lines).unwrap(),
        &stem,
    );
    assert!(has_text(&svg, "no data"));
    // A lone point between gaps is a dot.
    assert!(svg.contains("<circle"));
    let one = [Line::new("one", vec![(5.0, 1.0)])];
    check_files(&cumulative_refusals(&stem, "", TimeAxis::Seconds, &one).unwrap(), &stem);
}

#[test]
fn error_rates_by_buckets_writes_both_files() {
    let stem = dir("errors").join("error_rates");
    let n = [2.0, 4.0, 8.0, 16.0, 32.0];
    let line = |label: &str, first: f64| Line::new(label, n.iter().map(|&n| (n, first * 2.0 / n)).collect());
    let lines = [
        line("wrongly allowed, interpolated", 0.4),
        line("wrongly denied, interpolated", 0.3),
        line("wrongly allowed, conservative", 0.0),
        line("wrongly denied, conservative", 9.0),
    ];
    let written = error_rates_by_buckets(&stem, "Wrong decisions", &lines).unwrap();
    let svg = check_files(&written, &stem);
    for s in [
        "Wrong decisions",
        "buckets n (log scale)",
        "wrong decisions (% of requests)",
        "wrongly allowed, interpolated",
        "wrongly denied, conservative",
    ] {
        assert!(has_text(&svg, s), "no `{s}` in the SVG");
    }
    // A tick at every n, written as n.
    for tick in ["2", "4", "8", "16", "32"] {
        assert!(has_text(&svg, tick), "no tick `{tick}`");
    }
}

#[test]
fn max_window_ratio_writes_both_files() {
    let stem = dir("ratio").join("max_window_ratio");
    let bars = [
        ("sliding_window n=2 interpolated".to_string(), 1.99),
        ("sliding_window n=2 conservative".to_string(), 1.0),
        ("fixed_window".to_string(), 2.0),
    ];
    let written = max_window_ratio(&stem, "Under attack", &bars).unwrap();
    let svg = check_files(&written, &stem);
    for s in [
        "Under attack",
        "max admitted in a window / limit",
        "algorithm",
        "sliding_window n=2 interpolated",
        "fixed_window",
        "1.99",
        "2.00",
        "1.00",
        "over the limit (> 1.0)",
        "within the limit (≤ 1.0)",
        "limit (ratio 1.0)",
    ] {
        assert!(has_text(&svg, s), "no `{s}` in the SVG");
    }
    let pixels = check_png(&std::fs::read(&written[1]).unwrap());
    // Over the limit in vermilion, within it in blue.
    assert!(has_colour(&pixels, [213, 94, 0], 5000));
    assert!(has_colour(&pixels, [0, 114, 178], 5000));
}

#[test]
fn text_is_escaped_and_long_labels_are_cut() {
    let stem = dir("text").join("plot");
    let long = "x".repeat(300);
    let lines = [
        Line::new("a <b> & c", vec![(2.0, 1.0)]),
        Line::new(long.clone(), vec![(4.0, 2.0)]),
    ];
    let written = error_rates_by_buckets(&stem, "R&D <plots>", &lines).unwrap();
    let svg = check_files(&written, &stem);
    assert!(has_text(&svg, "a <b> & c"));
    assert!(has_text(&svg, "R&D <plots>"));
    assert!(!svg.contains(&long));
    assert!(svg.contains("xxx…"));
}

#[test]
fn one_point_and_flat_series_still_plot() {
    let stem = dir("flat").join("plot");
    let truth = Line::new("truth", vec![(3.0, 5.0)]);
    let est = Line::new("estimate", vec![(3.0, 5.0)]);
    check_files(
        &count_over_time(&stem, "", TimeAxis::Seconds, 0.0, &truth, std::slice::from_ref(&est)).unwrap(),
        &stem,
    );
    let unnamed = Line::new("", est.points.clone());
    check_files(
        &count_panels(&stem, "", TimeAxis::Seconds, 0.0, &unnamed, &[est, unnamed.clone()]).unwrap(),
        &stem,
    );
    check_files(
        &cumulative_refusals(&stem, "", TimeAxis::Seconds, &[unnamed]).unwrap(),
        &stem,
    );
    let bars = [("zero".to_string(), 0.0)];
    check_files(&max_window_ratio(&stem, "", &bars).unwrap(), &stem);
    let lines = [Line::new("flat", vec![(8.0, 0.0), (8.0, 0.0)])];
    check_files(&error_rates_by_buckets(&stem, "", &lines).unwrap(), &stem);
}

fn message(r: Result<Vec<PathBuf>, PlotError>) -> String {
    r.unwrap_err().to_string()
}

#[test]
fn bad_input_is_an_error() {
    let d = dir("errors-input");
    let stem = d.join("plot");
    let ok = ramp("ok", 1.0);
    let nan = Line::new("bad", vec![(0.0, 1.0), (1.0, f64::NAN)]);
    let inf = Line::new("far", vec![(f64::INFINITY, 1.0)]);
    let empty = Line::new("empty", vec![]);

    let m = message(count_over_time(&stem, "t", TimeAxis::Seconds, 10.0, &ok, &[]));
    assert!(m.contains("no estimate"), "{m}");
    let m = message(count_over_time(
        &stem,
        "t",
        TimeAxis::Seconds,
        10.0,
        &nan,
        std::slice::from_ref(&ok),
    ));
    assert!(
        m.contains("`bad`") && m.contains("point 1") && m.contains("finite"),
        "{m}"
    );
    let m = message(count_over_time(
        &stem,
        "t",
        TimeAxis::Seconds,
        10.0,
        &ok,
        std::slice::from_ref(&inf),
    ));
    assert!(m.contains("`far`"), "{m}");
    let m = message(count_over_time(
        &stem,
        "t",
        TimeAxis::Seconds,
        10.0,
        &ok,
        std::slice::from_ref(&empty),
    ));
    assert!(m.contains("`empty` has no points"), "{m}");
    let m = message(count_over_time(
        &stem,
        "t",
        TimeAxis::Seconds,
        f64::NAN,
        &ok,
        std::slice::from_ref(&ok),
    ));
    assert!(m.contains("limit"), "{m}");

    let m = message(error_rates_by_buckets(&stem, "t", &[]));
    assert!(m.contains("no line"), "{m}");
    let m = message(error_rates_by_buckets(&stem, "t", std::slice::from_ref(&nan)));
    assert!(m.contains("finite"), "{m}");
    let m = message(error_rates_by_buckets(&stem, "t", std::slice::from_ref(&empty)));
    assert!(m.contains("no points"), "{m}");
    let m = message(error_rates_by_buckets(&stem, "t", &[Line::new("n", vec![(0.0, 1.0)])]));
    assert!(m.contains("above zero"), "{m}");

    let m = message(max_window_ratio(&stem, "t", &[]));
    assert!(m.contains("no bar"), "{m}");
    for bad in [f64::NAN, f64::INFINITY, -0.5] {
        let m = message(max_window_ratio(&stem, "t", &[("gcra".to_string(), bad)]));
        assert!(m.contains("`gcra`"), "{m}");
    }

    let m = message(count_panels(&stem, "t", TimeAxis::Seconds, 10.0, &ok, &[]));
    assert!(m.contains("no estimate"), "{m}");
    let m = message(count_panels(
        &stem,
        "t",
        TimeAxis::Seconds,
        10.0,
        &nan,
        std::slice::from_ref(&ok),
    ));
    assert!(m.contains("`bad`") && m.contains("finite"), "{m}");
    let m = message(count_panels(
        &stem,
        "t",
        TimeAxis::Seconds,
        10.0,
        &ok,
        std::slice::from_ref(&inf),
    ));
    assert!(m.contains("`far`"), "{m}");
    let m = message(count_panels(
        &stem,
        "t",
        TimeAxis::Seconds,
        10.0,
        &ok,
        std::slice::from_ref(&empty),
    ));
    assert!(m.contains("`empty` has no points"), "{m}");
    let m = message(count_panels(
        &stem,
        "t",
        TimeAxis::Seconds,
        f64::INFINITY,
        &ok,
        std::slice::from_ref(&ok),
    ));
    assert!(m.contains("limit"), "{m}");
    let many = vec![ok.clone(); MAX_PANELS + 1];
    let m = message(count_panels(&stem, "t", TimeAxis::Seconds, 10.0, &ok, &many));
    assert!(m.contains("too many") && m.contains(&MAX_PANELS.to_string()), "{m}");

    let m = message(cumulative_refusals(&stem, "t", TimeAxis::Seconds, &[]));
    assert!(m.contains("no line"), "{m}");
    let m = message(cumulative_refusals(
        &stem,
        "t",
        TimeAxis::Seconds,
        std::slice::from_ref(&empty),
    ));
    assert!(m.contains("`empty` has no points"), "{m}");
    for (x, y) in [
        (f64::NAN, 1.0),
        (f64::INFINITY, 1.0),
        (0.0, f64::INFINITY),
        (0.0, f64::NEG_INFINITY),
        (0.0, -1.0),
    ] {
        let line = Line::new("rule", vec![(0.0, 0.0), (x, y)]);
        let m = message(cumulative_refusals(&stem, "t", TimeAxis::Seconds, &[ok.clone(), line]));
        assert!(m.contains("`rule`") && m.contains("point 1"), "{m}");
    }

    // Nothing was written by any of them.
    assert_eq!(std::fs::read_dir(&d).unwrap().count(), 0);
}

#[test]
fn unwritable_paths_are_errors() {
    let d = dir("errors-path");
    let bars = [("a".to_string(), 1.0)];
    let m = message(max_window_ratio(&d.join("no/such/dir/plot"), "t", &bars));
    assert!(m.contains("could not write") && m.contains("plot.svg"), "{m}");
    // A file where the directory should be.
    std::fs::write(d.join("file"), b"").unwrap();
    let m = message(max_window_ratio(&d.join("file/plot"), "t", &bars));
    assert!(m.contains("could not write"), "{m}");
    // A directory, not a stem.
    let m = message(max_window_ratio(Path::new(""), "t", &bars));
    assert!(m.contains("not a file path stem"), "{m}");
    let mut slash = d.clone().into_os_string();
    slash.push("/");
    let m = message(max_window_ratio(Path::new(&slash), "t", &bars));
    assert!(m.contains("not a file path stem"), "{m}");
}

#[test]
fn extreme_values_are_plotted_or_refused_never_hang() {
    let stem = dir("extreme").join("plot");
    for (a, b) in [(-1e308, 1e308), (0.0, 1e-300), (1e15, 1e15 + 1.0), (f64::MAX, f64::MAX)] {
        let line = Line::new("x", vec![(a, a), (b, b)]);
        let _ = count_over_time(&stem, "t", TimeAxis::Seconds, b, &line, std::slice::from_ref(&line));
        let pos = Line::new("x", vec![(a.abs().max(f64::MIN_POSITIVE), a), (b.abs().max(1e-300), b)]);
        let _ = error_rates_by_buckets(&stem, "t", &[pos]);
        let _ = max_window_ratio(&stem, "t", &[("a".to_string(), b.abs())]);
    }
    let huge = Line::new("huge", vec![(-1e308, 0.0), (1e308, 1.0)]);
    let m = message(count_over_time(
        &stem,
        "t",
        TimeAxis::Seconds,
        1.0,
        &huge,
        std::slice::from_ref(&huge),
    ));
    assert!(m.contains("time axis"), "{m}");
    let m = message(max_window_ratio(&stem, "t", &[("a".to_string(), f64::MAX)]));
    assert!(m.contains("ratio axis"), "{m}");
    for (a, b) in [(-1e308, 1e308), (0.0, 1e-300), (1e15, 1e15 + 1.0), (f64::MAX, f64::MAX)] {
        let line = Line::new("x", vec![(a, a), (b, b)]);
        let _ = count_panels(&stem, "t", TimeAxis::Seconds, b, &line, std::slice::from_ref(&line));
        let _ = cumulative_refusals(
            &stem,
            "t",
            TimeAxis::Seconds,
            &[Line::new("x", vec![(a, a.abs()), (b, b.abs())])],
        );
    }
    let m = message(count_panels(
        &stem,
        "t",
        TimeAxis::Seconds,
        1.0,
        &huge,
        std::slice::from_ref(&huge),
    ));
    assert!(m.contains("time axis"), "{m}");
    let m = message(cumulative_refusals(
        &stem,
        "t",
        TimeAxis::Seconds,
        std::slice::from_ref(&huge),
    ));
    assert!(m.contains("time axis"), "{m}");
    let near = Line::new("near", vec![(1e12, 1.0), (1e12 + 1.0, 2.0)]);
    count_over_time(&stem, "t", TimeAxis::Seconds, 1.0, &near, std::slice::from_ref(&near)).unwrap();
}
