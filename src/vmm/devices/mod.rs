//! Devices the guest sees: the 8250 serial port for the kernel log, the i8042
//! reset line, and virtio devices on the MMIO transport; `broker`, how devices reach
//! the host's sockets.

pub mod broker;
pub mod bus;
pub mod legacy;
pub mod mmio;
pub mod serial;
pub mod virtio;
