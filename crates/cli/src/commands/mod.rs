//! One function per subcommand; [`dispatch`] picks it.

pub mod cluster;
pub mod dev;
pub mod sandbox;

use std::io::Write as _;

use crate::cli::{Cli, Command};
use crate::context::Cluster;
use crate::error::{Error, Result};

/// Runs the subcommand of `cli` and returns the exit code.
pub async fn dispatch(cli: Cli) -> Result<i32> {
    let global = cli.global.without_empty();
    watch_signals();
    match cli.command {
        Command::Dev(args) => dev::dev(args).await,
        Command::Run(args) if args.local => sandbox::run_local(&global, args).await,
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
            let cluster = Cluster::connect(&global).await?;
            let outcome = match command {
                Command::Run(args) => sandbox::run(&cluster, args).await,
                Command::Claim(args) => sandbox::claim(&cluster, args).await,
                Command::Exec(args) => sandbox::exec(&cluster, args).await,
                Command::Cp(args) => sandbox::cp(&cluster, args).await,
                Command::Ls(args) => sandbox::ls(&cluster, args).await,
                Command::Cat(args) => sandbox::cat(&cluster, args).await,
                Command::Rm(args) => sandbox::rm(&cluster, args).await,
                Command::List(args) => cluster::list(&cluster, args).await,
                Command::Delete(args) => cluster::delete(&cluster, args).await,
                Command::Extend(args) => cluster::extend(&cluster, args).await,
                Command::Pools(args) => cluster::pools(&cluster, args).await,
                Command::Logs(args) => cluster::logs(&cluster, args).await,
                Command::Token(args) => cluster::token(&cluster, args).await,
                Command::Dev(_) | Command::Completion(_) | Command::Runtime(_) => Ok(0),
            };
            outcome.map_err(|e| e.explained(cluster.api_url.as_deref(), &cluster.router_hint()))
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
