//! The relay against a fake init over real sockets: what it does with the
//! process's stdout, and how it ends when the guest's export stalls while
//! the init still heartbeats.

use std::io::{BufReader, Write};
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

use super::*;
use crate::protocol::auth::{DigestWriter, TOKEN_LEN};
use crate::protocol::change_set::{Base, RelPath, Writer};
use crate::supervisor::channels::fake_init;

/// A session with its change store and receiver, as a run opens them.
pub(super) struct Rig {
    _tmp: tempfile::TempDir,
    pub(super) session: session::Session,
    pub(super) store: changes::Store,
    pub(super) changes: PathBuf,
    pub(super) token: Token,
}

pub(super) fn rig() -> (Rig, staging::Receiver) {
    let tmp = tempfile::tempdir().unwrap();
    let session = session::Session::create(tmp.path()).unwrap();
    let store = changes::Store::open(&session.dir).unwrap();
    let changes = tmp.path().join("v.sock_changes");
    let listener = UnixListener::bind(&changes).unwrap();
    let token = Token::from_bytes([9; TOKEN_LEN]);
    let receiver =
        staging::receive(listener, changes.clone(), &store, token.clone(), admission::Tampering::default()).unwrap();
    (Rig { _tmp: tmp, session, store, changes, token }, receiver)
}

/// A run's watch, with the stall bound shrunk so that a stall test ends
/// soon; the slow export below takes several times as long.
pub(super) const RUN: ExportWatch = ExportWatch { stall: Duration::from_secs(1), due: false };

/// A change set of one file of `len` bytes.
pub(super) fn change_set(len: usize) -> Vec<u8> {
    let content: Vec<u8> = b"abcdefghijklmnopqrstuvwxyz".iter().copied().cycle().take(len).collect();
    let mut w = Writer::new(Vec::new()).unwrap();
    let rel = RelPath::new(b"made-by-the-command.txt").unwrap();
    w.file(&rel, 0o644, content.len() as u64, &mut &content[..], &Base::Absent).unwrap();
    w.finish().unwrap().0
}

/// Relays what the init says on `host` until the conversation ends.
pub(super) fn converse_with(relay: Relay<'_>, host: UnixStream) -> anyhow::Result<Conversation> {
    let mut reader = BufReader::new(host.try_clone().unwrap());
    relay.run(&mut reader, &Mutex::new(host), &signals::Interrupts::default())
}

/// `recover` and the progress meters print while a run's relay goes on (a
/// lock held for the whole run once stalled recoveries): another thread
/// must be able to write stdout meanwhile.
#[test]
fn other_threads_write_stdout_while_a_relay_runs() {
    let (rig, receiver) = rig();
    let (init, host) = fake_init::control(Duration::from_millis(20));
    let (checkpoints, _) = mpsc::sync_channel(1);
    std::thread::scope(|scope| {
        let relaying = scope.spawn(|| {
            let relay = Relay::new(&rig.session, receiver, admission::Tampering::default(), checkpoints, RUN);
            converse_with(relay, host)
        });
        assert!(init.send(&GuestMsg::Stdout(b"from the guest\n".to_vec())));
        // The relay takes its frames in order: once a heartbeat after the
        // output is read, the output was written.
        std::thread::sleep(Duration::from_millis(200));
        let (wrote, written) = mpsc::channel();
        std::thread::spawn(move || {
            drop(std::io::stdout().lock());
            let _ = wrote.send(());
        });
        // A bound only so that a regression fails instead of hanging.
        let free = written.recv_timeout(Duration::from_secs(30)).is_ok();
        assert!(init.send(&GuestMsg::Exit(ExitReport::Exited { code: 0 })));
        let ended = relaying.join().unwrap().unwrap();
        assert!(matches!(ended, Conversation::Ended { .. }));
        assert!(free, "stdout stayed locked while the relay ran");
    });
}

/// A guest (hostile root, or stuck) that heartbeats but stops its export
/// half-way: the run ends within the stall bound, as interrupted, with
/// nothing staged, so the scratch disk is kept for `stockade recover`.
#[test]
fn an_export_stopped_while_the_init_heartbeats_ends_the_run_interrupted() {
    let (rig, receiver) = rig();
    let (_init, host) = fake_init::control(Duration::from_millis(20));
    let set = change_set(64 * 1024);
    let mut export = fake_init::connect_changes(&rig.changes, &rig.token);
    export.write_all(&set[..set.len() / 2]).unwrap();
    let (checkpoints, _) = mpsc::sync_channel(1);
    let relay = Relay::new(&rig.session, receiver, admission::Tampering::default(), checkpoints, RUN);
    let ended = converse_with(relay, host).unwrap();
    let Conversation::Stalled { bound, received, exported } = ended else { panic!("not a stall") };
    assert_eq!((bound, exported), (RUN.stall, false));
    assert!(received > 0, "the first half came");
    let ended = Ended { result: Ok(Conversation::Stalled { bound, received, exported }), expired: Default::default() };
    assert!(ended.interrupted(), "the session counts as interrupted");
    assert!(!rig.store.is_staged());
    // The host closed the export it gave up on.
    export.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    assert_eq!(std::io::Read::read(&mut export, &mut [0u8; 1]).unwrap(), 0);
}

/// An export that trickles in slowly but steadily, over several times the
/// stall bound, is never cut off: it is staged whole.
#[test]
fn a_slow_export_that_still_progresses_is_staged() {
    let (rig, receiver) = rig();
    let (init, host) = fake_init::control(Duration::from_millis(20));
    let set = change_set(30 * 1024);
    let (changes, token) = (rig.changes.clone(), rig.token.clone());
    let guest = std::thread::spawn(move || {
        let mut out = DigestWriter::new(fake_init::connect_changes(&changes, &token));
        for chunk in set.chunks(1024) {
            out.write_all(chunk).unwrap();
            out.flush().unwrap();
            std::thread::sleep(Duration::from_millis(100));
        }
        let (conn, stream) = out.finish();
        conn.shutdown(std::net::Shutdown::Write).unwrap();
        let sent = ExportOutcome::Sent { entries: 1, files: 1, bytes: 30 * 1024, skipped: 0, stream };
        assert!(init.send(&GuestMsg::Changes(sent)));
        assert!(init.send(&GuestMsg::Exit(ExitReport::Exited { code: 0 })));
        conn
    });
    let (checkpoints, _) = mpsc::sync_channel(1);
    let relay = Relay::new(&rig.session, receiver, admission::Tampering::default(), checkpoints, RUN);
    let ended = converse_with(relay, host).unwrap();
    let Conversation::Ended { staged: Some(staged), .. } = ended else { panic!("the command's end was not relayed") };
    assert_eq!(staged.unwrap().summary.entries, 1);
    assert!(rig.store.is_staged());
    drop(guest.join().unwrap());
}

/// An init that reports its export but then never its command's end,
/// heartbeating on: the run ends all the same, its changes staged.
#[test]
fn an_end_never_reported_after_the_export_ends_the_run() {
    let (rig, receiver) = rig();
    let (init, host) = fake_init::control(Duration::from_millis(20));
    let set = change_set(1024);
    let mut out = DigestWriter::new(fake_init::connect_changes(&rig.changes, &rig.token));
    out.write_all(&set).unwrap();
    let (conn, stream) = out.finish();
    conn.shutdown(std::net::Shutdown::Write).unwrap();
    let sent = ExportOutcome::Sent { entries: 1, files: 1, bytes: 1024, skipped: 0, stream };
    assert!(init.send(&GuestMsg::Changes(sent)));
    let (checkpoints, _) = mpsc::sync_channel(1);
    let relay = Relay::new(&rig.session, receiver, admission::Tampering::default(), checkpoints, RUN);
    let ended = converse_with(relay, host).unwrap();
    assert!(matches!(ended, Conversation::Stalled { exported: true, .. }));
    assert!(rig.store.is_staged(), "what was exported stays staged");
}

/// A recovery runs nothing but the export, so it is due from the start: a
/// recovery guest that heartbeats but never exports ends within the bound,
/// with nothing staged.
#[test]
fn a_recovery_whose_export_never_comes_ends_within_the_bound() {
    let (rig, receiver) = rig();
    let (_init, host) = fake_init::control(Duration::from_millis(20));
    let (checkpoints, _) = mpsc::sync_channel(1);
    let recovery = ExportWatch { due: true, ..RUN };
    let relay = Relay::new(&rig.session, receiver, admission::Tampering::default(), checkpoints, recovery);
    let ended = converse_with(relay, host).unwrap();
    assert!(matches!(ended, Conversation::Stalled { received: 0, exported: false, .. }));
    assert!(!rig.store.is_staged());
}
