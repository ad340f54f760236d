//! Supervision: what stands between the kubelet and a container's first process, so that no
//! process of it outlives it, whatever killed it.
//!
//! The supervisor waits for its child (the container's init, or in `supervise` mode the plain
//! program) and reaps whatever else it adopted. When the child ends, or when standard input
//! reaches its end (the kubelet closed its end of the pipe: the container is being killed, or
//! the kubelet itself died), it kills the child and then every process left under it, round
//! after round until it has no child at all, and exits as the child did: the same exit code, or
//! killed by the same signal. A confined container's init is PID 1 of its own PID namespace, so
//! its death takes every process of the container with it.
//!
//! It ignores the signals a process-group kill or a terminal sends (the kubelet's graceful
//! SIGTERM goes to the container's whole process group, the supervisor included), so only the
//! kubelet's end of file stops it early.

use std::ffi::c_int;
use std::io::{self, Read as _};
use std::os::unix::process::ExitStatusExt as _;
use std::process::{ExitCode, ExitStatus};
use std::sync::{Arc, Mutex, PoisonError};

use crate::sys;

/// Signals a group kill, a terminal or a dying session sends: SIGHUP, SIGINT, SIGQUIT, SIGUSR1,
/// SIGUSR2, SIGPIPE, SIGALRM, SIGTERM, SIGTSTP, SIGTTIN, SIGTTOU.
const IGNORED: [c_int; 11] = [1, 2, 3, 10, 12, 13, 14, 15, 20, 21, 22];

/// Exit code for a failure of the helper itself (as `env` and `timeout` use it).
pub(crate) const FAILED: u8 = 125;

/// Ignores (`sys::SIG_IGN`) or restores (`sys::SIG_DFL`) the [`IGNORED`] signals.
pub(crate) fn set_signals(handler: usize) {
    for signal in IGNORED {
        sys::set_signal(signal, handler);
    }
}

/// The end of standard input, watched by a thread of its own: started before the child exists
/// (a process that has made a PID namespace for its children can start no thread), it kills
/// the child once there is one.
#[derive(Debug)]
pub(crate) struct Watcher {
    state: Arc<Mutex<State>>,
}

#[derive(Debug, Default)]
struct State {
    /// The child, until reaped. Whoever holds the lock may signal it by pid: until it is
    /// reaped (which needs the lock), the pid cannot be reused by another process.
    child: Option<i32>,
    /// Its wait status, once reaped.
    reaped: Option<c_int>,
    /// Standard input has ended.
    stop: bool,
}

impl Watcher {
    pub(crate) fn start() -> Self {
        let state = Arc::new(Mutex::new(State::default()));
        let shared = Arc::clone(&state);
        std::thread::spawn(move || {
            let mut stdin = io::stdin().lock();
            let mut buffer = [0u8; 64];
            loop {
                match stdin.read(&mut buffer) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
            let mut state = shared.lock().unwrap_or_else(PoisonError::into_inner);
            state.stop = true;
            if let (Some(child), None) = (state.child, state.reaped) {
                sys::kill(child, sys::SIGKILL);
            }
        });
        Self { state }
    }

    /// Supervises `main`, a child of this process: returns once it and everything below it
    /// are gone.
    pub(crate) fn supervise(self, main: i32) -> ExitCode {
        set_signals(sys::SIG_IGN);
        {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            state.child = Some(main);
            if state.stop {
                sys::kill(main, sys::SIGKILL);
            }
        }
        let status = wait_for(main, &self.state);
        kill_every_descendant();
        match status {
            Some(status) => exit_like(ExitStatus::from_raw(status)),
            None => ExitCode::from(FAILED),
        }
    }
}

/// Reaps children (adopted orphans too) until `main` has ended; its wait status.
fn wait_for(main: i32, state: &Mutex<State>) -> Option<c_int> {
    loop {
        // WNOWAIT leaves the child unreaped, so that reaping happens under the lock below.
        if let Err(error) = sys::wait_any_exited() {
            if error.raw_os_error() == Some(sys::EINTR) {
                continue;
            }
            // ECHILD: no child at all, which cannot be while `main` is unreaped.
            return None;
        }
        let mut guard = state.lock().unwrap_or_else(PoisonError::into_inner);
        while let Ok((pid, status)) = sys::waitpid(-1, sys::WNOHANG) {
            if pid <= 0 {
                break;
            }
            if pid == main {
                guard.reaped = Some(status);
            }
        }
        if let Some(status) = guard.reaped {
            return Some(status);
        }
    }
}

/// Kills every child, reaps one, and again, until there is no child left.
///
/// This ends: every child listed is sent SIGKILL (a killed process forks no more), each round
/// reaps one process, and a process becomes our child only when its parent dies, which either
/// is one of our children (its end wakes the wait below) or happens under one of them.
fn kill_every_descendant() {
    loop {
        for pid in children() {
            // The pid is our unreaped child: only this thread reaps, so it names no other
            // process.
            sys::kill(pid, sys::SIGKILL);
        }
        match sys::waitpid(-1, 0) {
            Ok(_) => {}
            Err(error) if error.raw_os_error() == Some(sys::EINTR) => {}
            // ECHILD: none left.
            Err(_) => return,
        }
    }
}

/// Our children, from each thread's `/proc/self/task/TID/children` (a child belongs to the
/// thread that forked it or adopted it), else from every process's parent in `/proc`.
fn children() -> Vec<i32> {
    let mut pids = Vec::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return children_by_parent();
    };
    for task in tasks.flatten() {
        match std::fs::read_to_string(task.path().join("children")) {
            Ok(list) => pids.extend(parse_pids(&list)),
            // A kernel without CONFIG_PROC_CHILDREN.
            Err(_) => return children_by_parent(),
        }
    }
    pids
}

pub(crate) fn parse_pids(list: &str) -> impl Iterator<Item = i32> + '_ {
    list.split_ascii_whitespace()
        .filter_map(|pid| pid.parse().ok())
}

fn children_by_parent() -> Vec<i32> {
    let me = sys::getpid();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| parent_in_stat(&stat))
                == Some(me)
        })
        .collect()
}

/// The parent pid in a `/proc/PID/stat` line (the fourth field; the second, the command name in
/// parentheses, may itself contain spaces and parentheses).
pub(crate) fn parent_in_stat(stat: &str) -> Option<i32> {
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Ends this process as `status` says the child ended.
pub(crate) fn exit_like(status: ExitStatus) -> ExitCode {
    if let Some(code) = status.code() {
        return ExitCode::from(u8::try_from(code).unwrap_or(FAILED));
    }
    let Some(signal) = status.signal() else {
        return ExitCode::from(FAILED);
    };
    // Not dumpable: a SIGSEGV passed on must not write a core file of the helper. Then the
    // signal that ended the child, with its default action.
    let _ = sys::prctl(sys::PR_SET_DUMPABLE, 0);
    sys::set_signal(signal, sys::SIG_DFL);
    sys::kill(sys::getpid(), signal);
    // Still alive: a signal whose default is not to terminate. Report it as a shell would.
    ExitCode::from(u8::try_from(128 + signal).unwrap_or(FAILED))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn child_lists_and_stat_lines_parse() {
        assert_eq!(parse_pids("12 345 \n").collect::<Vec<_>>(), [12, 345]);
        assert_eq!(parse_pids("").count(), 0);
        assert_eq!(parent_in_stat("42 (a) b) S 7 42 42 0"), Some(7));
        assert_eq!(parent_in_stat("42 (sleep) S 1 42"), Some(1));
        assert_eq!(parent_in_stat("garbage"), None);
    }
}
