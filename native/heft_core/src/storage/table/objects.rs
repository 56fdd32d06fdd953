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

use std::collections::HashSet;

use super::{record_in, Prepared};
use crate::arena::Arena;
use crate::codec;
use crate::compress::{self, Codec};
use crate::dict::Dictionaries;

/// The uncompressed body of the record at `loc`; `None` if it cannot be
/// inflated.
fn stored_raw(arena: &Arena, dicts: &Dictionaries, loc: u64) -> Option<Vec<u8>> {
    with_raw_body(arena, dicts, loc, &mut Vec::new(), <[u8]>::to_vec)
}

/// `f` of the uncompressed body of the record at `loc`, inflated into
/// `scratch` if need be; `None` if it cannot be inflated.
pub(super) fn with_raw_body<R>(
    arena: &Arena,
    dicts: &Dictionaries,
    loc: u64,
    scratch: &mut Vec<u8>,
    f: impl FnOnce(&[u8]) -> R,
) -> Option<R> {
    let (h, rec) = record_in(arena, loc);
    let stored = &rec[h.body_start()..];
    compress::unpack(&h, stored, dicts, scratch).ok().map(f)
}

/// The form of the record at `loc` that [`Prepared::normalized`] forms
/// compare with: canonical, zeros' signs ignored.
fn stored_normalized(arena: &Arena, dicts: &Dictionaries, loc: u64) -> Option<Vec<u8>> {
    let (h, rec) = record_in(arena, loc);
    let key = &rec[h.key_start()..h.body_start()];
    codec::canonical(&stored_raw(arena, dicts, loc)?, Some(key), true).ok()
}

/// Does the record at `loc` (of the same key) hold an object matching `r`?
/// A stored record that cannot be read back counts as different.
pub(super) fn same_stored(arena: &Arena, dicts: &Dictionaries, loc: u64, r: &Prepared) -> bool {
    if let Some(form) = &r.normalized {
        return stored_normalized(arena, dicts, loc).is_some_and(|f| &f == form);
    }
    let (h, rec) = record_in(arena, loc);
    let stored = &rec[h.body_start()..];
    if h.raw_len != r.raw_len {
        return false;
    }
    match h.codec {
        Codec::Raw => stored == r.raw_body(),
        // Equal compressed bytes (of one codec and dictionary) decompress
        // to equal bodies.
        _ if r.packed
            == (compress::Packed {
                codec: h.codec,
                dict: h.dict,
            })
            && stored == r.stored_body() =>
        {
            true
        }
        _ => stored_raw(arena, dicts, loc).is_some_and(|body| body == r.raw_body()),
    }
}

/// What a prepared object is compared by, among objects of its key: its
/// normalized form if it has one, else its body. (An object holding a float
/// zero never matches one that holds none.)
fn form(r: &Prepared) -> (bool, &[u8]) {
    match &r.normalized {
        Some(f) => (true, f),
        None => (false, r.raw_body()),
    }
}

/// Stored objects of a key up to which a new one is compared with each;
/// past it, the stored objects' forms go into sets once.
const ONE_BY_ONE: usize = 8;

/// The objects of one bag key, those stored and those a batch adds, to
/// tell whether another object of the key is new: by looking its form up
/// in sets, so that a batch costs O(1) an object instead of a comparison
/// with every earlier one. Small (most keys of a batch get one object and
/// have none stored): the sets live apart, made when first needed.
pub(super) struct KeyObjects<'r> {
    stored: Vec<u64>,
    /// The first object added.
    first: Option<(bool, &'r [u8])>,
    more: Option<Box<Sets<'r>>>,
}

#[derive(Default)]
struct Sets<'r> {
    /// Objects added after the first.
    joining: HashSet<(bool, &'r [u8])>,
    /// The stored objects' bodies and normalized forms, built when first
    /// needed (unreadable records left out: they match nothing).
    stored_raw: Option<HashSet<Vec<u8>>>,
    stored_normalized: Option<HashSet<Vec<u8>>>,
}

impl<'r> KeyObjects<'r> {
    /// The key whose stored records are at `stored`.
    pub(super) fn new(stored: Vec<u64>) -> Self {
        KeyObjects {
            stored,
            first: None,
            more: None,
        }
    }

    /// Adds `r` (of this key) unless an object stored or added already
    /// matches it; true if added.
    pub(super) fn add(&mut self, arena: &Arena, dicts: &Dictionaries, r: &'r Prepared) -> bool {
        let f = form(r);
        let added =
            self.first == Some(f) || self.more.as_ref().is_some_and(|m| m.joining.contains(&f));
        if added || self.stores(arena, dicts, r) {
            return false;
        }
        match self.first {
            None => self.first = Some(f),
            Some(_) => {
                self.more
                    .get_or_insert_with(Default::default)
                    .joining
                    .insert(f);
            }
        }
        true
    }

    /// Is an object matching `r` stored?
    fn stores(&mut self, arena: &Arena, dicts: &Dictionaries, r: &Prepared) -> bool {
        let stored = &self.stored;
        if stored.len() <= ONE_BY_ONE {
            return stored.iter().any(|&loc| same_stored(arena, dicts, loc, r));
        }
        let set = |f: fn(&Arena, &Dictionaries, u64) -> Option<Vec<u8>>| {
            stored
                .iter()
                .filter_map(|&loc| f(arena, dicts, loc))
                .collect()
        };
        let sets = self.more.get_or_insert_with(Default::default);
        match &r.normalized {
            Some(n) => sets
                .stored_normalized
                .get_or_insert_with(|| set(stored_normalized))
                .contains(n),
            None => sets
                .stored_raw
                .get_or_insert_with(|| set(stored_raw))
                .contains(r.raw_body()),
        }
    }
}
