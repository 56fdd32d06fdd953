//! What a persistent table's files must survive. A crash can stop the VM
//! between any two system calls, and a power loss can lose whatever was not
//! fsynced, so these tests cut, flip and delete bytes of the files a table
//! leaves behind and check what opening them again gives: a torn tail is
//! cut and counted, damage before it is refused (or, with `repair`, the
//! records before it are kept and the rest set aside), a write batch is
//! recovered entirely or not at all, and a dump interrupted at any step
//! leaves a table that loads. Faults the filesystem cannot be made to
//! produce here (a failed fsync, a full disk) are injected through
//! `Persisted::faults`.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use heft_core::codec::{decode, Value, ValueBuilder};
use heft_core::persist::{Config, Event, Events, Failure, Opened, Persisted, SyncMode};
use heft_core::recovery::{read_manifest, segment_name, write_manifest, OpenError};
use heft_core::table::{Error as TableError, Kind, RecordBuf};
use heft_core::wal::{
    end_frame, parse_header, FileKind, FrameBuf, Op, END_RESERVE, HEADER_LEN, START_FRAME_LEN,
};
use heft_core::{Backing, Compression, Options, Table};

#[derive(Default)]
struct Ev {
    done: Mutex<Vec<(u64, Result<(), Failure>)>>,
    events: Mutex<Vec<Event>>,
}

#[derive(Clone, Default)]
struct Probe(Arc<Ev>);

impl Events for Probe {
    type Waiter = u64;
    fn done(&self, waiters: Vec<u64>, result: Result<(), Failure>) {
        let mut d = self.0.done.lock().unwrap();
        d.extend(waiters.into_iter().map(|w| (w, result)));
    }
    fn notify(&self, event: Event) {
        self.0.events.lock().unwrap().push(event);
    }
}

static DIR_SEQ: AtomicU64 = AtomicU64::new(0);

struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        let n = DIR_SEQ.fetch_add(1, Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("heft-crash-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&p);
        TempDir(p)
    }
    fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn opts() -> Options {
    Options {
        backing: Backing::Memory,
        compression: Compression::Zlib(1),
        label: "crash".into(),
        kind: Kind::Set,
    }
}

fn config() -> Config {
    Config {
        sync: SyncMode::None,
        ..Config::default()
    }
}

type Open = Opened<Probe>;

fn create(dir: &Path, config: Config) -> (Open, Probe) {
    let p = Probe::default();
    let o = Persisted::open(dir, b"meta", true, &opts(), config, p.clone())
        .unwrap_or_else(|e| panic!("open: {e}"));
    (o, p)
}

fn reopen(dir: &Path, repair: bool) -> Result<Open, OpenError> {
    let c = Config { repair, ..config() };
    Persisted::open(dir, b"meta", false, &opts(), c, Probe::default())
}

fn close(o: Open) {
    o.table.take_storage();
    o.persisted.close().unwrap();
}

fn key(i: i64) -> Vec<u8> {
    Value::Int(i).to_bytes()
}

fn body(i: i64, v: i64) -> Vec<u8> {
    Value::Tuple(vec![
        Value::Int(i),
        Value::Int(v),
        Value::Binary(vec![b'x'; 40]),
    ])
    .to_bytes()
}

/// Runs a write as the NIF does: when the log needs a new segment first
/// (`WouldBlock`), make room and try again.
fn write<T>(o: &Open, f: impl Fn(&Table) -> Result<T, TableError>) -> Result<T, TableError> {
    loop {
        match f(&o.table) {
            Err(TableError::WouldBlock) => o.persisted.make_room().unwrap(),
            other => return other,
        }
    }
}

/// Runs `work(o, w)` for writers `w` in `0..writers`, each on its own
/// thread, all at once.
fn concurrently(o: &Open, writers: i64, work: impl Fn(&Open, i64) + Sync) {
    std::thread::scope(|s| {
        for w in 0..writers {
            let work = &work;
            s.spawn(move || work(o, w));
        }
    });
}

fn put(o: &Open, i: i64, v: i64) {
    write(o, |t| t.insert(&[t.prepare(&key(i), &body(i, v))])).unwrap();
}

fn del(o: &Open, i: i64) {
    let k = key(i);
    write(o, |t| t.remove(t.hash(&k), &k, None)).unwrap();
}

fn put_batch(o: &Open, keys: std::ops::Range<i64>, v: i64) {
    let recs: Vec<_> = keys
        .map(|i| o.table.prepare(&key(i), &body(i, v)))
        .collect();
    write(o, |t| t.insert(&recs)).unwrap();
}

/// Every record as (key, body), sorted.
fn contents(t: &Table) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut out = Vec::new();
    let mut cursor = None;
    loop {
        let mut buf = RecordBuf::new();
        let next = t
            .chunk(cursor.as_ref(), 1000, usize::MAX, &mut buf)
            .unwrap();
        let mut scratch = Vec::new();
        for it in buf.items() {
            let b = buf
                .body(it, t.dictionaries(), &mut scratch)
                .unwrap()
                .to_vec();
            out.push((buf.key(it).to_vec(), b));
        }
        match next {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    out.sort();
    out
}

/// Where a segment's first write batch starts: after its header and its
/// start frame.
const FIRST_FRAME: usize = HEADER_LEN + START_FRAME_LEN;

/// Makes a table closed cleanly look like one whose VM died: its MANIFEST
/// no longer says it was closed (what the tests of torn tails need, since
/// a crash is what tears a tail).
fn crashed(dir: &Path) {
    let mut m = read_manifest(dir).unwrap().expect("a manifest");
    m.clean = false;
    write_manifest(dir, &m).unwrap();
}

fn segments(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("wal-"))
        .collect();
    v.sort();
    v
}

#[test]
fn reopen_restores_puts_deletes_clears_and_atoms() {
    let d = TempDir::new();
    let (o, _) = create(&d.0, config());
    let t = &o.table;
    let atom_id = t.atoms().write().intern("hello");
    let atom_rec = Value::Tuple(vec![Value::Int(-1), Value::Atom(atom_id)]).to_bytes();
    put_batch(&o, 0..100, 1);
    t.clear().unwrap();
    put_batch(&o, 0..50, 2);
    t.insert(&[t.prepare(&key(-1), &atom_rec)]).unwrap();
    assert!(t.remove(t.hash(&key(7)), &key(7), None).unwrap());
    let want = contents(t);
    close(o);
    let o = reopen(&d.0, false).unwrap();
    assert_eq!(contents(&o.table), want);
    assert_eq!(o.table.len().unwrap(), 50);
    assert_eq!(o.table.atoms().read().name(atom_id), Some("hello"));
    assert_eq!(o.meta, b"meta");
    let s = o.persisted.stats();
    assert_eq!(s.recovery.replayed_batches, 5);
    assert_eq!(s.recovery.torn_bytes, 0);
    close(o);
}

#[test]
fn truncated_tail_is_cut() {
    let d = TempDir::new();
    let (o, _) = create(&d.0, config());
    for i in 0..5 {
        put_batch(&o, i * 10..i * 10 + 10, i);
    }
    close(o);
    let seg = d.join(&segments(&d.0)[0]);
    let full = fs::read(&seg).unwrap();
    // Offsets where frames end: reopen at every cut and check the table
    // holds exactly the whole batches before it.
    // Every byte near a frame boundary, and a stride through the rest.
    let mut ends = vec![FIRST_FRAME];
    while let Some(h) = full.get(*ends.last().unwrap()..).filter(|h| h.len() >= 8) {
        let len = u32::from_le_bytes(h[..4].try_into().unwrap()) as usize;
        ends.push(ends.last().unwrap() + 8 + len);
    }
    assert_eq!(*ends.last().unwrap(), full.len(), "closed: cut to its log");
    let cuts = (FIRST_FRAME..full.len()).filter(|c| c % 7 == 0 || (c - FIRST_FRAME) % 419 < 3);
    for cut in cuts {
        fs::write(&seg, &full[..cut]).unwrap();
        for s in segments(&d.0).iter().skip(1) {
            fs::remove_file(d.join(s)).unwrap();
        }
        crashed(&d.0);
        let o = reopen(&d.0, false).unwrap_or_else(|e| panic!("cut {cut}: {e}"));
        let n = o.table.len().unwrap();
        assert_eq!(
            n % 10,
            0,
            "cut {cut}: a batch was half applied ({n} records)"
        );
        let st = o.persisted.stats();
        assert_eq!(st.recovery.replayed_batches as usize * 10, n);
        // The whole frames before the cut are kept; the rest is torn
        // (unless it is zeros: the free space of a segment).
        let kept = *ends.iter().rfind(|&&e| e <= cut).unwrap();
        let torn = if full[kept..cut].iter().all(|&b| b == 0) {
            0
        } else {
            cut - kept
        };
        assert_eq!(st.recovery.torn_bytes as usize, torn, "cut {cut}");
        assert_eq!(
            st.recovery.replayed_batches as usize + 1,
            ends.iter().filter(|&&e| e <= cut).count()
        );
        close(o);
    }
}

#[test]
fn checksum_mismatch_in_the_middle_is_corrupt() {
    let d = TempDir::new();
    let (o, _) = create(&d.0, config());
    put_batch(&o, 0..10, 1);
    put_batch(&o, 10..20, 1);
    put_batch(&o, 20..30, 1);
    close(o);
    let name = segments(&d.0)[0].clone();
    let seg = d.join(&name);
    let mut bytes = fs::read(&seg).unwrap();
    let first_frame_end = {
        let len = u32::from_le_bytes(bytes[FIRST_FRAME..FIRST_FRAME + 4].try_into().unwrap());
        FIRST_FRAME + 8 + len as usize
    };
    bytes[first_frame_end + 20] ^= 0x40; // inside the second frame
    fs::write(&seg, &bytes).unwrap();
    match reopen(&d.0, false) {
        Err(OpenError::Corrupt { file, offset }) => {
            assert_eq!(file, name);
            assert_eq!(offset as usize, first_frame_end);
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("opened a damaged log"),
    }
    // Repair keeps the first batch, sets the rest aside, leaves a clean
    // directory that opens without repair.
    let o = reopen(&d.0, true).unwrap();
    assert_eq!(o.table.len().unwrap(), 10);
    let dropped = o.persisted.stats().recovery.dropped.unwrap();
    assert_eq!(dropped.file, name);
    assert_eq!(dropped.bytes as usize, bytes.len() - first_frame_end);
    assert!(d.join(&format!("lost-{name}")).exists());
    close(o);
    let o = reopen(&d.0, false).unwrap();
    assert_eq!(o.table.len().unwrap(), 10);
    close(o);
}

#[test]
fn checksum_mismatch_in_the_last_frame_is_a_torn_tail() {
    let d = TempDir::new();
    let (o, _) = create(&d.0, config());
    put_batch(&o, 0..10, 1);
    put_batch(&o, 10..20, 1);
    close(o);
    let seg = d.join(&segments(&d.0)[0]);
    let bytes = fs::read(&seg).unwrap();
    // As a crash leaves it: without the end frame a close appends.
    let end = end_frame(20, 0);
    assert!(bytes.ends_with(&end));
    let mut bytes = bytes[..bytes.len() - end.len()].to_vec();
    let n = bytes.len();
    bytes[n - 5] ^= 1;
    fs::write(&seg, &bytes).unwrap();
    // After a clean close that is damage; after a crash, a torn tail.
    assert!(matches!(
        reopen(&d.0, false),
        Err(OpenError::Corrupt { .. })
    ));
    crashed(&d.0);
    let o = reopen(&d.0, false).unwrap();
    assert_eq!(o.table.len().unwrap(), 10);
    assert!(o.persisted.stats().recovery.torn_bytes > 0);
    close(o);
}

#[test]
fn damage_in_an_earlier_segment_is_corrupt_even_at_its_end() {
    let d = TempDir::new();
    let (o, _) = create(&d.0, config());
    put_batch(&o, 0..10, 1);
    close(o);
    let o = reopen(&d.0, false).unwrap();
    put_batch(&o, 10..20, 1);
    close(o);
    let segs = segments(&d.0);
    assert_eq!(segs.len(), 2, "{segs:?}");
    let first = d.join(&segs[0]);
    let bytes = fs::read(&first).unwrap();
    fs::write(&first, &bytes[..bytes.len() - 3]).unwrap();
    assert!(matches!(
        reopen(&d.0, false),
        Err(OpenError::Corrupt { file, .. }) if file == segs[0]
    ));
}

fn dumped_table(d: &TempDir) {
    let (o, _) = create(&d.0, config());
    put_batch(&o, 0..1000, 1);
    dump_and_wait(&o);
    put_batch(&o, 1000..1010, 2);
    close(o);
}

fn dump_and_wait(o: &Open) {
    let before = o.persisted.stats().dumps;
    o.persisted.request_dump(None).unwrap();
    for _ in 0..2000 {
        if o.persisted.stats().dumps > before {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("dump did not finish");
}

#[test]
fn a_dump_folds_the_log_and_reopens_exactly() {
    let d = TempDir::new();
    dumped_table(&d);
    assert!(d.join("snapshot").exists());
    let o = reopen(&d.0, false).unwrap();
    assert_eq!(o.table.len().unwrap(), 1010);
    let s = o.persisted.stats();
    assert_eq!(s.recovery.snapshot_records, 1000);
    assert_eq!(s.recovery.replayed_batches, 1);
    close(o);
}

#[test]
fn truncated_snapshot() {
    let d = TempDir::new();
    dumped_table(&d);
    let snap = d.join("snapshot");
    let bytes = fs::read(&snap).unwrap();
    for cut in [bytes.len() - 1, bytes.len() / 2, HEADER_LEN + 3] {
        fs::write(&snap, &bytes[..cut]).unwrap();
        assert!(
            matches!(reopen(&d.0, false), Err(OpenError::Corrupt { ref file, .. }) if file == "snapshot"),
            "cut at {cut}"
        );
    }
    // Repair keeps the records before the cut and the log after it.
    let o = reopen(&d.0, true).unwrap();
    assert_eq!(o.table.len().unwrap(), 10);
    close(o);
}

#[test]
fn zero_length_files() {
    // A last segment created but never written: cut, not corrupt.
    let d = TempDir::new();
    let (o, _) = create(&d.0, config());
    put_batch(&o, 0..10, 1);
    close(o);
    fs::write(d.join(&segment_name(7)), b"").unwrap();
    let o = reopen(&d.0, false);
    // Segment 7 does not follow segment 1: 2 to 6 are missing.
    assert!(matches!(o, Err(OpenError::Missing(name)) if name == segment_name(2)));
    fs::remove_file(d.join(&segment_name(7))).unwrap();
    fs::write(d.join(&segment_name(2)), b"").unwrap();
    let o = reopen(&d.0, false).unwrap();
    assert_eq!(o.table.len().unwrap(), 10);
    assert!(o.persisted.stats().recovery.torn_bytes == 0);
    // The empty segment was dropped and its number reused.
    let reused = fs::read(d.join(&segment_name(2))).unwrap();
    assert_eq!(parse_header(&reused, FileKind::Log), Ok(2));
    assert!(reused[FIRST_FRAME..].iter().all(|&b| b == 0));
    close(o);
    // A zero-length snapshot or META is damage.
    let d2 = TempDir::new();
    dumped_table(&d2);
    fs::write(d2.join("snapshot"), b"").unwrap();
    assert!(
        matches!(reopen(&d2.0, false), Err(OpenError::Corrupt { file, offset: 0 }) if file == "snapshot")
    );
    fs::write(d2.join("META"), b"").unwrap();
    assert!(matches!(reopen(&d2.0, false), Err(OpenError::Corrupt { file, .. }) if file == "META"));
}

#[test]
fn snapshot_from_newer_version_is_refused() {
    let d = TempDir::new();
    dumped_table(&d);
    let snap = d.join("snapshot");
    let mut bytes = fs::read(&snap).unwrap();
    bytes[8..12].copy_from_slice(&99u32.to_le_bytes());
    let crc = heft_core::crc::crc32c(&bytes[..20]);
    bytes[20..24].copy_from_slice(&crc.to_le_bytes());
    fs::write(&snap, &bytes).unwrap();
    for repair in [false, true] {
        assert!(matches!(
            reopen(&d.0, repair),
            Err(OpenError::Version { file, version: 99 }) if file == "snapshot"
        ));
    }
}

#[test]
fn missing_log() {
    let d = TempDir::new();
    dumped_table(&d);
    for s in segments(&d.0) {
        fs::remove_file(d.join(&s)).unwrap();
    }
    assert!(matches!(
        reopen(&d.0, false),
        Err(OpenError::Missing(name)) if name == segment_name(2)
    ));
    // A gap between segments.
    let d = TempDir::new();
    let (o, _) = create(&d.0, config());
    put(&o, 1, 1);
    close(o);
    for i in 2..4 {
        let o = reopen(&d.0, false).unwrap();
        put(&o, i, 1);
        close(o);
    }
    let segs = segments(&d.0);
    fs::remove_file(d.join(&segs[1])).unwrap();
    match reopen(&d.0, false) {
        Err(OpenError::Missing(file)) => assert_eq!(file, segs[1]),
        other => panic!("{:?}", other.err()),
    }
    let o = reopen(&d.0, true).unwrap();
    assert_eq!(o.table.len().unwrap(), 1);
    close(o);
}

#[test]
fn a_dump_interrupted_at_any_step_leaves_a_loadable_table() {
    // The files a dump leaves at each step: a new segment, a partial
    // snapshot.tmp, the snapshot renamed but old segments not yet removed.
    let d = TempDir::new();
    dumped_table(&d);
    let o = reopen(&d.0, false).unwrap();
    put_batch(&o, 2000..2005, 3);
    let want = contents(&o.table);
    close(o);
    fs::write(d.join("snapshot.tmp"), b"HEFTSNP\ngarbage").unwrap();
    let old = d.join(&segment_name(1));
    fs::write(
        &old,
        heft_core::wal::header(heft_core::wal::FileKind::Log, 1),
    )
    .unwrap();
    let o = reopen(&d.0, false).unwrap();
    assert_eq!(contents(&o.table), want);
    assert!(!d.join("snapshot.tmp").exists());
    assert!(!old.exists(), "a segment the snapshot covers is removed");
    close(o);
}

#[test]
fn concurrent_writers_during_dumps_lose_nothing() {
    let d = TempDir::new();
    let c = Config {
        dump_write_threshold: 3000,
        ..config()
    };
    let (o, _) = create(&d.0, c);
    concurrently(&o, 3, |o, w| {
        for round in 0..40 {
            put_batch(o, w * 1000..w * 1000 + 500, round);
            del(o, w * 1000 + round);
        }
    });
    let want = contents(&o.table);
    // Each round puts the batch back: only the last round's removal stays.
    assert_eq!(want.len(), 3 * 500 - 3);
    assert_eq!(o.persisted.stats().log_records, 3 * 40 * 501);
    close(o);
    let o = reopen(&d.0, false).unwrap();
    assert_eq!(contents(&o.table), want);
    close(o);
}

#[test]
fn rotation_under_concurrent_writers_loses_nothing() {
    // Segments of 8 KiB: writers keep filling them, moving to the spare
    // the flusher made, or making room themselves when it is not there.
    let d = TempDir::new();
    let c = Config {
        segment_bytes: 8192,
        ..config()
    };
    let (o, _) = create(&d.0, c);
    concurrently(&o, 4, |o, w| {
        for i in 0..1500 {
            put(o, w * 10_000 + i, i);
            if i % 7 == 0 {
                del(o, w * 10_000 + i / 2);
            }
        }
    });
    let want = contents(&o.table);
    let st = o.persisted.stats();
    assert!(st.log_segments > 20, "{} segments", st.log_segments);
    close(o);
    // Every segment but the last was cut to its log and sealed.
    let segs = segments(&d.0);
    assert_eq!(segs.len() as u64, st.log_segments);
    for name in &segs {
        assert!(fs::metadata(d.join(name)).unwrap().len() <= 8192, "{name}");
    }
    let o = reopen(&d.0, false).unwrap();
    assert_eq!(contents(&o.table), want);
    assert_eq!(o.persisted.stats().recovery.torn_bytes, 0);
    close(o);
}

#[test]
fn a_frame_ending_exactly_at_a_segments_end_then_rotation() {
    let d = TempDir::new();
    let c = Config {
        segment_bytes: 8192,
        ..config()
    };
    let (o, _) = create(&d.0, c);
    // One record whose frame fills the first segment to the byte: the
    // 24-byte header, the frame, the end frame's reserve.
    let room = 8192 - FIRST_FRAME - END_RESERVE as usize;
    let frame_len = |rec: &[u8]| {
        let mut f = FrameBuf::new();
        f.push(Op::Put(rec));
        f.seal().unwrap().len()
    };
    let uncompressed = |n: usize| {
        let mut x = 7u64;
        let v: Vec<u8> = (0..n)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (x >> 56) as u8
            })
            .collect();
        Value::Tuple(vec![Value::Int(1), Value::Binary(v)]).to_bytes()
    };
    let mut n = room;
    let rec = loop {
        let p = o.table.prepare(&key(1), &uncompressed(n));
        if frame_len(p.bytes()) <= room {
            break p;
        }
        n -= 1;
    };
    assert_eq!(
        frame_len(rec.bytes()),
        room,
        "a frame of exactly {room} bytes"
    );
    write(&o, |t| t.insert(std::slice::from_ref(&rec))).unwrap();
    assert_eq!(o.persisted.stats().log_segments, 1);
    put(&o, 2, 2);
    assert_eq!(
        o.persisted.stats().log_segments,
        2,
        "the next write moved on"
    );
    let want = contents(&o.table);
    close(o);
    // Sealed and cut: the header, the frame, the end frame.
    let sealed = 8192 - END_RESERVE + end_frame(1, 0).len() as u64;
    assert_eq!(
        fs::metadata(d.join(&segment_name(1))).unwrap().len(),
        sealed
    );
    let o = reopen(&d.0, false).unwrap();
    assert_eq!(contents(&o.table), want);
    close(o);
}

#[test]
fn group_commit_shares_fsyncs() {
    let d = TempDir::new();
    let c = Config {
        sync: SyncMode::Commit,
        ..config()
    };
    let (o, probe) = create(&d.0, c);
    let ticket = AtomicU64::new(0);
    std::thread::scope(|s| {
        for w in 0..50i64 {
            let o = &o;
            let ticket = &ticket;
            let probe = &probe;
            s.spawn(move || {
                for i in 0..10 {
                    put(o, w * 100 + i, i);
                    let me = ticket.fetch_add(1, Ordering::Relaxed);
                    if o.persisted.await_durable(me).unwrap().is_none() {
                        while !probe.0.done.lock().unwrap().iter().any(|(t, _)| *t == me) {
                            std::thread::sleep(Duration::from_micros(50));
                        }
                    }
                }
            });
        }
    });
    let s = o.persisted.stats();
    assert!(probe.0.done.lock().unwrap().iter().all(|(_, r)| r.is_ok()));
    assert_eq!(s.commits, 500);
    assert!(
        s.log_fsyncs < 500,
        "{} fsyncs for 500 commits",
        s.log_fsyncs
    );
    close(o);
}

#[test]
fn a_failed_fsync_poisons_the_log() {
    let d = TempDir::new();
    let c = Config {
        sync: SyncMode::Commit,
        ..config()
    };
    let (o, probe) = create(&d.0, c);
    put(&o, 1, 1);
    o.persisted.faults().eio_after.store(1, Ordering::Relaxed);
    if o.persisted.await_durable(7).unwrap().is_none() {
        while probe.0.done.lock().unwrap().is_empty() {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    assert_eq!(
        probe.0.done.lock().unwrap()[0],
        (7, Err(Failure::Io(Some(libc::EIO))))
    );
    let err = o.table.insert(&[o.table.prepare(&key(2), &body(2, 2))]);
    assert!(matches!(err, Err(TableError::Poisoned)));
    assert_eq!(o.table.len().unwrap(), 1, "still readable");
    assert!(o.persisted.stats().poisoned);
    assert_eq!(o.persisted.await_durable(8).err(), Some(Failure::Poisoned));
    o.table.take_storage();
    assert_eq!(o.persisted.close(), Err(Failure::Poisoned));
}

#[test]
fn a_full_disk_fails_the_write_and_changes_nothing() {
    let d = TempDir::new();
    let (o, _) = create(&d.0, config());
    put(&o, 1, 1);
    o.persisted
        .faults()
        .enospc_after
        .store(1, Ordering::Relaxed);
    let err = o.table.insert(&[o.table.prepare(&key(2), &body(2, 2))]);
    match err {
        Err(TableError::Io(e)) => assert_eq!(e.raw_os_error(), Some(libc::ENOSPC)),
        other => panic!("{:?}", other.err()),
    }
    assert_eq!(o.table.len().unwrap(), 1);
    let used = o.table.stats().unwrap().arena_live_bytes;
    put(&o, 3, 3);
    assert!(o.table.stats().unwrap().arena_live_bytes > used);
    close(o);
    let o = reopen(&d.0, false).unwrap();
    assert_eq!(o.table.len().unwrap(), 2);
    assert_eq!(o.persisted.stats().recovery.torn_bytes, 0);
    close(o);
}

#[test]
fn a_second_open_is_locked_and_files_are_private() {
    let d = TempDir::new();
    let (o, _) = create(&d.0, config());
    put(&o, 1, 1);
    assert!(matches!(reopen(&d.0, false), Err(OpenError::Locked)));
    let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&d.0), 0o700);
    for e in fs::read_dir(&d.0).unwrap() {
        let p = e.unwrap().path();
        assert_eq!(mode(&p), 0o600, "{}", p.display());
    }
    close(o);
    let o = reopen(&d.0, false).unwrap();
    close(o);
}

#[test]
fn an_open_waits_for_an_announced_close_and_is_refused_at_once_otherwise() {
    let d = TempDir::new();
    let (o, _) = create(&d.0, config());
    put(&o, 1, 1);
    assert!(matches!(reopen(&d.0, false), Err(OpenError::Locked)));
    // As when its owner dies: announced, then closed by another thread,
    // here most likely once the open below is waiting.
    o.persisted.announce_close();
    let closer = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(20));
        close(o);
    });
    let o = reopen(&d.0, false).unwrap();
    assert_eq!(o.table.len().unwrap(), 1);
    closer.join().unwrap();
    close(o);
}

#[test]
fn write_threshold_triggers_dumps_and_overload_is_reported() {
    let d = TempDir::new();
    let c = Config {
        dump_write_threshold: 100,
        ..config()
    };
    let (o, probe) = create(&d.0, c);
    for i in 0..200 {
        put_batch(&o, i * 100..i * 100 + 100, i);
    }
    o.persisted.request_dump(None).unwrap();
    // The dumper counts a dump, then reports it.
    let dumped = || {
        let events = probe.0.events.lock().unwrap();
        events.iter().any(|e| matches!(e, Event::Dumped(_)))
    };
    for _ in 0..1000 {
        if dumped() {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(dumped());
    assert!(o.persisted.stats().dumps >= 1);
    close(o);
    let o = reopen(&d.0, false).unwrap();
    assert_eq!(o.table.len().unwrap(), 20_000);
    close(o);
}

/// Closes a table with `batches` batches of 10 records written in each of
/// `sessions` opens, and returns the segment names.
fn sessions(d: &TempDir, sessions: i64) -> Vec<String> {
    let (o, _) = create(&d.0, config());
    put_batch(&o, 0..10, 0);
    close(o);
    for n in 1..sessions {
        let o = reopen(&d.0, false).unwrap();
        put_batch(&o, n * 10..n * 10 + 10, n);
        close(o);
    }
    segments(&d.0)
}

#[test]
fn a_spare_segment_and_free_space_left_by_a_crash_end_the_log() {
    // A VM killed while it appends to segment 1 with segment 2 made ahead
    // of time: segment 1 still has its free space (zeros), 2 holds only
    // its header.
    let d = TempDir::new();
    let segs = sessions(&d, 1);
    let first = d.join(&segs[0]);
    let len = fs::metadata(&first).unwrap().len();
    fs::OpenOptions::new()
        .write(true)
        .open(&first)
        .unwrap()
        .set_len(len + 100_000)
        .unwrap();
    let mut spare = heft_core::wal::header(FileKind::Log, 2).to_vec();
    spare.resize(65536, 0);
    fs::write(d.join(&segment_name(2)), &spare).unwrap();
    crashed(&d.0);
    let o = reopen(&d.0, false).unwrap();
    assert_eq!(o.table.len().unwrap(), 10);
    let st = o.persisted.stats();
    assert_eq!(
        (st.recovery.torn_bytes, st.recovery.replayed_batches),
        (0, 1)
    );
    close(o);
    // Segment 1 (sealed when the table closed) was cut back to its log;
    // 2 is the new one.
    assert!(fs::read(&first).unwrap().ends_with(&end_frame(10, 0)));
    assert_eq!(fs::metadata(&first).unwrap().len(), len);
    let o = reopen(&d.0, false).unwrap();
    assert_eq!(o.table.len().unwrap(), 10);
    close(o);
}

#[test]
fn an_unsealed_segment_followed_by_frames_is_corrupt() {
    // A power loss can lose segment 1's last pages (its end frame among
    // them) yet keep segment 2's: a hole in the log, not a torn tail.
    let d = TempDir::new();
    let segs = sessions(&d, 2);
    assert_eq!(segs.len(), 2, "{segs:?}");
    let first = d.join(&segs[0]);
    let sealed = fs::metadata(&first).unwrap().len();
    let unsealed = sealed - end_frame(10, 0).len() as u64;
    fs::OpenOptions::new()
        .write(true)
        .open(&first)
        .unwrap()
        .set_len(unsealed)
        .unwrap();
    match reopen(&d.0, false) {
        Err(OpenError::Corrupt { file, offset }) => {
            assert_eq!((file.as_str(), offset), (segs[0].as_str(), unsealed));
        }
        other => panic!("{:?}", other.err()),
    }
    let o = reopen(&d.0, true).unwrap();
    assert_eq!(o.table.len().unwrap(), 10, "segment 1 kept, 2 set aside");
    assert!(d.join(&format!("lost-{}", segs[1])).exists());
    close(o);
}

#[test]
fn an_end_frame_whose_counts_differ_is_corrupt() {
    let d = TempDir::new();
    let segs = sessions(&d, 2);
    let first = d.join(&segs[0]);
    let bytes = fs::read(&first).unwrap();
    let good = end_frame(10, 0);
    assert!(bytes.ends_with(&good));
    let mut bad = bytes[..bytes.len() - good.len()].to_vec();
    bad.extend_from_slice(&end_frame(11, 0));
    fs::write(&first, &bad).unwrap();
    assert!(matches!(
        reopen(&d.0, false),
        Err(OpenError::Corrupt { file, .. }) if file == segs[0]
    ));
}

#[test]
fn a_vm_killed_in_the_middle_of_an_append_leaves_a_torn_tail() {
    // The frame's header and part of its payload reached the mapping,
    // then the free space: zeros.
    let d = TempDir::new();
    let (o, _) = create(&d.0, config());
    for i in 0..3 {
        put_batch(&o, i * 10..i * 10 + 10, i);
    }
    close(o);
    let seg = d.join(&segments(&d.0)[0]);
    let full = fs::read(&seg).unwrap();
    let mut at = FIRST_FRAME;
    let mut starts = Vec::new();
    while at < full.len() {
        starts.push(at);
        at += 8 + u32::from_le_bytes(full[at..at + 4].try_into().unwrap()) as usize;
    }
    assert_eq!(starts.len(), 4, "three batches and the end frame");
    let last = starts[2];
    let mut bytes = full[..last + (starts[3] - last) / 2].to_vec();
    bytes.resize(1 << 20, 0);
    fs::write(&seg, &bytes).unwrap();
    crashed(&d.0);
    let o = reopen(&d.0, false).unwrap();
    assert_eq!(o.table.len().unwrap(), 20);
    assert_eq!(
        o.persisted.stats().recovery.torn_bytes as usize,
        starts[3] - last,
        "the torn frame's declared extent"
    );
    close(o);
    // Zeros that are not at the end (data after them) are damage.
    let mut bytes = full.clone();
    bytes.resize(full.len() + 4096, 0);
    bytes.extend_from_slice(&full[starts[1]..starts[2]]);
    fs::write(&seg, &bytes).unwrap();
    for s in segments(&d.0).iter().skip(1) {
        fs::remove_file(d.join(s)).unwrap();
    }
    assert!(matches!(
        reopen(&d.0, false),
        Err(OpenError::Corrupt { offset, .. }) if offset as usize == full.len()
    ));
}

// Damage the MANIFEST exists to catch (docs/persistence-format.md,
// "Damage, mode by mode"); the same modes from the VM are in
// test/heft/persist_corruption_test.exs.

/// Puts `key -> {key, atom}` with `atom` interned in the table's
/// dictionary, as the NIF does.
fn put_atom(o: &Open, i: i64, atom: &str) {
    let id = o.table.atoms().write().intern(atom);
    let b = Value::Tuple(vec![Value::Int(i), Value::Atom(id)]).to_bytes();
    write(o, |t| t.insert(&[t.prepare(&key(i), &b)])).unwrap();
}

/// The atom name each record's body names, by key.
fn atom_values(o: &Open) -> Vec<(i64, String)> {
    let atoms = o.table.atoms().read();
    let mut out: Vec<(i64, String)> = contents(&o.table)
        .into_iter()
        .map(|(k, b)| {
            let Ok(Value::Tuple(v)) = decode(&b, Some(&k), &mut ValueBuilder) else {
                panic!("tuple bodies")
            };
            let Value::Int(k) = v[0] else {
                panic!("int keys")
            };
            let Value::Atom(id) = v[1] else {
                panic!("atom values")
            };
            (k, atoms.name(id).expect("a defined atom").to_owned())
        })
        .collect();
    out.sort();
    out
}

#[test]
fn emptied_snapshot_repair_drops_records_naming_lost_atoms() {
    let d = TempDir::new();
    let (o, _) = create(&d.0, config());
    put_atom(&o, 1, "apple");
    dump_and_wait(&o);
    put_atom(&o, 4, "apple"); // logs no atom: the snapshot defined it
    put_atom(&o, 5, "banana"); // logs atom 1 = banana
    close(o);
    fs::write(d.join("snapshot"), b"").unwrap();
    assert!(matches!(
        reopen(&d.0, false),
        Err(OpenError::Corrupt { file, offset: 0 }) if file == "snapshot"
    ));
    let o = reopen(&d.0, true).unwrap();
    let st = o.persisted.stats();
    assert_eq!(st.recovery.records_dropped, 1);
    assert_eq!(st.recovery.dropped.as_ref().unwrap().file, "snapshot");
    assert_eq!(atom_values(&o), vec![(5, "banana".to_owned())]);
    // A new atom never takes the lost id 0.
    put_atom(&o, 6, "zebra");
    assert_ne!(o.table.atoms().write().intern("zebra"), 0);
    close(o);
    let o = reopen(&d.0, false).unwrap();
    assert_eq!(
        atom_values(&o),
        vec![(5, "banana".to_owned()), (6, "zebra".to_owned())]
    );
    close(o);
}

#[test]
fn deleted_last_segment_is_missing() {
    let d = TempDir::new();
    let segs = sessions(&d, 3);
    fs::remove_file(d.join(&segs[2])).unwrap();
    assert!(matches!(reopen(&d.0, false), Err(OpenError::Missing(f)) if f == segs[2]));
    let o = reopen(&d.0, true).unwrap();
    assert_eq!(o.table.len().unwrap(), 20);
    let dropped = o.persisted.stats().recovery.dropped.unwrap();
    assert_eq!(
        (dropped.file.as_str(), dropped.offset),
        (segs[2].as_str(), 0)
    );
    close(o);
    let o = reopen(&d.0, false).unwrap();
    assert_eq!(o.table.len().unwrap(), 20);
    close(o);
}

#[test]
fn truncated_last_segment_of_a_closed_table_is_corrupt() {
    let d = TempDir::new();
    let segs = sessions(&d, 2);
    let last = d.join(&segs[1]);
    let bytes = fs::read(&last).unwrap();
    let unsealed = bytes.len() - end_frame(10, 0).len();
    fs::write(&last, &bytes[..unsealed]).unwrap();
    match reopen(&d.0, false) {
        Err(OpenError::Corrupt { file, offset }) => {
            assert_eq!(
                (file.as_str(), offset as usize),
                (segs[1].as_str(), unsealed)
            )
        }
        other => panic!("{:?}", other.err()),
    }
    // The same cut after a crash is the end of the log.
    crashed(&d.0);
    let o = reopen(&d.0, false).unwrap();
    assert_eq!(o.table.len().unwrap(), 20);
    close(o);
}

#[test]
fn segment_of_another_table_is_corrupt() {
    let a = TempDir::new();
    let b = TempDir::new();
    let segs = sessions(&a, 1);
    sessions(&b, 1);
    fs::copy(b.join(&segs[0]), a.join(&segs[0])).unwrap();
    assert!(matches!(
        reopen(&a.0, false),
        Err(OpenError::Corrupt { file, offset: 0 }) if file == segs[0]
    ));
}

#[test]
fn stale_snapshot_is_corrupt() {
    let d = TempDir::new();
    let (o, _) = create(&d.0, config());
    put_batch(&o, 0..10, 1);
    dump_and_wait(&o);
    let old = fs::read(d.join("snapshot")).unwrap();
    put_batch(&o, 10..20, 1);
    dump_and_wait(&o);
    put_batch(&o, 20..30, 1);
    close(o);
    fs::write(d.join("snapshot"), &old).unwrap();
    assert!(matches!(
        reopen(&d.0, false),
        Err(OpenError::Corrupt { file, offset: 0 }) if file == "snapshot"
    ));
    let o = reopen(&d.0, true).unwrap();
    assert_eq!(contents(&o.table).len(), 10, "the log after the last dump");
    close(o);
}

#[test]
fn missing_manifest_is_refused_and_repaired() {
    let d = TempDir::new();
    sessions(&d, 2);
    fs::remove_file(d.join("MANIFEST")).unwrap();
    assert!(matches!(reopen(&d.0, false), Err(OpenError::Missing(f)) if f == "MANIFEST"));
    let o = reopen(&d.0, true).unwrap();
    assert_eq!(o.table.len().unwrap(), 20);
    assert_eq!(
        o.persisted.stats().recovery.dropped.unwrap().file,
        "MANIFEST"
    );
    close(o);
    let o = reopen(&d.0, false).unwrap();
    assert_eq!(o.table.len().unwrap(), 20);
    close(o);
}

/// Rewrites a version 3 file's header as version 2.
fn as_version_2(path: &Path, drop_start: bool) {
    let mut bytes = fs::read(path).unwrap();
    bytes[8..12].copy_from_slice(&2u32.to_le_bytes());
    let crc = heft_core::crc::crc32c(&bytes[..20]);
    bytes[20..24].copy_from_slice(&crc.to_le_bytes());
    if drop_start {
        bytes.drain(HEADER_LEN..FIRST_FRAME);
    }
    fs::write(path, &bytes).unwrap();
}

#[test]
fn a_version_2_directory_opens_and_is_upgraded() {
    let d = TempDir::new();
    let segs = sessions(&d, 2);
    // What Heft 2 left: no MANIFEST, version 2 headers, no start frames.
    fs::remove_file(d.join("MANIFEST")).unwrap();
    as_version_2(&d.join("META"), false);
    for s in &segs {
        as_version_2(&d.join(s), true);
    }
    let o = reopen(&d.0, false).unwrap();
    assert_eq!(o.table.len().unwrap(), 20);
    assert!(o.persisted.stats().recovery.dropped.is_none());
    put(&o, 100, 1);
    close(o);
    // Upgraded: a MANIFEST, a version 3 META.
    assert!(read_manifest(&d.0).unwrap().is_some());
    let meta = fs::read(d.join("META")).unwrap();
    assert_eq!(u32::from_le_bytes(meta[8..12].try_into().unwrap()), 3);
    let o = reopen(&d.0, false).unwrap();
    assert_eq!(o.table.len().unwrap(), 21);
    close(o);
}
