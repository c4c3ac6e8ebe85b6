//! The PNG's drawing backend: plotters' bitmap backend with its own text.
//!
//! plotters 0.3.7 draws ab_glyph text without each glyph's left side
//! bearing, so letters sit unevenly ("min ute"). This wrapper passes every
//! shape to the bitmap backend and draws text itself with the same font, the
//! same advances and the same layout box as plotters measures (so the
//! layout is the SVG's), placing every glyph where the font says.

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

    fn draw_path<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        path: I,
        style: &S,
    ) -> Result<(), DrawingErrorKind<Error>> {
        self.inner.draw_path(path, style)
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
