//! The workspace paths the guest looked up, each with the host's state at
//! that moment: written by the VMM's file server as the guest walks the
//! workspace, read by apply to tell host edits made after the guest saw a
//! path (conflicts) from ones the guest already built on.
//!
//! The file starts with [`MAGIC`], then one record per sighting:
//!
//! ```text
//! u16 path length, path bytes (relative to the workspace, no leading '/')
//! u8  0 = the name did not exist, 1 = it did, followed by:
//!     u32 st_mode, u64 size, i64 mtime s, u32 mtime ns,
//!     i64 ctime s, u32 ctime ns, u64 inode
//! ```
//!
//! All integers are little-endian. A path may appear more than once; the
//! first record is what the guest saw. A truncated last record is ignored
//! (the writer may have been killed mid-write).
#![forbid(unsafe_code)]

use std::io::{self, Read};

/// The first bytes of a sightings file.
pub const MAGIC: [u8; 8] = *b"STKSEEN1";

/// Longest path a record carries (the change set's own limit).
pub const MAX_PATH: usize = 4095;

/// What the host's `lstat` said about a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostStat {
    /// `st_mode`: the file type and permission bits.
    pub mode: u32,
    pub size: u64,
    pub mtime_sec: i64,
    pub mtime_nsec: u32,
    pub ctime_sec: i64,
    pub ctime_nsec: u32,
    pub ino: u64,
}

/// One path and its state when the guest first looked (None: absent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sighting {
    pub path: Vec<u8>,
    pub state: Option<HostStat>,
}

/// Appends the record of `path` to `out`; paths over [`MAX_PATH`] are
/// skipped (the change set cannot name them either).
pub fn encode(path: &[u8], state: Option<&HostStat>, out: &mut Vec<u8>) {
    let Ok(len) = u16::try_from(path.len()) else { return };
    if path.len() > MAX_PATH {
        return;
    }
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(path);
    match state {
        None => out.push(0),
        Some(s) => {
            out.push(1);
            out.extend_from_slice(&s.mode.to_le_bytes());
            out.extend_from_slice(&s.size.to_le_bytes());
            out.extend_from_slice(&s.mtime_sec.to_le_bytes());
            out.extend_from_slice(&s.mtime_nsec.to_le_bytes());
            out.extend_from_slice(&s.ctime_sec.to_le_bytes());
            out.extend_from_slice(&s.ctime_nsec.to_le_bytes());
            out.extend_from_slice(&s.ino.to_le_bytes());
        }
    }
}

/// Reads the magic at the start of a sightings file.
pub fn read_magic(input: &mut impl Read) -> io::Result<()> {
    let mut magic = [0u8; 8];
    input.read_exact(&mut magic)?;
    if magic != MAGIC {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "not a sightings file (wrong magic)"));
    }
    Ok(())
}

/// The next record, or None at the end (a truncated last record counts as
/// the end).
pub fn decode(input: &mut impl Read) -> io::Result<Option<Sighting>> {
    let mut len = [0u8; 2];
    match read_all_or_nothing(input, &mut len)? {
        Fill::Empty | Fill::Partial => return Ok(None),
        Fill::Full => {}
    }
    let len = usize::from(u16::from_le_bytes(len));
    if len > MAX_PATH {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "a sightings record names an over-long path"));
    }
    let mut path = vec![0u8; len];
    let mut tag = [0u8; 1];
    if read_all_or_nothing(input, &mut path)? != Fill::Full || read_all_or_nothing(input, &mut tag)? != Fill::Full {
        return Ok(None);
    }
    let state = match tag[0] {
        0 => None,
        1 => {
            let mut b = [0u8; 44];
            if read_all_or_nothing(input, &mut b)? != Fill::Full {
                return Ok(None);
            }
            let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
            let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
            Some(HostStat {
                mode: u32_at(0),
                size: u64_at(4),
                mtime_sec: u64_at(12) as i64,
                mtime_nsec: u32_at(20),
                ctime_sec: u64_at(24) as i64,
                ctime_nsec: u32_at(32),
                ino: u64_at(36),
            })
        }
        _ => return Err(io::Error::new(io::ErrorKind::InvalidData, "a sightings record has an unknown tag")),
    };
    Ok(Some(Sighting { path, state }))
}

#[derive(Debug, PartialEq, Eq)]
enum Fill {
    Empty,
    Partial,
    Full,
}

fn read_all_or_nothing(input: &mut impl Read, buf: &mut [u8]) -> io::Result<Fill> {
    let mut got = 0;
    while got < buf.len() {
        match input.read(&mut buf[got..]) {
            Ok(0) => return Ok(if got == 0 { Fill::Empty } else { Fill::Partial }),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Fill::Full)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(ino: u64) -> HostStat {
        HostStat {
            mode: 0o100644,
            size: 3,
            mtime_sec: -5,
            mtime_nsec: 7,
            ctime_sec: 1_700_000_000,
            ctime_nsec: 999_999_999,
            ino,
        }
    }

    #[test]
    fn records_round_trip_and_a_torn_tail_is_the_end() {
        let mut bytes = MAGIC.to_vec();
        encode(b"src/main.rs", Some(&stat(42)), &mut bytes);
        encode(b"missing", None, &mut bytes);
        encode(&vec![b'x'; MAX_PATH + 1], None, &mut bytes);
        let whole = bytes.len();
        encode(b"torn", Some(&stat(1)), &mut bytes);
        bytes.truncate(whole + 9);

        let mut input = &bytes[..];
        read_magic(&mut input).unwrap();
        let first = decode(&mut input).unwrap().unwrap();
        assert_eq!(first, Sighting { path: b"src/main.rs".to_vec(), state: Some(stat(42)) });
        assert_eq!(decode(&mut input).unwrap().unwrap(), Sighting { path: b"missing".to_vec(), state: None });
        assert_eq!(decode(&mut input).unwrap(), None, "the over-long path was never written; the torn one ends it");
    }

    #[test]
    fn a_foreign_file_is_refused() {
        assert!(read_magic(&mut &b"STKSNAP1"[..]).is_err());
        let mut bad = Vec::new();
        encode(b"a", None, &mut bad);
        bad[3] = 9;
        assert!(decode(&mut &bad[..]).is_err());
    }
}
