//! `pods/log`: a container's captured output, whole, tailed, limited or followed.

use std::collections::HashMap;
use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderValue, header};
use serde_json::Value;

use crate::api::ApiState;
use crate::api_error::{ApiError, ApiResult};
use crate::kubelet::{log_file, pod_paths};
use crate::meta;
use crate::resources::ResourceInfo;

/// How often a followed log is polled for growth.
const FOLLOW_POLL: Duration = Duration::from_millis(100);

fn container_names(pod: &Value, field: &str) -> Vec<String> {
    pod.pointer(&format!("/spec/{field}"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| c.get("name").and_then(Value::as_str).map(str::to_owned))
        .collect()
}

fn is_running(pod: &Value, container: &str) -> bool {
    ["containerStatuses", "initContainerStatuses"]
        .iter()
        .any(|field| {
            pod.pointer(&format!("/status/{field}"))
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .any(|s| {
                    s.get("name").and_then(Value::as_str) == Some(container)
                        && s.pointer("/state/running").is_some()
                })
        })
}

/// Keeps the last `lines` lines of `text`.
pub(crate) fn tail(text: &[u8], lines: usize) -> &[u8] {
    if lines == 0 {
        return &[];
    }
    let trimmed = text.strip_suffix(b"\n").unwrap_or(text);
    let mut seen = 0;
    for (index, byte) in trimmed.iter().enumerate().rev() {
        if *byte == b'\n' {
            seen += 1;
            if seen == lines {
                return &text[index + 1..];
            }
        }
    }
    text
}

/// Serves `GET .../pods/{name}/log`.
pub(crate) async fn serve(
    state: &Arc<ApiState>,
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
    let previous = query.get("previous").is_some_and(|v| v == "true");
    let paths = pod_paths(&state.pods_dir, namespace, name, meta::uid(&pod));
    let file = log_file(&paths, &container, previous);
    let content = tokio::fs::read(&file).await.map_err(|_| {
        if previous {
            ApiError::bad_request(format!(
                "previous terminated container \"{container}\" in pod \"{name}\" not found"
            ))
        } else {
            ApiError::bad_request(format!(
                "container \"{container}\" in pod \"{name}\" is waiting to start: ContainerCreating"
            ))
        }
    })?;
    let mut body = match query.get("tailLines").and_then(|v| v.parse::<usize>().ok()) {
        Some(lines) => tail(&content, lines).to_vec(),
        None => content.clone(),
    };
    if let Some(limit) = query
        .get("limitBytes")
        .and_then(|v| v.parse::<usize>().ok())
    {
        body.truncate(limit);
    }
    let follow = query.get("follow").is_some_and(|v| v == "true") && !previous;
    let mut response = if follow && is_running(&pod, &container) {
        let follower = Follower {
            state: state.clone(),
            file,
            offset: content.len() as u64,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            uid: meta::uid(&pod).to_owned(),
            container,
            first: Some(Bytes::from(body)),
            done: false,
        };
        Response::new(Body::from_stream(futures::stream::unfold(
            follower,
            |mut f| async move { f.next().await.map(|bytes| (Ok::<_, Infallible>(bytes), f)) },
        )))
    } else {
        Response::new(Body::from(body))
    };
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    Ok(response)
}

struct Follower {
    state: Arc<ApiState>,
    file: PathBuf,
    offset: u64,
    namespace: String,
    name: String,
    uid: String,
    container: String,
    first: Option<Bytes>,
    done: bool,
}

impl Follower {
    async fn read_new(&mut self) -> Option<Bytes> {
        use tokio::io::{AsyncReadExt, AsyncSeekExt};
        let mut file = tokio::fs::File::open(&self.file).await.ok()?;
        file.seek(std::io::SeekFrom::Start(self.offset))
            .await
            .ok()?;
        let mut buffer = Vec::new();
        file.read_to_end(&mut buffer).await.ok()?;
        if buffer.is_empty() {
            return None;
        }
        self.offset += buffer.len() as u64;
        Some(Bytes::from(buffer))
    }

    fn still_running(&self) -> bool {
        let pods = crate::resources::StorageKey::new("", "pods");
        self.state
            .objects
            .store
            .get(&pods, &self.namespace, &self.name)
            .is_some_and(|pod| meta::uid(&pod) == self.uid && is_running(&pod, &self.container))
    }

    async fn next(&mut self) -> Option<Bytes> {
        if let Some(first) = self.first.take().filter(|b| !b.is_empty()) {
            return Some(first);
        }
        loop {
            if self.done {
                return None;
            }
            if let Some(bytes) = self.read_new().await {
                return Some(bytes);
            }
            if !self.still_running() {
                self.done = true;
                // Whatever was written between the last read and the exit.
                return self.read_new().await;
            }
            tokio::time::sleep(FOLLOW_POLL).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_the_last_lines() {
        assert_eq!(tail(b"a\nb\nc\n", 2), b"b\nc\n");
        assert_eq!(tail(b"a\nb\nc", 1), b"c");
        assert_eq!(tail(b"a\n", 5), b"a\n");
        assert_eq!(tail(b"a\nb\n", 0), b"");
    }
}
