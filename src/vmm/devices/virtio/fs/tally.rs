//! How many FUSE requests a device served, by opcode, how many guest
//! notifications brought them (each a round trip, and a VM exit, that a
//! benchmark can count), and how long the device spent serving them: what a
//! row's time owes the host's own filesystem work, apart from the trips
//! between guest and host, and how much CPU time the worker, and the
//! helpers serving requests beside it (`pool`), spent on them: with no
//! helper, what the worker was not on a CPU it waited for one, or for the
//! host's disk; with helpers, the CPU time may exceed the time busy.
//! Written to the session's vmm.log at info level
//! (`RUST_LOG=stockade::vmm::devices::virtio::fs=info`), as running totals,
//! once the guest has been quiet for a moment; nothing is counted otherwise.

use std::time::{Duration, Instant};

use fuse_backend_rs::abi::fuse_abi::Opcode;

/// How long the guest must send nothing before the totals are written.
const QUIET_MS: i32 = 100;
/// Opcodes are small numbers; anything past this is counted as the last.
const OPCODES: usize = 64;

pub(super) struct Tally {
    enabled: bool,
    notifications: u64,
    requests: [u64; OPCODES],
    busy: Duration,
    cpu: Duration,
    /// Requests the worker caught while it watched the ring (see
    /// `Linger`): no kick brought them.
    caught: u64,
    /// The time spent watching, left out of `busy` and `cpu`; and how much
    /// of it the notification being served has spent so far.
    lingered: Duration,
    lingering: Duration,
    unreported: bool,
}

/// When serving a notification began: by the clock and by the worker
/// thread's own CPU time.
pub(super) struct Started {
    at: Instant,
    cpu: Duration,
}

impl Default for Tally {
    fn default() -> Self {
        Tally {
            enabled: tracing::enabled!(tracing::Level::INFO),
            notifications: 0,
            requests: [0; OPCODES],
            busy: Duration::ZERO,
            cpu: Duration::ZERO,
            caught: 0,
            lingered: Duration::ZERO,
            lingering: Duration::ZERO,
            unreported: false,
        }
    }
}

impl Tally {
    /// The guest notified the device of new requests; the device starts
    /// serving them (the instant is only read when counting).
    pub(super) fn notified(&mut self) -> Option<Started> {
        if self.enabled {
            self.notifications += 1;
            self.unreported = true;
            return Some(Started { at: Instant::now(), cpu: thread_cpu_time() });
        }
        None
    }

    /// The device served what the notification that `started` brought.
    pub(super) fn done(&mut self, started: Option<Started>) {
        if let Some(started) = started {
            let lingering = std::mem::take(&mut self.lingering);
            self.busy += started.at.elapsed().saturating_sub(lingering);
            self.cpu += thread_cpu_time().saturating_sub(started.cpu).saturating_sub(lingering);
            self.lingered += lingering;
        }
    }

    /// The worker watched the ring for `spun` after serving it, and
    /// `caught` a request there or not.
    pub(super) fn lingered(&mut self, caught: bool, spun: Duration) {
        if self.enabled {
            self.caught += u64::from(caught);
            self.lingering += spun;
        }
    }

    /// Helper threads spent `cpu` on the requests of the notification
    /// being served.
    pub(super) fn helped(&mut self, cpu: Duration) {
        if self.enabled {
            self.cpu += cpu;
        }
    }

    /// The device served a request with this opcode.
    pub(super) fn served(&mut self, opcode: u32) {
        if self.enabled {
            self.requests[(opcode as usize).min(OPCODES - 1)] += 1;
            self.unreported = true;
        }
    }

    /// How long the worker may wait before the totals are due.
    pub(super) fn timeout_ms(&self) -> i32 {
        if self.unreported { QUIET_MS } else { -1 }
    }

    /// Writes the totals so far, if anything came since the last time.
    pub(super) fn report(&mut self, tag: &str) {
        if !self.unreported {
            return;
        }
        self.unreported = false;
        let total: u64 = self.requests.iter().sum();
        let by_opcode: Vec<String> = (0u32..)
            .zip(self.requests.iter())
            .filter(|(_, n)| **n > 0)
            .map(|(op, n)| format!("{:?}={n}", Opcode::from(op)))
            .collect();
        tracing::info!(
            "virtio-fs {tag:?} requests: total={total} notifications={} busy_us={} cpu_us={} caught={} lingered_us={} {}",
            self.notifications,
            self.busy.as_micros(),
            self.cpu.as_micros(),
            self.caught,
            self.lingered.as_micros(),
            by_opcode.join(" ")
        );
    }
}

#[cfg(test)]
impl Tally {
    /// A tally that counts whatever the log level.
    pub(super) fn counting() -> Tally {
        Tally { enabled: true, ..Tally::default() }
    }

    /// Requests caught while the worker watched the ring.
    pub(super) fn caught(&self) -> u64 {
        self.caught
    }

    /// How many requests were counted, and the CPU time.
    pub(super) fn counted(&self) -> (u64, Duration) {
        (self.requests.iter().sum(), self.cpu)
    }
}

/// The CPU time the calling thread has used (zero if the clock cannot be
/// read, which only makes the tally's CPU column read low).
pub(super) fn thread_cpu_time() -> Duration {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime only writes into `now`, a valid timespec we own.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(u64::try_from(now.tv_sec).unwrap_or(0), u32::try_from(now.tv_nsec).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_are_due_once_after_requests_and_not_counted_unless_logged() {
        let mut tally = Tally { enabled: true, ..Tally::default() };
        assert_eq!(tally.timeout_ms(), -1, "nothing to write, no wake-ups");
        let started = tally.notified();
        assert!(started.is_some());
        tally.served(Opcode::Lookup as u32);
        tally.served(Opcode::Read as u32);
        tally.served(Opcode::Read as u32);
        tally.served(1000);
        std::thread::sleep(Duration::from_millis(2));
        let spin = Instant::now();
        while spin.elapsed() < Duration::from_millis(3) {
            std::hint::spin_loop();
        }
        tally.done(started);
        assert!(tally.busy >= Duration::from_millis(5), "the time serving is counted");
        assert!(tally.cpu > Duration::ZERO && tally.cpu <= tally.busy, "and the CPU time within it");
        let worker = tally.cpu;
        tally.helped(Duration::from_millis(7));
        assert_eq!(tally.cpu, worker + Duration::from_millis(7), "and the helpers' beside it");
        assert_eq!(tally.timeout_ms(), QUIET_MS);
        assert_eq!((tally.notifications, tally.requests[15], tally.requests[OPCODES - 1]), (1, 2, 1));
        tally.report("host");
        assert_eq!(tally.timeout_ms(), -1, "written once until more comes");

        let mut off = Tally { enabled: false, ..Tally::default() };
        let started = off.notified();
        off.served(Opcode::Read as u32);
        off.helped(Duration::from_millis(7));
        off.done(started);
        assert_eq!((off.timeout_ms(), off.notifications, off.requests[15], off.busy), (-1, 0, 0, Duration::ZERO));
        assert_eq!(off.cpu, Duration::ZERO);
    }
}
