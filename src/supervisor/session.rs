//! The session store: one directory per run under
//! `~/.local/share/stockade/sessions/<id>`, holding the kernel log, the VMM's
//! own log, the vsock sockets while it runs, and the run record.

use std::fs;
use std::io::Write;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::Context;
use serde::{Deserialize, Serialize};

/// What a finished (or running) session did, as `run.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunRecord {
    pub id: String,
    pub command: Vec<String>,
    pub workspace: String,
    pub started: String,
    pub duration_ms: Option<u64>,
    /// The exit status stockade returned.
    pub status: Option<i32>,
    /// How the command ended, in words.
    pub outcome: Option<String>,
}

pub struct Session {
    pub id: String,
    pub dir: PathBuf,
    pub started: SystemTime,
}

impl Session {
    /// Creates a new session directory (0700: it will hold sockets and logs).
    pub fn create(data_dir: &Path) -> anyhow::Result<Session> {
        let started = SystemTime::now();
        let stamp = humantime::format_rfc3339_seconds(started).to_string();
        let compact: String = stamp.chars().filter(|c| c.is_ascii_digit()).collect();
        let suffix = random_suffix();
        let id = format!("{}-{}-{suffix}", &compact[..8], &compact[8..14]);
        let parent = data_dir.join("sessions");
        fs::create_dir_all(&parent).with_context(|| format!("cannot create the session store {}", parent.display()))?;
        let dir = parent.join(&id);
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .with_context(|| format!("cannot create the session directory {}", dir.display()))?;
        Ok(Session { id, dir, started })
    }

    pub fn kernel_log(&self) -> PathBuf {
        self.dir.join("kernel.log")
    }

    pub fn vmm_log(&self) -> PathBuf {
        self.dir.join("vmm.log")
    }

    /// Writes the run record atomically (temp file, fsync, rename).
    pub fn write_record(&self, record: &RunRecord) -> anyhow::Result<()> {
        let path = self.dir.join("run.json");
        let tmp = self.dir.join(".run.json.tmp");
        let mut file = fs::File::create(&tmp).with_context(|| format!("cannot write {}", tmp.display()))?;
        serde_json::to_writer_pretty(&mut file, record)?;
        file.write_all(b"\n")?;
        file.sync_all()?;
        fs::rename(&tmp, &path).with_context(|| format!("cannot write {}", path.display()))?;
        Ok(())
    }
}

fn random_suffix() -> String {
    let mut bytes = [0u8; 2];
    if let Ok(mut f) = fs::File::open("/dev/urandom") {
        use std::io::Read;
        let _ = f.read_exact(&mut bytes);
    }
    format!("{:02x}{:02x}", bytes[0], bytes[1])
}

/// The RFC 3339 form of a time, to the second.
pub fn timestamp(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}
