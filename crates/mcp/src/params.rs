//! The tools' arguments as MCP clients send them: upstream's names, types and defaults (the
//! JSON Schemas that `tools/list` shows come from these types and their doc comments), and the
//! checks that turn each into a typed request or a [`ToolError`] naming the argument, the value
//! and what would be accepted. Sans IO.

use std::collections::BTreeMap;
use std::time::Duration;

use agent_sandbox::{MAX_TTL, normalize_mutable_path, normalize_path};
use agent_sandbox_api::labels::SYSTEM_PREFIXES;
use agent_sandbox_api::names::{is_dns_label, is_dns_subdomain, is_label_value, is_qualified_name};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::config::SESSION_LABEL;
use crate::error::ToolError;

/// Default `timeout` of the tools that take one (upstream's).
pub(crate) const DEFAULT_TIMEOUT_SECS: i64 = 60;
/// Largest `timeout` (upstream's).
pub(crate) const MAX_TIMEOUT_SECS: i64 = 600;
/// Default `sandbox_ready_timeout` (upstream's).
pub(crate) const DEFAULT_READY_TIMEOUT_SECS: i64 = 180;
/// Largest `sandbox_ready_timeout`.
pub(crate) const MAX_READY_TIMEOUT_SECS: i64 = 3600;
/// Default `max_entries` of `list_files` (upstream's).
pub(crate) const DEFAULT_MAX_ENTRIES: i64 = 1000;
/// Largest `max_entries` (upstream's).
pub(crate) const MAX_ENTRIES_LIMIT: i64 = 10_000;
/// Default `shutdown_after_seconds` (upstream's).
pub(crate) const DEFAULT_SHUTDOWN_AFTER_SECS: i64 = 300;

fn default_timeout() -> i64 {
    DEFAULT_TIMEOUT_SECS
}

fn default_ready_timeout() -> i64 {
    DEFAULT_READY_TIMEOUT_SECS
}

fn default_max_entries() -> i64 {
    DEFAULT_MAX_ENTRIES
}

fn default_shutdown_after() -> Option<i64> {
    Some(DEFAULT_SHUTDOWN_AFTER_SECS)
}

/// Arguments of `create_sandbox`.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateSandboxArgs {
    /// Name of the SandboxWarmPool to claim a sandbox from (for example python-sandbox-pool).
    pub(crate) warmpool: String,
    /// Kubernetes namespace of the warm pool, where the claim is created. Defaults to the
    /// server's namespace.
    #[serde(default)]
    pub(crate) namespace: Option<String>,
    /// Seconds to wait until the sandbox is ready (1 to 3600).
    #[serde(default = "default_ready_timeout")]
    pub(crate) sandbox_ready_timeout: i64,
    /// Extra labels on the SandboxClaim.
    #[serde(default)]
    pub(crate) labels: Option<BTreeMap<String, String>>,
    /// Seconds the sandbox lives after its last use: every tool call on it pushes its expiry
    /// this far, and it is deleted when nobody used it for this long. null means the default
    /// (300): this server creates no sandbox that never expires.
    #[serde(default = "default_shutdown_after")]
    pub(crate) shutdown_after_seconds: Option<i64>,
    /// Labels added to the sandbox's pod.
    #[serde(default)]
    pub(crate) pod_labels: Option<BTreeMap<String, String>>,
    /// Annotations added to the sandbox's pod.
    #[serde(default)]
    pub(crate) pod_annotations: Option<BTreeMap<String, String>>,
}

/// Arguments of `delete_sandbox`.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct DeleteSandboxArgs {
    /// Name of the sandbox claim, as create_sandbox returned it.
    pub(crate) sandbox_claim_name: String,
    /// Kubernetes namespace of the claim. Defaults to the server's namespace.
    #[serde(default)]
    pub(crate) namespace: Option<String>,
}

/// Arguments of `execute_command`.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ExecuteCommandArgs {
    /// Name of the sandbox claim, as create_sandbox returned it.
    pub(crate) sandbox_claim_name: String,
    /// Kubernetes namespace of the claim. Defaults to the server's namespace.
    #[serde(default)]
    pub(crate) namespace: Option<String>,
    /// A shell command line, run with /bin/sh -c in the sandbox's working directory (pipes,
    /// redirections, && and $(...) work).
    pub(crate) command: String,
    /// Seconds until the command is killed (1 to 600).
    #[serde(default = "default_timeout")]
    pub(crate) timeout: i64,
}

/// Arguments of `upload_file`.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct UploadFileArgs {
    /// Name of the sandbox claim, as create_sandbox returned it.
    pub(crate) sandbox_claim_name: String,
    /// Kubernetes namespace of the claim. Defaults to the server's namespace.
    #[serde(default)]
    pub(crate) namespace: Option<String>,
    /// Path of the file in the sandbox, relative to its working directory (missing parent
    /// directories are created; an existing file is replaced).
    pub(crate) path: String,
    /// The file's content: text, or base64 when binary is true.
    pub(crate) content: String,
    /// Whether content is base64-encoded binary data.
    #[serde(default)]
    pub(crate) binary: bool,
    /// Seconds to wait for the upload (1 to 600).
    #[serde(default = "default_timeout")]
    pub(crate) timeout: i64,
}

/// Arguments of `download_file`.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct DownloadFileArgs {
    /// Name of the sandbox claim, as create_sandbox returned it.
    pub(crate) sandbox_claim_name: String,
    /// Kubernetes namespace of the claim. Defaults to the server's namespace.
    #[serde(default)]
    pub(crate) namespace: Option<String>,
    /// Path of the file in the sandbox, relative to its working directory.
    pub(crate) path: String,
    /// Return the content base64-encoded (needed for files that are not UTF-8 text).
    #[serde(default)]
    pub(crate) binary: bool,
    /// Seconds to wait for the download (1 to 600).
    #[serde(default = "default_timeout")]
    pub(crate) timeout: i64,
}

/// Arguments of `list_files`.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListFilesArgs {
    /// Name of the sandbox claim, as create_sandbox returned it.
    pub(crate) sandbox_claim_name: String,
    /// Kubernetes namespace of the claim. Defaults to the server's namespace.
    #[serde(default)]
    pub(crate) namespace: Option<String>,
    /// The directory to list, relative to the sandbox's working directory ("." for itself).
    pub(crate) path: String,
    /// Seconds to wait for the listing (1 to 600).
    #[serde(default = "default_timeout")]
    pub(crate) timeout: i64,
    /// Most entries returned (1 to 10000); when the directory holds more, truncated is true.
    #[serde(default = "default_max_entries")]
    pub(crate) max_entries: i64,
}

/// Arguments of `file_exists`.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileExistsArgs {
    /// Name of the sandbox claim, as create_sandbox returned it.
    pub(crate) sandbox_claim_name: String,
    /// Kubernetes namespace of the claim. Defaults to the server's namespace.
    #[serde(default)]
    pub(crate) namespace: Option<String>,
    /// Path of the file or directory in the sandbox, relative to its working directory.
    pub(crate) path: String,
    /// Seconds to wait for the answer (1 to 600).
    #[serde(default = "default_timeout")]
    pub(crate) timeout: i64,
}

/// A claim a tool works on: its namespace (`None`: the server's) and name, both checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Target {
    pub(crate) namespace: Option<String>,
    pub(crate) claim: String,
}

/// A checked `create_sandbox`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CreateRequest {
    pub(crate) warmpool: String,
    pub(crate) namespace: Option<String>,
    pub(crate) ready_timeout: Duration,
    /// `None`: the server's default TTL.
    pub(crate) ttl: Option<Duration>,
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) pod_labels: BTreeMap<String, String>,
    pub(crate) pod_annotations: BTreeMap<String, String>,
}

/// A checked `execute_command`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ExecRequest {
    pub(crate) target: Target,
    pub(crate) command: String,
    pub(crate) timeout: Duration,
}

/// A checked `upload_file`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct UploadRequest {
    pub(crate) target: Target,
    pub(crate) path: String,
    pub(crate) data: Vec<u8>,
    pub(crate) timeout: Duration,
}

/// A checked file operation that reads (`download_file`, `list_files`, `file_exists`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ReadRequest {
    pub(crate) target: Target,
    pub(crate) path: String,
    pub(crate) timeout: Duration,
}

impl CreateSandboxArgs {
    pub(crate) fn check(self) -> Result<CreateRequest, ToolError> {
        let warmpool = self.warmpool.trim().to_owned();
        if !is_dns_subdomain(&warmpool) {
            return Err(ToolError::new(format!(
                "warmpool {:?} is not a SandboxWarmPool name (lowercase letters, digits, '-' and \
                 '.'); pass the name of a warm pool in the namespace, for example \
                 python-sandbox-pool (`kubectl get sandboxwarmpools -n NAMESPACE` lists them)",
                self.warmpool
            )));
        }
        let ttl = match self.shutdown_after_seconds {
            None => None,
            Some(seconds) => Some(seconds_in(
                "shutdown_after_seconds",
                seconds,
                1,
                i64::try_from(MAX_TTL.as_secs()).unwrap_or(i64::MAX),
            )?),
        };
        Ok(CreateRequest {
            warmpool,
            namespace: namespace(self.namespace)?,
            ready_timeout: seconds_in(
                "sandbox_ready_timeout",
                self.sandbox_ready_timeout,
                1,
                MAX_READY_TIMEOUT_SECS,
            )?,
            ttl,
            labels: claim_labels(self.labels.unwrap_or_default())?,
            pod_labels: pod_labels(self.pod_labels.unwrap_or_default())?,
            pod_annotations: pod_annotations(self.pod_annotations.unwrap_or_default())?,
        })
    }
}

impl DeleteSandboxArgs {
    pub(crate) fn check(self) -> Result<Target, ToolError> {
        target(self.sandbox_claim_name, self.namespace)
    }
}

impl ExecuteCommandArgs {
    pub(crate) fn check(self) -> Result<ExecRequest, ToolError> {
        if self.command.trim().is_empty() {
            return Err(ToolError::new(
                "command is empty; pass a shell command line, for example `python3 main.py`",
            ));
        }
        if self.command.contains('\0') {
            return Err(ToolError::new(
                "command contains a NUL byte, which no shell line can; write binary data to a \
                 file with upload_file (binary=true) and read it from the command",
            ));
        }
        Ok(ExecRequest {
            target: target(self.sandbox_claim_name, self.namespace)?,
            command: self.command,
            timeout: timeout(self.timeout)?,
        })
    }
}

impl UploadFileArgs {
    pub(crate) fn check(self) -> Result<UploadRequest, ToolError> {
        let data = if self.binary {
            decode_base64(&self.content)?
        } else {
            self.content.into_bytes()
        };
        Ok(UploadRequest {
            target: target(self.sandbox_claim_name, self.namespace)?,
            path: path("upload_file", &self.path, true)?,
            data,
            timeout: timeout(self.timeout)?,
        })
    }
}

impl DownloadFileArgs {
    pub(crate) fn check(self) -> Result<(ReadRequest, bool), ToolError> {
        Ok((
            ReadRequest {
                target: target(self.sandbox_claim_name, self.namespace)?,
                path: path("download_file", &self.path, false)?,
                timeout: timeout(self.timeout)?,
            },
            self.binary,
        ))
    }
}

impl ListFilesArgs {
    pub(crate) fn check(self) -> Result<(ReadRequest, usize), ToolError> {
        let max = integer_in("max_entries", self.max_entries, 1, MAX_ENTRIES_LIMIT, "")?;
        Ok((
            ReadRequest {
                target: target(self.sandbox_claim_name, self.namespace)?,
                path: path("list_files", &self.path, false)?,
                timeout: timeout(self.timeout)?,
            },
            usize::try_from(max).unwrap_or(usize::MAX),
        ))
    }
}

impl FileExistsArgs {
    pub(crate) fn check(self) -> Result<ReadRequest, ToolError> {
        Ok(ReadRequest {
            target: target(self.sandbox_claim_name, self.namespace)?,
            path: path("file_exists", &self.path, false)?,
            timeout: timeout(self.timeout)?,
        })
    }
}

/// A namespace argument: absent or empty is the server's; anything else must be a DNS label.
pub(crate) fn namespace(namespace: Option<String>) -> Result<Option<String>, ToolError> {
    match namespace.map(|n| n.trim().to_owned()) {
        None => Ok(None),
        Some(n) if n.is_empty() => Ok(None),
        Some(n) if is_dns_label(&n) => Ok(Some(n)),
        Some(n) => Err(ToolError::new(format!(
            "namespace {n:?} is not a Kubernetes namespace name (1 to 63 lowercase letters, \
             digits and '-'); pass the namespace the sandbox was created in, or leave it out for \
             the server's namespace"
        ))),
    }
}

fn target(claim: String, namespace_arg: Option<String>) -> Result<Target, ToolError> {
    let claim = claim.trim().to_owned();
    if !is_dns_subdomain(&claim) {
        return Err(ToolError::new(format!(
            "sandbox_claim_name {claim:?} is not a claim name; pass the sandbox_claim_name that \
             create_sandbox returned (like sandbox-claim-x7k2q), or call create_sandbox first"
        )));
    }
    Ok(Target {
        namespace: namespace(namespace_arg)?,
        claim,
    })
}

fn timeout(seconds: i64) -> Result<Duration, ToolError> {
    seconds_in("timeout", seconds, 1, MAX_TIMEOUT_SECS)
}

fn seconds_in(name: &str, seconds: i64, min: i64, max: i64) -> Result<Duration, ToolError> {
    let seconds = integer_in(name, seconds, min, max, " seconds")?;
    Ok(Duration::from_secs(u64::try_from(seconds).unwrap_or(0)))
}

fn integer_in(name: &str, value: i64, min: i64, max: i64, unit: &str) -> Result<i64, ToolError> {
    if (min..=max).contains(&value) {
        Ok(value)
    } else {
        Err(ToolError::new(format!(
            "{name} must be between {min} and {max}{unit}, not {value}"
        )))
    }
}

/// A sandbox path in the SDK's normal form (what it will send), or why it is refused.
fn path(tool: &'static str, path: &str, mutable: bool) -> Result<String, ToolError> {
    let normal = if mutable {
        normalize_mutable_path(tool, path)
    } else {
        normalize_path(tool, path)
    };
    normal.map_err(|error| {
        ToolError::new(format!(
            "{error}; pass a path inside the sandbox's working directory, such as \
             work/main.py or out/result.txt"
        ))
    })
}

fn decode_base64(content: &str) -> Result<Vec<u8>, ToolError> {
    use base64::Engine as _;
    // Line breaks and spaces are how base64 is often wrapped; they carry no data.
    let compact: String = content.chars().filter(|c| !c.is_whitespace()).collect();
    base64::engine::general_purpose::STANDARD
        .decode(compact.as_bytes())
        .map_err(|error| {
            ToolError::new(format!(
                "content is not valid base64 ({error}), which binary=true requires; encode the \
                 bytes with standard base64, or pass binary=false to upload text as it is"
            ))
        })
}

fn claim_labels(labels: BTreeMap<String, String>) -> Result<BTreeMap<String, String>, ToolError> {
    for (key, value) in &labels {
        if key == SESSION_LABEL {
            return Err(ToolError::new(format!(
                "labels must not set {SESSION_LABEL}: the server sets it to tell its own \
                 sandboxes; leave it out"
            )));
        }
        if let Some(prefix) = SYSTEM_PREFIXES.iter().find(|p| key.starts_with(*p)) {
            return Err(ToolError::new(format!(
                "label {key:?} is in the {prefix} domain, which the agent-sandbox controller \
                 owns; use a key of your own, such as example.com/purpose"
            )));
        }
        label(key, value, "labels")?;
    }
    Ok(labels)
}

fn pod_labels(labels: BTreeMap<String, String>) -> Result<BTreeMap<String, String>, ToolError> {
    for (key, value) in &labels {
        label(key, value, "pod_labels")?;
    }
    Ok(labels)
}

fn pod_annotations(
    annotations: BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, ToolError> {
    for key in annotations.keys() {
        if !is_qualified_name(key) {
            return Err(ToolError::new(format!(
                "pod_annotations key {key:?} is not a Kubernetes annotation key (an optional \
                 DNS prefix and '/', then 1 to 63 of letters, digits, '-', '_' and '.')"
            )));
        }
    }
    Ok(annotations)
}

fn label(key: &str, value: &str, argument: &str) -> Result<(), ToolError> {
    if !is_qualified_name(key) {
        return Err(ToolError::new(format!(
            "{argument} key {key:?} is not a Kubernetes label key (an optional DNS prefix and \
             '/', then 1 to 63 of letters, digits, '-', '_' and '.', such as app or \
             example.com/team)"
        )));
    }
    if !is_label_value(value) {
        return Err(ToolError::new(format!(
            "{argument} value {value:?} of {key:?} is not a Kubernetes label value (at most 63 \
             of letters, digits, '-', '_' and '.', starting and ending with a letter or digit)"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use pretty_assertions::assert_eq;
    use serde_json::json;

    use super::*;

    fn args<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
        serde_json::from_value(value).expect("arguments")
    }

    fn error<T: std::fmt::Debug>(result: Result<T, ToolError>) -> String {
        result.expect_err("a tool error").message().to_owned()
    }

    #[test]
    fn create_defaults_are_upstreams() {
        let request = args::<CreateSandboxArgs>(json!({"warmpool": "python-sandbox-pool"}))
            .check()
            .expect("valid");
        assert_eq!(
            request,
            CreateRequest {
                warmpool: "python-sandbox-pool".to_owned(),
                namespace: None,
                ready_timeout: Duration::from_secs(180),
                ttl: Some(Duration::from_secs(300)),
                labels: BTreeMap::new(),
                pod_labels: BTreeMap::new(),
                pod_annotations: BTreeMap::new(),
            }
        );
    }

    #[test]
    fn a_null_ttl_means_the_default_not_forever() {
        let request = args::<CreateSandboxArgs>(json!({
            "warmpool": "p", "namespace": "team-a", "shutdown_after_seconds": null,
            "labels": {"example.com/purpose": "demo"}, "pod_labels": {"app": "x"},
            "pod_annotations": {"note": "anything goes here: even spaces"}
        }))
        .check()
        .expect("valid");
        assert_eq!(request.ttl, None);
        assert_eq!(request.namespace.as_deref(), Some("team-a"));
        assert_eq!(request.labels.len(), 1);
    }

    #[test]
    fn bad_create_arguments_say_what_to_pass() {
        let cases = [
            (
                json!({"warmpool": "Python Pool"}),
                "warmpool \"Python Pool\" is not a SandboxWarmPool name",
            ),
            (
                json!({"warmpool": "p", "shutdown_after_seconds": 0}),
                "shutdown_after_seconds must be between 1 and 315360000 seconds, not 0",
            ),
            (
                json!({"warmpool": "p", "sandbox_ready_timeout": 7200}),
                "sandbox_ready_timeout must be between 1 and 3600 seconds, not 7200",
            ),
            (
                json!({"warmpool": "p", "namespace": "Team_A"}),
                "namespace \"Team_A\" is not a Kubernetes namespace name",
            ),
            (
                json!({"warmpool": "p", "labels": {SESSION_LABEL: "x"}}),
                "labels must not set mcp.k8s-agent-sandbox/session-id",
            ),
            (
                json!({"warmpool": "p", "labels": {"agents.x-k8s.io/created-by": "me"}}),
                "is in the agents.x-k8s.io/ domain",
            ),
            (
                json!({"warmpool": "p", "labels": {"app": "has space"}}),
                "labels value \"has space\" of \"app\" is not a Kubernetes label value",
            ),
            (
                json!({"warmpool": "p", "pod_labels": {"bad key!": "x"}}),
                "pod_labels key \"bad key!\" is not a Kubernetes label key",
            ),
            (
                json!({"warmpool": "p", "pod_annotations": {"/x": "x"}}),
                "pod_annotations key \"/x\" is not a Kubernetes annotation key",
            ),
        ];
        for (value, expected) in cases {
            let message = error(args::<CreateSandboxArgs>(value.clone()).check());
            assert!(message.contains(expected), "{value}: {message}");
        }
    }

    #[test]
    fn timeouts_are_between_1_and_600_seconds() {
        let exec = |timeout: i64| {
            args::<ExecuteCommandArgs>(json!({
                "sandbox_claim_name": "sandbox-claim-abc", "command": "ls", "timeout": timeout
            }))
            .check()
        };
        assert_eq!(exec(600).map(|r| r.timeout), Ok(Duration::from_secs(600)));
        assert_eq!(
            error(exec(0)),
            "timeout must be between 1 and 600 seconds, not 0"
        );
        assert_eq!(
            error(exec(601)),
            "timeout must be between 1 and 600 seconds, not 601"
        );
        let defaulted = args::<ExecuteCommandArgs>(json!({
            "sandbox_claim_name": "sandbox-claim-abc", "namespace": "default", "command": "ls"
        }))
        .check()
        .expect("valid");
        assert_eq!(
            defaulted,
            ExecRequest {
                target: Target {
                    namespace: Some("default".to_owned()),
                    claim: "sandbox-claim-abc".to_owned()
                },
                command: "ls".to_owned(),
                timeout: Duration::from_secs(60),
            }
        );
    }

    #[test]
    fn commands_and_claim_names_are_checked() {
        let message = error(
            args::<ExecuteCommandArgs>(json!({"sandbox_claim_name": "c", "command": "  "})).check(),
        );
        assert!(message.starts_with("command is empty"), "{message}");
        let message = error(
            args::<ExecuteCommandArgs>(json!({"sandbox_claim_name": "../etc", "command": "ls"}))
                .check(),
        );
        assert!(
            message.starts_with("sandbox_claim_name \"../etc\" is not a claim name"),
            "{message}"
        );
    }

    #[test]
    fn paths_are_the_sdks_normal_form_or_refused() {
        let upload = |path: &str| {
            args::<UploadFileArgs>(json!({
                "sandbox_claim_name": "c", "path": path, "content": "x"
            }))
            .check()
        };
        assert_eq!(
            upload("./work/../out/a.txt").map(|r| r.path),
            Ok("out/a.txt".to_owned())
        );
        let message = error(upload("../../etc/passwd"));
        assert!(
            message.contains("it leads outside the sandbox's base directory")
                && message.contains("pass a path inside"),
            "{message}"
        );
        let message = error(upload("."));
        assert!(message.contains("base directory"), "{message}");
        let listed = args::<ListFilesArgs>(json!({"sandbox_claim_name": "c", "path": "."}))
            .check()
            .expect("the base directory can be listed");
        assert_eq!((listed.0.path.as_str(), listed.1), ("", 1000));
    }

    #[test]
    fn binary_uploads_are_base64() {
        let upload = |content: &str| {
            args::<UploadFileArgs>(json!({
                "sandbox_claim_name": "c", "path": "a.bin", "content": content, "binary": true
            }))
            .check()
        };
        assert_eq!(upload("AAEC\n/w==").map(|r| r.data), Ok(vec![0, 1, 2, 255]));
        let message = error(upload("not base64!"));
        assert!(
            message.starts_with("content is not valid base64"),
            "{message}"
        );
    }

    #[test]
    fn max_entries_is_bounded() {
        let list = |max: i64| {
            args::<ListFilesArgs>(json!({
                "sandbox_claim_name": "c", "path": "", "max_entries": max
            }))
            .check()
        };
        assert_eq!(list(10_000).map(|r| r.1), Ok(10_000));
        assert_eq!(
            error(list(10_001)),
            "max_entries must be between 1 and 10000, not 10001"
        );
    }

    #[test]
    fn unknown_arguments_are_refused() {
        let parsed = serde_json::from_value::<FileExistsArgs>(json!({
            "sandbox_claim_name": "c", "path": "x", "time_out": 5
        }));
        let message = parsed.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains("unknown field `time_out`"), "{message}");
    }

    #[test]
    fn schemas_show_upstreams_defaults() {
        let schema =
            serde_json::to_value(schemars::schema_for!(CreateSandboxArgs)).expect("schema");
        assert_eq!(schema["required"], json!(["warmpool"]));
        assert_eq!(
            schema["properties"]["shutdown_after_seconds"]["default"],
            json!(300)
        );
        assert_eq!(
            schema["properties"]["sandbox_ready_timeout"]["default"],
            json!(180)
        );
        let schema = serde_json::to_value(schemars::schema_for!(ListFilesArgs)).expect("schema");
        assert_eq!(schema["properties"]["max_entries"]["default"], json!(1000));
        assert_eq!(schema["properties"]["timeout"]["default"], json!(60));
        assert_eq!(schema["additionalProperties"], json!(false));
    }
}
