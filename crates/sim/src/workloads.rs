//! The Deployment and ReplicaSet controllers: a Deployment keeps one ReplicaSet per pod
//! template (named and labelled by the template's `pod-template-hash`, owned by the
//! Deployment) and moves replicas from the old ones to the new one within `maxSurge` and
//! `maxUnavailable` (or all at once with `Recreate`); a ReplicaSet keeps the
//! number of pods it owns at `spec.replicas`. Both report status as kube-controller-manager does
//! (`replicas`, `readyReplicas`, `availableReplicas`, `updatedReplicas`, `observedGeneration`,
//! the `Available` and `Progressing` conditions), which is what `kubectl rollout status` reads.
//!
//! The decisions ([`deployment_plan`], [`replica_set_plan`], the status functions) are pure;
//! [`sync_namespace`] reads the store and carries them out through [`ApiObjects`].

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Map, Value, json};

use crate::meta;
use crate::ops::{ApiObjects, DeleteOptions, WriteOptions};
use crate::resources::StorageKey;
use crate::selector::LabelSelector;

/// Label (and selector key) carrying the hash of a ReplicaSet's pod template.
pub(crate) const POD_TEMPLATE_HASH: &str = "pod-template-hash";
/// Annotation with a Deployment's and its ReplicaSets' revision.
pub(crate) const REVISION: &str = "deployment.kubernetes.io/revision";
/// Annotation with the Deployment's replicas on each of its ReplicaSets.
const DESIRED_REPLICAS: &str = "deployment.kubernetes.io/desired-replicas";
/// Field manager of the controllers' writes.
const MANAGER: &str = "kube-controller-manager";

pub(crate) fn deployments_key() -> StorageKey {
    StorageKey::new("apps", "deployments")
}
pub(crate) fn replica_sets_key() -> StorageKey {
    StorageKey::new("apps", "replicasets")
}
fn pods_key() -> StorageKey {
    StorageKey::new("", "pods")
}

/// `value` with object keys sorted at every level, so equal templates hash alike whatever
/// order their fields were written in.
fn canonical(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let sorted: BTreeMap<&String, Value> =
                map.iter().map(|(k, v)| (k, canonical(v))).collect();
            let mut out = Map::new();
            for (key, value) in sorted {
                out.insert(key.clone(), value);
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(canonical).collect()),
        other => other.clone(),
    }
}

/// The `pod-template-hash` of a pod template: FNV-1a of its canonical JSON, spelt in the
/// consonants-and-digits alphabet Kubernetes uses for generated names.
pub(crate) fn template_hash(template: &Value) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let text = canonical(template).to_string();
    let hash = agent_sandbox_api::fnv1a_32(text.as_bytes());
    hash.to_string()
        .bytes()
        .map(|digit| char::from(ALPHABET[usize::from(digit) % ALPHABET.len()]))
        .collect()
}

/// A `metav1.LabelSelector` in the string form of `labelSelector` query parameters (also what a
/// Scale's `status.selector` holds).
pub(crate) fn selector_string(selector: &Value) -> String {
    let mut parts = Vec::new();
    if let Some(labels) = selector.get("matchLabels").and_then(Value::as_object) {
        for (key, value) in labels {
            parts.push(format!("{key}={}", value.as_str().unwrap_or_default()));
        }
    }
    for expression in selector
        .get("matchExpressions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let key = expression
            .get("key")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let values: Vec<&str> = expression
            .get("values")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        match expression.get("operator").and_then(Value::as_str) {
            Some("In") => parts.push(format!("{key} in ({})", values.join(","))),
            Some("NotIn") => parts.push(format!("{key} notin ({})", values.join(","))),
            Some("Exists") => parts.push(key.to_owned()),
            Some("DoesNotExist") => parts.push(format!("!{key}")),
            _ => {}
        }
    }
    parts.join(",")
}

/// Whether `selector` (a `metav1.LabelSelector`) selects `labels`; an empty or unparsable
/// selector selects nothing, as the controllers treat it.
fn selects(selector: &Value, labels: &BTreeMap<String, String>) -> bool {
    let text = selector_string(selector);
    !text.is_empty() && LabelSelector::parse(&text).is_ok_and(|s| s.matches(labels))
}

fn int(object: &Value, pointer: &str) -> i64 {
    object.pointer(pointer).and_then(Value::as_i64).unwrap_or(0)
}

fn replicas(object: &Value) -> i64 {
    object
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(1)
}

fn controller_uid(object: &Value) -> Option<&str> {
    object
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)?
        .iter()
        .find(|owner| owner.get("controller").and_then(Value::as_bool) == Some(true))
        .and_then(|owner| owner.get("uid"))
        .and_then(Value::as_str)
}

fn revision(object: &Value) -> i64 {
    object
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(REVISION))
        .and_then(Value::as_str)
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

fn is_ready(pod: &Value) -> bool {
    pod.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|conditions| {
            conditions.iter().any(|c| {
                c.get("type").and_then(Value::as_str) == Some("Ready")
                    && c.get("status").and_then(Value::as_str) == Some("True")
            })
        })
}

/// Whether a pod counts for its ReplicaSet: not being deleted and not finished.
fn is_active(pod: &Value) -> bool {
    !meta::is_deleting(pod)
        && !matches!(
            pod.pointer("/status/phase").and_then(Value::as_str),
            Some("Succeeded" | "Failed")
        )
}

fn owner_reference(owner: &Value, kind: &str) -> Value {
    json!({"apiVersion": "apps/v1", "kind": kind, "name": meta::name(owner),
           "uid": meta::uid(owner), "controller": true, "blockOwnerDeletion": true})
}

/// What the Deployment controller does to one Deployment's ReplicaSets.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum DeploymentAction {
    /// Create this ReplicaSet.
    Create(Value),
    /// Set `spec.replicas` (and the revision annotations) of a ReplicaSet.
    Scale {
        name: String,
        replicas: i64,
        revision: Option<i64>,
    },
    /// Delete an old, empty ReplicaSet beyond `revisionHistoryLimit`.
    Delete(String),
}

/// The ReplicaSet a Deployment wants for its current template (without uid and times).
fn new_replica_set(deployment: &Value, hash: &str, revision: i64) -> Value {
    let name = format!("{}-{hash}", meta::name(deployment));
    let mut template = deployment
        .pointer("/spec/template")
        .cloned()
        .unwrap_or_else(|| json!({}));
    let labels = template
        .as_object_mut()
        .map(|t| t.entry("metadata").or_insert_with(|| json!({})))
        .and_then(Value::as_object_mut)
        .map(|m| m.entry("labels").or_insert_with(|| json!({})));
    if let Some(labels) = labels.and_then(Value::as_object_mut) {
        labels.insert(POD_TEMPLATE_HASH.into(), json!(hash));
    }
    let mut selector = deployment
        .pointer("/spec/selector")
        .cloned()
        .unwrap_or_else(|| json!({}));
    if let Some(selector) = selector.as_object_mut() {
        let labels = selector.entry("matchLabels").or_insert_with(|| json!({}));
        if let Some(labels) = labels.as_object_mut() {
            labels.insert(POD_TEMPLATE_HASH.into(), json!(hash));
        }
    }
    let labels = template
        .pointer("/metadata/labels")
        .cloned()
        .unwrap_or_else(|| json!({}));
    let mut spec = json!({"replicas": 0, "selector": selector, "template": template});
    if let Some(min_ready) = deployment.pointer("/spec/minReadySeconds") {
        spec["minReadySeconds"] = min_ready.clone();
    }
    json!({
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {
            "name": name,
            "namespace": meta::namespace(deployment),
            "labels": labels,
            "annotations": {REVISION: revision.to_string(),
                            DESIRED_REPLICAS: replicas(deployment).to_string()},
            "ownerReferences": [owner_reference(deployment, "Deployment")],
        },
        "spec": spec,
    })
}

/// The ReplicaSets `deployment` owns, among `replica_sets`.
fn owned_by<'a>(owner: &Value, objects: &'a [Arc<Value>]) -> Vec<&'a Arc<Value>> {
    let uid = meta::uid(owner);
    objects
        .iter()
        .filter(|object| controller_uid(object) == Some(uid))
        .collect()
}

fn template_hash_label(replica_set: &Value) -> &str {
    replica_set
        .pointer("/metadata/labels")
        .and_then(|l| l.get(POD_TEMPLATE_HASH))
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// What to do to the ReplicaSets of `deployment`: create the new one and move replicas to it
/// from the old ones, step by step within `maxSurge` and `maxUnavailable` (`RollingUpdate`), or
/// once the old ones have no pods left (`Recreate`).
pub(crate) fn deployment_plan(
    deployment: &Value,
    replica_sets: &[Arc<Value>],
) -> Vec<DeploymentAction> {
    if meta::is_deleting(deployment)
        || deployment.pointer("/spec/paused").and_then(Value::as_bool) == Some(true)
    {
        return Vec::new();
    }
    let Some(template) = deployment.pointer("/spec/template") else {
        return Vec::new();
    };
    let hash = template_hash(template);
    let owned = owned_by(deployment, replica_sets);
    let desired = replicas(deployment);
    let max_revision = owned.iter().map(|rs| revision(rs)).max().unwrap_or(0);
    let current = owned
        .iter()
        .find(|rs| template_hash_label(rs) == hash)
        .copied();
    let old: Vec<&Arc<Value>> = owned
        .iter()
        .filter(|rs| template_hash_label(rs) != hash)
        .copied()
        .collect();
    let recreate = deployment
        .pointer("/spec/strategy/type")
        .and_then(Value::as_str)
        == Some("Recreate");
    let old_pods: i64 = old.iter().map(|rs| int(rs, "/status/replicas")).sum();
    let old_spec: i64 = old.iter().map(|rs| replicas(rs)).sum();
    let current_replicas = current.map_or(0, |rs| replicas(rs));
    let (surge, unavailable) = fenceposts(deployment, desired);
    let target = if recreate {
        if old_pods == 0 { desired } else { 0 }
    } else if current_replicas >= desired {
        desired
    } else {
        // Grow while all ReplicaSets together stay within `replicas + maxSurge`.
        let room = (desired + surge - old_spec - current_replicas).max(0);
        (current_replicas + room).min(desired)
    };
    let mut actions = Vec::new();
    match current {
        None => {
            let mut replica_set = new_replica_set(deployment, &hash, max_revision + 1);
            replica_set["spec"]["replicas"] = json!(target);
            actions.push(DeploymentAction::Create(replica_set));
        }
        Some(rs) => {
            // A template rolled back to an older ReplicaSet's makes that one the newest revision.
            let newest = revision(rs) >= max_revision;
            if replicas(rs) != target || !newest || desired_annotation(rs) != Some(desired) {
                actions.push(DeploymentAction::Scale {
                    name: meta::name(rs).to_owned(),
                    replicas: target,
                    revision: (!newest).then_some(max_revision + 1),
                });
            }
        }
    }
    // Shrink the old ReplicaSets, oldest first: their unavailable pods at once, available ones
    // while at least `replicas - maxUnavailable` pods stay available in all.
    let available: i64 = owned
        .iter()
        .map(|rs| int(rs, "/status/availableReplicas"))
        .sum();
    let mut budget = (available - (desired - unavailable)).max(0);
    let mut oldest_first = old.clone();
    oldest_first.sort_by_key(|rs| revision(rs));
    for rs in oldest_first {
        let now = replicas(rs);
        if now == 0 {
            continue;
        }
        let target = if recreate {
            0
        } else {
            let healthy = int(rs, "/status/availableReplicas").clamp(0, now);
            let removable = budget.min(healthy);
            budget -= removable;
            healthy - removable
        };
        if target != now {
            actions.push(DeploymentAction::Scale {
                name: meta::name(rs).to_owned(),
                replicas: target,
                revision: None,
            });
        }
    }
    // Keep `revisionHistoryLimit` empty old ReplicaSets, newest first.
    let limit = deployment
        .pointer("/spec/revisionHistoryLimit")
        .and_then(Value::as_i64)
        .unwrap_or(10);
    let mut empty: Vec<&&Arc<Value>> = old
        .iter()
        .filter(|rs| replicas(rs) == 0 && int(rs, "/status/replicas") == 0)
        .collect();
    empty.sort_by_key(|rs| std::cmp::Reverse(revision(rs)));
    for rs in empty
        .into_iter()
        .skip(usize::try_from(limit.max(0)).unwrap_or(usize::MAX))
    {
        actions.push(DeploymentAction::Delete(meta::name(rs).to_owned()));
    }
    actions
}

fn desired_annotation(replica_set: &Value) -> Option<i64> {
    replica_set
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(DESIRED_REPLICAS))
        .and_then(Value::as_str)
        .and_then(|r| r.parse().ok())
}

/// A status condition (without times).
fn condition(type_: &str, status: bool, reason: &str, message: String) -> Value {
    json!({"type": type_, "status": if status { "True" } else { "False" },
           "reason": reason, "message": message})
}

/// An `IntOrString` of a rolling update resolved against `replicas`: a number, or a percentage
/// rounded up or down; `default` (a percentage) when absent.
fn resolve(value: Option<&Value>, replicas: i64, round_up: bool, default: i64) -> i64 {
    let percent = |percent: i64| {
        let scaled = replicas * percent;
        if round_up {
            (scaled + 99) / 100
        } else {
            scaled / 100
        }
    };
    match value {
        Some(Value::Number(n)) => n.as_i64().unwrap_or(0),
        Some(Value::String(text)) => text
            .strip_suffix('%')
            .and_then(|p| p.parse::<i64>().ok())
            .map_or(0, percent),
        _ => percent(default),
    }
}

/// `maxSurge` (rounded up) and `maxUnavailable` (rounded down) of a Deployment, as the
/// Deployment controller resolves them (both zero makes `maxUnavailable` one; `Recreate` has
/// neither).
fn fenceposts(deployment: &Value, replicas: i64) -> (i64, i64) {
    if deployment
        .pointer("/spec/strategy/type")
        .and_then(Value::as_str)
        == Some("Recreate")
    {
        return (0, 0);
    }
    let rolling = deployment.pointer("/spec/strategy/rollingUpdate");
    let surge = resolve(rolling.and_then(|r| r.get("maxSurge")), replicas, true, 25);
    let unavailable = resolve(
        rolling.and_then(|r| r.get("maxUnavailable")),
        replicas,
        false,
        25,
    );
    if surge == 0 && unavailable == 0 {
        (0, 1)
    } else {
        (surge, unavailable)
    }
}

/// A Deployment's status from its ReplicaSets' (conditions without times).
pub(crate) fn deployment_status(deployment: &Value, replica_sets: &[Arc<Value>]) -> Value {
    let owned = owned_by(deployment, replica_sets);
    let hash = deployment
        .pointer("/spec/template")
        .map(template_hash)
        .unwrap_or_default();
    let current = owned.iter().find(|rs| template_hash_label(rs) == hash);
    let sum = |pointer: &str| owned.iter().map(|rs| int(rs, pointer)).sum::<i64>();
    let desired = replicas(deployment);
    let total = sum("/status/replicas");
    let ready = sum("/status/readyReplicas");
    let available = sum("/status/availableReplicas");
    let updated = current.map_or(0, |rs| int(rs, "/status/replicas"));
    let minimum = desired - fenceposts(deployment, desired).1;
    let available_condition = if available >= minimum {
        condition(
            "Available",
            true,
            "MinimumReplicasAvailable",
            "Deployment has minimum availability.".into(),
        )
    } else {
        condition(
            "Available",
            false,
            "MinimumReplicasUnavailable",
            "Deployment does not have minimum availability.".into(),
        )
    };
    let rs_name = current.map(|rs| meta::name(rs)).unwrap_or_default();
    let complete = updated == desired && total == desired && available == desired;
    let progressing = if complete {
        condition(
            "Progressing",
            true,
            "NewReplicaSetAvailable",
            format!("ReplicaSet \"{rs_name}\" has successfully progressed."),
        )
    } else {
        condition(
            "Progressing",
            true,
            "ReplicaSetUpdated",
            format!("ReplicaSet \"{rs_name}\" is progressing."),
        )
    };
    let mut status = json!({
        "observedGeneration": int(deployment, "/metadata/generation"),
        "replicas": total,
        "updatedReplicas": updated,
        "readyReplicas": ready,
        "availableReplicas": available,
        "conditions": [available_condition, progressing],
    });
    if desired > available {
        status["unavailableReplicas"] = json!(desired - available);
    }
    // As the API server serves them: zero counts are left out.
    if let Some(map) = status.as_object_mut() {
        map.retain(|_, v| v.as_i64() != Some(0));
    }
    status
}

/// What the ReplicaSet controller does to one ReplicaSet's pods.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum ReplicaSetAction {
    /// Create this many pods from the template.
    Create(usize),
    /// Delete these pods.
    Delete(Vec<String>),
}

/// Pods to create or delete so that `replica_set` owns `spec.replicas` active pods (the
/// unready and the youngest go first).
pub(crate) fn replica_set_plan(replica_set: &Value, pods: &[Arc<Value>]) -> Vec<ReplicaSetAction> {
    if meta::is_deleting(replica_set) {
        return Vec::new();
    }
    let mut active: Vec<&Arc<Value>> = owned_by(replica_set, pods)
        .into_iter()
        .filter(|pod| is_active(pod))
        .collect();
    let desired = usize::try_from(replicas(replica_set).max(0)).unwrap_or(0);
    if active.len() < desired {
        return vec![ReplicaSetAction::Create(desired - active.len())];
    }
    if active.len() > desired {
        active.sort_by(|a, b| {
            (is_ready(a), meta::meta_str(b, "creationTimestamp"))
                .cmp(&(is_ready(b), meta::meta_str(a, "creationTimestamp")))
        });
        let extra = active.len() - desired;
        return vec![ReplicaSetAction::Delete(
            active
                .iter()
                .take(extra)
                .map(|pod| meta::name(pod).to_owned())
                .collect(),
        )];
    }
    Vec::new()
}

/// A ReplicaSet's status from its pods.
pub(crate) fn replica_set_status(replica_set: &Value, pods: &[Arc<Value>]) -> Value {
    let owned: Vec<&Arc<Value>> = owned_by(replica_set, pods)
        .into_iter()
        .filter(|pod| is_active(pod))
        .collect();
    let count = |f: &dyn Fn(&Value) -> bool| owned.iter().filter(|pod| f(pod)).count();
    let template_labels = replica_set
        .pointer("/spec/template/metadata/labels")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let fully_labeled = count(&|pod| {
        let labels = meta::labels(pod);
        template_labels
            .iter()
            .all(|(k, v)| labels.get(k).map(String::as_str) == v.as_str())
    });
    let ready = count(&|pod| is_ready(pod));
    let mut status = json!({
        "replicas": owned.len(),
        "fullyLabeledReplicas": fully_labeled,
        "readyReplicas": ready,
        "availableReplicas": ready,
        "observedGeneration": int(replica_set, "/metadata/generation"),
    });
    if let Some(map) = status.as_object_mut() {
        map.retain(|key, v| key == "replicas" || v.as_i64() != Some(0));
    }
    status
}

/// `conditions` with the times of `old` kept where a condition's status did not change.
fn with_times(conditions: &Value, old: Option<&Value>) -> Value {
    let now = meta::now();
    let old = old.and_then(Value::as_array).cloned().unwrap_or_default();
    let list = conditions
        .as_array()
        .into_iter()
        .flatten()
        .map(|condition| {
            let mut condition = condition.clone();
            let previous = old.iter().find(|c| c.get("type") == condition.get("type"));
            let (transition, update) = match previous {
                Some(p) if p.get("status") == condition.get("status") => {
                    let transition = p
                        .get("lastTransitionTime")
                        .cloned()
                        .unwrap_or_else(|| json!(now));
                    let same = p.get("reason") == condition.get("reason")
                        && p.get("message") == condition.get("message");
                    let update = if same {
                        p.get("lastUpdateTime")
                            .cloned()
                            .unwrap_or_else(|| json!(now))
                    } else {
                        json!(now)
                    };
                    (transition, update)
                }
                _ => (json!(now), json!(now)),
            };
            condition["lastTransitionTime"] = transition;
            condition["lastUpdateTime"] = update;
            condition
        })
        .collect();
    Value::Array(list)
}

/// Writes `status` (computed without condition times) when it differs from the stored one.
fn write_status(objects: &ApiObjects, key: &StorageKey, object: &Value, mut status: Value) {
    if let Some(conditions) = status.get("conditions").cloned() {
        status["conditions"] = with_times(&conditions, object.pointer("/status/conditions"));
    }
    if object.get("status") == Some(&status) {
        return;
    }
    objects.mutate(key, meta::namespace(object), meta::name(object), |stored| {
        if stored.get("status") == Some(&status) {
            return false;
        }
        stored["status"] = status.clone();
        true
    });
}

fn controller_options() -> WriteOptions {
    WriteOptions {
        manager: MANAGER.to_owned(),
        ..WriteOptions::default()
    }
}

/// Sets `spec.replicas` of a ReplicaSet (and its revision annotations), bumping its generation.
fn scale_replica_set(
    objects: &ApiObjects,
    namespace: &str,
    name: &str,
    replicas: i64,
    revision: Option<i64>,
    desired: i64,
) {
    objects.mutate(&replica_sets_key(), namespace, name, |rs| {
        let before = rs.clone();
        rs["spec"]["replicas"] = json!(replicas);
        let annotations = meta::meta_mut(rs)
            .entry("annotations")
            .or_insert_with(|| json!({}));
        if let Some(annotations) = annotations.as_object_mut() {
            annotations.insert(DESIRED_REPLICAS.into(), json!(desired.to_string()));
            if let Some(revision) = revision {
                annotations.insert(REVISION.into(), json!(revision.to_string()));
            }
        }
        if rs.get("spec") != before.get("spec") {
            let generation = int(rs, "/metadata/generation") + 1;
            meta::meta_mut(rs).insert("generation".into(), json!(generation));
        }
        *rs != before
    });
}

/// Runs both controllers over one namespace.
pub(crate) fn sync_namespace(objects: &ApiObjects, namespace: &str) {
    let store = &objects.store;
    let (deployments, _) = store.list(&deployments_key(), Some(namespace));
    let (replica_sets, _) = store.list(&replica_sets_key(), Some(namespace));
    if deployments.is_empty() && replica_sets.is_empty() {
        return;
    }
    let Ok(rs_info) = objects.builtin("apps", "replicasets") else {
        return;
    };
    for deployment in &deployments {
        let desired = replicas(deployment);
        for action in deployment_plan(deployment, &replica_sets) {
            match action {
                DeploymentAction::Create(replica_set) => {
                    if let Err(error) =
                        objects.create(&rs_info, namespace, replica_set, &controller_options())
                    {
                        tracing::debug!(%error, "creating a ReplicaSet failed");
                    }
                }
                DeploymentAction::Scale {
                    name,
                    replicas,
                    revision,
                } => scale_replica_set(objects, namespace, &name, replicas, revision, desired),
                DeploymentAction::Delete(name) => {
                    let _ = objects.delete(&rs_info, namespace, &name, &DeleteOptions::default());
                }
            }
        }
    }
    // The writes above changed the ReplicaSets; read them again.
    let (replica_sets, _) = store.list(&replica_sets_key(), Some(namespace));
    let (pods, _) = store.list(&pods_key(), Some(namespace));
    let Ok(pod_info) = objects.builtin("", "pods") else {
        return;
    };
    for replica_set in &replica_sets {
        for action in replica_set_plan(replica_set, &pods) {
            match action {
                ReplicaSetAction::Create(count) => {
                    for _ in 0..count {
                        let pod = pod_from_template(replica_set);
                        if let Err(error) =
                            objects.create(&pod_info, namespace, pod, &controller_options())
                        {
                            tracing::debug!(%error, "creating a ReplicaSet's pod failed");
                        }
                    }
                }
                ReplicaSetAction::Delete(names) => {
                    for name in names {
                        let _ =
                            objects.delete(&pod_info, namespace, &name, &DeleteOptions::default());
                    }
                }
            }
        }
        write_status(
            objects,
            &replica_sets_key(),
            replica_set,
            replica_set_status(replica_set, &pods),
        );
    }
    let (replica_sets, _) = store.list(&replica_sets_key(), Some(namespace));
    for deployment in deployments.iter().filter(|d| !meta::is_deleting(d)) {
        let newest = owned_by(deployment, &replica_sets)
            .iter()
            .map(|rs| revision(rs))
            .max();
        if let Some(newest) = newest.filter(|r| *r != revision(deployment)) {
            objects.mutate(
                &deployments_key(),
                namespace,
                meta::name(deployment),
                |object| {
                    let annotations = meta::meta_mut(object)
                        .entry("annotations")
                        .or_insert_with(|| json!({}));
                    match annotations.as_object_mut() {
                        Some(map) => {
                            map.insert(REVISION.into(), json!(newest.to_string()));
                            true
                        }
                        None => false,
                    }
                },
            );
        }
        write_status(
            objects,
            &deployments_key(),
            deployment,
            deployment_status(deployment, &replica_sets),
        );
    }
}

/// A pod for `replica_set`, from its template (named `<replica set>-<5 random characters>`).
fn pod_from_template(replica_set: &Value) -> Value {
    let template = replica_set
        .pointer("/spec/template")
        .cloned()
        .unwrap_or_else(|| json!({}));
    let mut metadata = template
        .get("metadata")
        .cloned()
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}));
    if let Some(map) = metadata.as_object_mut() {
        map.remove("name");
        map.remove("creationTimestamp");
        map.insert(
            "generateName".into(),
            json!(format!("{}-", meta::name(replica_set))),
        );
        map.insert(
            "ownerReferences".into(),
            json!([owner_reference(replica_set, "ReplicaSet")]),
        );
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
           "spec": template.get("spec").cloned().unwrap_or_else(|| json!({}))})
}

/// Whether the objects of `key` feed these controllers.
pub(crate) fn watches(key: &StorageKey) -> bool {
    *key == deployments_key() || *key == replica_sets_key() || *key == pods_key()
}

/// Whether `selector` selects a pod's labels (for validation: a Deployment's selector must
/// select its own template).
pub(crate) fn selector_matches_template(object: &Value) -> bool {
    let Some(selector) = object.pointer("/spec/selector") else {
        return false;
    };
    let template = object.pointer("/spec/template").unwrap_or(&Value::Null);
    selects(selector, &meta::labels(template))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn deployment(image: &str, replicas: i64) -> Value {
        json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "d-uid", "generation": 2},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
                     "template": {"metadata": {"labels": {"app": "web"}},
                                  "spec": {"containers": [{"name": "c", "image": image}]}}}
        })
    }

    fn stored(mut object: Value, uid: &str, status: Value) -> Arc<Value> {
        object["metadata"]["uid"] = json!(uid);
        object["status"] = status;
        Arc::new(object)
    }

    #[test]
    fn template_hashes_ignore_key_order_and_follow_content() {
        let a = json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"x": 1}});
        let b: Value = serde_json::from_str(
            r#"{"spec": {"x": 1}, "metadata": {"labels": {"b": "2", "a": "1"}}}"#,
        )
        .unwrap();
        assert_eq!(template_hash(&a), template_hash(&b));
        assert_ne!(template_hash(&a), template_hash(&json!({"spec": {"x": 2}})));
        assert!(
            template_hash(&a)
                .chars()
                .all(|c| "bcdfghjklmnpqrstvwxz2456789".contains(c))
        );
    }

    #[test]
    fn a_new_deployment_gets_a_labelled_owned_replica_set() {
        let d = deployment("img:1", 2);
        let actions = deployment_plan(&d, &[]);
        let [DeploymentAction::Create(rs)] = actions.as_slice() else {
            panic!("{actions:?}");
        };
        let hash = template_hash(&d["spec"]["template"]);
        assert_eq!(rs["metadata"]["name"], json!(format!("web-{hash}")));
        assert_eq!(rs["spec"]["replicas"], json!(2));
        assert_eq!(
            rs["spec"]["selector"]["matchLabels"],
            json!({"app": "web", "pod-template-hash": hash})
        );
        assert_eq!(
            rs["spec"]["template"]["metadata"]["labels"][POD_TEMPLATE_HASH],
            json!(hash)
        );
        assert_eq!(rs["metadata"]["annotations"][REVISION], json!("1"));
        assert_eq!(
            rs["metadata"]["ownerReferences"],
            json!([{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": "d-uid",
                    "controller": true, "blockOwnerDeletion": true}])
        );
    }

    /// A ReplicaSet of `deployment` at `revision` with `spec` replicas, `available` of them
    /// available.
    fn set_of(deployment: &Value, revision: i64, spec: i64, available: i64) -> Arc<Value> {
        let hash = template_hash(&deployment["spec"]["template"]);
        let mut rs = new_replica_set(deployment, &hash, revision);
        rs["spec"]["replicas"] = json!(spec);
        rs["metadata"]["annotations"][DESIRED_REPLICAS] = json!(replicas(deployment).to_string());
        stored(
            rs,
            &format!("rs{revision}"),
            json!({"replicas": spec, "readyReplicas": available, "availableReplicas": available}),
        )
    }

    fn scale(deployment: &Value, replicas: i64) -> DeploymentAction {
        DeploymentAction::Scale {
            name: format!("web-{}", template_hash(&deployment["spec"]["template"])),
            replicas,
            revision: None,
        }
    }

    #[test]
    fn a_template_change_rolls_replicas_over_within_surge_and_unavailability() {
        // 4 replicas: maxSurge 25 % is 1, maxUnavailable 25 % is 1.
        let old_d = deployment("img:1", 4);
        let d = deployment("img:2", 4);
        let old = |spec, available| set_of(&old_d, 1, spec, available);
        let new = |spec, available| set_of(&d, 2, spec, available);
        // The new ReplicaSet starts with the surge; one old pod may go at once.
        let actions = deployment_plan(&d, &[old(4, 4)]);
        let [DeploymentAction::Create(created), shrink] = actions.as_slice() else {
            panic!("{actions:?}");
        };
        assert_eq!(created["spec"]["replicas"], json!(1));
        assert_eq!(created["metadata"]["annotations"][REVISION], json!("2"));
        assert_eq!(shrink, &scale(&old_d, 3));
        // Room again: the new one grows; nothing more is available, so the old one waits.
        assert_eq!(
            deployment_plan(&d, &[old(3, 3), new(1, 0)]),
            vec![scale(&d, 2)]
        );
        let waiting = [old(3, 3), new(2, 0)];
        assert_eq!(deployment_plan(&d, &waiting), vec![]);
        let status = deployment_status(&d, &waiting);
        assert_eq!(status["updatedReplicas"], json!(2));
        assert_eq!(
            status["conditions"][1]["reason"],
            json!("ReplicaSetUpdated")
        );
        // New pods available: old ones go, as many as availability allows.
        assert_eq!(
            deployment_plan(&d, &[old(3, 3), new(2, 2)]),
            vec![scale(&old_d, 1)]
        );
        assert_eq!(
            deployment_plan(&d, &[old(1, 1), new(2, 2)]),
            vec![scale(&d, 4)]
        );
        assert_eq!(
            deployment_plan(&d, &[old(1, 1), new(4, 4)]),
            vec![scale(&old_d, 0)]
        );
        let done = [old(0, 0), new(4, 4)];
        assert_eq!(deployment_plan(&d, &done), vec![]);
        let hash = template_hash(&d["spec"]["template"]);
        assert_eq!(
            deployment_status(&d, &done),
            json!({"observedGeneration": 2, "replicas": 4, "updatedReplicas": 4,
                   "readyReplicas": 4, "availableReplicas": 4,
                   "conditions": [
                       {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable",
                        "message": "Deployment has minimum availability."},
                       {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable",
                        "message": format!("ReplicaSet \"web-{hash}\" has successfully progressed.")}]})
        );
    }

    #[test]
    fn recreate_empties_the_old_replica_sets_before_the_new_one_grows() {
        let mut old_d = deployment("img:1", 2);
        old_d["spec"]["strategy"] = json!({"type": "Recreate"});
        let mut d = old_d.clone();
        d["spec"]["template"]["spec"]["containers"][0]["image"] = json!("img:2");
        let actions = deployment_plan(&d, &[set_of(&old_d, 1, 2, 2)]);
        let [DeploymentAction::Create(created), shrink] = actions.as_slice() else {
            panic!("{actions:?}");
        };
        assert_eq!(created["spec"]["replicas"], json!(0));
        assert_eq!(shrink, &scale(&old_d, 0));
        // Old pods still terminating: the new one waits; once gone, it grows.
        let mut terminating = (*set_of(&old_d, 1, 0, 0)).clone();
        terminating["status"]["replicas"] = json!(1);
        let new = set_of(&d, 2, 0, 0);
        assert_eq!(
            deployment_plan(&d, &[Arc::new(terminating), new.clone()]),
            vec![]
        );
        assert_eq!(
            deployment_plan(&d, &[set_of(&old_d, 1, 0, 0), new]),
            vec![scale(&d, 2)]
        );
    }

    fn pod(name: &str, owner: &str, ready: bool, created: &str) -> Arc<Value> {
        Arc::new(json!({
            "metadata": {"name": name, "creationTimestamp": created, "labels": {"app": "web"},
                         "ownerReferences": [{"uid": owner, "controller": true, "kind": "ReplicaSet",
                                              "name": "rs", "apiVersion": "apps/v1"}]},
            "status": {"phase": "Running",
                       "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}
        }))
    }

    #[test]
    fn replica_sets_create_missing_pods_and_delete_unready_and_young_extras_first() {
        let mut rs = json!({"metadata": {"name": "rs", "uid": "rs-uid", "generation": 1},
                            "spec": {"replicas": 3,
                                     "template": {"metadata": {"labels": {"app": "web"}}}}});
        let pods = vec![
            pod("a", "rs-uid", true, "2024-01-01T00:00:00Z"),
            pod("b", "rs-uid", true, "2024-01-01T00:00:02Z"),
            pod("c", "other", true, "2024-01-01T00:00:00Z"),
        ];
        assert_eq!(
            replica_set_plan(&rs, &pods),
            vec![ReplicaSetAction::Create(1)]
        );
        let more = [
            pods.clone(),
            vec![
                pod("d", "rs-uid", false, "2024-01-01T00:00:01Z"),
                pod("e", "rs-uid", true, "2024-01-01T00:00:03Z"),
            ],
        ]
        .concat();
        rs["spec"]["replicas"] = json!(2);
        assert_eq!(
            replica_set_plan(&rs, &more),
            vec![ReplicaSetAction::Delete(vec!["d".into(), "e".into()])]
        );
        assert_eq!(
            replica_set_status(&rs, &more),
            json!({"replicas": 4, "fullyLabeledReplicas": 4, "readyReplicas": 3,
                   "availableReplicas": 3, "observedGeneration": 1})
        );
        let pod_of = pod_from_template(&rs);
        assert_eq!(pod_of["metadata"]["generateName"], json!("rs-"));
        assert_eq!(
            pod_of["metadata"]["ownerReferences"][0]["uid"],
            json!("rs-uid")
        );
    }

    #[test]
    fn selectors_render_as_query_strings() {
        let selector = json!({"matchLabels": {"a": "1"},
                              "matchExpressions": [{"key": "b", "operator": "In", "values": ["x", "y"]},
                                                   {"key": "c", "operator": "DoesNotExist"}]});
        assert_eq!(selector_string(&selector), "a=1,b in (x,y),!c");
        let d = deployment("i", 1);
        assert!(selector_matches_template(&d));
        let mut wrong = d;
        wrong["spec"]["selector"]["matchLabels"]["app"] = json!("other");
        assert!(!selector_matches_template(&wrong));
    }
}
