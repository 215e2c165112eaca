//! Attacks on directory listings (FUSE_READDIR and FUSE_READDIRPLUS, with
//! or without FUSE_OPENDIR, any handle, offset and size) on the read-only
//! and the writable device, interleaved with lookups, forgets, opens and
//! releases and with changes the host makes to the directory. Each goes
//! through the device's queue processing, the FUSE server, the Vfs and the
//! bounded filesystem, as the guest's requests do, unless it says
//! otherwise. A test headed "Found by attack, now fixed" is an attack that
//! once succeeded; the others guard attacks that held.

use std::ffi::CString;
use std::mem::size_of;
use std::path::Path;
use std::time::Duration;

use fuse_backend_rs::abi::fuse_abi::{
    BatchForgetIn, Dirent, EntryOut, ForgetOne, FsOptions, GetattrIn, Opcode, OutHeader, ROOT_ID, ReadIn,
};
use fuse_backend_rs::api::Vfs;
use fuse_backend_rs::api::filesystem::{Context, FileSystem};
use vm_memory::{ByteValued, Bytes, GuestAddress};

use super::attack_tests::{
    Guest, HEADER, REQ_ADDR, RESP_ADDR, RESP_LEN, descriptors_under, direntplus, ino, read_only_guest, share, temp_dir,
};
use super::bounded::{BoundedFs, FdBudget, HandleCount, ROOT};
use super::device::{Fs, Share};
use super::request::Access;
use super::secrets::Secrets;
use super::tests::{age_atime, atime};

/// A guest of the read-only device serving `shares` whose kernel sends
/// FUSE_OPENDIR (it does not announce FUSE_NO_OPENDIR_SUPPORT at INIT, as
/// a hostile kernel may choose): the Vfs then forwards every opendir and
/// the guest lists through handles.
fn read_only_with_opens(shares: &[Share], secrets: &Secrets, budget: FdBudget) -> Guest {
    Guest::init(shares, secrets, budget, false)
}

/// A guest of the writable device serving `shares`.
fn writable(shares: &[Share], secrets: &Secrets) -> Guest<Vfs> {
    let budget = FdBudget { inodes: 64, handles: 64 };
    let fs = Fs::writable_within("list-rw", shares, secrets, None, budget).unwrap();
    let flags = FsOptions::all().bits() & 0xffff_ffff & !FsOptions::INIT_EXT.bits();
    Guest::past_init(fs.server, Access::Writable, flags)
}

fn budget() -> FdBudget {
    FdBudget { inodes: 64, handles: 64 }
}

/// The share bits of the Vfs's node ids for the share `node` is in.
fn share_bits(node: u64) -> u64 {
    node & !0xff_ffff_ffff_ffff
}

/// The host directory `root` holds `staging/id_ed25519`; the secret is
/// the place `root/private` (as a tool's key directory made during the
/// run). The guest opens `staging` (a handle), the host renames it into
/// the secret's place and writes a new key there; the guest lists through
/// its handle without ever looking the secret's name up. What it gets:
/// the names, or the errno.
fn list_held_directory_renamed_into_secret<F: FileSystem + Sync>(
    guest: &mut Guest<F>,
    root: &Path,
    share_name: &str,
) -> Result<Vec<String>, i32> {
    let staging = guest.walk(&format!("{share_name}/staging"));
    let fh = guest.opendir(staging).unwrap();
    assert_ne!(fh, 0, "the device hands out directory handles");
    assert_eq!(guest.names_through(staging, fh).unwrap(), ["id_ed25519"]);

    std::fs::rename(root.join("staging"), root.join("private")).unwrap();
    std::fs::write(root.join("private/id_rsa"), b"-----BEGIN OPENSSH PRIVATE KEY-----").unwrap();
    for opcode in [Opcode::Readdir, Opcode::Readdirplus] {
        assert_eq!(guest.page(opcode, staging, 0, 0).errno(), libc::ESTALE, "a page naming no handle is refused");
    }
    let listed = guest.names_through(staging, fh);
    guest.releasedir(staging, fh);
    listed
}

// Found by attack, now fixed (finding 1). The guest holds a directory open (FUSE_OPENDIR: always on the
// writable device; on the read-only one when the guest's INIT does not
// announce FUSE_NO_OPENDIR_SUPPORT), the host renames it into a secret
// directory's place (a key directory made during the run) and writes keys
// there. The guest never looks the secret's name up, so the node keeps
// the name it was found by, and a page through the handle checks only
// that the node is no secret by its identity and its recorded names, not
// where the open directory now is: READDIR lists the secret directory's
// names. (`a_directory_renamed_into_a_secret_directorys_place_is_not_listed`
// holds only because that guest looks the secret's name up first.)
// Now: EACCES (or ESTALE: the directory is no longer where it was
// found), as for a listing naming no handle.
#[test]
fn a_directory_held_open_and_renamed_into_a_secrets_place_is_not_listed_unlooked_up() {
    let dir = temp_dir();
    let root = dir.as_path().join("ro");
    std::fs::create_dir_all(root.join("staging")).unwrap();
    std::fs::write(root.join("staging/id_ed25519"), b"KEY").unwrap();
    let secrets = Secrets::at(&[root.join("private")]);
    let mut guest = read_only_with_opens(&[share("/ws", &root)], &secrets, budget());
    let read_only = list_held_directory_renamed_into_secret(&mut guest, &root, "ws");

    let rw = dir.as_path().join("rw");
    std::fs::create_dir_all(rw.join("staging")).unwrap();
    std::fs::write(rw.join("staging/id_ed25519"), b"KEY").unwrap();
    let secrets = Secrets::at(&[rw.join("private")]);
    let mut guest = writable(&[share("/rw", &rw)], &secrets);
    let writable = list_held_directory_renamed_into_secret(&mut guest, &rw, "rw");

    assert!(
        read_only.is_err() && writable.is_err(),
        "the secret directory was listed: read-only device {read_only:?}, writable device {writable:?}"
    );
}

/// The guest opens `share_name/notes` (host `root/notes`), the host moves
/// it to `outside` (out of every share) and creates a file there; the
/// guest lists through its handle. The names, or the errno.
fn list_held_directory_moved_out<F: FileSystem + Sync>(
    guest: &mut Guest<F>,
    root: &Path,
    outside: &Path,
    share_name: &str,
) -> Result<Vec<String>, i32> {
    let notes = guest.walk(&format!("{share_name}/notes"));
    let fh = guest.opendir(notes).unwrap();
    assert_ne!(fh, 0, "the device hands out directory handles");
    assert_eq!(guest.names_through(notes, fh).unwrap(), ["todo.txt"]);

    std::fs::rename(root.join("notes"), outside.join("notes")).unwrap();
    std::fs::write(outside.join("notes/salary-2027.ods"), b"private").unwrap();
    assert_eq!(guest.listing(notes, 0).errno(), libc::ESTALE, "a fresh listing knows it moved");
    let listed = guest.names_through(notes, fh);
    guest.releasedir(notes, fh);
    listed
}

// Found by attack, now fixed (finding 2). The guest holds a directory open, the host moves it out of
// the share (to a private place) and keeps working there: READDIR
// through the handle lists what the host now has outside every share
// (here a file created after the move), on the read-only device (guest
// kernel sending opendir) and on the writable one. A listing naming no
// handle and every other request on the node answer ESTALE, and the
// module promises that "a directory the host moved out of the share is
// not served from its new place"; reads naming no handle check the
// node's place on each read (`a_file_moved_out_of_the_share_is_not_read_
// from_its_new_place`), listings through a handle do not. Now: ESTALE.
#[test]
fn a_directory_held_open_and_moved_out_of_the_share_is_not_listed() {
    let dir = temp_dir();
    let outside = dir.as_path().join("outside");
    std::fs::create_dir(&outside).unwrap();

    let ro = dir.as_path().join("ro");
    std::fs::create_dir_all(ro.join("notes")).unwrap();
    std::fs::write(ro.join("notes/todo.txt"), b"shared").unwrap();
    let mut guest = read_only_with_opens(&[share("/ws", &ro)], &Secrets::default(), budget());
    let read_only = list_held_directory_moved_out(&mut guest, &ro, &outside, "ws");

    let rw = dir.as_path().join("rw");
    std::fs::create_dir_all(rw.join("notes")).unwrap();
    std::fs::write(rw.join("notes/todo.txt"), b"shared").unwrap();
    let elsewhere = dir.as_path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let mut guest = writable(&[share("/rw", &rw)], &Secrets::default());
    let writable = list_held_directory_moved_out(&mut guest, &rw, &elsewhere, "rw");

    assert!(
        read_only.is_err() && writable.is_err(),
        "a directory outside the share was listed: read-only device {read_only:?}, writable device {writable:?}"
    );
}

// Found by attack, now fixed (finding 3, by the guest alone). A READDIRPLUS whose reply buffer holds
// exactly `size` bytes: the server checks each entry against `size`, but
// the header already took 16 bytes of the buffer, so the entry that fills
// the last 16 bytes fails to encode. The bounded filesystem forgets that
// entry (`a_listing_whose_reply_failed_leaves_no_node_to_guess_and_the_
// secret_closed` has only one), but not the entries encoded before it,
// and the server answers the page with an error: their lookups stay
// counted for nodes the guest never got, so they are held for the life of
// the mount (a guest repeats this over every directory: the nodes, their
// names and their parents pile up) and a guessed node id (the host inode
// number) reaches them. Now: none of the page's nodes is held.
#[test]
fn a_listing_whose_reply_fails_after_some_entries_holds_none_of_them() {
    let dir = temp_dir();
    let root = dir.as_path();
    std::fs::create_dir(root.join("d")).unwrap();
    // Two entries of 160 bytes each (EntryOut, Dirent and an 8-byte name).
    for name in ["aaaaaaaa", "bbbbbbbb"] {
        std::fs::write(root.join("d").join(name), name).unwrap();
    }
    let mut guest = read_only_guest(root, &Secrets::default());
    let d = guest.walk("ws/d");
    let size = u32::try_from(2 * (size_of::<EntryOut>() + size_of::<Dirent>() + 8)).unwrap();
    let list = ReadIn { fh: 0, size, ..Default::default() };
    let (unique, len) = guest.write_request(Opcode::Readdirplus as u32, d, list.as_slice());
    let used = guest.run(&[(REQ_ADDR, len, false), (RESP_ADDR, size, true)]);
    let header: OutHeader = guest.mem.read_obj(GuestAddress(RESP_ADDR)).unwrap();
    assert_eq!((header.unique, used as usize), (unique, HEADER), "an error reply: the guest gets no entry");
    assert_ne!(header.error, 0);

    let mut held = Vec::new();
    for name in ["aaaaaaaa", "bbbbbbbb"] {
        let guessed = share_bits(d) | ino(&root.join("d").join(name));
        if guest.getattr(guessed).header.error == 0 {
            held.push(name);
        }
    }
    assert_eq!(held, Vec::<&str>::new(), "nodes held for entries the guest never got");
}

// Found by attack, now fixed (finding 3, with the host). The same when the page fails midway:
// a READDIRPLUS page counts a lookup for each entry it encodes; when the
// page then fails (the attack's way was a lookup failing with ESTALE as
// the host renamed the directory while the page was made; the page now
// finds its directory once, so the encoder failing stands for it here),
// the listing returns the error, the FUSE server replies with it and
// drops the encoded entries, and the lookups counted for them stayed: the
// guest never heard of those nodes and never forgets them, so the server
// held them (and their names, and their parents) for the life of the
// mount, and a guessed node id reached them. Played on the bounded
// filesystem itself, its `add_entry` standing for the server's encoder.
// Now the entries already encoded are forgotten when the page fails.
#[test]
fn a_listing_failing_midway_keeps_no_lookup_the_guest_never_got() {
    let dir = temp_dir();
    let root = dir.as_path();
    std::fs::create_dir(root.join("d")).unwrap();
    for name in ["a", "b", "c"] {
        std::fs::write(root.join("d").join(name), name).unwrap();
    }
    let fs = BoundedFs::new(root, &Secrets::default(), 16, &HandleCount::default(), 16, Duration::ZERO).unwrap();
    let ctx = Context::default();
    let d = fs.lookup(&ctx, ROOT, &CString::new("d").unwrap()).unwrap().inode;
    let mut encoded = Vec::new();
    let listed = fs.readdirplus(&ctx, d, 0, 4096, 0, &mut |_, entry| {
        if !encoded.is_empty() {
            return Err(std::io::Error::from_raw_os_error(libc::EIO));
        }
        encoded.push(entry.inode);
        Ok(1)
    });
    assert_eq!(encoded.len(), 1, "one entry encoded before the failing one");
    assert_eq!(listed.map_err(|e| e.raw_os_error()), Err(Some(libc::EIO)), "the page fails: the guest gets none");
    let held = fs.getattr(&ctx, encoded[0], None);
    assert!(
        held.is_err(),
        "node {:#x} of an entry the guest never got is still held (a lookup it never forgets)",
        encoded[0]
    );
}

/// A page finds its directory once, as its listing does, and again once
/// it is made: the host moving the directory out of the share, or into a
/// secret's place, while a page is made fails the page (ESTALE), so no
/// entry stat'ed through the page's descriptor after the move reaches the
/// guest, and the guest holds none of its entries. Found by attack on the
/// page's one descriptor: the rest of the page was stat'ed inside the
/// secret directory and handed over.
#[test]
fn a_directory_moved_while_a_page_is_made_fails_the_page() {
    for secret_place in [false, true] {
        let dir = temp_dir();
        let root = dir.as_path().join("share");
        std::fs::create_dir_all(root.join("d")).unwrap();
        for name in ["a", "b", "c"] {
            std::fs::write(root.join("d").join(name), "").unwrap();
        }
        let secrets = Secrets::at(&[root.join("private")]);
        let fs = BoundedFs::new(&root, &secrets, 16, &HandleCount::default(), 16, Duration::ZERO).unwrap();
        let ctx = Context::default();
        let d = fs.lookup(&ctx, ROOT, &CString::new("d").unwrap()).unwrap().inode;
        let place = if secret_place { root.join("private") } else { dir.as_path().join("outside") };
        let mut encoded = Vec::new();
        let listed = fs.readdirplus(&ctx, d, 0, 4096, 0, &mut |_, entry| {
            if encoded.is_empty() {
                std::fs::rename(root.join("d"), &place).unwrap();
                for name in ["a", "b", "c"] {
                    std::fs::write(place.join(name), b"PRIVATE KEY").unwrap();
                }
            }
            encoded.push(entry.inode);
            Ok(1)
        });
        assert_eq!(listed.map_err(|e| e.raw_os_error()), Err(Some(libc::ESTALE)), "secret place: {secret_place}");
        for node in encoded.into_iter().chain([d]) {
            assert!(fs.getattr(&ctx, node, None).is_err(), "node {node:#x} is held or served from its new place");
        }
    }
}

// Found by attack, now fixed (finding 4). The writable device has no `ReadOnlyFs` in front of its Vfs,
// so the guard that keeps the Vfs's own directory above the shares from
// computing `offset + 1` at u64::MAX (fixed for the read-only device by
// `a_listing_above_the_shares_at_the_last_offset_is_answered`) is missing
// there: READDIR or READDIRPLUS of the guest's root at offset u64::MAX
// overflows in fuse-backend-rs's PseudoFs, a panic where overflow checks
// are on (debug builds, the tests): caught, the request goes back with
// no reply written, not even a header. (A release build wraps to an
// empty page.) Now: an empty page, as on the read-only device.
#[test]
fn a_writable_devices_root_listed_at_the_last_offset_is_answered() {
    let dir = temp_dir();
    let mut guest = writable(&[share("/rw", dir.as_path())], &Secrets::default());
    for opcode in [Opcode::Readdir, Opcode::Readdirplus] {
        let list = ReadIn { fh: 0, offset: u64::MAX, size: 4096, ..Default::default() };
        let (unique, len) = guest.write_request(opcode as u32, ROOT_ID, list.as_slice());
        let used = guest.run(&[(REQ_ADDR, len, false), (RESP_ADDR, RESP_LEN, true)]);
        assert!(used as usize >= HEADER, "{opcode:?} of the root at offset u64::MAX went unanswered");
        let header: OutHeader = guest.mem.read_obj(GuestAddress(RESP_ADDR)).unwrap();
        assert_eq!(header.unique, unique);
    }
}

/// Which node ids of a READDIRPLUS body, by name.
fn nodes_of(body: &[u8]) -> Vec<(String, u64)> {
    direntplus(body).into_iter().map(|(name, entry, _)| (name, entry.nodeid)).collect()
}

/// A guest lists through a handle of one directory while naming another
/// node (a secret directory, a file, the share root, a guessed id): a
/// page reads the handle's directory, and the entries' attributes are
/// looked up in the node named. Held: nothing in the secret directory is
/// listed or found (its lookups are refused), a file gives ENOTDIR, the
/// root only finds what it holds itself, and a guessed node is refused.
#[test]
fn a_handle_listed_under_another_node_never_reaches_a_secret() {
    let dir = temp_dir();
    let root = dir.as_path();
    std::fs::create_dir(root.join("keys")).unwrap();
    std::fs::write(root.join("keys/shared-name"), b"SECRET").unwrap();
    std::fs::create_dir(root.join("pub")).unwrap();
    std::fs::write(root.join("pub/shared-name"), b"public").unwrap();
    std::fs::write(root.join("pub/keys"), b"a file named like the secret directory").unwrap();
    std::fs::write(root.join("file"), b"f").unwrap();
    let secrets = Secrets::at(&[root.join("keys")]);
    let mut guest = read_only_with_opens(&[share("/ws", root)], &secrets, budget());
    let ws = guest.walk("ws");
    let keys = guest.node(ws, "keys");
    let file = guest.node(ws, "file");
    let public = guest.node(ws, "pub");
    let fh = guest.opendir(public).unwrap();

    assert_eq!(guest.page(Opcode::Readdirplus, keys, fh, 0).errno(), libc::EACCES, "lookups in the secret");
    assert_eq!(guest.page(Opcode::Readdirplus, file, fh, 0).errno(), libc::ENOTDIR);
    let guessed = share_bits(ws) | ino(&root.join("keys/shared-name"));
    assert_ne!(guest.page(Opcode::Readdirplus, guessed, fh, 0).errno(), 0, "a guessed node is no directory");
    // Under the share root, "keys" is the secret directory itself (found,
    // not listed) and "shared-name" is not there.
    let under_root = guest.page(Opcode::Readdirplus, ws, fh, 0);
    let found = nodes_of(under_root.ok());
    assert_eq!(found, [("keys".to_string(), keys)], "only what the root holds");
    assert_eq!(guest.names(keys), Err(libc::EACCES));
    // READDIR under the secret's node lists the handle's directory, the
    // public one, not the secret.
    let mut names = guest.names_through(keys, fh).unwrap();
    names.sort();
    assert_eq!(names, ["keys", "shared-name"]);
    guest.releasedir(public, fh);
    let key = guest.lookup(keys, b"shared-name");
    assert_eq!(key.errno(), libc::EACCES);
}

/// Node ids of READDIRPLUS pages of `node` naming no handle, of `size`
/// bytes each, from offset 0 to the end.
fn list_in_pages<F: FileSystem + Sync>(guest: &mut Guest<F>, node: u64, size: u32) -> Vec<(String, u64)> {
    let mut all = Vec::new();
    let mut offset = 0;
    for _ in 0..10_000 {
        let list = ReadIn { fh: 0, offset, size, ..Default::default() };
        let reply = guest.call(Opcode::Readdirplus as u32, node, list.as_slice());
        let page = direntplus(reply.ok());
        let Some(&(_, _, last)) = page.last() else { return all };
        offset = last;
        all.extend(page.into_iter().map(|(name, entry, _)| (name, entry.nodeid)));
    }
    panic!("the listing never ends");
}

/// A guest lists a directory in pages too small for more than one entry
/// with attributes (each page looks the next name up, which the reply
/// cannot take), twice, then forgets each node once per time it was
/// handed out, in one BATCH_FORGET and in single FORGETs. Held: the
/// server counts exactly what it handed out, so every node is then gone
/// (a guessed id finds nothing), and the same listing gives the same ids
/// again; a node still looked up by the guest is kept through all this.
#[test]
fn listings_in_pages_too_small_count_only_the_entries_handed_out() {
    let dir = temp_dir();
    let root = dir.as_path();
    std::fs::create_dir(root.join("d")).unwrap();
    let names: Vec<String> = (0..20).map(|i| format!("entry-{i:02}")).collect();
    for name in &names {
        std::fs::write(root.join("d").join(name), name).unwrap();
    }
    let mut guest = read_only_guest(root, &Secrets::default());
    let d = guest.walk("ws/d");
    let kept = guest.node(d, "entry-00");
    let page = u32::try_from(size_of::<EntryOut>() + size_of::<Dirent>() + 8 + 8).unwrap();
    let first = list_in_pages(&mut guest, d, page);
    let second = list_in_pages(&mut guest, d, page);
    let mut listed: Vec<String> = first.iter().map(|(name, _)| name.clone()).collect();
    listed.sort();
    assert_eq!(listed, names, "every name once, one page each");
    assert_eq!(first, second, "the same ids again");

    let (batch, single) = first.split_at(10);
    let forgets: Vec<ForgetOne> = batch.iter().map(|&(_, nodeid)| ForgetOne { nodeid, nlookup: 2 }).collect();
    let mut body = BatchForgetIn { count: u32::try_from(forgets.len()).unwrap(), dummy: 0 }.as_slice().to_vec();
    for one in &forgets {
        body.extend_from_slice(one.as_slice());
    }
    guest.send(Opcode::BatchForget as u32, 0, &body);
    for &(_, nodeid) in single {
        for _ in 0..2 {
            guest.send(
                Opcode::Forget as u32,
                nodeid,
                fuse_backend_rs::abi::fuse_abi::ForgetIn { nlookup: 1 }.as_slice(),
            );
        }
    }
    for (name, nodeid) in &first {
        let attr = guest.call(Opcode::Getattr as u32, *nodeid, GetattrIn::default().as_slice());
        if *nodeid == kept {
            assert_eq!(attr.errno(), 0, "{name}: the guest's own lookup keeps it");
        } else {
            assert_eq!(attr.errno(), libc::ESTALE, "{name}: forgotten as often as handed out, yet held");
        }
    }
    assert_eq!(list_in_pages(&mut guest, d, page), first, "listed again, the same ids");
}

/// Listings that fail every way (a file, a secret directory, a directory
/// the host removed, a guessed node, a made-up handle, an offset past the
/// end, a size too small for one entry) and listings naming no handle
/// while the guest holds every handle the cap allows: each listing naming
/// no handle is refused (ENFILE) while the cap is reached and served once
/// a handle is released. Held: no failure keeps a descriptor or a count
/// of an open handle, so the cap's handles can all be opened again, and
/// the device holds no more descriptors than its budget.
#[test]
fn failed_listings_leave_no_descriptor_and_no_handle_counted() {
    let dir = temp_dir();
    let root = dir.as_path();
    std::fs::create_dir(root.join("keys")).unwrap();
    std::fs::create_dir(root.join("gone")).unwrap();
    std::fs::write(root.join("file"), b"x").unwrap();
    for i in 0..20 {
        std::fs::create_dir(root.join(format!("d{i}"))).unwrap();
    }
    let budget = FdBudget { inodes: 16, handles: 16 };
    let mut guest = read_only_with_opens(&[share("/ws", root)], &Secrets::at(&[root.join("keys")]), budget);
    let ws = guest.walk("ws");
    let file = guest.node(ws, "file");
    let keys = guest.node(ws, "keys");
    let gone = guest.node(ws, "gone");
    std::fs::remove_dir(root.join("gone")).unwrap();
    let dirs: Vec<u64> = (0..20).map(|i| guest.node(ws, &format!("d{i}"))).collect();
    let most = budget.inodes + budget.handles + 8 + 1;
    for _ in 0..50 {
        for node in [file, keys, gone, share_bits(ws) | ino(&root.join("file")), ws, dirs[0]] {
            for (fh, offset, size) in [(0, 0, 4096), (7777, 0, 4096), (0, 1 << 62, 4096), (0, 0, 8), (u64::MAX, 0, 0)] {
                for opcode in [Opcode::Readdir, Opcode::Readdirplus] {
                    let list = ReadIn { fh, offset, size, ..Default::default() };
                    guest.call(opcode as u32, node, list.as_slice());
                }
            }
        }
    }
    assert!(descriptors_under(root) <= most, "{} descriptors, at most {most}", descriptors_under(root));

    let handles: Vec<(u64, u64)> =
        dirs.iter().take(budget.handles).map(|&node| (node, guest.opendir(node).unwrap())).collect();
    assert_eq!(guest.opendir(dirs[budget.handles]), Err(libc::ENFILE), "the cap is reached");
    let list = ReadIn { fh: 0, size: 4096, ..Default::default() };
    assert_eq!(
        guest.call(Opcode::Readdir as u32, ws, list.as_slice()).errno(),
        libc::ENFILE,
        "no descriptor to list with"
    );
    assert!(descriptors_under(root) <= most, "{} descriptors, at most {most}", descriptors_under(root));
    let (node, fh) = handles[0];
    guest.releasedir(node, fh);
    assert_eq!(guest.call(Opcode::Readdir as u32, ws, list.as_slice()).errno(), 0, "served once one is released");
    for &(node, fh) in &handles[1..] {
        guest.releasedir(node, fh);
    }
    let again: Vec<(u64, u64)> =
        dirs.iter().take(budget.handles).map(|&node| (node, guest.opendir(node).unwrap())).collect();
    for (node, fh) in again {
        guest.releasedir(node, fh);
    }
}

/// Listings through a handle on the read-only device (a guest kernel
/// sending opendir), naming no handle and through a handle on the
/// writable one, with and without attributes, of the share root and of a
/// directory below it. Held: the host's access times of the directories
/// and of the files listed stay as they were (relatime would update them
/// on a plain open), and nothing changes in the read-only share.
#[test]
fn listings_on_either_device_leave_host_access_times_alone() {
    let dir = temp_dir();
    for writable_share in [false, true] {
        let root = dir.as_path().join(if writable_share { "rw" } else { "ro" });
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/inner.txt"), b"inner").unwrap();
        std::fs::write(root.join("top.txt"), b"top").unwrap();
        let paths = [root.clone(), root.join("sub"), root.join("sub/inner.txt"), root.join("top.txt")];
        for path in &paths {
            age_atime(path);
        }
        let before: Vec<i64> = paths.iter().map(|p| atime(p)).collect();
        let mtimes: Vec<_> = paths.iter().map(|p| std::fs::metadata(p).unwrap().modified().unwrap()).collect();
        let listed = |guest_root: u64, sub: u64, guest: &mut dyn FnMut(u64, u64, Opcode) -> Vec<u8>| {
            for opcode in [Opcode::Readdir, Opcode::Readdirplus] {
                for node in [guest_root, sub] {
                    for fh in [0, u64::MAX] {
                        guest(node, fh, opcode);
                    }
                }
            }
        };
        if writable_share {
            let mut guest = writable(&[share("/rw", &root)], &Secrets::default());
            let (rw, sub) = (guest.walk("rw"), guest.walk("rw/sub"));
            listed(rw, sub, &mut |node, fh, opcode| {
                let fh = if fh == 0 { 0 } else { guest.opendir(node).unwrap() };
                let body = guest.page(opcode, node, fh, 0).ok().to_vec();
                guest.releasedir(node, fh);
                body
            });
        } else {
            let mut guest = read_only_with_opens(&[share("/ws", &root)], &Secrets::default(), budget());
            let (ws, sub) = (guest.walk("ws"), guest.walk("ws/sub"));
            listed(ws, sub, &mut |node, fh, opcode| {
                let fh = if fh == 0 { 0 } else { guest.opendir(node).unwrap() };
                let body = guest.page(opcode, node, fh, 0).ok().to_vec();
                guest.releasedir(node, fh);
                body
            });
        }
        let after: Vec<i64> = paths.iter().map(|p| atime(p)).collect();
        assert_eq!(after, before, "access times changed by listings (writable: {writable_share})");
        let now: Vec<_> = paths.iter().map(|p| std::fs::metadata(p).unwrap().modified().unwrap()).collect();
        assert_eq!(now, mtimes);
    }
}

/// The read-only device as Linux mounts it (FUSE_NO_OPENDIR_SUPPORT
/// announced at INIT): no directory handle is ever handed out, so the
/// host's moves of a directory the guest listed (into a secret's place,
/// out of the share) leave nothing to list it through. Held: opendir is
/// ENOSYS, a made-up handle is EBADF, and a page naming no handle finds
/// the directory by its names: ESTALE, with or without attributes.
#[test]
fn without_opendir_a_directory_the_host_moved_is_not_listed_at_all() {
    let dir = temp_dir();
    let root = dir.as_path().join("ws");
    let outside = dir.as_path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::create_dir_all(root.join("staging")).unwrap();
    std::fs::create_dir_all(root.join("notes")).unwrap();
    std::fs::write(root.join("staging/id_ed25519"), b"KEY").unwrap();
    std::fs::write(root.join("notes/todo.txt"), b"shared").unwrap();
    let mut guest = read_only_guest(&root, &Secrets::at(&[root.join("private")]));
    let staging = guest.walk("ws/staging");
    let notes = guest.walk("ws/notes");
    for node in [staging, notes] {
        assert_eq!(guest.opendir(node), Ok(0), "opendir is declined (ENOSYS)");
        assert_eq!(guest.names(node).unwrap().len(), 1);
    }
    std::fs::rename(root.join("staging"), root.join("private")).unwrap();
    std::fs::rename(root.join("notes"), outside.join("notes")).unwrap();
    for node in [staging, notes] {
        for opcode in [Opcode::Readdir, Opcode::Readdirplus] {
            assert_eq!(guest.page(opcode, node, 0, 0).errno(), libc::ESTALE, "{opcode:?}");
            for fh in [1, 2, u64::MAX] {
                assert_eq!(guest.page(opcode, node, fh, 0).errno(), libc::EBADF, "{opcode:?} through handle {fh}");
            }
        }
    }
}

// Found by attack, now fixed (finding 5, beside the listings: the same gap
// for files). The guest holds
// a file open (FUSE_OPEN: on the writable device, or on the read-only one
// when its INIT does not announce FUSE_NO_OPEN_SUPPORT), the host moves the
// file's directory out of the share and writes the file there: a read
// through the handle checks only that the node is no secret, not where
// the file now is, and serves what the host wrote outside every share;
// on the writable device a write through a handle opened for writing
// checks nothing and changes the host's file outside the share. Reads
// naming no handle refuse it (ESTALE, see
// `a_file_moved_out_of_the_share_is_not_read_from_its_new_place`).
// Now: ESTALE, as for those reads.
#[test]
fn a_file_held_open_and_moved_out_of_the_share_is_not_read_or_written() {
    use fuse_backend_rs::abi::fuse_abi::{OpenIn, OpenOut, WriteIn};
    let dir = temp_dir();
    let outside = dir.as_path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let setup = |name: &str| {
        let root = dir.as_path().join(name);
        std::fs::create_dir_all(root.join("notes")).unwrap();
        std::fs::write(root.join("notes/todo.txt"), b"shared").unwrap();
        root
    };
    let move_out = |root: &Path, name: &str| {
        std::fs::rename(root.join("notes"), outside.join(name)).unwrap();
        std::fs::write(outside.join(name).join("todo.txt"), b"PRIVATE: written outside").unwrap();
    };
    let body = |reply: super::attack_tests::Reply| {
        String::from_utf8_lossy(if reply.header.error == 0 { &reply.body } else { b"" }).into_owned()
    };

    let ro = setup("ro");
    let mut guest = read_only_with_opens(&[share("/ws", &ro)], &Secrets::default(), budget());
    let file = guest.walk("ws/notes/todo.txt");
    let fh = guest.open(Opcode::Open, file).obj::<OpenOut>().fh;
    move_out(&ro, "ro-notes");
    assert_eq!(guest.read(file, 0, 4096).errno(), libc::ESTALE, "a read naming no handle is refused");
    let read_only = body(guest.read_handle(file, fh, 0, 4096));

    let rw = setup("rw");
    let mut guest = writable(&[share("/rw", &rw)], &Secrets::default());
    let file = guest.walk("rw/notes/todo.txt");
    let open = OpenIn { flags: libc::O_RDWR.cast_unsigned(), fuse_flags: 0 };
    let fh = guest.call(Opcode::Open as u32, file, open.as_slice()).obj::<OpenOut>().fh;
    move_out(&rw, "rw-notes");
    let writable_read = body(guest.read_handle(file, fh, 0, 4096));
    let write = WriteIn { fh, offset: 0, size: 7, ..Default::default() };
    guest.call(Opcode::Write as u32, file, &[write.as_slice(), b"GUEST: "].concat());
    let after = String::from_utf8_lossy(&std::fs::read(outside.join("rw-notes/todo.txt")).unwrap()).into_owned();

    assert!(
        !read_only.contains("PRIVATE") && !writable_read.contains("PRIVATE") && !after.starts_with("GUEST"),
        "through a handle, outside the share: read-only device read {read_only:?}, writable device read \
         {writable_read:?}, the host's file outside is now {after:?}"
    );
}
