//! The change port against a guest that forges the init's side by hand:
//! change sets without the token, with it, twice, and streams that differ
//! from what the init says it sent.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::*;
use crate::changes::{Base, RelPath, Writer};
use crate::protocol::auth::{DigestWriter, Token};

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
    let report = rig.receiver.take().unwrap().finish(digest_of(&real)).unwrap();
    assert_eq!(report.summary.entries, 1);
    assert_eq!(rig.staged_paths(), ["made-by-the-command.txt"]);
}

#[test]
fn a_second_change_set_is_refused_and_the_first_stays_staged() {
    let mut rig = rig();
    let real = change_set("made-by-the-command.txt", b"real work\n");
    let _init = rig.send_open(rig.token.as_bytes(), &real);
    // The admission thread takes the init's first; wait for it to be
    // taken before the second arrives.
    let deadline = Instant::now() + Duration::from_secs(20);
    let job = loop {
        if let Ok(job) = rig.receiver.as_ref().unwrap().started.try_recv() {
            break job;
        }
        assert!(Instant::now() < deadline, "the init's connection was never admitted");
        std::thread::sleep(Duration::from_millis(5));
    };
    let second = change_set("second.txt", b"sneaky");
    rig.send(rig.token.as_bytes(), &second);
    let reports = rig.wait_reports(1);
    assert!(reports[0].contains("a second change set with this run's token was refused"), "{reports:?}");

    // Put the job back where finish looks for it.
    let receiver = rig.receiver.take().unwrap();
    let (tx, rx) = mpsc::channel();
    tx.send(job).unwrap();
    let receiver = Receiver { started: rx, ..receiver };
    receiver.finish(digest_of(&real)).unwrap();
    assert_eq!(rig.staged_paths(), ["made-by-the-command.txt"]);
    assert_eq!(rig.tampering.lines().len(), 1);
}

#[test]
fn a_stream_the_init_did_not_send_is_never_staged() {
    let mut rig = rig();
    // A guest that has the token (it read PID 1's memory) gets in first.
    let forged = change_set("forged.txt", b"evil");
    let _forger = rig.send_open(rig.token.as_bytes(), &forged);
    let real = change_set("made-by-the-command.txt", b"real work\n");
    let err = rig.receiver.take().unwrap().finish(digest_of(&real)).unwrap_err();
    let text = format!("{err:#}");
    assert!(text.contains("not the one the guest init sent"), "{text}");
    assert!(!rig.store.is_staged(), "nothing is staged");
    let reports = rig.tampering.lines();
    assert_eq!(reports.len(), 1, "{reports:?}");
    assert!(reports[0].contains(&format!("the init sent {} bytes", real.len())), "{reports:?}");
}

#[test]
fn a_stream_cut_short_or_extended_does_not_match() {
    let real = change_set("a.txt", b"content\n");
    for sent in [&real[..real.len() - 1], &[real.as_slice(), b"x"].concat()[..]] {
        let mut rig = rig();
        let _init = rig.send_open(rig.token.as_bytes(), sent);
        assert!(rig.receiver.take().unwrap().finish(digest_of(&real)).is_err());
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
    let deadline = Instant::now() + Duration::from_secs(20);
    let job = loop {
        if let Ok(job) = rig.receiver.as_ref().unwrap().started.try_recv() {
            break job;
        }
        assert!(Instant::now() < deadline, "the connection was never admitted");
        std::thread::sleep(Duration::from_millis(5));
    };
    rig.receiver.take().unwrap().abandon();
    assert!(job.handle.join().unwrap().is_err());
    assert!(!rig.store.is_staged());
}
