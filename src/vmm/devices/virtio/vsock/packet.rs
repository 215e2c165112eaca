//! The virtio-vsock packet header (virtio spec 5.10.6) and the protocol
//! constants both ends agree on.

use std::io::{self, Read};

use virtio_vsock::packet::PKT_HEADER_SIZE;

/// The well-known CID of the host, as the packet header carries it.
pub(super) const HOST_CID: u64 = crate::protocol::HOST_CID as u64;

/// The only socket type we offer (no VIRTIO_VSOCK_F_SEQPACKET).
pub(super) const TYPE_STREAM: u16 = 1;

pub(super) const OP_REQUEST: u16 = 1;
pub(super) const OP_RESPONSE: u16 = 2;
pub(super) const OP_RST: u16 = 3;
pub(super) const OP_SHUTDOWN: u16 = 4;
pub(super) const OP_RW: u16 = 5;
pub(super) const OP_CREDIT_UPDATE: u16 = 6;
pub(super) const OP_CREDIT_REQUEST: u16 = 7;

/// SHUTDOWN flags: the sender will receive no more data.
pub(super) const SHUTDOWN_RCV: u32 = 1;
/// SHUTDOWN flags: the sender will send no more data.
pub(super) const SHUTDOWN_SEND: u32 = 2;

/// Size of the little-endian wire header that starts every packet.
pub(super) const HEADER_SIZE: usize = PKT_HEADER_SIZE;
const _: () = assert!(HEADER_SIZE == 44);

/// Largest payload one packet may carry, as in Linux
/// (VIRTIO_VSOCK_MAX_PKT_BUF_SIZE); bigger guest packets are malformed.
pub(super) const MAX_PKT_DATA: usize = 64 * 1024;

/// A decoded packet header. Decoding copies it out of guest memory, so the
/// guest cannot change it while we act on it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct PacketHeader {
    pub src_cid: u64,
    pub dst_cid: u64,
    pub src_port: u32,
    pub dst_port: u32,
    pub len: u32,
    pub type_: u16,
    pub op: u16,
    pub flags: u32,
    pub buf_alloc: u32,
    pub fwd_cnt: u32,
}

impl PacketHeader {
    pub fn read_from(reader: &mut impl Read) -> io::Result<PacketHeader> {
        let mut bytes = [0u8; HEADER_SIZE];
        reader.read_exact(&mut bytes)?;
        Ok(PacketHeader::from_bytes(&bytes))
    }

    pub fn from_bytes(b: &[u8; HEADER_SIZE]) -> PacketHeader {
        PacketHeader {
            src_cid: u64::from_le_bytes(field(b, 0)),
            dst_cid: u64::from_le_bytes(field(b, 8)),
            src_port: u32::from_le_bytes(field(b, 16)),
            dst_port: u32::from_le_bytes(field(b, 20)),
            len: u32::from_le_bytes(field(b, 24)),
            type_: u16::from_le_bytes(field(b, 28)),
            op: u16::from_le_bytes(field(b, 30)),
            flags: u32::from_le_bytes(field(b, 32)),
            buf_alloc: u32::from_le_bytes(field(b, 36)),
            fwd_cnt: u32::from_le_bytes(field(b, 40)),
        }
    }

    pub fn to_bytes(self) -> [u8; HEADER_SIZE] {
        let mut b = [0u8; HEADER_SIZE];
        b[0..8].copy_from_slice(&self.src_cid.to_le_bytes());
        b[8..16].copy_from_slice(&self.dst_cid.to_le_bytes());
        b[16..20].copy_from_slice(&self.src_port.to_le_bytes());
        b[20..24].copy_from_slice(&self.dst_port.to_le_bytes());
        b[24..28].copy_from_slice(&self.len.to_le_bytes());
        b[28..30].copy_from_slice(&self.type_.to_le_bytes());
        b[30..32].copy_from_slice(&self.op.to_le_bytes());
        b[32..36].copy_from_slice(&self.flags.to_le_bytes());
        b[36..40].copy_from_slice(&self.buf_alloc.to_le_bytes());
        b[40..44].copy_from_slice(&self.fwd_cnt.to_le_bytes());
        b
    }

    /// The RST that answers this packet, addressed back to its sender. Linux
    /// never answers an RST with an RST, and neither do we.
    pub fn reset_reply(&self) -> Option<PacketHeader> {
        (self.op != OP_RST).then(|| PacketHeader {
            src_cid: self.dst_cid,
            dst_cid: self.src_cid,
            src_port: self.dst_port,
            dst_port: self.src_port,
            type_: self.type_,
            op: OP_RST,
            ..PacketHeader::default()
        })
    }
}

fn field<const N: usize>(b: &[u8; HEADER_SIZE], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&b[at..at + N]);
    out
}
