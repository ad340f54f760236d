//! `sandbox-agent`: an LLM tool loop whose every tool call runs inside a sandbox.
//!
//! The loop runs here, outside the sandbox; only tool execution runs inside, through the SDK.
//! The model never sees a credential, and every tool call pushes the claim's expiry forward so
//! that a crashed agent leaks nothing.
//!
//! What the crate owns:
//! - [`client`]: the Messages API client (retries, `retry-after`, streaming, error hints);
//! - [`messages`]: the wire types; [`stream`]: server-sent events, sans IO;
//! - [`retry`]: retry decisions, sans IO;
//! - [`tools`]: the four tools over the SDK's `SandboxHandle` (output trimming, sans IO);
//! - [`prompt`]: the system prompt (working directory, user, shell rules);
//! - [`agent`]: the loop (one `tool_result` per `tool_use`, TTL pushed after every call,
//!   turn and token limits);
//! - [`session`]: claim, ready line, loop, delete unless `--keep`; `--local` on
//!   `agent_sandbox_local`'s in-process cluster, else the SDK's connection flags
//!   (`agent_sandbox::args::ConnectArgs`: kubeconfig, namespace, router).
//!
//! `docs/agent.md` shows a run and how to use it against a cluster and locally.

pub mod agent;
pub mod client;
mod error;
#[cfg(feature = "fake")]
pub mod fake;
pub mod messages;
pub mod prompt;
pub mod retry;
pub mod session;
pub mod stream;
pub mod tools;

pub use client::{ApiKey, MessagesClient, MessagesConfig, Model};
pub use error::{Error, Result};
