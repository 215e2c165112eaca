//! Forwarded streams (published ports, the proxy forwarder, the agent
//! socket) as they cross vsock: copied in chunks as large as one vsock
//! packet may carry, since each packet costs a trip through the VMM. The
//! standard library's copy moves 8 KiB at a time between sockets.

use std::io::{ErrorKind, Read, Write};

/// The largest payload of one virtio-vsock packet.
const CHUNK: usize = 64 * 1024;

/// Copies until `from` ends; the bytes copied.
pub fn pump(from: &mut impl Read, to: &mut impl Write) -> std::io::Result<u64> {
    let mut buf = vec![0u8; CHUNK];
    let mut total = 0u64;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        to.write_all(&buf[..n])?;
        total += n as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn everything_is_copied_in_order() {
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let mut out = Vec::new();
        assert_eq!(pump(&mut data.as_slice(), &mut out).unwrap(), data.len() as u64);
        assert_eq!(out, data);
    }
}
