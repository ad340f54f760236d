//! `cargo xtask cluster up` on a machine without the tools (like ours: no Docker daemon, no kind,
//! cilium or flux) exits non-zero with one screen that lists each missing tool and how to
//! install it, and touches nothing.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::os::unix::fs::PermissionsExt as _;
use std::process::Command;

fn cluster_up(path: &std::path::Path) -> (bool, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["cluster", "up", "--name", "xtask-test-never-created"])
        .env("PATH", path)
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn without_any_tool_it_lists_all_five_and_fails() {
    let empty = tempfile::tempdir().unwrap();
    let (success, stderr) = cluster_up(empty.path());
    assert!(!success, "{stderr}");
    for tool in ["docker", "kind", "kubectl", "cilium", "flux"] {
        assert!(stderr.contains(&format!("  {tool} ")), "{tool}: {stderr}");
    }
    assert!(stderr.contains("install:"), "{stderr}");
    assert!(!stderr.contains("backtrace"), "{stderr}");
    assert!(
        stderr.lines().count() <= 24,
        "more than one screen:\n{stderr}"
    );
}

#[test]
fn a_docker_cli_without_a_daemon_is_reported_as_such() {
    let dir = tempfile::tempdir().unwrap();
    let stub = |name: &str, body: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    stub(
        "docker",
        "echo 'Cannot connect to the Docker daemon' >&2; exit 1",
    );
    // Any other call would mean `up` went past the check: make it fail loudly.
    for tool in ["kind", "kubectl", "cilium", "flux"] {
        stub(tool, &format!("echo '{tool} must not run' >&2; exit 97"));
    }
    let (success, stderr) = cluster_up(dir.path());
    assert!(!success, "{stderr}");
    assert!(stderr.contains("daemon does not answer"), "{stderr}");
    assert!(!stderr.contains("must not run"), "{stderr}");
    assert!(!stderr.contains("  kind "), "kind is there: {stderr}");
}
