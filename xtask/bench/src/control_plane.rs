//! Cases on the control-plane tier: a real `kube-apiserver` (with etcd, the controller manager
//! and the scheduler from `cargo xtask tools`) with our kubelet as its node, set up as the
//! end-to-end suite's `--control-plane` target sets it up (`agent_sandbox_e2e::plane_target`:
//! `deploy/overlays/kind` applied, the controller and the router as pods of their Deployments,
//! in a network namespace of the run's own). Warm-claim latency, API writes
//! per warm claim counted by the API server itself (`apiserver_request_total`), a pool of
//! 200 filled from zero, and the idle lifecycle's costs ([`super::idle`], through a router pod
//! with the SDK in direct mode): a request to a suspended sandbox until its answer beside cold
//! and warm claims, and the API writes per minute of a sandbox receiving 100 requests a second.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use agent_sandbox::{ClientOptions, ConnectionMode};
use agent_sandbox_api::claim::SandboxWarmPoolRef;
use agent_sandbox_api::conditions::claim as claim_cond;
use agent_sandbox_api::sandbox::{PodTemplate, SandboxBlueprint};
use agent_sandbox_api::warm_pool::SandboxTemplateRef;
use agent_sandbox_api::{
    SandboxClaim, SandboxClaimSpec, SandboxTemplate, SandboxTemplateSpec, SandboxWarmPool,
    SandboxWarmPoolSpec, wire,
};
use agent_sandbox_e2e::plane_target::PlaneCluster;
use agent_sandbox_local::testkit::Tool;
use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Container, PodSpec, Secret};
use kube::api::{DeleteParams, PostParams};
use kube::runtime::wait::await_condition;
use kube::{Api, Client};

use super::idle::{self, Tier};
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
        Case {
            name: "control-plane/resume-on-traffic",
            about: "run(\"true\") to a Suspended sandbox (pod gone) -> its answer through a router pod, beside cold and warm claim -> first run, on a real kube-apiserver",
            run: resume_on_traffic,
        },
        Case {
            name: "control-plane/writes-per-minute-100rps",
            about: "API writes per minute (router's, and all Sandbox writes from apiserver_request_total) of a sandbox receiving 100 run(\"true\") a second",
            run: writes_per_minute,
        },
    ]
}

pub(super) fn tokio_runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

/// Installs the TLS provider and finds the control plane's binaries (`cargo xtask tools`).
pub(super) fn control_plane_bin_dir() -> Result<std::path::PathBuf> {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    Tool::control_plane_dir().with_context(|| {
        Tool::ControlPlane
            .unavailable()
            .unwrap_or_else(|| "the control plane's binaries are missing".to_owned())
    })
}

async fn start() -> Result<PlaneCluster> {
    let bin_dir = control_plane_bin_dir()?;
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

pub(super) async fn pool_full(
    client: &Client,
    name: &str,
    replicas: i32,
    within: Duration,
) -> Result<()> {
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

/// An SDK client in direct mode to the router pod of [`PlaneCluster::router_url`], in [`NS`],
/// with the routers' signing key from their Secret (they run `--auth scoped`).
pub(super) async fn sdk_client(
    cluster: &PlaneCluster,
    client: &Client,
) -> Result<agent_sandbox::Client> {
    let secret = Api::<Secret>::namespaced(client.clone(), wire::SYSTEM_NAMESPACE)
        .get(wire::ROUTER_SIGNING_KEY_SECRET)
        .await
        .context("failed to read the router's signing-key Secret")?;
    let key = secret
        .data
        .and_then(|mut data| data.remove(wire::ROUTER_SIGNING_KEY_SECRET_KEY))
        .context("the router's signing-key Secret has no key")?;
    let options = ClientOptions::default()
        .namespace(NS)
        .connection(ConnectionMode::direct(cluster.router_url()))
        .router_signing_key(key.0);
    Ok(agent_sandbox::Client::from_kube(client.clone(), options))
}

const NOTES_SETUP: &str = "SDK (direct) to one router pod (--auth scoped), real kube-apiserver, kube-scheduler, our kubelet, controller and routers as pods of their Deployments";

fn resume_on_traffic(_root: &std::path::Path, options: Options) -> Result<Vec<Row>> {
    tokio_runtime()?.block_on(async {
        let cluster = start().await?;
        let outcome = measure_resume(&cluster, options).await;
        cluster.stop().await;
        outcome
    })
}

async fn measure_resume(cluster: &PlaneCluster, options: Options) -> Result<Vec<Row>> {
    let client = cluster.client().await?;
    let (warm_pool, cold_pool, replicas) = ("bench-resume", "bench-cold", 5);
    create_pool(&client, warm_pool, replicas).await?;
    create_pool(&client, cold_pool, 0).await?;
    let sdk = sdk_client(cluster, &client).await?;
    let tier = Tier {
        sdk: &sdk,
        kube: &client,
        namespace: NS,
        warm_pool,
        warm_replicas: replicas,
        cold_pool,
    };
    let measured = idle::resume_on_traffic(&tier, options).await?;
    Ok(vec![
        Row::new("control-plane/resume-on-traffic")
            .median(format_duration(measured.resume.median()))
            .p99(format_duration(measured.resume.p99()))
            .notes(format!(
                "{} x run(\"true\") to a Suspended sandbox (suspend(), pod gone) -> its answer: the router records activity, the controller resumes it, kube-scheduler binds the new pod, our kubelet runs it, the request is forwarded; {} sandboxes in turn; same run: cold claim {} and warm claim {} (medians, claim -> first run, rows control-plane/resume-on-traffic/cold-claim and /warm-claim; also control-plane/warm-claim, create -> Ready); {NOTES_SETUP}",
                measured.resume.len(),
                measured.sandboxes,
                format_duration(measured.cold.median()),
                format_duration(measured.warm.median()),
            )),
        Row::new("control-plane/resume-on-traffic/cold-claim")
            .median(format_duration(measured.cold.median()))
            .p99(format_duration(measured.cold.p99()))
            .notes(format!(
                "baseline of control-plane/resume-on-traffic, same run: {} x create_sandbox from a pool of 0 (created cold) -> Ready -> first run(\"true\") answered; {NOTES_SETUP}",
                measured.cold.len()
            )),
        Row::new("control-plane/resume-on-traffic/warm-claim")
            .median(format_duration(measured.warm.median()))
            .p99(format_duration(measured.warm.p99()))
            .notes(format!(
                "baseline of control-plane/resume-on-traffic, same run: {} x create_sandbox from a full pool of {replicas} -> Ready -> first run(\"true\") answered; {NOTES_SETUP}",
                measured.warm.len()
            )),
    ])
}

/// Cumulative writes to Sandboxes (every subresource) from `apiserver_request_total`, by
/// `VERB resource`.
async fn sandbox_writes(client: &Client) -> Result<BTreeMap<String, u64>> {
    let counts = request_counts(client).await?;
    let mut found = BTreeMap::new();
    for ([verb, group, resource, subresource], count) in counts {
        if !WRITE_VERBS.contains(&verb.as_str())
            || group != agent_sandbox_api::GROUP
            || resource != "sandboxes"
        {
            continue;
        }
        let resource = if subresource.is_empty() {
            resource
        } else {
            format!("{resource}/{subresource}")
        };
        *found.entry(format!("{verb} {resource}")).or_insert(0) += count;
    }
    Ok(found)
}

fn writes_per_minute(_root: &std::path::Path, options: Options) -> Result<Vec<Row>> {
    tokio_runtime()?.block_on(async {
        let cluster = start().await?;
        let outcome = measure_writes(&cluster, options).await;
        cluster.stop().await;
        outcome
    })
}

async fn measure_writes(cluster: &PlaneCluster, options: Options) -> Result<Vec<Row>> {
    let client = cluster.client().await?;
    let pool = "bench-busy";
    create_pool(&client, pool, 1).await?;
    pool_full(&client, pool, 1, Duration::from_secs(120)).await?;
    let sdk = sdk_client(cluster, &client).await?;
    let intervals = if options.quick { 1 } else { 2 };
    let counts = || sandbox_writes(&client);
    let writes =
        idle::writes_under_load(&sdk, cluster.router_url(), pool, intervals, counts).await?;
    Ok(vec![
        Row::new("control-plane/writes-per-minute-100rps")
            .median(format_duration(writes.latency.median()))
            .p99(format_duration(writes.latency.p99()))
            .throughput(format!("{:.0} req/s", writes.rate()))
            .notes(writes.notes(
                "apiserver_request_total, every component",
                &format!("the router's counter is that of the pod the requests went through; {NOTES_SETUP}"),
            )),
    ])
}
