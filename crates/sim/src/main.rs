//! `kube-sim`: serves a simulated Kubernetes cluster until SIGTERM.

use std::path::PathBuf;

use agent_sandbox_sim::{ImageEntry, Isolation, Program, Sim, SimConfig, runtime_entry};
use anyhow::{Context, Result, bail};
use clap::Parser;

/// A simulated Kubernetes cluster: an API server on 127.0.0.1 and a kubelet that runs pods as
/// local processes. A test harness and playground, never a production target.
#[derive(Debug, Parser)]
#[command(name = "kube-sim", version)]
struct Args {
    /// Where to write the kubeconfig (written once the server answers).
    #[arg(long, env = "KUBE_SIM_KUBECONFIG")]
    kubeconfig: PathBuf,
    /// Port on 127.0.0.1 (0: chosen by the OS).
    #[arg(long, env = "KUBE_SIM_PORT", default_value_t = 0)]
    port: u16,
    /// Pod isolation: auto (bubblewrap when available), bwrap or none.
    #[arg(long, env = "KUBE_SIM_ISOLATION", default_value = "auto")]
    isolation: Isolation,
    /// Directory for pods' files and logs (default: a temporary directory).
    #[arg(long, env = "KUBE_SIM_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Extra image mapping `PATTERN=PROGRAM` (glob over the image; the program is a path or a
    /// name found next to kube-sim or on PATH); the container's command and args apply.
    #[arg(long = "image", value_name = "PATTERN=PROGRAM")]
    images: Vec<String>,
    /// Extra mapping to a runtime-like server `PATTERN=PROGRAM`: it gets SANDBOX_LISTEN
    /// ({pod_ip}:8888) and SANDBOX_BASE_DIR (the pod's directory).
    #[arg(long = "runtime-image", value_name = "PATTERN=PROGRAM")]
    runtime_images: Vec<String>,
}

fn program(text: &str) -> Program {
    if text.contains('/') {
        Program::Path(PathBuf::from(text))
    } else {
        Program::Named(text.to_owned())
    }
}

fn split(mapping: &str) -> Result<(&str, &str)> {
    match mapping.split_once('=') {
        Some((pattern, program)) if !pattern.is_empty() && !program.is_empty() => {
            Ok((pattern, program))
        }
        _ => bail!("image mappings look like PATTERN=PROGRAM, not {mapping:?}"),
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let mut config = SimConfig::default()
        .port(args.port)
        .isolation(args.isolation)
        .kubeconfig(&args.kubeconfig);
    if let Some(dir) = &args.data_dir {
        config = config.data_dir(dir);
    }
    for mapping in &args.images {
        let (pattern, name) = split(mapping)?;
        config = config.image(ImageEntry::new(pattern, program(name)));
    }
    for mapping in &args.runtime_images {
        let (pattern, name) = split(mapping)?;
        config = config.image(runtime_entry(pattern, program(name)));
    }
    let sim = Sim::start(config)
        .await
        .context("failed to start the simulated cluster")?;
    eprintln!(
        "kube-sim: serving {} (isolation {:?}); kubeconfig {}",
        sim.base_url(),
        sim.isolation(),
        sim.kubeconfig_path().display()
    );
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("failed to listen for SIGTERM")?;
    tokio::select! {
        _ = terminate.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    sim.stop().await;
    Ok(())
}
