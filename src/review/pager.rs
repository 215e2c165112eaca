//! Showing long output through a pager, as git does: `$STOCKADE_PAGER`,
//! else `$PAGER`, else `less -R` with `LESS=FRX` when unset (quit if one
//! screen, keep colours, leave the text on screen) when it exists, else
//! plain output.
//! An empty pager or `cat` means no pager.

use std::io::{self, BufWriter, Write};
use std::os::fd::AsFd;
use std::process::{Command, Stdio};

/// Where the pager's output goes: stdout for `stockade diff`, stderr (the
/// terminal) for the review after a run, whose stdout is the command's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Stdout,
    Stderr,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pager {
    Off,
    /// A command line run by `sh -c`, as `$PAGER` is.
    Shell(String, Target),
    /// `less` found on PATH.
    Less(Target),
}

impl Pager {
    /// The pager from the environment, for output to `target` (which must
    /// be a terminal; callers check).
    pub fn from_env(target: Target) -> Pager {
        let chosen = std::env::var("STOCKADE_PAGER").ok().or_else(|| std::env::var("PAGER").ok());
        Pager::choose(chosen.as_deref(), target)
    }

    fn choose(chosen: Option<&str>, target: Target) -> Pager {
        match chosen.map(str::trim) {
            Some("") | Some("cat") => Pager::Off,
            Some(cmd) => Pager::Shell(cmd.to_string(), target),
            None => Pager::Less(target),
        }
    }

    /// Renders through the pager, or into `direct` when there is none or it
    /// cannot start. Quitting the pager early is not an error.
    pub fn show(
        &self,
        direct: &mut dyn Write,
        render: &mut dyn FnMut(&mut dyn Write) -> io::Result<()>,
    ) -> io::Result<()> {
        let (mut command, target) = match self {
            Pager::Off => return quiet_pipe(render(direct)),
            Pager::Shell(cmd, target) => {
                let mut c = Command::new("sh");
                c.arg("-c").arg(cmd);
                (c, *target)
            }
            Pager::Less(target) => {
                // -R even when the user's LESS lacks it: our output is coloured.
                let mut c = Command::new("less");
                c.arg("-R");
                (c, *target)
            }
        };
        if std::env::var_os("LESS").is_none() {
            command.env("LESS", "FRX");
        }
        if std::env::var_os("LV").is_none() {
            command.env("LV", "-c");
        }
        command.stdin(Stdio::piped());
        if target == Target::Stderr {
            command.stdout(Stdio::from(io::stderr().as_fd().try_clone_to_owned()?));
        }
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(e) => {
                tracing::debug!("no pager ({e}); writing directly");
                return quiet_pipe(render(direct));
            }
        };
        let result = match child.stdin.take() {
            Some(stdin) => {
                let mut pipe = BufWriter::new(stdin);
                render(&mut pipe).and_then(|()| pipe.flush())
            }
            None => Ok(()),
        };
        let _ = child.wait();
        quiet_pipe(result)
    }
}

/// A reader (pager, `head`) that went away is the reader's choice.
fn quiet_pipe(result: io::Result<()>) -> io::Result<()> {
    match result {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chooses_like_git() {
        assert_eq!(Pager::choose(Some(""), Target::Stdout), Pager::Off);
        assert_eq!(Pager::choose(Some("cat"), Target::Stdout), Pager::Off);
        assert_eq!(Pager::choose(Some("less -S"), Target::Stderr), Pager::Shell("less -S".into(), Target::Stderr));
        assert_eq!(Pager::choose(None, Target::Stdout), Pager::Less(Target::Stdout));
    }

    #[test]
    fn pipes_through_a_shell_pager() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("paged");
        let pager = Pager::Shell(format!("cat > '{}'", file.display()), Target::Stdout);
        let mut direct = Vec::new();
        pager.show(&mut direct, &mut |out| out.write_all(b"hello\n")).unwrap();
        assert!(direct.is_empty());
        assert_eq!(std::fs::read(&file).unwrap(), b"hello\n");
    }

    #[test]
    fn a_pager_that_quits_early_is_fine() {
        let pager = Pager::Shell("true".into(), Target::Stdout);
        let big = vec![b'x'; 1 << 20];
        pager.show(&mut Vec::new(), &mut |out| out.write_all(&big)).unwrap();
    }
}
