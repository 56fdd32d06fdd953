//! Record body compression. Four codecs (docs/term-format.md, "Records in
//! the arena"): raw deflate, zstd (frames without magic number, checksum,
//! content size or dictionary id: the record header carries the sizes and
//! the dictionary's id), zstd with one of the table's dictionaries
//! (dict.rs; bare blocks, zblock.rs), and lz4 blocks. One compression and
//! one decompression context of each kind per thread.
//!
//! Deflate (RFC 1951, no zlib header): bodies
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

use crate::deflate::{looks_incompressible, InflateError};
use crate::dict::Dictionaries;
use crate::record::Header;
use crate::zblock;
use flate2::{Compress, Compression as Level, Decompress, FlushCompress, FlushDecompress, Status};
use zstd::zstd_safe::{CCtx, CParameter, DCtx, DParameter, FrameFormat};

/// How a table compresses record bodies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    /// Bodies are stored as encoded.
    None,
    /// Raw deflate at the given level (0..=9).
    Zlib(u32),
    /// zstd at `level` (1..=22); with `dict`, bodies are compressed with
    /// the table's current dictionary once it has one.
    Zstd { level: i32, dict: bool },
    /// lz4 blocks.
    Lz4,
}

/// How one stored body is encoded; recorded in the record header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Codec {
    /// The encoded term as it is.
    Raw = 0,
    /// Raw deflate of the encoded term.
    Deflate = 1,
    /// A zstd frame (no magic number, checksum, size or dictionary id).
    Zstd = 2,
    /// An lz4 block.
    Lz4 = 3,
    /// A zstd frame made with the table's dictionary the header names
    /// (still read; no longer written: see `ZstdBlock`).
    ZstdDict = 4,
    /// One bare zstd block (no frame or block header) begun from the
    /// table's dictionary the header names: bodies up to
    /// [`zblock::BLOCK_MAX`] bytes with a dictionary.
    ZstdBlock = 5,
}

impl Codec {
    /// True for the codecs whose header names a dictionary.
    pub fn uses_dict(self) -> bool {
        matches!(self, Codec::ZstdDict | Codec::ZstdBlock)
    }
}

impl TryFrom<u8> for Codec {
    type Error = u8;
    fn try_from(v: u8) -> Result<Self, u8> {
        match v {
            0 => Ok(Codec::Raw),
            1 => Ok(Codec::Deflate),
            2 => Ok(Codec::Zstd),
            3 => Ok(Codec::Lz4),
            4 => Ok(Codec::ZstdDict),
            5 => Ok(Codec::ZstdBlock),
            other => Err(other),
        }
    }
}

/// What [`compress`] made: the codec, and for the codecs that use one
/// ([`Codec::uses_dict`]) the dictionary's id (0 otherwise).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packed {
    pub codec: Codec,
    pub dict: u32,
}

impl Packed {
    pub const RAW: Packed = Packed {
        codec: Codec::Raw,
        dict: 0,
    };
    fn plain(codec: Codec) -> Packed {
        Packed { codec, dict: 0 }
    }
}

/// Bodies shorter than this are never compressed: deflate's block overhead
/// and reset cost outweigh what it could save.
pub const MIN_COMPRESS_LEN: usize = 48;

/// The same for zstd and lz4 without a dictionary: their frames and
/// blocks cost a few bytes less than deflate's.
pub const MIN_FAST_LEN: usize = 32;

/// The same with a dictionary, which can find matches in a body too short
/// to repeat itself.
pub const MIN_DICT_LEN: usize = 8;

thread_local! {
    static DEFLATE: RefCell<Option<(u32, Compress)>> = const { RefCell::new(None) };
    static INFLATE: RefCell<Option<Decompress>> = const { RefCell::new(None) };
    static ZSTD_C: RefCell<Option<CCtx<'static>>> = const { RefCell::new(None) };
    static ZSTD_D: RefCell<Option<DCtx<'static>>> = const { RefCell::new(None) };
}

/// zstd's level when none is given (zstd's own default).
pub const ZSTD_DEFAULT_LEVEL: i32 = 3;

/// Bodies up to this length go to the fixed-Huffman encoder.
pub const SMALL_LEN: usize = 4096;

/// Bodies longer than this are first tried on a prefix of this length;
/// if the prefix does not shrink, the body is stored raw without deflating
/// all of it (random bytes, already-compressed data).
const PROBE_LEN: usize = 16 * 1024;

/// Compresses `raw` into `out` (cleared first) if that pays (see each
/// codec); returns what `out` then holds. With `Codec::Raw`, `out` is left
/// empty and the caller stores `raw` itself. `dicts` are the table's
/// dictionaries (used by `Compression::Zstd { dict: true, .. }`).
pub fn compress(raw: &[u8], mode: Compression, dicts: &Dictionaries, out: &mut Vec<u8>) -> Packed {
    out.clear();
    let packed = match mode {
        Compression::None => Packed::RAW,
        Compression::Zlib(level) => Packed::plain(deflate_body(raw, level, out)),
        Compression::Lz4 if raw.len() >= MIN_FAST_LEN => lz4(raw, out),
        Compression::Lz4 => Packed::RAW,
        Compression::Zstd { level, dict } => {
            let current = if dict { dicts.current() } else { None };
            match current {
                Some(d) if (MIN_DICT_LEN..=zblock::BLOCK_MAX).contains(&raw.len()) => {
                    dict_block(raw, &d, out)
                }
                _ if raw.len() >= MIN_FAST_LEN => zstd(raw, level, out),
                _ => Packed::RAW,
            }
        }
    };
    if packed.codec == Codec::Raw {
        out.clear();
    }
    packed
}

/// Raw deflate, kept if at most 7/8 of the input.
fn deflate_body(raw: &[u8], level: u32, out: &mut Vec<u8>) -> Codec {
    if raw.len() < MIN_COMPRESS_LEN {
        return Codec::Raw;
    }
    let level = level.min(9);
    if raw.len() <= SMALL_LEN {
        let budget = raw.len() - raw.len() / 8;
        if crate::deflate::compress(raw, out, budget) {
            return Codec::Deflate;
        }
        return Codec::Raw;
    }
    let deflated = |body: &[u8], out: &mut Vec<u8>| deflate(body, level, out).then_some(out.len());
    if looks_incompressible(raw) || !prefix_shrinks(raw, out, deflated, worth_it) {
        return Codec::Raw;
    }
    if deflate(raw, level, out) && worth_it(raw.len(), out.len()) {
        Codec::Deflate
    } else {
        Codec::Raw
    }
}

/// zstd and lz4 bodies are kept if they save more than the header bytes
/// they add (the raw length; the dictionary id) and at least 1/16 of the
/// input, so that incompressible data is stored raw.
fn pays(raw: usize, packed: usize, extra_header: usize) -> bool {
    packed + extra_header + raw / 16 < raw
}

/// For a body longer than two probes: whether its first [`PROBE_LEN`]
/// bytes, packed into `out` by `pack` (their packed length, `None` on
/// failure), shrink as `kept` asks; if not, the body is stored raw without
/// packing all of it. True for shorter bodies. `out` is left empty.
fn prefix_shrinks(
    raw: &[u8],
    out: &mut Vec<u8>,
    pack: impl FnOnce(&[u8], &mut Vec<u8>) -> Option<usize>,
    kept: impl FnOnce(usize, usize) -> bool,
) -> bool {
    if raw.len() <= 2 * PROBE_LEN {
        return true;
    }
    let shrinks = pack(&raw[..PROBE_LEN], out).is_some_and(|n| kept(PROBE_LEN, n));
    out.clear();
    shrinks
}

/// The [`pays`] rule for a probe (no header bytes).
fn probe_pays(raw: usize, packed: usize) -> bool {
    pays(raw, packed, 0)
}

/// An lz4 block of `raw` into `out`; its length.
fn lz4_block(raw: &[u8], out: &mut Vec<u8>) -> Option<usize> {
    out.resize(lz4_flex::block::get_maximum_output_size(raw.len()), 0);
    let n = lz4_flex::block::compress_into(raw, out).ok()?;
    out.truncate(n);
    Some(n)
}

/// An lz4 block of `raw`, if it pays.
fn lz4(raw: &[u8], out: &mut Vec<u8>) -> Packed {
    if looks_incompressible(raw) || !prefix_shrinks(raw, out, lz4_block, probe_pays) {
        return Packed::RAW;
    }
    match lz4_block(raw, out) {
        Some(n) if pays(raw.len(), n, crate::codec::varint_len(raw.len() as u64)) => {
            Packed::plain(Codec::Lz4)
        }
        _ => Packed::RAW,
    }
}

/// A dictionary block of `raw` (at most a block long), kept if it saves
/// at least a byte once the header bytes it adds (the raw length, the
/// dictionary's id) are counted. zstd itself refuses blocks that save
/// less than about 1/64 of the input (noise comes back raw), and a table
/// with a dictionary asked for the fewest bytes.
fn dict_block(raw: &[u8], d: &crate::dict::Dict, out: &mut Vec<u8>) -> Packed {
    let p = Packed {
        codec: Codec::ZstdBlock,
        dict: d.id(),
    };
    let header = |p, n| crate::record::header_len(p, 0, n, raw.len());
    // Noise can only match noise the dictionary holds.
    if !d.holds_noise() && looks_incompressible(raw) {
        return Packed::RAW;
    }
    match zblock::compress(raw, d.cdict(), out) {
        Some(n) if n + header(p, n) < raw.len() + header(Packed::RAW, raw.len()) => p,
        _ => Packed::RAW,
    }
}

/// A zstd frame of `raw` (no dictionary), if it pays.
fn zstd(raw: &[u8], level: i32, out: &mut Vec<u8>) -> Packed {
    let framed = |body: &[u8], out: &mut Vec<u8>| zstd_frame(body, level, out);
    if looks_incompressible(raw) || !prefix_shrinks(raw, out, framed, probe_pays) {
        return Packed::RAW;
    }
    let extra = crate::codec::varint_len(raw.len() as u64);
    match zstd_frame(raw, level, out) {
        Some(n) if pays(raw.len(), n, extra) => Packed::plain(Codec::Zstd),
        _ => Packed::RAW,
    }
}

/// Compresses `raw` into `out` as one frame; its length, or `None` if zstd
/// failed (it does not for a buffer of its bound).
fn zstd_frame(raw: &[u8], level: i32, out: &mut Vec<u8>) -> Option<usize> {
    out.clear();
    out.reserve(zstd::zstd_safe::compress_bound(raw.len()));
    ZSTD_C.with(|cell| {
        let mut slot = cell.borrow_mut();
        let c = slot.get_or_insert_with(new_cctx);
        let made = c
            .set_parameter(CParameter::CompressionLevel(level))
            .and_then(|_| c.compress2(out, raw));
        match made {
            Ok(n) => Some(n),
            Err(_) => {
                // Never reuse a context after an error.
                *slot = None;
                None
            }
        }
    })
}

fn new_cctx() -> CCtx<'static> {
    let mut c = CCtx::create();
    for p in [
        CParameter::Format(FrameFormat::Magicless),
        CParameter::ChecksumFlag(false),
        CParameter::ContentSizeFlag(false),
        CParameter::DictIdFlag(false),
    ] {
        c.set_parameter(p).expect("a valid zstd parameter");
    }
    c
}

fn new_dctx() -> DCtx<'static> {
    let mut d = DCtx::create();
    d.set_parameter(DParameter::Format(FrameFormat::Magicless))
        .expect("a valid zstd parameter");
    d
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

/// The body of a record whose header is `h` and stored body `stored`:
/// `stored` itself if raw, else decompressed into `out` (with the table's
/// `dicts`). A body that does not decompress to exactly `h.raw_len` bytes,
/// or names a dictionary the table lacks, is corrupt.
pub fn unpack<'a>(
    h: &Header,
    stored: &'a [u8],
    dicts: &Dictionaries,
    out: &'a mut Vec<u8>,
) -> Result<&'a [u8], CorruptBody> {
    match h.codec {
        Codec::Raw => return Ok(stored),
        Codec::Deflate => decompress(stored, h.raw_len, out)?,
        // A header's raw length is checked against what the stored bytes
        // could possibly expand to before anything is allocated for it: a
        // damaged length must not make a read allocate terabytes.
        Codec::Lz4 if h.raw_len > max_expansion(stored.len(), LZ4_MAX_RATIO) => {
            return Err(CorruptBody)
        }
        Codec::Zstd | Codec::ZstdDict
            if h.raw_len > max_expansion(stored.len(), ZSTD_MAX_RATIO) =>
        {
            return Err(CorruptBody)
        }
        Codec::Lz4 => {
            out.clear();
            out.resize(h.raw_len, 0);
            match lz4_flex::block::decompress_into(stored, out) {
                Ok(n) if n == h.raw_len => {}
                _ => return Err(CorruptBody),
            }
        }
        Codec::ZstdDict | Codec::ZstdBlock => {
            let dict = dicts.get(h.dict).ok_or(CorruptBody)?;
            let form = match h.codec {
                Codec::ZstdBlock => zblock::Form::Block,
                _ => zblock::Form::Frame,
            };
            if !zblock::decompress(stored, dict.ddict(), form, h.raw_len, out) {
                return Err(CorruptBody);
            }
        }
        Codec::Zstd => {
            out.clear();
            out.reserve_exact(h.raw_len);
            ZSTD_D.with(|cell| {
                let mut slot = cell.borrow_mut();
                let d = slot.get_or_insert_with(new_dctx);
                // `out` has room for `raw_len` bytes: a frame that needs
                // more fails, one that ends short is caught below.
                let r = d.decompress(out, stored);
                match r {
                    Ok(n) if n == h.raw_len => Ok(()),
                    Ok(_) => Err(CorruptBody),
                    Err(_) => {
                        *slot = None;
                        Err(CorruptBody)
                    }
                }
            })?;
        }
    }
    Ok(out)
}

/// The most an lz4 block expands: a match of 255 bytes per length byte.
const LZ4_MAX_RATIO: usize = 255;

/// The most a zstd frame expands: an RLE block of 4 bytes (a 3-byte block
/// header and the byte) makes a block of at most 128 KiB.
const ZSTD_MAX_RATIO: usize = 128 * 1024 / 4;

/// The most `stored` bytes can decompress to at `ratio`, with room for a
/// frame's or block's fixed overhead.
fn max_expansion(stored: usize, ratio: usize) -> usize {
    stored.saturating_add(16).saturating_mul(ratio)
}

/// Inflates `stored` (raw deflate, written by [`compress`]) into `out`,
/// which must end up exactly `raw_len` bytes long.
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

    /// [`compress`] without dictionaries, its codec.
    fn z(raw: &[u8], mode: Compression, out: &mut Vec<u8>) -> Codec {
        compress(raw, mode, &Dictionaries::new(3), out).codec
    }

    fn header(p: Packed, stored: usize, raw: usize) -> Header {
        Header {
            codec: p.codec,
            dict: p.dict,
            header_len: 0,
            key_len: 0,
            stored_len: stored,
            raw_len: raw,
        }
    }

    /// Compresses with `mode` and unpacks again: the body comes back.
    fn roundtrip(raw: &[u8], mode: Compression, dicts: &Dictionaries) -> Packed {
        let mut out = Vec::new();
        let p = compress(raw, mode, dicts, &mut out);
        let stored = if p.codec == Codec::Raw {
            raw.to_vec()
        } else {
            out.clone()
        };
        let mut back = Vec::new();
        let h = header(p, stored.len(), raw.len());
        assert_eq!(
            unpack(&h, &stored, dicts, &mut back).unwrap(),
            raw,
            "{mode:?}"
        );
        p
    }

    const FAST: [Compression; 3] = [
        Compression::Lz4,
        Compression::Zstd {
            level: 3,
            dict: false,
        },
        Compression::Zstd {
            level: 19,
            dict: true,
        },
    ];

    #[test]
    fn zstd_and_lz4_shrink_what_repeats_and_store_noise_raw() {
        let dicts = Dictionaries::new(3);
        let text: Vec<u8> = b"name=user-42;age=17;"
            .iter()
            .cycle()
            .take(3000)
            .copied()
            .collect();
        let noise = crate::testutil::noise(99, 1024);
        let big_noise = crate::testutil::noise(98, 100_000);
        for mode in FAST {
            let p = roundtrip(&text, mode, &dicts);
            assert_ne!(p.codec, Codec::Raw, "{mode:?}");
            assert_eq!(roundtrip(&noise, mode, &dicts), Packed::RAW, "{mode:?}");
            assert_eq!(roundtrip(&big_noise, mode, &dicts), Packed::RAW, "{mode:?}");
            assert_eq!(roundtrip(b"tiny", mode, &dicts), Packed::RAW, "{mode:?}");
            roundtrip(&[], mode, &dicts);
        }
    }

    #[test]
    fn noise_is_judged_by_samples_and_a_dictionary_holding_noise_still_tries() {
        let noise = crate::testutil::noise(97, 1024);
        assert!(crate::deflate::looks_incompressible(&noise));
        // Shorter than the probe: tried, and stored raw when it does not pay.
        assert!(!crate::deflate::looks_incompressible(&noise[..511]));
        // Noise at both ends with zeros between (the middle sample): tried,
        // and compressed by every codec.
        let mut ends = crate::testutil::noise(96, 3000);
        ends[300..2700].fill(0);
        assert!(!crate::deflate::looks_incompressible(&ends));
        let none = Dictionaries::new(3);
        for mode in [Compression::Zlib(1)].into_iter().chain(FAST) {
            assert_ne!(roundtrip(&ends, mode, &none).codec, Codec::Raw, "{mode:?}");
        }
        // Past 4 KiB the samples are denser: noise with zeros in one
        // eighth of it is tried.
        let mut long = crate::testutil::noise(95, 64 * 1024);
        long[20_000..28_000].fill(0);
        assert!(!crate::deflate::looks_incompressible(&long));
        assert!(crate::deflate::looks_incompressible(
            &crate::testutil::noise(94, 64 * 1024)
        ));
        // A dictionary of text: the noise is stored raw untried. One whose
        // content is that noise: tried, and the noise shrinks to almost
        // nothing against it.
        let dict = |content: &[u8]| {
            let d = Dictionaries::new(3);
            let id = d.add(content).unwrap().id();
            d.set_current(id);
            d
        };
        let mode = Compression::Zstd {
            level: 3,
            dict: true,
        };
        let text = dict(&b"name=user-42;age=17;".repeat(50));
        assert!(!text.current().unwrap().holds_noise());
        assert_eq!(roundtrip(&noise, mode, &text), Packed::RAW);
        let noisy = dict(&noise);
        assert!(noisy.current().unwrap().holds_noise());
        let p = roundtrip(&noise, mode, &noisy);
        assert_eq!(p.codec, Codec::ZstdBlock);
        let mut out = Vec::new();
        compress(&noise, mode, &noisy, &mut out);
        assert!(out.len() < 32, "{} bytes", out.len());
    }

    #[test]
    fn zstd_frames_carry_no_magic_checksum_or_size() {
        let mut out = Vec::new();
        let raw = vec![b'a'; 1000];
        let p = compress(
            &raw,
            Compression::Zstd {
                level: 3,
                dict: false,
            },
            &Dictionaries::new(3),
            &mut out,
        );
        assert_eq!(p.codec, Codec::Zstd);
        assert_ne!(&out[..4], &[0x28, 0xb5, 0x2f, 0xfd]);
        // A frame header byte, a window byte, a block header and a few
        // bytes of sequences: no 4-byte magic, no 8-byte size, no checksum.
        assert!(out.len() <= 16, "{} bytes", out.len());
    }

    #[test]
    fn a_dictionary_shrinks_small_records_and_old_ones_stay_readable() {
        let dicts = Dictionaries::new(3);
        let rec = |i: u32| {
            format!("{{\"id\":{i},\"name\":\"user-{i}\",\"plan\":\"free\",\"active\":true}}")
                .into_bytes()
        };
        let samples: Vec<Vec<u8>> = (0..3000).map(rec).collect();
        let mode = Compression::Zstd {
            level: 3,
            dict: true,
        };
        // No dictionary yet: plain zstd or raw.
        assert!(!roundtrip(&rec(5000), mode, &dicts).codec.uses_dict());
        let d1 = dicts
            .add(&crate::dict::train(&samples, 4096, 3).unwrap())
            .unwrap();
        dicts.set_current(d1.id());
        let mut out = Vec::new();
        let p1 = compress(&rec(5001), mode, &dicts, &mut out);
        assert_eq!(
            p1,
            Packed {
                codec: Codec::ZstdBlock,
                dict: 1
            }
        );
        assert!(
            out.len() * 2 < rec(5001).len(),
            "{} of {}",
            out.len(),
            rec(5001).len()
        );
        let old = out.clone();
        let d2 = dicts
            .add(&crate::dict::train(&samples[1000..], 2048, 3).unwrap())
            .unwrap();
        dicts.set_current(d2.id());
        assert_eq!(roundtrip(&rec(5002), mode, &dicts).dict, 2);
        let mut back = Vec::new();
        let h = header(p1, old.len(), rec(5001).len());
        assert_eq!(unpack(&h, &old, &dicts, &mut back).unwrap(), rec(5001));
        // The wrong dictionary, a missing one, a wrong length: corrupt.
        let mut wrong = h;
        wrong.dict = 2;
        let wrong_ok = unpack(&wrong, &old, &dicts, &mut back).map(|b| b == rec(5001));
        assert_ne!(wrong_ok, Ok(true));
        wrong.dict = 9;
        assert_eq!(unpack(&wrong, &old, &dicts, &mut back), Err(CorruptBody));
        let mut short = h;
        short.raw_len -= 1;
        assert_eq!(unpack(&short, &old, &dicts, &mut back), Err(CorruptBody));
        short.raw_len += 2;
        assert_eq!(unpack(&short, &old, &dicts, &mut back), Err(CorruptBody));
        assert_eq!(
            unpack(&h, &old[..old.len() - 1], &dicts, &mut back),
            Err(CorruptBody)
        );
    }

    const DICT3: Compression = Compression::Zstd {
        level: 3,
        dict: true,
    };

    /// A small-map-like body (the shape Heft's encoder gives
    /// `%{id: i, name: "user-i", age: i rem 90}`: atom ids, tags, varints).
    fn small_map(i: u32) -> Vec<u8> {
        let mut b = vec![0x74, 3, 0x64, 1, 0x61];
        b.extend_from_slice(&(i * 2).to_le_bytes()[..3]);
        b.extend_from_slice(&[0x64, 2, 0x6d, 9 + (i >= 10) as u8]);
        b.extend_from_slice(format!("user-{i}").as_bytes());
        b.extend_from_slice(&[0x64, 3, 0x61, (i % 90) as u8]);
        b
    }

    /// Dictionaries of one table with `n` dictionaries trained on
    /// `samples`, the last one current.
    fn trained(samples: &[Vec<u8>], n: usize) -> Dictionaries {
        let dicts = Dictionaries::new(3);
        for k in 0..n {
            let d = crate::dict::train(&samples[k * 100..], 4096, 3).unwrap();
            dicts.set_current(dicts.add(&d).unwrap().id());
        }
        dicts
    }

    /// A zstd frame of `raw` made with `bytes` as dictionary, as main
    /// wrote `Codec::ZstdDict` records before blocks.
    fn dict_frame(raw: &[u8], bytes: &[u8]) -> Vec<u8> {
        let cdict = zstd::zstd_safe::CDict::create(bytes, 3);
        let mut c = new_cctx();
        c.ref_cdict(&cdict).unwrap();
        let mut out = Vec::with_capacity(zstd::zstd_safe::compress_bound(raw.len()));
        c.compress2(&mut out, raw).unwrap();
        out
    }

    #[test]
    fn dictionary_blocks_round_trip_every_shape_and_size_and_big_bodies_use_frames() {
        let samples: Vec<Vec<u8>> = (0..2000).map(small_map).collect();
        let dicts = trained(&samples, 1);
        let text = |n: usize| -> Vec<u8> {
            (0..)
                .flat_map(|i: u32| format!("user-{i};age={};", i % 90).into_bytes())
                .take(n)
                .collect()
        };
        let mut blocks = 0;
        for n in [8, 9, 15, 24, 25, 31, 40, 100, 1000, 5000, 70_000] {
            for body in [text(n), vec![b'x'; n], crate::testutil::noise(n as u32, n)] {
                let p = roundtrip(&body, DICT3, &dicts);
                assert!(matches!(p.codec, Codec::ZstdBlock | Codec::Raw), "{n}");
                blocks += (p.codec == Codec::ZstdBlock) as u32;
            }
        }
        for i in (0..5000).step_by(37) {
            assert_eq!(
                roundtrip(&small_map(i), DICT3, &dicts).codec,
                Codec::ZstdBlock
            );
        }
        assert!(blocks >= 12, "{blocks}");
        let max = zblock::BLOCK_MAX;
        for n in [max - 1, max] {
            assert_eq!(roundtrip(&text(n), DICT3, &dicts).codec, Codec::ZstdBlock);
        }
        // Beyond a block: plain zstd frames.
        for n in [max + 1, 300_000] {
            assert_eq!(roundtrip(&text(n), DICT3, &dicts).codec, Codec::Zstd);
        }
        assert_eq!(
            roundtrip(&crate::testutil::noise(5, 1024), DICT3, &dicts),
            Packed::RAW
        );
        assert_eq!(roundtrip(b"seven..", DICT3, &dicts), Packed::RAW);
    }

    #[test]
    fn a_dictionary_block_is_smaller_than_a_dictionary_frame_for_small_records() {
        let samples: Vec<Vec<u8>> = (0..2000).map(small_map).collect();
        let dicts = trained(&samples, 1);
        let d = dicts.current().unwrap();
        let (mut block, mut frame) = (0, 0);
        let mut out = Vec::new();
        for i in 3000..3100 {
            let raw = small_map(i);
            assert_eq!(
                compress(&raw, DICT3, &dicts, &mut out).codec,
                Codec::ZstdBlock
            );
            block += out.len();
            frame += dict_frame(&raw, d.bytes()).len();
        }
        // A frame costs a frame header byte, a window byte and a 3-byte
        // block header more, and cannot reuse the dictionary's tables.
        assert!(block + 4 * 100 <= frame, "blocks {block}, frames {frame}");
    }

    #[test]
    fn a_block_made_with_dictionary_1_reads_after_dictionary_2_is_current_and_old_frames_too() {
        let samples: Vec<Vec<u8>> = (0..2000).map(small_map).collect();
        let dicts = trained(&samples, 1);
        let raw = small_map(4321);
        let mut old = Vec::new();
        let p = compress(&raw, DICT3, &dicts, &mut old);
        assert_eq!(p.dict, 1);
        let frame = dict_frame(&raw, dicts.get(1).unwrap().bytes());
        let d2 = crate::dict::train(&samples[500..], 2048, 3).unwrap();
        dicts.set_current(dicts.add(&d2).unwrap().id());
        assert_eq!(roundtrip(&raw, DICT3, &dicts).dict, 2);
        let mut back = Vec::new();
        let h = header(p, old.len(), raw.len());
        assert_eq!(unpack(&h, &old, &dicts, &mut back).unwrap(), raw);
        let fh = Header {
            codec: Codec::ZstdDict,
            stored_len: frame.len(),
            ..h
        };
        assert_eq!(unpack(&fh, &frame, &dicts, &mut back).unwrap(), raw);
        // Read with the wrong dictionary: refused or another body, never
        // a panic; a dictionary the table lacks: refused.
        let wrong = Header { dict: 2, ..h };
        assert_ne!(
            unpack(&wrong, &old, &dicts, &mut back).map(|b| b == raw),
            Ok(true)
        );
        assert_eq!(
            unpack(&Header { dict: 3, ..h }, &old, &dicts, &mut back),
            Err(CorruptBody)
        );
    }

    #[test]
    fn damaged_dictionary_blocks_are_refused_never_misread() {
        let samples: Vec<Vec<u8>> = (0..2000).map(small_map).collect();
        let dicts = trained(&samples, 1);
        let mut back = Vec::new();
        for raw in [small_map(7777), b"user-1;user-2;user-3;user-4;".repeat(40)] {
            let mut out = Vec::new();
            let p = compress(&raw, DICT3, &dicts, &mut out);
            assert_eq!(p.codec, Codec::ZstdBlock);
            let h = header(p, out.len(), raw.len());
            for cut in 0..out.len() {
                assert_eq!(
                    unpack(&h, &out[..cut], &dicts, &mut back),
                    Err(CorruptBody),
                    "cut {cut}"
                );
            }
            for len in [0, raw.len() - 1, raw.len() + 1, zblock::BLOCK_MAX + 1] {
                let bad = Header { raw_len: len, ..h };
                assert_eq!(
                    unpack(&bad, &out, &dicts, &mut back),
                    Err(CorruptBody),
                    "{len}"
                );
            }
            for i in 0..out.len() {
                for bit in [0x01, 0x10, 0x80, 0xff] {
                    let mut bad = out.clone();
                    bad[i] ^= bit;
                    // No checksum in a block: a flip may decode to other
                    // bytes of the right length (caught by the term
                    // decoder above), never to a wrong length or a panic.
                    if let Ok(b) = unpack(&h, &bad, &dicts, &mut back) {
                        assert_eq!(b.len(), raw.len());
                    }
                }
            }
            let mut longer = out.clone();
            longer.extend_from_slice(&out);
            assert_eq!(unpack(&h, &longer, &dicts, &mut back), Err(CorruptBody));
            // Still decodes after all that.
            assert_eq!(unpack(&h, &out, &dicts, &mut back).unwrap(), raw);
        }
    }

    #[test]
    fn damaged_lz4_and_zstd_bodies_are_refused_not_misread() {
        let dicts = Dictionaries::new(3);
        let raw: Vec<u8> = (0..2000u32).map(|i| (i % 7) as u8 * 3).collect();
        for mode in FAST {
            let mut out = Vec::new();
            let p = compress(&raw, mode, &dicts, &mut out);
            let h = header(p, out.len(), raw.len());
            let mut back = Vec::new();
            for cut in [0, 1, out.len() / 2, out.len() - 1] {
                assert_eq!(
                    unpack(&h, &out[..cut], &dicts, &mut back),
                    Err(CorruptBody),
                    "{mode:?} cut {cut}"
                );
            }
            let mut longer = h;
            longer.raw_len += 1;
            assert_eq!(
                unpack(&longer, &out, &dicts, &mut back),
                Err(CorruptBody),
                "{mode:?}"
            );
            // A damaged raw length far beyond what the body could hold is
            // refused before anything is allocated for it.
            let mut huge = h;
            huge.raw_len = usize::MAX / 2;
            assert_eq!(
                unpack(&huge, &out, &dicts, &mut back),
                Err(CorruptBody),
                "{mode:?}"
            );
            for i in 0..out.len() {
                let mut bad = out.clone();
                bad[i] ^= 0x5a;
                // Never a panic; a wrong body is possible only where the
                // format has no check (lz4), and is then caught by the
                // length or by the term decoder above this layer.
                let _ = unpack(&h, &bad, &dicts, &mut back);
            }
        }
    }

    #[test]
    fn arbitrary_bytes_as_an_lz4_block_are_refused_or_decoded_to_the_stated_length() {
        // lz4_flex's pointer-based decoder (Cargo.toml) must stay inside
        // its input and output whatever the bytes: random blocks, and real
        // blocks with bytes changed, of every claimed length around theirs.
        let dicts = Dictionaries::new(3);
        let real = {
            let raw: Vec<u8> = (0..3000u32).map(|i| (i * 7 % 13) as u8).collect();
            let mut out = Vec::new();
            assert_eq!(
                compress(&raw, Compression::Lz4, &dicts, &mut out).codec,
                Codec::Lz4
            );
            out
        };
        let mut back = Vec::new();
        for seed in 1..4000u32 {
            let len = (seed as usize * 31) % 300;
            let mut stored = crate::testutil::noise(seed, len);
            if seed % 2 == 0 {
                stored = real.clone();
                let at = seed as usize % stored.len();
                stored[at] ^= (seed >> 1) as u8 | 1;
            }
            for raw_len in [0, 1, 15, 16, 17, 64, 255, 1000, 2999, 3000, 3001, 70_000] {
                let h = header(Packed::plain(Codec::Lz4), stored.len(), raw_len);
                if let Ok(body) = unpack(&h, &stored, &dicts, &mut back) {
                    assert_eq!(body.len(), raw_len);
                }
            }
        }
    }

    #[test]
    fn compressible_bodies_shrink_and_come_back() {
        let raw: Vec<u8> = b"abcdefgh".iter().cycle().take(4000).copied().collect();
        let mut out = Vec::new();
        assert_eq!(z(&raw, Compression::Zlib(6), &mut out), Codec::Deflate);
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
        assert_eq!(z(&noise, Compression::Zlib(9), &mut out), Codec::Raw);
        assert!(out.is_empty());
        assert_eq!(z(b"short", Compression::Zlib(9), &mut out), Codec::Raw);
        assert_eq!(z(&[0; 4096], Compression::None, &mut out), Codec::Raw);
    }

    #[test]
    fn every_level_roundtrips_and_levels_can_alternate_on_one_thread() {
        let raw: Vec<u8> = (0..3000u32).map(|i| (i % 17) as u8).collect();
        for level in [0, 1, 5, 9, 1, 0] {
            let mut out = Vec::new();
            let codec = z(&raw, Compression::Zlib(level), &mut out);
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
            if z(body, Compression::Zlib(1), &mut out) == Codec::Deflate {
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
        assert_eq!(z(&body, Compression::Zlib(6), &mut out), Codec::Raw);
        // Compressible after the prefix only: still stored raw (the probe
        // decides), which costs space but never correctness.
        body[PROBE_LEN..].fill(0);
        assert_eq!(z(&body, Compression::Zlib(6), &mut out), Codec::Raw);
        body.fill(0);
        assert_eq!(z(&body, Compression::Zlib(6), &mut out), Codec::Deflate);
    }

    #[test]
    fn corrupt_or_mislabelled_bodies_are_refused() {
        let raw = vec![7u8; 1000];
        let mut out = Vec::new();
        assert_eq!(z(&raw, Compression::Zlib(6), &mut out), Codec::Deflate);
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
