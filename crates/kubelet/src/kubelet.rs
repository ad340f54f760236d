//! The process kubelet: binds unscheduled pods to the sim's node, runs each bound pod as local
//! process groups chosen through the [`ImageTable`], keeps their status true to reality
//! (pod IP, phase, conditions, container states, readiness probes), records Events, and kills
//! the processes when the pod is deleted before confirming the deletion.

pub(crate) mod images;
pub(crate) mod net;
mod pod;
pub(crate) mod pod_status;
pub(crate) mod probe;
pub(crate) mod process;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::broadcast::{self, error::RecvError};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::meta;
use crate::ops::ApiObjects;
use crate::resources::StorageKey;
use crate::store::{Change, EventType};

use images::ImageTable;
use process::ProcessTable;

/// Everything the kubelet's workers share.
#[derive(Debug)]
pub(crate) struct KubeletContext {
    pub(crate) objects: Arc<ApiObjects>,
    pub(crate) node: String,
    pub(crate) images: ImageTable,
    /// Run pod processes inside bubblewrap.
    pub(crate) bwrap: bool,
    /// Root of the pods' directories.
    pub(crate) pods_dir: PathBuf,
    /// Root of the PersistentVolumeClaims' directories.
    pub(crate) volumes_dir: PathBuf,
    /// Probe interval until a container is first ready.
    pub(crate) fast_probe: Duration,
    pub(crate) processes: Arc<ProcessTable>,
    /// The executable next to which named programs are looked up.
    pub(crate) exe: Option<PathBuf>,
}

/// The directories of one pod.
#[derive(Clone, Debug)]
pub(crate) struct PodPaths {
    pub(crate) root: PathBuf,
    /// The pod's own directory (`/app` under bubblewrap).
    pub(crate) app: PathBuf,
    pub(crate) logs: PathBuf,
}

/// The directories of a pod under `pods_dir`.
pub(crate) fn pod_paths(pods_dir: &Path, namespace: &str, name: &str, uid: &str) -> PodPaths {
    let root = pods_dir.join(namespace).join(format!("{name}-{uid}"));
    PodPaths {
        app: root.join("app"),
        logs: root.join("logs"),
        root,
    }
}

/// The log file of a container (the previous run's when `previous`).
pub(crate) fn log_file(paths: &PodPaths, container: &str, previous: bool) -> PathBuf {
    if previous {
        paths.logs.join(format!("{container}.previous.log"))
    } else {
        paths.logs.join(format!("{container}.log"))
    }
}

fn pods_key() -> StorageKey {
    StorageKey::new("", "pods")
}

/// Commands from the kubelet loop to a pod worker.
#[derive(Debug)]
pub(crate) enum PodCommand {
    /// The pod is being deleted: stop within the grace period, then confirm.
    Terminate(Duration),
    /// The pod is gone: kill now.
    Kill,
}

/// A strictly increasing nanosecond timestamp for event names.
fn event_stamp() -> u128 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    let previous = LAST.fetch_max(now, Ordering::SeqCst);
    let stamp = if previous >= now {
        LAST.fetch_add(1, Ordering::SeqCst) + 1
    } else {
        now
    };
    u128::from(stamp)
}

/// Records a core Event about a pod, as the kubelet (or scheduler) does.
pub(crate) fn record_event(
    objects: &ApiObjects,
    pod: &Value,
    component: &str,
    type_: &str,
    reason: &str,
    message: &str,
) {
    let Ok(info) = objects.builtin("", "events") else {
        return;
    };
    let now = meta::now();
    let event = json!({
        "metadata": {
            // Like the kubelet's names: the object's name and a timestamp, so names sort by time.
            "name": format!("{}.{:x}", meta::name(pod), event_stamp()),
            "namespace": meta::namespace(pod),
        },
        "involvedObject": {
            "apiVersion": "v1", "kind": "Pod", "name": meta::name(pod),
            "namespace": meta::namespace(pod), "uid": meta::uid(pod),
            "resourceVersion": meta::resource_version(pod),
        },
        "reason": reason,
        "message": message,
        "type": type_,
        "source": {"component": component, "host": "sim-node"},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
        "reportingComponent": component,
        "reportingInstance": "sim-node",
    });
    if let Err(error) = objects.create_internal(&info, event) {
        tracing::debug!(%error, "recording event failed");
    }
}

/// The Node object the sim's pods are bound to.
pub(crate) fn node_object(name: &str) -> Value {
    let now = meta::now();
    json!({
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
            "kubernetes.io/arch": std::env::consts::ARCH,
            "node-role.kubernetes.io/control-plane": ""}},
        "spec": {},
        "status": {
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                          {"type": "Hostname", "address": name}],
            "capacity": {"cpu": "2", "memory": "8Gi", "pods": "1000"},
            "allocatable": {"cpu": "2", "memory": "8Gi", "pods": "1000"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "the simulated kubelet is posting ready status",
                            "lastHeartbeatTime": now, "lastTransitionTime": now}],
            "nodeInfo": {"kubeletVersion": "v1.35.0-sim", "operatingSystem": "linux",
                         "architecture": std::env::consts::ARCH, "containerRuntimeVersion": "sim://1",
                         "kernelVersion": "", "osImage": "agent-sandbox sim", "kubeProxyVersion": "",
                         "machineID": "", "systemUUID": "", "bootID": ""}
        }
    })
}

struct Worker {
    commands: mpsc::UnboundedSender<PodCommand>,
    terminating: bool,
}

/// The kubelet loop.
pub(crate) struct Kubelet {
    ctx: Arc<KubeletContext>,
    workers: HashMap<String, Worker>,
    tasks: JoinSet<()>,
}

impl std::fmt::Debug for Kubelet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kubelet")
            .field("pods", &self.workers.len())
            .finish()
    }
}

impl Kubelet {
    pub(crate) fn new(ctx: Arc<KubeletContext>) -> Self {
        Self {
            ctx,
            workers: HashMap::new(),
            tasks: JoinSet::new(),
        }
    }

    /// Binds an unscheduled pod to the node, as the scheduler would.
    fn bind(&self, pod: &Value) {
        let node = self.ctx.node.clone();
        let now = meta::now();
        let bound = self.ctx.objects.mutate(
            &pods_key(),
            meta::namespace(pod),
            meta::name(pod),
            |object| {
                if object
                    .pointer("/spec/nodeName")
                    .and_then(Value::as_str)
                    .is_some_and(|n| !n.is_empty())
                {
                    return false;
                }
                if let Some(spec) = object.get_mut("spec").and_then(Value::as_object_mut) {
                    spec.insert("nodeName".into(), json!(node));
                }
                let status = object
                    .as_object_mut()
                    .map(|map| map.entry("status").or_insert_with(|| json!({})));
                if let Some(Value::Object(status)) = status {
                    let conditions = status.entry("conditions").or_insert_with(|| json!([]));
                    if let Some(list) = conditions.as_array_mut() {
                        list.retain(|c| {
                            c.get("type").and_then(Value::as_str) != Some("PodScheduled")
                        });
                        list.push(json!({"type": "PodScheduled", "status": "True",
                                     "lastProbeTime": null, "lastTransitionTime": now}));
                    }
                }
                true
            },
        );
        if let Some(bound) = bound {
            record_event(
                &self.ctx.objects,
                &bound,
                "default-scheduler",
                "Normal",
                "Scheduled",
                &format!(
                    "Successfully assigned {}/{} to {}",
                    meta::namespace(&bound),
                    meta::name(&bound),
                    self.ctx.node
                ),
            );
        }
    }

    fn grace_left(pod: &Value) -> Duration {
        let deadline = meta::meta_str(pod, "deletionTimestamp").and_then(meta::parse_time);
        let now = k8s_openapi::jiff::Timestamp::now();
        deadline
            .map(|deadline| deadline.duration_since(now))
            .and_then(|left| Duration::try_from(left).ok())
            .unwrap_or(Duration::ZERO)
    }

    fn on_pod(&mut self, pod: &Arc<Value>) {
        let uid = meta::uid(pod).to_owned();
        let node = pod
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if node.is_empty() {
            if !meta::is_deleting(pod) {
                self.bind(pod);
            }
            return;
        }
        if node != self.ctx.node {
            return;
        }
        if !self.workers.contains_key(&uid) {
            if meta::is_deleting(pod) {
                // Never started here: nothing to stop, confirm at once.
                confirm_deletion(&self.ctx.objects, pod);
                return;
            }
            let (commands, receiver) = mpsc::unbounded_channel();
            let ctx = self.ctx.clone();
            let pod = pod.clone();
            self.tasks.spawn(pod::run(ctx, pod, receiver));
            self.workers.insert(
                uid.clone(),
                Worker {
                    commands,
                    terminating: false,
                },
            );
        }
        if meta::is_deleting(pod)
            && let Some(worker) = self.workers.get_mut(&uid)
            && !worker.terminating
        {
            worker.terminating = true;
            let _ = worker
                .commands
                .send(PodCommand::Terminate(Self::grace_left(pod)));
        }
    }

    fn on_removed(&mut self, pod: &Value) {
        if let Some(worker) = self.workers.remove(meta::uid(pod)) {
            let _ = worker.commands.send(PodCommand::Kill);
        }
    }

    fn resync(&mut self) {
        let (pods, _) = self.ctx.objects.store.list(&pods_key(), None);
        let live: std::collections::HashSet<String> =
            pods.iter().map(|p| meta::uid(p).to_owned()).collect();
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
        for pod in pods {
            self.on_pod(&pod);
        }
    }

    /// Runs until the event channel closes; the workers are aborted (and their processes killed)
    /// when this future is dropped.
    pub(crate) async fn run(mut self, mut events: broadcast::Receiver<Arc<Change>>) {
        self.resync();
        loop {
            tokio::select! {
                event = events.recv() => match event {
                    Ok(change) if change.key == pods_key() => match change.kind {
                        EventType::Deleted => self.on_removed(&change.object),
                        EventType::Added | EventType::Modified => self.on_pod(&change.object),
                    },
                    Ok(_) => {}
                    Err(RecvError::Lagged(_)) => self.resync(),
                    Err(RecvError::Closed) => return,
                },
                Some(_) = self.tasks.join_next(), if !self.tasks.is_empty() => {}
            }
        }
    }
}

/// Confirms a pod's deletion after its processes are gone (grace period zero), which removes it
/// once its finalizers are empty.
pub(crate) fn confirm_deletion(objects: &ApiObjects, pod: &Value) {
    let uid = meta::uid(pod).to_owned();
    objects.mutate(
        &pods_key(),
        meta::namespace(pod),
        meta::name(pod),
        |object| {
            if meta::uid(object) != uid {
                return false;
            }
            meta::meta_mut(object).insert("deletionGracePeriodSeconds".into(), json!(0));
            true
        },
    );
}
