//! The table resource: a core table plus what makes it an ETS-like table on
//! the BEAM (owner, heir, protection, name), the registry of live tables,
//! and the reaper thread that unmaps deleted arenas off the schedulers.
//!
//! Like an ETS table, a Heft table lives until it is deleted or its owner
//! dies without an heir, whether or not anyone still holds a handle: the
//! registry keeps a reference to every live table. A stale handle to a
//! deleted table finds the core table marked deleted and raises.
//!
//! Owner death. ETS deletes or hands over an exiting process's tables
//! before the VM sends that process's `EXIT` signals and `DOWN` messages
//! (erts_continue_exit_process: ETS in its USING_DB phase, links and
//! monitors after the "time of death"). A NIF hears of it later: the VM
//! sends the links' `EXIT`s first, then fires monitors in the order they
//! were set, a resource monitor's `down` callback among process monitors'
//! `DOWN`s, and may yield in between. So the `down` callback is only one of
//! two ways a dead owner's table is handled: every lookup of a table (by
//! name, handle, `all/0`, `whereis/1`, a name taken by `new/2` or
//! `rename/2`, a directory taken by `open/2`) first asks the VM whether
//! the owner is alive, and if not handles its death right there
//! ([`owner_exit`]): the name is freed and handles fail, or the heir owns
//! the table and has been sent its message. Whoever comes first does it,
//! once. The VM marks a process exiting before it sends any of its `EXIT`
//! or `DOWN` signals, so whoever has received one sees the owner dead.
//! Unmapping the arena is left to the reaper thread.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, LazyLock, Mutex as StdMutex};

use heft_core::atoms::AtomTable;
use heft_core::table::State;
use heft_core::{Backing, Table};
use parking_lot::{Mutex, RwLock};
use rustler::env::SavedTerm;
use rustler::sys::{self, ErlNifTerm};
use rustler::{
    Atom, Encoder, Env, LocalPid, Monitor, NifResult, OwnedEnv, Resource, ResourceArc, Term,
};
use std::sync::Arc as CoreArc;

use crate::atom_words::AtomWords;
use crate::codec::{EncodeError, WordHasher};
use crate::errors::badarg;

mod atoms {
    rustler::atoms! {
        none,
        heft_transfer = "HEFT-TRANSFER",
        struct_ = "__struct__",
        heft_table = "Elixir.Heft.Table",
        r#ref = "ref",
    }
}

/// Who may read and write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Protection {
    /// Any process reads and writes.
    Public,
    /// Any process reads; the owner writes.
    Protected,
    /// Only the owner reads and writes.
    Private,
}

impl Protection {
    fn from_u8(b: u8) -> Protection {
        match b {
            0 => Protection::Public,
            1 => Protection::Protected,
            _ => Protection::Private,
        }
    }
}

/// The heir and the data it receives with the table.
pub struct Heir {
    pub pid: LocalPid,
    /// The heir data, if any: an heir set without data (`{:heir, pid}`,
    /// OTP 29) takes the table without a transfer message.
    data: Option<(OwnedEnv, SavedTerm)>,
}

impl Heir {
    /// The heir a table option or `setopts` names: `:none`, `pid` (no
    /// data, no message) or `{pid, data}`.
    pub fn decode(heir: Term) -> NifResult<Option<Heir>> {
        if heir.decode::<Atom>().is_ok_and(|a| a == atoms::none()) {
            return Ok(None);
        }
        if let Ok(pid) = heir.decode::<LocalPid>() {
            return Ok(Some(Heir { pid, data: None }));
        }
        let (pid, data): (LocalPid, Term) = heir.decode().map_err(|_| badarg("malformed heir"))?;
        let env = OwnedEnv::new();
        let data = env.save(data);
        Ok(Some(Heir {
            pid,
            data: Some((env, data)),
        }))
    }

    /// The heir data, copied into `env`; `None` for an heir without.
    pub fn data<'a>(&self, env: Env<'a>) -> Option<Term<'a>> {
        let (owned, data) = self.data.as_ref()?;
        Some(owned.run(|e| data.load(e).in_env(env)))
    }
}

/// Ownership facts that change over a table's life.
pub struct Meta {
    pub name: Atom,
    pub named: bool,
    pub monitor: Option<Monitor>,
    pub heir: Option<Heir>,
}

/// Caches' ids: the first is 1, so that an empty [`SEEN`] slot (uid 0)
/// matches none.
static NEXT_CACHE: AtomicU64 = AtomicU64::new(1);

const SEEN_SLOTS: usize = 64;

thread_local! {
    /// Atom word -> id of the caches this thread met last, by cache uid:
    /// a write's encoder lives for one NIF call, so without this each call
    /// took its table's lock and hash map for every atom (6% of a small
    /// map's single insert, perf). An atom's word and a table's id for it
    /// never change while the table's cache lives (atoms are never freed,
    /// ids never reassigned), and uids are never reused, so an entry that
    /// matches is right for as long as its cache lives, and one of a
    /// dropped cache is never matched again.
    static SEEN: std::cell::RefCell<[(u64, usize, u32); SEEN_SLOTS]> =
        const { std::cell::RefCell::new([(0, 0, 0); SEEN_SLOTS]) };
}

/// Atom ids <-> atom terms for one table, in front of the core dictionary
/// (which holds the names).
pub struct AtomCache {
    /// Never reused (see [`SEEN`]).
    uid: u64,
    names: Arc<RwLock<AtomTable>>,
    inner: RwLock<AtomInner>,
    /// Id -> atom word, read by the decoder without a lock.
    words: AtomWords,
}

#[derive(Default)]
struct AtomInner {
    by_word: HashMap<ErlNifTerm, u32, BuildHasherDefault<WordHasher>>,
}

impl AtomCache {
    /// In front of the atom dictionary `names` (a table's, or a scratch
    /// one: sizing.rs).
    pub fn new(names: Arc<RwLock<AtomTable>>) -> Self {
        AtomCache {
            uid: NEXT_CACHE.fetch_add(1, Ordering::Relaxed),
            names,
            inner: RwLock::new(AtomInner::default()),
            words: AtomWords::default(),
        }
    }

    /// The id of an atom, adding it to the dictionary if new.
    pub fn id_of(&self, env: Env, atom: Atom) -> Result<u32, EncodeError> {
        let word = atom.as_c_arg();
        let bits = crate::codec::bits(word);
        let slot =
            ((bits >> 6) ^ self.uid.wrapping_mul(0x9E37_79B9_7F4A_7C15) as usize) % SEEN_SLOTS;
        if let Some(id) = SEEN.with(|seen| match seen.borrow()[slot] {
            (uid, w, id) if uid == self.uid && w == bits => Some(id),
            _ => None,
        }) {
            return Ok(id);
        }
        let found = self.inner.read().by_word.get(&word).copied();
        let id = match found {
            Some(id) => id,
            None => {
                let name = atom_name(env, atom).ok_or(EncodeError::Unsupported)?;
                let id = self.names.write().intern(&name);
                self.remember(id, atom);
                id
            }
        };
        SEEN.with(|seen| seen.borrow_mut()[slot] = (self.uid, bits, id));
        Ok(id)
    }

    /// The word of the atom with this id (a lock-free read once the atom
    /// has been met).
    #[inline]
    pub fn atom_word(&self, env: Env, id: u32) -> Option<ErlNifTerm> {
        match self.words.get(id) {
            Some(word) => Some(word),
            None => self.atom(env, id).map(|a| a.as_c_arg()),
        }
    }

    /// The atom with this id.
    pub fn atom(&self, env: Env, id: u32) -> Option<Atom> {
        if let Some(atom) = self.words.atom(id) {
            return Some(atom);
        }
        let name = self.names.read().name(id)?.to_owned();
        let atom = make_atom(env, &name)?;
        self.remember(id, atom);
        Some(atom)
    }

    fn remember(&self, id: u32, atom: Atom) {
        self.inner.write().by_word.insert(atom.as_c_arg(), id);
        self.words.set(id, atom);
    }
}

/// An atom's name as UTF-8, read from its external term format.
fn atom_name(env: Env, atom: Atom) -> Option<String> {
    let etf = atom.to_term(env).to_binary();
    let b = etf.as_slice();
    let (latin1, text) = match b.get(1)? {
        100 => (true, b.get(4..)?),  // ATOM_EXT
        115 => (true, b.get(3..)?),  // SMALL_ATOM_EXT
        118 => (false, b.get(4..)?), // ATOM_UTF8_EXT
        119 => (false, b.get(3..)?), // SMALL_ATOM_UTF8_EXT
        _ => return None,
    };
    if latin1 {
        Some(text.iter().map(|&c| char::from(c)).collect())
    } else {
        String::from_utf8(text.to_vec()).ok()
    }
}

/// The atom named `name` (UTF-8).
fn make_atom(env: Env, name: &str) -> Option<Atom> {
    let latin1: Option<Vec<u8>> = name.chars().map(|c| u8::try_from(c as u32).ok()).collect();
    if let Some(bytes) = latin1 {
        return Atom::from_bytes(env, &bytes).ok();
    }
    // Characters beyond Latin-1: build it from ATOM_UTF8_EXT.
    let len = u16::try_from(name.len()).ok()?;
    let mut etf = vec![131, 118];
    etf.extend_from_slice(&len.to_be_bytes());
    etf.extend_from_slice(name.as_bytes());
    let (t, _) = env.binary_to_term(&etf)?;
    Atom::from_term(t).ok()
}

/// A Heft table as the VM sees it.
pub struct TableRes {
    pub id: u64,
    pub core: CoreArc<Table>,
    pub atoms: AtomCache,
    pub keypos: usize,
    /// A [`Protection`], which `setopts/2` may change.
    protection: AtomicU8,
    pub backing: Backing,
    /// The owner, as its `ErlNifPid` word ([`pid_word`]): read by every
    /// call, which a lock's two atomic read-modify-writes made slower by
    /// about 100 ns here.
    owner: AtomicUsize,
    deleted: AtomicBool,
    pub meta: Mutex<Meta>,
    /// Set for a persistent table (persist.rs).
    pub persist: Option<crate::persist::PersistRes>,
    /// Who has the table fixed (safe_fixtable/2, fix.rs).
    pub fixations: crate::fix::Fixations,
    /// Live copies of the magic references its records hold (vm_refs.rs).
    pub vm_objects: crate::vm_refs::Objects,
}

#[rustler::resource_impl]
impl Resource for TableRes {
    const IMPLEMENTS_DOWN: bool = true;

    fn down<'a>(&'a self, env: Env<'a>, pid: LocalPid, _mon: Monitor) {
        if let Some(me) = lookup_id(self.id) {
            owner_exit(env, &me, pid);
        }
    }
}

impl TableRes {
    pub fn new(
        core: CoreArc<Table>,
        keypos: usize,
        protection: Protection,
        backing: Backing,
        owner: LocalPid,
        meta: Meta,
    ) -> TableRes {
        let atoms = AtomCache::new(core.atoms().clone());
        TableRes {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            core,
            atoms,
            keypos,
            protection: AtomicU8::new(protection as u8),
            backing,
            owner: AtomicUsize::new(pid_word(owner)),
            deleted: AtomicBool::new(false),
            meta: Mutex::new(meta),
            persist: None,
            fixations: Default::default(),
            vm_objects: Default::default(),
        }
    }

    /// Makes the table persistent (persist.rs).
    pub fn with_persist(mut self, p: crate::persist::PersistRes) -> Self {
        self.persist = Some(p);
        self
    }

    /// Makes `pid` the owner: monitors it, forgets the old monitor.
    ///
    /// Works from a NIF call and from the `down` callback alike: rustler's
    /// monitor API insists on a process-bound env, which a callback does not
    /// have, so this calls enif_(de)monitor_process itself; both accept a
    /// callback env.
    /// Returns false if `pid` is already dead (the caller then deletes the
    /// table, as the VM would have on the owner's exit).
    #[must_use]
    pub fn set_owner(
        &self,
        env: Env,
        me: &ResourceArc<TableRes>,
        meta: &mut Meta,
        pid: LocalPid,
    ) -> bool {
        if let Some(old) = meta.monitor.take() {
            // SAFETY: `env` is the env of the running NIF or resource
            // callback, `me` keeps the resource alive, `old` is a monitor
            // this resource set.
            unsafe { sys::enif_demonitor_process(env.as_c_arg(), me.as_c_arg(), old.as_c_arg()) };
        }
        self.owner.store(pid_word(pid), Ordering::Release);
        let mut mon = MaybeUninit::uninit();
        // SAFETY: as above; `pid` and `mon` point to locals the call reads
        // and writes.
        let rc = unsafe {
            sys::enif_monitor_process(
                env.as_c_arg(),
                me.as_c_arg(),
                pid.as_c_arg(),
                mon.as_mut_ptr(),
            )
        };
        meta.monitor = (rc == 0).then(|| {
            // SAFETY: a return of 0 means the VM initialized the monitor.
            Monitor::from_c_arg(unsafe { mon.assume_init() })
        });
        rc == 0
    }

    /// The owning process.
    pub fn owner(&self) -> LocalPid {
        word_pid(self.owner.load(Ordering::Acquire))
    }

    /// True once the table has been deleted.
    pub fn is_deleted(&self) -> bool {
        self.deleted.load(Ordering::Acquire)
    }

    /// True if the calling process owns the table.
    pub fn caller_is_owner(&self, env: Env) -> bool {
        env.pid() == self.owner()
    }

    /// Who may read and write.
    pub fn protection(&self) -> Protection {
        Protection::from_u8(self.protection.load(Ordering::Acquire))
    }

    /// Changes who may read and write (`setopts/2`; owner only).
    pub fn set_protection(&self, p: Protection) {
        self.protection.store(p as u8, Ordering::Release);
    }

    /// May the caller read?
    pub fn may_read(&self, env: Env) -> bool {
        self.protection() != Protection::Private || self.caller_is_owner(env)
    }

    /// May the caller write?
    pub fn may_write(&self, env: Env) -> bool {
        self.protection() == Protection::Public || self.caller_is_owner(env)
    }
}

/// The handle users see: the name of a named table, otherwise
/// `%Heft.Table{name: name, ref: resource}`.
pub fn tab_term<'a>(env: Env<'a>, res: &ResourceArc<TableRes>, meta: &Meta) -> Term<'a> {
    if meta.named {
        return meta.name.encode(env);
    }
    tab_struct(env, res)
}

/// `%Heft.Table{ref: resource}`: the identifier, which stays the same
/// whatever the table is renamed to.
pub fn tab_struct<'a>(env: Env<'a>, res: &ResourceArc<TableRes>) -> Term<'a> {
    let keys = [atoms::struct_().encode(env), atoms::r#ref().encode(env)];
    let values = [atoms::heft_table().encode(env), res.encode(env)];
    Term::map_from_term_arrays(env, &keys, &values).unwrap_or_else(|_| res.encode(env))
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

type Registry = RwLock<HashMap<u64, ResourceArc<TableRes>>>;
static TABLES: LazyLock<Registry> = LazyLock::new(Default::default);
static NAMES: LazyLock<RwLock<HashMap<Atom, ResourceArc<TableRes>>>> =
    LazyLock::new(Default::default);

/// A pid as the one word of its `ErlNifPid`.
fn pid_word(pid: LocalPid) -> usize {
    // SAFETY: ErlNifPid is repr(C) around one ERL_NIF_TERM, a usize
    // (transmute checks the sizes); any word read back came from here.
    unsafe { std::mem::transmute::<sys::ErlNifPid, usize>(*pid.as_c_arg()) }
}

/// The pid whose word [`pid_word`] gave.
fn word_pid(word: usize) -> LocalPid {
    // SAFETY: as in `pid_word`, whose output `word` is.
    LocalPid::from_c_arg(unsafe { std::mem::transmute::<usize, sys::ErlNifPid>(word) })
}

/// Registers a new table; fails (registering nothing) if it is named and
/// the name is taken by a table whose owner is alive.
pub fn register(env: Env, res: &ResourceArc<TableRes>, name: Atom, named: bool) -> bool {
    if named {
        free_name(env, name);
        let mut names = NAMES.write();
        if names.contains_key(&name) {
            return false;
        }
        names.insert(name, res.clone());
    }
    TABLES.write().insert(res.id, res.clone());
    true
}

/// A table a NIF call works on, for the length of the call.
pub enum Tab<'a> {
    /// Borrowed from the handle the caller passed: the resource term keeps
    /// the resource alive until the call returns, so there is no reference
    /// counting and no counted `ResourceArc` to make (rustler's decode of
    /// one keeps and releases it: a fair share of a lookup).
    Handle(&'a TableRes),
    /// A counted reference: from the name registry (whose entry a
    /// concurrent delete may drop) or a registry walk.
    Counted(ResourceArc<TableRes>),
}

impl std::ops::Deref for Tab<'_> {
    type Target = TableRes;

    fn deref(&self) -> &TableRes {
        match self {
            Tab::Handle(t) => t,
            Tab::Counted(t) => t,
        }
    }
}

/// The VM's resource type of [`TableRes`], once learnt ([`learn_type`]):
/// with it a handle is checked by one `enif_get_resource`, where rustler's
/// decode first finds the type in a SipHash map of `TypeId`s.
static TABLE_TYPE: AtomicPtr<sys::ErlNifResourceType> = AtomicPtr::new(std::ptr::null_mut());
/// Set once [`learn_type`] has run (it runs once, successful or not).
static TYPE_TRIED: AtomicBool = AtomicBool::new(false);

impl<'a> Tab<'a> {
    /// The table of a resource handle term; `None` for any other term.
    pub fn of_handle(term: Term<'a>) -> Option<Tab<'a>> {
        let ty = TABLE_TYPE.load(Ordering::Relaxed);
        if ty.is_null() {
            let t = term.try_get_resource::<TableRes>()?;
            if !TYPE_TRIED.swap(true, Ordering::Relaxed) {
                learn_type(term);
            }
            return Some(Tab::Handle(t));
        }
        let mut obj: *const std::ffi::c_void = std::ptr::null();
        // SAFETY: `term` is a term of its env; the VM only compares `ty`
        // with the resource's type and writes `obj`, a local.
        let ok = unsafe {
            sys::enif_get_resource(term.get_env().as_c_arg(), term.as_c_arg(), ty, &mut obj)
        };
        if ok == 0 {
            return None;
        }
        // SAFETY: `obj` is the data of a resource of `TableRes`'s type
        // (checked by the VM), where rustler's ResourceArc::new wrote a
        // TableRes at the first address past `obj` aligned for it; the
        // term holds a reference to the resource for the whole call, so it
        // outlives `'a`.
        Some(Tab::Handle(unsafe { &*table_in(obj) }))
    }

    /// A counted reference, for what keeps the table past the call or
    /// needs the resource itself (monitors, handles built for messages);
    /// `handle` is the term the table was resolved from.
    pub fn arc(&self, handle: Term) -> Option<ResourceArc<TableRes>> {
        match self {
            Tab::Handle(_) => handle.decode().ok(),
            Tab::Counted(t) => Some(t.clone()),
        }
    }
}

/// Where rustler places a `TableRes` in a resource's data (rustler's
/// `align_alloced_mem_for_struct`: the next aligned address, at least one
/// byte on).
fn table_in(obj: *const std::ffi::c_void) -> *const TableRes {
    let align = std::mem::align_of::<TableRes>();
    obj.cast::<u8>()
        .wrapping_add(align - (obj as usize) % align)
        .cast::<TableRes>()
}

/// Learns `TableRes`'s resource type from a handle rustler has accepted.
/// The NIF API hands a type out only to the `load` callback that opens it
/// (rustler's, which keeps it private), so the type is read from the
/// header the VM keeps in front of every resource's data (its first word,
/// two words before the data in ERTS's `ErtsResource`), and only kept if
/// `enif_get_resource` with it finds this very resource: a wrong guess is
/// never kept, and handles keep going through rustler's decode.
fn learn_type(term: Term) {
    let Ok(res) = term.decode::<ResourceArc<TableRes>>() else {
        return;
    };
    let data = res.as_c_arg();
    // SAFETY: `data` points into the VM's allocation of a live resource
    // (a magic binary: its own header, then the resource's type and
    // monitor words, then the data), so the two words before it are
    // readable memory of that allocation; an unaligned read makes no
    // assumption on their alignment. What they hold is only used after the
    // check below.
    let guess = unsafe {
        data.cast::<*mut sys::ErlNifResourceType>()
            .wrapping_sub(2)
            .read_unaligned()
    };
    let mut obj: *const std::ffi::c_void = std::ptr::null();
    // SAFETY: as in `Tab::of_handle`: the VM only compares `guess` with the
    // resource's type, never dereferences it.
    let ok = unsafe {
        sys::enif_get_resource(term.get_env().as_c_arg(), term.as_c_arg(), guess, &mut obj)
    };
    if ok != 0 && std::ptr::eq(obj, data) {
        TABLE_TYPE.store(guess, Ordering::Relaxed);
    }
}

/// `res` unless it is deleted, after handling its owner's death if the
/// owner is no longer alive (it may then belong to the heir).
pub fn live(env: Env, res: ResourceArc<TableRes>) -> Option<ResourceArc<TableRes>> {
    match live_tab(
        env,
        Tab::Counted(res),
        rustler::types::atom::nil().to_term(env),
    )? {
        Tab::Counted(res) => Some(res),
        Tab::Handle(_) => None,
    }
}

/// [`live`] of a [`Tab`] resolved from `handle`.
pub fn live_tab<'a>(env: Env<'a>, tab: Tab<'a>, handle: Term<'a>) -> Option<Tab<'a>> {
    if tab.is_deleted() {
        return None;
    }
    let owner = tab.owner();
    if !env.is_process_alive(owner) {
        owner_exit(env, &tab.arc(handle)?, owner);
    }
    (!tab.is_deleted()).then_some(tab)
}

/// Handles the death of a table's owner `dead`, as ETS does when a
/// process exits: the table goes to its heir if there is one, alive and
/// other than `dead`, which is sent `{:"HEFT-TRANSFER", tab, dead, data}`
/// (nothing for an heir set without data); else it is deleted. Does nothing if the table is deleted or no longer
/// `dead`'s (it was handled already, or given away): whoever calls first,
/// the `down` callback or a lookup, does it once.
pub fn owner_exit(env: Env, res: &ResourceArc<TableRes>, dead: LocalPid) {
    let mut meta = res.meta.lock();
    if res.is_deleted() || res.owner() != dead {
        return;
    }
    let heir = meta.heir.as_ref().map(|h| h.pid);
    if let Some(heir) = heir.filter(|h| *h != dead && env.is_process_alive(*h)) {
        let data = meta.heir.as_ref().and_then(|h| h.data(env));
        if res.set_owner(env, res, &mut meta, heir) {
            let Some(data) = data else {
                return;
            };
            let msg = (
                atoms::heft_transfer(),
                tab_term(env, res, &meta),
                dead,
                data,
            );
            if env.send(&heir, msg).is_ok() {
                return;
            }
        }
    }
    let gone = unregister(res, &meta);
    drop(meta);
    if gone {
        release(res, Reap::Thread);
    }
}

/// The live table with this name.
pub fn lookup_name(env: Env, name: Atom) -> Option<ResourceArc<TableRes>> {
    live(env, named(name)?)
}

/// The table registered under `name`, whether or not its owner lives.
pub fn named(name: Atom) -> Option<ResourceArc<TableRes>> {
    NAMES.read().get(&name).cloned()
}

pub fn lookup_id(id: u64) -> Option<ResourceArc<TableRes>> {
    TABLES.read().get(&id).cloned()
}

/// Every live table, in creation order.
pub fn all(env: Env) -> Vec<ResourceArc<TableRes>> {
    let v: Vec<_> = TABLES.read().values().cloned().collect();
    let mut v: Vec<_> = v.into_iter().filter_map(|t| live(env, t)).collect();
    v.sort_by_key(|t| t.id);
    v
}

/// Renames a table; for a named table, false if a table (itself included,
/// as in ETS) already has the name `new`. The caller frees `new` first if
/// its table's owner died ([`free_name`]), before it locks `meta`.
pub fn rename(res: &ResourceArc<TableRes>, meta: &mut Meta, new: Atom) -> bool {
    if meta.named {
        let mut names = NAMES.write();
        if names.contains_key(&new) {
            return false;
        }
        names.remove(&meta.name);
        names.insert(new, res.clone());
    }
    meta.name = new;
    true
}

/// Frees `name` if it belongs to a table whose owner died (the table is
/// handled as at its owner's exit).
pub fn free_name(env: Env, name: Atom) {
    let _ = lookup_name(env, name);
}

/// Deletes a table: unregisters it and frees its storage. A persistent
/// table's files stay: it is closed (last sync on its own threads,
/// without waiting).
pub fn delete(res: &ResourceArc<TableRes>) {
    let gone = unregister(res, &res.meta.lock());
    if gone {
        release(res, Reap::Inline);
    }
}

/// The cheap half of a delete, under the table's `meta` lock: marks the
/// table deleted and frees its name, at once for every caller. True for
/// the one call that did it.
fn unregister(res: &ResourceArc<TableRes>, meta: &Meta) -> bool {
    if res.deleted.load(Ordering::Acquire) {
        return false;
    }
    if let Some(p) = &res.persist {
        // Before `deleted` shows: an open of the directory that finds the
        // table deleted then waits for the close instead of failing.
        p.persisted.announce_close();
    }
    if meta.named {
        let mut names = NAMES.write();
        if names.get(&meta.name).is_some_and(|t| t.id == res.id) {
            names.remove(&meta.name);
        }
    }
    res.deleted.store(true, Ordering::Release);
    TABLES.write().remove(&res.id);
    true
}

/// Where a deleted table's storage is freed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reap {
    /// By the caller if small ([`REAP_INLINE`]).
    Inline,
    /// On the reaper thread whatever its size: an owner's exit handles all
    /// of its tables in one go, in a callback or in someone else's call.
    Thread,
}

/// The heavy half of a delete, without locks: frees the storage and
/// starts closing a persistent table. On the reaper thread, for an owner's
/// exit that finds the table's lock held long (another process's large
/// batch, say): the exit does not wait for it.
fn release(res: &ResourceArc<TableRes>, how: Reap) {
    res.vm_objects.clear();
    if how == Reap::Thread && !res.core.lock_free_within(heft_core::table::QUICK_LOCK_WAIT) {
        let res = res.clone();
        return to_reaper(Box::new(move || take_and_close(&res, Reap::Thread)));
    }
    take_and_close(res, how);
}

fn take_and_close(res: &ResourceArc<TableRes>, how: Reap) {
    if let Some(mut storage) = res.core.take_storage() {
        // Gone from the directory when delete/1 returns; unmapped later.
        storage.remove_files();
        reap(storage, how);
    }
    if let Some(p) = &res.persist {
        p.persisted.begin_close();
    }
}

/// Arenas up to this size are unmapped by the caller; larger ones by the
/// reaper thread, since unmapping gigabytes takes milliseconds.
const REAP_INLINE: u64 = 16 << 20;

/// Work for the reaper thread.
type Job = Box<dyn FnOnce() + Send>;

static REAPER: LazyLock<StdMutex<Sender<Job>>> = LazyLock::new(|| {
    let (tx, rx) = mpsc::channel::<Job>();
    let spawned = std::thread::Builder::new()
        .name("heft-reaper".into())
        .spawn(move || rx.into_iter().for_each(|job| job()));
    if spawned.is_err() {
        // No thread: the channel's receiver is gone and `to_reaper` runs
        // the job inline.
    }
    StdMutex::new(tx)
});

/// Runs `job` on the reaper thread (inline if it could not be started).
fn to_reaper(job: Job) {
    let tx = REAPER.lock().unwrap_or_else(|e| e.into_inner()).clone();
    if let Err(mpsc::SendError(job)) = tx.send(job) {
        job();
    }
}

fn reap(storage: State, how: Reap) {
    if how == Reap::Inline && storage.mapped_bytes() <= REAP_INLINE {
        return drop(storage);
    }
    to_reaper(Box::new(move || drop(storage)));
}
