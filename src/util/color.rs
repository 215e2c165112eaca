//! Whether to colour output: `--color`, `NO_COLOR` and whether the stream
//! is a terminal.

use std::io::IsTerminal;

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
}
