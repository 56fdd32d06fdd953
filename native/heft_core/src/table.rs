//! A set table: the hash index and the arena behind one read/write lock.
//!
//! Callers encode and compress outside the lock ([`Table::prepare`]); under
//! the write lock a change is an arena allocation, a copy and an index
//! update. Readers copy a record's stored bytes out under the read lock and
//! decompress and decode after releasing it, so no lock is held while
//! (de)compressing. Updates that read, compute and write (counters, element
//! updates) use [`Table::replace_if`], a compare-and-swap on the record's
//! offset and bytes, and retry when another writer got there first.

use std::cmp::Ordering;
use std::io;

use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::sync::{Arc, OnceLock};

use parking_lot::{
    MappedRwLockReadGuard, MappedRwLockWriteGuard, RwLock, RwLockReadGuard, RwLockWriteGuard,
};

use crate::arena::{Arena, Backing};
use crate::atoms::AtomTable;
use crate::compress::{self, Codec, Compression};
use crate::hash::KeyedHash;
use crate::index::{HashIndex, Inserted, Slot};
use crate::record::{self, Header};

/// How to build a table.
#[derive(Clone, Debug)]
pub struct Options {
    /// Where the arena keeps its pages.
    pub backing: Backing,
    /// How bodies are compressed.
    pub compression: Compression,
    /// Shown in /proc/PID/maps and in file arena names.
    pub label: String,
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
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Deleted => write!(f, "the table has been deleted"),
            Error::Io(e) => write!(f, "i/o: {e}"),
            Error::Poisoned => write!(f, "the table's log failed to sync; reopen it"),
            Error::WouldBlock => write!(f, "the table's log needs a new segment first"),
        }
    }
}

/// Tables whose storage (index and arena) is still allocated.
static LIVE: AtomicUsize = AtomicUsize::new(0);

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

/// One change as the journal sees it.
#[derive(Clone, Copy, Debug)]
pub enum Change<'a> {
    /// A record as stored (header, key, body) replaces any with its key.
    Put(&'a [u8]),
    /// The record with this encoded key is removed.
    Delete(&'a [u8]),
    /// Every record is removed.
    Clear,
}

/// Logs changes before a table applies them (see persist.rs).
pub trait Journal: Send + Sync {
    /// Logs `changes`, which the table applies atomically once this returns
    /// `Ok`. On error the table applies nothing and returns the error.
    fn log(&self, changes: &[Change<'_>]) -> Result<(), Error>;
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
    bytes: Vec<u8>,
}

impl Prepared {
    /// The record as it will be stored (header, key, body).
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    fn key(&self) -> &[u8] {
        &self.bytes[self.header_len..self.header_len + self.key_len]
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
    pub fn body<'a>(
        &'a self,
        it: &Item,
        scratch: &'a mut Vec<u8>,
    ) -> Result<&'a [u8], compress::CorruptBody> {
        let s = it.start + it.header.body_start();
        let stored = &self.bytes[s..s + it.header.stored_len];
        match it.header.codec {
            Codec::Raw => Ok(stored),
            Codec::Deflate => {
                compress::decompress(stored, it.header.raw_len, scratch)?;
                Ok(scratch)
            }
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

/// Where a walk stopped: the last (hash, key) it returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cursor {
    /// The key's hash.
    pub hash: u64,
    /// The key's encoding.
    pub key: Vec<u8>,
}

/// Figures about a table, all in bytes except `size`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Records in the table.
    pub size: u64,
    /// The hash index's slot array (its exact heap allocation).
    pub index_bytes: u64,
    /// Other heap memory: the atom dictionary (estimated from capacities)
    /// and the arena's free lists.
    pub meta_bytes: u64,
    /// Length of the arena mapping.
    pub arena_mapped_bytes: u64,
    /// Arena bytes handed out: live blocks, freed blocks awaiting reuse, and
    /// an 8-byte head; pages given back to the kernel are not counted.
    pub arena_used_bytes: u64,
    /// Arena bytes in blocks holding records, size-class slack included.
    pub arena_live_bytes: u64,
    /// Arena bytes in freed blocks awaiting reuse.
    pub arena_free_bytes: u64,
    /// Sum over records of key plus uncompressed body.
    pub payload_raw_bytes: u64,
    /// Sum over records of header, key and body as stored.
    pub payload_stored_bytes: u64,
    /// Start address of the arena mapping (to find it in smaps).
    pub arena_address: u64,
    /// Start address of the index's slot array mapping.
    pub index_address: u64,
}

/// A table's storage. Dropping it frees the index and unmaps the arena.
pub struct State {
    index: HashIndex,
    arena: Arena,
    raw_bytes: u64,
    stored_bytes: u64,
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
}

impl State {
    fn record_at(&self, loc: u64) -> (Header, &[u8]) {
        record_in(&self.arena, loc)
    }

    fn key_at(&self, loc: u64) -> &[u8] {
        key_in(&self.arena, loc)
    }

    fn find(&self, hash: u64, key: &[u8]) -> Option<usize> {
        self.index.find(hash, |loc| self.key_at(loc).cmp(key))
    }

    fn release(&mut self, loc: u64) {
        let h = self.record_at(loc).0;
        self.raw_bytes -= (h.key_len + h.raw_len) as u64;
        self.stored_bytes -= h.total_len() as u64;
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
        for (loc, r) in locs.iter().zip(recs) {
            let dst = self
                .arena
                .get_mut(*loc, r.bytes.len())
                .expect("a block just allocated lies inside the arena");
            dst.copy_from_slice(&r.bytes);
            self.raw_bytes += (r.key_len + r.raw_len) as u64;
            self.stored_bytes += r.bytes.len() as u64;
        }
        Ok(locs)
    }

    /// Frees blocks `place` filled, when the change is not applied after all.
    fn unplace(&mut self, recs: &[&Prepared], locs: &[u64]) {
        for (r, loc) in recs.iter().zip(locs) {
            self.raw_bytes -= (r.key_len + r.raw_len) as u64;
            self.stored_bytes -= r.bytes.len() as u64;
            self.arena.free(*loc);
        }
    }

    fn link(&mut self, r: &Prepared, loc: u64) {
        let key = r.key();
        let State { index, arena, .. } = self;
        let cmp = |l: u64| key_in(arena, l).cmp(key);
        if let Inserted::Replaced(old) = index.insert(r.hash, loc, cmp) {
            self.release(old);
        }
    }

    fn copy_out(&self, pos: usize, out: &mut RecordBuf) {
        let s = self.index.slot(pos);
        let (h, bytes) = self.record_at(s.loc);
        out.push(s.hash, s.loc, h, bytes);
    }
}

/// The record at an indexed offset. The index only ever points at records
/// this table wrote, so a bad header is a bug, not bad input.
fn record_in(arena: &Arena, loc: u64) -> (Header, &[u8]) {
    let h = Header::parse_prefix(arena.tail(loc, record::MAX_HEADER))
        .expect("valid record header at an indexed offset");
    let bytes = arena
        .get(loc, h.total_len())
        .expect("indexed record lies inside the arena");
    (h, bytes)
}

fn key_in(arena: &Arena, loc: u64) -> &[u8] {
    let (h, bytes) = record_in(arena, loc);
    &bytes[h.key_start()..h.body_start()]
}

/// A set table.
pub struct Table {
    hasher: KeyedHash,
    compression: Compression,
    state: RwLock<Option<State>>,
    atoms: Arc<RwLock<AtomTable>>,
    backing: Backing,
    journal: OnceLock<Arc<dyn Journal>>,
}

impl Table {
    /// Creates an empty table.
    pub fn new(opts: &Options) -> io::Result<Table> {
        let arena = Arena::new(&opts.backing, &opts.label)?;
        LIVE.fetch_add(1, AtomicOrdering::Relaxed);
        Ok(Table {
            hasher: KeyedHash::random(),
            compression: opts.compression,
            state: RwLock::new(Some(State {
                index: HashIndex::new(&opts.label),
                arena,
                raw_bytes: 0,
                stored_bytes: 0,
            })),
            atoms: Arc::new(RwLock::new(AtomTable::new())),
            backing: opts.backing.clone(),
            journal: OnceLock::new(),
        })
    }

    fn read(&self) -> Result<MappedRwLockReadGuard<'_, State>, Error> {
        RwLockReadGuard::try_map(self.state.read(), Option::as_ref).map_err(|_| Error::Deleted)
    }

    fn write(&self) -> Result<MappedRwLockWriteGuard<'_, State>, Error> {
        RwLockWriteGuard::try_map(self.state.write(), Option::as_mut).map_err(|_| Error::Deleted)
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

    /// The arena file, for a file arena.
    pub fn arena_path(&self) -> Option<std::path::PathBuf> {
        let st = self.read().ok()?;
        st.arena.path().map(|p| p.to_path_buf())
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
            bulk.slots.push(Slot { hash, loc });
        }
        Ok(())
    }

    /// Indexes what [`Table::bulk_put`] placed; of records with the same
    /// key, the last placed wins (and replaces one already indexed).
    pub fn bulk_finish(&self, bulk: &mut Bulk) -> Result<(), Error> {
        let mut st = self.write()?;
        // Sorted by (hash, key, placing order): of equal keys the last
        // placed comes last. Keys are compared only on equal hashes.
        let mut slots = std::mem::take(&mut bulk.slots);
        if sort_by_hash(&mut slots) {
            let arena = &st.arena;
            for run in slots.chunk_by_mut(|a, b| a.hash == b.hash) {
                if run.len() > 1 {
                    run.sort_by(|a, b| key_in(arena, a.loc).cmp(key_in(arena, b.loc)));
                }
            }
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
        if st.index.is_empty() {
            st.index.build_sorted(&slots);
            return Ok(());
        }
        for s in slots {
            let State { index, arena, .. } = &mut *st;
            let key = key_in(arena, s.loc);
            if let Inserted::Replaced(old) =
                index.insert(s.hash, s.loc, |l| key_in(arena, l).cmp(key))
            {
                st.release(old);
            }
        }
        Ok(())
    }

    /// Compresses and frames a record (no lock taken). `body` is the
    /// encoded record, `key` its key's canonical encoding.
    pub fn prepare(&self, key: &[u8], body: &[u8]) -> Prepared {
        let mut packed = Vec::new();
        let codec = compress::compress(body, self.compression, &mut packed);
        let stored: &[u8] = match codec {
            Codec::Raw => body,
            Codec::Deflate => &packed,
        };
        let mut bytes = Vec::new();
        record::write(&mut bytes, codec, key, stored, body.len());
        Prepared {
            hash: self.hash(key),
            key_len: key.len(),
            header_len: record::header_len(codec, key.len(), stored.len(), body.len()),
            raw_len: body.len(),
            bytes,
        }
    }

    /// Inserts all records, replacing equal keys, in order (a later record
    /// with the same key wins). All or nothing: on error none is inserted.
    pub fn insert(&self, recs: &[Prepared]) -> Result<(), Error> {
        let refs: Vec<&Prepared> = recs.iter().collect();
        let mut st = self.write()?;
        let locs = st.place(&refs)?;
        if let Err(e) = self.log_puts(&refs) {
            st.unplace(&refs, &locs);
            return Err(e);
        }
        for (r, loc) in recs.iter().zip(locs) {
            st.link(r, loc);
        }
        Ok(())
    }

    /// Inserts all records if none of their keys is present; returns false
    /// (inserting nothing) otherwise.
    pub fn insert_new(&self, recs: &[Prepared]) -> Result<bool, Error> {
        let refs: Vec<&Prepared> = recs.iter().collect();
        let mut st = self.write()?;
        if recs.iter().any(|r| st.find(r.hash, r.key()).is_some()) {
            return Ok(false);
        }
        let locs = st.place(&refs)?;
        if let Err(e) = self.log_puts(&refs) {
            st.unplace(&refs, &locs);
            return Err(e);
        }
        for (r, loc) in recs.iter().zip(locs) {
            st.link(r, loc);
        }
        Ok(true)
    }

    /// Copies the record with this key into `out` (appending); false if absent.
    pub fn get(&self, hash: u64, key: &[u8], out: &mut RecordBuf) -> Result<bool, Error> {
        let st = self.read()?;
        Ok(match st.find(hash, key) {
            Some(pos) => {
                st.copy_out(pos, out);
                true
            }
            None => false,
        })
    }

    /// True if the key is present.
    pub fn contains(&self, hash: u64, key: &[u8]) -> Result<bool, Error> {
        Ok(self.read()?.find(hash, key).is_some())
    }

    /// Removes the key; copies the removed record into `out` when given.
    /// Returns whether it was present.
    pub fn remove(
        &self,
        hash: u64,
        key: &[u8],
        out: Option<&mut RecordBuf>,
    ) -> Result<bool, Error> {
        let mut st = self.write()?;
        let Some(pos) = st.find(hash, key) else {
            return Ok(false);
        };
        self.log(&[Change::Delete(key)])?;
        if let Some(out) = out {
            st.copy_out(pos, out);
        }
        let slot = st.index.remove_at(pos);
        st.release(slot.loc);
        Ok(true)
    }

    /// Replaces (or with `new: None`, removes) the record with this key if
    /// it is still the one in `expected` (same offset and bytes), or inserts
    /// `new` if `expected` is `None` and the key is still absent. Returns
    /// false, changing nothing, if another writer changed the key meanwhile.
    pub fn replace_if(
        &self,
        hash: u64,
        key: &[u8],
        expected: Option<(&RecordBuf, &Item)>,
        new: Option<&Prepared>,
    ) -> Result<bool, Error> {
        let mut st = self.write()?;
        let pos = st.find(hash, key);
        let same = match (pos, expected) {
            (None, None) => true,
            (Some(pos), Some((buf, it))) => {
                let loc = st.index.slot(pos).loc;
                loc == it.loc && st.record_at(loc).1 == buf.record(it)
            }
            _ => false,
        };
        if !same {
            return Ok(false);
        }
        match (pos, new) {
            (_, Some(new)) => {
                let locs = st.place(&[new])?;
                if let Err(e) = self.log_puts(&[new]) {
                    st.unplace(&[new], &locs);
                    return Err(e);
                }
                st.link(new, locs[0]);
            }
            (Some(pos), None) => {
                self.log(&[Change::Delete(key)])?;
                let slot = st.index.remove_at(pos);
                st.release(slot.loc);
            }
            (None, None) => {}
        }
        Ok(true)
    }

    /// Removes every record.
    pub fn clear(&self) -> Result<(), Error> {
        let mut st = self.write()?;
        self.log(&[Change::Clear])?;
        st.arena.clear()?;
        st.index.clear();
        st.raw_bytes = 0;
        st.stored_bytes = 0;
        Ok(())
    }

    /// Copies up to `max_records` records (stopping early once they hold
    /// `max_raw` bytes of key plus uncompressed body, the measure of what
    /// decoding them will cost) that come after `after` in walk order
    /// (from the start when `None`). Returns where to resume, or `None` when
    /// the walk reached the end.
    pub fn chunk(
        &self,
        after: Option<&Cursor>,
        max_records: usize,
        max_raw: usize,
        out: &mut RecordBuf,
    ) -> Result<Option<Cursor>, Error> {
        let st = self.read()?;
        let mut p = match after {
            None => 0,
            Some(c) => st
                .index
                .seek_after(c.hash, |loc| st.key_at(loc).cmp(&c.key)),
        };
        let first = out.len();
        let mut raw = 0usize;
        while out.len() - first < max_records && raw < max_raw {
            match st.index.next_occupied(p) {
                Some(q) => {
                    st.copy_out(q, out);
                    if let Some(it) = out.items.last() {
                        raw += it.header.key_len + it.header.raw_len;
                    }
                    p = q + 1;
                }
                None => return Ok(None),
            }
        }
        // Stopped because the chunk is full: is there anything after it?
        if st.index.next_occupied(p).is_none() {
            return Ok(None);
        }
        Ok(out.items.last().map(|last| Cursor {
            hash: last.hash,
            key: out.key(last).to_vec(),
        }))
    }

    /// The first key in walk order.
    pub fn first_key(&self) -> Result<Option<Vec<u8>>, Error> {
        let st = self.read()?;
        Ok(st
            .index
            .next_occupied(0)
            .map(|pos| st.key_at(st.index.slot(pos).loc).to_vec()))
    }

    /// The key after `key` in walk order, whether or not `key` is still in
    /// the table.
    pub fn next_key(&self, hash: u64, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        let st = self.read()?;
        let p = st.index.seek_after(hash, |loc| st.key_at(loc).cmp(key));
        Ok(st
            .index
            .next_occupied(p)
            .map(|pos| st.key_at(st.index.slot(pos).loc).to_vec()))
    }

    /// Number of records.
    pub fn len(&self) -> Result<usize, Error> {
        Ok(self.read()?.index.len())
    }

    /// True when the table holds no records.
    pub fn is_empty(&self) -> Result<bool, Error> {
        Ok(self.len()? == 0)
    }

    /// Current figures.
    pub fn stats(&self) -> Result<Stats, Error> {
        let st = self.read()?;
        Ok(Stats {
            size: st.index.len() as u64,
            index_bytes: st.index.heap_bytes(),
            meta_bytes: self.atoms.read().heap_bytes() + st.arena.overhead_bytes(),
            arena_mapped_bytes: st.arena.mapped_bytes(),
            arena_used_bytes: st.arena.used_bytes(),
            arena_live_bytes: st.arena.live_bytes(),
            arena_free_bytes: st.arena.free_bytes(),
            payload_raw_bytes: st.raw_bytes,
            payload_stored_bytes: st.stored_bytes,
            arena_address: st.arena.address() as u64,
            index_address: st.index.address() as u64,
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

/// Orders two encoded keys the way the index breaks hash ties.
pub fn key_order(a: &[u8], b: &[u8]) -> Ordering {
    a.cmp(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::Value;

    fn table(compression: Compression) -> Table {
        Table::new(&Options {
            backing: Backing::Memory,
            compression,
            label: "test".into(),
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
        Some(buf.body(&it, &mut scratch).unwrap().to_vec())
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
        for round in 0..30 {
            t.insert(&round_of(round)).unwrap();
        }
        let used = t.stats().unwrap().arena_used_bytes;
        for round in 30..300 {
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
        let mut k = t.first_key().unwrap().unwrap();
        let mut n = 1;
        while let Some(next) = t.next_key(t.hash(&k), &k).unwrap() {
            k = next;
            n += 1;
        }
        assert_eq!(n, 5000);
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
        }
    }

    #[test]
    fn a_bulk_load_keeps_the_last_record_of_each_key() {
        let t = table(Compression::None);
        let load = |round: i64, range: std::ops::Range<i64>| {
            let recs: Vec<Vec<u8>> = range
                .map(|i| t.prepare(&key(i % 3000), &body(i + round, 3)).bytes)
                .collect();
            let parsed: Vec<(Header, &[u8], u64)> = recs
                .iter()
                .map(|r| {
                    let h = Header::parse(r).unwrap();
                    (h, r.as_slice(), t.hash(&r[h.key_start()..h.body_start()]))
                })
                .collect();
            let mut bulk = Bulk::default();
            t.bulk_put(parsed.into_iter(), &mut bulk).unwrap();
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
}
