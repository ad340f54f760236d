//! Starting a program the way glibc's `posix_spawn` does, with the steps `posix_spawn` has no
//! attribute for ([`launch`]), and waiting for it ([`Child`]: reaped through a pidfd, killed and
//! reaped in the background when dropped first). This module holds the crate's `unsafe` code.
//!
//! Why not `fork`: it copies the page tables of the whole multi-threaded runtime, and every page
//! the runtime writes before the child has called `execve` faults and is copied. That cost about
//! a fifth of a millisecond per command here, a third of what the runtime added to a command's
//! own cost (`docs/benchmarks.md`, `runtime/exec-floor`). `clone(CLONE_VM | CLONE_VFORK)` copies
//! nothing: the child runs in the parent's memory on a stack of its own, and the calling thread
//! waits until the child has called `execve` (or exited). std takes that path (`posix_spawn`)
//! only for commands without a `pre_exec` hook, and ours need steps no `posix_spawn` attribute
//! offers: a session of their own (unstable in std), a parent-death signal, `no_new_privs` and a
//! Landlock domain.
//!
//! The child shares the parent's memory, so it does only what glibc's own `posix_spawn` child
//! does: system calls on data the parent prepared, and nothing that allocates, takes a lock,
//! panics or unwinds. `PATH` is searched by the parent ahead of time (the candidates `execvp`
//! would try, in its order, with its rules for `EACCES` and for a file without a `#!` line).
//! The one thing the child writes is the `errno` of the step that failed, which the parent reads
//! when `clone` returns. Descriptors other than the three streams are closed before `execve`.
//! Signals: the parent blocks every signal around `clone`, so no handler
//! of the runtime can run on the child's stack; the child resets every handled signal (and
//! `SIGPIPE`, which Rust ignores) to its default and then restores the caller's mask for the
//! program, as std does.

// Every block below carries its own `// SAFETY:` comment.
#![allow(unsafe_code)]

use std::cell::RefCell;
use std::ffi::{CStr, CString, OsStr, OsString, c_char, c_int, c_uint, c_ulong, c_void};
use std::io;
use std::os::fd::{AsFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;
use std::ptr;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicI32, Ordering};

use rustix::process::{Pid, Signal, WaitOptions};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// `execvp`'s search path when `PATH` is unset (glibc's `_CS_PATH`).
const DEFAULT_PATH: &[u8] = b"/bin:/usr/bin";
/// What `execvp` runs a file without a `#!` line with.
const SHELL: &CStr = c"/bin/sh";
/// The child's stack. It needs a few KiB (a handful of frames around system calls, no
/// recursion); the rest is margin, and a guard page below it stops an overflow.
const STACK_BYTES: usize = 64 << 10;
/// Linux's signals are 1 to 64.
const SIGNALS: c_int = 64;
/// The kernel's signal set is 64 bits, whatever the size of glibc's `sigset_t`.
const KERNEL_SIGSET_BYTES: libc::c_long = 8;

/// What to start, prepared by the parent.
#[derive(Debug)]
pub(crate) struct Plan {
    /// Paths tried in order: the program itself when it contains a `/`, else one per `PATH`
    /// entry.
    candidates: Vec<CString>,
    argv: Vec<CString>,
    /// The runtime's variables that the command's own do not replace.
    inherited: Vec<&'static CStr>,
    /// The command's own variables.
    env: Vec<CString>,
    cwd: CString,
    /// Become standard input, output and error.
    pub(crate) stdio: [RawFd; 3],
    /// Set `no_new_privs` before `execve`.
    pub(crate) no_new_privs: bool,
    /// Enter this Landlock ruleset before `execve`.
    pub(crate) landlock: Option<RawFd>,
}

/// Refuses what the OS cannot pass (as std does, before anything is started).
fn c_string(bytes: impl Into<Vec<u8>>) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "nul byte found in provided data",
        )
    })
}

/// The runtime's own environment, as `NAME=value` strings (with the length of the name) and its
/// `PATH`. Read once, at the first command: the runtime never changes its environment, and
/// reading it for every command would cost a hundred allocations each time.
#[derive(Debug)]
struct Inherited {
    entries: Vec<(usize, CString)>,
    path: Option<OsString>,
}

fn inherited() -> &'static Inherited {
    static INHERITED: OnceLock<Inherited> = OnceLock::new();
    INHERITED.get_or_init(|| {
        let mut path = None;
        let entries = std::env::vars_os()
            .filter_map(|(name, value)| {
                if name == "PATH" {
                    path = Some(value.clone());
                }
                // The OS hands over no NUL byte; an entry that had one could not be passed on.
                let entry = env_entry(name.as_bytes(), value.as_bytes()).ok()?;
                Some((name.len(), entry))
            })
            .collect();
        Inherited { entries, path }
    })
}

impl Plan {
    /// `argv[0]` run in `cwd` with the runtime's environment plus `env` (which replaces
    /// variables of the same name), its standard streams still to be set.
    pub(crate) fn new(argv: &[String], cwd: &Path, env: &[(String, String)]) -> io::Result<Self> {
        let program = argv
            .first()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no command given"))?;
        let runtime = inherited();
        let replaced = |(name_len, entry): &(usize, CString)| {
            let name = entry.as_bytes().get(..*name_len).unwrap_or_default();
            env.iter().any(|(k, _)| k.as_bytes() == name)
        };
        let path = env
            .iter()
            .find(|(name, _)| name == "PATH")
            .map(|(_, value)| OsStr::new(value))
            .or(runtime.path.as_deref());
        Ok(Self {
            candidates: candidates(program, path)?,
            argv: argv
                .iter()
                .map(|arg| c_string(arg.as_bytes()))
                .collect::<io::Result<_>>()?,
            inherited: runtime
                .entries
                .iter()
                .filter(|entry| !replaced(entry))
                .map(|(_, entry)| entry.as_c_str())
                .collect(),
            env: env
                .iter()
                .map(|(name, value)| env_entry(name.as_bytes(), value.as_bytes()))
                .collect::<io::Result<_>>()?,
            cwd: c_string(cwd.as_os_str().as_bytes())?,
            stdio: [-1; 3],
            no_new_privs: false,
            landlock: None,
        })
    }
}

fn env_entry(name: &[u8], value: &[u8]) -> io::Result<CString> {
    let mut entry = Vec::with_capacity(name.len() + value.len() + 1);
    entry.extend_from_slice(name);
    entry.push(b'=');
    entry.extend_from_slice(value);
    c_string(entry)
}

/// The paths `execvp` tries for `program` with search path `path`: the program itself when it
/// names a path, else `dir/program` for every entry (an empty entry is the working directory).
fn candidates(program: &str, path: Option<&OsStr>) -> io::Result<Vec<CString>> {
    if program.is_empty() {
        return Err(io::Error::from_raw_os_error(libc::ENOENT));
    }
    if program.contains('/') {
        return Ok(vec![c_string(program.as_bytes())?]);
    }
    let path = path.map_or(DEFAULT_PATH, OsStrExt::as_bytes);
    path.split(|b| *b == b':')
        .map(|dir| {
            let mut candidate = Vec::with_capacity(dir.len() + program.len() + 1);
            candidate.extend_from_slice(dir);
            if !dir.is_empty() {
                candidate.push(b'/');
            }
            candidate.extend_from_slice(program.as_bytes());
            c_string(candidate)
        })
        .collect()
}

/// A started child: its pid and a pidfd to wait on (and to signal, without pid reuse races).
#[derive(Debug)]
pub(crate) struct Launched {
    pub(crate) pid: Pid,
    pub(crate) pidfd: OwnedFd,
}

/// The leader of a started command, waited on through its pidfd. Dropped before it was reaped,
/// it kills the leader (the group guard kills the rest) and reaps it in the background.
#[derive(Debug)]
pub(crate) struct Child {
    pid: Pid,
    /// `None` once reaped.
    pidfd: Option<AsyncFd<OwnedFd>>,
}

impl Child {
    /// Registers the pidfd with the current tokio runtime (an error outside one); on failure the
    /// child is killed and reaped.
    pub(crate) fn new(launched: Launched) -> io::Result<Self> {
        let Launched { pid, pidfd } = launched;
        let registered = match tokio::runtime::Handle::try_current() {
            // SAFETY: `pidfd` is an open descriptor that the `AsyncFd` owns from here on, and
            // `OwnedFd::as_raw_fd` always returns that same descriptor.
            Ok(_) => unsafe { AsyncFd::register_with_interest(pidfd, Interest::READABLE) }
                .map_err(io::Error::from),
            Err(error) => Err(io::Error::other(error)),
        };
        match registered {
            Ok(pidfd) => Ok(Self {
                pid,
                pidfd: Some(pidfd),
            }),
            Err(error) => {
                let _ = rustix::process::kill_process(pid, Signal::KILL);
                let _ = rustix::process::waitpid(Some(pid), WaitOptions::empty());
                Err(error)
            }
        }
    }

    /// Waits for the leader to exit and reaps it. Cancel-safe: dropping the future loses
    /// nothing.
    pub(crate) async fn wait(&mut self) -> io::Result<ExitStatus> {
        let Some(pidfd) = &self.pidfd else {
            return Err(io::Error::other("the command was already reaped"));
        };
        let status = reap(self.pid, pidfd).await?;
        self.pidfd = None;
        Ok(status)
    }
}

/// Waits until `pid` has exited and reaps it.
async fn reap(pid: Pid, pidfd: &AsyncFd<OwnedFd>) -> io::Result<ExitStatus> {
    loop {
        let mut ready = pidfd.readable().await?;
        // The pidfd is readable once the process has exited; until then this finds nothing.
        if let Some((_, status)) = rustix::process::waitpid(Some(pid), WaitOptions::NOHANG)? {
            return Ok(ExitStatus::from_raw(status.as_raw()));
        }
        ready.clear_ready();
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let Some(pidfd) = self.pidfd.take() else {
            return;
        };
        // Through the pidfd: the pid cannot have been reused, the process is not reaped yet.
        let _ = rustix::process::pidfd_send_signal(pidfd.get_ref().as_fd(), Signal::KILL);
        let pid = self.pid;
        match tokio::runtime::Handle::try_current() {
            // A task dropped at shutdown leaves a zombie until the runtime exits.
            Ok(runtime) => {
                runtime.spawn(async move {
                    let _ = reap(pid, &pidfd).await;
                });
            }
            // Outside a runtime: the SIGKILLed leader ends at once; wait for it here.
            Err(_) => {
                let _ = rustix::process::waitpid(Some(pid), WaitOptions::empty());
            }
        }
    }
}

/// What the child reads: raw pointers into the parent's [`Plan`] and buffers.
struct Shared {
    candidates: *const *const c_char,
    argv: *const *const c_char,
    /// `/bin/sh`, a slot for the candidate, `argv[1..]`: for a file without a `#!` line.
    shell_argv: *mut *const c_char,
    envp: *const *const c_char,
    cwd: *const c_char,
    stdio: [c_int; 3],
    parent: libc::pid_t,
    no_new_privs: bool,
    landlock: c_int,
    /// The caller's signal mask, restored for the program.
    mask: libc::sigset_t,
    /// 0 until the child fails; then the `errno` of the failed step.
    error: AtomicI32,
}

fn pointers(strings: &[CString]) -> Vec<*const c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(ptr::null()))
        .collect()
}

/// Starts `plan`. Errors are `clone`'s, or the `errno` of the child's step that failed (the
/// child is then reaped).
pub(crate) fn launch(plan: &Plan) -> io::Result<Launched> {
    let candidates = pointers(&plan.candidates);
    let argv = pointers(&plan.argv);
    let envp: Vec<*const c_char> = plan
        .inherited
        .iter()
        .copied()
        .chain(plan.env.iter().map(CString::as_c_str))
        .map(CStr::as_ptr)
        .chain(std::iter::once(ptr::null()))
        .collect();
    let mut shell_argv: Vec<*const c_char> = [SHELL.as_ptr(), ptr::null()]
        .into_iter()
        .chain(argv.iter().skip(1).copied())
        .collect();
    let mut shared = Shared {
        candidates: candidates.as_ptr(),
        argv: argv.as_ptr(),
        shell_argv: shell_argv.as_mut_ptr(),
        envp: envp.as_ptr(),
        cwd: plan.cwd.as_ptr(),
        stdio: plan.stdio,
        parent: rustix::process::getpid().as_raw_nonzero().get(),
        no_new_privs: plan.no_new_privs,
        landlock: plan.landlock.unwrap_or(-1),
        // SAFETY: `sigset_t` is plain data; an all-zero set is valid (and overwritten below).
        mask: unsafe { std::mem::zeroed() },
        error: AtomicI32::new(0),
    };
    // SAFETY: as above; every bit set blocks every signal.
    let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: writes `size_of::<sigset_t>()` bytes into `all`, which has exactly that size.
    unsafe {
        ptr::write_bytes(
            ptr::from_mut(&mut all).cast::<u8>(),
            0xff,
            std::mem::size_of::<libc::sigset_t>(),
        );
    }
    // SAFETY: rt_sigprocmask reads the 8-byte kernel set from `all` and writes the old one into
    // `shared.mask`; both live until the call returns. The raw system call, unlike glibc's
    // `pthread_sigmask`, also blocks glibc's internal signals.
    let blocked = unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            ptr::from_ref(&all),
            ptr::from_mut(&mut shared.mask),
            KERNEL_SIGSET_BYTES,
        )
    };
    if blocked != 0 {
        return Err(io::Error::last_os_error());
    }
    let cloned = with_stack(|top| {
        // SAFETY: the child runs `child` on the stack ending at `top` (mapped, writable, used by
        // nobody else: this thread's, and this thread waits) with a pointer to `shared`.
        // CLONE_VFORK suspends this thread until the child has called `execve` or exited, so
        // `shared` and the buffers it points into (`candidates`, `argv`, `shell_argv`, `envp`,
        // `plan`) outlive every use the child makes of them, and this thread touches none of
        // them meanwhile. The child only makes system calls on that data (see `child`); the
        // other threads of the runtime never see it.
        let pid = unsafe {
            libc::clone(
                child,
                top,
                libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
                ptr::from_mut(&mut shared).cast::<c_void>(),
            )
        };
        (pid, io::Error::last_os_error())
    });
    // SAFETY: restores the mask saved above; `shared.mask` is ours again (the child is gone
    // from this memory).
    unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            ptr::from_ref(&shared.mask),
            ptr::null_mut::<libc::sigset_t>(),
            KERNEL_SIGSET_BYTES,
        );
    }
    let (pid, clone_error) = cloned?;
    let Some(pid) = rustix::process::Pid::from_raw(pid) else {
        return Err(clone_error);
    };
    let failed = shared.error.load(Ordering::Acquire);
    if failed != 0 {
        // The child has exited (CLONE_VFORK returned without an execve): reap it.
        let _ = rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty());
        return Err(io::Error::from_raw_os_error(failed));
    }
    match rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::NONBLOCK) {
        Ok(pidfd) => Ok(Launched { pid, pidfd }),
        Err(error) => {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            let _ = rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty());
            Err(io::Error::other(format!(
                "pidfd_open failed (Linux 5.3 or newer is needed): {error}"
            )))
        }
    }
}

/// The child's stack: an anonymous mapping with a guard page at its low end.
struct Stack {
    base: *mut c_void,
    len: usize,
}

thread_local! {
    /// The stack of the children this thread starts, kept: mapping one per command would cost
    /// an mmap, an mprotect and an munmap, whose TLB shootdown interrupts every core the runtime
    /// runs on. One per thread is enough: the thread waits while its child uses it.
    static STACK: RefCell<Option<Stack>> = const { RefCell::new(None) };
}

/// Runs `clone_on` with the top of this thread's child stack (made on first use); `Err` if no
/// stack could be mapped.
fn with_stack<R>(clone_on: impl FnOnce(*mut c_void) -> R) -> io::Result<R> {
    let kept = STACK.try_with(|slot| -> Option<*mut c_void> {
        let mut slot = slot.try_borrow_mut().ok()?;
        if slot.is_none() {
            *slot = Stack::new().ok();
        }
        slot.as_ref().map(Stack::top)
    });
    match kept {
        Ok(Some(top)) => Ok(clone_on(top)),
        // The thread is exiting (or the stack could not be mapped): a stack for this call.
        _ => {
            let stack = Stack::new()?;
            Ok(clone_on(stack.top()))
        }
    }
}

impl Stack {
    fn new() -> io::Result<Self> {
        // SAFETY: sysconf reads a constant of the system.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let len = STACK_BYTES + page;
        // SAFETY: a fresh anonymous private mapping; no existing memory is affected.
        let base = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let stack = Self { base, len };
        // SAFETY: the lowest page of the mapping just made; the stack grows down towards it.
        if unsafe { libc::mprotect(base, page, libc::PROT_NONE) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(stack)
    }

    /// The initial stack pointer: the high end, 16-byte aligned (the mapping is page-aligned).
    fn top(&self) -> *mut c_void {
        self.base
            .cast::<u8>()
            .wrapping_add(self.len)
            .cast::<c_void>()
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `new` made; nothing uses it any more (the child
        // has left it when `clone` returned).
        unsafe {
            libc::munmap(self.base, self.len);
        }
    }
}

fn errno() -> c_int {
    // Reads errno; builds no allocation (an OS error is stored inline).
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EINVAL)
}

/// The child, in the parent's memory on its own stack: set up, then `execve`. Only returns by
/// `_exit`, after recording why.
extern "C" fn child(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the `Shared` the parent passed to `clone`, alive until the child has
    // called `execve` or exited (CLONE_VFORK).
    let shared = unsafe { &*arg.cast::<Shared>() };
    // SAFETY: `shared` points at valid, NUL-terminated strings and NULL-terminated arrays.
    let failed = unsafe { set_up_and_exec(shared) };
    shared.error.store(
        if failed == 0 { libc::EINVAL } else { failed },
        Ordering::Release,
    );
    // SAFETY: ends the child at once, running nothing of the parent's (no atexit handlers, no
    // stdio flushing).
    unsafe { libc::_exit(127) }
}

/// The child's steps; returns the `errno` of the step that failed (`execve` does not return
/// when it succeeds).
///
/// # Safety
/// Only in the child of [`launch`], with `shared` as prepared there.
unsafe fn set_up_and_exec(shared: &Shared) -> c_int {
    // SAFETY (the whole function): plain system calls on file descriptors and on the
    // NUL-terminated strings and NULL-terminated arrays the parent built; nothing allocates.
    unsafe {
        for (target, fd) in (0..).zip(shared.stdio) {
            // dup2 onto itself would leave close-on-exec set.
            let ok = if fd == target {
                libc::fcntl(fd, libc::F_SETFD, 0) == 0
            } else {
                libc::dup2(fd, target) == target
            };
            if !ok {
                return errno();
            }
        }
        if libc::chdir(shared.cwd) != 0 {
            return errno();
        }
        // Own session and process group, so that the whole tree can be signalled at once and
        // no controlling terminal is shared with the runtime.
        if libc::setsid() < 0 {
            return errno();
        }
        // Die with the runtime even if it is SIGKILLed.
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as c_ulong, 0, 0, 0) != 0 {
            return errno();
        }
        // The runtime may have died before the prctl: then nobody would kill us.
        if libc::getppid() != shared.parent {
            return libc::ESRCH;
        }
        if shared.no_new_privs && libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1 as c_ulong, 0, 0, 0) != 0
        {
            return errno();
        }
        if shared.landlock >= 0
            && libc::syscall(libc::SYS_landlock_restrict_self, shared.landlock, 0u32) != 0
        {
            return errno();
        }
        // Nothing but the three streams reaches the program, not even descriptors the runtime
        // inherited without close-on-exec (as Python's `close_fds`). Before Linux 5.9 this
        // fails, and close-on-exec alone applies.
        libc::syscall(libc::SYS_close_range, 3 as c_uint, c_uint::MAX, 0 as c_uint);
        reset_signals(&shared.mask);
        exec(shared)
    }
}

/// Every handled signal (and `SIGPIPE`) back to its default, then the caller's mask. glibc's
/// internal signals keep their handlers (glibc's `sigaction` refuses them); those handlers act
/// only on signals the process sent itself, and the program's `execve` resets them.
///
/// # Safety
/// Only in the child of [`launch`].
unsafe fn reset_signals(mask: &libc::sigset_t) {
    // SAFETY: `sigaction` is plain data, valid all-zero; the calls read and write only these
    // two values and the process's signal table.
    unsafe {
        let mut current: libc::sigaction = std::mem::zeroed();
        let mut default: libc::sigaction = std::mem::zeroed();
        default.sa_sigaction = libc::SIG_DFL;
        for signal in 1..=SIGNALS {
            if libc::sigaction(signal, ptr::null(), &mut current) != 0 {
                continue;
            }
            let handled =
                current.sa_sigaction != libc::SIG_DFL && current.sa_sigaction != libc::SIG_IGN;
            if handled || (signal == libc::SIGPIPE && current.sa_sigaction == libc::SIG_IGN) {
                libc::sigaction(signal, &default, ptr::null_mut());
            }
        }
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            ptr::from_ref(mask),
            ptr::null_mut::<libc::sigset_t>(),
            KERNEL_SIGSET_BYTES,
        );
    }
}

/// `execvp`'s loop over the prepared candidates: a file without a `#!` line runs with
/// `/bin/sh`; `EACCES` is remembered and the search goes on; a missing file or directory goes
/// on; any other error ends the search.
///
/// # Safety
/// Only in the child of [`launch`].
unsafe fn exec(shared: &Shared) -> c_int {
    // SAFETY: the arrays are NULL-terminated, their strings NUL-terminated; `shell_argv` has
    // room for slot 1 and nobody else reads it meanwhile.
    unsafe {
        let mut denied = false;
        let mut last = libc::ENOENT;
        let mut next = shared.candidates;
        while !(*next).is_null() {
            let path = *next;
            libc::execve(path, shared.argv, shared.envp);
            let mut error = errno();
            if error == libc::ENOEXEC {
                *shared.shell_argv.add(1) = path;
                libc::execve(SHELL.as_ptr(), shared.shell_argv.cast_const(), shared.envp);
                error = errno();
            }
            match error {
                libc::EACCES => denied = true,
                libc::ENOENT | libc::ESTALE | libc::ENOTDIR | libc::ENODEV | libc::ETIMEDOUT => {}
                other => return other,
            }
            last = error;
            next = next.add(1);
        }
        if denied { libc::EACCES } else { last }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::PermissionsExt;
    use std::time::{Duration, Instant};

    use rustix::process::{Pid, WaitOptions, waitpid};

    /// Starts `argv` with its standard streams on /dev/null.
    fn start(argv: &[&str], cwd: &Path, env: &[(&str, &str)]) -> io::Result<Launched> {
        let argv: Vec<String> = argv.iter().map(|s| (*s).to_owned()).collect();
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let null = std::fs::File::open("/dev/null")?;
        let mut plan = Plan::new(&argv, cwd, &env)?;
        plan.stdio = [null.as_raw_fd(); 3];
        launch(&plan)
    }

    /// Waits for `pid` (a child of this test) to end, within a hang guard.
    fn wait(pid: Pid) -> rustix::process::WaitStatus {
        let guard = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some((_, status)) = waitpid(Some(pid), WaitOptions::NOHANG).unwrap() {
                return status;
            }
            assert!(Instant::now() < guard, "process {pid:?} did not end");
            std::thread::yield_now();
        }
    }

    /// `/proc/<pid>/stat` fields after the command name: state, ppid, pgrp, session, ...
    fn stat(pid: Pid) -> Vec<String> {
        let text = std::fs::read_to_string(format!("/proc/{}/stat", pid.as_raw_nonzero())).unwrap();
        let (_, rest) = text.rsplit_once(") ").unwrap();
        rest.split_whitespace().map(str::to_owned).collect()
    }

    fn status_field(pid: Pid, field: &str) -> u64 {
        let text =
            std::fs::read_to_string(format!("/proc/{}/status", pid.as_raw_nonzero())).unwrap();
        let value = text
            .lines()
            .find_map(|line| line.strip_prefix(field))
            .unwrap()
            .trim();
        u64::from_str_radix(value, 16).unwrap()
    }

    #[test]
    fn the_child_leads_its_own_session_with_clean_signals_and_only_its_stdio() {
        let tmp = std::env::temp_dir();
        let child = start(&["sleep", "30"], &tmp, &[]).unwrap();
        let pid = child.pid;
        let raw = pid.as_raw_nonzero().get().to_string();
        // Wait for `sleep` itself (the comm changes at execve).
        let guard = Instant::now() + Duration::from_secs(10);
        while std::fs::read_to_string(format!("/proc/{raw}/comm")).unwrap() != "sleep\n" {
            assert!(Instant::now() < guard, "sleep did not start");
            std::thread::yield_now();
        }
        let fields = stat(pid);
        assert_eq!((&fields[2], &fields[3]), (&raw, &raw), "pgrp and session");
        // This test process ignores SIGPIPE (Rust does); the program does not, and blocks
        // nothing.
        assert_eq!(status_field(pid, "SigIgn:") & (1 << (libc::SIGPIPE - 1)), 0);
        assert_eq!(status_field(pid, "SigBlk:"), 0);
        let mut fds: Vec<String> = std::fs::read_dir(format!("/proc/{raw}/fd"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        fds.sort();
        assert_eq!(fds, ["0", "1", "2"]);
        rustix::process::pidfd_send_signal(&child.pidfd, rustix::process::Signal::KILL).unwrap();
        assert_eq!(wait(pid).terminating_signal(), Some(libc::SIGKILL));
    }

    #[test]
    fn errors_are_execvps() {
        let dir = tempfile::tempdir().unwrap();
        let not_found = start(&["no-such-program-xyz"], dir.path(), &[]).unwrap_err();
        assert_eq!(not_found.raw_os_error(), Some(libc::ENOENT));
        assert_eq!(
            start(&[""], dir.path(), &[]).unwrap_err().raw_os_error(),
            Some(libc::ENOENT)
        );
        let script = dir.path().join("script");
        std::fs::write(&script, "exit 7\n").unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
        let denied = start(&["./script"], dir.path(), &[]).unwrap_err();
        assert_eq!(denied.raw_os_error(), Some(libc::EACCES));
        let missing_cwd = start(&["true"], &dir.path().join("gone"), &[]).unwrap_err();
        assert_eq!(missing_cwd.raw_os_error(), Some(libc::ENOENT));
        // Without a `#!` line the shell runs it, as execvp does; found through the PATH given.
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = dir.path().to_str().unwrap();
        let child = start(&["script"], Path::new("/"), &[("PATH", path)]).unwrap();
        assert_eq!(wait(child.pid).exit_status(), Some(7));
        let nul = Plan::new(&["a\0b".to_owned()], dir.path(), &[]).unwrap_err();
        assert_eq!(nul.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn search_candidates_follow_execvp() {
        let names = |program, path: Option<&str>| -> Vec<String> {
            candidates(program, path.map(OsStr::new))
                .unwrap()
                .into_iter()
                .map(|c| c.into_string().unwrap())
                .collect()
        };
        assert_eq!(names("ls", Some("/a:/b")), ["/a/ls", "/b/ls"]);
        assert_eq!(names("ls", Some("/a::")), ["/a/ls", "ls", "ls"]);
        assert_eq!(names("ls", None), ["/bin/ls", "/usr/bin/ls"]);
        assert_eq!(names("./x", Some("/a")), ["./x"]);
    }

    /// The parent-death signal is tied to the thread that started the child: when it ends, the
    /// child is killed.
    #[test]
    fn the_child_dies_with_the_thread_that_started_it() {
        let tmp = std::env::temp_dir();
        let launched = std::thread::spawn(move || start(&["sleep", "30"], &tmp, &[]).unwrap())
            .join()
            .unwrap();
        assert_eq!(wait(launched.pid).terminating_signal(), Some(libc::SIGKILL));
    }

    #[test]
    fn the_plan_sets_the_standard_streams() {
        let (read, write) = std::io::pipe().unwrap();
        let null = std::fs::File::open("/dev/null").unwrap();
        let argv = ["sh".to_owned(), "-c".to_owned(), "echo $A; pwd".to_owned()];
        let mut plan =
            Plan::new(&argv, Path::new("/"), &[("A".to_owned(), "1".to_owned())]).unwrap();
        plan.stdio = [null.as_raw_fd(), write.as_raw_fd(), null.as_raw_fd()];
        let child = launch(&plan).unwrap();
        drop(write);
        let mut out = String::new();
        std::io::Read::read_to_string(&mut std::fs::File::from(OwnedFd::from(read)), &mut out)
            .unwrap();
        assert_eq!(out, "1\n/\n");
        assert_eq!(wait(child.pid).exit_status(), Some(0));
    }
}
