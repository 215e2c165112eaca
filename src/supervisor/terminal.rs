//! The host terminal while a guest command owns it: raw mode (keystrokes go
//! to the guest's terminal untouched, Ctrl-C included), restored on every way
//! out: normal exit, error, panic, and signals that end stockade. When the
//! command is done, the display state its output may have changed is put
//! back too (`sane_display`), so what stockade prints next, above all the
//! review of the guest's changes, is shown as written.

use std::io::IsTerminal;
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
/// after the guest's output and before anything stockade says about it.
pub fn sane_display() {
    use std::io::Write;
    if std::io::stdout().is_terminal() {
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(SANE_DISPLAY).and_then(|()| out.flush());
    }
    if std::io::stderr().is_terminal() {
        let _ = std::io::stderr().lock().write_all(SANE_DISPLAY);
    }
}

fn install_panic_hook() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        restore();
        previous(info);
    }));
}
