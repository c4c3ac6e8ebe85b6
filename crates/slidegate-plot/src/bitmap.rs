//! The PNG's drawing backend: plotters' bitmap backend with its own text.
//!
//! plotters 0.3.7 draws ab_glyph text without each glyph's left side
//! bearing, so letters sit unevenly ("min ute"). This wrapper passes every
//! shape to the bitmap backend and draws text itself with the same font, the
//! same advances and the same layout box as plotters measures (so the
//! layout is the SVG's), placing every glyph where the font says.
//!
//! It also draws wide lines a segment at a time, with round joins: plotters
//! turns a wide path into one polygon whose inner corner, where the path
//! turns back on itself (a count that drops and climbs again), lies far
//! from the line, so the PNG had spikes across the plot (the SVG's viewer
//! joins them itself and never had).

use ab_glyph::{Font, FontRef, PxScale, ScaleFont, point};
use plotters::prelude::*;
use plotters_backend::text_anchor::{HPos, VPos};
use plotters_backend::{BackendColor, BackendCoord, BackendStyle, BackendTextStyle, DrawingErrorKind};

type Error = <BitMapBackend<'static> as DrawingBackend>::ErrorType;

/// A [`BitMapBackend`] that draws its text with `font`.
pub(crate) struct Bitmap<'a> {
    inner: BitMapBackend<'a>,
    font: FontRef<'static>,
}

impl<'a> Bitmap<'a> {
    pub(crate) fn new(inner: BitMapBackend<'a>, font: FontRef<'static>) -> Self {
        Bitmap { inner, font }
    }
}

impl DrawingBackend for Bitmap<'_> {
    type ErrorType = Error;

    fn get_size(&self) -> (u32, u32) {
        self.inner.get_size()
    }

    fn ensure_prepared(&mut self) -> Result<(), DrawingErrorKind<Error>> {
        self.inner.ensure_prepared()
    }

    fn present(&mut self) -> Result<(), DrawingErrorKind<Error>> {
        self.inner.present()
    }

    fn draw_pixel(&mut self, point: BackendCoord, color: BackendColor) -> Result<(), DrawingErrorKind<Error>> {
        self.inner.draw_pixel(point, color)
    }

    fn draw_line<S: BackendStyle>(
        &mut self,
        from: BackendCoord,
        to: BackendCoord,
        style: &S,
    ) -> Result<(), DrawingErrorKind<Error>> {
        self.inner.draw_line(from, to, style)
    }

    fn draw_rect<S: BackendStyle>(
        &mut self,
        upper_left: BackendCoord,
        bottom_right: BackendCoord,
        style: &S,
        fill: bool,
    ) -> Result<(), DrawingErrorKind<Error>> {
        self.inner.draw_rect(upper_left, bottom_right, style, fill)
    }

    /// A path wider than a pixel as one quadrilateral per segment and a
    /// disc at each inner vertex, never as one polygon.
    fn draw_path<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        path: I,
        style: &S,
    ) -> Result<(), DrawingErrorKind<Error>> {
        let width = style.stroke_width();
        if width <= 1 {
            return self.inner.draw_path(path, style);
        }
        let mut points: Vec<BackendCoord> = path.into_iter().collect();
        points.dedup();
        for segment in points.windows(2) {
            self.inner.draw_path(segment.iter().copied(), style)?;
        }
        if let [_, inner @ .., _] = points.as_slice() {
            for &p in inner {
                self.inner.draw_circle(p, width / 2, style, true)?;
            }
        }
        Ok(())
    }

    fn draw_circle<S: BackendStyle>(
        &mut self,
        center: BackendCoord,
        radius: u32,
        style: &S,
        fill: bool,
    ) -> Result<(), DrawingErrorKind<Error>> {
        self.inner.draw_circle(center, radius, style, fill)
    }

    fn fill_polygon<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        vert: I,
        style: &S,
    ) -> Result<(), DrawingErrorKind<Error>> {
        self.inner.fill_polygon(vert, style)
    }

    fn blit_bitmap(&mut self, pos: BackendCoord, size: (u32, u32), src: &[u8]) -> Result<(), DrawingErrorKind<Error>> {
        self.inner.blit_bitmap(pos, size, src)
    }

    fn estimate_text_size<S: BackendTextStyle>(
        &self,
        text: &str,
        style: &S,
    ) -> Result<(u32, u32), DrawingErrorKind<Error>> {
        self.inner.estimate_text_size(text, style)
    }

    /// plotters' anchoring and rotation, with glyphs placed by the font:
    /// the layout box is plotters' (the advances' sum by `size / 1.24`), and
    /// the baseline is set so that capitals sit in the middle of the box.
    fn draw_text<S: BackendTextStyle>(
        &mut self,
        text: &str,
        style: &S,
        pos: BackendCoord,
    ) -> Result<(), DrawingErrorKind<Error>> {
        let color = style.color();
        if color.alpha == 0.0 {
            return Ok(());
        }
        let ((min_x, min_y), (max_x, max_y)) = style
            .layout_box(text)
            .map_err(|e| DrawingErrorKind::FontError(Box::new(e)))?;
        let (width, height) = (max_x - min_x, max_y - min_y);
        let dx = match style.anchor().h_pos {
            HPos::Left => 0,
            HPos::Right => -width,
            HPos::Center => -width / 2,
        };
        let dy = match style.anchor().v_pos {
            VPos::Top => 0,
            VPos::Center => -height / 2,
            VPos::Bottom => -height,
        };
        let scale = PxScale::from(style.size() as f32);
        let font = self.font.as_scaled(scale);
        let cap = font
            .outline_glyph(font.scaled_glyph('H'))
            .map_or(scale.y * 0.6, |g| -g.px_bounds().min.y);
        let baseline = ((height as f32 + cap) / 2.0).round();
        let trans = style.transform();
        let (w, h) = self.inner.get_size();
        let mut caret = 0.0f32;
        let mut prev = None;
        let mut result = Ok(());
        for c in text.chars() {
            let id = font.glyph_id(c);
            if let Some(p) = prev {
                caret += font.kern(p, id);
            }
            prev = Some(id);
            let glyph = id.with_scale_and_position(scale, point(caret, baseline));
            caret += font.h_advance(id);
            let Some(outline) = font.outline_glyph(glyph) else {
                continue;
            };
            let bounds = outline.px_bounds();
            let (gx, gy) = (bounds.min.x as i32, bounds.min.y as i32);
            outline.draw(|x, y, coverage| {
                let (x, y) = trans.transform(gx + x as i32 + dx, gy + y as i32 + dy);
                let (x, y) = (pos.0 + x, pos.1 + y);
                if result.is_ok() && coverage > 0.0 && x >= 0 && y >= 0 && (x as u32) < w && (y as u32) < h {
                    let alpha = color.alpha * f64::from(coverage.min(1.0));
                    result = self.inner.draw_pixel((x, y), BackendColor { alpha, rgb: color.rgb });
                }
            });
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The painted pixels' `(min x, max x, min y, max y)` after drawing
    /// `path` `width` px wide on a white 300 × 100 image.
    fn painted(path: &[BackendCoord], width: u32) -> (usize, usize, usize, usize) {
        let (w, h) = (300usize, 100usize);
        let mut rgb = vec![255u8; w * h * 3];
        {
            let font = FontRef::try_from_slice(include_bytes!("../fonts/DejaVuSans.ttf")).unwrap();
            let mut bitmap = Bitmap::new(BitMapBackend::with_buffer(&mut rgb, (w as u32, h as u32)), font);
            let style = ShapeStyle::from(BLACK).stroke_width(width);
            bitmap.draw_path(path.iter().copied(), &style).unwrap();
            bitmap.present().unwrap();
        }
        let mut bounds = (usize::MAX, 0, usize::MAX, 0);
        for (i, px) in rgb.chunks_exact(3).enumerate() {
            if px != [255, 255, 255] {
                let (x, y) = (i % w, i / w);
                bounds = (bounds.0.min(x), bounds.1.max(x), bounds.2.min(y), bounds.3.max(y));
            }
        }
        bounds
    }

    #[test]
    fn wide_lines_that_turn_back_stay_near_their_points() {
        // A count that climbs and drops back: plotters' own polygon put the
        // inner corner far to the right (and off the image).
        let zigzag = [(20, 50), (200, 48), (20, 52), (200, 50)];
        let (x0, x1, y0, y1) = painted(&zigzag, 4);
        assert!(x0 >= 17 && x1 <= 203, "x from {x0} to {x1}");
        assert!(y0 >= 45 && y1 <= 55, "y from {y0} to {y1}");
        // A thin line and a straight one are as before.
        assert_eq!(painted(&[(10, 10), (100, 10)], 1), (10, 100, 10, 10));
        let (x0, x1, y0, y1) = painted(&[(10, 10), (50, 10), (100, 10)], 4);
        assert!(x0 >= 8 && x1 <= 102 && y0 >= 8 && y1 <= 12, "{x0} {x1} {y0} {y1}");
        // A lone point or nothing draws nothing, and does not fail.
        assert_eq!(painted(&[(5, 5)], 4), (usize::MAX, 0, usize::MAX, 0));
        assert_eq!(painted(&[], 4), (usize::MAX, 0, usize::MAX, 0));
    }
}
