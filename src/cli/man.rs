//! `stockade man`: writes the manual pages, one per subcommand, from the
//! same clap definitions as the help. Hidden: it exists to regenerate the
//! pages checked in under man/ (a test fails when they are stale).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

#[derive(Debug, Args)]
pub struct ManArgs {
    /// Where to write stockade.1 and stockade-SUBCOMMAND.1 (created if
    /// missing; pages already there are replaced).
    #[arg(long, value_name = "DIR")]
    out_dir: PathBuf,
}

pub fn run(args: ManArgs) -> anyhow::Result<ExitCode> {
    std::fs::create_dir_all(&args.out_dir)
        .with_context(|| format!("cannot create --out-dir {}", args.out_dir.display()))?;
    clap_mangen::generate_to(super::command(), &args.out_dir)
        .with_context(|| format!("cannot write the manual pages to {}", args.out_dir.display()))?;
    Ok(ExitCode::SUCCESS)
}
