//! The virtio-blk device as the transport sees it: capacity and segment
//! limit in config space, the read-only feature, and activation.

use std::fs::File;
use std::path::Path;

use thiserror::Error;

use super::event_handler::BlockHandler;
use super::request::{self, SECTOR_SIZE};
use super::{
    NUM_QUEUES, QUEUE_SIZE, SEG_MAX, THREAD, TYPE_BLOCK, VIRTIO_BLK_F_RO, VIRTIO_BLK_F_SEG_MAX,
    VIRTIO_RING_F_INDIRECT_DESC,
};
use crate::vmm::devices::virtio::{
    ActivateError, Activation, VIRTIO_F_VERSION_1, VirtioDevice, read_config_bytes, worker,
};

#[derive(Debug, Error)]
pub enum BlockError {
    #[error("cannot open the disk image {path}")]
    Open {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the disk image {path} is {len} bytes, not a whole number of {SECTOR_SIZE}-byte sectors")]
    Size { path: String, len: u64 },
}

/// A writable disk backed by a host file. No flush feature is offered: the
/// scratch disk needs no durability beyond the VM's life, so the guest
/// treats it as write-through and never waits on host fsyncs.
pub struct Block {
    file: Option<File>,
    sectors: u64,
    read_only: bool,
}

impl Block {
    /// A read-only disk is opened read-only on the host, offered with
    /// VIRTIO_BLK_F_RO, and refuses writes whatever the guest sends.
    pub fn open(path: &Path, read_only: bool) -> Result<Block, BlockError> {
        let open_err = |source| BlockError::Open { path: path.display().to_string(), source };
        let file = File::options().read(true).write(!read_only).open(path).map_err(open_err)?;
        let len = file.metadata().map_err(open_err)?.len();
        if len % SECTOR_SIZE != 0 {
            return Err(BlockError::Size { path: path.display().to_string(), len });
        }
        Ok(Block { file: Some(file), sectors: len / SECTOR_SIZE, read_only })
    }
}

impl VirtioDevice for Block {
    fn device_type(&self) -> u32 {
        TYPE_BLOCK
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE; NUM_QUEUES]
    }

    fn features(&self) -> u64 {
        let ro = if self.read_only { VIRTIO_BLK_F_RO } else { 0 };
        VIRTIO_F_VERSION_1 | VIRTIO_BLK_F_SEG_MAX | VIRTIO_RING_F_INDIRECT_DESC | ro
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        // capacity (le64 sectors), size_max (le32, not offered), seg_max (le32).
        let mut config = [0u8; 16];
        config[..8].copy_from_slice(&self.sectors.to_le_bytes());
        config[12..16].copy_from_slice(&SEG_MAX.to_le_bytes());
        read_config_bytes(&config, offset, data);
    }

    fn activate(&mut self, activation: Activation) -> Result<(), ActivateError> {
        let Activation { mem, queues, interrupt, .. } = activation;
        if queues.len() != NUM_QUEUES {
            return Err(ActivateError::QueueCount { got: queues.len(), want: NUM_QUEUES });
        }
        let file = self.file.take().ok_or_else(|| ActivateError::Backend("activated twice".into()))?;
        let disk = request::Disk::new(file, self.sectors, self.read_only);
        worker::spawn(&THREAD, BlockHandler { mem, queues, interrupt, disk, bounce: Vec::new() })
    }
}
