//! `kube-sim`: serves a simulated Kubernetes cluster until SIGTERM.
//!
//! Every error ends the process with one line on stderr, `error: ...`, and no backtrace even
//! under `RUST_BACKTRACE=1` (that is for panics): exit code 2 when the configuration cannot be
//! used (a flag value, the port, the data directory, the kubeconfig path, pod confinement), 1 for
//! anything else.

use std::path::PathBuf;
use std::process::ExitCode;

use agent_sandbox_api::exit;
use agent_sandbox_sim::{ImageEntry, Isolation, Program, Sim, SimConfig, runtime_entry};
use anyhow::{Context, Result};
use clap::Parser;

/// A flag value kube-sim cannot use, beyond clap's own checks and the library's
/// [`agent_sandbox_sim::Error::is_configuration`] errors.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct ConfigError(String);

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
    /// Pod isolation: confined (namespaces of each pod's own; refuses to start where pods
    /// cannot be confined), strict (refuse to start unless every protection works) or none
    /// (plain processes, NOT isolated).
    #[arg(long, env = "KUBE_SIM_ISOLATION", default_value = "confined")]
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

fn split<'m>(flag: &str, mapping: &'m str) -> Result<(&'m str, &'m str), ConfigError> {
    match mapping.split_once('=') {
        Some((pattern, program)) if !pattern.is_empty() && !program.is_empty() => {
            Ok((pattern, program))
        }
        _ => Err(ConfigError(format!(
            "{flag} takes PATTERN=PROGRAM (e.g. 'busybox*=sh'), not {mapping:?}"
        ))),
    }
}

fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(args) => args,
        Err(error) => return usage_error(&error),
    };
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let served = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("failed to start the async runtime")
        .and_then(|runtime| runtime.block_on(serve(args)));
    match served {
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
        exit::usage_line(&error.render().to_string(), "kube-sim")
    );
    ExitCode::from(exit::CONFIGURATION)
}

fn is_configuration(error: &anyhow::Error) -> bool {
    error.downcast_ref::<ConfigError>().is_some()
        || error
            .downcast_ref::<agent_sandbox_sim::Error>()
            .is_some_and(agent_sandbox_sim::Error::is_configuration)
}

/// What to change, for the configuration errors whose message does not name the flag.
fn hint(error: &anyhow::Error) -> &'static str {
    use agent_sandbox_sim::Error;
    match error.downcast_ref::<Error>() {
        Some(Error::Bind { .. }) => "; choose another --port (0 lets the system choose)",
        Some(Error::DataDir { .. }) => "; choose another --data-dir",
        Some(Error::Kubeconfig { .. }) => "; choose another --kubeconfig",
        Some(Error::Kubelet {
            source: agent_sandbox_kubelet::Error::NotStrict { .. },
        }) => "; or use --isolation confined, which reports what is missing",
        _ => "",
    }
}

async fn serve(args: Args) -> Result<()> {
    let mut config = SimConfig::default()
        .port(args.port)
        .isolation(args.isolation)
        .kubeconfig(&args.kubeconfig);
    if let Some(dir) = &args.data_dir {
        config = config.data_dir(dir);
    }
    for mapping in &args.images {
        let (pattern, name) = split("--image", mapping)?;
        config = config.image(ImageEntry::new(pattern, program(name)));
    }
    for mapping in &args.runtime_images {
        let (pattern, name) = split("--runtime-image", mapping)?;
        config = config.image(runtime_entry(pattern, program(name)));
    }
    let sim = Sim::start(config)
        .await
        .context("failed to start the simulated cluster")?;
    eprintln!(
        "kube-sim: serving {} (isolation {}); kubeconfig {}",
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
