//! How one record sits in the arena: a small header, the key, the body.
//! The layout is specified in docs/term-format.md ("Records in the arena");
//! this is its only implementation.

use crate::codec::{put_varint, varint_len, DecodeError, Reader};
use crate::compress::{Codec, Packed};

/// The longest header: a flags byte and four 10-byte varints.
pub const MAX_HEADER: usize = 1 + 4 * 10;

/// A flags byte above this is a [`Codec::ZstdBlock`] record whose
/// dictionary id is the byte minus this (ids 1..=247): no id varint.
const BLOCK_ID_BASE: u8 = 0x08;

/// The flags byte of a record made as `packed`, and whether a dictionary
/// id varint follows the lengths.
fn flags(packed: Packed) -> (u8, bool) {
    match packed.codec {
        Codec::ZstdBlock if packed.dict > 0 && packed.dict <= (0xff - BLOCK_ID_BASE) as u32 => {
            (BLOCK_ID_BASE + packed.dict as u8, false)
        }
        c => (c as u8, c.uses_dict()),
    }
}

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
    #[inline(always)]
    pub fn parse_prefix(bytes: &[u8]) -> Result<Header, DecodeError> {
        let mut r = Reader::new(bytes);
        let flags = r.u8()?;
        let (codec, inline_id) = match flags.checked_sub(BLOCK_ID_BASE) {
            Some(id) if id > 0 => (Codec::ZstdBlock, id as u32),
            _ => (
                Codec::try_from(flags).map_err(|_| DecodeError::BadTag(flags))?,
                0,
            ),
        };
        let key_len = as_len(r.varint()?)?;
        let stored_len = as_len(r.varint()?)?;
        let raw_len = match codec {
            Codec::Raw => stored_len,
            _ => as_len(r.varint()?)?,
        };
        let dict = match codec {
            _ if inline_id > 0 => inline_id,
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
    let (flags, id_varint) = flags(packed);
    out.push(flags);
    put_varint(out, key.len() as u64);
    put_varint(out, body.len() as u64);
    if packed.codec != Codec::Raw {
        put_varint(out, raw_len as u64);
    }
    if id_varint {
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
    let dict = if flags(packed).1 {
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

        // Blocks of dictionaries 1..=247 carry the id in the flags byte.
        for (id, len) in [(1, 4), (247, 4), (248, 6), (300, 6), (1 << 20, 7)] {
            let block = Packed {
                codec: Codec::ZstdBlock,
                dict: id,
            };
            write(&mut buf, block, b"k", &[1; 20], 90);
            let h = Header::parse(&buf).unwrap();
            assert_eq!((h.codec, h.dict, h.raw_len), (Codec::ZstdBlock, id, 90));
            assert_eq!((h.header_len, header_len(block, 1, 20, 90)), (len, len));
            assert_eq!(h.total_len(), buf.len());
        }
        // The explicit form with id 0, or of a too large id: refused.
        assert!(Header::parse(&[5, 0, 1, 1, 0, 7]).is_err());
        assert!(Header::parse(&[5, 0, 1, 1, 0xff, 0xff, 0xff, 0xff, 0x7f, 7]).is_err());
        assert_eq!(Header::parse(&[5, 0, 1, 1, 3, 7]).unwrap().dict, 3);
        assert_eq!(Header::parse(&[6, 0, 1, 1, 7]), Err(DecodeError::BadTag(6)));

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
