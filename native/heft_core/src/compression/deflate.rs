//! A small raw-deflate encoder for short bodies: one block with the fixed
//! Huffman codes of RFC 1951 (section 3.2.6), greedy LZ77 matching; and an
//! inflater for what it writes (stored and fixed-Huffman blocks), which
//! costs a fraction of a general inflater's setup on a 1 KB body.
//!
//! Why: zlib's compressors clear a 64-128 KiB hash table at every reset, so
//! deflating a 219-byte record costs 6-7 µs whatever its content (measured
//! with flate2/zlib-rs 0.6 and miniz_oxide 0.8 on the reference machine),
//! more than an ETS insert of the same record. This encoder's hash table is
//! never cleared: positions are numbered on from one call to the next, and
//! entries numbered before the current call count as empty. Its output is ordinary
//! raw deflate, read back by flate2 like any other; for long bodies, where
//! the reset is amortized and dynamic Huffman codes pay, compress.rs uses
//! flate2.

use std::cell::RefCell;

const HASH_BITS: u32 = 13;
const MIN_MATCH: usize = 3;
const MAX_MATCH: usize = 258;
const WINDOW: usize = 32 * 1024;
/// Bytes sampled by `looks_random`, and how many distinct values in them
/// make input look random.
const SAMPLE: usize = 64;
const RANDOM_DISTINCT: usize = 50;
/// Matches longer than this do not index the positions they cover.
const MAX_INSERT: usize = 16;
/// Input after which an encoding that saves too little is abandoned.
const PROBE: usize = 512;

/// Length symbol bases (symbols 257..=285) and their extra bits.
pub(crate) const LEN_BASE: [u16; 29] = [
    3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99, 115, 131,
    163, 195, 227, 258,
];
pub(crate) const LEN_EXTRA: [u8; 29] = [
    0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0,
];
/// Distance code bases (codes 0..=29) and their extra bits.
pub(crate) const DIST_BASE: [u16; 30] = [
    1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 257, 385, 513, 769, 1025, 1537,
    2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577,
];
pub(crate) const DIST_EXTRA: [u8; 30] = [
    0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13,
    13,
];

/// Positions of recent 3-byte sequences, so numbered that the table never
/// needs clearing: a call's input position `i` is entered as `base + i`,
/// and the next call's `base` is past all of them.
struct Matcher {
    base: u32,
    table: Box<[u32; 1 << HASH_BITS]>,
}

thread_local! {
    static MATCHER: RefCell<Matcher> = RefCell::new(Matcher {
        base: 1,
        table: Box::new([0; 1 << HASH_BITS]),
    });
}

/// Packs bits least-significant first, as deflate does, into `out[pos..]`,
/// which the caller sized so that every write fits: each [`Bits::flush`]
/// stores a whole 64-bit word and moves on by the bytes it completed.
struct Bits<'a> {
    out: &'a mut [u8],
    pos: usize,
    acc: u64,
    n: u32,
}

impl Bits<'_> {
    /// Adds the low `bits` bits of `value`; at most 56 bits may be pending
    /// between flushes (under 8 after one, plus one symbol's 31 at most).
    #[inline(always)]
    fn put(&mut self, value: u32, bits: u32) {
        self.acc |= u64::from(value) << self.n;
        self.n += bits;
    }

    /// Writes out the completed bytes. False when the output is full, which
    /// the caller's budget check prevents.
    #[inline(always)]
    fn flush(&mut self) -> bool {
        let Some(dst) = self.out.get_mut(self.pos..self.pos + 8) else {
            return false;
        };
        dst.copy_from_slice(&self.acc.to_le_bytes());
        let bytes = self.n / 8;
        self.pos += bytes as usize;
        // `bytes` is at most 7, so the shift stays under 64.
        self.acc >>= bytes * 8;
        self.n &= 7;
        true
    }

    /// Flushes the last partial byte too; returns the bytes written.
    fn finish(mut self) -> Option<usize> {
        self.n += 7;
        self.flush().then_some(self.pos)
    }
}

/// The fixed literal/length codes (RFC 1951, 3.2.6), bit-reversed as they
/// are written: (code, length) of each symbol 0..=287.
pub(crate) const LIT_LEN: [(u16, u8); 288] = {
    let mut t = [(0u16, 0u8); 288];
    let mut sym: u32 = 0;
    while sym < 288 {
        let (code, len): (u32, u32) = match sym {
            0..=143 => (0x30 + sym, 8),
            144..=255 => (0x190 + sym - 144, 9),
            256..=279 => (sym - 256, 7),
            _ => (0xC0 + sym - 280, 8),
        };
        t[sym as usize] = ((code.reverse_bits() >> (32 - len)) as u16, len as u8);
        sym += 1;
    }
    t
};

/// What a match length 0..=258 is written as: the fixed code of its length
/// symbol with the extra bits above it, as `bits | count << 16` (lengths
/// under 3 are never written).
const LEN_CODE: [u32; MAX_MATCH + 1] = {
    let mut t = [0u32; MAX_MATCH + 1];
    let mut li = 0;
    while li < 29 {
        let (code, clen) = LIT_LEN[257 + li];
        let extra = LEN_EXTRA[li] as u32;
        let base = LEN_BASE[li] as usize;
        // 258 has a symbol of its own (285), not 284's last extra value.
        let end = if li == 28 { 259 } else { base + (1 << extra) };
        let mut len = base;
        while len < end && len <= MAX_MATCH {
            let bits = code as u32 | ((len - base) as u32) << clen;
            t[len] = bits | (clen as u32 + extra) << 16;
            len += 1;
        }
        li += 1;
    }
    t
};

/// Distance code of distances 1..=256 (index `dist - 1`) and of longer
/// ones (index `256 + (dist - 1) >> 7`), as zlib's `_dist_code` does.
const DIST_CODE: [u8; 512] = {
    let mut t = [0u8; 512];
    let mut di = 0;
    while di < 30 {
        let base = DIST_BASE[di] as usize;
        let end = base + (1 << DIST_EXTRA[di]);
        let mut d = base;
        while d < end {
            if d <= 256 {
                t[d - 1] = di as u8;
            } else {
                t[256 + ((d - 1) >> 7)] = di as u8;
            }
            d += 1;
        }
        di += 1;
    }
    t
};

/// Each distance code's fixed (5-bit, bit-reversed) code with the count
/// of bits it and its extra bits take, as `code | count << 16`, and the
/// base the extra bits count from.
const DIST_INFO: [(u32, u16); 30] = {
    let mut t = [(0u32, 0u16); 30];
    let mut di = 0;
    while di < 30 {
        let code = (di as u32).reverse_bits() >> 27;
        t[di] = (code | (5 + DIST_EXTRA[di] as u32) << 16, DIST_BASE[di]);
        di += 1;
    }
    t
};

/// A distance's code and extra bits, as `bits | count << 16`.
#[inline(always)]
fn dist_code(dist: usize) -> u32 {
    let di = usize::from(if dist <= 256 {
        DIST_CODE[(dist - 1) & 0xff]
    } else {
        DIST_CODE[256 + (((dist - 1) >> 7) & 0xff)]
    });
    let (code, base) = DIST_INFO[di % 30];
    code | ((dist - usize::from(base)) as u32) << 5
}

/// Writes a match: length code and extra bits, distance code and extra
/// bits (at most 8 + 5 + 5 + 13 = 31 bits).
#[inline(always)]
fn emit_match(bits: &mut Bits, len: usize, dist: usize) {
    let l = LEN_CODE[len.min(MAX_MATCH)];
    let d = dist_code(dist);
    bits.put(l & 0xffff, l >> 16);
    bits.put(d & 0xffff, d >> 16);
}

/// True if `sample` holds at least [`RANDOM_DISTINCT`] distinct byte
/// values: 64 random bytes hold about 57 (fewer than 50 in about one
/// sample in 600), text and encoded terms far fewer (base64 about 40, hex
/// 16). A byte per value, counted as it is first seen: a store and a load
/// of one byte each, no read-modify-write of a shared word.
fn looks_random(sample: &[u8]) -> bool {
    let mut seen = [1u8; 256];
    let mut distinct = 0;
    for &b in sample {
        distinct += usize::from(seen[usize::from(b)]);
        seen[usize::from(b)] = 0;
    }
    distinct >= RANDOM_DISTINCT
}

/// True if `input`, at least [`PROBE`] bytes, looks random in evenly
/// spaced samples of [`SAMPLE`] bytes from its first byte to its last:
/// three up to 4 KiB, one more for each further 4 KiB, at most 16 (see
/// [`looks_random`]). Random, encrypted or compressed data, which no codec
/// here shrinks by the 1/16 or 1/8 they ask for, is then stored raw
/// without being tried, by every codec (docs/term-format.md, "Records in
/// the arena"). A body that looks random in only some samples is tried.
pub(crate) fn looks_incompressible(input: &[u8]) -> bool {
    if input.len() < PROBE {
        return false;
    }
    let n = (input.len() / 4096 + 2).clamp(3, 16);
    let last = input.len() - SAMPLE;
    (0..n).all(|i| {
        let at = last * i / (n - 1);
        looks_random(&input[at..at + SAMPLE])
    })
}

/// True if some [`SAMPLE`] bytes of `bytes`, at every half sample, look
/// random (see [`looks_random`]).
pub(crate) fn holds_noise(bytes: &[u8]) -> bool {
    bytes.len() >= SAMPLE
        && (0..=(bytes.len() - SAMPLE) / (SAMPLE / 2))
            .any(|i| looks_random(&bytes[i * SAMPLE / 2..i * SAMPLE / 2 + SAMPLE]))
}

/// Reads 8 bytes at `i` (little-endian), if there are 8.
#[inline(always)]
fn word(b: &[u8], i: usize) -> Option<u64> {
    b.get(i..i + 8)
        .map(|w| u64::from_le_bytes(w.try_into().unwrap_or_default()))
}

/// How many bytes the input at `cand` and at `i` (`cand < i`) share, up to
/// `max` (`i + max <= b.len()`), compared eight at a time.
#[inline(always)]
fn match_len(b: &[u8], cand: usize, i: usize, max: usize) -> usize {
    let mut n = 0;
    while n + 8 <= max {
        let (Some(x), Some(y)) = (word(b, cand + n), word(b, i + n)) else {
            break;
        };
        let diff = x ^ y;
        if diff != 0 {
            return n + (diff.trailing_zeros() / 8) as usize;
        }
        n += 8;
    }
    while n < max && b.get(cand + n) == b.get(i + n) {
        n += 1;
    }
    n
}

/// The hash bucket of the 3 bytes at `i` (`i + 3 <= b.len()`).
#[inline(always)]
fn hash3(b: &[u8], i: usize) -> usize {
    let v = match b.get(i..i + 4) {
        Some(w) => u32::from_le_bytes(w.try_into().unwrap_or_default()) & 0xFF_FFFF,
        None => u32::from(b[i]) | u32::from(b[i + 1]) << 8 | u32::from(b[i + 2]) << 16,
    };
    (v.wrapping_mul(0x9E37_79B1) >> (32 - HASH_BITS)) as usize
}

/// Appends the raw deflate encoding of `input` to `out`, giving up (and
/// returning false, `out` then back at its length before) once it would exceed
/// `budget` bytes.
pub fn compress(input: &[u8], out: &mut Vec<u8>, budget: usize) -> bool {
    // Input that must shrink and looks random is not tried at all.
    if budget < input.len() && looks_incompressible(input) {
        return false;
    }
    MATCHER.with(|m| {
        let mut m = m.borrow_mut();
        let Ok(len) = u32::try_from(input.len()) else {
            return false;
        };
        if m.base.checked_add(len).is_none() {
            // After four billion bytes the numbers would repeat: start clean.
            m.table.fill(0);
            m.base = 1;
        }
        let base = m.base;
        // Past this call's positions (and never 0 again, which is empty).
        m.base = base.saturating_add(len).saturating_add(1);
        let start = out.len();
        // Fixed codes take at most 9 bits a byte (a match of n bytes at
        // most 26 bits for n = 3), plus 3 header bits and the 7 of the end
        // code; 8 bytes more for the writer's whole-word stores.
        let limit = budget.min(input.len() + input.len() / 8 + 4);
        out.resize(start + limit + 16, 0);
        let written = encode(&mut m.table, base, input, &mut out[start..], limit);
        out.truncate(start + written.unwrap_or(0));
        written.is_some()
    })
}

/// Encodes `input` into `out` (`limit + 16` bytes); the length written, or
/// None once that would exceed `limit` bytes.
fn encode(
    table: &mut [u32; 1 << HASH_BITS],
    base: u32,
    input: &[u8],
    out: &mut [u8],
    limit: usize,
) -> Option<usize> {
    let must_shrink = limit < input.len();
    let mut bits = Bits {
        out,
        pos: 0,
        acc: 0,
        n: 0,
    };
    bits.put(1, 1); // BFINAL
    bits.put(1, 2); // BTYPE = 01, fixed Huffman codes
    let mut i = 0;
    let mut probed = !must_shrink;
    // Positions from which a 3-byte sequence can be hashed.
    let hashable = input.len().saturating_sub(MIN_MATCH - 1);
    while i < input.len() {
        if bits.pos > limit || !bits.flush() {
            return None;
        }
        // Incompressible input (random bytes, compressed data) costs 8-9
        // bits a byte here: when the caller wants it smaller than it is,
        // give up once PROBE bytes have not shrunk by a sixteenth rather
        // than encode up to the budget.
        if !probed && i >= PROBE {
            probed = true;
            if bits.pos > i - i / 16 {
                return None;
            }
        }
        let mut best = 0;
        let mut dist = 0;
        if i < hashable {
            let h = hash3(input, i);
            let entry = table[h];
            table[h] = base + i as u32;
            // Entries of earlier calls wrap round to huge positions.
            let cand = entry.wrapping_sub(base) as usize;
            {
                if cand < i && i - cand <= WINDOW {
                    let len = match_len(input, cand, i, MAX_MATCH.min(input.len() - i));
                    if len >= MIN_MATCH {
                        best = len;
                        dist = i - cand;
                    }
                }
            }
        }
        if best > 0 {
            emit_match(&mut bits, best, dist);
            // Index the positions a short match covers, so later matches
            // can start inside it; a long one is skipped (as zlib's
            // fastest levels do): its positions mostly repeat what the
            // table holds, and indexing them costs a hash per byte.
            if best <= MAX_INSERT {
                for j in i + 1..(i + best).min(hashable) {
                    table[hash3(input, j)] = base + j as u32;
                }
            }
            i += best;
        } else {
            let (code, len) = LIT_LEN[usize::from(input[i])];
            bits.put(u32::from(code), u32::from(len));
            i += 1;
        }
    }
    let (code, len) = LIT_LEN[256];
    bits.put(u32::from(code), u32::from(len));
    bits.finish().filter(|&n| n <= limit)
}

/// Why [`inflate`] did not inflate a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InflateError {
    /// Not valid raw deflate of exactly the length expected.
    Corrupt,
    /// A block with dynamic Huffman codes (written by flate2 for long
    /// bodies): the caller inflates the stream with flate2 instead.
    Dynamic,
}

/// The most bytes one byte of deflate input can stand for.
const MAX_EXPANSION: usize = 1032;

/// Bytes of room past the expected length: matches are copied up to 16
/// bytes at a time and may write up to 15 past their end.
const SLACK: usize = 16;

/// What a table entry decodes to (bits 4-5 of an entry): flags, so that
/// the decoder tests bits rather than jumping through a table on the kind.
const LITERAL: u32 = 0;
const LENGTH: u32 = 1;
/// Both flags: the end code, or (with a value of 1) an invalid one.
const END: u32 = 3;
const INVALID_VALUE: u32 = 1;

/// A decode table entry: the code's length (bits 0-3), its kind (4-5), the
/// count of extra bits that follow it (8-11) and its value (16-31: the
/// literal, or the length or distance the extra bits add to).
const fn entry(code_len: u32, kind: u32, extra: u32, value: u32) -> u32 {
    code_len | kind << 4 | extra << 8 | value << 16
}

/// The fixed literal/length code indexed by the next 9 bits of input (the
/// longest fixed code is 9 bits; shorter ones fill every index whose low
/// bits are theirs).
const FIXED_LIT: [u32; 512] = {
    let mut t = [0u32; 512];
    let mut sym = 0;
    while sym < 288 {
        let (code, len) = LIT_LEN[sym];
        let len = len as u32;
        let e = if sym < 256 {
            entry(len, LITERAL, 0, sym as u32)
        } else if sym == 256 {
            entry(len, END, 0, 0)
        } else if sym < 286 {
            let li = sym - 257;
            entry(len, LENGTH, LEN_EXTRA[li] as u32, LEN_BASE[li] as u32)
        } else {
            entry(len, END, 0, INVALID_VALUE)
        };
        let mut k = code as usize;
        while k < 512 {
            t[k] = e;
            k += 1 << len;
        }
        sym += 1;
    }
    t
};

/// The fixed distance code indexed by the next 5 bits (codes 30 and 31 are
/// invalid).
const FIXED_DIST: [u32; 32] = {
    let mut t = [0u32; 32];
    let mut di = 0;
    while di < 32 {
        let code = ((di as u32).reverse_bits() >> 27) as usize;
        t[code] = if di < 30 {
            entry(5, LENGTH, DIST_EXTRA[di] as u32, DIST_BASE[di] as u32)
        } else {
            entry(5, END, 0, INVALID_VALUE)
        };
        di += 1;
    }
    t
};

/// Reads bits least-significant first through a 64-bit buffer refilled a
/// word at a time (libdeflate's way). Past the end of the input it reads
/// zeros, at most 8 bytes of them; whether the stream really ended inside
/// the input is checked once at its end ([`BitReader::consumed`]).
struct BitReader<'a> {
    input: &'a [u8],
    /// Input bytes taken into `buf` so far (past the end: zeros).
    next: usize,
    buf: u64,
    /// Valid bits at the bottom of `buf`; the bits above them are copies of
    /// the input bytes that follow, or zeros.
    count: u32,
}

impl BitReader<'_> {
    /// Makes at least 56 bits available.
    #[inline(always)]
    fn refill(&mut self) -> Result<(), InflateError> {
        match self.input.get(self.next..self.next + 8) {
            Some(w) => {
                self.buf |= u64::from_le_bytes(w.try_into().unwrap_or_default()) << self.count;
                self.next += ((63 - self.count) >> 3) as usize;
                self.count |= 56;
                Ok(())
            }
            None => self.refill_slow(),
        }
    }

    #[cold]
    fn refill_slow(&mut self) -> Result<(), InflateError> {
        while self.count < 56 {
            if self.next >= self.input.len() + 8 {
                return Err(InflateError::Corrupt);
            }
            let b = self.input.get(self.next).copied().unwrap_or(0);
            self.buf |= u64::from(b) << self.count;
            self.next += 1;
            self.count += 8;
        }
        Ok(())
    }

    /// The next `n` bits (n < 32), left in the buffer.
    #[inline(always)]
    fn peek(&self, n: u32) -> u32 {
        (self.buf & ((1 << n) - 1)) as u32
    }

    /// Drops `n` bits (at most `count`).
    #[inline(always)]
    fn consume(&mut self, n: u32) {
        self.buf >>= n;
        self.count -= n;
    }

    /// Input bits read so far.
    fn consumed(&self) -> usize {
        self.next * 8 - self.count as usize
    }
}

/// Inflates the raw deflate stream `input` into `out`, which it replaces;
/// the stream must produce exactly `raw_len` bytes and end in its last
/// byte. Reads stored and fixed-Huffman blocks (all that [`compress`]
/// writes); a dynamic block gives [`InflateError::Dynamic`]. Never panics,
/// never reads or writes out of bounds: every length and distance is
/// checked against the output so far and the room left.
pub fn inflate(input: &[u8], raw_len: usize, out: &mut Vec<u8>) -> Result<(), InflateError> {
    out.clear();
    // No deflate stream grows more than 1032-fold (a 258-byte match in two
    // bits): a larger claimed length is refused before any room is made.
    if raw_len > input.len().saturating_mul(MAX_EXPANSION) {
        return Err(InflateError::Corrupt);
    }
    out.resize(raw_len + SLACK, 0);
    let mut r = BitReader {
        input,
        next: 0,
        buf: 0,
        count: 0,
    };
    let mut pos = 0;
    loop {
        r.refill()?;
        let header = r.peek(3);
        r.consume(3);
        pos = match header >> 1 {
            0 => stored(&mut r, out, pos, raw_len)?,
            1 => fixed(&mut r, out, pos, raw_len)?,
            2 => return Err(InflateError::Dynamic),
            _ => return Err(InflateError::Corrupt),
        };
        if header & 1 == 1 {
            break;
        }
    }
    // Exactly `raw_len` bytes, and the stream ends in the input's last byte
    // (any later byte would be left unread; zlib reports the same).
    if pos != raw_len || r.consumed().div_ceil(8) != input.len() {
        return Err(InflateError::Corrupt);
    }
    out.truncate(raw_len);
    Ok(())
}

/// A stored block: its bytes as they are, from the next byte boundary.
fn stored(
    r: &mut BitReader,
    out: &mut [u8],
    pos: usize,
    raw_len: usize,
) -> Result<usize, InflateError> {
    r.consume(r.count % 8);
    // Read on from the input directly.
    let at = r.consumed() / 8;
    let header = r.input.get(at..at + 4).ok_or(InflateError::Corrupt)?;
    let len = u16::from_le_bytes([header[0], header[1]]);
    let nlen = u16::from_le_bytes([header[2], header[3]]);
    if len != !nlen || usize::from(len) > raw_len - pos {
        return Err(InflateError::Corrupt);
    }
    let len = usize::from(len);
    let data = r
        .input
        .get(at + 4..at + 4 + len)
        .ok_or(InflateError::Corrupt)?;
    out[pos..pos + len].copy_from_slice(data);
    r.next = at + 4 + len;
    r.buf = 0;
    r.count = 0;
    Ok(pos + len)
}

/// A block with the fixed Huffman codes, up to its end code; returns the
/// output position after it. Literals, the common case, take the first
/// branch; kinds are tested with plain branches, not a jump table.
fn fixed(
    r: &mut BitReader,
    out: &mut [u8],
    mut pos: usize,
    raw_len: usize,
) -> Result<usize, InflateError> {
    loop {
        // A match takes at most 8 + 5 + 5 + 13 = 31 bits.
        if r.count < 31 {
            r.refill()?;
        }
        let e = FIXED_LIT[r.peek(9) as usize];
        r.consume(e & 15);
        if e & LENGTH << 4 == 0 {
            if pos >= raw_len {
                return Err(InflateError::Corrupt);
            }
            out[pos] = (e >> 16) as u8;
            pos += 1;
            continue;
        }
        if e & END << 4 == END << 4 {
            return if e >> 16 == INVALID_VALUE {
                Err(InflateError::Corrupt)
            } else {
                Ok(pos)
            };
        }
        let extra = (e >> 8) & 15;
        let len = (e >> 16) as usize + r.peek(extra) as usize;
        r.consume(extra);
        let d = FIXED_DIST[r.peek(5) as usize];
        r.consume(5);
        let extra = (d >> 8) & 15;
        let dist = (d >> 16) as usize + r.peek(extra) as usize;
        r.consume(extra);
        if d & END << 4 == END << 4 || dist > pos || len > raw_len - pos {
            return Err(InflateError::Corrupt);
        }
        copy_match(out, pos, dist, len);
        pos += len;
    }
}

/// Copies `len` bytes from `dist` back (`0 < dist <= pos`, `pos + len +
/// SLACK <= out.len()`): 16 or 8 at a time when the source runs ahead of
/// the destination by that much (writing up to 15 bytes past the end,
/// which later output overwrites), byte by byte when the match repeats a
/// shorter run.
#[inline(always)]
fn copy_match(out: &mut [u8], pos: usize, dist: usize, len: usize) {
    let src = pos - dist;
    let Some(out) = out.get_mut(src..pos + len + SLACK) else {
        return;
    };
    let dst = dist;
    if dist >= 16 {
        chunks::<16>(out, dst, len);
    } else if dist >= 8 {
        chunks::<8>(out, dst, len);
    } else {
        for k in 0..len {
            out[dst + k] = out[k];
        }
    }
}

/// Copies `len` bytes of `out` from 0 to `dst` (`dst >= N`) in chunks of
/// `N`, rounding `len` up: each chunk's source lies wholly before its
/// destination, so an overlapping match repeats as it should.
#[inline(always)]
fn chunks<const N: usize>(out: &mut [u8], dst: usize, len: usize) {
    let mut k = 0;
    while k < len {
        let mut w = [0u8; N];
        w.copy_from_slice(&out[k..k + N]);
        out[dst + k..dst + k + N].copy_from_slice(&w);
        k += N;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::{Decompress, FlushDecompress, Status};

    fn inflate(data: &[u8], len: usize) -> Vec<u8> {
        let mut d = Decompress::new(false);
        let mut out = Vec::with_capacity(len + 16);
        let st = d
            .decompress_vec(data, &mut out, FlushDecompress::Finish)
            .unwrap();
        assert_eq!(st, Status::StreamEnd);
        assert_eq!(d.total_in(), data.len() as u64, "all input consumed");
        out
    }

    /// Deflates `input`, checks that flate2 and our inflater both give it
    /// back; returns the compressed length.
    fn roundtrip(input: &[u8]) -> usize {
        let mut out = Vec::new();
        assert!(compress(input, &mut out, usize::MAX));
        assert_eq!(inflate(&out, input.len()), input, "len {}", input.len());
        let mut back = Vec::new();
        super::inflate(&out, input.len(), &mut back).unwrap();
        assert_eq!(back, input, "ours, len {}", input.len());
        out.len()
    }

    /// What flate2 makes of `data` as a stream of exactly `len` bytes that
    /// ends in its last byte (compress.rs's rule), if anything.
    fn flate2_inflate(data: &[u8], len: usize) -> Option<Vec<u8>> {
        let mut d = Decompress::new(false);
        // Room for any stream these tests make, whatever length is claimed.
        let mut out = Vec::with_capacity(len.min(1 << 20));
        match d.decompress_vec(data, &mut out, FlushDecompress::Finish) {
            Ok(Status::StreamEnd) if out.len() == len && d.total_in() == data.len() as u64 => {
                Some(out)
            }
            _ => None,
        }
    }

    fn deflate_with_flate2(input: &[u8], level: u32) -> Vec<u8> {
        let mut c = flate2::Compress::new(flate2::Compression::new(level), false);
        let mut out = Vec::with_capacity(input.len() + 64);
        let st = c
            .compress_vec(input, &mut out, flate2::FlushCompress::Finish)
            .unwrap();
        assert_eq!(st, Status::StreamEnd);
        out
    }

    #[test]
    fn our_inflater_reads_flate2s_stored_and_fixed_blocks_and_defers_dynamic_ones() {
        let text = b"{\"id\":1,\"name\":\"user-1\",\"tags\":[\"a\",\"b\"]} ".repeat(60);
        let (mut stored, mut fixed, mut dynamic) = (0, 0, 0);
        for len in [0, 1, 5, 30, 100, 300, 1000, 2000] {
            for level in [0, 1, 6, 9] {
                let input = &text[..len];
                let packed = deflate_with_flate2(input, level);
                let mut back = Vec::new();
                match super::inflate(&packed, input.len(), &mut back) {
                    Ok(()) => {
                        assert_eq!(back, input, "len {len} level {level}");
                        if level == 0 {
                            stored += 1;
                        } else {
                            fixed += 1;
                        }
                    }
                    Err(InflateError::Dynamic) => dynamic += 1,
                    Err(InflateError::Corrupt) => panic!("len {len} level {level} refused"),
                }
            }
        }
        // Sixteen letters in a random order: dynamic codes pay (4 bits a
        // letter against fixed codes' 8), so flate2 writes a dynamic block.
        let letters: Vec<u8> = crate::testutil::noise(9, 2000)
            .iter()
            .map(|b| b'a' + b % 16)
            .collect();
        // (Level 1 is zlib-ng's "quick" strategy: fixed codes always.)
        for level in [6, 9] {
            let packed = deflate_with_flate2(&letters, level);
            let mut back = Vec::new();
            assert_eq!(
                super::inflate(&packed, letters.len(), &mut back),
                Err(InflateError::Dynamic)
            );
            dynamic += 1;
        }
        assert!(
            stored > 0 && fixed > 0 && dynamic > 0,
            "{stored} {fixed} {dynamic}"
        );
        // Several stored blocks (flate2 at level 0 cuts them at 64 KiB).
        let big = crate::testutil::noise(3, 150_000);
        let packed = deflate_with_flate2(&big, 0);
        let mut back = Vec::new();
        super::inflate(&packed, big.len(), &mut back).unwrap();
        assert_eq!(back, big);
    }

    #[test]
    fn damaged_streams_are_refused_exactly_when_flate2_refuses_them() {
        // Every truncation and thousands of bit flips of fixed-block and
        // stored-block streams: our inflater returns an error, never
        // panics, and agrees with flate2 on what it accepts.
        let text = b"{\"type\":\"login\",\"at\":1700000000,\"ok\":true},".repeat(20);
        let mut ours = Vec::new();
        assert!(compress(&text, &mut ours, usize::MAX));
        let streams = [ours, deflate_with_flate2(&text[..300], 0)];
        let mut rng = crate::testutil::Rng(0x5eed);
        let mut refused = 0;
        for packed in &streams {
            let len = if packed == &streams[0] {
                text.len()
            } else {
                300
            };
            let mut cases: Vec<(Vec<u8>, usize)> = (0..packed.len())
                .map(|n| (packed[..n].to_vec(), len))
                .collect();
            for _ in 0..3000 {
                let mut bad = packed.clone();
                for _ in 0..1 + rng.below(3) as usize {
                    let bit = rng.below(bad.len() as u64 * 8) as usize;
                    bad[bit / 8] ^= 1 << (bit % 8);
                }
                cases.push((bad, len));
            }
            // The right stream with a wrong length (one no stream of its
            // size can reach is refused without making room for it), and
            // trailing garbage.
            cases.push((packed.clone(), len - 1));
            cases.push((packed.clone(), len + 1));
            cases.push((packed.clone(), usize::MAX - 8));
            cases.push(([packed.as_slice(), &[0]].concat(), len));
            for (bad, len) in cases {
                let mut back = Vec::new();
                match super::inflate(&bad, len, &mut back) {
                    Ok(()) => assert_eq!(Some(back), flate2_inflate(&bad, len)),
                    Err(InflateError::Corrupt) => {
                        refused += 1;
                        assert_eq!(flate2_inflate(&bad, len), None, "{bad:?}");
                    }
                    Err(InflateError::Dynamic) => {}
                }
            }
        }
        assert!(refused > 1000, "{refused}");
    }

    #[test]
    fn empty_and_tiny_inputs() {
        roundtrip(b"");
        roundtrip(b"a");
        roundtrip(b"ab");
        roundtrip(b"aaa");
        roundtrip(&[0, 143, 144, 255]);
    }

    #[test]
    fn long_runs_use_matches_of_every_length() {
        for n in [3usize, 4, 10, 11, 257, 258, 259, 600, 5000] {
            let input = vec![7u8; n];
            let packed = roundtrip(&input);
            assert!(packed < 20 + n / 50, "{n} bytes packed to {packed}");
        }
        for len in 3..300 {
            let mut input: Vec<u8> = (0..len as u32).map(|i| (i * 7 % 251) as u8).collect();
            input.extend_from_within(..);
            roundtrip(&input);
        }
    }

    #[test]
    fn every_distance_code_roundtrips() {
        for &d in &DIST_BASE {
            for extra in [0usize, 1] {
                let dist = usize::from(d) + extra;
                if dist > WINDOW {
                    continue;
                }
                let mut input = crate::testutil::noise(dist as u32 | 1, dist);
                input.extend_from_within(..dist.min(300));
                roundtrip(&input);
            }
        }
    }

    #[test]
    fn random_and_structured_inputs_roundtrip() {
        let mut x = 0x1234_5678_u32;
        for round in 0..2000usize {
            let len = (round * 37) % 3000;
            let alphabet = 1 + round % 40;
            let input: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    (x % alphabet as u32) as u8
                })
                .collect();
            roundtrip(&input);
        }
    }

    #[test]
    fn the_budget_stops_incompressible_input() {
        let noise = crate::testutil::noise(99, 4000);
        let mut out = Vec::new();
        assert!(!compress(&noise, &mut out, 3500));
        // Not even tried: it looks random.
        assert!(out.is_empty(), "{}", out.len());
        assert!(looks_random(&noise[..SAMPLE]));
        // Input that does not look random but does not shrink is given up
        // after the probe, not at the budget: bytes 0..64 in a scrambled
        // order, each followed by a 6-bit byte of noise (few repeats; 8
        // bits a byte with fixed codes, at most 64 distinct values).
        let spread: Vec<u8> = crate::testutil::noise(5, 4000)
            .iter()
            .enumerate()
            .map(|(i, b)| {
                if i % 2 == 0 {
                    b & 0x3f
                } else {
                    (i / 2 * 37 % 64) as u8
                }
            })
            .collect();
        assert!(!looks_random(&spread[..SAMPLE]));
        let mut out = Vec::new();
        assert!(!compress(&spread, &mut out, 3500));
        assert!(out.len() <= PROBE + PROBE / 8 + 8, "{}", out.len());
        // Text does not look random.
        let text = "lorem ipsum dolor sit amet, {\"id\": 42, \"name\": \"user-42\"} ".repeat(8);
        assert!(!looks_random(&text.as_bytes()[..SAMPLE]));
        // Input that shrinks only after its first 400 bytes is still
        // compressed when it saves enough overall.
        let mut late = spread[..400].to_vec();
        late.extend(std::iter::repeat_n(b'z', 3600));
        let mut out = Vec::new();
        assert!(compress(&late, &mut out, late.len() - late.len() / 8));
        assert_eq!(inflate(&out, late.len()), late);
    }

    #[test]
    fn stale_table_entries_from_earlier_calls_are_ignored() {
        // The second input would "match" the first's positions if stamps
        // were not checked.
        roundtrip(&[b'x'; 100]);
        roundtrip(b"xyzxyzxyz-abc");
        roundtrip(&[b'y'; 50]);
    }
}
