//! The default SandboxTemplate and SandboxWarmPool, and the names of the objects a local cluster
//! writes.
//!
//! The template and pool are `deploy/sandboxes` as committed (embedded at build time), so a
//! local cluster, the tests and a real installation claim from the same pool by the same name;
//! a test below pins the names and the namespace to those files.

use agent_sandbox_api::{SandboxTemplate, SandboxWarmPool, wire};

use crate::error::{Error, Result};

/// Namespace of the default template and pool (and of the claims made against them): the
/// `namespace:` of `deploy/sandboxes/kustomization.yaml`.
pub const DEFAULT_NAMESPACE: &str = wire::DEFAULT_SANDBOX_NAMESPACE;
/// Name of the default SandboxTemplate (`deploy/sandboxes/template.yaml`).
pub const DEFAULT_TEMPLATE: &str = "python-runtime";
/// Name of the default SandboxWarmPool (`deploy/sandboxes/warm-pool.yaml`).
pub const DEFAULT_POOL: &str = "python-sandbox-pool";
/// Members of the default pool (`spec.replicas` of `deploy/sandboxes/warm-pool.yaml`), the
/// default of [`LocalConfig::pool_replicas`](crate::LocalConfig::pool_replicas).
pub const DEFAULT_POOL_REPLICAS: i32 = 2;
/// Name of the Gateway a local cluster writes when asked to ([`LocalConfig::gateway`](crate::LocalConfig::gateway)).
pub const GATEWAY: &str = "sandbox-gateway";
/// Name of the router pod behind `sandbox-router-svc` ([`LocalConfig::router_pod`](crate::LocalConfig::router_pod)).
pub const ROUTER_POD: &str = "sandbox-router-0";
/// Field manager of the objects a local cluster applies.
pub const FIELD_MANAGER: &str = "agent-sandbox-local";

const TEMPLATE_FILE: &str = "deploy/sandboxes/template.yaml";
const TEMPLATE_YAML: &str = include_str!("../../../deploy/sandboxes/template.yaml");
const POOL_FILE: &str = "deploy/sandboxes/warm-pool.yaml";
const POOL_YAML: &str = include_str!("../../../deploy/sandboxes/warm-pool.yaml");

fn parse<T: serde::de::DeserializeOwned>(what: &'static str, yaml: &str) -> Result<T> {
    serde_saphyr::from_str(yaml).map_err(|error| Error::BuiltIn {
        what,
        message: error.to_string(),
    })
}

/// The default template, `deploy/sandboxes/template.yaml`, in [`DEFAULT_NAMESPACE`]: one
/// container of the runtime image (which a local cluster runs as its runtime program) on 8888.
pub fn default_template() -> Result<SandboxTemplate> {
    let mut template: SandboxTemplate = parse(TEMPLATE_FILE, TEMPLATE_YAML)?;
    template.metadata.namespace = Some(DEFAULT_NAMESPACE.to_owned());
    Ok(template)
}

/// The default pool, `deploy/sandboxes/warm-pool.yaml`, in [`DEFAULT_NAMESPACE`], with
/// `replicas` members.
pub fn default_pool(replicas: i32) -> Result<SandboxWarmPool> {
    let mut pool: SandboxWarmPool = parse(POOL_FILE, POOL_YAML)?;
    pool.metadata.namespace = Some(DEFAULT_NAMESPACE.to_owned());
    pool.spec.replicas = replicas;
    Ok(pool)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn the_defaults_are_deploy_sandboxes_under_the_names_the_constants_give() {
        let template = default_template().unwrap();
        let pool = default_pool(3).unwrap();
        assert_eq!(template.metadata.name.as_deref(), Some(DEFAULT_TEMPLATE));
        assert_eq!(pool.metadata.name.as_deref(), Some(DEFAULT_POOL));
        assert_eq!(pool.spec.sandbox_template_ref.name, DEFAULT_TEMPLATE);
        assert_eq!(pool.spec.replicas, 3);
        let deployed: SandboxWarmPool = parse(POOL_FILE, POOL_YAML).unwrap();
        assert_eq!(deployed.spec.replicas, DEFAULT_POOL_REPLICAS);
        // Claims on the deployed pool cannot leak: an idle one suspends, a suspended one goes.
        let defaults = deployed
            .spec
            .claim_defaults
            .expect("deploy/sandboxes/warm-pool.yaml sets claimDefaults");
        let lifecycle = defaults
            .lifecycle
            .expect("deploy/sandboxes/warm-pool.yaml sets claimDefaults.lifecycle");
        assert!(
            lifecycle
                .ttl_seconds_after_finished
                .is_some_and(|ttl| ttl > 0)
        );
        assert_eq!(
            lifecycle.shutdown_policy,
            agent_sandbox_api::claim::ClaimShutdownPolicy::Delete
        );
        let idle = defaults
            .idle_lifecycle
            .expect("deploy/sandboxes/warm-pool.yaml sets claimDefaults.idleLifecycle");
        assert!(idle.active_ttl_seconds.is_some_and(|ttl| ttl > 0));
        assert_eq!(
            idle.active_expiration_policy,
            Some(agent_sandbox_api::sandbox::ActiveExpirationPolicy::Suspend)
        );
        assert!(idle.suspended_ttl_seconds.is_some_and(|ttl| ttl > 0));
        assert_eq!(
            idle.suspended_expiration_policy,
            Some(agent_sandbox_api::sandbox::SuspendedExpirationPolicy::Delete)
        );
        let image = template.spec.blueprint.pod_template.spec.containers[0]
            .image
            .clone()
            .unwrap();
        assert!(
            image.contains("runtime"),
            "a local cluster runs its runtime program for `*runtime*` images: {image}"
        );
        let kustomization: serde_json::Value =
            serde_saphyr::from_str(include_str!("../../../deploy/sandboxes/kustomization.yaml"))
                .unwrap();
        assert_eq!(kustomization["namespace"], DEFAULT_NAMESPACE);
    }
}
