//! `Heft.Memory.sizing/3`'s codec predictions: the sample records encoded
//! as a new table would encode them (canonical key, body with the table's
//! fresh atom ids), then compressed with each codec by
//! `heft_core::sizing::predict` (which documents the figures).
//!
//! Training dictionaries and compressing a few thousand records takes
//! milliseconds to seconds: the NIF runs on a dirty CPU scheduler.

use std::sync::Arc;

use heft_core::atoms::AtomTable;
use heft_core::sizing::{self, Prediction};
use parking_lot::RwLock;
use rustler::{Encoder, Env, NifResult, Term};

use crate::admin::{compression_of, compression_term};
use crate::codec::{tuple_arity, TermEncoder};
use crate::errors::badarg;
use crate::resource::AtomCache;

mod atoms {
    rustler::atoms! {
        compression,
        records,
        raw_bytes,
        stored_bytes,
        arena_bytes,
        compressed,
        trained,
        dictionary_bytes,
        dictionary_memory,
        decode_ns,
    }
}

/// `sizing_predict(samples, keypos, bag, compressions, dictionary_bytes)`:
/// a map per compression (in the order given) with the keys of
/// [`Prediction`] as atoms (`compression` is the compression term,
/// `dictionary_bytes`/`dictionary_memory` the dictionary's). `bag`: encode
/// bodies as bag and duplicate_bag tables do (canonically). A sample that
/// is not a tuple of at least `keypos` elements, or an unknown compression,
/// is a badarg.
#[rustler::nif(schedule = "DirtyCpu")]
fn sizing_predict<'a>(
    env: Env<'a>,
    samples: Vec<Term<'a>>,
    keypos: usize,
    bag: bool,
    compressions: Vec<Term<'a>>,
    dictionary_bytes: usize,
) -> NifResult<Vec<Term<'a>>> {
    let modes = compressions
        .into_iter()
        .map(compression_of)
        .collect::<NifResult<Vec<_>>>()?;
    if keypos == 0 {
        return Err(badarg("keypos must be at least 1"));
    }
    // A table of its own: atom ids numbered from scratch, as in a new table.
    let atoms = AtomCache::new(Arc::new(RwLock::new(AtomTable::new())));
    let mut enc = TermEncoder::new(&atoms, usize::MAX);
    let mut encoded = Vec::with_capacity(samples.len());
    for s in samples {
        if !matches!(tuple_arity(s), Some(n) if n >= keypos) {
            return Err(badarg(format!(
                "a sample that is not a tuple of at least {keypos} elements"
            )));
        }
        enc.record_tuple(env, s, keypos, bag)
            .map_err(|e| badarg(e.message()))?;
        encoded.push((enc.encoded_key().to_vec(), enc.encoded_body().to_vec()));
    }
    Ok(modes
        .into_iter()
        .map(|mode| prediction_term(env, &sizing::predict(&encoded, mode, dictionary_bytes)))
        .collect())
}

fn prediction_term<'a>(env: Env<'a>, p: &Prediction) -> Term<'a> {
    let pairs: [(Term<'a>, Term<'a>); 10] = [
        (
            atoms::compression().encode(env),
            compression_term(env, p.mode),
        ),
        (atoms::records().encode(env), p.records.encode(env)),
        (atoms::raw_bytes().encode(env), p.raw_bytes.encode(env)),
        (
            atoms::stored_bytes().encode(env),
            p.stored_bytes.encode(env),
        ),
        (atoms::arena_bytes().encode(env), p.arena_bytes.encode(env)),
        (atoms::compressed().encode(env), p.compressed.encode(env)),
        (atoms::trained().encode(env), p.trained.encode(env)),
        (
            atoms::dictionary_bytes().encode(env),
            p.dict_bytes.encode(env),
        ),
        (
            atoms::dictionary_memory().encode(env),
            p.dict_memory.encode(env),
        ),
        (atoms::decode_ns().encode(env), p.decode_ns.encode(env)),
    ];
    Term::map_from_pairs(env, &pairs).expect("distinct keys")
}
