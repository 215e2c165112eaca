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
//! rename, whole.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::SystemTime;

use blake2::Blake2b;
use blake2::digest::consts::U32;
use sha2::{Digest as _, Sha256, Sha512};

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

pub struct Store {
    dir: PathBuf,
    /// Bytes of blobs kept after a run that added some.
    limit: u64,
    filled: AtomicBool,
    /// Names temporary files apart within this process.
    next_tmp: AtomicU64,
}

impl Store {
    /// The cache in `dir` (created, private to the user).
    pub fn open(dir: &Path, limit: u64) -> io::Result<Store> {
        for sub in ["blobs", "entries", "tmp"] {
            fs::DirBuilder::new().recursive(true).mode(0o700).create(dir.join(sub))?;
        }
        Ok(Store { dir: dir.to_path_buf(), limit, filled: AtomicBool::new(false), next_tmp: AtomicU64::new(0) })
    }

    fn blob(&self, digest: &Digest) -> PathBuf {
        self.dir.join("blobs").join(digest.name())
    }

    fn entry_path(&self, key: &str) -> PathBuf {
        let name: String = Sha256::digest(key.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
        self.dir.join("entries").join(name)
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
        file.write_all(format!("{}\n{key}\n", digest.name()).as_bytes())?;
        fs::rename(&tmp, self.entry_path(key))
    }

    fn temporary(&self) -> io::Result<(PathBuf, File)> {
        let n = self.next_tmp.fetch_add(1, Ordering::Relaxed);
        let path = self.dir.join("tmp").join(format!("{}-{n}", std::process::id()));
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

    /// Starts writing a download expected to have `expected`.
    pub fn fill(&self, expected: Digest) -> io::Result<Fill> {
        let (path, file) = self.temporary()?;
        Ok(Fill { hasher: Hasher::new(expected.algorithm), expected, path, file, size: 0 })
    }

    /// Keeps a finished download if it has its digest; the file to serve.
    pub fn keep(&self, mut fill: Fill) -> io::Result<Result<(File, u64), Tampered>> {
        let hasher = std::mem::replace(&mut fill.hasher, Hasher::new(fill.expected.algorithm));
        let found = hasher.finish();
        if found != fill.expected {
            // Dropping the fill removes the file.
            return Ok(Err(Tampered { found }));
        }
        fill.file.sync_data()?;
        fs::rename(&fill.path, self.blob(&fill.expected))?;
        self.filled.store(true, Ordering::Relaxed);
        let mut file = fill.file.try_clone()?;
        file.rewind()?;
        Ok(Ok((file, fill.size)))
    }

    /// After a run that added files: the least recently used go until the
    /// blobs fit the limit, with the entries that named them.
    pub fn trim(&self) -> io::Result<()> {
        if !self.filled.load(Ordering::Relaxed) {
            return Ok(());
        }
        let mut blobs = Vec::new();
        let mut total = 0u64;
        for entry in fs::read_dir(self.dir.join("blobs"))? {
            let entry = entry?;
            let meta = entry.metadata()?;
            total += meta.len();
            blobs.push((meta.modified().unwrap_or(SystemTime::UNIX_EPOCH), meta.len(), entry.path()));
        }
        if total <= self.limit {
            return Ok(());
        }
        blobs.sort();
        for (_, len, path) in blobs {
            if total <= self.limit {
                break;
            }
            fs::remove_file(&path)?;
            total -= len;
        }
        for entry in fs::read_dir(self.dir.join("entries"))? {
            let path = entry?.path();
            let named = fs::read_to_string(&path).ok().and_then(|t| t.lines().next().and_then(Digest::parse_name));
            if named.is_none_or(|digest| !self.blob(&digest).exists()) {
                let _ = fs::remove_file(&path);
            }
        }
        Ok(())
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

/// A download being written and hashed.
pub struct Fill {
    hasher: Hasher,
    expected: Digest,
    path: PathBuf,
    file: File,
    size: u64,
}

impl Fill {
    pub fn write(&mut self, data: &[u8]) -> io::Result<()> {
        self.hasher.update(data);
        self.size += data.len() as u64;
        self.file.write_all(data)
    }
}

impl Drop for Fill {
    fn drop(&mut self) {
        // Kept files were renamed away first; this only removes leftovers.
        let _ = fs::remove_file(&self.path);
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
        let mut fill = store.fill(digest.clone()).unwrap();
        fill.write(data).unwrap();
        store.keep(fill).unwrap().unwrap();
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

        let mut fill = store.fill(digest_of(b"what the registry listed")).unwrap();
        fill.write(b"something else").unwrap();
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

    #[test]
    fn digests_parse_from_hex_and_names() {
        let d = digest_of(b"x");
        assert_eq!(Digest::parse_name(&d.name()), Some(d.clone()));
        assert_eq!(Digest::from_hex(Algorithm::Sha512, &d.hex()), Some(d));
        assert!(Digest::from_hex(Algorithm::Sha256, "abc").is_none());
        assert!(Digest::parse_name("md5-00").is_none());
    }
}
