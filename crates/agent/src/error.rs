//! The crate's error type: one variant per failed operation, each carrying its source.

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Messages API answered with an error status.
    #[error("Messages API answered {status}{}: {message}{} — {hint}",
        if kind.is_empty() { String::new() } else { format!(" {kind}") },
        request_id.as_deref().map(|id| format!(" (request-id {id})")).unwrap_or_default())]
    Api {
        /// HTTP status (529 for an overload reported inside a stream).
        status: u16,
        /// The error `type` (`authentication_error`, `overloaded_error`, …).
        kind: String,
        /// The server's message.
        message: String,
        /// The `request-id` header, for support.
        request_id: Option<String>,
        /// What to fix.
        hint: String,
    },
    /// Retryable failures went on after every retry.
    #[error("Messages API request failed {attempts} times")]
    RetriesExhausted {
        /// Attempts made.
        attempts: u32,
        /// The last failure.
        #[source]
        source: Box<Error>,
    },
    /// The request could not be sent or the answer not received.
    #[error("failed to reach the Messages API at {url}")]
    Transport {
        /// The endpoint (credentials removed).
        url: String,
        /// Why.
        #[source]
        source: reqwest::Error,
    },
    /// The answer was not a Messages API response.
    #[error("failed to decode the Messages API response")]
    Decode {
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// A streamed answer was broken.
    #[error("failed to read the Messages API stream: {detail}")]
    Stream {
        /// What was wrong.
        detail: String,
    },
    /// The HTTP client could not be built.
    #[error("failed to build the HTTP client for the Messages API")]
    HttpClient {
        /// Why.
        #[source]
        source: reqwest::Error,
    },
    /// No sandbox could be claimed.
    #[error("failed to claim a sandbox from SandboxWarmPool {pool}")]
    Claim {
        /// The pool.
        pool: String,
        /// Why.
        #[source]
        source: Box<agent_sandbox::Error>,
    },
    /// The claim could not be deleted at the end (it still expires by itself).
    #[error("failed to delete SandboxClaim {claim} (it expires by itself)")]
    DeleteClaim {
        /// The claim.
        claim: String,
        /// Why.
        #[source]
        source: Box<agent_sandbox::Error>,
    },
    /// The local cluster failed.
    #[error("failed to {step}")]
    Local {
        /// What failed.
        step: &'static str,
        /// Why.
        #[source]
        source: Box<agent_sandbox_local::Error>,
    },
    /// The cluster could not be reached as the connection flags say.
    #[error("failed to connect to the cluster")]
    Connect {
        /// Why.
        #[source]
        source: Box<agent_sandbox::Error>,
    },
    /// The API key cannot be sent as a header.
    #[error(
        "the API key contains characters that cannot be sent in a header: check ANTHROPIC_API_KEY"
    )]
    InvalidApiKey,
}

/// The crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
