//! Upstream's own clients against our system (the seed's smoke test, `tests/upstream`): its Go
//! SDK (`sigs.k8s.io/agent-sandbox/clients/go/sandbox`) in port-forward and direct-URL mode,
//! and its Python SDK (PyPI `k8s-agent-sandbox`) in tunnel and direct mode. Each prints its
//! claim-to-ready latency per mode; the lines are repeated in the suite's report.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use super::Verdict;
use crate::cluster::ClusterUnderTest;
use crate::error::{Error, Result};

/// A smoke test gets this long (the scenario limit is longer).
const LIMIT: Duration = Duration::from_secs(480);

fn is_ci() -> bool {
    std::env::var("CI").is_ok_and(|value| !matches!(value.as_str(), "" | "0" | "false"))
}

/// Runs one smoke test with the cluster's settings in its environment.
async fn smoke(
    cluster: &ClusterUnderTest,
    what: &str,
    dir: &Path,
    program: &std::result::Result<std::path::PathBuf, String>,
    args: &[&str],
) -> Result<Verdict> {
    let program = match program {
        Ok(program) => program,
        Err(reason) if is_ci() => {
            return Err(Error::Config(format!(
                "{what} could not be prepared (CI=true: not skipped): {reason}"
            )));
        }
        Err(reason) => return Ok(Verdict::Skipped(format!("{what}: {reason}"))),
    };
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .current_dir(dir)
        .env("KUBECONFIG", &cluster.kubeconfig)
        .env("SANDBOX_NAMESPACE", &cluster.namespace)
        .env("SANDBOX_WARM_POOL", &cluster.pool)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group, ended as a whole (the Python SDK starts kubectl).
        .process_group(0)
        .kill_on_drop(true);
    if let Some(url) = &cluster.router.url {
        command.env("SANDBOX_ROUTER_URL", url);
    }
    if let Some(file) = &cluster.router.signing_key_file {
        command.env("SANDBOX_ROUTER_SIGNING_KEY_FILE", file);
    }
    if let Some(token) = &cluster.router.token {
        command.env("SANDBOX_ROUTER_TOKEN", token);
    }
    let child = command
        .spawn()
        .map_err(Error::io("start", program.as_path()))?;
    let group = child.id();
    let output = match tokio::time::timeout(LIMIT, child.wait_with_output()).await {
        Ok(output) => output.map_err(Error::io("wait for", program.as_path()))?,
        Err(_) => {
            kill_group(group).await;
            return Err(Error::Check(format!(
                "{what} did not finish within {} s",
                LIMIT.as_secs()
            )));
        }
    };
    kill_group(group).await;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    for line in text.lines().filter(|l| l.contains("claim-to-ready")) {
        println!("        {what}: {}", line.trim());
    }
    if output.status.success() {
        Ok(Verdict::Passed)
    } else {
        let lines: Vec<&str> = text.lines().collect();
        Err(Error::Check(format!(
            "{what} failed ({}); its last lines:\n{}",
            output.status,
            lines[lines.len().saturating_sub(60)..].join("\n")
        )))
    }
}

/// Ends whatever is left of the smoke test's process group (kubectl port-forwards).
async fn kill_group(group: Option<u32>) {
    if let Some(pid) = group {
        let _ = tokio::process::Command::new("kill")
            .args(["-KILL", "--", &format!("-{pid}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .await;
    }
}

/// Upstream's Go SDK: `NewClient` in port-forward and direct-URL mode, `CreateSandbox` from the
/// warm pool, `Run`, `Write`/`Read`/`List`/`Exists`, the claim's shutdown time pushed forward
/// with `Update` in `retry.RetryOnConflict` while the controller reconciles it, `Disconnect`
/// and `Open` again, `Close`.
pub(super) async fn go_sdk_smoke_test(cluster: &ClusterUnderTest) -> Result<Verdict> {
    let prepared = crate::upstream::prepared();
    smoke(
        cluster,
        "upstream's Go SDK",
        &crate::upstream::source_dir().join("go"),
        &prepared.go,
        &["-test.v", "-test.count=1", "-test.timeout=8m"],
    )
    .await
}

/// Upstream's Python SDK in its default tunnel mode (`kubectl port-forward` to
/// `sandbox-router-svc`) and its direct mode: the same flow.
pub(super) async fn python_sdk_smoke_test(cluster: &ClusterUnderTest) -> Result<Verdict> {
    let prepared = crate::upstream::prepared();
    let script = crate::upstream::source_dir()
        .join("python")
        .join("smoke.py")
        .display()
        .to_string();
    smoke(
        cluster,
        "upstream's Python SDK",
        &crate::upstream::source_dir().join("python"),
        &prepared.python,
        &[script.as_str()],
    )
    .await
}
