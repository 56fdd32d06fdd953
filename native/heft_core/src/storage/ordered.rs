//! The key index of an ordered_set table: record handles ("locs", see
//! [`crate::arena`]) sorted by key, in two levels.
//!
//! - Blocks: one 4 KiB page each, holding up to 256 entries in key order:
//!   the locs in the first half of the page, each key's 8-byte prefix
//!   ([`crate::order::prefix`]) at the same slot of the second half.
//!   Every block but a lone one holds at least 64 (a block that falls
//!   below merges with a neighbour or takes from it), so the pages cost
//!   16 to 64 bytes a key, about 22 after random inserts.
//! - The directory: a vector of (page, count, first loc, first prefix), one
//!   24-byte entry a block, in key order. A search is a binary search over
//!   the blocks' first keys and then over one block's entries: about
//!   log2(n) steps, each comparing the prefixes in the directory or the
//!   page, and reading the key from the arena only when the prefixes are
//!   equal (prefixes keep term order, so unequal ones decide).
//!
//! Keys live in the arena; the index compares them through a callback
//! (`cmp(loc)` orders the key stored at `loc` against the one looked for),
//! as [`crate::index`] does, so it holds no key bytes but the prefixes.
//! A search given no prefix (or an index holding a key that has none:
//! input the table never stores) compares every step through `cmp`.
//!
//! A [`Pos`] is only good until the next change: a walk that lets others
//! write between steps resumes from its last key with [`OrderedIndex::seek`]
//! (present or not), never from a position.
//!
//! The pages are a memfd mapping of their own (`/memfd:heft-index:<label>`
//! in /proc/PID/maps), like the hash index's slot array: what the index
//! holds is exact and visible to the kernel. A page emptied by deletions
//! is punched out of the memfd and reused before the mapping grows.

use std::cmp::Ordering::{self, Equal, Less};
use std::fs::File;

use memmap2::MmapMut;

use crate::index::Inserted;

/// Bytes of a block's page.
const PAGE: usize = 4096;
/// Entries in a full block: a loc and a prefix, 8 bytes each.
const PER_BLOCK: usize = PAGE / 16;
/// Where a page's prefixes start (slot `i`'s at `PREFIXES + 8 * i`).
const PREFIXES: usize = PAGE / 2;
/// A block (other than a lone one) never holds fewer locs than this.
const MIN_FILL: usize = PER_BLOCK / 4;
/// What [`OrderedIndex::pack`] fills a block to: room left for inserts
/// before a block splits.
const PACK_FILL: usize = PER_BLOCK * 7 / 8;
/// Pages mapped at first (address space only until used).
const INITIAL_PAGES: usize = 16;

/// A position in the index: a block and a slot in it. The end of the index
/// is block `blocks`, slot 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pos {
    block: usize,
    slot: usize,
}

/// One block's directory entry.
#[derive(Clone, Copy, Debug)]
struct Block {
    page: u32,
    len: u32,
    /// The loc in slot 0 (its key is the block's smallest).
    first: u64,
    /// The prefix of that key.
    first_prefix: u64,
}

/// Pages of a memfd, handed out and taken back one at a time.
struct Pages {
    file: File,
    map: MmapMut,
    /// Pages handed out so far (free ones included).
    top: usize,
    /// Pages given back, punched out of the memfd, for reuse.
    free: Vec<u32>,
}

impl Pages {
    fn new(name: &str) -> Pages {
        let bytes = (INITIAL_PAGES * PAGE) as u64;
        // A memfd and a mapping of it only fail when the process is out of
        // descriptors or address space, where a Vec would abort as well.
        let file = crate::arena::memfd(name, bytes).expect("creating the index memfd");
        let map = crate::arena::map_file(&file, bytes, false).expect("mapping the index pages");
        Pages {
            file,
            map,
            top: 0,
            free: Vec::new(),
        }
    }

    fn alloc(&mut self) -> u32 {
        if let Some(p) = self.free.pop() {
            return p;
        }
        let p = self.top;
        let needed = (p + 1) * PAGE;
        if needed > self.map.len() {
            let grown = self.map.len() + (self.map.len() / 2).max(INITIAL_PAGES * PAGE);
            crate::arena::grow_memfd(&self.file, &mut self.map, grown as u64)
                .expect("growing the index pages");
        }
        self.top += 1;
        p as u32
    }

    fn free(&mut self, p: u32) {
        // A page that cannot be punched is still reused; it just keeps its
        // memory until then.
        let _ = crate::arena::punch_hole(&self.file, p as u64 * PAGE as u64, PAGE as u64);
        self.free.push(p);
    }

    fn page(&self, p: u32) -> &[u8] {
        let start = p as usize * PAGE;
        &self.map[start..start + PAGE]
    }

    fn page_mut(&mut self, p: u32) -> &mut [u8] {
        let start = p as usize * PAGE;
        &mut self.map[start..start + PAGE]
    }

    fn word(&self, p: u32, at: usize) -> u64 {
        let mut w = [0u8; 8];
        w.copy_from_slice(&self.page(p)[at..at + 8]);
        u64::from_le_bytes(w)
    }

    /// The loc in a slot.
    fn get(&self, p: u32, slot: usize) -> u64 {
        self.word(p, slot * 8)
    }

    /// The prefix in a slot.
    fn prefix(&self, p: u32, slot: usize) -> u64 {
        self.word(p, PREFIXES + slot * 8)
    }

    fn set(&mut self, p: u32, slot: usize, loc: u64, prefix: u64) {
        let page = self.page_mut(p);
        page[slot * 8..slot * 8 + 8].copy_from_slice(&loc.to_le_bytes());
        let at = PREFIXES + slot * 8;
        page[at..at + 8].copy_from_slice(&prefix.to_le_bytes());
    }

    fn set_loc(&mut self, p: u32, slot: usize, loc: u64) {
        self.page_mut(p)[slot * 8..slot * 8 + 8].copy_from_slice(&loc.to_le_bytes());
    }

    /// Moves slots `[from, from + n)` of page `p` to start at `to`.
    fn shift(&mut self, p: u32, from: usize, n: usize, to: usize) {
        let page = self.page_mut(p);
        for base in [0, PREFIXES] {
            page.copy_within(base + from * 8..base + (from + n) * 8, base + to * 8);
        }
    }

    /// Copies `n` slots from page `src` (from slot `from`) to page `dst`
    /// (from slot `to`).
    fn copy(&mut self, src: u32, from: usize, n: usize, dst: u32, to: usize) {
        let mut buf = [0u8; PAGE];
        for base in [0, PREFIXES] {
            let (a, b) = (base + from * 8, base + to * 8);
            buf[..n * 8].copy_from_slice(&self.page(src)[a..a + n * 8]);
            self.page_mut(dst)[b..b + n * 8].copy_from_slice(&buf[..n * 8]);
        }
    }

    /// Pages holding locs (handed out and not given back), in bytes.
    fn used_bytes(&self) -> usize {
        (self.top - self.free.len()) * PAGE
    }
}

/// Locs sorted by key. See the module documentation.
pub struct OrderedIndex {
    dir: Vec<Block>,
    pages: Pages,
    len: usize,
    /// False once a key without a prefix was added: searches then compare
    /// every step through `cmp` (until [`OrderedIndex::clear`]).
    prefixed: bool,
    /// The memfd's name: `heft-index:<label>`.
    name: String,
}

/// A key looked for: its prefix ([`crate::order::prefix`], `None` if it
/// has none) and `cmp(loc)`, which orders the key stored at `loc` against
/// it.
pub struct Probe<F> {
    pub prefix: Option<u64>,
    pub cmp: F,
}

impl<F: FnMut(u64) -> Ordering> Probe<F> {
    /// The stored key (`prefix`, at `loc`) against the probe: by the
    /// prefixes when they differ, else through `cmp`.
    fn order(&mut self, prefix: u64, loc: u64) -> Ordering {
        match self.prefix {
            Some(p) if p != prefix => prefix.cmp(&p),
            _ => (self.cmp)(loc),
        }
    }
}

impl OrderedIndex {
    /// An empty index; `label` names its mapping (see [`crate::arena`]).
    pub fn new(label: &str) -> Self {
        let name = format!("heft-index:{}", crate::arena::sanitize(label));
        OrderedIndex {
            dir: Vec::new(),
            pages: Pages::new(&name),
            len: 0,
            prefixed: true,
            name,
        }
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when there are no keys.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes the index holds: its pages in use (4 KiB each; pages given
    /// back to the kernel are not counted) and the heap capacity of its
    /// directory and free-page list. The allocator's own overhead is left
    /// out.
    pub fn heap_bytes(&self) -> u64 {
        let dir = self.dir.capacity() * std::mem::size_of::<Block>();
        let free = self.pages.free.capacity() * std::mem::size_of::<u32>();
        (self.pages.used_bytes() + dir + free) as u64
    }

    /// Start address of the pages' mapping (to find it in smaps).
    pub fn address(&self) -> usize {
        self.pages.map.as_ptr() as usize
    }

    /// The end position (just after the last key).
    pub fn end(&self) -> Pos {
        Pos {
            block: self.dir.len(),
            slot: 0,
        }
    }

    /// The loc at `pos`, or `None` at the end or past it.
    pub fn get(&self, pos: Pos) -> Option<u64> {
        let b = self.dir.get(pos.block)?;
        (pos.slot < b.len as usize).then(|| self.pages.get(b.page, pos.slot))
    }

    /// Points the entry at `pos` to a new loc (for an equal key, which has
    /// the same prefix).
    pub fn set_loc(&mut self, pos: Pos, loc: u64) {
        let Some(b) = self.dir.get_mut(pos.block) else {
            return;
        };
        if pos.slot == 0 {
            b.first = loc;
        }
        let page = b.page;
        self.pages.set_loc(page, pos.slot, loc);
    }

    /// The first position whose key is not less than the probe, and whether
    /// that key equals it. `cmp(loc)` orders the key at `loc` against the
    /// probe; every step calls it (see [`OrderedIndex::seek_key`]).
    pub fn seek(&self, cmp: impl FnMut(u64) -> Ordering) -> (Pos, bool) {
        self.seek_key(&mut Probe { prefix: None, cmp })
    }

    /// [`OrderedIndex::seek`] for a key with its prefix: `cmp` is called
    /// only where the prefixes are equal.
    pub fn seek_key(&self, probe: &mut Probe<impl FnMut(u64) -> Ordering>) -> (Pos, bool) {
        if !self.prefixed {
            probe.prefix = None;
        }
        let (nb, eq) = lower_bound(self.dir.len(), |i| {
            probe.order(self.dir[i].first_prefix, self.dir[i].first)
        });
        if eq || nb == 0 {
            return (Pos { block: nb, slot: 0 }, eq);
        }
        // The probe lies after the first key of block nb - 1.
        let b = self.dir[nb - 1];
        let (j, eq) = lower_bound(b.len as usize - 1, |i| {
            probe.order(
                self.pages.prefix(b.page, i + 1),
                self.pages.get(b.page, i + 1),
            )
        });
        if j + 1 < b.len as usize {
            (
                Pos {
                    block: nb - 1,
                    slot: j + 1,
                },
                eq,
            )
        } else {
            (Pos { block: nb, slot: 0 }, false)
        }
    }

    /// The position of the key equal to the probe.
    pub fn find(&self, mut probe: Probe<impl FnMut(u64) -> Ordering>) -> Option<Pos> {
        match self.seek_key(&mut probe) {
            (pos, true) => Some(pos),
            _ => None,
        }
    }

    /// The first position whose key is greater than the probe.
    pub fn seek_after(&self, mut probe: Probe<impl FnMut(u64) -> Ordering>) -> Option<Pos> {
        match self.seek_key(&mut probe) {
            (pos, true) => self.next(pos),
            (pos, false) => self.get(pos).map(|_| pos),
        }
    }

    /// The last position whose key is less than the probe.
    pub fn seek_before(&self, mut probe: Probe<impl FnMut(u64) -> Ordering>) -> Option<Pos> {
        self.prev(self.seek_key(&mut probe).0)
    }

    /// The position of the `i`-th key (from 0) in key order, if any: a
    /// walk over the directory's block counts, not over the keys.
    pub fn nth(&self, mut i: usize) -> Option<Pos> {
        for (block, b) in self.dir.iter().enumerate() {
            let len = b.len as usize;
            if i < len {
                return Some(Pos { block, slot: i });
            }
            i -= len;
        }
        None
    }

    /// The first position, if any.
    pub fn first(&self) -> Option<Pos> {
        self.get(Pos { block: 0, slot: 0 })
            .map(|_| Pos { block: 0, slot: 0 })
    }

    /// The last position, if any.
    pub fn last(&self) -> Option<Pos> {
        self.prev(self.end())
    }

    /// The position after `pos`, if any.
    pub fn next(&self, pos: Pos) -> Option<Pos> {
        let b = self.dir.get(pos.block)?;
        if pos.slot + 1 < b.len as usize {
            Some(Pos {
                block: pos.block,
                slot: pos.slot + 1,
            })
        } else {
            (pos.block + 1 < self.dir.len()).then_some(Pos {
                block: pos.block + 1,
                slot: 0,
            })
        }
    }

    /// The position before `pos` (which may be the end), if any.
    pub fn prev(&self, pos: Pos) -> Option<Pos> {
        if pos.slot > 0 {
            return Some(Pos {
                block: pos.block,
                slot: pos.slot - 1,
            });
        }
        let block = pos.block.checked_sub(1)?;
        let b = self.dir.get(block)?;
        Some(Pos {
            block,
            slot: b.len as usize - 1,
        })
    }

    /// Inserts `loc` (of the probe's key), or replaces the loc of an equal
    /// key.
    pub fn insert(&mut self, loc: u64, mut probe: Probe<impl FnMut(u64) -> Ordering>) -> Inserted {
        let prefix = probe.prefix;
        match self.seek_key(&mut probe) {
            (pos, true) => {
                let old = self.get(pos).unwrap_or_default();
                self.set_loc(pos, loc);
                Inserted::Replaced(old)
            }
            (pos, false) => {
                self.insert_at(pos, loc, prefix);
                Inserted::New
            }
        }
    }

    /// Inserts `loc`, whose key has this prefix, at `pos` (from
    /// [`OrderedIndex::seek`], with no change since), before the key there.
    pub fn insert_at(&mut self, pos: Pos, loc: u64, prefix: Option<u64>) {
        self.prefixed &= prefix.is_some();
        let prefix = prefix.unwrap_or(0);
        if self.dir.is_empty() {
            let page = self.pages.alloc();
            self.pages.set(page, 0, loc, prefix);
            self.dir.push(Block {
                page,
                len: 1,
                first: loc,
                first_prefix: prefix,
            });
            self.len = 1;
            return;
        }
        // The start of a block is also the end of the one before: append
        // there, which keeps both blocks' first keys.
        let (mut b, mut slot) = if pos.slot == 0 && pos.block > 0 {
            (pos.block - 1, self.dir[pos.block - 1].len as usize)
        } else {
            (pos.block, pos.slot)
        };
        if self.dir[b].len as usize == PER_BLOCK {
            self.split(b);
            let half = self.dir[b].len as usize;
            if slot > half {
                b += 1;
                slot -= half;
            }
        }
        let Block { page, len, .. } = self.dir[b];
        let len = len as usize;
        self.pages.shift(page, slot, len - slot, slot + 1);
        self.pages.set(page, slot, loc, prefix);
        self.dir[b].len += 1;
        if slot == 0 {
            self.dir[b].first = loc;
            self.dir[b].first_prefix = prefix;
        }
        self.len += 1;
    }

    /// Removes the entry at `pos`; returns its loc.
    pub fn remove_at(&mut self, pos: Pos) -> Option<u64> {
        let loc = self.get(pos)?;
        let b = pos.block;
        let Block { page, len, .. } = self.dir[b];
        let len = len as usize;
        self.pages
            .shift(page, pos.slot + 1, len - pos.slot - 1, pos.slot);
        self.dir[b].len -= 1;
        self.len -= 1;
        if len == 1 {
            self.pages.free(page);
            self.dir.remove(b);
            return Some(loc);
        }
        if pos.slot == 0 {
            self.set_first(b);
        }
        if (len - 1) < MIN_FILL {
            self.rebalance(b);
        }
        Some(loc)
    }

    /// Packs the blocks from block `from` on, `budget` blocks at most: each
    /// takes the following blocks' smallest entries until it holds
    /// [`PACK_FILL`], and a block emptied so gives its page back. After
    /// random deletions the blocks sit near [`MIN_FILL`]; packed, the index
    /// takes about a third of the pages. Returns the block the next call
    /// goes on from, or `None` once the last block is reached. A [`Pos`]
    /// taken before is no good after (as after any change).
    pub fn pack(&mut self, from: usize, budget: usize) -> Option<usize> {
        let end = from.saturating_add(budget.max(2)).min(self.dir.len());
        if end <= from + 1 {
            return None;
        }
        let mut kept = Vec::with_capacity(end - from);
        let mut cur = self.dir[from];
        for i in from + 1..end {
            let mut next = self.dir[i];
            let (cl, nl) = (cur.len as usize, next.len as usize);
            if cl < PACK_FILL {
                let k = (PACK_FILL - cl).min(nl);
                self.pages.copy(next.page, 0, k, cur.page, cl);
                cur.len += k as u32;
                if k == nl {
                    self.pages.free(next.page);
                    continue;
                }
                self.pages.shift(next.page, k, nl - k, 0);
                next.len -= k as u32;
                next.first = self.pages.get(next.page, 0);
                next.first_prefix = self.pages.prefix(next.page, 0);
            }
            kept.push(cur);
            cur = next;
        }
        // The window's last block goes on in the next call (it may take
        // from the block after it).
        kept.push(cur);
        let last = from + kept.len() - 1;
        self.dir.splice(from..end, kept);
        (last + 1 < self.dir.len()).then_some(last)
    }

    /// Drops every entry and gives the pages back.
    pub fn clear(&mut self) {
        self.dir = Vec::new();
        self.pages = Pages::new(&self.name);
        self.len = 0;
        self.prefixed = true;
    }

    /// Reads block `b`'s first loc and prefix from its page.
    fn set_first(&mut self, b: usize) {
        let page = self.dir[b].page;
        self.dir[b].first = self.pages.get(page, 0);
        self.dir[b].first_prefix = self.pages.prefix(page, 0);
    }

    /// Splits a full block into two halves.
    fn split(&mut self, b: usize) {
        let Block { page, len, .. } = self.dir[b];
        let half = len as usize / 2;
        let moved = len as usize - half;
        let new = self.pages.alloc();
        self.pages.copy(page, half, moved, new, 0);
        self.dir[b].len = half as u32;
        self.dir.insert(
            b + 1,
            Block {
                page: new,
                len: moved as u32,
                first: 0,
                first_prefix: 0,
            },
        );
        self.set_first(b + 1);
    }

    /// Brings block `b`, under `MIN_FILL`, back up: merges it with a
    /// neighbour if both fit in one block, or moves locs over from the
    /// neighbour so both hold at least half of a block.
    fn rebalance(&mut self, b: usize) {
        let (l, r) = if b + 1 < self.dir.len() {
            (b, b + 1)
        } else if b > 0 {
            (b - 1, b)
        } else {
            return; // a lone block may hold any number
        };
        let (lb, rb) = (self.dir[l], self.dir[r]);
        let (ll, rl) = (lb.len as usize, rb.len as usize);
        if ll + rl <= PER_BLOCK {
            self.pages.copy(rb.page, 0, rl, lb.page, ll);
            self.dir[l].len = (ll + rl) as u32;
            self.pages.free(rb.page);
            self.dir.remove(r);
            return;
        }
        let target = (ll + rl) / 2;
        if ll < target {
            // Take the right block's smallest keys.
            let k = target - ll;
            self.pages.copy(rb.page, 0, k, lb.page, ll);
            self.pages.shift(rb.page, k, rl - k, 0);
            self.dir[l].len += k as u32;
            self.dir[r].len -= k as u32;
        } else {
            // Give the right block the left one's largest keys.
            let k = target - rl;
            self.pages.shift(rb.page, 0, rl, k);
            self.pages.copy(lb.page, ll - k, k, rb.page, 0);
            self.dir[l].len -= k as u32;
            self.dir[r].len += k as u32;
        }
        self.set_first(r);
    }
}

/// The number of leading items (of `n`) that are `Less`, and whether the
/// item just after them is `Equal`; `f(i)` orders item `i`, items ordered.
fn lower_bound(n: usize, mut f: impl FnMut(usize) -> Ordering) -> (usize, bool) {
    let (mut lo, mut hi) = (0, n);
    let mut eq = false;
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        match f(mid) {
            Less => lo = mid + 1,
            o => {
                hi = mid;
                eq = o == Equal;
            }
        }
    }
    (lo, eq)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::Rng;
    use std::collections::BTreeMap;

    /// Keys are u64s stored "in the arena" as loc = key * 2 + 1 (locs are
    /// never 0), so the test sees which key a loc stands for.
    fn loc(k: u64) -> u64 {
        k * 2 + 1
    }

    fn key(loc: u64) -> u64 {
        loc / 2
    }

    fn cmp_with(k: u64) -> impl Fn(u64) -> Ordering {
        move |l| key(l).cmp(&k)
    }

    /// An order-keeping prefix with ties (eight keys share one), so that
    /// searches decide by prefixes and by `cmp` both.
    fn prefix(k: u64) -> u64 {
        k >> 3
    }

    fn probe(k: u64) -> Probe<impl Fn(u64) -> Ordering> {
        Probe {
            prefix: Some(prefix(k)),
            cmp: cmp_with(k),
        }
    }

    fn keys(ix: &OrderedIndex) -> Vec<u64> {
        let mut out = Vec::new();
        let mut p = ix.first();
        while let Some(pos) = p {
            out.push(key(ix.get(pos).unwrap()));
            p = ix.next(pos);
        }
        out
    }

    fn check_invariants(ix: &OrderedIndex) {
        let mut total = 0;
        for (i, b) in ix.dir.iter().enumerate() {
            assert!(b.len > 0);
            assert!(b.len as usize <= PER_BLOCK);
            if ix.dir.len() > 1 {
                assert!(b.len as usize >= MIN_FILL, "block {i} holds {}", b.len);
            }
            assert_eq!(b.first, ix.pages.get(b.page, 0), "block {i}'s first");
            assert_eq!(
                b.first_prefix,
                ix.pages.prefix(b.page, 0),
                "block {i}'s prefix"
            );
            for s in 0..b.len as usize {
                let k = key(ix.pages.get(b.page, s));
                if ix.prefixed {
                    assert_eq!(ix.pages.prefix(b.page, s), prefix(k), "key {k}'s prefix");
                }
            }
            total += b.len as usize;
        }
        assert_eq!(total, ix.len());
        let ks = keys(ix);
        assert!(ks.windows(2).all(|w| w[0] < w[1]), "sorted and unique");
        // Backwards walks see the same keys.
        let mut back = Vec::new();
        let mut p = ix.last();
        while let Some(pos) = p {
            back.push(key(ix.get(pos).unwrap()));
            p = ix.prev(pos);
        }
        back.reverse();
        assert_eq!(back, ks);
    }

    #[test]
    fn behaves_like_a_btreemap_under_random_operations() {
        let mut ix = OrderedIndex::new("test");
        let mut model: BTreeMap<u64, u64> = BTreeMap::new();
        let mut r = Rng(0x2545_f491_4f6c_dd1d);
        for step in 0..200_000u64 {
            let x = r.next();
            // Phases of growth and shrinkage exercise splits and merges.
            let range = if (step / 40_000) % 2 == 0 {
                20_000
            } else {
                2_000
            };
            let k = x % range;
            match x % 7 {
                0..=3 => {
                    // Replace keeps the key, changes the loc's "version"
                    // (kept in the model only).
                    let inserted = ix.insert(loc(k), probe(k));
                    let was = model.insert(k, step);
                    assert_eq!(inserted == Inserted::New, was.is_none());
                }
                4 | 5 => {
                    let (pos, found) = ix.seek_key(&mut probe(k));
                    assert_eq!(
                        ix.seek(cmp_with(k)),
                        (pos, found),
                        "with and without prefixes"
                    );
                    assert_eq!(found, model.contains_key(&k));
                    if found {
                        assert_eq!(ix.remove_at(pos), Some(loc(k)));
                        model.remove(&k);
                    }
                }
                _ => {
                    let after = ix.seek_after(probe(k)).and_then(|p| ix.get(p));
                    let want = model.range(k + 1..).next().map(|(&k, _)| loc(k));
                    assert_eq!(after, want, "after {k}");
                    let before = ix.seek_before(probe(k)).and_then(|p| ix.get(p));
                    let want = model.range(..k).next_back().map(|(&k, _)| loc(k));
                    assert_eq!(before, want, "before {k}");
                }
            }
            if step % 20_000 == 0 {
                check_invariants(&ix);
            }
        }
        check_invariants(&ix);
        assert_eq!(keys(&ix), model.keys().copied().collect::<Vec<_>>());
    }

    #[test]
    fn a_walk_resumes_from_its_last_key_across_concurrent_changes() {
        let mut ix = OrderedIndex::new("walk");
        for k in (0..10_000).map(|k| k * 3) {
            ix.insert(loc(k), probe(k));
        }
        // Walk in chunks of 50, and between chunks delete the key just
        // returned and its neighbours, and insert keys before and after the
        // cursor: every key present throughout is seen once, in order.
        let mut seen = Vec::new();
        let mut last: Option<u64> = None;
        let mut r = Rng(7);
        loop {
            let mut p = match last {
                None => ix.first(),
                Some(k) => ix.seek_after(probe(k)),
            };
            let mut n = 0;
            while let (Some(pos), true) = (p, n < 50) {
                let k = key(ix.get(pos).unwrap());
                seen.push(k);
                last = Some(k);
                p = ix.next(pos);
                n += 1;
            }
            if n == 0 {
                break;
            }
            let c = last.unwrap();
            for k in [c, c + 3, c.saturating_sub(3)] {
                if let Some(pos) = ix.find(probe(k)) {
                    ix.remove_at(pos);
                }
            }
            for _ in 0..30 {
                let k = r.next() % 30_000;
                if k % 3 != 0 {
                    ix.insert(loc(k), probe(k));
                }
            }
        }
        assert!(seen.windows(2).all(|w| w[0] < w[1]), "in order, no repeats");
        // Keys present throughout: multiples of 3 never deleted.
        let deleted: std::collections::HashSet<u64> = seen
            .iter()
            .flat_map(|&c| [c + 3, c.saturating_sub(3)])
            .collect();
        for k in (0..10_000).map(|k| k * 3).filter(|k| !deleted.contains(k)) {
            assert!(seen.binary_search(&k).is_ok(), "key {k} missed");
        }
        check_invariants(&ix);
    }

    #[test]
    fn memory_is_pages_in_use_plus_the_directory_and_shrinks_after_deletes() {
        let mut ix = OrderedIndex::new("mem");
        let empty = ix.heap_bytes();
        assert_eq!(empty, 0);
        for k in 0..100_000u64 {
            // Random order, as keys usually arrive.
            let k = k.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 20;
            ix.insert(loc(k), probe(k));
        }
        let n = ix.len() as u64;
        let full = ix.heap_bytes();
        let pages = ix.dir.len() as u64 * PAGE as u64;
        assert_eq!(
            full,
            pages
                + (ix.dir.capacity() * std::mem::size_of::<Block>()) as u64
                + (ix.pages.free.capacity() * 4) as u64
        );
        assert_eq!(std::mem::size_of::<Block>(), 24);
        assert!(full / n <= 32, "{} bytes a key", full / n);
        // Delete all but every 100th key.
        let all = keys(&ix);
        for (i, k) in all.iter().enumerate() {
            if i % 100 != 0 {
                let pos = ix.find(probe(*k)).unwrap();
                ix.remove_at(pos);
            }
        }
        check_invariants(&ix);
        assert!(
            ix.dir.len() * PAGE * 20 < pages as usize,
            "pages were freed"
        );
        ix.clear();
        assert_eq!(ix.heap_bytes(), 0);
        assert!(ix.first().is_none());
    }

    #[test]
    fn the_kernel_holds_exactly_the_pages_counted() {
        let mut ix = OrderedIndex::new("smaps");
        for k in 0..200_000u64 {
            let k = k.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 16;
            ix.insert(loc(k), probe(k));
        }
        // Empty a third of the blocks: their pages are punched out.
        let all = keys(&ix);
        for k in &all[..all.len() / 3] {
            let pos = ix.find(probe(*k)).unwrap();
            ix.remove_at(pos);
        }
        let usage = crate::accounting::mappings(&[ix.address() as u64]).unwrap()[0]
            .expect("the index pages are a mapping of their own");
        assert_eq!(usage.resident, ix.pages.used_bytes() as u64);
        let dir = (ix.dir.capacity() * std::mem::size_of::<Block>() + ix.pages.free.capacity() * 4)
            as u64;
        assert_eq!(ix.heap_bytes(), usage.resident + dir);
    }

    #[test]
    fn sequential_inserts_at_either_end() {
        let mut ix = OrderedIndex::new("seq");
        for k in 0..5_000u64 {
            ix.insert(loc(10_000 + k), probe(10_000 + k));
            ix.insert(loc(10_000 - k - 1), probe(10_000 - k - 1));
        }
        check_invariants(&ix);
        assert_eq!(keys(&ix), (5_000..15_000).collect::<Vec<_>>());
        assert_eq!(ix.get(ix.last().unwrap()), Some(loc(14_999)));
        assert_eq!(ix.seek(cmp_with(20_000)).0, ix.end());
        assert_eq!(ix.seek_key(&mut probe(20_000)).0, ix.end());
        assert_eq!(ix.get(ix.end()), None);
    }

    /// Every key, in walk order.
    fn walk(ix: &OrderedIndex) -> Vec<u64> {
        std::iter::successors(ix.first(), |&p| ix.next(p))
            .map(|p| key(ix.get(p).unwrap()))
            .collect()
    }

    #[test]
    fn packing_keeps_every_key_in_order_and_gives_pages_back() {
        let mut ix = OrderedIndex::new("pack");
        let mut model = BTreeMap::new();
        let mut rng = Rng(0x5eed_1234);
        for _ in 0..60_000 {
            let k = rng.below(1 << 40);
            if let Inserted::New = ix.insert(loc(k), probe(k)) {
                model.insert(k, ());
            }
        }
        for k in model.keys().copied().collect::<Vec<_>>() {
            if rng.below(10) > 1 {
                let pos = ix.find(probe(k)).unwrap();
                ix.remove_at(pos);
                model.remove(&k);
            }
        }
        let before = ix.heap_bytes();
        let mut from = Some(0);
        let mut steps = 0;
        while let Some(b) = from {
            from = ix.pack(b, 7);
            steps += 1;
            // Between steps the index is whole: searches find every key.
            if steps % 25 == 0 {
                for &k in model.keys().take(200) {
                    assert!(ix.find(probe(k)).is_some());
                }
            }
        }
        assert!(
            ix.heap_bytes() < before / 2,
            "{before} -> {}",
            ix.heap_bytes()
        );
        assert_eq!(walk(&ix), model.keys().copied().collect::<Vec<_>>());
        assert_eq!(ix.len(), model.len());
        for &k in model.keys() {
            assert_eq!(ix.get(ix.find(probe(k)).unwrap()), Some(loc(k)));
        }
        // It goes on as before: inserts split full blocks.
        for k in 0..5_000u64 {
            let k = k * 7919 + 3;
            if let Inserted::New = ix.insert(loc(k), probe(k)) {
                model.insert(k, ());
            }
        }
        assert_eq!(walk(&ix), model.keys().copied().collect::<Vec<_>>());
    }

    #[test]
    fn prefixes_decide_unequal_keys_and_cmp_only_breaks_ties() {
        let mut ix = OrderedIndex::new("ties");
        for k in 0..20_000u64 {
            let k = k.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 44;
            ix.insert(loc(k), probe(k));
        }
        check_invariants(&ix);
        // With a prefix unique to each key, a search of a present key
        // reads one key (the equal one) at most.
        let mut exact = OrderedIndex::new("exact");
        for k in 0..20_000u64 {
            exact.insert(
                loc(k),
                Probe {
                    prefix: Some(k),
                    cmp: cmp_with(k),
                },
            );
        }
        for k in (0..20_000u64).step_by(97) {
            let mut calls = 0;
            let found = exact.find(Probe {
                prefix: Some(k),
                cmp: |l| {
                    calls += 1;
                    cmp_with(k)(l)
                },
            });
            assert_eq!(found.and_then(|p| exact.get(p)), Some(loc(k)));
            assert!(calls <= 1, "{calls} keys read for {k}");
        }
        // A key added without a prefix turns them off: still right.
        exact.insert(
            loc(30_000),
            Probe {
                prefix: None,
                cmp: cmp_with(30_000),
            },
        );
        for k in [0, 5, 19_999, 30_000] {
            let p = exact.find(Probe {
                prefix: Some(k),
                cmp: cmp_with(k),
            });
            assert_eq!(p.and_then(|p| exact.get(p)), Some(loc(k)));
        }
        let p = exact.seek_after(Probe {
            prefix: Some(19_999),
            cmp: cmp_with(19_999),
        });
        assert_eq!(p.and_then(|p| exact.get(p)), Some(loc(30_000)));
        exact.clear();
        assert!(exact.prefixed);
    }
}
