//! TCP connections to sandbox pods for the pooled HTTP client.
//!
//! Connects only to IP literals (the index's pod addresses; never a DNS name), with a timeout
//! per attempt, and retries failed attempts with backoff. Retrying here is always safe: a
//! connect that failed sent nothing, so no request is ever replayed. A request that reached the
//! sandbox is never retried at all (see `proxy`).

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::config::PodSockets;
use crate::metrics::Metrics;

/// First backoff between connect attempts; doubled each time up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// A `tower::Service<Uri>` making retried TCP connections to `http://<ip>:<port>` URIs.
#[derive(Debug, Clone)]
pub(crate) struct Connector {
    timeout: Duration,
    retries: u32,
    metrics: Arc<Metrics>,
    sockets: Option<PodSockets>,
}

impl Connector {
    pub(crate) fn new(
        timeout: Duration,
        retries: u32,
        metrics: Arc<Metrics>,
        sockets: Option<PodSockets>,
    ) -> Self {
        Self {
            timeout,
            retries,
            metrics,
            sockets,
        }
    }
}

/// The address in `uri`, which must be `http` with an IP literal host and a port.
fn address(uri: &Uri) -> io::Result<SocketAddr> {
    let invalid = || {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("not an http://<ip>:<port> address: {uri}"),
        )
    };
    if uri.scheme_str() != Some("http") {
        return Err(invalid());
    }
    let host = uri.host().ok_or_else(invalid)?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let ip: IpAddr = host.parse().map_err(|_| invalid())?;
    let port = uri.port_u16().ok_or_else(invalid)?;
    Ok(SocketAddr::new(ip, port))
}

async fn connect_once(
    addr: SocketAddr,
    timeout: Duration,
    sockets: Option<&PodSockets>,
) -> io::Result<TcpStream> {
    let connect = async {
        match sockets {
            Some(PodSockets(make)) => make(addr.ip())?.connect(addr).await,
            None => TcpStream::connect(addr).await,
        }
    };
    let stream = tokio::time::timeout(timeout, connect).await.map_err(|_| {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!("connect to {addr} timed out after {timeout:?}"),
        )
    })??;
    // Small request and response heads must not wait for Nagle.
    stream.set_nodelay(true)?;
    Ok(stream)
}

impl tower_service::Service<Uri> for Connector {
    type Response = TokioIo<TcpStream>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<TokioIo<TcpStream>>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let addr = address(&uri)?;
            let mut backoff = FIRST_BACKOFF;
            let mut attempt = 0;
            loop {
                match connect_once(addr, this.timeout, this.sockets.as_ref()).await {
                    Ok(stream) => return Ok(TokioIo::new(stream)),
                    Err(error) if attempt < this.retries => {
                        tracing::debug!(%addr, attempt, %error, "connect failed; retrying");
                        this.metrics.retried();
                        attempt += 1;
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                    }
                    Err(error) => {
                        let attempts = attempt + 1;
                        return Err(io::Error::new(
                            error.kind(),
                            format!("{error} (connecting to {addr}, {attempts} attempt(s))"),
                        ));
                    }
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn only_ip_literals() {
        assert_eq!(
            address(&"http://10.0.0.1:8888/x".parse().unwrap()).unwrap(),
            "10.0.0.1:8888".parse().unwrap()
        );
        assert_eq!(
            address(&"http://[fd00::1]:9000".parse().unwrap()).unwrap(),
            "[fd00::1]:9000".parse().unwrap()
        );
        for bad in [
            "http://example.com:80",
            "https://10.0.0.1:443",
            "http://10.0.0.1",
            "http://metadata.google.internal:80",
        ] {
            assert!(address(&bad.parse().unwrap()).is_err(), "{bad}");
        }
    }
}
