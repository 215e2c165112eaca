//! `stockade log`: what a session's command did on the network.

use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

use crate::paths::Dirs;
use crate::protocol::audit::Decision;
use crate::proxy::audit;
use crate::session;

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
    let dir = session::lookup::find_session(&sessions, args.session.as_deref())?;
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
