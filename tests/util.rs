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

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
