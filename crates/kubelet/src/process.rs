//! Pod processes: the host directories a confined pod sees ([`SYSTEM_DIRS`], [`ETC_ENTRIES`],
//! the mount points of its volumes: [`prepare_mounts`]), what a child does between fork and
//! exec ([`ChildSetup`]), and how the kubelet keeps track of the process groups it started so
//! that no process of a pod survives it ([`ProcessTable`], [`GroupGuard`]).
//!
//! Every container runs under the embedded `pod-sandbox` helper (`src/bin/pod-sandbox/`), the
//! leader of the container's process group: confined ([`crate::sandbox`]) or, with
//! `--isolation none`, as a plain child of the helper's `supervise` mode ([`spawn_unconfined`]).
//! The helper kills everything left of the container when its program ends or when the kubelet
//! closes its standard input, and exits only then, with the program's status.
//!
//! Every live group is registered in a [`ProcessTable`], so that stopping the kubelet (or
//! dropping its handle) can kill every pod process even when the tasks that own them are gone.
//! Each group is also killed by its [`GroupGuard`] when dropped.

use std::collections::{BTreeMap, HashMap};
use std::io::PipeWriter;
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use rustix::process::{Pid, Signal, kill_process_group};

use crate::cgroup::{Cgroup, Limits};

/// How pod processes are isolated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Isolation {
    /// Each pod in a sandbox of its own ([`crate::sandbox`]): user, mount, PID, IPC, UTS and
    /// network namespaces, a root showing only the host's system directories read-only, its
    /// storage capped, no capabilities, `no_new_privs`, the seccomp filter and control-group
    /// limits where the machine has them. A kubelet refuses to start where it cannot confine
    /// (user namespaces disabled), naming the fix. Parsed from `auto` too.
    #[default]
    Confined,
    /// [`Isolation::Confined`] with every protection (seccomp, a host uid per pod, control
    /// groups with CPU limits, a network of each pod's own), or refuse to start.
    Strict,
    /// Plain child processes on the host, in the pod's directory: not isolated at all.
    None,
}

impl std::str::FromStr for Isolation {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "auto" | "confined" => Ok(Self::Confined),
            "strict" => Ok(Self::Strict),
            "none" => Ok(Self::None),
            other => Err(format!(
                "unknown isolation {other:?} (confined, strict or none; auto means confined)"
            )),
        }
    }
}

impl std::fmt::Display for Isolation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Confined => "confined",
            Self::Strict => "strict",
            Self::None => "none",
        })
    }
}

/// Where the pod's directory appears inside a confined pod.
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

/// One volume mount of a container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Mount {
    /// The directory on the host.
    pub(crate) host: PathBuf,
    /// Where it appears: an absolute path without symlinks (as the sandbox resolves them).
    pub(crate) dest: String,
    pub(crate) read_only: bool,
}

/// A directory of the host that the sandbox shows read-only and under which a mount point must
/// be made (`/usr/local/app` for a volume there when the host has no `/usr/local/app`): the
/// root gets a tmpfs there showing the same entries, the mount point is made on it, and it is
/// remounted read-only.
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
pub(crate) fn host_root() -> &'static [RootEntry] {
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
pub(crate) fn host_etc() -> &'static [String] {
    static ETC: OnceLock<Vec<String>> = OnceLock::new();
    ETC.get_or_init(|| {
        ETC_ENTRIES
            .iter()
            .filter(|entry| Path::new("/etc").join(entry).exists())
            .map(|entry| format!("/etc/{entry}"))
            .collect()
    })
}

/// Who a pod's processes are inside its user namespace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Identity {
    pub(crate) uid: u32,
    pub(crate) gid: u32,
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
    /// The pod's directory on the host (unconfined pods run there).
    pub(crate) pod_dir: PathBuf,
    /// Volume mounts (confined pods).
    pub(crate) mounts: Vec<Mount>,
    /// Read-only host directories to rebuild so that mount points can be made below them.
    pub(crate) splits: Vec<Split>,
    /// File that receives stdout and stderr.
    pub(crate) log: PathBuf,
    /// Who the processes are (confined pods).
    pub(crate) identity: Identity,
    /// The container's resource limits and its control group's name (confined pods).
    pub(crate) limits: Option<(Limits, String)>,
}

/// Whether `program` lives below one of the [`SYSTEM_DIRS`] (and is therefore visible).
pub(crate) fn in_system_dirs(program: &str) -> bool {
    program
        .strip_prefix('/')
        .and_then(|rest| rest.split('/').next())
        .is_some_and(|top| SYSTEM_DIRS.contains(&top))
}

/// What a child does between fork and exec, with nothing but system calls (no allocation):
/// enter a user and a network namespace (a tool configuring a pod's network), keep the
/// descriptors it is given across exec, join its control group, lower its limits.
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

    /// Makes `command`'s child do this set-up before it runs.
    pub(crate) fn install(self, command: &mut std::process::Command) {
        #[allow(unsafe_code)]
        // SAFETY: `ChildSetup::run` makes only async-signal-safe system calls (setns, fcntl,
        // write, setrlimit) and allocates nothing, as code between fork and exec must.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(command, move || self.run());
        }
    }

    /// [`ChildSetup::install`] for a tokio command.
    pub(crate) fn install_tokio(self, command: &mut tokio::process::Command) {
        #[allow(unsafe_code)]
        // SAFETY: as in `install`.
        unsafe {
            command.pre_exec(move || self.run());
        }
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
    ChildSetup {
        userns,
        netns,
        keep: fds,
        ..ChildSetup::default()
    }
    .install(command);
}

/// How the kubelet stops a group it registered.
#[derive(Debug)]
pub(crate) enum Stopper {
    /// The write end of the helper's standard input: closing it makes the helper kill every
    /// process of the container (or end the pod's sandbox) and exit.
    Supervisor(PipeWriter),
}

impl Stopper {
    fn stop(self, _pgid: i32) {
        match self {
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
    /// Registers group `pgid` (stopped by `stopper`) and returns its guard.
    pub(crate) fn register(
        self: &Arc<Self>,
        pgid: i32,
        stopper: Stopper,
        cgroup: Option<Cgroup>,
    ) -> GroupGuard {
        self.insert(pgid, stopper);
        GroupGuard {
            pgid,
            table: self.clone(),
            done: false,
            cgroup,
            terminated: false,
        }
    }

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
    table: Arc<ProcessTable>,
    done: bool,
    /// The container's control group, removed once its processes are gone (dropped after
    /// [`GroupGuard::kill`]).
    cgroup: Option<Cgroup>,
    terminated: bool,
}

impl GroupGuard {
    /// Asks the processes to stop (SIGTERM to the group, once). The helper ignores it; a
    /// confined container's init, PID 1 of its namespace, gets it only if it handles it, as in
    /// any container.
    pub(crate) fn terminate(&mut self) {
        if self.done || self.terminated {
            return;
        }
        self.terminated = true;
        kill_group(self.pgid, Signal::TERM);
    }

    /// Kills every process of the container and forgets the group (end of input for the
    /// helper, which kills the rest).
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

    /// The group id: the helper's pid.
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

/// Starts `spec` unconfined (`--isolation none`): the program as a child of the helper's
/// `supervise` mode, in a new process group, in the pod's directory on the host.
pub(crate) fn spawn_unconfined(
    spec: &LaunchSpec,
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
    // No kill_on_drop: a SIGKILLed helper would leave the container's processes to init.
    // Closing its standard input (the table's stopper) is how it is stopped.
    let (stdin, stop) = std::io::pipe()?;
    let mut command = tokio::process::Command::new(crate::sandbox::helper()?);
    command
        .arg0("pod-sandbox")
        .arg("supervise")
        .arg(program)
        .args(&spec.argv[1..])
        .stdin(stdin);
    let dir = spec
        .workdir
        .as_deref()
        .map(Path::new)
        .filter(|dir| dir.is_dir())
        .unwrap_or(&spec.pod_dir);
    command
        .current_dir(dir)
        .env_clear()
        .envs(&spec.env)
        .stdout(log)
        .stderr(log_err)
        .process_group(0);
    let child = command.spawn()?;
    // The read end stays with the helper only, so that it sees end of file when ours closes.
    drop(command);
    let pgid = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .ok_or_else(|| std::io::Error::other("spawned process has no pid"))?;
    let guard = table.register(pgid, Stopper::Supervisor(stop), None);
    Ok(Running { child, guard })
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!("auto".parse::<Isolation>(), Ok(Isolation::Confined));
        assert_eq!("confined".parse::<Isolation>(), Ok(Isolation::Confined));
        assert_eq!("strict".parse::<Isolation>(), Ok(Isolation::Strict));
        assert_eq!("none".parse::<Isolation>(), Ok(Isolation::None));
        let error = "bwrap".parse::<Isolation>().unwrap_err();
        assert!(error.contains("confined, strict or none"), "{error}");
    }
}
