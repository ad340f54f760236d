//! `pods/portforward` over WebSocket with the `v4.channel.k8s.io` protocol that kube-rs speaks:
//! for the i-th requested port, channel 2i carries data and 2i+1 errors; each channel's first
//! frame is the port number (little endian). The protocol is the kubelet's
//! ([`agent_sandbox_kubelet::portforward::serve_websocket`]); data is relayed to the pod's port
//! through its kubelet, in process ([`agent_sandbox_kubelet::Kubelet::port_forward`]).

use std::collections::HashMap;
use std::sync::Arc;

use agent_sandbox_kubelet::portforward;

use axum::body::Body;
use axum::response::Response;
use http::{HeaderMap, StatusCode, header};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::Role;

use crate::api::ApiState;
use crate::api_error::{ApiError, ApiResult};
use crate::resources::StorageKey;

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
    let ports =
        portforward::parse_ports(query.get("ports").map(String::as_str).unwrap_or_default())
            .map_err(ApiError::bad_request)?;
    if ports.is_empty() {
        return Err(ApiError::bad_request("at least one port must be given"));
    }
    let (Some(accept), Some(upgrade)) = (portforward::websocket_accept(headers), upgrade) else {
        return Err(ApiError::bad_request(format!(
            "port-forward needs a WebSocket upgrade with the {} subprotocol (SPDY is not supported by the sim)",
            portforward::WEBSOCKET_PROTOCOL
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
