//! [`McpConfig`]: what one server process shares across its sessions: the session id that
//! labels its claims, the claims' default TTL, the caps on what tools return, and whether its
//! claims are deleted when it exits.

use std::time::Duration;

use agent_sandbox_api::names::is_label_value;

use crate::error::{Error, Result};

/// The label every claim this server creates carries, with the server's session id as value.
pub use agent_sandbox_api::labels::MCP_SESSION as SESSION_LABEL;

/// Default of [`McpConfig::default_ttl`]: upstream's `shutdown_after_seconds` default.
pub const DEFAULT_TTL: Duration = Duration::from_secs(300);
/// Default of [`McpConfig::max_output_bytes`].
pub const DEFAULT_MAX_OUTPUT_BYTES: usize = 64 * 1024;
/// Default of [`McpConfig::max_file_bytes`]. A result travels as JSON twice (text and
/// structured content), base64 for binary files; MCP clients cap one message (the Python SDK's
/// streamable HTTP client at 1 MiB per event), and an LLM's context is smaller still.
pub const DEFAULT_MAX_FILE_BYTES: u64 = 256 * 1024;

/// The server's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct McpConfig {
    /// Value of [`SESSION_LABEL`] on the claims this server creates; the server touches no
    /// claim without it. Default: random, one per server process. Give the id of an earlier
    /// server to take over its claims (e.g. after a restart).
    pub session_id: String,
    /// Lifetime of a claim after its last use unless `create_sandbox` says
    /// (`shutdown_after_seconds`); every tool call on a sandbox pushes its expiry this far.
    pub default_ttl: Duration,
    /// Bytes of each of stdout and stderr that `execute_command` returns; longer output keeps
    /// its beginning and its end and says how much was left out.
    pub max_output_bytes: usize,
    /// Largest file `download_file` returns.
    pub max_file_bytes: u64,
    /// Delete the claims this server created when it stops (stdin closed, SIGTERM, Ctrl-C).
    /// A server that is killed leaves them to their TTL.
    pub delete_on_exit: bool,
}

impl Default for McpConfig {
    fn default() -> Self {
        Self {
            session_id: new_session_id(),
            default_ttl: DEFAULT_TTL,
            max_output_bytes: DEFAULT_MAX_OUTPUT_BYTES,
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
            delete_on_exit: true,
        }
    }
}

impl McpConfig {
    /// Sets the session id, checked as a label value.
    pub fn session_id(mut self, id: impl Into<String>) -> Result<Self> {
        let id = id.into();
        if id.is_empty() || !is_label_value(&id) {
            return Err(Error::InvalidSessionId {
                id,
                label: SESSION_LABEL,
            });
        }
        self.session_id = id;
        Ok(self)
    }

    /// Sets the default TTL of claims.
    #[must_use]
    pub fn default_ttl(mut self, ttl: Duration) -> Self {
        self.default_ttl = ttl;
        self
    }

    /// Sets the cap on each output stream `execute_command` returns.
    #[must_use]
    pub fn max_output_bytes(mut self, bytes: usize) -> Self {
        self.max_output_bytes = bytes.max(1024);
        self
    }

    /// Sets the largest file `download_file` returns.
    #[must_use]
    pub fn max_file_bytes(mut self, bytes: u64) -> Self {
        self.max_file_bytes = bytes;
        self
    }

    /// Sets whether the server's claims are deleted when it stops.
    #[must_use]
    pub fn delete_on_exit(mut self, delete: bool) -> Self {
        self.delete_on_exit = delete;
        self
    }
}

/// A new random session id: `mcp-` and 24 hex digits (a label value). Not a secret: it only
/// tells this server's claims from others'.
fn new_session_id() -> String {
    format!(
        "mcp-{:012x}{:012x}",
        fastrand::u64(..) >> 16,
        fastrand::u64(..) >> 16
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_ids_are_label_values_and_differ() {
        let (a, b) = (McpConfig::default(), McpConfig::default());
        assert!(is_label_value(&a.session_id), "{}", a.session_id);
        assert_eq!(a.session_id.len(), 28);
        assert_ne!(a.session_id, b.session_id);
    }

    #[test]
    fn a_session_id_must_be_a_label_value() {
        assert_eq!(
            McpConfig::default()
                .session_id("agent-1")
                .map(|c| c.session_id)
                .ok(),
            Some("agent-1".to_owned())
        );
        for bad in ["", "a/b", "-x", &"x".repeat(64)] {
            let error = McpConfig::default().session_id(bad).err();
            assert!(
                error
                    .as_ref()
                    .is_some_and(|e| e.to_string().contains(SESSION_LABEL)),
                "{bad:?}: {error:?}"
            );
        }
    }
}
