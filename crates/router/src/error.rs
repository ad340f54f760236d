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
            | Self::InvalidNamespace { .. } => true,
            Self::LocalAddr { .. } => false,
        }
    }
}
