//! A table in memory: records in an arena, found through an index.
//!
//! - [`record`]: a record's header, key and body as the arena holds them.
//! - [`arena`]: the mmap'd region and its size-class allocator (memory or
//!   file backed), with compaction.
//! - [`index`]: the hash index of sets and bags, sorted by hash so walks
//!   resume; [`hash`]: its keyed key hash.
//! - [`ordered`]: the ordered index of ordered_set tables.
//! - [`table`]: a table of any ETS kind: index and arena behind one lock.
//! - [`sieve`]: a match specification's heads and guards tested on stored
//!   records.

pub mod arena;
pub mod hash;
pub mod index;
pub mod ordered;
pub mod record;
pub mod sieve;
pub mod table;
