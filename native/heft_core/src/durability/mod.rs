//! Persistent tables: a write-ahead log with group commit, Mnesia-style
//! dumps, and recovery (docs/persistence-format.md).
//!
//! - [`persist`]: a persistent table's log, its sync modes and its dumps.
//! - [`wal`]: log segments and their frames.
//! - [`snapshot`]: writing a dump.
//! - [`recovery`]: opening a table: the snapshot, then the log.
//! - [`crc`]: the checksum of every frame.
//! - [`files`]: how Heft creates and opens files (no links followed,
//!   exclusive random-named temporaries, private modes).

pub mod crc;
pub mod files;
pub mod persist;
pub mod recovery;
pub mod snapshot;
pub mod wal;
