//! The [`Sandbox`] handle: commands, streamed exec, background processes, files, identity,
//! expiry and lifecycle of one claimed sandbox.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use agent_sandbox_api::runtime::v1::{
    self, DirectoryListing, ExecRequest, FileEntry, ProcessInfo, ProcessList, SignalName,
    SignalRequest, StdinResponse,
};
use agent_sandbox_api::runtime::{ExecuteRequest, ExecuteResponse, paths};
use bytes::Bytes;
use http::{Method, StatusCode};
use jiff::Timestamp;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde::de::DeserializeOwned;
use tokio::io::AsyncRead;

use crate::claims::{ClaimKey, delete_claim, extend_claim};
use crate::connection::{Connection, Connector};
use crate::error::{Error, Result};
use crate::exec::{Download, ExecStream, OutputFollower};
use crate::options::{ClientOptions, ExecCommand, ExecOptions, RetryPolicy};
use crate::token::mint_token;
use crate::transport::{Call, Payload, Target, reader_body};

/// Characters escaped in a file path segment of a URL: everything but unreserved characters.
const PATH: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// Who a sandbox is: its claim, Sandbox, pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Identity {
    pub(crate) namespace: String,
    pub(crate) claim: String,
    pub(crate) sandbox: String,
    pub(crate) pod: String,
    pub(crate) pod_ip: Option<String>,
    /// The claim's `shutdownTime` when the handle was made.
    pub(crate) shutdown_time: Option<Timestamp>,
}

/// The result of [`Sandbox::run`]: the command's output and exit status.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExecutionResult {
    /// Standard output (UTF-8, invalid sequences replaced).
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
    /// Exit code: 124 after a timeout, 127 for a command not found, minus the signal number
    /// when a signal ended it.
    pub exit_code: i32,
    /// The timeout killed the command.
    pub timed_out: bool,
    /// Standard output was cut at the output cap.
    pub stdout_truncated: bool,
    /// Standard error was cut at the output cap.
    pub stderr_truncated: bool,
    /// Wall-clock time the command took, as the runtime measured it (absent from upstream
    /// runtimes).
    pub duration: Option<Duration>,
}

impl ExecutionResult {
    /// Whether the command exited with 0.
    pub fn success(&self) -> bool {
        self.exit_code == 0
    }

    /// A result with exit code 0 and this stdout (handy for scripting fakes).
    pub fn ok(stdout: impl Into<String>) -> Self {
        Self {
            stdout: stdout.into(),
            ..Self::default()
        }
    }

    /// A result with this exit code and stderr.
    pub fn failed(exit_code: i32, stderr: impl Into<String>) -> Self {
        Self {
            stderr: stderr.into(),
            exit_code,
            ..Self::default()
        }
    }
}

impl From<ExecuteResponse> for ExecutionResult {
    fn from(r: ExecuteResponse) -> Self {
        Self {
            stdout: r.stdout,
            stderr: r.stderr,
            exit_code: r.exit_code,
            timed_out: r.timed_out.unwrap_or(false),
            stdout_truncated: r.stdout_truncated.unwrap_or(false),
            stderr_truncated: r.stderr_truncated.unwrap_or(false),
            duration: r.duration_ms.map(Duration::from_millis),
        }
    }
}

/// A handle to one claimed sandbox.
///
/// Cheap to clone (clones share the connection state). Dropping it keeps the claim; call
/// [`Sandbox::close`] to delete it, or rely on the claim's expiry ([`Sandbox::extend_ttl`]).
///
/// ```no_run
/// # async fn demo(sandbox: agent_sandbox::Sandbox) -> agent_sandbox::Result<()> {
/// use agent_sandbox::ExecOptions;
///
/// sandbox.write("src/main.py", "print('hi')").await?;
/// let result = sandbox
///     .run_with(ExecOptions::shell("cd src && python3 main.py").env("PYTHONUNBUFFERED", "1"))
///     .await?;
/// assert_eq!(result.stdout, "hi\n");
/// let names: Vec<String> = sandbox.list("src").await?.into_iter().map(|e| e.name).collect();
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Sandbox {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

struct Inner {
    identity: Identity,
    target: Target,
    kube: kube::Client,
    options: ClientOptions,
    connector: Arc<Connector>,
    created: Arc<Mutex<BTreeSet<ClaimKey>>>,
    connection: Mutex<Option<Arc<Connection>>>,
    /// The expiry as last known (from the claim, then from `extend_ttl`).
    shutdown_time: Mutex<Option<Timestamp>>,
}

impl Sandbox {
    pub(crate) fn new(
        identity: Identity,
        kube: kube::Client,
        options: ClientOptions,
        connector: Arc<Connector>,
        created: Arc<Mutex<BTreeSet<ClaimKey>>>,
    ) -> Self {
        let target = Target {
            sandbox: identity.sandbox.clone(),
            namespace: identity.namespace.clone(),
        };
        let shutdown_time = Mutex::new(identity.shutdown_time);
        Self {
            inner: Arc::new(Inner {
                identity,
                target,
                shutdown_time,
                kube,
                options,
                connector,
                created,
                connection: Mutex::new(None),
            }),
        }
    }

    /// Namespace of the claim and sandbox.
    pub fn namespace(&self) -> &str {
        &self.inner.identity.namespace
    }

    /// Name of the SandboxClaim.
    pub fn claim_name(&self) -> &str {
        &self.inner.identity.claim
    }

    /// Name of the Sandbox (a warm-pool member keeps its `<pool>-xxxxx` name).
    pub fn sandbox_name(&self) -> &str {
        &self.inner.identity.sandbox
    }

    /// Name of the sandbox's pod.
    pub fn pod_name(&self) -> &str {
        &self.inner.identity.pod
    }

    /// The pod's IP (IPv4 preferred), when the claim reported one.
    pub fn pod_ip(&self) -> Option<&str> {
        self.inner.identity.pod_ip.as_deref()
    }

    /// When the claim expires (`spec.lifecycle.shutdownTime`), as of when this handle was made
    /// or last moved by [`Sandbox::extend_ttl`]; `None` when it never expires.
    pub fn shutdown_time(&self) -> Option<Timestamp> {
        *self
            .inner
            .shutdown_time
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// (Re)connects to the router: after [`Sandbox::disconnect`], or when the port-forward
    /// tunnel died. A no-op when connected.
    pub async fn open(&self) -> Result<()> {
        if self.connection().is_ok() {
            return Ok(());
        }
        let connection = self.inner.connector.connect().await?;
        *self
            .inner
            .connection
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(connection);
        Ok(())
    }

    /// Whether the handle is connected and its transport is alive. Turns false as soon as a
    /// port-forward tunnel is found dead (not after a timeout); [`Sandbox::open`] reconnects.
    pub fn is_ready(&self) -> bool {
        self.connection().is_ok()
    }

    /// Drops the transport and keeps the claim: the sandbox stays claimed (and warm) until it
    /// expires or is closed. [`Sandbox::open`] reconnects.
    pub async fn disconnect(&self) {
        let dropped = self
            .inner
            .connection
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        drop(dropped);
    }

    /// Deletes the claim (and with it the sandbox) and drops the transport. Idempotent.
    pub async fn close(&self) -> Result<()> {
        self.disconnect().await;
        let budget = self.inner.options.cleanup_timeout;
        let deleted = tokio::time::timeout(
            budget,
            delete_claim(&self.inner.kube, self.namespace(), self.claim_name()),
        )
        .await
        .map_err(|_| Error::Timeout {
            operation: format!("delete SandboxClaim {}", self.claim_name()),
            sandbox: self.sandbox_name().to_owned(),
            after: budget,
        })?;
        deleted?;
        self.inner
            .created
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&(self.namespace().to_owned(), self.claim_name().to_owned()));
        Ok(())
    }

    /// Moves the claim's expiry to now + `ttl` (`lifecycle.shutdownTime`, policy `Delete`),
    /// retrying on 409 conflicts. Returns the new shutdown time.
    ///
    /// ```no_run
    /// # async fn demo(sandbox: agent_sandbox::Sandbox) -> agent_sandbox::Result<()> {
    /// // After every tool call of an agent: the sandbox lives 5 minutes past the last one.
    /// sandbox.extend_ttl(std::time::Duration::from_secs(300)).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn extend_ttl(&self, ttl: Duration) -> Result<Timestamp> {
        let at = extend_claim(&self.inner.kube, self.namespace(), self.claim_name(), ttl).await?;
        *self
            .inner
            .shutdown_time
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(at);
        Ok(at)
    }

    /// Suspends the sandbox (`operatingMode: Suspended`): its pod goes, its volumes and
    /// Service stay. The next request through the router wakes it (or [`Sandbox::resume`]).
    pub async fn suspend(&self) -> Result<()> {
        crate::claims::set_suspended(
            &self.inner.kube,
            self.namespace(),
            self.sandbox_name(),
            true,
        )
        .await
    }

    /// Resumes a suspended sandbox (`operatingMode: Running`, its idle clock restarted); its
    /// pod comes back. Requests sent meanwhile wait for it within their timeout.
    pub async fn resume(&self) -> Result<()> {
        crate::claims::set_suspended(
            &self.inner.kube,
            self.namespace(),
            self.sandbox_name(),
            false,
        )
        .await
    }

    /// Mints a scoped router token for this sandbox (see
    /// [`Client::mint_token`](crate::Client::mint_token)).
    pub fn mint_token(&self, key: &[u8], ttl: Duration) -> Result<String> {
        mint_token(key, self.namespace(), self.sandbox_name(), ttl)
    }

    fn connection(&self) -> Result<Arc<Connection>> {
        let guard = self
            .inner
            .connection
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let Some(connection) = guard.as_ref() else {
            return Err(Error::NotConnected {
                sandbox: self.sandbox_name().to_owned(),
                reason: "disconnected".to_owned(),
            });
        };
        connection.check().map_err(|reason| Error::NotConnected {
            sandbox: self.sandbox_name().to_owned(),
            reason,
        })?;
        Ok(connection.clone())
    }

    /// The local port-forward listener, in port-forward mode.
    pub fn local_addr(&self) -> Option<std::net::SocketAddr> {
        self.connection().ok().and_then(|c| c.local_addr())
    }

    /// The router base URL requests go to.
    pub fn router_url(&self) -> Option<String> {
        self.connection()
            .ok()
            .map(|c| c.transport.base().to_owned())
    }

    fn call(&self, operation: String, method: Method, path: String, payload: Payload) -> Call {
        Call {
            operation,
            method,
            path,
            payload,
            timeout: self.inner.options.request_timeout,
            retry: self.inner.options.retry,
            max_response_bytes: self.inner.options.max_response_bytes,
        }
    }

    /// `/v1/files/<normalised path><query>`, or [`Error::InvalidPath`] for a path that leads
    /// out of the base directory (or, with `mutate`, names the base directory itself). See
    /// [`file_path`].
    fn file_path(
        &self,
        operation: &'static str,
        path: &str,
        query: &str,
        mutate: bool,
    ) -> Result<String> {
        let normal = if mutate {
            crate::paths::normalize_mutable_path(operation, path)
        } else {
            crate::paths::normalize_path(operation, path)
        };
        Ok(file_path(&normal?, query))
    }

    async fn send(&self, call: Call) -> Result<http::Response<hyper::body::Incoming>> {
        let connection = self.connection()?;
        connection.transport.send(&self.inner.target, call).await
    }

    async fn send_json<T: DeserializeOwned>(&self, call: Call) -> Result<T> {
        let operation = call.operation.clone();
        let connection = self.connection()?;
        let bytes = connection
            .transport
            .send_collect(&self.inner.target, call, true)
            .await?;
        serde_json::from_slice(&bytes).map_err(|e| Error::Decode {
            operation,
            sandbox: self.sandbox_name().to_owned(),
            message: e.to_string(),
        })
    }

    async fn send_empty(&self, call: Call) -> Result<()> {
        let connection = self.connection()?;
        connection
            .transport
            .send_collect(&self.inner.target, call, false)
            .await
            .map(drop)
    }

    /// Sends `call` and checks that its answer is JSON (or NDJSON).
    async fn send_json_stream(&self, call: Call) -> Result<http::Response<hyper::body::Incoming>> {
        let operation = call.operation.clone();
        let connection = self.connection()?;
        let response = connection.transport.send(&self.inner.target, call).await?;
        connection
            .transport
            .json_answer(&self.inner.target, &operation, response)
            .await
    }

    /// Runs `command` (upstream's `/execute`: split shlex-style and run without a shell) and
    /// returns its output. Never replayed. For shell syntax use
    /// `run_with(ExecOptions::shell(..))`.
    pub async fn run(&self, command: &str) -> Result<ExecutionResult> {
        self.run_with(ExecOptions::new(command)).await
    }

    /// Runs a command with options (shell or argv, cwd, env, timeout, stdin) through `/execute`.
    /// Sent once unless [`ExecOptions::max_attempts`] opts in to replays.
    pub async fn run_with(&self, options: ExecOptions) -> Result<ExecutionResult> {
        let body = json_body(&execute_request(&options))?;
        let mut call = self.call(
            "run".to_owned(),
            Method::POST,
            paths::EXECUTE.to_owned(),
            Payload::Bytes(body, "application/json"),
        );
        call.timeout = options.deadline(self.inner.options.request_timeout);
        call.retry = RetryPolicy::attempts(options.max_attempts);
        let response: ExecuteResponse = self.send_json(call).await?;
        Ok(response.into())
    }

    /// Runs a command through `/v1/exec` and streams its output as it is produced: a shell line
    /// through `/bin/sh -c`, an argv without a shell (a [`ExecCommand::Line`] runs as a shell
    /// line: `/v1` has no split mode). Never replayed unless opted in.
    ///
    /// ```no_run
    /// # async fn demo(sandbox: agent_sandbox::Sandbox) -> agent_sandbox::Result<()> {
    /// use agent_sandbox::{ExecEvent, ExecOptions};
    ///
    /// let mut stream = sandbox.exec_stream(ExecOptions::shell("make 2>&1")).await?;
    /// while let Some(event) = stream.next_event().await {
    ///     match event? {
    ///         ExecEvent::Stdout(chunk) | ExecEvent::Stderr(chunk) => {
    ///             print!("{}", String::from_utf8_lossy(&chunk.bytes().unwrap_or_default()))
    ///         }
    ///         ExecEvent::Exit(exit) => println!("exit code {:?}", exit.exit_code),
    ///         _ => {}
    ///     }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn exec_stream(&self, options: ExecOptions) -> Result<ExecStream> {
        let request = exec_request(&options);
        let body = json_body(&request)?;
        let deadline = options.deadline(self.inner.options.request_timeout);
        let mut call = self.call(
            "exec".to_owned(),
            Method::POST,
            v1::paths::EXEC.to_owned(),
            Payload::Bytes(body, "application/json"),
        );
        call.timeout = deadline;
        call.retry = RetryPolicy::attempts(options.max_attempts);
        let response = self.send_json_stream(call).await?;
        Ok(ExecStream::new(
            response.into_body(),
            "exec".to_owned(),
            self.sandbox_name().to_owned(),
            Some(deadline),
        )
        .collecting_at_most(self.inner.options.max_response_bytes))
    }

    /// Starts a background process (`POST /v1/processes`); it runs until it exits, is signalled
    /// or killed, or the sandbox goes away. Never replayed.
    pub async fn start_process(&self, options: ExecOptions) -> Result<ProcessInfo> {
        let request = exec_request(&options);
        let mut call = self.call(
            "start process".to_owned(),
            Method::POST,
            v1::paths::PROCESSES.to_owned(),
            Payload::Bytes(json_body(&request)?, "application/json"),
        );
        call.retry = RetryPolicy::attempts(options.max_attempts);
        self.send_json(call).await
    }

    /// The background processes (running and recently finished).
    pub async fn processes(&self) -> Result<Vec<ProcessInfo>> {
        let call = self.call(
            "list processes".to_owned(),
            Method::GET,
            v1::paths::PROCESSES.to_owned(),
            Payload::Empty,
        );
        let list: ProcessList = self.send_json(call).await?;
        Ok(list.processes)
    }

    /// One background process.
    pub async fn process(&self, id: &str) -> Result<ProcessInfo> {
        let call = self.call(
            format!("get process {id}"),
            Method::GET,
            process_path(id, "")?,
            Payload::Empty,
        );
        self.send_json(call).await
    }

    /// The output of a background process from byte `offset` up to what is buffered now
    /// (ends with `End` while it runs, `Exit` once it ended).
    pub async fn process_output(&self, id: &str, offset: u64) -> Result<ExecStream> {
        self.output_stream(id, offset, false).await
    }

    /// Follows the output of a background process from byte `offset` until it exits,
    /// reconnecting from the last byte seen when the connection drops (up to 5 times in a row).
    pub fn follow_output(&self, id: &str, offset: u64) -> OutputFollower {
        let (sandbox, process) = (self.clone(), id.to_owned());
        OutputFollower::new(
            self.sandbox_name().to_owned(),
            id.to_owned(),
            offset,
            Box::new(move |offset| {
                let (sandbox, process) = (sandbox.clone(), process.clone());
                Box::pin(async move { sandbox.output_stream(&process, offset, true).await })
            }),
        )
    }

    pub(crate) async fn output_stream(
        &self,
        id: &str,
        offset: u64,
        follow: bool,
    ) -> Result<ExecStream> {
        let mut call = self.call(
            format!("read output of process {id}"),
            Method::GET,
            process_path(id, &format!("/output?offset={offset}&follow={follow}"))?,
            Payload::Empty,
        );
        if follow {
            // The stream lasts as long as the process; the router's cap bounds it.
            call.timeout = Duration::from_secs(24 * 3600);
        }
        let response = self.send_json_stream(call).await?;
        Ok(ExecStream::new(
            response.into_body(),
            format!("output of process {id}"),
            self.sandbox_name().to_owned(),
            None,
        )
        .collecting_at_most(self.inner.options.max_response_bytes))
    }

    /// Sends a signal (`"TERM"`, `"KILL"`, `"INT"`, ... or a number as text) to a background
    /// process's whole process group.
    pub async fn signal_process(&self, id: &str, signal: &str) -> Result<ProcessInfo> {
        let signal = match signal.parse::<i32>() {
            Ok(number) => SignalName::Number(number),
            Err(_) => SignalName::Name(signal.to_owned()),
        };
        let call = self.call(
            format!("signal process {id}"),
            Method::POST,
            process_path(id, "/signal")?,
            Payload::Bytes(json_body(&SignalRequest { signal })?, "application/json"),
        );
        self.send_json(call).await
    }

    /// Writes to the standard input of a background process started with stdin open;
    /// `eof` closes it afterwards.
    pub async fn write_stdin(&self, id: &str, data: impl Into<Bytes>, eof: bool) -> Result<u64> {
        let mut call = self.call(
            format!("write stdin of process {id}"),
            Method::POST,
            process_path(id, &format!("/stdin?eof={eof}"))?,
            Payload::Bytes(data.into(), "application/octet-stream"),
        );
        call.retry = RetryPolicy::never();
        let answer: StdinResponse = self.send_json(call).await?;
        Ok(answer.written)
    }

    /// Kills a background process's group (if it runs) and forgets it.
    pub async fn kill_process(&self, id: &str) -> Result<()> {
        let call = self.call(
            format!("kill process {id}"),
            Method::DELETE,
            process_path(id, "")?,
            Payload::Empty,
        );
        self.send_empty(call).await
    }

    /// Writes `data` to `path` (parents are created; replaced atomically). Retried. A path
    /// that names the base directory, or leads outside it, is refused before anything is sent
    /// ([`Error::InvalidPath`]), as for every mutating file operation.
    pub async fn write(&self, path: &str, data: impl Into<Bytes>) -> Result<()> {
        let call = self.call(
            format!("write {path}"),
            Method::PUT,
            self.file_path("write", path, "", true)?,
            Payload::Bytes(data.into(), "application/octet-stream"),
        );
        self.send_empty(call).await
    }

    /// Streams `reader` into `path` without buffering it. Sent once (a reader cannot be
    /// rewound); use [`Sandbox::upload_file`] for a retried upload of a local file.
    pub async fn upload(&self, path: &str, reader: impl AsyncRead + Send + 'static) -> Result<()> {
        let mut call = self.call(
            format!("upload {path}"),
            Method::PUT,
            self.file_path("upload", path, "", true)?,
            Payload::Once(Some(reader_body(reader))),
        );
        call.timeout = call.timeout.max(Duration::from_secs(3600));
        self.send_empty(call).await
    }

    /// Streams the local file `local` into `path`; retried (the file is reopened each time).
    pub async fn upload_file(&self, path: &str, local: impl AsRef<Path>) -> Result<()> {
        let mut call = self.call(
            format!("upload {path}"),
            Method::PUT,
            self.file_path("upload", path, "", true)?,
            Payload::File(local.as_ref().to_path_buf()),
        );
        call.timeout = call.timeout.max(Duration::from_secs(3600));
        self.send_empty(call).await
    }

    /// Reads the whole file at `path`. Retried.
    pub async fn read(&self, path: &str) -> Result<Bytes> {
        let call = self.call(
            format!("read {path}"),
            Method::GET,
            self.file_path("read", path, "", false)?,
            Payload::Empty,
        );
        let connection = self.connection()?;
        connection
            .transport
            .send_collect(&self.inner.target, call, false)
            .await
    }

    /// Streams the file at `path` (an [`AsyncRead`]), without buffering it. Retried until the
    /// answer starts.
    pub async fn download(&self, path: &str) -> Result<Download> {
        let mut call = self.call(
            format!("download {path}"),
            Method::GET,
            self.file_path("download", path, "", false)?,
            Payload::Empty,
        );
        call.timeout = call.timeout.max(Duration::from_secs(3600));
        let response = self.send(call).await?;
        Ok(Download::new(response))
    }

    /// Downloads the directory `path` and everything under it into the local directory
    /// `local` (created when missing; files already there are replaced). Returns what was
    /// copied.
    ///
    /// The sandbox is untrusted, and the copy stays inside `local` whatever it answers: every
    /// name comes from [`Sandbox::list`] (one normal path component, or
    /// [`Error::UnsafeName`]); every directory and file is created through a handle on its
    /// parent directory that cannot resolve outside `local`; an existing symlink where a file
    /// or directory is to go is never written or followed through
    /// ([`Error::UnsafeDestination`]); files are streamed into a new temporary file and
    /// renamed into place, so nothing is ever written through an existing link and a failed
    /// download leaves no partial file. Symlinks, sockets and devices in the sandbox are not
    /// copied (listed in [`DirDownload::skipped`]). Trees deeper than
    /// [`MAX_DOWNLOAD_DEPTH`] are refused.
    pub async fn download_dir(&self, path: &str, local: impl AsRef<Path>) -> Result<DirDownload> {
        let remote_root = crate::paths::normalize_path("download", path)?;
        let local = local.as_ref().to_path_buf();
        let opened = local.clone();
        let root = blocking(move || {
            std::fs::create_dir_all(&opened)?;
            cap_std::fs::Dir::open_ambient_dir(&opened, cap_std::ambient_authority())
        })
        .await
        .map_err(local_io("create", &local))?;
        let mut summary = DirDownload::default();
        let mut pending = vec![(remote_root, Arc::new(root), local, 0_usize)];
        while let Some((remote_dir, dir, local_dir, depth)) = pending.pop() {
            if depth > MAX_DOWNLOAD_DEPTH {
                return Err(Error::Decode {
                    operation: format!("download {path}"),
                    sandbox: self.sandbox_name().to_owned(),
                    message: format!(
                        "the directory tree is deeper than {MAX_DOWNLOAD_DEPTH} levels (at {remote_dir})"
                    ),
                });
            }
            for entry in self.list(&remote_dir).await? {
                let remote_path = join_remote(&remote_dir, &entry.name);
                let local_path = local_dir.join(&entry.name);
                match entry.file_type {
                    v1::FileType::Directory => {
                        let child = subdirectory(&dir, &entry.name, &local_path).await?;
                        summary.directories += 1;
                        pending.push((remote_path, Arc::new(child), local_path, depth + 1));
                    }
                    v1::FileType::File => {
                        let download = self.download(&remote_path).await?;
                        let source = (
                            download,
                            format!("download {remote_path}"),
                            self.sandbox_name(),
                        );
                        write_new_file(&dir, &entry.name, &local_path, source).await?;
                        summary.files += 1;
                    }
                    _ => summary.skipped.push(remote_path),
                }
            }
        }
        Ok(summary)
    }

    /// Lists the directory at `path` (`""` or `"."` for the base directory), sorted by name.
    /// Retried. Every entry's name is one normal path component, or the whole listing is
    /// refused with [`Error::UnsafeName`] naming the first that is not (`../x`, `/abs`, `a/b`,
    /// `..`): a name from a sandbox is safe to join to a local directory.
    pub async fn list(&self, path: &str) -> Result<Vec<FileEntry>> {
        let operation = format!("list {path}");
        let call = self.call(
            operation.clone(),
            Method::GET,
            self.file_path("list", path, "", false)?,
            Payload::Empty,
        );
        let listing: DirectoryListing = self.send_json(call).await?;
        for entry in &listing.entries {
            crate::paths::entry_name(&entry.name).map_err(|reason| Error::UnsafeName {
                operation: operation.clone(),
                sandbox: self.sandbox_name().to_owned(),
                name: entry.name.clone(),
                reason,
            })?;
        }
        Ok(listing.entries)
    }

    /// Whether `path` exists. Retried.
    pub async fn exists(&self, path: &str) -> Result<bool> {
        let call = self.call(
            format!("stat {path}"),
            Method::HEAD,
            self.file_path("stat", path, "", false)?,
            Payload::Empty,
        );
        match self.send_empty(call).await {
            Ok(()) => Ok(true),
            Err(error) if error.status() == Some(StatusCode::NOT_FOUND.as_u16()) => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// Removes a file, a symlink or an empty directory; with `recursive`, a directory and its
    /// contents. Retried (a retry after a lost answer finds nothing: 404 is an error).
    pub async fn remove(&self, path: &str, recursive: bool) -> Result<()> {
        let query = if recursive { "?recursive=true" } else { "" };
        let call = self.call(
            format!("remove {path}"),
            Method::DELETE,
            self.file_path("remove", path, query, true)?,
            Payload::Empty,
        );
        self.send_empty(call).await
    }

    /// Creates the directory `path` and its missing parents (no error if it exists). Retried.
    pub async fn mkdir(&self, path: &str) -> Result<()> {
        let call = self.call(
            format!("mkdir {path}"),
            Method::POST,
            self.file_path("mkdir", path, &format!("?op={}", v1::FILES_OP_MKDIR), true)?,
            Payload::Empty,
        );
        self.send_empty(call).await
    }
}

/// What [`Sandbox::download_dir`] copied.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DirDownload {
    /// Files written.
    pub files: u64,
    /// Directories created or entered below the destination.
    pub directories: u64,
    /// Sandbox paths of entries that are neither files nor directories (symlinks, sockets,
    /// devices): not copied.
    pub skipped: Vec<String>,
}

/// How deep [`Sandbox::download_dir`] descends below the directory it copies; a hostile
/// sandbox could otherwise list directories inside directories for ever.
pub const MAX_DOWNLOAD_DEPTH: usize = 256;

/// Why an existing symlink in a download's destination stops it.
const SYMLINK_IN_THE_WAY: &str = "it is a symlink, and downloads never write or descend through \
     symlinks in their destination; remove it or choose another destination";

/// `dir/name` for sandbox paths (`name` alone under the base directory).
fn join_remote(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_owned()
    } else {
        format!("{}/{name}", dir.trim_end_matches('/'))
    }
}

fn local_io(operation: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.display().to_string();
    move |source| Error::LocalIo {
        operation,
        path,
        source,
    }
}

/// Runs a filesystem call off the async threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e)))
}

/// What is at `name` in `dir`, without following a symlink there.
fn existing(dir: &cap_std::fs::Dir, name: &str) -> std::io::Result<Option<cap_std::fs::Metadata>> {
    match dir.symlink_metadata(name) {
        Ok(meta) => Ok(Some(meta)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Opens the subdirectory `name` of `parent`, creating it if missing; refuses a symlink or a
/// non-directory there. The handle confines everything below it to `parent`'s tree.
async fn subdirectory(
    parent: &Arc<cap_std::fs::Dir>,
    name: &str,
    shown: &Path,
) -> Result<cap_std::fs::Dir> {
    let (dir, owned) = (parent.clone(), name.to_owned());
    let opened = blocking(move || {
        match dir.create_dir(&owned) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        match existing(&dir, &owned)? {
            Some(meta) if meta.file_type().is_symlink() => Ok(Err(SYMLINK_IN_THE_WAY)),
            Some(meta) if !meta.is_dir() => Ok(Err(
                "something that is not a directory is in the way; remove it or choose another destination",
            )),
            _ => dir.open_dir(&owned).map(Ok),
        }
    })
    .await
    .map_err(local_io("create directory", shown))?;
    opened.map_err(|reason| Error::UnsafeDestination {
        path: shown.display().to_string(),
        reason,
    })
}

/// Streams `download` into the file `name` of `dir`: into a new temporary file first
/// (`create_new`: never through an existing link), renamed over `name` at the end. Refuses
/// when `name` is a symlink or a directory; removes the temporary file on failure.
async fn write_new_file(
    dir: &Arc<cap_std::fs::Dir>,
    name: &str,
    shown: &Path,
    (mut download, download_operation, sandbox): (Download, String, &str),
) -> Result<()> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let temporary = format!(".{:016x}.sandbox-download", fastrand::u64(..));
    let (handle, owned, temp) = (dir.clone(), name.to_owned(), temporary.clone());
    let created = blocking(move || {
        match existing(&handle, &owned)? {
            Some(meta) if meta.file_type().is_symlink() => return Ok(Err(SYMLINK_IN_THE_WAY)),
            Some(meta) if meta.is_dir() => {
                return Ok(Err(
                    "a directory is in the way of a file; remove it or choose another destination",
                ));
            }
            _ => {}
        }
        let mut options = cap_std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        Ok(Ok(handle.open_with(&temp, &options)?.into_std()))
    })
    .await
    .map_err(local_io("create", shown))?;
    let file = created.map_err(|reason| Error::UnsafeDestination {
        path: shown.display().to_string(),
        reason,
    })?;
    let mut file = tokio::fs::File::from_std(file);
    // Reading (the sandbox's side) and writing (ours) fail for different reasons; say which.
    let copied: Result<()> = async {
        let mut buffer = vec![0_u8; 64 * 1024];
        loop {
            let read = download
                .read(&mut buffer)
                .await
                .map_err(|e| Error::Transport {
                    operation: download_operation.clone(),
                    sandbox: sandbox.to_owned(),
                    message: format!("reading the file failed: {e}"),
                    source: Some(Box::new(e)),
                })?;
            if read == 0 {
                break;
            }
            file.write_all(&buffer[..read])
                .await
                .map_err(local_io("write", shown))?;
        }
        file.flush().await.map_err(local_io("write", shown))
    }
    .await;
    drop(file);
    let (handle, owned, temp) = (dir.clone(), name.to_owned(), temporary);
    let ok = copied.is_ok();
    let placed = blocking(move || {
        let renamed = if ok {
            handle.rename(&temp, &handle, &owned)
        } else {
            Ok(())
        };
        if !ok || renamed.is_err() {
            let _ = handle.remove_file(&temp);
        }
        renamed
    })
    .await;
    copied?;
    placed.map_err(local_io("write", shown))
}

fn json_body<T: serde::Serialize>(value: &T) -> Result<Bytes> {
    serde_json::to_vec(value)
        .map(Bytes::from)
        .map_err(|e| Error::InvalidOption {
            option: "request",
            message: e.to_string(),
        })
}

/// The `/execute` request for `options` (sans IO): a line as it is, a shell line with
/// `shell: true`, an argv quoted into a line that the runtime's shlex split turns back into the
/// same words.
pub(crate) fn execute_request(options: &ExecOptions) -> ExecuteRequest {
    ExecuteRequest {
        command: options.command.to_line(),
        shell: matches!(options.command, ExecCommand::Shell(_)).then_some(true),
        cwd: options.cwd.clone(),
        env: (!options.env.is_empty()).then(|| options.env.clone()),
        timeout_seconds: options.timeout.map(|t| t.as_secs_f64()),
        stdin: options.stdin.clone(),
        max_output_bytes: options.max_output_bytes,
    }
}

/// The `/v1` request for `options` (sans IO): a shell line (or a line: `/v1` has no split mode)
/// as `command`, an argv as `argv`.
pub(crate) fn exec_request(options: &ExecOptions) -> ExecRequest {
    let (command, argv) = match &options.command {
        ExecCommand::Line(line) | ExecCommand::Shell(line) => (Some(line.clone()), None),
        ExecCommand::Argv(words) => (None, Some(words.clone())),
    };
    ExecRequest {
        command,
        argv,
        cwd: options.cwd.clone(),
        env: (!options.env.is_empty()).then(|| options.env.clone()),
        timeout_seconds: options.timeout.map(|t| t.as_secs_f64()),
        stdin: options.stdin.clone(),
        max_output_bytes: options.max_output_bytes,
        stdin_open: None,
    }
}

/// `/v1/files/<encoded path><query>` (sans IO) for a path already in normal form
/// ([`crate::paths::normalize`]: no `.`, `..` or empty segments). The whole path is one encoded
/// segment (`/` as `%2F`), so the URL has no dot segment a proxy could resolve and `%` reaches
/// the runtime as given.
pub(crate) fn file_path(path: &str, query: &str) -> String {
    format!(
        "{}{}{query}",
        v1::paths::FILES,
        utf8_percent_encode(path, PATH)
    )
}

/// `/v1/processes/<encoded id><rest>` (sans IO). An id that would be a dot segment (or
/// nothing) is refused: a URL normaliser would turn `/v1/processes/..` into `/v1/`.
fn process_path(id: &str, rest: &str) -> Result<String> {
    if id.is_empty() || id == "." || id == ".." {
        return Err(Error::InvalidOption {
            option: "process id",
            message: format!("{id:?} is not a process id"),
        });
    }
    Ok(format!(
        "{}/{}{rest}",
        v1::paths::PROCESSES,
        utf8_percent_encode(id, PATH)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_paths_are_one_encoded_segment() {
        assert_eq!(
            file_path("data/in put.csv", ""),
            "/v1/files/data%2Fin%20put.csv"
        );
        assert_eq!(file_path("", ""), "/v1/files/");
        assert_eq!(
            file_path("a", "?recursive=true"),
            "/v1/files/a?recursive=true"
        );
        assert_eq!(file_path("/app/x", ""), "/v1/files/%2Fapp%2Fx");
        assert_eq!(file_path("a%2F..", ""), "/v1/files/a%252F..");
    }

    #[test]
    fn exec_requests_use_a_shell_unless_argv_is_given() {
        let shell = exec_request(&ExecOptions::new("echo $HOME").timeout(Duration::from_secs(2)));
        assert_eq!(shell.command.as_deref(), Some("echo $HOME"));
        assert_eq!(shell.timeout_seconds, Some(2.0));
        let argv = exec_request(&ExecOptions::argv(["ls", "-l"]));
        assert_eq!(argv.command, None);
        assert_eq!(argv.argv, Some(vec!["ls".to_owned(), "-l".to_owned()]));
        let shell = exec_request(&ExecOptions::shell("echo $HOME"));
        assert_eq!(shell.command.as_deref(), Some("echo $HOME"));
        assert_eq!(shell.argv, None);
    }

    #[test]
    fn execute_requests_say_shell_only_for_shell_lines_and_quote_argv() {
        let line = execute_request(&ExecOptions::new("echo $HOME"));
        assert_eq!((line.command.as_str(), line.shell), ("echo $HOME", None));
        let shell = execute_request(&ExecOptions::shell("echo $HOME").cwd("sub"));
        assert_eq!(
            (shell.command.as_str(), shell.shell, shell.cwd.as_deref()),
            ("echo $HOME", Some(true), Some("sub"))
        );
        let argv = execute_request(&ExecOptions::argv(["printf", "%s", "a b"]));
        assert_eq!(
            (argv.command.as_str(), argv.shell),
            ("printf %s 'a b'", None)
        );
    }
}
