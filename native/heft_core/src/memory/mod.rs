//! What memory costs, and what it will.
//!
//! - [`accounting`]: the kernel's view of a mapping (smaps).
//! - [`sizing`]: what records like some samples take with each codec.

pub mod accounting;
pub mod sizing;
