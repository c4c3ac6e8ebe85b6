//! Every plot writes a readable SVG and a decodable PNG, and bad input is an
//! error, never a panic.

use slidegate_plot::{HEIGHT, Line, PlotError, WIDTH, count_over_time, error_rates_by_buckets, max_window_ratio};
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
    let mut svg_path = stem.as_os_str().to_owned();
    svg_path.push(".svg");
    let mut png_path = stem.as_os_str().to_owned();
    png_path.push(".png");
    assert_eq!(written, [PathBuf::from(svg_path), PathBuf::from(png_path)]);
    let svg = std::fs::read_to_string(&written[0]).unwrap();
    assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(200)]);
    assert!(svg.contains(&format!("width=\"{WIDTH}\"")) && svg.contains(&format!("height=\"{HEIGHT}\"")));
    assert!(svg.trim_end().ends_with("</svg>"));
    let png = std::fs::read(&written[1]).unwrap();
    check_png(&png);
    svg
}

/// The PNG's signature and header, by hand, then a full decode: an RGB
/// image of WIDTH × HEIGHT with something drawn on the white.
fn check_png(png: &[u8]) -> Vec<u8> {
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    assert_eq!(&png[12..16], b"IHDR");
    let be = |b: &[u8]| u32::from_be_bytes(b.try_into().unwrap());
    assert_eq!((be(&png[16..20]), be(&png[20..24])), (WIDTH, HEIGHT));
    let mut reader = png::Decoder::new(std::io::Cursor::new(png)).read_info().unwrap();
    let mut pixels = vec![0; reader.output_buffer_size().unwrap()];
    let frame = reader.next_frame(&mut pixels).unwrap();
    assert_eq!((frame.width, frame.height), (WIDTH, HEIGHT));
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
    let written = count_over_time(&stem, "One client's window", 150.0, &truth, &estimates).unwrap();
    let svg = check_files(&written, &stem);
    for s in [
        "One client's window",
        "time (s)",
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
    check_files(&count_over_time(&stem, "", 0.0, &truth, &[est]).unwrap(), &stem);
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

    let m = message(count_over_time(&stem, "t", 10.0, &ok, &[]));
    assert!(m.contains("no estimate"), "{m}");
    let m = message(count_over_time(&stem, "t", 10.0, &nan, std::slice::from_ref(&ok)));
    assert!(
        m.contains("`bad`") && m.contains("point 1") && m.contains("finite"),
        "{m}"
    );
    let m = message(count_over_time(&stem, "t", 10.0, &ok, std::slice::from_ref(&inf)));
    assert!(m.contains("`far`"), "{m}");
    let m = message(count_over_time(&stem, "t", 10.0, &ok, std::slice::from_ref(&empty)));
    assert!(m.contains("`empty` has no points"), "{m}");
    let m = message(count_over_time(&stem, "t", f64::NAN, &ok, std::slice::from_ref(&ok)));
    assert!(m.contains("limit"), "{m}");

    let m = message(error_rates_by_buckets(&stem, "t", &[]));
    assert!(m.contains("no line"), "{m}");
    let m = message(error_rates_by_buckets(&stem, "t", &[nan]));
    assert!(m.contains("finite"), "{m}");
    let m = message(error_rates_by_buckets(&stem, "t", &[empty]));
    assert!(m.contains("no points"), "{m}");
    let m = message(error_rates_by_buckets(&stem, "t", &[Line::new("n", vec![(0.0, 1.0)])]));
    assert!(m.contains("above zero"), "{m}");

    let m = message(max_window_ratio(&stem, "t", &[]));
    assert!(m.contains("no bar"), "{m}");
    for bad in [f64::NAN, f64::INFINITY, -0.5] {
        let m = message(max_window_ratio(&stem, "t", &[("gcra".to_string(), bad)]));
        assert!(m.contains("`gcra`"), "{m}");
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
        let _ = count_over_time(&stem, "t", b, &line, std::slice::from_ref(&line));
        let pos = Line::new("x", vec![(a.abs().max(f64::MIN_POSITIVE), a), (b.abs().max(1e-300), b)]);
        let _ = error_rates_by_buckets(&stem, "t", &[pos]);
        let _ = max_window_ratio(&stem, "t", &[("a".to_string(), b.abs())]);
    }
    let huge = Line::new("huge", vec![(-1e308, 0.0), (1e308, 1.0)]);
    let m = message(count_over_time(&stem, "t", 1.0, &huge, std::slice::from_ref(&huge)));
    assert!(m.contains("time axis"), "{m}");
    let m = message(max_window_ratio(&stem, "t", &[("a".to_string(), f64::MAX)]));
    assert!(m.contains("ratio axis"), "{m}");
    let near = Line::new("near", vec![(1e12, 1.0), (1e12 + 1.0, 2.0)]);
    count_over_time(&stem, "t", 1.0, &near, std::slice::from_ref(&near)).unwrap();
}
