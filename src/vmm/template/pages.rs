//! Guest memory in a template: one file, the regions one after another, in
//! which only the pages the guest ever touched are written (the rest stay
//! holes and read back as the zeros they were). /proc/self/pagemap says
//! which pages are touched, so a 2 GiB guest that used 50 MiB writes 50 MiB.

use std::fs::File;
use std::os::unix::fs::FileExt;

use vm_memory::{GuestMemory, GuestMemoryMmap, GuestMemoryRegion};

use super::TemplateError;

const PAGE: u64 = 4096;
/// pagemap entry bits: the page is in RAM, or swapped out.
const PRESENT: u64 = 1 << 63;
const SWAPPED: u64 = 1 << 62;
/// Pagemap entries read at a time (32 MiB of guest memory).
const ENTRIES_PER_READ: usize = 8192;

/// Which of a mapping's pages hold data, from this process's pagemap.
pub struct Touched {
    pagemap: File,
}

impl Touched {
    /// Opens /proc/self/pagemap; done before the jail closes.
    pub fn open() -> std::io::Result<Touched> {
        Ok(Touched { pagemap: File::open("/proc/self/pagemap")? })
    }

    /// Calls `run(first_page, count)` for each run of touched pages among
    /// the `pages` pages mapped at `host`.
    fn runs(
        &self,
        host: usize,
        pages: u64,
        mut run: impl FnMut(u64, u64) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        let first = host as u64 / PAGE;
        let mut entries = vec![0u8; ENTRIES_PER_READ * 8];
        let mut start: Option<u64> = None;
        let mut page = 0;
        while page < pages {
            let count = (pages - page).min(ENTRIES_PER_READ as u64);
            let bytes = usize::try_from(count * 8).map_err(std::io::Error::other)?;
            self.pagemap.read_exact_at(&mut entries[..bytes], (first + page) * 8)?;
            for (i, entry) in entries[..bytes].chunks_exact(8).enumerate() {
                let entry = u64::from_le_bytes(entry.try_into().expect("8-byte chunk"));
                let at = page + i as u64;
                match (entry & (PRESENT | SWAPPED) != 0, start) {
                    (true, None) => start = Some(at),
                    (false, Some(s)) => {
                        run(s, at - s)?;
                        start = None;
                    }
                    _ => {}
                }
            }
            page += count;
        }
        if let Some(s) = start {
            run(s, pages - s)?;
        }
        Ok(())
    }
}

/// Writes every touched page of `mem` into `out` at its place in the file;
/// returns the bytes written. `out` is already as long as the memory.
pub fn write(mem: &GuestMemoryMmap, touched: &Touched, out: &File) -> Result<u64, TemplateError> {
    let mut offset = 0;
    let mut written = 0;
    for region in mem.iter() {
        let host = mem.get_host_address(region.start_addr()).map_err(|e| TemplateError::Refused(e.to_string()))?;
        let host = host as usize;
        touched
            .runs(host, region.len() / PAGE, |page, count| {
                let len = usize::try_from(count * PAGE).map_err(std::io::Error::other)?;
                let from = host + usize::try_from(page * PAGE).map_err(std::io::Error::other)?;
                // SAFETY: [from, from + len) lies inside this region's
                // mapping, which lives as long as the VM; the vCPUs and
                // device workers are paused, so nothing writes it meanwhile.
                let bytes = unsafe { std::slice::from_raw_parts(from as *const u8, len) };
                out.write_all_at(bytes, offset + page * PAGE)?;
                written += count * PAGE;
                Ok(())
            })
            .map_err(TemplateError::Write)?;
        offset += region.len();
    }
    out.sync_data().map_err(TemplateError::Write)?;
    Ok(written)
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use vm_memory::{Bytes, GuestAddress};

    use super::*;

    #[test]
    fn writes_touched_pages_and_leaves_the_rest_as_holes() {
        let mem = crate::vmm::memory::create(&[(0, 8 << 20), (16 << 20, 4 << 20)]).unwrap();
        mem.write_slice(b"first", GuestAddress(PAGE * 3)).unwrap();
        mem.write_slice(b"second", GuestAddress((16 << 20) + PAGE)).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("memory");
        let out = File::create(&path).unwrap();
        out.set_len(12 << 20).unwrap();
        let written = write(&mem, &Touched::open().unwrap(), &out).unwrap();
        assert!(written <= 4 << 20, "only touched pages (or their huge pages) are written: {written}");
        let mut all = Vec::new();
        File::open(&path).unwrap().read_to_end(&mut all).unwrap();
        assert_eq!(all.len(), 12 << 20);
        assert_eq!(&all[3 * 4096..3 * 4096 + 5], b"first");
        assert_eq!(&all[(8 << 20) + 4096..(8 << 20) + 4096 + 6], b"second");
        let on_disk = std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(&path).unwrap()) * 512;
        assert!(on_disk <= 4 << 20, "the file is sparse: {on_disk} bytes allocated");
    }
}
