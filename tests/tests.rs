//! stockade's integration tests: one binary, one module per concern.

mod rig;
mod util;

mod cli;
mod doctor;
mod rig_selftest;
