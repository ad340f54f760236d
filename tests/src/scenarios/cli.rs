//! The CLI issue's scenarios: `sandboxctl` as a user runs it against the cluster (the real
//! binary, the cluster's kubeconfig, a port-forward to the router).

use std::path::Path;
use std::time::Duration;

use agent_sandbox_api::SandboxClaim;
use kube::Api;
use kube::api::DeleteParams;

use super::Verdict;
use crate::cluster::ClusterUnderTest;
use crate::ensure;
use crate::error::{Error, Result};
use crate::support::{Check, Finished, binary, get, run_child, wait_for, wait_gone};

/// How long one `sandboxctl` invocation may take.
const LIMIT: Duration = Duration::from_secs(240);

async fn sandboxctl(
    cluster: &ClusterUnderTest,
    program: &Path,
    args: &[&str],
    stdin: Option<&[u8]>,
) -> Result<Finished> {
    let mut command = cluster.command(program);
    command.args(cluster.binary_args()).args(args);
    run_child(program, command, stdin, LIMIT).await
}

/// `sandboxctl run -- python3 ...` prints the program's output on stdout, exits with its code
/// and deletes its claim.
pub(super) async fn run_prints_the_output_and_leaves_no_claim(
    cluster: &ClusterUnderTest,
) -> Result<Verdict> {
    let program = binary("sandboxctl", "sandboxctl")?;
    let pool = cluster.pool.as_str();
    let run = sandboxctl(
        cluster,
        &program,
        &[
            "run",
            "--pool",
            pool,
            "--ttl",
            "10m",
            "--no-shell",
            "--",
            "python3",
            "-c",
            "print(6*7)",
        ],
        None,
    )
    .await?;
    ensure!(
        run.status.success() && run.stdout == "42\n",
        "sandboxctl run: {}",
        run.describe()
    );
    let claim = run
        .stderr
        .lines()
        .find_map(|l| l.strip_prefix("sandboxctl: claimed "))
        .and_then(|rest| rest.split_whitespace().next())
        .ok_or_else(|| {
            Error::Check(format!(
                "sandboxctl run did not name its claim:\n{}",
                run.stderr
            ))
        })?
        .to_owned();
    let claims: Api<SandboxClaim> = cluster.api();
    wait_gone(&claims, "SandboxClaim of `sandboxctl run`", &claim).await?;

    let failing = sandboxctl(
        cluster,
        &program,
        &["run", "--pool", pool, "--ttl", "10m", "--", "exit 9"],
        None,
    )
    .await?;
    ensure!(
        failing.status.code() == Some(9),
        "sandboxctl run -- 'exit 9' should exit 9: {}",
        failing.describe()
    );
    Ok(Verdict::Passed)
}

/// `claim`, then `exec` (output, exit code, stdin), `cp` in and `cat` out, `extend`, and
/// `delete`: the claim is gone at the end.
pub(super) async fn claim_exec_cp_cat_extend_delete(cluster: &ClusterUnderTest) -> Result<Verdict> {
    let program = binary("sandboxctl", "sandboxctl")?;
    let claimed = sandboxctl(
        cluster,
        &program,
        &["claim", "--pool", &cluster.pool, "--ttl", "10m"],
        None,
    )
    .await?;
    ensure!(
        claimed.status.success() && !claimed.stdout.trim().is_empty(),
        "sandboxctl claim: {}",
        claimed.describe()
    );
    let claim = claimed.stdout.trim().to_owned();
    let outcome = session(cluster, &program, &claim).await;
    let claims: Api<SandboxClaim> = cluster.api();
    if outcome.is_err() {
        let _ = claims.delete(&claim, &DeleteParams::default()).await;
    }
    outcome?;
    wait_gone(&claims, "SandboxClaim after `sandboxctl delete`", &claim).await?;
    Ok(Verdict::Passed)
}

async fn session(cluster: &ClusterUnderTest, program: &Path, claim: &str) -> Result<()> {
    let exec = sandboxctl(
        cluster,
        program,
        &["exec", claim, "--", "echo hello | tr a-z A-Z"],
        None,
    )
    .await?;
    ensure!(
        exec.status.success() && exec.stdout == "HELLO\n",
        "sandboxctl exec: {}",
        exec.describe()
    );
    let code = sandboxctl(
        cluster,
        program,
        &[
            "exec",
            claim,
            "--no-shell",
            "--",
            "python3",
            "-c",
            "raise SystemExit(7)",
        ],
        None,
    )
    .await?;
    ensure!(
        code.status.code() == Some(7),
        "sandboxctl exec should pass on exit code 7: {}",
        code.describe()
    );
    let piped = sandboxctl(
        cluster,
        program,
        &["exec", claim, "--stdin", "--no-shell", "--", "python3"],
        Some(b"print(6*7)\n"),
    )
    .await?;
    ensure!(
        piped.status.success() && piped.stdout == "42\n",
        "sandboxctl exec --stdin: {}",
        piped.describe()
    );

    let text = b"first line\nsecond line, with \xc3\xa9\n";
    let target = format!("{claim}:notes/in.txt");
    let copied = sandboxctl(cluster, program, &["cp", "-", &target], Some(text)).await?;
    ensure!(
        copied.status.success(),
        "sandboxctl cp - {target}: {}",
        copied.describe()
    );
    let cat = sandboxctl(cluster, program, &["cat", &target], None).await?;
    ensure!(
        cat.status.success() && cat.stdout.as_bytes() == text,
        "sandboxctl cat {target}: {}",
        cat.describe()
    );

    let claims: Api<SandboxClaim> = cluster.api();
    let shutdown = |claim: Option<SandboxClaim>| {
        claim
            .and_then(|c| c.spec.lifecycle)
            .and_then(|l| l.shutdown_time)
            .map(|t| t.0)
    };
    let before = shutdown(get(&claims, claim).await?);
    let extended = sandboxctl(cluster, program, &["extend", claim, "30m"], None).await?;
    let after = shutdown(get(&claims, claim).await?);
    ensure!(
        extended.status.success() && after > before,
        "sandboxctl extend moved the shutdown time from {before:?} to {after:?}: {}",
        extended.describe()
    );

    // Suspended by hand, then woken by the next command (the router holds it until Ready);
    // files on the pod's own filesystem go with the pod, so the command only echoes.
    let suspended = sandboxctl(cluster, program, &["suspend", claim], None).await?;
    ensure!(
        suspended.status.success() && suspended.stdout.contains("suspended"),
        "sandboxctl suspend: {}",
        suspended.describe()
    );
    let sandboxes: Api<agent_sandbox_api::Sandbox> = cluster.api();
    let sandbox = get(&claims, claim)
        .await?
        .and_then(|c| c.status)
        .map(|s| s.sandbox.name)
        .unwrap_or_default();
    wait_for(
        &format!("sandbox {sandbox} to lose its pod"),
        crate::support::WAIT,
        || async {
            Ok(match get(&sandboxes, &sandbox).await? {
                Some(s)
                    if s.status.as_ref().is_some_and(|st| {
                        st.conditions
                            .iter()
                            .any(|c| c.type_ == "Suspended" && c.status == "True")
                    }) =>
                {
                    Check::Done(())
                }
                other => Check::NotYet(format!("{:?}", other.map(|s| s.spec.operating_mode))),
            })
        },
    )
    .await?;
    let woken = sandboxctl(cluster, program, &["exec", claim, "--", "echo awake"], None).await?;
    ensure!(
        woken.status.success() && woken.stdout == "awake\n",
        "sandboxctl exec on the suspended sandbox: {}",
        woken.describe()
    );

    let deleted = sandboxctl(cluster, program, &["delete", claim], None).await?;
    ensure!(
        deleted.status.success(),
        "sandboxctl delete: {}",
        deleted.describe()
    );
    Ok(())
}
