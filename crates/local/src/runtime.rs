//! The hidden runtime subcommand: how a binary that embeds a local cluster (`sandboxctl`,
//! `sandbox-agent`) serves the runtime in that cluster's pods, so that it needs no
//! `sandbox-runtime` installed next to it.
//!
//! Such a binary checks [`requested`] (or parses [`RUNTIME_SUBCOMMAND`] as a subcommand) first
//! thing in its synchronous `main`, before starting a tokio runtime, and hands over to [`main`].

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;

use agent_sandbox_api::exit;
use clap::Parser as _;

/// The runtime's flags, for a binary's own subcommand definition.
pub use agent_sandbox_runtime::Args;

/// The hidden subcommand under which a binary embedding a local cluster serves the runtime.
pub const RUNTIME_SUBCOMMAND: &str = "__runtime";

/// Whether this process was started as the runtime of a local cluster's pod
/// (`argv[1] == RUNTIME_SUBCOMMAND`).
pub fn requested() -> bool {
    std::env::args_os()
        .nth(1)
        .is_some_and(|arg| arg == RUNTIME_SUBCOMMAND)
}

/// The runtime's flags after the subcommand (with their `SANDBOX_*` environment fallbacks).
#[derive(Debug, clap::Parser)]
#[command(name = RUNTIME_SUBCOMMAND)]
struct RuntimeCli {
    #[command(flatten)]
    args: Args,
}

/// Parses the runtime's flags from `argv` (the program name first, then the subcommand, then
/// the flags) and serves; see [`main`]. A flag error is one line and exit status 2, as every
/// other configuration error.
pub fn main_from_args(argv: impl IntoIterator<Item = OsString>) -> ExitCode {
    let argv: Vec<OsString> = argv.into_iter().collect();
    let program = argv
        .first()
        .map(|path| std::path::Path::new(path).file_name().unwrap_or(path))
        .map_or_else(String::new, |name| name.to_string_lossy().into_owned());
    // The subcommand stands as the program name, so the runtime's flags parse as they are.
    let cli = match RuntimeCli::try_parse_from(argv.into_iter().skip(1)) {
        Ok(cli) => cli,
        // --help prints to stdout and exits 0.
        Err(error) if !error.use_stderr() => error.exit(),
        Err(error) => {
            eprintln!(
                "{}",
                exit::usage_line(
                    &error.to_string(),
                    &format!("{program} {RUNTIME_SUBCOMMAND}")
                )
            );
            return ExitCode::from(exit::CONFIGURATION);
        }
    };
    main(cli.args)
}

/// Serves the runtime until SIGTERM/SIGINT or until the process that started it is gone, and
/// returns the exit code `sandbox-runtime` would: 0, 2 for a configuration error (a base
/// directory or address that cannot be used), 1 otherwise; errors are printed on stderr with
/// their causes.
pub fn main(args: Args) -> ExitCode {
    match serve(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: sandbox runtime: {}", exit::error_line(&error));
            if error.is_configuration() {
                ExitCode::from(exit::CONFIGURATION)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// Serves the runtime with its own tokio runtime (call from a synchronous `main`).
fn serve(args: Args) -> agent_sandbox_runtime::Result<()> {
    agent_sandbox_runtime::run_until(args.into_config(), async {
        tokio::select! {
            () = agent_sandbox_runtime::shutdown_signal() => {}
            () = parent_gone() => tracing::info!("the local cluster is gone; stopping"),
        }
    })
}

/// Resolves once this process's parent has changed (it died and we were re-parented): without
/// a parent-death signal, this is how a runtime outlives no `SIGKILL`ed cluster.
async fn parent_gone() {
    let first = rustix::process::getppid();
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        if rustix::process::getppid() != first {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_subcommand_parses_the_runtimes_own_flags() {
        let cli = RuntimeCli::try_parse_from([RUNTIME_SUBCOMMAND, "--help"]);
        let help = cli.unwrap_err().to_string();
        assert!(help.contains("--listen"), "{help}");
    }
}
