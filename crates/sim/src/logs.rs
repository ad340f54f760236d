//! `pods/log`: what the API server checks (the pod exists, the container is one of its own)
//! before it asks the pod's kubelet for the log, in process ([`Kubelet::logs`]).

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;

use agent_sandbox_kubelet::{Kubelet, LogOptions, PodKey};
use axum::body::Body;
use axum::response::Response;
use futures::StreamExt as _;
use http::{HeaderValue, header};
use serde_json::Value;

use crate::api::ApiState;
use crate::api_error::{ApiError, ApiResult};
use crate::meta;
use crate::resources::ResourceInfo;

fn container_names(pod: &Value, field: &str) -> Vec<String> {
    pod.pointer(&format!("/spec/{field}"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| c.get("name").and_then(Value::as_str).map(str::to_owned))
        .collect()
}

/// The pod's kubelet key.
pub(crate) fn pod_key(pod: &Value) -> PodKey {
    PodKey {
        namespace: meta::namespace(pod).to_owned(),
        name: meta::name(pod).to_owned(),
        uid: meta::uid(pod).to_owned(),
    }
}

/// Serves `GET .../pods/{name}/log`.
pub(crate) async fn serve(
    state: &Arc<ApiState>,
    kubelet: &Kubelet,
    info: &ResourceInfo,
    namespace: &str,
    name: &str,
    query: &HashMap<String, String>,
) -> ApiResult<Response> {
    let pod = state.objects.get(info, namespace, name)?;
    let mut names = container_names(&pod, "containers");
    names.extend(container_names(&pod, "initContainers"));
    let container = match query.get("container").filter(|c| !c.is_empty()) {
        Some(container) => container.clone(),
        None if container_names(&pod, "containers").len() == 1 => names[0].clone(),
        None => {
            return Err(ApiError::bad_request(format!(
                "a container name must be specified for pod {name}, choose one of: [{}]",
                names.join(" ")
            )));
        }
    };
    if !names.contains(&container) {
        return Err(ApiError::bad_request(format!(
            "container {container} is not valid for pod {name}"
        )));
    }
    let number = |field: &str| query.get(field).and_then(|v| v.parse::<usize>().ok());
    let options = LogOptions {
        previous: query.get("previous").is_some_and(|v| v == "true"),
        tail_lines: number("tailLines"),
        limit_bytes: number("limitBytes"),
        follow: query.get("follow").is_some_and(|v| v == "true"),
    };
    let log = kubelet
        .logs(&pod_key(&pod), &container, &options)
        .await
        .map_err(|error| ApiError::bad_request(error.to_string()))?;
    let body = if options.follow {
        Body::from_stream(log.map(Ok::<_, Infallible>))
    } else {
        // All there is now, in one piece (and with its length).
        let chunks: Vec<bytes::Bytes> = log.collect().await;
        Body::from(chunks.concat())
    };
    let mut response = Response::new(body);
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    Ok(response)
}
