//! One FUSE request and its reply.
//!
//! A request is one descriptor chain: device-readable descriptors hold the
//! FUSE request, device-writable ones receive the reply. Whatever the chain
//! holds, it goes back to the guest on the used ring; a request that cannot
//! be served is logged and returned with nothing written.

use std::io::Write;
use std::mem::size_of;
use std::num::Wrapping;
use std::ops::Deref;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use fuse_backend_rs::abi::fuse_abi::{InHeader, Opcode, OutHeader};
use fuse_backend_rs::api::filesystem::FileSystem;
use fuse_backend_rs::api::server::Server;
use fuse_backend_rs::transport::{Reader, VirtioFsWriter, Writer};
use virtio_queue::{DescriptorChain, Queue, QueueT};
use vm_memory::{ByteValued, GuestMemoryMmap};

use super::linger::Linger;
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

/// How long one call of [`serve_queue`] may keep the worker from its event
/// loop (the other queue, a template's recording) while the guest keeps
/// adding requests.
pub(super) const PASS_BUDGET: Duration = Duration::from_millis(20);

/// The most requests one pooled pass takes off the ring: more than the
/// guest sends a notification (7 to 32 seen), few enough that slow
/// requests keep a pass short of what the budget allows.
const POOLED_PASS_MOST: usize = 64;

/// What the worker serves a queue with, besides the queue itself.
pub(super) struct Serving<'a> {
    pub access: Access,
    pub pool: &'a Pool<Served>,
    pub tally: &'a mut Tally,
    pub linger: &'a mut Linger,
}

/// What a call of [`serve_queue`] left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Left {
    /// The ring is empty and kicks are on: the next request kicks.
    Nothing,
    /// The pass's time ran out with requests waiting and kicks still off:
    /// the caller must come back without waiting for a kick.
    Requests,
}

/// Answers requests on `queue` until it is empty with kicks back on. Each
/// kick is a VM exit: while requests are being served the guest adds more
/// without one, and the ring is looked at again once kicks are re-enabled,
/// so none is missed. Before kicks go back on, the worker watches the ring
/// a moment for the guest's next request (see [`Linger`]). `signal` runs
/// after each pass whose replies the driver wants to hear of, so a busy
/// queue holds back no reply. A pool with helpers serves each pass's
/// requests together ([`process_queue_pooled`]); one without serves them
/// one by one ([`process_queue`]). Stops, kicks still off, once
/// [`PASS_BUDGET`] is spent with requests waiting.
pub(super) fn serve_queue<F, M>(
    server: &Arc<Server<F>>,
    mem: &M,
    queue: &mut Queue,
    serving: &mut Serving<'_>,
    signal: &mut dyn FnMut(),
) -> Left
where
    F: FileSystem + Send + Sync + 'static,
    M: Deref<Target = GuestMemoryMmap> + Clone + Send + 'static,
{
    let started = Instant::now();
    let (mut fruitless, mut took, mut first) = (0, 0, true);
    let _ = queue.disable_notification(&**mem);
    loop {
        let access = serving.access;
        let pass = if serving.pool.helpers() == 0 {
            process_queue(server, mem, queue, access, serving.tally, Some(started + PASS_BUDGET))
        } else {
            process_queue_pooled(server, mem, queue, access, serving.pool, serving.tally)
        };
        if std::mem::take(&mut first) {
            serving.linger.learn(pass.taken > 0);
        }
        took += pass.taken;
        if pass.notify {
            signal();
        }
        let more = waiting(queue, mem);
        // The ring says requests wait, but twice none could be taken: the
        // queue refuses it (an available index more than the queue's size
        // past the device or behind it, a ring at address 0 or past
        // memory). Going round would be for ever: the worker waits for the
        // guest's next kick instead.
        fruitless = if more && pass.taken == 0 { fruitless + 1 } else { 0 };
        if fruitless == 2 {
            tracing::warn!("virtio-fs: the guest's available ring is unusable");
            let _ = queue.enable_notification(&**mem);
            return Left::Nothing;
        }
        if started.elapsed() >= PASS_BUDGET {
            if more || queue.enable_notification(&**mem).unwrap_or(false) {
                let _ = queue.disable_notification(&**mem);
                return Left::Requests;
            }
            serving.linger.sleeps();
            return Left::Nothing;
        }
        if more {
            continue;
        }
        // A kick that brought nothing gets no watch: a guest kicking an
        // empty ring must not make the worker spin.
        if took > 0 {
            let (caught, spun) = serving.linger.watch(|| waiting(queue, mem));
            serving.tally.lingered(caught, spun);
            if caught {
                continue;
            }
        }
        if !queue.enable_notification(&**mem).unwrap_or(false) {
            if took > 0 {
                serving.linger.sleeps();
            }
            return Left::Nothing;
        }
        let _ = queue.disable_notification(&**mem);
    }
}

/// Whether the guest has moved the available ring's index past what the
/// device took.
fn waiting(queue: &Queue, mem: &GuestMemoryMmap) -> bool {
    queue.avail_idx(mem, Ordering::Acquire).is_ok_and(|idx| idx != Wrapping(queue.next_avail()))
}

/// What one pass over the available ring did.
pub(super) struct Pass {
    /// Requests taken off the ring.
    pub taken: usize,
    /// Whether the driver wants an interrupt for their replies.
    pub notify: bool,
}

/// Answers the requests available on `queue`, one after the other: a
/// ring's worth at most, and none more once `until` has passed (a guest
/// adding requests as fast as they are taken would otherwise keep the pass
/// going).
pub(super) fn process_queue<F: FileSystem + Sync>(
    server: &Server<F>,
    mem: &GuestMemoryMmap,
    queue: &mut Queue,
    access: Access,
    tally: &mut Tally,
    until: Option<Instant>,
) -> Pass {
    let mut taken = 0;
    for _ in 0..queue.size() {
        if taken > 0 && until.is_some_and(|until| Instant::now() >= until) {
            break;
        }
        let Some(chain) = queue.pop_descriptor_chain(mem) else {
            break;
        };
        let head = chain.head_index();
        let served = handle_chain(server, mem, chain, access);
        give_back(queue, mem, head, Some(served), tally);
        taken += 1;
    }
    Pass { taken, notify: taken > 0 && queue.needs_notification(mem).unwrap_or(true) }
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
) -> Pass
where
    F: FileSystem + Send + Sync + 'static,
    M: Deref<Target = GuestMemoryMmap> + Clone + Send + 'static,
{
    // A bounded batch: a guest adding requests as fast as they are taken
    // would otherwise keep this pass collecting, its list growing, and the
    // pass's time, which the pool divides but does not bound, with it.
    let most = usize::from(queue.size()).min(POOLED_PASS_MOST);
    let chains: Vec<DescriptorChain<M>> =
        std::iter::from_fn(|| queue.pop_descriptor_chain(mem.clone())).take(most).collect();
    if chains.is_empty() {
        return Pass { taken: 0, notify: false };
    }
    let taken = chains.len();
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
    Pass { taken, notify: queue.needs_notification(&**mem).unwrap_or(true) }
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
