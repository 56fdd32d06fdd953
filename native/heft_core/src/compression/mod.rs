//! Record bodies compressed one at a time (docs/term-format.md, "Records in
//! the arena").
//!
//! - [`compress`]: the codecs (raw deflate, lz4, zstd with or without a
//!   dictionary) and which one a body gets.
//! - [`deflate`]: Heft's raw-deflate encoder for short bodies.
//! - [`dict`]: a table's zstd dictionaries, trained from its own records.
//! - [`zblock`]: zstd frames without the fields Heft does not need.

pub mod compress;
pub mod deflate;
pub mod dict;
pub mod zblock;
