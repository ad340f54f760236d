//! JSON of the runtime server on port 8888, as upstream's python runtime speaks it.
//!
//! These are the legacy endpoints every upstream SDK uses (`../shared/spec/upstream-compat.md`
//! §4.1). Field names, types and shapes are pinned by tests below; our runtime's extensions are
//! added as optional request fields and additional response fields only, so an old client keeps
//! working.

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

/// Body of `POST /execute` as upstream clients send it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecuteRequest {
    /// The command line, split shlex-style and run without a shell.
    pub command: String,
}

/// Body of a `POST /execute` answer (always HTTP 200, also when the command could not start).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecuteResponse {
    /// Standard output, decoded as UTF-8 (invalid sequences replaced).
    pub stdout: String,
    /// Standard error, or `Failed to execute command: ...` when the command could not run.
    pub stderr: String,
    /// Exit status; non-zero on any failure.
    pub exit_code: i32,
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
            &ExecuteRequest {
                command: "python3 -c 'print(1)'".into(),
            },
            json!({"command": "python3 -c 'print(1)'"}),
        );
        round_trip(
            &ExecuteResponse {
                stdout: "b\n".into(),
                stderr: String::new(),
                exit_code: 0,
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
