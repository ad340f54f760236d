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

    /// The kubeconfig file(s) given could not be read or used (or the context is not in them).
    #[error("failed to load the kubeconfig {path}")]
    KubeconfigFile {
        /// The file, or the `:`-separated files.
        path: String,
        /// Why.
        #[source]
        source: kube::config::KubeconfigError,
    },

    /// No kubeconfig was given and none was found (`KUBECONFIG`, `~/.kube/config`, in-cluster).
    #[error("found no Kubernetes configuration (KUBECONFIG, ~/.kube/config or in-cluster)")]
    NoKubeconfig(#[source] kube::config::InferConfigError),

    /// A Kubernetes client could not be built from a loaded configuration.
    #[error("failed to build a Kubernetes client")]
    KubeClient(#[source] kube::Error),

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

    /// The claim has no sandbox yet (it is not Ready): nothing to attach to, mint a token for or
    /// read the log of.
    #[error("SandboxClaim {namespace}/{claim} has no sandbox yet (not Ready)")]
    ClaimNotReady {
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

    /// The router could not be reached: connection refused, no such host, or the connection
    /// was not established within the connect timeout. Retried like other connection errors.
    #[error("{operation} on sandbox {sandbox}: cannot reach the router at {url}: {cause}")]
    RouterUnreachable {
        /// The operation.
        operation: String,
        /// The sandbox.
        sandbox: String,
        /// The router base URL.
        url: String,
        /// What happened, in a few words (`connection refused`).
        cause: String,
        /// The underlying error.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },

    /// The TLS handshake with an `https://` router failed (e.g. the server speaks plain HTTP,
    /// or its certificate is not trusted). Not retried.
    #[error(
        "{operation} on sandbox {sandbox}: TLS handshake with the router at {url} failed ({cause})"
    )]
    RouterTls {
        /// The operation.
        operation: String,
        /// The sandbox.
        sandbox: String,
        /// The router base URL.
        url: String,
        /// The TLS error.
        cause: String,
        /// The underlying error.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },

    /// The server at the router URL answered, but not as the router or a runtime does: an
    /// answer that is not JSON where JSON was due (an HTML error page, a proxy's text). The
    /// URL most likely points at something else.
    #[error(
        "{operation} on sandbox {sandbox}: the server at {url} is not an agent-sandbox router (it answered HTTP {status} with {content_type})"
    )]
    NotARouter {
        /// The operation.
        operation: String,
        /// The sandbox.
        sandbox: String,
        /// The router base URL.
        url: String,
        /// The status it answered with.
        status: u16,
        /// The content type of its answer.
        content_type: String,
    },

    /// A buffered answer (a listing, a command's result, [`Sandbox::read`](crate::Sandbox::read))
    /// was, or claimed to be, larger than `ClientOptions::max_response_bytes`; the rest was not
    /// read.
    #[error(
        "{operation} on sandbox {sandbox}: the answer is larger than {limit} bytes (ClientOptions::max_response_bytes); stream large files with download() instead"
    )]
    ResponseTooLarge {
        /// The operation.
        operation: String,
        /// The sandbox.
        sandbox: String,
        /// The limit.
        limit: u64,
    },

    /// A sandbox path was refused before anything was sent: it leads outside the base
    /// directory, contains a NUL byte, or names the base directory itself for a mutating
    /// operation (write, upload, mkdir, remove).
    #[error("refusing to {operation} {path:?} in the sandbox: {reason}")]
    InvalidPath {
        /// The operation (`remove`, `list`, ...).
        operation: &'static str,
        /// The path as given.
        path: String,
        /// Why.
        reason: &'static str,
    },

    /// The sandbox sent a name that is not one normal path component (`../x`, `/abs`, `a/b`,
    /// `..`, `.`, empty, or with a NUL byte). Nothing was written for it.
    #[error(
        "{operation} on sandbox {sandbox}: refusing the entry name {name:?} the sandbox sent: {reason}"
    )]
    UnsafeName {
        /// The operation.
        operation: String,
        /// The sandbox.
        sandbox: String,
        /// The name as received.
        name: String,
        /// Why.
        reason: &'static str,
    },

    /// A download would have written through a symlink in its local destination, or something
    /// else is in the way. Nothing was written there.
    #[error("refusing to write {path}: {reason}")]
    UnsafeDestination {
        /// The local path.
        path: String,
        /// Why, and what to do.
        reason: &'static str,
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

    /// A followed pod log broke off.
    #[error("failed to read the log of Pod {namespace}/{pod}")]
    Logs {
        /// Namespace of the pod.
        namespace: String,
        /// The pod.
        pod: String,
        /// Why.
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

    /// The error of the last attempt, for [`Error::RetriesExhausted`] (else `self`): what to
    /// match on to learn why a retried operation failed.
    pub fn last_attempt(&self) -> &Error {
        match self {
            Self::RetriesExhausted { last, .. } => last.last_attempt(),
            other => other,
        }
    }

    /// Whether the error means "no such file, directory, process or sandbox" (HTTP 404 or a
    /// missing claim).
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::ClaimNotFound { .. }) || self.status() == Some(404)
    }
}
