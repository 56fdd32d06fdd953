//! Compaction (heft_core table/compact.rs): `Heft.compact/1`, the
//! automatic runs a write starts, and the info/1 item about them.

use heft_core::table::{self, Compacted, Compactions, Error};
use heft_core::Table;
use rustler::{Atom, Encoder, Env, LocalPid, NifResult, OwnedEnv, Term};

use crate::errors::badarg;
use crate::learn::map;
use crate::ops::resolve_arc;

mod atoms {
    rustler::atoms! {
        ok,
        error,
        deleted,
        compaction_failed,
        heft_compacted,
        state,
        idle,
        running,
        runs,
        moved_records,
        moved_bytes,
        returned_bytes,
        longest_lock_hold_us,
        compaction,
    }
}

/// Queues an automatic compaction if the write just made made one due.
pub fn after_write(core: &Table) {
    let _ = core.compaction_due();
}

/// A [`Compacted`]'s figures, by name.
fn figures<'a>(env: Env<'a>, c: &Compacted) -> [(Atom, Term<'a>); 4] {
    [
        (atoms::moved_records(), c.moved_records.encode(env)),
        (atoms::moved_bytes(), c.moved_bytes.encode(env)),
        (atoms::returned_bytes(), c.returned_bytes.encode(env)),
        (
            atoms::longest_lock_hold_us(),
            c.longest_lock_hold_us.encode(env),
        ),
    ]
}

/// Compacts the table on the compactor's thread; `:ok` at once, then
/// `{:heft_compacted, tag, {:ok, %{moved_records, moved_bytes,
/// returned_bytes, longest_lock_hold_us}} | {:error, :deleted |
/// :compaction_failed}}` to the caller. Needs read
/// access: a compaction changes no record.
#[rustler::nif]
fn compact<'a>(env: Env<'a>, tab: Term<'a>, tag: u64) -> NifResult<Term<'a>> {
    let t = resolve_arc(tab)?;
    if !t.may_read(env) {
        return Err(badarg(
            "the table is private: only its owner may compact it",
        ));
    }
    let pid: LocalPid = env.pid();
    let done: table::CompactDone = Box::new(move |r| {
        let mut owned = OwnedEnv::new();
        let _ = owned.send_and_clear(&pid, |env| {
            let result = match &r {
                Ok(c) => (atoms::ok(), map(env, &figures(env, c))).encode(env),
                Err(Error::Deleted) => (atoms::error(), atoms::deleted()).encode(env),
                Err(_) => (atoms::error(), atoms::compaction_failed()).encode(env),
            };
            (atoms::heft_compacted(), tag, result).encode(env)
        });
    });
    if table::compact_now(&t.core, done) {
        Ok(atoms::ok().encode(env))
    } else {
        Err(badarg("the compactor's thread could not be started"))
    }
}

/// The info/1 item `:compaction`.
pub fn info_item<'a>(env: Env<'a>, core: &Table) -> (Term<'a>, Term<'a>) {
    let Compactions {
        running,
        runs,
        total,
    } = core.compactions();
    let state = if running {
        atoms::running()
    } else {
        atoms::idle()
    };
    let mut pairs = vec![
        (atoms::state(), state.encode(env)),
        (atoms::runs(), runs.encode(env)),
    ];
    pairs.extend(figures(env, &total));
    (atoms::compaction().encode(env), map(env, &pairs))
}
