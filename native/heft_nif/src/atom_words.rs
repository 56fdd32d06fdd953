//! A table's atom ids -> atoms, readable without a lock: the decoder reads
//! one slot per atom it builds. Segments double in size and never move once
//! made, and each slot is set once (an id never changes meaning), so a
//! reader races with nobody; an empty slot sends the caller to the
//! dictionary, which fills it.

use std::sync::OnceLock;

use rustler::sys::ErlNifTerm;
use rustler::Atom;

/// Slots of the first segment; segment `k` has `FIRST << k`.
const FIRST: usize = 64;
/// Enough segments for every `u32` id.
const SEGMENTS: usize = 27;

/// Atom words by id.
pub struct AtomWords {
    segments: [OnceLock<Box<[OnceLock<Atom>]>>; SEGMENTS],
}

impl Default for AtomWords {
    fn default() -> Self {
        AtomWords {
            segments: std::array::from_fn(|_| OnceLock::new()),
        }
    }
}

/// The segment and offset of `id`.
#[inline]
fn place(id: u32) -> (usize, usize) {
    let i = id as usize + FIRST;
    let log = (usize::BITS - 1 - i.leading_zeros()) as usize;
    let k = log - FIRST.trailing_zeros() as usize;
    (k, i - (FIRST << k))
}

impl AtomWords {
    /// The word of the atom with this id, if known.
    #[inline]
    pub fn get(&self, id: u32) -> Option<ErlNifTerm> {
        let (k, off) = place(id);
        self.segments[k].get()?[off].get().map(|a| a.as_c_arg())
    }

    /// The atom with this id, if known.
    #[inline]
    pub fn atom(&self, id: u32) -> Option<Atom> {
        let (k, off) = place(id);
        self.segments[k].get()?[off].get().copied()
    }

    /// Records the atom with this id (atoms live as long as the VM, so its
    /// word stays valid in every env). A slot already set keeps its atom,
    /// the same one.
    pub fn set(&self, id: u32, atom: Atom) {
        let (k, off) = place(id);
        let segment =
            self.segments[k].get_or_init(|| (0..FIRST << k).map(|_| OnceLock::new()).collect());
        let _ = segment[off].set(atom);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_map_to_distinct_slots_across_segment_bounds() {
        assert_eq!(place(0), (0, 0));
        assert_eq!(place(63), (0, 63));
        assert_eq!(place(64), (1, 0));
        assert_eq!(place(191), (1, 127));
        assert_eq!(place(192), (2, 0));
        let (k, off) = place(u32::MAX);
        assert!(k < SEGMENTS && off < FIRST << k);
    }
}
