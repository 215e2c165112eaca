//! Landlock: filesystem access control for unprivileged processes.

use std::io;

/// `LANDLOCK_CREATE_RULESET_VERSION`: ask for the ABI version instead of
/// creating a ruleset.
const CREATE_RULESET_VERSION: libc::c_uint = 1 << 0;

/// The Landlock ABI version the running kernel supports.
pub fn abi_version() -> io::Result<u32> {
    // SAFETY: with a null attribute pointer, size 0 and the VERSION flag the
    // syscall reads no memory and returns the ABI version or -1 with errno.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            CREATE_RULESET_VERSION,
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        u32::try_from(ret).map_err(|_| io::Error::other("landlock returned an out-of-range ABI"))
    }
}

/// What to tell the user when Landlock is missing, from the errno we got.
pub fn unavailable_fix(err: &io::Error) -> &'static str {
    match err.raw_os_error() {
        Some(libc::EOPNOTSUPP) => {
            "Landlock is built in but disabled: add 'landlock' to the lsm= kernel parameter and reboot"
        }
        _ => "this kernel has no Landlock (needs Linux 5.13+ with CONFIG_SECURITY_LANDLOCK)",
    }
}
