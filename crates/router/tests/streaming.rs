#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Streaming through the router: a large body both ways through the real runtime, checked by
//! SHA-256; request and response bodies relayed frame by frame (each echoed chunk comes back
//! before the next is sent, which a buffering proxy could not do); and a WebSocket echo.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{Backend, Runtime, TestRouter, echo_http, pod_for, sandbox, synced_index};
use futures_util::{SinkExt as _, StreamExt as _};
use http_body_util::BodyExt as _;
use hyper::{Method, Request, StatusCode};
use pretty_assertions::assert_eq;
use sha2::{Digest as _, Sha256};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;

fn hex(digest: impl AsRef<[u8]>) -> String {
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test]
async fn a_large_body_streams_both_ways_intact() {
    const SIZE: usize = 64 << 20;
    const CHUNK: usize = 256 << 10;
    let runtime = Runtime::start();
    let sandbox = sandbox("big");
    let pod = pod_for(&sandbox, runtime.ip, &[]);
    let router = TestRouter::start(synced_index(&[(&sandbox, &pod)])).await;

    let data = Bytes::from(common::pseudo_random(42, SIZE));
    let expected = hex(Sha256::digest(&data));

    // Upload in chunks, with a declared length, through the streamed /v1/files API.
    let (mut sender, body) = http_body_util::channel::Channel::<Bytes, std::io::Error>::new(2);
    let request = Request::builder()
        .method(Method::PUT)
        .uri("/v1/files/dir/big.bin")
        .header("host", "router.test")
        .header("x-sandbox-id", "big")
        .header("content-length", SIZE)
        .body(body)
        .unwrap();
    let addr = router.addr;
    let upload =
        tokio::spawn(async move { common::collect(common::open(addr, request).await).await });
    for chunk in data.chunks(CHUNK) {
        sender.send_data(data.slice_ref(chunk)).await.unwrap();
    }
    drop(sender);
    let uploaded = tokio::time::timeout(Duration::from_secs(120), upload)
        .await
        .unwrap()
        .unwrap();
    assert!(
        uploaded.status.is_success(),
        "{}: {}",
        uploaded.status,
        uploaded.text()
    );
    let on_disk = std::fs::read(runtime.base.path().join("dir/big.bin")).unwrap();
    assert_eq!(hex(Sha256::digest(&on_disk)), expected);

    // Download, hashing as it streams.
    let response = common::open(
        router.addr,
        common::request(
            Method::GET,
            "/v1/files/dir/big.bin",
            &[("x-sandbox-id", "big")],
            Bytes::new(),
        ),
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let mut hasher = Sha256::new();
    let mut received = 0usize;
    let mut frames = 0usize;
    while let Some(frame) = body.frame().await {
        if let Some(data) = frame.unwrap().data_ref() {
            hasher.update(data);
            received += data.len();
            frames += 1;
        }
    }
    assert_eq!(received, SIZE);
    assert_eq!(hex(hasher.finalize()), expected);
    assert!(
        frames > 1,
        "the download arrived in one piece: it was buffered"
    );
}

#[tokio::test]
async fn bodies_are_relayed_frame_by_frame_in_both_directions() {
    let backend = Backend::on_fresh_ip(8888, echo_http).await;
    let sandbox = sandbox("echo");
    let pod = pod_for(&sandbox, backend.addr.ip(), &[]);
    let router = TestRouter::start(synced_index(&[(&sandbox, &pod)])).await;

    let (mut sender, body) = http_body_util::channel::Channel::<Bytes, std::io::Error>::new(1);
    let request = Request::builder()
        .method(Method::POST)
        .uri("/stream")
        .header("host", "router.test")
        .header("x-sandbox-id", "echo")
        .body(body)
        .unwrap();
    let addr = router.addr;
    let response = tokio::spawn(async move { common::open(addr, request).await });
    sender
        .send_data(Bytes::from_static(b"chunk-0;"))
        .await
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(20), response)
        .await
        .expect("the answer's head arrived while the request body was still open")
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let mut echoed = Vec::new();
    for round in 0..10 {
        let expected = format!("chunk-{round};");
        if round > 0 {
            sender
                .send_data(Bytes::from(expected.clone()))
                .await
                .unwrap();
        }
        // The echo of this chunk must arrive before the next chunk is sent.
        while echoed.len() < expected.len() {
            let frame = tokio::time::timeout(Duration::from_secs(20), body.frame())
                .await
                .unwrap_or_else(|_| panic!("round {round}: the echo never came back (buffered?)"))
                .expect("the body ended early")
                .unwrap();
            echoed.extend_from_slice(frame.data_ref().unwrap_or(&Bytes::new()));
        }
        assert_eq!(String::from_utf8_lossy(&echoed), expected);
        echoed.clear();
    }
    drop(sender);
    assert!(
        tokio::time::timeout(Duration::from_secs(20), body.frame())
            .await
            .unwrap()
            .is_none(),
        "the response ends with the request"
    );
}

#[tokio::test]
async fn a_websocket_echo_through_the_router() {
    let backend = Backend::on_fresh_ip(0, common::websocket_echo).await;
    let sandbox = sandbox("ws");
    let pod = pod_for(&sandbox, backend.addr.ip(), &[backend.addr.port()]);
    let router = TestRouter::start(synced_index(&[(&sandbox, &pod)])).await;

    let mut request = format!("ws://{}/socket", router.addr)
        .into_client_request()
        .unwrap();
    let port = backend.addr.port().to_string();
    request
        .headers_mut()
        .insert("x-sandbox-id", "ws".parse().unwrap());
    request
        .headers_mut()
        .insert("x-sandbox-port", port.parse().unwrap());
    request
        .headers_mut()
        .insert("origin", "http://router.test".parse().unwrap());
    let stream = tokio::net::TcpStream::connect(router.addr).await.unwrap();
    let (mut socket, handshake) = tokio::time::timeout(
        Duration::from_secs(20),
        tokio_tungstenite::client_async(request, stream),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(handshake.status(), StatusCode::SWITCHING_PROTOCOLS);

    let big = common::pseudo_random(7, 1 << 20);
    let messages = vec![
        Message::text("hello through the router"),
        Message::binary(big.clone()),
        Message::text("bye"),
    ];
    for message in messages {
        socket.send(message.clone()).await.unwrap();
        let echoed = tokio::time::timeout(Duration::from_secs(20), socket.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(echoed, message);
    }
    let metrics = router
        .send(Method::GET, "/metrics", &[], Bytes::new())
        .await;
    assert!(
        metrics.text().contains("sandbox_router_open_tunnels 1"),
        "{}",
        metrics.text()
    );
    socket.close(None).await.unwrap();
    drop(socket);
    // The tunnel closes once both sides are done.
    let addr = router.addr;
    let closed = common::eventually(Duration::from_secs(20), move || async move {
        let metrics = common::send(addr, Method::GET, "/metrics", &[], Bytes::new()).await;
        metrics
            .text()
            .contains("sandbox_router_open_tunnels 0")
            .then_some(())
    })
    .await;
    assert!(closed.is_some());
}
