//! The key index of a set table: an open-addressing hash table kept sorted by
//! hash.
//!
//! Each slot is one 64-bit word: the top bits of a record's key hash above
//! its arena location, packed (see [`Packing`]); 0 marks an empty slot. A
//! key's home slot is a monotone function of those hash bits,
//! `(hash * homes) >> 64`, so the number of home slots need not be a power
//! of two, and collisions probe forward (linear probing, no wrap-around: the
//! array has a tail past the last home slot). Insertion keeps the occupied
//! slots in ascending (hash, key) order, which is Robin Hood ordering with a
//! deterministic tie-break, so:
//! - a lookup stops at the first hash greater than its own;
//! - every entry sits at or after its home slot, with no empty slot between;
//! - the table can be walked in (hash, key) order, and a walk can resume from
//!   any (hash, key), present or not, even after the table has grown: that is
//!   what makes `first/next` and chunked iteration safe while others write.
//!
//! Keys and their full hashes live in the arena (a hash is the key's,
//! recomputed); the index compares them through a callback, so it holds no
//! key bytes. A slot's hash bits decide every comparison but those between
//! entries whose kept bits are equal (a tie: the same hash, or one that
//! differs only below the kept bits); only then does the callback read a
//! key. With `H` bits kept and `n` home slots a tie between neighbours has a
//! chance of about `n / 2^H`: with the arena of a million small records,
//! ~27 bits kept for ~2^20.5 homes, about 1%.
//!
//! The slot array is an anonymous mapping of its own, named
//! `heft-index:<label>` (`[anon:heft-index:<label>]` in /proc/PID/maps, on
//! 2 MiB pages where the kernel allows), or a memfd of that name
//! (`/memfd:heft-index:<label>`) where it cannot name anonymous memory: its
//! size is exact and the kernel's view of it is separable from the rest of
//! the process, growth of the index shows up as growth of RSS, never hidden
//! in memory malloc had already freed, and reports can find it by name.

use std::cmp::Ordering;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::Relaxed;

use memmap2::MmapMut;

/// A key hash and the arena location of its record: what
/// [`HashIndex::build_sorted`] takes (the index itself keeps a packed word).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct Slot {
    /// The key's 64-bit hash.
    pub hash: u64,
    /// The record's location in the arena (never 0).
    pub loc: u64,
}

/// What `insert` did.
#[derive(Debug, PartialEq, Eq)]
pub enum Inserted {
    /// A new key.
    New,
    /// The key was there; this was its old record offset.
    Replaced(u64),
}

/// The fewest home slots: as many as fit in one page with their tail and
/// block counts (510 slots and 8 counts in 4,088 bytes), so that a small
/// table's index, a page whatever its size, grows only once it must.
const MIN_HOMES: usize = 255;
/// The table grows past 80% full, by half.
const LOAD_NUM: usize = 4;
const LOAD_DEN: usize = 5;
/// A bulk-loaded index starts two thirds full.
const BULK_NUM: usize = 2;
const BULK_DEN: usize = 3;
/// Slots a block of the occupancy counts covers.
const BLOCK: usize = 64;
/// A shrink is refused if it would displace an entry further than this
/// from its home slot (and further than the current layout does): see
/// [`Layout::fits`].
const MAX_SHIFT: usize = 128;

/// An arena location (see arena.rs): a size class above this bit, a byte
/// offset below it.
const SPLIT: u32 = 48;
/// A layout that widens the offset field leaves room for offsets this many
/// bits longer than the largest it holds (8 times as large).
const HEADROOM_BITS: u32 = 3;

/// The low `bits` bits set.
fn low_mask(bits: u32) -> u64 {
    u64::MAX.checked_shr(64 - bits).unwrap_or(0)
}

/// How a slot word packs a location below the top bits of a hash:
/// `hash bits | class << (off_bits - align) | offset >> align`.
///
/// An arena location is a size class (up to 16 bits, 9 used) and a byte
/// offset (48 bits), offsets being multiples of 2 (every block size is), so
/// a location takes `off_bits - align + class_bits` bits and the hash the
/// rest. The fields start narrow (an arena of 16 MiB); a location that does
/// not fit widens them, at a layout of all entries again. They never narrow
/// (the hash bits dropped are gone) until the index is emptied, so a wider
/// packing only drops low hash bits: the order of entries stays (hash, key)
/// and a location of any value can be held (at the very worst with no hash
/// bits at all: then every comparison reads keys, slowly but correctly).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Packing {
    /// Low offset bits that are always 0 (not stored).
    align: u32,
    /// Offsets are below `2^off_bits`.
    off_bits: u32,
    /// Classes are below `2^class_bits`.
    class_bits: u32,
}

impl Packing {
    const FIRST: Packing = Packing {
        align: 1,
        off_bits: 24,
        class_bits: 9,
    };

    fn loc_bits(self) -> u32 {
        self.off_bits - self.align + self.class_bits
    }

    /// The bits of a hash a slot keeps.
    fn hash_mask(self) -> u64 {
        !low_mask(self.loc_bits())
    }

    fn fits(self, loc: u64) -> bool {
        let (class, off) = (loc >> SPLIT, loc & low_mask(SPLIT));
        off & low_mask(self.align) == 0
            && off >> self.off_bits == 0
            && class >> self.class_bits == 0
    }

    /// The word for `hash -> loc` (`loc` fits and is not 0, so neither is
    /// the word).
    fn pack(self, hash: u64, loc: u64) -> u64 {
        debug_assert!(self.fits(loc) && loc != 0);
        let (class, off) = (loc >> SPLIT, loc & low_mask(SPLIT));
        (hash & self.hash_mask()) | class << (self.off_bits - self.align) | off >> self.align
    }

    fn loc(self, word: u64) -> u64 {
        let ob = self.off_bits - self.align;
        let c = word & low_mask(self.loc_bits());
        (c >> ob) << SPLIT | (c & low_mask(ob)) << self.align
    }

    /// This packing, widened where `loc` does not fit.
    fn widened(self, loc: u64) -> Packing {
        let (class, off) = (loc >> SPLIT, loc & low_mask(SPLIT));
        let bits = |v: u64| 64 - v.leading_zeros();
        Packing {
            align: self.align.min(off.trailing_zeros()),
            off_bits: match off >> self.off_bits {
                0 => self.off_bits,
                _ => (bits(off) + HEADROOM_BITS).min(SPLIT),
            },
            class_bits: self.class_bits.max(bits(class)),
        }
    }

    /// True if offsets could outgrow the packing soon (the largest one
    /// held, `max_off`, is past half of the range) and it can still widen.
    fn near_limit(self, max_off: u64) -> bool {
        self.off_bits < SPLIT && max_off >> (self.off_bits - 1) != 0
    }

    /// This packing, widened to leave offsets [`HEADROOM_BITS`] to grow
    /// if the largest, `max_off`, is past a quarter of its range.
    fn with_headroom(self, max_off: u64) -> Packing {
        if self.off_bits >= SPLIT || max_off >> (self.off_bits - 2) == 0 {
            return self;
        }
        let off_bits = (64 - max_off.leading_zeros() + HEADROOM_BITS).min(SPLIT);
        Packing {
            off_bits: off_bits.max(self.off_bits),
            ..self
        }
    }
}

/// The home slot of a (kept) hash among `homes`: monotone in the hash.
#[inline]
fn home_in(hash: u64, homes: usize) -> usize {
    ((u128::from(hash) * homes as u128) >> 64) as usize
}

/// Zero-filled slot words in a mapping of their own, followed by one byte a
/// block of [`BLOCK`] slots counting the block's entries (so that a walk
/// skips empty stretches 64 slots at a time).
struct SlotArray {
    map: MmapMut,
    len: usize,
}

impl SlotArray {
    fn new(len: usize, name: &str) -> SlotArray {
        let bytes = (len * 8 + len.div_ceil(BLOCK)).next_multiple_of(4096);
        let map = named_anon(name, bytes);
        SlotArray { map, len }
    }

    fn mapped_bytes(&self) -> usize {
        self.map.len()
    }

    /// Entries in each block of slots.
    fn counts(&self) -> &[u8] {
        &self.map[self.len * 8..][..self.len.div_ceil(BLOCK)]
    }

    fn counts_mut(&mut self) -> &mut [u8] {
        let blocks = self.len.div_ceil(BLOCK);
        &mut self.map[self.len * 8..][..blocks]
    }

    /// Counts an entry moved from slot `from` to slot `to` in their
    /// blocks (counting by what moved, not by reading the blocks again:
    /// a block is 8 cache lines).
    fn moved(&mut self, from: usize, to: usize) {
        if from / BLOCK != to / BLOCK {
            self.counts_mut()[from / BLOCK] -= 1;
            self.counts_mut()[to / BLOCK] += 1;
        }
    }
}

impl Deref for SlotArray {
    type Target = [u64];
    fn deref(&self) -> &[u64] {
        // SAFETY: the mapping is page-aligned (so aligned for u64), at least
        // `len * 8` bytes long, and zero-filled by the kernel.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().cast::<u64>(), self.len) }
    }
}

impl DerefMut for SlotArray {
    fn deref_mut(&mut self) -> &mut [u64] {
        // SAFETY: as in `deref`; `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.map.as_mut_ptr().cast::<u64>(), self.len) }
    }
}

/// A zero-filled private mapping of `bytes` (a multiple of 4096), named
/// `name` in /proc/PID/maps: anonymous memory on 2 MiB pages where the
/// kernel allows (`MADV_HUGEPAGE`), named with `PR_SET_VMA_ANON_NAME`
/// (`[anon:<name>]`); where anonymous memory cannot be named (kernels
/// before 5.17, or without CONFIG_ANON_VMA_NAME), a memfd of that name
/// (`/memfd:<name>`), so that reports always find it. Every page is faulted
/// in at once (an index is at least 40% full once built, and slots are
/// spread over all of it).
fn named_anon(name: &str, bytes: usize) -> MmapMut {
    // Mappings only fail when the process is out of descriptors or address
    // space, where a Vec would abort as well.
    if let Some(mut map) = can_name_anon()
        .then(|| MmapMut::map_anon(bytes).ok())
        .flatten()
    {
        // Best effort: huge pages where THP allows them (a mapping of less
        // than 2 MiB gets none), then the pages at once (Linux 5.14 and
        // later), or at least the first (so the mapping has memory of its
        // own before it is named: a fresh mapping would merge with a
        // neighbouring one of the same name, another table's index, into
        // one that reports could not tell apart).
        let _ = map.advise(memmap2::Advice::HugePage);
        if map.advise(memmap2::Advice::PopulateWrite).is_err() {
            // SAFETY: the mapping is at least a page long and ours alone.
            unsafe { std::ptr::write_volatile(map.as_mut_ptr(), 0) };
        }
        if name_anon(&map, name) {
            return map;
        }
    }
    let map = crate::arena::memfd(name, bytes as u64)
        .and_then(|f| crate::arena::map_file(&f, bytes as u64, false))
        .expect("mapping the index slot array");
    let _ = map.advise(memmap2::Advice::PopulateWrite);
    map
}

/// True if the kernel can name anonymous memory (asked once, of a page).
fn can_name_anon() -> bool {
    static CAN: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *CAN.get_or_init(|| MmapMut::map_anon(4096).is_ok_and(|m| name_anon(&m, "heft-probe")))
}

/// Names an anonymous mapping; false if the kernel cannot.
fn name_anon(map: &MmapMut, name: &str) -> bool {
    let Ok(cname) = std::ffi::CString::new(name) else {
        return false;
    };
    const PR_SET_VMA: libc::c_int = 0x5356_4d41;
    const PR_SET_VMA_ANON_NAME: libc::c_ulong = 0;
    // SAFETY: prctl(PR_SET_VMA, PR_SET_VMA_ANON_NAME) reads the
    // NUL-terminated name (the kernel copies it) and labels the pages of
    // our own live mapping; it writes no memory of ours.
    let rc = unsafe {
        libc::prctl(
            PR_SET_VMA,
            PR_SET_VMA_ANON_NAME,
            map.as_ptr() as libc::c_ulong,
            map.len() as libc::c_ulong,
            cname.as_ptr() as libc::c_ulong,
        )
    };
    rc == 0
}

/// A sorted linear-probing hash index.
///
/// Resizing: the index grows by half past 80% full (8 bytes a slot: at
/// most 15 bytes an entry just after growing, 10 just before), and tries to
/// shrink once it is below an eighth full and has lost half of its entries
/// since it was last laid out (grown, shrunk, or refused a shrink), so that
/// each layout's cost is paid for by as many single-key operations. A
/// shrink is refused when the smaller layout would crowd the entries:
/// deleting keys in walk order leaves the survivors at the top of the hash
/// space, at the density they had, and halving the array would double it
/// (runs longer than the tail, every operation a scan). Such an index keeps
/// its size until its keys spread out again, or empty: memory for speed. A
/// location the packing cannot hold also lays the entries out again, with a
/// wider packing.
pub struct HashIndex {
    slots: SlotArray,
    /// Home slots.
    homes: usize,
    packing: Packing,
    /// The largest offset held since the last layout (at least).
    max_off: u64,
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
    /// The slot array's mapping name: `heft-index:<label>`.
    name: String,
}

impl Default for HashIndex {
    fn default() -> Self {
        Self::new("")
    }
}

/// Where entries would go in an array of some size, and how far from their
/// homes: measured over the first entry of each kept hash (later ones of a
/// hash, a bag key's objects, follow it whatever the size).
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

/// An entry to add while laying out: its place in walk order (before the
/// entry now at that position), hash and location.
type Pending = Option<(usize, u64, u64)>;

impl HashIndex {
    /// An empty index; `label` names its mapping (see [`crate::arena`]).
    pub fn new(label: &str) -> Self {
        let name = format!("heft-index:{}", crate::arena::sanitize(label));
        HashIndex {
            slots: SlotArray::new(slots_for(MIN_HOMES, 0), &name),
            homes: MIN_HOMES,
            packing: Packing::FIRST,
            max_off: 0,
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

    /// Bytes of the slot array's mapping (8 bytes a slot, a byte per 64
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

    /// The top bits of a key hash that slots keep (the rest is read from
    /// keys on ties): 64 less the bits a location takes.
    pub fn hash_bits(&self) -> u32 {
        64 - self.packing.loc_bits()
    }

    /// True if adding `added` entries, or removing `removed`, could resize
    /// the index (a cost of about [`HashIndex::capacity`]), without
    /// changing anything: for callers that must not take that long. Once
    /// the arena's offsets near the packing's limit any change may (it
    /// widens the packing then, see [`Packing`]): also true, whatever the
    /// counts.
    pub fn would_resize(&self, added: usize, removed: usize) -> bool {
        let left = self.len.saturating_sub(removed);
        (added > 0 && (self.over_load(added) || self.spills(added)))
            || (removed > 0 && self.wants_shrink(left))
            || self.near_limit()
    }

    /// True if `added` more entries would fill the table past its load
    /// limit (it then grows): the one rule `add_at` and `would_resize` share.
    fn over_load(&self, added: usize) -> bool {
        (self.len + added) * LOAD_DEN > self.homes * LOAD_NUM
    }

    /// Home slots for `added` more entries: grown by half until under the
    /// load limit.
    fn grown_homes(&self, added: usize) -> usize {
        let mut homes = self.homes + self.homes / 2;
        while (self.len + added) * LOAD_DEN > homes * LOAD_NUM {
            homes += homes / 2;
        }
        homes
    }

    /// True if adding `added` entries could run into the end of the tail.
    fn spills(&self, added: usize) -> bool {
        // An insert fills the first empty slot at or after its place: only
        // once the last `added` slots are all taken can a run reach the
        // end of the tail.
        let tail = &self.slots[self.slots.len().saturating_sub(added)..];
        tail.iter().any(|&w| w != 0)
    }

    /// Empty slots a run that reached the end of the tail gets after it:
    /// an eighth of the array, so that as many more inserts are needed
    /// before it can happen again.
    fn tail_room(&self) -> usize {
        (self.homes / 8).max(256)
    }

    fn near_limit(&self) -> bool {
        self.packing.near_limit(self.max_off)
    }

    fn wants_shrink(&self, len: usize) -> bool {
        self.homes > MIN_HOMES && (len < self.shrink_below || len == 0)
    }

    /// The kept bits of a hash (or of a slot word).
    #[inline]
    fn kept(&self, hash: u64) -> u64 {
        hash & self.packing.hash_mask()
    }

    #[inline]
    fn home(&self, hash: u64) -> usize {
        home_in(self.kept(hash), self.homes)
    }

    #[inline]
    fn loc_of(&self, word: u64) -> u64 {
        self.packing.loc(word)
    }

    /// The location of the entry at `pos` (a valid position).
    pub fn slot(&self, pos: usize) -> u64 {
        self.loc_of(self.slots[pos])
    }

    /// The location of the entry at `pos`, or `None` for an empty slot or
    /// past the end.
    #[inline]
    pub fn get(&self, pos: usize) -> Option<u64> {
        self.slots
            .get(pos)
            .filter(|&&w| w != 0)
            .map(|&w| self.loc_of(w))
    }

    /// Points the entry at `pos` to a new record location (same key). A
    /// location the packing cannot hold (or any, once offsets near its
    /// limit) lays the entries out again: positions change.
    pub fn set_loc(&mut self, pos: usize, loc: u64) {
        debug_assert!(loc != 0 && self.slots[pos] != 0);
        let w = self.slots[pos];
        if self.packing.fits(loc) && !self.near_limit() {
            self.slots[pos] = self.packing.pack(w, loc);
            self.max_off = self.max_off.max(loc & low_mask(SPLIT));
            return;
        }
        // Laid out again with `loc` in place of the old one: the entry
        // leaves and comes back with the same (kept) hash.
        self.rebuild(self.homes, 0, Some(pos), Some((pos, w, loc)));
    }

    /// Finds `hash`'s entry. `cmp(loc)` compares the entry stored at `loc`
    /// with the one looked for, by (hash, key), the key's hash being the
    /// index's: it is only asked about entries whose kept hash bits equal
    /// `hash`'s, and an equal key (equal then) may answer without hashing.
    pub fn find(&self, hash: u64, mut cmp: impl FnMut(u64) -> Ordering) -> Option<usize> {
        let (start, end) = self.hash_run(hash);
        if end - start == 1 {
            return (cmp(self.slot(start)) == Ordering::Equal).then_some(start);
        }
        let p = start + self.slots[start..end].partition_point(|&w| cmp(self.loc_of(w)).is_lt());
        (p < end && cmp(self.slot(p)) == Ordering::Equal).then_some(p)
    }

    /// [`HashIndex::find`], and how many entries from there on are equal
    /// to the one looked for (a bag key's objects sit together): one search.
    pub fn find_all(
        &self,
        hash: u64,
        mut cmp: impl FnMut(u64) -> Ordering,
    ) -> Option<(usize, usize)> {
        let (start, end) = self.hash_run(hash);
        if end - start == 1 {
            return (cmp(self.slot(start)) == Ordering::Equal).then_some((start, 1));
        }
        let p = start + self.slots[start..end].partition_point(|&w| cmp(self.loc_of(w)).is_lt());
        if p == end || cmp(self.slot(p)) != Ordering::Equal {
            return None;
        }
        Some((
            p,
            self.slots[p..end].partition_point(|&w| cmp(self.loc_of(w)).is_eq()),
        ))
    }

    /// The entries whose kept hash bits are `hash`'s, `[start, end)`: where
    /// they are, or would be. From the hash's home slot, the entries of
    /// smaller hashes displaced past it and then those of equal hashes form
    /// a prefix of the run (entries are sorted, and an empty slot ends a
    /// run), so both ends are found by galloping over the slots' hash
    /// bits, without reading keys: a bag key with many objects, or a crowd
    /// of them, costs O(log n) here.
    fn hash_run(&self, hash: u64) -> (usize, usize) {
        let kept = self.kept(hash);
        let taken = |q: usize, f: fn(u64, u64) -> bool| {
            self.slots
                .get(q)
                .is_some_and(|&w| w != 0 && f(self.kept(w), kept))
        };
        let start = gallop(home_in(kept, self.homes), |q| taken(q, |h, k| h < k));
        (start, gallop(start, |q| taken(q, |h, k| h == k)))
    }

    /// Inserts `hash -> loc`, or replaces the location of an equal key
    /// (`cmp` as for [`HashIndex::find`]).
    pub fn insert(
        &mut self,
        hash: u64,
        loc: u64,
        mut cmp: impl FnMut(u64) -> Ordering,
    ) -> Inserted {
        debug_assert!(loc != 0);
        let (start, end) = self.hash_run(hash);
        let p = start + self.slots[start..end].partition_point(|&w| cmp(self.loc_of(w)).is_lt());
        if p < end && cmp(self.slot(p)) == Ordering::Equal {
            let old = self.slot(p);
            self.set_loc(p, loc);
            return Inserted::Replaced(old);
        }
        self.add_at(p, hash, loc);
        Inserted::New
    }

    /// Inserts `hash -> loc` after every entry of an equal key, so that
    /// the entries of one key (in a bag table) stay in insertion order.
    pub fn append(&mut self, hash: u64, loc: u64, mut cmp: impl FnMut(u64) -> Ordering) {
        debug_assert!(loc != 0);
        let p = self.seek_after(hash, &mut cmp);
        self.add_at(p, hash, loc);
    }

    /// Puts a new entry at `p` (where its key goes), laying the entries
    /// out again first if the index is full, or if the location does not
    /// fit, with the new one among them.
    fn add_at(&mut self, p: usize, hash: u64, loc: u64) {
        let new = Some((p, hash, loc));
        if self.over_load(1) {
            self.rebuild(self.grown_homes(1), 0, None, new);
            return;
        }
        if self.packing.fits(loc) && !self.near_limit() {
            if self.put_at(p, self.packing.pack(hash, loc)) {
                self.max_off = self.max_off.max(loc & low_mask(SPLIT));
                return;
            }
            // The run reaches the end of the tail: lay out again with a
            // longer tail.
            self.rebuild(self.homes, self.tail_room(), None, new);
            return;
        }
        self.rebuild(self.homes, 0, None, new);
    }

    /// Puts `word` at `p`, shifting the run `[p, e)` one slot right into
    /// the first empty slot `e`; false (changing nothing) if the run
    /// reaches the end of the tail.
    fn put_at(&mut self, p: usize, word: u64) -> bool {
        let Some(e) = self.next_empty(p) else {
            return false;
        };
        self.slots.copy_within(p..e, p + 1);
        self.slots[p] = word;
        self.slots.counts_mut()[e / BLOCK] += 1;
        self.len += 1;
        let low = self.low.get_mut();
        *low = (*low).min(p);
        true
    }

    /// The first empty slot at or after `p`.
    fn next_empty(&self, p: usize) -> Option<usize> {
        let rest = self.slots.get(p..)?;
        rest.iter().position(|&w| w == 0).map(|i| p + i)
    }

    /// Removes the entry at `pos`, pulling displaced followers back;
    /// returns its location.
    pub fn remove_at(&mut self, pos: usize) -> u64 {
        let removed = self.slot(pos);
        let mut q = pos + 1;
        while let Some(&w) = self.slots.get(q) {
            if w == 0 || self.home(w) >= q {
                break;
            }
            self.slots[q - 1] = w;
            q += 1;
        }
        self.slots[q - 1] = 0;
        self.slots.counts_mut()[(q - 1) / BLOCK] -= 1;
        self.len -= 1;
        self.after_removal();
        removed
    }

    /// Removes those of the `n` entries from `pos` on whose location
    /// `remove` picks, in one pass that also pulls displaced followers
    /// back; returns their locations in order. (Removing a bag key's k
    /// entries one by one would move the rest of its run k times.)
    pub fn remove_if(
        &mut self,
        pos: usize,
        n: usize,
        mut remove: impl FnMut(u64) -> bool,
    ) -> Vec<u64> {
        let mut removed = Vec::new();
        let mut w = pos;
        let mut q = pos;
        while q < pos + n {
            let Some(&s) = self.slots.get(q) else { break };
            let loc = self.loc_of(s);
            if remove(loc) {
                removed.push(loc);
                self.slots.counts_mut()[q / BLOCK] -= 1;
            } else {
                self.slots[w] = s;
                self.slots.moved(q, w);
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
            if s == 0 {
                break;
            }
            let target = self.home(s).max(w);
            if target >= q {
                break;
            }
            self.slots[w..target].fill(0);
            self.slots[target] = s;
            self.slots.moved(q, target);
            w = target + 1;
            q += 1;
        }
        self.slots[w..q].fill(0);
        self.len -= removed.len();
        self.after_removal();
        removed
    }

    /// Shrinks if the index is due to (see [`HashIndex`]), or widens the
    /// packing if its offsets near the limit.
    fn after_removal(&mut self) {
        if !self.wants_shrink(self.len) {
            if self.near_limit() {
                self.rebuild(self.homes, 0, None, None);
            }
            return;
        }
        if self.len == 0 {
            self.clear();
            return;
        }
        let (homes, work) = self.shrunk_homes(self.len);
        self.resize_work += work;
        match homes {
            Some(homes) => self.rebuild(homes, 0, None, None),
            None => self.refuse_shrink(),
        }
    }

    /// Home slots to shrink to, for `len` entries (the current ones, or
    /// what a removal will leave), or `None` if the smaller layout would
    /// crowd them; and the entries looked at to decide.
    fn shrunk_homes(&self, len: usize) -> (Option<usize>, u64) {
        // Each entry's displacement in the current array, to compare with.
        let mut current = Layout::default();
        let mut prev = None;
        for (p, w) in self.entries() {
            let h = self.kept(w);
            current.add(prev, h, self.home(h), p);
            prev = Some(h);
        }
        let mut work = self.len as u64;
        // The smallest array at most 40% full (twice as far from growing
        // as from shrinking), or failing that one half of the current.
        let smallest = (len * LOAD_DEN * 2).div_ceil(LOAD_NUM).max(MIN_HOMES);
        let mut tries = vec![smallest];
        if smallest < self.homes / 2 {
            tries.push(self.homes / 2);
        }
        for homes in tries.into_iter().filter(|&h| h < self.homes) {
            work += self.len as u64;
            if self.layout(homes).fits(&current) {
                return (Some(homes), work);
            }
        }
        (None, work)
    }

    /// A shrink was refused: try again once half of the entries are gone.
    fn refuse_shrink(&mut self) {
        self.shrink_below = self.len / 2;
        if self.near_limit() {
            self.rebuild(self.homes, 0, None, None);
        }
    }

    /// The layout of the current entries in an array of `homes` homes.
    fn layout(&self, homes: usize) -> Layout {
        let mut l = Layout::default();
        let mut prev = None;
        for (_, w) in self.entries() {
            let h = self.kept(w);
            let home = home_in(h, homes);
            l.add(prev, h, home, home.max(l.end));
            prev = Some(h);
        }
        l
    }

    /// The resize a change adding up to `added` entries or removing up to
    /// `removed` would make (growing, shrinking, a longer tail, a wider
    /// packing), made ahead: the new array is built from `&self`, so under
    /// a shared lock while readers go on, for [`HashIndex::install`] to put
    /// in place. `None` if the change would resize nothing.
    pub fn relaid_for(&self, added: usize, removed: usize) -> Option<Relaid> {
        if added > 0 && self.over_load(added) {
            return Some(self.relaid(self.grown_homes(added), 0));
        }
        if added > 0 && self.spills(added) {
            return Some(self.relaid(self.homes, self.tail_room().max(added)));
        }
        let left = self.len.saturating_sub(removed);
        if removed > 0 && left > 0 && self.wants_shrink(left) {
            return match self.shrunk_homes(left) {
                (Some(homes), work) => match self.relaid(homes, 0) {
                    Relaid::New(n) => Some(Relaid::New(NewLayout {
                        work: n.work + work,
                        ..n
                    })),
                    refused => Some(refused),
                },
                (None, work) => Some(Relaid::Refused(work)),
            };
        }
        if self.near_limit() {
            return Some(self.relaid(self.homes, 0));
        }
        None
    }

    /// The current entries laid out among `homes` home slots with `room`
    /// to spare, as [`HashIndex::lay_out`] would. While the packing stays,
    /// a slot's word stays too: the words are copied to their new places
    /// straight from the array, in two passes over it (where the last one
    /// lands, then the copy), with no list of entries in between.
    fn relaid(&self, homes: usize, room: usize) -> Relaid {
        let packing = self.packing.with_headroom(self.max_off);
        if packing != self.packing {
            let entries: Vec<(u64, u64)> =
                self.entries().map(|(_, w)| (w, self.loc_of(w))).collect();
            return self.laid_out(homes, room, &entries);
        }
        let words = self.slots.iter().copied().filter(|&w| w != 0);
        self.placed(homes, room, packing, words, self.max_off, self.len)
    }

    /// Puts a layout [`HashIndex::relaid_for`] made in place. The index
    /// must not have changed since. Returns the old array, for the caller
    /// to unmap once it has let go of the table's lock.
    pub fn install(&mut self, r: Relaid) -> Option<Retired> {
        match r {
            Relaid::Refused(work) => {
                self.resize_work += work;
                self.refuse_shrink();
                None
            }
            Relaid::New(n) => {
                self.resize_work += n.work;
                let old = std::mem::replace(&mut self.slots, n.slots);
                self.homes = n.homes;
                self.packing = n.packing;
                self.max_off = n.max_off;
                self.len = n.len;
                *self.low.get_mut() = 0;
                // Twice as far from the next shrink as the entries a resize moves.
                self.shrink_below = (self.len / 2).min(n.homes / 8);
                Some(Retired(old))
            }
        }
    }

    /// The entries' words with their positions, in walk order.
    fn entries(&self) -> impl Iterator<Item = (usize, u64)> + '_ {
        let mut p = 0;
        std::iter::from_fn(move || {
            let q = self.next_occupied(p)?;
            p = q + 1;
            Some((q, self.slots[q]))
        })
    }

    /// The position of the first entry after (`hash`, key) in walk order,
    /// whether or not that key is present. `cmp(loc)` compares the entry
    /// at `loc` with the cursor's (hash, key), as for [`HashIndex::find`].
    pub fn seek_after(&self, hash: u64, mut cmp: impl FnMut(u64) -> Ordering) -> usize {
        let (start, end) = self.hash_run(hash);
        start + self.slots[start..end].partition_point(|&w| !cmp(self.loc_of(w)).is_gt())
    }

    /// The first occupied position at or after `pos`. Skips empty blocks
    /// of slots by their counts, so that a walk through an index emptied
    /// at one end costs a byte per 64 empty slots.
    #[inline]
    pub fn next_occupied(&self, pos: usize) -> Option<usize> {
        let low = self.low.load(Relaxed);
        let found = self.occupied_from(pos.max(low));
        if pos <= low {
            // Nothing before `found`: the next walk from the start goes there.
            self.low.store(found.unwrap_or(self.slots.len()), Relaxed);
        }
        found
    }

    /// Fills `out` with the occupied positions from `pos` on, in order,
    /// and their locations; how many (fewer than `out.len()` only at the
    /// end). A scan's walk takes its next entries so, a batch at a time.
    pub fn occupied_batch(&self, pos: usize, out: &mut [(usize, u64)]) -> usize {
        let (mut n, mut p) = (0, pos);
        while n < out.len() {
            let Some(q) = self.occupied_from(p) else {
                break;
            };
            // The rest of `q`'s block, word by word: each written, kept if
            // occupied (no branch on it), its location unpacked after.
            let end = ((q / BLOCK + 1) * BLOCK).min(self.slots.len());
            for (i, &w) in self.slots[q..end].iter().enumerate() {
                out[n] = (q + i, w);
                n += usize::from(w != 0);
                if n == out.len() {
                    break;
                }
            }
            p = end;
        }
        for (_, w) in &mut out[..n] {
            *w = self.loc_of(*w);
        }
        n
    }

    fn occupied_from(&self, pos: usize) -> Option<usize> {
        let first_in = |from: usize| {
            let end = (from / BLOCK + 1) * BLOCK;
            let rest = self.slots.get(from..end.min(self.slots.len()))?;
            let found = rest.iter().position(|&w| w != 0);
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

    /// Bits of a key hash that number the index's buckets for `slot/2`:
    /// there are about as many home slots as `2^bits` (at least as many),
    /// and at most [`HashIndex::hash_bits`] bits.
    pub fn bits(&self) -> u32 {
        self.homes.ilog2().min(self.hash_bits()).max(1)
    }

    /// The positions holding the entries whose hash begins with the
    /// `pbits` bits of `prefix` (`1 <= pbits < 64`, `prefix < 2^pbits`): a
    /// run in walk order, which may include empty slots (between
    /// clusters). Entries are sorted by hash, so they are together whatever
    /// the index's size. With more bits than the slots keep
    /// ([`HashIndex::hash_bits`]) the run may also hold entries of
    /// neighbouring prefixes that only their keys' hashes tell apart.
    pub fn prefix_run(&self, prefix: u64, pbits: u32) -> std::ops::Range<usize> {
        debug_assert!((1..64).contains(&pbits) && prefix < 1 << pbits);
        let shift = 64 - pbits;
        let start = self.hash_run(prefix << shift).0;
        // The first entry of the next prefix, or with fewer bits kept the
        // first past every entry that could have this one.
        let next = ((prefix + 1) << shift).wrapping_sub(1);
        let end = match prefix + 1 == 1 << pbits {
            true => self.slots.len(),
            false if pbits > self.hash_bits() => self.hash_run(next).1,
            false => self.hash_run(next + 1).0,
        };
        start..end.max(start)
    }

    /// Drops every entry and shrinks to the initial size.
    pub fn clear(&mut self) {
        self.slots = SlotArray::new(slots_for(MIN_HOMES, 0), &self.name);
        self.homes = MIN_HOMES;
        self.packing = Packing::FIRST;
        self.max_off = 0;
        self.len = 0;
        self.shrink_below = 0;
        *self.low.get_mut() = 0;
    }

    /// Lays the entries out again among `homes` home slots, with at least
    /// `room` empty slots after the last one, without the one at `drop`
    /// and with `new` among them.
    fn rebuild(&mut self, homes: usize, room: usize, drop: Option<usize>, new: Pending) {
        let mut entries = Vec::with_capacity(self.len + 1);
        let mut new = new;
        for (p, w) in self.entries() {
            if let Some((_, h, l)) = new.take_if(|&mut (at, ..)| at <= p) {
                entries.push((h, l));
            }
            if drop != Some(p) {
                entries.push((w, self.loc_of(w)));
            }
        }
        entries.extend(new.map(|(_, h, l)| (h, l)));
        self.lay_out(homes, room, &entries);
    }

    /// Fills an empty index with `entries` at once (bulk loading): they
    /// must be sorted by (hash, key), with no key twice.
    pub fn build_sorted(&mut self, entries: &[Slot]) {
        debug_assert!(self.len == 0);
        let homes = (entries.len() * BULK_DEN).div_ceil(BULK_NUM).max(MIN_HOMES);
        let entries: Vec<(u64, u64)> = entries.iter().map(|s| (s.hash, s.loc)).collect();
        self.lay_out(homes, 0, &entries);
    }

    /// Places `entries` ((hash, loc) sorted by (hash, key)) in a new array
    /// of `homes` homes, its tail long enough for every run plus `room`,
    /// with a packing that holds every location.
    fn lay_out(&mut self, homes: usize, room: usize, entries: &[(u64, u64)]) {
        let r = self.laid_out(homes, room, entries);
        drop(self.install(r));
    }

    /// [`HashIndex::lay_out`]'s new array, not yet in place.
    fn laid_out(&self, homes: usize, room: usize, entries: &[(u64, u64)]) -> Relaid {
        let mut packing = self.packing;
        let mut max_off = 0;
        for &(_, loc) in entries {
            if !packing.fits(loc) {
                packing = packing.widened(loc);
            }
            max_off = max_off.max(loc & low_mask(SPLIT));
        }
        let packing = packing.with_headroom(max_off);
        let words = entries.iter().map(|&(h, loc)| packing.pack(h, loc));
        self.placed(homes, room, packing, words, max_off, entries.len())
    }

    /// A new array of `homes` homes holding `words` (`len` slot words of
    /// `packing`, in walk order), each at its home or just after the one
    /// before, with a tail long enough for every run plus `room`: two
    /// passes over `words`, the first to size the tail.
    fn placed(
        &self,
        homes: usize,
        room: usize,
        packing: Packing,
        words: impl Iterator<Item = u64> + Clone,
        max_off: u64,
        len: usize,
    ) -> Relaid {
        let mask = packing.hash_mask();
        let at = |w: u64, next: usize| home_in(w & mask, homes).max(next);
        let end = words.clone().fold(0, |end, w| at(w, end) + 1);
        let mut slots = SlotArray::new(slots_for(homes, end + room), &self.name);
        let mut next = 0;
        for w in words {
            let p = at(w, next);
            slots[p] = w;
            slots.counts_mut()[p / BLOCK] += 1;
            next = p + 1;
        }
        Relaid::New(NewLayout {
            slots,
            homes,
            packing,
            max_off,
            len,
            work: len as u64,
        })
    }
}

/// A resize made ahead by [`HashIndex::relaid_for`].
pub enum Relaid {
    /// The entries in a new array.
    New(NewLayout),
    /// A shrink the entries would not fit: what deciding so cost.
    Refused(u64),
}

/// A slot array [`HashIndex::install`] replaced, unmapped when dropped.
pub struct Retired(#[allow(dead_code)] SlotArray);

/// The entries laid out in a new array, with its parameters.
pub struct NewLayout {
    slots: SlotArray,
    homes: usize,
    packing: Packing,
    max_off: u64,
    len: usize,
    /// Entries laid out or looked at to make it.
    work: u64,
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
fn slots_for(homes: usize, end: usize) -> usize {
    (homes + homes.min(256)).max(end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// Keys are u64s stored "in the arena" as loc = key + 1.
    fn key_of(loc: u64) -> u64 {
        loc - 1
    }

    /// The comparison a caller passes: the entry at a loc (its key by
    /// `key`, hashed by `hash`) against (hash(k), k).
    fn by(hash: impl Fn(u64) -> u64, key: impl Fn(u64) -> u64, k: u64) -> impl Fn(u64) -> Ordering {
        move |loc| {
            let s = key(loc);
            (hash(s), s).cmp(&(hash(k), k))
        }
    }

    /// Checks the layout, given how a loc's key and hash are found.
    fn check(ix: &HashIndex, hash: impl Fn(u64) -> u64, key: impl Fn(u64) -> u64) {
        let mut prev: Option<(u64, u64, u64)> = None;
        let mut count = 0;
        for (p, &w) in ix.slots.iter().enumerate() {
            if w == 0 {
                continue;
            }
            count += 1;
            let loc = ix.loc_of(w);
            let k = key(loc);
            assert_eq!(
                ix.kept(w),
                ix.kept(hash(k)),
                "the slot keeps its hash's top bits"
            );
            let home = ix.home(w);
            assert!(p >= home, "entry before its home");
            assert!(ix.slots[home..p].iter().all(|&w| w != 0), "gap in a run");
            // (A bag key's entries follow each other in insertion order,
            // which the tests make the order of their locs.)
            let cur = (hash(k), k, loc);
            if let Some(prev) = prev {
                assert!(prev < cur, "not sorted");
            }
            prev = Some(cur);
        }
        assert_eq!(count, ix.len());
        for (b, &c) in ix.slots.counts().iter().enumerate() {
            let end = ((b + 1) * BLOCK).min(ix.slots.len());
            let n = ix.slots[b * BLOCK..end].iter().filter(|&&w| w != 0).count();
            assert_eq!(c as usize, n, "block {b}'s count");
        }
    }

    fn check_invariants(ix: &HashIndex, hash: impl Fn(u64) -> u64) {
        check(ix, hash, key_of)
    }

    #[test]
    fn a_resize_made_ahead_is_the_one_the_change_would_make() {
        // relaid_for + install, then the change: the same array as the
        // change alone (which resizes inline), and the change resizes
        // nothing more.
        let hash = |k: u64| k.wrapping_mul(0xff51_afd7_ed55_8ccd);
        let words = |ix: &HashIndex| (ix.homes, ix.slots.to_vec());
        // Even locations, which the first packing holds (an odd one would
        // widen it: a resize no count can foresee).
        let key_of = |loc: u64| loc / 2 - 1;
        let loc = |k: u64| (k + 1) * 2;
        for hash_fn in [hash, weak_hash] {
            let mut ahead = HashIndex::default();
            let mut inline = HashIndex::default();
            let (mut grown, mut shrunk) = (0, 0);
            for k in 0..20_000u64 {
                if let Some(r) = ahead.relaid_for(1, 0) {
                    drop(ahead.install(r));
                    grown += 1;
                }
                let work = ahead.resize_work();
                ahead.insert(hash_fn(k), loc(k), by(hash_fn, key_of, k));
                assert_eq!(ahead.resize_work(), work, "the insert resized nothing");
                inline.insert(hash_fn(k), loc(k), by(hash_fn, key_of, k));
                if inline.homes != ahead.homes || k % 1000 == 0 {
                    assert_eq!(words(&ahead), words(&inline));
                }
            }
            for k in (0..20_000u64).filter(|k| k % 16 != 0) {
                if let Some(r) = ahead.relaid_for(0, 1) {
                    drop(ahead.install(r));
                    shrunk += 1;
                }
                let work = ahead.resize_work();
                for ix in [&mut ahead, &mut inline] {
                    let p = ix.find(hash_fn(k), by(hash_fn, key_of, k)).unwrap();
                    ix.remove_at(p);
                }
                assert_eq!(ahead.resize_work(), work, "the removal resized nothing");
                if inline.homes != ahead.homes || k % 1000 == 0 {
                    assert_eq!(words(&ahead), words(&inline));
                }
            }
            assert!(grown > 5 && shrunk > 0, "{grown} {shrunk}");
            check(&ahead, hash_fn, key_of);
        }
    }

    /// A bad hash function with many full collisions, to exercise ties.
    fn weak_hash(k: u64) -> u64 {
        (k % 97).wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }

    fn half_weak(k: u64) -> u64 {
        if k % 2 == 0 {
            weak_hash(k)
        } else {
            k.wrapping_mul(0xff51_afd7_ed55_8ccd)
        }
    }

    /// Random operations against a model, keys `x % keys` hashed by `hash`
    /// stored at `loc(k)` (a loc whose key is `key(loc)`).
    fn against_a_model(
        hash: impl Fn(u64) -> u64 + Copy,
        keys: u64,
        loc: impl Fn(u64) -> u64,
        key: impl Fn(u64) -> u64 + Copy,
    ) -> HashIndex {
        let mut ix = HashIndex::default();
        let mut model: BTreeMap<u64, u64> = BTreeMap::new();
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        for step in 0..60_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let k = x % keys;
            let cmp = by(hash, key, k);
            match x % 3 {
                0 | 1 => {
                    let r = ix.insert(hash(k), loc(k), cmp);
                    let was = model.insert(k, hash(k));
                    assert_eq!(r == Inserted::New, was.is_none());
                }
                _ => {
                    let found = ix.find(hash(k), cmp);
                    assert_eq!(found.is_some(), model.contains_key(&k));
                    if let Some(p) = found {
                        assert_eq!(key(ix.remove_at(p)), k);
                        model.remove(&k);
                    }
                }
            }
            if step % 5000 == 0 {
                check(&ix, hash, key);
            }
        }
        check(&ix, hash, key);
        for &k in model.keys() {
            let p = ix
                .find(hash(k), by(hash, key, k))
                .expect("a key of the model");
            assert_eq!(ix.slot(p), loc(k));
        }
        assert_eq!(ix.len(), model.len());
        ix
    }

    #[test]
    fn the_smallest_index_fills_its_one_page() {
        let ix = HashIndex::default();
        assert_eq!(ix.heap_bytes(), 4096);
        let bytes = |homes: usize| {
            let slots = slots_for(homes, 0);
            slots * 8 + slots.div_ceil(BLOCK)
        };
        assert!(bytes(MIN_HOMES) <= 4096 && bytes(MIN_HOMES + 1) > 4096);
    }

    #[test]
    fn behaves_like_a_map_under_random_operations() {
        against_a_model(half_weak, 3000, |k| k + 1, key_of);
    }

    #[test]
    fn hashes_equal_in_every_kept_bit_are_told_apart_by_their_keys() {
        // Hashes differing only below the bits a slot keeps (at most 40 of
        // them): every entry of a group ties with the others.
        let tied = |k: u64| (k % 7).wrapping_mul(0x9E37_79B9_7F4A_7C15) & !low_mask(40) | k;
        let ix = against_a_model(tied, 3000, |k| k + 1, key_of);
        assert!(ix.hash_bits() <= 40, "{} bits kept", ix.hash_bits());
    }

    #[test]
    fn locations_beyond_the_packing_widen_it_and_stay_exact() {
        // Locations of every range an arena hands out: small, large
        // offsets (up to 2^48), any class, unaligned; a loc's key is its
        // low 12 bits less one.
        let loc = |k: u64| {
            let shift = [12, 20, 30, 36, 44][(k % 5) as usize];
            let class = (k * 37) % 0xffff;
            class << SPLIT | ((k + 1) << shift | (k + 1)) & low_mask(SPLIT)
        };
        let key = |l: u64| (l & 0xfff) - 1;
        let ix = against_a_model(|k| k.wrapping_mul(0xff51_afd7_ed55_8ccd), 3000, loc, key);
        assert_eq!(ix.packing.align, 0);
        assert_eq!(ix.packing.class_bits, 16);
        assert_eq!(ix.packing.off_bits, SPLIT);
    }

    #[test]
    fn every_location_packs_and_unpacks_whatever_the_packing() {
        let locs = [
            1,
            8,
            12,
            (1 << SPLIT) - 4,
            383 << SPLIT | 8,
            u64::MAX,
            1 << 63,
        ];
        for &l in &locs {
            let mut p = Packing::FIRST;
            if !p.fits(l) {
                p = p.widened(l);
            }
            assert!(p.fits(l), "{l:#x} fits {p:?}");
            for &h in &[0, u64::MAX, 0x8000_0000_0000_0000] {
                let w = p.pack(h, l);
                assert_ne!(w, 0);
                assert_eq!(p.loc(w), l, "{l:#x} in {p:?}");
                assert_eq!(w & p.hash_mask(), h & p.hash_mask());
            }
            // A wider packing holds what a narrower one did.
            let wider = p.widened(u64::MAX);
            for &m in &locs {
                if p.fits(m) {
                    assert_eq!(wider.loc(wider.pack(7, m)), m);
                }
            }
        }
    }

    #[test]
    fn a_walk_resumes_after_any_cursor_even_across_widening() {
        // Inserting between chunks both grows the index and, with ever
        // larger offsets, widens its packing.
        walk_resumes(|k| (k << 24) + 4 * k + 8, |l| (l & low_mask(24)) / 4 - 2);
    }

    #[test]
    fn a_walk_resumes_after_any_cursor_even_across_growth() {
        walk_resumes(|k| k + 1, key_of);
    }

    fn walk_resumes(loc: impl Fn(u64) -> u64, key: impl Fn(u64) -> u64 + Copy) {
        let mut ix = HashIndex::default();
        let h = |k: u64| k.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        for k in 0..1000 {
            ix.insert(h(k), loc(k), by(h, key, k));
        }
        // Walk in chunks of 7, inserting new keys between chunks (forcing
        // growth); every original key is seen exactly once.
        let mut seen = Vec::new();
        let mut cursor: Option<(u64, u64)> = None;
        let mut extra = 1000;
        let packing = ix.packing;
        loop {
            let start = match cursor {
                None => 0,
                Some((ch, ck)) => ix.seek_after(ch, by(h, key, ck)),
            };
            let mut p = start;
            let mut taken = 0;
            while taken < 7 {
                let Some(q) = ix.next_occupied(p) else { break };
                let k = key(ix.slot(q));
                seen.push(k);
                cursor = Some((h(k), k));
                taken += 1;
                p = q + 1;
            }
            if taken == 0 {
                break;
            }
            for _ in 0..20 {
                ix.insert(h(extra), loc(extra), by(h, key, extra));
                extra += 1;
            }
        }
        check(&ix, h, key);
        let mut originals: Vec<u64> = seen.iter().copied().filter(|&k| k < 1000).collect();
        originals.sort_unstable();
        assert_eq!(originals, (0..1000).collect::<Vec<_>>());
        let mut all = seen.clone();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), seen.len(), "no key is seen twice");
        if loc(1 << 20) > 1 << 40 {
            assert_ne!(ix.packing, packing, "the packing widened meanwhile");
        }
    }

    #[test]
    fn appended_entries_of_a_key_stay_together_in_insertion_order() {
        let mut ix = HashIndex::default();
        // Locs 1..: key = loc / 1000, so loc says key and arrival.
        let key = |loc: u64| loc / 1000;
        for round in 0..40u64 {
            for k in 0..200u64 {
                let loc = k * 1000 + round + 1;
                ix.append(weak_hash(k), loc, by(weak_hash, key, k));
            }
        }
        assert_eq!(ix.len(), 8000);
        for k in 0..200u64 {
            let p = ix.find(weak_hash(k), by(weak_hash, key, k)).unwrap();
            let run: Vec<u64> = (p..p + 40).map(|q| ix.slot(q)).collect();
            assert_eq!(run, (1..=40).map(|r| k * 1000 + r).collect::<Vec<_>>());
            assert!(ix.get(p + 40).map_or(true, |l| key(l) != k));
            assert_eq!(
                ix.find_all(weak_hash(k), by(weak_hash, key, k)),
                Some((p, 40))
            );
        }
        // weak_hash collides every 97 keys: a missing key sharing the run of
        // a present one is not found, and a key of one entry beside a
        // colliding key of 40 counts one.
        assert_eq!(ix.find_all(weak_hash(1000), by(weak_hash, key, 1000)), None);
        ix.append(weak_hash(500), 500_001, by(weak_hash, key, 500));
        assert_eq!(
            ix.find_all(weak_hash(500), by(weak_hash, key, 500))
                .map(|f| f.1),
            Some(1)
        );
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
                ix.append(weak_hash(k), loc, by(weak_hash, key, k));
                model.entry(k).or_default().push(loc);
            } else if let Some(p) = ix.find(weak_hash(k), by(weak_hash, key, k)) {
                let n = model[&k].len();
                let parity = step % 2;
                let removed = ix.remove_if(p, n, |l| l % 2 == parity);
                let (gone, kept): (Vec<u64>, Vec<u64>) =
                    model[&k].iter().partition(|&&l| l % 2 == parity);
                assert_eq!(removed, gone);
                if kept.is_empty() {
                    model.remove(&k);
                } else {
                    model.insert(k, kept);
                }
            }
            if step % 2000 == 0 {
                check(&ix, weak_hash, key);
            }
        }
        check(&ix, weak_hash, key);
        for (k, locs) in &model {
            let p = ix.find(weak_hash(*k), by(weak_hash, key, *k)).unwrap();
            let run: Vec<u64> = (p..p + locs.len()).map(|q| ix.slot(q)).collect();
            assert_eq!(&run, locs, "key {k}");
        }
        assert_eq!(ix.len(), model.values().map(Vec::len).sum::<usize>());
    }

    #[test]
    fn the_index_shrinks_after_mass_deletion() {
        let mut ix = HashIndex::default();
        let h = |k: u64| k.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        for k in 0..100_000 {
            ix.insert(h(k), k + 1, by(h, key_of, k));
        }
        let big = ix.heap_bytes();
        for k in 0..99_990 {
            let p = ix.find(h(k), by(h, key_of, k)).unwrap();
            ix.remove_at(p);
        }
        check_invariants(&ix, h);
        assert!(ix.heap_bytes() * 100 < big, "{} vs {big}", ix.heap_bytes());
        for k in 99_990..100_000 {
            assert!(ix.find(h(k), by(h, key_of, k)).is_some());
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
            ix.insert(mix(k), k + 1, by(mix, key_of, k));
        }
        ix
    }

    #[test]
    fn deleting_in_walk_order_resizes_a_bounded_number_of_times() {
        let n = 100_000;
        let mut ix = filled(n);
        let before = ix.resize_work();
        let scanned_before = ix.scanned.load(Relaxed);
        // first-then-delete, as `first/1` and `delete/2` in a loop, or a
        // select_delete of everything: survivors sit at the top.
        for left in (0..n as usize).rev() {
            let p = ix.next_occupied(0).expect("an entry is left");
            ix.remove_at(p);
            assert_eq!(ix.len(), left);
            if left % 20_000 == 0 {
                check_invariants(&ix, mix);
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
        let scanned = ix.scanned.load(Relaxed) - scanned_before;
        assert!(scanned <= 8 * n, "{scanned} slots and counts scanned");
        assert_eq!(
            ix.capacity(),
            slots_for(MIN_HOMES, 0),
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
            let p = ix.find(mix(k), by(mix, key_of, k)).unwrap();
            ix.remove_at(p);
        }
        check_invariants(&ix, mix);
        // Whatever the size, no survivor is pushed far from its home.
        let mut worst = 0;
        for (p, s) in ix.entries() {
            worst = worst.max(p - ix.home(s));
        }
        assert!(worst <= MAX_SHIFT, "an entry {worst} slots from home");
        for &k in kept {
            assert!(ix.find(mix(k), by(mix, key_of, k)).is_some());
        }
        // Spread out again by new keys, it shrinks once it is due.
        for k in n..n + 1000 {
            ix.insert(mix(k), k + 1, by(mix, key_of, k));
        }
        let big = ix.capacity();
        // Removing the crowd and then half of the rest (the shrink is due
        // once half of the entries left at the last refusal are gone).
        for k in kept.iter().copied().chain(n..n + 500) {
            let p = ix.find(mix(k), by(mix, key_of, k)).unwrap();
            ix.remove_at(p);
        }
        check_invariants(&ix, mix);
        assert!(ix.capacity() * 16 < big, "{} vs {big}", ix.capacity());
    }

    #[test]
    fn removing_a_bag_key_in_walk_order_resizes_a_bounded_number_of_times() {
        let mut ix = HashIndex::default();
        let key = |loc: u64| loc / 100;
        let keys = 20_000u64;
        for k in 0..keys {
            for i in 0..5 {
                ix.append(mix(k), k * 100 + i + 1, by(mix, key, k));
            }
        }
        let before = ix.resize_work();
        while let Some(p) = ix.next_occupied(0) {
            let removed = ix.remove_if(p, 5, |_| true);
            assert_eq!(removed.len(), 5);
        }
        let work = ix.resize_work() - before;
        assert!(work <= 4 * 5 * keys, "{work}");
        check(&ix, mix, key);
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
            let cmp = |loc: u64| match loc.checked_sub(10_000) {
                Some(s) => (mix(s), s).cmp(&(mix(k), k)),
                None => (u64::MAX, loc).cmp(&(mix(k), k)),
            };
            ix.insert(mix(k), 10_000 + k, cmp);
        }
        assert_eq!(ix.len(), 5100);
        assert!(ix.capacity() < 64 * 1024, "{} slots", ix.capacity());
        let p = ix.find(u64::MAX, |_| Ordering::Equal).unwrap();
        let run: Vec<u64> = (p..p + 5000).map(|q| ix.slot(q)).collect();
        assert_eq!(run, (1..=5000).collect::<Vec<_>>());
    }

    #[test]
    fn would_resize_is_never_wrong_when_it_says_no() {
        // Locations as an arena hands them out: offsets from 8 on, in
        // multiples of 4 (an unaligned one would widen the packing, which
        // nothing can announce).
        would_resize_holds(|k, _| 4 * k + 8, |l| (l - 8) / 4);
    }

    #[test]
    fn would_resize_announces_widening_the_packing() {
        // An arena growing to 2^40 bytes, a new block for every insert:
        // the packing widens several times, each announced once offsets
        // near its limit.
        let ix = would_resize_holds(
            |k, step| ((step << 20 | k) << 2) + 8,
            |l| ((l - 8) >> 2) & low_mask(20),
        );
        assert!(ix.packing.off_bits > Packing::FIRST.off_bits + 2 * HEADROOM_BITS);
    }

    fn would_resize_holds(
        arena_loc: impl Fn(u64, u64) -> u64,
        arena_key: impl Fn(u64) -> u64 + Copy,
    ) -> HashIndex {
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
                ix.insert(mix(k), arena_loc(k, step), by(mix, arena_key, k));
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
                    .map(|(&k, &h)| ix.find(h, by(mix, arena_key, k)).unwrap()),
            } {
                let quiet = !ix.would_resize(0, 1);
                let s = ix.remove_at(p);
                model.remove(&arena_key(s));
                if quiet {
                    checked_remove += 1;
                    assert_eq!(ix.resize_work(), work, "a removal resized unannounced");
                }
            }
        }
        check(&ix, mix, arena_key);
        assert_eq!(ix.len(), model.len());
        assert!(checked_add > 1000 && checked_remove > 1000);
        ix
    }

    #[test]
    fn a_walk_skips_long_empty_stretches() {
        let mut ix = filled(50_000);
        let mut by_hash: Vec<u64> = (0..50_000).collect();
        by_hash.sort_by_key(|&k| mix(k));
        // Keep a few keys at the bottom and the top of the hash space.
        for &k in &by_hash[10..49_990] {
            let p = ix.find(mix(k), by(mix, key_of, k)).unwrap();
            ix.remove_at(p);
        }
        let mut walked = Vec::new();
        let mut p = 0;
        while let Some(q) = ix.next_occupied(p) {
            walked.push(key_of(ix.slot(q)));
            p = q + 1;
        }
        let mut expected: Vec<u64> = by_hash[..10].to_vec();
        expected.extend_from_slice(&by_hash[49_990..]);
        assert_eq!(walked, expected);
    }

    #[test]
    fn a_walk_a_batch_at_a_time_finds_what_one_at_a_time_finds() {
        let mut ix = filled(5_000);
        // Empty stretches of every length, whole blocks among them.
        for k in (0..5_000u64).filter(|k| mix(*k) % 7 < 3 || (k / 300) % 3 == 1) {
            let p = ix.find(mix(k), by(mix, key_of, k)).unwrap();
            ix.remove_at(p);
        }
        let mut one_by_one = Vec::new();
        let mut p = 0;
        while let Some(q) = ix.next_occupied(p) {
            one_by_one.push((q, ix.slot(q)));
            p = q + 1;
        }
        assert!(one_by_one.len() > 1_000);
        for size in [1, 3, 64, 200] {
            let (mut batched, mut from) = (Vec::new(), 0);
            let mut out = vec![(0, 0); size];
            loop {
                let n = ix.occupied_batch(from, &mut out);
                batched.extend_from_slice(&out[..n]);
                if n < size {
                    break;
                }
                from = out[n - 1].0 + 1;
            }
            assert_eq!(batched, one_by_one, "batches of {size}");
        }
    }
}
