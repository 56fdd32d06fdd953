//! A background thread that works for many tables: the expiry sweeper
//! (table/expire.rs) and the tier mover (table/tier.rs) are each one.
//!
//! Tables are registered once (held weakly: a deleted table is forgotten),
//! and the thread runs its job on every live table in turn, then waits for
//! its tick or a wake. A wake that comes while the thread is busy is not
//! lost: the next round starts at once. A job that panics ends that
//! table's turn, not the thread.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::Table;

pub(super) struct Worker {
    name: &'static str,
    tick: Duration,
    /// What the thread does with one table.
    job: fn(&Table),
    tables: Mutex<Vec<Weak<Table>>>,
    wake: Condvar,
    /// Set by [`Worker::wake`] until the thread starts a round.
    woken: AtomicBool,
    /// Whether the thread started (set once, on first registration).
    started: OnceLock<bool>,
}

impl Worker {
    pub(super) const fn new(name: &'static str, tick: Duration, job: fn(&Table)) -> Worker {
        Worker {
            name,
            tick,
            job,
            tables: Mutex::new(Vec::new()),
            wake: Condvar::new(),
            woken: AtomicBool::new(false),
            started: OnceLock::new(),
        }
    }

    /// Has the thread look after `table`, starting it on first use, and
    /// wakes it. False if the thread could not be started.
    pub(super) fn looks_after(&'static self, table: Weak<Table>) -> bool {
        let started = self.started.get_or_init(|| {
            std::thread::Builder::new()
                .name(self.name.into())
                .spawn(move || self.run())
                .is_ok()
        });
        if !*started {
            return false;
        }
        // Under the lock, and whatever `woken` says: a thread with no
        // table waits for one without a tick.
        let mut list = self.tables.lock();
        list.push(table);
        self.woken.store(true, Ordering::Release);
        self.wake.notify_one();
        true
    }

    /// Has the thread look after a table once: `enlisted` is the table's
    /// own flag for this worker, `me` the table as its holder shares it
    /// (`None` until the holder asked for automatic work: nothing then).
    /// True if the thread looks after the table (now or already).
    pub(super) fn enlist(&'static self, enlisted: &AtomicBool, me: Option<&Weak<Table>>) -> bool {
        let Some(me) = me else { return false };
        if enlisted.load(Ordering::Relaxed) || enlisted.swap(true, Ordering::AcqRel) {
            return true;
        }
        if self.looks_after(me.clone()) {
            return true;
        }
        enlisted.store(false, Ordering::Release);
        false
    }

    /// Has the thread start a round now rather than at its next tick (once,
    /// however many ask before it does).
    pub(super) fn wake(&self) {
        if !self.woken.swap(true, Ordering::AcqRel) {
            // Under the lock: the thread is either waiting or has yet to
            // look at `woken`.
            let _list = self.tables.lock();
            self.wake.notify_one();
        }
    }

    fn run(&'static self) {
        loop {
            let tables: Vec<Arc<Table>> = {
                let mut list = self.tables.lock();
                list.retain(|w| w.strong_count() > 0);
                while list.is_empty() {
                    self.wake.wait(&mut list);
                    list.retain(|w| w.strong_count() > 0);
                }
                list.iter().filter_map(Weak::upgrade).collect()
            };
            for t in tables {
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (self.job)(&t)));
            }
            let mut list = self.tables.lock();
            if !self.woken.swap(false, Ordering::AcqRel) {
                self.wake.wait_for(&mut list, self.tick);
                self.woken.store(false, Ordering::Release);
            }
        }
    }
}

/// Rests after a step that held a table's lock since `started`, as long
/// as it held it (at least 50 µs): a worker takes at most half of a core
/// and never keeps a table from its users for long.
pub(super) fn rest(started: Instant) {
    std::thread::sleep(started.elapsed().max(Duration::from_micros(50)));
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;
    use crate::arena::Backing;
    use crate::compress::Compression;
    use crate::table::{Kind, Options};

    static RUNS: AtomicUsize = AtomicUsize::new(0);
    static COUNTER: Worker = Worker::new("heft-test", Duration::from_secs(3600), |_| {
        RUNS.fetch_add(1, Ordering::Relaxed);
    });

    fn table() -> Arc<Table> {
        Arc::new(
            Table::new(&Options {
                backing: Backing::Memory,
                compression: Compression::None,
                label: "worker".into(),
                kind: Kind::Set,
            })
            .unwrap(),
        )
    }

    /// Waits (up to 10 s) until the job has run more than `n` times.
    fn ran_past(n: usize) -> bool {
        let until = Instant::now() + Duration::from_secs(10);
        while RUNS.load(Ordering::Relaxed) <= n && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
        RUNS.load(Ordering::Relaxed) > n
    }

    #[test]
    fn a_table_registered_after_the_last_one_went_is_looked_after_at_once() {
        for _ in 0..3 {
            let t = table();
            let n = RUNS.load(Ordering::Relaxed);
            assert!(COUNTER.looks_after(Arc::downgrade(&t)));
            assert!(ran_past(n), "the new table's round (the tick is an hour)");
            // A wake while busy or idle is not lost either.
            let n = RUNS.load(Ordering::Relaxed);
            COUNTER.wake();
            assert!(ran_past(n));
            // The table goes; the thread waits for another with its list
            // empty (and, before the fix, a wake flag left set).
            drop(t);
            COUNTER.wake();
            std::thread::sleep(Duration::from_millis(20));
            // Woken with no table: it waits again, and the wake is spent.
            COUNTER.wake();
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
