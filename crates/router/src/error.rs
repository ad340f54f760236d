//! The router library's error type: each variant names the operation that failed and on what.
//! Errors a *request* meets are not here: those become HTTP answers (see `reject`).

use std::net::SocketAddr;
use std::path::PathBuf;

/// Result with the router's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can stop the router from starting or serving.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Binding the listener failed.
    #[error("failed to listen on {addr}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// Reading the listener's bound address failed.
    #[error("failed to read the address the router listens on")]
    LocalAddr {
        /// Why.
        source: std::io::Error,
    },
    /// Reading a token or key file failed.
    #[error("failed to read {what} from {}", path.display())]
    ReadSecret {
        /// Which secret (`static token`, `signing key`).
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A static token file holds too short a token.
    #[error("static token in {} is {len} bytes after trimming whitespace; at least {min} are required", path.display())]
    TokenTooShort {
        /// The file.
        path: PathBuf,
        /// Its trimmed length.
        len: usize,
        /// The minimum.
        min: usize,
    },
    /// A signing key file holds an unusable key.
    #[error("invalid scoped-token signing key in {}", path.display())]
    SigningKey {
        /// The file.
        path: PathBuf,
        /// Why.
        source: agent_sandbox_api::token::TokenError,
    },
    /// An auth mode was chosen without the file it needs.
    #[error("--auth {mode} needs {flag}")]
    MissingSecret {
        /// The mode.
        mode: &'static str,
        /// The flag that provides its secret.
        flag: &'static str,
    },
    /// A v2 verification key file cannot be used.
    #[error("invalid scoped-token v2 verification key file {}", path.display())]
    VerificationKeys {
        /// The file.
        path: PathBuf,
        /// Why.
        source: agent_sandbox_api::token::TokenError,
    },
    /// A flag value cannot be used.
    #[error("invalid {flag} {value:?}: {reason}")]
    InvalidFlag {
        /// The flag.
        flag: &'static str,
        /// The value given.
        value: String,
        /// What is wrong and what would do.
        reason: String,
    },
    /// No auth mode was chosen by any flag or environment variable.
    #[error(
        "no authentication mode chosen{}{}: pass --auth scoped --signing-key-file FILE \
         (per-sandbox tokens), --auth token --token-file FILE, or --auth none (development); or, \
         as upstream's routers take it, set ROUTER_AUTH_TOKEN to a bearer token, or \
         ALLOW_UNAUTHENTICATED_ROUTER=true to run without authentication",
        allow.as_ref().map(|v| format!(" (ALLOW_UNAUTHENTICATED_ROUTER is {v:?}, which is not true)")).unwrap_or_default(),
        why_not_upstream_go.as_deref().unwrap_or_default()
    )]
    NoAuthMode {
        /// `ALLOW_UNAUTHENTICATED_ROUTER`, when set.
        allow: Option<String>,
        /// Why upstream's Go router flags given did not bring that router's default
        /// (allow-all): ours were given too, or their sources were not recorded.
        why_not_upstream_go: Option<String>,
    },
    /// Upstream's `--authz-mode=tokenreview`.
    #[error(
        "--authz-mode=tokenreview is not supported: use --authz-mode=scoped-token with \
         --authz-scoped-token-verification-keys-file (v2) or --authz-scoped-token-secret-file \
         (v1) for per-sandbox tokens, or ROUTER_AUTH_TOKEN for one static bearer token"
    )]
    TokenReviewUnsupported,
    /// A scoped-token flag with another auth mode.
    #[error("{flag} needs --auth scoped (or --authz-mode=scoped-token); the auth mode is {mode}")]
    ScopedFlagWithoutScopedMode {
        /// The flag.
        flag: &'static str,
        /// The mode chosen.
        mode: &'static str,
    },
    /// v1 and v2 keys without the end of v1.
    #[error(
        "--authz-scoped-token-v1-accept-until is required when v1 keys (--signing-key-file, \
         --authz-scoped-token-secret-file) and v2 keys \
         (--authz-scoped-token-verification-keys-file) are both given: pass the RFC 3339 instant \
         from which v1 tokens are refused, e.g. --authz-scoped-token-v1-accept-until=2027-01-01T00:00:00Z"
    )]
    MissingV1AcceptUntil,
    /// Upstream's `--config` / `SANDBOX_ROUTER_CONFIG`.
    #[error(
        "--config and SANDBOX_ROUTER_CONFIG (upstream's YAML file of flag values) are not \
         supported: pass the flags as arguments instead, so that no setting is silently dropped"
    )]
    ConfigFile,
    /// `--namespace` is not a DNS-1123 label.
    #[error("namespace {namespace:?} is not a valid DNS-1123 label")]
    InvalidNamespace {
        /// The value given.
        namespace: String,
    },
}

impl Error {
    /// Whether the configuration the router was given cannot be used (the listen address, a
    /// token or key file, the namespace), rather than something failing while it runs:
    /// `sandbox-router` exits with code 2 for these, as for a bad command line.
    pub fn is_configuration(&self) -> bool {
        match self {
            Self::Bind { .. }
            | Self::ReadSecret { .. }
            | Self::TokenTooShort { .. }
            | Self::SigningKey { .. }
            | Self::MissingSecret { .. }
            | Self::VerificationKeys { .. }
            | Self::InvalidFlag { .. }
            | Self::NoAuthMode { .. }
            | Self::TokenReviewUnsupported
            | Self::ScopedFlagWithoutScopedMode { .. }
            | Self::MissingV1AcceptUntil
            | Self::ConfigFile
            | Self::InvalidNamespace { .. } => true,
            Self::LocalAddr { .. } => false,
        }
    }
}
