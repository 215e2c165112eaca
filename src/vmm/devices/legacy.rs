//! The one piece of the i8042 keyboard controller a guest needs: the reset
//! line. Linux with `reboot=k` reboots by writing 0xFE to port 0x64; that is
//! how our guest says it is done.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use vmm_sys_util::eventfd::EventFd;

use super::bus::BusDevice;

/// Base port of the controller (data at 0x60, command/status at 0x64).
pub const I8042_BASE: u64 = 0x60;
pub const I8042_LEN: u64 = 5;
const COMMAND_OFFSET: u64 = 4;
const CMD_RESET_CPU: u8 = 0xfe;

pub struct I8042 {
    reset: EventFd,
    requested: Arc<AtomicBool>,
}

impl I8042 {
    /// `reset` is signalled and `requested` set when the guest pulses the
    /// reset line; the flag tells a deliberate reset from a crash.
    pub fn new(reset: EventFd, requested: Arc<AtomicBool>) -> I8042 {
        I8042 { reset, requested }
    }
}

impl BusDevice for I8042 {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        // Status 0: output buffer empty, input buffer empty, so the guest's
        // wait-for-ready loops finish at once.
        data.fill(0);
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if offset == COMMAND_OFFSET && data.first() == Some(&CMD_RESET_CPU) {
            self.requested.store(true, Ordering::SeqCst);
            if let Err(e) = self.reset.write(1) {
                tracing::error!("cannot signal guest reset: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmm_sys_util::eventfd::EFD_NONBLOCK;

    #[test]
    fn reset_command_signals_and_others_do_not() {
        let evt = EventFd::new(EFD_NONBLOCK).unwrap();
        let requested = Arc::new(AtomicBool::new(false));
        let mut dev = I8042::new(evt.try_clone().unwrap(), requested.clone());
        dev.write(0, &[CMD_RESET_CPU]);
        assert!(evt.read().is_err(), "a data-port write must not reset");
        dev.write(COMMAND_OFFSET, &[0xaa]);
        assert!(evt.read().is_err());
        assert!(!requested.load(Ordering::SeqCst));
        dev.write(COMMAND_OFFSET, &[CMD_RESET_CPU]);
        assert_eq!(evt.read().unwrap(), 1);
        assert!(requested.load(Ordering::SeqCst));
    }
}
