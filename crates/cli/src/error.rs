//! The crate's error type: every variant names the operation that failed and its object, and
//! carries its source; where the user can fix it, the message says how.

use std::path::PathBuf;
use std::time::Duration;

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The simulated cluster did not start.
    #[error("failed to start the simulated cluster: {source}")]
    SimStart {
        /// Cause.
        source: agent_sandbox_sim::Error,
    },
    /// The CRDs could not be applied to the simulated cluster.
    #[error("failed to apply the CRDs to the simulated cluster: {source}")]
    SimCrds {
        /// Cause.
        source: agent_sandbox_sim::Error,
    },
    /// No kube client for the simulated cluster.
    #[error("failed to build a client for the simulated cluster: {source}")]
    SimClient {
        /// Cause.
        source: agent_sandbox_sim::Error,
    },
    /// The in-process router could not bind its listener.
    #[error("failed to start the local router: {source}")]
    RouterStart {
        /// Cause.
        source: agent_sandbox_router::Error,
    },
    /// A local file (data directory, key, kubeconfig) could not be read or written.
    #[error("failed to {action} {}: {source}", path.display())]
    File {
        /// What was being done (`write the router signing key to`).
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// An object could not be written or read through the Kubernetes API.
    #[error("failed to {action} {kind} {namespace}/{name}: {source}")]
    Kube {
        /// `apply`, `get`, `delete`, ...
        action: &'static str,
        /// `SandboxTemplate`, `SandboxClaim`, ...
        kind: &'static str,
        /// Namespace ("" for cluster-scoped).
        namespace: String,
        /// Name ("" for lists).
        name: String,
        /// Cause (boxed: kube's error is large, and errors travel through every call).
        source: Box<kube::Error>,
    },
    /// Something did not happen in time.
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout {
        /// What was awaited (`SandboxWarmPool default/python to have 1 ready sandbox`).
        what: String,
        /// How long we waited.
        after: Duration,
    },
    /// A scoped router token could not be minted.
    #[error("failed to mint a router token for sandbox {namespace}/{sandbox}: {source}")]
    Token {
        /// Namespace.
        namespace: String,
        /// Sandbox.
        sandbox: String,
        /// Cause.
        source: agent_sandbox_api::token::TokenError,
    },
    /// No cluster configuration was found.
    #[error(
        "no cluster to talk to: {source}\n  fix: pass --kubeconfig PATH (or set KUBECONFIG), or use a local cluster: `sandboxctl run --local -- CMD` or `sandboxctl dev`"
    )]
    NoCluster {
        /// Cause.
        source: kube::config::InferConfigError,
    },
    /// The kubeconfig could not be read or used.
    #[error("failed to load the kubeconfig {}: {source}\n  fix: check --kubeconfig / KUBECONFIG and --context", path.display())]
    Kubeconfig {
        /// The file(s).
        path: PathBuf,
        /// Cause.
        source: kube::config::KubeconfigError,
    },
    /// No client could be built from a kubeconfig.
    #[error("failed to build a Kubernetes client: {source}")]
    Client {
        /// Cause.
        source: Box<kube::Error>,
    },
    /// The named pool does not exist.
    #[error(
        "SandboxWarmPool {namespace}/{pool} not found; {}",
        existing_pools(existing)
    )]
    PoolNotFound {
        /// Namespace searched.
        namespace: String,
        /// Pool asked for.
        pool: String,
        /// Pools that exist there.
        existing: Vec<String>,
    },
    /// The named claim does not exist.
    #[error(
        "SandboxClaim {namespace}/{claim} not found\n  fix: `sandboxctl list -n {namespace}` shows the claims there (or pass -n NAMESPACE)"
    )]
    ClaimNotFound {
        /// Namespace.
        namespace: String,
        /// Claim.
        claim: String,
    },
    /// The claim has no sandbox yet.
    #[error(
        "SandboxClaim {namespace}/{claim} has no sandbox yet (not Ready)\n  fix: wait and retry, or look at `kubectl describe sandboxclaim {claim} -n {namespace}`"
    )]
    ClaimNotReady {
        /// Namespace.
        namespace: String,
        /// Claim.
        claim: String,
    },
    /// An SDK operation failed.
    #[error("failed to {action}: {source}")]
    Sdk {
        /// What was being done (`claim a sandbox from pool python`).
        action: String,
        /// Cause.
        source: Box<agent_sandbox::Error>,
    },
    /// The arguments do not make sense together.
    #[error("{0}")]
    Usage(String),
    /// Local input or output failed.
    #[error("failed to {action}: {source}")]
    Io {
        /// What was being done.
        action: String,
        /// Cause.
        source: std::io::Error,
    },
    /// Output could not be rendered.
    #[error("failed to render the output as {format}: {message}")]
    Render {
        /// `json` or `yaml`.
        format: &'static str,
        /// Why.
        message: String,
    },
}

fn existing_pools(existing: &[String]) -> String {
    if existing.is_empty() {
        "there are no pools in that namespace\n  fix: create one (see docs/cli.md), pass -n NAMESPACE, or use `sandboxctl dev` for a local cluster with the pool `python`".to_owned()
    } else {
        format!(
            "pools there: {}\n  fix: pass --pool with one of them (or -n for another namespace)",
            existing.join(", ")
        )
    }
}
