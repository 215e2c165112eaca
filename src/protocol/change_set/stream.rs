//! The change-set stream from guest to host: one byte stream (a vsock
//! connection), written as the guest walks its overlay and read as the host
//! stages, so neither side holds file content in memory.
//!
//! ```text
//! stream  = MAGIC (8 bytes) VERSION (u32 LE) record* end
//! record  = tag (u8) length (u32 LE) payload
//! entry   = ENTRY {json WireEntry}                      for all but new content
//!         | ENTRY {json, file} (DATA | HOLE)* FILE_END {sha256}
//!                                                      content follows, exactly `size` bytes
//! skipped = SKIPPED {json Skipped}                      a fifo/socket/device not exported
//! end     = END {json Summary}                          counts; a stream without it is truncated
//! ```
//!
//! A file whose content was already sent in this stream (a hard link, or a
//! copy) names that content's hash in `same_as` instead of resending it.
//! A hole (a sparse file's unwritten range, or a run of zeros) is sent as
//! its length (`HOLE {u64 LE}`), stored as a hole, and hashed as the zeros
//! it reads as. Every length is bounded before anything is allocated.

use std::collections::HashMap;
use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::entry::{Base, Entry, Kind, Mode, Skipped, SpecialKind, SymlinkTarget};
use super::path::RelPath;
use crate::util::digest::{Hasher, Sha256};

pub const MAGIC: [u8; 8] = *b"STKDCHG\n";
/// 2: holes (`HOLE` records), and the end record counts the bytes carried.
pub const VERSION: u32 = 2;

const TAG_ENTRY: u8 = 1;
const TAG_DATA: u8 = 2;
const TAG_FILE_END: u8 = 3;
const TAG_SKIPPED: u8 = 4;
const TAG_END: u8 = 5;
const TAG_HOLE: u8 = 6;

/// An entry record: two escaped paths of at most 4095 bytes each (three
/// bytes per escaped byte) and a little JSON fit well within this.
const MAX_META_FRAME: usize = 64 << 10;
/// A content chunk; the writer sends smaller ones.
const MAX_DATA_FRAME: usize = 1 << 20;
const WRITE_CHUNK: usize = 256 << 10;

/// Caps on what one change set may make the host store, hold and hash.
/// Staging, review and apply hold each entry's metadata (not content) in
/// memory: `max_entries` and `max_metadata_bytes` bound that memory, whatever
/// the paths' length or depth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_entries: u64,
    /// Bytes of paths and symlink targets, summed over the entries.
    pub max_metadata_bytes: u64,
    /// One file's logical size, holes included: every byte of it is hashed
    /// (holes as zeros) when staged and again when applied.
    pub max_file_size: u64,
    /// Content bytes carried and stored (holes excluded).
    pub max_total_bytes: u64,
    /// Logical bytes of all files, holes included (what is hashed).
    pub max_total_logical: u64,
    /// How many skipped paths are listed (all are counted).
    pub max_skipped_listed: usize,
    /// Free space staging leaves on the store's filesystem at least; `None`
    /// is [`crate::util::space::staging_margin`] of that filesystem.
    pub min_free: Option<u64>,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_entries: 1_000_000,
            max_metadata_bytes: 256 << 20,
            max_file_size: 64 << 30,
            max_total_bytes: 32 << 30,
            max_total_logical: 128 << 30,
            max_skipped_listed: 1000,
            min_free: None,
        }
    }
}

#[derive(Debug, Error)]
pub enum WireError {
    #[error("i/o on the change stream")]
    Io(#[from] io::Error),
    #[error("the stream is not a stockade change set (bad magic)")]
    BadMagic,
    #[error(
        "the change set has format version {0}; this stockade reads version {VERSION}. \
         Use the same stockade binary on the host and as the guest init"
    )]
    Version(u32),
    #[error(
        "the change stream ended early, after {entries} entries: the guest stopped exporting or the connection broke"
    )]
    Truncated { entries: u64 },
    #[error("malformed change stream: {0}")]
    Corrupt(String),
    #[error("a change-stream record of {len} bytes exceeds the {max}-byte limit")]
    FrameTooLarge { len: usize, max: usize },
    #[error("malformed entry record in the change stream")]
    Entry(#[source] serde_json::Error),
    #[error("the change set has more than {0} entries; nothing was staged")]
    TooManyEntries(u64),
    #[error(
        "the change set's paths and symlink targets come to more than {max} bytes (after {entries} entries); \
         nothing was staged"
    )]
    TooMuchMetadata { max: u64, entries: u64 },
    #[error("{path} is {size} bytes long (holes included); one file may be at most {max} bytes; nothing was staged")]
    FileTooLarge { path: RelPath, size: u64, max: u64 },
    #[error("the change set holds more than {max} bytes of content; nothing was staged")]
    TooMuchContent { max: u64 },
    #[error(
        "the change set's files come to more than {max} bytes counting their holes (each byte is checked); \
         nothing was staged"
    )]
    TooMuchLogical { max: u64 },
    #[error("the content of {path} does not match its checksum: the stream was corrupted")]
    ChecksumMismatch { path: RelPath },
    #[error("{path} changed size while it was exported (expected {expected} bytes); stop writers before exporting")]
    FileChanged { path: RelPath, expected: u64 },
    #[error("{path} names content that this stream did not carry before")]
    UnknownContent { path: RelPath },
    #[error("cannot store the content of {path}")]
    Sink {
        path: RelPath,
        #[source]
        source: io::Error,
    },
    #[error("the change-set writer failed earlier and cannot continue")]
    Broken,
}

/// The counts carried by the end record.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    pub entries: u64,
    /// File entries whose content was carried (not `same_as`).
    pub files: u64,
    /// Their logical size, holes included.
    pub bytes: u64,
    pub skipped: u64,
    /// Content bytes actually carried (holes excluded).
    #[serde(default)]
    pub stored: u64,
}

#[derive(Serialize, Deserialize)]
struct WireEntry {
    path: RelPath,
    change: WireKind,
    base: Base,
}

/// `Kind` as sent: raw modes, so the host can tell the user which setuid
/// or setgid bits it dropped, and file content by stream position.
#[derive(Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireKind {
    File {
        mode: u32,
        size: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        same_as: Option<Sha256>,
    },
    Dir {
        mode: u32,
    },
    Symlink {
        target: SymlinkTarget,
    },
    Delete,
    OpaqueDir {
        mode: u32,
    },
    Mode {
        mode: u32,
    },
}

fn write_frame(out: &mut impl Write, tag: u8, payload: &[u8]) -> io::Result<()> {
    let len = u32::try_from(payload.len()).map_err(|_| io::Error::other("frame too large"))?;
    let mut header = [0u8; 5];
    header[0] = tag;
    header[1..].copy_from_slice(&len.to_le_bytes());
    out.write_all(&header)?;
    out.write_all(payload)
}

/// Writes a change set; the guest's exporter drives it.
pub struct Writer<W: Write> {
    out: W,
    summary: Summary,
    sent: HashMap<Sha256, u64>,
    chunk: Vec<u8>,
    broken: bool,
}

impl<W: Write> Writer<W> {
    /// Starts a stream (writes the header).
    pub fn new(mut out: W) -> Result<Writer<W>, WireError> {
        out.write_all(&MAGIC)?;
        out.write_all(&VERSION.to_le_bytes())?;
        Ok(Writer { out, summary: Summary::default(), sent: HashMap::new(), chunk: Vec::new(), broken: false })
    }

    pub fn dir(&mut self, path: &RelPath, raw_mode: u32, base: &Base) -> Result<(), WireError> {
        self.entry(path, WireKind::Dir { mode: raw_mode }, base)
    }

    pub fn opaque_dir(&mut self, path: &RelPath, raw_mode: u32, base: &Base) -> Result<(), WireError> {
        self.entry(path, WireKind::OpaqueDir { mode: raw_mode }, base)
    }

    pub fn symlink(&mut self, path: &RelPath, target: &SymlinkTarget, base: &Base) -> Result<(), WireError> {
        self.entry(path, WireKind::Symlink { target: target.clone() }, base)
    }

    pub fn delete(&mut self, path: &RelPath, base: &Base) -> Result<(), WireError> {
        self.entry(path, WireKind::Delete, base)
    }

    pub fn mode(&mut self, path: &RelPath, raw_mode: u32, base: &Base) -> Result<(), WireError> {
        self.entry(path, WireKind::Mode { mode: raw_mode }, base)
    }

    /// A path the guest did not export.
    pub fn skipped(&mut self, skipped: &Skipped) -> Result<(), WireError> {
        let json = serde_json::to_vec(skipped).map_err(WireError::Entry)?;
        self.guard(|w| write_frame(&mut w.out, TAG_SKIPPED, &json))?;
        self.summary.skipped += 1;
        Ok(())
    }

    /// A regular file whose `size` bytes are read from `content` and streamed;
    /// returns their hash.
    pub fn file(
        &mut self,
        path: &RelPath,
        raw_mode: u32,
        size: u64,
        content: &mut dyn Read,
        base: &Base,
    ) -> Result<Sha256, WireError> {
        self.entry(path, WireKind::File { mode: raw_mode, size, same_as: None }, base)?;
        let result = self.stream_content(path, size, content);
        self.sent_file(size, result)
    }

    /// A regular file of `size` bytes read from `file` by its data extents
    /// (`SEEK_DATA`/`SEEK_HOLE`): holes are sent as lengths, never read.
    pub fn sparse_file(
        &mut self,
        path: &RelPath,
        raw_mode: u32,
        size: u64,
        file: &std::fs::File,
        base: &Base,
    ) -> Result<Sha256, WireError> {
        self.entry(path, WireKind::File { mode: raw_mode, size, same_as: None }, base)?;
        let result = self.stream_extents(path, size, file);
        self.sent_file(size, result)
    }

    fn sent_file(&mut self, size: u64, result: Result<(Sha256, u64), WireError>) -> Result<Sha256, WireError> {
        if result.is_err() {
            self.broken = true;
        }
        let (sha256, stored) = result?;
        self.summary.files += 1;
        self.summary.bytes += size;
        self.summary.stored += stored;
        self.sent.insert(sha256, size);
        Ok(sha256)
    }

    /// A regular file with content this stream already carried (`file`
    /// returned `sha256` for it).
    pub fn file_again(&mut self, path: &RelPath, raw_mode: u32, sha256: &Sha256, base: &Base) -> Result<(), WireError> {
        let Some(&size) = self.sent.get(sha256) else {
            return Err(WireError::UnknownContent { path: path.clone() });
        };
        self.entry(path, WireKind::File { mode: raw_mode, size, same_as: Some(*sha256) }, base)
    }

    /// Ends the stream with its counts and hands back the output.
    pub fn finish(mut self) -> Result<(W, Summary), WireError> {
        let json = serde_json::to_vec(&self.summary).map_err(WireError::Entry)?;
        self.guard(|w| {
            write_frame(&mut w.out, TAG_END, &json)?;
            w.out.flush()
        })?;
        Ok((self.out, self.summary))
    }

    pub fn summary(&self) -> Summary {
        self.summary
    }

    fn entry(&mut self, path: &RelPath, change: WireKind, base: &Base) -> Result<(), WireError> {
        let json = serde_json::to_vec(&WireEntry { path: path.clone(), change, base: base.clone() })
            .map_err(WireError::Entry)?;
        self.guard(|w| write_frame(&mut w.out, TAG_ENTRY, &json))?;
        self.summary.entries += 1;
        Ok(())
    }

    /// Returns the hash and the bytes carried as data.
    fn stream_content(
        &mut self,
        path: &RelPath,
        size: u64,
        content: &mut dyn Read,
    ) -> Result<(Sha256, u64), WireError> {
        let mut hasher = Hasher::default();
        let mut stored = 0;
        let mut remaining = size;
        self.chunk.resize(WRITE_CHUNK, 0);
        while remaining > 0 {
            let want = usize::try_from(remaining.min(WRITE_CHUNK as u64)).unwrap_or(WRITE_CHUNK);
            let n = match content.read(&mut self.chunk[..want]) {
                Ok(0) => return Err(WireError::FileChanged { path: path.clone(), expected: size }),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e.into()),
            };
            stored += self.send_chunk(&mut hasher, n)?;
            remaining -= n as u64;
        }
        // A file that grew would be sent cut short; refuse rather than ship half of it.
        let mut probe = [0u8; 1];
        if content.read(&mut probe)? != 0 {
            return Err(WireError::FileChanged { path: path.clone(), expected: size });
        }
        let sha256 = hasher.finish();
        write_frame(&mut self.out, TAG_FILE_END, &sha256.0)?;
        Ok((sha256, stored))
    }

    fn stream_extents(&mut self, path: &RelPath, size: u64, file: &std::fs::File) -> Result<(Sha256, u64), WireError> {
        use std::os::unix::fs::FileExt;
        let changed = || WireError::FileChanged { path: path.clone(), expected: size };
        let mut hasher = Hasher::default();
        let mut stored = 0;
        let mut pos = 0u64;
        self.chunk.resize(WRITE_CHUNK, 0);
        while pos < size {
            let (start, end) = crate::util::extent::next_data(file, pos, size)?.unwrap_or((size, size));
            if start > pos {
                self.send_hole(&mut hasher, start - pos)?;
            }
            pos = start;
            while pos < end {
                let want = usize::try_from((end - pos).min(WRITE_CHUNK as u64)).unwrap_or(WRITE_CHUNK);
                let n = match file.read_at(&mut self.chunk[..want], pos) {
                    Ok(0) => return Err(changed()),
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e.into()),
                };
                stored += self.send_chunk(&mut hasher, n)?;
                pos += n as u64;
            }
        }
        // Grown or shrunk while being sent: refuse rather than ship a mix.
        if file.metadata()?.len() != size {
            return Err(changed());
        }
        let sha256 = hasher.finish();
        write_frame(&mut self.out, TAG_FILE_END, &sha256.0)?;
        Ok((sha256, stored))
    }

    /// Sends `self.chunk[..n]`, as a hole when it is all zeros; returns the
    /// data bytes sent.
    fn send_chunk(&mut self, hasher: &mut Hasher, n: usize) -> Result<u64, WireError> {
        if crate::util::extent::all_zero(&self.chunk[..n]) {
            self.send_hole(hasher, n as u64)?;
            return Ok(0);
        }
        hasher.update(&self.chunk[..n]);
        write_frame(&mut self.out, TAG_DATA, &self.chunk[..n])?;
        Ok(n as u64)
    }

    fn send_hole(&mut self, hasher: &mut Hasher, len: u64) -> Result<(), WireError> {
        crate::util::extent::hash_zeros(hasher, len);
        write_frame(&mut self.out, TAG_HOLE, &len.to_le_bytes())?;
        Ok(())
    }

    fn guard(&mut self, f: impl FnOnce(&mut Self) -> io::Result<()>) -> Result<(), WireError> {
        if self.broken {
            return Err(WireError::Broken);
        }
        f(self).map_err(|e| {
            self.broken = true;
            WireError::Io(e)
        })
    }
}

/// Where the reader puts file content: the host's store, or memory in tests.
pub trait BlobSink {
    type Blob: BlobWrite;
    fn begin(&mut self) -> io::Result<Self::Blob>;
    /// Keeps a completely received blob of `size` bytes under its verified hash.
    fn commit(&mut self, blob: Self::Blob, sha256: &Sha256, size: u64) -> io::Result<()>;
    /// Drops a blob that failed verification or was cut off.
    fn abort(&mut self, blob: Self::Blob);
}

/// Where a blob's content goes: data, and holes (which read as zeros).
pub trait BlobWrite: Write {
    /// Skips `len` bytes, leaving a hole.
    fn hole(&mut self, len: u64) -> io::Result<()>;
}

impl BlobWrite for io::Sink {
    fn hole(&mut self, _len: u64) -> io::Result<()> {
        Ok(())
    }
}

/// One thing read from a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    Entry {
        entry: Entry,
        /// The guest's mode had setuid, setgid or sticky bits, now dropped.
        stripped_bits: bool,
    },
    Skipped(Skipped),
}

/// Reads a change set, verifying counts, caps and content hashes.
pub struct Reader<R: Read> {
    input: R,
    limits: Limits,
    seen: Summary,
    /// Bytes of paths and symlink targets so far.
    metadata: u64,
    blobs: HashMap<Sha256, u64>,
    buf: Vec<u8>,
    end: Option<Summary>,
}

impl<R: Read> Reader<R> {
    /// Reads and checks the header.
    pub fn new(mut input: R, limits: Limits) -> Result<Reader<R>, WireError> {
        let mut header = [0u8; 12];
        read_exact_or_truncated(&mut input, &mut header, 0)?;
        if header[..8] != MAGIC {
            return Err(WireError::BadMagic);
        }
        let version = u32::from_le_bytes([header[8], header[9], header[10], header[11]]);
        if version != VERSION {
            return Err(WireError::Version(version));
        }
        Ok(Reader {
            input,
            limits,
            seen: Summary::default(),
            metadata: 0,
            blobs: HashMap::new(),
            buf: Vec::new(),
            end: None,
        })
    }

    /// The next entry or skipped path, with file content handed to `sink`;
    /// `None` after a complete, consistent end record.
    pub fn next(&mut self, sink: &mut impl BlobSink) -> Result<Option<Item>, WireError> {
        if self.end.is_some() {
            return Ok(None);
        }
        let tag = self.frame(MAX_META_FRAME)?;
        match tag {
            TAG_ENTRY => self.entry(sink).map(Some),
            TAG_SKIPPED => {
                let skipped: Skipped = serde_json::from_slice(&self.buf).map_err(WireError::Entry)?;
                self.seen.skipped += 1;
                Ok(Some(Item::Skipped(skipped)))
            }
            TAG_END => {
                let end: Summary = serde_json::from_slice(&self.buf).map_err(WireError::Entry)?;
                if end != self.seen {
                    return Err(WireError::Corrupt(format!(
                        "the end record counts {end:?} but the stream carried {:?}",
                        self.seen
                    )));
                }
                self.expect_eof()?;
                self.end = Some(end);
                Ok(None)
            }
            other => Err(WireError::Corrupt(format!("unexpected record type {other}"))),
        }
    }

    /// Nothing may follow the end record: the stream must end there, so
    /// that whatever checks the whole stream as it is read (the host's
    /// digest of what the init sent) has seen all of it before the set is
    /// taken as complete.
    fn expect_eof(&mut self) -> Result<(), WireError> {
        let mut probe = [0u8; 1];
        loop {
            match self.input.read(&mut probe) {
                Ok(0) => return Ok(()),
                Ok(_) => return Err(WireError::Corrupt("data after the end record".into())),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// The end record, once reached.
    pub fn summary(&self) -> Option<Summary> {
        self.end
    }

    fn entry(&mut self, sink: &mut impl BlobSink) -> Result<Item, WireError> {
        let wire: WireEntry = serde_json::from_slice(&self.buf).map_err(WireError::Entry)?;
        if self.seen.entries >= self.limits.max_entries {
            return Err(WireError::TooManyEntries(self.limits.max_entries));
        }
        let target = match &wire.change {
            WireKind::Symlink { target } => target.as_bytes().len(),
            _ => 0,
        };
        self.metadata += (wire.path.as_bytes().len() + target) as u64;
        if self.metadata > self.limits.max_metadata_bytes {
            return Err(WireError::TooMuchMetadata { max: self.limits.max_metadata_bytes, entries: self.seen.entries });
        }
        self.seen.entries += 1;
        let mut stripped_bits = false;
        let mut mode = |raw: u32| {
            stripped_bits |= Mode::strips(raw);
            Mode::from_raw(raw)
        };
        let kind = match wire.change {
            WireKind::Dir { mode: m } => Kind::Dir { mode: mode(m) },
            WireKind::OpaqueDir { mode: m } => Kind::OpaqueDir { mode: mode(m) },
            WireKind::Mode { mode: m } => Kind::Mode { mode: mode(m) },
            WireKind::Symlink { target } => Kind::Symlink { target },
            WireKind::Delete => Kind::Delete,
            WireKind::File { mode: m, size, same_as: Some(sha256) } => {
                if self.blobs.get(&sha256) != Some(&size) {
                    return Err(WireError::UnknownContent { path: wire.path });
                }
                Kind::File { mode: mode(m), size, sha256 }
            }
            WireKind::File { mode: m, size, same_as: None } => {
                let mode = mode(m);
                let sha256 = self.content(&wire.path, size, sink)?;
                Kind::File { mode, size, sha256 }
            }
        };
        Ok(Item::Entry { entry: Entry { path: wire.path, kind, base: wire.base }, stripped_bits })
    }

    fn content(&mut self, path: &RelPath, size: u64, sink: &mut impl BlobSink) -> Result<Sha256, WireError> {
        if size > self.limits.max_file_size {
            return Err(WireError::FileTooLarge { path: path.clone(), size, max: self.limits.max_file_size });
        }
        if self.seen.bytes.saturating_add(size) > self.limits.max_total_logical {
            return Err(WireError::TooMuchLogical { max: self.limits.max_total_logical });
        }
        let sink_err = |source| WireError::Sink { path: path.clone(), source };
        let mut blob = sink.begin().map_err(sink_err)?;
        match self.receive(path, size, &mut blob) {
            Ok(Ok(sha256)) => {
                sink.commit(blob, &sha256, size).map_err(sink_err)?;
                self.seen.files += 1;
                self.seen.bytes += size;
                self.blobs.insert(sha256, size);
                Ok(sha256)
            }
            Ok(Err(source)) => {
                sink.abort(blob);
                Err(sink_err(source))
            }
            Err(e) => {
                sink.abort(blob);
                Err(e)
            }
        }
    }

    /// Stream errors outside, sink errors inside.
    fn receive(
        &mut self,
        path: &RelPath,
        size: u64,
        blob: &mut impl BlobWrite,
    ) -> Result<io::Result<Sha256>, WireError> {
        let mut hasher = Hasher::default();
        let mut remaining = size;
        while remaining > 0 {
            let tag = self.frame(MAX_DATA_FRAME)?;
            let len = match tag {
                TAG_DATA => self.buf.len() as u64,
                TAG_HOLE => {
                    let bytes: [u8; 8] = self.buf[..].try_into().map_err(|_| {
                        WireError::Corrupt(format!("{path}: a hole record of {} bytes", self.buf.len()))
                    })?;
                    u64::from_le_bytes(bytes)
                }
                _ => return Err(WireError::Corrupt(format!("{path}: content ends {remaining} bytes early"))),
            };
            if len > remaining {
                return Err(WireError::Corrupt(format!("{path}: more content than its size of {size} bytes")));
            }
            remaining -= len;
            let written = if tag == TAG_DATA {
                self.seen.stored += len;
                if self.seen.stored > self.limits.max_total_bytes {
                    return Err(WireError::TooMuchContent { max: self.limits.max_total_bytes });
                }
                hasher.update(&self.buf);
                blob.write_all(&self.buf)
            } else {
                crate::util::extent::hash_zeros(&mut hasher, len);
                blob.hole(len)
            };
            if let Err(e) = written {
                return Ok(Err(e));
            }
        }
        if self.frame(MAX_META_FRAME)? != TAG_FILE_END || self.buf.len() != 32 {
            return Err(WireError::Corrupt(format!("{path}: no checksum after its content")));
        }
        let sha256 = hasher.finish();
        if sha256.0[..] != self.buf[..] {
            return Err(WireError::ChecksumMismatch { path: path.clone() });
        }
        Ok(Ok(sha256))
    }

    /// Reads one record into `self.buf`, returning its tag.
    fn frame(&mut self, max: usize) -> Result<u8, WireError> {
        let mut header = [0u8; 5];
        read_exact_or_truncated(&mut self.input, &mut header, self.seen.entries)?;
        let len = u32::from_le_bytes([header[1], header[2], header[3], header[4]]) as usize;
        if len > max {
            return Err(WireError::FrameTooLarge { len, max });
        }
        self.buf.resize(len, 0);
        read_exact_or_truncated(&mut self.input, &mut self.buf, self.seen.entries)?;
        Ok(header[0])
    }
}

fn read_exact_or_truncated(input: &mut impl Read, buf: &mut [u8], entries: u64) -> Result<(), WireError> {
    input.read_exact(buf).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => WireError::Truncated { entries },
        _ => WireError::Io(e),
    })
}

/// A helper for writers and tests: a skipped record for a path and reason.
pub fn skipped(path_bytes: &[u8], what: SpecialKind) -> Skipped {
    Skipped { path: super::path::escape(path_bytes), what }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keeps blobs in memory.
    #[derive(Default)]
    struct MemSink {
        blobs: HashMap<Sha256, Vec<u8>>,
        aborted: usize,
    }

    impl BlobWrite for Vec<u8> {
        fn hole(&mut self, len: u64) -> io::Result<()> {
            self.resize(self.len() + usize::try_from(len).map_err(io::Error::other)?, 0);
            Ok(())
        }
    }

    impl BlobSink for MemSink {
        type Blob = Vec<u8>;
        fn begin(&mut self) -> io::Result<Vec<u8>> {
            Ok(Vec::new())
        }
        fn commit(&mut self, blob: Vec<u8>, sha256: &Sha256, _size: u64) -> io::Result<()> {
            self.blobs.insert(*sha256, blob);
            Ok(())
        }
        fn abort(&mut self, _blob: Vec<u8>) {
            self.aborted += 1;
        }
    }

    fn p(s: &str) -> RelPath {
        RelPath::new(s.as_bytes()).unwrap()
    }

    fn sample() -> Vec<u8> {
        let mut w = Writer::new(Vec::new()).unwrap();
        w.dir(&p("src"), 0o755, &Base::Absent).unwrap();
        let big: Vec<u8> = (0..700_000u32).map(|i| (i % 251) as u8).collect();
        let sha = w.file(&p("src/big.bin"), 0o100644, big.len() as u64, &mut &big[..], &Base::Absent).unwrap();
        w.file_again(&p("src/copy.bin"), 0o4755, &sha, &Base::Absent).unwrap();
        w.file(&p("empty"), 0o600, 0, &mut io::empty(), &Base::Absent).unwrap();
        w.symlink(&p("link"), &SymlinkTarget::new(&b"/etc/passwd"[..]).unwrap(), &Base::Absent).unwrap();
        let old = Base::File { mode: Mode::from_raw(0o644), size: 1, sha256: Sha256::of(b"x") };
        w.delete(&p("gone"), &old).unwrap();
        w.mode(&p("script.sh"), 0o755, &old).unwrap();
        w.opaque_dir(&p("node_modules"), 0o755, &Base::Dir { mode: Mode::from_raw(0o755), tree: None }).unwrap();
        w.skipped(&skipped(b"run/fifo", SpecialKind::Fifo)).unwrap();
        let (out, summary) = w.finish().unwrap();
        assert_eq!(summary, Summary { entries: 8, files: 2, bytes: 700_000, skipped: 1, stored: 700_000 });
        out
    }

    fn read_all(bytes: &[u8], limits: Limits) -> Result<(Vec<Item>, MemSink), WireError> {
        let mut sink = MemSink::default();
        let mut r = Reader::new(bytes, limits)?;
        let mut items = Vec::new();
        while let Some(item) = r.next(&mut sink)? {
            items.push(item);
        }
        assert!(r.summary().is_some());
        Ok((items, sink))
    }

    #[test]
    fn round_trips_every_kind() {
        let bytes = sample();
        let (items, sink) = read_all(&bytes, Limits::default()).unwrap();
        assert_eq!(items.len(), 9);
        let Item::Entry { entry, .. } = &items[1] else { panic!("expected an entry") };
        let Kind::File { size, sha256, mode } = &entry.kind else { panic!("expected a file") };
        assert_eq!((*size, mode.bits()), (700_000, 0o644));
        assert_eq!(sink.blobs[sha256].len(), 700_000);
        assert_eq!(Sha256::of(&sink.blobs[sha256]), *sha256);
        // The hard-link copy names the same content, with setuid dropped and noted.
        let Item::Entry { entry, stripped_bits } = &items[2] else { panic!("expected an entry") };
        assert!(matches!(entry.kind, Kind::File { mode, sha256: s, .. } if mode.bits() == 0o755 && s == *sha256));
        assert!(*stripped_bits);
        assert_eq!(sink.blobs.len(), 2, "big and empty; the copy was not resent");
        assert_eq!(items[8], Item::Skipped(skipped(b"run/fifo", SpecialKind::Fifo)));
    }

    #[test]
    fn every_truncation_is_detected() {
        let bytes = sample();
        // Cut at many points, including inside headers, content and the end record.
        let mut cuts: Vec<usize> = (0..bytes.len()).step_by(997).collect();
        cuts.extend([1, 11, 12, 13, 17, bytes.len() - 1]);
        for cut in cuts {
            match read_all(&bytes[..cut], Limits::default()) {
                Err(WireError::Truncated { .. }) => {}
                other => panic!("cut at {cut}: expected truncation, got {:?}", other.map(|_| ())),
            }
        }
    }

    #[test]
    fn corrupt_content_and_headers_are_errors() {
        let bytes = sample();
        let mut flipped = bytes.clone();
        flipped[5000] ^= 0x40; // inside big.bin's content
        assert!(matches!(read_all(&flipped, Limits::default()), Err(WireError::ChecksumMismatch { .. })));

        let mut magic = bytes.clone();
        magic[0] = b'X';
        assert!(matches!(read_all(&magic, Limits::default()), Err(WireError::BadMagic)));

        let mut version = bytes.clone();
        version[8] = 9;
        assert!(matches!(read_all(&version, Limits::default()), Err(WireError::Version(9))));

        let mut huge = MAGIC.to_vec();
        huge.extend_from_slice(&VERSION.to_le_bytes());
        huge.push(TAG_ENTRY);
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(read_all(&huge, Limits::default()), Err(WireError::FrameTooLarge { .. })));
    }

    fn forged(records: &[(u8, &[u8])]) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&VERSION.to_le_bytes());
        for (tag, payload) in records {
            write_frame(&mut out, *tag, payload).unwrap();
        }
        out
    }

    #[test]
    fn forged_records_are_rejected() {
        let end0 = br#"{"entries":0,"files":0,"bytes":0,"skipped":0}"#;
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("dotdot", forged(&[(TAG_ENTRY, br#"{"path":"../x","change":{"type":"delete"},"base":{"type":"absent"}}"#)])),
            ("absolute", forged(&[(TAG_ENTRY, br#"{"path":"/etc/passwd","change":{"type":"dir","mode":493},"base":{"type":"absent"}}"#)])),
            ("nested dotdot", forged(&[(TAG_ENTRY, br#"{"path":"a/../../x","change":{"type":"delete"},"base":{"type":"absent"}}"#)])),
            ("nul", forged(&[(TAG_ENTRY, br#"{"path":"a%00b","change":{"type":"delete"},"base":{"type":"absent"}}"#)])),
            ("device", forged(&[(TAG_ENTRY, br#"{"path":"dev","change":{"type":"char_device","mode":420},"base":{"type":"absent"}}"#)])),
            ("unknown content", forged(&[(TAG_ENTRY, br#"{"path":"f","change":{"type":"file","mode":420,"size":1,"same_as":"ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},"base":{"type":"absent"}}"#)])),
            ("lying end", forged(&[(TAG_END, br#"{"entries":5,"files":0,"bytes":0,"skipped":0}"#)])),
            ("unknown record", forged(&[(99, b""), (TAG_END, end0)])),
        ];
        for (name, bytes) in cases {
            let result = read_all(&bytes, Limits::default());
            assert!(result.is_err(), "{name}: forged stream was accepted");
        }
        let long_name =
            format!(r#"{{"path":"{}","change":{{"type":"delete"}},"base":{{"type":"absent"}}}}"#, "n".repeat(256));
        assert!(read_all(&forged(&[(TAG_ENTRY, long_name.as_bytes())]), Limits::default()).is_err());
    }

    #[test]
    fn caps_are_enforced_before_storing() {
        let bytes = sample();
        let few = Limits { max_entries: 3, ..Limits::default() };
        assert!(matches!(read_all(&bytes, few), Err(WireError::TooManyEntries(3))));
        let small = Limits { max_file_size: 1000, ..Limits::default() };
        assert!(matches!(read_all(&bytes, small), Err(WireError::FileTooLarge { size: 700_000, .. })));
        let total = Limits { max_total_bytes: 1000, ..Limits::default() };
        assert!(matches!(read_all(&bytes, total), Err(WireError::TooMuchContent { .. })));
    }

    #[test]
    fn a_file_that_changes_size_breaks_the_writer() {
        let mut w = Writer::new(Vec::new()).unwrap();
        let short = b"abc";
        let err = w.file(&p("f"), 0o644, 10, &mut &short[..], &Base::Absent).unwrap_err();
        assert!(matches!(err, WireError::FileChanged { expected: 10, .. }));
        assert!(matches!(w.dir(&p("d"), 0o755, &Base::Absent), Err(WireError::Broken)));
        let mut w = Writer::new(Vec::new()).unwrap();
        assert!(matches!(
            w.file(&p("f"), 0o644, 2, &mut &short[..], &Base::Absent),
            Err(WireError::FileChanged { .. })
        ));
    }
}
