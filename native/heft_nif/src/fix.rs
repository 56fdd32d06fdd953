//! `safe_fixtable/2`'s bookkeeping: which processes have fixed a table, how
//! many times each, and since when.
//!
//! Heft's first/next walks need no fixing (they resume from any key,
//! present or not; see heft_core's index), so a fixation changes only what
//! `info/2` reports, which is ETS's (`:fixed`, `:safe_fixed` and
//! `:safe_fixed_monotonic_time`), and how `slot/2` numbers a hash table's
//! slots: as they were when the table became fixed, so that they stay put
//! however the index grows or shrinks (heft_core's `Table::slot`). A process's fixations end when it exits, as
//! in ETS; Heft notices that when the table's fixations are next looked at
//! (a liveness check), which nobody can tell from releasing them at the exit.

use parking_lot::Mutex;
use rustler::{Env, LocalPid};

/// The fixations of one table.
#[derive(Default)]
pub struct Fixations(Mutex<State>);

#[derive(Default)]
struct State {
    /// Monotonic time (native units) when the table became fixed.
    since: i64,
    /// The hash table's slot bits then (`None` for an ordered_set).
    slot_bits: Option<u32>,
    /// Fixing processes, first fixer first, with their fixation counts.
    procs: Vec<(LocalPid, u64)>,
}

impl State {
    /// Forgets the fixations of processes that have exited.
    fn purge(&mut self, env: Env) {
        self.procs.retain(|(pid, _)| env.is_process_alive(*pid));
    }
}

impl Fixations {
    /// Fixes (`on`) or unfixes the table once for the calling process, at
    /// monotonic time `now`, when its slot bits are `slot_bits`. Unfixing a
    /// table the caller has not fixed does nothing, as in ETS.
    pub fn fix(&self, env: Env, on: bool, now: i64, slot_bits: Option<u32>) {
        let me = env.pid();
        let mut st = self.0.lock();
        st.purge(env);
        let at = st.procs.iter().position(|(pid, _)| *pid == me);
        match (on, at) {
            (true, Some(i)) => st.procs[i].1 += 1,
            (true, None) => {
                if st.procs.is_empty() {
                    st.since = now;
                    st.slot_bits = slot_bits;
                }
                st.procs.push((me, 1));
            }
            (false, Some(i)) => {
                st.procs[i].1 -= 1;
                if st.procs[i].1 == 0 {
                    st.procs.remove(i);
                }
            }
            (false, None) => {}
        }
    }

    /// `None` if no live process has the table fixed, else the monotonic
    /// time it became fixed and each fixing process with its count.
    pub fn get(&self, env: Env) -> Option<(i64, Vec<(LocalPid, u64)>)> {
        let mut st = self.0.lock();
        st.purge(env);
        (!st.procs.is_empty()).then(|| (st.since, st.procs.clone()))
    }

    /// The slot bits of the table when it became fixed, if it is fixed.
    pub fn slot_bits(&self, env: Env) -> Option<u32> {
        let mut st = self.0.lock();
        st.purge(env);
        st.slot_bits.filter(|_| !st.procs.is_empty())
    }
}
