//! `cargo xtask tools`: the real Kubernetes control plane for the control-plane test tier
//! (`kube-apiserver`, `kube-controller-manager`, `kube-scheduler`, `kubectl`) and `etcd`, built
//! from their Go modules as pinned in `xtask/k8s-tools/go.mod`, and `helm` (the chart's checks),
//! pinned in a module of its own, `xtask/helm-tool/go.mod`, so that its dependencies never move
//! the Kubernetes binaries'.
//!
//! The binaries go into a cache directory keyed by the pinned versions and a hash of the
//! module files and the Go version (`$AGENT_SANDBOX_TOOLS_DIR`, else
//! `$XDG_CACHE_HOME/agent-sandbox/k8s-tools`, else `~/.cache/agent-sandbox/k8s-tools`), so they
//! are built once per machine; a build goes to a temporary directory that is renamed into place
//! only when every binary built, so an interrupted build is never mistaken for a finished one.
//! Nothing is downloaded except by `go build` through the Go module proxy.

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

pub(crate) mod node;

/// The folder of the Go tools module, relative to the workspace root.
pub(crate) const MODULE_DIR: &str = "xtask/k8s-tools";
/// The folder of Helm's tools module.
pub(crate) const HELM_MODULE_DIR: &str = "xtask/helm-tool";
/// Helm's module path, whose `require` line pins its version.
const HELM_MODULE: &str = "helm.sh/helm/v4";

/// One binary the tools module builds.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tool {
    /// File name in the cache directory.
    pub(crate) name: &'static str,
    /// Go package of its `main`.
    package: &'static str,
    /// Arguments that print its version.
    version_args: &'static [&'static str],
    /// The tools module it is built in.
    pub(crate) module: &'static str,
    /// How it is built: `CGO_ENABLED` and build tags.
    pub(crate) build: Build,
}

/// How `go build` builds a tool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Build {
    /// With the environment's defaults (the control plane, as it has always been built).
    Default,
    /// A static binary (`CGO_ENABLED=0`) with these build tags (comma-separated, may be empty).
    Static { tags: &'static str },
}

/// Every binary, in build order (the API server first: it is the largest and shares most
/// packages with the others).
pub(crate) const TOOLS: [Tool; 6] = [
    Tool {
        name: "kube-apiserver",
        package: "k8s.io/kubernetes/cmd/kube-apiserver",
        version_args: &["--version"],
        module: MODULE_DIR,
        build: Build::Default,
    },
    Tool {
        name: "kube-controller-manager",
        package: "k8s.io/kubernetes/cmd/kube-controller-manager",
        version_args: &["--version"],
        module: MODULE_DIR,
        build: Build::Default,
    },
    Tool {
        name: "kube-scheduler",
        package: "k8s.io/kubernetes/cmd/kube-scheduler",
        version_args: &["--version"],
        module: MODULE_DIR,
        build: Build::Default,
    },
    Tool {
        name: "kubectl",
        package: "k8s.io/kubernetes/cmd/kubectl",
        version_args: &["version", "--client"],
        module: MODULE_DIR,
        build: Build::Default,
    },
    Tool {
        name: "etcd",
        package: "go.etcd.io/etcd/server/v3",
        version_args: &["--version"],
        module: MODULE_DIR,
        build: Build::Default,
    },
    Tool {
        name: "helm",
        package: "helm.sh/helm/v4/cmd/helm",
        version_args: &["version", "--short"],
        module: HELM_MODULE_DIR,
        build: Build::Default,
    },
];

/// The versions `go.mod` pins.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Pins {
    /// `k8s.io/kubernetes`, e.g. `v1.37.2`.
    pub(crate) kubernetes: String,
    /// `go.etcd.io/etcd/server/v3`, e.g. `v3.7.0`.
    pub(crate) etcd: String,
    /// The module's `go` line, e.g. `1.26.0`.
    pub(crate) go: String,
}

/// The Helm version `xtask/helm-tool/go.mod` pins (`v4.3.2`).
pub(crate) fn helm_pin(go_mod: &str) -> Result<String> {
    go_mod
        .lines()
        .find_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                [module, version, ..] | ["require", module, version, ..]
                    if *module == HELM_MODULE =>
                {
                    Some((*version).to_owned())
                }
                _ => None,
            }
        })
        .with_context(|| format!("{HELM_MODULE_DIR}/go.mod must require {HELM_MODULE}"))
}

/// Reads the pins from the text of `go.mod`.
pub(crate) fn pins(go_mod: &str) -> Result<Pins> {
    let mut kubernetes = None;
    let mut etcd = None;
    let mut go = None;
    for line in go_mod.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["go", version] => go = Some((*version).to_owned()),
            ["k8s.io/kubernetes", version, ..] | ["require", "k8s.io/kubernetes", version, ..] => {
                kubernetes = Some((*version).to_owned());
            }
            ["go.etcd.io/etcd/server/v3", version, ..]
            | ["require", "go.etcd.io/etcd/server/v3", version, ..] => {
                etcd = Some((*version).to_owned());
            }
            _ => {}
        }
    }
    match (kubernetes, etcd, go) {
        (Some(kubernetes), Some(etcd), Some(go)) => Ok(Pins {
            kubernetes,
            etcd,
            go,
        }),
        _ => bail!(
            "{MODULE_DIR}/go.mod must require k8s.io/kubernetes and go.etcd.io/etcd/server/v3 and \
             have a go line"
        ),
    }
}

/// `-ldflags` that stamp the Kubernetes binaries with their release (a module build has no git
/// metadata, so they would report `v0.0.0-master`), as the release build scripts do.
pub(crate) fn version_ldflags(kubernetes: &str, helm: &str) -> String {
    let mut flags = kubernetes_stamps(kubernetes);
    // Helm's release builds stamp it the same way (its Makefile); a package a binary does not
    // link is ignored by the linker.
    flags.push(format!(
        "-X helm.sh/helm/v4/internal/version.version={helm}"
    ));
    flags.push("-X helm.sh/helm/v4/internal/version.gitTreeState=clean".to_owned());
    flags.push("-s -w".to_owned());
    flags.join(" ")
}

/// The `-X` flags that stamp a Kubernetes binary with its release.
pub(crate) fn kubernetes_stamps(kubernetes: &str) -> Vec<String> {
    let mut parts = kubernetes.trim_start_matches('v').split('.');
    let major = parts.next().unwrap_or("0");
    let minor = parts.next().unwrap_or("0");
    let mut flags = Vec::new();
    for package in [
        "k8s.io/component-base/version",
        "k8s.io/client-go/pkg/version",
    ] {
        flags.push(format!("-X {package}.gitVersion={kubernetes}"));
        flags.push(format!("-X {package}.gitMajor={major}"));
        flags.push(format!("-X {package}.gitMinor={minor}"));
        flags.push(format!("-X {package}.gitTreeState=clean"));
    }
    flags
}

/// The directory under which every version's build is kept.
pub(crate) fn cache_root() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("AGENT_SANDBOX_TOOLS_DIR").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(dir).join("agent-sandbox/k8s-tools"));
    }
    match std::env::var_os("HOME").filter(|v| !v.is_empty()) {
        Some(home) => Ok(PathBuf::from(home).join(".cache/agent-sandbox/k8s-tools")),
        None => bail!(
            "no cache directory for the Kubernetes tools: set AGENT_SANDBOX_TOOLS_DIR (or HOME)"
        ),
    }
}

/// FNV-1a over the module files and the Go version: a new pin, a new `go.sum` or another Go
/// makes a new directory.
pub(crate) fn fingerprint(parts: &[&[u8]]) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for byte in part.iter().chain(std::iter::once(&0xff)) {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{hash:016x}")
}

/// The binaries, built or found in the cache.
#[derive(Clone, Debug)]
pub(crate) struct Toolset {
    pub(crate) pins: Pins,
    /// The Helm version.
    pub(crate) helm: String,
    /// The directory holding every binary of [`TOOLS`].
    pub(crate) bin_dir: PathBuf,
}

impl Toolset {
    /// The path of one binary.
    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.bin_dir.join(name)
    }
}

/// `go version`'s version (`1.26.8`), or the one-line reason there is no usable Go.
pub(crate) fn go_version() -> Result<String> {
    let missing = "the Go toolchain is missing: `go` is not on PATH. Install Go 1.26 or newer \
                   (https://go.dev/doc/install; Debian: apt-get install golang-go from bookworm-backports) \
                   and run `cargo xtask tools` again";
    let output = match Command::new("go").args(["env", "GOVERSION"]).output() {
        Ok(output) => output,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => bail!("{missing}"),
        Err(error) => return Err(error).context("failed to run `go env GOVERSION`"),
    };
    if !output.status.success() {
        bail!(
            "`go env GOVERSION` failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout)
        .trim()
        .trim_start_matches("go")
        .to_owned())
}

/// Whether Go `have` (`1.26.8`) is at least `need` (`1.26.0`).
pub(crate) fn go_at_least(have: &str, need: &str) -> bool {
    let parse = |v: &str| -> Vec<u64> {
        v.split(|c: char| !c.is_ascii_digit())
            .take(3)
            .map(|n| n.parse().unwrap_or(0))
            .collect()
    };
    parse(have) >= parse(need)
}

fn locate(root: &Path, go: &str) -> Result<(Pins, String, PathBuf)> {
    let read = |dir: &str, file: &str| {
        std::fs::read(root.join(dir).join(file))
            .with_context(|| format!("failed to read {dir}/{file}"))
    };
    let go_mod = read(MODULE_DIR, "go.mod")?;
    let go_sum = read(MODULE_DIR, "go.sum")?;
    let helm_mod = read(HELM_MODULE_DIR, "go.mod")?;
    let helm_sum = read(HELM_MODULE_DIR, "go.sum")?;
    let pins = pins(&String::from_utf8_lossy(&go_mod))?;
    let helm = helm_pin(&String::from_utf8_lossy(&helm_mod))?;
    let key = format!(
        "k8s-{}-etcd-{}-helm-{}-{}",
        pins.kubernetes,
        pins.etcd,
        helm,
        fingerprint(&[&go_mod, &go_sum, &helm_mod, &helm_sum, go.as_bytes()])
    );
    Ok((pins, helm, cache_root()?.join(key)))
}

/// Builds whatever is missing and returns the binaries. Progress goes to stderr.
pub(crate) fn ensure(root: &Path) -> Result<Toolset> {
    let go = go_version()?;
    let (pins, helm, dir) = locate(root, &go)?;
    if !go_at_least(&go, &pins.go) {
        bail!(
            "Go {go} is too old: {MODULE_DIR}/go.mod needs Go {} or newer (install it, or set \
             GOTOOLCHAIN=go{} to let the go command fetch that toolchain through the module proxy)",
            pins.go,
            pins.go
        );
    }
    let bin_dir = dir.join("bin");
    if TOOLS.iter().all(|tool| bin_dir.join(tool.name).is_file()) {
        gateway_api_crds(&dir)?;
        return Ok(Toolset {
            pins,
            helm,
            bin_dir,
        });
    }
    let parent = dir
        .parent()
        .context("the tools cache directory has no parent")?;
    std::fs::create_dir_all(parent)
        .with_context(|| format!("failed to create {}", parent.display()))?;
    let staging = tempfile::Builder::new()
        .prefix(".building-")
        .tempdir_in(parent)
        .with_context(|| format!("failed to create a build directory in {}", parent.display()))?;
    eprintln!(
        "building Kubernetes {}, etcd {} and Helm {helm} from their Go modules (Go {go}) into {}",
        pins.kubernetes,
        pins.etcd,
        dir.display()
    );
    eprintln!(
        "  the first build on a machine takes about 15 minutes on 2 cores; later ones reuse Go's \
         build cache"
    );
    let ldflags = version_ldflags(&pins.kubernetes, &helm);
    let started = Instant::now();
    for (index, tool) in TOOLS.iter().enumerate() {
        build_one(
            &root.join(tool.module),
            tool,
            &staging.path().join("bin"),
            &ldflags,
            (index, TOOLS.len()),
        )?;
    }
    // Another build may have finished first; its result is as good as ours.
    let staged = staging.keep();
    if let Err(error) = std::fs::rename(&staged, &dir) {
        let _ = std::fs::remove_dir_all(&staged);
        if !bin_dir.join(TOOLS[0].name).is_file() {
            return Err(error)
                .with_context(|| format!("failed to move the build to {}", dir.display()));
        }
    }
    eprintln!("built in {:.0} s", started.elapsed().as_secs_f64());
    gateway_api_crds(&dir)?;
    Ok(Toolset {
        pins,
        helm,
        bin_dir,
    })
}

/// The Gateway API module whose standard CRDs the control-plane tier installs (so that the
/// SDK's Gateway mode runs there), fetched through the Go module proxy.
pub(crate) const GATEWAY_API: (&str, &str) = ("sigs.k8s.io/gateway-api", "v1.6.3");
/// The CRDs taken from it (`config/crd/standard/`).
const GATEWAY_API_CRDS: [&str; 2] = [
    "gateway.networking.k8s.io_gatewayclasses.yaml",
    "gateway.networking.k8s.io_gateways.yaml",
];

/// Puts [`GATEWAY_API_CRDS`] in `<dir>/gateway-api/` (next to `bin/`) unless they are there.
fn gateway_api_crds(dir: &Path) -> Result<()> {
    let out = dir.join("gateway-api");
    if GATEWAY_API_CRDS.iter().all(|name| out.join(name).is_file()) {
        return Ok(());
    }
    let (module, version) = GATEWAY_API;
    eprintln!("fetching the Gateway API CRDs ({module} {version}) through the Go module proxy");
    let output = Command::new("go")
        .args(["mod", "download", "-json", &format!("{module}@{version}")])
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .context("failed to start `go mod download`")?;
    if !output.status.success() {
        bail!(
            "`go mod download {module}@{version}` failed: {}{}",
            String::from_utf8_lossy(&output.stdout).trim(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    let answer: serde_json::Value = serde_json::from_slice(&output.stdout)
        .context("`go mod download -json` printed no JSON")?;
    let source = answer
        .get("Dir")
        .and_then(serde_json::Value::as_str)
        .map(PathBuf::from)
        .context("`go mod download -json` named no directory")?
        .join("config/crd/standard");
    std::fs::create_dir_all(&out).with_context(|| format!("failed to create {}", out.display()))?;
    for name in GATEWAY_API_CRDS {
        std::fs::copy(source.join(name), out.join(name))
            .with_context(|| format!("failed to copy {name} from {}", source.display()))?;
    }
    Ok(())
}

/// `go build -v` of one tool (the `index`th of `total`) into `out`, with a progress line every
/// 15 s (packages compiled so far) and the compiler's own messages on failure.
pub(crate) fn build_one(
    module: &Path,
    tool: &Tool,
    out: &Path,
    ldflags: &str,
    (index, total): (usize, usize),
) -> Result<()> {
    eprintln!("  [{}/{total}] {}", index + 1, tool.name);
    let started = Instant::now();
    let mut command = Command::new("go");
    command
        .current_dir(module)
        .args(["build", "-v", "-trimpath", "-ldflags", ldflags]);
    if let Build::Static { tags } = tool.build {
        command.env("CGO_ENABLED", "0");
        if !tags.is_empty() {
            command.args(["-tags", tags]);
        }
    }
    let mut child = command
        .arg("-o")
        .arg(out.join(tool.name))
        .arg(tool.package)
        // The module's go.sum is complete: a build must not rewrite it.
        .env("GOFLAGS", "-mod=readonly")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("failed to start `go build`")?;
    let stderr = child.stderr.take().context("no stderr from `go build`")?;
    let mut packages: usize = 0;
    let mut messages = Vec::new();
    let mut last_report = Instant::now();
    for line in BufReader::new(stderr).lines() {
        let line = line.context("failed to read `go build`'s output")?;
        // `-v` names each package as it is compiled; everything else is a message.
        if !line.is_empty() && !line.contains(char::is_whitespace) && !line.starts_with('#') {
            packages += 1;
        } else {
            messages.push(line);
        }
        if last_report.elapsed() >= Duration::from_secs(15) {
            eprintln!(
                "        {packages} packages compiled, {:.0} s",
                started.elapsed().as_secs_f64()
            );
            last_report = Instant::now();
        }
    }
    let status = child.wait().context("failed to wait for `go build`")?;
    if !status.success() {
        let tail: Vec<&String> = messages.iter().rev().take(30).collect();
        let tail: Vec<&str> = tail.into_iter().rev().map(String::as_str).collect();
        bail!(
            "`go build {}` in {} failed ({status}):\n{}",
            tool.package,
            tool.module,
            tail.join("\n")
        );
    }
    eprintln!(
        "        done in {:.0} s ({packages} packages compiled)",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The first line a binary prints of its version.
pub(crate) fn version_line(toolset: &Toolset, tool: &Tool) -> Result<String> {
    let path = toolset.path(tool.name);
    let output = Command::new(&path)
        .args(tool.version_args)
        .output()
        .with_context(|| format!("failed to run {}", path.display()))?;
    let text = String::from_utf8_lossy(&output.stdout);
    Ok(text.lines().next().unwrap_or_default().trim().to_owned())
}

/// `cargo xtask tools [--node]`: builds what is missing, then prints each binary's path and
/// version (or only the directories, for `PATH`: with `node`, the node's programs first, then
/// the control plane's, joined by `:`).
pub(crate) fn run(root: &Path, print_bin_dir: bool, with_node: bool) -> Result<()> {
    let toolset = ensure(root)?;
    let node_toolset = with_node.then(|| node::ensure(root)).transpose()?;
    if print_bin_dir {
        match &node_toolset {
            Some(node) => println!("{}:{}", node.bin_dir().display(), toolset.bin_dir.display()),
            None => println!("{}", toolset.bin_dir.display()),
        }
        return Ok(());
    }
    println!(
        "Kubernetes {}, etcd {}, Helm {} in {}",
        toolset.pins.kubernetes,
        toolset.pins.etcd,
        toolset.helm,
        toolset.bin_dir.display()
    );
    for tool in &TOOLS {
        println!(
            "{:<24} {}  ({})",
            tool.name,
            toolset.path(tool.name).display(),
            version_line(&toolset, tool)?
        );
    }
    if let Some(node) = node_toolset {
        let pins = &node.pins;
        println!(
            "node: kubelet {}, containerd {}, runsc {}, CNI plugins {}, crictl {}, \
             kube-network-policies {}, kube-router {} in {}",
            pins.kubernetes,
            pins.containerd,
            pins.runsc,
            pins.cni,
            pins.crictl,
            pins.network_policies,
            pins.kube_router,
            node.dir.display()
        );
        for tool in &node::NODE_TOOLS {
            println!(
                "{:<24} {}  ({})",
                tool.tool.name,
                node.path(tool).display(),
                node::version_line(&node, tool)?
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn the_committed_module_pins_kubernetes_and_etcd() {
        let root = crate::workspace_root();
        let text = std::fs::read_to_string(root.join(MODULE_DIR).join("go.mod")).unwrap();
        let pins = pins(&text).unwrap();
        assert!(pins.kubernetes.starts_with("v1."), "{pins:?}");
        assert!(pins.etcd.starts_with("v3."), "{pins:?}");
        // Every staging module is replaced by the same release's v0 version.
        let minor_patch = pins.kubernetes.trim_start_matches("v1.");
        let replaces: Vec<&str> = text
            .lines()
            .filter(|line| line.starts_with("replace k8s.io/"))
            .collect();
        assert!(replaces.len() > 20, "{replaces:?}");
        for line in replaces {
            assert!(
                line.ends_with(&format!(" v0.{minor_patch}")),
                "{line} does not match k8s.io/kubernetes {}",
                pins.kubernetes
            );
        }
        // Nothing vendored.
        assert!(!root.join(MODULE_DIR).join("vendor").exists());
    }

    #[test]
    fn the_helm_module_pins_helm_and_nothing_else_is_built_from_it() {
        let root = crate::workspace_root();
        let text = std::fs::read_to_string(root.join(HELM_MODULE_DIR).join("go.mod")).unwrap();
        let helm = helm_pin(&text).unwrap();
        assert!(helm.starts_with("v4."), "{helm}");
        assert!(text.contains("tool helm.sh/helm/v4/cmd/helm"), "{text}");
        assert!(!root.join(HELM_MODULE_DIR).join("vendor").exists());
        let built: Vec<&str> = TOOLS
            .iter()
            .filter(|tool| tool.module == HELM_MODULE_DIR)
            .map(|tool| tool.name)
            .collect();
        assert_eq!(built, ["helm"]);
        assert!(helm_pin("module x\ngo 1.26.0\n").is_err());
    }

    #[test]
    fn pins_are_read_from_require_blocks_and_lines() {
        let text = "module x\n\ngo 1.26.0\n\nrequire k8s.io/kubernetes v1.37.2 // indirect\n\
                    require (\n\tgo.etcd.io/etcd/server/v3 v3.7.0 // indirect\n)\n";
        assert_eq!(
            pins(text).unwrap(),
            Pins {
                kubernetes: "v1.37.2".to_owned(),
                etcd: "v3.7.0".to_owned(),
                go: "1.26.0".to_owned()
            }
        );
        let error = pins("module x\ngo 1.26.0\n").unwrap_err().to_string();
        assert!(error.contains("k8s.io/kubernetes"), "{error}");
    }

    #[test]
    fn version_stamp_names_the_release() {
        let flags = version_ldflags("v1.37.2", "v4.3.2");
        assert!(flags.contains("-X k8s.io/component-base/version.gitVersion=v1.37.2"));
        assert!(flags.contains("-X helm.sh/helm/v4/internal/version.version=v4.3.2"));
        assert!(flags.contains("-X k8s.io/client-go/pkg/version.gitMinor=37"));
    }

    #[test]
    fn go_versions_compare_numerically() {
        assert!(go_at_least("1.26.8", "1.26.0"));
        assert!(go_at_least("1.27", "1.26.0"));
        assert!(!go_at_least("1.9.2", "1.26.0"));
        assert!(!go_at_least("1.25.12", "1.26"));
    }

    #[test]
    fn fingerprints_change_with_any_input() {
        let a = fingerprint(&[b"mod", b"sum", b"1.26.8"]);
        assert_eq!(a, fingerprint(&[b"mod", b"sum", b"1.26.8"]));
        assert_ne!(a, fingerprint(&[b"mod", b"sum", b"1.26.9"]));
        assert_ne!(a, fingerprint(&[b"mo", b"dsum", b"1.26.8"]));
    }
}
