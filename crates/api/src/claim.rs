//! `SandboxClaim` (`extensions.agents.x-k8s.io/v1beta1`): a user's request for a sandbox from a
//! warm pool, with its own expiry.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::sandbox::{IdleLifecycle, PersistentVolumeClaimTemplate, PodMetadata};

/// What claim expiry does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum ClaimShutdownPolicy {
    /// Delete the claim (its sandbox goes with it, in the background).
    Delete,
    /// Delete the claim with foreground propagation: the claim disappears after its sandbox.
    DeleteForeground,
    /// Delete the claim's sandbox and keep the claim, marked expired.
    #[default]
    Retain,
}

/// Expiry of a claim (not copied to its Sandbox).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimLifecycle {
    /// Absolute time at which the claim expires.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::time::deserialize_optional",
        serialize_with = "crate::time::serialize_optional"
    )]
    pub shutdown_time: Option<Time>,
    /// Seconds after the sandbox finished (`Finished=True`) at which the claim expires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub ttl_seconds_after_finished: Option<i32>,
    /// What expiry does.
    #[serde(default)]
    pub shutdown_policy: ClaimShutdownPolicy,
}

/// Reference to a SandboxWarmPool in the claim's namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SandboxWarmPoolRef {
    /// Name of the pool.
    pub name: String,
}

/// An environment variable a claim injects into the sandbox (forces a cold start).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnvVar {
    /// Variable name.
    pub name: String,
    /// Variable value.
    pub value: String,
    /// Container to set it in; the first container when empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub container_name: String,
}

/// A request for a sandbox.
// Several `printcolumn(...)` arguments repeat `type_ = ...`: not a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    crates(kube_core = "::kube_core"),
    group = "extensions.agents.x-k8s.io",
    version = "v1beta1",
    kind = "SandboxClaim",
    plural = "sandboxclaims",
    singular = "sandboxclaim",
    shortname = "sandboxclaim",
    namespaced,
    status = "SandboxClaimStatus",
    derive = "Default",
    derive = "PartialEq",
    doc = "SandboxClaim requests a sandbox from a warm pool, adopting a ready member or creating one.",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type=='Ready')].status"
    ),
    printcolumn(name = "Sandbox", type_ = "string", json_path = ".status.sandbox.name"),
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
pub struct SandboxClaimSpec {
    /// The pool to claim from; its template is the sandbox's template.
    pub warm_pool_ref: SandboxWarmPoolRef,
    /// Expiry of the claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<ClaimLifecycle>,
    /// Labels and annotations added to the sandbox's pod (validated by the controller).
    #[serde(default, skip_serializing_if = "PodMetadata::is_empty")]
    pub additional_pod_metadata: PodMetadata,
    /// Environment variables to inject (subject to the template's `envVarsInjectionPolicy`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub env: Vec<EnvVar>,
    /// PVC templates to add (subject to the template's `volumeClaimTemplatesPolicy`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub volume_claim_templates: Vec<PersistentVolumeClaimTemplate>,
    /// Idle suspension or deletion of the claim's sandbox, instead of the pool's
    /// `claimDefaults` or the template's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_lifecycle: Option<IdleLifecycle>,
}

/// Defaults for the claims of a warm pool that set none (the shape of upstream's KEP-1306
/// `claimDefaults`), so that a client that dies without deleting its claim leaves nothing
/// behind for long.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimDefaults {
    /// The expiry of claims that set no `lifecycle` of their own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<DefaultClaimLifecycle>,
    /// The idle lifecycle of claimed sandboxes whose claim sets none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_lifecycle: Option<IdleLifecycle>,
}

/// A claim expiry that fits every claim: relative to the sandbox finishing, since an absolute
/// `shutdownTime` cannot be a default.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DefaultClaimLifecycle {
    /// Seconds after the sandbox finished (`Finished=True`) at which the claim expires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub ttl_seconds_after_finished: Option<i32>,
    /// What expiry does.
    #[serde(default)]
    pub shutdown_policy: ClaimShutdownPolicy,
}

impl From<&DefaultClaimLifecycle> for ClaimLifecycle {
    fn from(default: &DefaultClaimLifecycle) -> Self {
        Self {
            shutdown_time: None,
            ttl_seconds_after_finished: default.ttl_seconds_after_finished,
            shutdown_policy: default.shutdown_policy,
        }
    }
}

/// Observed state of a claim, written by the claim reconciler.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SandboxClaimStatus {
    /// `Ready` and `Finished` (see [`crate::conditions::claim`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::crds::conditions_schema")]
    pub conditions: Vec<Condition>,
    /// The claim's sandbox.
    #[serde(default, skip_serializing_if = "ClaimedSandbox::is_empty")]
    pub sandbox: ClaimedSandbox,
}

/// The sandbox a claim holds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ClaimedSandbox {
    /// Name of the Sandbox (a pool member keeps its `<pool>-xxxxx` name).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// IPs of its pod.
    #[serde(rename = "podIPs", default, skip_serializing_if = "Vec::is_empty")]
    pub pod_ips: Vec<String>,
    /// The Sandbox's `status.serviceFQDN`, mirrored as upstream 1.0 mirrors it.
    #[serde(
        rename = "serviceFQDN",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub service_fqdn: String,
}

impl ClaimedSandbox {
    /// True when no sandbox is recorded.
    pub fn is_empty(&self) -> bool {
        self.name.is_empty() && self.pod_ips.is_empty() && self.service_fqdn.is_empty()
    }
}
