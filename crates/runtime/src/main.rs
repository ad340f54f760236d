//! `sandbox-runtime`: the in-sandbox server on :8888. Parses flags (with `SANDBOX_*`
//! environment fallbacks), logs to stderr, and runs `agent_sandbox_runtime::run`.
//!
//! Errors are printed as one line (the error and its causes), never with a backtrace: a
//! configuration error (bad flag value, base directory that cannot be opened, address that
//! cannot be bound) exits with 2, any other failure with 1. Backtraces stay for real panics.

use std::process::ExitCode;

use agent_sandbox_api::exit;
use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    name = "sandbox-runtime",
    version,
    about = "Executes commands and moves files inside a sandbox pod (upstream-compatible JSON plus /v1).",
    after_help = "Examples:\n  sandbox-runtime --listen 127.0.0.1:8888 --base-dir /app\n  SANDBOX_LISTEN=0.0.0.0:8888 SANDBOX_BASE_DIR=/workspace sandbox-runtime --harden"
)]
struct Cli {
    #[command(flatten)]
    args: agent_sandbox_runtime::Args,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // --help and --version print to stdout and exit 0.
        Err(error) if !error.use_stderr() => error.exit(),
        Err(error) => {
            // clap's first line names the flag and the problem; the rest is a usage tip.
            let text = error.to_string();
            eprintln!(
                "{}",
                text.lines().next().unwrap_or("error: invalid arguments")
            );
            return ExitCode::from(exit::CONFIGURATION);
        }
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        // A plain level (RUST_LOG=debug, ...), not an EnvFilter: its directive engine would
        // cost resident memory in every sandbox pod for a feature the runtime does not need.
        .with_max_level(
            std::env::var("RUST_LOG")
                .ok()
                .and_then(|level| {
                    level
                        .parse::<tracing_subscriber::filter::LevelFilter>()
                        .ok()
                })
                .unwrap_or(tracing_subscriber::filter::LevelFilter::INFO),
        )
        .init();
    match agent_sandbox_runtime::run(cli.args.into_config()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {}", exit::error_line(&error));
            if error.is_configuration() {
                ExitCode::from(exit::CONFIGURATION)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}
