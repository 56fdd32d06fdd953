//! What a table learns from its own records: a zstd dictionary
//! (`compression: {:zstd, dictionary: :auto}`, or on demand), the codec
//! itself (`compression: :auto`), and the background job that re-compresses
//! older records once new writes are stored another way.
//!
//! A job runs on a thread of its own, never on a scheduler, and never
//! holds the table's lock for longer than one small chunk:
//!
//! 1. sampling: the first [`Job::samples`] records in walk order, copied
//!    out [`CHUNK`] records at a time under the read lock and decompressed
//!    outside it;
//! 2. training (no lock held): [`dict::train`] on the samples; for
//!    `compression: :auto`, every codec is tried on the samples first
//!    ([`choose`]);
//! 3. the dictionary is added to the table's [`Dictionaries`] (before any
//!    record can name it), then made current: new writes use it;
//! 4. re-compression: a walk over the table, [`CHUNK`] records at a time,
//!    each record not stored as a new write would be is compressed again
//!    outside the lock, and swapped in under the write lock only if its
//!    key still holds the same record at the same place
//!    ([`Table::swap_in`]). The walk resumes after the last key it saw,
//!    so it survives the table growing, shrinking or being resized, and
//!    pauses between chunks as long as a chunk took (half of one core at
//!    most). A newer job stops an older one's walk.
//!
//! Re-compressing a record changes how it is stored, never what it is: it
//! is not logged, and a bag's objects still compare equal (objects.rs
//! compares uncompressed bodies).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::{order, Entries, Error, Prepared, RecordBuf, Table};
use crate::compress::{self, Codec, Compression, ZSTD_DEFAULT_LEVEL};
use crate::dict::{self, Dictionaries};
use crate::record::Header;

/// Records a table holds before it learns on its own (the dictionary of
/// `{:zstd, dictionary: :auto}`, the codec of `:auto`), and how many
/// records a job samples by default. Chosen by measurement
/// (docs/term-format.md, "Dictionaries").
pub const AUTO_RECORDS: usize = 4096;

/// A table that learnt a dictionary on its own trains a new one each time
/// it has grown this many times over since: its records may have drifted
/// from those the dictionary was trained on ([`beats_current`] decides
/// whether the new one is used).
pub const RETRAIN_GROWTH: usize = 4;

/// The largest dictionary trained by default; smaller when the samples
/// are small ([`dict_size`]).
pub const DICT_BYTES: usize = 16 * 1024;

/// Fewest samples worth training on.
pub const MIN_SAMPLES: usize = 64;

/// Records a job reads (or re-compresses) under one lock.
pub const CHUNK: usize = 256;

/// Records re-compression swaps in under one write lock.
pub const SWAP_BATCH: usize = 32;

/// Uncompressed bytes a chunk copies out at most.
pub(super) const CHUNK_RAW: usize = 256 * 1024;

/// The dictionary size for samples totalling `sample_bytes`: about a
/// tenth of them, between 1 KiB and `max`.
pub fn dict_size(sample_bytes: usize, max: usize) -> usize {
    (sample_bytes / 10).clamp(1024, max.max(1024))
}

/// Records by codec and by dictionary.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Records stored with each [`Codec`], by its number.
    pub by_codec: [u64; 6],
    /// `by_dict[i]`: records compressed with dictionary `i + 1`.
    pub by_dict: Vec<u64>,
}

impl Tally {
    pub(super) fn add(&mut self, codec: Codec, dict: u32) {
        self.by_codec[codec as usize] += 1;
        if dict > 0 {
            let i = dict as usize - 1;
            if self.by_dict.len() <= i {
                self.by_dict.resize(i + 1, 0);
            }
            self.by_dict[i] += 1;
        }
    }

    pub(super) fn remove(&mut self, codec: Codec, dict: u32) {
        self.by_codec[codec as usize] -= 1;
        if dict > 0 {
            self.by_dict[dict as usize - 1] -= 1;
        }
    }
}

/// Where a table's learning stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Nothing learnt or learning.
    Idle,
    Sampling,
    Training,
    /// Re-compressing older records.
    Running,
    /// The last job finished.
    Done,
    /// The last job failed (see [`Progress::error`]).
    Failed,
}

/// A codec tried by `compression: :auto` on the samples.
#[derive(Clone, Debug, PartialEq)]
pub struct Trial {
    pub compression: Compression,
    /// Bytes the evaluation samples take stored (header, key and body,
    /// in the blocks of their size classes).
    pub bytes: u64,
    /// Nanoseconds to decode one of them, on average.
    pub decode_ns: u64,
}

/// What [`Table::learning`] reports.
#[derive(Clone, Debug, PartialEq)]
pub struct Progress {
    pub phase: Phase,
    /// Records the re-compression walk has visited, of `total`.
    pub done: u64,
    pub total: u64,
    /// Records it stored again.
    pub recompressed: u64,
    /// Bytes the compaction after the walk gave back (see
    /// [`Table::compact`]).
    pub compacted: u64,
    /// The last training: samples, their uncompressed bytes, the
    /// dictionary's bytes and the microseconds training took.
    pub samples: u64,
    pub sample_bytes: u64,
    pub dict_bytes: u64,
    pub train_us: u64,
    /// `compression: :auto`'s last trials.
    pub trials: Vec<Trial>,
    pub error: Option<LearnError>,
}

/// Why a job did not run or failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LearnError {
    /// A job is sampling or training already.
    Busy,
    /// Fewer records than [`MIN_SAMPLES`] to learn from.
    TooFewRecords,
    /// zstd's trainer found nothing to learn.
    Training(String),
    /// The table was deleted.
    Deleted,
    /// The table does not compress with zstd dictionaries (nor `:auto`).
    NotLearning,
}

impl std::fmt::Display for LearnError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LearnError::Busy => write!(f, "a dictionary is being trained already"),
            LearnError::TooFewRecords => write!(f, "too few records to train on"),
            LearnError::Training(why) => write!(f, "{why}"),
            LearnError::Deleted => write!(f, "the table was deleted"),
            LearnError::NotLearning => write!(f, "the table does not use dictionaries"),
        }
    }
}

/// What a job does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Job {
    /// Records to sample.
    pub samples: usize,
    /// The dictionary's size; 0 for [`dict_size`] of the samples.
    pub dict_bytes: usize,
    /// Re-compress older records afterwards.
    pub recompress: bool,
    /// An automatic job: a new dictionary replaces the table's current one
    /// only if it [`beats_current`] (a job asked for always puts its
    /// dictionary in use).
    pub automatic: bool,
}

impl Job {
    /// The job a table starts on its own ([`Table::take_learning_due`]).
    pub fn automatic() -> Job {
        Job {
            automatic: true,
            ..Job::default()
        }
    }
}

impl Default for Job {
    fn default() -> Self {
        Job {
            samples: AUTO_RECORDS,
            dict_bytes: 0,
            recompress: true,
            automatic: false,
        }
    }
}

/// The compression of new writes and the table's learning state.
pub(super) struct Learner {
    mode: AtomicU64,
    auto: AtomicBool,
    /// Automatic learning: 0 not yet, 1 due (the table holds enough
    /// records, or has grown [`RETRAIN_GROWTH`] times over), 2 started.
    trigger: AtomicU8,
    /// Records at which the next automatic retraining is due: set when
    /// automatic learning becomes due, and for a table reopened with its
    /// dictionaries by its first write.
    retrain_at: AtomicUsize,
    /// Bumped by each job; a walk stops once it is not its own.
    generation: AtomicU64,
    progress: Mutex<Progress>,
}

fn encode(c: Compression) -> u64 {
    match c {
        Compression::None => 0,
        Compression::Zlib(l) => (1 << 32) | l as u64,
        Compression::Zstd { level, dict } => ((2 + dict as u64) << 32) | level as u32 as u64,
        Compression::Lz4 => 4 << 32,
    }
}

fn decode(v: u64) -> Compression {
    let level = v as u32;
    match v >> 32 {
        1 => Compression::Zlib(level),
        2 | 3 => Compression::Zstd {
            level: level as i32,
            dict: v >> 32 == 3,
        },
        4 => Compression::Lz4,
        _ => Compression::None,
    }
}

impl Learner {
    pub(super) fn new(c: Compression) -> Learner {
        Learner {
            mode: AtomicU64::new(encode(c)),
            auto: AtomicBool::new(false),
            trigger: AtomicU8::new(0),
            retrain_at: AtomicUsize::new(0),
            generation: AtomicU64::new(0),
            progress: Mutex::new(Progress {
                phase: Phase::Idle,
                done: 0,
                total: 0,
                recompressed: 0,
                compacted: 0,
                samples: 0,
                sample_bytes: 0,
                dict_bytes: 0,
                train_us: 0,
                trials: Vec::new(),
                error: None,
            }),
        }
    }

    pub(super) fn mode(&self) -> Compression {
        decode(self.mode.load(Ordering::Acquire))
    }

    fn set_mode(&self, c: Compression) {
        self.mode.store(encode(c), Ordering::Release);
    }

    fn learns(&self) -> bool {
        self.auto.load(Ordering::Relaxed)
            || matches!(self.mode(), Compression::Zstd { dict: true, .. })
    }

    /// After a write that left `len` records: makes automatic learning
    /// due once there are enough, and again each time the table has grown
    /// [`RETRAIN_GROWTH`] times over since, while it compresses with a
    /// dictionary.
    pub(super) fn count(&self, len: usize) {
        let next = || len.max(AUTO_RECORDS).saturating_mul(RETRAIN_GROWTH);
        match self.trigger.load(Ordering::Relaxed) {
            0 if len >= AUTO_RECORDS && self.learns() => {
                self.retrain_at.store(next(), Ordering::Relaxed);
                let _ = self
                    .trigger
                    .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed);
            }
            2 => {
                let at = self.retrain_at.load(Ordering::Relaxed);
                if at == 0 {
                    self.retrain_at.store(next(), Ordering::Relaxed);
                } else if len >= at && matches!(self.mode(), Compression::Zstd { dict: true, .. }) {
                    self.retrain_at.store(next(), Ordering::Relaxed);
                    let _ =
                        self.trigger
                            .compare_exchange(2, 1, Ordering::AcqRel, Ordering::Relaxed);
                }
            }
            _ => {}
        }
    }
}

impl Table {
    /// Makes this (new, empty) table choose its codec from its records
    /// (`compression: :auto`); until then it compresses with zstd.
    pub fn set_auto(&self) {
        self.learner.set_mode(Compression::Zstd {
            level: ZSTD_DEFAULT_LEVEL,
            dict: false,
        });
        self.learner.auto.store(true, Ordering::Release);
    }

    /// For a table reopened with the dictionaries it trained before
    /// (persist.rs): automatic learning is not due again.
    pub fn learned_before(&self) {
        self.learner.trigger.store(2, Ordering::Relaxed);
    }

    /// True for a `compression: :auto` table.
    pub fn is_auto(&self) -> bool {
        self.learner.auto.load(Ordering::Acquire)
    }

    /// True once when the table first holds [`AUTO_RECORDS`] records and
    /// learns on its own, and once each time it has grown
    /// [`RETRAIN_GROWTH`] times over since (see [`Learner::count`]): the
    /// caller then [`start`]s the automatic job.
    pub fn take_learning_due(&self) -> bool {
        self.learner.trigger.load(Ordering::Relaxed) == 1
            && self
                .learner
                .trigger
                .compare_exchange(1, 2, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
    }

    /// Where learning stands.
    pub fn learning(&self) -> Progress {
        self.learner.progress.lock().clone()
    }

    /// Records by codec and by dictionary.
    pub fn tally(&self) -> Result<Tally, Error> {
        Ok(self.read()?.tally.clone())
    }

    /// Copies up to `n` records' uncompressed bodies, chunk by chunk,
    /// spread over the whole walk (every `len / n`-th record); also their
    /// keys' mean length.
    fn sample(&self, n: usize) -> Result<(Vec<Vec<u8>>, usize), Error> {
        let mut out = Vec::with_capacity(n);
        let mut key_bytes = 0;
        let stride = (self.len()? / n.max(1)).max(1);
        let (mut buf, mut scratch, mut after) = (RecordBuf::new(), Vec::new(), None);
        let mut seen = 0usize;
        while out.len() < n {
            buf.clear();
            let want = ((n - out.len()) * stride).min(CHUNK);
            let next = self.chunk(after.as_ref(), want, CHUNK_RAW, &mut buf)?;
            for it in buf.items() {
                seen += 1;
                if (seen - 1) % stride != 0 {
                    continue;
                }
                if let Ok(body) = buf.body(it, &self.dicts, &mut scratch) {
                    out.push(body.to_vec());
                    key_bytes += buf.key(it).len();
                }
            }
            match next {
                Some(c) => after = Some(c),
                None => break,
            }
        }
        out.truncate(n);
        let key_len = key_bytes / out.len().max(1);
        Ok((out, key_len))
    }

    /// Swaps in the re-compressed `new[i]` for the record `buf.items()[i]`
    /// where its key still holds that record, unchanged, at the same
    /// place; returns how many it swapped. Under the write lock.
    fn swap_in(&self, buf: &RecordBuf, new: &[(usize, Prepared)]) -> Result<u64, Error> {
        let mut st = self.write()?;
        let names = self.names();
        let ord = order(&names);
        let mut n = 0;
        for (i, p) in new {
            let it = &buf.items()[*i];
            let Some((first, k)) = st.find(ord, it.hash, buf.key(it)) else {
                continue;
            };
            let Some(pos) = (0..k)
                .map(|j| Entries::nth(first, j))
                .find(|&pos| st.entries.loc(pos) == it.loc)
            else {
                continue;
            };
            if st.record_at(it.loc).1 != buf.record(it) {
                continue;
            }
            let was = st.in_memory(ord, it.hash, buf.key(it));
            // A full arena: stop here, the records stay as they are.
            let Ok(locs) = st.place(&[p]) else { break };
            st.entries.set_loc(pos, locs[0]);
            st.release(it.loc);
            self.note_in_memory(&mut st, ord, buf.key(it), was, locs[0]);
            n += 1;
        }
        if let (Some(j), true) = (self.journal.get(), n > 0) {
            j.rewritten(n);
        }
        Ok(n)
    }
}

/// Calls `done` once a job's dictionary is in use (with its id, 0 when
/// `compression: :auto` chose no dictionary) or the job failed.
pub type Done = Box<dyn FnOnce(Result<u32, LearnError>) + Send>;

/// Starts a job on a thread of its own. Refused (changing nothing) while
/// another job samples or trains, or if the table does not learn.
pub fn start(table: Arc<Table>, job: Job, done: Option<Done>) -> Result<(), LearnError> {
    if !table.learner.learns() {
        return Err(LearnError::NotLearning);
    }
    let generation = {
        let mut p = table.learner.progress.lock();
        if matches!(p.phase, Phase::Sampling | Phase::Training) {
            return Err(LearnError::Busy);
        }
        p.phase = Phase::Sampling;
        p.error = None;
        table.learner.generation.fetch_add(1, Ordering::AcqRel) + 1
    };
    let t = table.clone();
    let spawned = std::thread::Builder::new()
        .name("heft-learn".into())
        .spawn(move || run(&t, job, generation, done));
    spawned.map(|_| ()).map_err(|e| {
        let e = LearnError::Training(e.to_string());
        let mut p = table.learner.progress.lock();
        p.phase = Phase::Failed;
        p.error = Some(e.clone());
        e
    })
}

fn run(table: &Table, job: Job, generation: u64, done: Option<Done>) {
    // The lowest priority for this thread (Linux keeps a nice value per
    // thread): on a busy host the schedulers' threads go first.
    // SAFETY: setpriority takes plain integers and touches no memory of
    // ours; it fails harmlessly where it may not.
    unsafe {
        let _ = libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 10);
    }
    // A job that kept the current dictionary still walks the table: it
    // stopped the walk of the job before it, which may not have finished.
    let learnt = learn(table, job);
    {
        let mut p = table.learner.progress.lock();
        match &learnt {
            Ok(_) if job.recompress => {
                p.phase = Phase::Running;
                (p.done, p.total, p.recompressed) = (0, table.len().unwrap_or(0) as u64, 0);
                p.compacted = 0;
            }
            Ok(_) => p.phase = Phase::Done,
            Err(e) => {
                p.phase = Phase::Failed;
                p.error = Some(e.clone());
            }
        }
    }
    let ok = learnt.is_ok();
    if let Some(done) = done {
        done(learnt);
    }
    if ok && job.recompress && recompress(table, generation) {
        // Records that shrank left holes all over the arena: the top
        // comes down once they are filled.
        let mine = || table.learner.generation.load(Ordering::Acquire) == generation;
        let compacted = table.compact(super::compact::MIN_GAIN, mine);
        let mut p = table.learner.progress.lock();
        if mine() {
            p.phase = Phase::Done;
            p.done = p.total;
            p.compacted = compacted.map_or(0, |c| c.returned_bytes);
        }
    }
}

/// Samples, trains and puts what it learnt in use: the id of the
/// dictionary new writes use (0 for none). An automatic job keeps the
/// current dictionary unless the new one [`beats_current`].
fn learn(table: &Table, job: Job) -> Result<u32, LearnError> {
    let gone = |_| LearnError::Deleted;
    let (samples, key_len) = table.sample(job.samples.max(MIN_SAMPLES)).map_err(gone)?;
    if samples.len() < MIN_SAMPLES {
        return Err(LearnError::TooFewRecords);
    }
    table.learner.progress.lock().phase = Phase::Training;
    let sample_bytes: usize = samples.iter().map(Vec::len).sum();
    let size = match job.dict_bytes {
        0 => dict_size(sample_bytes, DICT_BYTES),
        n => n,
    };
    let started = Instant::now();
    let auto = table.is_auto();
    let level = table.dicts.level();
    let (choice, bytes, trials) = choose(&samples, key_len, size, &candidates(auto, level));
    // An automatic retraining keeps the current dictionary unless the new
    // one pays, or (not `:auto`) when it made none worth using.
    let current = table.dicts.current().filter(|_| job.automatic);
    // What the new dictionary stored in `choose`'s trial of it.
    let new_stored = trials.iter().find(|t| uses_dict(t.compression));
    let keep = match (&bytes, &current, new_stored) {
        (Some(b), Some(cur), Some(new)) => {
            let len = table.len().unwrap_or(0);
            !beats_current(&samples, key_len, level, (b, new.bytes), cur, len)
        }
        (None, Some(_), _) => !auto,
        _ => false,
    };
    if !keep && !auto && trials.iter().all(|t| !uses_dict(t.compression)) {
        let why = "zstd found nothing to learn in the samples";
        return Err(LearnError::Training(why.into()));
    }
    // Training and, for a retraining, the comparison with the current one.
    let train_us = started.elapsed().as_micros() as u64;
    if keep {
        let id = current.map_or(0, |d| d.id());
        let mut p = table.learner.progress.lock();
        p.trials = trials;
        note(&mut p, samples.len(), sample_bytes, id, table, train_us);
        return Ok(id);
    }
    let id = match bytes {
        Some(b) => use_dict(table, &b)?,
        None => 0,
    };
    if auto {
        table.learner.set_mode(choice);
    }
    let mut p = table.learner.progress.lock();
    p.trials = trials;
    note(&mut p, samples.len(), sample_bytes, id, table, train_us);
    Ok(id)
}

/// The rule for an automatic retraining: the new dictionary (`new`: its
/// bytes, and the bytes [`choose`]'s trial stored with it) is used only
/// if, on the held-out quarter of the samples that trial was on, it stores
/// at least 1/32 fewer bytes than the current one (`current`), and the
/// bytes it would save over the table's `len` records at that rate are
/// more than the memory it takes (its bytes and zstd's two digests of
/// them): each dictionary stays in the table for good.
fn beats_current(
    samples: &[Vec<u8>],
    key_len: usize,
    level: i32,
    (new, new_bytes): (&[u8], u64),
    current: &dict::Dict,
    len: usize,
) -> bool {
    let eval = &samples[eval_split(samples)..];
    let digested = |bytes: &[u8]| {
        let dicts = Dictionaries::new(level);
        let d = dicts.add(bytes).ok()?;
        dicts.set_current(d.id());
        Some((dicts, d.memory() as u64))
    };
    let (Some((_, new_memory)), Some((cur, _))) = (digested(new), digested(current.bytes())) else {
        return false;
    };
    let zstd = Compression::Zstd { level, dict: true };
    let cur_bytes = trial(zstd, eval, key_len, &cur).bytes;
    let saved = cur_bytes.saturating_sub(new_bytes);
    let over_table = saved as u128 * len as u128 / eval.len().max(1) as u128;
    saved * 32 >= cur_bytes && over_table > u128::from(new_memory)
}

/// Where [`choose`]'s held-out quarter of `samples` (at least two) begins.
fn eval_split(samples: &[Vec<u8>]) -> usize {
    (samples.len() * 3 / 4).max(1).min(samples.len() - 1)
}

fn uses_dict(c: Compression) -> bool {
    matches!(c, Compression::Zstd { dict: true, .. })
}

fn note(p: &mut Progress, n: usize, bytes: usize, id: u32, table: &Table, us: u64) {
    p.samples = n as u64;
    p.sample_bytes = bytes as u64;
    p.dict_bytes = table.dicts.get(id).map_or(0, |d| d.bytes().len() as u64);
    p.train_us = us;
}

/// Adds a dictionary and makes it the one of new writes.
fn use_dict(table: &Table, bytes: &[u8]) -> Result<u32, LearnError> {
    if table.is_deleted() {
        return Err(LearnError::Deleted);
    }
    let d = table
        .dicts
        .add(bytes)
        .map_err(|e| LearnError::Training(e.to_string()))?;
    table.dicts.set_current(d.id());
    if let Some(j) = table.journal.get() {
        j.dictionary_added();
    }
    Ok(d.id())
}

/// The codecs a job tries, in the order they win ties: for
/// `compression: :auto` every one, else zstd at the table's `level`
/// without and with the new dictionary.
fn candidates(auto: bool, level: i32) -> Vec<Compression> {
    let zstd = |dict| Compression::Zstd { level, dict };
    match auto {
        true => vec![
            Compression::None,
            Compression::Lz4,
            zstd(false),
            zstd(true),
            Compression::Zlib(1),
        ],
        false => vec![zstd(false), zstd(true)],
    }
}

/// The rule that decides what a job puts in use. A dictionary of
/// `dict_size` bytes is trained on the first three quarters of the
/// samples, and each of `candidates` stores and decodes the last quarter
/// (bytes as the arena would hold them: header, a key of `key_len` bytes
/// and body, in the block of their size class):
/// of the codecs whose stored bytes are within 1/16 of the fewest, the
/// one that decodes fastest wins, times within a quarter (plus 50 ns) of
/// the fastest counting as ties, which go to the earlier candidate.
/// (So a dictionary is only used where it saves more than 1/16 of the
/// bytes zstd alone stores, or decodes as fast.) Returns the choice, the
/// dictionary if it is chosen, and the trials.
pub fn choose(
    samples: &[Vec<u8>],
    key_len: usize,
    dict_size: usize,
    candidates: &[Compression],
) -> (Compression, Option<Vec<u8>>, Vec<Trial>) {
    let (train, eval) = samples.split_at(eval_split(samples));
    let level = candidates
        .iter()
        .find_map(|c| match c {
            Compression::Zstd { level, .. } => Some(*level),
            _ => None,
        })
        .unwrap_or(ZSTD_DEFAULT_LEVEL);
    let trained = dict::train(train, dict_size, level).ok();
    let dicts = Dictionaries::new(level);
    if let Some(b) = &trained {
        if let Ok(d) = dicts.add(b) {
            dicts.set_current(d.id());
        }
    }
    let trials: Vec<Trial> = candidates
        .iter()
        .filter(|c| !uses_dict(**c) || dicts.current().is_some())
        .map(|c| trial(*c, eval, key_len, &dicts))
        .collect();
    let fewest = trials.iter().map(|t| t.bytes).min().unwrap_or(0);
    let small: Vec<&Trial> = trials
        .iter()
        .filter(|t| t.bytes <= fewest + fewest / 16)
        .collect();
    let fastest = small.iter().map(|t| t.decode_ns).min().unwrap_or(0);
    let pick = small
        .iter()
        .find(|t| t.decode_ns <= fastest + fastest / 4 + 50)
        .map_or(Compression::None, |t| t.compression);
    let bytes = if uses_dict(pick) { trained } else { None };
    (pick, bytes, trials)
}

/// Stores `eval` with `c` and decodes it back (three times, the fastest
/// counting).
fn trial(c: Compression, eval: &[Vec<u8>], key_len: usize, dicts: &Dictionaries) -> Trial {
    let mut bytes = 0u64;
    let mut each = |len: usize, _| {
        bytes += crate::arena::class_size(crate::arena::class_of(len)) as u64;
    };
    let records = eval.iter().map(|raw| (key_len, raw.as_slice()));
    let best = crate::sizing::pack_and_time(records, c, dicts, &mut each);
    Trial {
        compression: c,
        bytes,
        decode_ns: (best / eval.len().max(1) as u128) as u64,
    }
}

/// True if a record stored with `h` is stored as a new write of the same
/// body would be, given the current dictionary `current` (0 for none).
fn as_new(h: &Header, mode: Compression, current: u32) -> bool {
    match mode {
        Compression::Zstd { dict: true, .. } if current > 0 => {
            (h.codec == Codec::ZstdBlock && h.dict == current)
                || (h.codec == Codec::Raw && h.raw_len < compress::MIN_DICT_LEN)
        }
        Compression::Zstd { .. } => h.codec == Codec::Zstd,
        Compression::Lz4 => h.codec == Codec::Lz4,
        Compression::Zlib(_) => h.codec == Codec::Deflate,
        Compression::None => h.codec == Codec::Raw,
    }
}

/// The re-compression walk of job `generation`; true if it got to the end
/// (the job's [`Progress`] then says `Running` still, for the compaction).
fn recompress(table: &Table, generation: u64) -> bool {
    let mine = || table.learner.generation.load(Ordering::Acquire) == generation;
    let (mut buf, mut scratch, mut after) = (RecordBuf::new(), Vec::new(), None);
    let (mut done, mut swapped) = (0u64, 0u64);
    loop {
        if !mine() {
            return false;
        }
        let started = Instant::now();
        buf.clear();
        let Ok(next) = table.chunk(after.as_ref(), CHUNK, CHUNK_RAW, &mut buf) else {
            return false;
        };
        let mode = table.compression();
        let current = table.dicts.current().map_or(0, |d| d.id());
        let mut new = Vec::new();
        for (i, it) in buf.items().iter().enumerate() {
            if it.header.codec == Codec::Raw && it.header.raw_len < compress::MIN_DICT_LEN
                || as_new(&it.header, mode, current)
            {
                continue;
            }
            let Ok(body) = buf.body(it, &table.dicts, &mut scratch) else {
                continue;
            };
            let p = table.prepare(buf.key(it), body);
            let same = p.packed.codec == it.header.codec && p.packed.dict == it.header.dict;
            if !same {
                new.push((i, p));
            }
        }
        // The write lock is taken for a few records at a time: this
        // thread runs at a low priority, and the less it holds the lock
        // the less a writer can wait on it while it is preempted.
        for part in new.chunks(SWAP_BATCH) {
            match table.swap_in(&buf, part) {
                Ok(n) => swapped += n,
                Err(_) => return false,
            }
        }
        done += buf.len() as u64;
        let total = table.len().unwrap_or(0) as u64;
        {
            let mut p = table.learner.progress.lock();
            if !mine() {
                return false;
            }
            (p.done, p.total, p.recompressed) = (done.min(total), total, swapped);
        }
        match next {
            Some(c) => after = Some(c),
            None => return true,
        }
        // Paced: at most half of one core.
        std::thread::sleep(started.elapsed().max(Duration::from_micros(50)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::Value;
    use crate::table::tests::all_bodies as bodies;
    use crate::table::{Kind, Options};
    use crate::testutil::noise;
    use crate::Backing;
    use std::sync::mpsc;

    fn zstd_dict() -> Compression {
        Compression::Zstd {
            level: 3,
            dict: true,
        }
    }

    fn table(kind: Kind, compression: Compression) -> Arc<Table> {
        Arc::new(
            Table::new(&Options {
                backing: Backing::Memory,
                compression,
                label: "learn".into(),
                kind,
            })
            .unwrap(),
        )
    }

    fn key(i: i64) -> Vec<u8> {
        Value::Int(i).to_bytes()
    }

    /// A JSON-like body: what every record shares, and what is its own.
    fn json(i: i64) -> Vec<u8> {
        let s = format!(
            "{{\"id\":{i},\"name\":\"user-{i}\",\"email\":\"user-{i}@example.com\",\
             \"age\":{},\"city\":\"Springfield\",\"street\":\"{} Main Street\",\
             \"active\":{}}}",
            i % 90,
            i % 997,
            i % 3 != 0
        );
        Value::Tuple(vec![Value::Int(i), Value::Binary(s.into_bytes())]).to_bytes()
    }

    fn fill(t: &Table, range: std::ops::Range<i64>, body: impl Fn(i64) -> Vec<u8>) {
        let recs: Vec<Prepared> = range.map(|i| t.prepare(&key(i), &body(i))).collect();
        for c in recs.chunks(500) {
            // insert takes a slice of owned records.
            let c: Vec<Prepared> = c.iter().map(|p| clone_prepared(t, p)).collect();
            t.insert(&c).unwrap();
        }
    }

    fn clone_prepared(t: &Table, p: &Prepared) -> Prepared {
        let mut scratch = Vec::new();
        let h = Header::parse(&p.bytes).unwrap();
        let body = compress::unpack(&h, &p.bytes[h.body_start()..], &t.dicts, &mut scratch)
            .unwrap()
            .to_vec();
        t.prepare(p.key(), &body)
    }

    /// Runs a job to its end; what `done` got.
    fn run_job(t: &Arc<Table>, job: Job) -> Result<u32, LearnError> {
        let (tx, rx) = mpsc::channel();
        start(t.clone(), job, Some(Box::new(move |r| tx.send(r).unwrap())))?;
        let r = rx.recv().unwrap();
        while matches!(t.learning().phase, Phase::Running | Phase::Sampling) {
            std::thread::sleep(Duration::from_millis(2));
        }
        r
    }

    #[test]
    fn training_uses_a_dictionary_and_recompression_moves_every_record_to_it() {
        for kind in [Kind::Set, Kind::OrderedSet, Kind::Bag, Kind::DuplicateBag] {
            let t = table(kind, zstd_dict());
            fill(&t, 0..3000, json);
            let before = t.stats().unwrap().payload_stored_bytes;
            assert_eq!(t.tally().unwrap().by_codec[Codec::Zstd as usize], 3000);
            let id = run_job(&t, Job::default()).unwrap();
            assert_eq!(id, 1, "{kind:?}");
            let p = t.learning();
            assert_eq!(p.phase, Phase::Done);
            assert_eq!((p.done, p.total, p.recompressed), (3000, 3000, 3000));
            let tally = t.tally().unwrap();
            assert_eq!(tally.by_dict, vec![3000], "{kind:?}");
            assert_eq!(tally.by_codec[Codec::ZstdBlock as usize], 3000);
            let s = t.stats().unwrap();
            assert!(s.payload_stored_bytes < before / 2, "{kind:?}: {s:?}");
            assert!(s.dictionary_bytes > 0 && s.meta_bytes >= s.dictionary_bytes);
            for i in [0, 1, 1234, 2999] {
                assert_eq!(bodies(&t, &key(i)), vec![json(i)], "{kind:?}");
            }
            assert_eq!(t.len().unwrap(), 3000);
        }
    }

    #[test]
    fn old_records_stay_readable_after_retraining() {
        let t = table(Kind::Set, zstd_dict());
        fill(&t, 0..1000, json);
        let quiet = Job {
            recompress: false,
            ..Job::default()
        };
        assert_eq!(run_job(&t, quiet), Ok(1));
        fill(&t, 1000..2000, json);
        assert_eq!(run_job(&t, quiet), Ok(2));
        fill(&t, 2000..2500, json);
        let tally = t.tally().unwrap();
        assert_eq!(tally.by_dict, vec![1000, 500]);
        assert_eq!(tally.by_codec[Codec::Zstd as usize], 1000);
        for i in (0..2500).step_by(97) {
            assert_eq!(bodies(&t, &key(i)), vec![json(i)]);
        }
        // Re-compression then moves them all to the newest.
        assert_eq!(run_job(&t, Job::default()), Ok(3));
        assert_eq!(t.tally().unwrap().by_dict, vec![0, 0, 2500]);
        for i in (0..2500).step_by(97) {
            assert_eq!(bodies(&t, &key(i)), vec![json(i)]);
        }
    }

    #[test]
    fn a_record_changed_after_it_was_copied_out_is_not_swapped() {
        let t = table(Kind::Set, zstd_dict());
        fill(&t, 0..200, json);
        let mut buf = RecordBuf::new();
        t.chunk(None, 10, usize::MAX, &mut buf).unwrap();
        use_dict(
            &t,
            &dict::train(&t.sample(200).unwrap().0, 2048, 9).unwrap(),
        )
        .unwrap();
        let mut scratch = Vec::new();
        let new: Vec<(usize, Prepared)> = (0..buf.len())
            .map(|i| {
                let it = &buf.items()[i];
                let body = buf.body(it, &t.dicts, &mut scratch).unwrap().to_vec();
                (i, t.prepare(buf.key(it), &body))
            })
            .collect();
        // Another writer replaces the first record and deletes the second.
        let (k0, k1) = (
            buf.key(&buf.items()[0]).to_vec(),
            buf.key(&buf.items()[1]).to_vec(),
        );
        t.insert(&[t.prepare(&k0, b"changed")]).unwrap();
        t.remove(t.hash(&k1), &k1, None).unwrap();
        assert_eq!(t.swap_in(&buf, &new).unwrap(), 8);
        assert_eq!(bodies(&t, &k0), vec![b"changed".to_vec()]);
        assert!(bodies(&t, &k1).is_empty());
        assert_eq!(t.len().unwrap(), 199);
        assert_eq!(t.tally().unwrap().by_dict, vec![8]);
    }

    #[test]
    fn bag_objects_still_match_once_recompressed() {
        for kind in [Kind::Bag, Kind::DuplicateBag] {
            let t = table(kind, zstd_dict());
            // Three objects a key.
            let obj = |i: i64| json(i);
            let recs: Vec<Prepared> = (0..900)
                .map(|i| t.prepare(&key(i % 300), &obj(i)))
                .collect();
            t.insert(&recs).unwrap();
            run_job(&t, Job::default()).unwrap();
            assert_eq!(t.tally().unwrap().by_dict, vec![900]);
            // The same objects again: a bag sees they are there already.
            let again: Vec<Prepared> = (0..900)
                .map(|i| t.prepare(&key(i % 300), &obj(i)))
                .collect();
            t.insert(&again).unwrap();
            let want = if kind == Kind::Bag { 900 } else { 1800 };
            assert_eq!(t.len().unwrap(), want, "{kind:?}");
            let gone = t.remove_object(&t.prepare(&key(7), &obj(307))).unwrap();
            assert_eq!(gone, if kind == Kind::Bag { 1 } else { 2 }, "{kind:?}");
        }
    }

    #[test]
    fn the_rule_picks_none_for_noise_and_a_dictionary_for_similar_records() {
        let noise: Vec<Vec<u8>> = (1..=400).map(|seed| noise(seed, 300)).collect();
        let (c, dict, trials) = choose(&noise, 4, 4096, &candidates(true, 3));
        assert_eq!(c, Compression::None, "{trials:?}");
        assert!(dict.is_none());
        let similar: Vec<Vec<u8>> = (0..2000).map(json).collect();
        let (c, dict, trials) = choose(&similar, 4, 8192, &candidates(true, 3));
        assert_eq!(c, zstd_dict(), "{trials:?}");
        assert!(dict.is_some());
        assert_eq!(trials.len(), 5);
        // Without :auto only zstd with and without the dictionary compete.
        let (c, _, trials) = choose(&similar, 4, 8192, &candidates(false, 5));
        assert_eq!(trials.len(), 2);
        assert_eq!(
            c,
            Compression::Zstd {
                level: 5,
                dict: true
            }
        );
    }

    #[test]
    fn an_auto_table_puts_its_choice_in_use_and_recompresses_to_it() {
        let t = table(Kind::Set, Compression::Zlib(1));
        t.set_auto();
        assert!(t.is_auto());
        fill(&t, 0..2000, json);
        assert_eq!(t.tally().unwrap().by_codec[Codec::Zstd as usize], 2000);
        assert_eq!(run_job(&t, Job::default()), Ok(1));
        assert_eq!(t.compression(), zstd_dict());
        assert_eq!(t.learning().trials.len(), 5);
        assert_eq!(t.tally().unwrap().by_dict, vec![2000]);
    }

    #[test]
    fn a_refused_job_changes_nothing() {
        let plain = table(
            Kind::Set,
            Compression::Zstd {
                level: 3,
                dict: false,
            },
        );
        fill(&plain, 0..500, json);
        assert_eq!(
            start(plain.clone(), Job::default(), None),
            Err(LearnError::NotLearning)
        );
        assert_eq!(plain.learning().phase, Phase::Idle);
        let t = table(Kind::Set, zstd_dict());
        fill(&t, 0..10, json);
        assert_eq!(run_job(&t, Job::default()), Err(LearnError::TooFewRecords));
        assert!(t.dictionaries().is_empty());
        assert_eq!(t.learning().phase, Phase::Failed);
        fill(&t, 10..500, json);
        t.learner.progress.lock().phase = Phase::Training;
        assert_eq!(
            start(t.clone(), Job::default(), None),
            Err(LearnError::Busy)
        );
        assert!(t.dictionaries().is_empty());
        assert_eq!(t.tally().unwrap().by_codec[Codec::Zstd as usize], 500);
    }

    #[test]
    fn the_tally_follows_removes_and_clear() {
        let t = table(Kind::Set, Compression::Lz4);
        fill(&t, 0..100, |i| {
            Value::Tuple(vec![Value::Int(i), Value::Binary(vec![b'x'; 300])]).to_bytes()
        });
        t.insert(&[t.prepare(&key(1000), b"tiny")]).unwrap();
        let tally = t.tally().unwrap();
        assert_eq!(
            (tally.by_codec[Codec::Lz4 as usize], tally.by_codec[0]),
            (100, 1)
        );
        t.remove(t.hash(&key(5)), &key(5), None).unwrap();
        assert_eq!(t.tally().unwrap().by_codec[Codec::Lz4 as usize], 99);
        t.clear().unwrap();
        assert_eq!(t.tally().unwrap(), Tally::default());
    }

    /// Order records: nothing of them is in a dictionary of [`json`]'s.
    fn order(i: i64) -> Vec<u8> {
        let s = format!(
            "<order id=\"{i}\"><customer>customer number {}</customer><item sku=\"SKU-{}\" \
             qty=\"{}\"/><status>shipped by ground freight</status><warehouse>north-east \
             regional depot</warehouse></order>",
            i % 5000,
            i % 313,
            i % 9
        );
        Value::Tuple(vec![Value::Int(i), Value::Binary(s.into_bytes())]).to_bytes()
    }

    /// A dictionary table of [`AUTO_RECORDS`] [`json`] records once its
    /// automatic job has run: its first dictionary is in use.
    fn learnt_once() -> Arc<Table> {
        let t = table(Kind::Set, zstd_dict());
        fill(&t, 0..AUTO_RECORDS as i64, json);
        assert!(t.take_learning_due());
        assert_eq!(run_job(&t, Job::automatic()), Ok(1));
        t
    }

    #[test]
    fn a_table_grown_four_times_over_retrains_and_uses_the_new_dictionary_only_if_it_pays() {
        let (auto, n) = (Job::automatic(), AUTO_RECORDS as i64);
        for drift in [false, true] {
            let t = learnt_once();
            // Not due again before the table holds four times as many.
            let more = if drift { order } else { json };
            fill(&t, n..4 * n - 1, more);
            assert!(!t.take_learning_due());
            fill(&t, 4 * n - 1..4 * n, more);
            assert!(t.take_learning_due());
            let stored = t.stats().unwrap().payload_stored_bytes;
            if drift {
                // Three quarters of the records are of a new kind: a
                // dictionary trained on samples from the whole table
                // stores them in far fewer bytes, and every record moves
                // to it.
                assert_eq!(run_job(&t, auto), Ok(2));
                assert_eq!(t.dictionaries().len(), 2);
                assert_eq!(t.tally().unwrap().by_dict, vec![0, 4 * n as u64]);
                assert!(t.stats().unwrap().payload_stored_bytes < stored * 3 / 4);
            } else {
                // The same kind of records: the current dictionary stays,
                // no other is added, and the records stay as they were.
                assert_eq!(run_job(&t, auto), Ok(1));
                assert_eq!(t.dictionaries().len(), 1);
                assert_eq!(t.tally().unwrap().by_dict, vec![4 * n as u64]);
                assert_eq!(t.stats().unwrap().payload_stored_bytes, stored);
            }
            // The next retraining is due at four times as many again.
            fill(&t, 4 * n..5 * n, json);
            assert!(!t.take_learning_due());
        }
    }

    #[test]
    fn a_retraining_that_finds_nothing_to_learn_keeps_the_dictionary_and_is_no_failure() {
        let (auto, n) = (Job::automatic(), AUTO_RECORDS as i64);
        let t = learnt_once();
        // Then three times as many records of noise: no dictionary helps.
        fill(&t, n..4 * n, |i| {
            Value::Tuple(vec![Value::Int(i), Value::Binary(noise(i as u32 + 1, 600))]).to_bytes()
        });
        assert!(t.take_learning_due());
        assert_eq!(run_job(&t, auto), Ok(1));
        assert_eq!(t.learning().phase, Phase::Done);
        assert_eq!(t.learning().error, None);
        assert_eq!(t.dictionaries().len(), 1);
        assert_eq!(t.compression(), zstd_dict());
        assert_eq!(t.tally().unwrap().by_dict, vec![n as u64]);
    }

    #[test]
    fn samples_are_spread_over_the_whole_table() {
        let t = table(Kind::OrderedSet, zstd_dict());
        fill(&t, 0..8000, |i| if i < 4000 { json(i) } else { order(i) });
        let (samples, _) = t.sample(1000).unwrap();
        assert_eq!(samples.len(), 1000);
        // In key order, every 8th record: half of them orders.
        let orders = samples
            .iter()
            .filter(|b| b.windows(6).any(|w| w == b"<order"))
            .count();
        assert_eq!(orders, 500);
    }

    #[test]
    fn automatic_learning_is_due_once_at_auto_records() {
        let t = table(Kind::Set, zstd_dict());
        fill(&t, 0..AUTO_RECORDS as i64 - 1, json);
        assert!(!t.take_learning_due());
        fill(&t, AUTO_RECORDS as i64..AUTO_RECORDS as i64 + 10, json);
        assert!(t.take_learning_due());
        assert!(!t.take_learning_due());
        let plain = table(Kind::Set, Compression::Zlib(1));
        fill(&plain, 0..AUTO_RECORDS as i64 + 1, json);
        assert!(!plain.take_learning_due());
    }
}
