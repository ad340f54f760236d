//! The SDK's one error type.
//!
//! Variants name the failed operation and its object; callers match on the few they handle
//! (e.g. [`Error::WarmPoolNotFound`], [`Error::Http`] with a status) and print the rest.

use std::time::Duration;

/// Result of SDK operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the SDK.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No kubeconfig or in-cluster configuration could be loaded.
    #[error("failed to load a Kubernetes configuration (kubeconfig or in-cluster)")]
    KubeConfig(#[source] kube::Error),

    /// A Kubernetes API call failed.
    #[error("failed to {operation} {object}")]
    Kube {
        /// What was attempted (`create SandboxClaim`, `watch`, ...).
        operation: &'static str,
        /// Namespace/name (or namespace only) of the object.
        object: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },

    /// An option is not valid (bad URL, name that is not a DNS label, ...).
    #[error("invalid option {option}: {message}")]
    InvalidOption {
        /// The option.
        option: &'static str,
        /// What is wrong.
        message: String,
    },

    /// The claim's warm pool does not exist (`WarmPoolNotFound`).
    #[error("SandboxClaim {namespace}/{claim}: warm pool {pool:?} not found: {message}")]
    WarmPoolNotFound {
        /// Namespace of the claim.
        namespace: String,
        /// The claim (already rolled back when returned by `create_sandbox`).
        claim: String,
        /// The pool asked for.
        pool: String,
        /// The controller's message.
        message: String,
    },

    /// The pool's template does not exist (`TemplateNotFound`).
    #[error(
        "SandboxClaim {namespace}/{claim}: the template of warm pool {pool:?} was not found: {message}"
    )]
    TemplateNotFound {
        /// Namespace of the claim.
        namespace: String,
        /// The claim.
        claim: String,
        /// The pool asked for.
        pool: String,
        /// The controller's message.
        message: String,
    },

    /// The claim reached a terminal failure (`InvalidMetadata`, `ClaimExpired`, ...).
    #[error("SandboxClaim {namespace}/{claim} failed: {reason}: {message}")]
    ClaimFailed {
        /// Namespace of the claim.
        namespace: String,
        /// The claim.
        claim: String,
        /// The condition reason (one of `agent_sandbox_api::conditions::claim::TERMINAL_REASONS`).
        reason: String,
        /// The controller's message.
        message: String,
    },

    /// The claim did not become Ready in time.
    #[error("SandboxClaim {namespace}/{claim} was not Ready after {waited:?} (last: {last})")]
    ClaimTimeout {
        /// Namespace of the claim.
        namespace: String,
        /// The claim.
        claim: String,
        /// How long the SDK waited.
        waited: Duration,
        /// The last state seen (`reason: message`).
        last: String,
    },

    /// The claim, or its sandbox, is gone.
    #[error("SandboxClaim {namespace}/{claim} not found (deleted or expired)")]
    ClaimNotFound {
        /// Namespace of the claim.
        namespace: String,
        /// The claim.
        claim: String,
    },

    /// Creating the sandbox failed and deleting the claim afterwards failed too: the claim may
    /// be left behind (it still expires if it had a shutdown time).
    #[error(
        "{source}; deleting SandboxClaim {namespace}/{claim} afterwards failed too ({cleanup}), it may be left behind"
    )]
    OrphanedClaim {
        /// Namespace of the claim.
        namespace: String,
        /// The claim.
        claim: String,
        /// Why the cleanup failed.
        cleanup: String,
        /// The original failure.
        #[source]
        source: Box<Error>,
    },

    /// No ready router endpoint was found for port-forward mode.
    #[error(
        "no ready endpoint of Service {service} in namespace(s) {searched:?}: is the router installed there? \
         Set the router namespace (ClientOptions::router_namespace, sandboxctl --router-namespace) to the namespace the router runs in"
    )]
    RouterNotFound {
        /// The Service looked for.
        service: String,
        /// The namespaces searched.
        searched: Vec<String>,
    },

    /// The Gateway has no address.
    #[error("Gateway {namespace}/{name} has no address after {waited:?}")]
    GatewayNotReady {
        /// Namespace of the Gateway.
        namespace: String,
        /// Name of the Gateway.
        name: String,
        /// How long the SDK waited.
        waited: Duration,
    },

    /// The connection is down (after `disconnect()`, or a dead port-forward tunnel); call
    /// `open()` to reconnect.
    #[error("sandbox {sandbox} is not connected: {reason}; call open() to reconnect")]
    NotConnected {
        /// The sandbox.
        sandbox: String,
        /// Why.
        reason: String,
    },

    /// The HTTP request could not be sent or its answer not read.
    #[error("{operation} on sandbox {sandbox} failed: {message}")]
    Transport {
        /// The operation (`run`, `write src/main.py`, ...).
        operation: String,
        /// The sandbox.
        sandbox: String,
        /// What happened.
        message: String,
        /// The underlying error, where there is one.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },

    /// The router or the runtime answered with an error status.
    #[error("{operation} on sandbox {sandbox} failed with HTTP {status}: {body}")]
    Http {
        /// The operation.
        operation: String,
        /// The sandbox.
        sandbox: String,
        /// The status code.
        status: u16,
        /// The start of the error body (`{"detail": ...}` from the router, `{"code", "message"}`
        /// or `{"message"}` from the runtime).
        body: String,
    },

    /// A retried operation failed on every attempt.
    #[error("{operation} on sandbox {sandbox} failed after {attempts} attempts")]
    RetriesExhausted {
        /// The operation.
        operation: String,
        /// The sandbox.
        sandbox: String,
        /// Attempts made.
        attempts: u32,
        /// The last failure.
        #[source]
        last: Box<Error>,
    },

    /// The operation did not finish before its deadline.
    #[error("{operation} on sandbox {sandbox} timed out after {after:?}")]
    Timeout {
        /// The operation.
        operation: String,
        /// The sandbox.
        sandbox: String,
        /// The deadline.
        after: Duration,
    },

    /// An answer could not be decoded.
    #[error("{operation} on sandbox {sandbox}: unexpected answer: {message}")]
    Decode {
        /// The operation.
        operation: String,
        /// The sandbox.
        sandbox: String,
        /// What was wrong.
        message: String,
    },

    /// A local file could not be read or written.
    #[error("failed to {operation} local file {path}")]
    LocalIo {
        /// The operation.
        operation: &'static str,
        /// The path.
        path: String,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },

    /// Minting a scoped router token failed (key too short, ...).
    #[error("failed to mint a scoped token for sandbox {namespace}/{sandbox}")]
    Token {
        /// Namespace.
        namespace: String,
        /// Sandbox.
        sandbox: String,
        /// The token error.
        #[source]
        source: agent_sandbox_api::token::TokenError,
    },

    /// Installing the signal handlers of `enable_auto_cleanup` failed.
    #[error("failed to install the SIGINT/SIGTERM handlers for auto cleanup")]
    Signals(#[source] std::io::Error),

    /// A step of the test harness failed (feature `harness`).
    #[error("test harness: failed to {step}")]
    Harness {
        /// The step.
        step: &'static str,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// The fake sandbox has no scripted answer for a command (feature `fake`).
    #[error("the fake sandbox has no scripted result for command {command:?}")]
    Unscripted {
        /// The command.
        command: String,
    },
}

impl Error {
    /// The HTTP status, for [`Error::Http`] (also inside [`Error::RetriesExhausted`]).
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Http { status, .. } => Some(*status),
            Self::RetriesExhausted { last, .. } => last.status(),
            _ => None,
        }
    }

    /// Whether the error means "no such file, directory, process or sandbox" (HTTP 404 or a
    /// missing claim).
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::ClaimNotFound { .. }) || self.status() == Some(404)
    }
}
