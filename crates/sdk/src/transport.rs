//! HTTP to the router: one pooled HTTP/1.1 client per connection, the `X-Sandbox-*` headers,
//! per-attempt deadlines and the retry loop.
//!
//! Retry decisions are the pure [`classify`]; [`Transport::send`] applies them.

use std::time::Duration;

use agent_sandbox_api::wire::{self, headers};
use bytes::{Bytes, BytesMut};
use futures_util::TryStreamExt as _;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, Empty, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::io::AsyncRead;
use tokio::time::Instant;
use tokio_util::io::ReaderStream;

use crate::error::{Error, Result};
use crate::options::{RetryPolicy, SCOPED_TOKEN_TTL, SigningKey};
use crate::token::mint_token;

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// Request body type of every call.
pub(crate) type Body = UnsyncBoxBody<Bytes, BoxError>;

/// Longest error body kept in [`Error::Http`].
const MAX_ERROR_BODY: usize = 512;

/// How long establishing a TCP connection to the router may take: an address that drops
/// packets fails in seconds, not after the whole request deadline (per attempt).
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the requests of one sandbox go and how they are labelled.
#[derive(Clone, Debug)]
pub(crate) struct Target {
    /// Sandbox name (`X-Sandbox-ID`).
    pub(crate) sandbox: String,
    /// Namespace (`X-Sandbox-Namespace`).
    pub(crate) namespace: String,
}

/// A body that can be sent again on a retry, or only once.
pub(crate) enum Payload {
    /// No body.
    Empty,
    /// Bytes (cheap to clone): retryable.
    Bytes(Bytes, &'static str),
    /// A local file, reopened for each attempt: retryable.
    File(std::path::PathBuf),
    /// A reader: sent once, never retried.
    Once(Option<Body>),
}

impl Payload {
    fn retryable(&self) -> bool {
        !matches!(self, Self::Once(_))
    }

    async fn body(&mut self) -> Result<(Body, Option<&'static str>, Option<u64>)> {
        Ok(match self {
            Self::Empty => (
                Empty::new().map_err(|e| match e {}).boxed_unsync(),
                None,
                None,
            ),
            Self::Bytes(bytes, content_type) => {
                let len = bytes.len() as u64;
                (
                    Full::new(bytes.clone())
                        .map_err(|e| match e {})
                        .boxed_unsync(),
                    Some(*content_type),
                    Some(len),
                )
            }
            Self::File(path) => {
                let file =
                    tokio::fs::File::open(&*path)
                        .await
                        .map_err(|source| Error::LocalIo {
                            operation: "open",
                            path: path.display().to_string(),
                            source,
                        })?;
                let len = file.metadata().await.ok().map(|m| m.len());
                (reader_body(file), Some("application/octet-stream"), len)
            }
            Self::Once(body) => (
                body.take()
                    .unwrap_or_else(|| Empty::new().map_err(|e| match e {}).boxed_unsync()),
                Some("application/octet-stream"),
                None,
            ),
        })
    }
}

/// A streamed request body from a reader.
pub(crate) fn reader_body(reader: impl AsyncRead + Send + 'static) -> Body {
    let stream = ReaderStream::with_capacity(reader, 64 * 1024)
        .map_ok(Frame::data)
        .map_err(|e| Box::new(e) as BoxError);
    StreamBody::new(stream).boxed_unsync()
}

/// Pooled HTTP/1.1 client, plain or TLS.
#[derive(Clone, Debug)]
enum HttpClient {
    Plain(HyperClient<HttpConnector, Body>),
    Tls(HyperClient<HttpsConnector<HttpConnector>, Body>),
}

/// HTTP to one router base URL.
#[derive(Clone, Debug)]
pub(crate) struct Transport {
    base: String,
    client: HttpClient,
    auth: RouterAuth,
}

/// What a request carries in `Authorization`.
#[derive(Clone, Debug, Default)]
pub(crate) enum RouterAuth {
    /// Nothing (`--auth none` routers).
    #[default]
    None,
    /// One bearer token for every request.
    Bearer(String),
    /// A token minted per request for its own sandbox.
    Scoped(SigningKey),
}

impl RouterAuth {
    /// The `Authorization` value for a request to `target`.
    fn header(&self, target: &Target) -> Result<Option<String>> {
        match self {
            Self::None => Ok(None),
            Self::Bearer(token) => Ok(Some(format!("Bearer {token}"))),
            Self::Scoped(key) => {
                let token = mint_token(
                    key.as_bytes(),
                    &target.namespace,
                    &target.sandbox,
                    SCOPED_TOKEN_TTL,
                )?;
                Ok(Some(format!("Bearer {token}")))
            }
        }
    }
}

/// What to do after one attempt.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Done (success or a final error status).
    Final,
    /// Retry if attempts remain.
    Retry,
}

/// Whether a status (or, with `None`, a transport error) is worth another attempt: connection
/// failures and 500/502/503/504.
pub(crate) fn classify(status: Option<StatusCode>) -> Outcome {
    match status {
        None => Outcome::Retry,
        Some(s) if matches!(s.as_u16(), 500 | 502 | 503 | 504) => Outcome::Retry,
        Some(_) => Outcome::Final,
    }
}

/// One call.
pub(crate) struct Call {
    /// Operation name for errors (`read src/a.py`).
    pub(crate) operation: String,
    pub(crate) method: Method,
    /// Path and query, starting with `/`.
    pub(crate) path: String,
    pub(crate) payload: Payload,
    /// Deadline of each attempt (headers and, for collected bodies, the body) and the
    /// `X-Sandbox-Timeout` value.
    pub(crate) timeout: Duration,
    pub(crate) retry: RetryPolicy,
    /// Cap on an answer [`Transport::send_collect`] buffers.
    pub(crate) max_response_bytes: u64,
}

impl Transport {
    /// A transport to `base` (`http://host:port` or `https://...`).
    pub(crate) fn new(base: &str, auth: RouterAuth) -> Result<Self> {
        if let RouterAuth::Scoped(key) = &auth {
            agent_sandbox_api::token::signing_key(key.as_bytes()).map_err(|e| {
                Error::InvalidOption {
                    option: "router signing key",
                    message: e.to_string(),
                }
            })?;
        }
        let base = base.trim_end_matches('/').to_owned();
        let uri: http::Uri = base.parse().map_err(|e| Error::InvalidOption {
            option: "router URL",
            message: format!("{base:?} is not a URL: {e}"),
        })?;
        let builder = HyperClient::builder(TokioExecutor::new());
        let client = match uri.scheme_str() {
            Some("http") => {
                let mut connector = HttpConnector::new();
                connector.set_nodelay(true);
                connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
                HttpClient::Plain(builder.build(connector))
            }
            Some("https") => {
                let mut connector = HttpConnector::new();
                connector.set_nodelay(true);
                connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
                connector.enforce_http(false);
                let https = hyper_rustls::HttpsConnectorBuilder::new()
                    .with_provider_and_native_roots(rustls::crypto::aws_lc_rs::default_provider())
                    .map_err(|e| Error::InvalidOption {
                        option: "router URL",
                        message: format!("cannot load the system's TLS roots for {base}: {e}"),
                    })?
                    .https_only()
                    .enable_http1()
                    .wrap_connector(connector);
                HttpClient::Tls(builder.build(https))
            }
            _ => {
                return Err(Error::InvalidOption {
                    option: "router URL",
                    message: format!("{base:?} must start with http:// or https://"),
                });
            }
        };
        Ok(Self { base, client, auth })
    }

    /// The base URL.
    pub(crate) fn base(&self) -> &str {
        &self.base
    }

    async fn attempt(
        &self,
        target: &Target,
        call: &mut Call,
        deadline: Duration,
    ) -> Result<Response<Incoming>, AttemptError> {
        let (body, content_type, len) = call.payload.body().await.map_err(AttemptError::Fatal)?;
        let mut request = Request::builder()
            .method(call.method.clone())
            .uri(format!("{}{}", self.base, call.path));
        let request_headers = request.headers_mut().ok_or_else(|| {
            AttemptError::Fatal(Error::InvalidOption {
                option: "request",
                message: format!("{}{} is not a valid request URI", self.base, call.path),
            })
        })?;
        let value = |s: &str| {
            HeaderValue::from_str(s).map_err(|_| {
                AttemptError::Fatal(Error::InvalidOption {
                    option: "header",
                    message: format!("{s:?} is not a valid header value"),
                })
            })
        };
        request_headers.insert(headers::SANDBOX_ID, value(&target.sandbox)?);
        request_headers.insert(headers::SANDBOX_NAMESPACE, value(&target.namespace)?);
        request_headers.insert(headers::SANDBOX_PORT, HeaderValue::from(wire::RUNTIME_PORT));
        request_headers.insert(
            headers::SANDBOX_TIMEOUT,
            value(&headers::format_timeout(deadline))?,
        );
        request_headers.insert(
            headers::REQUEST_ID,
            value(&format!("{:016x}", fastrand::u64(..)))?,
        );
        if let Some(authorization) = self.auth.header(target).map_err(AttemptError::Fatal)? {
            request_headers.insert(http::header::AUTHORIZATION, value(&authorization)?);
        }
        if let Some(content_type) = content_type {
            request_headers.insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static(content_type),
            );
        }
        if let Some(len) = len {
            request_headers.insert(http::header::CONTENT_LENGTH, HeaderValue::from(len));
        }
        let request = request.body(body).map_err(|e| {
            AttemptError::Fatal(Error::InvalidOption {
                option: "request",
                message: e.to_string(),
            })
        })?;
        let sent = match &self.client {
            HttpClient::Plain(client) => client.request(request),
            HttpClient::Tls(client) => client.request(request),
        };
        match tokio::time::timeout(deadline, sent).await {
            Err(_) => Err(AttemptError::Timeout),
            Ok(Err(e)) => Err(AttemptError::Transport(Box::new(e))),
            Ok(Ok(response)) => Ok(response),
        }
    }

    /// Sends `call` for `target`, retrying per `call.retry` (only retryable payloads), and
    /// returns the successful (2xx) response with its body unread.
    pub(crate) async fn send(&self, target: &Target, mut call: Call) -> Result<Response<Incoming>> {
        let attempts = if call.payload.retryable() {
            call.retry.max_attempts.max(1)
        } else {
            1
        };
        let mut last = None;
        for attempt in 1..=attempts {
            let pause = call.retry.delay(attempt);
            if !pause.is_zero() {
                tokio::time::sleep(pause).await;
            }
            let deadline = call.timeout;
            let started = Instant::now();
            let (error, outcome) = match self.attempt(target, &mut call, deadline).await {
                Ok(response) if response.status().is_success() => return Ok(response),
                Ok(response) => {
                    let status = response.status();
                    let foreign = foreign_content_type(&response, false);
                    let remaining = deadline.saturating_sub(started.elapsed());
                    let body = error_body(response, remaining).await;
                    let error = match foreign {
                        // The router and the runtime answer errors in JSON; anything else
                        // came from something that is not them.
                        Some(content_type) => {
                            tracing::debug!(%status, %content_type, %body, "not a router's answer");
                            Error::NotARouter {
                                operation: call.operation.clone(),
                                sandbox: target.sandbox.clone(),
                                url: self.base.clone(),
                                status: status.as_u16(),
                                content_type,
                            }
                        }
                        None => Error::Http {
                            operation: call.operation.clone(),
                            sandbox: target.sandbox.clone(),
                            status: status.as_u16(),
                            body,
                        },
                    };
                    (error, classify(Some(status)))
                }
                Err(AttemptError::Fatal(error)) => return Err(error),
                Err(AttemptError::Timeout) => (
                    Error::Timeout {
                        operation: call.operation.clone(),
                        sandbox: target.sandbox.clone(),
                        after: deadline,
                    },
                    // A request that timed out may have reached the sandbox; file operations
                    // are idempotent, so retrying them is safe, and commands opt in.
                    Outcome::Retry,
                ),
                Err(AttemptError::Transport(source)) => self.failure(target, &call, source),
            };
            if outcome == Outcome::Final {
                return Err(error);
            }
            tracing::debug!(attempt, attempts, %error, "request failed");
            last = Some(error);
        }
        let last = last.unwrap_or_else(|| Error::Transport {
            operation: call.operation.clone(),
            sandbox: target.sandbox.clone(),
            message: "no attempt was made".to_owned(),
            source: None,
        });
        if attempts > 1 {
            Err(Error::RetriesExhausted {
                operation: call.operation,
                sandbox: target.sandbox.clone(),
                attempts,
                last: Box::new(last),
            })
        } else {
            Err(last)
        }
    }

    /// What a transport failure means: an unreachable router (retried), a failed TLS
    /// handshake (final: a plain-HTTP server or an untrusted certificate does not heal), or a
    /// connection that broke (retried).
    fn failure(&self, target: &Target, call: &Call, source: BoxError) -> (Error, Outcome) {
        let operation = call.operation.clone();
        let sandbox = target.sandbox.clone();
        let url = self.base.clone();
        match connect_failure(&*source) {
            Some(ConnectFailure::Tls(cause)) => (
                Error::RouterTls {
                    operation,
                    sandbox,
                    url,
                    cause,
                    source: Some(source),
                },
                Outcome::Final,
            ),
            Some(ConnectFailure::Unreachable(cause)) => (
                Error::RouterUnreachable {
                    operation,
                    sandbox,
                    url,
                    cause,
                    source: Some(source),
                },
                classify(None),
            ),
            None => (
                Error::Transport {
                    operation,
                    sandbox,
                    message: describe(&*source),
                    source: Some(source),
                },
                classify(None),
            ),
        }
    }

    /// `response` if its content type is JSON (or NDJSON, or absent), else
    /// [`Error::NotARouter`]: a page from something that is not the router.
    pub(crate) async fn json_answer(
        &self,
        target: &Target,
        operation: &str,
        response: Response<Incoming>,
    ) -> Result<Response<Incoming>> {
        let Some(content_type) = foreign_content_type(&response, true) else {
            return Ok(response);
        };
        let status = response.status().as_u16();
        let body = error_body(response, Duration::from_secs(5)).await;
        tracing::debug!(status, %content_type, %body, "not a router's answer");
        Err(Error::NotARouter {
            operation: operation.to_owned(),
            sandbox: target.sandbox.clone(),
            url: self.base.clone(),
            status,
            content_type,
        })
    }

    /// Like [`Transport::send`], then reads the whole body within the call's deadline, at most
    /// `call.max_response_bytes` of it (a larger answer, or one whose `Content-Length` claims
    /// more, is an error before it is buffered). With `json`, an answer whose content type is
    /// not JSON is [`Error::NotARouter`].
    pub(crate) async fn send_collect(
        &self,
        target: &Target,
        call: Call,
        json: bool,
    ) -> Result<Bytes> {
        let operation = call.operation.clone();
        let timeout = call.timeout;
        let limit = call.max_response_bytes;
        let mut response = self.send(target, call).await?;
        if json {
            response = self.json_answer(target, &operation, response).await?;
        }
        let too_large = || Error::ResponseTooLarge {
            operation: operation.clone(),
            sandbox: target.sandbox.clone(),
            limit,
        };
        let claimed = response
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if claimed.is_some_and(|length| length > limit) {
            return Err(too_large());
        }
        match tokio::time::timeout(timeout, collect_capped(response.into_body(), limit)).await {
            Err(_) => Err(Error::Timeout {
                operation,
                sandbox: target.sandbox.clone(),
                after: timeout,
            }),
            Ok(Err(Collect::TooLarge)) => Err(too_large()),
            Ok(Err(Collect::Broken(e))) => Err(Error::Transport {
                message: format!("reading the answer failed: {e}"),
                operation,
                sandbox: target.sandbox.clone(),
                source: Some(Box::new(e)),
            }),
            Ok(Ok(bytes)) => Ok(bytes),
        }
    }
}

enum Collect {
    TooLarge,
    Broken(hyper::Error),
}

/// The body, at most `limit` bytes of it. Grows with what actually arrives (never by what a
/// header claims).
async fn collect_capped(mut body: Incoming, limit: u64) -> Result<Bytes, Collect> {
    let mut collected = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(Collect::Broken)?;
        if let Ok(data) = frame.into_data() {
            let total =
                u64::try_from(collected.len().saturating_add(data.len())).unwrap_or(u64::MAX);
            if total > limit {
                return Err(Collect::TooLarge);
            }
            collected.extend_from_slice(&data);
        }
    }
    Ok(collected.freeze())
}

/// The content type of an answer that neither the router nor the runtime would send in its
/// place: present and not JSON (`None` for JSON, and for answers without one). With `files`,
/// `application/octet-stream` is theirs too (a file's contents, where a listing was asked for).
fn foreign_content_type(response: &Response<Incoming>, files: bool) -> Option<String> {
    let value = response.headers().get(http::header::CONTENT_TYPE)?;
    let text = String::from_utf8_lossy(value.as_bytes()).into_owned();
    let essence = text
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    let ours = essence == "application/json"
        || essence.ends_with("+json")
        || essence == agent_sandbox_api::runtime::v1::NDJSON_CONTENT_TYPE
        || (files && essence == "application/octet-stream");
    (!ours).then_some(text)
}

/// The first error of type `E` in `error`'s chain, looking inside `io::Error`s too (whose
/// `source()` skips the error they wrap).
fn find_in_chain<'a, E: std::error::Error + 'static>(
    error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a E> {
    let mut next = Some(error);
    let mut steps = 0;
    while let Some(current) = next {
        if let Some(found) = current.downcast_ref::<E>() {
            return Some(found);
        }
        // Chains are short; the bound only guards against a cycle.
        steps += 1;
        if steps > 32 {
            return None;
        }
        // An `io::Error` wrapping an error reports that error's source as its own: step into
        // the wrapped error itself instead, so nothing in between is skipped.
        let wrapped = current
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
            .map(|inner| inner as &(dyn std::error::Error + 'static));
        next = wrapped.or_else(|| current.source());
    }
    None
}

/// Why a connection to a server could not be made.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConnectFailure {
    /// No connection: refused, no route, no such host, or not within the connect timeout. The
    /// text says which, in a few words (`connection refused`).
    Unreachable(String),
    /// The TCP connection was made but the TLS handshake failed (the server speaks plain HTTP,
    /// or its certificate is not trusted); the text is the TLS error.
    Tls(String),
}

/// Classifies an HTTP client error (hyper-util's, as the SDK's router transport and kube's
/// client use) as a failure to connect, when it is one: the one classifier behind
/// [`Error::RouterUnreachable`] and [`Error::RouterTls`], for callers that report other
/// clients' errors (an API server's) the same way. `None` for every other error.
pub fn connect_failure(error: &(dyn std::error::Error + 'static)) -> Option<ConnectFailure> {
    if let Some(tls) = find_in_chain::<rustls::Error>(error) {
        return Some(ConnectFailure::Tls(tls.to_string()));
    }
    let connect = find_in_chain::<hyper_util::client::legacy::Error>(error)
        .is_some_and(hyper_util::client::legacy::Error::is_connect);
    if !connect {
        return None;
    }
    let cause = match find_in_chain::<std::io::Error>(error).map(std::io::Error::kind) {
        Some(std::io::ErrorKind::ConnectionRefused) => "connection refused".to_owned(),
        Some(std::io::ErrorKind::TimedOut) => {
            format!("no connection within {}s", CONNECT_TIMEOUT.as_secs())
        }
        Some(std::io::ErrorKind::HostUnreachable) => "host unreachable".to_owned(),
        Some(std::io::ErrorKind::NetworkUnreachable) => "network unreachable".to_owned(),
        _ => {
            let mut innermost = error;
            while let Some(inner) = innermost.source() {
                innermost = inner;
            }
            innermost.to_string()
        }
    };
    Some(ConnectFailure::Unreachable(cause))
}

enum AttemptError {
    Fatal(Error),
    Timeout,
    Transport(BoxError),
}

/// The first bytes of an error body, as text.
async fn error_body(response: Response<Incoming>, within: Duration) -> String {
    let mut body = response.into_body();
    let mut kept = Vec::new();
    let read = async {
        while let Some(Ok(frame)) = body.frame().await {
            if let Ok(data) = frame.into_data() {
                let room = MAX_ERROR_BODY.saturating_sub(kept.len());
                kept.extend_from_slice(&data[..data.len().min(room)]);
                if kept.len() >= MAX_ERROR_BODY {
                    break;
                }
            }
        }
    };
    let _ = tokio::time::timeout(within.min(Duration::from_secs(5)), read).await;
    String::from_utf8_lossy(&kept).trim().to_owned()
}

/// An error and its sources on one line.
pub(crate) fn describe(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_connection_errors_and_gateway_statuses_are_retried() {
        assert_eq!(classify(None), Outcome::Retry);
        for code in [500, 502, 503, 504] {
            assert_eq!(
                classify(Some(StatusCode::from_u16(code).unwrap_or_default())),
                Outcome::Retry
            );
        }
        for code in [400, 401, 403, 404, 409, 413, 422, 429, 501] {
            assert_eq!(
                classify(Some(StatusCode::from_u16(code).unwrap_or_default())),
                Outcome::Final
            );
        }
    }

    #[test]
    fn bad_urls_are_refused() {
        assert!(Transport::new("ftp://x", RouterAuth::None).is_err());
        assert!(Transport::new("not a url", RouterAuth::None).is_err());
        assert_eq!(
            Transport::new("http://127.0.0.1:8080/", RouterAuth::None)
                .map(|t| t.base().to_owned())
                .ok(),
            Some("http://127.0.0.1:8080".to_owned())
        );
    }

    #[test]
    fn a_signing_key_mints_a_token_for_each_requests_own_sandbox() {
        let key = SigningKey::new(vec![b'k'; 32]);
        let auth = RouterAuth::Scoped(key.clone());
        let now = jiff::Timestamp::now().as_second();
        for (namespace, sandbox) in [("team-a", "box-1"), ("team-b", "box-2")] {
            let target = Target {
                sandbox: sandbox.to_owned(),
                namespace: namespace.to_owned(),
            };
            let header = auth.header(&target).ok().flatten().unwrap_or_default();
            let token = header.strip_prefix("Bearer ").unwrap_or_default();
            let claims = agent_sandbox_api::token::verify(key.as_bytes(), token, now);
            assert_eq!(
                claims.map(|c| (c.namespace, c.name)).ok(),
                Some((namespace.to_owned(), sandbox.to_owned()))
            );
        }
        assert!(format!("{key:?}").contains("redacted"));
        assert!(!format!("{key:?}").contains("kkkk"));
    }

    #[test]
    fn a_short_signing_key_is_refused_when_connecting() {
        let short = RouterAuth::Scoped(SigningKey::new(b"short".to_vec()));
        let error = Transport::new("http://127.0.0.1:8080", short).err();
        assert!(
            matches!(error, Some(Error::InvalidOption { option, .. }) if option == "router signing key")
        );
    }
}
