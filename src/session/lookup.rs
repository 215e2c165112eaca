//! Finding sessions in the store from what the user typed: the directory of
//! an id or id prefix (the latest without one), and the session a review
//! command works on when none is named.

use std::path::{Path, PathBuf};

use anyhow::bail;

use super::{SessionInfo, is_running};
use crate::changes::Store;

/// The session directory for an id or id prefix; the latest without one.
/// Ids start with the date and time, so the latest sorts last.
pub fn find_session(sessions: &Path, wanted: Option<&str>) -> anyhow::Result<PathBuf> {
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

/// The session a review command works on when none is named: the newest
/// with staged changes of the workspace `cwd` is in (of any workspace when
/// it is in none of theirs). A session holding an agent's settings for the
/// home directory is never the default (see `cli::sessions::resolve`).
pub fn default_session(sessions: &[SessionInfo], cwd: &Path) -> anyhow::Result<SessionInfo> {
    // A running session offers a checkpoint of its changes so far.
    let staged = |s: &SessionInfo| {
        is_running(&s.dir)
            || (s.dir.join("changes").is_dir()
                && Store::open(&s.dir).is_ok_and(|st| st.counts().is_ok_and(|c| c.staged > 0)))
    };
    let agent_of = |s: &SessionInfo| s.record.as_ref().and_then(|r| r.agent_settings().map(str::to_string));
    let mut newest = None;
    for s in sessions.iter().filter(|s| agent_of(s).is_none()) {
        let here = s.workspace().is_some_and(|w| cwd.starts_with(w));
        if (here || newest.is_none()) && staged(s) {
            if here {
                return Ok(s.clone());
            }
            newest = Some(s);
        }
    }
    if let Some(s) = newest {
        return Ok(s.clone());
    }
    if sessions.is_empty() {
        bail!("there are no sessions yet; `stockade run` makes one");
    }
    if let Some(home) = sessions.iter().find(|s| agent_of(s).is_some() && staged(s)) {
        let whose = match agent_of(home).as_deref() {
            Some("") | None => "an agent's".to_string(),
            Some(name) => format!("agent {name}'s"),
        };
        bail!(
            "no session of this workspace has staged changes; session {id} holds {whose} settings for your home \
             directory, which run code on the host and are applied only when named: review them with \
             `stockade diff {id}`, apply them with `stockade apply {id}`",
            id = home.id
        );
    }
    bail!("no session has staged changes; `stockade sessions` lists the sessions")
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
