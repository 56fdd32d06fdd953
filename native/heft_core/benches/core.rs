//! Criterion benchmarks of the engine's hot paths, without a VM:
//! `cargo bench -p heft_core`. The record shapes mirror `mix bench`'s: the
//! small map record and the 100-tuple of 10-atom lists.

use criterion::measurement::{Measurement, ValueFormatter, WallTime};
use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use heft_core::arena::{Arena, Backing};
use heft_core::codec::{
    decode_record, decode_with, Builder, DecodeError, Scratch, Value, ValueBuilder, Writer,
};
use heft_core::compress::{compress, decompress, unpack, Codec, Compression};
use heft_core::dict::{self, Dictionaries};
use heft_core::index::HashIndex;
use heft_core::record::Header;
use heft_core::sieve::{Op, Sieve, Test};
use heft_core::table::{Direction, Kept, KeyRange, Kind, Options, RecordBuf, Table};

/// `{i, %{age: i % 90, id: i, name: "user-i"}}` with atoms age=0, id=1, name=2.
fn small_record(i: i64) -> Value {
    Value::Tuple(vec![
        Value::Int(i),
        Value::Map(vec![
            (Value::Atom(0), Value::Int(i % 90)),
            (Value::Atom(1), Value::Int(i)),
            (
                Value::Atom(2),
                Value::Binary(format!("user-{i}").into_bytes()),
            ),
        ]),
    ])
}

/// `{i, 100-tuple of the same [a x 10]}`, written with back-references the
/// way the NIF writes the BEAM's shared list.
fn big_record(i: i64) -> Vec<u8> {
    let mut w = Writer::new();
    w.tuple(2);
    w.key();
    w.tuple(100);
    let list = w.list(10);
    for _ in 0..10 {
        w.atom(0);
    }
    w.nil();
    for _ in 1..100 {
        w.backref(list);
    }
    let _ = i;
    w.buf
}

/// A record body as the NIF writes it for a set: `{KEY, elems...}`, its
/// first tag flagged unshared (it holds no back-reference).
fn body_of(elems: &[Value]) -> Vec<u8> {
    let mut w = Writer::new();
    w.tuple(elems.len() + 1);
    w.key();
    elems.iter().for_each(|e| e.encode(&mut w));
    w.flag_if_unshared();
    w.buf
}

/// Builds nothing but a node count: the cost of walking the format, which
/// is what the NIF pays on top of creating BEAM terms.
struct Walk;

impl Builder for Walk {
    type Term = u32;
    fn nil(&mut self) -> Result<u32, DecodeError> {
        Ok(1)
    }
    fn int(&mut self, _: i64) -> Result<u32, DecodeError> {
        Ok(1)
    }
    fn float(&mut self, _: f64) -> Result<u32, DecodeError> {
        Ok(1)
    }
    fn atom(&mut self, _: u32) -> Result<u32, DecodeError> {
        Ok(1)
    }
    fn binary(&mut self, _: &[u8]) -> Result<u32, DecodeError> {
        Ok(1)
    }
    fn etf(&mut self, _: &[u8]) -> Result<u32, DecodeError> {
        Ok(1)
    }
    fn tuple(&mut self, e: &[u32]) -> Result<u32, DecodeError> {
        Ok(1 + e.iter().sum::<u32>())
    }
    fn list(&mut self, e: &[u32], t: u32) -> Result<u32, DecodeError> {
        Ok(1 + t + e.iter().sum::<u32>())
    }
    fn map(&mut self, e: &[u32]) -> Result<u32, DecodeError> {
        Ok(1 + e.iter().sum::<u32>())
    }
}

fn codec(c: &mut Criterion) {
    let mut g = c.benchmark_group("codec");
    let small = small_record(123_456);
    g.bench_function("encode small record", |b| {
        let mut w = Writer::new();
        b.iter(|| {
            w.clear();
            black_box(&small).encode(&mut w);
            black_box(w.buf.len())
        })
    });
    let bytes = small.to_bytes();
    g.bench_function("decode small record", |b| {
        let mut s = Scratch::default();
        b.iter(|| decode_with(black_box(&bytes), None, &mut ValueBuilder, &mut s).unwrap())
    });
    g.bench_function(
        "decode small record (lookup path: no shared subterms)",
        |b| {
            let mut s = Scratch::default();
            b.iter(|| {
                decode_record(black_box(&bytes), None, false, &mut ValueBuilder, &mut s).unwrap()
            })
        },
    );
    let big = big_record(1);
    let key = Value::Int(1).to_bytes();
    g.throughput(Throughput::Bytes(big.len() as u64));
    g.bench_function("walk 100-tuple record (shared list)", |b| {
        let mut s = Scratch::default();
        b.iter(|| decode_with(black_box(&big), Some(&key), &mut Walk, &mut s).unwrap())
    });
    // The same bodies through the id-keeping decoder (what an unflagged
    // body gets) and the lean one (flagged): the format walk's share of a
    // lookup's term building, without the VM's own costs.
    let Value::Tuple(small_elems) = small_record(123_456) else {
        unreachable!()
    };
    let unshared_100: Vec<Value> = vec![Value::Tuple(
        (1..=100)
            .map(|j| Value::Tuple(vec![Value::Int(j), Value::Binary(format!("v{j}").into())]))
            .collect(),
    )];
    for (name, elems) in [
        ("small record", &small_elems[1..]),
        ("unshared 100-tuple record", &unshared_100[..]),
    ] {
        let body = body_of(elems);
        let mut s = Scratch::default();
        g.bench_function(format!("walk {name}, id-keeping decoder"), |b| {
            b.iter(|| decode_with(black_box(&body), Some(&key), &mut Walk, &mut s).unwrap())
        });
        g.bench_function(format!("walk {name}, lean decoder"), |b| {
            b.iter(|| {
                decode_record(black_box(&body), Some(&key), false, &mut Walk, &mut s).unwrap()
            })
        });
    }
    g.finish();
}

fn deflate(c: &mut Criterion) {
    let mut g = c.benchmark_group("compress");
    let big = big_record(1);
    let json: Vec<u8> = (0..20)
        .flat_map(|i| {
            format!("{{\"id\":{i},\"name\":\"user-{i}\",\"tags\":[\"a\",\"b\"]}},").into_bytes()
        })
        .take(1024)
        .collect();
    // Incompressible: stored raw after deflate's quick look.
    let random = noise(0x9E37_79B9, 1027);
    for (name, body) in [
        ("100-tuple record", &big),
        ("1 KB JSON-like", &json),
        ("1 KB random", &random),
    ] {
        g.throughput(Throughput::Bytes(body.len() as u64));
        g.bench_function(format!("deflate level 1: {name}"), |b| {
            let mut out = Vec::new();
            b.iter(|| {
                compress(
                    black_box(body),
                    Compression::Zlib(1),
                    &Dictionaries::new(3),
                    &mut out,
                )
            })
        });
        let mut packed = Vec::new();
        compress(
            body,
            Compression::Zlib(1),
            &Dictionaries::new(3),
            &mut packed,
        );
        g.bench_function(format!("inflate: {name}"), |b| {
            let mut out = Vec::new();
            b.iter(|| decompress(black_box(&packed), body.len(), &mut out).unwrap())
        });
    }
    g.finish();
}

/// The bodies of `mix bench`'s JSON-like records as the NIF encodes them:
/// `{i, json}` is a 2-tuple whose key is stored outside the body, so the
/// body is the tuple header, the key marker and the 1,024-byte binary.
/// json_1k.bin holds `Heft.Bench.Kinds.json(i)` of eight keys, written by
/// bench/lib/heft/bench/kinds.ex itself (see the file's neighbour, json_1k.exs).
fn json_1k_bodies() -> Vec<Vec<u8>> {
    include_bytes!("json_1k.bin")
        .chunks_exact(1024)
        .map(|json| {
            let mut w = Writer::new();
            w.tuple(2);
            w.key();
            w.binary(json);
            w.buf
        })
        .collect()
}

// The unit tests' helpers: `noise`, so the bench needs no random-number
// crate and draws the same noise the tests do.
#[path = "../src/testutil.rs"]
#[allow(dead_code)]
mod testutil;
use testutil::noise;

/// Bodies of `mix bench`'s random 1 KB record `{i, <<1024 random bytes>>}`:
/// what every codec must store raw.
fn random_1k_bodies() -> Vec<Vec<u8>> {
    (1..=1000)
        .map(|i| {
            let mut w = Writer::new();
            w.tuple(2);
            w.key();
            w.binary(&noise(i, 1024));
            w.buf
        })
        .collect()
}

#[path = "support/thread_cpu.rs"]
mod thread_cpu;
use thread_cpu::thread_cpu_ns;

/// Criterion's measurement in the calling thread's CPU time
/// ([`thread_cpu_ns`]).
struct ThreadCpu;

impl Measurement for ThreadCpu {
    type Intermediate = u64;
    type Value = u64;
    fn start(&self) -> u64 {
        thread_cpu_ns()
    }
    fn end(&self, start: u64) -> u64 {
        thread_cpu_ns() - start
    }
    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }
    fn zero(&self) -> u64 {
        0
    }
    fn to_f64(&self, v: &u64) -> f64 {
        *v as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        // Nanoseconds, shown as wall time's are.
        static WALL: WallTime = WallTime;
        WALL.formatter()
    }
}

/// Deflate and inflate of those bodies, one after another, in thread CPU
/// time (see [`ThreadCpu`]).
fn json_1k(c: &mut Criterion<ThreadCpu>) {
    let mut g = c.benchmark_group("json_1k");
    let bodies = json_1k_bodies();
    let packed: Vec<Vec<u8>> = bodies
        .iter()
        .map(|b| {
            let mut out = Vec::new();
            compress(b, Compression::Zlib(1), &Dictionaries::new(3), &mut out);
            out
        })
        .collect();
    let stored: usize = packed.iter().map(Vec::len).sum();
    eprintln!(
        "json_1k: {} bodies of {} bytes stored in {:.1} bytes on average",
        bodies.len(),
        bodies[0].len(),
        stored as f64 / bodies.len() as f64
    );
    g.throughput(Throughput::Bytes(bodies[0].len() as u64));
    g.bench_function("deflate mix bench record", |b| {
        let mut out = Vec::new();
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % bodies.len();
            compress(
                black_box(&bodies[i]),
                Compression::Zlib(1),
                &Dictionaries::new(3),
                &mut out,
            )
        })
    });
    g.bench_function("inflate mix bench record", |b| {
        let mut out = Vec::new();
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % bodies.len();
            decompress(black_box(&packed[i]), bodies[i].len(), &mut out).unwrap()
        })
    });
    g.finish();
}

/// The small map record's body as the NIF writes it for a set.
fn small_body(i: i64) -> Vec<u8> {
    let Value::Tuple(elems) = small_record(i) else {
        unreachable!()
    };
    body_of(&elems[1..])
}

/// Every codec a table can take on `mix bench`'s small map and JSON-like
/// bodies: compress (as `Table::prepare` does) and unpack (as every read
/// does), cycling through the bodies, in thread CPU time. The dictionary
/// is trained on the bodies themselves (at most 16 KiB), as a table's is
/// on its own records; the average stored size is printed per row.
fn codecs(c: &mut Criterion<ThreadCpu>) {
    let mut g = c.benchmark_group("codecs");
    let small: Vec<Vec<u8>> = (0..5000).map(|i| small_body(100_000 + i)).collect();
    let json = json_1k_bodies();
    let random = random_1k_bodies();
    let zstd = |dict| Compression::Zstd { level: 3, dict };
    let modes = [
        ("deflate", Compression::Zlib(1)),
        ("lz4", Compression::Lz4),
        ("zstd", zstd(false)),
        ("zstd+dict", zstd(true)),
    ];
    for (kind, bodies) in [
        ("small map", &small),
        ("JSON 1 KB", &json),
        ("random 1 KB", &random),
    ] {
        let dicts = Dictionaries::new(3);
        match dict::train(bodies, 16 * 1024, 3) {
            Ok(d) => dicts.set_current(dicts.add(&d).unwrap().id()),
            Err(e) => eprintln!("{kind}: no dictionary ({e})"),
        }
        for (name, mode) in modes {
            let mut out = Vec::new();
            let stored: Vec<(Header, Vec<u8>)> = bodies
                .iter()
                .map(|b| {
                    let p = compress(b, mode, &dicts, &mut out);
                    let kept = if p.codec == Codec::Raw { b } else { &out };
                    let h = Header {
                        codec: p.codec,
                        dict: p.dict,
                        header_len: 0,
                        key_len: 0,
                        stored_len: kept.len(),
                        raw_len: b.len(),
                    };
                    (h, kept.clone())
                })
                .collect();
            let avg = |f: fn(&(Header, Vec<u8>)) -> usize| {
                stored.iter().map(f).sum::<usize>() as f64 / stored.len() as f64
            };
            eprintln!(
                "codecs/{name}: {kind}: {:.1} raw bytes stored in {:.1} on average ({:.0}% compressed)",
                avg(|(h, _)| h.raw_len),
                avg(|(h, _)| h.stored_len),
                100.0 * avg(|(h, _)| usize::from(h.codec != Codec::Raw)),
            );
            g.throughput(Throughput::Bytes(bodies[0].len() as u64));
            g.bench_function(format!("compress {name}: {kind}"), |b| {
                let mut i = 0;
                b.iter(|| {
                    i = (i + 1) % bodies.len();
                    compress(black_box(&bodies[i]), mode, &dicts, &mut out)
                })
            });
            g.bench_function(format!("unpack {name}: {kind}"), |b| {
                let mut back = Vec::new();
                let mut i = 0;
                b.iter(|| {
                    i = (i + 1) % stored.len();
                    let (h, bytes) = &stored[i];
                    unpack(h, black_box(bytes), &dicts, &mut back).map(|b| b.len())
                })
            });
        }
    }
    g.finish();
}

fn index(c: &mut Criterion) {
    let mut g = c.benchmark_group("index");
    let h = |k: u64| k.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (k >> 7);
    let n = 1_000_000u64;
    // Keys k at arena-like locations 4k + 8; the index compares entries by
    // (hash, key).
    let key = |loc: u64| (loc - 8) / 4;
    let by = move |k: u64| {
        move |loc: u64| {
            let s = key(loc);
            (h(s), s).cmp(&(h(k), k))
        }
    };
    let mut ix = HashIndex::new("bench");
    for k in 0..n {
        ix.insert(h(k), 4 * k + 8, by(k));
    }
    g.bench_function("find in 1M keys", |b| {
        let mut k = 0u64;
        b.iter(|| {
            k = (k + 7919) % n;
            ix.find(h(k), by(k))
        })
    });
    g.bench_function("insert 100k keys into an empty index", |b| {
        b.iter_batched(
            || HashIndex::new("bench"),
            |mut ix| {
                for k in 0..100_000u64 {
                    ix.insert(h(k), 4 * k + 8, by(k));
                }
                ix
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

fn arena(c: &mut Criterion) {
    let mut g = c.benchmark_group("arena");
    g.bench_function("alloc+free 64-byte block (reuse)", |b| {
        let mut a = Arena::new(&Backing::Memory, "bench").unwrap();
        b.iter(|| {
            let loc = a.alloc(black_box(64)).unwrap();
            a.free(loc);
        })
    });
    g.finish();
}

fn table(c: &mut Criterion) {
    let mut g = c.benchmark_group("table");
    let t = Table::new(&Options {
        backing: Backing::Memory,
        compression: Compression::Zlib(1),
        label: "bench".into(),
        kind: Kind::Set,
    })
    .unwrap();
    let n = 200_000;
    let keys: Vec<Vec<u8>> = (0..n).map(|i| Value::Int(i).to_bytes()).collect();
    let recs: Vec<_> = (0..n as usize)
        .map(|i| t.prepare(&keys[i], &small_record(i as i64).to_bytes()))
        .collect();
    t.insert(&recs).unwrap();
    g.bench_function("get (copy out) in 200k small records", |b| {
        let mut buf = RecordBuf::new();
        let mut i = 0usize;
        b.iter(|| {
            i = (i + 7919) % n as usize;
            buf.clear();
            t.get(t.hash(&keys[i]), &keys[i], &mut buf).unwrap()
        })
    });
    g.bench_function("prepare + insert one small record", |b| {
        let mut i = 0usize;
        b.iter(|| {
            i = (i + 7919) % n as usize;
            let r = t.prepare(&keys[i], &small_record(i as i64).to_bytes());
            t.insert(std::slice::from_ref(&r)).unwrap()
        })
    });
    let big_body = big_record(1);
    g.bench_function("prepare (deflate) one 100-tuple record", |b| {
        b.iter(|| t.prepare(&keys[1], black_box(&big_body)))
    });
    g.finish();
}

/// A full-table scan as a select with a guard on element 2 runs it: 10,000
/// records `{{rec, k}, k, <0-1,499 bytes>}` walked in one chunk, the sieve
/// lib/heft/match_spec.ex builds for `{_, X, _}` when `X < 10` judging
/// each, the 9 it keeps copied out. The NIF adds only the decoding of
/// those 9. Then the sieve alone, judging one record again and again.
fn scan(c: &mut Criterion) {
    let mut g = c.benchmark_group("scan");
    let t = Table::new(&Options {
        backing: Backing::Memory,
        compression: Compression::None,
        label: "bench".into(),
        kind: Kind::Set,
    })
    .unwrap();
    let n: u32 = std::env::var("SCAN_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let mut seed = 0x9e37_79b9_u32;
    let recs: Vec<_> = (1..=n)
        .map(|k| {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            let key = Value::Tuple(vec![Value::Atom(0), Value::Int(k.into())]).to_bytes();
            let blob = vec![(k % 251) as u8; (seed % 1500) as usize];
            t.prepare(&key, &body_of(&[Value::Int(k.into()), Value::Binary(blob)]))
        })
        .collect();
    t.insert(&recs).unwrap();
    let sieve = Sieve::new(
        vec![vec![
            Test::Arity {
                path: vec![],
                arity: 3,
            },
            Test::Cmp {
                path: vec![1],
                op: Op::Lt,
                value: Value::Int(10).to_bytes(),
            },
        ]],
        1,
    );
    let dicts = t.dictionaries().clone();
    g.throughput(Throughput::Elements(n.into()));
    g.bench_function("sieved walk of 10k records, guard on element 2", |b| {
        let mut buf = RecordBuf::new();
        let mut scratch = Vec::new();
        b.iter(|| {
            buf.clear();
            let mut keep = |r: &heft_core::table::Stored| {
                let (judged, read) = r.judge(&sieve, &dicts, &mut scratch, |_| "rec");
                match judged {
                    heft_core::sieve::Judgement::Drops => Kept::No { read },
                    _ => Kept::Yes { read },
                }
            };
            let range = KeyRange::default();
            t.chunk_kept(
                Direction::Forward,
                &range,
                None,
                usize::MAX,
                usize::MAX,
                &mut buf,
                &mut keep,
            )
            .unwrap()
        })
    });
    g.throughput(Throughput::Elements(1));
    let key = Value::Tuple(vec![Value::Atom(0), Value::Int(777)]).to_bytes();
    let body = body_of(&[Value::Int(777), Value::Binary(vec![1; 700])]);
    g.bench_function("judge one record", |b| {
        b.iter(|| sieve.judge_reach(black_box(&key), || Some(black_box(&body[..])), |_| "rec"))
    });
    g.finish();
}

criterion_group!(benches, codec, deflate, index, arena, table, scan);
criterion_group! {
    name = cpu_time;
    config = Criterion::default().with_measurement(ThreadCpu);
    targets = json_1k, codecs
}
criterion_main!(benches, cpu_time);
