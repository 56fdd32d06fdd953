//! Compaction of a table's arena (the steps are in arena/compact.rs): run
//! by the job that re-compressed the table, off the schedulers, holding
//! the write lock for a batch of records at a time while readers and
//! writers go on.

use std::time::{Duration, Instant};

use super::learn::{CHUNK, CHUNK_RAW};
use super::*;
use crate::arena::{self, Ticket};

/// Records moved under one write lock.
const MOVE_BATCH: usize = 64;

/// Free-list entries looked at under one write lock.
const PURGE_BUDGET: usize = 64 * 1024;

/// A compaction runs only if it gives back at least this much (and an
/// eighth of the arena, see [`Arena::begin_compaction`]).
pub const MIN_GAIN: u64 = 1 << 20;

impl Table {
    /// Moves the records stored above what the live ones need down into
    /// the holes below, merges the free blocks left and lowers the top of
    /// the arena, giving its pages back; returns the bytes the top came
    /// down by (0 if it would gain less than `min_gain` bytes or an eighth
    /// of the arena). Stops early, putting every block back as it was,
    /// when `go_on` turns false. Paced like the re-compression walk.
    pub fn compact(&self, min_gain: u64, go_on: impl Fn() -> bool) -> Result<u64, Error> {
        let Some(t) = self.write()?.arena.begin_compaction(min_gain) else {
            return Ok(0);
        };
        let moved = self.purge(&t).and_then(|()| self.move_down(&t, &go_on));
        // Asked before the lock is taken: `go_on` may look at the table.
        let stop = moved.is_err() || !go_on();
        let mut st = self.write()?;
        if stop {
            st.arena.abort_compaction(&t, Vec::new());
            return moved.map(|()| 0);
        }
        let doomed = st.arena.take_doomed(&t);
        drop(st);
        // Sorting may take a few milliseconds: the blocks are the job's
        // meanwhile, off the free lists.
        let mut runs = arena::runs(doomed);
        let mut lowered = 0;
        while !self
            .write()?
            .arena
            .finish_compaction(&t, &mut runs, &mut lowered)
        {}
        Ok(lowered)
    }

    /// Step 1: the free blocks above the ceiling leave the free lists.
    fn purge(&self, t: &Ticket) -> Result<(), Error> {
        let mut class = Some(0);
        while let Some(from) = class {
            class = self.write()?.arena.purge_free(t, from, PURGE_BUDGET);
        }
        Ok(())
    }

    /// Step 2: every record above the ceiling moves below it (where there
    /// is room), in walk order.
    fn move_down(&self, t: &Ticket, go_on: &impl Fn() -> bool) -> Result<(), Error> {
        let (mut buf, mut after) = (RecordBuf::new(), None);
        loop {
            let started = Instant::now();
            buf.clear();
            let next = self.chunk(after.as_ref(), CHUNK, CHUNK_RAW, &mut buf)?;
            // Asked between copying records out and moving them: writers
            // may have changed them meanwhile too.
            if !go_on() {
                return Ok(());
            }
            let above: Vec<usize> = (0..buf.len())
                .filter(|&i| {
                    let loc = buf.items()[i].loc;
                    arena::offset(loc) + arena::block_size(loc) as u64 > t.ceiling
                })
                .collect();
            for part in above.chunks(MOVE_BATCH) {
                let mut st = self.write()?;
                let names = self.names();
                let ord = order(&names);
                for &i in part {
                    let it = &buf.items()[i];
                    // The record may have been overwritten or deleted since
                    // it was copied out: only the block the index still
                    // points at is moved.
                    let Some((first, n)) = st.find(ord, it.hash, buf.key(it)) else {
                        continue;
                    };
                    let Some(pos) = (0..n)
                        .map(|j| Entries::nth(first, j))
                        .find(|&p| st.entries.loc(p) == it.loc)
                    else {
                        continue;
                    };
                    if let Some(new) = st.arena.relocate(t, it.loc) {
                        st.entries.set_loc(pos, new);
                    }
                }
            }
            match next {
                Some(c) => after = Some(c),
                None => return Ok(()),
            }
            // Paced: at most half of one core.
            std::thread::sleep(started.elapsed().max(Duration::from_micros(50)));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::{Cell, RefCell};
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use super::*;
    use crate::codec::Value;
    use crate::table::tests::all_bodies;
    use crate::testutil::{noise, Rng};

    fn table(kind: Kind) -> Arc<Table> {
        Arc::new(
            Table::new(&Options {
                backing: Backing::Memory,
                compression: Compression::None,
                label: "compact".into(),
                kind,
            })
            .unwrap(),
        )
    }

    fn key(i: u64) -> Vec<u8> {
        Value::Int(i as i64).to_bytes()
    }

    /// A body of 20-1500 bytes, its own for each `(i, version)`.
    fn body(i: u64, version: u32) -> Vec<u8> {
        let len = 20 + (i as usize * 7919 + version as usize * 31) % 1480;
        let bytes = noise((i as u32).wrapping_mul(2_654_435_761) ^ version, len);
        Value::Tuple(vec![Value::Int(i as i64), Value::Binary(bytes)]).to_bytes()
    }

    fn put(t: &Table, i: u64, version: u32) {
        t.insert(&[t.prepare(&key(i), &body(i, version))]).unwrap();
    }

    /// What the table holds, key by key, against `model`.
    fn same(t: &Table, model: &BTreeMap<u64, Vec<Vec<u8>>>, n: u64) {
        for i in 0..n {
            let want = model.get(&i).cloned().unwrap_or_default();
            assert_eq!(all_bodies(t, &key(i)), want, "key {i}");
        }
        let records: usize = model.values().map(Vec::len).sum();
        assert_eq!(t.len().unwrap(), records);
    }

    #[test]
    fn a_table_that_shrank_gives_its_arena_back_and_keeps_every_record() {
        for kind in [Kind::Set, Kind::OrderedSet, Kind::Bag, Kind::DuplicateBag] {
            let t = table(kind);
            let mut model = BTreeMap::new();
            for i in 0..12_000 {
                put(&t, i, 0);
                model.insert(i, vec![body(i, 0)]);
            }
            for i in (0..12_000).filter(|i| i % 4 != 0) {
                t.remove(t.hash(&key(i)), &key(i), None).unwrap();
                model.remove(&i);
            }
            let before = t.stats().unwrap();
            let lowered = t.compact(0, || true).unwrap();
            let after = t.stats().unwrap();
            assert_eq!(before.arena_used_bytes - after.arena_used_bytes, lowered);
            assert!(
                after.arena_used_bytes < before.arena_used_bytes / 3,
                "{kind:?}: {before:?} -> {after:?}"
            );
            assert_eq!(after.arena_live_bytes, before.arena_live_bytes);
            same(&t, &model, 12_000);
            // Nothing left to gain.
            assert_eq!(t.compact(0, || true).unwrap(), 0);
        }
    }

    #[test]
    fn writers_go_on_while_a_table_compacts() {
        for kind in [Kind::Set, Kind::OrderedSet, Kind::Bag, Kind::DuplicateBag] {
            let t = table(kind);
            let model: RefCell<BTreeMap<u64, Vec<Vec<u8>>>> = RefCell::default();
            let n = 8_000;
            for i in 0..n {
                put(&t, i, 0);
                model.borrow_mut().insert(i, vec![body(i, 0)]);
            }
            for i in (0..n).filter(|i| i % 5 != 0) {
                t.remove(t.hash(&key(i)), &key(i), None).unwrap();
                model.borrow_mut().remove(&i);
            }
            // Between every step: overwrites, deletes and new keys, most of
            // them of records the compaction has just copied out (in a bag
            // a put of a new body adds a record).
            let (rng, version) = (RefCell::new(Rng(0x5eed)), Cell::new(1));
            let write = || {
                let mut rng = rng.borrow_mut();
                for _ in 0..40 {
                    let i = rng.below(n + 1000);
                    let mut model = model.borrow_mut();
                    if rng.below(3) == 0 {
                        t.remove(t.hash(&key(i)), &key(i), None).unwrap();
                        model.remove(&i);
                        continue;
                    }
                    let v = version.replace(version.get() + 1);
                    put(&t, i, v);
                    let bodies = model.entry(i).or_default();
                    if !kind.is_bag() {
                        bodies.clear();
                    }
                    bodies.push(body(i, v));
                }
                true
            };
            // How far the top comes down depends on how much the writers
            // place above the ceiling; what they wrote is all there.
            t.compact(0, write).unwrap();
            // `go_on` is asked once a chunk of the walk and once at the
            // end: the writers ran between at least four steps.
            assert!(version.get() > 4 * 30, "{kind:?}: {}", version.get());
            same(&t, &model.borrow(), n + 1000);
        }
    }

    #[test]
    fn a_compaction_told_to_stop_changes_nothing_seen() {
        let t = table(Kind::Set);
        let mut model = BTreeMap::new();
        for i in 0..6_000 {
            put(&t, i, 0);
            model.insert(i, vec![body(i, 0)]);
        }
        for i in (0..6_000).filter(|i| i % 3 != 0) {
            t.remove(t.hash(&key(i)), &key(i), None).unwrap();
            model.remove(&i);
        }
        let before = t.stats().unwrap();
        let calls = std::sync::atomic::AtomicUsize::new(0);
        let go_on = || calls.fetch_add(1, AtomicOrdering::Relaxed) < 3;
        assert_eq!(t.compact(0, go_on).unwrap(), 0);
        let after = t.stats().unwrap();
        assert_eq!(after.arena_used_bytes, before.arena_used_bytes);
        same(&t, &model, 6_000);
        assert!(t.compact(0, || true).unwrap() > 0, "none is running");
        same(&t, &model, 6_000);
    }
}
