//! The small control loops a cluster runs besides the kubelet and the garbage collector:
//! EndpointSlices from Services and Ready pods, the namespace lifecycle (default
//! ServiceAccount, content removal on deletion) and instant binding of PersistentVolumeClaims.
//!
//! [`desired_slice`] is the pure decision; [`run`] reacts to store events.

use std::collections::BTreeMap;
use std::sync::Arc;

use agent_sandbox_api::labels::ENDPOINTSLICE_SERVICE_NAME;
use serde_json::{Value, json};
use tokio::sync::broadcast::{self, error::RecvError};

use crate::meta;
use crate::ops::{ApiObjects, DeleteOptions, NAMESPACE_FINALIZER, should_remove};
use crate::resources::{Builtin, StorageKey};
use crate::selector::LabelSelector;
use crate::store::{Change, EventType};

/// `endpointslice.kubernetes.io/managed-by` value of the slices the sim maintains.
const MANAGED_BY: &str = "endpointslice-controller.k8s.io";

fn pods_key() -> StorageKey {
    StorageKey::new("", "pods")
}
fn services_key() -> StorageKey {
    StorageKey::new("", "services")
}
fn slices_key() -> StorageKey {
    StorageKey::new("discovery.k8s.io", "endpointslices")
}
fn namespaces_key() -> StorageKey {
    StorageKey::new("", "namespaces")
}

/// Name of the EndpointSlice the sim keeps for a Service.
pub(crate) fn slice_name(service: &str) -> String {
    format!(
        "{service}-{:05x}",
        agent_sandbox_api::fnv1a_32(service.as_bytes()) & 0xfffff
    )
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

/// Resolves a Service `targetPort` (number or container port name) against a pod.
fn target_port(port: &Value, pod: Option<&Value>) -> Option<i64> {
    let target = port.get("targetPort").or_else(|| port.get("port"))?;
    if let Some(number) = target.as_i64() {
        return Some(number);
    }
    let name = target.as_str()?;
    if let Ok(number) = name.parse() {
        return Some(number);
    }
    pod?.pointer("/spec/containers")?
        .as_array()?
        .iter()
        .flat_map(|c| {
            c.get("ports")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
        })
        .find(|p| p.get("name").and_then(Value::as_str) == Some(name))
        .and_then(|p| p.get("containerPort").and_then(Value::as_i64))
}

/// The EndpointSlice a Service should have, given the pods of its namespace; `None` for a
/// Service without a selector (its slices are the user's business).
pub(crate) fn desired_slice(service: &Value, pods: &[Arc<Value>]) -> Option<Value> {
    let selector: BTreeMap<String, String> = service
        .pointer("/spec/selector")
        .and_then(Value::as_object)
        .filter(|map| !map.is_empty())?
        .iter()
        .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned())))
        .collect();
    let selector = LabelSelector::from_map(&selector);
    let namespace = meta::namespace(service);
    let name = meta::name(service);
    let mut selected: Vec<&Arc<Value>> = pods
        .iter()
        .filter(|pod| meta::namespace(pod) == namespace)
        .filter(|pod| selector.matches(&meta::labels(pod)))
        .filter(|pod| {
            pod.pointer("/status/podIP")
                .and_then(Value::as_str)
                .is_some_and(|ip| !ip.is_empty())
        })
        .filter(|pod| {
            !matches!(
                pod.pointer("/status/phase").and_then(Value::as_str),
                Some("Succeeded" | "Failed")
            )
        })
        .collect();
    selected.sort_by(|a, b| meta::name(a).cmp(meta::name(b)));
    let endpoints: Vec<Value> = selected
        .iter()
        .map(|pod| {
            let terminating = meta::is_deleting(pod);
            let ready = is_ready(pod);
            json!({
                "addresses": [pod.pointer("/status/podIP").cloned().unwrap_or(Value::Null)],
                "conditions": {"ready": ready && !terminating, "serving": ready, "terminating": terminating},
                "targetRef": {"kind": "Pod", "namespace": namespace, "name": meta::name(pod),
                              "uid": meta::uid(pod)},
                "nodeName": pod.pointer("/spec/nodeName").cloned().unwrap_or(Value::Null),
            })
        })
        .collect();
    let first = selected.first().map(|pod| pod.as_ref());
    let ports: Vec<Value> = service
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|port| {
            let number = target_port(port, first)?;
            let mut out = json!({
                "port": number,
                "protocol": port.get("protocol").cloned().unwrap_or(json!("TCP")),
                "name": port.get("name").cloned().unwrap_or(json!("")),
            });
            if let Some(app) = port.get("appProtocol") {
                out["appProtocol"] = app.clone();
            }
            Some(out)
        })
        .collect();
    let mut labels = meta::labels(service);
    labels.insert(ENDPOINTSLICE_SERVICE_NAME.to_owned(), name.to_owned());
    labels.insert(
        "endpointslice.kubernetes.io/managed-by".to_owned(),
        MANAGED_BY.to_owned(),
    );
    Some(json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": slice_name(name),
            "namespace": namespace,
            "labels": labels,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": name,
                                 "uid": meta::uid(service), "controller": true,
                                 "blockOwnerDeletion": true}],
        },
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": ports,
    }))
}

/// The conditions the namespace controller keeps on a terminating namespace, given the
/// instances left per `plural.group` and the finalizers they carry (without times).
pub(crate) fn namespace_conditions(
    remaining: &BTreeMap<String, usize>,
    finalizers: &BTreeMap<String, usize>,
) -> Vec<Value> {
    let condition = |type_: &str, status: bool, reason: &str, message: String| {
        json!({"type": type_, "status": if status { "True" } else { "False" },
               "reason": reason, "message": message})
    };
    let listed = |counts: &BTreeMap<String, usize>, what: &str| {
        counts
            .iter()
            .map(|(name, count)| format!("{name} {what} {count} resource instances"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    vec![
        condition(
            "NamespaceDeletionDiscoveryFailure",
            false,
            "ResourcesDiscovered",
            "All resources successfully discovered".into(),
        ),
        condition(
            "NamespaceDeletionGroupVersionParsingFailure",
            false,
            "ParsedGroupVersions",
            "All legacy kube types successfully parsed".into(),
        ),
        condition(
            "NamespaceDeletionContentFailure",
            false,
            "ContentDeleted",
            "All content successfully deleted, may be waiting on finalization".into(),
        ),
        if remaining.is_empty() {
            condition(
                "NamespaceContentRemaining",
                false,
                "ContentRemoved",
                "All content successfully removed".into(),
            )
        } else {
            condition(
                "NamespaceContentRemaining",
                true,
                "SomeResourcesRemain",
                format!("Some resources are remaining: {}", listed(remaining, "has")),
            )
        },
        if finalizers.is_empty() {
            condition(
                "NamespaceFinalizersRemaining",
                false,
                "ContentHasNoFinalizers",
                "All content-preserving finalizers finished".into(),
            )
        } else {
            condition(
                "NamespaceFinalizersRemaining",
                true,
                "SomeFinalizersRemain",
                format!(
                    "Some content in the namespace has finalizers remaining: {}",
                    listed(finalizers, "in")
                ),
            )
        },
    ]
}

/// Whether two slices differ in what clients read.
fn slice_differs(current: &Value, desired: &Value) -> bool {
    current.get("endpoints") != desired.get("endpoints")
        || current.get("ports") != desired.get("ports")
        || current.pointer("/metadata/labels") != desired.pointer("/metadata/labels")
}

/// The loops, over the API's objects.
#[derive(Debug)]
pub(crate) struct Controllers {
    objects: Arc<ApiObjects>,
}

impl Controllers {
    pub(crate) fn new(objects: Arc<ApiObjects>) -> Self {
        Self { objects }
    }

    /// Brings the EndpointSlices of the Services in `namespace` up to date.
    fn sync_endpoints(&self, namespace: &str) {
        let store = &self.objects.store;
        let (services, _) = store.list(&services_key(), Some(namespace));
        if services.is_empty() {
            return;
        }
        let (pods, _) = store.list(&pods_key(), Some(namespace));
        let Ok(slices) = self.objects.builtin("discovery.k8s.io", "endpointslices") else {
            return;
        };
        for service in services.iter().filter(|s| !meta::is_deleting(s)) {
            let name = slice_name(meta::name(service));
            let current = store.get(&slices_key(), namespace, &name);
            match (desired_slice(service, &pods), current) {
                (Some(desired), None) => {
                    if let Err(error) = self.objects.create_internal(&slices, desired) {
                        tracing::debug!(%error, "creating EndpointSlice failed");
                    }
                }
                (Some(desired), Some(current)) if slice_differs(&current, &desired) => {
                    self.objects
                        .mutate(&slices_key(), namespace, &name, |object| {
                            for field in ["endpoints", "ports"] {
                                object[field] = desired[field].clone();
                            }
                            meta::meta_mut(object)
                                .insert("labels".into(), desired["metadata"]["labels"].clone());
                            true
                        });
                }
                (None, Some(_)) => {
                    let _ =
                        self.objects
                            .delete(&slices, namespace, &name, &DeleteOptions::default());
                }
                _ => {}
            }
        }
    }

    fn on_namespace(&self, namespace: &Value) {
        let name = meta::name(namespace).to_owned();
        if meta::is_deleting(namespace) {
            self.finalize_namespace(&name);
            return;
        }
        let key = StorageKey::new("", "serviceaccounts");
        if self.objects.store.get(&key, &name, "default").is_none()
            && let Ok(accounts) = self.objects.builtin("", "serviceaccounts")
        {
            let _ = self.objects.create_internal(
                &accounts,
                json!({"metadata": {"name": "default", "namespace": name}}),
            );
        }
    }

    /// Deletes the content of a terminating namespace, reports what remains in its conditions,
    /// and, once nothing is left, removes the `kubernetes` finalizer (through which the
    /// namespace goes when no other finalizer holds it), as the namespace controller does.
    fn finalize_namespace(&self, namespace: &str) {
        let mut remaining = BTreeMap::<String, usize>::new();
        let mut finalizers = BTreeMap::<String, usize>::new();
        for key in self.objects.store.keys() {
            if key == namespaces_key() {
                continue;
            }
            let (items, _) = self.objects.store.list(&key, Some(namespace));
            if items.is_empty() {
                continue;
            }
            let Some(info) = self.objects.info_for_storage(&key) else {
                continue;
            };
            if !info.namespaced {
                continue;
            }
            remaining.insert(format!("{}.{}", info.plural, info.group), items.len());
            for finalizer in items.iter().flat_map(|item| meta::finalizers(item)) {
                *finalizers.entry(finalizer).or_default() += 1;
            }
            for item in items.iter().filter(|item| !meta::is_deleting(item)) {
                let _ = self.objects.delete(
                    &info,
                    namespace,
                    meta::name(item),
                    &DeleteOptions::default(),
                );
            }
        }
        let conditions = namespace_conditions(&remaining, &finalizers);
        self.objects
            .mutate(&namespaces_key(), "", namespace, |object| {
                let before = object.clone();
                let old = object
                    .pointer("/status/conditions")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                let now = meta::now();
                let merged: Vec<Value> = conditions
                    .iter()
                    .map(|condition| {
                        let mut condition = condition.clone();
                        let same = old.iter().find(|c| c.get("type") == condition.get("type"));
                        let time = match same {
                            Some(c) if c.get("status") == condition.get("status") => c
                                .get("lastTransitionTime")
                                .cloned()
                                .unwrap_or_else(|| json!(now)),
                            _ => json!(now),
                        };
                        condition["lastTransitionTime"] = time;
                        condition
                    })
                    .collect();
                if let Some(status) = object.get_mut("status").and_then(Value::as_object_mut) {
                    status.insert("conditions".into(), json!(merged));
                }
                if remaining.is_empty()
                    && let Some(Value::Array(list)) = object.pointer_mut("/spec/finalizers")
                {
                    list.retain(|f| f != NAMESPACE_FINALIZER);
                }
                *object != before || should_remove(Builtin::Namespace, object)
            });
    }

    fn on_claim(&self, claim: &Value) {
        if claim.pointer("/status/phase").and_then(Value::as_str) != Some("Pending")
            || meta::is_deleting(claim)
        {
            return;
        }
        let namespace = meta::namespace(claim).to_owned();
        let name = meta::name(claim).to_owned();
        let volume = format!("pvc-{}", meta::uid(claim));
        self.objects.mutate(
            &StorageKey::new("", "persistentvolumeclaims"),
            &namespace,
            &name,
            |object| {
                let modes = object
                    .pointer("/spec/accessModes")
                    .cloned()
                    .unwrap_or(json!(["ReadWriteOnce"]));
                let storage = object
                    .pointer("/spec/resources/requests/storage")
                    .cloned()
                    .unwrap_or(json!("1Gi"));
                if let Some(spec) = object.get_mut("spec").and_then(Value::as_object_mut) {
                    spec.insert("volumeName".into(), json!(volume));
                }
                object["status"] = json!({"phase": "Bound", "accessModes": modes,
                                           "capacity": {"storage": storage}});
                let annotations = meta::meta_mut(object)
                    .entry("annotations")
                    .or_insert_with(|| json!({}));
                annotations["pv.kubernetes.io/bind-completed"] = json!("yes");
                true
            },
        );
    }

    /// Reacts to one change.
    pub(crate) fn handle(&self, change: &Change) {
        let key = &change.key;
        let object = &change.object;
        if *key == namespaces_key() {
            if change.kind != EventType::Deleted {
                self.on_namespace(object);
            }
            return;
        }
        let namespace = meta::namespace(object);
        if crate::workloads::watches(key) {
            crate::workloads::sync_namespace(&self.objects, namespace);
        }
        if crate::gateway::watches(key) {
            crate::gateway::sync(&self.objects);
        }
        if *key == pods_key() || *key == services_key() {
            self.sync_endpoints(namespace);
        } else if *key == StorageKey::new("", "persistentvolumeclaims")
            && change.kind != EventType::Deleted
        {
            self.on_claim(object);
        }
        if change.kind == EventType::Deleted
            && !namespace.is_empty()
            && let Some(ns) = self.objects.store.get(&namespaces_key(), "", namespace)
            && meta::is_deleting(&ns)
        {
            self.finalize_namespace(namespace);
        }
    }

    /// Re-examines everything (after missed events).
    pub(crate) fn resync(&self) {
        crate::gateway::sync(&self.objects);
        let (namespaces, _) = self.objects.store.list(&namespaces_key(), None);
        for namespace in namespaces {
            self.on_namespace(&namespace);
            self.sync_endpoints(meta::name(&namespace));
            crate::workloads::sync_namespace(&self.objects, meta::name(&namespace));
        }
        let (claims, _) = self
            .objects
            .store
            .list(&StorageKey::new("", "persistentvolumeclaims"), None);
        for claim in claims {
            self.on_claim(&claim);
        }
    }
}

/// Runs the loops until the event channel closes.
pub(crate) async fn run(controllers: Controllers, mut events: broadcast::Receiver<Arc<Change>>) {
    controllers.resync();
    loop {
        match events.recv().await {
            Ok(change) => controllers.handle(&change),
            Err(RecvError::Lagged(_)) => controllers.resync(),
            Err(RecvError::Closed) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn pod(name: &str, ip: &str, ready: bool, labels: Value) -> Arc<Value> {
        Arc::new(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": format!("{name}-uid"), "labels": labels},
            "spec": {"nodeName": "sim-node",
                     "containers": [{"name": "c", "ports": [{"name": "http", "containerPort": 8080}]}]},
            "status": {"phase": "Running", "podIP": ip,
                       "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}
        }))
    }

    #[test]
    fn slices_list_selected_pods_with_readiness_and_resolved_ports() {
        let service = json!({
            "metadata": {"name": "svc", "namespace": "ns", "uid": "svc-uid"},
            "spec": {"selector": {"app": "r"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}
        });
        let pods = vec![
            pod("b", "127.1.1.2", false, json!({"app": "r"})),
            pod("a", "127.1.1.1", true, json!({"app": "r"})),
            pod("c", "127.1.1.3", true, json!({"app": "other"})),
        ];
        let slice = desired_slice(&service, &pods).unwrap();
        assert_eq!(
            slice["metadata"]["labels"][ENDPOINTSLICE_SERVICE_NAME],
            json!("svc")
        );
        assert_eq!(
            slice["metadata"]["ownerReferences"][0]["uid"],
            json!("svc-uid")
        );
        assert_eq!(
            slice["ports"],
            json!([{"port": 8080, "protocol": "TCP", "name": "http"}])
        );
        let endpoints = slice["endpoints"].as_array().unwrap();
        assert_eq!(endpoints.len(), 2);
        assert_eq!(endpoints[0]["addresses"], json!(["127.1.1.1"]));
        assert_eq!(endpoints[0]["conditions"]["ready"], json!(true));
        assert_eq!(endpoints[1]["conditions"]["ready"], json!(false));
    }

    #[test]
    fn services_without_selectors_have_no_managed_slice() {
        let service =
            json!({"metadata": {"name": "svc", "namespace": "ns"}, "spec": {"ports": []}});
        assert_eq!(desired_slice(&service, &[]), None);
    }
}
