//! Keeping alive the VM objects a table's records name: the magic
//! references of `:atomics`, `:counters` and NIF resources. The VM frees
//! such an object once no term refers to it; ETS's copy of a record is
//! such a term, Heft's ETF bytes are not. So while some record of a table
//! holds a magic reference (heft_core table/vm_refs.rs counts them), the
//! table keeps a copy of the reference in a process-independent
//! environment of its own, and drops it once no record does.
//!
//! A write NIF notes the magic references its terms hold as it encodes them
//! ([`seen`], between [`begin_write`] and [`take_seen`]); after the write,
//! [`keep`] saves those the table now holds and lets go of those it no
//! longer does (removals anywhere, the expiry sweep included, are counted
//! by the core and picked up at the table's next write).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use rustler::env::OwnedEnv;
use rustler::{Encoder, Env, Resource, ResourceArc};

use crate::resource::TableRes;

thread_local! {
    /// Set during a write NIF: [`seen`] collects into `SEEN`.
    static COLLECT: Cell<bool> = const { Cell::new(false) };
    static SEEN: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// A table's live copies of the magic references its records hold, each
/// in an environment of its own (so one is freed without the others).
#[derive(Default)]
pub struct Objects {
    /// Set once the table has kept one: until then writes skip [`keep`].
    used: AtomicBool,
    kept: Mutex<Kept>,
}

#[derive(Default)]
struct Kept {
    objects: HashMap<Vec<u8>, OwnedEnv>,
    /// Kept without the table's word that a record holds them yet.
    unconfirmed: Vec<Vec<u8>>,
}

impl Objects {
    /// Lets every object go (the table is deleted).
    pub fn clear(&self) {
        *self.kept.lock() = Kept::default();
    }
}

/// A write NIF begins: collect the magic references it encodes.
pub fn begin_write() {
    COLLECT.set(true);
    SEEN.with_borrow_mut(Vec::clear);
}

/// The encoder met the ETF piece `bytes`: true if it is a magic reference
/// (noted if a write is collecting).
pub fn seen(bytes: &[u8]) -> bool {
    let magic = heft_core::etf::is_magic_ref(bytes);
    if magic && COLLECT.get() {
        SEEN.with_borrow_mut(|s| s.push(bytes.to_vec()));
    }
    magic
}

/// The write NIF ended: the magic references it encoded.
pub fn take_seen() -> Vec<Vec<u8>> {
    COLLECT.set(false);
    SEEN.with_borrow_mut(std::mem::take)
}

/// After a write to `t` that encoded the magic references `seen`: keeps
/// each one it does not keep yet, then lets go of those no record holds
/// (the core's dead list, and the new ones if the write stored none, as
/// an `insert_new/2` that found its key). The table is asked in a quick
/// call, so this never waits long for its lock; if it would, what to let
/// go of is asked again after the table's next write.
pub fn keep(env: Env, t: &TableRes, seen: Vec<Vec<u8>>) {
    let objects = &t.vm_objects;
    if seen.is_empty() && !objects.used.load(Ordering::Relaxed) {
        return;
    }
    let mut kept = objects.kept.lock();
    for piece in seen {
        if kept.objects.contains_key(&piece) {
            continue;
        }
        // The writer's term is alive for this call, so the bytes decode to
        // the reference itself, which the copy in `own` keeps alive.
        let Some((term, _)) = env.binary_to_term(&piece) else {
            continue;
        };
        let own = OwnedEnv::new();
        let _ = own.save(term);
        kept.objects.insert(piece.clone(), own);
        kept.unconfirmed.push(piece);
        objects.used.store(true, Ordering::Relaxed);
    }
    let asked = std::mem::take(&mut kept.unconfirmed);
    match heft_core::table::quick(|| t.core.unheld_vm_refs(&asked)) {
        Ok(unheld) => unheld.iter().for_each(|piece| {
            kept.objects.remove(piece);
        }),
        Err(_) => kept.unconfirmed = asked,
    }
}

/// A resource of no content: a reference the VM makes magic.
struct Probe;

#[rustler::resource_impl]
impl Resource for Probe {}

/// Finds, at load, the bit that marks a magic reference in its ETF bytes
/// (heft_core etf.rs): the bit of the second ID word set in a resource's
/// reference and not in a plain one. If no single such bit is found, no
/// reference counts as magic and none is kept alive (the moduledoc's
/// differences from ETS say so).
pub fn find_magic_mark(env: Env) {
    let second_word = |t: rustler::Term| heft_core::etf::ref_second_word(t.to_binary().as_slice());
    let magic = second_word(ResourceArc::new(Probe).encode(env));
    let plain = second_word(env.make_ref().encode(env));
    if let (Some(m), Some(p)) = (magic, plain) {
        let mark = m & !p;
        if mark.is_power_of_two() {
            heft_core::etf::set_magic_mark(mark);
        }
    }
}
