//! The host's ends of the channels a run opens besides the init's control
//! connection: which connections are admitted (`admission`), published
//! ports (`publish`), the change port (`staging`), the guest's network and
//! egress proxy (`network`), and `live.sock`, where other stockade commands
//! ask a running session for a checkpoint (`live`).

pub(super) mod admission;
#[cfg(test)]
pub(crate) mod fake_init;
pub mod live;
#[cfg(test)]
mod live_attack_tests;
pub(super) mod network;
pub(super) mod publish;
pub(super) mod staging;
