//! The process kubelet (`docs/sim.md`): a node that runs pods as local process groups and
//! speaks only the Kubernetes API, through a `kube::Client`, so that it runs against the
//! simulated cluster (which runs it as its node) and against a real `kube-apiserver` alike.
//!
//! [`Kubelet`] registers its Node and renews its heartbeat Lease ([`node`]), watches the pods
//! bound to it and runs each in a worker ([`pod`]) that starts its containers as process groups
//! ([`process`]), confined in a sandbox of the pod's own ([`sandbox`]: namespaces, a root of
//! the host's system directories, capped storage) unless `Isolation::None` says otherwise,
//! chosen through the [`ImageTable`] ([`images`]), sets
//! up the volumes they mount (ConfigMap, Secret, downward-API and projected ServiceAccount-token
//! volumes: [`volumes`]), gives the pod an address of the [`PodNetwork`] as its IP ([`net`]),
//! runs readiness and liveness probes ([`probe`]), patches
//! `pods/status` ([`pod_status`], sans IO), records Events ([`events`]), writes the containers'
//! logs to disk ([`logs`]) and, on deletion, stops the processes before confirming. The kubelet
//! API's pieces: logs and port-forward in process ([`Kubelet::logs`], [`Kubelet::port_forward`]),
//! and its streaming protocols — [`spdy`] sessions and [`portforward`] over them, as the API
//! server speaks them to a kubelet for `kubectl port-forward` — served over HTTPS with
//! client-certificate authentication for a real API server to call ([`server`]).

// The module map above links the private modules, for readers of the source.
#![allow(rustdoc::private_intra_doc_links)]

mod cgroup;
mod confine;
mod error;
pub mod events;
pub mod images;
mod kubelet;
mod logs;
mod net;
mod netpol;
mod node;
mod node_ns;
mod pod;
mod pod_net;
mod pod_status;
mod policies;
pub mod portforward;
mod probe;
mod process;
mod sandbox;
mod seccomp;
mod server;
pub mod spdy;
mod volumes;

pub use confine::Protections;
pub use error::{Error, Result};
pub use images::{DefaultReadiness, ImageEntry, ImageTable, Program, runtime_entry};
pub use kubelet::{
    DEFAULT_POD_STORAGE, Kubelet, KubeletConfig, NodeCapacity, PodKey, PodNetwork, PodSockets,
};
pub use logs::{LogOptions, LogStream};
pub use process::Isolation;

/// Whether pods can be confined on this machine (checked once per process, as a kubelet
/// checks at start: a pod sandbox and a container are started in a scratch directory); the
/// error says why not and how to fix it.
pub fn confinement() -> std::result::Result<(), String> {
    let scratch = std::env::temp_dir();
    Protections::detect(&scratch).map(|_| ())
}
pub use server::ApiServing;
