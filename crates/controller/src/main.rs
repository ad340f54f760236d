//! `agent-sandbox-controller`: parses flags (ours and upstream's, in Go's spellings too), sets up
//! logging and the API client, runs the controller until SIGTERM.
//!
//! Errors end the process with one line on stderr, never a backtrace (those are for panics):
//! exit code 2 for a configuration error (a bad flag value, no usable kubeconfig), as clap
//! gives for a malformed flag; 1 for a failure while running.

use std::process::ExitCode;

use agent_sandbox_api::exit;
use agent_sandbox_controller::config::Logging;
use agent_sandbox_controller::rate::ApiRateLimit;
use agent_sandbox_controller::{Args, Error};

/// Exit code of a configuration error.
const CONFIGURATION_ERROR: u8 = exit::CONFIGURATION;
/// Exit code of a failure while running (CRDs missing, leadership lost, a listener failed).
const RUN_ERROR: u8 = 1;

#[tokio::main]
async fn main() -> ExitCode {
    let (args, matches) = match Args::try_parse_go_from(std::env::args_os()) {
        Ok(parsed) => parsed,
        // --help prints to stdout and exits 0.
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
    if args.version {
        println!("agent-sandbox-controller {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    let startup = match args.into_startup(&matches) {
        Ok(startup) => startup,
        Err(message) => return fail(CONFIGURATION_ERROR, &message),
    };
    init_tracing(&startup.logging);
    // kube and reqwest both use rustls; name the one provider explicitly.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let client = match client(startup.kubeconfig.as_deref(), startup.api_rate_limit).await {
        Ok(client) => client,
        Err(error) => {
            return fail(
                CONFIGURATION_ERROR,
                &format!(
                    "{}; set KUBECONFIG (or --kubeconfig) to a readable kubeconfig, or run in a pod",
                    exit::error_line(&error)
                ),
            );
        }
    };
    // Only now, so that a configuration error above stays the one line on stderr.
    if !startup.no_effect.is_empty() {
        tracing::warn!(
            flags = %startup.no_effect.join(" "),
            "upstream's flags accepted with no effect: this controller has no counterpart to them"
        );
    }
    if !startup.config.extensions {
        tracing::info!(
            "--extensions=false: the Sandbox controller alone; no SandboxClaim, SandboxWarmPool \
             or SandboxTemplate controller"
        );
    }
    tracing::info!(
        workers = ?startup.config.workers,
        api_rate_limit = ?startup.api_rate_limit,
        refill_rate = startup.config.refill_rate,
        replenish_delay = ?startup.config.replenish_delay,
        "starting"
    );
    match agent_sandbox_controller::run(client, startup.config, shutdown_signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => fail(RUN_ERROR, &exit::error_line(&error)),
    }
}

/// The API client: from `kubeconfig` when given, else the usual search (`KUBECONFIG`,
/// `~/.kube/config`, the pod's service account), limited client-side by `rate_limit`.
async fn client(
    kubeconfig: Option<&std::path::Path>,
    rate_limit: Option<ApiRateLimit>,
) -> Result<kube::Client, Error> {
    let config = match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .map_err(|source| Error::Client(kube::Error::InferKubeconfig(source)))?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|source| Error::Client(kube::Error::InferKubeconfig(source)))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|source| Error::Client(kube::Error::InferConfig(source)))?,
    };
    let builder = kube::client::ClientBuilder::try_from(config).map_err(Error::Client)?;
    Ok(match rate_limit {
        Some(limit) => builder.with_layer(&limit).build(),
        None => builder.build(),
    })
}

/// Prints `message` as one line and gives the exit code.
fn fail(code: u8, message: &str) -> ExitCode {
    let line: Vec<&str> = message.split_whitespace().collect();
    eprintln!("agent-sandbox-controller: error: {}", line.join(" "));
    ExitCode::from(code)
}

fn init_tracing(logging: &Logging) {
    let filter = match &logging.filter {
        Some(directive) => tracing_subscriber::EnvFilter::new(directive),
        None => tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
    };
    // Colours only on a terminal: a pod's log (or a file) gets plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    if logging.json {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// Resolves on SIGTERM or Ctrl-C. The SIGTERM handler is installed at the call, not at the first
/// poll, so that a SIGTERM during startup (before the controller looks at this future) is not
/// the default action's abrupt death.
fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    let terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate());
    async move {
        let terminate = async {
            match terminate {
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
}
