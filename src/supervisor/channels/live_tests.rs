//! The supervisor's side of a checkpoint, with a thread playing the init:
//! the answer comes through the usual gate into the checkpoint store, and a
//! checkpoint the init does not vouch for is never staged.

use std::io::{BufReader, Write};
use std::os::unix::net::UnixStream;
use std::sync::mpsc::SyncSender;

use super::*;
use crate::protocol::auth::DigestWriter;
use crate::protocol::change_set::{Base, RelPath, Writer};
use crate::protocol::read_frame;

struct Fx {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    _server: Server,
    guest: UnixStream,
    answers: SyncSender<CheckpointOutcome>,
    token: Token,
}

fn fx() -> Fx {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("s");
    fs::create_dir(&dir).unwrap();
    Store::open(&dir).unwrap();
    let (host, guest) = UnixStream::pair().unwrap();
    let token = Token::from_bytes([7; crate::protocol::auth::TOKEN_LEN]);
    let (answers, answered) = mpsc::sync_channel(4);
    let served = Guest {
        writer: Arc::new(Mutex::new(host)),
        token: token.clone(),
        tampering: admission::Tampering::default(),
        answers: answered,
        stall: staging::EXPORT_STALL,
    };
    let server = serve(&dir, served).unwrap();
    Fx { dir, _server: server, guest, answers, token, _tmp: tmp }
}

/// Plays the init for one request: exports `new.txt` and reports the
/// digest of what it sent, or of something else when `lie`.
fn init_answers(f: &Fx, lie: bool) -> std::thread::JoinHandle<()> {
    let (guest, answers, token) = (f.guest.try_clone().unwrap(), f.answers.clone(), f.token.clone());
    let socket = crate::protocol::broker::socket_path(&f.dir.join("v.sock"), CHECKPOINT_PORT);
    std::thread::spawn(move || {
        let HostMsg::Checkpoint { id } = read_frame(&mut BufReader::new(guest)).unwrap() else {
            panic!("expected a checkpoint request")
        };
        let mut conn = UnixStream::connect(&socket).unwrap();
        token.present(&mut conn).unwrap();
        let mut w = Writer::new(DigestWriter::new(conn)).unwrap();
        let path = RelPath::new(b"new.txt").unwrap();
        w.file(&path, 0o644, 3, &mut &b"new"[..], &Base::Absent).unwrap();
        let (out, _) = w.finish().unwrap();
        let (mut conn, mut stream) = out.finish();
        conn.flush().unwrap();
        conn.shutdown(std::net::Shutdown::Write).unwrap();
        if lie {
            stream.bytes += 1;
        }
        let outcome = ExportOutcome::Sent { entries: 1, files: 1, bytes: 3, skipped: 0, stream };
        answers.send(CheckpointOutcome { id, outcome }).unwrap();
    })
}

#[test]
fn a_checkpoint_is_staged_and_held_while_it_is_read() {
    let f = fx();
    let mode = fs::metadata(f.dir.join(SOCKET)).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "only the owner may ask");
    let init = init_answers(&f, false);
    let reading = ask(&f.dir).unwrap().expect("the session serves checkpoints");
    init.join().unwrap();
    let entries = reading.store.entries().unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].entry.path.to_string(), "new.txt");
    // Another asker while this one reads: refused, not swapped under it.
    let err = ask(&f.dir).map(|_| ()).unwrap_err();
    assert!(format!("{err:#}").contains("another stockade diff or apply is reading"), "{err:#}");
    drop(reading);
}

#[test]
fn a_checkpoint_the_init_does_not_vouch_for_is_not_staged() {
    let f = fx();
    let init = init_answers(&f, true);
    let err = ask(&f.dir).map(|_| ()).unwrap_err();
    init.join().unwrap();
    assert!(format!("{err:#}").contains("no checkpoint of the running session"), "{err:#}");
    assert!(!f.dir.join(CHECKPOINT_DIR).join("changes/manifest").exists());
    assert!(!f.dir.join(NEXT).exists(), "a checkpoint that stopped leaves nothing behind");
}

#[test]
fn no_one_listening_means_not_running() {
    let tmp = tempfile::tempdir().unwrap();
    assert!(ask(tmp.path()).unwrap().is_none());
}

#[test]
fn a_run_that_ends_during_a_checkpoint_says_its_disk_is_kept() {
    let Fx { _tmp, dir, _server, guest, answers, token: _ } = fx();
    // The conversation is over: nobody relays the init's answers any more.
    drop(answers);
    let err = ask(&dir).map(|_| ()).unwrap_err();
    drop(guest);
    let err = format!("{err:#}");
    assert!(err.contains("the run ended during the checkpoint") && err.contains("stockade recover"), "{err}");
}

#[test]
fn checkpoints_a_killed_supervisor_left_are_removed_unless_being_read() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    for stale in [CHECKPOINT_DIR, NEXT] {
        fs::create_dir_all(dir.join(stale).join("changes")).unwrap();
        fs::write(dir.join(stale).join("changes/blob"), b"as big as the changes").unwrap();
    }
    let reading = lock(dir, FlockArg::LockShared).unwrap();
    remove_checkpoints(dir);
    assert!(dir.join(CHECKPOINT_DIR).exists(), "a checkpoint being read stays");
    drop(reading);
    remove_checkpoints(dir);
    assert!(!dir.join(CHECKPOINT_DIR).exists() && !dir.join(NEXT).exists());
}
