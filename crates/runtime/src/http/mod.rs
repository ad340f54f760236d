//! The HTTP surface: shared state, the router, error bodies and request-body limits. The
//! handlers are in [`legacy`] (upstream's endpoints, byte-compatible), [`v1`] (streaming exec
//! and background processes) and [`files`] (`/v1/files`); what more than one of them uses is
//! here, in [`exec`] (the one exec pipeline) and in [`transfer`] (uploads and file bodies).
//! The handler modules do not use each other.

mod exec;
mod files;
mod legacy;
mod transfer;
mod v1;

use std::sync::Arc;
use std::time::Instant;

use agent_sandbox_api::runtime::v1::paths as v1_paths;
use agent_sandbox_api::runtime::v1::{ErrorBody, ErrorCode, ExecEvent};
use agent_sandbox_api::runtime::{DetailResponse, MessageResponse, paths};
use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use bytes::Bytes;
use http_body_util::BodyExt as _;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Config;
use crate::exec::groups::Groups;
use crate::harden::Hardening;
use crate::paths::{FsErrorKind, PathError, Root};
use crate::processes::Table;

/// Everything the handlers share.
#[derive(Debug)]
pub(crate) struct AppState {
    pub(crate) config: Config,
    pub(crate) root: Arc<Root>,
    pub(crate) groups: Arc<Groups>,
    /// One permit per running process.
    pub(crate) permits: Arc<Semaphore>,
    pub(crate) processes: Table,
    /// Owns the drivers of streamed and background commands.
    pub(crate) tracker: TaskTracker,
    /// Cancelled when shutdown starts.
    pub(crate) shutdown: CancellationToken,
    pub(crate) hardening: Option<Hardening>,
    pub(crate) started: Instant,
}

pub(crate) type State = Arc<AppState>;

/// The routes, from the path constants of `agent_sandbox_api::runtime` (the ones the clients
/// use). A `{path}` endpoint also answers its bare prefix (`/list/` lists the base directory).
pub(crate) fn router(state: State) -> Router {
    let tail = |prefix: &str| format!("{prefix}{{*path}}");
    let process = |suffix: &str| format!("{}/{{id}}{suffix}", v1_paths::PROCESSES);
    Router::new()
        .route(paths::HEALTH, get(legacy::health))
        .route(paths::EXECUTE, post(legacy::execute))
        .route(paths::UPLOAD, post(legacy::upload))
        .route(paths::DOWNLOAD, get(legacy::download))
        .route(&tail(paths::DOWNLOAD), get(legacy::download))
        .route(paths::LIST, get(legacy::list))
        .route(&tail(paths::LIST), get(legacy::list))
        .route(paths::EXISTS, get(legacy::exists))
        .route(&tail(paths::EXISTS), get(legacy::exists))
        .route(v1_paths::HEALTH, get(v1::health))
        .route(v1_paths::EXEC, post(v1::exec))
        .route(v1_paths::PROCESSES, post(v1::start).get(v1::list))
        .route(&process(""), get(v1::get).delete(v1::delete))
        .route(&process(v1_paths::PROCESS_OUTPUT), get(v1::output))
        .route(&process(v1_paths::PROCESS_STDIN), post(v1::stdin))
        .route(&process(v1_paths::PROCESS_SIGNAL), post(v1::signal))
        .route(v1_paths::FILES.trim_end_matches('/'), any(files::files))
        .route(v1_paths::FILES, any(files::files))
        .route(&tail(v1_paths::FILES), any(files::files))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        // Bodies are limited by the handlers themselves (413 in the endpoint's error shape);
        // axum's default 2 MB cap would cut uploads off.
        .layer(axum::extract::DefaultBodyLimit::disable())
        .with_state(state)
}

/// Unknown paths: FastAPI's `{"detail": "Not Found"}` outside `/v1`, our error shape inside.
async fn not_found(uri: Uri) -> Response {
    if uri.path().starts_with(v1_paths::PREFIX) {
        ApiError::v1(
            ErrorCode::NotFound,
            format!("no endpoint at {}", uri.path()),
        )
        .into_response()
    } else {
        (
            StatusCode::NOT_FOUND,
            axum::Json(DetailResponse::new("Not Found")),
        )
            .into_response()
    }
}

async fn method_not_allowed(uri: Uri) -> Response {
    if uri.path().starts_with(v1_paths::PREFIX) {
        ApiError::v1(
            ErrorCode::MethodNotAllowed,
            format!("method not allowed on {}", uri.path()),
        )
        .into_response()
    } else {
        (
            StatusCode::METHOD_NOT_ALLOWED,
            axum::Json(DetailResponse::new("Method Not Allowed")),
        )
            .into_response()
    }
}

/// Which error shape an endpoint speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flavor {
    /// `{"message": "..."}` (upstream's python runtime).
    Legacy,
    /// `{"code": "...", "message": "..."}`.
    V1,
}

/// An error answer; always JSON.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    code: ErrorCode,
    message: String,
    flavor: Flavor,
}

pub(crate) fn status_of(code: ErrorCode) -> StatusCode {
    match code {
        ErrorCode::InvalidArgument => StatusCode::BAD_REQUEST,
        ErrorCode::PermissionDenied => StatusCode::FORBIDDEN,
        ErrorCode::NotFound => StatusCode::NOT_FOUND,
        ErrorCode::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
        ErrorCode::Conflict => StatusCode::CONFLICT,
        ErrorCode::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        ErrorCode::SpawnFailed => StatusCode::UNPROCESSABLE_ENTITY,
        ErrorCode::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        ErrorCode::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        ErrorCode::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
    }
}

impl ApiError {
    pub(crate) fn v1(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            status: status_of(code),
            code,
            message: message.into(),
            flavor: Flavor::V1,
        }
    }

    pub(crate) fn legacy(status: StatusCode, message: impl Into<String>) -> Self {
        let code = match status {
            StatusCode::FORBIDDEN => ErrorCode::PermissionDenied,
            StatusCode::NOT_FOUND => ErrorCode::NotFound,
            StatusCode::PAYLOAD_TOO_LARGE => ErrorCode::PayloadTooLarge,
            StatusCode::TOO_MANY_REQUESTS => ErrorCode::ResourceExhausted,
            StatusCode::SERVICE_UNAVAILABLE => ErrorCode::Unavailable,
            StatusCode::BAD_REQUEST => ErrorCode::InvalidArgument,
            _ => ErrorCode::Internal,
        };
        Self {
            status,
            code,
            message: message.into(),
            flavor: Flavor::Legacy,
        }
    }

    pub(crate) fn new(flavor: Flavor, code: ErrorCode, message: impl Into<String>) -> Self {
        match flavor {
            Flavor::V1 => Self::v1(code, message),
            Flavor::Legacy => Self::legacy(status_of(code), message),
        }
    }

    /// 429 when every process slot is taken.
    pub(crate) fn busy(flavor: Flavor, limit: usize) -> Self {
        Self::new(
            flavor,
            ErrorCode::ResourceExhausted,
            format!("too many processes are running (limit {limit}); retry later"),
        )
    }

    pub(crate) fn shutting_down(flavor: Flavor) -> Self {
        Self::new(
            flavor,
            ErrorCode::Unavailable,
            "the runtime is shutting down",
        )
    }

    /// Client path `what`, refused before touching the filesystem. The legacy endpoints keep
    /// upstream's 403 `Access denied` for traversal.
    pub(crate) fn path(flavor: Flavor, error: PathError, what: &str) -> Self {
        let message = format!("path '{}' {error}", shown(what));
        match (flavor, error) {
            (Flavor::Legacy, PathError::Nul | PathError::Escapes) => Self::legacy(
                StatusCode::FORBIDDEN,
                agent_sandbox_api::runtime::ACCESS_DENIED,
            ),
            (_, PathError::Escapes) => Self::v1(ErrorCode::PermissionDenied, message),
            (_, PathError::Nul | PathError::TooLong | PathError::Base) => {
                Self::new(flavor, ErrorCode::InvalidArgument, message)
            }
        }
    }

    /// A filesystem error on `what` (a client path), as `/v1` reports it.
    pub(crate) fn fs_v1(error: &std::io::Error, what: &str) -> Self {
        let (code, text) = fs_meaning(error);
        Self::v1(code, format!("path '{}' {text}", shown(what)))
    }
}

/// The code a filesystem error on a client path answers (both flavours), so that what the
/// client got wrong is a 4xx and only the runtime's own failures are a 500.
pub(crate) fn fs_code(error: &std::io::Error) -> ErrorCode {
    fs_meaning(error).0
}

/// What a filesystem error on a client path means: its code and the words after `path '...'`.
fn fs_meaning(error: &std::io::Error) -> (ErrorCode, String) {
    match crate::paths::classify(error) {
        FsErrorKind::Escapes => (
            ErrorCode::PermissionDenied,
            "leads outside the base directory".to_owned(),
        ),
        FsErrorKind::Loop => (
            ErrorCode::InvalidArgument,
            "has too many levels of symbolic links".to_owned(),
        ),
        FsErrorKind::NameTooLong => (
            ErrorCode::InvalidArgument,
            crate::paths::PathError::TooLong.to_string(),
        ),
        FsErrorKind::NotFound | FsErrorKind::NotADirectory => {
            (ErrorCode::NotFound, "does not exist".to_owned())
        }
        FsErrorKind::IsADirectory => (ErrorCode::Conflict, "is a directory".to_owned()),
        FsErrorKind::NotEmpty => (
            ErrorCode::Conflict,
            "is a non-empty directory (use recursive=true)".to_owned(),
        ),
        FsErrorKind::AlreadyExists => (
            ErrorCode::Conflict,
            "already exists and is not a directory".to_owned(),
        ),
        FsErrorKind::PermissionDenied => (
            ErrorCode::PermissionDenied,
            format!("is not accessible: {error}"),
        ),
        FsErrorKind::Other => (ErrorCode::Internal, format!("failed: {error}")),
    }
}

/// A client path as error messages show it: cut after 256 characters, so that a hostile
/// megabyte-long path is not echoed back whole.
pub(crate) fn shown(path: &str) -> std::borrow::Cow<'_, str> {
    const SHOWN: usize = 256;
    match path.char_indices().nth(SHOWN) {
        None => std::borrow::Cow::Borrowed(path),
        Some((cut, _)) => std::borrow::Cow::Owned(format!("{}...", &path[..cut])),
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = match self.flavor {
            Flavor::Legacy => {
                (self.status, axum::Json(MessageResponse::new(self.message))).into_response()
            }
            Flavor::V1 => (
                self.status,
                axum::Json(ErrorBody::new(self.code, self.message)),
            )
                .into_response(),
        };
        if self.status == StatusCode::TOO_MANY_REQUESTS
            || self.status == StatusCode::SERVICE_UNAVAILABLE
        {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

/// Why a body could not be read.
#[derive(Debug)]
pub(crate) enum BodyError {
    TooLarge(u64),
    Read(String),
}

impl BodyError {
    pub(crate) fn into_api(self, flavor: Flavor) -> ApiError {
        match self {
            Self::TooLarge(limit) => ApiError::new(
                flavor,
                ErrorCode::PayloadTooLarge,
                format!("the request body is larger than {limit} bytes"),
            ),
            Self::Read(e) => ApiError::new(
                flavor,
                ErrorCode::InvalidArgument,
                format!("failed to read the request body: {e}"),
            ),
        }
    }
}

/// The declared `Content-Length`, if any.
pub(crate) fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

/// Reads a whole body of at most `limit` bytes. A body that arrives in one frame is returned
/// as it is; a longer one is gathered into one buffer sized from `Content-Length`, so that the
/// body takes its size in memory once (not once per frame and once more joined).
pub(crate) async fn read_body(
    headers: &HeaderMap,
    body: Body,
    limit: u64,
) -> Result<Bytes, BodyError> {
    let declared = content_length(headers);
    if declared.is_some_and(|len| len > limit) {
        return Err(BodyError::TooLarge(limit));
    }
    let mut body = body;
    let mut first: Option<Bytes> = None;
    let mut joined: Option<bytes::BytesMut> = None;
    let mut total: u64 = 0;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| BodyError::Read(e.to_string()))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        total += data.len() as u64;
        if total > limit {
            return Err(BodyError::TooLarge(limit));
        }
        match (&mut joined, first.take()) {
            (Some(buffer), _) => buffer.extend_from_slice(&data),
            (None, None) => first = Some(data),
            (None, Some(head)) => {
                let expected = declared.unwrap_or(total).clamp(total, limit);
                let mut buffer =
                    bytes::BytesMut::with_capacity(usize::try_from(expected).unwrap_or(0));
                buffer.extend_from_slice(&head);
                buffer.extend_from_slice(&data);
                joined = Some(buffer);
            }
        }
    }
    Ok(joined
        .map(bytes::BytesMut::freeze)
        .or(first)
        .unwrap_or_default())
}

/// A JSON response.
pub(crate) fn json<T: serde::Serialize>(status: StatusCode, value: &T) -> Response {
    (status, axum::Json(value)).into_response()
}

/// One NDJSON line.
pub(crate) fn ndjson_line(event: &ExecEvent) -> Bytes {
    let mut line = serde_json::to_vec(event).unwrap_or_else(|_| b"{}".to_vec());
    line.push(b'\n');
    Bytes::from(line)
}

/// A streamed NDJSON response.
pub(crate) fn ndjson_response(body: Body) -> Response {
    let mut response = Response::new(body);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(agent_sandbox_api::runtime::v1::NDJSON_CONTENT_TYPE),
    );
    response
}

/// The part of the request path after `prefix` (raw, still percent-encoded).
pub(crate) fn tail<'a>(uri: &'a Uri, prefix: &str) -> &'a str {
    uri.path().strip_prefix(prefix).unwrap_or("")
}

/// Percent-decodes a path (lossy, as Python's `unquote`).
pub(crate) fn decode_lossy(raw: &str) -> String {
    percent_encoding::percent_decode_str(raw)
        .decode_utf8_lossy()
        .into_owned()
}
