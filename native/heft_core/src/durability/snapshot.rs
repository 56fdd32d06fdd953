//! Writing a snapshot: a fuzzy copy of a live table, taken chunk by chunk
//! under the table's read lock, so writers keep going while it is written.
//! Layout in docs/persistence-format.md ("Snapshot"); loading is in
//! recovery.rs.
//!
//! Why a fuzzy copy is exact: the dump first starts a new log segment S,
//! then walks the table. A record not changed after S began is visited
//! once, with its value (the walk visits every record present for its whole
//! length); a record changed after S began is fixed by replaying S and
//! later segments over the snapshot, since each logged change writes or
//! removes a whole record. The atom dictionary is written after the records,
//! so it names every atom they use. The zstd dictionaries come before the
//! records that may use them: those the table has when the walk starts
//! first, then, before each chunk's records, any added since (a dictionary
//! is added before a record is compressed with it, so before the chunk
//! holding that record is copied).

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::os::fd::AsRawFd;
use std::path::Path;

use crate::files::Temp;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::table::{Error as TableError, RecordBuf, Table};
use crate::wal::{self, FileKind, FrameBuf, Op};

/// The current snapshot's file name.
pub const SNAPSHOT: &str = "snapshot";

/// Payload bytes per frame the writer aims for.
const FRAME_TARGET: usize = 256 * 1024;
/// Records copied per hold of the table's read lock.
const CHUNK_RECORDS: usize = 512;
/// Writeback is started every this many bytes, and the dumper waits for
/// the window before the last to reach the disk: at most two windows of
/// the snapshot are dirty or in flight at once, so the dump never pushes
/// the machine to its dirty-page limit (where the kernel would stall
/// every process that dirties a page, the log's writers among them) and
/// the final fsync is short.
const WRITEBACK_EVERY: u64 = 16 << 20;

/// What a finished snapshot holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Written {
    /// Records copied.
    pub records: u64,
    /// Atoms in its dictionary.
    pub atoms: u64,
    /// zstd dictionaries.
    pub dicts: u64,
    /// Bytes of the file.
    pub bytes: u64,
}

/// Why a snapshot was not written.
#[derive(Debug)]
pub enum SnapshotError {
    /// Asked to stop (the table is closing).
    Stopped,
    /// The table was deleted meanwhile.
    Deleted,
    /// I/O failed (`ENOSPC`...).
    Io(io::Error),
}

impl From<io::Error> for SnapshotError {
    fn from(e: io::Error) -> Self {
        SnapshotError::Io(e)
    }
}

pub use crate::files::sync_dir;

/// Writes a snapshot of `table` that says "replay from segment
/// `replay_from"` (and belongs to table `id`) to a temporary file
/// `dir/snapshot.tmp-<random>`, fsyncs it, renames it to `dir/snapshot`
/// and fsyncs `dir`. On any failure the temporary file is removed and the
/// old snapshot is untouched.
pub fn write(
    dir: &Path,
    table: &Table,
    replay_from: u64,
    id: &wal::TableId,
    stop: &AtomicBool,
) -> Result<Written, SnapshotError> {
    let tmp = Temp::new(&dir.join(SNAPSHOT), crate::files::FILE_MODE)?;
    let written = write_tmp(tmp.file(), table, replay_from, id, stop)?;
    tmp.commit(true)?;
    Ok(written)
}

fn write_tmp(
    file: &File,
    table: &Table,
    replay_from: u64,
    id: &wal::TableId,
    stop: &AtomicBool,
) -> Result<Written, SnapshotError> {
    let mut out = Out {
        w: BufWriter::with_capacity(1 << 20, file),
        file,
        bytes: 0,
        flushed: 0,
        waited: 0,
    };
    out.put(&wal::header(FileKind::Snapshot, replay_from))?;
    out.put(&wal::start_frame(id))?;
    let mut frame = FrameBuf::new();
    let mut buf = RecordBuf::new();
    let mut cursor = None;
    let mut records = 0u64;
    let mut dicts = 0usize;
    dicts_since(table, &mut dicts, &mut frame, &mut out)?;
    loop {
        if stop.load(Ordering::Relaxed) {
            return Err(SnapshotError::Stopped);
        }
        buf.clear();
        let next = match table.chunk(cursor.as_ref(), CHUNK_RECORDS, usize::MAX, &mut buf) {
            Ok(next) => next,
            Err(TableError::Io(e)) => return Err(e.into()),
            Err(_) => return Err(SnapshotError::Deleted),
        };
        // Dictionaries the chunk's records may use, not yet written.
        dicts_since(table, &mut dicts, &mut frame, &mut out)?;
        for it in buf.items() {
            frame.push(Op::Put(buf.record(it)));
            records += 1;
            if frame.payload_len() >= FRAME_TARGET {
                out.frame(&mut frame)?;
            }
        }
        match next {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    // Any dictionary added since the last chunk: the snapshot holds every
    // dictionary the table had when the walk ended.
    dicts_since(table, &mut dicts, &mut frame, &mut out)?;
    out.frame(&mut frame)?;
    let names: Vec<Box<str>> = {
        let atoms = table.atoms().read();
        (0..atoms.len() as u32)
            .filter_map(|id| atoms.name(id).map(Box::from))
            .collect()
    };
    for (id, name) in names.iter().enumerate() {
        frame.push(Op::Atom {
            id: id as u64,
            name: name.as_bytes(),
        });
        if frame.payload_len() >= FRAME_TARGET {
            out.frame(&mut frame)?;
        }
    }
    out.frame(&mut frame)?;
    let atoms = names.len() as u64;
    let dicts = dicts as u64;
    frame.push(Op::End {
        records,
        atoms,
        dicts,
    });
    out.frame(&mut frame)?;
    out.w.flush()?;
    drop(out.w);
    Ok(Written {
        records,
        atoms,
        dicts,
        bytes: out.bytes,
    })
}

/// Pushes the table's dictionaries with ids above `*written` (each in a
/// frame of its own, after the frame being built), and notes them written.
fn dicts_since(
    table: &Table,
    written: &mut usize,
    frame: &mut FrameBuf,
    out: &mut Out<'_>,
) -> io::Result<()> {
    let new = table.dictionaries().since(*written);
    if new.is_empty() {
        return Ok(());
    }
    out.frame(frame)?;
    for d in &new {
        frame.push(Op::Dict {
            id: u64::from(d.id()),
            bytes: d.bytes(),
        });
        out.frame(frame)?;
    }
    *written += new.len();
    Ok(())
}

struct Out<'f> {
    w: BufWriter<&'f File>,
    file: &'f File,
    bytes: u64,
    /// Bytes handed to writeback so far; bytes known to be on disk.
    flushed: u64,
    waited: u64,
}

impl Out<'_> {
    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.w.write_all(bytes)?;
        self.bytes += bytes.len() as u64;
        if self.bytes - self.flushed >= WRITEBACK_EVERY {
            self.w.flush()?;
            // Start the new window; wait for the one before it.
            writeback(self.file, self.flushed, self.bytes - self.flushed, false);
            writeback(self.file, self.waited, self.flushed - self.waited, true);
            self.waited = self.flushed;
            self.flushed = self.bytes;
        }
        Ok(())
    }

    /// Writes the frame if it holds anything, and resets it.
    fn frame(&mut self, frame: &mut FrameBuf) -> io::Result<()> {
        if frame.ops() == 0 {
            return Ok(());
        }
        let sealed = frame
            .seal()
            .ok_or_else(|| io::Error::other("snapshot frame over 4 GiB"))?;
        let written = self.put(sealed);
        frame.reset();
        written
    }
}

/// Asks the kernel to start writing a range of the file's dirty pages, or
/// (`wait`) to write them and wait until they are on disk. Pacing only: the
/// final fsync is what makes the snapshot durable.
fn writeback(file: &File, offset: u64, len: u64, wait: bool) {
    if len == 0 {
        return;
    }
    let flags = if wait {
        libc::SYNC_FILE_RANGE_WAIT_BEFORE
            | libc::SYNC_FILE_RANGE_WRITE
            | libc::SYNC_FILE_RANGE_WAIT_AFTER
    } else {
        libc::SYNC_FILE_RANGE_WRITE
    };
    // SAFETY: sync_file_range only acts on the descriptor, which `file`
    // keeps open; its result is advisory here and ignored.
    unsafe {
        libc::sync_file_range(file.as_raw_fd(), offset as i64, len as i64, flags);
    }
}
