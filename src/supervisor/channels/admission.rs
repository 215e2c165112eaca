//! Which connections to the init's ports the host listens to, and what it
//! tells the user about the others (see `protocol::auth` for the design).
//!
//! Control: the first connection is PID 1's (no other guest process exists
//! yet); every later one is refused and reported. Stdin and changes: a
//! connection must start with this boot's token; one that does not is
//! refused and reported before anything it sends is used. Only a guest that
//! can read PID 1's memory has the token, so a second connection with it is
//! reported. On stdin the first is the init's and later ones are never
//! used; on the change port any of them may be the init's (guest root may
//! have got in first), so each is handed on and the init's own report of
//! what it sent decides (see `staging`). The VMM has already refused every
//! connection from an unprivileged guest port.

use std::collections::VecDeque;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;

use crate::protocol::auth::Token;

/// How long a connection may take to present its token. The init writes
/// it right after connecting; the margin is for the software-CPU rig.
const TOKEN_WAIT: Duration = Duration::from_secs(30);
/// Connections whose token is being read at once; past this the guest is
/// flooding us, and the one checked longest is dropped unread.
const MAX_CHECKING: usize = 16;
/// Distinct reports kept; repeats of one are counted, not listed.
const MAX_REPORTS: usize = 32;

/// What the guest did on the init's channels that the init never does: for
/// a warning at the end of the run, and a failing `--ci`.
#[derive(Clone, Default)]
pub struct Tampering(Arc<Mutex<Vec<(String, u64)>>>);

impl Tampering {
    pub fn report(&self, what: impl Into<String>) {
        let what = what.into();
        tracing::warn!("{what}");
        let mut reports = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, count)) = reports.iter_mut().find(|(w, _)| *w == what) {
            *count += 1;
        } else if reports.len() < MAX_REPORTS {
            reports.push((what, 1));
        }
    }

    /// One line per distinct report, repeats counted.
    pub fn lines(&self) -> Vec<String> {
        let reports = self.0.lock().unwrap_or_else(|p| p.into_inner());
        reports
            .iter()
            .map(|(what, count)| if *count > 1 { format!("{what} ({count} times)") } else { what.clone() })
            .collect()
    }
}

/// What to report of a connection the VMM refused on an init port: it
/// came from an unprivileged guest port, so not from the init. (The guest
/// port is left out so that repeats count as one report.)
pub fn refused_by_the_vmm(host_port: u32) -> String {
    let name = match host_port {
        crate::protocol::CONTROL_PORT => "control",
        crate::protocol::STDIN_PORT => "stdin",
        crate::protocol::CHANGES_PORT => "change",
        crate::protocol::PUBLISH_PORT => "publish",
        crate::protocol::CHECKPOINT_PORT => "checkpoint",
        _ => "init's",
    };
    format!(
        "a guest process that is not the init tried to connect to the {name} port from an unprivileged port; \
         the VMM refused it"
    )
}

/// The init's ports whose connections carry the token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    Stdin,
    Changes,
    /// Published ports' dial-backs: one per host client, all used.
    Publish,
}

impl Channel {
    fn name(self) -> &'static str {
        match self {
            Channel::Stdin => "stdin",
            Channel::Changes => "change",
            Channel::Publish => "publish",
        }
    }

    /// What to report of every token-bearing connection after the first.
    pub fn second(self) -> &'static str {
        match self {
            Channel::Stdin => {
                "a second stdin connection with this run's token was refused (only guest root can forge one)"
            }
            Channel::Changes => {
                "a second change connection with this run's token arrived (only guest root can forge one); \
                 only the change set the guest init says it sent is staged"
            }
            Channel::Publish => "a publish connection with this run's token arrived (only guest root can forge one)",
        }
    }
}

/// An accept loop; dropping it stops the loop.
pub struct Listening {
    stop: OwnedFd,
}

impl Drop for Listening {
    fn drop(&mut self) {
        let _ = nix::unistd::write(&self.stop, &[1]);
    }
}

/// Calls `on_ready` with `listener` on a thread of its own each time it is
/// readable (set it non-blocking), until the returned guard is dropped or
/// `on_ready` says to stop.
pub fn watch<L: AsFd + Send + 'static>(
    listener: L,
    name: &str,
    mut on_ready: impl FnMut(&L) -> Watching + Send + 'static,
) -> anyhow::Result<Listening> {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let (stop_rx, stop) = nix::unistd::pipe().context("cannot create a pipe")?;
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            loop {
                let mut fds =
                    [PollFd::new(listener.as_fd(), PollFlags::POLLIN), PollFd::new(stop_rx.as_fd(), PollFlags::POLLIN)];
                match poll(&mut fds, PollTimeout::NONE) {
                    Ok(_) => {}
                    Err(nix::errno::Errno::EINTR) => continue,
                    Err(_) => return,
                }
                // The guard went (its pipe end closed), or was written to.
                if fds[1].any().unwrap_or(true) || on_ready(&listener) == Watching::Stop {
                    return;
                }
            }
        })
        .with_context(|| format!("cannot start the {name} thread"))?;
    Ok(Listening { stop })
}

/// Whether a [`watch`] goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watching {
    Go,
    Stop,
}

/// Accepts connections on `listener` and hands each to `on_conn`, on a
/// thread of its own, until the returned guard is dropped.
fn accept_loop(
    listener: UnixListener,
    name: &str,
    mut on_conn: impl FnMut(UnixStream) + Send + 'static,
) -> anyhow::Result<Listening> {
    listener.set_nonblocking(true).context("cannot set up a guest listener")?;
    watch(listener, name, move |listener| match listener.accept() {
        Ok((stream, _)) => {
            if stream.set_nonblocking(false).is_ok() {
                on_conn(stream);
            }
            Watching::Go
        }
        Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted) => Watching::Go,
        Err(e) => {
            tracing::warn!("cannot accept a guest connection: {e}");
            Watching::Stop
        }
    })
}

/// After the init's control connection: refuses and reports every other.
pub fn refuse_further_control(listener: &UnixListener, tampering: Tampering) -> anyhow::Result<Listening> {
    let listener = listener.try_clone().context("cannot watch the control port")?;
    accept_loop(listener, "control-extra", move |stream| {
        tampering.report(
            "a second connection to the control port was refused: only the guest init's first one is used \
             (only guest root can open one)",
        );
        drop(stream);
    })
}

/// Hands the first connection on `listener` that presents `token` to
/// `first`; refuses and reports every other.
pub fn admit_first(
    listener: UnixListener,
    channel: Channel,
    token: Token,
    tampering: Tampering,
    first: impl FnOnce(UnixStream) + Send + 'static,
) -> anyhow::Result<Listening> {
    let first = Mutex::new(Some(first));
    let reports = tampering.clone();
    admit_each(listener, channel, token, tampering, move |stream, nth| {
        let taker = if nth == 0 { first.lock().unwrap_or_else(|p| p.into_inner()).take() } else { None };
        match taker {
            Some(take) => take(stream),
            None => reports.report(channel.second()),
        }
    })
}

/// Hands every connection on `listener` that presents `token` to `take`,
/// with its place among them (0 for the first); refuses and reports the
/// ones that do not. At most [`MAX_CHECKING`] are checked at once; past
/// that the guest is flooding the port, and the one checked longest is
/// dropped unread to make way: the init presents its token as it connects,
/// so silent connections cannot crowd it out.
pub fn admit_each(
    listener: UnixListener,
    channel: Channel,
    token: Token,
    tampering: Tampering,
    take: impl Fn(UnixStream, usize) + Send + Sync + 'static,
) -> anyhow::Result<Listening> {
    let take = Arc::new(take);
    let admitted = Arc::new(AtomicUsize::new(0));
    let checking = Arc::new(Checking::default());
    let name = format!("{}-admit", channel.name());
    accept_loop(listener, &name, move |stream| {
        let Some(id) = checking.start(&stream) else {
            return tracing::warn!("cannot duplicate a {} connection; it was dropped", channel.name());
        };
        if id.evicted {
            tampering.report(format!(
                "a flood of connections to the {} port: more than {MAX_CHECKING} at once, the longest silent were \
                 dropped unread",
                channel.name()
            ));
        }
        let (take, admitted, pending, token, tampering) =
            (take.clone(), admitted.clone(), checking.clone(), token.clone(), tampering.clone());
        let checked = std::thread::Builder::new().name("token-check".into()).spawn(move || {
            let presented = check(stream, channel, &token, &tampering);
            // One dropped meanwhile was shut down: not taken.
            if pending.end(id.n)
                && let Some(stream) = presented
            {
                take(stream, admitted.fetch_add(1, Ordering::SeqCst));
            }
        });
        if checked.is_err() {
            checking.end(id.n);
            tracing::warn!("cannot start a thread to check a {} connection; it was dropped", channel.name());
        }
    })
}

/// The connections whose token is being read, oldest first, each with a
/// handle to shut it down.
#[derive(Default)]
struct Checking(Mutex<(u64, VecDeque<(u64, UnixStream)>)>);

/// A connection [`Checking::start`] took on.
struct Started {
    n: u64,
    /// The oldest had to be dropped to make room.
    evicted: bool,
}

impl Checking {
    fn start(&self, stream: &UnixStream) -> Option<Started> {
        let handle = stream.try_clone().ok()?;
        let mut guard = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let (next, pending) = &mut *guard;
        let evicted = pending.len() >= MAX_CHECKING;
        if evicted && let Some((_, oldest)) = pending.pop_front() {
            let _ = oldest.shutdown(std::net::Shutdown::Both);
        }
        let n = *next;
        *next += 1;
        pending.push_back((n, handle));
        Some(Started { n, evicted })
    }

    /// The check of `n` ended; false if it had been dropped.
    fn end(&self, n: u64) -> bool {
        let mut guard = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let pending = &mut guard.1;
        let Some(at) = pending.iter().position(|(m, _)| *m == n) else { return false };
        pending.remove(at);
        true
    }
}

/// The connection, if it starts with the token; reported if it does not.
fn check(mut stream: UnixStream, channel: Channel, token: &Token, tampering: &Tampering) -> Option<UnixStream> {
    let presented = stream.set_read_timeout(Some(TOKEN_WAIT)).and_then(|()| token.check(&mut stream));
    match presented {
        Ok(true) => stream.set_read_timeout(None).is_ok().then_some(stream),
        Ok(false) => {
            tampering.report(format!(
                "a connection to the {} port without this run's token was refused: it did not come from the guest \
                 init",
                channel.name()
            ));
            None
        }
        Err(_) => {
            tampering.report(format!(
                "a connection to the {} port that never presented this run's token was refused: it did not come \
                 from the guest init",
                channel.name()
            ));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::sync::mpsc;

    use super::*;

    struct Port {
        _dir: tempfile::TempDir,
        path: std::path::PathBuf,
        listener: Option<UnixListener>,
    }

    fn port() -> Port {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.sock_1025");
        let listener = UnixListener::bind(&path).unwrap();
        Port { _dir: dir, path, listener: Some(listener) }
    }

    /// Waits (bounded) for `n` reports; the checks run on their own threads.
    fn wait_reports(tampering: &Tampering, n: usize) -> Vec<String> {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let lines = tampering.lines();
            let total: usize = lines.len();
            if total >= n || std::time::Instant::now() > deadline {
                return lines;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn only_the_first_connection_with_the_token_is_used() {
        let mut p = port();
        let token = Token::from_bytes([9; 32]);
        let tampering = Tampering::default();
        let (tx, rx) = mpsc::channel();
        let _guard = admit_first(p.listener.take().unwrap(), Channel::Stdin, token.clone(), tampering.clone(), {
            move |mut stream: UnixStream| {
                let mut rest = Vec::new();
                stream.read_to_end(&mut rest).unwrap();
                tx.send(rest).unwrap();
            }
        })
        .unwrap();

        // A forger without the token, then the init, then a second holder
        // of the token.
        let mut forged = UnixStream::connect(&p.path).unwrap();
        // The refusal may close the stream before the rest is written.
        let _ = forged.write_all(&[0u8; 32]).and_then(|()| forged.write_all(b"forged"));
        drop(forged);
        let reports = wait_reports(&tampering, 1);
        assert_eq!(reports.len(), 1, "{reports:?}");
        assert!(reports[0].contains("without this run's token was refused"), "{reports:?}");

        let mut init = UnixStream::connect(&p.path).unwrap();
        token.present(&mut init).unwrap();
        init.write_all(b"from the init").unwrap();
        drop(init);
        assert_eq!(rx.recv_timeout(Duration::from_secs(20)).unwrap(), b"from the init");

        let mut second = UnixStream::connect(&p.path).unwrap();
        let _ = token.present(&mut second).and_then(|()| second.write_all(b"second"));
        drop(second);
        let reports = wait_reports(&tampering, 2);
        assert!(reports[1].contains("a second stdin connection"), "{reports:?}");
        assert!(rx.try_recv().is_err(), "the second connection is never used");

        let silent = UnixStream::connect(&p.path).unwrap();
        drop(silent);
        let reports = wait_reports(&tampering, 3);
        assert!(reports[2].contains("never presented"), "{reports:?}");
    }

    #[test]
    fn further_control_connections_are_refused_and_reported() {
        let p = port();
        let listener = p.listener.as_ref().unwrap();
        let _init = UnixStream::connect(&p.path).unwrap();
        let (_init_accepted, _) = listener.accept().unwrap();
        let tampering = Tampering::default();
        let _guard = refuse_further_control(listener, tampering.clone()).unwrap();
        for _ in 0..3 {
            let mut extra = UnixStream::connect(&p.path).unwrap();
            let mut got = Vec::new();
            extra.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            // Refused: closed without a word.
            assert_eq!(extra.read_to_end(&mut got).unwrap(), 0);
        }
        let reports = wait_reports(&tampering, 1);
        assert_eq!(reports.len(), 1, "repeats are counted, not listed: {reports:?}");
        assert!(reports[0].contains("a second connection to the control port was refused"), "{reports:?}");
        assert!(reports[0].ends_with("(3 times)"), "{reports:?}");
    }

    #[test]
    fn a_dropped_guard_stops_listening() {
        let mut p = port();
        let guard = admit_first(
            p.listener.take().unwrap(),
            Channel::Changes,
            Token::from_bytes([1; 32]),
            Tampering::default(),
            |_| {},
        )
        .unwrap();
        drop(guard);
        // The loop ends and drops the listener: connecting fails once it has.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while UnixStream::connect(&p.path).is_ok() {
            assert!(std::time::Instant::now() < deadline, "still listening");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
