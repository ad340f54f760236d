//! Pod processes: spawning a container's program in its own process group, inside bubblewrap or
//! under the embedded supervisor, and stopping it (gracefully or not) so that no process of the
//! container survives it.
//!
//! A program that dies leaves its descendants to the nearest subreaper, normally init: the
//! runtime's commands run in sessions of their own, so killing the container's process group
//! misses them. Under bubblewrap every container has its own pid namespace, which the kernel
//! empties when bubblewrap's init ends. Without bubblewrap the container's program runs under
//! `kube-sim-supervisor` (`src/bin/kube-sim-supervisor.rs`, embedded here by `build.rs`), a child
//! subreaper that kills everything left below it when the program ends or when the kubelet
//! closes its standard input, and exits only then, with the program's status.
//!
//! Every live group is registered in a [`ProcessTable`], so that stopping the kubelet (or
//! dropping its handle) can kill every pod process even when the tasks that own them are gone. Each group
//! is also killed by its [`GroupGuard`] when dropped.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::io::{PipeWriter, Write as _};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use rustix::process::{Pid, Signal, kill_process, kill_process_group};

use crate::cgroup::{Cgroup, Hierarchy, Limits};
use crate::confine::{self, Protections};

/// How pod processes are isolated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Isolation {
    /// The strongest this machine supports: bubblewrap with every protection that works here
    /// (what is missing is reported at start-up), or plain processes without bubblewrap.
    #[default]
    Auto,
    /// Each pod process in bubblewrap: private pid, mount, ipc and uts namespaces (hostname =
    /// pod name), a root of its own showing only the host's system directories ([`SYSTEM_DIRS`]
    /// and some of `/etc`) read-only, a writable pod directory at `/app` and a private `/tmp`;
    /// and whichever of the [`Protections`] work here.
    Bwrap,
    /// [`Isolation::Bwrap`] with every protection, or refuse to start.
    Strict,
    /// Plain child processes in their own process group, in the pod's directory.
    None,
}

impl std::str::FromStr for Isolation {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "auto" => Ok(Self::Auto),
            "bwrap" => Ok(Self::Bwrap),
            "strict" => Ok(Self::Strict),
            "none" => Ok(Self::None),
            other => Err(format!(
                "unknown isolation {other:?} (auto, bwrap, strict or none)"
            )),
        }
    }
}

impl Isolation {
    /// The isolation pods actually get: `Auto` resolved to what works here (`Bwrap` or
    /// `None`); `None` (the `Option`) when bubblewrap is asked for where it does not work.
    /// `Strict` resolves to `Bwrap` when bubblewrap works; whether every protection does is
    /// [`Protections::missing`]'s to say.
    pub fn resolve(self) -> Option<Self> {
        match self {
            Self::Auto if bwrap_available() => Some(Self::Bwrap),
            Self::Auto | Self::None => Some(Self::None),
            Self::Bwrap | Self::Strict if bwrap_available() => Some(Self::Bwrap),
            Self::Bwrap | Self::Strict => None,
        }
    }
}

/// Whether bubblewrap is installed and can create the namespaces we use (checked once).
pub fn bwrap_available() -> bool {
    static WORKS: OnceLock<bool> = OnceLock::new();
    *WORKS.get_or_init(|| {
        std::process::Command::new("bwrap")
            .args([
                "--ro-bind",
                "/",
                "/",
                "--unshare-pid",
                "--unshare-ipc",
                "--unshare-uts",
                "--proc",
                "/proc",
                "--dev",
                "/dev",
                "--",
                "true",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    })
}

/// Where the pod's directory appears inside bubblewrap.
pub(crate) const POD_DIR_IN_SANDBOX: &str = "/app";

/// The host's top-level names a pod sees, read-only: its programs and libraries (directories,
/// or the symlinks of a merged `/usr`). Nothing else of the host's root is there: no home
/// directories, no `/var`, `/opt`, `/srv`, `/mnt`, `/run`, no checkout.
pub(crate) const SYSTEM_DIRS: [&str; 7] = ["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"];

/// The host's `/etc` entries a pod sees (read-only, where the host has them): what programs
/// need to resolve names, verify certificates, load libraries and find their configuration.
/// Not the rest (`shadow`, `ssh`, `ssl/private`, `sudoers`, credentials of services, ...).
pub(crate) const ETC_ENTRIES: &[&str] = &[
    "alternatives",
    "bash.bashrc",
    "ca-certificates",
    "ca-certificates.conf",
    "debian_version",
    "gai.conf",
    "host.conf",
    "inputrc",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "locale.alias",
    "localtime",
    "mime.types",
    "nsswitch.conf",
    "os-release",
    "pki/tls/certs",
    "profile",
    "protocols",
    "python3",
    "python3.11",
    "python3.12",
    "python3.13",
    "python3.14",
    "resolv.conf",
    "rpc",
    "services",
    "shells",
    "ssl/certs",
    "ssl/openssl.cnf",
    "timezone",
];

/// The `/etc` files the kubelet writes for each pod.
pub(crate) const ETC_OWN: [&str; 4] = ["passwd", "group", "hosts", "hostname"];

/// Top-level entries of the host root, for building the sandbox's root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum RootEntry {
    Dir(String),
    Symlink(String, String),
    /// A regular file (only below the root: see [`Split`]).
    File(String),
}

/// One volume mount of a container, as bubblewrap makes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Mount {
    /// The directory on the host.
    pub(crate) host: PathBuf,
    /// Where it appears: an absolute path without symlinks (as the sandbox resolves them).
    pub(crate) dest: String,
    pub(crate) read_only: bool,
}

/// A directory of the host that the sandbox shows read-only and under which a mount point must
/// be made (`/usr/local/app` for a volume there when the host has no `/usr/local/app`):
/// bubblewrap puts a tmpfs there showing the same entries, makes the mount point on it, and
/// remounts it read-only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Split {
    pub(crate) dir: String,
    pub(crate) entries: Vec<RootEntry>,
}

/// The entries of a host directory (symlinks as they are, directories and regular files).
fn host_entries(dir: &Path) -> Vec<RootEntry> {
    let mut entries = Vec::new();
    let Ok(read) = std::fs::read_dir(dir) else {
        return entries;
    };
    for entry in read.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if let Ok(target) = std::fs::read_link(&path) {
            entries.push(RootEntry::Symlink(
                name,
                target.to_string_lossy().into_owned(),
            ));
        } else if path.is_dir() {
            entries.push(RootEntry::Dir(name));
        } else if path.is_file() {
            entries.push(RootEntry::File(name));
        }
    }
    entries.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
    entries
}

/// Whether `parts` (of an absolute path) name something the sandbox shows from the host: below
/// a [`SYSTEM_DIRS`] entry or an [`ETC_ENTRIES`] one.
fn shown_from_host(parts: &[&str]) -> bool {
    match parts {
        [top, ..] if SYSTEM_DIRS.contains(top) => true,
        ["etc", rest @ ..] if !rest.is_empty() => ETC_ENTRIES.iter().any(|entry| {
            let entry: Vec<&str> = entry.split('/').collect();
            rest.len() >= entry.len() && rest[..entry.len()] == entry[..]
        }),
        _ => false,
    }
}

/// Resolves where each `(host, mountPath, readOnly)` appears in the sandbox and which host
/// directories must be split for the mount points to be made ([`Split`]). A mount path is
/// refused (with the reason) when it is not absolute, has `..` in it, or lands on a file.
pub(crate) fn prepare_mounts(
    wanted: Vec<(PathBuf, String, bool)>,
) -> Result<(Vec<Mount>, Vec<Split>), String> {
    let mut mounts = Vec::new();
    let mut split_dirs: Vec<String> = Vec::new();
    for (host, path, read_only) in wanted {
        let relative = path
            .strip_prefix('/')
            .ok_or_else(|| format!("mountPath {path:?} is not absolute"))?;
        let parts: Vec<&str> = relative.split('/').filter(|p| !p.is_empty()).collect();
        if parts.contains(&"..") || parts.is_empty() {
            return Err(format!("mountPath {path:?} must name a directory below /"));
        }
        if !shown_from_host(&parts) {
            // The sandbox's own directories (its root and `/etc` are tmpfs of its own):
            // mount points are made there as asked.
            mounts.push(Mount {
                host,
                dest: format!("/{}", parts.join("/")),
                read_only,
            });
            continue;
        }
        // The deepest part the host has, with its symlinks resolved as the sandbox (which shows
        // the host's tree there) resolves them; the rest is made.
        let mut existing = PathBuf::from("/");
        let mut rest = parts.len();
        for (index, part) in parts.iter().enumerate() {
            let next = existing.join(part);
            match std::fs::canonicalize(&next) {
                Ok(resolved) => existing = resolved,
                Err(_) => {
                    rest = index;
                    break;
                }
            }
        }
        if !existing.is_dir() {
            return Err(format!(
                "mountPath {path:?} is under {}, which is not a directory",
                existing.display()
            ));
        }
        let base = existing.to_string_lossy().into_owned();
        let dest = std::iter::once(base.trim_end_matches('/').to_owned())
            .chain(parts[rest..].iter().map(|p| (*p).to_owned()))
            .collect::<Vec<_>>()
            .join("/");
        let dest = if dest.is_empty() {
            "/".to_owned()
        } else {
            dest
        };
        let base_parts: Vec<&str> = base.split('/').filter(|p| !p.is_empty()).collect();
        if rest < parts.len()
            && base != "/"
            && shown_from_host(&base_parts)
            && !split_dirs.contains(&base)
        {
            split_dirs.push(base);
        }
        mounts.push(Mount {
            host,
            dest,
            read_only,
        });
    }
    // Shallow first, so that a deeper split lands on the tmpfs of a shallower one.
    split_dirs.sort_by_key(|dir| dir.matches('/').count());
    let splits = split_dirs
        .into_iter()
        .map(|dir| Split {
            entries: host_entries(Path::new(&dir)),
            dir,
        })
        .collect();
    Ok((mounts, splits))
}

/// The host's [`SYSTEM_DIRS`] as they are here (directories or symlinks).
fn host_root() -> &'static [RootEntry] {
    static ROOT: OnceLock<Vec<RootEntry>> = OnceLock::new();
    ROOT.get_or_init(|| {
        host_entries(Path::new("/"))
            .into_iter()
            .filter(|entry| match entry {
                RootEntry::Dir(name) | RootEntry::Symlink(name, _) => {
                    SYSTEM_DIRS.contains(&name.as_str())
                }
                RootEntry::File(_) => false,
            })
            .collect()
    })
}

/// The host's [`ETC_ENTRIES`] that exist here.
fn host_etc() -> &'static [String] {
    static ETC: OnceLock<Vec<String>> = OnceLock::new();
    ETC.get_or_init(|| {
        ETC_ENTRIES
            .iter()
            .filter(|entry| Path::new("/etc").join(entry).exists())
            .map(|entry| format!("/etc/{entry}"))
            .collect()
    })
}

/// Who a pod's processes are.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Identity {
    /// uid and gid inside the pod's user namespace.
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    /// Run in a user namespace (with `uid`/`gid`, no capabilities, no nested namespaces).
    pub(crate) user_namespace: bool,
    /// The host uid (and gid) they have, when the kubelet (root) gives each pod one.
    pub(crate) host_id: Option<u32>,
}

/// What to start.
#[derive(Clone, Debug, Default)]
pub(crate) struct LaunchSpec {
    /// Program (absolute path) and arguments.
    pub(crate) argv: Vec<String>,
    pub(crate) env: BTreeMap<String, String>,
    /// Working directory as the process sees it (`None`: the pod's directory).
    pub(crate) workdir: Option<String>,
    pub(crate) hostname: String,
    /// The pod's IP, for its `/etc/hosts`.
    pub(crate) pod_ip: Option<String>,
    /// The pod's directory on the host.
    pub(crate) pod_dir: PathBuf,
    /// Volume mounts; bubblewrap only.
    pub(crate) mounts: Vec<Mount>,
    /// Read-only host directories to rebuild so that mount points can be made below them.
    pub(crate) splits: Vec<Split>,
    /// File that receives stdout and stderr.
    pub(crate) log: PathBuf,
    /// Who the processes are (bubblewrap only).
    pub(crate) identity: Identity,
    /// The container's resource limits and its control group's name (bubblewrap only).
    pub(crate) limits: Option<(Limits, String)>,
    /// The pod's network namespace, which the container's processes enter (bubblewrap only).
    pub(crate) net: Option<Arc<crate::pod_net::PodNet>>,
}

/// The descriptors bubblewrap binds from, by what they stand for (open in the kubelet, which
/// may reach paths the pod's host uid cannot).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct BindFds {
    pub(crate) pod_dir: RawFd,
    /// The program, when it lives outside [`SYSTEM_DIRS`].
    pub(crate) program: Option<RawFd>,
    /// One per [`LaunchSpec::mounts`] entry.
    pub(crate) mounts: Vec<RawFd>,
    /// The contents of the [`ETC_OWN`] files, in that order.
    pub(crate) etc: Vec<RawFd>,
    pub(crate) seccomp: Option<RawFd>,
}

/// Whether `program` lives below one of the [`SYSTEM_DIRS`] (and is therefore visible).
fn in_system_dirs(program: &str) -> bool {
    program
        .strip_prefix('/')
        .and_then(|rest| rest.split('/').next())
        .is_some_and(|top| SYSTEM_DIRS.contains(&top))
}

/// The bubblewrap command line for `spec` (sans IO): `root` is the host's system directories,
/// `etc` the host's `/etc` entries shown, `fds` what to bind from.
pub(crate) fn bwrap_args(
    root: &[RootEntry],
    etc: &[String],
    spec: &LaunchSpec,
    fds: &BindFds,
) -> Vec<OsString> {
    let mut args: Vec<OsString> = Vec::new();
    let mut push = |items: &[&str]| args.extend(items.iter().map(OsString::from));
    push(&["--tmpfs", "/"]);
    for entry in root {
        match entry {
            RootEntry::Dir(name) => {
                let path = format!("/{name}");
                push(&["--ro-bind", &path, &path]);
            }
            RootEntry::Symlink(name, target) => {
                push(&["--symlink", target, &format!("/{name}")]);
            }
            RootEntry::File(_) => {}
        }
    }
    push(&["--tmpfs", "/etc"]);
    for path in etc {
        push(&["--ro-bind", path, path]);
    }
    for (name, fd) in ETC_OWN.iter().zip(&fds.etc) {
        push(&["--ro-bind-data", &fd.to_string(), &format!("/etc/{name}")]);
    }
    push(&[
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--hostname",
        &spec.hostname,
        "--die-with-parent",
    ]);
    let identity = spec.identity;
    if identity.user_namespace {
        push(&[
            "--unshare-user",
            "--uid",
            &identity.uid.to_string(),
            "--gid",
            &identity.gid.to_string(),
            "--disable-userns",
        ]);
    }
    if identity.user_namespace || confine::is_root() {
        push(&["--cap-drop", "ALL"]);
    }
    if let Some(fd) = fds.seccomp {
        push(&["--seccomp", &fd.to_string()]);
    }
    push(&[
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
        "--dir",
        POD_DIR_IN_SANDBOX,
        "--bind-fd",
        &fds.pod_dir.to_string(),
        POD_DIR_IN_SANDBOX,
    ]);
    // A program outside the system directories (a binary of this workspace, a test's script)
    // is bound in at its own path, alone.
    if let (Some(program), Some(fd)) = (spec.argv.first(), fds.program) {
        push(&["--ro-bind-fd", &fd.to_string(), program]);
    }
    for split in &spec.splits {
        push(&["--tmpfs", &split.dir]);
        for entry in &split.entries {
            match entry {
                RootEntry::Dir(name) | RootEntry::File(name) => {
                    let path = format!("{}/{name}", split.dir);
                    push(&["--ro-bind", &path, &path]);
                }
                RootEntry::Symlink(name, target) => {
                    let path = format!("{}/{name}", split.dir);
                    push(&["--symlink", target, &path]);
                }
            }
        }
    }
    for (mount, fd) in spec.mounts.iter().zip(&fds.mounts) {
        let bind = if mount.read_only {
            "--ro-bind-fd"
        } else {
            "--bind-fd"
        };
        push(&["--dir", &mount.dest, bind, &fd.to_string(), &mount.dest]);
    }
    for split in &spec.splits {
        push(&["--remount-ro", &split.dir]);
    }
    let workdir = spec.workdir.as_deref().unwrap_or(POD_DIR_IN_SANDBOX);
    if !workdir.starts_with(POD_DIR_IN_SANDBOX) && !workdir.starts_with("/tmp") {
        push(&["--dir", workdir]);
    }
    push(&[
        "--remount-ro",
        "/etc",
        "--remount-ro",
        "/",
        "--chdir",
        workdir,
        "--",
    ]);
    args.extend(spec.argv.iter().map(OsString::from));
    args
}

/// What a child does between fork and exec, with nothing but system calls (no allocation): keep
/// the descriptors it is given across exec, join its control group, lower its limits.
#[derive(Clone, Debug, Default)]
pub(crate) struct ChildSetup {
    /// A user namespace to enter first: the node namespace's, whose user is this process's
    /// (a kubelet that is not root).
    pub(crate) userns: Option<RawFd>,
    /// A network namespace to enter next (while still root, or in `userns`).
    pub(crate) netns: Option<RawFd>,
    /// Descriptors to keep open across exec (their close-on-exec flag cleared in the child).
    pub(crate) keep: Vec<RawFd>,
    /// `cgroup.procs` descriptors to write `0` to.
    pub(crate) join: Vec<RawFd>,
    /// `RLIMIT_NPROC`, when no control group counts the processes but the pod has a host uid
    /// of its own.
    pub(crate) nproc: Option<u64>,
    /// The host uid and gid to become (no supplementary groups), after the steps that need
    /// root.
    pub(crate) host_id: Option<u32>,
}

impl ChildSetup {
    #[allow(unsafe_code)]
    fn run(&self) -> std::io::Result<()> {
        use rustix::process::{Resource, Rlimit, setrlimit};
        if let Some(fd) = self.userns {
            // SAFETY: the node namespace's descriptor is open in the parent (the kubelet holds
            // it for as long as it has pods) and therefore in the forked child.
            let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
            rustix::thread::move_into_link_name_space(
                fd,
                Some(rustix::thread::LinkNameSpaceType::User),
            )?;
        }
        if let Some(fd) = self.netns {
            // SAFETY: the pod's namespace descriptor is open in the parent (the spawning
            // function holds the pod's network) and therefore in the forked child.
            let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
            rustix::thread::move_into_link_name_space(
                fd,
                Some(rustix::thread::LinkNameSpaceType::Network),
            )?;
        }
        for fd in &self.keep {
            // SAFETY: the descriptor is open in the parent (owned by the spawning function until
            // the child has been started) and therefore in the forked child.
            let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(*fd) };
            rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::empty())?;
        }
        for fd in &self.join {
            // SAFETY: as above.
            let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(*fd) };
            rustix::io::write(fd, b"0")?;
        }
        if let Some(id) = self.host_id {
            rustix::thread::set_thread_groups(&[])?;
            rustix::thread::set_thread_gid(rustix::process::Gid::from_raw(id))?;
            rustix::thread::set_thread_uid(rustix::process::Uid::from_raw(id))?;
        }
        // No core dumps: they would write the process's memory into the pod's directory.
        setrlimit(
            Resource::Core,
            Rlimit {
                current: Some(0),
                maximum: Some(0),
            },
        )?;
        if let Some(limit) = self.nproc {
            setrlimit(
                Resource::Nproc,
                Rlimit {
                    current: Some(limit),
                    maximum: Some(limit),
                },
            )?;
        }
        Ok(())
    }
}

/// Makes `command`'s child keep `fds` across exec (and nothing else of this process's).
pub(crate) fn inherit(command: &mut std::process::Command, fds: Vec<RawFd>) {
    enter(command, None, None, fds);
}

/// Makes `command`'s child enter the user namespace `userns` and the network namespace `netns`
/// (when given, in that order) and keep `fds` across exec.
pub(crate) fn enter(
    command: &mut std::process::Command,
    userns: Option<RawFd>,
    netns: Option<RawFd>,
    fds: Vec<RawFd>,
) {
    let setup = ChildSetup {
        userns,
        netns,
        keep: fds,
        ..ChildSetup::default()
    };
    #[allow(unsafe_code)]
    // SAFETY: `ChildSetup::run` makes only async-signal-safe system calls (setns, fcntl, write,
    // setrlimit) and allocates nothing, as code between fork and exec must.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(command, move || setup.run());
    }
}

/// The executable of `src/bin/kube-sim-supervisor.rs`, compiled by `build.rs`.
static SUPERVISOR: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/kube-sim-supervisor"));

/// A path that executes the embedded supervisor: a sealed memfd, made once per process. A
/// memfd rather than a file: it needs no writable, executable directory (`/tmp` may be
/// `noexec`) and leaves nothing behind.
fn supervisor() -> std::io::Result<&'static str> {
    static MADE: OnceLock<Result<(std::fs::File, String), String>> = OnceLock::new();
    let made = MADE.get_or_init(|| {
        let file = memfd_supervisor().map_err(|error| {
            format!("failed to make the pod supervisor executable (a sealed memfd): {error}")
        })?;
        let path = format!("/proc/self/fd/{}", file.as_raw_fd());
        Ok((file, path))
    });
    match made {
        Ok((_, path)) => Ok(path),
        Err(message) => Err(std::io::Error::other(message.clone())),
    }
}

fn memfd_supervisor() -> std::io::Result<std::fs::File> {
    use rustix::fs::{MemfdFlags, SealFlags};
    let flags = MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING;
    // MFD_EXEC (Linux 6.3) keeps `vm.memfd_noexec=1` from sealing it non-executable; older
    // kernels refuse the flag, and their memfds are executable anyway.
    let fd = rustix::fs::memfd_create("kube-sim-supervisor", flags | MemfdFlags::EXEC)
        .or_else(|_| rustix::fs::memfd_create("kube-sim-supervisor", flags))?;
    let mut file = std::fs::File::from(fd);
    file.write_all(SUPERVISOR)?;
    rustix::fs::fcntl_add_seals(
        &file,
        SealFlags::SEAL | SealFlags::SHRINK | SealFlags::GROW | SealFlags::WRITE,
    )?;
    Ok(file)
}

/// How the kubelet stops a group it registered.
#[derive(Debug)]
enum Stopper {
    /// SIGKILL to the group: bubblewrap's init dies, and with it its pid namespace.
    KillGroup,
    /// The write end of the supervisor's standard input: closing it makes the supervisor kill
    /// every process of the container and exit.
    Supervisor(PipeWriter),
}

impl Stopper {
    fn stop(self, pgid: i32) {
        match self {
            Self::KillGroup => kill_group(pgid, Signal::KILL),
            Self::Supervisor(stdin) => drop(stdin),
        }
    }
}

/// Every process group the kubelet started and has not yet seen die.
#[derive(Debug, Default)]
pub(crate) struct ProcessTable {
    groups: Mutex<HashMap<i32, Stopper>>,
    /// Set by [`ProcessTable::kill_all`]: a group started after it (by a pod worker that has
    /// not seen the kubelet stop yet) is stopped at once.
    closed: std::sync::atomic::AtomicBool,
}

impl ProcessTable {
    fn insert(&self, pgid: i32, stopper: Stopper) {
        let mut groups = self.groups.lock().unwrap_or_else(PoisonError::into_inner);
        if self.closed.load(std::sync::atomic::Ordering::SeqCst) {
            drop(groups);
            stopper.stop(pgid);
            return;
        }
        groups.insert(pgid, stopper);
    }

    /// Stops group `pgid` (if still registered) and forgets it.
    fn stop(&self, pgid: i32) {
        let stopper = self
            .groups
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&pgid);
        if let Some(stopper) = stopper {
            stopper.stop(pgid);
        }
    }

    /// Stops every registered group, and every group registered from now on.
    pub(crate) fn kill_all(&self) {
        let groups: Vec<(i32, Stopper)> = {
            let mut groups = self.groups.lock().unwrap_or_else(PoisonError::into_inner);
            self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
            groups.drain().collect()
        };
        for (pgid, stopper) in groups {
            stopper.stop(pgid);
        }
    }

    /// How many groups are alive.
    pub(crate) fn len(&self) -> usize {
        self.groups
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

fn kill_group(pgid: i32, signal: Signal) {
    if let Some(pid) = Pid::from_raw(pgid) {
        // ESRCH: the group is already gone, which is what we want.
        let _ = kill_process_group(pid, signal);
    }
}

/// Live (not zombie) members of process group `pgid`, from `/proc`.
fn live_members(pgid: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| {
                    let after = stat.rsplit_once(')')?.1.to_owned();
                    let mut fields = after.split_whitespace();
                    let state = fields.next()?.to_owned();
                    let group = fields.nth(1)?.parse::<i32>().ok()?;
                    Some(state != "Z" && group == pgid)
                })
                .unwrap_or(false)
        })
        .collect()
}

/// Kills a process group when dropped, unless it is already known dead.
#[derive(Debug)]
pub(crate) struct GroupGuard {
    pgid: i32,
    in_bwrap: bool,
    table: Arc<ProcessTable>,
    done: bool,
    /// The container's control group, removed once its processes are gone (dropped after
    /// [`GroupGuard::kill`]).
    cgroup: Option<Cgroup>,
    /// The processes [`GroupGuard::terminate`] sent SIGTERM to.
    terminated: std::collections::HashSet<i32>,
}

impl GroupGuard {
    /// Asks the processes to stop (SIGTERM), each once: called again while they stop, it
    /// reaches those that were not there yet (bubblewrap still setting up when it was first
    /// called, before it started the program). Under bubblewrap the monitor process is spared,
    /// so that it outlives its child and reports its exit status; the supervisor ignores it.
    pub(crate) fn terminate(&mut self) {
        if self.done {
            return;
        }
        if self.in_bwrap {
            for pid in live_members(self.pgid)
                .into_iter()
                .filter(|pid| *pid != self.pgid)
            {
                if self.terminated.insert(pid)
                    && let Some(pid) = Pid::from_raw(pid)
                {
                    let _ = kill_process(pid, Signal::TERM);
                }
            }
        } else if self.terminated.insert(self.pgid) {
            kill_group(self.pgid, Signal::TERM);
        }
    }

    /// Kills every process of the container and forgets the group: SIGKILL to the group
    /// under bubblewrap, end of input for the supervisor otherwise.
    pub(crate) fn kill(&mut self) {
        if !self.done {
            self.table.stop(self.pgid);
            self.done = true;
        }
    }

    /// Waits (at most `limit`) until no process of the group is alive any more: a SIGKILL is
    /// delivered asynchronously, and a pod must not be reported gone while its processes exit.
    pub(crate) async fn wait_gone(&self, limit: std::time::Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        while !live_members(self.pgid).is_empty() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
    }

    /// Whether the kernel killed a process of the container for exceeding its memory limit.
    pub(crate) fn out_of_memory(&self) -> bool {
        self.cgroup.as_ref().is_some_and(Cgroup::out_of_memory)
    }

    /// The group id: the leader's pid, bubblewrap's or the supervisor's.
    pub(crate) fn pgid(&self) -> i32 {
        self.pgid
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A started container process.
#[derive(Debug)]
pub(crate) struct Running {
    pub(crate) child: tokio::process::Child,
    pub(crate) guard: GroupGuard,
}

/// What bubblewrap needs open for one start; the descriptors close when it is dropped (after
/// the child has its copies).
#[derive(Debug, Default)]
struct Opened {
    fds: Vec<OwnedFd>,
    bind: BindFds,
    cgroup: Option<Cgroup>,
}

/// Opens `path` as a path descriptor (close-on-exec; bubblewrap gets it by [`ChildSetup`]).
fn open_path(path: &Path) -> std::io::Result<OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    rustix::fs::open(path, OFlags::PATH | OFlags::CLOEXEC, Mode::empty())
        .map_err(|error| std::io::Error::other(format!("opening {}: {error}", path.display())))
}

/// Opens what bubblewrap binds for `spec` and makes its control group.
fn open_for_bwrap(spec: &LaunchSpec, protections: &Protections) -> std::io::Result<Opened> {
    let mut opened = Opened::default();
    let keep = |fd: OwnedFd, opened: &mut Opened| {
        let raw = fd.as_raw_fd();
        opened.fds.push(fd);
        raw
    };
    opened.bind.pod_dir = keep(open_path(&spec.pod_dir)?, &mut opened);
    if let Some(program) = spec.argv.first().filter(|p| !in_system_dirs(p)) {
        opened.bind.program = Some(keep(open_path(Path::new(program))?, &mut opened));
    }
    for mount in &spec.mounts {
        let fd = keep(open_path(&mount.host)?, &mut opened);
        opened.bind.mounts.push(fd);
    }
    let identity = spec.identity;
    let home = POD_DIR_IN_SANDBOX;
    let (uid, gid) = if identity.user_namespace {
        (identity.uid, identity.gid)
    } else {
        (
            rustix::process::getuid().as_raw(),
            rustix::process::getgid().as_raw(),
        )
    };
    for (name, text) in [
        ("passwd", confine::passwd(uid, gid, home)),
        ("group", confine::group(gid)),
        (
            "hosts",
            confine::hosts(&spec.hostname, spec.pod_ip.as_deref()),
        ),
        ("hostname", format!("{}\n", spec.hostname)),
    ] {
        let fd = keep(confine::data_fd(name, text.as_bytes())?, &mut opened);
        opened.bind.etc.push(fd);
    }
    if protections.seccomp {
        let fd = keep(
            confine::data_fd("seccomp", &crate::seccomp::program())?,
            &mut opened,
        );
        opened.bind.seccomp = Some(fd);
    }
    if let (Some((limits, name)), Some(hierarchy)) = (&spec.limits, Hierarchy::detect()) {
        let cgroup = Cgroup::create(hierarchy, name, limits).map_err(std::io::Error::other)?;
        opened.cgroup = Some(cgroup);
    }
    Ok(opened)
}

/// Starts `spec` in a new process group, inside bubblewrap (with what `protections` allow) when
/// `bwrap` is true, else under the supervisor.
pub(crate) fn spawn(
    spec: &LaunchSpec,
    bwrap: bool,
    protections: &Protections,
    table: &Arc<ProcessTable>,
) -> std::io::Result<Running> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&spec.log)?;
    let log_err = log.try_clone()?;
    let program = spec
        .argv
        .first()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "empty command"))?;
    let mut stop_pipe = None;
    let mut opened = None;
    let mut command = if bwrap {
        let open = open_for_bwrap(spec, protections)?;
        let mut command = tokio::process::Command::new("bwrap");
        command
            .args(bwrap_args(host_root(), host_etc(), spec, &open.bind))
            .stdin(Stdio::null())
            .kill_on_drop(true);
        let setup = ChildSetup {
            userns: spec.net.as_ref().and_then(|net| net.user_fd()),
            netns: spec.net.as_ref().map(|net| net.fd()),
            host_id: spec.identity.host_id,
            keep: open.fds.iter().map(AsRawFd::as_raw_fd).collect(),
            join: open
                .cgroup
                .as_ref()
                .map(Cgroup::join_fds)
                .unwrap_or_default(),
            nproc: (open.cgroup.is_none() && spec.identity.host_id.is_some())
                .then(|| spec.limits.as_ref().map(|(limits, _)| limits.pids))
                .flatten(),
        };
        #[allow(unsafe_code)]
        // SAFETY: `ChildSetup::run` makes only async-signal-safe system calls (setns, fcntl, write,
        // setrlimit) and allocates nothing, as code between fork and exec must.
        unsafe {
            command.pre_exec(move || setup.run());
        }
        opened = Some(open);
        command
    } else {
        // No kill_on_drop: a SIGKILLed supervisor would leave the container's processes to
        // init. Closing its standard input (the table's stopper) is how it is stopped.
        let (stdin, stop) = std::io::pipe()?;
        stop_pipe = Some(stop);
        let mut command = tokio::process::Command::new(supervisor()?);
        command
            .arg0("kube-sim-supervisor")
            .arg(program)
            .args(&spec.argv[1..])
            .stdin(stdin);
        let dir = spec
            .workdir
            .as_deref()
            .map(Path::new)
            .filter(|dir| dir.is_dir())
            .unwrap_or(&spec.pod_dir);
        command.current_dir(dir);
        command
    };
    command
        .env_clear()
        .envs(&spec.env)
        .stdout(log)
        .stderr(log_err)
        .process_group(0);
    let child = command.spawn()?;
    // The read end stays with the supervisor only, so that it sees end of file when ours closes.
    drop(command);
    let pgid = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .ok_or_else(|| std::io::Error::other("spawned process has no pid"))?;
    table.insert(
        pgid,
        stop_pipe.map_or(Stopper::KillGroup, Stopper::Supervisor),
    );
    Ok(Running {
        child,
        guard: GroupGuard {
            pgid,
            in_bwrap: bwrap,
            table: table.clone(),
            done: false,
            cgroup: opened.and_then(|open| open.cgroup),
            terminated: std::collections::HashSet::new(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fds() -> BindFds {
        BindFds {
            pod_dir: 10,
            program: None,
            mounts: vec![11],
            etc: vec![20, 21, 22, 23],
            seccomp: Some(30),
        }
    }

    fn text(args: Vec<OsString>) -> String {
        args.into_iter()
            .map(|a| a.into_string().unwrap())
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn bwrap_command_line_shows_only_the_system_directories_and_the_pod_dir() {
        let root = vec![
            RootEntry::Dir("usr".into()),
            RootEntry::Symlink("bin".into(), "usr/bin".into()),
        ];
        let etc = vec!["/etc/ssl/certs".to_owned()];
        let spec = LaunchSpec {
            argv: vec!["/usr/bin/sh".into(), "-c".into(), "true".into()],
            hostname: "pod-a".into(),
            pod_dir: PathBuf::from("/sim/pods/a"),
            identity: Identity {
                uid: 1000,
                gid: 1000,
                user_namespace: true,
                host_id: Some(7),
            },
            ..LaunchSpec::default()
        };
        let text = text(bwrap_args(&root, &etc, &spec, &fds()));
        assert!(
            text.starts_with(
                "--tmpfs / --ro-bind /usr /usr --symlink usr/bin /bin --tmpfs /etc \
                 --ro-bind /etc/ssl/certs /etc/ssl/certs --ro-bind-data 20 /etc/passwd \
                 --ro-bind-data 21 /etc/group --ro-bind-data 22 /etc/hosts \
                 --ro-bind-data 23 /etc/hostname "
            ),
            "{text}"
        );
        assert!(text.contains("--hostname pod-a"));
        assert!(
            text.contains("--unshare-user --uid 1000 --gid 1000 --disable-userns --cap-drop ALL"),
            "{text}"
        );
        assert!(text.contains("--seccomp 30"));
        assert!(text.contains("--bind-fd 10 /app"));
        assert!(
            text.ends_with("--remount-ro /etc --remount-ro / --chdir /app -- /usr/bin/sh -c true"),
            "{text}"
        );
        // A program of the workspace is bound alone, at its own path.
        let outside = LaunchSpec {
            argv: vec!["/work/target/debug/sandbox-runtime".into()],
            ..spec.clone()
        };
        let with_program = BindFds {
            program: Some(12),
            ..fds()
        };
        let text = self::text(bwrap_args(&root, &etc, &outside, &with_program));
        assert!(
            text.contains("--ro-bind-fd 12 /work/target/debug/sandbox-runtime"),
            "{text}"
        );
    }

    #[test]
    fn the_pods_view_excludes_homes_var_and_credentials() {
        for name in [
            "root", "home", "var", "opt", "srv", "run", "mnt", "tmp", "work",
        ] {
            assert!(!SYSTEM_DIRS.contains(&name), "{name}");
        }
        for entry in ETC_ENTRIES {
            for secret in ["shadow", "ssh", "sudoers", "private", "kube", "gshadow"] {
                assert!(!entry.contains(secret), "{entry}");
            }
        }
        assert!(in_system_dirs("/usr/bin/python3"));
        assert!(in_system_dirs("/bin/sh"));
        assert!(!in_system_dirs("/tmp/x/script"));
        assert!(!in_system_dirs("/root/.cargo/bin/x"));
    }

    #[test]
    fn a_mount_point_below_a_host_directory_splits_that_directory() {
        let spec = LaunchSpec {
            argv: vec!["/usr/bin/true".into()],
            pod_dir: PathBuf::from("/sim/pods/a"),
            mounts: vec![Mount {
                host: PathBuf::from("/sim/pods/a/volumes/key"),
                dest: "/usr/local/app/key".into(),
                read_only: true,
            }],
            splits: vec![Split {
                dir: "/usr/local".into(),
                entries: vec![
                    RootEntry::Dir("bin".into()),
                    RootEntry::File("README".into()),
                    RootEntry::Symlink("man".into(), "share/man".into()),
                ],
            }],
            ..LaunchSpec::default()
        };
        let text = text(bwrap_args(
            &[RootEntry::Dir("usr".into())],
            &[],
            &spec,
            &fds(),
        ));
        let expected = "--tmpfs /usr/local --ro-bind /usr/local/bin /usr/local/bin \
             --ro-bind /usr/local/README /usr/local/README \
             --symlink share/man /usr/local/man --dir /usr/local/app/key \
             --ro-bind-fd 11 /usr/local/app/key --remount-ro /usr/local --remount-ro /etc";
        assert!(text.contains(expected), "{text}");
        assert!(text.starts_with("--tmpfs / --ro-bind /usr /usr "), "{text}");
    }

    #[test]
    fn mount_paths_resolve_host_symlinks_and_split_the_deepest_existing_directory() {
        // Below /usr the sandbox shows the host's tree: a mount point is made on a split.
        let (mounts, splits) = prepare_mounts(vec![
            (
                PathBuf::from("/v/a"),
                "/usr/share/agent-sandbox-test/x".into(),
                true,
            ),
            // /bin is the host's symlink to usr/bin on a merged /usr.
            (
                PathBuf::from("/v/b"),
                "/bin/agent-sandbox-test".into(),
                false,
            ),
            (PathBuf::from("/v/c"), "/tmp/x".into(), false),
            // Elsewhere the root is the sandbox's own: no split, whatever the host has there.
            (PathBuf::from("/v/d"), "/var/lib/data".into(), false),
            (PathBuf::from("/v/e"), "/etc/app/key".into(), true),
        ])
        .unwrap();
        let bin = std::fs::canonicalize("/bin").unwrap().display().to_string();
        assert_eq!(
            mounts.iter().map(|m| m.dest.as_str()).collect::<Vec<_>>(),
            [
                "/usr/share/agent-sandbox-test/x",
                format!("{bin}/agent-sandbox-test").as_str(),
                "/tmp/x",
                "/var/lib/data",
                "/etc/app/key"
            ]
        );
        let mut dirs: Vec<&str> = splits.iter().map(|s| s.dir.as_str()).collect();
        dirs.sort_unstable();
        let mut expected = vec![bin.as_str(), "/usr/share"];
        expected.sort_unstable();
        assert_eq!(dirs, expected);
        assert!(prepare_mounts(vec![(PathBuf::from("/v"), "rel".into(), true)]).is_err());
        assert!(prepare_mounts(vec![(PathBuf::from("/v"), "/a/../b".into(), true)]).is_err());
        assert!(
            prepare_mounts(vec![(
                PathBuf::from("/v"),
                "/usr/bin/env/below".into(),
                true
            )])
            .is_err()
        );
    }

    #[test]
    fn isolation_parses() {
        assert_eq!("bwrap".parse::<Isolation>(), Ok(Isolation::Bwrap));
        assert_eq!("strict".parse::<Isolation>(), Ok(Isolation::Strict));
        assert!("docker".parse::<Isolation>().is_err());
    }
}
