//! Colour for review output: whether to use it (`--color`, `NO_COLOR`, a
//! terminal) and the few styles the summary and diffs share. Styles are
//! written as ANSI sequences only when enabled, so plain output (pipes,
//! `--patch`) never carries an escape byte.

use std::fmt;
use std::io::IsTerminal;

use anstyle::{AnsiColor, Color, Effects, Style};

/// `--color` on the review commands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ColorChoice {
    /// Colour when writing to a terminal, unless NO_COLOR is set or TERM is dumb.
    #[default]
    Auto,
    Always,
    Never,
}

impl ColorChoice {
    /// Whether to colour output bound for a stream that `is_terminal` describes.
    pub fn enabled(self, is_terminal: bool) -> bool {
        self.decide(is_terminal, std::env::var_os("NO_COLOR"), std::env::var_os("TERM"))
    }

    /// Colour for stderr (the review after a run).
    pub fn for_stderr(self) -> bool {
        self.enabled(std::io::stderr().is_terminal())
    }

    fn decide(self, is_terminal: bool, no_color: Option<std::ffi::OsString>, term: Option<std::ffi::OsString>) -> bool {
        match self {
            ColorChoice::Always => true,
            ColorChoice::Never => false,
            // https://no-color.org: set and not empty means no colour.
            ColorChoice::Auto => {
                is_terminal && no_color.is_none_or(|v| v.is_empty()) && term.is_none_or(|t| t != "dumb")
            }
        }
    }
}

/// What a piece of output means; each has one style.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Heading,
    Dir,
    Added,
    Modified,
    Deleted,
    Other,
    Plus,
    Minus,
    /// Something that runs code without being asked: hooks, CI, editor tasks.
    Danger,
    Conflict,
    Git,
    Muted,
    Hunk,
    Meta,
    /// An escaped control character or invisible bidi mark inside content.
    Escaped,
}

impl Role {
    fn style(self) -> Style {
        let fg = |c: AnsiColor| Style::new().fg_color(Some(Color::Ansi(c)));
        match self {
            Role::Heading => Style::new().effects(Effects::BOLD),
            Role::Dir => Style::new().effects(Effects::BOLD),
            Role::Added | Role::Plus => fg(AnsiColor::Green),
            Role::Modified => fg(AnsiColor::Yellow),
            Role::Deleted | Role::Minus => fg(AnsiColor::Red),
            Role::Other => fg(AnsiColor::Magenta),
            Role::Danger => fg(AnsiColor::Red).effects(Effects::BOLD),
            Role::Conflict => fg(AnsiColor::Red).effects(Effects::BOLD),
            Role::Git => fg(AnsiColor::Cyan),
            Role::Muted => Style::new().effects(Effects::DIMMED),
            Role::Hunk => fg(AnsiColor::Cyan),
            Role::Meta => Style::new().effects(Effects::BOLD),
            Role::Escaped => Style::new().effects(Effects::INVERT),
        }
    }
}

/// Applies roles when colour is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Painter {
    color: bool,
}

impl Painter {
    pub fn new(color: bool) -> Painter {
        Painter { color }
    }

    pub fn plain() -> Painter {
        Painter { color: false }
    }

    pub fn color(&self) -> bool {
        self.color
    }

    pub fn paint<T: fmt::Display>(&self, role: Role, text: T) -> Painted<T> {
        Painted { style: self.color.then(|| role.style()), text }
    }
}

/// Text with an optional style, rendered by `Display`.
pub struct Painted<T> {
    style: Option<Style>,
    text: T,
}

impl<T: fmt::Display> fmt::Display for Painted<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.style {
            Some(style) => write!(f, "{}{}{}", style.render(), self.text, style.render_reset()),
            None => self.text.fmt(f),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_colour_needs_a_terminal_and_respects_no_color() {
        let auto = ColorChoice::Auto;
        assert!(auto.decide(true, None, Some("xterm".into())));
        assert!(!auto.decide(false, None, Some("xterm".into())));
        assert!(!auto.decide(true, Some("1".into()), Some("xterm".into())));
        assert!(auto.decide(true, Some("".into()), None), "an empty NO_COLOR does not count");
        assert!(!auto.decide(true, None, Some("dumb".into())));
        assert!(ColorChoice::Always.decide(false, Some("1".into()), None));
        assert!(!ColorChoice::Never.decide(true, None, None));
    }

    #[test]
    fn plain_painter_writes_no_escapes() {
        assert_eq!(Painter::plain().paint(Role::Danger, "x").to_string(), "x");
        let colored = Painter::new(true).paint(Role::Added, "x").to_string();
        assert!(colored.starts_with('\x1b') && colored.contains('x'), "{colored:?}");
    }
}
