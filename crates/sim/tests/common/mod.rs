//! Helpers shared by the sim's integration tests.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::future::Future;
use std::path::PathBuf;
use std::process::{Output, Stdio};
use std::time::Duration;

use agent_sandbox_sim::{Isolation, PodNetworks, Sim, SimConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Starts a sim with the project's CRDs registered, its pods on the host's network (the tests
/// talk to them directly).
pub(crate) async fn sim(isolation: Isolation) -> Sim {
    let sim = Sim::start(
        SimConfig::default()
            .isolation(isolation)
            .pod_networks(PodNetworks::Host),
    )
    .await
    .unwrap();
    sim.apply_crds().unwrap();
    sim
}

/// Polls `check` until it returns `Some`, for at most 30 s (a bound, not a speed assertion).
pub(crate) async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    for _ in 0..1500 {
        if let Some(value) = check().await {
            return value;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("gave up waiting for {what}");
}

/// Whether any process is in process group `pgid` (zombies count as gone).
pub(crate) fn group_alive(pgid: i32) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return false;
    };
    entries.flatten().any(|entry| {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            return false;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            return false;
        };
        let Some((_, after)) = stat.rsplit_once(')') else {
            return false;
        };
        let fields: Vec<&str> = after.split_whitespace().collect();
        fields.first() != Some(&"Z")
            && fields.get(2).and_then(|g| g.parse::<i32>().ok()) == Some(pgid)
    })
}

/// The PID in a `sim://PID` container id.
pub(crate) fn container_pid(pod: &k8s_openapi::api::core::v1::Pod) -> i32 {
    let id = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|s| s.first())
        .and_then(|s| s.container_id.clone())
        .expect("container id");
    id.trim_start_matches("sim://").parse().expect("pid")
}

/// `GET path` over plain HTTP/1.1; returns status and body.
pub(crate) async fn http_get(addr: &str, path: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.unwrap();
    let text = String::from_utf8_lossy(&response).into_owned();
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (code, body)
}

/// `GET path` from the sim's API server over HTTPS, as its administrator (`Some(token)`: with
/// that bearer token instead; `Some("")`: with none); returns status and body.
pub(crate) async fn api_get(sim: &Sim, path: &str, token: Option<&str>) -> (u16, String) {
    let token = token.unwrap_or(sim.admin_token());
    let authorization = if token.is_empty() {
        String::new()
    } else {
        format!("Authorization: Bearer {token}\r\n")
    };
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {}\r\n{authorization}Connection: close\r\n\r\n",
        sim.addr()
    );
    agent_sandbox_sim::test_support::https_exchange(sim.ca_pem(), sim.addr(), request.as_bytes())
        .await
        .unwrap()
}

/// The workspace's `sandbox-runtime`, built once per test process.
pub(crate) fn runtime_binary() -> PathBuf {
    agent_sandbox_sim::test_support::workspace_binary("agent-sandbox-runtime", "sandbox-runtime")
        .expect("sandbox-runtime builds")
}

/// Runs kubectl against one sim with its own discovery cache.
pub(crate) struct Kubectl {
    /// The sim's kubeconfig.
    pub(crate) kubeconfig: PathBuf,
    /// kubectl's discovery and HTTP cache, per sim.
    pub(crate) cache: tempfile::TempDir,
}

impl Kubectl {
    pub(crate) fn new(sim: &Sim) -> Self {
        Self {
            kubeconfig: sim.kubeconfig_path().to_path_buf(),
            cache: tempfile::tempdir().unwrap(),
        }
    }

    pub(crate) async fn run_with_input(&self, args: &[&str], input: Option<&str>) -> Output {
        let mut command = tokio::process::Command::new("kubectl");
        command
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(self.cache.path())
            .args(args)
            .stdin(if input.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn().unwrap();
        if let Some(input) = input {
            let mut stdin = child.stdin.take().unwrap();
            stdin.write_all(input.as_bytes()).await.unwrap();
        }
        tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
            .await
            .expect("kubectl finished in time")
            .unwrap()
    }

    pub(crate) async fn run(&self, args: &[&str]) -> Output {
        self.run_with_input(args, None).await
    }

    /// Runs and requires success; returns stdout.
    pub(crate) async fn ok(&self, args: &[&str]) -> String {
        self.ok_with_input(args, None).await
    }

    /// Runs with `input` on stdin and requires success; returns stdout.
    pub(crate) async fn ok_with_input(&self, args: &[&str], input: Option<&str>) -> String {
        let output = self.run_with_input(args, input).await;
        assert!(
            output.status.success(),
            "kubectl {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    }
}
