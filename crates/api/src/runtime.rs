//! JSON of the runtime server on port 8888, as upstream's python runtime speaks it.
//!
//! These are the legacy endpoints every upstream SDK uses (`../shared/spec/upstream-compat.md`
//! §4.1). Field names, types and shapes are pinned by tests below; our runtime's extensions are
//! added as optional request fields and additional response fields only, so an old client keeps
//! working. The streaming, background-process and file API under `/v1` is in [`v1`].
//!
//! Written by `sandbox-runtime` (crates/runtime), read by the SDK, the CLI and any upstream client.

pub mod v1;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Paths of the legacy endpoints.
pub mod paths {
    /// `GET /`: health.
    pub const HEALTH: &str = "/";
    /// `POST /execute`: run a command, answer when it ends.
    pub const EXECUTE: &str = "/execute";
    /// `POST /upload`: multipart upload, part [`super::UPLOAD_PART`].
    pub const UPLOAD: &str = "/upload";
    /// `GET /download/{path}`: file bytes.
    pub const DOWNLOAD: &str = "/download/";
    /// `GET /list/{path}`: directory listing.
    pub const LIST: &str = "/list/";
    /// `GET /exists/{path}`: existence check.
    pub const EXISTS: &str = "/exists/";
}

/// Name of the multipart part that carries the file in `POST /upload`; the part's filename is the
/// destination path relative to the base directory.
pub const UPLOAD_PART: &str = "file";

/// Body of `GET /`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthResponse {
    /// Always `"ok"`.
    pub status: String,
    /// Human-readable; upstream sends `"Sandbox Runtime is active."`.
    pub message: String,
}

impl HealthResponse {
    /// The body upstream's runtime answers with.
    pub fn ok() -> Self {
        Self {
            status: "ok".to_owned(),
            message: "Sandbox Runtime is active.".to_owned(),
        }
    }
}

/// Body of `POST /execute`: upstream's one field, plus our optional extensions.
///
/// Every extension is optional and left out of the JSON when unset, so a request built from
/// [`ExecuteRequest::new`] is exactly what upstream clients send. `timeout_seconds` is the name
/// the newest upstream Python SDK already sends.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ExecuteRequest {
    /// The command line. Split shlex-style (POSIX rules, like Python's `shlex.split`) and run
    /// without a shell, unless [`Self::shell`] is true.
    pub command: String,
    /// Extension: run `command` through `/bin/sh -c`, so pipes, `&&`, redirects, `$VARS` and
    /// `cd` work.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shell: Option<bool>,
    /// Extension: working directory, relative to the base directory (or absolute inside it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Extension: environment variables added to (or replacing) the runtime's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<BTreeMap<String, String>>,
    /// Extension: seconds before the whole process group is killed (exit code 124); the
    /// runtime's default when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<f64>,
    /// Extension: bytes written to the command's standard input (which is otherwise empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
    /// Extension: cap on the bytes kept of each of stdout and stderr (the runtime's own cap is
    /// the upper bound); truncation is reported in the response.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_bytes: Option<u64>,
}

impl ExecuteRequest {
    /// A request with upstream's single field.
    pub fn new(command: impl Into<String>) -> Self {
        Self {
            command: command.into(),
            ..Self::default()
        }
    }
}

/// Body of a `POST /execute` answer (always HTTP 200, also when the command could not start).
///
/// The first three fields are upstream's, in upstream's order. Our runtime always adds the
/// others after them; they are `None` when the answer comes from an upstream runtime.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecuteResponse {
    /// Standard output, decoded as UTF-8 (invalid sequences replaced).
    pub stdout: String,
    /// Standard error, or `Failed to execute command: ...` when the command could not run.
    pub stderr: String,
    /// Exit status; non-zero on any failure: 127 command not found, 126 not executable, 124
    /// timed out, minus the signal number when a signal ended it (as upstream reports it).
    pub exit_code: i32,
    /// Extension: the timeout killed the process group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timed_out: Option<bool>,
    /// Extension: stdout was longer than the cap and was cut.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout_truncated: Option<bool>,
    /// Extension: stderr was longer than the cap and was cut.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr_truncated: Option<bool>,
    /// Extension: wall-clock milliseconds from start to the end of output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
}

/// Whether a listing entry is a file or a directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EntryType {
    /// Anything that is not a directory (upstream reports symlinks to files, sockets etc. so).
    File,
    /// A directory.
    Directory,
}

/// One element of the JSON array `GET /list/{path}` answers with.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ListEntry {
    /// File name (no directory part).
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// File or directory.
    #[serde(rename = "type")]
    pub entry_type: EntryType,
    /// Modification time, seconds since the Unix epoch with a fraction.
    pub mod_time: f64,
}

/// Body of `GET /exists/{path}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExistsResponse {
    /// The path as decoded from the URL.
    pub path: String,
    /// Whether it exists beneath the base directory.
    pub exists: bool,
}

/// Body of the legacy file endpoints' answers other than data: success of `POST /upload` and
/// every error (`403 Access denied`, `404 File not found`, `404 Path is not a directory`, `500
/// ...`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessageResponse {
    /// Human-readable outcome.
    pub message: String,
}

impl MessageResponse {
    /// Builds a message body.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
        }
    }

    /// `403` body for a path outside the base directory.
    pub fn access_denied() -> Self {
        Self::new(ACCESS_DENIED)
    }

    /// `200` body of a successful upload of `filename` (the part's filename, as sent).
    pub fn uploaded(filename: &str) -> Self {
        Self::new(format!("File '{filename}' uploaded successfully."))
    }
}

/// Message of a `403` for a path that escapes the base directory.
pub const ACCESS_DENIED: &str = "Access denied";
/// Message of a `404` from `/download` for a missing file or a directory.
pub const FILE_NOT_FOUND: &str = "File not found";
/// Message of a `404` from `/list` for a path that is not a directory.
pub const NOT_A_DIRECTORY: &str = "Path is not a directory";
/// Prefix of `stderr` when `/execute` could not run the command.
pub const EXECUTE_FAILED_PREFIX: &str = "Failed to execute command: ";

/// Prefix of the `500` message of `/upload` when writing failed.
pub const UPLOAD_FAILED_PREFIX: &str = "File upload failed: ";
/// Prefix of the `500` message of `/list` when reading the directory failed.
pub const LIST_FAILED_PREFIX: &str = "List files failed: ";

/// `422` body of a legacy request that does not validate, in FastAPI's shape:
/// `{"detail": [{"type": "missing", "loc": ["body", "command"], "msg": "Field required"}]}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ValidationErrorResponse {
    /// One element per problem.
    pub detail: Vec<ValidationIssue>,
}

/// One problem of a [`ValidationErrorResponse`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ValidationIssue {
    /// FastAPI's error type: `missing`, `json_invalid`, `value_error`, ...
    #[serde(rename = "type")]
    pub kind: String,
    /// Where: `["body"]`, `["body", "<field>"]`.
    pub loc: Vec<String>,
    /// Human-readable.
    pub msg: String,
}

impl ValidationErrorResponse {
    /// A body with one issue.
    pub fn one(kind: impl Into<String>, loc: &[&str], msg: impl Into<String>) -> Self {
        Self {
            detail: vec![ValidationIssue {
                kind: kind.into(),
                loc: loc.iter().map(|s| (*s).to_owned()).collect(),
                msg: msg.into(),
            }],
        }
    }
}

/// Error body of the router (and of FastAPI validation errors): `{"detail": "..."}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DetailResponse {
    /// What went wrong, naming the sandbox where there is one.
    pub detail: String,
}

impl DetailResponse {
    /// Builds a detail body.
    pub fn new(detail: impl Into<String>) -> Self {
        Self {
            detail: detail.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::{Value, json};

    fn round_trip<T>(value: &T, expected: Value)
    where
        T: Serialize + for<'de> Deserialize<'de> + PartialEq + std::fmt::Debug,
    {
        let encoded = serde_json::to_value(value).unwrap();
        assert_eq!(encoded, expected);
        let decoded: T = serde_json::from_value(expected).unwrap();
        assert_eq!(&decoded, value);
    }

    #[test]
    fn health_body_is_upstreams() {
        assert_eq!(
            serde_json::to_string(&HealthResponse::ok()).unwrap(),
            r#"{"status":"ok","message":"Sandbox Runtime is active."}"#
        );
    }

    #[test]
    fn execute_request_and_response() {
        round_trip(
            &ExecuteRequest::new("python3 -c 'print(1)'"),
            json!({"command": "python3 -c 'print(1)'"}),
        );
        round_trip(
            &ExecuteResponse {
                stdout: "b\n".into(),
                stderr: String::new(),
                exit_code: 0,
                ..ExecuteResponse::default()
            },
            json!({"stdout": "b\n", "stderr": "", "exit_code": 0}),
        );
        // Field order is part of "byte-compatible": FastAPI emits the model's field order.
        assert_eq!(
            serde_json::to_string(&ExecuteResponse::default()).unwrap(),
            r#"{"stdout":"","stderr":"","exit_code":0}"#
        );
    }

    #[test]
    fn execute_extensions_are_optional_and_come_after_upstreams_fields() {
        round_trip(
            &ExecuteRequest {
                command: "cd docs && ls | wc -l".into(),
                shell: Some(true),
                cwd: Some("work".into()),
                env: Some(BTreeMap::from([("A".to_owned(), "1".to_owned())])),
                timeout_seconds: Some(2.5),
                stdin: Some("input".into()),
                max_output_bytes: Some(1024),
            },
            json!({
                "command": "cd docs && ls | wc -l", "shell": true, "cwd": "work", "env": {"A": "1"},
                "timeout_seconds": 2.5, "stdin": "input", "max_output_bytes": 1024,
            }),
        );
        // What the newest upstream SDK sends decodes, with the rest unset.
        let decoded: ExecuteRequest =
            serde_json::from_value(json!({"command": "ls", "timeout_seconds": 60})).unwrap();
        assert_eq!(decoded.timeout_seconds, Some(60.0));
        assert_eq!(decoded.shell, None);
        let response = ExecuteResponse {
            stdout: "x".into(),
            stderr: String::new(),
            exit_code: 124,
            timed_out: Some(true),
            stdout_truncated: Some(false),
            stderr_truncated: Some(true),
            duration_ms: Some(1000),
        };
        assert_eq!(
            serde_json::to_string(&response).unwrap(),
            r#"{"stdout":"x","stderr":"","exit_code":124,"timed_out":true,"stdout_truncated":false,"stderr_truncated":true,"duration_ms":1000}"#
        );
        // An upstream answer decodes, with the extensions absent.
        let upstream: ExecuteResponse =
            serde_json::from_str(r#"{"stdout":"","stderr":"","exit_code":0}"#).unwrap();
        assert_eq!(upstream, ExecuteResponse::default());
    }

    #[test]
    fn execute_request_requires_command() {
        assert!(serde_json::from_value::<ExecuteRequest>(json!({})).is_err());
    }

    #[test]
    fn list_entries() {
        round_trip(
            &vec![
                ListEntry {
                    name: "fib.py".into(),
                    size: 157,
                    entry_type: EntryType::File,
                    mod_time: 1_767_225_600.25,
                },
                ListEntry {
                    name: "docs".into(),
                    size: 4096,
                    entry_type: EntryType::Directory,
                    mod_time: 1_767_225_601.0,
                },
            ],
            json!([
                {"name": "fib.py", "size": 157, "type": "file", "mod_time": 1_767_225_600.25},
                {"name": "docs", "size": 4096, "type": "directory", "mod_time": 1_767_225_601.0},
            ]),
        );
    }

    #[test]
    fn exists_answer() {
        round_trip(
            &ExistsResponse {
                path: "docs/x.txt".into(),
                exists: true,
            },
            json!({"path": "docs/x.txt", "exists": true}),
        );
    }

    #[test]
    fn message_bodies() {
        round_trip(
            &MessageResponse::uploaded("data/input.csv"),
            json!({"message": "File 'data/input.csv' uploaded successfully."}),
        );
        round_trip(
            &MessageResponse::access_denied(),
            json!({"message": "Access denied"}),
        );
        round_trip(
            &MessageResponse::new(FILE_NOT_FOUND),
            json!({"message": "File not found"}),
        );
        round_trip(
            &MessageResponse::new(NOT_A_DIRECTORY),
            json!({"message": "Path is not a directory"}),
        );
    }

    #[test]
    fn detail_body() {
        round_trip(
            &DetailResponse::new("X-Sandbox-ID header is required."),
            json!({"detail": "X-Sandbox-ID header is required."}),
        );
    }
}
