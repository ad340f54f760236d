//! The four reconcilers. Each reads the shared caches, asks [`crate::decide`] what to do, and
//! performs the writes; `apply_status` is the one way they write a status.

pub mod claim;
pub mod sandbox;
pub mod template;
pub mod warm_pool;

use std::fmt::Debug;

use agent_sandbox_api::wire::CONTROLLER_FIELD_MANAGER;
use agent_sandbox_api::{Sandbox, SandboxClaim, SandboxWarmPool, kinds, labels};
use k8s_openapi::NamespaceResourceScope;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::context::Context;
use crate::decide::controller_of;
use crate::error::{Result, is_not_found, kube_err};

/// The four reconcilers, as logs and the `controller` label of
/// `agent_sandbox_reconcile_errors_total` name them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reconciler {
    /// Sandboxes: their pod, PVCs, Service, expiry and status.
    Sandbox,
    /// SandboxTemplates: their NetworkPolicy.
    Template,
    /// SandboxWarmPools: their members.
    WarmPool,
    /// SandboxClaims: adoption or a cold sandbox, expiry.
    Claim,
}

impl Reconciler {
    /// The name in logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sandbox => "sandbox",
            Self::Template => "template",
            Self::WarmPool => "warmpool",
            Self::Claim => "claim",
        }
    }
}

impl std::fmt::Display for Reconciler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The kinds whose status the controller writes.
pub(crate) trait WithStatus:
    Resource<DynamicType = (), Scope = NamespaceResourceScope> + Clone + DeserializeOwned + Debug
{
    /// The kind, as errors name it.
    const KIND: &'static str;
}

impl WithStatus for Sandbox {
    const KIND: &'static str = kinds::SANDBOX;
}

impl WithStatus for SandboxWarmPool {
    const KIND: &'static str = kinds::SANDBOX_WARM_POOL;
}

impl WithStatus for SandboxClaim {
    const KIND: &'static str = kinds::SANDBOX_CLAIM;
}

/// Writes `status` of `object` with server-side apply under the controller's field manager (an
/// object deleted meanwhile is no error), and remembers it, so that passes on a cache that does
/// not show it yet work from it instead of writing it again ([`Context::freshest_status`]).
pub(crate) async fn apply_status<K: WithStatus, S: Serialize>(
    object: &K,
    status: &S,
    ctx: &Context,
) -> Result<()> {
    let namespace = object.namespace().unwrap_or_default();
    let name = object.name_any();
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &namespace);
    let body = json!({
        "apiVersion": K::api_version(&()),
        "kind": K::KIND,
        "status": status,
    });
    let params = PatchParams::apply(CONTROLLER_FIELD_MANAGER).force();
    match api.patch_status(&name, &params, &Patch::Apply(&body)).await {
        Ok(_) => {
            ctx.remember_status(object.meta().uid.as_deref().unwrap_or_default(), status);
            Ok(())
        }
        Err(error) if is_not_found(&error) => Ok(()),
        Err(error) => Err(kube_err("patch status of", K::KIND, &namespace, &name)(
            error,
        )),
    }
}

/// Claims to look at when `sandbox` changes: its owning claim; or, for a pool member, the claims
/// of that pool still waiting for a sandbox.
pub fn claims_for_sandbox(
    claims: &Store<SandboxClaim>,
    sandbox: &Sandbox,
) -> Vec<ObjectRef<SandboxClaim>> {
    let namespace = sandbox.namespace();
    match controller_of(&sandbox.metadata) {
        Some(owner) if owner.kind == kinds::SANDBOX_CLAIM => {
            let mut reference = ObjectRef::<SandboxClaim>::new(&owner.name);
            if let Some(ns) = &namespace {
                reference = reference.within(ns);
            }
            vec![reference]
        }
        Some(owner)
            if owner.kind == kinds::SANDBOX_WARM_POOL
                && sandbox.labels().contains_key(labels::WARM_POOL_SANDBOX) =>
        {
            claims
                .state()
                .into_iter()
                .filter(|claim| {
                    claim.namespace() == namespace && claim.spec.warm_pool_ref.name == owner.name
                })
                .filter(|claim| {
                    claim
                        .status
                        .as_ref()
                        .is_none_or(|s| s.sandbox.name.is_empty())
                })
                .map(|claim| ObjectRef::from_obj(claim.as_ref()))
                .collect()
        }
        _ => Vec::new(),
    }
}

/// Pools to look at when `sandbox` changes: the pool that controls it; or, for a sandbox a claim
/// adopted, the claim's pool, which has to refill (the sandbox no longer names the pool, and the
/// claim's own change may have been seen before the adoption reached the cache).
pub fn pools_for_sandbox(
    claims: &Store<SandboxClaim>,
    sandbox: &Sandbox,
) -> Vec<ObjectRef<SandboxWarmPool>> {
    let namespace = sandbox.namespace();
    let within = |name: &str| {
        let reference = ObjectRef::<SandboxWarmPool>::new(name);
        match &namespace {
            Some(ns) => reference.within(ns),
            None => reference,
        }
    };
    match controller_of(&sandbox.metadata) {
        Some(owner) if owner.kind == kinds::SANDBOX_WARM_POOL => vec![within(&owner.name)],
        Some(owner) if owner.kind == kinds::SANDBOX_CLAIM => {
            let mut claim = ObjectRef::<SandboxClaim>::new(&owner.name);
            if let Some(ns) = &namespace {
                claim = claim.within(ns);
            }
            claims
                .get(&claim)
                .map(|claim| within(&claim.spec.warm_pool_ref.name))
                .into_iter()
                .collect()
        }
        _ => Vec::new(),
    }
}
