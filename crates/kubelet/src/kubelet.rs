//! The kubelet itself: [`Kubelet`] registers its Node, watches the pods bound to it (field
//! selector `spec.nodeName`), hands each to a pod worker ([`crate::pod`]) and ends the worker
//! when the pod is deleted; it also answers, in process, what the kubelet API serves (logs and
//! port-forward). Everything it knows about the cluster comes through its `kube::Client`.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Preconditions};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher;
use kube::{Api, ResourceExt as _};
use serde_json::Value;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::confine::Protections;
use crate::error::{Error, Result};
use crate::events::{self, Recorder};
use crate::images::ImageTable;
use crate::logs::{self, LogOptions, LogStream};
use crate::node::{self, NodeSpec, error_chain};
use crate::process::{Isolation, ProcessTable};
use crate::server::{self, ApiServing};

/// How to run a kubelet.
#[derive(Clone, Debug)]
pub struct KubeletConfig {
    /// The Node's name.
    pub node_name: String,
    /// Which program each image runs.
    pub images: ImageTable,
    /// Pod process isolation (confined by default; the kubelet refuses to start where pods
    /// cannot be confined, unless this is `None`).
    pub isolation: Isolation,
    /// Root of the pods' directories and logs.
    pub pods_dir: PathBuf,
    /// Root of the PersistentVolumeClaims' directories (`<namespace>/<claim>`).
    pub volumes_dir: PathBuf,
    /// Readiness probe interval until a container is first ready.
    pub fast_probe_interval: Duration,
    /// How long the node's Lease is valid.
    pub lease_duration: Duration,
    /// How often the Lease is renewed.
    pub heartbeat_interval: Duration,
    /// How often the Node's `Ready` condition is reported again.
    pub node_status_interval: Duration,
    /// The port of the kubelet API, published in the Node's `daemonEndpoints`, when it serves
    /// one.
    pub kubelet_port: Option<u16>,
    /// The executable next to which named programs are looked up (default: this process's).
    pub exe: Option<PathBuf>,
    /// Serve the kubelet API over HTTPS (logs, port-forward) for a real API server to call;
    /// the Node then publishes its port instead of `kubelet_port`.
    pub api: Option<ApiServing>,
    /// Where this node's pods reach the API server, given to every container as the
    /// `kubernetes` Service (`KUBERNETES_SERVICE_HOST`/`_PORT`, which in-cluster configuration
    /// reads). A node's kube-proxy leads the Service's ClusterIP there; this node has none, so
    /// it gives the address itself. `None`: not set.
    pub kubernetes_service: Option<SocketAddr>,
    /// Where pod IPs come from.
    pub pod_network: PodNetwork,
    /// What the Node advertises to the scheduler as its capacity (and allocatable). The
    /// scheduler places pods by these figures; containers' `resources.limits` are enforced
    /// in confined pods where control groups can be made.
    pub capacity: NodeCapacity,
    /// The most processes a container of a confined pod may have (a real kubelet's
    /// `--pod-max-pids`); default 4096.
    pub pod_pids_limit: u64,
    /// The storage of a confined pod whose containers do not all set
    /// `limits.ephemeral-storage` (bytes; default 1 GiB): its `/app`, `/tmp` and `emptyDir`
    /// volumes share a tmpfs of this size (which counts against memory).
    pub pod_storage_default: u64,
}

/// [`KubeletConfig::pod_storage_default`]'s default: 1 GiB.
pub const DEFAULT_POD_STORAGE: u64 = 1 << 30;

/// A Node's capacity, as quantities.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeCapacity {
    /// CPUs (`"2"`, `"500m"`).
    pub cpu: String,
    /// Memory (`"8Gi"`).
    pub memory: String,
    /// Pods.
    pub pods: u32,
    /// Ephemeral storage (`"1Ti"`): what pods' `requests.ephemeral-storage` are scheduled
    /// against. A confined pod's storage is a tmpfs of its limit, used only as it is written.
    pub ephemeral_storage: String,
}

impl Default for NodeCapacity {
    /// 2 CPUs, 8 GiB, 1000 pods and 1 TiB of ephemeral storage.
    fn default() -> Self {
        Self {
            cpu: "2".to_owned(),
            memory: "8Gi".to_owned(),
            pods: 1000,
            ephemeral_storage: "1Ti".to_owned(),
        }
    }
}

impl NodeCapacity {
    pub(crate) fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "cpu": self.cpu,
            "memory": self.memory,
            "pods": self.pods.to_string(),
            "ephemeral-storage": self.ephemeral_storage,
        })
    }
}

/// Where sockets for connections to pod IPs come from when the pods' network is not the
/// caller's (a kubelet that is not root keeps it in a namespace of its own; a pod with loopback
/// only is reachable only from inside its own): given the pod IP to connect to, the socket is
/// made in the right namespace, the connection is made with it here. See
/// [`Kubelet::pod_sockets`].
pub type PodSockets =
    Arc<dyn Fn(IpAddr) -> std::io::Result<tokio::net::TcpSocket> + Send + Sync + 'static>;

/// Where pod IPs come from. With `Loopback` and `Local` every pod shares the node's network
/// namespace and an IP is an address the kernel treats as local, chosen where the pod's ports
/// are free; with `Isolated` and `Bridge` each pod has a network namespace of its own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PodNetwork {
    /// A network namespace per pod with loopback only (the default: it needs nothing but user
    /// namespaces and touches nothing of the machine's network): the pod reaches nothing and
    /// nothing reaches it but the node, whose connections ([`Kubelet::pod_sockets`]) are made
    /// from inside it. Its IP is a random address in 127.1.0.1–127.254.255.254, local there.
    #[default]
    Isolated,
    /// The node's network namespace, shared, with random addresses in
    /// 127.1.0.1–127.254.255.254 (a real API server refuses loopback addresses in
    /// EndpointSlices, so Services get no endpoints).
    Loopback,
    /// Addresses from this IPv4 range, which the network namespace the kubelet runs in must
    /// route locally (`ip route add local 10.244.0.0/16 dev lo`, in a namespace of its own).
    /// Its network, first and broadcast addresses are never given out.
    Local {
        /// The range's first address.
        network: Ipv4Addr,
        /// Its prefix length (8–30).
        prefix: u8,
    },
    /// A network namespace per pod with its IP from this range on `eth0`, on a bridge the
    /// kubelet makes (which takes the range's first address), its NetworkPolicies enforced
    /// with nftables inside it, and the `kubernetes` Service ([`KubeletConfig::kubernetes_service`])
    /// forwarded to `api`. Needs `ip` and `nft` ([`PodNetwork::bridge_available`]). As root
    /// the bridge is in the kubelet's network namespace; otherwise in a user and network
    /// namespace of the kubelet's own, which `slirp4netns` connects to the host's network
    /// (without its loopback) and which the kubelet's connections to pods go through
    /// ([`Kubelet::pod_sockets`]).
    Bridge {
        /// The range's first address.
        network: Ipv4Addr,
        /// Its prefix length (8–30).
        prefix: u8,
        /// Where the API server listens, for the pods' `kubernetes` Service.
        api: Option<SocketAddr>,
    },
}

impl PodNetwork {
    /// Whether this machine lets the kubelet give pods networks of their own; the error says
    /// what is missing.
    pub fn bridge_available() -> std::result::Result<(), String> {
        crate::pod_net::available()
    }

    /// Bridge networking in a /20 of 10.200.0.0/13 that no route here overlaps, forwarding the
    /// `kubernetes` Service to `api`; `None` when every range tried overlaps one.
    pub fn free_bridge(api: Option<SocketAddr>) -> Option<Self> {
        crate::pod_net::free_range().map(|(network, prefix)| Self::Bridge {
            network,
            prefix,
            api,
        })
    }
}

impl KubeletConfig {
    /// A node named `node_name` keeping pods under `data_dir/pods` and volumes under
    /// `data_dir/volumes`, with the default image table and a real kubelet's timings (Lease of
    /// 40 s renewed every 10 s, node status every minute).
    pub fn new(node_name: impl Into<String>, data_dir: &std::path::Path) -> Self {
        Self {
            node_name: node_name.into(),
            images: ImageTable::with_defaults(),
            isolation: Isolation::Confined,
            pods_dir: data_dir.join("pods"),
            volumes_dir: data_dir.join("volumes"),
            fast_probe_interval: Duration::from_millis(10),
            lease_duration: Duration::from_secs(40),
            heartbeat_interval: Duration::from_secs(10),
            node_status_interval: Duration::from_secs(60),
            kubelet_port: None,
            exe: std::env::current_exe().ok(),
            api: None,
            kubernetes_service: None,
            pod_network: PodNetwork::Isolated,
            capacity: NodeCapacity::default(),
            pod_pids_limit: crate::cgroup::DEFAULT_PIDS,
            pod_storage_default: DEFAULT_POD_STORAGE,
        }
    }
}

/// What the kubelet knows of a pod it runs, for the kubelet API.
#[derive(Debug, Default)]
pub(crate) struct PodRuntime {
    /// The pod's namespace and name, which the kubelet API's paths give.
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) ip: Option<Ipv4Addr>,
    /// Names of the containers running now.
    pub(crate) running: BTreeSet<String>,
    /// The pod's labels and named ports, for NetworkPolicies.
    pub(crate) peer: crate::netpol::PodPeer,
    /// The pod's network namespace (bridge networking).
    pub(crate) net: Option<Arc<crate::pod_net::PodNet>>,
}

/// Everything the kubelet's tasks share.
pub(crate) struct Context {
    pub(crate) client: kube::Client,
    pub(crate) node: String,
    pub(crate) images: ImageTable,
    /// Pods are confined ([`crate::sandbox`]); plain processes otherwise.
    pub(crate) confined: bool,
    /// What confined pods are protected by here.
    pub(crate) protections: Protections,
    /// The most processes a container may have.
    pub(crate) pod_pids_limit: u64,
    /// The storage of a pod that sets no ephemeral-storage limit (bytes).
    pub(crate) pod_storage: u64,
    /// This kubelet's control group (below which each container gets one), by name.
    pub(crate) cgroup: String,
    /// The pods' bridge (bridge networking).
    pub(crate) bridge: Option<crate::pod_net::Bridge>,
    /// The NetworkPolicies and namespaces the pods' rules come from.
    pub(crate) policies: Mutex<crate::netpol::Cluster>,
    /// Held while rules are applied ([`Context::apply_policies`]).
    pub(crate) applying_policies: Mutex<()>,
    pub(crate) pods_dir: PathBuf,
    pub(crate) volumes_dir: PathBuf,
    pub(crate) fast_probe: Duration,
    pub(crate) processes: Arc<ProcessTable>,
    pub(crate) exe: Option<PathBuf>,
    pub(crate) kubernetes_service: Option<SocketAddr>,
    pub(crate) pod_network: PodNetwork,
    pub(crate) events: Recorder,
    /// The pods the workers run, by uid.
    pub(crate) pods: Mutex<HashMap<String, PodRuntime>>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("node", &self.node)
            .field("confined", &self.confined)
            .field("pods_dir", &self.pods_dir)
            .finish_non_exhaustive()
    }
}

impl Context {
    /// Edits what the kubelet API knows of pod `key`.
    pub(crate) fn update_pod(&self, key: &PodKey, change: impl FnOnce(&mut PodRuntime)) {
        let mut pods = self.pods.lock().unwrap_or_else(PoisonError::into_inner);
        let pod = pods.entry(key.uid.clone()).or_default();
        if pod.name.is_empty() {
            pod.namespace.clone_from(&key.namespace);
            pod.name.clone_from(&key.name);
        }
        change(pod);
    }

    /// The pod `namespace/name` this kubelet runs, if it runs one of that name.
    pub(crate) fn find_pod(&self, namespace: &str, name: &str) -> Option<PodKey> {
        self.pods
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .find(|(_, pod)| pod.namespace == namespace && pod.name == name)
            .map(|(uid, pod)| PodKey {
                namespace: pod.namespace.clone(),
                name: pod.name.clone(),
                uid: uid.clone(),
            })
    }

    /// Forgets pod `uid` (its worker has ended), and its address in others' rules.
    pub(crate) fn forget_pod(&self, uid: &str) {
        let removed = self
            .pods
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(uid);
        if removed.is_some_and(|pod| pod.net.is_some()) {
            self.apply_policies();
        }
    }

    /// The network namespace of pod `uid`, if it has one.
    pub(crate) fn pod_net(&self, uid: &str) -> Option<Arc<crate::pod_net::PodNet>> {
        self.pods
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(uid)
            .and_then(|pod| pod.net.clone())
    }

    /// Records the network namespace of pod `uid`.
    pub(crate) fn set_pod_net(&self, uid: &str, net: Arc<crate::pod_net::PodNet>) {
        if let Some(pod) = self
            .pods
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_mut(uid)
        {
            pod.net = Some(net);
        }
    }

    /// What the policies are evaluated against now: the known policies and namespaces, and
    /// this node's pods.
    pub(crate) fn policy_cluster(&self) -> crate::netpol::Cluster {
        let mut cluster = self
            .policies
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let pods = self.pods.lock().unwrap_or_else(PoisonError::into_inner);
        cluster.pods = pods
            .values()
            .map(|pod| crate::netpol::PodPeer {
                ip: pod.ip,
                ..pod.peer.clone()
            })
            .collect();
        for pod in &cluster.pods {
            if !cluster.namespaces.contains_key(&pod.namespace) {
                let labels = crate::netpol::namespace_labels(&pod.namespace, None);
                cluster.namespaces.insert(pod.namespace.clone(), labels);
            }
        }
        cluster
    }

    /// Where the node's own connections to pods (probes, port-forward) get their sockets:
    /// inside the pod's namespace for pods with loopback only, in the node's namespace for
    /// pods on the bridge of a kubelet that is not root; `None`: the caller's own.
    pub(crate) fn pod_sockets(self: &Arc<Self>) -> Option<PodSockets> {
        if self.pod_network == PodNetwork::Isolated && self.confined {
            let ctx = Arc::downgrade(self);
            return Some(Arc::new(move |ip: IpAddr| {
                let gone = || std::io::Error::other("the kubelet has stopped");
                let ctx = ctx.upgrade().ok_or_else(gone)?;
                let net = ctx.pod_net_by_ip(ip).ok_or_else(|| {
                    std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        format!("no pod of this node has IP {ip}"),
                    )
                })?;
                net.tcp_socket()
            }));
        }
        self.bridge.as_ref()?.sockets()
    }

    /// The network namespace of the pod with IP `ip`, if this node runs one.
    fn pod_net_by_ip(&self, ip: IpAddr) -> Option<Arc<crate::pod_net::PodNet>> {
        self.pods
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .find(|pod| pod.ip.map(IpAddr::V4) == Some(ip))
            .and_then(|pod| pod.net.clone())
    }

    /// The rules every pod's namespace has apart from its policies.
    pub(crate) fn node_rules(&self) -> Option<crate::netpol::NodeRules> {
        let bridge = self.bridge.as_ref()?;
        let service = match self.kubernetes_service {
            Some(SocketAddr::V4(service)) => Some(service),
            _ => None,
        };
        Some(crate::netpol::NodeRules {
            node_ip: bridge.gateway,
            api: service.zip(bridge.api_address()),
        })
    }

    /// Brings every pod's rules in line with the policies, namespaces and pods known now. One
    /// at a time, each from a snapshot taken under the lock, so that an older snapshot's rules
    /// never land after a newer one's.
    pub(crate) fn apply_policies(&self) {
        let Some(node) = self.node_rules() else {
            return;
        };
        let _one_at_a_time = self
            .applying_policies
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let cluster = self.policy_cluster();
        let nets: Vec<(String, crate::netpol::PodPeer, Arc<crate::pod_net::PodNet>)> = self
            .pods
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .filter_map(|pod| {
                let net = pod.net.clone()?;
                let name = format!("{}/{}", pod.namespace, pod.name);
                Some((name, pod.peer.clone(), net))
            })
            .collect();
        for (name, peer, net) in nets {
            let rules = crate::netpol::ruleset(&peer, &cluster, node);
            if let Err(error) = net.apply(&rules) {
                tracing::warn!(pod = %name, %error, "applying the pod's network policy rules failed");
            }
        }
    }

    pub(crate) fn pod_ip(&self, uid: &str) -> Option<Ipv4Addr> {
        self.pods
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(uid)
            .and_then(|pod| pod.ip)
    }
}

/// A running kubelet. Dropping it (or [`Kubelet::stop`]) ends its loops and kills every pod
/// process; the Node and its Lease stay, as a stopped kubelet's do.
#[derive(Debug)]
pub struct Kubelet {
    ctx: Arc<Context>,
    spec: NodeSpec,
    heartbeat: Duration,
    node_status_every: Duration,
    events_rx: Mutex<Option<mpsc::UnboundedReceiver<Value>>>,
    /// The kubelet API's listener, until [`Kubelet::start`] serves it.
    api: Mutex<Option<server::Bound>>,
    api_addr: Option<SocketAddr>,
    tasks: Mutex<JoinSet<()>>,
}

impl Kubelet {
    /// A kubelet for `config` talking to the API through `client`; nothing runs until
    /// [`Kubelet::start`].
    pub fn new(client: kube::Client, config: KubeletConfig) -> Result<Self> {
        for dir in [&config.pods_dir, &config.volumes_dir] {
            std::fs::create_dir_all(dir).map_err(|source| Error::PodsDir {
                path: dir.clone(),
                source,
            })?;
        }
        let confined = config.isolation != Isolation::None;
        let mut protections = if confined {
            Protections::detect(&config.pods_dir).map_err(|why| Error::Unconfinable { why })?
        } else {
            Protections::none()
        };
        // Plain processes have no namespace of their own to be isolated in: they share the
        // node's network.
        let pod_network = match config.pod_network {
            PodNetwork::Isolated | PodNetwork::Bridge { .. } if !confined => PodNetwork::Loopback,
            other => other,
        };
        let bridge = match pod_network {
            PodNetwork::Bridge {
                network,
                prefix,
                api,
            } => Some(
                crate::pod_net::Bridge::create(network, prefix, api).map_err(Error::PodNetwork)?,
            ),
            PodNetwork::Loopback | PodNetwork::Local { .. } | PodNetwork::Isolated => None,
        };
        if confined {
            match (&bridge, pod_network) {
                (Some(bridge), _) => {
                    protections.internet = bridge.no_internet().map(str::to_owned);
                }
                (None, PodNetwork::Isolated) => {
                    protections.loopback_only = Some(match PodNetwork::bridge_available() {
                        Ok(()) => "no bridge was asked for".to_owned(),
                        Err(why) => format!("no bridge here: {why}"),
                    });
                }
                (None, _) => {
                    protections.network =
                        Some("this node shares its own network with pods".to_owned());
                }
            }
        }
        let missing = protections.missing();
        if config.isolation == Isolation::Strict && !missing.is_empty() {
            return Err(Error::NotStrict { missing });
        }
        let api = config.api.as_ref().map(server::bind).transpose()?;
        let api_addr = api.as_ref().and_then(server::Bound::local_addr);
        let kubelet_port = api_addr.map(|addr| addr.port()).or(config.kubelet_port);
        let (events, events_rx) = Recorder::new(&config.node_name);
        let ctx = Arc::new(Context {
            client,
            node: config.node_name.clone(),
            images: config.images,
            confined,
            protections,
            pod_pids_limit: config.pod_pids_limit,
            pod_storage: config.pod_storage_default,
            bridge,
            policies: Mutex::new(crate::netpol::Cluster::default()),
            applying_policies: Mutex::new(()),
            cgroup: {
                static KUBELETS: std::sync::atomic::AtomicU32 =
                    std::sync::atomic::AtomicU32::new(0);
                let n = KUBELETS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                format!("{}{}-{n}", crate::cgroup::GROUP_PREFIX, std::process::id())
            },
            pods_dir: config.pods_dir,
            volumes_dir: config.volumes_dir,
            fast_probe: config.fast_probe_interval,
            processes: Arc::new(ProcessTable::default()),
            exe: config.exe,
            kubernetes_service: config.kubernetes_service,
            pod_network,
            events,
            pods: Mutex::new(HashMap::new()),
        });
        Ok(Self {
            ctx,
            spec: NodeSpec {
                name: config.node_name,
                kubelet_port,
                lease_duration: config.lease_duration,
                capacity: config.capacity.clone(),
            },
            heartbeat: config.heartbeat_interval,
            node_status_every: config.node_status_interval,
            events_rx: Mutex::new(Some(events_rx)),
            api: Mutex::new(api),
            api_addr,
            tasks: Mutex::new(JoinSet::new()),
        })
    }

    /// Registers the Node, takes its Lease, and starts the heartbeat and the pod loop. Returns
    /// once the Node is registered (pods may still be on their way).
    pub async fn start(&self) -> Result<()> {
        let client = self.ctx.client.clone();
        let node_uid = node::register(&client, &self.spec).await?;
        node::renew_lease(&client, &self.spec, &node_uid).await?;
        let mut tasks = self.tasks.lock().unwrap_or_else(PoisonError::into_inner);
        tasks.spawn(node::heartbeat(
            client.clone(),
            self.spec.clone(),
            node_uid,
            self.heartbeat,
            self.node_status_every,
        ));
        if let Some(events_rx) = self
            .events_rx
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            tasks.spawn(events::post(client, events_rx));
        }
        if let Some(api) = self
            .api
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            tasks.spawn(server::serve(api, self.ctx.clone()));
        }
        tasks.spawn(Pods::new(self.ctx.clone()).run());
        if let Some(bridge) = &self.ctx.bridge {
            if let Some(forward) = bridge.api_forward() {
                tasks.spawn(forward);
            }
            tasks.spawn(crate::policies::watch(self.ctx.clone()));
        }
        Ok(())
    }

    /// The Node's name.
    pub fn node_name(&self) -> &str {
        &self.ctx.node
    }

    /// Whether pods are confined (`Confined`) or plain processes (`None`).
    pub fn isolation(&self) -> Isolation {
        if self.ctx.confined {
            Isolation::Confined
        } else {
            Isolation::None
        }
    }

    /// What pods are confined by on this machine (and what they lack).
    pub fn protections(&self) -> &Protections {
        &self.ctx.protections
    }

    /// The pod process groups alive right now.
    pub fn live_process_groups(&self) -> usize {
        self.ctx.processes.len()
    }

    /// The log of `container` of pod `namespace/name` with `uid` (`pods/log`).
    pub async fn logs(
        &self,
        pod: &PodKey,
        container: &str,
        options: &LogOptions,
    ) -> Result<LogStream> {
        read_logs(&self.ctx, pod, container, options).await
    }

    /// Where the kubelet API listens, when it serves one ([`KubeletConfig::api`]).
    pub fn api_addr(&self) -> Option<SocketAddr> {
        self.api_addr
    }

    /// A connection to `port` of the pod (`pods/portforward`): to its IP, as the kubelet's
    /// port-forward connects.
    pub async fn port_forward(&self, pod: &PodKey, port: u16) -> Result<TcpStream> {
        let ip = self.ctx.pod_ip(&pod.uid).ok_or_else(|| Error::NoPodIp {
            pod: format!("{}/{}", pod.namespace, pod.name),
            node: self.ctx.node.clone(),
        })?;
        let ip = IpAddr::V4(ip);
        let stream =
            crate::portforward::connect(self.ctx.pod_sockets().as_ref(), SocketAddr::new(ip, port))
                .await
                .map_err(|source| Error::PortForward { port, ip, source })?;
        let _ = stream.set_nodelay(true);
        Ok(stream)
    }

    /// Where sockets for connections to pod IPs come from, when pods are in a network the
    /// caller's process is not in (pods with loopback only; bridge networking without root);
    /// `None`: connect as usual. An in-process router dials pods with these.
    pub fn pod_sockets(&self) -> Option<PodSockets> {
        self.ctx.pod_sockets()
    }

    /// Ends the loops and kills every pod process at once, without waiting for the loops to
    /// wind down (what dropping the kubelet does; for owners that cannot await).
    pub fn abort(&self) {
        self.tasks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .abort_all();
        self.ctx.processes.kill_all();
    }

    /// Ends the loops and kills every pod process (the pods' statuses are left as they were).
    pub async fn stop(&self) {
        let mut tasks =
            std::mem::take(&mut *self.tasks.lock().unwrap_or_else(PoisonError::into_inner));
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
        self.ctx.processes.kill_all();
        if self.ctx.confined
            && let Some(hierarchy) = crate::cgroup::Hierarchy::detect()
        {
            hierarchy.remove_kubelet(&self.ctx.cgroup);
        }
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.abort();
    }
}

/// The log of `container` of `pod`, for [`Kubelet::logs`] and the kubelet API.
pub(crate) async fn read_logs(
    ctx: &Arc<Context>,
    pod: &PodKey,
    container: &str,
    options: &LogOptions,
) -> Result<LogStream> {
    let paths = logs::pod_paths(&ctx.pods_dir, &pod.namespace, &pod.name, &pod.uid);
    let ctx = ctx.clone();
    let (uid, name) = (pod.uid.clone(), container.to_owned());
    let running = move || {
        ctx.pods
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&uid)
            .is_some_and(|pod| pod.running.contains(&name))
    };
    logs::read(&paths, &pod.name, container, options, running).await
}

/// Which pod: namespace, name and uid (a recreated pod of the same name is another pod).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodKey {
    /// The namespace.
    pub namespace: String,
    /// The name.
    pub name: String,
    /// The uid.
    pub uid: String,
}

/// Commands from the pod loop to a pod worker.
#[derive(Debug)]
pub(crate) enum PodCommand {
    /// The pod as the API has it now (for conditions others set, such as readiness gates).
    Observed(Arc<Value>),
    /// The pod is being deleted: stop within the grace period, then confirm.
    Terminate(Duration),
    /// The pod is gone: kill now.
    Kill,
}

/// Confirms a pod's deletion once its processes are gone: a delete with grace period zero and
/// the pod's uid as precondition (a recreated pod of the same name is left alone). Retried a few
/// times, since a pod left unconfirmed stays Terminating.
pub(crate) async fn confirm_deletion(client: &kube::Client, pod: &PodKey) {
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace);
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(pod.uid.clone()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    let mut pause = Duration::from_millis(50);
    for _ in 0..5 {
        match api.delete(&pod.name, &params).await {
            Ok(_) => return,
            // Gone already, or replaced by a pod of the same name: nothing of ours to confirm.
            Err(kube::Error::Api(status)) if status.is_not_found() || status.is_conflict() => {
                return;
            }
            Err(error) => {
                tracing::warn!(pod = %format!("{}/{}", pod.namespace, pod.name), error = %error_chain(&error), "confirming a pod's deletion failed");
            }
        }
        tokio::time::sleep(pause).await;
        pause *= 2;
    }
}

fn grace_left(pod: &Pod) -> Duration {
    let now = k8s_openapi::jiff::Timestamp::now();
    pod.metadata
        .deletion_timestamp
        .as_ref()
        .map(|deadline| deadline.0.duration_since(now))
        .and_then(|left| Duration::try_from(left).ok())
        .unwrap_or(Duration::ZERO)
}

fn key_of(pod: &Pod) -> PodKey {
    PodKey {
        namespace: pod.namespace().unwrap_or_default(),
        name: pod.name_any(),
        uid: pod.uid().unwrap_or_default(),
    }
}

struct Worker {
    commands: mpsc::UnboundedSender<PodCommand>,
    terminating: bool,
}

/// The pod loop: one worker per pod bound to the node.
struct Pods {
    ctx: Arc<Context>,
    workers: HashMap<String, Worker>,
    tasks: JoinSet<()>,
    /// The uids listed so far while the watch (re)lists.
    listing: Option<HashSet<String>>,
}

impl Pods {
    fn new(ctx: Arc<Context>) -> Self {
        Self {
            ctx,
            workers: HashMap::new(),
            tasks: JoinSet::new(),
            listing: None,
        }
    }

    fn on_pod(&mut self, pod: &Pod) {
        let key = key_of(pod);
        if let Some(listing) = self.listing.as_mut() {
            listing.insert(key.uid.clone());
        }
        let deleting = pod.metadata.deletion_timestamp.is_some();
        let value = match serde_json::to_value(pod) {
            Ok(value) => Arc::new(value),
            Err(error) => {
                tracing::warn!(pod = %format!("{}/{}", key.namespace, key.name), %error, "cannot read a pod");
                return;
            }
        };
        let Some(worker) = self.workers.get_mut(&key.uid) else {
            if deleting {
                // Never started here: nothing to stop, confirm at once.
                let client = self.ctx.client.clone();
                self.tasks
                    .spawn(async move { confirm_deletion(&client, &key).await });
                return;
            }
            let (commands, receiver) = mpsc::unbounded_channel();
            self.tasks.spawn(crate::pod::run(
                self.ctx.clone(),
                key.clone(),
                value,
                receiver,
            ));
            self.workers.insert(
                key.uid,
                Worker {
                    commands,
                    terminating: false,
                },
            );
            return;
        };
        if deleting && !worker.terminating {
            worker.terminating = true;
            let _ = worker.commands.send(PodCommand::Terminate(grace_left(pod)));
        } else if !deleting {
            let _ = worker.commands.send(PodCommand::Observed(value));
        }
    }

    fn on_removed(&mut self, pod: &Pod) {
        if let Some(worker) = self.workers.remove(&pod.uid().unwrap_or_default()) {
            let _ = worker.commands.send(PodCommand::Kill);
        }
    }

    /// After a (re)list: pods no longer listed were deleted while the watch was down.
    fn listed(&mut self) {
        let Some(live) = self.listing.take() else {
            return;
        };
        let gone: Vec<String> = self
            .workers
            .keys()
            .filter(|uid| !live.contains(*uid))
            .cloned()
            .collect();
        for uid in gone {
            if let Some(worker) = self.workers.remove(&uid) {
                let _ = worker.commands.send(PodCommand::Kill);
            }
        }
    }

    /// Runs until the task is aborted; the workers are aborted (and their processes killed)
    /// with it.
    async fn run(mut self) {
        let api: Api<Pod> = Api::all(self.ctx.client.clone());
        let config = watcher::Config::default().fields(&format!("spec.nodeName={}", self.ctx.node));
        let stream = watcher(api, config).default_backoff();
        let mut stream = std::pin::pin!(stream);
        loop {
            tokio::select! {
                event = stream.next() => match event {
                    Some(Ok(watcher::Event::Init)) => self.listing = Some(HashSet::new()),
                    Some(Ok(watcher::Event::InitApply(pod) | watcher::Event::Apply(pod))) => {
                        self.on_pod(&pod);
                    }
                    Some(Ok(watcher::Event::InitDone)) => self.listed(),
                    Some(Ok(watcher::Event::Delete(pod))) => self.on_removed(&pod),
                    Some(Err(error)) => {
                        tracing::debug!(error = %error_chain(&error), "the kubelet's pod watch failed; retrying");
                    }
                    None => return,
                },
                Some(_) = self.tasks.join_next(), if !self.tasks.is_empty() => {}
            }
        }
    }
}
