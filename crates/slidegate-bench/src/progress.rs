//! The run's progress bar on stderr, drawn only when stderr is a terminal
//! (never in pipes or tests).

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

/// Moves to the next step, named `what` (the first call names the first).
pub(crate) fn step(bar: &ProgressBar, what: &str) {
    if !bar.message().is_empty() {
        bar.inc(1);
    }
    bar.set_message(what.to_owned());
}
