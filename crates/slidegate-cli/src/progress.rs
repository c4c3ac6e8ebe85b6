//! Progress bars on stderr, drawn only when stderr is a terminal (never in
//! pipes or tests).

use indicatif::{ProgressBar, ProgressStyle};

/// A bar of `len` steps drawn with `template`, or a hidden one when
/// `shown` is false.
pub(crate) fn bar(shown: bool, len: u64, template: &str) -> ProgressBar {
    if !shown {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}
