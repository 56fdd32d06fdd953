//! A tiered arena: memory first, a file second.
//!
//! A tiered arena ([`super::Backing::Tiered`]) is a memory arena with a
//! file arena of its own behind it (the file tier). Blocks are made in
//! memory until its live blocks hold the arena's memory share (the table's
//! `memory` budget) and an eighth more; past that, new blocks are made in
//! the file (a write never waits for room). The table moves the records
//! read least out to the file (table/tier.rs), so that memory comes back
//! under its share; a block's handle says which tier it is in
//! ([`super::IN_FILE`]), and reading it is the same slice either way.
//!
//! The file tier is a file arena: mapped `MADV_RANDOM`, so reading a
//! record back faults in its own pages, not a read-ahead window around
//! them. What is copied into it dirties the page cache; [`Tier::written`]
//! remembers the span written since the mover last asked, and the mover
//! starts its writeback at once and waits for it before writing much more
//! ([`start_writeback`]), so the file's pages are clean again within a
//! step or two: the kernel can then drop them without writing, and no
//! dirty scratch is left for the flusher's expiry or a cgroup's reclaim.
//! Memory's blocks are never written to disk.
//!
//! The file tier is not compacted: its free blocks are reused by later
//! moves; it is emptied with the table.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use super::{block_size, offset, Arena, IN_FILE, PAGE};

/// The file tier of a tiered arena.
pub(super) struct Tier {
    pub(super) arena: Arena,
    /// Bytes of live blocks memory keeps, at most, once the records read
    /// least have moved out.
    budget: u64,
    /// The file, shared with the thread that starts its writeback outside
    /// the table's lock.
    file: Arc<File>,
    /// The span of the file written since [`Tier::written`] last took it.
    written: Option<(u64, u64)>,
}

/// What a tiered arena's file holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FileTier {
    /// The memory share (bytes of live blocks memory keeps).
    pub budget: u64,
    /// Bytes of the file handed out (live and free blocks).
    pub used_bytes: u64,
    /// Bytes of the file in blocks holding records.
    pub live_bytes: u64,
    /// The file's length.
    pub mapped_bytes: u64,
    /// Where the file is mapped (to find it in /proc/self/smaps).
    pub address: u64,
}

/// A span of a tiered arena's file that was written and may be dirty.
#[derive(Debug)]
pub struct Written {
    file: Arc<File>,
    pub from: u64,
    pub to: u64,
}

impl Tier {
    pub(super) fn new(arena: Arena, budget: u64) -> io::Result<Tier> {
        let file = match &arena.pages {
            super::Pages::File(f, _, _) => Arc::new(f.try_clone()?),
            _ => return Err(io::ErrorKind::InvalidInput.into()),
        };
        Ok(Tier {
            arena,
            budget,
            file,
            written: None,
        })
    }

    /// Bytes of live blocks memory may hold while the mover catches up:
    /// its share and an eighth more.
    fn memory_cap(&self) -> u64 {
        self.budget + self.budget / 8
    }

    /// True if memory, holding `live` bytes of blocks, has no room for a
    /// block of `len` bytes.
    pub(super) fn memory_full(&self, live: u64, len: usize) -> bool {
        live + super::class_size(super::class_of(len)) as u64 > self.memory_cap()
    }

    /// Bytes memory may still take before it is full.
    pub(super) fn room(&self, live: u64) -> u64 {
        self.memory_cap().saturating_sub(live)
    }

    /// A block of `len` bytes in the file: its handle, flagged.
    pub(super) fn alloc(&mut self, len: usize) -> io::Result<u64> {
        let loc = self.arena.alloc(len)?;
        let (from, to) = (offset(loc), offset(loc) + block_size(loc) as u64);
        self.written = Some(match self.written {
            Some((a, b)) => (a.min(from), b.max(to)),
            None => (from, to),
        });
        Ok(loc | IN_FILE)
    }

    pub(super) fn free(&mut self, loc: u64) {
        self.arena.free(loc & !IN_FILE);
    }

    pub(super) fn clear(&mut self) -> io::Result<()> {
        self.written = None;
        self.arena.clear()
    }
}

impl Arena {
    /// A tiered arena's memory share and what its file holds; `None` for
    /// other arenas.
    pub fn file_tier(&self) -> Option<FileTier> {
        let t = self.file_tier.as_deref()?;
        Some(FileTier {
            budget: t.budget,
            used_bytes: t.arena.used_bytes(),
            live_bytes: t.arena.live_bytes(),
            mapped_bytes: t.arena.mapped_bytes(),
            address: t.arena.address() as u64,
        })
    }

    /// [`Arena::get`] of a block in the file (out of line: memory's
    /// blocks are the common case).
    #[cold]
    #[inline(never)]
    pub(super) fn file_get(&self, loc: u64, len: usize) -> Option<&[u8]> {
        self.file_tier.as_deref()?.arena.get(loc & !IN_FILE, len)
    }

    /// [`Arena::tail`] of a block in the file.
    #[cold]
    #[inline(never)]
    pub(super) fn file_tail(&self, loc: u64, max: usize) -> &[u8] {
        match self.file_tier.as_deref() {
            Some(t) => t.arena.tail(loc & !IN_FILE, max),
            None => &[],
        }
    }

    /// Bytes of live blocks in memory over a tiered arena's memory share
    /// less `margin` (0 if under it, or not tiered).
    pub fn memory_over(&self, margin: u64) -> u64 {
        match self.file_tier.as_deref() {
            Some(t) => self.live.saturating_sub(t.budget.saturating_sub(margin)),
            None => 0,
        }
    }

    /// Copies the first `len` bytes of block `loc`, in memory, to a new
    /// block in the file and frees the memory block; returns the new
    /// block's handle. On error (the disk is full) nothing changed.
    pub fn move_out(&mut self, loc: u64, len: usize) -> io::Result<u64> {
        debug_assert!(!super::in_file(loc));
        let Arena {
            pages, file_tier, ..
        } = self;
        let t = file_tier.as_deref_mut().ok_or(io::ErrorKind::Unsupported)?;
        let start = offset(loc) as usize;
        let src = pages
            .bytes()
            .get(start..start + len)
            .ok_or(io::ErrorKind::InvalidInput)?;
        let new = t.alloc(len)?;
        t.arena
            .get_mut(new & !IN_FILE, len)
            .expect("a block just allocated lies inside the file")
            .copy_from_slice(src);
        self.free(loc);
        Ok(new)
    }

    /// True if some of a tiered arena's file was written since
    /// [`Arena::written`] last took it.
    pub fn has_written(&self) -> bool {
        self.file_tier.as_ref().is_some_and(|t| t.written.is_some())
    }

    /// The span of a tiered arena's file written since the last call, if
    /// any, for [`start_writeback`] outside the table's lock.
    pub fn written(&mut self) -> Option<Written> {
        let t = self.file_tier.as_deref_mut()?;
        let (from, to) = t.written.take()?;
        Some(Written {
            file: t.file.clone(),
            from,
            to,
        })
    }
}

/// Starts writing back the dirty pages of `w` (`sync_file_range(2)`
/// `SYNC_FILE_RANGE_WRITE`), first waiting for the writeback already under
/// way there to finish if `wait`; so that written pages become clean soon,
/// and a writer that waits every few MiB writes no faster than the disk.
/// Durability is not the point: a tiered file is scratch, rebuilt from
/// nothing when its table is.
pub fn start_writeback(w: &Written, wait: bool) -> io::Result<()> {
    let from = w.from / PAGE * PAGE;
    let len = w.to.saturating_sub(from);
    let mut flags = libc::SYNC_FILE_RANGE_WRITE;
    if wait {
        flags |= libc::SYNC_FILE_RANGE_WAIT_BEFORE | libc::SYNC_FILE_RANGE_WAIT_AFTER;
    }
    // SAFETY: sync_file_range only acts on the descriptor, which `w` keeps
    // open; a span past the file's end is ignored.
    let rc = unsafe { libc::sync_file_range(w.file.as_raw_fd(), from as i64, len as i64, flags) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
