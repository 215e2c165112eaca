//! What the read-only server's checks cost per request (`benches/file_server.sh`):
//! a read through a kept reader finds the file again beneath the share's
//! root (in one `openat2` from three path components, shallower an
//! `fstatat` per component), so a file is never read after the host moved
//! it into a secret's place or out of the share. This
//! measures a read and a getattr at several depths against the same
//! system calls on the host, and a request refused at the gate (the queue
//! and the harness alone), through the same queue processing the guest's
//! requests go through. It prints numbers and asserts nothing about time.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Instant;

use super::*;

const ROUNDS: u32 = 20_000;

/// Microseconds per call of `f`, the median of five batches.
fn per_call(mut f: impl FnMut()) -> f64 {
    let mut batches: Vec<f64> = (0..5)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..ROUNDS / 5 {
                f();
            }
            start.elapsed().as_secs_f64() * 1e6 / f64::from(ROUNDS / 5)
        })
        .collect();
    batches.sort_by(f64::total_cmp);
    batches[2]
}

fn host_open_read(path: &Path) {
    let file = std::fs::File::open(path).unwrap();
    let mut buf = [0u8; 4096];
    assert_eq!(file.read_at(&mut buf, 0).unwrap(), 4096);
}

#[test]
#[ignore = "benchmark: benches/file_server.sh"]
fn a_read_and_a_getattr_against_the_host_by_depth() {
    let dir = temp_dir();
    let mut guest = Guest::of_share(dir.as_path(), &Secrets::default());
    let null = per_call(|| {
        assert_eq!(guest.call(Opcode::Ioctl as u32, ROOT_ID, &[0; 32]).errno(), libc::ENOTTY);
    });
    // After the harness's "test ... " line, which has no newline.
    println!();
    println!("a request refused at the gate (queue and harness): {null:.2} µs");
    println!(
        "{:>5} {:>11} {:>11} {:>13} {:>11} {:>13} {:>11}",
        "depth", "read µs", "host pread", "host open+rd", "getattr µs", "host fstatat", "read/open"
    );
    for depth in [1usize, 2, 3, 4, 16, 64] {
        let names: Vec<String> = (0..depth).map(|i| format!("d{i}")).collect();
        let parent = names.iter().fold(dir.as_path().to_path_buf(), |p, n| p.join(n));
        std::fs::create_dir_all(&parent).unwrap();
        let path = parent.join("file");
        std::fs::write(&path, vec![7u8; 4096]).unwrap();
        let node = guest.walk(&format!("ws/{}/file", names.join("/")));
        let read = per_call(|| assert_eq!(guest.read(node, 0, 4096).ok().len(), 4096)) - null;
        let getattr = per_call(|| {
            guest.getattr(node).ok();
        }) - null;
        let kept = std::fs::File::open(&path).unwrap();
        let mut buf = [0u8; 4096];
        let pread = per_call(|| assert_eq!(kept.read_at(&mut buf, 0).unwrap(), 4096));
        let open_read = per_call(|| host_open_read(&path));
        let fstatat = per_call(|| {
            std::fs::symlink_metadata(&path).unwrap();
        });
        println!(
            "{depth:>5} {read:>11.2} {pread:>11.2} {open_read:>13.2} {getattr:>11.2} {fstatat:>13.2} {:>10.2}x",
            read / open_read
        );
    }
}

/// A file's first read, as `grep -r` or `cat` of a tree makes them: many
/// small files, each read once, so every read opens its file (the kept
/// readers are far fewer than the files). Beside the host's own open, read
/// and close of each, and a lookup beside the host's fstatat.
#[test]
#[ignore = "benchmark: benches/file_server.sh"]
fn a_first_read_of_many_small_files_against_the_host() {
    const DIRS: usize = 100;
    const FILES: usize = 50;
    let dir = temp_dir();
    let mut paths = Vec::new();
    for d in 0..DIRS {
        std::fs::create_dir(dir.as_path().join(format!("d{d:03}"))).unwrap();
        for f in 0..FILES {
            let name = format!("d{d:03}/f{f:02}.txt");
            std::fs::write(dir.as_path().join(&name), vec![b'x'; 1024]).unwrap();
            paths.push(name);
        }
    }
    let mut guest = Guest::of_share(dir.as_path(), &Secrets::default());
    let null = per_call(|| {
        assert_eq!(guest.call(Opcode::Ioctl as u32, ROOT_ID, &[0; 32]).errno(), libc::ENOTTY);
    });
    let nodes: Vec<u64> = paths.iter().map(|p| guest.walk(&format!("ws/{p}"))).collect();
    let mut next = 0;
    let read = per_call(|| {
        assert_eq!(guest.read(nodes[next % nodes.len()], 0, 4096).ok().len(), 1024);
        next += 1;
    }) - null;
    let dirs: Vec<u64> = (0..DIRS).map(|d| guest.walk(&format!("ws/d{d:03}"))).collect();
    let names: Vec<String> = (0..FILES).map(|f| format!("f{f:02}.txt")).collect();
    let lookup = per_call(|| {
        let (d, f) = (next % DIRS, (next / DIRS) % FILES);
        guest.lookup(dirs[d], names[f].as_bytes()).obj::<EntryOut>();
        next += 1;
    }) - null;
    let full: Vec<_> = paths.iter().map(|p| dir.as_path().join(p)).collect();
    // After the harness's "test ... " line, which has no newline.
    println!();
    let mut buf = [0u8; 4096];
    let host_read = per_call(|| {
        let file = std::fs::File::open(&full[next % full.len()]).unwrap();
        assert_eq!(file.read_at(&mut buf, 0).unwrap(), 1024);
        next += 1;
    });
    let host_stat = per_call(|| {
        std::fs::symlink_metadata(&full[next % full.len()]).unwrap();
        next += 1;
    });
    println!(
        "first read of one of {} files of 1 KiB: {read:.2} µs, host open+read+close {host_read:.2} µs ({:.2}x)",
        DIRS * FILES,
        read / host_read
    );
    println!("lookup of one of them: {lookup:.2} µs, host fstatat {host_stat:.2} µs ({:.2}x)", lookup / host_stat);
    // A whole listing with attributes, as find, os.walk and git's first
    // status take each directory (READDIRPLUS pages of 4 KiB, so several).
    let listing = per_call(|| {
        assert_eq!(guest.list_all(dirs[next % DIRS]).unwrap().len(), FILES);
        next += 1;
    }) - null;
    let host_listing = per_call(|| {
        let d = dir.as_path().join(format!("d{:03}", next % DIRS));
        let mut n = 0;
        for e in std::fs::read_dir(&d).unwrap() {
            std::fs::symlink_metadata(e.unwrap().path()).unwrap();
            n += 1;
        }
        assert_eq!(n, FILES);
        next += 1;
    });
    println!(
        "listing of a directory of {FILES} with attributes: {:.2} µs an entry, host readdir+lstat {:.2} µs ({:.2}x)",
        listing / FILES as f64,
        host_listing / FILES as f64,
        listing / host_listing
    );
}
