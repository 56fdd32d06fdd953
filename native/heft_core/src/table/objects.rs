//! Telling apart the objects of one key, for bag and duplicate_bag tables:
//! a bag stores an object only if no object of its key matches it (`=:=`),
//! and `delete_object/2` removes the objects that match.
//!
//! Bag records are written canonically (no back-references, map pairs
//! sorted; docs/term-format.md), so two objects match exactly when their
//! uncompressed bodies are equal. One exception: on VMs where `0.0 =:=
//! -0.0` (OTP 26 and older) bodies keep the sign of zero as given, so an
//! object holding a float zero ([`Prepared::zero_sign_ignored`]) is compared
//! on [`codec::canonical`] forms with zeros normalized.
//!
//! Bodies of the same length stored compressed are inflated to compare
//! them; this happens under the table's write lock.

use super::{record_in, Prepared};
use crate::arena::Arena;
use crate::codec;
use crate::compress::{self, Codec};

/// Does the record at `loc` (of the same key) hold an object matching `r`?
/// A stored record that cannot be read back counts as different.
pub(super) fn same_stored(arena: &Arena, loc: u64, r: &Prepared) -> bool {
    let (h, rec) = record_in(arena, loc);
    let stored = &rec[h.body_start()..];
    let mut scratch = Vec::new();
    let raw = |scratch: &mut Vec<u8>| -> Option<Vec<u8>> {
        match h.codec {
            Codec::Raw => Some(stored.to_vec()),
            Codec::Deflate => {
                compress::decompress(stored, h.raw_len, scratch).ok()?;
                Some(std::mem::take(scratch))
            }
        }
    };
    if let Some(form) = &r.normalized {
        let key = &rec[h.key_start()..h.body_start()];
        return raw(&mut scratch)
            .and_then(|body| codec::canonical(&body, Some(key), true).ok())
            .is_some_and(|f| &f == form);
    }
    if h.raw_len != r.raw_len {
        return false;
    }
    match h.codec {
        Codec::Raw => stored == r.raw_body(),
        // Equal compressed bytes inflate to equal bodies.
        Codec::Deflate if r.codec == Codec::Deflate && stored == r.stored_body() => true,
        Codec::Deflate => raw(&mut scratch).is_some_and(|body| body == r.raw_body()),
    }
}

/// Do two prepared records hold matching objects (of any keys)?
pub(super) fn same_prepared(a: &Prepared, b: &Prepared) -> bool {
    match (&a.normalized, &b.normalized) {
        (Some(x), Some(y)) => x == y,
        // One holds a float zero and the other does not.
        (Some(_), None) | (None, Some(_)) => false,
        (None, None) => a.key() == b.key() && a.raw_body() == b.raw_body(),
    }
}
