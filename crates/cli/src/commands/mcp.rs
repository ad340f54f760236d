//! `sandboxctl mcp`: the MCP server of `agent_sandbox_mcp` on stdio or streamable HTTP,
//! through the client of the connection flags, or on a local cluster started for it
//! (`--local`, stopped when the server stops). The server, its tools and its transports live in
//! that crate; this command turns flags into its configuration and owns the cluster.

use std::time::Instant;

use agent_sandbox::Client;
use agent_sandbox::args::ConnectArgs;
use agent_sandbox_local::{DEFAULT_NAMESPACE, DEFAULT_POOL, LocalCluster, LocalConfig};
use agent_sandbox_mcp::{HTTP_PATH, McpConfig, check_listen_addr, is_loopback};
use tokio::net::TcpListener;

use super::interrupted;
use super::sandbox::EXIT_INTERRUPTED;
use crate::cli::McpArgs;
use crate::error::{Error, Result};
use crate::spinner::Spinner;

/// How long `--local` waits for a warm sandbox before serving.
const LOCAL_WARM_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// Serves MCP until stdin closes (stdio) or Ctrl-C/SIGTERM.
pub async fn mcp(global: &ConnectArgs, args: McpArgs) -> Result<i32> {
    let mut config = McpConfig::default()
        .default_ttl(args.ttl)
        .max_output_bytes(args.max_output_bytes)
        .max_file_bytes(args.max_file_bytes)
        .delete_on_exit(!args.keep_sandboxes);
    if let Some(id) = &args.session_id {
        config = config.session_id(id.clone()).map_err(mcp_error)?;
    }
    if args.ttl.is_zero() {
        return Err(Error::Usage(
            "--ttl 0 would make sandboxes that never expire; this server gives every sandbox a \
             lifetime (try --ttl 1h)"
                .to_owned(),
        ));
    }
    // Bound before a local cluster starts, so that a taken port fails at once.
    let listener = match args.listen {
        None => None,
        Some(addr) => {
            check_listen_addr(addr, args.allow_remote).map_err(mcp_error)?;
            let listener = TcpListener::bind(addr)
                .await
                .map_err(super::io(&format!("listen on {addr}")))?;
            Some(listener)
        }
    };
    if !args.local {
        let client = global.connect().await.map_err(Error::connect)?;
        let code = serve(client, config, listener).await?;
        eprintln!("sandboxctl mcp: stopped");
        return Ok(code);
    }
    let started = Instant::now();
    let spinner = Spinner::start("starting a local cluster");
    let local_config = LocalConfig {
        isolation: args.isolation,
        networks: args.network,
        pool_replicas: args.replicas,
        ..LocalConfig::default()
    };
    let cluster = tokio::select! {
        cluster = LocalCluster::start(local_config) => Some(cluster),
        () = interrupted() => None,
    };
    let Some(cluster) = cluster else {
        spinner.finish();
        return Ok(EXIT_INTERRUPTED);
    };
    let cluster = cluster.map_err(|source| Error::Local { source })?;
    if args.replicas > 0 {
        spinner.set_message(format!("warming the pool {DEFAULT_POOL}"));
        let warmed = tokio::select! {
            warmed = cluster.wait_for_pool(1, LOCAL_WARM_TIMEOUT, |_, _| {}) => Some(warmed),
            () = interrupted() => None,
        };
        let Some(warmed) = warmed else {
            spinner.finish();
            cluster.stop().await;
            return Ok(EXIT_INTERRUPTED);
        };
        if let Err(source) = warmed {
            spinner.finish();
            cluster.stop().await;
            return Err(Error::Local { source });
        }
    }
    spinner.finish();
    eprintln!(
        "sandboxctl mcp: local cluster up in {} ms: warm pool {DEFAULT_NAMESPACE}/{DEFAULT_POOL} \
         ({} sandboxes)",
        started.elapsed().as_millis(),
        args.replicas
    );
    for note in cluster.startup_notes() {
        eprintln!("sandboxctl mcp: {note}");
    }
    let mut global = global.clone();
    global.router_url = cluster.router_url().map(str::to_owned);
    global.router_token = cluster.router_token();
    global.signing_key_file = None;
    let outcome = match global.client_options(DEFAULT_NAMESPACE) {
        Ok(options) => {
            serve(
                Client::from_kube(cluster.client(), options),
                config,
                listener,
            )
            .await
        }
        Err(error) => Err(Error::connect(error)),
    };
    eprintln!("sandboxctl mcp: stopping the local cluster");
    cluster.stop().await;
    eprintln!("sandboxctl mcp: stopped");
    outcome
}

/// Serves on `listener` (HTTP) or stdin/stdout until the end of input or a signal.
async fn serve(client: Client, config: McpConfig, listener: Option<TcpListener>) -> Result<i32> {
    let session = config.session_id.clone();
    let ttl = crate::output::duration(config.default_ttl);
    let namespace = client.namespace().to_owned();
    match listener {
        None => {
            eprintln!(
                "sandboxctl mcp: serving MCP on stdin/stdout (namespace {namespace}, session \
                 {session}; sandboxes expire {ttl} after their last use)"
            );
            agent_sandbox_mcp::serve_stdio(client, config, interrupted())
                .await
                .map_err(mcp_error)?;
        }
        Some(listener) => {
            let addr = listener
                .local_addr()
                .map_err(super::io("read the listen address"))?;
            if !is_loopback(&addr) {
                eprintln!(
                    "sandboxctl mcp: WARNING: listening on {addr}, which is not loopback: anyone \
                     who reaches it can run commands in sandboxes on this cluster with this \
                     server's credentials. Put an authenticating proxy in front of it."
                );
            }
            eprintln!(
                "sandboxctl mcp: serving MCP over streamable HTTP at http://{addr}{HTTP_PATH} \
                 (namespace {namespace}, session {session}; sandboxes expire {ttl} after their \
                 last use); Ctrl-C stops it"
            );
            agent_sandbox_mcp::serve_http(client, config, listener, interrupted())
                .await
                .map_err(mcp_error)?;
        }
    }
    Ok(0)
}

/// The MCP server's errors as the CLI's: the flags' faults as usage errors, the rest with
/// their causes.
fn mcp_error(error: agent_sandbox_mcp::Error) -> Error {
    match error {
        agent_sandbox_mcp::Error::NotLoopback { .. }
        | agent_sandbox_mcp::Error::InvalidSessionId { .. } => Error::Usage(error.to_string()),
        error => Error::Io {
            action: "serve MCP".to_owned(),
            source: std::io::Error::other(error),
        },
    }
}
