//! Which KVM the host has. A hardware KVM (VT-x/AMD-V) boots any x86_64 guest;
//! PVM (`kvm_pvm`) runs only kernels built as PVM guests, because it executes
//! guest supervisor code by emulation.

use std::fmt;
use std::io;
use std::path::Path;

/// Path of the KVM device node.
pub const KVM_DEVICE: &str = "/dev/kvm";

/// The kind of KVM implementation behind /dev/kvm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvmKind {
    /// Hardware-assisted virtualization (kvm_intel or kvm_amd).
    Hardware(Vendor),
    /// Pagetable-based virtual machines: guests must be PVM guest kernels.
    Pvm,
    /// /dev/kvm exists but no known vendor module is loaded.
    Unknown,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vendor {
    Intel,
    Amd,
}

impl fmt::Display for KvmKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KvmKind::Hardware(Vendor::Intel) => write!(f, "hardware (Intel VT-x, kvm_intel)"),
            KvmKind::Hardware(Vendor::Amd) => write!(f, "hardware (AMD-V, kvm_amd)"),
            KvmKind::Pvm => write!(f, "PVM (kvm_pvm, no hardware virtualization)"),
            KvmKind::Unknown => write!(f, "unknown (no kvm_intel, kvm_amd or kvm_pvm module)"),
        }
    }
}

impl KvmKind {
    /// Whether an ordinary x86_64 kernel (not built as a PVM guest) can boot.
    pub fn boots_standard_guest(self) -> bool {
        matches!(self, KvmKind::Hardware(_))
    }
}

/// Decides the KVM kind from the names of loaded kernel modules. PVM wins when
/// present, because on a PVM host the vendor module may also be loaded while
/// the hardware extensions are not exposed to us.
pub fn classify(loaded_modules: &[&str]) -> KvmKind {
    let has = |name: &str| loaded_modules.contains(&name);
    if has("kvm_pvm") {
        KvmKind::Pvm
    } else if has("kvm_amd") {
        KvmKind::Hardware(Vendor::Amd)
    } else if has("kvm_intel") {
        KvmKind::Hardware(Vendor::Intel)
    } else {
        KvmKind::Unknown
    }
}

/// Reads the loaded KVM modules from /sys/module and classifies them.
pub fn detect_kind() -> KvmKind {
    detect_kind_in(Path::new("/sys/module"))
}

fn detect_kind_in(sys_module: &Path) -> KvmKind {
    let candidates = ["kvm_pvm", "kvm_amd", "kvm_intel"];
    let loaded: Vec<&str> = candidates.into_iter().filter(|m| sys_module.join(m).exists()).collect();
    classify(&loaded)
}

/// Whether this user can use /dev/kvm.
#[derive(Debug)]
pub enum DeviceAccess {
    Usable,
    Missing,
    PermissionDenied,
    Failed(io::Error),
}

/// Opens /dev/kvm read-write, the way the VMM will.
pub fn check_device() -> DeviceAccess {
    match std::fs::OpenOptions::new().read(true).write(true).open(KVM_DEVICE) {
        Ok(_) => DeviceAccess::Usable,
        Err(e) if e.kind() == io::ErrorKind::NotFound => DeviceAccess::Missing,
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => DeviceAccess::PermissionDenied,
        Err(e) => DeviceAccess::Failed(e),
    }
}

/// The command that fixes a permission problem on /dev/kvm for this user.
pub fn permission_fix() -> String {
    let user = std::env::var("USER").unwrap_or_else(|_| "$USER".to_string());
    format!("add yourself to the kvm group: sudo usermod -aG kvm {user}, then log in again")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pvm_module_means_pvm_even_with_vendor_module() {
        assert_eq!(classify(&["kvm_amd", "kvm_pvm"]), KvmKind::Pvm);
        assert!(!KvmKind::Pvm.boots_standard_guest());
    }

    #[test]
    fn vendor_modules_mean_hardware() {
        assert_eq!(classify(&["kvm_amd"]), KvmKind::Hardware(Vendor::Amd));
        assert_eq!(classify(&["kvm_intel"]), KvmKind::Hardware(Vendor::Intel));
        assert!(classify(&["kvm_intel"]).boots_standard_guest());
    }

    #[test]
    fn no_module_is_unknown() {
        assert_eq!(classify(&[]), KvmKind::Unknown);
    }

    #[test]
    fn reads_modules_from_a_sysfs_tree() {
        let dir = std::env::temp_dir().join(format!("stockade-kvm-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("kvm_intel")).unwrap();
        assert_eq!(detect_kind_in(&dir), KvmKind::Hardware(Vendor::Intel));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
