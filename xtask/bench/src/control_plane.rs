//! Cases on the control-plane tier: a real `kube-apiserver` (with etcd, the controller manager
//! and the scheduler from `cargo xtask tools`) with our kubelet as its node, set up as the
//! end-to-end suite's `--control-plane` target sets it up (`agent_sandbox_e2e::plane_target`:
//! `deploy/overlays/kind` applied, the controller and the router as pods of their Deployments,
//! in a network namespace of the run's own). Warm-claim latency, API writes
//! per warm claim counted by the API server itself (`apiserver_request_total`), and a pool of
//! 200 filled from zero.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use agent_sandbox_api::claim::SandboxWarmPoolRef;
use agent_sandbox_api::conditions::claim as claim_cond;
use agent_sandbox_api::sandbox::{PodTemplate, SandboxBlueprint};
use agent_sandbox_api::warm_pool::SandboxTemplateRef;
use agent_sandbox_api::{
    SandboxClaim, SandboxClaimSpec, SandboxTemplate, SandboxTemplateSpec, SandboxWarmPool,
    SandboxWarmPoolSpec,
};
use agent_sandbox_e2e::plane_target::PlaneCluster;
use agent_sandbox_local::testkit::Tool;
use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Container, PodSpec};
use kube::api::{DeleteParams, PostParams};
use kube::runtime::wait::await_condition;
use kube::{Api, Client};

use super::{Case, Options, Row, Samples, format_duration};

/// The namespace of the bench's template and pools (that of `deploy/sandboxes`).
const NS: &str = "default";
/// The bench's template: the runtime without resource requests, so that a pool of 200 fits
/// the one node's allocatable CPU.
const TEMPLATE: &str = "bench-runtime";

/// The prefix of this tier's case names.
pub(super) const PREFIX: &str = "control-plane/";

pub(super) fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "control-plane/warm-claim",
            about: "warm claim create -> Ready seen by a watch, and API writes per claim from apiserver_request_total, on a real kube-apiserver",
            run: warm_claim,
        },
        Case {
            name: "control-plane/pool-200",
            about: "a pool of 200 created -> all members Ready, on a real kube-apiserver with our kubelet",
            run: pool_200,
        },
    ]
}

fn tokio_runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

async fn start() -> Result<PlaneCluster> {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let bin_dir = Tool::control_plane_dir().with_context(|| {
        Tool::ControlPlane
            .unavailable()
            .unwrap_or_else(|| "the control plane's binaries are missing".to_owned())
    })?;
    PlaneCluster::start(&bin_dir)
        .await
        .context("the control-plane tier did not start")
}

async fn create_pool(client: &Client, name: &str, replicas: i32) -> Result<()> {
    let templates: Api<SandboxTemplate> = Api::namespaced(client.clone(), NS);
    if templates.get_opt(TEMPLATE).await?.is_none() {
        let template = SandboxTemplate::new(
            TEMPLATE,
            SandboxTemplateSpec {
                blueprint: SandboxBlueprint {
                    pod_template: PodTemplate {
                        spec: PodSpec {
                            containers: vec![Container {
                                name: "runtime".into(),
                                image: Some("sandbox-runtime-python".into()),
                                ..Container::default()
                            }],
                            ..PodSpec::default()
                        },
                        ..PodTemplate::default()
                    },
                    ..SandboxBlueprint::default()
                },
                ..SandboxTemplateSpec::default()
            },
        );
        templates.create(&PostParams::default(), &template).await?;
    }
    let pool = SandboxWarmPool::new(
        name,
        SandboxWarmPoolSpec {
            replicas,
            sandbox_template_ref: SandboxTemplateRef {
                name: TEMPLATE.into(),
            },
            update_strategy: None,
            claim_defaults: None,
        },
    );
    Api::<SandboxWarmPool>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &pool)
        .await?;
    Ok(())
}

async fn pool_full(client: &Client, name: &str, replicas: i32, within: Duration) -> Result<()> {
    let pools: Api<SandboxWarmPool> = Api::namespaced(client.clone(), NS);
    let condition = move |pool: Option<&SandboxWarmPool>| {
        pool.and_then(|p| p.status.as_ref())
            .is_some_and(|s| s.ready_replicas == replicas && s.replicas == replicas)
    };
    tokio::time::timeout(within, await_condition(pools, name, condition))
        .await
        .with_context(|| {
            format!("pool {name} did not reach {replicas} ready members within {within:?}")
        })??;
    Ok(())
}

/// `apiserver_request_total` by (verb, group, resource, subresource), summed over codes and
/// the other labels.
async fn request_counts(client: &Client) -> Result<BTreeMap<[String; 4], u64>> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    let text = client.request_text(request).await?;
    let mut counts = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
    {
        let Some((labels, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let label = |name: &str| super::metric_label(labels, name);
        // Floats in the exposition format ("12" or "1.2e+03").
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let value = value.trim().parse::<f64>().unwrap_or(0.0) as u64;
        *counts
            .entry([
                label("verb"),
                label("group"),
                label("resource"),
                label("subresource"),
            ])
            .or_insert(0) += value;
    }
    Ok(counts)
}

const WRITE_VERBS: [&str; 6] = [
    "POST",
    "PUT",
    "PATCH",
    "APPLY",
    "DELETE",
    "DELETECOLLECTION",
];

/// Writes between two [`request_counts`], by (verb, resource, subresource).
fn writes(
    before: &BTreeMap<[String; 4], u64>,
    after: &BTreeMap<[String; 4], u64>,
) -> BTreeMap<String, u64> {
    let mut found = BTreeMap::new();
    for (key, count) in after {
        if !WRITE_VERBS.contains(&key[0].as_str()) {
            continue;
        }
        let delta = count.saturating_sub(before.get(key).copied().unwrap_or(0));
        if delta > 0 {
            let resource = if key[3].is_empty() {
                key[2].clone()
            } else {
                format!("{}/{}", key[2], key[3])
            };
            *found.entry(format!("{} {resource}", key[0])).or_insert(0) += delta;
        }
    }
    found
}

/// Whether a [`writes`] key is on the claim's own path (its SandboxClaim and Sandboxes).
fn on_claim_path(key: &str) -> bool {
    key.split_once(' ').is_some_and(|(_, resource)| {
        resource.starts_with("sandboxclaims") || resource.starts_with("sandboxes")
    })
}

fn warm_claim(_root: &std::path::Path, options: Options) -> Result<Vec<Row>> {
    tokio_runtime()?.block_on(async {
        let cluster = start().await?;
        let outcome = measure_warm_claims(&cluster, options).await;
        cluster.stop().await;
        outcome
    })
}

async fn measure_warm_claims(cluster: &PlaneCluster, options: Options) -> Result<Vec<Row>> {
    let client = cluster.client().await?;
    let pool = "bench-warm";
    let replicas = 5;
    create_pool(&client, pool, replicas).await?;
    pool_full(&client, pool, replicas, Duration::from_secs(120)).await?;
    let claims: Api<SandboxClaim> = Api::namespaced(client.clone(), NS);
    let count = options.iterations(100);
    let mut samples = Samples::with_capacity(count);
    let mut totals: BTreeMap<String, u64> = BTreeMap::new();
    for i in 0..count {
        pool_full(&client, pool, replicas, Duration::from_secs(60)).await?;
        let before = request_counts(&client).await?;
        let name = format!("bench-{i}");
        let claim = SandboxClaim::new(
            &name,
            SandboxClaimSpec {
                warm_pool_ref: SandboxWarmPoolRef { name: pool.into() },
                ..SandboxClaimSpec::default()
            },
        );
        let started = Instant::now();
        claims.create(&PostParams::default(), &claim).await?;
        let ready = |claim: Option<&SandboxClaim>| {
            claim.and_then(|c| c.status.as_ref()).is_some_and(|s| {
                !s.sandbox.name.is_empty()
                    && s.conditions
                        .iter()
                        .any(|c| c.type_ == claim_cond::READY && c.status == "True")
            })
        };
        tokio::time::timeout(
            Duration::from_secs(30),
            await_condition(claims.clone(), &name, ready),
        )
        .await
        .context("a warm claim was not Ready within 30s")??;
        samples.push(started.elapsed());
        // The follow-up passes and the refill, so that a redundant write would be counted.
        pool_full(&client, pool, replicas, Duration::from_secs(60)).await?;
        let after = request_counts(&client).await?;
        for (key, count) in writes(&before, &after) {
            *totals.entry(key).or_insert(0) += count;
        }
        claims.delete(&name, &DeleteParams::default()).await?;
    }
    #[allow(clippy::cast_precision_loss)]
    let per = |total: u64| total as f64 / count as f64;
    let claim_path: u64 = totals
        .iter()
        .filter(|(key, _)| on_claim_path(key))
        .map(|(_, n)| n)
        .sum();
    let all: u64 = totals.values().sum();
    let breakdown = totals
        .iter()
        .filter(|(key, _)| on_claim_path(key))
        .map(|(key, n)| format!("{key} {:.2}", per(*n)))
        .collect::<Vec<_>>()
        .join(", ");
    Ok(vec![
        Row::new("control-plane/warm-claim")
            .median(format_duration(samples.median()))
            .p99(format_duration(samples.p99()))
            .notes(format!(
                "create -> Ready seen by a watch, {count} claims, pool of {replicas}; real kube-apiserver, our kubelet, controller with its ServiceAccount's token"
            )),
        Row::new("control-plane/writes-per-warm-claim").notes(format!(
            "apiserver_request_total from create to the refilled pool: {:.2} to SandboxClaims and Sandboxes ({breakdown}; the refill's new member and the previous claim's garbage-collected Sandbox included); {:.2} in all, with Pods, bindings, Events and Leases",
            per(claim_path),
            per(all)
        )),
    ])
}

fn pool_200(_root: &std::path::Path, options: Options) -> Result<Vec<Row>> {
    tokio_runtime()?.block_on(async {
        let cluster = start().await?;
        let outcome = measure_pool(&cluster, options).await;
        cluster.stop().await;
        outcome
    })
}

async fn measure_pool(cluster: &PlaneCluster, options: Options) -> Result<Vec<Row>> {
    let client = cluster.client().await?;
    let replicas = if options.quick { 20 } else { 200 };
    let name = format!("bench-{replicas}");
    let started = Instant::now();
    create_pool(&client, &name, replicas).await?;
    pool_full(&client, &name, replicas, Duration::from_secs(600)).await?;
    let elapsed = started.elapsed();
    #[allow(clippy::cast_precision_loss)]
    let rate = f64::from(replicas) / elapsed.as_secs_f64();
    Ok(vec![
        Row::new(format!("control-plane/pool-{replicas}"))
            .median(format_duration(elapsed))
            .throughput(format!("{rate:.1} sandboxes/s"))
            .notes(format!(
                "pool created -> {replicas} Ready members (scheduled by kube-scheduler, run by our kubelet as runtime processes)"
            )),
    ])
}
