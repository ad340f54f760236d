//! Decisions of the Sandbox reconciler: the pod, PVCs and Service a sandbox needs, the metadata
//! patch for a live pod, expiry, and the status.
//!
//! Upstream's behaviour (`../shared/spec/upstream-compat.md` §2.1) is the reference; the
//! differences are listed in `docs/controller.md`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use agent_sandbox_api::conditions::sandbox as cond;
use agent_sandbox_api::sandbox::{OperatingMode, SandboxStatus};
use agent_sandbox_api::{Sandbox, annotations, kinds, labels, name_hash};
use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimVolumeSource, Pod, PodSpec, Service, ServicePort,
    ServiceSpec, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Map, Value, json};

use super::{
    Ownership, condition, controller_of, controller_reference, find_condition, is_system_key,
    normalize_created_by, ownership, remaining, remove_condition, set_condition,
};

/// Name of the pod that backs `sandbox`: the `pod-name` annotation, else the sandbox's name.
pub fn pod_name(sandbox: &Sandbox) -> String {
    sandbox
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(annotations::POD_NAME))
        .filter(|name| !name.is_empty())
        .cloned()
        .unwrap_or_else(|| sandbox.metadata.name.clone().unwrap_or_default())
}

/// Value of the name-hash label of the sandbox's pod, Service and PVCs.
pub fn sandbox_hash(sandbox: &Sandbox) -> String {
    name_hash(sandbox.metadata.name.as_deref().unwrap_or_default())
}

/// The label selector written to `status.selector`.
pub fn selector(sandbox: &Sandbox) -> String {
    format!("{}={}", labels::SANDBOX_NAME_HASH, sandbox_hash(sandbox))
}

fn uid(sandbox: &Sandbox) -> &str {
    sandbox.metadata.uid.as_deref().unwrap_or_default()
}

/// True when the sandbox's controller is one of the extension kinds (pool or claim).
fn controller_kind(sandbox: &Sandbox) -> Option<(&str, &str)> {
    controller_of(&sandbox.metadata).map(|reference| {
        let group = reference.api_version.split('/').next().unwrap_or_default();
        (group, reference.kind.as_str())
    })
}

/// Labels the pod carries because of who owns the sandbox, as upstream sets them: the
/// template-ref hash while an extension kind (pool or claim) controls it, and the pool label
/// while a pool does.
///
/// The pool label is how a router that may read pods but not Sandboxes (upstream's Go router
/// RBAC, ours in its pods-only mode) tells an unclaimed member, which must not be reached, from
/// a claimed sandbox. Adoption takes it off the Sandbox, and the pod's metadata patch then takes
/// it off the pod: one pod write per warm claim.
pub fn extension_pod_labels(sandbox: &Sandbox) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    if owning_pool(sandbox).is_some()
        && let Some(value) = sandbox
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(labels::WARM_POOL_SANDBOX))
        && !value.is_empty()
    {
        out.insert(labels::WARM_POOL_SANDBOX.to_owned(), value.clone());
    }
    if let Some((group, _)) = controller_kind(sandbox)
        && group == agent_sandbox_api::EXTENSIONS_GROUP
        && let Some(value) = sandbox
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(labels::SANDBOX_TEMPLATE_REF_HASH))
        && !value.is_empty()
    {
        out.insert(labels::SANDBOX_TEMPLATE_REF_HASH.to_owned(), value.clone());
    }
    out
}

fn template_labels(sandbox: &Sandbox) -> impl Iterator<Item = (&String, &String)> {
    sandbox
        .spec
        .blueprint
        .pod_template
        .metadata
        .labels
        .iter()
        .filter(|(key, _)| !is_system_key(key))
}

fn is_system_annotation(key: &str) -> bool {
    is_system_key(key) || key == annotations::TRACE_CONTEXT
}

fn template_annotations(sandbox: &Sandbox) -> impl Iterator<Item = (&String, &String)> {
    sandbox
        .spec
        .blueprint
        .pod_template
        .metadata
        .annotations
        .iter()
        .filter(|(key, _)| !is_system_annotation(key))
}

fn created_by(sandbox: &Sandbox) -> Option<&'static str> {
    sandbox
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(labels::CREATED_BY))
        .filter(|value| !value.is_empty())
        .map(|value| normalize_created_by(value))
}

/// The labels and annotations a pod of `sandbox` must carry (complete, for a new pod).
pub fn pod_metadata(sandbox: &Sandbox) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let mut pod_labels: BTreeMap<String, String> = template_labels(sandbox)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let propagated_labels: Vec<&str> = template_labels(sandbox).map(|(k, _)| k.as_str()).collect();
    pod_labels.insert(labels::SANDBOX_NAME_HASH.to_owned(), sandbox_hash(sandbox));
    pod_labels.extend(extension_pod_labels(sandbox));
    if let Some(created_by) = created_by(sandbox) {
        pod_labels.insert(labels::CREATED_BY.to_owned(), created_by.to_owned());
    }

    let mut pod_annotations: BTreeMap<String, String> = template_annotations(sandbox)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let propagated_annotations: Vec<&str> = template_annotations(sandbox)
        .map(|(k, _)| k.as_str())
        .collect();
    // Keys come from BTreeMaps, so they are already sorted as upstream sorts them.
    if !propagated_labels.is_empty() {
        pod_annotations.insert(
            annotations::PROPAGATED_LABELS.to_owned(),
            propagated_labels.join(","),
        );
    }
    if !propagated_annotations.is_empty() {
        pod_annotations.insert(
            annotations::PROPAGATED_ANNOTATIONS.to_owned(),
            propagated_annotations.join(","),
        );
    }
    (pod_labels, pod_annotations)
}

/// PVC-backed volumes, one per volume claim template, named after the template.
fn pvc_volumes(sandbox: &Sandbox) -> Vec<Volume> {
    let sandbox_name = sandbox.metadata.name.as_deref().unwrap_or_default();
    sandbox
        .spec
        .blueprint
        .volume_claim_templates
        .iter()
        .map(|template| Volume {
            name: template.metadata.name.clone(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: format!("{}-{sandbox_name}", template.metadata.name),
                read_only: None,
            }),
            ..Volume::default()
        })
        .collect()
}

/// The pod spec: the template's, with PVC-backed volumes replacing same-named template volumes
/// (StatefulSet semantics).
pub fn pod_spec(sandbox: &Sandbox) -> PodSpec {
    let mut spec = sandbox.spec.blueprint.pod_template.spec.clone();
    let claimed = pvc_volumes(sandbox);
    if !claimed.is_empty() {
        let names: BTreeSet<&str> = claimed.iter().map(|v| v.name.as_str()).collect();
        let mut volumes: Vec<Volume> = spec
            .volumes
            .take()
            .unwrap_or_default()
            .into_iter()
            .filter(|volume| !names.contains(volume.name.as_str()))
            .collect();
        volumes.extend(claimed);
        spec.volumes = Some(volumes);
    }
    spec
}

/// The pod to create for `sandbox`: named after the sandbox, controlled by it.
pub fn desired_pod(sandbox: &Sandbox) -> Pod {
    let (pod_labels, pod_annotations) = pod_metadata(sandbox);
    Pod {
        metadata: ObjectMeta {
            name: sandbox.metadata.name.clone(),
            namespace: sandbox.metadata.namespace.clone(),
            labels: Some(pod_labels),
            annotations: (!pod_annotations.is_empty()).then_some(pod_annotations),
            owner_references: Some(vec![controller_reference(sandbox)]),
            ..ObjectMeta::default()
        },
        spec: Some(pod_spec(sandbox)),
        status: None,
    }
}

/// The JSON merge patch that brings a live pod's labels and annotations to what `sandbox` asks
/// for, without touching its spec (so it is not restarted). `None` when nothing differs.
///
/// Keys the controller propagated earlier (listed in the pod's `propagated-*` annotations) and
/// no longer in the template are removed; keys someone else put on the pod are left alone.
pub fn pod_metadata_patch(sandbox: &Sandbox, pod: &Pod) -> Option<Value> {
    let current_labels = pod.metadata.labels.clone().unwrap_or_default();
    let current_annotations = pod.metadata.annotations.clone().unwrap_or_default();
    let (want_labels, want_annotations) = pod_metadata(sandbox);

    let mut label_patch = Map::new();
    let mut annotation_patch = Map::new();

    for (key, value) in &want_labels {
        if current_labels.get(key) != Some(value) {
            label_patch.insert(key.clone(), json!(value));
        }
    }
    // Previously propagated template labels that the template dropped.
    let previously_propagated = |annotation: &str| -> Vec<String> {
        current_annotations
            .get(annotation)
            .map(|list| {
                list.split(',')
                    .filter(|k| !k.is_empty())
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    };
    for key in previously_propagated(annotations::PROPAGATED_LABELS) {
        if key != labels::SANDBOX_NAME_HASH
            && !want_labels.contains_key(&key)
            && current_labels.contains_key(&key)
        {
            label_patch.insert(key, Value::Null);
        }
    }
    // Labels derived from ownership and creator follow the sandbox.
    for key in [
        labels::SANDBOX_TEMPLATE_REF_HASH,
        labels::CREATED_BY,
        labels::WARM_POOL_SANDBOX,
    ] {
        if !want_labels.contains_key(key) && current_labels.contains_key(key) {
            label_patch.insert(key.to_owned(), Value::Null);
        }
    }

    for (key, value) in &want_annotations {
        if current_annotations.get(key) != Some(value) {
            annotation_patch.insert(key.clone(), json!(value));
        }
    }
    for key in previously_propagated(annotations::PROPAGATED_ANNOTATIONS) {
        if !want_annotations.contains_key(&key) && current_annotations.contains_key(&key) {
            annotation_patch.insert(key, Value::Null);
        }
    }
    for key in [
        annotations::PROPAGATED_LABELS,
        annotations::PROPAGATED_ANNOTATIONS,
    ] {
        if !want_annotations.contains_key(key) && current_annotations.contains_key(key) {
            annotation_patch.insert(key.to_owned(), Value::Null);
        }
    }

    if label_patch.is_empty() && annotation_patch.is_empty() {
        return None;
    }
    let mut metadata = Map::new();
    if !label_patch.is_empty() {
        metadata.insert("labels".into(), Value::Object(label_patch));
    }
    if !annotation_patch.is_empty() {
        metadata.insert("annotations".into(), Value::Object(annotation_patch));
    }
    Some(json!({ "metadata": metadata }))
}

/// Service ports derived from the containers' ports (and restartable init containers'):
/// de-duplicated by (port, protocol), sorted, named by the first explicit container-port name or
/// `p-<port>-<protocol>` (with `-2`, `-3`... on a collision).
pub fn service_ports(spec: &PodSpec) -> Vec<ServicePort> {
    let mut names: BTreeMap<(i32, String), String> = BTreeMap::new();
    let mut reserved: BTreeSet<String> = BTreeSet::new();
    let restartable_init = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| c.restart_policy.as_deref() == Some("Always"));
    for container in spec.containers.iter().chain(restartable_init) {
        for port in container.ports.iter().flatten() {
            if port.container_port == 0 {
                continue;
            }
            let protocol = port.protocol.clone().unwrap_or_else(|| "TCP".to_owned());
            let entry = names.entry((port.container_port, protocol)).or_default();
            if let Some(name) = port.name.as_ref().filter(|n| !n.is_empty())
                && entry.is_empty()
                && !reserved.contains(name)
            {
                *entry = name.clone();
                reserved.insert(name.clone());
            }
        }
    }
    names
        .into_iter()
        .map(|((port, protocol), explicit)| {
            let name = if explicit.is_empty() {
                let base = format!("p-{port}-{}", protocol.to_lowercase());
                let mut candidate = base.clone();
                let mut suffix = 2;
                while reserved.contains(&candidate) {
                    candidate = format!("{base}-{suffix}");
                    suffix += 1;
                }
                reserved.insert(candidate.clone());
                candidate
            } else {
                explicit
            };
            ServicePort {
                name: Some(name),
                protocol: Some(protocol),
                port,
                target_port: Some(IntOrString::Int(port)),
                ..ServicePort::default()
            }
        })
        .collect()
}

/// The headless Service for `sandbox` (only created when `spec.service` is `true`).
pub fn desired_service(sandbox: &Sandbox) -> Service {
    let hash = sandbox_hash(sandbox);
    let ports = service_ports(&sandbox.spec.blueprint.pod_template.spec);
    Service {
        metadata: ObjectMeta {
            name: sandbox.metadata.name.clone(),
            namespace: sandbox.metadata.namespace.clone(),
            labels: Some(BTreeMap::from([(
                labels::SANDBOX_NAME_HASH.to_owned(),
                hash.clone(),
            )])),
            owner_references: Some(vec![controller_reference(sandbox)]),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".to_owned()),
            selector: Some(BTreeMap::from([(
                labels::SANDBOX_NAME_HASH.to_owned(),
                hash,
            )])),
            ports: (!ports.is_empty()).then_some(ports),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

/// The merge patch that corrects drift of an owned Service (labels, selector, ports), if any.
pub fn service_drift_patch(sandbox: &Sandbox, service: &Service) -> Option<Value> {
    let desired = desired_service(sandbox);
    let desired_spec = desired.spec.unwrap_or_default();
    let spec = service.spec.clone().unwrap_or_default();
    let hash = sandbox_hash(sandbox);
    let mut patch = Map::new();
    if service
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(labels::SANDBOX_NAME_HASH))
        != Some(&hash)
    {
        patch.insert(
            "metadata".into(),
            json!({"labels": {labels::SANDBOX_NAME_HASH: hash}}),
        );
    }
    let mut spec_patch = Map::new();
    if spec.selector != desired_spec.selector {
        // A merge patch merges maps: replace the selector by nulling unknown keys.
        let mut selector = Map::new();
        for key in spec.selector.iter().flatten().map(|(k, _)| k) {
            selector.insert(key.clone(), Value::Null);
        }
        for (key, value) in desired_spec.selector.iter().flatten() {
            selector.insert(key.clone(), json!(value));
        }
        spec_patch.insert("selector".into(), Value::Object(selector));
    }
    if sandbox.spec.blueprint.service == Some(true)
        && !ports_equal(spec.ports.as_deref(), desired_spec.ports.as_deref())
    {
        spec_patch.insert(
            "ports".into(),
            json!(desired_spec.ports.unwrap_or_default()),
        );
    }
    if !spec_patch.is_empty() {
        patch.insert("spec".into(), Value::Object(spec_patch));
    }
    (!patch.is_empty()).then_some(Value::Object(patch))
}

fn ports_equal(a: Option<&[ServicePort]>, b: Option<&[ServicePort]>) -> bool {
    let a = a.unwrap_or_default();
    let b = b.unwrap_or_default();
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            x.name == y.name
                && x.protocol == y.protocol
                && x.port == y.port
                && x.target_port == y.target_port
        })
}

/// The PVCs of `sandbox`, `<template>-<sandbox>`, controlled by it.
pub fn desired_pvcs(sandbox: &Sandbox) -> Vec<PersistentVolumeClaim> {
    let sandbox_name = sandbox.metadata.name.as_deref().unwrap_or_default();
    let hash = sandbox_hash(sandbox);
    sandbox
        .spec
        .blueprint
        .volume_claim_templates
        .iter()
        .map(|template| {
            let mut pvc_labels = template.metadata.labels.clone();
            pvc_labels.insert(labels::SANDBOX_NAME_HASH.to_owned(), hash.clone());
            PersistentVolumeClaim {
                metadata: ObjectMeta {
                    name: Some(format!("{}-{sandbox_name}", template.metadata.name)),
                    namespace: sandbox.metadata.namespace.clone(),
                    labels: Some(pvc_labels),
                    annotations: (!template.metadata.annotations.is_empty())
                        .then(|| template.metadata.annotations.clone()),
                    owner_references: Some(vec![controller_reference(sandbox)]),
                    ..ObjectMeta::default()
                },
                spec: Some(template.spec.clone()),
                status: None,
            }
        })
        .collect()
}

/// What to do with an existing child object (Pod, Service or PVC) found under the sandbox's name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChildDecision {
    /// Ours: use it.
    Use,
    /// Unowned but authorised (adoptable label or our name-hash label): take it over.
    Adopt,
    /// Refuse, with the reason (it belongs to someone else or is not authorised).
    Refuse(String),
}

/// Whether an existing child named for `sandbox` may be used, adopted, or must be refused.
pub fn child_decision(sandbox: &Sandbox, kind: &str, child: &ObjectMeta) -> ChildDecision {
    let name = child.name.as_deref().unwrap_or_default();
    let sandbox_name = sandbox.metadata.name.as_deref().unwrap_or_default();
    match ownership(child, uid(sandbox)) {
        Ownership::Owned => ChildDecision::Use,
        Ownership::OwnedByOther(owner) => ChildDecision::Refuse(format!(
            "{kind} {name:?} is owned by {}/{} (UID: {}), not by sandbox {sandbox_name:?}",
            owner.kind, owner.name, owner.uid
        )),
        Ownership::Unowned => {
            let child_labels = child.labels.clone().unwrap_or_default();
            let adoptable = child_labels
                .get(labels::ADOPTABLE)
                .is_some_and(|v| v == "true");
            let tracked =
                child_labels.get(labels::SANDBOX_NAME_HASH) == Some(&sandbox_hash(sandbox));
            if adoptable || tracked {
                ChildDecision::Adopt
            } else {
                ChildDecision::Refuse(format!(
                    "cannot adopt unowned {kind} {name:?}: it carries neither {}=true nor {}={}",
                    labels::ADOPTABLE,
                    labels::SANDBOX_NAME_HASH,
                    sandbox_hash(sandbox)
                ))
            }
        }
    }
}

/// The merge patch that makes `sandbox` the controller of an unowned child (adds the
/// ownerReference and the name-hash label; the resourceVersion makes it conditional).
pub fn adopt_child_patch(sandbox: &Sandbox, child: &ObjectMeta) -> Value {
    let mut references = child.owner_references.clone().unwrap_or_default();
    references.push(controller_reference(sandbox));
    json!({
        "metadata": {
            "resourceVersion": child.resource_version,
            "ownerReferences": references,
            "labels": { labels::SANDBOX_NAME_HASH: sandbox_hash(sandbox) },
        }
    })
}

/// Where a sandbox stands against its `shutdownTime`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expiry {
    /// No `shutdownTime`.
    Never,
    /// Expires after this long.
    In(Duration),
    /// `shutdownTime` has passed.
    Expired,
}

/// Where `sandbox` stands at `now`.
pub fn expiry(sandbox: &Sandbox, now: Timestamp) -> Expiry {
    match &sandbox.spec.lifecycle.shutdown_time {
        None => Expiry::Never,
        Some(time) => match remaining(time.0, now) {
            Some(left) => Expiry::In(left),
            None => Expiry::Expired,
        },
    }
}

/// What the idle lifecycle (`spec.idleLifecycle`) asks of a sandbox now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Idle {
    /// Nothing now; look again after this long (`None`: nothing is due, ever, as things stand).
    Wait(Option<Duration>),
    /// Suspend it ([`agent_sandbox_api::sandbox::suspend_patch`], marked as idle).
    Suspend,
    /// Delete it: its claim when a SandboxClaim controls it (the sandbox goes with the claim),
    /// else the Sandbox.
    Delete,
    /// Remove a stale idle-suspension mark: the sandbox runs again, resumed by someone who
    /// did not remove it (`kubectl edit`).
    ClearMark,
    /// Resume it ([`agent_sandbox_api::sandbox::resume_patch`]): it is suspended and a router
    /// recorded activity after it was (a request arrived for it).
    Resume,
}

fn annotation_time(sandbox: &Sandbox, key: &str) -> Option<Timestamp> {
    sandbox
        .metadata
        .annotations
        .as_ref()?
        .get(key)?
        .parse()
        .ok()
}

/// Since when a running sandbox counts as active: the latest of its creation, the last
/// activity routers recorded, the time it was adopted or resumed ([`annotations::ACTIVE_SINCE`])
/// and the time it stopped being suspended.
pub fn active_since(sandbox: &Sandbox) -> Timestamp {
    let created = sandbox
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(Timestamp::UNIX_EPOCH, |t| t.0);
    let status = sandbox.status.as_ref();
    let activity = status
        .and_then(|s| s.last_activity_time.as_ref())
        .map(|t| t.0);
    let unsuspended = status
        .and_then(|s| find_condition(&s.conditions, cond::SUSPENDED))
        .filter(|c| c.status == "False")
        .map(|c| c.last_transition_time.0);
    [
        Some(created),
        activity,
        unsuspended,
        annotation_time(sandbox, annotations::ACTIVE_SINCE),
    ]
    .into_iter()
    .flatten()
    .max()
    .unwrap_or(created)
}

fn seconds(value: i64) -> Duration {
    Duration::from_secs(u64::try_from(value).unwrap_or(0))
}

/// What `sandbox`'s idle lifecycle asks at `now`. Unclaimed warm-pool members never idle out
/// (nothing reaches them); a sandbox that is being deleted is left alone by the caller.
pub fn idle(sandbox: &Sandbox, now: Timestamp) -> Idle {
    use agent_sandbox_api::sandbox::{ActiveExpirationPolicy, SuspendedExpirationPolicy};
    let marked = annotation_time(sandbox, annotations::IDLE_SUSPENDED_AT);
    let running = sandbox.spec.operating_mode == OperatingMode::Running;
    if running && marked.is_some() {
        return Idle::ClearMark;
    }
    if !running {
        // Any suspension, the idle lifecycle's or not, wakes on traffic.
        let status = sandbox.status.as_ref();
        let suspended = status
            .and_then(|s| find_condition(&s.conditions, cond::SUSPENDED))
            .filter(|c| c.status == "True")
            .map(|c| c.last_transition_time.0);
        let since = marked.into_iter().chain(suspended).max();
        let activity = status
            .and_then(|s| s.last_activity_time.as_ref())
            .map(|t| t.0);
        if let (Some(since), Some(activity)) = (since, activity)
            && activity > since
        {
            return Idle::Resume;
        }
    }
    let Some(lifecycle) = &sandbox.spec.idle_lifecycle else {
        return Idle::Wait(None);
    };
    if owning_pool(sandbox).is_some() {
        return Idle::Wait(None);
    }
    if running {
        let Some(ttl) = lifecycle.active_ttl_seconds.filter(|ttl| *ttl > 0) else {
            return Idle::Wait(None);
        };
        return match remaining(super::after(active_since(sandbox), seconds(ttl)), now) {
            Some(left) => Idle::Wait(Some(left)),
            None => match lifecycle.active_expiration_policy.unwrap_or_default() {
                ActiveExpirationPolicy::Suspend => Idle::Suspend,
                ActiveExpirationPolicy::Delete => Idle::Delete,
            },
        };
    }
    // Suspended: only a suspension of the idle lifecycle's own expires.
    let (Some(at), Some(ttl)) = (marked, lifecycle.suspended_ttl_seconds.filter(|t| *t > 0)) else {
        return Idle::Wait(None);
    };
    match remaining(super::after(at, seconds(ttl)), now) {
        Some(left) => Idle::Wait(Some(left)),
        None => match lifecycle.suspended_expiration_policy.unwrap_or_default() {
            SuspendedExpirationPolicy::Delete => Idle::Delete,
            SuspendedExpirationPolicy::Retain => Idle::Wait(None),
        },
    }
}

/// The claim that controls `sandbox`, if a SandboxClaim does (its name).
pub fn owning_claim(sandbox: &Sandbox) -> Option<&str> {
    controller_of(&sandbox.metadata)
        .filter(|owner| {
            owner.kind == kinds::SANDBOX_CLAIM
                && owner.api_version.split('/').next() == Some(agent_sandbox_api::EXTENSIONS_GROUP)
        })
        .map(|owner| owner.name.as_str())
}

/// True once the sandbox's status says it expired (the first expiry pass has run).
pub fn marked_expired(sandbox: &Sandbox) -> bool {
    sandbox
        .status
        .as_ref()
        .and_then(|status| find_condition(&status.conditions, cond::READY))
        .is_some_and(|ready| ready.reason == cond::REASON_EXPIRED)
}

/// The status after the first expiry pass: `Ready=False/SandboxExpired`, `PodScheduled` gone.
pub fn expired_status(
    sandbox: &Sandbox,
    now: Timestamp,
    clear_other_fields: bool,
) -> SandboxStatus {
    let mut status = sandbox.status.clone().unwrap_or_default();
    if clear_other_fields {
        status = SandboxStatus {
            conditions: status.conditions,
            ..SandboxStatus::default()
        };
    }
    set_condition(
        &mut status.conditions,
        condition(
            cond::READY,
            false,
            cond::REASON_EXPIRED,
            cond::MESSAGE_EXPIRED,
            sandbox.metadata.generation,
        ),
        now,
    );
    remove_condition(&mut status.conditions, cond::POD_SCHEDULED);
    status
}

/// What went wrong in a reconcile pass, as far as the status is concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    /// More than one pod is controlled by the sandbox.
    MultiplePods(usize),
    /// The API server refused the pod as invalid (its message): terminal until the spec changes.
    InvalidPodTemplate(String),
    /// Any other failure, with its message.
    Error(String),
}

impl Problem {
    /// The message upstream writes for multiple pods.
    pub fn multiple_pods_message(count: usize) -> String {
        format!(
            "multiple Pods ({count}) are controlled by this Sandbox; refusing to choose or create a Pod"
        )
    }
}

/// What a reconcile pass observed, for [`status`].
#[derive(Clone, Debug, Default)]
pub struct Observed<'a> {
    /// The sandbox's pod, owned or not (absent when there is none or it could not be read).
    pub pod: Option<&'a Pod>,
    /// The pod could not be looked up at all.
    pub pod_lookup_failed: bool,
    /// The sandbox's Service, when it has one.
    pub service: Option<&'a Service>,
    /// The first problem of the pass, if any.
    pub problem: Option<Problem>,
}

fn pod_phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
}

fn pod_ips(pod: &Pod) -> Vec<String> {
    let status = pod.status.as_ref();
    let mut ips: Vec<String> = status
        .and_then(|s| s.pod_ips.as_ref())
        .map(|ips| ips.iter().map(|ip| ip.ip.clone()).collect())
        .unwrap_or_default();
    if ips.is_empty()
        && let Some(ip) = status.and_then(|s| s.pod_ip.clone())
    {
        ips.push(ip);
    }
    ips
}

fn pod_condition<'a>(
    pod: &'a Pod,
    type_: &str,
) -> Option<&'a k8s_openapi::api::core::v1::PodCondition> {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|conditions| conditions.iter().find(|c| c.type_ == type_))
}

/// The status a reconcile pass should write, given what it observed.
pub fn status(
    sandbox: &Sandbox,
    observed: &Observed<'_>,
    cluster_domain: &str,
    now: Timestamp,
) -> SandboxStatus {
    let mut status = sandbox.status.clone().unwrap_or_default();
    let owned_pod = observed
        .pod
        .filter(|pod| ownership(&pod.metadata, uid(sandbox)) == Ownership::Owned);
    set_pod_fields(&mut status, sandbox, observed.pod, owned_pod);
    set_service_fields(&mut status, observed.service, cluster_domain);
    let conditions = &mut status.conditions;
    // Suspended: always written.
    set_condition(
        conditions,
        suspended_condition(sandbox, observed, owned_pod),
        now,
    );
    // Finished: only while the owned pod is terminal.
    match finished_condition(sandbox, owned_pod) {
        Some(finished) => set_condition(conditions, finished, now),
        None => remove_condition(conditions, cond::FINISHED),
    }
    // PodScheduled: mirrors the owned pod's.
    match pod_scheduled_condition(sandbox, observed, owned_pod) {
        Some(scheduled) => set_condition(conditions, scheduled, now),
        None => remove_condition(conditions, cond::POD_SCHEDULED),
    }
    set_condition(conditions, ready_condition(sandbox, observed), now);
    status
}

/// `selector`, `podIPs` and `nodeName`: from the pod when the sandbox owns it.
fn set_pod_fields(
    status: &mut SandboxStatus,
    sandbox: &Sandbox,
    pod: Option<&Pod>,
    owned_pod: Option<&Pod>,
) {
    if pod.is_some() {
        status.selector = selector(sandbox);
    }
    match owned_pod {
        Some(pod) => {
            status.pod_ips = pod_ips(pod);
            status.node_name = pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_default();
        }
        None => {
            status.pod_ips.clear();
            status.node_name.clear();
        }
    }
}

/// `service` and `serviceFQDN`: from the Service, when there is one.
fn set_service_fields(status: &mut SandboxStatus, service: Option<&Service>, cluster_domain: &str) {
    match service {
        Some(service) => {
            let name = service.metadata.name.clone().unwrap_or_default();
            let namespace = service.metadata.namespace.clone().unwrap_or_default();
            status.service_fqdn = format!("{name}.{namespace}.svc.{cluster_domain}");
            status.service = name;
        }
        None => {
            status.service.clear();
            status.service_fqdn.clear();
        }
    }
}

fn unknown(mut condition: Condition) -> Condition {
    condition.status = "Unknown".into();
    condition
}

fn suspended_condition(
    sandbox: &Sandbox,
    observed: &Observed<'_>,
    owned_pod: Option<&Pod>,
) -> Condition {
    let generation = sandbox.metadata.generation;
    let suspended = |status: bool, reason: &str, message: &str| {
        condition(cond::SUSPENDED, status, reason, message, generation)
    };
    if sandbox.spec.operating_mode != OperatingMode::Suspended {
        suspended(
            false,
            cond::REASON_NOT_SUSPENDED,
            "Sandbox is not suspended",
        )
    } else if observed.pod.is_none() && observed.pod_lookup_failed {
        unknown(suspended(
            false,
            cond::REASON_POD_STATE_UNKNOWN,
            "Pod state is unknown. Sandbox suspension cannot be confirmed",
        ))
    } else if observed.pod.is_none() {
        suspended(
            true,
            cond::REASON_POD_TERMINATED,
            "Pod has been terminated. Sandbox is suspended",
        )
    } else if owned_pod.is_none() {
        suspended(
            false,
            cond::REASON_POD_NOT_OWNED,
            "Refused to delete pod because it is not owned by this sandbox",
        )
    } else {
        suspended(
            false,
            cond::REASON_POD_TERMINATING,
            "Pod is terminating. Sandbox is suspending",
        )
    }
}

/// `Finished`, while the owned pod is terminal.
fn finished_condition(sandbox: &Sandbox, owned_pod: Option<&Pod>) -> Option<Condition> {
    let (reason, message) = match owned_pod.map(pod_phase) {
        Some("Succeeded") => (cond::REASON_POD_SUCCEEDED, "Pod completed successfully"),
        Some("Failed") => (cond::REASON_POD_FAILED, "Pod failed"),
        _ => return None,
    };
    Some(condition(
        cond::FINISHED,
        true,
        reason,
        message,
        sandbox.metadata.generation,
    ))
}

/// `PodScheduled`: the owned pod's, Unknown while the pod cannot be looked up; none without an
/// owned pod.
fn pod_scheduled_condition(
    sandbox: &Sandbox,
    observed: &Observed<'_>,
    owned_pod: Option<&Pod>,
) -> Option<Condition> {
    let generation = sandbox.metadata.generation;
    if observed.pod.is_none() && observed.pod_lookup_failed {
        return Some(unknown(condition(
            cond::POD_SCHEDULED,
            false,
            cond::REASON_POD_SCHEDULING_UNKNOWN,
            "Pod state is unknown. Pod scheduling cannot be determined",
            generation,
        )));
    }
    let pod = owned_pod?;
    Some(match pod_condition(pod, "PodScheduled") {
        Some(scheduled) => {
            let reason = match (scheduled.reason.as_deref(), scheduled.status.as_str()) {
                (Some(reason), _) if !reason.is_empty() => reason.to_owned(),
                (_, "True") => cond::REASON_POD_SCHEDULED.to_owned(),
                _ => cond::REASON_POD_SCHEDULING_UNKNOWN.to_owned(),
            };
            let mut c = condition(
                cond::POD_SCHEDULED,
                true,
                &reason,
                scheduled.message.clone().unwrap_or_default(),
                generation,
            );
            c.status = scheduled.status.clone();
            c
        }
        None => unknown(condition(
            cond::POD_SCHEDULED,
            false,
            cond::REASON_POD_SCHEDULING_UNKNOWN,
            "Pod has not reported a PodScheduled condition yet",
            generation,
        )),
    })
}

fn ready_condition(sandbox: &Sandbox, observed: &Observed<'_>) -> Condition {
    let generation = sandbox.metadata.generation;
    let not_ready =
        |reason: &str, message: String| condition(cond::READY, false, reason, message, generation);
    match &observed.problem {
        Some(Problem::MultiplePods(count)) => {
            return not_ready(
                cond::REASON_MULTIPLE_PODS,
                Problem::multiple_pods_message(*count),
            );
        }
        Some(Problem::Error(message)) => {
            return not_ready(
                cond::REASON_RECONCILER_ERROR,
                format!("Error seen: {message}"),
            );
        }
        Some(Problem::InvalidPodTemplate(message)) => {
            return not_ready(cond::REASON_INVALID_POD_TEMPLATE, message.clone());
        }
        None => {}
    }
    if sandbox.spec.operating_mode == OperatingMode::Suspended {
        let message = if observed.pod.is_some() {
            "Sandbox is suspending"
        } else {
            "Sandbox is suspended"
        };
        return not_ready(cond::REASON_SUSPENDED, message.to_owned());
    }
    if let Some(pod) = observed.pod {
        match pod_phase(pod) {
            "Succeeded" => {
                return not_ready(
                    cond::REASON_POD_SUCCEEDED,
                    "Pod completed successfully".into(),
                );
            }
            "Failed" => return not_ready(cond::REASON_POD_FAILED, "Pod failed".into()),
            _ => {}
        }
    }
    let (mut message, pod_ready) = match observed.pod {
        None => ("Pod does not exist".to_owned(), false),
        Some(pod) => {
            let phase = pod_phase(pod);
            if phase != "Running" {
                (format!("Pod exists with phase: {phase}"), false)
            } else if pod_condition(pod, "Ready").is_none_or(|c| c.status != "True") {
                ("Pod is Running but not Ready".to_owned(), false)
            } else if pod_ips(pod).is_empty() {
                ("Pod is Ready but has no podIPs yet".to_owned(), false)
            } else {
                ("Pod is Ready".to_owned(), true)
            }
        }
    };
    let service_required = sandbox
        .spec
        .blueprint
        .service
        .unwrap_or(observed.service.is_some());
    let mut service_ready = true;
    if service_required {
        if observed.service.is_some() {
            message.push_str("; Service Exists");
        } else {
            message.push_str("; Service does not exist");
            service_ready = false;
        }
    }
    if pod_ready && service_ready {
        condition(
            cond::READY,
            true,
            cond::REASON_DEPENDENCIES_READY,
            message,
            generation,
        )
    } else {
        not_ready(cond::REASON_DEPENDENCIES_NOT_READY, message)
    }
}

/// True when the only difference between two statuses is `nodeName` and the sandbox is not
/// Ready: upstream defers such a write until readiness, to save a status write per pod start.
pub fn only_node_name_changed(old: &SandboxStatus, new: &SandboxStatus) -> bool {
    if old.node_name == new.node_name {
        return false;
    }
    let mut scratch = new.clone();
    scratch.node_name.clone_from(&old.node_name);
    &scratch == old && !super::is_condition_true(&new.conditions, cond::READY)
}

/// The API server's refusal of this generation's pod, when the status records one: the pod is
/// not sent again until the spec (and with it the generation) changes.
pub fn rejected_pod_template(sandbox: &Sandbox) -> Option<String> {
    let ready = sandbox
        .status
        .as_ref()
        .and_then(|status| find_condition(&status.conditions, cond::READY))?;
    (ready.reason == cond::REASON_INVALID_POD_TEMPLATE
        && ready.observed_generation == sandbox.metadata.generation)
        .then(|| ready.message.clone())
}

/// The pool that controls `sandbox` (name and UID), when a pool does.
pub fn owning_pool(sandbox: &Sandbox) -> Option<(&str, &str)> {
    controller_of(&sandbox.metadata)
        .filter(|owner| {
            owner.kind == kinds::SANDBOX_WARM_POOL
                && owner.api_version.split('/').next() == Some(agent_sandbox_api::EXTENSIONS_GROUP)
        })
        .map(|owner| (owner.name.as_str(), owner.uid.as_str()))
}

/// The merge patch that clears a stale `pod-name` annotation.
pub fn clear_pod_name_patch() -> Value {
    json!({"metadata": {"annotations": {annotations::POD_NAME: null}}})
}

/// True when `sandbox` carries a `pod-name` annotation.
pub fn has_pod_name_annotation(sandbox: &Sandbox) -> bool {
    sandbox
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(annotations::POD_NAME))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::fixtures::{now, sandbox};
    use agent_sandbox_api::sandbox::{EmbeddedObjectMetadata, PersistentVolumeClaimTemplate};
    use k8s_openapi::api::core::v1::{
        Container, ContainerPort, PodCondition, PodIP, PodStatus, Volume as KVolume,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use pretty_assertions::assert_eq;

    fn running_pod(sandbox: &Sandbox, ready: bool) -> Pod {
        let mut pod = desired_pod(sandbox);
        pod.status = Some(PodStatus {
            phase: Some("Running".into()),
            pod_ips: Some(vec![PodIP {
                ip: "10.0.0.5".into(),
            }]),
            conditions: Some(vec![
                PodCondition {
                    type_: "PodScheduled".into(),
                    status: "True".into(),
                    ..PodCondition::default()
                },
                PodCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..PodCondition::default()
                },
            ]),
            ..PodStatus::default()
        });
        pod.spec.as_mut().unwrap().node_name = Some("sim-node".into());
        pod
    }

    #[test]
    fn desired_pod_filters_system_keys_and_records_what_it_propagated() {
        let mut sb = sandbox("my-sandbox");
        sb.metadata.labels = Some(BTreeMap::from([(
            labels::CREATED_BY.into(),
            "my-tool".into(),
        )]));
        let meta = &mut sb.spec.blueprint.pod_template.metadata;
        meta.labels.insert("app".into(), "demo".into());
        meta.labels
            .insert("agents.x-k8s.io/claim-uid".into(), "x".into());
        meta.annotations.insert("example.com/a".into(), "1".into());
        meta.annotations
            .insert(annotations::TRACE_CONTEXT.into(), "{}".into());
        let pod = desired_pod(&sb);
        assert_eq!(pod.metadata.name.as_deref(), Some("my-sandbox"));
        assert_eq!(
            pod.metadata.labels.unwrap(),
            BTreeMap::from([
                ("app".to_owned(), "demo".to_owned()),
                (labels::SANDBOX_NAME_HASH.to_owned(), "374de8f5".to_owned()),
                (labels::CREATED_BY.to_owned(), "unknown".to_owned()),
            ])
        );
        assert_eq!(
            pod.metadata.annotations.unwrap(),
            BTreeMap::from([
                ("example.com/a".to_owned(), "1".to_owned()),
                (annotations::PROPAGATED_LABELS.to_owned(), "app".to_owned()),
                (
                    annotations::PROPAGATED_ANNOTATIONS.to_owned(),
                    "example.com/a".to_owned()
                ),
            ])
        );
        let owner = &pod.metadata.owner_references.unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.controller),
            (kinds::SANDBOX, Some(true))
        );
    }

    #[test]
    fn pvc_volumes_replace_template_volumes_of_the_same_name() {
        let mut sb = sandbox("box");
        sb.spec.blueprint.pod_template.spec.volumes = Some(vec![
            KVolume {
                name: "workspace".into(),
                ..KVolume::default()
            },
            KVolume {
                name: "other".into(),
                ..KVolume::default()
            },
        ]);
        sb.spec.blueprint.volume_claim_templates = vec![PersistentVolumeClaimTemplate {
            metadata: EmbeddedObjectMetadata {
                name: "workspace".into(),
                ..Default::default()
            },
            ..Default::default()
        }];
        let volumes = pod_spec(&sb).volumes.unwrap();
        assert_eq!(volumes.len(), 2);
        assert_eq!(volumes[0].name, "other");
        assert_eq!(
            volumes[1]
                .persistent_volume_claim
                .as_ref()
                .unwrap()
                .claim_name,
            "workspace-box"
        );
        let pvcs = desired_pvcs(&sb);
        assert_eq!(pvcs[0].metadata.name.as_deref(), Some("workspace-box"));
        assert_eq!(
            pvcs[0].metadata.labels.as_ref().unwrap()[labels::SANDBOX_NAME_HASH],
            sandbox_hash(&sb)
        );
    }

    #[test]
    fn metadata_patch_adds_changes_and_removes_only_what_we_propagated() {
        let mut sb = sandbox("box");
        sb.spec
            .blueprint
            .pod_template
            .metadata
            .labels
            .insert("keep".into(), "1".into());
        sb.spec
            .blueprint
            .pod_template
            .metadata
            .labels
            .insert("drop".into(), "1".into());
        let mut pod = desired_pod(&sb);
        pod.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("someone-else".into(), "x".into());
        assert_eq!(pod_metadata_patch(&sb, &pod), None);

        sb.spec
            .blueprint
            .pod_template
            .metadata
            .labels
            .remove("drop");
        sb.spec
            .blueprint
            .pod_template
            .metadata
            .labels
            .insert("keep".into(), "2".into());
        sb.spec
            .blueprint
            .pod_template
            .metadata
            .annotations
            .insert("note".into(), "hi".into());
        let patch = pod_metadata_patch(&sb, &pod).unwrap();
        assert_eq!(
            patch,
            json!({"metadata": {
                "labels": {"keep": "2", "drop": null},
                "annotations": {
                    "note": "hi",
                    annotations::PROPAGATED_LABELS: "keep",
                    annotations::PROPAGATED_ANNOTATIONS: "note",
                }
            }})
        );
    }

    #[test]
    fn service_ports_are_deduplicated_sorted_and_named() {
        let mut spec = crate::decide::fixtures::pod_spec();
        spec.containers.push(Container {
            name: "sidecar".into(),
            ports: Some(vec![
                ContainerPort {
                    container_port: 8888,
                    name: Some("http".into()),
                    ..Default::default()
                },
                ContainerPort {
                    container_port: 53,
                    protocol: Some("UDP".into()),
                    ..Default::default()
                },
                ContainerPort {
                    container_port: 53,
                    ..Default::default()
                },
            ]),
            ..Container::default()
        });
        let ports: Vec<(String, i32, String)> = service_ports(&spec)
            .into_iter()
            .map(|p| (p.name.unwrap(), p.port, p.protocol.unwrap()))
            .collect();
        assert_eq!(
            ports,
            vec![
                ("p-53-tcp".into(), 53, "TCP".into()),
                ("p-53-udp".into(), 53, "UDP".into()),
                ("http".into(), 8888, "TCP".into()),
            ]
        );
    }

    #[test]
    fn child_adoption_rules() {
        let sb = sandbox("box");
        let mut meta = ObjectMeta {
            name: Some("box".into()),
            ..ObjectMeta::default()
        };
        assert!(matches!(
            child_decision(&sb, "pod", &meta),
            ChildDecision::Refuse(_)
        ));
        meta.labels = Some(BTreeMap::from([(labels::ADOPTABLE.into(), "true".into())]));
        assert_eq!(child_decision(&sb, "pod", &meta), ChildDecision::Adopt);
        meta.owner_references = Some(vec![controller_reference(&sandbox("other"))]);
        match child_decision(&sb, "pod", &meta) {
            ChildDecision::Refuse(message) => {
                assert!(message.contains("owned by Sandbox/other"), "{message}")
            }
            other => panic!("{other:?}"),
        }
    }

    /// Regression (issue 15): a pod the API server refuses as invalid (`containers: []`) was
    /// retried every 2 s forever. The refusal is a terminal status for the generation.
    #[test]
    fn an_invalid_pod_template_is_terminal_for_its_generation() {
        let mut sb = sandbox("box");
        assert_eq!(rejected_pod_template(&sb), None);
        let message = "Pod \"box\" is invalid: spec.containers: Required value";
        let refused = status(
            &sb,
            &Observed {
                problem: Some(Problem::InvalidPodTemplate(message.into())),
                ..Observed::default()
            },
            "cluster.local",
            now(),
        );
        let ready = find_condition(&refused.conditions, cond::READY).unwrap();
        assert_eq!(
            (
                ready.status.as_str(),
                ready.reason.as_str(),
                ready.message.as_str()
            ),
            ("False", "InvalidPodTemplate", message)
        );
        sb.status = Some(refused);
        assert_eq!(rejected_pod_template(&sb).as_deref(), Some(message));
        sb.metadata.generation = Some(2);
        assert_eq!(
            rejected_pod_template(&sb),
            None,
            "a new spec gets a new attempt"
        );
    }

    #[test]
    fn the_owning_pool_is_the_controller_of_kind_pool() {
        let mut sb = sandbox("box");
        assert_eq!(owning_pool(&sb), None);
        let pool_reference = |api_version: &str, kind: &str| {
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: api_version.into(),
                kind: kind.into(),
                name: "pool".into(),
                uid: "pool-uid".into(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }
        };
        sb.metadata.owner_references = Some(vec![pool_reference(
            agent_sandbox_api::EXTENSIONS_API_VERSION,
            kinds::SANDBOX_WARM_POOL,
        )]);
        assert_eq!(owning_pool(&sb), Some(("pool", "pool-uid")));
        sb.metadata.owner_references = Some(vec![pool_reference(
            agent_sandbox_api::EXTENSIONS_API_VERSION,
            kinds::SANDBOX_CLAIM,
        )]);
        assert_eq!(owning_pool(&sb), None, "claimed");
        sb.metadata.owner_references = Some(vec![pool_reference(
            "example.com/v1",
            kinds::SANDBOX_WARM_POOL,
        )]);
        assert_eq!(owning_pool(&sb), None, "another group's kind");
    }

    /// Upstream's labels: a pool member's pod carries `warm-pool-sandbox` (what a router that
    /// may read pods only tells unclaimed members by) until a claim adopts the member.
    #[test]
    fn a_pool_members_pod_carries_the_pool_label_until_a_claim_adopts_it() {
        let owner = |kind: &str, name: &str| {
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: agent_sandbox_api::EXTENSIONS_API_VERSION.into(),
                kind: kind.into(),
                name: name.into(),
                uid: format!("{name}-uid"),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }
        };
        let mut member = sandbox("pool-x7k2p");
        member.metadata.owner_references = Some(vec![owner(kinds::SANDBOX_WARM_POOL, "pool")]);
        member.metadata.labels = Some(BTreeMap::from([
            (labels::WARM_POOL_SANDBOX.into(), name_hash("pool")),
            (
                labels::SANDBOX_TEMPLATE_REF_HASH.into(),
                name_hash("python"),
            ),
            (labels::LAUNCH_TYPE.into(), labels::LAUNCH_TYPE_WARM.into()),
        ]));
        let pod = desired_pod(&member);
        assert_eq!(
            pod.metadata.labels.clone().unwrap(),
            BTreeMap::from([
                (
                    labels::SANDBOX_NAME_HASH.to_owned(),
                    name_hash("pool-x7k2p")
                ),
                (labels::WARM_POOL_SANDBOX.to_owned(), name_hash("pool")),
                (
                    labels::SANDBOX_TEMPLATE_REF_HASH.to_owned(),
                    name_hash("python")
                ),
            ])
        );
        assert_eq!(pod_metadata_patch(&member, &pod), None);
        // A member's pod made without it (by an older controller) gets it.
        let mut unlabelled = pod.clone();
        unlabelled
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .remove(labels::WARM_POOL_SANDBOX);
        assert_eq!(
            pod_metadata_patch(&member, &unlabelled),
            Some(json!({"metadata": {"labels": {labels::WARM_POOL_SANDBOX: name_hash("pool")}}}))
        );
        // Adopted: the claim controls the sandbox and took the label off it; the pod follows.
        let mut adopted = member.clone();
        adopted.metadata.owner_references = Some(vec![owner(kinds::SANDBOX_CLAIM, "claim")]);
        adopted
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .remove(labels::WARM_POOL_SANDBOX);
        assert_eq!(
            pod_metadata_patch(&adopted, &pod),
            Some(json!({"metadata": {"labels": {labels::WARM_POOL_SANDBOX: null}}}))
        );
        // A pool owning a sandbox without its label (not a member by upstream's rules) puts
        // none on the pod.
        let mut stray = member.clone();
        stray
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .remove(labels::WARM_POOL_SANDBOX);
        assert!(
            !desired_pod(&stray)
                .metadata
                .labels
                .unwrap()
                .contains_key(labels::WARM_POOL_SANDBOX)
        );
    }

    #[test]
    fn ready_when_pod_is_running_ready_and_has_an_ip() {
        let sb = sandbox("box");
        let pod = running_pod(&sb, true);
        let status = status(
            &sb,
            &Observed {
                pod: Some(&pod),
                ..Observed::default()
            },
            "cluster.local",
            now(),
        );
        let ready = find_condition(&status.conditions, cond::READY).unwrap();
        assert_eq!(
            (
                ready.status.as_str(),
                ready.reason.as_str(),
                ready.message.as_str()
            ),
            ("True", "DependenciesReady", "Pod is Ready")
        );
        assert_eq!(status.pod_ips, vec!["10.0.0.5"]);
        assert_eq!(status.node_name, "sim-node");
        assert_eq!(
            status.selector,
            format!("agents.x-k8s.io/sandbox-name-hash={}", sandbox_hash(&sb))
        );
        let types: Vec<&str> = status.conditions.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, vec!["Suspended", "PodScheduled", "Ready"]);
        assert!(
            status
                .conditions
                .iter()
                .all(|c| c.observed_generation == Some(1))
        );
    }

    #[test]
    fn required_service_gates_readiness() {
        let mut sb = sandbox("box");
        sb.spec.blueprint.service = Some(true);
        let pod = running_pod(&sb, true);
        let status1 = status(
            &sb,
            &Observed {
                pod: Some(&pod),
                ..Observed::default()
            },
            "cluster.local",
            now(),
        );
        let ready = find_condition(&status1.conditions, cond::READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.message.as_str()),
            ("False", "Pod is Ready; Service does not exist")
        );
        let service = desired_service(&sb);
        let status2 = status(
            &sb,
            &Observed {
                pod: Some(&pod),
                service: Some(&service),
                ..Observed::default()
            },
            "cluster.local",
            now(),
        );
        assert!(crate::decide::is_condition_true(
            &status2.conditions,
            cond::READY
        ));
        assert_eq!(status2.service_fqdn, "box.default.svc.cluster.local");
    }

    #[test]
    fn not_ready_messages_follow_the_pod() {
        let sb = sandbox("box");
        let msg = |observed: Observed<'_>| {
            let status = status(&sb, &observed, "cluster.local", now());
            find_condition(&status.conditions, cond::READY)
                .unwrap()
                .message
                .clone()
        };
        assert_eq!(msg(Observed::default()), "Pod does not exist");
        let mut pending = desired_pod(&sb);
        pending.status = Some(PodStatus {
            phase: Some("Pending".into()),
            ..PodStatus::default()
        });
        assert_eq!(
            msg(Observed {
                pod: Some(&pending),
                ..Observed::default()
            }),
            "Pod exists with phase: Pending"
        );
        let unready = running_pod(&sb, false);
        assert_eq!(
            msg(Observed {
                pod: Some(&unready),
                ..Observed::default()
            }),
            "Pod is Running but not Ready"
        );
        assert_eq!(
            msg(Observed {
                problem: Some(Problem::Error("boom".into())),
                ..Observed::default()
            }),
            "Error seen: boom"
        );
    }

    #[test]
    fn terminal_pods_finish_the_sandbox() {
        let sb = sandbox("box");
        let mut pod = running_pod(&sb, false);
        pod.status.as_mut().unwrap().phase = Some("Succeeded".into());
        let status = status(
            &sb,
            &Observed {
                pod: Some(&pod),
                ..Observed::default()
            },
            "cluster.local",
            now(),
        );
        let finished = find_condition(&status.conditions, cond::FINISHED).unwrap();
        assert_eq!(
            (finished.status.as_str(), finished.reason.as_str()),
            ("True", "PodSucceeded")
        );
        let ready = find_condition(&status.conditions, cond::READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "PodSucceeded")
        );
    }

    #[test]
    fn suspension_conditions() {
        let mut sb = sandbox("box");
        sb.spec.operating_mode = OperatingMode::Suspended;
        let status1 = status(&sb, &Observed::default(), "cluster.local", now());
        let suspended = find_condition(&status1.conditions, cond::SUSPENDED).unwrap();
        assert_eq!(
            (suspended.status.as_str(), suspended.reason.as_str()),
            ("True", "PodTerminated")
        );
        let ready = find_condition(&status1.conditions, cond::READY).unwrap();
        assert_eq!(
            (ready.reason.as_str(), ready.message.as_str()),
            ("SandboxSuspended", "Sandbox is suspended")
        );
        let pod = running_pod(&sb, true);
        let status2 = status(
            &sb,
            &Observed {
                pod: Some(&pod),
                ..Observed::default()
            },
            "cluster.local",
            now(),
        );
        assert_eq!(
            find_condition(&status2.conditions, cond::SUSPENDED)
                .unwrap()
                .reason,
            "PodTerminating"
        );
        let mut foreign = pod.clone();
        foreign.metadata.owner_references = None;
        let status3 = status(
            &sb,
            &Observed {
                pod: Some(&foreign),
                ..Observed::default()
            },
            "cluster.local",
            now(),
        );
        assert_eq!(
            find_condition(&status3.conditions, cond::SUSPENDED)
                .unwrap()
                .reason,
            "PodNotOwned"
        );
    }

    #[test]
    fn expiry_and_the_expired_status() {
        let mut sb = sandbox("box");
        assert_eq!(expiry(&sb, now()), Expiry::Never);
        sb.spec.lifecycle.shutdown_time = Some(Time("2026-11-29T12:00:10Z".parse().unwrap()));
        assert_eq!(expiry(&sb, now()), Expiry::In(Duration::from_secs(10)));
        sb.spec.lifecycle.shutdown_time = Some(Time(now()));
        assert_eq!(expiry(&sb, now()), Expiry::Expired);
        assert!(!marked_expired(&sb));
        let pod = running_pod(&sb, true);
        sb.status = Some(status(
            &sb,
            &Observed {
                pod: Some(&pod),
                ..Observed::default()
            },
            "cluster.local",
            now(),
        ));
        let expired = expired_status(&sb, now(), true);
        assert!(expired.pod_ips.is_empty());
        assert!(find_condition(&expired.conditions, cond::POD_SCHEDULED).is_none());
        let ready = find_condition(&expired.conditions, cond::READY).unwrap();
        assert_eq!(
            (ready.reason.as_str(), ready.message.as_str()),
            ("SandboxExpired", "Sandbox has expired")
        );
        sb.status = Some(expired);
        assert!(marked_expired(&sb));
    }

    #[test]
    fn node_name_only_changes_wait_for_readiness() {
        let old = SandboxStatus::default();
        let new = SandboxStatus {
            node_name: "n".into(),
            ..SandboxStatus::default()
        };
        assert!(only_node_name_changed(&old, &new));
        let new = SandboxStatus {
            node_name: "n".into(),
            selector: "x".into(),
            ..SandboxStatus::default()
        };
        assert!(!only_node_name_changed(&old, &new));
    }

    fn idle_sandbox(
        ttl: i64,
        policy: agent_sandbox_api::sandbox::ActiveExpirationPolicy,
    ) -> Sandbox {
        let mut sb = sandbox("idle");
        sb.spec.idle_lifecycle = Some(agent_sandbox_api::sandbox::IdleLifecycle {
            active_ttl_seconds: Some(ttl),
            active_expiration_policy: Some(policy),
            suspended_ttl_seconds: Some(60),
            suspended_expiration_policy: None,
        });
        sb
    }

    fn at(seconds: i64) -> Timestamp {
        super::super::after(now(), Duration::from_secs(u64::try_from(seconds).unwrap()))
    }

    #[test]
    fn an_idle_sandbox_suspends_after_its_ttl_counted_from_its_last_activity() {
        use agent_sandbox_api::sandbox::ActiveExpirationPolicy;
        let mut sb = idle_sandbox(30, ActiveExpirationPolicy::Suspend);
        assert_eq!(idle(&sb, at(10)), Idle::Wait(Some(Duration::from_secs(20))));
        assert_eq!(idle(&sb, at(30)), Idle::Suspend);
        // Activity a router recorded at +25 s moves the deadline to +55 s.
        sb.status = Some(SandboxStatus {
            last_activity_time: Some(Time(at(25))),
            ..SandboxStatus::default()
        });
        assert_eq!(idle(&sb, at(40)), Idle::Wait(Some(Duration::from_secs(15))));
        // So does a resume or an adoption (the active-since mark).
        sb.metadata.annotations =
            Some([(annotations::ACTIVE_SINCE.to_owned(), at(50).to_string())].into());
        assert_eq!(idle(&sb, at(60)), Idle::Wait(Some(Duration::from_secs(20))));
        assert_eq!(idle(&sb, at(80)), Idle::Suspend);
        let delete = idle_sandbox(30, ActiveExpirationPolicy::Delete);
        assert_eq!(idle(&delete, at(31)), Idle::Delete);
        // Without a lifecycle, or unclaimed in a pool, nothing idles out.
        assert_eq!(idle(&sandbox("plain"), at(10_000)), Idle::Wait(None));
        let mut member = idle_sandbox(30, ActiveExpirationPolicy::Delete);
        member.metadata.owner_references = Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: agent_sandbox_api::EXTENSIONS_API_VERSION.into(),
                kind: kinds::SANDBOX_WARM_POOL.into(),
                name: "pool".into(),
                uid: "pool-uid".into(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            },
        ]);
        assert_eq!(idle(&member, at(10_000)), Idle::Wait(None));
    }

    #[test]
    fn an_idle_suspension_expires_after_the_suspended_ttl_and_only_that_one() {
        use agent_sandbox_api::sandbox::{ActiveExpirationPolicy, SuspendedExpirationPolicy};
        let mut sb = idle_sandbox(30, ActiveExpirationPolicy::Suspend);
        sb.spec.operating_mode = OperatingMode::Suspended;
        // Suspended by hand: stays.
        assert_eq!(idle(&sb, at(10_000)), Idle::Wait(None));
        sb.metadata.annotations = Some(
            [(
                annotations::IDLE_SUSPENDED_AT.to_owned(),
                at(30).to_string(),
            )]
            .into(),
        );
        assert_eq!(idle(&sb, at(40)), Idle::Wait(Some(Duration::from_secs(50))));
        assert_eq!(idle(&sb, at(90)), Idle::Delete);
        sb.spec
            .idle_lifecycle
            .as_mut()
            .unwrap()
            .suspended_expiration_policy = Some(SuspendedExpirationPolicy::Retain);
        assert_eq!(idle(&sb, at(90)), Idle::Wait(None));
        // A request arrives (a router records activity after the suspension): it resumes.
        sb.status = Some(SandboxStatus {
            last_activity_time: Some(Time(at(95))),
            ..SandboxStatus::default()
        });
        assert_eq!(idle(&sb, at(96)), Idle::Resume);
        sb.status = None;
        // Resumed by someone who left the mark: it is cleared.
        sb.spec.operating_mode = OperatingMode::Running;
        assert_eq!(idle(&sb, at(90)), Idle::ClearMark);
    }
}
