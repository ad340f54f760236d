//! `cargo xtask cluster up|down`: a kind cluster with Cilium as the CNI and Flux delivering
//! `deploy/`, the way the seed article's demo does, from this checkout.
//!
//! `up` is idempotent: each step first looks whether its result exists. What `up` created (the
//! cluster, the local registry, the Cilium and Flux installs) is recorded in
//! `target/xtask-cluster/<name>.json`, and `down` deletes exactly that.
//!
//! None of this can run on machines without Docker and the internet (ours); the commands follow
//! the documented flags of kind, cilium-cli, flux and kubectl, and the offline checks
//! (`manifests`) cover everything it applies.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, Result, bail};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::images::{self, run, show};

/// A tool `up` needs, and how to install it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tool {
    pub(crate) name: &'static str,
    pub(crate) why: &'static str,
    pub(crate) install: &'static str,
}

/// Every tool, in the order `up` uses them.
pub(crate) const TOOLS: [Tool; 5] = [
    Tool {
        name: "docker",
        why: "runs the kind nodes and builds the images",
        install: "https://docs.docker.com/engine/install/ (Docker Desktop on macOS); start the daemon",
    },
    Tool {
        name: "kind",
        why: "creates the cluster",
        install: "`go install sigs.k8s.io/kind@latest`, or a binary from https://kind.sigs.k8s.io/docs/user/quick-start/#installation",
    },
    Tool {
        name: "kubectl",
        why: "applies manifests and waits for readiness",
        install: "https://kubernetes.io/docs/tasks/tools/ (Debian: `apt-get install kubernetes-client`)",
    },
    Tool {
        name: "cilium",
        why: "installs Cilium, the CNI that enforces the sandboxes' NetworkPolicies",
        install: "the Cilium CLI: https://docs.cilium.io/en/stable/gettingstarted/k8s-install-default/#install-the-cilium-cli",
    },
    Tool {
        name: "flux",
        why: "installs Flux and pushes the manifests (not needed with --no-flux)",
        install: "`curl -s https://fluxcd.io/install.sh | sudo bash` or `brew install fluxcd/tap/flux` (https://fluxcd.io/flux/installation/)",
    },
];

/// Cilium version installed by `up` (a release the cilium CLI can install; override with
/// `--cilium-version`).
pub(crate) const CILIUM_VERSION: &str = "1.17.4";

/// The local registry container that serves the manifests artifact to Flux (kind's documented
/// local-registry pattern: a `registry:2` container on the `kind` Docker network).
pub(crate) const REGISTRY_NAME: &str = "kind-registry";
/// Host port of the local registry (bound to 127.0.0.1 only).
pub(crate) const REGISTRY_HOST_PORT: u16 = 5001;
/// The artifact `flux push artifact` writes and `flux/kind/source.yaml` reads.
pub(crate) const ARTIFACT: &str = "agent-sandbox/manifests:local";

/// Options of `cluster up`.
#[derive(Clone, Debug)]
pub(crate) struct UpOptions {
    pub(crate) name: String,
    pub(crate) no_flux: bool,
    pub(crate) skip_images: bool,
    pub(crate) cilium_version: String,
}

/// What `up` created, so that `down` deletes exactly that.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
pub(crate) struct State {
    pub(crate) cluster_created: bool,
    pub(crate) registry_created: bool,
    pub(crate) cilium_installed: bool,
    pub(crate) flux_installed: bool,
    /// `flux` or `direct`: how `deploy/` was applied.
    pub(crate) delivery: Option<String>,
}

fn state_path(root: &Path, name: &str) -> PathBuf {
    root.join("target")
        .join("xtask-cluster")
        .join(format!("{name}.json"))
}

fn load_state(root: &Path, name: &str) -> Result<Option<State>> {
    let path = state_path(root, name);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            Ok(Some(serde_json::from_str(&text).with_context(|| {
                format!("failed to parse {}", path.display())
            })?))
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(error).with_context(|| format!("failed to read {}", path.display())),
    }
}

fn save_state(root: &Path, name: &str, state: &State) -> Result<()> {
    let path = state_path(root, name);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&path, serde_json::to_string_pretty(state)?)
        .with_context(|| format!("failed to write {}", path.display()))
}

/// An executable named `name` in `path_var` (a `PATH` value).
pub(crate) fn find_tool(name: &str, path_var: &std::ffi::OsStr) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    std::env::split_paths(path_var)
        .map(|dir| dir.join(name))
        .find(|candidate| {
            std::fs::metadata(candidate)
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// The tools `up` needs that are missing (or, for docker, whose daemon does not answer), as a
/// one-screen message; `None` when everything is there.
pub(crate) fn missing_tools(path_var: &std::ffi::OsStr, no_flux: bool) -> Option<String> {
    let mut missing = Vec::new();
    for tool in TOOLS {
        if no_flux && tool.name == "flux" {
            continue;
        }
        match find_tool(tool.name, path_var) {
            None => missing.push((tool, "not found on PATH")),
            Some(path) if tool.name == "docker" => {
                let answers = Command::new(&path)
                    .args(["info", "--format", "{{.ServerVersion}}"])
                    .env("PATH", path_var)
                    .output()
                    .is_ok_and(|o| o.status.success());
                if !answers {
                    missing.push((
                        tool,
                        "installed, but its daemon does not answer `docker info`",
                    ));
                }
            }
            Some(_) => {}
        }
    }
    if missing.is_empty() {
        return None;
    }
    let mut message = String::from("cargo xtask cluster up needs tools this machine lacks:\n\n");
    for (tool, problem) in &missing {
        message.push_str(&format!(
            "  {:<8} {problem}\n           needed: {}\n           install: {}\n",
            tool.name, tool.why, tool.install
        ));
    }
    message.push_str(
        "\nInstall them and run `cargo xtask cluster up` again (add --no-flux to skip Flux).\n\
         Without Docker, everything else still runs on the simulated cluster: `cargo test --workspace`.",
    );
    Some(message)
}

/// A command that may fail without that being an error (existence probes); true on success.
fn probe(command: &mut Command) -> bool {
    command
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn output(command: &mut Command) -> Result<String> {
    let out = command
        .output()
        .with_context(|| format!("failed to start `{}`", show(command)))?;
    if !out.status.success() {
        bail!(
            "`{}` failed: {}",
            show(command),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn kubectl(context: &str) -> Command {
    let mut command = Command::new("kubectl");
    command.args(["--context", context]);
    command
}

/// `cargo xtask cluster up`.
pub(crate) fn up(root: &Path, options: &UpOptions) -> Result<()> {
    let path_var = std::env::var_os("PATH").unwrap_or_default();
    if let Some(message) = missing_tools(&path_var, options.no_flux) {
        bail!("{message}");
    }
    let name = &options.name;
    let context = format!("kind-{name}");
    let mut state = load_state(root, name)?.unwrap_or_default();

    // 1. The cluster (kind's CNI off: kind/cluster.yaml).
    let clusters = output(Command::new("kind").args(["get", "clusters"]))?;
    if clusters.lines().any(|line| line.trim() == name) {
        eprintln!("cluster {name} exists; reusing it");
    } else {
        run(Command::new("kind").current_dir(root).args([
            "create",
            "cluster",
            "--name",
            name,
            "--config",
            "kind/cluster.yaml",
        ]))?;
        state.cluster_created = true;
        save_state(root, name, &state)?;
    }

    // 2. Cilium, the first chicken-and-egg install: nothing schedules without a CNI.
    if probe(kubectl(&context).args(["-n", "kube-system", "get", "daemonset", "cilium"])) {
        eprintln!("Cilium is installed; checking it");
    } else {
        run(Command::new("cilium").args([
            "install",
            "--context",
            &context,
            "--version",
            &options.cilium_version,
        ]))?;
        state.cilium_installed = true;
        save_state(root, name, &state)?;
    }
    run(Command::new("cilium").args([
        "status",
        "--context",
        &context,
        "--wait",
        "--wait-duration",
        "10m",
    ]))?;

    // 3. Flux, the second one.
    if !options.no_flux {
        if probe(kubectl(&context).args(["get", "namespace", "flux-system"])) {
            eprintln!("Flux is installed; checking it");
        } else {
            run(Command::new("flux").args(["install", "--context", &context]))?;
            state.flux_installed = true;
            save_state(root, name, &state)?;
        }
        run(Command::new("flux").args(["check", "--context", &context]))?;
    }

    // 4. Images, built here and loaded into the nodes (never pulled: IfNotPresent, tag dev).
    let references: Vec<String> = images::IMAGES
        .iter()
        .map(|image| format!("{}:{}", image.local, images::DEV_TAG))
        .collect();
    if !options.skip_images {
        images::build(root, &images::Options::dev())?;
    }
    run(Command::new("kind")
        .args(["load", "docker-image", "--name", name])
        .args(&references))?;

    // 5. The router's signing key: per cluster, random, never in Git.
    ensure_signing_key(&context)?;

    // 6. Deliver deploy/.
    if options.no_flux {
        run(kubectl(&context).current_dir(root).args([
            "apply",
            "--server-side",
            "-k",
            "deploy/crds",
        ]))?;
        run(kubectl(&context).args([
            "wait",
            "--for",
            "condition=Established",
            "--timeout",
            "60s",
            "crd/sandboxes.agents.x-k8s.io",
            "crd/sandboxtemplates.extensions.agents.x-k8s.io",
            "crd/sandboxwarmpools.extensions.agents.x-k8s.io",
            "crd/sandboxclaims.extensions.agents.x-k8s.io",
        ]))?;
        run(kubectl(&context).current_dir(root).args([
            "apply",
            "--server-side",
            "-k",
            "deploy/overlays/kind",
        ]))?;
        state.delivery = Some("direct".to_owned());
    } else {
        if ensure_registry()? {
            state.registry_created = true;
            save_state(root, name, &state)?;
        }
        push_manifests(root)?;
        run(kubectl(&context)
            .current_dir(root)
            .args(["apply", "-k", "flux/kind"]))?;
        run(Command::new("flux").args([
            "reconcile",
            "source",
            "oci",
            "agent-sandbox",
            "--namespace",
            "flux-system",
            "--context",
            &context,
        ]))?;
        state.delivery = Some("flux".to_owned());
        save_state(root, name, &state)?;
        run(kubectl(&context).args([
            "-n",
            "flux-system",
            "wait",
            "kustomization/agent-sandbox-sandboxes",
            "--for",
            "condition=Ready",
            "--timeout",
            "15m",
        ]))?;
    }
    save_state(root, name, &state)?;

    // 7. Ready: controller, router, warm pool.
    for deployment in ["agent-sandbox-controller", "sandbox-router"] {
        run(kubectl(&context).args([
            "-n",
            agent_sandbox_api::wire::SYSTEM_NAMESPACE,
            "rollout",
            "status",
            &format!("deployment/{deployment}"),
            "--timeout",
            "5m",
        ]))?;
    }
    run(kubectl(&context).args([
        "-n",
        "default",
        "wait",
        "sandboxwarmpool/python-sandbox-pool",
        "--for",
        "jsonpath={.status.readyReplicas}=2",
        "--timeout",
        "10m",
    ]))?;

    println!(
        "\nCluster {name} is ready (kubectl context {context}).\n\n\
         Try it:\n  \
         kubectl --context {context} get sandboxwarmpools,sandboxes -n default\n  \
         kubectl --context {context} -n {ns} port-forward svc/{svc} {port}:{port}\n  \
         cargo xtask e2e --kubeconfig ~/.kube/config      # the end-to-end suite against it\n\n\
         The router wants scoped tokens; mint one for a sandbox with the key in Secret\n  \
         {ns}/{secret} (docs/router.md, \"Authentication\").\n\
         Tear down with `cargo xtask cluster down --name {name}`.",
        ns = agent_sandbox_api::wire::SYSTEM_NAMESPACE,
        svc = agent_sandbox_api::wire::ROUTER_SERVICE,
        port = agent_sandbox_api::wire::ROUTER_PORT,
        secret = agent_sandbox_api::wire::ROUTER_SIGNING_KEY_SECRET,
    );
    Ok(())
}

/// Creates the router's signing-key Secret with 32 random bytes (hex) unless it exists, in
/// `agent-sandbox-system` and, with the same key, in `default` for the router there
/// (`deploy/sandboxes/namespace-router`).
fn ensure_signing_key(context: &str) -> Result<()> {
    let secret = agent_sandbox_api::wire::ROUTER_SIGNING_KEY_SECRET;
    let field = agent_sandbox_api::wire::ROUTER_SIGNING_KEY_SECRET_KEY;
    let namespaces = [
        agent_sandbox_api::wire::SYSTEM_NAMESPACE,
        agent_sandbox_api::wire::DEFAULT_SANDBOX_NAMESPACE,
    ];
    // The key of the first namespace that has one (decoded by kubectl), else a new one.
    let mut existing = None;
    for ns in namespaces {
        if let Ok(key) = output(kubectl(context).args([
            "-n",
            ns,
            "get",
            "secret",
            secret,
            "-o",
            &format!("go-template={{{{index .data \"{field}\" | base64decode}}}}"),
        ])) && !key.trim().is_empty()
        {
            existing = Some(key.trim().as_bytes().to_vec());
            break;
        }
    }
    let key = match existing {
        Some(key) => key,
        None => {
            let mut bytes = [0_u8; 32];
            use std::io::Read as _;
            std::fs::File::open("/dev/urandom")
                .and_then(|mut f| f.read_exact(&mut bytes))
                .context("failed to read /dev/urandom")?;
            bytes
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
                .into_bytes()
        }
    };
    // Through a private file, so the key never appears in a process list.
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("key");
    std::fs::write(&file, &key)?;
    for ns in namespaces {
        if !probe(kubectl(context).args(["get", "namespace", ns])) {
            run(kubectl(context).args(["create", "namespace", ns]))?;
        }
        if probe(kubectl(context).args(["-n", ns, "get", "secret", secret])) {
            continue;
        }
        run(kubectl(context)
            .args(["-n", ns, "create", "secret", "generic", secret])
            .arg(format!("--from-file={field}={}", file.display())))?;
    }
    Ok(())
}

/// Starts the local registry on the `kind` network unless it runs; true when created.
fn ensure_registry() -> Result<bool> {
    let running = output(Command::new("docker").args([
        "inspect",
        "--format",
        "{{.State.Running}}",
        REGISTRY_NAME,
    ]));
    let created = match running {
        Ok(text) if text.trim() == "true" => false,
        Ok(_) => {
            run(Command::new("docker").args(["start", REGISTRY_NAME]))?;
            false
        }
        Err(_) => {
            run(Command::new("docker").args([
                "run",
                "--detach",
                "--restart=always",
                "--publish",
                &format!("127.0.0.1:{REGISTRY_HOST_PORT}:5000"),
                "--network",
                "bridge",
                "--name",
                REGISTRY_NAME,
                "registry:2",
            ]))?;
            true
        }
    };
    // Reachable by name from the nodes (and so from source-controller) on kind's network.
    let networks = output(Command::new("docker").args([
        "inspect",
        "--format",
        "{{json .NetworkSettings.Networks}}",
        REGISTRY_NAME,
    ]))?;
    let on_kind = serde_json::from_str::<Value>(networks.trim())
        .ok()
        .is_some_and(|v| v.get("kind").is_some());
    if !on_kind {
        run(Command::new("docker").args(["network", "connect", "kind", REGISTRY_NAME]))?;
    }
    Ok(created)
}

/// Pushes `deploy/` (under `./deploy`, the paths Flux's Kustomizations name) as the OCI artifact
/// `flux/kind/source.yaml` reads.
fn push_manifests(root: &Path) -> Result<()> {
    let staging = root.join("target").join("xtask-cluster").join("artifact");
    if staging.exists() {
        std::fs::remove_dir_all(&staging)?;
    }
    copy_dir(&root.join("deploy"), &staging.join("deploy"))?;
    let revision = output(
        Command::new("git")
            .current_dir(root)
            .args(["rev-parse", "HEAD"]),
    )
    .map(|sha| format!("local@sha1:{}", sha.trim()))
    .unwrap_or_else(|_| "local".to_owned());
    run(Command::new("flux")
        .args([
            "push",
            "artifact",
            &format!("oci://localhost:{REGISTRY_HOST_PORT}/{ARTIFACT}"),
        ])
        .arg(format!("--path={}", staging.display()))
        .arg(format!("--source={}", root.display()))
        .arg(format!("--revision={revision}")))
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// `cargo xtask cluster down`: deletes what `up` recorded, nothing else.
pub(crate) fn down(root: &Path, name: &str) -> Result<()> {
    let Some(state) = load_state(root, name)? else {
        println!(
            "No record of `cargo xtask cluster up --name {name}` in {}; nothing deleted.",
            state_path(root, name).display()
        );
        return Ok(());
    };
    let context = format!("kind-{name}");
    if state.cluster_created {
        run(Command::new("kind").args(["delete", "cluster", "--name", name]))?;
    } else {
        // A cluster `up` did not create: remove only what it added to it.
        match state.delivery.as_deref() {
            Some("flux") => run(kubectl(&context).current_dir(root).args([
                "delete",
                "-k",
                "flux/kind",
                "--ignore-not-found",
                "--wait",
            ]))?,
            Some(_) => run(kubectl(&context).current_dir(root).args([
                "delete",
                "-k",
                "deploy/overlays/kind",
                "--ignore-not-found",
            ]))?,
            None => {}
        }
        if state.flux_installed {
            run(Command::new("flux").args(["uninstall", "--context", &context, "--silent"]))?;
        }
        if state.cilium_installed {
            run(Command::new("cilium").args(["uninstall", "--context", &context]))?;
        }
    }
    if state.registry_created {
        run(Command::new("docker").args(["rm", "--force", REGISTRY_NAME]))?;
    }
    std::fs::remove_file(state_path(root, name))?;
    println!("Deleted what `cargo xtask cluster up --name {name}` created.");
    Ok(())
}

/// The kind cluster config fields `kind/cluster.yaml` may use (kind.x-k8s.io/v1alpha4), strict.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct KindConfig {
    pub(crate) kind: String,
    pub(crate) api_version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) networking: Option<KindNetworking>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) nodes: Vec<KindNode>,
}

/// `networking` of a kind config.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct KindNetworking {
    #[serde(
        default,
        rename = "disableDefaultCNI",
        skip_serializing_if = "Option::is_none"
    )]
    pub(crate) disable_default_cni: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) kube_proxy_mode: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) pod_subnet: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) service_subnet: Option<String>,
}

/// One node of a kind config.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct KindNode {
    pub(crate) role: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) image: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stub(dir: &Path, name: &str, script: &str) {
        use std::os::unix::fs::PermissionsExt as _;
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{script}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[test]
    fn every_missing_tool_is_listed_with_how_to_install_it() {
        let empty = tempfile::tempdir().unwrap();
        let message = missing_tools(empty.path().as_os_str(), false).unwrap();
        for tool in TOOLS {
            assert!(message.contains(tool.name), "{message}");
            assert!(message.contains(tool.install), "{message}");
        }
        assert!(message.lines().count() <= 24, "one screen:\n{message}");
        let message = missing_tools(empty.path().as_os_str(), true).unwrap();
        assert!(!message.contains("\n  flux "), "{message}");
        assert!(message.contains("\n  cilium "), "{message}");
    }

    #[test]
    fn a_docker_without_daemon_counts_as_missing() {
        let dir = tempfile::tempdir().unwrap();
        stub(
            dir.path(),
            "docker",
            "echo 'Cannot connect to the Docker daemon' >&2; exit 1",
        );
        for tool in ["kind", "kubectl", "cilium", "flux"] {
            stub(dir.path(), tool, "exit 0");
        }
        let message = missing_tools(dir.path().as_os_str(), false).unwrap();
        assert!(message.contains("daemon does not answer"), "{message}");
        assert!(!message.contains("kind     not found"), "{message}");

        stub(dir.path(), "docker", "echo 28.0.0");
        assert_eq!(missing_tools(dir.path().as_os_str(), false), None);
    }

    #[test]
    fn state_round_trips() {
        let root = tempfile::tempdir().unwrap();
        assert_eq!(load_state(root.path(), "x").unwrap(), None);
        let state = State {
            cluster_created: true,
            delivery: Some("flux".into()),
            ..State::default()
        };
        save_state(root.path(), "x", &state).unwrap();
        assert_eq!(load_state(root.path(), "x").unwrap(), Some(state));
    }
}
