//! The four reconcilers. Each reads the shared caches, asks [`crate::decide`] what to do, and
//! performs the writes.

pub mod claim;
pub mod sandbox;
pub mod template;
pub mod warm_pool;

use agent_sandbox_api::{Sandbox, SandboxClaim, SandboxWarmPool, labels};
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::decide::controller_of;

/// Claims to look at when `sandbox` changes: its owning claim; or, for a pool member, the claims
/// of that pool still waiting for a sandbox.
pub fn claims_for_sandbox(
    claims: &Store<SandboxClaim>,
    sandbox: &Sandbox,
) -> Vec<ObjectRef<SandboxClaim>> {
    let namespace = sandbox.namespace();
    match controller_of(&sandbox.metadata) {
        Some(owner) if owner.kind == "SandboxClaim" => {
            let mut reference = ObjectRef::<SandboxClaim>::new(&owner.name);
            if let Some(ns) = &namespace {
                reference = reference.within(ns);
            }
            vec![reference]
        }
        Some(owner)
            if owner.kind == "SandboxWarmPool"
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
        Some(owner) if owner.kind == "SandboxWarmPool" => vec![within(&owner.name)],
        Some(owner) if owner.kind == "SandboxClaim" => {
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
