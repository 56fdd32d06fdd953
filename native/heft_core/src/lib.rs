//! Heft's storage engine, in plain Rust (no rustler), so that it can be unit
//! tested, benchmarked and fuzzed without a VM.
//!
//! The modules are grouped by layer, each a folder:
//!
//! - format: the term format ([`codec`], [`dedup`],
//!   [`etf`], [`order`], [`atoms`]);
//! - compression: [`compress`], [`deflate`], [`dict`], [`zblock`];
//! - storage: [`record`], [`arena`], [`index`], [`hash`], [`ordered`],
//!   [`table`], [`sieve`];
//! - durability: [`persist`], [`wal`], [`snapshot`], [`recovery`],
//!   [`crc`], [`files`];
//! - memory: [`accounting`], [`sizing`].
//!
//! Each folder's `mod.rs` says what its modules do. The NIF, the benches
//! and the fuzz targets use the modules by the names below.

mod compression;
mod durability;
mod format;
mod memory;
mod storage;
#[cfg(test)]
mod testutil;

pub use compression::{compress, deflate, dict, zblock};
pub use durability::{crc, files, persist, recovery, snapshot, wal};
pub use format::{atoms, codec, dedup, etf, order};
pub use memory::{accounting, sizing};
pub use storage::{arena, hash, index, ordered, record, sieve, table};

pub use arena::Backing;
pub use compress::Compression;
pub use table::{Cursor, Options, Prepared, RecordBuf, Stats, Table};
