//! The C library calls and constants the helper needs, which `std` does not wrap, each behind a
//! safe function that returns `io::Result`. Linux on x86-64, AArch64 and RISC-V 64 (the system
//! call numbers of `pivot_root` and `capset` are the only per-architecture values).

use std::ffi::{CString, c_char, c_int, c_long, c_uint, c_ulong, c_void};
use std::io;
use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;

#[cfg(not(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    target_arch = "riscv64"
)))]
compile_error!("pod-sandbox knows the system calls of x86-64, AArch64 and RISC-V 64 Linux only");

#[cfg(target_arch = "x86_64")]
const SYS_PIVOT_ROOT: c_long = 155;
#[cfg(target_arch = "x86_64")]
const SYS_CAPSET: c_long = 126;
#[cfg(any(target_arch = "aarch64", target_arch = "riscv64"))]
const SYS_PIVOT_ROOT: c_long = 41;
#[cfg(any(target_arch = "aarch64", target_arch = "riscv64"))]
const SYS_CAPSET: c_long = 91;

pub(crate) const PR_SET_PDEATHSIG: c_int = 1;
pub(crate) const PR_SET_DUMPABLE: c_int = 4;
pub(crate) const PR_SET_SECCOMP: c_int = 22;
pub(crate) const PR_CAPBSET_DROP: c_int = 24;
pub(crate) const PR_SET_CHILD_SUBREAPER: c_int = 36;
pub(crate) const PR_SET_NO_NEW_PRIVS: c_int = 38;
pub(crate) const PR_CAP_AMBIENT: c_int = 47;
const PR_CAP_AMBIENT_CLEAR_ALL: c_ulong = 4;
const SECCOMP_MODE_FILTER: c_ulong = 2;

pub(crate) const SIG_DFL: usize = 0;
pub(crate) const SIG_IGN: usize = 1;
pub(crate) const SIGKILL: c_int = 9;
pub(crate) const WNOHANG: c_int = 1;
pub(crate) const WEXITED: c_int = 4;
pub(crate) const WNOWAIT: c_int = 0x0100_0000;
pub(crate) const P_ALL: c_int = 0;
pub(crate) const EINTR: i32 = 4;

pub(crate) const MS_RDONLY: c_ulong = 1;
pub(crate) const MS_NOSUID: c_ulong = 2;
pub(crate) const MS_NODEV: c_ulong = 4;
pub(crate) const MS_NOEXEC: c_ulong = 8;
pub(crate) const MS_REMOUNT: c_ulong = 32;
pub(crate) const MS_NOATIME: c_ulong = 1024;
pub(crate) const MS_NODIRATIME: c_ulong = 2048;
pub(crate) const MS_BIND: c_ulong = 4096;
pub(crate) const MS_REC: c_ulong = 16384;
pub(crate) const MS_PRIVATE: c_ulong = 1 << 18;
pub(crate) const MS_RELATIME: c_ulong = 1 << 21;
pub(crate) const MS_STRICTATIME: c_ulong = 1 << 24;
const MNT_DETACH: c_int = 2;

/// Room for a `siginfo_t` (128 bytes); its fields are not read.
#[repr(C, align(8))]
pub(crate) struct SigInfo(pub(crate) [u8; 128]);

/// `struct sock_fprog`.
#[repr(C)]
struct SockFprog {
    len: u16,
    filter: *const u8,
}

/// `struct __user_cap_header_struct` and `struct __user_cap_data_struct`, version 3.
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: c_int,
}
#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}
const CAP_VERSION_3: u32 = 0x2008_0522;

mod c {
    use std::ffi::{c_char, c_int, c_long, c_uint, c_ulong, c_void};

    unsafe extern "C" {
        pub(crate) fn prctl(option: c_int, ...) -> c_int;
        pub(crate) fn signal(signum: c_int, handler: usize) -> usize;
        pub(crate) fn kill(pid: i32, signal: c_int) -> c_int;
        pub(crate) fn getpid() -> i32;
        pub(crate) fn geteuid() -> c_uint;
        pub(crate) fn getegid() -> c_uint;
        pub(crate) fn fork() -> i32;
        pub(crate) fn waitpid(pid: i32, status: *mut c_int, options: c_int) -> i32;
        pub(crate) fn waitid(
            idtype: c_int,
            id: c_uint,
            info: *mut super::SigInfo,
            options: c_int,
        ) -> c_int;
        pub(crate) fn unshare(flags: c_int) -> c_int;
        pub(crate) fn setns(fd: c_int, nstype: c_int) -> c_int;
        pub(crate) fn mount(
            source: *const c_char,
            target: *const c_char,
            fstype: *const c_char,
            flags: c_ulong,
            data: *const c_void,
        ) -> c_int;
        pub(crate) fn umount2(target: *const c_char, flags: c_int) -> c_int;
        pub(crate) fn sethostname(name: *const c_char, len: usize) -> c_int;
        pub(crate) fn setgroups(size: usize, list: *const c_uint) -> c_int;
        pub(crate) fn setresuid(ruid: c_uint, euid: c_uint, suid: c_uint) -> c_int;
        pub(crate) fn setresgid(rgid: c_uint, egid: c_uint, sgid: c_uint) -> c_int;
        pub(crate) fn syscall(number: c_long, ...) -> c_long;
        pub(crate) fn fcntl(fd: c_int, command: c_int, ...) -> c_int;
    }
}

fn check(result: c_int) -> io::Result<()> {
    if result == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn cstring(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path with a NUL byte"))
}

pub(crate) fn prctl(option: c_int, argument: c_ulong) -> io::Result<()> {
    // SAFETY: prctl(2) with integer arguments only.
    check(unsafe { c::prctl(option, argument, 0 as c_ulong, 0 as c_ulong, 0 as c_ulong) })
}

/// Sets the disposition of `signal` to `SIG_DFL` or `SIG_IGN` (async-signal-safe).
pub(crate) fn set_signal(signal: c_int, handler: usize) {
    // SAFETY: signal(2) with a signal number and SIG_DFL or SIG_IGN (no handler function).
    unsafe { c::signal(signal, handler) };
}

pub(crate) fn kill(pid: i32, signal: c_int) {
    // SAFETY: kill(2) with integers; callers name their own unreaped children.
    unsafe { c::kill(pid, signal) };
}

pub(crate) fn getpid() -> i32 {
    // SAFETY: getpid(2) has no arguments.
    unsafe { c::getpid() }
}

pub(crate) fn effective_ids() -> (u32, u32) {
    // SAFETY: geteuid(2) and getegid(2) have no arguments.
    unsafe { (c::geteuid(), c::getegid()) }
}

/// Forks; `Ok(0)` in the child. Only for a single-threaded process.
pub(crate) fn fork() -> io::Result<i32> {
    // SAFETY: fork(2); the callers have no other thread at that point, so the child's copy of
    // the process is consistent (no lock held by a thread that does not exist in it).
    let pid = unsafe { c::fork() };
    if pid == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(pid)
    }
}

/// `waitpid(pid, options)`: the pid reaped (0 with `WNOHANG` when none) and its status.
pub(crate) fn waitpid(pid: i32, options: c_int) -> io::Result<(i32, c_int)> {
    let mut status: c_int = 0;
    // SAFETY: waitpid(2) writes one c_int into `status`.
    let reaped = unsafe { c::waitpid(pid, &raw mut status, options) };
    if reaped == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok((reaped, status))
    }
}

/// Waits until some child has exited, leaving it unreaped (`waitid` with `WNOWAIT`).
pub(crate) fn wait_any_exited() -> io::Result<()> {
    let mut info = SigInfo([0; 128]);
    // SAFETY: waitid(2) writes at most a siginfo_t (128 bytes) into `info`.
    check(unsafe { c::waitid(P_ALL, 0 as c_uint, &raw mut info, WEXITED | WNOWAIT) })
}

pub(crate) fn unshare(flags: c_int) -> io::Result<()> {
    // SAFETY: unshare(2) with flags; it changes only this process's namespaces.
    check(unsafe { c::unshare(flags) })
}

pub(crate) fn setns(fd: c_int, flag: c_int) -> io::Result<()> {
    // SAFETY: setns(2) with a descriptor this process inherited and a namespace type.
    check(unsafe { c::setns(fd, flag) })
}

/// mount(2) with an optional source, filesystem type and data string.
pub(crate) fn mount(
    source: Option<&Path>,
    target: &Path,
    fstype: Option<&str>,
    flags: c_ulong,
    data: Option<&str>,
) -> io::Result<()> {
    let source = source.map(cstring).transpose()?;
    let target = cstring(target)?;
    let fstype = fstype
        .map(|t| CString::new(t).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput)))
        .transpose()?;
    let data = data
        .map(|d| CString::new(d).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput)))
        .transpose()?;
    let pointer = |s: &Option<CString>| s.as_ref().map_or(std::ptr::null(), |s| s.as_ptr());
    // SAFETY: mount(2) with NUL-terminated strings (or null pointers) that live until it
    // returns.
    check(unsafe {
        c::mount(
            pointer(&source),
            target.as_ptr(),
            pointer(&fstype),
            flags,
            pointer(&data).cast::<c_void>(),
        )
    })
}

/// Detaches the mount at `target` (lazily).
pub(crate) fn umount_detach(target: &Path) -> io::Result<()> {
    let target = cstring(target)?;
    // SAFETY: umount2(2) with a NUL-terminated string that lives until it returns.
    check(unsafe { c::umount2(target.as_ptr(), MNT_DETACH) })
}

/// pivot_root(2) (which the C library does not wrap).
pub(crate) fn pivot_root(new_root: &Path, put_old: &Path) -> io::Result<()> {
    let new_root = cstring(new_root)?;
    let put_old = cstring(put_old)?;
    // SAFETY: the pivot_root system call with two NUL-terminated strings that live until it
    // returns.
    let result = unsafe {
        c::syscall(
            SYS_PIVOT_ROOT,
            new_root.as_ptr().cast::<c_char>(),
            put_old.as_ptr().cast::<c_char>(),
        )
    };
    if result == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

pub(crate) fn sethostname(name: &str) -> io::Result<()> {
    // SAFETY: sethostname(2) reads `len` bytes of `name`.
    check(unsafe { c::sethostname(name.as_ptr().cast::<c_char>(), name.len()) })
}

pub(crate) fn setgroups(groups: &[u32]) -> io::Result<()> {
    // SAFETY: setgroups(2) reads `size` gids from the slice.
    check(unsafe { c::setgroups(groups.len(), groups.as_ptr()) })
}

pub(crate) fn set_ids(uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: setresgid(2) and setresuid(2) with integers.
    check(unsafe { c::setresgid(gid, gid, gid) })?;
    // SAFETY: as above.
    check(unsafe { c::setresuid(uid, uid, uid) })
}

/// Empties the permitted, effective and inheritable capability sets.
pub(crate) fn clear_capabilities() -> io::Result<()> {
    let mut header = CapHeader {
        version: CAP_VERSION_3,
        pid: 0,
    };
    let data = [CapData {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: the capset system call reads one header and two data structures (version 3).
    let result = unsafe { c::syscall(SYS_CAPSET, &raw mut header, data.as_ptr()) };
    if result == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Drops every capability from the bounding set (up to `last`, the kernel's
/// `cap_last_cap`) and clears the ambient set.
pub(crate) fn drop_bounding_and_ambient(last: u32) -> io::Result<()> {
    for cap in 0..=last {
        prctl(PR_CAPBSET_DROP, c_ulong::from(cap))?;
    }
    // SAFETY: prctl(2) with integer arguments only.
    check(unsafe {
        c::prctl(
            PR_CAP_AMBIENT,
            PR_CAP_AMBIENT_CLEAR_ALL,
            0 as c_ulong,
            0 as c_ulong,
            0 as c_ulong,
        )
    })
}

/// Installs `program` (an array of `struct sock_filter`) as this process's seccomp filter
/// (`no_new_privs` must be set).
pub(crate) fn install_seccomp(program: &[u8]) -> io::Result<()> {
    let len = u16::try_from(program.len() / 8)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "seccomp program too long"))?;
    if !program.len().is_multiple_of(8) || len == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a seccomp program is whole 8-byte instructions",
        ));
    }
    let fprog = SockFprog {
        len,
        filter: program.as_ptr(),
    };
    // SAFETY: prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &fprog) reads the program, which lives
    // until it returns (the kernel copies it).
    check(unsafe {
        c::prctl(
            PR_SET_SECCOMP,
            SECCOMP_MODE_FILTER,
            &raw const fprog,
            0 as c_ulong,
            0 as c_ulong,
        )
    })
}

/// Sets `PR_SET_PDEATHSIG` to SIGKILL and returns whether the parent is still alive, as
/// `lifeline` (the read end of a pipe whose write end only the parent holds) tells: the signal
/// would not come for a parent that died before it was set. Call it after the last change of
/// credentials (which clears the setting).
pub(crate) fn die_with_parent(lifeline: &std::io::PipeReader) -> io::Result<bool> {
    use std::io::Read as _;
    use std::os::fd::AsRawFd as _;
    const F_SETFL: c_int = 4;
    const O_NONBLOCK: c_int = 0o4000;
    prctl(PR_SET_PDEATHSIG, SIGKILL as c_ulong)?;
    // SAFETY: fcntl(2) with F_SETFL and an integer flag on a descriptor we own.
    check(unsafe { c::fcntl(lifeline.as_raw_fd(), F_SETFL, O_NONBLOCK) })?;
    let mut byte = [0u8; 1];
    match (&*lifeline).read(&mut byte) {
        // End of file: the parent's end is closed, the parent gone.
        Ok(0) => Ok(false),
        Ok(_) => Ok(true),
        Err(error) if error.kind() == io::ErrorKind::WouldBlock => Ok(true),
        Err(error) => Err(error),
    }
}

/// Marks `fd` close-on-exec (errors ignored: a descriptor closed meanwhile needs nothing).
pub(crate) fn set_cloexec(fd: c_int) {
    const F_SETFD: c_int = 2;
    const FD_CLOEXEC: c_int = 1;
    // SAFETY: fcntl(2) with F_SETFD and an integer flag.
    unsafe { c::fcntl(fd, F_SETFD, FD_CLOEXEC) };
}
