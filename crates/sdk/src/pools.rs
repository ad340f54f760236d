//! SandboxWarmPools as a client sees them: their template and how many sandboxes they keep warm
//! ([`WarmPoolInfo`]), listed in one namespace or all, or looked up by name.

use agent_sandbox_api::SandboxWarmPool;
use kube::api::ListParams;
use kube::{Api, ResourceExt as _};

use crate::error::{Error, Result};

/// A warm pool as [`Client::warm_pools`](crate::Client::warm_pools) reports it.
///
/// Plain data, serialised with camelCase keys (`sandboxctl pools -o json` prints it as it is);
/// every field is public, so it can be built too (tests of code that shows pools).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WarmPoolInfo {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The SandboxTemplate it stamps sandboxes from.
    pub template: String,
    /// Warm sandboxes wanted (`spec.replicas`).
    pub desired: i32,
    /// Warm sandboxes that exist (`status.replicas`).
    pub current: i32,
    /// Warm sandboxes that are Ready (`status.readyReplicas`).
    pub ready: i32,
}

/// A pool's [`WarmPoolInfo`] (sans IO).
pub(crate) fn pool_info(pool: &SandboxWarmPool) -> WarmPoolInfo {
    let status = pool.status.clone().unwrap_or_default();
    WarmPoolInfo {
        namespace: pool.namespace().unwrap_or_default(),
        name: pool.name_any(),
        template: pool.spec.sandbox_template_ref.name.clone(),
        desired: pool.spec.replicas,
        current: status.replicas,
        ready: status.ready_replicas,
    }
}

/// The pools of `namespace` (every namespace for `None`), in the API's order.
pub(crate) async fn list_pools(
    kube: &kube::Client,
    namespace: Option<&str>,
) -> Result<Vec<WarmPoolInfo>> {
    let api: Api<SandboxWarmPool> = match namespace {
        Some(namespace) => Api::namespaced(kube.clone(), namespace),
        None => Api::all(kube.clone()),
    };
    let pools = api
        .list(&ListParams::default())
        .await
        .map_err(|source| Error::Kube {
            operation: "list SandboxWarmPools in",
            object: namespace.unwrap_or("all namespaces").to_owned(),
            source,
        })?;
    Ok(pools.items.iter().map(pool_info).collect())
}

/// The pool `namespace/name`, if it exists.
pub(crate) async fn get_pool(
    kube: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<Option<WarmPoolInfo>> {
    let api: Api<SandboxWarmPool> = Api::namespaced(kube.clone(), namespace);
    let pool = api.get_opt(name).await.map_err(|source| Error::Kube {
        operation: "get SandboxWarmPool",
        object: format!("{namespace}/{name}"),
        source,
    })?;
    Ok(pool.as_ref().map(pool_info))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    #[test]
    fn pool_infos_count_desired_current_and_ready() {
        let pool: SandboxWarmPool = serde_json::from_value(json!({
            "apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxWarmPool",
            "metadata": {"name": "python", "namespace": "default"},
            "spec": {"replicas": 3, "sandboxTemplateRef": {"name": "python-template"}},
            "status": {"replicas": 2, "readyReplicas": 1}
        }))
        .unwrap();
        assert_eq!(
            pool_info(&pool),
            WarmPoolInfo {
                namespace: "default".into(),
                name: "python".into(),
                template: "python-template".into(),
                desired: 3,
                current: 2,
                ready: 1,
            }
        );
    }
}
