//! Finding and describing the guest kernel: a PVH-bootable vmlinux built by
//! guest-kernel/build.sh and installed by install.sh.

use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use thiserror::Error;

use crate::paths::Dirs;

/// Environment variable naming a guest kernel explicitly.
pub const KERNEL_ENV: &str = "STOCKADE_KERNEL";

/// ELF note type of the 32-bit PVH entry point (Xen's XEN_ELFNOTE_PHYS32_ENTRY).
const PVH_NOTE_TYPE: u32 = 18;

#[derive(Debug, Error)]
pub enum KernelError {
    #[error(
        "no guest kernel found (looked in {searched}). Build and install one with ./install.sh, \
         or build it with guest-kernel/build.sh and pass its path with --kernel or {KERNEL_ENV}"
    )]
    NotFound { searched: String },
    #[error("cannot read guest kernel {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not an ELF vmlinux; pass the vmlinux from guest-kernel/build.sh, not a bzImage")]
    NotElf { path: PathBuf },
    #[error("{path} has no PVH entry point; rebuild it with CONFIG_PVH=y (guest-kernel/build.sh does)")]
    NotPvh { path: PathBuf },
}

/// A guest kernel on disk that our VMM can boot.
#[derive(Debug, Clone)]
pub struct GuestKernel {
    pub path: PathBuf,
    /// Whether it was built as a PVM guest, when its build config is known.
    pub pvm_guest: Option<bool>,
}

/// What `stockade doctor` shows of a kernel; reading it means reading the
/// whole file, which `run` has no need for.
#[derive(Debug, Clone)]
pub struct KernelIdentity {
    /// The release from the kernel's banner ("6.12.117"), if found.
    pub version: Option<String>,
    /// SHA-256 of the vmlinux, hex.
    pub sha256: String,
}

impl KernelIdentity {
    pub fn short_hash(&self) -> &str {
        &self.sha256[..16]
    }
}

impl GuestKernel {
    /// Reads the whole vmlinux for its version and hash.
    pub fn identity(&self) -> Result<KernelIdentity, KernelError> {
        let bytes = fs::read(&self.path).map_err(|source| KernelError::Read { path: self.path.clone(), source })?;
        Ok(KernelIdentity { version: banner_version(&bytes), sha256: hex(&Sha256::digest(&bytes)) })
    }
}

/// Where stockade looks for the kernel, in order, when none is named.
pub fn search_path(dirs: &Dirs) -> Vec<PathBuf> {
    let mut paths = vec![dirs.data.join("kernel").join("vmlinux")];
    // install.sh with PREFIX=... puts the kernel beside the binary's prefix.
    if let Some(prefix) = std::env::current_exe().ok().and_then(|exe| exe.parent()?.parent().map(Path::to_path_buf)) {
        let beside = prefix.join("share/stockade/kernel/vmlinux");
        if !paths.contains(&beside) {
            paths.push(beside);
        }
    }
    // Builds from guest-kernel/build.sh, newest first, so a developer's fresh
    // build is found without installing it.
    let mut built: Vec<(std::time::SystemTime, PathBuf)> = fs::read_dir(dirs.cache.join("kernel"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path().join("vmlinux"))
        .filter_map(|p| Some((fs::metadata(&p).ok()?.modified().ok()?, p)))
        .collect();
    built.sort_by_key(|b| std::cmp::Reverse(b.0));
    paths.extend(built.into_iter().map(|(_, p)| p));
    paths
}

/// Finds the guest kernel: the explicit path if given, then $STOCKADE_KERNEL,
/// then the search path.
pub fn locate(dirs: &Dirs, explicit: Option<&Path>) -> Result<GuestKernel, KernelError> {
    let named = explicit.map(Path::to_path_buf).or_else(|| std::env::var_os(KERNEL_ENV).map(PathBuf::from));
    if let Some(path) = named {
        return inspect(&path);
    }
    let candidates = search_path(dirs);
    match candidates.iter().find(|p| p.is_file()) {
        Some(path) => inspect(path),
        None => Err(KernelError::NotFound {
            searched: format!("{} and {}", dirs.data.join("kernel").display(), dirs.cache.join("kernel").display()),
        }),
    }
}

/// Checks that our VMM can boot a vmlinux: an ELF with the PVH entry note.
/// Reads only the headers and notes, not the whole file (every `run` does this).
pub fn inspect(path: &Path) -> Result<GuestKernel, KernelError> {
    let read_error = |source| KernelError::Read { path: path.to_path_buf(), source };
    let mut file = fs::File::open(path).map_err(read_error)?;
    let mut magic = [0u8; 4];
    if file.read_exact(&mut magic).is_err() || &magic != b"\x7fELF" {
        return Err(KernelError::NotElf { path: path.to_path_buf() });
    }
    if !has_pvh_note(&mut file).map_err(read_error)? {
        return Err(KernelError::NotPvh { path: path.to_path_buf() });
    }
    let config = path.parent().map(|dir| dir.join("config"));
    let pvm_guest =
        config.and_then(|c| fs::read_to_string(c).ok()).map(|text| text.lines().any(|l| l == "CONFIG_PVM_GUEST=y"));
    Ok(GuestKernel { path: path.to_path_buf(), pvm_guest })
}

/// The release string from "Linux version <release> (...". The banner is a
/// plain string in .rodata of every vmlinux.
fn banner_version(bytes: &[u8]) -> Option<String> {
    let needle = b"Linux version ";
    let start = bytes.windows(needle.len()).position(|w| w == needle)? + needle.len();
    let rest = &bytes[start..bytes.len().min(start + 64)];
    let end = rest.iter().position(|&b| b == b' ' || b == 0)?;
    std::str::from_utf8(&rest[..end]).ok().map(str::to_owned)
}

/// Largest note segment we read: the kernel's notes are a few hundred bytes.
const MAX_NOTES: u64 = 1 << 20;

/// Whether a 64-bit little-endian ELF has the PVH entry note in a PT_NOTE
/// segment. A malformed file is simply one without it.
fn has_pvh_note(elf: &mut (impl Read + Seek)) -> std::io::Result<bool> {
    const PT_NOTE: u32 = 4;
    let mut header = [0u8; 64];
    elf.seek(SeekFrom::Start(0))?;
    if elf.read_exact(&mut header).is_err() {
        return Ok(false);
    }
    // EI_CLASS 2 = 64-bit, EI_DATA 1 = little-endian.
    if header[4] != 2 || header[5] != 1 {
        return Ok(false);
    }
    let phoff = u64_at(&header, 0x20).unwrap_or(0);
    let phentsize = u16_at(&header, 0x36).map_or(0, usize::from);
    let phnum = u16_at(&header, 0x38).map_or(0, usize::from);
    if phentsize < 56 {
        return Ok(false);
    }
    let mut table = vec![0u8; phentsize * phnum];
    elf.seek(SeekFrom::Start(phoff))?;
    if elf.read_exact(&mut table).is_err() {
        return Ok(false);
    }
    for ph in table.chunks_exact(phentsize) {
        if u32_at(ph, 0) != Some(PT_NOTE) {
            continue;
        }
        let (Some(offset), Some(size)) = (u64_at(ph, 8), u64_at(ph, 32)) else { continue };
        let mut notes = Vec::new();
        elf.seek(SeekFrom::Start(offset))?;
        elf.by_ref().take(size.min(MAX_NOTES)).read_to_end(&mut notes)?;
        if notes_have_pvh(&notes) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Walks one note segment: (namesz, descsz, type, name, desc), 4-aligned.
fn notes_have_pvh(notes: &[u8]) -> bool {
    let align4 = |n: u32| (n as usize).div_ceil(4) * 4;
    let mut at = 0;
    while let (Some(namesz), Some(descsz), Some(kind)) =
        (u32_at(notes, at), u32_at(notes, at + 4), u32_at(notes, at + 8))
    {
        let name_at = at + 12;
        let name = notes.get(name_at..name_at.saturating_add(namesz as usize)).unwrap_or(&[]);
        if kind == PVH_NOTE_TYPE && name.starts_with(b"Xen") {
            return true;
        }
        at = name_at + align4(namesz) + align4(descsz);
    }
    false
}

fn u16_at(bytes: &[u8], at: usize) -> Option<u16> {
    bytes.get(at..at + 2).and_then(|b| b.try_into().ok()).map(u16::from_le_bytes)
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    bytes.get(at..at + 4).and_then(|b| b.try_into().ok()).map(u32::from_le_bytes)
}

fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    bytes.get(at..at + 8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::*;

    /// A minimal ELF64 image with one PT_NOTE segment holding `note`.
    fn elf_with_note(name: &[u8], kind: u32) -> Vec<u8> {
        let mut elf = vec![0u8; 0x40 + 56];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[4] = 2;
        elf[5] = 1;
        elf[0x20..0x28].copy_from_slice(&0x40u64.to_le_bytes());
        elf[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        elf[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
        let note_off = elf.len() as u64;
        let mut note = Vec::new();
        note.extend_from_slice(&u32::try_from(name.len()).unwrap().to_le_bytes());
        note.extend_from_slice(&4u32.to_le_bytes());
        note.extend_from_slice(&kind.to_le_bytes());
        note.extend_from_slice(name);
        while note.len() % 4 != 0 {
            note.push(0);
        }
        note.extend_from_slice(&0x0100_0000u32.to_le_bytes());
        let ph = 0x40;
        elf[ph..ph + 4].copy_from_slice(&4u32.to_le_bytes());
        elf[ph + 8..ph + 16].copy_from_slice(&note_off.to_le_bytes());
        elf[ph + 32..ph + 40].copy_from_slice(&(note.len() as u64).to_le_bytes());
        elf.extend_from_slice(&note);
        elf.extend_from_slice(b"Linux version 6.12.117 (builder) #1\0");
        elf
    }

    #[test]
    fn finds_pvh_note() {
        assert!(has_pvh_note(&mut Cursor::new(elf_with_note(b"Xen\0", PVH_NOTE_TYPE))).unwrap());
    }

    #[test]
    fn rejects_elf_without_pvh_note() {
        assert!(!has_pvh_note(&mut Cursor::new(elf_with_note(b"GNU\0", 3))).unwrap());
        assert!(!has_pvh_note(&mut Cursor::new(b"\x7fELF")).unwrap());
    }

    #[test]
    fn reads_banner_version() {
        let elf = elf_with_note(b"Xen\0", PVH_NOTE_TYPE);
        assert_eq!(banner_version(&elf).as_deref(), Some("6.12.117"));
    }

    #[test]
    fn inspect_rejects_bzimage_like_files() {
        let path = std::env::temp_dir().join(format!("stockade-notelf-{}", std::process::id()));
        std::fs::write(&path, b"MZ not an elf").unwrap();
        let err = inspect(&path).unwrap_err();
        assert!(matches!(err, KernelError::NotElf { .. }), "{err}");
        std::fs::remove_file(&path).unwrap();
    }
}
