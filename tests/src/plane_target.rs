//! [`crate::Target::ControlPlane`]: our system on the real control plane of
//! [`crate::control_plane`], set up the way `deploy/` sets up a cluster. `deploy/crds` and
//! `deploy/base` applied with strict validation; our kubelet joined as the one node with its own
//! credentials, serving the kubelet API (logs, port-forward) to the API server; the controller
//! as a process with its ServiceAccount's token (not as cluster admin); the router as a pod on
//! that node behind `sandbox-router-svc`, with its ServiceAccount's token and its signing key
//! from the Secret `sandbox-router-signing-key`; the Gateway API's CRDs (from `cargo xtask
//! tools`) with the Gateway that an implementation would program in front of the router; then
//! `deploy/sandboxes`.
//!
//! `deploy/base`'s own Deployments are scaled to zero: running the controller and the router
//! from their images as pods (projected tokens, Secret volumes, in-cluster configuration) is
//! the next tier's work.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use agent_sandbox_api::wire;
use agent_sandbox_kubelet::{
    ApiServing, ImageTable, Isolation, Kubelet, KubeletConfig, Program, runtime_entry,
};
use agent_sandbox_local::RouterAuth;
use agent_sandbox_local::testkit;
use agent_sandbox_local::wait::{Check, wait_for};
use k8s_openapi::api::core::v1::{Node, Secret, ServiceAccount};
use kube::Api;
use kube::api::PostParams;

use crate::control_plane::{ControlPlane, Tools};
use crate::error::{Error, Result};

/// The node's name.
const NODE: &str = "node-1";
/// Within this, each step of the setup is done (usually in well under a tenth).
const STEP: Duration = Duration::from_secs(120);
/// The router pod the suite creates.
const ROUTER_POD: &str = "sandbox-router-0";

/// The running installation; [`PlaneCluster::stop`] (or dropping it) ends every process.
pub struct PlaneCluster {
    plane: ControlPlane,
    kubelet: Kubelet,
    controller: ControllerProcess,
    router_url: String,
    gateway: Option<(String, String)>,
}

impl std::fmt::Debug for PlaneCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlaneCluster")
            .field("plane", &self.plane)
            .field("router_url", &self.router_url)
            .finish_non_exhaustive()
    }
}

impl PlaneCluster {
    /// Starts the control plane from the binaries in `bin_dir` and installs our system on it.
    pub async fn start(bin_dir: &Path) -> Result<Self> {
        let plane = ControlPlane::start(Tools::in_dir(bin_dir)?, NODE).await?;
        let admin = plane.client().await?;
        apply_deploy(&plane).await?;
        let gateway_crds = gateway_api_crds(bin_dir);
        if let Some(dir) = &gateway_crds {
            apply_gateway_api(&plane, dir).await?;
        }
        // The Deployments of deploy/base: run below as a process and a pod of ours instead.
        scale_deploy_base_to_zero(&plane).await?;

        let key = agent_sandbox_local::new_secret()?;
        create_signing_key_secret(&admin, &key).await?;
        let key_file =
            crate::cluster::write_private(plane.dir(), "router-signing-key", key.as_bytes())?;
        let controller = start_controller(&plane).await?;

        let router_kubeconfig = plane
            .service_account_kubeconfig(
                wire::SYSTEM_NAMESPACE,
                "sandbox-router",
                "router.kubeconfig",
            )
            .await?;
        let runtime = testkit::workspace_binary("agent-sandbox-runtime", "sandbox-runtime")?;
        let router = testkit::router_binary()?;
        let mut images = ImageTable::with_defaults();
        images.prepend(runtime_entry("*runtime*", Program::Path(runtime)));
        images.prepend(agent_sandbox_local::router_pod::image_entry(
            &router,
            RouterAuth::Scoped,
            Some(&key_file),
        ));
        let credentials = plane.node().clone();
        let kubelet = Kubelet::new(
            plane.node_client().await?,
            KubeletConfig {
                images,
                // Bubblewrap where it works, as on the sim: the scratch directory (kubeconfigs,
                // keys, the pods' directories) is one that bubblewrapped pods see.
                isolation: Isolation::Auto,
                api: Some(ApiServing {
                    listen: ([127, 0, 0, 1], 0).into(),
                    cert: credentials.serving_cert.clone(),
                    key: credentials.serving_key.clone(),
                    client_ca: credentials.client_ca.clone(),
                }),
                ..KubeletConfig::new(NODE, &plane.dir().join("kubelet"))
            },
        )
        .map_err(|e| Error::Config(format!("cannot start the kubelet: {e}")))?;
        kubelet
            .start()
            .await
            .map_err(|e| Error::Config(format!("the kubelet did not join: {e}")))?;
        wait_node_ready(&admin).await?;

        agent_sandbox_local::router_pod::create_pod(&admin, &router_kubeconfig, ROUTER_POD).await?;
        let router_ip = agent_sandbox_local::router_pod::wait_ready(&admin, ROUTER_POD).await?;
        let router_url = format!("http://{router_ip}:{}", wire::ROUTER_PORT);
        // With the Gateway API installed, the Gateway that an implementation would program in
        // front of the router (its address: the router pod's).
        let gateway = match gateway_crds {
            Some(_) => {
                agent_sandbox_local::router_pod::write_gateway(
                    &admin,
                    &router_ip,
                    wire::ROUTER_PORT,
                )
                .await?;
                Some((
                    wire::DEFAULT_SANDBOX_NAMESPACE.to_owned(),
                    agent_sandbox_local::GATEWAY.to_owned(),
                ))
            }
            None => None,
        };

        apply_sandboxes(&plane, &admin).await?;
        Ok(Self {
            plane,
            kubelet,
            controller,
            router_url,
            gateway,
        })
    }

    /// A client with the admin's credentials.
    pub async fn client(&self) -> Result<kube::Client> {
        self.plane.client().await
    }

    /// The admin's kubeconfig.
    pub fn kubeconfig(&self) -> PathBuf {
        self.plane.kubeconfig().to_path_buf()
    }

    /// The control plane itself (its API server's metrics, its directory, its tools).
    pub fn control_plane(&self) -> &ControlPlane {
        &self.plane
    }

    /// The router pod's URL (reachable from this machine: pod IPs are loopback addresses).
    pub fn router_url(&self) -> &str {
        &self.router_url
    }

    /// The Gateway `(namespace, name)` in front of the router, when the Gateway API's CRDs
    /// were there to install (`cargo xtask tools` fetches them).
    pub fn gateway(&self) -> Option<(String, String)> {
        self.gateway.clone()
    }

    /// Ends the kubelet (and so every pod), the controller and the control plane.
    pub async fn stop(mut self) {
        self.kubelet.stop().await;
        self.controller.stop().await;
        self.plane.stop();
    }
}

/// `deploy/crds` (established) and `deploy/base`, applied as a user applies them: the CRDs
/// must be structural with every CEL rule within its cost budget, and every field of
/// `deploy/base` must pass the server's strict validation.
pub async fn apply_deploy(plane: &ControlPlane) -> Result<()> {
    plane
        .kubectl(&["apply", "--server-side", "-k", "deploy/crds"])
        .await?;
    plane
        .kubectl(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd",
            "sandboxes.agents.x-k8s.io",
            "sandboxtemplates.extensions.agents.x-k8s.io",
            "sandboxwarmpools.extensions.agents.x-k8s.io",
            "sandboxclaims.extensions.agents.x-k8s.io",
        ])
        .await?;
    plane
        .kubectl(&[
            "apply",
            "--server-side",
            "--validate=strict",
            "-k",
            "deploy/base",
        ])
        .await?;
    Ok(())
}

/// Scales `deploy/base`'s Deployments (the controller's and the router's) to zero, for a tier
/// that runs them otherwise (running them from their images as pods is the next tier's work).
pub async fn scale_deploy_base_to_zero(plane: &ControlPlane) -> Result<()> {
    plane
        .kubectl(&[
            "scale",
            "deployment",
            "--all",
            "--replicas=0",
            &format!("--namespace={}", wire::SYSTEM_NAMESPACE),
        ])
        .await?;
    Ok(())
}

/// The Gateway API's CRDs that `cargo xtask tools` puts next to the binaries, if it did.
fn gateway_api_crds(bin_dir: &Path) -> Option<PathBuf> {
    let dir = bin_dir.parent()?.join("gateway-api");
    dir.join("gateway.networking.k8s.io_gateways.yaml")
        .is_file()
        .then_some(dir)
}

/// The Gateway API's CRDs from `dir`, established.
async fn apply_gateway_api(plane: &ControlPlane, dir: &Path) -> Result<()> {
    let dir = dir.display().to_string();
    plane
        .kubectl(&["apply", "--server-side", "-f", &dir])
        .await?;
    plane
        .kubectl(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd",
            "gateways.gateway.networking.k8s.io",
            "gatewayclasses.gateway.networking.k8s.io",
        ])
        .await?;
    Ok(())
}

/// The Secret `cargo xtask cluster up` creates on a real cluster (docs/install.md).
async fn create_signing_key_secret(client: &kube::Client, key: &str) -> Result<()> {
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": wire::ROUTER_SIGNING_KEY_SECRET, "namespace": wire::SYSTEM_NAMESPACE},
        "stringData": {wire::ROUTER_SIGNING_KEY_SECRET_KEY: key},
    }))
    .map_err(|e| Error::Config(format!("the signing-key Secret: {e}")))?;
    Api::<Secret>::namespaced(client.clone(), wire::SYSTEM_NAMESPACE)
        .create(&PostParams::default(), &secret)
        .await
        .map_err(Error::kube("create the router's signing-key Secret"))?;
    Ok(())
}

/// The controller running as a process with its ServiceAccount's token ([`start_controller`]):
/// killed when dropped, its log printed when that happens in a failing test.
#[derive(Debug)]
pub struct ControllerProcess {
    child: tokio::process::Child,
    metrics: u16,
    log: PathBuf,
}

impl ControllerProcess {
    /// The port of its metrics on 127.0.0.1.
    pub fn metrics_port(&self) -> u16 {
        self.metrics
    }

    /// Its log (stderr).
    pub fn log(&self) -> &Path {
        &self.log
    }

    async fn stop(mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            eprintln!("--- {} ---\n{log}", self.log.display());
        }
    }
}

/// Starts the controller with its ServiceAccount's token (what its ClusterRole grants must be
/// all it needs), logging to `controller.log` in the plane's directory; returns once it is
/// ready.
pub async fn start_controller(plane: &ControlPlane) -> Result<ControllerProcess> {
    let kubeconfig = plane
        .service_account_kubeconfig(
            wire::SYSTEM_NAMESPACE,
            "agent-sandbox-controller",
            "controller.kubeconfig",
        )
        .await?;
    let binary = testkit::workspace_binary("agent-sandbox-controller", "agent-sandbox-controller")?;
    let health = crate::control_plane::free_port()?;
    let metrics = crate::control_plane::free_port()?;
    let log_path = plane.dir().join("controller.log");
    let log = std::fs::File::create(&log_path).map_err(Error::io("create", &log_path))?;
    let child = tokio::process::Command::new(&binary)
        .env("KUBECONFIG", &kubeconfig)
        .env("POD_NAMESPACE", wire::SYSTEM_NAMESPACE)
        .env("RUST_LOG", "info")
        .arg(format!("--health-probe-bind-address=127.0.0.1:{health}"))
        .arg(format!("--metrics-bind-address=127.0.0.1:{metrics}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .map_err(Error::io("start", &binary))?;
    let controller = ControllerProcess {
        child,
        metrics,
        log: log_path,
    };
    let url = format!("http://127.0.0.1:{health}/readyz");
    wait_for("the controller to be ready", STEP, || async {
        Ok::<_, Error>(match testkit::http::get(&url).await {
            Ok(response) if response.status == 200 => Check::Done(()),
            Ok(response) => Check::NotYet(format!("status {}", response.status)),
            Err(error) => Check::NotYet(error.to_string()),
        })
    })
    .await?;
    Ok(controller)
}

async fn wait_node_ready(client: &kube::Client) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    wait_for(&format!("node {NODE} to be Ready"), STEP, || async {
        let node = nodes
            .get_opt(NODE)
            .await
            .map_err(Error::kube(format!("get node {NODE}")))?;
        let ready = node
            .as_ref()
            .and_then(|n| n.status.as_ref())
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        Ok::<_, Error>(if ready {
            Check::Done(())
        } else {
            Check::NotYet(format!("{:?}", node.map(|n| n.status)))
        })
    })
    .await?;
    Ok(())
}

/// `deploy/sandboxes` as a user applies it (strict validation), once the sandboxes' namespace
/// has the `default` ServiceAccount that the controller manager gives a real cluster's
/// namespaces before pods can be created there.
pub async fn apply_sandboxes(plane: &ControlPlane, client: &kube::Client) -> Result<()> {
    let accounts: Api<ServiceAccount> =
        Api::namespaced(client.clone(), wire::DEFAULT_SANDBOX_NAMESPACE);
    wait_for(
        "the default ServiceAccount of the sandboxes' namespace",
        STEP,
        || async {
            Ok::<_, Error>(
                match accounts
                    .get_opt("default")
                    .await
                    .map_err(Error::kube("get ServiceAccount default"))?
                {
                    Some(_) => Check::Done(()),
                    None => Check::NotYet("not yet created".to_owned()),
                },
            )
        },
    )
    .await?;
    plane
        .kubectl(&[
            "apply",
            "--server-side",
            "--validate=strict",
            "-k",
            "deploy/sandboxes",
        ])
        .await?;
    Ok(())
}
