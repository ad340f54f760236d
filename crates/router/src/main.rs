//! `sandbox-router`: parses flags (with `SANDBOX_ROUTER_*` environment fallbacks), sets up
//! logging, builds a kube client from the usual kubeconfig or in-cluster configuration, and runs
//! `agent_sandbox_router::run` until SIGTERM or Ctrl-C. `sandbox-router mint-token` prints a
//! scoped token for one sandbox.
//!
//! Every error ends the process with one line on stderr, `error: ...`, and no backtrace even
//! under `RUST_BACKTRACE=1` (that is for panics): exit code 2 when the configuration cannot be
//! used (a flag value, a token or key file, the listen address, the Kubernetes configuration),
//! 1 for anything else.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agent_sandbox_api::exit;
use anyhow::Context as _;
use clap::{Parser, Subcommand};

/// A configuration the router cannot run with, beyond the library's own [`Error`] variants
/// (see [`Error::is_configuration`]).
///
/// [`Error`]: agent_sandbox_router::Error
/// [`Error::is_configuration`]: agent_sandbox_router::Error::is_configuration
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct ConfigError(String);

#[derive(Debug, Parser)]
#[command(
    name = "sandbox-router",
    version,
    about = "Routes requests with X-Sandbox-* headers to the runtime in each sandbox pod.",
    after_help = "Examples:\n  sandbox-router --auth scoped --signing-key-file /etc/sandbox-router/signing-key\n  SANDBOX_ROUTER_AUTH=token SANDBOX_ROUTER_TOKEN_FILE=/etc/sandbox-router/token sandbox-router\n  sandbox-router mint-token --signing-key-file key --namespace default --sandbox my-box --ttl-seconds 3600",
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    args: Option<agent_sandbox_router::Args>,
    /// Log format: text or json.
    #[arg(long, env = "SANDBOX_ROUTER_LOG_FORMAT", default_value = "text", global = true,
          value_parser = ["text", "json"])]
    log_format: String,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print a scoped token granting access to one sandbox until it expires.
    MintToken {
        /// File holding the signing key (the one the router verifies with).
        #[arg(long, env = "SANDBOX_ROUTER_SIGNING_KEY_FILE")]
        signing_key_file: PathBuf,
        /// Namespace of the sandbox.
        #[arg(long, default_value = agent_sandbox_api::wire::DEFAULT_SANDBOX_NAMESPACE)]
        namespace: String,
        /// Name of the sandbox.
        #[arg(long)]
        sandbox: String,
        /// Lifetime of the token in seconds.
        #[arg(long, default_value = "3600", value_parser = agent_sandbox_api::units::parse_positive_duration)]
        ttl_seconds: Duration,
    },
}

fn init_logging(format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter);
    if format == "json" {
        builder.json().init();
    } else {
        builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init();
    }
}

fn mint(
    key_file: &std::path::Path,
    namespace: &str,
    sandbox: &str,
    ttl: Duration,
) -> anyhow::Result<()> {
    for (flag, value) in [("--namespace", namespace), ("--sandbox", sandbox)] {
        if !agent_sandbox_api::names::is_dns_label(value) {
            return Err(ConfigError(format!(
                "{flag} {value:?} is not a DNS-1123 label (lowercase letters, digits and '-', at \
                 most 63 characters)"
            ))
            .into());
        }
    }
    let key = agent_sandbox_router::read_signing_key(key_file)?;
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let expires_at = i64::try_from(now.saturating_add(ttl.as_secs().max(1)))?;
    let token = agent_sandbox_api::token::mint(
        key.expose(),
        &agent_sandbox_api::token::Claims::new(namespace, sandbox, expires_at),
    )?;
    println!("{token}");
    Ok(())
}

async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM; only Ctrl-C stops the router");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        () = terminate => tracing::info!("SIGTERM received"),
        result = tokio::signal::ctrl_c() => {
            if result.is_ok() {
                tracing::info!("interrupt received");
            }
        }
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => return usage_error(&error),
    };
    init_logging(&cli.log_format);
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!(
                "error: {}{}",
                exit::error_line(error.as_ref()),
                hint(&error)
            );
            ExitCode::from(exit::status(is_configuration(&error)))
        }
    }
}

/// A command-line error as one line (clap's text, with its usage and tip lines folded), or the
/// help and version text clap prints on request.
fn usage_error(error: &clap::Error) -> ExitCode {
    if !error.use_stderr() {
        let _ = error.print();
        return ExitCode::SUCCESS;
    }
    eprintln!(
        "{}",
        exit::usage_line(&error.render().to_string(), "sandbox-router")
    );
    ExitCode::from(exit::CONFIGURATION)
}

fn is_configuration(error: &anyhow::Error) -> bool {
    error.downcast_ref::<ConfigError>().is_some()
        || error
            .downcast_ref::<agent_sandbox_router::Error>()
            .is_some_and(agent_sandbox_router::Error::is_configuration)
}

/// What to change, for the configuration errors whose message does not name the flag.
fn hint(error: &anyhow::Error) -> &'static str {
    use agent_sandbox_router::Error;
    match error.downcast_ref::<Error>() {
        Some(Error::Bind { .. }) => "; choose another --listen address",
        Some(
            Error::ReadSecret {
                what: "static token",
                ..
            }
            | Error::TokenTooShort { .. },
        ) => "; check --token-file",
        Some(Error::ReadSecret { .. } | Error::SigningKey { .. }) => "; check --signing-key-file",
        Some(Error::InvalidNamespace { .. }) => "; check --namespace",
        _ => "",
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    if let Some(Command::MintToken {
        signing_key_file,
        namespace,
        sandbox,
        ttl_seconds,
    }) = cli.command
    {
        return mint(&signing_key_file, &namespace, &sandbox, ttl_seconds);
    }
    let args = cli
        .args
        .context("flags are required unless a subcommand is given")?;
    let config = args.into_config()?;
    // kube's TLS stack uses aws-lc-rs; install it explicitly (see ../shared/STYLE.md). An Err
    // means a provider is already installed, which is what we want.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("failed to start the async runtime")?;
    runtime.block_on(async {
        let client = kube::Client::try_default().await.context(ConfigError(
            "failed to build a Kubernetes client from the kubeconfig (KUBECONFIG or \
             ~/.kube/config) or the in-cluster service account"
                .to_owned(),
        ))?;
        agent_sandbox_router::run(config, client, shutdown_signal()).await?;
        anyhow::Ok(())
    })?;
    Ok(())
}
