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

/// Whether a header `name` lists `wanted` (comma-separated, repeated headers, any case).
fn offers(headers: &HeaderMap, name: &str, wanted: &str) -> bool {
    headers.get_all(name).iter().any(|value| {
        value.to_str().is_ok_and(|v| {
            v.split(',')
                .any(|item| item.trim().eq_ignore_ascii_case(wanted))
        })
    })
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

/// Answers a SPDY/3.1 upgrade with the protocol agreed (`portforward.k8s.io`) and serves the
/// streams the client opens, each relayed to its `port` header's port of the pod's IP.
fn serve_spdy(
    state: &Arc<ApiState>,
    name: &str,
    pod: &Value,
    upgrade: hyper::upgrade::OnUpgrade,
) -> ApiResult<Response> {
    let pod_ip = pod
        .pointer("/status/podIP")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let pod_ip: IpAddr = pod_ip.parse().map_err(|_| {
        ApiError::internal(format!("pod {name} has an unusable IP address {pod_ip:?}"))
    })?;
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
                if let Err(error) = portforward::serve_spdy(TokioIo::new(upgraded), pod_ip).await {
                    tracing::debug!(pod = %pod_name, %error, "port-forward session ended");
                }
            }
            Err(error) => tracing::debug!(pod = %pod_name, %error, "port-forward upgrade failed"),
        }
    });
    Ok(response)
}
