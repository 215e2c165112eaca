//! stockade's integration tests: one binary, one module per concern.

mod rig;
mod util;

mod changes_e2e;
mod cli;
mod doctor;
mod jail;
mod limits_e2e;
mod network_e2e;
mod policy_cli;
mod rig_selftest;
mod run_e2e;
mod run_input;
mod terminal_e2e;
mod transparent_e2e;
