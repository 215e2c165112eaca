//! The proxy's memory budget for bodies it holds whole (registry metadata,
//! sign-in requests and answers): one count of bytes for every connection
//! at once, so a guest opening a thousand of them cannot make the host run
//! out of memory. Bytes are charged as they are read; past the budget the
//! read is refused at once, never waited for.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use thiserror::Error;

use crate::util::text::human_bytes;

/// Bytes the proxy may hold in buffered bodies, across all connections.
#[derive(Clone)]
pub struct Budget {
    inner: Arc<Inner>,
}

struct Inner {
    limit: u64,
    used: AtomicU64,
}

#[derive(Debug, Error, PartialEq, Eq)]
#[error(
    "the proxy already holds {} of request and response bodies in memory, its limit; \
     try again when other requests finish",
    human_bytes(*limit)
)]
pub struct Exhausted {
    pub limit: u64,
}

impl Budget {
    pub fn new(limit: u64) -> Budget {
        Budget { inner: Arc::new(Inner { limit, used: AtomicU64::new(0) }) }
    }

    /// A charge of nothing yet, to grow as bytes are read.
    pub fn charge(&self) -> Charge {
        Charge { inner: self.inner.clone(), bytes: 0 }
    }

    /// Bytes charged now.
    #[cfg(test)]
    pub fn used(&self) -> u64 {
        self.inner.used.load(Ordering::Relaxed)
    }
}

/// Bytes held against the budget until this is dropped.
pub struct Charge {
    inner: Arc<Inner>,
    bytes: u64,
}

impl Charge {
    /// Adds `bytes`, or refuses when the budget has not that much left.
    pub fn grow(&mut self, bytes: u64) -> Result<(), Exhausted> {
        let limit = self.inner.limit;
        self.inner
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&total| total <= limit)
            })
            .map_err(|_| Exhausted { limit })?;
        self.bytes += bytes;
        Ok(())
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.inner.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_beyond_the_budget_are_refused_and_dropped_ones_freed() {
        let budget = Budget::new(100);
        let mut a = budget.charge();
        a.grow(60).unwrap();
        let mut b = budget.charge();
        assert_eq!(b.grow(41), Err(Exhausted { limit: 100 }));
        b.grow(40).unwrap();
        assert_eq!(budget.used(), 100);
        assert!(Exhausted { limit: 256 << 20 }.to_string().contains("256.0 MiB"));
        drop(a);
        assert_eq!(budget.used(), 40);
        b.grow(60).unwrap();
        drop(b);
        assert_eq!(budget.used(), 0);
    }
}
