//! `sandboxctl`: the command line of agent-sandbox, and the local cluster it (and the demo agent)
//! can start in-process.
//!
//! - [`local`]: [`local::LocalCluster`], the simulated cluster + controller + router + a warm
//!   Python pool in one process, with no Docker and no extra binary (pods re-execute the current
//!   binary's hidden runtime subcommand). Reused by `sandbox-agent --local`.
//! - [`cli`]: the flags and subcommands (clap); [`run`] executes a parsed [`cli::Cli`].
//! - [`commands`]: one function per subcommand. Claims, commands and files go through the SDK
//!   (`agent_sandbox`); pools, logs and listings read the API directly.
//! - [`context`]: which cluster, namespace and router a command talks to.
//! - [`output`] (tables, JSON, YAML), [`spinner`] (progress on a terminal), [`token`] (scoped
//!   router tokens).
//!
//! Usage and a session transcript: `docs/cli.md`.

pub mod cli;
pub mod commands;
pub mod context;
pub mod error;
pub mod local;
pub mod output;
pub mod spinner;
pub mod token;

pub use error::{Error, Result};

/// Runs a parsed command line (all but the hidden runtime subcommand, which `main` serves
/// before starting a tokio runtime) and returns the process exit code.
pub async fn run(cli: cli::Cli) -> Result<i32> {
    commands::dispatch(cli).await
}
