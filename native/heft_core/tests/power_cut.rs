//! Power cuts, simulated. A power loss keeps what was synced and, of what
//! was not, whichever pages the kernel happened to write back, in any
//! order, some of them torn at a sector. These tests keep that model of
//! the disk beside a live table: a `SyncWatch` records what each fsync,
//! fdatasync and directory fsync makes durable, and at random moments
//! (a third of them just after a dump) a crash image is built from it,
//! with a random share of the unsynced pages written back (a few, half,
//! nearly all). Writers meanwhile insert batches of 1-300 records (some
//! of 4-44 KB), delete and bump counters while dumps run and segments
//! fill up and rotate. Each image must open without `repair`, and hold
//! exactly the table's state after some prefix of its writes, with every
//! batch whole: never half a batch, never a later write without an
//! earlier one. It must also keep every write a sync acknowledged: each
//! commit in `sync: :commit`, and in every mode what a `sync` or a dump
//! covered. This guards against a dump whose snapshot becomes durable
//! before the log it needs, a rotation that writes to the next segment
//! before the full one is sealed, and recovery refusing (or misreading)
//! a log whose unsynced pages were lost out of order.

#[allow(dead_code)]
#[path = "../src/testutil.rs"]
mod testutil;

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{self, File};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::{Duration, Instant};

use heft_core::codec::{decode, Value, ValueBuilder};
use heft_core::files::{unwatch_syncs, watch_syncs, SyncWatch};
use heft_core::persist::{Config, Event, Events, Failure, Opened, Persisted, SyncMode};
use heft_core::table::{Error as TableError, Kind, RecordBuf};
use heft_core::{Backing, Compression, Options, Table};
use testutil::{noise, Rng};

const PAGE: usize = 4096;
const SECTOR: usize = 512;

/// One file as the disk holds it.
struct Inode {
    /// Open for reading what the page cache holds now, even once the
    /// file is renamed or removed.
    handle: File,
    /// What its last sync made durable (empty if never synced).
    synced: Vec<u8>,
}

#[derive(Default)]
struct DiskState {
    files: HashMap<u64, Inode>,
    /// The directory's entries as last synced: name -> inode.
    names: BTreeMap<String, u64>,
}

/// The disk under one table directory, as a power loss would leave it.
struct Disk {
    dir: PathBuf,
    state: Mutex<DiskState>,
}

fn read_whole(f: &File) -> Vec<u8> {
    let len = f.metadata().unwrap().len() as usize;
    let mut out = vec![0u8; len];
    let mut got = 0;
    while got < len {
        match f.read_at(&mut out[got..], got as u64).unwrap() {
            0 => break,
            n => got += n,
        }
    }
    out.truncate(got);
    out
}

impl Disk {
    fn mine(&self, f: &File) -> bool {
        let link = format!("/proc/self/fd/{}", f.as_raw_fd());
        fs::read_link(link).is_ok_and(|p| p.parent() == Some(&self.dir))
    }

    /// A crash image in `to`: every entry as last synced, each file as
    /// last synced with each page written since kept with probability
    /// `eager` percent (one in eight of those torn: a random subset of
    /// its sectors).
    fn cut(&self, st: &DiskState, to: &Path, rng: &mut Rng, eager: u64) {
        fs::create_dir_all(to).unwrap();
        for (name, ino) in &st.names {
            let inode = &st.files[ino];
            let now = read_whole(&inode.handle);
            let mut image = if inode.synced.is_empty() {
                vec![0u8; now.len()]
            } else {
                inode.synced.clone()
            };
            for (p, page) in image.chunks_mut(PAGE).enumerate() {
                let at = p * PAGE;
                let Some(cur) = now.get(at..(at + page.len()).min(now.len())) else {
                    continue;
                };
                if cur == &page[..cur.len()] || rng.below(100) >= eager {
                    continue;
                }
                let torn = rng.below(8) == 0;
                for (s, sector) in page[..cur.len()].chunks_mut(SECTOR).enumerate() {
                    if !torn || rng.below(2) == 0 {
                        let from = s * SECTOR;
                        sector.copy_from_slice(&cur[from..from + sector.len()]);
                    }
                }
            }
            fs::write(to.join(name), &image).unwrap();
        }
    }
}

impl SyncWatch for Disk {
    fn file(&self, f: &File) {
        if !self.mine(f) {
            return;
        }
        let mut st = self.state.lock().unwrap();
        let ino = f.metadata().unwrap().ino();
        let synced = read_whole(f);
        let handle = f.try_clone().unwrap();
        st.files.insert(ino, Inode { handle, synced });
    }

    fn dir(&self, d: &Path) {
        if d.canonicalize().ok().as_deref() != Some(&self.dir) {
            return;
        }
        let mut st = self.state.lock().unwrap();
        let mut names = BTreeMap::new();
        for e in fs::read_dir(&self.dir).unwrap() {
            let Ok(e) = e else { continue };
            let Ok(meta) = e.metadata() else { continue };
            let name = e.file_name().into_string().unwrap();
            if let Entry::Vacant(v) = st.files.entry(meta.ino()) {
                // Never synced: its pages are only as the kernel wrote
                // them back.
                let Ok(handle) = File::open(e.path()) else {
                    continue;
                };
                let synced = Vec::new();
                v.insert(Inode { handle, synced });
            }
            names.insert(name, meta.ino());
        }
        st.names = names;
    }
}

/// What a waiter waits for.
#[derive(Clone, Copy)]
enum Wait {
    /// Batch `n`'s commit.
    Commit(usize),
    /// A sync or a dump asked for once `n` batches were logged.
    Covers(usize),
}

#[derive(Default)]
struct Acks {
    /// Batches whose commit was acknowledged.
    commits: HashSet<usize>,
    /// Batches below this were covered by an acknowledged sync or dump.
    covered: usize,
    dumps: u64,
}

#[derive(Clone, Default)]
struct Probe(Arc<(Mutex<Acks>, Condvar)>);

impl Events for Probe {
    type Waiter = Wait;
    fn done(&self, waiters: Vec<Wait>, result: Result<(), Failure>) {
        let mut a = self.0 .0.lock().unwrap();
        if result.is_ok() {
            for w in waiters {
                match w {
                    Wait::Commit(n) => {
                        a.commits.insert(n);
                    }
                    Wait::Covers(n) => a.covered = a.covered.max(n),
                }
            }
        }
        self.0 .1.notify_all();
    }
    fn notify(&self, event: Event) {
        if let Event::Dumped(_) = event {
            self.0 .0.lock().unwrap().dumps += 1;
            self.0 .1.notify_all();
        }
    }
}

/// One write batch, as the model replays it: keys put with the body of
/// `(seed, bytes)`, or removed.
type Batch = Vec<(i64, Option<(u64, usize)>)>;

/// The key of writer `w`'s record `i`, of its counter, of its marker (the
/// last batch of its inserts, which every insert batch puts).
fn record_key(w: usize, i: u64) -> i64 {
    (w as i64 + 1) * 1_000_000 + i as i64
}
fn counter_key(w: usize) -> i64 {
    -(w as i64) * 2 - 1
}
fn marker_key(w: usize) -> i64 {
    -(w as i64) * 2 - 2
}

fn body(key: i64, seed: u64, bytes: usize) -> Vec<u8> {
    Value::Tuple(vec![
        Value::Int(key),
        Value::Int(seed as i64),
        Value::Binary(noise(seed as u32 | 1, bytes)),
    ])
    .to_bytes()
}

fn opts() -> Options {
    Options {
        backing: Backing::Memory,
        compression: Compression::None,
        label: "power-cut".into(),
        kind: Kind::Set,
    }
}

/// Runs a write as the NIF does: when the log needs a new segment first,
/// make room and try again.
fn write<T>(
    o: &Opened<Probe>,
    f: impl Fn(&Table) -> Result<T, TableError>,
) -> Result<T, TableError> {
    loop {
        match f(&o.table) {
            Err(TableError::WouldBlock) => o.persisted.make_room().unwrap(),
            other => return other,
        }
    }
}

/// Every record as key -> (seed, body bytes), checking each body.
fn contents(t: &Table) -> BTreeMap<i64, (u64, usize)> {
    let mut out = BTreeMap::new();
    let mut cursor = None;
    let mut buf = RecordBuf::new();
    let mut scratch = Vec::new();
    loop {
        buf.clear();
        let next = t
            .chunk(cursor.as_ref(), 1000, usize::MAX, &mut buf)
            .unwrap();
        for it in buf.items() {
            let k = buf.key(it).to_vec();
            let b = buf.body(it, t.dictionaries(), &mut scratch).unwrap();
            let Ok(Value::Tuple(v)) = decode(b, Some(&k), &mut ValueBuilder) else {
                panic!("a record that does not decode");
            };
            let (Value::Int(key), Value::Int(seed), Value::Binary(bin)) = (&v[0], &v[1], &v[2])
            else {
                panic!("a record of another shape: {v:?}");
            };
            assert_eq!(
                bin,
                &noise(*seed as u32 | 1, bin.len()),
                "record {key}'s bytes"
            );
            out.insert(*key, (*seed as u64, bin.len()));
        }
        match next {
            Some(c) => cursor = Some(c),
            None => return out,
        }
    }
}

/// The prefix of `history` the recovered `got` is the state after, if
/// it is one: the markers say which insert batch came last, and only
/// deletes and counters may follow it.
fn prefix_of(
    got: &BTreeMap<i64, (u64, usize)>,
    history: &[Batch],
    writers: usize,
) -> Option<usize> {
    let last_insert = (0..writers)
        .filter_map(|w| got.get(&marker_key(w)).map(|&(seed, _)| seed as usize))
        .max()
        .unwrap_or(0);
    let mut model = BTreeMap::new();
    let apply = |model: &mut BTreeMap<i64, (u64, usize)>, b: &Batch| {
        for (k, v) in b {
            match v {
                Some(v) => model.insert(*k, *v),
                None => model.remove(k),
            };
        }
    };
    for b in history.get(..last_insert)? {
        apply(&mut model, b);
    }
    // The longest such prefix: a delete of a key that was not there
    // changes nothing.
    let mut n = last_insert;
    let mut found = None;
    loop {
        if model == *got {
            found = Some(n);
        }
        let Some(b) = history.get(n) else {
            return found;
        };
        if b.iter()
            .any(|(k, _)| (0..writers).any(|w| *k == marker_key(w)))
        {
            return found;
        }
        apply(&mut model, b);
        n += 1;
    }
}

struct Run {
    mode: SyncMode,
    seed: u64,
    cuts: usize,
}

fn run(r: Run) {
    const WRITERS: usize = 3;
    let base = std::env::temp_dir().join(format!(
        "heft-power-cut-{}-{:?}",
        std::process::id(),
        r.mode
    ));
    let _ = fs::remove_dir_all(&base);
    let dir = base.join("live");
    fs::create_dir_all(&dir).unwrap();
    let disk = Arc::new(Disk {
        dir: dir.canonicalize().unwrap(),
        state: Mutex::default(),
    });
    let watch: Arc<dyn SyncWatch> = disk.clone();
    watch_syncs(watch.clone());
    let probe = Probe::default();
    let config = Config {
        sync: r.mode,
        dump_write_threshold: 3_000,
        segment_bytes: 256 << 10,
        ..Config::default()
    };
    let o = Persisted::open(&dir, b"meta", true, &opts(), config, probe.clone()).unwrap();
    // Writers hold `gate` to read while they write, so that a cut sees no
    // batch half copied into the log; `history` is the log's order.
    let gate = RwLock::new(());
    let history: Mutex<Vec<Batch>> = Mutex::default();
    let stop = AtomicBool::new(false);
    let failures: Mutex<Vec<String>> = Mutex::default();
    let torn = AtomicU64::new(0);
    std::thread::scope(|s| {
        for w in 0..WRITERS {
            let (o, gate, history, stop) = (&o, &gate, &history, &stop);
            let probe = probe.clone();
            s.spawn(move || {
                let mut rng = Rng(r.seed.wrapping_mul(31).wrapping_add(w as u64 + 1) | 1);
                let mut counter = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let pass = gate.read().unwrap();
                    let mut h = history.lock().unwrap();
                    let n = h.len();
                    let roll = rng.below(100);
                    let batch: Batch = if roll < 70 {
                        let most = if rng.below(4) == 0 { 300 } else { 20 };
                        let count = 1 + rng.below(most);
                        let mut b: Batch = (0..count)
                            .map(|_| {
                                let big = rng.below(40) == 0;
                                let bytes = if big {
                                    4_000 + rng.below(40_000)
                                } else {
                                    rng.below(200)
                                };
                                (
                                    record_key(w, rng.below(2_000)),
                                    Some((rng.next() >> 32, bytes as usize)),
                                )
                            })
                            .collect();
                        b.push((marker_key(w), Some((n as u64 + 1, 0))));
                        // One put per key (the last), as the model has it.
                        let mut seen = HashSet::new();
                        b.reverse();
                        b.retain(|(k, _)| seen.insert(*k));
                        b.reverse();
                        b
                    } else if roll < 85 {
                        vec![(record_key(w, rng.below(2_000)), None)]
                    } else {
                        counter += 1;
                        vec![(counter_key(w), Some((counter, 8)))]
                    };
                    match batch.as_slice() {
                        [(k, None)] => {
                            let key = Value::Int(*k).to_bytes();
                            write(o, |t| t.remove(t.hash(&key), &key, None)).unwrap();
                        }
                        _ => {
                            let recs: Vec<_> = batch
                                .iter()
                                .map(|(k, v)| {
                                    let (seed, bytes) = v.unwrap();
                                    o.table
                                        .prepare(&Value::Int(*k).to_bytes(), &body(*k, seed, bytes))
                                })
                                .collect();
                            write(o, |t| t.insert(&recs)).unwrap();
                        }
                    }
                    h.push(batch);
                    drop(h);
                    drop(pass);
                    if r.mode == SyncMode::Commit {
                        let waiter = Wait::Commit(n);
                        if let Some(Wait::Commit(n)) = o.persisted.await_durable(waiter).unwrap() {
                            probe.0 .0.lock().unwrap().commits.insert(n);
                        }
                        let (m, cv) = &*probe.0;
                        let mut a = m.lock().unwrap();
                        while !a.commits.contains(&n) && !stop.load(Ordering::Relaxed) {
                            a = cv.wait_timeout(a, Duration::from_millis(50)).unwrap().0;
                        }
                    }
                }
            });
        }
        // Dumps and syncs now and then, as an application asks for them.
        let (o, history, stop) = (&o, &history, &stop);
        let probe2 = probe.clone();
        s.spawn(move || {
            let mut rng = Rng(r.seed.wrapping_mul(17).wrapping_add(5) | 1);
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(5 + rng.below(40)));
                let h = history.lock().unwrap();
                let waiter = Wait::Covers(h.len());
                if rng.below(3) == 0 {
                    if let Some(Wait::Covers(n)) = o.persisted.await_durable(waiter).unwrap() {
                        let mut a = probe2.0 .0.lock().unwrap();
                        a.covered = a.covered.max(n);
                    }
                } else {
                    let _ = o.persisted.request_dump(Some(waiter));
                }
            }
        });
        let mut rng = Rng(r.seed);
        for cut in 0..r.cuts {
            // A third of the cuts come just after a dump ends.
            if cut % 3 == 0 {
                let (m, cv) = &*probe.0;
                let mut a = m.lock().unwrap();
                let before = a.dumps;
                let deadline = Instant::now() + Duration::from_secs(10);
                while a.dumps == before && Instant::now() < deadline {
                    a = cv.wait_timeout(a, Duration::from_millis(20)).unwrap().0;
                }
                drop(a);
                std::thread::sleep(Duration::from_millis(rng.below(5)));
            } else {
                std::thread::sleep(Duration::from_millis(10 + rng.below(60)));
            }
            let eager = [5, 50, 95][cut % 3];
            let image = base.join(format!("cut-{cut}"));
            let (history_then, acks) = {
                let _pause = gate.write().unwrap();
                let st = disk.state.lock().unwrap();
                let acks = probe.0 .0.lock().unwrap();
                let acked = acks.commits.iter().max().map_or(0, |n| n + 1);
                let floor = acks.covered.max(acked);
                drop(acks);
                disk.cut(&st, &image, &mut rng, eager);
                (history.lock().unwrap().clone(), floor)
            };
            let what = format!(
                "{:?}, seed {}, cut {cut} ({eager}% written back)",
                r.mode, r.seed
            );
            let c = Config {
                sync: r.mode,
                ..Config::default()
            };
            match Persisted::open(&image, b"meta", false, &opts(), c, Probe::default()) {
                Err(e) => failures
                    .lock()
                    .unwrap()
                    .push(format!("{what}: open refused: {e}")),
                Ok(back) => {
                    let got = contents(&back.table);
                    match prefix_of(&got, &history_then, WRITERS) {
                        None => failures.lock().unwrap().push(format!(
                            "{what}: not the state after any prefix of the {} batches",
                            history_then.len()
                        )),
                        Some(n) if n < acks => failures.lock().unwrap().push(format!(
                            "{what}: {n} batches recovered, {acks} were acknowledged durable; \
                             the next: {:?}",
                            history_then[n]
                                .iter()
                                .map(|(k, v)| (k, v.map(|v| v.1)))
                                .take(5)
                                .collect::<Vec<_>>()
                        )),
                        Some(_) => {}
                    }
                    torn.fetch_add(
                        back.persisted.stats().recovery.torn_bytes,
                        Ordering::Relaxed,
                    );
                    back.table.take_storage();
                    back.persisted.close().unwrap();
                }
            }
            let _ = fs::remove_dir_all(&image);
        }
        stop.store(true, Ordering::Relaxed);
    });
    unwatch_syncs(&watch);
    let batches = history.lock().unwrap().len();
    o.table.take_storage();
    o.persisted.close().unwrap();
    let _ = fs::remove_dir_all(&base);
    let failures = failures.into_inner().unwrap();
    assert!(
        failures.is_empty(),
        "{} of {} cuts failed ({batches} batches written):\n{}",
        failures.len(),
        r.cuts,
        failures.join("\n")
    );
    assert!(batches > 0);
    eprintln!(
        "{:?}: {} cuts, {batches} batches, {} bytes cut as torn",
        r.mode,
        r.cuts,
        torn.load(Ordering::Relaxed)
    );
}

fn seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1
}

#[test]
fn power_cuts_in_sync_none_keep_a_prefix_of_whole_batches() {
    run(Run {
        mode: SyncMode::None,
        seed: seed(),
        cuts: 24,
    });
}

#[test]
fn power_cuts_in_sync_interval_keep_a_prefix_of_whole_batches() {
    run(Run {
        mode: SyncMode::Interval(Duration::from_millis(20)),
        seed: seed(),
        cuts: 24,
    });
}

#[test]
fn power_cuts_in_sync_commit_keep_every_acknowledged_commit() {
    run(Run {
        mode: SyncMode::Commit,
        seed: seed(),
        cuts: 24,
    });
}
