//! BEAM terms to and from the Heft term format (docs/term-format.md).
//!
//! Encoding walks a term iteratively (a record may be nested arbitrarily
//! deep) and writes it with `heft_core::codec::Writer`. Atoms become ids in
//! the table's dictionary; a compound term met a second time by identity
//! (the same heap object, as in `:erlang.make_tuple(100, list)`) becomes a
//! back-reference, so shared subterms are stored and rebuilt once. So does
//! one equal to an earlier complete compound of the same body, however the
//! term was built (heft_core's `dedup`: a term read from a socket or a
//! file shares nothing), so the lookup builds it once too. Pids,
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
//!
//! Both directions are on every lookup's and insert's path, so they avoid
//! allocating: the walk stacks, the identity map and the decoder's scratch
//! space are borrowed from a per-thread pool and given back, and terms are
//! built with `enif_make_*_from_array` straight from the decoder's stack
//! (rustler's wrappers copy every tuple and map into a fresh Vec first).
//! That takes a few `unsafe` blocks, each with its reason.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};

use heft_core::codec::{decode_record, tag, Builder, DecodeError, Reader, Scratch, Writer};
use heft_core::dedup::{Dedup, Opened};
use rustler::sys::{self, ErlNifTerm};
use rustler::{Atom, Binary, Encoder, Env, MapIterator, Term, TermType};

use crate::resource::AtomCache;

/// A term as the VM passes it around: one machine word.
type Word = ErlNifTerm;

/// Whether -0.0 and 0.0 are the same key (`0.0 =:= -0.0`), set at load.
pub static NEG_ZERO_IS_ZERO: AtomicBool = AtomicBool::new(true);

/// Whether terms are laid out as ERTS's erl_term.h says, so that the
/// encoder can read them without a VM call: a small integer's word is
/// `value << 4 | 0xF`, an atom's `index << 6 | 0x0B`, `[]`'s `0x3B`, and a
/// list's the address of its cell `| 1`, the cell two words (head, tail).
/// Set at load by [`check_term_layout`], which compares them with what the
/// VM makes and reads; if anything differs, every term goes through the
/// VM's calls.
static TERM_LAYOUT: AtomicBool = AtomicBool::new(false);

const NIL_WORD: usize = 0x3B;

/// An immediate term, told from its word (only valid if
/// [`TERM_LAYOUT`]).
#[derive(Debug, PartialEq)]
enum Immediate {
    Small(i64),
    Atom,
    Nil,
}

/// The bits of a term's word.
#[inline]
pub(crate) fn bits(word: Word) -> usize {
    // SAFETY: ErlNifTerm is a `repr(transparent)` wrapper of a usize, and
    // every bit pattern is a valid usize.
    unsafe { std::mem::transmute::<Word, usize>(word) }
}

#[inline]
fn immediate(word: Word) -> Option<Immediate> {
    let b = bits(word);
    if b & 0xF == 0xF {
        Some(Immediate::Small((b as i64) >> 4))
    } else if b & 0x3F == 0x0B {
        Some(Immediate::Atom)
    } else if b == NIL_WORD {
        Some(Immediate::Nil)
    } else {
        None
    }
}

/// Whether [`cons`] reads what `enif_get_list_cell` gives on a few lists
/// (tagged as lists first: nothing is read from a word that is not).
fn lists_read_alike(env: Env) -> bool {
    let improper = Term::list_new_empty(env)
        .list_prepend(2i64.encode(env))
        .list_prepend(1i64.encode(env));
    // SAFETY: enif_make_list_cell builds a cell of two terms of `env`.
    let dotted = unsafe {
        sys::enif_make_list_cell(
            env.as_c_arg(),
            3i64.encode(env).as_c_arg(),
            (4i64, 5i64).encode(env).as_c_arg(),
        )
    };
    // SAFETY: the VM just made `dotted` in `env`.
    let dotted = unsafe { term_of(env, dotted) };
    [improper, dotted, vec![(1i64, 2i64)].encode(env)]
        .iter()
        .all(|&l| {
            let mut rest = l;
            loop {
                let by_vm = rest.list_get_cell().ok();
                let tagged = bits(rest.as_c_arg()) & 3 == 1;
                if tagged != by_vm.is_some() {
                    return false;
                }
                let Some((head, tail)) = by_vm else {
                    return true;
                };
                // SAFETY: `rest` is a list cell of `env` (the VM says so) and
                // tagged as one; reading it is what is being checked.
                let read = unsafe { cons(rest.as_c_arg()) };
                if read != Some((head.as_c_arg(), tail.as_c_arg())) {
                    return false;
                }
                rest = tail;
            }
        })
}

/// What [`check_term_layout`] found at load.
pub fn term_layout_checked() -> bool {
    TERM_LAYOUT.load(Ordering::Relaxed)
}

/// The head and tail of a list cell, read from the cell; `None` for a
/// word that is not a list cell (`[]`, an improper tail).
///
/// # Safety
/// [`TERM_LAYOUT`] must hold, and `word` be the word of a term alive for
/// as long as the words returned are used (see [`term_of`]).
#[inline]
unsafe fn cons(word: Word) -> Option<(Word, Word)> {
    let b = bits(word);
    if b & 3 != 1 {
        return None;
    }
    let cell = (b - 1) as *const Word;
    // SAFETY: with TERM_LAYOUT, a word tagged 1 is the address of a live
    // list cell, two aligned words, plus 1 (the caller's promise).
    unsafe { Some((cell.read(), cell.add(1).read())) }
}

/// Checks the layout [`immediate`] and [`cons`] read against terms the VM
/// makes (integers at the ends of the small range and just past them,
/// atoms, `[]`, lists proper and improper, and compounds, floats and
/// binaries that must not look immediate), and enables them if all agree.
/// Returns whether they did.
pub fn check_term_layout(env: Env) -> bool {
    let small = (1i64 << 59) - 1;
    let ints_ok = [0, 1, -1, 127, 128, -128, small, -small - 1]
        .iter()
        .all(|&i| immediate(i.encode(env).as_c_arg()) == Some(Immediate::Small(i)));
    let bigs_ok = [small + 1, -small - 2, i64::MAX, i64::MIN]
        .iter()
        .all(|&i| immediate(i.encode(env).as_c_arg()).is_none());
    let atoms_ok = ["true", "false", "heft", "a"].iter().all(|name| {
        Atom::from_str(env, name)
            .is_ok_and(|a| immediate(a.to_term(env).as_c_arg()) == Some(Immediate::Atom))
    });
    let empty: Vec<i64> = Vec::new();
    let nil_ok = immediate(empty.encode(env).as_c_arg()) == Some(Immediate::Nil);
    let others = [
        vec![1i64].encode(env),
        (1i64, 2i64).encode(env),
        1.5f64.encode(env),
        "bin".encode(env),
        rustler::types::tuple::make_tuple(env, &[]),
    ];
    let others_ok = others.iter().all(|t| immediate(t.as_c_arg()).is_none());
    let ok = ints_ok && bigs_ok && atoms_ok && nil_ok && others_ok && lists_read_alike(env);
    TERM_LAYOUT.store(ok, Ordering::Relaxed);
    ok
}

/// Tuples and lists of immediates this short are not tracked by identity
/// (a shared one is written again, and merged by dedup into the same `ref`
/// its identity would have given: lists of 1 part or more and tuples of 3
/// or more encode in at least `dedup::MIN_SHARED_LEN` bytes), which saves
/// an identity lookup and entry each; the length bounds what is written
/// again.
const SHORT_FLAT_TUPLE: std::ops::RangeInclusive<usize> = 3..=16;
const SHORT_FLAT_LIST: usize = 16;

/// Work units a normal-scheduler call may spend encoding before it hands the
/// job to a dirty scheduler (a unit is a term node or 64 bytes of binary;
/// about 10-20 ns each).
pub const NORMAL_BUDGET: usize = 40_000;

/// Extra work units of a compound in a body with sharing: what merging
/// equal compounds costs (hashing, looking up and recording its signature),
/// measured as about twice the time of the plain walk on the worst shapes
/// (nested pairs, long lists of distinct small tuples).
const MERGE_UNITS: usize = 4;

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

type IdentityMap = HashMap<Word, u32, BuildHasherDefault<WordHasher>>;

/// Buffers lent to encoders and decoders on this thread. Each is taken
/// (leaving an empty one) and given back when done, so nested users (a key
/// decoded inside a record) simply get a fresh, empty buffer.
#[derive(Default)]
struct Pool {
    walk: WalkBufs,
    build: BuildBufs,
}

/// What an encoder's walk uses.
#[derive(Default)]
struct WalkBufs {
    stack: Vec<Word>,
    items: Vec<Word>,
    seen: Seen,
    /// Structurally equal compounds of a record body (heft_core's dedup).
    dedup: Dedup<Word>,
    /// The last record's encoded key and body, reused from record to record.
    key: Vec<u8>,
    body: Vec<u8>,
    /// The last compound of immediates written whole, while its class holds.
    last_flat: LastFlat,
    /// Merges made by `dedup` in this record (each may drop classes).
    merges: Cell<u64>,
}

/// A tuple or list of immediates only, as written whole, and the class
/// `dedup` gave it: an equal one met next (the same words: atoms, small
/// integers and `[]` are equal exactly when their words are) is written as
/// `ref class` and told to `dedup` as a leaf, as a duplicate becomes once
/// merged, without being written, hashed and cut back. Runs of equal
/// small compounds (a tuple of equal lists, a list of equal pairs) are
/// common, and this is most of their cost. After any merge since
/// (`merges`) the class is not used: a merged compound's parts were
/// merged into earlier ones, so their classes survive it, but that is
/// dedup's invariant, and this does not lean on it.
#[derive(Default)]
struct LastFlat {
    /// Whether it was a list (its words: elements, then tail) or a tuple.
    list: bool,
    words: Vec<Word>,
    /// The words of the one being written, until it has a class.
    pending: Vec<Word>,
    class: Option<u32>,
    merges: u64,
}

impl LastFlat {
    fn clear(&mut self) {
        self.class = None;
    }

    /// The class to refer to for a compound of these words, if it is the
    /// last one's and still valid.
    fn class_of(&self, list: bool, elems: &[Word], tail: Option<Word>, merges: u64) -> Option<u32> {
        let class = self.class?;
        let n = elems.len();
        let same = self.list == list
            && self.merges == merges
            && self.words.len() == n + usize::from(tail.is_some())
            && self.words[..n] == *elems
            && tail.map_or(true, |t| self.words[n] == t);
        same.then_some(class)
    }

    /// The length and class of the last compound if it was a list of at
    /// most [`SHORT_FLAT_LIST`] immediates (one the general path does not
    /// track by identity) and the list whose word is `list` has the same
    /// elements and tail. Needs [`TERM_LAYOUT`], and `list` a live list
    /// cell (its elements are compared as words: immediates are equal
    /// exactly when their words are).
    ///
    /// # Safety
    /// [`TERM_LAYOUT`] must hold, and `list` be the word of a list alive
    /// for this call (see [`cons`]).
    #[inline(never)]
    unsafe fn short_list_class(&self, list: Word, merges: u64) -> Option<(usize, u32)> {
        let class = self.class?;
        let (&tail, elems) = self.words.split_last()?;
        if !self.list || self.merges != merges || elems.len() > SHORT_FLAT_LIST {
            return None;
        }
        let mut rest = list;
        for &e in elems {
            // SAFETY: `rest` is `list` or a tail read from it, alive (the
            // caller's promise), and TERM_LAYOUT holds.
            let (head, next) = unsafe { cons(rest) }?;
            if head != e {
                return None;
            }
            rest = next;
        }
        (rest == tail).then_some((elems.len(), class))
    }

    /// Notes the words of a compound about to be told whole.
    fn begin(&mut self, list: bool, elems: &[Word], tail: Option<Word>) {
        self.pending.clear();
        self.pending.extend_from_slice(elems);
        self.pending.extend(tail);
        self.list = list;
        self.class = None;
    }

    /// The compound begun has `class` (`None`: none to refer to), valid
    /// while `merges` is unchanged.
    fn end(&mut self, class: Option<u32>, merges: u64) {
        std::mem::swap(&mut self.words, &mut self.pending);
        self.class = class;
        self.merges = merges;
    }
}

/// The compound terms met so far in one record (identity -> id): the
/// first few in an array, the rest in a hash map. Most records hold a
/// handful of compound terms, and a short scan beats hashing each one.
///
/// Entries are undone newest first when a compound is merged into an
/// earlier equal one (`rollback`): the first SEEN_SMALL in `small`, the
/// words of the rest in `order`.
#[derive(Default)]
struct Seen {
    small: Vec<(Word, u32)>,
    map: IdentityMap,
    order: Vec<Word>,
}

const SEEN_SMALL: usize = 16;

impl Seen {
    fn clear(&mut self) {
        self.small.clear();
        self.map.clear();
        self.order.clear();
    }

    /// How many entries were made (a mark for `rollback`).
    fn len(&self) -> usize {
        self.small.len() + self.order.len()
    }

    /// Undoes the entries made since `len()` was `mark` but the first,
    /// which was `word`'s, and gives `word` the id `id` instead.
    fn rollback_to(&mut self, mark: usize, word: Word, id: u32) {
        self.rollback(mark + 1);
        match self.small.get_mut(mark) {
            Some(entry) => *entry = (word, id),
            None => {
                self.map.insert(word, id);
            }
        }
    }

    /// Undoes the entries made since `len()` was `mark`.
    fn rollback(&mut self, mark: usize) {
        while self.len() > mark {
            match self.order.pop() {
                Some(word) => {
                    self.map.remove(&word);
                }
                None => {
                    self.small.pop();
                }
            }
        }
    }

    fn get(&self, word: Word) -> Option<u32> {
        match self.small.iter().find(|(w, _)| *w == word) {
            Some((_, id)) => Some(*id),
            None if self.small.len() == SEEN_SMALL => self.map.get(&word).copied(),
            None => None,
        }
    }

    fn insert(&mut self, word: Word, id: u32) {
        if self.small.len() < SEEN_SMALL {
            self.small.push((word, id));
        } else {
            self.map.insert(word, id);
            self.order.push(word);
        }
    }
}

/// What a decode uses.
#[derive(Default)]
struct BuildBufs {
    scratch: Scratch<Word>,
    keys: Vec<Word>,
    values: Vec<Word>,
}

thread_local! {
    static POOL: RefCell<Pool> = RefCell::new(Pool::default());
}

// One thread-local access to take a group of buffers, one to give it back:
// in a NIF library each access is a call into the dynamic loader.
fn take<T: Default>(field: fn(&mut Pool) -> &mut T) -> T {
    POOL.with(|p| std::mem::take(field(&mut p.borrow_mut())))
}

fn give<T>(field: fn(&mut Pool) -> &mut T, value: T) {
    POOL.with(|p| *field(&mut p.borrow_mut()) = value);
}

/// A term of `env` again, from the word of a term that lives in `env`.
///
/// # Safety
/// `word` must be the word of a term of `env` that is alive for `'a`: a
/// term passed to the current NIF call, one reached from such a term, or
/// one built in `env` during the call.
unsafe fn term_of<'a>(env: Env<'a>, word: Word) -> Term<'a> {
    // SAFETY: the caller's promise is exactly Term::new's requirement.
    unsafe { Term::new(env, word) }
}

/// The arity of a tuple, or `None` for anything else.
pub fn tuple_arity(t: Term) -> Option<usize> {
    tuple_words(t).map(<[Word]>::len)
}

/// The elements of a tuple, without copying them.
fn tuple_words<'a>(t: Term<'a>) -> Option<&'a [Word]> {
    let mut arity = 0;
    let mut array: *const Word = std::ptr::null();
    // SAFETY: enif_get_tuple only reads `t` and writes the two out
    // parameters, which point to locals.
    let ok = unsafe {
        sys::enif_get_tuple(t.get_env().as_c_arg(), t.as_c_arg(), &mut arity, &mut array)
    };
    if ok == 0 {
        return None;
    }
    if arity == 0 {
        return Some(&[]);
    }
    // SAFETY: on success the VM points `array` at the tuple's `arity`
    // elements, inside the tuple itself, which lives in the env for 'a.
    Some(unsafe { std::slice::from_raw_parts(array, arity as usize) })
}

/// Encodes the commonest keys, an integer of 64 bits or a binary, into
/// `out` (replacing its contents) without an encoder: one VM call, where
/// the walk asks the term's type first and then converts it, and no
/// thread-local buffers. The bytes are those [`TermEncoder::term`] writes,
/// and so is the budget spent. False, with `out` and `budget` untouched,
/// for any other term and for a binary over the budget (which the walk
/// refuses with `TooBig`).
pub fn quick_key_into(key: Term, out: &mut Vec<u8>, budget: &mut usize) -> bool {
    let mut int = 0i64;
    // SAFETY: reads `key`, a term of its env; writes only the local `int`.
    let is_int =
        unsafe { sys::enif_get_int64(key.get_env().as_c_arg(), key.as_c_arg(), &mut int) } != 0;
    let bin = match is_int {
        true => None,
        false => match Binary::from_term(key) {
            Ok(b) => Some(b),
            Err(_) => return false,
        },
    };
    let units = bin.map_or(1, |b| 1 + b.len() / 64);
    let Some(left) = budget.checked_sub(units) else {
        return false;
    };
    *budget = left;
    let mut w = Writer::from_vec(std::mem::take(out));
    match bin {
        Some(b) => {
            w.binary(b.as_slice());
        }
        None => w.int(int),
    }
    *out = w.buf;
    true
}

/// Encodes terms for one table.
pub struct TermEncoder<'c> {
    atoms: &'c AtomCache,
    /// Work units left; `usize::MAX` on a dirty scheduler.
    pub budget: usize,
    walk: WalkBufs,
    /// The last atoms met (word, id): a record names the same few atoms
    /// over and over, and this saves a lock per occurrence.
    recent_atoms: [(Word, u32); 8],
    recent_next: usize,
    /// Write -0.0 as given even in canonical mode (bag objects).
    exact_zero: bool,
    /// A float zero (either sign) was written since the last `record`.
    pub saw_zero: bool,
    /// A magic reference (vm_refs.rs) was written since the last `record`.
    pub saw_vm_ref: bool,
    /// Canonical maps being encoded, one inside another.
    map_depth: u32,
    /// In a set's body: the key's word when the key is a small integer or
    /// an atom, written as `KEY` wherever it occurs (docs/term-format.md,
    /// "Records").
    key_word: Option<Word>,
    /// In a set's body, when the key is a binary: where its bytes start in
    /// `walk.key`; an equal binary is written as `KEY`.
    key_binary: Option<usize>,
    /// [`TERM_LAYOUT`], read once.
    tags: bool,
}

impl Drop for TermEncoder<'_> {
    fn drop(&mut self) {
        // Give back only what was borrowed (a scalar key borrows nothing).
        if self.walk.stack.capacity() > 0 {
            self.walk.seen.clear();
            self.walk.dedup.clear();
            self.walk.stack.clear();
            self.walk.items.clear();
            give(|p| &mut p.walk, std::mem::take(&mut self.walk));
        }
    }
}

impl<'c> TermEncoder<'c> {
    pub fn new(atoms: &'c AtomCache, budget: usize) -> Self {
        TermEncoder {
            atoms,
            budget,
            walk: WalkBufs::default(),
            recent_atoms: [(Word::default(), u32::MAX); 8],
            recent_next: 0,
            exact_zero: false,
            saw_zero: false,
            saw_vm_ref: false,
            map_depth: 0,
            key_word: None,
            key_binary: None,
            tags: TERM_LAYOUT.load(Ordering::Relaxed),
        }
    }

    /// Borrows the walk's buffers from the pool on first use.
    fn buffers(&mut self) {
        if self.walk.stack.capacity() == 0 {
            self.walk = take(|p| &mut p.walk);
            self.walk.stack.reserve(16);
        }
    }

    /// Writes a term that is not compound; false if it is compound (or a
    /// term that needs the full walk).
    fn scalar(
        &mut self,
        env: Env,
        t: Term,
        w: &mut Writer,
        canonical: bool,
    ) -> Result<bool, EncodeError> {
        if self.immediate_into(env, t.as_c_arg(), w)? {
            self.spend(1)?;
            return Ok(true);
        }
        match t.get_type() {
            TermType::Atom => {
                let atom = Atom::from_term(t).map_err(|_| EncodeError::Unsupported)?;
                let id = self.atom_id(env, atom)?;
                w.atom(id);
            }
            TermType::Integer => match t.decode::<i64>() {
                Ok(i) => w.int(i),
                Err(_) => return Ok(false),
            },
            TermType::Float => self.float(t, w, canonical)?,
            _ => return Ok(false),
        }
        self.spend(1)?;
        Ok(true)
    }

    /// Writes a float: in canonical form -0.0 as 0.0 where the VM makes
    /// them one key (but never in a bag's object); notes a zero of either
    /// sign (see `saw_zero`).
    fn float(&mut self, t: Term, w: &mut Writer, canonical: bool) -> Result<(), EncodeError> {
        let f: f64 = t.decode().map_err(|_| EncodeError::Unsupported)?;
        self.saw_zero |= f == 0.0;
        let normalize = canonical && !self.exact_zero && NEG_ZERO_IS_ZERO.load(Ordering::Relaxed);
        w.float(f, normalize);
        Ok(())
    }

    /// Takes `units` from the budget; `TooBig` when it runs out.
    pub fn spend(&mut self, units: usize) -> Result<(), EncodeError> {
        self.budget = self.budget.checked_sub(units).ok_or(EncodeError::TooBig)?;
        Ok(())
    }

    /// Encodes a key canonically.
    pub fn key<'a>(&mut self, env: Env<'a>, key: Term<'a>) -> Result<Vec<u8>, EncodeError> {
        let mut out = Vec::new();
        self.key_into(env, key, &mut out)?;
        Ok(out)
    }

    /// Encodes a key canonically into `out` (replacing its contents), so a
    /// hot path can reuse one buffer instead of allocating.
    pub fn key_into<'a>(
        &mut self,
        env: Env<'a>,
        key: Term<'a>,
        out: &mut Vec<u8>,
    ) -> Result<(), EncodeError> {
        if quick_key_into(key, out, &mut self.budget) {
            return Ok(());
        }
        self.walk_key_into(env, key, out)
    }

    /// [`Self::key_into`] by the full walk, for keys that
    /// [`quick_key_into`] has turned down.
    pub fn walk_key_into<'a>(
        &mut self,
        env: Env<'a>,
        key: Term<'a>,
        out: &mut Vec<u8>,
    ) -> Result<(), EncodeError> {
        let mut w = Writer::from_vec(std::mem::take(out));
        let result = self.term(env, key, &mut w, true);
        *out = w.buf;
        result
    }

    /// Encodes a record whose element `keypos` (1-based) is its key, into
    /// [`Self::encoded_key`] and [`Self::encoded_body`] (valid until the next
    /// record). The caller has checked that `elems` has at least `keypos`
    /// elements. With `canonical_body` (bag tables) the body has no
    /// back-references and sorted maps, and keeps the sign of zero.
    pub fn record<'a>(
        &mut self,
        env: Env<'a>,
        elems: &[Term<'a>],
        keypos: usize,
        canonical_body: bool,
    ) -> Result<(), EncodeError> {
        self.record_from(
            env,
            elems.len(),
            elems.iter().copied(),
            keypos,
            canonical_body,
        )
    }

    /// [`Self::record`] of a tuple, read in place (no copy of its elements).
    /// The caller has checked that it is a tuple of at least `keypos`
    /// elements.
    pub fn record_tuple<'a>(
        &mut self,
        env: Env<'a>,
        tuple: Term<'a>,
        keypos: usize,
        canonical_body: bool,
    ) -> Result<(), EncodeError> {
        let words = tuple_words(tuple).ok_or(EncodeError::Unsupported)?;
        // SAFETY: elements of a tuple alive in `env` for this call.
        let elems = words.iter().map(|w| unsafe { term_of(env, *w) });
        self.record_from(env, words.len(), elems, keypos, canonical_body)
    }

    fn record_from<'a>(
        &mut self,
        env: Env<'a>,
        arity: usize,
        elems: impl Iterator<Item = Term<'a>> + Clone,
        keypos: usize,
        canonical_body: bool,
    ) -> Result<(), EncodeError> {
        self.saw_zero = false;
        self.saw_vm_ref = false;
        let key_term = elems
            .clone()
            .nth(keypos - 1)
            .ok_or(EncodeError::Unsupported)?;
        self.buffers();
        let mut kw = Writer::from_vec(std::mem::take(&mut self.walk.key));
        let key = self.term(env, key_term, &mut kw, true);
        self.walk.key = kw.buf;
        key?;
        // The key is stored once, outside the body, unless canonical form
        // changed it (-0.0): then the body keeps the exact term.
        let exact = !contains_neg_zero(key_term);
        // In a set's body, a small integer, atom or binary equal to the key
        // is the key again: a `KEY` tag too. (A bag's body stays as it was:
        // its objects are told apart by their bytes, old ones included.)
        let again = exact && !canonical_body;
        let kw = key_term.as_c_arg();
        self.key_word = (again
            && self.tags
            && matches!(immediate(kw), Some(Immediate::Small(_) | Immediate::Atom)))
        .then_some(kw);
        self.key_binary = again.then(|| binary_start(&self.walk.key)).flatten();
        self.walk.seen.clear();
        self.walk.dedup.clear();
        self.walk.last_flat.clear();
        self.walk.merges.set(0);
        self.exact_zero = true;
        let mut w = Writer::from_vec(std::mem::take(&mut self.walk.body));
        w.tuple(arity);
        let mut body = Ok(());
        for (i, e) in elems.enumerate() {
            if i == keypos - 1 && exact {
                w.key();
            } else {
                body = self.term(env, e, &mut w, canonical_body);
                if body.is_err() {
                    break;
                }
            }
        }
        // A body of a set or ordered_set that holds no back-reference says
        // so in its first tag, for the lean decoder. Bag bodies are
        // canonical (never a back-reference) and stay unflagged: objects
        // are told apart by their bytes, also against objects stored
        // before the flag existed.
        if !canonical_body {
            w.flag_if_unshared();
        }
        self.walk.body = w.buf;
        self.exact_zero = false;
        self.key_word = None;
        self.key_binary = None;
        body
    }

    /// The key of the last record encoded.
    pub fn encoded_key(&self) -> &[u8] {
        &self.walk.key
    }

    /// The body of the last record encoded.
    pub fn encoded_body(&self) -> &[u8] {
        &self.walk.body
    }

    /// Encodes any term (canonically, or with sharing: a compound met again
    /// by identity, or equal to an earlier complete one, is a `ref`).
    pub fn term<'a>(
        &mut self,
        env: Env<'a>,
        root: Term<'a>,
        w: &mut Writer,
        canonical: bool,
    ) -> Result<(), EncodeError> {
        if self.scalar(env, root, w, canonical)? {
            return Ok(());
        }
        self.buffers();
        let base = self.walk.stack.len();
        self.walk.stack.push(root.as_c_arg());
        while self.walk.stack.len() > base {
            let Some(word) = self.walk.stack.pop() else {
                break;
            };
            // SAFETY: the stack holds `root` and words read out of terms
            // reached from it, all of which live in `env` for this call.
            let t = unsafe { term_of(env, word) };
            self.spend(1)?;
            let start = w.buf.len();
            // What the term is for the structural merge: a leaf, or a
            // compound (id, children to come, or written whole).
            let immediate = self.tags && immediate(word).is_some();
            // A list cell is told by its tag, without asking the VM.
            let cell = self.tags && bits(word) & 3 == 1;
            let ty = match (immediate, cell) {
                (true, _) => None,
                (false, true) => Some(TermType::List),
                (false, false) => Some(t.get_type()),
            };
            // A tuple or list of immediates only is written whole here; a
            // short one is not tracked by identity (below), and a list met
            // again by identity is a leaf.
            let mut whole = false;
            let mut untracked = false;
            let mut continue_leaf = false;
            // SAFETY: a list cell of `env`, alive for this call, and
            // TERM_LAYOUT holds (`cell`).
            let short = match !canonical && cell {
                true => unsafe {
                    self.walk
                        .last_flat
                        .short_list_class(word, self.walk.merges.get())
                },
                false => None,
            };
            let node = match ty {
                // Equal to the last short list of immediates written whole:
                // what the general path below concludes (untracked, a ref to
                // its class), in one pass over the cells, spending the same.
                _ if short.is_some() => {
                    let (n, class) = short.unwrap_or_default();
                    self.spend(n / 4 + n + 1)?;
                    untracked = true;
                    self.refer(word, class, true, w);
                    None
                }
                None => {
                    self.immediate_into(env, word, w)?;
                    None
                }
                Some(TermType::Atom) => {
                    let atom = Atom::from_term(t).map_err(|_| EncodeError::Unsupported)?;
                    let id = self.atom_id(env, atom)?;
                    w.atom(id);
                    None
                }
                Some(TermType::Integer) => match t.decode::<i64>() {
                    Ok(i) => {
                        w.int(i);
                        None
                    }
                    Err(_) => self.etf(t, w, canonical)?,
                },
                Some(TermType::Float) => {
                    self.float(t, w, canonical)?;
                    None
                }
                Some(TermType::List) if !cell && t.is_empty_list() => {
                    w.nil();
                    None
                }
                // (Tuples and lists check below, after a look at their parts.)
                _ if !matches!(ty, Some(TermType::Tuple | TermType::List))
                    && self.backref(word, w, canonical) =>
                {
                    None
                }
                Some(TermType::Binary) => match Binary::from_term(t) {
                    Ok(b) if self.is_key_binary(b.as_slice()) => {
                        self.spend(b.len() / 64)?;
                        w.key();
                        None
                    }
                    Ok(b) => {
                        self.spend(b.len() / 64)?;
                        Some((w.binary(b.as_slice()), 0))
                    }
                    // A bitstring that is not a whole number of bytes.
                    Err(_) => self.etf(t, w, canonical)?,
                },
                Some(TermType::Tuple) => {
                    let elems = tuple_words(t).ok_or(EncodeError::Unsupported)?;
                    let flat = self.all_immediate(elems);
                    untracked = !canonical && flat && SHORT_FLAT_TUPLE.contains(&elems.len());
                    if !untracked && self.backref(word, w, canonical) {
                        None
                    } else if flat {
                        self.spend(elems.len())?;
                        let merges = self.walk.merges.get();
                        match self.walk.last_flat.class_of(false, elems, None, merges) {
                            Some(class) if !canonical => {
                                self.refer(word, class, untracked, w);
                                None
                            }
                            _ => {
                                let id = w.tuple(elems.len());
                                self.immediates_into(env, elems, w)?;
                                self.walk.last_flat.begin(false, elems, None);
                                whole = true;
                                Some((id, 0))
                            }
                        }
                    } else {
                        self.walk.stack.extend(elems.iter().rev());
                        Some((w.tuple(elems.len()), elems.len()))
                    }
                }
                Some(TermType::List) => {
                    let first = self.walk.items.len();
                    let (mut tail, complete) = self.list_cells(env, word, SHORT_FLAT_LIST)?;
                    let flat = complete
                        && self.all_immediate(&self.walk.items[first..])
                        && self.all_immediate(&[tail]);
                    untracked = !canonical && flat;
                    if !untracked && self.backref(word, w, canonical) {
                        self.walk.items.truncate(first);
                        continue_leaf = true;
                    } else if !complete {
                        tail = self.list_cells(env, tail, usize::MAX)?.0;
                    }
                    let n = self.walk.items.len() - first;
                    self.spend(n / 4)?;
                    if continue_leaf {
                        None
                    } else if flat
                        || !complete
                            && self.all_immediate(&self.walk.items[first..])
                            && self.all_immediate(&[tail])
                    {
                        let WalkBufs {
                            items,
                            last_flat,
                            merges,
                            ..
                        } = &mut self.walk;
                        match last_flat.class_of(true, &items[first..], Some(tail), merges.get()) {
                            Some(class) if !canonical => {
                                self.spend(n + 1)?;
                                self.walk.items.truncate(first);
                                self.refer(word, class, untracked, w);
                                None
                            }
                            _ => {
                                last_flat.begin(true, &items[first..], Some(tail));
                                let id = w.list(n);
                                let written = self.inline_items(env, first, tail, w);
                                self.walk.items.truncate(first);
                                written?;
                                whole = true;
                                Some((id, 0))
                            }
                        }
                    } else {
                        // The tail ([] for a proper list) comes after the elements.
                        self.walk.stack.push(tail);
                        self.walk
                            .stack
                            .extend(self.walk.items[first..].iter().rev());
                        self.walk.items.truncate(first);
                        Some((w.list(n), n + 1))
                    }
                }
                Some(TermType::Map) if canonical => {
                    self.canonical_map(env, t, w)?;
                    None
                }
                Some(TermType::Map) => {
                    let first = self.walk.items.len();
                    for (k, v) in MapIterator::new(t).ok_or(EncodeError::Unsupported)? {
                        self.walk.items.push(k.as_c_arg());
                        self.walk.items.push(v.as_c_arg());
                    }
                    let pairs = (self.walk.items.len() - first) / 2;
                    self.spend(pairs)?;
                    // Pushed as v, k from the last pair, so k pops first.
                    self.walk
                        .stack
                        .extend(self.walk.items[first..].iter().rev());
                    self.walk.items.truncate(first);
                    Some((w.map(pairs), pairs * 2))
                }
                Some(TermType::Pid | TermType::Port | TermType::Ref | TermType::Fun) => {
                    self.etf(t, w, canonical)?
                }
                Some(TermType::Unknown) => return Err(EncodeError::Unsupported),
            };
            if canonical {
                continue;
            }
            if node.is_some() {
                self.spend(MERGE_UNITS)?;
            }
            // Identity first, then structure: a duplicate found by the
            // merge is cut back to a ref and the identities noted inside
            // it are forgotten (their ids are given out again).
            let WalkBufs {
                seen,
                dedup,
                last_flat,
                merges,
                ..
            } = &mut self.walk;
            let opened = node.map(|(id, children)| {
                let mark = seen.len();
                if !untracked {
                    seen.insert(word, id);
                }
                Opened {
                    start,
                    id,
                    children,
                    mark,
                    payload: word,
                }
            });
            // (The first entry made since `mark` is the compound's own.)
            let mut merged = |merged_word, class, mark| {
                merges.set(merges.get() + 1);
                // An untracked compound has no identity entry to change.
                if !(untracked && merged_word == word) {
                    seen.rollback_to(mark, merged_word, class);
                }
            };
            match opened {
                Some(o) if whole => {
                    let (id, before) = (o.id, merges.get());
                    let class = dedup.whole(w, o, &mut merged);
                    // Its own merge (into an earlier class) leaves the class
                    // valid; a merge of a compound around it may drop it.
                    let own = u64::from(class.is_some_and(|c| c != id));
                    match merges.get() - before == own {
                        true => last_flat.end(class, merges.get()),
                        false => last_flat.clear(),
                    }
                }
                Some(o) => dedup.open(w, o, &mut merged),
                None => dedup.leaf(w, start, &mut merged),
            }
        }
        Ok(())
    }

    /// Pushes the elements of the list whose word is `list` onto
    /// `walk.items`, at most `most` of them, and returns what follows them
    /// (the tail: `[]` for a proper list) and whether that is the end of
    /// the list. `TooBig`, with nothing pushed, once a list is longer than
    /// the budget could pay for: a normal scheduler is not kept walking a
    /// list of millions.
    fn list_cells(
        &mut self,
        env: Env,
        list: Word,
        most: usize,
    ) -> Result<(Word, bool), EncodeError> {
        let first = self.walk.items.len();
        let affordable = self.budget.saturating_mul(4).saturating_add(4);
        let mut rest = list;
        loop {
            // SAFETY: `rest` is `list` or a tail read from it, terms of
            // `env` alive for this call.
            let cell = match self.tags {
                true => unsafe { cons(rest) },
                false => unsafe { term_of(env, rest) }
                    .list_get_cell()
                    .ok()
                    .map(|(h, t)| (h.as_c_arg(), t.as_c_arg())),
            };
            let Some((head, tail)) = cell else {
                return Ok((rest, true));
            };
            if self.walk.items.len() - first == most {
                return Ok((rest, false));
            }
            self.walk.items.push(head);
            rest = tail;
            if self.walk.items.len() - first > affordable {
                self.walk.items.truncate(first);
                return Err(EncodeError::TooBig);
            }
        }
    }

    /// Writes the compound `word`, equal to the last one written whole, as
    /// `ref class` (then told to dedup as a leaf), noting its identity
    /// unless it is `untracked`.
    fn refer(&mut self, word: Word, class: u32, untracked: bool, w: &mut Writer) {
        w.backref(class);
        if !untracked {
            self.walk.seen.insert(word, class);
        }
    }

    /// Whether `words` are all immediates that [`Self::immediate_into`]
    /// writes (false for none, and without [`TERM_LAYOUT`]).
    fn all_immediate(&self, words: &[Word]) -> bool {
        self.tags && !words.is_empty() && words.iter().all(|&w| immediate(w).is_some())
    }

    /// Writes the list elements `walk.items[first..]`, then `tail`, all
    /// immediates, spending what the walk would have spent on them.
    fn inline_items(
        &mut self,
        env: Env,
        first: usize,
        tail: Word,
        w: &mut Writer,
    ) -> Result<(), EncodeError> {
        self.spend(self.walk.items.len() - first + 1)?;
        let items = std::mem::take(&mut self.walk.items);
        let written = self.immediates_into(env, &items[first..], w);
        self.walk.items = items;
        written?;
        self.immediate_into(env, tail, w)?;
        Ok(())
    }

    /// Writes `words`, all immediates ([`Self::all_immediate`]). A run of
    /// one term (a list of one atom, of zeros) is written byte by byte.
    fn immediates_into(
        &mut self,
        env: Env,
        words: &[Word],
        w: &mut Writer,
    ) -> Result<(), EncodeError> {
        w.buf.reserve(words.len());
        let mut last = None;
        for &e in words {
            match last {
                Some((word, byte)) if word == e => w.buf.push(byte),
                _ => {
                    let at = w.buf.len();
                    self.immediate_into(env, e, w)?;
                    last = (w.buf.len() == at + 1).then(|| (e, w.buf[at]));
                }
            }
        }
        Ok(())
    }

    /// Writes an atom, a small integer or `[]` from its word, without a VM
    /// call for the last two (and for an atom met recently); false, with
    /// nothing written, for any other term or without [`TERM_LAYOUT`].
    /// `word` is that of a term of `env`.
    #[inline]
    fn immediate_into(
        &mut self,
        env: Env,
        word: Word,
        w: &mut Writer,
    ) -> Result<bool, EncodeError> {
        if !self.tags {
            return Ok(false);
        }
        if self.key_word == Some(word) {
            w.key();
            return Ok(true);
        }
        match immediate(word) {
            Some(Immediate::Small(i)) => w.int(i),
            Some(Immediate::Atom) => {
                let id = self.atom_word_id(env, word)?;
                w.atom(id);
            }
            Some(Immediate::Nil) => w.nil(),
            None => return Ok(false),
        }
        Ok(true)
    }

    /// Whether `bytes` are those of the key, a binary (in a set's body).
    fn is_key_binary(&self, bytes: &[u8]) -> bool {
        self.key_binary
            .is_some_and(|start| self.walk.key.get(start..) == Some(bytes))
    }

    fn atom_id(&mut self, env: Env, atom: Atom) -> Result<u32, EncodeError> {
        self.atom_word_id(env, atom.as_c_arg())
    }

    /// [`Self::atom_id`] of the atom whose word is `word`.
    fn atom_word_id(&mut self, env: Env, word: Word) -> Result<u32, EncodeError> {
        if let Some((_, id)) = self.recent_atoms.iter().find(|(w, _)| *w == word) {
            return Ok(*id);
        }
        // SAFETY: `word` is the word of an atom, a term of `env` (the
        // callers' promise); an atom is an immediate, valid in any env.
        let atom =
            Atom::from_term(unsafe { term_of(env, word) }).map_err(|_| EncodeError::Unsupported)?;
        let id = self.atoms.id_of(env, atom)?;
        self.recent_atoms[self.recent_next] = (word, id);
        self.recent_next = (self.recent_next + 1) % self.recent_atoms.len();
        Ok(id)
    }

    /// A map inside a key: pairs sorted by the key's encoding, so equal maps
    /// encode alike whatever their internal order.
    fn canonical_map<'a>(
        &mut self,
        env: Env<'a>,
        map: Term<'a>,
        w: &mut Writer,
    ) -> Result<(), EncodeError> {
        if self.map_depth >= MAX_MAP_DEPTH {
            return Err(EncodeError::TooDeep);
        }
        self.map_depth += 1;
        let encoded = self.map_pairs(env, map);
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
        map: Term<'a>,
    ) -> Result<Vec<EncodedPair>, EncodeError> {
        let mut encoded = Vec::new();
        for (k, v) in MapIterator::new(map).ok_or(EncodeError::Unsupported)? {
            self.spend(1)?;
            let mut kw = Writer::new();
            self.term(env, k, &mut kw, true)?;
            let mut vw = Writer::new();
            self.term(env, v, &mut vw, true)?;
            encoded.push((kw.buf, vw.buf));
        }
        Ok(encoded)
    }

    fn backref(&self, word: Word, w: &mut Writer, canonical: bool) -> bool {
        if canonical {
            return false;
        }
        match self.walk.seen.get(word) {
            Some(id) => {
                w.backref(id);
                true
            }
            None => false,
        }
    }

    /// Writes an etf piece: a compound (id, no children) for the merge.
    fn etf(
        &mut self,
        t: Term,
        w: &mut Writer,
        canonical: bool,
    ) -> Result<Option<(u32, usize)>, EncodeError> {
        let bin = t.to_binary();
        self.spend(bin.len() / 64)?;
        self.saw_vm_ref |= crate::vm_refs::seen(bin.as_slice());
        let id = w.etf(bin.as_slice());
        Ok((!canonical).then_some((id, 0)))
    }
}

/// Where the bytes of the encoded key `key` start, if it is a `binary`.
fn binary_start(key: &[u8]) -> Option<usize> {
    let mut r = Reader::new(key);
    (r.u8().ok()? == tag::BINARY).then_some(())?;
    let n = r.count(1).ok()?;
    (r.remaining() == n).then(|| r.position())
}

/// True if the term holds a float -0.0 anywhere (such a key is stored
/// exactly in the body, since its canonical form says 0.0).
fn contains_neg_zero(t: Term) -> bool {
    contains_zero(t, true)
}

/// True if a key read back from its canonical form may differ from the key
/// as stored: it holds a float 0.0, which may have been -0.0.
pub fn key_may_be_inexact(t: Term) -> bool {
    contains_zero(t, false)
}

/// True if the term holds a float 0.0 or -0.0 on a VM where they are one
/// (`=:=`): two terms `=:=` to each other may then still differ in the
/// sign of a zero.
pub fn holds_mergeable_zero(t: Term) -> bool {
    contains_zero(t, false)
}

/// True if the term holds a float zero (only -0.0 when `negative_only`),
/// on VMs where -0.0 and 0.0 are one key.
fn contains_zero(t: Term, negative_only: bool) -> bool {
    NEG_ZERO_IS_ZERO.load(Ordering::Relaxed) && holds_zero(t, negative_only)
}

/// True if the term holds a float 0.0 or -0.0, whatever the VM's rule: a
/// key whose stored form depends on the rule (migrate.rs).
pub fn holds_float_zero(t: Term) -> bool {
    holds_zero(t, false)
}

/// True if the term holds a float zero (only -0.0 when `negative_only`).
fn holds_zero(t: Term, negative_only: bool) -> bool {
    let zero = |t: Term| {
        t.decode::<f64>()
            .is_ok_and(|f| f == 0.0 && (f.is_sign_negative() || !negative_only))
    };
    // Most keys hold no other term: no stack for them.
    match t.get_type() {
        TermType::Tuple | TermType::List | TermType::Map => {}
        TermType::Float => return zero(t),
        _ => return false,
    }
    let env = t.get_env();
    let mut stack = vec![t];
    while let Some(t) = stack.pop() {
        match t.get_type() {
            TermType::Float if zero(t) => return true,
            TermType::Tuple => {
                for &e in tuple_words(t).unwrap_or_default() {
                    // SAFETY: an element of a tuple alive in `env`.
                    stack.push(unsafe { term_of(env, e) });
                }
            }
            TermType::List => {
                let mut rest = t;
                while let Ok((h, tail)) = rest.list_get_cell() {
                    stack.push(h);
                    rest = tail;
                }
                // An improper tail is a term of its own; [] has nothing.
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

/// Decodes `bytes` (a record body with its `key`, or a key alone with
/// `key = None`) into a term of `env`. `canonical` says the bytes hold no
/// back-references whatever their first tag (keys, bodies of bag tables);
/// see heft_core's `codec::decode_record` for how that and the body's own
/// flag choose the lean decoder.
pub fn decode<'a>(
    env: Env<'a>,
    atoms: &AtomCache,
    bytes: &[u8],
    key: Option<&[u8]>,
    canonical: bool,
) -> Result<Term<'a>, DecodeError> {
    let decoded = POOL.with(|p| match p.try_borrow_mut() {
        // The pool's buffers are used in place (no copy in and out); only
        // a decode nested in another (never expected) brings its own.
        Ok(mut pool) => decode_in(env, atoms, bytes, key, canonical, &mut pool.build),
        Err(_) => decode_in(env, atoms, bytes, key, canonical, &mut BuildBufs::default()),
    });
    // SAFETY: every word the decoder returns was made by the builder's own
    // enif calls on `env` during this call (the decoder empties its scratch
    // space first, so no word from an earlier call can come back).
    decoded.map(|w| unsafe { term_of(env, w) })
}

fn decode_in(
    env: Env,
    atoms: &AtomCache,
    bytes: &[u8],
    key: Option<&[u8]>,
    canonical: bool,
    bufs: &mut BuildBufs,
) -> Result<Word, DecodeError> {
    let BuildBufs {
        scratch,
        keys,
        values,
    } = bufs;
    let mut b = TermBuilder {
        env,
        raw_env: env.as_c_arg(),
        atoms,
        nil: None,
        keys,
        values,
    };
    decode_record(bytes, key, canonical, &mut b, scratch)
}

/// Builds BEAM terms in `env`, as words.
struct TermBuilder<'a, 'c> {
    env: Env<'a>,
    raw_env: *mut sys::ErlNifEnv,
    atoms: &'c AtomCache,
    /// `[]`, once made.
    nil: Option<Word>,
    /// A map's keys and values, split for enif_make_map_from_arrays.
    keys: &'c mut Vec<Word>,
    values: &'c mut Vec<Word>,
}

impl Builder for TermBuilder<'_, '_> {
    type Term = Word;

    #[inline]
    fn nil(&mut self) -> Result<Word, DecodeError> {
        Ok(*self.nil.get_or_insert_with(|| {
            // SAFETY: an empty list needs no elements; the env is this call's.
            unsafe { sys::enif_make_list_from_array(self.raw_env, std::ptr::null(), 0) }
        }))
    }

    #[inline]
    fn int(&mut self, v: i64) -> Result<Word, DecodeError> {
        // SAFETY: makes an integer in this call's env.
        Ok(unsafe { sys::enif_make_int64(self.raw_env, v) })
    }

    #[inline]
    fn float(&mut self, v: f64) -> Result<Word, DecodeError> {
        // SAFETY: makes a float in this call's env (`v` is finite: the
        // decoder refuses NaN and infinities).
        Ok(unsafe { sys::enif_make_double(self.raw_env, v) })
    }

    #[inline]
    fn atom(&mut self, id: u32) -> Result<Word, DecodeError> {
        // Atoms are global to the VM: their words hold in any env.
        self.atoms
            .atom_word(self.env, id)
            .ok_or(DecodeError::Builder(
                "atom id not in the table's dictionary",
            ))
    }

    #[inline]
    fn binary(&mut self, bytes: &[u8]) -> Result<Word, DecodeError> {
        let mut out = Word::default();
        // SAFETY: the VM allocates `bytes.len()` bytes for a new binary in
        // this env and returns them (or null), writing its term to `out`.
        let data = unsafe { sys::enif_make_new_binary(self.raw_env, bytes.len(), &mut out) };
        if data.is_null() {
            return Err(DecodeError::Builder("binary allocation failed"));
        }
        // SAFETY: `data` points to `bytes.len()` writable bytes of the new
        // binary, which cannot overlap `bytes` (stored record data).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), data, bytes.len()) };
        Ok(out)
    }

    fn etf(&mut self, bytes: &[u8]) -> Result<Word, DecodeError> {
        self.env
            .binary_to_term(bytes)
            .filter(|(_, used)| *used == bytes.len())
            .map(|(t, _)| t.as_c_arg())
            .ok_or(DecodeError::Builder(
                "unreadable external term format piece",
            ))
    }

    #[inline]
    fn tuple(&mut self, elems: &[Word]) -> Result<Word, DecodeError> {
        let n = u32::try_from(elems.len()).map_err(|_| DecodeError::Builder("tuple too large"))?;
        // SAFETY: `elems` is a live slice of `n` words built in this env;
        // the VM copies them into the new tuple.
        Ok(unsafe { sys::enif_make_tuple_from_array(self.raw_env, elems.as_ptr(), n) })
    }

    fn list(&mut self, elems: &[Word], tail: Word) -> Result<Word, DecodeError> {
        let env = self.raw_env;
        // `[]` is one word, the same wherever it was made.
        if tail == self.nil()? {
            let n =
                u32::try_from(elems.len()).map_err(|_| DecodeError::Builder("list too long"))?;
            // SAFETY: a live slice of `n` words built in this env.
            return Ok(unsafe { sys::enif_make_list_from_array(env, elems.as_ptr(), n) });
        }
        // SAFETY: each cell is made of words built in this env.
        Ok(elems.iter().rev().fold(tail, |acc, e| unsafe {
            sys::enif_make_list_cell(env, *e, acc)
        }))
    }

    fn map(&mut self, kvs: &[Word]) -> Result<Word, DecodeError> {
        self.keys.clear();
        self.values.clear();
        for pair in kvs.chunks_exact(2) {
            self.keys.push(pair[0]);
            self.values.push(pair[1]);
        }
        let mut out = Word::default();
        // SAFETY: two live slices of equal length of words built in this
        // env; `out` is a local the VM writes on success.
        let ok = unsafe {
            sys::enif_make_map_from_arrays(
                self.raw_env,
                self.keys.as_ptr(),
                self.values.as_ptr(),
                self.keys.len(),
                &mut out,
            )
        };
        if ok == 0 {
            return Err(DecodeError::Builder("map with duplicate keys"));
        }
        Ok(out)
    }
}
