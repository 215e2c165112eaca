//! Attacks on the writable shares' file server (an agent's state, a
//! policy's `rw` mounts) by a hostile guest root sending raw FUSE requests
//! on the request queue. Each goes through the device's queue processing,
//! the FUSE server, the Vfs, `WritableFs` and the bounded filesystem in
//! its writable mode, as the guest's requests do. The host directories
//! around the share stand for the rest of the host: nothing there may be
//! read, made, changed or removed.

use std::mem::size_of;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use fuse_backend_rs::abi::fuse_abi::{
    CreateIn, EntryOut, ForgetIn, FsOptions, LinkIn, MkdirIn, Opcode, OpenIn, OpenOut, ROOT_ID, ReadIn, ReleaseIn,
    RenameIn, WriteIn,
};
use fuse_backend_rs::api::Vfs;
use vm_memory::ByteValued;
use vmm_sys_util::tempdir::TempDir;

use super::attack_tests::{Guest, REQ_ADDR, RESP_ADDR, RESP_LEN, Reply, Worker, in_the_workers_jail};
use super::bounded::FdBudget;
use super::device::{Fs, Share};
use super::request::Access;
use super::secrets::Secrets;

impl Guest<Vfs> {
    /// A guest of the writable device serving `shares`, past FUSE_INIT.
    fn of(shares: &[Share], secrets: &Secrets) -> Guest<Vfs> {
        Guest::keeping(shares, secrets, None)
    }

    /// [`Guest::of`], the device keeping `margin` bytes free on the
    /// shares' filesystems instead of the staging margin.
    fn keeping(shares: &[Share], secrets: &Secrets, margin: Option<u64>) -> Guest<Vfs> {
        let budget = FdBudget { inodes: 64, handles: 64 };
        let fs = Fs::writable_within("attack-rw", shares, secrets, margin, budget).unwrap();
        let flags = FsOptions::all().bits() & 0xffff_ffff & !FsOptions::INIT_EXT.bits();
        Guest::past_init(fs.server, Access::Writable, flags)
    }

    /// A guest of one writable share of `host` at /rw.
    fn of_share(host: &Path) -> Guest<Vfs> {
        Guest::of(&[share("/rw", host)], &Secrets::default())
    }

    fn mkdir(&mut self, parent: u64, name: &[u8]) -> Reply {
        let body = [MkdirIn { mode: 0o755, umask: 0 }.as_slice(), &cstr(name)].concat();
        self.call(Opcode::Mkdir as u32, parent, &body)
    }

    /// FUSE_CREATE of `name` in `parent` with open `flags`: the entry and
    /// the handle, or the errno.
    fn create(&mut self, parent: u64, name: &[u8], flags: i32) -> Result<(u64, u64), i32> {
        let args = CreateIn { flags: flags.cast_unsigned(), mode: libc::S_IFREG | 0o644, umask: 0, fuse_flags: 0 };
        let reply = self.call(Opcode::Create as u32, parent, &[args.as_slice(), &cstr(name)].concat());
        if reply.header.error != 0 {
            return Err(reply.errno());
        }
        let entry: EntryOut = reply.obj();
        let open = OpenOut::from_slice(&reply.body[size_of::<EntryOut>()..][..size_of::<OpenOut>()]).unwrap();
        Ok((entry.nodeid, open.fh))
    }

    /// FUSE_OPEN of `node` with `flags`: the handle, or the errno.
    fn open_flags(&mut self, node: u64, flags: i32) -> Result<u64, i32> {
        let open = OpenIn { flags: flags.cast_unsigned(), fuse_flags: 0 };
        let reply = self.call(Opcode::Open as u32, node, open.as_slice());
        if reply.header.error != 0 {
            return Err(reply.errno());
        }
        Ok(reply.obj::<OpenOut>().fh)
    }

    fn release(&mut self, node: u64, fh: u64) -> i32 {
        self.call(Opcode::Release as u32, node, ReleaseIn { fh, ..Default::default() }.as_slice()).errno()
    }

    fn read_fh(&mut self, node: u64, fh: u64, size: u32) -> Reply {
        let read = ReadIn { fh, offset: 0, size, ..Default::default() };
        self.call(Opcode::Read as u32, node, read.as_slice())
    }

    fn write(&mut self, node: u64, fh: u64, offset: u64, data: &[u8]) -> Reply {
        let write = WriteIn { fh, offset, size: u32::try_from(data.len()).unwrap(), ..Default::default() };
        self.call(Opcode::Write as u32, node, &[write.as_slice(), data].concat())
    }

    fn unlink(&mut self, parent: u64, name: &[u8]) -> Reply {
        self.call(Opcode::Unlink as u32, parent, &cstr(name))
    }

    fn rename(&mut self, olddir: u64, oldname: &[u8], newdir: u64, newname: &[u8]) -> Reply {
        let body = [RenameIn { newdir }.as_slice(), &cstr(oldname), &cstr(newname)].concat();
        self.call(Opcode::Rename as u32, olddir, &body)
    }

    fn link(&mut self, node: u64, newparent: u64, newname: &[u8]) -> Reply {
        let body = [LinkIn { oldnodeid: node }.as_slice(), &cstr(newname)].concat();
        self.call(Opcode::Link as u32, newparent, &body)
    }

    fn symlink(&mut self, parent: u64, name: &[u8], target: &[u8]) -> Reply {
        self.call(Opcode::Symlink as u32, parent, &[cstr(name), cstr(target)].concat())
    }
}

fn cstr(name: &[u8]) -> Vec<u8> {
    [name, b"\0"].concat()
}

fn share(guest_path: &str, host: &Path) -> Share {
    Share { guest_path: guest_path.into(), host_path: host.to_path_buf(), record: None, limit: None }
}

/// A host directory holding the share `rw` and, beside it, the host's own
/// `secret.txt`, which the guest must never reach.
fn host() -> TempDir {
    let dir = TempDir::new_with_prefix(std::env::temp_dir().join("stockade-fs-wattack-")).unwrap();
    std::fs::create_dir(dir.as_path().join("rw")).unwrap();
    std::fs::write(dir.as_path().join("rw/file"), b"shared").unwrap();
    std::fs::write(dir.as_path().join("secret.txt"), b"HOST SECRET").unwrap();
    dir
}

/// The names in the host directory `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    names
}

/// The guest looks up ".." in the share's root (and "." to reach the
/// root under another node id, then ".." of that): the Vfs lets "." and
/// ".." through for lookups, and the host directory above the share would
/// become a node, in which the guest could read the host's files, make
/// new ones and remove them. Correct: EINVAL for every name that is not
/// one plain component, as for the other requests.
#[test]
fn dot_dot_never_leads_out_of_a_writable_share() {
    let dir = host();
    let outside = dir.as_path();
    let before = names(outside);
    let mut guest = Guest::of_share(&outside.join("rw"));
    let rw = guest.walk("rw");
    let above = guest.lookup(rw, b"..");
    if above.header.error == 0 {
        let above = above.obj::<EntryOut>().nodeid;
        let found = guest.lookup(above, b"secret.txt");
        if found.header.error == 0 {
            let secret = found.obj::<EntryOut>().nodeid;
            let read = guest.open_flags(secret, libc::O_RDONLY).map(|fh| guest.read_fh(secret, fh, 4096).body);
            eprintln!("read outside the share: {:?}", read.map(|r| String::from_utf8_lossy(&r).into_owned()));
        }
        let planted = guest.create(above, b"planted", libc::O_WRONLY);
        eprintln!("created outside the share: {planted:?}");
    }
    assert_eq!(names(outside), before, "nothing outside the share changed");
    let sub = guest.mkdir(rw, b"sub").obj::<EntryOut>().nodeid;
    for (parent, name) in [(rw, &b".."[..]), (rw, b"."), (sub, b".."), (sub, b"."), (rw, b"")] {
        let reply = guest.lookup(parent, name);
        assert_eq!(reply.errno(), libc::EINVAL, "lookup {:?}: {reply:?}", String::from_utf8_lossy(name));
    }
}

/// A policy mounts writable a host directory that holds one of the host's
/// secrets (`/etc` holds the ssh host keys, `/etc/shadow`): the read-only
/// shares never open a secret, and the writable ones must not either,
/// however the guest asks: an open for reading or writing, a read naming
/// no handle, a create of its name without O_EXCL, or a truncation; nor
/// is it given a new name. Its directory is listed, and the guest may
/// still remove or replace it, as the host user could.
#[test]
fn a_writable_share_never_opens_a_secret() {
    let dir = host();
    let rw = dir.as_path().join("rw");
    std::fs::create_dir(rw.join("ssh")).unwrap();
    std::fs::write(rw.join("ssh/host_key"), b"PRIVATE KEY").unwrap();
    std::fs::create_dir(rw.join("private")).unwrap();
    std::fs::write(rw.join("private/token"), b"TOKEN").unwrap();
    let secrets = Secrets::at(&[rw.join("ssh/host_key"), rw.join("private")]);
    let mut guest = Guest::of(&[share("/rw", &rw)], &secrets);
    let ssh = guest.walk("rw/ssh");
    let key = guest.node(ssh, "host_key");
    let leaked = |reply: &Reply| reply.header.error == 0 && reply.body.windows(3).any(|w| w == b"KEY");
    for flags in [libc::O_RDONLY, libc::O_RDWR, libc::O_WRONLY, libc::O_RDWR | libc::O_APPEND] {
        let opened = guest.open_flags(key, flags);
        if let Ok(fh) = opened {
            assert!(!leaked(&guest.read_fh(key, fh, 4096)), "read through a handle opened {flags:#o}");
        }
        assert_eq!(opened, Err(libc::EACCES), "opened with {flags:#o}");
    }
    assert_eq!(guest.read_fh(key, 0, 4096).errno(), libc::EACCES, "a read naming no handle");
    let created = guest.create(ssh, b"host_key", libc::O_RDWR);
    if let Ok((node, fh)) = created {
        assert!(!leaked(&guest.read_fh(node, fh, 4096)), "read through the handle of a create");
    }
    assert_ne!(created.map(drop), Ok(()), "a create without O_EXCL opened the secret");
    let truncate = fuse_backend_rs::abi::fuse_abi::SetattrIn {
        valid: fuse_backend_rs::abi::fuse_abi::SetattrValid::SIZE.bits(),
        size: 0,
        ..Default::default()
    };
    assert_eq!(guest.call(Opcode::Setattr as u32, key, truncate.as_slice()).errno(), libc::EACCES, "truncated");
    // Nor given a new name, by a link or a rename.
    let rw_node = guest.walk("rw");
    assert_eq!(guest.link(key, rw_node, b"linked").errno(), libc::EACCES);
    assert_eq!(guest.rename(ssh, b"host_key", rw_node, b"renamed").errno(), libc::EACCES);
    // Nothing in a secret directory is found.
    let private = guest.walk("rw/private");
    assert_eq!(guest.lookup(private, b"token").errno(), libc::EACCES);
    assert_eq!(std::fs::read(rw.join("ssh/host_key")).unwrap(), b"PRIVATE KEY", "the host's key as it was");
}

/// Whether the thread `tid` of this process is asleep (in open(2), for
/// the FIFO writers here).
fn asleep(tid: libc::pid_t) -> bool {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/stat"))
        .is_ok_and(|stat| stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('S')))
}

/// A host program waits in open(2) to write to a FIFO that sits in a
/// writable share (a build's named pipe, a tool's control FIFO). The
/// guest sends FUSE_CREATE for the FIFO's name without O_EXCL: the server
/// would open whatever is at the name (non-blocking, so it does not
/// wait), and only then see it is no regular file. Even that open lets
/// the writer through, to write to a reader that is gone. Correct: the
/// FIFO is never opened, as on the read-only shares (checked by the
/// writer still waiting right after the request; a woken writer is
/// runnable at once). The test lets it through itself at the end.
#[test]
fn a_create_without_o_excl_never_opens_a_hosts_fifo() {
    let dir = host();
    let rw = dir.as_path().join("rw");
    let path = rw.join("pipe");
    let name = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `name` is NUL-terminated.
    assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o644) }, 0);
    let mut guest = Guest::of_share(&rw);
    let rw_node = guest.walk("rw");

    let (tx, rx) = std::sync::mpsc::channel();
    let writer_path = path.clone();
    let writer = std::thread::spawn(move || {
        // SAFETY: gettid takes no arguments.
        tx.send(unsafe { libc::gettid() }).unwrap();
        let opened = std::fs::OpenOptions::new().write(true).open(&writer_path);
        tx.send(0).unwrap();
        opened.map(drop)
    });
    let tid = rx.recv().unwrap();
    while !asleep(tid) {
        std::thread::yield_now();
    }
    for flags in [libc::O_RDONLY, libc::O_RDWR] {
        assert_ne!(guest.create(rw_node, b"pipe", flags).map(drop), Ok(()));
    }
    let still_waiting = asleep(tid) && rx.try_recv().is_err();
    let reader = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(&path).unwrap();
    writer.join().unwrap().unwrap();
    drop(reader);
    assert!(still_waiting, "the VMM opened the host's FIFO: its writer was let through");
}

/// A secret directory (the host's `/etc/ssl/private` in a writable mount
/// of `/etc`) is seen, but nothing in it is found, listed or opened. The
/// guest guesses the name of a file in it and renames it out to a name
/// that is no secret (a rename names a file by its directory, no lookup
/// needed), then reads it there. Correct: nothing in a secret directory is
/// changed either (EACCES), so nothing leaves it.
#[test]
fn nothing_is_moved_out_of_a_secret_directory() {
    let dir = host();
    let rw = dir.as_path().join("rw");
    std::fs::create_dir(rw.join("private")).unwrap();
    std::fs::write(rw.join("private/token"), b"TOKEN").unwrap();
    let secrets = Secrets::at(&[rw.join("private")]);
    let mut guest = Guest::of(&[share("/rw", &rw)], &secrets);
    let rw_node = guest.walk("rw");
    let private = guest.node(rw_node, "private");
    let moved = guest.rename(private, b"token", rw_node, b"stolen");
    if moved.header.error == 0 {
        let stolen = guest.node(rw_node, "stolen");
        let read = guest.open_flags(stolen, libc::O_RDONLY).map(|fh| guest.read_fh(stolen, fh, 4096).body);
        panic!("the secret directory's file was moved out and read: {read:?}");
    }
    assert_eq!(moved.errno(), libc::EACCES);
    assert_eq!(guest.rename(rw_node, b"file", private, b"dropped").errno(), libc::EACCES, "nor moved in");
    assert_eq!(guest.unlink(private, b"token").errno(), libc::EACCES, "nor removed");
    assert_eq!(guest.create(private, b"new", libc::O_WRONLY).map(drop), Err(libc::EACCES), "nor made");
    assert_eq!(names(&rw.join("private")), ["token"]);
}

/// A secret is known by its place as well as its identity: one the host
/// makes during the run where one is named (`ssh-keygen -A` writing a
/// host key that did not exist) is refused there. The guest plants a file
/// of its own at that place beforehand (a hard link of a file it made,
/// which it keeps by another name), forgets the node, and once the host
/// has written the key into it, reads it by its other name, where it is no
/// secret. Correct: nothing is made at a secret's place (as a create
/// there is refused), by a link, a rename, a mkdir or a symlink, so the
/// host's key is a file of its own, never one the guest holds.
#[test]
fn nothing_the_guest_makes_takes_a_secrets_place() {
    let dir = host();
    let rw = dir.as_path().join("rw");
    std::fs::create_dir(rw.join("ssh")).unwrap();
    let secrets = Secrets::at(&[rw.join("ssh/host_key")]);
    let mut guest = Guest::of(&[share("/rw", &rw)], &secrets);
    let rw_node = guest.walk("rw");
    let ssh = guest.node(rw_node, "ssh");
    let (decoy, fh) = guest.create(rw_node, b"decoy", libc::O_RDWR).unwrap();
    assert_eq!(guest.release(decoy, fh), 0);
    let linked = guest.link(decoy, ssh, b"host_key");
    if linked.header.error == 0 {
        // Both lookups (the create's and the link's) forgotten: the node goes.
        guest.send(Opcode::Forget as u32, decoy, ForgetIn { nlookup: 2 }.as_slice());
    }
    std::fs::write(rw.join("ssh/host_key"), b"-----BEGIN OPENSSH PRIVATE KEY-----").unwrap();
    let decoy = guest.node(rw_node, "decoy");
    let read = guest.open_flags(decoy, libc::O_RDONLY).map(|fh| guest.read_fh(decoy, fh, 4096).body);
    assert_ne!(read, Ok(b"-----BEGIN OPENSSH PRIVATE KEY-----".to_vec()), "the host's new key reached the guest");
    assert_eq!(linked.errno(), libc::EACCES, "a link at a secret's place");
    std::fs::remove_file(rw.join("ssh/host_key")).unwrap();

    assert_eq!(guest.rename(rw_node, b"decoy", ssh, b"host_key").errno(), libc::EACCES, "a rename to it");
    assert_eq!(guest.mkdir(ssh, b"host_key").errno(), libc::EACCES, "a mkdir there");
    assert_eq!(guest.symlink(ssh, b"host_key", b"../decoy").errno(), libc::EACCES, "a symlink there");
    assert!(names(&rw.join("ssh")).is_empty(), "nothing was made at the secret's place");
}

/// The writable worker never opens with O_TRUNC (its filter refuses it,
/// see `jail::seccomp::Openat::Any`): a guest's truncating open, of any
/// access mode and by a create of a file that exists, still empties the
/// file, and only where the host user may write it.
#[test]
fn truncating_opens_empty_the_file_without_o_trunc() {
    let dir = host();
    let rw = dir.as_path().join("rw");
    let mut guest = Guest::of_share(&rw);
    let share = guest.walk("rw");
    let file = guest.node(share, "file");
    for access in [libc::O_RDONLY, libc::O_WRONLY, libc::O_RDWR] {
        std::fs::write(rw.join("file"), b"full").unwrap();
        let fh = guest.open_flags(file, access | libc::O_TRUNC).unwrap();
        assert_eq!(std::fs::read(rw.join("file")).unwrap(), b"", "access {access}");
        assert_eq!(guest.release(file, fh), 0);
    }
    std::fs::write(rw.join("file"), b"full").unwrap();
    let (created, fh) = guest.create(share, b"file", libc::O_WRONLY | libc::O_TRUNC).unwrap();
    assert_eq!(created, file);
    assert_eq!(std::fs::read(rw.join("file")).unwrap(), b"");
    assert_eq!(guest.release(file, fh), 0);
    std::fs::write(rw.join("file"), b"kept").unwrap();
    let (_, fh) = guest.create(share, b"file", libc::O_WRONLY).unwrap();
    assert_eq!(std::fs::read(rw.join("file")).unwrap(), b"kept", "no O_TRUNC, no truncation");
    assert_eq!(guest.release(file, fh), 0);
}

/// Every changing request with extreme arguments (sizes, offsets and
/// modes at their limits, every flag bit, odd names, made-up handles and
/// guessed node ids) on every kind of node gets an answer: the worker
/// neither panics (a request it drops leaves the guest waiting) nor
/// blocks, and nothing outside the share changes. The device still
/// serves afterwards.
#[test]
fn crafted_changes_on_every_kind_of_node_are_answered() {
    use fuse_backend_rs::abi::fuse_abi::{
        CopyFileRangeIn, FallocateIn, FsyncIn, LseekIn, MknodIn, Rename2In, SetattrIn, SetxattrIn,
    };
    let dir = host();
    let outside = dir.as_path();
    let rw = outside.join("rw");
    std::fs::create_dir(rw.join("dir")).unwrap();
    std::os::unix::fs::symlink("../../secret.txt", rw.join("link")).unwrap();
    std::os::unix::fs::symlink("/", rw.join("root")).unwrap();
    let before = names(outside);
    // A limit, so that what the requests may grow stays small on this disk.
    let limited = Share { limit: Some(1 << 20), ..share("/rw", &rw) };
    let mut guest = Guest::of(&[limited], &Secrets::default());
    let share = guest.walk("rw");
    let mut nodes = vec![ROOT_ID, share, 0, u64::MAX, (1 << 56) | 2, (1 << 56) | (255 << 47), 2];
    for name in ["file", "dir", "link", "root"] {
        nodes.push(guest.node(share, name));
    }
    let (_, fh) = guest.create(share, b"open", libc::O_RDWR).unwrap();
    let handles = [0, 1, fh, u64::MAX];
    let long = vec![b'n'; 300];
    let odd: [&[u8]; 7] = [b"new", b"..", b".", b"", b"\xff\xfe", &long, b"file"];
    for &node in &nodes {
        for &handle in &handles {
            for (offset, size) in [(0, 0), (u64::MAX, u32::MAX), (i64::MAX as u64, 1), (1 << 63, 4096)] {
                let write = WriteIn { fh: handle, offset, size, ..Default::default() };
                guest.call(Opcode::Write as u32, node, &[write.as_slice(), b"data"].concat());
                for mode in [0, u32::MAX, 1, 2, 3, 0x10, 0x20, 0x40] {
                    let fallocate = FallocateIn { fh: handle, offset, length: u64::from(size), mode, padding: 0 };
                    guest.call(Opcode::Fallocate as u32, node, fallocate.as_slice());
                }
                let seek = LseekIn { fh: handle, offset, whence: size, padding: 0 };
                guest.call(Opcode::Lseek as u32, node, seek.as_slice());
                let copy = CopyFileRangeIn {
                    fh_in: handle,
                    offset_in: offset,
                    nodeid_out: node,
                    fh_out: handle,
                    offset_out: offset,
                    len: u64::from(size),
                    flags: 0,
                };
                guest.call(Opcode::CopyFileRange as u32, node, copy.as_slice());
            }
            for valid in [u32::MAX, 1 << 3, 1 << 0, (1 << 4) | (1 << 5) | (1 << 7) | (1 << 8)] {
                for (size, mode, time) in [(u64::MAX, u32::MAX, u64::MAX), (1 << 40, 0o7777, 0), (0, 0o644, 1 << 62)] {
                    let attr = SetattrIn {
                        valid,
                        fh: handle,
                        size,
                        atime: time,
                        mtime: time,
                        atimensec: u32::MAX,
                        mode,
                        uid: u32::MAX,
                        gid: 0,
                        ..Default::default()
                    };
                    guest.call(Opcode::Setattr as u32, node, attr.as_slice());
                }
            }
            let fsync = FsyncIn { fh: handle, fsync_flags: u32::MAX, padding: 0 };
            guest.call(Opcode::Fsync as u32, node, fsync.as_slice());
            guest.call(Opcode::Fsyncdir as u32, node, fsync.as_slice());
            guest.call(Opcode::Flush as u32, node, &[0u8; 24]);
        }
        for flags in [u32::MAX, libc::O_PATH.cast_unsigned(), (libc::O_TMPFILE | libc::O_RDWR).cast_unsigned()] {
            guest.call(Opcode::Open as u32, node, OpenIn { flags, fuse_flags: u32::MAX }.as_slice());
        }
        for name in odd {
            let body =
                [CreateIn { flags: u32::MAX, mode: u32::MAX, umask: 0, fuse_flags: u32::MAX }.as_slice(), &cstr(name)];
            guest.call(Opcode::Create as u32, node, &body.concat());
            for (mode, rdev) in [(u32::MAX, u32::MAX), (libc::S_IFREG | 0o7777, 0), (0, 0)] {
                let mknod = MknodIn { mode, rdev, umask: u32::MAX, padding: 0 };
                guest.call(Opcode::Mknod as u32, node, &[mknod.as_slice(), &cstr(name)].concat());
            }
            let body = [MkdirIn { mode: u32::MAX, umask: 0 }.as_slice(), &cstr(name)];
            guest.call(Opcode::Mkdir as u32, node, &body.concat());
            guest.symlink(node, name, &vec![b'/'; 5000]);
            guest.symlink(node, name, b"../../..");
            for other in [share, node, u64::MAX] {
                guest.link(other, node, name);
                guest.rename(node, name, other, b"moved");
                guest.rename(other, b"file", node, name);
                let rename = Rename2In { newdir: other, flags: u32::MAX, padding: 0 };
                guest.call(Opcode::Rename2 as u32, node, &[rename.as_slice(), &cstr(name), &cstr(b"x")].concat());
            }
            let set = SetxattrIn { size: 4, flags: u32::MAX };
            guest.call(Opcode::Setxattr as u32, node, &[set.as_slice(), &cstr(name), b"vvvv"].concat());
            guest.call(Opcode::Removexattr as u32, node, &cstr(name));
            guest.unlink(node, name);
            guest.call(Opcode::Rmdir as u32, node, &cstr(name));
        }
        for &handle in &handles {
            guest.release(node, handle);
            guest.call(Opcode::Releasedir as u32, node, ReleaseIn { fh: handle, ..Default::default() }.as_slice());
        }
    }
    // FUSE_TMPFILE, newer than the server's opcode table.
    guest.call(51, share, &[CreateIn::default().as_slice(), &cstr(b"tmp")].concat());
    assert_eq!(names(outside), before, "nothing outside the share changed");
    assert_eq!(std::fs::read(outside.join("secret.txt")).unwrap(), b"HOST SECRET");
    assert_eq!(guest.getattr(share).errno(), 0, "still serving");
    for entry in walkdir(&rw) {
        let meta = std::fs::symlink_metadata(&entry).unwrap();
        let kind = meta.mode() & libc::S_IFMT;
        assert!(
            [libc::S_IFREG, libc::S_IFDIR, libc::S_IFLNK, libc::S_IFSOCK].contains(&kind),
            "{} is a device or FIFO: {:o}",
            entry.display(),
            meta.mode()
        );
        assert_eq!(meta.mode() & 0o6000, 0, "{} has a setid bit: {:o}", entry.display(), meta.mode());
    }
}

/// Every path beneath `root`, symlinks not followed.
fn walkdir(root: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if std::fs::symlink_metadata(&path).unwrap().is_dir() {
                todo.push(path.clone());
            }
            out.push(path);
        }
    }
    out
}

/// Undoes `chattr +i` on a path when dropped, so the test's directory can go.
struct Immutable<'a>(&'a Path);

impl Immutable<'_> {
    /// `path` made immutable with chattr(1), if the filesystem and the
    /// user's capabilities allow it.
    fn make(path: &Path) -> Option<Immutable<'_>> {
        let made = std::process::Command::new("chattr").arg("+i").arg(path).status();
        made.is_ok_and(|s| s.success()).then_some(Immutable(path))
    }
}

impl Drop for Immutable<'_> {
    fn drop(&mut self) {
        let _ = std::process::Command::new("chattr").arg("-i").arg(self.0).status();
    }
}

/// FUSE_CREATE without O_EXCL of a setuid file the host user cannot
/// change (here immutable; another user's setuid program when stockade is
/// not root): the server opens it, then fails to clear its setuid bit and
/// answers the error, but the handle it opened stays open and counted,
/// and the node's lookup stays held, though the guest was told of
/// neither. A guest (or a plain `open(O_CREAT)` in it, repeated) then
/// runs every writable share of the device out of handles: ENFILE for
/// every open. Correct: a create that fails keeps nothing open.
#[test]
fn a_create_that_fails_after_opening_keeps_no_handle() {
    let dir = host();
    let rw = dir.as_path().join("rw");
    let setuid = rw.join("setuid");
    std::fs::write(&setuid, b"#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&setuid, std::os::unix::fs::PermissionsExt::from_mode(0o4755)).unwrap();
    let Some(_immutable) = Immutable::make(&setuid) else {
        eprintln!("skipped: chattr +i is not possible here");
        return;
    };
    let mut guest = Guest::of_share(&rw);
    let share = guest.walk("rw");
    for _ in 0..100 {
        assert_ne!(guest.create(share, b"setuid", libc::O_RDONLY).map(drop), Ok(()));
    }
    let fresh = guest.create(share, b"fresh", libc::O_RDWR);
    assert!(fresh.is_ok(), "the handles leaked by the failed creates are all taken: {fresh:?}");
    assert_eq!(std::fs::metadata(&setuid).unwrap().mode() & 0o7777, 0o4755);
}

/// The guest (root, in a writable mount of the host's `/etc/ssh` by a
/// stockade run as root) holds a file open for reading and writing and
/// renames it into a host key's place, over the key. A host tool that
/// then writes a new key there in place (open with O_TRUNC, as
/// `ssh-keygen -A` does for a missing key) writes it into the guest's
/// file, and the guest reads it through the handle it kept. Correct:
/// nothing is moved to a secret's place (EACCES); were a file there, a
/// read through a handle checks what an open checks (as reads naming no
/// handle do).
#[test]
fn a_handle_kept_over_a_rename_into_a_secrets_place_reads_no_secret() {
    let dir = host();
    let rw = dir.as_path().join("rw");
    std::fs::write(rw.join("host_key"), b"OLD KEY").unwrap();
    let secrets = Secrets::at(&[rw.join("host_key")]);
    let mut guest = Guest::of(&[share("/rw", &rw)], &secrets);
    let share = guest.walk("rw");
    let (planted, fh) = guest.create(share, b"planted", libc::O_RDWR).unwrap();
    assert_eq!(guest.write(planted, fh, 0, b"guest's").errno(), 0);
    assert_eq!(guest.rename(share, b"planted", share, b"host_key").errno(), libc::EACCES);
    std::fs::write(rw.join("host_key"), b"NEW HOST KEY").unwrap();
    let read = guest.read_fh(planted, fh, 4096);
    assert!(
        !(read.header.error == 0 && read.body.windows(3).any(|w| w == b"KEY")),
        "the host's new key was read through the guest's handle: {:?}",
        String::from_utf8_lossy(&read.body)
    );
    assert_eq!(read.ok(), b"guest's", "the guest's file is its own");
    assert_eq!(guest.release(planted, fh), 0);
}

/// Symlinks the guest makes pointing out of the share (to the directory
/// above, to `/`, to the host's file) are never followed by the server:
/// making, removing or renaming names through one as a directory, opening
/// or truncating it, or changing its mode, owner or times leaves the host
/// outside the share as it was. And two writable shares stay apart: a
/// file is neither renamed nor linked from one into the other.
#[test]
fn symlinks_the_guest_makes_lead_nowhere_and_shares_stay_apart() {
    use fuse_backend_rs::abi::fuse_abi::{SetattrIn, SetattrValid};
    let dir = host();
    let outside = dir.as_path();
    std::fs::create_dir(outside.join("other")).unwrap();
    let mut guest =
        Guest::of(&[share("/rw", &outside.join("rw")), share("/other", &outside.join("other"))], &Secrets::default());
    let rw = guest.walk("rw");
    let mut links = Vec::new();
    let absolute = outside.join("secret.txt").into_os_string().into_encoded_bytes();
    for (name, target) in [("up", &b".."[..]), ("slash", b"/"), ("secret", b"../secret.txt"), ("abs", &absolute)] {
        links.push(guest.symlink(rw, name.as_bytes(), target).obj::<EntryOut>().nodeid);
    }
    let before = std::fs::metadata(outside.join("secret.txt")).unwrap();
    for &link in &links {
        assert_ne!(guest.mkdir(link, b"planted").errno(), 0);
        assert_ne!(guest.create(link, b"planted", libc::O_WRONLY).map(drop), Ok(()));
        assert_ne!(guest.unlink(link, b"secret.txt").errno(), 0);
        assert_ne!(guest.rename(link, b"secret.txt", rw, b"taken").errno(), 0);
        assert_ne!(guest.lookup(link, b"secret.txt").errno(), 0);
        for flags in [libc::O_RDONLY, libc::O_WRONLY | libc::O_TRUNC, libc::O_RDWR] {
            assert_ne!(guest.open_flags(link, flags).map(drop), Ok(()), "open {flags:#o}");
        }
        for (valid, attr) in [
            (SetattrValid::SIZE, SetattrIn { size: 0, ..Default::default() }),
            (SetattrValid::MODE, SetattrIn { mode: 0o777, ..Default::default() }),
            (SetattrValid::MTIME, SetattrIn { mtime: 1, ..Default::default() }),
            (SetattrValid::UID | SetattrValid::GID, SetattrIn::default()),
        ] {
            guest.call(Opcode::Setattr as u32, link, SetattrIn { valid: valid.bits(), ..attr }.as_slice());
        }
    }
    let after = std::fs::metadata(outside.join("secret.txt")).unwrap();
    assert_eq!(std::fs::read(outside.join("secret.txt")).unwrap(), b"HOST SECRET");
    assert_eq!((after.mode(), after.mtime(), after.uid()), (before.mode(), before.mtime(), before.uid()));
    assert_eq!(names(outside), ["other", "rw", "secret.txt"]);

    let other = guest.walk("other");
    let file = guest.node(rw, "file");
    assert_ne!(guest.rename(rw, b"file", other, b"moved").errno(), 0);
    assert_ne!(guest.link(file, other, b"linked").errno(), 0);
    assert!(names(&outside.join("other")).is_empty());
}

/// A secret the host writes during the run where one is named (a new
/// host key, `/etc/shadow` rewritten by `passwd` through a rename): a
/// new file, so a secret by its place alone. The guest takes it away
/// from that place, by a rename, by an exchange with a file of its own,
/// or by a link and an unlink of the secret's name, and reads it under
/// the new name. Correct: a secret's name is neither moved nor linked
/// (EACCES); the guest may still remove or replace it.
#[test]
fn a_secret_made_during_the_run_is_not_moved_from_its_place() {
    use fuse_backend_rs::abi::fuse_abi::Rename2In;
    let dir = host();
    let rw = dir.as_path().join("rw");
    std::fs::create_dir(rw.join("ssh")).unwrap();
    let secrets = Secrets::at(&[rw.join("ssh/host_key")]);
    let mut guest = Guest::of(&[share("/rw", &rw)], &secrets);
    let share = guest.walk("rw");
    let ssh = guest.node(share, "ssh");
    let leak = |guest: &mut Guest<Vfs>, name: &[u8]| -> Option<Vec<u8>> {
        let node = guest.lookup(share, name);
        if node.header.error != 0 {
            return None;
        }
        let node = node.obj::<EntryOut>().nodeid;
        let fh = guest.open_flags(node, libc::O_RDONLY).ok()?;
        let read = guest.read_fh(node, fh, 4096);
        guest.release(node, fh);
        (read.header.error == 0).then_some(read.body)
    };

    std::fs::write(rw.join("ssh/host_key"), b"KEY 1").unwrap();
    let renamed = guest.rename(ssh, b"host_key", share, b"renamed");
    assert_eq!(leak(&mut guest, b"renamed"), None, "read after a rename");
    assert_eq!(renamed.errno(), libc::EACCES);

    std::fs::write(rw.join("ssh/host_key"), b"KEY 2").unwrap();
    guest.create(share, b"decoy", libc::O_WRONLY).unwrap();
    let exchange = Rename2In { newdir: share, flags: libc::RENAME_EXCHANGE, padding: 0 };
    let body = [exchange.as_slice(), &cstr(b"host_key"), &cstr(b"decoy")].concat();
    let exchanged = guest.call(Opcode::Rename2 as u32, ssh, &body);
    assert_eq!(leak(&mut guest, b"decoy").filter(|data| !data.is_empty()), None, "read after an exchange");
    assert_eq!(exchanged.errno(), libc::EACCES);
    let back = Rename2In { newdir: ssh, ..exchange };
    let body = [back.as_slice(), &cstr(b"decoy"), &cstr(b"host_key")].concat();
    assert_eq!(guest.call(Opcode::Rename2 as u32, share, &body).errno(), libc::EACCES, "exchanged from the other side");

    std::fs::write(rw.join("ssh/host_key"), b"KEY 3").unwrap();
    let key = guest.node(ssh, "host_key");
    let linked = guest.link(key, share, b"linked");
    guest.unlink(ssh, b"host_key");
    assert_eq!(leak(&mut guest, b"linked"), None, "read after a link and an unlink");
    assert_eq!(linked.errno(), libc::EACCES);
}

/// Free bytes of the filesystem holding `path`.
fn available(path: &Path) -> u64 {
    let stat = nix::sys::statvfs::statvfs(path).unwrap();
    stat.blocks_available() * stat.fragment_size()
}

/// The guest fills the host disk past the free-space margin of a policy's
/// `rw` mount (which has no limit of its own): it sizes files with
/// truncates, each allowed on its own since a sparse file takes no space
/// yet, then writes their holes, which is no growth of their sizes and
/// was never counted. Here the margin leaves 256 MiB to the guest, which
/// writes three holes of 192 MiB. Correct: writing a hole is growth like
/// any other, and stops at the margin (within the budget's check
/// interval). Only a host process freeing over 128 MiB while the test runs
/// would let as much through as is asserted.
#[test]
fn writing_the_holes_of_sparse_files_stops_at_the_free_space_margin() {
    const ROOM: u64 = 256 << 20;
    const FILE: u64 = 192 << 20;
    const CHUNK: usize = 512 << 10;
    let dir = host();
    let rw = dir.as_path().join("rw");
    let Some(margin) = available(&rw).checked_sub(2 * ROOM).map(|spare| spare + ROOM) else {
        eprintln!("skipped: less than {} MiB free under {}", (2 * ROOM) >> 20, rw.display());
        return;
    };
    let mut guest = Guest::keeping(&[share("/rw", &rw)], &Secrets::default(), Some(margin));
    let share = guest.walk("rw");
    let mut files = Vec::new();
    for name in ["a", "b", "c"] {
        let (node, fh) = guest.create(share, name.as_bytes(), libc::O_RDWR).unwrap();
        let size = fuse_backend_rs::abi::fuse_abi::SetattrIn {
            valid: (fuse_backend_rs::abi::fuse_abi::SetattrValid::SIZE).bits(),
            size: FILE,
            ..Default::default()
        };
        assert_eq!(guest.call(Opcode::Setattr as u32, node, size.as_slice()).errno(), 0, "a sparse {name}");
        files.push((node, fh));
    }
    let chunk = vec![0x5a_u8; CHUNK];
    let mut written = 0u64;
    'fill: for &(node, fh) in &files {
        for offset in (0..FILE).step_by(CHUNK) {
            let reply = guest.write(node, fh, offset, &chunk);
            if reply.header.error != 0 {
                assert_eq!(reply.errno(), libc::ENOSPC);
                break 'fill;
            }
            written += CHUNK as u64;
        }
    }
    for (node, fh) in files {
        guest.release(node, fh);
    }
    assert!(written <= ROOM + ROOM / 2, "{} MiB written into holes with {} MiB of room", written >> 20, ROOM >> 20);
}

/// An agent's state has a limit; the guest writes it full in a file it
/// holds open, removes the file's name and waits for the share to be
/// measured again (once a second at most, when a growth would cross the
/// limit): a measure walks the names, so the removed file, still open
/// and still on the disk, counts for nothing, and the guest writes as
/// much again, and again, as far as the free-space margin. Correct: a file
/// removed while open still counts until it is closed.
#[test]
fn a_file_removed_while_open_still_counts_against_the_limit() {
    const LIMIT: u64 = 1 << 20;
    let dir = host();
    let rw = dir.as_path().join("rw");
    std::fs::remove_file(rw.join("file")).unwrap();
    let limited = Share { limit: Some(LIMIT), ..share("/state", &rw) };
    let mut guest = Guest::of(&[limited], &Secrets::default());
    let state = guest.walk("state");
    let (node, fh) = guest.create(state, b"held", libc::O_RDWR).unwrap();
    let chunk = vec![1u8; 256 << 10];
    let mut written = 0u64;
    for round in 0..4 {
        for _ in 0..(LIMIT / chunk.len() as u64) {
            if guest.write(node, fh, written, &chunk).header.error != 0 {
                break;
            }
            written += chunk.len() as u64;
        }
        if round == 0 {
            assert_eq!(guest.unlink(state, b"held").errno(), 0);
        }
        std::thread::sleep(std::time::Duration::from_millis(1100));
    }
    guest.release(node, fh);
    assert!(written <= LIMIT, "{} KiB written in a share limited to {} KiB", written >> 10, LIMIT >> 10);
}

/// The writable shares' worker serves a guest in its real jail: makes,
/// writes, sizes, allocates, syncs, seeks, changes modes and times, links,
/// renames and removes, and answers every other request, well formed or
/// not, without a call its filter refuses (which would stop the VMM). The
/// requests' effects are tested unconfined above; this keeps the filter
/// and the server in step.
#[test]
fn the_writable_worker_serves_every_request_in_its_jail() {
    use fuse_backend_rs::abi::fuse_abi::{FallocateIn, FsyncIn, LseekIn, SetattrIn};
    let dir = host();
    let rw = dir.as_path().join("rw");
    let guest = Guest::of_share(&rw);
    let shares = [rw.clone()];
    let served = in_the_workers_jail(Worker::Writable(&shares), guest, |guest| {
        let share = guest.walk("rw");
        let (file, fh) = guest.create(share, b"made", libc::O_RDWR).unwrap();
        assert_eq!(guest.write(file, fh, 0, b"written").errno(), 0);
        let setattr = |valid, size, mode| SetattrIn { valid, fh, size, mode, mtime: 1, ..Default::default() };
        // Size, mode, then times (FATTR_SIZE, FATTR_MODE, FATTR_MTIME | FATTR_ATIME_NOW).
        for attr in [setattr(1 << 3, 3, 0), setattr(1 << 0, 0, 0o600), setattr((1 << 5) | (1 << 7), 0, 0)] {
            assert_eq!(guest.call(Opcode::Setattr as u32, file, attr.as_slice()).errno(), 0);
        }
        let allocate = FallocateIn { fh, offset: 0, length: 4096, mode: 0, padding: 0 };
        assert_eq!(guest.call(Opcode::Fallocate as u32, file, allocate.as_slice()).errno(), 0);
        let sync = FsyncIn { fh, fsync_flags: 1, padding: 0 };
        assert_eq!(guest.call(Opcode::Fsync as u32, file, sync.as_slice()).errno(), 0);
        let seek = LseekIn { fh, offset: 0, whence: libc::SEEK_DATA.cast_unsigned(), padding: 0 };
        guest.call(Opcode::Lseek as u32, file, seek.as_slice());
        assert_eq!(guest.release(file, fh), 0);
        assert_eq!(guest.mkdir(share, b"dir").errno(), 0);
        assert_eq!(guest.symlink(share, b"link", b"made").errno(), 0);
        assert_eq!(guest.link(file, share, b"linked").errno(), 0);
        assert_eq!(guest.rename(share, b"linked", share, b"renamed").errno(), 0);
        assert_eq!(guest.unlink(share, b"renamed").errno(), 0);
        let dir = guest.node(share, "dir");
        let link = guest.node(share, "link");
        let nodes = [ROOT_ID, share, file, dir, link, 0, u64::MAX];
        for opcode in 0..64 {
            for &node in &nodes {
                for body in [&[0u8; 64][..], &[0xff; 64], &[0; 4]] {
                    let (_, len) = guest.write_request(opcode, node, body);
                    guest.run(&[(REQ_ADDR, len, false), (RESP_ADDR, RESP_LEN, true)]);
                }
            }
        }
        // The crafted requests forgot the nodes (and FUSE_DESTROY all else).
        let share = guest.walk("rw");
        guest.node(share, "made");
    });
    if let Err(e) = served {
        panic!("{e}");
    }
}
