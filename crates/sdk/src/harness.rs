//! A whole simulated cluster for system tests and benchmarks (feature `harness`): the sim with
//! the real runtime as sandbox pods, the controller and a router in this process, optionally
//! the router as a pod behind `sandbox-router-svc` in `agent-sandbox-system` (for
//! port-forward mode), a SandboxTemplate and a filled SandboxWarmPool.
//!
//! Dropping the [`Harness`] stops the controller and router tasks and the sim, which kills
//! every pod process.
//!
//! [`FakeRouter`] and [`ready_claim`] play a hostile or broken sandbox behind a direct URL,
//! without a controller or runtime pods.

mod fake_router;

pub use fake_router::{FakeBody, FakeBoxError, FakeRequest, FakeRouter, ready_claim};

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agent_sandbox_api::sandbox::{PodTemplate, SandboxBlueprint};
use agent_sandbox_api::warm_pool::SandboxTemplateRef;
use agent_sandbox_api::{
    SandboxTemplate, SandboxTemplateSpec, SandboxWarmPool, SandboxWarmPoolSpec, labels, wire,
};
use agent_sandbox_sim::{
    DefaultReadiness, ImageEntry, Program, Sim, SimConfig, runtime_entry,
    test_support::workspace_binary,
};
use k8s_openapi::api::core::v1::{Container, ContainerPort, Namespace, Pod, PodSpec};
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::task::JoinHandle;

use crate::Client;
use crate::error::{Error, Result};
use crate::options::{ClientOptions, ConnectionMode};

/// Namespace of the template, pool and claims.
pub const NAMESPACE: &str = "default";
/// Name of the SandboxTemplate.
pub const TEMPLATE: &str = "python-runtime";
/// Name of the SandboxWarmPool.
pub const POOL: &str = "python-pool";
/// Name of the Gateway [`Harness::create_gateway`] writes.
pub const GATEWAY: &str = "sandbox-gateway";

/// How to start a [`Harness`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct HarnessConfig {
    /// Members of the warm pool (default 2).
    pub pool_replicas: i32,
    /// Run the router also as a pod behind `sandbox-router-svc` (default true).
    pub router_pod: bool,
    /// The `sandbox-runtime` binary (default: built with `cargo build`).
    pub runtime_bin: Option<PathBuf>,
    /// The `sandbox-router` binary for the router pod (default: built with `cargo build`).
    pub router_bin: Option<PathBuf>,
}

impl Default for HarnessConfig {
    fn default() -> Self {
        Self {
            pool_replicas: 2,
            router_pod: true,
            runtime_bin: None,
            router_bin: None,
        }
    }
}

impl HarnessConfig {
    /// Sets the pool size.
    #[must_use]
    pub fn pool_replicas(mut self, replicas: i32) -> Self {
        self.pool_replicas = replicas;
        self
    }

    /// Whether to run a router pod.
    #[must_use]
    pub fn router_pod(mut self, router_pod: bool) -> Self {
        self.router_pod = router_pod;
        self
    }

    /// Uses these binaries instead of building them.
    #[must_use]
    pub fn binaries(mut self, runtime: PathBuf, router: PathBuf) -> Self {
        self.runtime_bin = Some(runtime);
        self.router_bin = Some(router);
        self
    }
}

/// A running simulated cluster with controller, router, template and warm pool.
impl std::fmt::Debug for Harness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Harness")
            .field("router_addr", &self.router_addr)
            .finish_non_exhaustive()
    }
}

pub struct Harness {
    sim: Option<Sim>,
    kube: kube::Client,
    router_addr: SocketAddr,
    tasks: Vec<JoinHandle<()>>,
    stop: Option<tokio::sync::watch::Sender<bool>>,
    _dir: tempfile::TempDir,
}

fn failed(step: &'static str) -> impl FnOnce(Box<dyn std::error::Error + Send + Sync>) -> Error {
    move |source| Error::Harness { step, source }
}

fn boxed<E: std::error::Error + Send + Sync + 'static>(
    step: &'static str,
) -> impl FnOnce(E) -> Error {
    move |e| Error::Harness {
        step,
        source: Box::new(e),
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(true);
        }
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl Harness {
    /// Starts everything and waits until the pool is full and Ready (and the router pod, when
    /// asked for, is Ready).
    pub async fn start(config: HarnessConfig) -> Result<Self> {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let runtime = match config.runtime_bin.clone() {
            Some(path) => path,
            None => workspace_binary("agent-sandbox-runtime", "sandbox-runtime")
                .map_err(boxed("build sandbox-runtime"))?,
        };
        // Pods under bubblewrap get a private /tmp: the kubeconfig the router pod reads must
        // live elsewhere. Next to the running executable's target directory when there is one.
        let dir = kubeconfig_dir()?;
        let mut sim_config = SimConfig::default()
            .image(runtime_entry("*runtime*", Program::Path(runtime)))
            .kubeconfig(dir.path().join("kubeconfig"));
        if config.router_pod {
            let router = match config.router_bin.clone() {
                Some(path) => path,
                None => workspace_binary("agent-sandbox-router", "sandbox-router")
                    .map_err(boxed("build sandbox-router"))?,
            };
            sim_config = sim_config.image(
                ImageEntry::new("*sandbox-router*", Program::Path(router))
                    .args([
                        "--listen",
                        &format!("{{pod_ip}}:{}", wire::ROUTER_PORT),
                        "--auth",
                        "none",
                        "--access-log",
                        "false",
                    ])
                    .port(wire::ROUTER_PORT)
                    .readiness(DefaultReadiness::Http {
                        port: wire::ROUTER_PORT,
                        path: "/readyz".to_owned(),
                    }),
            );
        }
        let sim = Sim::start(sim_config)
            .await
            .map_err(boxed("start the sim"))?;
        sim.apply_crds().map_err(boxed("apply the CRDs"))?;
        let kube = sim.client().map_err(boxed("build a client of the sim"))?;

        let (stop, stopped) = tokio::sync::watch::channel(false);
        let mut tasks = Vec::new();
        let controller_kube = kube.clone();
        let mut controller_stop = stopped.clone();
        tasks.push(tokio::spawn(async move {
            let shutdown = async move {
                let _ = controller_stop.wait_for(|s| *s).await;
            };
            if let Err(error) = agent_sandbox_controller::run(
                controller_kube,
                agent_sandbox_controller::Config::default(),
                shutdown,
            )
            .await
            {
                tracing::error!(%error, "the harness's controller failed");
            }
        }));

        let index = agent_sandbox_router::SharedIndex::new();
        let mut router_config =
            agent_sandbox_router::Config::new(SocketAddr::from(([127, 0, 0, 1], 0)));
        router_config.access_log = false;
        let router = agent_sandbox_router::Router::bind(router_config, index.clone())
            .await
            .map_err(boxed("bind the router"))?;
        let router_addr = router.local_addr();
        let mut router_stop = stopped.clone();
        tasks.push(tokio::spawn(async move {
            let shutdown = async move {
                let _ = router_stop.wait_for(|s| *s).await;
            };
            if let Err(error) = router.serve(shutdown).await {
                tracing::error!(%error, "the harness's router failed");
            }
        }));
        let watch_kube = kube.clone();
        tasks.push(tokio::spawn(async move {
            agent_sandbox_router::watch(watch_kube, index, None).await;
        }));

        let harness = Self {
            _dir: dir,
            sim: Some(sim),
            kube,
            router_addr,
            tasks,
            stop: Some(stop),
        };
        harness.create_objects(&config).await?;
        harness.wait_ready(&config).await?;
        Ok(harness)
    }

    async fn create_objects(&self, config: &HarnessConfig) -> Result<()> {
        let post = PostParams::default();
        let container = Container {
            name: "runtime".into(),
            image: Some("registry.example.com/python-runtime:latest".into()),
            ports: Some(vec![ContainerPort {
                container_port: i32::from(wire::RUNTIME_PORT),
                ..ContainerPort::default()
            }]),
            ..Container::default()
        };
        let template = SandboxTemplate::new(
            TEMPLATE,
            SandboxTemplateSpec {
                blueprint: SandboxBlueprint {
                    pod_template: PodTemplate {
                        spec: PodSpec {
                            containers: vec![container],
                            ..PodSpec::default()
                        },
                        ..PodTemplate::default()
                    },
                    ..SandboxBlueprint::default()
                },
                ..SandboxTemplateSpec::default()
            },
        );
        Api::<SandboxTemplate>::namespaced(self.kube.clone(), NAMESPACE)
            .create(&post, &template)
            .await
            .map_err(boxed("create the SandboxTemplate"))?;
        let pool = SandboxWarmPool::new(
            POOL,
            SandboxWarmPoolSpec {
                replicas: config.pool_replicas,
                sandbox_template_ref: SandboxTemplateRef {
                    name: TEMPLATE.into(),
                },
                update_strategy: None,
            },
        );
        Api::<SandboxWarmPool>::namespaced(self.kube.clone(), NAMESPACE)
            .create(&post, &pool)
            .await
            .map_err(boxed("create the SandboxWarmPool"))?;
        if config.router_pod {
            self.create_router_pod().await?;
        }
        Ok(())
    }

    async fn create_router_pod(&self) -> Result<()> {
        let post = PostParams::default();
        let namespace: Namespace =
            serde_json::from_value(json!({"metadata": {"name": wire::SYSTEM_NAMESPACE}}))
                .map_err(boxed("build the system Namespace"))?;
        Api::<Namespace>::all(self.kube.clone())
            .create(&post, &namespace)
            .await
            .map_err(boxed("create the system Namespace"))?;
        let service = json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": wire::ROUTER_SERVICE, "namespace": wire::SYSTEM_NAMESPACE},
            "spec": {"selector": {labels::ROUTER_APP: labels::ROUTER_APP_VALUE},
                     "ports": [{"name": "http", "port": wire::ROUTER_PORT, "targetPort": wire::ROUTER_PORT}]}
        });
        let service: k8s_openapi::api::core::v1::Service =
            serde_json::from_value(service).map_err(boxed("build the router Service"))?;
        Api::<k8s_openapi::api::core::v1::Service>::namespaced(
            self.kube.clone(),
            wire::SYSTEM_NAMESPACE,
        )
        .create(&post, &service)
        .await
        .map_err(boxed("create the router Service"))?;
        self.create_router_pod_named("sandbox-router-0").await
    }

    /// Creates (another) router pod behind `sandbox-router-svc`.
    pub async fn create_router_pod_named(&self, name: &str) -> Result<()> {
        let kubeconfig = self.kubeconfig_path().display().to_string();
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": wire::SYSTEM_NAMESPACE,
                         "labels": {labels::ROUTER_APP: labels::ROUTER_APP_VALUE}},
            "spec": {"containers": [{
                "name": "router", "image": "example.com/sandbox-router:dev",
                "env": [{"name": "KUBECONFIG", "value": kubeconfig}],
                "ports": [{"name": "http", "containerPort": wire::ROUTER_PORT}]
            }]}
        }))
        .map_err(boxed("build the router Pod"))?;
        Api::<Pod>::namespaced(self.kube.clone(), wire::SYSTEM_NAMESPACE)
            .create(&PostParams::default(), &pod)
            .await
            .map_err(boxed("create the router Pod"))?;
        Ok(())
    }

    async fn wait_ready(&self, config: &HarnessConfig) -> Result<()> {
        let pools: Api<SandboxWarmPool> = Api::namespaced(self.kube.clone(), NAMESPACE);
        let pods: Api<Pod> = Api::namespaced(self.kube.clone(), wire::SYSTEM_NAMESPACE);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        loop {
            let pool_ready = pools
                .get_opt(POOL)
                .await
                .map_err(boxed("get the SandboxWarmPool"))?
                .and_then(|p| p.status)
                .is_some_and(|s| s.ready_replicas >= config.pool_replicas);
            let router_ready = !config.router_pod
                || pods
                    .list(&Default::default())
                    .await
                    .map_err(boxed("list router pods"))?
                    .items
                    .iter()
                    .any(pod_ready);
            if pool_ready && router_ready {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                return Err(failed("wait for the pool and the router pod")(
                    format!("not ready after 120 s (pool ready: {pool_ready}, router pod ready: {router_ready})").into(),
                ));
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// The sim's API client.
    pub fn kube_client(&self) -> kube::Client {
        self.kube.clone()
    }

    /// The simulated cluster.
    pub fn sim(&self) -> Option<&Sim> {
        self.sim.as_ref()
    }

    /// The sim's kubeconfig (for child processes).
    pub fn kubeconfig_path(&self) -> &Path {
        self.sim
            .as_ref()
            .map_or(Path::new(""), |sim| sim.kubeconfig_path())
    }

    /// The in-process router's URL (direct mode).
    pub fn router_url(&self) -> String {
        format!("http://{}", self.router_addr)
    }

    /// The in-process router's address.
    pub fn router_addr(&self) -> SocketAddr {
        self.router_addr
    }

    /// Client options for `mode` in [`NAMESPACE`]: `direct` to the in-process router,
    /// `port-forward` to the router pod, `gateway` through [`GATEWAY`] (create it first).
    pub fn options(&self, mode: &str) -> ClientOptions {
        let connection = match mode {
            "port-forward" => ConnectionMode::port_forward(),
            "gateway" => ConnectionMode::gateway(GATEWAY, NAMESPACE),
            _ => ConnectionMode::direct(self.router_url()),
        };
        ClientOptions::default()
            .namespace(NAMESPACE)
            .connection(connection)
            .sandbox_ready_timeout(Duration::from_secs(60))
    }

    /// An SDK client for `mode` (see [`Harness::options`]).
    pub fn client(&self, mode: &str) -> Client {
        Client::from_kube(self.kube.clone(), self.options(mode))
    }

    /// Writes the Gateway [`GATEWAY`] with an HTTP listener on the in-process router's port and
    /// the status address 127.0.0.1, as a Gateway implementation would once programmed.
    pub async fn create_gateway(&self) -> Result<()> {
        let resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("gateway.networking.k8s.io", "v1", "Gateway"),
            "gateways",
        );
        let api: Api<DynamicObject> = Api::namespaced_with(self.kube.clone(), NAMESPACE, &resource);
        let mut gateway = DynamicObject::new(GATEWAY, &resource);
        gateway.data = json!({"spec": {
            "gatewayClassName": "sim",
            "listeners": [{"name": "http", "protocol": "HTTP", "port": self.router_addr.port()}]
        }});
        api.create(&PostParams::default(), &gateway)
            .await
            .map_err(boxed("create the Gateway"))?;
        let status =
            json!({"status": {"addresses": [{"type": "IPAddress", "value": "127.0.0.1"}]}});
        match api
            .patch_status(GATEWAY, &PatchParams::default(), &Patch::Merge(&status))
            .await
        {
            Ok(_) => Ok(()),
            // Without a status subresource the status is part of the object.
            Err(_) => api
                .patch(GATEWAY, &PatchParams::default(), &Patch::Merge(&status))
                .await
                .map(drop)
                .map_err(boxed("write the Gateway status")),
        }
    }

    /// Stops everything.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(true);
        }
        for task in self.tasks.drain(..) {
            task.abort();
            let _ = task.await;
        }
        if let Some(sim) = self.sim.take() {
            sim.stop().await;
        }
    }
}

/// A directory the router pod can read its kubeconfig from (not the private `/tmp` of
/// bubblewrapped pods).
fn kubeconfig_dir() -> Result<tempfile::TempDir> {
    agent_sandbox_sim::test_support::pod_visible_dir("sdk-harness-")
        .map_err(boxed("create a directory for the kubeconfig"))
}

fn pod_ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}
