//! What happens to the staged changes when the command has ended.

use std::path::Path;

use crate::changes::{StageReport, Store};

pub fn after_run(store: &Store, workspace: &Path, session_id: &str, staged: &StageReport) {
    let _ = (store, workspace);
    if staged.summary.entries == 0 {
        return;
    }
    eprintln!(
        "stockade: {} change(s) to {} are staged in session {session_id}; nothing was written to the workspace.",
        staged.summary.entries,
        workspace.display()
    );
}
