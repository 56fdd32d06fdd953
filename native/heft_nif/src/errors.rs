//! How NIFs fail. Bad arguments raise `ArgumentError` (built here as the
//! Elixir exception struct, so `rescue ArgumentError` and `assert_raise`
//! work and Erlang callers see the same reason as from any Elixir function);
//! I/O failures are returned as `{:error, posix_atom}`.

use std::cell::Cell;
use std::io;

use heft_core::table::Error as CoreError;
use rustler::{Encoder, Env, Error, Term};

mod atoms {
    rustler::atoms! {
        struct_ = "__struct__",
        exception = "__exception__",
        message,
        argument_error = "Elixir.ArgumentError",
        heft_cpu = "$heft_cpu",
        heft_io = "$heft_io",
        error,
        enospc,
        eio,
        enomem,
        eacces,
        enoent,
        eexist,
        enotdir,
        erofs,
        edquot,
        eloop,
        eperm,
        eisdir,
        einval,
        poisoned,
        memory_budget,
    }
}

/// An `ArgumentError` with this message.
struct ArgError(String);

impl Encoder for ArgError {
    fn encode<'a>(&self, env: Env<'a>) -> Term<'a> {
        let keys = [
            atoms::struct_().encode(env),
            atoms::exception().encode(env),
            atoms::message().encode(env),
        ];
        let values = [
            atoms::argument_error().encode(env),
            true.encode(env),
            self.0.encode(env),
        ];
        Term::map_from_term_arrays(env, &keys, &values).unwrap_or_else(|_| self.0.encode(env))
    }
}

/// Raises `ArgumentError` with `msg`.
pub fn badarg(msg: impl Into<String>) -> Error {
    Error::RaiseTerm(Box::new(ArgError(msg.into())))
}

/// The table does not exist (never did, or was deleted).
pub fn no_table() -> Error {
    badarg("the table identifier does not refer to an existing Heft table")
}

thread_local! {
    /// Set when a write failed because the table's log needs a new segment
    /// first (persist.rs): the write is retried on a dirty I/O scheduler.
    static WOULD_BLOCK: Cell<bool> = const { Cell::new(false) };
    /// Set when a quick (normal-scheduler) write was refused as too long
    /// (`heft_core::table::quick`): it is retried on a dirty CPU scheduler.
    static TOO_LONG: Cell<bool> = const { Cell::new(false) };
}

/// Maps a core error: a deleted table raises, I/O is returned. A write
/// that would block is noted for [`take_would_block`], one too long for a
/// quick call for [`take_too_long`].
pub fn core(e: CoreError) -> Error {
    match e {
        CoreError::Deleted => no_table(),
        CoreError::Io(e) => io_error(&e),
        CoreError::Poisoned => Error::Term(Box::new(atoms::poisoned())),
        CoreError::MemoryBudget => Error::Term(Box::new(atoms::memory_budget())),
        CoreError::WouldBlock => {
            WOULD_BLOCK.set(true);
            Error::Term(Box::new(atoms::heft_io()))
        }
        CoreError::TooLong => {
            TOO_LONG.set(true);
            Error::Term(Box::new(atoms::heft_cpu()))
        }
        _ => badarg(e.to_string()),
    }
}

/// True (once) if the last core error on this thread was `WouldBlock`.
pub fn take_would_block() -> bool {
    WOULD_BLOCK.replace(false)
}

/// True (once) if a core call on this thread was refused as `TooLong`
/// since the last check.
pub fn take_too_long() -> bool {
    TOO_LONG.replace(false)
}

/// `{:error, posix}` for an I/O error.
pub fn io_error(e: &io::Error) -> Error {
    Error::Term(Box::new(posix(e)))
}

/// The POSIX atom for an I/O error (`:eio` when unknown).
pub fn posix(e: &io::Error) -> rustler::Atom {
    match e.raw_os_error() {
        Some(libc::ENOSPC) => atoms::enospc(),
        Some(libc::ENOMEM) => atoms::enomem(),
        Some(libc::EACCES) => atoms::eacces(),
        Some(libc::ENOENT) => atoms::enoent(),
        Some(libc::EEXIST) => atoms::eexist(),
        Some(libc::ENOTDIR) => atoms::enotdir(),
        Some(libc::EROFS) => atoms::erofs(),
        Some(libc::EDQUOT) => atoms::edquot(),
        Some(libc::EINVAL) => atoms::einval(),
        Some(libc::ELOOP) => atoms::eloop(),
        Some(libc::EPERM) => atoms::eperm(),
        Some(libc::EISDIR) => atoms::eisdir(),
        _ => atoms::eio(),
    }
}

/// "Call the DirtyCpu variant": too much work for a normal scheduler.
pub fn retry_cpu(env: Env) -> Term {
    atoms::heft_cpu().encode(env)
}

/// True for the retry markers `:"$heft_cpu"` and `:"$heft_io"`.
pub fn is_retry(t: Term) -> bool {
    t == atoms::heft_cpu().encode(t.get_env()) || t == atoms::heft_io().encode(t.get_env())
}

/// "Call the DirtyIo variant": the table's arena is a file.
pub fn retry_io(env: Env) -> Term {
    atoms::heft_io().encode(env)
}
