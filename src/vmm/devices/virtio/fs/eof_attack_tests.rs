//! Attacks on where a directory listing ends (FUSE_READDIR and
//! FUSE_READDIRPLUS at any size and offset): a reply with room left for
//! the longest entry is the end (guest kernel patch 0004), so a short
//! reply anywhere else loses the rest of the directory; pages resumed at
//! the last entry's offset give each name once; a page's lookups balance
//! against the guest's forgets. Each goes through the device's queue
//! processing, the FUSE server, the Vfs and the bounded filesystem unless
//! it says otherwise.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::mem::size_of;
use std::time::Duration;

use fuse_backend_rs::abi::fuse_abi::{Dirent, Direntplus, ForgetIn, Opcode, OutHeader, ReadIn};
use fuse_backend_rs::api::filesystem::{Context, FileSystem};
use vm_memory::{ByteValued, Bytes, GuestAddress};

use super::attack_tests::{
    Guest, HEADER, REQ_ADDR, RESP_ADDR, RESP_LEN, descriptors_under, direntplus, read_only_guest, temp_dir,
};
use super::bounded::{BoundedFs, HandleCount, ROOT};
use super::secrets::Secrets;

const NAME_MAX: usize = 255;

fn pad8(n: usize) -> usize {
    (n + 7) & !7
}

/// The longest entry a reply of `opcode` may hold.
fn largest(opcode: Opcode) -> usize {
    match opcode {
        Opcode::Readdirplus => pad8(size_of::<Direntplus>() + NAME_MAX),
        _ => pad8(size_of::<Dirent>() + NAME_MAX),
    }
}

/// The names and next offsets of a READDIR reply.
fn dirents(mut body: &[u8]) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    while body.len() >= size_of::<Dirent>() {
        let d = *Dirent::from_slice(&body[..size_of::<Dirent>()]).unwrap();
        let end = size_of::<Dirent>() + d.namelen as usize;
        out.push((String::from_utf8_lossy(&body[size_of::<Dirent>()..end]).into_owned(), d.off));
        body = &body[pad8(end).min(body.len())..];
    }
    out
}

/// One page of `opcode` of `node` from `offset` asking `size` bytes, with
/// a reply buffer of `room` bytes (the header included).
fn page_of<F: FileSystem + Sync>(
    guest: &mut Guest<F>,
    opcode: Opcode,
    node: u64,
    offset: u64,
    size: u32,
    room: u32,
) -> Result<Vec<u8>, i32> {
    let list = ReadIn { fh: 0, offset, size, ..Default::default() };
    let (unique, len) = guest.write_request(opcode as u32, node, list.as_slice());
    let used = guest.run(&[(REQ_ADDR, len, false), (RESP_ADDR, room, true)]);
    assert!(used as usize >= HEADER, "{opcode:?} size {size} offset {offset:#x} went unanswered");
    let header: OutHeader = guest.mem.read_obj(GuestAddress(RESP_ADDR)).unwrap();
    assert_eq!(header.unique, unique);
    if header.error != 0 {
        return Err(-header.error);
    }
    let mut body = vec![0; used as usize - HEADER];
    guest.mem.read_slice(&mut body, GuestAddress(RESP_ADDR + HEADER as u64)).unwrap();
    Ok(body)
}

/// Creates `root/d` holding a file for each of `varied_names()`; returns
/// the names.
fn varied_dir(root: &std::path::Path) -> Vec<String> {
    std::fs::create_dir(root.join("d")).unwrap();
    let names = varied_names();
    for n in &names {
        std::fs::write(root.join("d").join(n), b"x").unwrap();
    }
    names
}

/// Names of every length, 1 to 255 bytes, some near the 8-byte padding.
fn varied_names() -> Vec<String> {
    let mut names = Vec::new();
    for (i, len) in [1usize, 2, 7, 8, 9, 15, 16, 17, 100, 127, 128, 200, 247, 248, 249, 250, 254, 255, 255, 255]
        .into_iter()
        .chain(1..=40)
        .enumerate()
    {
        let prefix = format!("{i:03}");
        let mut name = prefix.clone();
        while name.len() < len.max(3) {
            name.push(char::from(b"abcdefghijklmnopqrstuvwxyz"[name.len() % 26]));
        }
        name.truncate(len.max(3));
        names.push(name);
    }
    names.sort();
    names.dedup();
    names
}

/// Lists `node` to its end, pages of `size` bytes resumed at the last
/// entry's offset, as the guest kernel does: checks that every reply with
/// room for the longest entry is the end (`expected` all listed), forgets
/// each READDIRPLUS entry once. The names in order, or the errno.
fn list_paged<F: FileSystem + Sync>(
    guest: &mut Guest<F>,
    opcode: Opcode,
    node: u64,
    size: u32,
    expected: &[String],
    between: &mut dyn FnMut(usize),
) -> Result<Vec<String>, i32> {
    let room = RESP_LEN;
    let usable = (size as usize).min(room as usize - HEADER);
    let mut all: Vec<String> = Vec::new();
    let mut offset = 0;
    for pages in 0.. {
        assert!(pages < 10_000, "{opcode:?} size {size}: the listing never ends");
        between(pages);
        let body = page_of(guest, opcode, node, offset, size, room)?;
        let page: Vec<(String, u64)> = match opcode {
            Opcode::Readdirplus => {
                let plus = direntplus(&body);
                for (_, entry, _) in &plus {
                    guest.send(Opcode::Forget as u32, entry.nodeid, ForgetIn { nlookup: 1 }.as_slice());
                }
                plus.into_iter().map(|(n, _, off)| (n, off)).collect()
            }
            _ => dirents(&body),
        };
        assert!(body.len() <= usable, "{opcode:?} size {size}: a reply of {} bytes", body.len());
        let Some((_, last)) = page.last() else { break };
        offset = *last;
        all.extend(page.into_iter().map(|(n, _)| n));
        if usable - body.len() >= largest(opcode) {
            let mut missing: Vec<&String> = expected.iter().filter(|n| !all.contains(n)).collect();
            missing.sort();
            assert!(
                missing.is_empty(),
                "{opcode:?} size {size}: page {pages} left {} of {usable} bytes unused (the end, to the guest) \
                 with {} names not yet listed: {:?}",
                usable - body.len(),
                missing.len(),
                &missing[..missing.len().min(4)]
            );
        }
    }
    Ok(all)
}

fn assert_each_once(opcode: Opcode, size: u32, listed: &[String], expected: &[String]) {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for n in listed {
        *counts.entry(n).or_default() += 1;
    }
    let twice: Vec<_> = counts.iter().filter(|(_, c)| **c > 1).map(|(n, _)| *n).collect();
    assert!(twice.is_empty(), "{opcode:?} size {size}: names listed more than once: {twice:?}");
    let missing: Vec<_> = expected.iter().filter(|n| !counts.contains_key(n.as_str())).collect();
    assert!(missing.is_empty(), "{opcode:?} size {size}: names never listed: {missing:?}");
}

fn sizes(opcode: Opcode) -> Vec<u32> {
    let l = u32::try_from(largest(opcode)).unwrap();
    vec![
        l,
        l + 1,
        l + 7,
        l + 8,
        2 * l - 1,
        2 * l,
        1000,
        1024,
        4095,
        4096,
        4097,
        8192,
        65536,
        RESP_LEN - u32::try_from(HEADER).unwrap(),
    ]
}

/// Guard. READDIR and READDIRPLUS at every size from one longest entry
/// up to far past the reply buffer, over names of 1 to 255 bytes: a
/// reply ends short only at the end, and each name comes once.
#[test]
fn eof_attack_every_size_ends_short_only_at_the_end() {
    let dir = temp_dir();
    let root = dir.as_path();
    let names = varied_dir(root);
    let mut guest = read_only_guest(root, &Secrets::default());
    let d = guest.walk("ws/d");
    for opcode in [Opcode::Readdir, Opcode::Readdirplus] {
        for size in sizes(opcode) {
            let listed = list_paged(&mut guest, opcode, d, size, &names, &mut |_| {})
                .unwrap_or_else(|e| panic!("{opcode:?} size {size}: errno {e}"));
            assert_each_once(opcode, size, &listed, &names);
        }
        // Past the reply buffer: refused whole (ENOMEM, by the server),
        // never a short page.
        for size in [RESP_LEN + 1, 1 << 20, u32::MAX] {
            assert_eq!(page_of(&mut guest, opcode, d, 0, size, RESP_LEN), Err(libc::ENOMEM), "{opcode:?} size {size}");
        }
    }
}

/// Guard. Every size from one longest READDIRPLUS entry to 4 KiB, byte by
/// byte stepped by 8, over a directory of 255-byte names only.
#[test]
fn eof_attack_long_names_at_every_size() {
    let dir = temp_dir();
    let root = dir.as_path();
    std::fs::create_dir(root.join("d")).unwrap();
    let names: Vec<String> = (0..30).map(|i| format!("{i:03}{}", "n".repeat(NAME_MAX - 3))).collect();
    for n in &names {
        std::fs::write(root.join("d").join(n), b"x").unwrap();
    }
    let mut guest = read_only_guest(root, &Secrets::default());
    let d = guest.walk("ws/d");
    for opcode in [Opcode::Readdir, Opcode::Readdirplus] {
        let from = u32::try_from(largest(opcode)).unwrap();
        for size in (from..=4096).step_by(13) {
            let listed = list_paged(&mut guest, opcode, d, size, &names, &mut |_| {}).unwrap();
            assert_each_once(opcode, size, &listed, &names);
        }
    }
}

/// Guard. Thousands of entries, READDIRPLUS pages of 4 KiB with an inode
/// budget of 4: every page full until the end, no descriptor left open.
#[test]
fn eof_attack_many_entries_within_a_small_budget() {
    let dir = temp_dir();
    let root = dir.as_path();
    std::fs::create_dir(root.join("d")).unwrap();
    let names: Vec<String> = (0..3000).map(|i| format!("entry-{i:05}")).collect();
    for (i, n) in names.iter().enumerate() {
        if i % 10 == 0 {
            std::fs::create_dir(root.join("d").join(n)).unwrap();
        } else {
            std::fs::write(root.join("d").join(n), b"x").unwrap();
        }
    }
    let budget = super::bounded::FdBudget { inodes: 4, handles: 4 };
    let mut guest = Guest::init(&[super::attack_tests::share("/ws", root)], &Secrets::default(), budget, true);
    let d = guest.walk("ws/d");
    let before = descriptors_under(root);
    for opcode in [Opcode::Readdirplus, Opcode::Readdir] {
        let listed = list_paged(&mut guest, opcode, d, 4096, &names, &mut |_| {}).unwrap();
        assert_each_once(opcode, 4096, &listed, &names);
    }
    assert!(
        descriptors_under(root) <= before.max(4),
        "descriptors left open: {} (from {before})",
        descriptors_under(root)
    );
}

/// Guard. The host removes names not yet listed and adds new ones
/// between pages: the names there throughout come exactly once, none
/// twice, and a short reply is still the end of what stays.
#[test]
fn eof_attack_host_changes_between_pages() {
    let dir = temp_dir();
    let root = dir.as_path();
    std::fs::create_dir(root.join("d")).unwrap();
    let names: Vec<String> = (0..400).map(|i| format!("{i:04}-{}", "x".repeat(i % 200))).collect();
    for n in &names {
        std::fs::write(root.join("d").join(n), b"x").unwrap();
    }
    let mut guest = read_only_guest(root, &Secrets::default());
    let d = guest.walk("ws/d");
    // The names removed as the listing goes (every third), and the ones
    // staying, which each must come exactly once.
    let removed: Vec<String> = names.iter().step_by(3).cloned().collect();
    let staying: Vec<String> = names.iter().filter(|n| !removed.contains(n)).cloned().collect();
    for opcode in [Opcode::Readdirplus, Opcode::Readdir] {
        for n in &names {
            let _ = std::fs::write(root.join("d").join(n), b"x");
        }
        let host = root.join("d");
        let mut between = |page: usize| {
            if page == 0 {
                return;
            }
            for n in removed.iter().skip(page * 7).take(7) {
                let _ = std::fs::remove_file(host.join(n));
            }
            for k in 0..5 {
                std::fs::write(host.join(format!("new-{opcode:?}-{page}-{k}-{}", "y".repeat(page % 250))), b"n")
                    .unwrap();
            }
        };
        let listed = list_paged(&mut guest, opcode, d, 4096, &staying, &mut between).unwrap();
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for n in &listed {
            *counts.entry(n).or_default() += 1;
        }
        let twice: Vec<_> = counts.iter().filter(|(_, c)| **c > 1).collect();
        assert!(twice.is_empty(), "{opcode:?}: listed twice: {twice:?}");
        let missing: Vec<_> = staying.iter().filter(|n| !counts.contains_key(n.as_str())).collect();
        assert!(missing.is_empty(), "{opcode:?}: lost names present throughout: {missing:?}");
        for entry in std::fs::read_dir(root.join("d")).unwrap() {
            let p = entry.unwrap().path();
            if p.file_name().unwrap().to_string_lossy().starts_with("new-") {
                std::fs::remove_file(p).unwrap();
            }
        }
    }
}

/// Guard. Pages at offsets the guest made up (mid-directory, past the
/// end, negative as an off_t, u64::MAX) are answered, give names from the
/// directory only, and leave no lookup held once forgotten.
#[test]
fn eof_attack_made_up_offsets() {
    let dir = temp_dir();
    let root = dir.as_path();
    let names = varied_dir(root);
    let mut guest = read_only_guest(root, &Secrets::default());
    let d = guest.walk("ws/d");
    let mut offsets = vec![1u64, 2, 3, 12345, 1 << 31, (1 << 32) + 1, i64::MAX as u64, 1 << 63, u64::MAX - 1, u64::MAX];
    // Real offsets, and each one off by one.
    let first = page_of(&mut guest, Opcode::Readdir, d, 0, 4096, RESP_LEN).unwrap();
    for (_, off) in dirents(&first) {
        offsets.extend([off, off.wrapping_sub(1), off.wrapping_add(1)]);
    }
    for opcode in [Opcode::Readdir, Opcode::Readdirplus] {
        for &offset in &offsets {
            for size in [1u32, 100, 4096] {
                let Ok(body) = page_of(&mut guest, opcode, d, offset, size, RESP_LEN) else { continue };
                let got: Vec<String> = match opcode {
                    Opcode::Readdirplus => direntplus(&body)
                        .into_iter()
                        .map(|(n, e, _)| {
                            guest.send(Opcode::Forget as u32, e.nodeid, ForgetIn { nlookup: 1 }.as_slice());
                            n
                        })
                        .collect(),
                    _ => dirents(&body).into_iter().map(|(n, _)| n).collect(),
                };
                for n in got {
                    assert!(names.contains(&n), "{opcode:?} at {offset:#x}: a name not in the directory: {n:?}");
                }
            }
        }
    }
}

/// Guard, on the bounded filesystem itself. READDIRPLUS pages of every
/// size over names of every length, each entry forgotten once as the
/// guest does: no node stays held after.
#[test]
fn eof_attack_readdirplus_lookups_balance() {
    let dir = temp_dir();
    let root = dir.as_path();
    varied_dir(root);
    let fs = BoundedFs::new(root, &Secrets::default(), 16, &HandleCount::default(), 16, Duration::ZERO).unwrap();
    let ctx = Context::default();
    let d = fs.lookup(&ctx, ROOT, &CString::new("d").unwrap()).unwrap().inode;
    let mut seen = Vec::new();
    for size in [408u32, 409, 1000, 4096, 65536] {
        let mut offset = 0;
        loop {
            let mut left = size as usize;
            let mut page = Vec::new();
            fs.readdirplus(&ctx, d, 0, size, offset, &mut |de, entry| {
                let need = pad8(size_of::<Direntplus>() + de.name.len());
                if need > left {
                    return Ok(0);
                }
                left -= need;
                page.push((entry.inode, de.offset));
                Ok(need)
            })
            .unwrap();
            let Some(&(_, last)) = page.last() else { break };
            offset = last;
            for (inode, _) in page {
                fs.forget(&ctx, inode, 1);
                seen.push(inode);
            }
        }
    }
    seen.sort();
    seen.dedup();
    let held: Vec<u64> = seen.into_iter().filter(|&i| fs.getattr(&ctx, i, None).is_ok()).collect();
    assert!(held.is_empty(), "nodes still held after every entry was forgotten: {held:x?}");
}

/// Guard. A directory holding a secret file and a secret directory is
/// listed to its end at every page size (the secrets' lookups are
/// refused, which must not fail the page), and the secret stays refused.
#[test]
fn eof_attack_secret_in_listed_directory_does_not_break_the_listing() {
    let dir = temp_dir();
    let root = dir.as_path();
    std::fs::create_dir(root.join("d")).unwrap();
    let names: Vec<String> = (0..50).map(|i| format!("f{i:02}")).collect();
    for n in &names {
        std::fs::write(root.join("d").join(n), b"x").unwrap();
    }
    std::fs::write(root.join("d/id_rsa"), b"SECRET").unwrap();
    std::fs::create_dir(root.join("d/keys")).unwrap();
    let secrets = Secrets::at(&[root.join("d/id_rsa"), root.join("d/keys")]);
    let mut guest = read_only_guest(root, &secrets);
    let d = guest.walk("ws/d");
    for opcode in [Opcode::Readdirplus, Opcode::Readdir] {
        for size in [512u32, 4096] {
            let listed = list_paged(&mut guest, opcode, d, size, &names, &mut |_| {});
            let listed =
                listed.unwrap_or_else(|e| panic!("{opcode:?} size {size}: a directory holding a secret fails: {e}"));
            assert_each_once(opcode, size, &listed, &names);
        }
    }
    let key = guest.node(d, "id_rsa");
    assert_eq!(guest.read(key, 0, 100).errno(), libc::EACCES, "the secret is read");
}
