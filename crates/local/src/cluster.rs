//! [`LocalCluster`]: the simulated cluster, the controller, the routers and the default objects,
//! started together in the calling process.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agent_sandbox::{ClientOptions, ConnectionMode};
use agent_sandbox_api::{SandboxTemplate, SandboxWarmPool, kinds, wire};
use agent_sandbox_router::{Auth, Router, Secret, SharedIndex};
use agent_sandbox_sim::{
    Isolation, PodNetworks as SimNetworks, RequestCounts, Sim, SimConfig, runtime_entry,
};
use kube::Api;
use kube::api::{Patch, PatchParams};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::{LocalConfig, PodNetworks, RouterAuth};
use crate::controller::ControllerTask;
use crate::defaults::{
    DEFAULT_NAMESPACE, DEFAULT_POOL, DEFAULT_TEMPLATE, FIELD_MANAGER, GATEWAY, default_pool,
    default_template,
};
use crate::error::{Error, Result};
use crate::router_pod;
use crate::secret::{SIGNING_KEY_FILE, TOKEN_FILE, write_new_secret};
use crate::wait::Timeout;

/// How long the controller gets to shut down gracefully in [`LocalCluster::stop`].
const CONTROLLER_GRACE: Duration = Duration::from_secs(10);
/// How long the in-process router gets to drain in [`LocalCluster::stop`].
const ROUTER_GRACE: Duration = Duration::from_secs(3);
/// How often [`LocalCluster::wait_for_pool`] looks (and reports progress).
const POOL_POLL: Duration = Duration::from_millis(100);

/// Which of the SDK's ways to a router a client of the local cluster uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnectionKind {
    /// The in-process router's URL (else the router pod's, which is reachable from this host).
    Direct,
    /// A port-forward to the router pod ([`LocalConfig::router_pod`]).
    PortForward,
    /// The Gateway [`GATEWAY`] ([`LocalConfig::gateway`]).
    Gateway,
}

/// The in-process router: its server and the watch that feeds its index. Dropping it aborts
/// both.
#[derive(Debug)]
struct RouterTasks {
    addr: SocketAddr,
    url: String,
    shutdown: CancellationToken,
    serve: Option<JoinHandle<()>>,
    watch: Option<JoinHandle<()>>,
}

impl RouterTasks {
    async fn start(
        client: &kube::Client,
        port: u16,
        auth: RouterAuth,
        secret: Option<&str>,
        pod_sockets: Option<agent_sandbox_sim::PodSockets>,
    ) -> Result<Self> {
        let mut config =
            agent_sandbox_router::Config::new(SocketAddr::from(([127, 0, 0, 1], port)));
        // Pods in the kubelet's own network namespace (not root) are dialled through it.
        config.pod_sockets = pod_sockets.map(agent_sandbox_router::PodSockets);
        config.auth = match (auth, secret) {
            (RouterAuth::Token, Some(token)) => Auth::Token(Secret::new(token)),
            (RouterAuth::Scoped, Some(key)) => Auth::Scoped(vec![Secret::new(key)]),
            _ => Auth::None,
        };
        // One line per request would drown a `dev` terminal; callers report what they do.
        config.access_log = false;
        config.shutdown_grace = Duration::from_secs(2);
        let index = SharedIndex::new();
        // With the client, the router records activity and wakes suspended sandboxes.
        let router = Router::bind_with(config, index.clone(), Some(client.clone()))
            .await
            .map_err(|source| Error::RouterStart { source })?;
        let addr = router.local_addr();
        let url = format!("http://{addr}");
        let shutdown = CancellationToken::new();
        let watch = tokio::spawn(agent_sandbox_router::watch(client.clone(), index, None));
        let stop = shutdown.clone();
        let serve = tokio::spawn(async move {
            if let Err(error) = router.serve(stop.cancelled_owned()).await {
                tracing::error!(%error, "the local router stopped");
            }
        });
        Ok(Self {
            addr,
            url,
            shutdown,
            serve: Some(serve),
            watch: Some(watch),
        })
    }

    /// Lets the server drain (at most [`ROUTER_GRACE`]), then stops the watch.
    async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(serve) = self.serve.take() {
            let abort = serve.abort_handle();
            if tokio::time::timeout(ROUTER_GRACE, serve).await.is_err() {
                abort.abort();
            }
        }
        if let Some(watch) = self.watch.take() {
            watch.abort();
        }
    }
}

impl Drop for RouterTasks {
    fn drop(&mut self) {
        self.shutdown.cancel();
        for task in [self.serve.take(), self.watch.take()].into_iter().flatten() {
            task.abort();
        }
    }
}

/// A running local cluster. Dropping it stops everything it started: the router and controller
/// tasks are aborted and every pod process is killed; [`LocalCluster::stop`] stops them
/// gracefully instead. The runtimes of a [`RuntimeProgram::CurrentExe`](crate::RuntimeProgram)
/// cluster also exit by themselves when the process that started them dies, so no process
/// outlives the cluster even after a `SIGKILL`.
pub struct LocalCluster {
    // Stopped before the sim (field order is drop order).
    router: Option<RouterTasks>,
    controller: Option<ControllerTask>,
    sim: Sim,
    client: kube::Client,
    auth: RouterAuth,
    secret: Option<(String, PathBuf)>,
    router_pod_url: Option<String>,
    pool_replicas: i32,
    gateway: bool,
    controller_config: Option<agent_sandbox_controller::Config>,
}

impl std::fmt::Debug for LocalCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalCluster")
            .field("api", &self.api_url())
            .field("router", &self.router.as_ref().map(|r| &r.url))
            .field("router_pod", &self.router_pod_url)
            .field("auth", &self.auth)
            .finish_non_exhaustive()
    }
}

/// `KIND default/NAME`, for errors.
fn object(kind: &str, name: &str) -> String {
    format!("{kind} {DEFAULT_NAMESPACE}/{name}")
}

impl LocalCluster {
    /// Starts what `config` asks for: the simulated cluster with the CRDs, the in-process
    /// router, the controller, the router pod (waiting until it is Ready), the Gateway, and the
    /// default template and pool (without waiting for the pool: see
    /// [`LocalCluster::wait_for_pool`]).
    pub async fn start(config: LocalConfig) -> Result<Self> {
        // Idempotent; kube's TLS stack needs one process-wide provider.
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let data_dir = config.data_dir.clone();
        let secret_file = match config.router_auth {
            RouterAuth::Token => Some(TOKEN_FILE),
            RouterAuth::Scoped => Some(SIGNING_KEY_FILE),
            RouterAuth::None => None,
        };

        let (program, args) = config.runtime.to_sim();
        let networks = match config.networks.resolve() {
            // Plain processes share the host's network, whatever was asked.
            _ if config.isolation == Isolation::None => SimNetworks::Host,
            PodNetworks::Host => SimNetworks::Host,
            PodNetworks::Own => SimNetworks::Own,
            PodNetworks::Isolated | PodNetworks::Auto => SimNetworks::Isolated,
        };
        if config.router_pod.is_some() && networks == SimNetworks::Isolated {
            return Err(Error::RouterPodNeedsNetwork {
                why: agent_sandbox_sim::PodNetwork::bridge_available()
                    .err()
                    .unwrap_or_else(|| "isolated pod networks were asked for".to_owned()),
            });
        }
        let mut sim_config = SimConfig::default()
            .isolation(config.isolation)
            .pod_networks(networks)
            .port(config.api_port)
            .image(runtime_entry("*runtime*", program).args(args));
        if let Some(dir) = &data_dir {
            sim_config = sim_config.data_dir(dir);
        }
        if let Some(path) = &config.kubeconfig {
            sim_config = sim_config.kubeconfig(path);
        }
        if let Some(binary) = &config.router_pod {
            sim_config = sim_config.image(router_pod::image_entry(binary, config.router_auth));
        }
        let sim = Sim::start(sim_config)
            .await
            .map_err(|source| Error::SimStart {
                source: Box::new(source),
            })?;
        sim.apply_crds().map_err(|source| Error::SimCrds {
            source: Box::new(source),
        })?;
        let client = sim.client().map_err(|source| Error::SimClient {
            source: Box::new(source),
        })?;
        let secret = match secret_file {
            Some(file) => {
                let path = sim.data_dir().join(file);
                Some((write_new_secret(&path)?, path))
            }
            None => None,
        };

        let mut cluster = Self {
            router: None,
            controller: None,
            client,
            auth: config.router_auth,
            secret,
            router_pod_url: None,
            pool_replicas: config.pool_replicas,
            gateway: config.gateway,
            controller_config: config.controller.clone(),
            sim,
        };
        let secret = cluster.secret.as_ref().map(|(secret, _)| secret.clone());
        if config.in_process_router {
            cluster.router = Some(
                RouterTasks::start(
                    &cluster.client,
                    config.router_port,
                    config.router_auth,
                    secret.as_deref(),
                    cluster.sim.pod_sockets(),
                )
                .await?,
            );
        }
        cluster.start_controller();
        if config.router_pod.is_some() {
            // The router pods reach the API as their ServiceAccount, through the `kubernetes`
            // Service the kubelet gives them, never with the kubeconfig's credential.
            let files = router_pod::RouterFiles {
                auth: config.router_auth,
                secret: secret.as_deref(),
                ca_pem: cluster.sim.ca_pem(),
            };
            let ip = router_pod::install(&cluster.client, files).await?;
            cluster.router_pod_url = Some(format!("http://{ip}:{}", wire::ROUTER_PORT));
            if config.gateway && cluster.router.is_none() {
                router_pod::write_gateway(&cluster.client, &ip, wire::ROUTER_PORT).await?;
            }
        }
        if config.gateway
            && let Some(router) = &cluster.router
        {
            let addr = router.addr;
            router_pod::write_gateway(&cluster.client, &addr.ip().to_string(), addr.port()).await?;
        }
        if config.defaults {
            cluster.apply_defaults().await?;
        }
        Ok(cluster)
    }

    /// Applies (server-side, forced) the default template and, with replicas, the default pool.
    async fn apply_defaults(&self) -> Result<()> {
        let params = PatchParams::apply(FIELD_MANAGER).force();
        Api::<SandboxTemplate>::namespaced(self.client.clone(), DEFAULT_NAMESPACE)
            .patch(
                DEFAULT_TEMPLATE,
                &params,
                &Patch::Apply(default_template()?),
            )
            .await
            .map_err(Error::kube(
                "apply",
                object(kinds::SANDBOX_TEMPLATE, DEFAULT_TEMPLATE),
            ))?;
        if self.pool_replicas > 0 {
            Api::<SandboxWarmPool>::namespaced(self.client.clone(), DEFAULT_NAMESPACE)
                .patch(
                    DEFAULT_POOL,
                    &params,
                    &Patch::Apply(default_pool(self.pool_replicas)?),
                )
                .await
                .map_err(Error::kube(
                    "apply",
                    object(kinds::SANDBOX_WARM_POOL, DEFAULT_POOL),
                ))?;
        }
        Ok(())
    }

    /// Starts the controller with the configured [`LocalConfig::controller`] (again, after
    /// [`LocalCluster::stop_controller`] or [`LocalCluster::kill_controller`]); does nothing
    /// while one runs or when none is configured.
    pub fn start_controller(&mut self) {
        if self.controller.is_none()
            && let Some(config) = &self.controller_config
        {
            self.controller = Some(ControllerTask::spawn(self.client.clone(), config.clone()));
        }
    }

    /// Stops the controller the way SIGTERM does and waits for it at most `grace`; its own
    /// failure, or not stopping in time, is the error.
    pub async fn stop_controller(&mut self, grace: Duration) -> Result<()> {
        match self.controller.take() {
            Some(controller) => controller.stop(grace).await,
            None => Ok(()),
        }
    }

    /// Kills the controller abruptly (in-flight requests are dropped), as a crash would.
    pub fn kill_controller(&mut self) {
        if let Some(controller) = self.controller.take() {
            controller.abort();
        }
    }

    /// A client of the cluster's API server (default namespace `default`).
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// The simulated cluster (request counters, watch control, pod process groups).
    pub fn sim(&self) -> &Sim {
        &self.sim
    }

    /// The API server's request counters so far.
    pub fn request_counts(&self) -> RequestCounts {
        self.sim.request_counts()
    }

    /// The kubeconfig file for `kubectl`, `sandboxctl` and the SDK: the API server's address and
    /// certificate authority and the administrator's bearer token, readable by its owner only
    /// (mode 0600), in `credentials/` of the data directory (mode 0700) unless
    /// [`LocalConfig::kubeconfig`] puts
    /// it elsewhere.
    pub fn kubeconfig_path(&self) -> &Path {
        self.sim.kubeconfig_path()
    }

    /// The API server, `https://127.0.0.1:PORT`.
    pub fn api_url(&self) -> &str {
        self.sim.base_url()
    }

    /// The data directory (pods' directories and logs, the router's secret).
    pub fn data_dir(&self) -> &Path {
        self.sim.data_dir()
    }

    /// What pods are confined by here, and what they lack.
    pub fn protections(&self) -> &agent_sandbox_sim::Protections {
        self.sim.protections()
    }

    /// The pod isolation in effect.
    pub fn isolation(&self) -> Isolation {
        self.sim.isolation()
    }

    /// What a command starting this cluster tells its user first, one line each: what pods
    /// get (and lack), and a warning when they are not isolated or have no internet.
    pub fn startup_notes(&self) -> Vec<String> {
        let protections = self.protections();
        let mut notes = Vec::new();
        if self.isolation() == Isolation::None {
            notes.push(
                "WARNING: pods run UNCONFINED (--isolation none): the code they run has your \
                 user's rights, files, credentials and network"
                    .to_owned(),
            );
        } else {
            notes.push(protections.summary());
        }
        if let Some(internet) = &protections.internet {
            notes.push(format!("warning: {internet}"));
        }
        notes
    }

    /// The in-process router's URL, else the router pod's (both reachable from this host); `None`
    /// when the cluster runs neither.
    pub fn router_url(&self) -> Option<&str> {
        self.router
            .as_ref()
            .map(|router| router.url.as_str())
            .or(self.router_pod_url.as_deref())
    }

    /// The router pod's URL, `http://POD_IP:8080`, when there is a router pod.
    pub fn router_pod_url(&self) -> Option<&str> {
        self.router_pod_url.as_deref()
    }

    /// The routers' authentication.
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
            (Some((token, _)), RouterAuth::Token) => Some(token.clone()),
            _ => None,
        }
    }

    /// The routers' signing key, with [`RouterAuth::Scoped`].
    pub fn signing_key(&self) -> Option<&[u8]> {
        match (&self.secret, self.auth) {
            (Some((key, _)), RouterAuth::Scoped) => Some(key.as_bytes()),
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
        match self.signing_key() {
            Some(key) => agent_sandbox::mint_token(key, namespace, sandbox, ttl)
                .map(Some)
                .map_err(|source| Error::Token {
                    namespace: namespace.to_owned(),
                    sandbox: sandbox.to_owned(),
                    source: Box::new(source),
                }),
            None => Ok(self.router_token()),
        }
    }

    /// SDK options for claims in [`DEFAULT_NAMESPACE`] through `kind`, with the routers'
    /// token or signing key; an error names what the cluster lacks for that kind.
    pub fn client_options(&self, kind: ConnectionKind) -> Result<ClientOptions> {
        let missing = |what: &'static str| Error::NotStarted { what };
        let connection = match kind {
            ConnectionKind::Direct => {
                ConnectionMode::direct(self.router_url().ok_or_else(|| missing("router"))?)
            }
            ConnectionKind::PortForward => {
                self.router_pod_url
                    .as_ref()
                    .ok_or_else(|| missing("router pod (LocalConfig::router_pod)"))?;
                ConnectionMode::port_forward()
            }
            ConnectionKind::Gateway if self.gateway => {
                ConnectionMode::gateway(GATEWAY, DEFAULT_NAMESPACE)
            }
            ConnectionKind::Gateway => return Err(missing("Gateway (LocalConfig::gateway)")),
        };
        let mut options = ClientOptions::default()
            .namespace(DEFAULT_NAMESPACE)
            .connection(connection);
        if let Some(token) = self.router_token() {
            options = options.router_token(token);
        }
        if let Some(key) = self.signing_key() {
            options = options.router_signing_key(key.to_vec());
        }
        Ok(options)
    }

    /// An SDK client for `kind` (see [`LocalCluster::client_options`]).
    pub fn sdk_client(&self, kind: ConnectionKind) -> Result<agent_sandbox::Client> {
        Ok(agent_sandbox::Client::from_kube(
            self.client.clone(),
            self.client_options(kind)?,
        ))
    }

    /// Creates another router pod named `name` behind `sandbox-router-svc` (a replacement for a
    /// deleted one; it runs the binary of [`LocalConfig::router_pod`]).
    pub async fn create_router_pod(&self, name: &str) -> Result<()> {
        router_pod::create_pod(&self.client, self.auth, name).await
    }

    /// Waits until the default pool has at least `ready` ready sandboxes, calling `progress`
    /// with (ready, replicas) every time it looks.
    pub async fn wait_for_pool(
        &self,
        ready: i32,
        timeout: Duration,
        mut progress: impl FnMut(i32, i32),
    ) -> Result<()> {
        let pools: Api<SandboxWarmPool> = Api::namespaced(self.client.clone(), DEFAULT_NAMESPACE);
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let pool = pools.get_opt(DEFAULT_POOL).await.map_err(Error::kube(
                "get",
                object(kinds::SANDBOX_WARM_POOL, DEFAULT_POOL),
            ))?;
            let now = pool
                .as_ref()
                .and_then(|p| p.status.as_ref())
                .map_or(0, |s| s.ready_replicas);
            progress(now, self.pool_replicas);
            if now >= ready {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Timeout {
                    what: format!(
                        "SandboxWarmPool {DEFAULT_NAMESPACE}/{DEFAULT_POOL} to have {ready} ready sandbox(es)"
                    ),
                    after: timeout,
                    last: format!("{now} ready"),
                }
                .into());
            }
            tokio::time::sleep(POOL_POLL).await;
        }
    }

    /// Stops the in-process router (given a moment to drain), the controller (gracefully) and
    /// the simulated cluster, killing every pod process.
    pub async fn stop(self) {
        let Self {
            router,
            controller,
            sim,
            ..
        } = self;
        if let Some(router) = router {
            router.stop().await;
        }
        if let Some(controller) = controller
            && let Err(error) = controller.stop(CONTROLLER_GRACE).await
        {
            tracing::warn!(%error, "stopping the local controller");
        }
        sim.stop().await;
    }
}
