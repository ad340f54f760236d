//! One agent session's lifecycle: claim a sandbox from a warm pool (with an expiry, so a crash
//! leaks nothing), report it ready, tell the model about it, run the loop, and delete the claim
//! at the end unless asked to keep it. Also the `--local` wiring onto `agent_sandbox_local`'s
//! in-process cluster.

use std::time::{Duration, Instant};

use agent_sandbox::{Client, CreateOptions, SandboxHandle};
use agent_sandbox_local::{ConnectionKind, LocalCluster, LocalConfig};

use crate::agent::{self, LoopConfig, Outcome, Reporter};
use crate::client::Model;
use crate::error::{Error, Result};
use crate::prompt;
use crate::tools::error_chain;

/// What a session does besides the loop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionOptions {
    /// The SandboxWarmPool to claim from.
    pub pool: String,
    /// Keep the claim at the end (it still expires `ttl` after the last tool call).
    pub keep: bool,
    /// The loop's limits and the claim's inactivity TTL.
    pub loop_config: LoopConfig,
}

/// The line printed once the sandbox is ready (sans IO).
pub fn ready_line(elapsed: Duration, sandbox: &impl SandboxHandle) -> String {
    format!(
        "sandbox ready in {}ms: claim={} sandbox={} pod={}",
        elapsed.as_millis(),
        sandbox.claim_name(),
        sandbox.sandbox_name(),
        sandbox.pod_name()
    )
}

/// Claims a sandbox from `options.pool`, runs the loop for `prompt` in it, and deletes the
/// claim unless `options.keep`. The claim is created with `shutdownTime = now + ttl` (policy
/// `Delete`) and every tool call moves it forward, so a killed agent's sandbox is deleted by
/// the controller once the TTL passes.
pub async fn run<M: Model>(
    client: &Client,
    model: &M,
    prompt_text: &str,
    options: &SessionOptions,
    reporter: &dyn Reporter,
) -> Result<Outcome> {
    let started = Instant::now();
    let sandbox = client
        .create_sandbox_with(
            &options.pool,
            CreateOptions::default().shutdown_after(options.loop_config.ttl),
        )
        .await
        .map_err(|source| Error::Claim {
            pool: options.pool.clone(),
            source: Box::new(source),
        })?;
    reporter.line(&ready_line(started.elapsed(), &sandbox));
    let result = async {
        let environment = prompt::probe(&sandbox).await;
        let system = prompt::system_prompt(&environment);
        agent::run(
            model,
            &sandbox,
            &system,
            prompt_text,
            &options.loop_config,
            reporter,
        )
        .await
    }
    .await;
    if options.keep {
        reporter.line(&format!(
            "kept claim={}: it expires {}s after the last tool call (sandboxctl delete {} removes it now)",
            sandbox.claim_name(),
            options.loop_config.ttl.as_secs(),
            sandbox.claim_name()
        ));
        return result;
    }
    let closed = sandbox.close().await;
    match (result, closed) {
        (Ok(outcome), Ok(())) => Ok(outcome),
        (Ok(_), Err(source)) => Err(Error::DeleteClaim {
            claim: sandbox.claim_name().to_owned(),
            source: Box::new(source),
        }),
        (Err(error), closed) => {
            if let Err(close_error) = closed {
                reporter.line(&format!(
                    "warning: failed to delete claim {} (it expires by itself): {}",
                    sandbox.claim_name(),
                    error_chain(&close_error)
                ));
            }
            Err(error)
        }
    }
}

/// A local cluster (sim, controller, router, the default pool) and an SDK client for it.
#[derive(Debug)]
pub struct Local {
    /// The cluster; dropping it stops everything.
    pub cluster: LocalCluster,
    /// A client in the default namespace, talking to the router directly with its token.
    pub client: Client,
}

/// Starts the in-process local cluster (`agent_sandbox_local`, as `sandboxctl run --local`
/// does) and waits for one warm sandbox.
pub async fn start_local(config: LocalConfig, ready_timeout: Duration) -> Result<Local> {
    let cluster = LocalCluster::start(config)
        .await
        .map_err(|source| Error::Local {
            step: "start the local cluster",
            source: Box::new(source),
        })?;
    for note in cluster.startup_notes() {
        eprintln!("sandbox-agent: {note}");
    }
    cluster
        .wait_for_pool(1, ready_timeout, |_, _| {})
        .await
        .map_err(|source| Error::Local {
            step: "wait for the local warm pool",
            source: Box::new(source),
        })?;
    let client = cluster
        .sdk_client(ConnectionKind::Direct)
        .map_err(|source| Error::Local {
            step: "connect to the local router",
            source: Box::new(source),
        })?;
    Ok(Local { cluster, client })
}
