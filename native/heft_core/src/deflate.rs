//! A small raw-deflate encoder for short bodies: one block with the fixed
//! Huffman codes of RFC 1951 (section 3.2.6), greedy LZ77 matching.
//!
//! Why: zlib's compressors clear a 64-128 KiB hash table at every reset, so
//! deflating a 219-byte record costs 6-7 µs whatever its content (measured
//! with flate2/zlib-rs 0.6 and miniz_oxide 0.8 on the reference machine),
//! more than an ETS insert of the same record. This encoder's hash table is
//! never cleared: each entry carries the number of the call that wrote it,
//! and entries from earlier calls count as empty. Its output is ordinary
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
const SAMPLE: usize = 256;
const RANDOM_DISTINCT: usize = 144;
/// Matches longer than this do not index the positions they cover.
const MAX_INSERT: usize = 16;
/// Input after which an encoding that saves too little is abandoned.
const PROBE: usize = 512;

/// Length symbol bases (symbols 257..=285) and their extra bits.
const LEN_BASE: [u16; 29] = [
    3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99, 115, 131,
    163, 195, 227, 258,
];
const LEN_EXTRA: [u8; 29] = [
    0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0,
];
/// Distance code bases (codes 0..=29) and their extra bits.
const DIST_BASE: [u16; 30] = [
    1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 257, 385, 513, 769, 1025, 1537,
    2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577,
];
const DIST_EXTRA: [u8; 30] = [
    0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13,
    13,
];

/// Positions of recent 3-byte sequences, stamped with the call that wrote
/// them so the table never needs clearing.
struct Matcher {
    call: u32,
    /// (call << 32) | position, per hash bucket.
    table: Vec<u64>,
}

thread_local! {
    static MATCHER: RefCell<Matcher> = RefCell::new(Matcher {
        call: 0,
        table: vec![0; 1 << HASH_BITS],
    });
}

/// Packs bits least-significant first, as deflate does.
struct Bits<'a> {
    out: &'a mut Vec<u8>,
    acc: u64,
    n: u32,
}

impl Bits<'_> {
    /// Appends the low `bits` bits of `value` (at most 32 at a time);
    /// whole 32-bit words go out at once.
    #[inline]
    fn put(&mut self, value: u32, bits: u32) {
        self.acc |= u64::from(value) << self.n;
        self.n += bits;
        if self.n >= 32 {
            self.out.extend_from_slice(&(self.acc as u32).to_le_bytes());
            self.acc >>= 32;
            self.n -= 32;
        }
    }

    /// A Huffman code, which deflate writes most-significant bit first.
    #[inline]
    fn code(&mut self, code: u32, bits: u32) {
        self.put(code.reverse_bits() >> (32 - bits), bits);
    }

    fn finish(mut self) {
        while self.n > 0 {
            self.out.push(self.acc as u8);
            self.acc >>= 8;
            self.n = self.n.saturating_sub(8);
        }
    }
}

/// The fixed literal/length codes (RFC 1951, 3.2.6), bit-reversed as they
/// are written: (code, length) of each symbol 0..=287.
const LIT_LEN: [(u16, u8); 288] = {
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

/// The fixed literal/length code of symbol `sym` (0..=287).
#[inline]
fn lit_len(bits: &mut Bits, sym: u32) {
    let (code, len) = LIT_LEN[sym as usize];
    bits.put(u32::from(code), u32::from(len));
}

fn emit_match(bits: &mut Bits, len: usize, dist: usize) {
    let li = LEN_BASE.partition_point(|&b| usize::from(b) <= len) - 1;
    lit_len(bits, 257 + li as u32);
    bits.put(
        (len - usize::from(LEN_BASE[li])) as u32,
        u32::from(LEN_EXTRA[li]),
    );
    let di = DIST_BASE.partition_point(|&b| usize::from(b) <= dist) - 1;
    bits.code(di as u32, 5);
    bits.put(
        (dist - usize::from(DIST_BASE[di])) as u32,
        u32::from(DIST_EXTRA[di]),
    );
}

/// True if `sample` holds at least [`RANDOM_DISTINCT`] distinct byte
/// values: 256 random bytes hold about 162 (a standard deviation of about
/// 4), text and encoded terms far fewer. Such input (random, encrypted or
/// already compressed data) would not shrink with fixed codes anyway.
fn looks_random(sample: &[u8]) -> bool {
    let mut seen = [0u64; 4];
    for &b in sample {
        seen[usize::from(b >> 6)] |= 1 << (b & 63);
    }
    seen.iter().map(|w| w.count_ones() as usize).sum::<usize>() >= RANDOM_DISTINCT
}

/// How many leading bytes `a` and `b` (of equal length) share, compared
/// eight at a time.
#[inline]
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    let mut n = 0;
    for (x, y) in a.chunks_exact(8).zip(b.chunks_exact(8)) {
        let x = u64::from_le_bytes(x.try_into().unwrap_or_default());
        let y = u64::from_le_bytes(y.try_into().unwrap_or_default());
        let diff = x ^ y;
        if diff != 0 {
            return n + (diff.trailing_zeros() / 8) as usize;
        }
        n += 8;
    }
    n + a[n..]
        .iter()
        .zip(&b[n..])
        .take_while(|(x, y)| x == y)
        .count()
}

#[inline]
fn hash3(b: &[u8], i: usize) -> usize {
    let v = u32::from(b[i]) | u32::from(b[i + 1]) << 8 | u32::from(b[i + 2]) << 16;
    (v.wrapping_mul(0x9E37_79B1) >> (32 - HASH_BITS)) as usize
}

/// Appends the raw deflate encoding of `input` to `out`, giving up (and
/// returning false, `out` then holding partial output) once it would exceed
/// `budget` bytes.
pub fn compress(input: &[u8], out: &mut Vec<u8>, budget: usize) -> bool {
    MATCHER.with(|m| {
        let mut m = m.borrow_mut();
        m.call = m.call.wrapping_add(1);
        if m.call == 0 {
            // Four billion calls later the stamps repeat: start clean.
            m.table.fill(0);
            m.call = 1;
        }
        encode(&mut m, input, out, budget)
    })
}

fn encode(m: &mut Matcher, input: &[u8], out: &mut Vec<u8>, budget: usize) -> bool {
    // Input that must shrink and looks random from its first bytes is not
    // tried at all (see `looks_random`).
    if budget < input.len() && input.len() >= PROBE && looks_random(&input[..SAMPLE]) {
        return false;
    }
    let start = out.len();
    let stamp = u64::from(m.call) << 32;
    let mut bits = Bits { out, acc: 0, n: 0 };
    bits.put(1, 1); // BFINAL
    bits.put(1, 2); // BTYPE = 01, fixed Huffman codes
    let mut i = 0;
    let mut probed = false;
    while i < input.len() {
        if bits.out.len() - start > budget {
            return false;
        }
        // Incompressible input (random bytes, compressed data) costs 8-9
        // bits a byte here: when the caller wants it smaller than it is,
        // give up once PROBE bytes have not shrunk by a sixteenth rather
        // than encode up to the budget.
        if !probed && i >= PROBE && budget < input.len() {
            probed = true;
            if bits.out.len() - start > i - i / 16 {
                return false;
            }
        }
        let mut best = 0;
        let mut dist = 0;
        if i + MIN_MATCH <= input.len() {
            let h = hash3(input, i);
            let entry = m.table[h];
            m.table[h] = stamp | i as u64;
            if entry >> 32 == stamp >> 32 {
                let cand = (entry & 0xFFFF_FFFF) as usize;
                if cand < i && i - cand <= WINDOW {
                    let max = MAX_MATCH.min(input.len() - i);
                    let len = common_prefix(&input[cand..cand + max], &input[i..i + max]);
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
                for j in i + 1..(i + best).min(input.len().saturating_sub(MIN_MATCH - 1)) {
                    m.table[hash3(input, j)] = stamp | j as u64;
                }
            }
            i += best;
        } else {
            lit_len(&mut bits, u32::from(input[i]));
            i += 1;
        }
    }
    lit_len(&mut bits, 256);
    bits.finish();
    out.len() - start <= budget
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

    fn roundtrip(input: &[u8]) -> usize {
        let mut out = Vec::new();
        assert!(compress(input, &mut out, usize::MAX));
        assert_eq!(inflate(&out, input.len()), input, "len {}", input.len());
        out.len()
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
        // after the probe, not at the budget: bytes 0..128 in a scrambled
        // order, each followed by a byte of noise (few repeats).
        let spread: Vec<u8> = crate::testutil::noise(5, 4000)
            .iter()
            .enumerate()
            .map(|(i, b)| {
                if i % 2 == 0 {
                    b & 0x7f
                } else {
                    (i / 2 * 37 % 128) as u8
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
