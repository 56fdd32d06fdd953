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
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::Relaxed;

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
/// Slots a block of the occupancy counts covers.
const BLOCK: usize = 64;
/// A shrink is refused if it would displace an entry further than this
/// from its home slot (and further than the current layout does): see
/// [`Layout::fits`].
const MAX_SHIFT: usize = 128;

/// Zero-filled slots in a memfd mapping, followed by one byte a block of
/// [`BLOCK`] slots counting the block's entries (so that a walk skips
/// empty stretches 64 slots at a time).
struct SlotArray {
    map: MmapMut,
    len: usize,
}

impl SlotArray {
    fn new(len: usize, name: &str) -> SlotArray {
        let bytes =
            (len * std::mem::size_of::<Slot>() + len.div_ceil(BLOCK)).next_multiple_of(4096) as u64;
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

    /// Entries in each block of slots.
    fn counts(&self) -> &[u8] {
        &self.map[self.len * std::mem::size_of::<Slot>()..][..self.len.div_ceil(BLOCK)]
    }

    fn counts_mut(&mut self) -> &mut [u8] {
        let blocks = self.len.div_ceil(BLOCK);
        &mut self.map[self.len * std::mem::size_of::<Slot>()..][..blocks]
    }

    /// Recounts the entries of the blocks that overlap `range`.
    fn recount(&mut self, range: std::ops::Range<usize>) {
        if range.is_empty() {
            return;
        }
        for b in range.start / BLOCK..=(range.end - 1) / BLOCK {
            let end = ((b + 1) * BLOCK).min(self.len);
            let n = self[b * BLOCK..end]
                .iter()
                .filter(|s| !s.is_empty())
                .count();
            self.counts_mut()[b] = n as u8;
        }
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
///
/// Resizing: the index grows past 80% full, and tries to shrink once it is
/// below an eighth full and has lost half of its entries since it was last
/// laid out (grown, shrunk, or refused a shrink), so that each layout's
/// cost is paid for by as many single-key operations. A shrink is refused
/// when the smaller layout would crowd the entries: deleting keys in walk
/// order leaves the survivors at the top of the hash space, at the density
/// they had, and halving the array would double it (runs longer than the
/// tail, every operation a scan). Such an index keeps its size until its
/// keys spread out again, or empty: memory for speed.
pub struct HashIndex {
    slots: SlotArray,
    bits: u32,
    len: usize,
    /// Below this many entries the index tries to shrink.
    shrink_below: usize,
    /// No entry sits before this slot: a first-then-delete loop starts
    /// each walk where the last one found its first entry, not at slot 0.
    /// Lowered by inserts, raised by walks from the start, which see the
    /// index as it is: under the table's lock no one changes it meanwhile
    /// (concurrent readers store the same value).
    low: AtomicUsize,
    /// Slots and block counts walks have looked at (tests bound it).
    #[cfg(test)]
    scanned: std::sync::atomic::AtomicU64,
    /// Entries laid out or looked at by resizes since the index was made
    /// (what resizing has cost: tests bound it).
    resize_work: u64,
    /// The slot array's memfd name: `heft-index:<label>`.
    name: String,
}

impl Default for HashIndex {
    fn default() -> Self {
        Self::new("")
    }
}

/// Where entries would go in an array of some size, and how far from their
/// homes: measured over the first entry of each hash (later ones of a hash,
/// a bag key's objects, follow it whatever the size).
#[derive(Clone, Copy, Debug, Default)]
struct Layout {
    /// One past the last entry's slot.
    end: usize,
    /// Sum and maximum of the displacements.
    sum: usize,
    max: usize,
    /// Distinct hashes.
    hashes: usize,
}

impl Layout {
    fn add(&mut self, prev: Option<u64>, hash: u64, home: usize, at: usize) {
        if prev != Some(hash) {
            self.sum += at - home;
            self.max = self.max.max(at - home);
            self.hashes += 1;
        }
        self.end = at + 1;
    }

    /// Is this (smaller) layout good enough to replace `current`: no
    /// further from home on average than 2 slots (a uniform array 75%
    /// full), and at most [`MAX_SHIFT`] slots, or no worse than now?
    fn fits(&self, current: &Layout) -> bool {
        self.sum <= (2 * self.hashes).max(current.sum) && self.max <= MAX_SHIFT.max(current.max)
    }
}

impl HashIndex {
    /// An empty index; `label` names its mapping (see [`crate::arena`]).
    pub fn new(label: &str) -> Self {
        let name = format!("heft-index:{}", crate::arena::sanitize(label));
        HashIndex {
            slots: SlotArray::new(slots_for(MIN_BITS, 0), &name),
            bits: MIN_BITS,
            len: 0,
            shrink_below: 0,
            low: AtomicUsize::new(0),
            #[cfg(test)]
            scanned: Default::default(),
            resize_work: 0,
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

    /// Bytes of the slot array's mapping (16 bytes a slot, a byte per 64
    /// slots, whole pages).
    pub fn heap_bytes(&self) -> u64 {
        self.slots.mapped_bytes() as u64
    }

    /// Entries laid out or examined by resizes so far: amortised O(1) an
    /// operation whatever their order (tests and benches check it).
    pub fn resize_work(&self) -> u64 {
        self.resize_work
    }

    /// Slots in the array: what a resize would have to go through.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// True if adding `added` entries, or removing `removed`, could resize
    /// the index (a cost of about [`HashIndex::capacity`]), without
    /// changing anything: for callers that must not take that long.
    pub fn would_resize(&self, added: usize, removed: usize) -> bool {
        let full = self.over_load(added);
        // An insert fills the first empty slot at or after its place: only
        // once the last `added` slots are all taken can a run reach the
        // end of the tail.
        let tail = &self.slots[self.slots.len().saturating_sub(added)..];
        let spills = tail.iter().any(|s| !s.is_empty());
        let left = self.len.saturating_sub(removed);
        (added > 0 && (full || spills)) || (removed > 0 && self.wants_shrink(left))
    }

    /// True if `added` more entries would fill the table past its load
    /// limit (it then grows): the one rule `add_at` and `would_resize` share.
    fn over_load(&self, added: usize) -> bool {
        (self.len + added) * LOAD_DEN > (1usize << self.bits) * LOAD_NUM
    }

    fn wants_shrink(&self, len: usize) -> bool {
        self.bits > MIN_BITS && (len < self.shrink_below || len == 0)
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
    /// be. From the hash's home slot, the entries of smaller hashes
    /// displaced past it and then those of equal hashes form a prefix of
    /// the run (entries are sorted, and an empty slot ends a run), so both
    /// ends are found by galloping over the slots' hashes, without reading
    /// keys: a bag key with many objects, or a crowd of them, costs
    /// O(log n) here.
    fn hash_run(&self, hash: u64) -> (usize, usize) {
        let taken = |q: usize, f: fn(u64, u64) -> bool| {
            self.slots
                .get(q)
                .is_some_and(|s| !s.is_empty() && f(s.hash, hash))
        };
        let start = gallop(self.home(hash), |q| taken(q, |h, hash| h < hash));
        (start, gallop(start, |q| taken(q, |h, hash| h == hash)))
    }

    /// Inserts `hash -> loc`, or replaces the offset of an equal key.
    pub fn insert(
        &mut self,
        hash: u64,
        loc: u64,
        mut cmp: impl FnMut(u64) -> Ordering,
    ) -> Inserted {
        debug_assert!(loc != 0);
        let (start, end) = self.hash_run(hash);
        let p = start + self.slots[start..end].partition_point(|s| cmp(s.loc) == Ordering::Less);
        if p < end && cmp(self.slots[p].loc) == Ordering::Equal {
            let old = self.slots[p].loc;
            self.slots[p].loc = loc;
            return Inserted::Replaced(old);
        }
        self.add_at(p, Slot { hash, loc }, cmp);
        Inserted::New
    }

    /// Inserts `hash -> loc` after every entry of an equal key, so that
    /// the entries of one key (in a bag table) stay in insertion order.
    pub fn append(&mut self, hash: u64, loc: u64, mut cmp: impl FnMut(u64) -> Ordering) {
        debug_assert!(loc != 0);
        let p = self.seek_after(hash, &mut cmp);
        self.add_at(p, Slot { hash, loc }, cmp);
    }

    /// Puts a new entry at `p` (where its key goes), growing first if the
    /// index is full; after a resize the place is looked for again.
    fn add_at(&mut self, p: usize, slot: Slot, mut cmp: impl FnMut(u64) -> Ordering) {
        let mut p = Some(p);
        loop {
            if self.over_load(1) {
                self.rebuild(self.bits + 1, 0);
                p = None;
            }
            let at = p.unwrap_or_else(|| self.seek_after(slot.hash, &mut cmp));
            if self.put_at(at, slot) {
                return;
            }
            // The run reaches the end of the tail: lay out again with a
            // tail longer by an eighth of the array, so that as many more
            // inserts are needed before this can happen again.
            let room = (1usize << self.bits) / 8;
            self.rebuild(self.bits, room.max(256));
            p = None;
        }
    }

    /// Puts `slot` at `p`, shifting the run `[p, e)` one slot right into
    /// the first empty slot `e`; false (changing nothing) if the run
    /// reaches the end of the tail.
    fn put_at(&mut self, p: usize, slot: Slot) -> bool {
        let Some(e) = self.next_empty(p) else {
            return false;
        };
        self.slots.copy_within(p..e, p + 1);
        self.slots[p] = slot;
        self.slots.counts_mut()[e / BLOCK] += 1;
        self.len += 1;
        let low = self.low.get_mut();
        *low = (*low).min(p);
        true
    }

    /// The first empty slot at or after `p`.
    fn next_empty(&self, p: usize) -> Option<usize> {
        let rest = self.slots.get(p..)?;
        rest.iter().position(Slot::is_empty).map(|i| p + i)
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
        self.slots.counts_mut()[(q - 1) / BLOCK] -= 1;
        self.len -= 1;
        self.after_removal();
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
        self.slots.recount(pos..q);
        self.len -= removed.len();
        self.after_removal();
        removed
    }

    /// Shrinks if the index is due to (see [`HashIndex`]).
    fn after_removal(&mut self) {
        if !self.wants_shrink(self.len) {
            return;
        }
        if self.len == 0 {
            self.clear();
            return;
        }
        // Each entry's displacement in the current array, to compare with.
        let mut current = Layout::default();
        let mut prev = None;
        for (p, s) in self.entries() {
            current.add(prev, s.hash, self.home(s.hash), p);
            prev = Some(s.hash);
        }
        self.resize_work += self.len as u64;
        // The smallest array at most 40% full (twice as far from growing
        // as from shrinking), or failing that one half of the current.
        let mut smallest = MIN_BITS;
        while self.len * LOAD_DEN * 2 > (1usize << smallest) * LOAD_NUM {
            smallest += 1;
        }
        let mut tries = vec![smallest];
        if smallest + 1 < self.bits {
            tries.push(self.bits - 1);
        }
        let now = self.bits;
        for bits in tries.into_iter().filter(|&b| b < now) {
            let layout = self.layout(bits);
            if layout.fits(&current) {
                self.rebuild(bits, 0);
                return;
            }
        }
        // Refused: try again once half of the entries are gone.
        self.shrink_below = self.len / 2;
    }

    /// The layout of the current entries in an array of `bits` bits.
    fn layout(&mut self, bits: u32) -> Layout {
        let mut l = Layout::default();
        let mut prev = None;
        for (_, s) in self.entries() {
            let home = (s.hash >> (64 - bits)) as usize;
            l.add(prev, s.hash, home, home.max(l.end));
            prev = Some(s.hash);
        }
        self.resize_work += self.len as u64;
        l
    }

    /// The entries with their positions, in walk order.
    fn entries(&self) -> impl Iterator<Item = (usize, Slot)> + '_ {
        let mut p = 0;
        std::iter::from_fn(move || {
            let q = self.next_occupied(p)?;
            p = q + 1;
            Some((q, self.slots[q]))
        })
    }

    /// The position of the first entry after (`hash`, key) in walk order,
    /// whether or not that key is present. `cmp(loc)` compares the key at
    /// `loc` with the cursor's key.
    pub fn seek_after(&self, hash: u64, mut cmp: impl FnMut(u64) -> Ordering) -> usize {
        let (start, end) = self.hash_run(hash);
        start + self.slots[start..end].partition_point(|s| cmp(s.loc) != Ordering::Greater)
    }

    /// The first occupied position at or after `pos`. Skips empty blocks
    /// of slots by their counts, so that a walk through an index emptied
    /// at one end costs a byte per 64 empty slots.
    pub fn next_occupied(&self, pos: usize) -> Option<usize> {
        let low = self.low.load(Relaxed);
        let found = self.occupied_from(pos.max(low));
        if pos <= low {
            // Nothing before `found`: the next walk from the start goes there.
            self.low.store(found.unwrap_or(self.slots.len()), Relaxed);
        }
        found
    }

    fn occupied_from(&self, pos: usize) -> Option<usize> {
        let first_in = |from: usize| {
            let end = (from / BLOCK + 1) * BLOCK;
            let rest = self.slots.get(from..end.min(self.slots.len()))?;
            let found = rest.iter().position(|s| !s.is_empty());
            #[cfg(test)]
            self.scanned
                .fetch_add(found.map_or(rest.len(), |i| i + 1) as u64, Relaxed);
            found.map(|i| from + i)
        };
        if let Some(p) = first_in(pos) {
            return Some(p);
        }
        let next = pos / BLOCK + 1;
        let b = next + first_nonzero(self.slots.counts().get(next..)?)?;
        #[cfg(test)]
        self.scanned.fetch_add((b - next + 1) as u64, Relaxed);
        first_in(b * BLOCK)
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
        self.slots = SlotArray::new(slots_for(MIN_BITS, 0), &self.name);
        self.bits = MIN_BITS;
        self.len = 0;
        self.shrink_below = 0;
        *self.low.get_mut() = 0;
    }

    /// Lays the entries out again in an array of `bits` bits, with at
    /// least `room` empty slots after the last one.
    fn rebuild(&mut self, bits: u32, room: usize) {
        let entries: Vec<Slot> = self.entries().map(|(_, s)| s).collect();
        self.lay_out(bits, room, &entries);
    }

    /// Fills an empty index with `entries` at once (bulk loading): they
    /// must be sorted by (hash, key), with no key twice.
    pub fn build_sorted(&mut self, entries: &[Slot]) {
        debug_assert!(self.len == 0);
        let mut bits = MIN_BITS;
        while entries.len() * LOAD_DEN > (1usize << bits) * LOAD_NUM {
            bits += 1;
        }
        self.lay_out(bits, 0, entries);
    }

    /// Places `entries` (sorted by (hash, key)) in a new array of `bits`
    /// bits, its tail long enough for every run plus `room`.
    fn lay_out(&mut self, bits: u32, room: usize, entries: &[Slot]) {
        let at = |home: usize, next: usize| home.max(next);
        let mut end = 0;
        for s in entries {
            end = at((s.hash >> (64 - bits)) as usize, end) + 1;
        }
        let mut slots = SlotArray::new(slots_for(bits, end + room), &self.name);
        let mut next = 0;
        for s in entries {
            let p = at((s.hash >> (64 - bits)) as usize, next);
            slots[p] = *s;
            slots.counts_mut()[p / BLOCK] += 1;
            next = p + 1;
        }
        self.resize_work += entries.len() as u64;
        self.slots = slots;
        self.bits = bits;
        self.len = entries.len();
        *self.low.get_mut() = 0;
        // Twice as far from the next shrink as the entries a resize moves.
        self.shrink_below = (self.len / 2).min((1usize << bits) / 8);
    }
}

/// The index of the first nonzero byte, eight at a time.
fn first_nonzero(bytes: &[u8]) -> Option<usize> {
    let words = bytes.chunks_exact(8);
    let tail = words.remainder();
    for (i, w) in words.enumerate() {
        if u64::from_ne_bytes(w.try_into().expect("8 bytes")) != 0 {
            return w.iter().position(|&b| b != 0).map(|j| i * 8 + j);
        }
    }
    let start = bytes.len() - tail.len();
    tail.iter().position(|&b| b != 0).map(|j| start + j)
}

/// The first `q >= from` for which `inside` is false, where `inside` holds
/// on a prefix of the positions from `from` on: galloping, then a binary
/// search, O(log distance) calls.
fn gallop(from: usize, inside: impl Fn(usize) -> bool) -> usize {
    if !inside(from) {
        return from;
    }
    // `lo` is inside, `hi` past it.
    let (mut lo, mut step) = (from, 1);
    while inside(lo + step) {
        lo += step;
        step *= 2;
    }
    let mut hi = lo + step;
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if inside(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    hi
}

/// Home slots plus a tail for runs that spill past the last home slot: at
/// least the smaller of the home slots and 256, and up to slot `end`.
fn slots_for(bits: u32, end: usize) -> usize {
    let cap = 1usize << bits;
    (cap + cap.min(256)).max(end)
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
        for (b, &c) in ix.slots.counts().iter().enumerate() {
            let end = ((b + 1) * BLOCK).min(ix.slots.len());
            let n = ix.slots[b * BLOCK..end]
                .iter()
                .filter(|s| !s.is_empty())
                .count();
            assert_eq!(c as usize, n, "block {b}'s count");
        }
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

    /// A well-spread hash.
    fn mix(k: u64) -> u64 {
        let x = k.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        x ^ (x >> 29)
    }

    fn filled(n: u64) -> HashIndex {
        let mut ix = HashIndex::default();
        for k in 0..n {
            ix.insert(mix(k), k + 1, |loc| key_of(loc).cmp(&k));
        }
        ix
    }

    #[test]
    fn deleting_in_walk_order_resizes_a_bounded_number_of_times() {
        let n = 100_000;
        let mut ix = filled(n);
        let before = ix.resize_work();
        // first-then-delete, as `first/1` and `delete/2` in a loop, or a
        // select_delete of everything: survivors sit at the top.
        for left in (0..n as usize).rev() {
            let p = ix.next_occupied(0).expect("an entry is left");
            ix.remove_at(p);
            assert_eq!(ix.len(), left);
            if left % 20_000 == 0 {
                check_invariants(&ix);
            }
        }
        let work = ix.resize_work() - before;
        // Each layout or check is paid for by half as many removals.
        assert!(
            work <= 4 * n,
            "resizes handled {work} entries for {n} removals"
        );
        // Each walk from the start began where the last one found an
        // entry: a slot array's worth of scanning in all, not one each.
        let scanned = ix.scanned.load(Relaxed);
        assert!(scanned <= 8 * n, "{scanned} slots and counts scanned");
        assert_eq!(
            ix.capacity(),
            slots_for(MIN_BITS, 0),
            "emptied, it is small again"
        );
    }

    #[test]
    fn a_crowded_index_refuses_to_shrink_and_stays_fast() {
        let n = 100_000u64;
        let mut ix = filled(n);
        // Delete the bottom 99% of the hash space, as a walk would.
        let mut by_hash: Vec<u64> = (0..n).collect();
        by_hash.sort_by_key(|&k| mix(k));
        let (gone, kept) = by_hash.split_at(99_000);
        for &k in gone {
            let p = ix.find(mix(k), |loc| key_of(loc).cmp(&k)).unwrap();
            ix.remove_at(p);
        }
        check_invariants(&ix);
        // Whatever the size, no survivor is pushed far from its home.
        let mut worst = 0;
        for (p, s) in ix.entries() {
            worst = worst.max(p - ix.home(s.hash));
        }
        assert!(worst <= MAX_SHIFT, "an entry {worst} slots from home");
        for &k in kept {
            assert!(ix.find(mix(k), |loc| key_of(loc).cmp(&k)).is_some());
        }
        // Spread out again by new keys, it shrinks once it is due.
        for k in n..n + 1000 {
            ix.insert(mix(k), k + 1, |loc| key_of(loc).cmp(&k));
        }
        let big = ix.capacity();
        // Removing the crowd and then half of the rest (the shrink is due
        // once half of the entries left at the last refusal are gone).
        for k in kept.iter().copied().chain(n..n + 500) {
            let p = ix.find(mix(k), |loc| key_of(loc).cmp(&k)).unwrap();
            ix.remove_at(p);
        }
        check_invariants(&ix);
        assert!(ix.capacity() * 16 < big, "{} vs {big}", ix.capacity());
    }

    #[test]
    fn removing_a_bag_key_in_walk_order_resizes_a_bounded_number_of_times() {
        let mut ix = HashIndex::default();
        let key = |loc: u64| loc / 100;
        let keys = 20_000u64;
        for k in 0..keys {
            for i in 0..5 {
                ix.append(mix(k), k * 100 + i + 1, |l| key(l).cmp(&k));
            }
        }
        let before = ix.resize_work();
        while let Some(p) = ix.next_occupied(0) {
            let removed = ix.remove_if(p, 5, |_| true);
            assert_eq!(removed.len(), 5);
        }
        let work = ix.resize_work() - before;
        assert!(work <= 4 * 5 * keys, "{work}");
        check_invariants(&ix);
    }

    #[test]
    fn a_crowd_at_the_top_of_the_hash_space_gets_a_longer_tail() {
        let mut ix = HashIndex::default();
        // A bag key whose hash is the greatest there is, with more objects
        // than any tail holds: growing would never make room.
        for i in 0..5000u64 {
            ix.append(u64::MAX, i + 1, |_| Ordering::Equal);
        }
        for k in 0..100u64 {
            ix.insert(mix(k), 10_000 + k, |loc| (loc - 10_000).cmp(&k));
        }
        assert_eq!(ix.len(), 5100);
        assert!(ix.capacity() < 64 * 1024, "{} slots", ix.capacity());
        let p = ix.find(u64::MAX, |_| Ordering::Equal).unwrap();
        let run: Vec<u64> = (p..p + 5000).map(|q| ix.slot(q).loc).collect();
        assert_eq!(run, (1..=5000).collect::<Vec<_>>());
    }

    #[test]
    fn would_resize_is_never_wrong_when_it_says_no() {
        let mut ix = HashIndex::default();
        let mut model: BTreeMap<u64, u64> = BTreeMap::new();
        let mut x = 0x1234_5678_9abc_def1_u64;
        let (mut checked_add, mut checked_remove) = (0, 0);
        for step in 0..200_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Phases of growth and of walk-order and random shrinking.
            let phase = (step / 25_000) % 4;
            let work = ix.resize_work();
            if phase % 2 == 0 && x % 8 != 0 {
                let k = x % 1_000_000;
                let quiet = !ix.would_resize(1, 0);
                ix.insert(mix(k), k + 1, |loc| key_of(loc).cmp(&k));
                model.insert(k, mix(k));
                if quiet {
                    checked_add += 1;
                    assert_eq!(ix.resize_work(), work, "an insert resized unannounced");
                }
            } else if let Some(p) = match phase {
                1 => ix.next_occupied(0),
                _ => model
                    .range(x % 1_000_000..)
                    .next()
                    .map(|(&k, &h)| ix.find(h, |loc| key_of(loc).cmp(&k)).unwrap()),
            } {
                let quiet = !ix.would_resize(0, 1);
                let s = ix.remove_at(p);
                model.remove(&key_of(s.loc));
                if quiet {
                    checked_remove += 1;
                    assert_eq!(ix.resize_work(), work, "a removal resized unannounced");
                }
            }
        }
        check_invariants(&ix);
        assert_eq!(ix.len(), model.len());
        assert!(checked_add > 1000 && checked_remove > 1000);
    }

    #[test]
    fn a_walk_skips_long_empty_stretches() {
        let mut ix = filled(50_000);
        let mut by_hash: Vec<u64> = (0..50_000).collect();
        by_hash.sort_by_key(|&k| mix(k));
        // Keep a few keys at the bottom and the top of the hash space.
        for &k in &by_hash[10..49_990] {
            let p = ix.find(mix(k), |loc| key_of(loc).cmp(&k)).unwrap();
            ix.remove_at(p);
        }
        let mut walked = Vec::new();
        let mut p = 0;
        while let Some(q) = ix.next_occupied(p) {
            walked.push(key_of(ix.slot(q).loc));
            p = q + 1;
        }
        let mut expected: Vec<u64> = by_hash[..10].to_vec();
        expected.extend_from_slice(&by_hash[49_990..]);
        assert_eq!(walked, expected);
    }
}
