//! `stockade doctor`: can `stockade run` work on this host?

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::doctor;
use crate::paths::Dirs;

/// Check whether `stockade run` can work on this host
///
/// Looks at KVM (and runs a tiny test guest), the guest kernel, the jail's
/// kernel features, free space and the session store's size, and says how
/// to fix what is missing.
/// Exits 0 only when `stockade run` can work here.
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Check this guest kernel (a PVH vmlinux) instead of the installed one.
    #[arg(long, value_name = "PATH")]
    kernel: Option<PathBuf>,
}

pub fn run(args: DoctorArgs) -> anyhow::Result<ExitCode> {
    let dirs = Dirs::resolve()?;
    let facts = doctor::gather(&dirs, args.kernel.as_deref());
    let checks = doctor::judge(&facts);
    print!("{}", doctor::render(&checks));
    Ok(if doctor::can_run(&checks) { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
