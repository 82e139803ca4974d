//! The field encoding every state record shares: length-prefixed byte strings written
//! ([`put_bytes`]) and fields read front to back ([`Reader`]), so that whatever goes wrong
//! names its field and byte offset.

use super::DecodeError;

/// A length-prefixed byte string: u32 little-endian length, then the bytes.
pub(super) fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    let len = u32::try_from(bytes.len()).expect("a state record field of 4 GiB or more");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(bytes);
}

/// Reads fields front to back, naming the field and byte offset of whatever goes wrong.
pub(super) struct Reader<'a> {
    pub(super) buf: &'a [u8],
    pub(super) pos: usize,
}

impl<'a> Reader<'a> {
    pub(super) fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], DecodeError> {
        let available = self.buf.len() - self.pos;
        if n > available {
            return Err(DecodeError::Truncated {
                at: self.pos,
                field,
                needed: n,
                available,
            });
        }
        let bytes = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(bytes)
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], DecodeError> {
        let bytes = self.take(N, field)?;
        let mut a = [0; N];
        a.copy_from_slice(bytes);
        Ok(a)
    }

    pub(super) fn u8(&mut self, field: &'static str) -> Result<u8, DecodeError> {
        Ok(self.array::<1>(field)?[0])
    }

    pub(super) fn u32(&mut self, field: &'static str) -> Result<u32, DecodeError> {
        self.array(field).map(u32::from_le_bytes)
    }

    pub(super) fn u64(&mut self, field: &'static str) -> Result<u64, DecodeError> {
        self.array(field).map(u64::from_le_bytes)
    }

    pub(super) fn i64(&mut self, field: &'static str) -> Result<i64, DecodeError> {
        self.array(field).map(i64::from_le_bytes)
    }

    /// A presence byte: 0 or 1, nothing else.
    pub(super) fn flag(&mut self, field: &'static str) -> Result<bool, DecodeError> {
        let at = self.pos;
        match self.u8(field)? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(DecodeError::Invalid {
                at,
                field,
                detail: format!("{other} is neither 0 nor 1"),
            }),
        }
    }

    pub(super) fn bytes(&mut self, field: &'static str) -> Result<&'a [u8], DecodeError> {
        let len = self.u32(field)? as usize;
        self.take(len, field)
    }

    pub(super) fn string(&mut self, field: &'static str) -> Result<String, DecodeError> {
        let at = self.pos + 4;
        let bytes = self.bytes(field)?;
        String::from_utf8(bytes.to_vec()).map_err(|e| DecodeError::Invalid {
            at,
            field,
            detail: format!("not UTF-8 ({e})"),
        })
    }

    pub(super) fn finish(self) -> Result<(), DecodeError> {
        match self.buf.len() - self.pos {
            0 => Ok(()),
            count => Err(DecodeError::Trailing {
                at: self.pos,
                count,
            }),
        }
    }
}
