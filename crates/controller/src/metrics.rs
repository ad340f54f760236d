//! Prometheus metrics: claim startup latency by launch type, reconcile errors by error variant,
//! and gauges of sandboxes by state and of pool depth computed from the caches at scrape time
//! (bounded cardinality: no per-sandbox series).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use agent_sandbox_api::conditions::sandbox as cond;
use agent_sandbox_api::{annotations, labels};
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
    /// Normalised `created-by` of the claim.
    pub created_by: String,
}

fn latency_histogram() -> Histogram {
    // 1 ms .. ~260 s: warm claims land in the low buckets, cold ones in the high ones.
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        1.0, 2.0, 19,
    ))
}

/// The controller's metrics.
#[derive(Clone)]
pub struct Metrics {
    /// Time from the controller first seeing a claim to the claim being Ready, ms.
    pub claim_startup: Family<ClaimLabels, Histogram>,
    /// Time from `client-first-requested-at` to the claim being Ready, ms.
    pub client_claim_startup: Family<ClaimLabels, Histogram>,
    /// Claims that got a sandbox.
    pub claim_creation: Family<ClaimCreationLabels, Counter>,
    /// Failed reconciles by controller and error variant.
    pub reconcile_errors: Family<ErrorLabels, Counter>,
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
        let claim_startup = Family::<ClaimLabels, Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        let client_claim_startup = Family::<ClaimLabels, Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        let claim_creation = Family::<ClaimCreationLabels, Counter>::default();
        let reconcile_errors = Family::<ErrorLabels, Counter>::default();
        let mut registry = Registry::default();
        registry.register(
            "agent_sandbox_claim_startup_latency_ms",
            "Time from the controller first observing a claim to the claim becoming Ready, in milliseconds",
            claim_startup.clone(),
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
        registry.register_collector(Box::new(StateCollector { caches }));
        Self {
            claim_startup,
            client_claim_startup,
            claim_creation,
            reconcile_errors,
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

    /// Records a claim that became Ready.
    pub fn claim_ready(
        &self,
        labels: ClaimLabels,
        controller_latency: Duration,
        client_latency: Option<Duration>,
    ) {
        self.claim_startup
            .get_or_create(&labels)
            .observe(controller_latency.as_secs_f64() * 1000.0);
        if let Some(latency) = client_latency {
            self.client_claim_startup
                .get_or_create(&labels)
                .observe(latency.as_secs_f64() * 1000.0);
        }
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
                ready_condition: ready.map_or("Unknown".to_owned(), |c| c.status.clone()),
                expired: ready
                    .is_some_and(|c| c.reason == cond::REASON_EXPIRED)
                    .to_string(),
                launch_type: label(labels::LAUNCH_TYPE),
                sandbox_template: sandbox
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(annotations::SANDBOX_TEMPLATE_REF))
                    .cloned()
                    .unwrap_or_default(),
                owned_by: controller_of(&sandbox.metadata)
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
