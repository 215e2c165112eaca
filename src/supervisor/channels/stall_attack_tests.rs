//! Attacks on how long the host waits for the guest's changes. A guest
//! that reports its export (or checkpoint) sent and then trickles the rest
//! of its stream, a byte now and then, each well within the per-read
//! limit: the run, or the checkpoint, must still end, with nothing staged,
//! however large a size the guest declared. Bounds are shrunk as in the
//! conversation's own tests.

use std::io::{BufReader, Write};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use super::tests::{RUN, change_set, converse_with, rig};
use super::*;
use crate::protocol::auth::{DigestWriter, StreamDigest, TOKEN_LEN};
use crate::protocol::{CHECKPOINT_PORT, CheckpointOutcome, read_frame, write_frame};
use crate::supervisor::channels::fake_init;

/// Only so that a regression fails instead of hanging: the bounds under
/// test are a second.
const GUARD: Duration = Duration::from_secs(90);

fn digest_of(stream: &[u8]) -> StreamDigest {
    let mut w = DigestWriter::new(Vec::new());
    w.write_all(stream).unwrap();
    w.finish().1
}

/// Sends `rest` on `conn` a byte every 20 ms, until the host closes it.
fn trickle(mut conn: UnixStream, rest: Vec<u8>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for byte in rest {
            std::thread::sleep(Duration::from_millis(20));
            if conn.write_all(&[byte]).is_err() {
                return;
            }
        }
    })
}

/// The final export: the init (or guest root with its token) reports the
/// stream sent, with its true digest, then trickles the rest of it. Before,
/// the relay waited on it with no bound at all: without `--timeout` the run
/// never ended. Now the rest of the stream gets the run's bound in all; the
/// run ends with nothing staged, and the scratch disk is kept.
#[test]
fn an_export_trickled_after_its_report_does_not_hold_the_run() {
    for declared in [None, Some(u64::MAX)] {
        let (rig, receiver) = rig();
        let (init, host) = fake_init::control(Duration::from_millis(20));
        let set = change_set(1 << 20);
        let mut stream = digest_of(&set);
        if let Some(bytes) = declared {
            stream.bytes = bytes;
        }
        let mut conn = fake_init::connect_changes(&rig.changes, &rig.token);
        conn.write_all(&set[..set.len() / 2]).unwrap();
        let trickler = trickle(conn, set[set.len() / 2..].to_vec());
        let sent = ExportOutcome::Sent { entries: 1, files: 1, bytes: 1 << 20, skipped: 0, stream };
        assert!(init.send(&GuestMsg::Changes(sent)));
        assert!(init.send(&GuestMsg::Exit(ExitReport::Exited { code: 0 })));
        let (done, ended) = mpsc::channel();
        std::thread::spawn(move || {
            let (checkpoints, _) = mpsc::sync_channel(1);
            let relay = Relay::new(&rig.session, receiver, admission::Tampering::default(), checkpoints, RUN);
            let ended = converse_with(relay, host);
            let _ = done.send((ended, rig.store.is_staged()));
        });
        let (ended, staged) = ended.recv_timeout(GUARD).expect("the run never ended");
        let ended = Ended { result: ended, expired: Default::default() };
        let Ok(Conversation::Ended { staged: Some(Err(e)), .. }) = &ended.result else {
            panic!("not an end with a failed staging ({declared:?})")
        };
        let text = format!("{e:#}");
        assert!(text.contains("was not received within"), "{text}");
        assert!(ended.unstaged(), "the scratch disk is kept");
        assert!(!staged, "nothing is staged");
        trickler.join().unwrap();
    }
}

/// A checkpoint: the guest reports it sent, declaring the largest size
/// there is, then trickles the rest. Before, the rest of the stream got a
/// minute and a second per 8 MiB declared, some 70,000 years: the live
/// thread, and the checkpoint lock that `stockade apply` waits on, were
/// held for the rest of the run. Now the declared size buys no more than
/// the run's stall bound.
#[test]
fn a_checkpoint_declaring_a_huge_stream_and_trickling_it_is_cut_off() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("session");
    std::fs::create_dir(&dir).unwrap();
    changes::Store::open(&dir).unwrap();
    let (host, guest) = UnixStream::pair().unwrap();
    let token = Token::from_bytes([7; TOKEN_LEN]);
    let (answered, answers) = mpsc::sync_channel(4);
    let served = live::Guest {
        writer: Arc::new(Mutex::new(host)),
        token: token.clone(),
        tampering: Default::default(),
        answers,
        stall: RUN.stall,
    };
    let _server = live::serve(&dir, served).unwrap();
    let socket = crate::protocol::broker::socket_path(&dir.join("v.sock"), CHECKPOINT_PORT);
    std::thread::spawn(move || {
        let mut requests = BufReader::new(guest);
        let Ok(HostMsg::Checkpoint { id }) = read_frame(&mut requests) else { return };
        let set = change_set(1 << 20);
        let mut conn = fake_init::connect_changes(&socket, &token);
        conn.write_all(&set[..set.len() / 2]).unwrap();
        let stream = StreamDigest { bytes: u64::MAX, ..digest_of(&set) };
        let outcome = ExportOutcome::Sent { entries: 1, files: 1, bytes: 1 << 20, skipped: 0, stream };
        answered.send(CheckpointOutcome { id, outcome }).unwrap();
        trickle(conn, set[set.len() / 2..].to_vec()).join().unwrap();
        // Held until the test ends, as a live init holds it.
        drop(requests);
    });
    let (done, asked) = mpsc::channel();
    let asking = dir.clone();
    std::thread::spawn(move || {
        let _ = done.send(live::ask(&asking).map(|reading| reading.is_some()));
    });
    let asked = asked.recv_timeout(GUARD).expect("the checkpoint was never given up");
    let text = format!("{:#}", asked.unwrap_err());
    assert!(text.contains("was not received within"), "{text}");
    assert!(!dir.join(crate::changes::landed::CHECKPOINT_DIR).exists(), "no checkpoint replaced the last");
}

/// A session's store and the host's receiver listening on its change
/// port (a Unix socket at the returned path) for `token`.
fn change_port(
    tampering: admission::Tampering,
) -> (tempfile::TempDir, changes::Store, std::path::PathBuf, Token, staging::Receiver) {
    let tmp = tempfile::tempdir().unwrap();
    let session = session::Session::create(tmp.path()).unwrap();
    let store = changes::Store::open(&session.dir).unwrap();
    let path = tmp.path().join("v.sock_changes");
    let listener = UnixListener::bind(&path).unwrap();
    let token = Token::from_bytes([9; TOKEN_LEN]);
    let receiver = staging::receive(listener, path.clone(), &store, token.clone(), tampering).unwrap();
    (tmp, store, path, token, receiver)
}

/// Guest root without the token (a `--docker` container can bind a
/// privileged vsock port) opens as many change connections as the host
/// checks at once and says nothing on them. Before, the init's own change
/// connection, arriving next, was refused unread as part of the flood: its
/// export failed. Now the flood's longest-silent connection makes way.
#[test]
fn silent_connections_do_not_crowd_out_the_inits_export() {
    let tampering = admission::Tampering::default();
    let (_tmp, store, path, token, receiver) = change_port(tampering.clone());
    let _silent: Vec<UnixStream> = (0..64).map(|_| UnixStream::connect(&path).unwrap()).collect();
    let set = change_set(4096);
    let mut init = fake_init::connect_changes(&path, &token);
    init.write_all(&set).unwrap();
    init.shutdown(std::net::Shutdown::Write).unwrap();
    let report = receiver.finish(digest_of(&set), Duration::from_secs(10)).expect("the init's export was crowded out");
    assert_eq!(report.summary.entries, 1);
    assert!(store.is_staged());
    let reports = tampering.lines().join("\n");
    assert!(reports.contains("a flood of connections to the change port"), "{reports}");
}

/// Guest root with the token starts a change connection but presents the
/// token's last byte only once the host is done with the export (or a
/// checkpoint): here once it gave up on the init's connection, and once
/// after it staged it. Before, the connection was taken on all the same,
/// by a staging or spooling thread that nothing would stop, reading it
/// without a time limit into the store (or an unnamed file up to the disk
/// margin): one more thread, descriptor and file per checkpoint, for the
/// rest of the run. Now it is closed as it is taken on.
#[test]
fn a_connection_admitted_after_the_export_ended_is_closed_at_once() {
    for init_first in [false, true] {
        let (_tmp, _store, path, token, receiver) = change_port(admission::Tampering::default());
        let set = change_set(4096);
        let mut late = UnixStream::connect(&path).unwrap();
        late.write_all(&token.as_bytes()[..TOKEN_LEN - 1]).unwrap();
        let finished = if init_first {
            let mut init = fake_init::connect_changes(&path, &token);
            init.write_all(&set).unwrap();
            init.shutdown(std::net::Shutdown::Write).unwrap();
            receiver.finish(digest_of(&set), Duration::from_secs(10))
        } else {
            receiver.finish(digest_of(&set), Duration::from_secs(1))
        };
        assert_eq!(finished.is_ok(), init_first, "{finished:?}");
        late.write_all(&token.as_bytes()[TOKEN_LEN - 1..]).unwrap();
        // The host may close it before this is written.
        let _ = late.write_all(&set[..set.len() / 2]);
        late.set_read_timeout(Some(GUARD / 4)).unwrap();
        let read = std::io::Read::read(&mut late, &mut [0u8; 1]);
        let held = matches!(&read, Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut));
        assert!(!held, "the late connection is still held open (init first: {init_first})");
        assert!(!matches!(read, Ok(n) if n > 0), "the host wrote to it");
    }
}

/// The bounds are for the guest's silence, not the host's work: the host
/// hashes a long hole as zeros, reading nothing meanwhile, while the guest
/// waits to send the rest. Before, that time counted as the guest's stall:
/// a 64 GiB sparse file takes minutes to hash on a CPU without SHA
/// extensions, so such an export ended the run as stalled, and every
/// recovery of it the same way. Here the bound is shrunk to 300 ms, well
/// below the hashing of the test's hole. What the host may spend so is
/// bounded by the change set's own limits.
#[test]
fn a_long_hole_the_host_hashes_is_not_taken_for_a_stall() {
    use crate::protocol::change_set::{Base, RelPath, Writer};
    const HOLE: u64 = 64 << 20;
    let (rig, receiver) = rig();
    let (init, host) = fake_init::control(Duration::from_millis(20));
    let sparse = tempfile::tempfile().unwrap();
    sparse.set_len(HOLE).unwrap();
    let mut w = Writer::new(Vec::new()).unwrap();
    w.sparse_file(&RelPath::new(b"disk.img").unwrap(), 0o644, HOLE, &sparse, &Base::Absent).unwrap();
    // More than the connection holds, so the guest waits on the host.
    let content: Vec<u8> = (0..8u32 << 20).map(|i| (i % 251) as u8 + 1).collect();
    let data = RelPath::new(b"data.bin").unwrap();
    w.file(&data, 0o644, content.len() as u64, &mut &content[..], &Base::Absent).unwrap();
    let set = w.finish().unwrap().0;
    let (changes, token) = (rig.changes.clone(), rig.token.clone());
    let guest = std::thread::spawn(move || {
        let mut conn = fake_init::connect_changes(&changes, &token);
        conn.write_all(&set).unwrap();
        conn.shutdown(std::net::Shutdown::Write).unwrap();
        let bytes = HOLE + content.len() as u64;
        let sent = ExportOutcome::Sent { entries: 2, files: 2, bytes, skipped: 0, stream: digest_of(&set) };
        assert!(init.send(&GuestMsg::Changes(sent)));
        assert!(init.send(&GuestMsg::Exit(ExitReport::Exited { code: 0 })));
        conn
    });
    let (checkpoints, _) = mpsc::sync_channel(1);
    let quick = ExportWatch { stall: Duration::from_millis(300), due: false };
    let relay = Relay::new(&rig.session, receiver, admission::Tampering::default(), checkpoints, quick);
    let ended = converse_with(relay, host).unwrap();
    let staged = match ended {
        Conversation::Ended { staged: Some(staged), .. } => staged,
        Conversation::Stalled { received, .. } => panic!("taken for a stall, {received} bytes in"),
        _ => panic!("the command's end was not relayed"),
    };
    assert_eq!(staged.unwrap().summary.files, 2);
    assert!(rig.store.is_staged());
    drop(guest.join().unwrap());
}

/// Guest root stops the init's thread that reads the control connection
/// (ptrace), and the host has written enough to it to fill it (a page the
/// guest serves on a published port makes the host's browser open
/// thousands of connections, each a dial-back request). Before, `--timeout`
/// then sent its SIGTERM on that connection from its own thread, which
/// blocked there for good: the VM was never stopped. Now the signals go
/// from threads of their own and the VM is stopped at the deadline's end
/// all the same (after its two 10 s graces).
#[test]
fn a_full_control_connection_does_not_hold_off_the_timeout() {
    let (host, _guest) = UnixStream::pair().unwrap();
    host.set_nonblocking(true).unwrap();
    let frame = HostMsg::Connect { id: 1, port: 8080 };
    while write_frame(&mut &host, &frame).is_ok() {}
    host.set_nonblocking(false).unwrap();
    let writer = Arc::new(Mutex::new(host));
    let mut vmm = std::process::Command::new("sleep").arg("300").spawn().unwrap();
    let pid = nix::unistd::Pid::from_raw(i32::try_from(vmm.id()).unwrap());
    let watch = Watch {
        interrupts: Arc::default(),
        timeout: Some(Duration::from_millis(100)),
        expired: deadline::Expired::default(),
    };
    let _deadline = watch_deadline(&writer, pid, &watch).unwrap();
    let (done, stopped) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(vmm.wait());
    });
    let status = stopped.recv_timeout(GUARD).expect("the VM was never stopped").unwrap();
    assert!(!status.success(), "{status}");
    assert!(watch.expired.get());
}
