//! Criterion benchmarks of term order and the ordered_set index:
//! `cargo bench -p heft_core --bench order`.
//!
//! - `compare`: one comparison of two encoded keys, by key shape.
//! - `ordered index`: the index alone, keys standing in for themselves (no
//!   arena), so the structure's own cost shows.
//! - `table`: ordered_set against set with 1,000,000 integer keys, keys read
//!   from the arena and compared in term order: what a lookup costs in
//!   core, before the NIF decodes anything.

use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion};
use heft_core::codec::Value;
use heft_core::compress::Compression;
use heft_core::order::compare;
use heft_core::ordered::{OrderedIndex, Probe};
use heft_core::table::{Direction, Kind, Options, RecordBuf, Table};
use heft_core::Backing;

/// A pid from another node, as `term_to_binary/1` writes it.
fn pid(id: u32, serial: u32) -> Value {
    let mut b = vec![131, 88, 119, 8];
    b.extend_from_slice(b"node@box");
    b.extend_from_slice(&id.to_be_bytes());
    b.extend_from_slice(&serial.to_be_bytes());
    b.extend_from_slice(&1u32.to_be_bytes());
    Value::Etf(b)
}

/// 2^64 + 1 as a big integer piece.
fn big() -> Value {
    Value::Etf(vec![131, 110, 9, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1])
}

fn comparator(c: &mut Criterion) {
    let mut g = c.benchmark_group("compare");
    let names = ["user", "order", "item"];
    let name = |id: u32| names[id as usize];
    let cases: Vec<(&str, Value, Value)> = vec![
        ("integers", Value::Int(1_000_001), Value::Int(1_000_002)),
        ("equal integers", Value::Int(42), Value::Int(42)),
        (
            "16-byte binaries",
            Value::Binary(b"user:0000000001a".to_vec()),
            Value::Binary(b"user:0000000001b".to_vec()),
        ),
        (
            "{atom, int} by atom name",
            Value::Tuple(vec![Value::Atom(0), Value::Int(7)]),
            Value::Tuple(vec![Value::Atom(1), Value::Int(7)]),
        ),
        (
            "{int, float} equal by ==",
            Value::Tuple(vec![Value::Int(3), Value::Float(1.0)]),
            Value::Tuple(vec![Value::Float(3.0), Value::Int(1)]),
        ),
        ("bignum vs float", big(), Value::Float(1.8e19)),
        ("pids", pid(120, 0), pid(121, 0)),
        (
            "charlists of different lengths",
            Value::List(
                b"order-17"
                    .iter()
                    .map(|&c| Value::Int(i64::from(c)))
                    .collect(),
                Box::new(Value::Nil),
            ),
            Value::List(
                b"order-170"
                    .iter()
                    .map(|&c| Value::Int(i64::from(c)))
                    .collect(),
                Box::new(Value::Nil),
            ),
        ),
        (
            "3-key maps",
            Value::Map(vec![
                (Value::Atom(0), Value::Int(1)),
                (Value::Atom(1), Value::Int(2)),
                (Value::Atom(2), Value::Int(3)),
            ]),
            Value::Map(vec![
                (Value::Atom(0), Value::Int(1)),
                (Value::Atom(1), Value::Int(2)),
                (Value::Atom(2), Value::Int(4)),
            ]),
        ),
    ];
    for (label, a, b) in &cases {
        let (a, b) = (a.to_bytes(), b.to_bytes());
        g.bench_function(*label, |bench| {
            bench.iter(|| compare(black_box(&a), black_box(&b), name))
        });
    }
    g.finish();
}

fn index(c: &mut Criterion) {
    let mut g = c.benchmark_group("ordered index");
    g.sample_size(10);
    let n = 1_000_000u64;
    // Keys in a scattered order; loc = key * 2 + 1 (never 0).
    let key = |i: u64| i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 24;
    // No prefixes: every step calls `cmp` (the index's own cost; the
    // table benches below measure it with prefixes).
    let cmp = |k: u64| Probe {
        prefix: None,
        cmp: move |loc: u64| (loc / 2).cmp(&k),
    };
    let mut ix = OrderedIndex::new("bench");
    for i in 0..n {
        let k = key(i);
        ix.insert(k * 2 + 1, cmp(k));
    }
    g.bench_function("insert 1M keys (scattered)", |b| {
        b.iter_batched(
            || OrderedIndex::new("bench"),
            |mut ix| {
                for i in 0..n {
                    let k = key(i);
                    ix.insert(k * 2 + 1, cmp(k));
                }
                ix
            },
            BatchSize::PerIteration,
        )
    });
    g.sample_size(100);
    g.bench_function("find in 1M keys", |b| {
        let mut i = 0u64;
        b.iter(|| {
            i = (i + 7919) % n;
            ix.find(cmp(key(i)))
        })
    });
    println!(
        "ordered index of {} keys: {} bytes, {:.1} a key",
        ix.len(),
        ix.heap_bytes(),
        ix.heap_bytes() as f64 / ix.len() as f64
    );
    g.finish();
}

fn table_of(kind: Kind) -> Table {
    Table::new(&Options {
        backing: Backing::Memory,
        compression: Compression::None,
        label: "bench".into(),
        kind,
    })
    .unwrap()
}

fn tables(c: &mut Criterion) {
    let mut g = c.benchmark_group("table");
    let n = 1_000_000i64;
    let keys: Vec<Vec<u8>> = (0..n)
        .map(|i| Value::Int(i.wrapping_mul(7919) % 10_000_019).to_bytes())
        .collect();
    let body = Value::Tuple(vec![Value::Int(0), Value::Binary(vec![b'x'; 20])]).to_bytes();
    for kind in [Kind::Set, Kind::OrderedSet] {
        let t = table_of(kind);
        let recs: Vec<_> = keys.iter().map(|k| t.prepare(k, &body)).collect();
        t.insert(&recs).unwrap();
        let s = t.stats().unwrap();
        println!(
            "{kind:?} of {} records: index {} bytes ({:.1} a record), arena used {} bytes",
            s.size,
            s.index_bytes,
            s.index_bytes as f64 / s.size as f64,
            s.arena_used_bytes
        );
        g.bench_function(format!("{kind:?}: get in 1M"), |b| {
            let mut buf = RecordBuf::new();
            let mut i = 0usize;
            b.iter(|| {
                i = (i + 7919) % n as usize;
                buf.clear();
                t.get(t.hash(&keys[i]), &keys[i], &mut buf).unwrap()
            })
        });
        g.bench_function(
            format!("{kind:?}: next key after a random key in 1M"),
            |b| {
                let mut buf = RecordBuf::new();
                let mut i = 0usize;
                b.iter(|| {
                    i = (i + 7919) % n as usize;
                    buf.clear();
                    let k = &keys[i];
                    t.step_record(Direction::Forward, t.hash(k), k, &mut buf)
                        .unwrap()
                })
            },
        );
    }
    g.sample_size(10);
    g.bench_function("OrderedSet: insert 1M records one by one", |b| {
        b.iter_batched(
            || {
                let t = table_of(Kind::OrderedSet);
                let recs: Vec<_> = keys.iter().map(|k| t.prepare(k, &body)).collect();
                (t, recs)
            },
            |(t, recs)| {
                for r in &recs {
                    t.insert(std::slice::from_ref(r)).unwrap();
                }
                t
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

criterion_group!(benches, comparator, index, tables);
criterion_main!(benches);
