//! Starting a child: its own session and process group, a parent-death signal, piped output,
//! kill-on-drop, and optional hardening. This is the crate's only `unsafe`: the `pre_exec` hook.
//!
//! The parent-death signal is tied to the *thread* that forks, so children must be spawned from
//! a long-lived thread: a tokio worker (any `async` context), never a `spawn_blocking` thread,
//! which exits when idle and would take its children with it.

use std::io;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;

use rustix::process::Signal;
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout};

use super::groups::{GroupGuard, Groups};
use crate::harden::Hardening;

/// What to run.
#[derive(Debug, Clone)]
pub(crate) struct CommandSpec {
    /// Program (looked up in `PATH` when it has no `/`) and arguments; never empty.
    pub(crate) argv: Vec<String>,
    /// Absolute working directory (already confined).
    pub(crate) cwd: PathBuf,
    /// Variables added to the runtime's environment.
    pub(crate) env: Vec<(String, String)>,
    /// Whether standard input is a pipe (else `/dev/null`).
    pub(crate) stdin_piped: bool,
}

/// A started child with its pipes and the guard of its process group.
#[derive(Debug)]
pub(crate) struct Spawned {
    pub(crate) child: Child,
    pub(crate) pid: u32,
    pub(crate) stdout: ChildStdout,
    pub(crate) stderr: ChildStderr,
    pub(crate) stdin: Option<ChildStdin>,
    pub(crate) group: GroupGuard,
}

/// Starts `spec`. Errors are those of `execve` (not found, not executable) or of the hook.
#[allow(unsafe_code)]
pub(crate) fn spawn(
    spec: &CommandSpec,
    groups: &Arc<Groups>,
    hardening: Option<&Hardening>,
) -> io::Result<Spawned> {
    let (program, args) = spec
        .argv
        .split_first()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no command given"))?;
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .current_dir(&spec.cwd)
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(if spec.stdin_piped {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);

    let parent = rustix::process::getpid();
    let no_new_privs = hardening.is_some();
    let ruleset = hardening.and_then(Hardening::ruleset_fd);
    // SAFETY: `pre_exec` runs the closure in the forked child before `execve`, where only
    // async-signal-safe operations are allowed. The closure captures only `Copy` values and
    // makes raw system calls (setsid, prctl, getppid, landlock_restrict_self) that neither
    // allocate nor take locks; errors are built from raw errno values, which does not allocate
    // either. The ruleset descriptor it uses is owned by `Hardening`, which outlives the call
    // to `spawn` (the child has its own copy of the descriptor table).
    unsafe {
        command.pre_exec(move || {
            // Own session and process group, so the whole tree can be signalled at once and no
            // controlling terminal is shared with the runtime.
            rustix::process::setsid()?;
            // Die with the runtime even if it is SIGKILLed.
            rustix::process::set_parent_process_death_signal(Some(Signal::KILL))?;
            // The runtime may have died between fork and prctl: then nobody would kill us.
            if rustix::process::getppid() != Some(parent) {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            if no_new_privs {
                rustix::thread::set_no_new_privs(true)?;
            }
            if let Some(fd) = ruleset {
                // landlock_restrict_self(2) takes a ruleset descriptor and flags, reads no
                // memory of ours, and is async-signal-safe.
                let rc = libc::syscall(libc::SYS_landlock_restrict_self, fd, 0u32);
                if rc != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }

    let mut child = command.spawn()?;
    let pid = child
        .id()
        .ok_or_else(|| io::Error::other("the child was reaped before its pid was read"))?;
    let pgid = i32::try_from(pid).map_err(|_| io::Error::other("pid out of range"))?;
    groups.insert(pgid);
    let group = GroupGuard::new(pgid, Arc::clone(groups));
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        // Unreachable with piped stdio; the guard kills the child.
        return Err(io::Error::other("the child's output pipes are missing"));
    };
    let stdin = child.stdin.take();
    Ok(Spawned {
        child,
        pid,
        stdout,
        stderr,
        stdin,
        group,
    })
}

/// Exit code a shell would report for a command that could not be started: 127 when it was not
/// found, 126 when it could not be executed, 1 otherwise.
pub(crate) fn spawn_failure_code(error: &io::Error) -> i32 {
    match error.raw_os_error() {
        Some(libc::ENOENT) => 127,
        Some(libc::EACCES | libc::ENOEXEC | libc::EISDIR | libc::ENOTDIR | libc::EPERM) => 126,
        _ => 1,
    }
}

/// `[Errno 2] No such file or directory: 'prog'`, the way upstream's Python reports it.
pub(crate) fn spawn_failure_message(error: &io::Error, program: &str) -> String {
    match error.raw_os_error() {
        Some(errno) => {
            let text = io::Error::from_raw_os_error(errno).to_string();
            let text = text
                .split(" (os error")
                .next()
                .unwrap_or(text.as_str())
                .to_owned();
            format!("[Errno {errno}] {text}: '{program}'")
        }
        None => format!("{error}: '{program}'"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_codes_and_messages() {
        let not_found = io::Error::from_raw_os_error(libc::ENOENT);
        assert_eq!(spawn_failure_code(&not_found), 127);
        assert_eq!(
            spawn_failure_message(&not_found, "nope"),
            "[Errno 2] No such file or directory: 'nope'"
        );
        assert_eq!(
            spawn_failure_code(&io::Error::from_raw_os_error(libc::EACCES)),
            126
        );
        assert_eq!(spawn_failure_code(&io::Error::other("x")), 1);
    }
}
