//! The change port against a guest that forges the init's side by hand:
//! change sets without the token, with it, twice, and streams that differ
//! from what the init says it sent.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::*;
use crate::protocol::auth::{DigestWriter, Token};
use crate::protocol::change_set::{Base, RelPath, Writer};

fn change_set(path: &str, content: &[u8]) -> Vec<u8> {
    let mut w = Writer::new(Vec::new()).unwrap();
    let rel = RelPath::new(path.as_bytes()).unwrap();
    w.file(&rel, 0o644, content.len() as u64, &mut &content[..], &Base::Absent).unwrap();
    w.finish().unwrap().0
}

fn digest_of(stream: &[u8]) -> StreamDigest {
    let mut w = DigestWriter::new(Vec::new());
    w.write_all(stream).unwrap();
    w.finish().1
}

struct Rig {
    _dir: tempfile::TempDir,
    path: PathBuf,
    store: Store,
    token: Token,
    tampering: Tampering,
    receiver: Option<Receiver>,
}

fn rig() -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let session = dir.path().join("session");
    std::fs::create_dir(&session).unwrap();
    let store = Store::open(&session).unwrap();
    let path = dir.path().join("v.sock_1026");
    let listener = UnixListener::bind(&path).unwrap();
    let token = Token::from_bytes([0x5a; 32]);
    let tampering = Tampering::default();
    let receiver = receive(listener, path.clone(), &store, token.clone(), tampering.clone()).unwrap();
    Rig { _dir: dir, path, store, token, tampering, receiver: Some(receiver) }
}

impl Rig {
    /// A guest connection that sends `prefix` and `stream` and closes.
    fn send(&self, prefix: &[u8], stream: &[u8]) {
        let mut conn = UnixStream::connect(&self.path).unwrap();
        conn.write_all(prefix).unwrap();
        // A refused connection may be closed under us: what matters is what
        // the host made of it.
        let _ = conn.write_all(stream);
        let _ = conn.shutdown(std::net::Shutdown::Write);
        // Wait until the host is done with it (closes or takes it all).
        conn.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let _ = conn.read_to_end(&mut Vec::new());
    }

    /// As `send`, but leaves the stream open (the host holds it until the
    /// verdict).
    fn send_open(&self, prefix: &[u8], stream: &[u8]) -> UnixStream {
        let mut conn = UnixStream::connect(&self.path).unwrap();
        conn.write_all(prefix).unwrap();
        conn.write_all(stream).unwrap();
        conn.shutdown(std::net::Shutdown::Write).unwrap();
        conn
    }

    fn wait_reports(&self, n: usize) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let lines = self.tampering.lines();
            if lines.len() >= n || Instant::now() > deadline {
                return lines;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn staged_paths(&self) -> Vec<String> {
        self.store.entries().unwrap().into_iter().map(|e| e.entry.path.to_string()).collect()
    }
}

#[test]
fn a_forged_change_set_before_the_inits_is_refused_and_the_inits_is_staged() {
    let mut rig = rig();
    let forged = change_set("forged.txt", b"evil");
    rig.send(&[0u8; 32], &forged);
    let reports = rig.wait_reports(1);
    assert_eq!(reports.len(), 1, "{reports:?}");
    assert!(reports[0].contains("change port without this run's token was refused"), "{reports:?}");

    let real = change_set("made-by-the-command.txt", b"real work\n");
    let _init = rig.send_open(rig.token.as_bytes(), &real);
    let report = rig.receiver.take().unwrap().finish(digest_of(&real), EXPORT_STALL).unwrap();
    assert_eq!(report.summary.entries, 1);
    assert_eq!(rig.staged_paths(), ["made-by-the-command.txt"]);
}

/// Waits until the admission thread has handed on `n` token-bearing
/// connections (each is checked on a thread of its own, so the order of
/// two connections is only known once the first has been taken).
fn wait_taken(rig: &Rig, n: usize) -> Vec<Job> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut jobs = Vec::new();
    while jobs.len() < n {
        jobs.extend(rig.receiver.as_ref().unwrap().started.try_iter());
        assert!(Instant::now() < deadline, "only {} of {n} connections were admitted", jobs.len());
        std::thread::sleep(Duration::from_millis(5));
    }
    jobs
}

/// Puts jobs taken by `wait_taken` back where `finish` looks for them.
fn put_back(rig: &mut Rig, jobs: Vec<Job>) -> Receiver {
    let receiver = rig.receiver.take().unwrap();
    let (tx, rx) = mpsc::channel();
    for job in jobs {
        tx.send(job).unwrap();
    }
    drop(receiver.started);
    Receiver { started: rx, ..receiver }
}

#[test]
fn a_second_change_set_is_reported_and_the_inits_first_stays_staged() {
    let mut rig = rig();
    let real = change_set("made-by-the-command.txt", b"real work\n");
    let _init = rig.send_open(rig.token.as_bytes(), &real);
    let mut jobs = wait_taken(&rig, 1);
    let second = change_set("second.txt", b"sneaky");
    let _forger = rig.send_open(rig.token.as_bytes(), &second);
    jobs.extend(wait_taken(&rig, 1));
    let reports = rig.wait_reports(1);
    assert!(reports[0].contains("a second change connection with this run's token arrived"), "{reports:?}");

    let receiver = put_back(&mut rig, jobs);
    receiver.finish(digest_of(&real), EXPORT_STALL).unwrap();
    assert_eq!(rig.staged_paths(), ["made-by-the-command.txt"]);
    assert_eq!(rig.tampering.lines().len(), 1);
}

#[test]
fn a_stream_the_init_did_not_send_is_never_staged() {
    let mut rig = rig();
    // A guest that has the token (it read PID 1's memory) gets in first,
    // and the init's own connection never comes.
    let forged = change_set("forged.txt", b"evil");
    let _forger = rig.send_open(rig.token.as_bytes(), &forged);
    let real = change_set("made-by-the-command.txt", b"real work\n");
    let err = rig.receiver.take().unwrap().finish(digest_of(&real), EXPORT_STALL).unwrap_err();
    let text = format!("{err:#}");
    assert!(text.contains("not the one the guest init sent"), "{text}");
    assert!(!rig.store.is_staged(), "nothing is staged");
    let reports = rig.tampering.lines();
    assert_eq!(reports.len(), 1, "{reports:?}");
    assert!(reports[0].contains(&format!("the init sent {} bytes", real.len())), "{reports:?}");
}

#[test]
fn a_forger_with_the_token_ahead_of_the_init_does_not_make_the_inits_changes_vanish() {
    // Guest root read the token from PID 1 and connected first; the init's
    // own connection comes second. Once with the forger's stream complete,
    // once with it held open (stalled) after a few bytes.
    for stall in [false, true] {
        let mut rig = rig();
        let forged = change_set("forged.txt", b"evil");
        let _forger = if stall {
            let mut conn = UnixStream::connect(&rig.path).unwrap();
            conn.write_all(rig.token.as_bytes()).unwrap();
            conn.write_all(&forged[..8]).unwrap();
            conn
        } else {
            rig.send_open(rig.token.as_bytes(), &forged)
        };
        let mut jobs = wait_taken(&rig, 1);
        assert!(matches!(jobs[0], Job::Live { .. }), "the forger's is the first");
        let real = change_set("made-by-the-command.txt", b"real work\n");
        let _init = rig.send_open(rig.token.as_bytes(), &real);
        jobs.extend(wait_taken(&rig, 1));
        let receiver = put_back(&mut rig, jobs);
        let started = Instant::now();
        let report = receiver.finish(digest_of(&real), EXPORT_STALL).unwrap();
        assert!(started.elapsed() < STALL_WAIT / 2, "a stalled forger holds nothing up (stall: {stall})");
        assert_eq!(report.summary.entries, 1);
        assert_eq!(rig.staged_paths(), ["made-by-the-command.txt"], "stall: {stall}");
        let reports = rig.wait_reports(2).join("\n");
        assert!(reports.contains("a second change connection with this run's token arrived"), "{reports}");
        if !stall {
            assert!(reports.contains("not the one the guest init sent"), "{reports}");
        }
        let blobs: Vec<_> = std::fs::read_dir(rig.store.dir()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert!(!blobs.iter().any(|n| n.to_string_lossy().starts_with("spool")), "no spool is left: {blobs:?}");
    }
}

/// Attack on a checkpoint: the guest says it sent its stream, then sends
/// the rest a byte at a time, each within the stall limit, for ever.
/// `finish` gives up after its limit in all, and stages nothing.
#[test]
fn a_stream_trickled_for_ever_is_given_up_after_the_limit() {
    let mut rig = rig();
    let real = change_set("made-by-the-command.txt", b"real work\n");
    let mut conn = UnixStream::connect(&rig.path).unwrap();
    conn.write_all(rig.token.as_bytes()).unwrap();
    conn.write_all(&real[..8]).unwrap();
    let trickler = std::thread::spawn(move || {
        for byte in real[8..].iter().cycle() {
            std::thread::sleep(Duration::from_millis(100));
            if conn.write_all(&[*byte]).is_err() {
                return;
            }
        }
    });
    let receiver = rig.receiver.take().unwrap();
    let err =
        receiver.finish(digest_of(&change_set("made-by-the-command.txt", b"real work\n")), Duration::from_secs(1));
    let err = format!("{:#}", err.unwrap_err());
    assert!(err.contains("was not received within 1s"), "{err}");
    assert!(!rig.store.is_staged(), "nothing is staged");
    trickler.join().unwrap();
}

#[test]
fn too_many_token_bearing_connections_are_refused_unread() {
    let rig = rig();
    let forged = change_set("forged.txt", b"evil");
    // The host closes the refused ones unread, so writing to them may fail.
    let _conns: Vec<_> = (0..MAX_SPOOLED + 3)
        .map(|_| {
            let mut conn = UnixStream::connect(&rig.path).unwrap();
            let _ = conn.write_all(rig.token.as_bytes()).and_then(|()| conn.write_all(&forged));
            conn
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let reports = rig.tampering.lines().join("\n");
        if reports.contains("the rest were refused unread") {
            break;
        }
        assert!(Instant::now() < deadline, "{reports}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_stream_cut_short_or_extended_does_not_match() {
    let real = change_set("a.txt", b"content\n");
    for sent in [&real[..real.len() - 1], &[real.as_slice(), b"x"].concat()[..]] {
        let mut rig = rig();
        let _init = rig.send_open(rig.token.as_bytes(), sent);
        assert!(rig.receiver.take().unwrap().finish(digest_of(&real), EXPORT_STALL).is_err());
        assert!(!rig.store.is_staged());
    }
}

#[test]
fn the_gate_holds_the_last_byte_until_the_verdict() {
    let (tx, rx) = mpsc::channel();
    let tampering = Tampering::default();
    let mut gate = DigestGate::new(&b"abcdef"[..], rx, tampering.clone());
    let mut buf = [0u8; 64];
    assert_eq!(gate.read(&mut buf).unwrap(), 5, "all but the last byte");
    assert_eq!(&buf[..5], b"abcde");
    tx.send(Verdict::Sent(digest_of(b"abcdef"))).unwrap();
    assert_eq!(gate.read(&mut buf).unwrap(), 1);
    assert_eq!(buf[0], b'f');
    assert_eq!(gate.read(&mut buf).unwrap(), 0);
    assert!(tampering.lines().is_empty());

    for verdict in [Some(Verdict::Failed), None] {
        let (tx, rx) = mpsc::channel();
        let mut gate = DigestGate::new(&b"abcdef"[..], rx, Tampering::default());
        match verdict {
            Some(v) => tx.send(v).unwrap(),
            None => drop(tx),
        }
        let mut all = Vec::new();
        assert!(gate.read_to_end(&mut all).is_err(), "{verdict:?}");
        assert_eq!(all, b"abcde", "the last byte never comes out");
    }
}

#[test]
fn an_abandoned_export_stages_nothing() {
    let mut rig = rig();
    let real = change_set("a.txt", b"content\n");
    let _init = rig.send_open(rig.token.as_bytes(), &real);
    let jobs = wait_taken(&rig, 1);
    let receiver = put_back(&mut rig, Vec::new());
    assert!(receiver.abandon().is_none(), "staging was stopped by the abandon, not before");
    let Some(Job::Live { handle, .. }) = jobs.into_iter().next() else { panic!("the first job is staged live") };
    assert!(handle.join().unwrap().is_err());
    assert!(!rig.store.is_staged());
}

/// Staging that stops before the stream ends (here a stream that is no
/// change set; in life the disk margin or a bound) closes the connection:
/// the init's export then fails and it says so, instead of the init
/// blocking on a stream no one reads while the host waits for its word
/// (how a 1 GiB recovery onto a too-small disk sat idle). The host's
/// cause comes back from `abandon`.
#[test]
fn staging_that_stops_early_closes_the_stream_and_names_why() {
    let mut rig = rig();
    let mut conn = UnixStream::connect(&rig.path).unwrap();
    conn.write_all(rig.token.as_bytes()).unwrap();
    let (done, written) = mpsc::channel();
    std::thread::spawn(move || {
        let junk = vec![0xa5u8; 1 << 20];
        let result = (0..256).try_for_each(|_| conn.write_all(&junk));
        let _ = done.send(result);
    });
    // A guard against hanging, not a measure: the writer is refused at once.
    let result = written.recv_timeout(Duration::from_secs(120)).expect("the guest's writes block: nothing reads them");
    assert!(result.is_err(), "256 MiB of junk was taken whole");
    let receiver = rig.receiver.take().unwrap();
    let why = format!("{:#}", receiver.abandon().expect("the host's reason"));
    assert!(why.contains("not a stockade change set"), "{why}");
    assert!(!rig.store.is_staged());
}
