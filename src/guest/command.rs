//! Running the command: as the host user, in its own process group, with
//! stdio on pipes pumped to and from the host. When it exits, everything else
//! it started is killed too, as when a container's main process ends.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use anyhow::Context;
use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::Pid;

use super::channel::{Control, Event};
use super::limits;
use super::spawn::{Session, Spawn};
use super::tty;
use crate::protocol::{ExitReport, GuestMsg, RunSpec, STDIN_PORT, write_frame};

/// The init's side of the command's stdio.
enum Io {
    /// The terminal's master: input, output and the window size.
    Terminal(File),
    Pipes {
        stdin: File,
        stdout: File,
        stderr: File,
    },
}

/// Output is forwarded in chunks of at most this size.
const CHUNK: usize = 64 * 1024;

pub fn run(spec: &RunSpec, control: &Control) -> anyhow::Result<ExitReport> {
    let Some(program) = spec.argv.first() else {
        return Ok(ExitReport::SetupFailed { message: "no command given".into() });
    };
    if !Path::new(&spec.cwd).is_dir() {
        return Ok(ExitReport::SetupFailed {
            message: format!("the working directory {} is not visible in the guest", spec.cwd),
        });
    }
    let stdin_conn = super::vsock::connect_with_token(STDIN_PORT, &spec.token)?;

    let group = match spec.pids {
        Some(max) => Some(limits::CommandGroup::with_pids_max(max)?),
        None => None,
    };
    let (io, stdio, session) = match spec.tty {
        Some(size) => {
            let (master, stdio) = tty::open(size)?.split()?;
            (Io::Terminal(master), stdio, Session::Terminal)
        }
        None => {
            let (stdin, stdin_w) = pipe().context("cannot create the command's stdin pipe")?;
            let (stdout_r, stdout) = pipe().context("cannot create the command's stdout pipe")?;
            let (stderr_r, stderr) = pipe().context("cannot create the command's stderr pipe")?;
            let io = Io::Pipes { stdin: stdin_w.into(), stdout: stdout_r.into(), stderr: stderr_r.into() };
            (io, [stdin, stdout, stderr], Session::Group)
        }
    };
    // The spawn owns the command's ends (and the terminal's slave side) and
    // closes them once the command has them, or its output never ends.
    let spawned = Spawn::new(&spec.argv, &spec.env, &spec.cwd, spec.uid, spec.gid, stdio)
        .and_then(|spawn| spawn.session(session).cgroup(group.as_ref().map(|g| g.procs())).spawn());
    let pid = match spawned {
        Ok(pid) => pid.as_raw(),
        Err(e) => return Ok(not_started(program, &e)),
    };

    let mut pumps = Vec::new();
    match io {
        Io::Terminal(master) => {
            let input = master.try_clone().context("cannot duplicate the terminal")?;
            feed_stdin(stdin_conn, input)?;
            pumps.push(pump("stdout", master.try_clone()?, control.writer(), GuestMsg::Stdout)?);
            control.start_reader(spec.token.clone(), move |event| match event {
                Event::Resize(size) => tty::resize(&master, size),
                Event::Signal(signal) => {
                    let group = tty::foreground_group(&master).map_or(-pid, |g| -g.as_raw());
                    send_signal(group, signal);
                }
            })?;
        }
        Io::Pipes { stdin, stdout, stderr } => {
            feed_stdin(stdin_conn, stdin)?;
            pumps.push(pump("stdout", stdout, control.writer(), GuestMsg::Stdout)?);
            pumps.push(pump("stderr", stderr, control.writer(), GuestMsg::Stderr)?);
            control.start_reader(spec.token.clone(), move |event| {
                if let Event::Signal(signal) = event {
                    send_signal(-pid, signal);
                }
            })?;
        }
    }

    let status = reap_until(pid);
    // The command is done: nothing it left behind may outlive it or hold
    // its output open.
    let _ = kill(Pid::from_raw(-1), Signal::SIGKILL);
    reap_until(-1);
    for pump in pumps {
        let _ = pump.join();
    }
    Ok(status)
}

/// A pipe whose ends close on exec: the command gets its end as stdio.
fn pipe() -> nix::Result<(OwnedFd, OwnedFd)> {
    nix::unistd::pipe2(OFlag::O_CLOEXEC)
}

fn send_signal(target: i32, signal: i32) {
    if let Ok(sig) = Signal::try_from(signal) {
        let _ = kill(Pid::from_raw(target), sig);
    }
}

/// Copies the host's stdin to the command until the host closes it.
fn feed_stdin(from: File, to: impl Write + Send + 'static) -> anyhow::Result<()> {
    spawn_named("stdin", move || {
        let mut from = from;
        let mut to = to;
        // Ends when the host closes stdin (EOF reaches the command) or the
        // command stops reading.
        let _ = std::io::copy(&mut from, &mut to);
    })?;
    Ok(())
}

fn spawn_named(name: &str, f: impl FnOnce() + Send + 'static) -> anyhow::Result<JoinHandle<()>> {
    std::thread::Builder::new().name(name.into()).spawn(f).with_context(|| format!("cannot start the {name} thread"))
}

/// Forwards a pipe to the host as frames until the pipe's writers are gone.
pub(super) fn pump(
    name: &str,
    mut from: impl Read + Send + 'static,
    to: Arc<Mutex<File>>,
    frame: fn(Vec<u8>) -> GuestMsg,
) -> anyhow::Result<JoinHandle<()>> {
    spawn_named(name, move || {
        let mut buf = vec![0u8; CHUNK];
        loop {
            // A PTY master reports EIO, not EOF, once the command side closes.
            let n = match from.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => return,
            };
            let mut w = to.lock().unwrap_or_else(|p| p.into_inner());
            if write_frame(&mut *w, &frame(buf[..n].to_vec())).is_err() || w.flush().is_err() {
                return;
            }
        }
    })
}

/// Reaps children until `pid` exits (or, with -1, until none are left), and
/// returns how `pid` ended. As PID 1 we also reap every orphan on the way.
fn reap_until(pid: i32) -> ExitReport {
    loop {
        match waitpid(Pid::from_raw(-1), None) {
            Ok(WaitStatus::Exited(p, code)) if p.as_raw() == pid => return ExitReport::Exited { code },
            Ok(WaitStatus::Signaled(p, sig, _)) if p.as_raw() == pid => {
                return ExitReport::Signaled { signal: sig as i32 };
            }
            Ok(_) | Err(Errno::EINTR) => {}
            Err(_) => return ExitReport::SetupFailed { message: "the command was never reaped".into() },
        }
    }
}

fn not_started(program: &str, err: &std::io::Error) -> ExitReport {
    let errno = err.raw_os_error().unwrap_or(0);
    if errno == libc::ENOENT {
        let message = if program.contains('/') {
            format!("{program}: no such file or directory")
        } else {
            format!("{program}: command not found")
        };
        ExitReport::NotStarted { not_found: true, message }
    } else {
        let reason = match errno {
            libc::EACCES => "permission denied".to_string(),
            libc::ENOEXEC => "exec format error".to_string(),
            _ => err.to_string(),
        };
        ExitReport::NotStarted { not_found: false, message: format!("{program}: {reason}") }
    }
}
