//! Persistent tables on the VM side (heft_core::persist does the work):
//! opening and closing, commit waits, dumps, subscriptions, figures.
//!
//! Writes run on normal schedulers: the log append is a copy into a
//! mapping (heft_core::persist). When the log needs a new segment first,
//! the write answers `:"$heft_io"` and its DirtyIo twin makes room.
//!
//! Waiting without blocking a scheduler: a write to a `sync: :commit`
//! table appends to the log, registers
//! `(pid, ticket)` with the table's flusher thread and returns
//! `{:"$heft_wait", ticket, result}` at once. The flusher fdatasyncs once
//! for every record appended so far and sends each waiter it covers
//! `{:"$heft_done", ticket, :ok | {:error, reason}}`; Heft.Native.call
//! receives it in the caller. Dumps are waited for the same way.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use heft_core::persist::{
    Config, Event, Events, Failure, OverloadReason, Persisted, Stats, SyncMode,
};
use heft_core::recovery::OpenError;
use heft_core::Options;
use parking_lot::Mutex;
use rustler::{Atom, Binary, Encoder, Env, LocalPid, NewBinary, NifResult, OwnedEnv, Term};

use crate::admin::{install, parse_new_args};
use crate::errors::{self, badarg};
use crate::ops::{resolve, resolve_again, resolve_arc};
use crate::resource::{self, tab_term, TableRes};

mod atoms {
    rustler::atoms! {
        ok,
        error,
        none,
        commit,
        interval,
        memory,
        locked,
        corrupt,
        unsupported_version,
        closed,
        poisoned,
        enospc,
        eio,
        heft_wait = "$heft_wait",
        heft_done = "$heft_done",
        heft_overloaded,
        heft_dumped,
        heft_dump_failed,
        write_threshold,
        requested,
        // info keys
        persist,
        sync,
        log_fsyncs,
        log_bytes,
        log_records,
        log_batches,
        log_segments,
        commits,
        dumps,
        log_pending_records,
        overloaded,
        dumping,
        poisoned_log = "poisoned",
        recovered_snapshot_records,
        recovered_log_records,
        recovered_torn_bytes,
        repaired,
        dump_log_write_threshold,
        dump_log_time_threshold,
        behind_records,
        threshold,
        dump_running_ms,
        reason,
        records,
        atoms_ = "atoms",
        bytes,
        ms,
        file,
        offset,
        missing,
        records_dropped,
    }
}

/// A persistent table's state kept with its resource.
pub struct PersistRes {
    pub persisted: Persisted<NifEvents>,
    subscribers: Arc<Mutex<Vec<LocalPid>>>,
}

/// Sends a persistent table's news as messages (from its own threads).
pub struct NifEvents {
    table_id: Arc<AtomicU64>,
    subscribers: Arc<Mutex<Vec<LocalPid>>>,
}

/// Who waits: the process and the ticket it matches on.
pub type Waiter = (LocalPid, u64);

static TICKETS: AtomicU64 = AtomicU64::new(1);

fn failure_reason(f: Failure) -> Atom {
    match f {
        Failure::Io(Some(errno)) => errors::posix(&std::io::Error::from_raw_os_error(errno)),
        Failure::Io(None) => atoms::eio(),
        Failure::Poisoned => atoms::poisoned(),
        Failure::Closed => atoms::closed(),
    }
}

fn failure_term<'a>(env: Env<'a>, f: Failure) -> Term<'a> {
    (atoms::error(), failure_reason(f)).encode(env)
}

impl Events for NifEvents {
    type Waiter = Waiter;

    fn done(&self, waiters: Vec<Waiter>, result: Result<(), Failure>) {
        let mut env = OwnedEnv::new();
        for (pid, ticket) in waiters {
            let _ = env.send_and_clear(&pid, |env| {
                let outcome = match result {
                    Ok(()) => atoms::ok().encode(env),
                    Err(f) => failure_term(env, f),
                };
                (atoms::heft_done(), ticket, outcome).encode(env)
            });
        }
    }

    fn notify(&self, event: Event) {
        let subs: Vec<LocalPid> = self.subscribers.lock().clone();
        if subs.is_empty() {
            return;
        }
        let Some(res) = resource::lookup_id(self.table_id.load(Ordering::Acquire)) else {
            return;
        };
        let mut env = OwnedEnv::new();
        let mut gone = Vec::new();
        for pid in subs {
            let sent = env.send_and_clear(&pid, |env| {
                let tab = {
                    let meta = res.meta.lock();
                    tab_term(env, &res, &meta)
                };
                event_term(env, tab, &event)
            });
            if sent.is_err() {
                gone.push(pid);
            }
        }
        if !gone.is_empty() {
            self.subscribers.lock().retain(|p| !gone.contains(p));
        }
    }
}

fn event_term<'a>(env: Env<'a>, tab: Term<'a>, event: &Event) -> Term<'a> {
    match event {
        Event::Overloaded(o) => {
            let reason = match o.reason {
                OverloadReason::WriteThreshold => atoms::write_threshold(),
                OverloadReason::Requested => atoms::requested(),
            };
            let pairs = [
                (
                    atoms::behind_records().encode(env),
                    o.behind_records.encode(env),
                ),
                (atoms::threshold().encode(env), o.threshold.encode(env)),
                (
                    atoms::dump_running_ms().encode(env),
                    o.dump_running_ms.encode(env),
                ),
                (atoms::reason().encode(env), reason.encode(env)),
            ];
            let map = Term::map_from_pairs(env, &pairs).unwrap_or_else(|_| reason.encode(env));
            (atoms::heft_overloaded(), tab, map).encode(env)
        }
        Event::Dumped(d) => {
            let pairs = [
                (atoms::records().encode(env), d.written.records.encode(env)),
                (atoms::atoms_().encode(env), d.written.atoms.encode(env)),
                (atoms::bytes().encode(env), d.written.bytes.encode(env)),
                (atoms::ms().encode(env), d.ms.encode(env)),
            ];
            let map = Term::map_from_pairs(env, &pairs).unwrap_or_else(|_| d.ms.encode(env));
            (atoms::heft_dumped(), tab, map).encode(env)
        }
        Event::DumpFailed(f) => {
            let reason = failure_term(env, *f);
            (atoms::heft_dump_failed(), tab, reason).encode(env)
        }
    }
}

fn open_error<'a>(env: Env<'a>, e: &OpenError) -> Term<'a> {
    let reason = match e {
        OpenError::Locked => atoms::locked().encode(env),
        OpenError::Io(e) => errors::posix(e).encode(env),
        OpenError::Corrupt { file, offset } => {
            (atoms::corrupt(), file.as_str(), *offset).encode(env)
        }
        OpenError::Version { file, version } => {
            (atoms::unsupported_version(), file.as_str(), *version).encode(env)
        }
        OpenError::Missing(file) => (atoms::missing(), file.as_str()).encode(env),
        _ => atoms::eio().encode(env),
    };
    (atoms::error(), reason).encode(env)
}

fn dir_of(dir: Binary) -> NifResult<PathBuf> {
    let s =
        std::str::from_utf8(dir.as_slice()).map_err(|_| badarg("the directory is not UTF-8"))?;
    Ok(PathBuf::from(s))
}

/// `{:ok, meta_blob}` of the table stored in `dir`, or `{:error, reason}`
/// (`:enoent` when there is none).
#[rustler::nif(schedule = "DirtyIo")]
fn persist_meta_io<'a>(env: Env<'a>, dir: Binary<'a>) -> NifResult<Term<'a>> {
    let dir = dir_of(dir)?;
    Ok(match heft_core::persist::read_meta(&dir) {
        Ok(blob) => {
            let mut b = NewBinary::new(env, blob.len());
            b.as_mut_slice().copy_from_slice(&blob);
            (atoms::ok(), Term::from(b)).encode(env)
        }
        Err(e) => open_error(env, &e),
    })
}

/// Opens (creating with `meta` if absent) the table in `dir`:
/// `{:ok, tab}` or `{:error, reason}`. `args` as for `new`; `popts` is
/// `{sync, write_threshold, time_threshold_ms, repair, create}` with sync
/// `:none | {:interval, ms} | :commit`.
#[rustler::nif(schedule = "DirtyIo")]
fn persist_open_io<'a>(
    env: Env<'a>,
    name: Atom,
    table_args: Term<'a>,
    dir: Binary<'a>,
    popts: Term<'a>,
    meta: Binary<'a>,
) -> NifResult<Term<'a>> {
    let args = parse_new_args(env, name, table_args)?;
    let dir = dir_of(dir)?;
    let (sync, write_threshold, time_ms, repair, create): (Term, u64, u64, bool, bool) = popts
        .decode()
        .map_err(|_| badarg("malformed persistence options"))?;
    let sync = if sync.decode::<Atom>().is_ok_and(|a| a == atoms::none()) {
        SyncMode::None
    } else if sync.decode::<Atom>().is_ok_and(|a| a == atoms::commit()) {
        SyncMode::Commit
    } else {
        let (_, ms): (Atom, u64) = sync.decode().map_err(|_| badarg("malformed sync"))?;
        SyncMode::Interval(Duration::from_millis(ms.max(1)))
    };
    let config = Config {
        sync,
        dump_write_threshold: write_threshold.max(1),
        dump_time_threshold: Duration::from_millis(time_ms.max(1)),
        repair,
        ..Config::default()
    };
    let subscribers = Arc::new(Mutex::new(Vec::new()));
    let table_id = Arc::new(AtomicU64::new(0));
    let events = NifEvents {
        table_id: table_id.clone(),
        subscribers: subscribers.clone(),
    };
    let opts = Options {
        backing: args.backing.clone(),
        compression: args.compression,
        label: args.label.clone(),
        kind: args.kind,
    };
    // A table of this VM holding `dir` whose owner died is closed now, and
    // the open below waits for that close (resource.rs, "Owner death").
    let _ = resource::all(env);
    let opened = match Persisted::open(&dir, meta.as_slice(), create, &opts, config, events) {
        Ok(o) => o,
        Err(e) => return Ok(open_error(env, &e)),
    };
    if args.auto {
        // `compression: :auto` chooses its codec again from its records
        // (the choice is not stored).
        opened.table.set_auto();
    } else if !opened.table.dictionaries().is_empty() {
        // It trained before it was closed: its dictionaries came back.
        opened.table.learned_before();
    }
    // A budget is not stored with the table: the options given now bound
    // it, evicting (and logging) down to them at once.
    if let Err(e) = opened.table.set_budget(args.budget) {
        return Err(crate::errors::core(e));
    }
    // Nor are deadlines: with a time to live, every key gets it afresh.
    if let Err(e) = opened.table.set_ttl(args.ttl) {
        return Err(crate::errors::core(e));
    }
    let p = PersistRes {
        persisted: opened.persisted,
        subscribers,
    };
    let (tab, id) = install(env, name, args, opened.table, Some(p))?;
    table_id.store(id, Ordering::Release);
    Ok((atoms::ok(), tab).encode(env))
}

/// Stores `meta` as the META blob of the persistent table (after a
/// rename): `:ok` or `{:error, posix}`.
#[rustler::nif(schedule = "DirtyIo")]
fn persist_write_meta_io<'a>(env: Env<'a>, tab: Term<'a>, meta: Binary<'a>) -> NifResult<Term<'a>> {
    let t = resolve(tab)?;
    let p = persistent(&t)?;
    Ok(match p.persisted.write_meta(meta.as_slice()) {
        Ok(()) => atoms::ok().encode(env),
        Err(e) => (atoms::error(), errors::posix(&e)).encode(env),
    })
}

fn persistent(t: &TableRes) -> NifResult<&PersistRes> {
    t.persist
        .as_ref()
        .ok_or_else(|| badarg("the table is not persistent (created without :persist)"))
}

/// Closes a persistent table: it is deleted from the VM, its log synced
/// and closed, its lock released; with `remove`, its files are removed.
/// `:ok` or `{:error, reason}` (`:poisoned` if a sync had failed).
#[rustler::nif(schedule = "DirtyIo")]
fn persist_close_io<'a>(env: Env<'a>, tab: Term<'a>, remove: bool) -> NifResult<Term<'a>> {
    let t = resolve_arc(tab)?;
    let p = persistent(&t)?;
    if !t.may_write(env) {
        return Err(badarg(
            "only the owner may close a protected or private table",
        ));
    }
    // Expired keys not yet swept go now, logged, so that the table
    // reopens without them (a failed log stops this; they then stay).
    while matches!(t.core.sweep(4096), Ok(4096)) {}
    resource::delete(&t);
    let closed = p.persisted.close();
    if remove {
        if let Err(e) = heft_core::persist::remove_files(p.persisted.dir()) {
            return Ok((atoms::error(), errors::posix(&e)).encode(env));
        }
    }
    Ok(match closed {
        Ok(()) => atoms::ok().encode(env),
        Err(f) => failure_term(env, f),
    })
}

fn wait_marker<'a>(env: Env<'a>, ticket: u64, result: Term<'a>) -> Term<'a> {
    (atoms::heft_wait(), ticket, result).encode(env)
}

/// Makes the caller wait until everything logged so far is durable:
/// `result` at once if it is, else `{:"$heft_wait", ticket, result}`;
/// `{:error, :poisoned | :closed}` when it never will be.
pub fn await_durable<'a>(env: Env<'a>, t: &TableRes, result: Term<'a>) -> NifResult<Term<'a>> {
    let p = persistent(t)?;
    let ticket = TICKETS.fetch_add(1, Ordering::Relaxed);
    match p.persisted.await_durable((env.pid(), ticket)) {
        Ok(Some(_)) => Ok(result),
        Ok(None) => Ok(wait_marker(env, ticket, result)),
        Err(f) => Ok(failure_term(env, f)),
    }
}

/// After a write NIF: a write that found no room in its table's log
/// becomes the `:"$heft_io"` retry marker; for a `sync: :commit` table, its
/// result becomes a wait for the commit. Retry markers pass through.
pub fn after_write<'a>(
    env: Env<'a>,
    tab: Term<'a>,
    result: NifResult<Term<'a>>,
) -> NifResult<Term<'a>> {
    let vm_refs = crate::vm_refs::take_seen();
    if errors::take_would_block() {
        return Ok(errors::retry_io(env));
    }
    if errors::take_too_long() {
        return Ok(errors::retry_cpu(env));
    }
    let result = result?;
    if result.is_atom() && errors::is_retry(result) {
        return Ok(result);
    }
    let Ok(t) = resolve_again(tab) else {
        return Ok(result);
    };
    crate::vm_refs::keep(env, &t, vm_refs);
    crate::compact::after_write(&t.core);
    match &t.persist {
        Some(p) if p.persisted.config().sync == SyncMode::Commit => await_durable(env, &t, result),
        _ => Ok(result),
    }
}

/// Runs a write on a dirty I/O scheduler: when the table's log needs a new
/// segment first, makes it (blocking) and tries again.
pub fn with_room<'a>(
    env: Env<'a>,
    tab: Term<'a>,
    write: impl Fn() -> NifResult<Term<'a>>,
) -> NifResult<Term<'a>> {
    loop {
        let r = write();
        if !errors::take_would_block() {
            return r;
        }
        let t = resolve_again(tab)?;
        if let Some(p) = &t.persist {
            if let Err(f) = p.persisted.make_room() {
                return Ok(failure_term(env, f));
            }
        }
    }
}

/// Makes room in a persistent table's log (blocking: dirty schedulers
/// only), for a write that failed with `WouldBlock` inside an operation
/// that writes several times and so cannot simply be run again from the
/// start. `Err` carries `{:error, reason}` when the disk is full.
pub fn make_room(t: &TableRes) -> NifResult<()> {
    errors::take_would_block();
    match t.persist.as_ref().map(|p| p.persisted.make_room()) {
        Some(Err(f)) => Err(rustler::Error::Term(Box::new(failure_reason(f)))),
        _ => Ok(()),
    }
}

/// `:ok` once everything logged so far is on stable storage, through
/// `{:"$heft_wait", ticket, :ok}`; `{:error, reason}`.
#[rustler::nif]
fn persist_sync<'a>(env: Env<'a>, tab: Term<'a>) -> NifResult<Term<'a>> {
    let t = resolve(tab)?;
    await_durable(env, &t, atoms::ok().encode(env))
}

/// Starts a dump: `{:"$heft_wait", ticket, :ok}` answered when a dump
/// begun after this call ends; `{:error, :closed}`.
#[rustler::nif]
fn persist_dump<'a>(env: Env<'a>, tab: Term<'a>) -> NifResult<Term<'a>> {
    let t = resolve(tab)?;
    let p = persistent(&t)?;
    let ticket = TICKETS.fetch_add(1, Ordering::Relaxed);
    Ok(match p.persisted.request_dump(Some((env.pid(), ticket))) {
        Ok(()) => wait_marker(env, ticket, atoms::ok().encode(env)),
        Err(f) => failure_term(env, f),
    })
}

/// Adds (`true`) or removes `pid` as a subscriber of the table's news.
#[rustler::nif]
fn persist_subscribe(tab: Term, pid: LocalPid, on: bool) -> NifResult<Atom> {
    let t = resolve(tab)?;
    let p = persistent(&t)?;
    let mut subs = p.subscribers.lock();
    subs.retain(|s| *s != pid);
    if on {
        subs.push(pid);
    }
    Ok(atoms::ok())
}

/// Persistence figures as a map, or `nil` for a table in memory only.
#[rustler::nif]
fn persist_info<'a>(env: Env<'a>, tab: Term<'a>) -> NifResult<Term<'a>> {
    let t = resolve(tab)?;
    let Some(p) = &t.persist else {
        return Ok(rustler::types::atom::nil().encode(env));
    };
    let s: Stats = p.persisted.stats();
    let c = p.persisted.config();
    let sync = match c.sync {
        SyncMode::None => atoms::none().encode(env),
        SyncMode::Commit => atoms::commit().encode(env),
        SyncMode::Interval(d) => (atoms::interval(), d.as_millis() as u64).encode(env),
    };
    let overloaded = match s.overloaded {
        None => false.encode(env),
        Some(o) => {
            let pairs = [
                (
                    atoms::behind_records().encode(env),
                    s.log_pending_records.encode(env),
                ),
                (atoms::threshold().encode(env), o.threshold.encode(env)),
                (
                    atoms::dump_running_ms().encode(env),
                    s.dump_running_ms.unwrap_or(0).encode(env),
                ),
            ];
            Term::map_from_pairs(env, &pairs).unwrap_or_else(|_| true.encode(env))
        }
    };
    let repaired = match &s.recovery.dropped {
        None => false.encode(env),
        Some(d) => {
            let pairs = [
                (atoms::file().encode(env), d.file.as_str().encode(env)),
                (atoms::offset().encode(env), d.offset.encode(env)),
                (atoms::bytes().encode(env), d.bytes.encode(env)),
                (
                    atoms::records_dropped().encode(env),
                    s.recovery.records_dropped.encode(env),
                ),
            ];
            Term::map_from_pairs(env, &pairs).unwrap_or_else(|_| true.encode(env))
        }
    };
    let dir = p.persisted.dir().to_string_lossy().into_owned();
    let pairs: Vec<(Term, Term)> = vec![
        (atoms::persist().encode(env), dir.encode(env)),
        (atoms::sync().encode(env), sync),
        (
            atoms::dump_log_write_threshold().encode(env),
            c.dump_write_threshold.encode(env),
        ),
        (
            atoms::dump_log_time_threshold().encode(env),
            (c.dump_time_threshold.as_millis() as u64).encode(env),
        ),
        (atoms::log_fsyncs().encode(env), s.log_fsyncs.encode(env)),
        (atoms::log_bytes().encode(env), s.log_bytes.encode(env)),
        (atoms::log_records().encode(env), s.log_records.encode(env)),
        (atoms::log_batches().encode(env), s.log_batches.encode(env)),
        (
            atoms::log_segments().encode(env),
            s.log_segments.encode(env),
        ),
        (atoms::commits().encode(env), s.commits.encode(env)),
        (atoms::dumps().encode(env), s.dumps.encode(env)),
        (
            atoms::log_pending_records().encode(env),
            s.log_pending_records.encode(env),
        ),
        (atoms::overloaded().encode(env), overloaded),
        (
            atoms::dumping().encode(env),
            s.dump_running_ms.is_some().encode(env),
        ),
        (atoms::poisoned_log().encode(env), s.poisoned.encode(env)),
        (
            atoms::recovered_snapshot_records().encode(env),
            s.recovery.snapshot_records.encode(env),
        ),
        (
            atoms::recovered_log_records().encode(env),
            s.recovery.replayed_ops.encode(env),
        ),
        (
            atoms::recovered_torn_bytes().encode(env),
            s.recovery.torn_bytes.encode(env),
        ),
        (atoms::repaired().encode(env), repaired),
    ];
    Term::map_from_pairs(env, &pairs).map_err(|_| badarg("internal error building info"))
}

/// Arms a fault in the table's log (tests): `:eio` fails the `n`th sync
/// from now, `:enospc` the `n`th append.
#[rustler::nif]
fn persist_inject_fault(tab: Term, fault: Atom, n: u64) -> NifResult<Atom> {
    let t = resolve(tab)?;
    let p = persistent(&t)?;
    let f = p.persisted.faults();
    if fault == atoms::eio() {
        f.eio_after.store(n, Ordering::Relaxed);
    } else if fault == atoms::enospc() {
        f.enospc_after.store(n, Ordering::Relaxed);
    } else {
        return Err(badarg("fault must be :eio or :enospc"));
    }
    Ok(atoms::ok())
}
