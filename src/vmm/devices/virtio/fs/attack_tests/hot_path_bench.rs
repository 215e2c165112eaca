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
