//! `stockade vmm`: the VMM process of one session. Internal: `stockade run`
//! starts it as a separate process so that the code that touches KVM and
//! guest memory holds no credentials and can be jailed on its own.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

use crate::protocol::vm_config::VmConfig;
use crate::vmm;

#[derive(Debug, Args)]
pub struct VmmArgs {
    /// The VM description written by the supervisor (JSON).
    #[arg(long, value_name = "FILE")]
    config: PathBuf,

    /// Test aid: close the jail, attempt one forbidden operation (open:PATH,
    /// write:PATH, exec:PATH, socket, fds) and print the result.
    #[arg(long, value_name = "PROBE", hide = true)]
    jail_probe: Option<vmm::jail_probe::Probe>,
}

pub fn run(args: VmmArgs) -> anyhow::Result<ExitCode> {
    crate::jail::close_inherited_fds().context("cannot close inherited descriptors")?;
    let text = std::fs::read_to_string(&args.config)
        .with_context(|| format!("cannot read VM config {}", args.config.display()))?;
    let config: VmConfig =
        serde_json::from_str(&text).with_context(|| format!("malformed VM config {}", args.config.display()))?;
    if let Some(probe) = args.jail_probe {
        println!("{}", vmm::jail_probe::run(&config, probe)?);
        return Ok(ExitCode::SUCCESS);
    }
    vmm::run(&config)?;
    Ok(ExitCode::SUCCESS)
}
