//! An MCP (Model Context Protocol) server whose tools run commands and move files in sandboxes
//! claimed from warm pools: what `sandboxctl mcp` serves to Claude Code, Claude Desktop and any
//! other MCP client, built on the official Rust SDK (`rmcp`) and on `agent_sandbox`.
//!
//! The tools keep the names, arguments and results of upstream's Python MCP server
//! (kubernetes-sigs/agent-sandbox `clients/integrations/mcp-server`), so prompts written for it
//! work here: `create_sandbox`, `delete_sandbox`, `execute_command`, `upload_file`,
//! `download_file`, `list_files`, `file_exists`, and the resource template
//! `sandboxes://{namespace}` (`get_sandboxes`). What this server adds: it works over stdio too
//! (one session per server process), every claim it creates expires (a TTL pushed forward on
//! each use, so a crashed client leaks nothing), the claims it created are the only ones it
//! touches, long output streams as progress notifications, returned output is capped and says
//! so, and every failure is a tool result that names what was wrong and what to do.
//!
//! What each module owns:
//! - [`config`]: [`McpConfig`], the server's limits and defaults, and the session label;
//! - `params`: the tools' arguments (JSON Schemas from their types) and their checks, sans IO;
//! - `output`: capped command output and batched progress messages, sans IO;
//! - `fit`: what fits in one MCP message (the encoded size of a result, and the guard that
//!   withholds one that does not fit), sans IO;
//! - `session`: the claims of this server (ownership, handles, TTL pushes) and the SDK clients
//!   per namespace;
//! - `server`: [`SandboxServer`], the tools, the resource and the MCP handler;
//! - `transport`: [`serve_stdio`] and [`serve_http`] (streamable HTTP with axum), and the
//!   loopback policy of listen addresses ([`check_listen_addr`]);
//! - `error`: the crate's [`Error`] (serving failed) and `ToolError` (a tool failed; never a
//!   protocol error).
//!
//! The SDK does not depend on this crate; this crate depends on no server crate.
//! Usage: `docs/mcp.md`.

pub mod config;
mod error;
mod fit;
mod output;
mod params;
mod server;
mod session;
mod transport;

pub use config::{McpConfig, SESSION_LABEL};
pub use error::{Error, Result};
pub use server::{SandboxServer, TOOL_NAMES};
pub use transport::{
    DEFAULT_LISTEN, HTTP_PATH, check_listen_addr, is_loopback, serve_http, serve_stdio,
};
