//! Attacks on the virtqueue side of the virtio-fs device, as a hostile
//! guest root that writes its rings and descriptor chains as it likes:
//! available indexes past the queue's size or behind the device, rings the
//! queue cannot read, one head offered many times, chains sharing
//! descriptors and buffers, a full queue of long indirect chains, requests
//! that panic, requests added while a batch is served. They drive
//! `serve_queue` (and the worker's handler) on a split queue laid out by
//! hand in guest memory, and judge what comes back on the used ring, that
//! the device returns to waiting, and that no helper is at work once the
//! handler has returned. A test headed "Found by attack" fails until fixed;
//! the others guard attacks that held.

use std::ffi::CStr;
use std::io;
use std::mem::size_of;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use fuse_backend_rs::abi::fuse_abi::{EntryOut, InHeader, InitIn, Opcode, OutHeader, ROOT_ID};
use fuse_backend_rs::api::filesystem::{Context, Entry, FileSystem};
use fuse_backend_rs::api::server::Server;
use virtio_queue::desc::RawDescriptor;
use virtio_queue::desc::split::Descriptor as SplitDescriptor;
use virtio_queue::{Queue, QueueT};
use vm_memory::{ByteValued, Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::epoll::{EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use super::event_handler::FsHandler;
use super::linger::Linger;
use super::pool::Pool;
use super::request::{Access, Left, PASS_BUDGET, Served, Serving, serve_queue};
use super::tally::Tally;
use super::tests::{a_file_entry, helped_pool};
use crate::vmm::devices::virtio::worker::EventHandler;
use crate::vmm::devices::virtio::{DeviceQueue, Interrupt};

pub(super) const F_NEXT: u16 = 1;
pub(super) const F_WRITE: u16 = 2;
const F_INDIRECT: u16 = 4;
pub(super) const NO_NOTIFY: u16 = 1;

const MEM_SIZE: usize = 0x200_0000;
/// Where the rings are: each fits a 1024-entry queue.
const DESC: u64 = 0x1_0000;
const AVAIL: u64 = 0x2_0000;
pub(super) const USED: u64 = 0x3_0000;
/// Requests (256 bytes each) and replies (4 KiB each).
pub(super) const REQS: u64 = 0x10_0000;
pub(super) const REQ_LEN: u64 = 0x100;
pub(super) const RESPS: u64 = 0x20_0000;
pub(super) const RESP_LEN: u32 = 0x1000;
/// Indirect descriptor tables.
const TABLES: u64 = 0x100_0000;

const HEADER: u32 = 16;
const _: () = assert!(HEADER as usize == size_of::<OutHeader>());
/// The length of an answered lookup.
pub(super) const ENTRY_REPLY: u32 = HEADER + 128;
const _: () = assert!(ENTRY_REPLY as usize == size_of::<OutHeader>() + size_of::<EntryOut>());

/// How long a pass over the ring may take before the test calls the worker
/// stuck.
const STUCK: Duration = Duration::from_secs(2);

pub(super) fn leaked_memory() -> &'static GuestMemoryMmap {
    Box::leak(Box::new(GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE)]).unwrap()))
}

/// The guest's side of one split queue.
pub(super) struct Ring {
    mem: &'static GuestMemoryMmap,
    pub(super) size: u16,
    avail: u64,
    /// Used entries read so far.
    seen: u16,
}

impl Ring {
    /// A ring of `size` entries with its available ring at `avail`, and the
    /// device's queue over it.
    fn at(mem: &'static GuestMemoryMmap, size: u16, avail: u64) -> (Ring, Queue) {
        let mut queue = Queue::new(size).unwrap();
        queue.set_size(size);
        queue.set_ready(true);
        let low = |a: u64| Some(u32::try_from(a).unwrap());
        queue.set_desc_table_address(low(DESC), Some(0));
        queue.set_avail_ring_address(low(avail), Some(0));
        queue.set_used_ring_address(low(USED), Some(0));
        assert!(queue.is_valid(mem), "the transport activates a device with this queue");
        (Ring { mem, size, avail, seen: 0 }, queue)
    }

    pub(super) fn new(mem: &'static GuestMemoryMmap, size: u16) -> (Ring, Queue) {
        Ring::at(mem, size, AVAIL)
    }

    fn desc(&self, table: u64, index: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let desc = RawDescriptor::from(SplitDescriptor::new(addr, len, flags, next));
        self.mem.write_obj(desc, GuestAddress(table + 16 * u64::from(index))).unwrap();
    }

    /// A two-descriptor chain at `head`: request `i`, then reply buffer `i`.
    pub(super) fn pair(&self, head: u16, i: u64) {
        self.desc(DESC, head, REQS + i * REQ_LEN, u32::try_from(REQ_LEN).unwrap(), F_NEXT, head + 1);
        self.desc(DESC, head + 1, RESPS + i * u64::from(RESP_LEN), RESP_LEN, F_WRITE, 0);
    }

    pub(super) fn avail_idx(&self) -> u16 {
        self.mem.load(GuestAddress(self.avail + 2), Ordering::SeqCst).unwrap()
    }

    pub(super) fn set_avail_idx(&self, idx: u16) {
        self.mem.store(idx, GuestAddress(self.avail + 2), Ordering::SeqCst).unwrap();
    }

    /// Offers `heads`, in order.
    pub(super) fn publish(&self, heads: &[u16]) {
        let idx = self.avail_idx();
        for (i, &head) in (0u16..).zip(heads) {
            let slot = u64::from(idx.wrapping_add(i) % self.size);
            self.mem.write_obj(head, GuestAddress(self.avail + 4 + 2 * slot)).unwrap();
        }
        self.set_avail_idx(idx.wrapping_add(u16::try_from(heads.len()).unwrap()));
    }

    pub(super) fn used_idx(&self) -> u16 {
        self.mem.load(GuestAddress(USED + 2), Ordering::SeqCst).unwrap()
    }

    /// Another view of the same ring, for a guest thread.
    pub(super) fn view(&self) -> Ring {
        Ring { mem: self.mem, size: self.size, avail: self.avail, seen: self.seen }
    }

    pub(super) fn used_flags(&self) -> u16 {
        self.mem.load(GuestAddress(USED), Ordering::SeqCst).unwrap()
    }

    /// Every (head, length) the device put on the used ring since the last
    /// look.
    pub(super) fn take_used(&mut self) -> Vec<(u32, u32)> {
        let idx: u16 = self.mem.load(GuestAddress(USED + 2), Ordering::SeqCst).unwrap();
        let mut used = Vec::new();
        while self.seen != idx {
            let elem = USED + 4 + 8 * u64::from(self.seen % self.size);
            used.push((
                self.mem.read_obj(GuestAddress(elem)).unwrap(),
                self.mem.read_obj(GuestAddress(elem + 4)).unwrap(),
            ));
            self.seen = self.seen.wrapping_add(1);
        }
        used
    }
}

/// Writes a FUSE request at `at`; returns its length.
fn request(mem: &GuestMemoryMmap, at: u64, opcode: Opcode, unique: u64, nodeid: u64, body: &[u8]) -> u32 {
    let len = u32::try_from(size_of::<InHeader>() + body.len()).unwrap();
    let header = InHeader { len, opcode: opcode as u32, unique, nodeid, uid: 0, gid: 0, pid: 1, padding: 0 };
    mem.write_slice(header.as_slice(), GuestAddress(at)).unwrap();
    mem.write_slice(body, GuestAddress(at + size_of::<InHeader>() as u64)).unwrap();
    len
}

pub(super) fn lookup(mem: &GuestMemoryMmap, at: u64, unique: u64, name: &str) {
    let mut body = name.as_bytes().to_vec();
    body.push(0);
    request(mem, at, Opcode::Lookup, unique, ROOT_ID, &body);
}

fn reply_header(mem: &GuestMemoryMmap, at: u64) -> OutHeader {
    mem.read_obj(GuestAddress(at)).unwrap()
}

/// A filesystem whose lookups say how many run at once: `boom` panics,
/// `slow` takes a while, any other name is found.
#[derive(Default)]
pub(super) struct Probe {
    running: AtomicUsize,
    most: AtomicUsize,
    pub(super) lookups: AtomicUsize,
}

/// Counts a lookup out when it ends, panicking or not.
struct Leave<'a>(&'a AtomicUsize);

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl FileSystem for Probe {
    type Inode = u64;
    type Handle = u64;

    fn lookup(&self, _ctx: &Context, _parent: u64, name: &CStr) -> io::Result<Entry> {
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        let _leave = Leave(&self.running);
        self.most.fetch_max(now, Ordering::SeqCst);
        self.lookups.fetch_add(1, Ordering::SeqCst);
        match name.to_bytes() {
            b"boom" => panic!("a lookup that panics"),
            b"slow" => std::thread::sleep(Duration::from_millis(40)),
            _ => {}
        }
        Ok(a_file_entry())
    }
}

fn stop(pool: Pool<Served>, helpers: Vec<std::thread::JoinHandle<()>>) {
    drop(pool);
    for helper in helpers {
        helper.join().unwrap();
    }
}

/// Serves `queue` as a kick would (and the kicks of its own the worker
/// gives itself when a pass runs out of time).
fn serve<F: FileSystem + Send + Sync + 'static>(
    server: &Arc<Server<F>>,
    mem: &'static GuestMemoryMmap,
    queue: &mut Queue,
    pool: &Pool<Served>,
) -> usize {
    let mut signals = 0;
    let (tally, linger) = (&mut Tally::default(), &mut Linger::never());
    let serving = &mut Serving { access: Access::ReadOnly, pool, tally, linger };
    while serve_queue(server, &mem, queue, serving, &mut || signals += 1) == Left::Requests {}
    signals
}

/// The worker's handler of a device serving `server` on `queue` (its
/// request queue) with `pool`; `irqfd` hears its interrupts.
pub(super) fn handler<F: FileSystem + Send + Sync + 'static>(
    mem: &'static GuestMemoryMmap,
    server: &Arc<Server<F>>,
    queue: Queue,
    pool: Pool<Served>,
    irqfd: &EventFd,
) -> FsHandler<F> {
    FsHandler {
        mem: Arc::new(mem.clone()),
        queues: vec![
            DeviceQueue { queue: Queue::new(16).unwrap(), kick: EventFd::new(EFD_NONBLOCK).unwrap() },
            DeviceQueue { queue, kick: EventFd::new(EFD_NONBLOCK).unwrap() },
        ],
        interrupt: Interrupt::new(irqfd.try_clone().unwrap()),
        server: Arc::clone(server),
        access: Access::ReadOnly,
        pool,
        tag: "queue-attack".into(),
        tally: Tally::default(),
        linger: Linger::new(super::linger::LONGEST),
    }
}

/// A server of `fs` past FUSE_INIT through `queue` (descriptors 0 and 1).
pub(super) fn started<F: FileSystem + Send + Sync + 'static>(
    fs: F,
    ring: &mut Ring,
    queue: &mut Queue,
) -> Arc<Server<F>> {
    let server = Arc::new(Server::new(fs));
    let init = InitIn { major: 7, minor: 31, max_readahead: 0x2_0000, flags: 0 };
    request(ring.mem, REQS, Opcode::Init, 1, 0, init.as_slice());
    ring.pair(0, 0);
    ring.publish(&[0]);
    serve(&server, ring.mem, queue, &Pool::serial());
    let used = ring.take_used();
    assert_eq!(used.len(), 1);
    assert_eq!(reply_header(ring.mem, RESPS).error, 0, "INIT answered");
    server
}

/// What a hostile guest does to its available index.
#[derive(Clone, Copy, Debug)]
enum Index {
    /// One entry more than the queue holds past the device's position.
    PastTheSize,
    /// Far ahead.
    Far,
    /// One behind the device's position: the device has taken more than
    /// the guest now says it offered.
    Behind,
}

/// Serves `queue` on another thread; if a pass does not end within
/// `STUCK`, the guest mends its index to `mended` so that the worker can
/// end, and the answer is false.
fn returns_in_time<F: FileSystem + Send + Sync + 'static>(
    server: &Arc<Server<F>>,
    ring: &Ring,
    queue: &mut Queue,
    pool: &Pool<Served>,
    mended: u16,
) -> bool {
    let (done, ended) = mpsc::channel();
    let mem = ring.mem;
    std::thread::scope(|s| {
        s.spawn(move || {
            serve(server, mem, queue, pool);
            let _ = done.send(());
        });
        if ended.recv_timeout(STUCK).is_ok() {
            return true;
        }
        // Lets the stuck worker go, so the suite can go on.
        ring.set_avail_idx(mended);
        ended.recv().unwrap();
        false
    })
}

/// Found by attack: an available index more than the queue's size past
/// the device's position (or behind it) makes `pop_descriptor_chain`
/// refuse the ring, while `enable_notification` still reports requests
/// waiting, so `serve_queue` goes round for ever: the worker spins a host
/// CPU until the VM ends, never returns to its epoll loop (the hiprio
/// queue is no longer served), and parks no more, so no template can be
/// recorded. A guest kernel does it with one store, serial device or
/// pooled.
#[test]
fn an_available_index_the_queue_cannot_hold_leaves_the_worker_waiting() {
    let mut spun = Vec::new();
    for helpers in [0, 1] {
        for attack in [Index::PastTheSize, Index::Far, Index::Behind] {
            let mem = leaked_memory();
            let (mut ring, mut queue) = Ring::new(mem, 16);
            let probe = Arc::new(Probe::default());
            let server = started(Arc::clone(&probe), &mut ring, &mut queue);
            let (pool, threads) = helped_pool(helpers);
            // Two requests served, so the device stands at 3.
            for i in 0..2u16 {
                lookup(mem, REQS + u64::from(i + 1) * REQ_LEN, 10 + u64::from(i), "a");
                ring.pair(2 + 2 * i, u64::from(i + 1));
            }
            ring.publish(&[2, 4]);
            serve(&server, mem, &mut queue, &pool);
            assert_eq!(ring.take_used().len(), 2);
            let at = ring.avail_idx();
            let bad = match attack {
                Index::PastTheSize => at + ring.size + 1,
                Index::Far => at.wrapping_add(0x8000),
                Index::Behind => at.wrapping_sub(1),
            };
            ring.set_avail_idx(bad);
            let waited = returns_in_time(&server, &ring, &mut queue, &pool, at);
            ring.set_avail_idx(at);
            // The guest mends its ring: the device serves it again.
            lookup(mem, REQS + 3 * REQ_LEN, 20, "a");
            ring.pair(6, 3);
            ring.publish(&[6]);
            assert_eq!(serve(&server, mem, &mut queue, &pool), 1);
            assert_eq!(ring.take_used(), [(6, ENTRY_REPLY)], "{attack:?}, {helpers} helpers: served once mended");
            stop(pool, threads);
            if !waited {
                spun.push(format!("{attack:?} with {helpers} helpers"));
            }
        }
    }
    assert!(spun.is_empty(), "the worker spun on a ring it cannot read: {spun:?}");
}

/// Found by attack: a queue whose available ring the guest put at guest
/// address 0 passes the transport's checks, but `virtio_queue` takes such
/// a queue for one never set up and pops nothing from it, while
/// `enable_notification` reads the index there: the first kick with an
/// index other than 0 spins the worker for ever.
#[test]
fn an_available_ring_at_address_zero_leaves_the_worker_waiting() {
    let mut spun = Vec::new();
    for helpers in [0, 1] {
        let mem = leaked_memory();
        let (ring, mut queue) = Ring::at(mem, 16, 0);
        let server = Arc::new(Server::new(Probe::default()));
        let (pool, threads) = helped_pool(helpers);
        lookup(mem, REQS, 1, "a");
        ring.pair(0, 0);
        ring.publish(&[0]);
        let waited = returns_in_time(&server, &ring, &mut queue, &pool, 0);
        stop(pool, threads);
        if !waited {
            spun.push(helpers);
        }
    }
    assert!(spun.is_empty(), "the worker spun on a ring at address 0 with {spun:?} helpers");
}

/// One head offered many times in one notification is served as often as
/// offered, on the helpers and the worker at once, and returned each time,
/// in order; a chain at the last descriptor whose next is past the table
/// comes back unanswered, and a head past the table is not returned (the
/// used ring takes no such head); nothing else is disturbed.
#[test]
fn a_head_offered_many_times_is_served_and_returned_each_time() {
    let mem = leaked_memory();
    let (mut ring, mut queue) = Ring::new(mem, 64);
    let probe = Arc::new(Probe::default());
    let server = started(Arc::clone(&probe), &mut ring, &mut queue);
    let (pool, threads) = helped_pool(3);
    lookup(mem, REQS + REQ_LEN, 7, "slow");
    ring.pair(4, 1);
    lookup(mem, REQS + 2 * REQ_LEN, 8, "a");
    ring.pair(8, 2);
    // The last descriptor, chained to one past the table.
    ring.desc(DESC, 63, REQS + 2 * REQ_LEN, 64, F_NEXT, 64);
    let mut heads = vec![4u16; 40];
    heads.extend([8, 63, 200, 8]);
    ring.publish(&heads);
    assert_eq!(serve(&server, mem, &mut queue, &pool), 1, "one pass, one interrupt");
    let used = ring.take_used();
    let want: Vec<u32> = heads.iter().filter(|&&h| h < 64).map(|&h| u32::from(h)).collect();
    assert_eq!(used.iter().map(|&(h, _)| h).collect::<Vec<_>>(), want, "every head in range back, in order");
    for &(head, len) in &used {
        let want = if head == 63 { 0 } else { ENTRY_REPLY };
        assert_eq!(len, want, "head {head}");
    }
    assert!(probe.most.load(Ordering::SeqCst) > 1, "the copies were served at once");
    assert_eq!(probe.running.load(Ordering::SeqCst), 0);
    assert_eq!(reply_header(mem, RESPS + 2 * u64::from(RESP_LEN)).unique, 8);
    stop(pool, threads);
}

/// Chains whose reply buffers are other chains' requests, and chains that
/// share their reply descriptor, in one notification, on the helpers at
/// once: every chain comes back once, in order, with a length no larger
/// than its buffers, and the device serves the next request as before.
#[test]
fn chains_sharing_buffers_and_descriptors_are_each_returned_once() {
    let mem = leaked_memory();
    let (mut ring, mut queue) = Ring::new(mem, 256);
    let probe = Arc::new(Probe::default());
    let server = started(Arc::clone(&probe), &mut ring, &mut queue);
    let (pool, threads) = helped_pool(3);
    let mut heads = Vec::new();
    for i in 0..32u16 {
        let at = REQS + u64::from(i) * REQ_LEN;
        lookup(mem, at, 100 + u64::from(i), if i % 4 == 0 { "slow" } else { "a" });
        let head = 2 + 2 * i;
        // Request i, and a reply over request i + 1.
        ring.desc(DESC, head, at, u32::try_from(REQ_LEN).unwrap(), F_NEXT, head + 1);
        ring.desc(DESC, head + 1, at + REQ_LEN, u32::try_from(REQ_LEN).unwrap(), F_WRITE, 0);
        heads.push(head);
    }
    // Sixteen chains sharing one reply descriptor, one that loops on
    // itself, and one whose request is also its reply.
    ring.desc(DESC, 100, RESPS, RESP_LEN, F_WRITE, 0);
    lookup(mem, REQS + 40 * REQ_LEN, 200, "a");
    for i in 0..16u16 {
        ring.desc(DESC, 110 + i, REQS + 40 * REQ_LEN, 64, F_NEXT, 100);
        heads.push(110 + i);
    }
    ring.desc(DESC, 130, REQS + 41 * REQ_LEN, 64, F_NEXT, 130);
    lookup(mem, REQS + 41 * REQ_LEN, 201, "a");
    heads.push(130);
    lookup(mem, REQS + 42 * REQ_LEN, 202, "a");
    ring.desc(DESC, 131, REQS + 42 * REQ_LEN, 64, F_NEXT, 132);
    ring.desc(DESC, 132, REQS + 42 * REQ_LEN, 256, F_WRITE, 0);
    heads.push(131);
    ring.publish(&heads);
    serve(&server, mem, &mut queue, &pool);
    let used = ring.take_used();
    assert_eq!(
        used.iter().map(|&(h, _)| h).collect::<Vec<_>>(),
        heads.iter().map(|&h| u32::from(h)).collect::<Vec<_>>()
    );
    for &(head, len) in &used {
        assert!(len == 0 || len == ENTRY_REPLY || len == HEADER, "head {head}: {len}");
        assert!(len <= RESP_LEN, "head {head}");
    }
    assert_eq!(probe.running.load(Ordering::SeqCst), 0);

    lookup(mem, REQS + 60 * REQ_LEN, 300, "a");
    ring.pair(140, 60);
    ring.publish(&[140]);
    serve(&server, mem, &mut queue, &pool);
    assert_eq!(ring.take_used(), [(140, ENTRY_REPLY)]);
    let header = reply_header(mem, RESPS + 60 * u64::from(RESP_LEN));
    assert_eq!((header.error, header.unique), (0, 300));
    stop(pool, threads);
}

/// A full 1024-entry queue in one notification, every head an indirect
/// descriptor to one shared table of 2048 one-to-four-byte descriptors,
/// and four heads with tables of 65535 descriptors: every chain is served
/// and returned, in order, in bounded time.
#[test]
fn a_full_queue_of_long_indirect_chains_is_served_in_bounded_time() {
    let mem = leaked_memory();
    let (mut ring, mut queue) = Ring::new(mem, 1024);
    let probe = Arc::new(Probe::default());
    let server = started(Arc::clone(&probe), &mut ring, &mut queue);
    let (pool, threads) = helped_pool(3);

    // The request byte by byte, then 4-byte reply buffers.
    let at = REQS + 0x1000;
    lookup(mem, at, 42, "a");
    let request_len = u16::try_from(size_of::<InHeader>() + 2).unwrap();
    let table = |base: u64, entries: u16| {
        for i in 0..entries {
            let last = i + 1 == entries;
            let next = if last { 0 } else { i + 1 };
            let (addr, len, flags) = if i < request_len {
                (at + u64::from(i), 1, F_NEXT)
            } else {
                (RESPS + 4 * u64::from(i - request_len), 4, F_WRITE | F_NEXT)
            };
            ring.desc(base, i, addr, len, if last { flags & !F_NEXT } else { flags }, next);
        }
    };
    let short = TABLES;
    table(short, 2048);
    let long = TABLES + 0x10_0000;
    table(long, u16::MAX);
    let mut heads = Vec::new();
    for head in 0..1024u16 {
        let (base, entries) = if head % 256 == 1 { (long, u16::MAX) } else { (short, 2048) };
        ring.desc(DESC, head, base, u32::from(entries) * 16, F_INDIRECT, 0);
        heads.push(head);
    }
    ring.publish(&heads);
    let started = Instant::now();
    serve(&server, mem, &mut queue, &pool);
    let took = started.elapsed();
    let used = ring.take_used();
    assert_eq!(used.len(), 1024);
    for (i, &(head, len)) in used.iter().enumerate() {
        assert_eq!((head, len), (u32::try_from(i).unwrap(), ENTRY_REPLY));
    }
    assert_eq!(probe.lookups.load(Ordering::SeqCst), 1024);
    assert!(took < Duration::from_secs(60), "took {took:?}");
    stop(pool, threads);
}

/// A request that panics alone (served on the worker) or among others
/// (on a helper) is answered with EIO in its own chain, and the device
/// serves on.
#[test]
fn a_panicking_request_alone_or_in_a_batch_fails_alone() {
    let mem = leaked_memory();
    let (mut ring, mut queue) = Ring::new(mem, 64);
    let probe = Arc::new(Probe::default());
    let server = started(Arc::clone(&probe), &mut ring, &mut queue);
    let (pool, threads) = helped_pool(2);
    lookup(mem, REQS + REQ_LEN, 5, "boom");
    ring.pair(2, 1);
    ring.publish(&[2]);
    serve(&server, mem, &mut queue, &pool);
    assert_eq!(ring.take_used(), [(2, HEADER)]);
    assert_eq!(reply_header(mem, RESPS + u64::from(RESP_LEN)).error, -libc::EIO);

    let names = ["a", "boom", "slow", "boom", "a"];
    let mut heads = Vec::new();
    for (i, name) in (2u16..).zip(names) {
        lookup(mem, REQS + u64::from(i) * REQ_LEN, 10 + u64::from(i), name);
        ring.pair(2 * i, u64::from(i));
        heads.push(2 * i);
    }
    ring.publish(&heads);
    serve(&server, mem, &mut queue, &pool);
    let used: Vec<u32> = ring.take_used().into_iter().map(|(_, len)| len).collect();
    assert_eq!(used, [ENTRY_REPLY, HEADER, ENTRY_REPLY, HEADER, ENTRY_REPLY]);
    for (i, name) in (2u16..).zip(names) {
        let header = reply_header(mem, RESPS + u64::from(i) * u64::from(RESP_LEN));
        let want = if name == "boom" { -libc::EIO } else { 0 };
        assert_eq!((header.error, header.unique), (want, 10 + u64::from(i)), "{name}");
    }
    assert_eq!(probe.running.load(Ordering::SeqCst), 0);
    stop(pool, threads);
}

/// The guest adds requests one by one while the device serves batches on
/// its helpers, and kicks only when the device asks for kicks (used flags
/// without NO_NOTIFY), as a driver does: every request is answered once,
/// in order, none left waiting once the guest stops.
#[test]
fn requests_added_while_a_batch_is_served_are_all_answered() {
    let mem = leaked_memory();
    let (mut ring, mut queue) = Ring::new(mem, 256);
    let probe = Arc::new(Probe::default());
    let server = started(Arc::clone(&probe), &mut ring, &mut queue);
    let (pool, threads) = helped_pool(3);
    const N: u16 = 120;
    for i in 0..N {
        lookup(mem, REQS + u64::from(i) * REQ_LEN, 1000 + u64::from(i), if i % 8 == 0 { "slow" } else { "a" });
        ring.pair(2 + 2 * i, u64::from(i));
    }
    let (kick, kicked) = mpsc::channel::<bool>();
    let kicks = std::thread::scope(|s| {
        let (server, queue, pool) = (&server, &mut queue, &pool);
        let device = s.spawn(move || {
            let mut kicks = 0;
            while kicked.recv().unwrap() {
                kicks += 1;
                serve(server, mem, queue, pool);
            }
            kicks
        });
        let guest = Ring { mem, size: ring.size, avail: ring.avail, seen: 0 };
        for i in 0..N {
            guest.publish(&[2 + 2 * i]);
            std::sync::atomic::fence(Ordering::SeqCst);
            if guest.used_flags() & NO_NOTIFY == 0 {
                kick.send(true).unwrap();
            }
            if i % 3 == 0 {
                std::thread::sleep(Duration::from_millis(3));
            }
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        let answered = || mem.load::<u16>(GuestAddress(USED + 2), Ordering::SeqCst).unwrap().wrapping_sub(ring.seen);
        while answered() != N && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        kick.send(false).unwrap();
        device.join().unwrap()
    });
    let used = ring.take_used();
    let want: Vec<(u32, u32)> = (0..N).map(|i| (u32::from(2 + 2 * i), ENTRY_REPLY)).collect();
    assert_eq!(used, want, "every request answered once, in order, after {kicks} kicks");
    assert!(kicks < usize::from(N), "kicks are off while the device serves");
    for i in 0..N {
        assert_eq!(reply_header(mem, RESPS + u64::from(i) * u64::from(RESP_LEN)).unique, 1000 + u64::from(i));
    }
    stop(pool, threads);
}

/// The worker's handler returns only once every request of the kick is
/// served and on the used ring, with no helper still at work: the template
/// gate, which parks the worker between two events, then parks them too.
#[test]
fn no_helper_is_at_work_once_the_handler_returns() {
    let mem = leaked_memory();
    let (mut ring, mut queue) = Ring::new(mem, 64);
    let probe = Arc::new(Probe::default());
    let server = started(Arc::clone(&probe), &mut ring, &mut queue);
    let (pool, loops) = Pool::new(3);
    let threads: Vec<_> = loops.into_iter().map(std::thread::spawn).collect();
    let irqfd = EventFd::new(EFD_NONBLOCK).unwrap();
    let mut handler = handler(mem, &server, queue, pool, &irqfd);
    for round in 0..3 {
        let mut heads = Vec::new();
        for i in 0..12u16 {
            lookup(mem, REQS + u64::from(i) * REQ_LEN, 50 + u64::from(i), "slow");
            ring.pair(2 + 2 * i, u64::from(i));
            heads.push(2 + 2 * i);
        }
        ring.publish(&heads);
        handler.queues[1].kick.write(1).unwrap();
        handler.handle(&[EpollEvent::new(EventSet::IN, 1)]);
        assert_eq!(probe.running.load(Ordering::SeqCst), 0, "round {round}: a job outlived the handler");
        assert_eq!(ring.take_used().len(), 12, "round {round}");
        assert!(irqfd.read().is_ok(), "round {round}: the interrupt was raised");
    }
    assert!(probe.most.load(Ordering::SeqCst) > 1, "the helpers served beside the worker");
    drop(handler);
    for thread in threads {
        thread.join().unwrap();
    }
}

/// A filesystem whose every lookup, a millisecond long, has the guest
/// offer head 2 again while `left` lasts: a guest that adds a request
/// each time one is being served, so that one always waits after a pass.
struct Refill {
    ring: Ring,
    left: AtomicUsize,
}

impl FileSystem for Refill {
    type Inode = u64;
    type Handle = u64;

    fn lookup(&self, _ctx: &Context, _parent: u64, _name: &CStr) -> io::Result<Entry> {
        std::thread::sleep(Duration::from_millis(1));
        if self.left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok() {
            self.ring.publish(&[2]);
        }
        Ok(a_file_entry())
    }
}

/// Found by attack: a guest that keeps its ring busy (adding requests as
/// fast as they are answered) kept the worker inside one call of the
/// handler for as long as it liked: the hiprio queue went unserved, and
/// the worker never parked, so no template could be recorded. Now a pass
/// ends once its time is spent, with kicks still off and a kick of the
/// worker's own that brings it back after whatever else is ready.
#[test]
fn a_guest_keeping_its_ring_busy_lets_the_worker_back_to_its_events() {
    let mem = leaked_memory();
    let (mut ring, mut queue) = Ring::new(mem, 256);
    let guest = Ring { mem, size: ring.size, avail: ring.avail, seen: 0 };
    let fs = Arc::new(Refill { ring: guest, left: AtomicUsize::new(1_000) });
    let server = started(Arc::clone(&fs), &mut ring, &mut queue);
    lookup(mem, REQS, 7, "a");
    ring.pair(2, 0);
    let irqfd = EventFd::new(EFD_NONBLOCK).unwrap();
    let mut handler = handler(mem, &server, queue, Pool::serial(), &irqfd);
    ring.publish(&[2]);
    for pass in 0..3 {
        let start = Instant::now();
        handler.handle(&[EpollEvent::new(EventSet::IN, 1)]);
        let took = start.elapsed();
        assert!(took < PASS_BUDGET * 10, "pass {pass}: the handler kept the worker for {took:?}");
        assert!(handler.queues[1].kick.read().is_ok(), "pass {pass}: the worker kicked itself to come back");
        assert_ne!(ring.used_flags() & NO_NOTIFY, 0, "pass {pass}: kicks stay off");
    }
    fs.left.store(0, Ordering::SeqCst);
    let used_idx = || mem.load::<u16>(GuestAddress(USED + 2), Ordering::SeqCst).unwrap();
    let mut passes = 0;
    while ring.avail_idx() != used_idx() {
        passes += 1;
        assert!(passes < 100, "the ring was never emptied");
        handler.handle(&[EpollEvent::new(EventSet::IN, 1)]);
    }
    assert_eq!(ring.used_flags() & NO_NOTIFY, 0, "kicks are back on once the ring is empty");
    assert!(handler.queues[1].kick.read().is_err(), "no kick of its own once done");
    let used = ring.take_used();
    assert!(used.len() > 3, "{} answered", used.len());
    assert!(used.iter().all(|&u| u == (2, ENTRY_REPLY)), "every request answered");
}

/// A request the guest sends soon after its last reply, while the worker
/// still watches the ring, is taken without a kick: kicks stay off until
/// the watch ends.
#[test]
fn a_request_sent_while_the_worker_watches_needs_no_kick() {
    let mem = leaked_memory();
    let (mut ring, mut queue) = Ring::new(mem, 64);
    let server = started(Arc::new(Probe::default()), &mut ring, &mut queue);
    for i in 0..2u16 {
        lookup(mem, REQS + u64::from(i) * REQ_LEN, 10 + u64::from(i), "a");
        ring.pair(2 + 2 * i, u64::from(i));
    }
    let used_idx = || mem.load::<u16>(GuestAddress(USED + 2), Ordering::SeqCst).unwrap();
    let first = used_idx();
    ring.publish(&[2]);
    let (mut tally, mut linger) = (Tally::counting(), Linger::watching(Duration::from_millis(300)));
    let mut signals = 0;
    let kicked_off = std::thread::scope(|s| {
        let guest = Ring { mem, size: ring.size, avail: ring.avail, seen: 0 };
        let used_idx = &used_idx;
        let guest = s.spawn(move || {
            while used_idx() == first {
                std::hint::spin_loop();
            }
            std::thread::sleep(Duration::from_millis(2));
            let kicks_off = guest.used_flags() & NO_NOTIFY != 0;
            guest.publish(&[4]);
            kicks_off
        });
        let serving =
            &mut Serving { access: Access::ReadOnly, pool: &Pool::serial(), tally: &mut tally, linger: &mut linger };
        let left = serve_queue(&server, &mem, &mut queue, serving, &mut || signals += 1);
        assert_eq!(left, Left::Nothing);
        guest.join().unwrap()
    });
    assert!(kicked_off, "kicks were off while the worker watched: the guest would not have kicked");
    assert_eq!(ring.take_used(), vec![(2, ENTRY_REPLY), (4, ENTRY_REPLY)]);
    assert_eq!(signals, 2, "each reply signalled as it was put on the ring");
    assert_eq!(tally.caught(), 1);
    assert_eq!(ring.used_flags() & NO_NOTIFY, 0, "kicks back on after the watch");
}

/// Not a test: what the watch saves a guest that sends one request after
/// another, each a moment after its last reply (a program reading files
/// one by one). The worker runs its epoll loop, as in the VMM; the guest
/// offers a request, kicks if kicks are on, spins until the reply, then
/// works for a while. Printed: the round trip's p50/p90 with and without
/// the watch, in alternated rounds. The VM exit a caught request also
/// saves the guest is not here (no VM): this is the worker's wake-up.
/// Run by `benches/file_server.sh`.
#[test]
#[ignore = "a benchmark: benches/file_server.sh runs it"]
fn linger_bench_round_trips_with_and_without_the_watch() {
    use vmm_sys_util::epoll::{ControlOperation, Epoll};
    const REQUESTS: usize = 5_000;
    const GUEST_WORK: Duration = Duration::from_micros(20);
    let mut results: Vec<(&str, Vec<Duration>)> = vec![("kicks only", Vec::new()), ("with the watch", Vec::new())];
    for _round in 0..3 {
        for (label, times) in &mut results {
            let mem = leaked_memory();
            let (mut ring, mut queue) = Ring::new(mem, 256);
            let server = started(Arc::new(Probe::default()), &mut ring, &mut queue);
            lookup(mem, REQS, 7, "a");
            ring.pair(2, 0);
            let irqfd = EventFd::new(EFD_NONBLOCK).unwrap();
            let mut handler = handler(mem, &server, queue, Pool::serial(), &irqfd);
            if *label == "kicks only" {
                handler.linger = Linger::never();
            }
            let kick = handler.queues[1].kick.try_clone().unwrap();
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let worker = {
                let stop = Arc::clone(&stop);
                let kick = kick.try_clone().unwrap();
                std::thread::spawn(move || {
                    let epoll = Epoll::new().unwrap();
                    epoll.ctl(ControlOperation::Add, kick.as_raw_fd(), EpollEvent::new(EventSet::IN, 1)).unwrap();
                    let mut events = [EpollEvent::default(); 2];
                    while !stop.load(Ordering::SeqCst) {
                        let n = epoll.wait(-1, &mut events).unwrap();
                        handler.handle(&events[..n]);
                    }
                })
            };
            let used_idx = || mem.load::<u16>(GuestAddress(USED + 2), Ordering::SeqCst).unwrap();
            for _ in 0..REQUESTS {
                let start = Instant::now();
                ring.publish(&[2]);
                std::sync::atomic::fence(Ordering::SeqCst);
                if ring.used_flags() & NO_NOTIFY == 0 {
                    kick.write(1).unwrap();
                }
                while used_idx() != ring.avail_idx() {
                    std::hint::spin_loop();
                }
                times.push(start.elapsed());
                let worked = Instant::now();
                while worked.elapsed() < GUEST_WORK {
                    std::hint::spin_loop();
                }
            }
            stop.store(true, Ordering::SeqCst);
            kick.write(1).unwrap();
            worker.join().unwrap();
        }
    }
    for (label, times) in &mut results {
        times.sort();
        let at = |q: usize| times[times.len() * q / 100].as_secs_f64() * 1e6;
        println!("round trip of a lone request, {label}: p50 {:.1} µs, p90 {:.1} µs", at(50), at(90));
    }
}
