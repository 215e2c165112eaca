//! The rig itself: a realistic userland, faithful statuses and output, and a
//! KVM guest of our own running where standard guests can boot.

use std::time::Duration;

use crate::rig;
use crate::util::stockade_bin;

const T: Duration = Duration::from_secs(120);

#[test]
fn rig_returns_status_stdout_and_stderr_separately() {
    let Some(rig) = rig::require("rig_returns_status_stdout_and_stderr_separately") else { return };
    let out = rig.sh("echo to-out; echo to-err >&2; exit 7", T);
    assert_eq!(out.status, 7, "{out}");
    assert_eq!(out.stdout, "to-out\n");
    assert_eq!(out.stderr, "to-err\n");
}

#[test]
fn rig_has_a_realistic_userland() {
    let Some(rig) = rig::require("rig_has_a_realistic_userland") else { return };
    let out = rig.sh(
        "set -e; sh -c 'true'; ls / >/dev/null; git --version; python3 -c 'print(6*7)'; \
         cd \"$(mktemp -d)\" && git init -q && echo ok",
        T,
    );
    assert_eq!(out.status, 0, "{out}");
    assert!(out.stdout.contains("git version"), "{out}");
    assert!(out.stdout.contains("42"), "{out}");
    assert!(out.stdout.trim_end().ends_with("ok"), "{out}");
}

#[test]
fn rig_runs_a_kvm_guest_of_ours() {
    let Some(rig) = rig::require("rig_runs_a_kvm_guest_of_ours") else { return };
    // doctor's probe creates a VM, runs a four-instruction guest and checks
    // its I/O and halt exits; in the rig it must find hardware (nested) KVM.
    let out = rig.sh(&format!("{} doctor", stockade_bin()), T);
    assert!(out.stdout.contains("a test guest ran and halted"), "{out}");
    assert!(out.stdout.contains("hardware (AMD-V") || out.stdout.contains("hardware (Intel"), "{out}");
    assert!(out.stdout.contains("standard guest kernels boot"), "{out}");
}
