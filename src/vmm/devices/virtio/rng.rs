//! virtio-rng: the guest's entropy source, fed from the host's /dev/urandom.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;

use virtio_queue::QueueT;
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};

use super::{ActivateError, Activation, DeviceQueue, Interrupt, TYPE_RNG, VIRTIO_F_VERSION_1, VirtioDevice};

const QUEUE_SIZE: u16 = 64;
/// One request may ask for any amount; the host fills at most this much, so a
/// hostile driver cannot make us allocate or read without bound.
const MAX_BYTES_PER_REQUEST: usize = 64 * 1024;

pub struct Rng {
    source: Option<File>,
}

impl Rng {
    pub fn new() -> std::io::Result<Rng> {
        Ok(Rng { source: Some(File::open("/dev/urandom")?) })
    }
}

impl VirtioDevice for Rng {
    fn device_type(&self) -> u32 {
        TYPE_RNG
    }
    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE]
    }
    fn features(&self) -> u64 {
        VIRTIO_F_VERSION_1
    }
    fn read_config(&self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }
    fn activate(&mut self, activation: Activation) -> Result<(), ActivateError> {
        let Activation { mem, mut queues, interrupt, .. } = activation;
        if queues.len() != 1 {
            return Err(ActivateError::QueueCount { got: queues.len(), want: 1 });
        }
        let source = self.source.take().ok_or_else(|| ActivateError::Backend("activated twice".into()))?;
        let queue = queues.remove(0);
        crate::jail::thread::spawn("virtio-rng", crate::jail::ThreadKind::Rng, move || {
            worker(mem, queue, interrupt, source)
        })
        .map_err(ActivateError::Thread)?;
        Ok(())
    }
}

fn worker(mem: GuestMemoryMmap, mut dq: DeviceQueue, interrupt: Interrupt, mut source: File) {
    let epoll = match Epoll::new() {
        Ok(e) => e,
        Err(e) => return tracing::error!("virtio-rng: epoll: {e}"),
    };
    if let Err(e) = epoll.ctl(ControlOperation::Add, dq.kick.as_raw_fd(), EpollEvent::new(EventSet::IN, 0)) {
        return tracing::error!("virtio-rng: epoll add: {e}");
    }
    let mut events = [EpollEvent::default(); 1];
    loop {
        match epoll.wait(-1, &mut events) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return tracing::error!("virtio-rng: epoll wait: {e}"),
        }
        let _ = dq.kick.read();
        if process_queue(&mem, &mut dq, &mut source) {
            interrupt.signal_used_queue();
        }
    }
}

/// Fills every available request; returns whether the driver wants an interrupt.
pub(crate) fn process_queue(mem: &GuestMemoryMmap, dq: &mut DeviceQueue, source: &mut impl Read) -> bool {
    let mut used_any = false;
    while let Some(chain) = dq.queue.pop_descriptor_chain(mem) {
        let head = chain.head_index();
        let written = match chain.writer(mem) {
            Ok(mut writer) => {
                let want = writer.available_bytes().min(MAX_BYTES_PER_REQUEST);
                let mut buf = vec![0u8; want];
                match source.read_exact(&mut buf).and_then(|()| writer.write_all(&buf)) {
                    Ok(()) => want,
                    Err(e) => {
                        tracing::warn!("virtio-rng: request failed: {e}");
                        0
                    }
                }
            }
            Err(e) => {
                tracing::warn!("virtio-rng: malformed request: {e:?}");
                0
            }
        };
        if let Err(e) = dq.queue.add_used(mem, head, written as u32) {
            tracing::warn!("virtio-rng: cannot return a request: {e:?}");
        }
        used_any = true;
    }
    used_any && dq.queue.needs_notification(mem).unwrap_or(true)
}
