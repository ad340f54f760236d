//! Cases for `crates/sdk`: claim → Ready → first `run`, as the SDK observes it, per connection
//! mode, over warm claims in the simulated cluster (`agent_sandbox_local`: the sim, the
//! controller and a router in this process, the release `sandbox-runtime` as sandbox pods and
//! the release `sandbox-router` as the router pod for port-forward mode). On the same cluster
//! (direct mode), the idle lifecycle's costs ([`super::idle`]): a request to a suspended sandbox
//! until its answer, with cold and warm claims beside it, and the API writes per minute of a
//! sandbox receiving 100 requests a second.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use agent_sandbox::ExecOptions;
use agent_sandbox_api::warm_pool::SandboxTemplateRef;
use agent_sandbox_api::{SandboxWarmPool, SandboxWarmPoolSpec};
use agent_sandbox_local::{
    ConnectionKind, DEFAULT_NAMESPACE, DEFAULT_POOL, DEFAULT_TEMPLATE, LocalCluster, LocalConfig,
    RouterAuth, RuntimeProgram,
};
use anyhow::{Context, Result, bail};
use kube::Api;
use kube::api::PostParams;

use super::idle::{self, Tier};
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
        Case {
            name: "sdk/resume-on-traffic",
            about: "run(\"true\") to a Suspended sandbox (pod gone) -> its answer, beside cold and warm claim -> first run, sim with the in-process router",
            run: resume_on_traffic,
        },
        Case {
            name: "sdk/writes-per-minute-100rps",
            about: "API writes per minute of a sandbox receiving 100 run(\"true\") a second through the in-process router",
            run: writes_per_minute,
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

/// The profile of this (bench) process, where the sim, the controller and the router run.
fn profile() -> &'static str {
    if cfg!(debug_assertions) {
        "dev-profile"
    } else {
        "release"
    }
}

/// The simulated cluster of the idle cases: the sim, the controller and the in-process router
/// (with its kube client, so it records activity and wakes suspended sandboxes; no auth), the
/// release runtime as pods, the default template and a pool of `replicas`.
async fn idle_cluster(root: &Path, replicas: i32) -> Result<LocalCluster> {
    let runtime = super::build_release(root, &["sandbox-runtime"])?.join("sandbox-runtime");
    let config = LocalConfig {
        runtime: RuntimeProgram::Binary(runtime),
        router_auth: RouterAuth::None,
        pool_replicas: replicas,
        ..LocalConfig::default()
    };
    Ok(LocalCluster::start(config).await?)
}

/// The pool of 0 on the default template, from which every claim is served cold.
const COLD_POOL: &str = "bench-cold";

async fn create_cold_pool(cluster: &LocalCluster) -> Result<()> {
    let pool = SandboxWarmPool::new(
        COLD_POOL,
        SandboxWarmPoolSpec {
            replicas: 0,
            sandbox_template_ref: SandboxTemplateRef {
                name: DEFAULT_TEMPLATE.into(),
            },
            update_strategy: None,
            claim_defaults: None,
        },
    );
    Api::<SandboxWarmPool>::namespaced(cluster.client(), DEFAULT_NAMESPACE)
        .create(&PostParams::default(), &pool)
        .await
        .context("failed to create the pool of 0")?;
    Ok(())
}

fn resume_on_traffic(root: &Path, options: Options) -> Result<Vec<Row>> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let replicas = 5;
        let cluster = idle_cluster(root, replicas).await?;
        let outcome = async {
            create_cold_pool(&cluster).await?;
            let sdk = cluster.sdk_client(ConnectionKind::Direct)?;
            let kube = cluster.client();
            let tier = Tier {
                sdk: &sdk,
                kube: &kube,
                namespace: DEFAULT_NAMESPACE,
                warm_pool: DEFAULT_POOL,
                warm_replicas: replicas,
                cold_pool: COLD_POOL,
            };
            idle::resume_on_traffic(&tier, options).await
        }
        .await;
        cluster.stop().await;
        let measured = outcome?;
        let setup = format!(
            "SDK (direct), sim, controller and in-process router in the ({}) bench process, release runtime pods",
            profile()
        );
        Ok(vec![
            Row::new("sdk/resume-on-traffic")
                .median(format_duration(measured.resume.median()))
                .p99(format_duration(measured.resume.p99()))
                .notes(format!(
                    "{} x run(\"true\") to a Suspended sandbox (suspend(), pod gone) -> its answer: the router records activity, the controller resumes it, the pod comes back, the request is forwarded; {} sandboxes in turn; same run: cold claim {} and warm claim {} (medians, claim -> first run, rows sdk/resume-on-traffic/cold-claim and /warm-claim; also sdk/claim-to-first-run/direct and controller/warm-claim); {setup}",
                    measured.resume.len(),
                    measured.sandboxes,
                    format_duration(measured.cold.median()),
                    format_duration(measured.warm.median()),
                )),
            Row::new("sdk/resume-on-traffic/cold-claim")
                .median(format_duration(measured.cold.median()))
                .p99(format_duration(measured.cold.p99()))
                .notes(format!(
                    "baseline of sdk/resume-on-traffic, same run: {} x create_sandbox from a pool of 0 (created cold) -> Ready -> first run(\"true\") answered; {setup}",
                    measured.cold.len()
                )),
            Row::new("sdk/resume-on-traffic/warm-claim")
                .median(format_duration(measured.warm.median()))
                .p99(format_duration(measured.warm.p99()))
                .notes(format!(
                    "baseline of sdk/resume-on-traffic, same run: {} x create_sandbox from a full pool of {replicas} -> Ready -> first run(\"true\") answered; {setup}",
                    measured.warm.len()
                )),
        ])
    })
}

/// The sim's cumulative writes to Sandboxes, by `verb resource`.
fn sim_sandbox_writes(cluster: &LocalCluster) -> BTreeMap<String, u64> {
    let mut writes = BTreeMap::new();
    for (key, count) in &cluster.request_counts().0 {
        if key.group == agent_sandbox_api::GROUP
            && key.resource.split('/').next() == Some("sandboxes")
            && [
                "create",
                "update",
                "patch",
                "apply",
                "delete",
                "deletecollection",
            ]
            .contains(&key.verb.as_str())
        {
            *writes
                .entry(format!("{} {}", key.verb, key.resource))
                .or_insert(0) += count;
        }
    }
    writes
}

fn writes_per_minute(root: &Path, options: Options) -> Result<Vec<Row>> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let cluster = idle_cluster(root, 1).await?;
        let intervals = if options.quick { 1 } else { 2 };
        let outcome = async {
            let sdk = cluster.sdk_client(ConnectionKind::Direct)?;
            let router = cluster.router_url().context("no in-process router")?.to_owned();
            let cluster = &cluster;
            let counts = move || async move { Ok(sim_sandbox_writes(cluster)) };
            idle::writes_under_load(&sdk, &router, DEFAULT_POOL, intervals, counts).await
        }
        .await;
        cluster.stop().await;
        let writes = outcome?;
        Ok(vec![
            Row::new("sdk/writes-per-minute-100rps")
                .median(format_duration(writes.latency.median()))
                .p99(format_duration(writes.latency.p99()))
                .throughput(format!("{:.0} req/s", writes.rate()))
                .notes(writes.notes(
                    "the sim's request counters",
                    &format!(
                        "through the in-process router; sim, controller and router in the ({}) bench process",
                        profile()
                    ),
                )),
        ])
    })
}
