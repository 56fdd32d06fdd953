//! The key index of a set table: an open-addressing hash table kept sorted by
//! hash.
//!
//! Each slot holds a record's 64-bit key hash and its arena offset (16
//! bytes; offset 0 marks an empty slot). A key's home slot is the top `bits`
//! bits of its hash, and collisions probe forward (linear probing, no
//! wrap-around: the array has a tail past the last home slot). Insertion keeps
//! the occupied slots in ascending (hash, key) order, which is Robin Hood
//! ordering with a deterministic tie-break, so:
//! - a lookup stops at the first hash greater than its own;
//! - every entry sits at or after its home slot, with no empty slot between;
//! - the table can be walked in (hash, key) order, and a walk can resume from
//!   any (hash, key), present or not, even after the table has grown: that is
//!   what makes `first/next` and chunked iteration safe while others write.
//!
//! Keys themselves live in the arena; the index compares them through a
//! callback, so it holds no key bytes.
//!
//! The slot array is a memfd mapping of its own (`/memfd:heft-index:<label>`
//! in /proc/PID/maps), not malloc memory, so its size is exact and the
//! kernel's view of it is separable from the rest of the process: growth of
//! the index shows up as growth of RSS, never hidden in memory malloc had
//! already freed, and reports can find it by name.

use std::cmp::Ordering;
use std::ops::{Deref, DerefMut};

use memmap2::MmapMut;

/// One slot: a key hash and the arena offset of its record (0 = empty).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct Slot {
    /// The key's 64-bit hash.
    pub hash: u64,
    /// The record's offset in the arena; 0 for an empty slot.
    pub loc: u64,
}

impl Slot {
    fn is_empty(&self) -> bool {
        self.loc == 0
    }
}

/// What `insert` did.
#[derive(Debug, PartialEq, Eq)]
pub enum Inserted {
    /// A new key.
    New,
    /// The key was there; this was its old record offset.
    Replaced(u64),
}

const MIN_BITS: u32 = 4;
/// The table grows past 80% full.
const LOAD_NUM: usize = 4;
const LOAD_DEN: usize = 5;

/// Zero-filled slots in a memfd mapping.
struct SlotArray {
    map: MmapMut,
    len: usize,
}

impl SlotArray {
    fn new(len: usize, name: &str) -> SlotArray {
        let bytes = (len * std::mem::size_of::<Slot>()).next_multiple_of(4096) as u64;
        // A memfd and a mapping of it only fail when the process is out of
        // descriptors or address space, where a Vec would abort as well.
        let map = crate::arena::memfd(name, bytes)
            .and_then(|f| crate::arena::map_file(&f, bytes, false))
            .expect("mapping the index slot array");
        // Every page gets entries (the array is at least 40% full once
        // built): fault them all in with one madvise rather than one fault
        // each. Best effort (Linux 5.14 and later).
        let _ = map.advise(memmap2::Advice::PopulateWrite);
        SlotArray { map, len }
    }

    fn mapped_bytes(&self) -> usize {
        self.map.len()
    }
}

impl Deref for SlotArray {
    type Target = [Slot];
    fn deref(&self) -> &[Slot] {
        // SAFETY: the mapping is page-aligned (so aligned for Slot), at least
        // `len * 16` bytes long, and zero-filled by the kernel; Slot is
        // repr(C) of two u64, valid for every bit pattern.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().cast::<Slot>(), self.len) }
    }
}

impl DerefMut for SlotArray {
    fn deref_mut(&mut self) -> &mut [Slot] {
        // SAFETY: as in `deref`; `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.map.as_mut_ptr().cast::<Slot>(), self.len) }
    }
}

/// A sorted linear-probing hash index.
pub struct HashIndex {
    slots: SlotArray,
    bits: u32,
    len: usize,
    /// The slot array's memfd name: `heft-index:<label>`.
    name: String,
}

impl Default for HashIndex {
    fn default() -> Self {
        Self::new("")
    }
}

impl HashIndex {
    /// An empty index; `label` names its mapping (see [`crate::arena`]).
    pub fn new(label: &str) -> Self {
        let name = format!("heft-index:{}", crate::arena::sanitize(label));
        HashIndex {
            slots: SlotArray::new(slots_for(MIN_BITS), &name),
            bits: MIN_BITS,
            len: 0,
            name,
        }
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when there are no keys.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Start address of the slot array's mapping (to find it in smaps).
    pub fn address(&self) -> usize {
        self.slots.map.as_ptr() as usize
    }

    /// Bytes of the slot array's mapping (16 bytes a slot, whole pages).
    pub fn heap_bytes(&self) -> u64 {
        self.slots.mapped_bytes() as u64
    }

    #[inline]
    fn home(&self, hash: u64) -> usize {
        (hash >> (64 - self.bits)) as usize
    }

    /// The slot at `pos`.
    pub fn slot(&self, pos: usize) -> Slot {
        self.slots[pos]
    }

    /// The entry at `pos`, or `None` for an empty slot or past the end.
    pub fn get(&self, pos: usize) -> Option<Slot> {
        self.slots.get(pos).filter(|s| !s.is_empty()).copied()
    }

    /// Points the entry at `pos` to a new record offset (same key).
    pub fn set_loc(&mut self, pos: usize, loc: u64) {
        debug_assert!(loc != 0 && !self.slots[pos].is_empty());
        self.slots[pos].loc = loc;
    }

    /// Finds `hash`'s entry; `cmp(loc)` compares the key stored at `loc`
    /// with the one looked for.
    pub fn find(&self, hash: u64, mut cmp: impl FnMut(u64) -> Ordering) -> Option<usize> {
        let (start, end) = self.hash_run(hash);
        let p = start + self.slots[start..end].partition_point(|s| cmp(s.loc) == Ordering::Less);
        (p < end && cmp(self.slots[p].loc) == Ordering::Equal).then_some(p)
    }

    /// The entries with this hash, `[start, end)`: where they are, or would
    /// be. Equal hashes sit together (entries are sorted), so the end is
    /// found by galloping over the slots' hashes, without reading keys: a
    /// bag key with many objects costs O(log n) here.
    fn hash_run(&self, hash: u64) -> (usize, usize) {
        let mut start = self.home(hash);
        // Entries of smaller hashes displaced past this home.
        while let Some(s) = self.slots.get(start) {
            if s.is_empty() || s.hash >= hash {
                break;
            }
            start += 1;
        }
        let in_run = |q: usize| {
            self.slots
                .get(q)
                .is_some_and(|s| !s.is_empty() && s.hash == hash)
        };
        if !in_run(start) {
            return (start, start);
        }
        // `lo` is in the run, `hi` past it.
        let (mut lo, mut step) = (start, 1);
        while in_run(lo + step) {
            lo += step;
            step *= 2;
        }
        let mut hi = lo + step;
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if in_run(mid) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        (start, hi)
    }

    /// Inserts `hash -> loc`, or replaces the offset of an equal key.
    pub fn insert(
        &mut self,
        hash: u64,
        loc: u64,
        mut cmp: impl FnMut(u64) -> Ordering,
    ) -> Inserted {
        debug_assert!(loc != 0);
        if (self.len + 1) * LOAD_DEN > (1usize << self.bits) * LOAD_NUM {
            self.grow();
        }
        loop {
            let mut p = self.home(hash);
            while let Some(s) = self.slots.get(p) {
                if s.is_empty() || s.hash > hash {
                    break;
                }
                if s.hash == hash {
                    match cmp(s.loc) {
                        Ordering::Equal => {
                            let old = s.loc;
                            self.slots[p].loc = loc;
                            return Inserted::Replaced(old);
                        }
                        Ordering::Greater => break,
                        Ordering::Less => {}
                    }
                }
                p += 1;
            }
            if self.put_at(p, Slot { hash, loc }) {
                return Inserted::New;
            }
            // The run reaches the end of the tail: grow and retry.
            self.grow();
        }
    }

    /// Inserts `hash -> loc` after every entry of an equal key, so that
    /// the entries of one key (in a bag table) stay in insertion order.
    pub fn append(&mut self, hash: u64, loc: u64, mut cmp: impl FnMut(u64) -> Ordering) {
        debug_assert!(loc != 0);
        if (self.len + 1) * LOAD_DEN > (1usize << self.bits) * LOAD_NUM {
            self.grow();
        }
        loop {
            let p = self.seek_after(hash, &mut cmp);
            if self.put_at(p, Slot { hash, loc }) {
                return;
            }
            self.grow();
        }
    }

    /// Puts `slot` at `p`, shifting the run `[p, e)` one slot right into
    /// the first empty slot `e`; false (changing nothing) if the run
    /// reaches the end of the tail.
    fn put_at(&mut self, p: usize, slot: Slot) -> bool {
        let empty = self.slots[p.min(self.slots.len())..]
            .iter()
            .position(Slot::is_empty)
            .map(|i| p + i);
        match empty {
            Some(e) => {
                self.slots.copy_within(p..e, p + 1);
                self.slots[p] = slot;
                self.len += 1;
                true
            }
            None => false,
        }
    }

    /// Removes the entry at `pos`, pulling displaced followers back.
    pub fn remove_at(&mut self, pos: usize) -> Slot {
        let removed = self.slots[pos];
        let mut q = pos + 1;
        while let Some(&s) = self.slots.get(q) {
            if s.is_empty() || self.home(s.hash) >= q {
                break;
            }
            self.slots[q - 1] = s;
            q += 1;
        }
        self.slots[q - 1] = Slot::default();
        self.len -= 1;
        if self.bits > MIN_BITS && self.len * 8 < (1usize << self.bits) {
            self.rebuild(self.bits - 1);
        }
        removed
    }

    /// Removes those of the `n` entries from `pos` on for which `remove`
    /// holds, in one pass that also pulls displaced followers back; returns
    /// them in order. (Removing a bag key's k entries one by one would move
    /// the rest of its run k times.)
    pub fn remove_if(
        &mut self,
        pos: usize,
        n: usize,
        mut remove: impl FnMut(&Slot) -> bool,
    ) -> Vec<Slot> {
        let mut removed = Vec::new();
        let mut w = pos;
        let mut q = pos;
        while q < pos + n {
            let Some(&s) = self.slots.get(q) else { break };
            if remove(&s) {
                removed.push(s);
            } else {
                self.slots[w] = s;
                w += 1;
            }
            q += 1;
        }
        if removed.is_empty() {
            return removed;
        }
        // Each follower moves back as far as its home allows; the first one
        // that cannot move ends the run of displaced entries.
        while let Some(&s) = self.slots.get(q) {
            let target = self.home(s.hash).max(w);
            if s.is_empty() || target >= q {
                break;
            }
            self.slots[w..target].fill(Slot::default());
            self.slots[target] = s;
            w = target + 1;
            q += 1;
        }
        self.slots[w..q].fill(Slot::default());
        self.len -= removed.len();
        if self.bits > MIN_BITS && self.len * 8 < (1usize << self.bits) {
            self.rebuild(self.bits - 1);
        }
        removed
    }

    /// The position of the first entry after (`hash`, key) in walk order,
    /// whether or not that key is present. `cmp(loc)` compares the key at
    /// `loc` with the cursor's key.
    pub fn seek_after(&self, hash: u64, mut cmp: impl FnMut(u64) -> Ordering) -> usize {
        let (start, end) = self.hash_run(hash);
        start + self.slots[start..end].partition_point(|s| cmp(s.loc) != Ordering::Greater)
    }

    /// The first occupied position at or after `pos`.
    pub fn next_occupied(&self, pos: usize) -> Option<usize> {
        let rest = self.slots.get(pos..)?;
        rest.iter().position(|s| !s.is_empty()).map(|i| pos + i)
    }

    /// The bits of a key hash that pick its home slot: there are
    /// `2^bits` home slots (buckets).
    pub fn bits(&self) -> u32 {
        self.bits
    }

    /// The positions holding the entries whose hash begins with the
    /// `pbits` bits of `prefix` (`1 <= pbits < 64`, `prefix < 2^pbits`): a
    /// run in walk order, which may include empty slots (between
    /// clusters). Entries are sorted by hash, so they are together whatever
    /// the index's size.
    pub fn prefix_run(&self, prefix: u64, pbits: u32) -> std::ops::Range<usize> {
        debug_assert!((1..64).contains(&pbits) && prefix < 1 << pbits);
        let shift = 64 - pbits;
        let start = self.position_of(prefix << shift);
        let end = if prefix + 1 == 1 << pbits {
            self.slots.len()
        } else {
            self.position_of((prefix + 1) << shift)
        };
        start..end.max(start)
    }

    /// Where the first entry of `hash` or more is, or would be.
    fn position_of(&self, hash: u64) -> usize {
        self.hash_run(hash).0
    }

    /// Drops every entry and shrinks to the initial size.
    pub fn clear(&mut self) {
        self.slots = SlotArray::new(slots_for(MIN_BITS), &self.name);
        self.bits = MIN_BITS;
        self.len = 0;
    }

    fn grow(&mut self) {
        self.rebuild(self.bits + 1);
    }

    fn rebuild(&mut self, bits: u32) {
        let (slots, bits) = place(&self.name, bits, || {
            self.slots.iter().filter(|s| !s.is_empty())
        });
        self.slots = slots;
        self.bits = bits;
    }

    /// Fills an empty index with `entries` at once (bulk loading): they
    /// must be sorted by (hash, key), with no key twice.
    pub fn build_sorted(&mut self, entries: &[Slot]) {
        debug_assert!(self.len == 0);
        let mut bits = MIN_BITS;
        while entries.len() * LOAD_DEN > (1usize << bits) * LOAD_NUM {
            bits += 1;
        }
        let (slots, bits) = place(&self.name, bits, || entries.iter());
        self.slots = slots;
        self.bits = bits;
        self.len = entries.len();
    }
}

/// Lays out entries sorted by (hash, key) in a new slot array of `bits`
/// bits, or more if a run spills past the tail.
fn place<'s, I: Iterator<Item = &'s Slot>>(
    name: &str,
    mut bits: u32,
    entries: impl Fn() -> I,
) -> (SlotArray, u32) {
    'retry: loop {
        let mut slots = SlotArray::new(slots_for(bits), name);
        let mut next = 0usize;
        for s in entries() {
            let p = ((s.hash >> (64 - bits)) as usize).max(next);
            match slots.get_mut(p) {
                Some(slot) => *slot = *s,
                None => {
                    bits += 1;
                    continue 'retry;
                }
            }
            next = p + 1;
        }
        return (slots, bits);
    }
}

/// Home slots plus a tail for runs that spill past the last home slot.
fn slots_for(bits: u32) -> usize {
    let cap = 1usize << bits;
    cap + cap.min(256)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// Keys are u64s stored "in the arena" as loc = key + 1.
    fn key_of(loc: u64) -> u64 {
        loc - 1
    }

    fn check_invariants(ix: &HashIndex) {
        let mut prev: Option<(u64, u64)> = None;
        let mut count = 0;
        for (p, s) in ix.slots.iter().enumerate() {
            if s.is_empty() {
                continue;
            }
            count += 1;
            let home = ix.home(s.hash);
            assert!(p >= home, "entry before its home");
            assert!(
                ix.slots[home..p].iter().all(|s| !s.is_empty()),
                "gap in a run"
            );
            let cur = (s.hash, key_of(s.loc));
            if let Some(prev) = prev {
                assert!(prev < cur, "not sorted");
            }
            prev = Some(cur);
        }
        assert_eq!(count, ix.len());
    }

    /// A bad hash function with many full collisions, to exercise ties.
    fn weak_hash(k: u64) -> u64 {
        (k % 97).wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }

    #[test]
    fn behaves_like_a_map_under_random_operations() {
        let mut ix = HashIndex::default();
        let mut model: BTreeMap<u64, u64> = BTreeMap::new();
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        for step in 0..60_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let k = x % 3000;
            let h = if k % 2 == 0 {
                weak_hash(k)
            } else {
                k.wrapping_mul(0xff51_afd7_ed55_8ccd)
            };
            let cmp = |loc: u64| key_of(loc).cmp(&k);
            match x % 3 {
                0 | 1 => {
                    let r = ix.insert(h, k + 1, cmp);
                    let was = model.insert(k, h);
                    assert_eq!(r == Inserted::New, was.is_none());
                }
                _ => {
                    let found = ix.find(h, cmp);
                    assert_eq!(found.is_some(), model.contains_key(&k));
                    if let Some(p) = found {
                        ix.remove_at(p);
                        model.remove(&k);
                    }
                }
            }
            if step % 5000 == 0 {
                check_invariants(&ix);
            }
        }
        check_invariants(&ix);
        for (&k, &h) in &model {
            assert!(ix.find(h, |loc| key_of(loc).cmp(&k)).is_some());
        }
    }

    #[test]
    fn a_walk_resumes_after_any_cursor_even_across_growth() {
        let mut ix = HashIndex::default();
        let h = |k: u64| k.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        for k in 0..1000 {
            ix.insert(h(k), k + 1, |loc| key_of(loc).cmp(&k));
        }
        // Walk in chunks of 7, inserting new keys between chunks (forcing
        // growth); every original key is seen exactly once.
        let mut seen = Vec::new();
        let mut cursor: Option<(u64, u64)> = None;
        let mut extra = 1000;
        loop {
            let start = match cursor {
                None => 0,
                Some((ch, ck)) => ix.seek_after(ch, |loc| key_of(loc).cmp(&ck)),
            };
            let mut p = start;
            let mut taken = 0;
            while taken < 7 {
                let Some(q) = ix.next_occupied(p) else { break };
                let s = ix.slot(q);
                seen.push(key_of(s.loc));
                cursor = Some((s.hash, key_of(s.loc)));
                taken += 1;
                p = q + 1;
            }
            if taken == 0 {
                break;
            }
            for _ in 0..20 {
                ix.insert(h(extra), extra + 1, |loc| key_of(loc).cmp(&extra));
                extra += 1;
            }
        }
        let mut originals: Vec<u64> = seen.iter().copied().filter(|&k| k < 1000).collect();
        originals.sort_unstable();
        assert_eq!(originals, (0..1000).collect::<Vec<_>>());
        let mut all = seen.clone();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), seen.len(), "no key is seen twice");
    }

    #[test]
    fn appended_entries_of_a_key_stay_together_in_insertion_order() {
        let mut ix = HashIndex::default();
        // Locs 1..: key = loc / 1000, so loc says key and arrival.
        let key = |loc: u64| loc / 1000;
        for round in 0..40u64 {
            for k in 0..200u64 {
                let loc = k * 1000 + round + 1;
                ix.append(weak_hash(k), loc, |l| key(l).cmp(&k));
            }
        }
        assert_eq!(ix.len(), 8000);
        for k in 0..200u64 {
            let p = ix.find(weak_hash(k), |l| key(l).cmp(&k)).unwrap();
            let run: Vec<u64> = (p..p + 40).map(|q| ix.slot(q).loc).collect();
            assert_eq!(run, (1..=40).map(|r| k * 1000 + r).collect::<Vec<_>>());
            assert!(ix.get(p + 40).map_or(true, |s| key(s.loc) != k));
        }
    }

    #[test]
    fn remove_if_takes_any_subset_of_a_run_in_one_pass() {
        let mut ix = HashIndex::default();
        let mut model: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        let key = |loc: u64| loc / 1_000_000;
        let mut x = 0x9E37_79B9_7F4A_7C15_u64;
        let mut next_loc = 1;
        for step in 0..20_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Few keys, weak hashes: long runs and collisions.
            let k = x % 64;
            if x % 5 != 0 {
                let loc = k * 1_000_000 + next_loc;
                next_loc += 1;
                ix.append(weak_hash(k), loc, |l| key(l).cmp(&k));
                model.entry(k).or_default().push(loc);
            } else if let Some(p) = ix.find(weak_hash(k), |l| key(l).cmp(&k)) {
                let n = model[&k].len();
                let parity = step % 2;
                let removed = ix.remove_if(p, n, |s| s.loc % 2 == parity);
                let (gone, kept): (Vec<u64>, Vec<u64>) =
                    model[&k].iter().partition(|&&l| l % 2 == parity);
                assert_eq!(removed.iter().map(|s| s.loc).collect::<Vec<_>>(), gone);
                if kept.is_empty() {
                    model.remove(&k);
                } else {
                    model.insert(k, kept);
                }
            }
            if step % 2000 == 0 {
                check_invariants(&ix);
            }
        }
        check_invariants(&ix);
        for (k, locs) in &model {
            let p = ix.find(weak_hash(*k), |l| key(l).cmp(k)).unwrap();
            let run: Vec<u64> = (p..p + locs.len()).map(|q| ix.slot(q).loc).collect();
            assert_eq!(&run, locs, "key {k}");
        }
        assert_eq!(ix.len(), model.values().map(Vec::len).sum::<usize>());
    }

    #[test]
    fn the_index_shrinks_after_mass_deletion() {
        let mut ix = HashIndex::default();
        let h = |k: u64| k.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        for k in 0..100_000 {
            ix.insert(h(k), k + 1, |loc| key_of(loc).cmp(&k));
        }
        let big = ix.heap_bytes();
        for k in 0..99_990 {
            let p = ix.find(h(k), |loc| key_of(loc).cmp(&k)).unwrap();
            ix.remove_at(p);
        }
        check_invariants(&ix);
        assert!(ix.heap_bytes() * 100 < big, "{} vs {big}", ix.heap_bytes());
        for k in 99_990..100_000 {
            assert!(ix.find(h(k), |loc| key_of(loc).cmp(&k)).is_some());
        }
    }
}
