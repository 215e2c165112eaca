//! The host terminal while a guest command owns it: raw mode (keystrokes go
//! to the guest's terminal untouched, Ctrl-C included), restored on every way
//! out: normal exit, error, panic, and signals that end stockade.

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

fn install_panic_hook() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        restore();
        previous(info);
    }));
}
