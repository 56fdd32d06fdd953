//! Keys stored under the other zero rule. Up to OTP 26, `0.0 =:= -0.0`
//! and a key holding -0.0 is stored in its canonical form with 0.0 (the
//! exact key stays in the record's body, codec.rs); from OTP 27 the two are
//! different keys and -0.0 is stored as it is. A persistent table records
//! the rule it was written under in its META (docs/persistence-format.md);
//! opened on a VM of the other rule (lib/heft/persist.ex), its records whose
//! stored key is not the canonical form of their exact key on this VM are
//! found here and moved: the object is inserted under the right key, then
//! the record under the old one is removed (both logged, in that order, so
//! a crash between them leaves the object twice, which the next open's
//! migration resolves the same way). An ordered_set needs none of this:
//! its keys compare with `==`, for which 0.0 and -0.0 are one on every
//! release.

use heft_core::table::{Kind, RecordBuf};
use rustler::types::tuple::get_tuple;
use rustler::{Encoder, Env, NifResult, Term};

use crate::codec::{self, TermEncoder};
use crate::errors::{self, badarg};
use crate::ops::{decode_cursor, decode_item, decode_key, encode_cursor, prepare_tuple, resolve};

/// Records looked at in one call: a few milliseconds on the dirty
/// scheduler.
const CHUNK: usize = 4096;

/// `zero_keys_cpu(tab, cursor, apply)`: looks at the next chunk of records
/// after `cursor` (`:start` first) and returns `{misfiled, conflicts,
/// cursor}`, the cursor `:"$end_of_table"` after the last chunk. With
/// `apply`, moves each misfiled record to its key on this VM. A conflict is
/// a misfiled record whose key on this VM is already taken (keys that were
/// two become one): moving it would lose an object, so the caller refuses
/// the table instead (it never applies with conflicts).
#[rustler::nif(schedule = "DirtyCpu")]
fn zero_keys_cpu<'a>(
    env: Env<'a>,
    tab: Term<'a>,
    cursor: Term<'a>,
    apply: bool,
) -> NifResult<Term<'a>> {
    let t = resolve(tab)?;
    if t.core.kind() == Kind::OrderedSet {
        let end = encode_cursor(env, None);
        return Ok((0usize, 0usize, end).encode(env));
    }
    let after = decode_cursor(cursor)?;
    let mut buf = RecordBuf::new();
    let next = t
        .core
        .chunk(after.as_ref(), CHUNK, usize::MAX, &mut buf)
        .map_err(errors::core)?;
    let mut enc = TermEncoder::new(&t.atoms, usize::MAX);
    let (mut misfiled, mut conflicts, mut scratch) = (0usize, 0usize, Vec::new());
    let mut other = RecordBuf::new();
    for it in buf.items() {
        let stored = buf.key(it);
        if !codec::holds_float_zero(decode_key(env, &t, stored)?) {
            continue;
        }
        let obj = decode_item(env, &t, &buf, it, &mut scratch)?;
        let elems = get_tuple(obj).map_err(|_| badarg("a stored object is not a tuple"))?;
        let want = enc
            .key(env, elems[t.keypos - 1])
            .map_err(|e| badarg(e.message()))?;
        if want == stored {
            continue;
        }
        misfiled += 1;
        if loses_object(env, &t, &want, obj, &mut other, &mut scratch)? {
            conflicts += 1;
        }
        if apply {
            let moved = prepare_tuple(env, &t, obj, &mut enc).map_err(|e| badarg(e.message()))?;
            t.core.insert(&[moved]).map_err(errors::core)?;
            let hash = t.core.hash(stored);
            t.core
                .replace_if(hash, stored, Some((&buf, it)), None)
                .map_err(errors::core)?;
        }
    }
    Ok((misfiled, conflicts, encode_cursor(env, next)).encode(env))
}

/// Whether moving `obj` to the key `want` would lose an object: in a set
/// the key holds another object; in a bag an object `=:=` to it but not bit
/// for bit the same (the bag would take them for one). An object the same
/// bit for bit is one an interrupted migration moved already.
fn loses_object<'a>(
    env: Env<'a>,
    t: &crate::resource::TableRes,
    want: &[u8],
    obj: Term<'a>,
    buf: &mut RecordBuf,
    scratch: &mut Vec<u8>,
) -> NifResult<bool> {
    buf.clear();
    if !t
        .core
        .get(t.core.hash(want), want, buf)
        .map_err(errors::core)?
    {
        return Ok(false);
    }
    let bits = obj.to_binary();
    for it in buf.items() {
        let there = decode_item(env, t, buf, it, scratch)?;
        if there.to_binary().as_slice() == bits.as_slice() {
            return Ok(false);
        }
        if !t.core.kind().is_bag() || same_merging_zeros(there, obj) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// `=:=` as a bag of this VM's rule compares objects: where 0.0 and -0.0
/// are one ([`codec::NEG_ZERO_IS_ZERO`]), floats compare by value all the
/// way down (the VM's own `=:=` does too on OTP 26 and older; a test that
/// plays that rule on a later VM needs it spelt out). Maps compare as the
/// VM compares them.
fn same_merging_zeros<'a>(a: Term<'a>, b: Term<'a>) -> bool {
    use rustler::TermType;
    if a == b {
        return true;
    }
    if !codec::NEG_ZERO_IS_ZERO.load(std::sync::atomic::Ordering::Relaxed) {
        return false;
    }
    // Pairs still to compare: no recursion, however deep the terms nest.
    let mut pairs = vec![(a, b)];
    while let Some((x, y)) = pairs.pop() {
        if x == y {
            continue;
        }
        match (x.get_type(), y.get_type()) {
            (TermType::Float, TermType::Float) => {
                if x.decode::<f64>().ok() != y.decode::<f64>().ok() {
                    return false;
                }
            }
            (TermType::Tuple, TermType::Tuple) => match (get_tuple(x), get_tuple(y)) {
                (Ok(p), Ok(q)) if p.len() == q.len() => pairs.extend(p.into_iter().zip(q)),
                _ => return false,
            },
            (TermType::List, TermType::List) => match (x.list_get_cell(), y.list_get_cell()) {
                (Ok((h1, t1)), Ok((h2, t2))) => pairs.extend([(h1, h2), (t1, t2)]),
                _ => return false,
            },
            _ => return false,
        }
    }
    true
}

/// For tests only: sets whether -0.0 and 0.0 are one key (the rule learnt
/// at load) and returns the rule it replaces, so that a test can write a
/// table as a VM of the other rule would (lib/heft/vm.ex).
#[rustler::nif]
fn set_zero_rule(merged: bool) -> bool {
    codec::NEG_ZERO_IS_ZERO.swap(merged, std::sync::atomic::Ordering::Relaxed)
}
