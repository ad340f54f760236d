//! Project automation, in the style of rust-analyzer's xtask: `cargo xtask <command>`.
//!
//! - `gen-crds`: write `deploy/crds/` from `crates/api` (checked by a test, see [`crds`]);
//! - `bench`: run benchmark cases and write `docs/benchmarks.md` (the package
//!   `agent-sandbox-bench` in `xtask/bench`, built and run by [`bench()`]);
//! - `check-manifests`: the offline checks of `deploy/`, `flux/` and `kind/` (see [`manifests`]);
//! - `images`: build the container images, with Docker or as OCI archives without it (see
//!   [`images`]);
//! - `cluster up|down`: a kind + Cilium + Flux cluster running this checkout (see [`cluster`]);
//! - `e2e`: the end-to-end suite against the simulated cluster, a kubeconfig's cluster or a
//!   throwaway k3s (see [`e2e`]);
//! - `tools`: build the Kubernetes control-plane binaries and etcd from their Go modules, and
//!   with `--node` a real node's binaries (see [`tools`]).

mod cluster;
mod crds;
mod e2e;
mod images;
mod manifests;
mod tools;

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(about = "Project automation for agent-sandbox", long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Write the CRDs of crates/api to deploy/crds (or check them with --check).
    #[command(after_help = "Examples:\n  cargo xtask gen-crds\n  cargo xtask gen-crds --check")]
    GenCrds {
        /// Fail instead of writing when the files differ.
        #[arg(long)]
        check: bool,
    },
    /// Run benchmark cases and record them in docs/benchmarks.md.
    #[command(
        after_help = "Examples:\n  cargo xtask bench                 # every case but the node tier's\n  cargo xtask bench api/            # cases whose name starts with api/\n  cargo xtask bench node/           # the node tier's (root; only when named)\n  cargo xtask bench --quick --dry-run\n  cargo xtask bench --list"
    )]
    Bench {
        /// Case name prefixes to run (all when none, except the node tier's `node/`).
        cases: Vec<String>,
        /// Fewer iterations (a smoke run of the harness; built without optimisation).
        #[arg(long)]
        quick: bool,
        /// Print the rows without writing docs/benchmarks.md.
        #[arg(long)]
        dry_run: bool,
        /// List the cases and exit.
        #[arg(long)]
        list: bool,
    },
    /// Render every deploy/ overlay and flux/ path with kubectl and check every object strictly.
    #[command(after_help = "Examples:\n  cargo xtask check-manifests")]
    CheckManifests,
    /// Build the controller, router and runtime images: from the Dockerfile (needs Docker), or
    /// with --oci as OCI archives without Docker or a registry.
    #[command(
        after_help = "Examples:\n  cargo xtask images                                   # agent-sandbox/*:dev, for kind\n  cargo xtask images --registry ghcr.io/agent-sandbox-rs --tag v0.1.0 --push --pin-release\n  cargo xtask images --oci target/oci                  # no Docker: target/oci/{controller,router,runtime,images}.tar\n  sudo ctr -n k8s.io images import target/oci/images.tar   # then pods can use agent-sandbox/*:dev\n  cargo xtask images --lock                            # re-pin the Debian packages of --oci (apt-get update first)\n  cargo xtask images --check-requirements              # python-runtime-sandbox's pins install (no Docker)\n\n--oci builds the controller, router and runtime (not python-runtime-sandbox) from the release\nbinaries and the Debian 12 packages pinned in xtask/images/debian-bookworm-<arch>.lock, downloaded\nonce into $XDG_CACHE_HOME/agent-sandbox/debian (else ~/.cache/agent-sandbox/debian). Archives are\nreproducible; SOURCE_DATE_EPOCH sets their timestamps (default 0)."
    )]
    Images {
        /// Build nothing: check that the Python libraries of the python-runtime-sandbox image
        /// install as pinned (pip download --require-hashes for CPython 3.14, x86_64 and
        /// aarch64), without Docker.
        #[arg(long, conflicts_with_all = ["registry", "push", "pin_release", "oci", "lock"])]
        check_requirements: bool,
        /// Build the controller, router and runtime images without Docker, as OCI image archives
        /// in DIR (one per image and images.tar with all three), named as --registry and --tag
        /// say.
        #[arg(long, value_name = "DIR", conflicts_with_all = ["push", "pin_release", "lock"])]
        oci: Option<PathBuf>,
        /// Build nothing: resolve the Debian packages of --oci from the APT index and write
        /// their lock file (`xtask/images/debian-bookworm-<arch>.lock`).
        #[arg(long, conflicts_with_all = ["registry", "push", "pin_release"])]
        lock: bool,
        /// Tag of every image.
        #[arg(long, default_value = images::DEV_TAG)]
        tag: String,
        /// Registry prefix; the images get their published names under it.
        #[arg(long)]
        registry: Option<String>,
        /// Push the images after building them (needs --registry).
        #[arg(long)]
        push: bool,
        /// Write the pushed digests into deploy/overlays/release and flux/release.
        #[arg(long)]
        pin_release: bool,
    },
    /// Create (up) or delete (down) the local kind + Cilium + Flux cluster.
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Run the end-to-end suite (tests/) against a cluster: the simulated one by default.
    #[command(
        after_help = "Examples:\n  cargo xtask e2e                                # the simulated cluster (no Docker)\n  cargo xtask e2e --control-plane                # a real kube-apiserver with our kubelet (cargo xtask tools)\n  cargo xtask e2e --control-plane --keep         # ... and leave it up afterwards (prints its kubeconfig)\n  cargo xtask e2e --control-plane --helm         # ... installed with the Helm chart (helm install)\n  cargo xtask e2e --node                         # ... with a real node: containerd, runc and gVisor, our images\n  cargo xtask e2e --kubeconfig ~/.kube/config    # a cluster with deploy/ installed\n  cargo xtask e2e --k3s                          # a throwaway k3s (Docker, kubectl)\n  cargo xtask e2e -- sdk:: cli::                 # only scenarios whose name contains these"
    )]
    E2e {
        /// The simulated cluster, started by the suite (the default).
        #[arg(long, conflicts_with_all = ["kubeconfig", "k3s", "control_plane", "node"])]
        sim: bool,
        /// A real control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler
        /// from `cargo xtask tools`, built first if missing) with our kubelet as its node,
        /// deploy/ applied, started and torn down by the suite.
        #[arg(long, conflicts_with_all = ["kubeconfig", "k3s", "node"])]
        control_plane: bool,
        /// The control plane with a real node instead of our kubelet: containerd (runc and
        /// gVisor), the real kubelet, kube-proxy and CNI (`cargo xtask tools --node`, built first
        /// if missing), our images as OCI archives (`cargo xtask images --oci target/oci`), and
        /// deploy/overlays/kind applied. Root only.
        #[arg(long, conflicts_with_all = ["kubeconfig", "k3s"])]
        node: bool,
        /// With --control-plane: install with `helm install` of deploy/helm/agent-sandbox
        /// instead of `kubectl apply -k deploy/overlays/kind`.
        #[arg(long, requires = "control_plane")]
        helm: bool,
        /// Leave the cluster the suite started up after the report (print its kubeconfig) until
        /// Ctrl-C.
        #[arg(long)]
        keep: bool,
        /// A cluster where deploy/ is installed (`cargo xtask cluster up`).
        #[arg(long, value_name = "PATH", conflicts_with = "k3s")]
        kubeconfig: Option<PathBuf>,
        /// A throwaway k3s in Docker (builds the images first).
        #[arg(long)]
        k3s: bool,
        /// Scenarios run at once (default 4).
        #[arg(long, value_name = "N")]
        jobs: Option<usize>,
        /// Run only scenarios whose name contains one of these.
        #[arg(last = true, value_name = "FILTER")]
        filters: Vec<String>,
    },
    /// Build kube-apiserver, kube-controller-manager, kube-scheduler, kubectl and etcd from the
    /// Go modules pinned in xtask/k8s-tools (once per machine and version), and print them.
    #[command(
        after_help = "Examples:\n  cargo xtask tools                      # build what is missing; print paths and versions\n  export PATH=\"$(cargo xtask tools --print-bin-dir):$PATH\"\n  cargo xtask tools --node               # ... and the node's (kubelet, containerd, runsc, CNI, crictl, kube-network-policies, kube-router)\n  export PATH=\"$(cargo xtask tools --node --print-bin-dir):$PATH\"   # both directories\n\nThe binaries are cached in $AGENT_SANDBOX_TOOLS_DIR, else $XDG_CACHE_HOME/agent-sandbox/k8s-tools,\nelse ~/.cache/agent-sandbox/k8s-tools, in a directory named after the pinned versions."
    )]
    Tools {
        /// Print only the directory holding the binaries (progress still goes to stderr); with
        /// `--node`, the node's and the control plane's directories joined by `:`.
        #[arg(long)]
        print_bin_dir: bool,
        /// Also build the binaries of a real node (kubelet, containerd, runsc, CNI plugins,
        /// crictl, kube-network-policies, kube-router), pinned in xtask/k8s-tools and xtask/node-tools/*.
        #[arg(long)]
        node: bool,
    },
}

#[derive(Debug, Subcommand)]
enum ClusterCommand {
    /// Create the cluster, install Cilium and Flux, build and load the images, deliver deploy/,
    /// and wait for the controller, router and warm pool. Idempotent.
    #[command(
        after_help = "Examples:\n  cargo xtask cluster up\n  cargo xtask cluster up --no-flux     # kubectl apply -k deploy/overlays/kind instead of Flux"
    )]
    Up {
        /// kind cluster name (kubectl context `kind-<name>`).
        #[arg(long, default_value = "agent-sandbox")]
        name: String,
        /// Apply deploy/ with kubectl instead of installing Flux.
        #[arg(long)]
        no_flux: bool,
        /// Load the images already built instead of building them.
        #[arg(long)]
        skip_images: bool,
        /// Cilium version to install.
        #[arg(long, default_value = cluster::CILIUM_VERSION)]
        cilium_version: String,
    },
    /// Delete what `cluster up` created (and nothing it found already there).
    #[command(after_help = "Examples:\n  cargo xtask cluster down")]
    Down {
        /// kind cluster name.
        #[arg(long, default_value = "agent-sandbox")]
        name: String,
    },
}

fn main() {
    // Errors are for people at a terminal: the message and its causes, no backtrace (even with
    // RUST_BACKTRACE set), and a non-zero exit.
    if let Err(error) = run(Cli::parse()) {
        eprintln!("error: {error:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    let root = workspace_root();
    match cli.command {
        Command::GenCrds { check: true } => crds::check(&root),
        Command::GenCrds { check: false } => crds::write(&root),
        Command::Bench {
            cases,
            quick,
            dry_run,
            list,
        } => bench(&root, &cases, quick, dry_run, list),
        Command::CheckManifests => {
            for line in manifests::check_all(&root)? {
                println!("ok  {line}");
            }
            for line in manifests::helm::check_chart(&root)? {
                println!("ok  {line}");
            }
            Ok(())
        }
        Command::Images {
            check_requirements: true,
            ..
        } => {
            for line in images::check_requirements(&root)? {
                println!("ok  {line}");
            }
            Ok(())
        }
        Command::Images { lock: true, .. } => {
            for line in images::oci::lock(&root)? {
                println!("ok  {line}");
            }
            Ok(())
        }
        Command::Images {
            oci: Some(dir),
            tag,
            registry,
            ..
        } => {
            let options = images::Options {
                tag,
                registry,
                ..images::Options::dev()
            };
            for archive in images::oci::build(&root, &options, &dir)? {
                println!(
                    "{}  {:.1} MiB  sha256:{}",
                    archive.path.display(),
                    archive.bytes as f64 / 1048576.0,
                    archive.sha256
                );
                for ((name, manifest), size) in archive
                    .names
                    .iter()
                    .zip(&archive.manifests)
                    .zip(&archive.sizes)
                {
                    println!(
                        "  {name}  {manifest}  {:.1} MiB compressed",
                        *size as f64 / 1048576.0
                    );
                }
            }
            Ok(())
        }
        Command::Images {
            check_requirements: false,
            oci: None,
            lock: false,
            tag,
            registry,
            push,
            pin_release,
        } => {
            let built = images::build(
                &root,
                &images::Options {
                    tag,
                    registry,
                    push,
                    pin_release,
                },
            )?;
            for reference in built {
                println!("{reference}");
            }
            Ok(())
        }
        Command::Cluster(ClusterCommand::Up {
            name,
            no_flux,
            skip_images,
            cilium_version,
        }) => cluster::up(
            &root,
            &cluster::UpOptions {
                name,
                no_flux,
                skip_images,
                cilium_version,
            },
        ),
        Command::Cluster(ClusterCommand::Down { name }) => cluster::down(&root, &name),
        Command::Tools {
            print_bin_dir,
            node,
        } => tools::run(&root, print_bin_dir, node),
        Command::E2e {
            sim: _,
            control_plane,
            node,
            helm,
            keep,
            kubeconfig,
            k3s,
            jobs,
            filters,
        } => {
            let target = match (kubeconfig, k3s, control_plane, node) {
                (Some(path), ..) => e2e::Target::Kubeconfig(path),
                (None, true, ..) => e2e::Target::K3s,
                (None, false, true, _) => e2e::Target::ControlPlane,
                (None, false, false, true) => e2e::Target::Node,
                (None, false, false, false) => e2e::Target::Sim,
            };
            e2e::run(
                &root,
                &e2e::Options {
                    target,
                    jobs,
                    keep,
                    filters,
                    helm,
                },
            )
        }
    }
}

/// `cargo xtask bench`: builds the bench binary (package `agent-sandbox-bench`) and runs it.
///
/// Measurements of unoptimised code mean nothing, so the binary is built in release, except for
/// `--quick` and `--list` (a smoke run and a listing, which the test build's artifacts serve).
/// `--workspace` resolves features as for the whole workspace, as the cases' own release builds
/// of their subjects do, so that both share one build of the dependency graph.
fn bench(root: &Path, cases: &[String], quick: bool, dry_run: bool, list: bool) -> Result<()> {
    let release = !(quick || list);
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut build = std::process::Command::new(&cargo);
    build
        .args(["build", "--quiet", "--workspace", "--bin", BENCH_BIN])
        .current_dir(root);
    if release {
        build.arg("--release");
    }
    let status = build
        .status()
        .with_context(|| format!("failed to run {}", images::show(&build)))?;
    if !status.success() {
        bail!("{} failed ({status})", images::show(&build));
    }
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    let binary = target
        .join(if release { "release" } else { "debug" })
        .join(BENCH_BIN);
    let mut run = std::process::Command::new(&binary);
    run.args(cases).current_dir(root);
    // The control-plane cases need the Kubernetes binaries (built once by `cargo xtask tools`).
    let wants_control_plane = cases.is_empty()
        || cases.iter().any(|c| {
            c.starts_with(CONTROL_PLANE_CASES) || CONTROL_PLANE_CASES.starts_with(c.as_str())
        });
    // The node cases also need the node's programs and our images (only when named).
    let wants_node = cases
        .iter()
        .any(|c| c.starts_with(NODE_CASES) || NODE_CASES.starts_with(c.as_str()));
    if (wants_control_plane || wants_node) && !list {
        let toolset = tools::ensure(root)?;
        let mut dirs = vec![toolset.bin_dir.clone()];
        if wants_node {
            dirs.insert(0, tools::node::ensure(root)?.bin_dir());
            run.arg("--images").arg(e2e::oci_images(root)?);
        }
        let path = std::env::var_os("PATH").unwrap_or_default();
        let joined = std::env::join_paths(dirs.into_iter().chain(std::env::split_paths(&path)))
            .context("the tools' directory cannot be put on PATH")?;
        run.env("PATH", joined);
    }
    for (set, flag) in [(quick, "--quick"), (dry_run, "--dry-run"), (list, "--list")] {
        if set {
            run.arg(flag);
        }
    }
    let status = run
        .status()
        .with_context(|| format!("failed to run {}", binary.display()))?;
    if !status.success() {
        bail!("the benchmarks failed ({status})");
    }
    Ok(())
}

/// The bench package's binary.
const BENCH_BIN: &str = "agent-sandbox-bench";

/// The prefix of the bench cases that run on the control-plane tier.
const CONTROL_PLANE_CASES: &str = "control-plane/";
/// The prefix of the bench cases that run on the node tier.
const NODE_CASES: &str = "node/";

/// The workspace root: xtask lives one level below it.
fn workspace_root() -> PathBuf {
    let manifest_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .map(PathBuf::from)
        .unwrap_or(manifest_dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed CRDs are what `gen-crds` would write (rust-analyzer's "generated files are
    /// tested" pattern).
    #[test]
    fn crds_are_fresh() {
        if let Err(error) = crds::check(&workspace_root()) {
            panic!("{error:#}");
        }
    }

    /// `kubectl kustomize deploy/crds` (a renderer nobody here wrote) yields exactly our four
    /// CRDs, with the names, scope, versions, subresources and columns of `crates/api`.
    #[test]
    fn kubectl_kustomize_renders_the_four_crds() {
        use agent_sandbox_local::testkit::{Tool, missing};
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
        if missing(Tool::Kubectl) {
            return;
        }
        let root = workspace_root();
        let output = std::process::Command::new("kubectl")
            .args(["kustomize", "deploy/crds"])
            .current_dir(&root)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let text = String::from_utf8(output.stdout).unwrap();
        let rendered: Vec<CustomResourceDefinition> = serde_saphyr::from_multiple(&text).unwrap();
        let surface = |crd: &CustomResourceDefinition| {
            let versions: Vec<_> = crd
                .spec
                .versions
                .iter()
                .map(|v| {
                    (
                        v.name.clone(),
                        v.served,
                        v.storage,
                        v.subresources.clone(),
                        v.additional_printer_columns.clone(),
                    )
                })
                .collect();
            (
                crd.metadata.name.clone(),
                crd.spec.group.clone(),
                crd.spec.names.clone(),
                crd.spec.scope.clone(),
                versions,
            )
        };
        let mut expected: Vec<_> = agent_sandbox_api::crds::all().iter().map(surface).collect();
        let mut actual: Vec<_> = rendered.iter().map(surface).collect();
        expected.sort_by(|a, b| a.0.cmp(&b.0));
        actual.sort_by(|a, b| a.0.cmp(&b.0));
        pretty_assertions::assert_eq!(actual, expected);
        assert_eq!(rendered.len(), 4);
    }

    #[test]
    fn cli_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
