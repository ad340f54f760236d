//! A fake Kubernetes API server for the router's watch tests: list and watch of Sandboxes
//! (`agents.x-k8s.io/v1beta1`) and Pods (`v1`), all namespaces or one, with `labelSelector`
//! (`key` or `key=value`) and `resourceVersion`. Objects are changed by the test, and every
//! change becomes a watch event. Nothing else of the API is served (404). [`FakeApi::forbid_sandboxes`]
//! answers Sandbox requests 403, as the API server does under upstream's router RBAC (pods only).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use agent_sandbox_api::Sandbox;
use bytes::Bytes;
use futures_util::stream;
use http_body_util::{BodyExt as _, Full, StreamBody, combinators::UnsyncBoxBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::Notify;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Sandbox,
    Pod,
}

#[derive(Debug)]
struct Change {
    rv: u64,
    kind: Kind,
    action: &'static str,
    object: Value,
}

#[derive(Debug, Default)]
struct State {
    rv: u64,
    objects: BTreeMap<(u8, String, String), Value>,
    changes: Vec<Change>,
    requests: Vec<String>,
    forbid_sandboxes: bool,
}

fn kind_key(kind: Kind) -> u8 {
    match kind {
        Kind::Sandbox => 0,
        Kind::Pod => 1,
    }
}

/// The fake API server; stops when dropped.
pub struct FakeApi {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    notify: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeApi {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State::default()));
        let notify = Arc::new(Notify::new());
        let (task_state, task_notify) = (Arc::clone(&state), Arc::clone(&notify));
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                let (state, notify) = (Arc::clone(&task_state), Arc::clone(&task_notify));
                connections.spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        let (state, notify) = (Arc::clone(&state), Arc::clone(&notify));
                        async move { Ok::<_, Infallible>(handle(request, state, notify).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self {
            addr,
            state,
            notify,
            task,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn change(&self, kind: Kind, action: &'static str, mut object: Value) {
        {
            let mut state = self.lock();
            state.rv += 1;
            let rv = state.rv;
            object["metadata"]["resourceVersion"] = json!(rv.to_string());
            let key = (
                kind_key(kind),
                object["metadata"]["namespace"].as_str().unwrap().to_owned(),
                object["metadata"]["name"].as_str().unwrap().to_owned(),
            );
            if action == "DELETED" {
                state.objects.remove(&key);
            } else {
                state.objects.insert(key, object.clone());
            }
            state.changes.push(Change {
                rv,
                kind,
                action,
                object,
            });
        }
        self.notify.notify_waiters();
    }

    pub fn apply_sandbox(&self, sandbox: &Sandbox) {
        let object = serde_json::to_value(sandbox).unwrap();
        let exists = self.lock().objects.contains_key(&(
            0,
            object["metadata"]["namespace"].as_str().unwrap().to_owned(),
            object["metadata"]["name"].as_str().unwrap().to_owned(),
        ));
        self.change(
            Kind::Sandbox,
            if exists { "MODIFIED" } else { "ADDED" },
            object,
        );
    }

    pub fn delete_sandbox(&self, sandbox: &Sandbox) {
        self.change(
            Kind::Sandbox,
            "DELETED",
            serde_json::to_value(sandbox).unwrap(),
        );
    }

    pub fn apply_pod(&self, pod: &Pod) {
        let object = serde_json::to_value(pod).unwrap();
        let exists = self.lock().objects.contains_key(&(
            1,
            object["metadata"]["namespace"].as_str().unwrap().to_owned(),
            object["metadata"]["name"].as_str().unwrap().to_owned(),
        ));
        self.change(Kind::Pod, if exists { "MODIFIED" } else { "ADDED" }, object);
    }

    pub fn delete_pod(&self, pod: &Pod) {
        self.change(Kind::Pod, "DELETED", serde_json::to_value(pod).unwrap());
    }

    /// From now on, Sandbox lists and watches get 403 Forbidden.
    pub fn forbid_sandboxes(&self) {
        self.lock().forbid_sandboxes = true;
    }

    /// From now on, Sandboxes are served again (RBAC granted).
    pub fn allow_sandboxes(&self) {
        self.lock().forbid_sandboxes = false;
    }

    /// The request targets (path and query) received so far.
    pub fn requests(&self) -> Vec<String> {
        self.lock().requests.clone()
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kube client for this server.
    pub fn client(&self) -> kube::Client {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let config = kube::Config::new(self.url().parse().unwrap());
        kube::Client::try_from(config).unwrap()
    }

    /// Writes a kubeconfig for this server into `dir`.
    pub fn kubeconfig(&self, dir: &Path) -> PathBuf {
        let path = dir.join("kubeconfig");
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\n\
                 contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n\
                 current-context: fake\nusers:\n- name: fake\n  user: {{}}\n",
                self.url()
            ),
        )
        .unwrap();
        path
    }
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type Body = UnsyncBoxBody<Bytes, Infallible>;

fn json_response(status: StatusCode, value: &Value) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(value.to_string())).boxed_unsync());
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    response
}

/// `(kind, namespace)` of a list/watch path.
fn route(path: &str) -> Option<(Kind, Option<String>)> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match segments.as_slice() {
        ["apis", "agents.x-k8s.io", "v1beta1", "sandboxes"] => Some((Kind::Sandbox, None)),
        [
            "apis",
            "agents.x-k8s.io",
            "v1beta1",
            "namespaces",
            ns,
            "sandboxes",
        ] => Some((Kind::Sandbox, Some((*ns).to_owned()))),
        ["api", "v1", "pods"] => Some((Kind::Pod, None)),
        ["api", "v1", "namespaces", ns, "pods"] => Some((Kind::Pod, Some((*ns).to_owned()))),
        _ => None,
    }
}

fn query(uri: &hyper::Uri) -> BTreeMap<String, String> {
    uri.query()
        .unwrap_or("")
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (k.to_owned(), percent_decode(v)))
        .collect()
}

fn percent_decode(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Ok(byte) = u8::from_str_radix(&value[i + 1..i + 3], 16)
        {
            out.push(byte);
            i += 3;
            continue;
        }
        out.push(if bytes[i] == b'+' { b' ' } else { bytes[i] });
        i += 1;
    }
    String::from_utf8(out).unwrap()
}

fn matches(object: &Value, namespace: Option<&str>, selector: Option<&str>) -> bool {
    if let Some(namespace) = namespace
        && object["metadata"]["namespace"].as_str() != Some(namespace)
    {
        return false;
    }
    let Some(selector) = selector.filter(|s| !s.is_empty()) else {
        return true;
    };
    let labels = &object["metadata"]["labels"];
    selector.split(',').all(|term| match term.split_once('=') {
        Some((key, value)) => labels[key].as_str() == Some(value),
        None => labels.get(term).is_some(),
    })
}

async fn handle(
    request: Request<Incoming>,
    state: Arc<Mutex<State>>,
    notify: Arc<Notify>,
) -> Response<Body> {
    let uri = request.uri().clone();
    state
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .requests
        .push(uri.to_string());
    let Some((kind, namespace)) = route(uri.path()) else {
        return json_response(
            StatusCode::NOT_FOUND,
            &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}),
        );
    };
    if kind == Kind::Sandbox
        && state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .forbid_sandboxes
    {
        return json_response(
            StatusCode::FORBIDDEN,
            &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden",
                    "message": "sandboxes.agents.x-k8s.io is forbidden: User \"system:serviceaccount:agent-sandbox-system:sandbox-router\" cannot list resource \"sandboxes\"",
                    "code": 403}),
        );
    }
    let query = query(&uri);
    let selector = query.get("labelSelector").cloned();
    let watching = matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
    if !watching {
        let state = state.lock().unwrap_or_else(PoisonError::into_inner);
        let items: Vec<Value> = state
            .objects
            .iter()
            .filter(|((k, _, _), object)| {
                *k == kind_key(kind) && matches(object, namespace.as_deref(), selector.as_deref())
            })
            .map(|(_, object)| object.clone())
            .collect();
        let (api_version, list_kind) = match kind {
            Kind::Sandbox => ("agents.x-k8s.io/v1beta1", "SandboxList"),
            Kind::Pod => ("v1", "PodList"),
        };
        return json_response(
            StatusCode::OK,
            &json!({
                "apiVersion": api_version,
                "kind": list_kind,
                "metadata": {"resourceVersion": state.rv.to_string()},
                "items": items,
            }),
        );
    }
    let cursor: u64 = query
        .get("resourceVersion")
        .and_then(|rv| rv.parse().ok())
        .unwrap_or(0);
    let events = stream::unfold(cursor, move |mut cursor| {
        let (state, notify, namespace, selector) = (
            Arc::clone(&state),
            Arc::clone(&notify),
            namespace.clone(),
            selector.clone(),
        );
        async move {
            loop {
                let notified = notify.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                let lines: Vec<u8> = {
                    let state = state.lock().unwrap_or_else(PoisonError::into_inner);
                    let mut lines = Vec::new();
                    let from = cursor;
                    for change in state.changes.iter().filter(|c| c.rv > from) {
                        cursor = change.rv;
                        if change.kind == kind
                            && matches(&change.object, namespace.as_deref(), selector.as_deref())
                        {
                            lines.extend(
                                json!({"type": change.action, "object": change.object})
                                    .to_string()
                                    .into_bytes(),
                            );
                            lines.push(b'\n');
                        }
                    }
                    lines
                };
                if !lines.is_empty() {
                    return Some((Ok::<_, Infallible>(Frame::data(Bytes::from(lines))), cursor));
                }
                notified.await;
            }
        }
    });
    let mut response = Response::new(StreamBody::new(events).boxed_unsync());
    response
        .headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    response
}
