//! `cargo xtask tools` on a machine without Go exits non-zero with one line naming what is
//! missing and how to get it, and builds nothing.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;

#[test]
fn without_go_it_fails_with_one_line_naming_go() {
    let empty = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .arg("tools")
        .env("PATH", empty.path())
        .env("AGENT_SANDBOX_TOOLS_DIR", cache.path())
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "not one line:\n{stderr}");
    assert!(stderr.contains("Go toolchain is missing"), "{stderr}");
    assert!(
        stderr.contains("install Go") || stderr.contains("Install Go"),
        "{stderr}"
    );
    assert!(!stderr.contains("backtrace"), "{stderr}");
    assert_eq!(std::fs::read_dir(cache.path()).unwrap().count(), 0);
}
