#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The real `sandbox-runtime` binary, configured by environment as the simulated cluster starts
//! it: readiness on `GET /`, logs on stderr, graceful shutdown on SIGTERM that kills every
//! running command, and startup errors that name the flag.

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::{alive, group_members, survivors};
use pretty_assertions::assert_eq;
use serde_json::json;

const BINARY: &str = env!("CARGO_BIN_EXE_sandbox-runtime");

/// Kills the runtime if the test fails before it does.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the binary on a loopback port chosen by the OS; returns it, its address and the rest
/// of its stderr lines.
fn start(base: &std::path::Path) -> (Guard, SocketAddr, mpsc::Receiver<String>) {
    let mut child = Command::new(BINARY)
        .env("SANDBOX_LISTEN", "127.0.0.1:0")
        .env("SANDBOX_BASE_DIR", base)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let guard = Guard(child);
    let (lines_tx, lines_rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let addr = loop {
        let line = lines_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the runtime logs where it listens");
        if let Some(rest) = line.split("listening on ").nth(1) {
            break rest.split_whitespace().next().unwrap().parse().unwrap();
        }
    };
    (guard, addr, lines_rx)
}

#[tokio::test]
async fn sigterm_stops_the_server_and_kills_running_commands() {
    let base = tempfile::tempdir().unwrap();
    let (mut guard, addr, lines_rx) = start(base.path());
    let health = common::send(addr, hyper::Method::GET, "/", &[], bytes::Bytes::new()).await;
    assert_eq!(health.status, hyper::StatusCode::OK);

    // A background process with a grandchild, and a sync /execute in flight.
    let started = common::send(
        addr,
        hyper::Method::POST,
        "/v1/processes",
        &[],
        json!({"command": "sleep 1000 & sleep 1000"})
            .to_string()
            .into(),
    )
    .await;
    let background: u32 = started.json()["pid"].as_u64().unwrap().try_into().unwrap();
    let in_flight = tokio::spawn(async move {
        common::send(
            addr,
            hyper::Method::POST,
            "/execute",
            &[],
            json!({"command": "echo $$ > sync.pid; exec sleep 1000", "shell": true})
                .to_string()
                .into(),
        )
        .await
    });
    let sync_pid = common::pid_from_file(&base.path().join("sync.pid")).await;
    let mut pids = common::eventually(Duration::from_secs(5), || {
        let members = group_members(background);
        (members.len() >= 2).then_some(members)
    })
    .await
    .unwrap();
    pids.push(sync_pid);
    assert!(pids.iter().all(|pid| alive(*pid)));

    rustix::process::kill_process(
        rustix::process::Pid::from_raw(i32::try_from(guard.0.id()).unwrap()).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let status = common::eventually(Duration::from_secs(20), || guard.0.try_wait().unwrap())
        .await
        .expect("the runtime exits after SIGTERM");
    assert!(status.success(), "{status:?}");
    assert_eq!(
        survivors(&pids, Duration::from_secs(5)).await,
        Vec::<u32>::new()
    );
    // The in-flight request got an answer (killed command) or a closed connection, never a hang.
    let _ = tokio::time::timeout(Duration::from_secs(10), in_flight)
        .await
        .unwrap();
    let log: Vec<String> = lines_rx.try_iter().collect();
    assert!(log.iter().any(|l| l.contains("SIGTERM")), "{log:?}");
}

#[test]
fn invalid_configuration_names_the_flag() {
    for (variable, value, flag) in [
        (
            "SANDBOX_EXEC_TIMEOUT_SECONDS",
            "soon",
            "--exec-timeout-seconds",
        ),
        ("SANDBOX_MAX_PROCESSES", "0", "--max-processes"),
        ("SANDBOX_LISTEN", "nowhere", "--listen"),
    ] {
        let output = Command::new(BINARY)
            .env(variable, value)
            .env("SANDBOX_BASE_DIR", std::env::temp_dir())
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(!output.status.success());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(flag), "{variable}: {stderr}");
    }
}

/// Runs the binary to its exit (killed after `within` if it does not stop by itself) and returns
/// its status and stderr.
fn run_to_exit(command: &mut Command, within: Duration) -> (std::process::ExitStatus, String) {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let mut guard = Guard(child);
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
        text
    });
    let deadline = std::time::Instant::now() + within;
    let status = loop {
        if let Some(status) = guard.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the runtime did not exit within {within:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    (status, reader.join().unwrap())
}

#[test]
fn configuration_errors_are_one_line_and_exit_code_2_even_with_backtraces_on() {
    let scratch = tempfile::tempdir().unwrap();
    let file = scratch.path().join("a-file");
    std::fs::write(&file, b"not a directory").unwrap();
    // A port this test holds, so that binding it fails.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_addr = taken.local_addr().unwrap().to_string();
    let base = scratch.path().join("base");
    // (what, environment, the flag the line must name)
    let cases: [(&str, (&str, String), &str); 4] = [
        (
            "bad flag value",
            ("SANDBOX_MAX_OUTPUT_BYTES", "lots".to_owned()),
            "--max-output-bytes",
        ),
        (
            "base dir that cannot be created",
            (
                "SANDBOX_BASE_DIR",
                file.join("sub").to_string_lossy().into_owned(),
            ),
            "--base-dir",
        ),
        (
            "listen address in use",
            ("SANDBOX_LISTEN", taken_addr.clone()),
            "--listen",
        ),
        (
            "unparsable listen address",
            ("SANDBOX_LISTEN", "nowhere".to_owned()),
            "--listen",
        ),
    ];
    for (what, (name, value), flag) in cases {
        let mut command = Command::new(BINARY);
        command
            .env("RUST_BACKTRACE", "1")
            .env("RUST_LIB_BACKTRACE", "1")
            .env("RUST_LOG", "info")
            .env("SANDBOX_LISTEN", "127.0.0.1:0")
            .env("SANDBOX_BASE_DIR", &base);
        command.env(name, value);
        let (status, stderr) = run_to_exit(&mut command, Duration::from_secs(30));
        assert_eq!(status.code(), Some(2), "{what}: {status:?}\n{stderr}");
        let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{what}: one line expected:\n{stderr}");
        assert!(lines[0].contains(flag), "{what}: {stderr}");
        assert!(
            !stderr.to_lowercase().contains("backtrace"),
            "{what}: {stderr}"
        );
    }
    drop(taken);
}
