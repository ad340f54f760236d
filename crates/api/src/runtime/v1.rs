//! JSON of the runtime's `/v1` API: streaming exec, background processes and files.
//!
//! These are our extensions (upstream's python runtime has none of them); the file API follows the
//! shape of upstream's `sandboxd` REST API where one exists (`DirectoryListing`, `FileEntry`,
//! `{"code", "message"}` errors, `204` on write and delete), so a client of one reads the other.
//! Written by `sandbox-runtime`, read by the SDK and the CLI. `docs/runtime-api.md` shows every
//! endpoint with examples.
//!
//! Output of a command is one byte sequence per command in which stdout and stderr chunks are
//! interleaved as they were read; every chunk carries its byte `offset` in that sequence, so a
//! client that reconnects asks for the output from the offset after the last byte it saw.

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::{Deserialize, Serialize};

/// Paths of the `/v1` endpoints.
pub mod paths {
    /// What every `/v1` path starts with (errors under it have the `/v1` shape).
    pub const PREFIX: &str = "/v1/";
    /// `GET /v1/health`: liveness with uptime; `503` while shutting down.
    pub const HEALTH: &str = "/v1/health";
    /// `POST /v1/exec`: run a command and stream [`super::ExecEvent`]s as NDJSON.
    pub const EXEC: &str = "/v1/exec";
    /// `POST /v1/processes` (start), `GET /v1/processes` (list); `GET|DELETE
    /// /v1/processes/{id}` (one process), with the suffixes below for its other endpoints.
    pub const PROCESSES: &str = "/v1/processes";
    /// After `/v1/processes/{id}`: `GET` its output as NDJSON ([`super::OutputQuery`]).
    pub const PROCESS_OUTPUT: &str = "/output";
    /// After `/v1/processes/{id}`: `POST` bytes to its standard input ([`super::StdinQuery`]).
    pub const PROCESS_STDIN: &str = "/stdin";
    /// After `/v1/processes/{id}`: `POST` a [`super::SignalRequest`] to its process group.
    pub const PROCESS_SIGNAL: &str = "/signal";
    /// `GET|HEAD|PUT|DELETE|POST /v1/files/{path}` (`/v1/files` alone is the base directory).
    pub const FILES: &str = "/v1/files/";
}

/// Content type of streamed event bodies: one JSON object per line.
pub const NDJSON_CONTENT_TYPE: &str = "application/x-ndjson";

/// Body of `POST /v1/exec` and `POST /v1/processes`.
///
/// Exactly one of `command` (run through `/bin/sh -c`) and `argv` (run directly, no shell) is
/// given. Unknown fields are refused, so a misspelled option fails loudly instead of being
/// ignored.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    /// A shell command line, run as `/bin/sh -c <command>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// Program and arguments, run without a shell (the program is looked up in `PATH`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argv: Option<Vec<String>>,
    /// Working directory, relative to the base directory (or absolute inside it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Environment variables added to (or replacing) the runtime's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<BTreeMap<String, String>>,
    /// Seconds before the whole process group is killed. `/v1/exec` uses the runtime's default
    /// when unset; background processes have no timeout unless one is given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<f64>,
    /// Bytes written to standard input before it is closed (or, for a background process
    /// with `stdin_open`, before later writes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
    /// Cap on the bytes of each of stdout and stderr; the rest is discarded and reported as
    /// truncated in the [`ExitInfo`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_bytes: Option<u64>,
    /// Background processes only: keep standard input open for
    /// `POST /v1/processes/{id}/stdin`. Refused by `/v1/exec`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin_open: Option<bool>,
}

impl ExecRequest {
    /// A shell command.
    pub fn shell(command: impl Into<String>) -> Self {
        Self {
            command: Some(command.into()),
            ..Self::default()
        }
    }

    /// A program with arguments, no shell.
    pub fn argv<I, S>(argv: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            argv: Some(argv.into_iter().map(Into::into).collect()),
            ..Self::default()
        }
    }
}

/// Which output stream a chunk was read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StreamKind {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// A piece of output at a byte offset of the command's output sequence.
///
/// Text that is valid UTF-8 is sent as `data`; anything else as `data_b64` (standard base64).
/// The runtime cuts chunks at character boundaries, so UTF-8 output always arrives as `data`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputChunk {
    /// Offset of the first byte of this chunk in the command's output (stdout and stderr
    /// interleaved).
    pub offset: u64,
    /// The bytes, when they are valid UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
    /// The bytes in base64, when they are not valid UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_b64: Option<String>,
}

impl OutputChunk {
    /// Encodes `bytes` found at `offset`.
    pub fn from_bytes(offset: u64, bytes: &[u8]) -> Self {
        match std::str::from_utf8(bytes) {
            Ok(text) => Self {
                offset,
                data: Some(text.to_owned()),
                data_b64: None,
            },
            Err(_) => Self {
                offset,
                data: None,
                data_b64: Some(BASE64.encode(bytes)),
            },
        }
    }

    /// The bytes of this chunk; `None` when `data_b64` is not valid base64.
    pub fn bytes(&self) -> Option<Vec<u8>> {
        match (&self.data, &self.data_b64) {
            (Some(text), _) => Some(text.as_bytes().to_vec()),
            (None, Some(encoded)) => BASE64.decode(encoded).ok(),
            (None, None) => Some(Vec::new()),
        }
    }

    /// Offset just past this chunk: where a reconnecting reader resumes.
    pub fn end_offset(&self) -> u64 {
        let len = self.bytes().map_or(0, |b| b.len());
        self.offset + u64::try_from(len).unwrap_or(u64::MAX)
    }
}

/// How a command ended.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitInfo {
    /// Exit code, when the process exited by itself.
    pub exit_code: Option<i32>,
    /// Number of the signal that ended the process, when one did (9 after a timeout or a kill).
    pub signal: Option<i32>,
    /// The timeout killed the process group.
    pub timed_out: bool,
    /// Stdout was longer than `max_output_bytes`; the rest was discarded.
    pub stdout_truncated: bool,
    /// Stderr was longer than `max_output_bytes`; the rest was discarded.
    pub stderr_truncated: bool,
    /// Wall-clock milliseconds from start to the end of output.
    pub duration_ms: u64,
}

/// One line of an NDJSON stream from `POST /v1/exec` or `GET /v1/processes/{id}/output`.
///
/// `/v1/exec` sends `start`, then `stdout`/`stderr` chunks, then exactly one `exit`. An output
/// read sends `dropped` first when its offset is older than the buffer keeps, then chunks, then
/// `exit` when the process has ended or `end` when it has not (without `follow`). `error` ends a
/// stream the runtime had to stop (for example at shutdown).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ExecEvent {
    /// The process started.
    Start {
        /// Its process id (also its process group and session id).
        pid: u32,
    },
    /// Bytes from standard output.
    Stdout(OutputChunk),
    /// Bytes from standard error.
    Stderr(OutputChunk),
    /// The reader asked for bytes the bounded buffer no longer keeps.
    Dropped {
        /// The offset asked for.
        offset: u64,
        /// How many bytes from there on were dropped; the next chunk starts at
        /// `offset + bytes`.
        bytes: u64,
    },
    /// The process ended (always the last event of a complete stream).
    Exit(ExitInfo),
    /// A read without `follow` reached the end of what is buffered while the process runs.
    End {
        /// Where to resume.
        next_offset: u64,
    },
    /// The runtime stopped the stream early.
    Error(ErrorBody),
}

/// Lifecycle state of a background process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProcessState {
    /// Still running.
    Running,
    /// Ended; `exit` says how.
    Exited,
}

/// A background process, as `POST /v1/processes`, `GET /v1/processes[/{id}]` and
/// `POST /v1/processes/{id}/signal` answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessInfo {
    /// Id for the other `/v1/processes/{id}` endpoints (unique per runtime start).
    pub id: String,
    /// The shell command, when started with one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// The argv, when started without a shell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argv: Option<Vec<String>>,
    /// Process id (also process group and session id).
    pub pid: u32,
    /// Running or exited.
    pub state: ProcessState,
    /// RFC 3339 start time.
    pub started_at: String,
    /// RFC 3339 end time, once exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// How it ended, once exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<ExitInfo>,
    /// Whether `POST /v1/processes/{id}/stdin` still accepts bytes.
    pub stdin_open: bool,
    /// Offset of the oldest output byte still buffered.
    pub output_start: u64,
    /// Offset just past the newest output byte (the total produced so far).
    pub output_end: u64,
}

/// Body of `GET /v1/processes`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessList {
    /// Running processes and the finished ones still kept, oldest first.
    pub processes: Vec<ProcessInfo>,
}

/// Query of `GET /v1/processes/{id}/output`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputQuery {
    /// Offset to read from (0 when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    /// Keep the stream open and send output as it is produced, until the process exits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub follow: Option<bool>,
}

/// Query of `POST /v1/processes/{id}/stdin` (the body is the raw bytes to write).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StdinQuery {
    /// Close standard input after writing the body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eof: Option<bool>,
}

/// Answer of `POST /v1/processes/{id}/stdin`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StdinResponse {
    /// Bytes written.
    pub written: u64,
    /// Whether standard input is still open.
    pub stdin_open: bool,
}

/// Body of `POST /v1/processes/{id}/signal`; the signal goes to the whole process group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignalRequest {
    /// `"TERM"`, `"SIGTERM"`, `"INT"`, `"KILL"`, `"HUP"`, `"QUIT"`, `"USR1"`, `"USR2"`,
    /// `"STOP"`, `"CONT"`, or a number.
    pub signal: SignalName,
}

/// A signal by name or number.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SignalName {
    /// By number (`15`).
    Number(i32),
    /// By name, with or without the `SIG` prefix (`"TERM"`, `"SIGTERM"`).
    Name(String),
}

/// Query of the `/v1/files/{path}` endpoints.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilesQuery {
    /// `DELETE`: remove a non-empty directory with its contents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recursive: Option<bool>,
    /// `PUT`: octal permission bits of the written file (`"0644"`, `"755"`); default: those of
    /// the file it replaces, else `0644`. `POST ?op=mkdir`: of the created directory (default
    /// `0755`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// `POST`: the operation; only [`FILES_OP_MKDIR`] for now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op: Option<String>,
}

/// `POST /v1/files/{path}?op=mkdir`: create the directory and its missing parents.
pub const FILES_OP_MKDIR: &str = "mkdir";

/// Kind of a directory entry (never followed: a symlink is reported as one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FileType {
    /// A regular file.
    File,
    /// A directory.
    Directory,
    /// A symbolic link.
    Symlink,
    /// A socket, FIFO or device.
    Other,
}

/// One entry of a [`DirectoryListing`] (sandboxd's `FileEntry` field names).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// File name, no directory part.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// File, directory, symlink or other.
    #[serde(rename = "type")]
    pub file_type: FileType,
    /// RFC 3339 modification time, whole seconds, UTC.
    pub modified_at: String,
    /// Octal permission bits, e.g. `"0644"`.
    pub mode: String,
}

/// Answer of `GET /v1/files/{path}` when the path is a directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirectoryListing {
    /// The path as requested, relative to the base directory.
    pub path: String,
    /// Entries sorted by name.
    pub entries: Vec<FileEntry>,
}

/// Body of `GET /v1/health`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthResponse {
    /// `"ok"`, or `"shutting_down"` with status 503.
    pub status: String,
    /// Seconds since the runtime started.
    pub uptime_seconds: u64,
}

/// Machine-readable error code of a `/v1` error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ErrorCode {
    /// 400: malformed request, bad query value, NUL byte or symlink loop in a path.
    InvalidArgument,
    /// 403: the path leads outside the base directory, or the OS refused access.
    PermissionDenied,
    /// 404: no such file, directory, process or endpoint.
    NotFound,
    /// 405: the endpoint exists but not with this method.
    MethodNotAllowed,
    /// 409: the target's state forbids the operation (non-empty directory, directory in the
    /// way, process already exited, stdin closed).
    Conflict,
    /// 413: the request body is larger than the runtime accepts.
    PayloadTooLarge,
    /// 422: the command could not be started (not found, not executable).
    SpawnFailed,
    /// 429: too many processes are running; retry later.
    ResourceExhausted,
    /// 500: anything else; the message says what.
    Internal,
    /// 503: the runtime is shutting down.
    Unavailable,
}

/// Body of every `/v1` error, and of an `error` event: `{"code": "...", "message": "..."}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What kind of failure.
    pub code: ErrorCode,
    /// What failed, on what.
    pub message: String,
}

impl ErrorBody {
    /// Builds an error body.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    fn line(event: &ExecEvent) -> String {
        serde_json::to_string(event).unwrap()
    }

    #[test]
    fn exec_events_are_tagged_lines() {
        assert_eq!(
            line(&ExecEvent::Start { pid: 42 }),
            r#"{"type":"start","pid":42}"#
        );
        assert_eq!(
            line(&ExecEvent::Stdout(OutputChunk::from_bytes(0, b"hi\n"))),
            r#"{"type":"stdout","offset":0,"data":"hi\n"}"#
        );
        assert_eq!(
            line(&ExecEvent::Stderr(OutputChunk::from_bytes(
                3,
                &[0xff, 0x00]
            ))),
            r#"{"type":"stderr","offset":3,"data_b64":"/wA="}"#
        );
        assert_eq!(
            line(&ExecEvent::Dropped {
                offset: 0,
                bytes: 10
            }),
            r#"{"type":"dropped","offset":0,"bytes":10}"#
        );
        assert_eq!(
            line(&ExecEvent::End { next_offset: 7 }),
            r#"{"type":"end","next_offset":7}"#
        );
        assert_eq!(
            line(&ExecEvent::Exit(ExitInfo {
                exit_code: None,
                signal: Some(9),
                timed_out: true,
                stdout_truncated: false,
                stderr_truncated: true,
                duration_ms: 1001,
            })),
            r#"{"type":"exit","exit_code":null,"signal":9,"timed_out":true,"stdout_truncated":false,"stderr_truncated":true,"duration_ms":1001}"#
        );
        assert_eq!(
            line(&ExecEvent::Error(ErrorBody::new(
                ErrorCode::Unavailable,
                "shutting down"
            ))),
            r#"{"type":"error","code":"UNAVAILABLE","message":"shutting down"}"#
        );
        for event in [
            ExecEvent::Start { pid: 1 },
            ExecEvent::Stderr(OutputChunk::from_bytes(3, &[0xff])),
            ExecEvent::Exit(ExitInfo::default()),
        ] {
            let decoded: ExecEvent = serde_json::from_str(&line(&event)).unwrap();
            assert_eq!(decoded, event);
        }
    }

    #[test]
    fn chunks_give_back_their_bytes_and_end() {
        let text = OutputChunk::from_bytes(10, "é\n".as_bytes());
        assert_eq!(text.bytes().unwrap(), "é\n".as_bytes());
        assert_eq!(text.end_offset(), 13);
        let binary = OutputChunk::from_bytes(0, &[0xc3]);
        assert_eq!(binary.data, None);
        assert_eq!(binary.bytes().unwrap(), vec![0xc3]);
        assert_eq!(binary.end_offset(), 1);
    }

    #[test]
    fn exec_request_refuses_unknown_fields() {
        assert!(
            serde_json::from_value::<ExecRequest>(json!({"command": "ls", "timeout": 5})).is_err()
        );
        assert_eq!(
            serde_json::to_value(ExecRequest::argv(["ls", "-l"])).unwrap(),
            json!({"argv": ["ls", "-l"]})
        );
        assert_eq!(
            serde_json::to_value(ExecRequest::shell("ls | wc -l")).unwrap(),
            json!({"command": "ls | wc -l"})
        );
    }

    #[test]
    fn file_listing_uses_sandboxd_names() {
        let listing = DirectoryListing {
            path: "src".into(),
            entries: vec![FileEntry {
                name: "main.py".into(),
                size: 12,
                file_type: FileType::File,
                modified_at: "2026-01-01T00:00:00Z".into(),
                mode: "0644".into(),
            }],
        };
        assert_eq!(
            serde_json::to_value(&listing).unwrap(),
            json!({"path": "src", "entries": [{"name": "main.py", "size": 12, "type": "file",
                "modified_at": "2026-01-01T00:00:00Z", "mode": "0644"}]})
        );
    }

    #[test]
    fn signals_by_name_or_number() {
        let by_name: SignalRequest = serde_json::from_value(json!({"signal": "TERM"})).unwrap();
        assert_eq!(by_name.signal, SignalName::Name("TERM".into()));
        let by_number: SignalRequest = serde_json::from_value(json!({"signal": 9})).unwrap();
        assert_eq!(by_number.signal, SignalName::Number(9));
    }

    #[test]
    fn error_body() {
        assert_eq!(
            serde_json::to_value(ErrorBody::new(ErrorCode::PermissionDenied, "no")).unwrap(),
            json!({"code": "PERMISSION_DENIED", "message": "no"})
        );
        assert_eq!(
            serde_json::to_value(ErrorCode::ResourceExhausted).unwrap(),
            json!("RESOURCE_EXHAUSTED")
        );
    }

    #[test]
    fn process_info_shape() {
        let info = ProcessInfo {
            id: "a1-1".into(),
            command: Some("sleep 1".into()),
            argv: None,
            pid: 7,
            state: ProcessState::Running,
            started_at: "2026-01-01T00:00:00Z".into(),
            finished_at: None,
            exit: None,
            stdin_open: false,
            output_start: 0,
            output_end: 0,
        };
        assert_eq!(
            serde_json::to_value(&info).unwrap(),
            json!({"id": "a1-1", "command": "sleep 1", "pid": 7, "state": "running",
                "started_at": "2026-01-01T00:00:00Z", "stdin_open": false,
                "output_start": 0, "output_end": 0})
        );
    }
}
