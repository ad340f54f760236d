//! The simulated cluster, set up the way `deploy/` sets up a real one, so that scenarios reach
//! both the same way: `agent_sandbox_local`'s in-process cluster with the controller in this
//! process, the router as a pod with `--auth scoped` behind `sandbox-router-svc` in
//! `agent-sandbox-system` and its signing key in the Secret a real installation has, the
//! SandboxTemplate and SandboxWarmPool of `deploy/sandboxes`, and a Gateway whose status points
//! at the router pod (as a Gateway implementation would program it). There is no router in this
//! process: scenarios reach the router pod, by port-forward, its URL or the Gateway.

use agent_sandbox_local::{
    DEFAULT_POOL_REPLICAS, LocalCluster, LocalConfig, PodNetworks, RouterAuth, testkit,
};

use crate::error::Result;
use crate::support::WAIT;

/// Starts the cluster and waits until the router pod is Ready and the pool is full. In the run's
/// own network namespace ([`crate::netns::inside`]) its pods get networks of their own, with
/// their NetworkPolicies enforced.
pub(crate) async fn start() -> Result<LocalCluster> {
    let config = LocalConfig {
        networks: if crate::netns::inside() {
            PodNetworks::Own
        } else {
            PodNetworks::Host
        },
        runtime: testkit::runtime_program()?,
        in_process_router: false,
        router_pod: Some(testkit::router_binary()?),
        router_auth: RouterAuth::Scoped,
        gateway: true,
        pool_replicas: DEFAULT_POOL_REPLICAS,
        ..LocalConfig::default()
    };
    let cluster = LocalCluster::start(config).await?;
    cluster
        .wait_for_pool(DEFAULT_POOL_REPLICAS, WAIT, |_, _| {})
        .await?;
    Ok(cluster)
}
