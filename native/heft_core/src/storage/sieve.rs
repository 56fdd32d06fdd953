//! A sieve: what a match specification's heads and guards say about the
//! records it can match, tested on a record's stored bytes, so that a scan
//! decodes (and, where the key decides, decompresses) only the records
//! that may match. It is a filter before the VM's own matcher, which still
//! runs the whole specification on the records the sieve keeps: a sieve
//! may keep records the specification does not match, never drop one it
//! matches. Every test that cannot be decided on the bytes (a back
//! reference, an external-format piece, a compound compared with `=:=`)
//! passes.
//!
//! A sieve holds clauses, one a specification clause, each a list of
//! [`Test`]s on terms found by a [`Path`] from the object: element indices
//! (0-based) into nested tuples. lib/heft/match_spec.ex (`sieve/2`) builds
//! them; terms are in the format of docs/term-format.md, constants in the
//! canonical form of keys. A record passes if every test of some clause
//! passes. Tests on the key (paths that start at the key's element) are run
//! first, on the key alone: a record no clause's key tests pass is dropped
//! without its body.
//!
//! [`Sieve::judge`] also says when a record certainly passes: every test of
//! some clause decided on plain scalars (not a float zero, whose sign `=:=`
//! and OTP releases treat differently). Where lib/heft/match_spec.ex builds
//! a sieve that states its specification whole (`exact?/1`), such a
//! record matches without the VM's matcher, and `select_count/2` counts it
//! without decoding it.

use std::cell::Cell;
use std::cmp::Ordering;

use crate::codec::{self, tag, Reader};
use crate::order;

/// Element indices into nested tuples, from the object.
pub type Path = Vec<u32>;

/// A comparison of a guard, in Erlang term order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `<`
    Lt,
    /// `=<`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
    /// `==`
    Eq,
    /// `/=`
    Ne,
    /// `=:=`
    ExactEq,
    /// `=/=`
    ExactNe,
}

/// A type test of a guard (`is_integer/1`...).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Type {
    Integer,
    Float,
    Number,
    Atom,
    Binary,
    Tuple,
    List,
    Map,
}

/// One condition a record must meet for a clause to match it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Test {
    /// The term at `path` is a tuple of `arity` elements.
    Arity { path: Path, arity: u32 },
    /// The term at `path` compares to the constant `value` (a scalar's
    /// canonical encoding) as `op` says.
    Cmp { path: Path, op: Op, value: Vec<u8> },
    /// The terms at two paths are the same (`=:=`): a variable repeated in
    /// a head.
    Same { a: Path, b: Path },
    /// The term at `path` is of `ty`.
    Is { path: Path, ty: Type },
}

/// The tests of one clause.
pub type Clause = Vec<Test>;

/// A whole sieve: the clauses, each split into the tests on the key alone
/// and the others.
#[derive(Clone, Debug)]
pub struct Sieve {
    clauses: Vec<Split>,
    /// Whether the sieve is one clause whose tests all have quick forms
    /// (most selects' sieves), judged by [`Sieve::judge_quick`] with none
    /// of the general path's bookkeeping.
    quick_only: bool,
}

#[derive(Clone, Debug)]
struct Split {
    on_key: Vec<Test>,
    on_body: Vec<Test>,
    /// The same tests as [`Quick`]s, where every one of them has that
    /// form (and there are some).
    key_quick: Option<Vec<Quick>>,
    body_quick: Option<Vec<Quick>>,
}

/// A test in the form a scan judges fastest: on a root term (the object,
/// or the key) or one element of it, decided from that element's bytes
/// without [`locate`]'s general walk. Where the bytes do not decide it
/// (the element is not an integer of 64 bits, or not the constant's very
/// bytes), the clause's general tests run instead.
#[derive(Clone, Debug)]
enum Quick {
    /// The root is a tuple of this arity.
    Arity(u32),
    /// The root (`None`) or its element `at` is an integer of 64 bits that
    /// compares to `value` as `op` says.
    Int { at: Option<u32>, op: Op, value: i64 },
    /// The root or its element `at` has the very bytes of `value`, a plain
    /// scalar (not a float zero): `=:=` it. Other bytes leave it to the
    /// general test.
    Exact { at: Option<u32>, value: Vec<u8> },
}

impl Quick {
    /// The quick form of `test`, whose path leads from the root after
    /// `skip` steps (1 for a test on the key, whose path starts at the
    /// key's element).
    fn of(test: &Test, skip: usize) -> Option<Quick> {
        let at = |path: &[u32]| match path.get(skip..)? {
            [] => Some(None),
            [i] => Some(Some(*i)),
            _ => None,
        };
        match test {
            Test::Arity { path, arity } if at(path)?.is_none() => Some(Quick::Arity(*arity)),
            Test::Cmp { path, op, value } => {
                let at = at(path)?;
                match small_int(value) {
                    Some((v, len)) if len == value.len() => Some(Quick::Int {
                        at,
                        op: *op,
                        value: v,
                    }),
                    _ if *op == Op::ExactEq && certain(value) => Some(Quick::Exact {
                        at,
                        value: value.clone(),
                    }),
                    _ => None,
                }
            }
            _ => None,
        }
    }

    /// The quick forms of all of `tests`, if each has one.
    fn all(tests: &[Test], skip: usize) -> Option<Vec<Quick>> {
        if tests.is_empty() {
            return None;
        }
        tests.iter().map(|t| Quick::of(t, skip)).collect()
    }
}

/// What the quick tests `quick` say of the term `root` starts, and how far
/// into it they read (all of it where a path led nowhere, as
/// [`Sieve::judge_reach`] counts); `None` where one of them cannot be
/// decided so.
#[inline]
fn quick_verdict(quick: &[Quick], root: &[u8]) -> Option<(Verdict, usize)> {
    let top = tuple_header(root);
    let mut reach = 0;
    for q in quick {
        let pass = match q {
            Quick::Arity(n) => {
                let (arity, header) = top?;
                reach = reach.max(header);
                arity == u64::from(*n)
            }
            Quick::Int { at, op, value } => match element(root, top, *at)? {
                Some((t, off)) => {
                    let (v, len) = small_int(t)?;
                    reach = reach.max(off + len);
                    holds(*op, v.cmp(value))
                }
                None => return Some((Verdict::Fail, root.len())),
            },
            Quick::Exact { at, value } => match element(root, top, *at)? {
                Some((t, off)) => {
                    let t = one_term(t).filter(|t| order::same_bytes(t, value))?;
                    reach = reach.max(off + t.len());
                    true
                }
                None => return Some((Verdict::Fail, root.len())),
            },
        };
        if !pass {
            return Some((Verdict::Fail, reach));
        }
    }
    Some((Verdict::Pass, reach))
}

/// The root term (`at` `None`) or its element `at`, and where that
/// starts in `root`; `Some(None)` if the root is a smaller tuple. `top` is
/// the root's tuple header ([`tuple_header`]).
#[inline]
fn element(
    root: &[u8],
    top: Option<(u64, usize)>,
    at: Option<u32>,
) -> Option<Option<(&[u8], usize)>> {
    let Some(i) = at else {
        return Some(Some((root, 0)));
    };
    let (arity, header) = top?;
    if u64::from(i) >= arity {
        return Some(None);
    }
    let mut off = header;
    for _ in 0..i {
        off += codec::skip(root.get(off..)?).ok()?;
    }
    Some(Some((root.get(off..)?, off)))
}

/// What a sieve says of a record.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Judgement {
    /// No clause can match it.
    Drops,
    /// Some clause may match it: the VM decides.
    Maybe,
    /// Every test of some clause passes, each decided for certain.
    Matches,
}

/// What a test (or a clause's tests together) says.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Verdict {
    Pass,
    /// It cannot be told from the bytes for certain.
    Maybe,
    Fail,
}

impl Verdict {
    /// Both: `Fail` if either fails, else `Maybe` if either is unsure.
    fn and(self, then: impl FnOnce() -> Verdict) -> Verdict {
        match self {
            Verdict::Fail => Verdict::Fail,
            v => match then() {
                Verdict::Pass => v,
                w => w,
            },
        }
    }

    fn all<'t>(tests: &'t [Test], check: impl Fn(&'t Test) -> Verdict) -> Verdict {
        let mut v = Verdict::Pass;
        for t in tests {
            v = v.and(|| check(t));
            if v == Verdict::Fail {
                break;
            }
        }
        v
    }
}

/// The clauses a sieve can hold whose verdicts fit on the stack.
const STACK_CLAUSES: usize = 32;

impl Sieve {
    /// A sieve of `clauses` for objects whose key is element `keypos`
    /// (1-based).
    pub fn new(clauses: Vec<Clause>, keypos: usize) -> Sieve {
        let key_index = keypos.saturating_sub(1) as u32;
        let on_key = |t: &Test| match t {
            Test::Arity { path, .. } | Test::Cmp { path, .. } | Test::Is { path, .. } => {
                path.first() == Some(&key_index)
            }
            Test::Same { a, b } => a.first() == Some(&key_index) && b.first() == Some(&key_index),
        };
        let clauses = clauses
            .into_iter()
            .map(|c| {
                let (on_key, on_body): (Vec<Test>, Vec<Test>) = c.into_iter().partition(on_key);
                Split {
                    key_quick: Quick::all(&on_key, 1),
                    body_quick: Quick::all(&on_body, 0),
                    on_key,
                    on_body,
                }
            })
            .collect::<Vec<Split>>();
        let quick_only = match clauses.as_slice() {
            [c] => {
                (c.on_key.is_empty() || c.key_quick.is_some())
                    && (c.on_body.is_empty() || c.body_quick.is_some())
            }
            _ => false,
        };
        Sieve {
            clauses,
            quick_only,
        }
    }

    /// The same sieve judged by the general tests alone (to check the
    /// quick ones against).
    #[cfg(test)]
    pub(crate) fn general(&self) -> Sieve {
        let mut s = self.clone();
        s.quick_only = false;
        for c in &mut s.clauses {
            c.key_quick = None;
            c.body_quick = None;
        }
        s
    }

    /// Whether [`Sieve::judge_quick`] may need the body.
    #[inline]
    pub fn quick_needs_body(&self) -> bool {
        self.quick_only && self.clauses.first().is_some_and(|c| c.body_quick.is_some())
    }

    /// [`Sieve::judge_reach`] of a sieve of one clause of quick tests,
    /// given the key and the body (`None` if it cannot be had as it is:
    /// stored compressed); `None` for any other sieve, or where the bytes
    /// do not decide (the general path then judges).
    #[inline]
    pub fn judge_quick(&self, key: &[u8], body: Option<&[u8]>) -> Option<(Judgement, usize)> {
        if !self.quick_only {
            return None;
        }
        let c = self.clauses.first()?;
        // The key first, as the general path: a record it fails is
        // dropped without a look at the body.
        if let Some(q) = c.key_quick.as_deref() {
            if quick_verdict(q, key)?.0 == Verdict::Fail {
                return Some((Judgement::Drops, 0));
            }
        }
        let Some(q) = c.body_quick.as_deref() else {
            return Some((Judgement::Matches, 0));
        };
        let (v, reach) = quick_verdict(q, body?)?;
        let judged = match v {
            Verdict::Pass => Judgement::Matches,
            Verdict::Maybe => Judgement::Maybe,
            Verdict::Fail => Judgement::Drops,
        };
        Some((judged, reach))
    }

    /// What the sieve says of the record with this `key` (its stored,
    /// canonical encoding): a record it drops cannot match. `body` gives its
    /// uncompressed body, asked for only when the key's tests leave a
    /// clause that needs it (`None` if it cannot be had: the record is
    /// `Maybe`). `atom_name` names the table's atom ids.
    pub fn judge<'b, 'n>(
        &self,
        key: &'b [u8],
        body: impl FnOnce() -> Option<&'b [u8]>,
        atom_name: impl Fn(u32) -> &'n str + Copy,
    ) -> Judgement {
        self.judge_reach(key, body, atom_name).0
    }

    /// [`Sieve::judge`], and how many bytes of the body it read: up to the
    /// end of the furthest term its tests looked at (0 if it read none).
    /// Reading a stored body's first elements costs little however long
    /// the body is; a walk that charges a chunk's budget by this, not by
    /// the body's length, judges many more records a call.
    pub fn judge_reach<'b, 'n>(
        &self,
        key: &'b [u8],
        body: impl FnOnce() -> Option<&'b [u8]>,
        atom_name: impl Fn(u32) -> &'n str + Copy,
    ) -> (Judgement, usize) {
        let reach = Cell::new(0usize);
        let judged = self.judge_with(key, body, atom_name, &reach);
        (judged, reach.get())
    }

    fn judge_with<'b, 'n>(
        &self,
        key: &'b [u8],
        body: impl FnOnce() -> Option<&'b [u8]>,
        atom_name: impl Fn(u32) -> &'n str + Copy,
        reach: &Cell<usize>,
    ) -> Judgement {
        let mut stack = [Verdict::Fail; STACK_CLAUSES];
        let mut heap = Vec::new();
        let verdicts: &mut [Verdict] = if self.clauses.len() <= STACK_CLAUSES {
            &mut stack[..self.clauses.len()]
        } else {
            heap.resize(self.clauses.len(), Verdict::Fail);
            &mut heap
        };
        let key_root = |path: &[u32]| -> Located<'b> {
            match path.split_first() {
                Some((_, rest)) => locate(key, key, rest),
                None => Located::Unknown,
            }
        };
        // First the key, for every clause.
        let mut needs_body = false;
        for (c, v) in self.clauses.iter().zip(verdicts.iter_mut()) {
            *v = match c.key_quick.as_deref().and_then(|q| quick_verdict(q, key)) {
                Some((v, _)) => v,
                None => Verdict::all(&c.on_key, |t| check(t, &key_root, atom_name, &|_| {})),
            };
            if *v == Verdict::Pass && c.on_body.is_empty() {
                return Judgement::Matches;
            }
            needs_body |= *v != Verdict::Fail && !c.on_body.is_empty();
        }
        if !needs_body {
            return if verdicts.contains(&Verdict::Maybe) {
                Judgement::Maybe
            } else {
                Judgement::Drops
            };
        }
        let Some(body) = body() else {
            return Judgement::Maybe;
        };
        // What the tests read of the body: up to the end of the furthest
        // piece (a term of the key, which a `KEY` tag stands for, is not
        // the body's). A path that cannot be followed, or leads nowhere,
        // may have walked far first: the whole body counts.
        let read = |piece: &[u8]| {
            let start = (piece.as_ptr() as usize).wrapping_sub(body.as_ptr() as usize);
            if start < body.len() {
                reach.set(reach.get().max(start + piece.len()));
            }
        };
        let root = |path: &[u32]| {
            let found = locate(body, key, path);
            if let Located::Unknown | Located::Absent = found {
                reach.set(body.len());
            }
            found
        };
        let mut any_maybe = false;
        for (c, v) in self.clauses.iter().zip(verdicts.iter()) {
            let on_body = || match c.body_quick.as_deref().and_then(|q| quick_verdict(q, body)) {
                Some((v, r)) => {
                    reach.set(reach.get().max(r));
                    v
                }
                None => Verdict::all(&c.on_body, |t| check(t, &root, atom_name, &read)),
            };
            match v.and(on_body) {
                Verdict::Pass => return Judgement::Matches,
                Verdict::Maybe => any_maybe = true,
                Verdict::Fail => {}
            }
        }
        if any_maybe {
            Judgement::Maybe
        } else {
            Judgement::Drops
        }
    }
}

/// A term found by a path.
#[derive(Clone, Copy, Debug)]
enum Located<'b> {
    /// The term's encoding starts these bytes (it may be followed by
    /// others).
    Term(&'b [u8]),
    /// The path leads nowhere: a tuple is not there, or is smaller. No
    /// record with such an object matches the head.
    Absent,
    /// It cannot be told from the bytes (a back reference on the way).
    Unknown,
}

/// The term at `path` in the term `bytes` starts; `key` stands for a `KEY`
/// tag.
#[inline]
fn locate<'b>(mut bytes: &'b [u8], key: &'b [u8], path: &[u32]) -> Located<'b> {
    for &i in path {
        if bytes.first() == Some(&tag::KEY) {
            bytes = key;
        }
        let Some((arity, header)) = tuple_header(bytes) else {
            return match bytes.first() {
                Some(&tag::REF) | None => Located::Unknown,
                _ => Located::Absent,
            };
        };
        if u64::from(i) >= arity {
            return Located::Absent;
        }
        let mut at = header;
        for _ in 0..i {
            match bytes.get(at..).map(codec::skip) {
                Some(Ok(n)) => at += n,
                _ => return Located::Unknown,
            }
        }
        bytes = &bytes[at..];
    }
    if bytes.first() == Some(&tag::KEY) {
        bytes = key;
    }
    match bytes.first() {
        None | Some(&tag::REF) => Located::Unknown,
        Some(_) => Located::Term(bytes),
    }
}

/// A tuple's arity and the length of its header, if `bytes` starts one.
#[inline]
fn tuple_header(bytes: &[u8]) -> Option<(u64, usize)> {
    let t = *bytes.first()?;
    if (tag::SMALL_TUPLE..tag::SMALL_TUPLE + 16).contains(&t)
        || (tag::UNSHARED_SMALL_TUPLE..tag::UNSHARED_SMALL_TUPLE + 16).contains(&t)
    {
        return Some((u64::from(t & 0x0f), 1));
    }
    if t == tag::TUPLE || t == tag::UNSHARED_TUPLE {
        let mut r = Reader::new(bytes);
        r.u8().ok()?;
        let n = r.varint().ok()?;
        return Some((n, r.position()));
    }
    None
}

/// The encoding of the term `bytes` starts, alone.
fn one_term(bytes: &[u8]) -> Option<&[u8]> {
    codec::skip(bytes).ok().map(|n| &bytes[..n])
}

/// Whether a term is a scalar that compares by its bytes: not a compound,
/// a back reference or an external-format piece.
fn plain_scalar(bytes: &[u8]) -> bool {
    match bytes.first() {
        Some(&t) => {
            t == tag::NIL
                || t == tag::INT
                || t == tag::FLOAT
                || t == tag::ATOM
                || t == tag::BINARY
                || t >= tag::SMALL_ATOM
        }
        None => false,
    }
}

/// Whether a plain scalar is a float zero (`0.0` or `-0.0`): whether two
/// such are `=:=` depends on the OTP release, and on OTP 26 and earlier a
/// key's `-0.0` is stored as `0.0`; the VM decides.
fn float_zero(bytes: &[u8]) -> bool {
    match bytes.get(..9) {
        Some([t, f @ ..]) if *t == tag::FLOAT => {
            let bits = u64::from_le_bytes(f.try_into().expect("8 bytes"));
            bits << 1 == 0
        }
        _ => false,
    }
}

/// The integer `bytes` starts with, if it is one of 64 bits, and the
/// length of its encoding.
#[inline]
fn small_int(bytes: &[u8]) -> Option<(i64, usize)> {
    match *bytes.first()? {
        t if t >= tag::SMALL_INT => Some((i64::from(t - tag::SMALL_INT), 1)),
        tag::INT => {
            let mut r = Reader::new(bytes);
            r.u8().ok()?;
            let v = r.varint().ok()?;
            Some((codec::unzigzag(v), r.position()))
        }
        _ => None,
    }
}

/// Whether two terms ordered as `o` pass `op`; `=:=` and `=/=` as `==`
/// and `/=` (right for terms of one type that compare by value).
fn holds(op: Op, o: Ordering) -> bool {
    match op {
        Op::Lt => o == Ordering::Less,
        Op::Le => o != Ordering::Greater,
        Op::Gt => o == Ordering::Greater,
        Op::Ge => o != Ordering::Less,
        Op::Eq | Op::ExactEq => o == Ordering::Equal,
        Op::Ne | Op::ExactNe => o != Ordering::Equal,
    }
}

/// A scalar whose comparisons are decided for certain.
fn certain(bytes: &[u8]) -> bool {
    plain_scalar(bytes) && !float_zero(bytes)
}

/// What `test` says of a record whose terms `at` finds; `read` is told
/// each piece of them it reads past the path.
#[inline]
fn check<'b, 'n>(
    test: &Test,
    at: &impl Fn(&[u32]) -> Located<'b>,
    atom_name: impl Fn(u32) -> &'n str + Copy,
    read: &impl Fn(&'b [u8]),
) -> Verdict {
    let pass_if = |b: bool| if b { Verdict::Pass } else { Verdict::Fail };
    match test {
        Test::Arity { path, arity } => match at(path) {
            Located::Term(t) => match tuple_header(t) {
                Some((n, header)) => {
                    read(&t[..header]);
                    pass_if(n == u64::from(*arity))
                }
                None if t.first() == Some(&tag::ETF) => Verdict::Maybe,
                None => Verdict::Fail,
            },
            Located::Absent => Verdict::Fail,
            Located::Unknown => Verdict::Maybe,
        },
        Test::Cmp { path, op, value } => {
            let t = match at(path) {
                Located::Term(t) => t,
                Located::Absent => return Verdict::Fail,
                Located::Unknown => return Verdict::Maybe,
            };
            // Two integers of 64 bits, the common case: compared as such.
            if let (Some((a, len)), Some((b, _))) = (small_int(t), small_int(value)) {
                read(&t[..len]);
                return pass_if(holds(*op, a.cmp(&b)));
            }
            let Some(term) = one_term(t) else {
                read(t);
                return Verdict::Maybe;
            };
            read(term);
            // Decided on scalars that compare by their bytes; elsewhere
            // a failing comparison still drops the record, a passing one
            // leaves it to the VM.
            let sure = |v: Verdict| match v {
                Verdict::Pass if !(certain(term) && certain(value)) => Verdict::Maybe,
                v => v,
            };
            match op {
                Op::ExactEq => {
                    // `=:=`: equal in map-key order (1 and 1.0 differ); a
                    // zero of either sign passes, and the VM decides. A
                    // scalar of the constant's very bytes (a head's literal
                    // most records share) needs no comparison.
                    let equal = (plain_scalar(term) && order::same_bytes(term, value))
                        || order::compare_exact(term, value, atom_name) == Ordering::Equal;
                    sure(pass_if(equal))
                }
                Op::ExactNe => {
                    if plain_scalar(term) && order::same_bytes(term, value) {
                        Verdict::Fail
                    } else {
                        sure(Verdict::Pass)
                    }
                }
                _ => sure(pass_if(holds(*op, order::compare(term, value, atom_name)))),
            }
        }
        Test::Same { a, b } => match (at(a), at(b)) {
            (Located::Absent, _) | (_, Located::Absent) => Verdict::Fail,
            (Located::Term(x), Located::Term(y)) => {
                let (x1, y1) = (one_term(x), one_term(y));
                read(x1.unwrap_or(x));
                read(y1.unwrap_or(y));
                match (x1, y1) {
                    (Some(x), Some(y)) if plain_scalar(x) && plain_scalar(y) => {
                        match order::compare_exact(x, y, atom_name) {
                            Ordering::Equal if certain(x) && certain(y) => Verdict::Pass,
                            Ordering::Equal => Verdict::Maybe,
                            _ => Verdict::Fail,
                        }
                    }
                    _ => Verdict::Maybe,
                }
            }
            _ => Verdict::Maybe,
        },
        Test::Is { path, ty } => {
            let t = match at(path) {
                Located::Term(t) => t,
                Located::Absent => return Verdict::Fail,
                Located::Unknown => return Verdict::Maybe,
            };
            let Some(&first) = t.first() else {
                return Verdict::Maybe;
            };
            read(&t[..1]);
            if first == tag::ETF {
                // A big integer, a pid, a bitstring...: the VM decides.
                return Verdict::Maybe;
            }
            let integer = first == tag::INT || first >= tag::SMALL_INT;
            let float = first == tag::FLOAT;
            pass_if(match ty {
                Type::Integer => integer,
                Type::Float => float,
                Type::Number => integer || float,
                Type::Atom => {
                    first == tag::ATOM || (tag::SMALL_ATOM..tag::SMALL_INT).contains(&first)
                }
                Type::Binary => first == tag::BINARY,
                Type::Tuple => tuple_header(t).is_some(),
                Type::List => first == tag::LIST || first == tag::NIL,
                Type::Map => first == tag::MAP,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Sieve {
        /// Whether the sieve keeps the record: it may match.
        fn keeps<'b>(
            &self,
            key: &'b [u8],
            body: impl FnOnce() -> Option<&'b [u8]>,
            atom_name: impl Fn(u32) -> &'static str + Copy,
        ) -> bool {
            self.judge(key, body, atom_name) != Judgement::Drops
        }
    }
    use crate::codec::Value;

    fn names(_: u32) -> &'static str {
        "a"
    }

    fn enc(v: &Value) -> Vec<u8> {
        v.to_bytes()
    }

    /// `{{rec, K}, K, <<...>>}`: key `{rec, K}` at 1, stored once.
    fn record(k: i64) -> (Vec<u8>, Vec<u8>) {
        let key = Value::Tuple(vec![Value::Atom(0), Value::Int(k)]);
        let mut w = codec::Writer::new();
        w.tuple(3);
        w.key();
        w.int(k);
        w.binary(&[7; 30]);
        (enc(&key), w.buf)
    }

    fn cmp(path: &[u32], op: Op, v: i64) -> Test {
        Test::Cmp {
            path: path.to_vec(),
            op,
            value: enc(&Value::Int(v)),
        }
    }

    /// `{Key, <back reference>, 1}`: element 1 cannot be told.
    fn shared_body() -> Vec<u8> {
        let mut w = codec::Writer::new();
        w.tuple(3);
        w.key();
        w.backref(0);
        w.int(1);
        w.buf
    }

    fn arity3() -> Test {
        Test::Arity {
            path: vec![],
            arity: 3,
        }
    }

    /// A random scalar or small tuple, of the kinds tests compare with.
    fn random_value(r: &mut crate::testutil::Rng, depth: u32) -> Value {
        let ints = [
            0, 1, 9, 10, 11, 63, 64, 127, 128, -1, -64, 100_000, -100_000,
        ];
        match r.below(if depth == 0 { 6 } else { 5 }) {
            0 => Value::Int(r.pick(&ints)),
            1 => Value::Int(r.next() as i64 >> r.below(64)),
            2 => Value::Float(r.pick(&[0.0, -0.0, 1.0, 9.5, 10.0, -3.0])),
            3 => Value::Atom(r.below(3) as u32 * 70),
            4 => Value::Binary(vec![r.below(3) as u8; r.below(3) as usize]),
            _ => Value::Tuple(
                (0..r.below(4))
                    .map(|_| random_value(r, depth + 1))
                    .collect(),
            ),
        }
    }

    /// A random test on a path of zero to two steps from the object.
    fn random_test(r: &mut crate::testutil::Rng) -> Test {
        let path: Vec<u32> = (0..r.below(3)).map(|_| r.below(4) as u32).collect();
        let ops = [
            Op::Lt,
            Op::Le,
            Op::Gt,
            Op::Ge,
            Op::Eq,
            Op::Ne,
            Op::ExactEq,
            Op::ExactNe,
        ];
        match r.below(4) {
            0 => Test::Arity {
                path,
                arity: r.below(5) as u32,
            },
            1 => Test::Is {
                path,
                ty: r.pick(&[Type::Integer, Type::Atom, Type::Tuple]),
            },
            _ => Test::Cmp {
                path,
                op: r.pick(&ops),
                value: enc(&random_value(r, 1)),
            },
        }
    }

    #[test]
    fn quick_tests_judge_as_the_general_ones_do() {
        let mut r = crate::testutil::Rng(0x5eed_1234_abcd);
        let (mut quick_judged, mut alone_judged, mut alone_matched) = (0, 0, 0);
        for _ in 0..20_000 {
            // An object {Key, A, B...} of 1-4 elements, its key stored as
            // the KEY tag (or, at times, a back reference for element 1).
            let key = random_value(&mut r, 0);
            let n = 1 + r.below(4) as usize;
            let mut w = codec::Writer::new();
            w.tuple(n);
            w.key();
            for i in 1..n {
                if i == 1 && r.below(8) == 0 {
                    w.backref(0);
                } else {
                    random_value(&mut r, 1).encode(&mut w);
                }
            }
            let (key, body) = (enc(&key), w.buf);
            let clauses: Vec<Clause> = (0..1 + r.below(2))
                .map(|_| (0..1 + r.below(3)).map(|_| random_test(&mut r)).collect())
                .collect();
            let quick = Sieve::new(clauses.clone(), 1);
            quick_judged += quick
                .clauses
                .iter()
                .filter(|c| c.key_quick.is_some() || c.body_quick.is_some())
                .count();
            let general = quick.general();
            let judged = general.judge_reach(&key, || Some(&body), names);
            assert_eq!(
                quick.judge_reach(&key, || Some(&body), names),
                judged,
                "{clauses:?} on key {key:?}, body {body:?}"
            );
            if let Some(alone) = quick.judge_quick(&key, Some(&body)) {
                alone_judged += 1;
                alone_matched += usize::from(alone.0 == Judgement::Matches);
                assert_eq!(alone, judged, "{clauses:?} alone on {key:?}, {body:?}");
            }
        }
        assert!(
            quick_judged > 5_000,
            "{quick_judged} clauses had quick forms"
        );
        assert!(
            alone_judged > 300 && alone_matched > 30 && alone_matched < alone_judged - 30,
            "{alone_judged} judged alone, {alone_matched} matching"
        );
    }

    #[test]
    fn judge_reach_counts_the_body_bytes_the_tests_read() {
        // {Key, K, <<30 bytes>>}: 1 byte of tuple header, the key's tag,
        // K (one byte below 64), then the binary.
        let (key, body) = record(5);
        let reach = |tests: Vec<Test>| {
            let s = Sieve::new(vec![tests], 1);
            s.judge_reach(&key, || Some(&body), names).1
        };
        // The arity reads the tuple's header; element 1 ends at byte 3.
        assert_eq!(reach(vec![arity3()]), 1);
        assert_eq!(reach(vec![arity3(), cmp(&[1], Op::Lt, 10)]), 3);
        // A type test reads the term's tag; `=:=` of two terms reads both
        // whole.
        let is_binary = Test::Is {
            path: vec![2],
            ty: Type::Binary,
        };
        assert_eq!(reach(vec![is_binary]), 4);
        let same = Test::Same {
            a: vec![1],
            b: vec![2],
        };
        assert_eq!(reach(vec![same]), body.len());
        // Tests on the key alone read no body.
        assert_eq!(reach(vec![cmp(&[0, 1], Op::Lt, 10)]), 0);
        // A path through a back reference may have walked anywhere: the
        // whole body counts.
        let shared = shared_body();
        let s = Sieve::new(vec![vec![cmp(&[1], Op::Lt, 10)]], 1);
        assert_eq!(s.judge_reach(&key, || Some(&shared), names).1, shared.len());
        // So may one that leads nowhere (element 0 of the binary, past it).
        assert_eq!(reach(vec![cmp(&[2, 0], Op::Lt, 10)]), body.len());
    }

    #[test]
    fn a_guard_on_the_key_drops_records_without_their_body() {
        let s = Sieve::new(vec![vec![arity3(), cmp(&[0, 1], Op::Lt, 10)]], 1);
        for k in [0, 9, 10, 500] {
            let (key, body) = record(k);
            let mut asked = false;
            let kept = s.keeps(
                &key,
                || {
                    asked = true;
                    Some(&body)
                },
                names,
            );
            assert_eq!(kept, k < 10, "{k}");
            assert_eq!(asked, k < 10, "the body is read only for a key that passes");
        }
    }

    #[test]
    fn a_guard_on_the_body_reads_the_body() {
        for (op, want) in [
            (Op::Lt, [true, false, false]),
            (Op::Le, [true, true, false]),
            (Op::Gt, [false, false, true]),
            (Op::Ge, [false, true, true]),
            (Op::Eq, [false, true, false]),
            (Op::Ne, [true, false, true]),
            (Op::ExactEq, [false, true, false]),
            (Op::ExactNe, [true, false, true]),
        ] {
            let s = Sieve::new(vec![vec![arity3(), cmp(&[1], op, 10)]], 1);
            for (k, w) in [9, 10, 11].into_iter().zip(want) {
                let (key, body) = record(k);
                assert_eq!(s.keeps(&key, || Some(&body), names), w, "{op:?} {k}");
            }
        }
    }

    #[test]
    fn the_first_clause_that_passes_keeps_a_record() {
        let s = Sieve::new(
            vec![
                vec![arity3(), cmp(&[1], Op::Lt, 5)],
                vec![arity3(), cmp(&[1], Op::Gt, 50)],
            ],
            1,
        );
        let kept: Vec<i64> = (0..100)
            .filter(|&k| {
                let (key, body) = record(k);
                s.keeps(&key, || Some(&body), names)
            })
            .collect();
        assert_eq!(kept, (0..5).chain(51..100).collect::<Vec<_>>());
    }

    #[test]
    fn wrong_shapes_fail_and_what_cannot_be_told_passes() {
        let (key, body) = record(3);
        let keeps =
            |tests: Vec<Test>| Sieve::new(vec![tests], 1).keeps(&key, || Some(&body), names);
        // Another arity, a path past the tuple, into a non-tuple.
        assert!(!keeps(vec![Test::Arity {
            path: vec![],
            arity: 4
        }]));
        assert!(!keeps(vec![cmp(&[7], Op::Eq, 3)]));
        assert!(!keeps(vec![cmp(&[1, 0], Op::Eq, 3)]));
        // Types.
        assert!(keeps(vec![Test::Is {
            path: vec![1],
            ty: Type::Integer
        }]));
        assert!(keeps(vec![Test::Is {
            path: vec![2],
            ty: Type::Binary
        }]));
        assert!(!keeps(vec![Test::Is {
            path: vec![2],
            ty: Type::Atom
        }]));
        assert!(keeps(vec![Test::Is {
            path: vec![0],
            ty: Type::Tuple
        }]));
        // A repeated variable: element 1 and the key's element 1 are both 3.
        assert!(keeps(vec![Test::Same {
            a: vec![1],
            b: vec![0, 1]
        }]));
        assert!(!keeps(vec![Test::Same {
            a: vec![1],
            b: vec![0, 0]
        }]));
        // 1 and 1.0 are `==`, not `=:=`.
        let one_float = Test::Cmp {
            path: vec![1],
            op: Op::Eq,
            value: enc(&Value::Float(3.0)),
        };
        assert!(keeps(vec![one_float]));
        let exact = Test::Cmp {
            path: vec![1],
            op: Op::ExactEq,
            value: enc(&Value::Float(3.0)),
        };
        assert!(!keeps(vec![exact]));
        // A back reference on the way cannot be told: it passes.
        let shared = shared_body();
        let s = Sieve::new(vec![vec![cmp(&[1], Op::Eq, 99)]], 1);
        assert!(s.keeps(&key, || Some(&shared), names));
        // So does a record whose body cannot be had.
        assert!(s.keeps(&key, || None, names));
    }
    #[test]
    fn judge_is_certain_only_on_scalars_that_are_not_float_zeros() {
        let (key, body) = record(3);
        let judge =
            |tests: Vec<Test>| Sieve::new(vec![tests], 1).judge(&key, || Some(&body), names);
        assert_eq!(
            judge(vec![arity3(), cmp(&[1], Op::Lt, 10)]),
            Judgement::Matches
        );
        assert_eq!(
            judge(vec![arity3(), cmp(&[0, 1], Op::Ge, 3)]),
            Judgement::Matches
        );
        assert_eq!(
            judge(vec![arity3(), cmp(&[1], Op::Gt, 10)]),
            Judgement::Drops
        );
        assert_eq!(
            judge(vec![Test::Same {
                a: vec![1],
                b: vec![0, 1]
            }]),
            Judgement::Matches
        );
        // Element 0 is a tuple: `=/=` a scalar passes, but not for certain.
        assert_eq!(judge(vec![cmp(&[0], Op::ExactNe, 3)]), Judgement::Maybe);
        // Float zeros: `==` holds across signs, `=:=` depends on the release.
        let zero = |op: Op, z: f64| {
            let mut w = codec::Writer::new();
            w.tuple(2);
            w.key();
            w.float(-0.0, false);
            let body = w.buf;
            let test = Test::Cmp {
                path: vec![1],
                op,
                value: enc(&Value::Float(z)),
            };
            Sieve::new(vec![vec![test]], 1).judge(&key, || Some(&body), names)
        };
        for op in [Op::Eq, Op::ExactEq, Op::Le, Op::ExactNe] {
            assert_eq!(zero(op, 0.0), Judgement::Maybe, "{op:?}");
        }
        assert_eq!(zero(Op::Lt, 0.0), Judgement::Drops);
        assert_eq!(zero(Op::Lt, 1.0), Judgement::Maybe);
        // A back reference, or a body that cannot be had.
        let shared = shared_body();
        let s = Sieve::new(vec![vec![cmp(&[1], Op::Eq, 99)]], 1);
        assert_eq!(s.judge(&key, || Some(&shared), names), Judgement::Maybe);
        assert_eq!(s.judge(&key, || None, names), Judgement::Maybe);
        // Of two clauses, one that matches for certain decides.
        let s = Sieve::new(
            vec![
                vec![cmp(&[0], Op::ExactNe, 3)],
                vec![arity3(), cmp(&[1], Op::Eq, 3)],
            ],
            1,
        );
        assert_eq!(s.judge(&key, || Some(&body), names), Judgement::Matches);
    }
}
