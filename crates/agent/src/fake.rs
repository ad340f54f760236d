//! A scripted fake of the Messages API (feature `fake`): an axum server on 127.0.0.1:0 that
//! answers `POST /v1/messages` with the next scripted reply and records every request. For
//! tests of this crate and the end-to-end suite, which drive the real agent with no network.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::post;
use serde_json::{Value, json};

/// The seed article's script: `fib.py`, written by the model's first tool call.
pub const FIB: &str = "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        yield a\n        a, b = b, a + b\n\n\nprint(list(fibonacci(10)))\n";
/// What `python3 fib.py` prints.
pub const FIB_OUTPUT: &str = "[0, 1, 1, 2, 3, 5, 8, 13, 21, 34]";
/// The model's final answer in [`seed_conversation`].
pub const ANSWER: &str =
    "Created `fib.py` with a generator and ran it.\n\nOutput: `[0, 1, 1, 2, 3, 5, 8, 13, 21, 34]`";

/// The seed's conversation: write `fib.py`, run it, answer [`ANSWER`]. `delay` holds back the
/// first tool call (so that a claim's expiry, whole seconds, visibly moves).
pub fn seed_conversation(delay: Duration) -> Vec<Reply> {
    vec![
        Reply::After(
            delay,
            Box::new(Reply::tool_use(
                "toolu_01",
                "write_file",
                json!({"path": "fib.py", "content": FIB}),
            )),
        ),
        Reply::tool_use(
            "toolu_02",
            "run_command",
            json!({"command": "python3 fib.py"}),
        ),
        Reply::text(ANSWER),
    ]
}

/// One scripted answer.
#[derive(Clone, Debug)]
pub enum Reply {
    /// A status, extra headers and a JSON body.
    Json(u16, Vec<(&'static str, String)>, Value),
    /// A `text/event-stream` body.
    Sse(String),
    /// Never answers (until the client gives up or the server is dropped).
    Hang,
    /// Answers after a delay.
    After(Duration, Box<Reply>),
}

impl Reply {
    /// A 200 message with these content blocks and stop reason.
    pub fn message(content: Value, stop_reason: &str) -> Self {
        Self::Json(
            200,
            vec![],
            json!({
                "id": "msg_fake", "type": "message", "role": "assistant",
                "model": "claude-sonnet-4-6", "content": content,
                "stop_reason": stop_reason, "stop_sequence": null,
                "usage": {"input_tokens": 100, "output_tokens": 20}
            }),
        )
    }

    /// A 200 message asking for one tool call.
    pub fn tool_use(id: &str, name: &str, input: Value) -> Self {
        Self::message(
            json!([{"type": "tool_use", "id": id, "name": name, "input": input}]),
            "tool_use",
        )
    }

    /// A 200 final answer.
    pub fn text(text: &str) -> Self {
        Self::message(json!([{"type": "text", "text": text}]), "end_turn")
    }

    /// An error in the API's format.
    pub fn error(status: u16, kind: &str, message: &str) -> Self {
        Self::Json(
            status,
            vec![("request-id", "req_fake".to_owned())],
            json!({"type": "error", "error": {"type": kind, "message": message}}),
        )
    }
}

/// A request the fake received.
#[derive(Clone, Debug)]
pub struct Recorded {
    /// Its headers.
    pub headers: HeaderMap,
    /// Its JSON body.
    pub body: Value,
}

#[derive(Debug, Default)]
struct Inner {
    script: VecDeque<Reply>,
    requests: Vec<Recorded>,
}

/// The running fake; dropping it stops the server.
#[derive(Debug)]
pub struct FakeApi {
    addr: SocketAddr,
    inner: Arc<Mutex<Inner>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeApi {
    /// Starts the fake with a script.
    ///
    /// # Errors
    /// When no port on 127.0.0.1 can be bound.
    pub async fn start(script: Vec<Reply>) -> std::io::Result<Self> {
        let inner = Arc::new(Mutex::new(Inner {
            script: script.into(),
            requests: Vec::new(),
        }));
        let app = axum::Router::new()
            .route("/v1/messages", post(handle))
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self { addr, inner, task })
    }

    /// The base URL to give the client (`ANTHROPIC_BASE_URL`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The requests received so far.
    pub fn requests(&self) -> Vec<Recorded> {
        lock(&self.inner).requests.clone()
    }

    /// Scripted replies not yet used.
    pub fn remaining(&self) -> usize {
        lock(&self.inner).script.len()
    }
}

async fn handle(
    State(inner): State<Arc<Mutex<Inner>>>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let reply = {
        let mut inner = lock(&inner);
        let body = serde_json::from_str(&body).unwrap_or(Value::String(body));
        inner.requests.push(Recorded { headers, body });
        inner.script.pop_front()
    };
    let mut reply =
        reply.unwrap_or_else(|| Reply::error(500, "api_error", "the script is exhausted"));
    while let Reply::After(delay, next) = reply {
        tokio::time::sleep(delay).await;
        reply = *next;
    }
    let built = match reply {
        Reply::Json(status, extra, body) => {
            let mut response = Response::builder()
                .status(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
                .header("content-type", "application/json");
            for (name, value) in extra {
                response = response.header(name, value);
            }
            response.body(Body::from(body.to_string()))
        }
        Reply::Sse(text) => Response::builder()
            .header("content-type", "text/event-stream")
            .body(Body::from(text)),
        Reply::Hang | Reply::After(..) => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok(Response::new(Body::empty()))
        }
    };
    built.unwrap_or_else(|error| {
        let mut response = Response::new(Body::from(format!("bad scripted reply: {error}")));
        *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
        response
    })
}

fn lock(inner: &Mutex<Inner>) -> std::sync::MutexGuard<'_, Inner> {
    inner.lock().unwrap_or_else(PoisonError::into_inner)
}
