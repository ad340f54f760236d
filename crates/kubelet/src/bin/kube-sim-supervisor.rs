//! `kube-sim-supervisor PROGRAM [ARGS...]`: what stands between the process kubelet and a
//! container's program when pods run without bubblewrap, so that no process of a pod outlives
//! it, whatever killed the program.
//!
//! The supervisor becomes a child subreaper (`PR_SET_CHILD_SUBREAPER`), starts PROGRAM and waits.
//! Whatever PROGRAM's processes leave behind when they die (say the `setsid`ed grandchild of a
//! runtime the OOM killer ended) is re-parented to the supervisor instead of to init, so it is
//! still found. When PROGRAM ends, or when standard input reaches its end (the kubelet closed its
//! end of the pipe: the pod is being killed, or the kubelet itself died), the supervisor kills
//! PROGRAM and then every process left under it, round after round until it has no child at
//! all, and exits as PROGRAM did: the same exit code, or killed by the same signal.
//!
//! It ignores the signals a process-group kill or a terminal sends (the kubelet's graceful
//! SIGTERM goes to the container's whole process group, the supervisor included), so only the
//! kubelet's end of file stops it early.
//!
//! Only `std` and a few C library calls: `build.rs` compiles this file on its own and the
//! kubelet embeds the executable (see `process`), because the supervisor must exist wherever
//! the kubelet library is linked (the sim, test binaries of other crates, `sandboxctl`), and a
//! forked but not re-executed copy of the kubelet's process would keep its memory alive for
//! every pod.

// The C library calls below (prctl, signal, kill, waitpid, waitid) have no safe wrapper in std,
// and this program may use nothing but std; every block carries a `// SAFETY:` comment.
#![allow(unsafe_code)]

use std::ffi::{c_int, c_uint, c_ulong};
use std::io::{self, Read as _};
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::process::{Command, ExitCode, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError};

#[cfg(not(any(
    target_arch = "x86_64",
    target_arch = "x86",
    target_arch = "aarch64",
    target_arch = "arm",
    target_arch = "riscv64"
)))]
compile_error!("kube-sim-supervisor knows the signal numbers of x86, Arm and RISC-V Linux only");

/// The C library calls and constants of Linux on x86, Arm and RISC-V.
mod sys {
    use std::ffi::{c_int, c_uint};

    pub(crate) const PR_SET_DUMPABLE: c_int = 4;
    pub(crate) const PR_SET_CHILD_SUBREAPER: c_int = 36;
    pub(crate) const SIG_DFL: usize = 0;
    pub(crate) const SIG_IGN: usize = 1;
    pub(crate) const SIGKILL: c_int = 9;
    pub(crate) const WNOHANG: c_int = 1;
    pub(crate) const WEXITED: c_int = 4;
    pub(crate) const WNOWAIT: c_int = 0x0100_0000;
    pub(crate) const P_ALL: c_int = 0;
    pub(crate) const EINTR: i32 = 4;

    /// Room for a `siginfo_t` (128 bytes); its fields are not read.
    #[repr(C, align(8))]
    pub(crate) struct SigInfo(pub(crate) [u8; 128]);

    unsafe extern "C" {
        pub(crate) fn prctl(option: c_int, ...) -> c_int;
        pub(crate) fn signal(signum: c_int, handler: usize) -> usize;
        pub(crate) fn kill(pid: i32, signal: c_int) -> c_int;
        pub(crate) fn getpid() -> i32;
        pub(crate) fn waitpid(pid: i32, status: *mut c_int, options: c_int) -> i32;
        pub(crate) fn waitid(
            idtype: c_int,
            id: c_uint,
            info: *mut SigInfo,
            options: c_int,
        ) -> c_int;
    }
}

/// Signals a group kill, a terminal or a dying session sends: SIGHUP, SIGINT, SIGQUIT, SIGUSR1,
/// SIGUSR2, SIGPIPE, SIGALRM, SIGTERM, SIGTSTP, SIGTTIN, SIGTTOU.
const IGNORED: [c_int; 11] = [1, 2, 3, 10, 12, 13, 14, 15, 20, 21, 22];

/// Exit code for a failure of the supervisor itself (as `env` and `timeout` use it).
const SUPERVISOR_FAILED: u8 = 125;

fn set_signals(handler: usize) {
    for signal in IGNORED {
        // SAFETY: signal(2) with a signal number and SIG_DFL or SIG_IGN (no handler function);
        // async-signal-safe, so it may also run between fork and exec.
        unsafe { sys::signal(signal, handler) };
    }
}

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let Some(program) = args.next() else {
        eprintln!("usage: kube-sim-supervisor PROGRAM [ARGS...]");
        return ExitCode::from(SUPERVISOR_FAILED);
    };
    // SAFETY: prctl(2) with integer arguments only.
    if unsafe { sys::prctl(sys::PR_SET_CHILD_SUBREAPER, 1 as c_ulong) } != 0 {
        eprintln!(
            "kube-sim-supervisor: cannot become a child subreaper: {}",
            io::Error::last_os_error()
        );
        return ExitCode::from(SUPERVISOR_FAILED);
    }
    set_signals(sys::SIG_IGN);
    let mut command = Command::new(&program);
    command.args(args).stdin(Stdio::null());
    // SAFETY: the closure runs between fork and exec and only calls signal(2) (see
    // `set_signals`), so that PROGRAM starts with the default dispositions instead of ours.
    unsafe {
        command.pre_exec(|| {
            set_signals(sys::SIG_DFL);
            Ok(())
        });
    }
    let child = match command.spawn() {
        Ok(child) => child,
        Err(error) => {
            eprintln!("kube-sim-supervisor: failed to start {program:?}: {error}");
            // As a shell reports it: 127 not found, 126 found but not executable.
            let code = match error.kind() {
                io::ErrorKind::NotFound => 127,
                _ => 126,
            };
            return ExitCode::from(code);
        }
    };
    let Ok(main) = i32::try_from(child.id()) else {
        return ExitCode::from(SUPERVISOR_FAILED);
    };
    // PROGRAM's wait status once reaped. Whoever holds the lock may signal `main` by pid: until
    // it is reaped (which needs the lock), the pid cannot be reused by another process.
    let reaped: Arc<Mutex<Option<c_int>>> = Arc::new(Mutex::new(None));
    let stop = Arc::clone(&reaped);
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
        let reaped = stop.lock().unwrap_or_else(PoisonError::into_inner);
        if reaped.is_none() {
            // SAFETY: kill(2) with integers; `main` is our unreaped child (see `reaped`).
            unsafe { sys::kill(main, sys::SIGKILL) };
        }
    });
    let status = wait_for(main, &reaped);
    kill_every_descendant();
    match status {
        Some(status) => exit_like(ExitStatus::from_raw(status)),
        None => ExitCode::from(SUPERVISOR_FAILED),
    }
}

/// Reaps children (adopted orphans too) until `main` has ended; its wait status.
fn wait_for(main: i32, reaped: &Mutex<Option<c_int>>) -> Option<c_int> {
    loop {
        let mut info = sys::SigInfo([0; 128]);
        // SAFETY: waitid(2) writes at most a siginfo_t (128 bytes) into `info`. WNOWAIT leaves
        // the child unreaped, so that reaping happens under the lock below.
        let waited = unsafe {
            sys::waitid(
                sys::P_ALL,
                0 as c_uint,
                &raw mut info,
                sys::WEXITED | sys::WNOWAIT,
            )
        };
        if waited != 0 {
            if io::Error::last_os_error().raw_os_error() == Some(sys::EINTR) {
                continue;
            }
            // ECHILD: no child at all, which cannot be while `main` is unreaped.
            return None;
        }
        let mut guard = reaped.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            let mut status: c_int = 0;
            // SAFETY: waitpid(2) writes one c_int into `status`.
            let pid = unsafe { sys::waitpid(-1, &raw mut status, sys::WNOHANG) };
            if pid <= 0 {
                break;
            }
            if pid == main {
                *guard = Some(status);
            }
        }
        if let Some(status) = *guard {
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
            // SAFETY: kill(2) with integers. The pid is our unreaped child: only this thread
            // reaps, so it names no other process.
            unsafe { sys::kill(pid, sys::SIGKILL) };
        }
        let mut status: c_int = 0;
        // SAFETY: waitpid(2) writes one c_int into `status`.
        if unsafe { sys::waitpid(-1, &raw mut status, 0) } == -1
            && io::Error::last_os_error().raw_os_error() != Some(sys::EINTR)
        {
            // ECHILD: none left.
            return;
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

fn parse_pids(list: &str) -> impl Iterator<Item = i32> + '_ {
    list.split_ascii_whitespace()
        .filter_map(|pid| pid.parse().ok())
}

fn children_by_parent() -> Vec<i32> {
    // SAFETY: getpid(2) has no arguments.
    let me = unsafe { sys::getpid() };
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
fn parent_in_stat(stat: &str) -> Option<i32> {
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Ends this process as `status` says PROGRAM ended.
fn exit_like(status: ExitStatus) -> ExitCode {
    if let Some(code) = status.code() {
        return ExitCode::from(u8::try_from(code).unwrap_or(SUPERVISOR_FAILED));
    }
    let Some(signal) = status.signal() else {
        return ExitCode::from(SUPERVISOR_FAILED);
    };
    // SAFETY: prctl(2) and signal(2) with integers, then kill(2) of ourselves with the signal
    // that ended PROGRAM. Not dumpable: a SIGSEGV passed on must not write a core file of the
    // supervisor.
    unsafe {
        sys::prctl(sys::PR_SET_DUMPABLE, 0 as c_ulong);
        sys::signal(signal, sys::SIG_DFL);
        sys::kill(sys::getpid(), signal);
    }
    // Still alive: a signal whose default is not to terminate. Report it as a shell would.
    ExitCode::from(u8::try_from(128 + signal).unwrap_or(SUPERVISOR_FAILED))
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
