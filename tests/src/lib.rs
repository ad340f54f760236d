//! The end-to-end suite: every scenario of the controller, SDK, CLI and agent issues, written
//! once against "a cluster" — a kubeconfig, the router's namespace (or URL) and the warm pool of
//! `deploy/sandboxes` — and run against whichever cluster [`Target`] names:
//!
//! - [`Target::Sim`] (the default): the simulated cluster started in this process, set up the way
//!   `deploy/` sets up a real one (a scoped-token router behind `sandbox-router-svc` in
//!   `agent-sandbox-system`, its signing key in a Secret, the `deploy/sandboxes` template and
//!   pool in `default`);
//! - [`Target::ControlPlane`]: a real control plane from `cargo xtask tools`' binaries with our
//!   kubelet as its node, `deploy/` applied, the controller and router with their
//!   ServiceAccounts' credentials;
//! - [`Target::Kubeconfig`]: any cluster where `deploy/` is installed (`cargo xtask cluster up`);
//! - [`Target::K3s`] (feature `k3s`): a throwaway k3s in Docker with the controller and router
//!   as local processes.
//!
//! Scenarios reach the cluster only the way users do: the Kubernetes API, the SDK through the
//! router (port-forward, direct URL, Gateway), and the `sandboxctl` and `sandbox-agent`
//! binaries. Run them with `cargo xtask e2e [--sim | --kubeconfig PATH | --k3s]`; the runner is
//! [`runner::main`], the test binary `e2e.rs` next to this crate's manifest.

mod cluster;
pub mod control_plane;
mod error;
#[cfg(feature = "k3s")]
mod k3s;
pub mod netns;
pub mod node;
pub mod oci_archive;
pub mod plane_target;
pub mod runner;
pub mod scenarios;
mod sim;
mod support;
pub mod upstream;

pub use cluster::{ClusterUnderTest, NetworkEnforcement, RouterAccess, SdkMode, Target};
pub use error::{Error, Result};
pub use plane_target::Install;

/// Environment variables that choose and describe the cluster (`cargo xtask e2e` sets them).
pub mod env {
    /// `sim` (default), `control-plane`, `kubeconfig` or `k3s`.
    pub const CLUSTER: &str = "AGENT_SANDBOX_E2E_CLUSTER";
    /// The kubeconfig of `kubeconfig` mode (default: `KUBECONFIG`, then `~/.kube/config`).
    pub const KUBECONFIG: &str = "AGENT_SANDBOX_E2E_KUBECONFIG";
    /// Namespace of the template, pool and claims (default `default`, as in `deploy/sandboxes`).
    pub const NAMESPACE: &str = "AGENT_SANDBOX_E2E_NAMESPACE";
    /// The SandboxTemplate (default `python-runtime`, as in `deploy/sandboxes`).
    pub const TEMPLATE: &str = "AGENT_SANDBOX_E2E_TEMPLATE";
    /// The SandboxWarmPool (default `python-sandbox-pool`, as in `deploy/sandboxes`).
    pub const POOL: &str = "AGENT_SANDBOX_E2E_POOL";
    /// A router URL reachable from here, for the SDK's direct mode (optional).
    pub const ROUTER_URL: &str = "AGENT_SANDBOX_E2E_ROUTER_URL";
    /// A Gateway `NAMESPACE/NAME` in front of the router, for the SDK's Gateway mode (optional).
    pub const GATEWAY: &str = "AGENT_SANDBOX_E2E_GATEWAY";
    /// A static router bearer token, for `--auth token` routers (optional; scoped routers are
    /// found through their signing-key Secret).
    pub const ROUTER_TOKEN: &str = "AGENT_SANDBOX_E2E_ROUTER_TOKEN";
    /// `HOST:PORT` the network probe expects to reach from a sandbox (default `pypi.org:443`).
    pub const PUBLIC_ADDRESS: &str = "AGENT_SANDBOX_E2E_PUBLIC_ADDRESS";
    /// The image archive (`docker save`) `--k3s` imports into the node; `cargo xtask e2e --k3s`
    /// writes it.
    pub const IMAGES: &str = "AGENT_SANDBOX_E2E_IMAGES";
    /// Scenarios run at once (default 4).
    pub const JOBS: &str = "AGENT_SANDBOX_E2E_JOBS";
}
