//! `sandboxctl`: the command line of agent-sandbox. Its local cluster (`run --local`, `dev`) is
//! `agent_sandbox_local`'s, whose pods run this binary's hidden runtime subcommand.
//!
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
pub mod output;
pub mod spinner;

pub use error::{Error, Result};

/// Runs a parsed command line (all but the hidden runtime subcommand, which `main` serves
/// before starting a tokio runtime) and returns the process exit code.
pub async fn run(cli: cli::Cli) -> Result<i32> {
    commands::dispatch(cli).await
}
