//! "A cluster": how the scenarios reach whatever cluster they run against, and the setup and
//! cleanup around a run.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use agent_sandbox::{ClientOptions, ConnectionMode};
use agent_sandbox_api::{Sandbox, SandboxClaim, SandboxTemplate, SandboxWarmPool, wire};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt as _};

use crate::env;
use crate::error::{Error, Result};
use crate::plane_target::Install;
use crate::support::{RUN_LABEL, get, wait_pool_ready};

/// Which cluster to run against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// The simulated cluster, started in this process.
    Sim,
    /// A cluster with `deploy/` installed, reached with this kubeconfig.
    Kubeconfig(PathBuf),
    /// A real control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler from
    /// `cargo xtask tools`, found on `PATH`) with our kubelet as its node, set up by the suite
    /// as `deploy/` (or, with [`Install::Helm`], the Helm chart) sets up a cluster.
    ControlPlane(Install),
    /// The control plane of [`Target::ControlPlane`] with a real node instead of our kubelet
    /// (containerd with runc and gVisor, the real kubelet, kube-proxy, CNI: `cargo xtask tools
    /// --node`, found on `PATH`), our system installed from `deploy/overlays/kind` with the
    /// images of this OCI archive (`cargo xtask images --oci`; default [`env::IMAGES`]).
    Node {
        /// The archive to import into the node.
        images: Option<PathBuf>,
    },
    /// A throwaway k3s in Docker (feature `k3s`), with the images of this archive (`docker
    /// save`; default [`env::IMAGES`]).
    K3s {
        /// The image archive to import into the node.
        images: Option<PathBuf>,
    },
}

impl Target {
    /// For the report.
    pub fn describe(&self) -> String {
        match self {
            Self::Sim => "the simulated cluster".to_owned(),
            Self::Kubeconfig(path) => format!("the cluster of kubeconfig {}", path.display()),
            Self::ControlPlane(Install::Kustomize) => CONTROL_PLANE.to_owned(),
            Self::ControlPlane(Install::Helm) => format!("{CONTROL_PLANE}, installed with Helm"),
            Self::Node { .. } => NODE_TIER.to_owned(),
            Self::K3s { .. } => "a throwaway k3s (testcontainers)".to_owned(),
        }
    }

    /// The target [`env::CLUSTER`] and [`env::KUBECONFIG`] name (default: the sim).
    pub fn from_env() -> Result<Self> {
        let kind = std::env::var(env::CLUSTER).unwrap_or_default();
        match kind.as_str() {
            "" | "sim" => Ok(Self::Sim),
            "control-plane" => Ok(Self::ControlPlane(Install::Kustomize)),
            "control-plane-helm" => Ok(Self::ControlPlane(Install::Helm)),
            "node" => Ok(Self::Node {
                images: std::env::var_os(env::IMAGES).map(PathBuf::from),
            }),
            "k3s" => Ok(Self::K3s {
                images: std::env::var_os(env::IMAGES).map(PathBuf::from),
            }),
            "kubeconfig" => {
                let path = std::env::var_os(env::KUBECONFIG)
                    .or_else(|| std::env::var_os("KUBECONFIG"))
                    .map(PathBuf::from)
                    .or_else(|| {
                        std::env::var_os("HOME").map(|h| Path::new(&h).join(".kube/config"))
                    })
                    .ok_or_else(|| {
                        Error::Config(format!(
                            "{}=kubeconfig needs a kubeconfig: set {} (or KUBECONFIG)",
                            env::CLUSTER,
                            env::KUBECONFIG
                        ))
                    })?;
                Ok(Self::Kubeconfig(path))
            }
            other => Err(Error::Config(format!(
                "{}={other:?} is not a cluster kind: use sim, control-plane, control-plane-helm, \
                 node, kubeconfig or k3s",
                env::CLUSTER
            ))),
        }
    }
}

/// One of the SDK's ways to reach the router.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SdkMode {
    /// A local listener port-forwarding to a router pod (the SDK's default).
    PortForward,
    /// A router URL reachable from here.
    Direct,
    /// The address of a Gateway in front of the router.
    Gateway,
}

/// How to reach the router.
#[derive(Clone)]
pub struct RouterAccess {
    /// Namespace of `sandbox-router-svc` (port-forward mode).
    pub namespace: String,
    /// A URL reachable from here (direct mode), when there is one.
    pub url: Option<String>,
    /// A Gateway `(namespace, name)` in front of the router, when there is one.
    pub gateway: Option<(String, String)>,
    /// The router's signing key (`--auth scoped`), read from its Secret.
    pub signing_key: Option<Vec<u8>>,
    /// The same key in a private file, for the binaries' `--signing-key-file`.
    pub signing_key_file: Option<PathBuf>,
    /// A static bearer token (`--auth token`).
    pub token: Option<String>,
}

impl std::fmt::Debug for RouterAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouterAccess")
            .field("namespace", &self.namespace)
            .field("url", &self.url)
            .field("gateway", &self.gateway)
            .field(
                "signing_key",
                &self.signing_key.as_ref().map(|_| "<redacted>"),
            )
            .field("signing_key_file", &self.signing_key_file)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// A template and pool the suite runs its scenarios on, once per pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pass {
    /// The SandboxTemplate.
    pub template: String,
    /// Its SandboxWarmPool.
    pub pool: String,
    /// The RuntimeClass its pods run under (`None`: the node's default runtime).
    pub runtime_class: Option<String>,
}

impl Pass {
    /// `deploy/sandboxes-gvisor`'s: `deploy/sandboxes`' names with its `nameSuffix`.
    fn gvisor(template: &str, pool: &str) -> Self {
        Self {
            template: format!("{template}-gvisor"),
            pool: format!("{pool}-gvisor"),
            runtime_class: Some("gvisor".to_owned()),
        }
    }
}

/// Whether the cluster's network enforces NetworkPolicies (the network probe needs it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NetworkEnforcement {
    /// A real CNI enforces them.
    Enforced,
    /// They are not enforced here, for this reason.
    NotEnforced(String),
}

/// How [`Target::ControlPlane`] describes itself.
const CONTROL_PLANE: &str = "the control-plane tier (kube-apiserver, etcd, kube-controller-manager, kube-scheduler; our kubelet as the node)";

/// How [`Target::Node`] describes itself.
const NODE_TIER: &str = "the node tier (kube-apiserver, etcd, kube-controller-manager, kube-scheduler; containerd with runc and gVisor, the real kubelet, kube-proxy and CNI as the node)";

/// What keeps the cluster alive while the run lasts.
enum Backing {
    Sim(Box<agent_sandbox_local::LocalCluster>),
    ControlPlane(Box<crate::plane_target::PlaneCluster>),
    #[cfg(feature = "k3s")]
    K3s(Box<crate::k3s::K3sCluster>),
    External,
}

/// The cluster a run targets (started by the suite, or reached through a kubeconfig), as the
/// scenarios see it: a client, the binaries' flags, how to reach the router, the names of the
/// template and pool, the run's id.
pub struct ClusterUnderTest {
    /// For the report (`simulated cluster`, `kubeconfig ~/.kube/config`).
    pub description: String,
    /// A client with the kubeconfig's identity.
    pub kube: kube::Client,
    /// The kubeconfig (for `sandboxctl` and `sandbox-agent`).
    pub kubeconfig: PathBuf,
    /// Namespace of the template, pool and claims.
    pub namespace: String,
    /// The SandboxTemplate of `deploy/sandboxes`.
    pub template: String,
    /// Its SandboxWarmPool.
    pub pool: String,
    /// The template of the pools the scenarios make for themselves: [`Self::template`]'s copy
    /// (`e2e-<run>-<template>`, labelled with the run) whose containers request a tenth of the
    /// CPU, so that a small node (a real one of two CPUs) holds the scenarios' pools besides
    /// the sandboxes of [`Self::pool`]. Everything else is the template's.
    pub scenario_template: String,
    /// The RuntimeClass the template's pods run under (`None`: the node's default runtime).
    pub runtime_class: Option<String>,
    /// The pools of the run's further passes, after the first on [`Self::pool`]: on the node
    /// tier, `deploy/sandboxes-gvisor`'s.
    further_passes: Vec<Pass>,
    /// How to reach the router.
    pub router: RouterAccess,
    /// Whether NetworkPolicies are enforced.
    pub network: NetworkEnforcement,
    /// `HOST:PORT` a sandbox should reach on the internet.
    pub public_address: String,
    /// This run's id: in the names and the run label (`e2e.agent-sandbox.dev/run`) of everything
    /// it creates.
    pub run: String,
    scratch: tempfile::TempDir,
    backing: Backing,
    /// The run's stand-in for the internet (in its own network namespace), stopped with it.
    _internet: Option<agent_sandbox_local::testkit::Internet>,
}

/// `HOST:PORT` a sandbox should reach on the internet: the run's own stand-in when it has one.
fn default_public_address(internet: Option<&agent_sandbox_local::testkit::Internet>) -> String {
    match internet {
        Some(_) => format!("{}:80", agent_sandbox_local::testkit::INTERNET_ADDRESS),
        None => "pypi.org:443".to_owned(),
    }
}

impl std::fmt::Debug for ClusterUnderTest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterUnderTest")
            .field("description", &self.description)
            .field("namespace", &self.namespace)
            .field("pool", &self.pool)
            .field("router", &self.router)
            .field("run", &self.run)
            .finish_non_exhaustive()
    }
}

fn setting(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_owned())
}

impl ClusterUnderTest {
    /// Starts (sim, k3s) or connects to (kubeconfig) the cluster, finds the router and its key,
    /// and waits until the pool of `deploy/sandboxes` is Ready.
    pub async fn start(target: &Target) -> Result<Self> {
        // Idempotent; kube's TLS stack needs the one provider the workspace uses.
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let namespace = setting(env::NAMESPACE, wire::DEFAULT_SANDBOX_NAMESPACE);
        let template = setting(env::TEMPLATE, agent_sandbox_local::DEFAULT_TEMPLATE);
        let pool = setting(env::POOL, agent_sandbox_local::DEFAULT_POOL);
        let scratch = scratch_dir()?;
        let router_namespace = wire::SYSTEM_NAMESPACE.to_owned();
        let further_passes = match target {
            Target::Node { .. } => vec![Pass::gvisor(&template, &pool)],
            _ => Vec::new(),
        };
        let (description, kube, kubeconfig, network, url, gateway, backing) = match target {
            Target::Sim => {
                let sim = crate::sim::start().await?;
                let protections = sim.protections();
                let network =
                    if protections.network.is_none() && protections.loopback_only.is_none() {
                        NetworkEnforcement::Enforced
                    } else {
                        NetworkEnforcement::NotEnforced(format!(
                            "the simulated cluster's pods share this machine's network here ({}): \
                         NetworkPolicies are stored and checked, but nothing enforces them",
                            sim.protections().network.clone().unwrap_or_default()
                        ))
                    };
                (
                    "the simulated cluster".to_owned(),
                    sim.client(),
                    sim.kubeconfig_path().to_path_buf(),
                    network,
                    sim.router_pod_url().map(str::to_owned),
                    Some((namespace.clone(), agent_sandbox_local::GATEWAY.to_owned())),
                    Backing::Sim(Box::new(sim)),
                )
            }
            Target::ControlPlane(install) => {
                let bin_dir =
                    agent_sandbox_local::testkit::Tool::control_plane_dir().ok_or_else(|| {
                        Error::Config(
                            agent_sandbox_local::testkit::Tool::ControlPlane
                                .unavailable()
                                .unwrap_or_else(|| {
                                    "the control plane's binaries are missing".to_owned()
                                }),
                        )
                    })?;
                let plane = crate::plane_target::PlaneCluster::start_with(
                    &bin_dir,
                    *install,
                    crate::plane_target::NodeKind::Process,
                )
                .await?;
                println!(
                    "e2e: {}; kubectl get deployment -A:\n{}",
                    match install {
                        Install::Kustomize => "installed from deploy/overlays/kind",
                        Install::Helm => "installed from deploy/helm/agent-sandbox",
                    },
                    plane.deployments().trim_end()
                );
                (
                    CONTROL_PLANE.to_owned(),
                    plane.client().await?,
                    plane.kubeconfig(),
                    NetworkEnforcement::NotEnforced(
                        "the control-plane tier runs pods as processes sharing one network \
                         namespace (the run's own), without a CNI: the API server stores and \
                         validates NetworkPolicies, but nothing enforces them"
                            .to_owned(),
                    ),
                    Some(plane.router_url().to_owned()),
                    plane.gateway(),
                    Backing::ControlPlane(Box::new(plane)),
                )
            }
            Target::Node { images } => {
                let images = images.clone().ok_or_else(|| {
                    Error::Config(format!(
                        "the node tier needs our images: `cargo xtask images --oci DIR`, then \
                         --images DIR/images.tar (or {}); `cargo xtask e2e --node` does both",
                        env::IMAGES
                    ))
                })?;
                let missing = || {
                    Error::Config(
                        agent_sandbox_local::testkit::Tool::Node
                            .unavailable()
                            .unwrap_or_else(|| "the node's programs are missing".to_owned()),
                    )
                };
                let bin_dir =
                    agent_sandbox_local::testkit::Tool::control_plane_dir().ok_or_else(missing)?;
                let node_dir =
                    agent_sandbox_local::testkit::Tool::node_dir().ok_or_else(missing)?;
                let plane = crate::plane_target::PlaneCluster::start_with(
                    &bin_dir,
                    Install::Kustomize,
                    crate::plane_target::NodeKind::Real {
                        tools: node_dir,
                        images: vec![images],
                    },
                )
                .await?;
                println!(
                    "e2e: installed from deploy/overlays/kind; kubectl get deployment -A:\n{}",
                    plane.deployments().trim_end()
                );
                // A real enforcer always runs there (`node::Enforcer`): the network
                // scenarios run.
                let network = NetworkEnforcement::Enforced;
                (
                    NODE_TIER.to_owned(),
                    plane.client().await?,
                    plane.kubeconfig(),
                    network,
                    Some(plane.router_url().to_owned()),
                    plane.gateway(),
                    Backing::ControlPlane(Box::new(plane)),
                )
            }
            Target::Kubeconfig(path) => {
                let kube = client_from(path).await?;
                (
                    format!("the cluster of kubeconfig {}", path.display()),
                    kube,
                    path.clone(),
                    NetworkEnforcement::Enforced,
                    None,
                    None,
                    Backing::External,
                )
            }
            #[cfg(feature = "k3s")]
            Target::K3s { images } => {
                let k3s = crate::k3s::K3sCluster::start(scratch.path(), images.as_deref()).await?;
                (
                    "a throwaway k3s (testcontainers)".to_owned(),
                    k3s.client(),
                    k3s.kubeconfig().to_path_buf(),
                    NetworkEnforcement::Enforced,
                    None,
                    None,
                    Backing::K3s(Box::new(k3s)),
                )
            }
            #[cfg(not(feature = "k3s"))]
            Target::K3s { .. } => {
                return Err(Error::Config(
                    "this build has no k3s support: run `cargo xtask e2e --k3s`, which builds \
                     the suite with the `k3s` feature"
                        .to_owned(),
                ));
            }
        };
        let url = std::env::var(env::ROUTER_URL)
            .ok()
            .filter(|u| !u.is_empty())
            .or(url);
        let gateway = match std::env::var(env::GATEWAY).ok().filter(|g| !g.is_empty()) {
            Some(value) => Some(parse_gateway(&value)?),
            None => gateway,
        };
        let token = std::env::var(env::ROUTER_TOKEN)
            .ok()
            .filter(|t| !t.is_empty());
        // In the run's own network namespace there is no internet: one of the run's own stands
        // for it.
        let internet = if crate::netns::inside() && std::env::var_os(env::PUBLIC_ADDRESS).is_none()
        {
            Some(agent_sandbox_local::testkit::Internet::start().map_err(Error::Config)?)
        } else {
            None
        };
        let signing_key = read_signing_key(&kube, &router_namespace).await?;
        let signing_key_file = match &signing_key {
            Some(key) => Some(write_private(scratch.path(), "router-signing-key", key)?),
            None => None,
        };
        let cluster = Self {
            description,
            kube,
            kubeconfig,
            namespace,
            template,
            pool,
            scenario_template: String::new(),
            runtime_class: None,
            further_passes,
            router: RouterAccess {
                namespace: router_namespace,
                url,
                gateway,
                signing_key,
                signing_key_file,
                token,
            },
            network,
            public_address: setting(
                env::PUBLIC_ADDRESS,
                &default_public_address(internet.as_ref()),
            ),
            run: format!("{:06x}", fastrand::u32(..) & 0xff_ffff),
            scratch,
            backing,
            _internet: internet,
        };
        let mut cluster = cluster;
        cluster.preflight().await?;
        Ok(cluster)
    }

    /// The template and pool exist and the pool is Ready, or an error saying what to install.
    async fn preflight(&mut self) -> Result<()> {
        let templates: Api<SandboxTemplate> = self.api();
        if get(&templates, &self.template).await?.is_none() {
            return Err(Error::Config(format!(
                "SandboxTemplate {}/{} is missing: install deploy/sandboxes (`cargo xtask \
                 cluster up` does) or name yours with {} and {}",
                self.namespace,
                self.template,
                env::TEMPLATE,
                env::POOL
            )));
        }
        let pools: Api<SandboxWarmPool> = self.api();
        let Some(pool) = get(&pools, &self.pool).await? else {
            return Err(Error::Config(format!(
                "SandboxWarmPool {}/{} is missing: install deploy/sandboxes or set {}",
                self.namespace,
                self.pool,
                env::POOL
            )));
        };
        wait_pool_ready(&pools, &self.pool, pool.spec.replicas.min(1)).await?;
        self.scenario_template = self.copy_template_with_small_requests().await?;
        if self.router.signing_key.is_none() && self.router.token.is_none() {
            tracing::info!(
                "no Secret {}/{} and no {}: assuming a router with --auth none",
                self.router.namespace,
                wire::ROUTER_SIGNING_KEY_SECRET,
                env::ROUTER_TOKEN
            );
        }
        Ok(())
    }

    /// The passes after the first (see [`Self::switch_to`]).
    pub fn further_passes(&self) -> &[Pass] {
        &self.further_passes
    }

    /// The next pass: the pool of the pass before is scaled to none (a small node holds one
    /// pool's members besides the scenarios' own), `pass`'s pool is installed, and the
    /// scenarios claim from it once it is Ready.
    pub async fn switch_to(&mut self, pass: &Pass) -> Result<()> {
        let pools: Api<SandboxWarmPool> = self.api();
        pools
            .patch(
                &self.pool,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({ "spec": { "replicas": 0 } })),
            )
            .await
            .map_err(Error::kube(format!("scale pool {} to 0", self.pool)))?;
        match (&self.backing, pass.runtime_class.as_deref()) {
            (Backing::ControlPlane(plane), Some("gvisor")) => {
                plane.apply_gvisor_sandboxes().await?
            }
            _ => {
                return Err(Error::Config(format!(
                    "{} has no pass on RuntimeClass {:?}",
                    self.description, pass.runtime_class
                )));
            }
        }
        self.template.clone_from(&pass.template);
        self.pool.clone_from(&pass.pool);
        self.runtime_class.clone_from(&pass.runtime_class);
        self.preflight().await
    }

    /// Whether sandboxes run on this machine's kernel unless their RuntimeClass brings its own
    /// (the simulated cluster and the tiers the suite starts; not a kubeconfig's cluster).
    pub fn nodes_share_this_kernel(&self) -> bool {
        !matches!(self.backing, Backing::External)
    }

    /// The image of [`Self::template`]'s first container and its pull policy: an image every
    /// node of the cluster can run (on the node tier it was imported, no registry needed),
    /// with Python in it, for pods a scenario starts besides sandboxes.
    pub async fn sandbox_image(&self) -> Result<(String, Option<String>)> {
        let templates: Api<SandboxTemplate> = self.api();
        let template = get(&templates, &self.template).await?.ok_or_else(|| {
            Error::Config(format!(
                "SandboxTemplate {}/{} is missing",
                self.namespace, self.template
            ))
        })?;
        let container = template
            .spec
            .blueprint
            .pod_template
            .spec
            .containers
            .into_iter()
            .next()
            .ok_or_else(|| {
                Error::Config(format!(
                    "SandboxTemplate {} has no container",
                    self.template
                ))
            })?;
        let image = container.image.ok_or_else(|| {
            Error::Config(format!(
                "SandboxTemplate {}'s container has no image",
                self.template
            ))
        })?;
        Ok((image, container.image_pull_policy))
    }

    /// Creates [`Self::scenario_template`] from [`Self::template`] (see there); returns its name.
    async fn copy_template_with_small_requests(&self) -> Result<String> {
        let templates: Api<SandboxTemplate> = self.api();
        let Some(original) = get(&templates, &self.template).await? else {
            return Err(Error::Config(format!(
                "SandboxTemplate {}/{} is missing",
                self.namespace, self.template
            )));
        };
        let name = format!("e2e-{}-{}", self.run, self.template);
        let mut spec = serde_json::to_value(&original.spec)
            .map_err(|e| Error::Config(format!("template {}: {e}", self.template)))?;
        if let Some(containers) = spec
            .pointer_mut("/podTemplate/spec/containers")
            .and_then(serde_json::Value::as_array_mut)
        {
            for container in containers {
                let Some(cpu) = container.pointer_mut("/resources/requests/cpu") else {
                    continue;
                };
                let millis = cpu
                    .as_str()
                    .and_then(|q| agent_sandbox_api::units::parse_quantity_milli(q).ok())
                    .unwrap_or(100);
                *cpu = serde_json::Value::from(format!("{}m", (millis / 10).max(1)));
            }
        }
        let copy: SandboxTemplate = serde_json::from_value(serde_json::json!({
            "apiVersion": agent_sandbox_api::EXTENSIONS_API_VERSION,
            "kind": agent_sandbox_api::kinds::SANDBOX_TEMPLATE,
            "metadata": {"name": name, "namespace": self.namespace,
                         "labels": {(RUN_LABEL): self.run}},
            "spec": spec,
        }))
        .map_err(|e| Error::Config(format!("template {name}: {e}")))?;
        templates
            .patch(
                &name,
                &PatchParams::apply("agent-sandbox-e2e").force(),
                &Patch::Apply(&copy),
            )
            .await
            .map_err(Error::kube(format!("create SandboxTemplate {name}")))?;
        Ok(name)
    }

    /// An API handle in the run's namespace.
    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        Api::namespaced(self.kube.clone(), &self.namespace)
    }

    /// A fresh object name for this run: `e2e-<run>-<what>-<random>`.
    pub fn name(&self, what: &str) -> String {
        format!("e2e-{}-{what}-{:04x}", self.run, fastrand::u16(..))
    }

    /// SDK options for `mode`, or why this cluster has no such way to the router.
    pub fn sdk_options(&self, mode: SdkMode) -> Result<ClientOptions, String> {
        let connection = match mode {
            SdkMode::PortForward => ConnectionMode::port_forward_in(self.router.namespace.clone()),
            SdkMode::Direct => match &self.router.url {
                Some(url) => ConnectionMode::direct(url.clone()),
                None => {
                    return Err(format!(
                        "no router URL reachable from here (set {} to test direct mode)",
                        env::ROUTER_URL
                    ));
                }
            },
            SdkMode::Gateway => match &self.router.gateway {
                Some((namespace, name)) => ConnectionMode::gateway(name.clone(), namespace.clone()),
                None => {
                    return Err(format!(
                        "no Gateway in front of the router (set {} to NAMESPACE/NAME to test \
                         Gateway mode)",
                        env::GATEWAY
                    ));
                }
            },
        };
        let mut options = ClientOptions::default()
            .namespace(self.namespace.clone())
            .connection(connection)
            .sandbox_ready_timeout(crate::support::WAIT);
        if let Some(token) = &self.router.token {
            options = options.router_token(token.clone());
        }
        if let Some(key) = &self.router.signing_key {
            options = options.router_signing_key(key.clone());
        }
        Ok(options)
    }

    /// An SDK client for `mode` (see [`ClusterUnderTest::sdk_options`]).
    pub fn sdk(&self, mode: SdkMode) -> Result<agent_sandbox::Client, String> {
        Ok(agent_sandbox::Client::from_kube(
            self.kube.clone(),
            self.sdk_options(mode)?,
        ))
    }

    /// The connection flags of `sandboxctl` and `sandbox-agent` for this cluster (port-forward
    /// to the router, as users run them by default).
    pub fn binary_args(&self) -> Vec<String> {
        let mut args = vec![
            "--kubeconfig".to_owned(),
            self.kubeconfig.display().to_string(),
            "--namespace".to_owned(),
            self.namespace.clone(),
            "--router-namespace".to_owned(),
            self.router.namespace.clone(),
        ];
        if let Some(file) = &self.router.signing_key_file {
            args.push("--signing-key-file".to_owned());
            args.push(file.display().to_string());
        }
        if let Some(token) = &self.router.token {
            args.push("--router-token".to_owned());
            args.push(token.clone());
        }
        args
    }

    /// A command for one of the workspace's binaries with a clean environment for it: no
    /// inherited kubeconfig, router or Anthropic settings.
    pub fn command(&self, program: &Path) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(program);
        for variable in [
            "KUBECONFIG",
            agent_sandbox_cli::cli::ENV_ROUTER_URL,
            agent_sandbox_cli::cli::ENV_ROUTER_TOKEN,
            agent_sandbox_cli::cli::ENV_SIGNING_KEY_FILE,
            agent_sandbox_agent::client::ENV_API_KEY,
            agent_sandbox_agent::client::ENV_BASE_URL,
            "ANTHROPIC_MODEL",
        ] {
            command.env_remove(variable);
        }
        command.env("NO_COLOR", "1");
        command
    }

    /// A private directory for this run's files.
    pub fn scratch(&self) -> &Path {
        self.scratch.path()
    }

    /// Deletes everything this run labelled (claims first, so that their sandboxes go with
    /// them, then pools and stray sandboxes) and waits for the claims to be gone. Returns how
    /// many objects were left behind.
    pub async fn cleanup(&self) -> Result<usize> {
        let selector = ListParams::default().labels(&format!("{RUN_LABEL}={}", self.run));
        let claims: Api<SandboxClaim> = self.api();
        let pools: Api<SandboxWarmPool> = self.api();
        let sandboxes: Api<Sandbox> = self.api();
        let mut left = 0;
        for claim in claims
            .list(&selector)
            .await
            .map_err(Error::kube("list this run's claims"))?
        {
            left += 1;
            let _ = claims
                .delete(&claim.name_any(), &DeleteParams::default())
                .await;
        }
        for pool in pools
            .list(&selector)
            .await
            .map_err(Error::kube("list this run's pools"))?
        {
            left += 1;
            let _ = pools
                .delete(&pool.name_any(), &DeleteParams::default())
                .await;
        }
        let templates: Api<SandboxTemplate> = self.api();
        for template in templates
            .list(&selector)
            .await
            .map_err(Error::kube("list this run's templates"))?
        {
            // Made by the run itself (the scenarios' template), not left behind by a scenario.
            let _ = templates
                .delete(&template.name_any(), &DeleteParams::default())
                .await;
        }
        for sandbox in sandboxes
            .list(&selector)
            .await
            .map_err(Error::kube("list this run's sandboxes"))?
        {
            left += 1;
            let _ = sandboxes
                .delete(&sandbox.name_any(), &DeleteParams::default())
                .await;
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            let remaining = claims
                .list(&selector)
                .await
                .map_err(Error::kube("list this run's claims"))?
                .items
                .len();
            if remaining == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(left)
    }

    /// Stops what the run started (the sim, the control plane, k3s); a kubeconfig cluster is
    /// left as it was.
    pub async fn stop(self) {
        match self.backing {
            Backing::Sim(sim) => sim.stop().await,
            Backing::ControlPlane(plane) => plane.stop().await,
            #[cfg(feature = "k3s")]
            Backing::K3s(k3s) => k3s.stop().await,
            Backing::External => {}
        }
    }
}

/// `NAMESPACE/NAME` of a Gateway.
fn parse_gateway(value: &str) -> Result<(String, String)> {
    match value.split_once('/') {
        Some((namespace, name)) if !namespace.is_empty() && !name.is_empty() => {
            Ok((namespace.to_owned(), name.to_owned()))
        }
        _ => Err(Error::Config(format!(
            "{}={value:?} must be NAMESPACE/NAME",
            env::GATEWAY
        ))),
    }
}

/// A client from a kubeconfig file (its current context).
pub(crate) async fn client_from(path: &Path) -> Result<kube::Client> {
    let kubeconfig = kube::config::Kubeconfig::read_from(path)
        .map_err(|e| Error::Config(format!("cannot read kubeconfig {}: {e}", path.display())))?;
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .map_err(|e| Error::Config(format!("kubeconfig {}: {e}", path.display())))?;
    kube::Client::try_from(config)
        .map_err(|e| Error::Config(format!("kubeconfig {}: {e}", path.display())))
}

/// The router's signing key from its Secret, when the router uses scoped tokens.
async fn read_signing_key(kube: &kube::Client, namespace: &str) -> Result<Option<Vec<u8>>> {
    let secrets: Api<Secret> = Api::namespaced(kube.clone(), namespace);
    let secret = secrets
        .get_opt(wire::ROUTER_SIGNING_KEY_SECRET)
        .await
        .map_err(Error::kube(format!(
            "read Secret {namespace}/{}",
            wire::ROUTER_SIGNING_KEY_SECRET
        )))?;
    Ok(secret
        .and_then(|s| s.data)
        .and_then(|mut data| data.remove(wire::ROUTER_SIGNING_KEY_SECRET_KEY))
        .map(|bytes| bytes.0))
}

/// Writes `contents` to `dir/name` readable by this user only.
pub(crate) fn write_private(dir: &Path, name: &str, contents: &[u8]) -> Result<PathBuf> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let path = dir.join(name);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(Error::io("create", &path))?;
    file.write_all(contents)
        .map_err(Error::io("write", &path))?;
    Ok(path)
}

/// A scratch directory outside `/tmp` (confined sandboxes get a private `/tmp`, and
/// the sim's router pod reads its key from here).
pub(crate) fn scratch_dir() -> Result<tempfile::TempDir> {
    agent_sandbox_local::testkit::pod_visible_dir("e2e-").map_err(Error::io(
        "create a scratch directory in",
        "target/ or /var/tmp",
    ))
}
