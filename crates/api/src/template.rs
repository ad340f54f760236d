//! `SandboxTemplate` (`extensions.agents.x-k8s.io/v1beta1`): an admin-owned blueprint that warm
//! pools and claims build sandboxes from, with its network policy and what claims may change.

use k8s_openapi::api::networking::v1::{NetworkPolicyEgressRule, NetworkPolicyIngressRule};
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::sandbox::{IdleLifecycle, SandboxBlueprint};

/// Ingress and egress rules for the template's shared NetworkPolicy. An empty list denies all
/// traffic in that direction; an absent one (`None`) also denies, as in a NetworkPolicy whose
/// `policyTypes` names the direction.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NetworkPolicySpec {
    /// Allowed inbound traffic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress: Option<Vec<NetworkPolicyIngressRule>>,
    /// Allowed outbound traffic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<Vec<NetworkPolicyEgressRule>>,
}

/// Whether the controller manages the template's NetworkPolicy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum NetworkPolicyManagement {
    /// The controller creates and corrects `<template>-network-policy`.
    #[default]
    Managed,
    /// The controller deletes a policy it owns and otherwise leaves networking to the user.
    Unmanaged,
}

/// What a claim's `env` may do to the template's containers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum EnvVarsInjectionPolicy {
    /// Claims may add variables the container does not define.
    Allowed,
    /// Claims may add variables and replace the container's.
    Overrides,
    /// Claims may not set `env`.
    #[default]
    Disallowed,
}

/// What a claim's `volumeClaimTemplates` may do to the template's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum VolumeClaimTemplatesPolicy {
    /// Claims may not set `volumeClaimTemplates`.
    #[default]
    Disallowed,
    /// Claims may add templates with new names.
    Allowed,
    /// Claims may add templates and replace the template's by name.
    Overrides,
}

/// A blueprint for sandboxes, referenced by warm pools.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    crates(kube_core = "::kube_core"),
    group = "extensions.agents.x-k8s.io",
    version = "v1beta1",
    kind = "SandboxTemplate",
    plural = "sandboxtemplates",
    singular = "sandboxtemplate",
    shortname = "sandboxtemplate",
    namespaced,
    derive = "Default",
    derive = "PartialEq",
    doc = "SandboxTemplate is a blueprint for sandboxes, with their network policy and what claims may change."
)]
#[serde(rename_all = "camelCase")]
pub struct SandboxTemplateSpec {
    /// Pod template, volume claim templates and Service switch of the sandboxes.
    #[serde(flatten)]
    pub blueprint: SandboxBlueprint,
    /// Rules of the shared NetworkPolicy; absent means the secure default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_policy: Option<NetworkPolicySpec>,
    /// Whether the controller manages the NetworkPolicy.
    #[serde(default)]
    pub network_policy_management: NetworkPolicyManagement,
    /// What a claim's `env` may do.
    #[serde(default)]
    pub env_vars_injection_policy: EnvVarsInjectionPolicy,
    /// What a claim's `volumeClaimTemplates` may do.
    #[serde(default)]
    pub volume_claim_templates_policy: VolumeClaimTemplatesPolicy,
    /// Idle suspension or deletion of claimed sandboxes built from this template (a claim's
    /// own and its pool's `claimDefaults` come first; unclaimed warm-pool members never idle
    /// out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_lifecycle: Option<IdleLifecycle>,
}
