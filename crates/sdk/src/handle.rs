//! [`SandboxHandle`]: the handle's operations as a trait, so agent code can be written against
//! it and unit-tested with `fake::FakeSandbox` (feature `fake`).

use std::future::Future;
use std::time::Duration;

use agent_sandbox_api::runtime::v1::FileEntry;
use bytes::Bytes;
use jiff::Timestamp;

use crate::error::Result;
use crate::options::ExecOptions;
use crate::sandbox::{ExecutionResult, Sandbox};

/// What code that uses a sandbox needs: commands, files, identity and lifecycle.
///
/// Implemented by [`Sandbox`] and, with feature `fake`, by `fake::FakeSandbox`. The futures are
/// `Send`, so implementations can be used from spawned tasks.
// The link to the fake resolves only where the feature compiles the module in.
#[cfg_attr(
    feature = "fake",
    doc = "\nSee [`FakeSandbox`](crate::fake::FakeSandbox)."
)]
///
/// ```no_run
/// use agent_sandbox::SandboxHandle;
///
/// async fn run_tool(sandbox: &impl SandboxHandle, script: &str) -> agent_sandbox::Result<String> {
///     sandbox.write("tool.py", script.as_bytes().to_vec().into()).await?;
///     let result = sandbox.run("python3 tool.py").await?;
///     Ok(result.stdout)
/// }
/// ```
pub trait SandboxHandle: Send + Sync {
    /// Name of the SandboxClaim.
    fn claim_name(&self) -> &str;
    /// Name of the Sandbox.
    fn sandbox_name(&self) -> &str;
    /// Name of the pod.
    fn pod_name(&self) -> &str;
    /// Pod IP, when known.
    fn pod_ip(&self) -> Option<&str>;
    /// Whether the handle can send requests now.
    fn is_ready(&self) -> bool;
    /// (Re)connects.
    fn open(&self) -> impl Future<Output = Result<()>> + Send;
    /// Drops the transport, keeps the claim.
    fn disconnect(&self) -> impl Future<Output = ()> + Send;
    /// Deletes the claim.
    fn close(&self) -> impl Future<Output = Result<()>> + Send;
    /// Moves the claim's expiry to now + `ttl`.
    fn extend_ttl(&self, ttl: Duration) -> impl Future<Output = Result<Timestamp>> + Send;
    /// Runs a command (no shell).
    fn run(&self, command: &str) -> impl Future<Output = Result<ExecutionResult>> + Send;
    /// Runs a command with options.
    fn run_with(
        &self,
        options: ExecOptions,
    ) -> impl Future<Output = Result<ExecutionResult>> + Send;
    /// Writes a file.
    fn write(&self, path: &str, data: Bytes) -> impl Future<Output = Result<()>> + Send;
    /// Reads a file.
    fn read(&self, path: &str) -> impl Future<Output = Result<Bytes>> + Send;
    /// Lists a directory.
    fn list(&self, path: &str) -> impl Future<Output = Result<Vec<FileEntry>>> + Send;
    /// Whether a path exists.
    fn exists(&self, path: &str) -> impl Future<Output = Result<bool>> + Send;
    /// Removes a path.
    fn remove(&self, path: &str, recursive: bool) -> impl Future<Output = Result<()>> + Send;
    /// Creates a directory and its parents.
    fn mkdir(&self, path: &str) -> impl Future<Output = Result<()>> + Send;
}

impl SandboxHandle for Sandbox {
    fn claim_name(&self) -> &str {
        Sandbox::claim_name(self)
    }
    fn sandbox_name(&self) -> &str {
        Sandbox::sandbox_name(self)
    }
    fn pod_name(&self) -> &str {
        Sandbox::pod_name(self)
    }
    fn pod_ip(&self) -> Option<&str> {
        Sandbox::pod_ip(self)
    }
    fn is_ready(&self) -> bool {
        Sandbox::is_ready(self)
    }
    fn open(&self) -> impl Future<Output = Result<()>> + Send {
        Sandbox::open(self)
    }
    fn disconnect(&self) -> impl Future<Output = ()> + Send {
        Sandbox::disconnect(self)
    }
    fn close(&self) -> impl Future<Output = Result<()>> + Send {
        Sandbox::close(self)
    }
    fn extend_ttl(&self, ttl: Duration) -> impl Future<Output = Result<Timestamp>> + Send {
        Sandbox::extend_ttl(self, ttl)
    }
    fn run(&self, command: &str) -> impl Future<Output = Result<ExecutionResult>> + Send {
        Sandbox::run(self, command)
    }
    fn run_with(
        &self,
        options: ExecOptions,
    ) -> impl Future<Output = Result<ExecutionResult>> + Send {
        Sandbox::run_with(self, options)
    }
    fn write(&self, path: &str, data: Bytes) -> impl Future<Output = Result<()>> + Send {
        Sandbox::write(self, path, data)
    }
    fn read(&self, path: &str) -> impl Future<Output = Result<Bytes>> + Send {
        Sandbox::read(self, path)
    }
    fn list(&self, path: &str) -> impl Future<Output = Result<Vec<FileEntry>>> + Send {
        Sandbox::list(self, path)
    }
    fn exists(&self, path: &str) -> impl Future<Output = Result<bool>> + Send {
        Sandbox::exists(self, path)
    }
    fn remove(&self, path: &str, recursive: bool) -> impl Future<Output = Result<()>> + Send {
        Sandbox::remove(self, path, recursive)
    }
    fn mkdir(&self, path: &str) -> impl Future<Output = Result<()>> + Send {
        Sandbox::mkdir(self, path)
    }
}
