//! The Heft term format: how one Erlang term is laid out as bytes.
//!
//! The grammar, every tag and the rules for keys are in docs/term-format.md;
//! this file implements it and does not repeat it. In short: a term is a tag
//! byte followed by its payload; integers and lengths are LEB128 varints;
//! atoms are ids into the table's atom dictionary; compound terms are numbered
//! in pre-order so a later `REF` can point back at one (the BEAM shares
//! subterms on the heap and the format keeps that sharing); anything the
//! format does not model itself (pids, ports, references, funs, big integers,
//! bitstrings) is carried as a piece of the standard external term format.
//!
//! Nothing here knows about the BEAM: the NIF walks terms and calls [`Writer`],
//! and rebuilds them through the [`Builder`] trait. Tests use [`Value`].

use std::fmt;

/// Tag bytes. Values 0x0C..=0x1F are reserved.
pub mod tag {
    /// `[]`.
    pub const NIL: u8 = 0x00;
    /// The record's key, which is stored once, outside the body.
    pub const KEY: u8 = 0x01;
    /// Signed 64-bit integer, zigzag varint.
    pub const INT: u8 = 0x02;
    /// IEEE 754 double, 8 bytes little-endian.
    pub const FLOAT: u8 = 0x03;
    /// Atom id (varint) in the table's atom dictionary.
    pub const ATOM: u8 = 0x04;
    /// Binary: varint length, bytes.
    pub const BINARY: u8 = 0x05;
    /// Tuple: varint arity, elements.
    pub const TUPLE: u8 = 0x06;
    /// List: varint element count, elements, then the tail term.
    pub const LIST: u8 = 0x07;
    /// Map: varint pair count, then key, value, key, value...
    pub const MAP: u8 = 0x08;
    /// Back-reference: varint id of an earlier compound term.
    pub const REF: u8 = 0x09;
    /// External term format: varint length, bytes starting with 131.
    pub const ETF: u8 = 0x0A;
    /// Tuple (varint arity, elements) that starts an encoding holding no
    /// `REF` (first tag only).
    pub const UNSHARED_TUPLE: u8 = 0x0B;
    /// 0x20..=0x2F: tuple of arity 0..=15, no length varint.
    pub const SMALL_TUPLE: u8 = 0x20;
    /// 0x30..=0x3F: tuple of arity 0..=15 that starts an encoding holding
    /// no `REF` (first tag only).
    pub const UNSHARED_SMALL_TUPLE: u8 = 0x30;
    /// 0x40..=0x7F: atom id 0..=63.
    pub const SMALL_ATOM: u8 = 0x40;
    /// 0x80..=0xFF: integer 0..=127.
    pub const SMALL_INT: u8 = 0x80;
}

/// Why bytes could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeError {
    /// The bytes ended inside a term.
    Truncated,
    /// A tag byte that the format does not define.
    BadTag(u8),
    /// A varint longer than 10 bytes or over 64 bits.
    BadVarint,
    /// A `REF` to a term that has not been decoded yet.
    BadRef(u64),
    /// A `KEY` where no key was given (inside a key, or with no key at hand).
    UnexpectedKey,
    /// A count larger than the bytes left could hold.
    BadLength(u64),
    /// Bytes left after the term.
    TrailingBytes(usize),
    /// A float that is NaN or infinite (the BEAM has none).
    BadFloat,
    /// The builder refused a value (for example an unreadable ETF piece).
    Builder(&'static str),
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Truncated => write!(f, "term truncated"),
            DecodeError::BadTag(t) => write!(f, "unknown tag 0x{t:02x}"),
            DecodeError::BadVarint => write!(f, "malformed varint"),
            DecodeError::BadRef(id) => write!(f, "reference to undefined term {id}"),
            DecodeError::UnexpectedKey => write!(f, "key placeholder where no key is expected"),
            DecodeError::BadLength(n) => write!(f, "count {n} exceeds the bytes left"),
            DecodeError::TrailingBytes(n) => write!(f, "{n} bytes after the term"),
            DecodeError::BadFloat => write!(f, "a float that is NaN or infinite"),
            DecodeError::Builder(why) => write!(f, "{why}"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// Appends a LEB128 varint.
#[inline]
pub fn put_varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

/// Number of bytes `put_varint` writes for `v`.
#[inline]
pub fn varint_len(v: u64) -> usize {
    let bits = 64 - (v | 1).leading_zeros() as usize;
    bits.div_ceil(7)
}

#[inline]
fn is_small_tuple(t: u8) -> bool {
    (tag::SMALL_TUPLE..tag::SMALL_TUPLE + 16).contains(&t)
}

#[inline]
fn is_unshared_small_tuple(t: u8) -> bool {
    (tag::UNSHARED_SMALL_TUPLE..tag::UNSHARED_SMALL_TUPLE + 16).contains(&t)
}

/// Whether `bytes` start with a tag that says the encoding holds no `REF`
/// (a record body written by [`Writer::flag_if_unshared`]).
pub fn is_flagged_unshared(bytes: &[u8]) -> bool {
    matches!(bytes.first(), Some(&t) if t == tag::UNSHARED_TUPLE || is_unshared_small_tuple(t))
}

#[inline]
fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

#[inline]
pub(crate) fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// A cursor over encoded bytes.
#[derive(Clone, Copy)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// Starts at the first byte of `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    /// Bytes consumed so far.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Bytes not yet consumed.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Reads one byte.
    #[inline]
    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        let b = *self.buf.get(self.pos).ok_or(DecodeError::Truncated)?;
        self.pos += 1;
        Ok(b)
    }

    /// Reads a LEB128 varint. Most are one to three bytes (lengths of keys
    /// and records, integers below a million): those are inlined, the
    /// loop is not.
    #[inline(always)]
    pub fn varint(&mut self) -> Result<u64, DecodeError> {
        match self.buf.get(self.pos..self.pos + 2) {
            Some(&[b, _]) if b < 0x80 => {
                self.pos += 1;
                Ok(u64::from(b))
            }
            Some(&[b, c]) if c < 0x80 => {
                self.pos += 2;
                Ok(u64::from(b & 0x7f) | u64::from(c) << 7)
            }
            _ => match self.buf.get(self.pos..self.pos + 3) {
                Some(&[b, c, d]) if d < 0x80 => {
                    self.pos += 3;
                    Ok(u64::from(b & 0x7f) | u64::from(c & 0x7f) << 7 | u64::from(d) << 14)
                }
                _ => self.varint_long(),
            },
        }
    }

    #[inline(never)]
    fn varint_long(&mut self) -> Result<u64, DecodeError> {
        let mut v: u64 = 0;
        let mut shift = 0u32;
        loop {
            let b = self.u8()?;
            if shift == 63 && b > 1 {
                return Err(DecodeError::BadVarint);
            }
            v |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return Ok(v);
            }
            shift += 7;
            if shift > 63 {
                return Err(DecodeError::BadVarint);
            }
        }
    }

    /// Reads a varint that counts items of at least `min_item` bytes each,
    /// rejecting counts the remaining bytes cannot hold.
    #[inline]
    pub fn count(&mut self, min_item: usize) -> Result<usize, DecodeError> {
        let n = self.varint()?;
        let fits = (n as u128) * (min_item as u128) <= self.remaining() as u128;
        if fits {
            Ok(n as usize)
        } else {
            Err(DecodeError::BadLength(n))
        }
    }

    /// Reads `n` bytes.
    #[inline]
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self.pos.checked_add(n).ok_or(DecodeError::Truncated)?;
        let s = self.buf.get(self.pos..end).ok_or(DecodeError::Truncated)?;
        self.pos = end;
        Ok(s)
    }
}

/// Builds encoded terms. The caller walks its term in pre-order and calls one
/// method per node; compound headers return the id a later [`Writer::backref`]
/// can use.
#[derive(Default)]
pub struct Writer {
    /// The encoded bytes so far.
    pub buf: Vec<u8>,
    next_id: u32,
    /// A `REF` was written.
    shared: bool,
}

impl Writer {
    /// An empty writer.
    pub fn new() -> Self {
        Writer::default()
    }

    /// A writer appending to `buf`, emptied first (its allocation reused).
    pub fn from_vec(mut buf: Vec<u8>) -> Self {
        buf.clear();
        Writer {
            buf,
            next_id: 0,
            shared: false,
        }
    }

    /// Empties the writer for reuse, keeping its allocation.
    pub fn clear(&mut self) {
        self.buf.clear();
        self.next_id = 0;
        self.shared = false;
    }

    /// Whether a back-reference has been written since the writer was made
    /// or cleared.
    pub fn has_backrefs(&self) -> bool {
        self.shared
    }

    /// Marks a finished encoding that starts with a tuple (a record body)
    /// as holding no `REF`, if it holds none: its first tag becomes the
    /// unshared form of the tuple tag, so a decoder can skip keeping ids
    /// (docs/term-format.md). Call it once the whole body is written.
    pub fn flag_if_unshared(&mut self) {
        if !self.shared {
            if let Some(first) = self.buf.first_mut() {
                *first = match *first {
                    tag::TUPLE => tag::UNSHARED_TUPLE,
                    t if is_small_tuple(t) => tag::UNSHARED_SMALL_TUPLE | (t & 0x0f),
                    t => t,
                };
            }
        }
    }

    fn next_id(&mut self) -> u32 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// `[]`.
    pub fn nil(&mut self) {
        self.buf.push(tag::NIL);
    }

    /// The key placeholder (record bodies only).
    pub fn key(&mut self) {
        self.buf.push(tag::KEY);
    }

    /// An integer in the signed 64-bit range.
    pub fn int(&mut self, v: i64) {
        if (0..128).contains(&v) {
            self.buf.push(tag::SMALL_INT | v as u8);
        } else {
            self.buf.push(tag::INT);
            put_varint(&mut self.buf, zigzag(v));
        }
    }

    /// A float, with -0.0 written as 0.0 when `normalize_zero` (keys on a VM
    /// where `0.0 =:= -0.0`).
    pub fn float(&mut self, v: f64, normalize_zero: bool) {
        let v = if normalize_zero && v == 0.0 { 0.0 } else { v };
        self.buf.push(tag::FLOAT);
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    /// An atom by dictionary id.
    pub fn atom(&mut self, id: u32) {
        if id < 64 {
            self.buf.push(tag::SMALL_ATOM | id as u8);
        } else {
            self.buf.push(tag::ATOM);
            put_varint(&mut self.buf, u64::from(id));
        }
    }

    /// A binary; returns its id.
    pub fn binary(&mut self, bytes: &[u8]) -> u32 {
        self.buf.push(tag::BINARY);
        put_varint(&mut self.buf, bytes.len() as u64);
        self.buf.extend_from_slice(bytes);
        self.next_id()
    }

    /// A tuple header; the caller writes `arity` elements next. Returns its id.
    pub fn tuple(&mut self, arity: usize) -> u32 {
        if arity < 16 {
            self.buf.push(tag::SMALL_TUPLE | arity as u8);
        } else {
            self.buf.push(tag::TUPLE);
            put_varint(&mut self.buf, arity as u64);
        }
        self.next_id()
    }

    /// A list header; the caller writes `len` elements and then the tail
    /// (`nil` for a proper list). Returns its id.
    pub fn list(&mut self, len: usize) -> u32 {
        self.buf.push(tag::LIST);
        put_varint(&mut self.buf, len as u64);
        self.next_id()
    }

    /// A map header; the caller writes `pairs` key/value pairs next.
    /// Returns its id.
    pub fn map(&mut self, pairs: usize) -> u32 {
        self.buf.push(tag::MAP);
        put_varint(&mut self.buf, pairs as u64);
        self.next_id()
    }

    /// A piece of external term format (starting with the version byte 131);
    /// returns its id.
    pub fn etf(&mut self, bytes: &[u8]) -> u32 {
        self.buf.push(tag::ETF);
        put_varint(&mut self.buf, bytes.len() as u64);
        self.buf.extend_from_slice(bytes);
        self.next_id()
    }

    /// A reference to the compound term that got `id` earlier.
    pub fn backref(&mut self, id: u32) {
        self.shared = true;
        self.buf.push(tag::REF);
        put_varint(&mut self.buf, u64::from(id));
    }

    /// Cuts the encoding back to its first `len` bytes, which assigned the
    /// ids below `next_id` (the rest are numbered again from there): undoes
    /// a compound written from `len` on, numbered `next_id` (a duplicate
    /// that [`crate::dedup::Dedup`] replaces by a `ref`).
    pub fn rollback(&mut self, len: usize, next_id: u32) {
        debug_assert!(len <= self.buf.len() && next_id <= self.next_id);
        self.buf.truncate(len);
        self.next_id = next_id;
    }

    /// Appends bytes that are already a complete encoded term holding no
    /// `REF` (a canonical encoding).
    pub fn raw(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }
}

/// Rebuilds terms from their encoding; implemented by the NIF (BEAM terms)
/// and by [`Value`] (tests).
pub trait Builder {
    /// The term being built.
    type Term: Clone;
    /// `[]`.
    fn nil(&mut self) -> Result<Self::Term, DecodeError>;
    /// An integer.
    fn int(&mut self, v: i64) -> Result<Self::Term, DecodeError>;
    /// A float.
    fn float(&mut self, v: f64) -> Result<Self::Term, DecodeError>;
    /// An atom from the dictionary.
    fn atom(&mut self, id: u32) -> Result<Self::Term, DecodeError>;
    /// A binary.
    fn binary(&mut self, bytes: &[u8]) -> Result<Self::Term, DecodeError>;
    /// A piece of external term format.
    fn etf(&mut self, bytes: &[u8]) -> Result<Self::Term, DecodeError>;
    /// A tuple of the given elements.
    fn tuple(&mut self, elems: &[Self::Term]) -> Result<Self::Term, DecodeError>;
    /// A list of `elems` ending in `tail`.
    fn list(&mut self, elems: &[Self::Term], tail: Self::Term) -> Result<Self::Term, DecodeError>;
    /// A map; `kvs` alternates keys and values.
    fn map(&mut self, kvs: &[Self::Term]) -> Result<Self::Term, DecodeError>;
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Tuple,
    List,
    Map,
}

struct Frame {
    kind: Kind,
    remaining: usize,
    base: usize,
    id: usize,
}

/// Reusable scratch space for [`decode_with`], so a hot loop decodes without
/// allocating.
pub struct Scratch<T> {
    stack: Vec<T>,
    frames: Vec<Frame>,
    ids: Vec<Option<T>>,
}

impl<T> Default for Scratch<T> {
    fn default() -> Self {
        Scratch {
            stack: Vec::new(),
            frames: Vec::new(),
            ids: Vec::new(),
        }
    }
}

/// Decodes one term that must fill `bytes` exactly. `key` is what a `KEY`
/// tag stands for (the record's stored key), or `None` where a `KEY` is an
/// error.
pub fn decode<B: Builder>(
    bytes: &[u8],
    key: Option<&[u8]>,
    b: &mut B,
) -> Result<B::Term, DecodeError> {
    decode_with(bytes, key, b, &mut Scratch::default())
}

/// [`decode`] with caller-owned scratch space.
pub fn decode_with<B: Builder>(
    bytes: &[u8],
    key: Option<&[u8]>,
    b: &mut B,
    scratch: &mut Scratch<B::Term>,
) -> Result<B::Term, DecodeError> {
    scratch.stack.clear();
    scratch.frames.clear();
    scratch.ids.clear();
    decode_all::<B, true>(bytes, key, b, scratch)
}

/// Decodes a record body (with its `key`) or, with `key = None`, a key:
/// without numbering compound terms (no ids kept) when the encoding holds
/// no `REF`, which its first tag says ([`is_flagged_unshared`]) or the
/// caller knows (`known_unshared`: keys, and bag bodies, which are
/// canonical); else with [`decode_with`]. A `REF` met on the lean path
/// hands the whole encoding to [`decode_with`], which follows it, or
/// refuses it where the first tag ruled it out; so every encoding decodes
/// exactly as [`decode_with`] decodes it.
pub fn decode_record<B: Builder>(
    bytes: &[u8],
    key: Option<&[u8]>,
    known_unshared: bool,
    b: &mut B,
    scratch: &mut Scratch<B::Term>,
) -> Result<B::Term, DecodeError> {
    if known_unshared || is_flagged_unshared(bytes) {
        scratch.stack.clear();
        scratch.frames.clear();
        match decode_all::<B, false>(bytes, key, b, scratch) {
            Err(DecodeError::BadRef(_)) => {}
            result => return result,
        }
    }
    decode_with(bytes, key, b, scratch)
}

/// [`decode_inner`] of a whole encoding: trailing bytes are an error.
fn decode_all<B: Builder, const IDS: bool>(
    bytes: &[u8],
    key: Option<&[u8]>,
    b: &mut B,
    s: &mut Scratch<B::Term>,
) -> Result<B::Term, DecodeError> {
    let mut r = Reader::new(bytes);
    let v = decode_inner::<B, IDS>(&mut r, key, b, s)?;
    if r.remaining() != 0 {
        return Err(DecodeError::TrailingBytes(r.remaining()));
    }
    Ok(v)
}

/// Decodes one term from `r`, on top of whatever `s` holds (left as it
/// was). With `IDS` compound terms are numbered for `REF`s; without, a
/// `REF` is an error ([`DecodeError::BadRef`]) and nothing is numbered.
fn decode_inner<B: Builder, const IDS: bool>(
    r: &mut Reader<'_>,
    key: Option<&[u8]>,
    b: &mut B,
    s: &mut Scratch<B::Term>,
) -> Result<B::Term, DecodeError> {
    // The key, once a `KEY` has been decoded (a body may hold several).
    let mut key_term: Option<B::Term> = None;
    // Whether the first tag promised that no `REF` follows.
    let unshared = r.pos == 0 && is_flagged_unshared(r.buf);
    // Frames below this one belong to an encoding this one is nested in.
    let floor = s.frames.len();
    loop {
        let first = r.pos == 0;
        let t = match r.u8()? {
            tag::UNSHARED_TUPLE if first => tag::TUPLE,
            t if first && is_unshared_small_tuple(t) => tag::SMALL_TUPLE | (t & 0x0f),
            t => t,
        };
        // Either a finished value, or the header of a compound term whose
        // `n` children come next.
        let (mut value, open) = match t {
            t if t >= tag::SMALL_INT => (Some(b.int(i64::from(t & 0x7f))?), None),
            t if t >= tag::SMALL_ATOM => (Some(b.atom(u32::from(t & 0x3f))?), None),
            t if is_small_tuple(t) => (None, Some((Kind::Tuple, usize::from(t & 0x0f)))),
            tag::NIL => (Some(b.nil()?), None),
            tag::KEY => match &key_term {
                Some(v) => (Some(v.clone()), None),
                None => {
                    // The key is an encoding of its own, with its own ids.
                    let k = key.ok_or(DecodeError::UnexpectedKey)?;
                    let v = if IDS {
                        decode(k, None, b)?
                    } else {
                        decode_all::<B, false>(k, None, b, s)?
                    };
                    key_term = Some(v.clone());
                    (Some(v), None)
                }
            },
            tag::INT => (Some(b.int(unzigzag(r.varint()?))?), None),
            tag::FLOAT => {
                let raw = r.bytes(8)?;
                let mut a = [0u8; 8];
                a.copy_from_slice(raw);
                let f = f64::from_le_bytes(a);
                if !f.is_finite() {
                    return Err(DecodeError::BadFloat);
                }
                (Some(b.float(f)?), None)
            }
            tag::ATOM => {
                let id = u32::try_from(r.varint()?).map_err(|_| DecodeError::BadVarint)?;
                (Some(b.atom(id)?), None)
            }
            tag::BINARY | tag::ETF => {
                let n = r.count(1)?;
                let data = r.bytes(n)?;
                let v = if t == tag::BINARY {
                    b.binary(data)?
                } else {
                    b.etf(data)?
                };
                if IDS {
                    s.ids.push(Some(v.clone()));
                }
                (Some(v), None)
            }
            tag::TUPLE => (None, Some((Kind::Tuple, r.count(1)?))),
            tag::LIST => (None, Some((Kind::List, r.count(1)? + 1))),
            tag::MAP => (None, Some((Kind::Map, r.count(2)? * 2))),
            tag::REF => {
                let id = r.varint()?;
                if unshared || !IDS {
                    return Err(DecodeError::BadRef(id));
                }
                let v = usize::try_from(id)
                    .ok()
                    .and_then(|i| s.ids.get(i))
                    .and_then(|v| v.clone())
                    .ok_or(DecodeError::BadRef(id))?;
                (Some(v), None)
            }
            t => return Err(DecodeError::BadTag(t)),
        };
        if let Some((kind, n)) = open {
            let id = s.ids.len();
            if IDS {
                s.ids.push(None);
            }
            if n == 0 {
                let v = build(b, kind, &[])?;
                if IDS {
                    s.ids[id] = Some(v.clone());
                }
                value = Some(v);
            } else {
                s.frames.push(Frame {
                    kind,
                    remaining: n,
                    base: s.stack.len(),
                    id,
                });
            }
        }
        // Hand the finished value to its parent; close every parent it
        // completes.
        let Some(mut v) = value else { continue };
        loop {
            if s.frames.len() == floor {
                return Ok(v);
            }
            let Some(f) = s.frames.last_mut() else {
                return Ok(v);
            };
            s.stack.push(v);
            f.remaining -= 1;
            if f.remaining > 0 {
                break;
            }
            let (kind, base, id) = (f.kind, f.base, f.id);
            s.frames.pop();
            v = build(b, kind, &s.stack[base..])?;
            s.stack.truncate(base);
            if IDS {
                s.ids[id] = Some(v.clone());
            }
        }
    }
}

fn build<B: Builder>(b: &mut B, kind: Kind, items: &[B::Term]) -> Result<B::Term, DecodeError> {
    match kind {
        Kind::Tuple => b.tuple(items),
        Kind::Map => b.map(items),
        Kind::List => match items.split_last() {
            Some((tail, elems)) => b.list(elems, tail.clone()),
            None => b.nil(),
        },
    }
}

/// What one tag starts, read past without building anything.
enum Part {
    /// A scalar (or a `ref`, a `key`): nothing follows.
    Leaf,
    /// A compound whose header announced this many terms to follow (a
    /// list's tail counted); `true` for a map.
    Compound(usize, bool),
}

/// Reads one tag and its payload (a compound's header only); returns the
/// tag and what it starts.
/// Whether a term whose tag is `t` is that one byte: `[]`, a key, a small
/// atom or a small integer.
#[inline]
fn is_one_byte(t: u8) -> bool {
    t >= tag::SMALL_ATOM || t == tag::NIL || t == tag::KEY
}

fn part(r: &mut Reader<'_>) -> Result<(u8, Part), DecodeError> {
    let t = r.u8()?;
    let part = match t {
        t if is_one_byte(t) => Part::Leaf,
        tag::INT | tag::ATOM | tag::REF => {
            r.varint()?;
            Part::Leaf
        }
        tag::FLOAT => {
            r.bytes(8)?;
            Part::Leaf
        }
        tag::BINARY | tag::ETF => {
            let n = r.count(1)?;
            r.bytes(n)?;
            Part::Leaf
        }
        tag::TUPLE | tag::UNSHARED_TUPLE => Part::Compound(r.count(1)?, false),
        tag::LIST => Part::Compound(r.count(1)? + 1, false),
        tag::MAP => Part::Compound(r.count(2)? * 2, true),
        t if is_unshared_small_tuple(t) => Part::Compound(usize::from(t & 0x0f), false),
        t if (tag::SMALL_TUPLE..tag::SMALL_TUPLE + 16).contains(&t) => {
            Part::Compound(usize::from(t & 0x0f), false)
        }
        t => return Err(DecodeError::BadTag(t)),
    };
    Ok((t, part))
}

/// The arity of the tuple `bytes` starts with (a record's body: the
/// object); `None` if they start with something else.
pub fn tuple_arity(bytes: &[u8]) -> Option<u64> {
    let mut r = Reader::new(bytes);
    match r.u8().ok()? {
        t if is_small_tuple(t) || is_unshared_small_tuple(t) => Some(u64::from(t & 0x0f)),
        tag::TUPLE | tag::UNSHARED_TUPLE => r.varint().ok(),
        _ => None,
    }
}

/// Skips one complete term; returns its encoded length. Used to walk a
/// record's top-level elements without building them.
#[inline]
pub fn skip(bytes: &[u8]) -> Result<usize, DecodeError> {
    // One-byte terms (small integers and atoms, [], a key) are most of
    // what a scan's sieve steps over: no walk for them.
    match bytes.first() {
        Some(&t) if is_one_byte(t) => Ok(1),
        _ => skip_walk(bytes),
    }
}

fn skip_walk(bytes: &[u8]) -> Result<usize, DecodeError> {
    let mut r = Reader::new(bytes);
    let mut pending: u64 = 1;
    while pending > 0 {
        pending -= 1;
        if let (_, Part::Compound(n, _)) = part(&mut r)? {
            pending += n as u64;
        }
    }
    Ok(r.position())
}

/// Calls `ok` with the id of every atom in the encoded terms `bytes` (one
/// term or several in a row, walked in order); false as soon as it says
/// false.
pub fn atoms_all(bytes: &[u8], ok: &mut impl FnMut(u64) -> bool) -> Result<bool, DecodeError> {
    let mut r = Reader::new(bytes);
    while r.remaining() > 0 {
        let t = bytes[r.position()];
        let id = if t == tag::ATOM {
            r.u8()?;
            r.varint()?
        } else if (tag::SMALL_ATOM..tag::SMALL_INT).contains(&t) {
            r.u8()?;
            u64::from(t & 0x3f)
        } else {
            // Everything else is a leaf or a compound's header: its
            // children follow in order.
            part(&mut r)?;
            continue;
        };
        if !ok(id) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Calls `f` with every ETF piece in the encoded terms `bytes` (one term
/// or several in a row, walked in order).
pub fn etfs_all(bytes: &[u8], f: &mut impl FnMut(&[u8])) -> Result<(), DecodeError> {
    let mut r = Reader::new(bytes);
    while r.remaining() > 0 {
        if bytes[r.position()] == tag::ETF {
            r.u8()?;
            let n = r.count(1)?;
            f(r.bytes(n)?);
        } else {
            part(&mut r)?;
        }
    }
    Ok(())
}

/// The canonical encoding (docs/term-format.md, "Keys") of the encoded term
/// `bytes`: map pairs sorted by their encoded keys, a `KEY` tag replaced by
/// `key` (itself made canonical), and with `normalize_zero` every `-0.0`
/// written as `0.0`. Two terms that match (`=:=`) give equal bytes. Bag
/// tables use it to tell objects apart; their bodies hold no `REF`, and a
/// `REF` here is an error.
pub fn canonical(
    bytes: &[u8],
    key: Option<&[u8]>,
    normalize_zero: bool,
) -> Result<Vec<u8>, DecodeError> {
    /// A compound being rewritten: children still to come and, for a map,
    /// its pairs so far and the output it interrupts.
    struct Open {
        remaining: usize,
        map: Option<MapAcc>,
    }
    struct MapAcc {
        saved: Vec<u8>,
        pairs: Vec<(Vec<u8>, Vec<u8>)>,
        key: Option<Vec<u8>>,
    }
    // The key made canonical, once a `KEY` has been met (there may be several).
    let mut canonical_key: Option<Vec<u8>> = None;
    let mut r = Reader::new(bytes);
    let mut out = Vec::with_capacity(bytes.len());
    let mut stack: Vec<Open> = Vec::new();
    loop {
        let start = r.position();
        // Children of a compound opened here, and whether it is a map.
        let (t, open) = match part(&mut r)? {
            (tag::KEY, _) => {
                if canonical_key.is_none() {
                    let k = key.ok_or(DecodeError::UnexpectedKey)?;
                    canonical_key = Some(canonical(k, None, normalize_zero)?);
                }
                out.extend_from_slice(canonical_key.as_deref().unwrap_or_default());
                (tag::KEY, None)
            }
            (tag::REF, _) => {
                let id = Reader::new(&bytes[start + 1..]).varint()?;
                return Err(DecodeError::BadRef(id));
            }
            (t, Part::Leaf) => (t, None),
            (t, Part::Compound(n, is_map)) => (t, Some((n, is_map))),
        };
        // Everything but a key and a map's header (written when the map
        // closes) is copied as it is, or for a zero float normalized.
        let raw = &bytes[start..r.position()];
        match t {
            tag::KEY | tag::MAP => {}
            // The canonical form does not depend on the flag.
            tag::UNSHARED_TUPLE => {
                out.push(tag::TUPLE);
                out.extend_from_slice(&raw[1..]);
            }
            t if is_unshared_small_tuple(t) => out.push(tag::SMALL_TUPLE | (t & 0x0f)),
            tag::FLOAT if normalize_zero && raw[1..] == (-0.0f64).to_le_bytes() => {
                out.push(tag::FLOAT);
                out.extend_from_slice(&0.0f64.to_le_bytes());
            }
            _ => out.extend_from_slice(raw),
        }
        match open {
            Some((0, true)) => {
                out.push(tag::MAP);
                put_varint(&mut out, 0);
            }
            Some((0, false)) | None => {}
            Some((n, is_map)) => {
                let map = is_map.then(|| MapAcc {
                    saved: std::mem::take(&mut out),
                    pairs: Vec::with_capacity(n / 2),
                    key: None,
                });
                stack.push(Open { remaining: n, map });
                continue;
            }
        }
        // A complete term: hand it to its parents, closing each it ends.
        loop {
            let Some(top) = stack.last_mut() else {
                if r.remaining() != 0 {
                    return Err(DecodeError::TrailingBytes(r.remaining()));
                }
                return Ok(out);
            };
            if let Some(m) = &mut top.map {
                let child = std::mem::take(&mut out);
                match m.key.take() {
                    None => m.key = Some(child),
                    Some(k) => m.pairs.push((k, child)),
                }
            }
            top.remaining -= 1;
            if top.remaining > 0 {
                break;
            }
            if let Some(Open {
                map: Some(mut m), ..
            }) = stack.pop()
            {
                m.pairs.sort();
                out = m.saved;
                out.push(tag::MAP);
                put_varint(&mut out, m.pairs.len() as u64);
                for (k, v) in &m.pairs {
                    out.extend_from_slice(k);
                    out.extend_from_slice(v);
                }
            }
        }
    }
}

/// A plain Rust model of a term, for tests, fuzzing and benchmarks. Atoms are
/// dictionary ids; `Etf` holds external-term-format bytes.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// `[]`
    Nil,
    /// An integer in the 64-bit range.
    Int(i64),
    /// A float.
    Float(f64),
    /// An atom id.
    Atom(u32),
    /// A binary.
    Binary(Vec<u8>),
    /// External term format bytes.
    Etf(Vec<u8>),
    /// A tuple.
    Tuple(Vec<Value>),
    /// A list and its tail (`Nil` for a proper list).
    List(Vec<Value>, Box<Value>),
    /// A map as key/value pairs.
    Map(Vec<(Value, Value)>),
}

impl Value {
    /// Writes the value without back-references (each subterm in full).
    pub fn encode(&self, w: &mut Writer) {
        match self {
            Value::Nil => w.nil(),
            Value::Int(i) => w.int(*i),
            Value::Float(f) => w.float(*f, false),
            Value::Atom(a) => w.atom(*a),
            Value::Binary(b) => {
                w.binary(b);
            }
            Value::Etf(b) => {
                w.etf(b);
            }
            Value::Tuple(es) => {
                w.tuple(es.len());
                es.iter().for_each(|e| e.encode(w));
            }
            Value::List(es, tail) => {
                w.list(es.len());
                es.iter().for_each(|e| e.encode(w));
                tail.encode(w);
            }
            Value::Map(kvs) => {
                w.map(kvs.len());
                for (k, v) in kvs {
                    k.encode(w);
                    v.encode(w);
                }
            }
        }
    }

    /// The value's encoding as a fresh byte vector.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut w = Writer::new();
        self.encode(&mut w);
        w.buf
    }
}

/// Builds [`Value`]s.
pub struct ValueBuilder;

impl Builder for ValueBuilder {
    type Term = Value;
    fn nil(&mut self) -> Result<Value, DecodeError> {
        Ok(Value::Nil)
    }
    fn int(&mut self, v: i64) -> Result<Value, DecodeError> {
        Ok(Value::Int(v))
    }
    fn float(&mut self, v: f64) -> Result<Value, DecodeError> {
        Ok(Value::Float(v))
    }
    fn atom(&mut self, id: u32) -> Result<Value, DecodeError> {
        Ok(Value::Atom(id))
    }
    fn binary(&mut self, bytes: &[u8]) -> Result<Value, DecodeError> {
        Ok(Value::Binary(bytes.to_vec()))
    }
    fn etf(&mut self, bytes: &[u8]) -> Result<Value, DecodeError> {
        Ok(Value::Etf(bytes.to_vec()))
    }
    fn tuple(&mut self, elems: &[Value]) -> Result<Value, DecodeError> {
        Ok(Value::Tuple(elems.to_vec()))
    }
    fn list(&mut self, elems: &[Value], tail: Value) -> Result<Value, DecodeError> {
        Ok(Value::List(elems.to_vec(), Box::new(tail)))
    }
    fn map(&mut self, kvs: &[Value]) -> Result<Value, DecodeError> {
        Ok(Value::Map(
            kvs.chunks_exact(2)
                .map(|p| (p[0].clone(), p[1].clone()))
                .collect(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(v: &Value) {
        let bytes = v.to_bytes();
        assert_eq!(skip(&bytes), Ok(bytes.len()), "skip of {v:?}");
        let back = decode(&bytes, None, &mut ValueBuilder).expect("decodes");
        assert_eq!(&back, v);
    }

    fn list(es: Vec<Value>) -> Value {
        Value::List(es, Box::new(Value::Nil))
    }

    #[test]
    fn varints_roundtrip_at_every_width() {
        for v in [
            0u64,
            1,
            127,
            128,
            300,
            16_383,
            16_384,
            u32::MAX as u64,
            u64::MAX,
        ] {
            let mut buf = Vec::new();
            put_varint(&mut buf, v);
            assert_eq!(buf.len(), varint_len(v), "len of {v}");
            assert_eq!(Reader::new(&buf).varint(), Ok(v));
        }
    }

    #[test]
    fn overlong_varint_is_rejected() {
        let bytes = [0xffu8; 11];
        assert_eq!(Reader::new(&bytes).varint(), Err(DecodeError::BadVarint));
        let mut ten = vec![0xffu8; 9];
        ten.push(0x02); // a 65th bit
        assert_eq!(Reader::new(&ten).varint(), Err(DecodeError::BadVarint));
    }

    #[test]
    fn integers_roundtrip_including_extremes() {
        for i in [0, 1, 127, 128, -1, -128, i64::MIN, i64::MAX, 1 << 40] {
            roundtrip(&Value::Int(i));
        }
        assert_eq!(Value::Int(5).to_bytes(), vec![0x85]);
        assert_eq!(Value::Int(-1).to_bytes(), vec![tag::INT, 1]);
    }

    #[test]
    fn compound_terms_roundtrip() {
        let v = Value::Tuple(vec![
            Value::Atom(3),
            Value::Atom(1000),
            Value::Float(-2.5),
            Value::Binary(b"hello".to_vec()),
            list(vec![Value::Int(1), Value::Nil]),
            Value::List(vec![Value::Int(1)], Box::new(Value::Int(2))),
            Value::Map(vec![(Value::Atom(1), list(vec![]))]),
            Value::Tuple(vec![Value::Int(0); 40]),
            Value::Etf(vec![131, 97, 1]),
            Value::Tuple(vec![]),
            Value::Map(vec![]),
        ]);
        roundtrip(&v);
    }

    #[test]
    fn negative_zero_is_normalized_only_when_asked() {
        let mut w = Writer::new();
        w.float(-0.0, true);
        w.float(-0.0, false);
        assert_eq!(&w.buf[1..9], &0.0f64.to_le_bytes());
        assert_eq!(&w.buf[10..18], &(-0.0f64).to_le_bytes());
    }

    #[test]
    fn backrefs_resolve_to_the_numbered_compound() {
        // {L, L, B, B} with L = [a] and B = <<"x">> written once each.
        let mut w = Writer::new();
        w.tuple(4); // id 0
        let l = w.list(1); // id 1
        w.atom(0);
        w.nil();
        w.backref(l);
        let b = w.binary(b"x"); // id 2
        w.backref(b);
        let v = decode(&w.buf, None, &mut ValueBuilder).unwrap();
        let la = list(vec![Value::Atom(0)]);
        let bx = Value::Binary(b"x".to_vec());
        assert_eq!(v, Value::Tuple(vec![la.clone(), la, bx.clone(), bx]));
        assert_eq!(skip(&w.buf), Ok(w.buf.len()));
    }

    #[test]
    fn a_reference_to_an_open_or_unknown_term_is_an_error() {
        let mut w = Writer::new();
        let t = w.tuple(1);
        w.backref(t); // the tuple refers to itself
        assert_eq!(
            decode(&w.buf, None, &mut ValueBuilder),
            Err(DecodeError::BadRef(0))
        );
        let mut w = Writer::new();
        w.backref(7);
        assert_eq!(
            decode(&w.buf, None, &mut ValueBuilder),
            Err(DecodeError::BadRef(7))
        );
    }

    #[test]
    fn key_placeholder_is_replaced_by_the_key() {
        let key = Value::Tuple(vec![Value::Int(1), Value::Atom(2)]).to_bytes();
        let mut w = Writer::new();
        w.tuple(2);
        w.key();
        w.int(9);
        let v = decode(&w.buf, Some(&key), &mut ValueBuilder).unwrap();
        assert_eq!(
            v,
            Value::Tuple(vec![
                Value::Tuple(vec![Value::Int(1), Value::Atom(2)]),
                Value::Int(9)
            ])
        );
        assert_eq!(
            decode(&w.buf, None, &mut ValueBuilder),
            Err(DecodeError::UnexpectedKey)
        );
    }

    #[test]
    fn malformed_input_is_an_error_not_a_panic() {
        let good = Value::Tuple(vec![Value::Binary(vec![1, 2, 3]), Value::Int(300)]).to_bytes();
        for cut in 0..good.len() {
            assert!(decode(&good[..cut], None, &mut ValueBuilder).is_err());
        }
        assert_eq!(
            decode(&[0x0c], None, &mut ValueBuilder),
            Err(DecodeError::BadTag(0x0c))
        );
        let mut nan = vec![tag::FLOAT];
        nan.extend_from_slice(&f64::NAN.to_le_bytes());
        assert_eq!(
            decode(&nan, None, &mut ValueBuilder),
            Err(DecodeError::BadFloat)
        );
        let mut trailing = good.clone();
        trailing.push(0);
        assert_eq!(
            decode(&trailing, None, &mut ValueBuilder),
            Err(DecodeError::TrailingBytes(1))
        );
        // A list claiming 2^40 elements in 7 bytes is refused before any work.
        let mut huge = vec![tag::LIST];
        put_varint(&mut huge, 1 << 40);
        assert_eq!(
            decode(&huge, None, &mut ValueBuilder),
            Err(DecodeError::BadLength(1 << 40))
        );
    }

    #[test]
    fn canonical_sorts_maps_expands_the_key_and_normalizes_zero() {
        let map = |kvs: Vec<(Value, Value)>| Value::Map(kvs);
        let a = map(vec![
            (Value::Atom(2), Value::Float(-0.0)),
            (
                Value::Atom(1),
                map(vec![
                    (Value::Int(9), Value::Nil),
                    (Value::Int(3), Value::Nil),
                ]),
            ),
        ]);
        let b = map(vec![
            (
                Value::Atom(1),
                map(vec![
                    (Value::Int(3), Value::Nil),
                    (Value::Int(9), Value::Nil),
                ]),
            ),
            (Value::Atom(2), Value::Float(0.0)),
        ]);
        let key = Value::Tuple(vec![Value::Float(-0.0)]).to_bytes();
        let body = |v: &Value| {
            let mut w = Writer::new();
            w.tuple(2);
            w.key();
            v.encode(&mut w);
            w.buf
        };
        let ca = canonical(&body(&a), Some(&key), true).unwrap();
        let cb = canonical(&body(&b), Some(&key), true).unwrap();
        assert_eq!(ca, cb);
        let whole = Value::Tuple(vec![Value::Tuple(vec![Value::Float(0.0)]), b.clone()]);
        assert_eq!(
            decode(&ca, None, &mut ValueBuilder).unwrap(),
            decode(
                &canonical(&whole.to_bytes(), None, true).unwrap(),
                None,
                &mut ValueBuilder
            )
            .unwrap()
        );
        // Without normalization the sign of zero tells the two apart.
        assert_ne!(
            canonical(&body(&a), Some(&key), false).unwrap(),
            canonical(&body(&b), Some(&key), false).unwrap()
        );
        // A canonical encoding is its own canonical form.
        assert_eq!(canonical(&ca, None, true).unwrap(), ca);
        // Bodies with back-references are refused, as is a missing key.
        let mut w = Writer::new();
        w.tuple(2);
        let l = w.list(1);
        w.nil();
        w.nil();
        w.backref(l);
        assert_eq!(canonical(&w.buf, None, true), Err(DecodeError::BadRef(1)));
        assert_eq!(
            canonical(&body(&a), None, true),
            Err(DecodeError::UnexpectedKey)
        );
    }

    /// A record body `{KEY, elems...}` (key at position 1), flagged by the
    /// writer if it holds no back-reference.
    fn body(elems: &[Value], flag: bool) -> Vec<u8> {
        let mut w = Writer::new();
        w.tuple(elems.len() + 1);
        w.key();
        elems.iter().for_each(|e| e.encode(&mut w));
        if flag {
            w.flag_if_unshared();
        }
        w.buf
    }

    fn sample_elems() -> Vec<Value> {
        vec![
            Value::Map(vec![
                (Value::Atom(0), Value::Int(7)),
                (Value::Atom(1), Value::Binary(b"user-7".to_vec())),
                (Value::Atom(70), Value::Int(-300)),
            ]),
            list(vec![Value::Float(1.5), Value::Etf(vec![131, 97, 1])]),
            Value::List(vec![Value::Int(1)], Box::new(Value::Int(2))),
            Value::Tuple(vec![Value::Tuple(vec![]), Value::Map(vec![]), Value::Nil]),
            Value::Tuple((0..20).map(Value::Int).collect()),
        ]
    }

    fn record_of(key: &[u8], elems: &[Value]) -> Value {
        let k = decode(key, None, &mut ValueBuilder).unwrap();
        Value::Tuple(std::iter::once(k).chain(elems.iter().cloned()).collect())
    }

    fn decode_rec(bytes: &[u8], key: Option<&[u8]>, known: bool) -> Result<Value, DecodeError> {
        decode_record(
            bytes,
            key,
            known,
            &mut ValueBuilder,
            &mut Scratch::default(),
        )
    }

    #[test]
    fn a_body_without_backrefs_is_flagged_and_one_with_them_is_not() {
        let few = body(&[Value::Int(1)], true);
        assert_eq!(few[0], tag::UNSHARED_SMALL_TUPLE | 2);
        assert!(is_flagged_unshared(&few));
        let many = body(&vec![Value::Nil; 20], true);
        assert_eq!(many[0], tag::UNSHARED_TUPLE);
        assert!(is_flagged_unshared(&many));
        // {KEY, L, L}: the second L is a REF, so no flag.
        let mut w = Writer::new();
        w.tuple(3);
        w.key();
        let l = w.list(1);
        w.int(1);
        w.nil();
        w.backref(l);
        assert!(w.has_backrefs());
        w.flag_if_unshared();
        assert_eq!(w.buf[0], tag::SMALL_TUPLE | 3);
        assert!(!is_flagged_unshared(&w.buf));
        // Clearing forgets the REF.
        w.clear();
        w.tuple(0);
        w.flag_if_unshared();
        assert_eq!(w.buf, [tag::UNSHARED_SMALL_TUPLE]);
    }

    #[test]
    fn flagged_unflagged_and_known_unshared_bodies_decode_alike() {
        let key = Value::Tuple(vec![Value::Atom(3), Value::Binary(b"k".to_vec())]).to_bytes();
        let elems = sample_elems();
        let want = record_of(&key, &elems);
        let plain = body(&elems, false);
        let flagged = body(&elems, true);
        assert_ne!(plain, flagged);
        assert_eq!(&plain[1..], &flagged[1..], "only the first tag differs");
        for (bytes, known) in [(&plain, false), (&plain, true), (&flagged, false)] {
            assert_eq!(decode_rec(bytes, Some(&key), known), Ok(want.clone()));
            assert_eq!(
                decode(bytes, Some(&key), &mut ValueBuilder),
                Ok(want.clone())
            );
        }
        // A key alone, decoded as known unshared.
        let k = decode(&key, None, &mut ValueBuilder).unwrap();
        assert_eq!(decode_rec(&key, None, true), Ok(k));
        // Shapes, arities and tags, as encodings of their own.
        let v = Value::Tuple(elems.clone());
        for known in [false, true] {
            assert_eq!(decode_rec(&v.to_bytes(), None, known), Ok(v.clone()));
        }
    }

    #[test]
    fn an_old_body_with_backrefs_decodes_with_or_without_the_hint() {
        // {KEY, L, L} written before the flag existed: unflagged, with a REF.
        let mut w = Writer::new();
        w.tuple(3);
        w.key();
        let l = w.list(1);
        w.atom(5);
        w.nil();
        w.backref(l);
        let key = Value::Int(9).to_bytes();
        let la = list(vec![Value::Atom(5)]);
        let want = Value::Tuple(vec![Value::Int(9), la.clone(), la]);
        assert_eq!(decode_rec(&w.buf, Some(&key), false), Ok(want.clone()));
        // A caller that (wrongly) says unshared still gets the term.
        assert_eq!(decode_rec(&w.buf, Some(&key), true), Ok(want));
    }

    #[test]
    fn a_backref_in_a_flagged_body_is_an_error() {
        let mut w = Writer::new();
        w.tuple(3);
        w.key();
        let l = w.list(1);
        w.nil();
        w.nil();
        w.backref(l);
        w.buf[0] = tag::UNSHARED_SMALL_TUPLE | 3; // a flag that lies
        let key = Value::Int(1).to_bytes();
        for known in [false, true] {
            assert_eq!(
                decode_rec(&w.buf, Some(&key), known),
                Err(DecodeError::BadRef(1))
            );
        }
        assert_eq!(
            decode(&w.buf, Some(&key), &mut ValueBuilder),
            Err(DecodeError::BadRef(1))
        );
    }

    #[test]
    fn the_flag_is_only_read_as_the_first_tag() {
        // {{}} with the inner tuple flagged: not a valid encoding.
        let nested = [tag::SMALL_TUPLE | 1, tag::UNSHARED_SMALL_TUPLE];
        let nested_big = [tag::SMALL_TUPLE | 1, tag::UNSHARED_TUPLE, 0];
        for bytes in [&nested[..], &nested_big[..]] {
            assert_eq!(
                decode(bytes, None, &mut ValueBuilder),
                Err(DecodeError::BadTag(bytes[1]))
            );
            assert_eq!(
                decode_rec(bytes, None, true),
                Err(DecodeError::BadTag(bytes[1]))
            );
        }
        // Readers of structure see a flagged body as the tuple it is.
        let flagged = body(&[Value::Atom(4), Value::Atom(99)], true);
        assert_eq!(tuple_arity(&flagged), Some(3));
        assert_eq!(tuple_arity(&body(&vec![Value::Nil; 30], true)), Some(31));
        assert_eq!(skip(&flagged), Ok(flagged.len()));
        let mut ids = Vec::new();
        assert_eq!(
            atoms_all(&flagged, &mut |id| {
                ids.push(id);
                true
            }),
            Ok(true)
        );
        assert_eq!(ids, [4, 99]);
        // The canonical form does not depend on the flag.
        let key = Value::Int(1).to_bytes();
        let elems = sample_elems();
        assert_eq!(
            canonical(&body(&elems, true), Some(&key), false),
            canonical(&body(&elems, false), Some(&key), false)
        );
    }

    #[test]
    fn lean_decoding_handles_deep_nesting_and_malformed_input() {
        // [[[...]]] 500 deep in a flagged body.
        let mut deep = Value::Nil;
        for _ in 0..500 {
            deep = list(vec![deep]);
        }
        let key = Value::Int(1).to_bytes();
        let flagged = body(std::slice::from_ref(&deep), true);
        let want = record_of(&key, &[deep]);
        assert_eq!(decode_rec(&flagged, Some(&key), false), Ok(want.clone()));
        assert_eq!(decode_rec(&flagged, Some(&key), true), Ok(want));
        // Every cut of a flagged body is an error, as is a byte more.
        let good = body(&sample_elems(), true);
        for cut in 0..good.len() {
            assert!(decode_rec(&good[..cut], Some(&key), false).is_err());
        }
        let mut trailing = good.clone();
        trailing.push(0);
        assert_eq!(
            decode_rec(&trailing, Some(&key), false),
            Err(DecodeError::TrailingBytes(1))
        );
        // A KEY with no key given.
        let two = body(&[], true);
        assert_eq!(
            decode_rec(&two, None, false),
            Err(DecodeError::UnexpectedKey)
        );
    }

    #[test]
    fn every_key_tag_of_a_body_stands_for_the_key() {
        // {KEY, [KEY, x], %{KEY => KEY}}: each KEY is the key, on both
        // decoding paths and in the canonical form.
        let key_value = Value::Tuple(vec![Value::Int(300), Value::Binary(b"k".to_vec())]);
        let key = key_value.to_bytes();
        let mut w = Writer::new();
        w.tuple(3);
        w.key();
        w.list(2);
        w.key();
        w.atom(7);
        w.nil();
        w.map(1);
        w.key();
        w.key();
        let unflagged = w.buf.clone();
        w.flag_if_unshared();
        let want = Value::Tuple(vec![
            key_value.clone(),
            Value::List(
                vec![key_value.clone(), Value::Atom(7)],
                Box::new(Value::Nil),
            ),
            Value::Map(vec![(key_value.clone(), key_value.clone())]),
        ]);
        for bytes in [&w.buf, &unflagged] {
            assert_eq!(decode_rec(bytes, Some(&key), false), Ok(want.clone()));
            assert_eq!(
                decode(bytes, Some(&key), &mut ValueBuilder),
                Ok(want.clone())
            );
            assert_eq!(
                canonical(bytes, Some(&key), false).unwrap(),
                canonical(&want.to_bytes(), None, false).unwrap()
            );
            assert_eq!(skip(bytes), Ok(bytes.len()));
        }
    }

    #[test]
    fn the_lean_path_decodes_exactly_what_the_id_keeping_decoder_does() {
        // Valid bodies (flagged, unflagged, with REFs) with bytes changed at
        // random: both decoders agree on success and on the value.
        let key = Value::Tuple(vec![Value::Int(5), Value::Atom(1)]).to_bytes();
        let mut shared = Writer::new();
        shared.tuple(4);
        shared.key();
        let l = shared.list(2);
        shared.atom(3);
        shared.binary(b"ab");
        shared.nil();
        shared.backref(l);
        shared.backref(l + 1);
        let seeds = [
            body(&sample_elems(), true),
            body(&sample_elems(), false),
            shared.buf.clone(),
        ];
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut decoded = 0;
        for round in 0..30_000 {
            let mut bytes = seeds[round % seeds.len()].clone();
            for _ in 0..1 + next() % 3 {
                let at = (next() as usize) % bytes.len();
                bytes[at] = next() as u8;
            }
            let full = decode(&bytes, Some(&key), &mut ValueBuilder);
            for known in [false, true] {
                assert_eq!(decode_rec(&bytes, Some(&key), known), full, "{bytes:02x?}");
            }
            decoded += usize::from(full.is_ok());
        }
        assert!(
            decoded > 1000,
            "too few mutants decode ({decoded}) to compare values"
        );
    }

    #[test]
    fn deep_nesting_does_not_use_the_call_stack() {
        let depth = 200_000;
        let mut w = Writer::new();
        for _ in 0..depth {
            w.list(1);
        }
        w.nil();
        for _ in 0..depth {
            w.nil();
        }
        // Count the depth with a builder that keeps only a number.
        struct Depth;
        impl Builder for Depth {
            type Term = u32;
            fn nil(&mut self) -> Result<u32, DecodeError> {
                Ok(0)
            }
            fn int(&mut self, _: i64) -> Result<u32, DecodeError> {
                Ok(0)
            }
            fn float(&mut self, _: f64) -> Result<u32, DecodeError> {
                Ok(0)
            }
            fn atom(&mut self, _: u32) -> Result<u32, DecodeError> {
                Ok(0)
            }
            fn binary(&mut self, _: &[u8]) -> Result<u32, DecodeError> {
                Ok(0)
            }
            fn etf(&mut self, _: &[u8]) -> Result<u32, DecodeError> {
                Ok(0)
            }
            fn tuple(&mut self, e: &[u32]) -> Result<u32, DecodeError> {
                Ok(e.iter().copied().max().unwrap_or(0) + 1)
            }
            fn list(&mut self, e: &[u32], t: u32) -> Result<u32, DecodeError> {
                Ok(e.iter().copied().max().unwrap_or(0).max(t) + 1)
            }
            fn map(&mut self, e: &[u32]) -> Result<u32, DecodeError> {
                Ok(e.iter().copied().max().unwrap_or(0) + 1)
            }
        }
        assert_eq!(decode(&w.buf, None, &mut Depth), Ok(depth));
        assert_eq!(skip(&w.buf), Ok(w.buf.len()));
    }
}
