//! `pods/portforward` in the two protocols a real API server accepts from clients:
//!
//! - WebSocket with the `v4.channel.k8s.io` protocol that kube-rs speaks: for the i-th requested
//!   port, channel 2i carries data and 2i+1 errors; each channel's first frame is the port
//!   number (little endian) ([`agent_sandbox_kubelet::portforward::serve_websocket`]); data is
//!   relayed to the pod's port through its kubelet, in process
//!   ([`agent_sandbox_kubelet::Kubelet::port_forward`]).
//! - SPDY/3.1 with `X-Stream-Protocol-Version: portforward.k8s.io`, what client-go's SPDY dialer
//!   (`kubectl port-forward` with `KUBECTL_PORT_FORWARD_WEBSOCKETS=false`, upstream's Go SDK)
//!   speaks: the ports come with each stream, not in the query
//!   ([`agent_sandbox_kubelet::portforward::serve_spdy`], to the pod's IP).
//! - The same SPDY/3.1 session tunnelled through a WebSocket (subprotocol
//!   `SPDY/3.1+portforward.k8s.io`), what kubectl 1.30 and later try first: every binary message
//!   carries the next bytes of the SPDY stream in either direction, and a normal close ends it
//!   ([`tunnel`]).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use agent_sandbox_kubelet::portforward;

use axum::body::Body;
use axum::response::Response;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::Role;

use crate::api::ApiState;
use crate::api_error::{ApiError, ApiResult};
use crate::resources::StorageKey;

/// The `Upgrade` a SPDY port-forward asks for.
const SPDY: &str = "SPDY/3.1";
/// The header naming the stream protocols a SPDY client offers, and the one the server chose.
const STREAM_PROTOCOL_HEADER: &str = "x-stream-protocol-version";

/// The WebSocket subprotocol of the SPDY tunnel: the SPDY upgrade's name, `+`, and the stream
/// protocol.
const SPDY_TUNNEL: &str = "SPDY/3.1+portforward.k8s.io";

/// Whether a header `name` lists `wanted` (comma-separated, repeated headers, any case).
fn offers(headers: &HeaderMap, name: &str, wanted: &str) -> bool {
    headers.get_all(name).iter().any(|value| {
        value.to_str().is_ok_and(|v| {
            v.split(',')
                .any(|item| item.trim().eq_ignore_ascii_case(wanted))
        })
    })
}

/// The `Sec-WebSocket-Accept` answer to a WebSocket upgrade offering [`SPDY_TUNNEL`], or `None`
/// when the request is not one.
fn tunnel_accept(headers: &HeaderMap) -> Option<String> {
    let key = headers.get(header::SEC_WEBSOCKET_KEY)?;
    (offers(headers, header::UPGRADE.as_str(), "websocket")
        && offers(
            headers,
            header::SEC_WEBSOCKET_PROTOCOL.as_str(),
            SPDY_TUNNEL,
        ))
    .then(|| tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes()))
}

/// Whether the request asks for a SPDY/3.1 upgrade offering [`portforward::SPDY_PROTOCOL`].
fn asks_for_spdy(headers: &HeaderMap) -> bool {
    offers(headers, header::UPGRADE.as_str(), SPDY)
        && offers(headers, STREAM_PROTOCOL_HEADER, portforward::SPDY_PROTOCOL)
}

/// Serves the upgrade request.
pub(crate) async fn serve(
    state: &Arc<ApiState>,
    namespace: &str,
    name: &str,
    headers: &HeaderMap,
    query: &HashMap<String, String>,
    upgrade: Option<hyper::upgrade::OnUpgrade>,
) -> ApiResult<Response> {
    let pod = state
        .objects
        .store
        .get(&StorageKey::new("", "pods"), namespace, name)
        .ok_or_else(|| ApiError::not_found("", "pods", name))?;
    let running = pod.pointer("/status/phase").and_then(Value::as_str) == Some("Running");
    let has_ip = pod
        .pointer("/status/podIP")
        .and_then(Value::as_str)
        .is_some_and(|ip| !ip.is_empty());
    if !(running && has_ip) {
        return Err(ApiError::bad_request(format!(
            "unable to upgrade connection: pod {name} is not running"
        )));
    }
    let Some(upgrade) = upgrade else {
        return Err(ApiError::bad_request(
            "unable to upgrade connection: the connection cannot be upgraded",
        ));
    };
    if portforward::websocket_accept(headers).is_none() && asks_for_spdy(headers) {
        return serve_spdy(state, name, &pod, upgrade);
    }
    if let Some(accept) = tunnel_accept(headers) {
        return serve_tunnel(state, name, &pod, accept, upgrade);
    }
    let target = crate::logs::pod_key(&pod);
    let kubelet = state.kubelet.clone();
    let ports =
        portforward::parse_ports(query.get("ports").map(String::as_str).unwrap_or_default())
            .map_err(ApiError::bad_request)?;
    if ports.is_empty() {
        return Err(ApiError::bad_request("at least one port must be given"));
    }
    let Some(accept) = portforward::websocket_accept(headers) else {
        return Err(ApiError::bad_request(format!(
            "port-forward needs a WebSocket upgrade with the {} subprotocol or a {SPDY} upgrade \
             with X-Stream-Protocol-Version {}",
            portforward::WEBSOCKET_PROTOCOL,
            portforward::SPDY_PROTOCOL
        )));
    };
    let response = Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, "websocket")
        .header(header::SEC_WEBSOCKET_ACCEPT, accept)
        .header(
            header::SEC_WEBSOCKET_PROTOCOL,
            portforward::WEBSOCKET_PROTOCOL,
        )
        .body(Body::empty())
        .map_err(|error| ApiError::internal(error.to_string()))?;
    let pod_name = name.to_owned();
    state.spawn(async move {
        match upgrade.await {
            Ok(upgraded) => {
                let socket =
                    WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None)
                        .await;
                portforward::serve_websocket(socket, &ports, |port| {
                    let (kubelet, target) = (kubelet.clone(), target.clone());
                    async move { kubelet.port_forward(&target, port).await }
                })
                .await;
            }
            Err(error) => tracing::debug!(pod = %pod_name, %error, "port-forward upgrade failed"),
        }
    });
    Ok(response)
}

fn pod_ip(name: &str, pod: &Value) -> ApiResult<IpAddr> {
    let pod_ip = pod
        .pointer("/status/podIP")
        .and_then(Value::as_str)
        .unwrap_or_default();
    pod_ip.parse().map_err(|_| {
        ApiError::internal(format!("pod {name} has an unusable IP address {pod_ip:?}"))
    })
}

/// Answers a WebSocket upgrade offering [`SPDY_TUNNEL`] and serves the SPDY session inside it.
fn serve_tunnel(
    state: &Arc<ApiState>,
    name: &str,
    pod: &Value,
    accept: String,
    upgrade: hyper::upgrade::OnUpgrade,
) -> ApiResult<Response> {
    let pod_ip = pod_ip(name, pod)?;
    let sockets = state.kubelet.pod_sockets();
    let response = Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, "websocket")
        .header(header::SEC_WEBSOCKET_ACCEPT, accept)
        .header(header::SEC_WEBSOCKET_PROTOCOL, SPDY_TUNNEL)
        .body(Body::empty())
        .map_err(|error| ApiError::internal(error.to_string()))?;
    let pod_name = name.to_owned();
    state.spawn(async move {
        match upgrade.await {
            Ok(upgraded) => {
                let socket =
                    WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None)
                        .await;
                tunnel(socket, pod_ip, sockets, &pod_name).await;
            }
            Err(error) => tracing::debug!(pod = %pod_name, %error, "port-forward upgrade failed"),
        }
    });
    Ok(response)
}

/// Runs a SPDY port-forward session over `socket`: binary messages in are the session's input,
/// its output goes out as binary messages, and either side's end ends both (a normal close
/// frame towards the client, end of input towards the session).
async fn tunnel<S>(
    socket: WebSocketStream<S>,
    pod_ip: IpAddr,
    sockets: Option<agent_sandbox_kubelet::PodSockets>,
    pod_name: &str,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    use futures::{SinkExt as _, StreamExt as _};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::protocol::CloseFrame;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

    let (session_io, bridge) = tokio::io::duplex(256 * 1024);
    let (mut from_session, mut to_session) = tokio::io::split(bridge);
    let (mut sink, mut stream) = socket.split();
    let inbound = async move {
        while let Some(message) = stream.next().await {
            match message {
                Ok(Message::Binary(bytes)) => {
                    if to_session.write_all(&bytes).await.is_err() {
                        break;
                    }
                }
                // client-go sends the stream as binary messages only.
                Ok(Message::Close(_) | Message::Text(_)) | Err(_) => break,
                Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_)) => {}
            }
        }
        let _ = to_session.shutdown().await;
    };
    let outbound = async move {
        let mut buffer = vec![0u8; 32 * 1024];
        loop {
            match from_session.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(read) => {
                    let chunk = bytes::Bytes::copy_from_slice(&buffer[..read]);
                    if sink.send(Message::Binary(chunk)).await.is_err() {
                        return;
                    }
                }
            }
        }
        let close = CloseFrame {
            code: CloseCode::Normal,
            reason: "".into(),
        };
        let _ = sink.send(Message::Close(Some(close))).await;
        let _ = sink.close().await;
    };
    let session = async move {
        if let Err(error) = portforward::serve_spdy(session_io, pod_ip, sockets).await {
            tracing::debug!(pod = %pod_name, %error, "port-forward session ended");
        }
    };
    tokio::join!(inbound, outbound, session);
}

/// Answers a SPDY/3.1 upgrade with the protocol agreed (`portforward.k8s.io`) and serves the
/// streams the client opens, each relayed to its `port` header's port of the pod's IP.
fn serve_spdy(
    state: &Arc<ApiState>,
    name: &str,
    pod: &Value,
    upgrade: hyper::upgrade::OnUpgrade,
) -> ApiResult<Response> {
    let pod_ip = pod_ip(name, pod)?;
    let sockets = state.kubelet.pod_sockets();
    let response = Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, HeaderValue::from_static(SPDY))
        .header(
            STREAM_PROTOCOL_HEADER,
            HeaderValue::from_static(portforward::SPDY_PROTOCOL),
        )
        .body(Body::empty())
        .map_err(|error| ApiError::internal(error.to_string()))?;
    let pod_name = name.to_owned();
    state.spawn(async move {
        match upgrade.await {
            Ok(upgraded) => {
                if let Err(error) =
                    portforward::serve_spdy(TokioIo::new(upgraded), pod_ip, sockets).await
                {
                    tracing::debug!(pod = %pod_name, %error, "port-forward session ended");
                }
            }
            Err(error) => tracing::debug!(pod = %pod_name, %error, "port-forward upgrade failed"),
        }
    });
    Ok(response)
}
