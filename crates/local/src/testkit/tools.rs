//! Tools some tests need from the machine. A test asks [`missing`] first: when the tool is there
//! the test runs; when it is not, the test is reported as skipped with the reason (on the real
//! standard error, which the test harness does not capture, and in a ledger the run can count),
//! unless the run is CI (`CI=true`), where a missing tool fails the test instead of letting it
//! pass silently.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// Debian's statically linked busybox (package `busybox-static`), which the node tier's test
/// image carries.
pub const BUSYBOX: &str = "/bin/busybox";

/// Names of tools (`kubectl,userns`) a CI run knowingly lacks: they skip even under `CI=true`.
pub const ALLOW_MISSING_ENV: &str = "AGENT_SANDBOX_TESTS_ALLOW_MISSING";

/// A program from the machine that a test needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tool {
    /// `kubectl` (a client nobody here wrote; renders manifests and talks to the sim).
    Kubectl,
    /// User namespaces in which the kubelet confines pods (nothing to install: a kernel that
    /// allows them).
    Confinement,
    /// `python3` (the sandboxes of the local cluster run the host's tools).
    Python3,
    /// The Kubernetes control plane (`kube-apiserver`, `kube-controller-manager`,
    /// `kube-scheduler`, `etcd`, next to each other on `PATH`), as `cargo xtask tools` builds it.
    ControlPlane,
    /// Pod networks of their own made by a test as root: root, confinement, `ip`, `nft`
    /// (nftables) and `unshare` (the test makes a network namespace of its own for them).
    PodNetworks,
    /// `slirp4netns` (a kubelet that is not root gives its pods the host's network with it)
    /// and `setpriv` (util-linux), for a test that drops root to try that.
    Slirp4netns,
    /// `helm` (lints and renders the chart), as `cargo xtask tools` builds it.
    Helm,
    /// A real node as root: the control plane, the node's programs from `cargo xtask tools
    /// --node` (`kubelet`, `containerd`, `runsc`, `crictl`, ... together on `PATH`, the CNI
    /// plugins in `../cni` next to them), Debian's `runc`, `catatonit`, `busybox-static`,
    /// and `iptables` and `ipset` (for kube-router, the node's NetworkPolicy enforcer where
    /// the kernel has no nftables queue statement).
    Node,
    /// nftables' `queue` statement (kernel `CONFIG_NFT_QUEUE`), with which
    /// kube-network-policies hands a connection's first packet to its verdict: probed in a
    /// network namespace of its own, as root.
    NftQueue,
}

/// The programs of a real node that `cargo xtask tools --node` builds into one directory.
pub const NODE_PROGRAMS: [&str; 9] = [
    "kubelet",
    "kube-proxy",
    "containerd",
    "containerd-shim-runc-v2",
    "ctr",
    "runsc",
    "crictl",
    "kube-network-policies",
    "kube-router",
];
/// The CNI plugins it builds into `../cni` next to them.
pub const CNI_PLUGINS: [&str; 4] = ["bridge", "host-local", "portmap", "loopback"];

impl Tool {
    /// The program's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Kubectl => "kubectl",
            Self::Confinement => "userns",
            Self::Python3 => "python3",
            Self::ControlPlane => "kube-apiserver",
            Self::PodNetworks => "nft",
            Self::Slirp4netns => "slirp4netns",
            Self::Helm => "helm",
            Self::Node => "node-tools",
            Self::NftQueue => "nft-queue",
        }
    }

    /// The directory of a real node's programs: the first on `PATH` that holds them all,
    /// with the CNI plugins in `../cni`.
    pub fn node_dir() -> Option<PathBuf> {
        let path = std::env::var_os("PATH")?;
        std::env::split_paths(&path).find(|dir| {
            let cni = dir.parent().map(|parent| parent.join("cni"));
            NODE_PROGRAMS.iter().all(|name| dir.join(name).is_file())
                && cni.is_some_and(|cni| CNI_PLUGINS.iter().all(|name| cni.join(name).is_file()))
        })
    }

    /// The directory of the control plane's binaries: where `kube-apiserver` is found on `PATH`,
    /// if `etcd`, `kube-controller-manager`, `kube-scheduler` and `kubectl` are there too.
    pub fn control_plane_dir() -> Option<PathBuf> {
        let path = std::env::var_os("PATH")?;
        std::env::split_paths(&path).find(|dir| {
            [
                "kube-apiserver",
                "kube-controller-manager",
                "kube-scheduler",
                "etcd",
                "kubectl",
            ]
            .iter()
            .all(|name| dir.join(name).is_file())
        })
    }

    /// How to get it.
    fn install(self) -> &'static str {
        match self {
            Self::Kubectl | Self::ControlPlane | Self::Helm => {
                "cargo xtask tools (builds it from its Go module), then \
                 export PATH=\"$(cargo xtask tools --print-bin-dir):$PATH\" (bash .ci/run does both)"
            }
            Self::Confinement => {
                "enable user namespaces (sysctl -w user.max_user_namespaces=15000; on Debian \
                 kernels also kernel.unprivileged_userns_clone=1, on Ubuntu 24.04 and later \
                 kernel.apparmor_restrict_unprivileged_userns=0)"
            }
            Self::Python3 => "apt-get install python3 (bash .ci/run installs it)",
            Self::Slirp4netns => {
                "run as root with slirp4netns and util-linux \
                 (apt-get install slirp4netns util-linux; bash .ci/run installs them)"
            }
            Self::PodNetworks => {
                "run as root with iproute2, nftables and util-linux \
                 (apt-get install iproute2 nftables util-linux; bash .ci/run installs them)"
            }
            Self::Node => {
                "run as root; cargo xtask tools --node, then \
                 export PATH=\"$(cargo xtask tools --node --print-bin-dir):$PATH\"; \
                 apt-get install runc catatonit busybox-static iptables ipset \
                 (bash .ci/run does all of it)"
            }
            Self::NftQueue => {
                "a kernel with CONFIG_NFT_QUEUE (nftables' queue statement), as root with nft"
            }
        }
    }

    /// `None` when the tool works here, else why not.
    pub fn unavailable(self) -> Option<String> {
        let works = match self {
            Self::Kubectl => runs("kubectl", &["version", "--client"]),
            Self::Confinement => agent_sandbox_sim::confinement().is_ok(),
            Self::Python3 => runs("python3", &["--version"]),
            Self::Helm => runs("helm", &["version", "--short"]),
            Self::ControlPlane => Self::control_plane_dir().is_some(),
            Self::PodNetworks => {
                is_root()
                    && agent_sandbox_sim::confinement().is_ok()
                    && agent_sandbox_sim::PodNetwork::bridge_available().is_ok()
            }
            Self::Slirp4netns => {
                is_root() && runs("slirp4netns", &["--version"]) && runs("setpriv", &["--version"])
            }
            Self::Node => {
                is_root()
                    && Self::control_plane_dir().is_some()
                    && Self::node_dir().is_some()
                    && runs("runc", &["--version"])
                    && runs("catatonit", &["--version"])
                    && std::path::Path::new(BUSYBOX).is_file()
                    && runs("iptables", &["--version"])
                    && runs("ipset", &["version"])
            }
            Self::NftQueue => {
                is_root()
                    && runs(
                        "unshare",
                        &[
                            "--net",
                            "sh",
                            "-c",
                            "nft add table inet probe && nft add chain inet probe c \
                             '{ type filter hook forward priority 0; }' && \
                             nft add rule inet probe c queue num 100 bypass",
                        ],
                    )
            }
        };
        (!works).then(|| match self {
            Self::Confinement => format!(
                "pods cannot be confined here: {}",
                agent_sandbox_sim::confinement().err().unwrap_or_default()
            ),
            Self::ControlPlane => "kube-apiserver, kube-controller-manager, kube-scheduler, etcd \
                                   and kubectl are not together in a directory on PATH"
                .to_owned(),
            Self::Node => format!(
                "a real node needs root, the control plane and the node's programs on PATH, \
                 runc, catatonit, {BUSYBOX}, iptables and ipset: {}",
                [
                    (!is_root()).then_some("not root"),
                    Self::control_plane_dir()
                        .is_none()
                        .then_some("no control plane on PATH"),
                    Self::node_dir()
                        .is_none()
                        .then_some("no node programs on PATH"),
                    (!runs("runc", &["--version"])).then_some("no runc"),
                    (!runs("catatonit", &["--version"])).then_some("no catatonit"),
                    (!std::path::Path::new(BUSYBOX).is_file()).then_some("no busybox-static"),
                    (!runs("iptables", &["--version"])).then_some("no iptables"),
                    (!runs("ipset", &["version"])).then_some("no ipset"),
                ]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(", ")
            ),
            Self::NftQueue if is_root() => "this kernel has no nftables queue statement \
                 (`nft add rule inet probe c queue num 100 bypass` fails: CONFIG_NFT_QUEUE is \
                 not set), which kube-network-policies needs to enforce NetworkPolicies \
                 (the node tier runs kube-router's NetworkPolicy controller instead)"
                .to_owned(),
            Self::PodNetworks | Self::Slirp4netns | Self::NftQueue if !is_root() => {
                "the test makes network namespaces of its own, which needs root".to_owned()
            }
            Self::PodNetworks => format!(
                "pods here cannot have networks of their own: {}",
                agent_sandbox_sim::PodNetwork::bridge_available()
                    .err()
                    .unwrap_or_else(|| "pods cannot be confined here".to_owned())
            ),
            tool => format!("{} is not installed", tool.name()),
        })
    }
}

/// Whether this process's effective uid is 0 (from `/proc/self/status`).
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status
            .lines()
            .find_map(|line| line.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1))
            == Some("0")
    })
}

fn runs(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// Whether this run is CI: `CI` set to anything but empty, `0` or `false` (GitHub Actions and
/// most CI systems set `CI=true`).
fn is_ci() -> bool {
    std::env::var("CI").is_ok_and(|value| !matches!(value.as_str(), "" | "0" | "false"))
}

fn allowed_missing(tool: Tool) -> bool {
    std::env::var(ALLOW_MISSING_ENV)
        .is_ok_and(|list| list.split(',').any(|name| name.trim() == tool.name()))
}

/// Where skips are recorded: `skipped-tests.txt` in the target directory of the running test
/// binary (`<target>/<profile>/deps/<test>`), one line per skipped test, so that a run can
/// count them (`.ci/run` prints them).
fn ledger() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let deps = exe.parent().filter(|dir| dir.ends_with("deps"))?;
    Some(deps.parent()?.parent()?.join(LEDGER))
}

/// File name of the skip ledger in the target directory.
pub const LEDGER: &str = "skipped-tests.txt";

/// `true` when the calling test must stop because `tool` is missing (it has then been reported
/// as skipped), `false` when the tool works. Under `CI=true` a missing tool fails the test (a
/// panic naming the tool and how to install it), unless [`ALLOW_MISSING_ENV`] names it.
///
/// ```no_run
/// # use agent_sandbox_local::testkit::{Tool, missing};
/// if missing(Tool::Kubectl) {
///     return;
/// }
/// ```
pub fn missing(tool: Tool) -> bool {
    let Some(reason) = tool.unavailable() else {
        return false;
    };
    let test = std::thread::current()
        .name()
        .unwrap_or("<unnamed test>")
        .to_owned();
    if is_ci() && !allowed_missing(tool) {
        // The test kit's way of failing a test, as an assertion would: CI must not pass a test
        // that did not run.
        #[allow(clippy::panic)]
        {
            panic!(
                "{test} needs {}: {reason}; install it: {} (or set {ALLOW_MISSING_ENV}={} to skip \
                 knowingly)",
                tool.name(),
                tool.install(),
                tool.name()
            );
        }
    }
    let line = format!("SKIPPED {test}: {reason}; install it: {}", tool.install());
    // Straight to the process's standard error: the test harness captures `eprintln!`, which
    // would hide the skip unless the test failed.
    let _ = writeln!(std::io::stderr().lock(), "{line}");
    if let Some(path) = ledger()
        && let Ok(mut file) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
    {
        let _ = writeln!(file, "{line}");
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_that_works_is_not_missing() {
        // `sh` exists on every machine that runs these tests; the probe is the same.
        assert!(runs("sh", &["-c", "exit 0"]));
        assert!(!runs("sh", &["-c", "exit 3"]));
        assert!(!runs("/nonexistent/tool", &[]));
    }
}
