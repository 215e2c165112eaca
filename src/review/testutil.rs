//! Test fixtures of the review; the staged change sets it reviews are
//! built with `changes::testutil`.

use super::summary::SummaryOptions;

/// Summary options that ignore this machine's global git excludes.
pub fn options() -> SummaryOptions {
    SummaryOptions { global_excludes: false, ..SummaryOptions::default() }
}
