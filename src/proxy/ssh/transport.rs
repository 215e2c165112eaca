//! The server's half of an SSH connection until its keys change (RFC 4253
//! §4.2, §6, §7, §8): lines up to its version line, then binary packets in
//! the clear. The relay forwards it frame by frame and reads one: the
//! key-exchange reply, which holds the server's host key and its signature
//! over the exchange hash (the session id, for the first exchange).

use ssh_key::{PublicKey, Signature};

use super::wire::Reader;

/// The largest packet accepted before the keys change (RFC 4253 asks for
/// 35000; post-quantum key exchanges stay well under this).
const MAX_PACKET: usize = 256 * 1024;
/// The most the server may send before its version line (RFC 4253 §4.2
/// allows other lines first).
const MAX_PREAMBLE: usize = 16 * 1024;

/// SSH_MSG_NEWKEYS: from here on the server's side is encrypted.
pub const MSG_NEWKEYS: u8 = 21;
/// SSH_MSG_KEXDH_REPLY / KEX_ECDH_REPLY (and KEX_DH_GEX_GROUP, which has
/// another shape and does not parse as a reply).
const MSG_KEX_REPLY: u8 = 31;
/// SSH_MSG_KEX_DH_GEX_REPLY.
const MSG_GEX_REPLY: u8 = 33;

/// One whole line or packet, as received.
#[derive(Debug)]
pub struct Frame {
    pub bytes: Vec<u8>,
    /// The message number of a packet; `None` for a line.
    pub msg: Option<u8>,
}

impl Frame {
    /// The host key and exchange signature, when this is a key-exchange
    /// reply whose fields parse.
    pub fn exchange_reply(&self) -> Option<(PublicKey, Signature)> {
        if !matches!(self.msg, Some(MSG_KEX_REPLY | MSG_GEX_REPLY)) {
            return None;
        }
        let mut r = Reader::new(payload(&self.bytes)?);
        r.byte()?;
        let host_key = PublicKey::from_bytes(r.string()?).ok()?;
        r.string()?;
        let signature = Signature::try_from(r.string()?).ok()?;
        Some((host_key, signature))
    }
}

/// A packet's payload: after the length and padding length, before the padding.
fn payload(packet: &[u8]) -> Option<&[u8]> {
    let padding = usize::from(*packet.get(4)?);
    packet.get(5..packet.len().checked_sub(padding)?)
}

/// Splits the server's bytes into frames.
#[derive(Default)]
pub struct ServerFrames {
    buf: Vec<u8>,
    versioned: bool,
    preamble: usize,
}

impl ServerFrames {
    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// The next whole frame; `Ok(None)` until more bytes come.
    pub fn next(&mut self) -> Result<Option<Frame>, String> {
        if !self.versioned {
            let Some(end) = self.buf.iter().position(|&b| b == b'\n') else {
                return if self.preamble + self.buf.len() > MAX_PREAMBLE {
                    Err("the server sent no SSH version line".into())
                } else {
                    Ok(None)
                };
            };
            let line: Vec<u8> = self.buf.drain(..=end).collect();
            self.preamble += line.len();
            if line.starts_with(b"SSH-") {
                if !line.starts_with(b"SSH-2.0-") && !line.starts_with(b"SSH-1.99-") {
                    return Err("the server does not speak SSH 2".into());
                }
                self.versioned = true;
            } else if self.preamble > MAX_PREAMBLE {
                return Err("the server sent no SSH version line".into());
            }
            return Ok(Some(Frame { bytes: line, msg: None }));
        }
        let Some(head) = self.buf.first_chunk::<4>() else { return Ok(None) };
        let len = usize::try_from(u32::from_be_bytes(*head)).unwrap_or(usize::MAX);
        if !(5..=MAX_PACKET).contains(&len) {
            return Err(format!("the server sent a packet of {len} bytes before its keys changed"));
        }
        if self.buf.len() < 4 + len {
            return Ok(None);
        }
        let bytes: Vec<u8> = self.buf.drain(..4 + len).collect();
        if usize::from(bytes[4]) + 1 > len {
            return Err("the server sent a packet whose padding is longer than the packet".into());
        }
        let msg = payload(&bytes).and_then(|p| p.first().copied());
        match msg {
            Some(msg) => Ok(Some(Frame { bytes, msg: Some(msg) })),
            None => Err("the server sent an empty packet".into()),
        }
    }

    /// What is left once the keys changed (encrypted bytes).
    pub fn rest(self) -> Vec<u8> {
        self.buf
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::proxy::ssh::wire::put_string;
    use signature::Signer;
    use ssh_key::private::{Ed25519Keypair, KeypairData};

    /// A packet with `payload` and 4 bytes of padding.
    pub fn packet(payload: &[u8]) -> Vec<u8> {
        let len = u32::try_from(payload.len() + 5).unwrap();
        let mut out = len.to_be_bytes().to_vec();
        out.push(4);
        out.extend_from_slice(payload);
        out.extend_from_slice(&[0; 4]);
        out
    }

    pub fn keypair(seed: u8) -> Ed25519Keypair {
        Ed25519Keypair::from_seed(&[seed; 32])
    }

    /// A KEX_ECDH_REPLY from the server holding `host`, signing `hash`.
    pub fn reply(host: &Ed25519Keypair, hash: &[u8]) -> Vec<u8> {
        let mut payload = vec![MSG_KEX_REPLY];
        put_string(&mut payload, &PublicKey::from(host.public).to_bytes().unwrap());
        put_string(&mut payload, &[7; 32]);
        let signature: Signature = KeypairData::from(host.clone()).try_sign(hash).unwrap();
        put_string(&mut payload, &signature::SignatureEncoding::to_vec(&signature));
        packet(&payload)
    }

    #[test]
    fn lines_then_packets_and_the_reply_is_read() {
        let host = keypair(1);
        let mut stream = b"hello first\r\nSSH-2.0-OpenSSH_9.2\r\n".to_vec();
        stream.extend(packet(&[20, 1, 2, 3]));
        stream.extend(reply(&host, b"exchange hash"));
        stream.extend(packet(&[MSG_NEWKEYS]));
        stream.extend_from_slice(b"encrypted");
        let mut frames = ServerFrames::default();
        let mut seen = Vec::new();
        // Byte by byte: frames come whole however the bytes arrive.
        for b in &stream {
            frames.push(&[*b]);
            while let Some(frame) = frames.next().unwrap() {
                let done = frame.msg == Some(MSG_NEWKEYS);
                seen.push(frame);
                if done {
                    break;
                }
            }
            if seen.last().is_some_and(|f| f.msg == Some(MSG_NEWKEYS)) {
                break;
            }
        }
        let msgs: Vec<Option<u8>> = seen.iter().map(|f| f.msg).collect();
        assert_eq!(msgs, [None, None, Some(20), Some(31), Some(21)]);
        let (key, signature) = seen[3].exchange_reply().unwrap();
        assert_eq!(key.key_data(), &PublicKey::from(host.public).key_data().clone());
        assert!(signature::Verifier::verify(key.key_data(), b"exchange hash", &signature).is_ok());
        assert!(seen[2].exchange_reply().is_none());
        let total: usize = seen.iter().map(|f| f.bytes.len()).sum();
        assert_eq!(total, stream.len() - b"encrypted".len(), "every byte up to NEWKEYS, once");
    }

    #[test]
    fn garbage_from_the_server_is_refused_not_buffered_forever() {
        let mut frames = ServerFrames::default();
        frames.push(&vec![b'x'; MAX_PREAMBLE + 1]);
        assert!(frames.next().is_err());
        let mut frames = ServerFrames::default();
        frames.push(b"SSH-1.5-old\r\n");
        assert!(frames.next().is_err());
        let mut frames = ServerFrames::default();
        frames.push(b"SSH-2.0-x\r\n\xff\xff\xff\xff");
        frames.next().unwrap();
        assert!(frames.next().unwrap_err().contains("packet of"));
        let mut frames = ServerFrames::default();
        frames.push(b"SSH-2.0-x\r\n\x00\x00\x00\x08\x09aaaaaaa");
        frames.next().unwrap();
        assert!(frames.next().unwrap_err().contains("padding"));
    }

    #[test]
    fn a_group_exchange_group_message_is_not_taken_for_a_reply() {
        let mut payload = vec![MSG_KEX_REPLY];
        put_string(&mut payload, &[0x00, 0xff, 0xff, 0xff]);
        put_string(&mut payload, &[2]);
        let frame = Frame { bytes: packet(&payload), msg: Some(MSG_KEX_REPLY) };
        assert!(frame.exchange_reply().is_none());
    }
}
