//! The local cluster: everything `sandboxctl dev` and `sandboxctl run --local` need, in one
//! process, with no Docker, no Kubernetes and no extra binary.
//!
//! [`LocalCluster::start`] starts, in the calling process:
//!
//! - the simulated cluster (`agent_sandbox_sim`): an API server on 127.0.0.1 and a kubelet that
//!   runs pods as local process groups (in bubblewrap when it works), with the CRDs applied;
//! - the controller (`agent_sandbox_controller::run`), reconciling every namespace;
//! - the router (`agent_sandbox_router`), on 127.0.0.1 only, fed by its own watch of Sandboxes and
//!   Pods, with a **bearer token** by default: a fresh random secret per cluster, kept in the
//!   data directory with mode 0600 (see [`RouterAuth`] for why not `none`);
//! - a default SandboxTemplate ([`DEFAULT_TEMPLATE`], the runtime image [`DEFAULT_IMAGE`]) and a
//!   SandboxWarmPool ([`DEFAULT_POOL`]) in [`DEFAULT_NAMESPACE`].
//!
//! Runtime images (`*runtime*`) run **the current executable** with the hidden subcommand
//! [`RUNTIME_SUBCOMMAND`]: a binary that embeds a local cluster must dispatch that subcommand to
//! [`serve_runtime`] before doing anything else (`sandboxctl` does; `sandbox-agent --local` must
//! too). Tests that start a cluster from a test binary set [`LocalConfig::runtime`] to a real
//! binary instead.
//!
//! Dropping the cluster (or [`LocalCluster::stop`]) stops the router and the controller and
//! kills every pod process; the runtime servers also exit by themselves when the process that
//! started them dies (they watch their parent), so no process outlives the cluster even after a
//! `SIGKILL`.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use agent_sandbox_api::sandbox::{PodTemplate, SandboxBlueprint};
use agent_sandbox_api::warm_pool::SandboxTemplateRef;
use agent_sandbox_api::{
    SandboxTemplate, SandboxTemplateSpec, SandboxWarmPool, SandboxWarmPoolSpec, wire,
};
use agent_sandbox_router::{Auth, Router, Secret, SharedIndex};
use agent_sandbox_sim::{Isolation, Program, Sim, SimConfig, runtime_entry};
use k8s_openapi::api::core::v1::{Container, ContainerPort, PodSpec};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};

/// The hidden subcommand under which a binary embedding a local cluster serves the runtime.
pub const RUNTIME_SUBCOMMAND: &str = "__runtime";
/// Namespace of the default template and pool.
pub const DEFAULT_NAMESPACE: &str = wire::DEFAULT_SANDBOX_NAMESPACE;
/// Name of the default SandboxTemplate.
pub const DEFAULT_TEMPLATE: &str = "python";
/// Name of the default SandboxWarmPool.
pub const DEFAULT_POOL: &str = "python";
/// Image of the default template. In the local cluster every `*runtime*` image runs the
/// embedded runtime; commands use the host's tools (`python3` must be on `PATH`).
pub const DEFAULT_IMAGE: &str = "sandbox-runtime-python:local";
/// Field manager of the objects the local cluster applies.
pub const FIELD_MANAGER: &str = "sandboxctl";
/// File name of the router's bearer token in the data directory ([`RouterAuth::Token`]).
pub const TOKEN_FILE: &str = "router-token";
/// File name of the router's signing key in the data directory ([`RouterAuth::Scoped`]).
pub const SIGNING_KEY_FILE: &str = "router-signing-key";

/// How the local router authenticates requests.
///
/// The router listens on 127.0.0.1 only, but pods of the simulated cluster share the host's
/// network, so code running *in* a sandbox can reach it; with `none` it could drive every other
/// sandbox through it. The default, [`RouterAuth::Token`], is a random 32-byte bearer token per
/// cluster, written with mode 0600 to the data directory (which bubblewrapped pods cannot see:
/// their `/tmp` is private). [`RouterAuth::Scoped`] is the production model (a token per
/// sandbox, minted with the cluster's signing key); `none` remains for experiments.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RouterAuth {
    /// One random bearer token for every sandbox ([`LocalCluster::router_token`]).
    #[default]
    Token,
    /// A random signing key; clients need a token per sandbox ([`LocalCluster::token_for`]).
    Scoped,
    /// No authentication (anyone on this machine, pods included, reaches every sandbox).
    None,
}

impl std::str::FromStr for RouterAuth {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "token" => Ok(Self::Token),
            "scoped" => Ok(Self::Scoped),
            "none" => Ok(Self::None),
            other => Err(format!(
                "unknown router auth {other:?} (token, scoped or none)"
            )),
        }
    }
}

/// How to start a [`LocalCluster`].
#[derive(Clone, Debug)]
pub struct LocalConfig {
    /// Where pods' directories, logs, the kubeconfig and the signing key live (default: a
    /// temporary directory removed when the cluster stops).
    pub data_dir: Option<PathBuf>,
    /// Where to write the kubeconfig (default: `kubeconfig` in the data directory).
    pub kubeconfig: Option<PathBuf>,
    /// Pod isolation (default: bubblewrap when it works).
    pub isolation: Isolation,
    /// Port of the API server on 127.0.0.1 (0: chosen by the OS).
    pub api_port: u16,
    /// Port of the router on 127.0.0.1 (0: chosen by the OS).
    pub router_port: u16,
    /// Router authentication.
    pub router_auth: RouterAuth,
    /// Program and arguments that serve the runtime in `*runtime*` pods (default: the current
    /// executable with [`RUNTIME_SUBCOMMAND`]).
    pub runtime: (Program, Vec<String>),
    /// Sandboxes kept warm in the default pool (0: no pool is created).
    pub pool_replicas: i32,
}

impl Default for LocalConfig {
    fn default() -> Self {
        Self {
            data_dir: None,
            kubeconfig: None,
            isolation: Isolation::Auto,
            api_port: 0,
            router_port: 0,
            router_auth: RouterAuth::default(),
            runtime: (Program::CurrentExe, vec![RUNTIME_SUBCOMMAND.to_owned()]),
            pool_replicas: 2,
        }
    }
}

/// A running local cluster. Dropping it stops everything it started.
pub struct LocalCluster {
    sim: Option<Sim>,
    client: Client,
    router_url: String,
    auth: RouterAuth,
    secret: Option<(Secret, PathBuf)>,
    pool_replicas: i32,
    shutdown: CancellationToken,
    controller: Option<JoinHandle<()>>,
    router: Option<JoinHandle<()>>,
    watcher: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for LocalCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalCluster")
            .field("api", &self.api_url())
            .field("router", &self.router_url)
            .field("auth", &self.auth)
            .finish_non_exhaustive()
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        self.shutdown.cancel();
        for task in [
            self.controller.take(),
            self.router.take(),
            self.watcher.take(),
        ]
        .into_iter()
        .flatten()
        {
            task.abort();
        }
        // Dropping the sim kills every pod process group.
        self.sim.take();
    }
}

impl LocalCluster {
    /// Starts the simulated cluster, the controller and the router, and applies the default
    /// template and pool (it does not wait for the pool: see [`LocalCluster::wait_for_pool`]).
    pub async fn start(config: LocalConfig) -> Result<Self> {
        // Idempotent; kube's TLS stack needs one provider installed even for plain HTTP clients.
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let (program, args) = config.runtime.clone();
        let mut sim_config = SimConfig::default()
            .isolation(config.isolation)
            .port(config.api_port)
            .image(runtime_entry("*runtime*", program).args(args));
        if let Some(dir) = &config.data_dir {
            sim_config = sim_config.data_dir(dir);
        }
        if let Some(path) = &config.kubeconfig {
            sim_config = sim_config.kubeconfig(path);
        }
        let sim = Sim::start(sim_config)
            .await
            .map_err(|source| Error::SimStart { source })?;
        sim.apply_crds()
            .map_err(|source| Error::SimCrds { source })?;
        let client = sim.client().map_err(|source| Error::SimClient { source })?;
        let shutdown = CancellationToken::new();

        let secret = match config.router_auth {
            RouterAuth::Token => {
                let path = sim.data_dir().join(TOKEN_FILE);
                Some((write_new_secret(&path)?, path))
            }
            RouterAuth::Scoped => {
                let path = sim.data_dir().join(SIGNING_KEY_FILE);
                Some((write_new_secret(&path)?, path))
            }
            RouterAuth::None => None,
        };
        let mut router_config = agent_sandbox_router::Config::new(SocketAddr::from((
            [127, 0, 0, 1],
            config.router_port,
        )));
        router_config.auth = match (&secret, config.router_auth) {
            (Some((token, _)), RouterAuth::Token) => Auth::Token(token.clone()),
            (Some((key, _)), RouterAuth::Scoped) => Auth::Scoped(vec![key.clone()]),
            _ => Auth::None,
        };
        // One line per request would drown a `dev` terminal; the CLI reports what it does.
        router_config.access_log = false;
        router_config.shutdown_grace = Duration::from_secs(2);
        let index = SharedIndex::new();
        let router = Router::bind(router_config, index.clone())
            .await
            .map_err(|source| Error::RouterStart { source })?;
        let router_url = format!("http://{}", router.local_addr());
        let watcher = tokio::spawn(agent_sandbox_router::watch(client.clone(), index, None));
        let router = {
            let stop = shutdown.clone();
            tokio::spawn(async move {
                if let Err(error) = router.serve(stop.cancelled_owned()).await {
                    tracing::error!(%error, "local router stopped");
                }
            })
        };
        let controller = {
            let client = client.clone();
            let stop = shutdown.clone();
            tokio::spawn(async move {
                let config = agent_sandbox_controller::Config::default();
                if let Err(error) =
                    agent_sandbox_controller::run(client, config, stop.cancelled_owned()).await
                {
                    tracing::error!(%error, "local controller stopped");
                }
            })
        };
        let cluster = Self {
            sim: Some(sim),
            client,
            router_url,
            auth: config.router_auth,
            secret,
            pool_replicas: config.pool_replicas,
            shutdown,
            controller: Some(controller),
            router: Some(router),
            watcher: Some(watcher),
        };
        cluster.apply_defaults().await?;
        Ok(cluster)
    }

    async fn apply_defaults(&self) -> Result<()> {
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let templates: Api<SandboxTemplate> =
            Api::namespaced(self.client.clone(), DEFAULT_NAMESPACE);
        templates
            .patch(DEFAULT_TEMPLATE, &params, &Patch::Apply(default_template()))
            .await
            .map_err(|source| Error::Kube {
                action: "apply",
                kind: "SandboxTemplate",
                namespace: DEFAULT_NAMESPACE.to_owned(),
                name: DEFAULT_TEMPLATE.to_owned(),
                source: Box::new(source),
            })?;
        if self.pool_replicas > 0 {
            let pools: Api<SandboxWarmPool> =
                Api::namespaced(self.client.clone(), DEFAULT_NAMESPACE);
            pools
                .patch(
                    DEFAULT_POOL,
                    &params,
                    &Patch::Apply(default_pool(self.pool_replicas)),
                )
                .await
                .map_err(|source| Error::Kube {
                    action: "apply",
                    kind: "SandboxWarmPool",
                    namespace: DEFAULT_NAMESPACE.to_owned(),
                    name: DEFAULT_POOL.to_owned(),
                    source: Box::new(source),
                })?;
        }
        Ok(())
    }

    /// A client of the cluster's API server (default namespace `default`).
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// The kubeconfig file for `kubectl`, `sandboxctl` and the SDK.
    pub fn kubeconfig_path(&self) -> &Path {
        self.sim
            .as_ref()
            .map_or(Path::new(""), Sim::kubeconfig_path)
    }

    /// The API server, `http://127.0.0.1:PORT`.
    pub fn api_url(&self) -> &str {
        self.sim.as_ref().map_or("", Sim::base_url)
    }

    /// The data directory (pods' directories and logs, the signing key).
    pub fn data_dir(&self) -> &Path {
        self.sim.as_ref().map_or(Path::new(""), Sim::data_dir)
    }

    /// The pod isolation in effect.
    pub fn isolation(&self) -> Isolation {
        self.sim.as_ref().map_or(Isolation::None, Sim::isolation)
    }

    /// The router, `http://127.0.0.1:PORT` (a direct-URL connection for the SDK).
    pub fn router_url(&self) -> &str {
        &self.router_url
    }

    /// The router's authentication.
    pub fn router_auth(&self) -> RouterAuth {
        self.auth
    }

    /// The file holding the router's token ([`RouterAuth::Token`]) or signing key
    /// ([`RouterAuth::Scoped`]).
    pub fn secret_path(&self) -> Option<&Path> {
        self.secret.as_ref().map(|(_, path)| path.as_path())
    }

    /// The bearer token every request needs, with [`RouterAuth::Token`].
    pub fn router_token(&self) -> Option<String> {
        match (&self.secret, self.auth) {
            (Some((token, _)), RouterAuth::Token) => {
                Some(String::from_utf8_lossy(token.expose()).into_owned())
            }
            _ => None,
        }
    }

    /// The router's signing key, with [`RouterAuth::Scoped`].
    pub fn signing_key(&self) -> Option<&[u8]> {
        match (&self.secret, self.auth) {
            (Some((key, _)), RouterAuth::Scoped) => Some(key.expose()),
            _ => None,
        }
    }

    /// The bearer token for requests to `namespace/sandbox`: the router's token, or a scoped
    /// token valid for `ttl`, or `None` when the router needs none.
    pub fn token_for(
        &self,
        namespace: &str,
        sandbox: &str,
        ttl: Duration,
    ) -> Result<Option<String>> {
        if let Some(key) = self.signing_key() {
            return agent_sandbox::mint_token(key, namespace, sandbox, ttl)
                .map(Some)
                .map_err(|source| Error::Sdk {
                    action: format!("mint a router token for sandbox {namespace}/{sandbox}"),
                    source: Box::new(source),
                });
        }
        Ok(self.router_token())
    }

    /// Pod process groups alive (for tests and leak checks).
    pub fn live_process_groups(&self) -> usize {
        self.sim.as_ref().map_or(0, Sim::live_process_groups)
    }

    /// Waits until the default pool has at least `ready` ready sandboxes, calling `progress`
    /// with what it sees about every 100 ms.
    pub async fn wait_for_pool(
        &self,
        ready: i32,
        timeout: Duration,
        mut progress: impl FnMut(i32, i32),
    ) -> Result<()> {
        let pools: Api<SandboxWarmPool> = Api::namespaced(self.client.clone(), DEFAULT_NAMESPACE);
        let started = Instant::now();
        loop {
            let pool = pools
                .get_opt(DEFAULT_POOL)
                .await
                .map_err(|source| Error::Kube {
                    action: "get",
                    kind: "SandboxWarmPool",
                    namespace: DEFAULT_NAMESPACE.to_owned(),
                    name: DEFAULT_POOL.to_owned(),
                    source: Box::new(source),
                })?;
            let now = pool
                .as_ref()
                .and_then(|p| p.status.as_ref())
                .map_or(0, |s| s.ready_replicas);
            progress(now, self.pool_replicas);
            if now >= ready {
                return Ok(());
            }
            if started.elapsed() > timeout {
                return Err(Error::Timeout {
                    what: format!(
                        "SandboxWarmPool {DEFAULT_NAMESPACE}/{DEFAULT_POOL} to have {ready} ready sandbox(es)"
                    ),
                    after: timeout,
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops the router and the controller (each given a moment to finish) and the simulated
    /// cluster, killing every pod process.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        for task in [
            self.router.take(),
            self.controller.take(),
            self.watcher.take(),
        ]
        .into_iter()
        .flatten()
        {
            let abort = task.abort_handle();
            if tokio::time::timeout(Duration::from_secs(3), task)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
        if let Some(sim) = self.sim.take() {
            sim.stop().await;
        }
    }
}

/// The default template: one container of [`DEFAULT_IMAGE`] serving the runtime on 8888.
pub fn default_template() -> SandboxTemplate {
    let mut template = SandboxTemplate::new(
        DEFAULT_TEMPLATE,
        SandboxTemplateSpec {
            blueprint: SandboxBlueprint {
                pod_template: PodTemplate {
                    spec: PodSpec {
                        containers: vec![Container {
                            name: "runtime".into(),
                            image: Some(DEFAULT_IMAGE.into()),
                            ports: Some(vec![ContainerPort {
                                container_port: i32::from(wire::RUNTIME_PORT),
                                ..ContainerPort::default()
                            }]),
                            ..Container::default()
                        }],
                        ..PodSpec::default()
                    },
                    ..PodTemplate::default()
                },
                ..SandboxBlueprint::default()
            },
            ..SandboxTemplateSpec::default()
        },
    );
    template.metadata.namespace = Some(DEFAULT_NAMESPACE.into());
    template
}

/// The default pool of `replicas` sandboxes from [`default_template`].
pub fn default_pool(replicas: i32) -> SandboxWarmPool {
    let mut pool = SandboxWarmPool::new(
        DEFAULT_POOL,
        SandboxWarmPoolSpec {
            replicas,
            sandbox_template_ref: SandboxTemplateRef {
                name: DEFAULT_TEMPLATE.into(),
            },
            update_strategy: None,
        },
    );
    pool.metadata.namespace = Some(DEFAULT_NAMESPACE.into());
    pool.metadata.labels = Some(BTreeMap::from([(
        "app.kubernetes.io/managed-by".to_owned(),
        FIELD_MANAGER.to_owned(),
    )]));
    pool
}

/// Writes a fresh random 32-byte secret, hex-encoded, readable by the owner only.
fn write_new_secret(path: &Path) -> Result<Secret> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let file_err = |action| {
        let path = path.to_path_buf();
        move |source| Error::File {
            action,
            path,
            source,
        }
    };
    let mut raw = [0_u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut raw))
        .map_err(file_err("read random bytes for"))?;
    let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(file_err("create the router signing key"))?;
    file.write_all(hex.as_bytes())
        .map_err(file_err("write the router signing key to"))?;
    Ok(Secret::new(hex))
}

/// Serves the runtime (the [`RUNTIME_SUBCOMMAND`] of a binary embedding a local cluster) until
/// SIGTERM/SIGINT or until the process that started it is gone. Builds its own tokio runtime:
/// call it from a synchronous `main`, before anything else.
pub fn serve_runtime(
    args: agent_sandbox_runtime::Args,
) -> Result<(), agent_sandbox_runtime::Error> {
    let config = args.into_config();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.effective_worker_threads())
        .max_blocking_threads(64)
        .thread_name("sandbox-runtime")
        .enable_all()
        .build()
        .map_err(|source| agent_sandbox_runtime::Error::Runtime { source })?;
    runtime.block_on(agent_sandbox_runtime::serve(config, async {
        tokio::select! {
            () = agent_sandbox_runtime::shutdown_signal() => {}
            () = parent_gone() => tracing::info!("the local cluster is gone; stopping"),
        }
    }))
}

/// Resolves once this process's parent has changed (it died and we were re-parented): without
/// bubblewrap's `--die-with-parent`, this is how a runtime outlives no `SIGKILL`ed cluster.
async fn parent_gone() {
    let first = rustix::process::getppid();
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        if rustix::process::getppid() != first {
            return;
        }
    }
}
