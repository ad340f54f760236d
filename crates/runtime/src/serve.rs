//! Accepting and serving connections: the accept loop with the connection cap, and the three
//! limits on peers that stop sending, none of which an active request ever meets:
//!
//! - **header read**: from accepting a connection, or from the first byte of a later request
//!   on it, to the end of that request's head (a trickled head is cut too);
//! - **keep-alive idle**: from the end of a response to the first byte of the next request;
//! - **body idle**: while a handler waits for request body bytes that do not come.
//!
//! While a request is in flight (from its head until its response body is done) the
//! connection is not timed, so a long command or a slow download is never cut. The header
//! limit is enforced on the socket's reads ([`Watched`]), the keep-alive limit by a watchdog
//! beside the connection ([`idle_watchdog`]), the body limit on each request body
//! ([`IdleBody`]), which only runs while the body is read and has nothing, so a slow upload that
//! keeps sending is fine. hyper's own header timer is left off: it would also run between
//! requests.
//!
//! Cost on the hot path: none of these touches the timer for a request whose head and body
//! arrive with their first read; the end of a request is one clock read and two atomic stores,
//! and nothing is woken for it (the watchdog looks at the connection once per keep-alive
//! period and works out the deadline from when it went idle).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::Router;
use bytes::Bytes;
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
    let requests = Arc::new(InFlight::new());
    let io = hyper_util::rt::TokioIo::new(Watched::new(tcp, Arc::clone(&requests), limits));
    let watchdog = idle_watchdog(Arc::clone(&requests), limits.keepalive_idle);
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
        let mut watchdog = std::pin::pin!(watchdog);
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
                () = &mut watchdog => {
                    tracing::debug!(
                        limit = ?limits.keepalive_idle,
                        "closing an idle keep-alive connection (--keepalive-idle-timeout-seconds)"
                    );
                    break;
                }
                () = abort.cancelled() => break,
            }
        }
        // The connection (and its socket) is dropped here, before the slot is given back.
    }
    drop(slot);
}

/// What the timers of one connection need to know about it: requests in flight (from the call
/// of the service to the end of the response body) and since when it has been idle.
#[derive(Debug)]
struct InFlight {
    count: AtomicUsize,
    /// Milliseconds from `base` to the end of the last request, while the connection is idle;
    /// [`NOT_IDLE`] before the first request ends and once a later one has begun.
    idle_since: AtomicU64,
    base: Instant,
}

const NOT_IDLE: u64 = u64::MAX;

impl InFlight {
    fn new() -> Self {
        Self {
            count: AtomicUsize::new(0),
            idle_since: AtomicU64::new(NOT_IDLE),
            base: Instant::now(),
        }
    }

    fn busy(&self) -> bool {
        self.count.load(Ordering::Acquire) > 0
    }

    /// When the connection went idle, if it is idle.
    fn idle_since(&self) -> Option<Instant> {
        if self.busy() {
            return None;
        }
        match self.idle_since.load(Ordering::Acquire) {
            NOT_IDLE => None,
            millis => Some(self.base + Duration::from_millis(millis)),
        }
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
        let requests = &self.0;
        let millis = u64::try_from(requests.base.elapsed().as_millis()).unwrap_or(NOT_IDLE - 1);
        requests.idle_since.store(millis, Ordering::Release);
        requests.count.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Resolves once the connection has been idle (no request in flight, no byte of a new one) for
/// `limit`. It wakes once per `limit` at most and works out the deadline from when the
/// connection went idle, so a request costs it nothing.
async fn idle_watchdog(requests: Arc<InFlight>, limit: Duration) {
    let mut check = Instant::now() + limit;
    loop {
        tokio::time::sleep_until(check).await;
        let now = Instant::now();
        match requests.idle_since() {
            Some(since) if since + limit <= now => return,
            Some(since) => check = since + limit,
            // Busy, or reading a head (which the header limit bounds): look again later.
            None => check = now + limit,
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

/// Where a connection is, for the socket's timer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for the first byte of a request after a response (the watchdog's business).
    Idle,
    /// Reading a request head: the header limit.
    Head,
    /// A request is in flight: not timed.
    Busy,
}

/// The socket of one connection, with the header-read limit: a read of a request head that
/// waits past its deadline fails with `TimedOut`, which ends the connection. The deadline is
/// armed at the first read of a head that has to wait, so a head that arrives in one piece
/// never touches the timer.
struct Watched {
    tcp: TcpStream,
    requests: Arc<InFlight>,
    limits: Limits,
    phase: Phase,
    /// Whether `deadline` is set for the current head.
    armed: bool,
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
            armed: true,
            deadline: Box::pin(tokio::time::sleep(limits.header_read)),
        }
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
            return Pin::new(&mut this.tcp).poll_read(cx, buf);
        }
        if this.phase == Phase::Busy {
            // The last response is done: idle (the watchdog's business) until the next byte.
            this.phase = Phase::Idle;
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.tcp).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if this.phase == Phase::Idle && buf.filled().len() > before {
                    // The next request has begun: no longer idle, its head is due.
                    this.phase = Phase::Head;
                    this.armed = false;
                    this.requests.idle_since.store(NOT_IDLE, Ordering::Release);
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
            Poll::Pending if this.phase != Phase::Head => Poll::Pending,
            Poll::Pending => {
                if !this.armed {
                    this.deadline
                        .as_mut()
                        .reset(Instant::now() + this.limits.header_read);
                    this.armed = true;
                }
                ready!(this.deadline.as_mut().poll(cx));
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "request head not received within {:?} (--header-read-timeout-seconds)",
                        this.limits.header_read
                    ),
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
