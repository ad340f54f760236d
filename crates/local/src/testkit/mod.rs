//! What the workspace's tests share (and the benchmarks, where it fits):
//!
//! - [`wait_for`] and [`Check`]: bounded polling whose [`Timeout`] says what was awaited and
//!   what was last seen (no fixed sleeps as synchronisation);
//! - [`Tool`] and [`missing`]: a test that needs `kubectl`, user namespaces or `python3` and does
//!   not find it says so and is counted as skipped, and fails instead under `CI=true`;
//! - [`own_network_command`] and [`Internet`]: network namespaces of a test's own, and an
//!   "internet" in one;
//! - [`http`]: a small HTTP/1.1 client for probing servers (runtime, router, controller health,
//!   the sim's metrics);
//! - [`FakeRouter`] and [`ready_claim`]: a scripted, possibly hostile router behind a direct URL,
//!   with no controller or runtime;
//! - [`workspace_binary`], [`runtime_program`] and [`router_binary`]: the workspace's binaries,
//!   built for the running test's target directory and profile;
//! - [`one_error_line`], [`assert_configuration_error`] and [`tree`]: what a binary printed on
//!   an error and what a client wrote to disk;
//! - [`kubeconfig_yaml`]: a kubeconfig without credentials for any API server URL: a fake
//!   server of a test's own, or one nobody listens on (tests of unreachable clusters); a local
//!   cluster's own kubeconfig carries its certificate authority and token;
//! - the fixture names: [`NAMESPACE`], [`TEMPLATE`], [`POOL`], [`GATEWAY`], [`ROUTER_POD`] (those
//!   of a [`LocalCluster`](crate::LocalCluster) and of `deploy/sandboxes`).

mod fake_router;
pub mod http;
mod netns;
mod outputs;
mod tools;

use std::path::PathBuf;

pub use agent_sandbox_sim::test_support::pod_visible_dir;
pub use fake_router::{FakeBody, FakeBoxError, FakeRequest, FakeRouter, ready_claim};
pub use netns::{INTERNET_ADDRESS, Internet, own_network_command};
pub use outputs::{assert_configuration_error, one_error_line, tree};
pub use tools::{ALLOW_MISSING_ENV, BUSYBOX, CNI_PLUGINS, LEDGER, NODE_PROGRAMS, Tool, missing};

pub use crate::defaults::{
    DEFAULT_NAMESPACE as NAMESPACE, DEFAULT_POOL as POOL, DEFAULT_TEMPLATE as TEMPLATE, GATEWAY,
    ROUTER_POD,
};
pub use crate::wait::{Check, Timeout, wait_for};

use crate::config::RuntimeProgram;
use crate::error::{Error, Result};

/// A kubeconfig without credentials for the API server at `url` (cluster, user and context
/// `sim`, namespace `default`): for fake API servers a test runs itself, and for addresses
/// nobody listens on.
pub fn kubeconfig_yaml(url: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: sim\n  cluster:\n    server: {url}\nusers:\n- name: sim\n  user: {{}}\ncontexts:\n- name: sim\n  context:\n    cluster: sim\n    user: sim\n    namespace: default\ncurrent-context: sim\npreferences: {{}}\n"
    )
}

/// Builds `bin` of workspace package `package` for the running test's target directory and
/// profile (once per process; parallel tests wait for one build) and returns its path.
pub fn workspace_binary(package: &str, bin: &str) -> Result<PathBuf> {
    agent_sandbox_sim::test_support::workspace_binary(package, bin).map_err(|source| {
        Error::Binary {
            package: package.to_owned(),
            bin: bin.to_owned(),
            source: Box::new(source),
        }
    })
}

/// The `sandbox-runtime` binary of this workspace as a local cluster's runtime program (test
/// binaries have no runtime subcommand of their own).
pub fn runtime_program() -> Result<RuntimeProgram> {
    workspace_binary("agent-sandbox-runtime", "sandbox-runtime").map(RuntimeProgram::Binary)
}

/// The `sandbox-router` binary of this workspace (for [`LocalConfig::router_pod`](crate::LocalConfig::router_pod)).
pub fn router_binary() -> Result<PathBuf> {
    workspace_binary("agent-sandbox-router", "sandbox-router")
}
