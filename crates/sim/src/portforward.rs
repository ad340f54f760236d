//! `pods/portforward` over WebSocket with the `v4.channel.k8s.io` protocol that kube-rs speaks:
//! for the i-th requested port, channel 2i carries data and 2i+1 errors; each channel's first
//! frame is the port number (little endian). Data is relayed to the pod's port through its
//! kubelet, in process ([`agent_sandbox_kubelet::Kubelet::port_forward`]).

use std::collections::HashMap;
use std::sync::Arc;

use agent_sandbox_kubelet::{Kubelet, PodKey};

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use http::{HeaderMap, HeaderValue, StatusCode, header};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;

use crate::api::ApiState;
use crate::api_error::{ApiError, ApiResult};
use crate::resources::StorageKey;

/// The subprotocol served.
const PROTOCOL: &str = "v4.channel.k8s.io";

/// Parses `ports=8888,9000` (repeated or comma-separated).
pub(crate) fn parse_ports(raw: &str) -> Result<Vec<u16>, String> {
    raw.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            p.trim()
                .parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| format!("invalid port {p:?}"))
        })
        .collect()
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
    let target = crate::logs::pod_key(&pod);
    let kubelet = state.kubelet.clone();
    let ports = parse_ports(query.get("ports").map(String::as_str).unwrap_or_default())
        .map_err(ApiError::bad_request)?;
    if ports.is_empty() {
        return Err(ApiError::bad_request("at least one port must be given"));
    }
    let is_websocket = headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    let offers_protocol = headers
        .get(header::SEC_WEBSOCKET_PROTOCOL)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|p| p.trim() == PROTOCOL));
    let key = headers
        .get(header::SEC_WEBSOCKET_KEY)
        .map(HeaderValue::as_bytes);
    let (Some(key), true, true, Some(upgrade)) = (key, is_websocket, offers_protocol, upgrade)
    else {
        return Err(ApiError::bad_request(format!(
            "port-forward needs a WebSocket upgrade with the {PROTOCOL} subprotocol (SPDY is not supported by the sim)"
        )));
    };
    let accept = derive_accept_key(key);
    let response = Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, "websocket")
        .header(header::SEC_WEBSOCKET_ACCEPT, accept)
        .header(header::SEC_WEBSOCKET_PROTOCOL, PROTOCOL)
        .body(Body::empty())
        .map_err(|error| ApiError::internal(error.to_string()))?;
    let pod_name = name.to_owned();
    state.spawn(async move {
        match upgrade.await {
            Ok(upgraded) => {
                let socket =
                    WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None)
                        .await;
                relay(socket, &kubelet, &target, &ports).await;
            }
            Err(error) => tracing::debug!(pod = %pod_name, %error, "port-forward upgrade failed"),
        }
    });
    Ok(response)
}

fn frame(channel: u8, payload: &[u8]) -> Message {
    let mut bytes = Vec::with_capacity(payload.len() + 1);
    bytes.push(channel);
    bytes.extend_from_slice(payload);
    Message::Binary(Bytes::from(bytes))
}

async fn relay<S>(socket: WebSocketStream<S>, kubelet: &Kubelet, pod: &PodKey, ports: &[u16])
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sink, mut stream) = socket.split();
    let (from_pods, mut from_pods_rx) = mpsc::channel::<(u8, Option<Bytes>)>(64);
    let mut readers = JoinSet::new();
    let mut writers = Vec::new();
    let mut open = 0usize;
    for (index, port) in ports.iter().enumerate() {
        let Ok(data) = u8::try_from(index * 2) else {
            break;
        };
        let error = data + 1;
        let port_bytes = port.to_le_bytes();
        if sink.send(frame(data, &port_bytes)).await.is_err()
            || sink.send(frame(error, &port_bytes)).await.is_err()
        {
            return;
        }
        match kubelet.port_forward(pod, *port).await {
            Ok(tcp) => {
                let (mut read, write) = tcp.into_split();
                writers.push(Some(write));
                open += 1;
                let tx = from_pods.clone();
                readers.spawn(async move {
                    let mut buffer = vec![0u8; 64 * 1024];
                    loop {
                        match read.read(&mut buffer).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                if tx
                                    .send((data, Some(Bytes::copy_from_slice(&buffer[..n]))))
                                    .await
                                    .is_err()
                                {
                                    return;
                                }
                            }
                        }
                    }
                    let _ = tx.send((data, None)).await;
                });
            }
            Err(error) => {
                writers.push(None);
                let message = match std::error::Error::source(&error) {
                    Some(cause) => format!("{error}: {cause}"),
                    None => error.to_string(),
                };
                let _ = sink
                    .send(frame(error_channel(data), message.as_bytes()))
                    .await;
            }
        }
    }
    if open == 0 {
        let _ = sink.send(Message::Close(None)).await;
        return;
    }
    loop {
        tokio::select! {
            message = stream.next() => match message {
                Some(Ok(Message::Binary(bytes))) if !bytes.is_empty() => {
                    let channel = usize::from(bytes[0]);
                    if channel % 2 == 0
                        && let Some(Some(writer)) = writers.get_mut(channel / 2)
                        && writer.write_all(&bytes[1..]).await.is_err()
                    {
                        writers[channel / 2] = None;
                    }
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            },
            Some((channel, data)) = from_pods_rx.recv() => match data {
                Some(bytes) => {
                    if sink.send(frame(channel, &bytes)).await.is_err() {
                        break;
                    }
                }
                None => {
                    open -= 1;
                    if open == 0 {
                        // Like the kubelet: when every forwarded connection is closed by the pod,
                        // the stream ends.
                        break;
                    }
                }
            },
        }
    }
    readers.abort_all();
    // Completes the closing handshake (flushes the reply to a client's Close frame).
    let _ = sink.close().await;
}

fn error_channel(data: u8) -> u8 {
    data + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_parse() {
        assert_eq!(parse_ports("8888,9000"), Ok(vec![8888, 9000]));
        assert!(parse_ports("0").is_err());
        assert!(parse_ports("http").is_err());
        assert_eq!(parse_ports(""), Ok(vec![]));
    }
}
