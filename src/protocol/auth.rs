//! Only the init speaks for the guest: how the host tells the guest init
//! (PID 1) from every other process in the guest on the init's four ports,
//! `CONTROL_PORT`, `STDIN_PORT`, `CHANGES_PORT` and `PUBLISH_PORT`.
//!
//! Three locks, each for a different adversary:
//!
//! 1. Privileged source ports (enforced by the VMM's vsock device). A
//!    connection to an init port is refused with RST unless its guest source
//!    port is below [`PRIVILEGED_PORTS`]. Linux (net/vmw_vsock/af_vsock.c,
//!    `__vsock_bind_connectible`) lets only `capable(CAP_NET_BIND_SERVICE)`
//!    bind such a port (checked against the initial user namespace, so a
//!    user namespace does not help), and auto-binds unbound sockets above
//!    it. A process running as the user's uid cannot reach an init port at
//!    all; the init binds one before connecting (`guest::channel`).
//! 2. A per-boot [`Token`]. The host draws it at random and sends it in the
//!    `RunSpec` on the control connection, which the host accepts once: the
//!    first control connection is PID 1's, opened before any other guest
//!    process exists; later ones are refused and reported. Every stdin,
//!    change and publish connection must start with the token; one that does not is
//!    refused and reported before a byte of it is used. The token lives only
//!    in PID 1's memory (never in the command's environment, files or logs;
//!    its `Debug` is redacted), so reading it takes the right to ptrace PID
//!    1, which is guest root's.
//! 3. A digest of the change stream. After exporting, the init reports on
//!    the control connection the SHA-256 and length of the change stream it
//!    sent ([`StreamDigest`] in `ExportOutcome::Sent`). The host stages the
//!    first token-bearing change connection as it streams but commits it
//!    only if what it received hashes to exactly that. Later token-bearing
//!    connections (only a reader of PID 1's memory can open one) are
//!    reported and spooled; if the first did not match, the spooled one
//!    that does is staged, so a forger that got in first cannot make the
//!    init's export vanish. Nothing that does not match is ever staged.
//!
//! What this guarantees: a process without CAP_NET_BIND_SERVICE in the guest
//! (the user's command and everything it starts, unless it becomes root)
//! cannot open, block or impersonate the init's channels. Guest root (or
//! anything that can ptrace PID 1) can make the init export what it likes,
//! as it can simply write the workspace; then every byte is staged for
//! review like any other change, and any second channel, forged stream or
//! mismatch is reported (a warning, a failing `--ci`), never staged
//! silently. Guest root can still deny service (panic the guest kernel,
//! stall the export): the run then fails and says so, and the scratch disk
//! that holds the guest's changes is kept.

use std::fmt;
use std::io::{self, Read, Write};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{CHANGES_PORT, CHECKPOINT_PORT, CONTROL_PORT, PUBLISH_PORT, STDIN_PORT};
use crate::util::digest::{Hasher, Sha256};

/// Guest ports below this need CAP_NET_BIND_SERVICE to bind.
pub const PRIVILEGED_PORTS: u32 = 1024;

/// The host ports only the init may connect to.
pub const INIT_PORTS: [u32; 5] = [CONTROL_PORT, STDIN_PORT, CHANGES_PORT, PUBLISH_PORT, CHECKPOINT_PORT];

pub const TOKEN_LEN: usize = 32;

/// The per-boot secret that stdin and change connections start with.
#[derive(Clone, PartialEq, Eq)]
pub struct Token([u8; TOKEN_LEN]);

impl Token {
    /// A fresh token from the kernel's random source.
    pub fn generate() -> io::Result<Token> {
        let mut bytes = [0u8; TOKEN_LEN];
        std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
        Ok(Token(bytes))
    }

    #[cfg(test)]
    pub fn from_bytes(bytes: [u8; TOKEN_LEN]) -> Token {
        Token(bytes)
    }

    #[cfg(test)]
    pub fn as_bytes(&self) -> &[u8; TOKEN_LEN] {
        &self.0
    }

    /// Compares in constant time, so a guest timing its refusals learns
    /// nothing of the token.
    pub fn matches(&self, presented: &[u8; TOKEN_LEN]) -> bool {
        self.0.iter().zip(presented).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    }

    /// Reads the token a connection starts with and says whether it is this
    /// one.
    pub fn check(&self, input: &mut impl Read) -> io::Result<bool> {
        let mut presented = [0u8; TOKEN_LEN];
        input.read_exact(&mut presented)?;
        Ok(self.matches(&presented))
    }

    /// Starts a connection with the token.
    pub fn present(&self, out: &mut impl Write) -> io::Result<()> {
        out.write_all(&self.0)?;
        out.flush()
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(redacted)")
    }
}

impl Serialize for Token {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        Sha256(self.0).serialize(s)
    }
}

impl<'de> Deserialize<'de> for Token {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Same width and hex form as a SHA-256; the type is only borrowed
        // for its encoding.
        Ok(Token(Sha256::deserialize(d)?.0))
    }
}

/// What went over a change connection after the token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamDigest {
    pub bytes: u64,
    pub sha256: Sha256,
}

/// Hashes a byte stream as it passes.
#[derive(Default, Clone)]
pub struct StreamHasher {
    hasher: Hasher,
    bytes: u64,
}

impl StreamHasher {
    pub fn update(&mut self, data: &[u8]) {
        self.hasher.update(data);
        self.bytes += data.len() as u64;
    }

    pub fn finish(self) -> StreamDigest {
        StreamDigest { bytes: self.bytes, sha256: self.hasher.finish() }
    }
}

/// A writer that hashes what it writes (the init's side of the digest).
pub struct DigestWriter<W> {
    inner: W,
    hasher: StreamHasher,
}

impl<W: Write> DigestWriter<W> {
    pub fn new(inner: W) -> DigestWriter<W> {
        DigestWriter { inner, hasher: StreamHasher::default() }
    }

    pub fn finish(self) -> (W, StreamDigest) {
        (self.inner, self.hasher.finish())
    }
}

impl<W: Write> Write for DigestWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_compare_and_never_print() {
        let token = Token::generate().unwrap();
        assert_ne!(token, Token::generate().unwrap(), "two draws of 256 bits differ");
        let json = serde_json::to_string(&token).unwrap();
        assert_eq!(serde_json::from_str::<Token>(&json).unwrap(), token);
        assert_eq!(format!("{token:?}"), "Token(redacted)");
        let mut wire = Vec::new();
        token.present(&mut wire).unwrap();
        assert!(token.check(&mut &wire[..]).unwrap());
        let mut wrong = wire.clone();
        wrong[31] ^= 1;
        assert!(!token.check(&mut &wrong[..]).unwrap());
        assert!(token.check(&mut &wire[..5]).is_err(), "a short token is an error, not a match");
    }

    #[test]
    fn the_digest_covers_exactly_what_was_written() {
        let mut w = DigestWriter::new(Vec::new());
        w.write_all(b"STKDCHG\n").unwrap();
        w.write_all(b"rest").unwrap();
        let (out, digest) = w.finish();
        assert_eq!(digest, StreamDigest { bytes: 12, sha256: Sha256::of(b"STKDCHG\nrest") });
        let mut h = StreamHasher::default();
        h.update(&out[..3]);
        h.update(&out[3..]);
        assert_eq!(h.finish(), digest);
    }
}
