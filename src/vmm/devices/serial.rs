//! The 8250 UART at COM1 (vm-superio). The guest kernel's console goes here,
//! and from here to the session's kernel log file, never to the terminal.

use std::io::Write;

use serde::{Deserialize, Serialize};
use vm_superio::serial::SerialState;
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

/// What the guest kernel prints as it powers off (`kernel_power_off`, at
/// KERN_EMERG, so even a `quiet` console shows it).
const POWER_DOWN: &[u8] = b"reboot: Power down";
/// Longest console line looked at; the rest of a longer one is not.
const LINE_MAX: usize = 256;

/// Passes the console through to `inner`, and signals `exit` when a line
/// says the guest kernel is powering off: without ACPI it then halts for
/// good, and the VM would otherwise sit until the supervisor's silence
/// bound. A guest process can print the line too; it only ends its own
/// VM, as a power-off would, and the supervisor keeps the scratch disk of
/// a run that ended without its report.
pub struct PowerDownWatch<W> {
    inner: W,
    exit: EventFd,
    line: Vec<u8>,
}

impl<W: Write> PowerDownWatch<W> {
    pub fn new(inner: W, exit: EventFd) -> Self {
        PowerDownWatch { inner, exit, line: Vec::with_capacity(LINE_MAX) }
    }

    fn watch(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            if byte == b'\n' {
                if self.line.windows(POWER_DOWN.len()).any(|w| w == POWER_DOWN) {
                    tracing::info!("the guest kernel is powering off");
                    if let Err(e) = self.exit.write(1) {
                        tracing::error!("cannot signal the guest's power-off: {e}");
                    }
                }
                self.line.clear();
            } else if self.line.len() < LINE_MAX {
                self.line.push(byte);
            }
        }
    }
}

impl<W: Write> Write for PowerDownWatch<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.watch(buf);
        // The log may be full or failing; the watch goes on regardless.
        self.inner.write(buf).or(Ok(buf.len()))
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// `SerialState`'s fields, for serde (vm-superio has no serde of its own).
#[derive(Serialize, Deserialize)]
#[serde(remote = "SerialState")]
struct SerialStateDef {
    baud_divisor_low: u8,
    baud_divisor_high: u8,
    interrupt_enable: u8,
    interrupt_identification: u8,
    line_control: u8,
    line_status: u8,
    modem_control: u8,
    modem_status: u8,
    scratch: u8,
    in_buffer: Vec<u8>,
}

/// The UART's registers in a template.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct UartState(#[serde(with = "SerialStateDef")] SerialState);

impl<W: Write + Send> SerialPort<W> {
    pub fn new(irq: EventFd, out: W) -> Self {
        SerialPort { uart: Serial::new(IrqTrigger(irq), out) }
    }

    /// A UART that goes on from `state`, writing to `out`.
    pub fn restored(irq: EventFd, out: W, state: &UartState) -> std::io::Result<Self> {
        let uart = Serial::from_state(&state.0, IrqTrigger(irq), vm_superio::serial::NoEvents, out)
            .map_err(|e| std::io::Error::other(format!("{e:?}")))?;
        Ok(SerialPort { uart })
    }

    pub fn state(&self) -> UartState {
        UartState(self.uart.state())
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

#[cfg(test)]
mod tests {
    use vmm_sys_util::eventfd::EFD_NONBLOCK;

    use super::*;

    #[test]
    fn a_power_down_line_signals_the_exit_and_others_do_not() {
        let exit = EventFd::new(EFD_NONBLOCK).unwrap();
        let mut console = PowerDownWatch::new(Vec::new(), exit.try_clone().unwrap());
        console.write_all(b"[    1.0] reboot: Restarting system\nreboot: Power d").unwrap();
        assert!(exit.read().is_err(), "no power-off yet");
        console.write_all(b"own\n").unwrap();
        assert_eq!(exit.read().unwrap(), 1, "the line, split over writes, is seen");
        console.write_all(&[b'x'; 1000]).unwrap();
        console.write_all(b"reboot: Power down\n").unwrap();
        assert!(exit.read().is_err(), "past the longest line looked at, nothing");
        assert!(console.inner.ends_with(b"reboot: Power down\n"), "everything reaches the log");
    }

    #[test]
    fn a_restored_uart_keeps_what_the_driver_programmed() {
        let mut port = SerialPort::new(EventFd::new(EFD_NONBLOCK).unwrap(), Vec::new());
        // Line control 0x03 (8N1), scratch 0x5a, interrupts on (IER 0x01).
        port.write(3, &[0x03]);
        port.write(7, &[0x5a]);
        port.write(1, &[0x01]);
        let state = port.state();
        let mut again = SerialPort::restored(EventFd::new(EFD_NONBLOCK).unwrap(), Vec::new(), &state).unwrap();
        assert_eq!(again.state(), state);
        let mut b = [0u8];
        again.read(7, &mut b);
        assert_eq!(b, [0x5a]);
    }
}
