//! The package cache on disk, under `<cache>/packages/`:
//!
//! - `blobs/<algorithm>-<hex>`: a download, named by the registry's own
//!   digest of it, and only ever written after the bytes were found to have
//!   that digest; checked again each time it is served.
//! - `entries/<sha256 of the download's URL>`: the digest the registry's
//!   metadata gave for that URL (npm and crates versions never change), so
//!   a hit needs no metadata request.
//! - `tmp/`: downloads in progress, renamed into `blobs/` once verified.
//!
//! Only the proxy on the host writes here; the guest never sees the
//! directory. Several runs may fill it at once: every file appears by
//! rename, whole. The size limit holds while it fills: a download reserves
//! room before writing, counting blobs and every run's downloads in
//! progress, and is passed on uncached when it cannot have it.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use blake2::Blake2b;
use blake2::digest::consts::U32;
use sha2::{Digest as _, Sha256, Sha512};

use crate::util::text::human_bytes;

/// The digests registries publish that the cache accepts (sha1, which
/// old npm packages also list, is not one: it can be forged).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    Sha256,
    Sha512,
    Blake2b256,
}

impl Algorithm {
    fn name(self) -> &'static str {
        match self {
            Algorithm::Sha256 => "sha256",
            Algorithm::Sha512 => "sha512",
            Algorithm::Blake2b256 => "blake2b256",
        }
    }

    fn parse(name: &str) -> Option<Algorithm> {
        [Algorithm::Sha256, Algorithm::Sha512, Algorithm::Blake2b256].into_iter().find(|a| a.name() == name)
    }

    fn len(self) -> usize {
        match self {
            Algorithm::Sha256 | Algorithm::Blake2b256 => 32,
            Algorithm::Sha512 => 64,
        }
    }
}

/// A registry's digest of one download.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Digest {
    pub algorithm: Algorithm,
    bytes: Vec<u8>,
}

impl Digest {
    pub fn new(algorithm: Algorithm, bytes: Vec<u8>) -> Option<Digest> {
        (bytes.len() == algorithm.len()).then_some(Digest { algorithm, bytes })
    }

    pub fn from_hex(algorithm: Algorithm, hex: &str) -> Option<Digest> {
        if hex.len() != algorithm.len() * 2 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let bytes =
            (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).ok()).collect::<Option<Vec<u8>>>();
        Digest::new(algorithm, bytes?)
    }

    pub fn hex(&self) -> String {
        self.bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// `sha512-<hex>`: the blob's file name.
    pub fn name(&self) -> String {
        format!("{}-{}", self.algorithm.name(), self.hex())
    }

    fn parse_name(text: &str) -> Option<Digest> {
        let (algorithm, hex) = text.trim().split_once('-')?;
        Digest::from_hex(Algorithm::parse(algorithm)?, hex)
    }
}

impl std::fmt::Display for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

/// A digest being computed.
pub enum Hasher {
    Sha256(Sha256),
    Sha512(Sha512),
    Blake2b256(Blake2b<U32>),
}

impl Hasher {
    pub fn new(algorithm: Algorithm) -> Hasher {
        match algorithm {
            Algorithm::Sha256 => Hasher::Sha256(Sha256::new()),
            Algorithm::Sha512 => Hasher::Sha512(Sha512::new()),
            Algorithm::Blake2b256 => Hasher::Blake2b256(Blake2b::<U32>::new()),
        }
    }

    pub fn update(&mut self, data: &[u8]) {
        match self {
            Hasher::Sha256(h) => h.update(data),
            Hasher::Sha512(h) => h.update(data),
            Hasher::Blake2b256(h) => h.update(data),
        }
    }

    pub fn finish(self) -> Digest {
        let (algorithm, bytes) = match self {
            Hasher::Sha256(h) => (Algorithm::Sha256, h.finalize().to_vec()),
            Hasher::Sha512(h) => (Algorithm::Sha512, h.finalize().to_vec()),
            Hasher::Blake2b256(h) => (Algorithm::Blake2b256, h.finalize().to_vec()),
        };
        Digest { algorithm, bytes }
    }
}

/// A cached file whose bytes no longer have their digest (changed on the
/// host's disk): removed, never served.
#[derive(Debug)]
pub struct Tampered {
    pub found: Digest,
}

/// How much the cache holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub files: u64,
    pub bytes: u64,
}

/// How much a download reserves of the limit at a time, beyond what it
/// has written: what concurrent downloads may hold back from each other.
const RESERVE_STEP: u64 = 1 << 20;

/// Free bytes (to this user) and size of the filesystem holding a
/// directory; `util::space::filesystem` but in tests.
pub type FreeSpace = Box<dyn Fn(&Path) -> io::Result<(u64, u64)> + Send + Sync>;

/// Why a download reached the guest without being kept.
#[derive(Debug)]
pub enum Skip {
    TooLarge {
        limit: u64,
    },
    /// Downloads in progress (this run's or another's) hold the limit.
    Full {
        limit: u64,
    },
    /// Storing would leave less than the margin free.
    Margin {
        margin: u64,
    },
    Write(io::Error),
}

impl std::fmt::Display for Skip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Skip::TooLarge { limit } => write!(f, "larger than the package cache's limit ({})", human_bytes(*limit)),
            Skip::Full { limit } => {
                write!(f, "downloads in progress hold the package cache's limit ({})", human_bytes(*limit))
            }
            Skip::Margin { margin } => {
                write!(f, "keeping it would leave less than {} free on the cache's filesystem", human_bytes(*margin))
            }
            Skip::Write(e) => write!(f, "cannot write the package cache: {e}"),
        }
    }
}

/// What `keep` did with a download that had its digest.
#[derive(Debug)]
pub enum Kept {
    Stored,
    Passed(Skip),
}

/// The bytes the cache holds and is about to hold, as this process knows.
#[derive(Default)]
struct Ledger {
    /// Blobs and other processes' downloads in progress when last counted
    /// (`None`: not yet), plus the blobs kept since.
    held: Option<u64>,
    /// Reserved by this process's downloads in progress.
    reserved: u64,
}

/// What a store and its downloads in progress share.
struct Room {
    dir: PathBuf,
    /// Bytes the blobs and downloads in progress may take together.
    limit: u64,
    free_space: FreeSpace,
    ledger: Mutex<Ledger>,
    /// Blobs were added or evicted: `trim` has entries to clear.
    changed: AtomicBool,
}

pub struct Store {
    room: Arc<Room>,
    /// Names temporary files apart within this process.
    next_tmp: AtomicU64,
}

impl Store {
    /// The cache in `dir` (created, private to the user).
    pub fn open(dir: &Path, limit: u64) -> io::Result<Store> {
        Store::open_with(dir, limit, Box::new(crate::util::space::filesystem))
    }

    /// The cache in `dir`, judging free space by `free_space`.
    pub fn open_with(dir: &Path, limit: u64, free_space: FreeSpace) -> io::Result<Store> {
        for sub in ["blobs", "entries", "tmp"] {
            fs::DirBuilder::new().recursive(true).mode(0o700).create(dir.join(sub))?;
        }
        remove_abandoned(&dir.join("tmp"));
        let room = Room {
            dir: dir.to_path_buf(),
            limit,
            free_space,
            ledger: Mutex::new(Ledger::default()),
            changed: AtomicBool::new(false),
        };
        Ok(Store { room: Arc::new(room), next_tmp: AtomicU64::new(0) })
    }

    fn blob(&self, digest: &Digest) -> PathBuf {
        self.room.dir.join("blobs").join(digest.name())
    }

    fn entry_path(&self, key: &str) -> PathBuf {
        let name: String = Sha256::digest(key.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
        self.room.dir.join("entries").join(name)
    }

    /// The digest recorded for a download's URL.
    pub fn entry(&self, key: &str) -> Option<Digest> {
        let text = fs::read_to_string(self.entry_path(key)).ok()?;
        let (digest, recorded_key) = text.split_once('\n')?;
        // The key is kept in the file too: a hash collision or a mixed-up
        // file must not hand one package's bytes out as another's.
        (recorded_key.trim_end() == key).then(|| Digest::parse_name(digest)).flatten()
    }

    pub fn set_entry(&self, key: &str, digest: &Digest) -> io::Result<()> {
        let (tmp, mut file) = self.temporary()?;
        let written = file.write_all(format!("{}\n{key}\n", digest.name()).as_bytes());
        let renamed = written.and_then(|()| fs::rename(&tmp, self.entry_path(key)));
        if renamed.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        renamed
    }

    fn temporary(&self) -> io::Result<(PathBuf, File)> {
        let n = self.next_tmp.fetch_add(1, Ordering::Relaxed);
        let path = self.room.dir.join("tmp").join(format!("{}-{n}", std::process::id()));
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(true).mode(0o600).open(&path)?;
        Ok((path, file))
    }

    /// The cached file with `digest`, checked: `None` when there is none,
    /// `Tampered` (and removed) when its bytes do not have the digest.
    pub fn verified(&self, digest: &Digest) -> io::Result<Result<Option<(File, u64)>, Tampered>> {
        let path = self.blob(digest);
        let mut file = match File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Ok(None)),
            Err(e) => return Err(e),
        };
        let mut hasher = Hasher::new(digest.algorithm);
        let mut buf = vec![0u8; 256 * 1024];
        let mut size = 0u64;
        loop {
            let n = file.read(&mut buf)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            size += n as u64;
        }
        let found = hasher.finish();
        if found != *digest {
            let _ = fs::remove_file(&path);
            return Ok(Err(Tampered { found }));
        }
        file.rewind()?;
        // Eviction takes the least recently used first.
        let _ = file.set_modified(SystemTime::now());
        Ok(Ok(Some((file, size))))
    }

    /// Starts a download expected to have `expected`, of `length` bytes
    /// when the registry said. It is hashed whatever happens; it is
    /// written to the cache only while it fits (see `Fill::write`).
    pub fn fill(&self, expected: Digest, length: Option<u64>) -> Fill {
        let mut fill = Fill {
            hasher: Hasher::new(expected.algorithm),
            expected,
            tmp: None,
            size: 0,
            reserved: 0,
            skipped: None,
            room: self.room.clone(),
        };
        match self.temporary() {
            Ok(tmp) => fill.tmp = Some(tmp),
            Err(e) => fill.skipped = Some(Skip::Write(e)),
        }
        // A length given up front is reserved whole: downloads started
        // together then count against the limit together from the start.
        if let Some(length) = length {
            fill.reserve(length);
        }
        fill
    }

    /// Keeps a finished download if it has its digest and was written
    /// whole; says whether it was kept.
    pub fn keep(&self, mut fill: Fill) -> io::Result<Result<Kept, Tampered>> {
        let hasher = std::mem::replace(&mut fill.hasher, Hasher::new(fill.expected.algorithm));
        let found = hasher.finish();
        if found != fill.expected {
            // Dropping the fill removes the file.
            return Ok(Err(Tampered { found }));
        }
        let Some((path, file)) = fill.tmp.take() else {
            let skip = fill.skipped.take().unwrap_or(Skip::TooLarge { limit: self.room.limit });
            return Ok(Ok(Kept::Passed(skip)));
        };
        let blob = self.blob(&fill.expected);
        let already = blob.exists();
        let stored = file.set_len(fill.size).and_then(|()| file.sync_data()).and_then(|()| fs::rename(&path, &blob));
        if let Err(e) = stored {
            let _ = fs::remove_file(&path);
            return Err(e);
        }
        let mut ledger = self.room.lock();
        ledger.reserved -= std::mem::take(&mut fill.reserved);
        if !already {
            ledger.held = ledger.held.map(|held| held + fill.size);
        }
        self.room.changed.store(true, Ordering::Relaxed);
        Ok(Ok(Kept::Stored))
    }

    /// When the proxy stops: blobs and other runs' downloads are counted
    /// again, the least recently used blobs go until they fit the limit
    /// (another run may have filled the cache meanwhile, or the limit
    /// been lowered), and the entries naming gone blobs with them.
    pub fn trim(&self) -> io::Result<()> {
        if !self.room.changed.load(Ordering::Relaxed) {
            return Ok(());
        }
        {
            let mut ledger = self.room.lock();
            let reserved = ledger.reserved;
            ledger.held = Some(self.room.evict(reserved, self.room.limit)?);
        }
        for entry in fs::read_dir(self.room.dir.join("entries"))? {
            let path = entry?.path();
            let named = fs::read_to_string(&path).ok().and_then(|t| t.lines().next().and_then(Digest::parse_name));
            if named.is_none_or(|digest| !self.blob(&digest).exists()) {
                let _ = fs::remove_file(&path);
            }
        }
        Ok(())
    }
}

impl Room {
    fn lock(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reserves room for `fill` to hold `needed` bytes, evicting the least
    /// recently used blobs when the limit would be crossed.
    fn reserve(&self, fill: &mut Fill, needed: u64) -> Result<(), Skip> {
        if needed > self.limit {
            return Err(Skip::TooLarge { limit: self.limit });
        }
        if needed <= fill.reserved {
            return Ok(());
        }
        let want = (needed - fill.reserved).max(RESERVE_STEP).min(self.limit - fill.reserved);
        let mut ledger = self.lock();
        let reserved = ledger.reserved + want;
        // What this process reserved is counted as not yet written: a
        // little early to stop, never late, however many run at once.
        let (available, total) = (self.free_space)(&self.dir).map_err(Skip::Write)?;
        let margin = crate::util::space::staging_margin(total);
        if available < margin.saturating_add(reserved) {
            return Err(Skip::Margin { margin });
        }
        if ledger.held.is_none_or(|held| held + reserved > self.limit) {
            // Down to nine tenths, so a full cache is not counted again for
            // every step of every download.
            let low = self.limit - self.limit / 10;
            let target = if reserved <= low { low } else { self.limit };
            let held = self.evict(reserved, target).map_err(Skip::Write)?;
            ledger.held = Some(held);
            if held + reserved > self.limit {
                return Err(Skip::Full { limit: self.limit });
            }
        }
        ledger.reserved = reserved;
        fill.reserved += want;
        Ok(())
    }

    /// Counts what is on disk and removes the least recently used blobs
    /// until it and `reserved` fit in `target`; what is left on disk.
    /// This process's own downloads in progress are `reserved`, not
    /// counted from disk; other processes' are counted and never removed.
    fn evict(&self, reserved: u64, target: u64) -> io::Result<u64> {
        let mut blobs = Vec::new();
        let mut held = 0u64;
        for entry in fs::read_dir(self.dir.join("blobs"))? {
            let entry = entry?;
            let Ok(meta) = entry.metadata() else { continue };
            held += meta.len();
            blobs.push((meta.modified().unwrap_or(SystemTime::UNIX_EPOCH), meta.len(), entry.path()));
        }
        let own = format!("{}-", std::process::id());
        for entry in fs::read_dir(self.dir.join("tmp"))? {
            let entry = entry?;
            if !entry.file_name().to_string_lossy().starts_with(&own) {
                held += entry.metadata().map(|m| m.len()).unwrap_or(0);
            }
        }
        blobs.sort();
        for (_, len, path) in blobs {
            if held + reserved <= target {
                break;
            }
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            held -= len;
            self.changed.store(true, Ordering::Relaxed);
        }
        Ok(held)
    }
}

/// Removes the temporary files of processes that are gone (a proxy that
/// was killed mid-download); they would count against the limit forever.
fn remove_abandoned(tmp: &Path) {
    let Ok(entries) = fs::read_dir(tmp) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let pid = name.to_string_lossy().split('-').next().and_then(|p| p.parse::<u32>().ok());
        let alive = pid.is_some_and(|pid| Path::new("/proc").join(pid.to_string()).exists());
        if !alive {
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// What is in the cache at `dir` (nothing when it does not exist).
pub fn usage(dir: &Path) -> io::Result<Usage> {
    let mut usage = Usage::default();
    let entries = match fs::read_dir(dir.join("blobs")) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(usage),
        Err(e) => return Err(e),
    };
    for entry in entries {
        usage.files += 1;
        usage.bytes += entry?.metadata()?.len();
    }
    Ok(usage)
}

/// Empties the cache at `dir`: what `usage` counted, and the entries.
/// Downloads in progress finish into the emptied cache.
pub fn clear(dir: &Path) -> io::Result<Usage> {
    let removed = usage(dir)?;
    for sub in ["blobs", "entries"] {
        let entries = match fs::read_dir(dir.join(sub)) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for entry in entries {
            fs::remove_file(entry?.path())?;
        }
    }
    Ok(removed)
}

/// A download being hashed, and written to the cache while it fits.
pub struct Fill {
    hasher: Hasher,
    expected: Digest,
    /// The file being written; `None` once the download is not to be kept.
    tmp: Option<(PathBuf, File)>,
    size: u64,
    /// Bytes of the limit this download holds.
    reserved: u64,
    skipped: Option<Skip>,
    room: Arc<Room>,
}

impl Fill {
    /// Hashes `data` and writes it to the cache when there is room
    /// (reserved before it is written); when there is not, the download
    /// goes on uncached and its partial file is removed.
    pub fn write(&mut self, data: &[u8]) {
        self.hasher.update(data);
        self.size += data.len() as u64;
        if self.tmp.is_none() {
            return;
        }
        self.reserve(self.size);
        if let Some((_, file)) = &mut self.tmp {
            if let Err(e) = file.write_all(data) {
                self.stop(Skip::Write(e));
            }
        }
    }

    /// Holds room for `needed` bytes in all, or stops writing. The
    /// temporary file is stretched (sparsely) to what it holds, so other
    /// runs counting the directory see the reservation too.
    fn reserve(&mut self, needed: u64) {
        if self.tmp.is_none() || needed <= self.reserved {
            return;
        }
        let room = self.room.clone();
        let reserved = room.reserve(self, needed);
        let stretched = match (&reserved, &self.tmp) {
            (Ok(()), Some((_, file))) => file.set_len(self.reserved).map_err(Skip::Write),
            _ => Ok(()),
        };
        if let Err(skip) = reserved.and(stretched) {
            self.stop(skip);
        }
    }

    fn stop(&mut self, skip: Skip) {
        if let Some((path, _)) = self.tmp.take() {
            let _ = fs::remove_file(&path);
        }
        self.release();
        self.skipped.get_or_insert(skip);
    }

    fn release(&mut self) {
        let reserved = std::mem::take(&mut self.reserved);
        if reserved > 0 {
            self.room.lock().reserved -= reserved;
        }
    }
}

impl Drop for Fill {
    fn drop(&mut self) {
        // Kept files were renamed away first; this only removes leftovers.
        if let Some((path, _)) = self.tmp.take() {
            let _ = fs::remove_file(&path);
        }
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(name: &str, limit: u64) -> (Store, PathBuf) {
        let dir = std::env::temp_dir().join(format!("stockade-store-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        (Store::open(&dir, limit).unwrap(), dir)
    }

    fn digest_of(data: &[u8]) -> Digest {
        let mut h = Hasher::new(Algorithm::Sha512);
        h.update(data);
        h.finish()
    }

    fn put(store: &Store, data: &[u8]) -> Digest {
        let digest = digest_of(data);
        let mut fill = store.fill(digest.clone(), None);
        fill.write(data);
        assert!(matches!(store.keep(fill).unwrap().unwrap(), Kept::Stored));
        digest
    }

    #[test]
    fn only_bytes_with_the_expected_digest_are_kept_and_served() {
        let (store, dir) = store("verify", u64::MAX);
        let good = put(&store, b"package bytes");
        let (mut file, size) = store.verified(&good).unwrap().unwrap().unwrap();
        let mut back = Vec::new();
        file.read_to_end(&mut back).unwrap();
        assert_eq!((back.as_slice(), size), (&b"package bytes"[..], 13));

        let mut fill = store.fill(digest_of(b"what the registry listed"), None);
        fill.write(b"something else");
        assert!(store.keep(fill).unwrap().is_err(), "a mismatch is not kept");
        assert_eq!(fs::read_dir(dir.join("tmp")).unwrap().count(), 0, "nor left behind");

        fs::write(dir.join("blobs").join(good.name()), b"changed on disk").unwrap();
        assert!(store.verified(&good).unwrap().is_err(), "a changed file is refused");
        assert!(store.verified(&good).unwrap().unwrap().is_none(), "and removed");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn entries_name_their_key_and_survive_only_with_their_blob() {
        let (store, dir) = store("entries", 20);
        let a = put(&store, b"0123456789");
        store.set_entry("https://r.test/a/-/a-1.tgz", &a).unwrap();
        assert_eq!(store.entry("https://r.test/a/-/a-1.tgz"), Some(a.clone()));
        assert_eq!(store.entry("https://r.test/b/-/b-1.tgz"), None);
        std::thread::sleep(std::time::Duration::from_millis(20));
        let b = put(&store, b"abcdefghijklmno");
        store.set_entry("https://r.test/b/-/b-1.tgz", &b).unwrap();
        store.trim().unwrap();
        assert_eq!(usage(&dir).unwrap(), Usage { files: 1, bytes: 15 }, "the older blob went");
        assert_eq!(store.entry("https://r.test/a/-/a-1.tgz"), None);
        assert_eq!(store.entry("https://r.test/b/-/b-1.tgz"), Some(b));
        fs::remove_dir_all(&dir).unwrap();
    }

    /// Bytes the cache holds on disk: kept blobs and downloads in progress.
    fn on_disk(dir: &Path) -> u64 {
        let tmp: u64 = fs::read_dir(dir.join("tmp")).unwrap().map(|e| e.unwrap().metadata().unwrap().len()).sum();
        usage(dir).unwrap().bytes + tmp
    }

    #[test]
    fn the_limit_holds_while_storing_not_only_when_the_proxy_stops() {
        let (store, dir) = store("limit", 64 << 10);
        for i in 0..20u8 {
            let data = vec![i; 10 << 10];
            let mut fill = store.fill(digest_of(&data), None);
            for chunk in data.chunks(1000) {
                fill.write(chunk);
                assert!(on_disk(&dir) <= 64 << 10, "{} bytes on disk mid-download {i}", on_disk(&dir));
            }
            assert!(matches!(store.keep(fill).unwrap().unwrap(), Kept::Stored));
            assert!(on_disk(&dir) <= 64 << 10, "{} bytes on disk after download {i}", on_disk(&dir));
        }
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn downloads_in_progress_count_against_the_limit_together() {
        let (store, dir) = store("together", 64 << 10);
        let (a, b) = (vec![1u8; 40 << 10], vec![2u8; 40 << 10]);
        let mut fa = store.fill(digest_of(&a), None);
        let mut fb = store.fill(digest_of(&b), None);
        for (ca, cb) in a.chunks(4096).zip(b.chunks(4096)) {
            fa.write(ca);
            fb.write(cb);
            assert!(on_disk(&dir) <= 64 << 10, "{} bytes on disk", on_disk(&dir));
        }
        let kept = [store.keep(fa).unwrap().unwrap(), store.keep(fb).unwrap().unwrap()];
        let stored = kept.iter().filter(|k| matches!(k, Kept::Stored)).count();
        assert_eq!(stored, 1, "{kept:?}");
        assert!(kept.iter().any(|k| matches!(k, Kept::Passed(Skip::Full { .. }))), "{kept:?}");
        assert_eq!(fs::read_dir(dir.join("tmp")).unwrap().count(), 0, "no partial file is left");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_download_larger_than_the_limit_is_checked_but_not_kept() {
        let (store, dir) = store("large", 16 << 10);
        put(&store, &[7u8; 8 << 10]);
        let data = vec![9u8; 32 << 10];
        // With a length up front: never written, and nothing kept evicted.
        let mut fill = store.fill(digest_of(&data), Some(data.len() as u64));
        fill.write(&data);
        assert!(matches!(store.keep(fill).unwrap().unwrap(), Kept::Passed(Skip::TooLarge { .. })));
        assert_eq!(usage(&dir).unwrap(), Usage { files: 1, bytes: 8 << 10 });
        // Without: it stops being written at the limit.
        let mut fill = store.fill(digest_of(&data), None);
        for chunk in data.chunks(4096) {
            fill.write(chunk);
            assert!(on_disk(&dir) <= 16 << 10, "{} bytes on disk", on_disk(&dir));
        }
        assert!(matches!(store.keep(fill).unwrap().unwrap(), Kept::Passed(Skip::TooLarge { .. })));
        // Still hashed: a mismatch is refused though nothing was written.
        let mut fill = store.fill(digest_of(b"listed"), Some(data.len() as u64));
        fill.write(&data);
        assert!(store.keep(fill).unwrap().is_err());
        assert_eq!(fs::read_dir(dir.join("tmp")).unwrap().count(), 0);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn storing_stops_at_the_free_space_margin() {
        let dir = std::env::temp_dir().join(format!("stockade-store-margin-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        // A 100 MiB filesystem (a 5 MiB margin) with 8 MiB free, less
        // what the cache's own files take.
        let base = 8 << 20;
        let watched = dir.clone();
        let free: FreeSpace = Box::new(move |_| Ok((base - on_disk(&watched).min(base), 100 << 20)));
        let store = Store::open_with(&dir, 1 << 30, free).unwrap();
        let small = vec![1u8; 40 << 10];
        put(&store, &small);
        let data = vec![3u8; 4 << 20];
        let mut fill = store.fill(digest_of(&data), None);
        for chunk in data.chunks(64 << 10) {
            fill.write(chunk);
            assert!(base - on_disk(&dir) >= 5 << 20, "{} bytes on disk", on_disk(&dir));
        }
        match store.keep(fill).unwrap().unwrap() {
            Kept::Passed(skip @ Skip::Margin { .. }) => assert!(skip.to_string().contains("5.0 MiB free"), "{skip}"),
            other => panic!("kept past the margin: {other:?}"),
        }
        assert_eq!(usage(&dir).unwrap().bytes, 40 << 10, "the earlier file stays; nothing else");
        assert_eq!(fs::read_dir(dir.join("tmp")).unwrap().count(), 0, "the partial file is removed");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_dead_proxys_partial_downloads_are_removed_and_a_live_ones_counted() {
        let (store, dir) = store("abandoned", 64 << 10);
        drop(store);
        // No process has pid 0 in /proc; pid 1 always runs.
        fs::write(dir.join("tmp").join("0-3"), vec![0u8; 50 << 10]).unwrap();
        fs::write(dir.join("tmp").join("1-3"), vec![0u8; 50 << 10]).unwrap();
        let store = Store::open(&dir, 64 << 10).unwrap();
        assert!(!dir.join("tmp").join("0-3").exists());
        let data = vec![5u8; 20 << 10];
        let mut fill = store.fill(digest_of(&data), None);
        fill.write(&data);
        assert!(matches!(store.keep(fill).unwrap().unwrap(), Kept::Passed(Skip::Full { .. })));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn digests_parse_from_hex_and_names() {
        let d = digest_of(b"x");
        assert_eq!(Digest::parse_name(&d.name()), Some(d.clone()));
        assert_eq!(Digest::from_hex(Algorithm::Sha512, &d.hex()), Some(d));
        assert!(Digest::from_hex(Algorithm::Sha256, "abc").is_none());
        assert!(Digest::parse_name("md5-00").is_none());
    }
}
