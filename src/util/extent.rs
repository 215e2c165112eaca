//! Sparse files: where a file holds data (`SEEK_DATA`/`SEEK_HOLE`), and the
//! zeros a hole stands for when content is hashed. A change set carries a
//! hole as its length, the store and apply write it as a hole, and every
//! hash is over the logical content (holes read as zeros), so review sees
//! the same bytes either way.

use std::io;
use std::os::fd::AsFd;

use nix::errno::Errno;
use nix::unistd::{Whence, lseek};

use crate::util::digest::Hasher;

static ZEROS: [u8; 64 << 10] = [0; 64 << 10];

/// The next data extent at or after `from`, as `start..end` with `end` at
/// most `size`; `None` when only a hole is left. Filesystems without hole
/// support report all of the file as data.
pub fn next_data(fd: &impl AsFd, from: u64, size: u64) -> io::Result<Option<(u64, u64)>> {
    if from >= size {
        return Ok(None);
    }
    let offset = |v: u64| i64::try_from(v).map_err(|_| io::Error::other("file offset out of range"));
    let start = match lseek(fd.as_fd(), offset(from)?, Whence::SeekData) {
        Ok(start) => start as u64,
        Err(Errno::ENXIO) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    if start >= size {
        return Ok(None);
    }
    let end = match lseek(fd.as_fd(), offset(start)?, Whence::SeekHole) {
        Ok(end) => (end as u64).min(size),
        // Truncated between the two calls: what is left is gone.
        Err(Errno::ENXIO) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    Ok(Some((start, end.max(start))))
}

/// Hashes `len` zero bytes, what a hole of that length reads as.
pub fn hash_zeros(hasher: &mut Hasher, mut len: u64) {
    while len > 0 {
        let n = usize::try_from(len).map_or(ZEROS.len(), |l| l.min(ZEROS.len()));
        hasher.update(&ZEROS[..n]);
        len -= n as u64;
    }
}

/// Whether every byte is zero (a written run of zeros is sent as a hole).
pub fn all_zero(bytes: &[u8]) -> bool {
    let chunks = bytes.chunks_exact(16);
    let tail = chunks.remainder();
    chunks.into_iter().all(|c| c.iter().fold(0u8, |acc, &b| acc | b) == 0) && tail.iter().all(|&b| b == 0)
}

#[cfg(test)]
mod tests {
    use std::io::{Seek, SeekFrom, Write};

    use super::*;

    #[test]
    fn finds_data_between_holes() {
        let mut f = tempfile::tempfile().unwrap();
        f.seek(SeekFrom::Start(1 << 20)).unwrap();
        f.write_all(b"middle").unwrap();
        f.set_len(4 << 20).unwrap();
        let size = 4 << 20;
        let (start, end) = next_data(&f, 0, size).unwrap().unwrap();
        assert!(start <= 1 << 20 && end >= (1 << 20) + 6 && end < size, "{start}..{end}");
        assert_eq!(next_data(&f, end, size).unwrap(), None);
        assert!(all_zero(&[0; 100]) && !all_zero(&[0, 0, 0, 1]));
        let mut a = Hasher::default();
        hash_zeros(&mut a, 200_000);
        assert_eq!(a.finish(), crate::util::digest::Sha256::of(&vec![0; 200_000]));
    }
}
