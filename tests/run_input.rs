//! Bad input to `stockade run`: a clear message and status 125, no VM needed.

use std::path::Path;

use crate::util::{TempDir, stockade, text};

#[test]
fn memory_zero_is_refused() {
    let dir = TempDir::new("mem0");
    let out = stockade(dir.path(), &["run", "--memory", "0", "--", "true"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(text(&out.stderr).contains("--memory 0 is too small"), "{}", text(&out.stderr));
}

#[test]
fn missing_command_is_a_usage_error() {
    let dir = TempDir::new("nocmd");
    let out = stockade(dir.path(), &["run"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(text(&out.stderr).contains("COMMAND"), "{}", text(&out.stderr));
}

#[test]
fn missing_kernel_names_the_fix() {
    let dir = TempDir::new("nokernel");
    let missing = dir.path().join("vmlinux");
    let out = stockade(dir.path(), &["run", "--kernel", missing.to_str().unwrap(), "--", "true"]);
    assert_eq!(out.status.code(), Some(125));
    let err = text(&out.stderr);
    assert!(err.contains("vmlinux") && (err.contains("cannot read") || err.contains("/dev/kvm")), "{err}");
}

#[test]
fn pvm_host_refuses_a_standard_kernel() {
    if !Path::new("/sys/module/kvm_pvm").exists() {
        eprintln!("skipping pvm_host_refuses_a_standard_kernel: this host's KVM is not PVM");
        return;
    }
    let dir = TempDir::new("pvm");
    let out = stockade(dir.path(), &["run", "--", "true"]);
    assert_eq!(out.status.code(), Some(125));
    let err = text(&out.stderr);
    assert!(err.contains("PVM") && err.contains("stockade doctor"), "{err}");
}
