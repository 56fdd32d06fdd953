//! Record body compression: raw deflate (RFC 1951, no zlib header). Bodies
//! up to [`SMALL_LEN`] bytes are deflated by our own fixed-Huffman encoder
//! (deflate.rs: no per-call table reset, which is what makes zlib slow on
//! short inputs); longer ones by flate2 (zlib-rs), one compressor per
//! thread. Streams of stored and fixed-Huffman blocks (all that deflate.rs
//! writes) are inflated by deflate.rs, which needs no setup; streams with
//! dynamic Huffman blocks by flate2, one decompressor per thread.
//!
//! A body is only stored compressed when that saves space: tiny bodies and
//! incompressible ones are stored as they are (see [`Codec`]).

use std::cell::RefCell;

use crate::deflate::InflateError;
use flate2::{Compress, Compression as Level, Decompress, FlushCompress, FlushDecompress, Status};

/// How a table compresses record bodies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    /// Bodies are stored as encoded.
    None,
    /// Raw deflate at the given level (0..=9).
    Zlib(u32),
}

/// How one stored body is encoded; recorded in the record header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Codec {
    /// The encoded term as it is.
    Raw = 0,
    /// Raw deflate of the encoded term.
    Deflate = 1,
}

impl TryFrom<u8> for Codec {
    type Error = u8;
    fn try_from(v: u8) -> Result<Self, u8> {
        match v {
            0 => Ok(Codec::Raw),
            1 => Ok(Codec::Deflate),
            other => Err(other),
        }
    }
}

/// Bodies shorter than this are never compressed: deflate's block overhead
/// and reset cost outweigh what it could save.
pub const MIN_COMPRESS_LEN: usize = 48;

thread_local! {
    static DEFLATE: RefCell<Option<(u32, Compress)>> = const { RefCell::new(None) };
    static INFLATE: RefCell<Option<Decompress>> = const { RefCell::new(None) };
}

/// Bodies up to this length go to the fixed-Huffman encoder.
pub const SMALL_LEN: usize = 4096;

/// Bodies longer than this are first tried on a prefix of this length;
/// if the prefix does not shrink, the body is stored raw without deflating
/// all of it (random bytes, already-compressed data).
const PROBE_LEN: usize = 16 * 1024;

/// Compresses `raw` into `out` (cleared first) if that saves at least one
/// byte in eight; returns the codec of what `out` then holds. With
/// `Codec::Raw`, `out` is left empty and the caller stores `raw` itself.
pub fn compress(raw: &[u8], mode: Compression, out: &mut Vec<u8>) -> Codec {
    out.clear();
    let level = match mode {
        Compression::Zlib(level) if raw.len() >= MIN_COMPRESS_LEN => level.min(9),
        _ => return Codec::Raw,
    };
    if raw.len() <= SMALL_LEN {
        let budget = raw.len() - raw.len() / 8;
        if crate::deflate::compress(raw, out, budget) {
            return Codec::Deflate;
        }
        out.clear();
        return Codec::Raw;
    }
    if raw.len() > 2 * PROBE_LEN {
        let probe = &raw[..PROBE_LEN];
        if !deflate(probe, level, out) || !worth_it(probe.len(), out.len()) {
            out.clear();
            return Codec::Raw;
        }
        out.clear();
    }
    if deflate(raw, level, out) && worth_it(raw.len(), out.len()) {
        Codec::Deflate
    } else {
        out.clear();
        Codec::Raw
    }
}

/// Kept only if at most 7/8 of the input.
fn worth_it(raw: usize, packed: usize) -> bool {
    packed <= raw - raw / 8
}

/// Deflates all of `raw` into `out`; false if the stream did not end.
fn deflate(raw: &[u8], level: u32, out: &mut Vec<u8>) -> bool {
    // Room for deflate's worst case (stored blocks: 5 bytes per 16 KiB, plus
    // a little), so the stream always runs to its end. Stopping a stream
    // early and resetting it trips a bug in zlib-rs 0.6 (a panic in the
    // next stream; see the test below).
    out.reserve(raw.len() + raw.len() / 1000 + 64);
    DEFLATE.with(|cell| {
        let mut slot = cell.borrow_mut();
        let c = match slot.as_mut() {
            Some((l, c)) if *l == level => {
                c.reset();
                c
            }
            _ => {
                &mut slot
                    .insert((level, Compress::new(Level::new(level), false)))
                    .1
            }
        };
        let ended = matches!(
            c.compress_vec(raw, out, FlushCompress::Finish),
            Ok(Status::StreamEnd)
        );
        if !ended {
            // Never reuse a compressor whose stream did not end.
            *slot = None;
        }
        ended
    })
}

/// Why a stored body could not be inflated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorruptBody;

/// Inflates `stored` (written by [`compress`]) into `out`, which must end up
/// exactly `raw_len` bytes long.
pub fn decompress(stored: &[u8], raw_len: usize, out: &mut Vec<u8>) -> Result<(), CorruptBody> {
    match crate::deflate::inflate(stored, raw_len, out) {
        Ok(()) => return Ok(()),
        Err(InflateError::Corrupt) => return Err(CorruptBody),
        Err(InflateError::Dynamic) => {}
    }
    out.clear();
    out.reserve_exact(raw_len);
    INFLATE.with(|cell| {
        let mut slot = cell.borrow_mut();
        let d = match slot.as_mut() {
            Some(d) => {
                d.reset(false);
                d
            }
            None => slot.insert(Decompress::new(false)),
        };
        // `out` has room for at least `raw_len` bytes; a stream that ends
        // short of it, runs past it or leaves input unread is corrupt.
        match d.decompress_vec(stored, out, FlushDecompress::Finish) {
            Ok(Status::StreamEnd)
                if out.len() == raw_len && d.total_in() == stored.len() as u64 =>
            {
                Ok(())
            }
            _ => Err(CorruptBody),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compressible_bodies_shrink_and_come_back() {
        let raw: Vec<u8> = b"abcdefgh".iter().cycle().take(4000).copied().collect();
        let mut out = Vec::new();
        assert_eq!(
            compress(&raw, Compression::Zlib(6), &mut out),
            Codec::Deflate
        );
        assert!(out.len() < 100, "4000 repetitive bytes took {}", out.len());
        let mut back = Vec::new();
        decompress(&out, raw.len(), &mut back).unwrap();
        assert_eq!(back, raw);
    }

    #[test]
    fn incompressible_and_tiny_bodies_are_stored_raw() {
        // xorshift noise does not compress.
        let noise = crate::testutil::noise(0x1234_5678, 1024);
        let mut out = Vec::new();
        assert_eq!(compress(&noise, Compression::Zlib(9), &mut out), Codec::Raw);
        assert!(out.is_empty());
        assert_eq!(
            compress(b"short", Compression::Zlib(9), &mut out),
            Codec::Raw
        );
        assert_eq!(
            compress(&[0; 4096], Compression::None, &mut out),
            Codec::Raw
        );
    }

    #[test]
    fn every_level_roundtrips_and_levels_can_alternate_on_one_thread() {
        let raw: Vec<u8> = (0..3000u32).map(|i| (i % 17) as u8).collect();
        for level in [0, 1, 5, 9, 1, 0] {
            let mut out = Vec::new();
            let codec = compress(&raw, Compression::Zlib(level), &mut out);
            if codec == Codec::Deflate {
                let mut back = Vec::new();
                decompress(&out, raw.len(), &mut back).unwrap();
                assert_eq!(back, raw, "level {level}");
            } else {
                assert_eq!(level, 0, "only level 0 (stored blocks) may not pay off");
            }
        }
    }

    #[test]
    fn an_incompressible_body_does_not_break_the_next_one() {
        // zlib-rs 0.6.8 panicked ("buf.len() must fit in remaining()") when
        // a stream stopped for lack of output room was reset and reused.
        // The encoding of {a, [1..200_000]}: 790 KB that deflate at level 1
        // cannot bring under 7/8, which made the old code stop the stream.
        let ints = (1..=200_000).map(crate::codec::Value::Int).collect();
        let list = crate::codec::Value::List(ints, Box::new(crate::codec::Value::Nil));
        let noisy = crate::codec::Value::Tuple(vec![crate::codec::Value::Atom(0), list]).to_bytes();
        let repetitive = vec![42u8; 1 << 20];
        for body in [&noisy, &noisy, &repetitive, &noisy, &repetitive] {
            let mut out = Vec::new();
            if compress(body, Compression::Zlib(1), &mut out) == Codec::Deflate {
                let mut back = Vec::new();
                decompress(&out, body.len(), &mut back).unwrap();
                assert_eq!(&back, body);
            }
        }
    }

    #[test]
    fn a_large_random_body_is_judged_by_its_prefix() {
        let mut body = crate::testutil::noise(7, 100_000);
        let mut out = Vec::new();
        assert_eq!(compress(&body, Compression::Zlib(6), &mut out), Codec::Raw);
        // Compressible after the prefix only: still stored raw (the probe
        // decides), which costs space but never correctness.
        body[PROBE_LEN..].fill(0);
        assert_eq!(compress(&body, Compression::Zlib(6), &mut out), Codec::Raw);
        body.fill(0);
        assert_eq!(
            compress(&body, Compression::Zlib(6), &mut out),
            Codec::Deflate
        );
    }

    #[test]
    fn corrupt_or_mislabelled_bodies_are_refused() {
        let raw = vec![7u8; 1000];
        let mut out = Vec::new();
        assert_eq!(
            compress(&raw, Compression::Zlib(6), &mut out),
            Codec::Deflate
        );
        let mut back = Vec::new();
        assert_eq!(decompress(&out, 999, &mut back), Err(CorruptBody));
        assert_eq!(decompress(&out, 1001, &mut back), Err(CorruptBody));
        assert_eq!(
            decompress(&out[..out.len() / 2], 1000, &mut back),
            Err(CorruptBody)
        );
        assert_eq!(
            decompress(&[0xff, 0xff, 0xff], 10, &mut back),
            Err(CorruptBody)
        );
        decompress(&out, 1000, &mut back).unwrap();
        assert_eq!(back, raw);
    }
}
