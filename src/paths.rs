//! Where stockade keeps its files: `~/.local/share/stockade` for data (sessions,
//! the installed guest kernel) and `~/.cache/stockade` for rebuildable artifacts.
#![forbid(unsafe_code)]

use std::path::PathBuf;

use directories::ProjectDirs;

/// The per-user directories, resolved once from the XDG environment.
#[derive(Debug, Clone)]
pub struct Dirs {
    pub data: PathBuf,
    pub cache: PathBuf,
}

impl Dirs {
    /// Resolves the directories; `STOCKADE_DATA_DIR` and `STOCKADE_CACHE`
    /// override them (tests and packagers use these).
    pub fn resolve() -> anyhow::Result<Dirs> {
        let project = project_dirs();
        let data = match std::env::var_os("STOCKADE_DATA_DIR") {
            Some(dir) => PathBuf::from(dir),
            None => project.as_ref().map(|p| p.data_dir().to_path_buf()).ok_or_else(no_home)?,
        };
        let cache = match std::env::var_os("STOCKADE_CACHE") {
            Some(dir) => PathBuf::from(dir),
            None => project.as_ref().map(|p| p.cache_dir().to_path_buf()).ok_or_else(no_home)?,
        };
        Ok(Dirs { data, cache })
    }

    /// The package cache: registry downloads the proxy has checked.
    pub fn packages(&self) -> PathBuf {
        self.cache.join("packages")
    }
}

/// The XDG directories for stockade; `None` without a home directory. The
/// one place the project name is given, so data, cache and config agree.
pub fn project_dirs() -> Option<ProjectDirs> {
    ProjectDirs::from("", "", "stockade")
}

fn no_home() -> anyhow::Error {
    anyhow::anyhow!("cannot find your home directory: set HOME, or set STOCKADE_DATA_DIR and STOCKADE_CACHE")
}
