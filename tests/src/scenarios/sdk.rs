//! The SDK issue's smoke test in each connection mode, and scoped tokens through the router.

use std::time::Duration;

use agent_sandbox::{CreateOptions, ExecOptions, Sandbox};
use agent_sandbox_api::SandboxClaim;
use kube::Api;

use super::Verdict;
use crate::cluster::{ClusterUnderTest, SdkMode};
use crate::ensure;
use crate::error::{Error, Result};
use crate::support::{RUN_LABEL, get, wait_gone};

/// A claim through `client`, labelled with the run, expiring on its own after ten minutes.
async fn claim(cluster: &ClusterUnderTest, client: &agent_sandbox::Client) -> Result<Sandbox> {
    client
        .create_sandbox_with(
            &cluster.pool,
            CreateOptions::default()
                .label(RUN_LABEL, cluster.run.clone())
                .shutdown_after(Duration::from_secs(600)),
        )
        .await
        .map_err(Error::sdk(format!(
            "claim a sandbox from pool {}",
            cluster.pool
        )))
}

/// Claim, run (output and exit codes), write and read back binary data, list, extend the TTL,
/// close: the claim is gone afterwards.
async fn round_trip(cluster: &ClusterUnderTest, mode: SdkMode) -> Result<Verdict> {
    let client = match cluster.sdk(mode) {
        Ok(client) => client,
        Err(reason) => return Ok(Verdict::Skipped(reason)),
    };
    let sandbox = claim(cluster, &client).await?;
    let claim_name = sandbox.claim_name().to_owned();
    let outcome = exercise(cluster, &sandbox).await;
    let closed = sandbox
        .close()
        .await
        .map_err(Error::sdk(format!("close claim {claim_name}")));
    outcome?;
    closed?;
    let claims: Api<SandboxClaim> = cluster.api();
    wait_gone(&claims, "SandboxClaim (closed)", &claim_name).await?;
    Ok(Verdict::Passed)
}

async fn exercise(cluster: &ClusterUnderTest, sandbox: &Sandbox) -> Result<()> {
    let answer = sandbox
        .run("python3 -c 'print(6*7)'")
        .await
        .map_err(Error::sdk("run python3"))?;
    ensure!(
        answer.exit_code == 0 && answer.stdout == "42\n",
        "python3 printed {:?} (stderr {:?}, exit {})",
        answer.stdout,
        answer.stderr,
        answer.exit_code
    );
    let failed = sandbox
        .run_with(ExecOptions::shell("echo oops >&2; exit 3"))
        .await
        .map_err(Error::sdk("run a failing command"))?;
    ensure!(
        failed.exit_code == 3 && failed.stderr == "oops\n",
        "a failing command reported exit {} and stderr {:?}",
        failed.exit_code,
        failed.stderr
    );

    // Every byte value, a little over a MiB: nothing re-encoded, nothing cut.
    let data: Vec<u8> = (0..(1_usize << 20) + 4099)
        .map(|i| u8::try_from(i % 251).unwrap_or(0))
        .collect();
    sandbox
        .write("e2e/data.bin", data.clone())
        .await
        .map_err(Error::sdk("write e2e/data.bin"))?;
    let back = sandbox
        .read("e2e/data.bin")
        .await
        .map_err(Error::sdk("read e2e/data.bin"))?;
    ensure!(
        back.as_ref() == data.as_slice(),
        "e2e/data.bin came back as {} bytes, not the {} written",
        back.len(),
        data.len()
    );
    let entries = sandbox.list("e2e").await.map_err(Error::sdk("list e2e"))?;
    ensure!(
        entries.iter().any(|e| e.name == "data.bin"),
        "listing e2e shows {:?}",
        entries.iter().map(|e| e.name.clone()).collect::<Vec<_>>()
    );
    let checksum = sandbox
        .run("python3 -c \"import os;print(os.path.getsize('e2e/data.bin'))\"")
        .await
        .map_err(Error::sdk("measure e2e/data.bin in the sandbox"))?;
    ensure!(
        checksum.stdout.trim() == data.len().to_string(),
        "the sandbox sees {} bytes in e2e/data.bin",
        checksum.stdout.trim()
    );

    // Extending moves the claim's shutdown time (what the agent does on every tool call).
    let claims: Api<SandboxClaim> = cluster.api();
    let shutdown = |claim: Option<SandboxClaim>| {
        claim
            .and_then(|c| c.spec.lifecycle)
            .and_then(|l| l.shutdown_time)
            .map(|t| t.0)
    };
    let before = shutdown(get(&claims, sandbox.claim_name()).await?);
    let moved = sandbox
        .extend_ttl(Duration::from_secs(1200))
        .await
        .map_err(Error::sdk("extend the claim's TTL"))?;
    let after = shutdown(get(&claims, sandbox.claim_name()).await?);
    ensure!(
        after.is_some()
            && after > before
            && after.map(|t| t.as_second()) == Some(moved.as_second()),
        "extending moved the shutdown time from {before:?} to {after:?} (SDK said {moved})"
    );
    Ok(())
}

/// The smoke test through a port-forward to a router pod.
pub(super) async fn round_trip_through_port_forward(cluster: &ClusterUnderTest) -> Result<Verdict> {
    round_trip(cluster, SdkMode::PortForward).await
}

/// The smoke test through a router URL.
pub(super) async fn round_trip_through_a_direct_url(cluster: &ClusterUnderTest) -> Result<Verdict> {
    round_trip(cluster, SdkMode::Direct).await
}

/// The smoke test through a Gateway's address.
pub(super) async fn round_trip_through_a_gateway(cluster: &ClusterUnderTest) -> Result<Verdict> {
    round_trip(cluster, SdkMode::Gateway).await
}

/// With a scoped router, a token minted for one sandbox opens that sandbox and is refused
/// (403) for another.
pub(super) async fn a_token_for_another_sandbox_is_refused(
    cluster: &ClusterUnderTest,
) -> Result<Verdict> {
    let Some(key) = cluster.router.signing_key.clone() else {
        return Ok(Verdict::Skipped(
            "the router does not use scoped tokens (no signing-key Secret)".to_owned(),
        ));
    };
    let client = match cluster.sdk(SdkMode::PortForward) {
        Ok(client) => client,
        Err(reason) => return Ok(Verdict::Skipped(reason)),
    };
    let mine = claim(cluster, &client).await?;
    let other = match claim(cluster, &client).await {
        Ok(other) => other,
        Err(error) => {
            let _ = mine.close().await;
            return Err(error);
        }
    };
    let outcome = async {
        let token = mine
            .mint_token(&key, Duration::from_secs(300))
            .map_err(Error::sdk("mint a scoped token"))?;
        let mut options = cluster
            .sdk_options(SdkMode::PortForward)
            .map_err(Error::Config)?
            .router_token(token);
        options.router_signing_key = None;
        let scoped = agent_sandbox::Client::from_kube(cluster.kube.clone(), options);
        let own = scoped
            .get_sandbox(mine.claim_name())
            .await
            .map_err(Error::sdk("open my own sandbox with its token"))?
            .run("echo mine")
            .await
            .map_err(Error::sdk("run in my own sandbox with its token"))?;
        ensure!(
            own.stdout == "mine\n",
            "my own sandbox answered {:?}",
            own.stdout
        );
        let foreign = match scoped.get_sandbox(other.claim_name()).await {
            Ok(sandbox) => sandbox.run("echo stolen").await.err(),
            Err(error) => Some(error),
        };
        ensure!(
            foreign.as_ref().and_then(agent_sandbox::Error::status) == Some(403),
            "a token for {} used on {}: expected 403, got {foreign:?}",
            mine.sandbox_name(),
            other.sandbox_name()
        );
        Ok(())
    }
    .await;
    let _ = mine.close().await;
    let _ = other.close().await;
    outcome.map(|()| Verdict::Passed)
}
