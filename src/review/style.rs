//! Colour for review output: whether to use it (`--color`, `NO_COLOR`, a
//! terminal) and the few styles the summary and diffs share. Styles are
//! written as ANSI sequences only when enabled, so plain output (pipes,
//! `--patch`) never carries an escape byte.

use std::fmt;

use anstyle::{AnsiColor, Color, Effects, Style};

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
    fn plain_painter_writes_no_escapes() {
        assert_eq!(Painter::plain().paint(Role::Danger, "x").to_string(), "x");
        let colored = Painter::new(true).paint(Role::Added, "x").to_string();
        assert!(colored.starts_with('\x1b') && colored.contains('x'), "{colored:?}");
    }
}
