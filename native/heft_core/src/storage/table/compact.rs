//! Compaction of a table's arena (the steps are in arena/compact.rs) and
//! the compactor that runs it on its own.
//!
//! A compaction packs the live records together from the start of the
//! arena, in address order (the slide of arena/compact.rs), holding the
//! table's write lock for a batch at a time (at most [`SLIDE_STEPS`]
//! blocks and [`MOVE_BYTES`] bytes moved) while readers and writers go on.
//! It runs:
//!
//! - after a dictionary re-compression, on that job's thread (learn.rs);
//! - on its own, once a table whose holder called [`Table::compact_on_its_own`]
//!   has at least [`AUTO_MIN_FREE`] bytes of free blocks still in memory
//!   and they are a fifth or more of its arena's used bytes: the write
//!   that finds so ([`Table::compaction_due`]) queues the table for the
//!   compactor, one thread shared by every table, paced to half a core (at
//!   the normal priority: at a lower one, a busy host would stretch the
//!   lock holds readers and writers wait for). A table compacts again, at
//!   the back of the queue and after a pause, while that holds and its
//!   last run gained something; after a run that gained nothing, it waits
//!   until another [`AUTO_MIN_FREE`] bytes are freed;
//! - on demand ([`compact_now`]), on the compactor's thread, for any gain,
//!   paced like the others: unpaced, it took a whole core from the two
//!   schedulers of a 2-core host (bench/mixed.exs: readers' p99.9
//!   1,108 µs unpaced, 140 µs paced).

use std::cell::Cell;
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{OnceLock, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::*;
use crate::arena::{self, Next, Ticket};

/// Blocks (live or free) looked at under one write lock.
const SLIDE_STEPS: usize = 128;

/// Bytes of records moved under one write lock.
const MOVE_BYTES: usize = 64 * 1024;

/// Ordered-index blocks packed under one write lock (4 KiB each).
const PACK_BLOCKS: usize = 32;

/// Free-list entries looked at under one write lock.
const PURGE_BUDGET: usize = 16 * 1024;

/// A compaction after a re-compression runs only if it gives back at
/// least this much (and an eighth of the arena, see
/// [`Arena::begin_compaction`]); so does an automatic one.
pub const MIN_GAIN: u64 = 1 << 20;

/// Free bytes still in memory from which a table compacts on its own
/// (when they are also a fifth of its arena's used bytes).
pub const AUTO_MIN_FREE: u64 = 1 << 20;

/// When a compaction is worth running ([`Arena::begin_compaction`]), and
/// whether it paces itself.
#[derive(Clone, Copy)]
struct How {
    min_gain: u64,
    share: u64,
    paced: bool,
}

/// What a compaction did so far.
#[derive(Default)]
struct Moving {
    done: Compacted,
    /// The longest it held the table's write lock, µs.
    longest: Cell<u64>,
    /// The bytes the used bytes came down by (negative where the slide
    /// passed over free blocks whose pages had been given back).
    returned: i64,
}

/// A table bounded in bytes compacts on its own once its free blocks
/// still in memory pass this fraction of its budget (and 64 KiB).
pub(super) const BOUNDED_SHARE: u64 = 64;

/// The least free bytes a bounded table compacts for.
pub(super) const BOUNDED_MIN_FREE: u64 = 64 << 10;

/// The least pause between two automatic runs of one table.
const AUTO_PAUSE: Duration = Duration::from_millis(100);

/// What a compaction did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Compacted {
    /// Records moved, and their blocks' bytes.
    pub moved_records: u64,
    pub moved_bytes: u64,
    /// Bytes the table's memory came down by: the arena's used bytes
    /// (pages given back to the kernel, or a file arena's file cut short)
    /// and an ordered index's pages.
    pub returned_bytes: u64,
    /// The longest the compaction held the table's write lock at once,
    /// µs: what a reader or writer may have waited for it.
    pub longest_lock_hold_us: u64,
}

impl Compacted {
    fn add(&mut self, other: &Compacted) {
        self.moved_records += other.moved_records;
        self.moved_bytes += other.moved_bytes;
        self.returned_bytes += other.returned_bytes;
        self.longest_lock_hold_us = self.longest_lock_hold_us.max(other.longest_lock_hold_us);
    }
}

/// The table's write lock, held by a compaction: how long goes into
/// `longest` when it is let go.
struct Held<'a> {
    st: MappedRwLockWriteGuard<'a, State>,
    since: Instant,
    longest: &'a Cell<u64>,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let us = self.since.elapsed().as_micros() as u64;
        self.longest.set(self.longest.get().max(us));
    }
}

impl std::ops::Deref for Held<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        &self.st
    }
}

impl std::ops::DerefMut for Held<'_> {
    fn deref_mut(&mut self) -> &mut State {
        &mut self.st
    }
}

/// A table's compactions so far (every kind), for info/1.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Compactions {
    /// Whether a compaction runs, or the compactor has the table queued.
    pub running: bool,
    /// Compactions that ran (those that found nothing worth moving too).
    pub runs: u64,
    /// Their sums.
    pub total: Compacted,
}

/// A table's part in automatic compaction.
#[derive(Default)]
pub(crate) struct Auto {
    /// Set by [`Table::compact_on_its_own`]: the compactor holds no table
    /// alive.
    pub(super) me: OnceLock<Weak<Table>>,
    /// Queued for the compactor, or running there.
    queued: AtomicBool,
    /// Free bytes a write must leave before the next automatic run: raised
    /// past what a run that gained nothing left.
    floor: AtomicU64,
    /// A table bounded in bytes: the free bytes from which it compacts on
    /// its own, whatever their share of the arena ([`BOUNDED_SHARE`] of
    /// its budget); 0 for other tables.
    pub(super) bounded: AtomicU64,
    stats: Mutex<Compactions>,
    /// Tests: an on-demand compaction panics between its steps when this
    /// counts down to zero (0: never), as a bug in a step would.
    #[cfg(test)]
    panic_in: std::sync::atomic::AtomicUsize,
}

/// Called once a compaction the caller asked for ended.
pub type Done = Box<dyn FnOnce(Result<Compacted, Error>) + Send>;

struct Job {
    table: Weak<Table>,
    /// On demand: who waits for it.
    done: Option<Done>,
    /// An automatic job queued again runs after a pause.
    not_before: Instant,
}

/// The compactor's queue and the condition its thread waits on.
struct Queue {
    jobs: Mutex<VecDeque<Job>>,
    ready: Condvar,
}

static QUEUE: OnceLock<Queue> = OnceLock::new();

/// Queues `job`, starting the compactor's thread on first use. False if
/// the thread could not be started.
fn enqueue(job: Job) -> bool {
    let mut started = true;
    let q = QUEUE.get_or_init(|| {
        started = std::thread::Builder::new()
            .name("heft-compact".into())
            .spawn(work)
            .is_ok();
        Queue {
            jobs: Mutex::new(VecDeque::new()),
            ready: Condvar::new(),
        }
    });
    if !started {
        return false;
    }
    q.jobs.lock().push_back(job);
    q.ready.notify_one();
    true
}

/// The compactor's thread: runs the queued jobs one at a time.
fn work() {
    let q = QUEUE.get_or_init(|| unreachable!("queued before the thread starts"));
    loop {
        let job = {
            let mut jobs = q.jobs.lock();
            loop {
                match jobs.pop_front() {
                    Some(job) => break job,
                    None => q.ready.wait(&mut jobs),
                }
            }
        };
        let wait = job.not_before.saturating_duration_since(Instant::now());
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
        match (job.table.upgrade(), job.done) {
            (Some(table), Some(done)) => {
                let r = catch_unwind(AssertUnwindSafe(|| table.compact_now_here()));
                done(r.unwrap_or_else(|_| Err(table.after_panic())));
            }
            (None, Some(done)) => done(Err(Error::Deleted)),
            (Some(table), None) => {
                if catch_unwind(AssertUnwindSafe(|| table.compact_automatically())).is_err() {
                    let _ = table.after_panic();
                    table.auto.queued.store(false, AtomicOrdering::Release);
                }
            }
            (None, None) => {}
        }
    }
}

/// Queues an automatic run of `table`, not before `not_before`. False if
/// the compactor's thread could not be started.
fn queue_automatic(table: &Weak<Table>, not_before: Instant) -> bool {
    enqueue(Job {
        table: table.clone(),
        done: None,
        not_before,
    })
}

/// Compacts `table` on the compactor's thread, paced, for any gain, and
/// calls `done` with what it did. False (and `done` is not called) if the
/// thread could not be started.
pub fn compact_now(table: &Arc<Table>, done: Done) -> bool {
    enqueue(Job {
        table: Arc::downgrade(table),
        done: Some(done),
        not_before: Instant::now(),
    })
}

impl Table {
    /// The write lock, timed into `longest`.
    fn held<'a>(&'a self, longest: &'a Cell<u64>) -> Result<Held<'a>, Error> {
        let st = self.write()?;
        Ok(Held {
            st,
            since: Instant::now(),
            longest,
        })
    }

    /// Lets the table compact on its own (see the module doc). Its holder
    /// calls this once, on the `Arc` every user shares.
    pub fn compact_on_its_own(self: &Arc<Self>) {
        let _ = self.auto.me.set(Arc::downgrade(self));
    }

    /// Whether the last write left enough free bytes for an automatic
    /// compaction, which this queues (once; other writes then answer
    /// false). Cheap: never waits for the table's lock.
    pub fn compaction_due(&self) -> bool {
        let Some(me) = self.auto.me.get() else {
            return false;
        };
        if self.auto.queued.load(AtomicOrdering::Relaxed) || !self.worth_compacting() {
            return false;
        }
        if self
            .auto
            .queued
            .compare_exchange(false, true, AtomicOrdering::AcqRel, AtomicOrdering::Relaxed)
            .is_err()
        {
            return false;
        }
        let queued = queue_automatic(me, Instant::now());
        if !queued {
            self.auto.queued.store(false, AtomicOrdering::Release);
        }
        queued
    }

    /// Free bytes still in memory of at least [`AUTO_MIN_FREE`], the floor
    /// and a fifth of the used bytes. Skipped (false) while a writer holds
    /// the lock.
    fn worth_compacting(&self) -> bool {
        let Some(st) = self.state.try_read() else {
            return false;
        };
        let Some(st) = st.as_ref() else {
            return false;
        };
        let held = st.arena.held_free_bytes();
        let floor = self.auto.floor.load(AtomicOrdering::Relaxed);
        match self.auto.bounded.load(AtomicOrdering::Relaxed) {
            0 => held >= AUTO_MIN_FREE.max(floor) && held * 5 >= st.arena.used_bytes(),
            bounded => held >= bounded.max(floor),
        }
    }

    /// One automatic run of this table (see the module doc): afterwards
    /// the table goes to the back of the queue if it gained something and
    /// is still worth a run, else it leaves the queue.
    fn compact_automatically(&self) {
        let how = match self.auto.bounded.load(AtomicOrdering::Relaxed) {
            0 => How {
                min_gain: MIN_GAIN,
                share: 8,
                paced: true,
            },
            bounded => How {
                min_gain: bounded,
                share: 0,
                paced: true,
            },
        };
        let done = self.compact_counted(how, &|| true);
        let gained = matches!(done, Ok(c) if c.moved_records > 0 || c.returned_bytes > 0);
        if gained {
            self.auto.floor.store(0, AtomicOrdering::Relaxed);
            if self.worth_compacting() {
                if let Some(me) = self.auto.me.get() {
                    if queue_automatic(me, Instant::now() + AUTO_PAUSE) {
                        return;
                    }
                }
            }
        } else if let Ok(st) = self.read() {
            // Nothing gained: wait for more to be freed.
            let floor = st.arena.held_free_bytes().saturating_add(AUTO_MIN_FREE);
            self.auto.floor.store(floor, AtomicOrdering::Relaxed);
        }
        self.auto.queued.store(false, AtomicOrdering::Release);
        // A write that found the table queued meanwhile started nothing.
        let _ = self.compaction_due();
    }

    /// After a compaction panicked (a bug): the one running ends, so that
    /// frees are not held back for it, and the table's counts stay right
    /// (holes the job had gathered and not handed back are lost to reuse
    /// until the table is cleared). The error to report.
    fn after_panic(&self) -> Error {
        if let Ok(mut st) = self.write() {
            st.arena.abort_running();
        }
        self.auto.stats.lock().running = false;
        Error::Io(io::Error::other("the compaction failed"))
    }

    /// An on-demand compaction: for any gain, paced (the module doc).
    fn compact_now_here(&self) -> Result<Compacted, Error> {
        let how = How {
            min_gain: 0,
            share: 0,
            paced: true,
        };
        let go_on = || {
            #[cfg(test)]
            if self.auto.panic_in.fetch_update(
                AtomicOrdering::AcqRel,
                AtomicOrdering::Acquire,
                |n| n.checked_sub(1),
            ) == Ok(1)
            {
                panic!("a compaction step failed (a test's)");
            }
            true
        };
        self.compact_counted(how, &go_on)
    }

    /// A compaction, counted in [`Table::compactions`].
    fn compact_counted(&self, how: How, go_on: &dyn Fn() -> bool) -> Result<Compacted, Error> {
        self.auto.stats.lock().running = true;
        let done = self.compact_with(how, go_on);
        let mut stats = self.auto.stats.lock();
        stats.running = false;
        if let Ok(c) = &done {
            stats.runs += 1;
            stats.total.add(c);
        }
        done
    }

    /// The table's compactions so far.
    pub fn compactions(&self) -> Compactions {
        let mut c = *self.auto.stats.lock();
        c.running |= self.auto.queued.load(AtomicOrdering::Acquire);
        c
    }

    /// Packs the live records together from the start of the arena and
    /// lowers its top, giving the pages past it back; does nothing if the
    /// free blocks are less than `min_gain` bytes or an eighth of the
    /// arena. Stops early, the free space left where it is, when `go_on`
    /// turns false (the records moved stay moved). Paced like the
    /// re-compression walk. Counted in [`Table::compactions`].
    pub fn compact(&self, min_gain: u64, go_on: impl Fn() -> bool) -> Result<Compacted, Error> {
        let how = How {
            min_gain,
            share: 8,
            paced: true,
        };
        self.compact_counted(how, &go_on)
    }

    fn compact_with(&self, how: How, go_on: &dyn Fn() -> bool) -> Result<Compacted, Error> {
        let mut m = Moving::default();
        let Some(t) = self
            .held(&m.longest)?
            .arena
            .begin_compaction(how.min_gain, how.share)
        else {
            return Ok(Compacted::default());
        };
        let slid = self.slide(&t, how.paced, go_on, &mut m);
        // Asked before the lock is taken: `go_on` may look at the table.
        if slid.is_err() || !go_on() {
            if let Ok(mut st) = self.held(&m.longest) {
                st.arena.abort_compaction(&t);
            }
            return slid.map(|()| Compacted::default());
        }
        loop {
            let mut st = self.held(&m.longest)?;
            let before = st.arena.used_bytes() as i64;
            let finished = st.arena.finish_compaction(&t);
            m.returned += before - st.arena.used_bytes() as i64;
            if finished {
                break;
            }
        }
        // An ordered index keeps the blocks deletions thinned: packed,
        // their pages go back too.
        let mut from = Some(0);
        while let Some(b) = from {
            let mut st = self.held(&m.longest)?;
            let before = st.entries.heap_bytes() as i64;
            from = st.entries.pack(b, PACK_BLOCKS);
            m.returned += before - st.entries.heap_bytes() as i64;
        }
        m.done.returned_bytes = m.returned.max(0) as u64;
        m.done.longest_lock_hold_us = m.longest.get();
        Ok(m.done)
    }

    /// Steps 1 and 2: the free blocks leave the free lists, then every live
    /// block slides down, a batch under each write lock, counted in `m`.
    /// Returns early when `go_on` turns false.
    fn slide(
        &self,
        t: &Ticket,
        paced: bool,
        go_on: &dyn Fn() -> bool,
        m: &mut Moving,
    ) -> Result<(), Error> {
        // The holes gather here, without the lock: a vector of a million
        // grows by copying milliseconds' worth.
        let (mut holes, mut class) = (Vec::new(), Some(0));
        while let Some(from) = class {
            let (mut gone, next) = self
                .held(&m.longest)?
                .arena
                .purge_free(t, from, PURGE_BUDGET);
            holes.append(&mut gone);
            class = next;
        }
        // Sorting a million holes takes some milliseconds: without the lock.
        holes.sort_unstable_by_key(|&e| arena::offset(e));
        self.held(&m.longest)?.arena.start_slide(t, holes);
        loop {
            let started = Instant::now();
            if !go_on() {
                return Ok(());
            }
            self.read()?.arena.prefault_slide(t, MOVE_BYTES as u64);
            let mut st = self.held(&m.longest)?;
            let names = self.names();
            let ord = order(&names);
            let used = st.arena.used_bytes() as i64;
            let (mut steps, mut bytes, mut end) = (0, 0, false);
            while steps < SLIDE_STEPS && bytes < MOVE_BYTES {
                steps += 1;
                let at = match st.arena.next_block(t) {
                    Next::End => {
                        end = true;
                        break;
                    }
                    Next::Hole => continue,
                    Next::Live(at) => at,
                };
                let Some((pos, loc)) = st.indexed_at(ord, at) else {
                    return Err(Error::Io(io::Error::other(
                        "compaction met a block no index entry points at",
                    )));
                };
                let new = st.arena.slide(t, loc).expect("the block at the scan");
                st.entries.set_loc(pos, new);
                let size = arena::block_size(loc);
                bytes += size;
                if new != loc {
                    m.done.moved_records += 1;
                    m.done.moved_bytes += size as u64;
                }
            }
            m.returned += used - st.arena.used_bytes() as i64;
            drop(st);
            if end {
                return Ok(());
            }
            // Paced: at most half of one core.
            if paced {
                std::thread::sleep(started.elapsed().max(Duration::from_micros(50)));
            }
        }
    }
}

impl State {
    /// The index entry of the live block at offset `at`, and its handle:
    /// the record there names its key.
    fn indexed_at(&self, ord: Order, at: u64) -> Option<(Pos, u64)> {
        let (h, bytes) = whole_record(&self.arena, at)?;
        let key = &bytes[h.key_start()..h.body_start()];
        let (first, n) = self.find(ord, self.entries.hash_of(key), key)?;
        (0..n)
            .map(|j| Entries::nth(first, j))
            .map(|p| (p, self.entries.loc(p)))
            .find(|&(_, loc)| !arena::in_file(loc) && arena::offset(loc) == at)
    }
}

#[cfg(test)]
mod tests {
    use std::cell::{Cell, RefCell};
    use std::collections::BTreeMap;

    use super::*;
    use crate::testutil::Rng;

    fn table(kind: Kind) -> Arc<Table> {
        table_on(kind, Backing::Memory)
    }

    fn table_on(kind: Kind, backing: Backing) -> Arc<Table> {
        Arc::new(
            Table::new(&Options {
                backing,
                compression: Compression::None,
                label: "compact".into(),
                kind,
            })
            .unwrap(),
        )
    }

    /// `n` records, then all but every `keep`-th deleted.
    fn churned(t: &Table, n: u64, keep: u64) -> BTreeMap<u64, Vec<Vec<u8>>> {
        let mut model = BTreeMap::new();
        for i in 0..n {
            put(t, i, 0);
            if i % keep == 0 {
                model.insert(i, vec![body(i, 0)]);
            }
        }
        for i in (0..n).filter(|i| i % keep != 0) {
            t.remove(t.hash(&key(i)), &key(i), None).unwrap();
        }
        model
    }

    /// Waits (up to 20 s) until `t`'s compactor has run and is idle.
    fn settled(t: &Table) -> Compactions {
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            let c = t.compactions();
            if (c.runs > 0 && !c.running) || Instant::now() > until {
                return c;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    use crate::table::tests::{int_key as key, noisy_body, same_as as same};

    /// A body of 20-1500 bytes, its own for each `(i, version)`.
    fn body(i: u64, version: u32) -> Vec<u8> {
        noisy_body(i, version, 20, 1480)
    }

    fn put(t: &Table, i: u64, version: u32) {
        t.insert(&[t.prepare(&key(i), &body(i, version))]).unwrap();
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
            let done = t.compact(0, || true).unwrap();
            let after = t.stats().unwrap();
            let held = |s: &Stats| s.arena_used_bytes + s.index_bytes;
            assert_eq!(done.returned_bytes, held(&before) - held(&after));
            assert!(done.moved_records > 0 && done.moved_bytes > 0, "{done:?}");
            assert!(
                after.arena_used_bytes < before.arena_used_bytes / 3,
                "{kind:?}: {before:?} -> {after:?}"
            );
            assert_eq!(after.arena_live_bytes, before.arena_live_bytes);
            same(&t, &model, 12_000);
            // Nothing left to gain.
            assert_eq!(t.compact(0, || true).unwrap(), Compacted::default());
            let c = t.compactions();
            assert_eq!((c.runs, c.total), (2, done), "{kind:?}");
        }
    }

    #[test]
    fn a_table_that_churned_compacts_on_its_own() {
        let t = table(Kind::Set);
        // Only a table whose holder asked for it.
        let model = churned(&t, 12_000, 4);
        assert!(!t.compaction_due());
        t.compact_on_its_own();
        let before = t.stats().unwrap();
        assert!(t.compaction_due(), "{before:?}");
        assert!(!t.compaction_due(), "queued once");
        let c = settled(&t);
        let after = t.stats().unwrap();
        assert!(c.runs >= 1 && c.total.moved_records > 0, "{c:?}");
        assert!(
            after.arena_used_bytes < before.arena_used_bytes / 3,
            "{before:?} -> {after:?}"
        );
        assert_eq!(
            c.total.returned_bytes,
            before.arena_used_bytes + before.index_bytes
                - after.arena_used_bytes
                - after.index_bytes
        );
        same(&t, &model, 12_000);
        // Nothing left worth a run.
        assert!(!t.compaction_due());
    }

    #[test]
    fn a_table_with_little_free_does_not_compact_on_its_own() {
        let t = table(Kind::Set);
        t.compact_on_its_own();
        // About 600 KB freed of 1.2 MB: under AUTO_MIN_FREE.
        let model = churned(&t, 1_500, 2);
        assert!(!t.compaction_due(), "{:?}", t.stats().unwrap());
        same(&t, &model, 1_500);
        assert_eq!(t.compactions(), Compactions::default());
    }

    #[test]
    fn a_compaction_on_demand_reports_what_it_did() {
        let t = table(Kind::OrderedSet);
        // A fifth freed: less than an automatic run waits for.
        let model = churned(&t, 10_000, 5);
        let before = t.stats().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        assert!(compact_now(&t, Box::new(move |r| tx.send(r).unwrap())));
        let done = rx.recv_timeout(Duration::from_secs(20)).unwrap().unwrap();
        let after = t.stats().unwrap();
        assert!(done.moved_records > 0, "{done:?}");
        assert_eq!(
            done.returned_bytes,
            before.arena_used_bytes + before.index_bytes
                - after.arena_used_bytes
                - after.index_bytes
        );
        assert!(after.index_bytes < before.index_bytes, "the index packed");
        same(&t, &model, 10_000);
        assert_eq!(t.compactions().total, done);
        // A deleted table answers so.
        let gone = table(Kind::Set);
        let (tx, rx) = std::sync::mpsc::channel();
        let weak = Arc::downgrade(&gone);
        drop(gone);
        assert!(weak.upgrade().is_none());
        let t2 = table(Kind::Set);
        let _ = t2.take_storage();
        assert!(compact_now(&t2, Box::new(move |r| tx.send(r).unwrap())));
        let r = rx.recv_timeout(Duration::from_secs(20)).unwrap();
        assert!(matches!(r, Err(Error::Deleted)), "{r:?}");
    }

    #[test]
    fn a_file_arena_cuts_its_file_short() {
        let dir = std::env::temp_dir().join(format!("heft-compact-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let t = table_on(Kind::Bag, Backing::File(dir.clone()));
        let mut model = churned(&t, 12_000, 4);
        let len = || {
            let f = std::fs::read_dir(&dir).unwrap().next().unwrap().unwrap();
            f.metadata().unwrap().len()
        };
        let before = len();
        let done = t.compact(0, || true).unwrap();
        assert!(done.returned_bytes > 0, "{done:?}");
        assert!(len() < before / 2, "{} -> {}", before, len());
        same(&t, &model, 12_000);
        // It grows again as records come.
        for i in 12_000..16_000 {
            put(&t, i, 1);
            model.insert(i, vec![body(i, 1)]);
        }
        same(&t, &model, 16_000);
        drop(t);
        std::fs::remove_dir_all(&dir).unwrap();
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
    fn a_compaction_that_panics_leaves_the_table_whole_and_the_compactor_working() {
        for kind in [Kind::Set, Kind::OrderedSet] {
            let t = table(kind);
            let mut model = churned(&t, 10_000, 10);
            let compact = || {
                let (tx, rx) = std::sync::mpsc::channel();
                assert!(compact_now(&t, Box::new(move |r| tx.send(r).unwrap())));
                rx.recv_timeout(Duration::from_secs(20)).unwrap()
            };
            // Its third step panics: records have moved by then.
            t.auto.panic_in.store(3, AtomicOrdering::Relaxed);
            let r = compact();
            assert!(matches!(&r, Err(Error::Io(_))), "{r:?}");
            assert!(!t.compactions().running);
            same(&t, &model, 10_000);
            // Frees are not held back for it: a record deleted now leaves
            // free space behind; writes go on.
            let free = t.stats().unwrap().arena_free_bytes;
            t.remove(t.hash(&key(0)), &key(0), None).unwrap();
            model.remove(&0);
            assert!(t.stats().unwrap().arena_free_bytes > free);
            put(&t, 1, 1);
            model.insert(1, vec![body(1, 1)]);
            // The compactor's thread lives on, and the next run completes.
            let done = compact().unwrap();
            assert!(done.returned_bytes > 0, "{done:?}");
            same(&t, &model, 10_000);
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
        assert_eq!(t.compact(0, go_on).unwrap(), Compacted::default());
        // Blocks it moved stay moved; the space they left is free again
        // (its whole pages given back).
        let after = t.stats().unwrap();
        assert!(after.arena_used_bytes <= before.arena_used_bytes);
        assert_eq!(after.arena_free_bytes, before.arena_free_bytes);
        same(&t, &model, 6_000);
        assert!(
            t.compact(0, || true).unwrap().returned_bytes > 0,
            "none is running"
        );
        same(&t, &model, 6_000);
    }
}
