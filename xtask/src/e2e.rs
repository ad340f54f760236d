//! `cargo xtask e2e`: runs the end-to-end suite (the `agent-sandbox-e2e` package in `tests/`)
//! against the cluster the flags name, by running its test binary with cargo and passing the
//! cluster on to it (`-- --sim | --kubeconfig PATH | --k3s --images TAR`).
//!
//! - default / `--sim`: the simulated cluster, started by the suite (no Docker);
//! - `--control-plane`: a real control plane from `cargo xtask tools` (built first when missing,
//!   then first on the suite's `PATH`) with our kubelet as its node, started by the suite;
//!   with `--helm`, our system is installed there with the Helm chart instead of kustomize;
//! - `--node`: the same control plane with a real node (containerd, runc and gVisor, the real
//!   kubelet, kube-proxy, CNI: `cargo xtask tools --node`) and our images as OCI archives
//!   (`cargo xtask images --oci target/oci`), both built first;
//! - `--kubeconfig PATH`: a cluster where `deploy/` is installed (`cargo xtask cluster up`);
//! - `--k3s`: builds the images, saves them to `target/e2e-images.tar`, and lets the suite start
//!   a throwaway k3s with testcontainers (needs Docker and kubectl).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, Result, bail};

use crate::images;

/// Which cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    Sim,
    ControlPlane,
    Node,
    Kubeconfig(PathBuf),
    K3s,
}

/// What `cargo xtask e2e` was asked.
#[derive(Debug)]
pub(crate) struct Options {
    pub(crate) target: Target,
    /// Scenarios run at once.
    pub(crate) jobs: Option<usize>,
    /// Leave the cluster the suite started up until Ctrl-C.
    pub(crate) keep: bool,
    /// Name filters for the scenarios.
    pub(crate) filters: Vec<String>,
    /// On the control-plane tier, install with `helm install` (deploy/helm/agent-sandbox).
    pub(crate) helm: bool,
}

/// The cargo invocation that runs the suite's binary (`images`: the archive for `--k3s`).
pub(crate) fn cargo_args(options: &Options, images: Option<&Path>) -> Vec<String> {
    // `--workspace`: features resolved as for `cargo test --workspace`, whose build of the
    // suite is then reused (only the package `agent-sandbox-e2e` has a test named `e2e`).
    let mut args: Vec<String> = ["test", "--workspace", "--test", "e2e"]
        .map(str::to_owned)
        .to_vec();
    if options.target == Target::K3s {
        args.extend(["--features".to_owned(), "agent-sandbox-e2e/k3s".to_owned()]);
    }
    args.push("--".to_owned());
    match &options.target {
        Target::Sim => args.push("--sim".to_owned()),
        Target::ControlPlane => {
            args.push("--control-plane".to_owned());
            if options.helm {
                args.push("--helm".to_owned());
            }
        }
        Target::Kubeconfig(path) => {
            args.extend(["--kubeconfig".to_owned(), path.display().to_string()]);
        }
        Target::Node => {
            args.push("--node".to_owned());
            if let Some(images) = images {
                args.extend(["--images".to_owned(), images.display().to_string()]);
            }
        }
        Target::K3s => {
            args.push("--k3s".to_owned());
            if let Some(images) = images {
                args.extend(["--images".to_owned(), images.display().to_string()]);
            }
        }
    }
    if let Some(jobs) = options.jobs {
        args.extend(["--jobs".to_owned(), jobs.to_string()]);
    }
    if options.keep {
        args.push("--keep".to_owned());
    }
    args.extend(options.filters.iter().cloned());
    args
}

/// Runs the suite; fails when a scenario failed or the cluster was not usable.
pub(crate) fn run(root: &Path, options: &Options) -> Result<()> {
    let images = match &options.target {
        Target::Kubeconfig(path) if !path.is_file() => bail!(
            "kubeconfig {} does not exist: pass the kubeconfig of a cluster where deploy/ is \
             installed (`cargo xtask cluster up` writes ~/.kube/config)",
            path.display()
        ),
        Target::K3s => Some(save_images(root)?),
        Target::Node => Some(oci_images(root)?),
        _ => None,
    };
    let mut command = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()));
    command
        .current_dir(root)
        .args(cargo_args(options, images.as_deref()));
    if matches!(options.target, Target::ControlPlane | Target::Node) {
        let mut dirs = Vec::new();
        if options.target == Target::Node {
            dirs.push(crate::tools::node::ensure(root)?.bin_dir());
        }
        dirs.push(crate::tools::ensure(root)?.bin_dir);
        let path = std::env::var_os("PATH").unwrap_or_default();
        let joined = std::env::join_paths(dirs.into_iter().chain(std::env::split_paths(&path)))
            .context("the tools' directories cannot be put on PATH")?;
        command.env("PATH", joined);
    }
    let status = command
        .status()
        .with_context(|| format!("failed to start `{}`", images::show(&command)))?;
    if !status.success() {
        bail!("the end-to-end suite failed ({status}); its report is above");
    }
    Ok(())
}

/// Builds our images as OCI archives (no Docker) for the real node: `target/oci/images.tar`.
pub(crate) fn oci_images(root: &Path) -> Result<PathBuf> {
    let dir = root.join("target").join("oci");
    let written = images::oci::build(root, &images::Options::dev(), &dir)?;
    written
        .into_iter()
        .map(|archive| archive.path)
        .find(|path| path.ends_with("images.tar"))
        .context("cargo xtask images --oci wrote no images.tar")
}

/// Builds the images and saves them in one archive for the k3s node.
fn save_images(root: &Path) -> Result<PathBuf> {
    if crate::cluster::find_tool("kubectl", &std::env::var_os("PATH").unwrap_or_default()).is_none()
    {
        bail!(
            "--k3s needs kubectl (it applies deploy/overlays/kind to the k3s cluster): {}",
            crate::cluster::TOOLS
                .iter()
                .find(|t| t.name == "kubectl")
                .map_or("", |t| t.install)
        );
    }
    images::require_docker()?;
    let built = images::build(root, &images::Options::dev())?;
    let archive = root.join("target").join("e2e-images.tar");
    std::fs::create_dir_all(root.join("target"))?;
    images::run(
        Command::new("docker")
            .arg("save")
            .arg("--output")
            .arg(&archive)
            .args(&built),
    )?;
    Ok(archive)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k3s_builds_the_suite_with_its_feature_and_filters_follow_the_separator() {
        let options = Options {
            target: Target::K3s,
            jobs: Some(2),
            keep: false,
            filters: vec!["sdk".to_owned()],
            helm: false,
        };
        let args = cargo_args(&options, Some(Path::new("/t/images.tar")));
        let separator = args.iter().position(|a| a == "--").unwrap_or(usize::MAX);
        let features = args
            .iter()
            .position(|a| a == "agent-sandbox-e2e/k3s")
            .unwrap_or(usize::MAX);
        assert!(features < separator, "{args:?}");
        assert_eq!(
            args[separator + 1..],
            ["--k3s", "--images", "/t/images.tar", "--jobs", "2", "sdk"]
        );
        let sim = cargo_args(
            &Options {
                target: Target::Sim,
                jobs: None,
                keep: false,
                filters: vec![],
                helm: false,
            },
            None,
        );
        assert!(!sim.contains(&"--features".to_owned()));
        assert_eq!(sim.last().map(String::as_str), Some("--sim"));
        let kube = cargo_args(
            &Options {
                target: Target::Kubeconfig(PathBuf::from("/k/config")),
                jobs: None,
                keep: false,
                filters: vec![],
                helm: false,
            },
            None,
        );
        assert!(kube.ends_with(&["--kubeconfig".to_owned(), "/k/config".to_owned()]));
        let plane = cargo_args(
            &Options {
                target: Target::ControlPlane,
                jobs: None,
                keep: true,
                filters: vec!["cli::".to_owned()],
                helm: false,
            },
            None,
        );
        assert!(!plane.contains(&"--features".to_owned()));
        assert!(plane.ends_with(&[
            "--control-plane".to_owned(),
            "--keep".to_owned(),
            "cli::".to_owned()
        ]));
        let helm = cargo_args(
            &Options {
                target: Target::ControlPlane,
                jobs: None,
                keep: false,
                filters: vec![],
                helm: true,
            },
            None,
        );
        assert!(helm.ends_with(&["--control-plane".to_owned(), "--helm".to_owned()]));
    }

    /// A kubeconfig that is not there is refused before anything is built.
    #[test]
    fn a_missing_kubeconfig_is_named() {
        let options = Options {
            target: Target::Kubeconfig(PathBuf::from("/nonexistent/kubeconfig")),
            jobs: None,
            keep: false,
            filters: vec![],
            helm: false,
        };
        let error = run(Path::new("/nonexistent"), &options).unwrap_err();
        assert!(
            error.to_string().contains("/nonexistent/kubeconfig"),
            "{error}"
        );
    }
}
