//! One pod's worker: reads what the pod references (ConfigMaps, Secrets) through the API,
//! starts its init containers in order and then its containers, runs their readiness probes,
//! restarts them per `restartPolicy`, patches `pods/status` when what it knows changes (one
//! writer per pod, the latest status wins), and on deletion stops every process within the grace
//! period before confirming.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, ServiceAccount};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::cgroup::Limits;
use crate::confine::{DEFAULT_RUN_AS, HostId};
use crate::events::EventNote;
use crate::images::{ImageEntry, Program, Templates, expand_vars, find_program, narrow_wildcards};
use crate::kubelet::{Context, PodCommand, PodKey, confirm_deletion};
use crate::logs::{PodPaths, log_file, pod_paths};
use crate::net;
use crate::netpol;
use crate::node::error_chain;
use crate::pod_status::{self, ContainerInfo, PodInfo, State, Terminated};
use crate::probe::{self, Probe};
use crate::process::{self, Identity, LaunchSpec, Mount, POD_DIR_IN_SANDBOX, Split};
use crate::sandbox::{PodPlan, PodSandbox};
use crate::volumes::{self, Refs, Tokens};

/// Restart back-off: doubles from this, capped at [`MAX_BACKOFF`].
const BASE_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// The `PATH` of a confined container, as images set it.
const IMAGE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// How soon a mount that failed is tried again.
const MOUNT_RETRY: Duration = Duration::from_secs(1);

/// Messages from container tasks.
#[derive(Debug)]
struct Exit {
    init: bool,
    index: usize,
    code: Option<i32>,
    signal: Option<i32>,
    /// The kernel killed a process of the container for exceeding its memory limit.
    oom: bool,
}

/// Control of a running container's task.
#[derive(Debug)]
struct Handle {
    control: mpsc::UnboundedSender<bool>,
    pid: i32,
    started_at: String,
}

#[derive(Debug)]
struct ProbeState {
    probe: Probe,
    next: Instant,
    successes: u32,
    failures: u32,
    ever: bool,
}

/// What to run for one container.
#[derive(Debug)]
struct Plan {
    spec: LaunchSpec,
    entry: ImageEntry,
}

struct Worker {
    ctx: Arc<Context>,
    pod: Arc<Value>,
    key: PodKey,
    namespace: String,
    name: String,
    /// The status as last sent to the writer (with the conditions others set, as last seen).
    status: Value,
    status_tx: watch::Sender<Option<Value>>,
    status_writer: Option<tokio::task::JoinHandle<()>>,
    paths: PodPaths,
    ip: Option<Ipv4Addr>,
    /// The host uid and gid of the pod's processes and files, when the kubelet gives each pod
    /// one (confined pods, as root).
    host_id: Option<HostId>,
    /// The pod's sandbox (confined pods), once made.
    sandbox: Option<Arc<PodSandbox>>,
    info: PodInfo,
    init_specs: Vec<Value>,
    specs: Vec<Value>,
    init_handles: Vec<Option<Handle>>,
    handles: Vec<Option<Handle>>,
    probes: Vec<Option<ProbeState>>,
    liveness: Vec<Option<ProbeState>>,
    /// When a container that failed its liveness probe (and was sent SIGTERM) gets SIGKILL.
    kill_at: Vec<Option<Instant>>,
    restart_at: Vec<Option<Instant>>,
    init_restart_at: Option<(usize, Instant)>,
    exits_tx: mpsc::UnboundedSender<Exit>,
    /// The container tasks; dropping the worker aborts them, which kills their processes.
    tasks: tokio::task::JoinSet<()>,
    restart_policy: String,
    env_cache: Vec<BTreeMap<String, String>>,
}

/// A pod's labels.
fn labels_of(pod: &Value) -> BTreeMap<String, String> {
    pod.pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|labels| {
            labels
                .iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

fn now() -> String {
    agent_sandbox_api::time::format(k8s_openapi::jiff::Timestamp::now())
}

/// The status patch of pod `uid`: with the uid, so that it cannot land on a pod recreated under
/// the same name (the API server refuses a uid change), as a real kubelet's status manager does.
fn status_patch(uid: &str, status: &Value) -> Value {
    json!({"metadata": {"uid": uid}, "status": status})
}

/// Writes the latest status of pod `key` until the worker drops its sender, then the last one.
/// A status that cannot be written is retried a few times unless a newer one replaces it; a pod
/// that is gone ends the writer.
async fn write_statuses(
    client: kube::Client,
    key: PodKey,
    mut status_rx: watch::Receiver<Option<Value>>,
) {
    let api: Api<Pod> = Api::namespaced(client, &key.namespace);
    let params = PatchParams::default();
    while status_rx.changed().await.is_ok() {
        let Some(status) = status_rx.borrow_and_update().clone() else {
            continue;
        };
        let patch = Patch::Merge(status_patch(&key.uid, &status));
        let mut pause = Duration::from_millis(20);
        for _ in 0..5 {
            match api.patch_status(&key.name, &params, &patch).await {
                Ok(_) => break,
                Err(kube::Error::Api(status)) if status.is_not_found() || status.code == 422 => {
                    return;
                }
                Err(error) => {
                    tracing::debug!(pod = %format!("{}/{}", key.namespace, key.name), error = %error_chain(&error), "patching a pod's status failed");
                }
            }
            if status_rx.has_changed().unwrap_or(false) {
                break;
            }
            tokio::time::sleep(pause).await;
            pause *= 2;
        }
    }
}

/// The data of a ConfigMap or Secret as strings.
fn object_data(resource: &'static str, object: Value) -> BTreeMap<String, String> {
    if resource == "secrets" {
        let secret: Option<Secret> = serde_json::from_value(object).ok();
        return secret
            .and_then(|s| s.data)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|(key, bytes)| String::from_utf8(bytes.0).ok().map(|v| (key, v)))
            .collect();
    }
    let map: Option<ConfigMap> = serde_json::from_value(object).ok();
    map.and_then(|m| m.data).unwrap_or_default()
}

/// One value of a referenced ConfigMap or Secret.
fn lookup_key(refs: &Refs, resource: &'static str, name: &str, key: &str) -> Option<String> {
    refs.get(&(resource, name.to_owned()))?.get(key).cloned()
}

fn backoff(restarts: u32) -> Duration {
    let factor = 2u32.saturating_pow(restarts.min(8));
    (BASE_BACKOFF * factor).min(MAX_BACKOFF)
}

/// Runs a pod until it is deleted.
pub(crate) async fn run(
    ctx: Arc<Context>,
    key: PodKey,
    pod: Arc<Value>,
    mut commands: mpsc::UnboundedReceiver<PodCommand>,
) {
    let (exits_tx, mut exits) = mpsc::unbounded_channel();
    let mut worker = Worker::new(ctx, key, pod, exits_tx);
    let started = worker.start().await;
    loop {
        let wake = if started { worker.next_wake() } else { None };
        tokio::select! {
            command = commands.recv() => match command {
                Some(PodCommand::Observed(pod)) => worker.observe(&pod),
                Some(PodCommand::Terminate(grace)) => {
                    worker.terminate(grace, &mut exits).await;
                    // The final status first: a confirmed pod may be gone at once.
                    worker.flush_status().await;
                    confirm_deletion(&worker.ctx.client, &worker.key).await;
                    break;
                }
                Some(PodCommand::Kill) | None => {
                    worker.kill_all();
                    break;
                }
            },
            Some(exit) = exits.recv() => worker.on_exit(exit).await,
            () = sleep_until(wake) => worker.tick().await,
        }
    }
    worker.release();
}

async fn sleep_until(when: Option<Instant>) {
    match when {
        Some(when) => tokio::time::sleep_until(when).await,
        None => std::future::pending().await,
    }
}

impl Worker {
    fn new(
        ctx: Arc<Context>,
        key: PodKey,
        pod: Arc<Value>,
        exits_tx: mpsc::UnboundedSender<Exit>,
    ) -> Self {
        let namespace = key.namespace.clone();
        let name = key.name.clone();
        let paths = pod_paths(&ctx.pods_dir, &namespace, &name, &key.uid);
        let (status_tx, status_rx) = watch::channel(None);
        let status_writer = Some(tokio::spawn(write_statuses(
            ctx.client.clone(),
            key.clone(),
            status_rx,
        )));
        let status = pod.get("status").cloned().unwrap_or(json!({}));
        let list = |field: &str| -> Vec<Value> {
            pod.pointer(&format!("/spec/{field}"))
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        };
        let init_specs = list("initContainers");
        let specs = list("containers");
        let image = |c: &Value| {
            c.get("image")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let cname = |c: &Value| {
            c.get("name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let info = PodInfo {
            init: init_specs
                .iter()
                .map(|c| ContainerInfo::waiting(&cname(c), &image(c), "PodInitializing", None))
                .collect(),
            containers: specs
                .iter()
                .map(|c| ContainerInfo::waiting(&cname(c), &image(c), "ContainerCreating", None))
                .collect(),
            initialized: init_specs.is_empty(),
            ..PodInfo::default()
        };
        let host_id = (ctx.confined && ctx.protections.host_ids).then(HostId::allocate);
        let restart_policy = pod
            .pointer("/spec/restartPolicy")
            .and_then(Value::as_str)
            .unwrap_or("Always")
            .to_owned();
        Self {
            key,
            status,
            status_tx,
            status_writer,
            init_handles: init_specs.iter().map(|_| None).collect(),
            handles: specs.iter().map(|_| None).collect(),
            probes: specs.iter().map(|_| None).collect(),
            liveness: specs.iter().map(|_| None).collect(),
            kill_at: specs.iter().map(|_| None).collect(),
            restart_at: specs.iter().map(|_| None).collect(),
            env_cache: Vec::new(),
            init_restart_at: None,
            tasks: tokio::task::JoinSet::new(),
            ctx,
            pod,
            namespace,
            name,
            host_id,
            sandbox: None,
            paths,
            ip: None,
            info,
            init_specs,
            specs,
            exits_tx,
            restart_policy,
        }
    }

    fn event(&self, type_: &str, reason: &str, message: &str) {
        self.ctx.events.pod(
            &self.pod,
            EventNote {
                type_,
                reason,
                message,
            },
        );
    }

    /// Sends the pod's status to the writer if it changed.
    fn write_status(&mut self) {
        let next = pod_status::pod_status(&self.info, &self.status, &now());
        if next == self.status {
            return;
        }
        self.status = next.clone();
        self.status_tx.send_replace(Some(next));
    }

    /// Waits until the last status sent is written (or given up).
    async fn flush_status(&mut self) {
        let (closed_tx, _) = watch::channel(None);
        drop(std::mem::replace(&mut self.status_tx, closed_tx));
        if let Some(writer) = self.status_writer.take() {
            let _ = writer.await;
        }
    }

    /// Takes in the conditions others set (readiness gates, say) from the pod as the API has
    /// it, so that the next status keeps them; ours stay as we last wrote them.
    fn observe(&mut self, pod: &Value) {
        // Labels change (a warm pool member adopted by a claim gets its claim's): policies
        // select by them, so the pods' rules follow.
        let labels = labels_of(pod);
        let mut changed = false;
        self.ctx.update_pod(&self.key, |runtime| {
            if runtime.peer.labels != labels {
                runtime.peer.labels = labels;
                changed = true;
            }
        });
        if changed && self.ctx.bridge.is_some() {
            let ctx = self.ctx.clone();
            tokio::task::spawn_blocking(move || ctx.apply_policies());
        }
        let ours = pod_status::OWN_CONDITIONS;
        let is_ours =
            |c: &Value| ours.contains(&c.get("type").and_then(Value::as_str).unwrap_or_default());
        let theirs: Vec<Value> = pod
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|c| !is_ours(c))
            .cloned()
            .collect();
        let mut conditions: Vec<Value> = self
            .status
            .get("conditions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|c| is_ours(c))
            .cloned()
            .collect();
        conditions.extend(theirs);
        if let Some(status) = self.status.as_object_mut() {
            status.insert("conditions".into(), Value::Array(conditions));
        }
    }

    fn all_containers(&self) -> Vec<(bool, usize, Value)> {
        self.init_specs
            .iter()
            .enumerate()
            .map(|(i, c)| (true, i, c.clone()))
            .chain(
                self.specs
                    .iter()
                    .enumerate()
                    .map(|(i, c)| (false, i, c.clone())),
            )
            .collect()
    }

    fn set_waiting(&mut self, init: bool, index: usize, reason: &str, message: String) {
        let list = if init {
            &mut self.info.init
        } else {
            &mut self.info.containers
        };
        if let Some(container) = list.get_mut(index) {
            container.state = State::Waiting {
                reason: reason.to_owned(),
                message: Some(message),
            };
        }
    }

    /// Prepares the pod (images, IP, directories) and starts the first containers. Returns
    /// false when the pod cannot start (it then waits for deletion).
    async fn start(&mut self) -> bool {
        // Before anything is made: a name that would become a host path outside the kubelet's
        // directories fails the pod.
        if let Err(message) = volumes::validate_names(&self.pod) {
            self.event("Warning", "FailedCreatePodSandBox", &message);
            self.info.terminal = Some("Failed".into());
            self.info.message = Some(message);
            self.write_status();
            return false;
        }
        let mut ports: Vec<u16> = Vec::new();
        let mut missing = false;
        for (init, index, container) in self.all_containers() {
            let image = container
                .get("image")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            match self.ctx.images.lookup(&image) {
                Some(entry) => ports.extend(&entry.ports),
                None => {
                    missing = true;
                    let message = format!(
                        "Failed to pull image \"{image}\": the simulated cluster's image table has no entry for this image"
                    );
                    self.set_waiting(init, index, "ErrImagePull", message.clone());
                    self.event("Warning", "Failed", &message);
                }
            }
            ports.extend(
                container
                    .get("ports")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|p| p.get("containerPort").and_then(Value::as_u64))
                    .filter_map(|p| u16::try_from(p).ok()),
            );
        }
        if missing {
            self.write_status();
            return false;
        }
        ports.sort_unstable();
        ports.dedup();
        let Some(ip) = net::allocate(self.ctx.pod_network, &ports) else {
            self.event(
                "Warning",
                "FailedCreatePodSandBox",
                &format!(
                    "no free address for the pod IP in {:?} (where the pod's ports are free \
                     and the network namespace routes it locally)",
                    self.ctx.pod_network
                ),
            );
            self.write_status();
            return false;
        };
        self.ip = Some(ip.0);
        if let Err(error) = self.make_dirs() {
            self.event("Warning", "FailedCreatePodSandBox", &error);
            self.write_status();
            return false;
        }
        let peer = self.peer();
        self.ctx.update_pod(&self.key, |pod| {
            pod.ip = Some(ip.0);
            pod.peer = peer;
        });
        if let Err(error) = self.make_network(ip.0).await {
            self.event("Warning", "FailedCreatePodSandBox", &error);
            self.write_status();
            return false;
        }
        if let Err(error) = self.make_sandbox().await {
            self.event("Warning", "FailedCreatePodSandBox", &error);
            self.write_status();
            return false;
        }
        self.info.pod_ip = Some(ip.0.to_string());
        self.info.start_time = Some(now());
        self.ctx.update_pod(&self.key, |pod| pod.ip = Some(ip.0));
        if self.init_specs.is_empty() {
            self.start_main().await;
        } else {
            self.start_container(true, 0).await;
        }
        self.write_status();
        true
    }

    async fn start_main(&mut self) {
        self.info.initialized = true;
        for index in 0..self.specs.len() {
            self.start_container(false, index).await;
        }
    }

    /// The pod as NetworkPolicies see it: namespace, labels and named container ports.
    fn peer(&self) -> netpol::PodPeer {
        let labels = labels_of(&self.pod);
        let mut ports = BTreeMap::new();
        for port in self
            .specs
            .iter()
            .filter_map(|c| c.get("ports").and_then(Value::as_array))
            .flatten()
        {
            if let (Some(name), Some(number)) = (
                port.get("name").and_then(Value::as_str),
                port.get("containerPort")
                    .and_then(Value::as_u64)
                    .and_then(|p| u16::try_from(p).ok()),
            ) {
                let protocol = port
                    .get("protocol")
                    .and_then(Value::as_str)
                    .unwrap_or("TCP")
                    .to_owned();
                ports.insert(name.to_owned(), (number, protocol));
            }
        }
        netpol::PodPeer {
            namespace: self.namespace.clone(),
            labels,
            ip: self.ip,
            ports,
        }
    }

    /// Gives the pod its network namespace (confined pods): loopback only, or on the bridge
    /// with its rules in place before anything runs there (and the other pods' rules updated
    /// for its address).
    async fn make_network(&self, ip: Ipv4Addr) -> Result<(), String> {
        if !self.ctx.confined {
            return Ok(());
        }
        if self.ctx.pod_network == crate::kubelet::PodNetwork::Isolated {
            let ctx = self.ctx.clone();
            let uid = self.key.uid.clone();
            return tokio::task::spawn_blocking(move || {
                let node = if crate::confine::is_root() {
                    None
                } else {
                    Some(crate::node_ns::NodeNamespace::shared()?)
                };
                let net = crate::pod_net::PodNet::isolated(node)?;
                ctx.set_pod_net(&uid, Arc::new(net));
                Ok(())
            })
            .await
            .map_err(|error| format!("making the pod's network: {error}"))?;
        }
        if self.ctx.bridge.is_none() {
            return Ok(());
        }
        let ctx = self.ctx.clone();
        let peer = self.peer();
        let uid = self.key.uid.clone();
        tokio::task::spawn_blocking(move || {
            let (Some(bridge), Some(node)) = (&ctx.bridge, ctx.node_rules()) else {
                return Ok(());
            };
            let rules = netpol::ruleset(&peer, &ctx.policy_cluster(), node);
            let net = crate::pod_net::PodNet::create(bridge, ip, &rules)?;
            ctx.set_pod_net(&uid, Arc::new(net));
            ctx.apply_policies();
            Ok(())
        })
        .await
        .map_err(|error| format!("making the pod's network: {error}"))?
    }

    /// Makes the pod's directories on the host: its own (traversable, so that a root
    /// kubelet's pod uid reaches its storage's mount point), the storage's mount point (confined
    /// pods), its logs and, for plain processes, the directory they run in.
    fn make_dirs(&self) -> Result<(), String> {
        use std::os::unix::fs::PermissionsExt as _;
        let mut dirs = vec![self.paths.root.clone(), self.paths.logs.clone()];
        dirs.push(if self.ctx.confined {
            self.paths.storage.clone()
        } else {
            self.paths.app.clone()
        });
        for dir in dirs {
            std::fs::create_dir_all(&dir)
                .map_err(|error| format!("cannot create {}: {error}", dir.display()))?;
        }
        if self.ctx.confined {
            for dir in [&self.paths.root, &self.paths.storage] {
                std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711)).map_err(
                    |error| format!("cannot set the mode of {}: {error}", dir.display()),
                )?;
            }
        }
        Ok(())
    }

    /// The host group every pod of the namespace has (a root kubelet's), which owns the
    /// namespace's claim directories: derived from the namespace's name, so it is the same on
    /// every start.
    fn namespace_group(&self) -> Option<u32> {
        self.host_id
            .as_ref()
            .map(|_| crate::confine::namespace_group(&self.namespace))
    }

    /// Starts the pod's sandbox (confined pods): its user, mount, IPC and UTS namespaces and
    /// its storage, the size of its ephemeral-storage limit.
    async fn make_sandbox(&mut self) -> Result<(), String> {
        if !self.ctx.confined {
            return Ok(());
        }
        let identity = self.pod_identity();
        let names = |specs: &[Value]| -> Vec<String> {
            specs
                .iter()
                .filter_map(|c| c.get("name").and_then(Value::as_str).map(str::to_owned))
                .collect()
        };
        let mut containers = names(&self.init_specs);
        containers.extend(names(&self.specs));
        let empty_dirs: Vec<String> = self
            .pod
            .pointer("/spec/volumes")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|v| v.get("emptyDir").is_some())
            .filter_map(|v| v.get("name").and_then(Value::as_str).map(str::to_owned))
            .collect();
        let plan = PodPlan {
            uid: identity.uid,
            gid: identity.gid,
            hostname: self.hostname(),
            storage: self.paths.storage.clone(),
            storage_size: self.storage_size()?,
            dirs: crate::sandbox::storage_dirs(&containers, &empty_dirs),
            host_id: self.host_id.as_ref().map(|id| id.0),
            groups: self.namespace_group().into_iter().collect(),
        };
        let net = self.ctx.pod_net(&self.key.uid);
        let table = self.ctx.processes.clone();
        let sandbox = tokio::task::spawn_blocking(move || PodSandbox::start(&plan, net, &table))
            .await
            .map_err(|error| format!("starting the pod's sandbox: {error}"))?
            .map_err(|error| format!("cannot start the pod's sandbox: {error}"))?;
        self.sandbox = Some(Arc::new(sandbox));
        Ok(())
    }

    /// The size of the pod's storage: the sum of its containers' `limits.ephemeral-storage`
    /// when every container sets one, else the node's default for pods.
    fn storage_size(&self) -> Result<u64, String> {
        let mut total: u64 = 0;
        for container in &self.specs {
            match Limits::from_container(container, self.ctx.pod_pids_limit)?.ephemeral_storage {
                Some(bytes) => total = total.saturating_add(bytes),
                None => return Ok(self.ctx.pod_storage),
            }
        }
        Ok(if total == 0 {
            self.ctx.pod_storage
        } else {
            total
        })
    }

    /// The pod's hostname: `spec.hostname` when set, else its name.
    fn hostname(&self) -> String {
        self.pod
            .pointer("/spec/hostname")
            .and_then(Value::as_str)
            .unwrap_or(&self.name)
            .to_owned()
    }

    /// Who the pod's processes are in its user namespace: `runAsUser`/`runAsGroup` of the pod,
    /// else of its first container, else [`DEFAULT_RUN_AS`].
    fn pod_identity(&self) -> Identity {
        let first = self.init_specs.first().or(self.specs.first());
        let id = |field: &str| {
            self.pod
                .pointer(&format!("/spec/securityContext/{field}"))
                .or_else(|| first.and_then(|c| c.pointer(&format!("/securityContext/{field}"))))
                .and_then(Value::as_u64)
                .and_then(|id| u32::try_from(id).ok())
        };
        let uid = id("runAsUser").unwrap_or(DEFAULT_RUN_AS);
        Identity {
            uid,
            gid: id("runAsGroup").unwrap_or(uid),
        }
    }

    /// Who `container`'s processes are: `runAsUser`/`runAsGroup` of the container, else of the
    /// pod, else [`DEFAULT_RUN_AS`] (the group defaults to the user's number).
    fn identity(&self, container: &Value) -> Identity {
        let id = |field: &str| {
            container
                .pointer(&format!("/securityContext/{field}"))
                .or_else(|| self.pod.pointer(&format!("/spec/securityContext/{field}")))
                .and_then(Value::as_u64)
                .and_then(|id| u32::try_from(id).ok())
        };
        let uid = id("runAsUser").unwrap_or(DEFAULT_RUN_AS);
        Identity {
            uid,
            gid: id("runAsGroup").unwrap_or(uid),
        }
    }

    fn templates(&self) -> Templates {
        Templates {
            pod_ip: self.ip.map(|ip| ip.to_string()).unwrap_or_default(),
            pod_name: self.name.clone(),
            namespace: self.namespace.clone(),
            pod_uid: self.key.uid.clone(),
            pod_dir: if self.ctx.confined {
                POD_DIR_IN_SANDBOX.to_owned()
            } else {
                self.paths.app.to_string_lossy().into_owned()
            },
        }
    }

    /// Reads the ConfigMaps and Secrets `container` references (its environment, and when
    /// confined the volumes it mounts) through the API, and requests the ServiceAccount
    /// tokens its projected volumes need (bound to this pod, as a node's kubelet requests
    /// them).
    async fn fetch_refs(&self, container: &Value) -> (Refs, Result<Tokens, String>) {
        let mut wanted: Vec<(&'static str, String)> = Vec::new();
        let mut want = |resource: &'static str, name: Option<&str>| {
            if let Some(name) = name.filter(|n| !n.is_empty())
                && !wanted.iter().any(|(r, n)| *r == resource && n == name)
            {
                wanted.push((resource, name.to_owned()));
            }
        };
        let list = |field: &str| {
            container
                .get(field)
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        };
        for source in list("envFrom") {
            want(
                "configmaps",
                source.pointer("/configMapRef/name").and_then(Value::as_str),
            );
            want(
                "secrets",
                source.pointer("/secretRef/name").and_then(Value::as_str),
            );
        }
        for var in list("env") {
            want(
                "configmaps",
                var.pointer("/valueFrom/configMapKeyRef/name")
                    .and_then(Value::as_str),
            );
            want(
                "secrets",
                var.pointer("/valueFrom/secretKeyRef/name")
                    .and_then(Value::as_str),
            );
        }
        let mut tokens = Vec::new();
        if self.ctx.confined {
            let (objects, needed) = volumes::needs(&volumes::mounted(&self.pod, container));
            for (resource, name) in objects {
                want(resource, Some(&name));
            }
            tokens = needed;
        }
        let mut refs = Refs::new();
        for (resource, name) in wanted {
            let fetched = if resource == "secrets" {
                let api: Api<Secret> = Api::namespaced(self.ctx.client.clone(), &self.namespace);
                api.get_opt(&name)
                    .await
                    .map(|o| o.and_then(|o| serde_json::to_value(o).ok()))
            } else {
                let api: Api<ConfigMap> = Api::namespaced(self.ctx.client.clone(), &self.namespace);
                api.get_opt(&name)
                    .await
                    .map(|o| o.and_then(|o| serde_json::to_value(o).ok()))
            };
            match fetched {
                Ok(Some(object)) => {
                    refs.insert((resource, name), object_data(resource, object));
                }
                Ok(None) => {}
                Err(error) => tracing::warn!(
                    pod = %format!("{}/{}", self.namespace, self.name), %resource, %name,
                    error = %error_chain(&error), "reading what a container references failed"
                ),
            }
        }
        let tokens = self.request_tokens(tokens).await;
        (refs, tokens)
    }

    async fn request_tokens(&self, needs: Vec<volumes::TokenNeed>) -> Result<Tokens, String> {
        let mut tokens = Tokens::new();
        if needs.is_empty() {
            return Ok(tokens);
        }
        let account = self
            .pod
            .pointer("/spec/serviceAccountName")
            .and_then(Value::as_str)
            .filter(|a| !a.is_empty())
            .unwrap_or("default");
        let api: Api<ServiceAccount> = Api::namespaced(self.ctx.client.clone(), &self.namespace);
        for need in needs {
            let request = json!({
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {
                    "audiences": need.audience.iter().collect::<Vec<_>>(),
                    "expirationSeconds": need.expiration_seconds,
                    "boundObjectRef": {"apiVersion": "v1", "kind": "Pod",
                                       "name": self.name, "uid": self.key.uid},
                },
            });
            let answer: TokenRequest = api
                .create_subresource("token", account, &PostParams::default(), &request)
                .await
                .map_err(|error| {
                    format!(
                        "requesting a token for ServiceAccount {account:?}: {}",
                        error_chain(&error)
                    )
                })?;
            let token = answer.status.and_then(|s| s.token).unwrap_or_default();
            tokens.insert(need.key, token);
        }
        Ok(tokens)
    }

    fn field_ref(&self, path: &str) -> Option<String> {
        let pod = &self.pod;
        let text = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_owned);
        if let Some(rest) = path
            .strip_prefix("metadata.labels['")
            .and_then(|r| r.strip_suffix("']"))
        {
            return pod
                .pointer("/metadata/labels")
                .and_then(|labels| labels.get(rest))
                .and_then(Value::as_str)
                .map(str::to_owned);
        }
        if let Some(rest) = path
            .strip_prefix("metadata.annotations['")
            .and_then(|r| r.strip_suffix("']"))
        {
            return pod
                .pointer("/metadata/annotations")
                .and_then(|annotations| annotations.get(rest))
                .and_then(Value::as_str)
                .map(str::to_owned);
        }
        match path {
            "metadata.name" => Some(self.name.clone()),
            "metadata.namespace" => Some(self.namespace.clone()),
            "metadata.uid" => Some(self.key.uid.clone()),
            "spec.nodeName" => Some(self.ctx.node.clone()),
            "spec.serviceAccountName" => text(pod.pointer("/spec/serviceAccountName")),
            "status.podIP" | "status.podIPs" => self.ip.map(|ip| ip.to_string()),
            "status.hostIP" | "status.hostIPs" => Some("127.0.0.1".to_owned()),
            _ => None,
        }
    }

    /// The `PATH` of a container and where its command is looked up: when confined an
    /// image's ([`IMAGE_PATH`], the system directories it shows), so that a command resolves to
    /// what the pod can see and not to a tool in someone's home directory; else the host's.
    fn search_path(&self) -> String {
        if self.ctx.confined {
            IMAGE_PATH.to_owned()
        } else {
            std::env::var("PATH").unwrap_or_else(|_| IMAGE_PATH.into())
        }
    }

    /// The process environment of a container.
    fn environment(
        &self,
        container: &Value,
        entry: &ImageEntry,
        templates: &Templates,
        refs: &Refs,
    ) -> BTreeMap<String, String> {
        let mut env = BTreeMap::new();
        env.insert("PATH".to_owned(), self.search_path());
        env.insert("HOME".to_owned(), templates.pod_dir.clone());
        env.insert("HOSTNAME".to_owned(), self.name.clone());
        // The `kubernetes` Service, as a node gives it to every container (in-cluster
        // configuration reads these), at the address this node's pods reach the API server at.
        if let Some(api) = self.ctx.kubernetes_service {
            let (host, port) = (api.ip().to_string(), api.port().to_string());
            env.insert("KUBERNETES_SERVICE_HOST".to_owned(), host.clone());
            env.insert("KUBERNETES_SERVICE_PORT".to_owned(), port.clone());
            env.insert("KUBERNETES_SERVICE_PORT_HTTPS".to_owned(), port.clone());
            env.insert("KUBERNETES_PORT".to_owned(), format!("tcp://{api}"));
            env.insert(
                format!("KUBERNETES_PORT_{port}_TCP"),
                format!("tcp://{api}"),
            );
            env.insert(
                format!("KUBERNETES_PORT_{port}_TCP_PROTO"),
                "tcp".to_owned(),
            );
            env.insert(format!("KUBERNETES_PORT_{port}_TCP_PORT"), port.clone());
            env.insert(format!("KUBERNETES_PORT_{port}_TCP_ADDR"), host);
        }
        for (name, value) in &entry.env {
            env.insert(name.clone(), templates.expand(value));
        }
        for source in container
            .get("envFrom")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let prefix = source
                .get("prefix")
                .and_then(Value::as_str)
                .unwrap_or_default();
            for (resource, field) in [("configmaps", "configMapRef"), ("secrets", "secretRef")] {
                let Some(name) = source
                    .pointer(&format!("/{field}/name"))
                    .and_then(Value::as_str)
                else {
                    continue;
                };
                let Some(data) = refs.get(&(resource, name.to_owned())) else {
                    continue;
                };
                for (key, value) in data {
                    env.insert(format!("{prefix}{key}"), value.clone());
                }
            }
        }
        for var in container
            .get("env")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let Some(name) = var.get("name").and_then(Value::as_str) else {
                continue;
            };
            let value = if let Some(value) = var.get("value").and_then(Value::as_str) {
                Some(expand_vars(value, &env))
            } else if let Some(from) = var.get("valueFrom") {
                if let Some(path) = from.pointer("/fieldRef/fieldPath").and_then(Value::as_str) {
                    self.field_ref(path)
                } else if let Some(reference) = from.get("secretKeyRef") {
                    let n = reference
                        .get("name")
                        .and_then(Value::as_str)
                        .unwrap_or_default();
                    let k = reference
                        .get("key")
                        .and_then(Value::as_str)
                        .unwrap_or_default();
                    lookup_key(refs, "secrets", n, k)
                } else if let Some(reference) = from.get("configMapKeyRef") {
                    let n = reference
                        .get("name")
                        .and_then(Value::as_str)
                        .unwrap_or_default();
                    let k = reference
                        .get("key")
                        .and_then(Value::as_str)
                        .unwrap_or_default();
                    lookup_key(refs, "configmaps", n, k)
                } else {
                    None
                }
            } else {
                Some(String::new())
            };
            if let Some(value) = value {
                env.insert(name.to_owned(), value);
            }
        }
        for value in env.values_mut() {
            *value = narrow_wildcards(value, &templates.pod_ip);
        }
        env
    }

    /// The command line of a container: its `command` replaces the image's program, its `args`
    /// replace the image's arguments.
    fn argv(
        &self,
        container: &Value,
        entry: &ImageEntry,
        env: &BTreeMap<String, String>,
        templates: &Templates,
    ) -> Result<Vec<String>, String> {
        let strings = |field: &str| -> Vec<String> {
            container
                .get(field)
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(|s| expand_vars(s, env)))
                .collect()
        };
        let command = strings("command");
        let args = strings("args");
        let path = Some(std::ffi::OsString::from(self.search_path()));
        let resolve = |name: &str, exe: Option<&std::path::Path>| {
            find_program(name, exe, path.as_deref())
                .map(|p| p.to_string_lossy().into_owned())
                .ok_or_else(|| {
                    format!("executable file {name:?} not found next to the sim or in $PATH")
                })
        };
        let entry_program = || -> Result<String, String> {
            match &entry.program {
                Program::Named(name) => resolve(name, self.ctx.exe.as_deref()),
                Program::Path(path) => Ok(path.to_string_lossy().into_owned()),
                Program::CurrentExe => std::env::current_exe()
                    .map(|p| p.to_string_lossy().into_owned())
                    .map_err(|error| format!("cannot locate the current executable: {error}")),
                Program::ContainerCommand => Err("the container has no command".to_owned()),
            }
        };
        let mut argv = if let Some((first, rest)) = command.split_first() {
            let named_like_entry = matches!(&entry.program, Program::Named(name) if name == first);
            let program = if named_like_entry {
                entry_program()?
            } else {
                resolve(first, self.ctx.exe.as_deref())?
            };
            let mut argv = vec![program];
            argv.extend(rest.iter().cloned());
            argv.extend(args);
            argv
        } else if entry.program == Program::ContainerCommand {
            let Some((first, rest)) = args.split_first() else {
                return Err("the container has no command and its image no default".to_owned());
            };
            let mut argv = vec![resolve(first, None)?];
            argv.extend(rest.iter().cloned());
            argv
        } else {
            let mut argv = vec![entry_program()?];
            if args.is_empty() {
                argv.extend(entry.args.iter().map(|a| templates.expand(a)));
            } else {
                argv.extend(args);
            }
            argv
        };
        if argv.is_empty() {
            argv.push(String::new());
        }
        for arg in argv.iter_mut().skip(1) {
            *arg = narrow_wildcards(arg, &templates.pod_ip);
        }
        Ok(argv)
    }

    /// Prepares the volumes a container mounts (confined pods: plain processes see the host):
    /// the directories of PersistentVolumeClaims (made through directory handles, owned by the
    /// namespace's group), `emptyDir`s (in the pod's storage) and the files of projection
    /// volumes ([`volumes`], owned as a node owns them when the kubelet is root). An error is a
    /// failed mount (the container waits).
    fn mounts(
        &self,
        container: &Value,
        refs: &Refs,
        tokens: &Tokens,
    ) -> Result<(Vec<Mount>, Vec<Split>), String> {
        if !self.ctx.confined {
            return Ok((Vec::new(), Vec::new()));
        }
        let volumes = self
            .pod
            .pointer("/spec/volumes")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let field = |path: &str| self.field_ref(path);
        let mut wanted = Vec::new();
        for mount in container
            .get("volumeMounts")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let (Some(name), Some(path)) = (
                mount.get("name").and_then(Value::as_str),
                mount.get("mountPath").and_then(Value::as_str),
            ) else {
                continue;
            };
            let Some(volume) = volumes
                .iter()
                .find(|v| v.get("name").and_then(Value::as_str) == Some(name))
            else {
                return Err(format!("volume {name:?} is not in the pod's volumes"));
            };
            let mut read_only = mount.get("readOnly").and_then(Value::as_bool) == Some(true);
            let host = if let Some(claim) = volume
                .pointer("/persistentVolumeClaim/claimName")
                .and_then(Value::as_str)
            {
                volumes::claim_dir(
                    &self.ctx.volumes_dir,
                    &self.namespace,
                    claim,
                    self.namespace_group(),
                )
                .map_err(|error| format!("making the directory of claim {claim:?}: {error}"))?
            } else if volume.get("emptyDir").is_some() {
                // Made by the pod's sandbox, in its storage (seen in the pod's namespaces only).
                self.paths.storage.join("volumes").join(name)
            } else if volumes::is_projection(volume) {
                let files = volumes::files(volume, refs, tokens, &field).map_err(|error| {
                    format!("MountVolume.SetUp failed for volume {name:?}: {error}")
                })?;
                let dir = self.paths.root.join("volumes").join(name);
                // A root kubelet owns the files as a node's does; one that is not root cannot.
                let ownership = self.host_id.as_ref().map(|id| {
                    volumes::ownership(&self.pod, volume, &files).on_host(
                        &self.pod,
                        self.pod_identity(),
                        id.0,
                    )
                });
                volumes::write_files(&dir, &files, ownership.as_ref()).map_err(|error| {
                    format!("writing volume {name:?} into {}: {error}", dir.display())
                })?;
                read_only = true;
                dir
            } else {
                return Err(format!(
                    "volume {name:?}: a kind this kubelet does not support (emptyDir, \
                     persistentVolumeClaim, configMap, secret, downwardAPI and projected are)"
                ));
            };
            wanted.push((host, path.to_owned(), read_only));
        }
        process::prepare_mounts(wanted)
    }

    fn plan(
        &self,
        container: &Value,
        refs: &Refs,
        (mounts, splits): (Vec<Mount>, Vec<Split>),
    ) -> Result<Plan, String> {
        let image = container
            .get("image")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let entry = self
            .ctx
            .images
            .lookup(image)
            .cloned()
            .ok_or_else(|| format!("no image table entry for {image:?}"))?;
        let templates = self.templates();
        let env = self.environment(container, &entry, &templates, refs);
        let argv = self.argv(container, &entry, &env, &templates)?;
        let name = container
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        Ok(Plan {
            spec: LaunchSpec {
                argv,
                env,
                workdir: container
                    .get("workingDir")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                // `spec.hostname` when set, as a real pod's UTS name.
                hostname: self.hostname(),
                pod_ip: self.ip.map(|ip| ip.to_string()),
                pod_dir: self.paths.app.clone(),
                mounts,
                splits,
                log: log_file(&self.paths, name, false),
                identity: self.identity(container),
                limits: if self.ctx.confined {
                    let limits = Limits::from_container(container, self.ctx.pod_pids_limit)?;
                    let group = format!("{}/{}-{name}", self.ctx.cgroup, self.key.uid);
                    Some((limits, group))
                } else {
                    None
                },
            },
            entry,
        })
    }

    async fn start_container(&mut self, init: bool, index: usize) {
        let specs = if init { &self.init_specs } else { &self.specs };
        let Some(container) = specs.get(index).cloned() else {
            return;
        };
        let name = container
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let (refs, tokens) = self.fetch_refs(&container).await;
        // A volume that cannot be set up yet (a Secret not created yet, the cluster's CA not
        // published yet, a token refused) is retried, as a node retries mounts.
        let mounted = tokens.and_then(|tokens| self.mounts(&container, &refs, &tokens));
        let mounts = match mounted {
            Ok(ok) => ok,
            Err(message) => {
                self.set_waiting(init, index, "ContainerCreating", message.clone());
                self.event("Warning", "FailedMount", &message);
                let retry = Instant::now() + MOUNT_RETRY;
                if init {
                    self.init_restart_at = Some((index, retry));
                } else if let Some(slot) = self.restart_at.get_mut(index) {
                    *slot = Some(retry);
                }
                return;
            }
        };
        let plan = match self.plan(&container, &refs, mounts) {
            Ok(plan) => plan,
            Err(message) => {
                self.set_waiting(init, index, "RunContainerError", message.clone());
                self.event("Warning", "Failed", &format!("Error: {message}"));
                return;
            }
        };
        let log = log_file(&self.paths, &name, false);
        if log.exists() {
            let _ = std::fs::rename(&log, log_file(&self.paths, &name, true));
        }
        let spawned = match &self.sandbox {
            Some(sandbox) => crate::sandbox::spawn_container(
                &plan.spec,
                &name,
                sandbox,
                &self.ctx.protections,
                &self.ctx.processes,
            ),
            None if self.ctx.confined => Err(std::io::Error::other("the pod has no sandbox")),
            None => process::spawn_unconfined(&plan.spec, &self.ctx.processes),
        };
        let running = match spawned {
            Ok(running) => running,
            Err(error) => {
                let message = format!("failed to start {:?}: {error}", plan.spec.argv.first());
                self.set_waiting(init, index, "RunContainerError", message.clone());
                self.event("Warning", "Failed", &format!("Error: {message}"));
                return;
            }
        };
        let pid = running.guard.pgid();
        self.ctx.update_pod(&self.key, |pod| {
            pod.running.insert(name.clone());
        });
        let started_at = now();
        let (control, control_rx) = mpsc::unbounded_channel();
        while self.tasks.try_join_next().is_some() {}
        self.tasks.spawn(watch_container(
            running,
            control_rx,
            self.exits_tx.clone(),
            init,
            index,
        ));
        let image = container
            .get("image")
            .and_then(Value::as_str)
            .unwrap_or_default();
        self.event(
            "Normal",
            "Pulled",
            &format!("Container image \"{image}\" already present on machine"),
        );
        self.event("Normal", "Created", &format!("Created container {name}"));
        self.event("Normal", "Started", &format!("Started container {name}"));
        let handle = Handle {
            control,
            pid,
            started_at: started_at.clone(),
        };
        let list = if init {
            &mut self.info.init
        } else {
            &mut self.info.containers
        };
        if let Some(info) = list.get_mut(index) {
            info.state = State::Running { started_at };
            info.container_id = Some(format!("sim://{pid}"));
            info.ready = false;
        }
        if init {
            if let Some(slot) = self.init_handles.get_mut(index) {
                *slot = Some(handle);
            }
        } else {
            if let Some(slot) = self.handles.get_mut(index) {
                *slot = Some(handle);
            }
            let ip = IpAddr::V4(self.ip.unwrap_or(Ipv4Addr::LOCALHOST));
            let probe = probe::readiness(&container, ip, plan.entry.readiness.as_ref());
            let ready_now = probe.is_none();
            if let Some(slot) = self.probes.get_mut(index) {
                *slot = probe.map(|probe| ProbeState {
                    next: Instant::now() + probe.initial_delay,
                    probe,
                    successes: 0,
                    failures: 0,
                    ever: false,
                });
            }
            if let Some(slot) = self.liveness.get_mut(index) {
                *slot = probe::liveness(&container, ip).map(|probe| ProbeState {
                    next: Instant::now() + probe.initial_delay,
                    probe,
                    successes: 0,
                    failures: 0,
                    ever: false,
                });
            }
            if ready_now && let Some(info) = self.info.containers.get_mut(index) {
                info.ready = true;
            }
            while self.env_cache.len() <= index {
                self.env_cache.push(BTreeMap::new());
            }
            if let Some(slot) = self.env_cache.get_mut(index) {
                *slot = plan.spec.env;
            }
        }
    }

    fn should_restart(&self, code: Option<i32>) -> bool {
        match self.restart_policy.as_str() {
            "Always" => true,
            "OnFailure" => code != Some(0),
            _ => false,
        }
    }

    async fn on_exit(&mut self, exit: Exit) {
        let specs = if exit.init {
            &self.init_specs
        } else {
            &self.specs
        };
        if let Some(name) = specs
            .get(exit.index)
            .and_then(|c| c.get("name"))
            .and_then(Value::as_str)
        {
            self.ctx.update_pod(&self.key, |pod| {
                pod.running.remove(name);
            });
        }
        let handle = if exit.init {
            self.init_handles.get_mut(exit.index).and_then(Option::take)
        } else {
            self.handles.get_mut(exit.index).and_then(Option::take)
        };
        let started_at = handle
            .as_ref()
            .map(|h| h.started_at.clone())
            .unwrap_or_default();
        let container_id = handle
            .as_ref()
            .map(|h| format!("sim://{}", h.pid))
            .unwrap_or_default();
        let code = exit.code.unwrap_or(128 + exit.signal.unwrap_or(9));
        let terminated = Terminated {
            exit_code: code,
            signal: exit.signal,
            reason: if code == 0 {
                "Completed".into()
            } else if exit.oom {
                "OOMKilled".into()
            } else {
                "Error".into()
            },
            message: None,
            started_at,
            finished_at: now(),
            container_id,
        };
        let restart = self.should_restart(Some(code));
        if exit.init {
            if let Some(info) = self.info.init.get_mut(exit.index) {
                info.state = State::Terminated(terminated.clone());
            }
            if code == 0 {
                if exit.index + 1 < self.init_specs.len() {
                    self.start_container(true, exit.index + 1).await;
                } else {
                    self.start_main().await;
                }
            } else if self.restart_policy == "Never" {
                self.info.terminal = Some("Failed".into());
            } else {
                let restarts = self
                    .info
                    .init
                    .get(exit.index)
                    .map_or(0, |c| c.restart_count);
                if let Some(info) = self.info.init.get_mut(exit.index) {
                    info.restart_count += 1;
                    info.last = Some(terminated);
                    info.state = State::Waiting {
                        reason: "CrashLoopBackOff".into(),
                        message: None,
                    };
                }
                self.init_restart_at = Some((exit.index, Instant::now() + backoff(restarts)));
            }
            self.write_status();
            return;
        }
        for slot in [
            self.probes.get_mut(exit.index),
            self.liveness.get_mut(exit.index),
        ]
        .into_iter()
        .flatten()
        {
            *slot = None;
        }
        if let Some(slot) = self.kill_at.get_mut(exit.index) {
            *slot = None;
        }
        let name = self
            .specs
            .get(exit.index)
            .and_then(|c| c.get("name"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        if restart {
            let restarts = self
                .info
                .containers
                .get(exit.index)
                .map_or(0, |c| c.restart_count);
            if let Some(info) = self.info.containers.get_mut(exit.index) {
                info.restart_count += 1;
                info.last = Some(terminated);
                info.ready = false;
                info.state = State::Waiting {
                    reason: "CrashLoopBackOff".into(),
                    message: Some(format!("back-off restarting failed container {name}")),
                };
            }
            if let Some(slot) = self.restart_at.get_mut(exit.index) {
                *slot = Some(Instant::now() + backoff(restarts));
            }
            self.event(
                "Warning",
                "BackOff",
                &format!("Back-off restarting failed container {name}"),
            );
        } else if let Some(info) = self.info.containers.get_mut(exit.index) {
            info.ready = false;
            info.state = State::Terminated(terminated);
        }
        let all_done = self
            .info
            .containers
            .iter()
            .all(|c| matches!(c.state, State::Terminated(_)));
        if all_done {
            let failed = self
                .info
                .containers
                .iter()
                .any(|c| matches!(&c.state, State::Terminated(t) if t.exit_code != 0));
            self.info.terminal = Some(if failed { "Failed" } else { "Succeeded" }.into());
        }
        if self.info.terminal.is_some() {
            // Nothing of the pod runs any more: its sandbox (namespaces, storage) goes, as a
            // node stops a finished pod's sandbox; the pod's logs stay until it is deleted.
            self.sandbox = None;
        }
        self.write_status();
    }

    fn next_wake(&self) -> Option<Instant> {
        let probes = self
            .probes
            .iter()
            .chain(&self.liveness)
            .flatten()
            .map(|p| p.next);
        let restarts = self
            .restart_at
            .iter()
            .chain(&self.kill_at)
            .flatten()
            .copied();
        let init = self.init_restart_at.map(|(_, at)| at);
        probes.chain(restarts).chain(init).min()
    }

    async fn tick(&mut self) {
        let now_instant = Instant::now();
        if let Some((index, at)) = self.init_restart_at
            && at <= now_instant
        {
            self.init_restart_at = None;
            self.start_container(true, index).await;
            self.write_status();
        }
        for index in 0..self.restart_at.len() {
            if self.restart_at[index].is_some_and(|at| at <= now_instant) {
                self.restart_at[index] = None;
                self.start_container(false, index).await;
                self.write_status();
            }
        }
        for index in 0..self.kill_at.len() {
            if self.kill_at[index].is_some_and(|at| at <= now_instant) {
                self.kill_at[index] = None;
                if let Some(handle) = self.handles.get(index).and_then(Option::as_ref) {
                    let _ = handle.control.send(true);
                }
            }
        }
        self.check_liveness(now_instant).await;
        let mut changed = false;
        for index in 0..self.probes.len() {
            let due = self.probes[index]
                .as_ref()
                .is_some_and(|p| p.next <= now_instant);
            if !due {
                continue;
            }
            let Some(state) = self.probes[index].as_ref() else {
                continue;
            };
            let ok = self.probe_once(index, &state.probe).await;
            let fast = self.ctx.fast_probe;
            let Some(state) = self.probes[index].as_mut() else {
                continue;
            };
            if ok {
                state.successes += 1;
                state.failures = 0;
            } else {
                state.failures += 1;
                state.successes = 0;
            }
            let ready_before = self.info.containers.get(index).is_some_and(|c| c.ready);
            let ready = if ok {
                ready_before || state.successes >= state.probe.success_threshold
            } else {
                ready_before && state.failures < state.probe.failure_threshold
            };
            if ready {
                state.ever = true;
            }
            // Until first ready the sim polls quickly, so tests need not wait a real period.
            state.next = Instant::now() + if state.ever { state.probe.period } else { fast };
            if ready != ready_before {
                if let Some(info) = self.info.containers.get_mut(index) {
                    info.ready = ready;
                }
                changed = true;
            }
        }
        if changed {
            self.write_status();
        }
    }

    /// One check of `probe` for container `index` (with its environment, for `exec`).
    async fn probe_once(&self, index: usize, probe: &Probe) -> bool {
        let env = self.env_cache.get(index).cloned().unwrap_or_default();
        let sockets = self.ctx.pod_sockets();
        // An exec probe runs inside the container, as the container (never on the host).
        let inside = match (
            &self.sandbox,
            self.handles.get(index).and_then(Option::as_ref),
        ) {
            (Some(sandbox), Some(handle)) => Some(probe::Inside {
                sandbox: sandbox.clone(),
                supervisor: handle.pid,
                workdir: self
                    .specs
                    .get(index)
                    .and_then(|c| c.get("workingDir"))
                    .and_then(Value::as_str)
                    .unwrap_or(POD_DIR_IN_SANDBOX)
                    .to_owned(),
                protections: self.ctx.protections.clone(),
            }),
            (Some(_), None) => return false,
            (None, _) => None,
        };
        probe::check(
            &probe.action,
            probe.timeout,
            &env,
            &self.paths.app,
            sockets.as_ref(),
            inside.as_ref(),
        )
        .await
    }

    /// Runs the liveness probes that are due; a container that fails `failureThreshold` in a
    /// row is stopped (SIGTERM, SIGKILL after the pod's grace period) and then restarted per
    /// `restartPolicy`, as a node does.
    async fn check_liveness(&mut self, now_instant: Instant) {
        for index in 0..self.liveness.len() {
            let Some(state) = self.liveness[index]
                .as_ref()
                .filter(|p| p.next <= now_instant)
            else {
                continue;
            };
            let ok = self.probe_once(index, &state.probe).await;
            let Some(state) = self.liveness[index].as_mut() else {
                continue;
            };
            state.next = Instant::now() + state.probe.period;
            if ok {
                state.failures = 0;
                continue;
            }
            state.failures += 1;
            let failed = state.failures >= state.probe.failure_threshold;
            let name = self
                .specs
                .get(index)
                .and_then(|c| c.get("name"))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            self.event(
                "Warning",
                "Unhealthy",
                &format!("Liveness probe failed ({name})"),
            );
            if !failed {
                continue;
            }
            self.liveness[index] = None;
            self.event(
                "Normal",
                "Killing",
                &format!("Container {name} failed liveness probe, will be restarted"),
            );
            if let Some(handle) = self.handles.get(index).and_then(Option::as_ref) {
                let _ = handle.control.send(false);
            }
            let grace = self
                .pod
                .pointer("/spec/terminationGracePeriodSeconds")
                .and_then(Value::as_u64)
                .unwrap_or(30);
            if let Some(slot) = self.kill_at.get_mut(index) {
                *slot = Some(Instant::now() + Duration::from_secs(grace));
            }
        }
    }

    fn handles_mut(&mut self) -> impl Iterator<Item = &mut Option<Handle>> {
        self.init_handles.iter_mut().chain(self.handles.iter_mut())
    }

    /// Stops every container: SIGTERM, then SIGKILL when `grace` runs out.
    async fn terminate(&mut self, grace: Duration, exits: &mut mpsc::UnboundedReceiver<Exit>) {
        let names: Vec<String> = self
            .specs
            .iter()
            .filter_map(|c| c.get("name").and_then(Value::as_str).map(str::to_owned))
            .collect();
        for name in names {
            self.event("Normal", "Killing", &format!("Stopping container {name}"));
        }
        self.restart_at.iter_mut().for_each(|slot| *slot = None);
        self.init_restart_at = None;
        self.restart_policy = "Never".into();
        for handle in self.handles_mut().flatten() {
            let _ = handle.control.send(false);
        }
        let deadline = Instant::now() + grace;
        let mut killed = false;
        // Bounded: every handle exits after SIGKILL; the extra second covers reaping.
        let hard_stop = deadline + Duration::from_secs(5);
        while self.handles_mut().any(|h| h.is_some()) && Instant::now() < hard_stop {
            let wait_until = if killed { hard_stop } else { deadline };
            tokio::select! {
                Some(exit) = exits.recv() => self.on_exit(exit).await,
                () = tokio::time::sleep_until(wait_until) => {
                    if !killed {
                        for handle in self.handles_mut().flatten() {
                            let _ = handle.control.send(true);
                        }
                        killed = true;
                    }
                }
            }
        }
        self.kill_all();
    }

    fn kill_all(&mut self) {
        for slot in self.handles_mut() {
            if let Some(handle) = slot.take() {
                let _ = handle.control.send(true);
            }
        }
    }

    /// Forgets the pod: ends its sandbox (its namespaces and storage go with it), releases its
    /// address and removes its directories, leaving nothing of it behind.
    fn release(&mut self) {
        self.sandbox = None;
        self.ctx.forget_pod(&self.key.uid);
        if let Some(ip) = self.ip.take() {
            net::release(ip);
        }
        // The processes are gone (their helpers ended them); `remove_dir_all` never follows a
        // symbolic link, so nothing outside the pod's directory goes.
        match std::fs::remove_dir_all(&self.paths.root) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => tracing::warn!(
                pod = %format!("{}/{}", self.namespace, self.name),
                dir = %self.paths.root.display(), %error,
                "removing the pod's directory failed"
            ),
        }
    }
}

/// Owns one container process: reports its exit, forwards stop requests (`false` = SIGTERM,
/// `true` or a closed channel = SIGKILL) and kills the group when it ends.
async fn watch_container(
    mut running: process::Running,
    mut control: mpsc::UnboundedReceiver<bool>,
    exits: mpsc::UnboundedSender<Exit>,
    init: bool,
    index: usize,
) {
    use std::os::unix::process::ExitStatusExt as _;
    let mut terminating = false;
    let status = loop {
        tokio::select! {
            status = running.child.wait() => break status,
            message = control.recv() => match message {
                Some(false) => {
                    terminating = true;
                    running.guard.terminate();
                }
                Some(true) | None => {
                    running.guard.kill();
                    break running.child.wait().await;
                }
            },
            // Processes that appeared since (the pod-sandbox helper was still starting) get
            // their SIGTERM too.
            () = tokio::time::sleep(Duration::from_millis(50)), if terminating => {
                running.guard.terminate();
            }
        }
    };
    // The leader is gone; whatever it left behind in its group goes too.
    running.guard.kill();
    running.guard.wait_gone(Duration::from_secs(5)).await;
    let (code, signal) = match status {
        Ok(status) => (status.code(), status.signal()),
        Err(_) => (None, Some(9)),
    };
    let _ = exits.send(Exit {
        init,
        index,
        code,
        signal,
        oom: running.guard.out_of_memory(),
    });
}
