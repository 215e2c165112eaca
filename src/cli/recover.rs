//! `stockade recover`: stage the changes an interrupted session left on its
//! scratch disk.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Args;

use crate::review::{self, ApplyMode, CodeChoice};
use crate::session::{self, SessionInfo};
use crate::supervisor::recover::{self, RecoverConfig};

use super::Global;
use super::sessions::Here;
use super::settings::Settings;

/// Stage the changes of a session that was interrupted
///
/// A run whose supervisor was killed, whose guest crashed, rebooted,
/// powered off or hung, or whose host went down, keeps the guest's changes
/// on its scratch disk (`stockade sessions` says "interrupted"). This boots
/// a VM on that disk, with the workspace beneath it as in the run, and
/// stages what the guest had changed, checked as after any run; then
/// `stockade diff` and `stockade apply` work as always. Nothing runs in the
/// VM and it has no network.
///
/// SESSION is an id or a unique prefix of one; without it, the newest
/// interrupted session of the workspace you are in (only of that one: an
/// interrupted session of another workspace is named, not taken), or of
/// any when you are in none.
#[derive(Debug, Args)]
pub struct RecoverArgs {
    /// Session id or unique prefix (default: the newest interrupted one of
    /// this workspace; outside every workspace, of any).
    #[arg(value_name = "SESSION")]
    session: Option<OsString>,

    /// Run the VMM without its Landlock and seccomp jail, as `run
    /// --no-jail`.
    #[arg(long)]
    no_jail: bool,

    /// Boot this guest kernel (a PVH vmlinux) instead of the installed one.
    #[arg(long, value_name = "PATH")]
    kernel: Option<PathBuf>,
}

pub fn run(args: RecoverArgs, global: Global) -> anyhow::Result<ExitCode> {
    Here::with_process(global, |here| {
        let info = choose(&here.data, args.session.as_ref(), &here.cwd)?;
        let settings = Settings::load()?;
        let config =
            RecoverConfig { memory_bytes: settings.memory.value.bytes, jail: !args.no_jail, kernel: args.kernel };
        writeln!(here.err, "stockade: recovering the changes of session {} from its scratch disk", info.id)?;
        let started = std::time::Instant::now();
        let recovered = recover::recover(&info, &config)?;
        tracing::info!("recovered session {} in {:.1?}", recovered.id, started.elapsed());
        writeln!(
            here.err,
            "stockade: session {} recovered in {:.1}s; its changes are staged",
            recovered.id,
            started.elapsed().as_secs_f64()
        )?;
        review::after_run(
            &recovered.store,
            &recovered.workspace,
            &recovered.id,
            ApplyMode::None,
            here.color,
            &CodeChoice::default(),
        )?;
        Ok(ExitCode::SUCCESS)
    })
}

/// The named session; or, inside a workspace (the deepest one some session
/// ran in that holds `cwd`), the newest interrupted session of that
/// workspace and never another's; or, outside every workspace, the newest
/// interrupted session of any.
fn choose(data: &Path, given: Option<&OsString>, cwd: &Path) -> anyhow::Result<SessionInfo> {
    let sessions = session::list(data)?;
    if let Some(given) = given {
        let given = given.to_str().context("the session id is not valid UTF-8")?;
        return Ok(session::find(&sessions, given)?.clone());
    }
    let interrupted: Vec<&SessionInfo> = sessions.iter().filter(|s| session::is_interrupted(&s.dir)).collect();
    let workspace = sessions
        .iter()
        .filter_map(SessionInfo::workspace)
        .filter(|w| cwd.starts_with(w))
        .max_by_key(|w| w.components().count());
    let Some(workspace) = workspace else {
        return match interrupted.first() {
            Some(info) => Ok((*info).clone()),
            None => bail!("{}", nothing_to_recover(&sessions)),
        };
    };
    if let Some(info) = interrupted.iter().find(|s| s.workspace().as_deref() == Some(workspace.as_path())) {
        return Ok((*info).clone());
    }
    if interrupted.is_empty() {
        bail!("{}", nothing_to_recover(&sessions));
    }
    let others: Vec<String> = interrupted
        .iter()
        .map(|s| {
            let place = s.workspace().map_or_else(|| "an unknown workspace".into(), |w| w.display().to_string());
            format!("  {} (in {place})", s.id)
        })
        .collect();
    bail!(
        "no session of the workspace {} waits to be recovered; interrupted sessions of other workspaces:\n{}\n\
         recover one by its id: `stockade recover ID` (or run `stockade recover` in its workspace)",
        workspace.display(),
        others.join("\n")
    )
}

fn nothing_to_recover(sessions: &[SessionInfo]) -> &'static str {
    if sessions.iter().any(|s| session::is_running(&s.dir)) {
        "no session waits to be recovered; a running session stages its changes when it ends \
         (`stockade sessions` lists them)"
    } else {
        "no session waits to be recovered: none was interrupted with changes on its scratch disk"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session_dir(data: &Path, id: &str, workspace: &str, disk: bool) {
        let dir = session::sessions_dir(data).join(id);
        std::fs::create_dir_all(&dir).unwrap();
        let record = session::RunRecord {
            id: id.into(),
            command: vec!["agent".into()],
            workspace: workspace.into(),
            started: "2025-03-01T10:15:00Z".into(),
            duration_ms: None,
            status: None,
            outcome: None,
            agent_settings: None,
            git_head: None,
        };
        std::fs::write(dir.join("run.json"), serde_json::to_vec(&record).unwrap()).unwrap();
        if disk {
            std::fs::write(dir.join(session::SCRATCH_DISK), b"").unwrap();
        }
    }

    #[test]
    fn picks_the_newest_interrupted_session_of_this_workspace_first() {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path();
        let err = choose(data, None, Path::new("/w")).unwrap_err().to_string();
        assert!(err.contains("no session waits to be recovered"), "{err}");
        session_dir(data, "20250301-101500-aaaa", "/w", true);
        session_dir(data, "20250301-101600-bbbb", "/w", false);
        session_dir(data, "20250301-101700-cccc", "/other", true);
        assert_eq!(choose(data, None, Path::new("/w/src")).unwrap().id, "20250301-101500-aaaa");
        assert_eq!(choose(data, None, Path::new("/elsewhere")).unwrap().id, "20250301-101700-cccc");
        let named = OsString::from("20250301-1016");
        assert_eq!(choose(data, Some(&named), Path::new("/w")).unwrap().id, "20250301-101600-bbbb");
    }

    /// Inside a workspace whose sessions have nothing to recover, `recover`
    /// without SESSION does not take another workspace's interrupted
    /// session (which would boot a VM over that workspace and review its
    /// changes as this one's): it names it and the command that recovers it.
    #[test]
    fn inside_a_workspace_recover_takes_only_its_sessions_and_names_the_others() {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path();
        session_dir(data, "20250301-101500-aaaa", "/other", true);
        session_dir(data, "20250301-101600-bbbb", "/w", false);
        match choose(data, None, Path::new("/w/src")) {
            Ok(info) => panic!(
                "inside /w, whose session has nothing to recover, recover chose session {} of {:?}",
                info.id,
                info.workspace()
            ),
            Err(e) => {
                let e = e.to_string();
                assert!(e.contains("no session of the workspace /w waits to be recovered"), "{e}");
                assert!(e.contains("20250301-101500-aaaa (in /other)"), "{e}");
                assert!(e.contains("stockade recover ID"), "{e}");
            }
        }
        assert_eq!(choose(data, None, Path::new("/elsewhere")).unwrap().id, "20250301-101500-aaaa");
    }

    #[test]
    fn a_session_without_a_kept_disk_is_refused_with_why() {
        let tmp = tempfile::tempdir().unwrap();
        session_dir(tmp.path(), "20250301-101600-bbbb", "/w", false);
        let info = choose(tmp.path(), Some(&OsString::from("20250301")), Path::new("/w")).unwrap();
        let config = RecoverConfig { memory_bytes: 1 << 30, jail: false, kernel: None };
        let err = recover::recover(&info, &config).err().unwrap().to_string();
        assert!(err.contains("has no scratch disk to recover"), "{err}");
    }

    /// The init exported its changes, then went silent: the set is staged
    /// whole, so the session is not interrupted, and its disk goes.
    #[test]
    fn a_disk_beside_a_whole_staged_set_is_not_interrupted_and_goes() {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path();
        session_dir(data, "20250301-101500-aaaa", "/w", true);
        let info = choose(data, Some(&OsString::from("20250301")), Path::new("/w")).unwrap();
        assert!(session::is_interrupted(&info.dir));
        let mut set = Vec::new();
        crate::protocol::change_set::Writer::new(&mut set).unwrap().finish().unwrap();
        let store = crate::changes::Store::open(&info.dir).unwrap();
        store.stage(set.as_slice(), crate::protocol::change_set::Limits::default()).unwrap();
        assert!(!session::is_interrupted(&info.dir), "its changes are staged");
        let err = choose(data, None, Path::new("/w")).unwrap_err().to_string();
        assert!(err.contains("no session waits to be recovered"), "{err}");
        let config = RecoverConfig { memory_bytes: 1 << 30, jail: false, kernel: None };
        let err = recover::recover(&info, &config).err().unwrap().to_string();
        assert!(err.contains("its changes were staged whole"), "{err}");
        assert!(!info.dir.join(session::SCRATCH_DISK).exists(), "the spent disk is removed");
        assert!(store.is_staged(), "the staged set stays");
    }

    #[test]
    fn a_running_session_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let running = session::Session::create(tmp.path()).unwrap();
        std::fs::write(running.scratch_disk(), b"").unwrap();
        let info = SessionInfo { id: running.id.clone(), dir: running.dir.clone(), record: None };
        assert!(!session::is_interrupted(&info.dir), "a disk in a running session is its run's");
        let config = RecoverConfig { memory_bytes: 1 << 30, jail: false, kernel: None };
        let err = recover::recover(&info, &config).err().unwrap().to_string();
        assert!(err.contains("is still running"), "{err}");
        drop(running);
        assert!(session::is_interrupted(&info.dir), "its supervisor gone, the disk is what is left");
    }
}
