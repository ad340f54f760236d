//! [`crate::Target::ControlPlane`]: our system installed on the real control plane of
//! [`crate::control_plane`] the way a user installs it on kind: `deploy/crds`, then
//! `kubectl apply -k deploy/overlays/kind` with strict validation (the controller's and the
//! router's Deployments, RBAC, Services, PodDisruptionBudget and NetworkPolicy, and
//! `deploy/sandboxes`), and the router's signing-key Secret that `cargo xtask cluster up`
//! creates. Our kubelet is the one node, with its own credentials, serving the kubelet API
//! (logs, port-forward) to the API server, and runs the controller and the router **as pods
//! of those Deployments**: their images map to this workspace's binaries, which then get the
//! manifests' args and env (`fieldRef`), the signing-key Secret volume, projected
//! ServiceAccount tokens with in-cluster configuration, and readiness and liveness probes.
//!
//! With [`Install::Helm`] the same system comes from the Helm chart instead
//! (`deploy/helm/agent-sandbox`, `helm install` with the kind images and the chart's own
//! signing-key Secret), its render first checked by the API server with strict validation, and
//! an upgrade shown to keep the generated key.
//!
//! The run is inside a network namespace of its own ([`crate::netns`]), where pod IPs come
//! from [`crate::netns::POD_NETWORK`]: the API server accepts them in EndpointSlices, so the
//! Services have endpoints as on a node with a CNI. The Gateway API's CRDs (from `cargo xtask
//! tools`) are installed with the Gateway an implementation would program in front of the
//! router.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use agent_sandbox_api::wire;
use agent_sandbox_kubelet::{
    ApiServing, ImageEntry, ImageTable, Isolation, Kubelet, KubeletConfig, NodeCapacity,
    PodNetwork, Program, runtime_entry,
};
use agent_sandbox_local::testkit;
use agent_sandbox_local::wait::{Check, wait_for};
use k8s_openapi::api::core::v1::{Node, Pod, Secret, ServiceAccount};
use kube::Api;
use kube::api::{ListParams, PostParams};

use crate::control_plane::{ControlPlane, Tools};
use crate::error::{Error, Result};
use crate::node::{NodeTools, RealNode};

/// The node's name.
const NODE: &str = "node-1";
/// Within this, each step of the setup is done (usually in well under a tenth).
const STEP: Duration = Duration::from_secs(120);
/// The overlay a user applies on kind, whose image names the kubelet maps to our binaries.
const OVERLAY: &str = "deploy/overlays/kind";

/// `deploy/sandboxes` under gVisor (`runtimeClassName: gvisor`, names suffixed `-gvisor`),
/// installed on a real node.
pub const GVISOR_SANDBOXES: &str = "deploy/sandboxes-gvisor";

/// The chart `helm install` installs in [`Install::Helm`].
const CHART: &str = "deploy/helm/agent-sandbox";
/// Its release name.
const RELEASE: &str = "agent-sandbox";
/// The chart's values for this node: the kind overlay's images (which [`images`] maps to our
/// binaries) and the Python template and pool of `deploy/sandboxes`.
const CHART_VALUES: [&str; 10] = [
    "controller.image.repository=agent-sandbox/controller",
    "controller.image.tag=dev",
    "controller.image.digest=",
    "router.image.repository=agent-sandbox/router",
    "router.image.tag=dev",
    "router.image.digest=",
    "sandboxes.enabled=true",
    "sandboxes.image.repository=agent-sandbox/runtime-python",
    "sandboxes.image.tag=dev",
    "sandboxes.image.digest=",
];

/// How our system is installed on the control plane.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Install {
    /// `kubectl apply -k deploy/overlays/kind`, as a user does on kind.
    #[default]
    Kustomize,
    /// `helm install` of `deploy/helm/agent-sandbox`, as a user does with Helm (plus
    /// `deploy/sandboxes/namespace-router`, which the chart does not hold).
    Helm,
}

/// The node the control plane gets.
#[derive(Clone, Debug, Default)]
pub enum NodeKind {
    /// Our process kubelet (`crates/kubelet`): the Deployments' images map to this workspace's
    /// binaries, run as confined processes.
    #[default]
    Process,
    /// A real node ([`crate::node::RealNode`]: containerd with runc and gVisor, the real
    /// kubelet, kube-proxy, CNI), its programs in `tools` (`cargo xtask tools --node
    /// --print-bin-dir`'s first directory), our images imported from these OCI archives
    /// (`cargo xtask images --oci`).
    Real {
        /// The node programs' directory.
        tools: PathBuf,
        /// OCI image archives to import.
        images: Vec<PathBuf>,
    },
}

/// The node that runs the pods.
enum RunningNode {
    Process(Box<Kubelet>),
    Real(Box<RealNode>),
}

/// The running installation; [`PlaneCluster::stop`] (or dropping it) ends every process.
pub struct PlaneCluster {
    plane: ControlPlane,
    node: RunningNode,
    router_url: String,
    gateway: Option<(String, String)>,
    deployments: String,
}

impl std::fmt::Debug for PlaneCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlaneCluster")
            .field("plane", &self.plane)
            .field("router_url", &self.router_url)
            .finish_non_exhaustive()
    }
}

/// The image table of the node: the overlay's images run this workspace's binaries.
fn images() -> Result<ImageTable> {
    let runtime = testkit::workspace_binary("agent-sandbox-runtime", "sandbox-runtime")?;
    let router = testkit::router_binary()?;
    let controller =
        testkit::workspace_binary("agent-sandbox-controller", "agent-sandbox-controller")?;
    let mut images = ImageTable::with_defaults();
    images.prepend(runtime_entry("*runtime*", Program::Path(runtime)));
    images.prepend(ImageEntry::new(
        "agent-sandbox/router:*",
        Program::Path(router),
    ));
    images.prepend(ImageEntry::new(
        "agent-sandbox/controller:*",
        Program::Path(controller),
    ));
    Ok(images)
}

impl PlaneCluster {
    /// Starts the control plane from the binaries in `bin_dir` and installs our system on it
    /// with kustomize. Must run inside the network namespace of [`crate::netns::run_inside`].
    pub async fn start(bin_dir: &Path) -> Result<Self> {
        Self::start_with(bin_dir, Install::Kustomize, NodeKind::Process).await
    }

    /// [`PlaneCluster::start`], installing as `install` says, on the node `node` says.
    pub async fn start_with(bin_dir: &Path, install: Install, node: NodeKind) -> Result<Self> {
        if !crate::netns::inside() {
            return Err(Error::Config(
                "the control-plane tier runs in a network namespace of its own: start it \
                 through `cargo xtask e2e --control-plane` (or call netns::run_inside first)"
                    .to_owned(),
            ));
        }
        let tools = Tools::in_dir(bin_dir)?;
        let (plane, real) = match &node {
            NodeKind::Process => (ControlPlane::start(tools, NODE).await?, None),
            NodeKind::Real {
                tools: node_tools,
                images,
            } => {
                let address = crate::node::NODE_IP.to_string();
                let plane = ControlPlane::start_for_node_at(tools, NODE, &[&address]).await?;
                let real = RealNode::start(&plane, NodeTools::in_dir(node_tools)?).await?;
                let archives: Vec<&Path> = images.iter().map(PathBuf::as_path).collect();
                real.import_images(&archives).await?;
                (plane, Some(real))
            }
        };
        let admin = plane.client().await?;
        let gateway_crds = gateway_api_crds(bin_dir);
        if let Some(dir) = &gateway_crds {
            apply_gateway_api(&plane, dir).await?;
        }
        let installed = match install {
            Install::Kustomize => {
                apply_crds(&plane).await?;
                plane
                    .kubectl(&["apply", "--server-side", "--validate=strict", "-k", OVERLAY])
                    .await?;
                // The key in agent-sandbox-system, and the same key for the router of the
                // sandboxes' namespace (deploy/sandboxes/namespace-router), as `cargo xtask
                // cluster up` makes them.
                let key = agent_sandbox_local::new_secret()?;
                for namespace in [wire::SYSTEM_NAMESPACE, wire::DEFAULT_SANDBOX_NAMESPACE] {
                    create_signing_key_secret(&admin, namespace, &key).await?;
                }
                format!("installed with kubectl apply -k {OVERLAY}\n")
            }
            Install::Helm => install_with_helm(&plane, &admin).await?,
        };

        let node = match real {
            Some(real) => RunningNode::Real(Box::new(real)),
            None => RunningNode::Process(Box::new(start_process_kubelet(&plane, &admin).await?)),
        };

        for namespace in [wire::SYSTEM_NAMESPACE, wire::DEFAULT_SANDBOX_NAMESPACE] {
            let waited = plane
                .kubectl(&[
                    "wait",
                    "--for=condition=Available",
                    "--timeout=180s",
                    "deployment",
                    "--all",
                    &format!("--namespace={namespace}"),
                ])
                .await;
            if let Err(error) = waited {
                return Err(match &node {
                    RunningNode::Process(_) => with_pods_of(error, plane.dir()),
                    RunningNode::Real(real) => {
                        let containers = containers_logs(&plane, namespace).await;
                        with_node_logs(error, real, &containers)
                    }
                });
            }
        }
        let deployments = plane
            .kubectl(&["get", "deployment", "-o", "wide", "--all-namespaces"])
            .await?;
        let restart = match &node {
            // Our kubelet's own check: a killed container restarts in its pod.
            RunningNode::Process(_) => a_killed_container_restarts(&admin).await?,
            RunningNode::Real(real) => format!(
                "crictl ps (runtime handlers per pod: crictl pods):\n{}{}",
                real.crictl_ps().await?,
                real.crictl(&["pods"]).await?
            ),
        };
        let deployments = format!("{installed}{deployments}{restart}\n");
        let router_ip = ready_router_ip(&admin).await?;
        let router_url = format!("http://{router_ip}:{}", wire::ROUTER_PORT);
        // With the Gateway API installed, the Gateway that an implementation would program in
        // front of the router (its address: a router pod's).
        let gateway = match gateway_crds {
            Some(_) => {
                agent_sandbox_local::router_pod::write_gateway(
                    &admin,
                    &router_ip.to_string(),
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
        Ok(Self {
            plane,
            node,
            router_url,
            gateway,
            deployments,
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

    /// A router pod's URL (reachable from this process, which shares the pods' network
    /// namespace).
    pub fn router_url(&self) -> &str {
        &self.router_url
    }

    /// The Gateway `(namespace, name)` in front of the router, when the Gateway API's CRDs
    /// were there to install (`cargo xtask tools` fetches them).
    pub fn gateway(&self) -> Option<(String, String)> {
        self.gateway.clone()
    }

    /// `kubectl get deployment -o wide --all-namespaces` once all were Available.
    pub fn deployments(&self) -> &str {
        &self.deployments
    }

    /// The real node, on [`NodeKind::Real`].
    pub fn real_node(&self) -> Option<&RealNode> {
        match &self.node {
            RunningNode::Real(real) => Some(real),
            RunningNode::Process(_) => None,
        }
    }

    /// On a real node (which has gVisor): applies [`GVISOR_SANDBOXES`], the same template and
    /// pool under gVisor, as a user adds them. Elsewhere an error: pods would never start.
    pub async fn apply_gvisor_sandboxes(&self) -> Result<()> {
        match &self.node {
            RunningNode::Real(_) => {
                apply_with_kind_images(&self.plane, GVISOR_SANDBOXES, "sandboxes-gvisor").await
            }
            RunningNode::Process(_) => Err(Error::Config(format!(
                "{GVISOR_SANDBOXES} needs a node with gVisor; this tier's node is our kubelet"
            ))),
        }
    }

    /// Ends the node (and so every pod) and the control plane.
    pub async fn stop(mut self) {
        match &mut self.node {
            RunningNode::Process(kubelet) => kubelet.stop().await,
            RunningNode::Real(real) => real.stop(),
        }
        self.plane.stop();
    }
}

/// Our kubelet joined as the node with its own credentials, serving the kubelet API; returns
/// once the Node is Ready.
async fn start_process_kubelet(plane: &ControlPlane, admin: &kube::Client) -> Result<Kubelet> {
    let images = images()?;
    let api: SocketAddr = plane
        .server()
        .trim_start_matches("https://")
        .parse()
        .map_err(|e| Error::Config(format!("the API server's address: {e}")))?;
    let credentials = plane.node().clone();
    let (network, prefix) = crate::netns::POD_NETWORK;
    let kubelet = Kubelet::new(
        plane.node_client().await?,
        KubeletConfig {
            images,
            // Confined, as on the sim: the Deployments' volumes (Secrets and tokens at
            // absolute paths) need pods with roots of their own.
            isolation: Isolation::Confined,
            api: Some(ApiServing {
                listen: ([127, 0, 0, 1], 0).into(),
                cert: credentials.serving_cert.clone(),
                key: credentials.serving_key.clone(),
                client_ca: credentials.client_ca.clone(),
            }),
            kubernetes_service: Some(api),
            pod_network: PodNetwork::Local { network, prefix },
            // Room for every pod the suite and the benches make (the template asks 250m
            // each, the controller and the routers 350m): this node enforces no requests,
            // and with a machine's 2 CPUs the scheduler would leave claims Pending.
            capacity: NodeCapacity {
                cpu: "64".to_owned(),
                memory: "256Gi".to_owned(),
                pods: 1000,
                ..NodeCapacity::default()
            },
            ..KubeletConfig::new(NODE, &plane.dir().join("kubelet"))
        },
    )
    .map_err(|e| Error::Config(format!("cannot start the kubelet: {e}")))?;
    kubelet
        .start()
        .await
        .map_err(|e| Error::Config(format!("the kubelet did not join: {e}")))?;
    wait_node_ready(admin).await?;
    Ok(kubelet)
}

/// Installs our system from the chart: its render goes through the API server's strict
/// validation first (a dry run), then `helm install` (CRDs from the chart's `crds/`, the
/// router's signing-key Secret generated by the chart), then `helm upgrade`, which must keep
/// that key. The router of the sandboxes' namespace gets the same key. Returns a report line.
async fn install_with_helm(plane: &ControlPlane, admin: &kube::Client) -> Result<String> {
    let system = wire::SYSTEM_NAMESPACE;
    let mut values = Vec::new();
    for value in CHART_VALUES {
        values.extend(["--set", value]);
    }
    let install: Vec<&str> = ["install", RELEASE, CHART, "--namespace", system]
        .into_iter()
        .chain(["--create-namespace"])
        .chain(values.iter().copied())
        .collect();
    plane.helm(&install).await?;
    let key = read_signing_key(admin).await?;
    // What helm installed, as the API server validates it strictly (unknown or duplicate fields
    // are errors): the chart's render, applied as a dry run.
    let template: Vec<&str> = ["template", RELEASE, CHART, "--namespace", system]
        .into_iter()
        .chain(values.iter().copied())
        .collect();
    let rendered = plane.helm(&template).await?;
    let file = plane.dir().join("chart-render.yaml");
    std::fs::write(&file, rendered).map_err(Error::io("write", &file))?;
    let file_arg = file.to_string_lossy().into_owned();
    plane
        .kubectl(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            "--dry-run=server",
            "--validate=strict",
            "-f",
            &file_arg,
        ])
        .await?;
    let upgrade: Vec<&str> = ["upgrade", RELEASE, CHART, "--namespace", system]
        .into_iter()
        .chain(["--reuse-values"])
        .collect();
    plane.helm(&upgrade).await?;
    if read_signing_key(admin).await? != key {
        return Err(Error::Config(
            "helm upgrade replaced the router's signing key that the chart generated: \
             every scoped token in use would stop working"
                .to_owned(),
        ));
    }
    // The router of the sandboxes' namespace (upstream's Go SDK reaches it by DNS), with the
    // kind images, and the same key.
    apply_with_kind_images(
        plane,
        "deploy/sandboxes/namespace-router",
        "namespace-router",
    )
    .await?;
    create_signing_key_secret(admin, wire::DEFAULT_SANDBOX_NAMESPACE, &key).await?;
    let status = plane
        .helm(&["status", RELEASE, "--namespace", system])
        .await?;
    let revision = status
        .lines()
        .find_map(|line| line.strip_prefix("REVISION:"))
        .map_or_else(|| "?".to_owned(), |r| r.trim().to_owned());
    Ok(format!(
        "installed with helm install {CHART} (release {RELEASE}, revision {revision} after an \
         upgrade that kept the generated signing key; its render passed the API server's strict \
         validation)\n"
    ))
}

/// The signing key in the router's Secret of the system namespace.
async fn read_signing_key(client: &kube::Client) -> Result<String> {
    let secret = Api::<Secret>::namespaced(client.clone(), wire::SYSTEM_NAMESPACE)
        .get(wire::ROUTER_SIGNING_KEY_SECRET)
        .await
        .map_err(Error::kube("get the router's signing-key Secret"))?;
    let bytes = secret
        .data
        .and_then(|mut data| data.remove(wire::ROUTER_SIGNING_KEY_SECRET_KEY))
        .ok_or_else(|| {
            Error::Config(format!(
                "Secret {} has no {}",
                wire::ROUTER_SIGNING_KEY_SECRET,
                wire::ROUTER_SIGNING_KEY_SECRET_KEY
            ))
        })?;
    String::from_utf8(bytes.0)
        .map_err(|_| Error::Config("the router's signing key is not UTF-8".to_owned()))
}

/// The kind overlay's `images:` (placeholder, name, tag), which folders applied on their own
/// ([`apply_with_kind_images`]) get too; a test holds them to `deploy/overlays/kind`.
const KIND_IMAGES: [(&str, &str, &str); 3] = [
    (
        "agent-sandbox-controller",
        "agent-sandbox/controller",
        "dev",
    ),
    ("sandbox-router", "agent-sandbox/router", "dev"),
    (
        "sandbox-runtime-python",
        "agent-sandbox/runtime-python",
        "dev",
    ),
];

/// Applies the kustomize folder `folder` (relative to the workspace) with the kind overlay's
/// images, as a user adds it to that overlay: through a kustomization in the run's directory
/// `<plane>/<name>` that names it (by a relative path: kustomize refuses absolute ones).
async fn apply_with_kind_images(plane: &ControlPlane, folder: &str, name: &str) -> Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap_or(Path::new("."));
    let dir = plane.dir().join(name);
    std::fs::create_dir_all(&dir).map_err(Error::io("create", &dir))?;
    let ups = dir.components().count().saturating_sub(1);
    let target = root.join(folder);
    let relative = format!(
        "{}{}",
        "../".repeat(ups),
        target.to_string_lossy().trim_start_matches('/')
    );
    let images: Vec<_> = KIND_IMAGES
        .iter()
        .map(|(placeholder, name, tag)| {
            serde_json::json!({"name": placeholder, "newName": name, "newTag": tag})
        })
        .collect();
    let kustomization = serde_json::json!({
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [relative],
        "images": images,
    });
    let file = dir.join("kustomization.yaml");
    std::fs::write(&file, kustomization.to_string()).map_err(Error::io("write", &file))?;
    let dir_arg = dir.to_string_lossy().into_owned();
    plane
        .kubectl(&[
            "apply",
            "--server-side",
            "--validate=strict",
            "-k",
            &dir_arg,
        ])
        .await?;
    Ok(())
}

/// Adds the logs of the system's pods to a failed wait, so the reason shows.
fn with_pods_of(error: Error, dir: &Path) -> Error {
    let logs = dir.join("kubelet").join("pods");
    Error::Config(format!(
        "{error}\n(the pods' logs are under {}; run with --keep to inspect)",
        logs.display()
    ))
}

/// Adds the ends of the real node's kubelet and containerd logs to a failed wait.
fn with_node_logs(error: Error, node: &RealNode, containers: &str) -> Error {
    Error::Config(format!(
        "{error}\n(the node's files are under {}; run with --keep to inspect)\nthe containers' \
         logs:\n{containers}\nthe end of the kubelet's log:\n{}\nthe end of containerd's log:\n{}\n\
         the end of kube-proxy's log:\n{}",
        node.dir().display(),
        node.log_tail("kubelet", 30),
        node.log_tail("containerd", 15),
        node.log_tail("kube-proxy", 15)
    ))
}

/// The end of every container's log in `namespace` (its previous run's, when it restarted),
/// through the API server as `kubectl logs` shows them.
async fn containers_logs(plane: &ControlPlane, namespace: &str) -> String {
    let pods = match plane
        .kubectl(&["get", "pods", "-n", namespace, "-o", "name"])
        .await
    {
        Ok(pods) => pods,
        Err(error) => return format!("(pods of {namespace}: {error})"),
    };
    let mut logs = String::new();
    for pod in pods.lines().filter(|line| !line.is_empty()) {
        let tail = [
            "logs",
            "-n",
            namespace,
            pod,
            "--all-containers",
            "--tail=15",
        ];
        let previous = [&tail[..], &["--previous"]].concat();
        let text = match plane.kubectl(&previous).await {
            Ok(text) => text,
            Err(_) => plane
                .kubectl(&tail)
                .await
                .unwrap_or_else(|error| error.to_string()),
        };
        logs.push_str(&format!("--- {namespace}/{pod}:\n{text}\n"));
    }
    logs
}

/// A container of a Deployment's pod that dies is restarted in place, as on a node: the
/// namespace router's container is killed (SIGKILL to its process group leader, the
/// `sim://<pid>` of its container ID), and the same pod runs it again (restart count 1) and is
/// Ready. Returns a line saying so.
async fn a_killed_container_restarts(client: &kube::Client) -> Result<String> {
    let namespace = wire::DEFAULT_SANDBOX_NAMESPACE;
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let selector = format!(
        "{}={}",
        agent_sandbox_api::labels::ROUTER_APP,
        agent_sandbox_api::labels::ROUTER_APP_VALUE
    );
    let list = pods
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(Error::kube("list the namespace router's pods"))?;
    let (name, pid) = list
        .items
        .iter()
        .find_map(|pod| {
            let status = pod.status.as_ref()?.container_statuses.as_ref()?.first()?;
            let pid = status.container_id.as_ref()?.strip_prefix("sim://")?;
            Some((pod.metadata.name.clone()?, pid.to_owned()))
        })
        .ok_or_else(|| Error::Config(format!("no running router pod in {namespace}")))?;
    let killed = std::time::Instant::now();
    let status = tokio::process::Command::new("kill")
        .args(["-KILL", &pid])
        .status()
        .await
        .map_err(Error::io("run", Path::new("kill")))?;
    if !status.success() {
        return Err(Error::Config(format!("kill -KILL {pid} failed: {status}")));
    }
    wait_for(
        &format!("router pod {namespace}/{name} to restart its container"),
        STEP,
        || async {
            let pod = pods
                .get(&name)
                .await
                .map_err(Error::kube(format!("get pod {namespace}/{name}")))?;
            let status = pod.status.unwrap_or_default();
            let container = status
                .container_statuses
                .unwrap_or_default()
                .into_iter()
                .next();
            let ready = container.as_ref().is_some_and(|c| c.ready);
            let restarts = container.as_ref().map_or(0, |c| c.restart_count);
            Ok::<_, Error>(if ready && restarts == 1 {
                Check::Done(())
            } else {
                Check::NotYet(format!("restart count {restarts}, ready {ready}"))
            })
        },
    )
    .await?;
    Ok(format!(
        "killed the container of router pod {namespace}/{name} (pid {pid}): restarted in the \
         same pod (restart count 1) and Ready again after {:.1} s",
        killed.elapsed().as_secs_f64()
    ))
}

/// The IP of a Ready router pod (label `app: sandbox-router`).
async fn ready_router_ip(client: &kube::Client) -> Result<Ipv4Addr> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), wire::SYSTEM_NAMESPACE);
    let selector = format!(
        "{}={}",
        agent_sandbox_api::labels::ROUTER_APP,
        agent_sandbox_api::labels::ROUTER_APP_VALUE
    );
    wait_for("a Ready router pod", STEP, || async {
        let list = pods
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(Error::kube("list the router's pods"))?;
        let ready = list.items.iter().find_map(|pod| {
            let status = pod.status.as_ref()?;
            let ready = status
                .conditions
                .as_ref()?
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            ready.then(|| status.pod_ip.as_ref()?.parse().ok())?
        });
        Ok::<_, Error>(match ready {
            Some(ip) => Check::Done(ip),
            None => Check::NotYet(format!("{} router pods, none Ready", list.items.len())),
        })
    })
    .await
}

/// `deploy/crds`, applied and established.
async fn apply_crds(plane: &ControlPlane) -> Result<()> {
    apply_established(
        plane,
        &["-k", "deploy/crds"],
        &[
            "sandboxes.agents.x-k8s.io",
            "sandboxtemplates.extensions.agents.x-k8s.io",
            "sandboxwarmpools.extensions.agents.x-k8s.io",
            "sandboxclaims.extensions.agents.x-k8s.io",
        ],
    )
    .await
}

/// `kubectl apply --server-side <source>`, then waits until the CRDs `crds` are Established.
async fn apply_established(plane: &ControlPlane, source: &[&str], crds: &[&str]) -> Result<()> {
    let apply: Vec<&str> = ["apply", "--server-side"]
        .iter()
        .chain(source)
        .copied()
        .collect();
    plane.kubectl(&apply).await?;
    let wait: Vec<&str> = [
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd",
    ]
    .iter()
    .chain(crds)
    .copied()
    .collect();
    plane.kubectl(&wait).await?;
    Ok(())
}

/// `deploy/crds` (established) and `deploy/base`, applied as a user applies them: the CRDs
/// must be structural with every CEL rule within its cost budget, and every field of
/// `deploy/base` must pass the server's strict validation.
pub async fn apply_deploy(plane: &ControlPlane) -> Result<()> {
    apply_crds(plane).await?;
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

/// Scales `deploy/base`'s Deployments (the controller's and the router's) to zero, for a test
/// that runs the controller as a process instead (`tests/control_plane.rs`).
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
    apply_established(
        plane,
        &["-f", &dir],
        &[
            "gateways.gateway.networking.k8s.io",
            "gatewayclasses.gateway.networking.k8s.io",
        ],
    )
    .await
}

/// The Secret `cargo xtask cluster up` creates on a real cluster (docs/install.md).
async fn create_signing_key_secret(
    client: &kube::Client,
    namespace: &str,
    key: &str,
) -> Result<()> {
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": wire::ROUTER_SIGNING_KEY_SECRET, "namespace": namespace},
        "stringData": {wire::ROUTER_SIGNING_KEY_SECRET_KEY: key},
    }))
    .map_err(|e| Error::Config(format!("the signing-key Secret: {e}")))?;
    Api::<Secret>::namespaced(client.clone(), namespace)
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

    /// Ends the process and waits for it.
    pub async fn stop(mut self) {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// [`KIND_IMAGES`] is what `deploy/overlays/kind` maps its placeholders to.
    #[test]
    fn the_kind_images_are_the_kind_overlays() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .unwrap()
            .join(OVERLAY)
            .join("kustomization.yaml");
        let overlay = std::fs::read_to_string(&path).unwrap();
        let images = &overlay[overlay.find("\nimages:").expect("an images: list")..];
        for (placeholder, name, tag) in KIND_IMAGES {
            let entry =
                format!("  - name: {placeholder}\n    newName: {name}\n    newTag: {tag}\n");
            assert!(images.contains(&entry), "{} lacks\n{entry}", path.display());
        }
        assert_eq!(
            images.matches("- name:").count(),
            KIND_IMAGES.len(),
            "{images}"
        );
    }
}
