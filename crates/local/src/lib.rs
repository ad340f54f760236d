//! A whole agent-sandbox cluster in one process, and the test kit of the workspace.
//!
//! [`LocalCluster::start`] is the one place that assembles the simulated API server and
//! kubelet (`agent_sandbox_sim`, with the CRDs applied), the controller
//! (`agent_sandbox_controller`), the router (`agent_sandbox_router`, in this process and/or as a
//! pod behind `sandbox-router-svc` in `agent-sandbox-system`) and the default SandboxTemplate and
//! SandboxWarmPool of `deploy/sandboxes` ([`DEFAULT_TEMPLATE`], [`DEFAULT_POOL`] in
//! [`DEFAULT_NAMESPACE`]). [`LocalConfig`] says which of these to start and how. Its users:
//! `sandboxctl run --local` and `sandboxctl dev`, `sandbox-agent --local`, the system tests of
//! the SDK, CLI, agent and controller, the end-to-end suite on the simulated cluster, and the
//! benchmarks.
//!
//! What else the crate owns:
//! - [`runtime`]: the hidden subcommand ([`RUNTIME_SUBCOMMAND`]) under which a binary that embeds
//!   a local cluster serves the runtime in its own pods;
//! - [`ControllerTask`]: the controller run as a task of this process (also against clusters
//!   this crate did not start, such as the e2e suite's k3s);
//! - [`wait`]: bounded polling with a message that says what was awaited and what was last seen;
//! - [`testkit`]: what tests share: the tool requirements that skip (or, under `CI=true`, fail),
//!   an HTTP client, a scripted fake router, workspace binaries and the fixture names.
//!
//! Everything a [`LocalCluster`] starts stops when it is dropped or [`LocalCluster::stop`]ped:
//! the router and controller tasks end and every pod process is killed.

mod cluster;
mod config;
mod controller;
mod defaults;
mod error;
pub mod router_pod;
pub mod runtime;
mod secret;
pub mod testkit;
pub mod wait;

pub use agent_sandbox_sim::Isolation;
pub use cluster::{ConnectionKind, LocalCluster};
pub use config::{LocalConfig, PodNetworks, RouterAuth, RuntimeProgram};
pub use controller::ControllerTask;
pub use defaults::{
    DEFAULT_NAMESPACE, DEFAULT_POOL, DEFAULT_POOL_REPLICAS, DEFAULT_TEMPLATE, FIELD_MANAGER,
    GATEWAY, ROUTER_POD, default_pool, default_template,
};
pub use error::{Error, Result};
pub use runtime::RUNTIME_SUBCOMMAND;
pub use secret::{SIGNING_KEY_FILE, TOKEN_FILE, new_secret};
