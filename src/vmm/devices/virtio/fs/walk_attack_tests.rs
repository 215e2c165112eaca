//! Attacks on how the read-only shares' file server finds a node again
//! (one `openat2` beneath the share's root from three components, the
//! walk one directory at a time below that or where `openat2` cannot
//! decide), as a hostile guest root racing the host user's renames,
//! replacements and symlinks. Each drives the device as the guest does
//! (see `attack_tests`).

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use rustix::fs::{Mode, OFlags};

use super::attack_tests::{read_only_guest, temp_dir};
use super::secrets::Secrets;

/// The host prepares a new key directory (`staging`, no secret yet) and
/// renames it into the place of a secret directory (`private`, as
/// `/etc/ssl/private`), then writes the keys into the files it holds. A
/// guest that looked those files up before the rename (one beside the
/// directory's entries, one a level deeper), and looks the secret
/// directory's name up again once it is there, would read them: each is no
/// secret by its own identity or name, only by the directory it is in.
/// Correct: nothing inside a secret directory is read, as nothing in it is
/// found (README: "finds nothing inside a secret directory", "as is a file
/// or directory the guest already holds once the host renames it into a
/// secret's place").
#[test]
fn files_held_in_a_directory_renamed_into_a_secret_directorys_place_are_not_read() {
    let dir = temp_dir();
    let root = dir.as_path();
    let secrets = Secrets::at(&[root.join("private")]);
    std::fs::create_dir_all(root.join("staging/sub")).unwrap();
    std::fs::write(root.join("staging/key.pem"), b"").unwrap();
    std::fs::write(root.join("staging/sub/key.pem"), b"").unwrap();
    let mut guest = read_only_guest(root, &secrets);
    // Two components below the root (found step by step) and three (in one openat2).
    let near = guest.walk("ws/staging/key.pem");
    let deep = guest.walk("ws/staging/sub/key.pem");
    assert_eq!(guest.read(near, 0, 4096).ok(), b"");
    assert_eq!(guest.read(deep, 0, 4096).ok(), b"");

    std::fs::rename(root.join("staging"), root.join("private")).unwrap();
    std::fs::write(root.join("private/key.pem"), b"-----BEGIN PRIVATE KEY-----").unwrap();
    std::fs::write(root.join("private/sub/key.pem"), b"-----BEGIN PRIVATE KEY-----").unwrap();
    let private = guest.walk("ws/private");
    assert_eq!(guest.lookup(private, b"key.pem").errno(), libc::EACCES, "nothing in it is found");

    for (what, node) in [("beside its entries", near), ("a level deeper", deep)] {
        let read = guest.read(node, 0, 4096);
        assert_eq!(
            read.errno(),
            libc::EACCES,
            "a key {what} in the secret directory reached the guest: {:?}",
            String::from_utf8_lossy(&read.body)
        );
    }
}

/// The host swaps a symlink to a directory outside the share in for a
/// directory on a deep node's path (`git checkout` of a tree where it is a
/// link). Held: `openat2` refuses the link, ESTALE, and nothing outside is
/// read, at every depth.
#[test]
fn a_symlink_swapped_into_a_deep_path_leads_nowhere() {
    let dir = temp_dir();
    let ws = dir.as_path().join("ws");
    let outside = dir.as_path().join("outside");
    std::fs::create_dir_all(ws.join("a/b/c/d")).unwrap();
    std::fs::create_dir_all(outside.join("b/c/d")).unwrap();
    std::fs::write(ws.join("a/b/c/d/f"), b"shared").unwrap();
    std::fs::write(outside.join("b/c/d/f"), b"OUTSIDE").unwrap();
    let mut guest = read_only_guest(&ws, &Secrets::default());
    let f = guest.walk("ws/a/b/c/d/f");
    let d = guest.walk("ws/a/b/c/d");
    assert_eq!(guest.read(f, 0, 4096).ok(), b"shared");

    std::fs::rename(ws.join("a/b"), dir.as_path().join("old")).unwrap();
    std::os::unix::fs::symlink(outside.join("b"), ws.join("a/b")).unwrap();
    assert_eq!(guest.read(f, 0, 4096).errno(), libc::ESTALE);
    assert_eq!(guest.getattr(d).errno(), libc::ESTALE);
    assert_eq!(guest.names(d), Err(libc::ESTALE));
    assert_eq!(guest.lookup(d, b"f").errno(), libc::ESTALE);
}

/// Makes `depth` directories named `name` one in another below `root`,
/// each step relative to the last (the whole path is longer than PATH_MAX),
/// and a file `f` holding `content` in the deepest.
fn deep_tree(root: &Path, name: &str, depth: usize, content: &[u8]) {
    let mut at: OwnedFd = rustix::fs::open(root, OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).unwrap();
    for _ in 0..depth {
        rustix::fs::mkdirat(at.as_fd(), name, Mode::from_raw_mode(0o755)).unwrap();
        at = rustix::fs::openat(at.as_fd(), name, OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).unwrap();
    }
    let file = rustix::fs::openat(at.as_fd(), "f", OFlags::WRONLY | OFlags::CREATE, Mode::from_raw_mode(0o644));
    rustix::io::write(file.unwrap(), content).unwrap();
}

/// A hostile repository holds a tree deeper than PATH_MAX (each name 255
/// bytes of odd ones). Held: beyond PATH_MAX the node is found step by
/// step, read, and a host rename on its way makes it stale.
#[test]
fn a_node_deeper_than_path_max_is_read_and_goes_stale_when_moved() {
    let dir = temp_dir();
    let ws = dir.as_path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let name: String = "\u{1}\n\u{7f} ;*?'\"\\é".chars().cycle().take(200).collect();
    let name = &name[..name.char_indices().map(|(i, _)| i).take_while(|&i| i <= 250).last().unwrap()];
    let depth = 20;
    deep_tree(&ws, name, depth, b"deep");
    let mut guest = read_only_guest(&ws, &Secrets::default());
    let mut node = guest.node(fuse_backend_rs::abi::fuse_abi::ROOT_ID, "ws");
    for _ in 0..depth {
        node = guest.node(node, name);
    }
    let f = guest.node(node, "f");
    assert_eq!(guest.read(f, 0, 4096).ok(), b"deep");
    assert_eq!(guest.getattr(f).header.error, 0);

    std::fs::rename(ws.join(name), dir.as_path().join("moved")).unwrap();
    assert_eq!(guest.getattr(f).errno(), libc::ESTALE);
    assert_eq!(guest.read(f, 0, 4096).errno(), libc::ESTALE);
}

/// rootfs/host.toml hides `/etc/letsencrypt/keys/*` (and the keys of
/// `/etc/ssl/private`, WireGuard and NetworkManager likewise): the
/// supervisor hands the VMM each file the pattern matches at the start,
/// and the pattern itself. A certificate renewal during the run writes a
/// new key there (`keys/0002_key-certbot.pem`); a guest that looks it up
/// reads it, as no file of that name existed at the start. Correct: what
/// a hide pattern names is refused by its place, whenever it comes to be
/// there (README: "a secret the host ... creates where one is named is
/// refused too").
#[test]
fn a_key_created_during_the_run_where_a_pattern_hides_keys_is_not_read() {
    let dir = temp_dir();
    let root = dir.as_path();
    std::fs::create_dir(root.join("keys")).unwrap();
    std::fs::write(root.join("keys/0001_key-certbot.pem"), b"OLD KEY").unwrap();
    let secrets = Secrets::at(&[root.join("keys/0001_key-certbot.pem"), root.join("keys/*")]);
    let mut guest = read_only_guest(root, &secrets);
    let old = guest.walk("ws/keys/0001_key-certbot.pem");
    assert_eq!(guest.read(old, 0, 4096).errno(), libc::EACCES, "the key of the start is refused");

    std::fs::write(root.join("keys/0002_key-certbot.pem"), b"-----BEGIN PRIVATE KEY-----").unwrap();
    let new = guest.walk("ws/keys/0002_key-certbot.pem");
    let read = guest.read(new, 0, 4096);
    assert_eq!(
        read.errno(),
        libc::EACCES,
        "the renewed key reached the guest: {:?}",
        String::from_utf8_lossy(&read.body)
    );
    std::fs::create_dir(root.join("keys/sub")).unwrap();
    assert_eq!(guest.walk("ws/keys/sub"), guest.walk("ws/keys/sub"), "other names are found as before");
}
