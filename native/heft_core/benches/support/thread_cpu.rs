//! The calling thread's CPU time, shared by the benches and examples (each
//! a binary of its own, so they include this file with `#[path]`).

/// The calling thread's CPU time, in nanoseconds: on a machine shared with
/// other jobs, wall time counts the time others ran while this thread
/// waited for a core, CPU time does not.
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant
    // every Linux kernel since 2.6.12 knows.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
