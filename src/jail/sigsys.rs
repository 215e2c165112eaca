//! Reports a thread stopped by its seccomp allowlist: which thread, which
//! system call, then ends the VMM. The handler only reads its arguments and
//! a thread-local, formats into a stack buffer, and calls write and _exit,
//! all async-signal-safe and allowed by every filter.

use std::cell::Cell;
use std::io;

use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};

thread_local! {
    /// The kind of the current thread, for the report.
    static KIND: Cell<&'static str> = const { Cell::new("main") };
}

/// The VMM's exit status after a forbidden system call.
const EXIT_FORBIDDEN: i32 = 159;

/// Names the calling thread's kind in reports.
pub fn set_thread_kind(name: &'static str) {
    KIND.with(|k| k.set(name));
}

/// The SIGSYS fields of `siginfo_t` (the `_sigsys` member of its union).
#[repr(C)]
struct SigsysInfo {
    signo: libc::c_int,
    errno: libc::c_int,
    code: libc::c_int,
    call_addr: *mut libc::c_void,
    syscall: libc::c_int,
    arch: libc::c_uint,
}

extern "C" fn on_sigsys(_signal: libc::c_int, info: *mut libc::siginfo_t, _context: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo_t for a SA_SIGINFO handler;
    // for SIGSYS its union holds the _sigsys member laid out as SigsysInfo,
    // which is no larger than siginfo_t.
    let nr = unsafe { (*(info as *const SigsysInfo)).syscall };
    let mut buf = [0u8; 256];
    let mut len = 0;
    let mut put = |bytes: &[u8]| {
        let n = bytes.len().min(buf.len() - len);
        buf[len..len + n].copy_from_slice(&bytes[..n]);
        len += n;
    };
    put(b"stockade: error: the VMM's ");
    put(KIND.with(|k| k.get()).as_bytes());
    put(b" thread made system call ");
    let mut digits = [0u8; 12];
    put(format_int(nr, &mut digits));
    put(b", which its seccomp allowlist forbids; the VM was stopped (please report this)\n");
    // SAFETY: write and _exit are async-signal-safe; `buf[..len]` is
    // initialised memory owned by this frame.
    unsafe {
        libc::write(libc::STDERR_FILENO, buf.as_ptr().cast(), len);
        libc::_exit(EXIT_FORBIDDEN);
    }
}

/// Decimal digits of `n` in `out`, without allocating.
fn format_int(n: i32, out: &mut [u8; 12]) -> &[u8] {
    let mut value = i64::from(n).unsigned_abs();
    let mut i = out.len();
    loop {
        i -= 1;
        out[i] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            break;
        }
    }
    if n < 0 {
        i -= 1;
        out[i] = b'-';
    }
    &out[i..]
}

/// Installs the report for the whole process.
pub fn install() -> io::Result<()> {
    let action = SigAction::new(SigHandler::SigAction(on_sigsys), SaFlags::SA_SIGINFO, SigSet::empty());
    // SAFETY: the handler only does async-signal-safe work (see above) and
    // replaces no handler that other code relies on.
    unsafe { sigaction(Signal::SIGSYS, &action) }.map_err(io::Error::from)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_integers_without_allocating() {
        let mut d = [0u8; 12];
        assert_eq!(format_int(0, &mut d), b"0");
        assert_eq!(format_int(41, &mut d), b"41");
        assert_eq!(format_int(-1, &mut d), b"-1");
        assert_eq!(format_int(i32::MIN, &mut d), b"-2147483648");
    }
}
