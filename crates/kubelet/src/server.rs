//! The kubelet API over HTTPS, what the API server calls a node for when a client asks for
//! `pods/log` or `pods/portforward` (`kubectl logs`, `kubectl port-forward`, the SDK's
//! port-forward mode): `GET /healthz`, `GET /containerLogs/{namespace}/{pod}/{container}` and
//! `/portForward/{namespace}/{pod}` upgraded to SPDY/3.1 (kubectl's, through the API server) or
//! to a WebSocket (kube-rs's, passed through by the API server), both in [`crate::portforward`].
//!
//! Clients authenticate with a certificate signed by the configured CA (the API server's
//! `--kubelet-client-certificate`); a connection without one fails its TLS handshake. Names in
//! paths are matched against the pods this kubelet runs, never used as file paths.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt as _;
use http::{HeaderMap, Request, Response, StatusCode, header};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::error::{Error, Result};
use crate::kubelet::Context;
use crate::logs::LogOptions;
use crate::portforward;

/// Where the kubelet API listens and with which certificates.
#[derive(Clone, Debug)]
pub struct ApiServing {
    /// The address to listen on (port 0: any free one; the Node publishes the port).
    pub listen: SocketAddr,
    /// The serving certificate chain, PEM.
    pub cert: PathBuf,
    /// Its private key, PEM.
    pub key: PathBuf,
    /// The CA whose client certificates are accepted, PEM.
    pub client_ca: PathBuf,
}

/// The upgrade a port-forward request asks for, and the protocol it speaks over it.
const SPDY: &str = "SPDY/3.1";
const STREAM_PROTOCOL_HEADER: &str = "x-stream-protocol-version";

type Body = UnsyncBoxBody<Bytes, Infallible>;

/// A bound listener and its TLS configuration, served by [`serve`] once the kubelet starts.
pub(crate) struct Bound {
    listener: std::net::TcpListener,
    acceptor: TlsAcceptor,
}

impl std::fmt::Debug for Bound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bound")
            .field("addr", &self.listener.local_addr().ok())
            .finish_non_exhaustive()
    }
}

impl Bound {
    /// The address it listens on.
    pub(crate) fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }
}

fn read_file(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| Error::ApiFile {
        path: path.to_path_buf(),
        source,
    })
}

fn bad_file(path: &Path, why: impl std::fmt::Display) -> Error {
    Error::ApiTls(format!("{}: {why}", path.display()))
}

/// Reads the certificates and binds the listener (before the Node is registered, so that it
/// publishes the port).
pub(crate) fn bind(serving: &ApiServing) -> Result<Bound> {
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(&read_file(&serving.cert)?)
            .collect::<Result<_, _>>()
            .map_err(|e| bad_file(&serving.cert, e))?;
    let key = PrivateKeyDer::from_pem_slice(&read_file(&serving.key)?)
        .map_err(|e| bad_file(&serving.key, e))?;
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(&read_file(&serving.client_ca)?) {
        let ca = ca.map_err(|e| bad_file(&serving.client_ca, e))?;
        roots.add(ca).map_err(|e| bad_file(&serving.client_ca, e))?;
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .map_err(|e| bad_file(&serving.client_ca, e))?;
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::ApiTls(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .map_err(|e| bad_file(&serving.cert, e))?;
    let listener =
        std::net::TcpListener::bind(serving.listen).map_err(|source| Error::ApiBind {
            addr: serving.listen,
            source,
        })?;
    listener
        .set_nonblocking(true)
        .map_err(|source| Error::ApiBind {
            addr: serving.listen,
            source,
        })?;
    Ok(Bound {
        listener,
        acceptor: TlsAcceptor::from(Arc::new(config)),
    })
}

/// Accepts connections until the task is aborted (the kubelet stops).
pub(crate) async fn serve(bound: Bound, ctx: Arc<Context>) {
    let listener = match TcpListener::from_std(bound.listener) {
        Ok(listener) => listener,
        Err(error) => {
            tracing::error!(%error, "the kubelet API cannot listen");
            return;
        }
    };
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "kubelet API: accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let acceptor = bound.acceptor.clone();
        let ctx = ctx.clone();
        connections.spawn(async move {
            let tls = match acceptor.accept(tcp).await {
                Ok(tls) => tls,
                Err(error) => {
                    tracing::debug!(%peer, %error, "kubelet API: TLS handshake refused");
                    return;
                }
            };
            let service = hyper::service::service_fn(move |request| {
                let ctx = ctx.clone();
                async move { Ok::<_, Infallible>(route(&ctx, request).await) }
            });
            if let Err(error) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tls), service)
                .with_upgrades()
                .await
            {
                tracing::debug!(%peer, %error, "kubelet API: connection ended");
            }
        });
        // Finished connections are reaped as new ones come.
        while connections.try_join_next().is_some() {}
    }
}

fn text(status: StatusCode, message: impl Into<String>) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(message.into())).boxed_unsync());
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

async fn route(ctx: &Arc<Context>, request: Request<Incoming>) -> Response<Body> {
    let path = request.uri().path().to_owned();
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match segments.as_slice() {
        ["healthz"] => text(StatusCode::OK, "ok"),
        ["containerLogs", namespace, pod, container] => {
            let query = request.uri().query().unwrap_or_default().to_owned();
            container_logs(ctx, namespace, pod, container, &query).await
        }
        ["portForward", namespace, pod] => port_forward(ctx, namespace, pod, request),
        _ => text(
            StatusCode::NOT_FOUND,
            format!("no such kubelet endpoint: {path}"),
        ),
    }
}

/// `pods/log`'s parameters as the API server passes them on.
fn log_options(query: &str) -> Result<LogOptions, String> {
    let mut options = LogOptions::default();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let number = || {
            value
                .parse::<usize>()
                .map_err(|_| format!("{name}={value:?} is not a non-negative integer"))
        };
        match name {
            "follow" => options.follow = value == "true" || value == "1",
            "previous" => options.previous = value == "true" || value == "1",
            "tailLines" => options.tail_lines = Some(number()?),
            "limitBytes" => options.limit_bytes = Some(number()?),
            // Timestamps and sinceSeconds/sinceTime are not kept with the lines here.
            _ => {}
        }
    }
    Ok(options)
}

async fn container_logs(
    ctx: &Arc<Context>,
    namespace: &str,
    pod: &str,
    container: &str,
    query: &str,
) -> Response<Body> {
    let options = match log_options(query) {
        Ok(options) => options,
        Err(message) => return text(StatusCode::BAD_REQUEST, message),
    };
    let Some(key) = ctx.find_pod(namespace, pod) else {
        return text(
            StatusCode::NOT_FOUND,
            format!("pod {namespace}/{pod} does not run on node {}", ctx.node),
        );
    };
    match crate::kubelet::read_logs(ctx, &key, container, &options).await {
        Ok(stream) => {
            let body = StreamBody::new(stream.map(|chunk| Ok::<_, Infallible>(Frame::data(chunk))));
            let mut response = Response::new(body.boxed_unsync());
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("text/plain"),
            );
            response
        }
        Err(error @ (Error::NoLog { .. } | Error::NoPreviousLog { .. })) => {
            text(StatusCode::BAD_REQUEST, error.to_string())
        }
        Err(error) => text(StatusCode::INTERNAL_SERVER_ERROR, error.to_string()),
    }
}

fn offers(headers: &HeaderMap, name: &str, wanted: &str) -> bool {
    headers.get_all(name).iter().any(|value| {
        value.to_str().is_ok_and(|v| {
            v.split(',')
                .any(|item| item.trim().eq_ignore_ascii_case(wanted))
        })
    })
}

fn port_forward(
    ctx: &Arc<Context>,
    namespace: &str,
    pod: &str,
    mut request: Request<Incoming>,
) -> Response<Body> {
    let headers = request.headers();
    let websocket = portforward::websocket_accept(headers);
    let spdy = offers(headers, header::UPGRADE.as_str(), SPDY)
        && offers(headers, STREAM_PROTOCOL_HEADER, portforward::SPDY_PROTOCOL);
    if websocket.is_none() && !spdy {
        return text(
            StatusCode::BAD_REQUEST,
            format!(
                "port-forward needs an {SPDY} upgrade with protocol {} or a WebSocket upgrade \
                 with subprotocol {}",
                portforward::SPDY_PROTOCOL,
                portforward::WEBSOCKET_PROTOCOL
            ),
        );
    }
    // WebSocket clients name the ports in the query (the API server passes `ports` on as one
    // `port` per port); SPDY ones per stream.
    let ports = match websocket {
        Some(_) => {
            let query = request.uri().query().unwrap_or_default();
            let listed = query
                .split('&')
                .filter_map(|pair| {
                    pair.strip_prefix("port=")
                        .or_else(|| pair.strip_prefix("ports="))
                })
                .collect::<Vec<_>>()
                .join(",");
            match portforward::parse_ports(&listed) {
                Ok(ports) if !ports.is_empty() => ports,
                Ok(_) => return text(StatusCode::BAD_REQUEST, "at least one port must be given"),
                Err(message) => return text(StatusCode::BAD_REQUEST, message),
            }
        }
        None => Vec::new(),
    };
    let Some(ip) = ctx
        .find_pod(namespace, pod)
        .and_then(|key| ctx.pod_ip(&key.uid))
    else {
        return text(
            StatusCode::NOT_FOUND,
            format!("pod {namespace}/{pod} is not running on node {}", ctx.node),
        );
    };
    let ip = std::net::IpAddr::V4(ip);
    let sockets = ctx.pod_sockets();
    let upgrade = hyper::upgrade::on(&mut request);
    let name = format!("{namespace}/{pod}");
    let mut response = Response::new(Full::new(Bytes::new()).boxed_unsync());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let answer = response.headers_mut();
    answer.insert(
        header::CONNECTION,
        header::HeaderValue::from_static("Upgrade"),
    );
    if let Some(accept) = websocket {
        answer.insert(
            header::UPGRADE,
            header::HeaderValue::from_static("websocket"),
        );
        answer.insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            header::HeaderValue::from_static(portforward::WEBSOCKET_PROTOCOL),
        );
        match header::HeaderValue::from_str(&accept) {
            Ok(accept) => {
                answer.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
            }
            Err(_) => return text(StatusCode::BAD_REQUEST, "unusable Sec-WebSocket-Key"),
        }
        tokio::spawn(async move {
            match upgrade.await {
                Ok(upgraded) => {
                    let socket = tokio_tungstenite::WebSocketStream::from_raw_socket(
                        TokioIo::new(upgraded),
                        tokio_tungstenite::tungstenite::protocol::Role::Server,
                        None,
                    )
                    .await;
                    let sockets = &sockets;
                    portforward::serve_websocket(socket, &ports, |port| async move {
                        let stream = portforward::connect(
                            sockets.as_ref(),
                            std::net::SocketAddr::new(ip, port),
                        )
                        .await
                        .map_err(|source| Error::PortForward { port, ip, source })?;
                        let _ = stream.set_nodelay(true);
                        Ok(stream)
                    })
                    .await;
                }
                Err(error) => tracing::debug!(pod = %name, %error, "port-forward upgrade failed"),
            }
        });
    } else {
        answer.insert(header::UPGRADE, header::HeaderValue::from_static(SPDY));
        answer.insert(
            STREAM_PROTOCOL_HEADER,
            header::HeaderValue::from_static(portforward::SPDY_PROTOCOL),
        );
        tokio::spawn(async move {
            match upgrade.await {
                Ok(upgraded) => {
                    if let Err(error) =
                        portforward::serve_spdy(TokioIo::new(upgraded), ip, sockets).await
                    {
                        tracing::debug!(pod = %name, %error, "port-forward session ended");
                    }
                }
                Err(error) => tracing::debug!(pod = %name, %error, "port-forward upgrade failed"),
            }
        });
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_parameters_parse_and_refuse_bad_numbers() {
        let options = log_options("follow=true&tailLines=3&limitBytes=10&timestamps=true").unwrap();
        assert!(options.follow && !options.previous);
        assert_eq!(
            (options.tail_lines, options.limit_bytes),
            (Some(3), Some(10))
        );
        assert!(
            log_options("tailLines=-1")
                .unwrap_err()
                .contains("tailLines")
        );
    }

    #[test]
    fn upgrade_offers_are_matched_in_lists() {
        let mut headers = HeaderMap::new();
        headers.append(
            STREAM_PROTOCOL_HEADER,
            header::HeaderValue::from_static("portforward.k8s.io, v2.portforward.k8s.io"),
        );
        assert!(offers(
            &headers,
            STREAM_PROTOCOL_HEADER,
            "portforward.k8s.io"
        ));
        assert!(!offers(
            &headers,
            STREAM_PROTOCOL_HEADER,
            "v3.portforward.k8s.io"
        ));
    }
}
