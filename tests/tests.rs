//! stockade's integration tests: one binary, one module per concern.

mod rig;
mod util;

mod agents_e2e;
mod branch_cli;
mod branch_e2e;
mod changes_e2e;
mod cli;
mod config_cli;
mod descriptors_e2e;
mod docker_e2e;
mod doctor;
mod git_ssh_e2e;
mod help;
mod image_e2e;
mod init_channels_e2e;
mod jail;
mod limits_e2e;
mod live_e2e;
mod man_pages;
mod network_e2e;
mod new_user_e2e;
mod packages_e2e;
mod policy_cli;
mod publish_e2e;
mod recover_e2e;
mod rig_selftest;
mod rootfs_e2e;
mod run_e2e;
mod run_input;
mod sessions_cli;
mod snapshot_e2e;
mod surfaces_e2e;
mod terminal_e2e;
mod transparent_e2e;
mod workspace_e2e;
