//! Compaction: sliding live blocks down so the top of the arena goes back.
//!
//! Free blocks do not move and their neighbours are not merged, so a table
//! that shrank (records deleted, re-compressed smaller with a dictionary)
//! keeps its high-water mark with holes in it, and records of one size
//! class cannot use the holes another left. A compaction packs the live
//! blocks together in address order, in steps that each hold the table's
//! lock briefly, while readers and writers go on:
//!
//! 1. [`Arena::purge_free`] takes the free blocks off the free lists (they
//!    become *holes*: counted as free, never handed out), a batch of lists
//!    at a time, and hands them to the caller, who gathers and sorts them
//!    by offset without the lock and hands them back
//!    ([`Arena::start_slide`]), which also takes what writers left on the
//!    free lists meanwhile;
//! 2. the slide: a *scan* offset walks the arena from its start to where
//!    the top was then (`end`). [`Arena::next_block`] says what lies at the
//!    scan: a hole (passed over) or a live block, which the caller (who
//!    knows which record it is) has [`Arena::slide`] move down to the
//!    *fill* offset, and points the index at. Between fill and scan lies
//!    only free space. A block freed at or past the scan is a hole too (in
//!    `late`); one freed below the fill goes on the free lists and may be
//!    handed out again. Where the free lists have no block for a write,
//!    the write takes one at the fill, or cut from a hole the scan has yet
//!    to reach (which the scan then finds live and slides down), before
//!    the bump pointer moves past `end` ([`Arena::take_hole`]): writers
//!    never wait for space, and a table written to all along still gets
//!    its top lowered (a write past `end` keeps it where it was);
//! 3. [`Arena::finish_compaction`], once the scan reached `end`: if no
//!    writer grew the arena past `end`, the top comes down to the fill, a
//!    slice at a time, its pages given back (a file arena's file is cut
//!    short); else the space from the fill to `end` goes back on the free
//!    lists as large blocks. Holes past `end` go back on the free lists.
//!
//! [`Arena::abort_compaction`] ends one early: the space between fill and
//! scan and the holes not yet passed go back on the free lists.
//! [`Arena::clear`] ends one; the caller's later steps then do nothing.

use std::collections::{BTreeMap, VecDeque};

use super::*;

/// Holes put back on the free lists per [`Arena::finish_compaction`] call.
const UNDOOM_BATCH: usize = 16 * 1024;

/// Bytes of the top given back per [`Arena::finish_compaction`] call.
const LOWER_SLICE: u64 = 2 << 20;

/// Holes a write looks at, from the end of the slide's list and of the
/// late ones each ([`Arena::take_hole`]).
const HOLE_LOOKS: usize = 16;

/// Where a compaction is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Purging,
    Sliding,
}

/// The state of a compaction in progress.
pub(super) struct Compaction {
    id: u64,
    phase: Phase,
    /// Every offset at or past this one is still to be looked at.
    scan: u64,
    /// Where the next live block goes: `[fill, scan)` is free.
    fill: u64,
    /// The top when the slide began.
    end: u64,
    /// Free-list entries taken off the lists, by offset; those before
    /// `next` were passed.
    holes: Vec<u64>,
    next: usize,
    /// Blocks freed at or past the scan since the purge began, by offset.
    late: BTreeMap<u64, u64>,
    /// The given-back pages of holes the scan passed that the fill has not
    /// reached (start and length, by offset): still not in memory, so
    /// still counted as given back, until a block is written there.
    passed: VecDeque<(u64, u64)>,
}

/// A compaction the caller runs: see the module doc.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket {
    id: u64,
}

/// What [`Arena::next_block`] found at the scan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// A hole, passed over.
    Hole,
    /// A live block starts at this offset: the caller finds its handle
    /// and calls [`Arena::slide`].
    Live(u64),
    /// The scan reached the end: time for [`Arena::finish_compaction`].
    End,
}

static COMPACTION_SEQ: AtomicU64 = AtomicU64::new(1);

/// The bytes of a free-list entry's block that were given back.
fn punched_part(entry: u64) -> u64 {
    if entry & PUNCHED == 0 {
        return 0;
    }
    let loc = entry & !PUNCHED;
    punchable(offset(loc), block_size(loc) as u64).map_or(0, |(_, l)| l)
}

impl Arena {
    /// Starts a compaction if its free blocks are at least `min_gain`
    /// bytes and, with `share` n > 0, an n-th of the arena (a compaction
    /// gives back about what is free). `None` if not, or if one is
    /// running.
    pub fn begin_compaction(&mut self, min_gain: u64, share: u64) -> Option<Ticket> {
        if self.compaction.is_some() {
            return None;
        }
        self.close_spans();
        let need = min_gain
            .max(self.top.checked_div(share).unwrap_or(0))
            .max(1);
        if self.free_bytes < need {
            return None;
        }
        let id = COMPACTION_SEQ.fetch_add(1, Ordering::Relaxed);
        self.compaction = Some(Compaction {
            id,
            phase: Phase::Purging,
            scan: FIRST_OFFSET,
            fill: FIRST_OFFSET,
            end: 0,
            holes: Vec::new(),
            next: 0,
            late: BTreeMap::new(),
            passed: VecDeque::new(),
        });
        Some(Ticket { id })
    }

    /// The running compaction, if it is `t`'s.
    fn compaction_of(&mut self, t: &Ticket) -> Option<&mut Compaction> {
        self.compaction.as_mut().filter(|c| c.id == t.id)
    }

    /// Step 1: takes up to `budget` entries off the free lists of classes
    /// `from..`, and hands them to the caller (who keeps
    /// them, without the lock, until [`Arena::start_slide`]); returns the
    /// class to go on from, or `None` when every class is done (or `t` is
    /// not running: then nothing was taken).
    pub fn purge_free(
        &mut self,
        t: &Ticket,
        from: usize,
        budget: usize,
    ) -> (Vec<u64>, Option<usize>) {
        if !matches!(self.compaction_of(t), Some(c) if c.phase == Phase::Purging) {
            return (Vec::new(), None);
        }
        let (mut class, mut gone) = (from, Vec::new());
        while class < self.free.len() && gone.len() < budget {
            let list = &mut self.free[class];
            let take = (budget - gone.len()).min(list.len());
            let bytes = (take * class_size(class)) as u64;
            gone.extend(list.drain(list.len() - take..));
            self.free_bytes -= bytes;
            self.doomed_bytes += bytes;
            if list.is_empty() {
                self.mark_empty(class);
                class += 1;
            }
        }
        (gone, (class < self.free.len()).then_some(class))
    }

    /// Starts the slide with the holes [`Arena::purge_free`] handed out,
    /// sorted by offset; what writers left on the free lists meanwhile
    /// (the rest of blocks they cut) joins them. If `t` is not running any
    /// more, they go back on the free lists (after [`Arena::clear`], which
    /// forgot them, they are dropped).
    pub fn start_slide(&mut self, t: &Ticket, sorted: Vec<u64>) {
        debug_assert!(sorted.windows(2).all(|w| offset(w[0]) < offset(w[1])));
        let Some(c) = self.compaction_of(t).filter(|c| c.phase == Phase::Purging) else {
            if self.compaction.is_none() && self.doomed_bytes > 0 {
                for e in sorted {
                    self.undoom_one(e);
                }
            }
            return;
        };
        c.phase = Phase::Sliding;
        let top = self.top;
        let mut left = Vec::new();
        let mut class = 0;
        while let Some(c) = self.smallest_free(class) {
            left.append(&mut self.free[c]);
            self.mark_empty(c);
            class = c + 1;
        }
        let bytes: u64 = left.iter().map(|&e| block_size(e) as u64).sum();
        self.free_bytes -= bytes;
        self.doomed_bytes += bytes;
        let c = self.compaction.as_mut().expect("checked above");
        c.holes = sorted;
        c.late.extend(left.into_iter().map(|e| (offset(e), e)));
        c.end = top;
    }

    /// Step 2: what lies at the scan. A hole is passed over (its pages, if
    /// given back, count as used again once the fill reaches them and a
    /// block may be written there: [`Arena::fill_to`]).
    pub fn next_block(&mut self, t: &Ticket) -> Next {
        let Some(c) = self.compaction_of(t).filter(|c| c.phase == Phase::Sliding) else {
            return Next::End;
        };
        if c.scan >= c.end {
            return Next::End;
        }
        let at = c.scan;
        let hole = match c.holes.get(c.next) {
            Some(&e) if offset(e) == at => {
                c.next += 1;
                Some(e)
            }
            _ => c.late.remove(&at),
        };
        let Some(e) = hole else {
            return Next::Live(at);
        };
        c.scan += block_size(e) as u64;
        if e & PUNCHED != 0 {
            let loc = e & !PUNCHED;
            if let Some(pages) = punchable(offset(loc), block_size(loc) as u64) {
                c.passed.push_back(pages);
            }
        }
        Next::Hole
    }

    /// Moves the running compaction's fill up by `size` bytes (a block is
    /// written below it): the given-back pages of passed holes that the
    /// bytes below the new fill touch count as used again.
    fn fill_to(&mut self, size: u64) {
        let Some(c) = self.compaction.as_mut() else {
            return;
        };
        c.fill += size;
        let reach = c.fill.div_ceil(PAGE) * PAGE;
        while let Some(&(start, len)) = c.passed.front() {
            if start >= reach {
                break;
            }
            let cut = (start + len).min(reach);
            self.punched -= cut - start;
            if cut == start + len {
                c.passed.pop_front();
            } else if let Some(front) = c.passed.front_mut() {
                *front = (cut, start + len - cut);
            }
        }
    }

    /// The given-back pages of passed holes at or past `from`, no longer
    /// counted (the top comes down over them, or the space goes back on
    /// the free lists, which count what they give back themselves).
    fn forget_passed_from(&mut self, from: u64) {
        let Some(c) = self.compaction.as_mut() else {
            return;
        };
        while let Some(&(start, len)) = c.passed.back() {
            if start + len <= from {
                break;
            }
            let keep = from.saturating_sub(start);
            self.punched -= len - keep;
            if keep == 0 {
                c.passed.pop_back();
            } else if let Some(back) = c.passed.back_mut() {
                *back = (start, keep);
            }
        }
    }

    /// Step 2, before a batch of [`Arena::slide`]s, under the read lock:
    /// faults in the pages of the first `len` bytes of the free space the
    /// slide writes to next. Those given back to the kernel (a huge page
    /// is zeroed when it faults in, some hundreds of microseconds) would
    /// fault under the write lock otherwise.
    pub fn prefault_slide(&self, t: &Ticket, len: u64) {
        let Some(c) = self.compaction.as_ref() else {
            return;
        };
        if c.id != t.id || c.phase != Phase::Sliding || c.fill >= c.scan {
            return;
        }
        let start = c.fill / PAGE * PAGE;
        let end = c.scan.min(c.fill + len).div_ceil(PAGE) * PAGE;
        self.populate(start, end - start);
    }

    /// Step 2: moves the live block `loc`, at the scan, down to the fill;
    /// returns its new handle (the same class). `None` (nothing moves) if
    /// `loc` is not at the scan or `t` is not running.
    pub fn slide(&mut self, t: &Ticket, loc: u64) -> Option<u64> {
        let c = self
            .compaction_of(t)
            .filter(|c| c.phase == Phase::Sliding)?;
        if offset(loc) != c.scan || c.scan >= c.end {
            return None;
        }
        let size = block_size(loc) as u64;
        let (from, to) = (c.scan, c.fill);
        c.scan += size;
        self.fill_to(size);
        if from != to {
            let (from, to) = (from as usize, to as usize);
            self.bytes_mut().copy_within(from..from + size as usize, to);
        }
        Some(to | (loc & !OFFSET_MASK))
    }

    /// Where [`Arena::free`] puts a block during a compaction: a hole if
    /// it lies at or past the scan. Gives the entry back otherwise.
    pub(super) fn doom(&mut self, entry: u64) -> Option<u64> {
        let size = block_size(entry) as u64;
        match &mut self.compaction {
            Some(c) if offset(entry) >= c.scan => {
                c.late.insert(offset(entry), entry);
                self.doomed_bytes += size;
                None
            }
            _ => Some(entry),
        }
    }

    /// During the slide (and the lowering of the top after it), a block
    /// of class `class` for a write that found no free block: at the fill,
    /// where the slide would put the next live block, if the free space
    /// between fill and scan holds it; else cut from one of the holes at
    /// the highest offsets (the last the scan reaches), whole if at most
    /// `fit` classes larger, else its front, the rest staying a hole (a
    /// hole whose pages were given back is only taken whole), which the
    /// scan later finds live and slides down like any other. `None`
    /// outside the slide, or if nothing looked at is large enough.
    pub(super) fn take_hole(&mut self, class: usize, fit: usize) -> Option<u64> {
        let size = class_size(class) as u64;
        let c = self
            .compaction
            .as_mut()
            .filter(|c| c.phase == Phase::Sliding)?;
        if c.fill + size <= c.scan {
            let at = c.fill;
            self.fill_to(size);
            self.doomed_bytes -= size;
            self.live += size;
            return Some(at | ((class as u64) << CLASS_SHIFT));
        }
        let fits = |e: u64| {
            let k = ((e & !PUNCHED) >> CLASS_SHIFT) as usize;
            k >= class && (e & PUNCHED == 0 || k <= class + fit)
        };
        let listed = (c.next..c.holes.len())
            .rev()
            .take(HOLE_LOOKS)
            .find(|&i| fits(c.holes[i]));
        let e = match listed {
            Some(i) => c.holes.remove(i),
            None => {
                let (&at, _) = c
                    .late
                    .iter()
                    .rev()
                    .take(HOLE_LOOKS)
                    .find(|(_, &e)| fits(e))?;
                c.late.remove(&at)?
            }
        };
        let k = ((e & !PUNCHED) >> CLASS_SHIFT) as usize;
        self.punched -= punched_part(e);
        self.doomed_bytes -= class_size(k) as u64;
        if k <= class + fit {
            self.live += class_size(k) as u64;
            return Some(e & !PUNCHED);
        }
        let start = offset(e);
        self.live += size;
        let c = self.compaction.as_mut().expect("taken from above");
        for (at, rest) in cut(start + size, start + class_size(k) as u64) {
            c.late.insert(at, at | ((rest as u64) << CLASS_SHIFT));
            self.doomed_bytes += class_size(rest) as u64;
        }
        Some(start | ((class as u64) << CLASS_SHIFT))
    }

    /// Step 3, called until it returns true, once [`Arena::next_block`]
    /// said `End`: lowers the top by up to [`LOWER_SLICE`] bytes a call,
    /// giving its pages back (a file arena's file is cut short at the
    /// end), or, if writers placed blocks past the old top, puts the space
    /// between fill and that top back on the free lists; the last call
    /// puts back the holes past it, shrinks the free lists and ends the
    /// compaction.
    pub fn finish_compaction(&mut self, t: &Ticket) -> bool {
        let top = self.top;
        let Some(c) = self.compaction_of(t).filter(|c| c.phase == Phase::Sliding) else {
            return true;
        };
        debug_assert!(c.scan >= c.end);
        let (fill, end) = (c.fill, c.end);
        if top == end && fill < top {
            let lo = fill.max(top.saturating_sub(LOWER_SLICE));
            c.end = lo;
            c.scan = lo;
            self.top = lo;
            self.forget_passed_from(lo);
            self.doomed_bytes -= top - lo;
            if !matches!(self.pages, Pages::File(..)) {
                let (start, stop) = (lo.div_ceil(PAGE) * PAGE, top.div_ceil(PAGE) * PAGE);
                if stop > start {
                    let _ = self.give_back(start, stop - start);
                }
            }
            if lo > fill {
                return false;
            }
        } else if fill < end {
            self.forget_passed_from(fill);
            self.doomed_bytes -= end - fill;
            self.free_range(fill, end, RestPages::GiveBack);
        }
        if matches!(self.pages, Pages::File(..)) {
            // Best effort: a file that stays long only keeps its blocks.
            let _ = self.cut_file((self.top.div_ceil(PAGE) * PAGE).max(INITIAL_BYTES));
        }
        // The holes past the old top go back, a batch a call (those before
        // it were all passed).
        let c = self.compaction.as_mut().expect("checked above");
        c.end = 0;
        let mut batch = Vec::new();
        while batch.len() < UNDOOM_BATCH {
            let Some((_, e)) = c.late.pop_first() else {
                break;
            };
            batch.push(e);
        }
        let done = c.late.is_empty();
        for e in batch {
            self.undoom_one(e);
        }
        if !done {
            return false;
        }
        self.compaction = None;
        debug_assert_eq!(self.doomed_bytes, 0);
        self.shrink_lists();
        true
    }

    /// Ends a compaction early: the space between fill and scan and every
    /// hole not passed go back on the free lists.
    pub fn abort_compaction(&mut self, t: &Ticket) {
        if self.compaction_of(t).is_some() {
            self.abort_running();
        }
    }

    /// [`Arena::abort_compaction`] of whichever compaction runs (after its
    /// job failed).
    pub fn abort_running(&mut self) {
        let Some(c) = &self.compaction else {
            return;
        };
        let (fill, scan, purging) = (c.fill, c.scan, c.phase == Phase::Purging);
        self.forget_passed_from(fill);
        let c = self.compaction.take().expect("checked above");
        if scan > fill {
            self.doomed_bytes -= scan - fill;
            self.free_range(fill, scan, RestPages::GiveBack);
        }
        for e in c.late.into_values().chain(c.holes.into_iter().skip(c.next)) {
            self.undoom_one(e);
        }
        // While purging, the job holds the holes it took: if it cannot
        // hand them back, they stay counted as free, never reused.
        debug_assert!(purging || self.doomed_bytes == 0);
    }

    /// Puts a hole back on its free list as it is.
    fn undoom_one(&mut self, e: u64) {
        let class = ((e & !PUNCHED) >> CLASS_SHIFT) as usize;
        self.doomed_bytes -= class_size(class) as u64;
        self.push_free(class, e);
    }

    /// Gives back what the free lists no longer use: after a compaction
    /// emptied them, they held a fraction of their capacity.
    fn shrink_lists(&mut self) {
        for list in &mut self.free {
            if list.capacity() > 4 * list.len() + 16 {
                list.shrink_to(2 * list.len());
            }
        }
    }

    /// Cuts a file arena's file, and its mapping, to `len` bytes (a
    /// multiple of the page size, at least the top): the disk blocks past
    /// it go back to the file system. Growing again reserves them anew.
    fn cut_file(&mut self, len: u64) -> io::Result<()> {
        debug_assert!(len >= self.top && len % PAGE == 0);
        let Pages::File(file, _, map) = &mut self.pages else {
            return Ok(());
        };
        if len >= map.len() as u64 {
            return Ok(());
        }
        // SAFETY: the mapping shrinks (mremap never moves a shrinking
        // mapping); no reference into it exists because the caller holds
        // the arena `&mut`, and the bytes cut off hold no block.
        unsafe { map.remap(len as usize, RemapOptions::new())? };
        file.set_len(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::Rng;

    /// Live blocks of a test arena: handle, fill byte, and the bytes
    /// filled.
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

    /// Every byte of `[FIRST_OFFSET, top)` is in exactly one live block,
    /// free block (on a free list, a hole of the compaction, or `taken` by
    /// the job) or the space between fill and scan; every live block holds
    /// its bytes, and the counts are exact.
    fn check(a: &Arena, held: &Held, taken: &[u64]) {
        let free = a.free.iter().flatten().copied();
        let (holes, gap, passed) =
            match &a.compaction {
                Some(c) => {
                    let holes: Vec<u64> = c.holes[c.next..]
                        .iter()
                        .chain(c.late.values())
                        .copied()
                        .collect();
                    let passed: u64 = c.passed.iter().map(|&(_, len)| len).sum();
                    assert!(c.passed.iter().all(|&(start, len)| start >= c.fill
                        && start + len <= c.scan.div_ceil(PAGE) * PAGE));
                    (holes, (c.fill < c.scan).then_some((c.fill, c.scan)), passed)
                }
                None => (Vec::new(), None, 0),
            };
        let free: Vec<u64> = free.chain(holes).chain(taken.iter().copied()).collect();
        let mut spans: Vec<(u64, u64)> = held
            .iter()
            .map(|&(l, _, _)| l)
            .chain(free.iter().map(|&e| e & !PUNCHED))
            .map(|l| (offset(l), offset(l) + block_size(l) as u64))
            .chain(gap)
            .chain(a.spans.iter().flatten().copied())
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
            free.iter().map(|&e| punched_part(e)).sum::<u64>() + passed
        );
    }

    /// Runs every step of a compaction; `meanwhile` plays a writer between
    /// the steps (with the holes the job holds while it sorts them).
    fn compact(
        a: &mut Arena,
        held: &mut Held,
        mut meanwhile: impl FnMut(&mut Arena, &mut Held, &[u64]),
    ) {
        let t = a.begin_compaction(0, 8).expect("worth compacting");
        let (mut holes, mut class) = (Vec::new(), Some(0));
        while let Some(from) = class {
            let (mut gone, next) = a.purge_free(&t, from, 1000);
            holes.append(&mut gone);
            class = next;
            meanwhile(a, held, &holes);
        }
        holes.sort_unstable_by_key(|&e| offset(e));
        a.start_slide(&t, holes);
        let mut steps = 0;
        loop {
            match a.next_block(&t) {
                Next::End => break,
                Next::Hole => {}
                Next::Live(at) => {
                    let i = held.iter().position(|h| offset(h.0) == at).unwrap();
                    held[i].0 = a.slide(&t, held[i].0).unwrap();
                }
            }
            steps += 1;
            if steps % 500 == 0 {
                meanwhile(a, held, &[]);
            }
        }
        while !a.finish_compaction(&t) {
            meanwhile(a, held, &[]);
        }
        assert!(a.compaction.is_none());
    }

    #[test]
    fn compaction_packs_the_blocks_and_gives_the_top_back() {
        for pages in [MemoryPages::Huge, MemoryPages::Memfd] {
            let (mut a, mut held) = holey(pages, 0x2545_f491_4f6c_dd1d);
            check(&a, &held, &[]);
            let (top, live) = (a.top, a.live_bytes());
            assert!(top > 3 * live, "{pages:?}: the test needs holes");
            compact(&mut a, &mut held, |_, _, _| {});
            check(&a, &held, &[]);
            // Packed: no byte between the blocks.
            assert_eq!(a.top, FIRST_OFFSET + live, "{pages:?}");
            assert_eq!((a.free_bytes(), a.punched), (0, 0));
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
        for seed in [0x9e37_79b9_7f4a_7c15, 3, 4] {
            let (mut a, mut held) = holey(MemoryPages::Huge, seed);
            let live = a.live_bytes();
            let mut rng = Rng(seed ^ 77);
            compact(&mut a, &mut held, |a, held, taken| {
                // Frees anywhere (at or past the scan: holes) and
                // allocations, some large enough to grow the arena.
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
            assert!(
                a.used_bytes() < 3 * live,
                "{seed}: {} for {live}",
                a.used_bytes()
            );
        }
    }

    #[test]
    fn writes_during_the_slide_fill_holes_and_the_top_still_comes_down() {
        for seed in [5, 6, 7] {
            let (mut a, mut held) = holey(MemoryPages::Huge, seed);
            let mut rng = Rng(seed ^ 99);
            let mut wrote = 0;
            compact(&mut a, &mut held, |a, held, taken| {
                for _ in 0..20 {
                    let r = rng.next();
                    let loc = a.alloc(1 + (r >> 20) as usize % 900).unwrap();
                    a.get_mut(loc, block_size(loc)).unwrap().fill(r as u8);
                    held.push((loc, r as u8, block_size(loc)));
                    wrote += 1;
                }
                check(a, held, taken);
            });
            check(&a, &held, &[]);
            assert!(wrote > 1000, "{seed}: the writes ran during the slide");
            // Packed, the writes' blocks with the rest: without holes to
            // write into, the writes grew the arena past the old top and
            // the space below it stayed behind as free blocks.
            assert_eq!(a.free_bytes(), 0, "{seed}");
            assert_eq!(a.top, FIRST_OFFSET + a.live_bytes(), "{seed}");
        }
    }

    #[test]
    fn given_back_pages_count_as_used_only_once_the_slide_writes_there() {
        let mut a = Arena::with_pages(&Backing::Memory, "passed", MemoryPages::Huge).unwrap();
        let big = a.alloc(4 * PUNCH_MIN).unwrap();
        let mut held = Held::new();
        for i in 0..200u8 {
            let loc = a.alloc(1000).unwrap();
            a.get_mut(loc, block_size(loc)).unwrap().fill(i);
            held.push((loc, i, block_size(loc)));
        }
        a.free(big);
        let used = a.used_bytes();
        assert!(
            a.punched > 3 * PUNCH_MIN as u64,
            "the test needs pages given back"
        );
        let t = a.begin_compaction(0, 8).unwrap();
        let (mut holes, _) = a.purge_free(&t, 0, usize::MAX);
        holes.sort_unstable_by_key(|&e| offset(e));
        a.start_slide(&t, holes);
        assert_eq!(a.next_block(&t), Next::Hole);
        assert_eq!(
            a.used_bytes(),
            used,
            "passed over, nothing written there yet"
        );
        check(&a, &held, &[]);
        // Each block slid into the hole's space brings back the pages it
        // is written to, and no more.
        for _ in 0..100 {
            let Next::Live(at) = a.next_block(&t) else {
                panic!("a live block")
            };
            let i = held.iter().position(|h| offset(h.0) == at).unwrap();
            held[i].0 = a.slide(&t, held[i].0).unwrap();
            let fill = a.compaction.as_ref().unwrap().fill;
            assert!(a.used_bytes() <= used + fill.div_ceil(PAGE) * PAGE);
            check(&a, &held, &[]);
        }
        while let Next::Live(at) = a.next_block(&t) {
            let i = held.iter().position(|h| offset(h.0) == at).unwrap();
            held[i].0 = a.slide(&t, held[i].0).unwrap();
        }
        while !a.finish_compaction(&t) {}
        check(&a, &held, &[]);
        assert_eq!((a.top, a.punched), (FIRST_OFFSET + a.live_bytes(), 0));
    }

    #[test]
    fn clearing_ends_a_compaction_and_its_later_steps_do_nothing() {
        let (mut a, held) = holey(MemoryPages::Huge, 12345);
        let t = a.begin_compaction(0, 8).unwrap();
        let (mut holes, next) = a.purge_free(&t, 0, usize::MAX);
        assert_eq!(next, None);
        assert!(!holes.is_empty());
        holes.sort_unstable_by_key(|&e| offset(e));
        a.clear().unwrap();
        a.start_slide(&t, holes);
        assert_eq!(a.next_block(&t), Next::End);
        assert_eq!(a.slide(&t, held[0].0), None);
        assert!(a.finish_compaction(&t));
        check(&a, &Held::new(), &[]);
        assert_eq!(a.free_bytes(), 0);
        // A new one can start once there are holes again.
        assert!(a.begin_compaction(0, 8).is_none());
    }

    #[test]
    fn an_aborted_compaction_puts_every_block_back() {
        let (mut a, mut held) = holey(MemoryPages::Memfd, 999);
        let (top, free) = (a.top, a.free_bytes());
        let t = a.begin_compaction(0, 8).unwrap();
        let (mut holes, next) = a.purge_free(&t, 0, usize::MAX);
        assert_eq!(next, None);
        holes.sort_unstable_by_key(|&e| offset(e));
        a.start_slide(&t, holes);
        for _ in 0..3000 {
            if let Next::Live(at) = a.next_block(&t) {
                let i = held.iter().position(|h| offset(h.0) == at).unwrap();
                held[i].0 = a.slide(&t, held[i].0).unwrap();
            }
        }
        check(&a, &held, &[]);
        a.abort_compaction(&t);
        check(&a, &held, &[]);
        assert_eq!((a.top, a.free_bytes()), (top, free));
        assert!(a.begin_compaction(0, 8).is_some(), "none is running");
    }

    #[test]
    fn a_small_gain_is_not_worth_a_compaction() {
        let mut a = Arena::new(&Backing::Memory, "small").unwrap();
        let locs: Vec<u64> = (0..1000).map(|_| a.alloc(100).unwrap()).collect();
        for l in &locs[..900] {
            a.free(*l);
        }
        assert!(a.begin_compaction(1 << 20, 8).is_none(), "100 KB to gain");
        for l in &locs[900..] {
            a.free(*l);
        }
        assert!(a.begin_compaction(0, 8).is_some());
        assert!(a.begin_compaction(0, 8).is_none(), "one at a time");
    }
}
