//! File-system help for tab2file (lib/heft/tab_file.ex, format in
//! docs/tab-file.md), which does its own I/O through Erlang's raw files:
//! only what Erlang cannot do is here.

use rustler::{Encoder, Env, Term};

use crate::errors::posix;

mod atoms {
    rustler::atoms! { ok, error }
}

/// fsyncs a directory, so that a file just renamed into it survives a
/// crash (Erlang's file module cannot open a directory). `:ok` or
/// `{:error, posix}`.
#[rustler::nif(schedule = "DirtyIo")]
fn fsync_dir(env: Env, path: String) -> Term {
    match std::fs::File::open(&path).and_then(|dir| dir.sync_all()) {
        Ok(()) => atoms::ok().encode(env),
        Err(e) => (atoms::error(), posix(&e)).encode(env),
    }
}
