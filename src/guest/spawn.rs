//! Starting the command without copying the init.
//!
//! The child shares the init's memory (`clone` with `CLONE_VM |
//! CLONE_VFORK`) and the init's thread waits until the child has exec'd or
//! failed. A fork would copy the init's page tables and then take a
//! copy-on-write fault for each page the init's threads write; in a restored
//! guest every fresh page is also a nested page fault.
//!
//! Sharing memory puts rules on the child: it only reads what was prepared
//! here before the clone, allocates nothing, and calls the kernel directly
//! (glibc's `setuid` would try to change the init's other threads too).

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicI32, Ordering};

use nix::sched::CloneFlags;
use nix::sys::wait::waitpid;
use nix::unistd::Pid;

/// The child's stack. It runs a few frames of syscalls before exec.
const STACK_SIZE: usize = 64 * 1024;

/// Where a command name without a slash is searched when the command's
/// environment has no PATH (glibc's default).
const DEFAULT_PATH: &str = "/bin:/usr/bin";

/// The signal numbers the kernel knows (1..=64 on x86-64).
const SIGNALS: i32 = 64;

/// How the command relates to terminals and job control.
pub enum Session {
    /// A process group of its own, so a signal can reach everything it starts.
    Group,
    /// A new session whose controlling terminal is its stdin.
    Terminal,
}

/// Everything the child needs, prepared before the clone.
pub struct Spawn {
    argv: Vec<CString>,
    env: Vec<CString>,
    /// The paths tried in order: the program itself when it names a path,
    /// else the program in each directory of the command's PATH.
    candidates: Vec<CString>,
    cwd: CString,
    uid: u32,
    gid: u32,
    session: Session,
    stdio: [OwnedFd; 3],
    cgroup_procs: Option<RawFd>,
}

impl Spawn {
    /// Prepares to run `argv` with exactly `env`, in `cwd`, as `uid`/`gid`,
    /// with `stdio` as its descriptors 0, 1 and 2.
    pub fn new(
        argv: &[String],
        env: &[(String, String)],
        cwd: &str,
        uid: u32,
        gid: u32,
        stdio: [OwnedFd; 3],
    ) -> io::Result<Spawn> {
        let program = argv.first().ok_or_else(|| invalid("no command given"))?;
        let argv = argv.iter().map(|a| c_string(a.as_bytes())).collect::<io::Result<Vec<_>>>()?;
        let env = env.iter().map(|(k, v)| c_string(format!("{k}={v}").as_bytes())).collect::<io::Result<Vec<_>>>()?;
        let path = env_path(&env);
        Ok(Spawn {
            candidates: candidates(program, path.as_deref())?,
            argv,
            env,
            cwd: c_string(cwd.as_bytes())?,
            uid,
            gid,
            session: Session::Group,
            stdio,
            cgroup_procs: None,
        })
    }

    pub fn session(mut self, session: Session) -> Spawn {
        self.session = session;
        self
    }

    /// Has the child join the cgroup whose `cgroup.procs` is open as `procs`
    /// (if any) before it drops root, so nothing the command starts escapes it.
    pub fn cgroup(mut self, procs: Option<RawFd>) -> Spawn {
        self.cgroup_procs = procs;
        self
    }

    /// Starts the command and returns its pid once it runs the program, or
    /// the error that kept it from running (ENOENT when no candidate exists).
    pub fn spawn(self) -> io::Result<Pid> {
        // The child moves these onto 0, 1 and 2; a source already below 3
        // could be overwritten by an earlier move, so lift it first.
        let mut stdio_fds = [0; 3];
        let mut lifted = Vec::new();
        for (slot, fd) in stdio_fds.iter_mut().zip(&self.stdio) {
            *slot = fd.as_raw_fd();
            if *slot < 3 {
                // SAFETY: F_DUPFD_CLOEXEC on a descriptor we own returns a new
                // one, which we own from here on (it closes with `lifted`).
                let dup = unsafe { libc::fcntl(*slot, libc::F_DUPFD_CLOEXEC, 3) };
                if dup < 0 {
                    return Err(io::Error::last_os_error());
                }
                // SAFETY: `dup` was just returned by fcntl and is open.
                lifted.push(unsafe { OwnedFd::from_raw_fd(dup) });
                *slot = dup;
            }
        }
        let argv = null_terminated(&self.argv);
        let envp = null_terminated(&self.env);
        let candidates: Vec<*const libc::c_char> = self.candidates.iter().map(|c| c.as_ptr()).collect();
        // For a file without a `#!` line, as execvp does: /bin/sh runs it.
        let mut script_argv: Vec<*const libc::c_char> = Vec::with_capacity(argv.len() + 1);
        script_argv.push(c"/bin/sh".as_ptr());
        script_argv.extend_from_slice(&argv);
        let child = Child {
            argv: &argv,
            envp: &envp,
            candidates: &candidates,
            script_argv: script_argv.as_mut_ptr(),
            cwd: &self.cwd,
            uid: self.uid,
            gid: self.gid,
            drop_groups: nix::unistd::getuid().is_root(),
            session: &self.session,
            stdio: stdio_fds,
            cgroup_procs: self.cgroup_procs,
        };
        let failure = AtomicI32::new(0);
        let mut stack = vec![0u8; STACK_SIZE];

        // No handler of ours may run on the child's side of the shared
        // memory: signals stay blocked until the child has reset them.
        let all = nix::sys::signal::SigSet::all();
        let mut previous = nix::sys::signal::SigSet::empty();
        nix::sys::signal::pthread_sigmask(nix::sys::signal::SigmaskHow::SIG_SETMASK, Some(&all), Some(&mut previous))
            .map_err(io::Error::from)?;
        // SAFETY: CLONE_VFORK suspends this thread until the child execs or
        // exits, so everything `child` borrows outlives its use. The child
        // runs `Child::exec`, which reads only that prepared data, makes raw
        // syscalls, and never returns.
        let cloned = unsafe {
            nix::sched::clone(
                Box::new(|| child.exec(&failure)),
                &mut stack,
                CloneFlags::CLONE_VM | CloneFlags::CLONE_VFORK,
                Some(libc::SIGCHLD),
            )
        };
        let _ = nix::sys::signal::pthread_sigmask(nix::sys::signal::SigmaskHow::SIG_SETMASK, Some(&previous), None);
        let pid = cloned.map_err(io::Error::from)?;
        match failure.load(Ordering::Acquire) {
            0 => Ok(pid),
            errno => {
                let _ = waitpid(pid, None);
                Err(io::Error::from_raw_os_error(errno))
            }
        }
    }
}

/// The child's view: raw pointers and numbers only.
struct Child<'a> {
    argv: &'a [*const libc::c_char],
    envp: &'a [*const libc::c_char],
    candidates: &'a [*const libc::c_char],
    script_argv: *mut *const libc::c_char,
    cwd: &'a CString,
    uid: u32,
    gid: u32,
    drop_groups: bool,
    session: &'a Session,
    stdio: [RawFd; 3],
    cgroup_procs: Option<RawFd>,
}

impl Child<'_> {
    fn exec(&self, failure: &AtomicI32) -> isize {
        let errno = self.prepare_and_exec();
        failure.store(errno, Ordering::Release);
        // SAFETY: ends the child without running anything of the shared
        // process (no atexit handlers, no stdio flush).
        unsafe { libc::_exit(127) }
    }

    /// Returns only on failure, with the errno that says why.
    fn prepare_and_exec(&self) -> i32 {
        // SAFETY: every call below is a raw syscall on numbers or on memory
        // prepared before the clone that stays alive while this thread of
        // the init is suspended; none allocates or takes a lock.
        unsafe {
            if let Some(procs) = self.cgroup_procs {
                // "0" moves the writing process: the child itself.
                if libc::write(procs, c"0".as_ptr().cast(), 1) != 1 {
                    return errno();
                }
            }
            for (target, &fd) in self.stdio.iter().enumerate() {
                if libc::syscall(libc::SYS_dup2, fd, target) < 0 {
                    return errno();
                }
            }
            if self.drop_groups && libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) < 0 {
                return errno();
            }
            if libc::syscall(libc::SYS_setgid, self.gid) < 0 || libc::syscall(libc::SYS_setuid, self.uid) < 0 {
                return errno();
            }
            if libc::syscall(libc::SYS_chdir, self.cwd.as_ptr()) < 0 {
                return errno();
            }
            match self.session {
                Session::Group => {
                    if libc::syscall(libc::SYS_setpgid, 0, 0) < 0 {
                        return errno();
                    }
                }
                Session::Terminal => {
                    if libc::syscall(libc::SYS_setsid) < 0 || libc::syscall(libc::SYS_ioctl, 0, libc::TIOCSCTTY, 0) < 0
                    {
                        return errno();
                    }
                }
            }
            // The command starts with every signal at its default and none
            // blocked. The kernel's sigaction layout: handler, flags,
            // restorer, mask; all zero is SIG_DFL.
            let default = [0u64; 4];
            for signal in 1..=SIGNALS {
                if signal != libc::SIGKILL && signal != libc::SIGSTOP {
                    libc::syscall(libc::SYS_rt_sigaction, signal, default.as_ptr(), std::ptr::null::<u64>(), 8);
                }
            }
            let none = 0u64;
            libc::syscall(libc::SYS_rt_sigprocmask, libc::SIG_SETMASK, &none, std::ptr::null::<u64>(), 8);
            self.exec_first_found()
        }
    }

    /// Tries each candidate as execvp does: a missing one moves on, one
    /// without permission moves on but is remembered, any other error
    /// stops the search.
    ///
    /// # Safety
    /// Called only from the child, with the pointers prepared by `spawn`.
    unsafe fn exec_first_found(&self) -> i32 {
        let mut denied = false;
        for &path in self.candidates {
            // SAFETY: path, argv and envp are NUL-terminated strings in
            // null-terminated arrays that live until the child execs.
            unsafe { libc::syscall(libc::SYS_execve, path, self.argv.as_ptr(), self.envp.as_ptr()) };
            match errno() {
                libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT => {}
                libc::EACCES => denied = true,
                libc::ENOEXEC => {
                    // SAFETY: slot 1 of the script's argv holds the program's
                    // name; the init is suspended, so the child may point it
                    // at the file found.
                    unsafe {
                        *self.script_argv.add(1) = path;
                        libc::syscall(libc::SYS_execve, c"/bin/sh".as_ptr(), self.script_argv, self.envp.as_ptr());
                    }
                    return errno();
                }
                other => return other,
            }
        }
        if denied { libc::EACCES } else { libc::ENOENT }
    }
}

fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

fn invalid(message: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message)
}

fn c_string(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| invalid("an argument, variable or path contains a NUL byte"))
}

fn null_terminated(strings: &[CString]) -> Vec<*const libc::c_char> {
    strings.iter().map(|s| s.as_ptr()).chain(std::iter::once(std::ptr::null())).collect()
}

/// The PATH the command's own environment sets, if any.
fn env_path(env: &[CString]) -> Option<Vec<u8>> {
    env.iter().rev().find_map(|entry| entry.as_bytes().strip_prefix(b"PATH=").map(<[u8]>::to_vec))
}

fn candidates(program: &str, path: Option<&[u8]>) -> io::Result<Vec<CString>> {
    if program.is_empty() {
        return Err(io::Error::from_raw_os_error(libc::ENOENT));
    }
    if program.contains('/') {
        return Ok(vec![c_string(program.as_bytes())?]);
    }
    let path = path.unwrap_or(DEFAULT_PATH.as_bytes());
    path.split(|&b| b == b':')
        .map(|dir| {
            // An empty entry is the working directory.
            let dir = if dir.is_empty() { OsStr::new(".") } else { OsStr::from_bytes(dir) };
            c_string(std::path::Path::new(dir).join(program).as_os_str().as_bytes())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::os::unix::fs::PermissionsExt;

    use nix::sys::wait::WaitStatus;

    use super::*;

    /// Runs `argv` with stdout and stderr on one pipe; returns the output
    /// and the exit code, or the spawn error.
    fn run(argv: &[&str], env: &[(&str, &str)], cwd: &std::path::Path) -> io::Result<(String, i32)> {
        let (reader, writer) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        let stdin = std::fs::File::open("/dev/null")?;
        let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
        let env: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let stdio = [OwnedFd::from(stdin), writer.try_clone()?, writer];
        let uid = nix::unistd::getuid().as_raw();
        let gid = nix::unistd::getgid().as_raw();
        let pid = Spawn::new(&argv, &env, cwd.to_str().unwrap(), uid, gid, stdio)?.spawn()?;
        let mut out = String::new();
        std::fs::File::from(reader).read_to_string(&mut out)?;
        match waitpid(pid, None).unwrap() {
            WaitStatus::Exited(_, code) => Ok((out, code)),
            other => panic!("unexpected status {other:?}"),
        }
    }

    #[test]
    fn runs_with_exactly_the_given_environment_directory_and_group() {
        let dir = tempfile::tempdir().unwrap();
        let script = "echo \"$GREETING\" \"$HOME\"; pwd; [ \"$(cut -d' ' -f5 /proc/$$/stat)\" = $$ ] && echo leader";
        let (out, code) =
            run(&["sh", "-c", script], &[("PATH", "/usr/bin:/bin"), ("GREETING", "hi")], dir.path()).unwrap();
        assert_eq!(code, 0);
        let canonical = dir.path().canonicalize().unwrap();
        assert_eq!(out, format!("hi \n{}\nleader\n", canonical.display()));
    }

    #[test]
    fn searches_the_commands_path_not_the_inits() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let tool = bin.join("only-here");
        std::fs::write(&tool, "#!/bin/sh\necho found \"$0\"\n").unwrap();
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = format!("/nonexistent:{}:/usr/bin:/bin", bin.display());
        let (out, code) = run(&["only-here"], &[("PATH", &path)], dir.path()).unwrap();
        assert_eq!((out.as_str(), code), (format!("found {}\n", tool.display()).as_str(), 0));

        let err = run(&["only-here"], &[("PATH", "/usr/bin:/bin")], dir.path()).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOENT));
    }

    #[test]
    fn a_file_without_an_interpreter_line_runs_under_sh_and_args_follow() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("plain");
        std::fs::write(&script, "echo plain \"$@\"\n").unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let (out, code) = run(&["./plain", "a", "b c"], &[("PATH", "/usr/bin:/bin")], dir.path()).unwrap();
        assert_eq!((out.as_str(), code), ("plain a b c\n", 0));
    }

    #[test]
    fn reports_why_a_command_could_not_start() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        std::fs::write(&data, "not a program").unwrap();
        let denied = run(&["./data"], &[], dir.path()).unwrap_err();
        assert_eq!(denied.raw_os_error(), Some(libc::EACCES));
        let missing = run(&["./missing"], &[], dir.path()).unwrap_err();
        assert_eq!(missing.raw_os_error(), Some(libc::ENOENT));
        let gone = run(&["true"], &[], &dir.path().join("no-such-dir")).unwrap_err();
        assert_eq!(gone.raw_os_error(), Some(libc::ENOENT));
        let nul = Spawn::new(&["a\0b".into()], &[], "/", 0, 0, stdio_null()).err().unwrap();
        assert_eq!(nul.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn the_command_starts_with_default_signals() {
        // The test harness, like the init, ignores SIGPIPE; the command must not.
        let dir = tempfile::tempdir().unwrap();
        let (out, code) =
            run(&["sh", "-c", "grep -E '^Sig(Ign|Blk)' /proc/self/status"], &[("PATH", "/usr/bin:/bin")], dir.path())
                .unwrap();
        assert_eq!(code, 0);
        assert_eq!(out, "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n");
    }

    fn stdio_null() -> [OwnedFd; 3] {
        let null = || OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        [null(), null(), null()]
    }
}
