//! `Sandbox` (`agents.x-k8s.io/v1beta1`) and the blueprint types it shares with
//! `SandboxTemplate` and `SandboxClaim`.
//!
//! Field names, optionality, defaults and validation follow upstream's v1beta1 CRD exactly (see
//! `../shared/spec/upstream-compat.md` §1.1–§1.2). Defaulted fields are plain values with
//! `#[serde(default)]`: the generated schema carries the default, so objects read back from the
//! API server always have them, and Rust code never has to re-implement the defaulting.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PersistentVolumeClaimSpec, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Labels and annotations for a pod; the only parts of `metadata` a pod template honours.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PodMetadata {
    /// Labels to put on the pod.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations to put on the pod.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl PodMetadata {
    /// True when there are neither labels nor annotations.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.annotations.is_empty()
    }
}

/// The subset of object metadata a PVC template may carry.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct EmbeddedObjectMetadata {
    /// Name of the template; the PVC is named `<name>-<sandbox>`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Labels to put on the PVC.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations to put on the PVC.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl EmbeddedObjectMetadata {
    /// True when no field is set.
    pub fn is_empty(&self) -> bool {
        self.name.is_empty() && self.labels.is_empty() && self.annotations.is_empty()
    }
}

/// The pod a sandbox runs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PodTemplate {
    /// The pod's spec, used as is (PVC-backed volumes are merged in by name).
    pub spec: PodSpec,
    /// Labels and annotations for the pod (system-prefixed keys are not copied).
    #[serde(default, skip_serializing_if = "PodMetadata::is_empty")]
    pub metadata: PodMetadata,
}

/// A PersistentVolumeClaim to create per sandbox (StatefulSet-style).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PersistentVolumeClaimTemplate {
    /// Name, labels and annotations of the claim.
    #[serde(default, skip_serializing_if = "EmbeddedObjectMetadata::is_empty")]
    pub metadata: EmbeddedObjectMetadata,
    /// The claim's spec.
    pub spec: PersistentVolumeClaimSpec,
}

/// What to build a sandbox from: shared by `Sandbox.spec` and `SandboxTemplate.spec`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxBlueprint {
    /// The pod to run.
    pub pod_template: PodTemplate,
    /// PersistentVolumeClaims to create for the sandbox, merged into the pod's volumes by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub volume_claim_templates: Vec<PersistentVolumeClaimTemplate>,
    /// Whether to create a headless Service named after the sandbox. Unset keeps an existing
    /// Service but creates none; `true` creates (or adopts) one; `false` deletes an owned one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<bool>,
}

/// What happens to a sandbox when its `shutdownTime` passes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum ShutdownPolicy {
    /// Delete the Sandbox object (and with it, through garbage collection, its pod, Service and
    /// PVCs).
    Delete,
    /// Keep the Sandbox object, marked `Ready=False/SandboxExpired`, with its pod and Service
    /// gone.
    #[default]
    Retain,
}

/// Expiry of a sandbox; inlined into `Sandbox.spec`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Lifecycle {
    /// Absolute time at which the sandbox expires; unset means never.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::time::deserialize_optional",
        serialize_with = "crate::time::serialize_optional"
    )]
    pub shutdown_time: Option<Time>,
    /// What expiry does.
    #[serde(default)]
    pub shutdown_policy: ShutdownPolicy,
}

/// What becomes of a running sandbox when `activeTTLSeconds` pass without activity.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum ActiveExpirationPolicy {
    /// It is suspended (`operatingMode: Suspended`: the pod goes, volumes and Service stay);
    /// the next request through the router resumes it.
    #[default]
    Suspend,
    /// It is deleted (a claimed sandbox: its claim, and the sandbox with it).
    Delete,
}

/// What becomes of a sandbox the idle lifecycle suspended when `suspendedTTLSeconds` pass.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum SuspendedExpirationPolicy {
    /// It is deleted (a claimed sandbox: its claim, and the sandbox with it).
    #[default]
    Delete,
    /// It stays suspended until resumed or deleted.
    Retain,
}

/// Suspension or deletion after inactivity (the shape of upstream's proposal #1160). Activity
/// is what goes through the router to the sandbox, including requests still running and open
/// streams; it is recorded in `status.lastActivityTime`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IdleLifecycle {
    /// Seconds without activity after which a running sandbox expires (unset: never).
    #[serde(
        rename = "activeTTLSeconds",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 1))]
    pub active_ttl_seconds: Option<i64>,
    /// What that expiry does (default `Suspend`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_expiration_policy: Option<ActiveExpirationPolicy>,
    /// Seconds a sandbox the idle lifecycle suspended stays suspended before it expires
    /// (unset: it stays).
    #[serde(
        rename = "suspendedTTLSeconds",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 1))]
    pub suspended_ttl_seconds: Option<i64>,
    /// What that expiry does (default `Delete`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspended_expiration_policy: Option<SuspendedExpirationPolicy>,
}

/// The merge patch that resumes a suspended Sandbox at `now` (RFC 3339): `operatingMode:
/// Running`, the idle clock restarted ([`annotations::ACTIVE_SINCE`]) and the idle suspension's
/// mark removed. What the router (resume on traffic), the SDK and the CLI send.
///
/// [`annotations::ACTIVE_SINCE`]: crate::annotations::ACTIVE_SINCE
pub fn resume_patch(now: &str) -> serde_json::Value {
    serde_json::json!({
        "metadata": {"annotations": {
            crate::annotations::ACTIVE_SINCE: now,
            crate::annotations::IDLE_SUSPENDED_AT: null,
        }},
        "spec": {"operatingMode": "Running"},
    })
}

/// The merge patch that suspends a Sandbox (`operatingMode: Suspended`); with `idle_at`, marked
/// as suspended by the idle lifecycle at that time (RFC 3339), which `suspendedTTLSeconds`
/// counts from.
pub fn suspend_patch(idle_at: Option<&str>) -> serde_json::Value {
    let mut patch = serde_json::json!({"spec": {"operatingMode": "Suspended"}});
    if let Some(at) = idle_at {
        patch["metadata"] = serde_json::json!({"annotations": {
            crate::annotations::IDLE_SUSPENDED_AT: at,
        }});
    }
    patch
}

/// Whether a sandbox's pod should exist.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum OperatingMode {
    /// The pod runs.
    #[default]
    Running,
    /// The pod is deleted; PVCs and the Service are kept, so `Running` brings it back with its
    /// data.
    Suspended,
}

/// A stateful singleton pod with a stable identity, optional storage and an expiry.
// Several `printcolumn(...)` arguments repeat `type_ = ...`: not a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    crates(kube_core = "::kube_core"),
    group = "agents.x-k8s.io",
    version = "v1beta1",
    kind = "Sandbox",
    plural = "sandboxes",
    singular = "sandbox",
    shortname = "sandbox",
    namespaced,
    status = "SandboxStatus",
    derive = "Default",
    derive = "PartialEq",
    doc = "Sandbox is a stateful singleton workload: one pod, optional PVCs and Service, an expiry.",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type=='Ready')].status"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type=='Ready')].reason"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "has(self.volumeClaimTemplates) == has(oldSelf.volumeClaimTemplates) && (!has(self.volumeClaimTemplates) || self.volumeClaimTemplates == oldSelf.volumeClaimTemplates)",
    "message": "volumeClaimTemplates is immutable",
}]))]
pub struct SandboxSpec {
    /// Pod template, volume claim templates and Service switch.
    #[serde(flatten)]
    pub blueprint: SandboxBlueprint,
    /// Expiry.
    #[serde(flatten)]
    pub lifecycle: Lifecycle,
    /// Whether the pod should run.
    #[serde(default)]
    pub operating_mode: OperatingMode,
    /// Suspension or deletion after inactivity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_lifecycle: Option<IdleLifecycle>,
}

/// Observed state of a Sandbox, written by the Sandbox reconciler only.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxStatus {
    /// `<service>.<namespace>.svc.<cluster-domain>` while the sandbox has a Service.
    #[serde(
        rename = "serviceFQDN",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub service_fqdn: String,
    /// Name of the headless Service (the sandbox name), if any.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub service: String,
    /// `Ready`, `Suspended`, `PodScheduled`, `Finished` (see [`crate::conditions::sandbox`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::crds::conditions_schema")]
    pub conditions: Vec<Condition>,
    /// Label selector of the sandbox's pod: `agents.x-k8s.io/sandbox-name-hash=<hash>`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub selector: String,
    /// IPs of the pod, while it exists and is owned by the sandbox.
    #[serde(rename = "podIPs", default, skip_serializing_if = "Vec::is_empty")]
    pub pod_ips: Vec<String>,
    /// Node of the pod, while it exists.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node_name: String,
    /// When a request through the router last reached the sandbox (or was still running), as
    /// routers record it: at most once per sandbox and interval, not per request.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::time::deserialize_optional",
        serialize_with = "crate::time::serialize_optional"
    )]
    pub last_activity_time: Option<Time>,
}
