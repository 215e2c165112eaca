//! The host terminal while a guest command owns it: raw mode (keystrokes go
//! to the guest's terminal untouched, Ctrl-C included), restored on every way
//! out: normal exit, error, panic, and signals that end stockade. When the
//! command is done, the display state its output may have changed is put
//! back too (`sane_display`), so what stockade prints next, above all the
//! review of the guest's changes, is shown as written.

use std::io::{IsTerminal, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Mutex;

use nix::sys::termios::{SetArg, Termios, cfmakeraw, tcgetattr, tcsetattr};

use crate::protocol::WindowSize;

/// The settings to put back, shared with the panic hook.
static SAVED: Mutex<Option<Termios>> = Mutex::new(None);

/// Whether stockade runs on an interactive terminal (stdin and stdout).
pub fn interactive() -> bool {
    std::io::stdin().is_terminal() && std::io::stdout().is_terminal()
}

/// The size of the terminal on stdout (or stdin), if there is one.
pub fn size() -> Option<WindowSize> {
    let from = |fd: BorrowedFd<'_>| terminal_size::terminal_size_of(fd);
    from(std::io::stdout().as_fd())
        .or_else(|| from(std::io::stdin().as_fd()))
        .map(|(w, h)| WindowSize { rows: h.0, cols: w.0 })
}

/// Raw mode on stdin until dropped.
pub struct RawMode(());

impl RawMode {
    /// Switches stdin to raw mode if it is a terminal; `None` otherwise.
    pub fn enter() -> anyhow::Result<Option<RawMode>> {
        if !std::io::stdin().is_terminal() {
            return Ok(None);
        }
        let stdin = std::io::stdin();
        let original = tcgetattr(stdin.as_fd())?;
        let mut raw = original.clone();
        cfmakeraw(&mut raw);
        *SAVED.lock().unwrap_or_else(|p| p.into_inner()) = Some(original);
        install_panic_hook();
        tcsetattr(stdin.as_fd(), SetArg::TCSADRAIN, &raw)?;
        Ok(Some(RawMode(())))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        restore();
    }
}

/// Puts the saved terminal settings back (idempotent).
pub fn restore() {
    if let Some(original) = SAVED.lock().unwrap_or_else(|p| p.into_inner()).take() {
        let _ = tcsetattr(std::io::stdin().as_fd(), SetArg::TCSADRAIN, &original);
    }
}

/// What the guest's output may have left set on the terminal, undone:
/// shift in and ASCII in both character sets (a DEC line-drawing set turns
/// letters into box pieces), no attributes (concealed or same-colour text
/// hides lines), the whole screen as scroll region with origin mode off
/// (a one-line region makes the summary scroll away), insert mode off,
/// autowrap on, reverse video off, the normal screen rather than the
/// alternate one, no mouse reports or bracketed paste (they would feed the
/// prompt), normal cursor keys and keypad, and the cursor shown. Nothing
/// here clears the screen or scrollback: the command's output stays.
pub const SANE_DISPLAY: &[u8] = b"\x0f\x1b(B\x1b)B\x1b[0m\x1b[r\x1b[?6l\x1b[4l\x1b[?7h\x1b[?5l\x1b[?1049l\
\x1b[?1000l\x1b[?1002l\x1b[?1003l\x1b[?1006l\x1b[?2004l\x1b[?1l\x1b>\x1b[?25h";

/// Writes `SANE_DISPLAY` to stdout and stderr where they are terminals,
/// once to a terminal that is both, after the guest's output and before
/// anything stockade says about it.
pub fn sane_display() {
    write_sane_display(&mut std::io::stdout(), &mut std::io::stderr());
}

fn write_sane_display(stdout: &mut (impl Write + AsFd), stderr: &mut (impl Write + AsFd)) {
    let targets = reset_targets(TerminalNode::of(stdout.as_fd()), TerminalNode::of(stderr.as_fd()));
    if targets.stdout {
        let _ = stdout.write_all(SANE_DISPLAY).and_then(|()| stdout.flush());
    }
    if targets.stderr {
        let _ = stderr.write_all(SANE_DISPLAY).and_then(|()| stderr.flush());
    }
}

/// The device node a terminal descriptor was opened at. Two descriptors
/// with the same node are one terminal. The device number alone would not
/// do: two devpts instances (containers) reuse the same numbers. A terminal
/// reached by two nodes (/dev/tty and /dev/pts/3) counts as two, and gets
/// the reset twice, which is harmless.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TerminalNode {
    dev: nix::libc::dev_t,
    ino: nix::libc::ino_t,
}

impl TerminalNode {
    /// The terminal on `fd`, if it is one.
    fn of(fd: BorrowedFd<'_>) -> Option<TerminalNode> {
        if !fd.is_terminal() {
            return None;
        }
        let stat = nix::sys::stat::fstat(fd).ok()?;
        Some(TerminalNode { dev: stat.st_dev, ino: stat.st_ino })
    }
}

/// Which of stdout and stderr get the reset.
#[derive(Debug, PartialEq, Eq)]
struct ResetTargets {
    stdout: bool,
    stderr: bool,
}

/// Each terminal once: stdout's if it is one, stderr's unless it is the
/// same terminal as stdout's.
fn reset_targets(stdout: Option<TerminalNode>, stderr: Option<TerminalNode>) -> ResetTargets {
    ResetTargets { stdout: stdout.is_some(), stderr: stderr.is_some() && stderr != stdout }
}

fn install_panic_hook() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        restore();
        previous(info);
    }));
}

#[cfg(test)]
mod tests {
    use std::fs::File;
    use std::io::Read;

    use nix::pty::openpty;

    use super::*;

    const NODE: TerminalNode = TerminalNode { dev: 34, ino: 3 };

    #[test]
    fn one_terminal_gets_one_reset_and_two_get_one_each() {
        let other = TerminalNode { ino: 4, ..NODE };
        let (both, each) = (ResetTargets { stdout: true, stderr: true }, ResetTargets { stdout: true, stderr: false });
        assert_eq!(reset_targets(Some(NODE), Some(NODE)), each, "stdout and stderr the same terminal");
        assert_eq!(reset_targets(Some(NODE), Some(other)), both, "two terminals");
        assert_eq!(reset_targets(Some(NODE), Some(TerminalNode { dev: 35, ..NODE })), both, "another devpts");
        assert_eq!(reset_targets(None, Some(NODE)), ResetTargets { stdout: false, stderr: true });
        assert_eq!(reset_targets(Some(NODE), None), each);
        assert_eq!(reset_targets(None, None), ResetTargets { stdout: false, stderr: false });
    }

    /// What the terminal behind `master` was sent, up to the marker written
    /// after the reset (a pty passes bytes on in order).
    fn received(master: &mut File, slave: &mut File) -> Vec<u8> {
        const END: &[u8] = b"END";
        slave.write_all(END).unwrap();
        let mut seen = Vec::new();
        let mut buf = [0; 4096];
        while !seen.ends_with(END) {
            let n = master.read(&mut buf).unwrap();
            assert!(n > 0, "the pty closed before the marker");
            seen.extend_from_slice(&buf[..n]);
        }
        seen.truncate(seen.len() - END.len());
        seen
    }

    #[test]
    fn a_real_terminal_on_stdout_and_stderr_is_reset_once() {
        let pty = openpty(None, None).unwrap();
        let (mut master, mut stdout) = (File::from(pty.master), File::from(pty.slave));
        let mut stderr = stdout.try_clone().unwrap();
        assert_eq!(TerminalNode::of(stdout.as_fd()), TerminalNode::of(stderr.as_fd()));
        write_sane_display(&mut stdout, &mut stderr);
        assert_eq!(received(&mut master, &mut stdout), SANE_DISPLAY);
    }

    #[test]
    fn two_real_terminals_are_reset_each_and_a_pipe_not() {
        let (first, second) = (openpty(None, None).unwrap(), openpty(None, None).unwrap());
        let (mut master1, mut stdout) = (File::from(first.master), File::from(first.slave));
        let (mut master2, mut stderr) = (File::from(second.master), File::from(second.slave));
        assert_ne!(TerminalNode::of(stdout.as_fd()), TerminalNode::of(stderr.as_fd()));
        write_sane_display(&mut stdout, &mut stderr);
        assert_eq!(received(&mut master1, &mut stdout), SANE_DISPLAY);
        assert_eq!(received(&mut master2, &mut stderr), SANE_DISPLAY);

        let (read, write) = nix::unistd::pipe().unwrap();
        let (mut pipe_out, mut pipe_in) = (File::from(read), File::from(write));
        assert_eq!(TerminalNode::of(pipe_in.as_fd()), None);
        write_sane_display(&mut pipe_in, &mut stderr);
        assert_eq!(received(&mut master2, &mut stderr), SANE_DISPLAY);
        pipe_in.write_all(b"END").unwrap();
        drop(pipe_in);
        let mut piped = Vec::new();
        pipe_out.read_to_end(&mut piped).unwrap();
        assert_eq!(piped, b"END", "nothing but what was written goes to a pipe");
    }
}
