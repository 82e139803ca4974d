//! The Confluent wire format: a magic byte 0, the writer schema's registry id as 4 bytes
//! big-endian, then the Avro datum (no container file header). Every Confluent-compatible
//! serializer (Java's KafkaAvroSerializer, Python's AvroSerializer, Redpanda's) writes it.

/// The byte every framed value starts with.
pub const MAGIC: u8 = 0;

/// Why a value is not in the wire format.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("the record has no value")]
    Empty,
    #[error("first byte is {0:#04x}, not the wire format's magic byte 0 (is the value Avro from a schema registry?)")]
    BadMagic(u8),
    #[error("{0} bytes is shorter than the wire format's 5-byte header")]
    Short(usize),
}

/// The schema id and the datum of a framed value.
pub fn unframe(value: &[u8]) -> Result<(u32, &[u8]), FrameError> {
    match value {
        [] => Err(FrameError::Empty),
        [m, ..] if *m != MAGIC => Err(FrameError::BadMagic(*m)),
        [_, a, b, c, d, datum @ ..] => Ok((u32::from_be_bytes([*a, *b, *c, *d]), datum)),
        short => Err(FrameError::Short(short.len())),
    }
}

/// `datum` framed with the schema id `id`.
pub fn frame(id: u32, datum: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + datum.len());
    out.push(MAGIC);
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(datum);
    out
}

/// Append `n` in Avro's binary encoding of a `long` (and of a string's or bytes' length):
/// a zig-zag varint.
pub fn write_long(out: &mut Vec<u8>, n: i64) {
    let mut z = ((n << 1) ^ (n >> 63)) as u64;
    while z >= 0x80 {
        out.push((z as u8) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_framed_value_gives_back_its_id_and_datum() {
        let framed = frame(0x0102_0304, b"\x06abc");
        assert_eq!(framed, b"\x00\x01\x02\x03\x04\x06abc");
        assert_eq!(unframe(&framed), Ok((0x0102_0304, &b"\x06abc"[..])));
        // An empty datum (a record with no fields) is still a frame.
        assert_eq!(unframe(&frame(7, b"")), Ok((7, &b""[..])));
    }

    #[test]
    fn longs_are_zig_zag_varints() {
        let encoded = |n: i64| {
            let mut out = Vec::new();
            write_long(&mut out, n);
            out
        };
        assert_eq!(encoded(0), [0x00]);
        assert_eq!(encoded(-1), [0x01]);
        assert_eq!(encoded(1), [0x02]);
        assert_eq!(encoded(64), [0x80, 0x01]);
        assert_eq!(
            encoded(i64::MIN),
            [0xff; 9].iter().copied().chain([0x01]).collect::<Vec<_>>()
        );
    }

    #[test]
    fn values_not_in_the_wire_format_say_why() {
        assert_eq!(unframe(b""), Err(FrameError::Empty));
        assert_eq!(unframe(b"{\"a\":1}"), Err(FrameError::BadMagic(b'{')));
        assert_eq!(unframe(b"\x00\x00\x01"), Err(FrameError::Short(3)));
        assert!(FrameError::BadMagic(0x7b).to_string().contains("0x7b"));
    }
}
