//! `sandboxctl` (also `kubectl-sandbox`): parses the command line, sets up logging, and runs
//! `agent_sandbox_cli`. The hidden runtime subcommand (how the local cluster's pods run,
//! `agent_sandbox_local::runtime`) is served before any async runtime starts.

use std::process::ExitCode;

use agent_sandbox_cli::cli::{Cli, Command};
use clap::Parser;

fn main() -> ExitCode {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let cli = Cli::parse();
    let quiet_default = if matches!(cli.command, Command::Runtime(_)) {
        "info"
    } else {
        // The CLI speaks for itself on stderr (one line per error); libraries only warn, and
        // kube's client does not log the failed requests the CLI reports anyway.
        "warn,kube_client::client::builder=off"
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SANDBOXCTL_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(quiet_default)),
        )
        .init();
    if let Command::Runtime(runtime) = cli.command {
        return agent_sandbox_local::runtime::main(runtime.args);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: failed to start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(agent_sandbox_cli::run(cli));
    // Pod processes and tasks are stopped by now; do not wait for stray blocking reads.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    match code {
        Ok(code) => ExitCode::from(u8::try_from(code.clamp(0, 255)).unwrap_or(1)),
        Err(error) => {
            eprintln!("error: {error}");
            // Library errors keep their causes as sources; show the chain (deduplicated, as
            // some messages already quote their cause).
            let mut shown = error.to_string();
            let mut source = std::error::Error::source(&error);
            while let Some(cause) = source {
                let text = cause.to_string();
                if !shown.contains(&text) {
                    eprintln!("  caused by: {text}");
                    shown.push_str(&text);
                }
                source = cause.source();
            }
            ExitCode::FAILURE
        }
    }
}
