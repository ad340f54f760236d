//! The suite's error: a cluster that could not be set up, or a scenario whose check failed.

use std::path::PathBuf;

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A setting is wrong or missing; the message says which and how to fix it.
    #[error("{0}")]
    Config(String),
    /// Starting or using the simulated cluster (`agent_sandbox_local`) failed.
    #[error(transparent)]
    Local(#[from] agent_sandbox_local::Error),
    /// A Kubernetes API call failed.
    #[error("{what}: {source}")]
    Kube {
        /// The call.
        what: String,
        /// Why it failed.
        #[source]
        source: Box<kube::Error>,
    },
    /// The SDK failed.
    #[error("{what}: {source}")]
    Sdk {
        /// The call.
        what: String,
        /// Why it failed.
        #[source]
        source: Box<agent_sandbox::Error>,
    },
    /// A file or process operation failed.
    #[error("{what} ({}): {source}", path.display())]
    Io {
        /// The operation.
        what: &'static str,
        /// The file or program.
        path: PathBuf,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// A wait ran out of time; the message says what was awaited and what was last seen.
    #[error(transparent)]
    Timeout(#[from] agent_sandbox_local::wait::Timeout),
    /// A check of a scenario failed.
    #[error("{0}")]
    Check(String),
}

/// The suite's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn kube(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Self {
        let what = what.into();
        move |source| Self::Kube {
            what,
            source: Box::new(source),
        }
    }

    pub(crate) fn sdk(what: impl Into<String>) -> impl FnOnce(agent_sandbox::Error) -> Self {
        let what = what.into();
        move |source| Self::Sdk {
            what,
            source: Box::new(source),
        }
    }

    pub(crate) fn io(
        what: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io { what, path, source }
    }
}

/// Fails the scenario with a formatted message unless `$cond` holds.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($message:tt)+) => {
        if !$cond {
            return Err($crate::Error::Check(format!($($message)+)));
        }
    };
}
