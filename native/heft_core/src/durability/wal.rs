//! The on-disk framing shared by log segments, snapshots and the META file:
//! a checksummed file header, then checksummed frames holding operations.
//! The format is specified in docs/persistence-format.md; this module is its
//! only implementation, and the offsets below are derived from the sizes
//! there. Everything is little-endian.
//!
//! Writing: [`FrameBuf`] collects the operations of one frame and seals it
//! with its length and CRC; [`Segment`] appends sealed frames to a log
//! segment, a preallocated file mapped shared, by copying them into the
//! mapping. Reading: [`FrameReader`] yields frames one at a time
//! (streaming, one frame in memory), finds where a log ends in a file
//! longer than it, and tells a torn tail from damage in the middle.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{compiler_fence, AtomicU64, Ordering};
use std::sync::Arc;

use memmap2::{MmapMut, MmapOptions};

use crate::codec::{put_varint, Reader};
use crate::crc;

/// Version written in every file header; readers refuse newer ones.
/// Version 2: log segments are preallocated (zeros follow their log) and
/// end with an `end` frame once a later segment exists; version 1 files
/// (log segments as long as their log, no `end`) are still read.
/// Version 3: segments and snapshots start with a `start` frame naming
/// the table, and the directory has a MANIFEST; version 2 directories
/// are still read (and upgraded when opened).
/// Version 4: a table's zstd dictionaries are logged and snapshotted
/// (`dict` ops, and `end` ops that count them), which a version 3 reader
/// would take for damage; version 3 directories are still read (and
/// upgraded when opened).
pub const VERSION: u32 = 4;

/// The random identity of a table, drawn when it is created (or when a
/// version 2 directory is upgraded): in its MANIFEST and at the start of
/// every segment and snapshot, so that a file of another table is refused.
pub type TableId = [u8; 16];

const MAGIC_LEN: usize = 8;
const VERSION_OFFSET: usize = MAGIC_LEN;
const SEQ_OFFSET: usize = VERSION_OFFSET + 4;
const HEADER_CRC_OFFSET: usize = SEQ_OFFSET + 8;
/// Bytes of a file header: magic, version, sequence number, CRC.
pub const HEADER_LEN: usize = HEADER_CRC_OFFSET + 4;

const FRAME_CRC_OFFSET: usize = 4;
/// Bytes in front of a frame's payload: its length and its CRC.
pub const FRAME_HEADER_LEN: usize = FRAME_CRC_OFFSET + 4;
/// The largest payload a frame may hold.
pub const MAX_PAYLOAD: usize = u32::MAX as usize;

/// What a file is, told by its magic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    /// A log segment: `wal-<seq>`.
    Log,
    /// A snapshot: `snapshot`.
    Snapshot,
    /// The table's stored options: `META`.
    Meta,
    /// What must exist in the directory: `MANIFEST`.
    Manifest,
}

impl FileKind {
    fn magic(self) -> &'static [u8; MAGIC_LEN] {
        match self {
            FileKind::Log => b"HEFTLOG\n",
            FileKind::Snapshot => b"HEFTSNP\n",
            FileKind::Meta => b"HEFTMTA\n",
            FileKind::Manifest => b"HEFTMAN\n",
        }
    }
}

/// A file header: the file's kind, and a sequence number (a log segment's
/// own number; for a snapshot, the first segment to replay after it).
pub fn header(kind: FileKind, seq: u64) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..MAGIC_LEN].copy_from_slice(kind.magic());
    h[VERSION_OFFSET..SEQ_OFFSET].copy_from_slice(&VERSION.to_le_bytes());
    h[SEQ_OFFSET..HEADER_CRC_OFFSET].copy_from_slice(&seq.to_le_bytes());
    let c = crc::crc32c(&h[..HEADER_CRC_OFFSET]);
    h[HEADER_CRC_OFFSET..].copy_from_slice(&c.to_le_bytes());
    h
}

/// Why a file header was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum HeaderError {
    /// Fewer than [`HEADER_LEN`] bytes.
    Short,
    /// Wrong magic or a failing checksum.
    Bad,
    /// Written by a newer Heft.
    Version(u32),
}

/// Checks a file header and returns its sequence number.
pub fn parse_header(bytes: &[u8], kind: FileKind) -> Result<u64, HeaderError> {
    parse_header_version(bytes, kind).map(|(seq, _)| seq)
}

/// Checks a file header and returns its sequence number and version.
pub fn parse_header_version(bytes: &[u8], kind: FileKind) -> Result<(u64, u32), HeaderError> {
    let h = bytes.get(..HEADER_LEN).ok_or(HeaderError::Short)?;
    let stored = u32::from_le_bytes(le4(&h[HEADER_CRC_OFFSET..]));
    if &h[..MAGIC_LEN] != kind.magic() || crc::crc32c(&h[..HEADER_CRC_OFFSET]) != stored {
        return Err(HeaderError::Bad);
    }
    let version = u32::from_le_bytes(le4(&h[VERSION_OFFSET..]));
    if version > VERSION {
        return Err(HeaderError::Version(version));
    }
    let mut seq = [0u8; 8];
    seq.copy_from_slice(&h[SEQ_OFFSET..HEADER_CRC_OFFSET]);
    Ok((u64::from_le_bytes(seq), version))
}

fn le4(b: &[u8]) -> [u8; 4] {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    a
}

/// Operation tags inside a frame's payload.
mod tag {
    pub const ATOM: u8 = 0x01;
    pub const PUT: u8 = 0x02;
    pub const DELETE: u8 = 0x03;
    pub const CLEAR: u8 = 0x04;
    pub const END: u8 = 0x05;
    pub const START: u8 = 0x06;
    pub const DICT: u8 = 0x07;
    /// `end` with a count of dictionaries (written when that is not 0).
    pub const END_DICTS: u8 = 0x08;
}

/// One operation in a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op<'a> {
    /// Atom dictionary entry: `id` names `name` (UTF-8).
    Atom { id: u64, name: &'a [u8] },
    /// A record as stored in the arena (header, key, body).
    Put(&'a [u8]),
    /// Remove the record with this encoded key.
    Delete(&'a [u8]),
    /// Remove every record.
    Clear,
    /// A snapshot's (or a sealed segment's) last operation: how many
    /// records, atoms and zstd dictionaries it holds.
    End {
        records: u64,
        atoms: u64,
        dicts: u64,
    },
    /// The first frame of a version 3 segment or snapshot: whose it is.
    Start(TableId),
    /// zstd dictionary `id` of the table (dict.rs), as trained.
    Dict { id: u64, bytes: &'a [u8] },
}

impl Op<'_> {
    /// Appends the operation's encoding.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match *self {
            Op::Atom { id, name } => {
                out.push(tag::ATOM);
                put_varint(out, id);
                put_varint(out, name.len() as u64);
                out.extend_from_slice(name);
            }
            Op::Put(rec) => {
                out.push(tag::PUT);
                put_varint(out, rec.len() as u64);
                out.extend_from_slice(rec);
            }
            Op::Delete(key) => {
                out.push(tag::DELETE);
                put_varint(out, key.len() as u64);
                out.extend_from_slice(key);
            }
            Op::Clear => out.push(tag::CLEAR),
            Op::End {
                records,
                atoms,
                dicts,
            } => {
                out.push(if dicts == 0 { tag::END } else { tag::END_DICTS });
                put_varint(out, records);
                put_varint(out, atoms);
                if dicts != 0 {
                    put_varint(out, dicts);
                }
            }
            Op::Dict { id, bytes } => {
                out.push(tag::DICT);
                put_varint(out, id);
                put_varint(out, bytes.len() as u64);
                out.extend_from_slice(bytes);
            }
            Op::Start(id) => {
                out.push(tag::START);
                out.extend_from_slice(&id);
            }
        }
    }
}

/// The operations of a payload, in order; an error for an unknown tag or a
/// length that overruns the payload.
pub fn ops(payload: &[u8]) -> Ops<'_> {
    Ops {
        r: Reader::new(payload),
        failed: false,
    }
}

/// Iterator returned by [`ops`].
pub struct Ops<'a> {
    r: Reader<'a>,
    failed: bool,
}

/// A payload that does not parse (a bug or a crafted file: its CRC held).
#[derive(Debug, PartialEq, Eq)]
pub struct BadOp;

impl<'a> Ops<'a> {
    fn op(&mut self) -> Result<Op<'a>, crate::codec::DecodeError> {
        let r = &mut self.r;
        let t = r.u8()?;
        let sized = |r: &mut Reader<'a>| -> Result<&'a [u8], crate::codec::DecodeError> {
            let n = r.varint()?;
            let n = usize::try_from(n).map_err(|_| crate::codec::DecodeError::BadLength(n))?;
            r.bytes(n)
        };
        Ok(match t {
            tag::ATOM => {
                let id = r.varint()?;
                Op::Atom {
                    id,
                    name: sized(r)?,
                }
            }
            tag::PUT => Op::Put(sized(r)?),
            tag::DELETE => Op::Delete(sized(r)?),
            tag::CLEAR => Op::Clear,
            tag::END => Op::End {
                records: r.varint()?,
                atoms: r.varint()?,
                dicts: 0,
            },
            tag::END_DICTS => Op::End {
                records: r.varint()?,
                atoms: r.varint()?,
                dicts: r.varint()?,
            },
            tag::DICT => {
                let id = r.varint()?;
                Op::Dict {
                    id,
                    bytes: sized(r)?,
                }
            }
            tag::START => {
                let mut id = TableId::default();
                id.copy_from_slice(r.bytes(std::mem::size_of::<TableId>())?);
                Op::Start(id)
            }
            other => return Err(crate::codec::DecodeError::BadTag(other)),
        })
    }
}

impl<'a> Iterator for Ops<'a> {
    type Item = Result<Op<'a>, BadOp>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.r.remaining() == 0 {
            return None;
        }
        match self.op() {
            Ok(op) => Some(Ok(op)),
            Err(_) => {
                self.failed = true;
                Some(Err(BadOp))
            }
        }
    }
}

/// Builds one frame: reserve the frame header, push operations, seal.
#[derive(Default)]
pub struct FrameBuf {
    buf: Vec<u8>,
    ops: usize,
}

impl FrameBuf {
    /// An empty frame.
    pub fn new() -> Self {
        let mut f = FrameBuf::default();
        f.reset();
        f
    }

    /// Forgets the operations, keeping the allocation.
    pub fn reset(&mut self) {
        self.buf.clear();
        self.buf.resize(FRAME_HEADER_LEN, 0);
        self.ops = 0;
    }

    /// Appends an operation.
    pub fn push(&mut self, op: Op<'_>) {
        op.encode(&mut self.buf);
        self.ops += 1;
    }

    /// Appends bytes that are not operations (META's payload is a blob).
    pub fn push_raw(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
        self.ops += 1;
    }

    /// Operations pushed since the last reset.
    pub fn ops(&self) -> usize {
        self.ops
    }

    /// Bytes of payload so far.
    pub fn payload_len(&self) -> usize {
        self.buf.len() - FRAME_HEADER_LEN
    }

    /// Fills in length and CRC and returns the whole frame, or `None` if
    /// the payload is empty or longer than [`MAX_PAYLOAD`].
    pub fn seal(&mut self) -> Option<&[u8]> {
        let len = self.payload_len();
        if len == 0 || len > MAX_PAYLOAD {
            return None;
        }
        let len_le = (len as u32).to_le_bytes();
        self.buf[..FRAME_CRC_OFFSET].copy_from_slice(&len_le);
        let c = crc::extend(crc::crc32c(&len_le), &self.buf[FRAME_HEADER_LEN..]);
        self.buf[FRAME_CRC_OFFSET..FRAME_HEADER_LEN].copy_from_slice(&c.to_le_bytes());
        Some(&self.buf)
    }
}

/// What is wrong at some offset of a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Damage {
    /// A frame that runs past the end of the file, or fails its checksum
    /// with nothing but zeros after it: what a crash during an append
    /// leaves.
    Torn,
    /// Bytes missing before data: a frame header of zeros, or a frame that
    /// fails its checksum and holds zeros that run up to a [`SECTOR`]
    /// boundary (its last byte before a boundary is zero, and so is every
    /// byte after its end up to the next one), with data after either.
    /// What a power loss leaves when the kernel had written back later
    /// pages of the log but not all of these: a log segment is written
    /// once, from zeros, so a write that did not reach the disk (a sector
    /// or page, or the part of one copied after its writeback began) reads
    /// back as zeros up to the end of its sector.
    Hole,
    /// A frame that fails its checksum or does not parse with data after
    /// it and no missing sector in it.
    Corrupt,
}

/// The unit a disk writes whole (the smallest there is): zeros up to
/// the end of a sector in a damaged frame are a write that did not
/// happen.
pub const SECTOR: u64 = 512;

/// A frame that could not be read, at `offset` (where the frame starts).
#[derive(Debug)]
pub enum FrameError {
    /// Damage at this offset.
    Damaged(Damage, u64),
    /// The file could not be read.
    Io(io::Error),
}

/// Reads the frames of one file, one at a time.
pub struct FrameReader<R> {
    inner: R,
    /// Offset of the next frame.
    offset: u64,
    /// The file's length.
    len: u64,
    /// Where a torn frame's bytes end (its declared end, or the file's);
    /// after a hole, where the data after it ends.
    torn_end: u64,
    /// The damaged frame ran past the end of the file.
    short: bool,
    payload: Vec<u8>,
}

impl<R: Read> FrameReader<R> {
    /// A reader positioned after a file's header (at `offset`), for a file
    /// of `len` bytes.
    pub fn new(inner: R, offset: u64, len: u64) -> Self {
        FrameReader {
            inner,
            offset,
            len,
            torn_end: len,
            short: false,
            payload: Vec::new(),
        }
    }

    /// Offset of the next frame (after the last one returned); once
    /// `next_frame` gave `Ok(None)`, where the log ends.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// After a torn frame: where its bytes end, so the torn tail is
    /// `offset..torn_end`; after a hole, where the last data after it
    /// ends.
    pub fn torn_end(&self) -> u64 {
        self.torn_end
    }

    /// After a torn frame: true if it ran past the end of the file (a
    /// file cut short), false if it failed its checksum.
    pub fn ran_past_end(&self) -> bool {
        self.short
    }

    /// The next frame's payload; `Ok(None)` at the end of the log: the end
    /// of the file, or a frame header of zeros followed only by zeros to
    /// the end of the file (a preallocated segment's free space).
    pub fn next_frame(&mut self) -> Result<Option<&[u8]>, FrameError> {
        let at = self.offset;
        let left = self.len.saturating_sub(at);
        if left == 0 {
            return Ok(None);
        }
        let mut head = [0u8; FRAME_HEADER_LEN];
        let got = left.min(FRAME_HEADER_LEN as u64) as usize;
        self.inner
            .read_exact(&mut head[..got])
            .map_err(FrameError::Io)?;
        if all_zeros(&head) {
            // Zeros where a frame would start: the log ends here if only
            // zeros follow; data after them is a hole.
            return match self.data_end(at + got as u64) {
                Ok(None) => Ok(None),
                Ok(Some(end)) => {
                    self.torn_end = end;
                    Err(FrameError::Damaged(Damage::Hole, at))
                }
                Err(e) => Err(FrameError::Io(e)),
            };
        }
        if got < FRAME_HEADER_LEN {
            self.torn_end = self.len;
            self.short = true;
            return Err(FrameError::Damaged(Damage::Torn, at));
        }
        let len = u64::from(u32::from_le_bytes(le4(&head)));
        let stored = u32::from_le_bytes(le4(&head[FRAME_CRC_OFFSET..]));
        let end = at + FRAME_HEADER_LEN as u64 + len;
        if end > self.len {
            // The frame runs past the end: torn while it was appended.
            self.torn_end = self.len;
            self.short = true;
            return Err(FrameError::Damaged(Damage::Torn, at));
        }
        self.payload.clear();
        self.payload.resize(len as usize, 0);
        self.inner
            .read_exact(&mut self.payload)
            .map_err(FrameError::Io)?;
        let c = crc::extend(crc::crc32c(&head[..FRAME_CRC_OFFSET]), &self.payload);
        if len == 0 || c != stored {
            // A frame cut short by a crash in the middle of its append
            // (its header is written first) has only zeros after it; one
            // with data after it is a hole if a sector of it is missing.
            self.torn_end = end;
            return match self.classify(at, &head, end) {
                Ok((Damage::Hole, data_end)) => {
                    self.torn_end = data_end;
                    Err(FrameError::Damaged(Damage::Hole, at))
                }
                Ok((kind, _)) => Err(FrameError::Damaged(kind, at)),
                Err(e) => Err(FrameError::Io(e)),
            };
        }
        self.offset = end;
        Ok(Some(&self.payload))
    }

    /// A frame from `at` to `end` (its header `head`, its payload read)
    /// failed its checksum: torn if only zeros follow it, a hole if data
    /// follows and it holds zeros that run up to a sector boundary (read on
    /// past its end if need be), else corrupt; with where the data after
    /// it ends.
    fn classify(
        &mut self,
        at: u64,
        head: &[u8; FRAME_HEADER_LEN],
        end: u64,
    ) -> io::Result<(Damage, u64)> {
        // The bytes after the frame up to the next sector boundary.
        let stop = ((end - 1) / SECTOR + 1) * SECTOR;
        let over = stop.min(self.len) - end;
        let mut after = vec![0u8; over as usize];
        self.inner.read_exact(&mut after)?;
        let byte = |o: u64| -> u8 {
            let i = (o - at) as usize;
            match i.checked_sub(FRAME_HEADER_LEN) {
                None => head[i],
                Some(p) => self.payload[p],
            }
        };
        // At each sector boundary the frame reaches, its last byte before
        // it is zero (and so is every byte after the frame up to it).
        let hole = ((at / SECTOR + 1) * SECTOR..=stop)
            .step_by(SECTOR as usize)
            .any(|m| byte(m.min(end) - 1) == 0 && (m <= end || all_zeros(&after)));
        let rest = self.data_end(end + over)?;
        let data_end = rest.or_else(|| {
            after
                .iter()
                .rposition(|&b| b != 0)
                .map(|i| end + i as u64 + 1)
        });
        Ok(match data_end {
            None => (Damage::Torn, end),
            Some(e) if hole => (Damage::Hole, e),
            Some(e) => (Damage::Corrupt, e),
        })
    }

    /// The payload `next_frame` just returned, as an owned buffer; `spare`
    /// (any contents) becomes the buffer for the next frame.
    pub fn take_payload(&mut self, spare: Vec<u8>) -> Vec<u8> {
        std::mem::replace(&mut self.payload, spare)
    }

    /// Reads the rest of the file, from offset `from`: where its last
    /// byte that is not zero ends, `None` if it is all zeros.
    fn data_end(&mut self, mut from: u64) -> io::Result<Option<u64>> {
        let mut rest = vec![0u8; 1 << 20];
        let mut end = None;
        loop {
            match self.inner.read(&mut rest)? {
                0 => return Ok(end),
                n => {
                    if let Some(i) = rest[..n].iter().rposition(|&b| b != 0) {
                        end = Some(from + i as u64 + 1);
                    }
                    from += n as u64;
                }
            }
        }
    }
}

/// True if `bytes` are all zeros.
pub fn all_zeros(bytes: &[u8]) -> bool {
    bytes.iter().all(|&b| b == 0)
}

/// Faults a test can make a segment suffer (also reachable from ExUnit
/// through a debug NIF, hence not `cfg(test)`).
#[derive(Default)]
pub struct Faults {
    /// Appends left before one fails with ENOSPC (0: none planned): what
    /// a full disk does to the creation of the next segment.
    pub enospc_after: AtomicU64,
    /// Syncs left before one fails with EIO (0: none planned).
    pub eio_after: AtomicU64,
    /// MANIFEST rewrites left before one fails with ENOSPC (0: none
    /// planned): a full disk without the MANIFEST's reserve.
    pub manifest_enospc_after: AtomicU64,
}

impl Faults {
    /// True when the counter was armed and has just run out.
    pub fn fire(counter: &AtomicU64) -> bool {
        counter
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| match n {
                0 => None,
                n => Some(n - 1),
            })
            .is_ok_and(|n| n == 1)
    }
}

/// Bytes kept free at the end of a segment for its end frame: a frame
/// header and an `end` op (a tag and three varints of at most 10 bytes).
pub const END_RESERVE: u64 = (FRAME_HEADER_LEN + 1 + 10 + 10 + 10) as u64;

/// The end frame of a log segment that held `records` writes, `atoms`
/// atom entries and `dicts` dictionaries.
pub fn end_frame(records: u64, atoms: u64, dicts: u64) -> Vec<u8> {
    let mut f = FrameBuf::new();
    f.push(Op::End {
        records,
        atoms,
        dicts,
    });
    f.seal().map(<[u8]>::to_vec).unwrap_or_default()
}

/// Bytes of a start frame: a frame header, the tag, the 16-byte id.
pub const START_FRAME_LEN: usize = FRAME_HEADER_LEN + 1 + 16;

/// The start frame of a segment or snapshot of table `id`.
pub fn start_frame(id: &TableId) -> Vec<u8> {
    let mut f = FrameBuf::new();
    f.push(Op::Start(*id));
    f.seal().map(<[u8]>::to_vec).unwrap_or_default()
}

/// The table id in `payload` if it is exactly one start op.
pub fn start_of(payload: &[u8]) -> Option<TableId> {
    let mut ops = ops(payload);
    match (ops.next(), ops.next()) {
        (Some(Ok(Op::Start(id))), None) => Some(id),
        _ => None,
    }
}

/// A log segment open for appending: a file preallocated to its capacity
/// and mapped shared, so an append copies a frame into the page cache and
/// makes no system call. What it appended survives the process's death at
/// once; it is on disk once the file is fdatasynced.
pub struct Segment {
    /// Its sequence number (`wal-<seq>`).
    pub seq: u64,
    file: Arc<File>,
    map: MmapMut,
    /// Bytes of log: the header plus whole frames.
    len: u64,
    /// Writes (records put or removed, clears), atom entries and zstd
    /// dictionaries logged.
    records: u64,
    atoms: u64,
    dicts: u64,
}

impl Segment {
    /// Creates segment `seq` as `path` (mode 0600, failing if it exists):
    /// `capacity` bytes reserved on disk (so that a store through the
    /// mapping can never meet a full disk, which would be SIGBUS), its
    /// header written and synced; then maps it. The caller syncs the
    /// directory. On failure the file is removed.
    pub fn create(path: &Path, seq: u64, capacity: u64, id: &TableId) -> io::Result<Segment> {
        let file = crate::files::create_new(path, crate::files::FILE_MODE)?;
        let made = Self::prepare(file, seq, capacity, id);
        if made.is_err() {
            let _ = std::fs::remove_file(path);
        }
        made
    }

    fn prepare(file: File, seq: u64, capacity: u64, id: &TableId) -> io::Result<Segment> {
        let capacity = capacity.max(MIN_CAPACITY);
        crate::arena::allocate(&file, 0, capacity)?;
        let mut head = header(FileKind::Log, seq).to_vec();
        head.extend_from_slice(&start_frame(id));
        file.write_all_at(&head, 0)?;
        crate::files::sync_all(&file)?;
        let len = usize::try_from(capacity).map_err(|_| io::ErrorKind::InvalidInput)?;
        // SAFETY: the file was created here (O_EXCL, mode 0600) in a
        // directory this process holds locked, and keeps its length while
        // mapped: Heft shrinks it only after unmapping ([`Segment::finish`]).
        // Another process truncating it anyway would make a store SIGBUS;
        // the lock and the file modes are all that guard against that.
        let map = unsafe { MmapOptions::new().len(len).map_mut(&file)? };
        Ok(Segment {
            seq,
            file: Arc::new(file),
            map,
            len: head.len() as u64,
            records: 0,
            atoms: 0,
            dicts: 0,
        })
    }

    /// The file, for syncing outside the log's lock.
    pub fn file(&self) -> &Arc<File> {
        &self.file
    }

    /// Bytes of log in the file.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// The file's preallocated size.
    pub fn capacity(&self) -> u64 {
        self.map.len() as u64
    }

    /// True when it holds no frame yet but its start frame.
    pub fn is_empty(&self) -> bool {
        self.len <= (HEADER_LEN + START_FRAME_LEN) as u64
    }

    /// True if a frame of `n` bytes fits, leaving room for the end frame.
    pub fn fits(&self, n: usize) -> bool {
        self.len + n as u64 + END_RESERVE <= self.capacity()
    }

    /// Appends a sealed frame holding `records` writes, `atoms` atom
    /// entries and `dicts` dictionaries: copies it into the mapping, its header first, so a process
    /// killed in the middle leaves a frame that fails its checksum with
    /// zeros after it (a torn tail). No system call. False, appending
    /// nothing, if it does not [fit](Segment::fits).
    pub fn append(&mut self, frame: &[u8], records: u64, atoms: u64, dicts: u64) -> bool {
        if !self.fits(frame.len()) || frame.len() < FRAME_HEADER_LEN {
            return false;
        }
        let at = self.len as usize;
        let Some(dst) = self.map.get_mut(at..at + frame.len()) else {
            return false;
        };
        let (head, body) = dst.split_at_mut(FRAME_HEADER_LEN);
        head.copy_from_slice(&frame[..FRAME_HEADER_LEN]);
        // Keep the compiler from storing the payload before the header.
        compiler_fence(Ordering::SeqCst);
        body.copy_from_slice(&frame[FRAME_HEADER_LEN..]);
        self.len += frame.len() as u64;
        self.records += records;
        self.atoms += atoms;
        self.dicts += dicts;
        true
    }

    /// Appends the end frame (there is always room: [`END_RESERVE`]);
    /// nothing may be appended after it.
    pub fn seal(&mut self) {
        let end = end_frame(self.records, self.atoms, self.dicts);
        let at = self.len as usize;
        if let Some(dst) = self.map.get_mut(at..at + end.len()) {
            dst.copy_from_slice(&end);
            self.len += end.len() as u64;
        }
    }

    /// Done with it: unmaps it, cuts the file to its log (giving the
    /// preallocated rest back) and fdatasyncs it.
    pub fn finish(self, faults: &Faults) -> io::Result<()> {
        let Segment { file, map, len, .. } = self;
        drop(map);
        file.set_len(len)?;
        sync_data(&file, faults)
    }
}

/// The smallest segment: one page (a header, frames, the end frame).
pub const MIN_CAPACITY: u64 = 4096;

/// fdatasync, or the injected failure.
pub fn sync_data(file: &File, faults: &Faults) -> io::Result<()> {
    if Faults::fire(&faults.eio_after) {
        return Err(io::Error::from_raw_os_error(libc::EIO));
    }
    crate::files::sync_data(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn frames(ops_per_frame: &[&[Op]]) -> Vec<u8> {
        let mut out = header(FileKind::Log, 7).to_vec();
        let mut f = FrameBuf::new();
        for ops in ops_per_frame {
            f.reset();
            for op in *ops {
                f.push(*op);
            }
            out.extend_from_slice(f.seal().unwrap());
        }
        out
    }

    fn read_all(bytes: &[u8]) -> (Vec<Vec<u8>>, Option<FrameError>) {
        assert_eq!(parse_header(bytes, FileKind::Log), Ok(7));
        let mut r = FrameReader::new(
            Cursor::new(&bytes[HEADER_LEN..]),
            HEADER_LEN as u64,
            bytes.len() as u64,
        );
        let mut out = Vec::new();
        loop {
            match r.next_frame() {
                Ok(Some(p)) => out.push(p.to_vec()),
                Ok(None) => return (out, None),
                Err(e) => return (out, Some(e)),
            }
        }
    }

    #[test]
    fn frames_round_trip_with_every_op() {
        let ops: &[Op] = &[
            Op::Atom { id: 3, name: b"ok" },
            Op::Put(b"\x00\x01\x02k"),
            Op::Delete(b"k"),
            Op::Clear,
            Op::End {
                records: 1 << 40,
                atoms: 4,
                dicts: 0,
            },
            Op::Dict {
                id: 2,
                bytes: b"dictionary bytes",
            },
            Op::End {
                records: 3,
                atoms: 0,
                dicts: 1 << 33,
            },
        ];
        let bytes = frames(&[ops, &[Op::Clear]]);
        let (got, err) = read_all(&bytes);
        assert!(err.is_none());
        assert_eq!(got.len(), 2);
        let parsed: Vec<Op> = super::ops(&got[0]).map(Result::unwrap).collect();
        assert_eq!(parsed, ops);
    }

    #[test]
    fn an_unknown_op_tag_is_an_error() {
        let mut it = super::ops(&[tag::CLEAR, 0x77, 1, 2]);
        assert_eq!(it.next(), Some(Ok(Op::Clear)));
        assert_eq!(it.next(), Some(Err(BadOp)));
        assert_eq!(it.next(), None);
        // A length that overruns the payload.
        assert_eq!(super::ops(&[tag::PUT, 5, 1]).next(), Some(Err(BadOp)));
    }

    #[test]
    fn headers_check_magic_crc_and_version() {
        let h = header(FileKind::Snapshot, 42);
        assert_eq!(parse_header(&h, FileKind::Snapshot), Ok(42));
        assert_eq!(parse_header(&h, FileKind::Log), Err(HeaderError::Bad));
        assert_eq!(
            parse_header(&h[..10], FileKind::Snapshot),
            Err(HeaderError::Short)
        );
        let mut bad = h;
        bad[SEQ_OFFSET] ^= 1;
        assert_eq!(
            parse_header(&bad, FileKind::Snapshot),
            Err(HeaderError::Bad)
        );
        let mut newer = h;
        newer[VERSION_OFFSET..SEQ_OFFSET].copy_from_slice(&(VERSION + 1).to_le_bytes());
        let c = crc::crc32c(&newer[..HEADER_CRC_OFFSET]);
        newer[HEADER_CRC_OFFSET..].copy_from_slice(&c.to_le_bytes());
        assert_eq!(
            parse_header(&newer, FileKind::Snapshot),
            Err(HeaderError::Version(VERSION + 1))
        );
    }

    #[test]
    fn every_truncation_is_a_torn_tail_after_whole_frames() {
        let bytes = frames(&[&[Op::Put(b"aaaa")], &[Op::Put(b"bbbbbbbb")], &[Op::Clear]]);
        let (all, _) = read_all(&bytes);
        let mut ends = vec![HEADER_LEN];
        for p in &all {
            ends.push(ends.last().unwrap() + FRAME_HEADER_LEN + p.len());
        }
        for cut in HEADER_LEN..bytes.len() {
            let (got, err) = read_all(&bytes[..cut]);
            let whole = ends.iter().filter(|&&e| e <= cut).count() - 1;
            assert_eq!(got.len(), whole, "cut at {cut}");
            match err {
                None => assert!(ends.contains(&cut)),
                Some(FrameError::Damaged(Damage::Torn, at)) => {
                    assert_eq!(at as usize, ends[whole])
                }
                Some(e) => panic!("cut at {cut}: {e:?}"),
            }
        }
    }

    #[test]
    fn a_flipped_bit_in_the_last_frame_is_torn_elsewhere_corrupt() {
        let bytes = frames(&[&[Op::Put(b"aaaa")], &[Op::Put(b"bbbb")]]);
        let first_payload = HEADER_LEN + FRAME_HEADER_LEN;
        let mut mid = bytes.clone();
        mid[first_payload + 2] ^= 0x10;
        let (got, err) = read_all(&mid);
        assert!(got.is_empty());
        assert!(
            matches!(err, Some(FrameError::Damaged(Damage::Corrupt, at)) if at == HEADER_LEN as u64)
        );
        let mut last = bytes.clone();
        let n = last.len();
        last[n - 1] ^= 0x10;
        let (got, err) = read_all(&last);
        assert_eq!(got.len(), 1);
        assert!(matches!(err, Some(FrameError::Damaged(Damage::Torn, _))));
    }

    #[test]
    fn zeros_after_the_last_frame_end_the_log() {
        let mut bytes = frames(&[&[Op::Put(b"aaaa")]]);
        let log_end = bytes.len();
        bytes.extend_from_slice(&[0u8; 100_000]);
        let (got, err) = read_all(&bytes);
        assert_eq!(got.len(), 1);
        assert!(err.is_none(), "{err:?}");
        // Zeros, then data: a hole where the zeros start.
        let n = bytes.len();
        bytes[n - 3] = 9;
        let (_, err) = read_all(&bytes);
        assert!(
            matches!(err, Some(FrameError::Damaged(Damage::Hole, at)) if at as usize == log_end)
        );
    }

    /// Reads `bytes` (a segment) to its first damage: the kind, where,
    /// and where the reader says the data after it ends.
    fn first_damage(bytes: &[u8]) -> (Damage, u64, u64) {
        let mut r = FrameReader::new(
            Cursor::new(&bytes[HEADER_LEN..]),
            HEADER_LEN as u64,
            bytes.len() as u64,
        );
        loop {
            match r.next_frame() {
                Ok(Some(_)) => continue,
                Err(FrameError::Damaged(kind, at)) => return (kind, at, r.torn_end()),
                other => panic!("{:?}", other.map(|o| o.is_some())),
            }
        }
    }

    #[test]
    fn a_frame_missing_a_written_back_sector_before_data_is_a_hole() {
        // Three frames of 3000 bytes; the second one's bytes from some
        // point to the end of its sector never reached the disk (zeros),
        // the third did.
        let big = [7u8; 3000];
        let whole = frames(&[&[Op::Put(&big)], &[Op::Put(&big)], &[Op::Put(&big)]]);
        let second = HEADER_LEN + whole[HEADER_LEN..].len() / 3;
        let boundary = (second / SECTOR as usize + 2) * SECTOR as usize;
        for lost_from in [boundary - SECTOR as usize, boundary - 100, boundary - 1] {
            let mut bytes = whole.clone();
            bytes[lost_from..boundary].fill(0);
            let (kind, at, data_end) = first_damage(&bytes);
            assert_eq!((kind, at as usize), (Damage::Hole, second), "{lost_from}");
            assert_eq!(data_end as usize, whole.len(), "the data after it");
        }
    }

    #[test]
    fn a_damaged_frame_without_zeros_up_to_a_sector_boundary_is_corrupt() {
        // Data after it, and no byte before a boundary zero: garbage, not
        // a write that did not happen.
        let big = [7u8; 3000];
        let whole = frames(&[&[Op::Put(&big)], &[Op::Put(&big)], &[Op::Put(&big)]]);
        let second = HEADER_LEN + whole[HEADER_LEN..].len() / 3;
        let mut bytes = whole.clone();
        bytes[second + 1000] ^= 0x10;
        assert_eq!(first_damage(&bytes).0, Damage::Corrupt);
        // The same bytes zeroed in the middle of a sector, not up to its
        // end: not what lost writeback leaves either.
        let mut bytes = whole.clone();
        let mid = (second / SECTOR as usize + 2) * SECTOR as usize + 100;
        bytes[mid..mid + 200].fill(0);
        assert_eq!(first_damage(&bytes).0, Damage::Corrupt);
    }

    #[test]
    fn a_frame_cut_short_before_zeros_is_torn() {
        // What a process killed in the middle of an append leaves in a
        // preallocated segment: the header and part of the payload.
        let whole = frames(&[&[Op::Put(b"aaaa")], &[Op::Put(&[7u8; 300])]]);
        let second = {
            let len = u32::from_le_bytes(le4(&whole[HEADER_LEN..])) as usize;
            HEADER_LEN + FRAME_HEADER_LEN + len
        };
        for written in [
            FRAME_HEADER_LEN,
            FRAME_HEADER_LEN + 1,
            whole.len() - second - 1,
        ] {
            let mut bytes = whole[..second + written].to_vec();
            bytes.resize(whole.len() + 5000, 0);
            let mut r = FrameReader::new(
                Cursor::new(&bytes[HEADER_LEN..]),
                HEADER_LEN as u64,
                bytes.len() as u64,
            );
            assert!(r.next_frame().unwrap().is_some());
            match r.next_frame() {
                Err(FrameError::Damaged(Damage::Torn, at)) => assert_eq!(at as usize, second),
                other => panic!("{written} bytes written: {:?}", other.map(|o| o.is_some())),
            }
            assert_eq!(r.torn_end() as usize, whole.len(), "the declared end");
        }
    }

    fn temp_path(name: &str) -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!("heft-wal-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        p
    }

    #[test]
    fn a_segment_fills_to_its_end_frame_and_finishes_trimmed() {
        let path = temp_path("fill");
        let mut seg = Segment::create(&path, 3, MIN_CAPACITY, &[7; 16]).unwrap();
        assert_eq!(seg.capacity(), MIN_CAPACITY);
        let mut f = FrameBuf::new();
        f.push(Op::Put(&[1u8; 100]));
        let frame = f.seal().unwrap().to_vec();
        let mut n = 0;
        while seg.append(&frame, 1, 0, 0) {
            n += 1;
        }
        assert!(!seg.fits(frame.len()));
        let room = seg.capacity() - seg.len() - END_RESERVE;
        assert!(room < frame.len() as u64);
        seg.seal();
        let sealed = seg.len();
        seg.finish(&Faults::default()).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len() as u64, sealed, "cut to its log");
        assert_eq!(parse_header(&bytes, FileKind::Log), Ok(3));
        let mut r = FrameReader::new(
            Cursor::new(&bytes[HEADER_LEN..]),
            HEADER_LEN as u64,
            bytes.len() as u64,
        );
        let mut puts = 0;
        let mut end = None;
        while let Some(p) = r.next_frame().unwrap() {
            match ops(p).next() {
                Some(Ok(Op::Start(id))) => assert_eq!(id, [7; 16]),
                Some(Ok(Op::Put(_))) => puts += 1,
                Some(Ok(Op::End { records, atoms, .. })) => end = Some((records, atoms)),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(puts, n);
        assert_eq!(end, Some((n, 0)));
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_frame_that_ends_exactly_where_the_end_frame_starts_fits() {
        let path = temp_path("exact");
        let mut seg = Segment::create(&path, 1, MIN_CAPACITY, &[7; 16]).unwrap();
        // One frame sized to leave exactly the end frame's reserve.
        let room = seg.capacity() - seg.len() - END_RESERVE;
        let mut f = FrameBuf::new();
        let mut body = vec![5u8; room as usize];
        while {
            f.reset();
            f.push(Op::Put(&body));
            f.seal().unwrap().len() as u64 > room
        } {
            body.pop();
        }
        let frame = f.seal().unwrap().to_vec();
        assert_eq!(frame.len() as u64, room, "sized to the byte");
        assert!(seg.append(&frame, 1, 0, 0));
        assert!(!seg.fits(1));
        seg.seal();
        assert!(seg.len() <= seg.capacity());
        let len = seg.len();
        seg.finish(&Faults::default()).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len() as u64, len);
        let (frames, err) = {
            let mut r = FrameReader::new(Cursor::new(&bytes[HEADER_LEN..]), HEADER_LEN as u64, len);
            let mut v = Vec::new();
            let err = loop {
                match r.next_frame() {
                    Ok(Some(p)) => v.push(p.to_vec()),
                    Ok(None) => break None,
                    Err(e) => break Some(e),
                }
            };
            (v, err)
        };
        assert!(err.is_none());
        assert_eq!(frames.len(), 3, "start, the frame, end");
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn injected_faults_fire_once_after_their_count() {
        let f = Faults::default();
        f.eio_after.store(2, Ordering::Relaxed);
        assert!(!Faults::fire(&f.eio_after));
        assert!(Faults::fire(&f.eio_after));
        assert!(!Faults::fire(&f.eio_after));
        assert!(!Faults::fire(&f.enospc_after));
    }
}
