//! The index's key hash: a keyed multiply-fold hash over the key's bytes.
//!
//! The index orders entries by hash and takes a key's home slot from the
//! hash's top bits, so it needs well-mixed 64-bit hashes; it does not need
//! a cryptographic PRF. SipHash (std's default) cost 15-20 ns a short key
//! here; this costs 2-4. Each table draws its own random key, so the
//! order of a table and which keys collide cannot be predicted from
//! outside (the same defence as std's RandomState).

use std::hash::{BuildHasher, RandomState};

const K: u64 = 0x9E37_79B9_7F4A_7C15;

/// A per-table hash key.
#[derive(Clone, Copy, Debug)]
pub struct KeyedHash {
    seed: [u64; 2],
}

impl KeyedHash {
    /// A hash keyed from the OS's randomness (via std's RandomState).
    pub fn random() -> KeyedHash {
        let s = RandomState::new();
        KeyedHash {
            seed: [s.hash_one(1u64) | 1, s.hash_one(2u64) | 1],
        }
    }

    /// A hash with a fixed key (tests and benchmarks).
    pub fn with_seed(a: u64, b: u64) -> KeyedHash {
        KeyedHash {
            seed: [a | 1, b | 1],
        }
    }

    /// The key, to be stored (a persistent table keeps its key so that a
    /// reopened table orders its index as its snapshot is ordered).
    pub fn key(&self) -> [u64; 2] {
        self.seed
    }

    /// The hash with a key from [`KeyedHash::key`].
    pub fn from_key(key: [u64; 2]) -> KeyedHash {
        KeyedHash::with_seed(key[0], key[1])
    }

    /// The hash of `data`.
    #[inline]
    pub fn hash(&self, data: &[u8]) -> u64 {
        let [s0, s1] = self.seed;
        let mut h = s0 ^ (data.len() as u64).wrapping_mul(K);
        let mut chunks = data.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            h = fold(h ^ u64::from_le_bytes(w), s1 ^ K);
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            h = fold(h ^ tail(rest), s1);
        }
        fold(h, s0 ^ K)
    }
}

/// The 1 to 7 bytes of `rest` as a little-endian word, zero above them
/// (what copying them into a zeroed `[u8; 8]` gives), by two loads that
/// may overlap instead of a variable-length copy (a call to `memcpy`).
#[inline]
fn tail(rest: &[u8]) -> u64 {
    let n = rest.len();
    debug_assert!((1..8).contains(&n));
    if n >= 4 {
        // Bytes 0..4 and n-4..n: the overlap holds the same bytes in both.
        let (lo, hi) = (u32_at(rest, 0), u32_at(rest, n - 4));
        u64::from(lo) | u64::from(hi) << (8 * (n - 4))
    } else if n >= 2 {
        u64::from(u16_at(rest, 0)) | u64::from(u16_at(rest, n - 2)) << (8 * (n - 2))
    } else {
        u64::from(rest[0])
    }
}

#[inline]
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[inline]
fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

/// The 128-bit product of `a` and `b`, folded to 64 bits.
#[inline]
fn fold(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    (p as u64) ^ ((p >> 64) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_bytes_hash_equal_and_length_matters() {
        let h = KeyedHash::with_seed(1, 2);
        assert_eq!(h.hash(b"abc"), h.hash(b"abc"));
        assert_ne!(h.hash(b"abc"), h.hash(b"abd"));
        assert_ne!(h.hash(b""), h.hash(b"\0"));
        assert_ne!(h.hash(b"\0"), h.hash(b"\0\0"));
        assert_ne!(KeyedHash::with_seed(3, 4).hash(b"abc"), h.hash(b"abc"));
    }

    /// The hash as first written: the tail copied into a zeroed word.
    fn hash_by_copy(h: &KeyedHash, data: &[u8]) -> u64 {
        let [s0, s1] = h.seed;
        let mut x = s0 ^ (data.len() as u64).wrapping_mul(K);
        let mut chunks = data.chunks_exact(8);
        for c in &mut chunks {
            x = fold(x ^ u64::from_le_bytes(c.try_into().unwrap()), s1 ^ K);
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            x = fold(x ^ u64::from_le_bytes(w), s1);
        }
        fold(x, s0 ^ K)
    }

    #[test]
    fn hashes_stay_those_of_the_copied_tail_at_every_length() {
        // Persistent tables keep their index in hash order across versions:
        // the tail's loads must give the very hash the copy gave.
        let h = KeyedHash::with_seed(0x1234_5678_9abc_def0, 0x0fed_cba9_8765_4321);
        let data: Vec<u8> = (0..64u32).map(|i| (i * 37 + 11) as u8 | 0x80).collect();
        for len in 0..=data.len() {
            for start in 0..8.min(data.len() - len + 1) {
                let d = &data[start..start + len];
                assert_eq!(h.hash(d), hash_by_copy(&h, d), "len {len} start {start}");
            }
        }
    }

    #[test]
    fn top_bits_spread_evenly_over_sequential_keys() {
        // The index takes home slots from the top bits: 1M small-int keys
        // (encoded as the codec does) must fill 1,024 buckets evenly.
        let h = KeyedHash::random();
        let mut buckets = vec![0u32; 1024];
        for i in 0..1_000_000u64 {
            let key = crate::codec::Value::Int(i as i64).to_bytes();
            buckets[(h.hash(&key) >> 54) as usize] += 1;
        }
        let expected = 1_000_000.0 / 1024.0;
        let chi2: f64 = buckets
            .iter()
            .map(|&b| (f64::from(b) - expected).powi(2) / expected)
            .sum();
        // 1,023 degrees of freedom: the 99.9th percentile is about 1,168.
        assert!(chi2 < 1_200.0, "chi-square {chi2}");
    }
}
