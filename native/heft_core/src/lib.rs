//! Heft's storage engine, in plain Rust (no rustler), so that it can be unit
//! tested, benchmarked and fuzzed without a VM.
//!
//! - [`codec`]: the Heft term format (docs/term-format.md).
//! - [`compress`]: per-record raw deflate; [`deflate`]: the encoder for
//!   short bodies.
//! - [`record`]: a record's header, key and body in the arena.
//! - [`arena`]: the mmap'd region and its size-class allocator.
//! - [`index`]: the hash index, sorted by hash so walks can resume.
//! - [`order`]: Erlang term order over encoded keys.
//! - [`ordered`]: the ordered index of ordered_set tables.
//! - [`etf`]: the external-term-format pieces keys embed (pids, funs...).
//! - [`table`]: a table of any ETS kind: index + arena behind one lock.
//! - [`atoms`]: a table's atom dictionary.
//! - [`accounting`]: the kernel's view of a mapping (smaps).

pub mod accounting;
pub mod arena;
pub mod atoms;
pub mod codec;
pub mod compress;
pub mod deflate;
pub mod etf;
pub mod index;
pub mod order;
pub mod ordered;
pub mod record;
pub mod table;
#[cfg(test)]
mod test_rng;

pub use arena::Backing;
pub use compress::Compression;
pub use table::{Cursor, Options, Prepared, RecordBuf, Stats, Table};
