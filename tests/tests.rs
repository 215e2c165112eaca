//! stockade's integration tests: one binary, one module per concern.

mod rig;
mod util;

mod changes_e2e;
mod cli;
mod config_cli;
mod doctor;
mod help;
mod man_pages;
mod network_e2e;
mod new_user_e2e;
mod policy_cli;
mod rig_selftest;
mod run_e2e;
mod run_input;
mod terminal_e2e;
