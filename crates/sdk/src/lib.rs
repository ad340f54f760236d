//! Rust SDK for agent-sandbox: claim a sandbox from a warm pool in your Kubernetes cluster, run
//! commands and move files in it, and let it expire or delete it.
//!
//! ```no_run
//! # async fn demo() -> agent_sandbox::Result<()> {
//! use std::time::Duration;
//! use agent_sandbox::{Client, ClientOptions, ExecOptions};
//!
//! // Port-forward to the router in agent-sandbox-system (the default connection mode).
//! let client = Client::new(ClientOptions::default().namespace("default")).await?;
//! let sandbox = client.create_sandbox("python-sandbox-pool").await?;
//! let hello = sandbox.run_with(ExecOptions::shell("echo hello from $(hostname)")).await?;
//! print!("{}", hello.stdout);
//! sandbox.write("work/fib.py", "print([0, 1, 1, 2, 3])").await?;
//! let out = sandbox.run("python3 work/fib.py").await?;
//! sandbox.extend_ttl(Duration::from_secs(300)).await?;
//! sandbox.close().await?;
//! # Ok(())
//! # }
//! ```
//!
//! What the crate owns:
//! - [`Client`] (in `client`): SandboxClaims (create and wait with typed failures and
//!   rollback, re-attach, list, extend, delete), scoped token minting, auto cleanup on
//!   SIGINT/SIGTERM;
//! - the connection to the router (in `connection`): [`ConnectionMode::Direct`],
//!   [`ConnectionMode::PortForward`] (default; router found through the EndpointSlices of
//!   `sandbox-router-svc` in `agent-sandbox-system`) and [`ConnectionMode::Gateway`];
//! - HTTP with the `X-Sandbox-*` headers, deadlines and retries (in `transport`): file
//!   operations are retried, commands never unless the caller opts in;
//! - the [`Sandbox`] handle: `run`, `exec_stream`, background processes, files, identity,
//!   `extend_ttl`, `disconnect`, `close`;
//! - [`SandboxHandle`], the handle as a trait, with [`fake::FakeSandbox`] (feature `fake`).
//!
//! The crate depends on no server crate; its system tests run against
//! `agent-sandbox-local`'s in-process cluster, a dev-dependency.
//!
//! `docs/sdk.md` lists the public API and how it differs from upstream's Go SDK.

mod client;
mod connection;
mod error;
mod exec;
mod handle;
mod options;
mod paths;
mod sandbox;
mod transport;

#[cfg(feature = "fake")]
pub mod fake;

pub use agent_sandbox_api::runtime::v1::{
    ExecEvent, ExitInfo, FileEntry, FileType, OutputChunk, ProcessInfo, ProcessState,
};
pub use client::{AutoCleanup, ClaimInfo, ClaimKey, Client, mint_token};
pub use error::{Error, Result};
pub use exec::{Download, ExecOutput, ExecStream, OutputFollower};
pub use handle::SandboxHandle;
pub use options::{
    ClientOptions, ConnectionMode, CreateOptions, DEFAULT_MAX_RESPONSE_BYTES, ExecOptions, MAX_TTL,
    Progress, ProgressFn, RetryPolicy, SCOPED_TOKEN_TTL, SigningKey,
};
pub use paths::{normalize_mutable_path, normalize_path};
pub use sandbox::{DirDownload, ExecutionResult, MAX_DOWNLOAD_DEPTH, Sandbox};
pub use transport::{ConnectFailure, connect_failure};
