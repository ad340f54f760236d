//! Accepting and serving connections: the accept loop with the connection cap, and the three
//! limits on peers that stop sending, none of which an active request ever meets:
//!
//! - **header read**: from accepting a connection, or from the first byte of a later request
//!   on it, to the end of that request's head (a trickled head is cut too);
//! - **keep-alive idle**: from the end of a response to the first byte of the next request;
//! - **body idle**: while a handler waits for request body bytes that do not come.
//!
//! The first two are enforced on the socket ([`Watched`]): while a request is in flight (from
//! its head until its response body is done) the socket is not timed, so a long command or a
//! slow download is never cut. The body limit wraps each request body ([`IdleBody`]) and only
//! runs while the body is polled and has nothing, so a slow upload that keeps sending is fine.
//! hyper's own header timer is left off: it would also run between requests.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::Router;
use bytes::Bytes;
use futures_util::task::AtomicWaker;
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The limits [`serve`] applies.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) header_read: Duration,
    pub(crate) body_idle: Duration,
    pub(crate) keepalive_idle: Duration,
    pub(crate) max_connections: usize,
}

/// Accepts and serves connections until `stop` is cancelled; then asks every connection to
/// finish its request and close, and returns when all have (or when `abort` is cancelled,
/// which drops those that remain).
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    stop: CancellationToken,
    abort: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let connections = TaskTracker::new();
    let mut full = false;
    loop {
        if slots.available_permits() == 0 && !full {
            tracing::warn!(
                limit = limits.max_connections,
                "connection limit reached (--max-connections); new connections wait"
            );
        }
        full = slots.available_permits() == 0;
        let slot = tokio::select! {
            slot = Arc::clone(&slots).acquire_owned() => slot,
            () = stop.cancelled() => break,
        };
        // The semaphore is never closed.
        let Ok(slot) = slot else { break };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stop.cancelled() => break,
        };
        let tcp = match accepted {
            Ok((tcp, _)) => tcp,
            Err(error) if is_connection_error(&error) => continue,
            Err(error) => {
                // Out of file descriptors or the like: give the process time to free some.
                tracing::error!(%error, "accepting a connection failed; retrying in 1 s");
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    () = stop.cancelled() => break,
                }
            }
        };
        // Small request/response pairs: do not wait to coalesce.
        let _ = tcp.set_nodelay(true);
        connections.spawn(connection(
            tcp,
            app.clone(),
            limits,
            stop.clone(),
            abort.clone(),
            slot,
        ));
    }
    drop(listener);
    connections.close();
    connections.wait().await;
}

fn is_connection_error(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// Serves one connection; its slot is given back once the socket is closed.
async fn connection(
    tcp: TcpStream,
    app: Router,
    limits: Limits,
    stop: CancellationToken,
    abort: CancellationToken,
    slot: tokio::sync::OwnedSemaphorePermit,
) {
    let requests = Arc::new(InFlight::default());
    let io = hyper_util::rt::TokioIo::new(Watched::new(tcp, Arc::clone(&requests), limits));
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        let started = Started::new(Arc::clone(&requests));
        let request = request.map(|body| IdleBody::new(body, limits.body_idle));
        let mut app = app.clone();
        async move {
            // The router is always ready and never fails.
            let response = tower_service::Service::call(&mut app, request)
                .await
                .unwrap_or_else(|never| match never {});
            Ok::<_, std::convert::Infallible>(response.map(|body| Tracked {
                body,
                _started: started,
            }))
        }
    });
    {
        let mut conn = std::pin::pin!(
            hyper::server::conn::http1::Builder::new()
                .keep_alive(true)
                .serve_connection(io, service)
        );
        let mut stopping = false;
        loop {
            tokio::select! {
                result = conn.as_mut() => {
                    if let Err(error) = result {
                        tracing::debug!(%error, "connection ended");
                    }
                    break;
                }
                () = stop.cancelled(), if !stopping => {
                    stopping = true;
                    conn.as_mut().graceful_shutdown();
                }
                () = abort.cancelled() => break,
            }
        }
        // The connection (and its socket) is dropped here, before the slot is given back.
    }
    drop(slot);
}

/// Requests in flight on one connection: from the call of the service to the end of the
/// response body. The last one to end wakes a read that waited while the connection was busy,
/// so that the socket's idle timer starts (nothing else would poll it again until the client
/// sends).
#[derive(Debug, Default)]
struct InFlight {
    count: AtomicUsize,
    reader: AtomicWaker,
}

impl InFlight {
    fn busy(&self) -> bool {
        self.count.load(Ordering::Acquire) > 0
    }
}

/// One request in flight; ends when dropped (with the response body, or with the request's
/// future if the client went away first).
#[derive(Debug)]
struct Started(Arc<InFlight>);

impl Started {
    fn new(requests: Arc<InFlight>) -> Self {
        requests.count.fetch_add(1, Ordering::AcqRel);
        Self(requests)
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.reader.wake();
        }
    }
}

/// A response body that marks its request as finished when hyper is done with it.
struct Tracked {
    body: axum::body::Body,
    _started: Started,
}

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Where a connection is between requests, for the socket's timer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for the first byte of a request after a response (keep-alive idle).
    Idle,
    /// Reading a request head (header read).
    Head,
    /// A request is in flight: not timed here.
    Busy,
}

/// The socket of one connection, with the header-read and keep-alive-idle limits: a read that
/// waits past the current deadline fails with `TimedOut`, which ends the connection.
struct Watched {
    tcp: TcpStream,
    requests: Arc<InFlight>,
    limits: Limits,
    phase: Phase,
    deadline: Pin<Box<Sleep>>,
}

impl Watched {
    fn new(tcp: TcpStream, requests: Arc<InFlight>, limits: Limits) -> Self {
        Self {
            tcp,
            requests,
            limits,
            // The first request's head is due within the header limit of accepting.
            phase: Phase::Head,
            deadline: Box::pin(tokio::time::sleep(limits.header_read)),
        }
    }

    fn enter(&mut self, phase: Phase, limit: Duration) {
        self.phase = phase;
        self.deadline.as_mut().reset(Instant::now() + limit);
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.requests.busy() {
            this.phase = Phase::Busy;
            this.requests.reader.register(cx.waker());
            // Registered before checking again: a request that ended meanwhile is seen.
            if this.requests.busy() {
                return Pin::new(&mut this.tcp).poll_read(cx, buf);
            }
        }
        if this.phase == Phase::Busy {
            // The last response is done: the connection is idle until the next request.
            this.enter(Phase::Idle, this.limits.keepalive_idle);
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.tcp).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if this.phase == Phase::Idle && buf.filled().len() > before {
                    this.enter(Phase::Head, this.limits.header_read);
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
            Poll::Pending => {
                ready!(this.deadline.as_mut().poll(cx));
                let (what, limit) = match this.phase {
                    Phase::Idle => (
                        "idle keep-alive connection (--keepalive-idle-timeout-seconds)",
                        this.limits.keepalive_idle,
                    ),
                    _ => (
                        "request head not received (--header-read-timeout-seconds)",
                        this.limits.header_read,
                    ),
                };
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("{what} within {limit:?}"),
                )))
            }
        }
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_shutdown(cx)
    }
}

/// A request body that fails when it has sent nothing for `limit` while being read. The timer
/// is made the first time the body has nothing ready, so a body that arrives with its head
/// costs nothing.
struct IdleBody {
    inner: Incoming,
    limit: Duration,
    /// Armed while the body has nothing ready; `None` until it first has nothing.
    timer: Option<Pin<Box<Sleep>>>,
    waiting: bool,
}

impl IdleBody {
    fn new(inner: Incoming, limit: Duration) -> Self {
        Self {
            inner,
            limit,
            timer: None,
            waiting: false,
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl HttpBody for IdleBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            this.waiting = false;
            return Poll::Ready(frame.map(|f| f.map_err(BoxError::from)));
        }
        // The clock is read only when the body starts waiting, not on every poll.
        let timer = match (&mut this.timer, this.waiting) {
            (Some(timer), true) => timer,
            (Some(timer), false) => {
                timer.as_mut().reset(Instant::now() + this.limit);
                timer
            }
            (None, _) => this.timer.insert(Box::pin(tokio::time::sleep(this.limit))),
        };
        this.waiting = true;
        ready!(timer.as_mut().poll(cx));
        Poll::Ready(Some(Err(Box::new(io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "the request body sent nothing for {:?} (--body-idle-timeout-seconds)",
                this.limit
            ),
        )))))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
