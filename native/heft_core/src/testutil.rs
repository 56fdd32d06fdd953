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

/// A small xorshift generator for randomized tests, so that a failure
/// reproduces from its seed (xorshift64; the seed must not be 0).
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number below `n` (not quite uniform; fine for tests).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// One of `xs`.
    pub fn pick<T: Clone>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize].clone()
    }
}
