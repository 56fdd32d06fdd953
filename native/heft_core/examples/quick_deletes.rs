//! The longest single delete a normal-scheduler call makes, in thread CPU
//! time (what the call costs, whatever else the machine runs): deletes
//! every record of a set of RECORDS in walk order and in random order, each
//! as a quick call (`heft_core::table::quick`, as the NIF's normal
//! variants run), the refused ones (index resizes) again outside it, as
//! the NIF's DirtyCpu retry does.
//!
//!     cargo run --release -p heft_core --example quick_deletes -- [RECORDS]

use heft_core::codec::Value;
use heft_core::table::{quick, Error, Kind};
use heft_core::{Backing, Compression, Options, Table};

#[path = "../benches/support/thread_cpu.rs"]
mod thread_cpu;
use thread_cpu::thread_cpu_ns as cpu_ns;

fn main() {
    let n: i64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    for order in ["walk", "random"] {
        let t = Table::new(&Options {
            backing: Backing::Memory,
            compression: Compression::None,
            label: "quick_deletes".into(),
            kind: Kind::Set,
        })
        .expect("a table");
        let keys: Vec<Vec<u8>> = (0..n).map(|i| Value::Int(i).to_bytes()).collect();
        for chunk in keys.chunks(10_000) {
            let recs: Vec<_> = chunk
                .iter()
                .map(|k| {
                    t.prepare(
                        k,
                        &Value::Tuple(vec![Value::Int(0), Value::Int(0)]).to_bytes(),
                    )
                })
                .collect();
            t.insert(&recs).expect("insert");
        }
        let mut order_keys = Vec::with_capacity(keys.len());
        match order {
            "walk" => {
                let mut k = t.first_key().expect("first");
                while let Some(key) = k {
                    k = t.next_key(t.hash(&key), &key).expect("next");
                    order_keys.push(key);
                }
            }
            _ => {
                // A fixed shuffle (xorshift), the same every run.
                order_keys = keys.clone();
                let mut x = 0x9E37_79B9_7F4A_7C15_u64;
                for i in (1..order_keys.len()).rev() {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    order_keys.swap(i, (x % (i as u64 + 1)) as usize);
                }
            }
        }
        let (mut quick_max, mut dirty_max, mut refused) = (0, 0, 0);
        let start = cpu_ns();
        for k in &order_keys {
            let h = t.hash(k);
            let t0 = cpu_ns();
            let r = quick(|| t.remove(h, k, None));
            let t1 = cpu_ns();
            quick_max = u64::max(quick_max, t1 - t0);
            if let Err(Error::TooLong) = r {
                refused += 1;
                t.remove(h, k, None).expect("remove");
                dirty_max = u64::max(dirty_max, cpu_ns() - t1);
            }
        }
        let total = cpu_ns() - start;
        println!(
            "{n} deletes in {order} order: {:.0} ns each; longest quick call {:.3} ms; \
             {refused} refused as resizes, the longest of those {:.3} ms",
            total as f64 / n as f64,
            quick_max as f64 / 1e6,
            dirty_max as f64 / 1e6
        );
    }
}
