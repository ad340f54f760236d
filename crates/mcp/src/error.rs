//! The crate's errors: [`Error`], why serving MCP failed (the process should report it and
//! exit), and [`ToolError`], why one tool call failed (the MCP client gets it as a tool result
//! with `isError: true` and a message an LLM can act on, never as a protocol error).

use std::net::SocketAddr;

use rmcp::handler::server::tool::IntoCallToolResult;
use rmcp::model::{CallToolResponse, CallToolResult, ContentBlock};

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why the server could not start or stopped serving.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The listen address is not a loopback address and remote access was not allowed.
    #[error(
        "refusing to serve MCP on {addr}: it is not a loopback address, and this server runs \
         commands in sandboxes for anyone who reaches it (it has no authentication of its own); \
         listen on 127.0.0.1 or [::1], or pass --allow-remote behind an authenticating proxy"
    )]
    NotLoopback {
        /// The address asked for.
        addr: SocketAddr,
    },
    /// The session id given is not a Kubernetes label value.
    #[error(
        "invalid session id {id:?}: it becomes the value of the label {label} on every claim, so \
         it must be 1 to 63 of [A-Za-z0-9-_.], starting and ending with a letter or digit"
    )]
    InvalidSessionId {
        /// The id.
        id: String,
        /// The label it goes in.
        label: &'static str,
    },
    /// The MCP session on stdin/stdout could not be initialised.
    #[error("failed to start the MCP session on stdin/stdout")]
    StdioInit(#[source] Box<rmcp::service::ServerInitializeError>),
    /// The MCP session on stdin/stdout ended abnormally.
    #[error("the MCP session on stdin/stdout failed")]
    StdioTask(#[source] tokio::task::JoinError),
    /// The HTTP server failed.
    #[error("failed to serve MCP over HTTP on {addr}")]
    Http {
        /// Where it listened.
        addr: SocketAddr,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The listener's address could not be read.
    #[error("failed to read the address of the MCP listener")]
    LocalAddr(#[source] std::io::Error),
}

/// A tool call that failed in a way the caller can fix or act on: bad arguments, a claim that
/// is not this server's or is gone, a timeout, a file too large. Its message says what was
/// wrong and what to do; it reaches the client as a tool result with `isError: true`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ToolError {
    message: String,
}

impl ToolError {
    /// A tool error with `message`.
    pub(crate) fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
        }
    }

    /// The message.
    #[cfg(test)]
    pub(crate) fn message(&self) -> &str {
        &self.message
    }
}

impl std::fmt::Display for ToolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl IntoCallToolResult for ToolError {
    fn into_call_tool_result(self) -> Result<CallToolResponse, rmcp::ErrorData> {
        Ok(CallToolResult::error(vec![ContentBlock::text(self.message)]).into())
    }
}

/// `error` and its sources, each once (some messages already quote their cause).
pub(crate) fn chain(error: &dyn std::error::Error) -> String {
    let mut shown = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !shown.contains(&text) {
            shown.push_str(": ");
            shown.push_str(&text);
        }
        source = cause.source();
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_error_is_a_tool_result_not_a_protocol_error() {
        let result = ToolError::new("no such claim").into_call_tool_result();
        let Ok(CallToolResponse::Complete(result)) = result else {
            panic!("expected a complete tool result, got {result:?}");
        };
        assert_eq!(result.is_error, Some(true));
        assert_eq!(
            serde_json::to_value(&result.content).ok(),
            Some(serde_json::json!([{"type": "text", "text": "no such claim"}]))
        );
    }

    #[test]
    fn chains_show_each_cause_once() {
        let inner = std::io::Error::other("connection refused");
        let outer = Error::Http {
            addr: SocketAddr::from(([127, 0, 0, 1], 1)),
            source: inner,
        };
        assert_eq!(
            chain(&outer),
            "failed to serve MCP over HTTP on 127.0.0.1:1: connection refused"
        );
    }
}
