//! `stockade shell`: your login shell in a microVM.

use std::process::ExitCode;

use clap::Args;

use super::Global;
use super::run::{VmOptions, validate};
use super::settings::{Flags, Settings};
use crate::supervisor;

/// Start your login shell in a fresh microVM
///
/// Runs $SHELL (or /bin/sh) as a login shell, with the same view of the host
/// and the same options as `stockade run`.
#[derive(Debug, Args)]
pub struct ShellArgs {
    #[command(flatten)]
    vm: VmOptions,
}

pub fn run(args: ShellArgs, global: Global) -> anyhow::Result<ExitCode> {
    let shell = std::env::var("SHELL").ok().filter(|s| !s.is_empty()).unwrap_or_else(|| "/bin/sh".into());
    let argv = vec![shell, "-l".to_string()];
    let settings = Settings::load()?.with_flags(Flags { color: global.color, ..Flags::default() })?;
    let config = validate(
        args.vm,
        settings,
        argv,
        &["SHELL"],
        global.verbose,
        |name| std::env::var_os(name),
        std::env::vars_os(),
    )?;
    super::first_run::show_once();
    super::sessions::prune_before_run();
    Ok(ExitCode::from(supervisor::run(config)?.status))
}
