//! The flusher thread of a `{:interval, ms}` table sleeps while nothing is
//! written, instead of waking every interval, and the next write wakes it.
//! Measured by the kernel's count of the thread's context switches, so
//! this file holds one test: its process has one flusher thread.

use std::fs;
use std::time::Duration;

use heft_core::codec::Value;
use heft_core::persist::{Config, Event, Events, Failure, Persisted, SyncMode};
use heft_core::{Backing, Compression, Options};

struct NoEvents;

impl Events for NoEvents {
    type Waiter = ();
    fn done(&self, _: Vec<()>, _: Result<(), Failure>) {}
    fn notify(&self, _: Event) {}
}

/// Context switches of this process's `heft-flush` threads so far.
fn flusher_switches() -> u64 {
    let mut n = 0;
    for task in fs::read_dir("/proc/self/task").unwrap() {
        let path = task.unwrap().path();
        let comm = fs::read_to_string(path.join("comm")).unwrap_or_default();
        if comm.trim() != "heft-flush" {
            continue;
        }
        let status = fs::read_to_string(path.join("status")).unwrap_or_default();
        for line in status.lines() {
            if line.contains("ctxt_switches:") {
                n += line
                    .split_whitespace()
                    .last()
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
    }
    n
}

#[test]
fn an_idle_interval_flusher_sleeps_until_a_write() {
    let dir = std::env::temp_dir().join(format!("heft-idle-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    let opts = Options {
        backing: Backing::Memory,
        compression: Compression::None,
        label: "idle".into(),
        kind: heft_core::table::Kind::Set,
    };
    let config = Config {
        sync: SyncMode::Interval(Duration::from_millis(1)),
        ..Config::default()
    };
    let o = Persisted::open(&dir, b"meta", true, &opts, config, NoEvents).unwrap();
    let put = |i: i64| {
        let rec = o
            .table
            .prepare(&Value::Int(i).to_bytes(), &Value::Int(i).to_bytes());
        o.table.insert(&[rec]).unwrap();
    };
    let fsyncs_after = |n: u64| {
        for _ in 0..5000 {
            if o.persisted.stats().log_fsyncs > n {
                return true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        false
    };
    put(1);
    assert!(fsyncs_after(0), "the write was synced");
    let synced = o.persisted.stats().log_fsyncs;
    let before = flusher_switches();
    std::thread::sleep(Duration::from_millis(300));
    let idle = flusher_switches() - before;
    // Waking every 1 ms would be about 300 switches.
    assert!(
        idle <= 5,
        "{idle} context switches in 300 ms with nothing to sync"
    );
    assert_eq!(o.persisted.stats().log_fsyncs, synced);
    put(2);
    assert!(fsyncs_after(synced), "a write woke it");
    o.table.take_storage();
    o.persisted.close().unwrap();
    let _ = fs::remove_dir_all(&dir);
}
