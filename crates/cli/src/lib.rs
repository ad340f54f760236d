//! `sandboxctl`: the command line of agent-sandbox. Its local cluster (`run --local`, `dev`) is
//! `agent_sandbox_local`'s, whose pods run this binary's hidden runtime subcommand.
//!
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
pub mod output;
pub mod spinner;
pub mod token;

pub use error::{Error, Result};

/// Runs a parsed command line (all but the hidden runtime subcommand, which `main` serves
/// before starting a tokio runtime) and returns the process exit code.
pub async fn run(cli: cli::Cli) -> Result<i32> {
    commands::dispatch(cli).await
}
