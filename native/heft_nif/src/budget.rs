//! Budgets (heft_core table/evict.rs): the `max_bytes` and `max_records`
//! options and the info/1 item `:budget`.

use heft_core::table::{Budget, Stats};
use rustler::{Encoder, Env, NifResult, Term};

use crate::errors::badarg;
use crate::learn::map;

mod atoms {
    rustler::atoms! {
        nil,
        budget,
        max_bytes,
        max_records,
        used_bytes,
        queue_bytes,
        evicted_keys,
        evicted_records,
        hits,
        misses,
    }
}

/// The budget as Heft.new/2 passes it: `{max_bytes, max_records}`, each a
/// positive integer or `nil`.
pub fn budget_of(term: Term) -> NifResult<Budget> {
    let bound = |t: Term| -> NifResult<Option<u64>> {
        if t.decode::<rustler::Atom>().is_ok_and(|a| a == atoms::nil()) {
            return Ok(None);
        }
        match t.decode::<u64>() {
            Ok(n) if n > 0 => Ok(Some(n)),
            _ => Err(badarg("malformed budget")),
        }
    };
    let (bytes, records): (Term, Term) = term.decode().map_err(|_| badarg("malformed budget"))?;
    Ok(Budget {
        max_bytes: bound(bytes)?,
        max_records: bound(records)?,
    })
}

/// The info/1 item `:budget`: `nil` for an unbounded table.
pub fn info_item<'a>(env: Env<'a>, s: &Stats) -> (Term<'a>, Term<'a>) {
    let b = s.budget;
    let value = if b.is_none() {
        atoms::nil().encode(env)
    } else {
        let opt = |v: Option<u64>| match v {
            Some(n) => n.encode(env),
            None => atoms::nil().encode(env),
        };
        map(
            env,
            &[
                (atoms::max_bytes(), opt(b.max_bytes)),
                (atoms::max_records(), opt(b.max_records)),
                (atoms::used_bytes(), s.budget_used_bytes.encode(env)),
                (atoms::queue_bytes(), s.eviction_bytes.encode(env)),
                (atoms::evicted_keys(), s.evicted_keys.encode(env)),
                (atoms::evicted_records(), s.evicted_records.encode(env)),
                (atoms::hits(), s.hits.encode(env)),
                (atoms::misses(), s.misses.encode(env)),
            ],
        )
    };
    (atoms::budget().encode(env), value)
}
