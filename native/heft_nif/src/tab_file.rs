//! File-system help for tab2file (lib/heft/tab_file.ex, format in
//! docs/tab-file.md): the file is written through a temporary file that
//! Erlang's file module cannot make safely (created exclusively under an
//! unpredictable name, never through a link, mode 0600 or the caller's),
//! then fsynced and renamed over the destination (heft_core's files.rs);
//! and the table's zstd dictionaries, which the file carries so that the
//! table file2tab makes compresses as the one written did.

use std::io::{BufWriter, Write};
use std::sync::Mutex;

use heft_core::files::Temp;
use rustler::{Binary, Encoder, Env, NifResult, OwnedBinary, Resource, ResourceArc, Term};

use crate::errors::{badarg, posix};
use crate::ops::resolve;

mod atoms {
    rustler::atoms! { ok, error, closed }
}

/// The table's zstd dictionaries as trained, by id (1, 2, ...). Dirty:
/// each may be up to 1 MiB.
#[rustler::nif(schedule = "DirtyCpu")]
fn tab_dictionaries<'a>(env: Env<'a>, tab: Term<'a>) -> NifResult<Vec<Binary<'a>>> {
    let t = resolve(tab)?;
    if !t.may_read(env) {
        return Err(badarg("the table is private to another process"));
    }
    let mut out = Vec::new();
    for d in t.core.dictionaries().all() {
        let mut b = OwnedBinary::new(d.bytes().len());
        b.as_mut_slice().copy_from_slice(d.bytes());
        out.push(b.release(env));
    }
    Ok(out)
}

/// Adds `bytes` as the table's next zstd dictionary and makes it the one
/// new writes use (file2tab, before it inserts the objects). Dirty: zstd
/// digests the dictionary. Badarg if the caller may not write, or zstd
/// refuses the bytes.
#[rustler::nif(schedule = "DirtyCpu")]
fn tab_add_dictionary<'a>(env: Env<'a>, tab: Term<'a>, bytes: Binary<'a>) -> NifResult<Term<'a>> {
    let t = resolve(tab)?;
    if !t.may_write(env) {
        return Err(badarg("the caller may not write to the table"));
    }
    let dicts = t.core.dictionaries();
    let d = dicts
        .add(bytes.as_slice())
        .map_err(|e| badarg(format!("dictionary: {e}")))?;
    dicts.set_current(d.id());
    Ok(atoms::ok().encode(env))
}

/// A table file being written: its temporary file, buffered. Dropping it
/// uncommitted (an error, or its process died) removes the file.
pub struct TmpFile(Mutex<Option<BufWriter<TempFile>>>);

/// [`Temp`] as a writer.
struct TempFile(Temp);

impl Write for TempFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.file().write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[rustler::resource_impl]
impl Resource for TmpFile {}

fn result<'a>(env: Env<'a>, r: std::io::Result<()>) -> Term<'a> {
    match r {
        Ok(()) => atoms::ok().encode(env),
        Err(e) => (atoms::error(), posix(&e)).encode(env),
    }
}

/// Creates the temporary file for `dest` with `mode`: `{:ok, ref}` or
/// `{:error, posix}`.
#[rustler::nif(schedule = "DirtyIo")]
fn tmp_create(env: Env, dest: String, mode: u32) -> Term {
    match Temp::new(std::path::Path::new(&dest), mode & 0o7777) {
        Ok(t) => {
            let w = BufWriter::with_capacity(1 << 18, TempFile(t));
            let res = ResourceArc::new(TmpFile(Mutex::new(Some(w))));
            (atoms::ok(), res).encode(env)
        }
        Err(e) => (atoms::error(), posix(&e)).encode(env),
    }
}

/// Appends `bytes`.
#[rustler::nif(schedule = "DirtyIo")]
fn tmp_write<'a>(env: Env<'a>, res: ResourceArc<TmpFile>, bytes: Binary) -> Term<'a> {
    let mut w = res.0.lock().unwrap_or_else(|e| e.into_inner());
    let r = match w.as_mut() {
        Some(w) => w.write_all(bytes.as_slice()),
        None => return (atoms::error(), atoms::closed()).encode(env),
    };
    result(env, r)
}

/// Finishes the file: with `commit`, flushes it, fsyncs it (if `sync`),
/// renames it over its destination (replacing a link there, never writing
/// through it) and fsyncs the directory (if `sync`); without, removes it.
#[rustler::nif(schedule = "DirtyIo")]
fn tmp_finish(env: Env, res: ResourceArc<TmpFile>, commit: bool, sync: bool) -> Term {
    let w = res.0.lock().unwrap_or_else(|e| e.into_inner()).take();
    let Some(w) = w else {
        return (atoms::error(), atoms::closed()).encode(env);
    };
    if !commit {
        drop(w);
        return atoms::ok().encode(env);
    }
    let r = w
        .into_inner()
        .map_err(|e| e.into_error())
        .and_then(|TempFile(t)| t.commit(sync));
    result(env, r)
}
