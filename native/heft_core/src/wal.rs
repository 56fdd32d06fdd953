//! The on-disk framing shared by log segments, snapshots and the META file:
//! a checksummed file header, then checksummed frames holding operations.
//! The format is specified in docs/persistence-format.md; this module is its
//! only implementation, and the offsets below are derived from the sizes
//! there. Everything is little-endian.
//!
//! Writing: [`FrameBuf`] collects the operations of one frame and seals it
//! with its length and CRC; [`Segment`] appends sealed frames to a log file.
//! Reading: [`FrameReader`] yields frames one at a time (streaming, one
//! frame in memory) and tells a torn tail from damage in the middle.

use std::fs::File;
use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::codec::{put_varint, Reader};
use crate::crc;

/// Version written in every file header; readers refuse newer ones.
pub const VERSION: u32 = 1;

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
}

impl FileKind {
    fn magic(self) -> &'static [u8; MAGIC_LEN] {
        match self {
            FileKind::Log => b"HEFTLOG\n",
            FileKind::Snapshot => b"HEFTSNP\n",
            FileKind::Meta => b"HEFTMTA\n",
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
    Ok(u64::from_le_bytes(seq))
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
    /// A snapshot's last operation: how many records and atoms it holds.
    End { records: u64, atoms: u64 },
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
            Op::End { records, atoms } => {
                out.push(tag::END);
                put_varint(out, records);
                put_varint(out, atoms);
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
            },
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
    /// The file ends inside a frame, or its last frame fails its checksum,
    /// or only zeros follow: what a crash during an append leaves.
    Torn,
    /// A frame that fails its checksum or does not parse, with more data
    /// after it.
    Corrupt,
}

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
            payload: Vec::new(),
        }
    }

    /// Offset of the next frame (after the last one returned).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The next frame's payload, `Ok(None)` at the end of the file.
    pub fn next_frame(&mut self) -> Result<Option<&[u8]>, FrameError> {
        let at = self.offset;
        let left = self.len.saturating_sub(at);
        if left == 0 {
            return Ok(None);
        }
        if left < FRAME_HEADER_LEN as u64 {
            return Err(FrameError::Damaged(Damage::Torn, at));
        }
        let mut head = [0u8; FRAME_HEADER_LEN];
        self.inner.read_exact(&mut head).map_err(FrameError::Io)?;
        let len = u64::from(u32::from_le_bytes(le4(&head)));
        let stored = u32::from_le_bytes(le4(&head[FRAME_CRC_OFFSET..]));
        let end = at + FRAME_HEADER_LEN as u64 + len;
        if end > self.len {
            // The frame runs past the end: torn while it was appended.
            return Err(FrameError::Damaged(Damage::Torn, at));
        }
        let n = len as usize;
        if len == 0 {
            return Err(self.classify(at, &head, &[]));
        }
        self.payload.clear();
        self.payload.resize(n, 0);
        self.inner
            .read_exact(&mut self.payload)
            .map_err(FrameError::Io)?;
        let c = crc::extend(crc::crc32c(&head[..FRAME_CRC_OFFSET]), &self.payload);
        if c != stored {
            let payload = std::mem::take(&mut self.payload);
            let e = self.classify(at, &head, &payload);
            self.payload = payload;
            return Err(e);
        }
        self.offset = end;
        Ok(Some(&self.payload))
    }

    /// A damaged frame at `at` is a torn tail if it is the file's last
    /// bytes, or if nothing but zeros follows it; otherwise corruption.
    fn classify(&mut self, at: u64, head: &[u8], payload: &[u8]) -> FrameError {
        let end = at + (head.len() + payload.len()) as u64;
        if end == self.len {
            return FrameError::Damaged(Damage::Torn, at);
        }
        let zeros_so_far = head.iter().chain(payload).all(|&b| b == 0);
        if !zeros_so_far {
            return FrameError::Damaged(Damage::Corrupt, at);
        }
        let mut rest = [0u8; 64 * 1024];
        loop {
            match self.inner.read(&mut rest) {
                Ok(0) => return FrameError::Damaged(Damage::Torn, at),
                Ok(n) if rest[..n].iter().all(|&b| b == 0) => continue,
                Ok(_) => return FrameError::Damaged(Damage::Corrupt, at),
                Err(e) => return FrameError::Io(e),
            }
        }
    }
}

/// Faults a test can make a segment suffer (also reachable from ExUnit
/// through a debug NIF, hence not `cfg(test)`).
#[derive(Default)]
pub struct Faults {
    /// Appends left before one fails with ENOSPC (0: none planned).
    pub enospc_after: AtomicU64,
    /// Syncs left before one fails with EIO (0: none planned).
    pub eio_after: AtomicU64,
}

impl Faults {
    /// True when the counter was armed and has just run out.
    fn fire(counter: &AtomicU64) -> bool {
        counter
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| match n {
                0 => None,
                n => Some(n - 1),
            })
            .is_ok_and(|n| n == 1)
    }
}

/// A log segment open for appending.
pub struct Segment {
    /// Its sequence number (`wal-<seq>`).
    pub seq: u64,
    file: Arc<File>,
    /// Bytes in the file: header plus whole frames.
    len: u64,
}

impl Segment {
    /// Wraps a file that holds `len` valid bytes (a header at least).
    pub fn new(seq: u64, file: File, len: u64) -> Segment {
        Segment {
            seq,
            file: Arc::new(file),
            len,
        }
    }

    /// The file, for syncing outside the log's lock.
    pub fn file(&self) -> &Arc<File> {
        &self.file
    }

    /// Bytes in the file.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True when it holds no frame yet.
    pub fn is_empty(&self) -> bool {
        self.len <= HEADER_LEN as u64
    }

    /// Appends a sealed frame with write(2). On failure the file is cut
    /// back to where it was, so a failed append leaves no partial frame;
    /// if even that fails the error says so (`cut_failed`), and the caller
    /// must stop writing to this log.
    pub fn append(&mut self, frame: &[u8], faults: &Faults) -> Result<(), AppendError> {
        let res = if Faults::fire(&faults.enospc_after) {
            Err(io::Error::from_raw_os_error(libc::ENOSPC))
        } else {
            (&*self.file).write_all(frame)
        };
        match res {
            Ok(()) => {
                self.len += frame.len() as u64;
                Ok(())
            }
            Err(e) => {
                let cut_failed = self.file.set_len(self.len).is_err();
                Err(AppendError {
                    error: e,
                    cut_failed,
                })
            }
        }
    }
}

/// Why an append failed.
#[derive(Debug)]
pub struct AppendError {
    /// The write's error.
    pub error: io::Error,
    /// The partial frame could not be cut off again.
    pub cut_failed: bool,
}

/// fdatasync, or the injected failure.
pub fn sync_data(file: &File, faults: &Faults) -> io::Result<()> {
    if Faults::fire(&faults.eio_after) {
        return Err(io::Error::from_raw_os_error(libc::EIO));
    }
    file.sync_data()
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
    fn zeros_after_the_last_frame_are_a_torn_tail() {
        let mut bytes = frames(&[&[Op::Put(b"aaaa")]]);
        bytes.extend_from_slice(&[0u8; 100_000]);
        let (got, err) = read_all(&bytes);
        assert_eq!(got.len(), 1);
        assert!(matches!(err, Some(FrameError::Damaged(Damage::Torn, _))));
        // Zeros, then data: corruption.
        let n = bytes.len();
        bytes[n - 3] = 9;
        let (_, err) = read_all(&bytes);
        assert!(matches!(err, Some(FrameError::Damaged(Damage::Corrupt, _))));
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
