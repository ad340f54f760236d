//! Configuration: the [`Config`] the server runs with, and the command-line [`Args`] (flags with
//! environment fallbacks) that produce it. `Args` is a `clap::Args` so that another binary (the
//! CLI) can embed the runtime as a subcommand with the same flags.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use agent_sandbox_api::units::{parse_positive_duration, parse_size};
use agent_sandbox_api::wire::RUNTIME_PORT;

/// Everything the runtime server needs to know.
#[derive(Debug, Clone)]
pub struct Config {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// Directory every path is confined to and commands start in (created when missing).
    pub base_dir: PathBuf,
    /// Timeout of `/execute` and `/v1/exec` when the request sets none.
    pub exec_timeout: Duration,
    /// Cap on the bytes kept of each of stdout and stderr per command (requests may lower it).
    pub max_output_bytes: u64,
    /// Processes that may run at once (sync, streamed and background); beyond it, 429.
    pub max_processes: usize,
    /// Largest JSON or stdin request body; beyond it, 413.
    pub max_body_bytes: u64,
    /// Largest file upload (`/upload`, `PUT /v1/files`); beyond it, 413.
    pub max_upload_bytes: u64,
    /// Output bytes kept per background process for readers (the tail).
    pub process_buffer_bytes: u64,
    /// How long a finished background process stays listed.
    pub finished_retention: Duration,
    /// How many finished background processes stay listed.
    pub max_finished_processes: usize,
    /// After a command's leader exits (or is killed), how long to keep reading output that
    /// its descendants still write before killing the group and closing the pipes.
    pub drain_timeout: Duration,
    /// After a shutdown signal, how long in-flight requests get before the server stops.
    pub shutdown_grace: Duration,
    /// Tokio worker threads for [`crate::run`]; 0 means one per CPU, at most 4.
    pub worker_threads: usize,
    /// How long a client has to send a request's head: from accepting the connection, or from
    /// the first byte of a later request on it, to the end of the headers. Beyond it the
    /// connection is closed.
    pub header_read_timeout: Duration,
    /// How long a request body may send nothing while a handler waits for it; beyond it the
    /// request fails with 400 and the connection is closed. A body that keeps sending, however
    /// slowly, is never cut.
    pub body_idle_timeout: Duration,
    /// How long a keep-alive connection may sit idle between a response and the next request.
    pub keepalive_idle_timeout: Duration,
    /// Connections served at once; beyond it new connections wait in the listen backlog until
    /// one closes.
    pub max_connections: usize,
    /// Apply `no_new_privs` and Landlock (writes only beneath the base directory and `/tmp`) to
    /// every command.
    pub harden: bool,
}

/// Defaults, also used by [`Args`].
pub mod defaults {
    /// `--exec-timeout-seconds`, upstream's.
    pub const EXEC_TIMEOUT_SECONDS: &str = "300";
    /// `--max-output-bytes`.
    pub const MAX_OUTPUT_BYTES: &str = "16MiB";
    /// `--max-processes`.
    pub const MAX_PROCESSES: usize = 64;
    /// `--max-body-bytes`.
    pub const MAX_BODY_BYTES: &str = "16MiB";
    /// `--max-upload-bytes`.
    pub const MAX_UPLOAD_BYTES: &str = "16GiB";
    /// `--process-buffer-bytes`.
    pub const PROCESS_BUFFER_BYTES: &str = "1MiB";
    /// `--finished-retention-seconds`.
    pub const FINISHED_RETENTION_SECONDS: &str = "600";
    /// `--max-finished-processes`.
    pub const MAX_FINISHED_PROCESSES: usize = 64;
    /// `--drain-timeout-seconds`.
    pub const DRAIN_TIMEOUT_SECONDS: &str = "2";
    /// `--shutdown-grace-seconds`.
    pub const SHUTDOWN_GRACE_SECONDS: &str = "5";
    /// `--base-dir`, upstream's.
    pub const BASE_DIR: &str = "/app";
    /// `--header-read-timeout-seconds`: a request head arrives in milliseconds.
    pub const HEADER_READ_TIMEOUT_SECONDS: &str = "30";
    /// `--body-idle-timeout-seconds`: a body that sends nothing for two minutes has stopped.
    pub const BODY_IDLE_TIMEOUT_SECONDS: &str = "120";
    /// `--keepalive-idle-timeout-seconds`: above the idle timeouts of the router's pool (60 s)
    /// and of common client pools (reqwest 90 s), so that the client closes first.
    pub const KEEPALIVE_IDLE_TIMEOUT_SECONDS: &str = "120";
    /// `--max-connections`: far above what the router and SDKs open, and with
    /// `--max-processes`' pipes still within a 1024 file-descriptor limit.
    pub const MAX_CONNECTIONS: usize = 512;
}

impl Config {
    /// The defaults, listening on `listen` with `base_dir` (for embedding and tests).
    pub fn new(listen: SocketAddr, base_dir: impl Into<PathBuf>) -> Self {
        let size = |s: &str| parse_size(s).unwrap_or(0);
        let secs = |s: &str| parse_positive_duration(s).unwrap_or(Duration::ZERO);
        Self {
            listen,
            base_dir: base_dir.into(),
            exec_timeout: secs(defaults::EXEC_TIMEOUT_SECONDS),
            max_output_bytes: size(defaults::MAX_OUTPUT_BYTES),
            max_processes: defaults::MAX_PROCESSES,
            max_body_bytes: size(defaults::MAX_BODY_BYTES),
            max_upload_bytes: size(defaults::MAX_UPLOAD_BYTES),
            process_buffer_bytes: size(defaults::PROCESS_BUFFER_BYTES),
            finished_retention: secs(defaults::FINISHED_RETENTION_SECONDS),
            max_finished_processes: defaults::MAX_FINISHED_PROCESSES,
            drain_timeout: secs(defaults::DRAIN_TIMEOUT_SECONDS),
            shutdown_grace: secs(defaults::SHUTDOWN_GRACE_SECONDS),
            worker_threads: 0,
            header_read_timeout: secs(defaults::HEADER_READ_TIMEOUT_SECONDS),
            body_idle_timeout: secs(defaults::BODY_IDLE_TIMEOUT_SECONDS),
            keepalive_idle_timeout: secs(defaults::KEEPALIVE_IDLE_TIMEOUT_SECONDS),
            max_connections: defaults::MAX_CONNECTIONS,
            harden: false,
        }
    }

    /// Worker threads to start: the configured number, else one per CPU (as the cgroup allows),
    /// at most 4.
    pub fn effective_worker_threads(&self) -> usize {
        if self.worker_threads > 0 {
            return self.worker_threads;
        }
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .min(4)
    }
}

/// Command-line flags of `sandbox-runtime`, each with an environment fallback. Invalid values
/// are errors that name the flag (clap reports them), never silently replaced by defaults.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Address to listen on.
    #[arg(long, env = "SANDBOX_LISTEN", default_value_t = SocketAddr::from(([0, 0, 0, 0], RUNTIME_PORT)))]
    pub listen: SocketAddr,
    /// Directory all paths are confined to and commands start in (blank means the default, as
    /// upstream).
    #[arg(long, env = "SANDBOX_BASE_DIR", default_value = defaults::BASE_DIR)]
    pub base_dir: PathBuf,
    /// Default command timeout in seconds (fractions allowed; > 0).
    #[arg(long = "exec-timeout-seconds", env = "SANDBOX_EXEC_TIMEOUT_SECONDS",
          default_value = defaults::EXEC_TIMEOUT_SECONDS, value_parser = parse_positive_duration)]
    pub exec_timeout: Duration,
    /// Cap on the bytes kept of each of stdout and stderr per command (`64KiB`, `16MiB`, bytes).
    #[arg(long, env = "SANDBOX_MAX_OUTPUT_BYTES", default_value = defaults::MAX_OUTPUT_BYTES,
          value_parser = parse_size)]
    pub max_output_bytes: u64,
    /// Processes that may run at once; more get 429.
    #[arg(long, env = "SANDBOX_MAX_PROCESSES", default_value_t = defaults::MAX_PROCESSES,
          value_parser = parse_positive)]
    pub max_processes: usize,
    /// Largest JSON or stdin request body; larger get 413.
    #[arg(long, env = "SANDBOX_MAX_BODY_BYTES", default_value = defaults::MAX_BODY_BYTES,
          value_parser = parse_size)]
    pub max_body_bytes: u64,
    /// Largest file upload; larger get 413.
    #[arg(long, env = "SANDBOX_MAX_UPLOAD_BYTES", default_value = defaults::MAX_UPLOAD_BYTES,
          value_parser = parse_size)]
    pub max_upload_bytes: u64,
    /// Output bytes kept per background process for readers.
    #[arg(long, env = "SANDBOX_PROCESS_BUFFER_BYTES", default_value = defaults::PROCESS_BUFFER_BYTES,
          value_parser = parse_size)]
    pub process_buffer_bytes: u64,
    /// Seconds a finished background process stays listed.
    #[arg(long = "finished-retention-seconds", env = "SANDBOX_FINISHED_RETENTION_SECONDS",
          default_value = defaults::FINISHED_RETENTION_SECONDS, value_parser = parse_positive_duration)]
    pub finished_retention: Duration,
    /// Finished background processes that stay listed.
    #[arg(long, env = "SANDBOX_MAX_FINISHED_PROCESSES", default_value_t = defaults::MAX_FINISHED_PROCESSES,
          value_parser = parse_positive)]
    pub max_finished_processes: usize,
    /// Seconds to keep reading a command's output after its leader exits.
    #[arg(long = "drain-timeout-seconds", env = "SANDBOX_DRAIN_TIMEOUT_SECONDS",
          default_value = defaults::DRAIN_TIMEOUT_SECONDS, value_parser = parse_positive_duration)]
    pub drain_timeout: Duration,
    /// Seconds in-flight requests get after SIGTERM.
    #[arg(long = "shutdown-grace-seconds", env = "SANDBOX_SHUTDOWN_GRACE_SECONDS",
          default_value = defaults::SHUTDOWN_GRACE_SECONDS, value_parser = parse_positive_duration)]
    pub shutdown_grace: Duration,
    /// Tokio worker threads (0: one per CPU, at most 4).
    #[arg(long, env = "SANDBOX_WORKER_THREADS", default_value_t = 0)]
    pub worker_threads: usize,
    /// Seconds a client has to send a request's headers (from connecting, or from the first
    /// byte of a later request).
    #[arg(long = "header-read-timeout-seconds", env = "SANDBOX_HEADER_READ_TIMEOUT_SECONDS",
          default_value = defaults::HEADER_READ_TIMEOUT_SECONDS, value_parser = parse_positive_duration)]
    pub header_read_timeout: Duration,
    /// Seconds a request body may send nothing while it is read; then 400 and the connection
    /// is closed.
    #[arg(long = "body-idle-timeout-seconds", env = "SANDBOX_BODY_IDLE_TIMEOUT_SECONDS",
          default_value = defaults::BODY_IDLE_TIMEOUT_SECONDS, value_parser = parse_positive_duration)]
    pub body_idle_timeout: Duration,
    /// Seconds a keep-alive connection may be idle between requests.
    #[arg(long = "keepalive-idle-timeout-seconds", env = "SANDBOX_KEEPALIVE_IDLE_TIMEOUT_SECONDS",
          default_value = defaults::KEEPALIVE_IDLE_TIMEOUT_SECONDS, value_parser = parse_positive_duration)]
    pub keepalive_idle_timeout: Duration,
    /// Connections served at once; more wait until one closes.
    #[arg(long, env = "SANDBOX_MAX_CONNECTIONS", default_value_t = defaults::MAX_CONNECTIONS,
          value_parser = parse_positive)]
    pub max_connections: usize,
    /// Apply no_new_privs and Landlock (writes only beneath the base dir and /tmp) to commands.
    #[arg(long, env = "SANDBOX_HARDEN")]
    pub harden: bool,
}

impl Args {
    /// The configuration these flags describe.
    pub fn into_config(self) -> Config {
        let base_dir = if self
            .base_dir
            .as_os_str()
            .to_string_lossy()
            .trim()
            .is_empty()
        {
            PathBuf::from(defaults::BASE_DIR)
        } else {
            self.base_dir
        };
        Config {
            listen: self.listen,
            base_dir,
            exec_timeout: self.exec_timeout,
            max_output_bytes: self.max_output_bytes,
            max_processes: self.max_processes,
            max_body_bytes: self.max_body_bytes,
            max_upload_bytes: self.max_upload_bytes,
            process_buffer_bytes: self.process_buffer_bytes,
            finished_retention: self.finished_retention,
            max_finished_processes: self.max_finished_processes,
            drain_timeout: self.drain_timeout,
            shutdown_grace: self.shutdown_grace,
            worker_threads: self.worker_threads,
            header_read_timeout: self.header_read_timeout,
            body_idle_timeout: self.body_idle_timeout,
            keepalive_idle_timeout: self.keepalive_idle_timeout,
            max_connections: self.max_connections,
            harden: self.harden,
        }
    }
}

/// Parses a count above 0.
pub fn parse_positive(value: &str) -> Result<usize, String> {
    match value.trim().parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("`{value}` must be a whole number above 0")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    #[test]
    fn defaults_match_the_flags() {
        let parsed = Cli::try_parse_from(["sandbox-runtime"])
            .unwrap()
            .args
            .into_config();
        let built = Config::new(parsed.listen, "/app");
        assert_eq!(parsed.listen.port(), RUNTIME_PORT);
        assert_eq!(parsed.base_dir, PathBuf::from("/app"));
        assert_eq!(parsed.exec_timeout, Duration::from_secs(300));
        assert_eq!(parsed.exec_timeout, built.exec_timeout);
        assert_eq!(parsed.max_output_bytes, built.max_output_bytes);
        assert_eq!(parsed.max_upload_bytes, built.max_upload_bytes);
        assert_eq!(parsed.process_buffer_bytes, built.process_buffer_bytes);
        assert_eq!(parsed.drain_timeout, built.drain_timeout);
        assert_eq!(parsed.header_read_timeout, Duration::from_secs(30));
        assert_eq!(parsed.header_read_timeout, built.header_read_timeout);
        assert_eq!(parsed.body_idle_timeout, built.body_idle_timeout);
        assert_eq!(parsed.keepalive_idle_timeout, built.keepalive_idle_timeout);
        assert_eq!(parsed.max_connections, built.max_connections);
        assert!(!parsed.harden);
    }

    #[test]
    fn invalid_values_name_the_flag() {
        for (flag, value) in [
            ("--exec-timeout-seconds", "abc"),
            ("--exec-timeout-seconds", "0"),
            ("--max-output-bytes", "lots"),
            ("--max-processes", "0"),
            ("--header-read-timeout-seconds", "0"),
            ("--body-idle-timeout-seconds", "never"),
            ("--keepalive-idle-timeout-seconds", "0.0"),
            ("--max-connections", "0"),
            ("--listen", "nowhere"),
        ] {
            let error = Cli::try_parse_from(["sandbox-runtime", flag, value]).unwrap_err();
            assert!(error.to_string().contains(flag), "{flag}: {error}");
        }
    }

    #[test]
    fn blank_base_dir_means_the_default() {
        let config = Cli::try_parse_from(["sandbox-runtime", "--base-dir", "  "])
            .unwrap()
            .args
            .into_config();
        assert_eq!(config.base_dir, PathBuf::from("/app"));
    }
}
