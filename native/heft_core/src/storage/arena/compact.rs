//! Compaction: moving records down so the top of the arena goes back.
//!
//! Free blocks do not move and their neighbours are not merged, so a table
//! that shrank (records deleted, re-compressed smaller with a dictionary)
//! keeps its high-water mark with holes in it. A compaction chooses a
//! *ceiling* a little above what the live blocks need and, in steps that
//! each hold the table's lock briefly, while writers go on:
//!
//! 1. [`Arena::purge_free`] takes every free block that ends above the
//!    ceiling off the free lists (they become *doomed*: counted as free,
//!    never handed out), so new records go below it;
//! 2. [`Arena::relocate`] moves each live block above the ceiling to a free
//!    block below it (the caller points the index at the new handle); the
//!    old block is doomed too, as is any block freed above the ceiling
//!    meanwhile;
//! 3. [`Arena::take_doomed`] hands the doomed blocks to the caller, which
//!    sorts and merges neighbours into [`Run`]s without the lock
//!    ([`runs`]), and [`Arena::finish_compaction`] lowers the top past the
//!    runs that end it (giving their pages back), then puts the other runs
//!    back on the free lists as blocks of the largest classes (whole pages
//!    of those given back too), a batch per call.
//!
//! A writer that finds nothing free below the ceiling grows the arena as
//! always: the records it places above it stay, and so does the top, but
//! the merged runs still come back as large blocks. [`Arena::clear`] ends a
//! compaction; the caller's later steps then do nothing.

use super::*;

/// Runs pushed back on the free lists per [`Arena::finish_compaction`] call.
const RUNS_PER_STEP: usize = 4096;

/// The state of a compaction in progress.
pub(super) struct Compaction {
    id: u64,
    ceiling: u64,
    /// Free blocks that end above the ceiling, not on the free lists.
    doomed: Vec<u64>,
    /// Set once the top was lowered.
    lowered: bool,
}

/// A compaction the caller runs: see the module doc.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket {
    id: u64,
    /// Blocks that end above this offset are moved below it.
    pub ceiling: u64,
}

/// Free blocks that are neighbours, merged: `[start, end)`, of which
/// `punched` bytes were given back to the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    start: u64,
    end: u64,
    punched: u64,
}

static COMPACTION_SEQ: AtomicU64 = AtomicU64::new(1);

/// Sorts doomed free-list entries by offset and merges neighbours.
pub fn runs(mut doomed: Vec<u64>) -> Vec<Run> {
    doomed.sort_unstable_by_key(|&e| offset(e));
    let mut runs: Vec<Run> = Vec::new();
    for e in doomed {
        let (start, size) = (offset(e), block_size(e) as u64);
        let punched = punched_part(e);
        match runs.last_mut() {
            Some(r) if r.end == start => {
                r.end += size;
                r.punched += punched;
            }
            _ => runs.push(Run {
                start,
                end: start + size,
                punched,
            }),
        }
    }
    debug_assert!(runs.windows(2).all(|w| w[0].end < w[1].start));
    runs
}

/// The bytes of a free-list entry's block that were given back.
fn punched_part(entry: u64) -> u64 {
    if entry & PUNCHED == 0 {
        return 0;
    }
    let loc = entry & !PUNCHED;
    punchable(offset(loc), block_size(loc) as u64).map_or(0, |(_, l)| l)
}

impl Arena {
    /// Starts a compaction if it would give back at least `min_gain` bytes
    /// and an eighth of the arena: the ceiling is the live bytes plus a
    /// sixteenth (room for the size classes the moved blocks need), page
    /// aligned. `None` if not, or if one is running.
    pub fn begin_compaction(&mut self, min_gain: u64) -> Option<Ticket> {
        if self.compaction.is_some() {
            return None;
        }
        let room = self.live + self.live / 16 + PAGE;
        let ceiling = (FIRST_OFFSET + room).div_ceil(PAGE) * PAGE;
        let gain = self.top.checked_sub(ceiling)?;
        if gain < min_gain.max(self.top / 8) {
            return None;
        }
        let id = COMPACTION_SEQ.fetch_add(1, Ordering::Relaxed);
        self.compaction = Some(Compaction {
            id,
            ceiling,
            doomed: Vec::new(),
            lowered: false,
        });
        Some(Ticket { id, ceiling })
    }

    /// The running compaction, if it is `t`'s.
    fn compaction_of(&mut self, t: &Ticket) -> Option<&mut Compaction> {
        self.compaction.as_mut().filter(|c| c.id == t.id)
    }

    /// Step 1: dooms the free blocks of classes `from..` that end above the
    /// ceiling, looking at about `budget` entries; returns the class to go
    /// on from, or `None` when every class is done (or `t` is not running).
    pub fn purge_free(&mut self, t: &Ticket, from: usize, budget: usize) -> Option<usize> {
        let ceiling = self.compaction_of(t)?.ceiling;
        let (mut class, mut seen, mut gone) = (from, 0, Vec::new());
        while class < self.free.len() && seen < budget {
            let list = &mut self.free[class];
            seen += list.len();
            let size = class_size(class) as u64;
            list.retain(|&e| {
                let above = offset(e) + size > ceiling;
                if above {
                    gone.push(e);
                }
                !above
            });
            if list.is_empty() {
                self.nonempty[class / 64] &= !(1 << (class % 64));
            }
            class += 1;
        }
        let bytes: u64 = gone.iter().map(|&e| block_size(e) as u64).sum();
        self.free_bytes -= bytes;
        self.doomed_bytes += bytes;
        self.compaction_of(t)?.doomed.extend(gone);
        (class < self.free.len()).then_some(class)
    }

    /// Step 2: if block `loc` ends above the ceiling, moves its bytes to a
    /// block below it and frees (dooms) the old one; returns the new
    /// handle, or `None` (the block stays) if there is no room below the
    /// ceiling, the arena cannot grow, or `t` is not running.
    pub fn relocate(&mut self, t: &Ticket, loc: u64) -> Option<u64> {
        let ceiling = self.compaction_of(t)?.ceiling;
        let size = block_size(loc);
        let old = offset(loc);
        if old + size as u64 <= ceiling {
            return None;
        }
        // Of the same class: a larger one would waste what it is bigger by.
        let new = self.alloc_within(size, 0).ok()?;
        if offset(new) + block_size(new) as u64 > ceiling {
            // A block a writer freed above the ceiling before step 1 got to
            // its class, or the bump pointer: doomed, and the old one stays.
            self.free(new);
            return None;
        }
        let (from, to) = (old as usize, offset(new) as usize);
        self.bytes_mut().copy_within(from..from + size, to);
        self.free(loc);
        Some(new)
    }

    /// Where [`Arena::free`] puts a block during a compaction: doomed if it
    /// ends above the ceiling. Gives the entry back otherwise.
    pub(super) fn doom(&mut self, entry: u64) -> Option<u64> {
        let size = block_size(entry) as u64;
        match &mut self.compaction {
            Some(c) if offset(entry) + size > c.ceiling => {
                c.doomed.push(entry);
                self.doomed_bytes += size;
                None
            }
            _ => Some(entry),
        }
    }

    /// Step 3a: the blocks doomed so far, for [`runs`] (they stay counted
    /// as free, and not handed out, until [`Arena::finish_compaction`]).
    pub fn take_doomed(&mut self, t: &Ticket) -> Vec<u64> {
        self.compaction_of(t)
            .map(|c| std::mem::take(&mut c.doomed))
            .unwrap_or_default()
    }

    /// Step 3b, called until it returns true: the first call lowers the top
    /// past the runs and doomed blocks that end it and gives their pages
    /// back; each call puts up to [`RUNS_PER_STEP`] of `runs` back on the
    /// free lists; the last puts back the blocks doomed since
    /// [`Arena::take_doomed`] and ends the compaction. Returns the bytes it
    /// lowered the top by in `lowered`.
    pub fn finish_compaction(
        &mut self,
        t: &Ticket,
        runs: &mut Vec<Run>,
        lowered: &mut u64,
    ) -> bool {
        let Some(c) = self.compaction_of(t) else {
            runs.clear();
            return true;
        };
        if !c.lowered {
            c.lowered = true;
            let mut doomed = std::mem::take(&mut c.doomed);
            doomed.sort_unstable_by_key(|&e| offset(e));
            let old_top = self.top;
            let (mut top, mut punched) = (old_top, 0);
            loop {
                if let Some(r) = runs.last().filter(|r| r.end == top) {
                    (top, punched) = (r.start, punched + r.punched);
                    runs.pop();
                } else if let Some(&e) = doomed
                    .last()
                    .filter(|&&e| offset(e) + block_size(e) as u64 == top)
                {
                    (top, punched) = (offset(e), punched + punched_part(e));
                    doomed.pop();
                } else {
                    break;
                }
            }
            self.doomed_bytes -= old_top - top;
            self.punched -= punched;
            self.top = top;
            *lowered = old_top - top;
            if !matches!(self.pages, Pages::File(..)) {
                let start = top.div_ceil(PAGE) * PAGE;
                let end = old_top.div_ceil(PAGE) * PAGE;
                if end > start {
                    let _ = self.give_back(start, end - start);
                }
            }
            if let Some(c) = self.compaction.as_mut() {
                c.doomed = doomed;
            }
        }
        let at = runs.len().saturating_sub(RUNS_PER_STEP);
        for r in runs.drain(at..) {
            self.punched -= r.punched;
            self.doomed_bytes -= r.end - r.start;
            self.put_back(r.start, r.end);
        }
        if !runs.is_empty() {
            return false;
        }
        let c = self.compaction.take().expect("checked above");
        self.undoom(c.doomed);
        true
    }

    /// Ends a compaction early: every doomed block, those in `held`
    /// included, goes back on the free lists as it was.
    pub fn abort_compaction(&mut self, t: &Ticket, held: Vec<u64>) {
        if self.compaction_of(t).is_none() {
            return;
        }
        let mut doomed = self.compaction.take().expect("checked above").doomed;
        doomed.extend(held);
        self.undoom(doomed);
    }

    /// Puts doomed entries back on their free lists as they are, once the
    /// compaction is over.
    fn undoom(&mut self, doomed: Vec<u64>) {
        for e in doomed {
            let class = ((e & !PUNCHED) >> CLASS_SHIFT) as usize;
            self.doomed_bytes -= class_size(class) as u64;
            self.push_free(class, e);
        }
        debug_assert_eq!(self.doomed_bytes, 0);
    }

    /// Puts the free bytes `[start, end)` on the free lists as blocks of
    /// the largest classes that fit, giving back the pages of those of at
    /// least [`PUNCH_MIN`] bytes.
    fn put_back(&mut self, start: u64, end: u64) {
        let mut at = start;
        while at < end {
            let class = floor_class((end - at) as usize);
            let size = class_size(class) as u64;
            let mut entry = at | ((class as u64) << CLASS_SHIFT);
            if size as usize >= PUNCH_MIN && !matches!(self.pages, Pages::File(..)) {
                if let Some((s, len)) = punchable(at, size) {
                    if self.give_back(s, len).is_ok() {
                        self.punched += len;
                        entry |= PUNCHED;
                    }
                }
            }
            self.push_free(class, entry);
            at += size;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::Rng;

    /// Live blocks of a test arena: handle, fill byte, and the bytes
    /// filled (a block moved into a larger one holds them at its front).
    type Held = Vec<(u64, u8, usize)>;

    /// An arena of mixed blocks, most of them freed in a random order; a
    /// few past [`PUNCH_MIN`] so that punched pages are in play.
    fn holey(pages: MemoryPages, seed: u64) -> (Arena, Held) {
        let mut a = Arena::with_pages(&Backing::Memory, "compact", pages).unwrap();
        let (mut rng, mut held) = (Rng(seed), Held::new());
        for i in 0..30_000u32 {
            let r = rng.next();
            let len = match r >> 58 {
                0 => PUNCH_MIN + (r >> 20) as usize % (150 * 1024),
                _ => 1 + (r >> 20) as usize % 2000,
            };
            let loc = a.alloc(len).unwrap();
            a.get_mut(loc, block_size(loc)).unwrap().fill(i as u8);
            held.push((loc, i as u8, block_size(loc)));
        }
        for _ in 0..22_000 {
            let i = rng.below(held.len() as u64) as usize;
            a.free(held.swap_remove(i).0);
        }
        (a, held)
    }

    /// Every byte of `[FIRST_OFFSET, top)` is in exactly one live or free
    /// block (on a free list, doomed, or `taken` by the job), every live
    /// block holds its bytes, and the counts are exact.
    fn check(a: &Arena, held: &Held, taken: &[u64]) {
        let free = a.free.iter().flatten().copied();
        let doomed = a.compaction.iter().flat_map(|c| c.doomed.iter().copied());
        let free: Vec<u64> = free.chain(doomed).chain(taken.iter().copied()).collect();
        let mut spans: Vec<(u64, u64)> = held
            .iter()
            .map(|&(l, _, _)| l)
            .chain(free.iter().map(|&e| e & !PUNCHED))
            .map(|l| (offset(l), offset(l) + block_size(l) as u64))
            .collect();
        spans.sort_unstable();
        let mut at = FIRST_OFFSET;
        for (start, end) in spans {
            assert_eq!(start, at, "a gap or an overlap");
            at = end;
        }
        assert_eq!(at, a.top);
        for &(loc, fill, len) in held {
            let bytes = a.get(loc, len).unwrap();
            assert!(bytes.iter().all(|&b| b == fill));
        }
        let live: u64 = held.iter().map(|&(l, _, _)| block_size(l) as u64).sum();
        assert_eq!(a.live_bytes(), live);
        assert_eq!(live + a.free_bytes() + FIRST_OFFSET, a.top);
        assert_eq!(
            a.punched,
            free.iter().map(|&e| punched_part(e)).sum::<u64>()
        );
    }

    /// Runs every step of a compaction, moving every held block it can;
    /// `meanwhile` plays a writer between the steps. Returns the ceiling.
    fn compact(
        a: &mut Arena,
        held: &mut Held,
        mut meanwhile: impl FnMut(&mut Arena, &mut Held, &[u64]),
    ) -> u64 {
        let t = a.begin_compaction(0).expect("worth compacting");
        let mut class = Some(0);
        while let Some(from) = class {
            class = a.purge_free(&t, from, 1000);
            meanwhile(a, held, &[]);
        }
        let mut i = 0;
        while i < held.len() {
            if let Some(new) = a.relocate(&t, held[i].0) {
                held[i].0 = new;
            }
            if i % 500 == 0 {
                meanwhile(a, held, &[]);
            }
            i += 1;
        }
        let taken = a.take_doomed(&t);
        meanwhile(a, held, &taken);
        let mut runs = runs(taken);
        let mut lowered = 0;
        while !a.finish_compaction(&t, &mut runs, &mut lowered) {}
        assert!(a.compaction.is_none());
        t.ceiling
    }

    #[test]
    fn compaction_moves_blocks_down_and_gives_the_top_back() {
        for pages in [MemoryPages::Huge, MemoryPages::Memfd] {
            let (mut a, mut held) = holey(pages, 0x2545_f491_4f6c_dd1d);
            check(&a, &held, &[]);
            let (top, used, live) = (a.top, a.used_bytes(), a.live_bytes());
            assert!(top > 3 * live, "{pages:?}: the test needs holes");
            compact(&mut a, &mut held, |_, _, _| {});
            check(&a, &held, &[]);
            // Everything fit below the ceiling: live plus a sixteenth.
            assert!(
                a.top <= FIRST_OFFSET + live + live / 16 + 2 * PAGE,
                "{pages:?}"
            );
            assert!(a.top < top / 2, "{pages:?}: top {top} -> {}", a.top);
            assert!(
                a.used_bytes() < used * 3 / 5,
                "{pages:?}: {used} -> {}",
                a.used_bytes()
            );
            assert_eq!(a.live_bytes(), live);
            // And the arena goes on as before.
            for i in 0..2000u32 {
                let loc = a.alloc(1 + i as usize % 700).unwrap();
                a.get_mut(loc, block_size(loc)).unwrap().fill(7);
                held.push((loc, 7, block_size(loc)));
            }
            check(&a, &held, &[]);
        }
    }

    #[test]
    fn writers_during_a_compaction_keep_their_blocks_and_the_counts_stay_exact() {
        let (mut a, mut held) = holey(MemoryPages::Huge, 0x9e37_79b9_7f4a_7c15);
        let mut rng = Rng(77);
        let ceiling = compact(&mut a, &mut held, |a, held, taken| {
            // Frees anywhere (above the ceiling: doomed) and allocations,
            // some large enough to grow the arena past its top.
            for _ in 0..20 {
                let r = rng.next();
                if r % 2 == 0 && !held.is_empty() {
                    let i = (r >> 8) as usize % held.len();
                    a.free(held.swap_remove(i).0);
                } else {
                    let len = 1 + (r >> 20) as usize % if r % 7 == 0 { 90_000 } else { 900 };
                    let loc = a.alloc(len).unwrap();
                    a.get_mut(loc, block_size(loc)).unwrap().fill(r as u8);
                    held.push((loc, r as u8, block_size(loc)));
                }
            }
            check(a, held, taken);
        });
        check(&a, &held, &[]);
        // The top came down to the ceiling, or to the last block a writer
        // placed above it.
        let last = held
            .iter()
            .map(|&(l, _, _)| offset(l) + block_size(l) as u64);
        assert!(a.top <= last.max().unwrap().max(ceiling));
    }

    #[test]
    fn clearing_ends_a_compaction_and_its_later_steps_do_nothing() {
        let (mut a, held) = holey(MemoryPages::Huge, 12345);
        let t = a.begin_compaction(0).unwrap();
        assert_eq!(a.purge_free(&t, 0, usize::MAX), None);
        let doomed = a.take_doomed(&t);
        assert!(!doomed.is_empty());
        a.clear().unwrap();
        assert_eq!(a.relocate(&t, held[0].0), None);
        let mut runs = runs(doomed);
        assert!(a.finish_compaction(&t, &mut runs, &mut 0));
        check(&a, &Held::new(), &[]);
        assert_eq!(a.free_bytes(), 0);
        // A new one can start once there are holes again.
        assert!(a.begin_compaction(0).is_none());
    }

    #[test]
    fn an_aborted_compaction_puts_every_block_back() {
        let (mut a, mut held) = holey(MemoryPages::Memfd, 999);
        let (top, free) = (a.top, a.free_bytes());
        let t = a.begin_compaction(0).unwrap();
        assert_eq!(a.purge_free(&t, 0, usize::MAX), None);
        for h in held.iter_mut().take(100) {
            if let Some(new) = a.relocate(&t, h.0) {
                h.0 = new;
            }
        }
        let taken = a.take_doomed(&t);
        assert!(!taken.is_empty());
        a.abort_compaction(&t, taken);
        check(&a, &held, &[]);
        assert_eq!((a.top, a.free_bytes()), (top, free));
        assert!(a.begin_compaction(0).is_some(), "none is running");
    }

    #[test]
    fn a_small_gain_is_not_worth_a_compaction() {
        let mut a = Arena::new(&Backing::Memory, "small").unwrap();
        let locs: Vec<u64> = (0..1000).map(|_| a.alloc(100).unwrap()).collect();
        for l in &locs[..900] {
            a.free(*l);
        }
        assert!(a.begin_compaction(1 << 20).is_none(), "100 KB to gain");
        for l in &locs[900..] {
            a.free(*l);
        }
        assert!(a.begin_compaction(0).is_some());
        assert!(a.begin_compaction(0).is_none(), "one at a time");
    }
}
