//! The crate's error type: every variant names the operation that failed and its object, and
//! carries its source.

use std::path::PathBuf;
use std::time::Duration;

use crate::wait::Timeout;

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The simulated cluster did not start.
    #[error("failed to start the simulated cluster: {source}")]
    SimStart {
        /// Cause (boxed: the sim's error is large).
        source: Box<agent_sandbox_sim::Error>,
    },
    /// The CRDs could not be applied to the simulated cluster.
    #[error("failed to apply the CRDs to the simulated cluster: {source}")]
    SimCrds {
        /// Cause (boxed: the sim's error is large).
        source: Box<agent_sandbox_sim::Error>,
    },
    /// No kube client for the simulated cluster.
    #[error("failed to build a client for the simulated cluster: {source}")]
    SimClient {
        /// Cause (boxed: the sim's error is large).
        source: Box<agent_sandbox_sim::Error>,
    },
    /// A router pod was asked for where pods get loopback only (it must reach the API server
    /// and the sandboxes).
    #[error(
        "a router pod needs pods on a network of their own, which this machine cannot give: \
         {why}; use the in-process router, or install what is missing"
    )]
    RouterPodNeedsNetwork {
        /// What is missing.
        why: String,
    },
    /// The in-process router could not bind its listener.
    #[error("failed to start the local router: {source}")]
    RouterStart {
        /// Cause.
        source: agent_sandbox_router::Error,
    },
    /// The controller task ended with an error.
    #[error("the local controller failed: {source}")]
    Controller {
        /// Cause.
        source: agent_sandbox_controller::Error,
    },
    /// The controller task did not stop within its grace period (it was aborted).
    #[error("the local controller did not stop within {after:?} (aborted)")]
    ControllerStuck {
        /// The grace period.
        after: Duration,
    },
    /// The controller task panicked.
    #[error("the local controller panicked: {message}")]
    ControllerPanicked {
        /// The panic's message, as far as it can be recovered.
        message: String,
    },
    /// A local file or socket (data directory, secret, listener) could not be used.
    #[error("failed to {action} {}: {source}", object.display())]
    Io {
        /// What was being done (`create the router secret`).
        action: &'static str,
        /// The file or address.
        object: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// A Kubernetes API call failed.
    #[error("failed to {action} {object}: {source}")]
    Kube {
        /// `apply`, `get`, `create`, ...
        action: &'static str,
        /// Kind and name (`SandboxTemplate default/python-runtime`).
        object: String,
        /// Cause (boxed: kube's error is large).
        source: Box<kube::Error>,
    },
    /// An object built from constants or from `deploy/sandboxes` does not parse.
    #[error("the built-in {what} does not parse: {message}")]
    BuiltIn {
        /// `deploy/sandboxes/template.yaml`, `the router Service`, ...
        what: &'static str,
        /// The parser's message.
        message: String,
    },
    /// The cluster was asked for something its [`LocalConfig`](crate::LocalConfig) did not start.
    #[error("this local cluster runs no {what}")]
    NotStarted {
        /// `router pod (LocalConfig::router_pod)`, ...
        what: &'static str,
    },
    /// Something did not happen in time.
    #[error(transparent)]
    Timeout(#[from] Timeout),
    /// A scoped router token could not be minted.
    #[error("failed to mint a router token for sandbox {namespace}/{sandbox}: {source}")]
    Token {
        /// Namespace.
        namespace: String,
        /// Sandbox.
        sandbox: String,
        /// Cause.
        source: Box<agent_sandbox::Error>,
    },
    /// A workspace binary could not be built (test kit).
    #[error("failed to build {bin} (package {package}): {source}")]
    Binary {
        /// Cargo package.
        package: String,
        /// Binary.
        bin: String,
        /// Cause (boxed: the sim's error is large).
        source: Box<agent_sandbox_sim::Error>,
    },
    /// A test-kit HTTP request failed before an answer arrived (test kit).
    #[error("{method} {url} failed: {source}")]
    Http {
        /// `GET`, `POST`, ...
        method: String,
        /// The URL.
        url: String,
        /// Cause.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl Error {
    /// `map_err` of a kube call: `failed to {action} {object}`.
    pub(crate) fn kube(
        action: &'static str,
        object: impl std::fmt::Display,
    ) -> impl FnOnce(kube::Error) -> Self {
        let object = object.to_string();
        move |source| Self::Kube {
            action,
            object,
            source: Box::new(source),
        }
    }

    /// `map_err` of a file or socket operation: `failed to {action} {object}`.
    pub(crate) fn io(
        action: &'static str,
        object: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> Self {
        let object = object.into();
        move |source| Self::Io {
            action,
            object,
            source,
        }
    }
}
