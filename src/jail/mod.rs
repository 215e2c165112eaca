//! Confinement of the VMM process: Landlock and seccomp. For now this module
//! reports what the host kernel offers; the VMM jail builds on it.

pub mod landlock;
pub mod seccomp;
