//! `SandboxWarmPool` (`extensions.agents.x-k8s.io/v1beta1`): keeps a number of ready sandboxes
//! built from a template, so that a claim is answered in milliseconds.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Reference to a SandboxTemplate in the pool's namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SandboxTemplateRef {
    /// Name of the template.
    pub name: String,
}

/// How a pool treats members built from an older version of its template.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum UpdateStrategyType {
    /// Stale unclaimed members are deleted and rebuilt at once.
    Recreate,
    /// Stale members stay until claimed; replacements use the new template.
    #[default]
    OnReplenish,
}

/// Update strategy of a pool.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct UpdateStrategy {
    /// The strategy.
    #[serde(default, rename = "type")]
    pub type_: UpdateStrategyType,
}

fn default_replicas() -> i32 {
    1
}

/// A set of pre-created sandboxes from one template.
// Several `printcolumn(...)` arguments repeat `type_ = ...`: not a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    crates(kube_core = "::kube_core"),
    group = "extensions.agents.x-k8s.io",
    version = "v1beta1",
    kind = "SandboxWarmPool",
    plural = "sandboxwarmpools",
    singular = "sandboxwarmpool",
    shortname = "swp",
    namespaced,
    status = "SandboxWarmPoolStatus",
    derive = "PartialEq",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    doc = "SandboxWarmPool keeps a number of sandboxes from one template ready to be claimed.",
    printcolumn(name = "Ready", type_ = "integer", json_path = ".status.readyReplicas"),
    printcolumn(name = "Desired", type_ = "integer", json_path = ".spec.replicas"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct SandboxWarmPoolSpec {
    /// How many unclaimed members to keep.
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 0))]
    pub replicas: i32,
    /// The template members are built from.
    pub sandbox_template_ref: SandboxTemplateRef,
    /// How members built from an older template are replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_strategy: Option<UpdateStrategy>,
    /// Defaults for claims from this pool that set none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_defaults: Option<crate::claim::ClaimDefaults>,
}

impl Default for SandboxWarmPoolSpec {
    fn default() -> Self {
        Self {
            replicas: default_replicas(),
            sandbox_template_ref: SandboxTemplateRef::default(),
            update_strategy: None,
            claim_defaults: None,
        }
    }
}

impl SandboxWarmPoolSpec {
    /// The effective update strategy (`OnReplenish` when unset).
    pub fn update_strategy_type(&self) -> UpdateStrategyType {
        self.update_strategy
            .as_ref()
            .map(|strategy| strategy.type_)
            .unwrap_or_default()
    }
}

/// Observed state of a pool, written by the warm-pool reconciler.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxWarmPoolStatus {
    /// Unclaimed members that are not being deleted.
    #[serde(default, skip_serializing_if = "is_zero_i32")]
    #[schemars(range(min = 0))]
    pub replicas: i32,
    /// Of those, the Ready ones.
    #[serde(default, skip_serializing_if = "is_zero_i32")]
    #[schemars(range(min = 0))]
    pub ready_replicas: i32,
    /// Label selector of the members: `agents.x-k8s.io/warm-pool-sandbox=<hash>`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub selector: String,
    /// Generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    #[schemars(range(min = 0))]
    pub observed_generation: i64,
    /// `Capped` while the controller keeps fewer members than `spec.replicas` (see
    /// [`crate::conditions::warm_pool`]); none otherwise. An addition to upstream's status.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::crds::conditions_schema")]
    pub conditions: Vec<Condition>,
}

fn is_zero_i32(value: &i32) -> bool {
    *value == 0
}

fn is_zero_i64(value: &i64) -> bool {
    *value == 0
}
