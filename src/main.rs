//! stockade: run a command inside a local KVM microVM.
//!
//! `main` only parses the command line, dispatches, and maps the outcome to an
//! exit status; everything else lives in the modules below.

mod cli;
mod doctor;
mod host;
mod jail;
mod paths;
mod vmm;

use std::process::ExitCode;

fn main() -> ExitCode {
    cli::main()
}
