//! Budgets (heft_core table/evict.rs): the `max_bytes` and `max_records`
//! options and the info/1 item `:budget`; expiry (table/expire.rs): the
//! `ttl` option, a write's `ttl:` and the info/1 item `:expiry`.

use heft_core::table::{Budget, Stats, Ttl};
use rustler::{Atom, Encoder, Env, NifResult, Term};

use crate::errors::badarg;
use crate::learn::map;

mod atoms {
    rustler::atoms! {
        budget,
        max_bytes,
        max_records,
        used_bytes,
        queue_bytes,
        evicted_keys,
        evicted_records,
        hits,
        misses,
        expiry,
        ttl,
        expiring_keys,
        expired_keys,
        expired_records,
        bytes,
        infinity,
        table,
        tier,
        memory_budget,
        memory_used_bytes,
        memory_live_bytes,
        file_used_bytes,
        file_live_bytes,
        moved_records,
        moved_bytes,
        file_reads,
        file_read_bytes,
    }
}

/// The info/1 item `:tier`: `nil` but for a tiered table (`arena: {:file,
/// dir, memory: n}`).
pub fn tier_item<'a>(env: Env<'a>, s: &Stats) -> (Term<'a>, Term<'a>) {
    let value = match &s.tier {
        None => rustler::types::atom::nil().encode(env),
        Some(t) => map(
            env,
            &[
                (atoms::memory_budget(), t.memory_budget.encode(env)),
                (atoms::memory_used_bytes(), t.memory_used_bytes.encode(env)),
                (atoms::memory_live_bytes(), t.memory_live_bytes.encode(env)),
                (atoms::file_used_bytes(), t.file_used_bytes.encode(env)),
                (atoms::file_live_bytes(), t.file_live_bytes.encode(env)),
                (atoms::moved_records(), t.moved_records.encode(env)),
                (atoms::moved_bytes(), t.moved_bytes.encode(env)),
                (atoms::queue_bytes(), t.queue_bytes.encode(env)),
                (atoms::file_reads(), t.file_reads.encode(env)),
                (atoms::file_read_bytes(), t.file_read_bytes.encode(env)),
            ],
        ),
    };
    (atoms::tier().encode(env), value)
}

/// The table's time to live as Heft.new/2 passes it: `nil` or a positive
/// integer (milliseconds).
pub fn ttl_of(term: Term) -> NifResult<Option<u64>> {
    match term.decode::<Option<u64>>() {
        Ok(ttl) if ttl != Some(0) => Ok(ttl),
        _ => Err(badarg("malformed ttl")),
    }
}

/// A write's `ttl:` as Heft.insert/3 passes it: `:table`, `:infinity` or
/// a non-negative integer (milliseconds).
pub fn write_ttl_of(term: Term) -> NifResult<Ttl> {
    if let Ok(ms) = term.decode::<u64>() {
        return Ok(Ttl::Millis(ms));
    }
    match term.decode::<Atom>() {
        Ok(a) if a == atoms::infinity() => Ok(Ttl::Never),
        Ok(a) if a == atoms::table() => Ok(Ttl::Table),
        _ => Err(badarg("malformed ttl")),
    }
}

/// The info/1 item `:expiry`: `nil` for a table without deadlines.
pub fn expiry_item<'a>(env: Env<'a>, s: &Stats) -> (Term<'a>, Term<'a>) {
    let value = if !s.expires {
        rustler::types::atom::nil().encode(env)
    } else {
        map(
            env,
            &[
                (atoms::ttl(), s.ttl.encode(env)),
                (atoms::expiring_keys(), s.expiring_keys.encode(env)),
                (atoms::expired_keys(), s.expired_keys.encode(env)),
                (atoms::expired_records(), s.expired_records.encode(env)),
                (atoms::bytes(), s.expiry_bytes.encode(env)),
            ],
        )
    };
    (atoms::expiry().encode(env), value)
}

/// The budget as Heft.new/2 passes it: `{max_bytes, max_records}`, each a
/// positive integer or `nil`.
pub fn budget_of(term: Term) -> NifResult<Budget> {
    match term.decode::<(Option<u64>, Option<u64>)>() {
        Ok((max_bytes, max_records)) if max_bytes != Some(0) && max_records != Some(0) => {
            Ok(Budget {
                max_bytes,
                max_records,
            })
        }
        _ => Err(badarg("malformed budget")),
    }
}

/// The info/1 item `:budget`: `nil` for an unbounded table.
pub fn info_item<'a>(env: Env<'a>, s: &Stats) -> (Term<'a>, Term<'a>) {
    let b = s.budget;
    let value = if b.is_none() {
        rustler::types::atom::nil().encode(env)
    } else {
        map(
            env,
            &[
                (atoms::max_bytes(), b.max_bytes.encode(env)),
                (atoms::max_records(), b.max_records.encode(env)),
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
