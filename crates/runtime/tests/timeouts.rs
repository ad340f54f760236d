#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Issue 15 item 8: slow or silent peers are cut, busy ones are not. Raw TCP on 127.0.0.1
//! against servers configured with short limits: a peer that sends no head, trickles its
//! head, stops sending its body or sits on an idle keep-alive connection is disconnected; a
//! slow upload that keeps sending and a command that runs longer than every limit complete;
//! beyond the connection cap a new connection is served only once another has closed.
//!
//! The 10 s bounds below only keep a broken server from hanging the test; every assertion is
//! about what happened, not how fast.

mod common;

use std::time::Duration;

use common::TestServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Hang guard for waits that the server's limits end much sooner.
const GUARD: Duration = Duration::from_secs(10);
/// Longer than any test runs: a limit that must not be the one that acts.
const NEVER: Duration = Duration::from_secs(3600);

async fn server(header: Duration, body: Duration, keepalive: Duration) -> TestServer {
    TestServer::start_with(|c| {
        c.header_read_timeout = header;
        c.body_idle_timeout = body;
        c.keepalive_idle_timeout = keepalive;
    })
    .await
}

/// Reads until the server closes the connection; returns what it sent. Panics if it does not
/// close within the guard.
async fn until_closed(stream: &mut TcpStream) -> Vec<u8> {
    let mut received = Vec::new();
    let read = tokio::time::timeout(GUARD, async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => received.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(
        read.is_ok(),
        "the server kept the connection open; received {:?}",
        String::from_utf8_lossy(&received)
    );
    received
}

/// Reads one response with a `Content-Length`, or none and no body (the runtime's small
/// answers).
async fn one_response(stream: &mut TcpStream) -> String {
    let mut received = Vec::new();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(GUARD, async {
        loop {
            let n = stream.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed before a whole response");
            received.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&received).into_owned();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let length: usize = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length: ")
                            .map(str::to_owned)
                    })
                    .and_then(|v| v.trim().parse().ok())
                    // 204 and the like have no body and no length.
                    .unwrap_or(0);
                if body.len() >= length {
                    return text;
                }
            }
        }
    })
    .await
    .expect("a response within the guard")
}

const HEALTH: &[u8] = b"GET / HTTP/1.1\r\nHost: sandbox\r\n\r\n";

#[tokio::test]
async fn a_connection_that_sends_no_head_is_closed() {
    let server = server(Duration::from_millis(300), NEVER, NEVER).await;
    let mut silent = TcpStream::connect(server.addr).await.unwrap();
    assert!(until_closed(&mut silent).await.is_empty());
    // A head that stops half-way is cut as well.
    let mut partial = TcpStream::connect(server.addr).await.unwrap();
    partial
        .write_all(b"GET / HTTP/1.1\r\nHost: sand")
        .await
        .unwrap();
    until_closed(&mut partial).await;
    server.stop().await;
}

#[tokio::test]
async fn a_trickled_head_is_cut_although_it_keeps_sending() {
    let server = server(Duration::from_millis(500), NEVER, NEVER).await;
    let stream = TcpStream::connect(server.addr).await.unwrap();
    let (mut reader, mut writer) = stream.into_split();
    // One header byte every 50 ms, for at most 10 s: progress does not extend the limit.
    let trickle = tokio::spawn(async move {
        let head = b"GET / HTTP/1.1\r\nX-Slow: "
            .iter()
            .chain([b'a'; 200].iter());
        for byte in head {
            if writer.write_all(&[*byte]).await.is_err() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    });
    let mut buf = [0u8; 64];
    let closed = tokio::time::timeout(GUARD, reader.read(&mut buf)).await;
    assert!(
        matches!(closed, Ok(Ok(0) | Err(_))),
        "the trickled head was not cut: {closed:?}"
    );
    trickle.abort();
    server.stop().await;
}

#[tokio::test]
async fn an_idle_keepalive_connection_is_closed_after_its_limit() {
    let server = server(NEVER, NEVER, Duration::from_millis(300)).await;
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    for _ in 0..2 {
        stream.write_all(HEALTH).await.unwrap();
        let response = one_response(&mut stream).await;
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    }
    // Then nothing: the keep-alive limit closes it (the header limit is an hour).
    assert!(until_closed(&mut stream).await.is_empty());
    server.stop().await;
}

#[tokio::test]
async fn a_body_that_stops_sending_is_cut_with_400() {
    let server = server(NEVER, Duration::from_millis(300), NEVER).await;
    for (path, content_type) in [
        ("/v1/files/stalled.bin", "application/octet-stream"),
        ("/execute", "application/json"),
        ("/upload", "multipart/form-data; boundary=b0"),
    ] {
        let method = if path.starts_with("/v1/files") {
            "PUT"
        } else {
            "POST"
        };
        let mut stream = TcpStream::connect(server.addr).await.unwrap();
        stream
            .write_all(
                format!(
                    "{method} {path} HTTP/1.1\r\nHost: sandbox\r\nContent-Type: {content_type}\r\nContent-Length: 1000\r\n\r\n--b0\r\n"
                )
                .as_bytes(),
            )
            .await
            .unwrap();
        let received = String::from_utf8_lossy(&until_closed(&mut stream).await).into_owned();
        assert!(received.starts_with("HTTP/1.1 400"), "{path}: {received}");
    }
    assert!(!server.base.path().join("stalled.bin").exists());
    server.stop().await;
}

#[tokio::test]
async fn a_slow_upload_that_keeps_sending_and_a_long_command_complete() {
    let idle = Duration::from_millis(1500);
    let server = server(idle, idle, idle).await;
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    let chunks = 40;
    stream
        .write_all(
            format!(
                "PUT /v1/files/slow.bin HTTP/1.1\r\nHost: sandbox\r\nContent-Length: {chunks}\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    // 40 bytes, one every 50 ms: longer in all than the body limit, never idle for it.
    for _ in 0..chunks {
        stream.write_all(b"x").await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let response = one_response(&mut stream).await;
    assert!(response.starts_with("HTTP/1.1 204"), "{response}");
    assert_eq!(
        std::fs::read(server.base.path().join("slow.bin"))
            .unwrap()
            .len(),
        chunks
    );

    // A command that runs past every limit: the connection is busy, not idle.
    let body = r#"{"command": "sleep 2 && echo done", "shell": true}"#;
    stream
        .write_all(
            format!(
                "POST /execute HTTP/1.1\r\nHost: sandbox\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let response = one_response(&mut stream).await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.contains(r#""stdout":"done\n""#), "{response}");
    server.stop().await;
}

#[tokio::test]
async fn beyond_the_connection_cap_a_connection_waits_for_one_to_close() {
    let server = TestServer::start_with(|c| {
        c.max_connections = 1;
        c.keepalive_idle_timeout = Duration::from_millis(500);
        c.header_read_timeout = NEVER;
    })
    .await;
    // A takes the only slot and keeps it (keep-alive).
    let mut first = TcpStream::connect(server.addr).await.unwrap();
    first.write_all(HEALTH).await.unwrap();
    assert!(one_response(&mut first).await.starts_with("HTTP/1.1 200"));
    // B is accepted by the kernel but served only when A's slot frees (here: A's keep-alive
    // limit closes it).
    let mut second = TcpStream::connect(server.addr).await.unwrap();
    second.write_all(HEALTH).await.unwrap();
    assert!(one_response(&mut second).await.starts_with("HTTP/1.1 200"));
    // So by the time B has its answer, A has been closed by the server.
    let mut buf = [0u8; 16];
    let state = first.try_read(&mut buf);
    assert!(
        matches!(state, Ok(0))
            || matches!(&state, Err(e) if e.kind() != std::io::ErrorKind::WouldBlock),
        "B was served while A still held the only connection slot: {state:?}"
    );
    server.stop().await;
}
