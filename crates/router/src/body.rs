//! Bodies that stream through the router frame by frame, never collected:
//!
//! - [`RequestBody`]: the client's body on its way to the sandbox, cut off with an error once
//!   it exceeds the size limit, with flags that tell the proxy why a send failed;
//! - [`ResponseBody`]: what the client receives (the sandbox's body, or a JSON refusal), which
//!   enforces the request's deadline while streaming and, when dropped, records the request's
//!   metrics and access-log line through its [`Finish`] guard.

use std::future::Future as _;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::time::Sleep;

use crate::metrics::Metrics;
use crate::reject::Reason;

/// Boxed error of the bodies.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The request body exceeded the router's limit.
#[derive(Debug, thiserror::Error)]
#[error("request body exceeds the limit of {limit} bytes")]
pub(crate) struct BodyTooLarge {
    limit: u64,
}

/// The request's deadline passed while the response was streaming.
#[derive(Debug, thiserror::Error)]
#[error("request deadline passed while streaming the response")]
pub(crate) struct DeadlinePassed;

/// What happened to a request body on its way out, read by the proxy after a failed send.
#[derive(Debug, Default)]
pub(crate) struct RequestFlags {
    too_large: AtomicBool,
    client_failed: AtomicBool,
    started: AtomicBool,
}

impl RequestFlags {
    /// The body went over the limit.
    pub(crate) fn too_large(&self) -> bool {
        self.too_large.load(Ordering::Relaxed)
    }

    /// Reading the client's body failed (the client went away mid-upload).
    pub(crate) fn client_failed(&self) -> bool {
        self.client_failed.load(Ordering::Relaxed)
    }

    /// At least one frame was read (and so possibly sent).
    pub(crate) fn started(&self) -> bool {
        self.started.load(Ordering::Relaxed)
    }
}

/// The client's body, limited to `limit` bytes.
#[derive(Debug)]
pub(crate) struct RequestBody {
    inner: Incoming,
    remaining: u64,
    limit: u64,
    flags: Arc<RequestFlags>,
}

impl RequestBody {
    pub(crate) fn new(inner: Incoming, limit: u64) -> (Self, Arc<RequestFlags>) {
        let flags = Arc::new(RequestFlags::default());
        (
            Self {
                inner,
                remaining: limit,
                limit,
                flags: Arc::clone(&flags),
            },
            flags,
        )
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Ready(Some(Err(error))) => {
                this.flags.client_failed.store(true, Ordering::Relaxed);
                Poll::Ready(Some(Err(error.into())))
            }
            Poll::Ready(Some(Ok(frame))) => {
                this.flags.started.store(true, Ordering::Relaxed);
                if let Some(data) = frame.data_ref() {
                    let len = data.len() as u64;
                    if len > this.remaining {
                        this.flags.too_large.store(true, Ordering::Relaxed);
                        return Poll::Ready(Some(Err(BodyTooLarge { limit: this.limit }.into())));
                    }
                    this.remaining -= len;
                }
                Poll::Ready(Some(Ok(frame)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// How a request ended, for the access log and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The whole response was sent.
    Complete,
    /// The client stopped reading before the end (or the response was never sent).
    Aborted,
    /// The deadline passed while the response streamed.
    DeadlinePassed,
    /// The sandbox's body failed mid-stream.
    UpstreamFailed,
    /// The connection was switched to another protocol and handed to a tunnel.
    Upgraded,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Self::Complete => "complete",
            Self::Aborted => "aborted",
            Self::DeadlinePassed => "deadline",
            Self::UpstreamFailed => "upstream_failed",
            Self::Upgraded => "upgraded",
        }
    }
}

/// Records one request when dropped: the in-flight gauge, the request counter and histogram,
/// and (if enabled) one access-log line.
#[derive(Debug)]
pub(crate) struct Finish {
    metrics: Arc<Metrics>,
    method: http::Method,
    path: String,
    peer: std::net::SocketAddr,
    request_id: Option<String>,
    start: Instant,
    access_log: bool,
    pub(crate) sandbox: Option<String>,
    pub(crate) status: u16,
    /// Why the router answered itself, if it did.
    pub(crate) reason: Option<Reason>,
    pub(crate) outcome: Outcome,
    pub(crate) bytes_out: u64,
    /// The sandbox's activity, while the response lasts.
    pub(crate) active: Option<crate::activity::Active>,
}

impl Finish {
    pub(crate) fn new(
        metrics: Arc<Metrics>,
        parts: &http::request::Parts,
        peer: std::net::SocketAddr,
        access_log: bool,
    ) -> Self {
        metrics.request_started();
        Self {
            metrics,
            method: parts.method.clone(),
            path: parts.uri.path().to_owned(),
            peer,
            request_id: parts
                .headers
                .get(agent_sandbox_api::wire::headers::REQUEST_ID)
                .and_then(|v| v.to_str().ok())
                .map(ToOwned::to_owned),
            start: Instant::now(),
            access_log,
            sandbox: None,
            status: 0,
            reason: None,
            outcome: Outcome::Aborted,
            bytes_out: 0,
            active: None,
        }
    }
}

impl Drop for Finish {
    fn drop(&mut self) {
        let elapsed = self.start.elapsed();
        self.metrics
            .request_finished(&self.method, self.status, elapsed.as_secs_f64());
        if self.access_log {
            tracing::info!(
                target: "sandbox_router::access",
                method = %self.method,
                path = %self.path,
                sandbox = self.sandbox.as_deref().unwrap_or("-"),
                status = self.status,
                reason = self.reason.map_or("", Reason::as_str),
                outcome = self.outcome.as_str(),
                bytes_out = self.bytes_out,
                duration_ms = elapsed.as_secs_f64() * 1e3,
                peer = %self.peer,
                request_id = self.request_id.as_deref().unwrap_or("-"),
                "request"
            );
        }
    }
}

#[derive(Debug)]
enum Inner {
    Full(Option<Bytes>),
    Upstream(Incoming),
}

/// The body sent to the client.
#[derive(Debug)]
pub(crate) struct ResponseBody {
    inner: Inner,
    deadline: Option<Pin<Box<Sleep>>>,
    finish: Option<Finish>,
}

impl ResponseBody {
    /// A complete body (a refusal, a probe answer).
    pub(crate) fn full(bytes: Bytes) -> Self {
        Self {
            inner: Inner::Full(Some(bytes)).normalize(),
            deadline: None,
            finish: None,
        }
    }

    /// The sandbox's body, cut off at `deadline`.
    pub(crate) fn upstream(body: Incoming, deadline: Option<tokio::time::Instant>) -> Self {
        Self {
            inner: Inner::Upstream(body),
            deadline: deadline.map(|at| Box::pin(tokio::time::sleep_until(at))),
            finish: None,
        }
    }

    /// Attaches the request's [`Finish`] guard, which is recorded when the body ends or drops.
    pub(crate) fn finish_with(&mut self, finish: Finish) {
        self.finish = Some(finish);
    }

    fn record(&mut self, outcome: Outcome) {
        if let Some(finish) = &mut self.finish
            && finish.outcome == Outcome::Aborted
        {
            finish.outcome = outcome;
            if outcome == Outcome::DeadlinePassed {
                finish.metrics.upstream_error(Reason::Timeout);
            } else if outcome == Outcome::UpstreamFailed {
                finish.metrics.upstream_error(Reason::Upstream);
            }
        }
    }
}

impl Inner {
    fn normalize(self) -> Self {
        match self {
            Self::Full(Some(bytes)) if bytes.is_empty() => Self::Full(None),
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Full(bytes) => bytes.is_none(),
            Self::Upstream(body) => body.is_end_stream(),
        }
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if let Some(deadline) = &mut this.deadline
            && deadline.as_mut().poll(cx).is_ready()
        {
            this.deadline = None;
            this.inner = Inner::Full(None);
            this.record(Outcome::DeadlinePassed);
            return Poll::Ready(Some(Err(DeadlinePassed.into())));
        }
        let polled = match &mut this.inner {
            Inner::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            Inner::Upstream(body) => Pin::new(body)
                .poll_frame(cx)
                .map(|frame| frame.map(|result| result.map_err(BoxError::from))),
        };
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(data), Some(finish)) = (frame.data_ref(), &mut this.finish) {
                    finish.bytes_out += data.len() as u64;
                }
            }
            Poll::Ready(Some(Err(_))) => this.record(Outcome::UpstreamFailed),
            Poll::Ready(None) => this.record(Outcome::Complete),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Full(bytes) => {
                SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64))
            }
            Inner::Upstream(body) => body.size_hint(),
        }
    }
}

impl Drop for ResponseBody {
    fn drop(&mut self) {
        // Bodies the server never polls (HEAD, 204, 304, empty) still ended normally.
        if self.inner.is_end_stream() {
            self.record(Outcome::Complete);
        }
    }
}
