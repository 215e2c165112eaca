//! `stockade doctor` describes this host truthfully.

use std::path::Path;

use crate::util::{TempDir, stockade, text};

#[test]
fn reports_the_kind_of_kvm_this_host_has() {
    let dir = TempDir::new("doctor-kind");
    let out = stockade(dir.path(), &["doctor"]);
    let report = text(&out.stdout);
    if Path::new("/sys/module/kvm_pvm").exists() {
        assert!(report.contains("PVM"), "{report}");
        assert!(report.contains("standard guest kernel cannot boot here"), "{report}");
        assert_eq!(out.status.code(), Some(1), "doctor must not pass on PVM:\n{report}");
    } else if Path::new("/sys/module/kvm_amd").exists() {
        assert!(report.contains("AMD-V"), "{report}");
    } else if Path::new("/sys/module/kvm_intel").exists() {
        assert!(report.contains("VT-x"), "{report}");
    } else {
        assert!(!out.status.success(), "{report}");
    }
    for line in ["/dev/kvm", "guest kernel", "landlock", "seccomp", "disk space", "session store", "open files"] {
        assert!(report.contains(line), "missing {line}:\n{report}");
    }
}

#[test]
fn names_a_bad_kernel_path_and_the_fix() {
    let dir = TempDir::new("doctor-badkernel");
    let missing = dir.path().join("no-such-vmlinux");
    let out = stockade(dir.path(), &["doctor", "--kernel", missing.to_str().unwrap()]);
    let report = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{report}");
    assert!(report.contains("no-such-vmlinux"), "{report}");
    assert!(report.contains("fix:"), "{report}");
}

#[test]
fn rejects_a_kernel_that_is_not_a_vmlinux() {
    let dir = TempDir::new("doctor-bzimage");
    let fake = dir.path().join("bzImage");
    std::fs::write(&fake, b"MZ\x00\x00 not an ELF").unwrap();
    let out = stockade(dir.path(), &["doctor", "--kernel", fake.to_str().unwrap()]);
    let report = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1));
    assert!(report.contains("not an ELF vmlinux"), "{report}");
}
