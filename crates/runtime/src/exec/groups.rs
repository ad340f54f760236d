//! The registry of process groups the runtime started, and the guard that kills one.
//!
//! Every command runs as the leader of its own session and process group (pgid = its pid). A
//! group stays registered while any member may be alive, including daemons a command left
//! behind after its leader exited, so that shutdown can kill every group.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rustix::process::{Pid, Signal};

/// Registry size from which empty groups are pruned on insert.
const PRUNE_AT: usize = 128;

/// Process groups that may still have members.
#[derive(Debug, Default)]
pub(crate) struct Groups {
    live: Mutex<HashSet<i32>>,
}

impl Groups {
    fn live(&self) -> MutexGuard<'_, HashSet<i32>> {
        self.live.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn insert(&self, pgid: i32) {
        let mut live = self.live();
        // Daemons left behind keep their group registered; forget the empty ones now and then.
        if live.len() >= PRUNE_AT {
            live.retain(|pgid| group_alive(*pgid));
        }
        live.insert(pgid);
    }

    fn remove(&self, pgid: i32) {
        self.live().remove(&pgid);
    }

    /// SIGKILLs every registered group (shutdown).
    pub(crate) fn kill_all(&self) {
        let groups: Vec<i32> = self.live().drain().collect();
        for pgid in groups {
            signal_group(pgid, Signal::KILL);
        }
    }
}

/// Whether any process of group `pgid` is alive (zombies count until reaped).
pub(crate) fn group_alive(pgid: i32) -> bool {
    Pid::from_raw(pgid).is_some_and(|pid| rustix::process::test_kill_process_group(pid).is_ok())
}

/// Sends `signal` to every process of group `pgid`; a group with no member left is not an
/// error.
pub(crate) fn signal_group(pgid: i32, signal: Signal) -> bool {
    Pid::from_raw(pgid).is_some_and(|pid| rustix::process::kill_process_group(pid, signal).is_ok())
}

/// Owns one registered group: kills it when dropped while armed (a sync `/execute` whose client
/// went away drops its future, and with it this guard).
#[derive(Debug)]
pub(crate) struct GroupGuard {
    pgid: i32,
    groups: Arc<Groups>,
    armed: bool,
}

impl GroupGuard {
    pub(crate) fn new(pgid: i32, groups: Arc<Groups>) -> Self {
        Self {
            pgid,
            groups,
            armed: true,
        }
    }

    /// The process group id.
    pub(crate) fn pgid(&self) -> i32 {
        self.pgid
    }

    /// SIGKILLs the whole group.
    pub(crate) fn kill(&self) {
        signal_group(self.pgid, Signal::KILL);
    }

    /// Called when the command is over: a group whose members are all gone is forgotten;
    /// one with survivors (daemons started with `&` that closed their output) stays registered
    /// until shutdown.
    pub(crate) fn finish(mut self) {
        self.armed = false;
        if !group_alive(self.pgid) {
            self.groups.remove(self.pgid);
        }
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if self.armed {
            self.kill();
            self.groups.remove(self.pgid);
        }
    }
}
