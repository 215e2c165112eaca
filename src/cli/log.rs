//! `stockade log`: what a session's command did on the network.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Args;

use crate::paths::Dirs;
use crate::protocol::audit::Decision;
use crate::proxy::audit;

/// Show a session's network log
///
/// Every connection the command asked for, allowed or denied, with the rule
/// that decided, the bytes each way and, for hosts with a credential rule,
/// each request. Sessions live in ~/.local/share/stockade/sessions/.
#[derive(Debug, Args)]
pub struct LogArgs {
    /// The session id, or a unique start of it (default: the latest session).
    #[arg(value_name = "SESSION")]
    session: Option<String>,

    /// Only denied and failed flows.
    #[arg(long)]
    denied: bool,

    /// Print the log's JSON lines as they are.
    #[arg(long, conflicts_with = "denied")]
    json: bool,
}

pub fn run(args: LogArgs) -> anyhow::Result<ExitCode> {
    let sessions = Dirs::resolve()?.data.join("sessions");
    let dir = find_session(&sessions, args.session.as_deref())?;
    let path = dir.join(crate::protocol::audit::AUDIT_FILE);
    let id = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    if !path.exists() {
        println!("session {id}: no network use recorded");
        return Ok(ExitCode::SUCCESS);
    }
    if args.json {
        let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
        print!("{text}");
        return Ok(ExitCode::SUCCESS);
    }
    let (mut records, bad) = audit::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
    if args.denied {
        records.retain(|r| r.decision != Decision::Allow);
    }
    println!("session {id}");
    print!("{}", audit::render(&records));
    if bad > 0 {
        eprintln!("stockade: {bad} lines of {} could not be read", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// The session directory for an id or id prefix; the latest without one.
/// Ids start with the date and time, so the latest sorts last.
pub(crate) fn find_session(sessions: &Path, wanted: Option<&str>) -> anyhow::Result<PathBuf> {
    let mut ids: Vec<String> = std::fs::read_dir(sessions)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    ids.sort();
    let Some(wanted) = wanted else {
        return match ids.last() {
            Some(id) => Ok(sessions.join(id)),
            None => bail!("no sessions yet in {}: run a command with `stockade run` first", sessions.display()),
        };
    };
    if wanted.is_empty() || wanted.contains('/') {
        bail!("{wanted:?} is not a session id");
    }
    let matches: Vec<&String> = ids.iter().filter(|id| id.starts_with(wanted)).collect();
    match matches.as_slice() {
        [id] => Ok(sessions.join(id)),
        [] => bail!("no session {wanted} in {}", sessions.display()),
        many => bail!(
            "{wanted} matches {} sessions ({}...): give more of the id",
            many.len(),
            many.iter().take(3).map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_latest_or_a_unique_prefix() {
        let root = std::env::temp_dir().join(format!("stockade-log-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        assert!(find_session(&root, None).unwrap_err().to_string().contains("no sessions yet"));
        for id in ["20260101-100000-aaaa", "20260102-090000-bbbb", "20260102-100000-cccc"] {
            std::fs::create_dir_all(root.join(id)).unwrap();
        }
        assert_eq!(find_session(&root, None).unwrap(), root.join("20260102-100000-cccc"));
        assert_eq!(find_session(&root, Some("20260101")).unwrap(), root.join("20260101-100000-aaaa"));
        assert!(find_session(&root, Some("20260102")).unwrap_err().to_string().contains("matches 2 sessions"));
        assert!(find_session(&root, Some("2027")).is_err());
        assert!(find_session(&root, Some("../x")).is_err());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
