//! The crate's error type: what failed, on what, with the cause.

use std::net::SocketAddr;
use std::path::PathBuf;

/// Errors of starting and running the server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The base directory could not be created or opened.
    #[error("failed to open the base directory {path} (--base-dir)")]
    BaseDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The listener could not be bound.
    #[error("failed to listen on {addr} (--listen)")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// The Landlock ruleset could not be built.
    #[error("failed to prepare the Landlock ruleset for {path} (--harden)")]
    Harden {
        path: PathBuf,
        #[source]
        source: landlock::RulesetError,
    },
    /// The tokio runtime could not be built.
    #[error("failed to build the tokio runtime")]
    Runtime {
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// Whether the error comes from the configuration (a base directory that cannot be opened,
    /// an address that cannot be bound, hardening that cannot be prepared) rather than from
    /// serving: the binary exits with 2 for these, as for a bad flag.
    pub fn is_configuration(&self) -> bool {
        match self {
            Self::BaseDir { .. } | Self::Bind { .. } | Self::Harden { .. } => true,
            Self::Runtime { .. } => false,
        }
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
