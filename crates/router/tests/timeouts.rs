#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Deadlines: `X-Sandbox-Timeout` sets a request's deadline, capped by the router's maximum
//! (also the deadline without the header); a sandbox that does not answer in time is 504, and a
//! deadline that passes while a response streams ends that response.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{Runtime, TestRouter, execute, pod_for, sandbox, synced_index};
use http_body_util::BodyExt as _;
use hyper::{Method, StatusCode};
use pretty_assertions::assert_eq;

async fn router_for(
    runtime: &Runtime,
    configure: impl FnOnce(&mut agent_sandbox_router::Config),
) -> TestRouter {
    let sandbox = sandbox("box");
    let pod = pod_for(&sandbox, runtime.ip, &[]);
    TestRouter::start_with(synced_index(&[(&sandbox, &pod)]), configure).await
}

#[tokio::test]
async fn a_10_second_command_with_a_30_second_timeout_header_succeeds() {
    let runtime = Runtime::start();
    let router = router_for(&runtime, |_| {}).await;
    let reply = router
        .send(
            Method::POST,
            "/execute",
            &[("x-sandbox-id", "box"), ("x-sandbox-timeout", "30")],
            execute("sleep 10; echo done"),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(reply.json()["stdout"], "done\n");
    assert_eq!(reply.json()["exit_code"], 0);
}

#[tokio::test]
async fn a_5_second_timeout_header_on_a_10_second_command_is_504() {
    let runtime = Runtime::start();
    let router = router_for(&runtime, |_| {}).await;
    let reply = router
        .send(
            Method::POST,
            "/execute",
            &[("x-sandbox-id", "box"), ("x-sandbox-timeout", "5")],
            execute("sleep 10; echo done"),
        )
        .await;
    assert_eq!(reply.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(
        reply.detail(),
        "Timed out waiting for the backend sandbox default/box: no answer within 5s."
    );
    let metrics = router
        .send(Method::GET, "/metrics", &[], Bytes::new())
        .await;
    assert!(
        metrics
            .text()
            .contains("sandbox_router_upstream_errors_total{reason=\"timeout\"} 1"),
        "{}",
        metrics.text()
    );
}

#[tokio::test]
async fn the_routers_maximum_caps_the_header_and_applies_without_it() {
    let runtime = Runtime::start();
    let router = router_for(&runtime, |config| {
        config.max_timeout = Duration::from_millis(1500);
    })
    .await;
    for headers in [
        vec![("x-sandbox-id", "box"), ("x-sandbox-timeout", "600")],
        vec![("x-sandbox-id", "box")],
    ] {
        let reply = router
            .send(Method::POST, "/execute", &headers, execute("sleep 8"))
            .await;
        assert_eq!(reply.status, StatusCode::GATEWAY_TIMEOUT, "{headers:?}");
        assert_eq!(
            reply.detail(),
            "Timed out waiting for the backend sandbox default/box: no answer within 1.500s."
        );
    }
    // A command that ends in time is unaffected.
    let quick = router
        .send(
            Method::POST,
            "/execute",
            &[("x-sandbox-id", "box")],
            execute("echo quick"),
        )
        .await;
    assert_eq!(quick.status, StatusCode::OK);
}

#[tokio::test]
async fn a_deadline_that_passes_mid_stream_ends_the_response() {
    let runtime = Runtime::start();
    let router = router_for(&runtime, |_| {}).await;
    let request = common::request(
        Method::POST,
        "/v1/exec",
        &[("x-sandbox-id", "box"), ("x-sandbox-timeout", "2")],
        Bytes::from(serde_json::json!({"command": "echo started; sleep 30"}).to_string()),
    );
    let response = common::open(router.addr, request).await;
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let mut received = Vec::new();
    let ended = tokio::time::timeout(Duration::from_secs(25), async {
        loop {
            match body.frame().await {
                Some(Ok(frame)) => {
                    received.extend_from_slice(frame.data_ref().unwrap_or(&Bytes::new()))
                }
                Some(Err(error)) => return Err(error),
                None => return Ok(()),
            }
        }
    })
    .await
    .expect("the router ended the response at its deadline");
    assert!(ended.is_err(), "the response ended as if complete");
    let text = String::from_utf8_lossy(&received);
    assert!(text.contains("started"), "{text}");
    assert!(
        !text.contains("\"exit\""),
        "the command cannot have finished: {text}"
    );
}
