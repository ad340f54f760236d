//! `/v1/files/{path}`: `GET` (file bytes streamed, or a JSON listing for a directory), `HEAD`
//! (exists), `PUT` (streamed atomic write; raw body or a multipart `file` part), `DELETE`
//! (`recursive=true` for non-empty directories) and `POST ?op=mkdir`. Paths are
//! percent-decoded once and confined by [`crate::paths`]; absolute paths outside the base
//! directory are refused.

use std::sync::Arc;

use agent_sandbox_api::runtime::v1::{
    DirectoryListing, ErrorCode, FILES_OP_MKDIR, FilesQuery, paths,
};
use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, Request, State as Extract};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::transfer::{UploadOutcome, file_response, upload_part};
use super::{ApiError, Flavor, State, json, shown, tail};
use crate::files::{self, Chunks, Kind, WriteError, blocking};
use crate::paths::{Absolute, Beneath, Relative};

type Result<T, E = ApiError> = std::result::Result<T, E>;

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::v1(ErrorCode::InvalidArgument, message)
}

pub(crate) async fn files(
    Extract(state): Extract<State>,
    query: std::result::Result<Query<FilesQuery>, QueryRejection>,
    request: Request,
) -> Response {
    match handle(state, query, request).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

async fn handle(
    state: State,
    query: std::result::Result<Query<FilesQuery>, QueryRejection>,
    request: Request,
) -> Result<Response> {
    let Query(query) = query.map_err(|e| invalid(e.body_text()))?;
    let uri = request.uri().clone();
    // `/v1/files` alone (no slash) names the base directory.
    let raw = tail(&uri, paths::FILES);
    let path = percent_encoding::percent_decode_str(raw)
        .decode_utf8()
        .map_err(|_| invalid("the path is not valid UTF-8 after percent-decoding"))?
        .into_owned();
    let rel = state
        .root
        .relative(&path, Absolute::Refuse)
        .map_err(|e| ApiError::path(Flavor::V1, e, &path))?;
    // Every mutating method needs a path beneath the base directory, never the base itself.
    let beneath =
        |rel: Relative| Beneath::new(rel).map_err(|e| ApiError::path(Flavor::V1, e, &path));
    let method = request.method().clone();
    match method {
        Method::GET => get(&state, path, rel).await,
        Method::HEAD => head(&state, &path, rel).await,
        Method::PUT => put(&state, &path, beneath(rel)?, &query, request).await,
        Method::DELETE => delete(&state, &path, beneath(rel)?, &query).await,
        Method::POST => post(&state, &path, rel, &query).await,
        other => Err(ApiError::v1(
            ErrorCode::MethodNotAllowed,
            format!("{other} is not supported on /v1/files"),
        )),
    }
}

/// What `GET` and `HEAD` serve at `rel`: one classification, so that they always agree.
async fn target(state: &State, path: &str, rel: &Relative) -> Result<Kind> {
    let root = Arc::clone(&state.root);
    let rel = rel.clone();
    match blocking(move || files::kind(&root, &rel))
        .await
        .map_err(|e| ApiError::fs_v1(&e, path))?
    {
        Kind::Other => Err(ApiError::v1(
            ErrorCode::Conflict,
            format!("path '{}' is neither a file nor a directory", shown(path)),
        )),
        kind => Ok(kind),
    }
}

async fn get(state: &State, path: String, rel: Relative) -> Result<Response> {
    let kind = target(state, &path, &rel).await?;
    let root = Arc::clone(&state.root);
    if kind == Kind::Directory {
        let entries = blocking(move || files::list_v1(&root, &rel))
            .await
            .map_err(|e| ApiError::fs_v1(&e, &path))?;
        let shown = if path.is_empty() {
            ".".to_owned()
        } else {
            path
        };
        return Ok(json(
            StatusCode::OK,
            &DirectoryListing {
                path: shown,
                entries,
            },
        ));
    }
    let (file, size) = blocking(move || files::open_read(&root, &rel))
        .await
        .map_err(|e| ApiError::fs_v1(&e, &path))?;
    Ok(file_response(file, size, "application/octet-stream"))
}

async fn head(state: &State, path: &str, rel: Relative) -> Result<Response> {
    let kind = target(state, path, &rel).await?;
    let mut response = StatusCode::OK.into_response();
    let headers = response.headers_mut();
    match kind {
        Kind::File { size } => {
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(size));
        }
        Kind::Directory | Kind::Other => {
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
        }
    }
    Ok(response)
}

/// A raw request body as a chunk source.
struct BodyChunks(http_body_util::BodyDataStream<Body>);

impl Chunks for BodyChunks {
    async fn next_chunk(&mut self) -> std::result::Result<Option<bytes::Bytes>, String> {
        use futures_util::StreamExt as _;
        match self.0.next().await {
            None => Ok(None),
            Some(Ok(chunk)) => Ok(Some(chunk)),
            Some(Err(error)) => Err(error.to_string()),
        }
    }
}

fn write_error(error: WriteError, path: &str, limit: u64) -> ApiError {
    match error {
        WriteError::TooLarge { .. } => ApiError::v1(
            ErrorCode::PayloadTooLarge,
            format!("the file is larger than {limit} bytes"),
        ),
        WriteError::Body(text) => invalid(format!("reading the request body failed: {text}")),
        WriteError::Fs(error) => ApiError::fs_v1(&error, path),
    }
}

async fn put(
    state: &State,
    path: &str,
    rel: Beneath,
    query: &FilesQuery,
    request: Request,
) -> Result<Response> {
    let mode = match &query.mode {
        None => None,
        Some(text) => Some(
            files::parse_mode(text)
                .ok_or_else(|| invalid(format!("mode '{text}' is not octal permission bits")))?,
        ),
    };
    let limit = state.config.max_upload_bytes;
    if super::content_length(request.headers()).is_some_and(|len| len > limit) {
        return Err(write_error(WriteError::TooLarge { limit }, path, limit));
    }
    let multipart = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("multipart/form-data"));
    if multipart {
        return match upload_part(state, request, Some(rel), mode).await {
            UploadOutcome::Written { .. } => Ok(StatusCode::NO_CONTENT.into_response()),
            UploadOutcome::MissingFile | UploadOutcome::NotAFile => Err(invalid(
                "the multipart body has no `file` part with a filename",
            )),
            UploadOutcome::Refused { error, .. } => Err(ApiError::path(Flavor::V1, error, path)),
            UploadOutcome::Failed(error) => Err(write_error(error, path, limit)),
        };
    }
    let mut chunks = BodyChunks(http_body_util::BodyDataStream::new(request.into_body()));
    files::write_atomic(Arc::clone(&state.root), rel, mode, limit, &mut chunks)
        .await
        .map_err(|e| write_error(e, path, limit))?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn delete(state: &State, path: &str, rel: Beneath, query: &FilesQuery) -> Result<Response> {
    let recursive = query.recursive == Some(true);
    let root = Arc::clone(&state.root);
    blocking(move || files::delete(&root, &rel, recursive))
        .await
        .map_err(|e| ApiError::fs_v1(&e, path))?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn post(state: &State, path: &str, rel: Relative, query: &FilesQuery) -> Result<Response> {
    if query.op.as_deref() != Some(FILES_OP_MKDIR) {
        return Err(invalid(format!(
            "POST /v1/files needs ?op={FILES_OP_MKDIR}"
        )));
    }
    let rel = Beneath::new(rel).map_err(|e| ApiError::path(Flavor::V1, e, path))?;
    let mode = match &query.mode {
        None => None,
        Some(text) => Some(
            files::parse_mode(text)
                .ok_or_else(|| invalid(format!("mode '{text}' is not octal permission bits")))?,
        ),
    };
    let root = Arc::clone(&state.root);
    let created = blocking(move || files::mkdir(&root, &rel, mode))
        .await
        .map_err(|e| ApiError::fs_v1(&e, path))?;
    Ok(if created {
        StatusCode::CREATED.into_response()
    } else {
        StatusCode::OK.into_response()
    })
}
