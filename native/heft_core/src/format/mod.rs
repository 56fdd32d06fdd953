//! The term format: how one Erlang term becomes bytes, and how those bytes
//! compare, without the VM (docs/term-format.md).
//!
//! - [`codec`]: the Heft term format itself, its writer and decoder.
//! - [`dedup`]: equal compound parts of an object written once.
//! - [`etf`]: the external-term-format pieces a term may embed (pids,
//!   funs, big integers...).
//! - [`order`]: Erlang term order over encoded keys.
//! - [`atoms`]: a table's atom dictionary (atoms are stored as its ids).

pub mod atoms;
pub mod codec;
pub mod dedup;
pub mod etf;
pub mod order;
