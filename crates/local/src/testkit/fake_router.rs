//! [`FakeRouter`]: a scripted HTTP/1.1 server on 127.0.0.1 that stands in for the router (and
//! the runtime behind it), so that tests can play a hostile or broken sandbox: names that climb
//! out of a download's destination, sizes that lie, pages that are not a router's. It records
//! every request, so a test can also assert what a client never sent.
//!
//! [`ready_claim`] writes a Ready SandboxClaim into any API server (no controller needed), so a
//! client can be attached to a fake router through a direct URL.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use agent_sandbox_api::claim::SandboxWarmPoolRef;
use agent_sandbox_api::runtime::v1::{self, DirectoryListing, FileEntry, FileType};
use agent_sandbox_api::{SandboxClaim, SandboxClaimSpec};
use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

use crate::error::{Error, Result};

/// A request the fake received.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct FakeRequest {
    /// `GET`, `PUT`, ...
    pub method: String,
    /// Path and query exactly as sent (still percent-encoded).
    pub uri: String,
}

impl FakeRequest {
    /// The sandbox path of a `/v1/files/...` request, percent-decoded (`None` for other
    /// endpoints).
    pub fn file_path(&self) -> Option<String> {
        let path = self.uri.split('?').next().unwrap_or_default();
        let encoded = path.strip_prefix(v1::paths::FILES)?;
        Some(
            percent_encoding::percent_decode_str(encoded)
                .decode_utf8_lossy()
                .into_owned(),
        )
    }
}

/// The error type of [`FakeBody`] streams.
pub type FakeBoxError = Box<dyn std::error::Error + Send + Sync>;
/// The body type of scripted answers.
pub type FakeBody = UnsyncBoxBody<Bytes, FakeBoxError>;

/// Binds `127.0.0.1:0` for a fake router.
async fn bind() -> Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind(("127.0.0.1", 0))
        .await
        .map_err(Error::io("bind a fake router on", "127.0.0.1:0"))?;
    let addr = listener.local_addr().map_err(Error::io(
        "read the address of the fake router on",
        "127.0.0.1:0",
    ))?;
    Ok((listener, addr))
}

type Respond = dyn Fn(&FakeRequest) -> Response<FakeBody> + Send + Sync;
type RespondRaw = dyn Fn(&FakeRequest) -> Vec<u8> + Send + Sync;

/// A scripted HTTP server on 127.0.0.1; stops when dropped.
pub struct FakeRouter {
    addr: SocketAddr,
    requests: Arc<Mutex<Vec<FakeRequest>>>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for FakeRouter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeRouter")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Drop for FakeRouter {
    fn drop(&mut self) {
        // Aborting the accept task drops its JoinSet, which aborts every connection task.
        self.task.abort();
    }
}

impl FakeRouter {
    /// Listens on `127.0.0.1:0` and answers every request with `respond`.
    pub async fn start(
        respond: impl Fn(&FakeRequest) -> Response<FakeBody> + Send + Sync + 'static,
    ) -> Result<Self> {
        let (listener, addr) = bind().await?;
        let requests: Arc<Mutex<Vec<FakeRequest>>> = Arc::default();
        let respond: Arc<Respond> = Arc::new(respond);
        let seen = requests.clone();
        let task = tokio::spawn(async move {
            let mut connections = JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                let respond = respond.clone();
                let seen = seen.clone();
                let service =
                    hyper::service::service_fn(move |request: http::Request<Incoming>| {
                        let request = FakeRequest {
                            method: request.method().to_string(),
                            uri: request
                                .uri()
                                .path_and_query()
                                .map(ToString::to_string)
                                .unwrap_or_default(),
                        };
                        seen.lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .push(request.clone());
                        let response = respond(&request);
                        async move { Ok::<_, Infallible>(response) }
                    });
                connections.spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
                // Reap finished connections so the set does not grow without bound.
                while connections.try_join_next().is_some() {}
            }
        });
        Ok(Self {
            addr,
            requests,
            task,
        })
    }

    /// Like [`FakeRouter::start`], but `respond` returns the raw bytes written back (status
    /// line, headers, body), after which the connection is closed: for answers no HTTP
    /// library would send, such as a `Content-Length` that lies.
    pub async fn start_raw(
        respond: impl Fn(&FakeRequest) -> Vec<u8> + Send + Sync + 'static,
    ) -> Result<Self> {
        let (listener, addr) = bind().await?;
        let requests: Arc<Mutex<Vec<FakeRequest>>> = Arc::default();
        let respond: Arc<RespondRaw> = Arc::new(respond);
        let seen = requests.clone();
        let task = tokio::spawn(async move {
            let mut connections = JoinSet::new();
            while let Ok((mut stream, _)) = listener.accept().await {
                let respond = respond.clone();
                let seen = seen.clone();
                connections.spawn(async move {
                    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
                    let mut head = Vec::new();
                    let mut buffer = [0_u8; 4096];
                    // The request head, at most 64 KiB of it (the body, if any, is ignored).
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 65536 {
                        match stream.read(&mut buffer).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buffer[..n]),
                        }
                    }
                    let text = String::from_utf8_lossy(&head);
                    let mut words = text.lines().next().unwrap_or_default().split(' ');
                    let request = FakeRequest {
                        method: words.next().unwrap_or_default().to_owned(),
                        uri: words.next().unwrap_or_default().to_owned(),
                    };
                    seen.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(request.clone());
                    let _ = stream.write_all(&respond(&request)).await;
                    let _ = stream.shutdown().await;
                });
                while connections.try_join_next().is_some() {}
            }
        });
        Ok(Self {
            addr,
            requests,
            task,
        })
    }

    /// The raw bytes of an HTTP/1.1 answer with these headers and body (for
    /// [`FakeRouter::start_raw`]); nothing is checked, so headers may lie.
    pub fn raw(status: u16, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
        let mut out = format!("HTTP/1.1 {status} Fake\r\nconnection: close\r\n");
        for (name, value) in headers {
            out.push_str(&format!("{name}: {value}\r\n"));
        }
        out.push_str("\r\n");
        let mut out = out.into_bytes();
        out.extend_from_slice(body);
        out
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<FakeRequest> {
        self.requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// An answer with `status`, a content type and `body`.
    pub fn answer(
        status: u16,
        content_type: &'static str,
        body: impl Into<Bytes>,
    ) -> Response<FakeBody> {
        let mut response = Response::new(
            Full::new(body.into())
                .map_err(|e| match e {})
                .boxed_unsync(),
        );
        *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
        response
    }

    /// A JSON answer.
    pub fn json(status: u16, value: &serde_json::Value) -> Response<FakeBody> {
        Self::answer(status, "application/json", value.to_string())
    }

    /// A `/v1/files` directory listing with these entries (name and type; size 1, mode 0644).
    pub fn listing(path: &str, entries: &[(&str, FileType)]) -> Response<FakeBody> {
        let listing = DirectoryListing {
            path: path.to_owned(),
            entries: entries
                .iter()
                .map(|(name, file_type)| FileEntry {
                    name: (*name).to_owned(),
                    size: 1,
                    file_type: *file_type,
                    modified_at: "2026-01-01T00:00:00Z".to_owned(),
                    mode: "0644".to_owned(),
                })
                .collect(),
        };
        Self::json(200, &serde_json::to_value(&listing).unwrap_or_default())
    }

    /// The runtime's `404 {"code": "NOT_FOUND"}`.
    pub fn not_found() -> Response<FakeBody> {
        Self::json(
            404,
            &json!({"code": "NOT_FOUND", "message": "no such file or directory"}),
        )
    }
}

/// Writes the SandboxClaim `namespace/claim` with `status.sandbox.name = sandbox` and
/// `Ready=True`, as the controller would once the claim is bound (the Sandbox object itself is
/// not needed by clients).
pub async fn ready_claim(
    kube: &kube::Client,
    namespace: &str,
    claim: &str,
    sandbox: &str,
) -> Result<()> {
    let api: Api<SandboxClaim> = Api::namespaced(kube.clone(), namespace);
    let object = SandboxClaim::new(
        claim,
        SandboxClaimSpec {
            warm_pool_ref: SandboxWarmPoolRef {
                name: "fake-pool".to_owned(),
            },
            ..SandboxClaimSpec::default()
        },
    );
    let target = format!("SandboxClaim {namespace}/{claim}");
    api.create(&PostParams::default(), &object)
        .await
        .map_err(Error::kube("create", &target))?;
    let status = json!({"status": {
        "sandbox": {"name": sandbox},
        "conditions": [{
            "type": "Ready", "status": "True", "reason": "DependenciesReady", "message": "",
            "lastTransitionTime": "2026-01-01T00:00:00Z"
        }]
    }});
    api.patch_status(claim, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .map_err(Error::kube("write the status of", &target))?;
    Ok(())
}
