//! `sandbox-router`: parses flags (with `SANDBOX_ROUTER_*` environment fallbacks), sets up
//! logging, builds a kube client from the usual kubeconfig or in-cluster configuration, and runs
//! `agent_sandbox_router::run` until SIGTERM or Ctrl-C. `sandbox-router mint-token` prints a
//! scoped token for one sandbox.

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use clap::{Parser, Subcommand};

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
        #[arg(long, default_value = "3600", value_parser = agent_sandbox_router::parse_seconds)]
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
    anyhow::ensure!(
        agent_sandbox_router::is_dns_label(namespace)
            && agent_sandbox_router::is_dns_label(sandbox),
        "namespace and sandbox must be DNS-1123 labels"
    );
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

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    init_logging(&cli.log_format);
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
        let client = kube::Client::try_default().await.context(
            "failed to build a Kubernetes client from the kubeconfig or in-cluster configuration",
        )?;
        agent_sandbox_router::run(config, client, shutdown_signal()).await?;
        anyhow::Ok(())
    })?;
    Ok(())
}
