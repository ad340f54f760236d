#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The real `sandbox-runtime` binary as the parent of last resort of its commands' processes: a
//! process that leaves its command's process group (`setsid`) is adopted by the runtime, reaped
//! when it exits, and killed when the runtime exits; as PID 1 of a PID namespace of its own (in
//! a user namespace made with util-linux's `unshare`, as the process kubelet and a container
//! runtime start it) the runtime reaps the namespace's orphans, and processes of its sandbox can
//! neither stop nor kill it.
//!
//! Every process is followed through a pidfd (no pid reuse), and killed by the test's guards
//! when the test fails; every wait is bounded.

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::eventually;
use rustix::process::{Pid, PidfdFlags, Signal};
use serde_json::{Value, json};

const BINARY: &str = env!("CARGO_BIN_EXE_sandbox-runtime");
/// Bound of every wait for something the runtime or the kernel does.
const WITHIN: Duration = Duration::from_secs(20);
/// A command that starts a process in a session of its own (out of reach of the command's
/// group kill), which writes its pid into `orphan.pid` in the base directory and sleeps; the
/// command itself exits at once, leaving it an orphan.
const ORPHAN: &str =
    "setsid sh -c 'echo $$ > orphan.pid; exec sleep 1000' </dev/null >/dev/null 2>&1 &";

/// The runtime (or `unshare` running it), killed if the test fails.
struct Runtime {
    child: Child,
    addr: SocketAddr,
    lines: mpsc::Receiver<String>,
    /// Lines read before it listened.
    start_log: Vec<String>,
}

impl Runtime {
    /// Starts `command` (the runtime, directly or through `unshare`) on a loopback port chosen
    /// by the OS with `base` as its base directory, and waits until it listens.
    fn start(mut command: Command, base: &Path) -> Self {
        let mut child = command
            .env("SANDBOX_LISTEN", "127.0.0.1:0")
            .env("SANDBOX_BASE_DIR", base)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (lines_tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if lines_tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut runtime = Self {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            lines,
            start_log: Vec::new(),
        };
        runtime.addr = loop {
            let line = runtime
                .lines
                .recv_timeout(WITHIN)
                .expect("the runtime logs where it listens");
            if let Some(rest) = line.split("listening on ").nth(1) {
                break rest.split_whitespace().next().unwrap().parse().unwrap();
            }
            runtime.start_log.push(line);
        };
        runtime
    }

    /// `POST /execute` of a shell line; its answer.
    async fn execute(&self, command: &str) -> Value {
        let reply = common::send(
            self.addr,
            hyper::Method::POST,
            "/execute",
            &[("content-type", "application/json")],
            json!({"command": command, "shell": true})
                .to_string()
                .into(),
        )
        .await;
        assert_eq!(reply.status, hyper::StatusCode::OK, "{}", reply.text());
        reply.json()
    }

    /// Sends SIGTERM to `pid` and waits for this process to exit; its status.
    async fn terminate(mut self, pid: i32) -> std::process::ExitStatus {
        rustix::process::kill_process(Pid::from_raw(pid).unwrap(), Signal::TERM).unwrap();
        eventually(WITHIN, || self.child.try_wait().unwrap())
            .await
            .expect("the runtime exits after SIGTERM")
    }

    /// Its log lines so far.
    fn log(&self) -> Vec<String> {
        let mut log = self.start_log.clone();
        log.extend(self.lines.try_iter());
        log
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A process the test follows through a pidfd; SIGKILLed when dropped.
struct Followed {
    pid: i32,
    pidfd: OwnedFd,
}

impl Followed {
    fn open(pid: i32) -> Self {
        let pidfd =
            rustix::process::pidfd_open(Pid::from_raw(pid).unwrap(), PidfdFlags::empty()).unwrap();
        Self { pid, pidfd }
    }

    fn kill(&self) {
        let _ = rustix::process::pidfd_send_signal(&self.pidfd, Signal::KILL);
    }

    /// Whether its parent has reaped it: the kernel then shows no pid for its pidfd.
    fn reaped(&self) -> bool {
        let fdinfo = format!("/proc/self/fdinfo/{}", self.pidfd.as_raw_fd());
        std::fs::read_to_string(fdinfo)
            .unwrap()
            .lines()
            .any(|line| line.split_whitespace().collect::<Vec<_>>() == ["Pid:", "-1"])
    }

    /// Whether it has ended (reaped, or a zombie).
    fn ended(&self) -> bool {
        self.reaped() || stat_field(self.pid, 0).is_none_or(|state| state == "Z")
    }

    fn parent(&self) -> Option<i32> {
        stat_field(self.pid, 1)?.parse().ok()
    }
}

impl Drop for Followed {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Field `n` after the command name of `/proc/PID/stat` (0: state, 1: parent pid).
fn stat_field(pid: i32, n: usize) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(n).map(str::to_owned)
}

/// The children of `pid`, in this test's PID namespace.
fn children(pid: i32) -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
        .flat_map(|list| {
            list.split_whitespace()
                .filter_map(|pid| pid.parse().ok())
                .collect::<Vec<i32>>()
        })
        .collect()
}

/// The pids of `pid` from this test's PID namespace down to its own (`NSpid:`).
fn namespace_pids(pid: i32) -> Vec<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status.lines().find_map(|line| {
                line.strip_prefix("NSpid:").map(|pids| {
                    pids.split_whitespace()
                        .filter_map(|pid| pid.parse().ok())
                        .collect()
                })
            })
        })
        .unwrap_or_default()
}

/// Starts an orphan through the runtime and follows it (`pid_in` maps the pid it wrote, in the
/// runtime's PID namespace, to this test's).
async fn start_orphan(
    runtime: &Runtime,
    base: &Path,
    pid_in: impl Fn(i32) -> Option<i32>,
) -> Followed {
    let pid_file = base.join("orphan.pid");
    let _ = std::fs::remove_file(&pid_file);
    let answer = runtime.execute(ORPHAN).await;
    assert_eq!(answer["exit_code"], 0, "{answer}");
    let written = i32::try_from(common::pid_from_file(&pid_file).await).unwrap();
    let pid = eventually(WITHIN, || pid_in(written))
        .await
        .unwrap_or_else(|| panic!("no process {written} below the runtime"));
    Followed::open(pid)
}

/// Waits until `condition` holds (bounded).
async fn until(what: &str, mut condition: impl FnMut() -> bool) {
    assert!(
        eventually(WITHIN, || condition().then_some(()))
            .await
            .is_some(),
        "{what}"
    );
}

#[tokio::test]
async fn an_orphan_that_left_its_group_is_adopted_and_reaped() {
    let base = tempfile::tempdir().unwrap();
    let runtime = Runtime::start(Command::new(BINARY), base.path());
    let runtime_pid = i32::try_from(runtime.child.id()).unwrap();

    let orphan = start_orphan(&runtime, base.path(), Some).await;
    // Once its command (its parent) has exited, it is re-parented to the runtime, not to init.
    let adopted = eventually(WITHIN, || {
        orphan.parent().filter(|parent| *parent == runtime_pid)
    })
    .await;
    assert_eq!(
        adopted,
        Some(runtime_pid),
        "the orphan's parent is {:?}, not the runtime",
        orphan.parent()
    );
    // When it dies, the runtime reaps it: no zombie is left.
    orphan.kill();
    until("the runtime reaps its orphan", || orphan.reaped()).await;
    // Commands get their own exit status, also when orphans they leave exit at the same time.
    for code in [3, 0, 42] {
        let answer = runtime
            .execute(&format!(
                "setsid true </dev/null >/dev/null 2>&1 & exit {code}"
            ))
            .await;
        assert_eq!(answer["exit_code"], code, "{answer}");
    }
    let log = runtime.log();
    assert!(
        log.iter().any(|line| line.contains("child subreaper")),
        "{log:?}"
    );
    let status = runtime.terminate(runtime_pid).await;
    assert!(status.success(), "{status:?}");
}

#[tokio::test]
async fn an_orphan_that_left_its_group_dies_with_the_runtime() {
    let base = tempfile::tempdir().unwrap();
    let runtime = Runtime::start(Command::new(BINARY), base.path());
    let runtime_pid = i32::try_from(runtime.child.id()).unwrap();
    // An orphan with a child of its own (in the orphan's session, not the command's).
    let answer = runtime
        .execute(
            "setsid sh -c 'sleep 1000 & echo $! > child.pid; echo $$ > orphan.pid; wait' \
             </dev/null >/dev/null 2>&1 &",
        )
        .await;
    assert_eq!(answer["exit_code"], 0, "{answer}");
    let orphan = Followed::open(
        i32::try_from(common::pid_from_file(&base.path().join("orphan.pid")).await).unwrap(),
    );
    let grandchild = Followed::open(
        i32::try_from(common::pid_from_file(&base.path().join("child.pid")).await).unwrap(),
    );
    assert!(!orphan.ended() && !grandchild.ended());

    let status = runtime.terminate(runtime_pid).await;
    assert!(status.success(), "{status:?}");
    until("the orphan dies with the runtime", || orphan.ended()).await;
    until("the orphan's child dies with the runtime", || {
        grandchild.ended()
    })
    .await;
}

/// Whether util-linux's `unshare` can make a user and a PID namespace here; if not, the test
/// is skipped with the reason (and fails under `CI=true`).
fn namespaces_available(test: &str) -> bool {
    let probe = Command::new("unshare")
        .args([
            "--user",
            "--map-root-user",
            "--pid",
            "--fork",
            "--mount-proc",
        ])
        .arg("true")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output();
    let reason = match probe {
        Ok(output) if output.status.success() => return true,
        Ok(output) => String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        Err(error) => format!("cannot run unshare (util-linux): {error}"),
    };
    let ci = std::env::var("CI").is_ok_and(|value| !matches!(value.as_str(), "" | "0" | "false"));
    assert!(
        !ci,
        "{test}: no user and PID namespace for the test: {reason}"
    );
    eprintln!("SKIPPED {test}: no user and PID namespace for the test: {reason}");
    false
}

#[tokio::test]
async fn as_pid_1_it_reaps_orphans_and_cannot_be_stopped_or_killed_from_inside() {
    if !namespaces_available(
        "as_pid_1_it_reaps_orphans_and_cannot_be_stopped_or_killed_from_inside",
    ) {
        return;
    }
    let base = tempfile::tempdir().unwrap();
    let mut command = Command::new("unshare");
    // --kill-child: if the test kills `unshare`, the runtime gets SIGKILL, and with it every
    // process of the namespace.
    command
        .args([
            "--user",
            "--map-root-user",
            "--pid",
            "--fork",
            "--kill-child",
            "--mount-proc",
        ])
        .arg(BINARY);
    let runtime = Runtime::start(command, base.path());
    let unshare = i32::try_from(runtime.child.id()).unwrap();
    let runtime_pid = match children(unshare).as_slice() {
        [pid] => *pid,
        other => panic!("unshare has children {other:?}, not one runtime"),
    };
    assert_eq!(namespace_pids(runtime_pid).last(), Some(&1), "PID 1 inside");

    let in_namespace = |pid: i32| {
        children(runtime_pid)
            .into_iter()
            .find(|child| namespace_pids(*child).last() == Some(&pid))
    };
    let orphan = start_orphan(&runtime, base.path(), in_namespace).await;
    assert_eq!(orphan.parent(), Some(runtime_pid));
    orphan.kill();
    until("PID 1 reaps the orphan", || orphan.reaped()).await;
    let log = runtime.log();
    assert!(
        log.iter()
            .any(|line| line.contains("PID 1 of its PID namespace")),
        "{log:?}"
    );

    // Its own sandbox cannot stop or kill it: the kernel drops signals without a handler sent
    // to a namespace's init by its members, and it handles no stop signal.
    let answer = runtime
        .execute("for s in STOP TSTP TTIN TTOU KILL; do kill -s $s 1; done; echo sent")
        .await;
    assert_eq!(answer["stdout"], "sent\n", "{answer}");
    assert_ne!(stat_field(runtime_pid, 0).as_deref(), Some("T"));
    let answer = runtime.execute("echo alive").await;
    assert_eq!(answer["stdout"], "alive\n", "{answer}");

    // When it ends, so does every process of its namespace.
    let left = start_orphan(&runtime, base.path(), in_namespace).await;
    rustix::process::kill_process(Pid::from_raw(runtime_pid).unwrap(), Signal::TERM).unwrap();
    until("the last orphan dies with PID 1", || left.ended()).await;
    let mut runtime = runtime;
    let status = eventually(WITHIN, || runtime.child.try_wait().unwrap())
        .await
        .expect("unshare exits with the runtime");
    assert!(status.success(), "{status:?}");
}
