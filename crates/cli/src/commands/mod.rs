//! One function per subcommand; [`dispatch`] picks it. Each works through one SDK
//! [`Client`](agent_sandbox::Client), built once from the connection flags.

pub mod claims;
pub mod dev;
pub mod mcp;
pub mod pools;
pub mod sandbox;

use std::io::Write as _;

use serde::Serialize;

use crate::cli::{Cli, Command};
use crate::error::{Error, Result, RouterHint};
use crate::output::{self, Format};

/// Runs the subcommand of `cli` and returns the exit code.
pub async fn dispatch(cli: Cli) -> Result<i32> {
    let global = cli.global.without_empty();
    watch_signals();
    match cli.command {
        Command::Dev(args) => dev::dev(args).await,
        Command::Run(args) if args.local => sandbox::run_local(&global, args).await,
        Command::Mcp(args) => mcp::mcp(&global, args).await,
        Command::Completion(args) => {
            let mut command = <Cli as clap::CommandFactory>::command();
            let mut out = std::io::stdout().lock();
            clap_complete::generate(args.shell, &mut command, "sandboxctl", &mut out);
            out.flush().map_err(io("write the completion script"))?;
            Ok(0)
        }
        Command::Runtime(_) => Err(Error::Usage(
            "the runtime subcommand is served before the async runtime starts".to_owned(),
        )),
        command => {
            let client = global.connect().await.map_err(Error::connect)?;
            let outcome = match command {
                Command::Run(args) => sandbox::run(&client, args).await,
                Command::Claim(args) => sandbox::claim(&client, args).await,
                Command::Exec(args) => sandbox::exec(&client, args).await,
                Command::Cp(args) => sandbox::cp(&client, args).await,
                Command::Ls(args) => sandbox::ls(&client, args).await,
                Command::Cat(args) => sandbox::cat(&client, args).await,
                Command::Rm(args) => sandbox::rm(&client, args).await,
                Command::List(args) => claims::list(&client, args).await,
                Command::Delete(args) => claims::delete(&client, args).await,
                Command::Extend(args) => claims::extend(&client, args).await,
                Command::Suspend(args) => claims::suspend(&client, args, true).await,
                Command::Resume(args) => claims::suspend(&client, args, false).await,
                Command::Pools(args) => pools::pools(&client, args).await,
                Command::Logs(args) => claims::logs(&client, args).await,
                Command::Token(args) => claims::token(&client, args).await,
                Command::Dev(_)
                | Command::Completion(_)
                | Command::Mcp(_)
                | Command::Runtime(_) => Ok(0),
            };
            let router = RouterHint::of(&client.options().connection);
            outcome.map_err(|e| e.explained(client.api_url(), &router))
        }
    }
}

/// Maps an SDK error to [`Error::Sdk`] naming `action`.
pub(crate) fn sdk(action: impl Into<String>) -> impl FnOnce(agent_sandbox::Error) -> Error {
    let action = action.into();
    move |source| Error::Sdk {
        action,
        source: Box::new(source),
    }
}

/// `items` as `format`: the table `table` draws, or JSON or YAML.
pub(crate) fn render<T: Serialize>(
    format: Format,
    items: &T,
    table: impl FnOnce() -> String,
) -> Result<String> {
    match format {
        Format::Table => Ok(table()),
        Format::Json | Format::Yaml => {
            output::serialized(format, items).map_err(|message| Error::Render {
                format: if format == Format::Json {
                    "json"
                } else {
                    "yaml"
                },
                message,
            })
        }
    }
}

/// Maps an IO error to [`Error::Io`] naming `action`.
pub(crate) fn io(action: &str) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        action: action.to_owned(),
        source,
    }
}

/// Prints `text` to stdout (a closed pipe is not an error worth a message).
pub(crate) fn print(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.map_err(io("write to stdout")),
    }
}

static INTERRUPT: std::sync::OnceLock<tokio_util::sync::CancellationToken> =
    std::sync::OnceLock::new();

fn interrupt_token() -> &'static tokio_util::sync::CancellationToken {
    INTERRUPT.get_or_init(tokio_util::sync::CancellationToken::new)
}

/// Installs the SIGINT/SIGTERM handlers once, for the whole command: a signal that arrives
/// between two waits is remembered, never lost (and never kills the process half-way through
/// a cleanup).
pub fn watch_signals() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::warn!("cannot watch SIGINT/SIGTERM; Ctrl-C will not clean up");
        return;
    };
    // Detached on purpose: it lives as long as the command, and the runtime's shutdown ends it.
    drop(tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        interrupt_token().cancel();
    }));
}

/// Resolves once Ctrl-C (SIGINT) or SIGTERM was received (at once if it already was).
pub async fn interrupted() {
    interrupt_token().cancelled().await;
}
