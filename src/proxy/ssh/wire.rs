//! SSH's wire encoding (RFC 4251 §5), as far as the relays read it: bytes,
//! big-endian u32s and length-prefixed strings.

/// Reads fields off the front of a message; `None` once one does not fit.
pub struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader(bytes)
    }

    pub fn byte(&mut self) -> Option<u8> {
        let (&first, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(first)
    }

    pub fn u32(&mut self) -> Option<u32> {
        let (head, rest) = self.0.split_first_chunk::<4>()?;
        self.0 = rest;
        Some(u32::from_be_bytes(*head))
    }

    pub fn string(&mut self) -> Option<&'a [u8]> {
        let len = usize::try_from(self.u32()?).ok()?;
        if len > self.0.len() {
            return None;
        }
        let (string, rest) = self.0.split_at(len);
        self.0 = rest;
        Some(string)
    }

    pub fn boolean(&mut self) -> Option<bool> {
        self.byte().map(|b| b != 0)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Appends `bytes` as an SSH string.
#[cfg(test)]
pub fn put_string(out: &mut Vec<u8>, bytes: &[u8]) {
    let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_read_in_order_and_short_input_is_none() {
        let mut msg = vec![13];
        put_string(&mut msg, b"key");
        msg.extend_from_slice(&7u32.to_be_bytes());
        let mut r = Reader::new(&msg);
        assert_eq!(r.byte(), Some(13));
        assert_eq!(r.string(), Some(&b"key"[..]));
        assert_eq!(r.u32(), Some(7));
        assert!(r.is_empty());
        assert_eq!(r.byte(), None);
        assert_eq!(Reader::new(&[0, 0, 0, 9, b'x']).string(), None, "a length past the end");
    }
}
