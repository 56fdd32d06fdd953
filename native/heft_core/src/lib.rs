//! Heft's storage engine, in plain Rust (no rustler), so that it can be unit
//! tested, benchmarked and fuzzed without a VM.
//!
//! - [`codec`]: the Heft term format (docs/term-format.md).
//! - [`compress`]: per-record raw deflate; [`deflate`]: the encoder for
//!   short bodies.
//! - [`record`]: a record's header, key and body in the arena.
//! - [`arena`]: the mmap'd region and its size-class allocator.
//! - [`index`]: the hash index, sorted by hash so walks can resume;
//!   [`hash`]: its keyed key hash.
//! - [`order`]: Erlang term order over encoded keys; [`etf`]: the
//!   external-term-format pieces keys embed (pids, funs...).
//! - [`ordered`]: the ordered index of ordered_set tables.
//! - [`table`]: a table of any ETS kind: index + arena behind one lock.
//! - [`atoms`]: a table's atom dictionary.
//! - [`accounting`]: the kernel's view of a mapping (smaps).
//! - [`persist`]: persistent tables: write-ahead log, group commit, dumps
//!   ([`wal`] frames, [`snapshot`] writing, [`recovery`] loading, [`crc`]);
//!   formats in docs/persistence-format.md.
//! - [`sizing`]: what records like some samples take with each codec.
//! - [`files`]: how Heft creates and opens its files (no links followed,
//!   exclusive random-named temporaries, private modes).

pub mod accounting;
pub mod arena;
pub mod atoms;
pub mod codec;
pub mod compress;
pub mod crc;
pub mod dedup;
pub mod deflate;
pub mod dict;
pub mod etf;
pub mod files;
pub mod hash;
pub mod index;
pub mod order;
pub mod ordered;
pub mod persist;
pub mod record;
pub mod recovery;
pub mod sieve;
pub mod sizing;
pub mod snapshot;
pub mod table;
#[cfg(test)]
mod testutil;
pub mod wal;
pub mod zblock;

pub use arena::Backing;
pub use compress::Compression;
pub use table::{Cursor, Options, Prepared, RecordBuf, Stats, Table};
