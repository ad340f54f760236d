#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! `/v1/exec` and `/v1/processes` against real processes on loopback: streamed events, group
//! kills checked by PID, caps, background output with offsets, reconnects, drops, stdin,
//! signals.

mod common;

use std::time::Duration;

use agent_sandbox_api::runtime::v1::{ExecEvent, ExitInfo, OutputChunk, ProcessInfo, ProcessState};
use assert_json_diff::assert_json_include;
use common::{TestServer, alive, group_members, survivors};
use http_body_util::BodyExt;
use hyper::{Method, StatusCode};
use pretty_assertions::assert_eq;
use serde_json::json;

fn output_of(events: &[ExecEvent]) -> (Vec<u8>, Vec<u8>) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    for event in events {
        match event {
            ExecEvent::Stdout(chunk) => out.extend(chunk.bytes().unwrap()),
            ExecEvent::Stderr(chunk) => err.extend(chunk.bytes().unwrap()),
            _ => {}
        }
    }
    (out, err)
}

fn exit_of(events: &[ExecEvent]) -> ExitInfo {
    match events.last() {
        Some(ExecEvent::Exit(exit)) => exit.clone(),
        other => panic!("the stream does not end with exit: {other:?}"),
    }
}

/// Offsets of consecutive chunks are contiguous from 0.
fn assert_contiguous(events: &[ExecEvent], from: u64) -> u64 {
    let mut next = from;
    for event in events {
        if let ExecEvent::Stdout(chunk) | ExecEvent::Stderr(chunk) = event {
            assert_eq!(chunk.offset, next, "{events:?}");
            next = chunk.end_offset();
        }
    }
    next
}

#[tokio::test]
async fn exec_streams_start_output_and_exit() {
    let server = TestServer::start().await;
    let reply = server
        .post_json(
            "/v1/exec",
            &json!({"command": "echo out; echo err >&2; printf 'é'; exit 3"}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        reply.header("content-type").as_deref(),
        Some("application/x-ndjson")
    );
    let events = reply.events();
    assert!(
        matches!(events[0], ExecEvent::Start { pid } if pid > 1),
        "{events:?}"
    );
    let (out, err) = output_of(&events);
    assert_eq!(out, "out\né".as_bytes());
    assert_eq!(err, b"err\n");
    assert_contiguous(&events, 0);
    let exit = exit_of(&events);
    assert_eq!(
        (exit.exit_code, exit.signal, exit.timed_out),
        (Some(3), None, false)
    );

    // No shell with argv.
    let reply = server
        .post_json("/v1/exec", &json!({"argv": ["echo", "a | tr a b"]}))
        .await;
    assert_eq!(output_of(&reply.events()).0, b"a | tr a b\n");
}

#[tokio::test]
async fn exec_output_arrives_while_the_command_runs() {
    let server = TestServer::start().await;
    let request = common::request(
        Method::POST,
        "/v1/exec",
        &[],
        json!({"command": "echo first; sleep 1000"})
            .to_string()
            .into(),
    );
    let response = common::open(server.addr, request).await;
    let mut body = response.into_body();
    let mut seen = Vec::new();
    while !seen.iter().any(|e| matches!(e, ExecEvent::Stdout(_))) {
        let frame = tokio::time::timeout(Duration::from_secs(10), body.frame())
            .await
            .expect("output arrives before the command ends")
            .unwrap()
            .unwrap();
        if let Ok(data) = frame.into_data() {
            seen.extend(common::parse_events(&data));
        }
    }
    let ExecEvent::Start { pid } = seen[0] else {
        panic!("{seen:?}")
    };
    assert!(alive(pid));
    // Dropping the stream is a disconnect: the command is killed.
    drop(body);
    assert_eq!(
        survivors(&[pid], Duration::from_secs(5)).await,
        Vec::<u32>::new()
    );
}

#[tokio::test]
async fn exec_timeout_leaves_no_descendant_alive() {
    let server = TestServer::start().await;
    let request = common::request(
        Method::POST,
        "/v1/exec",
        &[],
        json!({"argv": ["sh", "-c", "sleep 1000 & sleep 1000"], "timeout_seconds": 3})
            .to_string()
            .into(),
    );
    let response = common::open(server.addr, request).await;
    let mut body = response.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    let ExecEvent::Start { pid } = common::parse_events(&first)[0] else {
        panic!("no start event")
    };
    // While it runs: the shell and both sleeps (or the shell exec'd into the last one).
    let members = common::eventually(Duration::from_secs(5), || {
        let members = group_members(pid);
        (members.len() >= 2).then_some(members)
    })
    .await
    .expect("the group has its members");
    let rest = body.collect().await.unwrap().to_bytes();
    let events = common::parse_events(&rest);
    let exit = exit_of(&events);
    assert!(exit.timed_out, "{exit:?}");
    assert_eq!((exit.exit_code, exit.signal), (None, Some(9)));
    assert_eq!(
        survivors(&members, Duration::from_secs(5)).await,
        Vec::<u32>::new()
    );
    assert!(group_members(pid).is_empty());
}

#[tokio::test]
async fn exec_flags_truncation_and_reports_errors_as_json() {
    let server = TestServer::start().await;
    let reply = server
        .post_json(
            "/v1/exec",
            &json!({"command": "yes | head -c 50000", "max_output_bytes": 100}),
        )
        .await;
    let events = reply.events();
    assert_eq!(output_of(&events).0.len(), 100);
    let exit = exit_of(&events);
    assert!(exit.stdout_truncated && !exit.stderr_truncated, "{exit:?}");

    let reply = server
        .post_json("/v1/exec", &json!({"argv": ["no-such-command-xyz"]}))
        .await;
    assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_json_include!(actual: reply.json(), expected: json!({"code": "SPAWN_FAILED"}));
    let reply = server
        .post_json("/v1/exec", &json!({"command": "true", "timeout": 5}))
        .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(reply.json()["code"], "INVALID_ARGUMENT");
    let reply = server
        .post_json("/v1/exec", &json!({"command": "true", "argv": ["true"]}))
        .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    let reply = server
        .post_json("/v1/exec", &json!({"command": "pwd", "cwd": "/etc"}))
        .await;
    assert_eq!(
        (reply.status, reply.json()["code"].clone()),
        (StatusCode::FORBIDDEN, json!("PERMISSION_DENIED"))
    );
    let reply = server.get("/v1/nope").await;
    assert_eq!(
        (reply.status, reply.json()["code"].clone()),
        (StatusCode::NOT_FOUND, json!("NOT_FOUND"))
    );
    let reply = server.send(Method::PUT, "/v1/exec", &[], "").await;
    assert_eq!(reply.json()["code"], "METHOD_NOT_ALLOWED");
}

async fn start(server: &TestServer, body: serde_json::Value) -> ProcessInfo {
    let reply = server.post_json("/v1/processes", &body).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text());
    serde_json::from_slice(&reply.body).unwrap()
}

async fn info(server: &TestServer, id: &str) -> ProcessInfo {
    serde_json::from_slice(&server.get(&format!("/v1/processes/{id}")).await.body).unwrap()
}

async fn wait_exited(server: &TestServer, id: &str) -> ProcessInfo {
    // `follow` ends with the exit event.
    let reply = server
        .get(&format!("/v1/processes/{id}/output?follow=true"))
        .await;
    exit_of(&reply.events());
    let process = info(server, id).await;
    assert_eq!(process.state, ProcessState::Exited);
    process
}

#[tokio::test]
async fn background_output_resumes_at_the_readers_offset() {
    let server = TestServer::start().await;
    let process = start(
        &server,
        json!({"command": "for i in $(seq 1 200); do echo line$i; done; echo err >&2; sleep 0.3; echo done"}),
    )
    .await;
    assert_eq!(process.state, ProcessState::Running);
    let listed = server.get("/v1/processes").await.json();
    assert_eq!(listed["processes"][0]["id"], json!(process.id));

    // A full, followed read.
    let full = server
        .get(&format!("/v1/processes/{}/output?follow=true", process.id))
        .await
        .events();
    let end = assert_contiguous(&full, 0);
    let (out, err) = output_of(&full);
    assert!(
        out.ends_with(b"line200\ndone\n"),
        "{}",
        String::from_utf8_lossy(&out)
    );
    assert_eq!(err, b"err\n");
    assert_eq!(exit_of(&full).exit_code, Some(0));

    // A reader that got part of it reconnects from its offset and gets exactly the rest.
    let all: Vec<u8> = full
        .iter()
        .filter_map(|e| match e {
            ExecEvent::Stdout(c) | ExecEvent::Stderr(c) => Some(c.bytes().unwrap()),
            _ => None,
        })
        .flatten()
        .collect();
    let resume_at = 1234u64;
    let resumed = server
        .get(&format!(
            "/v1/processes/{}/output?offset={resume_at}",
            process.id
        ))
        .await
        .events();
    assert_eq!(assert_contiguous(&resumed, resume_at), end);
    let tail: Vec<u8> = resumed
        .iter()
        .filter_map(|e| match e {
            ExecEvent::Stdout(c) | ExecEvent::Stderr(c) => Some(c.bytes().unwrap()),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(tail, &all[usize::try_from(resume_at).unwrap()..]);
    assert!(matches!(resumed.last(), Some(ExecEvent::Exit(_))));
    let reply = server
        .get(&format!(
            "/v1/processes/{}/output?offset={}",
            process.id,
            end + 1
        ))
        .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn a_follower_that_disconnects_resumes_where_it_stopped() {
    let server = TestServer::start().await;
    let process = start(
        &server,
        json!({"command": "echo one; sleep 0.5; echo two; sleep 0.5; echo three"}),
    )
    .await;
    // First connection: read until "one" arrives, then hang up.
    let request = common::request(
        Method::GET,
        &format!("/v1/processes/{}/output?follow=true&offset=0", process.id),
        &[],
        bytes::Bytes::new(),
    );
    let mut body = common::open(server.addr, request).await.into_body();
    let mut first: Vec<ExecEvent> = Vec::new();
    while !first.iter().any(|e| matches!(e, ExecEvent::Stdout(_))) {
        let frame = tokio::time::timeout(Duration::from_secs(10), body.frame())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        first.extend(common::parse_events(&frame.into_data().unwrap()));
    }
    drop(body);
    let offset = assert_contiguous(&first, 0);
    let (seen, _) = output_of(&first);
    assert!(seen.starts_with(b"one\n"), "{first:?}");
    // Second connection from that offset: the rest, nothing twice, nothing lost.
    let rest = server
        .get(&format!(
            "/v1/processes/{}/output?follow=true&offset={offset}",
            process.id
        ))
        .await
        .events();
    assert_contiguous(&rest, offset);
    let mut whole = seen;
    whole.extend(output_of(&rest).0);
    assert_eq!(whole, b"one\ntwo\nthree\n");
    assert_eq!(exit_of(&rest).exit_code, Some(0));
}

#[tokio::test]
async fn a_reader_that_fell_behind_is_told_what_was_dropped() {
    let server = TestServer::start_with(|c| c.process_buffer_bytes = 4096).await;
    let process = start(
        &server,
        json!({"command": "head -c 100000 /dev/zero | tr '\\0' x"}),
    )
    .await;
    let events = wait_exited(&server, &process.id).await;
    assert_eq!(events.output_end, 100_000);
    assert!(events.output_start > 0);
    let read = server
        .get(&format!("/v1/processes/{}/output?offset=0", process.id))
        .await
        .events();
    let ExecEvent::Dropped { offset, bytes } = read[0] else {
        panic!("{:?}", read[0])
    };
    assert_eq!((offset, bytes), (0, events.output_start));
    assert_eq!(assert_contiguous(&read[1..], events.output_start), 100_000);
    assert!(matches!(read.last(), Some(ExecEvent::Exit(_))));
}

#[tokio::test]
async fn stdin_signal_and_delete() {
    let server = TestServer::start().await;
    // stdin kept open, fed in two writes, closed by eof.
    let cat = start(
        &server,
        json!({"argv": ["cat"], "stdin": "a", "stdin_open": true}),
    )
    .await;
    assert!(cat.stdin_open);
    let reply = server
        .send(
            Method::POST,
            &format!("/v1/processes/{}/stdin", cat.id),
            &[],
            "bc\n",
        )
        .await;
    assert_eq!(reply.json(), json!({"written": 3, "stdin_open": true}));
    let reply = server
        .send(
            Method::POST,
            &format!("/v1/processes/{}/stdin?eof=true", cat.id),
            &[],
            "",
        )
        .await;
    assert_eq!(reply.json(), json!({"written": 0, "stdin_open": false}));
    let done = wait_exited(&server, &cat.id).await;
    assert_eq!(done.exit.as_ref().unwrap().exit_code, Some(0));
    let read = server
        .get(&format!("/v1/processes/{}/output", cat.id))
        .await
        .events();
    assert_eq!(output_of(&read).0, b"abc\n");
    let reply = server
        .send(
            Method::POST,
            &format!("/v1/processes/{}/stdin", cat.id),
            &[],
            "late",
        )
        .await;
    assert_eq!(reply.status, StatusCode::CONFLICT);

    // A signal goes to the whole group.
    let sleeper = start(&server, json!({"command": "sleep 1000 & sleep 1000"})).await;
    let members = common::eventually(Duration::from_secs(5), || {
        let members = group_members(sleeper.pid);
        (members.len() >= 2).then_some(members)
    })
    .await
    .unwrap();
    let reply = server
        .post_json(
            &format!("/v1/processes/{}/signal", sleeper.id),
            &json!({"signal": "TERM"}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let ended = wait_exited(&server, &sleeper.id).await;
    assert_eq!(ended.exit.unwrap().signal, Some(15));
    assert_eq!(
        survivors(&members, Duration::from_secs(5)).await,
        Vec::<u32>::new()
    );
    let reply = server
        .post_json(
            &format!("/v1/processes/{}/signal", sleeper.id),
            &json!({"signal": "TERM"}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::CONFLICT);

    // Delete kills and forgets.
    let doomed = start(&server, json!({"argv": ["sleep", "1000"]})).await;
    let reply = server
        .send(
            Method::DELETE,
            &format!("/v1/processes/{}", doomed.id),
            &[],
            "",
        )
        .await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT);
    assert_eq!(
        survivors(&[doomed.pid], Duration::from_secs(5)).await,
        Vec::<u32>::new()
    );
    let reply = server.get(&format!("/v1/processes/{}", doomed.id)).await;
    assert_eq!(
        (reply.status, reply.json()["code"].clone()),
        (StatusCode::NOT_FOUND, json!("NOT_FOUND"))
    );
}

#[tokio::test]
async fn background_timeout_and_chunk_encoding() {
    let server = TestServer::start().await;
    let process = start(
        &server,
        json!({"command": "printf '\\377'; sleep 1000", "timeout_seconds": 2}),
    )
    .await;
    let done = wait_exited(&server, &process.id).await;
    let exit = done.exit.unwrap();
    assert!(exit.timed_out);
    let read = server
        .get(&format!("/v1/processes/{}/output", process.id))
        .await
        .events();
    let ExecEvent::Stdout(OutputChunk { data_b64, .. }) = &read[0] else {
        panic!("{read:?}")
    };
    assert_eq!(data_b64.as_deref(), Some("/w=="));
}

#[tokio::test]
async fn health_v1() {
    let server = TestServer::start().await;
    let reply = server.get("/v1/health").await;
    assert_json_include!(actual: reply.json(), expected: json!({"status": "ok"}));
}
