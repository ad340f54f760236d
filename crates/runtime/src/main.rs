//! `sandbox-runtime`: the in-sandbox server on :8888. Parses flags (with `SANDBOX_*`
//! environment fallbacks), logs to stderr, and runs `agent_sandbox_runtime::run`.

use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    name = "sandbox-runtime",
    version,
    about = "Executes commands and moves files inside a sandbox pod (upstream-compatible JSON plus /v1).",
    after_help = "Examples:\n  sandbox-runtime --listen 127.0.0.1:8888 --base-dir /app\n  SANDBOX_LISTEN=0.0.0.0:8888 SANDBOX_BASE_DIR=/workspace sandbox-runtime --harden"
)]
struct Cli {
    #[command(flatten)]
    args: agent_sandbox_runtime::Args,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        // A plain level (RUST_LOG=debug, ...), not an EnvFilter: its directive engine would
        // cost resident memory in every sandbox pod for a feature the runtime does not need.
        .with_max_level(
            std::env::var("RUST_LOG")
                .ok()
                .and_then(|level| {
                    level
                        .parse::<tracing_subscriber::filter::LevelFilter>()
                        .ok()
                })
                .unwrap_or(tracing_subscriber::filter::LevelFilter::INFO),
        )
        .init();
    agent_sandbox_runtime::run(cli.args.into_config())?;
    Ok(())
}
