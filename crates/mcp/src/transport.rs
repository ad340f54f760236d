//! How the server is reached: [`serve_stdio`] (one MCP session on stdin/stdout, until stdin
//! closes) and [`serve_http`] (streamable HTTP at [`HTTP_PATH`], one MCP session per client,
//! with `GET /healthz`), and the policy on listen addresses: loopback only unless remote
//! access is asked for ([`check_listen_addr`]). Both end on the `shutdown` future too, and then
//! delete the session's claims ([`McpConfig::delete_on_exit`]).

use std::future::{Future, IntoFuture as _};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use agent_sandbox::Client;
use rmcp::ServiceExt as _;
use rmcp::service::ServerInitializeError;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use crate::config::McpConfig;
use crate::error::{Error, Result};
use crate::server::SandboxServer;

/// Where `sandboxctl mcp --listen` listens by default.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8765";
/// The path of the MCP endpoint.
pub const HTTP_PATH: &str = "/mcp";
/// Largest request body (an `upload_file` with a few MiB of base64); the same as the stdio
/// transport's longest line.
const MAX_REQUEST_BODY: usize = 16 * 1024 * 1024;
/// How long open streams get to end after shutdown.
const HTTP_GRACE: Duration = Duration::from_secs(5);

/// Whether `addr` is a loopback address (127.0.0.0/8, ::1, or ::ffff:127.x).
pub fn is_loopback(addr: &SocketAddr) -> bool {
    match addr {
        SocketAddr::V4(v4) => v4.ip().is_loopback(),
        SocketAddr::V6(v6) => {
            v6.ip().is_loopback() || v6.ip().to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

/// The `Host` names and browser origins a server listening on the loopback address `ip`
/// answers (sans IO): the loopback names, and `ip` itself, which is how clients (and pages it
/// serves) reach a server on another loopback address than 127.0.0.1, such as 127.0.0.2. An
/// IPv4-mapped address counts as its IPv4 address too.
fn loopback_names(ip: IpAddr) -> (Vec<String>, Vec<String>) {
    let mut hosts: Vec<String> = ["localhost", "127.0.0.1", "::1"]
        .map(str::to_owned)
        .to_vec();
    let mut origins: Vec<String> = ["http://localhost:*", "http://127.0.0.1:*", "http://[::1]:*"]
        .map(str::to_owned)
        .to_vec();
    let mut own = vec![ip];
    if let IpAddr::V6(v6) = ip
        && let Some(v4) = v6.to_ipv4_mapped()
    {
        own.push(IpAddr::V4(v4));
    }
    for ip in own {
        let host = ip.to_string();
        if hosts.contains(&host) {
            continue;
        }
        origins.push(match ip {
            IpAddr::V4(_) => format!("http://{host}:*"),
            IpAddr::V6(_) => format!("http://[{host}]:*"),
        });
        hosts.push(host);
    }
    (hosts, origins)
}

/// Refuses a listen address that is not loopback unless `allow_remote`: the server runs
/// commands for whoever reaches it and has no authentication of its own.
pub fn check_listen_addr(addr: SocketAddr, allow_remote: bool) -> Result<()> {
    if is_loopback(&addr) || allow_remote {
        Ok(())
    } else {
        Err(Error::NotLoopback { addr })
    }
}

/// Serves one MCP session on stdin/stdout through `client` until stdin closes or `shutdown`
/// resolves, then deletes the session's claims. Logs must go to stderr: stdout is the
/// transport.
pub async fn serve_stdio(
    client: Client,
    config: McpConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    let server = SandboxServer::new(client, config);
    tracing::info!(session = server.session_id(), "serving MCP on stdin/stdout");
    let stop = CancellationToken::new();
    let serving = {
        let server = server.clone();
        let stop = stop.clone();
        async move {
            match server.serve_with_ct(rmcp::transport::stdio(), stop).await {
                Ok(running) => running.waiting().await.map(drop).map_err(Error::StdioTask),
                // A client that goes away before initializing is an ordinary end.
                Err(ServerInitializeError::ConnectionClosed(_)) => Ok(()),
                Err(error) => Err(Error::StdioInit(Box::new(error))),
            }
        }
    };
    tokio::pin!(serving);
    let outcome = tokio::select! {
        outcome = &mut serving => outcome,
        () = shutdown => {
            stop.cancel();
            // The service ends at once (a session cancelled before it was initialised reports
            // that, which is no failure here); a pending read of stdin cannot be cancelled, and
            // the caller's runtime shutdown does not wait for it.
            if let Ok(Err(error)) = tokio::time::timeout(HTTP_GRACE, &mut serving).await {
                let error = crate::error::chain(&error);
                tracing::debug!(%error, "the stdio session ended on shutdown");
            }
            Ok(())
        }
    };
    server.close().await;
    outcome
}

/// Serves MCP over streamable HTTP on `listener` at [`HTTP_PATH`] through `client` until
/// `shutdown` resolves, then deletes the session's claims. Every HTTP client gets its own MCP
/// session; they share the server's session of claims. Host and Origin headers are checked
/// against loopback names (DNS rebinding, browsers) unless the listener is not loopback, which
/// [`check_listen_addr`] should have allowed first.
pub async fn serve_http(
    client: Client,
    config: McpConfig,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    let addr = listener.local_addr().map_err(Error::LocalAddr)?;
    let server = SandboxServer::new(client, config);
    let stop = CancellationToken::new();
    let mut http_config = StreamableHttpServerConfig::default()
        .with_cancellation_token(stop.child_token())
        .with_max_request_body_bytes(MAX_REQUEST_BODY);
    http_config = if is_loopback(&addr) {
        let (hosts, origins) = loopback_names(addr.ip());
        http_config
            .with_allowed_hosts(hosts)
            .with_allowed_origins(origins)
    } else {
        // Reached under names this process cannot know; whoever allowed remote access put
        // an authenticating proxy in front.
        http_config.disable_allowed_hosts()
    };
    let service = {
        let server = server.clone();
        StreamableHttpService::new(
            move || Ok(server.clone()),
            Arc::new(LocalSessionManager::default()),
            http_config,
        )
    };
    let router = axum::Router::new()
        .nest_service(HTTP_PATH, service)
        .route("/healthz", axum::routing::get(|| async { "ok\n" }));
    tracing::info!(session = server.session_id(), %addr, "serving MCP over streamable HTTP");
    let graceful = stop.clone();
    let serving = axum::serve(listener, router)
        .with_graceful_shutdown(async move { graceful.cancelled().await })
        .into_future();
    tokio::pin!(serving);
    let outcome = tokio::select! {
        outcome = &mut serving => outcome,
        () = shutdown => {
            stop.cancel();
            match tokio::time::timeout(HTTP_GRACE, &mut serving).await {
                Ok(outcome) => outcome,
                Err(_) => {
                    tracing::warn!(
                        grace = ?HTTP_GRACE,
                        "open MCP streams did not end in time; closing them"
                    );
                    Ok(())
                }
            }
        }
    };
    server.close().await;
    outcome.map_err(|source| Error::Http { addr, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(text: &str) -> SocketAddr {
        text.parse()
            .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)))
    }

    #[test]
    fn only_loopback_unless_allowed() {
        for ok in [
            "127.0.0.1:8765",
            "127.1.2.3:0",
            "[::1]:80",
            "[::ffff:127.0.0.1]:1",
        ] {
            assert!(check_listen_addr(addr(ok), false).is_ok(), "{ok}");
        }
        for remote in ["0.0.0.0:8765", "10.0.0.1:80", "[::]:80", "192.168.1.2:1"] {
            let error = check_listen_addr(addr(remote), false).err();
            assert!(
                error
                    .as_ref()
                    .is_some_and(|e| e.to_string().contains("--allow-remote")),
                "{remote}: {error:?}"
            );
            assert!(check_listen_addr(addr(remote), true).is_ok(), "{remote}");
        }
        assert!(addr(DEFAULT_LISTEN).ip().is_loopback());
    }

    #[test]
    fn a_loopback_server_answers_to_its_own_address() {
        let names = |ip: &str| loopback_names(ip.parse().unwrap_or(IpAddr::from([0, 0, 0, 0])));
        let (hosts, origins) = names("127.0.0.1");
        assert_eq!(hosts, ["localhost", "127.0.0.1", "::1"]);
        assert_eq!(
            origins,
            ["http://localhost:*", "http://127.0.0.1:*", "http://[::1]:*"]
        );
        let (hosts, origins) = names("127.0.0.2");
        assert_eq!(hosts.last().map(String::as_str), Some("127.0.0.2"));
        assert_eq!(
            origins.last().map(String::as_str),
            Some("http://127.0.0.2:*")
        );
        let (hosts, origins) = names("::ffff:127.0.0.3");
        assert_eq!(hosts[3..], ["::ffff:127.0.0.3", "127.0.0.3"]);
        assert_eq!(
            origins[3..],
            ["http://[::ffff:127.0.0.3]:*", "http://127.0.0.3:*"]
        );
    }
}
