//! A persistent table's live side: the write-ahead log every change goes
//! through, the flusher thread that fsyncs it (group commit), the dumper
//! thread that folds the log into a snapshot, and opening and closing.
//! Formats, and what each sync mode guarantees:
//! docs/persistence-format.md.
//!
//! The log. Its segments are preallocated files mapped shared: an append
//! is a copy of the frame into the mapping at the tail, under the table's
//! write lock, and makes no system call, so writes run on the VM's normal
//! schedulers whatever the sync mode. Once copied, the frame is in the page
//! cache and survives the VM's death; the flusher's fdatasync puts it on
//! disk. The next segment is made ahead of time by the flusher thread; a
//! write that finds the current segment full moves to it (sealing the full
//! one with an end frame) still without a system call. Only if there is no
//! such spare, or it is too small for the frame, does the write fail with
//! [`TableError::WouldBlock`]: the NIF then calls [`Persisted::make_room`]
//! on a dirty I/O scheduler and tries again.
//!
//! Threads. Each open table has two: the flusher (fdatasync for commit
//! waiters, or every interval; syncing and trimming full segments; making
//! the spare) and the dumper (snapshots). Both stop when the table is
//! closed; the last one out closes the log and releases the directory lock.
//! No I/O is done under the table's lock.
//!
//! Lock order: `creating`, then the table lock, then `log`, then the atom
//! dictionary or the list of zstd dictionaries; `syncing` before `log`
//! and `manifest`; `ctl` is never held while taking `log`.
//!
//! What a power loss keeps. Every segment below the MANIFEST's `last` is
//! synced whole, end frame included, before the MANIFEST names `last`
//! (a sync round finishes the sealed segments first; opening syncs what
//! it replayed), so only segments from `last` on can have lost pages,
//! and recovery cuts those as a torn tail. A dump seals the segment its
//! copy ended in and syncs the log up to there before its snapshot can be
//! found: the snapshot never holds a write the log it needs lost.

use std::collections::HashMap;
use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{compiler_fence, AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLock};

use crate::atoms::AtomTable;
use crate::dict::Dictionaries;
use crate::recovery::{self, OpenError, Recovery, LOCK, META};
use crate::snapshot::{self, sync_dir, SnapshotError, Written};
use crate::table::{Change, Error as TableError, Journal, Options, Table};
use crate::wal::{self, Faults, FrameBuf, Op, Segment, END_RESERVE, HEADER_LEN};

/// When a write is on stable storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncMode {
    /// In the page cache before the call returns; synced only by dumps,
    /// `sync` calls, commit writes and when a segment fills up.
    None,
    /// Also fdatasync'ed by the flusher at most this often.
    Interval(Duration),
    /// The call returns once its change is synced (group commit).
    Commit,
}

/// A write threshold dump also waits for the log to hold the table's
/// records at its last dump divided by this: a dump writes every record,
/// so with a fixed count of writes a large table under steady writes
/// would be dumped back to back, each dump rewriting it whole (and its
/// thread, walking the table, slowing the writers it competes with).
/// With half, writing a table's worth of records costs at most about
/// two dumps of it. Recovery replays at most that much log on top of
/// the snapshot.
pub const DUMP_FLOOR_DIVISOR: u64 = 2;

/// How a persistent table behaves.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// The table's sync mode.
    pub sync: SyncMode,
    /// Dump once the log holds this many writes (records put or removed)
    /// and at least the records the table held at its last dump divided by
    /// [`DUMP_FLOOR_DIVISOR`] (a dump rewrites the whole table).
    pub dump_write_threshold: u64,
    /// Dump once this long has passed since the last dump, if the log
    /// holds any write.
    pub dump_time_threshold: Duration,
    /// On damage before the log's tail, keep what precedes it instead of
    /// refusing to open.
    pub repair: bool,
    /// The largest log segment, in bytes. A table starts with segments of
    /// 1 MiB (or this, if smaller) and doubles them each time one fills
    /// up, up to this. Each holds its whole size on disk until it is full
    /// or the table closes.
    pub segment_bytes: u64,
}

/// The first segments' size.
const FIRST_SEGMENT: u64 = 1 << 20;

impl Default for Config {
    fn default() -> Self {
        Config {
            sync: SyncMode::None,
            dump_write_threshold: 50_000,
            dump_time_threshold: Duration::from_secs(180),
            repair: false,
            segment_bytes: 64 << 20,
        }
    }
}

/// Why a waiter's wait ended without success.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The sync or dump failed with this OS error (`None`: not an OS
    /// error). After a failed sync the log is poisoned.
    Io(Option<i32>),
    /// The log refuses work since an earlier failed sync.
    Poisoned,
    /// The table was closed first.
    Closed,
}

impl Failure {
    fn io(e: &io::Error) -> Failure {
        Failure::Io(e.raw_os_error())
    }
}

/// Why subscribers are told the table is overloaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OverloadReason {
    /// The log reached the write threshold again while a dump ran.
    WriteThreshold,
    /// `dump` was called while a dump ran.
    Requested,
}

/// A dump was wanted while one was still running.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Overload {
    /// Writes logged since the running dump began: what the next dump
    /// must fold in.
    pub behind_records: u64,
    /// The write threshold.
    pub threshold: u64,
    /// How long the running dump has taken so far.
    pub dump_running_ms: u64,
    /// What wanted the dump.
    pub reason: OverloadReason,
}

/// A finished dump.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dumped {
    /// What the snapshot holds.
    pub written: Written,
    /// How long it took.
    pub ms: u64,
}

/// What subscribers hear.
#[derive(Clone, Copy, Debug)]
pub enum Event {
    /// A dump was wanted while one ran.
    Overloaded(Overload),
    /// A dump finished.
    Dumped(Dumped),
    /// A dump failed; the log keeps everything, the next dump retries.
    DumpFailed(Failure),
}

/// How a persistent table reports to its users (the NIF sends messages).
/// Called only on the table's own threads (never on a caller's, which may
/// be a VM scheduler), and never under its locks.
pub trait Events: Send + Sync + 'static {
    /// Who waits for a commit or a dump.
    type Waiter: Send + 'static;
    /// The waiters' changes are durable (`Ok`), or cannot be made so.
    fn done(&self, waiters: Vec<Self::Waiter>, result: Result<(), Failure>);
    /// Something subscribers should hear about.
    fn notify(&self, event: Event);
}

/// Figures about a persistent table.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    /// fdatasync calls on log segments since the table was opened.
    pub log_fsyncs: u64,
    /// Bytes appended to the log since the table was opened.
    pub log_bytes: u64,
    /// Writes (records put or removed, clears) logged since opened.
    pub log_records: u64,
    /// Frames (write calls) logged since opened.
    pub log_batches: u64,
    /// Log segments started since opened (at open, when one fills up, at
    /// each dump).
    pub log_segments: u64,
    /// Commit waits answered (successfully) since opened.
    pub commits: u64,
    /// Dumps finished since opened.
    pub dumps: u64,
    /// Writes logged since the last dump began (what the next folds in).
    pub log_pending_records: u64,
    /// Set while a dump was wanted during a running one; cleared when a
    /// dump ends with the log under its threshold.
    pub overloaded: Option<Overload>,
    /// Milliseconds the running dump has taken, if one runs.
    pub dump_running_ms: Option<u64>,
    /// True once a sync failed: writes are refused until reopened.
    pub poisoned: bool,
    /// What opening found.
    pub recovery: Recovery,
}

#[derive(Default)]
struct Counters {
    fsyncs: AtomicU64,
    bytes: AtomicU64,
    records: AtomicU64,
    commits: AtomicU64,
    dumps: AtomicU64,
    /// Writes since the last rotation (dump start).
    pending: AtomicU64,
    /// Records re-compressed (not logged) since the last rotation: they
    /// count as writes for the dump thresholds, so that a dump stores
    /// them as they are now.
    rewritten: AtomicU64,
    /// Segments started.
    segments: AtomicU64,
    /// The records the table held at its last dump over
    /// [`DUMP_FLOOR_DIVISOR`].
    dump_floor: AtomicU64,
}

struct LogInner {
    /// The segment appended to; `None` if there was no disk space for one
    /// when the table opened (writes then make room first, and fail while
    /// the disk is full).
    segment: Option<Segment>,
    /// The number of the segment to make when there is none.
    first_seq: u64,
    /// The first segment a reopen replays (the snapshot's start): every
    /// segment from it on is on disk.
    log_start: u64,
    /// Set when the table closes: writes are refused.
    closed: bool,
    /// The next segment, made ahead of time.
    spare: Option<Segment>,
    /// Sealed segments, to be synced and cut to their log by the flusher.
    retired: Vec<Segment>,
    /// The size for the next spare.
    next_capacity: u64,
    /// Atom ids below this are in the log or the snapshot.
    logged_atoms: usize,
    /// zstd dictionaries with ids up to this are in the log or the
    /// snapshot.
    logged_dicts: usize,
    frame: FrameBuf,
    lock_file: Option<File>,
}

struct Ctl<W> {
    waiters: Vec<(u64, W)>,
    dump_waiters: Vec<W>,
    dump_requested: bool,
    dumping_since: Option<Instant>,
    last_dump: Instant,
    /// The flusher has segments to retire or a spare to make.
    segment_work: bool,
    overloaded: Option<Overload>,
    /// Events for the flusher thread to deliver.
    outbox: Vec<Event>,
    threads: usize,
    closed: bool,
    close_result: Result<(), Failure>,
}

struct Shared<E: Events> {
    dir: PathBuf,
    canonical: PathBuf,
    config: Config,
    events: E,
    table: Weak<Table>,
    atoms: Arc<RwLock<AtomTable>>,
    dicts: Arc<Dictionaries>,
    log: Mutex<LogInner>,
    ctl: Mutex<Ctl<E::Waiter>>,
    flush_cv: Condvar,
    dump_cv: Condvar,
    closed_cv: Condvar,
    /// Frames appended since opened (the log sequence number of the last).
    appended: AtomicU64,
    /// Frames known to be on stable storage.
    synced: AtomicU64,
    /// Bytes of the largest frame that found no room (see `make_room`).
    wanted: AtomicU64,
    /// The flusher sleeps with nothing to sync (interval mode): the next
    /// write wakes it.
    idle: AtomicBool,
    /// Held while a segment is made, so that one is made at a time.
    creating: Mutex<()>,
    /// Held through a sync round, so that the manifest names a segment
    /// only once every segment before it is synced whole.
    syncing: Mutex<()>,
    poisoned: AtomicBool,
    stop: AtomicBool,
    faults: Faults,
    c: Counters,
    recovery: Recovery,
    signal: Arc<CloseSignal>,
    /// The MANIFEST as last written (lock order: after `log`, never held
    /// while taking it).
    manifest: Mutex<recovery::Manifest>,
}

/// Lets an open of a directory wait for this VM's own close of it (an
/// owner that died closes its table on the table's threads).
#[derive(Default)]
struct CloseSignal {
    closing: AtomicBool,
    done: Mutex<bool>,
    cv: Condvar,
}

/// Directories with a table open in this OS process, by canonical path.
static OPEN: LazyLock<Mutex<HashMap<PathBuf, Arc<CloseSignal>>>> = LazyLock::new(Default::default);

/// The longest a sync waits for more committers to join it.
const COMMIT_DELAY: Duration = Duration::from_micros(500);

/// How long an open waits for this process's own close of the directory.
const CLOSE_WAIT: Duration = Duration::from_secs(60);

/// A persistent table: its log, threads and directory lock. Dropping it
/// closes the table (without waiting).
pub struct Persisted<E: Events> {
    shared: Arc<Shared<E>>,
}

/// What [`Persisted::open`] gives.
pub struct Opened<E: Events> {
    /// The loaded table, logging every change from now on.
    pub table: Arc<Table>,
    /// Its persistence.
    pub persisted: Persisted<E>,
    /// The META blob now stored.
    pub meta: Vec<u8>,
}

impl<E: Events> Persisted<E> {
    /// Opens (or, with `create`, creates) the table stored in `dir`: takes
    /// the directory's lock, writes `meta` as the META blob if it differs
    /// from the stored one, loads the snapshot, replays the log, starts a
    /// new log segment and the table's threads.
    ///
    /// Errors: [`OpenError::Locked`] if the table is open (here or in
    /// another OS process); `Io(NotFound)` without `create` if `dir` holds
    /// no table; `Io(EPERM)` if `dir` belongs to another user, `Io(ELOOP)`
    /// for a link planted at a table file; `Corrupt` / `Missing` /
    /// `Version` for damaged, missing or newer files.
    pub fn open(
        dir: &Path,
        meta: &[u8],
        create: bool,
        opts: &Options,
        config: Config,
        events: E,
    ) -> Result<Opened<E>, OpenError> {
        if create {
            DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
        } else if fs::symlink_metadata(dir.join(META)).is_err() {
            return Err(OpenError::Io(io::ErrorKind::NotFound.into()));
        }
        // Ours alone: tightened to 0700 if others may enter it, refused
        // (EPERM) if it belongs to another user.
        crate::files::private_dir(dir)?;
        let canonical = dir.canonicalize()?;
        let signal = claim(&canonical)?;
        let opened = Self::open_locked(dir, &canonical, meta, opts, config, events, &signal);
        if opened.is_err() {
            release(&canonical, &signal);
        }
        opened
    }

    #[allow(clippy::too_many_arguments)]
    fn open_locked(
        dir: &Path,
        canonical: &Path,
        new: &[u8],
        opts: &Options,
        config: Config,
        events: E,
        signal: &Arc<CloseSignal>,
    ) -> Result<Opened<E>, OpenError> {
        let lock_file = lock(dir)?;
        // `open` checked that META exists unless creating.
        // A META of an older format version is rewritten once the
        // directory has been upgraded (below), so that a version 3 META
        // tells that a MANIFEST must exist.
        let (fresh, meta_version, rewrite) = match recovery::read_meta_version(dir) {
            Ok((stored, v)) => (false, v, stored != new || v < wal::VERSION),
            Err(OpenError::Io(e)) if e.kind() == io::ErrorKind::NotFound => {
                recovery::write_meta(dir, new)?;
                (true, wal::VERSION, false)
            }
            Err(OpenError::Corrupt { .. }) if config.repair => (false, wal::VERSION, true),
            Err(e) => return Err(e),
        };
        let meta = new.to_vec();
        // The table hashes keys with the key it stored, so that its index
        // is ordered as its snapshot was written and loading need not
        // sort (recovery::HASH_KEY); a table without one stores its own.
        let mut table = Table::new(opts)?;
        match recovery::read_hash_key(dir) {
            Some(hash) => {
                table.set_hasher(hash);
            }
            None => {
                let _ = recovery::write_hash_key(dir, &table.hasher());
            }
        }
        let table = Arc::new(table);
        table.compact_on_its_own();
        let rec = recovery::recover(dir, &table, config.repair, fresh, meta_version)?;
        let first = FIRST_SEGMENT.min(config.segment_bytes);
        // On a full disk the table opens without a segment (readable; a
        // write makes one, or fails with ENOSPC).
        let mut segment = match new_segment(dir, rec.next_seq, first, 0, &rec.id) {
            Ok(seg) => Some(seg),
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => None,
            Err(e) => return Err(e.into()),
        };
        let log_start = rec.segments.first().copied().unwrap_or(rec.next_seq);
        // What must exist from now on: written before the table takes a
        // write, so a segment it appends to is never unaccounted for.
        let mut manifest = recovery::Manifest {
            id: rec.id,
            first: log_start,
            last: segment.as_ref().map_or(rec.next_seq - 1, |s| s.seq),
            snapshot: rec.snapshot,
            clean: false,
        };
        match recovery::write_manifest(dir, &manifest) {
            Ok(()) => {}
            // A full disk: the table opens without a segment, as when it
            // has no room for one; the manifest is written before one is
            // made (`ensure_spare`; `clean` forces that write).
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
                if let Some(seg) = segment.take() {
                    discard(dir, seg);
                }
                manifest.last = rec.next_seq - 1;
                manifest.clean = true;
            }
            Err(e) => return Err(e.into()),
        }
        if rewrite {
            recovery::write_meta(dir, new)?;
        }
        let started = u64::from(segment.is_some());
        let atoms = table.atoms().clone();
        let logged_atoms = atoms.read().len();
        let logged_dicts = table.dictionaries().len();
        let repaired = rec.dropped.is_some();
        let shared = Arc::new(Shared {
            dir: dir.to_path_buf(),
            canonical: canonical.to_path_buf(),
            config,
            events,
            table: Arc::downgrade(&table),
            atoms,
            dicts: table.dictionaries().clone(),
            log: Mutex::new(LogInner {
                segment,
                first_seq: rec.next_seq,
                log_start,
                closed: false,
                spare: None,
                retired: Vec::new(),
                next_capacity: first,
                logged_atoms,
                logged_dicts,
                frame: FrameBuf::new(),
                lock_file: Some(lock_file),
            }),
            ctl: Mutex::new(Ctl {
                waiters: Vec::new(),
                dump_waiters: Vec::new(),
                dump_requested: false,
                dumping_since: None,
                last_dump: Instant::now(),
                segment_work: true,
                overloaded: None,
                outbox: Vec::new(),
                threads: 0,
                closed: false,
                close_result: Ok(()),
            }),
            flush_cv: Condvar::new(),
            dump_cv: Condvar::new(),
            closed_cv: Condvar::new(),
            appended: AtomicU64::new(0),
            synced: AtomicU64::new(0),
            wanted: AtomicU64::new(0),
            idle: AtomicBool::new(false),
            creating: Mutex::new(()),
            syncing: Mutex::new(()),
            poisoned: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            faults: Faults::default(),
            c: Counters {
                segments: AtomicU64::new(started),
                ..Counters::default()
            },
            recovery: rec,
            signal: signal.clone(),
            manifest: Mutex::new(manifest),
        });
        if repaired {
            // Leave a clean directory: a snapshot of what was kept.
            shared.dump().map_err(|f| match f {
                Failure::Io(Some(errno)) => OpenError::Io(io::Error::from_raw_os_error(errno)),
                _ => OpenError::Io(io::Error::other("dump after repair failed")),
            })?;
        }
        let journal: Arc<dyn Journal> = shared.clone();
        table.set_journal(journal);
        spawn(&shared, "heft-flush", Shared::flusher)?;
        if let Err(e) = spawn(&shared, "heft-dump", Shared::dumper) {
            shared.begin_close();
            return Err(e.into());
        }
        Ok(Opened {
            table,
            persisted: Persisted { shared },
            meta,
        })
    }

    /// The table's directory.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// The table's configuration.
    pub fn config(&self) -> &Config {
        &self.shared.config
    }

    /// Waits (without blocking the caller) until everything logged so far
    /// is on stable storage. `Ok(Some(w))` hands the waiter back when that
    /// is already so; `Ok(None)` means it was queued and
    /// [`Events::done`] will answer it.
    pub fn await_durable(&self, w: E::Waiter) -> Result<Option<E::Waiter>, Failure> {
        let s = &self.shared;
        let lsn = s.appended.load(Ordering::Acquire);
        if s.poisoned.load(Ordering::Acquire) {
            return Err(Failure::Poisoned);
        }
        let mut ctl = s.ctl.lock();
        if ctl.closed {
            return Err(Failure::Closed);
        }
        if s.synced.load(Ordering::Acquire) >= lsn {
            s.c.commits.fetch_add(1, Ordering::Relaxed);
            return Ok(Some(w));
        }
        ctl.waiters.push((lsn, w));
        drop(ctl);
        s.flush_cv.notify_one();
        Ok(None)
    }

    /// Asks for a dump; `w`, if given, is answered when a dump that began
    /// after this call ends. Reports an overload if one is running.
    /// `Err(Closed)` (dropping `w`) if the table is closed.
    pub fn request_dump(&self, w: Option<E::Waiter>) -> Result<(), Failure> {
        self.shared.request_dump(w, OverloadReason::Requested)
    }

    /// Makes room in the log for the write that just failed with
    /// [`TableError::WouldBlock`]: a spare segment large enough for it.
    /// Blocking (it may create and sync a file): call it where blocking is
    /// allowed, then retry the write.
    pub fn make_room(&self) -> Result<(), Failure> {
        let s = &self.shared;
        if s.poisoned.load(Ordering::Acquire) {
            return Err(Failure::Poisoned);
        }
        s.ensure_spare(s.wanted.swap(0, Ordering::AcqRel))
    }

    /// Replaces the stored META blob (temporary file, fsync, rename,
    /// directory fsync): after a rename, say. Blocking.
    pub fn write_meta(&self, blob: &[u8]) -> io::Result<()> {
        recovery::write_meta(&self.shared.dir, blob)
    }

    /// Current figures.
    pub fn stats(&self) -> Stats {
        let s = &self.shared;
        let ctl = s.ctl.lock();
        Stats {
            log_fsyncs: s.c.fsyncs.load(Ordering::Relaxed),
            log_bytes: s.c.bytes.load(Ordering::Relaxed),
            log_records: s.c.records.load(Ordering::Relaxed),
            log_batches: s.appended.load(Ordering::Relaxed),
            log_segments: s.c.segments.load(Ordering::Relaxed),
            commits: s.c.commits.load(Ordering::Relaxed),
            dumps: s.c.dumps.load(Ordering::Relaxed),
            log_pending_records: s.c.pending.load(Ordering::Relaxed),
            overloaded: ctl.overloaded,
            dump_running_ms: ctl.dumping_since.map(|t| t.elapsed().as_millis() as u64),
            poisoned: s.poisoned.load(Ordering::Relaxed),
            recovery: s.recovery.clone(),
        }
    }

    /// Faults to inject (tests).
    pub fn faults(&self) -> &Faults {
        &self.shared.faults
    }

    /// Starts closing: the threads make a last sync, answer every waiter,
    /// close the log and release the lock. Does not wait. The table must
    /// already refuse writes (deleted) for the last sync to cover them all.
    pub fn begin_close(&self) {
        self.shared.begin_close();
    }

    /// Says the table is about to close (it is being deleted: its owner
    /// died, or it was deleted or closed): an open of the directory in this
    /// process from now on waits for the close instead of answering
    /// [`OpenError::Locked`]. [`Self::begin_close`] must follow.
    pub fn announce_close(&self) {
        self.shared.signal.closing.store(true, Ordering::Release);
    }

    /// Closes and waits until the lock is released; the result of the last
    /// sync (`Err` if the log was poisoned or the sync failed).
    pub fn close(&self) -> Result<(), Failure> {
        let s = &self.shared;
        s.begin_close();
        let mut ctl = s.ctl.lock();
        while !ctl.closed {
            s.closed_cv.wait(&mut ctl);
        }
        ctl.close_result
    }
}

impl<E: Events> Drop for Persisted<E> {
    fn drop(&mut self) {
        self.shared.begin_close();
    }
}

/// Removes every file a table keeps in `dir` (after it was closed).
pub fn remove_files(dir: &Path) -> io::Result<()> {
    recovery::remove_table_files(dir)?;
    // The directory goes too if nothing else is in it.
    let _ = fs::remove_dir(dir);
    Ok(())
}

/// Reads the META blob of the table in `dir`.
pub fn read_meta(dir: &Path) -> Result<Vec<u8>, OpenError> {
    recovery::read_meta(dir)
}

/// Registers `canonical` as open in this process, first waiting for a
/// close of it that has been announced here ([`Persisted::announce_close`]).
fn claim(canonical: &Path) -> Result<Arc<CloseSignal>, OpenError> {
    let deadline = Instant::now() + CLOSE_WAIT;
    loop {
        let existing = {
            let mut open = OPEN.lock();
            match open.get(canonical) {
                Some(s) => s.clone(),
                None => {
                    let s = Arc::new(CloseSignal::default());
                    open.insert(canonical.to_path_buf(), s.clone());
                    return Ok(s);
                }
            }
        };
        if !existing.closing.load(Ordering::Acquire) {
            return Err(OpenError::Locked);
        }
        let mut done = existing.done.lock();
        while !*done {
            if existing.cv.wait_until(&mut done, deadline).timed_out() {
                return Err(OpenError::Locked);
            }
        }
    }
}

fn release(canonical: &Path, signal: &Arc<CloseSignal>) {
    let mut open = OPEN.lock();
    if open.get(canonical).is_some_and(|s| Arc::ptr_eq(s, signal)) {
        open.remove(canonical);
    }
    drop(open);
    *signal.done.lock() = true;
    signal.cv.notify_all();
}

/// Opens `dir/LOCK` and takes a POSIX write lock on it (`fcntl(F_SETLK)`).
/// That lock belongs to this process and, unlike `flock`, is not shared
/// with a child forked while it is held: a process that forks (a test
/// harness, a port started by another NIF) would otherwise keep the
/// directory locked after the table closed, until the child calls exec.
/// A second open in this process is refused earlier, by [`claim`].
fn lock(dir: &Path) -> Result<File, OpenError> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(libc::O_NOFOLLOW)
        .mode(crate::files::FILE_MODE)
        .open(dir.join(LOCK))?;
    // SAFETY: an all-zero `flock` is a valid value of that plain C struct
    // (l_start 0 and l_len 0: the whole file); the fields that matter are
    // set below.
    let mut range: libc::flock = unsafe { std::mem::zeroed() };
    range.l_type = libc::F_WRLCK as libc::c_short;
    range.l_whence = libc::SEEK_SET as libc::c_short;
    // SAFETY: fcntl reads `range`, which lives across the call, and acts
    // only on the descriptor, which `f` keeps open.
    let rc = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETLK, &range) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EACCES) => OpenError::Locked,
            _ => OpenError::Io(e),
        });
    }
    Ok(f)
}

fn spawn<E: Events>(shared: &Arc<Shared<E>>, name: &str, body: fn(&Shared<E>)) -> io::Result<()> {
    shared.ctl.lock().threads += 1;
    let s = shared.clone();
    let spawned = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            body(&s);
            s.thread_exit();
        });
    if let Err(e) = spawned {
        shared.ctl.lock().threads -= 1;
        return Err(e);
    }
    Ok(())
}

impl<E: Events> Journal for Shared<E> {
    fn log(&self, changes: &[Change<'_>]) -> Result<(), TableError> {
        if self.poisoned.load(Ordering::Acquire) {
            return Err(TableError::Poisoned);
        }
        let mut log = self.log.lock();
        if log.closed {
            return Err(TableError::Deleted);
        }
        let LogInner {
            segment,
            spare,
            retired,
            next_capacity,
            frame,
            logged_atoms,
            logged_dicts,
            ..
        } = &mut *log;
        frame.reset();
        // New dictionaries first: the records below may be compressed
        // with them (a dictionary is added before any record uses it).
        let dicts = self.dicts.since(*logged_dicts);
        for d in &dicts {
            frame.push(Op::Dict {
                id: u64::from(d.id()),
                bytes: d.bytes(),
            });
        }
        let new_dicts = dicts.len() as u64;
        let n_atoms = {
            // New atoms first: the records below may use them.
            let atoms = self.atoms.read();
            for id in *logged_atoms..atoms.len() {
                let name = atoms.name(id as u32).unwrap_or_default();
                frame.push(Op::Atom {
                    id: id as u64,
                    name: name.as_bytes(),
                });
            }
            atoms.len()
        };
        for ch in changes {
            frame.push(match *ch {
                Change::Put(rec) => Op::Put(rec),
                Change::Delete(key) => Op::Delete(key),
                Change::Clear => Op::Clear,
            });
        }
        let sealed = frame.seal().ok_or_else(|| {
            TableError::Io(io::Error::other(
                "a write batch over 4 GiB cannot be logged",
            ))
        })?;
        let bytes = sealed.len() as u64;
        let n = changes.len() as u64;
        let new_atoms = (n_atoms - *logged_atoms) as u64;
        if Faults::fire(&self.faults.enospc_after) {
            return Err(TableError::Io(io::Error::from_raw_os_error(libc::ENOSPC)));
        }
        let mut rotated = false;
        let appended = segment
            .as_mut()
            .is_some_and(|seg| seg.append(sealed, n, new_atoms, new_dicts));
        if !appended {
            // Full: go on in the spare, if it is there and large enough.
            match spare.take() {
                Some(mut next) if next.fits(sealed.len()) => {
                    // The full segment gets its end frame before anything
                    // goes to the next one: a process killed in between
                    // leaves a sealed segment followed by an empty one,
                    // never frames after an unsealed one.
                    if let Some(full) = segment.as_mut() {
                        full.seal();
                    }
                    compiler_fence(Ordering::SeqCst);
                    rotated = next.append(sealed, n, new_atoms, new_dicts);
                    debug_assert!(rotated);
                    if let Some(full) = segment.replace(next) {
                        *next_capacity = (full.capacity() * 2).min(self.config.segment_bytes);
                        retired.push(full);
                    }
                    self.c.segments.fetch_add(1, Ordering::Relaxed);
                }
                other => {
                    *spare = other;
                    self.wanted.fetch_max(bytes, Ordering::AcqRel);
                    return Err(TableError::WouldBlock);
                }
            }
        }
        *logged_atoms = n_atoms;
        *logged_dicts += dicts.len();
        if frame.payload_len() > 8 << 20 {
            *frame = FrameBuf::new(); // give a huge batch's buffer back
        }
        self.appended.fetch_add(1, Ordering::SeqCst);
        self.c.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.c.records.fetch_add(n, Ordering::Relaxed);
        let pending = self.c.pending.fetch_add(n, Ordering::Relaxed) + n;
        drop(log);
        if rotated {
            self.wake_flusher(true);
        } else if self.idle.load(Ordering::SeqCst) && self.idle.swap(false, Ordering::SeqCst) {
            self.wake_flusher(false);
        }
        let threshold = self.dump_threshold();
        if pending >= threshold && pending - n < threshold {
            // Closed meanwhile: nothing to dump into.
            let _ = self.request_dump(None, OverloadReason::WriteThreshold);
        }
        Ok(())
    }

    fn rewritten(&self, records: u64) {
        Shared::rewritten(self, records);
    }

    /// Logs the new dictionary at once, in a frame of its own (no record),
    /// so that a table closed or killed before its next write keeps it.
    /// On a thread that may wait for a new segment; on failure the next
    /// write logs it.
    fn dictionary_added(&self) {
        for _ in 0..2 {
            if self.dicts.len() <= self.log.lock().logged_dicts {
                return;
            }
            match Journal::log(self, &[]) {
                Err(TableError::WouldBlock) => {
                    if self
                        .ensure_spare(self.wanted.load(Ordering::Acquire))
                        .is_err()
                    {
                        return;
                    }
                }
                _ => return,
            }
        }
    }
}

impl<E: Events> Shared<E> {
    /// Writes the log holds when a dump is due ([`Config::dump_write_threshold`]).
    fn dump_threshold(&self) -> u64 {
        let floor = self.c.dump_floor.load(Ordering::Relaxed);
        self.config.dump_write_threshold.max(floor)
    }

    fn rewritten(&self, n: u64) {
        let threshold = self.dump_threshold();
        let now = self.c.rewritten.fetch_add(n, Ordering::Relaxed) + n;
        let total = now + self.c.pending.load(Ordering::Relaxed);
        if total >= threshold && total - n < threshold {
            let _ = self.request_dump(None, OverloadReason::WriteThreshold);
        }
    }

    /// Changes the MANIFEST and rewrites it if that changed anything.
    fn update_manifest(&self, change: impl FnOnce(&mut recovery::Manifest)) -> io::Result<()> {
        let mut m = self.manifest.lock();
        let mut new = m.clone();
        change(&mut new);
        if new != *m {
            if wal::Faults::fire(&self.faults.manifest_enospc_after) {
                return Err(io::Error::from_raw_os_error(libc::ENOSPC));
            }
            recovery::write_manifest(&self.dir, &new)?;
            *m = new;
        }
        Ok(())
    }

    fn begin_close(&self) {
        self.signal.closing.store(true, Ordering::Release);
        self.stop.store(true, Ordering::Release);
        let _ctl = self.ctl.lock();
        self.flush_cv.notify_all();
        self.dump_cv.notify_all();
    }

    /// Wakes the flusher: to retire full segments and make a spare
    /// (`segment_work`), or to sync what a write appended.
    fn wake_flusher(&self, segment_work: bool) {
        let mut ctl = self.ctl.lock();
        ctl.segment_work |= segment_work;
        drop(ctl);
        self.flush_cv.notify_one();
    }

    /// True while something appended is not known to be on disk.
    fn unsynced(&self) -> bool {
        self.appended.load(Ordering::SeqCst) > self.synced.load(Ordering::SeqCst)
    }

    /// Makes sure a spare segment exists that takes a frame of `frame`
    /// bytes; makes one if not (a file created, preallocated and synced).
    fn ensure_spare(&self, frame: u64) -> Result<(), Failure> {
        let _one_at_a_time = self.creating.lock();
        let need = frame + (HEADER_LEN + wal::START_FRAME_LEN) as u64 + END_RESERVE;
        let (seq, want, small) = {
            let mut log = self.log.lock();
            if log.closed {
                return Err(Failure::Closed);
            }
            let seq = log.segment.as_ref().map_or(log.first_seq, |s| s.seq + 1);
            if log.spare.as_ref().is_some_and(|s| s.capacity() >= need) {
                return Ok(());
            }
            (seq, log.next_capacity, log.spare.take())
        };
        // A spare too small for the frame is replaced (it holds nothing).
        // Only this thread makes segments, and writers move to a new one
        // only from the spare, so `seq` stays the next number meanwhile.
        if let Some(small) = small {
            discard(&self.dir, small);
        }
        let seg = new_segment(&self.dir, seq, want, need, &self.recovery.id)
            .map_err(|e| Failure::io(&e))?;
        // (Only after an open on a full disk: the manifest still says the
        // log ended.)
        if let Err(e) = self.update_manifest(|m| m.clean = false) {
            discard(&self.dir, seg);
            return Err(Failure::io(&e));
        }
        let mut log = self.log.lock();
        if log.closed {
            drop(log);
            discard(&self.dir, seg);
            return Err(Failure::Closed);
        }
        log.spare = Some(seg);
        Ok(())
    }

    fn request_dump(&self, w: Option<E::Waiter>, reason: OverloadReason) -> Result<(), Failure> {
        let mut ctl = self.ctl.lock();
        if ctl.closed {
            return Err(Failure::Closed);
        }
        ctl.dump_waiters.extend(w);
        ctl.dump_requested = true;
        let overload = ctl.dumping_since.map(|since| Overload {
            behind_records: self.c.pending.load(Ordering::Relaxed),
            threshold: self.dump_threshold(),
            dump_running_ms: since.elapsed().as_millis() as u64,
            reason,
        });
        if let Some(o) = overload {
            ctl.overloaded = overload;
            ctl.outbox.push(Event::Overloaded(o));
            self.flush_cv.notify_one();
        }
        drop(ctl);
        self.dump_cv.notify_one();
        Ok(())
    }

    /// The flusher thread: syncs the log when a waiter asks, or every
    /// interval (sleeping while nothing was written); retires full
    /// segments and makes the spare; a last sync when the table closes.
    fn flusher(&self) {
        let mut last_sync = Instant::now();
        // Commit waiters the last sync released, and how long it took.
        let mut last_batch = 0usize;
        let mut last_took = Duration::ZERO;
        loop {
            let mut ctl = self.ctl.lock();
            let (stopping, due) = loop {
                if self.stop.load(Ordering::Acquire) {
                    break (true, true);
                }
                if !ctl.waiters.is_empty() || !ctl.outbox.is_empty() {
                    break (false, true);
                }
                let interval = match self.config.sync {
                    SyncMode::Interval(every) => Some(every),
                    _ => None,
                };
                let due = interval.map(|every| last_sync + every);
                let now = Instant::now();
                let sync_due = self.unsynced() && due.is_some_and(|d| now >= d);
                if ctl.segment_work || sync_due {
                    break (false, sync_due);
                }
                match due {
                    Some(due) if self.unsynced() => {
                        self.flush_cv.wait_for(&mut ctl, due - now);
                    }
                    Some(_) => {
                        // Nothing to sync: sleep until a write arrives
                        // (the writer that finds `idle` set wakes us).
                        self.idle.store(true, Ordering::SeqCst);
                        if !self.unsynced() {
                            self.flush_cv.wait(&mut ctl);
                        }
                        self.idle.store(false, Ordering::SeqCst);
                    }
                    None => self.flush_cv.wait(&mut ctl),
                }
            };
            let segment_work = std::mem::take(&mut ctl.segment_work);
            let committing = !ctl.waiters.is_empty();
            drop(ctl);
            // Group commit: while committers come several at a time (the
            // last sync released more than one), wait a little for more to
            // join this sync, at most half a sync's time and 500 µs (as
            // PostgreSQL's commit_delay with commit_siblings). A lone
            // committer never waits.
            if committing && last_batch > 1 && !stopping {
                std::thread::sleep((last_took / 2).min(COMMIT_DELAY));
            }
            let started = Instant::now();
            let result = self.sync_round(due);
            if due {
                last_sync = Instant::now();
                last_took = last_sync - started;
            }
            let synced = self.synced.load(Ordering::Acquire);
            let (ready, outbox): (Vec<E::Waiter>, Vec<Event>) = {
                let mut ctl = self.ctl.lock();
                let (ready, wait): (Vec<_>, Vec<_>) = std::mem::take(&mut ctl.waiters)
                    .into_iter()
                    .partition(|(lsn, _)| result.is_err() || stopping || *lsn <= synced);
                ctl.waiters = wait;
                if stopping {
                    ctl.close_result = result;
                }
                let ready = ready.into_iter().map(|(_, w)| w).collect();
                (ready, std::mem::take(&mut ctl.outbox))
            };
            for event in outbox {
                self.events.notify(event);
            }
            last_batch = ready.len();
            if !ready.is_empty() {
                if result.is_ok() {
                    self.c
                        .commits
                        .fetch_add(ready.len() as u64, Ordering::Relaxed);
                }
                self.events.done(ready, result);
            }
            if stopping {
                return;
            }
            if segment_work && !self.poisoned.load(Ordering::Acquire) {
                // A full disk is reported to the write that needs the
                // segment (it makes room itself, and fails).
                let _ = self.ensure_spare(0);
            }
        }
    }

    /// Syncs and cuts the retired segments; with `current`, fdatasyncs the
    /// segment appended to as well.
    fn sync_round(&self, current: bool) -> Result<(), Failure> {
        let _one_at_a_time = self.syncing.lock();
        if self.poisoned.load(Ordering::Acquire) {
            return Err(Failure::Poisoned);
        }
        let (retired, file, target, current_seq) = {
            let mut log = self.log.lock();
            let retired = std::mem::take(&mut log.retired);
            let file = log.segment.as_ref().map(|s| s.file().clone());
            let seq = log.segment.as_ref().map(|s| s.seq);
            (retired, file, self.appended.load(Ordering::SeqCst), seq)
        };
        let fail = |e: &io::Error| {
            // The kernel may have dropped the dirty pages: what was
            // appended can no longer be trusted to reach the disk.
            self.poisoned.store(true, Ordering::Release);
            Failure::io(e)
        };
        for seg in retired {
            self.c.fsyncs.fetch_add(1, Ordering::Relaxed);
            seg.finish(&self.faults).map_err(|e| fail(&e))?;
        }
        if let Some(seq) = current_seq {
            // Writes moved on to a segment the manifest does not name yet:
            // name it before a sync acknowledges any of them. A MANIFEST
            // that cannot be rewritten (a full disk without its reserve)
            // does not poison the log: the old one stands whole, nothing
            // synced was dropped, and the next round tries again.
            self.update_manifest(|m| m.last = m.last.max(seq))
                .map_err(|e| Failure::io(&e))?;
        }
        if !current || target <= self.synced.load(Ordering::Acquire) {
            return Ok(());
        }
        if let Some(f) = file {
            self.c.fsyncs.fetch_add(1, Ordering::Relaxed);
            wal::sync_data(&f, &self.faults).map_err(|e| fail(&e))?;
        }
        self.synced.fetch_max(target, Ordering::AcqRel);
        Ok(())
    }

    /// The dumper thread: dumps on request, at the write threshold (the
    /// journal asks) and at the time threshold. It runs at a lower CPU
    /// priority than the VM, so that on a busy machine writers and readers
    /// come first and a dump takes longer instead.
    fn dumper(&self) {
        lower_priority();
        loop {
            let mut ctl = self.ctl.lock();
            loop {
                if self.stop.load(Ordering::Acquire) {
                    return;
                }
                if ctl.dump_requested {
                    break;
                }
                let due = ctl.last_dump + self.config.dump_time_threshold;
                let now = Instant::now();
                let pending = self.c.pending.load(Ordering::Relaxed) > 0
                    || self.c.rewritten.load(Ordering::Relaxed) > 0;
                if pending && now >= due {
                    break;
                }
                let wait = if pending {
                    due - now
                } else {
                    self.config.dump_time_threshold
                };
                self.dump_cv
                    .wait_for(&mut ctl, wait.min(Duration::from_secs(3600)));
            }
            ctl.dump_requested = false;
            let started = Instant::now();
            ctl.dumping_since = Some(started);
            let waiters = std::mem::take(&mut ctl.dump_waiters);
            drop(ctl);
            let result = self.dump();
            let mut ctl = self.ctl.lock();
            ctl.dumping_since = None;
            ctl.last_dump = Instant::now();
            if self.c.pending.load(Ordering::Relaxed) < self.dump_threshold() {
                ctl.overloaded = None;
            }
            drop(ctl);
            let ms = started.elapsed().as_millis() as u64;
            self.events.done(waiters, result.map(|_| ()));
            match result {
                Ok(written) => self.events.notify(Event::Dumped(Dumped { written, ms })),
                Err(Failure::Closed) => {}
                Err(f) => self.events.notify(Event::DumpFailed(f)),
            }
        }
    }

    /// One dump: start a new segment, write a snapshot that replays from
    /// it, drop the segments it covers.
    fn dump(&self) -> Result<Written, Failure> {
        let table = self.table.upgrade().ok_or(Failure::Closed)?;
        if self.poisoned.load(Ordering::Acquire) {
            return Err(Failure::Poisoned);
        }
        // The next threshold, from the table's size now (the snapshot will
        // hold about as many records); read before the log's lock, which
        // writers take under the table's.
        let floor = table.len().unwrap_or(0) as u64 / DUMP_FLOOR_DIVISOR;
        let next = self.rotate(|| {
            self.c.pending.store(0, Ordering::Relaxed);
            self.c.rewritten.store(0, Ordering::Relaxed);
            self.c.dump_floor.store(floor, Ordering::Relaxed);
        })?;
        let snapshot = snapshot::write(&self.dir, &table, next, &self.recovery.id, &self.stop)
            .map_err(|e| match e {
                SnapshotError::Stopped | SnapshotError::Deleted => Failure::Closed,
                SnapshotError::Io(e) => Failure::io(&e),
            })?;
        // The copy holds writes made while it ran, logged in segment
        // `next` and maybe later ones: those must be on disk before the
        // snapshot can be found, or a power loss could keep the snapshot
        // and lose them (half a batch, a later write without an earlier
        // one). Seal the segment the copy ended in (the manifest then
        // names the one after it) and sync every segment before that.
        let logged_nothing = {
            let log = self.log.lock();
            log.segment
                .as_ref()
                .is_some_and(|s| s.seq == next && s.is_empty())
        };
        if !logged_nothing {
            self.rotate(|| {})?;
        }
        self.sync_round(false)?;
        let written = snapshot.commit().map_err(|e| Failure::io(&e))?;
        // The log now starts at `next` (the segments below it are removed
        // only once the manifest says so).
        self.update_manifest(|m| {
            m.first = next;
            m.last = m.last.max(next);
            m.snapshot = true;
        })
        .map_err(|e| Failure::io(&e))?;
        // The snapshot covers every earlier segment, synced or not.
        let covered: Vec<Segment> = {
            let mut log = self.log.lock();
            let (covered, kept) = std::mem::take(&mut log.retired)
                .into_iter()
                .partition(|s| s.seq < next);
            log.retired = kept;
            log.log_start = next;
            covered
        };
        drop(covered);
        for entry in fs::read_dir(&self.dir).map_err(|e| Failure::io(&e))? {
            let Ok(entry) = entry else { continue };
            let name = entry.file_name();
            let covered = name
                .to_str()
                .and_then(segment_seq_of)
                .is_some_and(|seq| seq < next);
            if covered {
                let _ = fs::remove_file(entry.path());
            }
        }
        self.c.dumps.fetch_add(1, Ordering::Relaxed);
        Ok(written)
    }

    /// Moves appends to a new segment (sealing the current one, as when it
    /// fills up) and returns its number; `also` runs under the log's lock
    /// as it does.
    fn rotate(&self, also: impl Fn()) -> Result<u64, Failure> {
        let seq = loop {
            self.ensure_spare(0)?;
            let mut log = self.log.lock();
            if log.closed {
                return Err(Failure::Closed);
            }
            // A writer may have moved to the spare meanwhile: make another.
            let Some(new) = log.spare.take() else {
                continue;
            };
            let seq = new.seq;
            if let Some(mut old) = log.segment.replace(new) {
                old.seal();
                log.retired.push(old);
            }
            self.c.segments.fetch_add(1, Ordering::Relaxed);
            also();
            break seq;
        };
        self.wake_flusher(true);
        Ok(seq)
    }

    /// Called by each thread as it ends; the last one closes the log and
    /// releases the directory.
    fn thread_exit(&self) {
        let mut ctl = self.ctl.lock();
        ctl.threads -= 1;
        if ctl.threads > 0 {
            return;
        }
        let waiters: Vec<E::Waiter> = std::mem::take(&mut ctl.waiters)
            .into_iter()
            .map(|(_, w)| w)
            .chain(std::mem::take(&mut ctl.dump_waiters))
            .collect();
        drop(ctl);
        {
            // Cut the segments to their log (giving the preallocated rest
            // back) and drop the unused spare, then unlock the directory.
            let mut log = self.log.lock();
            // The last one is sealed too, so that reopening needs no disk
            // space for that, only for its new segment; or, if nothing was
            // written to it and the segment before it is kept, dropped
            // (that one ends the log), so that opening and closing a table
            // again and again leaves no trail of empty segments.
            let mut segments = std::mem::take(&mut log.retired);
            let mut unused: Vec<Segment> = log.spare.take().into_iter().collect();
            let mut drop_last = None;
            if let Some(mut last) = log.segment.take() {
                if last.is_empty() && last.seq > log.log_start {
                    drop_last = Some(last);
                } else {
                    last.seal();
                    segments.push(last);
                }
            }
            log.closed = true;
            let mut synced = !self.poisoned.load(Ordering::Acquire);
            for seg in segments {
                synced &= seg.finish(&self.faults).is_ok();
            }
            // Closed cleanly: the manifest says the log ends, sealed, with
            // the last segment kept, so that losing its end is noticed.
            let clean = synced
                && self
                    .update_manifest(|m| {
                        if let Some(dropped) = &drop_last {
                            m.last = dropped.seq - 1;
                        }
                        m.clean = true;
                    })
                    .is_ok();
            match drop_last {
                Some(seg) if clean => unused.push(seg),
                Some(mut seg) => {
                    // The manifest still names it: keep it, sealed.
                    seg.seal();
                    let _ = seg.finish(&self.faults);
                }
                None => {}
            }
            for seg in unused {
                discard(&self.dir, seg);
            }
            let _ = sync_dir(&self.dir);
            log.lock_file = None;
        }
        release(&self.canonical, &self.signal);
        let mut ctl = self.ctl.lock();
        ctl.closed = true;
        drop(ctl);
        self.closed_cv.notify_all();
        if !waiters.is_empty() {
            self.events.done(waiters, Err(Failure::Closed));
        }
    }
}

/// Makes the calling thread nicer (nice 10): background work yields the
/// CPU to the VM's schedulers. Best effort.
fn lower_priority() {
    // SAFETY: gettid has no arguments and cannot fail; setpriority acts on
    // this thread only (a Linux thread id with PRIO_PROCESS) and reports
    // failure by its return value, which is ignored: priority is a hint.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 10);
    }
}

/// Creates log segment `seq` in `dir` with `want` bytes, or fewer if the
/// disk is too full for that (halving down to `need`), and syncs the
/// directory.
fn new_segment(
    dir: &Path,
    seq: u64,
    want: u64,
    need: u64,
    id: &wal::TableId,
) -> io::Result<Segment> {
    let path = dir.join(recovery::segment_name(seq));
    let need = need.max(wal::MIN_CAPACITY);
    let mut size = want.max(need).next_multiple_of(4096);
    let seg = loop {
        match Segment::create(&path, seq, size, id) {
            Ok(seg) => break seg,
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) && size / 2 >= need => {
                size = (size / 2).next_multiple_of(4096);
            }
            Err(e) => return Err(e),
        }
    };
    sync_dir(dir)?;
    Ok(seg)
}

/// Drops a segment nothing was appended to, and its file.
fn discard(dir: &Path, seg: Segment) {
    let path = dir.join(recovery::segment_name(seg.seq));
    drop(seg);
    let _ = fs::remove_file(path);
}

fn segment_seq_of(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("wal-")?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}
