//! The arena: one mmap'd region per table that holds its records.
//!
//! Backing. A memory arena is private anonymous memory on transparent
//! huge pages (see [`anon`]: 2 MiB pages where the kernel has them, so a
//! table's pages fault in 512 at a time), between guard pages so that it
//! stays a mapping of its own, named `heft:<table>` where the kernel names
//! anonymous memory (smaps then shows `[anon:heft:<table>]`) and listed by
//! address in [`anon::live`] everywhere. Where the kernel has no huge pages
//! for it (`MADV_HUGEPAGE` refused), it is a memfd named `heft:<table>`
//! (`/memfd:heft:<table> (deleted)`) instead. Either way its pages live in
//! RAM and can only be swapped, never written back to a file.
//! A file arena maps a file `heft-<ospid>-<table>-<n>.arena`
//! (mode 0600) in a directory the user names, for data larger than RAM; the
//! file is removed when the arena is dropped, and files left by a VM that
//! died are removed by the next arena created in that directory.
//!
//! Allocation. Blocks come in size classes: 2-byte steps up to 64 bytes,
//! 4-byte steps up to 256, then eight classes per doubling (at most 12.5%
//! slack). A freed block goes on its class's free list and is handed out
//! again before the arena grows, so a table that keeps overwriting the
//! same keys stays the same size. Where no block of the class (or a little
//! larger) is free, the smallest larger free block is split: the new block
//! is its front and the rest goes back on the free lists as blocks of the
//! largest classes that fit it. So records that shrink (re-compressed with
//! a new dictionary, overwritten by smaller values) fill the space the
//! larger ones left instead of growing the arena. Free neighbours are not
//! merged as they are freed; a compaction ([`compact`]) moves records down
//! into the holes, merges what is left and lowers the top.
//! Freed blocks of a memory arena that span whole pages give those pages
//! back to the kernel (`MADV_DONTNEED`, or punched out of the memfd; a huge
//! page with a hole in it is split).
//!
//! The region grows by doubling (at most 1 GiB a step) with `mremap`, so it
//! may move: callers hold no pointers into it across a `&mut` borrow, which
//! the table's lock guarantees.

use std::ffi::CString;
use std::fs::{self, File};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use memmap2::{Advice, MmapMut, MmapOptions, RemapOptions};

pub mod anon;
mod compact;
mod tiered;
use anon::Region;
pub use compact::{Next, Ticket};
pub use tiered::{start_writeback, FileTier, Written};

/// What becomes of the pages of free space put on the free lists
/// ([`Arena::free_range`]).
#[derive(Clone, Copy)]
enum RestPages {
    /// They stay as they are, in use.
    Kept,
    /// They were given back already: the blocks say so, and count them.
    GivenBack,
    /// Each block large enough gives them back now ([`Arena::punch`]).
    GiveBack,
}

/// The smallest mapping an arena starts with.
const INITIAL_BYTES: u64 = 64 * 1024;
/// The largest single growth step.
const MAX_STEP: u64 = 1 << 30;
/// Offsets below this are never handed out, so 0 can mean "no record".
const FIRST_OFFSET: u64 = 8;
/// Freed blocks at least this large return their whole pages to the kernel.
const PUNCH_MIN: usize = 64 * 1024;
/// Runs of freed blocks merged at once ([`Arena::merge_freed`]).
const SPANS: usize = 2;
const PAGE: u64 = 4096;
/// Marks a free-list entry whose pages were punched out.
const PUNCHED: u64 = 1 << 63;
/// Marks the handle of a block in a tiered arena's file ([`tiered`]):
/// above the size class's 9 bits, below [`PUNCHED`].
pub const IN_FILE: u64 = 1 << 57;
/// The bytes of a block that [`Arena::prefetch`] asks for.
const PREFETCHED: usize = 32;
/// A block handle ("loc") is its offset with its size class above this bit.
const CLASS_SHIFT: u32 = 48;
const OFFSET_MASK: u64 = (1 << CLASS_SHIFT) - 1;
/// When a class has no free block, blocks up to this many classes larger
/// are reused whole before the arena grows: about 8 bytes larger for a
/// block of at most 256 bytes, 25% for larger ones.
fn fit_classes(class: usize) -> usize {
    match class {
        c if c < FINE => 4,
        _ => 2,
    }
}

/// The byte offset of a block handle.
pub fn offset(loc: u64) -> u64 {
    loc & OFFSET_MASK
}

/// The bytes a block handle's block occupies.
pub fn block_size(loc: u64) -> usize {
    class_size(((loc & !(PUNCHED | IN_FILE)) >> CLASS_SHIFT) as usize)
}

/// True for the handle of a block in a tiered arena's file.
#[inline]
pub fn in_file(loc: u64) -> bool {
    loc & IN_FILE != 0
}

/// Where an arena keeps its pages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backing {
    /// Anonymous shared memory (memfd): RAM first, swap second.
    Memory,
    /// A file in this directory.
    File(PathBuf),
    /// Memory for up to this many bytes of records, then a file in this
    /// directory for the records read least ([`tiered`]).
    Tiered(PathBuf, u64),
}

/// Classes of 2-byte steps (blocks of 2..=64 bytes): most records of
/// small terms are 15-40 bytes, and 4-byte steps cost them 1.5 bytes a
/// record on average (the 100-tuple record of `mix bench` with a
/// dictionary: 18 bytes in a 20-byte block).
const FINE: usize = 32;
/// Then 4-byte steps up to 256 bytes.
const SMALL: usize = FINE + (256 - 64) / 4;

/// Number of size classes; enough for blocks up to 2^48 bytes.
const CLASSES: usize = SMALL + 40 * 8;

/// The size class of a block of `len` bytes.
pub fn class_of(len: usize) -> usize {
    let len = len.max(1);
    if len <= 64 {
        return len.div_ceil(2) - 1;
    }
    if len <= 256 {
        return FINE + (len - 64).div_ceil(4) - 1;
    }
    let p = (usize::BITS - 1 - (len - 1).leading_zeros()) as usize; // 2^p < len <= 2^(p+1)
    let step = 1usize << (p - 3);
    let sub = (len - (1 << p)).div_ceil(step) - 1;
    SMALL + (p - 8) * 8 + sub
}

/// The largest class whose blocks are at most `len` bytes (`len` even and
/// at least 2).
fn floor_class(len: usize) -> usize {
    let c = class_of(len);
    if class_size(c) == len {
        c
    } else {
        c - 1
    }
}

/// The free bytes `[start, end)` (an even length) as blocks of the
/// largest classes that fit, in order: each block's offset and class
/// (every even size up to 64 is a class, so nothing is left over).
fn cut(start: u64, end: u64) -> impl Iterator<Item = (u64, usize)> {
    let mut at = start;
    std::iter::from_fn(move || {
        (at < end).then(|| {
            let class = floor_class((end - at) as usize);
            let block = (at, class);
            at += class_size(class) as u64;
            block
        })
    })
}

/// The bytes of a span of merged freed blocks (0: none).
fn span_len(span: Option<(u64, u64)>) -> u64 {
    span.map_or(0, |(start, end)| end - start)
}

/// The number of bytes a block of class `class` occupies.
pub fn class_size(class: usize) -> usize {
    if class < FINE {
        return (class + 1) * 2;
    }
    if class < SMALL {
        return 64 + (class - FINE + 1) * 4;
    }
    let p = (class - SMALL) / 8 + 8;
    let sub = (class - SMALL) % 8;
    (1 << p) + (sub + 1) * (1 << (p - 3))
}

static FILE_SEQ: AtomicU64 = AtomicU64::new(0);

/// Where a live arena's pages are, and its mapping.
enum Pages {
    /// Anonymous memory on huge pages.
    Anon(Region),
    /// A memfd: the fallback for memory arenas.
    Memfd(File, MmapMut),
    /// A file of the arena's own at this path.
    File(File, PathBuf, MmapMut),
}

impl Pages {
    /// The whole mapping.
    fn bytes(&self) -> &[u8] {
        match self {
            Pages::Anon(r) => r,
            Pages::Memfd(_, m) | Pages::File(_, _, m) => m,
        }
    }
}

/// How a memory arena's pages are obtained.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MemoryPages {
    /// Anonymous huge pages, else a memfd.
    Huge,
    /// A memfd always (to test the fallback).
    #[cfg(test)]
    Memfd,
}

/// Set once the kernel refused huge pages for anonymous memory: memory
/// arenas are memfds from then on.
static HUGE_REFUSED: AtomicBool = AtomicBool::new(false);

/// An mmap'd region with a size-class allocator.
pub struct Arena {
    pages: Pages,
    /// Bytes of the region handed out so far (the bump pointer).
    top: u64,
    /// Free blocks by size class: handles, flagged [`PUNCHED`] where the
    /// block's whole pages were given back.
    free: Vec<Vec<u64>>,
    /// One bit per size class whose free list is not empty.
    nonempty: [u64; CLASSES.div_ceil(64)],
    /// Bytes in blocks currently holding records.
    live: u64,
    /// Bytes in blocks on free lists.
    free_bytes: u64,
    /// Bytes of freed blocks whose pages were given back to the kernel.
    punched: u64,
    /// A compaction in progress ([`compact`]).
    compaction: Option<compact::Compaction>,
    /// Bytes of free blocks a compaction took off the free lists.
    doomed_bytes: u64,
    /// Runs of freed blocks that lie side by side, merged as they are
    /// freed (`[start, end)`, counted in `free_bytes`, kept off the free
    /// lists): see [`Arena::merge_freed`].
    spans: [Option<(u64, u64)>; SPANS],
    /// A tiered arena's file, for the records memory does not keep.
    file_tier: Option<Box<tiered::Tier>>,
}

impl Arena {
    /// Creates an empty arena. `label` names it in /proc/PID/maps (a memfd
    /// name, or part of the file name) and is sanitized to `[A-Za-z0-9_.-]`.
    pub fn new(backing: &Backing, label: &str) -> io::Result<Arena> {
        Arena::with_pages(backing, label, MemoryPages::Huge)
    }

    pub(crate) fn with_pages(
        backing: &Backing,
        label: &str,
        memory: MemoryPages,
    ) -> io::Result<Arena> {
        let label = sanitize(label);
        let name =
            CString::new(format!("heft:{label}")).map_err(|_| io::ErrorKind::InvalidInput)?;
        let huge = memory == MemoryPages::Huge && !HUGE_REFUSED.load(Ordering::Relaxed);
        let pages = match backing {
            Backing::Memory if huge => match Region::new(name.clone(), INITIAL_BYTES as usize) {
                Ok(region) => Pages::Anon(region),
                Err(e) => {
                    // EINVAL: this kernel has no huge pages for anonymous
                    // memory; other errors (out of memory) may pass.
                    if e.raw_os_error() == Some(libc::EINVAL) {
                        HUGE_REFUSED.store(true, Ordering::Relaxed);
                    }
                    memfd_pages(&name)?
                }
            },
            Backing::Memory => memfd_pages(&name)?,
            Backing::Tiered(dir, budget) => {
                let mut arena = Arena::with_pages(&Backing::Memory, &label, memory)?;
                arena.file_tier = Some(Box::new(tiered::Tier::new(
                    Arena::with_pages(&Backing::File(dir.clone()), &label, memory)?,
                    *budget,
                )?));
                return Ok(arena);
            }
            Backing::File(dir) => {
                remove_stale_files(dir);
                // Created exclusively (a link planted there is not
                // followed), under a name no one can take in advance.
                let seq = FILE_SEQ.fetch_add(1, Ordering::Relaxed);
                let r = u64::from_le_bytes(crate::files::random_bytes()?);
                let path = dir.join(format!(
                    "heft-{}-{label}-{seq}-{r:016x}.arena",
                    std::process::id()
                ));
                let file = crate::files::create_new(&path, crate::files::FILE_MODE)?;
                match map_file(&file, INITIAL_BYTES, true).and_then(read_randomly) {
                    Ok(map) => Pages::File(file, path, map),
                    Err(e) => {
                        let _ = fs::remove_file(&path);
                        return Err(e);
                    }
                }
            }
        };
        let arena = Arena {
            pages,
            top: FIRST_OFFSET,
            free: Vec::new(),
            nonempty: [0; CLASSES.div_ceil(64)],
            live: 0,
            free_bytes: 0,
            punched: 0,
            compaction: None,
            doomed_bytes: 0,
            spans: [None; SPANS],
            file_tier: None,
        };
        Ok(arena)
    }

    /// Allocates a block for `len` bytes; returns its handle (offset and
    /// size class, see [`offset`]), never 0. A free block of the class, or
    /// of one a little larger ([`fit_classes`]), is reused whole; else the
    /// front of the shortest span of merged freed blocks that holds it is
    /// taken ([`Arena::merge_freed`]); else the smallest larger free block
    /// is split, its front taken and the rest put back as free blocks;
    /// during a compaction, the space it frees comes next
    /// ([`Arena::take_hole`]); only then does the arena grow.
    /// Fails with the I/O error of growing the backing (for a file arena,
    /// `ENOSPC` when the disk is full), leaving the arena as it was.
    /// A tiered arena places the block in its file instead once memory
    /// holds its whole share ([`tiered`]).
    pub fn alloc(&mut self, len: usize) -> io::Result<u64> {
        if let Some(t) = self.file_tier.as_deref_mut() {
            if t.memory_full(self.live, len) {
                return t.alloc(len);
            }
        }
        self.alloc_within(len, fit_classes(class_of(len)))
    }

    /// A block of class `class` from the front of the smallest span of
    /// merged freed blocks that holds one.
    fn take_span(&mut self, class: usize) -> Option<u64> {
        let size = class_size(class) as u64;
        let i = (0..SPANS)
            .filter(|&i| span_len(self.spans[i]) >= size)
            .min_by_key(|&i| span_len(self.spans[i]))?;
        let (start, end) = self.spans[i]?;
        self.spans[i] = (start + size < end).then_some((start + size, end));
        self.free_bytes -= size;
        self.live += size;
        Some(start | ((class as u64) << CLASS_SHIFT))
    }

    /// Puts span `i` of merged freed blocks (if any) on the free lists, cut
    /// into blocks ([`cut`]), their whole pages given back.
    fn close_span(&mut self, i: usize) {
        if let Some((start, end)) = self.spans[i].take() {
            self.free_bytes -= end - start;
            self.free_range(start, end, RestPages::GiveBack);
        }
    }

    /// Puts every span of merged freed blocks on the free lists.
    fn close_spans(&mut self) {
        (0..SPANS).for_each(|i| self.close_span(i));
    }

    /// [`Arena::alloc`], reusing whole only blocks at most `fit` classes
    /// larger than `len` needs.
    fn alloc_within(&mut self, len: usize, fit: usize) -> io::Result<u64> {
        let class = class_of(len);
        debug_assert!(class < CLASSES);
        let free = self.smallest_free(class);
        if let Some(c) = free.filter(|&c| c <= class + fit) {
            return Ok(self.take_for(c, class, fit));
        }
        if let Some(loc) = self.take_span(class) {
            return Ok(loc);
        }
        if let Some(c) = free {
            return Ok(self.take_for(c, class, fit));
        }
        if let Some(loc) = self.take_hole(class, fit) {
            return Ok(loc);
        }
        let size = class_size(class) as u64;
        let off = self.top;
        let end = off.checked_add(size).ok_or(io::ErrorKind::OutOfMemory)?;
        if end > OFFSET_MASK {
            return Err(io::ErrorKind::OutOfMemory.into());
        }
        if end > self.bytes().len() as u64 {
            self.grow(end)?;
        }
        self.top = end;
        self.live += size;
        Ok(off | ((class as u64) << CLASS_SHIFT))
    }

    /// A free block of class `c` (which has one) for a block of class
    /// `class`: whole if `c` is at most `fit` classes larger, else cut: the
    /// front of the block becomes the new one; the rest is cut into blocks
    /// of the largest classes that fit, back on their free lists (sizes are
    /// even and every even size up to 64 is a class, so nothing is left
    /// over). Pages punched out of the rest stay so and are still counted
    /// as given back.
    fn take_for(&mut self, c: usize, class: usize, fit: usize) -> u64 {
        let (loc, punched) = self.take(c);
        if c <= class + fit {
            return loc;
        }
        let size = class_size(class) as u64;
        let (start, end) = (offset(loc) + size, offset(loc) + class_size(c) as u64);
        self.live -= end - start;
        let pages = if punched {
            RestPages::GivenBack
        } else {
            RestPages::Kept
        };
        self.free_range(start, end, pages);
        offset(loc) | ((class as u64) << CLASS_SHIFT)
    }

    /// Puts the free bytes `[start, end)` on the free lists as the blocks
    /// [`cut`] makes of them, their pages as `pages` says.
    fn free_range(&mut self, start: u64, end: u64, pages: RestPages) {
        for (at, class) in cut(start, end) {
            let size = class_size(class) as u64;
            let entry = at | ((class as u64) << CLASS_SHIFT);
            let entry = match pages {
                RestPages::Kept => entry,
                RestPages::GivenBack => match punchable(at, size) {
                    Some((_, len)) => {
                        self.punched += len;
                        entry | PUNCHED
                    }
                    None => entry,
                },
                RestPages::GiveBack => self.punch(entry),
            };
            self.push_free(class, entry);
        }
    }

    /// A freed block's free-list entry, its whole pages given back first
    /// if it is at least [`PUNCH_MIN`] bytes. Only memory arenas punch: a
    /// file arena keeps its disk blocks so a reused block can never hit a
    /// full disk through the mapping.
    fn punch(&mut self, entry: u64) -> u64 {
        let size = block_size(entry) as u64;
        if size as usize >= PUNCH_MIN && !matches!(self.pages, Pages::File(..)) {
            if let Some((start, len)) = punchable(offset(entry), size) {
                if self.give_back(start, len).is_ok() {
                    self.punched += len;
                    return entry | PUNCHED;
                }
            }
        }
        entry
    }

    /// The smallest class at or above `class` with a free block.
    fn smallest_free(&self, class: usize) -> Option<usize> {
        let mut word = class / 64;
        let mut bits = *self.nonempty.get(word)? & (!0u64 << (class % 64));
        loop {
            if bits != 0 {
                return Some(word * 64 + bits.trailing_zeros() as usize);
            }
            word += 1;
            bits = *self.nonempty.get(word)?;
        }
    }

    /// Takes a free block of class `c` (which has one) whole: its handle,
    /// and whether its pages had been punched out (they count as used
    /// again).
    fn take(&mut self, c: usize) -> (u64, bool) {
        let list = &mut self.free[c];
        let entry = list.pop().unwrap_or_default();
        if list.is_empty() {
            self.mark_empty(c);
        }
        let loc = entry & !PUNCHED;
        let size = class_size(c) as u64;
        let punched = entry & PUNCHED != 0;
        if punched {
            self.punched -= punchable(offset(loc), size).map_or(0, |(_, l)| l);
        }
        self.free_bytes -= size;
        self.live += size;
        (loc, punched)
    }

    /// Notes that class `class`'s free list is empty now.
    fn mark_empty(&mut self, class: usize) {
        self.nonempty[class / 64] &= !(1 << (class % 64));
    }

    /// Puts a free-list entry (a handle, maybe flagged [`PUNCHED`]) of
    /// class `class` on its list.
    fn push_free(&mut self, class: usize, entry: u64) {
        if self.free.len() <= class {
            self.free.resize_with(class + 1, Vec::new);
        }
        self.free[class].push(entry);
        self.nonempty[class / 64] |= 1 << (class % 64);
        self.free_bytes += class_size(class) as u64;
    }

    /// Returns a block to its free list.
    pub fn free(&mut self, loc: u64) {
        if in_file(loc) {
            if let Some(t) = self.file_tier.as_deref_mut() {
                t.free(loc);
            }
            return;
        }
        let class = (loc >> CLASS_SHIFT) as usize;
        let size = class_size(class) as u64;
        self.live -= size;
        if self.compaction.is_none() && (size as usize) < PUNCH_MIN {
            self.merge_freed(offset(loc), size);
            return;
        }
        let entry = self.punch(loc);
        if let Some(entry) = self.doom(entry) {
            self.push_free(class, entry);
        }
    }

    /// Adds the freed block `[at, at + size)` to a span of merged freed
    /// blocks it borders, else starts a span with it in place of an
    /// empty one or of the shorter, which goes on the free lists (two
    /// spans: a run of frees interrupted by one elsewhere, an overwrite of
    /// a record that had moved, goes on). A table bounded in bytes evicts
    /// its oldest keys one after another, and records written one after
    /// another lie side by side: merged, their blocks take the next
    /// records whatever their sizes, where blocks freed one by one would
    /// fit only records no larger, and the arena would grow for the rest.
    fn merge_freed(&mut self, at: u64, size: u64) {
        self.free_bytes += size;
        for i in 0..SPANS {
            let Some((start, end)) = self.spans[i] else {
                continue;
            };
            let merged = if end == at {
                (start, at + size)
            } else if at + size == start {
                (at, end)
            } else {
                continue;
            };
            self.spans[i] = Some(merged);
            // The block may join the two.
            let j = (i + 1) % SPANS;
            if let Some((s, e)) = self.spans[j].filter(|&(s, e)| e == merged.0 || s == merged.1) {
                self.spans[i] = Some((s.min(merged.0), e.max(merged.1)));
                self.spans[j] = None;
            }
            return;
        }
        let i = (0..SPANS)
            .min_by_key(|&i| span_len(self.spans[i]))
            .expect("SPANS > 0");
        self.close_span(i);
        self.spans[i] = Some((at, at + size));
    }

    /// The `len` bytes at block `loc`, or `None` past the end of the arena.
    #[inline]
    pub fn get(&self, loc: u64, len: usize) -> Option<&[u8]> {
        if in_file(loc) {
            return self.file_get(loc, len);
        }
        let start = usize::try_from(offset(loc)).ok()?;
        self.bytes().get(start..start.checked_add(len)?)
    }

    /// The whole mapping.
    fn bytes(&self) -> &[u8] {
        self.pages.bytes()
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        match &mut self.pages {
            Pages::Anon(r) => r,
            Pages::Memfd(_, m) | Pages::File(_, _, m) => m,
        }
    }

    /// Up to `max` bytes from block `loc`, fewer where the mapping ends
    /// sooner.
    #[inline]
    pub fn tail(&self, loc: u64, max: usize) -> &[u8] {
        if in_file(loc) {
            return self.file_tail(loc, max);
        }
        let start = usize::try_from(offset(loc)).unwrap_or(usize::MAX);
        let end = start.saturating_add(max).min(self.bytes().len());
        self.bytes().get(start..end).unwrap_or(&[])
    }

    /// Asks the CPU to start loading the first bytes of block `loc` into
    /// its cache (its first [`PREFETCHED`] bytes: a record's header, a
    /// short key and the start of its body, one cache line or two), so
    /// that a walk that reads it a few records later does not wait for
    /// memory. Does nothing past the end of the arena, or on other CPUs
    /// than x86-64.
    pub fn prefetch(&self, loc: u64) {
        // A block in a tiered arena's file is not asked for: its page may
        // be on disk.
        #[cfg(target_arch = "x86_64")]
        if !in_file(loc) {
            let bytes = self.tail(loc, PREFETCHED);
            let ask = |b: &u8| {
                // SAFETY: a prefetch hint never faults and changes nothing
                // observable; the address is that of a byte of the mapping.
                unsafe {
                    std::arch::x86_64::_mm_prefetch(
                        (b as *const u8).cast::<i8>(),
                        std::arch::x86_64::_MM_HINT_T0,
                    );
                }
            };
            if let Some(first) = bytes.first() {
                ask(first);
                // The last byte asked for is in the next line when the
                // block starts late in its own.
                if let Some(last) = bytes
                    .last()
                    .filter(|_| (first as *const u8 as usize) % 64 + bytes.len() > 64)
                {
                    ask(last);
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = loc;
    }

    /// The `len` bytes at block `loc`, writable.
    pub fn get_mut(&mut self, loc: u64, len: usize) -> Option<&mut [u8]> {
        if in_file(loc) {
            return self
                .file_tier
                .as_deref_mut()?
                .arena
                .get_mut(loc & !IN_FILE, len);
        }
        let start = usize::try_from(offset(loc)).ok()?;
        self.bytes_mut().get_mut(start..start.checked_add(len)?)
    }

    /// Gives the pages of `[start, start+len)` (whole pages of a freed
    /// block) back to the kernel; they read as zeros afterwards.
    fn give_back(&self, start: u64, len: u64) -> io::Result<()> {
        match &self.pages {
            Pages::Anon(r) => r.discard(start as usize, len as usize),
            Pages::Memfd(file, _) => punch_hole(file, start, len),
            Pages::File(..) => Ok(()),
        }
    }

    fn grow(&mut self, needed: u64) -> io::Result<()> {
        let mut new_len = self.bytes().len() as u64;
        while new_len < needed {
            new_len += new_len.clamp(INITIAL_BYTES, MAX_STEP);
        }
        let old_len = self.bytes().len() as u64;
        match &mut self.pages {
            Pages::Anon(r) => r.grow(new_len as usize),
            Pages::Memfd(file, map) => {
                file.set_len(new_len)?;
                remap(file, map, new_len)
            }
            Pages::File(file, _, map) => {
                // Reserve the disk blocks now: a store through the mapping
                // into a hole the disk has no room for would be SIGBUS, not
                // an error.
                if let Err(e) = allocate(file, old_len, new_len - old_len) {
                    let _ = file.set_len(old_len);
                    return Err(e);
                }
                remap(file, map, new_len)?;
                // Best effort: the advice moves with the mapping.
                let _ = map.advise(Advice::Random);
                Ok(())
            }
        }
    }

    /// Makes room for about `bytes` more of blocks at once, for a bulk load
    /// (recovery.rs) that knows roughly how much it will place: one growth
    /// instead of a doubling series, and the pages faulted in by one
    /// madvise, which costs a third less than a fault per page. (A helper
    /// thread allocating them while the caller parses measured no better.)
    /// Best effort: before Linux 5.14 the pages fault in as touched.
    pub fn reserve(&mut self, bytes: u64) -> io::Result<()> {
        // A tiered arena's memory holds its share at most.
        let bytes = match self.file_tier.as_deref() {
            Some(t) => bytes.min(t.room(self.live)),
            None => bytes,
        };
        let end = self.top.saturating_add(bytes).min(OFFSET_MASK);
        if end > self.bytes().len() as u64 {
            self.grow(end)?;
        }
        let start = self.top / PAGE * PAGE;
        self.populate(start, end.saturating_sub(start));
        Ok(())
    }

    /// Faults in the memory pages of `[start, start+len)` (`start` page
    /// aligned) ready for writing, as a write would, but all at once and
    /// without touching their bytes. Best effort: nothing for a file arena,
    /// or before Linux 5.14.
    fn populate(&self, start: u64, len: u64) {
        let (start, len) = (start as usize, len as usize);
        let _ = match &self.pages {
            _ if len == 0 => Ok(()),
            Pages::Anon(r) => r.populate(start, len),
            Pages::Memfd(_, map) => map.advise_range(Advice::PopulateWrite, start, len),
            Pages::File(..) => Ok(()),
        };
    }

    /// Drops every block and gives all pages back, keeping the backing.
    pub fn clear(&mut self) -> io::Result<()> {
        if let Some(t) = self.file_tier.as_deref_mut() {
            t.clear()?;
        }
        match &mut self.pages {
            Pages::Anon(r) => *r = Region::new(r.name().clone(), INITIAL_BYTES as usize)?,
            Pages::Memfd(file, map) => {
                file.set_len(0)?;
                file.set_len(INITIAL_BYTES)?;
                *map = map_file(file, INITIAL_BYTES, false)?;
            }
            Pages::File(file, _, map) => {
                file.set_len(0)?;
                allocate(file, 0, INITIAL_BYTES)?;
                *map = read_randomly(map_file(file, INITIAL_BYTES, false)?)?;
            }
        }
        self.top = FIRST_OFFSET;
        self.spans = [None; SPANS];
        self.free.iter_mut().for_each(Vec::clear);
        self.nonempty.fill(0);
        self.live = 0;
        self.free_bytes = 0;
        self.punched = 0;
        self.compaction = None;
        self.doomed_bytes = 0;
        Ok(())
    }

    /// Bytes mapped: the length of the region (the backing file's size).
    /// Address space only; the kernel allocates pages when they are touched
    /// (in a memory arena on huge pages, 2 MiB at a time where it can).
    pub fn mapped_bytes(&self) -> u64 {
        self.bytes().len() as u64
            + self
                .file_tier
                .as_ref()
                .map_or(0, |t| t.arena.mapped_bytes())
    }

    /// Of the mapping's `len` bytes from `from`, those whose pages are in
    /// RAM: for a file arena, in the page cache whether or not this
    /// process maps them now (mincore(2)). `None` for other arenas, whose
    /// pages the process's own mapping counts, or if the kernel refuses.
    /// A tiered arena answers for its file (its memory is counted by its
    /// own mapping).
    pub fn cached_bytes(&self, from: u64, len: u64) -> Option<u64> {
        if let Some(t) = self.file_tier.as_deref() {
            return t.arena.cached_bytes(from, len);
        }
        let Pages::File(_, _, map) = &self.pages else {
            return None;
        };
        let page = PAGE as usize;
        let start = (from as usize / page) * page;
        let end = (from.saturating_add(len) as usize).min(map.len());
        if start >= end {
            return Some(0);
        }
        let mut vec = vec![0u8; (end - start).div_ceil(page)];
        // SAFETY: the range lies inside the live mapping (`map` is borrowed
        // for the call, so it is neither unmapped nor moved), `start` is
        // page-aligned, and `vec` has a byte for each of its pages.
        let rc = unsafe {
            libc::mincore(
                map.as_ptr().add(start) as *mut libc::c_void,
                end - start,
                vec.as_mut_ptr(),
            )
        };
        (rc == 0).then(|| vec.iter().filter(|&&b| b & 1 == 1).count() as u64 * page as u64)
    }

    /// Bytes handed out so far: blocks in use, blocks on free lists, and the
    /// 8-byte reserved head. Pages punched out of freed blocks are not
    /// counted.
    pub fn used_bytes(&self) -> u64 {
        self.top - self.punched
    }

    /// Bytes in blocks that hold records, size-class slack included.
    pub fn live_bytes(&self) -> u64 {
        self.live
    }

    /// Bytes in freed blocks waiting to be reused.
    pub fn free_bytes(&self) -> u64 {
        self.free_bytes + self.doomed_bytes
    }

    /// Bytes in freed blocks whose pages are still in memory (or on disk):
    /// what a compaction could give back.
    pub fn held_free_bytes(&self) -> u64 {
        self.free_bytes() - self.punched
    }

    /// Heap bytes of the free lists themselves (Rust memory, not arena).
    pub fn overhead_bytes(&self) -> u64 {
        let lists: usize = self.free.iter().map(Vec::capacity).sum();
        (lists * 8 + self.free.capacity() * std::mem::size_of::<Vec<u64>>()) as u64
    }

    /// The address where the region starts, to find it in /proc/self/smaps.
    pub fn address(&self) -> usize {
        self.bytes().as_ptr() as usize
    }

    /// The backing file's path (file and tiered arenas only, until it is
    /// removed).
    pub fn path(&self) -> Option<&Path> {
        if let Some(t) = self.file_tier.as_deref() {
            return t.arena.path();
        }
        match &self.pages {
            Pages::File(_, path, _) if !path.as_os_str().is_empty() => Some(path),
            _ => None,
        }
    }
}

impl Arena {
    /// Removes a file arena's file (once; its mapping stays usable).
    pub(crate) fn remove_file(&mut self) {
        if let Some(t) = self.file_tier.as_deref_mut() {
            t.arena.remove_file();
        }
        if let Pages::File(_, path, _) = &mut self.pages {
            if !path.as_os_str().is_empty() {
                let _ = fs::remove_file(&*path);
                *path = PathBuf::new();
            }
        }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        self.remove_file();
    }
}

/// A label made safe for file and mapping names: `[A-Za-z0-9_.-]`, at most
/// 64 characters, never all dots.
pub(crate) fn sanitize(label: &str) -> String {
    let s: String = label
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    // Never "." or ".." (or anything else that is all dots).
    if s.chars().all(|c| c == '.') {
        s.replace('.', "_")
    } else {
        s
    }
}

/// The page-aligned part of a block, if it holds at least one page.
fn punchable(off: u64, size: u64) -> Option<(u64, u64)> {
    let start = off.div_ceil(PAGE) * PAGE;
    let end = (off + size) / PAGE * PAGE;
    (end > start).then(|| (start, end - start))
}

/// A memory arena's fallback pages: a memfd named `name`.
fn memfd_pages(name: &CString) -> io::Result<Pages> {
    let file = memfd(&name.to_string_lossy(), INITIAL_BYTES)?;
    let map = map_file(&file, INITIAL_BYTES, false)?;
    Ok(Pages::Memfd(file, map))
}

/// A new memfd of `len` bytes named `name` (shown as `/memfd:NAME (deleted)`
/// in /proc/PID/maps).
pub(crate) fn memfd(name: &str, len: u64) -> io::Result<File> {
    let cname = CString::new(name).map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: memfd_create reads a NUL-terminated string and returns a new
    // file descriptor or -1; it touches no memory of ours.
    let fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor that nothing else owns.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(len)?;
    Ok(file)
}

pub(crate) fn map_file(file: &File, len: u64, reserve: bool) -> io::Result<MmapMut> {
    if reserve {
        allocate(file, 0, len)?;
    }
    // SAFETY: the file is private to its arena (a memfd or an O_EXCL 0600
    // file) and at least `len` bytes long, so no other code changes it
    // behind the mapping's back and every mapped page is backed.
    unsafe { MmapOptions::new().len(len as usize).map_mut(file) }
}

/// A file arena's mapping, advised `MADV_RANDOM`: a fault reads the page
/// it needs, not the device's read-ahead window around it (8 MiB on some
/// disks: once a table outgrows RAM, every lookup read that much).
fn read_randomly(map: MmapMut) -> io::Result<MmapMut> {
    map.advise(Advice::Random)?;
    Ok(map)
}

/// Extends a private memfd to `new_len` bytes and its mapping with it (the
/// mapping may move). On error both stay as they were.
pub(crate) fn grow_memfd(file: &File, map: &mut MmapMut, new_len: u64) -> io::Result<()> {
    file.set_len(new_len)?;
    remap(file, map, new_len)
}

/// Remaps `map` of `file` (already extended to `new_len`) to `new_len`
/// bytes; on error, gives the file its old length back.
fn remap(file: &File, map: &mut MmapMut, new_len: u64) -> io::Result<()> {
    let old_len = map.len() as u64;
    // SAFETY: the file is private to its owner (a memfd, or a 0600 file
    // created with O_EXCL) and was just extended to `new_len`, so every
    // page of the new mapping is backed. The mapping may move; no
    // reference into it exists because the caller holds it `&mut`.
    let remapped = unsafe { map.remap(new_len as usize, RemapOptions::new().may_move(true)) };
    if let Err(e) = remapped {
        // Give the space back so the file stays as it was.
        let _ = file.set_len(old_len);
        return Err(e);
    }
    Ok(())
}

/// Extends `file` to cover `[off, off+len)` with real disk blocks.
pub(crate) fn allocate(file: &File, off: u64, len: u64) -> io::Result<()> {
    // SAFETY: posix_fallocate only acts on the descriptor; it returns an
    // error number instead of setting errno.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), off as i64, len as i64) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(rc))
    }
}

pub(crate) fn punch_hole(file: &File, off: u64, len: u64) -> io::Result<()> {
    // SAFETY: fallocate only acts on the descriptor; the range is inside the
    // file and belongs to a freed block nobody reads.
    let rc = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            off as i64,
            len as i64,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Removes arena files in `dir` whose creating OS process is gone.
fn remove_stale_files(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(rest) = name.strip_prefix("heft-") else {
            continue;
        };
        if !name.ends_with(".arena") {
            continue;
        }
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = fs::remove_file(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_cover_every_length_with_little_slack() {
        let mut prev = 0;
        for len in 1..200_000usize {
            let c = class_of(len);
            let size = class_size(c);
            assert!(size >= len, "len {len} class {c} size {size}");
            assert!(c >= prev, "classes are monotonic");
            prev = c;
            if len > 256 {
                assert!((size - len) * 8 <= len, "slack over 12.5% at {len}");
            } else if len > 64 {
                assert!(size - len < 4);
            } else {
                assert!(size - len < 2, "len {len} in a block of {size}");
            }
            assert_eq!(class_of(size), c, "a class's own size is in it");
        }
        // Block sizes, hence offsets, stay even (the index packs them so).
        assert!((0..CLASSES).all(|c| class_size(c) % 2 == 0));
        assert_eq!(class_of(1 << 40), class_of((1 << 40) - 1));
        assert!(class_of(1 << 47) < CLASSES);
    }

    #[test]
    fn freed_blocks_are_reused_so_overwrites_do_not_grow_the_arena() {
        let mut a = Arena::new(&Backing::Memory, "t").unwrap();
        let mut offs: Vec<u64> = (0..1000).map(|_| a.alloc(100).unwrap()).collect();
        let used = a.used_bytes();
        for round in 0..50 {
            for o in offs.iter_mut() {
                a.free(*o);
                *o = a.alloc(97 + round % 4).unwrap();
            }
        }
        assert_eq!(a.used_bytes(), used);
        assert_eq!(a.live_bytes(), 1000 * 100);
        assert_eq!(a.free_bytes(), 0);
    }

    #[test]
    fn a_slightly_larger_free_block_is_reused_before_growing() {
        let mut a = Arena::new(&Backing::Memory, "fit").unwrap();
        let big = a.alloc(400).unwrap();
        a.alloc(10).unwrap();
        let other = a.alloc(64).unwrap();
        a.free(big);
        a.free(other);
        // Off the spans of merged freed blocks, onto the free lists.
        a.close_spans();
        let used = a.used_bytes();
        let small = a.alloc(380).unwrap();
        assert_eq!(offset(small), offset(big));
        assert_eq!(block_size(small), block_size(big));
        assert_eq!(a.used_bytes(), used);
        a.free(small);
        assert_eq!(a.live_bytes(), 10);
        // A far smaller request takes the front of the big block (a span
        // now), not all of it, nor the block of 64.
        let tiny = a.alloc(8).unwrap();
        assert_eq!(offset(tiny), offset(big));
        assert_eq!(block_size(tiny), 8);
        assert_eq!(a.live_bytes(), 10 + 8);
        assert_eq!(a.free_bytes(), block_size(big) as u64 - 8 + 64);
    }

    #[test]
    fn records_that_shrink_fill_the_space_larger_ones_left() {
        // 1,000 blocks of 400 bytes (416 with slack) on the free lists, then
        // records of 140 bytes: each 416 is cut into 140 + 256 + 20, the
        // 256 into 140 + 116, so two go in each; the pieces of 116 and 20
        // hold records of up to those sizes. None of it grows the arena.
        let mut a = Arena::new(&Backing::Memory, "split").unwrap();
        // Each with a block of 20 after it that stays: none is merged.
        let big: Vec<u64> = (0..1000)
            .map(|_| {
                let b = a.alloc(400).unwrap();
                a.alloc(20).unwrap();
                b
            })
            .collect();
        assert_eq!(block_size(big[0]), 416);
        let used = a.used_bytes();
        big.iter().for_each(|&b| a.free(b));
        a.close_spans();
        (0..2000).for_each(|_| assert_eq!(block_size(a.alloc(140).unwrap()), 140));
        assert_eq!(a.free_bytes(), 1000 * (116 + 20));
        (0..1000).for_each(|_| assert_eq!(block_size(a.alloc(110).unwrap()), 116));
        (0..1000).for_each(|_| assert_eq!(block_size(a.alloc(19).unwrap()), 20));
        assert_eq!(a.used_bytes(), used);
        assert_eq!(a.free_bytes(), 0);
        assert_eq!(a.live_bytes(), 1000 * (416 + 20));
        // Then the arena grows again.
        a.alloc(140).unwrap();
        assert_eq!(a.used_bytes(), used + 140);
    }

    #[test]
    fn blocks_freed_side_by_side_merge_and_take_any_record_that_fits_their_sum() {
        // What a bounded table's evictions do: the oldest records, written
        // one after another, freed one after another.
        let mut a = Arena::new(&Backing::Memory, "merge").unwrap();
        let blocks: Vec<u64> = (0..1000).map(|_| a.alloc(100).unwrap()).collect();
        let used = a.used_bytes();
        blocks[10..20].iter().for_each(|&b| a.free(b));
        // Backwards too.
        blocks[30..40].iter().rev().for_each(|&b| a.free(b));
        // Two spans of ten: each takes a record of 900 (a block of 960).
        let first = a.alloc(900).unwrap();
        assert_eq!(offset(first), offset(blocks[10]));
        let second = a.alloc(900).unwrap();
        assert_eq!(offset(second), offset(blocks[30]));
        assert_eq!(a.used_bytes(), used);
        assert_eq!(a.free_bytes(), 40 + 40);
        // Blocks 50 and 52 do not border each other (nor the spans' rests
        // of 40, which go on the free lists): a record of 200 grows the
        // arena.
        a.free(blocks[50]);
        a.free(blocks[52]);
        let used = a.used_bytes();
        let grown = a.alloc(200).unwrap();
        assert_eq!(a.used_bytes(), used + 200);
        // A run of frees interrupted by one elsewhere goes on: 60..65,
        // 80, then 65..70 make a span that takes a record of 500.
        blocks[60..65].iter().for_each(|&b| a.free(b));
        a.free(blocks[80]);
        blocks[65..70].iter().for_each(|&b| a.free(b));
        let used = a.used_bytes();
        assert_eq!(offset(a.alloc(500).unwrap()), offset(blocks[60]));
        assert_eq!(a.used_bytes(), used);
        assert!(offset(grown) > offset(blocks[999]));
    }

    #[test]
    fn split_blocks_never_overlap_and_the_counts_stay_exact() {
        for pages in [MemoryPages::Huge, MemoryPages::Memfd] {
            let mut a = Arena::with_pages(&Backing::Memory, "splits", pages).unwrap();
            let mut held: Vec<(u64, u8)> = Vec::new();
            let mut rng = crate::testutil::Rng(0x9e37_79b9_7f4a_7c15);
            for i in 0..20_000u32 {
                let r = rng.next();
                if r % 3 == 0 && !held.is_empty() {
                    let (loc, _) = held.swap_remove((r >> 8) as usize % held.len());
                    a.free(loc);
                } else {
                    // Mostly small records, now and then one past PUNCH_MIN
                    // whose freed pages are given back and later split.
                    let len = match r >> 60 {
                        0 => 64 * 1024 + (r >> 20) as usize % (200 * 1024),
                        _ => 1 + (r >> 20) as usize % 3000,
                    };
                    let loc = a.alloc(len).unwrap();
                    assert!(block_size(loc) >= len);
                    let fill = i as u8;
                    a.get_mut(loc, block_size(loc)).unwrap().fill(fill);
                    held.push((loc, fill));
                }
            }
            let mut spans: Vec<(u64, u64)> = held
                .iter()
                .map(|&(l, _)| (offset(l), offset(l) + block_size(l) as u64))
                .collect();
            spans.sort_unstable();
            assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0), "{pages:?}");
            for &(loc, fill) in &held {
                let bytes = a.get(loc, block_size(loc)).unwrap();
                assert!(bytes.iter().all(|&b| b == fill), "{pages:?}");
            }
            let live: u64 = held.iter().map(|&(l, _)| block_size(l) as u64).sum();
            assert_eq!(a.live_bytes(), live);
            assert_eq!(a.live_bytes() + a.free_bytes() + FIRST_OFFSET, a.top);
            let punched: u64 = a
                .free
                .iter()
                .flatten()
                .filter(|&&e| e & PUNCHED != 0)
                .map(|&e| {
                    let loc = e & !PUNCHED;
                    punchable(offset(loc), block_size(loc) as u64).map_or(0, |(_, l)| l)
                })
                .sum();
            assert_eq!(a.punched, punched, "{pages:?}");
            assert!(a.punched > 0, "{pages:?}: no block was given back");
        }
    }

    #[test]
    fn data_survives_growth_and_remapping() {
        let mut a = Arena::new(&Backing::Memory, "grow").unwrap();
        let mut blocks = Vec::new();
        for i in 0..5000u32 {
            let off = a.alloc(1000).unwrap();
            a.get_mut(off, 4).unwrap().copy_from_slice(&i.to_le_bytes());
            blocks.push(off);
        }
        assert!(a.mapped_bytes() >= 5000 * 1000);
        for (i, off) in blocks.iter().enumerate() {
            assert_eq!(a.get(*off, 4).unwrap(), &(i as u32).to_le_bytes());
        }
        assert!(a.get(a.mapped_bytes(), 1).is_none());
    }

    #[test]
    fn large_freed_blocks_give_their_pages_back() {
        for pages in [MemoryPages::Huge, MemoryPages::Memfd] {
            let mut a = Arena::with_pages(&Backing::Memory, "punch", pages).unwrap();
            let off = a.alloc(1 << 20).unwrap();
            a.get_mut(off, 1 << 20).unwrap().fill(1);
            let used = a.used_bytes();
            a.free(off);
            assert!(a.used_bytes() < used - (1 << 19), "{pages:?}");
            let again = a.alloc(1 << 20).unwrap();
            assert_eq!(again, off);
            assert_eq!(a.used_bytes(), used);
            // The whole pages inside the block read back as zeros and are
            // writable again; the partial pages at its ends kept their bytes.
            let (start, len) = punchable(offset(off), block_size(off) as u64).unwrap();
            let skip = (start - offset(off)) as usize;
            let block = a.get(again, 1 << 20).unwrap();
            assert!(
                block[skip..skip + len as usize].iter().all(|&b| b == 0),
                "{pages:?}"
            );
            assert!(block[..skip].iter().all(|&b| b == 1), "{pages:?}");
            a.get_mut(again, 1 << 20).unwrap().fill(2);
        }
    }

    #[test]
    fn a_file_arena_is_read_at_random_before_and_after_it_grows() {
        let dir = std::env::temp_dir().join(format!("heft-arena-rr-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let mut a = Arena::new(&Backing::File(dir.clone()), "rr").unwrap();
        // VmFlags `rr`: MADV_RANDOM, no read-ahead on a fault.
        let random = |a: &Arena| {
            let smaps = fs::read_to_string("/proc/self/smaps").unwrap();
            let at = smaps.find(&format!("{:x}-", a.address())).unwrap();
            let flags = smaps[at..]
                .lines()
                .find_map(|l| l.strip_prefix("VmFlags:"))
                .unwrap();
            flags.split_whitespace().any(|f| f == "rr")
        };
        assert!(random(&a));
        fill_across_2_mib(&mut a);
        assert!(random(&a));
        a.clear().unwrap();
        assert!(random(&a));
        drop(a);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_file_arena_counts_its_pages_in_the_page_cache_mapped_or_not() {
        let dir = std::env::temp_dir().join(format!("heft-arena-cached-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let mut a = Arena::new(&Backing::File(dir.clone()), "cached").unwrap();
        fill_across_2_mib(&mut a);
        let used = a.used_bytes();
        let all = a.mapped_bytes();
        assert!(a.cached_bytes(0, all).unwrap() >= used - PAGE);
        let Pages::File(_, _, map) = &a.pages else {
            unreachable!()
        };
        // SAFETY: the whole live mapping; MADV_DONTNEED on a shared file
        // mapping only drops this process's page table entries (the pages
        // stay in the page cache, their data in the file).
        let rc = unsafe { libc::madvise(map.as_ptr() as *mut _, map.len(), libc::MADV_DONTNEED) };
        assert_eq!(rc, 0);
        let mapped = crate::accounting::mappings(&[a.address() as u64]).unwrap()[0].unwrap();
        assert!(mapped.resident < used / 2, "{mapped:?}");
        assert!(a.cached_bytes(0, all).unwrap() >= used - PAGE);
        // A range counts only its own pages.
        assert_eq!(a.cached_bytes(0, 2 * PAGE).unwrap(), 2 * PAGE);
        assert_eq!(a.cached_bytes(all, PAGE).unwrap(), 0);
        fill_across_2_mib(&mut a);
        drop(a);
        fs::remove_dir_all(&dir).unwrap();
        let memory = Arena::new(&Backing::Memory, "cached").unwrap();
        assert_eq!(memory.cached_bytes(0, PAGE), None);
    }

    /// The /proc/self/maps line of the mapping that starts at `addr`.
    fn maps_line(addr: usize) -> Option<String> {
        let maps = fs::read_to_string("/proc/self/maps").unwrap();
        let prefix = format!("{addr:x}-");
        maps.lines()
            .find(|l| l.starts_with(&prefix))
            .map(str::to_string)
    }

    /// Checks that a memory arena labelled `label` is a mapping of its
    /// own, anonymous memory listed by `anon::live` (and named so in maps
    /// where the kernel names anonymous memory), or the fallback memfd.
    fn assert_memory_arena_mapping(a: &Arena, label: &str) {
        let line = maps_line(a.address()).expect("the arena starts a mapping");
        let usage = crate::accounting::mappings(&[a.address() as u64]).unwrap()[0].unwrap();
        assert_eq!(usage.size, a.mapped_bytes(), "{line}");
        let name = format!("heft:{label}");
        match &a.pages {
            Pages::Anon(_) => {
                assert!(anon::live().contains(&(a.address() as u64, name.clone())));
                let path = line.split_whitespace().nth(5);
                assert!(
                    path.is_none() || path == Some(&format!("[anon:{name}]")),
                    "{line}"
                );
            }
            Pages::Memfd(..) => assert!(line.contains(&format!("/memfd:{name} ")), "{line}"),
            Pages::File(..) => panic!("a file arena"),
        }
    }

    /// KiB of the mapping at `addr` that are on huge pages.
    fn huge_kb(addr: usize) -> u64 {
        let smaps = fs::read_to_string("/proc/self/smaps").unwrap();
        let at = smaps.find(&format!("{addr:x}-")).unwrap();
        smaps[at..]
            .lines()
            .find_map(|l| l.strip_prefix("AnonHugePages:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap()
    }

    fn thp_for_anonymous_memory() -> bool {
        fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .is_ok_and(|s| !s.contains("[never]"))
    }

    /// Fills 6 MiB of blocks numbered by their first bytes, growing the
    /// arena from 64 KiB past several 2 MiB boundaries, and checks them.
    fn fill_across_2_mib(a: &mut Arena) {
        let mut blocks = Vec::new();
        for i in 0..6000u32 {
            let off = a.alloc(1000).unwrap();
            let b = a.get_mut(off, 1000).unwrap();
            b.fill(i as u8);
            b[..4].copy_from_slice(&i.to_le_bytes());
            blocks.push(off);
        }
        assert!(a.mapped_bytes() > 4 << 20);
        for (i, off) in blocks.iter().enumerate() {
            let b = a.get(*off, 1000).unwrap();
            assert_eq!(&b[..4], &(i as u32).to_le_bytes());
            assert!(b[4..].iter().all(|&x| x == i as u8));
        }
    }

    #[test]
    fn a_memory_arena_is_huge_page_memory_listed_by_name_and_keeps_its_data_across_2_mib_growth() {
        let mut a = Arena::new(&Backing::Memory, "grow2m").unwrap();
        if thp_for_anonymous_memory() {
            assert!(matches!(a.pages, Pages::Anon(_)));
        }
        assert_memory_arena_mapping(&a, "grow2m");
        let first = a.address();
        fill_across_2_mib(&mut a);
        // Still a mapping of its own, listed under its new address only
        // (tests run in parallel: another test's arena may take the old
        // address, under its own name).
        assert_memory_arena_mapping(&a, "grow2m");
        let ours = |addr: u64| {
            anon::live()
                .iter()
                .any(|(x, n)| *x == addr && n == "heft:grow2m")
        };
        assert!(!ours(first as u64) || first == a.address());
        let usage = crate::accounting::mappings(&[a.address() as u64]).unwrap()[0].unwrap();
        assert!(usage.resident >= 6000 * 1000, "{usage:?}");
        if matches!(a.pages, Pages::Anon(_)) {
            assert!(
                huge_kb(a.address()) >= 2048,
                "no huge page in the grown arena"
            );
        }
        a.clear().unwrap();
        assert_eq!(a.mapped_bytes(), INITIAL_BYTES);
        assert_eq!(a.used_bytes(), FIRST_OFFSET);
        assert_memory_arena_mapping(&a, "grow2m");
        fill_across_2_mib(&mut a);
        let addr = a.address() as u64;
        drop(a);
        assert!(!ours(addr));
    }

    #[test]
    fn arenas_of_one_table_name_stay_separate_mappings() {
        let mut arenas: Vec<Arena> = (0..8)
            .map(|_| Arena::new(&Backing::Memory, "twin").unwrap())
            .collect();
        for a in arenas.iter_mut().step_by(2) {
            fill_across_2_mib(a);
        }
        for a in &arenas {
            assert_memory_arena_mapping(a, "twin");
        }
    }

    #[test]
    fn the_memfd_fallback_is_named_and_keeps_its_data_across_growth() {
        let mut a = Arena::with_pages(&Backing::Memory, "fallback", MemoryPages::Memfd).unwrap();
        assert!(matches!(a.pages, Pages::Memfd(..)));
        fill_across_2_mib(&mut a);
        assert_memory_arena_mapping(&a, "fallback");
        a.clear().unwrap();
        assert_eq!(a.mapped_bytes(), INITIAL_BYTES);
        fill_across_2_mib(&mut a);
    }

    #[test]
    fn file_arenas_are_private_and_removed_on_drop() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("heft-arena-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        // A leftover from a process that no longer exists is cleaned up.
        let stale = dir.join("heft-999999999-old-0.arena");
        fs::write(&stale, b"x").unwrap();
        let a = Arena::new(&Backing::File(dir.clone()), "../../etc/x").unwrap();
        let path = a.path().unwrap().to_path_buf();
        assert_eq!(path.parent().unwrap(), dir);
        assert!(!stale.exists());
        let mode = fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        drop(a);
        assert!(!path.exists());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn clear_empties_the_arena() {
        let mut a = Arena::new(&Backing::Memory, "clear").unwrap();
        for _ in 0..100 {
            a.alloc(50_000).unwrap();
        }
        a.clear().unwrap();
        assert_eq!(a.live_bytes(), 0);
        assert_eq!(a.used_bytes(), FIRST_OFFSET);
        assert_eq!(a.mapped_bytes(), INITIAL_BYTES);
        let off = a.alloc(10).unwrap();
        assert_eq!(offset(off), FIRST_OFFSET);
    }
}
