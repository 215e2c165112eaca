//! Reading the server name (SNI) from the first bytes a client sends in a
//! CONNECT tunnel, so a tunnel opened to an allowed host cannot carry a TLS
//! session for another one (domain fronting). Pure: bytes in, answer out.

/// The most a ClientHello may take before we give up on it. A real one,
/// even with post-quantum key shares, is a few KiB.
pub const MAX_CLIENT_HELLO: usize = 64 * 1024;

const RECORD_HANDSHAKE: u8 = 22;
const HANDSHAKE_CLIENT_HELLO: u8 = 1;
const EXTENSION_SERVER_NAME: u16 = 0;
const NAME_TYPE_HOST_NAME: u8 = 0;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inspection {
    /// The bytes so far are the start of a TLS record: read more.
    NeedMore,
    /// Not TLS at all (a plain protocol tunnelled through CONNECT).
    NotTls,
    /// A complete ClientHello, with the name it asks for if any.
    ClientHello { sni: Option<String> },
    /// Starts like TLS but is not a well-formed ClientHello.
    Malformed,
}

/// Inspects the first bytes of a tunnel.
pub fn inspect(buf: &[u8]) -> Inspection {
    match buf.first() {
        None => return Inspection::NeedMore,
        Some(&RECORD_HANDSHAKE) => {}
        Some(_) => return Inspection::NotTls,
    }
    if buf.len() >= 2 && buf[1] != 3 {
        return Inspection::NotTls; // TLS record versions are all 3.x
    }
    // The ClientHello may span several records: join their payloads.
    let mut handshake = Vec::new();
    let mut rest = buf;
    loop {
        if rest.len() < 5 {
            return need_more(buf);
        }
        if rest[0] != RECORD_HANDSHAKE {
            return Inspection::Malformed;
        }
        let len = usize::from(u16::from_be_bytes([rest[3], rest[4]]));
        if rest.len() < 5 + len {
            return need_more(buf);
        }
        handshake.extend_from_slice(&rest[5..5 + len]);
        rest = &rest[5 + len..];
        if handshake.len() >= 4 {
            if handshake[0] != HANDSHAKE_CLIENT_HELLO {
                return Inspection::Malformed;
            }
            let body_len = usize::from(handshake[1]) << 16 | usize::from(handshake[2]) << 8 | usize::from(handshake[3]);
            if handshake.len() >= 4 + body_len {
                return match server_name(&handshake[4..4 + body_len]) {
                    Some(sni) => Inspection::ClientHello { sni },
                    None => Inspection::Malformed,
                };
            }
        }
    }
}

fn need_more(buf: &[u8]) -> Inspection {
    if buf.len() >= MAX_CLIENT_HELLO { Inspection::Malformed } else { Inspection::NeedMore }
}

/// The host_name of the server_name extension of a ClientHello body;
/// `None` when the body is malformed, `Some(None)` when it has no SNI.
fn server_name(body: &[u8]) -> Option<Option<String>> {
    let mut r = Reader(body);
    r.take(2 + 32)?; // legacy_version, random
    let session_id = usize::from(r.u8()?);
    r.take(session_id)?;
    let suites = usize::from(r.u16()?);
    r.take(suites)?;
    let compression = usize::from(r.u8()?);
    r.take(compression)?;
    if r.0.is_empty() {
        return Some(None); // no extensions at all
    }
    let ext_len = usize::from(r.u16()?);
    let mut exts = Reader(r.take(ext_len)?);
    while !exts.0.is_empty() {
        let kind = exts.u16()?;
        let len = usize::from(exts.u16()?);
        let data = exts.take(len)?;
        if kind != EXTENSION_SERVER_NAME {
            continue;
        }
        let mut list = Reader(data);
        let list_len = usize::from(list.u16()?);
        let mut names = Reader(list.take(list_len)?);
        while !names.0.is_empty() {
            let name_type = names.u8()?;
            let len = usize::from(names.u16()?);
            let name = names.take(len)?;
            if name_type == NAME_TYPE_HOST_NAME {
                return Some(Some(String::from_utf8(name.to_vec()).ok()?));
            }
        }
        return Some(None);
    }
    Some(None)
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Some(head)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A minimal ClientHello naming `sni` (none when `None`), as records of at
    /// most `record_size` payload bytes.
    pub fn client_hello(sni: Option<&str>, record_size: usize) -> Vec<u8> {
        let mut body = vec![3, 3];
        body.extend_from_slice(&[7; 32]);
        body.push(0); // session id
        body.extend_from_slice(&[0, 2, 0x13, 0x01]); // one cipher suite
        body.extend_from_slice(&[1, 0]); // null compression
        let mut exts = Vec::new();
        // An unrelated extension first, as browsers shuffle them.
        exts.extend_from_slice(&[0, 10, 0, 4, 0, 2, 0, 29]);
        if let Some(name) = sni {
            let n = u16::try_from(name.len()).unwrap();
            exts.extend_from_slice(&0u16.to_be_bytes());
            exts.extend_from_slice(&(n + 5).to_be_bytes());
            exts.extend_from_slice(&(n + 3).to_be_bytes());
            exts.push(0);
            exts.extend_from_slice(&n.to_be_bytes());
            exts.extend_from_slice(name.as_bytes());
        }
        body.extend_from_slice(&u16::try_from(exts.len()).unwrap().to_be_bytes());
        body.extend_from_slice(&exts);
        let mut handshake = vec![1, 0];
        handshake.extend_from_slice(&u16::try_from(body.len()).unwrap().to_be_bytes());
        handshake.extend_from_slice(&body);
        let mut out = Vec::new();
        for chunk in handshake.chunks(record_size) {
            out.extend_from_slice(&[22, 3, 1]);
            out.extend_from_slice(&u16::try_from(chunk.len()).unwrap().to_be_bytes());
            out.extend_from_slice(chunk);
        }
        out
    }

    #[test]
    fn reads_the_server_name() {
        let hello = client_hello(Some("api.example.com"), 16384);
        assert_eq!(inspect(&hello), Inspection::ClientHello { sni: Some("api.example.com".into()) });
    }

    #[test]
    fn asks_for_more_until_the_hello_is_complete_even_across_records() {
        let hello = client_hello(Some("example.com"), 20);
        for cut in 0..hello.len() {
            assert_eq!(inspect(&hello[..cut]), Inspection::NeedMore, "cut at {cut}");
        }
        assert_eq!(inspect(&hello), Inspection::ClientHello { sni: Some("example.com".into()) });
    }

    #[test]
    fn a_hello_without_sni_says_so() {
        assert_eq!(inspect(&client_hello(None, 16384)), Inspection::ClientHello { sni: None });
    }

    #[test]
    fn plain_protocols_are_not_tls() {
        assert_eq!(inspect(b"SSH-2.0-OpenSSH_9.6\r\n"), Inspection::NotTls);
        assert_eq!(inspect(b"GET / HTTP/1.1\r\n"), Inspection::NotTls);
    }

    #[test]
    fn garbage_after_a_tls_header_is_malformed_not_a_panic() {
        assert_eq!(inspect(&[22, 3, 1, 0, 4, 2, 0, 0, 0]), Inspection::Malformed);
        assert_eq!(inspect(&[22, 3, 1, 0, 5, 1, 0, 0, 1, 9]), Inspection::Malformed);
        let mut huge = vec![22, 3, 1, 0xff, 0xff];
        huge.resize(MAX_CLIENT_HELLO, 0);
        // One record of 64 KiB cannot be complete within the cap.
        assert_ne!(inspect(&huge), Inspection::NeedMore);
    }
}
