//! Starting a command: its own session and process group, a parent-death signal, piped
//! output and optional hardening ([`super::launch`] does the starting and gives the [`Child`]
//! the driver waits on).
//!
//! The parent-death signal is tied to the *thread* that starts the child, so children must be
//! spawned from a long-lived thread: a tokio worker (any `async` context), never a
//! `spawn_blocking` thread, which exits when idle and would take its children with it. Nor from
//! the main thread when the runtime owns the process: the reaper of adopted orphans waits for
//! that thread's children (`crate::reaper`).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use tokio::net::unix::pipe;

use super::groups::{GroupGuard, Groups};
use super::launch::{Child, Plan, launch};
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
    pub(crate) stdout: pipe::Receiver,
    pub(crate) stderr: pipe::Receiver,
    pub(crate) stdin: Option<pipe::Sender>,
    pub(crate) group: GroupGuard,
}

/// Starts `spec`. Errors are those of `execve` (not found, not executable), of a setup step in
/// the child, or of making the pipes.
pub(crate) fn spawn(
    spec: &CommandSpec,
    groups: &Arc<Groups>,
    hardening: Option<&Hardening>,
) -> io::Result<Spawned> {
    let mut plan = Plan::new(&spec.argv, &spec.cwd, &spec.env)?;
    let (stdout, stdout_child) = std::io::pipe()?;
    let (stderr, stderr_child) = std::io::pipe()?;
    let (stdin, stdin_child) = if spec.stdin_piped {
        let (read, write) = std::io::pipe()?;
        (Some(write), Some(read))
    } else {
        (None, None)
    };
    plan.stdio = [
        match &stdin_child {
            Some(read) => read.as_raw_fd(),
            None => dev_null()?.as_raw_fd(),
        },
        stdout_child.as_raw_fd(),
        stderr_child.as_raw_fd(),
    ];
    plan.no_new_privs = hardening.is_some();
    plan.landlock = hardening.and_then(Hardening::ruleset_fd);
    let launched = launch(&plan)?;
    // The child has its copies; ours would keep its pipes from ever reaching end of file.
    drop((stdin_child, stdout_child, stderr_child));
    let pgid = launched.pid.as_raw_nonzero().get();
    groups.insert(pgid);
    let group = GroupGuard::new(pgid, Arc::clone(groups));
    // From here on an error drops `child` and `group`, which kill and reap the command.
    let child = Child::new(launched)?;
    Ok(Spawned {
        pid: pgid.unsigned_abs(),
        stdout: pipe::Receiver::from_owned_fd_unchecked(nonblocking(stdout.into())?)?,
        stderr: pipe::Receiver::from_owned_fd_unchecked(nonblocking(stderr.into())?)?,
        stdin: stdin
            .map(|write| pipe::Sender::from_owned_fd_unchecked(nonblocking(write.into())?))
            .transpose()?,
        child,
        group,
    })
}

/// `/dev/null`, opened once (close-on-exec), for the standard input of every command that gets
/// none.
fn dev_null() -> io::Result<&'static OwnedFd> {
    static DEV_NULL: OnceLock<OwnedFd> = OnceLock::new();
    if let Some(fd) = DEV_NULL.get() {
        return Ok(fd);
    }
    let opened = OwnedFd::from(std::fs::File::open("/dev/null")?);
    Ok(DEV_NULL.get_or_init(|| opened))
}

/// Our end of a pipe, made non-blocking for the reactor (the child's end stays blocking: the
/// two ends are separate open files).
fn nonblocking(fd: OwnedFd) -> io::Result<OwnedFd> {
    rustix::fs::fcntl_setfl(&fd, rustix::fs::OFlags::NONBLOCK)?;
    Ok(fd)
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
