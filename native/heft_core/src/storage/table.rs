//! A table: its key index and the arena behind one read/write lock.
//!
//! Four kinds, as in ETS ([`Kind`]): a set and a bag (or duplicate_bag)
//! keep a hash index (see [`entries`]), a bag several entries a key in
//! insertion order; an ordered_set keeps an ordered index whose keys
//! compare in Erlang term order ([`crate::order`]).
//!
//! Callers encode and compress outside the lock ([`Table::prepare`]); under
//! the write lock a change is an arena allocation, a copy and an index
//! update. Readers copy a record's stored bytes out under the read lock and
//! decompress and decode after releasing it, so no lock is held while
//! (de)compressing (bag inserts may inflate a stored body to compare two
//! objects, see [`objects`]). Updates that read, compute and write
//! (counters, element updates) use [`Table::replace_if`], a compare-and-swap
//! on the record's offset and bytes, and retry when another writer got there
//! first.

mod compact;
pub use compact::{compact_now, Compacted, Compactions, Done as CompactDone};
mod entries;
mod evict;
mod expire;
pub use expire::Ttl;
pub mod learn;
mod objects;
mod tier;
mod vm_refs;
mod worker;

use std::cmp::Ordering;
use std::collections::HashMap;
use std::io;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering as AtomicOrdering};
use std::sync::{Arc, OnceLock};

use parking_lot::{
    MappedRwLockReadGuard, MappedRwLockWriteGuard, RwLock, RwLockReadGuard,
    RwLockUpgradableReadGuard, RwLockWriteGuard,
};

use crate::arena::{Arena, Backing};
use crate::atoms::AtomTable;
use crate::codec;
use crate::compress::{self, Codec, Compression, Packed};
use crate::dict::Dictionaries;
use crate::hash::KeyedHash;
use crate::index::Slot;
use crate::record::{self, Header};
use crate::sieve::{Judgement, Sieve};
use entries::{Entries, Order, Pos, AHEAD_BATCH};
pub use evict::Budget;
pub use tier::Moved;

/// A table's kind, with ETS's semantics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// One object a key; keys match (`=:=`).
    Set,
    /// One object a key; keys compare equal (`==`, so `1` and `1.0` are one
    /// key) and are kept in Erlang term order.
    OrderedSet,
    /// Any number of objects a key, but no two matching (`=:=`) ones; keys
    /// match (`=:=`).
    Bag,
    /// Any number of objects a key, duplicates kept.
    DuplicateBag,
}

impl Kind {
    /// True for bag and duplicate_bag: several objects a key.
    pub fn is_bag(self) -> bool {
        matches!(self, Kind::Bag | Kind::DuplicateBag)
    }
}

/// Which way a walk goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// First to last.
    Forward,
    /// Last to first: descending keys in an ordered_set; in a hash table
    /// the keys in the order of `Forward` (as ETS's `last/1` and `prev/2`
    /// are its `first/1` and `next/2` there), each key's objects last to
    /// first (as ETS's `foldr/3`).
    Backward,
}

/// How to build a table.
#[derive(Clone, Debug)]
pub struct Options {
    /// Where the arena keeps its pages.
    pub backing: Backing,
    /// How bodies are compressed.
    pub compression: Compression,
    /// Shown in /proc/PID/maps and in file arena names.
    pub label: String,
    /// The table's kind.
    pub kind: Kind,
}

/// What a table operation can fail with.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The table has been deleted.
    Deleted,
    /// The arena could not grow (for a file arena: the disk is full), or
    /// the journal could not log the change. The table is unchanged and
    /// still readable.
    Io(io::Error),
    /// The journal refuses writes since a failed fsync (persist.rs); the
    /// table is unchanged and still readable.
    Poisoned,
    /// The journal needs I/O that may block before it can log the change
    /// (a new log segment); the table is unchanged. Retry where blocking
    /// is allowed, after `Persisted::make_room`.
    WouldBlock,
    /// In a [`quick`] call: the change would take long (resize a large
    /// index, or clear a large table); the table is unchanged. Retry
    /// outside `quick`.
    TooLong,
    /// A tiered table's memory budget is taken by what cannot move to its
    /// file (the key index and the table's other bookkeeping): the change
    /// would add keys; the table is unchanged (table/tier.rs).
    MemoryBudget,
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Deleted => write!(f, "the table has been deleted"),
            Error::Io(e) => write!(f, "i/o: {e}"),
            Error::Poisoned => write!(f, "the table's log failed to sync; reopen it"),
            Error::WouldBlock => write!(f, "the table's log needs a new segment first"),
            Error::TooLong => write!(f, "the change would take too long for a quick call"),
            Error::MemoryBudget => write!(f, "the table's memory budget is taken by its index"),
        }
    }
}

/// Slots of a hash index that a quick call may resize (a resize handles
/// each: about a tenth of a millisecond for these).
const QUICK_RESIZE_SLOTS: usize = 1 << 15;
/// Bytes of index and arena a quick call may clear (giving back 4 MiB of
/// pages takes about as long).
const QUICK_CLEAR_BYTES: u64 = 4 << 20;
/// Keys a bounded table evicts in one quick call at most (the rest at
/// later writes, or at once if the write is retried outside `quick`).
const QUICK_EVICTIONS: usize = 64;
/// Bytes a bounded table's write may bring in a quick call: more could
/// evict many keys, so the write is retried outside `quick`.
const QUICK_BOUNDED_BYTES: usize = 64 << 10;

thread_local! {
    /// Set inside [`quick`].
    static QUICK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Set inside [`quick`] once the call has asked for a table's write lock.
    static QUICK_LOCKED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Compressed bodies on their way into a Prepared, reused per thread.
    static PACKED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    /// How long quick calls on this thread have waited for tables' locks
    /// since [`take_lock_waits`].
    static LOCK_WAITS: std::cell::Cell<std::time::Duration> =
        const { std::cell::Cell::new(std::time::Duration::ZERO) };
}

/// How long quick calls on this thread waited for tables' locks since the
/// last call: a caller that tells a scheduler what its work cost leaves
/// that out (ops.rs of the NIF).
pub fn take_lock_waits() -> std::time::Duration {
    LOCK_WAITS.replace(std::time::Duration::ZERO)
}

/// A quick call's lock: taken at once (`now`), or else within its wait
/// (`within`), the time waited added to [`LOCK_WAITS`].
fn lock_within<G>(
    now: impl FnOnce() -> Option<G>,
    within: impl FnOnce() -> Option<G>,
) -> Result<G, Error> {
    if let Some(g) = now() {
        return Ok(g);
    }
    let start = std::time::Instant::now();
    let g = within();
    LOCK_WAITS.set(LOCK_WAITS.get() + start.elapsed());
    g.ok_or(Error::TooLong)
}

/// Expired keys a quick call's walk step passes over before it gives up
/// (table/expire.rs): a step takes about a microsecond.
const MAX_EXPIRED_STEPS: usize = 256;

/// Expired keys not yet swept that a quick call's count of records looks
/// up before it gives up ([`Table::len`]).
const MAX_DUE_COUNTED: usize = 2048;

#[cfg(test)]
thread_local! {
    /// Tests: called by [`Table::make_room`] on this thread once it has
    /// laid the index out ahead, before it takes the write lock.
    static WHILE_RELAYING: std::cell::RefCell<Option<Box<dyn FnMut()>>> =
        const { std::cell::RefCell::new(None) };
}

/// How long a quick call waits for a table's lock before it gives up with
/// [`Error::TooLong`] (to be made again where waiting is allowed): far
/// longer than a call's own hold (microseconds), shorter than the long
/// ones (a resize, a large clear, a background step of up to 500 us). A
/// wait blocks the normal scheduler's thread, and every process queued on
/// it, so it is kept to a fifth of the millisecond a call may take there.
pub const QUICK_LOCK_WAIT: std::time::Duration = std::time::Duration::from_micros(200);

/// Tables whose storage (index and arena) is still allocated.
static LIVE: AtomicUsize = AtomicUsize::new(0);

/// Runs `f` as a quick call, for callers with a time budget (the NIF's
/// normal-scheduler variants): on this thread, a change that would take
/// long, whatever the order of earlier changes made it (resizing a large
/// index, clearing a large table), fails with [`Error::TooLong`] before
/// anything is changed or logged, for the caller to make where long work
/// is allowed. So does waiting for the table's lock longer than
/// [`QUICK_LOCK_WAIT`] (another thread resizing its index, say), up to the
/// call's first write lock: nothing has changed before that, and a retry
/// must not make a change twice.
pub fn quick<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool, bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            QUICK.set(self.0);
            QUICK_LOCKED.set(self.1);
        }
    }
    let _restore = Restore(QUICK.replace(true), QUICK_LOCKED.replace(false));
    f()
}

/// How long this thread may wait for a table's lock (`write`: the write
/// lock): [`QUICK_LOCK_WAIT`] in a quick call up to and including its
/// first write lock, else as long as it takes.
fn lock_wait(write: bool) -> Option<std::time::Duration> {
    if !QUICK.get() || QUICK_LOCKED.get() {
        return None;
    }
    QUICK_LOCKED.set(write);
    Some(QUICK_LOCK_WAIT)
}

/// Number of tables, in this process, whose storage is still allocated:
/// created and not yet deleted, or deleted with storage not yet freed.
pub fn live_tables() -> usize {
    LIVE.load(AtomicOrdering::Relaxed)
}

impl std::error::Error for Error {}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        Error::Io(e)
    }
}

// ---- Persistence hook (persist.rs): every change is shown to the journal
// under the write lock, after its blocks are allocated and before it is
// applied, so log order is apply order and a change the journal refuses is
// not applied.

/// One change as the journal sees it. Replaying a log applies each with
/// the table kind's rule, as [`Table::bulk_finish`] does.
#[derive(Clone, Copy, Debug)]
pub enum Change<'a> {
    /// A record as stored (header, key, body): it replaces the record of an
    /// equal key (set, ordered_set) or joins its key's records, after them
    /// (bag, duplicate_bag, which log a changed key whole: its `Delete`,
    /// then a `Put` of each of its records).
    Put(&'a [u8]),
    /// The records of this encoded key (or, in an ordered_set, of an equal
    /// key) are removed.
    Delete(&'a [u8]),
    /// Every record is removed.
    Clear,
}

/// Logs changes before a table applies them (see persist.rs).
pub trait Journal: Send + Sync {
    /// Logs `changes`, which the table applies atomically once this returns
    /// `Ok`. On error the table applies nothing and returns the error.
    fn log(&self, changes: &[Change<'_>]) -> Result<(), Error>;

    /// `records` were stored again another way (re-compressed), which is
    /// not logged: the log and snapshot still hold them as they were, and
    /// only the next dump stores them as they are now.
    fn rewritten(&self, _records: u64) {}

    /// The table made a zstd dictionary: the journal may log it now
    /// rather than with the next write (called off the table's lock).
    fn dictionary_added(&self) {}
}
// ---- end of persistence hook

/// Records placed in the arena but not yet indexed, while a table is
/// loaded in bulk (recovery.rs): [`Table::bulk_put`], then
/// [`Table::bulk_finish`].
#[derive(Default)]
pub struct Bulk {
    slots: Vec<Slot>,
}

impl Bulk {
    /// Records placed and not yet indexed.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// True when nothing waits to be indexed.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }
}

/// A record made ready for the table outside its lock.
pub struct Prepared {
    hash: u64,
    key_len: usize,
    header_len: usize,
    raw_len: usize,
    packed: Packed,
    bytes: Vec<u8>,
    /// Bag kinds: the uncompressed body, when `bytes` holds it compressed.
    raw: Option<Vec<u8>>,
    /// Bag kinds, for an object compared ignoring the sign of zero: its
    /// canonical form with zeros normalized (see [`objects`]).
    normalized: Option<Vec<u8>>,
    /// The record holds a magic reference (table/vm_refs.rs).
    vm_refs: bool,
}

impl Prepared {
    /// Says that the record holds a magic reference ([`etf::is_magic_ref`]):
    /// once its table stores one, it counts them (table/vm_refs.rs).
    pub fn holds_vm_refs(&mut self) {
        self.vm_refs = true;
    }

    /// The record as it will be stored (header, key, body).
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The key's hash.
    pub fn hash(&self) -> u64 {
        self.hash
    }

    /// The key's canonical encoding.
    pub fn key(&self) -> &[u8] {
        &self.bytes[self.header_len..self.header_len + self.key_len]
    }

    fn stored_body(&self) -> &[u8] {
        &self.bytes[self.header_len + self.key_len..]
    }

    fn raw_body(&self) -> &[u8] {
        self.raw.as_deref().unwrap_or_else(|| self.stored_body())
    }
}

/// Records copied out of the table: their stored bytes, back to back.
#[derive(Default)]
pub struct RecordBuf {
    bytes: Vec<u8>,
    items: Vec<Item>,
}

/// One record in a [`RecordBuf`].
#[derive(Clone, Copy, Debug)]
pub struct Item {
    /// The key's hash.
    pub hash: u64,
    /// Where the record was in the arena when copied.
    pub loc: u64,
    start: usize,
    /// Its header.
    pub header: Header,
}

impl RecordBuf {
    /// An empty buffer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Forgets the records, keeping the allocation.
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.items.clear();
    }

    /// The records copied.
    pub fn items(&self) -> &[Item] {
        &self.items
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The stored bytes of record `it` (header, key, body).
    pub fn record(&self, it: &Item) -> &[u8] {
        &self.bytes[it.start..it.start + it.header.total_len()]
    }

    /// The key of record `it`.
    pub fn key(&self, it: &Item) -> &[u8] {
        let s = it.start + it.header.key_start();
        &self.bytes[s..s + it.header.key_len]
    }

    /// The body of record `it`, decompressed into `scratch` if need be.
    /// `dicts` are the dictionaries of the table it was copied from.
    pub fn body<'a>(
        &'a self,
        it: &Item,
        dicts: &Dictionaries,
        scratch: &'a mut Vec<u8>,
    ) -> Result<&'a [u8], compress::CorruptBody> {
        let s = it.start + it.header.body_start();
        let stored = &self.bytes[s..s + it.header.stored_len];
        compress::unpack(&it.header, stored, dicts, scratch)
    }

    /// Reverses each run of records with one key, from item `from` on.
    fn reverse_runs(&mut self, from: usize) {
        let mut start = from;
        while start < self.items.len() {
            let same = |a: &Item, b: &Item| a.hash == b.hash && self.key(a) == self.key(b);
            let first = self.items[start];
            let len = self.items[start..]
                .iter()
                .take_while(|it| same(&first, it))
                .count();
            self.items[start..start + len].reverse();
            start += len;
        }
    }

    fn push(&mut self, hash: u64, loc: u64, header: Header, bytes: &[u8]) {
        let start = self.bytes.len();
        self.bytes.extend_from_slice(bytes);
        self.items.push(Item {
            hash,
            loc,
            start,
            header,
        });
    }
}

/// A stored record as [`Table::chunk_kept`]'s filter sees it.
pub struct Stored<'a> {
    header: Header,
    bytes: &'a [u8],
}

impl Stored<'_> {
    /// The record's key, encoded.
    pub fn key(&self) -> &[u8] {
        &self.bytes[self.header.key_start()..self.header.body_start()]
    }

    /// The record's body, uncompressed (into `scratch` if it was stored
    /// compressed).
    pub fn body<'s>(
        &'s self,
        dicts: &Dictionaries,
        scratch: &'s mut Vec<u8>,
    ) -> Result<&'s [u8], compress::CorruptBody> {
        compress::unpack(&self.header, self.stored_body(), dicts, scratch)
    }

    /// The record's body as stored (compressed or not).
    fn stored_body(&self) -> &[u8] {
        let s = self.header.body_start();
        &self.bytes[s..s + self.header.stored_len]
    }

    /// What `sieve` says of the record, and what judging it cost in the
    /// bytes a walk's budget counts ([`Stored::read_cost`] of what the
    /// sieve read of the body; 0 if it looked at the key only).
    pub fn judge<'n>(
        &self,
        sieve: &Sieve,
        dicts: &Dictionaries,
        scratch: &mut Vec<u8>,
        atom_name: impl Fn(u32) -> &'n str + Copy,
    ) -> (Judgement, usize) {
        // A sieve of one clause of quick tests judges the bytes as stored
        // (a body stored compressed goes the general way).
        let body = (self.header.codec == Codec::Raw && sieve.quick_needs_body())
            .then(|| self.stored_body());
        if let Some((judged, reach)) = sieve.judge_quick(self.key(), body) {
            // Nothing read of the body (the key decided) costs nothing.
            return (judged, if reach > 0 { self.read_cost(reach) } else { 0 });
        }
        let mut asked = false;
        let (judged, reach) = sieve.judge_reach(
            self.key(),
            || {
                asked = true;
                self.body(dicts, scratch).ok()
            },
            atom_name,
        );
        (judged, if asked { self.read_cost(reach) } else { 0 })
    }

    /// What reading the first `reach` bytes of its body cost, in the
    /// bytes a walk's budget counts: those bytes of a body stored as it
    /// is, the whole body of one that had to be decompressed first.
    pub fn read_cost(&self, reach: usize) -> usize {
        match self.header.codec {
            Codec::Raw => reach.min(self.header.raw_len),
            _ => self.header.raw_len,
        }
    }
}

/// The entries a walk steps to and their locations, found a batch at a
/// time ([`Entries::batch_after`]): stepping entry by entry cost a search
/// of the index for each.
struct Steps {
    batch: [(Pos, u64); AHEAD_BATCH],
    len: usize,
    at: usize,
    /// Where the next batch starts after; `None` once the last is taken.
    from: Option<Pos>,
    back: bool,
}

impl Steps {
    /// The entries after `pos` (before it if `back`).
    fn after(pos: Option<Pos>, back: bool) -> Steps {
        Steps {
            batch: [(Pos::Hash(0), 0); AHEAD_BATCH],
            len: 0,
            at: 0,
            from: pos,
            back,
        }
    }

    #[inline(always)]
    fn next(&mut self, e: &Entries) -> Option<(Pos, u64)> {
        if self.at == self.len {
            self.len = e.batch_after(self.from?, self.back, &mut self.batch);
            self.at = 0;
            self.from = (self.len == AHEAD_BATCH).then(|| self.batch[AHEAD_BATCH - 1].0);
            if self.len == 0 {
                return None;
            }
        }
        self.at += 1;
        Some(self.batch[self.at - 1])
    }
}

/// What [`Table::chunk_kept`]'s filter says of a record, and what reading
/// it cost ([`Stored::read_cost`]; 0 if it looked at the key only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kept {
    Yes { read: usize },
    No { read: usize },
}

/// Where a walk stopped: the last (hash, key) it returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cursor {
    /// The key's hash.
    pub hash: u64,
    /// The key's encoding.
    pub key: Vec<u8>,
}

/// One end of a key range: a bound for [`crate::order::compare_bound`] (a key
/// encoding in which the atom [`crate::order::WILDCARD`] stands for any term) and
/// whether keys equal to it lie in the range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bound {
    /// The bound's encoding, made as a key's.
    pub key: Vec<u8>,
    /// Whether keys `Equal` to the bound are in the range.
    pub inclusive: bool,
}

/// The keys of an ordered_set walk that [`Table::chunk_range`] visits:
/// those not below `lo` and not above `hi` in term order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyRange {
    /// The lower end, if any.
    pub lo: Option<Bound>,
    /// The upper end, if any.
    pub hi: Option<Bound>,
}

impl KeyRange {
    /// True if `key` lies before the range.
    fn below(&self, key: &[u8], names: &AtomTable) -> bool {
        past(self.lo.as_ref(), key, names, Ordering::Less)
    }

    /// True if `key` lies after the range.
    fn above(&self, key: &[u8], names: &AtomTable) -> bool {
        past(self.hi.as_ref(), key, names, Ordering::Greater)
    }
}

/// True if `key` lies beyond `end` on the `side` of it (`Less`: below a
/// lower end, `Greater`: above an upper one); never for no end.
fn past(end: Option<&Bound>, key: &[u8], names: &AtomTable, side: Ordering) -> bool {
    end.is_some_and(|b| {
        let o = crate::order::compare_bound(key, &b.key, |id| names.name(id).unwrap_or(""));
        o == side || (o == Ordering::Equal && !b.inclusive)
    })
}

/// Figures about a table, all in bytes except `size`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Records in the table.
    pub size: u64,
    /// The key index: the hash index's slot array, or the ordered index's
    /// pages in use and directory (see each index's `heap_bytes`).
    pub index_bytes: u64,
    /// Other heap memory: the atom dictionary (estimated from capacities),
    /// the arena's free lists, the zstd dictionaries, a bounded table's
    /// eviction queue, deadlines, a tiered table's queue and the counts of
    /// magic references (table/vm_refs.rs).
    pub meta_bytes: u64,
    /// The zstd dictionaries (their bytes and digests; part of
    /// `meta_bytes`).
    pub dictionary_bytes: u64,
    /// Length of the arena mapping.
    pub arena_mapped_bytes: u64,
    /// Arena bytes handed out: live blocks, freed blocks awaiting reuse, and
    /// an 8-byte head; pages given back to the kernel are not counted.
    pub arena_used_bytes: u64,
    /// Arena bytes in blocks holding records, size-class slack included.
    pub arena_live_bytes: u64,
    /// Arena bytes in freed blocks awaiting reuse.
    pub arena_free_bytes: u64,
    /// The part of those still in memory (or, for a file arena, on disk):
    /// what a compaction could give back.
    pub arena_reclaimable_bytes: u64,
    /// Sum over records of key plus uncompressed body.
    pub payload_raw_bytes: u64,
    /// Sum over records of header, key and body as stored.
    pub payload_stored_bytes: u64,
    /// Start address of the arena mapping (to find it in smaps).
    pub arena_address: u64,
    /// Start address of the index's mapping (slot array or pages).
    pub index_address: u64,
    /// A bounded table's budget (table/evict.rs); all `None` otherwise.
    pub budget: Budget,
    /// What a budget counts ([`Table::set_budget`]); 0 if unbounded.
    pub budget_used_bytes: u64,
    /// The eviction queue and its marks (part of `meta_bytes`).
    pub eviction_bytes: u64,
    /// Keys and records evicted (bounded tables).
    pub evicted_keys: u64,
    pub evicted_records: u64,
    /// Lookups (`get`, `contains`) that found their key, and those that did
    /// not (counted in bounded tables only).
    pub hits: u64,
    pub misses: u64,
    /// The table's time to live in milliseconds (table/expire.rs).
    pub ttl: Option<u64>,
    /// Whether the table has deadlines at all (a time to live, or a
    /// write gave one).
    pub expires: bool,
    /// Keys with a deadline, expired or not, that are not yet removed.
    pub expiring_keys: u64,
    /// Keys and records removed because they had expired.
    pub expired_keys: u64,
    pub expired_records: u64,
    /// The deadlines (part of `meta_bytes`).
    pub expiry_bytes: u64,
    /// A tiered table's two tiers (table/tier.rs); `None` for others. The
    /// `arena_*` figures above count both tiers but for
    /// `arena_reclaimable_bytes`, which only memory's compaction gives
    /// back.
    pub tier: Option<TierStats>,
}

/// A tiered table's memory and file (table/tier.rs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierStats {
    /// Bytes of records memory keeps, at most, once the mover has run.
    pub memory_budget: u64,
    /// Arena bytes in memory: handed out, and in blocks holding records.
    pub memory_used_bytes: u64,
    pub memory_live_bytes: u64,
    /// Arena bytes in the file: handed out, and in blocks holding records.
    pub file_used_bytes: u64,
    pub file_live_bytes: u64,
    /// Records and bytes moved from memory to the file so far.
    pub moved_records: u64,
    pub moved_bytes: u64,
    /// The queue of keys in memory (part of `meta_bytes`).
    pub queue_bytes: u64,
    /// Records lookups found in the file, and their bytes.
    pub file_reads: u64,
    pub file_read_bytes: u64,
    /// Where the file is mapped (to find it in /proc/self/smaps).
    pub file_address: u64,
}

/// A table's storage. Dropping it frees the index and unmaps the arena.
pub struct State {
    entries: Entries,
    /// The table's dictionaries (the same as [`Table::dictionaries`]), for
    /// comparing compressed bag objects under the lock.
    dicts: Arc<Dictionaries>,
    arena: Arena,
    raw_bytes: u64,
    stored_bytes: u64,
    /// Records by codec and by dictionary.
    tally: learn::Tally,
    /// A bounded table's eviction queue (table/evict.rs).
    evict: Option<evict::Evict>,
    /// The deadlines of keys written with a time to live (table/expire.rs).
    expiry: Option<expire::Expiry>,
    /// A tiered table's queue of keys with records in memory
    /// (table/tier.rs).
    tier: Option<tier::Tier>,
    /// The VM objects its records name, once one has (table/vm_refs.rs).
    vm_refs: Option<vm_refs::VmRefs>,
}

impl Drop for State {
    fn drop(&mut self) {
        LIVE.fetch_sub(1, AtomicOrdering::Relaxed);
    }
}

impl State {
    /// Bytes mapped by the arena (what dropping this state unmaps).
    pub fn mapped_bytes(&self) -> u64 {
        self.arena.mapped_bytes()
    }

    /// Removes a file arena's file now (its name; its pages stay mapped
    /// until this state is dropped), so that a table's delete has removed
    /// its file when it returns, while the unmapping, which takes
    /// milliseconds for gigabytes, is left to a thread.
    pub fn remove_files(&mut self) {
        self.arena.remove_file();
    }
}

impl State {
    #[inline(always)]
    fn record_at(&self, loc: u64) -> (Header, &[u8]) {
        record_in(&self.arena, loc)
    }

    fn key_at(&self, loc: u64) -> &[u8] {
        key_in(&self.arena, loc)
    }

    /// The first entry of `key` and how many it has.
    fn find(&self, ord: Order, hash: u64, key: &[u8]) -> Option<(Pos, usize)> {
        self.entries.find(&self.arena, ord, hash, key)
    }

    /// What tells expired keys apart now (table/expire.rs).
    fn clock(&self) -> expire::Clock<'_> {
        match &self.expiry {
            Some(e) => e.clock(expire::now()),
            None => expire::Clock::NONE,
        }
    }

    /// The first key from `pos` on, walking in `dir`, that has not
    /// expired. In a quick call, [`Error::TooLong`] past
    /// [`MAX_EXPIRED_STEPS`] expired keys (the sweep has not caught up).
    fn past_expired(
        &self,
        ord: Order,
        dir: Direction,
        mut pos: Option<Pos>,
    ) -> Result<Option<Pos>, Error> {
        let clock = self.clock();
        if clock.is_none() {
            return Ok(pos);
        }
        let mut steps = 0;
        while let Some(p) = pos {
            let key = self.key_at(self.entries.loc(p));
            if !clock.expired(key) {
                break;
            }
            steps += 1;
            if steps > MAX_EXPIRED_STEPS && QUICK.get() {
                expire::wake();
                return Err(Error::TooLong);
            }
            // The next key in walk order (a hash table's last/prev walk
            // forward, as ETS's do).
            pos = match (dir, ord) {
                (Direction::Backward, Order::Term(_)) => self.entries.prev(p),
                _ => self.entries.next_key(&self.arena, p),
            };
        }
        Ok(pos)
    }

    /// [`State::find`], but `None` for a key that has expired.
    fn find_live(
        &self,
        clock: &expire::Clock,
        ord: Order,
        hash: u64,
        key: &[u8],
    ) -> Option<(Pos, usize)> {
        self.find(ord, hash, key).filter(|&(pos, _)| {
            clock.is_none() || !clock.expired(self.key_at(self.entries.loc(pos)))
        })
    }

    /// Drops the deadline of `key` (as stored).
    fn forget_deadline(&mut self, key: &[u8]) {
        if let Some(e) = self.expiry.as_mut() {
            e.forget(key);
        }
    }

    /// The locs of `key`'s records, in order.
    fn key_locs(&self, ord: Order, hash: u64, key: &[u8]) -> Vec<u64> {
        match self.find(ord, hash, key) {
            Some((pos, n)) => (0..n)
                .map(|i| self.entries.loc(Entries::nth(pos, i)))
                .collect(),
            None => Vec::new(),
        }
    }

    /// In a [`quick`] call, refuses a change that adds `added()` entries
    /// (at most `at_most`) and removes `removed` if it could resize a large
    /// index; `added` is counted only where that could be so.
    fn refuse_long(
        &self,
        at_most: usize,
        added: impl FnOnce() -> usize,
        removed: usize,
    ) -> Result<(), Error> {
        let long = QUICK.get()
            && self
                .entries
                .would_resize_over(QUICK_RESIZE_SLOTS, at_most, added, removed);
        if long {
            return Err(Error::TooLong);
        }
        Ok(())
    }

    /// Removes the entry at `pos` and frees its record.
    fn remove_at(&mut self, pos: Pos) {
        let loc = self.entries.remove_at(pos);
        self.release(loc);
    }

    fn release(&mut self, loc: u64) {
        if let Some(v) = self.vm_refs.as_mut() {
            let (_, bytes) = record_in(&self.arena, loc);
            v.remove(bytes, &self.dicts);
        }
        let h = self.record_at(loc).0;
        self.raw_bytes -= (h.key_len + h.raw_len) as u64;
        self.stored_bytes -= h.total_len() as u64;
        self.tally.remove(h.codec, h.dict);
        self.arena.free(loc);
    }

    /// Allocates and fills blocks for all of `recs`, or none of them.
    fn place(&mut self, recs: &[&Prepared]) -> Result<Vec<u64>, Error> {
        let mut locs = Vec::with_capacity(recs.len());
        for r in recs {
            match self.arena.alloc(r.bytes.len()) {
                Ok(loc) => locs.push(loc),
                Err(e) => {
                    for loc in &locs {
                        self.arena.free(*loc);
                    }
                    return Err(e.into());
                }
            }
        }
        if self.vm_refs.is_none() && recs.iter().any(|r| r.vm_refs) {
            self.vm_refs = Some(vm_refs::VmRefs::default());
        }
        for (loc, r) in locs.iter().zip(recs) {
            let dst = self
                .arena
                .get_mut(*loc, r.bytes.len())
                .expect("a block just allocated lies inside the arena");
            dst.copy_from_slice(&r.bytes);
            if let Some(v) = self.vm_refs.as_mut() {
                v.add(&r.bytes, r.vm_refs, &self.dicts);
            }
            self.raw_bytes += (r.key_len + r.raw_len) as u64;
            self.stored_bytes += r.bytes.len() as u64;
            self.tally.add(r.packed.codec, r.packed.dict);
        }
        Ok(locs)
    }

    /// Indexes the record `r` placed at `loc`: after its key's objects in a
    /// bag, else replacing the object of an equal key. Returns whether it
    /// replaced one.
    fn link(&mut self, kind: Kind, ord: Order, r: &Prepared, loc: u64) -> bool {
        let State { entries, arena, .. } = self;
        let old = entries.add(arena, ord, kind.is_bag(), r.hash, r.key(), loc);
        if let Some(old) = old {
            self.release(old);
        }
        old.is_some()
    }

    /// Of `recs`, in order, those a bag stores: each unless an object of
    /// its key, stored or earlier in `recs`, matches it.
    fn new_objects<'r>(
        &self,
        ord: Order,
        recs: impl Iterator<Item = &'r Prepared>,
    ) -> Vec<&'r Prepared> {
        let mut keys: HashMap<(u64, &[u8]), objects::KeyObjects, ByHash> =
            HashMap::with_capacity_and_hasher(recs.size_hint().0, ByHash);
        let mut kept = Vec::new();
        for r in recs {
            let objs = keys
                .entry((r.hash, r.key()))
                .or_insert_with(|| objects::KeyObjects::new(self.key_locs(ord, r.hash, r.key())));
            if objs.add(&self.arena, &self.dicts, r) {
                kept.push(r);
            }
        }
        kept
    }

    /// Frees blocks `place` filled, when the change is not applied after all.
    fn unplace(&mut self, recs: &[&Prepared], locs: &[u64]) {
        for (r, loc) in recs.iter().zip(locs) {
            if let Some(v) = self.vm_refs.as_mut() {
                v.remove(&r.bytes, &self.dicts);
            }
            self.raw_bytes -= (r.key_len + r.raw_len) as u64;
            self.stored_bytes -= r.bytes.len() as u64;
            self.tally.remove(r.packed.codec, r.packed.dict);
            self.arena.free(*loc);
        }
    }

    fn copy_out(&self, pos: Pos, out: &mut RecordBuf) {
        let loc = self.entries.loc(pos);
        let (h, bytes) = self.record_at(loc);
        let hash = self.entries.hash_of(&bytes[h.key_start()..h.body_start()]);
        out.push(hash, loc, h, bytes);
    }

    /// [`State::copy_out`] of an entry whose key hash the caller knows.
    fn copy_out_as(&self, pos: Pos, hash: u64, out: &mut RecordBuf) {
        let loc = self.entries.loc(pos);
        let (h, bytes) = self.record_at(loc);
        out.push(hash, loc, h, bytes);
    }

    /// Copies out the record whose key a walk reports for the key at `pos`:
    /// that key's last entry (ETS reports a bag key's last object's key).
    fn copy_key_record(&self, pos: Pos, out: &mut RecordBuf) {
        self.copy_out(self.entries.last_of_key(&self.arena, pos), out);
    }
}

/// The record at an indexed offset. The index only ever points at records
/// this table wrote, so a bad header is a bug, not bad input.
#[inline(always)]
fn record_in(arena: &Arena, loc: u64) -> (Header, &[u8]) {
    whole_record(arena, loc).expect("a whole record at an indexed offset")
}

/// The record at `loc`, if a valid header and all it announces lie there.
#[inline(always)]
fn whole_record(arena: &Arena, loc: u64) -> Option<(Header, &[u8])> {
    let h = Header::parse_prefix(arena.tail(loc, record::MAX_HEADER)).ok()?;
    Some((h, arena.get(loc, h.total_len())?))
}

fn key_in(arena: &Arena, loc: u64) -> &[u8] {
    let (h, bytes) = record_in(arena, loc);
    &bytes[h.key_start()..h.body_start()]
}

/// What [`Table::slot`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slotted {
    /// The slot's records (possibly none) are in the buffer.
    Records,
    /// The slot number is the number of slots: past the last one.
    End,
    /// The slot number is beyond that; the table has `slots` slots.
    OutOfRange {
        /// How many slots the table has.
        slots: usize,
    },
}

/// A table.
pub struct Table {
    hasher: KeyedHash,
    /// How new writes are compressed, and what the table learns
    /// (table/learn.rs).
    learner: learn::Learner,
    dicts: Arc<Dictionaries>,
    kind: Kind,
    state: RwLock<Option<State>>,
    atoms: Arc<RwLock<AtomTable>>,
    backing: Backing,
    journal: OnceLock<Arc<dyn Journal>>,
    /// Automatic compaction (table/compact.rs).
    auto: compact::Auto,
    /// Whether the expiry sweeper looks after this table (table/expire.rs).
    swept: AtomicBool,
    /// Whether the mover looks after this table (table/tier.rs).
    moved: AtomicBool,
    /// Whether a tiered table has records in its file (table/tier.rs).
    on_disk: AtomicBool,
}

impl Table {
    /// Creates an empty table.
    pub fn new(opts: &Options) -> io::Result<Table> {
        let arena = Arena::new(&opts.backing, &opts.label)?;
        LIVE.fetch_add(1, AtomicOrdering::Relaxed);
        let hasher = KeyedHash::random();
        let level = match opts.compression {
            Compression::Zstd { level, .. } => level,
            _ => compress::ZSTD_DEFAULT_LEVEL,
        };
        let dicts = Arc::new(Dictionaries::new(level));
        Ok(Table {
            hasher,
            learner: learn::Learner::new(opts.compression),
            dicts: dicts.clone(),
            kind: opts.kind,
            state: RwLock::new(Some(State {
                entries: Entries::new(opts.kind, &opts.label, hasher),
                dicts,
                arena,
                raw_bytes: 0,
                stored_bytes: 0,
                tally: learn::Tally::default(),
                evict: None,
                expiry: None,
                tier: matches!(opts.backing, Backing::Tiered(..)).then(tier::Tier::new),
                vm_refs: None,
            })),
            atoms: Arc::new(RwLock::new(AtomTable::new())),
            backing: opts.backing.clone(),
            journal: OnceLock::new(),
            auto: compact::Auto::default(),
            swept: AtomicBool::new(false),
            moved: AtomicBool::new(false),
            on_disk: AtomicBool::new(false),
        })
    }

    /// The table's state for reading: see [`lock_wait`] for how long a
    /// quick call waits for it.
    fn read(&self) -> Result<MappedRwLockReadGuard<'_, State>, Error> {
        let guard = match lock_wait(false) {
            Some(wait) => lock_within(|| self.state.try_read(), || self.state.try_read_for(wait))?,
            None => self.state.read(),
        };
        RwLockReadGuard::try_map(guard, Option::as_ref).map_err(|_| Error::Deleted)
    }

    /// The table's state for writing, as [`Table::read`].
    fn write(&self) -> Result<MappedRwLockWriteGuard<'_, State>, Error> {
        let guard = match lock_wait(true) {
            Some(wait) => {
                lock_within(|| self.state.try_write(), || self.state.try_write_for(wait))?
            }
            None => self.state.write(),
        };
        RwLockWriteGuard::try_map(guard, Option::as_mut).map_err(|_| Error::Deleted)
    }

    /// Before a change that adds up to `added` index entries or removes up
    /// to `removed`: if it would resize a large hash index (growing by
    /// half, shrinking), makes that resize first, the new array built under
    /// an upgradable read lock, so readers go on meanwhile (writers wait),
    /// and put in place under the write lock in a moment. Outside quick
    /// calls only (a quick call refuses such a change). Best effort: the
    /// change itself still resizes if another write got there in between,
    /// or the counts were too low.
    fn make_room(&self, added: usize, removed: usize) {
        if QUICK.get() {
            return;
        }
        let up = self.state.upgradable_read();
        let Some(relaid) = up
            .as_ref()
            .and_then(|st| st.entries.relaid_for(QUICK_RESIZE_SLOTS, added, removed))
        else {
            return;
        };
        #[cfg(test)]
        WHILE_RELAYING.with(|hook| hook.borrow_mut().as_mut().map(|f| f()));
        let old = RwLockUpgradableReadGuard::upgrade(up)
            .as_mut()
            .and_then(|st| st.entries.install(relaid));
        // Unmapped after the lock is let go.
        drop(old);
    }

    /// Holds the write lock for `d`, changing nothing: what a long change
    /// looks like to other callers (for tests).
    #[doc(hidden)]
    pub fn hold_lock(&self, d: std::time::Duration) -> Result<(), Error> {
        let _st = self.write()?;
        std::thread::sleep(d);
        Ok(())
    }

    /// True if the table's lock is free within `wait` (taken and let go):
    /// for a caller that must not wait longer, before one that takes it.
    pub fn lock_free_within(&self, wait: std::time::Duration) -> bool {
        self.state.try_write_for(wait).is_some()
    }

    /// Marks the table deleted and hands back its storage, for the caller to
    /// drop where unmapping a large arena does no harm. Every later call
    /// fails with [`Error::Deleted`]. `None` if it was already deleted.
    pub fn take_storage(&self) -> Option<State> {
        self.state.write().take()
    }

    /// True once the table has been deleted.
    pub fn is_deleted(&self) -> bool {
        self.state.read().is_none()
    }

    /// The table's atom dictionary.
    pub fn atoms(&self) -> &Arc<RwLock<AtomTable>> {
        &self.atoms
    }

    /// Where the arena lives.
    pub fn backing(&self) -> &Backing {
        &self.backing
    }

    /// A file arena's bytes in RAM, page cache included (`None` for other
    /// arenas: see [`Arena::cached_bytes`]). Asked 64 MiB of the mapping
    /// per read-lock hold, so that writers never wait long.
    pub fn arena_cached_bytes(&self) -> Result<Option<u64>, Error> {
        const STEP: u64 = 64 << 20;
        let (mut from, mut total) = (0u64, 0u64);
        loop {
            let st = self.read()?;
            let Some(n) = st.arena.cached_bytes(from, STEP) else {
                return Ok(None);
            };
            total += n;
            from += STEP;
            // A tiered arena's file (its memory is its own mapping's).
            let end = st
                .arena
                .file_tier()
                .map_or(st.arena.mapped_bytes(), |f| f.mapped_bytes);
            if from >= end {
                return Ok(Some(total));
            }
        }
    }

    /// The arena file, for a file arena.
    pub fn arena_path(&self) -> Result<Option<std::path::PathBuf>, Error> {
        Ok(self.read()?.arena.path().map(|p| p.to_path_buf()))
    }

    /// The table's key hash.
    pub fn hasher(&self) -> KeyedHash {
        self.hasher
    }

    /// Replaces the key hash of a table that holds nothing yet (a
    /// persistent table takes the key it stored). False, and nothing
    /// changed, if the table holds records.
    pub fn set_hasher(&mut self, hasher: KeyedHash) -> bool {
        let empty = self.len().is_ok_and(|n| n == 0);
        if empty {
            self.hasher = hasher;
            if let Some(st) = self.state.get_mut() {
                st.entries.set_hasher(hasher);
            }
        }
        empty
    }

    /// The hash of an encoded key.
    pub fn hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash(key)
    }

    /// Makes `journal` log every later change (persist.rs). A table has at
    /// most one journal: false if it had one already.
    pub fn set_journal(&self, journal: Arc<dyn Journal>) -> bool {
        self.journal.set(journal).is_ok()
    }

    fn log(&self, changes: &[Change<'_>]) -> Result<(), Error> {
        match self.journal.get() {
            Some(j) => j.log(changes),
            None => Ok(()),
        }
    }

    fn log_puts(&self, recs: &[&Prepared]) -> Result<(), Error> {
        if self.journal.get().is_none() {
            return Ok(());
        }
        let changes: Vec<Change> = recs.iter().map(|r| Change::Put(&r.bytes)).collect();
        self.log(&changes)
    }

    /// Makes room in the arena for about `bytes` of records that a bulk
    /// load is about to place (see [`Arena::reserve`]).
    pub fn bulk_reserve(&self, bytes: u64) -> Result<(), Error> {
        Ok(self.write()?.arena.reserve(bytes)?)
    }

    /// Logs what a bag's keys hold once `recs` join them:
    /// [`Table::log_bag_key`] for each key, in one batch.
    fn log_bag_keys(&self, st: &State, ord: Order, recs: &[&Prepared]) -> Result<(), Error> {
        if self.journal.get().is_none() {
            return Ok(());
        }
        // The records of each key, keys in the order they first come.
        let mut keys: Vec<Vec<&Prepared>> = Vec::new();
        let mut at: HashMap<(u64, &[u8]), usize, ByHash> =
            HashMap::with_capacity_and_hasher(recs.len(), ByHash);
        for r in recs {
            let i = *at.entry((r.hash, r.key())).or_insert_with(|| {
                keys.push(Vec::new());
                keys.len() - 1
            });
            keys[i].push(r);
        }
        let mut changes = Vec::new();
        for joining in &keys {
            let r = joining[0];
            let stored = st.key_locs(ord, r.hash, r.key());
            key_whole(&mut changes, st, r.key(), &stored, |_| None);
            changes.extend(joining.iter().map(|j| Change::Put(&j.bytes)));
        }
        self.log(&changes)
    }

    /// Logs a bag's key whole: its `Delete`, then a `Put` of each record it
    /// holds after the change, in order: the records at `locs`, each as
    /// stored or as `swap` replaces it. A bag's put adds a record, so
    /// replaying it over a dump that already saw it would add it twice; a
    /// key put back whole replays to the same state whatever the dump saw
    /// (snapshot.rs), at the price of logging every record of a key each
    /// time it changes.
    fn log_bag_key<'r>(
        &self,
        st: &'r State,
        key: &'r [u8],
        locs: &[u64],
        swap: impl Fn(u64) -> Option<&'r Vec<u8>>,
    ) -> Result<(), Error> {
        if self.journal.get().is_none() {
            return Ok(());
        }
        let mut changes = Vec::new();
        key_whole(&mut changes, st, key, locs, swap);
        self.log(&changes)
    }

    /// Places records read back from disk (header, key, body as stored,
    /// each with its header as `Header::parse` gave it, checked by the
    /// caller to span the record's bytes exactly, and its key's
    /// [hash](Table::hash)) in the arena without indexing them: nobody may
    /// use the table until [`Table::bulk_finish`]. Not logged.
    pub fn bulk_put<'r>(
        &self,
        recs: impl ExactSizeIterator<Item = (Header, &'r [u8], u64)>,
        bulk: &mut Bulk,
    ) -> Result<(), Error> {
        let mut st = self.write()?;
        bulk.slots.reserve(recs.len());
        for (h, bytes, hash) in recs {
            let loc = st.arena.alloc(bytes.len())?;
            let dst = st
                .arena
                .get_mut(loc, bytes.len())
                .expect("a block just allocated lies inside the arena");
            dst.copy_from_slice(bytes);
            st.raw_bytes += (h.key_len + h.raw_len) as u64;
            st.stored_bytes += bytes.len() as u64;
            st.tally.add(h.codec, h.dict);
            bulk.slots.push(Slot { hash, loc });
        }
        Ok(())
    }

    /// Indexes what [`Table::bulk_put`] placed, in placing order, with the
    /// kind's rule ([`Change::Put`]): in a set or ordered_set the last
    /// record placed of equal keys wins (and replaces one already
    /// indexed); a bag or duplicate_bag keeps them all, in order, after
    /// those already indexed.
    pub fn bulk_finish(&self, bulk: &mut Bulk) -> Result<(), Error> {
        let mut st = self.write()?;
        let names = self.names();
        let ord = order(&names);
        let mut slots = std::mem::take(&mut bulk.slots);
        let bag = self.kind.is_bag();
        if st.entries.len() > 0 || self.kind == Kind::OrderedSet {
            for s in slots {
                let State { entries, arena, .. } = &mut *st;
                let key = key_in(arena, s.loc);
                if let Some(old) = entries.add(arena, ord, bag, s.hash, key, s.loc) {
                    st.release(old);
                }
            }
            self.bounded_again(&mut st, ord);
            return Ok(());
        }
        // Into an empty hash index at once: sorted by (hash, key, placing
        // order), keys compared only on equal hashes.
        if sort_by_hash(&mut slots) {
            {
                let arena = &st.arena;
                for run in slots.chunk_by_mut(|a, b| a.hash == b.hash) {
                    if run.len() > 1 {
                        run.sort_by(|a, b| key_in(arena, a.loc).cmp(key_in(arena, b.loc)));
                    }
                }
            }
            if !bag {
                // Of equal keys, keep the last placed.
                let mut kept = 0usize;
                for i in 0..slots.len() {
                    let s = slots[i];
                    match kept.checked_sub(1).map(|k| slots[k]) {
                        Some(last)
                            if last.hash == s.hash && st.key_at(last.loc) == st.key_at(s.loc) =>
                        {
                            slots[kept - 1] = s;
                            st.release(last.loc);
                        }
                        _ => {
                            slots[kept] = s;
                            kept += 1;
                        }
                    }
                }
                slots.truncate(kept);
            }
        }
        st.entries.build_sorted(&slots);
        self.bounded_again(&mut st, ord);
        Ok(())
    }

    /// After a bulk load into a bounded table: its keys queued afresh, and
    /// evicted down to its budget; a tiered table's keys in memory queued
    /// afresh.
    fn bounded_again(&self, st: &mut State, ord: Order) {
        if st.evict.is_some() {
            self.queue_all(st);
            self.enforce(st, ord);
        }
        self.queue_in_memory(st);
        self.after_tiered_write(st);
    }

    /// Places and indexes `recs` in order, all or none, logging what it
    /// stores first; a bag keeps only new objects.
    fn store(&self, st: &mut State, ord: Order, all: &[Prepared], ttl: Ttl) -> Result<(), Error> {
        let renamed = self.before_write(st, ord, all)?;
        let recs: Vec<&Prepared> = match self.kind {
            Kind::Bag => st.new_objects(ord, all.iter()),
            _ => all.iter().collect(),
        };
        if recs.is_empty() {
            self.set_deadlines(st, all, &renamed, ttl);
            return Ok(());
        }
        // Entries the records add: all in a bag, those of new keys else.
        let added = || match self.kind {
            Kind::Set => recs
                .iter()
                .filter(|r| st.find(ord, r.hash, r.key()).is_none())
                .count(),
            _ => recs.len(),
        };
        // Past a tiered table's budget, no new entry: a new key, or in a
        // bag any object stored.
        let adds =
            || self.kind.is_bag() || recs.iter().any(|r| st.find(ord, r.hash, r.key()).is_none());
        if st.pinned_over_budget() && adds() {
            return Err(Error::MemoryBudget);
        }
        st.refuse_long(recs.len(), added, 0)?;
        if QUICK.get()
            && st.evict.is_some()
            && recs.iter().map(|r| r.bytes.len()).sum::<usize>() > QUICK_BOUNDED_BYTES
        {
            return Err(Error::TooLong);
        }
        let locs = st.place(&recs)?;
        let logged = if self.kind.is_bag() {
            self.log_bag_keys(st, ord, &recs)
        } else {
            self.log_puts(&recs)
        };
        if let Err(e) = logged {
            st.unplace(&recs, &locs);
            return Err(e);
        }
        for (r, loc) in recs.iter().zip(locs) {
            // A bag's key is new if it had no object; a set's if its
            // record replaced none.
            let bag_key_new =
                self.kind.is_bag() && st.evict.is_some() && st.find(ord, r.hash, r.key()).is_none();
            let was = st.in_memory(ord, r.hash, r.key());
            let replaced = st.link(self.kind, ord, r, loc);
            self.note_write(st, ord, r, bag_key_new || !(self.kind.is_bag() || replaced));
            self.note_in_memory(st, ord, r.key(), was, loc);
        }
        self.after_tiered_write(st);
        self.set_deadlines(st, all, &renamed, ttl);
        self.learner.count(st.entries.len());
        self.enforce(st, ord);
        Ok(())
    }

    /// After `r` was linked: a bounded table queues a key new to it, and
    /// counts a replaced record as a read of its key.
    fn note_write(&self, st: &mut State, ord: Order, r: &Prepared, new_key: bool) {
        let State {
            evict,
            entries,
            arena,
            ..
        } = st;
        let Some(ev) = evict.as_mut() else { return };
        if new_key {
            self.queue_key(ev, entries, arena, ord, r.key());
        } else if !self.kind.is_bag() {
            ev.touch(r.hash);
        }
    }

    /// Queues `key` as the newest in `queue` (a bounded table's eviction
    /// queue, or a tiered table's queue of keys in memory), tidying it
    /// against what the index holds.
    fn queue_key(
        &self,
        queue: &mut evict::Evict,
        entries: &Entries,
        arena: &Arena,
        ord: Order,
        key: &[u8],
    ) {
        let find = |k: &[u8], h| entries.find(arena, ord, h, k);
        queue.added(key, entries.len(), find, |k| self.hash(k));
    }

    /// Bytes a budget counts: `info(:memory)` but for the arena's free
    /// blocks (which later writes reuse and compaction gives back), so
    /// that evicting a record brings the count down. The free lists', the
    /// atom dictionary's and the zstd dictionaries' bytes, slower to count,
    /// are those [`Table::recount_slow_bytes`] last counted.
    fn charged_bytes(&self, st: &State) -> u64 {
        st.entries.heap_bytes()
            + st.arena.live_bytes()
            + st.arena.file_tier().map_or(0, |f| f.live_bytes)
            + st.evict
                .as_ref()
                .map_or(0, |e| e.heap_bytes() + e.slow_bytes)
            + st.expiry.as_ref().map_or(0, expire::Expiry::heap_bytes)
            + st.tier.as_ref().map_or(0, tier::Tier::heap_bytes)
    }

    /// Counts the free lists', the atom dictionary's and the zstd
    /// dictionaries' bytes for a bounded table's [`Table::charged_bytes`],
    /// every
    /// [`evict::SLOW_RECOUNT`] writes (they change slowly, and the free
    /// lists are hundreds of them), or `now`.
    fn recount_slow_bytes(&self, st: &mut State, ord: Order, now: bool) {
        let Some(ev) = st.evict.as_mut() else { return };
        if ev.slow_age > 0 && !now {
            ev.slow_age -= 1;
            return;
        }
        let slow = self.slow_meta_bytes(st, ord);
        if let Some(ev) = st.evict.as_mut() {
            ev.slow_bytes = slow;
            ev.slow_age = evict::SLOW_RECOUNT;
        }
    }

    /// The part of [`Stats::meta_bytes`] that changes slowly: the atom
    /// dictionary's, the free lists' and the zstd dictionaries' bytes. An
    /// ordered_set's `ord` holds the atom dictionary's lock already.
    fn slow_meta_bytes(&self, st: &State, ord: Order) -> u64 {
        let atoms = match ord {
            Order::Term(names) => names.heap_bytes(),
            Order::Bytes => self.atoms.read().heap_bytes(),
        };
        atoms + st.arena.overhead_bytes() + self.dicts.memory() as u64
    }

    /// Whether a bounded table holds more than its budget.
    fn over_budget(&self, st: &State) -> bool {
        let Some(ev) = &st.evict else { return false };
        let b = ev.budget;
        b.max_records.is_some_and(|m| st.entries.len() as u64 > m)
            || b.max_bytes.is_some_and(|m| self.charged_bytes(st) > m)
    }

    /// Evicts keys (each with all its records) while the table is over its
    /// budget, logging each as a delete. A victim whose delete cannot be
    /// logged now (a full disk, or a new log segment needed in a quick
    /// call) is queued again and the table stays over its budget until a
    /// later write.
    fn enforce(&self, st: &mut State, ord: Order) {
        self.recount_slow_bytes(st, ord, false);
        let mut evicted = 0;
        let now = st.expiry.as_ref().map(|_| expire::now());
        while self.over_budget(st) {
            if QUICK.get() && evicted >= QUICK_EVICTIONS {
                return;
            }
            // Expired keys go before any live one is evicted.
            match now.and_then(|now| self.expire_next(st, ord, now)) {
                Some(Ok(())) => {
                    evicted += 1;
                    continue;
                }
                Some(Err(_)) => return,
                None => {}
            }
            let State {
                evict,
                entries,
                arena,
                ..
            } = &mut *st;
            let Some(ev) = evict.as_mut() else { return };
            let find = |k: &[u8], h| entries.find(arena, ord, h, k);
            let Some((key, (pos, n))) = ev.victim(find, |k| self.hash(k)) else {
                return;
            };
            if self.log(&[Change::Delete(&key)]).is_err() {
                ev.requeue(&key);
                return;
            }
            ev.evicted_keys += 1;
            ev.evicted_records += n as u64;
            st.forget_deadline(&key);
            for loc in st.entries.remove_where(pos, n, |_| true) {
                st.release(loc);
            }
            evicted += 1;
        }
    }

    /// Bounds the table by `budget` (none: unbounds it): queues its keys,
    /// in index order, and evicts down to the budget at once. Meant for a
    /// table just made or opened (it walks the whole index under the
    /// lock).
    pub fn set_budget(&self, budget: Budget) -> Result<(), Error> {
        let mut st = self.write()?;
        let names = self.names();
        let ord = order(&names);
        let bounded = budget.max_bytes.map_or(0, |m| {
            (m / compact::BOUNDED_SHARE).max(compact::BOUNDED_MIN_FREE)
        });
        self.auto.bounded.store(bounded, AtomicOrdering::Relaxed);
        if budget.is_none() {
            st.evict = None;
            return Ok(());
        }
        st.evict = Some(evict::Evict::new(budget));
        self.queue_all(&mut st);
        self.recount_slow_bytes(&mut st, ord, true);
        self.enforce(&mut st, ord);
        Ok(())
    }

    /// Queues every key of a bounded table afresh, in index order.
    fn queue_all(&self, st: &mut State) {
        let Some(mut ev) = st.evict.take() else {
            return;
        };
        ev.clear();
        let mut next = st.entries.first();
        while let Some(pos) = next {
            let key = st.key_at(st.entries.loc(pos));
            ev.requeue(key);
            next = st.entries.next_key(&st.arena, pos);
        }
        st.evict = Some(ev);
    }

    /// The table's budget (none for an unbounded table).
    pub fn budget(&self) -> Result<Budget, Error> {
        Ok(self
            .read()?
            .evict
            .as_ref()
            .map(|e| e.budget)
            .unwrap_or_default())
    }

    /// Gives the table a time to live in milliseconds (none: takes it
    /// away; keys keep the deadlines they have). Keys without a deadline
    /// get one, from now: meant for a table just made or opened (it walks
    /// the whole index under the lock). See table/expire.rs.
    pub fn set_ttl(&self, ttl: Option<u64>) -> Result<(), Error> {
        let mut st = self.write()?;
        if st.expiry.is_none() && ttl.is_none() {
            return Ok(());
        }
        let now = expire::now();
        let State {
            entries,
            arena,
            expiry,
            ..
        } = &mut *st;
        let e = expiry.get_or_insert_with(Default::default);
        e.ttl = ttl;
        if let Some(ms) = ttl {
            let mut next = entries.first();
            while let Some(pos) = next {
                let key = key_in(arena, entries.loc(pos));
                if e.deadline_of(key).is_none() {
                    e.set(key, Some(now.saturating_add(ms)));
                }
                next = entries.next_key(arena, pos);
            }
        }
        drop(st);
        self.sweep_on_its_own();
        Ok(())
    }

    /// Has the expiry sweeper remove this table's expired keys, once the
    /// holder of the table asked for automatic work
    /// ([`Table::compact_on_its_own`]).
    fn sweep_on_its_own(&self) {
        expire::SWEEPER.enlist(&self.swept, self.auto.me.get());
    }

    /// Removes up to `max` expired keys, earliest deadline first, each
    /// with all its records and logged as a delete; returns how many
    /// deadlines it took (`max`: there may be more).
    pub fn sweep(&self, max: usize) -> Result<usize, Error> {
        let now = expire::now();
        // Most of the time nothing is due: the write lock is not taken.
        let due = |st: &State| {
            st.expiry
                .as_ref()
                .and_then(|e| e.earliest())
                .is_some_and(|at| at <= now)
        };
        if !due(&*self.read()?) {
            return Ok(0);
        }
        self.make_room(0, max);
        let mut st = self.write()?;
        let names = self.names();
        let ord = order(&names);
        let mut taken = 0;
        while taken < max {
            match self.expire_next(&mut st, ord, now) {
                None => break,
                Some(r) => r?,
            }
            taken += 1;
        }
        Ok(taken)
    }

    /// Takes the key whose deadline comes first, if it is not after `now`,
    /// and removes it (logged as a delete); `None` if no key is due. A key
    /// whose delete cannot be logged keeps its place.
    fn expire_next(&self, st: &mut State, ord: Order, now: u64) -> Option<Result<(), Error>> {
        let key = st.expiry.as_mut()?.pop_due(now)?;
        let Some((pos, n)) = st.find(ord, self.hash(&key), &key) else {
            return Some(Ok(()));
        };
        // In an ordered_set another key `==` to this one may have taken
        // its place, with its own deadline.
        if st.key_at(st.entries.loc(pos)) != &key[..] {
            return Some(Ok(()));
        }
        if let Err(e) = self.log(&[Change::Delete(&key)]) {
            if let Some(x) = st.expiry.as_mut() {
                x.set(&key, Some(now));
            }
            return Some(Err(e));
        }
        self.remove_expired(st, pos, n);
        Some(Ok(()))
    }

    /// Removes a key found expired (its `n` records from `pos`, its delete
    /// logged) and counts it.
    fn remove_expired(&self, st: &mut State, pos: Pos, n: usize) {
        for loc in st.entries.remove_where(pos, n, |_| true) {
            st.release(loc);
        }
        if let Some(e) = st.expiry.as_mut() {
            e.expired_keys += 1;
            e.expired_records += n as u64;
        }
    }

    /// Before a write that names `key`: removes it, as a delete, if it has
    /// expired, so that the write finds it gone.
    fn purge_expired(
        &self,
        st: &mut State,
        ord: Order,
        hash: u64,
        key: &[u8],
    ) -> Result<(), Error> {
        if st.expiry.is_none() {
            return Ok(());
        }
        let Some((pos, n)) = st.find(ord, hash, key) else {
            return Ok(());
        };
        if !st.clock().expired(st.key_at(st.entries.loc(pos))) {
            return Ok(());
        }
        let stored = st.key_at(st.entries.loc(pos)).to_vec();
        st.refuse_long(0, || 0, n)?;
        self.log(&[Change::Delete(&stored)])?;
        st.forget_deadline(&stored);
        self.remove_expired(st, pos, n);
        Ok(())
    }

    /// Before a write of `recs` to a table with deadlines: each key that
    /// has expired is removed ([`Table::purge_expired`]); returns the keys
    /// as stored that the records will replace with other bytes (an
    /// ordered_set's key `==` to a record's), whose deadlines go once the
    /// write is made.
    fn before_write(
        &self,
        st: &mut State,
        ord: Order,
        recs: &[Prepared],
    ) -> Result<Vec<Vec<u8>>, Error> {
        let mut renamed = Vec::new();
        if st.expiry.is_none() {
            return Ok(renamed);
        }
        let now = expire::now();
        for r in recs {
            // A hash table stores a key as written: only a key whose own
            // deadline has passed is looked up. An ordered_set's stored key
            // may be another one `==` to it.
            let due = |e: &expire::Expiry| e.deadline_of(r.key()).is_some_and(|at| at <= now);
            if self.kind == Kind::OrderedSet || st.expiry.as_ref().is_some_and(due) {
                self.purge_expired(st, ord, r.hash, r.key())?;
            }
            if self.kind == Kind::OrderedSet {
                if let Some((pos, _)) = st.find(ord, r.hash, r.key()) {
                    let k = st.key_at(st.entries.loc(pos));
                    if k != r.key() {
                        renamed.push(k.to_vec());
                    }
                }
            }
        }
        Ok(renamed)
    }

    /// After `recs` were stored (or skipped, in a bag): each key's
    /// deadline as `ttl` gives it, and the keys `renamed` (see
    /// [`Table::before_write`]) lose theirs.
    fn set_deadlines(&self, st: &mut State, recs: &[Prepared], renamed: &[Vec<u8>], ttl: Ttl) {
        if st.expiry.is_none() && ttl == Ttl::Table {
            return;
        }
        let e = st.expiry.get_or_insert_with(Default::default);
        for k in renamed {
            e.forget(k);
        }
        let at = e.deadline(ttl, expire::now());
        for r in recs {
            e.set(r.key(), at);
        }
        if at.is_some() {
            self.sweep_on_its_own();
        }
    }

    /// The table's kind.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// How the table compresses new bodies (for `compression: :auto`,
    /// what it chose, or uses until it chooses).
    pub fn compression(&self) -> Compression {
        self.learner.mode()
    }

    /// The table's zstd dictionaries (dict.rs).
    pub fn dictionaries(&self) -> &Arc<Dictionaries> {
        &self.dicts
    }

    /// The atom dictionary, read-locked, for an ordered_set, whose keys
    /// compare by atom names. Always taken after the state lock (the NIF
    /// takes the dictionary's write lock only while holding neither).
    fn names(&self) -> Option<RwLockReadGuard<'_, AtomTable>> {
        (self.kind == Kind::OrderedSet).then(|| self.atoms.read())
    }

    /// Compresses and frames a record (no lock taken). `body` is the
    /// encoded record, `key` its key's canonical encoding. For a bag or
    /// duplicate_bag, `body` must be written canonically (no
    /// back-references, maps sorted; see [`codec::canonical`]).
    pub fn prepare(&self, key: &[u8], body: &[u8]) -> Prepared {
        PACKED.with(|cell| {
            let mut packed = cell.borrow_mut();
            self.prepare_with(key, body, &mut packed)
        })
    }

    fn prepare_with(&self, key: &[u8], body: &[u8], packed: &mut Vec<u8>) -> Prepared {
        let how = compress::compress(body, self.learner.mode(), &self.dicts, packed);
        let stored: &[u8] = match how.codec {
            Codec::Raw => body,
            _ => packed,
        };
        let mut bytes = Vec::new();
        record::write(&mut bytes, how, key, stored, body.len());
        let keep_raw = self.kind.is_bag() && how.codec != Codec::Raw;
        Prepared {
            hash: self.hash(key),
            key_len: key.len(),
            header_len: record::header_len(how, key.len(), stored.len(), body.len()),
            raw_len: body.len(),
            packed: how,
            bytes,
            raw: keep_raw.then(|| body.to_vec()),
            normalized: None,
            vm_refs: false,
        }
    }

    /// [`Table::prepare`] for an object of a bag or duplicate_bag that holds
    /// a float zero, on a VM where `0.0 =:= -0.0`: it matches objects that
    /// differ from it only in the sign of zeros.
    pub fn prepare_ignoring_zero_sign(&self, key: &[u8], body: &[u8]) -> Prepared {
        let mut p = self.prepare(key, body);
        p.normalized = codec::canonical(body, Some(key), true).ok();
        p
    }

    /// Inserts all records, in order. In a set or ordered_set a record
    /// replaces the one of an equal key (a later record of a batch wins);
    /// a duplicate_bag keeps every record; a bag takes the batch in order
    /// and skips records whose object matches one of its key already there
    /// or earlier in the batch (ETS before OTP 27 takes a bag's batch last
    /// object first: the caller reverses it there). All or nothing: on
    /// error none is inserted.
    pub fn insert(&self, recs: &[Prepared]) -> Result<(), Error> {
        self.insert_ttl(recs, Ttl::Table)
    }

    /// [`Table::insert`], giving the records' keys the deadline `ttl` asks
    /// for (table/expire.rs).
    pub fn insert_ttl(&self, recs: &[Prepared], ttl: Ttl) -> Result<(), Error> {
        self.make_room(recs.len(), 0);
        let mut st = self.write()?;
        let names = self.names();
        self.store(&mut st, order(&names), recs, ttl)
    }

    /// Inserts all records (as [`Table::insert`]) if none of their keys is
    /// present; returns false (inserting nothing) otherwise.
    pub fn insert_new(&self, recs: &[Prepared]) -> Result<bool, Error> {
        self.insert_new_ttl(recs, Ttl::Table)
    }

    /// [`Table::insert_new`] with a time to live, as [`Table::insert_ttl`].
    pub fn insert_new_ttl(&self, recs: &[Prepared], ttl: Ttl) -> Result<bool, Error> {
        self.make_room(recs.len(), 0);
        let mut st = self.write()?;
        let names = self.names();
        let ord = order(&names);
        let clock = st.clock();
        if recs
            .iter()
            .any(|r| st.find_live(&clock, ord, r.hash, r.key()).is_some())
        {
            return Ok(false);
        }
        self.store(&mut st, ord, recs, ttl)?;
        Ok(true)
    }

    /// Copies the records with this key into `out` (appending; several in a
    /// bag, in insertion order); false if there are none.
    pub fn get(&self, hash: u64, key: &[u8], out: &mut RecordBuf) -> Result<bool, Error> {
        let st = self.read()?;
        let names = self.names();
        let clock = st.clock();
        let found = st
            .entries
            .find_record(&st.arena, order(&names), hash, key)
            .filter(|f| {
                clock.is_none()
                    || !clock.expired(&f.bytes[f.header.key_start()..f.header.body_start()])
            });
        if let Some(ev) = &st.evict {
            ev.read(hash, found.is_some());
        }
        if let Some(t) = &st.tier {
            t.touch(hash);
            if let Some(f) = &found {
                t.read_from_file((0..f.n).map(|i| st.entries.loc(Entries::nth(f.pos, i))));
            }
        }
        let Some(f) = found else {
            return Ok(false);
        };
        out.push(f.hash, f.loc, f.header, f.bytes);
        (1..f.n).for_each(|i| st.copy_out_as(Entries::nth(f.pos, i), hash, out));
        Ok(true)
    }

    /// True if the key is present.
    pub fn contains(&self, hash: u64, key: &[u8]) -> Result<bool, Error> {
        let st = self.read()?;
        let names = self.names();
        let found = st
            .find_live(&st.clock(), order(&names), hash, key)
            .is_some();
        if let Some(ev) = &st.evict {
            ev.read(hash, found);
        }
        if let Some(t) = &st.tier {
            t.touch(hash);
        }
        Ok(found)
    }

    /// Removes every record with the key; copies them into `out` when
    /// given. Returns whether there were any.
    pub fn remove(
        &self,
        hash: u64,
        key: &[u8],
        out: Option<&mut RecordBuf>,
    ) -> Result<bool, Error> {
        self.make_room(0, 1);
        let mut st = self.write()?;
        let names = self.names();
        let ord = order(&names);
        self.purge_expired(&mut st, ord, hash, key)?;
        let Some((pos, n)) = st.find(ord, hash, key) else {
            return Ok(false);
        };
        st.refuse_long(0, || 0, n)?;
        self.log(&[Change::Delete(key)])?;
        if let Some(out) = out {
            (0..n).for_each(|i| st.copy_out_as(Entries::nth(pos, i), hash, out));
        }
        if st.expiry.is_some() {
            let stored = st.key_at(st.entries.loc(pos)).to_vec();
            st.forget_deadline(&stored);
        }
        for loc in st.entries.remove_where(pos, n, |_| true) {
            st.release(loc);
        }
        Ok(true)
    }

    /// Removes from a bag or duplicate_bag the objects of `r`'s key that
    /// match `r`'s object (`=:=`): in a bag the one, in a duplicate_bag
    /// every copy. Returns how many were removed.
    pub fn remove_object(&self, r: &Prepared) -> Result<usize, Error> {
        self.make_room(0, 1);
        let mut st = self.write()?;
        let names = self.names();
        let ord = order(&names);
        self.purge_expired(&mut st, ord, r.hash, r.key())?;
        let Some((pos, n)) = st.find(ord, r.hash, r.key()) else {
            return Ok(0);
        };
        let every = self.kind == Kind::DuplicateBag;
        let locs: Vec<u64> = (0..n)
            .map(|i| st.entries.loc(Entries::nth(pos, i)))
            .collect();
        let mut gone: Vec<u64> = Vec::new();
        for &loc in &locs {
            if (every || gone.is_empty()) && objects::same_stored(&st.arena, &st.dicts, loc, r) {
                gone.push(loc);
            }
        }
        if gone.is_empty() {
            return Ok(0);
        }
        gone.sort_unstable();
        let goes = |loc: &u64| gone.binary_search(loc).is_ok();
        // The log knows keys, not objects: the key goes, and what stays of
        // it comes back, in order.
        let stay: Vec<u64> = locs.iter().copied().filter(|l| !goes(l)).collect();
        st.refuse_long(0, || 0, gone.len())?;
        self.log_bag_key(&st, r.key(), &stay, |_| None)?;
        if stay.is_empty() {
            st.forget_deadline(r.key());
        }
        let removed = st.entries.remove_where(pos, n, |loc| goes(&loc));
        for &loc in &removed {
            st.release(loc);
        }
        Ok(removed.len())
    }

    /// Removes, of up to about `max` records after the key of `after` in
    /// walk order (from the start when `None`; a bag key's records are
    /// never split), those whose uncompressed body `doomed` picks; returns
    /// how many it removed and where to resume, `None` once the walk
    /// reached the end. For deletes by a record's shape (select_delete's
    /// `{_, _}`), with no term decoded: one pass under the write lock,
    /// logged in one batch first (a bag key that keeps records is logged
    /// whole).
    pub fn remove_chunk(
        &self,
        after: Option<&Cursor>,
        max: usize,
        doomed: impl Fn(&[u8]) -> bool,
    ) -> Result<(usize, Option<Cursor>), Error> {
        self.make_room(0, max);
        let mut st = self.write()?;
        let names = self.names();
        let ord = order(&names);
        // The keys that lose records (hash, key's range in `key_bytes`,
        // entries, range of the locs it keeps in `stay`), and every loc
        // that goes: flat, as most keys lose their one record.
        let mut keys: Vec<(u64, std::ops::Range<usize>, usize, std::ops::Range<usize>)> =
            Vec::new();
        let (mut key_bytes, mut gone, mut stay) = (Vec::new(), Vec::new(), Vec::new());
        let mut next = {
            let (e, a) = (&st.entries, &st.arena);
            match after {
                None => e.first(),
                Some(c) => e.seek(a, ord, Direction::Forward, c.hash, &c.key),
            }
        };
        let mut last = None;
        let mut seen = 0;
        let mut scratch = Vec::new();
        let clock = st.clock();
        while let Some(pos) = next.filter(|_| seen < max) {
            let (e, a, dicts) = (&st.entries, &st.arena, &st.dicts);
            let key = key_in(a, e.loc(pos));
            let hash = e.hash_of(key);
            let n = match self.kind.is_bag() {
                true => st.find(ord, hash, key).map_or(1, |(_, n)| n),
                false => 1,
            };
            if !clock.is_none() && clock.expired(key) {
                // Gone already, as far as callers see: the sweep's.
                seen += n;
                last = Some(pos);
                next = e.next(Entries::nth(pos, n - 1));
                continue;
            }
            let (gone_before, stay_before) = (gone.len(), stay.len());
            for i in 0..n {
                let loc = e.loc(Entries::nth(pos, i));
                match objects::with_raw_body(a, dicts, loc, &mut scratch, &doomed) {
                    Some(true) => gone.push(loc),
                    _ => stay.push(loc),
                }
            }
            if gone.len() > gone_before {
                let k = key_bytes.len()..key_bytes.len() + key.len();
                key_bytes.extend_from_slice(key);
                keys.push((hash, k, n, stay_before..stay.len()));
            } else {
                stay.truncate(stay_before);
            }
            seen += n;
            last = Some(pos);
            next = e.next(Entries::nth(pos, n - 1));
        }
        let resume = match (next, last) {
            (Some(_), Some(pos)) => {
                let key = st.key_at(st.entries.loc(pos));
                Some(Cursor {
                    hash: st.entries.hash_of(key),
                    key: key.to_vec(),
                })
            }
            _ => None,
        };
        if self.journal.get().is_some() && !keys.is_empty() {
            let mut changes = Vec::new();
            for (_, k, _, kept) in &keys {
                let key = &key_bytes[k.clone()];
                match kept.is_empty() {
                    true => changes.push(Change::Delete(key)),
                    false => key_whole(&mut changes, &st, key, &stay[kept.clone()], |_| None),
                }
            }
            self.log(&changes)?;
        }
        gone.sort_unstable();
        let removed = gone.len();
        for (hash, k, n, kept) in &keys {
            let key = &key_bytes[k.clone()];
            let Some((pos, _)) = st.find(ord, *hash, key) else {
                continue;
            };
            if kept.is_empty() {
                st.forget_deadline(key);
            }
            if kept.is_empty() && *n == 1 {
                st.remove_at(pos);
                continue;
            }
            for loc in st
                .entries
                .remove_where(pos, *n, |l| gone.binary_search(&l).is_ok())
            {
                st.release(loc);
            }
        }
        Ok((removed, resume))
    }

    /// How many records the key has (several in a bag: what inserting into
    /// a bag compares with, what removing the key frees). O(log n) reads.
    pub fn count(&self, hash: u64, key: &[u8]) -> Result<usize, Error> {
        let st = self.read()?;
        let names = self.names();
        Ok(st
            .find_live(&st.clock(), order(&names), hash, key)
            .map_or(0, |(_, n)| n))
    }

    /// Replaces (or with `new: None`, removes) the record `expected` names
    /// (by offset; it must still hold the same bytes) among this key's, or
    /// inserts `new` if `expected` is `None` and the key is still absent.
    /// Returns false, changing nothing, if another writer changed it
    /// meanwhile. In a bag the replacement takes the old record's place
    /// among its key's.
    pub fn replace_if(
        &self,
        hash: u64,
        key: &[u8],
        expected: Option<(&RecordBuf, &Item)>,
        new: Option<&Prepared>,
    ) -> Result<bool, Error> {
        self.make_room(usize::from(new.is_some()), usize::from(new.is_none()));
        let mut st = self.write()?;
        let names = self.names();
        let ord = order(&names);
        self.purge_expired(&mut st, ord, hash, key)?;
        let found = st.find(ord, hash, key);
        let (pos, same) = match (found, expected) {
            (None, None) => (None, true),
            (Some((first, n)), Some((buf, it))) => {
                let pos = (0..n)
                    .map(|i| Entries::nth(first, i))
                    .find(|&p| st.entries.loc(p) == it.loc);
                let same = pos.is_some_and(|_| st.record_at(it.loc).1 == buf.record(it));
                (pos, same)
            }
            _ => (None, false),
        };
        if !same {
            return Ok(false);
        }
        let bag = self.kind.is_bag();
        // A new record adds an entry if the key was absent; none removes one.
        match (pos, new) {
            (None, Some(_)) if st.pinned_over_budget() => return Err(Error::MemoryBudget),
            (None, Some(_)) => st.refuse_long(1, || 1, 0)?,
            (Some(_), None) => st.refuse_long(0, || 0, 1)?,
            // A new location may widen the index's packing.
            (Some(_), Some(_)) => st.refuse_long(0, || 0, 0)?,
            _ => {}
        }
        match (pos, new) {
            (pos, Some(new)) => {
                let locs = st.place(&[new])?;
                let logged = match (bag, pos) {
                    (true, Some(p)) => {
                        let old = st.entries.loc(p);
                        let after = st.key_locs(ord, hash, key);
                        self.log_bag_key(&st, key, &after, |l| (l == old).then_some(&new.bytes))
                    }
                    _ => self.log_puts(&[new]),
                };
                if let Err(e) = logged {
                    st.unplace(&[new], &locs);
                    return Err(e);
                }
                let was = st.in_memory(ord, hash, key);
                match (bag, pos) {
                    (true, Some(p)) => {
                        let old = st.entries.loc(p);
                        st.entries.set_loc(p, locs[0]);
                        st.release(old);
                    }
                    _ => {
                        let replaced = st.link(self.kind, ord, new, locs[0]);
                        self.note_write(&mut st, ord, new, !replaced);
                        if pos.is_none() {
                            // A key made here has the table's time to live.
                            self.set_deadlines(&mut st, std::slice::from_ref(new), &[], Ttl::Table);
                        }
                    }
                }
                self.note_in_memory(&mut st, ord, key, was, locs[0]);
                self.after_tiered_write(&st);
                self.enforce(&mut st, ord);
            }
            (Some(p), None) => {
                if bag {
                    let old = st.entries.loc(p);
                    let stay: Vec<u64> = st.key_locs(ord, hash, key);
                    let stay: Vec<u64> = stay.into_iter().filter(|&l| l != old).collect();
                    self.log_bag_key(&st, key, &stay, |_| None)?;
                    if stay.is_empty() {
                        st.forget_deadline(key);
                    }
                } else {
                    self.log(&[Change::Delete(key)])?;
                    let stored = st.key_at(st.entries.loc(p)).to_vec();
                    st.forget_deadline(&stored);
                }
                st.remove_at(p);
            }
            (None, None) => {}
        }
        Ok(true)
    }

    /// Removes every record; returns how many there were (those of expired
    /// keys not counted).
    pub fn clear(&self) -> Result<usize, Error> {
        let mut st = self.write()?;
        if QUICK.get() && st.entries.heap_bytes() + st.arena.mapped_bytes() > QUICK_CLEAR_BYTES {
            return Err(Error::TooLong);
        }
        // Records of expired keys were gone already.
        let names = self.names();
        let expired = self.expired_records(&st, order(&names))?;
        drop(names);
        self.log(&[Change::Clear])?;
        st.arena.clear()?;
        let n = st.entries.len() - expired;
        st.entries.clear();
        st.raw_bytes = 0;
        st.stored_bytes = 0;
        st.tally = learn::Tally::default();
        if let Some(ev) = st.evict.as_mut() {
            ev.clear();
        }
        if let Some(e) = st.expiry.as_mut() {
            e.clear();
        }
        if let Some(t) = st.tier.as_mut() {
            t.clear();
        }
        if let Some(v) = st.vm_refs.as_mut() {
            v.clear();
        }
        self.note_on_disk(&st);
        Ok(n)
    }

    /// How many records hold the magic reference `piece` (its ETF bytes):
    /// while some do, the NIF keeps its object alive (table/vm_refs.rs).
    #[cfg(test)]
    pub(crate) fn vm_ref_count(&self, piece: &[u8]) -> Result<usize, Error> {
        Ok(self.read()?.vm_refs.as_ref().map_or(0, |v| v.count(piece)))
    }

    /// Of the magic references no record has held since the last call and
    /// of `also`, those no record holds now (table/vm_refs.rs), under one
    /// lock; none, without taking the write lock, for a table that never
    /// stored one.
    pub fn unheld_vm_refs(&self, also: &[Vec<u8>]) -> Result<Vec<Vec<u8>>, Error> {
        if also.is_empty() && self.read()?.vm_refs.is_none() {
            return Ok(Vec::new());
        }
        let mut st = self.write()?;
        let Some(v) = st.vm_refs.as_mut() else {
            return Ok(also.to_vec());
        };
        let mut unheld = v.take_dead();
        unheld.extend(also.iter().cloned());
        unheld.retain(|piece| v.count(piece) == 0);
        Ok(unheld)
    }

    /// [`Table::chunk_in`] forward.
    pub fn chunk(
        &self,
        after: Option<&Cursor>,
        max_records: usize,
        max_raw: usize,
        out: &mut RecordBuf,
    ) -> Result<Option<Cursor>, Error> {
        self.chunk_in(Direction::Forward, after, max_records, max_raw, out)
    }

    /// Copies up to `max_records` records (stopping early once they hold
    /// `max_raw` bytes of key plus uncompressed body, the measure of what
    /// decoding them will cost) that come after the key of `after` in walk
    /// order (from the start when `None`); see [`Direction`]. A bag's key
    /// is never split between chunks: a chunk takes all of its last key's
    /// records, beyond the limits if need be. Returns where to resume, or
    /// `None` when the walk reached the end.
    pub fn chunk_in(
        &self,
        dir: Direction,
        after: Option<&Cursor>,
        max_records: usize,
        max_raw: usize,
        out: &mut RecordBuf,
    ) -> Result<Option<Cursor>, Error> {
        self.chunk_range(dir, &KeyRange::default(), after, max_records, max_raw, out)
    }

    /// [`Table::chunk_in`] over the keys of `range` only. In an
    /// ordered_set the walk starts at the range's first key in `dir` (found
    /// by binary search, not by walking) and ends after its last; other
    /// tables have no key order and ignore `range`.
    pub fn chunk_range(
        &self,
        dir: Direction,
        range: &KeyRange,
        after: Option<&Cursor>,
        max_records: usize,
        max_raw: usize,
        out: &mut RecordBuf,
    ) -> Result<Option<Cursor>, Error> {
        let every = &mut |_: &Stored| Kept::Yes { read: 0 };
        self.chunk_kept(dir, range, after, max_records, max_raw, out, every)
    }

    /// [`Table::chunk_range`] that copies only the records `keep` keeps:
    /// the others are walked (and counted against `max_records`, and
    /// against `max_raw` by their key and, where `keep` read it, their
    /// body) but not copied. Returns where to resume. `keep` runs under the
    /// table's read lock.
    #[allow(clippy::too_many_arguments)]
    pub fn chunk_kept(
        &self,
        dir: Direction,
        range: &KeyRange,
        after: Option<&Cursor>,
        max_records: usize,
        max_raw: usize,
        out: &mut RecordBuf,
        keep: &mut dyn FnMut(&Stored) -> Kept,
    ) -> Result<Option<Cursor>, Error> {
        let st = self.read()?;
        let names = self.names();
        let ord = order(&names);
        let back = dir == Direction::Backward;
        let (e, a) = (&st.entries, &st.arena);
        let clock = st.clock();
        let range = names
            .as_deref()
            .filter(|_| *range != KeyRange::default())
            .map(|n| (range, n));
        let mut p = match (after, back, range) {
            (None, false, Some((r, n))) => e.partition_point(|l| r.below(key_in(a, l), n)),
            (None, true, Some((r, n))) => match e.partition_point(|l| !r.above(key_in(a, l), n)) {
                Some(p) => e.prev(p),
                None => e.last(),
            },
            (None, false, None) => e.first(),
            (None, true, None) => e.last(),
            (Some(c), _, _) => e.seek(a, ord, dir, c.hash, &c.key),
        };
        // Whether the walk has left the range (the end it walks towards):
        // the first records walked are compared with the end; past them,
        // where the walk leaves the range is found once, by binary search,
        // and each record is only a position to compare with it.
        const COMPARED: usize = 16;
        let mut compared = 0;
        let mut stop: Option<Option<Pos>> = None;
        let mut beyond = |pos: Pos| {
            let Some((r, n)) = range else { return false };
            if let Some(stop) = stop {
                return Some(pos) == stop;
            }
            compared += 1;
            if compared > COMPARED {
                let s = if back {
                    match e.partition_point(|l| r.below(key_in(a, l), n)) {
                        Some(p) => e.prev(p),
                        None => e.last(),
                    }
                } else {
                    e.partition_point(|l| !r.above(key_in(a, l), n))
                };
                stop = Some(s);
                return Some(pos) == s;
            }
            let key = key_in(a, e.loc(pos));
            if back {
                r.below(key, n)
            } else {
                r.above(key, n)
            }
        };
        p = p.filter(|&pos| !beyond(pos));
        // Records lie scattered in the arena: the walk asks for the one
        // `AHEAD` records on while it reads this one (most of a scan's time
        // was spent waiting for each record's first cache line). The
        // positions and locations stepped to ahead (found in the index a
        // batch at a time) are kept in a ring.
        const AHEAD: usize = 8;
        let mut steps = Steps::after(p, back);
        let mut ring = [None::<(Pos, u64)>; AHEAD];
        for r in ring.iter_mut() {
            *r = steps.next(e);
            if let Some((_, loc)) = *r {
                a.prefetch(loc);
            }
        }
        let mut head = 0;
        let first = out.len();
        let (mut raw, mut walked) = (0usize, 0usize);
        // The location of the last record walked, kept or not.
        let mut last: Option<u64> = None;
        // The location of `p` once the ring gives it.
        let mut p_loc = p.map_or(0, |x| e.loc(x));
        while let Some(pos) = p {
            let full = walked >= max_records || raw >= max_raw;
            let same_key = || last.is_some_and(|l| st.key_at(e.loc(pos)) == st.key_at(l));
            if full && !(self.kind.is_bag() && same_key()) {
                break;
            }
            let loc = p_loc;
            let (h, bytes) = st.record_at(loc);
            raw += h.key_len;
            let expired = !clock.is_none() && clock.expired(&bytes[h.key_start()..h.body_start()]);
            let kept = match expired {
                true => Kept::No { read: 0 },
                false => keep(&Stored { header: h, bytes }),
            };
            match kept {
                Kept::Yes { read } => {
                    raw += read + h.raw_len;
                    st.copy_out(pos, out);
                }
                Kept::No { read } => {
                    raw += read;
                }
            }
            walked += 1;
            last = Some(loc);
            // The next record is the ring's oldest; the ring steps on.
            (p, p_loc) = ring[head].map_or((None, 0), |(pos, loc)| (Some(pos), loc));
            ring[head] = steps.next(e);
            if let Some((_, loc)) = ring[head] {
                a.prefetch(loc);
            }
            head = (head + 1) % AHEAD;
            if range.is_some() {
                p = p.filter(|&next| !beyond(next));
            }
        }
        if back && self.kind.is_bag() {
            out.reverse_runs(first);
        }
        if p.is_none() {
            return Ok(None);
        }
        Ok(last.map(|l| {
            let key = st.key_at(l);
            Cursor {
                hash: e.hash_of(key),
                key: key.to_vec(),
            }
        }))
    }

    /// Copies into `out` the record that gives the key at one end of the
    /// walk order: the first, or with `Backward` the last (the greatest key
    /// of an ordered_set; the first of a hash table, as ETS's `last/1`).
    /// In a bag that is the key's last object, whose key ETS reports (they
    /// differ where `0.0 =:= -0.0`). False if the table is empty.
    pub fn end_record(&self, dir: Direction, out: &mut RecordBuf) -> Result<bool, Error> {
        let st = self.read()?;
        let names = self.names();
        let pos = match dir {
            Direction::Forward => st.entries.first(),
            Direction::Backward => st.entries.last(),
        };
        let pos = st.past_expired(order(&names), dir, pos)?;
        Ok(pos.map(|pos| st.copy_key_record(pos, out)).is_some())
    }

    /// Copies into `out` the record that gives the key after (`Forward`) or
    /// before (`Backward`) `key` in walk order (as [`Table::end_record`]),
    /// whether or not `key` is still in the table; false at the end. In a
    /// hash table both directions give the next key, as ETS's `next/2` and
    /// `prev/2` do.
    pub fn step_record(
        &self,
        dir: Direction,
        hash: u64,
        key: &[u8],
        out: &mut RecordBuf,
    ) -> Result<bool, Error> {
        let st = self.read()?;
        let names = self.names();
        let ord = order(&names);
        let pos = st.entries.seek(&st.arena, ord, dir, hash, key);
        let pos = st.past_expired(ord, dir, pos)?;
        Ok(pos.map(|pos| st.copy_key_record(pos, out)).is_some())
    }

    /// Copies into `out` the records of slot `i`, as ETS's `slot/2`
    /// numbers them: in a set or bag, slot `i` holds the records whose key
    /// hash begins with the bits of `i` (a bag key's records are all in
    /// one); in an ordered_set, the `i`-th record in key order.
    ///
    /// A hash table has `2^bits` slots, `bits` being
    /// [`Table::slot_bits`] now, or the value given (what it was when the
    /// table was fixed): slots so numbered stay the same however the index
    /// grows or shrinks, so walking them visits every record present
    /// throughout exactly once even while others write. Ignored by an
    /// ordered_set, whose slots shift as keys come and go.
    pub fn slot(&self, i: usize, bits: Option<u32>, out: &mut RecordBuf) -> Result<Slotted, Error> {
        let st = self.read()?;
        let n = st.entries.slot_count(bits);
        if i > n {
            return Ok(Slotted::OutOfRange { slots: n });
        }
        if i == n {
            return Ok(Slotted::End);
        }
        let clock = st.clock();
        for pos in st.entries.slot_entries(&st.arena, i, bits) {
            if clock.is_none() || !clock.expired(st.key_at(st.entries.loc(pos))) {
                st.copy_out(pos, out);
            }
        }
        Ok(Slotted::Records)
    }

    /// The bits of a key hash that number a hash table's slots now (see
    /// [`Table::slot`]); `None` for an ordered_set.
    pub fn slot_bits(&self) -> Result<Option<u32>, Error> {
        Ok(self.read()?.entries.slot_bits())
    }

    /// The first key in walk order.
    pub fn first_key(&self) -> Result<Option<Vec<u8>>, Error> {
        let mut out = RecordBuf::new();
        self.end_record(Direction::Forward, &mut out)?;
        Ok(out.items().first().map(|it| out.key(it).to_vec()))
    }

    /// The key after `key` in walk order, whether or not `key` is still in
    /// the table.
    pub fn next_key(&self, hash: u64, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        let mut out = RecordBuf::new();
        self.step_record(Direction::Forward, hash, key, &mut out)?;
        Ok(out.items().first().map(|it| out.key(it).to_vec()))
    }

    /// Number of records, those of expired keys not counted. In a quick
    /// call, [`Error::TooLong`] if more than [`MAX_DUE_COUNTED`] keys
    /// have expired and are not yet swept (each is looked up).
    pub fn len(&self) -> Result<usize, Error> {
        let st = self.read()?;
        let names = self.names();
        Ok(st.entries.len() - self.expired_records(&st, order(&names))?)
    }

    /// Number of records, those of expired keys not yet swept included (at
    /// once, whatever the table).
    pub fn stored_len(&self) -> Result<usize, Error> {
        Ok(self.read()?.entries.len())
    }

    /// The records of expired keys not yet swept (see [`Table::len`]).
    fn expired_records(&self, st: &State, ord: Order) -> Result<usize, Error> {
        let Some(e) = &st.expiry else { return Ok(0) };
        let mut gone = 0;
        for (i, key) in e.due_keys(expire::now()).enumerate() {
            if i >= MAX_DUE_COUNTED && QUICK.get() {
                expire::wake();
                return Err(Error::TooLong);
            }
            gone += st.find(ord, self.hash(key), key).map_or(0, |(_, n)| n);
        }
        Ok(gone)
    }

    /// True when the table holds no records.
    pub fn is_empty(&self) -> Result<bool, Error> {
        Ok(self.len()? == 0)
    }

    /// Current figures.
    pub fn stats(&self) -> Result<Stats, Error> {
        let st = self.read()?;
        let names = self.names();
        let ev = st.evict.as_ref();
        let (hits, misses) = ev.map_or((0, 0), evict::Evict::hits_misses);
        let ex = st.expiry.as_ref();
        let expired = self.expired_records(&st, order(&names))?;
        let file = st.arena.file_tier();
        Ok(Stats {
            size: (st.entries.len() - expired) as u64,
            index_bytes: st.entries.heap_bytes(),
            meta_bytes: self.slow_meta_bytes(&st, order(&names))
                + ev.map_or(0, evict::Evict::heap_bytes)
                + ex.map_or(0, expire::Expiry::heap_bytes)
                + st.tier.as_ref().map_or(0, tier::Tier::heap_bytes)
                + st.vm_refs.as_ref().map_or(0, vm_refs::VmRefs::heap_bytes),
            dictionary_bytes: self.dicts.memory() as u64,
            arena_mapped_bytes: st.arena.mapped_bytes(),
            arena_used_bytes: st.arena.used_bytes() + file.map_or(0, |f| f.used_bytes),
            arena_live_bytes: st.arena.live_bytes() + file.map_or(0, |f| f.live_bytes),
            arena_free_bytes: st.arena.free_bytes()
                + file.map_or(0, |f| f.used_bytes - f.live_bytes),
            arena_reclaimable_bytes: st.arena.held_free_bytes(),
            payload_raw_bytes: st.raw_bytes,
            payload_stored_bytes: st.stored_bytes,
            arena_address: st.arena.address() as u64,
            index_address: st.entries.address() as u64,
            budget: ev.map(|e| e.budget).unwrap_or_default(),
            budget_used_bytes: match ev {
                Some(_) => self.charged_bytes(&st),
                None => 0,
            },
            eviction_bytes: ev.map_or(0, evict::Evict::heap_bytes),
            evicted_keys: ev.map_or(0, |e| e.evicted_keys),
            evicted_records: ev.map_or(0, |e| e.evicted_records),
            hits,
            misses,
            ttl: ex.and_then(|e| e.ttl),
            expires: ex.is_some(),
            expiring_keys: ex.map_or(0, |e| e.len() as u64),
            expired_keys: ex.map_or(0, |e| e.expired_keys),
            expired_records: ex.map_or(0, |e| e.expired_records),
            expiry_bytes: ex.map_or(0, expire::Expiry::heap_bytes),
            tier: st.tier.as_ref().zip(file).map(|(t, f)| {
                let (file_reads, file_read_bytes) = t.file_reads();
                TierStats {
                    memory_budget: f.budget,
                    memory_used_bytes: st.arena.used_bytes(),
                    memory_live_bytes: st.arena.live_bytes(),
                    file_used_bytes: f.used_bytes,
                    file_live_bytes: f.live_bytes,
                    moved_records: t.moved_records,
                    moved_bytes: t.moved_bytes,
                    queue_bytes: t.heap_bytes(),
                    file_reads,
                    file_read_bytes,
                    file_address: f.address,
                }
            }),
        })
    }
}

/// Sorts slots by hash, keeping slots of equal hash in their order
/// (stable), in linear time for the uniform hashes a keyed hasher gives:
/// two counting passes on the hash's top bits (the lower digit first, each
/// with a histogram small enough for the L1 cache), then an insertion pass
/// that orders the few slots sharing those bits. A comparison sort of a
/// million slots took a quarter of the time to reopen a table. Returns
/// whether two slots have the same hash.
fn sort_by_hash(v: &mut [Slot]) -> bool {
    let n = v.len();
    // A snapshot is written in index order, and a persistent table keeps
    // its hash key (persist.rs): loaded, its slots come sorted. One pass
    // checks that and notes equal hashes.
    let mut equal = false;
    if v.windows(2).all(|w| {
        equal |= w[0].hash == w[1].hash;
        w[0].hash <= w[1].hash
    }) {
        return equal;
    }
    if n < 4096 {
        v.sort_by_key(|s| s.hash);
        return v.windows(2).any(|w| w[0].hash == w[1].hash);
    }
    // About two slots share the top `bits` bits.
    let bits = (usize::BITS - 1 - n.leading_zeros()).min(24);
    let lo = bits / 2;
    let mut tmp = vec![Slot::default(); n];
    scatter(v, &mut tmp, lo, |h| {
        (h >> (64 - bits)) as usize & ((1 << lo) - 1)
    });
    scatter(&tmp, v, bits - lo, |h| (h >> (64 - (bits - lo))) as usize);
    let mut equal = false;
    for i in 1..n {
        let x = v[i];
        let mut j = i;
        while j > 0 && v[j - 1].hash > x.hash {
            v[j] = v[j - 1];
            j -= 1;
        }
        v[j] = x;
        equal |= j > 0 && v[j - 1].hash == x.hash;
    }
    equal
}

/// One stable counting pass: `src` into `dst` ordered by a `bits`-bit
/// digit of the hash.
fn scatter(src: &[Slot], dst: &mut [Slot], bits: u32, digit: impl Fn(u64) -> usize) {
    let mut at = vec![0usize; 1 << bits];
    for s in src {
        at[digit(s.hash)] += 1;
    }
    let mut sum = 0;
    for a in at.iter_mut() {
        let count = *a;
        *a = sum;
        sum += count;
    }
    for s in src {
        let d = digit(s.hash);
        dst[at[d]] = *s;
        at[d] += 1;
    }
}

/// Pushes a bag key's `Delete` and a `Put` of each of the records at
/// `locs` (or of what `swap` puts in one's place) onto `changes`.
fn key_whole<'r>(
    changes: &mut Vec<Change<'r>>,
    st: &'r State,
    key: &'r [u8],
    locs: &[u64],
    swap: impl Fn(u64) -> Option<&'r Vec<u8>>,
) {
    changes.push(Change::Delete(key));
    for &l in locs {
        match swap(l) {
            Some(bytes) => changes.push(Change::Put(bytes)),
            None => changes.push(Change::Put(st.record_at(l).1)),
        }
    }
}

/// Hashes `(key hash, key)` map keys by the key hash they start with,
/// already a keyed hash of the key: nothing is hashed again.
#[derive(Clone, Copy, Default)]
struct ByHash;

impl std::hash::BuildHasher for ByHash {
    type Hasher = FirstWord;
    fn build_hasher(&self) -> FirstWord {
        FirstWord(None)
    }
}

/// Keeps the first u64 written; ignores the rest.
struct FirstWord(Option<u64>);

impl std::hash::Hasher for FirstWord {
    fn finish(&self) -> u64 {
        self.0.unwrap_or(0)
    }
    fn write(&mut self, _bytes: &[u8]) {}
    fn write_u64(&mut self, n: u64) {
        self.0.get_or_insert(n);
    }
}

/// How keys compare, given the dictionary [`Table::names`] gave.
fn order<'a>(names: &'a Option<RwLockReadGuard<'_, AtomTable>>) -> Order<'a> {
    match names {
        Some(n) => Order::Term(n),
        None => Order::Bytes,
    }
}

/// Orders two encoded keys the way the index breaks hash ties.
pub fn key_order(a: &[u8], b: &[u8]) -> Ordering {
    a.cmp(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records as recovery hands them to [`Table::bulk_put`]: each with its
    /// parsed header and its key's hash.
    fn loaded<'r>(
        t: &Table,
        recs: impl IntoIterator<Item = &'r [u8]>,
    ) -> std::vec::IntoIter<(Header, &'r [u8], u64)> {
        let v: Vec<_> = recs
            .into_iter()
            .map(|r| {
                let h = Header::parse(r).unwrap();
                (h, r, t.hash(&r[h.key_start()..h.body_start()]))
            })
            .collect();
        v.into_iter()
    }
    use crate::codec::Value;

    fn table(compression: Compression) -> Table {
        table_of(Kind::Set, compression)
    }

    pub(super) fn table_of(kind: Kind, compression: Compression) -> Table {
        Table::new(&Options {
            backing: Backing::Memory,
            compression,
            label: "test".into(),
            kind,
        })
        .unwrap()
    }

    fn key(i: i64) -> Vec<u8> {
        Value::Int(i).to_bytes()
    }

    fn body(i: i64, fill: usize) -> Vec<u8> {
        Value::Tuple(vec![Value::Int(i), Value::Binary(vec![b'x'; fill])]).to_bytes()
    }

    fn get_body(t: &Table, k: &[u8]) -> Option<Vec<u8>> {
        let mut buf = RecordBuf::new();
        if !t.get(t.hash(k), k, &mut buf).unwrap() {
            return None;
        }
        let it = buf.items()[0];
        assert_eq!(buf.key(&it), k);
        let mut scratch = Vec::new();
        Some(
            buf.body(&it, t.dictionaries(), &mut scratch)
                .unwrap()
                .to_vec(),
        )
    }

    #[test]
    fn a_sieved_walk_charges_its_byte_budget_what_the_filter_read() {
        // 100 records of 1,000-byte bodies; a budget of 10,000 bytes.
        let t = table(Compression::None);
        let recs: Vec<Prepared> = (0..100)
            .map(|i| t.prepare(&key(i), &body(i, 1000)))
            .collect();
        t.insert(&recs).unwrap();
        let walked = |keep: &mut dyn FnMut(&Stored) -> Kept| {
            let mut buf = RecordBuf::new();
            let mut n = 0;
            let mut count = |r: &Stored| {
                n += 1;
                keep(r)
            };
            t.chunk_kept(
                Direction::Forward,
                &KeyRange::default(),
                None,
                1000,
                10_000,
                &mut buf,
                &mut count,
            )
            .unwrap();
            (n, buf.items().len())
        };
        // A filter that read a body's first bytes walks the whole table.
        assert_eq!(
            walked(&mut |r| Kept::No {
                read: r.read_cost(3)
            }),
            (100, 0)
        );
        // One that read whole bodies stops at the budget: ten records.
        assert_eq!(
            walked(&mut |r| Kept::No {
                read: r.read_cost(usize::MAX)
            }),
            (10, 0)
        );
        // Records kept cost their length, to be decoded.
        assert_eq!(walked(&mut |_| Kept::Yes { read: 0 }), (10, 10));
        // A compressed body read at all was decompressed whole.
        let z = table(Compression::Zlib(6));
        let recs: Vec<Prepared> = (0..10)
            .map(|i| z.prepare(&key(i), &body(i, 1000)))
            .collect();
        z.insert(&recs).unwrap();
        walk_whole(&z, &mut |r| {
            assert!(r.read_cost(3) > 1000);
            Kept::No {
                read: r.read_cost(3),
            }
        });
    }

    /// Walks all of `t` (up to 1,000 records) in one chunk, no byte budget,
    /// `keep` judging each record.
    fn walk_whole(t: &Table, keep: &mut dyn FnMut(&Stored) -> Kept) {
        let mut buf = RecordBuf::new();
        t.chunk_kept(
            Direction::Forward,
            &KeyRange::default(),
            None,
            1000,
            usize::MAX,
            &mut buf,
            keep,
        )
        .unwrap();
    }

    #[test]
    fn a_stored_record_is_judged_alike_by_quick_and_general_tests() {
        use crate::sieve::{Op, Test};
        let cmp = |path: Vec<u32>, op, v: i64| Test::Cmp {
            path,
            op,
            value: Value::Int(v).to_bytes(),
        };
        let arity = Test::Arity {
            path: vec![],
            arity: 3,
        };
        // On the key alone, the body alone, both, and two clauses.
        let sieves = [
            vec![vec![cmp(vec![0], Op::Lt, 100)]],
            vec![vec![arity.clone(), cmp(vec![1], Op::Ge, 150)]],
            vec![vec![cmp(vec![0], Op::Lt, 100), cmp(vec![1], Op::Ge, 50)]],
            vec![
                vec![cmp(vec![0], Op::Lt, 10)],
                vec![cmp(vec![1], Op::Gt, 190)],
            ],
        ];
        for compression in [Compression::None, Compression::Zlib(6)] {
            let t = table(compression);
            let recs: Vec<Prepared> = (0..200)
                .map(|i| {
                    let fill = Value::Binary(vec![b'x'; (i as usize % 4) * 300]);
                    let body = Value::Tuple(vec![Value::Int(i), Value::Int(i), fill]);
                    t.prepare(&key(i), &body.to_bytes())
                })
                .collect();
            t.insert(&recs).unwrap();
            for clauses in &sieves {
                let quick = Sieve::new(clauses.clone(), 1);
                let general = quick.general();
                let dicts = t.dictionaries().clone();
                let (mut scratch, mut kept) = (Vec::new(), 0);
                walk_whole(&t, &mut |r| {
                    let judged = r.judge(&quick, &dicts, &mut scratch, |_| "");
                    assert_eq!(judged, r.judge(&general, &dicts, &mut scratch, |_| ""));
                    kept += usize::from(judged.0 == Judgement::Matches);
                    Kept::No { read: judged.1 }
                });
                assert!(kept > 0 && kept < 200, "{clauses:?} kept {kept}");
            }
        }
    }

    #[test]
    fn insert_get_replace_remove() {
        for compression in [Compression::None, Compression::Zlib(6)] {
            let t = table(compression);
            let recs: Vec<Prepared> = (0..1000)
                .map(|i| t.prepare(&key(i), &body(i, 200)))
                .collect();
            t.insert(&recs).unwrap();
            assert_eq!(t.len().unwrap(), 1000);
            assert_eq!(get_body(&t, &key(7)), Some(body(7, 200)));
            t.insert(&[t.prepare(&key(7), &body(70, 3))]).unwrap();
            assert_eq!(get_body(&t, &key(7)), Some(body(70, 3)));
            assert_eq!(t.len().unwrap(), 1000);
            assert!(t.remove(t.hash(&key(7)), &key(7), None).unwrap());
            assert!(!t.remove(t.hash(&key(7)), &key(7), None).unwrap());
            assert_eq!(get_body(&t, &key(7)), None);
            assert_eq!(t.len().unwrap(), 999);
            let s = t.stats().unwrap();
            if compression != Compression::None {
                assert!(s.payload_stored_bytes < s.payload_raw_bytes / 4, "{s:?}");
            }
        }
    }

    #[test]
    fn insert_new_is_all_or_nothing() {
        let t = table(Compression::None);
        t.insert(&[t.prepare(&key(1), &body(1, 1))]).unwrap();
        let batch = [
            t.prepare(&key(2), &body(2, 1)),
            t.prepare(&key(1), &body(9, 1)),
        ];
        assert!(!t.insert_new(&batch).unwrap());
        assert_eq!(t.len().unwrap(), 1);
        assert_eq!(get_body(&t, &key(1)), Some(body(1, 1)));
        let batch = [
            t.prepare(&key(2), &body(2, 1)),
            t.prepare(&key(2), &body(3, 1)),
        ];
        assert!(t.insert_new(&batch).unwrap());
        assert_eq!(
            get_body(&t, &key(2)),
            Some(body(3, 1)),
            "last of a batch wins"
        );
    }

    #[test]
    fn overwriting_the_same_keys_does_not_grow_the_arena() {
        let t = table(Compression::Zlib(1));
        // Record sizes vary from round to round but not in distribution.
        let round_of = |round: i64| -> Vec<Prepared> {
            (0..2000)
                .map(|i| {
                    t.prepare(
                        &key(i),
                        &body((i * 7 + round) % 2000, 100 + (round % 3) as usize),
                    )
                })
                .collect()
        };
        // The free lists settle within ~130 rounds here (2-byte classes
        // below 64 bytes: a few sizes are first met only after a while);
        // from then on the arena does not grow at all.
        for round in 0..200 {
            t.insert(&round_of(round)).unwrap();
        }
        let used = t.stats().unwrap().arena_used_bytes;
        for round in 200..600 {
            t.insert(&round_of(round)).unwrap();
        }
        assert_eq!(t.stats().unwrap().arena_used_bytes, used);
    }

    #[test]
    fn replace_if_detects_a_concurrent_change() {
        let t = table(Compression::None);
        let k = key(5);
        let h = t.hash(&k);
        t.insert(&[t.prepare(&k, &body(1, 10))]).unwrap();
        let mut seen = RecordBuf::new();
        assert!(t.get(h, &k, &mut seen).unwrap());
        let it = seen.items()[0];
        // Someone else writes first.
        t.insert(&[t.prepare(&k, &body(2, 10))]).unwrap();
        let mine = t.prepare(&k, &body(3, 10));
        assert!(!t
            .replace_if(h, &k, Some((&seen, &it)), Some(&mine))
            .unwrap());
        assert_eq!(get_body(&t, &k), Some(body(2, 10)));
        // Read again and win.
        seen.clear();
        assert!(t.get(h, &k, &mut seen).unwrap());
        let it = seen.items()[0];
        assert!(t
            .replace_if(h, &k, Some((&seen, &it)), Some(&mine))
            .unwrap());
        assert_eq!(get_body(&t, &k), Some(body(3, 10)));
        // Insert-if-absent form.
        let k2 = key(6);
        let new = t.prepare(&k2, &body(6, 1));
        assert!(t.replace_if(t.hash(&k2), &k2, None, Some(&new)).unwrap());
        assert!(!t.replace_if(t.hash(&k2), &k2, None, Some(&new)).unwrap());
    }

    #[test]
    fn chunks_visit_every_record_once() {
        let t = table(Compression::Zlib(6));
        let recs: Vec<Prepared> = (0..5000)
            .map(|i| t.prepare(&key(i), &body(i, 50)))
            .collect();
        t.insert(&recs).unwrap();
        let mut keys = Vec::new();
        let mut cursor = None;
        loop {
            let mut buf = RecordBuf::new();
            let next = t.chunk(cursor.as_ref(), 333, usize::MAX, &mut buf).unwrap();
            keys.extend(buf.items().iter().map(|it| buf.key(it).to_vec()));
            match next {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        assert_eq!(keys.len(), 5000);
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), 5000);
        // first/next agree with chunks.
        assert_eq!(walked_keys(&t), 5000);
    }

    #[test]
    fn a_deleted_table_refuses_every_call() {
        let t = table(Compression::None);
        t.insert(&[t.prepare(&key(1), &body(1, 1))]).unwrap();
        let storage = t.take_storage().expect("storage of a live table");
        assert!(storage.mapped_bytes() > 0);
        drop(storage);
        assert!(t.is_deleted());
        assert!(matches!(t.len(), Err(Error::Deleted)));
        assert!(matches!(
            t.get(t.hash(&key(1)), &key(1), &mut RecordBuf::new()),
            Err(Error::Deleted)
        ));
        assert!(matches!(
            t.insert(&[t.prepare(&key(2), &body(2, 1))]),
            Err(Error::Deleted)
        ));
        assert!(t.take_storage().is_none());
    }

    #[test]
    fn sort_by_hash_is_stable_and_reports_equal_hashes() {
        for (n, distinct) in [
            (10u64, 10u64),
            (10, 4),
            (5000, 5000),
            (70_000, 70_000),
            (70_000, 9000),
        ] {
            // A bijective scramble: top bits spread like a real hash's.
            let mut v: Vec<Slot> = (0..n)
                .map(|i| Slot {
                    hash: (i % distinct).wrapping_mul(0x9E37_79B9_7F4A_7C15),
                    loc: i + 1,
                })
                .collect();
            let equal = sort_by_hash(&mut v);
            assert_eq!(equal, distinct < n, "n {n}");
            for w in v.windows(2) {
                assert!(w[0].hash < w[1].hash || (w[0].hash == w[1].hash && w[0].loc < w[1].loc));
            }
            let mut locs: Vec<u64> = v.iter().map(|s| s.loc).collect();
            locs.sort_unstable();
            assert!(locs.iter().copied().eq(1..=n));
            // Sorted input (a snapshot's) stays as it is, equal hashes
            // still reported.
            let sorted: Vec<(u64, u64)> = v.iter().map(|s| (s.hash, s.loc)).collect();
            assert_eq!(sort_by_hash(&mut v), equal);
            assert!(v.iter().map(|s| (s.hash, s.loc)).eq(sorted));
        }
    }

    #[test]
    fn a_bulk_load_keeps_the_last_record_of_each_key() {
        let t = table(Compression::None);
        let load = |round: i64, range: std::ops::Range<i64>| {
            let recs: Vec<Vec<u8>> = range
                .map(|i| t.prepare(&key(i % 3000), &body(i + round, 3)).bytes)
                .collect();
            let mut bulk = Bulk::default();
            t.bulk_put(loaded(&t, recs.iter().map(Vec::as_slice)), &mut bulk)
                .unwrap();
            t.bulk_finish(&mut bulk).unwrap();
        };
        // Keys 0..3000 placed over and over: the last placed wins.
        load(0, 0..10_000);
        assert_eq!(t.len().unwrap(), 3000);
        assert_eq!(get_body(&t, &key(5)), Some(body(9005, 3)));
        assert_eq!(get_body(&t, &key(2999)), Some(body(8999, 3)));
        // A second load into the indexed table replaces what is there.
        load(1_000_000, 0..100);
        assert_eq!(t.len().unwrap(), 3000);
        assert_eq!(get_body(&t, &key(5)), Some(body(1_000_005, 3)));
        assert_eq!(get_body(&t, &key(2999)), Some(body(8999, 3)));
        // Replaced records were released: the figures count the kept ones.
        let last = |k: i64| {
            if k < 100 {
                1_000_000 + k
            } else {
                9000 + k - (k >= 1000) as i64 * 3000
            }
        };
        let kept: u64 = (0..3000)
            .map(|k| t.prepare(&key(k), &body(last(k), 3)).bytes.len() as u64)
            .sum();
        assert_eq!(get_body(&t, &key(1500)), Some(body(last(1500), 3)));
        assert_eq!(t.stats().unwrap().payload_stored_bytes, kept);
    }

    #[test]
    fn clear_frees_everything() {
        let t = table(Compression::None);
        let recs: Vec<Prepared> = (0..5000)
            .map(|i| t.prepare(&key(i), &body(i, 500)))
            .collect();
        t.insert(&recs).unwrap();
        assert!(t.stats().unwrap().arena_used_bytes > 2_500_000);
        t.clear().unwrap();
        let s = t.stats().unwrap();
        assert_eq!((s.size, s.arena_live_bytes, s.payload_raw_bytes), (0, 0, 0));
        assert!(s.arena_used_bytes < 100);
        assert!(t.first_key().unwrap().is_none());
    }

    /// How many keys a first/next walk visits.
    fn walked_keys(t: &Table) -> usize {
        let mut n = 0;
        let mut k = t.first_key().unwrap();
        while let Some(key) = k {
            n += 1;
            k = t.next_key(t.hash(&key), &key).unwrap();
        }
        n
    }

    fn float_key(f: f64) -> Vec<u8> {
        Value::Float(f).to_bytes()
    }

    /// Calls `f` on every record, in walk order, read in chunks of `n`.
    fn each_record(t: &Table, dir: Direction, n: usize, f: impl FnMut(&RecordBuf, &Item)) {
        each_record_in(t, dir, &KeyRange::default(), n, f)
    }

    /// [`each_record`] over the keys of `range`.
    fn each_record_in(
        t: &Table,
        dir: Direction,
        range: &KeyRange,
        n: usize,
        mut f: impl FnMut(&RecordBuf, &Item),
    ) {
        let mut cursor = None;
        loop {
            let mut buf = RecordBuf::new();
            let next = t
                .chunk_range(dir, range, cursor.as_ref(), n, usize::MAX, &mut buf)
                .unwrap();
            buf.items().iter().for_each(|it| f(&buf, it));
            match next {
                Some(c) => cursor = Some(c),
                None => return,
            }
        }
    }

    /// All records as (key, body) in walk order, in chunks of `n`.
    fn walk(t: &Table, dir: Direction, n: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut out = Vec::new();
        let mut scratch = Vec::new();
        each_record(t, dir, n, |buf, it| {
            let body = buf
                .body(it, t.dictionaries(), &mut scratch)
                .unwrap()
                .to_vec();
            out.push((buf.key(it).to_vec(), body));
        });
        out
    }

    /// The keys of all records in walk order, in chunks of `n`.
    fn walk_keys(t: &Table, dir: Direction, n: usize) -> Vec<Vec<u8>> {
        walk(t, dir, n).into_iter().map(|r| r.0).collect()
    }

    /// An integer key, for the tests of the table's parts (compaction,
    /// tiers).
    pub(super) fn int_key(i: u64) -> Vec<u8> {
        Value::Int(i as i64).to_bytes()
    }

    /// A body of `min` to `min + span` incompressible bytes, its own for
    /// each `(i, version)`.
    pub(super) fn noisy_body(i: u64, version: u32, min: usize, span: usize) -> Vec<u8> {
        let len = min + (i as usize * 7919 + version as usize * 31) % span;
        let bytes = crate::testutil::noise((i as u32).wrapping_mul(2_654_435_761) ^ version, len);
        Value::Tuple(vec![Value::Int(i as i64), Value::Binary(bytes)]).to_bytes()
    }

    /// What the table holds, key by key, against `model` (keys
    /// [`int_key`] 0 to `n`).
    pub(super) fn same_as(
        t: &Table,
        model: &std::collections::BTreeMap<u64, Vec<Vec<u8>>>,
        n: u64,
    ) {
        for i in 0..n {
            let want = model.get(&i).cloned().unwrap_or_default();
            assert_eq!(all_bodies(t, &int_key(i)), want, "key {i}");
        }
        let records: usize = model.values().map(Vec::len).sum();
        assert_eq!(t.len().unwrap(), records);
    }

    pub(super) fn all_bodies(t: &Table, k: &[u8]) -> Vec<Vec<u8>> {
        let mut buf = RecordBuf::new();
        t.get(t.hash(k), k, &mut buf).unwrap();
        let mut scratch = Vec::new();
        buf.items()
            .iter()
            .map(|it| {
                buf.body(it, t.dictionaries(), &mut scratch)
                    .unwrap()
                    .to_vec()
            })
            .collect()
    }

    #[test]
    fn an_ordered_set_walks_in_term_order_both_ways() {
        let t = table_of(Kind::OrderedSet, Compression::Zlib(1));
        // Interleaved integers and floats, inserted shuffled.
        let mut keys: Vec<Vec<u8>> = (0..3000)
            .map(|i| {
                if i % 2 == 0 {
                    key(i * 7919 % 6000 - 3000)
                } else {
                    float_key((i * 7919 % 6000 - 3000) as f64 + 0.5)
                }
            })
            .collect();
        let recs: Vec<Prepared> = keys.iter().map(|k| t.prepare(k, &body(0, 10))).collect();
        t.insert(&recs).unwrap();
        let names = |_| "";
        keys.sort_by(|a, b| crate::order::compare(a, b, names));
        let fwd: Vec<Vec<u8>> = walk_keys(&t, Direction::Forward, 77);
        assert_eq!(fwd, keys);
        let mut back: Vec<Vec<u8>> = walk_keys(&t, Direction::Backward, 50);
        back.reverse();
        assert_eq!(back, keys);
        // first/last/next/prev, including from keys that are not there.
        assert_eq!(t.first_key().unwrap().as_ref(), keys.first());
        let mut last = RecordBuf::new();
        assert!(t.end_record(Direction::Backward, &mut last).unwrap());
        assert_eq!(Some(&last.key(&last.items()[0]).to_vec()), keys.last());
        let k = float_key(10.25);
        let step = |dir| {
            let mut out = RecordBuf::new();
            assert!(t.step_record(dir, 0, &k, &mut out).unwrap());
            out.key(&out.items()[0]).to_vec()
        };
        let (next, prev) = (step(Direction::Forward), step(Direction::Backward));
        assert_eq!(crate::order::compare(&next, &k, names), Ordering::Greater);
        assert_eq!(crate::order::compare(&prev, &k, names), Ordering::Less);
        let i = keys.iter().position(|x| x == &next).unwrap();
        assert_eq!(keys[i - 1], prev);
    }

    #[test]
    fn an_ordered_set_key_compares_with_equality_and_keeps_the_last_key_given() {
        let t = table_of(Kind::OrderedSet, Compression::None);
        t.insert(&[t.prepare(&float_key(1.0), &body(1, 1))])
            .unwrap();
        t.insert(&[t.prepare(&key(1), &body(2, 1))]).unwrap();
        assert_eq!(t.len().unwrap(), 1);
        let mut buf = RecordBuf::new();
        assert!(t.get(0, &float_key(1.0), &mut buf).unwrap());
        assert_eq!(buf.key(&buf.items()[0]), key(1).as_slice());
        assert!(t.contains(0, &key(1)).unwrap());
        // insert_new sees 1.0 as present; a batch's last equal key wins.
        assert!(!t
            .insert_new(&[t.prepare(&float_key(1.0), &body(3, 1))])
            .unwrap());
        let batch = [
            t.prepare(&key(2), &body(4, 1)),
            t.prepare(&float_key(2.0), &body(5, 1)),
        ];
        assert!(t.insert_new(&batch).unwrap());
        assert_eq!(all_bodies(&t, &key(2)), vec![body(5, 1)]);
        // A compare-and-swap finds the record by an equal key.
        let mut seen = RecordBuf::new();
        t.get(0, &float_key(2.0), &mut seen).unwrap();
        let it = seen.items()[0];
        let new = t.prepare(&float_key(2.0), &body(6, 1));
        assert!(t
            .replace_if(0, &key(2), Some((&seen, &it)), Some(&new))
            .unwrap());
        assert_eq!(all_bodies(&t, &key(2)), vec![body(6, 1)]);
        assert!(t.remove(0, &float_key(1.0), None).unwrap());
        assert_eq!(t.len().unwrap(), 1);
        assert!(t.stats().unwrap().index_bytes >= 4096);
    }

    #[test]
    fn an_ordered_set_orders_atoms_by_name_not_id() {
        let t = table_of(Kind::OrderedSet, Compression::None);
        let names = ["zebra", "apple", "mango"];
        for n in names {
            t.atoms().write().intern(n);
        }
        let recs: Vec<Prepared> = (0..3u32)
            .map(|id| t.prepare(&Value::Atom(id).to_bytes(), &body(0, 0)))
            .collect();
        t.insert(&recs).unwrap();
        let order: Vec<Vec<u8>> = walk_keys(&t, Direction::Forward, 10);
        let want: Vec<Vec<u8>> = [1u32, 2, 0]
            .iter()
            .map(|&id| Value::Atom(id).to_bytes())
            .collect();
        assert_eq!(order, want);
    }

    #[test]
    fn a_range_walk_visits_exactly_the_keys_of_its_range_both_ways() {
        let t = table_of(Kind::OrderedSet, Compression::None);
        let wild = t.atoms().write().intern(crate::order::WILDCARD);
        let user = t.atoms().write().intern("user");
        let tag = |id| Value::Atom(id);
        // {group, i} for groups 0..10 (integers) and {user, i}, plus plain
        // integers: {user, _} is a run in the middle of the order.
        let mut keys: Vec<Value> = Vec::new();
        for i in 0..300i64 {
            keys.push(Value::Tuple(vec![Value::Int(i % 10), Value::Int(i)]));
            keys.push(Value::Tuple(vec![tag(user), Value::Float(i as f64 / 3.0)]));
            keys.push(Value::Int(i * 3 - 400));
        }
        let recs: Vec<Prepared> = keys
            .iter()
            .map(|k| t.prepare(&k.to_bytes(), &body(0, 3)))
            .collect();
        t.insert(&recs).unwrap();
        let all: Vec<Vec<u8>> = walk_keys(&t, Direction::Forward, 1000);
        let bound = |v: Value, inclusive| {
            Some(Bound {
                key: v.to_bytes(),
                inclusive,
            })
        };
        let ranges = [
            // {user, _}
            KeyRange {
                lo: bound(Value::Tuple(vec![tag(user), tag(wild)]), true),
                hi: bound(Value::Tuple(vec![tag(user), tag(wild)]), true),
            },
            // {3, _}, and everything from it on
            KeyRange {
                lo: bound(Value::Tuple(vec![Value::Int(3), tag(wild)]), true),
                hi: bound(Value::Tuple(vec![Value::Int(3), tag(wild)]), true),
            },
            KeyRange {
                lo: bound(Value::Tuple(vec![Value::Int(3), tag(wild)]), true),
                hi: None,
            },
            // -100 < k =< 50.0, and k < -390
            KeyRange {
                lo: bound(Value::Int(-100), false),
                hi: bound(Value::Float(50.0), true),
            },
            KeyRange {
                lo: None,
                hi: bound(Value::Int(-390), false),
            },
            // Nothing: {user, _} with nothing at or above 7 but below 2.
            KeyRange {
                lo: bound(Value::Int(7), true),
                hi: bound(Value::Int(2), true),
            },
        ];
        let in_range = |r: &KeyRange| -> Vec<Vec<u8>> {
            let names = t.atoms().read();
            all.iter()
                .filter(|k| !r.below(k, &names) && !r.above(k, &names))
                .cloned()
                .collect()
        };
        for range in &ranges {
            let want = in_range(range);
            for n in [1, 7, 1000] {
                for dir in [Direction::Forward, Direction::Backward] {
                    let mut got = Vec::new();
                    each_record_in(&t, dir, range, n, |buf, it| got.push(buf.key(it).to_vec()));
                    if dir == Direction::Backward {
                        got.reverse();
                    }
                    assert_eq!(got, want, "{range:?} {dir:?} in chunks of {n}");
                }
            }
        }
        // The runs are what they should be: 300 {user, _} keys, 30 {3, _}.
        assert_eq!(in_range(&ranges[0]).len(), 300);
        assert_eq!(in_range(&ranges[1]).len(), 30);
        assert_eq!(in_range(&ranges[2]).len(), 30 * 7 + 300);
        assert!(in_range(&ranges[5]).is_empty());
    }

    #[test]
    fn a_bag_keeps_distinct_objects_in_insertion_order() {
        for compression in [Compression::None, Compression::Zlib(6)] {
            let t = table_of(Kind::Bag, compression);
            let k = key(1);
            let obj = |v: i64| body(v, 100);
            t.insert(&[t.prepare(&k, &obj(1))]).unwrap();
            // One batch: taken in order, duplicates dropped.
            let batch: Vec<Prepared> = [2, 3, 1, 2, 4]
                .iter()
                .map(|&v| t.prepare(&k, &obj(v)))
                .collect();
            t.insert(&batch).unwrap();
            assert_eq!(all_bodies(&t, &k), vec![obj(1), obj(2), obj(3), obj(4)]);
            assert_eq!(t.len().unwrap(), 4);
            // Re-inserting an object keeps its place.
            t.insert(&[t.prepare(&k, &obj(2))]).unwrap();
            assert_eq!(all_bodies(&t, &k), vec![obj(1), obj(2), obj(3), obj(4)]);
            // insert_new is false once the key has any object.
            assert!(!t.insert_new(&[t.prepare(&k, &obj(9))]).unwrap());
            // Objects of other keys stay apart.
            t.insert(&[t.prepare(&key(2), &obj(1))]).unwrap();
            assert_eq!(all_bodies(&t, &key(2)), vec![obj(1)]);
            // remove_object takes the one matching object.
            assert_eq!(t.remove_object(&t.prepare(&k, &obj(4))).unwrap(), 1);
            assert_eq!(t.remove_object(&t.prepare(&k, &obj(4))).unwrap(), 0);
            assert_eq!(all_bodies(&t, &k), vec![obj(1), obj(2), obj(3)]);
            // remove takes them all, and gives them back in order.
            let mut out = RecordBuf::new();
            assert!(t.remove(t.hash(&k), &k, Some(&mut out)).unwrap());
            assert_eq!(out.len(), 3);
            assert_eq!(t.len().unwrap(), 1);
            let s = t.stats().unwrap();
            assert_eq!(s.size, 1);
            assert_eq!(s.payload_raw_bytes, (key(2).len() + obj(1).len()) as u64);
        }
    }

    #[test]
    fn a_bag_batch_keeps_its_order_in_an_empty_table_and_a_filled_one() {
        for filled in [false, true] {
            let t = table_of(Kind::Bag, Compression::None);
            if filled {
                t.insert(&[t.prepare(&key(9), &body(9, 0))]).unwrap();
            }
            let k = key(1);
            let batch: Vec<Prepared> = [3, 1, 2, 1]
                .iter()
                .map(|&v| t.prepare(&k, &body(v, 10)))
                .collect();
            t.insert(&batch).unwrap();
            let want: Vec<Vec<u8>> = [3, 1, 2].iter().map(|&v| body(v, 10)).collect();
            assert_eq!(all_bodies(&t, &k), want, "filled: {filled}");
        }
    }

    #[test]
    fn a_bag_batch_of_many_objects_keeps_each_new_one_once_in_order() {
        for compression in [Compression::None, Compression::Zlib(6)] {
            let t = table_of(Kind::Bag, compression);
            // 50,000 distinct keys, and 5,000 objects twice in the batch.
            let batch: Vec<Prepared> = (0..50_000)
                .chain(0..5_000)
                .map(|i| t.prepare(&key(i), &body(i, 0)))
                .collect();
            t.insert(&batch).unwrap();
            assert_eq!(t.len().unwrap(), 50_000);
            assert_eq!(all_bodies(&t, &key(4_999)), vec![body(4_999, 0)]);
            // Ten keys of 2,000 objects each (compressible, so compared
            // inflated), half of them stored by a first batch.
            let objs = |range: std::ops::Range<i64>| -> Vec<Prepared> {
                range
                    .map(|i| t.prepare(&key(-1 - i % 10), &body(i, 100)))
                    .collect()
            };
            t.insert(&objs(0..10_000)).unwrap();
            t.insert(&objs(0..20_000)).unwrap();
            assert_eq!(t.len().unwrap(), 70_000);
            let expected: Vec<Vec<u8>> = (0..2000).map(|j| body(j * 10 + 3, 100)).collect();
            assert_eq!(all_bodies(&t, &key(-4)), expected);
            // Nothing of a batch already stored is added again.
            t.insert(&objs(5_000..20_000)).unwrap();
            assert_eq!(t.len().unwrap(), 70_000);
        }
    }

    /// Runs `op` in quick calls until one is refused; returns how many
    /// went through.
    fn quick_until_refused(mut op: impl FnMut(usize) -> Result<(), Error>) -> usize {
        for i in 0.. {
            match quick(|| op(i)) {
                Ok(()) => {}
                Err(Error::TooLong) => return i,
                Err(e) => panic!("{e}"),
            }
        }
        unreachable!()
    }

    #[test]
    fn a_quick_call_refuses_to_resize_a_large_index_and_changes_nothing() {
        for kind in [Kind::Set, Kind::Bag] {
            let t = table_of(kind, Compression::None);
            let n = 40_000;
            let recs: Vec<Prepared> = (0..n).map(|i| t.prepare(&key(i), &body(i, 200))).collect();
            t.insert(&recs).unwrap();
            // Deleting: the call that would shrink the index is refused.
            let deleted = quick_until_refused(|i| {
                let k = key(i as i64);
                let removed = match kind {
                    Kind::Bag => t.remove_object(&t.prepare(&k, &body(i as i64, 200)))? == 1,
                    _ => t.remove(t.hash(&k), &k, None)?,
                };
                assert!(removed);
                Ok(())
            });
            assert!(deleted > 0 && deleted < n as usize);
            let k = key(deleted as i64);
            assert_eq!(
                t.len().unwrap(),
                n as usize - deleted,
                "the refused call removed nothing"
            );
            assert!(t.contains(t.hash(&k), &k).unwrap());
            assert!(
                t.remove(t.hash(&k), &k, None).unwrap(),
                "done outside quick"
            );
            let left = t.len().unwrap();
            // Inserting: the one that would grow the index is refused; a
            // set's replacement, which adds no entry, is not.
            let added = quick_until_refused(|i| {
                let i = n + i as i64;
                t.insert(&[t.prepare(&key(i), &body(i, 200))])
            });
            assert!(added > 0);
            assert_eq!(t.len().unwrap(), left + added);
            let k = key(n + added as i64);
            assert!(!t.contains(t.hash(&k), &k).unwrap());
            if kind == Kind::Set {
                let k = key(n - 1);
                quick(|| t.insert(&[t.prepare(&k, &body(0, 1))])).unwrap();
            }
            t.insert(&[t.prepare(&k, &body(0, 1))]).unwrap();
            // Clearing a large table is refused, and done outside quick.
            assert!(matches!(quick(|| t.clear()), Err(Error::TooLong)));
            assert_eq!(t.len().unwrap(), left + added + 1);
            t.clear().unwrap();
            assert!(t.is_empty().unwrap());
            // A small table is cleared and resized in quick calls.
            quick(|| t.insert(&[t.prepare(&key(1), &body(1, 1))])).unwrap();
            quick(|| t.clear()).unwrap();
        }
    }

    #[test]
    fn a_quick_call_does_not_wait_long_for_the_lock() {
        // Another thread holds the write lock (as an index resize does):
        // quick reads and writes give up with TooLong, changing nothing,
        // while it still holds it; calls outside quick wait for it.
        use std::sync::atomic::AtomicBool;
        use std::sync::Barrier;
        let t = table_of(Kind::Set, Compression::None);
        t.insert(&[t.prepare(&key(1), &body(1, 10))]).unwrap();
        let (held, released) = (Barrier::new(2), AtomicBool::new(false));
        std::thread::scope(|s| {
            let holder = s.spawn(|| {
                let guard = t.state.write();
                held.wait();
                std::thread::sleep(std::time::Duration::from_millis(200));
                released.store(true, AtomicOrdering::SeqCst);
                drop(guard);
            });
            held.wait();
            let k = key(1);
            let mut out = RecordBuf::default();
            take_lock_waits();
            assert!(matches!(
                quick(|| t.get(t.hash(&k), &k, &mut out)),
                Err(Error::TooLong)
            ));
            assert!(
                take_lock_waits() >= QUICK_LOCK_WAIT,
                "the wait is counted, for the caller to leave out of its work"
            );
            let k2 = key(2);
            assert!(matches!(
                quick(|| t.insert(&[t.prepare(&k2, &body(2, 10))])),
                Err(Error::TooLong)
            ));
            assert!(
                !released.load(AtomicOrdering::SeqCst),
                "the quick calls gave up while the lock was held"
            );
            assert!(
                t.get(t.hash(&k), &k, &mut out).unwrap(),
                "waits outside quick"
            );
            assert!(released.load(AtomicOrdering::SeqCst));
            holder.join().unwrap();
        });
        let k2 = key(2);
        assert!(
            !t.contains(t.hash(&k2), &k2).unwrap(),
            "the refused insert changed nothing"
        );
        assert_eq!(t.len().unwrap(), 1);
        // Uncontended, quick calls take the lock as any other, waiting
        // for nothing.
        take_lock_waits();
        quick(|| t.insert(&[t.prepare(&k2, &body(2, 10))])).unwrap();
        assert!(quick(|| t.contains(t.hash(&k2), &k2)).unwrap());
        assert_eq!(take_lock_waits(), std::time::Duration::ZERO);
    }

    #[test]
    fn readers_go_on_while_a_large_index_is_resized() {
        // Growing and shrinking a large hash index lays it out again ahead,
        // under an upgradable lock: at that moment (the test's hook) a
        // quick read from another thread gets in, a quick write does not.
        for kind in [Kind::Set, Kind::Bag] {
            let t = Arc::new(table_of(kind, Compression::None));
            let (n, kept) = (100_000i64, 20);
            let relaid = std::rc::Rc::new(std::cell::Cell::new(0));
            let (t2, seen) = (t.clone(), relaid.clone());
            let hook = move || {
                seen.set(seen.get() + 1);
                let t = t2.clone();
                let (read, write) = std::thread::spawn(move || {
                    let k = key(0);
                    let mut out = RecordBuf::default();
                    let read = quick(|| t.get(t.hash(&k), &k, &mut out));
                    let k = key(-1);
                    let write = quick(|| t.insert(&[t.prepare(&k, &body(1, 1))]));
                    (read, write)
                })
                .join()
                .unwrap();
                assert!(matches!(read, Ok(true)), "a reader got in: {read:?}");
                assert!(matches!(write, Err(Error::TooLong)), "no writer did");
            };
            WHILE_RELAYING.with(|h| *h.borrow_mut() = Some(Box::new(hook)));
            for i in 0..n {
                t.insert(&[t.prepare(&key(i), &body(i, 8))]).unwrap();
            }
            let grown = relaid.get();
            assert!(grown >= 2, "{kind:?}: grew ahead {grown} times");
            for i in (0..n).filter(|i| i % kept != 0) {
                let k = key(i);
                assert!(t.remove(t.hash(&k), &k, None).unwrap());
            }
            assert!(relaid.get() > grown, "{kind:?}: shrank ahead");
            WHILE_RELAYING.with(|h| *h.borrow_mut() = None);
            assert_eq!(t.len().unwrap(), (n / kept) as usize);
            let mut out = RecordBuf::default();
            for i in 0..n {
                let k = key(i);
                assert_eq!(t.get(t.hash(&k), &k, &mut out).unwrap(), i % kept == 0);
            }
        }
    }

    #[test]
    fn a_duplicate_bag_keeps_copies_and_remove_object_takes_them_all() {
        let t = table_of(Kind::DuplicateBag, Compression::Zlib(1));
        let k = key(7);
        let batch: Vec<Prepared> = [1, 2, 1, 1]
            .iter()
            .map(|&v| t.prepare(&k, &body(v, 80)))
            .collect();
        t.insert(&batch).unwrap();
        assert_eq!(
            all_bodies(&t, &k),
            vec![body(1, 80), body(2, 80), body(1, 80), body(1, 80)]
        );
        assert_eq!(t.remove_object(&t.prepare(&k, &body(1, 80))).unwrap(), 3);
        assert_eq!(all_bodies(&t, &k), vec![body(2, 80)]);
    }

    #[test]
    fn a_bag_ignores_the_sign_of_zero_only_when_asked() {
        let t = table_of(Kind::Bag, Compression::None);
        let k = key(1);
        let zero = |f: f64| Value::Tuple(vec![Value::Int(1), Value::Float(f)]).to_bytes();
        t.insert(&[t.prepare(&k, &zero(-0.0))]).unwrap();
        // Where 0.0 =:= -0.0 the NIF asks to ignore the sign: a match.
        t.insert(&[t.prepare_ignoring_zero_sign(&k, &zero(0.0))])
            .unwrap();
        assert_eq!(all_bodies(&t, &k), vec![zero(-0.0)], "the first one stays");
        // Where they differ it does not ask.
        t.insert(&[t.prepare(&k, &zero(0.0))]).unwrap();
        assert_eq!(all_bodies(&t, &k), vec![zero(-0.0), zero(0.0)]);
        assert_eq!(
            t.remove_object(&t.prepare_ignoring_zero_sign(&k, &zero(0.0)))
                .unwrap(),
            1
        );
    }

    #[test]
    fn bag_chunks_never_split_a_key() {
        let t = table_of(Kind::DuplicateBag, Compression::None);
        let recs: Vec<Prepared> = (0..300)
            .flat_map(|k| (0..(k % 5 + 1)).map(move |v| (k, v)))
            .map(|(k, v)| t.prepare(&key(k), &body(v, 4)))
            .collect();
        t.insert(&recs).unwrap();
        let total = recs.len();
        let mut cursor = None;
        let mut seen = Vec::new();
        loop {
            let mut buf = RecordBuf::new();
            let next = t.chunk(cursor.as_ref(), 7, usize::MAX, &mut buf).unwrap();
            let keys: Vec<Vec<u8>> = buf.items().iter().map(|it| buf.key(it).to_vec()).collect();
            // A chunk's keys never reappear later.
            for k in &keys {
                assert!(!seen.contains(k) || seen.last() == Some(k));
            }
            seen.extend(keys);
            match next {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        assert_eq!(seen.len(), total);
        let mut distinct = seen.clone();
        distinct.dedup();
        assert_eq!(distinct.len(), 300);
        // first/next visit each key once.
        assert_eq!(walked_keys(&t), 300);
    }

    /// Keeps every change a table logs.
    #[derive(Default)]
    struct Recorder(parking_lot::Mutex<Vec<Owned>>);

    enum Owned {
        Put(Vec<u8>),
        Delete(Vec<u8>),
        Clear,
    }

    impl Journal for Recorder {
        fn log(&self, changes: &[Change<'_>]) -> Result<(), Error> {
            let mut log = self.0.lock();
            for c in changes {
                log.push(match c {
                    Change::Put(r) => Owned::Put(r.to_vec()),
                    Change::Delete(k) => Owned::Delete(k.to_vec()),
                    Change::Clear => Owned::Clear,
                });
            }
            Ok(())
        }
    }

    /// Every record's bytes, a key's records together and in order, keys
    /// sorted (hash order differs between tables).
    fn records_by_key(t: &Table) -> Vec<Vec<Vec<u8>>> {
        let mut keys: Vec<Vec<Vec<u8>>> = Vec::new();
        each_record(t, Direction::Forward, 64, |buf, it| match keys.last_mut() {
            Some(run) if run[0] == buf.key(it) => run.push(buf.record(it).to_vec()),
            _ => keys.push(vec![buf.key(it).to_vec(), buf.record(it).to_vec()]),
        });
        keys.sort();
        keys
    }

    /// Replays `log` over `t` as recovery.rs does.
    fn replay(t: &Table, log: &[Owned]) {
        let mut bulk = Bulk::default();
        for c in log {
            match c {
                Owned::Put(r) => t.bulk_put(loaded(t, [r.as_slice()]), &mut bulk).unwrap(),
                Owned::Delete(k) => {
                    t.bulk_finish(&mut bulk).unwrap();
                    t.remove(t.hash(k), k, None).unwrap();
                }
                Owned::Clear => {
                    t.bulk_finish(&mut bulk).unwrap();
                    t.clear().unwrap();
                }
            }
        }
        t.bulk_finish(&mut bulk).unwrap();
    }

    const KINDS: [Kind; 4] = [Kind::Set, Kind::OrderedSet, Kind::Bag, Kind::DuplicateBag];

    /// Inserts the keys `keys`, one record each, one at a time.
    fn fill(t: &Table, keys: std::ops::Range<i64>) {
        for i in keys {
            t.insert(&[t.prepare(&key(i), &body(i, 10))]).unwrap();
        }
    }

    fn at_most(records: u64) -> Budget {
        Budget {
            max_records: Some(records),
            max_bytes: None,
        }
    }

    #[test]
    fn a_bounded_table_never_holds_more_than_its_budget_and_logs_its_evictions() {
        for kind in KINDS {
            for budget in [
                at_most(500),
                Budget {
                    max_records: None,
                    max_bytes: Some(256 << 10),
                },
            ] {
                let t = table_of(kind, Compression::None);
                let rec = Arc::new(Recorder::default());
                assert!(t.set_journal(rec.clone()));
                t.set_budget(budget).unwrap();
                let mut inserted = 0u64;
                for i in 0..5000i64 {
                    // Bags get two objects for some keys.
                    let objs: Vec<Prepared> = (0..1 + (kind.is_bag() && i % 3 == 0) as i64)
                        .map(|j| t.prepare(&key(i), &body(j, (i % 200) as usize)))
                        .collect();
                    inserted += objs.len() as u64;
                    t.insert(&objs).unwrap();
                    let s = t.stats().unwrap();
                    if let Some(m) = budget.max_records {
                        assert!(s.size <= m, "{kind:?}: {} records", s.size);
                    }
                    if let Some(m) = budget.max_bytes {
                        assert!(s.budget_used_bytes <= m, "{kind:?}: {s:?}");
                    }
                    assert_eq!(s.size + s.evicted_records, inserted, "{kind:?}");
                }
                let s = t.stats().unwrap();
                assert!(s.evicted_keys > 0 && s.size > 0, "{kind:?} {s:?}");
                // Replaying the log (evictions are deletes) gives the table.
                let fresh = table_of(kind, Compression::None);
                replay(&fresh, &rec.0.lock());
                assert_eq!(records_by_key(&fresh), records_by_key(&t), "{kind:?}");
            }
        }
    }

    #[test]
    fn a_bounded_table_fed_new_keys_reuses_its_arena_and_holds_its_budget_in_memory() {
        // Records of 0-199 bytes, each key new, none read: the budget
        // evicts the oldest. Once the table has turned over, its arena no
        // longer grows, with no compaction: the blocks of records evicted
        // one after another lie side by side and, merged, take the next
        // records whatever their sizes. What the table's memory counts
        // (index, meta and the arena's used bytes, free blocks included)
        // is then the budget's within 2% after a compaction has taken the
        // free space the index's and the queue's growth left.
        let max = 1 << 20;
        for kind in KINDS {
            let t = Arc::new(table_of(kind, Compression::None));
            t.set_budget(Budget {
                max_records: None,
                max_bytes: Some(max),
            })
            .unwrap();
            let mut turned = None;
            for i in 0..60_000i64 {
                let len = (i * 7919 % 200) as usize;
                t.insert(&[t.prepare(&key(i), &body(i, len))]).unwrap();
                let s = t.stats().unwrap();
                if s.evicted_keys > s.size {
                    let used = *turned.get_or_insert(s.arena_used_bytes);
                    assert!(s.arena_used_bytes <= used, "{kind:?} {i}: {s:?}");
                }
            }
            assert!(turned.is_some(), "{kind:?}");
            let (tx, rx) = std::sync::mpsc::channel();
            assert!(compact::compact_now(
                &t,
                Box::new(move |r| tx.send(r).unwrap())
            ));
            let done = rx.recv_timeout(std::time::Duration::from_secs(20));
            assert!(done.unwrap().unwrap().returned_bytes > 0, "{kind:?}");
            let s = t.stats().unwrap();
            let memory = s.index_bytes + s.meta_bytes + s.arena_used_bytes;
            assert!(memory <= max + max / 50, "{kind:?}: {s:?}");
        }
    }

    #[test]
    fn a_bounded_table_keeps_the_keys_it_reads() {
        for kind in KINDS {
            let t = table_of(kind, Compression::None);
            t.set_budget(at_most(1000)).unwrap();
            let hot: Vec<i64> = (0..100).map(|i| i * 7).collect();
            for i in 0..20_000i64 {
                t.insert(&[t.prepare(&key(i), &body(i, 10))]).unwrap();
                if i % 10 == 0 {
                    for &h in hot.iter().filter(|&&h| h <= i) {
                        get_body(&t, &key(h));
                    }
                }
            }
            let kept = hot.iter().filter(|&&h| get_body(&t, &key(h)).is_some());
            // The hot keys are read every 10 inserts; a key not read is
            // evicted within a pass of the hand over the 1,000 keys.
            assert_eq!(kept.count(), hot.len(), "{kind:?}");
            let s = t.stats().unwrap();
            assert_eq!(s.size, 1000);
            assert!(s.hits > 0 && s.misses == 0, "{s:?}");
        }
    }

    #[test]
    fn a_budget_set_on_a_full_table_evicts_at_once_and_can_be_lifted() {
        for kind in KINDS {
            let t = table_of(kind, Compression::None);
            fill(&t, 0..2000);
            assert_eq!(t.stats().unwrap().hits, 0, "unbounded tables count nothing");
            let b = at_most(300);
            t.set_budget(b).unwrap();
            assert_eq!(t.budget().unwrap(), b);
            assert_eq!(t.len().unwrap(), 300);
            // A cleared table starts its queue again.
            t.clear().unwrap();
            fill(&t, 0..400);
            assert_eq!(t.len().unwrap(), 300);
            assert_eq!(t.stats().unwrap().evicted_records, 1700 + 100);
            t.set_budget(Budget::default()).unwrap();
            t.insert(&[t.prepare(&key(-1), &body(1, 10))]).unwrap();
            assert_eq!(t.len().unwrap(), 301);
        }
    }

    #[test]
    fn a_bounded_table_loaded_in_bulk_is_evicted_down_to_its_budget() {
        for kind in KINDS {
            let src = table_of(kind, Compression::None);
            fill(&src, 0..1000);
            let t = table_of(kind, Compression::None);
            t.set_budget(at_most(100)).unwrap();
            let mut bulk = Bulk::default();
            for run in records_by_key(&src) {
                let recs: Vec<&[u8]> = run[1..].iter().map(Vec::as_slice).collect();
                t.bulk_put(loaded(&t, recs), &mut bulk).unwrap();
            }
            t.bulk_finish(&mut bulk).unwrap();
            assert_eq!(t.len().unwrap(), 100, "{kind:?}");
        }
    }

    #[test]
    fn a_compare_and_swap_into_a_bounded_table_evicts_too() {
        let t = table(Compression::None);
        t.set_budget(at_most(10)).unwrap();
        for i in 0..20i64 {
            let h = t.hash(&key(i));
            assert!(t
                .replace_if(h, &key(i), None, Some(&t.prepare(&key(i), &body(i, 1))))
                .unwrap());
        }
        assert_eq!(t.len().unwrap(), 10);
        assert_eq!(t.stats().unwrap().evicted_keys, 10);
    }

    #[test]
    fn a_bag_compare_and_swap_replaces_the_record_it_names_in_place() {
        let t = table_of(Kind::DuplicateBag, Compression::Zlib(1));
        let k = key(1);
        let h = t.hash(&k);
        let objs: Vec<Prepared> = [1, 2, 1]
            .iter()
            .map(|&v| t.prepare(&k, &body(v, 60)))
            .collect();
        t.insert(&objs).unwrap();
        let mut seen = RecordBuf::new();
        t.get(h, &k, &mut seen).unwrap();
        // The third record, a copy of the first: only it is replaced.
        let third = seen.items()[2];
        let new = t.prepare(&k, &body(7, 60));
        assert!(t
            .replace_if(h, &k, Some((&seen, &third)), Some(&new))
            .unwrap());
        assert_eq!(
            all_bodies(&t, &k),
            vec![body(1, 60), body(2, 60), body(7, 60)]
        );
        // Named by a record that is gone: nothing changes.
        assert!(!t.replace_if(h, &k, Some((&seen, &third)), None).unwrap());
        let second = seen.items()[1];
        assert!(t.replace_if(h, &k, Some((&seen, &second)), None).unwrap());
        assert_eq!(all_bodies(&t, &k), vec![body(1, 60), body(7, 60)]);
        assert_eq!(t.len().unwrap(), 2);
    }

    #[test]
    fn a_bag_log_replays_exactly_over_a_dump_that_already_saw_it() {
        for kind in [Kind::Bag, Kind::DuplicateBag, Kind::Set, Kind::OrderedSet] {
            let t = table_of(kind, Compression::None);
            let rec = Arc::new(Recorder::default());
            assert!(t.set_journal(rec.clone()));
            let obj = |k: i64, v: i64| t.prepare(&key(k), &body(v, 3));
            t.insert(&[obj(1, 1), obj(1, 2), obj(2, 1)]).unwrap();
            // The dump's segment starts here...
            let from = rec.0.lock().len();
            t.insert(&[obj(1, 3), obj(1, 2), obj(2, 2)]).unwrap();
            t.insert(&[obj(3, 1)]).unwrap();
            t.remove_object(&obj(1, 1)).ok();
            t.remove(t.hash(&key(2)), &key(2), None).unwrap();
            t.insert(&[obj(2, 5)]).unwrap();
            // A compare-and-swap replaces a record (in a bag, in its place
            // among its key's) and removes one.
            let mut seen = RecordBuf::new();
            t.get(t.hash(&key(1)), &key(1), &mut seen).unwrap();
            let last = *seen.items().last().unwrap();
            let h1 = t.hash(&key(1));
            assert!(t
                .replace_if(h1, &key(1), Some((&seen, &last)), Some(&obj(1, 9)))
                .unwrap());
            let mut seen = RecordBuf::new();
            t.get(t.hash(&key(3)), &key(3), &mut seen).unwrap();
            let it = seen.items()[0];
            let h3 = t.hash(&key(3));
            assert!(t.replace_if(h3, &key(3), Some((&seen, &it)), None).unwrap());
            // ...and its fuzzy walk saw every one of those changes.
            let dumped = table_of(kind, Compression::None);
            let mut bulk = Bulk::default();
            let now = records_by_key(&t);
            for run in &now {
                let recs: Vec<&[u8]> = run[1..].iter().map(Vec::as_slice).collect();
                dumped.bulk_put(loaded(&dumped, recs), &mut bulk).unwrap();
            }
            dumped.bulk_finish(&mut bulk).unwrap();
            replay(&dumped, &rec.0.lock()[from..]);
            assert_eq!(records_by_key(&dumped), now, "{kind:?}");
            // And from nothing, the whole log gives the same table.
            let fresh = table_of(kind, Compression::None);
            replay(&fresh, &rec.0.lock());
            assert_eq!(records_by_key(&fresh), now, "{kind:?} from the log alone");
        }
    }

    /// A record as (key, body).
    type Kv = (Vec<u8>, Vec<u8>);

    /// Every record of slots 0, 1, ... up to `Slotted::End` (numbered by
    /// `bits`, as [`Table::slot`]), and how many slots there are.
    fn all_slots(t: &Table, bits: Option<u32>) -> (Vec<Kv>, usize) {
        let mut got = Vec::new();
        let mut scratch = Vec::new();
        for i in 0.. {
            let mut buf = RecordBuf::new();
            match t.slot(i, bits, &mut buf).unwrap() {
                Slotted::Records => {
                    for it in buf.items() {
                        let body = buf
                            .body(it, t.dictionaries(), &mut scratch)
                            .unwrap()
                            .to_vec();
                        got.push((buf.key(it).to_vec(), body));
                    }
                }
                Slotted::End => {
                    let mut buf = RecordBuf::new();
                    let past = Slotted::OutOfRange { slots: i };
                    assert_eq!(t.slot(i + 1, bits, &mut buf).unwrap(), past);
                    assert_eq!(t.slot(i + 1000, bits, &mut buf).unwrap(), past);
                    return (got, i);
                }
                Slotted::OutOfRange { .. } => panic!("slot {i} out of range before the end"),
            }
        }
        unreachable!()
    }

    #[test]
    fn slots_hold_every_record_exactly_once_in_every_kind() {
        for kind in [Kind::Set, Kind::OrderedSet, Kind::Bag, Kind::DuplicateBag] {
            let t = table_of(kind, Compression::None);
            let (empty, slots) = all_slots(&t, None);
            assert!(empty.is_empty());
            if kind == Kind::OrderedSet {
                assert_eq!(slots, 0);
            }
            let mut want = Vec::new();
            for i in 0..3000i64 {
                // A bag gets three objects for some keys.
                let copies = if kind.is_bag() && i % 7 == 0 { 3 } else { 1 };
                for c in 0..copies {
                    let (k, b) = (key(i), body(i * 10 + c, 5));
                    t.insert(&[t.prepare(&k, &b)]).unwrap();
                    want.push((k, b));
                }
            }
            for i in (0..3000i64).step_by(3) {
                t.remove(t.hash(&key(i)), &key(i), None).unwrap();
                want.retain(|(k, _)| *k != key(i));
            }
            let (mut got, slots) = all_slots(&t, None);
            if kind == Kind::OrderedSet {
                // The i-th slot is the i-th record in key order.
                assert_eq!(slots, want.len());
                let order: Vec<_> = got.iter().map(|(k, _)| k.clone()).collect();
                let mut walk = Vec::new();
                let mut k = t.first_key().unwrap();
                while let Some(key) = k {
                    k = t.next_key(t.hash(&key), &key).unwrap();
                    walk.push(key);
                }
                assert_eq!(order, walk, "{kind:?}: slots in key order");
            } else {
                assert!(
                    slots.is_power_of_two() && slots >= want.len() / 2,
                    "{slots} buckets"
                );
            }
            got.sort();
            want.sort();
            assert_eq!(got, want, "{kind:?}");
        }
    }

    #[test]
    fn slots_numbered_at_fixation_stay_put_while_the_index_grows_and_shrinks() {
        for kind in [Kind::Set, Kind::Bag, Kind::DuplicateBag] {
            let t = table_of(kind, Compression::None);
            let put = |i: i64| t.insert(&[t.prepare(&key(i), &body(i, 3))]).unwrap();
            let remove = |i: i64| {
                t.remove(t.hash(&key(i)), &key(i), None).unwrap();
            };
            (0..500).for_each(put);
            let bits = t.slot_bits().unwrap();
            let keys_of = |got: Vec<Kv>| {
                let mut keys: Vec<_> = got.into_iter().map(|(k, _)| k).collect();
                keys.sort();
                keys
            };
            // Grown 40 times over: more buckets, same slots.
            (500..20_000).for_each(put);
            assert!(t.slot_bits().unwrap() > bits);
            let (got, slots) = all_slots(&t, bits);
            assert_eq!(slots, 1 << bits.unwrap());
            let mut all: Vec<_> = (0..20_000).map(key).collect();
            all.sort();
            assert_eq!(keys_of(got), all, "{kind:?} grown");

            // Shrunk below the size at fixation: fewer buckets, same slots.
            (100..20_000).for_each(remove);
            assert!(t.slot_bits().unwrap() < bits);
            let (got, slots) = all_slots(&t, bits);
            assert_eq!(slots, 1 << bits.unwrap());
            let mut want: Vec<_> = (0..100).map(key).collect();
            want.sort();
            assert_eq!(keys_of(got), want, "{kind:?} shrunk");
        }
    }

    #[test]
    fn remove_chunk_takes_the_records_it_picks_in_resumable_logged_chunks() {
        for kind in [Kind::Set, Kind::OrderedSet, Kind::Bag, Kind::DuplicateBag] {
            for compression in [Compression::None, Compression::Zlib(6)] {
                let t = table_of(kind, compression);
                let rec = Arc::new(Recorder::default());
                assert!(t.set_journal(rec.clone()));
                // Keys 0..2999; pairs and triples (a bag key gets both).
                let obj = |k: i64, v: i64| {
                    let mut elems = vec![Value::Int(k), Value::Binary(vec![b'x'; 60])];
                    if v % 2 == 1 {
                        elems.push(Value::Int(v));
                    }
                    t.prepare(&key(k), &Value::Tuple(elems).to_bytes())
                };
                let recs: Vec<Prepared> = (0..6000).map(|i| obj(i % 2999, i)).collect();
                t.insert(&recs).unwrap();
                let before = records_by_key(&t);
                let mut cursor = None;
                let mut removed = 0;
                let mut chunks = 0;
                loop {
                    let (n, next) = t
                        .remove_chunk(cursor.as_ref(), 100, |b| codec::tuple_arity(b) == Some(2))
                        .unwrap();
                    removed += n;
                    chunks += 1;
                    match next {
                        Some(c) => cursor = Some(c),
                        None => break,
                    }
                }
                assert!(chunks >= 30, "{kind:?}: {chunks} chunks");
                // Only triples are left, in their order, every pair gone.
                let left = records_by_key(&t);
                let mut scratch = Vec::new();
                let expected: Vec<Vec<Vec<u8>>> = before
                    .iter()
                    .map(|run| {
                        let mut run = run.clone();
                        run.retain(|r| {
                            let h = Header::parse(r).map(|h| (h, r.as_slice()));
                            h.map_or(true, |(h, r)| {
                                let body = &r[h.body_start()..];
                                let raw =
                                    compress::unpack(&h, body, t.dictionaries(), &mut scratch)
                                        .unwrap();
                                codec::tuple_arity(raw) != Some(2)
                            })
                        });
                        run
                    })
                    .filter(|run| run.len() > 1)
                    .collect();
                assert_eq!(left, expected, "{kind:?}");
                assert_eq!(
                    t.len().unwrap() + removed,
                    6000.min(before.iter().map(|r| r.len() - 1).sum())
                );
                // The log replays to the same table.
                let fresh = table_of(kind, compression);
                replay(&fresh, &rec.0.lock());
                assert_eq!(records_by_key(&fresh), left, "{kind:?} replayed");
            }
        }
    }

    // ---- Expiry (table/expire.rs). A time to live of 0 has expired when
    // the write returns; an hour has not while a test runs.

    const HOUR: u64 = 3_600_000;

    /// Keys the table's walks and reads see, each way, sorted.
    fn seen(t: &Table, keys: std::ops::Range<i64>) -> [Vec<Vec<u8>>; 5] {
        let mut walked = Vec::new();
        each_record(t, Direction::Forward, 3, |b, it| {
            walked.push(b.key(it).to_vec())
        });
        let mut back = Vec::new();
        each_record(t, Direction::Backward, 3, |b, it| {
            back.push(b.key(it).to_vec())
        });
        let mut stepped = Vec::new();
        let mut next = t.first_key().unwrap();
        while let Some(k) = next {
            next = t.next_key(t.hash(&k), &k).unwrap();
            stepped.push(k);
        }
        let found = keys
            .filter(|&i| {
                let k = key(i);
                let got = t.contains(t.hash(&k), &k).unwrap();
                assert_eq!(got, t.count(t.hash(&k), &k).unwrap() > 0);
                assert_eq!(got, get_body(t, &k).is_some());
                got
            })
            .map(key)
            .collect();
        let mut slotted = Vec::new();
        let bits = t.slot_bits().unwrap();
        for i in 0.. {
            let mut buf = RecordBuf::new();
            match t.slot(i, bits, &mut buf).unwrap() {
                Slotted::Records => buf
                    .items()
                    .iter()
                    .for_each(|it| slotted.push(buf.key(it).to_vec())),
                _ => break,
            }
        }
        let mut all = [walked, back, stepped, found, slotted];
        for v in &mut all {
            v.sort();
            v.dedup();
        }
        all
    }

    #[test]
    fn expired_keys_are_gone_for_every_read_and_the_sweep_removes_them() {
        for kind in KINDS {
            let t = table_of(kind, Compression::None);
            let live: Vec<Prepared> = (0..50).map(|i| t.prepare(&key(i), &body(i, 10))).collect();
            let dead: Vec<Prepared> = (50..100)
                .map(|i| t.prepare(&key(i), &body(i, 10)))
                .collect();
            t.insert_ttl(&live, Ttl::Millis(HOUR)).unwrap();
            t.insert_ttl(&dead, Ttl::Millis(0)).unwrap();
            let want: Vec<Vec<u8>> = {
                let mut v: Vec<_> = (0..50).map(key).collect();
                v.sort();
                v
            };
            for got in seen(&t, 0..100) {
                assert_eq!(got, want, "{kind:?}");
            }
            assert_eq!(t.len().unwrap(), 50);
            assert_eq!(t.stored_len().unwrap(), 100, "not swept yet");
            assert_eq!(t.stats().unwrap().size, 50);
            // The sweep takes the expired keys, a step at a time.
            assert_eq!(t.sweep(30).unwrap(), 30);
            assert_eq!(t.sweep(30).unwrap(), 20);
            assert_eq!(t.sweep(30).unwrap(), 0);
            let s = t.stats().unwrap();
            assert_eq!(
                (s.expired_keys, s.expired_records, s.expiring_keys),
                (50, 50, 50)
            );
            assert_eq!(t.stored_len().unwrap(), 50);
            for got in seen(&t, 0..100) {
                assert_eq!(got, want, "{kind:?}");
            }
        }
    }

    #[test]
    fn writes_find_an_expired_key_gone_and_log_its_removal() {
        for kind in KINDS {
            let t = table_of(kind, Compression::None);
            let journal = Arc::new(Recorder::default());
            t.set_journal(journal.clone());
            let k = key(1);
            t.insert_ttl(&[t.prepare(&k, &body(1, 5))], Ttl::Millis(0))
                .unwrap();
            let logged = journal.0.lock().len();
            // insert_new sees no key: the expired one is removed (a logged
            // delete, first) and the new record goes in, with no deadline.
            assert!(t.insert_new(&[t.prepare(&k, &body(2, 5))]).unwrap());
            assert_eq!(get_body(&t, &k), Some(body(2, 5)));
            assert_eq!(t.len().unwrap(), 1, "{kind:?}");
            let log = journal.0.lock();
            assert!(
                matches!(&log[logged], Owned::Delete(d) if *d == k),
                "{kind:?}"
            );
            drop(log);
            let s = t.stats().unwrap();
            assert_eq!((s.expired_keys, s.expiring_keys), (1, 0));
            // A delete of an expired key finds none.
            t.insert_ttl(&[t.prepare(&key(2), &body(2, 5))], Ttl::Millis(0))
                .unwrap();
            assert!(!t.remove(t.hash(&key(2)), &key(2), None).unwrap());
            // Deleting a key drops its deadline.
            t.insert_ttl(&[t.prepare(&key(3), &body(3, 5))], Ttl::Millis(HOUR))
                .unwrap();
            assert!(t.remove(t.hash(&key(3)), &key(3), None).unwrap());
            assert_eq!(t.stats().unwrap().expiring_keys, 0, "{kind:?}");
            // Clearing counts only what was there to see.
            t.insert_ttl(&[t.prepare(&key(4), &body(4, 5))], Ttl::Millis(0))
                .unwrap();
            t.insert(&[t.prepare(&key(5), &body(5, 5))]).unwrap();
            assert_eq!(t.clear().unwrap(), 2, "{kind:?}");
        }
    }

    #[test]
    fn a_table_ttl_gives_keys_deadlines_and_a_write_may_set_its_own() {
        let t = table(Compression::None);
        t.insert(&[t.prepare(&key(1), &body(1, 5))]).unwrap();
        assert!(!t.stats().unwrap().expires);
        t.set_ttl(Some(HOUR)).unwrap();
        let s = t.stats().unwrap();
        assert_eq!(
            (s.ttl, s.expiring_keys),
            (Some(HOUR), 1),
            "a key already there"
        );
        t.insert(&[t.prepare(&key(2), &body(2, 5))]).unwrap();
        t.insert_ttl(&[t.prepare(&key(3), &body(3, 5))], Ttl::Never)
            .unwrap();
        assert_eq!(t.stats().unwrap().expiring_keys, 2);
        // A write of a key without a ttl in a table with one: the table's.
        t.insert_ttl(&[t.prepare(&key(3), &body(3, 5))], Ttl::Millis(0))
            .unwrap();
        assert_eq!(t.len().unwrap(), 2);
        t.insert(&[t.prepare(&key(3), &body(3, 5))]).unwrap();
        assert_eq!(t.len().unwrap(), 3);
        assert!(t.stats().unwrap().expiry_bytes > 0);
    }

    #[test]
    fn a_bounded_table_removes_expired_keys_before_it_evicts_live_ones() {
        let t = table(Compression::None);
        let budget = Budget {
            max_bytes: None,
            max_records: Some(10),
        };
        t.set_budget(budget).unwrap();
        let dead: Vec<Prepared> = (0..10).map(|i| t.prepare(&key(i), &body(i, 5))).collect();
        t.insert_ttl(&dead, Ttl::Millis(0)).unwrap();
        for i in 10..20 {
            t.insert(&[t.prepare(&key(i), &body(i, 5))]).unwrap();
        }
        let s = t.stats().unwrap();
        assert_eq!((s.evicted_keys, s.expired_keys, s.size), (0, 10, 10));
        assert!((10..20).all(|i| get_body(&t, &key(i)).is_some()));
    }

    #[test]
    fn a_quick_walk_step_gives_up_past_many_expired_keys() {
        let t = table_of(Kind::OrderedSet, Compression::None);
        let dead: Vec<Prepared> = (0..2 * MAX_EXPIRED_STEPS as i64)
            .map(|i| t.prepare(&key(i), &body(i, 1)))
            .collect();
        t.insert_ttl(&dead, Ttl::Millis(0)).unwrap();
        t.insert(&[t.prepare(&key(1 << 20), &body(0, 1))]).unwrap();
        let mut out = RecordBuf::new();
        assert!(matches!(
            quick(|| t.end_record(Direction::Forward, &mut out)),
            Err(Error::TooLong)
        ));
        assert!(t.end_record(Direction::Forward, &mut out).unwrap());
        assert_eq!(out.key(&out.items()[0]), key(1 << 20));
        assert!(matches!(quick(|| t.len()), Ok(1)));
    }
}
