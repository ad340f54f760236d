//! The listener: accepts connections, serves HTTP/1.1 with upgrades, and shuts down gracefully
//! (stop accepting, let in-flight requests and tunnels finish within the grace period, then
//! close what is left). Every task it starts is tracked and ended before [`Router::serve`]
//! returns.

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

use crate::config::{Auth, Config};
use crate::error::{Error, Result};
use crate::index::SharedIndex;
use crate::proxy::Proxy;

/// Time a client has to send a complete request head.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// A bound router, ready to [`serve`](Router::serve).
#[derive(Debug)]
pub struct Router {
    listener: TcpListener,
    local_addr: SocketAddr,
    proxy: Arc<Proxy>,
    shutdown_grace: Duration,
    read_buffer: usize,
}

impl Router {
    /// Binds `config.listen`; requests are routed with `index` (fed by [`crate::watch()`] or by
    /// the caller).
    pub async fn bind(config: Config, index: SharedIndex) -> Result<Self> {
        let listener = TcpListener::bind(config.listen)
            .await
            .map_err(|source| Error::Bind {
                addr: config.listen,
                source,
            })?;
        let local_addr = listener
            .local_addr()
            .map_err(|source| Error::LocalAddr { source })?;
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
            proxy: Arc::new(Proxy::new(&config, index)),
            shutdown_grace: config.shutdown_grace,
            read_buffer,
        })
    }

    /// The address the router listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Serves until `shutdown` resolves, then drains: no new connections, in-flight requests
    /// and tunnels get the grace period, what is left is closed. Returns once every connection
    /// task has ended.
    pub async fn serve(self, shutdown: impl Future<Output = ()> + Send) -> Result<()> {
        let Self {
            listener,
            local_addr,
            proxy,
            shutdown_grace,
            read_buffer,
        } = self;
        tracing::info!(
            auth = proxy.auth_mode(),
            "sandbox-router listening on {local_addr}"
        );
        let connections = TaskTracker::new();
        let graceful = CancellationToken::new();
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                accepted = listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        connections.spawn(serve_connection(
                            stream,
                            peer,
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
                },
            }
        }
        drop(listener);
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
        tracing::info!("sandbox-router stopped");
        Ok(())
    }
}

async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    proxy: Arc<Proxy>,
    read_buffer: usize,
    graceful: CancellationToken,
) {
    // Small heads and streamed chunks must not wait for Nagle.
    let _ = stream.set_nodelay(true);
    let stop = proxy.stop.clone();
    let service = service_fn(move |request| {
        let proxy = Arc::clone(&proxy);
        async move { Ok::<_, Infallible>(proxy.handle(request, peer).await) }
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
