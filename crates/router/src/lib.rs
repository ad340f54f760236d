//! `sandbox-router`: the header-routed, streaming, authenticated reverse proxy between clients
//! (SDK, CLI, any HTTP client speaking upstream's `X-Sandbox-*` headers) and the runtime server
//! in each sandbox pod.
//!
//! This crate owns:
//! - the [`Index`] of routable sandboxes (Sandbox → its pod's IPs and allowed ports), a plain
//!   struct fed by [`watch()`] from the cluster or directly by its user;
//! - the routing decisions (headers → sandbox → pod address; never anything else: no SSRF),
//!   authentication ([`Auth`]: none, a static token, or per-sandbox scoped tokens v1 and v2,
//!   re-read from their files while it runs; an upgraded connection lasts as long as the
//!   credential it was opened with), and the proxy itself (streaming both ways, upgrades relayed, deadlines, limits, `{"detail": ...}`
//!   errors), in [`Router`];
//! - `/healthz`, `/readyz`, `/metrics` (on the proxy listener, and on separate probe and metrics
//!   listeners when configured) and the access log;
//! - the configuration in three dialects ([`Args`]): ours, upstream's Go router flags, and
//!   upstream's environment variables, so that upstream's router manifests start this router.
//!
//! Entry points: [`run`] (watch a cluster and serve, what the binary does), [`serve`] (serve a
//! caller-fed index, e.g. `sandboxctl run --local`), or [`Router::bind`] + [`Router::serve`]
//! when the caller needs the bound address first. Flags and behaviour: `docs/router.md`.

mod activity;
mod auth;
mod body;
mod config;
mod connector;
mod error;
mod headers;
mod index;
mod metrics;
mod proxy;
mod reject;
mod route;
mod server;
mod watch;

use std::future::Future;

pub use config::{
    Args, Auth, AuthMode, Config, CredentialFiles, GoAuthzMode, GoFlags, IgnoredGoFlags,
    MIN_STATIC_TOKEN_BYTES, PodSockets, Resolved, Secret, defaults, is_truthy, read_signing_key,
    read_static_token, read_verification_keys,
};
pub use error::{Error, Result};
pub use index::{Backend, Index, SharedIndex, Unroutable};
pub use server::Router;
pub use watch::watch;

/// Serves `config.listen` with a caller-fed `index` until `shutdown` resolves (then drains).
pub async fn serve(
    config: Config,
    index: SharedIndex,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<()> {
    Router::bind(config, index).await?.serve(shutdown).await
}

/// Watches the cluster behind `client` (Sandboxes and their Pods, in `config.namespace` or
/// everywhere) and serves until `shutdown` resolves. The watchers are stopped before it returns.
pub async fn run(
    config: Config,
    client: kube::Client,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<()> {
    let index = SharedIndex::new();
    let namespace = config.namespace.clone();
    let router = Router::bind_with(config, index.clone(), Some(client.clone())).await?;
    let watching = tokio::spawn(watch(client, index, namespace));
    let served = router.serve(shutdown).await;
    watching.abort();
    // The watchers end by cancellation; their result carries nothing.
    let _ = watching.await;
    served
}
