//! Times reopening a persistent table without a VM, for profiling recovery
//! (`perf record -g target/release/examples/reopen DIR`):
//!
//!     cargo run --release -p heft_core --example reopen -- DIR [RECORDS] [REPS]
//!
//! Fills DIR with RECORDS small map records (the bench's
//! `{i, %{id: i, name: "user-i", age: i % 90}}`) and dumps it if DIR holds
//! no table yet, then opens it REPS times.

use std::path::PathBuf;
use std::time::Instant;

use heft_core::codec::{Value, Writer};
use heft_core::persist::{Config, Event, Events, Failure, Persisted};
use heft_core::{Backing, Compression, Options};

struct NoEvents;

impl Events for NoEvents {
    type Waiter = std::sync::mpsc::Sender<()>;
    fn done(&self, waiters: Vec<Self::Waiter>, _: Result<(), Failure>) {
        for w in waiters {
            let _ = w.send(());
        }
    }
    fn notify(&self, _: Event) {}
}

fn small(i: i64) -> (Vec<u8>, Vec<u8>) {
    let mut w = Writer::new();
    w.tuple(2);
    w.key();
    Value::Map(vec![
        (Value::Atom(0), Value::Int(i % 90)),
        (Value::Atom(1), Value::Int(i)),
        (
            Value::Atom(2),
            Value::Binary(format!("user-{i}").into_bytes()),
        ),
    ])
    .encode(&mut w);
    (Value::Int(i).to_bytes(), w.buf)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().expect("usage: reopen DIR [RECORDS] [REPS]"));
    let n: i64 = args
        .next()
        .map_or(1_000_000, |s| s.parse().expect("RECORDS"));
    let reps: usize = args.next().map_or(5, |s| s.parse().expect("REPS"));
    let opts = Options {
        backing: Backing::Memory,
        compression: Compression::Zlib(1),
        label: "reopen".into(),
        kind: heft_core::table::Kind::Set,
    };
    let config = Config::default();
    if !dir.join("META").exists() {
        let o = Persisted::open(&dir, b"meta", true, &opts, config, NoEvents).expect("create");
        {
            let mut atoms = o.table.atoms().write();
            for a in ["age", "id", "name"] {
                atoms.intern(a);
            }
        }
        for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
            let recs: Vec<_> = chunk
                .iter()
                .map(|&i| {
                    let (k, b) = small(i);
                    o.table.prepare(&k, &b)
                })
                .collect();
            o.table.insert(&recs).expect("insert");
        }
        let (tx, rx) = std::sync::mpsc::channel();
        o.persisted.request_dump(Some(tx)).expect("dump");
        rx.recv().expect("dump done");
        o.table.take_storage();
        o.persisted.close().expect("close");
    }
    for _ in 0..reps {
        let c0 = cpu_ms();
        let t0 = Instant::now();
        let o = Persisted::open(&dir, b"meta", false, &opts, config, NoEvents).expect("open");
        let ms = t0.elapsed().as_secs_f64() * 1000.0;
        let cpu = cpu_ms() - c0;
        let len = o.table.len().expect("len");
        println!("open {ms:.1} ms wall, {cpu:.1} ms cpu, {len} records");
        o.table.take_storage();
        o.persisted.close().expect("close");
    }
}

/// CPU time of this process so far (user and system), in milliseconds.
fn cpu_ms() -> f64 {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes a rusage into the pointer it is given.
    let ru = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr());
        ru.assume_init()
    };
    let ms = |t: libc::timeval| t.tv_sec as f64 * 1000.0 + t.tv_usec as f64 / 1000.0;
    ms(ru.ru_utime) + ms(ru.ru_stime)
}
