//! What a table learns (heft_core table/learn.rs): `Heft.train_dictionary/2`,
//! the automatic job a write starts, and the info/1 items about
//! dictionaries, codecs and re-compression.

use heft_core::compress::Codec;
use heft_core::table::learn::{self, Job, LearnError, Phase, Progress, Tally};
use heft_core::Table;
use rustler::{Atom, Encoder, Env, LocalPid, NifResult, OwnedEnv, Term};

use crate::admin::compression_term;
use crate::errors::badarg;
use crate::ops::resolve_arc;

mod atoms {
    rustler::atoms! {
        ok,
        error,
        auto,
        none,
        heft_trained,
        busy,
        too_few_records,
        training_failed,
        deleted,
        // info
        id,
        bytes,
        records,
        current,
        raw,
        zlib,
        zstd,
        lz4,
        zstd_dict,
        state,
        idle,
        sampling,
        training,
        running,
        done,
        failed,
        total,
        recompressed,
        samples,
        sample_bytes,
        dictionary_bytes,
        microseconds,
        trials,
        compression,
        decode_ns,
        dictionaries,
        records_by_codec,
        recompression,
    }
}

/// Starts the automatic job if a write just made it due.
pub fn after_write(core: &std::sync::Arc<Table>) {
    if core.take_learning_due() {
        let _ = learn::start(core.clone(), Job::automatic(), None);
    }
}

fn error_atom(e: &LearnError) -> Atom {
    match e {
        LearnError::Busy => atoms::busy(),
        LearnError::TooFewRecords => atoms::too_few_records(),
        LearnError::Deleted => atoms::deleted(),
        _ => atoms::training_failed(),
    }
}

/// Starts a training job; `:ok` at once, then `{:heft_trained, tag,
/// {:ok, dict_id} | {:error, reason}}` to the caller once the dictionary
/// is in use (re-compression goes on in the background). `{:error,
/// :busy}` at once while another job samples or trains. Only the owner
/// may train a protected or private table.
#[rustler::nif]
fn train_dictionary<'a>(
    env: Env<'a>,
    tab: Term<'a>,
    samples: usize,
    max_bytes: usize,
    recompress: bool,
    tag: Term<'a>,
) -> NifResult<Term<'a>> {
    let t = resolve_arc(tab)?;
    if !t.may_write(env) {
        return Err(badarg(
            "only the owner may train a protected or private table",
        ));
    }
    let tag: u64 = tag.decode().map_err(|_| badarg("malformed tag"))?;
    let pid: LocalPid = env.pid();
    let done: learn::Done = Box::new(move |r: Result<u32, LearnError>| {
        let mut owned = OwnedEnv::new();
        let _ = owned.send_and_clear(&pid, |env| {
            let result = match &r {
                Ok(0) => (atoms::ok(), atoms::none()).encode(env),
                Ok(id) => (atoms::ok(), *id).encode(env),
                Err(e) => (atoms::error(), error_atom(e)).encode(env),
            };
            (atoms::heft_trained(), tag, result).encode(env)
        });
    });
    let job = Job {
        samples,
        dict_bytes: max_bytes,
        recompress,
        automatic: false,
    };
    match learn::start(t.core.clone(), job, Some(done)) {
        Ok(()) => Ok(atoms::ok().encode(env)),
        Err(LearnError::NotLearning) => Err(badarg(
            "the table's compression is neither {:zstd, dictionary: :auto} nor :auto",
        )),
        Err(e) => Ok((atoms::error(), error_atom(&e)).encode(env)),
    }
}

pub(crate) fn map<'a>(env: Env<'a>, pairs: &[(Atom, Term<'a>)]) -> Term<'a> {
    let pairs: Vec<(Term, Term)> = pairs.iter().map(|(k, v)| (k.encode(env), *v)).collect();
    Term::map_from_pairs(env, &pairs).expect("distinct atom keys")
}

fn phase_atom(p: Phase) -> Atom {
    match p {
        Phase::Idle => atoms::idle(),
        Phase::Sampling => atoms::sampling(),
        Phase::Training => atoms::training(),
        Phase::Running => atoms::running(),
        Phase::Done => atoms::done(),
        Phase::Failed => atoms::failed(),
    }
}

/// The info/1 items of heft_nif's `info`: `(key, value)` pairs.
pub fn info_items<'a>(env: Env<'a>, core: &Table) -> Vec<(Term<'a>, Term<'a>)> {
    let tally = core.tally().unwrap_or_default();
    let progress = core.learning();
    let dicts = core.dictionaries();
    let current = dicts.current().map_or(0, |d| d.id());
    let list: Vec<Term> = dicts
        .all()
        .iter()
        .map(|d| {
            let records = tally.by_dict.get(d.id() as usize - 1).copied();
            map(
                env,
                &[
                    (atoms::id(), d.id().encode(env)),
                    (atoms::bytes(), d.bytes().len().encode(env)),
                    (atoms::records(), records.unwrap_or(0).encode(env)),
                    (atoms::current(), (d.id() == current).encode(env)),
                ],
            )
        })
        .collect();
    let compression = match core.is_auto() {
        true => (atoms::auto(), compression_term(env, core.compression())).encode(env),
        false => compression_term(env, core.compression()),
    };
    vec![
        (atoms::compression().encode(env), compression),
        (
            atoms::dictionary_bytes().encode(env),
            dicts.memory().encode(env),
        ),
        (atoms::dictionaries().encode(env), list.encode(env)),
        (atoms::records_by_codec().encode(env), by_codec(env, &tally)),
        (
            atoms::recompression().encode(env),
            recompression(env, &progress),
        ),
        (atoms::training().encode(env), training(env, &progress)),
    ]
}

fn by_codec<'a>(env: Env<'a>, t: &Tally) -> Term<'a> {
    let names = [
        atoms::raw(),
        atoms::zlib(),
        atoms::zstd(),
        atoms::lz4(),
        atoms::zstd_dict(),
    ];
    // Frames and blocks with a dictionary both count as `zstd_dict`.
    let mut counts = t.by_codec;
    counts[Codec::ZstdDict as usize] += counts[Codec::ZstdBlock as usize];
    let pairs: Vec<(Atom, Term)> = names
        .iter()
        .zip(counts)
        .map(|(a, n)| (*a, n.encode(env)))
        .collect();
    map(env, &pairs)
}

fn recompression<'a>(env: Env<'a>, p: &Progress) -> Term<'a> {
    map(
        env,
        &[
            (atoms::state(), phase_atom(p.phase).encode(env)),
            (atoms::done(), p.done.encode(env)),
            (atoms::total(), p.total.encode(env)),
            (atoms::recompressed(), p.recompressed.encode(env)),
        ],
    )
}

fn training<'a>(env: Env<'a>, p: &Progress) -> Term<'a> {
    let trials: Vec<Term> = p
        .trials
        .iter()
        .map(|t| {
            map(
                env,
                &[
                    (atoms::compression(), compression_term(env, t.compression)),
                    (atoms::bytes(), t.bytes.encode(env)),
                    (atoms::decode_ns(), t.decode_ns.encode(env)),
                ],
            )
        })
        .collect();
    let error = match &p.error {
        Some(e) => error_atom(e).encode(env),
        None => rustler::types::atom::nil().encode(env),
    };
    map(
        env,
        &[
            (atoms::samples(), p.samples.encode(env)),
            (atoms::sample_bytes(), p.sample_bytes.encode(env)),
            (atoms::dictionary_bytes(), p.dict_bytes.encode(env)),
            (atoms::microseconds(), p.train_us.encode(env)),
            (atoms::trials(), trials.encode(env)),
            (atoms::error(), error),
        ],
    )
}

/// Default job parameters, for Heft's docs and tests.
#[rustler::nif]
fn learn_defaults() -> (usize, usize, usize) {
    (learn::AUTO_RECORDS, learn::DICT_BYTES, learn::MIN_SAMPLES)
}
