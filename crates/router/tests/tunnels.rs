#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Upgraded connections (here WebSockets to an echo server standing in for a sandbox) end when
//! the credential they were opened with does: when their scoped token expires, and when the key
//! that signed it is rotated out of the router's key files, which the router re-reads while it
//! runs. Tunnels whose token still verifies stay open.

mod common;

use std::io::{BufRead as _, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agent_sandbox_api::token::{self, Claims};
use agent_sandbox_router::{Auth, Secret};
use bytes::Bytes;
use common::fake_api::FakeApi;
use common::{Backend, TestRouter, pod_for, sandbox, synced_index};
use futures_util::{SinkExt as _, StreamExt as _};
use hyper::{Method, StatusCode};
use tokio::net::TcpStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;

const KEY_A: &[u8] = b"first-router-signing-key-of-32-bytes-at-least";
const KEY_B: &[u8] = b"second-router-signing-key-of-32-bytes-at-least";
const KEY_C: &[u8] = b"third-router-signing-key-of-32-bytes-at-least!";

/// How long a test waits for the router to close a tunnel before calling it a failure.
const CLOSE_WITHIN: Duration = Duration::from_secs(60);

fn now() -> i64 {
    i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs(),
    )
    .unwrap()
}

fn token(key: &[u8], sandbox: &str, expires_at: i64) -> String {
    token::mint(key, &Claims::new("default", sandbox, expires_at)).unwrap()
}

type Socket = WebSocketStream<TcpStream>;

/// A WebSocket to `sandbox`'s `port` through the router at `router`, with `token`; `Err` with
/// the refusal's status when the router does not switch protocols.
async fn connect(
    router: SocketAddr,
    sandbox: &str,
    port: u16,
    token: &str,
) -> Result<Socket, StatusCode> {
    let mut request = format!("ws://{router}/socket")
        .into_client_request()
        .unwrap();
    let headers = request.headers_mut();
    headers.insert("x-sandbox-id", sandbox.parse().unwrap());
    headers.insert("x-sandbox-port", port.to_string().parse().unwrap());
    headers.insert("authorization", format!("Bearer {token}").parse().unwrap());
    let stream = TcpStream::connect(router).await.unwrap();
    match tokio::time::timeout(
        Duration::from_secs(20),
        tokio_tungstenite::client_async(request, stream),
    )
    .await
    .expect("the handshake is answered")
    {
        Ok((socket, _)) => Ok(socket),
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => Err(response.status()),
        Err(error) => panic!("handshake failed: {error}"),
    }
}

/// Sends `text` and expects it back.
async fn echoes(socket: &mut Socket, text: &str) {
    socket.send(Message::text(text)).await.unwrap();
    let echoed = tokio::time::timeout(Duration::from_secs(20), socket.next())
        .await
        .expect("an echo")
        .expect("the tunnel is open")
        .expect("the tunnel is open");
    assert_eq!(echoed, Message::text(text));
}

/// Whether the tunnel ends (the stream closes or fails, nothing more is echoed) within
/// [`CLOSE_WITHIN`], without the client closing it.
async fn closed_by_the_router(socket: &mut Socket) -> bool {
    match tokio::time::timeout(CLOSE_WITHIN, socket.next()).await {
        Err(_) => false,
        Ok(None | Some(Err(_))) => true,
        Ok(Some(Ok(message))) => message.is_close(),
    }
}

#[tokio::test]
async fn a_tunnel_ends_when_its_scoped_token_expires() {
    let backend = Backend::on_fresh_ip(0, common::websocket_echo).await;
    let port = backend.addr.port();
    let sandbox = sandbox("ws");
    let pod = pod_for(&sandbox, backend.addr.ip(), &[port]);
    let router = TestRouter::start_with(synced_index(&[(&sandbox, &pod)]), |config| {
        config.auth = Auth::Scoped(vec![Secret::new(KEY_A)]);
    })
    .await;

    let mut short = connect(router.addr, "ws", port, &token(KEY_A, "ws", now() + 3))
        .await
        .unwrap();
    let mut long = connect(router.addr, "ws", port, &token(KEY_A, "ws", now() + 3600))
        .await
        .unwrap();
    echoes(&mut short, "before the expiry").await;
    echoes(&mut long, "before the expiry").await;
    assert!(
        closed_by_the_router(&mut short).await,
        "the tunnel outlived its token"
    );
    echoes(&mut long, "after the other token expired").await;
    let metrics = router
        .send(Method::GET, "/metrics", &[], Bytes::new())
        .await;
    assert!(
        metrics.text().contains("sandbox_router_open_tunnels 1"),
        "{}",
        metrics.text()
    );
}

/// The `sandbox-router` binary; killed on drop.
struct RouterProcess(Child);

impl Drop for RouterProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Writes `contents` to `path` as a mounted Secret changes: a new file renamed over the old.
fn replace(path: &Path, contents: &[u8]) {
    let next = path.with_extension("next");
    std::fs::write(&next, contents).unwrap();
    std::fs::rename(&next, path).unwrap();
}

#[tokio::test]
async fn rotating_a_signing_key_out_ends_the_tunnels_of_its_tokens() {
    let backend = Backend::on_fresh_ip(0, common::websocket_echo).await;
    let port = backend.addr.port();
    let api = FakeApi::start().await;
    let sandbox = sandbox("ws");
    api.apply_sandbox(&sandbox);
    api.apply_pod(&pod_for(&sandbox, backend.addr.ip(), &[port]));
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = api.kubeconfig(dir.path());
    let (key_a, key_b) = (dir.path().join("key-a"), dir.path().join("key-b"));
    std::fs::write(&key_a, KEY_A).unwrap();
    std::fs::write(&key_b, KEY_B).unwrap();

    let mut child = Command::new(env!("CARGO_BIN_EXE_sandbox-router"))
        .env_clear()
        .env("KUBECONFIG", &kubeconfig)
        .env("HOME", dir.path())
        .env("RUST_LOG", "info")
        .args(["--auth", "scoped", "--listen", "127.0.0.1:0"])
        .arg("--signing-key-file")
        .arg(format!("{},{}", key_a.display(), key_b.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let _router = RouterProcess(child);
    let (lines_tx, lines_rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            let _ = lines_tx.send(line);
        }
    });
    let addr: SocketAddr = loop {
        let line = lines_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the router says where it listens");
        if let Some(rest) = line.split("sandbox-router listening on ").nth(1) {
            break rest.split_whitespace().next().unwrap().parse().unwrap();
        }
    };
    let ready = common::eventually(Duration::from_secs(30), move || async move {
        let readyz = common::send(addr, Method::GET, "/readyz", &[], Bytes::new()).await;
        (readyz.status == StatusCode::OK).then_some(())
    })
    .await;
    assert!(ready.is_some(), "the router never synced");

    let expires_at = now() + 3600;
    let mut signed_a = connect(addr, "ws", port, &token(KEY_A, "ws", expires_at))
        .await
        .unwrap();
    let mut signed_b = connect(addr, "ws", port, &token(KEY_B, "ws", expires_at))
        .await
        .unwrap();
    echoes(&mut signed_a, "before the rotation").await;
    echoes(&mut signed_b, "before the rotation").await;

    // Key A is rotated out: its file now holds key C.
    replace(&key_a, KEY_C);
    assert!(
        closed_by_the_router(&mut signed_a).await,
        "the tunnel of a token signed with the removed key stayed open"
    );
    echoes(&mut signed_b, "after the rotation").await;
    assert_eq!(
        connect(addr, "ws", port, &token(KEY_A, "ws", expires_at))
            .await
            .err(),
        Some(StatusCode::UNAUTHORIZED),
        "a new tunnel with a token of the removed key"
    );
    let mut signed_c = connect(addr, "ws", port, &token(KEY_C, "ws", expires_at))
        .await
        .expect("the new key is accepted");
    echoes(&mut signed_c, "with the new key").await;
}
