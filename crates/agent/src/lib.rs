//! `sandbox-agent`: an LLM tool loop whose every tool call runs inside a sandbox.
//!
//! The loop runs here, outside the sandbox; only tool execution runs inside, through the SDK.
//! The model never sees a credential, and every tool call pushes the claim's expiry forward so
//! that a crashed agent leaks nothing.
//!
//! What the crate owns:
//! - [`client`]: the Messages API client (retries, `retry-after`, streaming, error hints);
//! - [`messages`]: the wire types; [`stream`]: server-sent events, sans IO;
//! - [`retry`]: retry decisions, sans IO.

pub mod client;
mod error;
pub mod messages;
pub mod retry;
pub mod stream;

pub use client::{ApiKey, MessagesClient, MessagesConfig, Model};
pub use error::{Error, Result};
