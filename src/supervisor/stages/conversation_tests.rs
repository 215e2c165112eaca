//! The relay against a fake init over real sockets: what it does with the
//! process's stdout, and how it ends when the guest's export stalls while
//! the init still heartbeats.

use std::io::BufReader;
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

use super::*;
use crate::protocol::auth::TOKEN_LEN;
use crate::supervisor::channels::fake_init;

/// A session with its change store and receiver, as a run opens them.
struct Rig {
    _tmp: tempfile::TempDir,
    session: session::Session,
    store: changes::Store,
    changes: PathBuf,
    token: Token,
}

fn rig() -> (Rig, staging::Receiver) {
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

/// Relays what `init` says until the conversation ends.
fn relay(relay: Relay<'_>, host: UnixStream) -> anyhow::Result<Conversation> {
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
            let relay = Relay::new(&rig.session, receiver, admission::Tampering::default(), checkpoints);
            super::tests::relay(relay, host)
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
