//! The listeners: the proxy's, and optionally a probe listener (`/healthz`, `/readyz`) and a
//! metrics listener (`/metrics`) as upstream's Go router has them. Accepts connections, serves
//! HTTP/1.1 with upgrades, and shuts down gracefully (stop accepting, let in-flight requests and
//! tunnels finish within the grace period, then close what is left). Every task it starts is
//! tracked and ended before [`Router::serve`] returns.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{Auth, Config, CredentialFiles};
use crate::error::{Error, Result};
use crate::index::SharedIndex;
use crate::proxy::{Proxy, Role};

/// Time a client has to send a complete request head.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// A bound router, ready to [`serve`](Router::serve).
#[derive(Debug)]
pub struct Router {
    listener: TcpListener,
    local_addr: SocketAddr,
    probe: Option<(TcpListener, SocketAddr)>,
    metrics: Option<(TcpListener, SocketAddr)>,
    proxy: Arc<Proxy>,
    shutdown_grace: Duration,
    read_buffer: usize,
    credential_files: CredentialFiles,
    credential_reload_interval: Duration,
}

impl Router {
    /// Binds `config.listen`; requests are routed with `index` (fed by [`crate::watch()`] or by
    /// the caller).
    pub async fn bind(config: Config, index: SharedIndex) -> Result<Self> {
        Self::bind_with(config, index, None).await
    }

    /// [`Router::bind`], with a client for the cluster through which the router records
    /// sandboxes' activity (`status.lastActivityTime`, for their idle lifecycle) and resumes
    /// suspended sandboxes that requests arrive for. Without one it does neither.
    pub async fn bind_with(
        config: Config,
        index: SharedIndex,
        cluster: Option<kube::Client>,
    ) -> Result<Self> {
        let listener = TcpListener::bind(config.listen)
            .await
            .map_err(|source| Error::Bind {
                addr: config.listen,
                source,
            })?;
        let local_addr = listener
            .local_addr()
            .map_err(|source| Error::LocalAddr { source })?;
        let probe = bind_optional(config.probe_listen).await?;
        let metrics = bind_optional(config.metrics_listen).await?;
        if matches!(config.auth, Auth::None) {
            tracing::warn!(
                "authentication is off (--auth none): anyone who can reach {local_addr} can run \
                 commands in every sandbox; use --auth token or --auth scoped outside development"
            );
        }
        // hyper refuses request heads beyond its read buffer with a bare 431; keep that buffer
        // well above the configured limit so that the router's own JSON 431 answers first.
        let read_buffer = config.max_header_bytes.saturating_mul(4).max(64 << 10);
        Ok(Self {
            listener,
            local_addr,
            probe,
            metrics,
            proxy: Arc::new(Proxy::new(&config, index, cluster)),
            shutdown_grace: config.shutdown_grace,
            read_buffer,
            credential_files: config.credential_files,
            credential_reload_interval: config.credential_reload_interval,
        })
    }

    /// The address the router listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The address of the probe listener, when there is one.
    pub fn probe_addr(&self) -> Option<SocketAddr> {
        self.probe.as_ref().map(|(_, addr)| *addr)
    }

    /// The address of the metrics listener, when there is one.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().map(|(_, addr)| *addr)
    }

    /// Serves until `shutdown` resolves, then drains: no new connections, in-flight requests
    /// and tunnels get the grace period, what is left is closed. Returns once every connection
    /// task has ended.
    pub async fn serve(self, shutdown: impl Future<Output = ()> + Send) -> Result<()> {
        let Self {
            listener,
            local_addr,
            probe,
            metrics,
            proxy,
            shutdown_grace,
            read_buffer,
            credential_files,
            credential_reload_interval,
        } = self;
        tracing::info!(
            auth = proxy.auth_mode(),
            "sandbox-router listening on {local_addr}"
        );
        if let Some((_, addr)) = &probe {
            tracing::info!("probes (/healthz, /readyz) listening on {addr}");
        }
        if let Some((_, addr)) = &metrics {
            tracing::info!("metrics (/metrics) listening on {addr}");
        }
        let probe = probe.map(|(listener, _)| listener);
        let metrics = metrics.map(|(listener, _)| listener);
        let connections = TaskTracker::new();
        let graceful = CancellationToken::new();
        let activity_stop = CancellationToken::new();
        let activity = proxy
            .cluster
            .clone()
            .map(|cluster| tokio::spawn(cluster.write_activity(activity_stop.clone())));
        // Stopped once nothing is served any more (open tunnels are still checked while the
        // grace period lasts).
        let reload_stop = CancellationToken::new();
        let reloading = (!credential_files.is_empty()).then(|| {
            tokio::spawn(Arc::clone(&proxy).reload_credentials(
                credential_files,
                credential_reload_interval,
                reload_stop.clone(),
            ))
        });
        tokio::pin!(shutdown);
        loop {
            let (accepted, role) = tokio::select! {
                () = &mut shutdown => break,
                accepted = listener.accept() => (accepted, Role::Proxy),
                accepted = accept(probe.as_ref()) => (accepted, Role::Probes),
                accepted = accept(metrics.as_ref()) => (accepted, Role::Metrics),
            };
            match accepted {
                Ok((stream, peer)) => {
                    connections.spawn(serve_connection(
                        stream,
                        peer,
                        role,
                        Arc::clone(&proxy),
                        read_buffer,
                        graceful.clone(),
                    ));
                }
                Err(error) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
        drop((listener, probe, metrics));
        proxy.draining.store(true, Ordering::Relaxed);
        graceful.cancel();
        connections.close();
        proxy.tunnels.close();
        tracing::info!(
            connections = connections.len(),
            tunnels = proxy.tunnels.len(),
            grace = ?shutdown_grace,
            "shutting down: draining in-flight requests"
        );
        let drained = tokio::time::timeout(shutdown_grace, async {
            connections.wait().await;
            proxy.tunnels.wait().await;
        })
        .await
        .is_ok();
        if !drained {
            tracing::warn!(
                connections = connections.len(),
                tunnels = proxy.tunnels.len(),
                "grace period over: closing what is left"
            );
            proxy.stop.cancel();
            connections.wait().await;
            proxy.tunnels.wait().await;
        }
        reload_stop.cancel();
        if let Some(reloading) = reloading {
            let _ = reloading.await;
        }
        // The last activity is written before the router goes.
        activity_stop.cancel();
        if let Some(activity) = activity {
            let _ = activity.await;
        }
        tracing::info!("sandbox-router stopped");
        Ok(())
    }
}

/// Accepts on `listener`, or never when there is none.
async fn accept(listener: Option<&TcpListener>) -> std::io::Result<(TcpStream, SocketAddr)> {
    match listener {
        Some(listener) => listener.accept().await,
        None => std::future::pending().await,
    }
}

async fn bind_optional(addr: Option<SocketAddr>) -> Result<Option<(TcpListener, SocketAddr)>> {
    let Some(addr) = addr else {
        return Ok(None);
    };
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Bind { addr, source })?;
    let local = listener
        .local_addr()
        .map_err(|source| Error::LocalAddr { source })?;
    Ok(Some((listener, local)))
}

async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    role: Role,
    proxy: Arc<Proxy>,
    read_buffer: usize,
    graceful: CancellationToken,
) {
    // Small heads and streamed chunks must not wait for Nagle.
    let _ = stream.set_nodelay(true);
    let stop = proxy.stop.clone();
    let service = service_fn(move |request| {
        let proxy = Arc::clone(&proxy);
        async move {
            Ok::<_, Infallible>(match role {
                Role::Proxy => proxy.handle(request, peer).await,
                Role::Probes | Role::Metrics => proxy.handle_operations(&request, role),
            })
        }
    });
    let connection = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(read_buffer)
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    tokio::pin!(connection);
    let result = tokio::select! {
        result = connection.as_mut() => result,
        () = graceful.cancelled() => {
            connection.as_mut().graceful_shutdown();
            tokio::select! {
                result = connection.as_mut() => result,
                () = stop.cancelled() => Ok(()),
            }
        }
    };
    if let Err(error) = result {
        tracing::debug!(%peer, %error, "connection ended with an error");
    }
}
