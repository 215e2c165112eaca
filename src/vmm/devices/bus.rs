//! Dispatch of guest port and MMIO accesses to the device that owns the address.

use std::sync::{Arc, Mutex};

/// A device reachable at a range of port or MMIO addresses. Offsets are
/// relative to the start of its range.
pub trait BusDevice: Send {
    fn read(&mut self, offset: u64, data: &mut [u8]);
    fn write(&mut self, offset: u64, data: &[u8]);
}

struct Range {
    base: u64,
    len: u64,
    device: Arc<Mutex<dyn BusDevice>>,
}

/// Address ranges and their devices; ranges never overlap.
#[derive(Default)]
pub struct Bus {
    ranges: Vec<Range>,
}

impl Bus {
    /// Adds a device at `[base, base + len)`. Panics on overlap: that is a
    /// bug in the VMM's own layout, never guest input.
    pub fn insert(&mut self, base: u64, len: u64, device: Arc<Mutex<dyn BusDevice>>) {
        let end = base.checked_add(len).expect("bus range overflows");
        assert!(
            self.ranges.iter().all(|r| end <= r.base || base >= r.base + r.len),
            "bus range {base:#x}+{len:#x} overlaps an existing device"
        );
        self.ranges.push(Range { base, len, device });
    }

    fn find(&self, addr: u64) -> Option<(&Range, u64)> {
        self.ranges.iter().find(|r| addr >= r.base && addr - r.base < r.len).map(|r| (r, addr - r.base))
    }

    /// Reads from the device at `addr`; unclaimed addresses read as all ones,
    /// as on real hardware with nothing on the bus.
    pub fn read(&self, addr: u64, data: &mut [u8]) {
        match self.find(addr) {
            Some((range, offset)) => lock(&range.device).read(offset, data),
            None => data.fill(0xff),
        }
    }

    /// Writes to the device at `addr`; writes nobody claims are dropped.
    pub fn write(&self, addr: u64, data: &[u8]) {
        if let Some((range, offset)) = self.find(addr) {
            lock(&range.device).write(offset, data);
        }
    }
}

/// Locks a device even if another vCPU panicked while holding it: the device
/// state is still the best we have, and the VMM is about to stop anyway.
fn lock<'a>(device: &'a Mutex<dyn BusDevice + 'static>) -> std::sync::MutexGuard<'a, dyn BusDevice + 'static> {
    device.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Echo(u8);
    impl BusDevice for Echo {
        fn read(&mut self, offset: u64, data: &mut [u8]) {
            data.fill(self.0.wrapping_add(offset.to_le_bytes()[0]));
        }
        fn write(&mut self, _offset: u64, data: &[u8]) {
            self.0 = data[0];
        }
    }

    #[test]
    fn routes_by_address_and_offsets_from_base() {
        let mut bus = Bus::default();
        bus.insert(0x100, 8, Arc::new(Mutex::new(Echo(10))));
        let mut b = [0u8; 1];
        bus.read(0x102, &mut b);
        assert_eq!(b, [12]);
        bus.write(0x100, &[20]);
        bus.read(0x100, &mut b);
        assert_eq!(b, [20]);
    }

    #[test]
    fn unclaimed_reads_are_all_ones() {
        let bus = Bus::default();
        let mut b = [0u8; 2];
        bus.read(0x3f8, &mut b);
        assert_eq!(b, [0xff, 0xff]);
    }

    #[test]
    #[should_panic(expected = "overlaps")]
    fn overlapping_ranges_are_a_bug() {
        let mut bus = Bus::default();
        bus.insert(0x100, 8, Arc::new(Mutex::new(Echo(0))));
        bus.insert(0x104, 8, Arc::new(Mutex::new(Echo(0))));
    }
}
