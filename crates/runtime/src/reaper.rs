//! The runtime as the parent of last resort of everything its commands start, when it owns its
//! process ([`crate::run`], [`crate::run_until`]: the `sandbox-runtime` binary and the local
//! cluster's runtime subcommand; an embedded [`crate::Server`] leaves its process alone).
//!
//! A descendant of a command that leaves the command's process group (`setsid`, `setpgid`)
//! escapes the group kill, and when its parent exits the kernel re-parents it to the nearest
//! child subreaper, else to the init of its PID namespace. So that no such process outlives the
//! runtime or lingers as a zombie, the runtime takes one of two [`Role`]s at start:
//!
//! - **init**: PID 1 of its PID namespace (the container's program, as on a Kubernetes node,
//!   and in local mode's pods). Orphans of the namespace are re-parented to it anyway, and when
//!   it exits, whatever the cause, SIGKILL included, the kernel kills every process of the
//!   namespace. Processes of the namespace can send it only the signals it handles: the kernel
//!   drops the others, SIGKILL and SIGSTOP included, so its own sandbox can neither kill nor
//!   stop it.
//! - **subreaper** otherwise: it sets `PR_SET_CHILD_SUBREAPER`, so that orphans of its commands
//!   are re-parented to it, and when it exits ([`Reaper`] dropped: a graceful shutdown, an
//!   error or a panic) it kills its children round after round until it has none. SIGKILL
//!   leaves no such chance: then each command's leader still dies of its parent-death signal,
//!   but the rest of its tree is re-parented above the runtime.
//!
//! In both roles [`Reaper::reap_orphans`] reaps adopted orphans as they exit (on SIGCHLD), and it never
//! takes the exit status of a command the runtime waits for. The kernel attaches a child to the
//! *thread* that started it: commands are started by tokio's worker threads, while an orphan
//! re-parented to the process goes to its first live thread, the main thread. [`Reaper::reap_orphans`]
//! runs on the main thread (in the future `run_until` blocks on, never in a spawned task) and
//! waits with `__WNOTHREAD`, so it sees the adopted orphans and none of the commands. The same
//! holds when the runtime is PID 1: the kernel hands orphans to the namespace's init task, its
//! main thread. (Starting a command from the main thread would break this; nothing does, and
//! `exec::spawn` says so.)
//!
//! Signals the runtime handles: SIGTERM and SIGINT (graceful shutdown) and SIGCHLD (reaping).
//! Nothing else: no stop signal (SIGTSTP, SIGTTIN, SIGTTOU keep their default, which the kernel
//! drops for an init), and Rust's own SIGSEGV and SIGBUS handlers return to their default after
//! a signal that is not a stack overflow.

use std::collections::HashSet;
use std::io;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, WaitId, WaitIdOptions, WaitOptions};
use tokio_util::sync::CancellationToken;

/// `__WNOTHREAD`: wait for the calling thread's children only.
const THIS_THREAD: WaitIdOptions = WaitIdOptions::from_bits_retain(libc::__WNOTHREAD as u32);
/// `__WALL`: wait for every child, whatever signal it reports its end with.
const ALL_CHILDREN: WaitOptions = WaitOptions::from_bits_retain(libc::__WALL as u32);

/// Most adopted orphans reaped in one go before the reaper lets other tasks run.
const REAP_BATCH: usize = 1024;
/// How often the exit sweep looks for children that have died.
const SWEEP_POLL: Duration = Duration::from_millis(2);

/// How the runtime stands towards the orphans of its commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// PID 1 of its PID namespace.
    Init,
    /// A child subreaper (`PR_SET_CHILD_SUBREAPER`).
    Subreaper,
    /// Neither (the kernel refused `PR_SET_CHILD_SUBREAPER`): orphans of commands go elsewhere.
    Neither(rustix::io::Errno),
}

/// The role the process could take (init, else subreaper); dropped in the subreaper role, it
/// kills every descendant left (within `sweep_limit`).
#[derive(Debug)]
pub(crate) struct Reaper {
    role: Role,
    sweep_limit: Duration,
}

impl Reaper {
    /// Becomes init or a subreaper (see [`Reaper::log`]).
    pub(crate) fn adopt(sweep_limit: Duration) -> Self {
        let role = if rustix::process::getpid().is_init() {
            Role::Init
        } else {
            match rustix::process::set_child_subreaper(Some(rustix::process::getpid())) {
                Ok(()) => Role::Subreaper,
                Err(error) => Role::Neither(error),
            }
        };
        Self { role, sweep_limit }
    }

    /// Reaps adopted orphans as they exit, until `stop` is cancelled. To be awaited on the main
    /// thread, which the kernel gives adopted orphans to (see the module documentation), in the
    /// future a runtime blocks on; elsewhere it says so and reaps nothing.
    pub(crate) async fn reap_orphans(&self, stop: CancellationToken) {
        if rustix::thread::gettid() != rustix::process::getpid() {
            tracing::warn!(
                "not on the process's main thread: orphaned processes are not reaped and stay \
                 zombies until the runtime exits"
            );
            return;
        }
        reap_orphans(stop).await;
    }

    /// Says which role it took (once the server is bound, so that a configuration error stays
    /// the only line).
    pub(crate) fn log(&self) {
        match self.role {
            Role::Init => tracing::info!(
                "PID 1 of its PID namespace: reaps orphaned processes, and processes of the \
                 sandbox cannot kill or stop it; all of them end when it ends"
            ),
            Role::Subreaper => tracing::info!(
                "child subreaper: reaps the orphans of its commands and kills every process left \
                 below it when it exits"
            ),
            Role::Neither(error) => tracing::warn!(
                %error,
                "cannot become a child subreaper (PR_SET_CHILD_SUBREAPER): processes that leave \
                 their command's process group may outlive the runtime"
            ),
        }
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        if self.role == Role::Subreaper {
            sweep(self.sweep_limit);
        }
    }
}

/// Reaps the children of this thread as they exit, until `stop` is cancelled.
async fn reap_orphans(stop: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut exits = match signal(SignalKind::child()) {
        Ok(exits) => exits,
        Err(error) => {
            tracing::warn!(%error, "cannot watch SIGCHLD: orphaned processes stay zombies");
            return;
        }
    };
    loop {
        // Exits before the handler was installed, and any signals merged into one.
        if reap_exited(REAP_BATCH) == REAP_BATCH {
            tokio::task::yield_now().await;
            continue;
        }
        tokio::select! {
            _ = exits.recv() => {}
            () = stop.cancelled() => return,
        }
    }
}

/// Reaps at most `limit` children of the calling thread that have exited (on the main thread:
/// adopted orphans); returns how many it reaped. Children of other threads (commands) are not
/// seen.
pub(crate) fn reap_exited(limit: usize) -> usize {
    let options = WaitIdOptions::EXITED | WaitIdOptions::NOHANG | THIS_THREAD;
    for reaped in 0..limit {
        match rustix::process::waitid(WaitId::All, options) {
            Ok(Some(_)) => {}
            // None has exited, or there is no such child (ECHILD).
            Ok(None) | Err(_) => return reaped,
        }
    }
    limit
}

/// Kills every child, reaps the dead, and again, until no child is left or `limit` has passed.
///
/// This ends: a process becomes our child only when its parent dies, and every child listed is
/// sent SIGKILL, so each round leaves fewer processes below us. Only direct children are
/// signalled: they are not reaped yet (only this thread reaps now), so their pids cannot have
/// been reused.
fn sweep(limit: Duration) {
    let Some(children) = Children::of_this_process() else {
        tracing::warn!(
            "cannot list this process's children (/proc is not mounted for its PID namespace): \
             processes that left their command's process group may outlive the runtime"
        );
        return;
    };
    let deadline = Instant::now() + limit;
    let mut killed = HashSet::new();
    loop {
        let listed = children.list();
        for pid in &listed {
            if rustix::process::kill_process(*pid, Signal::KILL).is_ok() {
                killed.insert(*pid);
            }
        }
        // Reap everything that is dead, commands included: nobody else waits any more (the
        // tokio runtime is gone, and with it its threads, whose children are now this one's).
        let mut reaped = false;
        loop {
            // `wait`, any child (rustix's `waitpid(None)` is the caller's process group).
            match rustix::process::wait(WaitOptions::NOHANG | ALL_CHILDREN) {
                Ok(Some(_)) => reaped = true,
                Ok(None) => break,
                // ECHILD: no child left at all.
                Err(_) => {
                    if !killed.is_empty() {
                        tracing::info!(
                            killed = killed.len(),
                            "killed the processes left below the runtime"
                        );
                    }
                    return;
                }
            }
        }
        if Instant::now() >= deadline {
            tracing::warn!(
                left = listed.len(),
                ?limit,
                "processes below the runtime did not end in time after SIGKILL"
            );
            return;
        }
        if !reaped {
            std::thread::sleep(SWEEP_POLL);
        }
    }
}

/// Where this process's children are listed.
#[derive(Debug)]
enum Children {
    /// `/proc/self/task/TID/children` (a child belongs to the thread that started or adopted it).
    TaskLists,
    /// The parent field of every `/proc/PID/stat` (kernels without `CONFIG_PROC_CHILDREN`).
    Scan,
}

impl Children {
    /// How to list them, if `/proc` is this process's PID namespace's (else the pids it shows
    /// are not ours to signal).
    fn of_this_process() -> Option<Self> {
        let own = rustix::process::getpid().as_raw_nonzero().get().to_string();
        let proc_self = std::fs::read_link("/proc/self").ok()?;
        if proc_self.as_os_str() != own.as_str() {
            return None;
        }
        let task = format!("/proc/self/task/{own}/children");
        Some(if std::fs::metadata(task).is_ok() {
            Self::TaskLists
        } else {
            Self::Scan
        })
    }

    fn list(&self) -> Vec<Pid> {
        match self {
            Self::TaskLists => task_children().unwrap_or_default(),
            Self::Scan => scan_children(),
        }
    }
}

fn task_children() -> io::Result<Vec<Pid>> {
    let mut pids = Vec::new();
    for task in std::fs::read_dir("/proc/self/task")? {
        let Ok(task) = task else { continue };
        // A thread that has just ended has no list: its children went to another thread.
        let Ok(list) = std::fs::read_to_string(task.path().join("children")) else {
            continue;
        };
        pids.extend(parse_pids(&list));
    }
    Ok(pids)
}

fn scan_children() -> Vec<Pid> {
    let own = rustix::process::getpid().as_raw_nonzero().get();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| parent_of(&stat))
                == Some(own)
        })
        .filter_map(Pid::from_raw)
        .collect()
}

/// The pids of a `children` list (space-separated).
fn parse_pids(list: &str) -> impl Iterator<Item = Pid> + '_ {
    list.split_ascii_whitespace()
        .filter_map(|pid| pid.parse().ok())
        .filter_map(Pid::from_raw)
}

/// The parent pid in a `/proc/PID/stat` line (the field after the state, which follows the
/// command name in parentheses; the name may itself hold parentheses and spaces).
fn parent_of(stat: &str) -> Option<i32> {
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_ascii_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn stat_and_children_lists_parse() {
        assert_eq!(
            parent_of("42 (a) b (c) S 7 42 42 0 -1 4194560 ..."),
            Some(7)
        );
        assert_eq!(parent_of("garbage"), None);
        let pids: Vec<i32> = parse_pids("12 34 x 0\n")
            .map(|pid| pid.as_raw_nonzero().get())
            .collect();
        assert_eq!(pids, [12, 34]);
    }

    /// A command that has exited is left to the driver that waits for it: started by another
    /// thread (as tokio's workers start every command), it is not seen by the reaper's wait, and
    /// its exit status stays intact.
    #[test]
    fn the_reaper_never_takes_a_commands_exit_status() {
        use crate::exec::launch::{Plan, launch};
        use std::os::fd::{AsFd, AsRawFd};
        use std::sync::mpsc;
        let null = std::fs::File::open("/dev/null").unwrap();
        let argv = ["sh".to_owned(), "-c".to_owned(), "exit 7".to_owned()];
        let mut plan = Plan::new(&argv, &std::env::temp_dir(), &[]).unwrap();
        plan.stdio = [null.as_raw_fd(); 3];
        let (exited_tx, exited_rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        std::thread::scope(|scope| {
            // Dropped if this thread fails, so that the starter ends and the scope can too.
            let done_tx = done_tx;
            let starter = scope.spawn(move || {
                let launched = launch(&plan).unwrap();
                let pidfd = || WaitId::PidFd(launched.pidfd.as_fd());
                // Its end, without reaping it.
                let exited = WaitIdOptions::EXITED | WaitIdOptions::NOWAIT;
                rustix::process::waitid(pidfd(), exited).unwrap();
                exited_tx.send(()).unwrap();
                // The command's parent stays alive (it would die with this thread otherwise).
                let _ = done_rx.recv();
                let status = rustix::process::waitid(pidfd(), WaitIdOptions::EXITED);
                status.map(|status| status.and_then(|status| status.exit_status()))
            });
            exited_rx.recv().unwrap();
            assert_eq!(reap_exited(16), 0, "the reaper took the command");
            done_tx.send(()).unwrap();
            assert_eq!(starter.join().unwrap(), Ok(Some(7)));
        });
    }
}
