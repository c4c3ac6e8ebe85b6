//! Drawing: one figure rendered twice (SVG text and an RGB bitmap), the
//! embedded font, the shared frame (title, legend beside the plot) and the
//! files.

use crate::bitmap::Bitmap;
use crate::time::{TimeCoord, tick};
use crate::{HEIGHT, Line, PlotError, TimeAxis, WIDTH};
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::{CoordTranslate, Shift};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::{FontFamily, FontStyle, RGBAColor, register_font};
use std::ffi::OsString;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// DejaVu Sans (Bitstream Vera licence, see `fonts/LICENSE-DejaVu.txt`).
static FONT: &[u8] = include_bytes!("../fonts/DejaVuSans.ttf");
/// The family the font is registered under, and the SVG's `font-family`.
const FAMILY: FontFamily<'static> = FontFamily::SansSerif;

const TITLE_SIZE: f64 = 28.0;
const DESC_SIZE: f64 = 21.0;
const TICK_SIZE: f64 = 17.0;
const LEGEND_SIZE: f64 = 17.0;
/// Height of one legend row, px.
const ROW: i32 = 30;
/// Width of a legend swatch, px.
const SWATCH: i32 = 40;
/// Padding inside the legend box, px.
const PAD: i32 = 12;
/// Space above the plotting area, px; the legend starts level with it.
const TOP: i32 = 12;
/// Height of the x label area (tick labels and the axis name), px.
const X_AREA: i32 = 62;

/// The limit's colour: dark red, apart from the series' palette.
const LIMIT: RGBColor = RGBColor(170, 0, 0);
/// Light grey for grid lines.
const GRID: RGBColor = RGBColor(225, 225, 225);

/// The Okabe–Ito colours that read well on white, most distinct first.
const PALETTE: [RGBColor; 7] = [
    RGBColor(0, 114, 178),   // blue
    RGBColor(230, 159, 0),   // orange
    RGBColor(0, 158, 115),   // bluish green
    RGBColor(204, 121, 167), // reddish purple
    RGBColor(86, 180, 233),  // sky blue
    RGBColor(213, 94, 0),    // vermilion
    RGBColor(110, 110, 110), // grey
];

/// The `i`th series colour: the palette, then hues spread by the golden
/// ratio.
fn colour(i: usize) -> RGBAColor {
    match PALETTE.get(i) {
        Some(c) => c.to_rgba(),
        None => HSLColor((i as f64 * 0.618_034).fract(), 0.75, 0.38).to_rgba(),
    }
}

/// Registers the embedded font once; every later call answers the same.
fn register() -> Result<(), PlotError> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    if *REGISTERED.get_or_init(|| register_font(FAMILY.as_str(), FontStyle::Normal, FONT).is_ok()) {
        Ok(())
    } else {
        Err(PlotError::new("the embedded font DejaVu Sans could not be loaded"))
    }
}

/// A plotting or font error, for a person.
fn drawing(e: impl std::fmt::Display) -> PlotError {
    PlotError::new(format!("could not draw the plot: {e}"))
}

fn text(size: f64) -> TextStyle<'static> {
    TextStyle::from((FAMILY, size).into_font()).color(&BLACK)
}

/// One plot, drawable on any backend.
pub(crate) trait Figure {
    /// Draws the whole figure on `root`.
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), PlotError>;

    /// Width and height in pixels: [`WIDTH`] × [`HEIGHT`] unless the figure
    /// needs more room.
    fn size(&self) -> (u32, u32) {
        (WIDTH, HEIGHT)
    }
}

/// `<stem>.svg` and `<stem>.png`.
fn paths(stem: &Path) -> Result<(PathBuf, PathBuf), PlotError> {
    let s = stem.as_os_str();
    if s.is_empty() || s.to_string_lossy().ends_with(std::path::is_separator) || stem.file_name().is_none() {
        return Err(PlotError::new(format!(
            "`{}` is not a file path stem (like `plots/count`)",
            stem.display()
        )));
    }
    let with = |ext: &str| {
        let mut p = OsString::from(s);
        p.push(ext);
        PathBuf::from(p)
    };
    Ok((with(".svg"), with(".png")))
}

/// Draws `figure` as SVG and as PNG, then writes both files: nothing is
/// written when drawing fails.
pub(crate) fn render(stem: &Path, figure: &impl Figure) -> Result<Vec<PathBuf>, PlotError> {
    let (svg_path, png_path) = paths(stem)?;
    register()?;
    let (width, height) = figure.size();
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (width, height)).into_drawing_area();
        figure.draw(&root)?;
        root.present().map_err(drawing)?;
    }
    let mut rgb = vec![0u8; width as usize * height as usize * 3];
    {
        let font =
            ab_glyph::FontRef::try_from_slice(FONT).map_err(|e| PlotError::new(format!("the embedded font: {e}")))?;
        let root = Bitmap::new(BitMapBackend::with_buffer(&mut rgb, (width, height)), font).into_drawing_area();
        figure.draw(&root)?;
        root.present().map_err(drawing)?;
    }
    let png = encode_png(&rgb, width, height)?;
    write(&svg_path, svg.as_bytes())?;
    write(&png_path, &png)?;
    Ok(vec![svg_path, png_path])
}

fn write(path: &Path, bytes: &[u8]) -> Result<(), PlotError> {
    std::fs::write(path, bytes).map_err(|e| PlotError::new(format!("could not write `{}`: {e}", path.display())))
}

/// An 8-bit RGB PNG of `width × height`.
fn encode_png(rgb: &[u8], width: u32, height: u32) -> Result<Vec<u8>, PlotError> {
    let fail = |e: png::EncodingError| PlotError::new(format!("could not encode the PNG: {e}"));
    let mut out = Vec::new();
    let mut encoder = png::Encoder::new(&mut out, width, height);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header().map_err(fail)?;
    writer.write_image_data(rgb).map_err(fail)?;
    writer.finish().map_err(fail)?;
    Ok(out)
}

/// A marker shape, so that lines differ in more than colour.
#[derive(Clone, Copy)]
enum Marker {
    Circle,
    Triangle,
    Square,
    Cross,
}

impl Marker {
    fn nth(i: usize) -> Marker {
        [Marker::Circle, Marker::Triangle, Marker::Square, Marker::Cross][i % 4]
    }
}

/// How a legend entry is drawn.
enum Swatch {
    Line {
        colour: RGBAColor,
        width: u32,
        dashed: bool,
        marker: Option<Marker>,
    },
    Bar(RGBAColor),
}

/// One legend entry.
struct Entry {
    label: String,
    swatch: Swatch,
}

/// `s`, cut with an ellipsis if needed so that it is at most `max` px wide.
fn fit<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    s: &str,
    style: &TextStyle,
    max: i32,
) -> Result<(String, i32), PlotError> {
    let width =
        |t: &str| -> Result<i32, PlotError> { Ok(area.estimate_text_size(t, style).map_err(drawing)?.0 as i32) };
    let w = width(s)?;
    if w <= max {
        return Ok((s.to_string(), w));
    }
    let mut chars: Vec<char> = s.chars().collect();
    while !chars.is_empty() {
        chars.pop();
        let cut: String = chars.iter().collect::<String>().trim_end().to_string() + "…";
        let w = width(&cut)?;
        if w <= max {
            return Ok((cut, w));
        }
    }
    Ok(("…".to_string(), width("…")?))
}

/// White background and the title on top; returns the area under it.
fn titled<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, title: &str) -> Result<DrawingArea<DB, Shift>, PlotError> {
    root.fill(&WHITE).map_err(drawing)?;
    let root = root.margin(8, 0, 0, 0);
    if title.trim().is_empty() {
        return Ok(root);
    }
    let style = text(TITLE_SIZE);
    let (title, _) = fit(&root, title, &style, WIDTH as i32 - 40)?;
    root.titled(&title, style).map_err(drawing)
}

/// The most rows of a legend under the chart; past them, the last row
/// says how many more series there are.
const LEGEND_ROWS_BELOW: usize = 6;

/// White background, the title on top and the legend under the chart:
/// its entries side by side in rows across the whole width, each label
/// whole unless it is wider than the figure. Returns the area left for
/// the chart.
fn frame_below<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    legend: &[Entry],
) -> Result<DrawingArea<DB, Shift>, PlotError> {
    let area = titled(root, title)?;
    let (area_w, area_h) = (area.dim_in_pixel().0 as i32, area.dim_in_pixel().1 as i32);
    let style = text(LEGEND_SIZE);
    let gap = 3 * PAD;
    let max_label = area_w - 4 * PAD - SWATCH;
    let mut labels = Vec::with_capacity(legend.len());
    for e in legend {
        labels.push(fit(&area, &e.label, &style, max_label)?);
    }
    // Entries left to right, a new row when the next does not fit.
    let mut rows: Vec<Vec<usize>> = vec![Vec::new()];
    let mut x = PAD;
    for (i, (_, w)) in labels.iter().enumerate() {
        let entry = SWATCH + PAD + w;
        if let Some(row) = rows.last_mut()
            && (x + entry <= area_w - PAD || row.is_empty())
        {
            row.push(i);
        } else {
            rows.push(vec![i]);
            x = PAD;
        }
        x += entry + gap;
    }
    let more = if rows.len() > LEGEND_ROWS_BELOW {
        let shown: usize = rows[..LEGEND_ROWS_BELOW - 1].iter().map(Vec::len).sum();
        rows.truncate(LEGEND_ROWS_BELOW - 1);
        legend.len() - shown
    } else {
        0
    };
    let height = (rows.len() + usize::from(more > 0)) as i32 * ROW + 2 * PAD;
    let (plot, below) = area.split_vertically(area_h - height);
    let label_style = style.pos(Pos::new(HPos::Left, VPos::Center));
    for (r, row) in rows.iter().enumerate() {
        let y = PAD + r as i32 * ROW + ROW / 2;
        let mut x = PAD;
        for &i in row {
            draw_swatch(&below, &legend[i].swatch, x, y)?;
            below
                .draw_text(&labels[i].0, &label_style, (x + SWATCH + PAD, y))
                .map_err(drawing)?;
            x += SWATCH + PAD + labels[i].1 + gap;
        }
    }
    if more > 0 {
        let y = PAD + rows.len() as i32 * ROW + ROW / 2;
        below
            .draw_text(&format!("… and {more} more"), &label_style, (PAD, y))
            .map_err(drawing)?;
    }
    Ok(plot)
}

/// White background, the title on top and the legend on the right; returns
/// the area left for the chart.
fn frame<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    legend: &[Entry],
) -> Result<DrawingArea<DB, Shift>, PlotError> {
    let area = titled(root, title)?;
    let (area_w, area_h) = area.dim_in_pixel();
    let style = text(LEGEND_SIZE);
    let max_label = WIDTH as i32 * 36 / 100 - SWATCH - 3 * PAD;
    let mut labels = Vec::with_capacity(legend.len());
    let mut widest = 0;
    for e in legend {
        let (label, w) = fit(&area, &e.label, &style, max_label)?;
        widest = widest.max(w);
        labels.push(label);
    }
    let legend_w = widest + SWATCH + 3 * PAD + 10;
    let (plot, side) = area.split_horizontally(area_w as i32 - legend_w);

    // As many rows as fit; the rest summed up on the last row.
    let fit_rows = ((area_h as i32 - TOP - X_AREA - 2 * PAD) / ROW).max(1) as usize;
    let (shown, more) = if legend.len() > fit_rows {
        (fit_rows - 1, legend.len() - (fit_rows - 1))
    } else {
        (legend.len(), 0)
    };
    let rows = (shown + usize::from(more > 0)) as i32;
    let right = legend_w - 10;
    side.draw(&Rectangle::new(
        [(0, TOP), (right, TOP + rows * ROW + 2 * PAD)],
        ShapeStyle::from(RGBColor(160, 160, 160)).stroke_width(1),
    ))
    .map_err(drawing)?;
    let label_style = style.pos(Pos::new(HPos::Left, VPos::Center));
    for (i, (e, label)) in legend.iter().zip(&labels).take(shown).enumerate() {
        let y = TOP + PAD + i as i32 * ROW + ROW / 2;
        draw_swatch(&side, &e.swatch, PAD, y)?;
        side.draw_text(label, &label_style, (PAD + SWATCH + PAD, y))
            .map_err(drawing)?;
    }
    if more > 0 {
        let y = TOP + PAD + shown as i32 * ROW + ROW / 2;
        side.draw_text(&format!("… and {more} more"), &label_style, (PAD, y))
            .map_err(drawing)?;
    }
    Ok(plot)
}

/// A legend swatch `SWATCH` px wide, from `x0`, centred on `y`.
fn draw_swatch<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    swatch: &Swatch,
    x0: i32,
    y: i32,
) -> Result<(), PlotError> {
    let x1 = x0 + SWATCH;
    match *swatch {
        Swatch::Line {
            colour,
            width,
            dashed,
            marker,
        } => {
            let stroke = ShapeStyle::from(colour).stroke_width(width);
            if dashed {
                let mut x = x0;
                while x < x1 {
                    area.draw(&PathElement::new(vec![(x, y), ((x + 7).min(x1), y)], stroke))
                        .map_err(drawing)?;
                    x += 11;
                }
            } else {
                area.draw(&PathElement::new(vec![(x0, y), (x1, y)], stroke))
                    .map_err(drawing)?;
            }
            if let Some(m) = marker {
                draw_marker(area, m, ((x0 + x1) / 2, y), colour)?;
            }
        }
        Swatch::Bar(colour) => {
            area.draw(&Rectangle::new([(x0 + 4, y - 8), (x1 - 4, y + 8)], colour.filled()))
                .map_err(drawing)?;
        }
    }
    Ok(())
}

/// One marker at `at`, in the coordinates of `area` (pixels or the
/// chart's).
fn draw_marker<DB: DrawingBackend, CT: CoordTranslate<From = C>, C: Clone + 'static>(
    area: &DrawingArea<DB, CT>,
    marker: Marker,
    at: C,
    colour: RGBAColor,
) -> Result<(), PlotError> {
    let fill = colour.filled();
    match marker {
        Marker::Circle => area.draw(&Circle::new(at, 5, fill)),
        Marker::Triangle => area.draw(&TriangleMarker::new(at, 7, fill)),
        Marker::Square => area.draw(&(EmptyElement::at(at) + Rectangle::new([(-5, -5), (5, 5)], fill))),
        Marker::Cross => area.draw(&Cross::new(at, 5, colour.stroke_width(3))),
    }
    .map_err(drawing)
}

/// A number as a person writes it: `100`, `2.5`, `0.003`.
fn number(v: f64) -> String {
    if v == v.round() && v.abs() < 1e15 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.3}");
        let s = s.trim_end_matches('0').trim_end_matches('.');
        if s == "0" || s == "-0" {
            format!("{v:.3e}")
        } else {
            s.to_string()
        }
    }
}

/// `(lo, hi)` of `values`.
fn extent(values: impl Iterator<Item = f64>) -> (f64, f64) {
    values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)))
}

/// `(lo, hi)` of `values`, widened so that the range is never empty.
fn bounds(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = extent(values);
    if lo < hi { (lo, hi) } else { (lo - 0.5, lo + 0.5) }
}

/// A y range for values in `lo..=hi`: zero in it, room above the top, and
/// below the bottom only when it is negative.
fn y_range(lo: f64, hi: f64) -> (f64, f64) {
    let lo = lo.min(0.0);
    let hi = if hi > lo { hi.max(0.0) } else { lo + 1.0 };
    let pad = 0.08 * (hi - lo);
    (if lo < 0.0 { lo - pad } else { lo }, hi + pad)
}

/// An axis range that plotters can divide into ticks: finite, and wide
/// enough for ticks that f64 can tell apart (plotters would loop forever on
/// an infinite span).
fn axis(name: &str, lo: f64, hi: f64) -> Result<Range<f64>, PlotError> {
    let span = hi - lo;
    let tickable = span > 100.0 * f64::EPSILON * lo.abs().max(hi.abs()) && span >= f64::MIN_POSITIVE;
    if lo.is_finite() && hi.is_finite() && span.is_finite() && tickable {
        Ok(lo..hi)
    } else {
        Err(PlotError::new(format!(
            "the {name} axis cannot show values from {lo} to {hi}: too far apart or too close together for a plot"
        )))
    }
}

/// Width in px of the y label area for tick labels like `samples`, with
/// room for the rotated axis name.
fn y_area<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, samples: &[String]) -> Result<i32, PlotError> {
    let style = text(TICK_SIZE);
    let mut widest = 0;
    for s in samples {
        widest = widest.max(area.estimate_text_size(s, &style).map_err(drawing)?.0 as i32);
    }
    Ok(widest + 52)
}

/// A linear f64 axis with ticks exactly at `keys` and no minor grid (the
/// buckets' powers of two, the bars' rows). Labels come from the mesh's
/// formatter.
struct Keyed {
    inner: RangedCoordf64,
    keys: Vec<f64>,
}

impl Keyed {
    fn new(range: Range<f64>, keys: Vec<f64>) -> Keyed {
        Keyed {
            inner: range.into(),
            keys,
        }
    }
}

impl Ranged for Keyed {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        self.inner.map(value, limit)
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            Vec::new()
        } else {
            self.keys.clone()
        }
    }

    fn range(&self) -> Range<f64> {
        self.inner.range()
    }
}

/// [`crate::count_over_time`].
pub(crate) struct CountOverTime<'a> {
    pub(crate) title: &'a str,
    pub(crate) time: TimeAxis,
    pub(crate) limit: f64,
    pub(crate) truth: &'a Line,
    pub(crate) estimates: &'a [Line],
}

/// The legend entry of a count plot's limit.
fn limit_entry(limit: f64) -> Entry {
    Entry {
        label: format!("limit ({})", number(limit)),
        swatch: Swatch::Line {
            colour: LIMIT.to_rgba(),
            width: 2,
            dashed: true,
            marker: None,
        },
    }
}

/// The axes of a count plot, shared by every panel of [`CountPanels`]:
/// x from the first to the last sample (from zero when the run starts just
/// after it), y from zero (or the lowest value) to above the highest value
/// and the limit.
fn count_ranges(truth: &Line, estimates: &[Line], limit: f64) -> Result<(Range<f64>, Range<f64>), PlotError> {
    let all = || std::iter::once(truth).chain(estimates).flat_map(|l| l.points.iter());
    let (x0, x1) = bounds(all().map(|p| p.0));
    // A run that starts just after zero (a simulation's) starts at zero.
    let x0 = if x0 > 0.0 && x0 <= 0.05 * (x1 - x0) { 0.0 } else { x0 };
    let (lo, hi) = extent(all().map(|p| p.1).chain([limit]));
    let (y0, y1) = y_range(lo, hi);
    Ok((axis("time", x0, x1)?, axis("count", y0, y1)?))
}

/// The y tick labels as wide as a chart spanning `y0..y1` may need.
fn y_samples(ys: &Range<f64>) -> [String; 4] {
    let span = ys.end - ys.start;
    [ys.start, ys.end, (ys.start + ys.end) / 2.0, ys.end * 0.9].map(|v| tick(v, span) + "0")
}

/// A chart of values over time: x in seconds on a [`TimeCoord`], y linear.
type Chart<'a, DB> = ChartContext<'a, DB, Cartesian2d<TimeCoord, RangedCoordf64>>;

/// Each of `runs` as a line of `colour`, `width` px wide; a run of one
/// point as a dot.
fn draw_runs<DB: DrawingBackend>(
    chart: &mut Chart<'_, DB>,
    runs: &[&[(f64, f64)]],
    colour: RGBAColor,
    width: u32,
) -> Result<(), PlotError> {
    for run in runs {
        if let [p] = run {
            chart
                .draw_series(std::iter::once(Circle::new(*p, width.max(2), colour.filled())))
                .map_err(drawing)?;
        } else {
            chart
                .draw_series(LineSeries::new(run.iter().copied(), colour.stroke_width(width)))
                .map_err(drawing)?;
        }
    }
    Ok(())
}

/// The grid, ticks and axis names of a chart over time (x ticks worded
/// by its [`TimeCoord`], y ticks for an axis spanning `yspan`).
fn draw_mesh<DB: DrawingBackend>(
    chart: &mut Chart<'_, DB>,
    time: &TimeCoord,
    y_desc: &str,
    yspan: f64,
) -> Result<(), PlotError> {
    let xfmt = |v: &f64| time.label(*v);
    let yfmt = |v: &f64| tick(*v, yspan);
    chart
        .configure_mesh()
        .x_desc(time.desc())
        .y_desc(y_desc)
        .axis_desc_style(text(DESC_SIZE))
        .label_style(text(TICK_SIZE))
        .x_label_formatter(&xfmt)
        .y_label_formatter(&yfmt)
        .x_labels(10)
        .y_labels(8)
        .bold_line_style(GRID)
        .light_line_style(WHITE)
        .draw()
        .map_err(drawing)
}

/// The limit, dashed, across the whole x axis.
fn draw_limit<DB: DrawingBackend>(chart: &mut Chart<'_, DB>, xs: &Range<f64>, limit: f64) -> Result<(), PlotError> {
    chart
        .draw_series(DashedLineSeries::new(
            [(xs.start, limit), (xs.end, limit)],
            10,
            6,
            LIMIT.stroke_width(2),
        ))
        .map_err(drawing)?;
    Ok(())
}

impl Figure for CountOverTime<'_> {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), PlotError> {
        let mut legend = vec![Entry {
            label: self.truth.label.clone(),
            swatch: Swatch::Line {
                colour: BLACK.to_rgba(),
                width: 4,
                dashed: false,
                marker: None,
            },
        }];
        legend.extend(self.estimates.iter().enumerate().map(|(i, line)| Entry {
            label: line.label.clone(),
            swatch: Swatch::Line {
                colour: colour(i),
                width: 2,
                dashed: false,
                marker: None,
            },
        }));
        legend.push(limit_entry(self.limit));
        let plot = frame(root, self.title, &legend)?;

        let (xs, ys) = count_ranges(self.truth, self.estimates, self.limit)?;
        let (xspan, yspan) = (xs.end - xs.start, ys.end - ys.start);
        let mut chart = ChartBuilder::on(&plot)
            .margin_top(TOP)
            .margin_right(30)
            .margin_left(8)
            .margin_bottom(10)
            .x_label_area_size(X_AREA)
            .y_label_area_size(y_area(&plot, &y_samples(&ys))?)
            .build_cartesian_2d(TimeCoord::new(xs.clone(), self.time, 10), ys)
            .map_err(drawing)?;
        let time = TimeCoord::new(xs.clone(), self.time, 10);
        draw_mesh(&mut chart, &time, "requests in the window", yspan)?;
        let lines = std::iter::once((self.truth, BLACK.to_rgba(), 4))
            .chain(self.estimates.iter().enumerate().map(|(i, l)| (l, colour(i), 2)));
        for (line, c, width) in lines {
            draw_runs(&mut chart, &runs(&line.points, xspan), c, width)?;
        }
        draw_limit(&mut chart, &xs, self.limit)
    }
}

/// `points` cut where x jumps by more than 2% of `xspan` and ten times the
/// median step: a count is only known where a request came, and a straight
/// line across a silence would invent the counts in between.
fn runs(points: &[(f64, f64)], xspan: f64) -> Vec<&[(f64, f64)]> {
    let mut steps: Vec<f64> = points.windows(2).map(|w| (w[1].0 - w[0].0).abs()).collect();
    if steps.is_empty() {
        return vec![points];
    }
    let mid = steps.len() / 2;
    let median = *steps.select_nth_unstable_by(mid, f64::total_cmp).1;
    let gap = (0.02 * xspan).max(10.0 * median);
    let mut out = Vec::new();
    let mut start = 0;
    for i in 1..points.len() {
        if (points[i].0 - points[i - 1].0).abs() > gap {
            out.push(&points[start..i]);
            start = i;
        }
    }
    out.push(&points[start..]);
    out
}

/// The most panels [`crate::count_panels`] draws in one figure.
pub(crate) const MAX_PANELS: usize = 24;
/// The least height of one panel, px: the canvas grows past [`HEIGHT`] to
/// keep it.
const PANEL_MIN_HEIGHT: u32 = 230;
/// Height of the panel figure's title and legend row, px.
const PANELS_HEAD: i32 = 96;
/// Height under the panels for the x axis name, px.
const PANELS_FOOT: i32 = 40;
/// Width left of the panels for the y axis name, px.
const PANELS_LEFT: i32 = 36;
/// Size of a panel's title.
const PANEL_TITLE_SIZE: f64 = 19.0;
/// The most ticks on a panel's time axis.
const PANEL_X_TICKS: usize = 6;

/// `(columns, rows)` of a grid of `n` panels: one column for one panel,
/// two for up to four, three beyond.
fn grid(n: usize) -> (usize, usize) {
    let columns = match n {
        0 | 1 => 1,
        2..=4 => 2,
        _ => 3,
    };
    (columns, n.div_ceil(columns).max(1))
}

/// Width and height of a figure of `n` panels: [`WIDTH`] wide, and
/// [`HEIGHT`] tall unless its rows need more.
fn panels_size(n: usize) -> (u32, u32) {
    let rows = grid(n).1.min(MAX_PANELS) as u32;
    let needed = (PANELS_HEAD + PANELS_FOOT) as u32 + rows * PANEL_MIN_HEIGHT;
    (WIDTH, HEIGHT.max(needed))
}

/// [`crate::count_panels`].
pub(crate) struct CountPanels<'a> {
    pub(crate) title: &'a str,
    pub(crate) time: TimeAxis,
    pub(crate) limit: f64,
    pub(crate) truth: &'a Line,
    pub(crate) estimates: &'a [Line],
}

/// The truth's colour and width in the panels: thin, dark, drawn over the
/// estimate so that it shows where they meet.
const TRUTH_IN_PANEL: (RGBColor, u32) = (BLACK, 1);
/// The estimate's width in the panels: wide enough to show on both sides
/// of the truth.
const ESTIMATE_IN_PANEL: u32 = 4;

impl Figure for CountPanels<'_> {
    fn size(&self) -> (u32, u32) {
        panels_size(self.estimates.len())
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), PlotError> {
        root.fill(&WHITE).map_err(drawing)?;
        let (width, height) = root.dim_in_pixel();
        let (width, height) = (width as i32, height as i32);
        let (head, body) = root.split_vertically(PANELS_HEAD);

        // The title, then one legend row: the truth and the limit (each
        // panel's title names its estimate).
        let title_style = text(TITLE_SIZE).pos(Pos::new(HPos::Center, VPos::Top));
        let (title, _) = fit(&head, self.title, &title_style, width - 40)?;
        head.draw_text(&title, &title_style, (width / 2, 10)).map_err(drawing)?;
        let legend = [
            Entry {
                label: self.truth.label.clone(),
                swatch: Swatch::Line {
                    colour: TRUTH_IN_PANEL.0.to_rgba(),
                    width: TRUTH_IN_PANEL.1 + 1,
                    dashed: false,
                    marker: None,
                },
            },
            Entry {
                label: "estimate (one per panel)".to_string(),
                swatch: Swatch::Line {
                    colour: colour(0),
                    width: ESTIMATE_IN_PANEL,
                    dashed: false,
                    marker: None,
                },
            },
            limit_entry(self.limit),
        ];
        let style = text(LEGEND_SIZE);
        let mut labels = Vec::with_capacity(legend.len());
        for e in &legend {
            labels.push(fit(&head, &e.label, &style, width / 4)?);
        }
        let gap = 3 * PAD;
        let total: i32 = labels.iter().map(|(_, w)| SWATCH + PAD + w).sum::<i32>() + gap * (labels.len() as i32 - 1);
        let label_style = style.pos(Pos::new(HPos::Left, VPos::Center));
        let (mut x, y) = ((width - total).max(0) / 2, PANELS_HEAD - ROW / 2 - 8);
        for (e, (label, w)) in legend.iter().zip(&labels) {
            draw_swatch(&head, &e.swatch, x, y)?;
            head.draw_text(label, &label_style, (x + SWATCH + PAD, y))
                .map_err(drawing)?;
            x += SWATCH + PAD + w + gap;
        }

        // The axis names, once for all panels.
        let (xs, ys) = count_ranges(self.truth, self.estimates, self.limit)?;
        let time = TimeCoord::new(xs.clone(), self.time, PANEL_X_TICKS);
        let body_h = height - PANELS_HEAD;
        body.draw_text(
            &time.desc(),
            &text(DESC_SIZE).pos(Pos::new(HPos::Center, VPos::Center)),
            (PANELS_LEFT + (width - PANELS_LEFT) / 2, body_h - PANELS_FOOT / 2),
        )
        .map_err(drawing)?;
        body.draw_text(
            "requests in the window",
            &text(DESC_SIZE)
                .pos(Pos::new(HPos::Center, VPos::Center))
                .transform(FontTransform::Rotate270),
            (PANELS_LEFT / 2, (body_h - PANELS_FOOT) / 2),
        )
        .map_err(drawing)?;

        let (xspan, yspan) = (xs.end - xs.start, ys.end - ys.start);
        let truth_runs = runs(&self.truth.points, xspan);
        let (columns, rows) = grid(self.estimates.len());
        let cells = body
            .margin(0, PANELS_FOOT, PANELS_LEFT, 0)
            .split_evenly((rows, columns));
        let tick_style = text(TICK_SIZE);
        let mut widest = 0;
        for s in y_samples(&ys) {
            widest = widest.max(body.estimate_text_size(&s, &tick_style).map_err(drawing)?.0 as i32);
        }
        let caption = text(PANEL_TITLE_SIZE);
        let xfmt = |v: &f64| time.label(*v);
        let yfmt = |v: &f64| tick(*v, yspan);
        for (i, (line, cell)) in self.estimates.iter().zip(&cells).enumerate() {
            let (cell_w, _) = cell.dim_in_pixel();
            let (name, _) = fit(cell, &line.label, &caption, cell_w as i32 - 24)?;
            let mut chart = ChartBuilder::on(cell)
                .caption(name, caption.clone())
                .margin_top(4)
                .margin_right(18)
                .margin_left(6)
                .margin_bottom(10)
                .x_label_area_size(28)
                .y_label_area_size(widest + 14)
                .build_cartesian_2d(TimeCoord::new(xs.clone(), self.time, PANEL_X_TICKS), ys.clone())
                .map_err(drawing)?;
            chart
                .configure_mesh()
                .label_style(tick_style.clone())
                .x_label_formatter(&xfmt)
                .y_label_formatter(&yfmt)
                .x_labels(PANEL_X_TICKS)
                .y_labels(5)
                .bold_line_style(GRID)
                .light_line_style(WHITE)
                .draw()
                .map_err(drawing)?;
            draw_runs(&mut chart, &runs(&line.points, xspan), colour(i), ESTIMATE_IN_PANEL)?;
            draw_runs(&mut chart, &truth_runs, TRUTH_IN_PANEL.0.to_rgba(), TRUTH_IN_PANEL.1)?;
            draw_limit(&mut chart, &xs, self.limit)?;
        }
        Ok(())
    }
}

/// [`crate::cumulative_refusals`].
pub(crate) struct Refusals<'a> {
    pub(crate) title: &'a str,
    pub(crate) time: TimeAxis,
    pub(crate) lines: &'a [Line],
}

/// The width of the `i`th line of refusals: the first lines wider, as
/// they are drawn under the later ones, so that lines that coincide (two
/// ways of counting that refuse alike) all show.
fn refusal_width(i: usize) -> u32 {
    match i {
        0 => 6,
        1 => 4,
        _ => 2,
    }
}

/// `points` cut at every point whose y is NaN (no data there), which is
/// left out.
fn defined_runs(points: &[(f64, f64)]) -> Vec<&[(f64, f64)]> {
    points.split(|p| p.1.is_nan()).filter(|run| !run.is_empty()).collect()
}

impl Figure for Refusals<'_> {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), PlotError> {
        let legend: Vec<Entry> = self
            .lines
            .iter()
            .enumerate()
            .map(|(i, line)| Entry {
                label: line.label.clone(),
                swatch: Swatch::Line {
                    colour: colour(i),
                    width: refusal_width(i),
                    dashed: false,
                    marker: None,
                },
            })
            .collect();
        let plot = frame_below(root, self.title, &legend)?;

        let all = || self.lines.iter().flat_map(|l| l.points.iter());
        let (x0, x1) = bounds(all().map(|p| p.0));
        let (lo, hi) = extent(all().map(|p| p.1).filter(|y| !y.is_nan()));
        let (y0, y1) = y_range(lo, hi);
        let (xs, ys) = (axis("time", x0, x1)?, axis("refusals", y0, y1)?);
        let yspan = y1 - y0;
        let time = TimeCoord::new(xs.clone(), self.time, 10);
        let mut chart = ChartBuilder::on(&plot)
            .margin_top(TOP)
            .margin_right(30)
            .margin_left(8)
            .margin_bottom(10)
            .x_label_area_size(X_AREA)
            .y_label_area_size(y_area(&plot, &y_samples(&ys))?)
            .build_cartesian_2d(TimeCoord::new(xs, self.time, 10), ys)
            .map_err(drawing)?;
        draw_mesh(&mut chart, &time, "refused requests so far", yspan)?;
        for (i, line) in self.lines.iter().enumerate() {
            draw_runs(&mut chart, &defined_runs(&line.points), colour(i), refusal_width(i))?;
        }
        Ok(())
    }
}

/// [`crate::error_rates_by_buckets`].
pub(crate) struct ErrorRates<'a> {
    pub(crate) title: &'a str,
    pub(crate) lines: &'a [Line],
}

impl Figure for ErrorRates<'_> {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), PlotError> {
        let legend: Vec<Entry> = self
            .lines
            .iter()
            .enumerate()
            .map(|(i, line)| Entry {
                label: line.label.clone(),
                swatch: Swatch::Line {
                    colour: colour(i),
                    width: 2,
                    dashed: false,
                    marker: Some(Marker::nth(i)),
                },
            })
            .collect();
        let plot = frame(root, self.title, &legend)?;

        // x is log2(n); ticks at every n that occurs, or at the powers of
        // two when that would crowd the axis.
        let logged: Vec<Vec<(f64, f64)>> = self
            .lines
            .iter()
            .map(|l| l.points.iter().map(|&(n, y)| (n.log2(), y)).collect())
            .collect();
        let mut ticks: Vec<f64> = logged.iter().flatten().map(|p| p.0).collect();
        ticks.sort_by(f64::total_cmp);
        ticks.dedup_by(|a, b| (*a - *b).abs() < 1e-9);
        let (lo, hi) = (ticks[0], ticks[ticks.len() - 1]);
        if ticks.len() > 12 {
            let step = ((hi - lo) / 10.0).ceil().max(1.0);
            ticks = (0..)
                .map(|i| lo.ceil() + step * f64::from(i))
                .take_while(|&u| u <= hi)
                .collect();
        }
        let pad = if hi > lo { 0.06 * (hi - lo) } else { 0.5 };
        let (x0, x1) = (lo - pad, hi + pad);
        let (ylo, yhi) = extent(logged.iter().flatten().map(|p| p.1));
        let (y0, y1) = y_range(ylo, yhi);
        let (xs, ys) = (axis("buckets", x0, x1)?, axis("percentage", y0, y1)?);
        let yspan = y1 - y0;
        let samples = [y0, y1, (y0 + y1) / 2.0, y1 * 0.9].map(|v| tick(v, yspan) + "0");
        let mut chart = ChartBuilder::on(&plot)
            .margin_top(TOP)
            .margin_right(30)
            .margin_left(8)
            .margin_bottom(10)
            .x_label_area_size(X_AREA)
            .y_label_area_size(y_area(&plot, &samples)?)
            .build_cartesian_2d(Keyed::new(xs, ticks), ys)
            .map_err(drawing)?;
        let xfmt = |u: &f64| number((2f64.powf(*u) * 1000.0).round() / 1000.0);
        let yfmt = |v: &f64| tick(*v, yspan);
        chart
            .configure_mesh()
            .x_desc("buckets n (log scale)")
            .y_desc("wrong decisions (% of requests)")
            .axis_desc_style(text(DESC_SIZE))
            .label_style(text(TICK_SIZE))
            .x_label_formatter(&xfmt)
            .y_label_formatter(&yfmt)
            .y_labels(8)
            .bold_line_style(GRID)
            .light_line_style(WHITE)
            .draw()
            .map_err(drawing)?;
        for (i, points) in logged.iter().enumerate() {
            let c = colour(i);
            chart
                .draw_series(LineSeries::new(points.iter().copied(), c.stroke_width(2)))
                .map_err(drawing)?;
            for &p in points {
                draw_marker(chart.plotting_area(), Marker::nth(i), p, c)?;
            }
        }
        Ok(())
    }
}

/// [`crate::max_window_ratio`].
pub(crate) struct MaxWindowRatio<'a> {
    pub(crate) title: &'a str,
    pub(crate) bars: &'a [(String, f64)],
}

impl Figure for MaxWindowRatio<'_> {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), PlotError> {
        let (within, over) = (PALETTE[0].to_rgba(), PALETTE[5].to_rgba());
        let mut legend = Vec::new();
        if self.bars.iter().any(|b| b.1 <= 1.0) {
            legend.push(Entry {
                label: "within the limit (≤ 1.0)".to_string(),
                swatch: Swatch::Bar(within),
            });
        }
        if self.bars.iter().any(|b| b.1 > 1.0) {
            legend.push(Entry {
                label: "over the limit (> 1.0)".to_string(),
                swatch: Swatch::Bar(over),
            });
        }
        legend.push(Entry {
            label: "limit (ratio 1.0)".to_string(),
            swatch: Swatch::Line {
                colour: LIMIT.to_rgba(),
                width: 2,
                dashed: true,
                marker: None,
            },
        });
        let plot = frame(root, self.title, &legend)?;

        let k = self.bars.len();
        // The first bar on top.
        let row = |i: usize| (k - 1 - i) as f64;
        let names_max = (plot.dim_in_pixel().0 as i32) * 45 / 100;
        let style = text(TICK_SIZE);
        let mut names = Vec::with_capacity(k);
        for (name, _) in self.bars {
            names.push(fit(&plot, name, &style, names_max)?.0);
        }
        let top = self.bars.iter().map(|b| b.1).fold(1.0, f64::max);
        let x1 = top * 1.15;
        let xs = axis("ratio", 0.0, x1)?;
        let mut chart = ChartBuilder::on(&plot)
            .margin_top(TOP)
            .margin_right(30)
            .margin_left(8)
            .margin_bottom(10)
            .x_label_area_size(X_AREA)
            .y_label_area_size(y_area(&plot, &names)?)
            .build_cartesian_2d(xs, Keyed::new(-0.5..k as f64 - 0.5, (0..k).map(|i| i as f64).collect()))
            .map_err(drawing)?;
        let xfmt = |v: &f64| tick(*v, x1);
        let yfmt = |v: &f64| {
            let y = v.round();
            if y >= 0.0 && (y as usize) < k {
                names[k - 1 - y as usize].clone()
            } else {
                String::new()
            }
        };
        chart
            .configure_mesh()
            .x_desc("max admitted in a window / limit")
            .y_desc("algorithm")
            .axis_desc_style(text(DESC_SIZE))
            .label_style(text(TICK_SIZE))
            .x_label_formatter(&xfmt)
            .y_label_formatter(&yfmt)
            .x_labels(10)
            .disable_y_mesh()
            .bold_line_style(GRID)
            .light_line_style(WHITE)
            .draw()
            .map_err(drawing)?;
        let value_style = text(TICK_SIZE).pos(Pos::new(HPos::Left, VPos::Center));
        for (i, &(_, ratio)) in self.bars.iter().enumerate() {
            let y = row(i);
            let fill = if ratio > 1.0 { over } else { within };
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(0.0, y - 0.32), (ratio, y + 0.32)],
                    fill.filled(),
                )))
                .map_err(drawing)?;
            chart
                .draw_series(std::iter::once(
                    EmptyElement::at((ratio, y)) + Text::new(format!("{ratio:.2}"), (6, 0), value_style.clone()),
                ))
                .map_err(drawing)?;
        }
        chart
            .draw_series(DashedLineSeries::new(
                [(1.0, -0.5), (1.0, k as f64 - 0.5)],
                10,
                6,
                LIMIT.stroke_width(2),
            ))
            .map_err(drawing)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_as_written() {
        assert_eq!(number(100.0), "100");
        assert_eq!(number(2.5), "2.5");
        assert_eq!(number(0.0001), "1.000e-4");
    }

    #[test]
    fn y_ranges_hold_zero_and_the_data() {
        assert_eq!(y_range(0.0, 0.0), (0.0, 1.08));
        assert_eq!(y_range(50.0, 50.0), (0.0, 54.0));
        assert_eq!(y_range(-1.0, 0.0), (-1.08, 0.08));
        assert_eq!(bounds([3.0].into_iter()), (2.5, 3.5));
    }

    #[test]
    fn stems_get_both_extensions() {
        let (svg, png) = paths(Path::new("out/plot.v1")).unwrap();
        assert_eq!((svg, png), ("out/plot.v1.svg".into(), "out/plot.v1.png".into()));
        assert!(paths(Path::new("")).is_err());
        assert!(paths(Path::new("out/")).is_err());
        assert!(paths(Path::new("..")).is_err());
    }

    #[test]
    fn silences_cut_lines() {
        let p = [
            (0.0, 1.0),
            (1.0, 2.0),
            (2.0, 3.0),
            (50.0, 1.0),
            (51.0, 2.0),
            (99.0, 0.0),
        ];
        let r = runs(&p, 100.0);
        assert_eq!(r, [&p[..3], &p[3..5], &p[5..]]);
        assert_eq!(runs(&p[..1], 100.0), [&p[..1]]);
        // Even spacing is never cut, however sparse.
        let even: Vec<(f64, f64)> = (0..5).map(|i| (f64::from(i) * 25.0, 0.0)).collect();
        assert_eq!(runs(&even, 100.0).len(), 1);
    }

    #[test]
    fn no_data_cuts_lines() {
        let nan = f64::NAN;
        let p = [
            (0.0, 0.0),
            (1.0, 2.0),
            (2.0, nan),
            (3.0, 1.0),
            (4.0, nan),
            (5.0, nan),
            (6.0, 0.0),
            (7.0, 0.0),
        ];
        let r = defined_runs(&p);
        assert_eq!(r, [&p[..2], &p[3..4], &p[6..]]);
        assert!(defined_runs(&[(0.0, nan), (1.0, nan)]).is_empty());
        // Zeros are data: never cut, however far apart.
        let zeros = [(0.0, 0.0), (1.0, 0.0), (100.0, 0.0)];
        assert_eq!(defined_runs(&zeros), [&zeros[..]]);
    }

    #[test]
    fn panels_fill_a_grid_that_grows_downwards() {
        assert_eq!(grid(1), (1, 1));
        assert_eq!(grid(2), (2, 1));
        assert_eq!(grid(3), (2, 2));
        assert_eq!(grid(4), (2, 2));
        assert_eq!(grid(5), (3, 2));
        assert_eq!(grid(7), (3, 3));
        assert_eq!(grid(MAX_PANELS), (3, 8));
        for n in 1..=MAX_PANELS {
            let (columns, rows) = grid(n);
            assert!(columns * rows >= n && columns * (rows - 1) < n, "{n}");
            let (w, h) = panels_size(n);
            assert_eq!(w, WIDTH);
            assert!(h >= HEIGHT);
            let room = (h as i32 - PANELS_HEAD - PANELS_FOOT) / rows as i32;
            assert!(room >= PANEL_MIN_HEIGHT as i32, "{n} panels: {room} px each");
        }
        assert_eq!(panels_size(6), (WIDTH, HEIGHT));
    }

    #[test]
    fn panels_share_the_ranges_of_every_series_and_the_limit() {
        let truth = Line::new("truth", vec![(0.5, 0.0), (10.0, 40.0)]);
        let low = Line::new("low", vec![(0.5, 0.0), (10.0, 30.0)]);
        let high = Line::new("high", vec![(0.5, 0.0), (12.0, 90.0)]);
        let (xs, ys) = count_ranges(&truth, &[low.clone(), high.clone()], 50.0).unwrap();
        // From zero (the run starts just after it) to the last sample of any
        // series; from zero to above the highest estimate.
        assert_eq!(xs, 0.0..12.0);
        assert_eq!(ys, y_range(0.0, 90.0).0..y_range(0.0, 90.0).1);
        // The order of the estimates does not matter, and a limit above
        // every series raises the top.
        assert_eq!(
            count_ranges(&truth, &[high, low.clone()], 50.0).unwrap(),
            (xs.clone(), ys)
        );
        let (_, ys) = count_ranges(&truth, &[low], 200.0).unwrap();
        assert_eq!(ys.end, y_range(0.0, 200.0).1);
    }

    #[test]
    fn colours_are_distinct() {
        let colours: Vec<RGBAColor> = (0..20).map(colour).collect();
        for (i, a) in colours.iter().enumerate() {
            for b in &colours[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }
}
