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
use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use rustix::process::{Pid, Signal, kill_process, kill_process_group};

/// How pod processes are isolated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Isolation {
    /// Bubblewrap when it is installed and works, otherwise none.
    #[default]
    Auto,
    /// Each pod process in bubblewrap: private pid, mount, ipc and uts namespaces (hostname =
    /// pod name), read-only root, writable pod directory at `/app` and private `/tmp`, host
    /// network (so the loopback pod IP works).
    Bwrap,
    /// Plain child processes in their own process group, in the pod's directory.
    None,
}

impl std::str::FromStr for Isolation {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "auto" => Ok(Self::Auto),
            "bwrap" => Ok(Self::Bwrap),
            "none" => Ok(Self::None),
            other => Err(format!("unknown isolation {other:?} (auto, bwrap or none)")),
        }
    }
}

impl Isolation {
    /// The isolation pods actually get: `Auto` resolved to what works here; `None` when
    /// bubblewrap is asked for where it does not work.
    pub fn resolve(self) -> Option<Self> {
        match self {
            Self::Auto if bwrap_available() => Some(Self::Bwrap),
            Self::Auto | Self::None => Some(Self::None),
            Self::Bwrap if bwrap_available() => Some(Self::Bwrap),
            Self::Bwrap => None,
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
/// be made (`/etc` for a Secret at `/etc/app/key` when the host has no `/etc/app`): bubblewrap
/// puts a tmpfs there showing the same entries, makes the mount point on it, and remounts it
/// read-only.
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
        if OWN_ROOT.contains(&parts[0]) {
            // The sandbox's own writable directories: mount points are made there as asked.
            mounts.push(Mount {
                host,
                dest: format!("/{}", parts.join("/")),
                read_only,
            });
            continue;
        }
        // The deepest part the host has, with its symlinks resolved as the sandbox (which shows
        // the host's tree) resolves them; the rest is made.
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
        let top = base
            .trim_start_matches('/')
            .split('/')
            .next()
            .unwrap_or_default();
        if rest < parts.len()
            && base != "/"
            && !OWN_ROOT.contains(&top)
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

fn host_root() -> &'static [RootEntry] {
    static ROOT: OnceLock<Vec<RootEntry>> = OnceLock::new();
    ROOT.get_or_init(|| {
        host_entries(Path::new("/"))
            .into_iter()
            .filter(|entry| !matches!(entry, RootEntry::File(_)))
            .collect()
    })
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
    /// The pod's directory on the host.
    pub(crate) pod_dir: PathBuf,
    /// Volume mounts; bubblewrap only.
    pub(crate) mounts: Vec<Mount>,
    /// Read-only host directories to rebuild so that mount points can be made below them.
    pub(crate) splits: Vec<Split>,
    /// File that receives stdout and stderr.
    pub(crate) log: PathBuf,
}

/// Top-level names the sandbox provides itself instead of binding from the host.
const OWN_ROOT: [&str; 4] = ["proc", "dev", "tmp", "app"];

/// The bubblewrap command line for `spec` (sans IO).
pub(crate) fn bwrap_args(root: &[RootEntry], spec: &LaunchSpec) -> Vec<OsString> {
    let mut args: Vec<OsString> = Vec::new();
    let mut push = |items: &[&str]| args.extend(items.iter().map(OsString::from));
    push(&["--tmpfs", "/"]);
    for entry in root {
        match entry {
            RootEntry::Dir(name) if !OWN_ROOT.contains(&name.as_str()) => {
                let path = format!("/{name}");
                push(&["--ro-bind", &path, &path]);
            }
            RootEntry::Symlink(name, target) if !OWN_ROOT.contains(&name.as_str()) => {
                push(&["--symlink", target, &format!("/{name}")]);
            }
            _ => {}
        }
    }
    push(&[
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--hostname",
        &spec.hostname,
        "--die-with-parent",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
        "--dir",
        POD_DIR_IN_SANDBOX,
    ]);
    args.push("--bind".into());
    args.push(spec.pod_dir.clone().into_os_string());
    args.push(POD_DIR_IN_SANDBOX.into());
    // The sandbox's /tmp is private; a program that lives under the host's /tmp is bound in.
    if let Some(program) = spec.argv.first().filter(|p| p.starts_with("/tmp/")) {
        args.extend(["--ro-bind", program, program].map(OsString::from));
    }
    for split in &spec.splits {
        args.extend(["--tmpfs", &split.dir].map(OsString::from));
        for entry in &split.entries {
            match entry {
                RootEntry::Dir(name) | RootEntry::File(name) => {
                    let path = format!("{}/{name}", split.dir);
                    args.extend(["--ro-bind", &path, &path].map(OsString::from));
                }
                RootEntry::Symlink(name, target) => {
                    let path = format!("{}/{name}", split.dir);
                    args.extend(["--symlink", target, &path].map(OsString::from));
                }
            }
        }
    }
    for mount in &spec.mounts {
        args.push("--dir".into());
        args.push(mount.dest.clone().into());
        args.push(
            if mount.read_only {
                "--ro-bind"
            } else {
                "--bind"
            }
            .into(),
        );
        args.push(mount.host.clone().into_os_string());
        args.push(mount.dest.clone().into());
    }
    for split in &spec.splits {
        args.extend(["--remount-ro", &split.dir].map(OsString::from));
    }
    let workdir = spec.workdir.as_deref().unwrap_or(POD_DIR_IN_SANDBOX);
    if !workdir.starts_with(POD_DIR_IN_SANDBOX) && !workdir.starts_with("/tmp") {
        args.push("--dir".into());
        args.push(workdir.into());
    }
    args.extend(["--remount-ro", "/", "--chdir", workdir].map(OsString::from));
    args.push("--".into());
    args.extend(spec.argv.iter().map(OsString::from));
    args
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
}

impl ProcessTable {
    fn insert(&self, pgid: i32, stopper: Stopper) {
        self.groups
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(pgid, stopper);
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

    /// Stops every registered group.
    pub(crate) fn kill_all(&self) {
        let groups: Vec<(i32, Stopper)> = self
            .groups
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain()
            .collect();
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
}

impl GroupGuard {
    /// Asks the processes to stop (SIGTERM). Under bubblewrap the monitor process is spared, so
    /// that it outlives its child and reports its exit status; the supervisor ignores it.
    pub(crate) fn terminate(&self) {
        if self.done {
            return;
        }
        if self.in_bwrap {
            for pid in live_members(self.pgid)
                .into_iter()
                .filter(|pid| *pid != self.pgid)
            {
                if let Some(pid) = Pid::from_raw(pid) {
                    let _ = kill_process(pid, Signal::TERM);
                }
            }
        } else {
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

/// Starts `spec` in a new process group, inside bubblewrap when `bwrap` is true, else under the
/// supervisor.
pub(crate) fn spawn(
    spec: &LaunchSpec,
    bwrap: bool,
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
    let mut command = if bwrap {
        let mut command = tokio::process::Command::new("bwrap");
        command
            .args(bwrap_args(host_root(), spec))
            .stdin(Stdio::null())
            .kill_on_drop(true);
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
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bwrap_command_line_builds_a_read_only_root_with_a_writable_pod_dir() {
        let root = vec![
            RootEntry::Dir("usr".into()),
            RootEntry::Symlink("bin".into(), "usr/bin".into()),
            RootEntry::Dir("proc".into()),
            RootEntry::Dir("tmp".into()),
        ];
        let spec = LaunchSpec {
            argv: vec!["/usr/bin/sh".into(), "-c".into(), "true".into()],
            hostname: "pod-a".into(),
            pod_dir: PathBuf::from("/sim/pods/a"),
            ..LaunchSpec::default()
        };
        let args: Vec<String> = bwrap_args(&root, &spec)
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect();
        let text = args.join(" ");
        assert!(
            text.starts_with("--tmpfs / --ro-bind /usr /usr --symlink usr/bin /bin "),
            "{text}"
        );
        assert!(!text.contains("--ro-bind /proc"));
        assert!(text.contains("--hostname pod-a"));
        assert!(text.contains("--bind /sim/pods/a /app"));
        assert!(
            text.ends_with("--remount-ro / --chdir /app -- /usr/bin/sh -c true"),
            "{text}"
        );
    }

    #[test]
    fn a_mount_point_below_a_read_only_host_directory_splits_that_directory() {
        let spec = LaunchSpec {
            argv: vec!["/usr/bin/true".into()],
            pod_dir: PathBuf::from("/sim/pods/a"),
            mounts: vec![Mount {
                host: PathBuf::from("/sim/pods/a/volumes/key"),
                dest: "/etc/app/key".into(),
                read_only: true,
            }],
            splits: vec![Split {
                dir: "/etc".into(),
                entries: vec![
                    RootEntry::File("hosts".into()),
                    RootEntry::Dir("ssl".into()),
                    RootEntry::Symlink("mtab".into(), "../proc/mounts".into()),
                ],
            }],
            ..LaunchSpec::default()
        };
        let text = bwrap_args(&[RootEntry::Dir("etc".into())], &spec)
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect::<Vec<_>>()
            .join(" ");
        let expected = "--tmpfs /etc --ro-bind /etc/hosts /etc/hosts --ro-bind /etc/ssl /etc/ssl \
             --symlink ../proc/mounts /etc/mtab --dir /etc/app/key \
             --ro-bind /sim/pods/a/volumes/key /etc/app/key --remount-ro /etc --remount-ro /";
        assert!(text.contains(expected), "{text}");
        assert!(text.starts_with("--tmpfs / --ro-bind /etc /etc "), "{text}");
    }

    #[test]
    fn mount_paths_resolve_host_symlinks_and_split_the_deepest_existing_directory() {
        // Not under /tmp, which the sandbox makes its own (no split there).
        let scratch = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let real = scratch.path().join("real");
        std::fs::create_dir_all(real.join("present")).unwrap();
        std::fs::write(real.join("file"), "x").unwrap();
        std::os::unix::fs::symlink(&real, scratch.path().join("link")).unwrap();
        let real = std::fs::canonicalize(&real).unwrap();
        let link = std::fs::canonicalize(scratch.path()).unwrap().join("link");
        let dest = |rest: &str| format!("{}/{rest}", link.display());
        let (mounts, splits) = prepare_mounts(vec![
            (PathBuf::from("/v/a"), dest("present"), true),
            (PathBuf::from("/v/b"), dest("new/deeper"), false),
            (PathBuf::from("/v/c"), "/tmp/x".into(), false),
        ])
        .unwrap();
        let real = real.display().to_string();
        assert_eq!(
            mounts.iter().map(|m| m.dest.as_str()).collect::<Vec<_>>(),
            [
                format!("{real}/present").as_str(),
                format!("{real}/new/deeper").as_str(),
                "/tmp/x"
            ]
        );
        assert_eq!(splits.len(), 1, "{splits:?}");
        assert_eq!(splits[0].dir, real);
        assert!(splits[0].entries.contains(&RootEntry::File("file".into())));
        assert!(
            splits[0]
                .entries
                .contains(&RootEntry::Dir("present".into()))
        );
        assert!(prepare_mounts(vec![(PathBuf::from("/v"), "rel".into(), true)]).is_err());
        assert!(prepare_mounts(vec![(PathBuf::from("/v"), "/a/../b".into(), true)]).is_err());
        let file = format!("{real}/file/below");
        assert!(prepare_mounts(vec![(PathBuf::from("/v"), file, true)]).is_err());
    }

    #[test]
    fn isolation_parses() {
        assert_eq!("bwrap".parse::<Isolation>(), Ok(Isolation::Bwrap));
        assert!("docker".parse::<Isolation>().is_err());
    }
}
