//! `agent-sandbox-controller`: parses flags, sets up logging, runs the controller until SIGTERM.
//!
//! Errors end the process with one line on stderr, never a backtrace (those are for panics):
//! exit code 2 for a configuration error (a bad flag value, no usable kubeconfig), as clap
//! gives for a malformed flag; 1 for a failure while running.

use std::process::ExitCode;

use agent_sandbox_api::exit;
use agent_sandbox_controller::{Args, Error};
use clap::Parser;

/// Exit code of a configuration error.
const CONFIGURATION_ERROR: u8 = exit::CONFIGURATION;
/// Exit code of a failure while running (CRDs missing, leadership lost, a listener failed).
const RUN_ERROR: u8 = 1;

#[tokio::main]
async fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(args) => args,
        // --help and --version print to stdout and exit 0.
        Err(error) if !error.use_stderr() => error.exit(),
        Err(error) => {
            // clap's error as one line (it names the flag), without its usage paragraphs.
            eprintln!(
                "{}",
                exit::usage_line(&error.render().to_string(), "agent-sandbox-controller")
            );
            return ExitCode::from(CONFIGURATION_ERROR);
        }
    };
    init_tracing(&args.log_format);
    // kube and reqwest both use rustls; name the one provider explicitly.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let config = match args.into_config() {
        Ok(config) => config,
        Err(message) => return fail(CONFIGURATION_ERROR, &message),
    };
    let client = match kube::Client::try_default().await {
        Ok(client) => client,
        Err(error) => {
            return fail(
                CONFIGURATION_ERROR,
                &format!(
                    "{}; set KUBECONFIG to a readable kubeconfig, or run in a pod",
                    exit::error_line(&Error::Client(error))
                ),
            );
        }
    };
    match agent_sandbox_controller::run(client, config, shutdown_signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => fail(RUN_ERROR, &exit::error_line(&error)),
    }
}

/// Prints `message` as one line and gives the exit code.
fn fail(code: u8, message: &str) -> ExitCode {
    let line: Vec<&str> = message.split_whitespace().collect();
    eprintln!("agent-sandbox-controller: error: {}", line.join(" "));
    ExitCode::from(code)
}

fn init_tracing(format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// Resolves on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
    tracing::info!("shutting down");
}
