//! Moving file bodies, shared by the legacy endpoints and `/v1/files`: the multipart upload
//! of one part to a confined path (`POST /upload`, multipart `PUT /v1/files/{path}`) and the
//! streamed body of a download.

use axum::body::Body;
use axum::extract::{FromRequest, Multipart, Request};
use axum::http::{HeaderValue, header};
use axum::response::Response;

use agent_sandbox_api::runtime::UPLOAD_PART;

use super::State;
use crate::files::{self, WriteError};
use crate::paths::{Absolute, Beneath, PathError};

/// A multipart field as a chunk source.
struct FieldChunks<'a>(axum::extract::multipart::Field<'a>);

impl files::Chunks for FieldChunks<'_> {
    async fn next_chunk(&mut self) -> Result<Option<bytes::Bytes>, String> {
        self.0.chunk().await.map_err(|e| e.body_text())
    }
}

/// How writing the part named `file` of a multipart request ended.
pub(crate) enum UploadOutcome {
    Written { filename: String },
    MissingFile,
    NotAFile,
    Refused { filename: String, error: PathError },
    Failed(WriteError),
}

/// Writes the part named `file` of a multipart request to `target`, or (when `None`) to the
/// path its filename gives, relative to the base directory.
pub(crate) async fn upload_part(
    state: &State,
    request: Request,
    target: Option<Beneath>,
    mode: Option<u32>,
) -> UploadOutcome {
    let Ok(mut multipart) = Multipart::from_request(request, &()).await else {
        return UploadOutcome::MissingFile;
    };
    loop {
        let field = match multipart.next_field().await {
            Ok(Some(field)) => field,
            Ok(None) => return UploadOutcome::MissingFile,
            Err(error) => return UploadOutcome::Failed(WriteError::Body(error.body_text())),
        };
        if field.name() != Some(UPLOAD_PART) {
            continue;
        }
        let Some(filename) = field.file_name().map(str::to_owned) else {
            return UploadOutcome::NotAFile;
        };
        let rel = match target {
            Some(rel) => rel,
            None => match state.root.beneath(&filename, Absolute::StripLeadingSlash) {
                Ok(rel) => rel,
                Err(error) => return UploadOutcome::Refused { filename, error },
            },
        };
        let mut chunks = FieldChunks(field);
        return match files::write_atomic(
            std::sync::Arc::clone(&state.root),
            rel,
            mode,
            state.config.max_upload_bytes,
            &mut chunks,
        )
        .await
        {
            Ok(_) => UploadOutcome::Written { filename },
            Err(error) => UploadOutcome::Failed(error),
        };
    }
}

/// A streamed file body of `size` bytes.
pub(crate) fn file_response(
    file: std::fs::File,
    size: u64,
    content_type: &'static str,
) -> Response {
    let stream =
        tokio_util::io::ReaderStream::with_capacity(tokio::fs::File::from_std(file), 128 * 1024);
    let mut response = Response::new(Body::from_stream(stream));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(size));
    response
}
