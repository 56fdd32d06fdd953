//! Memory first, disk second: a table whose arena is tiered
//! ([`crate::arena::Backing::Tiered`], arena/tiered.rs) keeps its records
//! in memory up to its memory budget and moves those read least out to
//! its file.
//!
//! Which records are cold is SIEVE's answer, with the eviction queue's
//! machinery (table/evict.rs): the keys that have a record in memory are
//! queued in the order they came there; a lookup marks its key; the hand
//! passes marked keys and the first unmarked one moves out, all its
//! records in memory with it. A key joins the queue when a write puts a
//! record of it in memory and it had none there (a new key, or one whose
//! records had all moved out); a key found with no record left in memory
//! leaves it.
//!
//! The moving is done by one thread for every tiered table (below), never
//! by a caller: once memory holds more than the budget it moves records
//! out in steps of at most [`STEP_BYTES`] (and [`STEP_TIME`]) under the
//! table's write lock, resting between steps as long as the step held the
//! lock, until memory is an [`EASE`]th under the budget. After each step it starts the
//! writeback of what it wrote, outside the lock, and it waits for that
//! writeback every [`WAIT_EVERY`] bytes, so it writes no faster than the
//! disk and leaves little dirty. Meanwhile writes are never refused or
//! made to wait: past the budget and an eighth, new records go straight
//! to the file (arena/tiered.rs); only once what cannot move (the index
//! and bookkeeping) takes the budget are new keys refused
//! ([`Error::MemoryBudget`]).
//!
//! Not done: the file is not compacted (its free blocks are reused by
//! later moves), and a record read often from the file is not moved back
//! to memory until it is written (the page cache keeps it meanwhile).

use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::time::{Duration, Instant};

use super::evict::{Budget, Evict};
use super::worker::{rest, Worker};
use super::{order, Entries, Error, Order, Pos, State, Table};
use crate::arena::{self, Written};

/// Bytes of records moved out per hold of the table's write lock, at most.
pub(super) const STEP_BYTES: usize = 256 << 10;
/// Records moved out per hold, at most.
const STEP_RECORDS: usize = 512;
/// How long one hold may last, at most (looked at between keys: the hand
/// may pass up to 8,192 keys read since its last pass for one).
const STEP_TIME: Duration = Duration::from_micros(500);
/// Once it starts, the mover brings memory this fraction of the budget
/// under it (so that it does not start again at the next write).
const EASE: u64 = 16;
/// Bytes written between two waits for their writeback.
const WAIT_EVERY: u64 = 8 << 20;
/// How often the mover looks at its tables when nobody wakes it.
const TICK: Duration = Duration::from_secs(1);

/// A tiered table's queue of keys with records in memory, and what moved.
pub(super) struct Tier {
    queue: Evict,
    /// Records and bytes moved out to the file.
    pub(super) moved_records: u64,
    pub(super) moved_bytes: u64,
    /// Records lookups found in the file, and their bytes (what lookups
    /// read from the file, whether or not the page cache held it).
    file_reads: AtomicU64,
    file_read_bytes: AtomicU64,
}

impl Tier {
    pub(super) fn new() -> Tier {
        Tier {
            queue: Evict::new(Budget::default()),
            moved_records: 0,
            moved_bytes: 0,
            file_reads: AtomicU64::new(0),
            file_read_bytes: AtomicU64::new(0),
        }
    }

    /// Counts a lookup's records found in the file (under the table's
    /// read lock): their handles.
    pub(super) fn read_from_file(&self, locs: impl Iterator<Item = u64>) {
        let (mut n, mut bytes) = (0, 0);
        for loc in locs.filter(|&l| arena::in_file(l)) {
            n += 1;
            bytes += arena::block_size(loc) as u64;
        }
        if n > 0 {
            self.file_reads.fetch_add(n, AtomicOrdering::Relaxed);
            self.file_read_bytes
                .fetch_add(bytes, AtomicOrdering::Relaxed);
        }
    }

    /// Records lookups found in the file, and their bytes.
    pub(super) fn file_reads(&self) -> (u64, u64) {
        (
            self.file_reads.load(AtomicOrdering::Relaxed),
            self.file_read_bytes.load(AtomicOrdering::Relaxed),
        )
    }

    /// Marks a key read (under the table's read lock).
    pub(super) fn touch(&self, hash: u64) {
        self.queue.touch(hash);
    }

    pub(super) fn heap_bytes(&self) -> u64 {
        self.queue.heap_bytes()
    }

    pub(super) fn clear(&mut self) {
        self.queue.clear();
    }
}

/// What one step of [`Table::move_out`] did.
#[derive(Debug, Default)]
pub struct Moved {
    pub records: usize,
    pub bytes: usize,
    /// True if memory is still over the budget's lower mark.
    pub more: bool,
    /// What the step wrote to the file, to start writing back.
    pub written: Option<Written>,
}

impl State {
    /// True if a tiered table's memory budget is taken by what cannot move
    /// out to its file: the key index, the queue of keys in memory, the
    /// deadlines and a bounded table's eviction queue. Writes that would
    /// add index entries (new keys; in a bag, new objects) are refused
    /// then ([`Error::MemoryBudget`]).
    pub(super) fn pinned_over_budget(&self) -> bool {
        let (Some(t), Some(f)) = (&self.tier, self.arena.file_tier()) else {
            return false;
        };
        let pinned = self.entries.heap_bytes()
            + t.heap_bytes()
            + self
                .expiry
                .as_ref()
                .map_or(0, super::expire::Expiry::heap_bytes)
            + self.evict.as_ref().map_or(0, Evict::heap_bytes);
        pinned > f.budget
    }

    /// True if `key` has a record in memory in a tiered table (false in
    /// other tables, which have no queue of keys in memory to keep).
    pub(super) fn in_memory(&self, ord: Order, hash: u64, key: &[u8]) -> bool {
        self.tier.is_some()
            && self
                .find(ord, hash, key)
                .is_some_and(|(pos, n)| any_in_memory(&self.entries, pos, n))
    }
}

/// True if one of the `n` entries from `pos` (a key's) has its record in
/// memory.
fn any_in_memory(entries: &Entries, pos: Pos, n: usize) -> bool {
    (0..n).any(|i| !arena::in_file(entries.loc(Entries::nth(pos, i))))
}

impl Table {
    /// After a write put the record at `loc` of `key`: queues the key if it
    /// had no record in memory before (`was`) and has one now.
    pub(super) fn note_in_memory(
        &self,
        st: &mut State,
        ord: Order,
        key: &[u8],
        was: bool,
        loc: u64,
    ) {
        if was || arena::in_file(loc) {
            return;
        }
        let State {
            tier,
            entries,
            arena,
            ..
        } = st;
        let Some(t) = tier.as_mut() else { return };
        self.queue_key(&mut t.queue, entries, arena, ord, key);
    }

    /// After a write to a tiered table: notes whether records are in its
    /// file, and wakes the mover if memory holds more than the budget
    /// (records grown in place, new keys, keys back from the file).
    pub(super) fn after_tiered_write(&self, st: &State) {
        if st.tier.is_none() {
            return;
        }
        self.note_on_disk(st);
        if st.arena.memory_over(0) > 0 {
            self.move_out_on_its_own();
        }
    }

    /// Queues afresh every key with a record in memory, in index order
    /// (after a bulk load; [`Table::after_tiered_write`] then wakes the
    /// mover if need be). Reads no record in the file.
    pub(super) fn queue_in_memory(&self, st: &mut State) {
        let Some(mut t) = st.tier.take() else { return };
        t.queue.clear();
        let mut last: &[u8] = &[];
        let mut next = st.entries.first();
        while let Some(pos) = next {
            let loc = st.entries.loc(pos);
            if !arena::in_file(loc) {
                let key = super::key_in(&st.arena, loc);
                // A bag's objects of a key are next to each other.
                if key != last {
                    t.queue.requeue(key);
                    last = key;
                }
            }
            next = st.entries.next(pos);
        }
        st.tier = Some(t);
    }

    /// One step of moving the records read least out to the file, while
    /// memory holds more than the budget less an [`EASE`]th of it: at most
    /// [`STEP_BYTES`], [`STEP_RECORDS`] or [`STEP_TIME`] under one hold of
    /// the write lock.
    /// Unlogged: the table's contents do not change. Stops early at an
    /// I/O error (the disk is full: the key stays queued).
    pub fn move_out(&self) -> Result<Moved, Error> {
        let margin = |st: &State| st.arena.file_tier().map_or(0, |f| f.budget / EASE);
        {
            let st = self.read()?;
            let idle = st.arena.memory_over(margin(&st)) == 0 && !st.arena.has_written();
            if st.tier.is_none() || idle {
                return Ok(Moved::default());
            }
        }
        let mut st = self.write()?;
        let names = self.names();
        let ord = order(&names);
        let mut m = Moved::default();
        let ease = margin(&st);
        let held = Instant::now();
        while m.bytes < STEP_BYTES && m.records < STEP_RECORDS && held.elapsed() < STEP_TIME {
            if st.arena.memory_over(ease) == 0 {
                break;
            }
            let State {
                tier,
                entries,
                arena,
                ..
            } = &mut *st;
            let Some(t) = tier.as_mut() else { break };
            let in_memory = |k: &[u8], h| {
                entries
                    .find(arena, ord, h, k)
                    .filter(|&(pos, n)| any_in_memory(entries, pos, n))
            };
            let Some((key, (pos, n))) = t.queue.victim(in_memory, |k| self.hash(k)) else {
                break;
            };
            for i in 0..n {
                let p = Entries::nth(pos, i);
                let loc = entries.loc(p);
                if arena::in_file(loc) {
                    continue;
                }
                let len = super::record_in(arena, loc).0.total_len();
                match arena.move_out(loc, len) {
                    Ok(new) => {
                        entries.set_loc(p, new);
                        m.records += 1;
                        m.bytes += arena::block_size(loc);
                    }
                    Err(e) => {
                        t.queue.requeue(&key);
                        self.note_on_disk(&st);
                        return Err(e.into());
                    }
                }
            }
        }
        if let Some(t) = st.tier.as_mut() {
            t.moved_records += m.records as u64;
            t.moved_bytes += m.bytes as u64;
        }
        m.more = st.arena.memory_over(ease) > 0;
        m.written = st.arena.written();
        self.note_on_disk(&st);
        Ok(m)
    }

    /// Notes whether records of the table are in its file (callers that
    /// must not wait for the disk ask [`Table::may_read_disk`]).
    pub(super) fn note_on_disk(&self, st: &State) {
        let on = st.arena.file_tier().is_some_and(|f| f.live_bytes > 0);
        if self.on_disk.load(AtomicOrdering::Relaxed) != on {
            self.on_disk.store(on, AtomicOrdering::Relaxed);
        }
    }

    /// True if a call may read the disk: the arena is a file, or a tiered
    /// one with records in its file. Cheap: no lock.
    pub fn may_read_disk(&self) -> bool {
        match self.backing {
            arena::Backing::Memory => false,
            arena::Backing::File(_) => true,
            arena::Backing::Tiered(..) => self.on_disk.load(AtomicOrdering::Relaxed),
        }
    }

    /// Has the mover look after this table, once its holder asked for
    /// automatic work ([`Table::compact_on_its_own`]), and wakes it.
    pub(super) fn move_out_on_its_own(&self) {
        if MOVER.enlist(&self.moved, self.auto.me.get()) {
            MOVER.wake();
        }
    }
}

// ---- The mover: one thread for every tiered table (table/worker.rs).

/// The mover: when woken (or every [`TICK`]), moves each tiered table's
/// coldest records out until memory is under its budget, a step at a
/// time, resting between steps as long as the step held the lock,
/// starting the writeback of each step's writes and waiting for it every
/// [`WAIT_EVERY`] bytes.
static MOVER: Worker = Worker::new("heft-tier", TICK, |t| {
    let mut unwaited = 0;
    loop {
        let started = Instant::now();
        let Ok(step) = t.move_out() else { break };
        if let Some(w) = &step.written {
            unwaited += w.to - w.from;
            let wait = unwaited >= WAIT_EVERY || !step.more;
            if wait {
                unwaited = 0;
            }
            let _ = arena::start_writeback(w, wait);
        }
        if !step.more {
            break;
        }
        rest(started);
    }
});

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::PathBuf;
    use std::sync::Arc;

    use super::*;
    use crate::arena::Backing;
    use crate::codec::Value;
    use crate::compress::Compression;
    use crate::table::tests::all_bodies;
    use crate::table::{Kind, Options, Stats};

    const KINDS: [Kind; 4] = [Kind::Set, Kind::OrderedSet, Kind::Bag, Kind::DuplicateBag];

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("heft-tier-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn tiered(kind: Kind, dir: &std::path::Path, budget: u64) -> Table {
        Table::new(&Options {
            backing: Backing::Tiered(dir.to_path_buf(), budget),
            compression: Compression::None,
            label: "tier".into(),
            kind,
        })
        .unwrap()
    }

    use crate::table::tests::{int_key as key, noisy_body, same_as as same};

    /// A body of 200-1,200 incompressible bytes, its own for each
    /// `(i, version)`.
    fn body(i: u64, version: u32) -> Vec<u8> {
        noisy_body(i, version, 200, 1000)
    }

    fn put(t: &Table, i: u64, version: u32) {
        t.insert(&[t.prepare(&key(i), &body(i, version))]).unwrap();
    }

    fn tier(t: &Table) -> TierStats {
        t.stats().unwrap().tier.expect("a tiered table")
    }

    use crate::table::TierStats;

    /// Moves records out until memory is under the budget's lower mark.
    fn settle(t: &Table) -> usize {
        let mut moved = 0;
        loop {
            let m = t.move_out().unwrap();
            moved += m.records;
            if let Some(w) = &m.written {
                arena::start_writeback(w, true).unwrap();
            }
            if !m.more {
                return moved;
            }
        }
    }

    fn in_memory(t: &Table, i: u64) -> bool {
        let st = t.read().unwrap();
        let names = t.names();
        let k = key(i);
        st.in_memory(order(&names), t.hash(&k), &k)
    }

    #[test]
    fn memory_holds_its_budget_and_the_file_the_rest() {
        let d = dir("budget");
        for kind in KINDS {
            let budget = 256 << 10;
            let t = tiered(kind, &d, budget);
            let mut model = BTreeMap::new();
            for i in 0..3_000 {
                put(&t, i, 0);
                model.entry(i).or_insert_with(Vec::new).push(body(i, 0));
                // Writes never wait: past the budget and an eighth they go
                // to the file.
                assert!(
                    tier(&t).memory_live_bytes <= budget + budget / 8,
                    "{kind:?}"
                );
            }
            assert!(t.may_read_disk());
            let before = tier(&t);
            assert!(before.file_live_bytes > 0 && before.moved_records == 0);
            let moved = settle(&t);
            let after = tier(&t);
            assert!(moved > 0 && after.moved_records == moved as u64, "{kind:?}");
            assert!(
                after.memory_live_bytes <= budget - budget / EASE,
                "{after:?}"
            );
            let s: Stats = t.stats().unwrap();
            assert_eq!(
                s.arena_live_bytes,
                after.memory_live_bytes + after.file_live_bytes
            );
            same(&t, &model, 3_000);
            // Overwrites and deletes reach records in either tier.
            for i in (0..3_000).step_by(3) {
                put(&t, i, 1);
                if kind.is_bag() {
                    model.get_mut(&i).unwrap().push(body(i, 1));
                } else {
                    model.insert(i, vec![body(i, 1)]);
                }
            }
            for i in (1..3_000).step_by(3) {
                t.remove(t.hash(&key(i)), &key(i), None).unwrap();
                model.remove(&i);
            }
            settle(&t);
            same(&t, &model, 3_000);
            assert!(tier(&t).memory_live_bytes <= budget, "{kind:?}");
            // Emptied, the table reads nothing from disk.
            t.clear().unwrap();
            assert_eq!(tier(&t).file_live_bytes, 0);
            assert!(!t.may_read_disk());
            same(&t, &BTreeMap::new(), 3_000);
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn records_read_stay_in_memory_and_others_move_out_first() {
        let d = dir("sieve");
        let t = tiered(Kind::Set, &d, 1 << 20);
        // About 1.5 MiB: memory takes the first 1.125 MiB of it.
        for i in 0..2_000 {
            put(&t, i, 0);
        }
        // The oldest keys are read; the next ones are not.
        for _ in 0..3 {
            for i in 0..300 {
                assert_eq!(all_bodies(&t, &key(i)), vec![body(i, 0)]);
            }
        }
        assert!((0..300).all(|i| in_memory(&t, i)));
        settle(&t);
        assert!((0..300).all(|i| in_memory(&t, i)), "read keys stayed");
        assert!(!in_memory(&t, 300), "the oldest unread key moved out");
        // Lookups count the records they found in the file.
        let before = tier(&t);
        let in_file: Vec<u64> = (0..2_000).filter(|&i| !in_memory(&t, i)).collect();
        for i in 0..2_000 {
            all_bodies(&t, &key(i));
        }
        let after = tier(&t);
        assert_eq!(after.file_reads - before.file_reads, in_file.len() as u64);
        let bytes: u64 = in_file
            .iter()
            .map(|&i| {
                crate::arena::class_size(crate::arena::class_of(
                    t.prepare(&key(i), &body(i, 0)).bytes.len(),
                )) as u64
            })
            .sum();
        assert_eq!(after.file_read_bytes - before.file_read_bytes, bytes);
        // A key rewritten comes back to memory and is queued again.
        let cold = (300..2_000).find(|&i| !in_memory(&t, i)).unwrap();
        put(&t, cold, 1);
        assert!(in_memory(&t, cold));
        assert_eq!(all_bodies(&t, &key(cold)), vec![body(cold, 1)]);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn compaction_moves_memory_and_leaves_the_file_alone() {
        let d = dir("compact");
        for kind in KINDS {
            let t = tiered(kind, &d, 512 << 10);
            let mut model = BTreeMap::new();
            for i in 0..4_000 {
                put(&t, i, 0);
                model.insert(i, vec![body(i, 0)]);
            }
            settle(&t);
            for i in (0..4_000).filter(|i| i % 3 != 0) {
                t.remove(t.hash(&key(i)), &key(i), None).unwrap();
                model.remove(&i);
            }
            let file = tier(&t).file_live_bytes;
            let done = t.compact(0, || true).unwrap();
            assert!(done.moved_records > 0, "{kind:?} {done:?}");
            assert_eq!(tier(&t).file_live_bytes, file);
            same(&t, &model, 4_000);
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn keys_are_refused_once_the_index_takes_the_budget_and_nothing_changes() {
        let d = dir("pinned");
        for kind in KINDS {
            // 64 KiB: the index passes it after some thousands of keys.
            let t = tiered(kind, &d, 64 << 10);
            let small = |i: u64| t.prepare(&key(i), &Value::Int(i as i64).to_bytes());
            let mut n = 0;
            let refused = loop {
                match t.insert(&[small(n)]) {
                    Ok(()) => n += 1,
                    Err(e) => break e,
                }
                assert!(n < 1_000_000, "{kind:?}: never refused");
            };
            assert!(
                matches!(refused, Error::MemoryBudget),
                "{kind:?} {refused:?}"
            );
            assert_eq!(
                t.len().unwrap(),
                n as usize,
                "{kind:?}: the refused key is not in"
            );
            assert!(all_bodies(&t, &key(n)).is_empty());
            // Keys already there can still be written (in a bag, a new
            // object is a new entry: refused), and deleted.
            let new_body = Value::Int(-1).to_bytes();
            let rewrite = t.insert(&[t.prepare(&key(0), &new_body)]);
            if kind.is_bag() {
                assert!(matches!(rewrite, Err(Error::MemoryBudget)), "{kind:?}");
                // An object a bag holds already adds nothing.
                if kind == Kind::Bag {
                    t.insert(&[small(0)]).unwrap();
                }
            } else {
                assert!(rewrite.is_ok(), "{kind:?} {rewrite:?}");
                assert_eq!(all_bodies(&t, &key(0)), vec![new_body], "{kind:?}");
            }
            for i in 0..n / 2 {
                t.remove(t.hash(&key(i)), &key(i), None).unwrap();
            }
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn records_grown_in_place_wake_the_mover_too() {
        let d = dir("grown");
        let t = Arc::new(tiered(Kind::Set, &d, 256 << 10));
        t.compact_on_its_own();
        // 500 keys of a few bytes: well within the budget.
        let small = |i: u64| t.prepare(&key(i), &Value::Int(i as i64).to_bytes());
        for i in 0..500 {
            t.insert(&[small(i)]).unwrap();
        }
        assert_eq!(tier(&t).moved_records, 0);
        // The same keys grown to 200-1,200 bytes: about 350 KB, no new
        // key (past the budget and an eighth, the file takes them).
        for i in 0..500 {
            put(&t, i, 0);
        }
        let until = Instant::now() + Duration::from_secs(20);
        while tier(&t).memory_live_bytes > 256 << 10 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        let s = tier(&t);
        assert!(
            s.memory_live_bytes <= 256 << 10 && s.moved_records > 0,
            "{s:?}"
        );
        drop(t);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn the_mover_brings_memory_under_its_budget_on_its_own() {
        let d = dir("mover");
        let t = Arc::new(tiered(Kind::Set, &d, 256 << 10));
        t.compact_on_its_own();
        for i in 0..3_000 {
            put(&t, i, 0);
        }
        let until = Instant::now() + Duration::from_secs(20);
        while tier(&t).memory_live_bytes > (256 << 10) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        let s = tier(&t);
        assert!(
            s.memory_live_bytes <= 256 << 10 && s.moved_records > 0,
            "{s:?}"
        );
        for i in 0..3_000 {
            assert_eq!(all_bodies(&t, &key(i)), vec![body(i, 0)]);
        }
        drop(t);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
