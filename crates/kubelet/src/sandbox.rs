//! Pods confined by the kubelet itself, with nothing installed: the embedded `pod-sandbox`
//! helper (`src/bin/pod-sandbox/`, compiled by `build.rs`) does what a container runtime does,
//! in namespaces the kernel gives any user.
//!
//! A pod's sandbox ([`PodSandbox`], the helper's `pod` mode) is a process that holds the pod's
//! user namespace (the pod's user mapped to one host uid: the kubelet's, or as root one of the
//! pod's own), its mount, IPC and UTS namespaces, and its writable storage: a tmpfs the size of
//! the pod's ephemeral-storage limit where `/app`, each container's `/tmp` and the `emptyDir`
//! volumes live, so a pod can fill neither the host's disk nor leave anything on it. Each
//! container ([`spawn_container`], the helper's `container` mode) joins those namespaces and the
//! pod's network namespace, and runs as PID 1 of a PID namespace of its own in a root built
//! from read-only binds of the host's system directories ([`container_spec`], sans IO), with no
//! capability, `no_new_privs` and the seccomp filter. An exec probe runs through [`enter`].
//!
//! Why our own code rather than a crate or bubblewrap: the confinement must exist wherever the
//! kubelet library is linked, with no program installed, in a multi-threaded process that cannot
//! make namespaces itself; the well-kept Rust sandboxing crates fork the calling process or need
//! libseccomp. The helper is a few hundred lines of `std` and system calls.

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::os::fd::{AsRawFd as _, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::confine;
use crate::pod_net::PodNet;
use crate::process::{
    ChildSetup, ETC_OWN, GroupGuard, LaunchSpec, POD_DIR_IN_SANDBOX, ProcessTable, RootEntry,
    Running, Stopper,
};

/// The helper's spec format, shared with it (the kubelet writes specs, the helper reads them).
#[allow(dead_code, unreachable_pub)]
#[path = "bin/pod-sandbox/spec.rs"]
pub(crate) mod spec;

use spec::{Namespace, Op};

/// The executable of `src/bin/pod-sandbox/`, compiled by `build.rs`.
static HELPER: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/pod-sandbox"));

/// The size of a container's root tmpfs (mount points and its `/etc` files only).
const ROOT_SIZE: u64 = 4 << 20;
/// How long a pod's sandbox gets to say it is ready.
const READY_WITHIN: Duration = Duration::from_secs(20);

/// A path that executes the embedded helper: a sealed memfd, made once per process. A memfd
/// rather than a file: it needs no writable, executable directory (`/tmp` may be `noexec`) and
/// leaves nothing behind.
pub(crate) fn helper() -> std::io::Result<&'static str> {
    static MADE: OnceLock<Result<(std::fs::File, String), String>> = OnceLock::new();
    let made = MADE.get_or_init(|| {
        let file = memfd_helper().map_err(|error| {
            format!("failed to make the pod-sandbox helper executable (a sealed memfd): {error}")
        })?;
        let path = format!("/proc/self/fd/{}", file.as_raw_fd());
        Ok((file, path))
    });
    match made {
        Ok((_, path)) => Ok(path),
        Err(message) => Err(std::io::Error::other(message.clone())),
    }
}

fn memfd_helper() -> std::io::Result<std::fs::File> {
    use rustix::fs::{MemfdFlags, SealFlags};
    let flags = MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING;
    // MFD_EXEC (Linux 6.3) keeps `vm.memfd_noexec=1` from sealing it non-executable; older
    // kernels refuse the flag, and their memfds are executable anyway.
    let fd = rustix::fs::memfd_create("pod-sandbox", flags | MemfdFlags::EXEC)
        .or_else(|_| rustix::fs::memfd_create("pod-sandbox", flags))?;
    let mut file = std::fs::File::from(fd);
    file.write_all(HELPER)?;
    rustix::fs::fcntl_add_seals(
        &file,
        SealFlags::SEAL | SealFlags::SHRINK | SealFlags::GROW | SealFlags::WRITE,
    )?;
    Ok(file)
}

/// What a pod's sandbox is made with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PodPlan {
    /// The pod's user and group inside its user namespace.
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    pub(crate) hostname: String,
    /// The host directory the pod's storage is mounted on (in the pod's mount namespace only).
    pub(crate) storage: PathBuf,
    pub(crate) storage_size: u64,
    /// Directories of the storage and their modes.
    pub(crate) dirs: Vec<(String, u32)>,
    /// A root kubelet's host uid (and gid) for the pod.
    pub(crate) host_id: Option<u32>,
    /// Supplementary host groups (a root kubelet's shared-volume group of the namespace).
    pub(crate) groups: Vec<u32>,
}

/// The storage directories of a pod whose containers are `containers` and whose `emptyDir`
/// volumes are `volumes`: `app`, `tmp/<container>` and `volumes/<volume>`.
pub(crate) fn storage_dirs(containers: &[String], volumes: &[String]) -> Vec<(String, u32)> {
    let mut dirs = vec![("app".to_owned(), 0o755), ("tmp".to_owned(), 0o755)];
    dirs.extend(
        containers
            .iter()
            .map(|name| (format!("tmp/{name}"), 0o1777)),
    );
    dirs.extend(
        volumes
            .iter()
            .map(|name| (format!("volumes/{name}"), 0o777)),
    );
    dirs
}

/// A running pod sandbox: the helper holding the pod's namespaces, and descriptors of them.
#[derive(Debug)]
pub(crate) struct PodSandbox {
    child: std::process::Child,
    guard: GroupGuard,
    user: OwnedFd,
    mount: OwnedFd,
    ipc: OwnedFd,
    uts: OwnedFd,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    groups: Vec<u32>,
    /// The pod's network (`None`: the node's).
    net: Option<Arc<PodNet>>,
    pub(crate) storage: PathBuf,
}

/// A descriptor holding `text` for a child to read (a sealed memfd, close-on-exec until
/// [`ChildSetup`] keeps it).
fn spec_fd(text: &str) -> std::io::Result<OwnedFd> {
    confine::data_fd("pod-sandbox-spec", text.as_bytes())
}

/// The namespaces a process of the pod joins first: the node's user namespace (when the pod's
/// network is below it) and the pod's network namespace.
fn network_join(net: Option<&PodNet>) -> Vec<(Namespace, RawFd)> {
    let mut join = Vec::new();
    if let Some(net) = net {
        if let Some(user) = net.user_fd() {
            join.push((Namespace::User, user));
        }
        join.push((Namespace::Net, net.fd()));
    }
    join
}

impl PodSandbox {
    /// Starts the pod's sandbox and waits until it is ready (blocking: call it off the async
    /// runtime); the error carries what the helper said.
    pub(crate) fn start(
        plan: &PodPlan,
        net: Option<Arc<PodNet>>,
        table: &Arc<ProcessTable>,
    ) -> Result<Self, String> {
        let mut join = Vec::new();
        if let Some(user) = net.as_ref().and_then(|net| net.user_fd()) {
            // The pod's user namespace below the node's, where the pod's network is.
            join.push((Namespace::User, user));
        }
        let spec = spec::Pod {
            join: join.clone(),
            host_ids: plan.host_id.map(|id| (id, id)),
            groups: plan.groups.clone(),
            uid: plan.uid,
            gid: plan.gid,
            hostname: plan.hostname.clone(),
            storage: plan.storage.to_string_lossy().into_owned(),
            storage_size: plan.storage_size,
            dirs: plan.dirs.clone(),
        };
        let spec_fd = spec_fd(&spec.encode())
            .map_err(|error| format!("writing the pod sandbox's spec: {error}"))?;
        let (stdin, stop) = std::io::pipe().map_err(|error| format!("a pipe: {error}"))?;
        let mut command = std::process::Command::new(helper().map_err(|error| error.to_string())?);
        command
            .arg0("pod-sandbox")
            .args(["pod", &spec_fd.as_raw_fd().to_string()])
            .env_clear()
            .stdin(stdin)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let mut keep = vec![spec_fd.as_raw_fd()];
        keep.extend(join.iter().map(|(_, fd)| *fd));
        ChildSetup {
            keep,
            ..ChildSetup::default()
        }
        .install(&mut command);
        let mut child = command
            .spawn()
            .map_err(|error| format!("starting the pod sandbox: {error}"))?;
        drop(command);
        drop(spec_fd);
        let pid = i32::try_from(child.id()).map_err(|_| "a pid out of range".to_owned())?;
        let guard = table.register(pid, Stopper::Supervisor(stop), None);
        let ready = wait_ready(&mut child);
        if let Err(said) = ready {
            drop(guard);
            let _ = child.wait();
            return Err(said);
        }
        let open = |kind: &str| {
            std::fs::File::open(format!("/proc/{pid}/ns/{kind}"))
                .map(OwnedFd::from)
                .map_err(|error| format!("opening the pod's {kind} namespace: {error}"))
        };
        Ok(Self {
            user: open("user")?,
            mount: open("mnt")?,
            ipc: open("ipc")?,
            uts: open("uts")?,
            child,
            guard,
            uid: plan.uid,
            gid: plan.gid,
            groups: plan.groups.clone(),
            net,
            storage: plan.storage.clone(),
        })
    }

    /// The namespaces a container joins, in order.
    fn join(&self) -> Vec<(Namespace, RawFd)> {
        let mut join = network_join(self.net.as_deref());
        join.extend([
            (Namespace::User, self.user.as_raw_fd()),
            (Namespace::Mount, self.mount.as_raw_fd()),
            (Namespace::Ipc, self.ipc.as_raw_fd()),
            (Namespace::Uts, self.uts.as_raw_fd()),
        ]);
        join
    }
}

impl Drop for PodSandbox {
    fn drop(&mut self) {
        // End of input ends it; it exits at once.
        self.guard.kill();
        for _ in 0..200 {
            if matches!(self.child.try_wait(), Ok(Some(_)) | Err(_)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits for the helper's `ready` line; else what it said on standard error.
fn wait_ready(child: &mut std::process::Child) -> Result<(), String> {
    let (Some(mut stdout), Some(mut stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return Err("the pod sandbox has no output".to_owned());
    };
    let (said_tx, said_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = [0u8; 6];
        let ready = stdout.read_exact(&mut line).is_ok() && &line == b"ready\n";
        let _ = said_tx.send(ready);
    });
    let ready = said_rx.recv_timeout(READY_WITHIN).unwrap_or(false);
    if ready {
        return Ok(());
    }
    let _ = child.kill();
    let mut said = String::new();
    let _ = stderr.read_to_string(&mut said);
    let said = said.trim().trim_start_matches("pod-sandbox: ").to_owned();
    Err(if said.is_empty() {
        "the pod sandbox did not start (it said nothing)".to_owned()
    } else {
        said
    })
}

/// The seccomp program pods get, when the filter works here.
fn seccomp_program(on: bool) -> Option<Vec<u8>> {
    on.then(crate::seccomp::program)
}

/// The container spec for `spec` in `sandbox` (sans IO): `root` is the host's system
/// directories and `etc` the host's `/etc` entries shown; `tmp` the container's `/tmp` in the
/// pod's storage.
pub(crate) fn container_spec(
    root: &[RootEntry],
    etc: &[String],
    spec: &LaunchSpec,
    storage: &Path,
    tmp: &str,
) -> Vec<Op> {
    let mut ops = vec![Op::Tmpfs {
        dest: "/".to_owned(),
        size: ROOT_SIZE,
        mode: 0o755,
    }];
    let bind_ro = |src: &str, dest: &str| Op::Bind {
        src: src.to_owned(),
        dest: dest.to_owned(),
        read_only: true,
        follow: true,
    };
    for entry in root {
        match entry {
            RootEntry::Dir(name) => {
                let path = format!("/{name}");
                ops.push(bind_ro(&path, &path));
            }
            RootEntry::Symlink(name, target) => ops.push(Op::Symlink {
                target: target.clone(),
                dest: format!("/{name}"),
            }),
            RootEntry::File(_) => {}
        }
    }
    ops.push(Op::Dir {
        dest: "/etc".to_owned(),
        mode: 0o755,
    });
    for path in etc {
        ops.push(bind_ro(path, path));
    }
    let identity = spec.identity;
    for (name, data) in ETC_OWN.iter().zip([
        confine::passwd(identity.uid, identity.gid, POD_DIR_IN_SANDBOX),
        confine::group(identity.gid),
        confine::hosts(&spec.hostname, spec.pod_ip.as_deref()),
        format!("{}\n", spec.hostname),
    ]) {
        ops.push(Op::File {
            dest: format!("/etc/{name}"),
            mode: 0o644,
            data,
        });
    }
    ops.push(Op::Proc {
        dest: "/proc".to_owned(),
    });
    ops.push(Op::Dev {
        dest: "/dev".to_owned(),
    });
    let storage_path = |relative: &str| storage.join(relative).to_string_lossy().into_owned();
    for (src, dest) in [
        (storage_path(tmp), "/tmp"),
        (storage_path("app"), POD_DIR_IN_SANDBOX),
    ] {
        ops.push(Op::Bind {
            src,
            dest: dest.to_owned(),
            read_only: false,
            follow: false,
        });
    }
    // A program outside the system directories (a binary of this workspace, a test's script)
    // is bound in at its own path, alone.
    if let Some(program) = spec
        .argv
        .first()
        .filter(|p| !crate::process::in_system_dirs(p))
    {
        ops.push(bind_ro(program, program));
    }
    for split in &spec.splits {
        ops.push(Op::Tmpfs {
            dest: split.dir.clone(),
            size: ROOT_SIZE,
            mode: 0o755,
        });
        for entry in &split.entries {
            match entry {
                RootEntry::Dir(name) | RootEntry::File(name) => {
                    let path = format!("{}/{name}", split.dir);
                    ops.push(bind_ro(&path, &path));
                }
                RootEntry::Symlink(name, target) => ops.push(Op::Symlink {
                    target: target.clone(),
                    dest: format!("{}/{name}", split.dir),
                }),
            }
        }
    }
    for mount in &spec.mounts {
        ops.push(Op::Bind {
            src: mount.host.to_string_lossy().into_owned(),
            dest: mount.dest.clone(),
            read_only: mount.read_only,
            follow: false,
        });
    }
    for split in &spec.splits {
        ops.push(Op::RemountRo {
            dest: split.dir.clone(),
        });
    }
    let workdir = spec.workdir.as_deref().unwrap_or(POD_DIR_IN_SANDBOX);
    ops.push(Op::Dir {
        dest: workdir.to_owned(),
        mode: 0o755,
    });
    ops.push(Op::RemountRo {
        dest: "/".to_owned(),
    });
    ops
}

/// Starts `spec` as a container of `sandbox` (its `/tmp` the storage's `tmp/<container>`), in
/// a new process group with its log as standard output and error.
pub(crate) fn spawn_container(
    spec: &LaunchSpec,
    container: &str,
    sandbox: &PodSandbox,
    protections: &confine::Protections,
    table: &Arc<ProcessTable>,
) -> std::io::Result<Running> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&spec.log)?;
    let log_err = log.try_clone()?;
    if (spec.identity.uid, spec.identity.gid) != (sandbox.uid, sandbox.gid) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "this node runs every container of a pod as one user: the pod runs as {}:{}, \
                 this container asks for {}:{} (set runAsUser and runAsGroup on the pod instead)",
                sandbox.uid, sandbox.gid, spec.identity.uid, spec.identity.gid
            ),
        ));
    }
    let ops = container_spec(
        crate::process::host_root(),
        crate::process::host_etc(),
        spec,
        &sandbox.storage,
        &format!("tmp/{container}"),
    );
    let join = sandbox.join();
    let text = spec::Container {
        join: join.clone(),
        groups: sandbox.groups.clone(),
        uid: sandbox.uid,
        gid: sandbox.gid,
        ops,
        workdir: spec
            .workdir
            .clone()
            .unwrap_or_else(|| POD_DIR_IN_SANDBOX.to_owned()),
        seccomp: seccomp_program(protections.seccomp),
        check_only: false,
        argv: spec.argv.clone(),
    }
    .encode();
    let spec_fd = spec_fd(&text)?;
    let cgroup = match (&spec.limits, crate::cgroup::Hierarchy::detect()) {
        (Some((limits, name)), Some(hierarchy)) => Some(
            crate::cgroup::Cgroup::create(hierarchy, name, limits)
                .map_err(std::io::Error::other)?,
        ),
        _ => None,
    };
    let (stdin, stop) = std::io::pipe()?;
    let mut command = tokio::process::Command::new(helper()?);
    command
        .arg0("pod-sandbox")
        .args(["container", &spec_fd.as_raw_fd().to_string()])
        .env_clear()
        .envs(&spec.env)
        .stdin(stdin)
        .stdout(log)
        .stderr(log_err)
        .process_group(0);
    let mut keep = vec![spec_fd.as_raw_fd()];
    keep.extend(join.iter().map(|(_, fd)| *fd));
    ChildSetup {
        keep,
        join: cgroup
            .as_ref()
            .map(crate::cgroup::Cgroup::join_fds)
            .unwrap_or_default(),
        nproc: (cgroup.is_none() && !sandbox.groups.is_empty())
            .then(|| spec.limits.as_ref().map(|(limits, _)| limits.pids))
            .flatten(),
        ..ChildSetup::default()
    }
    .install_tokio(&mut command);
    let child = command.spawn()?;
    // The read end stays with the helper only, so that it sees end of file when ours closes.
    drop(command);
    drop(spec_fd);
    let pgid = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .ok_or_else(|| std::io::Error::other("spawned process has no pid"))?;
    let guard = table.register(pgid, Stopper::Supervisor(stop), cgroup);
    Ok(Running { child, guard })
}

/// The pid (as the kubelet sees it) of the container init that helper `supervisor` started.
fn container_init(supervisor: i32) -> std::io::Result<i32> {
    let children =
        std::fs::read_to_string(format!("/proc/{supervisor}/task/{supervisor}/children"))?;
    children
        .split_ascii_whitespace()
        .find_map(|pid| pid.parse().ok())
        .ok_or_else(|| std::io::Error::other("the container has no init (yet)"))
}

/// A command that runs `argv` (with `env`) inside the running container whose helper is
/// `supervisor`, as its user, in `workdir`, with its restrictions: what an exec probe runs.
pub(crate) fn enter(
    sandbox: &PodSandbox,
    supervisor: i32,
    argv: &[String],
    env: &BTreeMap<String, String>,
    workdir: &str,
    protections: &confine::Protections,
) -> std::io::Result<(tokio::process::Command, Vec<OwnedFd>)> {
    let init = container_init(supervisor)?;
    let open =
        |kind: &str| std::fs::File::open(format!("/proc/{init}/ns/{kind}")).map(OwnedFd::from);
    let mount = open("mnt")?;
    let pid = open("pid")?;
    let mut join = network_join(sandbox.net.as_deref());
    join.extend([
        (Namespace::User, sandbox.user.as_raw_fd()),
        (Namespace::Mount, mount.as_raw_fd()),
        (Namespace::Ipc, sandbox.ipc.as_raw_fd()),
        (Namespace::Uts, sandbox.uts.as_raw_fd()),
        (Namespace::Pid, pid.as_raw_fd()),
    ]);
    let text = spec::Enter {
        join: join.clone(),
        groups: sandbox.groups.clone(),
        uid: sandbox.uid,
        gid: sandbox.gid,
        workdir: workdir.to_owned(),
        seccomp: seccomp_program(protections.seccomp),
        argv: argv.to_vec(),
    }
    .encode();
    let spec_fd = spec_fd(&text)?;
    let mut command = tokio::process::Command::new(helper()?);
    command
        .arg0("pod-sandbox")
        .args(["enter", &spec_fd.as_raw_fd().to_string()])
        .env_clear()
        .envs(env)
        .process_group(0);
    let mut keep = vec![spec_fd.as_raw_fd()];
    keep.extend(join.iter().map(|(_, fd)| *fd));
    ChildSetup {
        keep,
        ..ChildSetup::default()
    }
    .install_tokio(&mut command);
    // The descriptors must stay open until the command has started.
    Ok((command, vec![spec_fd, mount, pid]))
}

/// Checks that pods can be confined here, the way pods are (a pod sandbox in `dir` and a
/// container that builds its root, with the seccomp filter when `seccomp`), and says why not.
pub(crate) fn check(dir: &Path, seccomp: bool) -> Result<(), String> {
    let storage = dir.join("storage");
    std::fs::create_dir_all(&storage)
        .map_err(|error| format!("making {}: {error}", storage.display()))?;
    let table = Arc::new(ProcessTable::default());
    let plan = PodPlan {
        uid: confine::DEFAULT_RUN_AS,
        gid: confine::DEFAULT_RUN_AS,
        hostname: "check".to_owned(),
        storage: storage.clone(),
        storage_size: 1 << 20,
        dirs: storage_dirs(&["check".to_owned()], &[]),
        host_id: confine::is_root().then(|| confine::HostId::allocate().0),
        groups: Vec::new(),
    };
    let net = if confine::is_root() {
        None
    } else {
        // Below the node's namespaces, as every pod of a kubelet that is not root.
        let node = crate::node_ns::NodeNamespace::shared()?;
        Some(Arc::new(PodNet::isolated(Some(node))?))
    };
    let sandbox = PodSandbox::start(&plan, net, &table)?;
    let spec = LaunchSpec {
        argv: vec!["/bin/true".to_owned()],
        hostname: "check".to_owned(),
        identity: crate::process::Identity {
            uid: plan.uid,
            gid: plan.gid,
        },
        ..LaunchSpec::default()
    };
    let ops = container_spec(
        crate::process::host_root(),
        crate::process::host_etc(),
        &spec,
        &storage,
        "tmp/check",
    );
    let join = sandbox.join();
    let text = spec::Container {
        join: join.clone(),
        groups: sandbox.groups.clone(),
        uid: plan.uid,
        gid: plan.gid,
        ops,
        workdir: "/".to_owned(),
        seccomp: seccomp_program(seccomp),
        check_only: true,
        argv: Vec::new(),
    }
    .encode();
    let spec_fd = spec_fd(&text).map_err(|error| error.to_string())?;
    let mut command = std::process::Command::new(helper().map_err(|error| error.to_string())?);
    command
        .arg0("pod-sandbox")
        .args(["container", &spec_fd.as_raw_fd().to_string()])
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    let mut keep = vec![spec_fd.as_raw_fd()];
    keep.extend(join.iter().map(|(_, fd)| *fd));
    ChildSetup {
        keep,
        ..ChildSetup::default()
    }
    .install(&mut command);
    let output = command
        .output()
        .map_err(|error| format!("running the pod-sandbox helper: {error}"))?;
    drop(sandbox);
    let _ = std::fs::remove_dir_all(dir);
    if output.status.success() {
        Ok(())
    } else {
        let said = String::from_utf8_lossy(&output.stderr);
        Err(said.trim().trim_start_matches("pod-sandbox: ").to_owned())
    }
}

use std::os::unix::process::CommandExt as _;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::{Identity, Mount, Split};

    fn spec() -> LaunchSpec {
        LaunchSpec {
            argv: vec!["/work/target/debug/sandboxctl".into(), "runtime".into()],
            hostname: "pod-a".into(),
            pod_ip: Some("10.0.0.7".into()),
            identity: Identity {
                uid: 1000,
                gid: 1000,
            },
            mounts: vec![Mount {
                host: "/data/volumes/default/claim".into(),
                dest: "/data".into(),
                read_only: false,
            }],
            splits: vec![Split {
                dir: "/usr/local".into(),
                entries: vec![RootEntry::Dir("bin".into())],
            }],
            ..LaunchSpec::default()
        }
    }

    #[test]
    fn the_root_shows_only_system_directories_read_only_and_the_pods_storage() {
        let root = [
            RootEntry::Dir("usr".into()),
            RootEntry::Symlink("bin".into(), "usr/bin".into()),
        ];
        let ops = container_spec(
            &root,
            &["/etc/ssl/certs".into()],
            &spec(),
            Path::new("/pods/a/storage"),
            "tmp/main",
        );
        let binds: Vec<(&str, &str, bool, bool)> = ops
            .iter()
            .filter_map(|op| match op {
                Op::Bind {
                    src,
                    dest,
                    read_only,
                    follow,
                } => Some((src.as_str(), dest.as_str(), *read_only, *follow)),
                _ => None,
            })
            .collect();
        assert_eq!(
            binds,
            [
                ("/usr", "/usr", true, true),
                ("/etc/ssl/certs", "/etc/ssl/certs", true, true),
                ("/pods/a/storage/tmp/main", "/tmp", false, false),
                ("/pods/a/storage/app", "/app", false, false),
                (
                    "/work/target/debug/sandboxctl",
                    "/work/target/debug/sandboxctl",
                    true,
                    true
                ),
                ("/usr/local/bin", "/usr/local/bin", true, true),
                ("/data/volumes/default/claim", "/data", false, false),
            ]
        );
        assert_eq!(
            ops.first(),
            Some(&Op::Tmpfs {
                dest: "/".into(),
                size: ROOT_SIZE,
                mode: 0o755
            })
        );
        assert_eq!(ops.last(), Some(&Op::RemountRo { dest: "/".into() }));
        assert!(ops.contains(&Op::Proc {
            dest: "/proc".into()
        }));
        assert!(ops.contains(&Op::RemountRo {
            dest: "/usr/local".into()
        }));
        let hosts = ops.iter().find_map(|op| match op {
            Op::File { dest, data, .. } if dest == "/etc/hosts" => Some(data.as_str()),
            _ => None,
        });
        assert!(
            hosts.is_some_and(|h| h.ends_with("10.0.0.7\tpod-a\n")),
            "{hosts:?}"
        );
        // Nothing else of the host: no home, no checkout, no /var.
        assert!(!binds.iter().any(|(src, ..)| src.starts_with("/home")
            || src.starts_with("/root")
            || src.starts_with("/var")
            || *src == "/work"));
    }

    #[test]
    fn storage_holds_app_each_containers_tmp_and_the_empty_dirs() {
        assert_eq!(
            storage_dirs(&["main".into(), "side".into()], &["cache".into()]),
            [
                ("app".to_owned(), 0o755),
                ("tmp".to_owned(), 0o755),
                ("tmp/main".to_owned(), 0o1777),
                ("tmp/side".to_owned(), 0o1777),
                ("volumes/cache".to_owned(), 0o777),
            ]
        );
    }
}
