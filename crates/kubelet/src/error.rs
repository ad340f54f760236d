//! The crate's error type: what the kubelet's library API ([`crate::Kubelet`]) reports.

use std::net::IpAddr;

/// Errors of the kubelet.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Node could not be registered.
    #[error("failed to register Node {node}")]
    RegisterNode {
        node: String,
        #[source]
        source: kube::Error,
    },
    /// The Node object could not be built.
    #[error("failed to build the Node object of {node}")]
    NodeObject {
        node: String,
        #[source]
        source: serde_json::Error,
    },
    /// The node's heartbeat Lease could not be created or renewed.
    #[error("failed to write Lease kube-node-lease/{node}")]
    Lease {
        node: String,
        #[source]
        source: kube::Error,
    },
    /// Pods cannot be confined on this machine (and `--isolation none` was not asked for).
    #[error(
        "cannot confine pods on this machine, so no pod will run: {why}. Fix that, or run pods \
         unconfined, with your user's rights, by asking for isolation `none` (`--isolation none`)"
    )]
    Unconfinable { why: String },
    /// The pods' network (bridge networking) could not be made.
    #[error("cannot give pods a network of their own: {0}")]
    PodNetwork(String),
    /// `Isolation::Strict` where some protection does not work.
    #[error("strict isolation was requested but pods here would lack: {}", missing.join("; "))]
    NotStrict { missing: Vec<String> },
    /// A pod's directory could not be created.
    #[error("failed to create the pods' directory {path}")]
    PodsDir {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// No log file of the container's previous run.
    #[error("previous terminated container \"{container}\" in pod \"{pod}\" not found")]
    NoPreviousLog { pod: String, container: String },
    /// No log file of the container yet: it has not started.
    #[error("container \"{container}\" in pod \"{pod}\" is waiting to start: ContainerCreating")]
    NoLog { pod: String, container: String },
    /// The pod runs on this node but has no IP (it never started, or it has stopped).
    #[error("pod {pod} has no IP on node {node}")]
    NoPodIp { pod: String, node: String },
    /// A connection to a pod's port failed.
    #[error("error forwarding port {port} to pod at {ip}: failed to connect")]
    PortForward {
        port: u16,
        ip: IpAddr,
        #[source]
        source: std::io::Error,
    },
    /// A file of the kubelet API's TLS configuration could not be read.
    #[error("failed to read {path} for the kubelet API")]
    ApiFile {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The kubelet API's certificates or key are unusable.
    #[error("the kubelet API's TLS configuration is unusable: {0}")]
    ApiTls(String),
    /// The kubelet API's address could not be bound.
    #[error("failed to listen on {addr} for the kubelet API")]
    ApiBind {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
