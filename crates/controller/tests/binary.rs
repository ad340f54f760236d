//! The `agent-sandbox-controller` binary's behaviour on configuration errors: one line on stderr,
//! exit code 2, and no backtrace even with `RUST_BACKTRACE=1` (backtraces are for panics).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Kills the child when dropped, so that a failing assertion leaves no process behind.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs the binary with `args` and `env` (and `RUST_BACKTRACE=1`), and returns its exit code and
/// stderr. A configuration error ends it at once; one that does not end is killed.
fn run(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_agent-sandbox-controller"));
    command
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .env("RUST_LOG", "info")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (name, _) in std::env::vars() {
        if name.starts_with("SANDBOX_CONTROLLER_") {
            command.env_remove(name);
        }
    }
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = Killed(command.spawn().unwrap());
    let mut code = None;
    for _ in 0..600 {
        if let Some(status) = child.0.try_wait().unwrap() {
            code = Some(status.code());
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let Some(code) = code else {
        panic!("{args:?} did not exit within 30 s");
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.0.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    (code, stderr)
}

fn assert_one_line_error(args: &[&str], env: &[(&str, &str)], names: &str) {
    let (code, stderr) = run(args, env);
    assert_eq!(code, Some(2), "{args:?}: exit code; stderr:\n{stderr}");
    assert!(
        !stderr.to_lowercase().contains("backtrace") && !stderr.contains("panicked"),
        "{args:?}: no backtrace for a configuration error:\n{stderr}"
    );
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{args:?}: one line:\n{stderr}");
    assert!(
        lines[0].contains("error") && lines[0].contains(names),
        "{args:?}: the line names {names:?}:\n{stderr}"
    );
}

/// Regression (issue 15): with `RUST_BACKTRACE=1`, a bad flag value or an unreadable kubeconfig
/// printed anyhow's stack backtrace and exited 1.
#[test]
fn configuration_errors_are_one_line_and_exit_code_2() {
    assert_one_line_error(&["--lease-duration", "1s"], &[], "--lease-duration");
    assert_one_line_error(
        &["--sandbox-warm-pool-max-create-rate", "0"],
        &[],
        "--sandbox-warm-pool-max-create-rate",
    );
    assert_one_line_error(
        &["--metrics-bind-address", "nowhere"],
        &[],
        "--metrics-bind-address",
    );
    assert_one_line_error(
        &[
            "--leader-elect=false",
            "--metrics-bind-address",
            "0",
            "--health-probe-bind-address",
            "0",
        ],
        &[("KUBECONFIG", "/nonexistent/agent-sandbox/kubeconfig")],
        "KUBECONFIG",
    );
}

/// Malformed flags are clap's errors: exit code 2, the flag named on the first line, no
/// backtrace.
#[test]
fn malformed_flags_exit_2_without_a_backtrace() {
    for args in [
        &["--lease-duration", "soon"][..],
        &["--log-format", "xml"][..],
        &["--no-such-flag"][..],
    ] {
        let (code, stderr) = run(args, &[]);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(
            !stderr.to_lowercase().contains("backtrace"),
            "{args:?}: {stderr}"
        );
        let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{args:?}: one line, not:\n{stderr}");
        assert!(
            lines[0].starts_with("error:") && lines[0].contains(args[0]),
            "{args:?}: {stderr}"
        );
    }
}
