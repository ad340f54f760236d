#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The legacy endpoints against real processes on loopback: upstream's JSON byte for byte,
//! shell and no-shell semantics, timeouts that kill the whole group, caps, limits, traversal.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use assert_json_diff::assert_json_include;
use bytes::Bytes;
use common::{TestServer, alive, pid_from_file, survivors};
use hyper::{Method, StatusCode};
use pretty_assertions::assert_eq;
use serde_json::json;

fn multipart(filename: &str, content: &[u8]) -> (String, Bytes) {
    let boundary = "sandboxboundary7MA4YWxkTrZu0gW";
    let mut body = Vec::new();
    body.extend_from_slice(
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{filename}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
        )
        .as_bytes(),
    );
    body.extend_from_slice(content);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    (
        format!("multipart/form-data; boundary={boundary}"),
        Bytes::from(body),
    )
}

async fn upload(server: &TestServer, filename: &str, content: &[u8]) -> common::Reply {
    let (content_type, body) = multipart(filename, content);
    server
        .send(
            Method::POST,
            "/upload",
            &[("content-type", &content_type)],
            body,
        )
        .await
}

#[tokio::test]
async fn health_is_upstreams_body() {
    let server = TestServer::start().await;
    let reply = server.get("/").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        reply.text(),
        r#"{"status":"ok","message":"Sandbox Runtime is active."}"#
    );
    assert_eq!(
        reply.header("content-type").as_deref(),
        Some("application/json")
    );
}

#[tokio::test]
async fn execute_answers_upstreams_fields_first() {
    let server = TestServer::start().await;
    let reply = server
        .post_json("/execute", &json!({"command": "echo hello"}))
        .await;
    assert_eq!(reply.status, StatusCode::OK);
    let text = reply.text();
    assert!(
        text.starts_with(r#"{"stdout":"hello\n","stderr":"","exit_code":0,"timed_out":false,"stdout_truncated":false,"stderr_truncated":false,"duration_ms":"#),
        "{text}"
    );
}

#[tokio::test]
async fn execute_splits_without_a_shell_in_the_base_dir() {
    let server = TestServer::start().await;
    let reply = server
        .post_json("/execute", &json!({"command": "echo a | tr a b"}))
        .await;
    assert_json_include!(actual: reply.json(), expected: json!({"stdout": "a | tr a b\n", "exit_code": 0}));
    let reply = server
        .post_json("/execute", &json!({"command": "pwd"}))
        .await;
    assert_eq!(
        reply.json()["stdout"],
        format!("{}\n", server.base_path().display())
    );
    let reply = server
        .post_json(
            "/execute",
            &json!({"command": "python3 -c 'import sys; print(sys.argv[1:])' 'a b' c"}),
        )
        .await;
    if reply.json()["exit_code"] == 0 {
        assert_eq!(reply.json()["stdout"], "['a b', 'c']\n");
    }
}

#[tokio::test]
async fn execute_shell_extension_gives_pipes_cd_env_cwd_and_stdin() {
    let server = TestServer::start().await;
    std::fs::create_dir(server.base.path().join("work")).unwrap();
    let reply = server
        .post_json(
            "/execute",
            &json!({"command": "echo a | tr a b", "shell": true}),
        )
        .await;
    assert_json_include!(actual: reply.json(), expected: json!({"stdout": "b\n", "exit_code": 0}));
    let reply = server
        .post_json(
            "/execute",
            &json!({"command": "cd work && pwd && echo $GREETING && cat", "shell": true,
                    "env": {"GREETING": "hi"}, "stdin": "from stdin"}),
        )
        .await;
    let expected = format!("{}/work\nhi\nfrom stdin", server.base_path().display());
    assert_json_include!(actual: reply.json(), expected: json!({"stdout": expected, "exit_code": 0}));
    let reply = server
        .post_json("/execute", &json!({"command": "pwd", "cwd": "work"}))
        .await;
    assert_eq!(
        reply.json()["stdout"],
        format!("{}/work\n", server.base_path().display())
    );
    let reply = server
        .post_json("/execute", &json!({"command": "pwd", "cwd": "../.."}))
        .await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN);
    assert_eq!(reply.json(), json!({"message": "Access denied"}));
}

#[tokio::test]
async fn execute_failures_keep_the_message_with_conventional_codes() {
    let server = TestServer::start().await;
    let reply = server
        .post_json("/execute", &json!({"command": "no-such-command-xyz"}))
        .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_json_include!(actual: reply.json(), expected: json!({
        "stdout": "", "exit_code": 127,
        "stderr": "Failed to execute command: [Errno 2] No such file or directory: 'no-such-command-xyz'"}));

    let script = server.base.path().join("script.sh");
    std::fs::write(&script, "#!/bin/sh\necho hi\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
    let reply = server
        .post_json("/execute", &json!({"command": "./script.sh"}))
        .await;
    let body = reply.json();
    // Root may execute anything with an x bit; without one, even root gets EACCES.
    assert_eq!(body["exit_code"], 126, "{body}");
    assert!(
        body["stderr"]
            .as_str()
            .unwrap()
            .starts_with("Failed to execute command: ")
    );

    let reply = server
        .post_json("/execute", &json!({"command": "echo 'unterminated"}))
        .await;
    assert_json_include!(actual: reply.json(), expected: json!({
        "exit_code": 2, "stderr": "Failed to execute command: No closing quotation"}));

    let reply = server
        .post_json("/execute", &json!({"command": "sh -c 'exit 7'"}))
        .await;
    assert_eq!(reply.json()["exit_code"], 7);
    let reply = server
        .post_json("/execute", &json!({"command": "sh -c 'kill -TERM $$'"}))
        .await;
    assert_eq!(reply.json()["exit_code"], -15);
}

#[tokio::test]
async fn execute_timeout_kills_every_descendant() {
    let server = TestServer::start().await;
    let reply = server
        .post_json(
            "/execute",
            &json!({"command": "sh -c 'sleep 1000 & echo $! $$; sleep 1000'", "timeout_seconds": 3}),
        )
        .await;
    let body = reply.json();
    assert_eq!(body["exit_code"], 124, "{body}");
    assert_eq!(body["timed_out"], true);
    assert!(
        body["stderr"].as_str().unwrap().contains("timed out"),
        "{body}"
    );
    let pids: Vec<u32> = body["stdout"]
        .as_str()
        .unwrap()
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(pids.len(), 2, "{body}");
    assert_eq!(
        survivors(&pids, Duration::from_secs(5)).await,
        Vec::<u32>::new()
    );
}

#[tokio::test]
async fn background_children_cannot_wedge_a_request_and_daemons_die_at_shutdown() {
    let server = TestServer::start_with(|c| c.drain_timeout = Duration::from_millis(300)).await;
    // A child that keeps the output pipe open is killed after the drain timeout.
    let reply = server
        .post_json(
            "/execute",
            &json!({"command": "echo started; sleep 1000 & echo $! > holder.pid", "shell": true}),
        )
        .await;
    assert_json_include!(actual: reply.json(), expected: json!({"stdout": "started\n", "exit_code": 0, "timed_out": false}));
    let holder = pid_from_file(&server.base.path().join("holder.pid")).await;
    assert_eq!(
        survivors(&[holder], Duration::from_secs(5)).await,
        Vec::<u32>::new()
    );
    // A daemon that let go of the output keeps running after the request...
    let reply = server
        .post_json(
            "/execute",
            &json!({"command": "sleep 1000 >/dev/null 2>&1 & echo $!", "shell": true}),
        )
        .await;
    let daemon: u32 = reply.json()["stdout"]
        .as_str()
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(alive(daemon));
    // ...until the runtime shuts down.
    server.stop().await;
    assert_eq!(
        survivors(&[daemon], Duration::from_secs(5)).await,
        Vec::<u32>::new()
    );
}

#[tokio::test]
async fn execute_output_beyond_the_cap_is_flagged() {
    let server = TestServer::start_with(|c| c.max_output_bytes = 1000).await;
    let reply = server
        .post_json(
            "/execute",
            &json!({"command": "yes | head -c 100000", "shell": true}),
        )
        .await;
    let body = reply.json();
    assert_eq!(body["stdout"].as_str().unwrap().len(), 1000);
    assert_eq!(body["stdout_truncated"], true);
    assert_eq!(body["stderr_truncated"], false);
    assert_eq!(body["exit_code"], 0);
    let reply = server
        .post_json(
            "/execute",
            &json!({"command": "yes | head -c 100000 >&2", "shell": true, "max_output_bytes": 10}),
        )
        .await;
    let body = reply.json();
    assert_eq!(body["stderr"].as_str().unwrap().len(), 10);
    assert_eq!(body["stderr_truncated"], true);
}

#[tokio::test]
async fn execute_client_disconnect_kills_the_group() {
    let server = TestServer::start().await;
    let addr = server.addr;
    let request = tokio::spawn(async move {
        common::send(
            addr,
            Method::POST,
            "/execute",
            &[("content-type", "application/json")],
            Bytes::from(
                json!({"command": "echo $$ > pid; sleep 1000 & echo $! > child; wait", "shell": true})
                    .to_string(),
            ),
        )
        .await
    });
    let pid = pid_from_file(&server.base.path().join("pid")).await;
    let child = pid_from_file(&server.base.path().join("child")).await;
    assert!(alive(pid) && alive(child));
    request.abort();
    assert_eq!(
        survivors(&[pid, child], Duration::from_secs(5)).await,
        Vec::<u32>::new()
    );
}

#[tokio::test]
async fn concurrent_executions() {
    let server = TestServer::start().await;
    let mut tasks = Vec::new();
    for i in 0..16 {
        let addr = server.addr;
        tasks.push(tokio::spawn(async move {
            let body =
                json!({"command": format!("sleep 0.2; echo {i}"), "shell": true}).to_string();
            let reply = common::send(addr, Method::POST, "/execute", &[], Bytes::from(body)).await;
            (i, reply.json())
        }));
    }
    for task in tasks {
        let (i, body) = task.await.unwrap();
        assert_json_include!(actual: body, expected: json!({"stdout": format!("{i}\n"), "exit_code": 0}));
    }
}

#[tokio::test]
async fn limits_answer_json() {
    let server = TestServer::start_with(|c| {
        c.max_processes = 1;
        c.max_body_bytes = 1024;
    })
    .await;
    // 413 beyond the body limit.
    let big = json!({"command": "x".repeat(2000)});
    let reply = server.post_json("/execute", &big).await;
    assert_eq!(reply.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(reply.json()["message"].as_str().unwrap().contains("1024"));
    // 429 beyond the process limit.
    let started = server
        .post_json("/v1/processes", &json!({"argv": ["sleep", "1000"]}))
        .await;
    assert_eq!(started.status, StatusCode::CREATED, "{}", started.text());
    let reply = server
        .post_json("/execute", &json!({"command": "true"}))
        .await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(
        reply.json()["message"]
            .as_str()
            .unwrap()
            .contains("too many processes")
    );
    assert_eq!(reply.header("retry-after").as_deref(), Some("1"));
    // FastAPI-shaped validation errors and unknown routes.
    let reply = server.post_json("/execute", &json!({})).await;
    assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_json_include!(actual: reply.json(), expected: json!({"detail": [{"type": "missing", "loc": ["body", "command"]}]}));
    let reply = server.send(Method::POST, "/execute", &[], "not json").await;
    assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(reply.json()["detail"][0]["type"], "json_invalid");
    let reply = server.get("/nope").await;
    assert_eq!(
        (reply.status, reply.json()),
        (StatusCode::NOT_FOUND, json!({"detail": "Not Found"}))
    );
    let reply = server.send(Method::DELETE, "/execute", &[], "").await;
    assert_eq!(reply.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(reply.json(), json!({"detail": "Method Not Allowed"}));
}

#[tokio::test]
async fn files_round_trip_with_upstreams_json() {
    let server = TestServer::start().await;
    let reply = upload(&server, "docs/x.txt", b"hello").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        reply.text(),
        r#"{"message":"File 'docs/x.txt' uploaded successfully."}"#
    );
    assert_eq!(
        std::fs::read(server.base.path().join("docs/x.txt")).unwrap(),
        b"hello"
    );

    let reply = server.get("/exists/docs%2Fx.txt").await;
    assert_eq!(reply.text(), r#"{"path":"docs/x.txt","exists":true}"#);
    let reply = server.get("/exists/docs/nope.txt").await;
    assert_eq!(reply.text(), r#"{"path":"docs/nope.txt","exists":false}"#);

    let reply = server.get("/list/docs").await;
    assert_eq!(reply.status, StatusCode::OK);
    let text = reply.text();
    assert!(
        text.starts_with(r#"[{"name":"x.txt","size":5,"type":"file","mod_time":"#),
        "{text}"
    );
    let entry = &reply.json()[0];
    assert!(entry["mod_time"].as_f64().unwrap() > 1.0e9);
    let reply = server.get("/list/").await;
    assert_json_include!(actual: reply.json(), expected: json!([{"name": "docs", "type": "directory"}]));
    let reply = server.get("/list/docs/x.txt").await;
    assert_eq!(
        (reply.status, reply.text()),
        (
            StatusCode::NOT_FOUND,
            r#"{"message":"Path is not a directory"}"#.to_owned()
        )
    );

    let reply = server.get("/download/docs%2Fx.txt").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.body, Bytes::from_static(b"hello"));
    assert_eq!(
        reply.header("content-type").as_deref(),
        Some("application/octet-stream")
    );
    assert_eq!(
        reply.header("content-disposition").as_deref(),
        Some("attachment; filename=\"docs/x.txt\"")
    );
    let reply = server.get("/download/docs").await;
    assert_eq!(
        (reply.status, reply.text()),
        (
            StatusCode::NOT_FOUND,
            r#"{"message":"File not found"}"#.to_owned()
        )
    );

    // Overwrite keeps the mode; uploads are atomic (no temp files left).
    std::fs::set_permissions(
        server.base.path().join("docs/x.txt"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    upload(&server, "docs/x.txt", b"again").await;
    let meta = std::fs::metadata(server.base.path().join("docs/x.txt")).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let names: Vec<_> = std::fs::read_dir(server.base.path().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("x.txt")]);

    // No file part: FastAPI's 422.
    let reply = server
        .send(
            Method::POST,
            "/upload",
            &[("content-type", "multipart/form-data; boundary=x")],
            "--x--\r\n",
        )
        .await;
    assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_json_include!(actual: reply.json(), expected: json!({"detail": [{"type": "missing", "loc": ["body", "file"]}]}));
}

#[tokio::test]
async fn traversal_is_refused() {
    let server = TestServer::start().await;
    let base = server.base.path();
    std::fs::write(base.join("inside.txt"), "ok").unwrap();
    std::os::unix::fs::symlink("/etc", base.join("out")).unwrap();
    std::os::unix::fs::symlink("../../../../../../../etc/hostname", base.join("rel-out")).unwrap();
    std::os::unix::fs::symlink("loop-b", base.join("loop-a")).unwrap();
    std::os::unix::fs::symlink("loop-a", base.join("loop-b")).unwrap();
    std::os::unix::fs::symlink("inside.txt", base.join("good-link")).unwrap();
    let denied = r#"{"message":"Access denied"}"#;
    for path in [
        "/download/..%2F..%2F..%2Fetc%2Fpasswd",
        "/download/%2e%2e/%2e%2e/etc/passwd",
        "/download/%252e%252e%252f%252e%252e%252fetc%252fpasswd",
        "/download/out/passwd",
        "/download/rel-out",
        "/download/loop-a",
        "/download/inside.txt%00.png",
        "/list/out",
        "/list/..",
        "/exists/out/passwd",
        "/exists/loop-a",
        "/exists/..%2F..",
    ] {
        let reply = server.get(path).await;
        assert_eq!(
            (reply.status, reply.text()),
            (StatusCode::FORBIDDEN, denied.to_owned()),
            "{path}"
        );
    }
    // Inside the base dir: by relative path, by symlink, and by absolute path as upstream.
    let base_abs = server.base_path().display().to_string();
    let encoded: String = percent_encoding::utf8_percent_encode(
        &format!("{base_abs}/inside.txt"),
        percent_encoding::NON_ALPHANUMERIC,
    )
    .to_string();
    for path in [
        "/download/inside.txt".to_owned(),
        "/download/good-link".to_owned(),
        format!("/download/{encoded}"),
    ] {
        let reply = server.get(&path).await;
        assert_eq!(
            (reply.status, reply.body.as_ref()),
            (StatusCode::OK, b"ok".as_ref()),
            "{path}"
        );
    }
    // Other absolute paths are taken relative to the base dir, as upstream does: never the host's.
    let reply = server.get("/download/%2Fetc%2Fhostname").await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    // Uploads cannot escape either, neither by name nor through a symlinked directory.
    for name in ["../evil.txt", "out/evil.txt", "loop-a/evil.txt"] {
        let reply = upload(&server, name, b"pwned").await;
        assert_eq!(
            (reply.status, reply.text()),
            (StatusCode::FORBIDDEN, denied.to_owned()),
            "{name}"
        );
    }
    assert!(!std::path::Path::new("/etc/evil.txt").exists());
    assert!(!base.parent().unwrap().join("evil.txt").exists());
}

/// Issue 15 item 1: an upload whose filename names the base directory is a 400 naming it.
#[tokio::test]
async fn upload_never_targets_the_base_directory() {
    let server = TestServer::start().await;
    let base = server.base.path();
    std::fs::create_dir(base.join("dir")).unwrap();
    std::fs::write(base.join("dir/keep.txt"), "keep").unwrap();
    let absolute = format!("{}/dir/..", server.base_path().display());
    for name in ["dir/..", ".", "./", "/", "dir/../.", absolute.as_str()] {
        let reply = upload(&server, name, b"pwned").await;
        assert_eq!(
            reply.status,
            StatusCode::BAD_REQUEST,
            "{name}: {}",
            reply.text()
        );
        let message = reply.json()["message"].as_str().unwrap().to_owned();
        assert!(
            message.contains(&format!("'{name}'")) && message.contains("base directory"),
            "{name}: {message}"
        );
        assert_eq!(
            std::fs::read_to_string(base.join("dir/keep.txt")).unwrap(),
            "keep"
        );
    }
    // `..` that stays inside is resolved lexically.
    let reply = upload(&server, "dir/../new.txt", b"new").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(
        std::fs::read_to_string(base.join("new.txt")).unwrap(),
        "new"
    );
}

/// Issue 15 item 11 (legacy): an over-long path is a 400, not a 500 (or a 404 that hides
/// it); `HEAD` agrees with `GET` on a FIFO; malformed multipart part headers are a 400.
#[tokio::test]
async fn legacy_status_codes_for_long_paths_fifos_and_bad_multipart() {
    let server = TestServer::start().await;
    let long_name = "n".repeat(300);
    let long_path = vec!["d"; 2100].join("/");
    for path in [long_name.as_str(), long_path.as_str()] {
        for endpoint in ["/download/", "/list/", "/exists/"] {
            let reply = server.get(&format!("{endpoint}{path}")).await;
            assert_eq!(
                reply.status,
                StatusCode::BAD_REQUEST,
                "{endpoint}: {}",
                reply.text()
            );
            assert!(
                reply.json()["message"]
                    .as_str()
                    .unwrap()
                    .contains("too long")
            );
        }
        let reply = upload(&server, path, b"x").await;
        assert_eq!(
            reply.status,
            StatusCode::BAD_REQUEST,
            "upload: {}",
            reply.text()
        );
        let reply = server
            .post_json("/execute", &json!({"command": "true", "cwd": path}))
            .await;
        assert_eq!(
            reply.status,
            StatusCode::BAD_REQUEST,
            "execute: {}",
            reply.text()
        );
    }

    rustix::fs::mknodat(
        rustix::fs::CWD,
        server.base.path().join("fifo"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from(0o644),
        0,
    )
    .unwrap();
    for endpoint in ["/download/fifo", "/list/fifo", "/exists/fifo"] {
        let get = server.get(endpoint).await;
        let head = server.send(Method::HEAD, endpoint, &[], "").await;
        assert_eq!(head.status, get.status, "{endpoint}");
        assert!(
            get.status.is_client_error() || get.status == StatusCode::OK,
            "{endpoint}"
        );
    }

    for body in [
        "--b0\r\nContent-Disposition form-data; name=\"file\"; filename=\"x\"\r\n\r\nx\r\n--b0--\r\n",
        "--b0\r\nBad Header: y\r\n\r\nx\r\n--b0--\r\n",
    ] {
        let reply = server
            .send(
                Method::POST,
                "/upload",
                &[("content-type", "multipart/form-data; boundary=b0")],
                body,
            )
            .await;
        assert_eq!(
            reply.status,
            StatusCode::BAD_REQUEST,
            "{body:?}: {}",
            reply.text()
        );
    }
}

/// Issue 21 item 5: `/execute` goes through the `/v1` exec pipeline, so both refuse the same
/// requests, each in its own shape. A NUL byte in the command is a command that cannot run for
/// `/execute` (200 and Python's message, as upstream) and a 400 for `/v1/exec`.
#[tokio::test]
async fn execute_and_v1_exec_share_their_checks() {
    let server = TestServer::start().await;
    for (legacy, v1) in [
        (
            json!({"command": "echo a\u{0}b"}),
            json!({"argv": ["echo", "a\u{0}b"]}),
        ),
        (
            json!({"command": "echo a\u{0}b", "shell": true}),
            json!({"command": "echo a\u{0}b"}),
        ),
    ] {
        let reply = server.post_json("/execute", &legacy).await;
        assert_eq!(reply.status, StatusCode::OK, "{legacy}");
        assert_json_include!(actual: reply.json(), expected: json!({
            "stdout": "", "exit_code": 1, "timed_out": false,
            "stderr": "Failed to execute command: embedded null byte"}));
        let reply = server.post_json("/v1/exec", &v1).await;
        assert_eq!(
            (reply.status, reply.json()),
            (
                StatusCode::BAD_REQUEST,
                json!({"code": "INVALID_ARGUMENT", "message": "the command contains a NUL byte"})
            ),
            "{v1}"
        );
    }
    for extra in [
        json!({"timeout_seconds": 0}),
        json!({"timeout_seconds": -1.5}),
        json!({"env": {"A=B": "x"}}),
        json!({"env": {"A": "x\u{0}"}}),
        json!({"cwd": "no-such-dir"}),
        json!({"cwd": "../.."}),
    ] {
        let mut legacy = json!({"command": "true"});
        let mut v1 = json!({"argv": ["true"]});
        for (key, value) in extra.as_object().unwrap() {
            legacy[key] = value.clone();
            v1[key] = value.clone();
        }
        let legacy_reply = server.post_json("/execute", &legacy).await;
        let v1_reply = server.post_json("/v1/exec", &v1).await;
        assert!(
            legacy_reply.status.is_client_error() && v1_reply.status.is_client_error(),
            "{extra}: /execute {} {}, /v1/exec {} {}",
            legacy_reply.status,
            legacy_reply.text(),
            v1_reply.status,
            v1_reply.text()
        );
        // `/execute` keeps FastAPI's 422 for a body field that does not validate.
        if extra.get("timeout_seconds").is_some() {
            assert_eq!(legacy_reply.status, StatusCode::UNPROCESSABLE_ENTITY);
            assert_eq!(
                legacy_reply.json()["detail"][0]["loc"],
                json!(["body", "timeout_seconds"])
            );
        } else {
            assert_eq!(legacy_reply.status, v1_reply.status, "{extra}");
            assert!(legacy_reply.json()["message"].is_string(), "{extra}");
        }
        assert!(v1_reply.json()["code"].is_string(), "{extra}");
    }
}
