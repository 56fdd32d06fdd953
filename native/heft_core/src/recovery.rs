//! Opening a table directory: the file names, the META file, loading the
//! snapshot and replaying the log segments after it, cutting a torn tail
//! and refusing (or, asked to, repairing) damage before it. Formats in
//! docs/persistence-format.md.
//!
//! Loading streams: one frame (at most a few hundred KiB for a snapshot,
//! one write batch for a log) is in memory at a time besides the table.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, Read};
use std::path::Path;

use crate::record::Header;
use crate::snapshot::{create_private, sync_dir, SNAPSHOT, SNAPSHOT_TMP};
use crate::table::{Bulk, Error as TableError, Table};
use crate::wal::{self, Damage, FileKind, FrameBuf, FrameError, HeaderError, Op, HEADER_LEN};

/// The stored options of the table (an opaque blob to heft_core).
pub const META: &str = "META";
const META_TMP: &str = "META.tmp";
/// The lock file, flock'ed while the table is open.
pub const LOCK: &str = "LOCK";
const SEGMENT_PREFIX: &str = "wal-";
/// Prefix of files set aside by a repair.
const LOST_PREFIX: &str = "lost-";

/// The file name of log segment `seq`.
pub fn segment_name(seq: u64) -> String {
    format!("{SEGMENT_PREFIX}{seq:020}")
}

fn segment_seq(name: &str) -> Option<u64> {
    let digits = name.strip_prefix(SEGMENT_PREFIX)?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Why a table directory could not be opened.
#[derive(Debug)]
#[non_exhaustive]
pub enum OpenError {
    /// Another open table (in this or another OS process) holds its lock.
    Locked,
    /// I/O failed; `NotFound` when the directory holds no table.
    Io(io::Error),
    /// A file is damaged before its end: `file` (a name in the directory)
    /// at byte `offset`. Opening with `repair` keeps what comes before.
    Corrupt { file: String, offset: u64 },
    /// A file written by a newer format version.
    Version { file: String, version: u32 },
}

impl From<io::Error> for OpenError {
    fn from(e: io::Error) -> Self {
        OpenError::Io(e)
    }
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpenError::Locked => write!(f, "the table is open elsewhere"),
            OpenError::Io(e) => write!(f, "{e}"),
            OpenError::Corrupt { file, offset } => write!(f, "{file} is damaged at byte {offset}"),
            OpenError::Version { file, version } => {
                write!(
                    f,
                    "{file} has format version {version}, newer than this Heft's"
                )
            }
        }
    }
}

impl std::error::Error for OpenError {}

fn corrupt(file: &str, offset: u64) -> OpenError {
    OpenError::Corrupt {
        file: file.to_owned(),
        offset,
    }
}

/// Reads the META file's blob.
pub fn read_meta(dir: &Path) -> Result<Vec<u8>, OpenError> {
    let bytes = fs::read(dir.join(META))?;
    let fail = |offset| corrupt(META, offset);
    match wal::parse_header(&bytes, FileKind::Meta) {
        Ok(_) => {}
        Err(HeaderError::Version(version)) => {
            return Err(OpenError::Version {
                file: META.into(),
                version,
            })
        }
        Err(_) => return Err(fail(0)),
    }
    let body = bytes.get(HEADER_LEN..).unwrap_or_default();
    let mut r = wal::FrameReader::new(body, HEADER_LEN as u64, bytes.len() as u64);
    let blob = match r.next_frame() {
        Ok(Some(p)) => p.to_vec(),
        Ok(None) => return Err(fail(HEADER_LEN as u64)),
        Err(FrameError::Damaged(_, at)) => return Err(fail(at)),
        Err(FrameError::Io(e)) => return Err(e.into()),
    };
    if r.offset() != bytes.len() as u64 {
        return Err(fail(r.offset()));
    }
    Ok(blob)
}

/// Writes the META file atomically (temporary file, fsync, rename, fsync
/// of the directory).
pub fn write_meta(dir: &Path, blob: &[u8]) -> io::Result<()> {
    let mut frame = FrameBuf::new();
    frame.reset();
    let mut bytes = wal::header(FileKind::Meta, 0).to_vec();
    frame.push_raw(blob);
    bytes.extend_from_slice(frame.seal().ok_or(io::ErrorKind::InvalidInput)?);
    let tmp = dir.join(META_TMP);
    let f = create_private(&tmp)?;
    io::Write::write_all(&mut &f, &bytes)?;
    f.sync_all()?;
    fs::rename(&tmp, dir.join(META))?;
    sync_dir(dir)
}

/// Creates log segment `seq` (header only), fsyncs it and the directory.
pub fn create_segment(dir: &Path, seq: u64) -> io::Result<File> {
    let path = dir.join(segment_name(seq));
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode_private()
        .open(&path)?;
    io::Write::write_all(&mut &f, &wal::header(FileKind::Log, seq))?;
    f.sync_all()?;
    sync_dir(dir)?;
    Ok(f)
}

trait PrivateMode {
    fn mode_private(&mut self) -> &mut Self;
}

impl PrivateMode for OpenOptions {
    fn mode_private(&mut self) -> &mut Self {
        std::os::unix::fs::OpenOptionsExt::mode(self, 0o600)
    }
}

/// What was dropped by a repair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dropped {
    /// The damaged file.
    pub file: String,
    /// Where the damage starts.
    pub offset: u64,
    /// Bytes set aside from there on, this file's and later segments'.
    pub bytes: u64,
}

/// What opening found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Records loaded from the snapshot.
    pub snapshot_records: u64,
    /// Log frames (write batches) replayed.
    pub replayed_batches: u64,
    /// Log operations replayed.
    pub replayed_ops: u64,
    /// Bytes of torn tail cut from the last log segment.
    pub torn_bytes: u64,
    /// What a repair set aside (files named `lost-...` in the directory).
    pub dropped: Option<Dropped>,
    /// The sequence number for the segment the table appends to next.
    pub next_seq: u64,
    /// Segments replayed (they hold the log since the snapshot).
    pub segments: Vec<u64>,
}

/// Loads the snapshot and replays the log into the empty `table`.
/// `fresh`: the table was just created (its META just written), so having
/// no log segment yet is expected.
pub fn recover(
    dir: &Path,
    table: &Table,
    repair: bool,
    fresh: bool,
) -> Result<Recovery, OpenError> {
    let mut segments = BTreeMap::new();
    let mut has_snapshot = false;
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(seq) = segment_seq(name) {
            segments.insert(seq, ());
        } else if name == SNAPSHOT {
            has_snapshot = true;
        } else if name == SNAPSHOT_TMP || name == META_TMP {
            fs::remove_file(entry.path())?;
        }
    }
    let mut rec = Recovery::default();
    let mut applier = Applier::new(table);
    // The first segment the log must start with.
    let mut first = 1;
    let mut snapshot_clean = false;
    if has_snapshot {
        match load_snapshot(dir, &mut applier) {
            Ok((seq, records)) => {
                first = seq;
                rec.snapshot_records = records;
                snapshot_clean = true;
            }
            Err(Load::Failed(e)) => return Err(e),
            Err(Load::Damaged { offset, seq, len }) if repair => {
                rec.dropped = Some(Dropped {
                    file: SNAPSHOT.into(),
                    offset,
                    bytes: len.saturating_sub(offset),
                });
                first = seq.unwrap_or_else(|| segments.keys().next().copied().unwrap_or(1));
            }
            Err(Load::Damaged { offset, .. }) => return Err(corrupt(SNAPSHOT, offset)),
        }
    }
    // Segments the snapshot covers are left over from a dump that stopped
    // after renaming its snapshot.
    let covered: Vec<u64> = segments.range(..first).map(|(s, _)| *s).collect();
    for seq in covered {
        segments.remove(&seq);
        if snapshot_clean {
            fs::remove_file(dir.join(segment_name(seq)))?;
        }
    }
    let seqs: Vec<u64> = segments.keys().copied().collect();
    if seqs.is_empty() && !repair && !fresh {
        // A table always has a log segment to replay from (docs).
        return Err(corrupt(&segment_name(first), 0));
    }
    // The segment to append to next, and what a repair sets aside.
    let mut next = first;
    let mut aside: Option<(usize, u64)> = None;
    for (i, &seq) in seqs.iter().enumerate() {
        let name = segment_name(seq);
        if seq != next {
            // A missing segment: what follows it cannot be replayed.
            let missing = segment_name(next);
            if !repair {
                return Err(corrupt(&missing, 0));
            }
            rec.dropped.get_or_insert(Dropped {
                file: missing,
                offset: 0,
                bytes: 0,
            });
            aside = Some((i, 0));
            break;
        }
        let last = i + 1 == seqs.len();
        match replay_segment(dir, &name, seq, &mut applier, &mut rec) {
            Ok(()) => {
                rec.segments.push(seq);
                next = seq + 1;
            }
            Err(Load::Failed(e)) => return Err(e),
            Err(Load::Damaged { offset, len, .. }) => {
                if last && applier.last_damage == Some(Damage::Torn) {
                    // A torn tail: cut it (or drop a segment whose header
                    // was never written whole), keep the rest.
                    rec.torn_bytes += len - offset;
                    if offset == 0 {
                        fs::remove_file(dir.join(&name))?;
                        next = seq;
                    } else {
                        let f = OpenOptions::new().write(true).open(dir.join(&name))?;
                        f.set_len(offset)?;
                        f.sync_all()?;
                        rec.segments.push(seq);
                        next = seq + 1;
                    }
                    break;
                }
                if !repair {
                    return Err(corrupt(&name, offset));
                }
                rec.dropped.get_or_insert(Dropped {
                    file: name.clone(),
                    offset,
                    bytes: 0,
                });
                aside = Some((i, offset));
                if offset > 0 {
                    rec.segments.push(seq);
                    next = seq + 1;
                } else {
                    next = seq;
                }
                break;
            }
        }
    }
    if let Some((i, offset)) = aside {
        let moved = set_aside(dir, &seqs[i..], offset)?;
        if let Some(d) = rec.dropped.as_mut() {
            d.bytes += moved;
        }
    }
    applier.flush().map_err(|e| match e {
        Apply::Table(e) => e,
        Apply::Bad => corrupt(SNAPSHOT, 0),
    })?;
    rec.next_seq = next;
    Ok(rec)
}

/// Moves the damaged tail of `seqs[0]` from `offset` (the whole file when
/// 0) and all of `seqs[1..]` aside as `lost-...` files; returns the bytes
/// moved.
fn set_aside(dir: &Path, seqs: &[u64], offset: u64) -> io::Result<u64> {
    let mut moved = 0;
    for (i, seq) in seqs.iter().enumerate() {
        let name = segment_name(*seq);
        let path = dir.join(&name);
        let lost = dir.join(format!("{LOST_PREFIX}{name}"));
        if i == 0 && offset > 0 {
            let bytes = fs::read(&path)?;
            let tail = bytes.get(offset as usize..).unwrap_or_default();
            let f = create_private(&lost)?;
            io::Write::write_all(&mut &f, tail)?;
            f.sync_all()?;
            let keep = OpenOptions::new().write(true).open(&path)?;
            keep.set_len(offset)?;
            keep.sync_all()?;
            moved += tail.len() as u64;
        } else {
            moved += fs::metadata(&path)?.len();
            fs::rename(&path, &lost)?;
        }
    }
    sync_dir(dir)?;
    Ok(moved)
}

/// Why a file stopped loading.
enum Load {
    /// Damage at `offset` of a file of `len` bytes; `seq` from its header
    /// when that was readable.
    Damaged {
        offset: u64,
        seq: Option<u64>,
        len: u64,
    },
    Failed(OpenError),
}

impl From<io::Error> for Load {
    fn from(e: io::Error) -> Self {
        Load::Failed(e.into())
    }
}

fn open_file(path: &Path, kind: FileKind, name: &str) -> Result<(u64, u64, BufReader<File>), Load> {
    let f = File::open(path)?;
    let len = f.metadata()?.len();
    let mut r = BufReader::with_capacity(1 << 20, f);
    let mut h = [0u8; HEADER_LEN];
    let got = read_up_to(&mut r, &mut h)?;
    match wal::parse_header(&h[..got], kind) {
        Ok(seq) => Ok((seq, len, r)),
        Err(HeaderError::Version(version)) => Err(Load::Failed(OpenError::Version {
            file: name.to_owned(),
            version,
        })),
        Err(_) => Err(Load::Damaged {
            offset: 0,
            seq: None,
            len,
        }),
    }
}

fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// Loads `dir/snapshot`; returns the segment to replay from and the number
/// of records.
fn load_snapshot(dir: &Path, applier: &mut Applier) -> Result<(u64, u64), Load> {
    let (seq, len, r) = open_file(&dir.join(SNAPSHOT), FileKind::Snapshot, SNAPSHOT)?;
    let mut frames = wal::FrameReader::new(r, HEADER_LEN as u64, len);
    let damaged = |offset| Load::Damaged {
        offset,
        seq: Some(seq),
        len,
    };
    let mut puts = 0u64;
    let mut atoms = 0u64;
    loop {
        let at = frames.offset();
        let payload = match frames.next_frame() {
            Ok(Some(p)) => p,
            // No end marker: the snapshot is cut short.
            Ok(None) => return Err(damaged(at)),
            Err(FrameError::Damaged(_, at)) => return Err(damaged(at)),
            Err(FrameError::Io(e)) => return Err(e.into()),
        };
        let applied = applier.apply(payload, true).map_err(|e| match e {
            Apply::Bad => damaged(at),
            Apply::Table(e) => Load::Failed(e),
        })?;
        puts += applied.puts;
        atoms += applied.atoms;
        if let Some((records, n_atoms)) = applied.end {
            if records != puts || n_atoms != atoms || frames.offset() != len {
                return Err(damaged(at));
            }
            return Ok((seq, puts));
        }
    }
}

fn replay_segment(
    dir: &Path,
    name: &str,
    seq: u64,
    applier: &mut Applier,
    rec: &mut Recovery,
) -> Result<(), Load> {
    applier.last_damage = None;
    let (found, len, r) = match open_file(&dir.join(name), FileKind::Log, name) {
        Err(Load::Damaged { offset, seq, len }) => {
            // A header shorter than its size, or all zeros: a segment
            // created by a crash-interrupted rotation.
            let all_zero = fs::read(dir.join(name))?.iter().all(|&b| b == 0);
            if len < HEADER_LEN as u64 || all_zero {
                applier.last_damage = Some(Damage::Torn);
            }
            return Err(Load::Damaged { offset, seq, len });
        }
        other => other?,
    };
    if found != seq {
        return Err(Load::Damaged {
            offset: 0,
            seq: Some(found),
            len,
        });
    }
    let mut frames = wal::FrameReader::new(r, HEADER_LEN as u64, len);
    loop {
        let at = frames.offset();
        let payload = match frames.next_frame() {
            Ok(Some(p)) => p,
            Ok(None) => return Ok(()),
            Err(FrameError::Damaged(kind, at)) => {
                applier.last_damage = Some(kind);
                return Err(Load::Damaged {
                    offset: at,
                    seq: Some(seq),
                    len,
                });
            }
            Err(FrameError::Io(e)) => return Err(e.into()),
        };
        let applied = applier.apply(payload, false).map_err(|e| match e {
            Apply::Bad => {
                applier.last_damage = Some(Damage::Corrupt);
                Load::Damaged {
                    offset: at,
                    seq: Some(seq),
                    len,
                }
            }
            Apply::Table(e) => Load::Failed(e),
        })?;
        rec.replayed_batches += 1;
        rec.replayed_ops += applied.puts + applied.deletes + applied.clears;
    }
}

/// What one frame held.
#[derive(Default)]
struct Applied {
    puts: u64,
    deletes: u64,
    clears: u64,
    atoms: u64,
    end: Option<(u64, u64)>,
}

enum Apply {
    /// The payload does not parse or names inconsistent atoms.
    Bad,
    Table(OpenError),
}

/// Applies frames to a table; a frame is checked whole before any of it is
/// applied, so a batch is applied entirely or not at all.
struct Applier<'t> {
    table: &'t Table,
    /// Puts placed but not yet indexed: the index is built once at the end
    /// (or before a delete or clear), not record by record.
    bulk: Bulk,
    last_damage: Option<Damage>,
}

impl<'t> Applier<'t> {
    fn new(table: &'t Table) -> Self {
        Applier {
            table,
            bulk: Bulk::default(),
            last_damage: None,
        }
    }

    fn apply(&mut self, payload: &[u8], snapshot: bool) -> Result<Applied, Apply> {
        // Check first.
        let mut saw_end = false;
        for op in wal::ops(payload) {
            let op = op.map_err(|_| Apply::Bad)?;
            if saw_end {
                return Err(Apply::Bad); // the end marker must be last
            }
            match op {
                Op::Put(bytes) => {
                    let h = Header::parse(bytes).map_err(|_| Apply::Bad)?;
                    if h.total_len() != bytes.len() {
                        return Err(Apply::Bad);
                    }
                }
                Op::Atom { name, .. } if std::str::from_utf8(name).is_err() => {
                    return Err(Apply::Bad)
                }
                Op::End { .. } if !snapshot => return Err(Apply::Bad),
                Op::End { .. } => saw_end = true,
                Op::Clear if snapshot => return Err(Apply::Bad),
                Op::Delete(_) if snapshot => return Err(Apply::Bad),
                _ => {}
            }
        }
        // Then apply.
        let mut a = Applied::default();
        let mut puts: Vec<&[u8]> = Vec::new();
        for op in wal::ops(payload).flatten() {
            match op {
                Op::Atom { id, name } => {
                    self.atom(id, name)?;
                    a.atoms += 1;
                }
                Op::Put(bytes) => {
                    puts.push(bytes);
                    a.puts += 1;
                }
                Op::Delete(key) => {
                    self.place(&mut puts)?;
                    self.flush()?;
                    let h = self.table.hash(key);
                    self.table.remove(h, key, None).map_err(table_err)?;
                    a.deletes += 1;
                }
                Op::Clear => {
                    self.place(&mut puts)?;
                    self.flush()?;
                    self.table.clear().map_err(table_err)?;
                    a.clears += 1;
                }
                Op::End { records, atoms } => a.end = Some((records, atoms)),
            }
        }
        self.place(&mut puts)?;
        Ok(a)
    }

    fn place(&mut self, puts: &mut Vec<&[u8]>) -> Result<(), Apply> {
        if !puts.is_empty() {
            self.table
                .bulk_put(puts, &mut self.bulk)
                .map_err(table_err)?;
            puts.clear();
        }
        Ok(())
    }

    fn atom(&mut self, id: u64, name: &[u8]) -> Result<(), Apply> {
        let name = std::str::from_utf8(name).map_err(|_| Apply::Bad)?;
        let mut atoms = self.table.atoms().write();
        let len = atoms.len() as u64;
        if id < len {
            // Already known (a snapshot and the log after it may both name
            // it): it must be the same atom.
            let same = u32::try_from(id).ok().and_then(|i| atoms.name(i)) == Some(name);
            return if same { Ok(()) } else { Err(Apply::Bad) };
        }
        if id > len || u32::try_from(id).is_err() {
            return Err(Apply::Bad);
        }
        if u64::from(atoms.intern(name)) != id {
            return Err(Apply::Bad); // the name had another id
        }
        Ok(())
    }

    /// Indexes the puts placed so far.
    fn flush(&mut self) -> Result<(), Apply> {
        if self.bulk.is_empty() {
            return Ok(());
        }
        self.table.bulk_finish(&mut self.bulk).map_err(table_err)
    }
}

fn table_err(e: TableError) -> Apply {
    match e {
        TableError::Io(e) => Apply::Table(OpenError::Io(e)),
        other => Apply::Table(OpenError::Io(io::Error::other(other.to_string()))),
    }
}

/// Removes every file a table keeps in `dir` (the directory itself stays).
pub fn remove_table_files(dir: &Path) -> io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let ours = segment_seq(name).is_some()
            || name.starts_with(LOST_PREFIX)
            || [SNAPSHOT, SNAPSHOT_TMP, META, META_TMP, LOCK].contains(&name);
        if ours {
            fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}
