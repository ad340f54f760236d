//! Condition types, condition reasons and Event reasons, with upstream's exact strings.
//!
//! Conditions are written by the controller into `status.conditions` of Sandboxes, SandboxClaims
//! and (our addition) SandboxWarmPools; every condition carries `observedGeneration`. They are
//! read by the SDK (waiting for `Ready`, mapping failure reasons to typed errors), by `kubectl
//! wait --for=condition=Ready`, by the CLI and by the printer columns of the CRDs.

/// Condition types on a Sandbox, and the reasons the Sandbox reconciler gives.
pub mod sandbox {
    /// `Ready`: the sandbox can take traffic (pod Running and Ready with an IP, and the Service if
    /// one is required).
    pub const READY: &str = "Ready";
    /// `Suspended`: always written; `True` only once a suspended sandbox has no pod.
    pub const SUSPENDED: &str = "Suspended";
    /// `PodScheduled`: mirrors the pod's own `PodScheduled` condition; removed when there is no
    /// owned pod.
    pub const POD_SCHEDULED: &str = "PodScheduled";
    /// `Finished`: `True` only while the owned pod is terminal (`Succeeded` or `Failed`).
    pub const FINISHED: &str = "Finished";

    /// `Ready=True`: pod Running, Ready, with an IP; Service present if required.
    pub const REASON_DEPENDENCIES_READY: &str = "DependenciesReady";
    /// `Ready=False`: the pod or the Service is not there or not ready yet (the message says
    /// which).
    pub const REASON_DEPENDENCIES_NOT_READY: &str = "DependenciesNotReady";
    /// `Ready=False`: more than one pod is controlled by the sandbox; nothing is written until
    /// that is resolved.
    pub const REASON_MULTIPLE_PODS: &str = "MultiplePods";
    /// `Ready=False`: `operatingMode: Suspended`.
    pub const REASON_SUSPENDED: &str = "SandboxSuspended";
    /// `Ready=False` and `Finished=True`: the pod exited with success; it is not restarted.
    pub const REASON_POD_SUCCEEDED: &str = "PodSucceeded";
    /// `Ready=False` and `Finished=True`: the pod failed; it is not restarted.
    pub const REASON_POD_FAILED: &str = "PodFailed";
    /// `Ready=False`: `shutdownTime` has passed.
    pub const REASON_EXPIRED: &str = "SandboxExpired";
    /// `Ready=False`: the reconciler hit an error (message `Error seen: ...`).
    pub const REASON_RECONCILER_ERROR: &str = "ReconcilerError";

    /// `PodScheduled` reason used when the pod's condition is `True` without a reason.
    pub const REASON_POD_SCHEDULED: &str = "PodScheduled";
    /// `PodScheduled` reason used when the pod's condition is not `True` and has no reason.
    pub const REASON_POD_SCHEDULING_UNKNOWN: &str = "PodSchedulingUnknown";

    /// `Suspended=False`: running normally.
    pub const REASON_NOT_SUSPENDED: &str = "NotSuspended";
    /// `Suspended=True`: suspended and no pod exists.
    pub const REASON_POD_TERMINATED: &str = "PodTerminated";
    /// `Suspended=False`: suspended, the pod is being deleted.
    pub const REASON_POD_TERMINATING: &str = "PodTerminating";
    /// `Suspended=False`: suspended, but a pod of that name exists that the sandbox does not own
    /// (it is never deleted).
    pub const REASON_POD_NOT_OWNED: &str = "PodNotOwned";
    /// `Suspended=Unknown`: the pod could not be looked up.
    pub const REASON_POD_STATE_UNKNOWN: &str = "PodStateUnknown";
    /// Deprecated upstream reason, kept so that old objects are recognised. Never written.
    pub const REASON_POD_NOT_TERMINATED: &str = "PodNotTerminated";

    /// Message of `Ready=False/SandboxExpired` on a retained expired sandbox.
    pub const MESSAGE_EXPIRED: &str = "Sandbox has expired";

    /// `Ready=False`: the API server refused the pod built from `spec.podTemplate` as invalid
    /// (for example `containers: []`); the message is the API server's. Terminal until the spec
    /// changes: the controller does not retry it. Our addition (upstream retries forever).
    pub const REASON_INVALID_POD_TEMPLATE: &str = "InvalidPodTemplate";
}

/// Condition types and reasons on a SandboxWarmPool (our addition: upstream's pool status has no
/// conditions).
pub mod warm_pool {
    /// `Capped=True` while `spec.replicas` is above the controller's maximum pool size, which is
    /// how many members it keeps instead; absent otherwise.
    pub const CAPPED: &str = "Capped";
    /// `Capped=True`: `spec.replicas` exceeds `--sandbox-warm-pool-max-replicas` (the message
    /// says both numbers).
    pub const REASON_MAX_REPLICAS_EXCEEDED: &str = "MaxReplicasExceeded";
}

/// Condition types and reasons on a SandboxClaim.
pub mod claim {
    /// `Ready`: the claim has a sandbox and that sandbox is Ready (copied from the Sandbox, with
    /// the claim's generation) or one of the claim reasons below.
    pub const READY: &str = "Ready";
    /// `Finished`: mirrored from the claim's sandbox.
    pub const FINISHED: &str = "Finished";

    /// The pool's `sandboxTemplateRef` names no SandboxTemplate.
    pub const REASON_TEMPLATE_NOT_FOUND: &str = "TemplateNotFound";
    /// `warmPoolRef` names no SandboxWarmPool.
    pub const REASON_WARM_POOL_NOT_FOUND: &str = "WarmPoolNotFound";
    /// The sandbox found for the claim is controlled by someone else.
    pub const REASON_ADOPTION_CONFLICT: &str = "AdoptionConflict";
    /// A sandbox is being created for the claim.
    pub const REASON_SANDBOX_CREATE_PENDING: &str = "SandboxCreatePending";
    /// `additionalPodMetadata` was rejected (terminal).
    pub const REASON_INVALID_METADATA: &str = "InvalidMetadata";
    /// `env` is not allowed by the template's `envVarsInjectionPolicy` (terminal).
    pub const REASON_ENV_VARS_INJECTION_REJECTED: &str = "EnvVarsInjectionRejected";
    /// `volumeClaimTemplates` is not allowed by the template's `volumeClaimTemplatesPolicy`, or
    /// is malformed (terminal).
    pub const REASON_VOLUME_CLAIM_TEMPLATES_ERROR: &str = "VolumeClaimTemplatesError";
    /// The claim's own `lifecycle` expired it (terminal).
    pub const REASON_CLAIM_EXPIRED: &str = "ClaimExpired";
    /// The claim's sandbox expired (terminal).
    pub const REASON_SANDBOX_EXPIRED: &str = "SandboxExpired";
    /// The claim recorded a sandbox that no longer exists.
    pub const REASON_SANDBOX_MISSING: &str = "SandboxMissing";
    /// The claim has a sandbox that is not Ready yet.
    pub const REASON_SANDBOX_NOT_READY: &str = "SandboxNotReady";
    /// The reconciler hit an error.
    pub const REASON_RECONCILER_ERROR: &str = "ReconcilerError";

    /// Claim reasons after which the claim will never become Ready: a client waiting for it
    /// should stop and report the reason.
    ///
    /// `InvalidPodTemplate` is the sandbox's reason, mirrored onto the claim's `Ready`.
    pub const TERMINAL_REASONS: [&str; 6] = [
        REASON_INVALID_METADATA,
        REASON_ENV_VARS_INJECTION_REJECTED,
        REASON_VOLUME_CLAIM_TEMPLATES_ERROR,
        REASON_CLAIM_EXPIRED,
        REASON_SANDBOX_EXPIRED,
        super::sandbox::REASON_INVALID_POD_TEMPLATE,
    ];
}

/// Reasons of Kubernetes Events the controller emits.
pub mod events {
    /// Normal, on a claim: a warm sandbox was adopted.
    pub const SANDBOX_ADOPTED: &str = "SandboxAdopted";
    /// Normal, on a claim: a sandbox was created cold for it.
    pub const SANDBOX_PROVISIONED: &str = "SandboxProvisioned";
    /// Normal, on a claim: its lifecycle expired it.
    pub const CLAIM_EXPIRED: &str = "ClaimExpired";
    /// Normal, on a sandbox: `shutdownTime` passed.
    pub const SANDBOX_EXPIRED: &str = "SandboxExpired";
    /// Normal, on a sandbox: its idle lifecycle suspended it (`activeTTLSeconds` without
    /// activity).
    pub const IDLE_SUSPENDED: &str = "IdleSuspended";
    /// Normal, on a sandbox: a request through the router woke it from suspension.
    pub const RESUMED_ON_TRAFFIC: &str = "ResumedOnTraffic";
    /// Normal, on a sandbox: its idle lifecycle deleted it (or its claim).
    pub const IDLE_EXPIRED: &str = "IdleExpired";
    /// Warning, on a sandbox: more than one pod is controlled by it.
    pub const MULTIPLE_PODS: &str = "MultiplePods";
    /// Warning, on a pool: a member cannot be scheduled and is held instead of replaced.
    pub const WARM_POOL_NOT_PROGRESSING: &str = "WarmPoolNotProgressing";
    /// Normal, on a pool: members can be scheduled again.
    pub const WARM_POOL_PROGRESSING: &str = "WarmPoolProgressing";
    /// Warning, on any object: a reconcile failed (the message names the operation).
    pub const RECONCILE_FAILED: &str = "ReconcileFailed";
    /// Warning, on any watched object: the controller cannot decode it (the message names the
    /// field and why); it ignores the object until it is fixed, and keeps reconciling the rest.
    pub const UNDECODABLE_OBJECT: &str = "UndecodableObject";
}
