//! Hit ratios of eviction policies, the study behind the policy of bounded
//! tables (table/evict.rs; docs/benchmarks.md, "Eviction policies"):
//!
//!     cargo run --release -p heft_core --example hit_ratios
//!
//! Each policy is a cache of `capacity` objects of one size; a request
//! that misses inserts its key (a look-aside cache), evicting when full.
//! Policies: LRU; CLOCK (second chance, the new object in the evicted
//! one's slot); SIEVE (Zhang et al., NSDI '24); S3-FIFO (Yang et al.,
//! SOSP '23, as libCacheSim's default: a 10% small FIFO, a 90% main FIFO
//! with a 2-bit counter, a ghost FIFO of 90% of the capacity's keys; an
//! object read in the small queue moves to the main one); and Heft's
//! SIEVE (table/evict.rs), whose marks are a bitset of 16 to 32 bits a
//! queued key indexed by the key's hash and cleared whole each time the
//! hand wraps, and whose hand passes at most 8,192 keys per victim.
//!
//! Workloads, over 1,000,000 keys (popularity ranks shuffled by a hash):
//! Zipf with alpha 0.8, 1.0 and 1.2, 5,000,000 requests; and "scan":
//! Zipf 1.0 where every 100,000 requests a scan of 50,000 keys never seen
//! before is interleaved (each requested once). Cache sizes 1% and 10% of
//! the keys. Hits are counted after the first 1,000,000 requests; for
//! "scan", over the Zipf requests only (the scan's are all misses). The
//! seed is fixed: the output is the same at every run.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

/// A fast hasher for u64 keys (the keys are already mixed).
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, _: &[u8]) {
        unreachable!("only u64 keys")
    }
    fn write_u64(&mut self, k: u64) {
        self.0 = mix(k);
    }
}

type Map<V> = HashMap<u64, V, BuildHasherDefault<KeyHasher>>;
type Set = HashSet<u64, BuildHasherDefault<KeyHasher>>;

fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Zipf over `n` ranks by its cumulative distribution.
struct Zipf(Vec<f64>);

impl Zipf {
    fn new(n: usize, alpha: f64) -> Zipf {
        let mut sum = 0.0;
        let mut cdf: Vec<f64> = (1..=n)
            .map(|r| {
                sum += 1.0 / (r as f64).powf(alpha);
                sum
            })
            .collect();
        cdf.iter_mut().for_each(|c| *c /= sum);
        Zipf(cdf)
    }
    fn sample(&self, rng: &mut Rng) -> u64 {
        let u = rng.unit();
        self.0.partition_point(|&c| c < u) as u64
    }
}

trait Policy {
    fn name(&self) -> &'static str;
    /// Requests `key`: true on a hit; on a miss the key is inserted.
    fn access(&mut self, key: u64) -> bool;
}

/// Doubly linked nodes in a slab, for LRU and SIEVE.
#[derive(Default)]
struct List {
    key: Vec<u64>,
    prev: Vec<usize>,
    next: Vec<usize>,
    mark: Vec<bool>,
    free: Vec<usize>,
    head: Option<usize>,
    tail: Option<usize>,
}

const NIL: usize = usize::MAX;

impl List {
    fn push_head(&mut self, key: u64) -> usize {
        let i = match self.free.pop() {
            Some(i) => i,
            None => {
                self.key.push(0);
                self.prev.push(NIL);
                self.next.push(NIL);
                self.mark.push(false);
                self.key.len() - 1
            }
        };
        self.key[i] = key;
        self.mark[i] = false;
        self.prev[i] = NIL;
        self.next[i] = self.head.unwrap_or(NIL);
        if let Some(h) = self.head {
            self.prev[h] = i;
        }
        self.head = Some(i);
        self.tail.get_or_insert(i);
        i
    }
    fn unlink(&mut self, i: usize) {
        let (p, n) = (self.prev[i], self.next[i]);
        if p == NIL {
            self.head = (n != NIL).then_some(n);
        } else {
            self.next[p] = n;
        }
        if n == NIL {
            self.tail = (p != NIL).then_some(p);
        } else {
            self.prev[n] = p;
        }
        self.free.push(i);
    }
}

struct Lru {
    cap: usize,
    map: Map<usize>,
    list: List,
}

impl Policy for Lru {
    fn name(&self) -> &'static str {
        "LRU"
    }
    fn access(&mut self, key: u64) -> bool {
        if let Some(&i) = self.map.get(&key) {
            self.list.unlink(i);
            let j = self.list.push_head(key);
            self.map.insert(key, j);
            return true;
        }
        if self.map.len() == self.cap {
            let t = self.list.tail.expect("a full cache has a tail");
            self.map.remove(&self.list.key[t]);
            self.list.unlink(t);
        }
        let i = self.list.push_head(key);
        self.map.insert(key, i);
        false
    }
}

struct Clock {
    cap: usize,
    map: Map<usize>,
    slots: Vec<(u64, bool)>,
    hand: usize,
}

impl Policy for Clock {
    fn name(&self) -> &'static str {
        "CLOCK"
    }
    fn access(&mut self, key: u64) -> bool {
        if let Some(&i) = self.map.get(&key) {
            self.slots[i].1 = true;
            return true;
        }
        if self.slots.len() < self.cap {
            self.map.insert(key, self.slots.len());
            self.slots.push((key, false));
            return false;
        }
        loop {
            let (k, referenced) = self.slots[self.hand];
            if referenced {
                self.slots[self.hand].1 = false;
                self.hand = (self.hand + 1) % self.cap;
                continue;
            }
            self.map.remove(&k);
            self.map.insert(key, self.hand);
            self.slots[self.hand] = (key, false);
            self.hand = (self.hand + 1) % self.cap;
            return false;
        }
    }
}

struct Sieve {
    cap: usize,
    map: Map<usize>,
    list: List,
    hand: Option<usize>,
}

impl Policy for Sieve {
    fn name(&self) -> &'static str {
        "SIEVE"
    }
    fn access(&mut self, key: u64) -> bool {
        if let Some(&i) = self.map.get(&key) {
            self.list.mark[i] = true;
            return true;
        }
        if self.map.len() == self.cap {
            let mut h = self.hand.or(self.list.tail).expect("full");
            while self.list.mark[h] {
                self.list.mark[h] = false;
                h = match self.list.prev[h] {
                    NIL => self.list.tail.expect("full"),
                    p => p,
                };
            }
            self.hand = match self.list.prev[h] {
                NIL => None,
                p => Some(p),
            };
            self.map.remove(&self.list.key[h]);
            self.list.unlink(h);
        }
        let i = self.list.push_head(key);
        self.map.insert(key, i);
        false
    }
}

/// Heft's SIEVE (table/evict.rs): a queue in arrival order walked by a
/// hand that wraps, marks in one hashed bitset cleared at each wrap.
struct HeftSieve {
    cap: usize,
    resident: Set,
    ahead: VecDeque<u64>,
    kept: VecDeque<u64>,
    marks: Vec<u64>,
}

impl HeftSieve {
    const MAX_PASSED: usize = 8192;

    fn bit(&self, key: u64) -> (usize, u64) {
        let i = (mix(key ^ 0x5151) as usize) & (self.marks.len() * 64 - 1);
        (i / 64, 1 << (i % 64))
    }
    fn visited(&self, key: u64) -> bool {
        let (w, m) = self.bit(key);
        self.marks[w] & m != 0
    }
    fn victim(&mut self) -> u64 {
        let mut passed = 0;
        loop {
            let Some(k) = self.ahead.pop_front() else {
                std::mem::swap(&mut self.ahead, &mut self.kept);
                self.marks.iter_mut().for_each(|w| *w = 0);
                continue;
            };
            passed += 1;
            if passed < Self::MAX_PASSED && self.visited(k) {
                self.kept.push_back(k);
            } else {
                return k;
            }
        }
    }
}

impl Policy for HeftSieve {
    fn name(&self) -> &'static str {
        "Heft (SIEVE, hashed marks)"
    }
    fn access(&mut self, key: u64) -> bool {
        if self.resident.contains(&key) {
            let (w, m) = self.bit(key);
            self.marks[w] |= m;
            return true;
        }
        if self.resident.len() == self.cap {
            let v = self.victim();
            self.resident.remove(&v);
        }
        self.resident.insert(key);
        self.ahead.push_back(key);
        false
    }
}

struct S3Fifo {
    cap: usize,
    small_cap: usize,
    small: VecDeque<u64>,
    main: VecDeque<u64>,
    /// Resident keys' access counters (0..=3).
    freq: Map<u8>,
    ghost: VecDeque<u64>,
    ghost_set: Set,
    ghost_cap: usize,
}

impl S3Fifo {
    fn evict(&mut self) {
        if self.small.len() >= self.small_cap {
            while let Some(k) = self.small.pop_front() {
                let f = self.freq[&k];
                if f >= 1 {
                    self.freq.insert(k, 0);
                    self.main.push_back(k);
                    if self.main.len() > self.cap - self.small_cap {
                        self.evict_main();
                        return;
                    }
                    continue;
                }
                self.freq.remove(&k);
                self.ghost.push_back(k);
                self.ghost_set.insert(k);
                if self.ghost.len() > self.ghost_cap {
                    let g = self.ghost.pop_front().expect("a ghost");
                    self.ghost_set.remove(&g);
                }
                return;
            }
        } else {
            self.evict_main();
        }
    }
    fn evict_main(&mut self) {
        while let Some(k) = self.main.pop_front() {
            let f = self.freq[&k];
            if f > 0 {
                self.freq.insert(k, f - 1);
                self.main.push_back(k);
            } else {
                self.freq.remove(&k);
                return;
            }
        }
    }
}

impl Policy for S3Fifo {
    fn name(&self) -> &'static str {
        "S3-FIFO"
    }
    fn access(&mut self, key: u64) -> bool {
        if let Some(f) = self.freq.get_mut(&key) {
            *f = (*f + 1).min(3);
            return true;
        }
        while self.freq.len() >= self.cap {
            self.evict();
        }
        self.freq.insert(key, 0);
        if self.ghost_set.remove(&key) {
            self.main.push_back(key);
        } else {
            self.small.push_back(key);
        }
        false
    }
}

fn policies(cap: usize) -> Vec<Box<dyn Policy>> {
    let words = (16 * cap).next_power_of_two().max(4096) / 64;
    vec![
        Box::new(Lru {
            cap,
            map: Map::default(),
            list: List::default(),
        }),
        Box::new(Clock {
            cap,
            map: Map::default(),
            slots: Vec::new(),
            hand: 0,
        }),
        Box::new(Sieve {
            cap,
            map: Map::default(),
            list: List::default(),
            hand: None,
        }),
        Box::new(S3Fifo {
            cap,
            small_cap: (cap / 10).max(1),
            small: VecDeque::new(),
            main: VecDeque::new(),
            freq: Map::default(),
            ghost: VecDeque::new(),
            ghost_set: Set::default(),
            ghost_cap: cap * 9 / 10,
        }),
        Box::new(HeftSieve {
            cap,
            resident: Set::default(),
            ahead: VecDeque::new(),
            kept: VecDeque::new(),
            marks: vec![0; words],
        }),
    ]
}

const KEYS: usize = 1_000_000;
const REQUESTS: usize = 5_000_000;
const WARMUP: usize = 1_000_000;

/// One workload's requests: (key, counted).
fn requests(alpha: f64, scans: bool) -> Vec<(u64, bool)> {
    let zipf = Zipf::new(KEYS, alpha);
    let mut rng = Rng(42);
    let mut out = Vec::with_capacity(REQUESTS * 3 / 2);
    let mut fresh = KEYS as u64;
    for i in 0..REQUESTS {
        if scans && i > 0 && i % 100_000 == 0 {
            for _ in 0..50_000 {
                out.push((mix(fresh), false));
                fresh += 1;
            }
        }
        out.push((mix(zipf.sample(&mut rng)), i >= WARMUP));
    }
    out
}

fn main() {
    let workloads = [
        ("Zipf 0.8", 0.8, false),
        ("Zipf 1.0", 1.0, false),
        ("Zipf 1.2", 1.2, false),
        ("Zipf 1.0 + scans", 1.0, true),
    ];
    let names: Vec<&str> = policies(1).iter().map(|p| p.name()).collect();
    println!("# Hit ratios of eviction policies\n");
    println!("`cargo run --release -p heft_core --example hit_ratios` (the workloads are in its doc comment).\n");
    println!("| workload | cache | {} |", names.join(" | "));
    println!("|---|---|{}", "---:|".repeat(names.len()));
    for (label, alpha, scans) in workloads {
        let reqs = requests(alpha, scans);
        for share in [1, 10] {
            let cap = KEYS * share / 100;
            let ratios: Vec<f64> = policies(cap)
                .iter_mut()
                .map(|p| {
                    let (mut hits, mut counted) = (0u64, 0u64);
                    for &(k, count) in &reqs {
                        let hit = p.access(k);
                        if count {
                            counted += 1;
                            hits += hit as u64;
                        }
                    }
                    100.0 * hits as f64 / counted as f64
                })
                .collect();
            let best = ratios.iter().cloned().fold(f64::MIN, f64::max);
            let cells: Vec<String> = ratios
                .iter()
                .map(|&r| {
                    if r == best {
                        format!("**{r:.2}**")
                    } else {
                        format!("{r:.2}")
                    }
                })
                .collect();
            println!("| {label} | {share}% | {} |", cells.join(" | "));
        }
    }
}
