//! Prometheus metrics: claim and sandbox startup latencies by launch type, reconciles by outcome
//! and errors by variant, and gauges of sandboxes by state and of pool depth computed from the
//! caches at scrape time (bounded cardinality: no per-sandbox series).
//!
//! Where upstream's controller has a metric of the same meaning, ours has its name, labels and
//! label values (`agent_sandbox_claim_controller_startup_latency_ms`,
//! `agent_sandbox_creation_latency_ms`, `agent_sandbox_claim_creation_total`, `agent_sandboxes`,
//! `agent_sandbox_build_info`, and controller-runtime's `controller_runtime_reconcile_*` with
//! upstream's controller names), so dashboards and load-test recipes written for upstream read
//! ours; the histograms have upstream's bucket bounds and finer ones below them. The rest are
//! ours (`docs/operations.md` lists them all).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use agent_sandbox_api::conditions::sandbox as cond;
use agent_sandbox_api::{EXTENSIONS_GROUP, annotations, kinds, labels};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::cache::Caches;
use crate::decide::{controller_of, find_condition};
use crate::error::ErrorClass;
use crate::reconcile::Reconciler;

/// Labels of the claim latency histograms.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClaimLabels {
    /// `warm` or `cold`.
    pub launch_type: String,
    /// Template name.
    pub sandbox_template: String,
}

/// Labels of the sandbox creation latency histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CreationLabels {
    /// Namespace of the sandbox.
    pub namespace: String,
    /// `warm` or `cold`.
    pub launch_type: String,
    /// Template name.
    pub sandbox_template: String,
}

/// Labels of controller-runtime's per-controller families.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    /// Upstream's controller name ([`controller_name`]).
    pub controller: &'static str,
}

/// Labels of `controller_runtime_reconcile_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// Upstream's controller name ([`controller_name`]).
    pub controller: &'static str,
    /// `success`, `requeue_after` or `error`, as controller-runtime counts them.
    pub result: &'static str,
}

/// The name controller-runtime gives each of upstream's controllers (the lower-cased kind).
pub fn controller_name(controller: Reconciler) -> &'static str {
    match controller {
        Reconciler::Sandbox => "sandbox",
        Reconciler::Template => "sandboxtemplate",
        Reconciler::WarmPool => "sandboxwarmpool",
        Reconciler::Claim => "sandboxclaim",
    }
}

/// Labels of the reconcile error counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// The reconciler ([`Reconciler::as_str`]: `sandbox`, `template`, `warmpool` or `claim`).
    pub controller: &'static str,
    /// The error class ([`ErrorClass::as_str`]).
    pub error: &'static str,
}

/// Labels of the claim creation counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClaimCreationLabels {
    /// Namespace of the claim.
    pub namespace: String,
    /// Template name.
    pub sandbox_template: String,
    /// `warm` or `cold`.
    pub launch_type: String,
    /// Pool name.
    pub warmpool_name: String,
    /// `ready` when the claim's sandbox was Ready as it got it (a Ready warm member), else
    /// `not_ready`.
    pub pod_condition: &'static str,
    /// Normalised `created-by` of the claim.
    pub created_by: String,
}

/// Upper bounds (ms) of upstream's claim latency histograms.
const UPSTREAM_CLAIM_BUCKETS: [f64; 15] = [
    100.0, 250.0, 500.0, 750.0, 1000.0, 1250.0, 1500.0, 2000.0, 2500.0, 5000.0, 10000.0, 30000.0,
    60000.0, 120000.0, 240000.0,
];

/// Upper bounds (ms) of upstream's sandbox creation latency histogram.
const UPSTREAM_CREATION_BUCKETS: [f64; 18] = [
    50.0, 100.0, 200.0, 300.0, 500.0, 700.0, 1000.0, 1500.0, 2000.0, 3000.0, 4500.0, 6000.0,
    9000.0, 12000.0, 18000.0, 30000.0, 60000.0, 600000.0,
];

/// Bounds below upstream's smallest: a warm claim here takes milliseconds, and a histogram whose
/// first bucket is 50 or 100 ms could not tell 2 ms from 90.
const FINE_BUCKETS: [f64; 6] = [1.0, 2.5, 5.0, 10.0, 25.0, 50.0];

/// controller-runtime's reconcile time buckets, seconds.
const RECONCILE_TIME_BUCKETS: [f64; 40] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9,
    1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 15.0, 20.0,
    25.0, 30.0, 40.0, 50.0, 60.0,
];

/// The fine bounds, then upstream's `coarse` ones above them.
fn with_fine_buckets(coarse: &[f64]) -> Vec<f64> {
    let smallest = coarse.first().copied().unwrap_or(f64::INFINITY);
    FINE_BUCKETS
        .iter()
        .copied()
        .filter(|bound| *bound < smallest)
        .chain(coarse.iter().copied())
        .collect()
}

/// `sandbox_template` of a sandbox that names none, as upstream's gauge spells it.
const UNKNOWN_TEMPLATE: &str = "unknown";

fn claim_histogram() -> Histogram {
    Histogram::new(with_fine_buckets(&UPSTREAM_CLAIM_BUCKETS))
}

fn creation_histogram() -> Histogram {
    Histogram::new(with_fine_buckets(&UPSTREAM_CREATION_BUCKETS))
}

fn reconcile_time_histogram() -> Histogram {
    Histogram::new(RECONCILE_TIME_BUCKETS)
}

/// The controller's metrics.
#[derive(Clone)]
pub struct Metrics {
    /// Time from the controller first observing a claim to the claim being Ready, ms.
    pub claim_controller_startup: Family<ClaimLabels, Histogram>,
    /// Time from `webhook-first-observed-at` (set by an admission webhook, when one runs) to the
    /// claim being Ready, ms.
    pub claim_startup: Family<ClaimLabels, Histogram>,
    /// Time from `client-first-requested-at` to the claim being Ready, ms.
    pub client_claim_startup: Family<ClaimLabels, Histogram>,
    /// Time from a Sandbox's creation to it first being Ready, ms.
    pub creation_latency: Family<CreationLabels, Histogram>,
    /// Claims that got a sandbox.
    pub claim_creation: Family<ClaimCreationLabels, Counter>,
    /// Failed reconciles by controller and error variant.
    pub reconcile_errors: Family<ErrorLabels, Counter>,
    /// Reconciles by upstream's controller name and outcome.
    pub reconcile_total: Family<OutcomeLabels, Counter>,
    /// Failed reconciles by upstream's controller name.
    pub reconcile_errors_total: Family<ControllerLabels, Counter>,
    /// Reconcile durations by upstream's controller name, seconds.
    pub reconcile_time: Family<ControllerLabels, Histogram>,
    registry: Arc<Registry>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// Registers every metric; the state gauges read `caches` at scrape time.
    pub fn new(caches: Caches) -> Self {
        let claim = || {
            Family::<ClaimLabels, Histogram>::new_with_constructor(
                claim_histogram as fn() -> Histogram,
            )
        };
        let claim_controller_startup = claim();
        let claim_startup = claim();
        let client_claim_startup = claim();
        let creation_latency = Family::<CreationLabels, Histogram>::new_with_constructor(
            creation_histogram as fn() -> Histogram,
        );
        let claim_creation = Family::<ClaimCreationLabels, Counter>::default();
        let reconcile_errors = Family::<ErrorLabels, Counter>::default();
        let reconcile_total = Family::<OutcomeLabels, Counter>::default();
        let reconcile_errors_total = Family::<ControllerLabels, Counter>::default();
        let reconcile_time = Family::<ControllerLabels, Histogram>::new_with_constructor(
            reconcile_time_histogram as fn() -> Histogram,
        );
        let mut registry = Registry::default();
        registry.register(
            "agent_sandbox_claim_controller_startup_latency_ms",
            "Time from the controller first observing a claim (controller-first-observed-at) to the claim becoming Ready, in milliseconds",
            claim_controller_startup.clone(),
        );
        registry.register(
            "agent_sandbox_claim_startup_latency_ms",
            "Time from an admission webhook first observing a claim (webhook-first-observed-at) to the claim becoming Ready, in milliseconds; only claims with that annotation",
            claim_startup.clone(),
        );
        registry.register(
            "agent_sandbox_creation_latency_ms",
            "Time from a Sandbox's creation to it first becoming Ready, in milliseconds",
            creation_latency.clone(),
        );
        registry.register(
            "agent_sandbox_client_claim_startup_latency_ms",
            "Time from the client's first request (client-first-requested-at) to the claim becoming Ready, in milliseconds",
            client_claim_startup.clone(),
        );
        registry.register(
            "agent_sandbox_claim_creation",
            "Claims that were given a sandbox",
            claim_creation.clone(),
        );
        registry.register(
            "agent_sandbox_reconcile_errors",
            "Failed reconciles, by controller and error variant",
            reconcile_errors.clone(),
        );
        registry.register(
            "controller_runtime_reconcile",
            "Reconciles per controller and outcome (success, requeue_after, error), as controller-runtime counts them",
            reconcile_total.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_errors",
            "Failed reconciles per controller, as controller-runtime counts them",
            reconcile_errors_total.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_time_seconds",
            "Time of one reconcile per controller, in seconds",
            reconcile_time.clone(),
        );
        registry.register_collector(Box::new(BuildInfo));
        registry.register_collector(Box::new(StateCollector { caches }));
        Self {
            claim_controller_startup,
            claim_startup,
            client_claim_startup,
            creation_latency,
            claim_creation,
            reconcile_errors,
            reconcile_total,
            reconcile_errors_total,
            reconcile_time,
            registry: Arc::new(registry),
        }
    }

    /// Counts a failed reconcile.
    pub fn reconcile_failed(&self, controller: Reconciler, error: ErrorClass) {
        self.reconcile_errors
            .get_or_create(&ErrorLabels {
                controller: controller.as_str(),
                error: error.as_str(),
            })
            .inc();
    }

    /// Counts one reconcile that took `took`: `requeue` says whether it asked to run again after
    /// a delay, `failed` whether it ended in an error.
    pub fn reconciled(&self, controller: Reconciler, took: Duration, requeue: bool, failed: bool) {
        let name = controller_name(controller);
        let result = match (failed, requeue) {
            (true, _) => "error",
            (false, true) => "requeue_after",
            (false, false) => "success",
        };
        self.reconcile_total
            .get_or_create(&OutcomeLabels {
                controller: name,
                result,
            })
            .inc();
        if failed {
            self.reconcile_errors_total
                .get_or_create(&ControllerLabels { controller: name })
                .inc();
        }
        self.reconcile_time
            .get_or_create(&ControllerLabels { controller: name })
            .observe(took.as_secs_f64());
    }

    /// Records a claim that became Ready: `controller_latency` since the controller first observed
    /// it, `webhook_latency` and `client_latency` since the annotations of those names, when
    /// present.
    pub fn claim_ready(
        &self,
        labels: ClaimLabels,
        controller_latency: Duration,
        webhook_latency: Option<Duration>,
        client_latency: Option<Duration>,
    ) {
        self.claim_controller_startup
            .get_or_create(&labels)
            .observe(controller_latency.as_secs_f64() * 1000.0);
        for (family, latency) in [
            (&self.claim_startup, webhook_latency),
            (&self.client_claim_startup, client_latency),
        ] {
            if let Some(latency) = latency {
                family
                    .get_or_create(&labels)
                    .observe(latency.as_secs_f64() * 1000.0);
            }
        }
    }

    /// Records a Sandbox that became Ready for the first time, `latency` after its creation.
    pub fn sandbox_ready(&self, labels: CreationLabels, latency: Duration) {
        self.creation_latency
            .get_or_create(&labels)
            .observe(latency.as_secs_f64() * 1000.0);
    }

    /// The metrics in the Prometheus text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

/// `agent_sandbox_build_info`: 1, with the version and build of this binary as labels.
#[derive(Debug)]
struct BuildInfo;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    git_version: &'static str,
    git_commit: &'static str,
    build_date: &'static str,
    compiler: &'static str,
    platform: String,
}

impl Collector for BuildInfo {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let labels = BuildLabels {
            git_version: env!("CARGO_PKG_VERSION"),
            // Set by image builds (`cargo xtask images`); "unknown" in a plain `cargo build`.
            git_commit: option_env!("AGENT_SANDBOX_GIT_COMMIT").unwrap_or("unknown"),
            build_date: option_env!("AGENT_SANDBOX_BUILD_DATE").unwrap_or("unknown"),
            compiler: "rustc",
            platform: format!("{}/{}", std::env::consts::OS, std::env::consts::ARCH),
        };
        let mut family = encoder.encode_descriptor(
            "agent_sandbox_build_info",
            "Build information of the controller; the value is always 1",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        ConstGauge::new(1).encode(family.encode_family(&labels)?)?;
        Ok(())
    }
}

/// Gauges computed from the caches on each scrape.
#[derive(Debug)]
struct StateCollector {
    caches: Caches,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct SandboxStateLabels {
    namespace: String,
    ready_condition: String,
    expired: String,
    launch_type: String,
    sandbox_template: String,
    owned_by: String,
    created_by: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct PoolLabels {
    namespace: String,
    pool: String,
}

impl Collector for StateCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let mut counts: BTreeMap<SandboxStateLabels, i64> = BTreeMap::new();
        for sandbox in self.caches.sandboxes.state() {
            let conditions = sandbox
                .status
                .as_ref()
                .map(|s| s.conditions.as_slice())
                .unwrap_or_default();
            let ready = find_condition(conditions, cond::READY);
            let label = |key: &str| {
                sandbox
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(key))
                    .cloned()
                    .unwrap_or_default()
            };
            let key = SandboxStateLabels {
                namespace: sandbox.metadata.namespace.clone().unwrap_or_default(),
                // Upstream's values: `true` only for a True Ready condition.
                ready_condition: ready.is_some_and(|c| c.status == "True").to_string(),
                expired: ready
                    .is_some_and(|c| c.reason == cond::REASON_EXPIRED)
                    .to_string(),
                launch_type: if label(labels::LAUNCH_TYPE) == labels::LAUNCH_TYPE_WARM {
                    labels::LAUNCH_TYPE_WARM
                } else {
                    labels::LAUNCH_TYPE_COLD
                }
                .to_owned(),
                sandbox_template: sandbox
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(annotations::SANDBOX_TEMPLATE_REF))
                    .filter(|name| !name.is_empty())
                    .cloned()
                    .unwrap_or_else(|| UNKNOWN_TEMPLATE.to_owned()),
                // Upstream's values: a claim or a pool of our extensions group, else `None`.
                owned_by: controller_of(&sandbox.metadata)
                    .filter(|owner| {
                        owner.api_version.split('/').next() == Some(EXTENSIONS_GROUP)
                            && [kinds::SANDBOX_CLAIM, kinds::SANDBOX_WARM_POOL]
                                .contains(&owner.kind.as_str())
                    })
                    .map_or("None".to_owned(), |owner| owner.kind.clone()),
                created_by: crate::decide::normalize_created_by(&label(labels::CREATED_BY))
                    .to_owned(),
            };
            *counts.entry(key).or_default() += 1;
        }
        let mut family = encoder.encode_descriptor(
            "agent_sandboxes",
            "Sandboxes by state",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (key, count) in &counts {
            ConstGauge::new(*count).encode(family.encode_family(key)?)?;
        }

        let mut desired: Vec<(PoolLabels, i64, i64)> = Vec::new();
        for pool in self.caches.pools.state() {
            let key = PoolLabels {
                namespace: pool.metadata.namespace.clone().unwrap_or_default(),
                pool: pool.metadata.name.clone().unwrap_or_default(),
            };
            let ready = pool.status.as_ref().map_or(0, |s| s.ready_replicas);
            desired.push((key, i64::from(pool.spec.replicas), i64::from(ready)));
        }
        desired.sort();
        let mut family = encoder.encode_descriptor(
            "agent_sandbox_warm_pool_desired",
            "Desired unclaimed members per warm pool",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (key, want, _) in &desired {
            ConstGauge::new(*want).encode(family.encode_family(key)?)?;
        }
        let mut family = encoder.encode_descriptor(
            "agent_sandbox_warm_pool_ready",
            "Ready unclaimed members per warm pool (pool depth)",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (key, _, ready) in &desired {
            ConstGauge::new(*ready).encode(family.encode_family(key)?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_sandbox_api::Sandbox;
    use kube::runtime::watcher::Event;
    use serde_json::json;

    fn sandbox(value: serde_json::Value) -> Sandbox {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn series_carry_upstreams_names_labels_and_values() {
        let (caches, mut writers) = Caches::detached();
        let spec = json!({"podTemplate": {"spec": {"containers": [{"name": "c", "image": "i"}]}}});
        // A cold sandbox nobody owns, Ready; and a warm one a claim owns, not Ready.
        writers
            .sandboxes
            .apply_watcher_event(&Event::Apply(sandbox(json!({
                "apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
                "metadata": {"name": "a", "namespace": "default"},
                "spec": spec,
                "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "R",
                    "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
            }))));
        writers.sandboxes.apply_watcher_event(&Event::Apply(sandbox(json!({
            "apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
            "metadata": {"name": "b", "namespace": "default",
                "labels": {"agents.x-k8s.io/launch-type": "warm", "agents.x-k8s.io/created-by": "go-client"},
                "annotations": {"agents.x-k8s.io/sandbox-template-ref": "python"},
                "ownerReferences": [{"apiVersion": "extensions.agents.x-k8s.io/v1beta1",
                    "kind": "SandboxClaim", "name": "c", "uid": "u", "controller": true}]},
            "spec": spec,
        }))));
        let metrics = Metrics::new(caches);
        let labels = ClaimLabels {
            launch_type: "warm".into(),
            sandbox_template: "python".into(),
        };
        metrics.claim_ready(labels, Duration::from_millis(7), None, None);
        metrics.reconciled(Reconciler::Claim, Duration::from_millis(3), false, false);
        metrics.reconciled(Reconciler::WarmPool, Duration::from_millis(3), true, false);
        metrics.reconciled(Reconciler::Sandbox, Duration::from_millis(3), false, true);
        let text = metrics.encode();
        for line in [
            r#"agent_sandbox_claim_controller_startup_latency_ms_bucket{le="10.0",launch_type="warm",sandbox_template="python"} 1"#,
            r#"agent_sandbox_claim_controller_startup_latency_ms_bucket{le="5.0",launch_type="warm",sandbox_template="python"} 0"#,
            r#"agent_sandbox_claim_controller_startup_latency_ms_bucket{le="100.0",launch_type="warm",sandbox_template="python"} 1"#,
            r#"controller_runtime_reconcile_total{controller="sandboxclaim",result="success"} 1"#,
            r#"controller_runtime_reconcile_total{controller="sandboxwarmpool",result="requeue_after"} 1"#,
            r#"controller_runtime_reconcile_total{controller="sandbox",result="error"} 1"#,
            r#"controller_runtime_reconcile_errors_total{controller="sandbox"} 1"#,
            r#"agent_sandboxes{namespace="default",ready_condition="true",expired="false",launch_type="cold",sandbox_template="unknown",owned_by="None",created_by="unknown"} 1"#,
            r#"agent_sandboxes{namespace="default",ready_condition="false",expired="false",launch_type="warm",sandbox_template="python",owned_by="SandboxClaim",created_by="go-client"} 1"#,
        ] {
            assert!(text.contains(line), "missing {line} in:\n{text}");
        }
        assert!(
            text.contains("agent_sandbox_build_info{git_version=\""),
            "{text}"
        );
        // Only claims with the webhook's annotation feed the webhook-based histogram.
        assert!(
            !text.contains("agent_sandbox_claim_startup_latency_ms_bucket"),
            "{text}"
        );
    }
}
