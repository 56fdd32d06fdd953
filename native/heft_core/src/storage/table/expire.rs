//! Expiry: a key written with a time to live has a deadline, past which
//! the table treats it as gone.
//!
//! A table keeps an [`Expiry`] once it has a default time to live
//! ([`super::Table::set_ttl`]) or a write gave one. It maps each key that
//! has a deadline, as stored (its encoded bytes: in an ordered_set, the
//! bytes of the key the table holds, which may be another key `==` to the
//! one a call names), to that deadline, and keeps the deadlines in order.
//! Every read skips an expired key (a lookup answers as for a missing
//! key, a walk passes over it), every write that names an expired key
//! first removes it, as a delete, and the sweep ([`super::Table::sweep`],
//! run by the thread below for tables that asked for it) removes the
//! others in deadline order, in short steps under the write lock. So an
//! expired key is never seen, though it holds memory until it is swept.
//!
//! A key's deadline is set by the writes that store an object of it
//! (`insert`, `insert_new`): the write's time to live, else the table's,
//! from when the write was applied; a key with neither has no deadline.
//! Writes that change a key's object in place (`update_counter`,
//! `update_element`, `select_replace`) keep its deadline; a key they
//! create gets the table's. In a bag the deadline is the key's, not an
//! object's: each write of the key sets it for all its objects.
//!
//! Time is the monotonic clock in milliseconds ([`now`]), so deadlines do
//! not move when the wall clock is set.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use super::worker::{rest, Worker};
use crate::hash::KeyedHash;

/// Milliseconds on the monotonic clock, since this library first asked.
pub fn now() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// The time to live a write asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Ttl {
    /// The table's (none if it has none).
    #[default]
    Table,
    /// No deadline, whatever the table's.
    Never,
    /// This many milliseconds from the write.
    Millis(u64),
}

/// A table's deadlines.
#[derive(Default)]
pub(super) struct Expiry {
    /// The table's time to live, in milliseconds.
    pub(super) ttl: Option<u64>,
    /// Each key's deadline, and the sequence number that makes its place
    /// in `due` unique.
    deadlines: HashMap<Arc<[u8]>, (u64, u64), Keyed>,
    /// The keys by deadline, earliest first.
    due: BTreeMap<(u64, u64), Arc<[u8]>>,
    seq: u64,
    /// Bytes of the keys held (each once, shared by both maps).
    key_bytes: usize,
    /// Keys and records removed because they had expired.
    pub(super) expired_keys: u64,
    pub(super) expired_records: u64,
}

/// Bytes a key costs in the two maps besides its own: the hash map's slot
/// (key pointer and length, deadline, sequence number, control byte, at
/// its load), the B-tree's entry (key, value) with its share of a node,
/// and the key's allocation header.
const PER_KEY_BYTES: usize = 48 + 40 + 16;

impl Expiry {
    /// The deadline a write asking for `ttl` at `now` gives its key.
    pub(super) fn deadline(&self, ttl: Ttl, now: u64) -> Option<u64> {
        match ttl {
            Ttl::Table => self.ttl.map(|ms| now.saturating_add(ms)),
            Ttl::Never => None,
            Ttl::Millis(ms) => Some(now.saturating_add(ms)),
        }
    }

    /// Gives `key` the deadline `at` (none: no deadline).
    pub(super) fn set(&mut self, key: &[u8], at: Option<u64>) {
        let Some(at) = at else {
            self.forget(key);
            return;
        };
        self.seq += 1;
        let seq = self.seq;
        match self.deadlines.get_mut(key) {
            Some(slot) => {
                let k = self
                    .due
                    .remove(slot)
                    .expect("every deadline is in the order too");
                *slot = (at, seq);
                self.due.insert((at, seq), k);
            }
            None => {
                let k: Arc<[u8]> = Arc::from(key);
                self.key_bytes += k.len();
                self.deadlines.insert(k.clone(), (at, seq));
                self.due.insert((at, seq), k);
            }
        }
    }

    /// Drops `key`'s deadline, if it has one.
    pub(super) fn forget(&mut self, key: &[u8]) {
        if self.deadlines.is_empty() {
            return;
        }
        if let Some(at) = self.deadlines.remove(key) {
            self.due.remove(&at);
            self.key_bytes -= key.len();
        }
    }

    /// Drops every deadline.
    pub(super) fn clear(&mut self) {
        self.deadlines.clear();
        self.due.clear();
        self.key_bytes = 0;
    }

    /// `key`'s deadline.
    pub(super) fn deadline_of(&self, key: &[u8]) -> Option<u64> {
        self.deadlines.get(key).map(|&(at, _)| at)
    }

    /// The earliest deadline.
    pub(super) fn earliest(&self) -> Option<u64> {
        self.due.first_key_value().map(|(&(at, _), _)| at)
    }

    /// The keys whose deadline is not after `now`, earliest first.
    pub(super) fn due_keys(&self, now: u64) -> impl Iterator<Item = &[u8]> {
        self.due.range(..=(now, u64::MAX)).map(|(_, k)| &k[..])
    }

    /// Takes the key with the earliest deadline if that is not after
    /// `now`: its deadline is dropped.
    pub(super) fn pop_due(&mut self, now: u64) -> Option<Arc<[u8]>> {
        let (&(at, _), _) = self.due.first_key_value()?;
        if at > now {
            return None;
        }
        let (_, k) = self.due.pop_first()?;
        self.deadlines.remove(&k);
        self.key_bytes -= k.len();
        Some(k)
    }

    /// Keys with a deadline.
    pub(super) fn len(&self) -> usize {
        self.deadlines.len()
    }

    /// Bytes the deadlines take, about.
    pub(super) fn heap_bytes(&self) -> u64 {
        (self.key_bytes + self.deadlines.len() * PER_KEY_BYTES) as u64
    }

    /// What a read at `now` needs to tell expired keys (see [`Clock`]).
    pub(super) fn clock(&self, now: u64) -> Clock<'_> {
        // Nothing has expired yet: no key need be looked up.
        let live = !self.earliest().is_some_and(|at| at <= now);
        Clock {
            expiry: (!live).then_some(self),
            now,
        }
    }
}

/// Tells whether a key has expired, as of one moment: a read takes it
/// once and asks it of each key it meets.
#[derive(Clone, Copy)]
pub(super) struct Clock<'a> {
    /// `None` when no key can have expired.
    expiry: Option<&'a Expiry>,
    now: u64,
}

impl Clock<'_> {
    /// A clock for a table without deadlines.
    pub(super) const NONE: Clock<'static> = Clock {
        expiry: None,
        now: 0,
    };

    /// True if `key` (as stored) has expired.
    #[inline]
    pub(super) fn expired(&self, key: &[u8]) -> bool {
        self.expiry
            .and_then(|e| e.deadline_of(key))
            .is_some_and(|at| at <= self.now)
    }

    /// True if no key can have expired.
    #[inline]
    pub(super) fn is_none(&self) -> bool {
        self.expiry.is_none()
    }
}

/// Hashes a key's bytes with a keyed hash of the table's kind (not
/// SipHash, which was a sixth of what a deadline cost a write): keys are
/// the callers' data, so not a hash they can aim at.
#[derive(Clone)]
pub(super) struct Keyed(KeyedHash);

impl Default for Keyed {
    fn default() -> Self {
        Keyed(KeyedHash::random())
    }
}

impl std::hash::BuildHasher for Keyed {
    type Hasher = KeyedHasher;
    fn build_hasher(&self) -> KeyedHasher {
        KeyedHasher(self.0, 0)
    }
}

/// Hashes the one byte string written ([u8]'s length prefix is ignored).
pub(super) struct KeyedHasher(KeyedHash, u64);

impl std::hash::Hasher for KeyedHasher {
    fn finish(&self) -> u64 {
        self.1
    }
    fn write(&mut self, bytes: &[u8]) {
        self.1 ^= self.0.hash(bytes);
    }
    fn write_usize(&mut self, _len: usize) {}
}

// ---- The sweeper: one thread for every table whose expired keys are
// swept on their own (table/worker.rs).

/// Keys the sweeper removes per hold of a table's write lock.
pub(super) const SWEEP_STEP: usize = 256;

/// The sweeper: every 100 ms (or when woken), sweeps each table of what
/// has expired, a step at a time, resting between steps as long as the
/// step held the lock, so that it never keeps the table from its users
/// for long.
pub(super) static SWEEPER: Worker =
    Worker::new("heft-expiry", Duration::from_millis(100), |t| loop {
        let started = Instant::now();
        match t.sweep(SWEEP_STEP) {
            Ok(n) if n == SWEEP_STEP => rest(started),
            _ => break,
        }
    });

/// Has the sweeper look at its tables now rather than at its next tick (a
/// read found many expired keys not yet swept).
pub(super) fn wake() {
    SWEEPER.wake();
}
