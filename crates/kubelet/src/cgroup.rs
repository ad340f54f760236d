//! Resource limits of a container's processes from its `resources.limits`, in a control group
//! of its own: memory, CPU (a CFS quota) and a process count (the kubelet's
//! `pod_pids_limit`, [`DEFAULT_PIDS`] unless configured, as a real kubelet's `--pod-max-pids`:
//! a laptop running an LLM's fork bomb needs one). cgroup v2 where this process's own group can
//! delegate the controllers, else cgroup v1 with one directory per controller.
//!
//! [`Limits::from_container`] is the decision (sans IO); [`Hierarchy::detect`] finds where
//! groups can be made; [`Cgroup::create`] makes one and opens its `cgroup.procs` files, so that
//! the child joins it before it runs anything ([`Cgroup::join_fds`], written with `0` between
//! fork and exec); dropping the [`Cgroup`] removes the directories once their processes are
//! gone.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::Value;

/// Processes a container may have unless the kubelet is configured otherwise.
pub(crate) const DEFAULT_PIDS: u64 = 4096;
/// The start of the name of a kubelet's own group (`agent-sandbox-<pid>-<n>`), below which it
/// makes a group per container.
pub(crate) const GROUP_PREFIX: &str = "agent-sandbox-";
/// The CFS period the CPU quota is a share of (100 ms, as the kubelet's).
const CPU_PERIOD_US: u64 = 100_000;

/// A container's limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Bytes.
    pub(crate) memory: Option<u64>,
    /// Thousandths of a CPU.
    pub(crate) cpu_milli: Option<u64>,
    pub(crate) pids: u64,
    /// Bytes of `ephemeral-storage` (enforced by the pod's storage, not a control group).
    pub(crate) ephemeral_storage: Option<u64>,
}

impl Limits {
    /// The limits of `container` (`resources.limits`) with at most `pids` processes; a
    /// quantity that does not parse is an error naming it, as the API server would have
    /// refused it.
    pub(crate) fn from_container(container: &Value, pids: u64) -> Result<Self, String> {
        let limit = |name: &str| -> Result<Option<u128>, String> {
            let Some(value) = container.pointer(&format!("/resources/limits/{name}")) else {
                return Ok(None);
            };
            let text = match value {
                Value::String(text) => text.clone(),
                Value::Number(number) => number.to_string(),
                other => {
                    return Err(format!(
                        "resources.limits.{name}: {other} is not a quantity"
                    ));
                }
            };
            agent_sandbox_api::units::parse_quantity_milli(&text)
                .map(Some)
                .map_err(|error| format!("resources.limits.{name}: {error}"))
        };
        let whole = |milli: u128| u64::try_from(milli.div_ceil(1000)).unwrap_or(u64::MAX);
        Ok(Self {
            memory: limit("memory")?.map(whole),
            cpu_milli: limit("cpu")?.map(|milli| u64::try_from(milli).unwrap_or(u64::MAX)),
            pids,
            ephemeral_storage: limit("ephemeral-storage")?.map(whole),
        })
    }

    /// The files to write in a group (controller, file, value), for `version`.
    fn files(&self, version: Version) -> Vec<(Controller, &'static str, String)> {
        let mut files = vec![(Controller::Pids, "pids.max", self.pids.to_string())];
        match version {
            Version::V1 => {
                if let Some(bytes) = self.memory {
                    files.push((
                        Controller::Memory,
                        "memory.limit_in_bytes",
                        bytes.to_string(),
                    ));
                }
                if let Some(milli) = self.cpu_milli {
                    files.push((
                        Controller::Cpu,
                        "cpu.cfs_period_us",
                        CPU_PERIOD_US.to_string(),
                    ));
                    files.push((
                        Controller::Cpu,
                        "cpu.cfs_quota_us",
                        quota(milli).to_string(),
                    ));
                }
            }
            Version::V2 => {
                if let Some(bytes) = self.memory {
                    files.push((Controller::Memory, "memory.max", bytes.to_string()));
                    files.push((Controller::Memory, "memory.swap.max", "0".to_owned()));
                }
                if let Some(milli) = self.cpu_milli {
                    files.push((
                        Controller::Cpu,
                        "cpu.max",
                        format!("{} {CPU_PERIOD_US}", quota(milli)),
                    ));
                }
            }
        }
        files
    }
}

/// The CFS quota in microseconds per period for `milli` thousandths of a CPU (at least 1 ms,
/// the kernel's minimum).
fn quota(milli: u64) -> u64 {
    (milli.saturating_mul(CPU_PERIOD_US) / 1000).max(1000)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Version {
    V1,
    V2,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Controller {
    Memory,
    Cpu,
    Pids,
}

impl Controller {
    const ALL: [Self; 3] = [Self::Memory, Self::Cpu, Self::Pids];

    fn v1_name(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Cpu => "cpu",
            Self::Pids => "pids",
        }
    }
}

/// Where this kubelet makes its groups.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Hierarchy {
    /// One directory for every controller.
    V2(PathBuf),
    /// A directory per controller (each under this process's own group there).
    V1(Vec<(Controller, PathBuf)>),
}

/// This process's group in hierarchy `key` (`0::` for v2, `memory` ...) from
/// `/proc/self/cgroup`.
fn own_group(key: &str) -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines().find_map(|line| {
        let (_, rest) = line.split_once(':')?;
        let (controllers, path) = rest.split_once(':')?;
        (controllers.split(',').any(|c| c == key) || (key.is_empty() && controllers.is_empty()))
            .then(|| path.to_owned())
    })
}

/// Removes the group `dir` and its child groups (bottom up; a group with processes stays).
fn remove_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&entry.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// Whether a group can be made, limited and removed below `dir` for `controllers`.
fn can_make_groups(dir: &Path, files: &[&str]) -> bool {
    let probe = dir.join(format!("agent-sandbox-probe-{}", std::process::id()));
    let _ = std::fs::remove_dir(&probe);
    if std::fs::create_dir(&probe).is_err() && !probe.is_dir() {
        return false;
    }
    let ok = files.iter().all(|file| probe.join(file).exists());
    let _ = std::fs::remove_dir(&probe);
    ok
}

impl Hierarchy {
    /// What this machine lets this process do (checked once): `None` when no group with the
    /// pids and memory controllers can be made.
    pub(crate) fn detect() -> Option<&'static Self> {
        static FOUND: OnceLock<Option<Hierarchy>> = OnceLock::new();
        FOUND.get_or_init(Self::find).as_ref()
    }

    fn find() -> Option<Self> {
        let found = Self::probe();
        if let Some(hierarchy) = &found {
            hierarchy.sweep();
        }
        found
    }

    /// The directories groups are made in.
    fn dirs(&self) -> Vec<&Path> {
        match self {
            Self::V2(dir) => vec![dir.as_path()],
            Self::V1(dirs) => dirs.iter().map(|(_, dir)| dir.as_path()).collect(),
        }
    }

    /// Removes what kubelets of processes that are gone left behind (a kubelet killed with
    /// SIGKILL cannot clean up): their empty groups.
    fn sweep(&self) {
        for dir in self.dirs() {
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let Some(pid) = name
                    .strip_prefix(GROUP_PREFIX)
                    .and_then(|rest| rest.split('-').next())
                    .and_then(|pid| pid.parse::<u32>().ok())
                else {
                    continue;
                };
                if Path::new(&format!("/proc/{pid}")).exists() {
                    continue;
                }
                remove_tree(&entry.path());
            }
        }
    }

    /// Removes the groups of kubelet `prefix` (at its stop), in a thread that waits for their
    /// processes to be gone.
    pub(crate) fn remove_kubelet(&self, prefix: &str) {
        let dirs: Vec<PathBuf> = self.dirs().iter().map(|dir| dir.join(prefix)).collect();
        let _ = std::thread::Builder::new()
            .name("cgroup-cleanup".to_owned())
            .spawn(move || {
                for _ in 0..500 {
                    dirs.iter().for_each(|dir| remove_tree(dir));
                    if dirs.iter().all(|dir| !dir.exists()) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            });
    }

    fn probe() -> Option<Self> {
        let root = Path::new("/sys/fs/cgroup");
        if root.join("cgroup.controllers").exists() {
            let own = own_group("")?;
            let dir = root.join(own.trim_start_matches('/'));
            let wanted = ["memory.max", "pids.max", "cpu.max"];
            if can_make_groups(&dir, &wanted) {
                return Some(Self::V2(dir));
            }
            // Delegating needs the controllers in our group's subtree_control, which the
            // kernel allows only while the group holds no process (not the case here).
            let _ = std::fs::write(dir.join("cgroup.subtree_control"), "+memory +pids +cpu");
            return can_make_groups(&dir, &wanted).then_some(Self::V2(dir));
        }
        let mut dirs = Vec::new();
        for controller in Controller::ALL {
            let name = controller.v1_name();
            let Some(own) = own_group(name) else {
                continue;
            };
            let mount = root.join(name);
            let dir = mount.join(own.trim_start_matches('/'));
            let file = match controller {
                Controller::Memory => "memory.limit_in_bytes",
                Controller::Cpu => "cpu.cfs_quota_us",
                Controller::Pids => "pids.max",
            };
            if can_make_groups(&dir, &[file, "cgroup.procs"]) {
                dirs.push((controller, dir));
            }
        }
        let has = |wanted: Controller| dirs.iter().any(|(c, _)| *c == wanted);
        (has(Controller::Memory) && has(Controller::Pids)).then_some(Self::V1(dirs))
    }

    /// One line for the start-up summary.
    pub(crate) fn describe(&self) -> String {
        match self {
            Self::V2(_) => "cgroup v2 (memory, cpu, pids)".to_owned(),
            Self::V1(dirs) => format!(
                "cgroup v1 ({})",
                dirs.iter()
                    .map(|(c, _)| c.v1_name())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }

    /// Whether CPU quotas are applied.
    pub(crate) fn has_cpu(&self) -> bool {
        match self {
            Self::V2(_) => true,
            Self::V1(dirs) => dirs.iter().any(|(c, _)| *c == Controller::Cpu),
        }
    }
}

/// A container's group: its directories and their open `cgroup.procs`.
#[derive(Debug)]
pub(crate) struct Cgroup {
    dirs: Vec<PathBuf>,
    procs: Vec<OwnedFd>,
}

impl Cgroup {
    /// Makes the group `name` (one path segment per level, e.g. `agent-sandbox-<pid>/<pod>-c`)
    /// in `hierarchy` with `limits` written.
    pub(crate) fn create(
        hierarchy: &Hierarchy,
        name: &str,
        limits: &Limits,
    ) -> Result<Self, String> {
        let (version, dirs): (Version, Vec<(Option<Controller>, PathBuf)>) = match hierarchy {
            Hierarchy::V2(dir) => (Version::V2, vec![(None, dir.join(name))]),
            Hierarchy::V1(dirs) => (
                Version::V1,
                dirs.iter()
                    .map(|(c, dir)| (Some(*c), dir.join(name)))
                    .collect(),
            ),
        };
        let mut group = Self {
            dirs: Vec::new(),
            procs: Vec::new(),
        };
        for (_, dir) in &dirs {
            std::fs::create_dir_all(dir).map_err(|error| {
                format!("creating the control group {}: {error}", dir.display())
            })?;
            group.dirs.push(dir.clone());
        }
        for (controller, file, value) in limits.files(version) {
            let Some((_, dir)) = dirs
                .iter()
                .find(|(c, _)| c.is_none() || *c == Some(controller))
            else {
                continue;
            };
            let path = dir.join(file);
            if file == "memory.swap.max" && !path.exists() {
                continue;
            }
            std::fs::write(&path, &value)
                .map_err(|error| format!("writing {value} to {}: {error}", path.display()))?;
        }
        for (_, dir) in &dirs {
            let path = dir.join("cgroup.procs");
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .map_err(|error| format!("opening {}: {error}", path.display()))?;
            group.procs.push(file.into());
        }
        Ok(group)
    }

    /// The `cgroup.procs` descriptors a child writes `0` to, to join the group.
    pub(crate) fn join_fds(&self) -> Vec<RawFd> {
        self.procs.iter().map(AsRawFd::as_raw_fd).collect()
    }

    /// Whether the kernel killed a process of the group for exceeding its memory limit (the
    /// `oom_kill` count of v2 `memory.events` or v1 `memory.oom_control`), for the container's
    /// termination reason.
    pub(crate) fn out_of_memory(&self) -> bool {
        self.dirs.iter().any(|dir| {
            let v2 = std::fs::read_to_string(dir.join("memory.events"))
                .ok()
                .is_some_and(|text| {
                    text.lines().any(|line| {
                        line.strip_prefix("oom_kill ")
                            .is_some_and(|n| n.trim() != "0")
                    })
                });
            let v1 = std::fs::read_to_string(dir.join("memory.oom_control"))
                .ok()
                .is_some_and(|text| {
                    text.lines().any(|line| {
                        line.strip_prefix("oom_kill ")
                            .is_some_and(|n| n.trim() != "0")
                    })
                });
            v1 || v2
        })
    }
}

impl Drop for Cgroup {
    /// Removes the directories; the kernel refuses while a process is still inside (a SIGKILL
    /// takes a moment), so a thread retries for a while.
    fn drop(&mut self) {
        self.procs.clear();
        let mut dirs = std::mem::take(&mut self.dirs);
        dirs.retain(|dir| std::fs::remove_dir(dir).is_err() && dir.exists());
        if dirs.is_empty() {
            return;
        }
        let _ = std::thread::Builder::new()
            .name("cgroup-cleanup".to_owned())
            .spawn(move || {
                for _ in 0..500 {
                    dirs.retain(|dir| std::fs::remove_dir(dir).is_err() && dir.exists());
                    if dirs.is_empty() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn limits_come_from_resources_limits() {
        let container = json!({"resources": {"limits": {"memory": "512Mi", "cpu": "500m",
            "ephemeral-storage": "1Gi"}}});
        let limits = Limits::from_container(&container, DEFAULT_PIDS).unwrap();
        assert_eq!(
            limits,
            Limits {
                memory: Some(512 << 20),
                cpu_milli: Some(500),
                pids: DEFAULT_PIDS,
                ephemeral_storage: Some(1 << 30),
            }
        );
        assert_eq!(
            limits.files(Version::V2),
            vec![
                (Controller::Pids, "pids.max", "4096".to_owned()),
                (Controller::Memory, "memory.max", (512u64 << 20).to_string()),
                (Controller::Memory, "memory.swap.max", "0".to_owned()),
                (Controller::Cpu, "cpu.max", "50000 100000".to_owned()),
            ]
        );
        assert!(limits.files(Version::V1).contains(&(
            Controller::Cpu,
            "cpu.cfs_quota_us",
            "50000".to_owned()
        )));
        let none = Limits::from_container(&json!({}), 64).unwrap();
        assert_eq!((none.memory, none.pids), (None, 64));
        assert_eq!(none.files(Version::V1).len(), 1);
        let cpu =
            Limits::from_container(&json!({"resources": {"limits": {"cpu": 2}}}), 64).unwrap();
        assert_eq!(cpu.cpu_milli, Some(2000));
        assert!(
            Limits::from_container(&json!({"resources": {"limits": {"memory": "lots"}}}), 64)
                .unwrap_err()
                .contains("resources.limits.memory")
        );
    }

    #[test]
    fn a_tiny_cpu_limit_gets_the_kernels_minimum_quota() {
        assert_eq!(quota(1), 1000);
        assert_eq!(quota(2000), 200_000);
    }
}
