//! The kubelet's Node: registers it (labels, addresses, capacity and allocatable, the `Ready`
//! condition, node info and the kubelet's endpoint), renews its heartbeat Lease in
//! `kube-node-lease` and reports the `Ready` condition again at each status interval, as a
//! real kubelet does with its node lease and node status loops.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::error::{Error, Result};

/// The namespace of node heartbeat Leases.
const LEASE_NAMESPACE: &str = "kube-node-lease";

/// What the node says about itself.
#[derive(Clone, Debug)]
pub(crate) struct NodeSpec {
    pub(crate) name: String,
    /// Port of the kubelet API on the node's address, when it serves one.
    pub(crate) kubelet_port: Option<u16>,
    pub(crate) lease_duration: Duration,
    pub(crate) capacity: crate::kubelet::NodeCapacity,
}

fn now() -> String {
    agent_sandbox_api::time::format(Timestamp::now())
}

/// The node's `Ready` condition, ready since `since`.
fn ready_condition(since: &str) -> Value {
    json!({"type": "Ready", "status": "True", "reason": "KubeletReady",
           "message": "kubelet is posting ready status",
           "lastHeartbeatTime": now(), "lastTransitionTime": since})
}

/// The Node's status as the kubelet reports it.
fn node_status(spec: &NodeSpec, ready_since: &str) -> Value {
    let mut status = json!({
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                      {"type": "Hostname", "address": spec.name}],
        "capacity": spec.capacity.to_json(),
        "allocatable": spec.capacity.to_json(),
        "conditions": [ready_condition(ready_since)],
        "nodeInfo": {"kubeletVersion": "v1.35.0-sim", "operatingSystem": "linux",
                     "architecture": go_arch(std::env::consts::ARCH), "containerRuntimeVersion": "sim://1",
                     "kernelVersion": "", "osImage": "agent-sandbox sim", "kubeProxyVersion": "",
                     "machineID": "", "systemUUID": "", "bootID": ""}
    });
    if let Some(port) = spec.kubelet_port {
        status["daemonEndpoints"] = json!({"kubeletEndpoint": {"Port": port}});
    }
    status
}

/// The Node object the kubelet registers.
fn node_object(spec: &NodeSpec, ready_since: &str) -> Value {
    let name = &spec.name;
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        // Only labels a kubelet may set itself: NodeRestriction refuses `node-role.*` ones.
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
            "kubernetes.io/arch": go_arch(std::env::consts::ARCH)}},
        "spec": {},
        "status": node_status(spec, ready_since),
    })
}

/// The architecture as Kubernetes names it (Go's `GOARCH`: `amd64`, not Rust's `x86_64`), which
/// is what `kubernetes.io/arch` node selectors ask for.
fn go_arch(rust_arch: &str) -> &str {
    match rust_arch {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "loongarch64" => "loong64",
        other => other,
    }
}

/// Registers the Node (or takes over an existing one of the same name) and writes its status
/// through the status subresource, which is what a real API server keeps. Returns the Node's
/// uid, which the heartbeat Lease is owned by.
pub(crate) async fn register(client: &kube::Client, spec: &NodeSpec) -> Result<String> {
    let register_err = |source| Error::RegisterNode {
        node: spec.name.clone(),
        source,
    };
    let api: Api<Node> = Api::all(client.clone());
    let since = now();
    let node: Node =
        serde_json::from_value(node_object(spec, &since)).map_err(|source| Error::NodeObject {
            node: spec.name.clone(),
            source,
        })?;
    match api.create(&PostParams::default(), &node).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.is_already_exists() => {}
        Err(source) => return Err(register_err(source)),
    }
    let written = api
        .patch_status(
            &spec.name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": node_status(spec, &since)})),
        )
        .await
        .map_err(register_err)?;
    Ok(written.metadata.uid.unwrap_or_default())
}

/// Creates or renews the node's Lease: held by the node, for `lease_duration`, renewed now.
pub(crate) async fn renew_lease(
    client: &kube::Client,
    spec: &NodeSpec,
    node_uid: &str,
) -> Result<()> {
    let lease_err = |source| Error::Lease {
        node: spec.name.clone(),
        source,
    };
    let api: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    let renew_time = Some(MicroTime(Timestamp::now()));
    let patch = json!({"spec": {"renewTime": renew_time, "holderIdentity": spec.name}});
    match api
        .patch(&spec.name, &PatchParams::default(), &Patch::Merge(patch))
        .await
    {
        Ok(_) => return Ok(()),
        Err(kube::Error::Api(status)) if status.is_not_found() => {}
        Err(source) => return Err(lease_err(source)),
    }
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(spec.name.clone()),
            namespace: Some(LEASE_NAMESPACE.to_owned()),
            // As a real kubelet's: the Lease goes when its Node does.
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".to_owned(),
                kind: "Node".to_owned(),
                name: spec.name.clone(),
                uid: node_uid.to_owned(),
                ..OwnerReference::default()
            }]),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(spec.name.clone()),
            lease_duration_seconds: Some(
                i32::try_from(spec.lease_duration.as_secs()).unwrap_or(i32::MAX),
            ),
            renew_time,
            ..LeaseSpec::default()
        }),
    };
    match api.create(&PostParams::default(), &lease).await {
        Ok(_) => Ok(()),
        // Created meanwhile by an earlier run of this node: renewed at the next beat.
        Err(kube::Error::Api(status)) if status.is_already_exists() => Ok(()),
        Err(source) => Err(lease_err(source)),
    }
}

/// Reports the `Ready` condition again (a fresh `lastHeartbeatTime`), keeping its transition
/// time.
pub(crate) async fn report_ready(client: &kube::Client, spec: &NodeSpec) -> Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    let register_err = |source| Error::RegisterNode {
        node: spec.name.clone(),
        source,
    };
    let node = api.get(&spec.name).await.map_err(register_err)?;
    let since = node
        .status
        .and_then(|status| status.conditions)
        .into_iter()
        .flatten()
        .find(|c| c.type_ == "Ready" && c.status == "True")
        .and_then(|c| c.last_transition_time)
        .map_or_else(now, |t| agent_sandbox_api::time::format(t.0));
    api.patch_status(
        &spec.name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"conditions": [ready_condition(&since)]}})),
    )
    .await
    .map_err(register_err)?;
    Ok(())
}

/// The heartbeat: renews the Lease every `heartbeat` and reports `Ready` every `status_every`,
/// until dropped. Failures are logged and retried at the next beat, as a real kubelet's are.
pub(crate) async fn heartbeat(
    client: kube::Client,
    spec: NodeSpec,
    node_uid: String,
    heartbeat: Duration,
    status_every: Duration,
) {
    let mut beats = tokio::time::interval(heartbeat);
    beats.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut reports = tokio::time::interval(status_every);
    reports.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Both were written at registration; the first ticks are immediate.
    beats.tick().await;
    reports.tick().await;
    loop {
        tokio::select! {
            _ = beats.tick() => {
                if let Err(error) = renew_lease(&client, &spec, &node_uid).await {
                    tracing::warn!(error = %error_chain(&error), "node heartbeat failed");
                }
            }
            _ = reports.tick() => {
                if let Err(error) = report_ready(&client, &spec).await {
                    tracing::warn!(error = %error_chain(&error), "node status report failed");
                }
            }
        }
    }
}

/// An error with its causes, for logs.
pub(crate) fn error_chain(error: &dyn std::error::Error) -> String {
    std::iter::successors(Some(error), |e| e.source())
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(": ")
}
