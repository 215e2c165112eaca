//! The one signal between the guest's init and the VMM about templates (see
//! `vmm::template`): the init writes `POINT_VALUE` to I/O port `POINT_PORT`
//! once, after the kernel filesystems are mounted and the network
//! interfaces configured (their addresses are the same in every run), and
//! before it opens any connection. A VMM that records a template saves the
//! VM at that write; any other VMM ignores it. What a run must not share with the template (the
//! clock, the random state) comes with the run spec.

/// The I/O port the init writes; unused by any device the guest has.
pub const POINT_PORT: u16 = 0x5c0;
/// The byte the init writes there.
pub const POINT_VALUE: u8 = 0x5a;
/// The kernel argument of a boot that records a template: the init then
/// pages in its own code before the point, so every run resumed from the
/// template finds it in memory. Other boots leave it to be paged in as it
/// runs.
pub const RECORDING_ARG: &str = "stockade.recording";
/// Bytes of host entropy each run spec carries for the guest's random pool.
pub const SEED_LEN: usize = 64;

/// The host's wall clock when it sent the run spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HostClock {
    pub secs: i64,
    pub nanos: u32,
}

impl HostClock {
    pub fn now() -> HostClock {
        let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        HostClock { secs: i64::try_from(since.as_secs()).unwrap_or(i64::MAX), nanos: since.subsec_nanos() }
    }
}
