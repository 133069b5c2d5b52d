//! Progress bars on a terminal, nothing otherwise (logs stay clean).

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};

/// A progress bar drawn on stderr only when stderr is a terminal.
pub struct Progress(ProgressBar);

impl Progress {
    /// A bar of `len` steps labelled `what`.
    pub fn new(len: u64, what: &str) -> Progress {
        let pb = if std::io::stderr().is_terminal() {
            ProgressBar::new(len)
        } else {
            ProgressBar::hidden()
        };
        if let Ok(style) = ProgressStyle::with_template(
            "{prefix} [{bar:30}] {pos}/{len} {elapsed_precise} (eta {eta})",
        ) {
            pb.set_style(style.progress_chars("=> "));
        }
        pb.set_prefix(what.to_string());
        Progress(pb)
    }

    /// Advances by `n`.
    pub fn inc(&self, n: u64) {
        self.0.inc(n);
    }

    /// Clears the bar.
    pub fn finish(&self) {
        self.0.finish_and_clear();
    }
}
