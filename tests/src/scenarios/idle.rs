//! The idle-lifecycle issue's scenarios: an idle sandbox suspends and the next request through
//! the router wakes it with the right answer; a command still running keeps its sandbox
//! active; a claim whose client was SIGKILLed is gone after its pool's default idle TTL.

use std::time::Duration;

use agent_sandbox::{CreateOptions, ExecOptions, Sandbox};
use agent_sandbox_api::claim::ClaimDefaults;
use agent_sandbox_api::conditions::sandbox as cond;
use agent_sandbox_api::sandbox::{ActiveExpirationPolicy, IdleLifecycle, OperatingMode};
use agent_sandbox_api::{SandboxClaim, SandboxWarmPool};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, ListParams};

use super::Verdict;
use crate::cluster::{ClusterUnderTest, SdkMode};
use crate::ensure;
use crate::error::{Error, Result};
use crate::support::{
    Check, RUN_LABEL, WAIT, binary, get, pool, wait_for, wait_gone, wait_pool_ready,
};

/// A bound for waits on the idle lifecycle (its TTL plus reconciles), not a speed assertion.
const IDLE_WAIT: Duration = Duration::from_secs(90);

async fn claim(
    cluster: &ClusterUnderTest,
    client: &agent_sandbox::Client,
    idle: Duration,
) -> Result<Sandbox> {
    client
        .create_sandbox_with(
            &cluster.pool,
            CreateOptions::default()
                .label(RUN_LABEL, cluster.run.clone())
                .shutdown_after(Duration::from_secs(600))
                .suspend_when_idle(idle),
        )
        .await
        .map_err(Error::sdk(format!(
            "claim a sandbox from pool {}",
            cluster.pool
        )))
}

fn suspended(sandbox: &agent_sandbox_api::Sandbox) -> bool {
    sandbox.spec.operating_mode == OperatingMode::Suspended
        && sandbox.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == cond::SUSPENDED && c.status == "True")
        })
}

async fn run(sandbox: &Sandbox, line: &str) -> Result<String> {
    let answer = sandbox
        .run_with(ExecOptions::shell(line).timeout(Duration::from_secs(150)))
        .await
        .map_err(Error::sdk(format!("run {line:?}")))?;
    ensure!(
        answer.exit_code == 0,
        "{line:?} exited {} (stderr {:?})",
        answer.exit_code,
        answer.stderr
    );
    Ok(answer.stdout)
}

/// A sandbox idle for its `activeTTLSeconds` is suspended (its pod goes); the next `run`
/// through the router wakes it and answers right.
pub(super) async fn an_idle_sandbox_suspends_and_the_next_run_wakes_it(
    cluster: &ClusterUnderTest,
) -> Result<Verdict> {
    let client = match cluster.sdk(SdkMode::Direct) {
        Ok(client) => client,
        Err(reason) => return Ok(Verdict::Skipped(reason)),
    };
    let sandbox = claim(cluster, &client, Duration::from_secs(3)).await?;
    let outcome = async {
        ensure!(
            run(&sandbox, "echo first").await? == "first\n",
            "the first run's output is wrong"
        );
        let sandboxes: Api<agent_sandbox_api::Sandbox> = cluster.api();
        let name = sandbox.sandbox_name().to_owned();
        wait_for(
            &format!("sandbox {name} to suspend after 3 s idle"),
            IDLE_WAIT,
            || async {
                Ok(match get(&sandboxes, &name).await? {
                    Some(s) if suspended(&s) => Check::Done(()),
                    Some(s) => Check::NotYet(format!(
                        "operatingMode {:?}, lastActivityTime {:?}",
                        s.spec.operating_mode,
                        s.status.and_then(|s| s.last_activity_time)
                    )),
                    None => Check::NotYet("gone".to_owned()),
                })
            },
        )
        .await?;
        // The next request wakes it: held by the router until the pod is back.
        let again = run(&sandbox, "echo $((6*7))").await?;
        ensure!(again == "42\n", "the run that woke it printed {again:?}");
        let woken = get(&sandboxes, &name).await?;
        ensure!(
            woken
                .as_ref()
                .is_some_and(|s| s.spec.operating_mode == OperatingMode::Running),
            "after the request {name} is {:?}",
            woken.map(|s| s.spec.operating_mode)
        );
        // Suspended again at once (seconds after the wake-up): the next request wakes it again.
        sandbox.suspend().await.map_err(Error::sdk("suspend"))?;
        wait_for(
            &format!("sandbox {name} to be suspended again"),
            IDLE_WAIT,
            || async {
                Ok(match get(&sandboxes, &name).await? {
                    Some(s) if suspended(&s) => Check::Done(()),
                    other => Check::NotYet(format!(
                        "operatingMode {:?}",
                        other.map(|s| s.spec.operating_mode)
                    )),
                })
            },
        )
        .await?;
        let third = run(&sandbox, "echo third").await?;
        ensure!(
            third == "third\n",
            "the run that woke it again printed {third:?}"
        );
        Ok(())
    }
    .await;
    let closed = sandbox.close().await.map_err(Error::sdk("close the claim"));
    outcome?;
    closed?;
    Ok(Verdict::Passed)
}

/// A command running for 90 s in a sandbox with a 30 s idle TTL: the sandbox stays running (the
/// same pod answers), because a request still running is activity.
pub(super) async fn a_running_command_keeps_its_sandbox_from_idling(
    cluster: &ClusterUnderTest,
) -> Result<Verdict> {
    let client = match cluster.sdk(SdkMode::Direct) {
        Ok(client) => client,
        Err(reason) => return Ok(Verdict::Skipped(reason)),
    };
    let sandbox = claim(cluster, &client, Duration::from_secs(30)).await?;
    let outcome = async {
        let pods: Api<Pod> = cluster.api();
        let sandboxes: Api<agent_sandbox_api::Sandbox> = cluster.api();
        let name = sandbox.sandbox_name().to_owned();
        let pod_uid = |s: Option<agent_sandbox_api::Sandbox>| async {
            let pod = s.map(|s| crate::support::pod_name(&s)).unwrap_or_default();
            get(&pods, &pod)
                .await
                .map(|p| p.and_then(|p| p.metadata.uid))
        };
        let before = pod_uid(get(&sandboxes, &name).await?).await?;
        let out = run(&sandbox, "sleep 90; echo done").await?;
        ensure!(out == "done\n", "the 90 s command printed {out:?}");
        let now = get(&sandboxes, &name).await?;
        ensure!(
            now.as_ref()
                .is_some_and(|s| !suspended(s) && s.spec.operating_mode == OperatingMode::Running),
            "{name} was suspended while its command ran"
        );
        let after = pod_uid(now).await?;
        ensure!(
            before.is_some() && before == after,
            "{name}'s pod changed while its command ran ({before:?}, then {after:?})"
        );
        Ok(())
    }
    .await;
    let closed = sandbox.close().await.map_err(Error::sdk("close the claim"));
    outcome?;
    closed?;
    Ok(Verdict::Passed)
}

/// A pool whose `claimDefaults` delete claims idle for 5 s: `sandboxctl run -- sleep 600` is
/// SIGKILLed mid-command, and its claim and sandbox are gone soon after (nothing cleaned up).
pub(super) async fn a_killed_clients_claim_is_gone_after_its_pools_default_idle_ttl(
    cluster: &ClusterUnderTest,
) -> Result<Verdict> {
    let program = binary("sandboxctl", "sandboxctl")?;
    let pools: Api<SandboxWarmPool> = cluster.api();
    let claims: Api<SandboxClaim> = cluster.api();
    let name = cluster.name("idle-pool");
    let mut leaky = pool(&name, &cluster.scenario_template, 1, &cluster.run);
    leaky.spec.claim_defaults = Some(ClaimDefaults {
        idle_lifecycle: Some(IdleLifecycle {
            active_ttl_seconds: Some(5),
            active_expiration_policy: Some(ActiveExpirationPolicy::Delete),
            ..IdleLifecycle::default()
        }),
        ..ClaimDefaults::default()
    });
    crate::support::create(&pools, &leaky).await?;
    let outcome = async {
        wait_pool_ready(&pools, &name, 1).await?;
        let mut command = cluster.command(&program);
        command
            .args(cluster.binary_args())
            .args(["run", "--pool", &name, "--", "sleep 600"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true);
        let mut child = command
            .spawn()
            .map_err(Error::io("start", program.clone()))?;
        let of_pool = |claim: &SandboxClaim| claim.spec.warm_pool_ref.name == name;
        let claim = wait_for(
            &format!("`sandboxctl run` to hold a Ready claim from {name}"),
            WAIT,
            || async {
                let listed = claims
                    .list(&ListParams::default())
                    .await
                    .map_err(Error::kube("list SandboxClaims"))?;
                Ok(
                    match listed.items.into_iter().find(|c| {
                        of_pool(c)
                            && c.status.as_ref().is_some_and(|s| {
                                s.conditions
                                    .iter()
                                    .any(|c| c.type_ == "Ready" && c.status == "True")
                            })
                    }) {
                        Some(claim) => Check::Done(claim),
                        None => Check::NotYet("no Ready claim yet".to_owned()),
                    },
                )
            },
        )
        .await?;
        let claim_name = claim.metadata.name.clone().unwrap_or_default();
        let sandbox_name = claim
            .status
            .as_ref()
            .map(|s| s.sandbox.name.clone())
            .unwrap_or_default();
        // The command runs (activity): then the client dies without cleaning up.
        tokio::time::sleep(Duration::from_secs(2)).await;
        child
            .start_kill()
            .map_err(Error::io("kill", program.clone()))?;
        let _ = child.wait().await;
        ensure!(
            get(&claims, &claim_name).await?.is_some(),
            "claim {claim_name} went with its client: nothing left to test"
        );
        wait_for(
            &format!("claim {claim_name} of the killed client to be deleted"),
            IDLE_WAIT,
            || async {
                Ok(match get(&claims, &claim_name).await? {
                    None => Check::Done(()),
                    Some(_) => Check::NotYet("still there".to_owned()),
                })
            },
        )
        .await?;
        let sandboxes: Api<agent_sandbox_api::Sandbox> = cluster.api();
        wait_gone(&sandboxes, "Sandbox of the killed client", &sandbox_name).await
    }
    .await;
    // Whatever is left: the claims of this pool, then the pool.
    if let Ok(listed) = claims.list(&ListParams::default()).await {
        for claim in listed
            .items
            .iter()
            .filter(|c| c.spec.warm_pool_ref.name == name)
        {
            if let Some(claim) = &claim.metadata.name {
                let _ = claims.delete(claim, &DeleteParams::default()).await;
            }
        }
    }
    let _ = pools.delete(&name, &DeleteParams::default()).await;
    outcome?;
    Ok(Verdict::Passed)
}
