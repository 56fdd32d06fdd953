//! BEAM terms to and from the Heft term format (docs/term-format.md).
//!
//! Encoding walks a term iteratively (a record may be nested arbitrarily
//! deep) and writes it with `heft_core::codec::Writer`. Atoms become ids in
//! the table's dictionary; a compound term met a second time by identity
//! (the same heap object, as in `:erlang.make_tuple(100, list)`) becomes a
//! back-reference, so shared subterms are stored and rebuilt once. Pids,
//! ports, references, funs, big integers and bitstrings are stored as pieces
//! of the external term format.
//!
//! Keys are encoded canonically instead: no back-references, map pairs
//! sorted by their encoded key, and -0.0 written as 0.0 on VMs where
//! `0.0 =:= -0.0` (OTP 26 and older). Equal keys (`=:=`) then have equal
//! bytes, which is what the index compares. Objects of bag tables are
//! written canonically too, but keep the sign of zero as given (see
//! heft_core's table/objects.rs for how they are compared).
//!
//! Canonical encoding sorts a map's pairs after encoding them, recursing
//! once per level of maps nested in maps: [`MAX_MAP_DEPTH`] bounds that.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};

use heft_core::codec::{Builder, DecodeError, Writer};
use rustler::sys::ErlNifTerm;
use rustler::types::tuple::{get_tuple, make_tuple};
use rustler::{Atom, Binary, Encoder, Env, MapIterator, NewBinary, Term, TermType};

use crate::resource::AtomCache;

/// Whether -0.0 and 0.0 are the same key (`0.0 =:= -0.0`), set at load.
pub static NEG_ZERO_IS_ZERO: AtomicBool = AtomicBool::new(true);

/// Work units a normal-scheduler call may spend encoding before it hands the
/// job to a dirty scheduler (a unit is a term node or 64 bytes of binary;
/// about 10-20 ns each).
pub const NORMAL_BUDGET: usize = 40_000;

/// How deep maps may nest in a key or a bag object (each level is a
/// nested call while encoding; heft_core's comparator, for its part,
/// follows maps inside map keys at most `order::MAX_MAP_KEY_DEPTH` deep).
pub const MAX_MAP_DEPTH: u32 = 64;

/// Why a term could not be encoded.
#[derive(Debug, PartialEq, Eq)]
pub enum EncodeError {
    /// Too much work for a normal scheduler: retry on a dirty one.
    TooBig,
    /// A term the format cannot hold (never expected; reported, not hidden).
    Unsupported,
    /// Maps nested deeper than [`MAX_MAP_DEPTH`] in a key or bag object.
    TooDeep,
}

impl EncodeError {
    /// The `ArgumentError` message for a term that will never be encoded
    /// (not for `TooBig`, which is a retry).
    pub fn message(&self) -> String {
        match self {
            EncodeError::TooDeep => format!(
                "maps nested more than {MAX_MAP_DEPTH} deep in a key or a bag object (a Heft limit)"
            ),
            _ => "a term Heft cannot store".to_string(),
        }
    }
}

/// Hashes term words (pointers) for the identity map.
#[derive(Default)]
pub struct WordHasher(u64);

impl Hasher for WordHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (v ^ (v >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
}

/// A map pair's canonical key and value encodings.
type EncodedPair = (Vec<u8>, Vec<u8>);

type IdentityMap = HashMap<ErlNifTerm, u32, BuildHasherDefault<WordHasher>>;

/// Encodes terms for one table.
pub struct TermEncoder<'c> {
    atoms: &'c AtomCache,
    /// Work units left; `usize::MAX` on a dirty scheduler.
    pub budget: usize,
    seen: IdentityMap,
    /// Write -0.0 as given even in canonical mode (bag objects).
    exact_zero: bool,
    /// A float zero (either sign) was written since the last `record`.
    pub saw_zero: bool,
    /// Canonical maps being encoded, one inside another.
    map_depth: u32,
}

/// What `record` produces: the key's canonical encoding and the record's.
pub struct EncodedRecord {
    pub key: Vec<u8>,
    pub body: Vec<u8>,
}

impl<'c> TermEncoder<'c> {
    pub fn new(atoms: &'c AtomCache, budget: usize) -> Self {
        TermEncoder {
            atoms,
            budget,
            seen: IdentityMap::default(),
            exact_zero: false,
            saw_zero: false,
            map_depth: 0,
        }
    }

    /// Takes `units` from the budget; `TooBig` when it runs out.
    pub fn spend(&mut self, units: usize) -> Result<(), EncodeError> {
        self.budget = self.budget.checked_sub(units).ok_or(EncodeError::TooBig)?;
        Ok(())
    }

    /// Encodes a key canonically.
    pub fn key<'a>(&mut self, env: Env<'a>, key: Term<'a>) -> Result<Vec<u8>, EncodeError> {
        let mut w = Writer::new();
        self.term(env, key, &mut w, true)?;
        Ok(w.buf)
    }

    /// Encodes a record whose element `keypos` (1-based) is its key. The
    /// caller has checked that `elems` has at least `keypos` elements.
    /// With `canonical_body` (bag tables) the body has no back-references
    /// and sorted maps, and keeps the sign of zero.
    pub fn record<'a>(
        &mut self,
        env: Env<'a>,
        elems: &[Term<'a>],
        keypos: usize,
        canonical_body: bool,
    ) -> Result<EncodedRecord, EncodeError> {
        self.saw_zero = false;
        let key_term = elems[keypos - 1];
        let key = self.key(env, key_term)?;
        // The key is stored once, outside the body, unless canonical form
        // changed it (-0.0): then the body keeps the exact term.
        let exact = !contains_neg_zero(key_term);
        self.seen.clear();
        self.exact_zero = true;
        let mut w = Writer::new();
        w.tuple(elems.len());
        let mut body = Ok(());
        for (i, e) in elems.iter().enumerate() {
            if i == keypos - 1 && exact {
                w.key();
            } else {
                body = self.term(env, *e, &mut w, canonical_body);
                if body.is_err() {
                    break;
                }
            }
        }
        self.exact_zero = false;
        body?;
        Ok(EncodedRecord { key, body: w.buf })
    }

    /// Encodes any term (canonically, or with sharing).
    pub fn term<'a>(
        &mut self,
        env: Env<'a>,
        root: Term<'a>,
        w: &mut Writer,
        canonical: bool,
    ) -> Result<(), EncodeError> {
        let mut stack: Vec<Term<'a>> = vec![root];
        while let Some(t) = stack.pop() {
            let word = t.as_c_arg();
            self.spend(1)?;
            match t.get_type() {
                TermType::Atom => {
                    let atom = Atom::from_term(t).map_err(|_| EncodeError::Unsupported)?;
                    w.atom(self.atoms.id_of(env, atom)?);
                }
                TermType::Integer => match t.decode::<i64>() {
                    Ok(i) => w.int(i),
                    Err(_) => self.etf(t, w, canonical)?,
                },
                TermType::Float => {
                    let f: f64 = t.decode().map_err(|_| EncodeError::Unsupported)?;
                    self.saw_zero |= f == 0.0;
                    let normalize =
                        canonical && !self.exact_zero && NEG_ZERO_IS_ZERO.load(Ordering::Relaxed);
                    w.float(f, normalize);
                }
                TermType::Binary => {
                    if self.backref(word, w, canonical) {
                        continue;
                    }
                    match Binary::from_term(t) {
                        Ok(b) => {
                            self.spend(b.len() / 64)?;
                            let id = w.binary(b.as_slice());
                            self.remember(word, id, canonical);
                        }
                        // A bitstring that is not a whole number of bytes.
                        Err(_) => self.etf(t, w, canonical)?,
                    }
                }
                TermType::Tuple => {
                    if self.backref(word, w, canonical) {
                        continue;
                    }
                    let elems = get_tuple(t).map_err(|_| EncodeError::Unsupported)?;
                    let id = w.tuple(elems.len());
                    self.remember(word, id, canonical);
                    stack.extend(elems.iter().rev());
                }
                TermType::List => {
                    if t.is_empty_list() {
                        w.nil();
                        continue;
                    }
                    if self.backref(word, w, canonical) {
                        continue;
                    }
                    let mut elems = Vec::new();
                    let mut rest = t;
                    while let Ok((head, tail)) = rest.list_get_cell() {
                        elems.push(head);
                        rest = tail;
                    }
                    self.spend(elems.len() / 4)?;
                    let id = w.list(elems.len());
                    self.remember(word, id, canonical);
                    // The tail ([] for a proper list) comes after the elements.
                    stack.push(rest);
                    stack.extend(elems.iter().rev());
                }
                TermType::Map => {
                    if self.backref(word, w, canonical) {
                        continue;
                    }
                    let pairs: Vec<(Term<'a>, Term<'a>)> = MapIterator::new(t)
                        .ok_or(EncodeError::Unsupported)?
                        .collect();
                    self.spend(pairs.len())?;
                    if canonical {
                        self.canonical_map(env, &pairs, w)?;
                        continue;
                    }
                    let id = w.map(pairs.len());
                    self.remember(word, id, canonical);
                    for (k, v) in pairs.iter().rev() {
                        stack.push(*v);
                        stack.push(*k);
                    }
                }
                TermType::Pid | TermType::Port | TermType::Ref | TermType::Fun => {
                    if self.backref(word, w, canonical) {
                        continue;
                    }
                    self.etf(t, w, canonical)?;
                }
                TermType::Unknown => return Err(EncodeError::Unsupported),
            }
        }
        Ok(())
    }

    /// A map inside a key: pairs sorted by the key's encoding, so equal maps
    /// encode alike whatever their internal order.
    fn canonical_map<'a>(
        &mut self,
        env: Env<'a>,
        pairs: &[(Term<'a>, Term<'a>)],
        w: &mut Writer,
    ) -> Result<(), EncodeError> {
        if self.map_depth >= MAX_MAP_DEPTH {
            return Err(EncodeError::TooDeep);
        }
        self.map_depth += 1;
        let encoded = self.map_pairs(env, pairs);
        self.map_depth -= 1;
        let mut encoded = encoded?;
        encoded.sort();
        w.map(encoded.len());
        for (k, v) in &encoded {
            w.raw(k);
            w.raw(v);
        }
        Ok(())
    }

    /// Each pair's canonical key and value encodings.
    fn map_pairs<'a>(
        &mut self,
        env: Env<'a>,
        pairs: &[(Term<'a>, Term<'a>)],
    ) -> Result<Vec<EncodedPair>, EncodeError> {
        let mut encoded = Vec::with_capacity(pairs.len());
        for (k, v) in pairs {
            let mut kw = Writer::new();
            self.term(env, *k, &mut kw, true)?;
            let mut vw = Writer::new();
            self.term(env, *v, &mut vw, true)?;
            encoded.push((kw.buf, vw.buf));
        }
        Ok(encoded)
    }

    fn backref(&self, word: ErlNifTerm, w: &mut Writer, canonical: bool) -> bool {
        if canonical {
            return false;
        }
        match self.seen.get(&word) {
            Some(&id) => {
                w.backref(id);
                true
            }
            None => false,
        }
    }

    fn remember(&mut self, word: ErlNifTerm, id: u32, canonical: bool) {
        if !canonical {
            self.seen.insert(word, id);
        }
    }

    fn etf(&mut self, t: Term, w: &mut Writer, canonical: bool) -> Result<(), EncodeError> {
        let bin = t.to_binary();
        self.spend(bin.len() / 64)?;
        let id = w.etf(bin.as_slice());
        self.remember(t.as_c_arg(), id, canonical);
        Ok(())
    }
}

/// True if the term holds a float -0.0 anywhere (such a key is stored
/// exactly in the body, since its canonical form says 0.0).
fn contains_neg_zero(t: Term) -> bool {
    contains_float(t, |f| f == 0.0 && f.is_sign_negative())
}

/// True if the term holds a float zero of either sign on a VM where 0.0
/// and -0.0 are one key (so a stored key may have lost its sign).
pub fn contains_zero_float(t: Term) -> bool {
    contains_float(t, |f| f == 0.0)
}

/// True if the VM makes 0.0 and -0.0 one key and the term holds a float
/// for which `pred` holds.
fn contains_float(t: Term, pred: impl Fn(f64) -> bool) -> bool {
    if !NEG_ZERO_IS_ZERO.load(Ordering::Relaxed) {
        return false;
    }
    let mut stack = vec![t];
    while let Some(t) = stack.pop() {
        match t.get_type() {
            TermType::Float if t.decode::<f64>().is_ok_and(&pred) => return true,
            TermType::Tuple => stack.extend(get_tuple(t).unwrap_or_default()),
            TermType::List => {
                let mut rest = t;
                while let Ok((h, tail)) = rest.list_get_cell() {
                    stack.push(h);
                    rest = tail;
                }
                // An improper tail; `[]` (a list too) would come back here
                // forever.
                if !rest.is_empty_list() {
                    stack.push(rest);
                }
            }
            TermType::Map => {
                if let Some(it) = MapIterator::new(t) {
                    for (k, v) in it {
                        stack.push(k);
                        stack.push(v);
                    }
                }
            }
            _ => {}
        }
    }
    false
}

/// Builds BEAM terms in `env` from the format.
pub struct TermBuilder<'a, 'c> {
    pub env: Env<'a>,
    pub atoms: &'c AtomCache,
}

impl<'a> Builder for TermBuilder<'a, '_> {
    type Term = Term<'a>;

    fn nil(&mut self) -> Result<Term<'a>, DecodeError> {
        Ok(Term::list_new_empty(self.env))
    }

    fn int(&mut self, v: i64) -> Result<Term<'a>, DecodeError> {
        Ok(v.encode(self.env))
    }

    fn float(&mut self, v: f64) -> Result<Term<'a>, DecodeError> {
        Ok(v.encode(self.env))
    }

    fn atom(&mut self, id: u32) -> Result<Term<'a>, DecodeError> {
        self.atoms
            .atom(self.env, id)
            .map(|a| a.to_term(self.env))
            .ok_or(DecodeError::Builder(
                "atom id not in the table's dictionary",
            ))
    }

    fn binary(&mut self, bytes: &[u8]) -> Result<Term<'a>, DecodeError> {
        Ok(NewBinary::from_slice(self.env, bytes).into())
    }

    fn etf(&mut self, bytes: &[u8]) -> Result<Term<'a>, DecodeError> {
        self.env
            .binary_to_term(bytes)
            .filter(|(_, used)| *used == bytes.len())
            .map(|(t, _)| t)
            .ok_or(DecodeError::Builder(
                "unreadable external term format piece",
            ))
    }

    fn tuple(&mut self, elems: &[Term<'a>]) -> Result<Term<'a>, DecodeError> {
        Ok(make_tuple(self.env, elems))
    }

    fn list(&mut self, elems: &[Term<'a>], tail: Term<'a>) -> Result<Term<'a>, DecodeError> {
        if tail.is_empty_list() {
            return Ok(elems.encode(self.env));
        }
        Ok(elems.iter().rev().fold(tail, |acc, e| acc.list_prepend(*e)))
    }

    fn map(&mut self, kvs: &[Term<'a>]) -> Result<Term<'a>, DecodeError> {
        let keys: Vec<Term<'a>> = kvs.iter().step_by(2).copied().collect();
        let values: Vec<Term<'a>> = kvs.iter().skip(1).step_by(2).copied().collect();
        Term::map_from_term_arrays(self.env, &keys, &values)
            .map_err(|_| DecodeError::Builder("map with duplicate keys"))
    }
}
