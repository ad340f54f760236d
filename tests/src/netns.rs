//! A network namespace of the run's own for the control-plane tier, so that its pods can have
//! pod IPs that a real API server accepts in EndpointSlices (it refuses loopback addresses):
//! the process runs itself again under `unshare --net`, where loopback is brought up and
//! [`POD_NETWORK`] is routed locally (`ip route add local … dev lo`). The API server, etcd, our
//! kubelet, every pod and every client the suite starts then share that namespace, and nothing
//! of the host's network is touched or reachable.
//!
//! A real node ([`Layout::Node`], root only) gets more: its CNI bridge routes the pod range (a
//! local route would swallow every pod IP before the bridge saw it), and containerd and the
//! kubelet mount things and write below `/run`, `/var/lib` (the CNI cache) and `/var/log`
//! (container log links). So the run also gets a private mount namespace, with a fresh `/run`
//! and `/var/log` and `/var/lib` overlaid by a layer in that `/run`, and a PID namespace of
//! its own: when the run ends, however it ends, the kernel kills every process in it
//! (containerd's shims and the containers too), which ends the namespaces, their mounts,
//! bridges and nftables rules with them. Only the node's cgroups live outside; the waiting
//! parent removes them ([`NODE_CGROUP_ENV`]).

use std::net::Ipv4Addr;
use std::process::Command;

/// The pods' range inside the namespace (a kind cluster's default pod subnet).
pub const POD_NETWORK: (Ipv4Addr, u8) = (Ipv4Addr::new(10, 244, 0, 0), 16);

/// Set in the child: the namespace is in place.
const INSIDE: &str = "AGENT_SANDBOX_E2E_OWN_NETWORK";

/// Set in the child: the PID of the process that made the namespaces (in the host's PID
/// namespace), whose child `unshare` holds them.
const LAUNCHER: &str = "AGENT_SANDBOX_E2E_LAUNCHER_PID";

/// A command prefix that enters this run's network namespace from the host's shell.
pub fn enter_command() -> String {
    match std::env::var(LAUNCHER) {
        // `unshare --pid --fork` leaves this process with another PID than the host sees:
        // the launcher's child (`unshare`) holds the same namespaces.
        Ok(launcher) => format!("nsenter --net --target \"$(pgrep -P {launcher})\" "),
        Err(_) => format!("nsenter --net=/proc/{}/ns/net ", std::process::id()),
    }
}

/// Whether this process runs in the namespace [`run_inside`] made.
pub fn inside() -> bool {
    std::env::var_os(INSIDE).is_some()
}

/// What the namespace holds besides its own loopback.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// [`POD_NETWORK`] routed to `lo` (the control-plane tier with our kubelet).
    LocalPodRange,
    /// A real node's: no route for the pod range (its CNI bridge routes it), private mounts
    /// with a fresh `/run` and `/var/log` and an overlaid `/var/lib`, a PID namespace whose
    /// end kills every process of the run. Root only.
    Node,
}

/// Set for a [`Layout::Node`] run: the cgroup (below each hierarchy's root) that holds the
/// node's pods, which the parent removes once the run has ended.
pub const NODE_CGROUP_ENV: &str = "AGENT_SANDBOX_E2E_NODE_CGROUP";

/// Runs this executable again, with the same arguments (and `env` added), in a network
/// namespace of its own and returns its exit code; or `Ok(None)` when this process already
/// runs inside one (go on). Call it before starting any thread. Root makes the namespace
/// directly; anyone else gets a user namespace (mapped to root) around it.
pub fn run_inside(env: &[(&str, String)]) -> Result<Option<i32>, String> {
    run_inside_as(Layout::LocalPodRange, env)
}

/// [`run_inside`] with the namespace laid out as `layout` says.
pub fn run_inside_as(layout: Layout, env: &[(&str, String)]) -> Result<Option<i32>, String> {
    if inside() {
        return Ok(None);
    }
    let (network, prefix) = POD_NETWORK;
    if layout == Layout::Node && !is_root() {
        return Err(
            "a real node runs containers as root: its namespaces need root (run as root)"
                .to_owned(),
        );
    }
    if !setup_works(layout) {
        return Err(format!(
            "the {} needs a network namespace of its own{}, and this machine cannot make one: \
             it needs `unshare --net` (util-linux; as root, or with user namespaces enabled) and \
             `ip` (iproute2: apt-get install iproute2)",
            match layout {
                Layout::LocalPodRange => "control-plane tier",
                Layout::Node => "node tier",
            },
            match layout {
                Layout::LocalPodRange => format!(" with {network}/{prefix} routed locally"),
                Layout::Node => " with private mounts and processes".to_owned(),
            }
        ));
    }
    let exe = std::env::current_exe()
        .map_err(|error| format!("cannot locate this executable: {error}"))?;
    let setup = format!("{} && exec \"$0\" \"$@\"", setup_script(layout));
    let mut command = Command::new("unshare");
    if !is_root() {
        command.args(["--user", "--map-root-user"]);
    }
    command
        .args(unshare_args(layout))
        .args(["--", "sh", "-c", &setup])
        .arg(&exe)
        .args(std::env::args_os().skip(1))
        .envs(env.iter().map(|(name, value)| (name, value)))
        .env(INSIDE, "1")
        .env(LAUNCHER, std::process::id().to_string());
    let cgroup =
        (layout == Layout::Node).then(|| format!("agent-sandbox-e2e-node-{}", std::process::id()));
    if let Some(cgroup) = &cgroup {
        command.env(NODE_CGROUP_ENV, cgroup);
    }
    let mut child = command.spawn().map_err(|error| {
        format!(
            "cannot run `unshare` (util-linux) to give the run a network namespace of its own: \
             {error}"
        )
    })?;
    // Ctrl-C reaches the child too (same process group), which tears the cluster down and
    // exits 130; this process only waits for that.
    let status = child
        .wait()
        .map_err(|error| format!("waiting for the run in its own network namespace: {error}"))?;
    if let Some(cgroup) = cgroup {
        remove_cgroups(&cgroup);
    }
    Ok(Some(status.code().unwrap_or(1)))
}

fn unshare_args(layout: Layout) -> &'static [&'static str] {
    match layout {
        Layout::LocalPodRange => &["--net"],
        Layout::Node => &[
            "--net",
            "--mount",
            "--propagation",
            "private",
            "--pid",
            "--fork",
            "--mount-proc",
        ],
    }
}

/// The shell commands that set the namespace up.
fn setup_script(layout: Layout) -> String {
    let (network, prefix) = POD_NETWORK;
    match layout {
        Layout::LocalPodRange => {
            format!("ip link set lo up && ip route add local {network}/{prefix} dev lo")
        }
        Layout::Node => "ip link set lo up \
             && mount -t tmpfs -o mode=0755 tmpfs /run \
             && mount -t tmpfs -o mode=0755 tmpfs /var/log \
             && mkdir -p /run/.var-lib/upper /run/.var-lib/work \
             && mount -t overlay overlay \
                -o lowerdir=/var/lib,upperdir=/run/.var-lib/upper,workdir=/run/.var-lib/work /var/lib"
            .to_owned(),
    }
}

/// Removes `cgroup` from every cgroup hierarchy, innermost first. Its processes were in the
/// ended PID namespace; the kernel may take a moment to free them, so each removal is retried
/// for up to five seconds.
pub fn remove_cgroups(cgroup: &str) {
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
        return;
    };
    for hierarchy in hierarchies.flatten() {
        let top = hierarchy.path().join(cgroup);
        if !top.is_dir() {
            continue;
        }
        let mut dirs = Vec::new();
        collect_dirs(&top, &mut dirs);
        // Children were pushed after their parents.
        for dir in dirs.iter().rev() {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while std::fs::remove_dir(dir).is_err()
                && dir.exists()
                && std::time::Instant::now() < deadline
            {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        }
    }
}

fn collect_dirs(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    out.push(dir.to_path_buf());
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                collect_dirs(&entry.path(), out);
            }
        }
    }
}

fn is_root() -> bool {
    // The effective uid, without unsafe code: /proc/self/status's `Uid:` line (real,
    // effective, saved, filesystem).
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1).map(|id| id == "0"))
        })
        .unwrap_or(false)
}

/// Whether the namespace setup works here (a quick `unshare` run that does only the setup).
fn setup_works(layout: Layout) -> bool {
    let mut command = Command::new("unshare");
    if !is_root() {
        command.args(["--user", "--map-root-user"]);
    }
    command
        .args(unshare_args(layout))
        .args(["--", "sh", "-c"])
        .arg(setup_script(layout))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}
