//! Budgets: a table bounded in bytes or records evicts keys by SIEVE
//! (Zhang et al., NSDI '24), chosen by the hit-ratio study of
//! docs/benchmarks.md ("Eviction policies").
//!
//! The queue holds the table's keys in the order they arrived, oldest
//! first, as their encoded bytes (a key's hash is recomputed when needed;
//! compaction moves records, never keys, so the queue need not follow it).
//! A read marks the key *visited*; the hand walks from the oldest key
//! towards the newest: a visited key stays where it is, the first key not
//! visited is the victim. A key is evicted with all its objects (bag,
//! duplicate_bag).
//!
//! Two approximations keep this cheap, both measured in the study:
//! - The marks are not per key but one bitset of 16 to 32 bits per queued
//!   key, indexed by the key's hash, so a read is one relaxed atomic `or`
//!   under the table's read lock, with no map from key to queue position.
//!   SIEVE clears a key's mark as the hand passes it; a shared bit cannot
//!   be cleared for one key alone (that would unmark the others), so the
//!   whole set is cleared each time the hand wraps instead: a key is
//!   visited if it was read since then. Keys sharing a bit with a read key
//!   look visited too. The study measured both choices: clearing per pass
//!   instead of per key changed no hit ratio there, while the bits per key
//!   did (4 bits a key: up to 7 points below SIEVE; 16: up to 5).
//! - The hand looks at no more than [`MAX_VISITED`] keys for one victim:
//!   the last of them is evicted even if visited, so a victim costs a
//!   bounded number of steps.
//!
//! Deleted keys are not looked for in the queue: the hand drops a key it
//! finds no longer in the table. A key deleted and inserted again is
//! queued twice, its older place dropped when the hand finds the key gone.
//! So that a table that deletes as much as it inserts, never evicting,
//! does not grow its queue without end, each new key also advances the
//! hand over up to [`TIDY_STEPS`] keys, dropping the deleted ones, once the
//! queue holds more than twice the table's records.
//!
//! The queue is kept as two runs of keys, each key after its length, in
//! chunks of 16 KiB: those the hand has yet to pass in this pass (new keys
//! join them at the end) and those it kept; when it has passed them all,
//! the kept ones are the queue again. So a key costs its bytes and one
//! (more for keys over 127 bytes), and the queue stays in arrival order.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use std::collections::VecDeque;

use crate::codec::{put_varint, varint_len, Reader};

/// How far a table is bounded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Budget {
    /// The most bytes of `info(:memory)` the records, index, dictionaries
    /// and this queue may hold (see [`super::Table::charged_bytes`]).
    pub max_bytes: Option<u64>,
    /// The most records (objects, in a bag).
    pub max_records: Option<u64>,
}

impl Budget {
    /// True if neither bound is set.
    pub fn is_none(&self) -> bool {
        self.max_bytes.is_none() && self.max_records.is_none()
    }
}

/// Keys the hand passes for one victim, at most (about 30 ns each: a hash
/// and a bit, no lookup).
pub(super) const MAX_VISITED: usize = 8192;
/// Keys the hand tidies per new key, when the queue is over twice the
/// table's records.
const TIDY_STEPS: usize = 4;
/// Writes between two counts of a bounded table's slowly changing bytes.
pub(super) const SLOW_RECOUNT: u32 = 256;

/// Marks per queued key, at least (a power of two).
const MARK_BITS: usize = 16;

/// The fewest visited bits (a power of two).
const MIN_BITS: usize = 4096;

/// Stripes of the read counters: readers on different threads count on
/// different cache lines.
const STRIPES: usize = 8;

/// One stripe of read counters.
#[derive(Default)]
#[repr(align(64))]
struct Stripe {
    hits: AtomicU64,
    misses: AtomicU64,
}

static NEXT_STRIPE: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's stripe.
    static STRIPE: usize = NEXT_STRIPE.fetch_add(1, Ordering::Relaxed) % STRIPES;
}

/// A bounded table's eviction queue and visited bits.
pub(super) struct Evict {
    pub(super) budget: Budget,
    /// The keys the hand has yet to pass in this pass, oldest first (new
    /// keys join at the end), and where the next one starts in the first
    /// chunk.
    ahead: Keys,
    hand: usize,
    /// The keys the hand kept in this pass, in order.
    kept: Keys,
    /// Keys queued, ahead or kept.
    queued: usize,
    /// Marks of reads since the hand last wrapped.
    marks: Box<[AtomicU64]>,
    /// Keys evicted (each with all its records) and records evicted.
    pub(super) evicted_keys: u64,
    pub(super) evicted_records: u64,
    /// Bytes of the table counted only every [`SLOW_RECOUNT`] writes
    /// (table.rs `recount_slow_bytes`), and writes until the next count.
    pub(super) slow_bytes: u64,
    pub(super) slow_age: u32,
    reads: Box<[Stripe]>,
}

/// What the hand does with the keys it passes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Walk {
    /// Find a victim.
    Evict,
    /// Only drop keys no longer in the table.
    Tidy,
}

impl Evict {
    pub(super) fn new(budget: Budget) -> Evict {
        Evict {
            budget,
            ahead: Keys::default(),
            hand: 0,
            kept: Keys::default(),
            queued: 0,
            marks: bits(MIN_BITS),
            evicted_keys: 0,
            evicted_records: 0,
            slow_bytes: 0,
            slow_age: 0,
            reads: (0..STRIPES).map(|_| Stripe::default()).collect(),
        }
    }

    /// Counts a lookup of the key of `hash` (under the table's read lock),
    /// and marks the key visited if it was found.
    pub(super) fn read(&self, hash: u64, found: bool) {
        let stripe = &self.reads[STRIPE.with(|s| *s)];
        if found {
            stripe.hits.fetch_add(1, Ordering::Relaxed);
            self.touch(hash);
        } else {
            stripe.misses.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Lookups that found their key, and those that did not.
    pub(super) fn hits_misses(&self) -> (u64, u64) {
        self.reads.iter().fold((0, 0), |(h, m), s| {
            (
                h + s.hits.load(Ordering::Relaxed),
                m + s.misses.load(Ordering::Relaxed),
            )
        })
    }

    /// Heap bytes of the queue and the visited bits.
    pub(super) fn heap_bytes(&self) -> u64 {
        let marks = self.marks.len() * 8;
        (self.ahead.heap_bytes() + self.kept.heap_bytes() + marks) as u64
    }

    /// Keys queued (deleted ones the hand has not dropped yet included).
    #[cfg(test)]
    fn queued(&self) -> usize {
        self.queued
    }

    /// The word and bit of a hash's mark, in a set of `words` words.
    fn bit(words: usize, hash: u64) -> (usize, u64) {
        let i = (hash as usize) & (words * 64 - 1);
        (i / 64, 1 << (i % 64))
    }

    /// Marks the key of `hash` read (under the table's read lock).
    pub(super) fn touch(&self, hash: u64) {
        let (w, mask) = Evict::bit(self.marks.len(), hash);
        let word = &self.marks[w];
        if word.load(Ordering::Relaxed) & mask == 0 {
            word.fetch_or(mask, Ordering::Relaxed);
        }
    }

    fn visited(&self, hash: u64) -> bool {
        let (w, mask) = Evict::bit(self.marks.len(), hash);
        self.marks[w].load(Ordering::Relaxed) & mask != 0
    }

    /// Queues a key new to the table, as the newest. `records` is how many
    /// the table holds; `find` tells whether a key (with its hash) is still
    /// in it and `hash_of` gives a key's hash, for tidying.
    pub(super) fn added<T>(
        &mut self,
        key: &[u8],
        records: usize,
        find: impl FnMut(&[u8], u64) -> Option<T>,
        hash_of: impl FnMut(&[u8]) -> u64,
    ) {
        if self.queued * MARK_BITS >= self.marks.len() * 64 {
            // Grown past MARK_BITS bits a key: twice as many. A key's bit
            // is its hash's low bits, one more of them now: both halves
            // start as the old bits, so no mark is lost.
            self.marks = doubled(&self.marks);
        }
        self.push(key);
        if self.queued > 2 * records + 64 {
            self.walk(Walk::Tidy, TIDY_STEPS, find, hash_of);
        }
    }

    /// Queues a key again as the newest (its eviction was not applied).
    pub(super) fn requeue(&mut self, key: &[u8]) {
        self.push(key);
    }

    fn push(&mut self, key: &[u8]) {
        self.ahead.push(key);
        self.queued += 1;
    }

    /// The next victim: the oldest key not visited that `find` finds in
    /// the table (with what it found), taken off the queue. `None` if the
    /// queue holds no key of the table.
    pub(super) fn victim<T>(
        &mut self,
        find: impl FnMut(&[u8], u64) -> Option<T>,
        hash_of: impl FnMut(&[u8]) -> u64,
    ) -> Option<(Vec<u8>, T)> {
        // Every queued key can be looked at twice: visited, then (the
        // marks cleared at the wrap) not.
        self.walk(Walk::Evict, 2 * self.queued + 2, find, hash_of)
    }

    /// Moves the hand over at most `steps` keys (wrapping to the oldest at
    /// the newest).
    fn walk<T>(
        &mut self,
        how: Walk,
        steps: usize,
        mut find: impl FnMut(&[u8], u64) -> Option<T>,
        mut hash_of: impl FnMut(&[u8]) -> u64,
    ) -> Option<(Vec<u8>, T)> {
        let mut passed = 0;
        for _ in 0..steps {
            let Some((start, end)) = self.ahead.key_at(&mut self.hand) else {
                self.wrap();
                if self.queued == 0 || how == Walk::Tidy {
                    return None;
                }
                continue;
            };
            let key = &self.ahead.chunks[0][start..end];
            let hash = hash_of(key);
            // A visited key is kept without looking it up: it is dropped
            // at a later pass if it has left the table.
            let spared = how == Walk::Evict && {
                passed += 1;
                passed < MAX_VISITED && self.visited(hash)
            };
            let found = if spared { None } else { find(key, hash) };
            if !spared && found.is_none() {
                self.hand = end;
                self.queued -= 1;
                continue;
            }
            if let (Walk::Evict, Some(found)) = (how, found) {
                let key = key.to_vec();
                self.hand = end;
                self.queued -= 1;
                return Some((key, found));
            }
            self.kept.push(key);
            self.hand = end;
        }
        None
    }

    /// The hand passed the newest key: the keys kept are the queue, and the
    /// hand starts again at the oldest.
    fn wrap(&mut self) {
        self.ahead = std::mem::take(&mut self.kept);
        self.hand = 0;
        self.marks
            .iter()
            .for_each(|w| w.store(0, Ordering::Relaxed));
    }

    /// Forgets every key (the table was cleared).
    pub(super) fn clear(&mut self) {
        self.ahead = Keys::default();
        self.kept = Keys::default();
        self.queued = 0;
        self.hand = 0;
        self.marks = bits(MIN_BITS);
    }
}

/// Bytes of a chunk of queued keys.
const CHUNK: usize = 16 << 10;

/// Keys back to back, each after its length (a varint), in chunks of
/// [`CHUNK`] bytes (a longer key has one of its own): read only in order,
/// a chunk freed once read.
#[derive(Default)]
struct Keys {
    chunks: VecDeque<Vec<u8>>,
    /// The chunks' capacities, summed.
    bytes: usize,
}

impl Keys {
    fn push(&mut self, key: &[u8]) {
        let need = varint_len(key.len() as u64) + key.len();
        match self.chunks.back_mut() {
            Some(last) if last.len() + need <= last.capacity() => {}
            _ => {
                self.chunks.push_back(Vec::with_capacity(CHUNK.max(need)));
                self.bytes += CHUNK.max(need);
            }
        }
        let last = self.chunks.back_mut().expect("a chunk was just made");
        put_varint(last, key.len() as u64);
        last.extend_from_slice(key);
    }

    /// Where the key at offset `*at` of the first chunk lies in that
    /// chunk, dropping chunks read to their end (`*at` then 0). `None`
    /// once every key has been read.
    fn key_at(&mut self, at: &mut usize) -> Option<(usize, usize)> {
        while self.chunks.front().is_some_and(|c| *at == c.len()) {
            if let Some(c) = self.chunks.pop_front() {
                self.bytes -= c.capacity();
            }
            *at = 0;
        }
        let chunk = self.chunks.front()?;
        let mut r = Reader::new(&chunk[*at..]);
        let len = r.varint().expect("a queued key's length") as usize;
        let start = *at + r.position();
        Some((start, start + len))
    }

    fn heap_bytes(&self) -> usize {
        self.bytes + self.chunks.capacity() * std::mem::size_of::<Vec<u8>>()
    }
}

fn doubled(set: &[AtomicU64]) -> Box<[AtomicU64]> {
    (0..2 * set.len())
        .map(|i| AtomicU64::new(set[i % set.len()].load(Ordering::Relaxed)))
        .collect()
}

fn bits(n: usize) -> Box<[AtomicU64]> {
    (0..n / 64).map(|_| AtomicU64::new(0)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn h(k: &[u8]) -> u64 {
        // A mixer good enough for distinct test keys.
        let mut x = k.iter().fold(0xcbf2_9ce4_8422_2325u64, |a, &b| {
            (a ^ b as u64).wrapping_mul(0x100_0000_01b3)
        });
        x ^= x >> 33;
        x.wrapping_mul(0xff51_afd7_ed55_8ccd)
    }

    fn key(i: u32) -> Vec<u8> {
        i.to_be_bytes().to_vec()
    }

    fn victim(e: &mut Evict, live: &BTreeSet<Vec<u8>>) -> Option<Vec<u8>> {
        e.victim(|k, _| live.contains(k).then_some(()), h)
            .map(|v| v.0)
    }

    /// A model table: the set of keys present.
    fn add(e: &mut Evict, live: &BTreeSet<Vec<u8>>, k: &[u8]) {
        e.added(k, live.len(), |k, _| live.contains(k).then_some(()), h);
    }

    /// A queue of keys `0..n`, all in the model table.
    fn queue_of(n: u32) -> (Evict, BTreeSet<Vec<u8>>) {
        let mut e = Evict::new(Budget::default());
        let mut live = BTreeSet::new();
        for i in 0..n {
            live.insert(key(i));
            add(&mut e, &live, &key(i));
        }
        (e, live)
    }

    #[test]
    fn evicts_oldest_unvisited_first_and_spares_visited_keys() {
        let (mut e, mut live) = queue_of(10);
        e.touch(h(&key(0)));
        e.touch(h(&key(2)));
        let v = victim(&mut e, &live).unwrap();
        assert_eq!(v, key(1));
        live.remove(&v);
        let v = victim(&mut e, &live).unwrap();
        assert_eq!(v, key(3), "2 was visited: spared");
        live.remove(&v);
        // The hand goes on from where it stopped, then wraps, clearing the
        // marks: 0 and 2, not read since, go too.
        for want in [4, 5, 6, 7, 8, 9, 0, 2] {
            let v = victim(&mut e, &live).unwrap();
            assert_eq!(v, key(want));
            live.remove(&v);
        }
        assert_eq!(victim(&mut e, &live), None);
        assert_eq!(e.queued(), 0);
    }

    #[test]
    fn deleted_keys_are_dropped_and_never_returned() {
        let (mut e, mut live) = queue_of(100);
        for i in (0..100).step_by(2) {
            live.remove(&key(i));
        }
        let mut got = Vec::new();
        while let Some(v) = victim(&mut e, &live) {
            assert!(live.remove(&v), "a victim is a key of the table");
            got.push(v);
        }
        let want: Vec<_> = (1..100).step_by(2).map(key).collect();
        assert_eq!(got, want, "in arrival order");
    }

    #[test]
    fn a_table_that_deletes_what_it_inserts_keeps_its_queue_short() {
        let mut e = Evict::new(Budget::default());
        let mut live = BTreeSet::new();
        for i in 0..100_000u32 {
            live.insert(key(i));
            add(&mut e, &live, &key(i));
            if i >= 10 {
                live.remove(&key(i - 10));
            }
        }
        // Tidying starts past 2n + 64 keys and moves the hand four keys a
        // new key: it reaches the newest within a third more.
        assert!(
            e.queued() <= (2 * live.len() + 65) * 4 / 3 + 1,
            "{}",
            e.queued()
        );
        // Every survivor is still queued, once.
        let mut got = BTreeSet::new();
        while let Some(v) = e
            .victim(
                |k, _| (live.contains(k) && !got.contains(k)).then_some(()),
                h,
            )
            .map(|v| v.0)
        {
            assert!(got.insert(v));
        }
        assert_eq!(got, live);
    }

    #[test]
    fn a_run_of_visited_keys_ends_at_the_bound() {
        let mut e = Evict::new(Budget::default());
        let mut live = BTreeSet::new();
        for i in 0..20_000 {
            live.insert(key(i));
            add(&mut e, &live, &key(i));
            e.touch(h(&key(i)));
        }
        let v = victim(&mut e, &live).unwrap();
        assert_eq!(v, key(MAX_VISITED as u32 - 1));
    }

    #[test]
    fn marks_survive_the_bits_growing() {
        let mut e = Evict::new(Budget::default());
        let mut live = BTreeSet::new();
        live.insert(key(0));
        add(&mut e, &live, &key(0));
        e.touch(h(&key(0)));
        for i in 1..10_000 {
            live.insert(key(i));
            add(&mut e, &live, &key(i));
        }
        assert!(e.marks.len() * 64 > MIN_BITS);
        let v = victim(&mut e, &live).unwrap();
        assert_eq!(v, key(1), "0 is still visited");
    }

    #[test]
    fn a_requeued_key_comes_back_as_the_newest() {
        let (mut e, mut live) = queue_of(3);
        let v = victim(&mut e, &live).unwrap();
        e.requeue(&v);
        let order: Vec<_> = std::iter::from_fn(|| {
            let v = victim(&mut e, &live)?;
            live.remove(&v);
            Some(v)
        })
        .collect();
        assert_eq!(order, vec![key(1), key(2), key(0)]);
    }
}
