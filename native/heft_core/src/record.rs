//! How one record sits in the arena: a small header, the key, the body.
//! The layout is specified in docs/term-format.md ("Records in the arena");
//! this is its only implementation.

use crate::codec::{put_varint, varint_len, DecodeError, Reader};
use crate::compress::{Codec, Packed};

/// The longest header: a flags byte and four 10-byte varints.
pub const MAX_HEADER: usize = 1 + 4 * 10;

/// A parsed record header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// How the body is stored.
    pub codec: Codec,
    /// For [`Codec::uses_dict`] codecs, the id of the table's dictionary it was
    /// compressed with; 0 otherwise.
    pub dict: u32,
    /// Bytes of the header itself.
    pub header_len: usize,
    /// Bytes of the key (always stored raw).
    pub key_len: usize,
    /// Bytes of the body as stored.
    pub stored_len: usize,
    /// Bytes of the body once decompressed (`stored_len` for raw bodies).
    pub raw_len: usize,
}

impl Header {
    /// Bytes of the whole record: header, key and stored body.
    pub fn total_len(&self) -> usize {
        self.header_len + self.key_len + self.stored_len
    }

    /// Where the key starts, from the record's first byte.
    pub fn key_start(&self) -> usize {
        self.header_len
    }

    /// Where the body starts, from the record's first byte.
    pub fn body_start(&self) -> usize {
        self.header_len + self.key_len
    }

    /// Reads a header from the start of `bytes` and checks that the record
    /// it describes fits in `bytes`.
    pub fn parse(bytes: &[u8]) -> Result<Header, DecodeError> {
        let h = Header::parse_prefix(bytes)?;
        if h.total_len() > bytes.len() {
            return Err(DecodeError::Truncated);
        }
        Ok(h)
    }

    /// Reads a header from the start of `bytes`, which may end before the
    /// record does.
    pub fn parse_prefix(bytes: &[u8]) -> Result<Header, DecodeError> {
        let mut r = Reader::new(bytes);
        let flags = r.u8()?;
        let codec = Codec::try_from(flags).map_err(|_| DecodeError::BadTag(flags))?;
        let key_len = as_len(r.varint()?)?;
        let stored_len = as_len(r.varint()?)?;
        let raw_len = match codec {
            Codec::Raw => stored_len,
            _ => as_len(r.varint()?)?,
        };
        let dict = match codec {
            Codec::ZstdDict | Codec::ZstdBlock => {
                let id = r.varint()?;
                u32::try_from(id)
                    .ok()
                    .filter(|&id| id > 0)
                    .ok_or(DecodeError::BadLength(id))?
            }
            _ => 0,
        };
        let h = Header {
            codec,
            dict,
            header_len: r.position(),
            key_len,
            stored_len,
            raw_len,
        };
        h.header_len
            .checked_add(key_len)
            .and_then(|n| n.checked_add(stored_len))
            .ok_or(DecodeError::Truncated)?;
        Ok(h)
    }
}

fn as_len(v: u64) -> Result<usize, DecodeError> {
    usize::try_from(v).map_err(|_| DecodeError::BadLength(v))
}

/// Writes a whole record (header, key, body) into `out`, replacing its
/// contents. `body` is the stored body (made as `packed` says); `raw_len`
/// its decompressed length.
pub fn write(out: &mut Vec<u8>, packed: Packed, key: &[u8], body: &[u8], raw_len: usize) {
    out.clear();
    out.reserve(MAX_HEADER + key.len() + body.len());
    out.push(packed.codec as u8);
    put_varint(out, key.len() as u64);
    put_varint(out, body.len() as u64);
    if packed.codec != Codec::Raw {
        put_varint(out, raw_len as u64);
    }
    if packed.codec.uses_dict() {
        put_varint(out, packed.dict as u64);
    }
    out.extend_from_slice(key);
    out.extend_from_slice(body);
}

/// The header length `write` produces for these sizes.
pub fn header_len(packed: Packed, key_len: usize, stored_len: usize, raw_len: usize) -> usize {
    let raw = if packed.codec == Codec::Raw {
        0
    } else {
        varint_len(raw_len as u64)
    };
    let dict = if packed.codec.uses_dict() {
        varint_len(packed.dict as u64)
    } else {
        0
    };
    1 + varint_len(key_len as u64) + varint_len(stored_len as u64) + raw + dict
}

#[cfg(test)]
mod tests {
    use super::*;

    const RAW: Packed = Packed {
        codec: Codec::Raw,
        dict: 0,
    };

    #[test]
    fn written_records_parse_back() {
        let mut buf = Vec::new();
        let deflate = Packed {
            codec: Codec::Deflate,
            dict: 0,
        };
        write(&mut buf, deflate, b"key", &[9; 300], 1000);
        let h = Header::parse(&buf).unwrap();
        assert_eq!(h.codec, Codec::Deflate);
        assert_eq!((h.key_len, h.stored_len, h.raw_len), (3, 300, 1000));
        assert_eq!(h.header_len, header_len(deflate, 3, 300, 1000));
        assert_eq!(h.total_len(), buf.len());
        assert_eq!(&buf[h.key_start()..h.body_start()], b"key");

        let dict = Packed {
            codec: Codec::ZstdDict,
            dict: 300,
        };
        write(&mut buf, dict, b"k", &[1; 20], 90);
        let h = Header::parse(&buf).unwrap();
        assert_eq!((h.codec, h.dict, h.raw_len), (Codec::ZstdDict, 300, 90));
        assert_eq!(h.header_len, header_len(dict, 1, 20, 90));
        assert_eq!(h.total_len(), buf.len());

        write(&mut buf, RAW, b"", b"body", 4);
        let h = Header::parse(&buf).unwrap();
        assert_eq!((h.key_len, h.stored_len, h.raw_len), (0, 4, 4));
        assert_eq!(h.total_len(), buf.len());
    }

    #[test]
    fn a_header_that_overruns_its_bytes_is_refused() {
        let mut buf = Vec::new();
        write(&mut buf, RAW, b"k", b"vvvv", 4);
        assert_eq!(
            Header::parse(&buf[..buf.len() - 1]),
            Err(DecodeError::Truncated)
        );
        assert_eq!(Header::parse(&[7, 0, 0]), Err(DecodeError::BadTag(7)));
        // A dictionary record naming dictionary 0 (none) is refused.
        assert_eq!(
            Header::parse(&[4, 0, 1, 1, 0, 9]),
            Err(DecodeError::BadLength(0))
        );
        assert!(Header::parse(&[]).is_err());
    }
}
