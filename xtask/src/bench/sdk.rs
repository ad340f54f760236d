//! Cases for `crates/sdk`: claim → Ready → first `run`, as the SDK observes it, per connection
//! mode, over warm claims in the simulated cluster (`agent_sandbox::harness`: the sim, the
//! controller and a router in this process, the release `sandbox-runtime` as sandbox pods and
//! the release `sandbox-router` as the router pod for port-forward mode).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use agent_sandbox::ExecOptions;
use agent_sandbox::harness::{Harness, HarnessConfig, NAMESPACE, POOL};
use agent_sandbox_api::SandboxWarmPool;
use anyhow::{Result, bail};
use kube::Api;

use super::{Case, Options, Row, Samples, format_duration};

pub(super) fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "sdk/claim-to-first-run/direct",
            about: "create_sandbox -> Ready -> first run(\"true\"), warm pool, direct router URL",
            run: direct,
        },
        Case {
            name: "sdk/claim-to-first-run/port-forward",
            about: "create_sandbox -> Ready -> first run(\"true\"), warm pool, port-forward to a router pod",
            run: port_forward,
        },
        Case {
            name: "sdk/claim-to-first-run/gateway",
            about: "create_sandbox -> Ready -> first run(\"true\"), warm pool, Gateway address",
            run: gateway,
        },
    ]
}

fn direct(root: &Path, options: Options) -> Result<Vec<Row>> {
    claim_to_first_run(root, options, "direct")
}

fn port_forward(root: &Path, options: Options) -> Result<Vec<Row>> {
    claim_to_first_run(root, options, "port-forward")
}

fn gateway(root: &Path, options: Options) -> Result<Vec<Row>> {
    claim_to_first_run(root, options, "gateway")
}

fn build(root: &Path) -> Result<(PathBuf, PathBuf)> {
    let bin = super::build_release(root, &["sandbox-runtime", "sandbox-router"])?;
    Ok((bin.join("sandbox-runtime"), bin.join("sandbox-router")))
}

async fn pool_full(harness: &Harness, replicas: i32) -> Result<()> {
    let pools: Api<SandboxWarmPool> = Api::namespaced(harness.kube_client(), NAMESPACE);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ready = pools
            .get(POOL)
            .await?
            .status
            .is_some_and(|s| s.ready_replicas >= replicas);
        if ready {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the warm pool did not refill within 60s");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn claim_to_first_run(root: &Path, options: Options, mode: &str) -> Result<Vec<Row>> {
    let (runtime, router) = build(root)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let replicas = 4;
        let harness = Harness::start(
            HarnessConfig::default()
                .pool_replicas(replicas)
                .router_pod(mode == "port-forward")
                .binaries(runtime, router),
        )
        .await?;
        if mode == "gateway" {
            harness.create_gateway().await?;
        }
        let client = harness.client(mode);
        let count = options.iterations(100);
        let mut samples = Samples::with_capacity(count);
        for _ in 0..count {
            pool_full(&harness, replicas).await?;
            let started = Instant::now();
            let sandbox = client.create_sandbox(POOL).await?;
            let result = sandbox.run_with(ExecOptions::new("true")).await?;
            samples.push(started.elapsed());
            if result.exit_code != 0 {
                bail!("run(\"true\") exited with {}", result.exit_code);
            }
            sandbox.close().await?;
        }
        harness.stop().await;
        Ok(vec![
            Row::new(format!("sdk/claim-to-first-run/{mode}"))
                .median(format_duration(samples.median()))
                .p99(format_duration(samples.p99()))
                .notes(format!(
                    "{} warm claims from a pool of {replicas}; SDK, sim, controller and in-process router in the ({}) xtask process, release runtime{} pods",
                    samples.len(),
                    if cfg!(debug_assertions) { "dev-profile" } else { "release" },
                    if mode == "port-forward" { " and router" } else { "" }
                )),
        ])
    })
}
