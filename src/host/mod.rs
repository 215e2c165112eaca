//! Facts about the host that decide whether and how a VM can run: which KVM
//! this is, which guest kernel to boot, how much room the data directory has.
#![forbid(unsafe_code)]

pub mod kernel;
pub mod kvm;
pub mod templates;
