//! Progress of long work on stderr. Library code reports through the
//! [`Progress`] trait; [`Meter`] shows it: a bar (or a counter when the
//! total is unknown) when stderr is a terminal, a plain line every few
//! seconds otherwise (CI logs), and nothing at all for work that ends
//! before it would be worth a look. [`Steps`] shows work that has named
//! steps but no count.
#![forbid(unsafe_code)]

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{HumanBytes, HumanCount, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// On a terminal, work that ends sooner than this never draws a bar.
const BAR_AFTER: Duration = Duration::from_millis(400);
/// Without a terminal, the first plain line comes after this long...
const FIRST_LINE_AFTER: Duration = Duration::from_secs(2);
/// ...and the next ones this far apart.
const LINE_EVERY: Duration = Duration::from_secs(10);

const BAR: &str = "stockade: {msg} [{bar:30}] {human_pos}/{human_len} {prefix} ({eta} left)";
const COUNTER: &str = "stockade: {msg} {spinner} {human_pos} {prefix}";
const BYTES_BAR: &str = "stockade: {msg} [{bar:30}] {binary_bytes}/{binary_total_bytes} ({eta} left)";
const BYTES_COUNTER: &str = "stockade: {msg} {spinner} {binary_bytes}";
const STEPS: &str = "stockade: {prefix}: {spinner} {wide_msg} {elapsed}";

/// How far long work got.
pub trait Progress {
    /// The work begins; `total` steps when known.
    fn start(&mut self, total: Option<u64>);
    /// `done` steps are done.
    fn set(&mut self, done: u64);
    /// The work is over: whatever was drawn is cleared.
    fn finish(&mut self);
}

/// Shows nothing (tests, and work whose caller has nowhere to show it).
#[cfg(test)]
pub struct Silent;

#[cfg(test)]
impl Progress for Silent {
    fn start(&mut self, _: Option<u64>) {}
    fn set(&mut self, _: u64) {}
    fn finish(&mut self) {}
}

/// Progress on stderr, e.g. "stockade: applying the changes [===>  ] 1,204/10,000".
pub struct Meter {
    /// What is being done, as in "applying the changes".
    what: &'static str,
    /// What a step is, plural ("paths").
    unit: &'static str,
    /// Steps are bytes, shown as KiB, MiB...
    bytes: bool,
    terminal: bool,
    total: Option<u64>,
    started: Instant,
    next_line: Instant,
    bar: Option<ProgressBar>,
}

impl Meter {
    pub fn stderr(what: &'static str, unit: &'static str) -> Meter {
        let now = Instant::now();
        Meter {
            what,
            unit,
            bytes: false,
            terminal: std::io::stderr().is_terminal(),
            total: None,
            started: now,
            next_line: now + FIRST_LINE_AFTER,
            bar: None,
        }
    }

    /// A meter whose steps are bytes.
    pub fn bytes(what: &'static str) -> Meter {
        let mut meter = Meter::stderr(what, "bytes");
        meter.bytes = true;
        meter
    }

    fn new_bar(&self) -> ProgressBar {
        // Hidden until fully set up, so that no half-made frame is drawn.
        let bar = ProgressBar::with_draw_target(self.total, ProgressDrawTarget::hidden());
        let template = match (self.total.is_some(), self.bytes) {
            (true, false) => BAR,
            (false, false) => COUNTER,
            (true, true) => BYTES_BAR,
            (false, true) => BYTES_COUNTER,
        };
        // A template that does not parse only costs the bar its looks.
        if let Ok(style) = ProgressStyle::with_template(template) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_message(self.what);
        bar.set_prefix(self.unit);
        bar.set_draw_target(ProgressDrawTarget::stderr());
        bar
    }

    /// The plain line for `done` steps.
    fn line(&self, done: u64) -> String {
        if self.bytes {
            return match self.total {
                Some(total) => format!("stockade: {}: {} of {}", self.what, HumanBytes(done), HumanBytes(total)),
                None => format!("stockade: {}: {} so far", self.what, HumanBytes(done)),
            };
        }
        match self.total {
            Some(total) => {
                format!("stockade: {}: {} of {} {}", self.what, HumanCount(done), HumanCount(total), self.unit)
            }
            None => format!("stockade: {}: {} {} so far", self.what, HumanCount(done), self.unit),
        }
    }
}

impl Progress for Meter {
    fn start(&mut self, total: Option<u64>) {
        let now = Instant::now();
        self.total = total;
        self.started = now;
        self.next_line = now + FIRST_LINE_AFTER;
    }

    fn set(&mut self, done: u64) {
        let now = Instant::now();
        if self.terminal {
            if self.bar.is_none() && now.duration_since(self.started) >= BAR_AFTER {
                self.bar = Some(self.new_bar());
            }
            if let Some(bar) = &self.bar {
                bar.set_position(done);
            }
        } else if now >= self.next_line {
            eprintln!("{}", self.line(done));
            self.next_line = now + LINE_EVERY;
        }
    }

    fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Work in named steps of unknown length (an image build): on a terminal a
/// spinner with the current step and the time so far, otherwise one plain
/// line per step.
pub struct Steps {
    what: String,
    terminal: bool,
    bar: Option<ProgressBar>,
}

impl Steps {
    /// `what` names the work, as in "image debian".
    pub fn stderr(what: impl Into<String>) -> Steps {
        Steps { what: what.into(), terminal: std::io::stderr().is_terminal(), bar: None }
    }

    pub fn step(&mut self, text: &str) {
        if !self.terminal {
            eprintln!("stockade: {}: {text}", self.what);
            return;
        }
        let bar = self.bar.get_or_insert_with(|| {
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden());
            if let Ok(style) = ProgressStyle::with_template(STEPS) {
                bar.set_style(style);
            }
            bar.set_prefix(self.what.clone());
            bar.set_draw_target(ProgressDrawTarget::stderr());
            bar.enable_steady_tick(Duration::from_millis(120));
            bar
        });
        bar.set_message(text.to_string());
    }

    pub fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

impl Drop for Steps {
    fn drop(&mut self) {
        self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_lines_count_with_or_without_a_total() {
        let mut meter = Meter::stderr("applying the changes", "changes");
        meter.start(Some(12_000));
        assert_eq!(meter.line(1_204), "stockade: applying the changes: 1,204 of 12,000 changes");
        meter.start(None);
        assert_eq!(meter.line(5), "stockade: applying the changes: 5 changes so far");
        let mut meter = Meter::bytes("receiving the changes");
        meter.start(None);
        assert_eq!(meter.line(3 << 20), "stockade: receiving the changes: 3.00 MiB so far");
    }

    #[test]
    fn templates_parse() {
        assert!(ProgressStyle::with_template(BAR).is_ok());
        assert!(ProgressStyle::with_template(COUNTER).is_ok());
        assert!(ProgressStyle::with_template(STEPS).is_ok());
        assert!(ProgressStyle::with_template(BYTES_BAR).is_ok());
        assert!(ProgressStyle::with_template(BYTES_COUNTER).is_ok());
    }

    #[test]
    fn quick_work_draws_nothing() {
        let mut meter = Meter::stderr("x", "y");
        meter.terminal = true;
        meter.start(Some(3));
        meter.set(3);
        assert!(meter.bar.is_none());
        meter.started -= BAR_AFTER;
        meter.set(3);
        assert!(meter.bar.is_some());
        meter.finish();
        assert!(meter.bar.is_none());
    }
}
