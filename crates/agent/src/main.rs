//! `sandbox-agent`: parses the command line, sets up logging, connects (a cluster from the
//! kubeconfig flags, or `--local`), and runs one agent session. The hidden runtime subcommand
//! (how the local cluster's pods run, `agent_sandbox_local::runtime`) is served before anything
//! else.

use std::process::ExitCode;
use std::time::Duration;

use agent_sandbox::args::ConnectArgs;
use agent_sandbox_agent::agent::{LoopConfig, StderrReporter, Stop};
use agent_sandbox_agent::client::{
    DEFAULT_BASE_URL, DEFAULT_MAX_TOKENS, DEFAULT_MODEL, ENV_API_KEY, ENV_BASE_URL,
};
use agent_sandbox_agent::retry::Backoff;
use agent_sandbox_agent::session::{self, SessionOptions};
use agent_sandbox_agent::tools::{ToolLimits, error_chain};
use agent_sandbox_agent::{ApiKey, Error, MessagesClient, MessagesConfig};
use agent_sandbox_api::units::{parse_duration, parse_size_usize};
use agent_sandbox_local::{DEFAULT_POOL, LocalConfig};
use anyhow::{Context as _, bail};
use clap::Parser;

/// An LLM agent whose every tool call runs in a sandbox claimed from a warm pool.
///
/// The loop runs here; only the tools (run_command, write_file, read_file, list_files) run in
/// the sandbox. The claim expires --ttl after the last tool call, so a crashed agent leaks
/// nothing; it is deleted at the end unless --keep.
#[derive(Debug, Parser)]
#[command(
    name = "sandbox-agent",
    version,
    after_help = "Examples:
  export ANTHROPIC_API_KEY=sk-ant-...
  sandbox-agent --local \"write a python script that prints the first 10 fibonacci numbers and run it\"
  sandbox-agent --pool python-sandbox-pool -n default \"what python version do you have?\"
  sandbox-agent --pool python-sandbox-pool --router-url http://127.0.0.1:8080 --keep --ttl 30m \"...\"

Progress ([tool] lines) goes to stderr, the answer to stdout. Exit codes: 0 answered,
1 error, 3 stopped by a limit (--max-turns, --max-total-tokens, --max-tokens) or a refusal.
Ctrl-C or SIGTERM deletes the claim before exiting."
)]
struct Args {
    /// What to ask the agent (several words are joined with spaces).
    #[arg(required = true, value_name = "PROMPT")]
    prompt: Vec<String>,
    /// SandboxWarmPool to claim from (default with --local: the local cluster's pool).
    #[arg(long, value_name = "NAME")]
    pool: Option<String>,
    /// Keep the claim at the end (it still expires --ttl after the last tool call).
    #[arg(long)]
    keep: bool,
    /// Run on an in-process local cluster (no Kubernetes, no Docker), as `sandboxctl run --local`.
    #[arg(long)]
    local: bool,
    /// With --local: pod isolation (confined: namespaces of each pod's own, or refuse to start
    /// where pods cannot be confined; strict: refuse to start unless every protection works;
    /// none: plain processes, NOT isolated).
    #[arg(long, default_value = "confined", requires = "local")]
    isolation: agent_sandbox_local::Isolation,
    /// With --local: pod networks (auto: own where this machine allows, else isolated; own: on
    /// a bridge with NetworkPolicies enforced, or refuse to start; isolated: loopback only).
    #[arg(long, default_value = "auto", requires = "local", value_parser = agent_sandbox_local::PodNetworks::for_users)]
    network: agent_sandbox_local::PodNetworks,
    /// The claim expires this long after the last tool call (e.g. 300s, 5m, 1h).
    #[arg(long, default_value = "5m", value_parser = parse_duration, value_name = "DURATION")]
    ttl: Duration,
    /// Model id.
    #[arg(long, env = "ANTHROPIC_MODEL", default_value = DEFAULT_MODEL, value_name = "ID")]
    model: String,
    /// Cap on the tokens of each model response.
    #[arg(long, default_value_t = DEFAULT_MAX_TOKENS, value_name = "N")]
    max_tokens: u32,
    /// Model requests at most.
    #[arg(long, default_value_t = 30, value_name = "N")]
    max_turns: u32,
    /// Stop once this many tokens (input and output, all requests) were used.
    #[arg(long, default_value_t = 1_000_000, value_name = "N")]
    max_total_tokens: u64,
    /// Stream responses (server-sent events) instead of one JSON body per request.
    #[arg(long)]
    stream: bool,
    /// Retries of a request answered 408/409/429/5xx/529 or not answered.
    #[arg(long, default_value_t = 4, value_name = "N")]
    max_retries: u32,
    /// Base URL of the Messages API (proxies, gateways).
    #[arg(long, env = ENV_BASE_URL, default_value = DEFAULT_BASE_URL, value_name = "URL")]
    base_url: String,
    /// Bytes of each command output stream or file shown to the model.
    #[arg(long, default_value = "16KiB", value_parser = parse_size_usize, value_name = "BYTES")]
    tool_output_limit: usize,
    /// Timeout of a command when the model names none.
    #[arg(long, default_value = "2m", value_parser = parse_duration, value_name = "DURATION")]
    command_timeout: Duration,
    /// Connection to the cluster and the router (the SDK's flags, as sandboxctl's).
    #[command(flatten)]
    global: ConnectArgs,
}

fn main() -> ExitCode {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let runtime_mode = agent_sandbox_local::runtime::requested();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SANDBOX_AGENT_LOG").unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new(if runtime_mode { "info" } else { "warn" })
            }),
        )
        .init();
    if runtime_mode {
        return agent_sandbox_local::runtime::main_from_args(std::env::args_os());
    }
    let args = Args::parse();
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
    let code = runtime.block_on(run(args));
    runtime.shutdown_timeout(Duration::from_secs(1));
    match code {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {}", error_chain(error.as_ref()));
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let Ok(key) = std::env::var(ENV_API_KEY) else {
        bail!("{ENV_API_KEY} is not set: export a key from the Claude Console");
    };
    if key.trim().is_empty() {
        bail!("{ENV_API_KEY} is empty: export a key from the Claude Console");
    }
    let mut config = MessagesConfig::new(ApiKey::new(key));
    config.base_url = args.base_url;
    config.model = args.model;
    config.max_tokens = args.max_tokens;
    config.stream = args.stream;
    config.retry = Backoff {
        max_retries: args.max_retries,
        ..Backoff::default()
    };
    let model = MessagesClient::new(config)?;
    let options = SessionOptions {
        pool: match (&args.pool, args.local) {
            (Some(pool), _) => pool.clone(),
            (None, true) => DEFAULT_POOL.to_owned(),
            (None, false) => bail!("--pool is required (or use --local)"),
        },
        keep: args.keep,
        loop_config: LoopConfig {
            max_turns: args.max_turns,
            max_total_tokens: args.max_total_tokens,
            ttl: args.ttl,
            tools: ToolLimits {
                output_limit: args.tool_output_limit,
                command_timeout: args.command_timeout,
                ..ToolLimits::default()
            },
        },
    };
    let prompt = args.prompt.join(" ");

    // Kept alive until the session ends: dropping the local cluster stops it.
    let mut local = None;
    let client = if args.local {
        let config = LocalConfig {
            isolation: args.isolation,
            networks: args.network,
            ..LocalConfig::default()
        };
        let started = session::start_local(config, Duration::from_secs(120))
            .await
            .context("--local")?;
        let client = started.client.clone();
        local = Some(started);
        client
    } else {
        // Scoped routers (a signing key): a token per request for the session's own sandbox.
        args.global
            .connect()
            .await
            .map_err(|source| Error::Connect {
                source: Box::new(source),
            })?
    };
    let _cleanup = client.enable_auto_cleanup()?;
    let outcome = session::run(&client, &model, &prompt, &options, &StderrReporter).await;
    if let Some(local) = local.take() {
        local.cluster.stop().await;
    }
    let outcome = outcome?;
    if !outcome.text.is_empty() {
        println!("{}", outcome.text);
    }
    let usage = outcome.usage;
    tracing::info!(
        turns = outcome.turns,
        tool_calls = outcome.tool_calls,
        input_tokens = usage.input_tokens,
        output_tokens = usage.output_tokens,
        "done"
    );
    Ok(match outcome.stop {
        Stop::Answered => ExitCode::SUCCESS,
        stop => {
            let why = match stop {
                Stop::TurnLimit => "the turn limit (--max-turns) was reached",
                Stop::TokenLimit => "the token budget (--max-total-tokens) was used up",
                Stop::MaxTokens => "the answer was cut by --max-tokens",
                Stop::Refusal | Stop::Answered => "the model declined",
            };
            eprintln!("stopped: {why}");
            ExitCode::from(3)
        }
    })
}
