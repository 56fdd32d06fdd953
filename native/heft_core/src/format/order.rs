//! Erlang term order over encoded keys, computed on the bytes: nothing is
//! decoded to the BEAM to compare.
//!
//! [`compare`] agrees with Erlang's `<`, `==` and `>` for every pair of
//! terms (checked against the VM by test/heft/term_order_test.exs):
//!
//! - classes first: number < atom < reference < fun < port < pid < tuple <
//!   map < `[]` < non-empty list < bitstring;
//! - numbers by value, exactly: `1 == 1.0`, and integers of any size
//!   (big ones are ETF pieces) against floats without rounding;
//! - atoms by name (UTF-8, code point order), names from the caller;
//! - references by node name, node creation, then their ID words from the
//!   most significant (high zero words ignored); ports by node name,
//!   creation, number; pids by serial, number, node name, creation;
//! - local funs before external ones; local funs by module, `OldIndex`,
//!   `OldUniq`, number of captured variables, then those variables;
//!   external funs by module, function, arity;
//! - tuples by arity, then element by element;
//! - maps by size, then their keys in ascending "map-key order" (where every
//!   integer is smaller than every float, and `1` and `1.0` differ), then
//!   their values in key order;
//! - lists cell by cell (an improper tail compares as a term);
//! - bitstrings bit by bit, a prefix first.
//!
//! The walk keeps its own stack, so deep nesting does not use the call
//! stack, except that sorting the keys of a map compares keys with a nested
//! call: maps inside map keys nest at most [`MAX_MAP_KEY_DEPTH`] deep.

use std::cmp::Ordering::{self, Equal, Greater, Less};

use crate::codec::{self, tag, unzigzag, DecodeError, Reader, Writer};
use crate::etf::{self, Node, Piece, Text};

/// How deep maps may nest inside map keys (a map key holding a map whose
/// key holds a map...). Deeper keys are compared by their bytes instead.
pub const MAX_MAP_KEY_DEPTH: u32 = 64;

/// Compares two canonical key encodings (docs/term-format.md, "Keys") in
/// Erlang term order; `Equal` exactly when the terms are `==`. `atom_name`
/// gives the name of an atom id of the table's dictionary.
///
/// Malformed input, which the table never stores, is ordered by its bytes
/// rather than refused; so are maps nested in map keys beyond
/// [`MAX_MAP_KEY_DEPTH`].
pub fn compare<'n>(a: &[u8], b: &[u8], atom_name: impl Fn(u32) -> &'n str) -> Ordering {
    try_compare(a, b, &atom_name, false).unwrap_or_else(|_| a.cmp(b))
}

/// [`compare`] in map-key order: as term order, except that every integer
/// is smaller than every float (so `1` and `1.0` differ).
pub fn compare_exact<'n>(a: &[u8], b: &[u8], atom_name: impl Fn(u32) -> &'n str) -> Ordering {
    try_compare(a, b, &atom_name, true).unwrap_or_else(|_| a.cmp(b))
}

/// The atom that stands for "any term" in a bound of [`compare_bound`].
pub const WILDCARD: &str = "$heft_wildcard";

/// Compares a key against a bound: a key encoding in which the atom
/// [`WILDCARD`] may stand for an unknown part. The comparison runs as
/// [`compare`] until it reaches a wildcard in `bound`, and is `Equal` from
/// there: every earlier part was equal, so the key agrees with the bound as
/// far as the bound is known. The keys `Equal` to a bound are therefore
/// contiguous in term order: `{user, '$heft_wildcard'}` is `Equal` to every
/// 2-tuple whose first element is `== user`, `Less` than those below them
/// and `Greater` than those above. A wildcard as a list's tail stands for
/// the rest of the list, its further cells and their tail:
/// `[3 | '$heft_wildcard']` is `Equal` to `[3]`, `[3, 0]`, `[3 | x]`, every
/// list whose head is `== 3`.
pub fn compare_bound<'n>(key: &[u8], bound: &[u8], atom_name: impl Fn(u32) -> &'n str) -> Ordering {
    let wild = |h: &Head| match h {
        Head::AtomId(id) => atom_name(*id) == WILDCARD,
        Head::Atom(Text::Utf8(t) | Text::Latin1(t)) => *t == WILDCARD.as_bytes(),
        _ => false,
    };
    if head(bound).is_ok_and(|(h, _)| wild(&h)) {
        return Equal;
    }
    let mut c = Cmp {
        a: key,
        b: bound,
        owned: Vec::new(),
        names: &atom_name,
        depth: 0,
        wild: Some(&wild),
    };
    c.run(Cur { buf: 0, pos: 0 }, Cur { buf: 1, pos: 0 }, false)
        .unwrap_or_else(|_| key.cmp(bound))
}

/// A 64-bit summary of a canonical key encoding that keeps term order: if
/// `a < b` then `prefix(a) <= prefix(b)`, and keys that compare `Equal`
/// have equal prefixes (`1` and `1.0` included). Two different prefixes
/// therefore order their keys without reading them; equal ones say
/// nothing, and the keys must be compared in full. The ordered index keeps
/// one beside every loc ([`crate::ordered`]).
///
/// The top 4 bits are the term's class (number < atom < ... < bitstring);
/// the other 60 hold, by class: a number's value as a double (integers
/// rounded to the nearest, both clamped to `±2^63`, `-0.0` as `0.0`) in
/// an order-preserving bit pattern, truncated; the first bytes of an
/// atom's name (UTF-8) or of a bitstring, padded with zero bits; a tuple's
/// arity (12 bits, clamped) then the prefix of its first element; a
/// non-empty list's first element's prefix; a map's size (clamped);
/// nothing for the other classes. Truncating a prefix keeps its order, so a
/// nested one is the element's own shifted right.
///
/// `None` for input the table never stores (malformed, or ETF pieces
/// holding compound terms, whose class needs a rewrite): callers compare
/// such keys in full.
pub fn prefix<'n>(key: &[u8], atom_name: impl Fn(u32) -> &'n str) -> Option<u64> {
    prefix_at(key, &atom_name, 0)
}

/// Nested tuples and lists: each level costs at least 4 bits of class.
const PREFIX_DEPTH: u32 = 8;

fn prefix_at<'n>(bytes: &[u8], names: &dyn Fn(u32) -> &'n str, depth: u32) -> Option<u64> {
    let (h, len) = head(bytes).ok()?;
    let class = u64::from(h.class());
    if class > 0x0f {
        return None;
    }
    let nested = |skip: usize| -> Option<u64> {
        if depth >= PREFIX_DEPTH {
            Some(0)
        } else {
            prefix_at(bytes.get(skip..)?, names, depth + 1)
        }
    };
    let body = match h {
        Head::Int(i) => number_bits(i as f64),
        Head::Float(f) => number_bits(f),
        Head::Big(neg, mag) => {
            // Little-endian digits; outside 64 bits the clamp decides.
            let digits = mag.iter().rposition(|&d| d != 0).map_or(0, |i| i + 1);
            let v = match digits {
                0..=8 => mag[..digits]
                    .iter()
                    .rev()
                    .fold(0u64, |v, &d| v << 8 | u64::from(d)) as f64,
                _ => f64::MAX,
            };
            number_bits(if neg { -v } else { v })
        }
        Head::AtomId(id) => text_bits(Text::Utf8(names(id).as_bytes())),
        Head::Atom(t) => text_bits(t),
        Head::Bits(data, bits) => {
            let mut w = [0u8; 8];
            let n = data.len().min(8);
            w[..n].copy_from_slice(&data[..n]);
            let v = u64::from_be_bytes(w);
            let v = if bits < 64 {
                v & !(u64::MAX >> bits)
            } else {
                v
            };
            v >> 4
        }
        Head::Tuple(n) => {
            const MAX: usize = 0xfff;
            let arity = n.min(MAX) as u64;
            let first = if n == 0 || n >= MAX { 0 } else { nested(len)? };
            (arity << 48) | (first >> 16)
        }
        Head::List(n) if n > 0 => nested(len)? >> 4,
        Head::Map(n) => (n.min(0xf_ffff) as u64) << 40,
        _ => 0,
    };
    Some((class << 60) | body)
}

/// 60 bits of a number's order: its value as a double clamped to
/// `±2^63` (so that integers outside i64, which compare against doubles
/// exactly, stay ordered), in an order-preserving bit pattern.
fn number_bits(f: f64) -> u64 {
    const LIMIT: f64 = 9_223_372_036_854_775_808.0; // 2^63
    let f = f.clamp(-LIMIT, LIMIT);
    let f = if f == 0.0 { 0.0 } else { f };
    let b = f.to_bits();
    let ordered = if b >> 63 == 1 { !b } else { b | 1 << 63 };
    ordered >> 4
}

/// 60 bits of an atom name's order: its first UTF-8 bytes, zero-padded.
fn text_bits(t: Text) -> u64 {
    let mut w = [0u8; 8];
    match t {
        Text::Utf8(x) => {
            let n = x.len().min(8);
            w[..n].copy_from_slice(&x[..n]);
        }
        Text::Latin1(x) => {
            let mut at = 0;
            for &c in x {
                let mut u = [0u8; 2];
                let s = char::from(c).encode_utf8(&mut u).as_bytes();
                for &b in s {
                    if at < 8 {
                        w[at] = b;
                        at += 1;
                    }
                }
                if at >= 8 {
                    break;
                }
            }
        }
    }
    u64::from_be_bytes(w) >> 4
}

/// `a == b`, with no call to `memcmp` for the short encodings most keys
/// and constants have: a scan's sieve compares one of them with each
/// record's, and the call cost more than the comparison.
#[inline]
pub fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    if a.len() > 16 {
        return a == b;
    }
    let mut diff = 0u8;
    for (x, y) in a.iter().zip(b) {
        diff |= x ^ y;
    }
    diff == 0
}

/// [`compare`] (or, with `exact`, [`compare_exact`]) that reports
/// malformed input instead of falling back to byte order.
pub fn try_compare<'n>(
    a: &[u8],
    b: &[u8],
    atom_name: &dyn Fn(u32) -> &'n str,
    exact: bool,
) -> Result<Ordering, DecodeError> {
    if same_bytes(a, b) {
        return Ok(Equal);
    }
    // Most keys are one scalar: no walk needed.
    if let (Ok((ha, la)), Ok((hb, lb))) = (head(a), head(b)) {
        if la == a.len() && lb == b.len() && is_scalar(&ha) && is_scalar(&hb) {
            let (ca, cb) = (ha.class(), hb.class());
            return Ok(if ca == cb {
                cmp_scalar(&ha, &hb, exact, atom_name)
            } else {
                ca.cmp(&cb)
            });
        }
    }
    let mut c = Cmp {
        a,
        b,
        owned: Vec::new(),
        names: atom_name,
        depth: 0,
        wild: None,
    };
    let ord = c.run(Cur { buf: 0, pos: 0 }, Cur { buf: 1, pos: 0 }, exact)?;
    Ok(ord)
}

/// The class of a term, in term order.
mod class {
    pub const NUMBER: u8 = 0;
    pub const ATOM: u8 = 1;
    pub const REFERENCE: u8 = 2;
    pub const FUN: u8 = 3;
    pub const PORT: u8 = 4;
    pub const PID: u8 = 5;
    pub const TUPLE: u8 = 6;
    pub const MAP: u8 = 7;
    pub const NIL: u8 = 8;
    pub const LIST: u8 = 9;
    pub const BITSTRING: u8 = 10;
}

/// A position in one of the comparator's buffers: 0 is `a`, 1 is `b`,
/// the others hold ETF rewritten into the Heft format.
#[derive(Clone, Copy, Debug)]
struct Cur {
    buf: usize,
    pos: usize,
}

impl Cur {
    fn at(buf: usize) -> Cur {
        Cur { buf, pos: 0 }
    }

    fn plus(self, n: usize) -> Cur {
        Cur {
            buf: self.buf,
            pos: self.pos + n,
        }
    }
}

/// The head of one term: a whole scalar, or a compound's header.
enum Head<'x> {
    Int(i64),
    Big(bool, &'x [u8]),
    Float(f64),
    AtomId(u32),
    Atom(Text<'x>),
    /// A reference, fun, port or pid.
    Piece(Piece<'x>),
    Bits(&'x [u8], u64),
    Tuple(usize),
    Map(usize),
    Nil,
    List(usize),
    /// An ETF piece holding a tuple, list, map or `[]`.
    Foreign,
}

impl Head<'_> {
    fn class(&self) -> u8 {
        match self {
            Head::Int(_) | Head::Big(..) | Head::Float(_) => class::NUMBER,
            Head::AtomId(_) | Head::Atom(_) => class::ATOM,
            Head::Piece(Piece::Ref { .. }) => class::REFERENCE,
            Head::Piece(Piece::Fun { .. } | Piece::Export { .. }) => class::FUN,
            Head::Piece(Piece::Port { .. }) => class::PORT,
            Head::Piece(_) => class::PID,
            Head::Tuple(_) => class::TUPLE,
            Head::Map(_) => class::MAP,
            Head::Nil => class::NIL,
            Head::List(_) => class::LIST,
            Head::Bits(..) => class::BITSTRING,
            // Never asked: foreign pieces are rewritten first.
            Head::Foreign => u8::MAX,
        }
    }
}

/// Reads the head of the Heft-format term at the start of `bytes`; returns
/// it and the bytes it spans (the whole term for a scalar, the header for a
/// tuple, list or map).
fn head(bytes: &[u8]) -> Result<(Head<'_>, usize), DecodeError> {
    let mut r = Reader::new(bytes);
    let t = r.u8()?;
    let h = match t {
        tag::NIL => Head::Nil,
        tag::INT => Head::Int(unzigzag(r.varint()?)),
        tag::FLOAT => {
            let raw = r.bytes(8)?;
            let mut a = [0u8; 8];
            a.copy_from_slice(raw);
            Head::Float(f64::from_le_bytes(a))
        }
        tag::ATOM => Head::AtomId(u32::try_from(r.varint()?).map_err(|_| DecodeError::BadVarint)?),
        tag::BINARY => {
            let n = r.count(1)?;
            let data = r.bytes(n)?;
            Head::Bits(data, n as u64 * 8)
        }
        tag::TUPLE => Head::Tuple(r.count(1)?),
        tag::LIST => Head::List(r.count(1)?),
        tag::MAP => Head::Map(r.count(2)?),
        tag::ETF => {
            let n = r.count(1)?;
            match etf::piece(r.bytes(n)?)? {
                Piece::Int(i) => Head::Int(i),
                Piece::Big { neg, mag } => Head::Big(neg, mag),
                Piece::Float(f) => Head::Float(f),
                Piece::Atom(t) => Head::Atom(t),
                Piece::Bits(data, bits) => Head::Bits(data, bits),
                Piece::Compound => Head::Foreign,
                p => Head::Piece(p),
            }
        }
        tag::KEY => return Err(DecodeError::UnexpectedKey),
        tag::REF => return Err(DecodeError::BadRef(r.varint()?)),
        t if t >= tag::SMALL_INT => Head::Int(i64::from(t & 0x7f)),
        t if t >= tag::SMALL_ATOM => Head::AtomId(u32::from(t & 0x3f)),
        t if (tag::SMALL_TUPLE..tag::SMALL_TUPLE + 16).contains(&t) => {
            Head::Tuple(usize::from(t & 0x0f))
        }
        t => return Err(DecodeError::BadTag(t)),
    };
    Ok((h, r.position()))
}

/// What comparing the heads of one pair of terms leaves to do.
enum Act {
    Decided(Ordering),
    /// Equal scalars of these lengths.
    Scalars(usize, usize),
    /// Tuples of equal arity; headers of these lengths.
    Tuple(usize, usize, usize),
    /// Lists of `n` and `m` elements before their tails.
    List(usize, usize, usize, usize),
    /// Maps of equal size.
    Map(usize, usize, usize),
    /// Equal funs up to their `n` captured variables (ETF at these byte
    /// ranges of the two buffers), spanning these lengths.
    Env {
        n: usize,
        a_env: (usize, usize),
        b_env: (usize, usize),
        la: usize,
        lb: usize,
    },
    /// One or both sides are ETF compound pieces (at these ranges, after
    /// the version byte); the terms span these lengths.
    Foreign {
        a_etf: Option<(usize, usize)>,
        b_etf: Option<(usize, usize)>,
        la: usize,
        lb: usize,
    },
}

enum Kind {
    /// Compare the next `n` pairs in lockstep.
    Seq,
    /// Compare two lists: `n` and `m` elements left in their current runs.
    List,
    /// Compare these pairs one by one, from the `n`th.
    Spans(Vec<(Cur, Cur)>),
}

struct Frame {
    kind: Kind,
    a: Cur,
    b: Cur,
    n: usize,
    m: usize,
    exact: bool,
    /// Continue the parent from where this frame stops (the parent's next
    /// terms follow this frame's in the same buffers).
    give_back: bool,
}

impl Frame {
    fn seq(a: Cur, b: Cur, n: usize, exact: bool, give_back: bool) -> Frame {
        Frame {
            kind: Kind::Seq,
            a,
            b,
            n,
            m: 0,
            exact,
            give_back,
        }
    }

    fn spans(pairs: Vec<(Cur, Cur)>, exact: bool) -> Frame {
        let start = Cur::at(0);
        Frame {
            kind: Kind::Spans(pairs),
            a: start,
            b: start,
            n: 0,
            m: 0,
            exact,
            give_back: false,
        }
    }
}

enum Step {
    Next,
    Done,
    Decided(Ordering),
    Push(Frame),
    /// Push the first, then the second on top of it.
    Push2(Frame, Frame),
}

struct Cmp<'s, 'n> {
    a: &'s [u8],
    b: &'s [u8],
    owned: Vec<Vec<u8>>,
    names: &'s dyn Fn(u32) -> &'n str,
    depth: u32,
    /// Whether a head of `b` is a wildcard ([`compare_bound`] only).
    wild: Option<&'s dyn Fn(&Head) -> bool>,
}

impl Cmp<'_, '_> {
    fn buf(&self, i: usize) -> &[u8] {
        match i {
            0 => self.a,
            1 => self.b,
            k => self.owned.get(k - 2).map_or(&[], |v| v.as_slice()),
        }
    }

    fn slice(&self, c: Cur) -> &[u8] {
        self.buf(c.buf).get(c.pos..).unwrap_or(&[])
    }

    fn own(&mut self, bytes: Vec<u8>) -> Cur {
        self.owned.push(bytes);
        Cur::at(self.owned.len() + 1)
    }

    /// Whether `h`, a head of `b`, is a wildcard of [`compare_bound`] (never
    /// inside the nested comparisons that sort map keys).
    fn is_wild(&self, h: &Head) -> bool {
        self.depth == 0 && self.wild.is_some_and(|wild| wild(h))
    }

    fn run(&mut self, a: Cur, b: Cur, exact: bool) -> Result<Ordering, DecodeError> {
        let mut stack: Vec<Frame> = Vec::new();
        let mut top = Frame::seq(a, b, 1, exact, false);
        loop {
            let step = match &top.kind {
                Kind::Seq => self.step_seq(&mut top)?,
                Kind::List => self.step_list(&mut top)?,
                Kind::Spans(pairs) => match pairs.get(top.n) {
                    None => Step::Done,
                    Some(&(x, y)) => {
                        top.n += 1;
                        Step::Push(Frame::seq(x, y, 1, top.exact, false))
                    }
                },
            };
            match step {
                Step::Next => {}
                Step::Decided(o) => return Ok(o),
                Step::Push(child) => stack.push(std::mem::replace(&mut top, child)),
                Step::Push2(first, second) => {
                    stack.push(std::mem::replace(&mut top, first));
                    stack.push(std::mem::replace(&mut top, second));
                }
                Step::Done => match stack.pop() {
                    None => return Ok(Equal),
                    Some(mut parent) => {
                        if top.give_back {
                            parent.a = top.a;
                            parent.b = top.b;
                        }
                        top = parent;
                    }
                },
            }
        }
    }

    /// A nested comparison (sorting map keys).
    fn nested(&mut self, a: Cur, b: Cur, exact: bool) -> Result<Ordering, DecodeError> {
        if self.depth >= MAX_MAP_KEY_DEPTH {
            return Err(DecodeError::Builder("maps nested too deep in map keys"));
        }
        self.depth += 1;
        let r = self.run(a, b, exact);
        self.depth -= 1;
        r
    }

    fn step_seq(&mut self, f: &mut Frame) -> Result<Step, DecodeError> {
        if f.n == 0 {
            return Ok(Step::Done);
        }
        f.n -= 1;
        Ok(match self.pair(f.a, f.b, f.exact)? {
            Act::Decided(o) => Step::Decided(o),
            Act::Scalars(la, lb) => {
                f.a = f.a.plus(la);
                f.b = f.b.plus(lb);
                Step::Next
            }
            Act::Tuple(n, la, lb) => {
                f.a = f.a.plus(la);
                f.b = f.b.plus(lb);
                f.n += n;
                Step::Next
            }
            Act::List(n, m, la, lb) => {
                f.a = f.a.plus(la);
                f.b = f.b.plus(lb);
                if n == m {
                    // Elements pairwise, then the tails.
                    f.n += n + 1;
                    Step::Next
                } else {
                    Step::Push(Frame {
                        kind: Kind::List,
                        a: f.a,
                        b: f.b,
                        n,
                        m,
                        exact: f.exact,
                        give_back: true,
                    })
                }
            }
            Act::Map(n, la, lb) => {
                let (pa, end_a) = self.map_pairs(f.a.plus(la), n)?;
                let (pb, end_b) = self.map_pairs(f.b.plus(lb), n)?;
                f.a = end_a;
                f.b = end_b;
                let pa = self.sort_by_key(pa)?;
                let pb = self.sort_by_key(pb)?;
                let keys = pa.iter().zip(&pb).map(|(x, y)| (x.0, y.0)).collect();
                let values = pa.iter().zip(&pb).map(|(x, y)| (x.1, y.1)).collect();
                // Keys first (in map-key order), then values in key order.
                Step::Push2(Frame::spans(values, f.exact), Frame::spans(keys, true))
            }
            Act::Env {
                n,
                a_env,
                b_env,
                la,
                lb,
            } => {
                let ca = self.transcode(f.a.buf, a_env, n)?;
                let cb = self.transcode(f.b.buf, b_env, n)?;
                f.a = f.a.plus(la);
                f.b = f.b.plus(lb);
                Step::Push(Frame::seq(ca, cb, n, f.exact, false))
            }
            Act::Foreign {
                a_etf,
                b_etf,
                la,
                lb,
            } => {
                let ca = match a_etf {
                    Some(range) => self.transcode(f.a.buf, range, 1)?,
                    None => f.a,
                };
                let cb = match b_etf {
                    Some(range) => self.transcode(f.b.buf, range, 1)?,
                    None => f.b,
                };
                f.a = f.a.plus(la);
                f.b = f.b.plus(lb);
                Step::Push(Frame::seq(ca, cb, 1, f.exact, false))
            }
        })
    }

    fn step_list(&mut self, f: &mut Frame) -> Result<Step, DecodeError> {
        if f.n > 0 && f.m > 0 {
            let k = f.n.min(f.m);
            f.n -= k;
            f.m -= k;
            return Ok(Step::Push(Frame::seq(f.a, f.b, k, f.exact, true)));
        }
        if f.n == 0 && f.m == 0 {
            // Both runs ended: compare the tails, then hand back.
            f.kind = Kind::Seq;
            f.n = 1;
            return Ok(Step::Next);
        }
        // One run ended: its tail is either a further run of cells or a
        // term that is not a list, which sorts against the other side's
        // cells by class alone.
        let a_side = f.n == 0;
        let at = if a_side { f.a } else { f.b };
        let (h, len) = head(self.slice(at))?;
        if !a_side && self.is_wild(&h) {
            // The bound's tail is a wildcard: it stands for the key's
            // remaining cells (and their tail), whatever they are.
            return Ok(Step::Decided(Equal));
        }
        match h {
            Head::List(k) => {
                if a_side {
                    f.a = f.a.plus(len);
                    f.n = k;
                } else {
                    f.b = f.b.plus(len);
                    f.m = k;
                }
                Ok(Step::Next)
            }
            Head::Foreign => Err(DecodeError::Builder("a list tail held as ETF")),
            h => {
                let o = h.class().cmp(&class::LIST);
                Ok(Step::Decided(if a_side { o } else { o.reverse() }))
            }
        }
    }

    /// Rewrites `n` ETF terms at `range` of buffer `buf` into a new buffer.
    fn transcode(
        &mut self,
        buf: usize,
        (start, len): (usize, usize),
        n: usize,
    ) -> Result<Cur, DecodeError> {
        let src = self
            .buf(buf)
            .get(start..start + len)
            .ok_or(DecodeError::Truncated)?
            .to_vec();
        let mut w = Writer::new();
        etf::transcode(&src, n, &mut w)?;
        Ok(self.own(w.buf))
    }

    /// The key and value positions of a map's `n` pairs, and where it ends.
    fn map_pairs(&self, mut at: Cur, n: usize) -> Result<(Vec<(Cur, Cur)>, Cur), DecodeError> {
        let mut pairs = Vec::with_capacity(n);
        for _ in 0..n {
            let k = at;
            at = at.plus(codec::skip(self.slice(at))?);
            let v = at;
            at = at.plus(codec::skip(self.slice(at))?);
            pairs.push((k, v));
        }
        Ok((pairs, at))
    }

    /// Sorts pairs by their keys in map-key order (a merge sort that never
    /// panics, whatever the comparisons answer).
    fn sort_by_key(&mut self, mut src: Vec<(Cur, Cur)>) -> Result<Vec<(Cur, Cur)>, DecodeError> {
        let n = src.len();
        let mut dst = Vec::with_capacity(n);
        let mut width = 1;
        while width < n {
            dst.clear();
            let mut i = 0;
            while i < n {
                let mid = (i + width).min(n);
                let end = (i + 2 * width).min(n);
                let (mut l, mut r) = (i, mid);
                while l < mid && r < end {
                    if self.nested(src[r].0, src[l].0, true)? == Less {
                        dst.push(src[r]);
                        r += 1;
                    } else {
                        dst.push(src[l]);
                        l += 1;
                    }
                }
                dst.extend_from_slice(&src[l..mid]);
                dst.extend_from_slice(&src[r..end]);
                i = end;
            }
            std::mem::swap(&mut src, &mut dst);
            width *= 2;
        }
        Ok(src)
    }

    /// Compares the heads of the terms at `a` and `b`.
    fn pair(&self, a: Cur, b: Cur, exact: bool) -> Result<Act, DecodeError> {
        let (sa, sb) = (self.slice(a), self.slice(b));
        let (ha, la) = head(sa)?;
        let (hb, lb) = head(sb)?;
        if self.is_wild(&hb) {
            return Ok(Act::Decided(Equal));
        }
        if matches!(ha, Head::Foreign) || matches!(hb, Head::Foreign) {
            // A foreign term is rewritten from the ETF after the version
            // byte, the last `n - 1` bytes of its `etf` tag; the other side
            // is compared whole, from where it is.
            let side = |h: &Head, s: &[u8], l: usize| -> Result<_, DecodeError> {
                if matches!(h, Head::Foreign) {
                    let n = etf_piece_len(s)?;
                    Ok((Some((l + 1 - n, n - 1)), l))
                } else {
                    Ok((None, codec::skip(s)?))
                }
            };
            let (a_rel, la) = side(&ha, sa, la)?;
            let (b_rel, lb) = side(&hb, sb, lb)?;
            return Ok(Act::Foreign {
                a_etf: a_rel.map(|(s, n)| (a.pos + s, n)),
                b_etf: b_rel.map(|(s, n)| (b.pos + s, n)),
                la,
                lb,
            });
        }
        let (ca, cb) = (ha.class(), hb.class());
        if ca != cb {
            return Ok(Act::Decided(ca.cmp(&cb)));
        }
        let o = match (&ha, &hb) {
            (Head::Tuple(n), Head::Tuple(m)) => {
                return Ok(if n == m {
                    Act::Tuple(*n, la, lb)
                } else {
                    Act::Decided(n.cmp(m))
                })
            }
            (Head::Map(n), Head::Map(m)) => {
                return Ok(if n == m {
                    Act::Map(*n, la, lb)
                } else {
                    Act::Decided(n.cmp(m))
                })
            }
            (Head::List(n), Head::List(m)) => return Ok(Act::List(*n, *m, la, lb)),
            (
                Head::Piece(
                    x @ Piece::Fun {
                        num_free, env: ea, ..
                    },
                ),
                Head::Piece(y @ Piece::Fun { env: eb, .. }),
            ) if *num_free > 0 => {
                let o = cmp_piece(x, y);
                if o == Equal {
                    return Ok(Act::Env {
                        n: *num_free as usize,
                        a_env: (a.pos + offset_in(sa, ea), ea.len()),
                        b_env: (b.pos + offset_in(sb, eb), eb.len()),
                        la,
                        lb,
                    });
                }
                o
            }
            _ => cmp_scalar(&ha, &hb, exact, self.names),
        };
        Ok(if o == Equal {
            Act::Scalars(la, lb)
        } else {
            Act::Decided(o)
        })
    }
}

/// True for a head that is a whole term compared on its own: not a
/// compound (or a foreign piece holding one), not a fun with captured
/// variables.
fn is_scalar(h: &Head) -> bool {
    match h {
        Head::Tuple(_) | Head::Map(_) | Head::List(_) | Head::Foreign => false,
        Head::Piece(Piece::Fun { num_free, .. }) => *num_free == 0,
        _ => true,
    }
}

/// Compares two scalars of the same class (a fun's captured variables
/// are not looked at).
fn cmp_scalar<'n>(ha: &Head, hb: &Head, exact: bool, names: &dyn Fn(u32) -> &'n str) -> Ordering {
    match (ha, hb) {
        (Head::Nil, Head::Nil) => Equal,
        (Head::AtomId(x), Head::AtomId(y)) if x == y => Equal,
        (Head::AtomId(_) | Head::Atom(_), _) => {
            cmp_text(atom_text(ha, names), atom_text(hb, names))
        }
        (Head::Bits(x, xb), Head::Bits(y, yb)) => cmp_bits(x, *xb, y, *yb),
        (Head::Piece(x), Head::Piece(y)) => cmp_piece(x, y),
        _ => cmp_num(num(ha), num(hb), exact),
    }
}

/// An atom's name.
fn atom_text<'x, 'n: 'x>(h: &Head<'x>, names: &dyn Fn(u32) -> &'n str) -> Text<'x> {
    match h {
        Head::AtomId(id) => Text::Utf8(names(*id).as_bytes()),
        Head::Atom(t) => *t,
        _ => Text::Utf8(&[]),
    }
}

/// The length of the ETF piece inside the Heft `etf` tag at the start of
/// `s` (version byte included).
fn etf_piece_len(s: &[u8]) -> Result<usize, DecodeError> {
    let mut r = Reader::new(s);
    r.u8()?;
    r.count(1)
}

/// The offset of `inner` within `outer` (a subslice of it).
fn offset_in(outer: &[u8], inner: &[u8]) -> usize {
    (inner.as_ptr() as usize).saturating_sub(outer.as_ptr() as usize)
}

#[derive(Clone, Copy)]
enum Num<'x> {
    Int(i64),
    Big(bool, &'x [u8]),
    Float(f64),
}

fn num<'x>(h: &Head<'x>) -> Num<'x> {
    match h {
        Head::Int(i) => Num::Int(*i),
        Head::Big(neg, mag) => Num::Big(*neg, mag),
        Head::Float(f) => Num::Float(*f),
        // Only numbers reach here (classes are equal).
        _ => Num::Int(0),
    }
}

/// Numbers by value; with `exact`, every integer before every float.
fn cmp_num(a: Num, b: Num, exact: bool) -> Ordering {
    match (a, b) {
        (Num::Int(x), Num::Int(y)) => x.cmp(&y),
        (Num::Float(x), Num::Float(y)) => x.partial_cmp(&y).unwrap_or_else(|| x.total_cmp(&y)),
        (Num::Float(_), _) if exact => Greater,
        (_, Num::Float(_)) if exact => Less,
        (Num::Float(x), i) => cmp_int_float(i, x).reverse(),
        (i, Num::Float(y)) => cmp_int_float(i, y),
        (x, y) => {
            let (mut xb, mut yb) = ([0u8; 8], [0u8; 8]);
            let (xn, xm) = magnitude(x, &mut xb);
            let (yn, ym) = magnitude(y, &mut yb);
            cmp_big(xn, xm, yn, ym)
        }
    }
}

/// An integer as sign and little-endian magnitude.
fn magnitude<'x>(n: Num<'x>, scratch: &'x mut [u8; 8]) -> (bool, &'x [u8]) {
    match n {
        Num::Int(i) => {
            *scratch = i.unsigned_abs().to_le_bytes();
            (i < 0, &scratch[..])
        }
        Num::Big(neg, mag) => (neg, mag),
        Num::Float(_) => (false, &[]),
    }
}

fn trim(mag: &[u8]) -> &[u8] {
    let len = mag.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    &mag[..len]
}

/// Compares sign-magnitude integers (magnitudes little-endian).
fn cmp_big(an: bool, am: &[u8], bn: bool, bm: &[u8]) -> Ordering {
    let (am, bm) = (trim(am), trim(bm));
    let an = an && !am.is_empty();
    let bn = bn && !bm.is_empty();
    let mag = |x: &[u8], y: &[u8]| {
        x.len()
            .cmp(&y.len())
            .then_with(|| x.iter().rev().cmp(y.iter().rev()))
    };
    match (an, bn) {
        (false, true) => Greater,
        (true, false) => Less,
        (false, false) => mag(am, bm),
        (true, true) => mag(bm, am),
    }
}

const TWO_63: f64 = 9_223_372_036_854_775_808.0;

/// An integer against a float, exactly (as the BEAM does).
fn cmp_int_float(i: Num, f: f64) -> Ordering {
    if f.is_nan() {
        return Less;
    }
    if f.is_infinite() {
        return if f > 0.0 { Less } else { Greater };
    }
    let fl = f.floor();
    let frac = if fl < f { Less } else { Equal };
    if let Num::Int(i) = i {
        if (-TWO_63..TWO_63).contains(&f) {
            return i.cmp(&(fl as i64)).then(frac);
        }
    }
    let mut fbuf = [0u8; 144];
    let (fneg, fmag) = float_magnitude(fl, &mut fbuf);
    let mut ibuf = [0u8; 8];
    let (ineg, imag) = magnitude(i, &mut ibuf);
    cmp_big(ineg, imag, fneg, fmag).then(frac)
}

/// An integral float as sign and little-endian magnitude.
fn float_magnitude(fl: f64, buf: &mut [u8; 144]) -> (bool, &[u8]) {
    let neg = fl < 0.0;
    let bits = fl.abs().to_bits();
    let exp = ((bits >> 52) & 0x7ff) as i64;
    if exp == 0 {
        return (false, &buf[..0]);
    }
    let mant = (bits & ((1u64 << 52) - 1)) | (1u64 << 52);
    let shift = exp - 1075;
    if shift <= 0 {
        let v = mant >> (-shift).min(63);
        buf[..8].copy_from_slice(&v.to_le_bytes());
        return (neg, &buf[..8]);
    }
    let byte = (shift / 8) as usize;
    let v = u128::from(mant) << (shift % 8);
    buf[byte..byte + 16].copy_from_slice(&v.to_le_bytes());
    (neg, &buf[..byte + 16])
}

/// Bitstrings bit by bit; a prefix sorts first.
fn cmp_bits(a: &[u8], abits: u64, b: &[u8], bbits: u64) -> Ordering {
    let min = abits.min(bbits);
    let full = (min / 8) as usize;
    let o = a.get(..full).cmp(&b.get(..full));
    if o != Equal {
        return o;
    }
    let rem = (min % 8) as u32;
    if rem > 0 {
        let mask = 0xffu8 << (8 - rem);
        let x = a.get(full).map(|x| x & mask);
        let y = b.get(full).map(|y| y & mask);
        if x != y {
            return x.cmp(&y);
        }
    }
    abits.cmp(&bbits)
}

/// Atom names in code point order.
fn cmp_text(a: Text, b: Text) -> Ordering {
    match (a, b) {
        (Text::Utf8(x), Text::Utf8(y)) | (Text::Latin1(x), Text::Latin1(y)) => x.cmp(y),
        _ => chars(a).cmp(chars(b)),
    }
}

fn chars(t: Text<'_>) -> impl Iterator<Item = u32> + '_ {
    let (utf8, latin1) = match t {
        Text::Utf8(b) => match std::str::from_utf8(b) {
            Ok(s) => (Some(s), None),
            Err(_) => (None, Some(b)),
        },
        Text::Latin1(b) => (None, Some(b)),
    };
    let u = utf8.into_iter().flat_map(|s| s.chars().map(u32::from));
    let l = latin1
        .into_iter()
        .flat_map(|b| b.iter().map(|&c| u32::from(c)));
    u.chain(l)
}

fn cmp_node(a: &Node, b: &Node) -> Ordering {
    cmp_text(a.name, b.name).then(a.creation.cmp(&b.creation))
}

/// A reference's ID words as a number: significant words, most
/// significant last.
fn ref_words(words: &[u8]) -> impl DoubleEndedIterator<Item = u32> + ExactSizeIterator + '_ {
    let all = words.chunks_exact(4);
    let significant = all
        .clone()
        .rposition(|w| w.iter().any(|&x| x != 0))
        .map_or(0, |i| i + 1);
    all.take(significant)
        .map(|w| u32::from_be_bytes([w[0], w[1], w[2], w[3]]))
}

/// References, funs, ports and pids (of the same class).
fn cmp_piece(a: &Piece, b: &Piece) -> Ordering {
    match (a, b) {
        (
            Piece::Ref {
                node: na,
                words: wa,
            },
            Piece::Ref {
                node: nb,
                words: wb,
            },
        ) => {
            let (xa, xb) = (ref_words(wa), ref_words(wb));
            cmp_node(na, nb)
                .then(xa.len().cmp(&xb.len()))
                .then_with(|| xa.rev().cmp(xb.rev()))
        }
        (
            Piece::Fun {
                module: ma,
                old_index: ia,
                old_uniq: ua,
                num_free: fa,
                ..
            },
            Piece::Fun {
                module: mb,
                old_index: ib,
                old_uniq: ub,
                num_free: fb,
                ..
            },
        ) => cmp_text(*ma, *mb)
            .then(ia.cmp(ib))
            .then(ua.cmp(ub))
            .then(fa.cmp(fb)),
        (Piece::Fun { .. }, Piece::Export { .. }) => Less,
        (Piece::Export { .. }, Piece::Fun { .. }) => Greater,
        (
            Piece::Export {
                module: ma,
                function: fa,
                arity: aa,
            },
            Piece::Export {
                module: mb,
                function: fb,
                arity: ab,
            },
        ) => cmp_text(*ma, *mb)
            .then_with(|| cmp_text(*fa, *fb))
            .then(aa.cmp(ab)),
        (Piece::Port { node: na, id: ia }, Piece::Port { node: nb, id: ib }) => {
            cmp_node(na, nb).then(ia.cmp(ib))
        }
        (
            Piece::Pid {
                node: na,
                id: ia,
                serial: sa,
            },
            Piece::Pid {
                node: nb,
                id: ib,
                serial: sb,
            },
        ) => sa.cmp(sb).then(ia.cmp(ib)).then_with(|| cmp_node(na, nb)),
        // Pieces of different kinds never share a class.
        _ => Equal,
    }
}

#[cfg(test)]
mod tests;
