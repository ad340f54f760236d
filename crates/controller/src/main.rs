//! `agent-sandbox-controller`: parses flags, sets up logging, runs the controller until SIGTERM.

use agent_sandbox_controller::Args;
use anyhow::Context as _;
use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    init_tracing(&args.log_format);
    // kube and reqwest both use rustls; name the one provider explicitly.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let config = args.into_config().map_err(anyhow::Error::msg)?;
    let client = kube::Client::try_default()
        .await
        .context("failed to create a Kubernetes client from the kubeconfig or in-cluster config")?;
    agent_sandbox_controller::run(client, config, shutdown_signal()).await?;
    Ok(())
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
