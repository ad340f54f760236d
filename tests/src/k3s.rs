//! `--k3s`: a throwaway k3s in Docker (testcontainers-modules' k3s image), set up from the same
//! manifests as kind: the images `cargo xtask e2e --k3s` built and saved are imported into the
//! node, `deploy/overlays/kind` is applied with kubectl, and the router's signing key is
//! created as `cargo xtask cluster up` creates it.
//!
//! The controller runs as a local process (in this process, against the container's API
//! server), so the suite tests the controller of this checkout; its in-cluster Deployment is
//! scaled to zero. The router runs in the cluster: a local router would have to reach pod IPs
//! inside the container, which takes a host route only root can add.
//!
//! Dropping the cluster removes the container (testcontainers).

use std::path::{Path, PathBuf};
use std::time::Duration;

use agent_sandbox_api::wire;
use agent_sandbox_local::ControllerTask;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::PostParams;
use testcontainers_modules::k3s::{K3s, KUBE_SECURE_PORT};
use testcontainers_modules::testcontainers::core::ExecCommand;
use testcontainers_modules::testcontainers::runners::AsyncRunner as _;
use testcontainers_modules::testcontainers::{ContainerAsync, ImageExt as _};

use crate::error::{Error, Result};

/// Where the archive is copied inside the container.
const IMAGES_IN_CONTAINER: &str = "/tmp/agent-sandbox-images.tar";
/// The controller Deployment of `deploy/base` (scaled to zero: the local one runs instead).
const CONTROLLER_DEPLOYMENT: &str = "agent-sandbox-controller";

pub(crate) struct K3sCluster {
    container: Option<ContainerAsync<K3s>>,
    kube: kube::Client,
    kubeconfig: PathBuf,
    controller: Option<ControllerTask>,
}

fn docker(
    step: &'static str,
) -> impl FnOnce(testcontainers_modules::testcontainers::TestcontainersError) -> Error {
    move |e| Error::Config(format!("k3s: {step}: {e} (is the Docker daemon running?)"))
}

impl K3sCluster {
    /// Starts k3s, imports the images, applies the kind overlay and starts the controller.
    pub(crate) async fn start(scratch: &Path, images: Option<&Path>) -> Result<Self> {
        let images = images.map(Path::to_path_buf).ok_or_else(|| {
            Error::Config(format!(
                "no image archive for the k3s node (--images or {}): run `cargo xtask e2e \
                 --k3s`, which builds the images and saves them",
                crate::env::IMAGES
            ))
        })?;
        let conf = scratch.join("k3s");
        std::fs::create_dir_all(&conf).map_err(Error::io("create", &conf))?;
        eprintln!("e2e: starting k3s in Docker (first run pulls rancher/k3s) ...");
        let container = K3s::default()
            .with_conf_mount(&conf)
            .with_privileged(true)
            .with_userns_mode("host")
            .with_copy_to(IMAGES_IN_CONTAINER, images.clone())
            .with_startup_timeout(Duration::from_secs(300))
            .start()
            .await
            .map_err(docker("start the container"))?;
        eprintln!("e2e: importing {} into the k3s node ...", images.display());
        let mut import = container
            .exec(ExecCommand::new([
                "k3s",
                "ctr",
                "images",
                "import",
                IMAGES_IN_CONTAINER,
            ]))
            .await
            .map_err(docker("import the images"))?;
        let output = import.stdout_to_vec().await.unwrap_or_default();
        let code = import
            .exit_code()
            .await
            .map_err(docker("import the images"))?;
        if code.is_some_and(|c| c != 0) {
            return Err(Error::Config(format!(
                "k3s ctr images import exited with {code:?}: {}",
                String::from_utf8_lossy(&output)
            )));
        }

        let port = container
            .get_host_port_ipv4(KUBE_SECURE_PORT)
            .await
            .map_err(docker("find the API server's port"))?;
        let yaml = container
            .image()
            .read_kube_config()
            .map_err(Error::io("read k3s.yaml in", &conf))?;
        let mut kubeconfig = kube::config::Kubeconfig::from_yaml(&yaml).map_err(|e| {
            Error::Config(format!("k3s wrote a kubeconfig that does not parse: {e}"))
        })?;
        for cluster in &mut kubeconfig.clusters {
            if let Some(server) = cluster.cluster.as_mut().and_then(|c| c.server.as_mut()) {
                *server = format!("https://127.0.0.1:{port}");
            }
        }
        let text = serde_json::to_vec(&kubeconfig)
            .map_err(|e| Error::Config(format!("cannot write the k3s kubeconfig: {e}")))?;
        let path = crate::cluster::write_private(scratch, "kubeconfig", &text)?;
        let kube = crate::cluster::client_from(&path).await?;

        apply_kind_overlay(&path).await?;
        create_signing_key(&kube).await?;
        kubectl(
            &path,
            &[
                "-n",
                wire::SYSTEM_NAMESPACE,
                "scale",
                "deployment",
                CONTROLLER_DEPLOYMENT,
                "--replicas=0",
            ],
        )
        .await?;
        let controller =
            ControllerTask::spawn(kube.clone(), agent_sandbox_controller::Config::default());
        kubectl(
            &path,
            &[
                "-n",
                wire::SYSTEM_NAMESPACE,
                "rollout",
                "status",
                "deployment/sandbox-router",
                "--timeout=300s",
            ],
        )
        .await?;
        Ok(Self {
            container: Some(container),
            kube,
            kubeconfig: path,
            controller: Some(controller),
        })
    }

    pub(crate) fn client(&self) -> kube::Client {
        self.kube.clone()
    }

    pub(crate) fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// Stops the controller, then removes the container.
    pub(crate) async fn stop(mut self) {
        if let Some(controller) = self.controller.take()
            && let Err(error) = controller.stop(Duration::from_secs(10)).await
        {
            tracing::warn!(%error, "stopping the local controller");
        }
        if let Some(container) = self.container.take() {
            let _ = container.rm().await;
        }
    }
}

/// The workspace's root directory (where `deploy/` lives).
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// `kubectl apply --server-side -k deploy/overlays/kind` (CRDs first, then the rest once they
/// are established).
async fn apply_kind_overlay(kubeconfig: &Path) -> Result<()> {
    let root = workspace_root();
    let crds = root.join("deploy/crds");
    let overlay = root.join("deploy/overlays/kind");
    kubectl(
        kubeconfig,
        &["apply", "--server-side", "-k", &crds.display().to_string()],
    )
    .await?;
    kubectl(
        kubeconfig,
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=120s",
            "crd",
            "--all",
        ],
    )
    .await?;
    kubectl(
        kubeconfig,
        &[
            "apply",
            "--server-side",
            "-k",
            &overlay.display().to_string(),
        ],
    )
    .await
}

/// The router's Secret with 32 random bytes, hex-encoded.
async fn create_signing_key(kube: &kube::Client) -> Result<()> {
    let key = agent_sandbox_local::new_secret()?;
    let mut secret = Secret::default();
    secret.metadata.name = Some(wire::ROUTER_SIGNING_KEY_SECRET.to_owned());
    secret.data = Some(std::collections::BTreeMap::from([(
        wire::ROUTER_SIGNING_KEY_SECRET_KEY.to_owned(),
        k8s_openapi::ByteString(key.into_bytes()),
    )]));
    Api::<Secret>::namespaced(kube.clone(), wire::SYSTEM_NAMESPACE)
        .create(&PostParams::default(), &secret)
        .await
        .map_err(Error::kube("create the router's signing-key Secret"))?;
    Ok(())
}

async fn kubectl(kubeconfig: &Path, args: &[&str]) -> Result<()> {
    let program = Path::new("kubectl");
    let mut command = tokio::process::Command::new(program);
    command.arg("--kubeconfig").arg(kubeconfig).args(args);
    let finished =
        crate::support::run_child(program, command, None, Duration::from_secs(600)).await?;
    if finished.status.success() {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "kubectl {}: {}",
            args.join(" "),
            finished.describe()
        )))
    }
}
