//! `stockade cache`: what the package cache holds, and emptying it.

use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};

use super::settings::Settings;
use crate::host::space::human_bytes;
use crate::paths::Dirs;
use crate::proxy::packages::store;

/// Show or clear the package cache
///
/// Policies with a [[registry]] rule (the npm, cargo and pypi presets) let
/// the egress proxy keep the packages a run downloads: npm tarballs, .crate
/// files, PyPI wheels and sdists. A file is kept only after the proxy found
/// it to have the digest the registry itself publishes for it, and is
/// checked again whenever a later run's install is served from it, so one
/// run cannot hand the next altered packages. The guest never sees the
/// cache. The `package_cache` setting (default "5G", "0" for off) bounds its
/// size; the least recently used files go first.
#[derive(Debug, Args)]
pub struct CacheArgs {
    #[command(subcommand)]
    command: Option<CacheCommand>,
}

#[derive(Debug, Subcommand)]
enum CacheCommand {
    /// Print where the cache is, how much it holds and its limit (the default)
    Show,
    /// Remove every cached package (runs download them again)
    Clear,
}

pub fn run(args: CacheArgs) -> anyhow::Result<ExitCode> {
    let dirs = Dirs::resolve()?;
    let dir = dirs.packages();
    match args.command.unwrap_or(CacheCommand::Show) {
        CacheCommand::Show => {
            let usage =
                store::usage(&dir).with_context(|| format!("cannot read the package cache {}", dir.display()))?;
            let settings = Settings::load()?;
            let limit = &settings.package_cache.value;
            println!("Package cache: {}", dir.display());
            println!("  {} files, {}", usage.files, human_bytes(usage.bytes));
            if limit.bytes == 0 {
                println!("  off (package_cache = \"0\" in {})", settings.path.display());
            } else {
                println!("  limit {} ({})", limit.text, settings.package_cache.source);
            }
        }
        CacheCommand::Clear => {
            let removed =
                store::clear(&dir).with_context(|| format!("cannot empty the package cache {}", dir.display()))?;
            println!("Removed {} files, {}, from {}", removed.files, human_bytes(removed.bytes), dir.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}
