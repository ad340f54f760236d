//! What a bubblewrapped pod is confined by, beyond its own filesystem view, and which of it this
//! machine allows: a user namespace in which the pod's processes run as its `runAsUser` (1000 by
//! default) with no capabilities and no further user namespaces; when the kubelet runs as root,
//! a host uid of the pod's own (so that even outside its mount namespace it owns nothing but
//! its files); the [`seccomp`](crate::seccomp) filter; and resource limits in a control group
//! ([`cgroup`](crate::cgroup)). [`Protections::detect`] probes each once; the kubelet reports
//! what is missing in one line at start-up, and `Isolation::Strict` refuses to start without
//! all of them.
//!
//! bubblewrap always sets `no_new_privs` before it runs the program.

use std::collections::HashSet;
use std::io::{Seek as _, Write as _};
use std::os::fd::OwnedFd;
use std::process::Stdio;
use std::sync::{Mutex, OnceLock, PoisonError};

use crate::cgroup::Hierarchy;

/// The uid (and gid) a pod's processes have when neither the pod nor the container sets one.
pub(crate) const DEFAULT_RUN_AS: u32 = 1000;

/// Host uids (and gids) handed to pods when the kubelet runs as root: a range no distribution
/// gives to users or services (`/etc/login.defs` and systemd stop far below it), below 2^31
/// (bubblewrap writes its uid map with signed numbers).
const HOST_ID_BASE: u32 = 0x7000_0000;
const HOST_ID_COUNT: u32 = 1 << 24;

/// Which protections bubblewrapped pods get here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Protections {
    /// Pods see only what their image provides (bubblewrap works).
    pub filesystem: bool,
    /// Pods run as their `runAsUser` in a user namespace, without capabilities.
    pub user_namespace: bool,
    /// Each pod has a host uid of its own (the kubelet runs as root).
    pub host_ids: bool,
    /// The seccomp filter is applied.
    pub seccomp: bool,
    /// Resource limits: which control groups, if any.
    pub cgroups: Option<String>,
    /// CPU limits are applied (the cgroup has the cpu controller).
    pub cpu_limits: bool,
    /// Why pods share the node's network (`None`: each has its own, with its NetworkPolicies
    /// enforced).
    pub network: Option<String>,
    /// Why pods with a network of their own have no internet (`None`: they have one, or share
    /// the node's network). Not a protection: `Isolation::Strict` does not ask for it.
    pub internet: Option<String>,
}

impl Protections {
    /// Probes this machine (once per process; `bwrap` says whether bubblewrap works at all).
    pub(crate) fn detect(bwrap: bool) -> Self {
        static FOUND: OnceLock<Protections> = OnceLock::new();
        if !bwrap {
            return Self::none();
        }
        FOUND
            .get_or_init(|| {
                let user_namespace =
                    probe(&["--unshare-user", "--uid", "1000", "--gid", "1000"], None);
                let host_ids = user_namespace
                    && is_root()
                    && probe(
                        &["--unshare-user", "--uid", "1000", "--gid", "1000"],
                        Some(HOST_ID_BASE + HOST_ID_COUNT - 1),
                    );
                let seccomp = seccomp_works();
                let cgroups = Hierarchy::detect();
                Self {
                    filesystem: true,
                    user_namespace,
                    host_ids,
                    seccomp,
                    cgroups: cgroups.map(Hierarchy::describe),
                    cpu_limits: cgroups.is_some_and(Hierarchy::has_cpu),
                    network: Some(shared_network()),
                    internet: None,
                }
            })
            .clone()
    }

    /// Nothing (plain processes).
    pub(crate) fn none() -> Self {
        Self {
            filesystem: false,
            user_namespace: false,
            host_ids: false,
            seccomp: false,
            cgroups: None,
            cpu_limits: false,
            network: Some(shared_network()),
            internet: None,
        }
    }

    /// What is missing, each as a short phrase with what it needs.
    pub fn missing(&self) -> Vec<String> {
        let mut missing = Vec::new();
        if let Some(network) = &self.network {
            missing.push(format!(
                "{network}; NetworkPolicies are not enforced and pods reach the host's loopback \
                 and private services"
            ));
        }
        if !self.filesystem {
            missing.push(
                "a filesystem of their own (pods see the host's files: install bubblewrap, \
                 `apt-get install bubblewrap`)"
                    .to_owned(),
            );
            return missing;
        }
        if !self.user_namespace {
            missing.push(
                "an unprivileged user (user namespaces are disabled here: \
                 sysctl kernel.unprivileged_userns_clone=1 or user.max_user_namespaces)"
                    .to_owned(),
            );
        } else if !self.host_ids {
            missing
                .push("a host uid per pod (pods share yours; run as root for one each)".to_owned());
        }
        if !self.seccomp {
            missing.push("a seccomp filter (bubblewrap refused it)".to_owned());
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
        if !self.filesystem {
            return "pods run as plain processes on the host, NOT isolated".to_owned();
        }
        let mut have = vec!["own filesystem view"];
        if self.user_namespace {
            have.push("unprivileged user namespace, no capabilities, no_new_privs");
        }
        if self.host_ids {
            have.push("a host uid each");
        }
        if self.seccomp {
            have.push("seccomp");
        }
        if self.network.is_none() {
            have.push("own network with NetworkPolicies enforced");
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

/// Why pods share the node's network when the kubelet was not given bridge networking.
fn shared_network() -> String {
    match crate::pod_net::available() {
        Ok(()) => "a network of their own (this node shares its own with pods: pod_network Bridge \
                   gives each one)"
            .to_owned(),
        Err(missing) => missing,
    }
}

/// Whether this process's effective uid is 0.
pub(crate) fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Whether `bwrap <extra> ... true` succeeds (as host uid `as_uid` when given).
fn probe(extra: &[&str], as_uid: Option<u32>) -> bool {
    let mut command = std::process::Command::new("bwrap");
    command
        .args(extra)
        .args([
            "--ro-bind",
            "/usr",
            "/usr",
            "--symlink",
            "usr/bin",
            "/bin",
            "--symlink",
            "usr/lib",
            "/lib",
            "--symlink",
            "usr/lib64",
            "/lib64",
            "--unshare-pid",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--cap-drop",
            "ALL",
            "--",
            "/usr/bin/true",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some(uid) = as_uid {
        use std::os::unix::process::CommandExt as _;
        command.uid(uid).gid(uid);
    }
    command.status().is_ok_and(|status| status.success())
}

/// Whether bubblewrap loads our filter (it needs a kernel with seccomp filters).
fn seccomp_works() -> bool {
    let Ok(fd) = data_fd("seccomp", &crate::seccomp::program()) else {
        return false;
    };
    let number = std::os::fd::AsRawFd::as_raw_fd(&fd);
    let mut command = std::process::Command::new("bwrap");
    command
        .args([
            "--ro-bind",
            "/",
            "/",
            "--seccomp",
            &number.to_string(),
            "--",
            "/usr/bin/true",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    crate::process::inherit(&mut command, vec![number]);
    command.status().is_ok_and(|status| status.success())
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
            let id = HOST_ID_BASE + fastrand::u32(..HOST_ID_COUNT - 1);
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
            filesystem: true,
            user_namespace: true,
            host_ids: false,
            seccomp: true,
            cgroups: None,
            cpu_limits: false,
            network: None,
            internet: None,
        };
        let line = protections.summary();
        assert!(line.contains("MISSING: a host uid per pod"), "{line}");
        assert!(line.contains("resource limits"), "{line}");
        protections.host_ids = true;
        protections.cgroups = Some("cgroup v1 (memory, cpu, pids)".to_owned());
        protections.cpu_limits = true;
        assert!(protections.missing().is_empty());
        assert!(!protections.summary().contains("MISSING"));
        // No internet is said, but is not a missing protection.
        protections.internet = Some("no internet for pods (no slirp4netns)".to_owned());
        assert!(protections.missing().is_empty());
        assert!(protections.summary().contains("no internet for pods"));
        assert_eq!(Protections::none().missing().len(), 2);
    }
}
