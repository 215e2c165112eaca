//! Why a guest packet or a connection was refused. None of these is fatal to
//! the device: the packet is dropped or the connection reset.

use std::io;

use thiserror::Error;

use super::BUF_ALLOC;
use super::packet::{HEADER_SIZE, MAX_PKT_DATA};

#[derive(Debug, Error)]
pub(super) enum VsockError {
    #[error("unusable descriptor chain: {0}")]
    Chain(virtio_queue::Error),
    #[error("unreadable packet header: {0}")]
    Header(io::Error),
    #[error("unreadable packet payload: {0}")]
    Payload(io::Error),
    #[error("packet claims {0} payload bytes, more than the {MAX_PKT_DATA}-byte limit")]
    PayloadTooLarge(u32),
    #[error("packet claims {len} payload bytes, its descriptors hold {available}")]
    PayloadTruncated { len: u32, available: usize },
    #[error("rx buffer of {0} bytes is smaller than the {HEADER_SIZE}-byte header")]
    RxBufferTooSmall(usize),
    #[error("cannot write a packet into an rx buffer: {0}")]
    RxWrite(io::Error),
    #[error("guest sent {len} bytes with {buffered} unforwarded, beyond the {BUF_ALLOC}-byte credit")]
    CreditExceeded { len: usize, buffered: usize },
    #[error("guest sent data after shutting down its sending side")]
    DataAfterShutdown,
    #[error("unix stream: {0}")]
    Stream(io::Error),
    #[error("epoll registration: {0}")]
    Epoll(io::Error),
}
