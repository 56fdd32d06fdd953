//! Opening a table directory: the file names, the META file, loading the
//! snapshot and replaying the log segments after it, cutting a torn tail
//! and refusing (or, asked to, repairing) damage before it. Formats in
//! docs/persistence-format.md.
//!
//! Loading streams: a log is replayed one frame (one write batch) at a
//! time; a snapshot is read by a helper thread at most ten frames (a few
//! MiB) ahead of the thread that places its records (`load_snapshot`).

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, BufReader, Read};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::Path;
use std::sync::mpsc;

use crate::files;
use crate::hash::KeyedHash;
use crate::record::Header;
use crate::snapshot::{sync_dir, SNAPSHOT};
use crate::table::{Bulk, Error as TableError, Table};
use crate::wal::{
    self, Damage, FileKind, FrameBuf, FrameError, HeaderError, Op, TableId, HEADER_LEN,
};

/// The stored options of the table (an opaque blob to heft_core).
pub const META: &str = "META";
/// What must exist in the directory (docs/persistence-format.md).
pub const MANIFEST: &str = "MANIFEST";
/// The lock file, write-locked (`fcntl(F_SETLK)`) while the table is open.
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
    /// A file the table needs is not there: a log segment the manifest or
    /// the snapshot names, the snapshot the manifest names, or the
    /// MANIFEST of a table that holds data.
    Missing(String),
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
            OpenError::Missing(file) => write!(f, "{file} is missing"),
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
    read_single(dir, META, FileKind::Meta).map(|(blob, _)| blob)
}

/// Reads the META file's blob and its header's format version.
pub fn read_meta_version(dir: &Path) -> Result<(Vec<u8>, u32), OpenError> {
    read_single(dir, META, FileKind::Meta)
}

/// Reads a file of a header and one frame (META, MANIFEST): the payload
/// and the header's version.
fn read_single(dir: &Path, name: &str, kind: FileKind) -> Result<(Vec<u8>, u32), OpenError> {
    let bytes = files::read(&dir.join(name))?;
    let fail = |offset| corrupt(name, offset);
    let version = match wal::parse_header_version(&bytes, kind) {
        Ok((_, version)) => version,
        Err(HeaderError::Version(version)) => {
            return Err(OpenError::Version {
                file: name.into(),
                version,
            })
        }
        Err(_) => return Err(fail(0)),
    };
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
    Ok((blob, version))
}

/// Writes a file of a header and one frame atomically (temporary file,
/// fsync, rename, fsync of the directory).
fn write_single(dir: &Path, name: &str, kind: FileKind, blob: &[u8]) -> io::Result<()> {
    files::write_atomic(&dir.join(name), &single(kind, blob)?, true)
}

/// A file of a header and one frame holding `blob`.
fn single(kind: FileKind, blob: &[u8]) -> io::Result<Vec<u8>> {
    let mut frame = FrameBuf::new();
    let mut bytes = wal::header(kind, 0).to_vec();
    frame.push_raw(blob);
    bytes.extend_from_slice(frame.seal().ok_or(io::ErrorKind::InvalidInput)?);
    Ok(bytes)
}

/// What must exist in a table's directory: the MANIFEST (see
/// docs/persistence-format.md).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    /// The table's identity, in every segment's and snapshot's start frame.
    pub id: TableId,
    /// The first segment of the log (the snapshot's, or 1).
    pub first: u64,
    /// The last segment that must exist.
    pub last: u64,
    /// A snapshot must exist.
    pub snapshot: bool,
    /// The table was closed: `last` ends the log, sealed.
    pub clean: bool,
}

const MANIFEST_SNAPSHOT: u8 = 1;
const MANIFEST_CLEAN: u8 = 2;

impl Manifest {
    fn encode(&self) -> Vec<u8> {
        let mut out = self.id.to_vec();
        crate::codec::put_varint(&mut out, self.first);
        crate::codec::put_varint(&mut out, self.last);
        let flags = if self.snapshot { MANIFEST_SNAPSHOT } else { 0 }
            | if self.clean { MANIFEST_CLEAN } else { 0 };
        out.push(flags);
        out
    }

    fn decode(bytes: &[u8]) -> Option<Manifest> {
        let mut r = crate::codec::Reader::new(bytes);
        let mut id = TableId::default();
        id.copy_from_slice(r.bytes(16).ok()?);
        let first = r.varint().ok()?;
        let last = r.varint().ok()?;
        let flags = r.u8().ok()?;
        let sound = r.remaining() == 0
            && flags & !(MANIFEST_SNAPSHOT | MANIFEST_CLEAN) == 0
            && first >= 1
            && last + 1 >= first;
        sound.then_some(Manifest {
            id,
            first,
            last,
            snapshot: flags & MANIFEST_SNAPSHOT != 0,
            clean: flags & MANIFEST_CLEAN != 0,
        })
    }
}

/// Reads the MANIFEST: `None` if there is none.
pub fn read_manifest(dir: &Path) -> Result<Option<Manifest>, OpenError> {
    match read_single(dir, MANIFEST, FileKind::Manifest) {
        Ok((blob, _)) => Manifest::decode(&blob)
            .map(Some)
            .ok_or_else(|| corrupt(MANIFEST, HEADER_LEN as u64)),
        Err(OpenError::Io(e)) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Writes the MANIFEST atomically.
///
/// On a full disk the file is written into `MANIFEST.reserve`, space kept
/// allocated for that: a log that has moved on to its next segment must
/// be able to name it, or its writes could never be made durable. After
/// the rename the reserve is made again (from the space the old MANIFEST
/// gave back); without one, the MANIFEST is written to a new temporary
/// file.
pub fn write_manifest(dir: &Path, m: &Manifest) -> io::Result<()> {
    let bytes = single(FileKind::Manifest, &m.encode())?;
    let reserve = dir.join(MANIFEST_RESERVE);
    match files::open_rw(&reserve) {
        Ok(f) if bytes.len() as u64 <= RESERVE_BYTES => {
            // The reserve is not the MANIFEST until the rename: a crash
            // before it leaves the old MANIFEST whole.
            f.write_all_at(&bytes, 0)?;
            f.set_len(bytes.len() as u64)?;
            files::sync_all(&f)?;
            drop(f);
            fs::rename(&reserve, dir.join(MANIFEST))?;
            files::sync_dir(dir)?;
        }
        Ok(_) => files::write_atomic(&dir.join(MANIFEST), &bytes, true)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            files::write_atomic(&dir.join(MANIFEST), &bytes, true)?
        }
        Err(e) => return Err(e),
    }
    // Best effort: a disk too full for it now is tried again next time.
    let _ = make_reserve(&reserve);
    Ok(())
}

/// The file kept allocated for the next MANIFEST (see [`write_manifest`]).
pub const MANIFEST_RESERVE: &str = "MANIFEST.reserve";

/// Its size: a page, more than a MANIFEST needs.
const RESERVE_BYTES: u64 = 4096;

fn make_reserve(path: &Path) -> io::Result<()> {
    let f = match files::create_new(path, files::FILE_MODE) {
        Ok(f) => f,
        // (A crash between cutting it and the rename left it short.)
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => files::open_rw(path)?,
        Err(e) => return Err(e),
    };
    let made = f
        .set_permissions(fs::Permissions::from_mode(files::FILE_MODE))
        .and_then(|()| crate::arena::allocate(&f, 0, RESERVE_BYTES));
    if made.is_err() {
        let _ = fs::remove_file(path);
    }
    made
}

/// True for a temporary file Heft makes in a table directory (left over
/// by a crash: removed at open).
fn is_temporary(name: &str) -> bool {
    [SNAPSHOT, META, HASH_KEY, MANIFEST].iter().any(|base| {
        name.starts_with(&files::temp_prefix(base)) || name.strip_suffix(".tmp") == Some(base)
        // version 2's names
    })
}

/// Writes the META file atomically (temporary file, fsync, rename, fsync
/// of the directory).
pub fn write_meta(dir: &Path, blob: &[u8]) -> io::Result<()> {
    write_single(dir, META, FileKind::Meta, blob)
}

/// The table's hash key: `"HEFTHKEY"`, two little-endian u64 halves, the
/// CRC-32C of those 24 bytes (little-endian u32). See
/// docs/persistence-format.md.
pub const HASH_KEY: &str = "HASHKEY";
const HASH_KEY_MAGIC: &[u8; 8] = b"HEFTHKEY";

/// The hash key stored in `dir`, if there is a sound one.
pub fn read_hash_key(dir: &Path) -> Option<KeyedHash> {
    let bytes = files::read(&dir.join(HASH_KEY)).ok()?;
    let (body, crc) = bytes.split_at_checked(24)?;
    let crc = u32::from_le_bytes(crc.try_into().ok()?);
    if !body.starts_with(HASH_KEY_MAGIC) || crate::crc::crc32c(body) != crc {
        return None;
    }
    let half = |at: usize| u64::from_le_bytes(body[at..at + 8].try_into().unwrap_or_default());
    Some(KeyedHash::from_key([half(8), half(16)]))
}

/// Stores `hash`'s key in `dir` (temporary file, rename). Not synced: the
/// key only saves work when reopening, and a file that a crash damaged is
/// ignored (and replaced) by the next open.
pub fn write_hash_key(dir: &Path, hash: &KeyedHash) -> io::Result<()> {
    let [a, b] = hash.key();
    let mut bytes = HASH_KEY_MAGIC.to_vec();
    bytes.extend_from_slice(&a.to_le_bytes());
    bytes.extend_from_slice(&b.to_le_bytes());
    let crc = crate::crc::crc32c(&bytes);
    bytes.extend_from_slice(&crc.to_le_bytes());
    files::write_atomic(&dir.join(HASH_KEY), &bytes, false)
}

/// What was dropped by a repair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dropped {
    /// The damaged file.
    pub file: String,
    /// Where the damage starts.
    pub offset: u64,
    /// Bytes set aside or lost from there on, this file's and later
    /// segments'.
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
    /// Records a repair did not load because they name atoms whose
    /// definitions were lost with a damaged or missing snapshot (they
    /// could not be decoded correctly).
    pub records_dropped: u64,
    /// A sound snapshot was loaded.
    pub snapshot: bool,
    /// The table's identity.
    pub id: TableId,
}

impl Recovery {
    /// Reports damage found by a repair: the first damage is the one
    /// named, the bytes add up.
    fn note(&mut self, file: &str, offset: u64, bytes: u64) {
        match self.dropped.as_mut() {
            Some(d) => d.bytes += bytes,
            None => {
                self.dropped = Some(Dropped {
                    file: file.to_owned(),
                    offset,
                    bytes,
                })
            }
        }
    }
}

/// Loads the snapshot and replays the log into the empty `table`.
/// `fresh`: the table was just created (its META just written), so having
/// no log segment yet is expected. `meta_version`: the version of the
/// META file found; a version 3 table must have a MANIFEST.
pub fn recover(
    dir: &Path,
    table: &Table,
    repair: bool,
    fresh: bool,
    meta_version: u32,
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
        } else if is_temporary(name) {
            fs::remove_file(entry.path())?;
        }
    }
    let mut rec = Recovery::default();
    let manifest = match read_manifest(dir) {
        Ok(m) => m,
        Err(OpenError::Corrupt { file, offset }) if repair => {
            let len = fs::symlink_metadata(dir.join(&file)).map_or(0, |m| m.len());
            rec.note(&file, offset, len.saturating_sub(offset));
            None
        }
        Err(e) => return Err(e),
    };
    // A table created (its META was missing) where a deleted one left its
    // MANIFEST and nothing else (a removal of the directory that raced
    // the old table's close, which rewrote its MANIFEST): that MANIFEST
    // names segments that are gone, and there is nothing to replay.
    let manifest = manifest.filter(|_| !(fresh && segments.is_empty() && !has_snapshot));
    if manifest.is_none() && rec.dropped.is_none() && meta_version >= 3 && !fresh {
        // A version 3 table writes its MANIFEST before anything else: only
        // one that never held data (a crash while it was created) may
        // lack it.
        let mut holds_data = has_snapshot;
        for &seq in segments.keys() {
            holds_data = holds_data || !unused_segment(dir, seq)?;
        }
        if holds_data {
            if !repair {
                return Err(OpenError::Missing(MANIFEST.into()));
            }
            rec.note(MANIFEST, 0, 0);
        }
    }
    let mut expect = Expect {
        id: manifest.as_ref().map(|m| m.id),
    };
    let mut applier = Applier::new(table);
    // The first segment the log must start with.
    let mut first = manifest.as_ref().map_or(1, |m| m.first);
    let mut snapshot_clean = false;
    if has_snapshot {
        let len = fs::symlink_metadata(dir.join(SNAPSHOT))?.len();
        let seq = snapshot_seq(dir)?;
        // A snapshot older than the log the manifest names (a stale copy:
        // the segments it needs were removed) or newer than its end.
        let fits = match (&manifest, seq) {
            (Some(m), Some(s)) => s >= m.first && s <= m.last + 1,
            _ => true,
        };
        let limit = if repair {
            // Repair reads the snapshot twice: first to find where it is
            // damaged and how many of its atoms come before that, then to
            // load what precedes the damage, keeping only the records
            // whose atoms all survived.
            prescan_snapshot(dir, table, &mut expect)?
        } else {
            None
        };
        if !fits {
            if !repair {
                return Err(corrupt(SNAPSHOT, 0));
            }
            rec.note(SNAPSHOT, 0, len);
            applier.lossy = Some(Defined::default());
        } else {
            applier.lossy = limit.map(|atoms| Defined {
                limit: atoms,
                holes: Vec::new(),
            });
            match load_snapshot(dir, &mut applier, &mut expect) {
                Ok((seq, records)) => {
                    first = seq;
                    rec.snapshot_records = records;
                    snapshot_clean = true;
                    applier.lossy = None;
                }
                Err(Load::Failed(e)) => return Err(e),
                Err(Load::Damaged { offset, seq, len }) if repair => {
                    rec.note(SNAPSHOT, offset, len.saturating_sub(offset));
                    if manifest.is_none() {
                        first = seq.unwrap_or_else(|| segments.keys().next().copied().unwrap_or(1));
                    }
                    // Atoms defined only in the lost part are lost: the
                    // dictionary is what was read before the damage.
                    applier.lossy = Some(Defined {
                        limit: table.atoms().read().len() as u64,
                        holes: Vec::new(),
                    });
                }
                Err(Load::Damaged { offset, .. }) => return Err(corrupt(SNAPSHOT, offset)),
            }
        }
    } else if manifest.as_ref().is_some_and(|m| m.snapshot) {
        if !repair {
            return Err(OpenError::Missing(SNAPSHOT.into()));
        }
        rec.note(SNAPSHOT, 0, 0);
        applier.lossy = Some(Defined::default());
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
    let mut seqs: Vec<u64> = segments.keys().copied().collect();
    // The last segment that must exist, and whether it must end the log
    // sealed (the table was closed).
    let (must, clean) = manifest.as_ref().map_or((0, false), |m| (m.last, m.clean));
    // After a crash, the segments from the manifest's last one on may have
    // lost pages that were never synced (every segment below it was
    // synced whole, end frame included, before the manifest named a later
    // one): missing bytes there are unacknowledged writes, cut as a torn
    // tail with everything after them.
    let unsynced = |seq: u64| manifest.as_ref().is_some_and(|m| !m.clean && seq >= m.last);
    // Segments made ahead of time and never written to, last in the log
    // (a crash left them): removed, their numbers reused.
    while let [.., before, last] = seqs[..] {
        if last != before + 1 || last <= must || !unused_segment(dir, last)? {
            break;
        }
        fs::remove_file(dir.join(segment_name(last)))?;
        seqs.pop();
    }
    if let ([last], true) = (&seqs[..], manifest.is_some()) {
        if *last > must && unused_segment(dir, *last)? {
            fs::remove_file(dir.join(segment_name(*last)))?;
            seqs.pop();
        }
    }
    if seqs.is_empty() && !repair && !fresh && (manifest.is_none() || must >= first) {
        // A table always has a log segment to replay from (docs).
        return Err(OpenError::Missing(segment_name(first)));
    }
    // The segment to append to next, what a repair sets aside, and the
    // last segment kept.
    let mut next = first;
    let mut aside: Option<(usize, u64)> = None;
    let mut tail: Option<Tail> = None;
    for (i, &seq) in seqs.iter().enumerate() {
        let name = segment_name(seq);
        if seq != next {
            // A missing segment: what follows it cannot be replayed.
            let missing = segment_name(next);
            if !repair {
                return Err(OpenError::Missing(missing));
            }
            rec.note(&missing, 0, 0);
            aside = Some((i, 0));
            break;
        }
        if clean && seq > must {
            // After a clean close nothing follows the last segment.
            if !repair {
                return Err(corrupt(&name, 0));
            }
            rec.note(&name, 0, 0);
            aside = Some((i, 0));
            break;
        }
        let last = i + 1 == seqs.len();
        match replay_segment(dir, &name, seq, &mut applier, &mut rec, &mut expect) {
            Ok(r) => {
                rec.segments.push(seq);
                next = seq + 1;
                tail = Some(Tail {
                    seq,
                    end: r.end,
                    records: applier.seg_records,
                    atoms: applier.seg_atoms,
                    dicts: applier.seg_dicts,
                    sealed: r.sealed,
                });
                if clean && seq == must && !(r.sealed && r.end == r.len) {
                    // Closed cleanly, yet its end frame is gone: cut.
                    if !repair {
                        return Err(corrupt(&name, r.end));
                    }
                    rec.note(&name, r.end, r.len.saturating_sub(r.end));
                    aside = Some((i + 1, 0));
                    break;
                }
                if r.sealed && !last && r.end < r.len {
                    // Sealed, but a crash came before it was cut to its log.
                    let f = files::open_rw(&dir.join(&name))?;
                    f.set_len(r.end)?;
                    files::sync_all(&f)?;
                }
                if last || r.sealed || r.version < 2 || seqs[i + 1] != seq + 1 {
                    continue; // (a gap after it is reported as missing)
                }
                // Not sealed, yet a later segment holds frames: this one's
                // end was lost (a power loss) while later ones survived.
                if unsynced(seq) && r.end < r.len {
                    // Its end frame is zeros, never written back: the
                    // later segments hold writes made after it, unsynced.
                    rec.torn_bytes += cut_segments(dir, &seqs[i + 1..])?;
                    break;
                }
                if !repair {
                    return Err(corrupt(&name, r.end));
                }
                rec.note(&name, r.end, 0);
                aside = Some((i + 1, 0));
                break;
            }
            Err(Load::Failed(e)) => return Err(e),
            Err(Load::Damaged { offset, len, .. }) => {
                let cut = Tail {
                    seq,
                    end: offset,
                    records: applier.seg_records,
                    atoms: applier.seg_atoms,
                    dicts: applier.seg_dicts,
                    sealed: applier.seg_sealed,
                };
                // A torn tail is what a crash leaves: never in a segment
                // of a table closed cleanly, nor a lost header in one the
                // manifest names (its header was synced first).
                let torn = last
                    && applier.last_damage == Some(Damage::Torn)
                    && !clean
                    && (offset > 0 || seq > must);
                // Bytes that were never written back, in a segment that
                // may hold unsynced writes: they and all after them are
                // a torn tail (a frame cut short by the end of its file
                // is not missing bytes but a file cut short).
                let lost = match applier.last_damage {
                    Some(Damage::Hole) => true,
                    Some(Damage::Torn) => !applier.torn_short,
                    _ => false,
                };
                if torn || (lost && offset > 0 && unsynced(seq)) {
                    // A torn tail: cut it (or drop a segment whose header
                    // was never written whole), keep the rest.
                    rec.torn_bytes += applier.torn_end.min(len).saturating_sub(offset);
                    rec.torn_bytes += cut_segments(dir, &seqs[i + 1..])?;
                    if offset == 0 {
                        fs::remove_file(dir.join(&name))?;
                        next = seq;
                    } else {
                        tail = Some(cut);
                        rec.segments.push(seq);
                        next = seq + 1;
                    }
                    break;
                }
                if !repair {
                    return Err(corrupt(&name, offset));
                }
                rec.note(&name, offset, 0);
                aside = Some((i, offset));
                if offset > 0 {
                    tail = Some(cut);
                    rec.segments.push(seq);
                    next = seq + 1;
                } else {
                    next = seq;
                }
                break;
            }
        }
    }
    if aside.is_none() && manifest.is_some() && next <= must {
        // The log ends before the last segment the manifest names.
        let missing = segment_name(next);
        if !repair {
            return Err(OpenError::Missing(missing));
        }
        rec.note(&missing, 0, 0);
    }
    if let Some((i, offset)) = aside {
        let moved = set_aside(dir, &seqs[i..], offset)?;
        if let Some(d) = rec.dropped.as_mut() {
            d.bytes += moved;
        }
    }
    if !clean {
        // What was replayed may be only in the page cache (the VM died,
        // the kernel did not): on disk before the manifest names a
        // segment after these (the table's first write comes after that).
        for seq in &rec.segments {
            files::sync_data(&files::open_read(&dir.join(segment_name(*seq)))?)?;
        }
    }
    if let Some(t) = tail.filter(|t| t.seq + 1 == next) {
        seal_tail(dir, &t)?;
    }
    applier.flush().map_err(|e| match e {
        Apply::Table(e) => e,
        Apply::Bad => corrupt(SNAPSHOT, 0),
    })?;
    // New writes use the newest dictionary, as they did before (a table
    // makes each dictionary it adds current).
    if let Some(d) = table
        .dictionaries()
        .all()
        .iter()
        .rev()
        .find(|d| !is_placeholder(d))
    {
        table.dictionaries().set_current(d.id());
    }
    rec.next_seq = next;
    rec.records_dropped = applier.dropped;
    rec.snapshot = snapshot_clean;
    rec.id = match expect.id {
        Some(id) => id,
        None => files::random_bytes()?,
    };
    Ok(rec)
}

/// What the files must agree on while loading.
struct Expect {
    /// The table's id: from the manifest, or (without one) the first
    /// start frame read.
    id: Option<TableId>,
}

impl Expect {
    /// True if `id` (a start frame's) is the table's; the first one seen
    /// is taken when there was no manifest.
    fn accept(&mut self, id: TableId) -> bool {
        *self.id.get_or_insert(id) == id
    }
}

/// The sequence number in the snapshot's header, if it is sound.
fn snapshot_seq(dir: &Path) -> Result<Option<u64>, OpenError> {
    let mut h = [0u8; HEADER_LEN];
    let got = read_up_to(&mut files::open_read(&dir.join(SNAPSHOT))?, &mut h)?;
    match wal::parse_header(&h[..got], FileKind::Snapshot) {
        Ok(seq) => Ok(Some(seq)),
        Err(HeaderError::Version(version)) => Err(OpenError::Version {
            file: SNAPSHOT.into(),
            version,
        }),
        Err(_) => Ok(None),
    }
}

/// Reads the snapshot through without loading it: `None` if it is whole,
/// else how many atoms its frames before the damage define (its
/// dictionary is ids 0 to n-1 in order).
fn prescan_snapshot(
    dir: &Path,
    table: &Table,
    expect: &mut Expect,
) -> Result<Option<u64>, OpenError> {
    let (_, version, len, r) = match open_file(&dir.join(SNAPSHOT), FileKind::Snapshot, SNAPSHOT) {
        Ok(o) => o,
        Err(Load::Failed(e)) => return Err(e),
        Err(Load::Damaged { .. }) => return Ok(Some(0)),
    };
    let mut frames = wal::FrameReader::new(r, HEADER_LEN as u64, len);
    let mut checked = Checked::default();
    let mut atoms = 0u64;
    let mut first = version >= 3;
    loop {
        let payload = match frames.next_frame() {
            Ok(Some(p)) => p,
            Ok(None) | Err(FrameError::Damaged(..)) => return Ok(Some(atoms)),
            Err(FrameError::Io(e)) => return Err(e.into()),
        };
        if std::mem::take(&mut first) {
            match wal::start_of(payload) {
                Some(id) if expect.accept(id) => continue,
                _ => return Ok(Some(atoms)),
            }
        }
        if check(table, payload, true, None, &mut checked).is_err() {
            return Ok(Some(atoms));
        }
        let mut end = None;
        for op in wal::ops(payload).flatten() {
            match op {
                Op::Atom { id, .. } if id == atoms => atoms += 1,
                Op::End { records, atoms, .. } => end = Some((records, atoms)),
                _ => {}
            }
        }
        if end.is_some() {
            // Whole if its counts hold and nothing follows: the load
            // checks that again.
            return Ok((frames.offset() != len).then_some(atoms));
        }
    }
}

/// Removes segments `seqs`, which follow a hole in the log: unsynced
/// writes made after the ones lost. Returns the bytes of frames they held
/// (after their headers and start frames, up to the last byte that is
/// not zero), counted as torn.
fn cut_segments(dir: &Path, seqs: &[u64]) -> io::Result<u64> {
    let mut cut = 0;
    for seq in seqs {
        let path = dir.join(segment_name(*seq));
        let bytes = files::read(&path)?;
        let data = bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        cut += data.saturating_sub(HEADER_LEN + wal::START_FRAME_LEN) as u64;
        fs::remove_file(&path)?;
    }
    if !seqs.is_empty() {
        sync_dir(dir)?;
    }
    Ok(cut)
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
            let bytes = files::read(&path)?;
            let tail = bytes.get(offset as usize..).unwrap_or_default();
            files::write_atomic(&lost, tail, true)?;
            let keep = files::open_rw(&path)?;
            keep.set_len(offset)?;
            files::sync_all(&keep)?;
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

/// An open file checked for its header: `(seq, version, length, reader
/// after the header)`.
type Opened = (u64, u32, u64, BufReader<File>);

fn open_file(path: &Path, kind: FileKind, name: &str) -> Result<Opened, Load> {
    let f = files::open_read(path)?;
    let len = f.metadata()?.len();
    let mut r = BufReader::with_capacity(1 << 20, f);
    let mut h = [0u8; HEADER_LEN];
    let got = read_up_to(&mut r, &mut h)?;
    match wal::parse_header_version(&h[..got], kind) {
        Ok((seq, version)) => Ok((seq, version, len, r)),
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

/// A put that passed the checks: its parsed header, where it starts in the
/// payload, its key's hash.
#[derive(Clone, Copy)]
struct CheckedPut {
    header: Header,
    at: usize,
    hash: u64,
    /// False for a record a repair drops: it names an atom that is not
    /// defined (see [`Defined`]).
    keep: bool,
}

/// Under repair after the loss of atom definitions (a damaged or missing
/// snapshot): the atom ids that are defined, below `limit` and outside
/// `holes` (ids a later definition skipped over: defined only in what was
/// lost). A record naming any other id cannot be decoded correctly and is
/// dropped.
#[derive(Clone, Debug, Default)]
struct Defined {
    limit: u64,
    holes: Vec<(u64, u64)>,
}

impl Defined {
    fn has(&self, id: u64) -> bool {
        id < self.limit && !self.holes.iter().any(|&(a, b)| (a..b).contains(&id))
    }

    /// An atom op of the frame being checked defines `id`.
    fn define(&mut self, id: u64) {
        if id > self.limit {
            self.holes.push((self.limit, id));
        }
        self.limit = self.limit.max(id + 1);
    }
}

/// True if `rec` (a whole record) can be read: its body decompresses
/// (with a dictionary the table really has, not a placeholder for one a
/// repair lost) and every atom it names is defined.
fn atoms_defined(
    table: &Table,
    rec: &[u8],
    h: &Header,
    defined: &Defined,
    buf: &mut Vec<u8>,
) -> bool {
    let key = &rec[h.key_start()..h.body_start()];
    let stored = &rec[h.body_start()..h.total_len()];
    let dicts = table.dictionaries();
    if h.codec.uses_dict() && !dicts.get(h.dict).is_some_and(|d| !is_placeholder(&d)) {
        return false;
    }
    let Ok(body) = crate::compress::unpack(h, stored, dicts, buf) else {
        return false;
    };
    let mut ok = |id: u64| defined.has(id);
    crate::codec::atoms_all(key, &mut ok).unwrap_or(false)
        && crate::codec::atoms_all(body, &mut ok).unwrap_or(false)
}

/// The bytes a repair installs for zstd dictionary `id` when only a later
/// one survived: no record uses it (those naming it were dropped), and
/// its id is never handed out again.
fn placeholder(id: u32) -> String {
    format!("heft: dictionary {id} lost by a repair")
}

fn is_placeholder(d: &crate::dict::Dict) -> bool {
    d.bytes() == placeholder(d.id()).as_bytes()
}

/// Installs zstd dictionary `id` read from a snapshot or the log: ids come
/// in order from 1, one already installed must have the same bytes, and
/// zstd must accept them. `lossy` (a repair that lost definitions): ids
/// skipped over get placeholders.
fn install_dict(table: &Table, id: u64, bytes: &[u8], lossy: bool) -> Result<(), Apply> {
    let dicts = table.dictionaries();
    let id = u32::try_from(id).map_err(|_| Apply::Bad)?;
    let next = dicts.len() as u32 + 1;
    if id == 0 || (id > next && !lossy) {
        return Err(Apply::Bad);
    }
    for hole in next..id {
        dicts
            .install(hole, placeholder(hole).as_bytes())
            .map_err(|_| Apply::Bad)?;
    }
    dicts.install(id, bytes).map(drop).map_err(|_| Apply::Bad)
}

/// A frame checked whole, before any of it is applied.
#[derive(Default)]
struct Checked {
    puts: Vec<CheckedPut>,
    /// Atom entries.
    atoms: u64,
    /// zstd dictionaries (installed by [`check`]).
    dicts: u64,
    /// It ends with an end op.
    end: bool,
    /// It holds deletes or clears: applied op by op.
    in_order: bool,
    /// Puts not kept (see [`CheckedPut::keep`]).
    dropped: u64,
    /// Scratch space for decompressing.
    buf: Vec<u8>,
}

/// Checks every operation of a frame: they parse, the end op (snapshots
/// only) is last, atom names are UTF-8, every put's record header spans
/// exactly its bytes, and a record compressed with a zstd dictionary names
/// one defined before it; notes the puts with their key hashes. Installs
/// the dictionaries the frame defines as it meets them (in file order, so
/// that the records after them can be checked; a frame refused later may
/// leave its dictionary installed, which is harmless: it is whole and the
/// table's own). Otherwise reads the table only to hash keys, so it may
/// run on another thread than the one applying frames.
fn check(
    table: &Table,
    payload: &[u8],
    snapshot: bool,
    defined: Option<&Defined>,
    c: &mut Checked,
) -> Result<(), Apply> {
    c.puts.clear();
    c.atoms = 0;
    c.dicts = 0;
    c.end = false;
    c.in_order = false;
    c.dropped = 0;
    // A log frame defines its new atoms before its records use them.
    let mut defined = defined.cloned();
    for op in wal::ops(payload) {
        let op = op.map_err(|_| Apply::Bad)?;
        if c.end {
            return Err(Apply::Bad); // the end marker must be last
        }
        match op {
            Op::Put(bytes) => {
                let h = Header::parse(bytes).map_err(|_| Apply::Bad)?;
                if h.total_len() != bytes.len() {
                    return Err(Apply::Bad);
                }
                // A record compressed with a dictionary nothing before it
                // defined cannot be read: damage (a repair drops it).
                let dict_known = !h.codec.uses_dict() || table.dictionaries().get(h.dict).is_some();
                // (A snapshot defines its dictionaries before its records,
                // with no gaps: even a repair finds them there.)
                if !dict_known && (defined.is_none() || snapshot) {
                    return Err(Apply::Bad);
                }
                let keep = defined
                    .as_ref()
                    .map_or(true, |d| atoms_defined(table, bytes, &h, d, &mut c.buf));
                c.dropped += u64::from(!keep);
                c.puts.push(CheckedPut {
                    header: h,
                    at: bytes.as_ptr() as usize - payload.as_ptr() as usize,
                    hash: table.hash(&bytes[h.key_start()..h.body_start()]),
                    keep,
                });
            }
            Op::Atom { name, .. } if std::str::from_utf8(name).is_err() => return Err(Apply::Bad),
            Op::Atom { id, .. } => {
                c.atoms += 1;
                if let (Some(d), false) = (defined.as_mut(), snapshot) {
                    d.define(id);
                }
            }
            Op::Dict { id, bytes } => {
                install_dict(table, id, bytes, defined.is_some())?;
                c.dicts += 1;
            }
            Op::End { .. } if !snapshot => return Err(Apply::Bad),
            Op::End { .. } => c.end = true,
            Op::Start(_) => return Err(Apply::Bad), // only as a file's first frame
            Op::Clear | Op::Delete(_) if snapshot => return Err(Apply::Bad),
            Op::Clear | Op::Delete(_) => c.in_order = true,
        }
    }
    Ok(())
}

/// A snapshot frame read and checked by the loading helper thread.
struct Loaded {
    at: u64,
    payload: Vec<u8>,
    checked: Checked,
    /// The file ends right after this frame.
    last: bool,
}

/// Loads `dir/snapshot`; returns the segment to replay from and the number
/// of records.
///
/// Two threads: a helper reads the file, checks each frame's CRC and
/// operations and hashes its keys, while this one first faults in the
/// arena's pages, then places the records the helper has checked. (Half
/// the time of loading was reading and checking, half placing.)
fn load_snapshot(
    dir: &Path,
    applier: &mut Applier,
    expect: &mut Expect,
) -> Result<(u64, u64), Load> {
    let (seq, version, len, r) = open_file(&dir.join(SNAPSHOT), FileKind::Snapshot, SNAPSHOT)?;
    let damaged = |offset| Load::Damaged {
        offset,
        seq: Some(seq),
        len,
    };
    let table = applier.table;
    let defined = applier.lossy.clone();
    let mut start = version >= 3;
    std::thread::scope(|scope| {
        // A few frames (a few hundred KiB each) ahead at most; payload
        // buffers come back for reuse.
        let (tx, rx) = mpsc::sync_channel::<Result<Loaded, Load>>(8);
        let (back_tx, back_rx) = mpsc::channel::<(Vec<u8>, Checked)>();
        let expect = &mut *expect;
        let reader = move || {
            let mut frames = wal::FrameReader::new(r, HEADER_LEN as u64, len);
            loop {
                let at = frames.offset();
                let loaded = match frames.next_frame() {
                    // No end marker: the snapshot is cut short.
                    Ok(None) => Err(damaged(at)),
                    Err(FrameError::Damaged(_, at)) => Err(damaged(at)),
                    Err(FrameError::Io(e)) => Err(e.into()),
                    // A version 3 snapshot starts by naming its table.
                    Ok(Some(p)) if std::mem::take(&mut start) => match wal::start_of(p) {
                        Some(id) if expect.accept(id) => continue,
                        _ => Err(damaged(at)),
                    },
                    Ok(Some(_)) => {
                        let (spare, mut checked) = back_rx.try_recv().unwrap_or_default();
                        let payload = frames.take_payload(spare);
                        match check(table, &payload, true, defined.as_ref(), &mut checked) {
                            Ok(()) => Ok(Loaded {
                                at,
                                payload,
                                checked,
                                last: frames.offset() == len,
                            }),
                            Err(Apply::Bad) => Err(damaged(at)),
                            Err(Apply::Table(e)) => Err(Load::Failed(e)),
                        }
                    }
                };
                let stop = loaded.as_ref().map_or(true, |l| l.checked.end);
                if tx.send(loaded).is_err() || stop {
                    return;
                }
            }
        };
        std::thread::Builder::new()
            .name("heft-load".into())
            .spawn_scoped(scope, reader)?;
        // Its records take about as many arena bytes as the file has.
        table.bulk_reserve(len).map_err(|e| match table_err(e) {
            Apply::Table(e) => Load::Failed(e),
            Apply::Bad => Load::Failed(corrupt(SNAPSHOT, 0)),
        })?;
        let mut puts = 0u64;
        let mut atoms = 0u64;
        let mut dicts = 0u64;
        for loaded in rx {
            let Loaded {
                at,
                payload,
                checked,
                last,
            } = loaded?;
            let applied = applier
                .apply_checked(&payload, &checked)
                .map_err(|e| match e {
                    Apply::Bad => damaged(at),
                    Apply::Table(e) => Load::Failed(e),
                })?;
            puts += applied.puts;
            atoms += applied.atoms;
            dicts += applied.dicts;
            applier.dropped += checked.dropped;
            if let Some(end) = applied.end {
                if end != (puts, atoms, dicts) || !last {
                    return Err(damaged(at));
                }
                return Ok((seq, puts));
            }
            let _ = back_tx.send((payload, checked));
        }
        Err(Load::Failed(OpenError::Io(io::Error::other(
            "the snapshot's reader stopped early",
        ))))
    })
}

/// How a segment's log ended.
struct Replayed {
    /// Where its log ends (the file may go on with zeros).
    end: u64,
    /// It ends with an end frame.
    sealed: bool,
    /// Its header's format version.
    version: u32,
    /// The file's length.
    len: u64,
}

fn replay_segment(
    dir: &Path,
    name: &str,
    seq: u64,
    applier: &mut Applier,
    rec: &mut Recovery,
    expect: &mut Expect,
) -> Result<Replayed, Load> {
    applier.last_damage = None;
    applier.torn_short = false;
    applier.seg_records = 0;
    applier.seg_atoms = 0;
    applier.seg_dicts = 0;
    applier.seg_sealed = false;
    let (found, version, len, r) = match open_file(&dir.join(name), FileKind::Log, name) {
        Err(Load::Damaged { offset, seq, len }) => {
            // A header shorter than its size, or all zeros: a segment
            // created by a crash-interrupted rotation.
            let bytes = files::read(&dir.join(name))?;
            let all_zero = wal::all_zeros(&bytes);
            if len < HEADER_LEN as u64 || all_zero {
                applier.last_damage = Some(Damage::Torn);
                applier.torn_end = if all_zero { 0 } else { len };
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
    let damaged = |applier: &mut Applier, kind, offset| {
        applier.last_damage = Some(kind);
        Load::Damaged {
            offset,
            seq: Some(seq),
            len,
        }
    };
    let mut frames = wal::FrameReader::new(r, HEADER_LEN as u64, len);
    let mut sealed = false;
    if version >= 3 {
        // Its start frame, written with its header: whose segment it is.
        match frames.next_frame() {
            Ok(Some(p)) => match wal::start_of(p) {
                Some(id) if expect.accept(id) => {}
                // Another table's segment, or a damaged start: nothing of
                // it can be kept.
                _ => return Err(damaged(applier, Damage::Corrupt, 0)),
            },
            // Never written whole: a crash while the segment was made.
            Ok(None) | Err(FrameError::Damaged(Damage::Torn, _)) => {
                applier.torn_end = len;
                return Err(damaged(applier, Damage::Torn, 0));
            }
            Err(FrameError::Damaged(..)) => return Err(damaged(applier, Damage::Corrupt, 0)),
            Err(FrameError::Io(e)) => return Err(e.into()),
        }
    }
    loop {
        let at = frames.offset();
        let payload = match frames.next_frame() {
            Ok(Some(_)) if sealed => return Err(damaged(applier, Damage::Corrupt, at)),
            Ok(Some(p)) => p,
            Ok(None) => {
                return Ok(Replayed {
                    end: at,
                    sealed,
                    version,
                    len,
                })
            }
            // Nothing is ever written after an end frame.
            Err(FrameError::Damaged(..)) if sealed => {
                return Err(damaged(applier, Damage::Corrupt, at))
            }
            Err(FrameError::Damaged(kind, at)) => {
                applier.torn_end = frames.torn_end();
                applier.torn_short = frames.ran_past_end();
                return Err(damaged(applier, kind, at));
            }
            Err(FrameError::Io(e)) => return Err(e.into()),
        };
        // A segment's end frame: its counts must match what it held.
        let mut ops = wal::ops(payload);
        if let (
            Some(Ok(Op::End {
                records,
                atoms,
                dicts,
            })),
            None,
        ) = (ops.next(), ops.next())
        {
            let held = (applier.seg_records, applier.seg_atoms, applier.seg_dicts);
            if (records, atoms, dicts) != held {
                return Err(damaged(applier, Damage::Corrupt, at));
            }
            sealed = true;
            applier.seg_sealed = true;
            continue;
        }
        let applied = applier.apply(payload, false).map_err(|e| match e {
            Apply::Bad => damaged(applier, Damage::Corrupt, at),
            Apply::Table(e) => Load::Failed(e),
        })?;
        let writes = applied.puts + applied.deletes + applied.clears;
        applier.seg_records += writes;
        applier.seg_atoms += applied.atoms;
        applier.seg_dicts += applied.dicts;
        rec.replayed_batches += 1;
        rec.replayed_ops += writes;
    }
}

/// True if segment file `seq` holds no frame: a valid header (or none
/// written yet) and zeros after it. Such a file is a segment made ahead of
/// time that the table never wrote to.
fn unused_segment(dir: &Path, seq: u64) -> io::Result<bool> {
    let bytes = files::read(&dir.join(segment_name(seq)))?;
    let head = &bytes[..bytes.len().min(HEADER_LEN)];
    let header = wal::parse_header_version(head, FileKind::Log);
    let header_ok = wal::all_zeros(head)
        || head.len() < HEADER_LEN
        || header.as_ref().is_ok_and(|h| h.0 == seq);
    let mut rest = bytes.get(HEADER_LEN..).unwrap_or_default();
    if header.is_ok_and(|(_, version)| version >= 3) {
        // A version 3 segment's start frame is written with its header.
        let n = wal::START_FRAME_LEN.min(rest.len());
        let start = &rest[..n];
        let whole = n == wal::START_FRAME_LEN
            && wal::FrameReader::new(start, 0, n as u64)
                .next_frame()
                .ok()
                .flatten()
                .and_then(wal::start_of)
                .is_some();
        if whole || wal::all_zeros(start) {
            rest = &rest[n..];
        }
    }
    Ok(header_ok && wal::all_zeros(rest))
}

/// The last segment kept, which opening seals.
struct Tail {
    seq: u64,
    /// Where its log ends.
    end: u64,
    records: u64,
    atoms: u64,
    dicts: u64,
    sealed: bool,
}

/// Cuts the last segment kept to its log, seals it with an end frame if it
/// has none yet, and syncs it: the segment the table appends to next
/// follows it.
fn seal_tail(dir: &Path, t: &Tail) -> io::Result<()> {
    let f = files::open_rw(&dir.join(segment_name(t.seq)))?;
    let mut len = t.end;
    let mut changed = false;
    if !t.sealed {
        let end = wal::end_frame(t.records, t.atoms, t.dicts);
        std::os::unix::fs::FileExt::write_all_at(&f, &end, t.end)?;
        len += end.len() as u64;
        changed = true;
    }
    if f.metadata()?.len() != len {
        f.set_len(len)?;
        changed = true;
    }
    // A table closed cleanly left it sealed and cut: no sync needed.
    if changed {
        files::sync_all(&f)?;
    }
    Ok(())
}

/// What one frame held.
#[derive(Default)]
struct Applied {
    puts: u64,
    deletes: u64,
    clears: u64,
    atoms: u64,
    dicts: u64,
    /// An end op's counts: records, atoms, dictionaries.
    end: Option<(u64, u64, u64)>,
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
    /// The checks of the frame being applied (kept for its allocation).
    checked: Checked,
    /// What stopped the last segment replayed, and where its torn frame's
    /// bytes end.
    last_damage: Option<Damage>,
    torn_end: u64,
    /// The torn frame ran past the end of its file.
    torn_short: bool,
    /// Writes, atom entries and dictionaries replayed from the current
    /// segment so far, and whether its end frame was read.
    seg_records: u64,
    seg_atoms: u64,
    seg_dicts: u64,
    seg_sealed: bool,
    /// Set when a repair lost atom definitions: which ids are defined.
    lossy: Option<Defined>,
    /// Records not loaded since they name undefined atoms.
    dropped: u64,
}

impl<'t> Applier<'t> {
    fn new(table: &'t Table) -> Self {
        Applier {
            table,
            bulk: Bulk::default(),
            checked: Checked::default(),
            last_damage: None,
            torn_end: 0,
            torn_short: false,
            seg_records: 0,
            seg_atoms: 0,
            seg_dicts: 0,
            seg_sealed: false,
            lossy: None,
            dropped: 0,
        }
    }

    fn apply(&mut self, payload: &[u8], snapshot: bool) -> Result<Applied, Apply> {
        let mut checked = std::mem::take(&mut self.checked);
        let applied = check(
            self.table,
            payload,
            snapshot,
            self.lossy.as_ref(),
            &mut checked,
        )
        .and_then(|()| self.apply_checked(payload, &checked));
        if applied.is_ok() {
            self.dropped += checked.dropped;
        }
        self.checked = checked;
        applied
    }

    /// Applies a frame [`check`] passed.
    fn apply_checked(&mut self, payload: &[u8], c: &Checked) -> Result<Applied, Apply> {
        let mut a = Applied::default();
        if !c.in_order {
            // Atoms first: puts only place bytes, which name atoms by id.
            if c.atoms > 0 || c.end {
                for op in wal::ops(payload).flatten() {
                    match op {
                        Op::Atom { id, name } => self.atom(id, name)?,
                        Op::End {
                            records,
                            atoms,
                            dicts,
                        } => a.end = Some((records, atoms, dicts)),
                        _ => {}
                    }
                }
            }
            a.atoms = c.atoms;
            a.dicts = c.dicts;
            a.puts = c.puts.len() as u64;
            let rec = |p: &CheckedPut| {
                let bytes = &payload[p.at..p.at + p.header.total_len()];
                (p.header, bytes, p.hash)
            };
            if c.dropped == 0 {
                self.table
                    .bulk_put(c.puts.iter().map(rec), &mut self.bulk)
                    .map_err(table_err)?;
            } else {
                let mut kept = c.puts.iter().filter(|p| p.keep).map(rec).collect();
                self.place(&mut kept)?;
            }
            return Ok(a);
        }
        // Deletes or clears: apply in order, placing the puts before each
        // (the checked puts are the frame's put ops, in order).
        let mut puts = c.puts.iter();
        let mut pending = Vec::new();
        for op in wal::ops(payload).flatten() {
            match op {
                Op::Put(_) => {
                    if let Some(p) = puts.next().filter(|p| p.keep) {
                        let bytes = &payload[p.at..p.at + p.header.total_len()];
                        pending.push((p.header, bytes, p.hash));
                    }
                    a.puts += 1;
                }
                Op::Atom { id, name } => {
                    self.atom(id, name)?;
                    a.atoms += 1;
                }
                Op::Delete(_) | Op::Clear => {
                    self.place(&mut pending)?;
                    self.flush()?;
                    if let Op::Delete(key) = op {
                        let h = self.table.hash(key);
                        self.table.remove(h, key, None).map_err(table_err)?;
                        a.deletes += 1;
                    } else {
                        self.table.clear().map_err(table_err)?;
                        a.clears += 1;
                    }
                }
                // Installed by `check`.
                Op::Dict { .. } => a.dicts += 1,
                Op::End { .. } | Op::Start(_) => {}
            }
        }
        self.place(&mut pending)?;
        Ok(a)
    }

    fn place(&mut self, puts: &mut Vec<(Header, &[u8], u64)>) -> Result<(), Apply> {
        if !puts.is_empty() {
            self.table
                .bulk_put(puts.drain(..), &mut self.bulk)
                .map_err(table_err)?;
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
        if u32::try_from(id).is_err() {
            return Err(Apply::Bad);
        }
        if id > len {
            // Ids skipped over were defined only in what a repair lost:
            // they get names no record uses, so that the dictionary
            // never hands them out again (records naming them were
            // dropped).
            let Some(lossy) = self.lossy.as_mut() else {
                return Err(Apply::Bad);
            };
            lossy.holes.push((len, id));
            for hole in len..id {
                let placeholder = format!("heft: atom {hole} lost by a repair");
                if u64::from(atoms.intern(&placeholder)) != hole {
                    return Err(Apply::Bad);
                }
            }
        }
        if u64::from(atoms.intern(name)) != id {
            return Err(Apply::Bad); // the name had another id
        }
        if let Some(lossy) = self.lossy.as_mut() {
            lossy.limit = atoms.len() as u64;
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
            || [SNAPSHOT, META, LOCK, HASH_KEY, MANIFEST, MANIFEST_RESERVE].contains(&name)
            || is_temporary(name);
        if ours {
            fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}
