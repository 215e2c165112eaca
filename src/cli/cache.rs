//! `stockade cache`: what the package cache and the VM templates hold, and
//! emptying them.

use std::fmt::Write as _;
use std::io::Write as _;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};

use super::settings::Settings;
use crate::host::templates;
use crate::paths::Dirs;
use crate::proxy::packages::store;
use crate::supervisor::guest_view::scratch;
use crate::util::text::human_bytes;

/// Show or clear the package cache and the VM templates
///
/// Policies with a [[registry]] rule (the npm, cargo and pypi presets) let
/// the egress proxy keep the packages a run downloads: npm tarballs, .crate
/// files, PyPI wheels and sdists. A file is kept only after the proxy found
/// it to have the digest the registry itself publishes for it, and is
/// checked again whenever a later run's install is served from it, so one
/// run cannot hand the next altered packages. The guest never sees the
/// cache. The `package_cache` setting (default "5G", "0" for off) bounds its
/// size; the least recently used files go first.
///
/// The templates are VMs saved just before they took their command, one per
/// VM shape (kernel, stockade binary, CPUs, memory, devices): runs resume
/// them instead of booting (`--no-snapshot` boots). At most four are kept,
/// the least recently used removed first.
///
/// Blank scratch disks: one formatted, empty disk per disk size in use,
/// copied for each run's scratch disk instead of formatting one per run.
#[derive(Debug, Args)]
pub struct CacheArgs {
    #[command(subcommand)]
    command: Option<CacheCommand>,
}

#[derive(Debug, Subcommand)]
enum CacheCommand {
    /// Print where the cache is, how much it holds and its limit (the default)
    Show,
    /// Remove every cached package, template and blank disk (later runs
    /// make them again)
    Clear,
}

pub fn run(args: CacheArgs) -> anyhow::Result<ExitCode> {
    let dirs = Dirs::resolve()?;
    let dir = dirs.packages();
    let template_dir = templates::root(&dirs.cache);
    let blanks = scratch::blanks_dir(&dirs.cache);
    let mut out = String::new();
    match args.command.unwrap_or(CacheCommand::Show) {
        CacheCommand::Show => {
            let usage =
                store::usage(&dir).with_context(|| format!("cannot read the package cache {}", dir.display()))?;
            let settings = Settings::load()?;
            let limit = &settings.package_cache.value;
            let _ = writeln!(out, "Package cache: {}", dir.display());
            let _ = writeln!(out, "  {} files, {}", usage.files, human_bytes(usage.bytes));
            if limit.bytes == 0 {
                let _ = writeln!(out, "  off (package_cache = \"0\" in {})", settings.path.display());
            } else {
                let _ = writeln!(out, "  limit {} ({})", limit.text, settings.package_cache.source);
            }
            let listed = templates::list(&template_dir)
                .with_context(|| format!("cannot read the templates in {}", template_dir.display()))?;
            let _ = writeln!(out, "Templates: {}", template_dir.display());
            let total: u64 = listed.iter().map(|t| t.bytes).sum();
            let _ = writeln!(out, "  {} of at most {}, {}", listed.len(), templates::KEEP, human_bytes(total));
            for t in &listed {
                let ago = t.last_used.elapsed().unwrap_or_default().as_secs();
                let _ = writeln!(out, "  {}  {}  used {} ago", t.key, human_bytes(t.bytes), human_age(ago));
            }
            let (count, bytes) = scratch::usage(&blanks);
            let _ = writeln!(out, "Blank disks: {}", blanks.display());
            let _ = writeln!(out, "  {count}, {}", human_bytes(bytes));
        }
        CacheCommand::Clear => {
            let removed =
                store::clear(&dir).with_context(|| format!("cannot empty the package cache {}", dir.display()))?;
            let _ = writeln!(
                out,
                "Removed {} files, {}, from {}",
                removed.files,
                human_bytes(removed.bytes),
                dir.display()
            );
            let (count, bytes) = templates::clear(&template_dir)
                .with_context(|| format!("cannot remove the templates in {}", template_dir.display()))?;
            let _ = writeln!(out, "Removed {count} templates, {}, from {}", human_bytes(bytes), template_dir.display());
            let (count, bytes) = scratch::clear(&blanks)
                .with_context(|| format!("cannot remove the blank disks in {}", blanks.display()))?;
            let _ = writeln!(out, "Removed {count} blank disks, {}, from {}", human_bytes(bytes), blanks.display());
        }
    }
    // One write: a reader that stops early (`| head`) ends the output
    // quietly instead of failing it.
    if let Err(e) = std::io::stdout().write_all(out.as_bytes())
        && e.kind() != std::io::ErrorKind::BrokenPipe
    {
        return Err(e).context("cannot write to stdout");
    }
    Ok(ExitCode::SUCCESS)
}

/// "3 s", "5 min", "2 h", "4 days".
fn human_age(secs: u64) -> String {
    match secs {
        s if s < 60 => format!("{s} s"),
        s if s < 3600 => format!("{} min", s / 60),
        s if s < 86_400 => format!("{} h", s / 3600),
        s => format!("{} days", s / 86_400),
    }
}
