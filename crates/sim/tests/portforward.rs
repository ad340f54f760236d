//! `Api::<Pod>::portforward` against the sim reaches the server in a pod.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use agent_sandbox_sim::{Isolation, Program, Sim, SimConfig, runtime_entry};
use common::{eventually, runtime_binary};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn ready_runtime_pod(sim: &Sim) -> Api<Pod> {
    let pods: Api<Pod> = Api::default_namespaced(sim.client().unwrap());
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "rt"},
        "spec": {"containers": [{"name": "runtime", "image": "sandbox-runtime:latest"}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    eventually("the runtime pod to be ready", || async {
        let pod = pods.get("rt").await.unwrap();
        let ready = pod
            .status?
            .conditions?
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        ready.then_some(())
    })
    .await;
    pods
}

/// Reads one HTTP response with a `content-length`.
async fn read_response(stream: &mut tokio::io::DuplexStream) -> String {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let read = stream.read(&mut chunk).await.unwrap();
        assert!(read > 0, "connection closed before a whole response");
        buffer.extend_from_slice(&chunk[..read]);
        let text = String::from_utf8_lossy(&buffer).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse::<usize>().unwrap())
                })
                .unwrap_or(0);
            if body.len() >= length {
                return text;
            }
        }
    }
}

#[tokio::test]
async fn port_forward_reaches_the_runtime_in_a_pod() {
    let config = SimConfig::default()
        .isolation(Isolation::Confined)
        .image(runtime_entry("*runtime*", Program::Path(runtime_binary())));
    let sim = Sim::start(config).await.unwrap();
    let pods = ready_runtime_pod(&sim).await;

    // Keep-alive: the client reads one response and then closes the forward.
    let mut forwarder = pods.portforward("rt", &[8888]).await.unwrap();
    let mut stream = forwarder.take_stream(8888).unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: rt\r\n\r\n")
        .await
        .unwrap();
    let response = read_response(&mut stream).await;
    assert!(response.starts_with("HTTP/1."), "{response}");
    assert!(response.contains(" 200 "), "{response}");
    assert!(response.contains("\"status\""), "{response}");
    drop(stream);
    forwarder.join().await.unwrap();

    // Connection: close: the pod's end of the connection reaches the client as end of stream.
    let mut forwarder = pods.portforward("rt", &[8888]).await.unwrap();
    let mut stream = forwarder.take_stream(8888).unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: rt\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.unwrap();
    assert!(String::from_utf8_lossy(&response).contains(" 200 "));
    assert_eq!(
        sim.request_counts().get("connect", "", "pods/portforward"),
        2
    );
}

#[tokio::test]
async fn port_forward_to_a_closed_port_reports_on_the_error_channel() {
    let config = SimConfig::default()
        .isolation(Isolation::None)
        .image(runtime_entry("*runtime*", Program::Path(runtime_binary())));
    let sim = Sim::start(config).await.unwrap();
    let pods = ready_runtime_pod(&sim).await;
    let mut forwarder = pods.portforward("rt", &[9]).await.unwrap();
    let error = forwarder.take_error(9).unwrap().await;
    let message = error.expect("an error message");
    assert!(message.contains("port 9"), "{message}");
}

/// Sends a port-forward upgrade request with `headers` and returns the response head.
async fn upgrade_head(sim: &Sim, headers: &str) -> String {
    let addr = sim.addr();
    let mut stream = agent_sandbox_sim::test_support::tls_connect(sim.ca_pem(), addr)
        .await
        .unwrap();
    let token = sim.admin_token();
    let request = format!(
        "POST /api/v1/namespaces/default/pods/rt/portforward HTTP/1.1\r\nHost: {addr}\r\n\
         Authorization: Bearer {token}\r\nContent-Length: 0\r\n{headers}\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let read = stream.read(&mut byte).await.unwrap();
        assert!(read > 0, "connection closed before a whole head: {head:?}");
        head.push(byte[0]);
    }
    String::from_utf8(head).unwrap().to_ascii_lowercase()
}

#[tokio::test]
async fn port_forward_accepts_the_spdy_upgrade_a_real_api_server_accepts() {
    let config = SimConfig::default()
        .isolation(Isolation::None)
        .image(runtime_entry("*runtime*", Program::Path(runtime_binary())));
    let sim = Sim::start(config).await.unwrap();
    ready_runtime_pod(&sim).await;

    // What client-go's SPDY dialer sends (several protocol versions offered, one header each).
    let head = upgrade_head(
        &sim,
        "Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: portforward.k8s.io\r\n",
    )
    .await;
    assert!(head.starts_with("http/1.1 101 "), "{head}");
    assert!(head.contains("\r\nupgrade: spdy/3.1\r\n"), "{head}");
    assert!(
        head.contains("\r\nx-stream-protocol-version: portforward.k8s.io\r\n"),
        "{head}"
    );

    // A SPDY upgrade offering only a protocol the server does not speak is refused.
    let head = upgrade_head(
        &sim,
        "Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v9.portforward.k8s.io\r\n",
    )
    .await;
    assert!(head.starts_with("http/1.1 400 "), "{head}");
}
