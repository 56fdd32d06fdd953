//! Table life and ownership: new, delete, give_away, rename, heir, whereis,
//! all, and the figures behind info/1.

use std::path::PathBuf;
use std::sync::Arc;

use heft_core::table::{Budget, Kind};
use heft_core::{accounting, Backing, Compression, Options, Table};
use rustler::{Atom, Binary, Encoder, Env, LocalPid, NifResult, ResourceArc, Term};

use crate::errors::{self, badarg};
use crate::ops::{resolve, resolve_arc};
use crate::resource::{self, tab_struct, tab_term, Heir, Meta, Protection, TableRes};

mod atoms {
    rustler::atoms! {
        ok,
        error,
        none,
        public,
        protected,
        private,
        zlib,
        zstd,
        lz4,
        auto,
        memory,
        file,
        undefined,
        heft_transfer = "HEFT-TRANSFER",
        set,
        ordered_set,
        bag,
        duplicate_bag,
        r#type = "type",
        // info keys
        name,
        named_table,
        owner,
        heir,
        protection,
        keypos,
        size,
        index_bytes,
        meta_bytes,
        arena_mapped_bytes,
        arena_used_bytes,
        arena_live_bytes,
        arena_free_bytes,
        arena_reclaimable_bytes,
        payload_raw_bytes,
        payload_stored_bytes,
        compression,
        arena,
        arena_resident_bytes,
        arena_dirty_bytes,
        arena_swap_bytes,
        index_resident_bytes,
        id,
    }
}

fn dir_path(dir: Binary) -> NifResult<PathBuf> {
    let dir = std::str::from_utf8(dir.as_slice()).map_err(|_| badarg("arena dir is not UTF-8"))?;
    Ok(PathBuf::from(dir))
}

fn protection_of(a: Atom) -> NifResult<Protection> {
    if a == atoms::public() {
        Ok(Protection::Public)
    } else if a == atoms::protected() {
        Ok(Protection::Protected)
    } else if a == atoms::private() {
        Ok(Protection::Private)
    } else {
        Err(badarg("protection must be :public, :protected or :private"))
    }
}

fn protection_atom(p: Protection) -> Atom {
    match p {
        Protection::Public => atoms::public(),
        Protection::Protected => atoms::protected(),
        Protection::Private => atoms::private(),
    }
}

fn kind_of(a: Atom) -> NifResult<Kind> {
    [
        (atoms::set(), Kind::Set),
        (atoms::ordered_set(), Kind::OrderedSet),
        (atoms::bag(), Kind::Bag),
        (atoms::duplicate_bag(), Kind::DuplicateBag),
    ]
    .into_iter()
    .find(|(atom, _)| *atom == a)
    .map(|(_, kind)| kind)
    .ok_or_else(|| badarg("type must be :set, :ordered_set, :bag or :duplicate_bag"))
}

fn kind_atom(k: Kind) -> Atom {
    match k {
        Kind::Set => atoms::set(),
        Kind::OrderedSet => atoms::ordered_set(),
        Kind::Bag => atoms::bag(),
        Kind::DuplicateBag => atoms::duplicate_bag(),
    }
}

/// Table options, as validated by Heft.new/2.
pub struct NewArgs {
    pub kind: Kind,
    pub named: bool,
    pub protection: Protection,
    pub keypos: usize,
    pub heir: Option<Heir>,
    pub compression: Compression,
    /// `compression: :auto`: the table picks its codec (learn.rs).
    pub auto: bool,
    pub backing: Backing,
    pub label: String,
    /// `max_bytes`, `max_records` (table/evict.rs).
    pub budget: Budget,
    /// `ttl`, in milliseconds (table/expire.rs).
    pub ttl: Option<u64>,
}

/// A compression as Heft.new/2 passes it (see [`parse_new_args`]);
/// `:auto` is read as zstd, which such a table starts with.
pub fn compression_of(term: Term) -> NifResult<Compression> {
    let malformed = || badarg("malformed compression");
    if let Ok(a) = term.decode::<Atom>() {
        return match a {
            a if a == atoms::none() => Ok(Compression::None),
            a if a == atoms::lz4() => Ok(Compression::Lz4),
            a if a == atoms::auto() => Ok(Compression::Zstd {
                level: heft_core::compress::ZSTD_DEFAULT_LEVEL,
                dict: false,
            }),
            _ => Err(malformed()),
        };
    }
    if let Ok((a, level)) = term.decode::<(Atom, u32)>() {
        if a == atoms::zlib() {
            return Ok(Compression::Zlib(level.min(9)));
        }
    }
    match term.decode::<(Atom, i32, bool)>() {
        Ok((a, level, dict)) if a == atoms::zstd() && (1..=22).contains(&level) => {
            Ok(Compression::Zstd { level, dict })
        }
        _ => Err(malformed()),
    }
}

/// The term [`compression_of`] reads as `c`.
pub fn compression_term(env: Env, c: Compression) -> Term {
    match c {
        Compression::None => atoms::none().encode(env),
        Compression::Zlib(level) => (atoms::zlib(), level).encode(env),
        Compression::Lz4 => atoms::lz4().encode(env),
        Compression::Zstd { level, dict } => (atoms::zstd(), level, dict).encode(env),
    }
}

/// Options arrive validated by Heft.new/2:
/// `{type, named, protection, keypos, heir, compression, arena, budget,
/// ttl}` with budget `{max_bytes, max_records}` and ttl (milliseconds)
/// each `nil` or a positive integer, heir
/// `:none | {pid, data}`, compression `:none | {:zlib, level} | :lz4 |
/// {:zstd, level, dictionary :: boolean} | :auto` and arena
/// `:memory | {:file, dir}`.
pub fn parse_new_args<'a>(env: Env<'a>, name: Atom, opts: Term<'a>) -> NifResult<NewArgs> {
    let malformed = || badarg("malformed table options");
    let [kind, named, protection, keypos, heir, compression, arena, budget, ttl]: [Term<'a>; 9] =
        rustler::types::tuple::get_tuple(opts)
            .map_err(|_| malformed())?
            .try_into()
            .map_err(|_| malformed())?;
    let kind: Atom = kind.decode().map_err(|_| malformed())?;
    let named: bool = named.decode().map_err(|_| malformed())?;
    let protection: Atom = protection.decode().map_err(|_| malformed())?;
    let keypos: usize = keypos.decode().map_err(|_| malformed())?;
    let kind = kind_of(kind)?;
    let protection = protection_of(protection)?;
    let heir = Heir::decode(heir)?;
    let auto = compression
        .decode::<Atom>()
        .is_ok_and(|a| a == atoms::auto());
    let compression = compression_of(compression)?;
    let backing = if arena.decode::<Atom>().is_ok_and(|a| a == atoms::memory()) {
        Backing::Memory
    } else if let Ok((_, dir, memory)) = arena.decode::<(Atom, Binary, u64)>() {
        // `{:file, dir, memory}`: tiered, memory first.
        Backing::Tiered(dir_path(dir)?, memory)
    } else {
        let (_, dir): (Atom, Binary) = arena.decode().map_err(|_| badarg("malformed arena"))?;
        Backing::File(dir_path(dir)?)
    };
    let label = name.to_term(env).atom_to_string().unwrap_or_default();
    Ok(NewArgs {
        kind,
        named,
        protection,
        keypos,
        heir,
        compression,
        auto,
        backing,
        label,
        budget: crate::budget::budget_of(budget)?,
        ttl: crate::budget::ttl_of(ttl)?,
    })
}

/// Wraps a core table into a registered resource owned by the caller;
/// returns the table's handle and id. `persist` makes it persistent.
pub fn install<'a>(
    env: Env<'a>,
    name: Atom,
    args: NewArgs,
    core: Arc<Table>,
    persist: Option<crate::persist::PersistRes>,
) -> NifResult<(Term<'a>, u64)> {
    let owner = env.pid();
    let meta = Meta {
        name,
        named: args.named,
        monitor: None,
        heir: args.heir,
    };
    let mut res = TableRes::new(
        core,
        args.keypos,
        args.protection,
        args.backing,
        owner,
        meta,
    );
    if let Some(p) = persist {
        res = res.with_persist(p);
    }
    let res = ResourceArc::new(res);
    // The caller is alive: it is making this call.
    let _ = res.set_owner(env, &res, &mut res.meta.lock(), owner);
    if !resource::register(env, &res, name, args.named) {
        resource::delete(&res);
        return Err(badarg("a table with this name already exists"));
    }
    let meta = res.meta.lock();
    Ok((tab_term(env, &res, &meta), res.id))
}

fn new_impl<'a>(env: Env<'a>, name: Atom, opts: Term<'a>) -> NifResult<Term<'a>> {
    let args = parse_new_args(env, name, opts)?;
    let core = match Table::new(&Options {
        backing: args.backing.clone(),
        compression: args.compression,
        label: args.label.clone(),
        kind: args.kind,
    }) {
        Ok(core) => core,
        Err(e) => return Err(errors::io_error(&e)),
    };
    if args.auto {
        core.set_auto();
    }
    core.set_budget(args.budget).map_err(errors::core)?;
    let core = Arc::new(core);
    core.compact_on_its_own();
    core.set_ttl(args.ttl).map_err(errors::core)?;
    install(env, name, args, core, None).map(|(tab, _)| tab)
}

#[rustler::nif]
fn new<'a>(env: Env<'a>, name: Atom, opts: Term<'a>) -> NifResult<Term<'a>> {
    new_impl(env, name, opts)
}

/// `new` for file arenas: creating and sizing the file is disk I/O.
#[rustler::nif(schedule = "DirtyIo")]
fn new_io<'a>(env: Env<'a>, name: Atom, opts: Term<'a>) -> NifResult<Term<'a>> {
    new_impl(env, name, opts)
}

/// Deletes the table. A persistent table answers `:"$heft_io"` instead:
/// closing it and removing its files is I/O (persist.rs `persist_close_io`);
/// so does `:"$heft_cpu"` a table whose lock a long change holds
/// (`delete_table_cpu` waits for it).
#[rustler::nif]
fn delete_table<'a>(env: Env<'a>, tab: Term<'a>) -> NifResult<Term<'a>> {
    delete_impl(env, tab, true)
}

#[rustler::nif(schedule = "DirtyCpu")]
fn delete_table_cpu<'a>(env: Env<'a>, tab: Term<'a>) -> NifResult<Term<'a>> {
    delete_impl(env, tab, false)
}

fn delete_impl<'a>(env: Env<'a>, tab: Term<'a>, quick: bool) -> NifResult<Term<'a>> {
    let t = resolve_arc(tab)?;
    if !t.may_write(env) {
        return Err(badarg(
            "only the owner may delete a protected or private table",
        ));
    }
    if t.persist.is_some() {
        return Ok(errors::retry_io(env));
    }
    if quick && !t.core.lock_free_within(heft_core::table::QUICK_LOCK_WAIT) {
        return Ok(errors::retry_cpu(env));
    }
    resource::delete(&t);
    Ok(true.encode(env))
}

#[rustler::nif]
fn give_away<'a>(env: Env<'a>, tab: Term<'a>, pid: Term<'a>, data: Term<'a>) -> NifResult<bool> {
    let t = resolve_arc(tab)?;
    let pid: LocalPid = pid.decode().map_err(|_| badarg("not a local pid"))?;
    if !t.caller_is_owner(env) {
        return Err(badarg("only the owner may give the table away"));
    }
    if pid == env.pid() {
        return Err(badarg("the owner cannot give the table to itself"));
    }
    if !env.is_process_alive(pid) {
        return Err(badarg("the receiving process is not alive"));
    }
    let mut meta = t.meta.lock();
    let from = t.owner();
    if !t.set_owner(env, &t, &mut meta, pid) {
        // It died since the check above: the table goes with it.
        drop(meta);
        resource::delete(&t);
        return Ok(true);
    }
    let msg = (atoms::heft_transfer(), tab_term(env, &t, &meta), from, data);
    let _ = env.send(&pid, msg);
    Ok(true)
}

#[rustler::nif]
fn set_heir<'a>(env: Env<'a>, tab: Term<'a>, heir: Term<'a>) -> NifResult<bool> {
    let t = resolve(tab)?;
    if !t.caller_is_owner(env) {
        return Err(badarg("only the owner may set the heir"));
    }
    let new = Heir::decode(heir)?;
    t.meta.lock().heir = new;
    Ok(true)
}

/// Sets the table's protection (`setopts/2`'s `{protection, p}`): owner
/// only.
#[rustler::nif]
fn set_protection<'a>(env: Env<'a>, tab: Term<'a>, protection: Atom) -> NifResult<bool> {
    let t = resolve(tab)?;
    if !t.caller_is_owner(env) {
        return Err(badarg("only the owner may set the table's protection"));
    }
    t.set_protection(protection_of(protection)?);
    Ok(true)
}

/// Renames the table. A named table answers with its new name; an unnamed
/// one (whose name only shows in info/1) with its identifier, as in ETS.
#[rustler::nif]
fn rename<'a>(env: Env<'a>, tab: Term<'a>, name: Atom) -> NifResult<Term<'a>> {
    let t = resolve_arc(tab)?;
    if !t.may_write(env) {
        return Err(badarg(
            "only the owner may rename a protected or private table",
        ));
    }
    resource::free_name(env, name);
    let mut meta = t.meta.lock();
    if !resource::rename(&t, &mut meta, name) {
        return Err(badarg("a table with this name already exists"));
    }
    Ok(tab_term(env, &t, &meta))
}

/// The identifier of the table named `name` (never the name itself), or
/// `:undefined`.
#[rustler::nif]
fn whereis(env: Env, name: Atom) -> Term {
    match resource::lookup_name(env, name) {
        Some(t) => tab_struct(env, &t),
        None => atoms::undefined().encode(env),
    }
}

#[rustler::nif]
fn all(env: Env) -> Vec<Term> {
    resource::all(env)
        .iter()
        .map(|t| {
            let meta = t.meta.lock();
            tab_term(env, t, &meta)
        })
        .collect()
}

/// The table's facts and figures as a map (Heft.info/1 orders them).
#[rustler::nif]
fn info<'a>(env: Env<'a>, tab: Term<'a>) -> NifResult<Term<'a>> {
    info_of(env, tab, true)
}

/// [`info`] on a dirty scheduler.
#[rustler::nif(schedule = "DirtyCpu")]
fn info_cpu<'a>(env: Env<'a>, tab: Term<'a>) -> NifResult<Term<'a>> {
    info_of(env, tab, false)
}

/// The figures of [`info`]; `quick`: its size counts the objects of
/// expired keys not yet swept, a lookup each, so past a few thousand
/// it answers `:"$heft_cpu"` for `info_cpu`.
fn info_of<'a>(env: Env<'a>, tab: Term<'a>, quick: bool) -> NifResult<Term<'a>> {
    let t = resolve_arc(tab)?;
    // The figures and the arena's file under the quick call's timed locks.
    let figures = || Ok::<_, heft_core::table::Error>((t.core.stats()?, t.core.arena_path()?));
    let s = match quick {
        true => heft_core::table::quick(figures),
        false => figures(),
    };
    if matches!(s, Err(heft_core::table::Error::TooLong)) {
        return Ok(errors::retry_cpu(env));
    }
    let (s, path) = s.map_err(errors::core)?;
    let path = path.unwrap_or_default();
    let meta = t.meta.lock();
    // An heir that has exited will never take the table: none, then.
    let heir = match &meta.heir {
        Some(h) if env.is_process_alive(h.pid) => h.pid.encode(env),
        _ => atoms::none().encode(env),
    };
    let arena = match &t.backing {
        Backing::Memory => atoms::memory().encode(env),
        Backing::File(_) => (atoms::file(), path.to_string_lossy().into_owned()).encode(env),
        Backing::Tiered(_, memory) => {
            let opts = vec![(atoms::memory(), *memory)];
            (atoms::file(), path.to_string_lossy().into_owned(), opts).encode(env)
        }
    };
    let mut pairs: Vec<(Term, Term)> = vec![
        (atoms::name().encode(env), meta.name.encode(env)),
        (atoms::named_table().encode(env), meta.named.encode(env)),
        (
            atoms::r#type().encode(env),
            kind_atom(t.core.kind()).encode(env),
        ),
        (atoms::owner().encode(env), t.owner().encode(env)),
        (atoms::heir().encode(env), heir),
        (
            atoms::protection().encode(env),
            protection_atom(t.protection()).encode(env),
        ),
        (atoms::keypos().encode(env), t.keypos.encode(env)),
        (atoms::size().encode(env), s.size.encode(env)),
        (atoms::index_bytes().encode(env), s.index_bytes.encode(env)),
        (atoms::meta_bytes().encode(env), s.meta_bytes.encode(env)),
        (
            atoms::arena_mapped_bytes().encode(env),
            s.arena_mapped_bytes.encode(env),
        ),
        (
            atoms::arena_used_bytes().encode(env),
            s.arena_used_bytes.encode(env),
        ),
        (
            atoms::arena_live_bytes().encode(env),
            s.arena_live_bytes.encode(env),
        ),
        (
            atoms::arena_free_bytes().encode(env),
            s.arena_free_bytes.encode(env),
        ),
        (
            atoms::arena_reclaimable_bytes().encode(env),
            s.arena_reclaimable_bytes.encode(env),
        ),
        (
            atoms::payload_raw_bytes().encode(env),
            s.payload_raw_bytes.encode(env),
        ),
        (
            atoms::payload_stored_bytes().encode(env),
            s.payload_stored_bytes.encode(env),
        ),
        (atoms::arena().encode(env), arena),
        (atoms::id().encode(env), tab_struct(env, &t)),
    ];
    pairs.extend(crate::learn::info_items(env, &t.core));
    pairs.push(crate::compact::info_item(env, &t.core));
    pairs.push(crate::budget::info_item(env, &s));
    pairs.push(crate::budget::expiry_item(env, &s));
    pairs.push(crate::budget::tier_item(env, &s));
    Term::map_from_pairs(env, &pairs).map_err(|_| badarg("internal error building info"))
}

/// What the kernel says of the table's two mappings (from
/// /proc/self/smaps): the arena's resident, dirty and swapped bytes and the
/// index's resident bytes. Reading smaps is file I/O, hence the dirty I/O
/// scheduler.
#[rustler::nif(schedule = "DirtyIo")]
fn kernel_view<'a>(env: Env<'a>, tab: Term<'a>) -> NifResult<Term<'a>> {
    let t = resolve(tab)?;
    let s = t.core.stats().map_err(errors::core)?;
    let mut starts = vec![s.arena_address, s.index_address];
    starts.extend(s.tier.map(|f| f.file_address));
    let found = accounting::mappings(&starts).map_err(|e| errors::io_error(&e))?;
    let arena = found.first().copied().flatten().unwrap_or_default();
    let index = found.get(1).copied().flatten().unwrap_or_default();
    let file = found.get(2).copied().flatten().unwrap_or_default();
    // A file arena's pages in the page cache are its memory too, mapped
    // into this process or not (smaps counts only the mapped ones). A
    // tiered arena's: its memory's mapping, and its file's pages so.
    let cached = t.core.arena_cached_bytes().map_err(errors::core)?;
    let resident = match (s.tier, cached) {
        (Some(_), c) => arena.resident + c.unwrap_or(0).max(file.resident),
        (None, c) => c.map_or(arena.resident, |c| c.max(arena.resident)),
    };
    let pairs = [
        (atoms::arena_resident_bytes(), resident),
        (atoms::arena_dirty_bytes(), arena.dirty + file.dirty),
        (atoms::arena_swap_bytes(), arena.swap + file.swap),
        (atoms::index_resident_bytes(), index.resident),
    ];
    Term::map_from_pairs(env, &pairs).map_err(|_| badarg("internal error building info"))
}

/// Fixes (`on` true) or unfixes the table once for the caller, as
/// `safe_fixtable/2`; `now` is the caller's `erlang:monotonic_time()`.
/// Needs read access, as in ETS.
/// On a normal scheduler, `:"$heft_cpu"` when the table's lock is held
/// long (`safe_fixtable_cpu` then waits for it).
#[rustler::nif]
fn safe_fixtable<'a>(env: Env<'a>, tab: Term<'a>, on: bool, now: i64) -> NifResult<Term<'a>> {
    match heft_core::table::quick(|| fix_impl(env, tab, on, now)) {
        Err(rustler::Error::Term(_)) if errors::take_too_long() => Ok(errors::retry_cpu(env)),
        r => r.map(|ok| ok.encode(env)),
    }
}

#[rustler::nif(schedule = "DirtyCpu")]
fn safe_fixtable_cpu<'a>(env: Env<'a>, tab: Term<'a>, on: bool, now: i64) -> NifResult<bool> {
    fix_impl(env, tab, on, now)
}

fn fix_impl<'a>(env: Env<'a>, tab: Term<'a>, on: bool, now: i64) -> NifResult<bool> {
    let t = resolve(tab)?;
    if !t.may_read(env) {
        return Err(badarg("the table is private: only its owner may fix it"));
    }
    let slot_bits = t.core.slot_bits().map_err(errors::core)?;
    t.fixations.fix(env, on, now, slot_bits);
    Ok(true)
}

/// `false`, or `{monotonic_time, [{pid, count}]}`: when the table became
/// fixed and who has it fixed how many times (fix.rs).
#[rustler::nif]
fn fixations<'a>(env: Env<'a>, tab: Term<'a>) -> NifResult<Term<'a>> {
    let t = resolve(tab)?;
    Ok(match t.fixations.get(env) {
        Some(fixed) => fixed.encode(env),
        None => false.encode(env),
    })
}

/// `[{start_address, name}]` of this process's anonymous arena mappings,
/// for Heft.Memory to tell them apart in /proc/self/smaps where the kernel
/// does not name anonymous memory.
#[rustler::nif]
fn anonymous_arenas() -> Vec<(u64, String)> {
    heft_core::arena::anon::live()
}

/// Whether the encoder reads terms in place (their layout matched this
/// VM's at load: codec::check_term_layout), for tests.
#[rustler::nif]
fn term_layout_checked() -> bool {
    crate::codec::term_layout_checked()
}

/// Tables whose storage is still allocated (for leak tests).
#[rustler::nif]
fn live_tables() -> usize {
    heft_core::table::live_tables()
}

/// Holds the table's write lock for `ms` milliseconds, as a long change
/// would (for tests of the calls that meet it).
#[rustler::nif(schedule = "DirtyCpu")]
fn debug_hold_lock(tab: Term, ms: u64) -> NifResult<bool> {
    let t = resolve_arc(tab)?;
    t.core
        .hold_lock(std::time::Duration::from_millis(ms))
        .map_err(errors::core)?;
    Ok(true)
}

/// Panics on purpose, so tests can check that a panic becomes an exception.
#[rustler::nif]
fn debug_panic() -> bool {
    panic!("deliberate panic from Heft.Native.debug_panic/0")
}
