//! Helpers shared by the unit tests.

/// `len` bytes of xorshift32 noise from `seed` (nonzero): incompressible,
/// and the same for the same seed.
pub fn noise(seed: u32, len: usize) -> Vec<u8> {
    let mut x = seed.max(1);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}
