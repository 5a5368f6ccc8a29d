//! Progress bars (indicatif) for the steps that take more than a second: the first fetch of a
//! model, weight preparation, evaluation. Hidden when standard error is not a terminal or when
//! the program asked for quiet ([`set_quiet`], `--quiet`).

use std::borrow::Cow;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

static QUIET: AtomicBool = AtomicBool::new(false);

/// Hides every progress bar of this process from now on (`--quiet`).
pub fn set_quiet(quiet: bool) {
    QUIET.store(quiet, Ordering::Relaxed);
}

/// Whether progress is shown: not quiet, and standard error is a terminal.
pub fn shown() -> bool {
    !QUIET.load(Ordering::Relaxed) && std::io::stderr().is_terminal()
}

/// A spinner with the elapsed time for a step of unknown length; `finish_and_clear` it.
pub fn spinner(message: impl Into<Cow<'static, str>>) -> ProgressBar {
    if !shown() {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new_spinner().with_message(message);
    if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
        pb.set_style(style);
    }
    pb.enable_steady_tick(Duration::from_millis(120));
    pb
}

/// A bar over `len` items.
pub fn bar(len: u64, message: impl Into<Cow<'static, str>>) -> ProgressBar {
    if !shown() {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(len).with_message(message);
    if let Ok(style) =
        ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} ({elapsed}, eta {eta})")
    {
        pb.set_style(style.progress_chars("=> "));
    }
    pb
}
