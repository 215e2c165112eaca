//! The guest's init, PID 1, carried inside the stockade binary.
//!
//! Steps, in order: mount the kernel filesystems; connect to the host over
//! vsock and say ready; receive the command and the root layout; assemble
//! the root from the virtio-fs share and tmpfs mounts; run the command with
//! its stdio bridged to the host; report how it ended; wait for the host to
//! take everything; sync and reset the VM.

mod changes;
mod channel;
mod command;
pub mod export;
mod limits;
mod mounts;
mod net;
mod tty;

use std::io::Write;

use crate::protocol::{ExitReport, GuestMsg, HostMsg};

/// Runs init; never returns (the VM resets at the end, whatever happens).
pub fn main() -> ! {
    std::panic::set_hook(Box::new(|info| {
        eprintln!("stockade-init: panic: {info}");
    }));
    if let Err(e) = run() {
        eprintln!("stockade-init: {e:#}");
    }
    power_off()
}

fn run() -> anyhow::Result<()> {
    mounts::kernel_filesystems()?;
    let control = channel::connect_control()?;
    let kernel = nix::sys::utsname::uname().map(|u| u.release().to_string_lossy().into_owned()).unwrap_or_default();
    control.send(&GuestMsg::Ready { kernel })?;
    let spec = match control.recv()? {
        HostMsg::Run(spec) => spec,
        other => anyhow::bail!("expected a command from the host, got {other:?}"),
    };
    let report = match mounts::assemble_root(&spec.root) {
        Ok(layers) => match if spec.network { net::start() } else { Ok(()) } {
            Ok(()) => {
                let report = command::run(&spec, &control)?;
                if let Some(layers) = layers {
                    changes::send(&layers, &control)?;
                }
                report
            }
            Err(e) => ExitReport::SetupFailed { message: format!("{e:#}") },
        },
        Err(e) => ExitReport::SetupFailed { message: format!("{e:#}") },
    };
    control.send(&GuestMsg::Exit(report))?;
    control.wait_finish();
    Ok(())
}

fn power_off() -> ! {
    let _ = std::io::stderr().flush();
    nix::unistd::sync();
    // With reboot=k the kernel pulses the i8042 reset line, which the VMM
    // takes as the end of the VM.
    let _ = nix::sys::reboot::reboot(nix::sys::reboot::RebootMode::RB_AUTOBOOT);
    loop {
        std::thread::park();
    }
}
