//! Attacks on the read-only shares' file server, as a hostile guest root
//! (raw FUSE requests on the request queue), a hostile repository (what the
//! share holds) or the host user changing files under a running guest
//! would make them. Each goes through the device's queue processing
//! (`process_queue`), the FUSE server, the Vfs and the bounded filesystem,
//! as the guest's requests do. A test marked `ignore = "finding: ..."`
//! shows an attack that succeeds on the current code and says what the
//! correct behaviour is; the others guard attacks that are held.

use std::mem::size_of;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fuse_backend_rs::abi::fuse_abi::{
    Dirent, Direntplus, EntryOut, ForgetIn, FsOptions, GetattrIn, InHeader, InitIn, Opcode, OpenIn, OpenOut, OutHeader,
    ROOT_ID, ReadIn, ReleaseIn,
};
use fuse_backend_rs::api::Vfs;
use fuse_backend_rs::api::filesystem::FileSystem;
use fuse_backend_rs::api::server::Server;
use vm_memory::{ByteValued, Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::tempdir::TempDir;

use super::bounded::FdBudget;
use super::device::{Fs, Share};
use super::readonly::ReadOnlyFs;
use super::request::{Access, process_queue};
use super::secrets::Secrets;
use super::tally::Tally;
use super::tests::Driver;

pub(super) const MEM_SIZE: usize = 0x80_0000;
pub(super) const REQ_ADDR: u64 = 0x10_0000;
pub(super) const RESP_ADDR: u64 = 0x40_0000;
pub(super) const RESP_LEN: u32 = 0x2_0000;
pub(super) const HEADER: usize = size_of::<OutHeader>();

/// A reply as the guest reads it: the header and the body.
#[derive(Debug)]
pub(super) struct Reply {
    pub(super) header: OutHeader,
    pub(super) body: Vec<u8>,
}

impl Reply {
    pub(super) fn ok(&self) -> &[u8] {
        assert_eq!(self.header.error, 0, "unexpected error reply {self:?}");
        &self.body
    }

    pub(super) fn errno(&self) -> i32 {
        -self.header.error
    }

    pub(super) fn obj<T: ByteValued>(&self) -> T {
        T::from_slice(&self.ok()[..size_of::<T>()]).copied().unwrap()
    }
}

/// A hostile guest kernel: it writes any request it likes in its memory,
/// offers it on the request queue and lets the device answer. `F` is the
/// device's filesystem: the read-only shares' here, the writable ones' in
/// the write attacks.
pub(super) struct Guest<F: FileSystem + Sync = ReadOnlyFs<Vfs>> {
    pub(super) mem: &'static GuestMemoryMmap,
    pub(super) driver: Driver,
    pub(super) server: Arc<Server<F>>,
    pub(super) access: Access,
    pub(super) unique: u64,
}

impl Guest {
    /// A guest of a read-only device serving `shares` within `budget`,
    /// past FUSE_INIT as Linux sends it (reads and listings without opens).
    fn of(shares: &[Share], secrets: &Secrets, budget: FdBudget) -> Guest {
        Guest::init(shares, secrets, budget, true)
    }

    /// [`Guest::of`], a kernel that sends opens (`without_opens` false):
    /// every open the guest asks for then reaches the filesystem.
    pub(super) fn init(shares: &[Share], secrets: &Secrets, budget: FdBudget, without_opens: bool) -> Guest {
        let fs = Fs::within("attack", shares, secrets, budget).unwrap();
        let mut flags = FsOptions::all().bits() & 0xffff_ffff & !FsOptions::INIT_EXT.bits();
        if !without_opens {
            flags &= !(FsOptions::ZERO_MESSAGE_OPEN | FsOptions::ZERO_MESSAGE_OPENDIR).bits();
        }
        Guest::past_init(fs.server, Access::ReadOnly, flags)
    }

    /// A guest of one share at /ws with a generous budget.
    fn of_share(host: &Path, secrets: &Secrets) -> Guest {
        Guest::of(&[share("/ws", host)], secrets, FdBudget { inodes: 64, handles: 64 })
    }
}

impl<F: FileSystem + Sync> Guest<F> {
    /// A guest of a device serving `server`, past FUSE_INIT with `flags`.
    pub(super) fn past_init(server: Arc<Server<F>>, access: Access, flags: u64) -> Guest<F> {
        let mem: &'static GuestMemoryMmap =
            Box::leak(Box::new(GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE)]).unwrap()));
        let mut guest = Guest { mem, driver: Driver::new(mem, GuestAddress(0)), server, access, unique: 0 };
        let init = InitIn { major: 7, minor: 31, max_readahead: 0x2_0000, flags: u32::try_from(flags).unwrap() };
        assert_eq!(guest.call(Opcode::Init as u32, 0, init.as_slice()).header.error, 0);
        guest
    }

    /// Offers a chain of (address, length, device-writable) descriptors and
    /// lets the device process the queue; returns the used length, and
    /// fails unless the chain came back.
    pub(super) fn run(&mut self, descs: &[(u64, u32, bool)]) -> u32 {
        // The mock queue serves a few hundred chains; a long test starts
        // another (the server keeps no queue state).
        if self.driver.used >= 200 {
            self.driver = Driver::new(self.mem, GuestAddress(0));
        }
        let head = self.driver.offer(descs);
        process_queue(&self.server, self.mem, &mut self.driver.queue, self.access, &mut Tally::default(), None);
        self.driver.take_used(head)
    }

    /// Writes request `opcode` on `nodeid` with `body`; returns its unique
    /// and length.
    pub(super) fn write_request(&mut self, opcode: u32, nodeid: u64, body: &[u8]) -> (u64, u32) {
        self.unique += 1;
        let len = u32::try_from(size_of::<InHeader>() + body.len()).unwrap();
        let header = InHeader { len, opcode, unique: self.unique, nodeid, uid: 0, gid: 0, pid: 1, padding: 0 };
        let mut bytes = header.as_slice().to_vec();
        bytes.extend_from_slice(body);
        self.mem.write_slice(&bytes, GuestAddress(REQ_ADDR)).unwrap();
        self.mem.write_slice(&vec![0xa5; RESP_LEN as usize], GuestAddress(RESP_ADDR)).unwrap();
        (self.unique, len)
    }

    pub(super) fn call(&mut self, opcode: u32, nodeid: u64, body: &[u8]) -> Reply {
        let (unique, len) = self.write_request(opcode, nodeid, body);
        let used = self.run(&[(REQ_ADDR, len, false), (RESP_ADDR, RESP_LEN, true)]);
        let header: OutHeader = self.mem.read_obj(GuestAddress(RESP_ADDR)).unwrap();
        let mut body = Vec::new();
        assert!(used as usize >= HEADER, "request {opcode} got no reply (used {used}): the guest would wait for ever");
        assert_eq!(header.unique, unique);
        assert_eq!(header.len, used, "the used length is the reply length");
        body.resize(used as usize - HEADER, 0);
        self.mem.read_slice(&mut body, GuestAddress(RESP_ADDR + HEADER as u64)).unwrap();
        Reply { header, body }
    }

    /// A request that gets no reply (FORGET), offered as Linux offers it on
    /// the hiprio queue: one device-readable descriptor and nothing to write.
    pub(super) fn send(&mut self, opcode: u32, nodeid: u64, body: &[u8]) {
        let (_, len) = self.write_request(opcode, nodeid, body);
        assert_eq!(self.run(&[(REQ_ADDR, len, false)]), 0);
    }

    pub(super) fn lookup(&mut self, parent: u64, name: &[u8]) -> Reply {
        let mut body = name.to_vec();
        body.push(0);
        self.call(Opcode::Lookup as u32, parent, &body)
    }

    /// The node id of `name` in `parent`, which must exist.
    pub(super) fn node(&mut self, parent: u64, name: &str) -> u64 {
        let entry: EntryOut = self.lookup(parent, name.as_bytes()).obj();
        assert_ne!(entry.nodeid, 0, "{name} must exist");
        entry.nodeid
    }

    /// The node of the path `a/b/c` below the guest's root.
    pub(super) fn walk(&mut self, path: &str) -> u64 {
        path.split('/').fold(ROOT_ID, |node, name| self.node(node, name))
    }

    /// A read naming no handle, as Linux sends once the server declined opens.
    pub(super) fn read(&mut self, node: u64, offset: u64, size: u32) -> Reply {
        self.read_handle(node, 0, offset, size)
    }

    pub(super) fn read_handle(&mut self, node: u64, fh: u64, offset: u64, size: u32) -> Reply {
        let read = ReadIn { fh, offset, size, flags: libc::O_RDONLY as u32, ..Default::default() };
        self.call(Opcode::Read as u32, node, read.as_slice())
    }

    pub(super) fn getattr(&mut self, node: u64) -> Reply {
        self.call(Opcode::Getattr as u32, node, GetattrIn::default().as_slice())
    }

    /// A handle of the directory `node` (FUSE_OPENDIR), as the guest opens
    /// one before listing it; none (0) where the device declines opendir,
    /// as Linux then lists naming no handle.
    pub(super) fn opendir(&mut self, node: u64) -> Result<u64, i32> {
        let reply = self.open(Opcode::Opendir, node);
        match reply.header.error {
            0 => Ok(reply.obj::<OpenOut>().fh),
            e if e == -libc::ENOSYS => Ok(0),
            _ => Err(reply.errno()),
        }
    }

    /// FUSE_RELEASEDIR of `fh`, which Linux sends only for a handle it got.
    pub(super) fn releasedir(&mut self, node: u64, fh: u64) {
        if fh == 0 {
            return;
        }
        let release = ReleaseIn { fh, ..Default::default() };
        assert_eq!(self.call(Opcode::Releasedir as u32, node, release.as_slice()).header.error, 0);
    }

    /// One READDIRPLUS page of the open directory `fh`, from `offset`.
    pub(super) fn page(&mut self, opcode: Opcode, node: u64, fh: u64, offset: u64) -> Reply {
        let list = ReadIn { fh, offset, size: 4096, ..Default::default() };
        self.call(opcode as u32, node, list.as_slice())
    }

    /// One READDIRPLUS page of `node` from `offset`, through a handle opened
    /// for it and released after (the opendir's reply if it is refused).
    pub(super) fn listing(&mut self, node: u64, offset: u64) -> Reply {
        let opened = self.open(Opcode::Opendir, node);
        let fh = match opened.header.error {
            0 => opened.obj::<OpenOut>().fh,
            e if e == -libc::ENOSYS => 0,
            _ => return opened,
        };
        let reply = self.page(Opcode::Readdirplus, node, fh, offset);
        self.releasedir(node, fh);
        reply
    }

    /// Every name READDIRPLUS gives for `node`, page after page, through
    /// one handle.
    pub(super) fn list_all(&mut self, node: u64) -> Result<Vec<(String, EntryOut)>, i32> {
        let fh = self.opendir(node)?;
        let mut all = Vec::new();
        let mut offset = 0;
        let listed = loop {
            let reply = self.page(Opcode::Readdirplus, node, fh, offset);
            if reply.header.error != 0 {
                break Err(reply.errno());
            }
            let page = direntplus(&reply.body);
            let Some(&(_, _, last)) = page.last() else { break Ok(all) };
            offset = last;
            all.extend(page.into_iter().map(|(name, entry, _)| (name, entry)));
        };
        self.releasedir(node, fh);
        listed
    }

    /// Every name READDIR gives for `node` (no attributes, no nodes made),
    /// through one handle.
    pub(super) fn names(&mut self, node: u64) -> Result<Vec<String>, i32> {
        let fh = self.opendir(node)?;
        let listed = self.names_through(node, fh);
        self.releasedir(node, fh);
        listed
    }

    /// Every name READDIR gives through the open directory `fh`.
    pub(super) fn names_through(&mut self, node: u64, fh: u64) -> Result<Vec<String>, i32> {
        let mut all = Vec::new();
        let mut offset = 0;
        loop {
            let reply = self.page(Opcode::Readdir, node, fh, offset);
            if reply.header.error != 0 {
                return Err(reply.errno());
            }
            let mut body = &reply.body[..];
            let before = all.len();
            while body.len() >= size_of::<Dirent>() {
                let dirent = *Dirent::from_slice(&body[..size_of::<Dirent>()]).unwrap();
                let end = size_of::<Dirent>() + dirent.namelen as usize;
                all.push(String::from_utf8_lossy(&body[size_of::<Dirent>()..end]).into_owned());
                offset = dirent.off;
                body = &body[((end + 7) & !7).min(body.len())..];
            }
            if all.len() == before {
                return Ok(all);
            }
        }
    }

    pub(super) fn open(&mut self, opcode: Opcode, node: u64) -> Reply {
        let open = OpenIn { flags: libc::O_RDONLY as u32, fuse_flags: 0 };
        self.call(opcode as u32, node, open.as_slice())
    }
}

/// A guest of one read-only share of `host` at /ws (see [`Guest::of_share`]).
pub(super) fn read_only_guest(host: &Path, secrets: &Secrets) -> Guest {
    Guest::of_share(host, secrets)
}

pub(super) fn share(guest_path: &str, host: &Path) -> Share {
    Share { guest_path: guest_path.into(), host_path: host.to_path_buf(), record: None, limit: None }
}

pub(super) fn temp_dir() -> TempDir {
    TempDir::new_with_prefix(std::env::temp_dir().join("stockade-fs-attack-")).unwrap()
}

/// The names, entries and next offsets of a READDIRPLUS reply.
pub(super) fn direntplus(mut body: &[u8]) -> Vec<(String, EntryOut, u64)> {
    let mut out = Vec::new();
    while body.len() >= size_of::<Direntplus>() {
        let plus = *Direntplus::from_slice(&body[..size_of::<Direntplus>()]).unwrap();
        let name_start = size_of::<Direntplus>();
        let name_end = name_start + plus.dirent.namelen as usize;
        let name = String::from_utf8_lossy(&body[name_start..name_end]).into_owned();
        out.push((name, plus.entry_out, plus.dirent.off));
        let record = (name_end + 7) & !7;
        body = &body[record.min(body.len())..];
    }
    out
}

pub(super) fn ino(path: &Path) -> u64 {
    std::fs::symlink_metadata(path).unwrap().ino()
}

/// Inode numbers of `n` new files made beside `path` (ext4 allocates near
/// the parent directory, and reuses a freed number at once).
fn fresh_inodes(path: &Path, n: usize, dir: bool) -> Vec<u64> {
    let parent = path.parent().unwrap();
    (0..n)
        .map(|i| {
            let p = parent.join(format!(".fresh{i}"));
            if dir {
                std::fs::create_dir(&p).unwrap()
            } else {
                std::fs::write(&p, b"x").unwrap()
            }
            let n = ino(&p);
            let _ = std::fs::remove_file(&p).or_else(|_| std::fs::remove_dir(&p));
            n
        })
        .collect()
}

/// Makes a node at `path` with the freed inode number `wanted`, as ext4
/// hands a freed number to the next node made: `make` makes one at a
/// temporary name beside it until one gets the number (other tests running
/// at once may take it first), and that one is renamed to `path`. False,
/// with the reason printed, when the filesystem never gives it back.
fn reuse_number(path: &Path, wanted: u64, make: impl Fn(&Path)) -> bool {
    let parent = path.parent().unwrap();
    let mut made = Vec::new();
    let mut found = false;
    for i in 0..2000 {
        let p = parent.join(format!(".reuse{i}"));
        make(&p);
        if ino(&p) == wanted {
            std::fs::rename(&p, path).unwrap();
            found = true;
            break;
        }
        made.push(p);
    }
    for p in made {
        let _ = std::fs::remove_file(&p).or_else(|_| std::fs::remove_dir(&p));
    }
    if !found {
        eprintln!("skipped: the filesystem under {} did not give inode {wanted} back", parent.display());
    }
    found
}

/// The host user runs `git checkout` (which unlinks a changed file and
/// writes the new one; ext4 gives a new file a freed inode number at once)
/// while the guest reads the file. Node ids are host identities, so a
/// reused number would make the new file the old node, and the descriptor
/// kept for reads naming no handle would serve the deleted bytes. Held:
/// that kept descriptor keeps the deleted file's number in use, so it is
/// never reused while kept; the new file is a new node and reads as itself.
#[test]
fn a_file_replaced_on_the_host_is_read_anew_never_as_the_deleted_one() {
    let dir = temp_dir();
    let path = dir.as_path().join("config.rs");
    std::fs::write(&path, b"old: the deleted version").unwrap();
    let mut guest = Guest::of_share(dir.as_path(), &Secrets::default());
    let file = guest.walk("ws/config.rs");
    assert_eq!(guest.read(file, 0, 4096).ok(), b"old: the deleted version");

    let old_ino = ino(&path);
    std::fs::remove_file(&path).unwrap();
    assert!(!fresh_inodes(&path, 200, false).contains(&old_ino), "a kept descriptor pins the number");
    std::fs::write(&path, b"NEW: what the host has now").unwrap();
    let again = guest.walk("ws/config.rs");
    assert_ne!(again, file);
    assert_eq!(guest.read(again, 0, 4096).ok(), b"NEW: what the host has now");
}

/// The same with a directory the host replaces (rm -rf, mkdir): the
/// descriptors of the deleted one (its `O_PATH` step, the handle a guest
/// process listing it holds open) pin its number, so the new directory is
/// a new node, found and listed as itself.
#[test]
fn a_directory_replaced_on_the_host_is_served_anew_never_as_the_deleted_one() {
    let dir = temp_dir();
    let d = dir.as_path().join("d");
    std::fs::create_dir(&d).unwrap();
    std::fs::write(d.join("old.txt"), b"old").unwrap();
    // A kernel that opens directories: one that lists naming no handle
    // holds no descriptor to pin the number.
    let budget = FdBudget { inodes: 64, handles: 64 };
    let mut guest = Guest::init(&[share("/ws", dir.as_path())], &Secrets::default(), budget, false);
    let node = guest.walk("ws/d");
    let held = guest.opendir(node).unwrap();
    assert_eq!(guest.names_through(node, held).unwrap(), ["old.txt"]);

    let old_ino = ino(&d);
    std::fs::remove_dir_all(&d).unwrap();
    assert!(!fresh_inodes(&d, 200, true).contains(&old_ino), "a kept descriptor pins the number");
    std::fs::create_dir(&d).unwrap();
    std::fs::write(d.join("new.txt"), b"new").unwrap();
    let again = guest.walk("ws/d");
    assert_ne!(again, node);
    assert_eq!(guest.names(again).unwrap(), ["new.txt"]);
    assert_eq!(guest.names(node), Err(libc::ESTALE), "the old node is the deleted directory");
    // The handle held is the deleted directory's, no longer where it was
    // found (see `still_held`).
    assert_eq!(guest.names_through(node, held), Err(libc::ESTALE), "the handle held is the deleted directory's");
    guest.releasedir(node, held);
}

/// The host replaces a file by a directory (a build's `rm out; mkdir
/// out`, a branch switch) and ext4 gives the directory the file's freed
/// inode number. The node is the host identity, so the guest's lookup of
/// the directory lands on the file's node, which keeps the kind it had
/// when first looked up: the directory cannot be listed (ENOTDIR) nor
/// anything in it looked up, for as long as the guest holds either. The
/// guest kernel gets a directory's attributes for a node it knew as a
/// file. Held: the node is what the host has now (its kind taken from the
/// fresh stat of each lookup), so the directory lists.
#[test]
fn a_directory_reusing_a_files_inode_number_is_listed() {
    let dir = temp_dir();
    let out = dir.as_path().join("out");
    std::fs::write(&out, b"a file").unwrap();
    let mut guest = Guest::of_share(dir.as_path(), &Secrets::default());
    let file = guest.walk("ws/out");
    assert_eq!(guest.read(file, 0, 4096).ok(), b"a file");
    // The guest reads other files: its kept reader of `out` goes (the
    // reader cache holds a few), and with it what pinned the number.
    for i in 0..16 {
        std::fs::write(dir.as_path().join(format!("other{i}")), b"x").unwrap();
        let other = guest.walk(&format!("ws/other{i}"));
        guest.read(other, 0, 1).ok();
    }

    let old_ino = ino(&out);
    std::fs::remove_file(&out).unwrap();
    if !reuse_number(&out, old_ino, |p| std::fs::create_dir(p).unwrap()) {
        return;
    }
    std::fs::write(out.join("artifact"), b"built").unwrap();

    let ws = guest.node(ROOT_ID, "ws");
    let entry: EntryOut = guest.lookup(ws, b"out").obj();
    assert_eq!(entry.attr.mode & libc::S_IFMT, libc::S_IFDIR, "the guest is told it is a directory");
    assert_eq!(guest.names(entry.nodeid), Ok(vec!["artifact".to_string()]), "and it must list as one");
}

/// The same staleness with a FIFO: the host replaces a file the guest
/// knows by a FIFO that gets its inode number, and a writer waits in
/// open(2) for a reader. The guest reads the node (its kind as it was):
/// the read is refused, and the VMM never opens the FIFO, which would let
/// the writer through (even a non-blocking open that is then refused
/// does). Checked by the writer still waiting after the read: it is let
/// through here, by the test's own open, at the end.
#[test]
fn a_fifo_taking_a_files_inode_number_is_never_opened() {
    let dir = temp_dir();
    let path = dir.as_path().join("f");
    std::fs::write(&path, b"a file").unwrap();
    let mut guest = Guest::of_share(dir.as_path(), &Secrets::default());
    let file = guest.walk("ws/f");
    let old_ino = ino(&path);
    std::fs::remove_file(&path).unwrap();
    let fifo = |p: &Path| {
        let name = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: `name` is NUL-terminated.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o644) }, 0);
    };
    if !reuse_number(&path, old_ino, fifo) {
        return;
    }

    let (tx, rx) = std::sync::mpsc::channel();
    let writer_path = path.clone();
    let writer = std::thread::spawn(move || {
        // SAFETY: gettid takes no arguments.
        tx.send(unsafe { libc::gettid() }).unwrap();
        let opened = std::fs::OpenOptions::new().write(true).open(&writer_path);
        tx.send(0).unwrap();
        opened.map(|_| ())
    });
    let tid = rx.recv().unwrap();
    // The writer is asleep in open(2), waiting for a reader.
    while !std::fs::read_to_string(format!("/proc/self/task/{tid}/stat"))
        .is_ok_and(|stat| stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('S')))
    {
        std::thread::yield_now();
    }
    assert_ne!(guest.read(file, 0, 4096).errno(), 0);
    assert_ne!(guest.open(Opcode::Open, file).errno(), 0);
    assert!(
        matches!(
            rx.recv_timeout(std::time::Duration::from_millis(200)),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout)
        ),
        "the VMM opened the FIFO: its writer was let through"
    );
    let reader = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(&path).unwrap();
    writer.join().unwrap().unwrap();
    drop(reader);
}

/// A tool writes a new host key to a temporary name and renames it into
/// the secret's place (the place is a secret even for a file created
/// during the run). The guest looked the temporary file up and read it
/// (still empty) before the rename; after it, the guest looks the secret's
/// name up (which tells the server the node is now at the secret's
/// place: an open is refused) and reads the node naming no handle: the
/// reader descriptor kept from the earlier read would serve the key.
/// Held: each read through a kept descriptor checks what an open checks,
/// so EACCES, as for any read of a node at a secret's place.
#[test]
fn a_file_renamed_into_a_secrets_place_is_not_read_through_an_earlier_reader() {
    let dir = temp_dir();
    let ssh = dir.as_path().join("ssh");
    std::fs::create_dir(&ssh).unwrap();
    let secrets = Secrets::at(&[ssh.join("host_key")]);
    std::fs::write(ssh.join("host_key.tmp"), b"").unwrap();
    let mut guest = Guest::of_share(dir.as_path(), &secrets);
    let tmp = guest.walk("ws/ssh/host_key.tmp");
    assert_eq!(guest.read(tmp, 0, 4096).ok(), b"", "not yet written");

    std::fs::write(ssh.join("host_key.tmp"), b"-----BEGIN OPENSSH PRIVATE KEY-----").unwrap();
    std::fs::rename(ssh.join("host_key.tmp"), ssh.join("host_key")).unwrap();

    let key = guest.walk("ws/ssh/host_key");
    assert_eq!(key, tmp, "one host file, one node");
    assert_eq!(guest.open(Opcode::Open, key).errno(), libc::ENOSYS, "opens are declined; reads name no handle");
    let read = guest.read(key, 0, 4096);
    assert_eq!(
        read.errno(),
        libc::EACCES,
        "the secret's bytes reached the guest: {:?}",
        String::from_utf8_lossy(&read.body)
    );
}

/// The host user moves a directory out of the workspace (to a private
/// place) and keeps writing its files there. A file the guest read before
/// the move would still be served from its new place, outside every share,
/// by the reader descriptor kept for reads naming no handle. Held: that
/// descriptor is checked against the node's place on each read, as
/// listings and every other request are: ESTALE, as the module promises
/// ("a directory the host moved out of the share is not served from its
/// new place").
#[test]
fn a_file_moved_out_of_the_share_is_not_read_from_its_new_place() {
    let dir = temp_dir();
    let ws = dir.as_path().join("ws");
    let private = dir.as_path().join("private");
    std::fs::create_dir_all(ws.join("notes")).unwrap();
    std::fs::create_dir(&private).unwrap();
    std::fs::write(ws.join("notes/todo.txt"), b"shared draft").unwrap();
    let mut guest = Guest::of_share(&ws, &Secrets::default());
    let file = guest.walk("ws/notes/todo.txt");
    let notes = guest.walk("ws/notes");
    assert_eq!(guest.read(file, 0, 4096).ok(), b"shared draft");

    std::fs::rename(ws.join("notes"), private.join("notes")).unwrap();
    std::fs::write(private.join("notes/todo.txt"), b"PRIVATE: written outside the share").unwrap();

    assert_eq!(guest.getattr(file).errno(), libc::ESTALE, "getattr knows it moved");
    assert_eq!(guest.listing(notes, 0).errno(), libc::ESTALE, "so does a listing");
    let read = guest.read(file, 0, 4096);
    assert_eq!(read.errno(), libc::ESTALE, "read from outside the share: {:?}", String::from_utf8_lossy(&read.body));
}

/// READLINK on a share's symlink answers the target and leaves the link's
/// content and change times on the host alone. Its access time is not: no
/// system call reads a link without touching it (readlinkat does, even on
/// an O_PATH descriptor, and O_NOATIME applies to opened files only); the
/// README's security model says so, as it says that files the host user
/// does not own get their access time updated as any reader's would.
#[test]
fn readlink_answers_the_target_and_leaves_the_links_times_alone_but_access() {
    let dir = temp_dir();
    let link = dir.as_path().join("link");
    std::os::unix::fs::symlink("target/elsewhere", &link).unwrap();
    let old = libc::timespec { tv_sec: 946_684_800, tv_nsec: 0 };
    let times = [old, old];
    let name = std::ffi::CString::new(link.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `name` is NUL-terminated and `times` holds two timespecs.
    assert_eq!(unsafe { libc::utimensat(libc::AT_FDCWD, name.as_ptr(), times.as_ptr(), libc::AT_SYMLINK_NOFOLLOW) }, 0);
    let before = std::fs::symlink_metadata(&link).unwrap();
    let mut guest = Guest::of_share(dir.as_path(), &Secrets::default());
    let node = guest.walk("ws/link");
    assert_eq!(guest.call(Opcode::Readlink as u32, node, &[]).ok(), b"target/elsewhere");
    let after = std::fs::symlink_metadata(&link).unwrap();
    assert_eq!(
        (after.mtime(), after.ctime(), after.ctime_nsec()),
        (before.mtime(), before.ctime(), before.ctime_nsec())
    );
}

/// In host mode /etc is shared read-only and the guest's identity files
/// (machine-id, hostname, passwd, group, hosts) are generated and mounted
/// over the host's in the guest; only the `hide` list of rootfs/host.toml
/// is refused by the VMM. Guest root speaking FUSE (or unmounting the
/// cover) would read the host's own: its machine id, which machine-id(5)
/// asks to keep from untrusted parties, and every account of the host.
/// Held: the host's identity files are on the hide list, refused on the
/// share as the secrets are.
#[test]
fn guest_root_cannot_read_the_hosts_identity_files() {
    let spec: toml::Value = toml::from_str(include_str!("../../../../../rootfs/host.toml")).unwrap();
    let hidden: Vec<PathBuf> = spec["hide"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| PathBuf::from(p.as_str().unwrap()))
        .filter(|p| !p.to_string_lossy().contains('*'))
        .collect();
    let mut guest = Guest::of(&[share("/etc", Path::new("/etc"))], &Secrets::at(&hidden), FdBudget::for_limit(4096));
    let mut leaked = Vec::new();
    for name in ["machine-id", "passwd", "hostname"] {
        let host = Path::new("/etc").join(name);
        let Ok(content) = std::fs::read(&host) else { continue };
        let node = guest.walk(&format!("etc/{name}"));
        let read = guest.read(node, 0, 65536);
        if read.header.error == 0 && read.body == content {
            leaked.push(name);
        }
    }
    assert_eq!(leaked, Vec::<&str>::new(), "host identity files read by the guest");
}

/// The directory-listing form of the last finding: a directory the guest
/// holds open (a handle from FUSE_OPENDIR) that the host then renames into
/// a secret directory's place is still listed through that handle once the
/// guest has looked the secret's name up, although every lookup in it is
/// refused. Correct: EACCES, as for any listing of a secret directory.
#[test]
fn a_directory_renamed_into_a_secret_directorys_place_is_not_listed() {
    let dir = temp_dir();
    let root = dir.as_path();
    let secrets = Secrets::at(&[root.join("private")]);
    std::fs::create_dir(root.join("staging")).unwrap();
    std::fs::write(root.join("staging/id_ed25519"), b"KEY").unwrap();
    let mut guest = Guest::of_share(root, &secrets);
    let staging = guest.walk("ws/staging");
    let fh = guest.opendir(staging).unwrap();
    assert_eq!(guest.names_through(staging, fh).unwrap(), ["id_ed25519"]);

    std::fs::rename(root.join("staging"), root.join("private")).unwrap();
    let private = guest.walk("ws/private");
    assert_eq!(private, staging, "one host directory, one node");
    assert_eq!(guest.lookup(private, b"id_ed25519").errno(), libc::EACCES, "nothing in it is found");
    assert_eq!(guest.names_through(private, fh), Err(libc::EACCES), "nor listed through the handle held");
    assert_eq!(guest.page(Opcode::Readdirplus, private, fh, 0).errno(), libc::EACCES);
    assert_eq!(guest.names(private), Err(libc::EACCES), "nor opened again");
}

/// Host descriptors the device holds for the share at `root`, found by
/// their links in /proc (other tests' descriptors name other directories).
pub(super) fn descriptors_under(root: &Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter(|target| target.starts_with(root))
        .count()
}

/// A guest that walks a tree far bigger than the descriptor budget, lists
/// every directory (READDIRPLUS and READDIR, each through a handle it
/// opens and releases), reads every file naming no handle, and opens every
/// file and directory it can and never releases them holds no more host
/// descriptors than the budget, the few kept readers, and the root,
/// whatever it does; opens past the cap get ENFILE (a listing's own open
/// as well, once the guest holds them all) and reads still work.
#[test]
fn a_guest_holds_no_more_host_descriptors_than_the_budget() {
    let dir = temp_dir();
    let root = dir.as_path();
    for d in 0..40 {
        std::fs::create_dir_all(root.join(format!("d{d}/e"))).unwrap();
        for f in 0..3 {
            std::fs::write(root.join(format!("d{d}/e/f{f}")), format!("{d}/{f}")).unwrap();
        }
    }
    let budget = FdBudget { inodes: 16, handles: 16 };
    let mut guest = Guest::init(&[share("/ws", root)], &Secrets::default(), budget, false);
    let most = budget.inodes + budget.handles + 8 + 1;
    let ws = guest.node(ROOT_ID, "ws");
    let mut refused = 0;
    let files = ["f0", "f1", "f2"];
    for d in 0..40 {
        let dnode = guest.node(ws, &format!("d{d}"));
        let e = guest.node(dnode, "e");
        match guest.list_all(e) {
            Ok(listed) => {
                let mut names: Vec<_> = listed.iter().map(|(name, _)| name.as_str()).collect();
                names.sort_unstable();
                assert_eq!(names, files);
            }
            Err(errno) => assert_eq!(errno, libc::ENFILE, "a listing fails only for want of a handle"),
        }
        for name in files {
            let entry: EntryOut = guest.lookup(e, name.as_bytes()).obj();
            assert_eq!(guest.read(entry.nodeid, 0, 64).ok(), format!("{d}/{}", &name[1..]).as_bytes());
            for opcode in [Opcode::Open, Opcode::Opendir] {
                let open = guest.open(opcode, entry.nodeid);
                if open.header.error == 0 {
                    let fh = open.obj::<OpenOut>().fh;
                    assert!(
                        guest.read_handle(entry.nodeid, fh, 0, 64).header.error == 0
                            || opcode as u32 == Opcode::Opendir as u32
                    );
                } else if open.errno() == libc::ENFILE {
                    refused += 1;
                }
            }
        }
        match guest.names(dnode) {
            Ok(names) => assert_eq!(names, ["e"]),
            Err(errno) => assert_eq!(errno, libc::ENFILE),
        }
        assert!(descriptors_under(root) <= most, "{} descriptors, at most {most}", descriptors_under(root));
    }
    assert!(refused > 0, "opens past the cap are refused");
}

/// FIFOs in a hostile repository never block the one worker thread: a
/// read, listing, open or seek of one is answered, as is a read of a
/// regular file the host replaced by a FIFO after the guest looked it up.
#[test]
fn a_fifo_never_blocks_the_worker() {
    let dir = temp_dir();
    let root = dir.as_path();
    let mkfifo = |p: &Path| {
        let name = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: `name` is NUL-terminated.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o644) }, 0);
    };
    mkfifo(&root.join("pipe"));
    std::fs::write(root.join("file"), b"plain").unwrap();
    let mut guest = Guest::init(&[share("/ws", root)], &Secrets::default(), FdBudget { inodes: 8, handles: 8 }, false);
    let pipe = guest.walk("ws/pipe");
    assert_ne!(guest.read(pipe, 0, 4096).errno(), 0);
    assert_ne!(guest.listing(pipe, 0).errno(), 0);
    assert_ne!(guest.open(Opcode::Open, pipe).errno(), 0);
    assert_ne!(guest.open(Opcode::Opendir, pipe).errno(), 0);
    let seek = fuse_backend_rs::abi::fuse_abi::LseekIn { fh: 0, offset: 0, whence: libc::SEEK_DATA as u32, padding: 0 };
    assert_ne!(guest.call(Opcode::Lseek as u32, pipe, seek.as_slice()).errno(), 0);

    let file = guest.walk("ws/file");
    std::fs::remove_file(root.join("file")).unwrap();
    mkfifo(&root.join("file"));
    assert_ne!(guest.read(file, 0, 4096).errno(), 0);
    assert_ne!(guest.open(Opcode::Open, file).errno(), 0);
}

/// FORGET as Linux sends it on the hiprio queue (one device-readable
/// descriptor, nothing to write) is served: the node goes.
#[test]
fn a_forget_without_room_for_a_reply_is_served() {
    let dir = temp_dir();
    std::fs::write(dir.as_path().join("f"), b"x").unwrap();
    let mut guest = Guest::of_share(dir.as_path(), &Secrets::default());
    let f = guest.walk("ws/f");
    assert_eq!(guest.getattr(f).header.error, 0);
    guest.send(Opcode::Forget as u32, f, ForgetIn { nlookup: 1 }.as_slice());
    assert_eq!(guest.getattr(f).errno(), libc::ESTALE, "forgotten");
}

/// Extreme and crafted requests on every kind of node, naming no handle,
/// a made-up handle or a guessed node id, are all answered (the guest
/// never waits for ever) and leave the host's files as they were.
#[test]
fn crafted_requests_on_every_kind_of_node_are_answered() {
    let dir = temp_dir();
    let root = dir.as_path();
    std::fs::write(root.join("file"), b"content").unwrap();
    std::fs::create_dir(root.join("dir")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", root.join("link")).unwrap();
    let before: Vec<_> =
        ["file", "dir", "link"].iter().map(|n| std::fs::symlink_metadata(root.join(n)).unwrap().mtime()).collect();
    let mut guest = Guest::of_share(root, &Secrets::default());
    let ws = guest.node(ROOT_ID, "ws");
    let mut nodes = vec![ROOT_ID, ws, 0, u64::MAX, (1 << 56) | 2, (1 << 56) | (255 << 47), 2];
    for n in ["file", "dir", "link"] {
        nodes.push(guest.node(ws, n));
    }
    for &node in &nodes {
        for (offset, size) in
            [(0, 0), (u64::MAX, u32::MAX), (u64::MAX - 1, 4096), (i64::MAX as u64, 1), (1 << 63, 1 << 20)]
        {
            for fh in [0, 1, u64::MAX] {
                let read = ReadIn { fh, offset, size, ..Default::default() };
                for op in [Opcode::Read, Opcode::Readdir, Opcode::Readdirplus] {
                    guest.call(op as u32, node, read.as_slice());
                }
                let seek = fuse_backend_rs::abi::fuse_abi::LseekIn { fh, offset, whence: size, padding: 0 };
                guest.call(Opcode::Lseek as u32, node, seek.as_slice());
            }
        }
        for name in [&b".."[..], b".", b"a/b", b"\xff\xfe", &[b'x'; 300], b"", b"link"] {
            guest.lookup(node, name);
        }
        for op in
            [Opcode::Getattr, Opcode::Readlink, Opcode::Statfs, Opcode::Access, Opcode::Getxattr, Opcode::Listxattr]
        {
            guest.call(op as u32, node, &[0u8; 24]);
        }
    }
    let after: Vec<_> =
        ["file", "dir", "link"].iter().map(|n| std::fs::symlink_metadata(root.join(n)).unwrap().mtime()).collect();
    assert_eq!(before, after);
}

/// Peak resident memory of this process since the last reset, in bytes.
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line["VmHWM:".len()..].trim().trim_end_matches(" kB").parse::<u64>().unwrap() * 1024
}

/// FUSE_IOCTL, were it past the gate, would have the FUSE server allocate
/// and fill a buffer of the request's `in_size` (up to 4 GiB), checked
/// only against the bytes the chain's readable descriptors add up to, not
/// against the header's length or any cap. Descriptors may alias one
/// buffer, so a guest of any memory size would make the VMM hold
/// `in_size` bytes per request, as often as it likes: 4 GiB of host memory for a guest limited to 512 MiB (on a
/// small host, the OOM killer picks a process; where the allocation fails,
/// the VMM aborts). Here 256 MiB, from 32 aliased 8 MiB descriptors.
/// Held: the gate answers ENOTTY (no share serves ioctls) without reading
/// the body; host memory per request stays bounded by the FUSE limit
/// (1 MiB). Run alone: it reads the process's peak memory.
#[test]
fn an_ioctl_with_a_huge_in_size_costs_the_host_no_memory() {
    const ALIASES: u32 = 32;
    const ALIAS_LEN: u32 = 0x80_0000;
    const _: () = assert!(ALIAS_LEN as usize <= MEM_SIZE);
    const IN_SIZE: u32 = ALIASES * ALIAS_LEN;
    let dir = temp_dir();
    let mut guest = Guest::of_share(dir.as_path(), &Secrets::default());
    let ioctl = fuse_backend_rs::abi::fuse_abi::IoctlIn {
        fh: 0,
        flags: 0,
        cmd: 0x5401,
        arg: 0,
        in_size: IN_SIZE - 4096,
        out_size: 0,
    };
    let (_, len) = guest.write_request(Opcode::Ioctl as u32, ROOT_ID, ioctl.as_slice());
    let mut chain = vec![(REQ_ADDR, len, false)];
    chain.extend((0..ALIASES).map(|_| (0, ALIAS_LEN, false)));
    chain.push((RESP_ADDR, RESP_LEN, true));
    std::fs::write("/proc/self/clear_refs", b"5").unwrap();
    let before = peak_rss();
    let used = guest.run(&chain);
    let grown = peak_rss().saturating_sub(before);
    let header: OutHeader = guest.mem.read_obj(GuestAddress(RESP_ADDR)).unwrap();
    assert!(used as usize >= HEADER && header.error == -libc::ENOTTY, "answered ENOTTY: {}", header.error);
    assert!(grown < 64 << 20, "one request made the VMM hold {} MiB more", grown >> 20);
}

/// Secrets held against a guest that has not read them before: a secret
/// the host replaces by rename, one created during the run where one is
/// named, a hard link to one elsewhere in the share, a secret directory
/// (not listed, nothing in it found, by READDIR or READDIRPLUS), and a
/// guessed node id: none is read, whatever the request.
#[test]
fn secrets_the_guest_never_read_before_stay_closed() {
    let dir = temp_dir();
    let root = dir.as_path();
    std::fs::create_dir_all(root.join("ssh")).unwrap();
    std::fs::create_dir_all(root.join("private")).unwrap();
    std::fs::write(root.join("ssh/host_key"), b"KEY-1").unwrap();
    std::fs::write(root.join("private/token"), b"TOKEN").unwrap();
    std::fs::hard_link(root.join("ssh/host_key"), root.join("linked")).unwrap();
    let secrets = Secrets::at(&[root.join("ssh/host_key"), root.join("ssh/later_key"), root.join("private")]);
    let mut guest = Guest::of_share(root, &secrets);
    let ssh = guest.walk("ws/ssh");
    let key = guest.node(ssh, "host_key");
    let linked = guest.walk("ws/linked");
    for node in [key, linked] {
        assert_eq!(guest.read(node, 0, 4096).errno(), libc::EACCES);
        let seek =
            fuse_backend_rs::abi::fuse_abi::LseekIn { fh: 0, offset: 0, whence: libc::SEEK_DATA as u32, padding: 0 };
        assert_ne!(guest.call(Opcode::Lseek as u32, node, seek.as_slice()).errno(), 0);
    }
    // Replaced by rename (a new identity at the secret's place), and a new
    // secret created where one is named.
    std::fs::write(root.join("ssh/.new"), b"KEY-2").unwrap();
    std::fs::rename(root.join("ssh/.new"), root.join("ssh/host_key")).unwrap();
    std::fs::write(root.join("ssh/later_key"), b"KEY-3").unwrap();
    for name in ["host_key", "later_key"] {
        let node = guest.node(ssh, name);
        assert_eq!(guest.read(node, 0, 4096).errno(), libc::EACCES, "{name}");
    }
    let private = guest.walk("ws/private");
    assert_eq!(guest.lookup(private, b"token").errno(), libc::EACCES);
    assert_eq!(guest.names(private), Err(libc::EACCES));
    assert_eq!(guest.listing(private, 0).errno(), libc::EACCES);
    let token = ino(&root.join("private/token"));
    assert_ne!(guest.read((1 << 56) | token, 0, 4096).errno(), 0, "a guessed node id is no node");
}

/// A big directory with names of every length (a repository crafted for
/// it) listed page by page as Linux asks (READDIRPLUS, 4 KiB, from the
/// last entry's offset), two listings interleaved on one open handle:
/// every name comes exactly once, no page is empty before the end (which
/// the guest would take for the end), and the listing ends.
#[test]
fn a_big_directory_lists_every_name_once_in_interleaved_pages() {
    let dir = temp_dir();
    let big = dir.as_path().join("big");
    std::fs::create_dir(&big).unwrap();
    let mut want: Vec<String> = (0..3000).map(|i| format!("{i}-{}", "n".repeat(i % 240))).collect();
    for name in &want {
        std::fs::write(big.join(name), b"").unwrap();
    }
    let mut guest = Guest::of_share(dir.as_path(), &Secrets::default());
    let node = guest.walk("ws/big");
    let fh = guest.opendir(node).unwrap();
    let mut got = [Vec::new(), Vec::new()];
    let mut offsets = [0u64, 0u64];
    let mut done = [false, false];
    let mut pages = 0;
    while !(done[0] && done[1]) {
        for i in 0..2 {
            if done[i] {
                continue;
            }
            pages += 1;
            assert!(pages < 10_000, "the listing never ends");
            let page = direntplus(guest.page(Opcode::Readdirplus, node, fh, offsets[i]).ok());
            match page.last() {
                None => done[i] = true,
                Some(&(_, _, off)) => offsets[i] = off,
            }
            got[i].extend(page.into_iter().map(|(name, _, _)| name));
        }
    }
    guest.releasedir(node, fh);
    want.sort();
    for mut names in got {
        names.sort();
        assert_eq!(names, want);
    }
}

mod hot_path_bench;

/// The confinement of a file server's worker in the jail (`jail::thread`).
pub(super) enum Worker<'a> {
    /// The read-only shares': a Landlock layer refusing every change and a
    /// descriptor table of its own.
    ReadOnly,
    /// The writable shares': a Landlock layer reaching these shares only.
    Writable(&'a [PathBuf]),
}

/// `attack` on `guest`'s device, in a child process confined as the jail
/// confines `worker`, with its seccomp filter at this kernel's Landlock
/// ABI. How the child ended: a call the filter refuses kills it with
/// SIGSYS (the VMM's report of it ends the VMM), a panic exits 101.
/// Set in a forked jailed worker: its panics are reported by
/// [`jailed_panic_hook`]'s own words.
static IN_JAILED_CHILD: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Installs, once and before any fork, a panic hook that in a jailed child
/// only writes (the default report reads the working directory, which the
/// filter refuses) and elsewhere reports as the default does. Installing
/// it in the child instead waited for the hook's lock, which a test
/// panicking in another thread at the fork held for ever.
fn jailed_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if IN_JAILED_CHILD.load(std::sync::atomic::Ordering::Relaxed) {
                let report = format!("jailed worker: {info}\n");
                let _ = std::io::Write::write_all(&mut std::io::stderr(), report.as_bytes());
            } else {
                default(info);
            }
        }));
    });
}

pub(super) fn in_the_workers_jail<F: FileSystem + Sync>(
    worker: Worker,
    mut guest: Guest<F>,
    attack: impl FnOnce(&mut Guest<F>),
) -> Result<(), String> {
    use crate::jail::{Landlocked, ThreadKind, landlock, seccomp::Filters};
    let abi = landlock::abi_version().map_err(|e| format!("no Landlock: {e}"))?;
    let filters = Filters::build(&crate::vmm::devices::virtio::device_threads(), Landlocked { abi }).unwrap();
    let layer = match worker {
        Worker::ReadOnly => None,
        Worker::Writable(shares) => Some(landlock::Layer::only(shares).unwrap()),
    };
    jailed_panic_hook();
    // SAFETY: the child has only this thread, and glibc's fork leaves its
    // allocator usable there; the child ends with _exit, never returning
    // into the test harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        IN_JAILED_CHILD.store(true, std::sync::atomic::Ordering::Relaxed);
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let kind = match layer {
                None => {
                    landlock::forbid_changes().unwrap();
                    // SAFETY: unshare takes no pointers.
                    assert_eq!(unsafe { libc::unshare(libc::CLONE_FILES) }, 0);
                    ThreadKind::Device(&super::READ_ONLY_THREAD)
                }
                Some(layer) => {
                    layer.restrict_current().unwrap();
                    ThreadKind::Device(&super::WRITABLE_THREAD)
                }
            };
            filters.apply(kind).unwrap();
            attack(&mut guest);
        }));
        // SAFETY: _exit ends the child without running what the parent's
        // copy of the heap would run at exit.
        unsafe { libc::_exit(if ran.is_ok() { 0 } else { 101 }) };
    }
    let mut status = 0;
    // SAFETY: waitpid writes the child's status into `status`.
    assert_eq!(unsafe { libc::waitpid(pid, &raw mut status, 0) }, pid);
    match status {
        s if libc::WIFEXITED(s) && libc::WEXITSTATUS(s) == 0 => Ok(()),
        s if libc::WIFEXITED(s) => Err(format!("the worker panicked (exit {})", libc::WEXITSTATUS(s))),
        s if libc::WIFSIGNALED(s) && libc::WTERMSIG(s) == libc::SIGSYS => {
            Err("the worker made a call its filter refuses (SIGSYS): the VMM stops".into())
        }
        s => Err(format!("the worker ended with wait status {s:#x}")),
    }
}

/// The read-only shares' worker serves a guest in its real jail: looks
/// up, reads, lists, reads links, stats and answers every other request,
/// well formed or not, without a call its filter refuses (which would
/// stop the VMM). The requests' effects are tested unconfined above; this
/// keeps the filter and the server in step.
#[test]
fn the_read_only_worker_serves_every_request_in_its_jail() {
    let dir = temp_dir();
    let root = dir.as_path();
    std::fs::write(root.join("file"), b"content").unwrap();
    std::fs::create_dir(root.join("dir")).unwrap();
    std::os::unix::fs::symlink("file", root.join("link")).unwrap();
    let guest = Guest::init(&[share("/ws", root)], &Secrets::default(), FdBudget { inodes: 64, handles: 64 }, false);
    let served = in_the_workers_jail(Worker::ReadOnly, guest, |guest| {
        let ws = guest.node(ROOT_ID, "ws");
        let file = guest.node(ws, "file");
        let (dir, link) = (guest.node(ws, "dir"), guest.node(ws, "link"));
        assert_eq!(&guest.read(file, 0, 64).ok()[..7], b"content");
        let fh = guest.opendir(ws).unwrap();
        let listing = ReadIn { fh, size: 4096, ..Default::default() };
        guest.call(Opcode::Readdirplus as u32, ws, listing.as_slice()).ok();
        guest.releasedir(ws, fh);
        assert_eq!(guest.call(Opcode::Readlink as u32, link, &[]).ok(), b"file");
        let nodes = [ROOT_ID, ws, file, dir, link, 0, u64::MAX];
        for opcode in 0..64 {
            for &node in &nodes {
                for body in [&[0u8; 64][..], &[0xff; 64], &[0; 4]] {
                    let (_, len) = guest.write_request(opcode, node, body);
                    guest.run(&[(REQ_ADDR, len, false), (RESP_ADDR, RESP_LEN, true)]);
                }
            }
        }
        // The crafted requests forgot the nodes: found again.
        let file = guest.walk("ws/file");
        assert_eq!(&guest.read(file, 0, 64).ok()[..7], b"content", "still serving");
    });
    if let Err(e) = served {
        panic!("{e}");
    }
}

/// The guest's kernel sends FUSE_DESTROY when the last mount of a virtiofs
/// goes (Linux sets `destroy` for every virtiofs): a guest (root, or a
/// command that unmounts the shares' tree) must not stop the VMM with it.
/// The read-only device's filesystem kept the process umask around its
/// inner destroy (for a PassthroughFs that set it), and umask is in no
/// filter: the worker was stopped by SIGSYS and the run ended in "please
/// report this" (exit 159) instead of its command's status.
#[test]
fn a_destroy_leaves_the_read_only_worker_serving_in_its_jail() {
    let dir = temp_dir();
    std::fs::write(dir.as_path().join("file"), b"content").unwrap();
    let guest = Guest::of_share(dir.as_path(), &Secrets::default());
    let served = in_the_workers_jail(Worker::ReadOnly, guest, |guest| {
        let ws = guest.node(ROOT_ID, "ws");
        let file = guest.node(ws, "file");
        assert_eq!(&guest.read(file, 0, 64).ok()[..7], b"content");
        let (_, len) = guest.write_request(Opcode::Destroy as u32, 0, &[]);
        guest.run(&[(REQ_ADDR, len, false), (RESP_ADDR, RESP_LEN, true)]);
    });
    if let Err(e) = served {
        panic!("{e}");
    }
}

/// The boot device's worker (a read-only worker) serves the guest's init
/// in its real jail: it reopens the init from the `O_PATH` descriptor
/// pinning it at the first read, and answers every other request, well
/// formed or not, without a call its filter refuses.
#[test]
fn the_boot_worker_serves_the_init_and_every_request_in_its_jail() {
    let dir = temp_dir();
    let init = dir.as_path().join("init");
    std::fs::write(&init, b"\x7fELF and the rest").unwrap();
    let fs = Fs::boot("boot", &init).unwrap();
    let flags = FsOptions::all().bits() & 0xffff_ffff & !FsOptions::INIT_EXT.bits();
    let guest = Guest::past_init(fs.server, Access::ReadOnly, flags);
    let served = in_the_workers_jail(Worker::ReadOnly, guest, |guest| {
        let node = guest.node(ROOT_ID, "init");
        assert_eq!(guest.read(node, 0, 64).ok(), b"\x7fELF and the rest");
        let nodes = [ROOT_ID, node, 3, 4, 0, u64::MAX];
        for opcode in 0..64 {
            for &node in &nodes {
                for body in [&[0u8; 64][..], &[0xff; 64], &[0; 4]] {
                    let (_, len) = guest.write_request(opcode, node, body);
                    guest.run(&[(REQ_ADDR, len, false), (RESP_ADDR, RESP_LEN, true)]);
                }
            }
        }
        assert_eq!(guest.read(node, 4, 64).ok(), b" and the rest", "still serving");
    });
    if let Err(e) = served {
        panic!("{e}");
    }
}
