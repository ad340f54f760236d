//! Cases for `crates/sdk`: claim → Ready → first `run`, as the SDK observes it, per connection
//! mode, over warm claims in the simulated cluster (`agent_sandbox_local`: the sim, the
//! controller and a router in this process, the release `sandbox-runtime` as sandbox pods and
//! the release `sandbox-router` as the router pod for port-forward mode).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use agent_sandbox::ExecOptions;
use agent_sandbox_local::{
    ConnectionKind, DEFAULT_POOL, LocalCluster, LocalConfig, RouterAuth, RuntimeProgram,
};
use anyhow::{Result, bail};

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
    claim_to_first_run(root, options, ConnectionKind::Direct)
}

fn port_forward(root: &Path, options: Options) -> Result<Vec<Row>> {
    claim_to_first_run(root, options, ConnectionKind::PortForward)
}

fn gateway(root: &Path, options: Options) -> Result<Vec<Row>> {
    claim_to_first_run(root, options, ConnectionKind::Gateway)
}

/// The case's name for `kind`.
fn mode_name(kind: ConnectionKind) -> &'static str {
    match kind {
        ConnectionKind::Direct => "direct",
        ConnectionKind::PortForward => "port-forward",
        ConnectionKind::Gateway => "gateway",
    }
}

fn build(root: &Path) -> Result<(PathBuf, PathBuf)> {
    let bin = super::build_release(root, &["sandbox-runtime", "sandbox-router"])?;
    Ok((bin.join("sandbox-runtime"), bin.join("sandbox-router")))
}

fn claim_to_first_run(root: &Path, options: Options, kind: ConnectionKind) -> Result<Vec<Row>> {
    let (runtime, router) = build(root)?;
    let mode = mode_name(kind);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let replicas = 4;
        let config = LocalConfig {
            runtime: RuntimeProgram::Binary(runtime),
            router_auth: RouterAuth::None,
            pool_replicas: replicas,
            gateway: kind == ConnectionKind::Gateway,
            router_pod: (kind == ConnectionKind::PortForward).then_some(router),
            ..LocalConfig::default()
        };
        let cluster = LocalCluster::start(config).await?;
        let client = cluster.sdk_client(kind)?;
        let count = options.iterations(100);
        let mut samples = Samples::with_capacity(count);
        for _ in 0..count {
            cluster
                .wait_for_pool(replicas, Duration::from_secs(60), |_, _| {})
                .await?;
            let started = Instant::now();
            let sandbox = client.create_sandbox(DEFAULT_POOL).await?;
            let result = sandbox.run_with(ExecOptions::new("true")).await?;
            samples.push(started.elapsed());
            if result.exit_code != 0 {
                bail!("run(\"true\") exited with {}", result.exit_code);
            }
            sandbox.close().await?;
        }
        cluster.stop().await;
        Ok(vec![
            Row::new(format!("sdk/claim-to-first-run/{mode}"))
                .median(format_duration(samples.median()))
                .p99(format_duration(samples.p99()))
                .notes(format!(
                    "{} warm claims from a pool of {replicas}; SDK, sim, controller and in-process router in the ({}) bench process, release runtime{} pods",
                    samples.len(),
                    if cfg!(debug_assertions) { "dev-profile" } else { "release" },
                    if kind == ConnectionKind::PortForward { " and router" } else { "" }
                )),
        ])
    })
}
