//! Helpers of the router's integration tests: the real `sandbox-runtime` binary as a child
//! process on its own loopback address (a "pod IP"), an in-process router on a port chosen by
//! the OS with an index fed directly, Sandbox and Pod fixtures, a small hyper client, and tiny
//! backends (echo, WebSocket echo, connection counter, hang-up) for what the runtime cannot show.
//! Every process and server started here stops when its guard drops.

#![allow(dead_code, unreachable_pub)]

pub mod fake_api;

use std::io::{BufRead, BufReader};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use agent_sandbox_api::{Sandbox, SandboxStatus, labels, name_hash};
use agent_sandbox_router::{Config, Router, SharedIndex};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, Pod, PodCondition, PodIP, PodSpec, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, OwnerReference, Time};
use serde_json::Value;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

/// The runtime's port in every "pod".
pub const RUNTIME_PORT: u16 = 8888;

// ---------------------------------------------------------------------------------------------
// Binaries and addresses

/// The `sandbox-runtime` binary, built (once per test process) into this test's target
/// directory and profile.
pub fn runtime_binary() -> PathBuf {
    agent_sandbox_sim::test_support::workspace_binary("agent-sandbox-runtime", "sandbox-runtime")
        .unwrap()
}

/// A fresh, hardly-ever-reused loopback address in 127.64.0.0 - 127.253.255.254: several test
/// binaries and other engineers' tests run at once, each "pod" gets its own address so that it
/// can listen on the real runtime port.
pub fn loopback_ip() -> IpAddr {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::from(d.subsec_nanos()) ^ d.as_secs());
    let mut x = nanos
        ^ (u64::from(std::process::id()) << 20)
        ^ COUNTER
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15);
    // splitmix64 finaliser, to spread close seeds.
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    let [a, b, c, ..] = x.to_le_bytes();
    IpAddr::V4(Ipv4Addr::new(127, 64 + a % 190, b, 1 + c % 254))
}

/// A real `sandbox-runtime` listening on `<its own loopback IP>:8888`; killed on drop.
pub struct Runtime {
    child: Child,
    pub ip: IpAddr,
    pub addr: SocketAddr,
    pub base: tempfile::TempDir,
}

impl Runtime {
    pub fn start() -> Self {
        let binary = runtime_binary();
        for _ in 0..20 {
            let ip = loopback_ip();
            let base = tempfile::tempdir().unwrap();
            let mut child = Command::new(&binary)
                .env(
                    "SANDBOX_LISTEN",
                    SocketAddr::new(ip, RUNTIME_PORT).to_string(),
                )
                .env("SANDBOX_BASE_DIR", base.path())
                .env("RUST_LOG", "info")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            let stderr = child.stderr.take().unwrap();
            let mut runtime = Self {
                child,
                ip,
                addr: SocketAddr::new(ip, RUNTIME_PORT),
                base,
            };
            let (lines_tx, lines_rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    let _ = lines_tx.send(line);
                }
            });
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                match lines_rx.recv_timeout(left) {
                    Ok(line) if line.contains("listening on") => return runtime,
                    Ok(_) => {}
                    // Exited (address taken, most likely): try another address.
                    Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                        panic!("sandbox-runtime did not start within 30 s")
                    }
                }
            }
            let _ = runtime.child.wait();
        }
        panic!("no free loopback address for sandbox-runtime after 20 attempts");
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------------
// The router under test

/// The router serving in this test's tokio runtime; stopped when dropped.
pub struct TestRouter {
    pub addr: SocketAddr,
    pub index: SharedIndex,
    shutdown_tx: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<agent_sandbox_router::Result<()>>>,
}

impl TestRouter {
    pub async fn start(index: SharedIndex) -> Self {
        Self::start_with(index, |_| {}).await
    }

    pub async fn start_with(index: SharedIndex, configure: impl FnOnce(&mut Config)) -> Self {
        let mut config = Config::new(SocketAddr::from(([127, 0, 0, 1], 0)));
        config.connect_timeout = Duration::from_secs(2);
        configure(&mut config);
        let router = Router::bind(config, index.clone()).await.unwrap();
        let addr = router.local_addr();
        let (shutdown_tx, shutdown_rx) = oneshot::channel::<()>();
        let task = tokio::spawn(router.serve(async move {
            let _ = shutdown_rx.await;
        }));
        Self {
            addr,
            index,
            shutdown_tx: Some(shutdown_tx),
            task: Some(task),
        }
    }

    /// Graceful shutdown; returns when the router has stopped.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown_tx.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(60), task)
                .await
                .expect("the router stops in time")
                .unwrap()
                .unwrap();
        }
    }

    /// A request to sandbox `default/<id>`.
    pub async fn call(
        &self,
        id: &str,
        method: Method,
        path: &str,
        body: impl Into<Bytes>,
    ) -> Reply {
        send(
            self.addr,
            method,
            path,
            &[("x-sandbox-id", id)],
            body.into(),
        )
        .await
    }

    pub async fn send(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Reply {
        send(self.addr, method, path, headers, body.into()).await
    }
}

impl Drop for TestRouter {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown_tx.take() {
            let _ = tx.send(());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Fixtures

fn ready_condition(status: &str, reason: &str, message: &str) -> Condition {
    Condition {
        type_: "Ready".to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message: message.to_owned(),
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        observed_generation: Some(1),
    }
}

/// A Ready sandbox `<namespace>/<name>` with UID `uid-<name>`, no Service.
pub fn sandbox_in(namespace: &str, name: &str) -> Sandbox {
    let mut sandbox = Sandbox::new(name, Default::default());
    sandbox.metadata.namespace = Some(namespace.to_owned());
    sandbox.metadata.uid = Some(format!("uid-{name}"));
    sandbox.status = Some(SandboxStatus {
        conditions: vec![ready_condition("True", "DependenciesReady", "")],
        ..SandboxStatus::default()
    });
    sandbox
}

/// A Ready sandbox `default/<name>`.
pub fn sandbox(name: &str) -> Sandbox {
    sandbox_in("default", name)
}

/// Marks a sandbox not Ready with `reason` and `message`.
pub fn not_ready(mut sandbox: Sandbox, reason: &str, message: &str) -> Sandbox {
    sandbox.status = Some(SandboxStatus {
        conditions: vec![ready_condition("False", reason, message)],
        ..SandboxStatus::default()
    });
    sandbox
}

/// The controller reference `kind/name` with `uid`.
pub fn controller(kind: &str, name: &str, uid: &str) -> OwnerReference {
    let api_version = if kind == agent_sandbox_api::kinds::SANDBOX {
        agent_sandbox_api::API_VERSION
    } else {
        agent_sandbox_api::EXTENSIONS_API_VERSION
    };
    OwnerReference {
        api_version: api_version.to_owned(),
        kind: kind.to_owned(),
        name: name.to_owned(),
        uid: uid.to_owned(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// The pod the controller would run for `sandbox` (named after it, or after its pod-name
/// annotation), Running at `ip`, declaring `ports`.
pub fn pod_for(sandbox: &Sandbox, ip: IpAddr, ports: &[u16]) -> Pod {
    let name = sandbox.metadata.name.clone().unwrap();
    let pod_name = sandbox
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(agent_sandbox_api::annotations::POD_NAME).cloned())
        .unwrap_or_else(|| name.clone());
    Pod {
        metadata: ObjectMeta {
            name: Some(pod_name),
            namespace: sandbox.metadata.namespace.clone(),
            uid: Some(format!("pod-uid-{name}")),
            labels: Some(
                [(labels::SANDBOX_NAME_HASH.to_owned(), name_hash(&name))]
                    .into_iter()
                    .collect(),
            ),
            owner_references: Some(vec![controller(
                agent_sandbox_api::kinds::SANDBOX,
                &name,
                sandbox.metadata.uid.as_deref().unwrap(),
            )]),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "runtime".to_owned(),
                ports: Some(
                    ports
                        .iter()
                        .map(|port| ContainerPort {
                            container_port: i32::from(*port),
                            ..ContainerPort::default()
                        })
                        .collect(),
                ),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        status: Some(PodStatus {
            phase: Some("Running".to_owned()),
            conditions: Some(vec![PodCondition {
                type_: "Ready".to_owned(),
                status: "True".to_owned(),
                ..PodCondition::default()
            }]),
            pod_ip: Some(ip.to_string()),
            pod_ips: Some(vec![PodIP { ip: ip.to_string() }]),
            ..PodStatus::default()
        }),
    }
}

/// An index whose initial lists are done, holding `objects`.
pub fn synced_index(objects: &[(&Sandbox, &Pod)]) -> SharedIndex {
    let index = SharedIndex::new();
    {
        let mut index = index.write();
        index.reset_sandboxes(objects.iter().map(|(s, _)| *s));
        index.reset_pods(objects.iter().map(|(_, p)| *p));
    }
    index
}

// ---------------------------------------------------------------------------------------------
// HTTP client

/// A complete answer.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: hyper::HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    /// The `detail` of a refusal (and checks the refusal's shape: an object with one string).
    pub fn detail(&self) -> String {
        let json = self.json();
        let object = json
            .as_object()
            .unwrap_or_else(|| panic!("not an object: {json}"));
        assert_eq!(object.len(), 1, "{json}");
        assert_eq!(
            self.headers
                .get("content-type")
                .map(|v| v.to_str().unwrap()),
            Some("application/json")
        );
        object["detail"].as_str().unwrap().to_owned()
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Opens a connection to `addr` and sends one request; the answer's body is left to stream.
pub async fn open<B>(addr: SocketAddr, request: Request<B>) -> Response<Incoming>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = TcpStream::connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(async move {
        let _ = connection.with_upgrades().await;
    });
    sender.send_request(request).await.unwrap()
}

pub fn request(
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> Request<Full<Bytes>> {
    let mut builder = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "router.test");
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(Full::new(body)).unwrap()
}

pub async fn send(
    addr: SocketAddr,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> Reply {
    let response = open(addr, request(method, path, headers, body)).await;
    collect(response).await
}

pub async fn collect(response: Response<Incoming>) -> Reply {
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    Reply {
        status,
        headers,
        body,
    }
}

/// `POST /execute` of `command` through the shell.
pub fn execute(command: &str) -> Bytes {
    Bytes::from(serde_json::json!({"command": command, "shell": true}).to_string())
}

/// Deterministic pseudo-random bytes (xorshift), so large transfers are neither trivially
/// compressible nor periodic.
pub fn pseudo_random(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.extend_from_slice(&state.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Polls `probe` until it returns `Some` (bounded by `within`).
pub async fn eventually<T, F>(within: Duration, mut probe: impl FnMut() -> F) -> Option<T>
where
    F: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(value) = probe().await {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Small backends

/// A listener on `<ip>:<port or any>` that serves each connection with `serve`, counting
/// accepted connections; stopped on drop.
pub struct Backend {
    pub addr: SocketAddr,
    pub accepted: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Backend {
    /// Binds `ip:port` (port 0: any); `None` when the address is taken.
    pub async fn bind<F, Fut>(ip: IpAddr, port: u16, serve: F) -> Option<Self>
    where
        F: Fn(TcpStream) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let listener = TcpListener::bind(SocketAddr::new(ip, port)).await.ok()?;
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&accepted);
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                connections.spawn(serve(stream));
            }
        });
        Some(Self {
            addr,
            accepted,
            task,
        })
    }

    /// Binds a fresh loopback address (retrying on collisions) on `port`.
    pub async fn on_fresh_ip<F, Fut>(port: u16, serve: F) -> Self
    where
        F: Fn(TcpStream) -> Fut + Clone + Send + Sync + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        for _ in 0..20 {
            if let Some(backend) = Self::bind(loopback_ip(), port, serve.clone()).await {
                return backend;
            }
        }
        panic!("no free loopback address after 20 attempts");
    }

    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves HTTP/1.1 on `stream`, answering every request by streaming its body straight back
/// (frame by frame, as it arrives) with the request's method, target and headers echoed as
/// `x-echo-method`, `x-echo-uri` and `x-echo-<header>`.
pub async fn echo_http(stream: TcpStream) {
    let service = hyper::service::service_fn(|request: Request<Incoming>| async move {
        let (parts, body) = request.into_parts();
        let mut response = Response::new(body);
        let headers = response.headers_mut();
        for (name, value) in &parts.headers {
            if let Ok(echo) = HeaderName::from_bytes(format!("x-echo-{name}").as_bytes()) {
                headers.append(echo, value.clone());
            }
        }
        headers.insert(
            "x-echo-method",
            HeaderValue::from_str(parts.method.as_str()).unwrap(),
        );
        headers.insert(
            "x-echo-uri",
            HeaderValue::from_str(&parts.uri.to_string()).unwrap(),
        );
        Ok::<_, std::convert::Infallible>(response)
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

/// Serves HTTP/1.1 on `stream`, reading each request body to its end (counting, not keeping,
/// the bytes) before answering `{"bytes": n}`.
pub async fn count_http(stream: TcpStream) {
    let service = hyper::service::service_fn(|request: Request<Incoming>| async move {
        let mut body = request.into_body();
        let mut bytes = 0usize;
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(frame) => bytes += frame.data_ref().map_or(0, Bytes::len),
                Err(_) => break,
            }
        }
        let answer = serde_json::json!({ "bytes": bytes }).to_string();
        Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from(answer))))
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

/// Serves WebSocket on `stream`: every text or binary message is sent back.
pub async fn websocket_echo(stream: TcpStream) {
    use futures_util::{SinkExt as _, StreamExt as _};
    let Ok(mut socket) = tokio_tungstenite::accept_async(stream).await else {
        return;
    };
    while let Some(Ok(message)) = socket.next().await {
        if message.is_close() {
            break;
        }
        if (message.is_text() || message.is_binary()) && socket.send(message).await.is_err() {
            break;
        }
    }
}

/// Reads one request head (up to the blank line) from `stream`; `false` when the peer closed
/// first.
pub async fn read_head(stream: &mut TcpStream) -> bool {
    use tokio::io::AsyncReadExt as _;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte).await {
            Ok(1) => head.push(byte[0]),
            _ => return false,
        }
        if head.len() > 64 << 10 {
            return false;
        }
    }
    true
}
