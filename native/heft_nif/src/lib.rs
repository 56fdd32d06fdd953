//! The rustler shim over heft_core: each NIF decodes its arguments, makes
//! one core call and encodes the result. What the NIFs do is documented in
//! lib/heft.ex (the public API) and lib/heft/native.ex (the calling
//! conventions: retry markers, dirty variants).

mod admin;
mod atom_words;
mod budget;
mod codec;
mod compact;
mod errors;
mod fix;
mod learn;
mod migrate;
mod ops;
mod persist;
mod resource;
mod select;
mod sieve;
mod sizing;
mod tab_file;
mod vm_refs;

use std::sync::atomic::Ordering;

use rustler::{Env, Term};

/// Load-time facts about the running VM's ETS, from Heft.Native (which
/// learns them from Heft.VM): `%{"neg_zero_is_zero" => boolean,
/// "bag_batch_reversed" => boolean}`.
fn load(env: Env, info: Term) -> bool {
    // A panic becomes an exception in the calling process (rustler catches
    // it); say where it happened on one line instead of a full backtrace.
    std::panic::set_hook(Box::new(|info| {
        eprintln!("heft_nif: {}", info.to_string().replace('\n', " "));
    }));
    // Terms read without VM calls where their layout is this VM's.
    codec::check_term_layout(env);
    vm_refs::find_magic_mark(env);
    if let Ok(map) = info.decode::<std::collections::HashMap<String, bool>>() {
        if let Some(v) = map.get("neg_zero_is_zero") {
            codec::NEG_ZERO_IS_ZERO.store(*v, Ordering::Relaxed);
        }
        if let Some(v) = map.get("bag_batch_reversed") {
            ops::BAG_BATCH_REVERSED.store(*v, Ordering::Relaxed);
        }
    }
    true
}

rustler::init!("Elixir.Heft.Native", load = load);
