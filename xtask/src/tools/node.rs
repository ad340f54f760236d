//! `cargo xtask tools --node`: the binaries of a real Kubernetes node, for the node tier of the
//! end-to-end suite: the real `kubelet` and `kube-proxy` (built in `xtask/k8s-tools`, the control plane's module,
//! so that it is the control plane's release), `containerd` with `containerd-shim-runc-v2` and
//! `ctr`, gVisor's `runsc`, the CNI plugins `bridge`, `host-local`, `portmap` and `loopback`,
//! `crictl`, `kube-network-policies` (the SIG Network reference NetworkPolicy enforcer) and
//! `kube-router` (whose NetworkPolicy controller enforces instead where the kernel lacks
//! nftables' queue statement, which kube-network-policies needs).
//!
//! Every project but Kubernetes is pinned in a Go module of its own under `xtask/node-tools/`,
//! so that one project's dependency graph never moves another's pins. All are static binaries
//! (`CGO_ENABLED=0`; containerd with the `no_btrfs` tag, as it has no btrfs headers then). They
//! go into a directory of the same cache as the control plane's, keyed by the pinned versions
//! and a hash of every module file involved and the Go version, built in a temporary directory
//! renamed into place only when every binary built: `bin/` for the programs, `cni/` for the
//! plugins (a CNI `bin_dir`). `runc` and `catatonit` are not built here: the node tier takes
//! Debian's packages (`.ci/run` installs them).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context as _, Result, bail};

use super::{Build, MODULE_DIR, Tool, build_one, cache_root, fingerprint, go_at_least};

/// The folder of the node tools' modules, one per project.
const NODE_MODULES: &str = "xtask/node-tools";
/// containerd's module (`xtask/node-tools/containerd`).
const CONTAINERD: &str = "xtask/node-tools/containerd";
/// gVisor's module.
const RUNSC: &str = "xtask/node-tools/runsc";
/// The CNI plugins' module.
const CNI: &str = "xtask/node-tools/cni";
/// cri-tools' module.
const CRICTL: &str = "xtask/node-tools/crictl";
/// kube-network-policies' module.
const NETWORK_POLICIES: &str = "xtask/node-tools/kube-network-policies";
/// kube-router's module (its NetworkPolicy controller, where the kernel lacks what
/// kube-network-policies needs).
const KUBE_ROUTER: &str = "xtask/node-tools/kube-router";

/// The directory of the programs inside a node build.
pub(crate) const BIN: &str = "bin";
/// The directory of the CNI plugins inside a node build.
pub(crate) const CNI_BIN: &str = "cni";

/// One binary of the node and the directory of the build it goes to.
#[derive(Clone, Copy, Debug)]
pub(crate) struct NodeTool {
    pub(crate) tool: Tool,
    /// [`BIN`] or [`CNI_BIN`].
    pub(crate) dir: &'static str,
}

const fn node_tool(
    name: &'static str,
    package: &'static str,
    version_args: &'static [&'static str],
    module: &'static str,
    tags: &'static str,
    dir: &'static str,
) -> NodeTool {
    NodeTool {
        tool: Tool {
            name,
            package,
            version_args,
            module,
            build: Build::Static { tags },
        },
        dir,
    }
}

/// Every node binary, in build order (the largest first). An empty `version_args` means the
/// program has no version flag (a CNI plugin prints its version when run without arguments).
pub(crate) const NODE_TOOLS: [NodeTool; 13] = [
    node_tool(
        "kubelet",
        "k8s.io/kubernetes/cmd/kubelet",
        &["--version"],
        MODULE_DIR,
        "",
        BIN,
    ),
    node_tool(
        "kube-proxy",
        "k8s.io/kubernetes/cmd/kube-proxy",
        &["--version"],
        MODULE_DIR,
        "",
        BIN,
    ),
    node_tool(
        "runsc",
        "gvisor.dev/gvisor/runsc",
        &["--version"],
        RUNSC,
        "",
        BIN,
    ),
    node_tool(
        "containerd",
        "github.com/containerd/containerd/v2/cmd/containerd",
        &["--version"],
        CONTAINERD,
        "no_btrfs",
        BIN,
    ),
    node_tool(
        "containerd-shim-runc-v2",
        "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2",
        &["-v"],
        CONTAINERD,
        "no_btrfs",
        BIN,
    ),
    node_tool(
        "ctr",
        "github.com/containerd/containerd/v2/cmd/ctr",
        &["--version"],
        CONTAINERD,
        "no_btrfs",
        BIN,
    ),
    node_tool(
        "crictl",
        "sigs.k8s.io/cri-tools/cmd/crictl",
        &["--version"],
        CRICTL,
        "",
        BIN,
    ),
    node_tool(
        "kube-network-policies",
        "sigs.k8s.io/kube-network-policies/cmd",
        &[],
        NETWORK_POLICIES,
        "",
        BIN,
    ),
    node_tool(
        "kube-router",
        "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router",
        &["--version"],
        KUBE_ROUTER,
        "",
        BIN,
    ),
    node_tool(
        "bridge",
        "github.com/containernetworking/plugins/plugins/main/bridge",
        &[],
        CNI,
        "",
        CNI_BIN,
    ),
    node_tool(
        "host-local",
        "github.com/containernetworking/plugins/plugins/ipam/host-local",
        &[],
        CNI,
        "",
        CNI_BIN,
    ),
    node_tool(
        "portmap",
        "github.com/containernetworking/plugins/plugins/meta/portmap",
        &[],
        CNI,
        "",
        CNI_BIN,
    ),
    node_tool(
        "loopback",
        "github.com/containernetworking/plugins/plugins/main/loopback",
        &[],
        CNI,
        "",
        CNI_BIN,
    ),
];

/// The versions the node modules pin (Kubernetes' is the control plane's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NodePins {
    pub(crate) kubernetes: String,
    pub(crate) containerd: String,
    pub(crate) runsc: String,
    pub(crate) cni: String,
    pub(crate) crictl: String,
    pub(crate) network_policies: String,
    pub(crate) kube_router: String,
}

/// The module each node module pins, with the folder of its `go.mod`.
const PINNED: [(&str, &str); 6] = [
    (CONTAINERD, "github.com/containerd/containerd/v2"),
    (RUNSC, "gvisor.dev/gvisor"),
    (CNI, "github.com/containernetworking/plugins"),
    (CRICTL, "sigs.k8s.io/cri-tools"),
    (NETWORK_POLICIES, "sigs.k8s.io/kube-network-policies"),
    (KUBE_ROUTER, "github.com/cloudnativelabs/kube-router/v2"),
];

/// The version `go_mod` requires of `module`.
pub(crate) fn required(go_mod: &str, module: &str) -> Option<String> {
    go_mod.lines().find_map(|line| {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            [name, version, ..] | ["require", name, version, ..] if *name == module => {
                Some((*version).to_owned())
            }
            _ => None,
        }
    })
}

/// The `go` line of a module.
fn go_line(go_mod: &str) -> Option<&str> {
    go_mod
        .lines()
        .find_map(|line| line.strip_prefix("go ").map(str::trim))
}

/// `-ldflags` stamping each binary with its release, as the projects' release builds do (a
/// module build has no VCS data); a variable a binary does not link is ignored by the linker.
pub(crate) fn node_ldflags(pins: &NodePins) -> String {
    let mut flags = super::kubernetes_stamps(&pins.kubernetes);
    for (variable, version) in [
        (
            "github.com/containerd/containerd/v2/version.Version",
            &pins.containerd,
        ),
        ("gvisor.dev/gvisor/runsc/version.version", &pins.runsc),
        (
            "github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion",
            &pins.cni,
        ),
        ("sigs.k8s.io/cri-tools/pkg/version.Version", &pins.crictl),
        (
            "github.com/cloudnativelabs/kube-router/v2/pkg/version.Version",
            &pins.kube_router,
        ),
    ] {
        flags.push(format!("-X {variable}={version}"));
    }
    flags.push("-s -w".to_owned());
    flags.join(" ")
}

/// The node's binaries, built or found in the cache.
#[derive(Clone, Debug)]
pub(crate) struct NodeToolset {
    pub(crate) pins: NodePins,
    /// The build's directory (`bin/` and `cni/` inside).
    pub(crate) dir: PathBuf,
}

impl NodeToolset {
    /// The directory of the programs (for `PATH`).
    pub(crate) fn bin_dir(&self) -> PathBuf {
        self.dir.join(BIN)
    }

    /// The path of one binary.
    pub(crate) fn path(&self, tool: &NodeTool) -> PathBuf {
        self.dir.join(tool.dir).join(tool.tool.name)
    }
}

fn locate(root: &Path, go: &str) -> Result<(NodePins, String, PathBuf)> {
    let read = |dir: &str, file: &str| {
        std::fs::read(root.join(dir).join(file))
            .with_context(|| format!("failed to read {dir}/{file}"))
    };
    let k8s_mod = read(MODULE_DIR, "go.mod")?;
    let mut inputs = vec![k8s_mod.clone(), read(MODULE_DIR, "go.sum")?];
    let kubernetes = super::pins(&String::from_utf8_lossy(&k8s_mod))?.kubernetes;
    let mut versions = Vec::new();
    let mut needed_go = go_line(&String::from_utf8_lossy(&k8s_mod))
        .unwrap_or("1.0")
        .to_owned();
    for (dir, module) in PINNED {
        let go_mod = read(dir, "go.mod")?;
        let text = String::from_utf8_lossy(&go_mod).into_owned();
        versions.push(
            required(&text, module)
                .with_context(|| format!("{dir}/go.mod must require {module}"))?,
        );
        if let Some(line) = go_line(&text)
            && !go_at_least(&needed_go, line)
        {
            line.clone_into(&mut needed_go);
        }
        inputs.push(go_mod);
        inputs.push(read(dir, "go.sum")?);
    }
    let [
        containerd,
        runsc,
        cni,
        crictl,
        network_policies,
        kube_router,
    ] = <[String; 6]>::try_from(versions).map_err(|_| anyhow::anyhow!("six pins"))?;
    let pins = NodePins {
        kubernetes,
        containerd,
        runsc,
        cni,
        crictl,
        network_policies,
        kube_router,
    };
    let mut parts: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
    parts.push(go.as_bytes());
    // A pseudo-version's date stands for gVisor's release (`v0.0.0-20260905035102-160fafc42237`).
    let runsc_date = pins.runsc.split('-').nth(1).unwrap_or(&pins.runsc);
    let key = format!(
        "node-k8s-{}-containerd-{}-runsc-{runsc_date}-cni-{}-crictl-{}-knp-{}-kube-router-{}-{}",
        pins.kubernetes,
        pins.containerd,
        pins.cni,
        pins.crictl,
        pins.network_policies,
        pins.kube_router,
        fingerprint(&parts)
    );
    Ok((pins, needed_go, cache_root()?.join(key)))
}

/// Builds whatever node binary is missing and returns them. Progress goes to stderr.
pub(crate) fn ensure(root: &Path) -> Result<NodeToolset> {
    let go = super::go_version()?;
    let (pins, needed_go, dir) = locate(root, &go)?;
    if !go_at_least(&go, &needed_go) {
        bail!(
            "Go {go} is too old: the modules of {NODE_MODULES} need Go {needed_go} or newer \
             (install it, or set GOTOOLCHAIN=go{needed_go} to let the go command fetch that \
             toolchain through the module proxy)"
        );
    }
    let toolset = NodeToolset {
        pins,
        dir: dir.clone(),
    };
    if NODE_TOOLS.iter().all(|tool| toolset.path(tool).is_file()) {
        return Ok(toolset);
    }
    let parent = dir
        .parent()
        .context("the tools cache directory has no parent")?;
    std::fs::create_dir_all(parent)
        .with_context(|| format!("failed to create {}", parent.display()))?;
    let staging = tempfile::Builder::new()
        .prefix(".building-node-")
        .tempdir_in(parent)
        .with_context(|| format!("failed to create a build directory in {}", parent.display()))?;
    let pins = &toolset.pins;
    eprintln!(
        "building the node's binaries (kubelet {}, containerd {}, runsc {}, CNI plugins {}, \
         crictl {}, kube-network-policies {}, kube-router {}) from their Go modules (Go {go}) \
         into {}",
        pins.kubernetes,
        pins.containerd,
        pins.runsc,
        pins.cni,
        pins.crictl,
        pins.network_policies,
        pins.kube_router,
        dir.display()
    );
    eprintln!(
        "  the first build on a machine takes about 12 minutes on 2 cores; later ones reuse \
         Go's build cache"
    );
    let ldflags = node_ldflags(pins);
    let started = Instant::now();
    for (index, tool) in NODE_TOOLS.iter().enumerate() {
        build_one(
            &root.join(tool.tool.module),
            &tool.tool,
            &staging.path().join(tool.dir),
            &ldflags,
            (index, NODE_TOOLS.len()),
        )?;
    }
    let staged = staging.keep();
    // Another build may have finished first; its result is as good as ours.
    if let Err(error) = std::fs::rename(&staged, &dir) {
        let _ = std::fs::remove_dir_all(&staged);
        if !toolset.path(&NODE_TOOLS[0]).is_file() {
            return Err(error)
                .with_context(|| format!("failed to move the build to {}", dir.display()));
        }
    }
    eprintln!("built in {:.0} s", started.elapsed().as_secs_f64());
    Ok(toolset)
}

/// The first line `tool` prints of its version (a CNI plugin's when run without arguments).
pub(crate) fn version_line(toolset: &NodeToolset, tool: &NodeTool) -> Result<String> {
    let path = toolset.path(tool);
    if tool.dir == BIN && tool.tool.version_args.is_empty() {
        return Ok("no version flag".to_owned());
    }
    let output = std::process::Command::new(&path)
        .args(tool.tool.version_args)
        .stdin(std::process::Stdio::null())
        .output()
        .with_context(|| format!("failed to run {}", path.display()))?;
    let text = if output.stdout.is_empty() {
        output.stderr
    } else {
        output.stdout
    };
    Ok(String::from_utf8_lossy(&text)
        .lines()
        .next()
        .unwrap_or_default()
        .trim()
        .to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn every_node_module_pins_its_project_and_lists_what_is_built_from_it() {
        let root = crate::workspace_root();
        for (dir, module) in PINNED {
            let text = std::fs::read_to_string(root.join(dir).join("go.mod")).unwrap();
            let version = required(&text, module).unwrap();
            assert!(version.starts_with('v'), "{dir}: {version}");
            assert!(!root.join(dir).join("vendor").exists(), "{dir} is vendored");
            for tool in NODE_TOOLS.iter().filter(|tool| tool.tool.module == dir) {
                assert!(
                    text.contains(tool.tool.package),
                    "{dir}/go.mod has no tool directive for {}",
                    tool.tool.package
                );
            }
        }
        let k8s = std::fs::read_to_string(root.join(MODULE_DIR).join("go.mod")).unwrap();
        assert!(k8s.contains("\tk8s.io/kubernetes/cmd/kubelet\n"), "{k8s}");
    }

    #[test]
    fn every_node_binary_is_static_and_only_containerd_has_tags() {
        for tool in NODE_TOOLS {
            let expected = if tool.tool.module == CONTAINERD {
                "no_btrfs"
            } else {
                ""
            };
            assert_eq!(tool.tool.build, Build::Static { tags: expected });
        }
    }

    #[test]
    fn the_stamp_names_each_release_and_not_helm() {
        let pins = NodePins {
            kubernetes: "v1.37.2".to_owned(),
            containerd: "v2.4.2".to_owned(),
            runsc: "v0.0.0-20260905035102-160fafc42237".to_owned(),
            cni: "v1.10.0".to_owned(),
            crictl: "v1.37.0".to_owned(),
            network_policies: "v0.8.0".to_owned(),
            kube_router: "v2.1.0".to_owned(),
        };
        let flags = node_ldflags(&pins);
        assert!(flags.contains("-X github.com/containerd/containerd/v2/version.Version=v2.4.2"));
        assert!(flags.contains("-X k8s.io/component-base/version.gitVersion=v1.37.2"));
        assert!(flags.contains("buildversion.BuildVersion=v1.10.0"));
        assert!(flags.ends_with("-s -w"), "{flags}");
        assert!(!flags.contains("helm"), "{flags}");
    }

    #[test]
    fn required_versions_are_read_from_lines_and_blocks() {
        let text = "module x\n\ngo 1.26.0\n\nrequire gvisor.dev/gvisor v0.0.0-2026 // indirect\n\
                    require (\n\tsigs.k8s.io/cri-tools v1.37.0 // indirect\n)\n";
        assert_eq!(
            required(text, "gvisor.dev/gvisor").as_deref(),
            Some("v0.0.0-2026")
        );
        assert_eq!(
            required(text, "sigs.k8s.io/cri-tools").as_deref(),
            Some("v1.37.0")
        );
        assert_eq!(required(text, "sigs.k8s.io/cri"), None);
        assert_eq!(go_line(text), Some("1.26.0"));
    }
}
