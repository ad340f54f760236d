//! Annotation keys shared by the controller, SDK and CLI.
//!
//! Every key is byte-identical to upstream's. Each constant says who writes it and who reads it.

/// `agents.x-k8s.io/pod-name` on a Sandbox: the name of its backing Pod.
///
/// Written by the claim reconciler on adoption (the sandbox's own name) and cleared by the
/// Sandbox reconciler when stale or when suspending. Read by the Sandbox reconciler (which pod to
/// look up), the SDK and the CLI (identity getters, `logs`).
pub const POD_NAME: &str = "agents.x-k8s.io/pod-name";

/// `agents.x-k8s.io/sandbox-template-ref` on a Sandbox: the template it was built from.
///
/// Written by the pool and claim reconcilers. Read by metrics (`sandbox_template` label).
pub const SANDBOX_TEMPLATE_REF: &str = "agents.x-k8s.io/sandbox-template-ref";

/// `agents.x-k8s.io/propagated-labels` on a Pod: comma-joined sorted keys of the labels the
/// controller copied from `podTemplate.metadata.labels`.
///
/// Written and read by the Sandbox reconciler, so that a label removed from the template is
/// removed from the live pod and a label someone else put on the pod is left alone.
pub const PROPAGATED_LABELS: &str = "agents.x-k8s.io/propagated-labels";

/// `agents.x-k8s.io/propagated-annotations` on a Pod: like [`PROPAGATED_LABELS`], for
/// annotations.
pub const PROPAGATED_ANNOTATIONS: &str = "agents.x-k8s.io/propagated-annotations";

/// `agents.x-k8s.io/sandbox-name` on a SandboxClaim: the sandbox it adopted.
///
/// Written by the claim reconciler as the record of an adoption. Read by the claim reconciler
/// (finding its sandbox again, also after a restart). Upstream once wrote it as a label; the
/// claim reconciler still reads the label form.
pub const SANDBOX_NAME: &str = "agents.x-k8s.io/sandbox-name";

/// `opentelemetry.io/trace-context`: JSON map of W3C trace headers.
///
/// Written by clients that trace (SDK) and copied by the claim reconciler to the Sandbox. Never
/// propagated to Pods.
pub const TRACE_CONTEXT: &str = "opentelemetry.io/trace-context";

/// `agents.x-k8s.io/client-first-requested-at` on a SandboxClaim (RFC 3339 with nanoseconds).
///
/// Written by the SDKs when they create a claim. Read by the claim reconciler for the
/// client-observed startup latency metric.
pub const CLIENT_FIRST_REQUESTED_AT: &str = "agents.x-k8s.io/client-first-requested-at";

/// `agents.x-k8s.io/controller-first-observed-at` on a SandboxClaim.
///
/// Written by the claim reconciler (ours and upstream's) on first sight of a claim, unless
/// `--disable-claim-observability-annotations`; read back for
/// `agent_sandbox_claim_controller_startup_latency_ms`, so the latency survives a restart.
pub const CONTROLLER_FIRST_OBSERVED_AT: &str = "agents.x-k8s.io/controller-first-observed-at";

/// `agents.x-k8s.io/claim-first-ready-at` on a SandboxClaim: when the claim first became Ready,
/// or [`CLAIM_FIRST_READY_AT_UNKNOWN`] when backfilled.
///
/// Written by upstream's claim reconciler; read by latency metrics.
pub const CLAIM_FIRST_READY_AT: &str = "agents.x-k8s.io/claim-first-ready-at";
/// Sentinel value of [`CLAIM_FIRST_READY_AT`] when the time is not known.
pub const CLAIM_FIRST_READY_AT_UNKNOWN: &str = "unknown";

/// `agents.x-k8s.io/webhook-first-observed-at` on a SandboxClaim.
///
/// Written by an optional external mutating webhook (upstream example; we run none). Read by the
/// claim reconciler for `agent_sandbox_claim_startup_latency_ms`, observed only for claims that
/// carry it.
pub const WEBHOOK_FIRST_OBSERVED_AT: &str = "agents.x-k8s.io/webhook-first-observed-at";

/// `cluster-autoscaler.kubernetes.io/safe-to-evict`.
///
/// Written as `"true"` by the warm-pool reconciler on members' pod templates (idle warm pods may
/// be evicted), removed on adoption. Read by the cluster autoscaler. The only annotation a
/// claim's `additionalPodMetadata` may set inside the reserved Kubernetes domains.
pub const SAFE_TO_EVICT: &str = "cluster-autoscaler.kubernetes.io/safe-to-evict";

/// `api.agents.x-k8s.io/v1alpha1-sandbox-state`: upstream's conversion round-trip state.
///
/// Written and read only by upstream's conversion webhook. We serve v1beta1 only and never write
/// it; the constant exists so that tools can recognise and strip it.
pub const V1ALPHA1_SANDBOX_STATE: &str = "api.agents.x-k8s.io/v1alpha1-sandbox-state";
/// `api.agents.x-k8s.io/v1alpha1-sandboxclaim-state`: as [`V1ALPHA1_SANDBOX_STATE`], for claims.
pub const V1ALPHA1_SANDBOXCLAIM_STATE: &str = "api.agents.x-k8s.io/v1alpha1-sandboxclaim-state";

/// `agents.x-k8s.io/storage-migrated-at`: written by upstream's v1alpha1→v1beta1 migration
/// script. Never written or read here.
pub const STORAGE_MIGRATED_AT: &str = "agents.x-k8s.io/storage-migrated-at";
/// `agents.x-k8s.io/migration-shadow`: written by upstream's migration script on the shadow
/// pools it creates. Never written or read here.
pub const MIGRATION_SHADOW: &str = "agents.x-k8s.io/migration-shadow";
/// `agents.x-k8s.io/migration-source-template`: written by upstream's migration script. Never
/// written or read here.
pub const MIGRATION_SOURCE_TEMPLATE: &str = "agents.x-k8s.io/migration-source-template";

/// Annotation on a SandboxTemplate that opts its sandboxes out of the container hardening
/// defaults (`allowPrivilegeEscalation: false`, all capabilities dropped, `RuntimeDefault`
/// seccomp). An addition of ours: upstream has no such defaults.
///
/// Written by template authors (value `"true"`). Read by the pool and claim reconcilers when they
/// build a sandbox from the template.
pub const SKIP_SECURE_DEFAULTS: &str = "agents.x-k8s.io/skip-container-hardening";

/// On a Sandbox the idle lifecycle suspended: when it did (RFC 3339). Removed when the sandbox
/// runs again; `suspendedTTLSeconds` counts from it.
pub const IDLE_SUSPENDED_AT: &str = "agents.x-k8s.io/idle-suspended-at";

/// On a Sandbox: since when it has been running for its current holder (RFC 3339): written when
/// a claim adopts a warm sandbox and when a sandbox is resumed, so that the idle lifecycle does
/// not count the time before.
pub const ACTIVE_SINCE: &str = "agents.x-k8s.io/active-since";
