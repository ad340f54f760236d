//! [`SandboxServer`]: the MCP handler: upstream's seven tools over the SDK (claims, streamed
//! exec, files), the resource template `sandboxes://{namespace}`, and the translation of every
//! failure into a tool result an LLM can act on (bad arguments, claims that are gone or not
//! this session's, timeouts, files too large or not text).
//!
//! Each tool checks its arguments first (`params`), then resolves the claim through the
//! session (ownership), pushes its expiry (`Session::touch`), and only then talks to the
//! sandbox, within the tool's `timeout`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_sandbox::{Client, CreateOptions, ExecEvent, ExecOptions, FileType, Progress};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListResourceTemplatesResult, ListResourcesResult, PaginatedRequestParams,
    ProgressNotificationParam, ProgressToken, ReadResourceRequestParams, ReadResourceResponse,
    ReadResourceResult, Resource, ResourceContents, ResourceTemplate, ServerCapabilities,
    ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, Json, Peer, RoleServer, ServerHandler, tool, tool_handler, tool_router};
use schemars::JsonSchema;
use serde::Serialize;
use tokio::io::AsyncReadExt as _;

use crate::config::{McpConfig, SESSION_LABEL};
use crate::error::{ToolError, chain};
use crate::fit::{
    MAX_RESULT_BYTES, encoded_len, error_len, largest_fitting, structured_len, within_budget,
};
use crate::output::{CappedOutput, Captured, ProgressBatch};
use crate::params::{
    self, CreateSandboxArgs, DeleteSandboxArgs, DownloadFileArgs, ExecuteCommandArgs,
    FileExistsArgs, ListFilesArgs, ReadRequest, UploadFileArgs,
};
use crate::session::{Owned, Session};

/// The tools, by name: upstream's.
pub const TOOL_NAMES: [&str; 7] = [
    "create_sandbox",
    "delete_sandbox",
    "execute_command",
    "upload_file",
    "download_file",
    "list_files",
    "file_exists",
];

/// URI scheme of the resource template (upstream's).
const RESOURCE_SCHEME: &str = "sandboxes://";
/// Name of the resource template (upstream's).
const RESOURCE_NAME: &str = "get_sandboxes";

/// Largest output one progress notification carries.
const PROGRESS_BYTES: usize = 4096;
/// Least time between two progress notifications (unless one is full).
const PROGRESS_INTERVAL: Duration = Duration::from_millis(250);
/// How long past its timeout `execute_command` waits for the command's exit status (the
/// runtime kills it at the timeout and reports that).
const EXIT_GRACE: Duration = Duration::from_secs(30);

const INSTRUCTIONS: &str = "\
Tools to run code in isolated, disposable Kubernetes sandboxes. Call create_sandbox with a \
warm pool (for example python-sandbox-pool) to get a sandbox_claim_name, then pass that name to \
execute_command, upload_file, download_file, list_files and file_exists, and call \
delete_sandbox when done. Paths are relative to the sandbox's working directory. A sandbox \
that goes unused for its shutdown_after_seconds (default 300) is deleted by itself.";

/// The MCP handler. Cheap to clone: clones (one per HTTP session) share one session of
/// claims.
#[derive(Clone, Debug)]
pub struct SandboxServer {
    session: Arc<Session>,
    tool_router: ToolRouter<Self>,
}

/// What `create_sandbox` returns.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct CreateSandboxOutput {
    /// Name of the new sandbox claim: pass it to the other tools.
    pub(crate) sandbox_claim_name: String,
    /// Namespace of the claim.
    pub(crate) namespace: String,
    /// Seconds the sandbox lives after its last use.
    pub(crate) shutdown_after_seconds: u64,
}

/// What `delete_sandbox` returns.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct DeleteSandboxOutput {
    /// The deleted claim.
    pub(crate) sandbox_claim_name: String,
    /// Its namespace.
    pub(crate) namespace: String,
    /// Always true: a failed deletion is an error.
    pub(crate) deleted: bool,
}

/// What `execute_command` returns.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct ExecuteCommandOutput {
    /// The command's exit code (128 + N when signal N ended it).
    pub(crate) exit_code: i32,
    /// Its standard output (bytes that are not UTF-8 shown as U+FFFD).
    pub(crate) stdout: String,
    /// Its standard error.
    pub(crate) stderr: String,
    /// Part of stdout was left out (the text says where and how much).
    pub(crate) stdout_truncated: bool,
    /// Part of stderr was left out (the text says where and how much).
    pub(crate) stderr_truncated: bool,
}

/// What `upload_file` returns.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct UploadFileOutput {
    /// Bytes written to the file.
    pub(crate) bytes_written: u64,
}

/// What `download_file` returns.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct DownloadFileOutput {
    /// The file's content: text, or base64 when binary was true.
    pub(crate) content: String,
    /// Bytes read from the file.
    pub(crate) bytes_read: u64,
}

/// Kind of a directory entry.
#[derive(Clone, Copy, Debug, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum EntryType {
    /// A regular file.
    File,
    /// A directory.
    Directory,
    /// A symbolic link (not followed).
    Symlink,
    /// A socket, FIFO or device.
    Other,
}

/// One entry of `list_files`.
#[derive(Clone, Debug, Serialize, JsonSchema)]
pub(crate) struct FileEntryOutput {
    /// Name of the entry (one path component).
    pub(crate) name: String,
    /// Size in bytes.
    pub(crate) size: u64,
    /// file, directory, symlink or other.
    #[serde(rename = "type")]
    pub(crate) entry_type: EntryType,
    /// Last modification time as a POSIX timestamp (seconds).
    pub(crate) mod_time: f64,
}

/// What `list_files` returns.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct ListFilesOutput {
    /// Entries of the directory, sorted by name, at most max_entries.
    pub(crate) entries: Vec<FileEntryOutput>,
    /// Entries in the directory before truncation.
    pub(crate) total_entries: usize,
    /// The directory holds more entries than were returned: narrow the path, or list with
    /// execute_command.
    pub(crate) truncated: bool,
}

/// What `file_exists` returns.
#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct FileExistsOutput {
    /// Whether the path exists (a file, directory or anything else).
    pub(crate) exists: bool,
}

/// Where progress notifications of a tool call go, when the client asked for them.
struct Reporter {
    token: ProgressToken,
    peer: Peer<RoleServer>,
}

impl Reporter {
    fn of(context: &RequestContext<RoleServer>) -> Option<Self> {
        Some(Self {
            token: context.meta.get_progress_token()?,
            peer: context.peer.clone(),
        })
    }

    async fn send(&self, progress: f64, message: String) {
        let notification =
            ProgressNotificationParam::new(self.token.clone(), progress).with_message(message);
        if let Err(error) = self.peer.notify_progress(notification).await {
            tracing::debug!(%error, "could not send a progress notification");
        }
    }
}

/// `error` of `what` (a tool's operation on `claim`, at `path` if it has one) as a message an
/// LLM can act on (sans IO).
fn explain(what: &str, claim: &str, path: Option<&str>, error: &agent_sandbox::Error) -> ToolError {
    use agent_sandbox::Error as E;
    let detail = chain(error);
    if error.status() == Some(404)
        && let Some(path) = path
    {
        return ToolError::new(format!(
            "No such file or directory '{path}' in sandbox claim '{claim}'. Paths are relative \
             to the sandbox's working directory; list_files shows what is there."
        ));
    }
    let hint = match error.last_attempt() {
        E::InvalidPath { .. } => "pass a path inside the sandbox's working directory",
        E::UnsafeName { .. } => {
            "the sandbox answered a name that is not a plain file name, so the listing is not \
             trusted; look at the directory with execute_command (ls -la) instead"
        }
        E::Timeout { .. } => "retry with a larger timeout (at most 600 seconds)",
        E::Decode { .. } if what.starts_with("list") => {
            "the path may be a file rather than a directory; file_exists and download_file work \
             on files"
        }
        E::Http { status: 409, .. } => {
            "the path is neither a regular file nor a directory (a socket, FIFO or device)"
        }
        E::Http { status: 400, .. } => "check the path and the arguments",
        E::Http { status: 403, .. } | E::Http { status: 401, .. } => {
            "the router refused this server's credentials (its connection flags: router token \
             or signing key); the server's operator must fix them"
        }
        _ => "retry in a moment; if it keeps failing, delete the sandbox and create a new one",
    };
    ToolError::new(format!(
        "Failed to {what} in sandbox claim '{claim}': {detail}. What to do: {hint}."
    ))
}

/// The tool error of a call whose arguments did not parse (`message` is serde's), with the
/// arguments the tool takes (sans IO).
fn bad_arguments(tool: &str, message: &str) -> String {
    let detail = message
        .strip_prefix("failed to deserialize parameters:")
        .unwrap_or(message)
        .trim();
    let signature = match tool {
        "create_sandbox" => {
            "warmpool: str, namespace: str = the server's, sandbox_ready_timeout: int = 180, \
             labels: dict = null, shutdown_after_seconds: int = 300, pod_labels: dict = null, \
             pod_annotations: dict = null"
        }
        "delete_sandbox" => "sandbox_claim_name: str, namespace: str = the server's",
        "execute_command" => {
            "sandbox_claim_name: str, namespace: str = the server's, command: str, timeout: int \
             = 60"
        }
        "upload_file" => {
            "sandbox_claim_name: str, namespace: str = the server's, path: str, content: str, \
             binary: bool = false, timeout: int = 60"
        }
        "download_file" => {
            "sandbox_claim_name: str, namespace: str = the server's, path: str, binary: bool = \
             false, timeout: int = 60"
        }
        "list_files" => {
            "sandbox_claim_name: str, namespace: str = the server's, path: str, timeout: int = \
             60, max_entries: int = 1000"
        }
        "file_exists" => {
            "sandbox_claim_name: str, namespace: str = the server's, path: str, timeout: int = 60"
        }
        _ => "see tools/list",
    };
    format!("Invalid arguments for {tool}: {detail}. It takes: {signature}.")
}

/// `error` of `operation` within a tool's `timeout`.
fn timed_out(tool: &str, timeout: Duration) -> ToolError {
    ToolError::new(format!(
        "{tool} did not finish within its timeout of {} seconds. Retry with a larger timeout (at \
         most 600); for long jobs start them in the background with execute_command (nohup CMD \
         > job.log 2>&1 &) and read job.log in later calls.",
        timeout.as_secs()
    ))
}

/// The namespace of `uri` (`sandboxes://NAMESPACE`), if it is one of ours (sans IO).
fn resource_namespace(uri: &str) -> Option<Result<String, ToolError>> {
    let rest = uri.strip_prefix(RESOURCE_SCHEME)?;
    let namespace = rest.trim_end_matches('/');
    Some(
        params::namespace(Some(namespace.to_owned()))
            .and_then(|n| n.ok_or_else(|| ToolError::new("the URI names no namespace"))),
    )
}

#[tool_router]
impl SandboxServer {
    /// A server working through `client` (its namespace is the default of every tool).
    pub fn new(client: Client, config: McpConfig) -> Self {
        Self {
            session: Arc::new(Session::new(client, config)),
            tool_router: Self::tool_router(),
        }
    }

    /// The session id on this server's claims ([`SESSION_LABEL`]).
    pub fn session_id(&self) -> &str {
        self.session.id()
    }

    /// Deletes the claims this server created (when [`McpConfig::delete_on_exit`]): call when
    /// the server stops.
    pub async fn close(&self) {
        self.session.close().await;
    }

    #[tool(
        description = "Create a sandbox: claim one from a warm pool and wait until it is ready. \
                       Returns its sandbox_claim_name, which the other tools take. The sandbox \
                       is deleted after shutdown_after_seconds without use (every tool call on \
                       it pushes that back), or by delete_sandbox.",
        annotations(title = "Create a sandbox", open_world_hint = true)
    )]
    async fn create_sandbox(
        &self,
        Parameters(args): Parameters<CreateSandboxArgs>,
        context: RequestContext<RoleServer>,
    ) -> Result<Json<CreateSandboxOutput>, ToolError> {
        let request = args.check()?;
        let namespace = self.session.namespace(request.namespace.as_deref());
        let client = self.session.client(&namespace);
        let ttl = request.ttl.unwrap_or(self.session.config().default_ttl);
        let mut options = CreateOptions::default()
            .ready_timeout(request.ready_timeout)
            .shutdown_after(ttl);
        options.labels = request.labels;
        options
            .labels
            .insert(SESSION_LABEL.to_owned(), self.session.id().to_owned());
        options.pod_labels = request.pod_labels;
        options.pod_annotations = request.pod_annotations;
        let (steps_tx, steps_rx) = tokio::sync::mpsc::unbounded_channel();
        let options = options.on_progress(move |step| {
            let _ = steps_tx.send(step.clone());
        });
        let create = client.create_sandbox_with(&request.warmpool, options);
        let (outcome, created) = created_or_cancelled(create, steps_rx, &context).await;
        let Some(outcome) = outcome else {
            if let Some(claim) = created
                && let Err(error) = client.delete(&claim).await
            {
                tracing::warn!(
                    %claim,
                    error = %chain(&error),
                    "could not delete the claim of a cancelled create_sandbox"
                );
            }
            return Err(ToolError::new("create_sandbox was cancelled by the client"));
        };
        let sandbox = match outcome {
            Ok(sandbox) => sandbox,
            Err(error) => return Err(self.create_failed(&client, &request.warmpool, error).await),
        };
        let name = sandbox.claim_name().to_owned();
        tracing::info!(
            claim = %name,
            %namespace,
            pool = %request.warmpool,
            ttl = ?ttl,
            "created a sandbox"
        );
        self.session.adopt(sandbox, ttl);
        Ok(Json(CreateSandboxOutput {
            sandbox_claim_name: name,
            namespace,
            shutdown_after_seconds: ttl.as_secs(),
        }))
    }

    #[tool(
        description = "Delete a sandbox created by create_sandbox (its files and processes go \
                       with it).",
        annotations(
            title = "Delete a sandbox",
            destructive_hint = true,
            idempotent_hint = true
        )
    )]
    async fn delete_sandbox(
        &self,
        Parameters(args): Parameters<DeleteSandboxArgs>,
    ) -> Result<Json<DeleteSandboxOutput>, ToolError> {
        let target = args.check()?;
        let namespace = self.session.namespace(target.namespace.as_deref());
        self.session.delete(&namespace, &target.claim).await?;
        tracing::info!(claim = %target.claim, %namespace, "deleted a sandbox");
        Ok(Json(DeleteSandboxOutput {
            sandbox_claim_name: target.claim,
            namespace,
            deleted: true,
        }))
    }

    #[tool(
        description = "Run a shell command line in a sandbox (/bin/sh -c, in its working \
                       directory) and return its exit code, stdout and stderr. Output is \
                       streamed as progress notifications while it runs, when the client asks \
                       for progress. Each of stdout and stderr returns at most a fixed size \
                       (64 KiB by default), and less when the whole result would not fit in \
                       one MCP message (1 MiB): longer output keeps its beginning and end and \
                       says how much was left out. A command still running at timeout is killed.",
        annotations(title = "Run a command in a sandbox", open_world_hint = true)
    )]
    async fn execute_command(
        &self,
        Parameters(args): Parameters<ExecuteCommandArgs>,
        context: RequestContext<RoleServer>,
    ) -> Result<Json<ExecuteCommandOutput>, ToolError> {
        let request = args.check()?;
        let owned = self.owned(&request.target).await?;
        self.session.touch(&owned, request.timeout).await?;
        let reporter = Reporter::of(&context);
        let run = self.run(&owned, request.command, request.timeout, reporter.as_ref());
        tokio::select! {
            outcome = run => outcome,
            // Dropping the stream closes the connection, and the runtime kills the command.
            () = context.ct.cancelled() => Err(ToolError::new(
                "execute_command was cancelled by the client; the command was killed",
            )),
        }
    }

    #[tool(
        description = "Write a file in a sandbox (parent directories are created, an existing \
                       file is replaced). content is text, or base64 with binary=true.",
        annotations(title = "Upload a file to a sandbox", idempotent_hint = true)
    )]
    async fn upload_file(
        &self,
        Parameters(args): Parameters<UploadFileArgs>,
    ) -> Result<Json<UploadFileOutput>, ToolError> {
        let request = args.check()?;
        let owned = self.owned(&request.target).await?;
        self.session.touch(&owned, request.timeout).await?;
        let bytes = request.data.len() as u64;
        let write = owned.sandbox.write(&request.path, request.data);
        match tokio::time::timeout(request.timeout, write).await {
            Err(_) => Err(timed_out("upload_file", request.timeout)),
            Ok(Err(error)) => Err(self
                .failed(&owned, &format!("write {}", request.path), None, error)
                .await),
            Ok(Ok(())) => Ok(Json(UploadFileOutput {
                bytes_written: bytes,
            })),
        }
    }

    #[tool(
        description = "Read a file from a sandbox. Text files come back as they are; set \
                       binary=true for any other file to get it base64-encoded. Files larger \
                       than the server's limit (256 KiB by default), or whose content would not \
                       fit in one MCP message (1 MiB) once encoded, are refused: read part of \
                       them with execute_command (head, tail, sed -n).",
        annotations(title = "Download a file from a sandbox", read_only_hint = true)
    )]
    async fn download_file(
        &self,
        Parameters(args): Parameters<DownloadFileArgs>,
    ) -> Result<Json<DownloadFileOutput>, ToolError> {
        let (request, binary) = args.check()?;
        let owned = self.owned(&request.target).await?;
        self.session.touch(&owned, request.timeout).await?;
        let max = self.session.config().max_file_bytes;
        let read = async {
            let download = owned.sandbox.download(&request.path).await.map_err(Ok)?;
            if let Some(length) = download.content_length()
                && length > max
            {
                return Ok(Err(length));
            }
            let mut bytes = Vec::new();
            download
                .take(max.saturating_add(1))
                .read_to_end(&mut bytes)
                .await
                .map_err(Err)?;
            if bytes.len() as u64 > max {
                return Ok(Err(bytes.len() as u64));
            }
            Ok(Ok(bytes))
        };
        let bytes = match tokio::time::timeout(request.timeout, read).await {
            Err(_) => return Err(timed_out("download_file", request.timeout)),
            Ok(Err(Ok(error))) => {
                return Err(self
                    .failed(&owned, "read", Some(&request.path), error)
                    .await);
            }
            Ok(Err(Err(error))) => {
                return Err(ToolError::new(format!(
                    "Failed to read '{}' in sandbox claim '{}': the download broke off ({error}). \
                     Retry in a moment.",
                    request.path,
                    owned.sandbox.claim_name()
                )));
            }
            Ok(Ok(Err(size))) => {
                return Err(ToolError::new(format!(
                    "'{}' is {}{size} bytes, more than the {max} bytes download_file returns. \
                     Read the part you need with execute_command (head -c, tail -c, sed -n, \
                     grep), or compress or split it first.",
                    request.path,
                    if size > max { "at least " } else { "" },
                )));
            }
            Ok(Ok(Ok(bytes))) => bytes,
        };
        let bytes_read = bytes.len() as u64;
        let content = if binary {
            use base64::Engine as _;
            base64::engine::general_purpose::STANDARD.encode(&bytes)
        } else {
            String::from_utf8(bytes).map_err(|error| {
                ToolError::new(format!(
                    "'{}' is not UTF-8 text (invalid byte at offset {}); call download_file \
                     again with binary=true to get its content base64-encoded",
                    request.path,
                    error.utf8_error().valid_up_to()
                ))
            })?
        };
        let output = DownloadFileOutput {
            content,
            bytes_read,
        };
        let encoded = structured_len(&output);
        if encoded > MAX_RESULT_BYTES {
            return Err(too_large_to_return(
                &request.path,
                bytes_read,
                encoded,
                binary,
                MAX_RESULT_BYTES,
            ));
        }
        Ok(Json(output))
    }

    #[tool(
        description = "List a directory in a sandbox: name, size, type (file, directory, \
                       symlink, other) and mod_time (POSIX seconds) of each entry, at most \
                       max_entries of them (fewer when they would not fit in one MCP message, \
                       1 MiB); total_entries counts them all, and truncated says when some were \
                       left out.",
        annotations(title = "List files in a sandbox", read_only_hint = true)
    )]
    async fn list_files(
        &self,
        Parameters(args): Parameters<ListFilesArgs>,
    ) -> Result<Json<ListFilesOutput>, ToolError> {
        let (request, max_entries) = args.check()?;
        let owned = self.owned(&request.target).await?;
        self.session.touch(&owned, request.timeout).await?;
        let entries = self
            .read(&owned, &request, "list", owned.sandbox.list(&request.path))
            .await?;
        let total_entries = entries.len();
        let entries: Vec<FileEntryOutput> = entries
            .into_iter()
            .take(max_entries)
            .map(|entry| FileEntryOutput {
                mod_time: entry
                    .modified_at
                    .parse::<jiff::Timestamp>()
                    .map(|t| t.as_millisecond() as f64 / 1000.0)
                    .unwrap_or(0.0),
                entry_type: match entry.file_type {
                    FileType::File => EntryType::File,
                    FileType::Directory => EntryType::Directory,
                    FileType::Symlink => EntryType::Symlink,
                    FileType::Other => EntryType::Other,
                },
                name: entry.name,
                size: entry.size,
            })
            .collect();
        Ok(Json(listing(entries, total_entries, MAX_RESULT_BYTES)))
    }

    #[tool(
        description = "Check whether a file or directory exists in a sandbox. A missing path is \
                       exists=false, not an error.",
        annotations(title = "Check a path in a sandbox", read_only_hint = true)
    )]
    async fn file_exists(
        &self,
        Parameters(args): Parameters<FileExistsArgs>,
    ) -> Result<Json<FileExistsOutput>, ToolError> {
        let request = args.check()?;
        let owned = self.owned(&request.target).await?;
        self.session.touch(&owned, request.timeout).await?;
        let exists = self
            .read(
                &owned,
                &request,
                "stat",
                owned.sandbox.exists(&request.path),
            )
            .await?;
        Ok(Json(FileExistsOutput { exists }))
    }
}

impl SandboxServer {
    /// The claim of a tool call, if it is this session's.
    async fn owned(&self, target: &params::Target) -> Result<Owned, ToolError> {
        let namespace = self.session.namespace(target.namespace.as_deref());
        self.session.owned(&namespace, &target.claim).await
    }

    /// A failed operation on a claim: the claim being gone explains it best; else `explain`.
    async fn failed(
        &self,
        owned: &Owned,
        what: &str,
        path: Option<&str>,
        error: agent_sandbox::Error,
    ) -> ToolError {
        if matches!(error, agent_sandbox::Error::ClaimNotFound { .. })
            || self.session.is_gone(owned).await
        {
            return self.session.gone(owned);
        }
        explain(what, owned.sandbox.claim_name(), path, &error)
    }

    /// A read-only operation within the request's timeout.
    async fn read<T>(
        &self,
        owned: &Owned,
        request: &ReadRequest,
        what: &str,
        operation: impl Future<Output = agent_sandbox::Result<T>>,
    ) -> Result<T, ToolError> {
        match tokio::time::timeout(request.timeout, operation).await {
            Err(_) => Err(timed_out(what, request.timeout)),
            Ok(Err(error)) => Err(self.failed(owned, what, Some(&request.path), error).await),
            Ok(Ok(value)) => Ok(value),
        }
    }

    /// Why `create_sandbox` failed, with what to do (the pools there when the pool is
    /// missing).
    async fn create_failed(
        &self,
        client: &Client,
        pool: &str,
        error: agent_sandbox::Error,
    ) -> ToolError {
        use agent_sandbox::Error as E;
        let namespace = client.namespace();
        let detail = chain(&error);
        match &error {
            E::WarmPoolNotFound { .. } => {
                let pools = match client.warm_pools().await {
                    Ok(pools) if pools.is_empty() => "there is none".to_owned(),
                    Ok(pools) => format!(
                        "there: {}",
                        pools
                            .iter()
                            .map(|p| p.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    Err(_) => "(they could not be listed)".to_owned(),
                };
                ToolError::new(format!(
                    "Warm pool '{pool}' is not found in namespace '{namespace}'; warm pools \
                     {pools}. Pass one of them as warmpool, or the namespace that has the pool."
                ))
            }
            E::ClaimTimeout { .. } => ToolError::new(format!(
                "No sandbox of warm pool '{pool}' was ready in time ({detail}); the claim was \
                 deleted. Retry with a larger sandbox_ready_timeout, or try again later: the \
                 pool may be empty or its sandboxes starting."
            )),
            _ => ToolError::new(format!(
                "Failed to create a sandbox from warm pool '{pool}' in namespace \
                 '{namespace}': {detail}. Check the warm pool and namespace, and retry in a \
                 moment."
            )),
        }
    }

    /// Runs `command`, streaming its output to `reporter`, and returns what it printed.
    async fn run(
        &self,
        owned: &Owned,
        command: String,
        timeout: Duration,
        reporter: Option<&Reporter>,
    ) -> Result<Json<ExecuteCommandOutput>, ToolError> {
        let options = ExecOptions::shell(command).timeout(timeout);
        let mut events = match owned.sandbox.exec_stream(options).await {
            Ok(events) => events,
            Err(error) => return Err(self.failed(owned, "run the command", None, error).await),
        };
        let cap = self.session.config().max_output_bytes;
        let (mut stdout, mut stderr) = (CappedOutput::new(cap), CappedOutput::new(cap));
        let mut batch = ProgressBatch::new(PROGRESS_BYTES, PROGRESS_INTERVAL, Instant::now());
        let deadline = tokio::time::Instant::now() + timeout + EXIT_GRACE;
        let exit = loop {
            let flush = batch.due().filter(|_| reporter.is_some());
            let event = tokio::select! {
                event = events.next_event() => event,
                () = sleep_until(flush) => {
                    let message = batch.take(Instant::now(), false);
                    if let (Some(reporter), Some(message)) = (reporter, message) {
                        reporter.send(message.progress, message.message).await;
                    }
                    continue;
                }
                () = tokio::time::sleep_until(deadline) => {
                    return Err(ToolError::new(format!(
                        "execute_command got no exit status {} seconds after the command's \
                         timeout of {} seconds; the sandbox may be overloaded or unreachable. \
                         Check it with a short command, or delete it and create a new one.",
                        EXIT_GRACE.as_secs(),
                        timeout.as_secs()
                    )));
                }
            };
            match event {
                None => {
                    return Err(ToolError::new(
                        "the command's output ended without an exit status (the sandbox may \
                         have restarted or been deleted); the command may or may not have \
                         finished. Check with file_exists or a short command before retrying.",
                    ));
                }
                Some(Err(error)) => {
                    return Err(self
                        .failed(owned, "read the command's output", None, error)
                        .await);
                }
                Some(Ok(ExecEvent::Stdout(chunk))) => {
                    let bytes = chunk.bytes().unwrap_or_default();
                    stdout.push(&bytes);
                    batch.push(false, &bytes);
                }
                Some(Ok(ExecEvent::Stderr(chunk))) => {
                    let bytes = chunk.bytes().unwrap_or_default();
                    stderr.push(&bytes);
                    batch.push(true, &bytes);
                }
                Some(Ok(ExecEvent::Exit(exit))) => break exit,
                Some(Ok(ExecEvent::Error(body))) => {
                    return Err(ToolError::new(format!(
                        "the sandbox stopped the command's output: {}; the command may or may \
                         not have finished. Retry, or check its effects first.",
                        body.message
                    )));
                }
                Some(Ok(_)) => {}
            }
        };
        if let Some(reporter) = reporter
            && let Some(message) = batch.take(Instant::now(), true)
        {
            reporter.send(message.progress, message.message).await;
        }
        let streams = Streams {
            stdout: &stdout,
            stderr: &stderr,
            stdout_cut: exit.stdout_truncated,
            stderr_cut: exit.stderr_truncated,
        };
        if exit.timed_out {
            return Err(streams.timed_out(timeout, MAX_RESULT_BYTES));
        }
        let exit_code = match (exit.exit_code, exit.signal) {
            (Some(code), _) => code,
            (None, Some(signal)) => 128 + signal,
            (None, None) => -1,
        };
        Ok(Json(streams.output(exit_code, MAX_RESULT_BYTES)))
    }

    fn resource_template() -> ResourceTemplate {
        ResourceTemplate::new(format!("{RESOURCE_SCHEME}{{namespace}}"), RESOURCE_NAME)
            .with_title("Sandboxes of this session")
            .with_description(
                "The sandbox_claim_names this server created in this session in a namespace \
                 (a JSON array).",
            )
            .with_mime_type("application/json")
    }
}

/// The first of `entries` that fit in one MCP result with the rest of the listing (sans IO);
/// `truncated` whenever fewer than `total_entries` are returned.
fn listing(entries: Vec<FileEntryOutput>, total_entries: usize, budget: usize) -> ListFilesOutput {
    largest_fitting(entries.len(), budget, |n| {
        let output = ListFilesOutput {
            entries: entries[..n].to_vec(),
            total_entries,
            truncated: n < total_entries,
        };
        let len = structured_len(&output);
        (output, len)
    })
}

/// Why `download_file` refuses a file whose content, encoded, does not fit in one MCP result
/// (sans IO).
fn too_large_to_return(
    path: &str,
    bytes: u64,
    encoded: usize,
    binary: bool,
    budget: usize,
) -> ToolError {
    let what = if binary {
        "Split it with execute_command (split -b 256k) and download the parts, or read the part \
         you need (head -c, tail -c)"
    } else {
        "Call download_file again with binary=true (base64 grows a file by a third, while text \
         with control characters or quotes grows up to six times), or read the part you need \
         with execute_command (head -c, tail -c, sed -n, grep)"
    };
    ToolError::new(format!(
        "'{path}' is {bytes} bytes, but its content takes {encoded} bytes in a tool result (JSON, \
         twice: as text and as structured content), more than the {budget} bytes one MCP result \
         may take. {what}."
    ))
}

/// A finished command's output as `execute_command` returns it, sans IO: both streams within the
/// server's cap and, together with the rest of the result, within one MCP message.
struct Streams<'a> {
    stdout: &'a CappedOutput,
    stderr: &'a CappedOutput,
    /// The sandbox itself discarded output beyond its own cap.
    stdout_cut: bool,
    stderr_cut: bool,
}

impl Streams<'_> {
    /// Both streams with at most `keep` bytes each, and the sandbox's own cuts said.
    fn render(&self, keep: usize) -> [Captured; 2] {
        [
            (self.stdout, self.stdout_cut, "stdout"),
            (self.stderr, self.stderr_cut, "stderr"),
        ]
        .map(|(stream, cut, what)| {
            let mut captured = stream.render(what, keep);
            if cut {
                captured.truncated = true;
                captured.text.push_str(&format!(
                    "\n[... the sandbox kept only the first {} bytes of {what} and discarded the \
                     rest; redirect the output to a file to keep all of it ...]",
                    captured.total
                ));
            }
            captured
        })
    }

    /// The largest `keep` any stream can use.
    fn most(&self) -> usize {
        self.stdout.kept().max(self.stderr.kept())
    }

    /// The result of a command that exited with `exit_code`, within `budget` encoded.
    fn output(&self, exit_code: i32, budget: usize) -> ExecuteCommandOutput {
        largest_fitting(self.most(), budget, |keep| {
            let [out, err] = self.render(keep);
            let output = ExecuteCommandOutput {
                exit_code,
                stdout: out.text,
                stderr: err.text,
                stdout_truncated: out.truncated,
                stderr_truncated: err.truncated,
            };
            let len = structured_len(&output);
            (output, len)
        })
    }

    /// The error of a command killed at `timeout`, with what it printed, within `budget`.
    fn timed_out(&self, timeout: Duration, budget: usize) -> ToolError {
        largest_fitting(self.most(), budget, |keep| {
            let [out, err] = self.render(keep);
            let message = format!(
                "The command did not finish within its timeout of {} seconds and was killed. \
                 Retry with a larger timeout (at most 600), or start it in the background \
                 (nohup CMD > job.log 2>&1 &) and read job.log in later calls.\n\nstdout so \
                 far:\n{}\n\nstderr so far:\n{}",
                timeout.as_secs(),
                out.text,
                err.text
            );
            let len = error_len(&message);
            (ToolError::new(message), len)
        })
    }
}

/// Awaits `create`, reporting its steps as progress, unless the client cancels the call first
/// (`None`). Also returns the claim's name once it was created (to delete it after a cancel).
async fn created_or_cancelled(
    create: impl Future<Output = agent_sandbox::Result<agent_sandbox::Sandbox>>,
    mut steps: tokio::sync::mpsc::UnboundedReceiver<Progress>,
    context: &RequestContext<RoleServer>,
) -> (
    Option<agent_sandbox::Result<agent_sandbox::Sandbox>>,
    Option<String>,
) {
    let reporter = Reporter::of(context);
    let mut created = None;
    let mut reported = 0_u32;
    tokio::pin!(create);
    loop {
        let step = tokio::select! {
            outcome = &mut create => return (Some(outcome), created),
            () = context.ct.cancelled() => return (None, created),
            Some(step) = steps.recv() => step,
        };
        let message = match step {
            Progress::ClaimCreated { claim } => {
                let message = format!("claim {claim} created; waiting for a sandbox");
                created = Some(claim);
                message
            }
            Progress::Waiting { reason, message } => format!("waiting: {reason} {message}"),
            Progress::SandboxAssigned { sandbox } => {
                format!("got sandbox {sandbox}; waiting until it is ready")
            }
            Progress::Connecting => "connecting".to_owned(),
            _ => continue,
        };
        reported += 1;
        if let Some(reporter) = &reporter {
            reporter.send(f64::from(reported), message).await;
        }
    }
}

/// Sleeps until `at`, or for ever without one.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await,
        None => std::future::pending().await,
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for SandboxServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_resources()
                .enable_tools()
                .build(),
        )
        .with_server_info(Implementation::new(
            "agent-sandbox",
            env!("CARGO_PKG_VERSION"),
        ))
        .with_instructions(INSTRUCTIONS)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let tool = request.name.to_string();
        let started = Instant::now();
        let outcome = self
            .tool_router
            .call(ToolCallContext::new(self, request, context))
            .await;
        let outcome = match outcome {
            Ok(CallToolResponse::Complete(result)) => {
                Ok(CallToolResponse::Complete(within_budget(
                    &tool,
                    argument_errors_explained(&tool, result),
                    MAX_RESULT_BYTES,
                )))
            }
            other => other,
        };
        let failed = match &outcome {
            Ok(CallToolResponse::Complete(result)) => result.is_error == Some(true),
            _ => true,
        };
        let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        tracing::info!(%tool, failed, elapsed_ms, "tool call");
        outcome
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        Ok(ListResourceTemplatesResult::with_all_items(vec![
            Self::resource_template(),
        ]))
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let namespace = self.session.namespace(None);
        Ok(ListResourcesResult::with_all_items(vec![
            Resource::new(format!("{RESOURCE_SCHEME}{namespace}"), RESOURCE_NAME)
                .with_title(format!("Sandboxes of this session in {namespace}"))
                .with_mime_type("application/json"),
        ]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let uri = request.uri;
        let namespace = match resource_namespace(&uri) {
            None => {
                return Err(ErrorData::resource_not_found(
                    format!("no resource {uri:?}: this server has {RESOURCE_SCHEME}NAMESPACE"),
                    None,
                ));
            }
            Some(Err(error)) => {
                return Err(ErrorData::invalid_params(format!("{uri:?}: {error}"), None));
            }
            Some(Ok(namespace)) => namespace,
        };
        let names = self.session.names(&namespace).await.map_err(|error| {
            ErrorData::internal_error(
                format!(
                    "failed to list the sandbox claims in namespace '{namespace}': {}",
                    chain(&error)
                ),
                None,
            )
        })?;
        let text = serde_json::to_string(&names)
            .map_err(|error| ErrorData::internal_error(error.to_string(), None))?;
        let result = ReadResourceResult::new(vec![
            ResourceContents::text(text, uri).with_mime_type("application/json"),
        ]);
        let len = encoded_len(&result);
        if len > MAX_RESULT_BYTES {
            return Err(ErrorData::internal_error(
                format!(
                    "the {} sandbox claims of this session in namespace '{namespace}' take {len} \
                     bytes, more than one MCP result may take ({MAX_RESULT_BYTES}); delete some \
                     with delete_sandbox",
                    names.len()
                ),
                None,
            ));
        }
        Ok(result.into())
    }
}

/// rmcp reports arguments that do not parse as a tool error with serde's words; this adds the
/// tool's arguments (sans IO).
fn argument_errors_explained(tool: &str, mut result: CallToolResult) -> CallToolResult {
    if result.is_error != Some(true) {
        return result;
    }
    for block in &mut result.content {
        if let ContentBlock::Text(text) = block
            && text.text.starts_with("failed to deserialize parameters:")
        {
            text.text = bad_arguments(tool, &text.text);
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use pretty_assertions::assert_eq;

    use super::*;

    #[test]
    fn every_tool_has_upstreams_name_and_a_schema() {
        let router = SandboxServer::tool_router();
        let mut names: Vec<String> = router
            .list_all()
            .into_iter()
            .map(|t| t.name.to_string())
            .collect();
        names.sort();
        let mut expected: Vec<String> = TOOL_NAMES.iter().map(|s| (*s).to_owned()).collect();
        expected.sort();
        assert_eq!(names, expected);
        for tool in router.list_all() {
            assert!(
                tool.output_schema.is_some(),
                "{} has no output schema",
                tool.name
            );
            assert!(
                tool.description.is_some(),
                "{} has no description",
                tool.name
            );
        }
        let exec = router
            .get("execute_command")
            .map(|t| t.input_schema.clone());
        let exec = serde_json::to_value(exec).unwrap_or_default();
        assert_eq!(
            exec["required"],
            serde_json::json!(["sandbox_claim_name", "command"])
        );
    }

    #[test]
    fn argument_errors_name_the_tools_arguments() {
        let result = CallToolResult::error(vec![ContentBlock::text(
            "failed to deserialize parameters: missing field `command`",
        )]);
        let explained = argument_errors_explained("execute_command", result);
        let text = explained.content[0]
            .as_text()
            .map(|t| t.text.clone())
            .unwrap_or_default();
        assert_eq!(
            text,
            "Invalid arguments for execute_command: missing field `command`. It takes: \
             sandbox_claim_name: str, namespace: str = the server's, command: str, timeout: \
             int = 60."
        );
    }

    #[test]
    fn missing_files_are_named() {
        let error = agent_sandbox::Error::Http {
            operation: "read out.txt".to_owned(),
            sandbox: "sb".to_owned(),
            status: 404,
            body: "no such file".to_owned(),
        };
        let message = explain("read", "sandbox-claim-a", Some("out.txt"), &error);
        assert!(
            message.message().starts_with(
                "No such file or directory 'out.txt' in sandbox claim 'sandbox-claim-a'"
            ),
            "{message}"
        );
        let other = explain("run the command", "sandbox-claim-a", None, &error);
        assert!(other.message().contains("What to do: retry"), "{other}");
    }

    #[test]
    fn resource_uris_name_a_namespace() {
        assert_eq!(
            resource_namespace("sandboxes://team-a"),
            Some(Ok("team-a".to_owned()))
        );
        assert_eq!(
            resource_namespace("sandboxes://team-a/"),
            Some(Ok("team-a".to_owned()))
        );
        assert!(matches!(resource_namespace("sandboxes://"), Some(Err(_))));
        assert!(matches!(
            resource_namespace("sandboxes://a/b"),
            Some(Err(_))
        ));
        assert_eq!(resource_namespace("file:///etc/passwd"), None);
        assert_eq!(
            SandboxServer::resource_template().uri_template,
            "sandboxes://{namespace}"
        );
    }

    #[test]
    fn timeouts_say_what_to_change() {
        let message = timed_out("download_file", Duration::from_secs(60));
        assert!(message.message().starts_with(
            "download_file did not finish within its timeout of 60 seconds. Retry with a larger \
             timeout (at most 600)"
        ));
    }

    /// 64 KiB of control characters on each stream (the default cap) take about 1.7 MB as a
    /// tool result: both streams are cut further, each saying why, and the result fits.
    #[test]
    fn command_output_fits_in_one_message() {
        let cap = crate::config::DEFAULT_MAX_OUTPUT_BYTES;
        let (mut stdout, mut stderr) = (CappedOutput::new(cap), CappedOutput::new(cap));
        stdout.push(&vec![0; 200_000]);
        stderr.push(&vec![1; 200_000]);
        let streams = Streams {
            stdout: &stdout,
            stderr: &stderr,
            stdout_cut: false,
            stderr_cut: true,
        };
        let whole = {
            let [out, err] = streams.render(usize::MAX);
            structured_len(&ExecuteCommandOutput {
                exit_code: 0,
                stdout: out.text,
                stderr: err.text,
                stdout_truncated: true,
                stderr_truncated: true,
            })
        };
        assert!(whole > 1024 * 1024, "{whole}");
        let output = streams.output(0, MAX_RESULT_BYTES);
        let len = structured_len(&output);
        assert!(len <= MAX_RESULT_BYTES, "{len}");
        assert!(
            len > MAX_RESULT_BYTES / 2,
            "not cut more than needed: {len}"
        );
        assert!(output.stdout_truncated && output.stderr_truncated);
        for text in [&output.stdout, &output.stderr] {
            assert!(
                text.contains("(all that fits in one MCP result)"),
                "{text:.200}"
            );
            assert!(text.contains("the command wrote 200000 bytes"));
        }
        assert!(
            output
                .stderr
                .contains("the sandbox kept only the first 200000 bytes")
        );
        // Output that fits is not touched.
        let mut short = CappedOutput::new(cap);
        short.push(b"hello\n");
        let streams = Streams {
            stdout: &short,
            stderr: &short,
            stdout_cut: false,
            stderr_cut: false,
        };
        let output = streams.output(3, MAX_RESULT_BYTES);
        assert_eq!(
            (output.stdout.as_str(), output.stdout_truncated),
            ("hello\n", false)
        );
        // So does the error of a command killed at its timeout, with what it printed.
        let streams = Streams {
            stdout: &stdout,
            stderr: &stderr,
            stdout_cut: false,
            stderr_cut: false,
        };
        let error = streams.timed_out(Duration::from_secs(1), MAX_RESULT_BYTES);
        assert!(error_len(error.message()) <= MAX_RESULT_BYTES);
        assert!(error.message().contains("stdout so far:"));
    }

    /// A listing of thousands of long names returns the entries that fit, and says it is
    /// truncated.
    #[test]
    fn listings_fit_in_one_message() {
        let entry = |i: usize| FileEntryOutput {
            name: format!("{i:05}{}", "x".repeat(195)),
            size: 0,
            entry_type: EntryType::File,
            mod_time: 1.5,
        };
        let entries: Vec<FileEntryOutput> = (0..10_000).map(entry).collect();
        let listed = listing(entries.clone(), 12_000, MAX_RESULT_BYTES);
        assert!(structured_len(&listed) <= MAX_RESULT_BYTES);
        assert!(listed.truncated);
        assert_eq!(listed.total_entries, 12_000);
        assert!(
            (1000..10_000).contains(&listed.entries.len()),
            "{}",
            listed.entries.len()
        );
        assert_eq!(listed.entries[0].name, entries[0].name);
        let small = listing(entries[..3].to_vec(), 3, MAX_RESULT_BYTES);
        assert_eq!((small.entries.len(), small.truncated), (3, false));
    }

    #[test]
    fn a_file_too_large_to_return_says_what_to_do() {
        let text = too_large_to_return("a.txt", 262_144, 3_407_941, false, 1000);
        assert!(text.message().starts_with(
            "'a.txt' is 262144 bytes, but its content takes 3407941 bytes in a tool result"
        ));
        assert!(text.message().contains("binary=true"));
        let binary = too_large_to_return("a.bin", 9, 10, true, 1);
        assert!(binary.message().contains("split -b"));
    }
}
