//! The NIFs behind select_delete, select_replace and friends
//! (lib/heft/select.ex): batch deletes and replaces that act on an object
//! only if it is still exactly the object the match specification saw,
//! each one a compare-and-swap on the stored record ([`Table::replace_if`]).
//! Objects compare by their canonical encodings, which are equal exactly
//! when the terms are (`=:=`).
//!
//! [`Table::replace_if`]: heft_core::Table::replace_if

use heft_core::codec;
use heft_core::table::{Error as CoreError, Item, Kind, RecordBuf};
use rustler::{Encoder, Env, NifResult, Term};

use crate::codec::{EncodeError, TermEncoder};
use crate::errors::{self, badarg, retry_cpu};
use crate::ops::{
    decode_cursor, decode_item, encode_cursor, open, prepare_object, prepare_object_exactly,
    record_elems, resolve, write_variants, Sched,
};
use crate::resource::TableRes;

write_variants!(timed delete_objects_impl => delete_objects, delete_objects_cpu, delete_objects_io (tab, objs));
write_variants!(timed replace_objects_impl => replace_objects, replace_objects_cpu, replace_objects_io (tab, pairs));
write_variants!(timed delete_arity_impl => delete_arity, delete_arity_cpu, delete_arity_io (tab, arity, cursor));

/// `{keypos, ordered?}`, after checking that the caller may read the table
/// (or write it, with `write`): select functions raise as ETS does even
/// when nothing would match. Takes no lock, so it never waits.
#[rustler::nif]
fn select_access(env: Env, tab: Term, write: bool) -> NifResult<(usize, bool)> {
    let t = resolve(tab)?;
    let allowed = if write {
        t.may_write(env)
    } else {
        t.may_read(env)
    };
    if !allowed {
        return Err(badarg(if write {
            "the table is not writable by this process"
        } else {
            "the table is private to its owner"
        }));
    }
    Ok((t.keypos, t.core.kind() == Kind::OrderedSet))
}

mod atoms {
    rustler::atoms! { more }
}

/// Opens the table for writing on a dirty scheduler: batches go there at
/// once (each object costs a lookup, a decode and two encodings, and a
/// batch must not be cut short half done; `delete_objects` takes a short
/// list on the normal scheduler an object at a time instead).
macro_rules! open_dirty {
    ($env:expr, $tab:expr, $sched:expr) => {
        match open($env, $tab, $sched, true)? {
            Ok(_) if $sched == Sched::Normal => return Ok(retry_cpu($env)),
            Ok(t) => t,
            Err(retry) => return Ok(retry),
        }
    };
}

fn list(objs: Term) -> NifResult<Vec<Term>> {
    objs.decode().map_err(|_| badarg("not a proper list"))
}

/// The value of an encoding, or `Ok(Err(e))` from the enclosing function:
/// encodings stop (`TooBig` on a budget) before anything is changed.
macro_rules! enc {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => return Ok(Err(e)),
        }
    };
}

/// An encoding error as a NIF error (no budget, so only `Unsupported`).
fn unbudgeted<T>(r: Result<T, EncodeError>) -> NifResult<T> {
    r.map_err(|_| badarg("a term Heft cannot store"))
}

/// What is stored under an object's key.
struct Seen {
    key: Vec<u8>,
    hash: u64,
    /// The stored record (copied into the caller's buffer) if it is the
    /// object exactly.
    item: Option<Item>,
}

/// How an object given is compared with the stored ones.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Same {
    /// `=:=`, as `delete_object/2` compares (on OTP 26 and older `0.0` and
    /// `-0.0` are then equal).
    Equal,
    /// Bit for bit, the sign of a zero included: the object a match
    /// specification matched (`select_delete`, `select_replace`), as ETS
    /// acts on the very object its matcher saw.
    Exactly,
}

impl Same {
    fn holds<'a>(self, stored: Term<'a>, obj: Term<'a>) -> bool {
        stored == obj
            && (self == Same::Equal
                || !crate::codec::holds_mergeable_zero(obj)
                || stored.to_binary().as_slice() == obj.to_binary().as_slice())
    }
}

/// Looks `obj` up by its key, copying the stored record into `buf`.
fn find_exact<'a>(
    env: Env<'a>,
    t: &TableRes,
    enc: &mut TermEncoder,
    obj: Term<'a>,
    how: Same,
    buf: &mut RecordBuf,
) -> NifResult<Result<Seen, EncodeError>> {
    let elems = record_elems(obj, t.keypos)?;
    let key = enc!(enc.key(env, elems[t.keypos - 1]));
    let hash = t.core.hash(&key);
    buf.clear();
    let mut item = None;
    t.core.get(hash, &key, buf).map_err(errors::core)?;
    // Decoding costs about as much as encoding half its bytes (a term
    // node for every two): a normal scheduler's budget bounds it too.
    let raw: usize = buf.items().iter().map(|it| it.header.raw_len).sum();
    enc!(enc.spend(raw / 2));
    // The key's first object that is `obj` exactly (a bag may hold several
    // objects of a key): `=:=`, the VM's own comparison, which needs no
    // canonical encoding of the whole object (values may nest maps deeper
    // than a key may).
    let mut scratch = Vec::new();
    for it in buf.items() {
        let stored = decode_item(env, t, buf, it, &mut scratch)?;
        if how.holds(stored, obj) {
            item = Some(*it);
            break;
        }
    }
    Ok(Ok(Seen { key, hash, item }))
}

/// Deletes `obj` if the table holds it (compared `how`), with a
/// compare-and-swap so that a concurrent rewrite is never undone (in a
/// bag, every object of the key is compared under the table's lock; a
/// duplicate_bag loses every copy); returns how many objects it deleted.
/// `delete_object/2` and `select_delete/2` share it.
pub(crate) fn delete_exact<'a>(
    env: Env<'a>,
    t: &TableRes,
    enc: &mut TermEncoder,
    obj: Term<'a>,
    how: Same,
) -> NifResult<Result<usize, EncodeError>> {
    if t.core.kind().is_bag() {
        let elems = record_elems(obj, t.keypos)?;
        let object = enc!(match how {
            Same::Equal => prepare_object(env, t, &elems, enc),
            Same::Exactly => prepare_object_exactly(env, t, &elems, enc),
        });
        return Ok(Ok(t.core.remove_object(&object).map_err(errors::core)?));
    }
    let mut buf = RecordBuf::new();
    loop {
        let seen = enc!(find_exact(env, t, enc, obj, how, &mut buf)?);
        let Some(it) = seen.item else {
            return Ok(Ok(0));
        };
        let swapped = t
            .core
            .replace_if(seen.hash, &seen.key, Some((&buf, &it)), None)
            .map_err(errors::core)?;
        if swapped {
            return Ok(Ok(1));
        }
        // Rewritten between our read and the swap: look again.
    }
}

/// Objects a normal-scheduler `delete_objects` takes on; a longer list
/// goes to a dirty scheduler at once.
const QUICK_OBJECTS: usize = 64;

/// Deletes each object of the list that is in the table exactly as given;
/// returns how many it deleted.
///
/// A short list of a set's or ordered_set's is deleted on the normal
/// scheduler (a hop to a dirty one costs more than deleting a few
/// objects), an object at a time within
/// its budget: where the next object would go beyond it (or must wait for
/// the log, or resize a large index) the call returns `{:more, deleted,
/// rest}`, the objects from that one on left for another call. An object
/// is never half done, and the first one's refusal is the retry marker,
/// so each call makes progress or moves the list to a dirty scheduler.
fn delete_objects_impl<'a>(
    env: Env<'a>,
    sched: Sched,
    tab: Term<'a>,
    objs: Term<'a>,
) -> NifResult<Term<'a>> {
    let objs = list(objs)?;
    if sched == Sched::Normal {
        let t = match open(env, tab, sched, true)? {
            Ok(t) => t,
            Err(retry) => return Ok(retry),
        };
        // A bag's delete compares the object with each of its key's (a key
        // may have very many): bags' lists go to a dirty scheduler.
        if objs.len() > QUICK_OBJECTS || t.core.kind().is_bag() {
            return Ok(retry_cpu(env));
        }
        let mut enc = TermEncoder::new(&t.atoms, sched.budget());
        let mut deleted = 0usize;
        for (i, &obj) in objs.iter().enumerate() {
            // Why this object was refused, before it changed anything: the
            // marker of the scheduler that can take it.
            let retry = match delete_exact(env, &t, &mut enc, obj, Same::Exactly) {
                Ok(Ok(n)) => {
                    deleted += n;
                    continue;
                }
                Ok(Err(EncodeError::TooBig)) => retry_cpu(env),
                Ok(Err(e)) => return Err(badarg(e.message())),
                Err(_) if errors::take_would_block() => errors::retry_io(env),
                Err(_) if errors::take_too_long() => retry_cpu(env),
                Err(e) => return Err(e),
            };
            if i == 0 {
                return Ok(retry);
            }
            return Ok((atoms::more(), deleted, objs[i..].to_vec()).encode(env));
        }
        return Ok(deleted.encode(env));
    }
    let t = open_dirty!(env, tab, sched);
    let mut enc = TermEncoder::new(&t.atoms, usize::MAX);
    let mut deleted = 0usize;
    for obj in objs {
        // A log that needs a new segment first: make room here and go on
        // (running the whole list again would miscount).
        let done = loop {
            match delete_exact(env, &t, &mut enc, obj, Same::Exactly) {
                Err(_) if errors::take_would_block() => crate::persist::make_room(&t)?,
                r => break r?,
            }
        };
        deleted += unbudgeted(done)?;
    }
    Ok(deleted.encode(env))
}

/// For each `{new, old}`, replaces `old` by `new` if `old` is in the table
/// exactly as given. The caller guarantees that `new` has `old`'s key.
/// Returns `{replaced, lost}`: the count, and the `old` objects that were
/// no longer in the table.
fn replace_objects_impl<'a>(
    env: Env<'a>,
    sched: Sched,
    tab: Term<'a>,
    pairs: Term<'a>,
) -> NifResult<Term<'a>> {
    let t = open_dirty!(env, tab, sched);
    let mut enc = TermEncoder::new(&t.atoms, usize::MAX);
    let mut buf = RecordBuf::new();
    let mut replaced = 0usize;
    let mut lost = Vec::new();
    for pair in list(pairs)? {
        let (new, old): (Term, Term) =
            pair.decode().map_err(|_| badarg("not a {new, old} pair"))?;
        let elems = record_elems(new, t.keypos)?;
        // Written as the table writes objects (canonically in a bag).
        let prepared = unbudgeted(prepare_object(env, &t, &elems, &mut enc))?;
        loop {
            let seen = unbudgeted(find_exact(env, &t, &mut enc, old, Same::Exactly, &mut buf)?)?;
            if seen.key != prepared.key() {
                return Err(badarg("a replacement changes the object's key"));
            }
            let Some(it) = seen.item else {
                lost.push(old);
                break;
            };
            let expected = Some((&buf, &it));
            let swapped = loop {
                match t
                    .core
                    .replace_if(seen.hash, &seen.key, expected, Some(&prepared))
                {
                    Err(CoreError::WouldBlock) => crate::persist::make_room(&t)?,
                    r => break r.map_err(errors::core)?,
                }
            };
            if swapped {
                replaced += 1;
                break;
            }
        }
    }
    Ok((replaced, lost).encode(env))
}

/// Records a `delete_arity` call looks at: a few milliseconds of the
/// table's write lock.
const ARITY_CHUNK: usize = 16_384;

/// Deletes, of the next chunk of objects after `cursor` (`:start` first),
/// those that are tuples of `arity` elements, without decoding them: what
/// `select_delete` of a spec `[{{_, ..., _}, [], [true]}]` (and
/// `match_delete(t, {_, ..., _})`) deletes. `{deleted, cursor}`, the
/// cursor `:"$end_of_table"` after the last chunk.
fn delete_arity_impl<'a>(
    env: Env<'a>,
    sched: Sched,
    tab: Term<'a>,
    arity: Term<'a>,
    cursor: Term<'a>,
) -> NifResult<Term<'a>> {
    let t = open_dirty!(env, tab, sched);
    let arity: u64 = arity.decode().map_err(|_| badarg("not an arity"))?;
    let after = decode_cursor(cursor)?;
    let (deleted, next) = t
        .core
        .remove_chunk(after.as_ref(), ARITY_CHUNK, |body| {
            codec::tuple_arity(body) == Some(arity)
        })
        .map_err(errors::core)?;
    Ok((deleted, encode_cursor(env, next)).encode(env))
}
