//! Anonymous huge-page regions, the pages of memory arenas.
//!
//! A region is private anonymous memory advised `MADV_HUGEPAGE` (2 MiB
//! pages where the host's THP setting for anonymous memory is `always` or
//! `madvise`), 2 MiB aligned, between two 4 KiB `PROT_NONE` guard pages.
//! The guards keep it one mapping of its own in /proc/self/smaps: the
//! kernel merges neighbouring anonymous mappings that look alike, which
//! would hide one table's figures in another's. It is named `heft:<table>`
//! with `PR_SET_VMA_ANON_NAME` where the kernel can (Linux 5.17+ built with
//! `CONFIG_ANON_VMA_NAME`; smaps then shows `[anon:heft:<table>]`); either
//! way [`live`] lists every region by address and name, for Heft.Memory.
//!
//! A region grows by moving into a larger reservation with `mremap`
//! (page tables move, huge pages whole: both places are 2 MiB aligned), so
//! its address changes; the name and the advice move with it.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::io;
use std::sync::Mutex;

const PAGE: usize = 4096;
const HUGE: usize = 2 << 20;

/// Start address and name of every live region.
static LIVE: Mutex<BTreeMap<usize, String>> = Mutex::new(BTreeMap::new());

/// The start address and name (`heft:<table>`) of every anonymous arena
/// of this process, in address order.
pub fn live() -> Vec<(u64, String)> {
    let live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    live.iter().map(|(a, n)| (*a as u64, n.clone())).collect()
}

fn register(addr: usize, name: &CString) {
    let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    live.insert(addr, name.to_string_lossy().into_owned());
}

fn unregister(addr: usize) {
    let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    live.remove(&addr);
}

/// An anonymous huge-page mapping between guard pages (see the module doc).
pub(crate) struct Region {
    ptr: *mut u8,
    len: usize,
    name: CString,
}

// SAFETY: a Region owns its mapping outright (nothing else maps or frees
// it); shared access only reads through `&self`, writes need `&mut self`.
unsafe impl Send for Region {}
// SAFETY: as above: `&Region` gives read-only access.
unsafe impl Sync for Region {}

impl Region {
    /// A new region of `len` bytes (a multiple of 4 KiB) named `name`.
    /// Fails with EINVAL where the kernel has no transparent huge pages.
    pub(crate) fn new(name: CString, len: usize) -> io::Result<Region> {
        let start = reserve(len)?;
        // SAFETY: `[start, start+len)` lies inside the PROT_NONE
        // reservation just made, which nothing else uses; MAP_FIXED
        // replaces it with fresh zeroed read-write memory.
        let p = unsafe {
            libc::mmap(
                start as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            unmap(start - PAGE, len + 2 * PAGE);
            return Err(e);
        }
        if let Err(e) = advise(start, len, libc::MADV_HUGEPAGE) {
            unmap(start - PAGE, len + 2 * PAGE);
            return Err(e);
        }
        // Best effort: a kernel without anonymous mapping names still
        // lists the region in `live`.
        let _ = set_name(start, len, &name);
        register(start, &name);
        Ok(Region {
            ptr: start as *mut u8,
            len,
            name,
        })
    }

    /// Grows the region to `new_len` bytes, moving it; on error it stays
    /// as it was.
    pub(crate) fn grow(&mut self, new_len: usize) -> io::Result<()> {
        let dst = reserve(new_len)?;
        // SAFETY: moves this region's own pages into the reservation just
        // made at `dst` (MREMAP_FIXED replaces it); nothing else points
        // into the old place, the caller holding the region `&mut`.
        let p = unsafe {
            libc::mremap(
                self.ptr as *mut libc::c_void,
                self.len,
                new_len,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                dst as *mut libc::c_void,
            )
        };
        if p == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            unmap(dst - PAGE, new_len + 2 * PAGE);
            return Err(e);
        }
        let old = self.ptr as usize;
        unmap(old - PAGE, PAGE);
        unmap(old + self.len, PAGE);
        unregister(old);
        register(dst, &self.name);
        self.ptr = dst as *mut u8;
        self.len = new_len;
        Ok(())
    }

    /// The region's name.
    pub(crate) fn name(&self) -> &CString {
        &self.name
    }

    /// Gives `[off, off+len)` back to the kernel (it reads as zeros after).
    pub(crate) fn discard(&self, off: usize, len: usize) -> io::Result<()> {
        assert!(off.checked_add(len).is_some_and(|end| end <= self.len));
        advise(self.ptr as usize + off, len, libc::MADV_DONTNEED)
    }

    /// Faults `[off, off+len)` in with one call (Linux 5.14+).
    pub(crate) fn populate(&self, off: usize, len: usize) -> io::Result<()> {
        assert!(off.checked_add(len).is_some_and(|end| end <= self.len));
        advise(self.ptr as usize + off, len, libc::MADV_POPULATE_WRITE)
    }
}

impl std::ops::Deref for Region {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the region maps `len` readable bytes at `ptr` for as long
        // as it lives; writes need `&mut self`, so none happens meanwhile.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl std::ops::DerefMut for Region {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        unregister(self.ptr as usize);
        unmap(self.ptr as usize - PAGE, self.len + 2 * PAGE);
    }
}

/// Reserves `len` bytes at a 2 MiB aligned address with a PROT_NONE page
/// before and after it (all three PROT_NONE for now); returns the address.
fn reserve(len: usize) -> io::Result<usize> {
    let total = len
        .checked_add(HUGE + 2 * PAGE)
        .ok_or(io::ErrorKind::OutOfMemory)?;
    // SAFETY: a fresh inaccessible mapping at an address the kernel picks;
    // it touches no memory of ours.
    let r = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            total,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if r == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let r = r as usize;
    let start = (r + PAGE).next_multiple_of(HUGE);
    let (head, end) = (start - PAGE, start + len + PAGE);
    if head > r {
        unmap(r, head - r);
    }
    if r + total > end {
        unmap(end, r + total - end);
    }
    Ok(start)
}

fn unmap(addr: usize, len: usize) {
    // SAFETY: only called on ranges of our own reservations and regions,
    // which nothing references any more.
    unsafe { libc::munmap(addr as *mut libc::c_void, len) };
}

fn advise(addr: usize, len: usize, advice: libc::c_int) -> io::Result<()> {
    // SAFETY: the range lies inside one of our regions; the advices used
    // (HUGEPAGE, DONTNEED on freed blocks, POPULATE_WRITE) change no byte
    // anyone still reads.
    if unsafe { libc::madvise(addr as *mut libc::c_void, len, advice) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Names the anonymous mapping at `[addr, addr+len)`.
fn set_name(addr: usize, len: usize, name: &CString) -> io::Result<()> {
    // SAFETY: PR_SET_VMA_ANON_NAME only labels the kernel's record of our
    // own mapping; it reads the NUL-terminated name, nothing else of ours.
    let rc = unsafe {
        libc::prctl(
            libc::PR_SET_VMA,
            libc::PR_SET_VMA_ANON_NAME as libc::c_ulong,
            addr as libc::c_ulong,
            len as libc::c_ulong,
            name.as_ptr() as libc::c_ulong,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
