//! One virtio-blk request: a header the driver wrote (type, sector), data
//! buffers, and a status byte we write last (virtio spec 5.2.6). The guest is
//! untrusted: every request is bounds-checked against the disk and a bad one
//! fails alone with an I/O error status.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;

use virtio_queue::{DescriptorChain, Queue, QueueT};
use vm_memory::{ByteValued, GuestMemoryMmap};

pub const SECTOR_SIZE: u64 = 512;

const T_IN: u32 = 0;
const T_OUT: u32 = 1;
const T_FLUSH: u32 = 4;
const T_GET_ID: u32 = 8;

const S_OK: u8 = 0;
const S_IOERR: u8 = 1;
const S_UNSUPP: u8 = 2;

/// The id string GET_ID returns (at most 20 bytes, no NUL needed at 20).
const DISK_ID: &[u8] = b"stockade-scratch";
/// Largest piece copied at once between guest memory and the file.
const CHUNK: usize = 1 << 20;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct RequestHeader {
    type_: u32,
    reserved: u32,
    sector: u64,
}

// SAFETY: RequestHeader is plain old data with no padding (4 + 4 + 8 bytes),
// so any byte pattern is a valid value.
unsafe impl ByteValued for RequestHeader {}

pub(super) struct Disk {
    file: File,
    sectors: u64,
    read_only: bool,
}

impl Disk {
    pub fn new(file: File, sectors: u64, read_only: bool) -> Disk {
        Disk { file, sectors, read_only }
    }

    /// The byte offset of `sector` if `len` bytes from there fit the disk.
    fn range(&self, sector: u64, len: usize) -> Option<u64> {
        let len = u64::try_from(len).ok()?;
        if len % SECTOR_SIZE != 0 {
            return None;
        }
        let end = sector.checked_add(len / SECTOR_SIZE)?;
        (end <= self.sectors).then(|| sector * SECTOR_SIZE)
    }
}

/// Serves every available request; returns whether the driver wants an
/// interrupt for them.
pub(super) fn process_queue(mem: &GuestMemoryMmap, queue: &mut Queue, disk: &Disk, bounce: &mut Vec<u8>) -> bool {
    let mut used_any = false;
    while let Some(chain) = queue.pop_descriptor_chain(mem) {
        let head = chain.head_index();
        let written = serve(mem, chain, disk, bounce);
        if let Err(e) = queue.add_used(mem, head, written) {
            tracing::warn!("virtio-blk: cannot return a request: {e:?}");
        }
        used_any = true;
    }
    used_any && queue.needs_notification(mem).unwrap_or(true)
}

/// Executes one request; returns the bytes written into the chain (data
/// plus the status byte), or 0 for a chain too malformed to answer.
fn serve(mem: &GuestMemoryMmap, chain: DescriptorChain<&GuestMemoryMmap>, disk: &Disk, bounce: &mut Vec<u8>) -> u32 {
    let (mut reader, mut writer) = match (chain.clone().reader(mem), chain.writer(mem)) {
        (Ok(r), Ok(w)) => (r, w),
        _ => {
            tracing::warn!("virtio-blk: malformed request chain");
            return 0;
        }
    };
    let Ok(header) = reader.read_obj::<RequestHeader>() else {
        tracing::warn!("virtio-blk: request too short for its header");
        return 0;
    };
    // The status byte is the chain's last writable byte.
    let Some(data_len) = writer.available_bytes().checked_sub(1) else {
        tracing::warn!("virtio-blk: request without room for a status byte");
        return 0;
    };
    let Ok(mut status_writer) = writer.split_at(data_len) else {
        return 0;
    };
    let (status, data_written) = match header.type_ {
        T_IN => match disk.range(header.sector, data_len) {
            Some(offset) => match read_into(disk, offset, data_len, &mut writer, bounce) {
                Ok(()) => (S_OK, data_len),
                Err(e) => {
                    tracing::warn!("virtio-blk: read at sector {} failed: {e}", header.sector);
                    (S_IOERR, writer.bytes_written())
                }
            },
            None => (S_IOERR, 0),
        },
        T_OUT if disk.read_only => (S_IOERR, 0),
        T_OUT => {
            let len = reader.available_bytes();
            match disk.range(header.sector, len) {
                Some(offset) => match write_from(disk, offset, len, &mut reader, bounce) {
                    Ok(()) => (S_OK, 0),
                    Err(e) => {
                        tracing::warn!("virtio-blk: write at sector {} failed: {e}", header.sector);
                        (S_IOERR, 0)
                    }
                },
                None => (S_IOERR, 0),
            }
        }
        // Not offered, but harmless to honour: the data is in the host's
        // page cache, which is all a scratch disk needs.
        T_FLUSH => (S_OK, 0),
        T_GET_ID => {
            let n = DISK_ID.len().min(data_len);
            match writer.write_all(&DISK_ID[..n]) {
                Ok(()) => (S_OK, n),
                Err(_) => (S_IOERR, 0),
            }
        }
        _ => (S_UNSUPP, 0),
    };
    if status_writer.write_all(&[status]).is_err() {
        return 0;
    }
    u32::try_from(data_written + 1).unwrap_or(u32::MAX)
}

fn read_into(
    disk: &Disk,
    mut offset: u64,
    len: usize,
    writer: &mut virtio_queue::Writer<'_>,
    bounce: &mut Vec<u8>,
) -> std::io::Result<()> {
    let mut left = len;
    while left > 0 {
        let n = left.min(CHUNK);
        bounce.resize(n, 0);
        // Past the end of a sparse file's data reads return zeros; a short
        // read can only mean the file shrank under us.
        disk.file.read_exact_at(&mut bounce[..n], offset)?;
        writer.write_all(&bounce[..n])?;
        offset += n as u64;
        left -= n;
    }
    Ok(())
}

fn write_from(
    disk: &Disk,
    mut offset: u64,
    len: usize,
    reader: &mut virtio_queue::Reader<'_>,
    bounce: &mut Vec<u8>,
) -> std::io::Result<()> {
    let mut left = len;
    while left > 0 {
        let n = left.min(CHUNK);
        bounce.resize(n, 0);
        reader.read_exact(&mut bounce[..n])?;
        disk.file.write_all_at(&bounce[..n], offset)?;
        offset += n as u64;
        left -= n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use virtio_queue::desc::{RawDescriptor, split::Descriptor as SplitDescriptor};
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::{Address, Bytes, GuestAddress};

    use super::*;

    const QSIZE: u16 = 16;
    const HDR: u64 = 0x10_0000;
    const DATA: u64 = 0x20_0000;
    const STATUS: u64 = 0x30_0000;
    const SECTORS: u64 = 64;

    struct TempFile(std::path::PathBuf);

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn disk() -> (Disk, TempFile) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let path = TempFile(std::env::temp_dir().join(format!("stockade-blk-{}-{n}", std::process::id())));
        let file = File::options().read(true).write(true).create(true).truncate(true).open(&path.0).unwrap();
        file.set_len(SECTORS * SECTOR_SIZE).unwrap();
        (Disk::new(file, SECTORS, false), path)
    }

    /// What the driver sees after one request.
    struct Done {
        mem: GuestMemoryMmap,
        status: u8,
        used: u32,
    }

    /// Submits one request: the header, data descriptors of (length,
    /// device-writable) starting at DATA (pre-filled with `payload`), and the
    /// status byte.
    fn submit(disk: &Disk, type_: u32, sector: u64, data: &[(u32, bool)], payload: &[u8]) -> Done {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x40_0000)]).unwrap();
        let mock = MockSplitQueue::create(&mem, GuestAddress(0), QSIZE);
        let mut queue = mock.create_queue().unwrap();
        mem.write_obj(RequestHeader { type_, reserved: 0, sector }, GuestAddress(HDR)).unwrap();
        mem.write_slice(payload, GuestAddress(DATA)).unwrap();
        mem.write_obj(0xffu8, GuestAddress(STATUS)).unwrap();
        let mut descs = vec![(HDR, 16u32, false)];
        let mut addr = DATA;
        for &(len, writable) in data {
            descs.push((addr, len, writable));
            addr += u64::from(len);
        }
        descs.push((STATUS, 1, true));
        let count = u16::try_from(descs.len()).unwrap();
        let raw: Vec<RawDescriptor> = descs
            .iter()
            .zip(0u16..)
            .map(|(&(addr, len, writable), i)| {
                let mut flags = if writable { 2 } else { 0 };
                if i + 1 < count {
                    flags |= 1;
                }
                RawDescriptor::from(SplitDescriptor::new(addr, len, flags, i + 1))
            })
            .collect();
        mock.add_desc_chains(&raw, 0).unwrap();
        process_queue(&mem, &mut queue, disk, &mut Vec::new());
        let used = mem.read_obj(mock.used_addr().unchecked_add(8)).unwrap();
        let status = mem.read_obj(GuestAddress(STATUS)).unwrap();
        drop(mock);
        Done { mem, status, used }
    }

    #[test]
    fn reads_what_the_file_holds_across_descriptors() {
        let (disk, _tmp) = disk();
        let pattern: Vec<u8> = (0..1024u32).map(|i| (i % 251) as u8).collect();
        disk.file.write_all_at(&pattern, 3 * SECTOR_SIZE).unwrap();
        let done = submit(&disk, T_IN, 3, &[(512, true), (512, true)], &[]);
        assert_eq!(done.status, S_OK);
        assert_eq!(done.used, 1025, "data plus the status byte");
        let mut back = vec![0u8; 1024];
        done.mem.read_slice(&mut back, GuestAddress(DATA)).unwrap();
        assert_eq!(back, pattern);
    }

    #[test]
    fn writes_land_in_the_file() {
        let (disk, _tmp) = disk();
        let payload = vec![0x5au8; 1024];
        let done = submit(&disk, T_OUT, 7, &[(1024, false)], &payload);
        assert_eq!(done.status, S_OK);
        assert_eq!(done.used, 1);
        let mut back = vec![0u8; 1024];
        disk.file.read_exact_at(&mut back, 7 * SECTOR_SIZE).unwrap();
        assert_eq!(back, payload);
    }

    #[test]
    fn a_read_only_disk_refuses_writes_and_serves_reads() {
        let (disk, _tmp) = disk();
        disk.file.write_all_at(&[0x77u8; 512], 3 * SECTOR_SIZE).unwrap();
        let ro = Disk::new(disk.file.try_clone().unwrap(), SECTORS, true);
        assert_eq!(submit(&ro, T_OUT, 3, &[(512, false)], &[0u8; 512]).status, S_IOERR);
        let done = submit(&ro, T_IN, 3, &[(512, true)], &[]);
        assert_eq!(done.status, S_OK);
        let mut back = vec![0u8; 512];
        done.mem.read_slice(&mut back, GuestAddress(DATA)).unwrap();
        assert_eq!(back, vec![0x77u8; 512], "the refused write changed nothing");
    }

    #[test]
    fn bad_requests_fail_alone() {
        let (disk, _tmp) = disk();
        assert_eq!(submit(&disk, T_IN, SECTORS, &[(512, true)], &[]).status, S_IOERR);
        assert_eq!(submit(&disk, T_IN, SECTORS - 1, &[(1024, true)], &[]).status, S_IOERR);
        assert_eq!(submit(&disk, T_IN, u64::MAX, &[(512, true)], &[]).status, S_IOERR);
        assert_eq!(submit(&disk, T_OUT, 0, &[(100, false)], &[]).status, S_IOERR);
        assert_eq!(submit(&disk, 77, 0, &[(512, true)], &[]).status, S_UNSUPP);
        assert_eq!(submit(&disk, T_IN, 0, &[(512, true)], &[]).status, S_OK, "the disk still works");
        let len = disk.file.metadata().unwrap().len();
        assert_eq!(len, SECTORS * SECTOR_SIZE, "nothing was written past the end");
    }

    #[test]
    fn get_id_names_the_disk() {
        let (disk, _tmp) = disk();
        let done = submit(&disk, T_GET_ID, 0, &[(20, true)], &[]);
        assert_eq!(done.status, S_OK);
        assert_eq!(done.used as usize, DISK_ID.len() + 1);
        let mut id = vec![0u8; DISK_ID.len()];
        done.mem.read_slice(&mut id, GuestAddress(DATA)).unwrap();
        assert_eq!(id, DISK_ID);
    }
}
