//! The virtual machine monitor: KVM, guest memory, vCPUs and devices.

pub mod devices;
pub mod probe;
