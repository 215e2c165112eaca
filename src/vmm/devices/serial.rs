//! The 8250 UART at COM1 (vm-superio). The guest kernel's console goes here,
//! and from here to the session's kernel log file, never to the terminal.

use std::io::Write;

use vm_superio::{Serial, Trigger};
use vmm_sys_util::eventfd::EventFd;

use super::bus::BusDevice;

pub const COM1_BASE: u64 = 0x3f8;
pub const COM1_LEN: u64 = 8;
/// COM1's ISA interrupt line.
pub const COM1_IRQ: u32 = 4;

/// Raises the UART's interrupt through a KVM irqfd.
pub struct IrqTrigger(pub EventFd);

impl Trigger for IrqTrigger {
    type E = std::io::Error;
    fn trigger(&self) -> std::io::Result<()> {
        self.0.write(1)
    }
}

/// COM1 writing everything the guest prints to `out`.
pub struct SerialPort<W: Write + Send> {
    uart: Serial<IrqTrigger, vm_superio::serial::NoEvents, W>,
}

impl<W: Write + Send> SerialPort<W> {
    pub fn new(irq: EventFd, out: W) -> Self {
        SerialPort { uart: Serial::new(IrqTrigger(irq), out) }
    }
}

impl<W: Write + Send> SerialPort<W> {
    /// Pushes buffered log output to the file (before the VMM exits).
    pub fn flush(&mut self) {
        let _ = self.uart.writer_mut().flush();
    }
}

impl<W: Write + Send> BusDevice for SerialPort<W> {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        let value = u8::try_from(offset).map(|o| self.uart.read(o)).unwrap_or(0xff);
        data.fill(0);
        if let Some(first) = data.first_mut() {
            *first = value;
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let (Ok(offset), Some(&value)) = (u8::try_from(offset), data.first()) else {
            return;
        };
        if let Err(e) = self.uart.write(offset, value) {
            // A full log disk must not stop the guest; say it once per failure.
            tracing::warn!("serial: cannot write the kernel log: {e:?}");
        }
    }
}
