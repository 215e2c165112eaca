//! Helpers shared by the integration tests.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The stockade binary under test.
pub fn stockade_bin() -> &'static str {
    env!("CARGO_BIN_EXE_stockade")
}

/// A fresh directory for one test, removed when dropped.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("stockade-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create test dir");
        TempDir(dir)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs stockade with `args`, its data dir in `data`.
pub fn stockade(data: &Path, args: &[&str]) -> Output {
    Command::new(stockade_bin())
        .args(args)
        .env("STOCKADE_DATA_DIR", data)
        .env_remove("RUST_LOG")
        .output()
        .expect("run stockade")
}

/// Runs stockade in `dir` with its config (XDG) and data directories there
/// too, so the user's own config and sessions never take part.
pub fn stockade_in(dir: &Path, args: &[&str]) -> Output {
    stockade_from(dir, dir, args)
}

/// Runs stockade in `cwd` with its config and data directories in `dir`.
pub fn stockade_from(dir: &Path, cwd: &Path, args: &[&str]) -> Output {
    Command::new(stockade_bin())
        .args(args)
        .current_dir(cwd)
        .env("XDG_CONFIG_HOME", dir.join("xdg"))
        .env("STOCKADE_DATA_DIR", dir.join("data"))
        .env_remove("STOCKADE_CONFIG_DIR")
        .env_remove("RUST_LOG")
        .output()
        .expect("run stockade")
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Set to 1 to rewrite the checked-in snapshots instead of comparing them.
pub const UPDATE_SNAPSHOTS: &str = "UPDATE_SNAPSHOTS";

pub fn updating_snapshots() -> bool {
    std::env::var(UPDATE_SNAPSHOTS).is_ok_and(|v| v == "1")
}

/// The crate root, where checked-in snapshots live.
pub fn crate_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A line diff of two texts: the lines they share at the start and end
/// are left out, the rest shown as -expected / +actual.
pub fn line_diff(expected: &str, actual: &str) -> String {
    let old: Vec<&str> = expected.lines().collect();
    let new: Vec<&str> = actual.lines().collect();
    let head = old.iter().zip(&new).take_while(|(a, b)| a == b).count();
    let tail = old[head..].iter().rev().zip(new[head..].iter().rev()).take_while(|(a, b)| a == b).count();
    let mut out = format!("@@ line {} @@\n", head + 1);
    for line in &old[head..old.len() - tail] {
        out.push_str(&format!("-{line}\n"));
    }
    for line in &new[head..new.len() - tail] {
        out.push_str(&format!("+{line}\n"));
    }
    out
}
