//! The streamable HTTP server's Host and Origin checks as a browser meets them: a server on
//! another loopback address than 127.0.0.1 (here 127.0.0.2) answers requests from its own
//! origin, and still refuses other origins. The server runs in this test on a port the OS
//! chooses, with an SDK client for an API server nobody listens for (the checks come before any
//! tool call); it is stopped when the test ends, also when it fails.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::time::Duration;

use agent_sandbox::{Client, ClientOptions};
use agent_sandbox_mcp::{HTTP_PATH, McpConfig, serve_http};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio_util::sync::CancellationToken;

/// Stops the server when dropped.
struct Stop(CancellationToken);

impl Drop for Stop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// An SDK client whose API server is a closed port: nothing here reaches it.
fn offline_client() -> Client {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
    Client::from_kube(
        kube::Client::try_from(config).unwrap(),
        ClientOptions::default(),
    )
}

/// `POST /mcp` with an `initialize` request and `origin`; the answer's status code.
async fn initialize(addr: SocketAddr, origin: &str) -> u16 {
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"origin-test","version":"1"}}}"#;
    let request = format!(
        "POST {HTTP_PATH} HTTP/1.1\r\nHost: {addr}\r\nOrigin: {origin}\r\nContent-Type: \
         application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: \
         {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    let mut buffer = [0_u8; 256];
    while !head.windows(2).any(|w| w == b"\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(30), stream.read(&mut buffer))
            .await
            .expect("the server answers")
            .unwrap();
        assert!(n > 0, "closed before a status line");
        head.extend_from_slice(&buffer[..n]);
    }
    let line = String::from_utf8_lossy(&head).into_owned();
    line.split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status in {line:?}"))
}

#[tokio::test]
async fn a_server_on_another_loopback_address_accepts_its_own_origin() {
    let listener = tokio::net::TcpListener::bind("127.0.0.2:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = Stop(CancellationToken::new());
    let shutdown = stop.0.clone();
    let server = tokio::spawn(serve_http(
        offline_client(),
        McpConfig::default().delete_on_exit(false),
        listener,
        async move { shutdown.cancelled().await },
    ));
    let port = addr.port();
    let own = initialize(addr, &format!("http://127.0.0.2:{port}")).await;
    let localhost = initialize(addr, &format!("http://localhost:{port}")).await;
    let other_loopback = initialize(addr, &format!("http://127.0.0.3:{port}")).await;
    let page = initialize(addr, "https://attacker.example").await;
    drop(stop);
    tokio::time::timeout(Duration::from_secs(30), server)
        .await
        .expect("the server stops")
        .unwrap()
        .unwrap();
    assert_eq!(
        (own, localhost, other_loopback, page),
        (200, 200, 403, 403),
        "own origin, localhost, another loopback address, a web page"
    );
}
