//! Upstream's python-runtime endpoints (`GET /`, `POST /execute`, `POST /upload`,
//! `GET /download|list|exists/{path}`), with its JSON shapes, messages and status codes.
//! Deliberate differences, all additive or stricter: `/execute` reports 127/126/124/2 instead of
//! 1 for not found / not executable / timed out / bad quoting, keeps output on a timeout, adds
//! the extension fields; uploads are streamed and atomic; symlinks out of the base directory
//! and loops are refused with 403; an upload that names the base directory itself, an
//! over-long path and a malformed multipart body are a 400, an upload with a directory in the
//! way a 409 (upstream: 500, or a 404 for a long path).

use std::convert::Infallible;
use std::time::Duration;

use agent_sandbox_api::runtime::v1::{ErrorCode, ExecRequest};
use agent_sandbox_api::runtime::{
    ACCESS_DENIED, EXECUTE_FAILED_PREFIX, ExecuteRequest, ExecuteResponse, ExistsResponse,
    FILE_NOT_FOUND, HealthResponse, LIST_FAILED_PREFIX, MessageResponse, NOT_A_DIRECTORY,
    UPLOAD_FAILED_PREFIX, ValidationErrorResponse, paths,
};
use axum::body::Body;
use axum::extract::{Request, State as Extract};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use tokio::time::Instant;

use super::exec::{Refusal, StartError, prepare, start};
use super::transfer::{UploadOutcome, file_response, upload_part};
use super::{ApiError, Flavor, State, decode_lossy, fs_code, json, read_body, shown, tail};
use crate::exec::spawn::{spawn_failure_code, spawn_failure_message};
use crate::exec::{Capture, Outcome};
use crate::files::{self, WriteError, blocking};
use crate::output::JsonText;
use crate::paths::{Absolute, FsErrorKind, PathError, classify};
use crate::split::{SplitError, split};

pub(crate) async fn health() -> Response {
    json(StatusCode::OK, &HealthResponse::ok())
}

fn validation(kind: &str, loc: &[&str], msg: impl Into<String>) -> Response {
    json(
        StatusCode::UNPROCESSABLE_ENTITY,
        &ValidationErrorResponse::one(kind, loc, msg),
    )
}

/// FastAPI-shaped 422 for a body that is not a valid `ExecuteRequest`.
fn invalid_body(error: &serde_json::Error) -> Response {
    let text = error.to_string();
    if let Some(field) = text
        .strip_prefix("missing field `")
        .and_then(|rest| rest.split('`').next())
    {
        return validation("missing", &["body", field], "Field required");
    }
    match error.classify() {
        serde_json::error::Category::Data => validation("value_error", &["body"], text),
        _ => validation(
            "json_invalid",
            &["body"],
            format!("JSON decode error: {text}"),
        ),
    }
}

/// The answer when the command could not run: upstream's `Failed to execute command: ...` in
/// `stderr`, with a conventional exit code.
fn failed(stderr: &str, exit_code: i32, received: Instant) -> Response {
    json(
        StatusCode::OK,
        &ExecuteResponse {
            stdout: String::new(),
            stderr: format!("{EXECUTE_FAILED_PREFIX}{stderr}"),
            exit_code,
            timed_out: Some(false),
            stdout_truncated: Some(false),
            stderr_truncated: Some(false),
            duration_ms: Some(u64::try_from(received.elapsed().as_millis()).unwrap_or(u64::MAX)),
        },
    )
}

/// The `/v1` request an upstream body means: through `/bin/sh -c` with `shell`, else split
/// shlex-style into an `argv` (no shell).
fn to_exec_request(request: ExecuteRequest) -> Result<ExecRequest, SplitError> {
    let ExecuteRequest {
        command,
        shell,
        cwd,
        env,
        timeout_seconds,
        stdin,
        max_output_bytes,
    } = request;
    let (command, argv) = if shell == Some(true) {
        (Some(command), None)
    } else {
        (None, Some(split(&command)?))
    };
    Ok(ExecRequest {
        command,
        argv,
        cwd,
        env,
        timeout_seconds,
        stdin,
        max_output_bytes,
        stdin_open: None,
    })
}

pub(crate) async fn execute(
    Extract(state): Extract<State>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let received = Instant::now();
    let bytes = match read_body(&headers, body, state.config.max_body_bytes).await {
        Ok(bytes) => bytes,
        Err(error) => return error.into_api(Flavor::Legacy).into_response(),
    };
    if bytes.is_empty() {
        return validation("missing", &["body"], "Field required");
    }
    let request: ExecuteRequest = match serde_json::from_slice(&bytes) {
        Ok(request) => request,
        Err(error) => return invalid_body(&error),
    };
    // The parsed request holds what is needed; the raw body is not kept while the command runs.
    drop(bytes);
    let request = match to_exec_request(request) {
        Ok(request) => request,
        // A shell reports a syntax error with 2.
        Err(error) => return failed(&error.to_string(), 2, received),
    };
    let prepared = match prepare(
        &state,
        request,
        Some(state.config.exec_timeout),
        Flavor::Legacy,
    ) {
        Ok(prepared) => prepared,
        Err(Refusal::NoCommand) => return failed("no command given", 1, received),
        // Python's words for it (`ValueError: embedded null byte`).
        Err(Refusal::Nul) => return failed("embedded null byte", 1, received),
        Err(Refusal::Timeout) => {
            return validation(
                "value_error",
                &["body", "timeout_seconds"],
                "timeout_seconds must be a finite number above 0",
            );
        }
        Err(Refusal::Api(error)) => return error.into_response(),
    };
    let timeout = prepared.limits.timeout.unwrap_or(state.config.exec_timeout);
    let mut capture = Capture::new(prepared.limits.max_output_bytes);
    let started = match start(&state, prepared) {
        Ok(started) => started,
        Err(StartError::ShuttingDown) => {
            return ApiError::shutting_down(Flavor::Legacy).into_response();
        }
        Err(StartError::Busy) => {
            return ApiError::busy(Flavor::Legacy, state.config.max_processes).into_response();
        }
        Err(StartError::Spawn { error, program }) => {
            return failed(
                &spawn_failure_message(&error, &program),
                spawn_failure_code(&error),
                received,
            );
        }
    };
    // Runs inside this handler: if the client disconnects, hyper drops this future and the
    // group guard inside the driver kills the whole group.
    let cancel = state.shutdown.child_token();
    let outcome = started.drive(&mut capture, &cancel).await;
    execute_response(&outcome, capture, timeout)
}

/// The `/execute` answer: upstream's JSON, encoded from the captured bytes in pieces of
/// bounded size ([`ExecuteBody`]) instead of as one string, so that the memory a call takes is
/// its captured output plus a bounded amount, even where JSON takes six bytes per output byte.
fn execute_response(outcome: &Outcome, capture: Capture, timeout: Duration) -> Response {
    let Capture {
        stdout, mut stderr, ..
    } = capture;
    if outcome.timed_out {
        if stderr.last().is_some_and(|b| *b != b'\n') {
            stderr.push(b'\n');
        }
        stderr.extend_from_slice(
            format!(
                "{EXECUTE_FAILED_PREFIX}Command timed out after {} seconds",
                timeout.as_secs_f64()
            )
            .as_bytes(),
        );
    }
    let fields = ExecuteResponse {
        stdout: String::new(),
        stderr: String::new(),
        exit_code: outcome.legacy_exit_code(),
        timed_out: Some(outcome.timed_out),
        stdout_truncated: Some(outcome.stdout_truncated),
        stderr_truncated: Some(outcome.stderr_truncated),
        duration_ms: Some(u64::try_from(outcome.duration.as_millis()).unwrap_or(u64::MAX)),
    };
    let Some(body) = ExecuteBody::new(stdout, stderr, &fields) else {
        tracing::error!("the /execute answer does not start with stdout and stderr");
        return ApiError::legacy(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("{EXECUTE_FAILED_PREFIX}the answer could not be encoded"),
        )
        .into_response();
    };
    body.into_response()
}

/// `{"stdout":"` and `","stderr":"`: what comes before each output string, in upstream's field
/// order (pinned by `crates/api`'s tests and by `tests::execute_body_is_serde_jsons`).
const BEFORE_STDOUT: &[u8] = br#"{"stdout":""#;
const BEFORE_STDERR: &[u8] = br#"","stderr":""#;
/// How an answer with empty output starts.
const EMPTY_OUTPUT: &[u8] = b"{\"stdout\":\"\",\"stderr\":\"\"";
/// Output bytes encoded per piece of a streamed answer: a piece is at most 6 times this.
const PIECE_INPUT: usize = 16 << 10;
/// Answers up to this size are sent in one piece, with no stream.
const ONE_PIECE: u64 = 64 << 10;

/// The JSON of an `/execute` answer as a sequence of pieces: the two output strings are
/// escaped incrementally ([`JsonText`]), the other fields are serde_json's.
struct ExecuteBody {
    stdout: JsonText,
    stderr: JsonText,
    /// What follows the stderr string: `"` and the rest of the fields.
    rest: Vec<u8>,
    stage: Stage,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Open,
    Stdout,
    Between,
    Stderr,
    Rest,
    Done,
}

impl ExecuteBody {
    /// `None` if `fields` (with empty output) does not serialise with stdout and stderr first.
    fn new(stdout: Vec<u8>, stderr: Vec<u8>, fields: &ExecuteResponse) -> Option<Self> {
        let mut rest = serde_json::to_vec(fields).ok()?;
        if !rest.starts_with(EMPTY_OUTPUT) {
            return None;
        }
        // Keep the quote that closes stderr's string.
        rest.drain(..EMPTY_OUTPUT.len() - 1);
        Some(Self {
            stdout: JsonText::new(stdout),
            stderr: JsonText::new(stderr),
            rest,
            stage: Stage::Open,
        })
    }

    /// The size of the whole answer.
    fn len(&self) -> u64 {
        (BEFORE_STDOUT.len() + BEFORE_STDERR.len() + self.rest.len()) as u64
            + self.stdout.encoded_len()
            + self.stderr.encoded_len()
    }

    /// Appends the next part, encoding at most `budget` output bytes.
    fn next_into(&mut self, out: &mut Vec<u8>, budget: usize) {
        match self.stage {
            Stage::Open => {
                out.extend_from_slice(BEFORE_STDOUT);
                self.stage = Stage::Stdout;
            }
            Stage::Stdout if self.stdout.is_done() => self.stage = Stage::Between,
            Stage::Stdout => self.stdout.encode_some(out, budget),
            Stage::Between => {
                out.extend_from_slice(BEFORE_STDERR);
                self.stage = Stage::Stderr;
            }
            Stage::Stderr if self.stderr.is_done() => self.stage = Stage::Rest,
            Stage::Stderr => self.stderr.encode_some(out, budget),
            Stage::Rest => {
                out.extend_from_slice(&self.rest);
                self.stage = Stage::Done;
            }
            Stage::Done => {}
        }
    }

    /// A JSON response: one piece when small, else a stream of pieces; `Content-Length` set.
    fn into_response(mut self) -> Response {
        let len = self.len();
        let body = if len <= ONE_PIECE {
            let mut out = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
            while self.stage != Stage::Done {
                self.next_into(&mut out, usize::MAX);
            }
            Body::from(out)
        } else {
            Body::from_stream(futures_util::stream::iter(self.map(Ok::<_, Infallible>)))
        };
        let mut response = Response::new(body);
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
        response
    }
}

impl Iterator for ExecuteBody {
    type Item = bytes::Bytes;

    fn next(&mut self) -> Option<bytes::Bytes> {
        if self.stage == Stage::Done {
            return None;
        }
        let mut out = Vec::with_capacity(6 * (PIECE_INPUT + 3) + self.rest.len() + 32);
        while self.stage != Stage::Done && out.len() < PIECE_INPUT {
            let room = PIECE_INPUT - out.len().min(PIECE_INPUT);
            self.next_into(&mut out, room.max(1));
        }
        Some(bytes::Bytes::from(out))
    }
}

pub(crate) async fn upload(Extract(state): Extract<State>, request: Request) -> Response {
    if super::content_length(request.headers())
        .is_some_and(|len| len > state.config.max_upload_bytes)
    {
        return too_large(&state);
    }
    match upload_part(&state, request, None, None).await {
        UploadOutcome::Written { filename, .. } => {
            json(StatusCode::OK, &MessageResponse::uploaded(&filename))
        }
        UploadOutcome::MissingFile => validation("missing", &["body", "file"], "Field required"),
        UploadOutcome::NotAFile => validation(
            "value_error",
            &["body", "file"],
            "Value error, Expected UploadFile, received: <class 'str'>",
        ),
        UploadOutcome::Refused {
            error: PathError::Nul | PathError::Escapes,
            ..
        } => ApiError::legacy(StatusCode::FORBIDDEN, ACCESS_DENIED).into_response(),
        UploadOutcome::Refused { filename, error } => ApiError::legacy(
            StatusCode::BAD_REQUEST,
            format!("{UPLOAD_FAILED_PREFIX}path '{}' {error}", shown(&filename)),
        )
        .into_response(),
        UploadOutcome::Failed(WriteError::TooLarge { .. }) => too_large(&state),
        // A malformed multipart body (or one that stopped) is the client's: 400, not 500.
        UploadOutcome::Failed(error @ WriteError::Body(_)) => ApiError::legacy(
            StatusCode::BAD_REQUEST,
            format!("{UPLOAD_FAILED_PREFIX}{error}"),
        )
        .into_response(),
        UploadOutcome::Failed(WriteError::Fs(error))
            if matches!(classify(&error), FsErrorKind::Escapes | FsErrorKind::Loop) =>
        {
            ApiError::legacy(StatusCode::FORBIDDEN, ACCESS_DENIED).into_response()
        }
        // A directory in the way is 409, a refused permission 403, as on `/v1`: a 500 is
        // only for the runtime's own failures (upstream answers 500 for all of them).
        UploadOutcome::Failed(WriteError::Fs(error)) => ApiError::new(
            Flavor::Legacy,
            fs_code(&error),
            format!("{UPLOAD_FAILED_PREFIX}{error}"),
        )
        .into_response(),
    }
}

fn too_large(state: &State) -> Response {
    ApiError::new(
        Flavor::Legacy,
        ErrorCode::PayloadTooLarge,
        format!(
            "{UPLOAD_FAILED_PREFIX}the file is larger than {} bytes",
            state.config.max_upload_bytes
        ),
    )
    .into_response()
}

/// The path of a legacy `{path}` endpoint: the URL path is percent-decoded (as the ASGI server
/// does) and then unquoted once more (as upstream's handler does).
fn legacy_path(uri: &Uri, prefix: &str) -> String {
    decode_lossy(&decode_lossy(tail(uri, prefix)))
}

fn access_denied() -> Response {
    ApiError::legacy(StatusCode::FORBIDDEN, ACCESS_DENIED).into_response()
}

/// 400 for a path the kernel refuses as too long (upstream: 500 or a misleading 404).
fn too_long(path: &str) -> Response {
    ApiError::path(Flavor::Legacy, PathError::TooLong, path).into_response()
}

/// Characters Python's `urllib.parse.quote` leaves alone by default (plus `/`).
const QUOTE_SAFE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'_')
    .remove(b'.')
    .remove(b'-')
    .remove(b'~')
    .remove(b'/');

/// Starlette's `Content-Disposition` for a download named `filename`.
pub(crate) fn content_disposition(filename: &str) -> String {
    let quoted = utf8_percent_encode(filename, QUOTE_SAFE).to_string();
    if quoted == filename {
        format!("attachment; filename=\"{filename}\"")
    } else {
        format!("attachment; filename*=utf-8''{quoted}")
    }
}

pub(crate) async fn download(Extract(state): Extract<State>, uri: Uri) -> Response {
    let path = legacy_path(&uri, paths::DOWNLOAD);
    let rel = match state.root.relative(&path, Absolute::StripLeadingSlash) {
        Ok(rel) => rel,
        Err(error) => return ApiError::path(Flavor::Legacy, error, &path).into_response(),
    };
    let root = std::sync::Arc::clone(&state.root);
    match blocking(move || files::open_read(&root, &rel)).await {
        Ok((file, size)) => {
            let mut response = file_response(file, size, "application/octet-stream");
            if let Ok(value) = HeaderValue::from_str(&content_disposition(&path)) {
                response
                    .headers_mut()
                    .insert(header::CONTENT_DISPOSITION, value);
            }
            response
        }
        Err(error) => match classify(&error) {
            FsErrorKind::Escapes | FsErrorKind::Loop | FsErrorKind::PermissionDenied => {
                access_denied()
            }
            FsErrorKind::NameTooLong => too_long(&path),
            _ => ApiError::legacy(StatusCode::NOT_FOUND, FILE_NOT_FOUND).into_response(),
        },
    }
}

pub(crate) async fn list(Extract(state): Extract<State>, uri: Uri) -> Response {
    let path = legacy_path(&uri, paths::LIST);
    let rel = match state.root.relative(&path, Absolute::StripLeadingSlash) {
        Ok(rel) => rel,
        Err(error) => return ApiError::path(Flavor::Legacy, error, &path).into_response(),
    };
    let root = std::sync::Arc::clone(&state.root);
    match blocking(move || files::list_legacy(&root, &rel)).await {
        Ok(entries) => json(StatusCode::OK, &entries),
        Err(error) => match classify(&error) {
            FsErrorKind::Escapes | FsErrorKind::Loop | FsErrorKind::PermissionDenied => {
                access_denied()
            }
            FsErrorKind::NotFound | FsErrorKind::NotADirectory => {
                ApiError::legacy(StatusCode::NOT_FOUND, NOT_A_DIRECTORY).into_response()
            }
            FsErrorKind::NameTooLong => too_long(&path),
            _ => ApiError::legacy(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("{LIST_FAILED_PREFIX}{error}"),
            )
            .into_response(),
        },
    }
}

pub(crate) async fn exists(Extract(state): Extract<State>, uri: Uri) -> Response {
    let path = legacy_path(&uri, paths::EXISTS);
    let rel = match state.root.relative(&path, Absolute::StripLeadingSlash) {
        Ok(rel) => rel,
        Err(error) => return ApiError::path(Flavor::Legacy, error, &path).into_response(),
    };
    let root = std::sync::Arc::clone(&state.root);
    match blocking(move || root.dir().metadata(rel.as_path())).await {
        Ok(_) => json(StatusCode::OK, &ExistsResponse { path, exists: true }),
        Err(error) => match classify(&error) {
            FsErrorKind::Escapes | FsErrorKind::Loop => access_denied(),
            FsErrorKind::NameTooLong => too_long(&path),
            _ => json(
                StatusCode::OK,
                &ExistsResponse {
                    path,
                    exists: false,
                },
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The answer `ExecuteBody` streams, as one buffer.
    fn streamed(stdout: &[u8], stderr: &[u8], fields: &ExecuteResponse) -> Vec<u8> {
        let body = ExecuteBody::new(stdout.to_vec(), stderr.to_vec(), fields).unwrap();
        let len = body.len();
        let mut out = Vec::new();
        for piece in body {
            assert!(piece.len() <= 6 * (PIECE_INPUT + 3) + 256);
            out.extend_from_slice(&piece);
        }
        assert_eq!(out.len() as u64, len);
        out
    }

    fn serde(stdout: &[u8], stderr: &[u8], fields: &ExecuteResponse) -> Vec<u8> {
        serde_json::to_vec(&ExecuteResponse {
            stdout: String::from_utf8_lossy(stdout).into_owned(),
            stderr: String::from_utf8_lossy(stderr).into_owned(),
            ..fields.clone()
        })
        .unwrap()
    }

    #[test]
    fn execute_body_is_serde_jsons() {
        assert_eq!(EMPTY_OUTPUT, [BEFORE_STDOUT, BEFORE_STDERR, b"\""].concat());
        let fields = ExecuteResponse {
            exit_code: -9,
            timed_out: Some(true),
            stdout_truncated: Some(true),
            stderr_truncated: Some(false),
            duration_ms: Some(12),
            ..ExecuteResponse::default()
        };
        for (stdout, stderr) in [
            (&b""[..], &b""[..]),
            (b"hi\n", b""),
            (&[0u8; 100_000][..], b"\xff\"quoted\"\\"),
        ] {
            assert_eq!(
                streamed(stdout, stderr, &fields),
                serde(stdout, stderr, &fields)
            );
            assert_eq!(
                streamed(stdout, stderr, &ExecuteResponse::default()),
                serde(stdout, stderr, &ExecuteResponse::default())
            );
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        #[test]
        fn execute_body_matches_serde_json(
            stdout in prop::collection::vec(any::<u8>(), 0..40_000),
            stderr in prop::collection::vec(prop::sample::select(vec![0u8, b'a', 0xc3, 0xa9, 0xff, b'"']), 0..300),
            exit_code in any::<i32>(),
            flags in any::<(bool, bool, bool)>(),
        ) {
            let fields = ExecuteResponse {
                exit_code,
                timed_out: Some(flags.0),
                stdout_truncated: Some(flags.1),
                stderr_truncated: Some(flags.2),
                duration_ms: Some(7),
                ..ExecuteResponse::default()
            };
            let (got, want) = (streamed(&stdout, &stderr, &fields), serde(&stdout, &stderr, &fields));
            prop_assert!(got == want, "{} != {}", String::from_utf8_lossy(&got), String::from_utf8_lossy(&want));
        }
    }

    #[test]
    fn content_disposition_like_starlette() {
        assert_eq!(
            content_disposition("docs/report.txt"),
            "attachment; filename=\"docs/report.txt\""
        );
        assert_eq!(
            content_disposition("a b.txt"),
            "attachment; filename*=utf-8''a%20b.txt"
        );
        assert_eq!(
            content_disposition("é.txt"),
            "attachment; filename*=utf-8''%C3%A9.txt"
        );
    }
}
