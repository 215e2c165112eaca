//! The command's pseudo-terminal: the command becomes a session leader with
//! the PTY as its controlling terminal, so line editing, Ctrl-C/Z/\ and job
//! control behave as in a local terminal. The host's keystrokes go to the
//! master side; everything the command prints comes back from it.

use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};

use anyhow::Context;
use nix::fcntl::{FcntlArg, FdFlag, fcntl};
use nix::pty::{Winsize, openpty};
use nix::unistd::Pid;

use crate::protocol::WindowSize;

fn winsize(size: WindowSize) -> Winsize {
    Winsize { ws_row: size.rows, ws_col: size.cols, ws_xpixel: 0, ws_ypixel: 0 }
}

pub struct Pty {
    pub master: File,
    slave: OwnedFd,
}

/// Opens a PTY pair of the given size.
pub fn open(size: WindowSize) -> anyhow::Result<Pty> {
    let pair = openpty(Some(&winsize(size)), None).context("cannot open a pseudo-terminal")?;
    // openpty's descriptors survive exec: the command would hold the master
    // (and a fourth copy of its terminal) open.
    for fd in [&pair.master, &pair.slave] {
        fcntl(fd, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC)).context("cannot set up the pseudo-terminal")?;
    }
    Ok(Pty { master: File::from(pair.master), slave: pair.slave })
}

impl Pty {
    /// Splits the pair into the master, which stays with the init, and the
    /// slave three times over, as the command's stdin, stdout and stderr.
    /// The command makes it its controlling terminal (`spawn::Session::Terminal`).
    pub fn split(self) -> anyhow::Result<(File, [OwnedFd; 3])> {
        let stdin = self.slave.try_clone().context("cannot duplicate the terminal")?;
        let stdout = self.slave.try_clone().context("cannot duplicate the terminal")?;
        Ok((self.master, [stdin, stdout, self.slave]))
    }
}

/// Tells the terminal (and so the foreground job, by SIGWINCH) its new size.
pub fn resize(master: &File, size: WindowSize) {
    let ws = winsize(size);
    // SAFETY: TIOCSWINSZ reads one Winsize from the pointer, which refers to
    // a live local; the fd is our open PTY master.
    let rc = unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &ws as *const Winsize) };
    if rc < 0 {
        eprintln!("stockade-init: cannot resize the terminal: {}", std::io::Error::last_os_error());
    }
}

/// The terminal's foreground process group: where a terminal delivers
/// signals, e.g. a job the shell put there.
pub fn foreground_group(master: &File) -> Option<Pid> {
    nix::unistd::tcgetpgrp(master).ok()
}
