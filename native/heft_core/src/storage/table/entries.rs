//! A table's key index, whatever its kind: the hash index for set, bag and
//! duplicate_bag tables, the ordered index for ordered_set tables, behind
//! one set of operations on positions. Keys are read from the arena.
//!
//! Hash tables keep a key's entries next to each other, in insertion order
//! (one entry a set, any number a bag); an ordered_set has one entry a key,
//! keys being equal when they compare equal in term order (`1 == 1.0`).

use std::cell::Cell;
use std::cmp::Ordering;

use super::{key_in, record_in, Direction, Kind};
use crate::arena::Arena;
use crate::atoms::AtomTable;
use crate::hash::KeyedHash;
use crate::index::{HashIndex, Inserted, Relaid, Retired, Slot};
use crate::order;
use crate::ordered::{self, OrderedIndex};
use crate::record::Header;

/// How keys are told apart and ordered.
#[derive(Clone, Copy)]
pub(super) enum Order<'a> {
    /// By their bytes (hash tables: equal keys have equal bytes).
    Bytes,
    /// In Erlang term order, with atom names from the dictionary.
    Term(&'a AtomTable),
}

impl Order<'_> {
    /// The key stored at some loc against the key looked for.
    pub(super) fn cmp(self, stored: &[u8], key: &[u8]) -> Ordering {
        match self {
            Order::Bytes => stored.cmp(key),
            Order::Term(names) => order::compare(stored, key, |id| names.name(id).unwrap_or("")),
        }
    }

    /// The ordered index's probe for `key`: its prefix and its comparison
    /// with the key at a loc.
    fn probe<'k>(
        self,
        arena: &'k Arena,
        key: &'k [u8],
    ) -> ordered::Probe<impl FnMut(u64) -> Ordering + 'k>
    where
        Self: 'k,
    {
        ordered::Probe {
            prefix: self.prefix(key),
            cmp: move |l| self.cmp(key_in(arena, l), key),
        }
    }

    /// The ordered index's prefix of `key` (see [`order::prefix`]).
    fn prefix(self, key: &[u8]) -> Option<u64> {
        match self {
            Order::Bytes => None,
            Order::Term(names) => order::prefix(key, |id| names.name(id).unwrap_or("")),
        }
    }
}

/// A key found in the index ([`Entries::find_record`]).
pub(super) struct Found<'a> {
    /// Its first entry.
    pub pos: Pos,
    /// How many entries it has (objects: several in a bag).
    pub n: usize,
    /// The hash kept with its first entry ([`Entries::hash`]).
    pub hash: u64,
    /// The first entry's record: where, its header, its bytes.
    pub loc: u64,
    pub header: Header,
    pub bytes: &'a [u8],
}

/// Reads records for a search, remembering the last one read: the search
/// compares the key it stops at once more, and its caller copies that
/// record out, and neither parses its header again.
struct LastRead<'a> {
    arena: &'a Arena,
    last: Cell<Option<(u64, Header, &'a [u8])>>,
}

impl<'a> LastRead<'a> {
    fn new(arena: &'a Arena) -> Self {
        LastRead {
            arena,
            last: Cell::new(None),
        }
    }

    fn record(&self, loc: u64) -> (Header, &'a [u8]) {
        if let Some((l, h, bytes)) = self.last.get() {
            if l == loc {
                return (h, bytes);
            }
        }
        let (h, bytes) = record_in(self.arena, loc);
        self.last.set(Some((loc, h, bytes)));
        (h, bytes)
    }

    fn key(&self, loc: u64) -> &'a [u8] {
        let (h, bytes) = self.record(loc);
        &bytes[h.key_start()..h.body_start()]
    }
}

/// The most entries [`Entries::batch_after`] finds at once.
pub(super) const AHEAD_BATCH: usize = 32;

/// An entry's position; good until the next change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Pos {
    Hash(usize),
    Ordered(ordered::Pos),
}

/// The index itself; a hash index with the table's key hash (its slots
/// keep only the top bits of a hash: the rest is the key's, recomputed).
pub(super) enum Entries {
    Hash(HashIndex, KeyedHash),
    Ordered(OrderedIndex),
}

impl Entries {
    pub(super) fn new(kind: Kind, label: &str, hasher: KeyedHash) -> Entries {
        match kind {
            Kind::OrderedSet => Entries::Ordered(OrderedIndex::new(label)),
            _ => Entries::Hash(HashIndex::new(label), hasher),
        }
    }

    /// Replaces the key hash (of an empty table).
    pub(super) fn set_hasher(&mut self, new: KeyedHash) {
        if let Entries::Hash(_, hasher) = self {
            *hasher = new;
        }
    }

    /// Number of entries (objects).
    pub(super) fn len(&self) -> usize {
        match self {
            Entries::Hash(ix, _) => ix.len(),
            Entries::Ordered(ix) => ix.len(),
        }
    }

    /// Bytes the index holds (see each index's `heap_bytes`).
    pub(super) fn heap_bytes(&self) -> u64 {
        match self {
            Entries::Hash(ix, _) => ix.heap_bytes(),
            Entries::Ordered(ix) => ix.heap_bytes(),
        }
    }

    /// Start address of the index's memfd mapping.
    pub(super) fn address(&self) -> usize {
        match self {
            Entries::Hash(ix, _) => ix.address(),
            Entries::Ordered(ix) => ix.address(),
        }
    }

    /// True if adding `added()` entries (at most `at_most`) or removing
    /// `removed` could resize the index, and the index holds more than
    /// `slots` slots (an ordered index changes a block or two at a time:
    /// never). `added` is counted only when the bound `at_most` could
    /// resize (the answer grows with the entries added).
    pub(super) fn would_resize_over(
        &self,
        slots: usize,
        at_most: usize,
        added: impl FnOnce() -> usize,
        removed: usize,
    ) -> bool {
        match self {
            Entries::Hash(ix, _) => {
                ix.capacity() > slots
                    && ix.would_resize(at_most, removed)
                    && ix.would_resize(added(), removed)
            }
            Entries::Ordered(_) => false,
        }
    }

    /// A hash index larger than `slots` that a change adding up to `added`
    /// entries or removing up to `removed` would resize: that resize, made
    /// ahead from `&self` ([`HashIndex::relaid_for`]).
    pub(super) fn relaid_for(&self, slots: usize, added: usize, removed: usize) -> Option<Relaid> {
        match self {
            Entries::Hash(ix, _) if ix.capacity() > slots => ix.relaid_for(added, removed),
            _ => None,
        }
    }

    /// Puts a resize [`Entries::relaid_for`] made in place; returns the
    /// old array to unmap.
    pub(super) fn install(&mut self, r: Relaid) -> Option<Retired> {
        match self {
            Entries::Hash(ix, _) => ix.install(r),
            Entries::Ordered(_) => None,
        }
    }

    pub(super) fn clear(&mut self) {
        match self {
            Entries::Hash(ix, _) => ix.clear(),
            Entries::Ordered(ix) => ix.clear(),
        }
    }

    /// Fills an empty hash index at once (bulk loading): `slots` sorted by
    /// (hash, key), a bag's entries of one key in their order. An ordered
    /// index is filled entry by entry instead.
    pub(super) fn build_sorted(&mut self, slots: &[Slot]) {
        if let Entries::Hash(ix, _) = self {
            ix.build_sorted(slots);
        }
    }

    /// The loc at a valid position.
    #[inline]
    pub(super) fn loc(&self, pos: Pos) -> u64 {
        match (self, pos) {
            (Entries::Hash(ix, _), Pos::Hash(p)) => ix.get(p).unwrap_or(0),
            (Entries::Ordered(ix), Pos::Ordered(p)) => ix.get(p).unwrap_or(0),
            _ => 0,
        }
    }

    /// The hash of a stored key as the index orders it (0 in an ordered
    /// index, which has none).
    pub(super) fn hash_of(&self, key: &[u8]) -> u64 {
        match self {
            Entries::Hash(_, hasher) => hasher.hash(key),
            Entries::Ordered(_) => 0,
        }
    }

    /// Packs an ordered index's blocks a window at a time (see
    /// [`crate::ordered::OrderedIndex::pack`]); a hash index sizes itself.
    pub(super) fn pack(&mut self, from: usize, budget: usize) -> Option<usize> {
        match self {
            Entries::Ordered(ix) => ix.pack(from, budget),
            Entries::Hash(..) => None,
        }
    }

    /// Points a valid position at another record of the same key.
    pub(super) fn set_loc(&mut self, pos: Pos, loc: u64) {
        match (self, pos) {
            (Entries::Hash(ix, _), Pos::Hash(p)) => ix.set_loc(p, loc),
            (Entries::Ordered(ix), Pos::Ordered(p)) => ix.set_loc(p, loc),
            _ => {}
        }
    }

    /// The first entry of `key` and how many it has (several in a bag).
    pub(super) fn find(
        &self,
        arena: &Arena,
        ord: Order,
        hash: u64,
        key: &[u8],
    ) -> Option<(Pos, usize)> {
        let (pos, _, n) = self.locate(&LastRead::new(arena), ord, hash, key)?;
        Some((pos, n))
    }

    /// [`Entries::find`], with the first entry's record: one search of the
    /// index and one read of each record compared, the one found included.
    pub(super) fn find_record<'a>(
        &self,
        arena: &'a Arena,
        ord: Order,
        hash: u64,
        key: &[u8],
    ) -> Option<Found<'a>> {
        let read = LastRead::new(arena);
        let (pos, loc, n) = self.locate(&read, ord, hash, key)?;
        let (header, bytes) = read.record(loc);
        Some(Found {
            pos,
            n,
            hash,
            loc,
            header,
            bytes,
        })
    }

    /// The first entry of `key`, its loc and the key's number of entries.
    fn locate(
        &self,
        read: &LastRead,
        ord: Order,
        hash: u64,
        key: &[u8],
    ) -> Option<(Pos, u64, usize)> {
        match self {
            Entries::Hash(ix, hasher) => {
                let (p, n) = ix.find_all(hash, by_hash(|l| read.key(l), hasher, hash, key))?;
                Some((Pos::Hash(p), ix.get(p)?, n))
            }
            Entries::Ordered(ix) => {
                let p = ix.find(ordered::Probe {
                    prefix: ord.prefix(key),
                    cmp: |l| ord.cmp(read.key(l), key),
                })?;
                Some((Pos::Ordered(p), ix.get(p)?, 1))
            }
        }
    }

    /// The last entry of the key of the entry at `pos` (in a bag, where a
    /// key's entries sit together; elsewhere `pos` itself).
    pub(super) fn last_of_key(&self, arena: &Arena, pos: Pos) -> Pos {
        match (self, pos) {
            (Entries::Hash(ix, _), Pos::Hash(p)) => {
                let Some(loc) = ix.get(p) else { return pos };
                let key = key_in(arena, loc);
                let same = |q: usize| ix.get(q).is_some_and(|t| key_in(arena, t) == key);
                Pos::Hash(p + (p + 1..).take_while(|&q| same(q)).count())
            }
            _ => pos,
        }
    }

    /// The first entry of the key after `pos`'s in walk order (a bag
    /// key's entries are together).
    pub(super) fn next_key(&self, arena: &Arena, pos: Pos) -> Option<Pos> {
        self.next(self.last_of_key(arena, pos))
    }

    /// The `i`th entry of a key whose first entry is at `pos`.
    pub(super) fn nth(pos: Pos, i: usize) -> Pos {
        match pos {
            Pos::Hash(p) => Pos::Hash(p + i),
            // One entry a key.
            other => other,
        }
    }

    /// Removes the entry at a valid position; returns its loc.
    pub(super) fn remove_at(&mut self, pos: Pos) -> u64 {
        match (self, pos) {
            (Entries::Hash(ix, _), Pos::Hash(p)) => ix.remove_at(p),
            (Entries::Ordered(ix), Pos::Ordered(p)) => ix.remove_at(p).unwrap_or(0),
            _ => 0,
        }
    }

    /// Removes, of the `n` entries of a key from `pos` on, those whose loc
    /// `remove` picks (in one pass); returns their locs in order.
    pub(super) fn remove_where(
        &mut self,
        pos: Pos,
        n: usize,
        mut remove: impl FnMut(u64) -> bool,
    ) -> Vec<u64> {
        match (self, pos) {
            (Entries::Hash(ix, _), Pos::Hash(p)) => ix.remove_if(p, n, remove),
            (Entries::Ordered(ix), Pos::Ordered(p)) => match ix.get(p) {
                Some(loc) if remove(loc) => ix.remove_at(p).into_iter().collect(),
                _ => Vec::new(),
            },
            _ => Vec::new(),
        }
    }

    /// Adds the record at `loc` with this key: after the key's entries in a
    /// bag (`append`), else in place of an equal key's entry, whose loc is
    /// returned.
    pub(super) fn add(
        &mut self,
        arena: &Arena,
        ord: Order,
        append: bool,
        hash: u64,
        key: &[u8],
        loc: u64,
    ) -> Option<u64> {
        let replaced = match self {
            Entries::Hash(ix, hasher) if append => {
                ix.append(hash, loc, by_hash(|l| key_in(arena, l), hasher, hash, key));
                Inserted::New
            }
            Entries::Hash(ix, hasher) => {
                ix.insert(hash, loc, by_hash(|l| key_in(arena, l), hasher, hash, key))
            }
            Entries::Ordered(ix) => ix.insert(loc, ord.probe(arena, key)),
        };
        match replaced {
            Inserted::Replaced(old) => Some(old),
            Inserted::New => None,
        }
    }

    /// The bits of a key hash that number a hash index's buckets (there
    /// are `2^bits`); `None` for an ordered index.
    pub(super) fn slot_bits(&self) -> Option<u32> {
        match self {
            Entries::Hash(ix, _) => Some(ix.bits()),
            Entries::Ordered(_) => None,
        }
    }

    /// How many slots `slot/2` numbers: in a hash index `2^bits` (`bits`
    /// defaults to the index's own [`Entries::slot_bits`]), in an ordered
    /// index its entries.
    pub(super) fn slot_count(&self, bits: Option<u32>) -> usize {
        match self {
            Entries::Hash(ix, _) => 1 << bits.unwrap_or(ix.bits()),
            Entries::Ordered(ix) => ix.len(),
        }
    }

    /// The entries of slot `i` (below [`Entries::slot_count`]) in walk
    /// order: those of a hash index whose hash begins with the `bits` bits
    /// of `i`, or the `i`-th entry of an ordered index.
    pub(super) fn slot_entries(&self, arena: &Arena, i: usize, bits: Option<u32>) -> Vec<Pos> {
        match self {
            Entries::Hash(ix, hasher) => {
                let bits = bits.unwrap_or(ix.bits());
                // With more bits than the slots keep, neighbouring slots'
                // entries are told apart by their keys' hashes.
                let exact = bits <= ix.hash_bits();
                let ours = |l| exact || hasher.hash(key_in(arena, l)) >> (64 - bits) == i as u64;
                ix.prefix_run(i as u64, bits)
                    .filter(|&p| ix.get(p).is_some_and(ours))
                    .map(Pos::Hash)
                    .collect()
            }
            Entries::Ordered(ix) => ix.nth(i).map(Pos::Ordered).into_iter().collect(),
        }
    }

    pub(super) fn first(&self) -> Option<Pos> {
        match self {
            Entries::Hash(ix, _) => ix.next_occupied(0).map(Pos::Hash),
            Entries::Ordered(ix) => ix.first().map(Pos::Ordered),
        }
    }

    /// The last entry: the greatest key of an ordered index; the first
    /// entry of a hash index (ETS's `last/1` of a hash table is `first/1`).
    pub(super) fn last(&self) -> Option<Pos> {
        match self {
            Entries::Hash(..) => self.first(),
            Entries::Ordered(ix) => ix.last().map(Pos::Ordered),
        }
    }

    #[inline]
    pub(super) fn next(&self, pos: Pos) -> Option<Pos> {
        match (self, pos) {
            (Entries::Hash(ix, _), Pos::Hash(p)) => ix.next_occupied(p + 1).map(Pos::Hash),
            (Entries::Ordered(ix), Pos::Ordered(p)) => ix.next(p).map(Pos::Ordered),
            _ => None,
        }
    }

    /// Fills `out` with the entries after `pos` in walk order (`back`:
    /// before it, as [`Entries::prev`] steps) and their locations; how
    /// many (fewer than `out.len()` only at the end).
    pub(super) fn batch_after(&self, pos: Pos, back: bool, out: &mut [(Pos, u64)]) -> usize {
        if let (Entries::Hash(ix, _), Pos::Hash(p)) = (self, pos) {
            let mut found = [(0usize, 0u64); AHEAD_BATCH];
            let n = ix.occupied_batch(p + 1, &mut found[..out.len().min(AHEAD_BATCH)]);
            for (o, &(q, loc)) in out.iter_mut().zip(&found[..n]) {
                *o = (Pos::Hash(q), loc);
            }
            return n;
        }
        let mut at = pos;
        for (n, o) in out.iter_mut().enumerate() {
            let next = if back { self.prev(at) } else { self.next(at) };
            let Some(next) = next else { return n };
            *o = (next, self.loc(next));
            at = next;
        }
        out.len()
    }

    /// The entry before: the next smaller key of an ordered index; the next
    /// entry of a hash index (as `next/2`, like ETS's `prev/2` there).
    #[inline]
    pub(super) fn prev(&self, pos: Pos) -> Option<Pos> {
        match (self, pos) {
            (Entries::Hash(..), _) => self.next(pos),
            (Entries::Ordered(ix), Pos::Ordered(p)) => ix.prev(p).map(Pos::Ordered),
            _ => None,
        }
    }

    /// In an ordered index, the first entry for whose key `before` is
    /// false, where `before` holds for a prefix of the keys in order (a
    /// binary search); `None` if it holds for all. A hash index has no
    /// order: its first entry.
    pub(super) fn partition_point(&self, before: impl Fn(u64) -> bool) -> Option<Pos> {
        match self {
            Entries::Hash(..) => self.first(),
            Entries::Ordered(ix) => {
                let (pos, _) = ix.seek(|l| {
                    if before(l) {
                        Ordering::Less
                    } else {
                        Ordering::Greater
                    }
                });
                ix.get(pos).map(|_| Pos::Ordered(pos))
            }
        }
    }

    /// The first entry after every entry of `key` in walk order
    /// (`Forward`), or in an ordered index the last entry before `key`
    /// (`Backward`), whether or not `key` is present. A hash index walks
    /// forward either way, as ETS's `prev/2` is its `next/2` there.
    pub(super) fn seek(
        &self,
        arena: &Arena,
        ord: Order,
        dir: Direction,
        hash: u64,
        key: &[u8],
    ) -> Option<Pos> {
        match (self, dir) {
            (Entries::Hash(ix, hasher), _) => {
                let p = ix.seek_after(hash, by_hash(|l| key_in(arena, l), hasher, hash, key));
                ix.next_occupied(p).map(Pos::Hash)
            }
            (Entries::Ordered(ix), Direction::Forward) => {
                ix.seek_after(ord.probe(arena, key)).map(Pos::Ordered)
            }
            (Entries::Ordered(ix), Direction::Backward) => {
                ix.seek_before(ord.probe(arena, key)).map(Pos::Ordered)
            }
        }
    }
}

/// How a hash index compares the entry at a loc with (`hash`, `key`): by
/// hash, then key, the stored key's hash recomputed only when the keys
/// differ (the index asks only about entries whose kept hash bits tie).
fn by_hash<'a>(
    key_at: impl Fn(u64) -> &'a [u8] + 'a,
    hasher: &'a KeyedHash,
    hash: u64,
    key: &'a [u8],
) -> impl Fn(u64) -> Ordering + 'a {
    move |l| {
        let stored = key_at(l);
        if stored == key {
            Ordering::Equal
        } else {
            (hasher.hash(stored), stored).cmp(&(hash, key))
        }
    }
}
