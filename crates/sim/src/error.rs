//! The crate's error type.

use std::path::PathBuf;

use crate::api_error::ApiError;

/// Errors of the simulated cluster's library API.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The data directory could not be created.
    #[error("failed to create the sim's data directory {path}")]
    DataDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The API server could not listen.
    #[error("failed to bind the API server to {addr}")]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    /// The kubeconfig could not be written.
    #[error("failed to write the kubeconfig {path}")]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A kube client could not be built.
    #[error("failed to build a kube client for {url}")]
    Client {
        url: String,
        #[source]
        source: kube::Error,
    },
    /// The node's kubelet could not be set up or register its Node.
    #[error("failed to start the sim's kubelet")]
    Kubelet {
        #[source]
        source: agent_sandbox_kubelet::Error,
    },
    /// A built-in object could not be created at start.
    #[error("failed to create {what} in the new cluster")]
    Seed {
        what: String,
        #[source]
        source: ApiError,
    },
    /// A CRD could not be registered.
    #[error("failed to register the CRD {name}")]
    Crd {
        name: String,
        #[source]
        source: ApiError,
    },
    /// The CRD could not be encoded.
    #[error("failed to encode the CRD {name}")]
    EncodeCrd {
        name: String,
        #[source]
        source: serde_json::Error,
    },
    /// `cargo build` could not be run.
    #[error("failed to run `cargo build -p {package} --bin {bin}`")]
    CargoRun {
        package: String,
        bin: String,
        #[source]
        source: std::io::Error,
    },
    /// `cargo build` failed.
    #[error("`cargo build -p {package} --bin {bin}` failed ({status})")]
    CargoFailed {
        package: String,
        bin: String,
        status: String,
    },
    /// The API server's certificate authority or serving certificate could not be made.
    #[error("failed to generate {what}")]
    Certificate {
        what: &'static str,
        #[source]
        source: rcgen::Error,
    },
    /// The API server's TLS configuration was refused.
    #[error("failed to configure the API server's TLS")]
    Tls {
        #[source]
        source: rustls::Error,
    },
    /// The system's random generator failed (the credentials need it).
    #[error("failed to generate the API server's credentials: no secure random bytes")]
    Random,
    /// The running executable could not be located.
    #[error("failed to locate the current executable")]
    CurrentExe {
        #[source]
        source: std::io::Error,
    },
}

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Whether the configuration the sim was given cannot be used (the port, the data
    /// directory, the kubeconfig path, confinement where pods cannot be confined, strict
    /// isolation where a protection is missing), rather than
    /// something failing in the sim itself: `kube-sim` exits with code 2 for these, as for a bad
    /// command line.
    pub fn is_configuration(&self) -> bool {
        matches!(
            self,
            Self::DataDir { .. }
                | Self::Bind { .. }
                | Self::Kubeconfig { .. }
                | Self::Kubelet {
                    source: agent_sandbox_kubelet::Error::NotStrict { .. }
                        | agent_sandbox_kubelet::Error::Unconfinable { .. }
                }
        )
    }
}
