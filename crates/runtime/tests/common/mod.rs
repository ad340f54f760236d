//! Helpers of the runtime's integration tests: an in-process server on a loopback port chosen
//! by the OS with its own temporary base directory, a small hyper client, NDJSON parsing and
//! process liveness checks by PID.

#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use agent_sandbox_api::runtime::v1::ExecEvent;
use agent_sandbox_runtime::{Config, Server};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::Value;
use tokio::net::TcpStream;
use tokio::sync::oneshot;

/// A runtime server serving in this test's tokio runtime; stopped (and its commands killed)
/// when dropped.
pub struct TestServer {
    pub addr: SocketAddr,
    pub base: tempfile::TempDir,
    shutdown_tx: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<agent_sandbox_runtime::Result<()>>>,
}

impl TestServer {
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    pub async fn start_with(configure: impl FnOnce(&mut Config)) -> Self {
        let base = tempfile::tempdir().unwrap();
        let mut config = Config::new(SocketAddr::from(([127, 0, 0, 1], 0)), base.path());
        configure(&mut config);
        let server = Server::bind(config).await.unwrap();
        let addr = server.local_addr();
        let (shutdown_tx, shutdown_rx) = oneshot::channel::<()>();
        let task = tokio::spawn(server.serve(async move {
            let _ = shutdown_rx.await;
        }));
        Self {
            addr,
            base,
            shutdown_tx: Some(shutdown_tx),
            task: Some(task),
        }
    }

    /// The base directory, canonical.
    pub fn base_path(&self) -> PathBuf {
        std::fs::canonicalize(self.base.path()).unwrap()
    }

    /// Graceful shutdown; returns when the server has stopped.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown_tx.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(30), task)
                .await
                .expect("the server stops in time")
                .unwrap()
                .unwrap();
        }
    }

    pub async fn get(&self, path: &str) -> Reply {
        send(self.addr, Method::GET, path, &[], Bytes::new()).await
    }

    pub async fn post_json(&self, path: &str, body: &Value) -> Reply {
        send(
            self.addr,
            Method::POST,
            path,
            &[("content-type", "application/json")],
            Bytes::from(serde_json::to_vec(body).unwrap()),
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

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown_tx.take() {
            let _ = tx.send(());
        }
    }
}

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

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn events(&self) -> Vec<ExecEvent> {
        parse_events(&self.body)
    }

    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    }
}

pub fn parse_events(body: &[u8]) -> Vec<ExecEvent> {
    body.split(|b| *b == b'\n')
        .filter(|line| !line.is_empty())
        .map(|line| {
            serde_json::from_slice(line).unwrap_or_else(|e| {
                panic!("bad NDJSON line ({e}): {}", String::from_utf8_lossy(line))
            })
        })
        .collect()
}

/// Opens a connection and sends one request; the answer's body is left to stream.
pub async fn open<B>(addr: SocketAddr, request: Request<B>) -> Response<Incoming>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = TcpStream::connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(async move {
        let _ = connection.await;
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
        .header("host", "sandbox");
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
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    Reply {
        status,
        headers,
        body,
    }
}

/// Whether `pid` is a live process (a zombie counts as dead).
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        Ok(stat) => {
            // The state follows the parenthesised command name.
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next());
            !matches!(state, Some("Z" | "X"))
        }
    }
}

/// Waits (bounded) until none of `pids` is alive; returns the survivors.
pub async fn survivors(pids: &[u32], within: Duration) -> Vec<u32> {
    let deadline = Instant::now() + within;
    loop {
        let left: Vec<u32> = pids.iter().copied().filter(|pid| alive(*pid)).collect();
        if left.is_empty() || Instant::now() >= deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Pids of the live processes whose process group is `pgid`.
pub fn group_members(pgid: u32) -> Vec<u32> {
    let mut members = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        // Fields after the name: state ppid pgrp ...
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.get(2).and_then(|f| f.parse::<u32>().ok()) == Some(pgid) && alive(pid) {
            members.push(pid);
        }
    }
    members
}

/// Polls `probe` until it returns `Some` (bounded).
pub async fn eventually<T>(within: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(value) = probe() {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Reads a pid that a command wrote into `path`.
pub async fn pid_from_file(path: &Path) -> u32 {
    eventually(Duration::from_secs(10), || {
        std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.trim().parse().ok())
    })
    .await
    .expect("the command wrote its pid")
}

/// Deterministic pseudo-random bytes (xorshift), so large transfers are not trivially
/// compressible or periodic.
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
