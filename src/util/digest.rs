//! SHA-256 digests: how change sets address content, how templates and
//! caches name what they hold, and how the init's channel proves a stream.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::Digest;
use thiserror::Error;

#[derive(Debug, Error)]
#[error("not a SHA-256 in hex: {0:?}")]
pub struct BadHash(String);

/// A SHA-256 digest; content is addressed by it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Sha256(pub [u8; 32]);

impl Sha256 {
    pub fn of(bytes: &[u8]) -> Sha256 {
        Sha256(sha2::Sha256::digest(bytes).into())
    }

    pub fn hex(&self) -> String {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut s = String::with_capacity(64);
        for b in self.0 {
            s.push(char::from(DIGITS[usize::from(b >> 4)]));
            s.push(char::from(DIGITS[usize::from(b & 0xf)]));
        }
        s
    }

    pub fn from_hex(text: &str) -> Result<Sha256, BadHash> {
        let bytes = text.as_bytes();
        if bytes.len() != 64 {
            return Err(BadHash(text.chars().take(80).collect()));
        }
        let mut out = [0u8; 32];
        for (i, pair) in bytes.chunks(2).enumerate() {
            let s = std::str::from_utf8(pair).map_err(|_| BadHash(text.into()))?;
            out[i] = u8::from_str_radix(s, 16).map_err(|_| BadHash(text.into()))?;
        }
        Ok(Sha256(out))
    }
}

impl fmt::Display for Sha256 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.hex())
    }
}

impl fmt::Debug for Sha256 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", &self.hex()[..12])
    }
}

impl Serialize for Sha256 {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.hex())
    }
}

impl<'de> Deserialize<'de> for Sha256 {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = std::borrow::Cow::<str>::deserialize(d)?;
        Sha256::from_hex(&text).map_err(serde::de::Error::custom)
    }
}

/// Incremental SHA-256 for streamed content.
#[derive(Default, Clone)]
pub struct Hasher(sha2::Sha256);

impl Hasher {
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    pub fn finish(self) -> Sha256 {
        Sha256(self.0.finalize().into())
    }

    /// The hash of everything `reader` yields.
    pub fn of_reader(mut reader: impl std::io::Read) -> std::io::Result<Sha256> {
        let mut hasher = Hasher::default();
        let mut buf = vec![0u8; 64 << 10];
        loop {
            match reader.read(&mut buf) {
                Ok(0) => return Ok(hasher.finish()),
                Ok(n) => hasher.update(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_hex_round_trips() {
        let h = Sha256::of(b"abc");
        assert_eq!(h.hex(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert_eq!(Sha256::from_hex(&h.hex()).unwrap(), h);
        assert!(Sha256::from_hex("xyz").is_err());
        let mut streamed = Hasher::default();
        streamed.update(b"a");
        streamed.update(b"bc");
        assert_eq!(streamed.finish(), h);
    }
}
