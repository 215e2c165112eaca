//! How long the worker keeps watching the request ring after it served it,
//! before it turns the guest's kicks back on and sleeps.
//!
//! A program that reads files one after the other sends its next request
//! soon after its last reply. Caught while the worker still watches, that
//! request costs the guest no kick (a VM exit) and the worker no wake-up.
//! The watch adapts, as KVM's halt polling does: when a kick comes shortly
//! after the worker stopped watching, the next watch lasts long enough to
//! catch such a gap; when the guest stays quiet longer than the longest
//! watch, the next one is halved, down to none. A worker that shares its
//! CPU with the guest's vCPUs never watches: its spinning would take their
//! time.

use std::time::{Duration, Instant};

/// The longest watch: KVM's default for halt polling.
pub(super) const LONGEST: Duration = Duration::from_micros(200);
/// A watch shorter than this is not worth its CPU: none instead.
const SHORTEST: Duration = Duration::from_micros(10);

pub(super) struct Linger {
    longest: Duration,
    window: Duration,
    /// When the worker last went to sleep, kicks on, after a call that
    /// served requests: the gap to the next kick tells how long a watch
    /// would have caught it.
    slept: Option<Instant>,
    /// That gap, heard at the kick, learned from only if the kick brought
    /// requests: empty kicks must not make the worker watch.
    heard: Option<Duration>,
}

impl Linger {
    /// A worker whose watches last at most `longest` (zero: never).
    pub(super) fn new(longest: Duration) -> Linger {
        Linger { longest, window: Duration::ZERO, slept: None, heard: None }
    }

    /// A worker that never watches.
    pub(super) fn never() -> Linger {
        Linger::new(Duration::ZERO)
    }

    /// A worker whose next watch lasts `window`, as if it had learned it.
    #[cfg(test)]
    pub(super) fn watching(window: Duration) -> Linger {
        Linger { longest: window, window, slept: None, heard: None }
    }

    /// How long the next watch lasts.
    #[cfg(test)]
    pub(super) fn window(&self) -> Duration {
        self.window
    }

    /// A kick woke the worker (its own kicks find nothing to hear: it
    /// did not sleep before them).
    pub(super) fn kicked(&mut self) {
        self.heard = self.slept.take().map(|slept| self.window + slept.elapsed());
    }

    /// The first pass after the kick took requests (`brought`) or none:
    /// only a kick that brought some teaches how long the guest takes
    /// between a reply and its next request.
    pub(super) fn learn(&mut self, brought: bool) {
        let Some(gap) = self.heard.take().filter(|_| brought) else {
            return;
        };
        self.window = if gap <= self.longest {
            (gap + gap / 4).clamp(SHORTEST, self.longest)
        } else if self.window / 2 < SHORTEST {
            Duration::ZERO
        } else {
            self.window / 2
        };
    }

    /// Watches until `waiting` says a request waits (true) or the window
    /// passes (false), and returns how long it spun.
    pub(super) fn watch(&mut self, mut waiting: impl FnMut() -> bool) -> (bool, Duration) {
        if self.window.is_zero() {
            return (false, Duration::ZERO);
        }
        let start = Instant::now();
        loop {
            if waiting() {
                return (true, start.elapsed());
            }
            let spun = start.elapsed();
            if spun >= self.window {
                return (false, spun);
            }
            std::hint::spin_loop();
        }
    }

    /// The worker goes to sleep until the next kick, having served
    /// requests since the last one.
    pub(super) fn sleeps(&mut self) {
        self.slept = Some(Instant::now());
    }
}

/// The longest watch for a worker beside `vcpus` vCPUs and `others`
/// threads of the file servers that may spin too (helpers, another
/// device's watching worker) on this host: none unless a CPU is left for
/// the worker itself. Read before the jail closes (finding the CPUs reads
/// cgroup files).
pub(super) fn longest_beside(vcpus: u8, others: usize) -> Duration {
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    if cpus > usize::from(vcpus) + others { LONGEST } else { Duration::ZERO }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One kick that brought requests, `gap` after the worker slept
    /// (having watched for its window in vain).
    fn kick_after(linger: &mut Linger, gap: Duration) {
        assert!(!linger.watch(|| false).0);
        linger.sleeps();
        std::thread::sleep(gap);
        linger.kicked();
        linger.learn(true);
    }

    #[test]
    fn a_worker_that_never_watches_never_spins() {
        let mut linger = Linger::never();
        for _ in 0..3 {
            let mut asked = 0;
            let watched = linger.watch(|| {
                asked += 1;
                true
            });
            assert_eq!(watched, (false, Duration::ZERO));
            assert_eq!(asked, 0);
            linger.sleeps();
            std::thread::sleep(Duration::from_micros(50));
            linger.kicked();
            linger.learn(true);
            assert_eq!(linger.window(), Duration::ZERO);
        }
    }

    #[test]
    fn a_kick_soon_after_sleeping_lengthens_the_watch_to_catch_it() {
        let mut linger = Linger::new(Duration::from_millis(50));
        kick_after(&mut linger, Duration::from_millis(2));
        let window = linger.window();
        assert!(window >= Duration::from_millis(2) && window <= Duration::from_millis(50), "{window:?}");
        // The same gap again is caught.
        let start = Instant::now();
        let (caught, spun) = linger.watch(|| start.elapsed() >= Duration::from_millis(2));
        assert!(caught);
        assert!(spun >= Duration::from_millis(1), "the watch waited for it: {spun:?}");
        assert_eq!(linger.window(), window, "a catch keeps the watch as it is");
    }

    #[test]
    fn a_quiet_guest_halves_the_watch_down_to_none() {
        let mut linger = Linger::new(Duration::from_millis(4));
        kick_after(&mut linger, Duration::from_millis(1));
        let mut window = linger.window();
        assert!(window > Duration::ZERO);
        while !window.is_zero() {
            kick_after(&mut linger, Duration::from_millis(10));
            assert!(linger.window() < window, "{:?} then {:?}", window, linger.window());
            window = linger.window();
        }
        // With no watch, a long quiet changes nothing; a short gap starts one.
        kick_after(&mut linger, Duration::from_millis(10));
        assert_eq!(linger.window(), Duration::ZERO);
        kick_after(&mut linger, Duration::ZERO);
        assert!(linger.window() >= SHORTEST);
    }

    #[test]
    fn kicks_that_bring_nothing_or_follow_no_sleep_teach_nothing() {
        let mut linger = Linger::new(LONGEST);
        linger.kicked();
        linger.learn(true);
        assert_eq!(linger.window(), Duration::ZERO, "no sleep before the kick");
        linger.sleeps();
        linger.kicked();
        linger.learn(false);
        assert_eq!(linger.window(), Duration::ZERO, "an empty kick");
        linger.learn(true);
        assert_eq!(linger.window(), Duration::ZERO, "what an empty kick heard is gone");
    }

    #[test]
    fn the_worker_watches_only_with_a_cpu_of_its_own() {
        let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        let vcpus = u8::try_from(cpus.min(200)).unwrap();
        assert_eq!(longest_beside(vcpus, 0), Duration::ZERO);
        assert_eq!(longest_beside(u8::MAX, 0), Duration::ZERO);
        if cpus >= 2 {
            assert_eq!(longest_beside(vcpus - 1, 0), LONGEST);
            assert_eq!(longest_beside(vcpus - 1, 1), Duration::ZERO);
        }
    }
}
