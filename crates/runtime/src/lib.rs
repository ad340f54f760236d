//! The runtime server that runs inside every sandbox pod on port 8888 (binary
//! `sandbox-runtime`).
//!
//! It speaks upstream's python-runtime JSON on the legacy endpoints (`/`, `/execute`,
//! `/upload`, `/download/{path}`, `/list/{path}`, `/exists/{path}`) and adds a `/v1` API for
//! streamed execution, background processes and files (`docs/runtime-api.md`). Every path is
//! confined beneath the base directory by construction ([`paths`]), every command runs in its
//! own process group that is killed as a whole on timeout, cancel, client disconnect and
//! shutdown ([`exec`]), output is capped and truncation reported, and concurrency, request
//! bodies, connections and silent peers are bounded.
//!
//! Embedding: build a [`Config`] (or parse [`Args`]), then [`Server::bind`] and
//! [`Server::serve`] with a shutdown future, or [`serve`] in one call, or [`run`] to also
//! build the tokio runtime and wait for SIGTERM/SIGINT. [`run`] and [`run_until`] own the
//! process: they also make the runtime the reaper of its commands' orphans, and kill every
//! process left below it when they return (`reaper`).
//!
//! Module map: [`config`] (flags and defaults), `serve` (accept loop, connection cap, header,
//! body and keep-alive limits), `http` (router and handlers), `exec` (spawn,
//! process groups, the output driver), `processes` (background process table), `files`
//! (confined file operations), `output` (bounded output log, incremental JSON encoding), `split` (upstream's shlex
//! splitting), [`harden`] (optional Landlock / `no_new_privs`), `reaper` (orphans: PID 1 or
//! child subreaper).

// The module map above links the private modules, for readers of the source.
#![allow(rustdoc::private_intra_doc_links)]

pub mod config;
mod error;
mod exec;
mod files;
pub mod harden;
mod http;
mod output;
mod paths;
mod processes;
mod reaper;
mod serve;
mod split;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use config::{Args, Config};
pub use error::{Error, Result};

/// A bound, not yet serving runtime server.
#[derive(Debug)]
pub struct Server {
    listener: TcpListener,
    local_addr: SocketAddr,
    state: Arc<http::AppState>,
}

impl Server {
    /// Opens the base directory (creating it when missing), prepares hardening when asked,
    /// and binds the listener.
    pub async fn bind(config: Config) -> Result<Self> {
        std::fs::create_dir_all(&config.base_dir).map_err(|source| Error::BaseDir {
            path: config.base_dir.clone(),
            source,
        })?;
        let root = paths::Root::open(&config.base_dir).map_err(|source| Error::BaseDir {
            path: config.base_dir.clone(),
            source,
        })?;
        // Bound before anything is logged: a configuration error is then the only line.
        let listener = TcpListener::bind(config.listen)
            .await
            .map_err(|source| Error::Bind {
                addr: config.listen,
                source,
            })?;
        let local_addr = listener.local_addr().map_err(|source| Error::Bind {
            addr: config.listen,
            source,
        })?;
        let probe = harden::probe();
        let hardening = if config.harden {
            let hardening =
                harden::Hardening::prepare(root.canonical()).map_err(|source| Error::Harden {
                    path: root.canonical().to_path_buf(),
                    source,
                })?;
            tracing::info!(
                landlock = hardening.has_landlock(),
                "hardening on: commands run with no_new_privs{}",
                if hardening.has_landlock() {
                    " and Landlock (writes only beneath the base directory and /tmp)"
                } else {
                    "; Landlock is not available on this kernel"
                }
            );
            Some(hardening)
        } else {
            tracing::info!(
                landlock_available = probe.landlock,
                no_new_privs = probe.no_new_privs,
                "hardening off (--harden enables no_new_privs and Landlock for commands)"
            );
            None
        };
        let state = Arc::new(http::AppState {
            root: Arc::new(root),
            groups: Arc::default(),
            permits: Arc::new(Semaphore::new(config.max_processes)),
            processes: processes::Table::new(
                config.finished_retention,
                config.max_finished_processes,
            ),
            tracker: TaskTracker::new(),
            shutdown: CancellationToken::new(),
            hardening,
            started: Instant::now(),
            config,
        });
        Ok(Self {
            listener,
            local_addr,
            state,
        })
    }

    /// The address the listener is bound to (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Serves until `shutdown` resolves, then stops accepting, kills every command's process
    /// group, gives in-flight requests the configured grace, and returns.
    pub async fn serve(self, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<()> {
        let Self {
            listener,
            local_addr,
            state,
        } = self;
        tracing::info!(
            addr = %local_addr,
            base_dir = %state.root.canonical().display(),
            "sandbox runtime listening on {local_addr}"
        );
        let app = http::router(Arc::clone(&state));
        let limits = serve::Limits {
            header_read: state.config.header_read_timeout,
            body_idle: state.config.body_idle_timeout,
            keepalive_idle: state.config.keepalive_idle_timeout,
            max_connections: state.config.max_connections,
        };
        let abort = CancellationToken::new();
        let server = serve::serve(listener, app, limits, state.shutdown.clone(), abort.clone());
        tokio::pin!(server);
        let grace = state.config.shutdown_grace;
        tokio::select! {
            () = &mut server => {}
            () = shutdown => {
                tracing::info!("shutting down: no new connections, killing every command");
                state.shutdown.cancel();
                state.groups.kill_all();
                if tokio::time::timeout(grace, &mut server).await.is_err() {
                    tracing::warn!(?grace, "in-flight requests did not finish in time; closing them");
                    abort.cancel();
                    server.await;
                }
            }
        }
        state.shutdown.cancel();
        state.tracker.close();
        if tokio::time::timeout(grace, state.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!("some command drivers did not finish in time");
        }
        // Anything that started meanwhile, and daemons left behind by finished commands.
        state.groups.kill_all();
        tracing::info!("sandbox runtime stopped");
        Ok(())
    }
}

/// Binds and serves `config` until `shutdown` resolves.
pub async fn serve(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    Server::bind(config).await?.serve(shutdown).await
}

/// Resolves on SIGTERM or SIGINT (or immediately if they cannot be watched).
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot watch SIGTERM/SIGINT; shutting down");
        return;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = int.recv() => tracing::info!("SIGINT received"),
    }
}

/// Builds a tokio runtime with [`Config::effective_worker_threads`] workers and serves until
/// SIGTERM or SIGINT. For binaries whose `main` is synchronous.
///
/// The process becomes the reaper of its commands' orphans: PID 1 of its PID namespace is one
/// already, any other process becomes a child subreaper and, when this returns (or panics),
/// kills every process left below it (within the shutdown grace). Adopted orphans are reaped as
/// they exit. See `docs/runtime-api.md`, "Guarantees".
pub fn run(config: Config) -> Result<()> {
    run_until(config, shutdown_signal())
}

/// [`run`], but until `shutdown` resolves (for binaries that serve the runtime as one of their
/// subcommands and stop it for reasons of their own too).
pub fn run_until(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    // Dropped last, after the tokio runtime (declared after it): then nothing else waits for
    // children any more.
    let reaper = reaper::Reaper::adopt(config.shutdown_grace);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.effective_worker_threads())
        // File transfers and listings use the blocking pool; bound it.
        .max_blocking_threads(64)
        .thread_name("sandbox-runtime")
        .enable_all()
        .build()
        .map_err(|source| Error::Runtime { source })?;
    runtime.block_on(async {
        let server = Server::bind(config).await?;
        reaper.log();
        let stop = CancellationToken::new();
        // Reaping runs here, on the main thread, not in a spawned task (see `reaper`).
        let serving = async {
            let served = server.serve(shutdown).await;
            stop.cancel();
            served
        };
        let (served, ()) = tokio::join!(serving, reaper.reap_orphans(stop.clone()));
        served
    })
}
