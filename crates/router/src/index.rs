//! The sandbox-to-pod index: which pod address and ports each Sandbox may be reached at.
//!
//! A plain struct with `apply` / `delete` / `reset` for Sandboxes and Pods (the shape of
//! linkerd's policy-controller indexes): the watchers in [`crate::watch`] feed it from the
//! cluster, tests and in-process users (`sandboxctl run --local`) feed it directly. It keeps a
//! small summary per object, never the objects, and answers [`Index::resolve`] without IO.
//!
//! A sandbox is routable when:
//! - it is not an unclaimed warm-pool member (its controller is not a `SandboxWarmPool`, and
//!   it does not carry `agents.x-k8s.io/warm-pool-sandbox`),
//! - its `Ready` condition is `True`,
//! - its pod (named by the `agents.x-k8s.io/pod-name` annotation, else the sandbox's own name)
//!   exists, carries `agents.x-k8s.io/sandbox-name-hash` with the sandbox's name hash, is
//!   controlled by the Sandbox's UID, is not terminating and has an IP.
//!
//! The allowed ports are 8888 and those the pod's containers declare.
//!
//! **Pods only.** When the router may not read Sandboxes (upstream's router RBAC grants pods
//! only), the watcher switches the index to [`Index::set_pods_only`]: a sandbox is then routable
//! when a pod carrying its name hash is controlled by a Sandbox of that name, is not an unclaimed
//! warm-pool member (no `agents.x-k8s.io/warm-pool-sandbox` label), is `Ready`, not terminating
//! and has an IP. What this cannot see: the Sandbox's own `Ready` condition and its `pod-name`
//! annotation (a pod named otherwise is found through its controller reference instead).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use agent_sandbox_api::wire::RUNTIME_PORT;
use agent_sandbox_api::{Sandbox, annotations, conditions, kinds, labels, name_hash};
use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

/// Kind of the warm-pool owner of unclaimed members.
const WARM_POOL_KIND: &str = kinds::SANDBOX_WARM_POOL;
/// Kind a pod's controller must have.
const SANDBOX_KIND: &str = kinds::SANDBOX;

/// What the index keeps of a Sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SandboxEntry {
    uid: String,
    /// The `pod-name` annotation, when set.
    pod_name: Option<String>,
    readiness: Readiness,
    /// The pool of an unclaimed member: the controlling `SandboxWarmPool`'s name, else the
    /// pool label's value.
    warm_pool: Option<String>,
    /// `spec.operatingMode` is `Suspended`.
    suspended: bool,
    /// `spec.idleLifecycle.activeTTLSeconds`.
    idle_ttl: Option<std::time::Duration>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Readiness {
    Ready,
    NotReady { reason: String, message: String },
    Unknown,
}

/// What the index keeps of a Pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PodEntry {
    /// UID of the controlling owner, when that owner is a Sandbox.
    controller_uid: Option<String>,
    /// Name of the controlling owner, when that owner is a Sandbox.
    controller_name: Option<String>,
    /// Value of the warm-pool label (an unclaimed pool member's pod).
    warm_pool: Option<String>,
    /// The pod's `Ready` condition is `True`.
    ready: bool,
    /// Value of the name-hash label.
    name_hash: Option<String>,
    ips: Vec<IpAddr>,
    /// Declared container ports, sorted, without duplicates.
    ports: Vec<u16>,
    terminating: bool,
}

/// Where a routable sandbox can be reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backend {
    /// UID of the Sandbox.
    pub uid: String,
    /// Name of its pod.
    pub pod: String,
    /// The pod's IPs (primary first).
    pub ips: Vec<IpAddr>,
    /// Ports that may be addressed: 8888 and the declared container ports, sorted.
    pub ports: Vec<u16>,
    /// The Sandbox's `activeTTLSeconds`, when it has an idle lifecycle: activity is recorded
    /// often enough for it.
    pub idle_ttl: Option<std::time::Duration>,
}

/// Why a sandbox cannot be routed to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unroutable {
    /// No such Sandbox, and the initial lists are not done: the answer may be premature.
    NotSynced,
    /// No such Sandbox.
    NotFound,
    /// The Sandbox is suspended (`operatingMode: Suspended`); a request resumes it.
    Suspended,
    /// The Sandbox is an unclaimed member of this warm pool.
    WarmPoolMember {
        /// The pool.
        pool: String,
    },
    /// The Sandbox's `Ready` condition is not `True`.
    NotReady {
        /// The condition's reason (empty when there is no condition yet).
        reason: String,
        /// The condition's message.
        message: String,
    },
    /// The Sandbox's pod is not known.
    NoPod {
        /// The pod's expected name.
        pod: String,
    },
    /// A pod of that name exists but does not belong to this Sandbox.
    PodNotControlled {
        /// The pod.
        pod: String,
    },
    /// The pod is being deleted.
    PodTerminating {
        /// The pod.
        pod: String,
    },
    /// The pod has no IP yet.
    NoPodIp {
        /// The pod.
        pod: String,
    },
}

impl Unroutable {
    /// Whether the index may still catch up (a claim adopted, a pod readied a moment ago that
    /// the watch has not delivered yet); a terminating pod does not come back.
    pub fn may_settle(&self) -> bool {
        !matches!(self, Self::PodTerminating { .. })
    }

    /// What the router last saw of a suspended sandbox it asked to be resumed, as the end of
    /// the sentence "last seen, it ...".
    pub fn while_waking(&self) -> String {
        match self {
            Self::Suspended => "was still suspended (spec.operatingMode: Suspended), so the \
                                controller has not resumed it (is the controller running?)"
                .to_owned(),
            Self::NotReady { reason, message } if reason.is_empty() && message.is_empty() => {
                "was resumed but not Ready yet (no Ready condition)".to_owned()
            }
            Self::NotReady { reason, message } => {
                format!("was resumed but not Ready: {reason}: {message}")
            }
            Self::NoPod { pod } => format!("was resumed, but its pod {pod} did not exist yet"),
            Self::NoPodIp { pod } => format!("was resumed, but its pod {pod} had no IP yet"),
            Self::PodTerminating { pod } => {
                format!("was resumed, but its pod {pod} was terminating")
            }
            Self::PodNotControlled { pod } => {
                format!("was resumed, but pod {pod} is not controlled by it")
            }
            Self::NotFound => "was gone (deleted)".to_owned(),
            Self::NotSynced => "was not known to the router (its index had not synced)".to_owned(),
            Self::WarmPoolMember { pool } => {
                format!("was an unclaimed warm-pool member (pool {pool})")
            }
        }
    }

    /// A sentence naming the sandbox `namespace/name`.
    pub fn describe(&self, namespace: &str, name: &str) -> String {
        let sandbox = format!("{namespace}/{name}");
        match self {
            Self::NotSynced => format!(
                "Sandbox {sandbox} is not known yet: the router has not finished its initial list \
                 of sandboxes and pods."
            ),
            Self::NotFound => format!("Sandbox {sandbox} not found."),
            Self::Suspended => format!(
                "Sandbox {sandbox} is suspended (operatingMode: Suspended); resume it \
                 (sandboxctl resume) or send the request through a router that may resume it."
            ),
            Self::WarmPoolMember { pool } => format!(
                "Sandbox {sandbox} is an unclaimed warm-pool member (pool {pool}); claim it with a \
                 SandboxClaim first."
            ),
            Self::NotReady { reason, message } if reason.is_empty() && message.is_empty() => {
                format!("Sandbox {sandbox} is not Ready yet (no Ready condition).")
            }
            Self::NotReady { reason, message } => {
                format!("Sandbox {sandbox} is not Ready: {reason}: {message}")
            }
            Self::NoPod { pod } => {
                format!("Sandbox {sandbox} is not Ready: its pod {pod} is not known yet.")
            }
            Self::PodNotControlled { pod } => {
                format!("Sandbox {sandbox} is not Ready: pod {pod} is not controlled by it.")
            }
            Self::PodTerminating { pod } => {
                format!("Sandbox {sandbox} is not Ready: its pod {pod} is terminating.")
            }
            Self::NoPodIp { pod } => {
                format!("Sandbox {sandbox} is not Ready: its pod {pod} has no IP yet.")
            }
        }
    }
}

/// Sandboxes and pods by namespace and name, and whether the initial lists are done.
#[derive(Debug, Default)]
pub struct Index {
    sandboxes: HashMap<String, HashMap<String, SandboxEntry>>,
    pods: HashMap<String, HashMap<String, PodEntry>>,
    sandboxes_synced: bool,
    pods_synced: bool,
    pods_only: bool,
}

impl Index {
    /// An empty index that has not synced.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds or replaces a Sandbox.
    pub fn apply_sandbox(&mut self, sandbox: &Sandbox) {
        if let Some((namespace, name, entry)) = sandbox_entry(sandbox) {
            self.insert_sandbox(namespace, name, entry);
        }
    }

    /// Removes a Sandbox.
    pub fn delete_sandbox(&mut self, namespace: &str, name: &str) {
        remove(&mut self.sandboxes, namespace, name);
    }

    /// Replaces every Sandbox with `sandboxes` (the result of a complete list) and marks the
    /// Sandboxes synced.
    pub fn reset_sandboxes<'a>(&mut self, sandboxes: impl IntoIterator<Item = &'a Sandbox>) {
        self.reset_sandbox_entries(sandboxes.into_iter().filter_map(sandbox_entry));
    }

    pub(crate) fn insert_sandbox(&mut self, namespace: String, name: String, entry: SandboxEntry) {
        self.sandboxes
            .entry(namespace)
            .or_default()
            .insert(name, entry);
    }

    pub(crate) fn reset_sandbox_entries(
        &mut self,
        entries: impl IntoIterator<Item = (String, String, SandboxEntry)>,
    ) {
        self.sandboxes.clear();
        for (namespace, name, entry) in entries {
            self.insert_sandbox(namespace, name, entry);
        }
        self.sandboxes_synced = true;
        self.pods_only = false;
    }

    /// Routes from pods alone (on) because Sandboxes cannot be read, or from Sandboxes and pods
    /// again (off; a complete list of Sandboxes also turns it off). Turning it on forgets the
    /// Sandboxes and counts them as listed.
    pub fn set_pods_only(&mut self, on: bool) {
        self.pods_only = on;
        if on {
            self.sandboxes.clear();
            self.sandboxes_synced = true;
        }
    }

    /// Whether the index routes from pods alone.
    pub fn is_pods_only(&self) -> bool {
        self.pods_only
    }

    /// Adds or replaces a Pod.
    pub fn apply_pod(&mut self, pod: &Pod) {
        if let Some((namespace, name, entry)) = pod_entry(pod) {
            self.insert_pod(namespace, name, entry);
        }
    }

    /// Removes a Pod.
    pub fn delete_pod(&mut self, namespace: &str, name: &str) {
        remove(&mut self.pods, namespace, name);
    }

    /// Replaces every Pod with `pods` (the result of a complete list) and marks the Pods synced.
    pub fn reset_pods<'a>(&mut self, pods: impl IntoIterator<Item = &'a Pod>) {
        self.reset_pod_entries(pods.into_iter().filter_map(pod_entry));
    }

    pub(crate) fn insert_pod(&mut self, namespace: String, name: String, entry: PodEntry) {
        self.pods.entry(namespace).or_default().insert(name, entry);
    }

    pub(crate) fn reset_pod_entries(
        &mut self,
        entries: impl IntoIterator<Item = (String, String, PodEntry)>,
    ) {
        self.pods.clear();
        for (namespace, name, entry) in entries {
            self.insert_pod(namespace, name, entry);
        }
        self.pods_synced = true;
    }

    /// Whether both initial lists (Sandboxes and Pods) are done.
    pub fn is_synced(&self) -> bool {
        self.sandboxes_synced && self.pods_synced
    }

    /// Whether the Sandboxes and the Pods have been listed, in that order.
    pub fn sync_state(&self) -> (bool, bool) {
        (self.sandboxes_synced, self.pods_synced)
    }

    /// Numbers of Sandboxes and Pods held.
    pub fn len(&self) -> (usize, usize) {
        (count(&self.sandboxes), count(&self.pods))
    }

    /// Whether the index holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == (0, 0)
    }

    /// Sandbox `namespace/name`'s `activeTTLSeconds`, whether it is routable or not (a
    /// suspended one's too), if the index knows it and it has one.
    pub fn idle_ttl(&self, namespace: &str, name: &str) -> Option<std::time::Duration> {
        self.sandboxes.get(namespace)?.get(name)?.idle_ttl
    }

    /// Where sandbox `namespace/name` can be reached, or why it cannot.
    pub fn resolve(&self, namespace: &str, name: &str) -> Result<Backend, Unroutable> {
        if self.pods_only {
            return self.resolve_from_pods(namespace, name);
        }
        let Some(sandbox) = self.sandboxes.get(namespace).and_then(|m| m.get(name)) else {
            return Err(if self.is_synced() {
                Unroutable::NotFound
            } else {
                Unroutable::NotSynced
            });
        };
        if let Some(pool) = &sandbox.warm_pool {
            return Err(Unroutable::WarmPoolMember { pool: pool.clone() });
        }
        if sandbox.suspended {
            return Err(Unroutable::Suspended);
        }
        match &sandbox.readiness {
            Readiness::Ready => {}
            Readiness::NotReady { reason, message } => {
                return Err(Unroutable::NotReady {
                    reason: reason.clone(),
                    message: message.clone(),
                });
            }
            Readiness::Unknown => {
                return Err(Unroutable::NotReady {
                    reason: String::new(),
                    message: String::new(),
                });
            }
        }
        let pod_name = sandbox.pod_name.as_deref().unwrap_or(name);
        let Some(pod) = self.pods.get(namespace).and_then(|m| m.get(pod_name)) else {
            return Err(Unroutable::NoPod {
                pod: pod_name.to_owned(),
            });
        };
        if pod.controller_uid.as_deref() != Some(sandbox.uid.as_str())
            || pod.name_hash.as_deref() != Some(name_hash(name).as_str())
        {
            return Err(Unroutable::PodNotControlled {
                pod: pod_name.to_owned(),
            });
        }
        if pod.terminating {
            return Err(Unroutable::PodTerminating {
                pod: pod_name.to_owned(),
            });
        }
        if pod.ips.is_empty() {
            return Err(Unroutable::NoPodIp {
                pod: pod_name.to_owned(),
            });
        }
        Ok(Backend {
            idle_ttl: sandbox.idle_ttl,
            ..backend(sandbox.uid.clone(), pod_name, pod)
        })
    }

    /// [`Self::resolve`] without Sandboxes (see the module docs).
    fn resolve_from_pods(&self, namespace: &str, name: &str) -> Result<Backend, Unroutable> {
        let controlled = |pod: &PodEntry| pod.controller_name.as_deref() == Some(name);
        let pods = self.pods.get(namespace);
        let found = pods
            .and_then(|pods| pods.get_key_value(name))
            .filter(|(_, pod)| controlled(pod))
            .or_else(|| pods.and_then(|pods| pods.iter().find(|(_, pod)| controlled(pod))));
        let Some((pod_name, pod)) = found else {
            return Err(if self.pods_synced {
                Unroutable::NotFound
            } else {
                Unroutable::NotSynced
            });
        };
        let (Some(uid), true) = (
            pod.controller_uid.as_ref(),
            pod.name_hash.as_deref() == Some(name_hash(name).as_str()),
        ) else {
            return Err(Unroutable::PodNotControlled {
                pod: pod_name.clone(),
            });
        };
        if let Some(pool) = &pod.warm_pool {
            return Err(Unroutable::WarmPoolMember {
                pool: format!("with name hash {pool}"),
            });
        }
        if pod.terminating {
            return Err(Unroutable::PodTerminating {
                pod: pod_name.clone(),
            });
        }
        if !pod.ready {
            return Err(Unroutable::NotReady {
                reason: "PodNotReady".to_owned(),
                message: format!("pod {pod_name} is not Ready"),
            });
        }
        if pod.ips.is_empty() {
            return Err(Unroutable::NoPodIp {
                pod: pod_name.clone(),
            });
        }
        Ok(backend(uid.clone(), pod_name, pod))
    }
}

fn backend(uid: String, pod_name: &str, pod: &PodEntry) -> Backend {
    let mut ports = pod.ports.clone();
    if let Err(at) = ports.binary_search(&RUNTIME_PORT) {
        ports.insert(at, RUNTIME_PORT);
    }
    Backend {
        uid,
        pod: pod_name.to_owned(),
        ips: pod.ips.clone(),
        ports,
        idle_ttl: None,
    }
}

fn count<V>(map: &HashMap<String, HashMap<String, V>>) -> usize {
    map.values().map(HashMap::len).sum()
}

fn remove<V>(map: &mut HashMap<String, HashMap<String, V>>, namespace: &str, name: &str) {
    if let Some(names) = map.get_mut(namespace) {
        names.remove(name);
        if names.is_empty() {
            map.remove(namespace);
        }
    }
}

fn namespace_and_name(meta: &ObjectMeta) -> Option<(String, String)> {
    Some((meta.namespace.clone()?, meta.name.clone()?))
}

fn controller(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references
        .as_deref()?
        .iter()
        .find(|owner| owner.controller == Some(true))
}

/// The summary of a Sandbox; `None` for an object without namespace, name or UID.
pub(crate) fn sandbox_entry(sandbox: &Sandbox) -> Option<(String, String, SandboxEntry)> {
    let (namespace, name) = namespace_and_name(&sandbox.metadata)?;
    let uid = sandbox.metadata.uid.clone()?;
    let pod_name = sandbox
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(annotations::POD_NAME))
        .filter(|value| !value.is_empty())
        .cloned();
    // A pool's member until a claim adopts it (the adoption takes the label off in the same
    // write as it moves the controller): also an orphan still labelled, which the next pool of
    // that name takes back and hands to a claim.
    let warm_pool = controller(&sandbox.metadata)
        .filter(|owner| owner.kind == WARM_POOL_KIND)
        .map(|owner| owner.name.clone())
        .or_else(|| {
            sandbox
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(labels::WARM_POOL_SANDBOX))
                .map(|hash| format!("with name hash {hash}"))
        });
    let readiness = sandbox
        .status
        .as_ref()
        .and_then(|status| {
            status
                .conditions
                .iter()
                .find(|c| c.type_ == conditions::sandbox::READY)
        })
        .map_or(Readiness::Unknown, |condition| {
            if condition.status == "True" {
                Readiness::Ready
            } else {
                Readiness::NotReady {
                    reason: condition.reason.clone(),
                    message: condition.message.clone(),
                }
            }
        });
    Some((
        namespace,
        name,
        SandboxEntry {
            uid,
            pod_name,
            readiness,
            warm_pool,
            suspended: sandbox.spec.operating_mode
                == agent_sandbox_api::sandbox::OperatingMode::Suspended,
            idle_ttl: sandbox
                .spec
                .idle_lifecycle
                .as_ref()
                .and_then(|l| l.active_ttl_seconds)
                .and_then(|ttl| u64::try_from(ttl).ok())
                .map(std::time::Duration::from_secs),
        },
    ))
}

fn declared_ports<'a>(containers: impl IntoIterator<Item = &'a Container>) -> Vec<u16> {
    containers
        .into_iter()
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|port| u16::try_from(port.container_port).ok())
        .filter(|port| *port > 0)
        .collect()
}

/// The summary of a Pod; `None` for an object without namespace or name.
pub(crate) fn pod_entry(pod: &Pod) -> Option<(String, String, PodEntry)> {
    let (namespace, name) = namespace_and_name(&pod.metadata)?;
    let sandbox_owner = controller(&pod.metadata).filter(|owner| owner.kind == SANDBOX_KIND);
    let controller_uid = sandbox_owner.map(|owner| owner.uid.clone());
    let controller_name = sandbox_owner.map(|owner| owner.name.clone());
    let label = |key: &str| {
        pod.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(key))
            .cloned()
    };
    let name_hash = label(labels::SANDBOX_NAME_HASH);
    let warm_pool = label(labels::WARM_POOL_SANDBOX);
    let status = pod.status.as_ref();
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    let mut ips: Vec<IpAddr> = status
        .and_then(|s| s.pod_ips.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|ip| ip.ip.parse().ok())
        .collect();
    if ips.is_empty()
        && let Some(ip) = status
            .and_then(|s| s.pod_ip.as_deref())
            .and_then(|ip| ip.parse().ok())
    {
        ips.push(ip);
    }
    let terminating = pod.metadata.deletion_timestamp.is_some()
        || status
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|phase| phase == "Succeeded" || phase == "Failed");
    let mut ports = pod.spec.as_ref().map_or_else(Vec::new, |spec| {
        let mut ports = declared_ports(&spec.containers);
        // Native sidecars (init containers that keep running) serve like containers do.
        ports.extend(declared_ports(
            spec.init_containers
                .iter()
                .flatten()
                .filter(|c| c.restart_policy.as_deref() == Some("Always")),
        ));
        ports
    });
    ports.sort_unstable();
    ports.dedup();
    Some((
        namespace,
        name,
        PodEntry {
            controller_uid,
            controller_name,
            warm_pool,
            ready,
            name_hash,
            ips,
            ports,
            terminating,
        },
    ))
}

/// The index shared between the watchers (writers) and the proxy (readers).
///
/// Clones share one index. Lookups take the read lock for the time of one hash lookup. Every
/// write wakes those waiting in [`SharedIndex::changed`] once its guard is dropped.
#[derive(Debug, Clone, Default)]
pub struct SharedIndex(Arc<Shared>);

#[derive(Debug, Default)]
struct Shared {
    index: RwLock<Index>,
    changed: tokio::sync::Notify,
}

impl SharedIndex {
    /// An empty, unsynced index.
    pub fn new() -> Self {
        Self::default()
    }

    /// Wraps an index built beforehand.
    pub fn from_index(index: Index) -> Self {
        Self(Arc::new(Shared {
            index: RwLock::new(index),
            changed: tokio::sync::Notify::new(),
        }))
    }

    /// Read access. A writer that panicked cannot have left a summary half-written (each update
    /// is a single map operation), so a poisoned lock is used as is.
    pub fn read(&self) -> RwLockReadGuard<'_, Index> {
        self.0.index.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Write access (see [`Self::read`] on poisoning); waiters are woken when it is dropped.
    pub fn write(&self) -> WriteGuard<'_> {
        WriteGuard {
            guard: self.0.index.write().unwrap_or_else(PoisonError::into_inner),
            changed: &self.0.changed,
        }
    }

    /// Completes at the next write after this call's future is first polled or
    /// [`enable`](tokio::sync::futures::Notified::enable)d: take it before looking, await it
    /// after, and no write in between is missed.
    pub fn changed(&self) -> tokio::sync::futures::Notified<'_> {
        self.0.changed.notified()
    }
}

/// Write access to a [`SharedIndex`]; dropping it wakes the index's waiters.
#[derive(Debug)]
pub struct WriteGuard<'a> {
    guard: RwLockWriteGuard<'a, Index>,
    changed: &'a tokio::sync::Notify,
}

impl std::ops::Deref for WriteGuard<'_> {
    type Target = Index;
    fn deref(&self) -> &Index {
        &self.guard
    }
}

impl std::ops::DerefMut for WriteGuard<'_> {
    fn deref_mut(&mut self) -> &mut Index {
        &mut self.guard
    }
}

impl Drop for WriteGuard<'_> {
    fn drop(&mut self) {
        self.changed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use agent_sandbox_api::SandboxStatus;
    use k8s_openapi::api::core::v1::{ContainerPort, PodIP, PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use pretty_assertions::assert_eq;

    fn owner(kind: &str, name: &str, uid: &str) -> OwnerReference {
        OwnerReference {
            api_version: agent_sandbox_api::API_VERSION.to_owned(),
            kind: kind.to_owned(),
            name: name.to_owned(),
            uid: uid.to_owned(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }

    fn ready(status: &str, reason: &str, message: &str) -> Condition {
        Condition {
            type_: "Ready".to_owned(),
            status: status.to_owned(),
            reason: reason.to_owned(),
            message: message.to_owned(),
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            observed_generation: Some(1),
        }
    }

    fn sandbox(name: &str) -> Sandbox {
        let mut sandbox = Sandbox::new(name, Default::default());
        sandbox.metadata.namespace = Some("default".to_owned());
        sandbox.metadata.uid = Some(format!("uid-{name}"));
        sandbox.status = Some(SandboxStatus {
            conditions: vec![ready("True", "DependenciesReady", "")],
            ..SandboxStatus::default()
        });
        sandbox
    }

    fn pod_of(sandbox: &Sandbox, ip: &str) -> Pod {
        let name = sandbox.metadata.name.clone().unwrap();
        Pod {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: sandbox.metadata.namespace.clone(),
                labels: Some(
                    [(labels::SANDBOX_NAME_HASH.to_owned(), name_hash(&name))]
                        .into_iter()
                        .collect(),
                ),
                owner_references: Some(vec![owner(
                    kinds::SANDBOX,
                    &name,
                    sandbox.metadata.uid.as_deref().unwrap(),
                )]),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "runtime".to_owned(),
                    ports: Some(vec![
                        ContainerPort {
                            container_port: 9000,
                            ..ContainerPort::default()
                        },
                        ContainerPort {
                            container_port: 8888,
                            ..ContainerPort::default()
                        },
                    ]),
                    ..Container::default()
                }],
                init_containers: Some(vec![
                    Container {
                        name: "sidecar".to_owned(),
                        restart_policy: Some("Always".to_owned()),
                        ports: Some(vec![ContainerPort {
                            container_port: 7000,
                            ..ContainerPort::default()
                        }]),
                        ..Container::default()
                    },
                    Container {
                        name: "init".to_owned(),
                        ports: Some(vec![ContainerPort {
                            container_port: 6000,
                            ..ContainerPort::default()
                        }]),
                        ..Container::default()
                    },
                ]),
                ..PodSpec::default()
            }),
            status: Some(PodStatus {
                phase: Some("Running".to_owned()),
                pod_ip: Some(ip.to_owned()),
                pod_ips: Some(vec![PodIP { ip: ip.to_owned() }]),
                ..PodStatus::default()
            }),
        }
    }

    fn synced() -> Index {
        let mut index = Index::new();
        index.reset_sandboxes([]);
        index.reset_pods([]);
        index
    }

    #[test]
    fn a_ready_sandbox_with_its_pod_resolves() {
        let mut index = synced();
        let sandbox = sandbox("box");
        index.apply_sandbox(&sandbox);
        index.apply_pod(&pod_of(&sandbox, "10.0.0.5"));
        assert_eq!(
            index.resolve("default", "box"),
            Ok(Backend {
                idle_ttl: None,
                uid: "uid-box".to_owned(),
                pod: "box".to_owned(),
                ips: vec!["10.0.0.5".parse().unwrap()],
                ports: vec![7000, 8888, 9000],
            })
        );
        assert_eq!(index.len(), (1, 1));
        assert_eq!(
            index.resolve("other", "box"),
            Err(Unroutable::NotFound),
            "namespaces are separate"
        );
    }

    #[test]
    fn unknown_before_and_after_sync() {
        let mut index = Index::new();
        assert_eq!(index.resolve("default", "x"), Err(Unroutable::NotSynced));
        index.reset_sandboxes([]);
        assert!(!index.is_synced());
        assert_eq!(index.sync_state(), (true, false));
        index.reset_pods([]);
        assert!(index.is_synced());
        assert_eq!(index.resolve("default", "x"), Err(Unroutable::NotFound));
    }

    #[test]
    fn pod_name_annotation_wins() {
        let mut index = synced();
        let mut sandbox = sandbox("box");
        sandbox.metadata.annotations = Some(
            [(annotations::POD_NAME.to_owned(), "box-pod".to_owned())]
                .into_iter()
                .collect(),
        );
        let mut pod = pod_of(&sandbox, "10.0.0.6");
        index.apply_sandbox(&sandbox);
        index.apply_pod(&pod);
        assert_eq!(
            index.resolve("default", "box"),
            Err(Unroutable::NoPod {
                pod: "box-pod".to_owned()
            })
        );
        pod.metadata.name = Some("box-pod".to_owned());
        index.apply_pod(&pod);
        assert_eq!(index.resolve("default", "box").unwrap().pod, "box-pod");
    }

    #[test]
    fn warm_pool_members_are_not_routable_until_claimed() {
        let mut index = synced();
        let mut sandbox = sandbox("pool-abcde");
        sandbox.metadata.owner_references =
            Some(vec![owner(kinds::SANDBOX_WARM_POOL, "pool", "uid-pool")]);
        index.apply_sandbox(&sandbox);
        index.apply_pod(&pod_of(&sandbox, "10.0.0.7"));
        assert_eq!(
            index.resolve("default", "pool-abcde"),
            Err(Unroutable::WarmPoolMember {
                pool: "pool".to_owned()
            })
        );
        // Adoption: the claim becomes the controller.
        sandbox.metadata.owner_references =
            Some(vec![owner(kinds::SANDBOX_CLAIM, "claim", "uid-claim")]);
        index.apply_sandbox(&sandbox);
        assert!(index.resolve("default", "pool-abcde").is_ok());
    }

    /// A warm-pool member and its pod as the controller makes them (upstream's labels: the pool
    /// label on both, the pool as the Sandbox's controller).
    fn pool_member(name: &str, pool: &str, ip: &str) -> (Sandbox, Pod) {
        let mut member = sandbox(name);
        member.metadata.owner_references = Some(vec![owner(
            kinds::SANDBOX_WARM_POOL,
            pool,
            &format!("uid-{pool}"),
        )]);
        member.metadata.labels = Some(
            [(labels::WARM_POOL_SANDBOX.to_owned(), name_hash(pool))]
                .into_iter()
                .collect(),
        );
        let mut pod = pod_of(&member, ip);
        pod.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(labels::WARM_POOL_SANDBOX.to_owned(), name_hash(pool));
        pod.status.as_mut().unwrap().conditions =
            Some(vec![k8s_openapi::api::core::v1::PodCondition {
                type_: "Ready".to_owned(),
                status: "True".to_owned(),
                ..Default::default()
            }]);
        (member, pod)
    }

    /// Adoption as the claim controller does it: the claim becomes the controller and the pool
    /// label goes, from the Sandbox in the same write, from the pod in the next.
    fn adopt(member: &mut Sandbox, pod: &mut Pod) {
        member.metadata.owner_references =
            Some(vec![owner(kinds::SANDBOX_CLAIM, "claim", "uid-claim")]);
        member.metadata.labels = None;
        pod.metadata
            .labels
            .as_mut()
            .unwrap()
            .remove(labels::WARM_POOL_SANDBOX);
    }

    #[test]
    fn unclaimed_pool_members_are_never_routable_with_sandboxes_or_from_pods_alone() {
        let (mut member, mut pod) = pool_member("pool-x7k2p", "pool", "10.0.0.7");
        let mut orphan = member.clone();
        orphan.metadata.name = Some("pool-orphan".to_owned());
        orphan.metadata.uid = Some("uid-pool-orphan".to_owned());
        // Its pool was deleted with orphaning: the next pool of that name takes it back and
        // hands it to a claim, so it is a member still.
        orphan.metadata.owner_references = None;
        let orphan_pod = pod_of(&orphan, "10.0.0.8");

        let mut full = synced();
        full.apply_sandbox(&member);
        full.apply_pod(&pod);
        full.apply_sandbox(&orphan);
        full.apply_pod(&orphan_pod);
        let mut pods_only = Index::new();
        pods_only.set_pods_only(true);
        pods_only.reset_pods([&pod]);

        assert_eq!(
            full.resolve("default", "pool-x7k2p"),
            Err(Unroutable::WarmPoolMember {
                pool: "pool".to_owned()
            })
        );
        assert_eq!(
            full.resolve("default", "pool-orphan"),
            Err(Unroutable::WarmPoolMember {
                pool: format!("with name hash {}", name_hash("pool"))
            })
        );
        assert_eq!(
            pods_only.resolve("default", "pool-x7k2p"),
            Err(Unroutable::WarmPoolMember {
                pool: format!("with name hash {}", name_hash("pool"))
            })
        );

        // Claimed: the Sandbox decides with Sandboxes, at once; from pods alone, once the
        // controller has taken the label off the pod.
        let labelled_pod = pod.clone();
        adopt(&mut member, &mut pod);
        full.apply_sandbox(&member);
        assert!(full.resolve("default", "pool-x7k2p").is_ok());
        pods_only.apply_pod(&labelled_pod);
        assert!(matches!(
            pods_only.resolve("default", "pool-x7k2p"),
            Err(Unroutable::WarmPoolMember { .. })
        ));
        full.apply_pod(&pod);
        pods_only.apply_pod(&pod);
        assert_eq!(
            full.resolve("default", "pool-x7k2p"),
            pods_only.resolve("default", "pool-x7k2p")
        );
        assert_eq!(
            pods_only.resolve("default", "pool-x7k2p").unwrap().pod,
            "pool-x7k2p"
        );
    }

    #[test]
    fn not_ready_says_why() {
        let mut index = synced();
        let mut sandbox = sandbox("box");
        sandbox.status = Some(SandboxStatus {
            conditions: vec![ready(
                "False",
                "DependenciesNotReady",
                "Pod exists with phase: Pending",
            )],
            ..SandboxStatus::default()
        });
        index.apply_sandbox(&sandbox);
        let error = index.resolve("default", "box").unwrap_err();
        assert_eq!(
            error.describe("default", "box"),
            "Sandbox default/box is not Ready: DependenciesNotReady: Pod exists with phase: Pending"
        );
        sandbox.status = None;
        index.apply_sandbox(&sandbox);
        assert_eq!(
            index
                .resolve("default", "box")
                .unwrap_err()
                .describe("default", "box"),
            "Sandbox default/box is not Ready yet (no Ready condition)."
        );
    }

    #[test]
    fn pods_must_belong_to_the_sandbox() {
        let mut index = synced();
        let sandbox = sandbox("box");
        index.apply_sandbox(&sandbox);
        let good = pod_of(&sandbox, "10.0.0.8");

        // Controlled by another UID (a recreated sandbox's stale pod).
        let mut stranger = good.clone();
        stranger.metadata.owner_references = Some(vec![owner(kinds::SANDBOX, "box", "uid-old")]);
        index.apply_pod(&stranger);
        assert_eq!(
            index.resolve("default", "box"),
            Err(Unroutable::PodNotControlled {
                pod: "box".to_owned()
            })
        );
        // Owned but not as controller.
        let mut weak = good.clone();
        weak.metadata.owner_references.as_mut().unwrap()[0].controller = None;
        index.apply_pod(&weak);
        assert!(matches!(
            index.resolve("default", "box"),
            Err(Unroutable::PodNotControlled { .. })
        ));
        // Wrong name hash.
        let mut mislabelled = good.clone();
        mislabelled.metadata.labels = Some(
            [(labels::SANDBOX_NAME_HASH.to_owned(), "00000000".to_owned())]
                .into_iter()
                .collect(),
        );
        index.apply_pod(&mislabelled);
        assert!(matches!(
            index.resolve("default", "box"),
            Err(Unroutable::PodNotControlled { .. })
        ));
        // Terminating, then without IP.
        let mut terminating = good.clone();
        terminating.metadata.deletion_timestamp =
            Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        index.apply_pod(&terminating);
        assert!(matches!(
            index.resolve("default", "box"),
            Err(Unroutable::PodTerminating { .. })
        ));
        let mut pending = good.clone();
        pending.status = Some(PodStatus::default());
        index.apply_pod(&pending);
        assert!(matches!(
            index.resolve("default", "box"),
            Err(Unroutable::NoPodIp { .. })
        ));
        index.apply_pod(&good);
        assert!(index.resolve("default", "box").is_ok());
    }

    #[test]
    fn deletes_and_resets() {
        let mut index = synced();
        let a = sandbox("a");
        let b = sandbox("b");
        index.apply_sandbox(&a);
        index.apply_pod(&pod_of(&a, "10.0.0.1"));
        index.delete_pod("default", "a");
        assert!(matches!(
            index.resolve("default", "a"),
            Err(Unroutable::NoPod { .. })
        ));
        index.delete_sandbox("default", "a");
        assert_eq!(index.resolve("default", "a"), Err(Unroutable::NotFound));
        assert!(index.is_empty());

        index.apply_sandbox(&a);
        index.reset_sandboxes([&b]);
        index.reset_pods([&pod_of(&b, "10.0.0.2")]);
        assert_eq!(index.resolve("default", "a"), Err(Unroutable::NotFound));
        assert!(index.resolve("default", "b").is_ok());
        assert_eq!(index.len(), (1, 1));
    }

    #[test]
    fn dual_stack_and_legacy_pod_ip() {
        let mut index = synced();
        let sandbox = sandbox("box");
        index.apply_sandbox(&sandbox);
        let mut pod = pod_of(&sandbox, "10.0.0.9");
        pod.status.as_mut().unwrap().pod_ips = Some(vec![
            PodIP {
                ip: "10.0.0.9".to_owned(),
            },
            PodIP {
                ip: "fd00::9".to_owned(),
            },
        ]);
        index.apply_pod(&pod);
        assert_eq!(
            index.resolve("default", "box").unwrap().ips,
            vec![
                "10.0.0.9".parse::<IpAddr>().unwrap(),
                "fd00::9".parse().unwrap()
            ]
        );
        pod.status.as_mut().unwrap().pod_ips = None;
        index.apply_pod(&pod);
        assert_eq!(
            index.resolve("default", "box").unwrap().ips,
            vec!["10.0.0.9".parse::<IpAddr>().unwrap()]
        );
    }

    #[test]
    fn pods_only_routes_from_pods_alone() {
        let mut index = Index::new();
        index.set_pods_only(true);
        index.apply_sandbox(&sandbox("ignored"));
        assert_eq!(index.resolve("default", "box"), Err(Unroutable::NotSynced));
        index.reset_pods([]);
        assert!(index.is_synced());
        assert_eq!(index.resolve("default", "box"), Err(Unroutable::NotFound));

        let sandbox = sandbox("box");
        let mut pod = pod_of(&sandbox, "10.0.0.5");
        index.apply_pod(&pod);
        assert_eq!(
            index.resolve("default", "box"),
            Err(Unroutable::NotReady {
                reason: "PodNotReady".to_owned(),
                message: "pod box is not Ready".to_owned()
            })
        );
        pod.status.as_mut().unwrap().conditions =
            Some(vec![k8s_openapi::api::core::v1::PodCondition {
                type_: "Ready".to_owned(),
                status: "True".to_owned(),
                ..Default::default()
            }]);
        index.apply_pod(&pod);
        assert_eq!(
            index.resolve("default", "box"),
            Ok(Backend {
                idle_ttl: None,
                uid: "uid-box".to_owned(),
                pod: "box".to_owned(),
                ips: vec!["10.0.0.5".parse().unwrap()],
                ports: vec![7000, 8888, 9000],
            })
        );
        // A pod named otherwise (the pod-name annotation) is found by its controller.
        let mut renamed = pod.clone();
        renamed.metadata.name = Some("box-pod".to_owned());
        index.delete_pod("default", "box");
        index.apply_pod(&renamed);
        assert_eq!(index.resolve("default", "box").unwrap().pod, "box-pod");
        // An unclaimed warm-pool member, a wrong name hash, a terminating pod: not routable.
        let mut member = renamed.clone();
        member
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(labels::WARM_POOL_SANDBOX.to_owned(), "abcd1234".to_owned());
        index.apply_pod(&member);
        assert!(matches!(
            index.resolve("default", "box"),
            Err(Unroutable::WarmPoolMember { .. })
        ));
        let mut mislabelled = renamed.clone();
        mislabelled.metadata.labels = Some(
            [(labels::SANDBOX_NAME_HASH.to_owned(), "00000000".to_owned())]
                .into_iter()
                .collect(),
        );
        index.apply_pod(&mislabelled);
        assert!(matches!(
            index.resolve("default", "box"),
            Err(Unroutable::PodNotControlled { .. })
        ));
        let mut terminating = renamed.clone();
        terminating.metadata.deletion_timestamp =
            Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        index.apply_pod(&terminating);
        assert!(matches!(
            index.resolve("default", "box"),
            Err(Unroutable::PodTerminating { .. })
        ));
        // A complete list of Sandboxes ends pods-only mode: the Sandbox is required again.
        index.apply_pod(&renamed);
        index.reset_sandboxes([]);
        assert!(!index.is_pods_only());
        assert_eq!(index.resolve("default", "box"), Err(Unroutable::NotFound));
    }

    #[test]
    fn objects_without_identity_are_ignored() {
        let mut index = synced();
        let mut nameless = sandbox("x");
        nameless.metadata.uid = None;
        index.apply_sandbox(&nameless);
        let mut pod = pod_of(&sandbox("y"), "10.0.0.1");
        pod.metadata.namespace = None;
        index.apply_pod(&pod);
        assert!(index.is_empty());
    }
}
