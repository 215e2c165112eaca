//! Small helpers every layer shares: SHA-256 digests, sparse files' extents, text made safe and
//! readable, the colour choice, free space on a filesystem.
//!
//! This module sits at the bottom: it imports nothing of ours, so anything
//! may use it without making a cycle (tests/layers.rs checks).
#![forbid(unsafe_code)]

pub mod color;
pub mod digest;
pub mod extent;
pub mod space;
pub mod text;
