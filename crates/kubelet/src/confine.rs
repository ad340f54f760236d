//! What a confined pod ([`crate::sandbox`]) is protected by here, checked once per process
//! ([`Protections::detect`]): its own user, mount, PID, IPC and UTS namespaces with a root of
//! the host's system directories only and a capped storage, no capabilities and
//! `no_new_privs` (always, or the kubelet refuses to start); the [`seccomp`](crate::seccomp)
//! filter; as root, a host uid of the pod's own (so that even outside its namespaces it owns
//! nothing but its files); resource limits in a control group ([`cgroup`](crate::cgroup)); and
//! a network of its own. The kubelet reports what pods get and lack in one line at start-up,
//! and `Isolation::Strict` refuses to start without all of it.

use std::collections::HashSet;
use std::io::{Seek as _, Write as _};
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::{Mutex, OnceLock, PoisonError};

use crate::cgroup::Hierarchy;

/// The uid (and gid) a pod's processes have when neither the pod nor the container sets one.
pub(crate) const DEFAULT_RUN_AS: u32 = 1000;

/// Host uids (and gids) handed to pods when the kubelet runs as root: a range no distribution
/// gives to users or services (`/etc/login.defs` and systemd stop far below it), below 2^31.
const HOST_ID_BASE: u32 = 0x7000_0000;
const HOST_ID_COUNT: u32 = 1 << 24;

/// Which protections pods get here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Protections {
    /// Pods are confined ([`crate::sandbox`]): namespaces of their own, only the host's system
    /// directories read-only, capped storage, an unprivileged user without capabilities and
    /// `no_new_privs`. False only with `--isolation none`.
    pub confined: bool,
    /// Each pod has a host uid of its own (the kubelet runs as root).
    pub host_ids: bool,
    /// The seccomp filter is applied.
    pub seccomp: bool,
    /// Resource limits: which control groups, if any.
    pub cgroups: Option<String>,
    /// CPU limits are applied (the cgroup has the cpu controller).
    pub cpu_limits: bool,
    /// Why pods share the node's network (`None`: each has its own).
    pub network: Option<String>,
    /// Why pods' own networks have loopback only (`None`: they are on the node's bridge, with
    /// their NetworkPolicies enforced). Less access, not a missing protection.
    pub loopback_only: Option<String>,
    /// Why pods with a network of their own have no internet (`None`: they have one, or share
    /// the node's network). Not a protection: `Isolation::Strict` does not ask for it.
    pub internet: Option<String>,
}

/// The outcome of the check, once per process: whether the seccomp filter works, or why pods
/// cannot be confined here.
static CHECKED: Mutex<Option<Result<bool, String>>> = Mutex::new(None);

impl Protections {
    /// Checks that pods can be confined here (once per process: a pod sandbox and a container
    /// that builds its root are started in a directory below `scratch`, the way every pod is)
    /// and what else this machine gives them. The error says why pods cannot be confined and
    /// how to fix it.
    pub(crate) fn detect(scratch: &Path) -> Result<Self, String> {
        let seccomp = {
            let mut checked = CHECKED.lock().unwrap_or_else(PoisonError::into_inner);
            match &*checked {
                Some(result) => result.clone(),
                None => {
                    let dir = scratch.join(format!(
                        ".confinement-check-{}-{:08x}",
                        std::process::id(),
                        fastrand::u32(..)
                    ));
                    let result = match crate::sandbox::check(&dir, true) {
                        Ok(()) => Ok(true),
                        Err(with_filter) => match crate::sandbox::check(&dir, false) {
                            Ok(()) => {
                                tracing::warn!(error = %with_filter, "the seccomp filter does not work here");
                                Ok(false)
                            }
                            Err(error) => Err(error),
                        },
                    };
                    let _ = std::fs::remove_dir_all(&dir);
                    *checked = Some(result.clone());
                    result
                }
            }
        }?;
        let cgroups = Hierarchy::detect();
        Ok(Self {
            confined: true,
            host_ids: is_root(),
            seccomp,
            cgroups: cgroups.map(Hierarchy::describe),
            cpu_limits: cgroups.is_some_and(Hierarchy::has_cpu),
            network: None,
            loopback_only: None,
            internet: None,
        })
    }

    /// Nothing (plain processes).
    pub(crate) fn none() -> Self {
        Self {
            confined: false,
            host_ids: false,
            seccomp: false,
            cgroups: None,
            cpu_limits: false,
            network: Some("pods are plain processes".to_owned()),
            loopback_only: None,
            internet: None,
        }
    }

    /// What is missing, each as a short phrase with what it needs.
    pub fn missing(&self) -> Vec<String> {
        let mut missing = Vec::new();
        if !self.confined {
            missing.push(
                "confinement (pods run as plain processes with your user's rights: \
                 --isolation none was asked for)"
                    .to_owned(),
            );
            return missing;
        }
        if let Some(network) = &self.network {
            missing.push(format!(
                "a network of their own ({network}): NetworkPolicies are not enforced and pods \
                 reach the host's loopback and private services"
            ));
        }
        if !self.host_ids {
            missing
                .push("a host uid per pod (pods share yours; run as root for one each)".to_owned());
        }
        if !self.seccomp {
            missing.push("a seccomp filter (the kernel refused it)".to_owned());
        }
        match &self.cgroups {
            None => missing.push(
                "resource limits (no control group can be made: needs root or a delegated \
                 cgroup v2 subtree)"
                    .to_owned(),
            ),
            Some(_) if !self.cpu_limits => {
                missing.push("CPU limits (the cgroup has no cpu controller)".to_owned());
            }
            Some(_) => {}
        }
        missing
    }

    /// One line for the start-up log: what pods get, and what they lack.
    pub fn summary(&self) -> String {
        if !self.confined {
            return "pods run as plain processes on the host, NOT isolated (--isolation none)"
                .to_owned();
        }
        let mut have = vec![
            "own user, mount, PID, IPC and UTS namespaces",
            "only the host's system directories, read-only",
            "storage capped by ephemeral-storage",
            "an unprivileged user without capabilities, no_new_privs",
        ];
        if self.host_ids {
            have.push("a host uid each");
        }
        if self.seccomp {
            have.push("seccomp");
        }
        let network;
        if self.network.is_none() {
            network = match &self.loopback_only {
                Some(why) => format!("own network with loopback only ({why})"),
                None => "own network with NetworkPolicies enforced".to_owned(),
            };
            have.push(&network);
        }
        let cgroups = self.cgroups.clone();
        let mut line = format!(
            "pods get: {}{}",
            have.join(", "),
            cgroups
                .map(|c| format!(", limits by {c}"))
                .unwrap_or_default()
        );
        let missing = self.missing();
        if !missing.is_empty() {
            line.push_str("; MISSING: ");
            line.push_str(&missing.join("; "));
        }
        if let Some(internet) = &self.internet {
            line.push_str("; ");
            line.push_str(internet);
        }
        line
    }
}

/// Whether this process is root of the machine: effective uid 0 in the initial user namespace
/// (root of a user namespace, as `unshare --map-root-user` makes it, cannot hand out host uids
/// or configure the host's network, and is treated as any other user).
pub(crate) fn is_root() -> bool {
    static ROOT: OnceLock<bool> = OnceLock::new();
    *ROOT.get_or_init(|| {
        rustix::process::geteuid().is_root()
            && std::fs::read_to_string("/proc/self/uid_map")
                .is_ok_and(|map| is_initial_uid_map(&map))
    })
}

/// Whether `map` (a `uid_map`) is the initial user namespace's: every id mapped to itself.
fn is_initial_uid_map(map: &str) -> bool {
    let fields: Vec<&str> = map.split_whitespace().collect();
    fields == ["0", "0", "4294967295"]
}

/// A sealed-off memfd holding `data`, positioned at its start (close-on-exec: a child gets it
/// through [`crate::process::inherit`] only).
pub(crate) fn data_fd(name: &str, data: &[u8]) -> std::io::Result<OwnedFd> {
    let fd = rustix::fs::memfd_create(name, rustix::fs::MemfdFlags::CLOEXEC)?;
    let mut file = std::fs::File::from(fd);
    file.write_all(data)?;
    file.rewind()?;
    Ok(file.into())
}

fn host_ids_in_use() -> &'static Mutex<HashSet<u32>> {
    static IN_USE: OnceLock<Mutex<HashSet<u32>>> = OnceLock::new();
    IN_USE.get_or_init(|| Mutex::new(HashSet::new()))
}

/// A host uid (and the gid of the same number) reserved for one pod until dropped.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct HostId(pub(crate) u32);

impl HostId {
    /// A random id of the range that this process has not handed out.
    pub(crate) fn allocate() -> Self {
        let mut in_use = host_ids_in_use()
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        loop {
            let id = HOST_ID_BASE + fastrand::u32(..HOST_ID_COUNT / 2);
            if in_use.insert(id) {
                return Self(id);
            }
        }
    }
}

impl Drop for HostId {
    fn drop(&mut self) {
        host_ids_in_use()
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.0);
    }
}

/// The host group of a namespace's pods (a root kubelet gives it to every pod of the namespace
/// and to the namespace's claim directories): in the upper half of the host id range, derived
/// from the name so that every kubelet start agrees; per-pod uids come from the lower half.
pub(crate) fn namespace_group(namespace: &str) -> u32 {
    let half = HOST_ID_COUNT / 2;
    HOST_ID_BASE + half + agent_sandbox_api::fnv1a_32(namespace.as_bytes()) % half
}

/// `/etc/passwd` of a pod whose processes run as `uid`:`gid` with home `home`.
pub(crate) fn passwd(uid: u32, gid: u32, home: &str) -> String {
    let mut text = String::from("root:x:0:0:root:/root:/usr/sbin/nologin\n");
    if uid != 0 && uid != 65534 {
        text.push_str(&format!("sandbox:x:{uid}:{gid}:sandbox:{home}:/bin/sh\n"));
    }
    text.push_str("nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n");
    text
}

/// `/etc/group` for [`passwd`].
pub(crate) fn group(gid: u32) -> String {
    let mut text = String::from("root:x:0:\n");
    if gid != 0 && gid != 65534 {
        text.push_str(&format!("sandbox:x:{gid}:\n"));
    }
    text.push_str("nogroup:x:65534:\n");
    text
}

/// `/etc/hosts` of a pod, as a kubelet writes it.
pub(crate) fn hosts(hostname: &str, pod_ip: Option<&str>) -> String {
    let mut text = String::from(
        "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n",
    );
    if let Some(ip) = pod_ip {
        text.push_str(&format!("{ip}\t{hostname}\n"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwd_and_group_name_the_sandbox_user() {
        let text = passwd(1000, 1000, "/app");
        assert!(
            text.contains("sandbox:x:1000:1000:sandbox:/app:/bin/sh\n"),
            "{text}"
        );
        assert!(!passwd(0, 0, "/app").contains("sandbox"));
        assert!(group(2000).contains("sandbox:x:2000:"));
        assert!(hosts("pod-a", Some("10.1.2.3")).ends_with("10.1.2.3\tpod-a\n"));
    }

    #[test]
    fn only_the_initial_user_namespace_is_root() {
        assert!(is_initial_uid_map("         0          0 4294967295\n"));
        assert!(!is_initial_uid_map("         0       1000          1\n"));
        assert!(!is_initial_uid_map(""));
    }

    #[test]
    fn host_ids_are_distinct_and_returned() {
        let a = HostId::allocate();
        let b = HostId::allocate();
        assert_ne!(a, b);
        assert!((HOST_ID_BASE..HOST_ID_BASE + HOST_ID_COUNT).contains(&a.0));
        let number = a.0;
        drop(a);
        assert!(!host_ids_in_use().lock().unwrap().contains(&number));
    }

    #[test]
    fn the_summary_names_what_is_missing() {
        let mut protections = Protections {
            confined: true,
            host_ids: false,
            seccomp: true,
            cgroups: None,
            cpu_limits: false,
            network: None,
            loopback_only: Some("no nft here".to_owned()),
            internet: None,
        };
        let line = protections.summary();
        assert!(line.contains("MISSING: a host uid per pod"), "{line}");
        assert!(line.contains("resource limits"), "{line}");
        assert!(
            line.contains("own network with loopback only (no nft here)"),
            "{line}"
        );
        protections.host_ids = true;
        protections.cgroups = Some("cgroup v1 (memory, cpu, pids)".to_owned());
        protections.cpu_limits = true;
        assert!(protections.missing().is_empty());
        assert!(!protections.summary().contains("MISSING"));
        // No internet is said, but is not a missing protection.
        protections.internet = Some("no internet for pods (no slirp4netns)".to_owned());
        assert!(protections.missing().is_empty());
        assert!(protections.summary().contains("no internet for pods"));
        // Sharing the node's network is.
        protections.network = Some("asked for".to_owned());
        assert_eq!(protections.missing().len(), 1);
        assert_eq!(Protections::none().missing().len(), 1);
        assert!(Protections::none().summary().contains("NOT isolated"));
    }
}
