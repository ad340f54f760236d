//! `sandbox-router`: parses flags (ours with `SANDBOX_ROUTER_*` environment fallbacks, and
//! upstream's Go router flags in Go's spellings, `-flag` included), reads upstream's environment
//! variables, sets up logging, builds a kube client from `--kubeconfig` or the usual kubeconfig
//! or in-cluster configuration, and runs `agent_sandbox_router::run` until SIGTERM or Ctrl-C.
//! `sandbox-router mint-token` prints a scoped token (v1, or v2 with `--v2-private-key-file`);
//! `sandbox-router v2-key-file` prints the v2 verification key file of a private key.
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
    args: agent_sandbox_router::Args,
    /// Log format: text or json (upstream's --zap-encoder=json also selects json).
    #[arg(long, env = "SANDBOX_ROUTER_LOG_FORMAT", default_value = "text", global = true,
          value_parser = ["text", "json"])]
    log_format: String,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print a scoped token granting access to one sandbox until it expires: v1 (HMAC, bound to
    /// namespace and name) with --signing-key-file, v2 (Ed25519, bound to the whole request
    /// target) with --v2-private-key-file.
    MintToken {
        /// File holding the v1 signing key (the one the router verifies with).
        #[arg(
            long,
            env = "SANDBOX_ROUTER_SIGNING_KEY_FILE",
            required_unless_present = "v2_private_key_file",
            conflicts_with = "v2_private_key_file"
        )]
        signing_key_file: Option<PathBuf>,
        /// File holding a v2 private key: a 32-byte Ed25519 seed as unpadded base64url.
        #[arg(long, requires_all = ["kid", "uid"])]
        v2_private_key_file: Option<PathBuf>,
        /// v2: the key ID the router knows the public key by.
        #[arg(long)]
        kid: Option<String>,
        /// v2: the sandbox's UID (clients send it as X-Sandbox-UID).
        #[arg(long)]
        uid: Option<String>,
        /// v2: the port in the sandbox's pod.
        #[arg(long, default_value_t = agent_sandbox_api::wire::RUNTIME_PORT)]
        port: u16,
        /// v2: the HTTP method.
        #[arg(long, default_value = "POST")]
        method: String,
        /// v2: the path, without the query.
        #[arg(long, default_value = "/execute")]
        path: String,
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
    /// Print the v2 verification key file (for --authz-scoped-token-verification-keys-file) of
    /// a v2 private key.
    V2KeyFile {
        /// File holding the v2 private key: a 32-byte Ed25519 seed as unpadded base64url.
        #[arg(long)]
        private_key_file: PathBuf,
        /// The key ID to publish it under.
        #[arg(long)]
        kid: String,
    },
}

/// A v2 token request of `mint-token`.
struct V2Mint<'a> {
    private_key_file: &'a std::path::Path,
    kid: &'a str,
    uid: &'a str,
    port: u16,
    method: &'a str,
    path: &'a str,
}

fn init_logging(format: &str, level: Option<&str>) {
    let filter = match level {
        Some(level) => tracing_subscriber::EnvFilter::new(level),
        None => tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
    };
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
    key_file: Option<&std::path::Path>,
    v2: Option<V2Mint<'_>>,
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
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let expires_at = i64::try_from(now.saturating_add(ttl.as_secs().max(1)))?;
    let token = match (v2, key_file) {
        (Some(v2), _) => {
            use agent_sandbox_api::token::v2 as tv2;
            let key = read_v2_private_key(v2.private_key_file)?;
            let target = tv2::Target {
                namespace: namespace.to_owned(),
                name: sandbox.to_owned(),
                uid: v2.uid.to_owned(),
                port: v2.port,
                method: v2.method.to_owned(),
                path: v2.path.to_owned(),
            };
            let claims = tv2::Claims::for_target(&target, expires_at)
                .map_err(|error| ConfigError(format!("cannot mint a v2 token: {error}")))?;
            tv2::mint(&key, v2.kid, &claims)
                .map_err(|error| ConfigError(format!("cannot mint a v2 token: {error}")))?
        }
        (None, Some(key_file)) => {
            let key = agent_sandbox_router::read_signing_key(key_file)?;
            agent_sandbox_api::token::mint(
                key.expose(),
                &agent_sandbox_api::token::Claims::new(namespace, sandbox, expires_at),
            )?
        }
        (None, None) => {
            return Err(ConfigError(
                "mint-token needs --signing-key-file (v1) or --v2-private-key-file (v2)".to_owned(),
            )
            .into());
        }
    };
    println!("{token}");
    Ok(())
}

fn read_v2_private_key(
    path: &std::path::Path,
) -> anyhow::Result<agent_sandbox_api::token::v2::PrivateKey> {
    let text = std::fs::read(path).map_err(|error| {
        ConfigError(format!(
            "failed to read the v2 private key from {}: {error}",
            path.display()
        ))
    })?;
    agent_sandbox_api::token::v2::PrivateKey::parse(&text).map_err(|error| {
        ConfigError(format!(
            "{error} (in {}; generate one with `openssl rand 32 | basenc --base64url | tr -d =`)",
            path.display()
        ))
        .into()
    })
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
    // Upstream's manifests spell flags as Go does (`-flag=value`); clap wants two dashes.
    let command = <Cli as clap::CommandFactory>::command();
    let mut long_names: Vec<String> = command
        .get_arguments()
        .filter_map(|arg| arg.get_long().map(str::to_owned))
        .collect();
    long_names.push("version".to_owned());
    long_names.push("help".to_owned());
    let names: Vec<&str> = long_names.iter().map(String::as_str).collect();
    let argv = agent_sandbox_api::go_flag::normalize_args(std::env::args_os(), &names);
    let parsed = command
        .clone()
        .try_get_matches_from(argv)
        .and_then(|matches| {
            let mut cli = <Cli as clap::FromArgMatches>::from_arg_matches(&matches)?;
            // Which settings are ours decides whether upstream's Go router default may apply.
            cli.args.record_sources(&command, &matches);
            Ok(cli)
        });
    let cli = match parsed {
        Ok(cli) => cli,
        Err(error) => return usage_error(&error),
    };
    let (level, json) = match cli.args.go.log_filter() {
        Ok(level) => (level, cli.args.go.log_json()),
        Err(message) => {
            eprintln!("error: {message}");
            return ExitCode::from(exit::CONFIGURATION);
        }
    };
    let format = match json {
        Some(true) => "json",
        _ => cli.log_format.as_str(),
    };
    init_logging(format, level);
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
        Some(Error::Bind { .. }) => {
            "; choose another address (--listen or --http-bind-address, \
             --health-probe-bind-address, --metrics-bind-address)"
        }
        Some(
            Error::ReadSecret {
                what: "static token",
                ..
            }
            | Error::TokenTooShort { .. },
        ) => "; check --token-file",
        Some(
            Error::ReadSecret {
                what: "scoped-token v2 verification keys",
                ..
            }
            | Error::VerificationKeys { .. },
        ) => "; check --authz-scoped-token-verification-keys-file",
        Some(Error::ReadSecret { .. } | Error::SigningKey { .. }) => {
            "; check --signing-key-file (or --authz-scoped-token-secret-file)"
        }
        Some(Error::InvalidNamespace { .. }) => "; check --namespace (or --cache-namespace)",
        _ => "",
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Some(Command::MintToken {
            signing_key_file,
            v2_private_key_file,
            kid,
            uid,
            port,
            method,
            path,
            namespace,
            sandbox,
            ttl_seconds,
        }) => {
            let v2 = v2_private_key_file.as_deref().map(|file| V2Mint {
                private_key_file: file,
                kid: kid.as_deref().unwrap_or_default(),
                uid: uid.as_deref().unwrap_or_default(),
                port,
                method: &method,
                path: &path,
            });
            return mint(
                signing_key_file.as_deref(),
                v2,
                &namespace,
                &sandbox,
                ttl_seconds,
            );
        }
        Some(Command::V2KeyFile {
            private_key_file,
            kid,
        }) => {
            let key = read_v2_private_key(&private_key_file)?;
            let file = key
                .key_file(&kid)
                .map_err(|error| ConfigError(format!("--kid: {error}")))?;
            println!("{file}");
            return Ok(());
        }
        None => {}
    }
    let resolved = cli.args.resolve(&|name| std::env::var(name).ok())?;
    for warning in &resolved.warnings {
        tracing::warn!("{warning}");
    }
    let config = resolved.config;
    // kube's TLS stack uses aws-lc-rs; install it explicitly (see ../shared/STYLE.md). An Err
    // means a provider is already installed, which is what we want.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("failed to start the async runtime")?;
    runtime.block_on(async {
        let client = match resolved.kubeconfig {
            Some(path) => client_from(&path).await?,
            None => kube::Client::try_default().await.context(ConfigError(
                "failed to build a Kubernetes client from the kubeconfig (KUBECONFIG or \
                 ~/.kube/config) or the in-cluster service account"
                    .to_owned(),
            ))?,
        };
        agent_sandbox_router::run(config, client, shutdown_signal()).await?;
        anyhow::Ok(())
    })?;
    Ok(())
}

/// A client from the kubeconfig file `--kubeconfig` names.
async fn client_from(path: &std::path::Path) -> anyhow::Result<kube::Client> {
    let failed = || {
        ConfigError(format!(
            "failed to build a Kubernetes client from --kubeconfig {}",
            path.display()
        ))
    };
    let kubeconfig = kube::config::Kubeconfig::read_from(path).context(failed())?;
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .context(failed())?;
    kube::Client::try_from(config).context(failed())
}
