//! Starting a program the way glibc's `posix_spawn` does, with the steps `posix_spawn` has no
//! attribute for ([`launch`]), and waiting for it ([`Child`]: reaped through a pidfd, killed and
//! reaped in the background when dropped first). This module holds the crate's `unsafe` code.
//!
//! Why not `fork`: it copies the page tables of the whole multi-threaded runtime, and every page
//! the runtime writes before the child has called `execve` faults and is copied. With `fork`
//! (std's `Command` with a `pre_exec` hook) the runtime added about 0.32 ms to a command's own
//! cost and reached a third of the floor's throughput at 16 concurrent commands; with this
//! module about 0.08 ms and nine tenths (`docs/benchmarks.md`, `runtime/exec-floor`).
//! `clone(CLONE_VM | CLONE_VFORK)` copies nothing: the child runs in the parent's memory on a
//! stack of its own, and the calling thread waits until the child has called `execve` (or
//! exited). std takes that path (`posix_spawn`) only for commands without a `pre_exec` hook, and
//! ours need steps no `posix_spawn` attribute offers: a parent-death signal, `no_new_privs` and a
//! Landlock domain (and a session of their own, unstable in std). On x86_64 the child is made
//! with `clone3` and `CLONE_CLEAR_SIGHAND`, so the kernel resets the signal handlers instead of
//! sixty `sigaction` calls in the child (about 0.015 ms a command); where the kernel or a
//! seccomp filter refuses `clone3`, glibc's `clone` is used from then on.
//!
//! The child shares the parent's memory, so it does only what glibc's own `posix_spawn` child
//! does: system calls on data the parent prepared, and nothing that allocates, takes a lock,
//! panics or unwinds. The parent lists the paths `execvp` would try (`PATH` split, in its
//! order); the child tries them with `execvp`'s rules for `EACCES` and for a file without a
//! `#!` line. The child writes to the parent's memory only its own stack, the `errno` of the
//! step that failed (read by the parent when `clone` returns; `errno` itself is the suspended
//! parent thread's) and the script slot of the `/bin/sh` argument list. Descriptors other than
//! the three streams are closed before `execve`, as with Python's `close_fds`. Signals: the
//! parent blocks every signal around `clone`, so no handler of the runtime can run in the
//! child; the child resets every handled signal (and `SIGPIPE`, which Rust ignores) to its
//! default and then restores the caller's mask for the program, as std does.
//!
//! Needs Linux 5.2 (`CLONE_PIDFD`); `close_range` (5.9) is used where the kernel has it.

// Every block below carries its own `// SAFETY:` comment.
#![allow(unsafe_code)]

use std::cell::RefCell;
use std::ffi::{CStr, CString, OsStr, OsString, c_char, c_int, c_uint, c_ulong, c_void};
use std::io;
use std::os::fd::{AsFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;
use std::ptr;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

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
/// `prctl`'s arguments, as the `unsigned long`s it reads them as: a variadic call passes an
/// `int` literal with undefined upper bits, and `PR_SET_NO_NEW_PRIVS` refuses non-zero ones.
const SIGKILL: c_ulong = libc::SIGKILL as c_ulong;
const ON: c_ulong = 1;
const UNUSED: c_ulong = 0;
/// The lowest descriptor above the three standard streams.
const FIRST_STDIO_FREE: c_int = 3;
/// `close_range`'s arguments: every descriptor above the three standard ones, no flags.
const FIRST_OTHER_FD: c_uint = 3;
const NO_FLAGS: c_uint = 0;

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
/// Not reaped by itself: hand it to [`Child::new`] (or, in tests, wait for `pid`).
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
    /// The kernel has reset the handlers already (CLONE_CLEAR_SIGHAND).
    handlers_cleared: bool,
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

/// How the child is created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    /// `clone3` with CLONE_CLEAR_SIGHAND: the kernel resets the handlers, in one step with the
    /// creation (x86_64, Linux 5.5). Saves the child some sixty `sigaction` calls.
    Clone3,
    /// glibc's `clone`: the child resets the handlers itself, one `sigaction` per signal.
    Clone,
}

/// Whether `clone3` is worth trying: until the kernel (or a seccomp filter, as container
/// runtimes' older default profiles have) refuses it once.
static CLONE3_WORKS: AtomicBool = AtomicBool::new(cfg!(target_arch = "x86_64"));

/// Why [`launch_via`] failed.
#[derive(Debug)]
enum Failed {
    /// Creating the child failed.
    Clone(io::Error),
    /// A step of the child failed (it is reaped).
    Child(io::Error),
}

/// Starts `plan`. Errors are `clone`'s, or the `errno` of the child's step that failed (the
/// child is then reaped).
pub(crate) fn launch(plan: &Plan) -> io::Result<Launched> {
    if CLONE3_WORKS.load(Ordering::Relaxed) {
        match launch_via(plan, Via::Clone3) {
            Ok(launched) => return Ok(launched),
            Err(Failed::Child(error)) => return Err(error),
            Err(Failed::Clone(error))
                if matches!(
                    error.raw_os_error(),
                    Some(libc::ENOSYS | libc::EINVAL | libc::EPERM)
                ) =>
            {
                CLONE3_WORKS.store(false, Ordering::Relaxed);
            }
            Err(Failed::Clone(error)) => return Err(error),
        }
    }
    launch_via(plan, Via::Clone).map_err(|(Failed::Clone(error) | Failed::Child(error))| error)
}

fn launch_via(plan: &Plan, via: Via) -> Result<Launched, Failed> {
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
        handlers_cleared: via == Via::Clone3,
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
        return Err(Failed::Clone(io::Error::last_os_error()));
    }
    // CLONE_PIDFD: the kernel stores a pidfd (close-on-exec) for the child here, so there is
    // no window in which the child exists without one.
    let mut pidfd: c_int = -1;
    let cloned = with_stack(|top| {
        // SAFETY: the child runs `child` on the stack ending at `top` (mapped, writable, used by
        // nobody else: this thread's, and this thread waits) with a pointer to `shared`.
        // CLONE_VFORK suspends this thread until the child has called `execve` or exited, so
        // `shared` and the buffers it points into (`candidates`, `argv`, `shell_argv`, `envp`,
        // `plan`) outlive every use the child makes of them, and this thread touches none of
        // them meanwhile. The child only makes system calls on that data (see `child`); the
        // other threads of the runtime never see it. Without CLONE_FILES, CLONE_FS and
        // CLONE_SIGHAND the child's descriptors, working directory and signal handlers are
        // copies, so its changes to them stay its own. The kernel writes the pidfd into
        // `pidfd` before the call returns.
        let arg = ptr::from_mut(&mut shared).cast::<c_void>();
        let flags = libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD;
        match via {
            Via::Clone3 => {
                let mut args = CloneArgs {
                    #[allow(clippy::cast_sign_loss)]
                    flags: flags as u64 | CLONE_CLEAR_SIGHAND,
                    pidfd: ptr::from_mut(&mut pidfd).addr() as u64,
                    exit_signal: libc::SIGCHLD as u64,
                    stack: top.cast::<u8>().wrapping_sub(STACK_BYTES).addr() as u64,
                    stack_size: STACK_BYTES as u64,
                    ..CloneArgs::default()
                };
                // SAFETY: as above; `args` describes that same stack (its usable part, below
                // `top`) and lives until the call returns.
                let result = unsafe { clone3(&mut args, child, arg) };
                if result < 0 {
                    let errno = i32::try_from(-result).unwrap_or(libc::EINVAL);
                    (-1, io::Error::from_raw_os_error(errno))
                } else {
                    (
                        i32::try_from(result).unwrap_or(-1),
                        io::Error::from_raw_os_error(0),
                    )
                }
            }
            Via::Clone => {
                // SAFETY: as above. CLONE_PIDFD makes glibc's `clone` take the `parent_tid`
                // argument as where to store the pidfd.
                let pid = unsafe {
                    libc::clone(
                        child,
                        top,
                        flags | libc::SIGCHLD,
                        arg,
                        ptr::from_mut(&mut pidfd),
                    )
                };
                (pid, io::Error::last_os_error())
            }
        }
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
    let (pid, clone_error) = cloned.map_err(Failed::Clone)?;
    // `clone` failed (then no pidfd was made): before Linux 5.2 CLONE_PIDFD is EINVAL; a
    // seccomp filter answers `clone3` with ENOSYS. (rustix asserts that a raw pid is not
    // negative, hence the test first.)
    let Some(pid) = Some(pid).filter(|pid| *pid > 0).and_then(Pid::from_raw) else {
        return Err(Failed::Clone(clone_error));
    };
    // SAFETY: with the child created, the kernel has stored a new descriptor, owned by nobody
    // else, in `pidfd`.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    let failed = shared.error.load(Ordering::Acquire);
    if failed != 0 {
        // The child has exited (CLONE_VFORK returned without an execve): reap it. Exited, not
        // merely exiting: waiting takes a moment at most.
        let _ = rustix::process::waitpid(Some(pid), WaitOptions::empty());
        return Err(Failed::Child(io::Error::from_raw_os_error(failed)));
    }
    Ok(Launched { pid, pidfd })
}

/// `clone3`'s arguments (`struct clone_args` up to `tls`: the kernel takes any size from this
/// first version on).
#[repr(C)]
#[derive(Debug, Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
}

/// The child starts with every handled signal at its default; ignored ones stay ignored.
const CLONE_CLEAR_SIGHAND: u64 = 0x1_0000_0000;

/// The `clone3` system call, running `child(arg)` in the child on the stack `args` names and
/// exiting with what it returns (ours never returns). In the parent: the child's pid, or minus
/// the `errno`. glibc has no wrapper that runs a function, hence the assembly.
///
/// # Safety
/// `args` must describe a writable stack, 16-byte aligned at its top, that nothing else uses
/// until the child has called `execve` or exited, and flags for which `child(arg)` is sound
/// (here: [`launch_via`]'s).
#[cfg(target_arch = "x86_64")]
unsafe fn clone3(
    args: &mut CloneArgs,
    child: extern "C" fn(*mut c_void) -> c_int,
    arg: *mut c_void,
) -> libc::c_long {
    let result: libc::c_long;
    // SAFETY: the system call preserves every register but rax, rcx and r11. The parent goes
    // on after the block (rax: pid or -errno). The child, with rsp at the top of its stack,
    // never comes back into this function: it starts a fresh frame chain (rbp 0), calls
    // `child(arg)` with the stack 16-byte aligned as the ABI wants, and exits with its result.
    // Nothing is pushed on the parent's stack (`nostack`); the kernel writes the pidfd and the
    // child writes `shared`, so memory is not declared untouched.
    unsafe {
        std::arch::asm!(
            "syscall",
            "test rax, rax",
            "jnz 2f",
            "xor ebp, ebp",
            "mov rdi, r12",
            "call r13",
            "mov edi, eax",
            "mov eax, {exit}",
            "syscall",
            "ud2",
            "2:",
            exit = const libc::SYS_exit,
            inlateout("rax") libc::SYS_clone3 => result,
            in("rdi") ptr::from_mut(args),
            in("rsi") std::mem::size_of::<CloneArgs>(),
            in("r12") arg,
            in("r13") child,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    result
}

/// Elsewhere `clone3` is not tried ([`CLONE3_WORKS`] starts false).
#[cfg(not(target_arch = "x86_64"))]
unsafe fn clone3(
    _: &mut CloneArgs,
    _: extern "C" fn(*mut c_void) -> c_int,
    _: *mut c_void,
) -> libc::c_long {
    -libc::c_long::from(libc::ENOSYS)
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

/// The calling thread's `errno`. In the child that is the parent thread's (the child runs on its
/// thread-local storage), which is suspended until the child has called `execve` or exited.
fn errno() -> c_int {
    // SAFETY: glibc's `__errno_location` returns the address of the calling thread's `errno`,
    // valid for reading for as long as the thread lives.
    unsafe { *libc::__errno_location() }
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
        // A descriptor below 3 that is not in its place yet would be overwritten by an earlier
        // dup2 (possible only if the runtime ran with a standard stream closed): move it up
        // first. The copy is close-on-exec, and closed below anyway.
        let mut stdio = shared.stdio;
        for (target, fd) in (0..).zip(stdio.iter_mut()) {
            if (0..FIRST_STDIO_FREE).contains(fd) && *fd != target {
                *fd = libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, FIRST_STDIO_FREE);
                if *fd < 0 {
                    return errno();
                }
            }
        }
        for (target, fd) in (0..).zip(stdio) {
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
        if libc::prctl(libc::PR_SET_PDEATHSIG, SIGKILL, UNUSED, UNUSED, UNUSED) != 0 {
            return errno();
        }
        // The runtime may have died before the prctl: then nobody would kill us.
        if libc::getppid() != shared.parent {
            return libc::ESRCH;
        }
        if shared.no_new_privs
            && libc::prctl(libc::PR_SET_NO_NEW_PRIVS, ON, UNUSED, UNUSED, UNUSED) != 0
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
        libc::syscall(libc::SYS_close_range, FIRST_OTHER_FD, c_uint::MAX, NO_FLAGS);
        reset_signals(&shared.mask, shared.handlers_cleared);
        exec(shared)
    }
}

/// Every handled signal (and `SIGPIPE`) back to its default, then the caller's mask; other
/// ignored signals stay ignored, as with std's `Command`. The child's table of handlers is its
/// own (no `CLONE_SIGHAND`), so this does not touch the runtime's. glibc's internal signals
/// keep their handlers (glibc's `sigaction` refuses them); glibc sends them only to threads of
/// the runtime, never to this child, and the program's `execve` resets them.
///
/// # Safety
/// Only in the child of [`launch`].
unsafe fn reset_signals(mask: &libc::sigset_t, handlers_cleared: bool) {
    // SAFETY: `sigaction` is plain data, valid all-zero; the calls read and write only these
    // three values and the process's signal table.
    unsafe {
        let mut previous: libc::sigaction = std::mem::zeroed();
        let mut default: libc::sigaction = std::mem::zeroed();
        default.sa_sigaction = libc::SIG_DFL;
        let mut ignore: libc::sigaction = std::mem::zeroed();
        ignore.sa_sigaction = libc::SIG_IGN;
        // CLONE_CLEAR_SIGHAND has reset the handlers; only SIGPIPE is left to do.
        let signals = if handlers_cleared {
            libc::SIGPIPE..=libc::SIGPIPE
        } else {
            1..=SIGNALS
        };
        for signal in signals {
            // Neither can have a handler (nor be set).
            if signal == libc::SIGKILL || signal == libc::SIGSTOP {
                continue;
            }
            // One call per signal: set the default and learn what was there. Every signal is
            // blocked, so none is delivered in between.
            if libc::sigaction(signal, &default, &mut previous) != 0 {
                continue;
            }
            if previous.sa_sigaction == libc::SIG_IGN && signal != libc::SIGPIPE {
                libc::sigaction(signal, &ignore, ptr::null_mut());
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

    /// The plan for `argv` with its standard streams on /dev/null (open while the file lives).
    fn plan(argv: &[&str], cwd: &Path, env: &[(&str, &str)]) -> io::Result<(Plan, std::fs::File)> {
        let argv: Vec<String> = argv.iter().map(|s| (*s).to_owned()).collect();
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let null = std::fs::File::open("/dev/null")?;
        let mut plan = Plan::new(&argv, cwd, &env)?;
        plan.stdio = [null.as_raw_fd(); 3];
        Ok((plan, null))
    }

    /// Starts `argv` with its standard streams on /dev/null.
    fn start(argv: &[&str], cwd: &Path, env: &[(&str, &str)]) -> io::Result<Launched> {
        let (plan, _null) = plan(argv, cwd, env)?;
        launch(&plan)
    }

    /// Starts `argv` (standard streams on /dev/null) created the way `via` says.
    fn start_via(via: Via, argv: &[&str]) -> Launched {
        let (plan, _null) = plan(argv, &std::env::temp_dir(), &[]).unwrap();
        launch_via(&plan, via).unwrap()
    }

    /// Waits until `pid` runs `comm` (it changes at `execve`), within a hang guard.
    fn wait_for_exec(pid: Pid, comm: &str) {
        let path = format!("/proc/{}/comm", pid.as_raw_nonzero());
        let guard = Instant::now() + Duration::from_secs(10);
        while std::fs::read_to_string(&path).unwrap().trim_end() != comm {
            assert!(Instant::now() < guard, "{comm} did not start");
            std::thread::yield_now();
        }
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

    /// Through `launch`: with clone3 where the kernel allows it, else with the fallback.
    #[test]
    fn the_child_leads_its_own_session_with_clean_signals_and_only_its_stdio() {
        a_clean_child(|| start(&["sleep", "30"], &std::env::temp_dir(), &[]).unwrap());
    }

    /// The fallback, which resets the handlers itself.
    #[test]
    fn so_does_a_child_created_with_clone() {
        a_clean_child(|| start_via(Via::Clone, &["sleep", "30"]));
    }

    fn a_clean_child(start: impl FnOnce() -> Launched) {
        // SAFETY: SIGWINCH's default is to be ignored: ignoring it changes nothing for the other
        // tests of this process.
        unsafe { libc::signal(libc::SIGWINCH, libc::SIG_IGN) };
        let child = start();
        let pid = child.pid;
        let raw = pid.as_raw_nonzero().get().to_string();
        wait_for_exec(pid, "sleep");
        let fields = stat(pid);
        assert_eq!((&fields[2], &fields[3]), (&raw, &raw), "pgrp and session");
        // This test process ignores SIGPIPE (Rust does); the program does not, keeps the other
        // ignored signal ignored (as std's Command does), and blocks nothing.
        let ignored = status_field(pid, "SigIgn:");
        assert_eq!(ignored & (1 << (libc::SIGPIPE - 1)), 0);
        assert_ne!(ignored & (1 << (libc::SIGWINCH - 1)), 0);
        assert_eq!(status_field(pid, "SigBlk:"), 0);
        assert_eq!(status_field(pid, "NoNewPrivs:"), 0);
        // Right after `execve` the program's own start-up (the dynamic loader opening its
        // libraries, locale files) may hold a descriptor for a moment; an inherited one stays.
        let fds = || {
            let mut fds: Vec<String> = std::fs::read_dir(format!("/proc/{raw}/fd"))
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            fds.sort();
            fds
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while fds() != ["0", "1", "2"] && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(fds(), ["0", "1", "2"]);
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

    /// Dropped before it was waited for, a child is killed and reaped (by a task of the
    /// runtime), leaving no zombie.
    #[tokio::test]
    async fn a_dropped_child_is_killed_and_reaped() {
        use rustix::process::{WaitId, WaitIdOptions};
        let launched = start(&["sleep", "30"], &std::env::temp_dir(), &[]).unwrap();
        let watch = launched.pidfd.try_clone().unwrap();
        drop(Child::new(launched).unwrap());
        let options = WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT;
        let guard = Instant::now() + Duration::from_secs(10);
        // Once it is reaped, waiting through the pidfd finds no child any more.
        while rustix::process::waitid(WaitId::PidFd(watch.as_fd()), options).err()
            != Some(rustix::io::Errno::CHILD)
        {
            assert!(Instant::now() < guard, "the dropped child was not reaped");
            tokio::task::yield_now().await;
        }
    }

    #[test]
    fn no_new_privs_when_asked() {
        let (mut plan, _null) = plan(&["sleep", "30"], &std::env::temp_dir(), &[]).unwrap();
        plan.no_new_privs = true;
        let child = launch(&plan).unwrap();
        wait_for_exec(child.pid, "sleep");
        assert_eq!(status_field(child.pid, "NoNewPrivs:"), 1);
        rustix::process::pidfd_send_signal(&child.pidfd, rustix::process::Signal::KILL).unwrap();
        assert_eq!(wait(child.pid).terminating_signal(), Some(libc::SIGKILL));
    }

    /// A standard descriptor of the runtime given as another stream of the child reaches the
    /// child, even when an earlier stream is set up over it. Here the test's own standard input
    /// becomes the child's standard error, while its standard input is a file: set up in order
    /// without care, both would be that file.
    #[test]
    fn a_low_descriptor_is_not_overwritten_by_an_earlier_stream() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("input");
        std::fs::write(&input, "").unwrap();
        let input = std::fs::File::open(&input).unwrap();
        let (read, write) = std::io::pipe().unwrap();
        let argv = ["readlink".to_owned(), "/proc/self/fd/2".to_owned()];
        let mut plan = Plan::new(&argv, dir.path(), &[]).unwrap();
        plan.stdio = [input.as_raw_fd(), write.as_raw_fd(), 0];
        let child = launch(&plan).unwrap();
        drop(write);
        let mut out = String::new();
        std::io::Read::read_to_string(&mut std::fs::File::from(OwnedFd::from(read)), &mut out)
            .unwrap();
        assert_eq!(wait(child.pid).exit_status(), Some(0));
        let ours = std::fs::read_link("/proc/self/fd/0").unwrap();
        assert_eq!(out.trim_end(), ours.to_str().unwrap());
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
