//! Structural sharing while encoding (docs/term-format.md, "Sharing").
//!
//! An encoder that walks a term in pre-order tells a [`Dedup`] about every
//! node it writes: [`Dedup::open`] after a compound's header (or a whole
//! binary or etf piece), [`Dedup::leaf`] after any other term or a `ref`.
//! When a compound is complete, its *signature* is its header followed by
//! one item per child: the child's bytes for a scalar or a small compound,
//! `ref class` for a compound held here (the id of its first equal copy).
//! Equal signatures mean equal terms (by induction, compared as bytes, so
//! -0.0 and 0.0 differ), and a compound whose signature was seen before is
//! cut from the writer and replaced by `ref class`: the writer's ids go back
//! to the duplicate's own id, the entries made inside it are dropped, and the
//! encoder is told to drop the identity entries it made since (its `mark`).
//!
//! Cost is linear: a signature holds each child once, hashes fold its bytes,
//! a hit is verified by comparing them (at most [`MAX_PROBES`] candidates
//! after the first [`LINEAR`]), and a rollback removes only what was made
//! inside the removed bytes.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::codec::{put_varint, tag, Writer};

/// Compounds whose encoding is shorter than this are not merged (a `ref`
/// takes 2 or more bytes); their bytes stand in their parent's signature.
pub const MIN_SHARED_LEN: usize = 4;

/// The same for a binary or etf piece. A short binary is cheap to build
/// twice (a few words), and most records hold one or two short unique
/// ones (names, ids): not looking them up keeps their parents' signatures
/// uncopied and their inserts as fast as without merging.
pub const MIN_SHARED_LEAF_LEN: usize = 16;

/// Entries looked through in order before the hash map is used.
const LINEAR: usize = 16;

/// Candidates of one hash compared at most (bounds the work on collisions).
const MAX_PROBES: usize = 4;

const NONE: u32 = u32::MAX;

/// An open compound.
struct Frame<T> {
    /// Where its encoding starts in the writer.
    start: usize,
    id: u32,
    /// Children still to come.
    left: usize,
    /// Where its signature starts in `sig`, once it is not `flat`.
    sig: usize,
    /// Its signature is still its own encoding (`w.buf[start..]`): no child
    /// so far was a compound held here. Most compounds stay so, and their
    /// signature is never copied.
    flat: bool,
    /// A binary or etf piece (or an empty tuple or map: no parts).
    leaf: bool,
    /// `entries` and `store` lengths when it was opened.
    entries: usize,
    store: usize,
    /// The encoder's mark and identity for it.
    mark: usize,
    payload: T,
}

/// A complete compound that later equal ones refer to.
struct Entry {
    /// Its signature's hash, for an entry in the hash map part (past the
    /// first [`LINEAR`]); the first ones are compared byte by byte and
    /// never hashed (most are never compared at all: a record's outermost
    /// compounds, a lone large binary).
    hash: Option<u64>,
    class: u32,
    /// Its signature: `store[off..off + len]`, or the writer's bytes for a
    /// binary or etf piece (its own encoding).
    in_buf: bool,
    off: usize,
    len: usize,
    /// The previous entry of the same hash (hash map part only).
    next: u32,
}

/// Hashes already mixed: used as they are.
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

/// A compound whose header (or whole encoding, for a binary or etf piece)
/// was just written, as told to [`Dedup::open`].
pub struct Opened<T> {
    /// Where it starts in the writer.
    pub start: usize,
    /// Its id, as the writer gave it.
    pub id: u32,
    /// The terms that follow as its parts (0 for a binary or etf piece).
    pub children: usize,
    /// The encoder's mark to roll back to, and its name for the term: both
    /// handed back if the compound turns out a duplicate.
    pub mark: usize,
    pub payload: T,
}

/// Merges structurally equal compounds of one encoding into `ref`s. `T` is
/// what the encoder calls a term (handed back when a duplicate is merged).
pub struct Dedup<T> {
    frames: Vec<Frame<T>>,
    /// Signatures of the open compounds, innermost last.
    sig: Vec<u8>,
    /// Signatures of the entries.
    store: Vec<u8>,
    entries: Vec<Entry>,
    /// Hash -> last entry of that hash, for entries past the first LINEAR.
    head: HashMap<u64, u32, BuildHasherDefault<IdHasher>>,
}

impl<T> Default for Dedup<T> {
    fn default() -> Self {
        Dedup {
            frames: Vec::new(),
            sig: Vec::new(),
            store: Vec::new(),
            entries: Vec::new(),
            head: HashMap::default(),
        }
    }
}

/// A signature's hash: 8 bytes at a time, then mixed (murmur3's finalizer).
fn hash(bytes: &[u8]) -> u64 {
    let mut h = (bytes.len() as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        let v = u64::from_le_bytes(c.try_into().unwrap_or_default());
        h = (h.rotate_left(23) ^ v).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    // The last 0-7 bytes, read without a call to memcpy.
    let last = (chunks.remainder().iter().rev()).fold(0u64, |acc, b| acc << 8 | u64::from(*b));
    h = (h.rotate_left(23) ^ last).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// An entry's signature: in `store`, or in the writer's `buf`.
fn bytes_of<'a>(e: &Entry, store: &'a [u8], buf: &'a [u8]) -> &'a [u8] {
    match e.in_buf {
        true => &buf[e.off..e.off + e.len],
        false => &store[e.off..e.off + e.len],
    }
}

/// The class of an entry whose signature is `s`: among the first
/// [`LINEAR`] by their bytes, then through the hash map. `h` is `s`'s
/// hash, computed here only for the hash map (and left for the caller).
fn find(
    entries: &[Entry],
    head: &HashMap<u64, u32, BuildHasherDefault<IdHasher>>,
    store: &[u8],
    h: &mut Option<u64>,
    s: &[u8],
    buf: &[u8],
) -> Option<u32> {
    let linear = entries.len().min(LINEAR);
    let same = |e: &&Entry| e.len == s.len() && bytes_of(e, store, buf) == s;
    if let Some(e) = entries[..linear].iter().find(same) {
        return Some(e.class);
    }
    if entries.len() <= LINEAR {
        return None;
    }
    let hs = *h.get_or_insert_with(|| hash(s));
    let mut at = head.get(&hs).copied().unwrap_or(NONE);
    for _ in 0..MAX_PROBES {
        let e = entries.get(at as usize)?;
        if e.hash == Some(hs) && e.len == s.len() && bytes_of(e, store, buf) == s {
            return Some(e.class);
        }
        at = e.next;
    }
    None
}

impl<T> Dedup<T> {
    /// Forgets everything (a new encoding starts).
    pub fn clear(&mut self) {
        self.frames.clear();
        self.sig.clear();
        self.store.clear();
        self.entries.clear();
        self.head.clear();
    }

    /// After a compound's header was written (see [`Opened`]). If it turns
    /// out a duplicate, `merged(payload, class, mark)` is called once it is
    /// replaced by `ref class`.
    pub fn open(&mut self, w: &mut Writer, o: Opened<T>, merged: &mut impl FnMut(T, u32, usize)) {
        let leaf = o.children == 0;
        self.push_frame(o, leaf);
        if leaf {
            self.close(w, merged);
            self.child_done(w, merged);
        }
    }

    /// After a compound was written whole, its header and all its parts,
    /// when every part is a scalar (no compound, no `ref`): the same as
    /// [`Self::open`] with its parts as `o.children` followed by one
    /// [`Self::leaf`] a part, in one step (`o.children` is not read).
    /// Returns the class the compound has from now on (its own id, or that
    /// of the earlier equal compound it was merged into), so that an equal
    /// one met later may be written as `ref class` and told as a leaf, or
    /// `None` if it is too short to be referred to. The class stays valid
    /// until `merged` is next called for another compound (which may drop
    /// it, with the compound holding it).
    pub fn whole(
        &mut self,
        w: &mut Writer,
        o: Opened<T>,
        merged: &mut impl FnMut(T, u32, usize),
    ) -> Option<u32> {
        self.push_frame(o, false);
        let class = self.close(w, merged);
        self.child_done(w, merged);
        class
    }

    fn push_frame(&mut self, o: Opened<T>, leaf: bool) {
        let Opened {
            start,
            id,
            children,
            mark,
            payload,
        } = o;
        self.frames.push(Frame {
            start,
            id,
            left: children,
            sig: self.sig.len(),
            flat: true,
            leaf,
            entries: self.entries.len(),
            store: self.store.len(),
            mark,
            payload,
        });
    }

    /// After a term that is not compound, or a `ref`, was written at
    /// `w.buf[start..]`.
    pub fn leaf(&mut self, w: &mut Writer, start: usize, merged: &mut impl FnMut(T, u32, usize)) {
        match self.frames.last() {
            None => return,
            Some(top) if top.flat => {}
            Some(_) => self.sig.extend_from_slice(&w.buf[start..]),
        }
        self.child_done(w, merged);
    }

    /// A child of the innermost open compound is complete (if any is open).
    /// Closes the compounds that completes, innermost first.
    fn child_done(&mut self, w: &mut Writer, merged: &mut impl FnMut(T, u32, usize)) {
        while let Some(top) = self.frames.last_mut() {
            top.left -= 1;
            if top.left > 0 {
                return;
            }
            self.close(w, merged);
        }
    }

    /// Closes the innermost compound, which is complete: merges it into an
    /// earlier equal one or records it, and adds its item to its parent's
    /// signature (the caller then counts it as the parent's child).
    /// Returns the compound's class, `None` if it is too short to have one.
    fn close(&mut self, w: &mut Writer, merged: &mut impl FnMut(T, u32, usize)) -> Option<u32> {
        let f = self.frames.pop()?;
        let len = w.buf.len() - f.start;
        let whole = f.flat;
        let min = match f.leaf {
            true => MIN_SHARED_LEAF_LEN,
            false => MIN_SHARED_LEN,
        };
        if len >= min {
            let (h, found) = {
                let s: &[u8] = match whole {
                    true => &w.buf[f.start..],
                    false => &self.sig[f.sig..],
                };
                let mut h = None;
                let found = find(&self.entries, &self.head, &self.store, &mut h, s, &w.buf);
                // An entry past the first LINEAR goes into the hash map.
                if found.is_none() && h.is_none() && self.entries.len() >= LINEAR {
                    h = Some(hash(s));
                }
                (h, found)
            };
            let class = match found {
                Some(class) => {
                    w.rollback(f.start, f.id);
                    // A duplicate holds no entry of its own: each part of
                    // MIN_SHARED_LEN bytes or more was merged as it completed
                    // (a new one would make the duplicate's signature name
                    // an id of its own, which no earlier compound names).
                    // Only ids and identities are undone; the entries are
                    // dropped all the same, should that ever not hold.
                    debug_assert_eq!(self.entries.len(), f.entries);
                    self.drop_entries(f.entries);
                    self.store.truncate(f.store);
                    w.backref(class);
                    merged(f.payload, class, f.mark);
                    class
                }
                None => {
                    let (in_buf, off) = match whole {
                        true => (true, f.start),
                        false => {
                            let off = self.store.len();
                            self.store.extend_from_slice(&self.sig[f.sig..]);
                            (false, off)
                        }
                    };
                    let slen = match whole {
                        true => len,
                        false => self.sig.len() - f.sig,
                    };
                    self.push_entry(h, f.id, in_buf, off, slen);
                    f.id
                }
            };
            self.sig.truncate(f.sig);
            // The item `ref class`: the parent's signature is no longer its
            // encoding, so it is copied out first (up to this child).
            if let Some(parent) = self.frames.last_mut() {
                if parent.flat {
                    parent.flat = false;
                    self.sig.extend_from_slice(&w.buf[parent.start..f.start]);
                }
                self.sig.push(tag::REF);
                put_varint(&mut self.sig, u64::from(class));
            }
            Some(class)
        } else {
            self.sig.truncate(f.sig);
            // The item is the compound's bytes, already in a flat parent.
            match self.frames.last() {
                Some(parent) if !parent.flat => {
                    self.sig.extend_from_slice(&w.buf[f.start..]);
                }
                _ => {}
            }
            None
        }
    }

    /// `hash` is `Some` for an entry past the first [`LINEAR`].
    fn push_entry(&mut self, hash: Option<u64>, class: u32, in_buf: bool, off: usize, len: usize) {
        let idx = self.entries.len();
        let next = match (idx >= LINEAR, hash) {
            (true, Some(h)) => self.head.insert(h, idx as u32).unwrap_or(NONE),
            _ => NONE,
        };
        self.entries.push(Entry {
            hash,
            class,
            in_buf,
            off,
            len,
            next,
        });
    }

    /// Drops the entries from `from` on, newest first.
    fn drop_entries(&mut self, from: usize) {
        while self.entries.len() > from {
            let idx = self.entries.len() - 1;
            let Some(e) = self.entries.pop() else {
                break;
            };
            if let (true, Some(h)) = (idx >= LINEAR, e.hash) {
                match e.next {
                    NONE => self.head.remove(&h),
                    n => self.head.insert(h, n),
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{decode, skip, Value, ValueBuilder};
    use std::rc::Rc;

    /// A term whose compound parts may be shared by pointer (as on the
    /// BEAM heap): `Rc::as_ptr` is its identity.
    enum N {
        /// A scalar, a binary or an etf piece.
        S(Value),
        Tuple(Vec<Rc<N>>),
        List(Vec<Rc<N>>, Rc<N>),
        Map(Vec<(Rc<N>, Rc<N>)>),
    }

    fn s(v: Value) -> Rc<N> {
        Rc::new(N::S(v))
    }
    fn tuple(es: Vec<Rc<N>>) -> Rc<N> {
        Rc::new(N::Tuple(es))
    }
    fn list(es: Vec<Rc<N>>) -> Rc<N> {
        Rc::new(N::List(es, s(Value::Nil)))
    }

    fn to_value(n: &N) -> Value {
        match n {
            N::S(v) => v.clone(),
            N::Tuple(es) => Value::Tuple(es.iter().map(|e| to_value(e)).collect()),
            N::List(es, t) => Value::List(
                es.iter().map(|e| to_value(e)).collect(),
                Box::new(to_value(t)),
            ),
            N::Map(kvs) => Value::Map(
                kvs.iter()
                    .map(|(k, v)| (to_value(k), to_value(v)))
                    .collect(),
            ),
        }
    }

    /// Encodes as the NIF does: a compound met again by identity is a
    /// `ref`, and `Dedup` merges equal ones (`dedup` false: identity only).
    fn encode(root: &Rc<N>, dedup: bool) -> Vec<u8> {
        encode_with(root, dedup, false)
    }

    /// A part the NIF writes inline: an atom, a small integer or [].
    fn immediate(n: &N) -> bool {
        matches!(n, N::S(Value::Nil | Value::Int(_) | Value::Atom(_)))
    }

    /// What the test encoder does when dedup merged `p` into `class`:
    /// the identities noted since `mark` are forgotten and `p` is `class`.
    fn note_merged(
        seen: &mut HashMap<*const N, u32>,
        log: &mut Vec<*const N>,
        merges: &std::cell::Cell<u64>,
        p: *const N,
        class: u32,
        mark: usize,
    ) {
        merges.set(merges.get() + 1);
        for q in log.drain(mark..) {
            seen.remove(&q);
        }
        log.push(p);
        seen.insert(p, class);
    }

    /// [`encode`], and with `whole` a tuple or list whose parts are all
    /// immediate is written in one go and told with [`Dedup::whole`], as
    /// the NIF's encoder does.
    fn encode_with(root: &Rc<N>, dedup: bool, whole: bool) -> Vec<u8> {
        let mut w = Writer::new();
        let mut d: Dedup<*const N> = Dedup::default();
        // Identity -> id, and the identities in insertion order (a mark is
        // a length of `log`).
        let mut seen: HashMap<*const N, u32> = HashMap::new();
        let mut log: Vec<*const N> = Vec::new();
        let mut stack = vec![root.clone()];
        // Merges so far, and the last compound told whole (its encoding,
        // class and the merges then), as the NIF keeps them.
        let merges = std::cell::Cell::new(0u64);
        let mut last: Option<(Vec<u8>, u32, u64)> = None;
        while let Some(n) = stack.pop() {
            let p = Rc::as_ptr(&n);
            let start = w.buf.len();
            let compound = !matches!(
                &*n,
                N::S(Value::Nil | Value::Int(_) | Value::Float(_) | Value::Atom(_))
            );
            let known = seen.get(&p).copied();
            let mut merged =
                |p, class, mark| note_merged(&mut seen, &mut log, &merges, p, class, mark);
            if let (true, Some(id)) = (compound, known) {
                w.backref(id);
                if dedup {
                    d.leaf(&mut w, start, &mut merged);
                }
                continue;
            }
            let inline = match &*n {
                N::Tuple(es) => !es.is_empty() && es.iter().all(|e| immediate(e)),
                N::List(es, t) => immediate(t) && es.iter().all(|e| immediate(e)),
                _ => false,
            };
            let (id, children, whole_bytes) = if whole && inline && known.is_none() {
                let bytes = to_value(&n).to_bytes();
                match &last {
                    Some((b, class, m)) if dedup && *b == bytes && *m == merges.get() => {
                        let class = *class;
                        log.push(p);
                        seen.insert(p, class);
                        w.backref(class);
                        let mut merged = |p, class, mark| {
                            note_merged(&mut seen, &mut log, &merges, p, class, mark)
                        };
                        d.leaf(&mut w, start, &mut merged);
                        continue;
                    }
                    _ => {}
                }
                let (id, parts) = match &*n {
                    N::Tuple(es) => (w.tuple(es.len()), es.iter().collect::<Vec<_>>()),
                    N::List(es, t) => {
                        let id = w.list(es.len());
                        (id, es.iter().chain([t]).collect())
                    }
                    _ => unreachable!(),
                };
                for e in parts {
                    to_value(e).encode(&mut w);
                }
                (id, 0, Some(bytes))
            } else {
                let (id, children) = match &*n {
                    N::S(Value::Binary(b)) => (w.binary(b), 0),
                    N::S(Value::Etf(b)) => (w.etf(b), 0),
                    N::S(v) => {
                        v.encode(&mut w);
                        if dedup {
                            d.leaf(&mut w, start, &mut merged);
                        }
                        continue;
                    }
                    N::Tuple(es) => {
                        stack.extend(es.iter().rev().cloned());
                        (w.tuple(es.len()), es.len())
                    }
                    N::List(es, t) => {
                        stack.push(t.clone());
                        stack.extend(es.iter().rev().cloned());
                        (w.list(es.len()), es.len() + 1)
                    }
                    N::Map(kvs) => {
                        for (k, v) in kvs.iter().rev() {
                            stack.push(v.clone());
                            stack.push(k.clone());
                        }
                        (w.map(kvs.len()), kvs.len() * 2)
                    }
                };
                (id, children, None)
            };
            let mark = log.len();
            log.push(p);
            seen.insert(p, id);
            let mut merged =
                |p, class, mark| note_merged(&mut seen, &mut log, &merges, p, class, mark);
            if dedup {
                let o = Opened {
                    start,
                    id,
                    children,
                    mark,
                    payload: p,
                };
                match whole_bytes {
                    Some(bytes) => {
                        let before = merges.get();
                        let class = d.whole(&mut w, o, &mut merged);
                        let own = u64::from(class.is_some_and(|c| c != id));
                        last = match (merges.get() - before == own, class) {
                            (true, Some(class)) => Some((bytes, class, merges.get())),
                            _ => None,
                        };
                    }
                    None => d.open(&mut w, o, &mut merged),
                }
            }
        }
        w.buf
    }

    /// Encodes `n` with merging, decodes it and checks the result is the
    /// term itself bit for bit (full encodings compared: -0.0 is not 0.0).
    fn exact(n: &Rc<N>) -> Vec<u8> {
        let bytes = encode(n, true);
        assert_eq!(skip(&bytes), Ok(bytes.len()));
        let back = decode(&bytes, None, &mut ValueBuilder).expect("decodes");
        assert_eq!(back.to_bytes(), to_value(n).to_bytes());
        bytes
    }

    fn refs(bytes: &[u8]) -> usize {
        // Good enough for the terms below (no binary holds 0x09).
        bytes.iter().filter(|b| **b == tag::REF).count()
    }

    fn atoms(n: usize, id: u32) -> Rc<N> {
        list((0..n).map(|_| s(Value::Atom(id))).collect())
    }

    #[test]
    fn equal_unshared_subterms_become_refs() {
        // {t, 1, make_tuple(100, duplicate(10, a))} with no sharing.
        let inner = tuple((0..100).map(|_| atoms(10, 0)).collect());
        let rec = tuple(vec![s(Value::Atom(1)), s(Value::Int(1)), inner]);
        let bytes = exact(&rec);
        assert_eq!(refs(&bytes), 99);
        // The same bytes as the record built with one shared list.
        let l = atoms(10, 0);
        let shared = tuple(vec![
            s(Value::Atom(1)),
            s(Value::Int(1)),
            tuple((0..100).map(|_| l.clone()).collect()),
        ]);
        assert_eq!(bytes, encode(&shared, false));
    }

    #[test]
    fn nested_duplicates_are_merged_at_the_outermost_level() {
        let a = || tuple(vec![atoms(3, 2), s(Value::Binary(b"bin!".to_vec()))]);
        let pair = || tuple(vec![a(), a()]);
        let t = tuple(vec![pair(), pair(), a(), list(vec![pair(), a()])]);
        let bytes = exact(&t);
        // Hash-consed by hand: one `a`, one `pair`.
        let a1 = a();
        let p1 = tuple(vec![a1.clone(), a1.clone()]);
        let dag = tuple(vec![p1.clone(), p1.clone(), a1.clone(), list(vec![p1, a1])]);
        assert_eq!(bytes, encode(&dag, false));
    }

    #[test]
    fn rollback_forgets_identities_and_ids_made_inside_a_duplicate() {
        // `small` is too short to merge, so it gets an id inside d2; d2 is
        // merged into d1 and that id is given to `fresh`. `small` met again
        // by identity must not become a ref to `fresh`.
        let small = tuple(vec![]);
        let p = atoms(4, 5);
        let d1 = tuple(vec![tuple(vec![]), atoms(4, 5), atoms(4, 5)]);
        let d2 = tuple(vec![small.clone(), p.clone(), p.clone()]);
        let fresh = tuple(vec![s(Value::Int(300)), s(Value::Int(301))]);
        let t = tuple(vec![d1, d2, fresh, small, p]);
        let bytes = exact(&t);
        assert!(refs(&bytes) >= 3);
    }

    #[test]
    fn zero_signs_binaries_maps_and_etf_are_merged_only_when_equal() {
        let f = |x: f64| list(vec![s(Value::Float(x)), s(Value::Int(1))]);
        let m = |v: i64| {
            Rc::new(N::Map(vec![
                (s(Value::Atom(1)), s(Value::Int(v))),
                (s(Value::Atom(2)), s(Value::Binary(b"name".to_vec()))),
            ]))
        };
        let etf = |b: u8| {
            s(Value::Etf(
                [&[131, 109, 0, 0, 0, 12][..], &[b; 12]].concat(),
            ))
        };
        let bin = |b: &[u8]| s(Value::Binary(b.to_vec()));
        let improper = || Rc::new(N::List(vec![s(Value::Int(1))], s(Value::Atom(9))));
        let (b, c) = (b"a binary of 16 b", b"a binary of 16 c");
        let t = tuple(vec![
            f(-0.0),
            f(0.0),
            f(-0.0),
            m(1),
            m(2),
            m(1),
            etf(1),
            etf(2),
            etf(1),
            bin(b),
            bin(c),
            bin(b),
            improper(),
            improper(),
        ]);
        let bytes = exact(&t);
        // Each third copy and the second improper list are merged: the
        // bytes of the term sharing them by identity (the maps' "name" is
        // too short to look up).
        let (f1, m1, e1, b1, i1) = (f(-0.0), m(1), etf(1), bin(b), improper());
        let dag = tuple(vec![
            f1.clone(),
            f(0.0),
            f1,
            m1.clone(),
            m(2),
            m1,
            e1.clone(),
            etf(2),
            e1,
            b1.clone(),
            bin(c),
            b1,
            i1.clone(),
            i1,
        ]);
        assert_eq!(bytes, encode(&dag, false));
    }

    #[test]
    fn deep_nesting_and_long_lists_are_walked_without_recursion() {
        // The test's own terms are built, compared and dropped recursively.
        let big_stack = std::thread::Builder::new().stack_size(1 << 30);
        let run = big_stack.spawn(deep_and_long).expect("thread");
        run.join().expect("no panic");
    }

    fn deep_and_long() {
        let mut deep = s(Value::Int(0));
        for i in 0..100_000 {
            deep = tuple(vec![deep, s(Value::Int(i % 3))]);
        }
        let twice = tuple(vec![deep.clone(), unshare(&deep)]);
        // The second copy is one ref, the first in full: the bytes of the
        // pair shared by identity (not decoded here: the test builder
        // would copy every level for its ids).
        let bytes = encode(&twice, true);
        assert_eq!(bytes, encode(&tuple(vec![deep.clone(), deep]), false));
        let long = tuple(vec![atoms(200_000, 1), atoms(200_000, 1)]);
        let bytes = exact(&long);
        assert_eq!(refs(&bytes), 1);
    }

    /// A small deterministic generator (xorshift).
    struct Rng(u64);
    impl Rng {
        fn next(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    fn random(r: &mut Rng, depth: u32, pool: &mut Vec<Rc<N>>) -> Rc<N> {
        // Reuse a term by identity, or rebuild a pool term (no sharing).
        if !pool.is_empty() && r.next(6) == 0 {
            return pool[r.next(pool.len() as u64) as usize].clone();
        }
        let n = match (depth, r.next(10)) {
            (0, _) | (_, 0) => s(Value::Atom(r.next(3) as u32)),
            (_, 1) => s(Value::Int(r.next(300) as i64 - 10)),
            (_, 2) => s(Value::Float([0.0, -0.0, 1.5][r.next(3) as usize])),
            (_, 3) => s(Value::Binary(vec![b'x'; r.next(5) as usize])),
            (_, 4) => s(Value::Etf(vec![131, 97, r.next(2) as u8])),
            (_, 5 | 6) => {
                let k = r.next(4) as usize;
                tuple((0..k).map(|_| random(r, depth - 1, pool)).collect())
            }
            (_, 7 | 8) => {
                let k = r.next(4) as usize;
                let es = (0..k).map(|_| random(r, depth - 1, pool)).collect();
                let tail = match r.next(4) {
                    0 if k > 0 => random(r, depth - 1, pool),
                    _ => s(Value::Nil),
                };
                Rc::new(N::List(es, tail))
            }
            _ => {
                let k = r.next(3) as i64;
                Rc::new(N::Map(
                    (0..k)
                        .map(|i| (s(Value::Int(i)), random(r, depth - 1, pool)))
                        .collect(),
                ))
            }
        };
        if pool.len() < 8 && r.next(3) == 0 {
            pool.push(n.clone());
        }
        n
    }

    /// A copy with no sharing at all (each node new).
    fn unshare(n: &N) -> Rc<N> {
        Rc::new(match n {
            N::S(v) => N::S(v.clone()),
            N::Tuple(es) => N::Tuple(es.iter().map(|e| unshare(e)).collect()),
            N::List(es, t) => N::List(es.iter().map(|e| unshare(e)).collect(), unshare(t)),
            N::Map(kvs) => N::Map(kvs.iter().map(|(k, v)| (unshare(k), unshare(v))).collect()),
        })
    }

    #[test]
    fn compounds_told_whole_encode_as_when_told_part_by_part() {
        let inner = tuple((0..100).map(|_| atoms(10, 0)).collect());
        let rec = tuple(vec![s(Value::Atom(1)), s(Value::Int(1)), inner]);
        assert_eq!(encode_with(&rec, true, true), encode(&rec, true));
        // Runs of equal pairs, inside compounds that are merged in turn
        // (which drops the class of the pair in the run before).
        let pair = || tuple(vec![s(Value::Atom(1)), s(Value::Int(2))]);
        let pairs = || list((0..5).map(|_| pair()).collect());
        let boxed = || tuple(vec![pairs(), s(Value::Int(1))]);
        let t = tuple(vec![
            pairs(),
            pairs(),
            boxed(),
            boxed(),
            pair(),
            pairs(),
            pair(),
        ]);
        let bytes = encode_with(&t, true, true);
        assert_eq!(bytes, encode(&t, true));
        assert_eq!(exact(&t), bytes);
        for seed in 1..3000u64 {
            let mut r = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            let mut pool = Vec::new();
            let t = tuple((0..4).map(|_| random(&mut r, 5, &mut pool)).collect());
            for t in [t.clone(), unshare(&t)] {
                assert_eq!(encode_with(&t, true, true), encode(&t, true), "seed {seed}");
            }
        }
    }

    #[test]
    fn random_terms_with_and_without_sharing_decode_exactly() {
        for seed in 1..3000u64 {
            let mut r = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            let mut pool = Vec::new();
            let t = tuple((0..4).map(|_| random(&mut r, 5, &mut pool)).collect());
            let shared = exact(&t);
            let plain = exact(&unshare(&t));
            // Merging never makes an encoding longer than the plain one.
            assert!(plain.len() <= to_value(&t).to_bytes().len(), "seed {seed}");
            assert!(shared.len() <= encode(&t, false).len(), "seed {seed}");
        }
    }
}
