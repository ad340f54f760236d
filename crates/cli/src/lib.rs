//! `sandboxctl`: the command line of agent-sandbox, and the local cluster it (and the demo agent)
//! can start in-process.
//!
//! - [`local`]: [`local::LocalCluster`], the simulated cluster + controller + router + a warm
//!   Python pool in one process, with no Docker and no extra binary (pods re-execute the current
//!   binary's hidden runtime subcommand). Reused by `sandbox-agent --local`.
//! - [`cli`]: the flags and subcommands (clap); [`run`] executes a parsed [`cli::Cli`].
//! - [`commands`]: one function per subcommand, each working through one SDK client
//!   (`agent_sandbox::Client`, built once from the connection flags, the SDK's
//!   `agent_sandbox::args::ConnectArgs`): claims, pools, logs, tokens, commands and files all go
//!   through the SDK; the CLI adds the flags, the output and the errors that say how to fix them.
//! - [`output`] (tables, JSON, YAML), [`spinner`] (progress on a terminal).
//!
//! Usage and a session transcript: `docs/cli.md`.

pub mod cli;
pub mod commands;
pub mod error;
pub mod local;
pub mod output;
pub mod spinner;

pub use error::{Error, Result};

/// Runs a parsed command line (all but the hidden runtime subcommand, which `main` serves
/// before starting a tokio runtime) and returns the process exit code.
pub async fn run(cli: cli::Cli) -> Result<i32> {
    commands::dispatch(cli).await
}
