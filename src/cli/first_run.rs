//! The one line the first run in a workspace prints about what the guest
//! sees. Shown only to a person (stderr a terminal, not `--ci`), once per
//! workspace: a marker named by the hash of the workspace's path is left
//! in the data directory's `first-run/`.

use std::io::{self, IsTerminal, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::paths::Dirs;

const MARKERS: &str = "first-run";

/// Prints the notice when this is the first run in the current workspace
/// that a person watches. Never fails the run: trouble is only logged.
pub fn show_once() {
    if !io::stderr().is_terminal() {
        return;
    }
    let found = (|| {
        let cwd = std::env::current_dir().ok()?;
        let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/"));
        let workspace = crate::supervisor::find_workspace(&cwd, &home).ok()?;
        Some((Dirs::resolve().ok()?.data, workspace))
    })();
    // Without a workspace the run itself will say why.
    let Some((data, workspace)) = found else { return };
    if let Err(e) = show_if_new(&data, &workspace, &mut io::stderr()) {
        tracing::debug!("first-run notice: {e}");
    }
}

/// Prints the notice to `out` and remembers the workspace, unless it was
/// remembered before; returns whether it printed.
fn show_if_new(data: &Path, workspace: &Path, out: &mut dyn Write) -> io::Result<bool> {
    let marker = marker(data, workspace);
    if marker.exists() {
        return Ok(false);
    }
    writeln!(out, "{}", message(workspace))?;
    std::fs::create_dir_all(marker.parent().unwrap_or(data))?;
    // The path inside is for a person looking at the directory.
    std::fs::write(&marker, [workspace.as_os_str().as_bytes(), b"\n"].concat())?;
    Ok(true)
}

fn marker(data: &Path, workspace: &Path) -> PathBuf {
    let hash = Sha256::digest(workspace.as_os_str().as_bytes());
    let name: String = hash.iter().take(16).map(|b| format!("{b:02x}")).collect();
    data.join(MARKERS).join(name)
}

fn message(workspace: &Path) -> String {
    format!(
        "stockade: first run in {}: the guest sees this directory (its changes come back to you for review), \
         not your home directory, except the toolchains on your PATH under it, read-only (-v lists them; \
         --no-home-tools turns that off); its network goes only through the allowlist proxy (--policy, \
         --allow). (shown once per workspace)",
        workspace.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shows_once_per_workspace() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = (Path::new("/src/a"), Path::new("/src/b"));
        let mut out = Vec::new();
        assert!(show_if_new(tmp.path(), a, &mut out).unwrap());
        assert!(!show_if_new(tmp.path(), a, &mut out).unwrap());
        assert!(show_if_new(tmp.path(), b, &mut out).unwrap());
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(text.starts_with("stockade: first run in /src/a: the guest sees this directory"), "{text}");
        assert!(text.contains("not your home directory") && text.contains("allowlist proxy"), "{text}");
        assert_eq!(std::fs::read(marker(tmp.path(), a)).unwrap(), b"/src/a\n");
    }
}
