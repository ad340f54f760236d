//! A simulated Kubernetes cluster for tests and local use (`docs/sim.md`).
//!
//! [`Sim::start`] serves, on 127.0.0.1, the subset of the Kubernetes API that our controller,
//! router, SDK, CLI and agent use and that `kubectl` needs, and runs pods as local processes
//! through one node: the process kubelet of `agent-sandbox-kubelet`, which talks to this API
//! over HTTPS like any client (a real cluster's kubelet runs the same code).
//!
//! The API authenticates like a real one ([`auth`], [`rbac`], [`tls`]): TLS with a certificate
//! authority made at start, a bearer token for the administrator (in the kubeconfig, written
//! for its owner only), one for the node, ServiceAccount tokens through TokenRequest; no
//! credential gets 401 everywhere but `/version` and the health checks. There is no plain-HTTP
//! mode.
//!
//! - [`api`]: HTTP routing, discovery, Table output, watches; [`logs`] and [`portforward`]:
//!   the pod subresources the kubelet serves (called in process); [`ops`] and [`store`]: object
//!   semantics, storage, watch history; [`admission`], [`apply`], [`patch`], [`selector`],
//!   [`jsonpath`], [`events`], [`protobuf`], [`validation_rules`] (CEL): the pure pieces they
//!   use;
//! - [`scheduler`]: binding pods to the node; [`gc`]: ownerReference garbage collection;
//!   [`controllers`]: EndpointSlices, namespace lifecycle, PVC binding; [`workloads`]: the
//!   Deployment and ReplicaSet controllers; [`gateway`]: Gateway and HTTPRoute status.
//!
//! The sim is a test harness and a playground, never a production target; `docs/sim.md` lists
//! every way it differs from a real cluster.

// The module map above links the private modules, for readers of the source.
#![allow(rustdoc::private_intra_doc_links)]

mod admission;
mod api;
mod api_error;
mod apply;
mod auth;
mod controllers;
mod error;
mod events;
mod gateway;
mod gc;
mod jsonpath;
mod logs;
mod meta;
mod metrics;
mod ops;
mod patch;
mod portforward;
mod protobuf;
mod rbac;
mod resources;
mod scheduler;
mod selector;
mod store;
pub mod test_support;
mod tls;
mod validation_rules;
mod workloads;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::task::JoinSet;

// The kubelet's configuration types, where the sim's users have always found them.
pub use agent_sandbox_kubelet::{
    DefaultReadiness, ImageEntry, ImageTable, Isolation, PodNetwork, PodSockets, Program,
    Protections, confinement, runtime_entry,
};
pub use api_error::ApiError;
pub use error::{Error, Result};
pub use metrics::{RequestCounts, RequestKey, WRITE_VERBS};

use agent_sandbox_kubelet::{Kubelet, KubeletConfig};

use crate::ops::{ApiObjects, WriteOptions};

/// Name of the one node pods are bound to.
pub const NODE_NAME: &str = "sim-node";

/// Namespaces every sim starts with.
pub const DEFAULT_NAMESPACES: [&str; 4] =
    ["default", "kube-system", "kube-public", "kube-node-lease"];

/// How to start a sim.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Port on 127.0.0.1; 0 lets the OS choose.
    pub port: u16,
    /// Pod process isolation.
    pub isolation: Isolation,
    /// Which program each image runs.
    pub images: ImageTable,
    /// Where to write the kubeconfig (default: `credentials/kubeconfig` in the data directory,
    /// in a directory of mode 0700).
    pub kubeconfig: Option<PathBuf>,
    /// Where pods' directories and logs live (default: a temporary directory removed when the
    /// sim is dropped).
    pub data_dir: Option<PathBuf>,
    /// Watch events kept for resuming watches; older versions get `410 Gone`.
    pub watch_history: usize,
    /// Interval of watch bookmarks.
    pub bookmark_interval: Duration,
    /// Readiness probe interval until a container is first ready.
    pub fast_probe_interval: Duration,
    /// The pods' networks (confined pods; plain processes share the host's).
    pub pod_networks: PodNetworks,
}

/// The networks of a sim's pods.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PodNetworks {
    /// Each pod in a network namespace of its own with loopback only (the default): it
    /// reaches nothing, and only the node reaches it ([`Sim::pod_sockets`]).
    #[default]
    Isolated,
    /// Each pod in a network namespace of its own on a bridge of the node (a free /20 of
    /// 10.200.0.0/13), its NetworkPolicies enforced, the `kubernetes` Service (10.96.0.1:443)
    /// forwarded to this API server: needs `ip`, `nft`, and root or user namespaces (without
    /// root the bridge is in a network namespace of the kubelet's own, [`Sim::pod_sockets`];
    /// starting fails otherwise).
    Own,
    /// The host's network, shared, with loopback pod IPs (pods reach the host's loopback:
    /// for tests whose pods must reach this process without a bridge).
    Host,
}

/// The `kubernetes` Service's cluster IP in the sim.
pub const KUBERNETES_SERVICE_IP: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 96, 0, 1);

/// The kubelet's network settings for `config`, with the API server at `api`.
fn pod_networks(config: &SimConfig, api: SocketAddr, base: KubeletConfig) -> Result<KubeletConfig> {
    match config.pod_networks {
        PodNetworks::Own => {}
        PodNetworks::Isolated => {
            return Ok(KubeletConfig {
                pod_network: PodNetwork::Isolated,
                ..base
            });
        }
        PodNetworks::Host => {
            // Pods share this host's network: the `kubernetes` Service leads to the API's own
            // address, which the serving certificate names.
            return Ok(KubeletConfig {
                pod_network: PodNetwork::Loopback,
                kubernetes_service: Some(api),
                ..base
            });
        }
    }
    let network = agent_sandbox_kubelet::PodNetwork::free_bridge(Some(api)).ok_or_else(|| {
        Error::Kubelet {
            source: agent_sandbox_kubelet::Error::PodNetwork(
                "every /20 of 10.200.0.0/13 tried overlaps a route here".to_owned(),
            ),
        }
    })?;
    Ok(KubeletConfig {
        pod_network: network,
        kubernetes_service: Some(SocketAddr::from((KUBERNETES_SERVICE_IP, 443))),
        ..base
    })
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            port: 0,
            isolation: Isolation::Confined,
            images: ImageTable::with_defaults(),
            kubeconfig: None,
            data_dir: None,
            watch_history: 10_000,
            bookmark_interval: Duration::from_secs(5),
            fast_probe_interval: Duration::from_millis(10),
            pod_networks: PodNetworks::Isolated,
        }
    }
}

impl SimConfig {
    /// Sets the pods' networks: see [`PodNetworks`].
    #[must_use]
    pub fn pod_networks(mut self, networks: PodNetworks) -> Self {
        self.pod_networks = networks;
        self
    }

    /// Sets the isolation.
    #[must_use]
    pub fn isolation(mut self, isolation: Isolation) -> Self {
        self.isolation = isolation;
        self
    }

    /// Adds an image entry that takes precedence over the existing ones.
    #[must_use]
    pub fn image(mut self, entry: ImageEntry) -> Self {
        self.images.prepend(entry);
        self
    }

    /// Replaces the image table.
    #[must_use]
    pub fn images(mut self, images: ImageTable) -> Self {
        self.images = images;
        self
    }

    /// Sets the kubeconfig path.
    #[must_use]
    pub fn kubeconfig(mut self, path: impl Into<PathBuf>) -> Self {
        self.kubeconfig = Some(path.into());
        self
    }

    /// Sets the data directory.
    #[must_use]
    pub fn data_dir(mut self, path: impl Into<PathBuf>) -> Self {
        self.data_dir = Some(path.into());
        self
    }

    /// Sets the port.
    #[must_use]
    pub fn port(mut self, port: u16) -> Self {
        self.port = port;
        self
    }
}

/// A running simulated cluster. Dropping it stops the server and kills every pod process.
#[derive(Debug)]
pub struct Sim {
    addr: SocketAddr,
    base_url: String,
    ca_pem: String,
    ca_der: rustls::pki_types::CertificateDer<'static>,
    credentials: Arc<auth::Credentials>,
    kubeconfig: PathBuf,
    data_dir: PathBuf,
    isolation: Isolation,
    objects: Arc<ApiObjects>,
    api: Arc<api::ApiState>,
    kubelet: Arc<Kubelet>,
    tasks: JoinSet<()>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    _temp: Option<tempfile::TempDir>,
}

fn internal_options() -> WriteOptions {
    WriteOptions {
        manager: "kube-sim".to_owned(),
        ..WriteOptions::default()
    }
}

fn seed(objects: &ApiObjects) -> Result<()> {
    let seed_err = |what: &str| {
        let what = what.to_owned();
        move |source| Error::Seed { what, source }
    };
    let namespaces = objects
        .builtin("", "namespaces")
        .map_err(seed_err("namespaces"))?;
    for name in DEFAULT_NAMESPACES {
        objects
            .create(
                &namespaces,
                "",
                json!({"metadata": {"name": name}}),
                &internal_options(),
            )
            .map_err(seed_err(&format!("namespace {name}")))?;
    }
    let services = objects
        .builtin("", "services")
        .map_err(seed_err("services"))?;
    objects
        .create(
            &services,
            "default",
            json!({"metadata": {"name": "kubernetes", "labels": {"component": "apiserver", "provider": "kubernetes"}},
                   "spec": {"clusterIP": KUBERNETES_SERVICE_IP.to_string(), "ports": [{"name": "https", "port": 443, "targetPort": 6443}]}}),
            &internal_options(),
        )
        .map_err(seed_err("the kubernetes Service"))?;
    // The bootstrap role of a real cluster that grants everything, bound to `system:masters`,
    // for bindings that name it.
    let roles = objects
        .builtin(rbac::GROUP, "clusterroles")
        .map_err(seed_err("clusterroles"))?;
    objects
        .create(
            &roles,
            "",
            json!({"metadata": {"name": "cluster-admin", "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
                   "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
                             {"nonResourceURLs": ["*"], "verbs": ["*"]}]}),
            &internal_options(),
        )
        .map_err(seed_err("the cluster-admin ClusterRole"))?;
    let bindings = objects
        .builtin(rbac::GROUP, "clusterrolebindings")
        .map_err(seed_err("clusterrolebindings"))?;
    objects
        .create(
            &bindings,
            "",
            json!({"metadata": {"name": "cluster-admin", "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
                   "roleRef": {"apiGroup": rbac::GROUP, "kind": "ClusterRole", "name": "cluster-admin"},
                   "subjects": [{"apiGroup": rbac::GROUP, "kind": "Group", "name": auth::MASTERS_GROUP}]}),
            &internal_options(),
        )
        .map_err(seed_err("the cluster-admin ClusterRoleBinding"))?;
    Ok(())
}

/// Named CRD objects, or the CRD whose preparation failed.
type PreparedCrds = std::result::Result<Vec<(String, serde_json::Value)>, (String, ApiError)>;

/// The project's CRDs as the API server stores them after a server-side apply by `kube-sim`
/// (without uid and timestamps), computed once per process: generating and admitting them
/// takes long enough to matter when every test starts a sim.
fn prepared_crds() -> Result<&'static [(String, serde_json::Value)]> {
    static PREPARED: std::sync::OnceLock<PreparedCrds> = std::sync::OnceLock::new();
    let prepared = PREPARED.get_or_init(|| {
        let scratch = ApiObjects::new(16);
        let info = scratch
            .builtin("apiextensions.k8s.io", "customresourcedefinitions")
            .map_err(|e| ("customresourcedefinitions".to_owned(), e))?;
        let mut out = Vec::new();
        for crd in agent_sandbox_api::crds::all() {
            let name = crd.metadata.name.clone().unwrap_or_default();
            let mut value = serde_json::to_value(&crd)
                .map_err(|e| (name.clone(), ApiError::internal(e.to_string())))?;
            value["apiVersion"] = json!("apiextensions.k8s.io/v1");
            value["kind"] = json!("CustomResourceDefinition");
            let mut options = internal_options();
            options.force = true;
            let written = scratch
                .apply(&info, "", &name, &value, ops::Subresource::Main, &options)
                .map_err(|e| (name.clone(), e))?;
            out.push((name, written.object));
        }
        Ok(out)
    });
    prepared
        .as_ref()
        .map(Vec::as_slice)
        .map_err(|(name, source)| Error::Crd {
            name: name.clone(),
            source: source.clone(),
        })
}

/// The kubeconfig of a sim at `base_url` (`https://...`) whose certificate authority is
/// `ca_pem`, for a user with bearer token `token`: cluster, user and context `sim`, namespace
/// `default`.
pub fn kubeconfig_yaml(base_url: &str, ca_pem: &str, token: &str) -> String {
    use base64::Engine as _;
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: sim\n  cluster:\n    server: {base_url}\n    certificate-authority-data: {ca}\nusers:\n- name: sim\n  user:\n    token: {token}\ncontexts:\n- name: sim\n  context:\n    cluster: sim\n    user: sim\n    namespace: default\ncurrent-context: sim\npreferences: {{}}\n"
    )
}

/// A kube client for the sim at `base_url` (default namespace `default`) that trusts `ca` and
/// authenticates with bearer `token`, sending `user_agent` when given.
fn client_for(
    base_url: &str,
    ca: &rustls::pki_types::CertificateDer<'_>,
    token: &str,
    user_agent: Option<&'static str>,
) -> Result<kube::Client> {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let client_error = |source: kube::Error| Error::Client {
        url: base_url.to_owned(),
        source,
    };
    let url: http::Uri = base_url
        .parse()
        .map_err(|error: http::uri::InvalidUri| client_error(kube::Error::Service(error.into())))?;
    let mut config = kube::Config::new(url);
    config.default_namespace = "default".to_owned();
    config.root_cert = Some(vec![ca.to_vec()]);
    let mut bearer = http::HeaderValue::from_str(&format!("Bearer {token}"))
        .map_err(|error| client_error(kube::Error::Service(error.into())))?;
    bearer.set_sensitive(true);
    config.headers.push((http::header::AUTHORIZATION, bearer));
    if let Some(agent) = user_agent {
        config.headers.push((
            http::header::USER_AGENT,
            http::HeaderValue::from_static(agent),
        ));
    }
    kube::Client::try_from(config).map_err(client_error)
}

/// The start of the name of a sim's own data directory: `kube-sim-<pid>-<random>`.
const DATA_DIR_PREFIX: &str = "kube-sim-";

/// Removes the data directories in `base` of sims whose process is gone (killed before they
/// could remove their own): what they held (pods' logs, credentials, a router's token) must not
/// outlive them.
fn sweep_data_dirs(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    let me = rustix::process::geteuid().as_raw();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|name| name.strip_prefix(DATA_DIR_PREFIX))
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        use std::os::unix::fs::MetadataExt as _;
        let ours = entry
            .metadata()
            .is_ok_and(|metadata| metadata.is_dir() && metadata.uid() == me);
        if ours && !Path::new(&format!("/proc/{pid}")).exists() {
            // `remove_dir_all` never follows a symbolic link out of the directory.
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Creates `dir` and its missing parents, those it creates readable by the owner only.
fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// Writes `text` to `path` for its owner only (mode 0600), replacing the file at once: a new
/// file (never one that exists, nor through a symlink) renamed over it.
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        create_private_dir(parent)?;
    }
    let temporary = path.with_extension(format!("tmp{}", std::process::id()));
    let _ = std::fs::remove_file(&temporary);
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&temporary)
        .and_then(|mut file| file.write_all(text.as_bytes()));
    if let Err(error) = written {
        let _ = std::fs::remove_file(&temporary);
        return Err(error);
    }
    std::fs::rename(&temporary, path)
}

/// The directory of the data directory (mode 0700) that holds the kubeconfig by default.
pub const CREDENTIALS_DIR: &str = "credentials";

/// How long a client may take for its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `router` over TLS on `listener` until `shutdown`: each connection's handshake and
/// requests in a task of its own, all ended when this returns or is aborted.
async fn serve_tls(
    listener: tokio::net::TcpListener,
    tls: Arc<rustls::ServerConfig>,
    router: axum::Router,
    mut shutdown: tokio::sync::oneshot::Receiver<()>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = &mut shutdown => return,
        };
        let (tcp, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "the sim's API server failed to accept a connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // Watch events are small writes on long-lived responses: without TCP_NODELAY,
        // Nagle's algorithm and delayed ACKs hold each one back by up to 40 ms.
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let router = router.clone();
        connections.spawn(async move {
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(error)) => {
                    tracing::debug!(%peer, %error, "the sim's API server refused a TLS handshake");
                    return;
                }
                Err(_) => return,
            };
            let service =
                hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
                    let mut router = router.clone();
                    // The router is always ready.
                    async move { tower_service::Service::call(&mut router, request).await }
                });
            if let Err(error) = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                .with_upgrades()
                .await
            {
                tracing::debug!(%peer, %error, "a connection to the sim's API server ended");
            }
        });
        while connections.try_join_next().is_some() {}
    }
}

impl Sim {
    /// Starts a sim: API server, kubelet, garbage collector and controllers.
    pub async fn start(config: SimConfig) -> Result<Self> {
        let (temp, data_dir) = match &config.data_dir {
            Some(dir) => (None, dir.clone()),
            None => {
                // Private (pods' files, logs, the kubeconfig, a local router's token), and named
                // after this process so that the next start removes it if this one is killed.
                sweep_data_dirs(&std::env::temp_dir());
                let temp = tempfile::Builder::new()
                    .prefix(&format!("{DATA_DIR_PREFIX}{}-", std::process::id()))
                    .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
                    .tempdir()
                    .map_err(|source| Error::DataDir {
                        path: std::env::temp_dir(),
                        source,
                    })?;
                let path = temp.path().to_path_buf();
                (Some(temp), path)
            }
        };
        let pods_dir = data_dir.join("pods");
        let volumes_dir = data_dir.join("volumes");
        for dir in [&pods_dir, &volumes_dir] {
            std::fs::create_dir_all(dir).map_err(|source| Error::DataDir {
                path: dir.clone(),
                source,
            })?;
        }
        let objects = Arc::new(ApiObjects::new(config.watch_history));
        seed(&objects)?;

        let bind = format!("127.0.0.1:{}", config.port);
        let listener = tokio::net::TcpListener::bind(&bind)
            .await
            .map_err(|source| Error::Bind {
                addr: bind.clone(),
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| Error::Bind {
            addr: bind.clone(),
            source,
        })?;
        let base_url = format!("https://{addr}");
        let tls = tls::generate(KUBERNETES_SERVICE_IP)?;
        let credentials = Arc::new(auth::Credentials::generate(NODE_NAME)?);
        // The node: the one kubelet implementation, a client of this API like any other, with
        // a credential of its own.
        let kubelet = Arc::new(
            Kubelet::new(
                client_for(
                    &base_url,
                    &tls.ca_der,
                    credentials.node_token(),
                    Some(api::NODE_USER_AGENT),
                )?,
                KubeletConfig {
                    images: config.images.clone(),
                    isolation: config.isolation,
                    fast_probe_interval: config.fast_probe_interval,
                    ..pod_networks(&config, addr, KubeletConfig::new(NODE_NAME, &data_dir))?
                },
            )
            .map_err(|source| Error::Kubelet { source })?,
        );
        let metrics = Arc::new(metrics::Metrics::default());
        let (watch_epoch, _) = tokio::sync::watch::channel(0);
        let api = Arc::new(api::ApiState {
            objects: objects.clone(),
            metrics,
            kubelet: kubelet.clone(),
            server: addr.to_string(),
            bookmark_interval: config.bookmark_interval,
            tasks: std::sync::Mutex::new(JoinSet::new()),
            watch_epoch,
            credentials: credentials.clone(),
            node: NODE_NAME.to_owned(),
        });
        let mut tasks = JoinSet::new();
        let (shutdown, shutdown_rx) = tokio::sync::oneshot::channel::<()>();
        let router = api::router(api.clone());
        tasks.spawn(serve_tls(listener, tls.config.clone(), router, shutdown_rx));
        tasks.spawn(
            scheduler::Scheduler::new(objects.clone(), NODE_NAME).run(objects.store.subscribe()),
        );
        tasks.spawn(gc::run(
            gc::Collector::new(objects.clone()),
            objects.store.subscribe(),
        ));
        tasks.spawn(controllers::run(
            controllers::Controllers::new(objects.clone()),
            objects.store.subscribe(),
        ));
        let kubeconfig = config
            .kubeconfig
            .clone()
            .unwrap_or_else(|| data_dir.join(CREDENTIALS_DIR).join("kubeconfig"));
        let text = kubeconfig_yaml(&base_url, &tls.ca_pem, credentials.admin_token());
        write_private(&kubeconfig, &text).map_err(|source| Error::Kubeconfig {
            path: kubeconfig.clone(),
            source,
        })?;
        let isolation = kubelet.isolation();
        let sim = Self {
            addr,
            base_url,
            ca_pem: tls.ca_pem.clone(),
            ca_der: tls.ca_der.clone(),
            credentials,
            kubeconfig,
            data_dir,
            isolation,
            objects,
            api,
            kubelet,
            tasks,
            shutdown: Some(shutdown),
            _temp: temp,
        };
        // The node is registered before anyone is told the cluster is up.
        sim.kubelet
            .start()
            .await
            .map_err(|source| Error::Kubelet { source })?;
        tracing::info!(base_url = %sim.base_url, kubeconfig = %sim.kubeconfig.display(), %isolation, "simulated cluster ready");
        Ok(sim)
    }

    /// `https://127.0.0.1:PORT`.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// The certificate authority the API's serving certificate chains to, PEM (what the
    /// kubeconfig's `certificate-authority-data` carries, and pods' `kube-root-ca.crt`).
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The administrator's bearer token (the kubeconfig's credential), for tests that speak
    /// HTTP to the API themselves.
    pub fn admin_token(&self) -> &str {
        self.credentials.admin_token()
    }

    /// The server's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The kubeconfig file (cluster, user and context `sim`, namespace `default`; the server's
    /// certificate authority and the administrator's token; mode 0600).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// The directory holding pods' directories and logs.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// What pods are confined by on this machine (and what they lack).
    pub fn protections(&self) -> &Protections {
        self.kubelet.protections()
    }

    /// Where sockets for connections to pod IPs come from when pods are in a network this
    /// process is not in (own pod networks without root); `None`: connect as usual.
    pub fn pod_sockets(&self) -> Option<PodSockets> {
        self.kubelet.pod_sockets()
    }

    /// The isolation pods actually get (`Confined` or `None`).
    pub fn isolation(&self) -> Isolation {
        self.isolation
    }

    /// A kube client for the sim as its administrator (the kubeconfig's user; default
    /// namespace `default`).
    pub fn client(&self) -> Result<kube::Client> {
        client_for(&self.base_url, &self.ca_der, self.admin_token(), None)
    }

    /// A kube client for the sim that authenticates with bearer `token` (a ServiceAccount's,
    /// or any other, for tests of authentication and authorization).
    pub fn client_with_token(&self, token: &str) -> Result<kube::Client> {
        client_for(&self.base_url, &self.ca_der, token, None)
    }

    /// Registers the project's CRDs (`agent_sandbox_api::crds::all()`), as
    /// `kubectl apply --server-side -f deploy/crds/` would (field manager `kube-sim`), without
    /// counting requests. The admitted objects are prepared once per process, so this is cheap.
    pub fn apply_crds(&self) -> Result<()> {
        let info = self
            .objects
            .builtin("apiextensions.k8s.io", "customresourcedefinitions")
            .map_err(|source| Error::Crd {
                name: "customresourcedefinitions".into(),
                source,
            })?;
        for (name, object) in prepared_crds()? {
            if self.objects.store.get(&info.storage(), "", name).is_some() {
                continue;
            }
            self.objects
                .create_prepared(&info, object.clone())
                .map_err(|source| Error::Crd {
                    name: name.clone(),
                    source,
                })?;
        }
        Ok(())
    }

    /// The request counters so far.
    pub fn request_counts(&self) -> RequestCounts {
        self.api.metrics.snapshot()
    }

    /// The counters as Prometheus text (what `GET /sim/metrics` serves).
    pub fn metrics_text(&self) -> String {
        self.api.metrics.render()
    }

    /// Forgets the watch history, so that resuming a watch from any earlier version yields
    /// `410 Gone` (what etcd compaction does).
    pub fn compact_watch_history(&self) {
        self.objects.store.compact();
    }

    /// Ends every open watch, as an API server restart does; clients re-watch from their last
    /// version.
    pub fn close_watches(&self) {
        self.api.watch_epoch.send_modify(|epoch| *epoch += 1);
    }

    /// The pod process groups alive right now.
    pub fn live_process_groups(&self) -> usize {
        self.kubelet.live_process_groups()
    }

    /// Stops the server, the controllers and every pod process.
    pub async fn stop(mut self) {
        // The node first, while the API still answers: its loops never see the API vanish
        // (they would retry against a closed port and log each failure).
        self.kubelet.stop().await;
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        self.close_watches();
        self.api.abort_tasks();
        self.tasks.abort_all();
        while self.tasks.join_next().await.is_some() {}
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        self.api.abort_tasks();
        self.tasks.abort_all();
        // The API's tasks may hold the kubelet a little longer; its processes go now.
        self.kubelet.abort();
    }
}

#[cfg(test)]
mod data_dir_tests {
    use super::*;

    #[test]
    fn the_data_directories_of_dead_sims_are_swept_and_no_other() {
        let base = tempfile::tempdir().unwrap();
        // No pid reaches 999999999 (the kernel's limit is 2^22).
        let dead = base.path().join("kube-sim-999999999-abc");
        let alive = base
            .path()
            .join(format!("kube-sim-{}-def", std::process::id()));
        let other = base.path().join("kube-sim-notapid");
        for dir in [&dead, &alive, &other] {
            std::fs::create_dir(dir).unwrap();
            std::fs::write(dir.join("token"), "secret").unwrap();
        }
        sweep_data_dirs(base.path());
        assert!(!dead.exists());
        assert!(alive.join("token").exists());
        assert!(other.join("token").exists());
    }
}
