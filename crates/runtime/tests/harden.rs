#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! `--harden`: commands run with `no_new_privs` and, where the kernel has Landlock, may write
//! only beneath the base directory and /tmp.

mod common;

use common::TestServer;
use pretty_assertions::assert_eq;
use serde_json::json;

#[tokio::test]
async fn hardened_commands_cannot_write_outside() {
    let server = TestServer::start_with(|c| c.harden = true).await;
    // Not under /tmp, which stays writable (nor is the target directory of a checkout in /tmp).
    let target_tmp = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let base = if target_tmp.starts_with("/tmp") {
        std::path::Path::new("/var/tmp")
    } else {
        target_tmp
    };
    let outside = tempfile::tempdir_in(base).unwrap();
    let target = outside.path().join("escaped.txt");

    let reply = server
        .post_json("/execute", &json!({"command": "echo ok > inside.txt && cat inside.txt && grep NoNewPrivs /proc/self/status", "shell": true}))
        .await;
    let body = reply.json();
    assert_eq!(body["exit_code"], 0, "{body}");
    assert_eq!(body["stdout"], "ok\nNoNewPrivs:\t1\n");

    let reply = server
        .post_json(
            "/execute",
            &json!({"command": format!("echo no > {}", target.display()), "shell": true}),
        )
        .await;
    let body = reply.json();
    if agent_sandbox_runtime::harden::probe().landlock {
        assert_ne!(body["exit_code"], 0, "{body}");
        assert!(!target.exists());
    } else {
        eprintln!(
            "SKIPPED: Landlock is not available on this kernel; only no_new_privs was checked"
        );
    }

    // Without --harden the same write works (the restriction comes from the flag).
    let plain = TestServer::start().await;
    let reply = plain
        .post_json(
            "/execute",
            &json!({"command": format!("echo yes > {}", target.display()), "shell": true}),
        )
        .await;
    assert_eq!(reply.json()["exit_code"], 0);
    assert!(target.exists());
}
