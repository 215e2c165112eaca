//! stockade: run a command inside a local KVM microVM.
//!
//! `main` only parses the command line, dispatches, and maps the outcome to an
//! exit status; everything else lives in the modules below.

mod changes;
#[cfg(test)]
mod changes_bench;
mod cli;
mod doctor;
mod guest;
mod host;
mod image;
mod jail;
mod logcap;
mod paths;
mod policy;
mod progress;
mod protocol;
mod proxy;
mod review;
mod session;
mod supervisor;
mod util;
mod vmm;

use std::process::ExitCode;

fn main() -> ExitCode {
    // The same binary is the guest's init: as PID 1 it never parses a command line.
    if std::process::id() == 1 {
        guest::main();
    }
    cli::main()
}
