//! One FUSE request and its reply.
//!
//! A request is one descriptor chain: device-readable descriptors hold the
//! FUSE request, device-writable ones receive the reply. Whatever the chain
//! holds, it goes back to the guest on the used ring; a request that cannot
//! be served is logged and returned with nothing written.

use std::io::Write;
use std::mem::size_of;
use std::ops::Deref;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use fuse_backend_rs::abi::fuse_abi::{InHeader, Opcode, OutHeader};
use fuse_backend_rs::api::filesystem::FileSystem;
use fuse_backend_rs::api::server::Server;
use fuse_backend_rs::transport::{Reader, VirtioFsWriter, Writer};
use virtio_queue::{DescriptorChain, Queue, QueueOwnedT, QueueT};
use vm_memory::{ByteValued, GuestMemoryMmap};

use super::pool::{Job, Pool};
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
/// driver wants to hear of, so a busy queue holds back no reply. A pool
/// with helpers serves each pass's requests together
/// ([`process_queue_pooled`]); one without serves them one by one
/// ([`process_queue`]).
pub(super) fn serve_queue<F, M>(
    server: &Arc<Server<F>>,
    mem: &M,
    queue: &mut Queue,
    access: Access,
    pool: &Pool<Served>,
    tally: &mut Tally,
    signal: &mut dyn FnMut(),
) where
    F: FileSystem + Send + Sync + 'static,
    M: Deref<Target = GuestMemoryMmap> + Clone + Send + 'static,
{
    loop {
        let _ = queue.disable_notification(&**mem);
        let notify = if pool.helpers() == 0 {
            process_queue(server, mem, queue, access, tally)
        } else {
            process_queue_pooled(server, mem, queue, access, pool, tally)
        };
        if notify {
            signal();
        }
        if !queue.enable_notification(&**mem).unwrap_or(false) {
            return;
        }
        // The ring says requests wait, but one the queue refuses to pop
        // from (an available index more than the queue's size past the
        // device or behind it, a ring at address 0) would bring this loop
        // round for ever: it waits for the guest's next kick instead.
        if let Err(e) = queue.iter(&**mem).map(drop) {
            tracing::warn!("virtio-fs: the guest's available ring is unusable: {e}");
            return;
        }
    }
}

/// Answers every available request on `queue`, one after the other;
/// returns whether the driver wants an interrupt for them.
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
        let served = handle_chain(server, mem, chain, access);
        give_back(queue, mem, head, Some(served), tally);
        used_any = true;
    }
    used_any && queue.needs_notification(mem).unwrap_or(true)
}

/// [`process_queue`] with `pool`'s helpers: every available request is
/// served at once, on this thread and the helpers, and the replies go on
/// the used ring in the order the requests came, from this thread alone,
/// once all are served. A lone request is served here, as by
/// `process_queue`.
fn process_queue_pooled<F, M>(
    server: &Arc<Server<F>>,
    mem: &M,
    queue: &mut Queue,
    access: Access,
    pool: &Pool<Served>,
    tally: &mut Tally,
) -> bool
where
    F: FileSystem + Send + Sync + 'static,
    M: Deref<Target = GuestMemoryMmap> + Clone + Send + 'static,
{
    // A ring's worth at most: a guest adding requests as fast as they are
    // taken would otherwise keep this pass collecting, its list growing.
    let most = usize::from(queue.size());
    let chains: Vec<DescriptorChain<M>> =
        std::iter::from_fn(|| queue.pop_descriptor_chain(mem.clone())).take(most).collect();
    if chains.is_empty() {
        return false;
    }
    let heads: Vec<u16> = chains.iter().map(DescriptorChain::head_index).collect();
    let served: Vec<Option<Served>> = if chains.len() == 1 {
        chains.into_iter().map(|chain| Some(handle_chain(server, mem, chain, access))).collect()
    } else {
        let jobs = chains
            .into_iter()
            .map(|chain| {
                let (server, mem) = (Arc::clone(server), mem.clone());
                Box::new(move || handle_chain(&server, &mem, chain, access)) as Job<Served>
            })
            .collect();
        let ran = pool.run(jobs);
        tally.helped(ran.helper_cpu);
        ran.results
    };
    for (head, served) in heads.into_iter().zip(served) {
        give_back(queue, mem, head, served, tally);
    }
    queue.needs_notification(&**mem).unwrap_or(true)
}

/// What serving one chain gave: the bytes of reply written, and the
/// request's opcode for the tally (none if the chain held no request).
pub(super) struct Served {
    written: u32,
    opcode: Option<u32>,
}

impl Served {
    fn nothing() -> Served {
        Served { written: 0, opcode: None }
    }
}

/// Puts the chain `head` on the used ring with the reply `served` wrote
/// (nothing if serving it panicked past `handle_chain`'s own catch).
fn give_back(queue: &mut Queue, mem: &GuestMemoryMmap, head: u16, served: Option<Served>, tally: &mut Tally) {
    let served = served.unwrap_or_else(|| {
        tracing::warn!("virtio-fs: the request at descriptor {head} panicked");
        Served::nothing()
    });
    if let Some(opcode) = served.opcode {
        tally.served(opcode);
    }
    if let Err(e) = queue.add_used(mem, head, served.written) {
        tracing::warn!("virtio-fs: cannot return a request: {e:?}");
    }
}

/// Serves the request in `chain`, whose buffers are in `mem`.
fn handle_chain<F: FileSystem + Sync, M: Deref<Target = GuestMemoryMmap> + Clone>(
    server: &Server<F>,
    mem: &GuestMemoryMmap,
    chain: DescriptorChain<M>,
    access: Access,
) -> Served {
    let reader = match Reader::from_descriptor_chain(mem, chain.clone()) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!("virtio-fs: malformed request chain: {e}");
            return Served::nothing();
        }
    };
    // A second writer over the same buffers answers a request whose
    // handling panicked.
    let spare = chain.clone();
    let writer: Writer<'_> = match VirtioFsWriter::new(mem, chain) {
        Ok(w) => w.into(),
        Err(e) => {
            tracing::warn!("virtio-fs: malformed reply chain: {e}");
            return Served::nothing();
        }
    };
    let header: InHeader = match reader.clone().read_obj() {
        Ok(h) => h,
        Err(e) => {
            tracing::warn!("virtio-fs: request too short for a FUSE header: {e}");
            return Served::nothing();
        }
    };
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
    Served { written: u32::try_from(written).unwrap_or(u32::MAX), opcode: Some(header.opcode) }
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
