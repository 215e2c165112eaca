//! One FUSE request and its reply.
//!
//! A request is one descriptor chain: device-readable descriptors hold the
//! FUSE request, device-writable ones receive the reply. Whatever the chain
//! holds, it goes back to the guest on the used ring; a request that cannot
//! be served is logged and returned with nothing written.

use std::io::Write;
use std::mem::size_of;
use std::panic::{AssertUnwindSafe, catch_unwind};

use fuse_backend_rs::abi::fuse_abi::{InHeader, Opcode, OutHeader};
use fuse_backend_rs::api::filesystem::FileSystem;
use fuse_backend_rs::api::server::Server;
use fuse_backend_rs::transport::{Reader, VirtioFsWriter, Writer};
use virtio_queue::{DescriptorChain, Queue, QueueT};
use vm_memory::{ByteValued, GuestMemoryMmap};

use super::readonly::{Verdict, gate};
use super::tally::Tally;

/// Length of the header every FUSE reply starts with (16 bytes).
const REPLY_HEADER_LEN: usize = size_of::<OutHeader>();
const REPLY_HEADER_LEN_U32: u32 = 16;
const _: () = assert!(REPLY_HEADER_LEN_U32 as usize == REPLY_HEADER_LEN);

/// Whether the device refuses every mutating request (read-only shares) or
/// passes them to the server (a policy's writable mounts).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Access {
    ReadOnly,
    Writable,
}

/// Answers requests on `queue` until it is empty with kicks back on. Each
/// kick is a VM exit: while requests are being served the guest adds more
/// without one, and the ring is looked at again once kicks are re-enabled,
/// so none is missed. `signal` runs after each pass whose replies the
/// driver wants to hear of, so a busy queue holds back no reply.
pub(super) fn serve_queue<F: FileSystem + Sync>(
    server: &Server<F>,
    mem: &GuestMemoryMmap,
    queue: &mut Queue,
    access: Access,
    tally: &mut Tally,
    signal: &mut dyn FnMut(),
) {
    loop {
        let _ = queue.disable_notification(mem);
        if process_queue(server, mem, queue, access, tally) {
            signal();
        }
        if !queue.enable_notification(mem).unwrap_or(false) {
            return;
        }
    }
}

/// Answers every available request on `queue`; returns whether the driver
/// wants an interrupt for them.
pub(super) fn process_queue<F: FileSystem + Sync>(
    server: &Server<F>,
    mem: &GuestMemoryMmap,
    queue: &mut Queue,
    access: Access,
    tally: &mut Tally,
) -> bool {
    let mut used_any = false;
    while let Some(chain) = queue.pop_descriptor_chain(mem) {
        let head = chain.head_index();
        let written = handle_chain(server, mem, chain, access, tally);
        if let Err(e) = queue.add_used(mem, head, written) {
            tracing::warn!("virtio-fs: cannot return a request: {e:?}");
        }
        used_any = true;
    }
    used_any && queue.needs_notification(mem).unwrap_or(true)
}

/// Serves the request in `chain`; returns how many bytes of reply it wrote.
fn handle_chain<F: FileSystem + Sync>(
    server: &Server<F>,
    mem: &GuestMemoryMmap,
    chain: DescriptorChain<&GuestMemoryMmap>,
    access: Access,
    tally: &mut Tally,
) -> u32 {
    let reader = match Reader::from_descriptor_chain(mem, chain.clone()) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!("virtio-fs: malformed request chain: {e}");
            return 0;
        }
    };
    // A second writer over the same buffers answers a request whose
    // handling panicked.
    let spare = chain.clone();
    let writer: Writer<'_> = match VirtioFsWriter::new(mem, chain) {
        Ok(w) => w.into(),
        Err(e) => {
            tracing::warn!("virtio-fs: malformed reply chain: {e}");
            return 0;
        }
    };
    let header: InHeader = match reader.clone().read_obj() {
        Ok(h) => h,
        Err(e) => {
            tracing::warn!("virtio-fs: request too short for a FUSE header: {e}");
            return 0;
        }
    };
    tally.served(header.opcode);
    let room = writer.available_bytes();
    let verdict = match (gate(header.opcode), access) {
        (Verdict::Refuse(libc::EROFS), Access::Writable) => Verdict::Dispatch,
        (verdict, _) => verdict,
    };
    let written = match verdict {
        Verdict::Refuse(errno) => reply_error(writer, header.unique, errno),
        Verdict::Dispatch => {
            // The server must not take the device down whatever the request
            // holds; should it panic anyway, the request fails alone.
            match catch_unwind(AssertUnwindSafe(|| server.handle_message(reader, writer, None, None))) {
                // The server answers FUSE_DESTROY with a bare header but
                // reports having written nothing.
                Ok(Ok(0)) if header.opcode == Opcode::Destroy as u32 && room >= REPLY_HEADER_LEN => REPLY_HEADER_LEN,
                Ok(Ok(n)) => n,
                Ok(Err(e)) => {
                    tracing::warn!("virtio-fs: request {} (opcode {}) failed: {e}", header.unique, header.opcode);
                    0
                }
                Err(_) => {
                    tracing::warn!("virtio-fs: request {} (opcode {}) panicked", header.unique, header.opcode);
                    // EIO, written over whatever part of a reply came first:
                    // the guest's caller gets an error, not a wait for ever.
                    VirtioFsWriter::new(mem, spare).map_or(0, |w| reply_error(w.into(), header.unique, libc::EIO))
                }
            }
        }
    };
    u32::try_from(written).unwrap_or(u32::MAX)
}

/// Writes a reply carrying only `errno`; returns its length, or 0 if the
/// chain has no room for it.
fn reply_error(mut writer: Writer<'_>, unique: u64, errno: i32) -> usize {
    let header = OutHeader { len: REPLY_HEADER_LEN_U32, error: -errno, unique };
    match writer.write_all(header.as_slice()) {
        Ok(()) => REPLY_HEADER_LEN,
        Err(e) => {
            tracing::warn!("virtio-fs: cannot reply to request {unique}: {e}");
            0
        }
    }
}
