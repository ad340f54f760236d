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
//! What the crate owns, layer by layer (each module uses only those above it in this list):
//! - `error` and `options`: the one [`Error`] type, and [`ClientOptions`], [`CreateOptions`],
//!   [`ExecOptions`] with [`ExecCommand`] (what a command runs), [`RetryPolicy`];
//! - `paths` (sandbox paths in normal form) and `token` ([`mint_token`]: scoped router tokens);
//! - `transport`: HTTP with the `X-Sandbox-*` headers, deadlines and retries: file operations
//!   are retried, commands never unless the caller opts in;
//! - `connection`: how the router is reached: [`ConnectionMode::Direct`],
//!   [`ConnectionMode::PortForward`] (default; router found through the EndpointSlices of
//!   `sandbox-router-svc` in `agent-sandbox-system`) and [`ConnectionMode::Gateway`];
//! - `exec`: streamed answers ([`ExecStream`], [`OutputFollower`], [`Download`]);
//! - `claims`, `pools`, `logs`, `kubeconfig`: the Kubernetes side: SandboxClaims (create, wait
//!   with typed failures through kube-runtime's `await_condition`, list in a namespace or all,
//!   extend, delete; [`ClaimInfo`]), warm pools ([`WarmPoolInfo`]), the logs of a sandbox's
//!   pod, and loading a kubeconfig ([`Kubeconfig`], [`ApiConfig`]);
//! - `sandbox`: the [`Sandbox`] handle: `run`, `exec_stream`, background processes, files,
//!   identity, `extend_ttl`, `disconnect`, `close`;
//! - `client`: the [`Client`], which ties them together (claims, attach to a claim by name,
//!   tokens for a claim's sandbox, auto cleanup on SIGINT/SIGTERM);
//! - `handle`: [`SandboxHandle`], the handle as a trait;
//! - on top, behind features: `args` and `fake` (below).
//!
//! The crate depends on no server crate; its system tests run against
//! `agent-sandbox-local`'s in-process cluster, a dev-dependency.
//!
//! # Features
//!
//! None is on by default; `docs.rs` documents all of them.
//! - `fake`: the module `fake` with `FakeSandbox`, an in-memory [`SandboxHandle`] for unit tests
//!   of code built on the SDK.
//! - `clap`: the module `args` with `ConnectArgs`, the command-line flags for the kubeconfig,
//!   namespace and router (`sandboxctl` and `sandbox-agent` share them), turned into a
//!   [`Client`] in one call.
//!
//! `docs/sdk.md` lists the public API and how it differs from upstream's Go SDK.

#[cfg(feature = "clap")]
pub mod args;
mod claims;
mod client;
mod connection;
mod error;
mod exec;
mod handle;
mod kubeconfig;
mod logs;
mod options;
mod paths;
mod pools;
mod sandbox;
mod token;
mod transport;

#[cfg(feature = "fake")]
pub mod fake;

pub use agent_sandbox_api::runtime::v1::{
    ExecEvent, ExitInfo, FileEntry, FileType, OutputChunk, ProcessInfo, ProcessState,
};
pub use claims::{ClaimInfo, ClaimKey};
pub use client::{AutoCleanup, Client};
pub use error::{Error, Result};
pub use exec::{Download, ExecOutput, ExecStream, OutputFollower};
pub use handle::SandboxHandle;
pub use kubeconfig::{ApiConfig, Kubeconfig};
pub use logs::LogLines;
pub use options::{
    ClientOptions, ConnectionMode, CreateOptions, DEFAULT_MAX_RESPONSE_BYTES, ExecCommand,
    ExecOptions, MAX_TTL, Progress, ProgressFn, RetryPolicy, SCOPED_TOKEN_TTL, SigningKey,
    shell_quote,
};
pub use paths::{normalize_mutable_path, normalize_path};
pub use pools::WarmPoolInfo;
pub use sandbox::{DirDownload, ExecutionResult, MAX_DOWNLOAD_DEPTH, Sandbox};
pub use token::mint_token;
pub use transport::{ConnectFailure, connect_failure};
