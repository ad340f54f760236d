//! Decisions of the SandboxClaim reconciler: which warm member to adopt (or whether to wait or
//! build cold), what the adoption write contains, what a cold sandbox looks like (metadata,
//! environment and volume-claim-template merges under the template's policies), expiry, and the
//! claim's status.
//!
//! [`plan`] takes them all at once: from what a pass [`Observed`] it returns the pass's one
//! [`Plan`], the writes in order (and what follows a write that can lose a race), which
//! `reconcile::claim` carries out. The claim's pod metadata is validated once per pass, into the
//! [`ValidatedClaim`] the builders require.
//!
//! Adoption is one conditional write on the Sandbox ([`adoption_patch`] carries the
//! resourceVersion the choice was made on): it moves the controller ownerReference from the pool
//! to the claim, so two claims can never hold one sandbox; the claim's status only records the
//! outcome.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use agent_sandbox_api::claim::{ClaimLifecycle, ClaimShutdownPolicy, ClaimedSandbox, EnvVar};
use agent_sandbox_api::conditions::{claim as claim_cond, sandbox as sandbox_cond};
use agent_sandbox_api::names::{is_label_value, is_qualified_name};
use agent_sandbox_api::sandbox::{
    IdleLifecycle, PersistentVolumeClaimTemplate, PodMetadata, Sandbox,
};
use agent_sandbox_api::template::{EnvVarsInjectionPolicy, VolumeClaimTemplatesPolicy};
use agent_sandbox_api::warm_pool::UpdateStrategyType;
use agent_sandbox_api::{
    SandboxClaim, SandboxClaimStatus, SandboxTemplate, SandboxWarmPool, annotations, kinds, labels,
    name_hash,
};
use k8s_openapi::api::core::v1::{EnvVar as KEnvVar, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use serde_json::{Map, Value, json};

use super::secure_defaults::{self, DnsMode};
use super::warm_pool::{is_ready, is_stale};
use super::{
    after, condition, controller_of, controller_reference, find_condition, remaining,
    remove_condition, set_condition,
};

/// Annotation and label domains a claim's `additionalPodMetadata` may never use (except
/// [`annotations::SAFE_TO_EVICT`]).
const RESTRICTED_DOMAINS: [&str; 3] = ["kubernetes.io", "k8s.io", "agents.x-k8s.io"];

/// Default label domains a claim may add (upstream's secure default).
pub const DEFAULT_ALLOWED_LABEL_DOMAINS: [&str; 1] = ["sandbox.users.io"];

fn claim_uid(claim: &SandboxClaim) -> &str {
    claim.metadata.uid.as_deref().unwrap_or_default()
}

/// True when `sandbox` is controlled by `claim`.
pub fn is_owned_by(sandbox: &Sandbox, claim: &SandboxClaim) -> bool {
    controller_of(&sandbox.metadata).is_some_and(|reference| reference.uid == claim_uid(claim))
}

/// True when the claim can only be served cold (it injects env or volumes).
pub fn needs_cold_start(claim: &SandboxClaim) -> bool {
    !claim.spec.env.is_empty() || !claim.spec.volume_claim_templates.is_empty()
}

fn domain_matches(domain: &str, allowed: &str) -> bool {
    domain == allowed || domain.ends_with(&format!(".{allowed}"))
}

/// Checks a claim's `additionalPodMetadata` like upstream: label keys must be qualified, carry a
/// domain prefix from `allowed_domains`, have valid values and never claim to be the router;
/// annotation keys must stay out of the Kubernetes and agent-sandbox domains.
pub fn validate_additional_pod_metadata(
    meta: &PodMetadata,
    allowed_domains: &[String],
) -> Result<(), String> {
    for (key, value) in &meta.labels {
        let fail = |why: String| Err(format!("failed to validate label {key:?}: {why}"));
        if !is_qualified_name(key) {
            return fail(format!("invalid label key: {key:?}"));
        }
        if key.eq_ignore_ascii_case(labels::ROUTER_APP)
            && value.eq_ignore_ascii_case(labels::ROUTER_APP_VALUE)
        {
            return fail(format!(
                "restricted system label value: {key:?}={value:?} is not allowed in AdditionalPodMetadata"
            ));
        }
        let Some((domain, _)) = key.split_once('/') else {
            return fail(format!(
                "label {key:?} must have a domain prefix (e.g. 'sandbox.users.io/my-label') to prevent opting into unintended policy domains"
            ));
        };
        let domain = domain.to_lowercase();
        if !allowed_domains
            .iter()
            .any(|allowed| domain_matches(&domain, allowed))
        {
            return fail(format!("label domain {domain:?} is not in the allowlist"));
        }
        if !is_label_value(value) {
            return fail(format!("invalid label value: {value:?}"));
        }
    }
    for key in meta.annotations.keys() {
        if !is_qualified_name(key) {
            return Err(format!(
                "failed to validate annotation {key:?}: invalid annotation key: {key:?}"
            ));
        }
        if let Some((domain, _)) = key.split_once('/')
            && RESTRICTED_DOMAINS
                .iter()
                .any(|restricted| domain_matches(&domain.to_lowercase(), restricted))
            && key != annotations::SAFE_TO_EVICT
        {
            return Err(format!(
                "failed to validate annotation {key:?}: restricted system domain: {key:?} is not allowed in AdditionalPodMetadata"
            ));
        }
    }
    Ok(())
}

/// A claim whose `additionalPodMetadata` passed [`validate_additional_pod_metadata`]. The
/// builders of what a claim gets ([`cold_sandbox`], [`adoption_patch`]) take only this, so a pass
/// validates the claim once and nothing unvalidated reaches a write.
#[derive(Clone, Copy, Debug)]
pub struct ValidatedClaim<'a>(&'a SandboxClaim);

impl<'a> ValidatedClaim<'a> {
    /// Validates `claim`'s pod metadata against `allowed_domains`.
    pub fn new(claim: &'a SandboxClaim, allowed_domains: &[String]) -> Result<Self, String> {
        validate_additional_pod_metadata(&claim.spec.additional_pod_metadata, allowed_domains)?;
        Ok(Self(claim))
    }

    /// The claim.
    pub fn claim(self) -> &'a SandboxClaim {
        self.0
    }
}

/// The template's pod metadata plus the claim's, refusing to override a template key.
pub fn merge_pod_metadata(
    template: &PodMetadata,
    claim: &PodMetadata,
) -> Result<PodMetadata, String> {
    let mut merged = template.clone();
    for (key, value) in &claim.labels {
        if let Some(existing) = template
            .labels
            .get(key)
            .filter(|existing| *existing != value)
        {
            return Err(format!(
                "metadata override conflict: label {key:?} is defined in template with value {existing:?}, but claim requests {value:?}"
            ));
        }
        merged.labels.insert(key.clone(), value.clone());
    }
    for (key, value) in &claim.annotations {
        if let Some(existing) = template
            .annotations
            .get(key)
            .filter(|existing| *existing != value)
        {
            return Err(format!(
                "metadata override conflict: annotation {key:?} is defined in template with value {existing:?}, but claim requests {value:?}"
            ));
        }
        merged.annotations.insert(key.clone(), value.clone());
    }
    Ok(merged)
}

/// Injects the claim's env into the pod spec under the template's policy.
pub fn inject_env(
    spec: &mut PodSpec,
    env: &[EnvVar],
    policy: EnvVarsInjectionPolicy,
) -> Result<(), String> {
    if env.is_empty() {
        return Ok(());
    }
    if policy == EnvVarsInjectionPolicy::Disallowed {
        return Err(
            "the template's envVarsInjectionPolicy is Disallowed: this claim may not set env"
                .to_owned(),
        );
    }
    for var in env {
        let container = if var.container_name.is_empty() {
            spec.containers.first_mut()
        } else {
            spec.containers
                .iter_mut()
                .find(|c| c.name == var.container_name)
        };
        let Some(container) = container else {
            return Err(format!(
                "env {:?}: the template has no container named {:?}",
                var.name, var.container_name
            ));
        };
        if policy == EnvVarsInjectionPolicy::Allowed
            && container.env_from.as_ref().is_some_and(|e| !e.is_empty())
        {
            return Err(format!(
                "container {:?} uses EnvFrom sources; Allowed policy cannot safely prevent overriding EnvFrom-provided variables",
                container.name
            ));
        }
        let vars = container.env.get_or_insert_with(Vec::new);
        match vars.iter_mut().find(|existing| existing.name == var.name) {
            Some(_) if policy != EnvVarsInjectionPolicy::Overrides => {
                return Err(format!(
                    "environment variable override is not allowed by the template policy for variable {:?}",
                    var.name
                ));
            }
            Some(existing) => {
                *existing = KEnvVar {
                    name: var.name.clone(),
                    value: Some(var.value.clone()),
                    value_from: None,
                };
            }
            None => vars.push(KEnvVar {
                name: var.name.clone(),
                value: Some(var.value.clone()),
                value_from: None,
            }),
        }
    }
    Ok(())
}

fn validate_vct_names(vcts: &[PersistentVolumeClaimTemplate]) -> Result<(), String> {
    let mut seen = BTreeSet::new();
    for vct in vcts {
        if vct.metadata.name.is_empty() {
            return Err("every volumeClaimTemplate needs metadata.name".to_owned());
        }
        if !seen.insert(vct.metadata.name.as_str()) {
            return Err(format!(
                "volumeClaimTemplate name {:?} is used twice",
                vct.metadata.name
            ));
        }
    }
    Ok(())
}

/// The template's volume claim templates with the claim's merged in under the policy.
pub fn merge_volume_claim_templates(
    template: &[PersistentVolumeClaimTemplate],
    claim: &[PersistentVolumeClaimTemplate],
    policy: VolumeClaimTemplatesPolicy,
) -> Result<Vec<PersistentVolumeClaimTemplate>, String> {
    if claim.is_empty() {
        return Ok(template.to_vec());
    }
    validate_vct_names(claim)?;
    let mut merged = template.to_vec();
    match policy {
        VolumeClaimTemplatesPolicy::Disallowed => {
            return Err("the template's volumeClaimTemplatesPolicy is Disallowed: this claim may not set volumeClaimTemplates".to_owned());
        }
        VolumeClaimTemplatesPolicy::Allowed => {
            for vct in claim {
                if template
                    .iter()
                    .any(|t| t.metadata.name == vct.metadata.name)
                {
                    return Err(format!(
                        "volumeClaimTemplate {:?} is defined by the template; the Allowed policy does not permit overriding it",
                        vct.metadata.name
                    ));
                }
                merged.push(vct.clone());
            }
        }
        VolumeClaimTemplatesPolicy::Overrides => {
            for vct in claim {
                match merged
                    .iter_mut()
                    .find(|t| t.metadata.name == vct.metadata.name)
                {
                    Some(existing) => *existing = vct.clone(),
                    None => merged.push(vct.clone()),
                }
            }
        }
    }
    Ok(merged)
}

/// Why a claim cannot get a sandbox, as its `Ready` reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimProblem {
    /// The pool names a template that does not exist.
    TemplateNotFound(String),
    /// The claim names a pool that does not exist.
    WarmPoolNotFound,
    /// Another writer got to the chosen sandbox first (retried).
    AdoptionConflict(String),
    /// A sandbox was created and the cache has not shown it yet.
    CreatePending,
    /// `additionalPodMetadata` was rejected.
    InvalidMetadata(String),
    /// `env` was rejected.
    EnvRejected(String),
    /// `volumeClaimTemplates` were rejected.
    VolumeClaimTemplates(String),
    /// Any other failure.
    Error(String),
}

impl ClaimProblem {
    /// True for problems that will not go away without a change to the claim or template.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            Self::InvalidMetadata(_) | Self::EnvRejected(_) | Self::VolumeClaimTemplates(_)
        )
    }
}

/// The sandbox to create for a claim served cold: named after the claim, built from the
/// template with the claim's metadata, env and volumes merged under the template's policies.
pub fn cold_sandbox(
    claim: ValidatedClaim<'_>,
    template: &SandboxTemplate,
    dns: &DnsMode,
) -> Result<Sandbox, ClaimProblem> {
    let claim = claim.claim();
    let mut blueprint = template.spec.blueprint.clone();
    blueprint.pod_template.metadata = merge_pod_metadata(
        &blueprint.pod_template.metadata,
        &claim.spec.additional_pod_metadata,
    )
    .map_err(ClaimProblem::InvalidMetadata)?;
    blueprint.volume_claim_templates = merge_volume_claim_templates(
        &blueprint.volume_claim_templates,
        &claim.spec.volume_claim_templates,
        template.spec.volume_claim_templates_policy,
    )
    .map_err(ClaimProblem::VolumeClaimTemplates)?;
    inject_env(
        &mut blueprint.pod_template.spec,
        &claim.spec.env,
        template.spec.env_vars_injection_policy,
    )
    .map_err(ClaimProblem::EnvRejected)?;
    secure_defaults::apply(template, dns, &mut blueprint.pod_template.spec);

    let template_name = template.metadata.name.clone().unwrap_or_default();
    let mut sandbox_labels = BTreeMap::from([
        (labels::CLAIM_UID.to_owned(), claim_uid(claim).to_owned()),
        (
            labels::LAUNCH_TYPE.to_owned(),
            labels::LAUNCH_TYPE_COLD.to_owned(),
        ),
        (
            labels::SANDBOX_TEMPLATE_REF_HASH.to_owned(),
            name_hash(&template_name),
        ),
    ]);
    if let Some(created_by) = claim
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(labels::CREATED_BY))
    {
        sandbox_labels.insert(labels::CREATED_BY.to_owned(), created_by.clone());
    }
    let mut sandbox_annotations =
        BTreeMap::from([(annotations::SANDBOX_TEMPLATE_REF.to_owned(), template_name)]);
    if let Some(trace) = claim
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(annotations::TRACE_CONTEXT))
    {
        sandbox_annotations.insert(annotations::TRACE_CONTEXT.to_owned(), trace.clone());
    }
    Ok(Sandbox {
        metadata: ObjectMeta {
            name: claim.metadata.name.clone(),
            namespace: claim.metadata.namespace.clone(),
            labels: Some(sandbox_labels),
            annotations: Some(sandbox_annotations),
            owner_references: Some(vec![controller_reference(claim)]),
            ..ObjectMeta::default()
        },
        spec: agent_sandbox_api::SandboxSpec {
            blueprint,
            ..Default::default()
        },
        status: None,
    })
}

fn created(sandbox: &Sandbox) -> Timestamp {
    sandbox
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(Timestamp::UNIX_EPOCH, |t| t.0)
}

/// True when `sandbox` is an unclaimed member of `pool` that a claim may adopt.
pub fn is_candidate(sandbox: &Sandbox, pool: &SandboxWarmPool) -> bool {
    let Some(owner) = controller_of(&sandbox.metadata) else {
        return false;
    };
    let has_label = |key: &str| {
        sandbox
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(key))
    };
    owner.kind == kinds::SANDBOX_WARM_POOL
        && owner.uid == pool.metadata.uid.clone().unwrap_or_default()
        && sandbox.metadata.namespace == pool.metadata.namespace
        && sandbox.metadata.deletion_timestamp.is_none()
        && has_label(labels::WARM_POOL_SANDBOX)
        && has_label(labels::SANDBOX_TEMPLATE_REF_HASH)
}

/// What a claim does this pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pick {
    /// Adopt these candidates, in this order (the first write that succeeds wins).
    Adopt(Vec<String>),
    /// Wait this long for a member to become Ready, then pick again.
    Wait(Duration),
    /// Build a sandbox for this claim.
    Cold,
}

/// Chooses among `candidates` (members of the claim's pool, see [`is_candidate`]): Ready ones
/// first, oldest first; if only members still starting exist, wait up to `warm_wait` after the
/// claim's creation for one to become Ready, then take the oldest; with no members, go cold.
pub fn pick(
    claim: &SandboxClaim,
    pool: &SandboxWarmPool,
    template: Option<&SandboxTemplate>,
    candidates: &[&Sandbox],
    dns: &DnsMode,
    warm_wait: Duration,
    now: Timestamp,
) -> Pick {
    if needs_cold_start(claim) {
        return Pick::Cold;
    }
    let recreate = pool.spec.update_strategy_type() == UpdateStrategyType::Recreate;
    let mut usable: Vec<&Sandbox> = candidates
        .iter()
        .copied()
        .filter(|c| !(recreate && template.is_some_and(|t| is_stale(c, t, dns))))
        .collect();
    usable.sort_by(|a, b| {
        is_ready(b)
            .cmp(&is_ready(a))
            .then(created(a).cmp(&created(b)))
            .then(a.metadata.name.cmp(&b.metadata.name))
    });
    let names = |list: &[&Sandbox]| {
        list.iter()
            .filter_map(|c| c.metadata.name.clone())
            .collect::<Vec<_>>()
    };
    if usable.is_empty() {
        return Pick::Cold;
    }
    if usable.iter().any(|c| is_ready(c)) {
        let ready: Vec<&Sandbox> = usable.iter().copied().filter(|c| is_ready(c)).collect();
        return Pick::Adopt(names(&ready));
    }
    let claimed_at = claim
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(now, |t| t.0);
    match remaining(after(claimed_at, warm_wait), now) {
        Some(left) => Pick::Wait(left),
        None => Pick::Adopt(names(&usable)),
    }
}

/// The one write that gives `sandbox` to `claim`: conditional on the resourceVersion it was
/// chosen on; moves the controller reference; drops the pool labels; records the claim.
///
/// The pod template changes (and the pod is patched) only when the claim adds pod metadata or the
/// member carried the safe-to-evict annotation, so a plain warm claim does not touch the live
/// pod.
pub fn adoption_patch(sandbox: &Sandbox, claim: ValidatedClaim<'_>) -> Result<Value, ClaimProblem> {
    let claim = claim.claim();
    let sandbox_name = sandbox.metadata.name.clone().unwrap_or_default();
    let mut annotations_patch =
        Map::from_iter([(annotations::POD_NAME.to_owned(), json!(sandbox_name))]);
    if let Some(trace) = claim
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(annotations::TRACE_CONTEXT))
    {
        annotations_patch.insert(annotations::TRACE_CONTEXT.to_owned(), json!(trace));
    }
    let mut patch = json!({
        "metadata": {
            "resourceVersion": sandbox.metadata.resource_version,
            "ownerReferences": [controller_reference(claim)],
            "labels": {
                labels::WARM_POOL_SANDBOX: null,
                labels::SANDBOX_POD_TEMPLATE_HASH: null,
                labels::SANDBOX_TEMPLATE_HASH: null,
                labels::LAUNCH_TYPE: labels::LAUNCH_TYPE_WARM,
                labels::CLAIM_UID: claim_uid(claim),
            },
            "annotations": annotations_patch,
        }
    });

    let current = &sandbox.spec.blueprint.pod_template.metadata;
    let mut base = current.clone();
    base.annotations.remove(annotations::SAFE_TO_EVICT);
    let wanted = merge_pod_metadata(&base, &claim.spec.additional_pod_metadata)
        .map_err(ClaimProblem::InvalidMetadata)?;
    if &wanted != current {
        let diff = |have: &BTreeMap<String, String>, want: &BTreeMap<String, String>| {
            let mut map = Map::new();
            for (k, v) in want {
                if have.get(k) != Some(v) {
                    map.insert(k.clone(), json!(v));
                }
            }
            for k in have.keys().filter(|k| !want.contains_key(*k)) {
                map.insert(k.clone(), Value::Null);
            }
            map
        };
        let mut metadata = Map::new();
        let label_diff = diff(&current.labels, &wanted.labels);
        let annotation_diff = diff(&current.annotations, &wanted.annotations);
        if !label_diff.is_empty() {
            metadata.insert("labels".into(), Value::Object(label_diff));
        }
        if !annotation_diff.is_empty() {
            metadata.insert("annotations".into(), Value::Object(annotation_diff));
        }
        patch["spec"] = json!({"podTemplate": {"metadata": metadata}});
    }
    Ok(patch)
}

/// The claim's expiry: its own `lifecycle`, else its pool's `claimDefaults.lifecycle` (read at
/// each pass, so a default set on a pool reaches the claims it already served).
pub fn lifecycle(claim: &SandboxClaim, pool: Option<&SandboxWarmPool>) -> Option<ClaimLifecycle> {
    claim.spec.lifecycle.clone().or_else(|| {
        pool.and_then(|p| p.spec.claim_defaults.as_ref())
            .and_then(|d| d.lifecycle.as_ref())
            .map(ClaimLifecycle::from)
    })
}

/// When the claim expires: its `shutdownTime`, or `ttlSecondsAfterFinished` after its sandbox
/// finished, whichever is earlier (the claim's lifecycle or its pool's default, [`lifecycle`]).
pub fn expires_at(
    claim: &SandboxClaim,
    pool: Option<&SandboxWarmPool>,
    sandbox: Option<&Sandbox>,
) -> Option<Timestamp> {
    let lifecycle = lifecycle(claim, pool)?;
    let absolute = lifecycle.shutdown_time.as_ref().map(|t| t.0);
    let after_finish = lifecycle.ttl_seconds_after_finished.and_then(|ttl| {
        let finished = sandbox
            .and_then(|s| s.status.as_ref())
            .and_then(|status| find_condition(&status.conditions, sandbox_cond::FINISHED))
            .or_else(|| {
                claim
                    .status
                    .as_ref()
                    .and_then(|status| find_condition(&status.conditions, claim_cond::FINISHED))
            })
            .filter(|condition| condition.status == "True")?;
        let ttl = std::time::Duration::from_secs(u64::try_from(ttl).unwrap_or(0));
        Some(after(finished.last_transition_time.0, ttl))
    });
    match (absolute, after_finish) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The claim's shutdown policy (default `Retain`), from [`lifecycle`].
pub fn shutdown_policy(
    claim: &SandboxClaim,
    pool: Option<&SandboxWarmPool>,
) -> ClaimShutdownPolicy {
    lifecycle(claim, pool)
        .map(|l| l.shutdown_policy)
        .unwrap_or_default()
}

/// True when the claim's status already says it expired.
pub fn marked_expired(claim: &SandboxClaim) -> bool {
    claim
        .status
        .as_ref()
        .and_then(|status| find_condition(&status.conditions, claim_cond::READY))
        .is_some_and(|ready| ready.reason == claim_cond::REASON_CLAIM_EXPIRED)
}

fn ready_condition(
    claim: &SandboxClaim,
    sandbox: Option<&Sandbox>,
    problem: Option<&ClaimProblem>,
    expired: bool,
) -> Condition {
    let generation = claim.metadata.generation;
    let not_ready = |reason: &str, message: String| {
        condition(claim_cond::READY, false, reason, message, generation)
    };
    if let Some(problem) = problem {
        return match problem {
            ClaimProblem::TemplateNotFound(message) => {
                not_ready(claim_cond::REASON_TEMPLATE_NOT_FOUND, message.clone())
            }
            ClaimProblem::WarmPoolNotFound => not_ready(
                claim_cond::REASON_WARM_POOL_NOT_FOUND,
                format!(
                    "SandboxWarmPool {:?} not found",
                    claim.spec.warm_pool_ref.name
                ),
            ),
            ClaimProblem::AdoptionConflict(message) => not_ready(
                claim_cond::REASON_ADOPTION_CONFLICT,
                format!("{message}; the next pass retries from a converged view"),
            ),
            ClaimProblem::CreatePending => not_ready(
                claim_cond::REASON_SANDBOX_CREATE_PENDING,
                "Sandbox already created; waiting for cache to converge".into(),
            ),
            ClaimProblem::InvalidMetadata(message) => {
                not_ready(claim_cond::REASON_INVALID_METADATA, message.clone())
            }
            ClaimProblem::EnvRejected(message) => not_ready(
                claim_cond::REASON_ENV_VARS_INJECTION_REJECTED,
                message.clone(),
            ),
            ClaimProblem::VolumeClaimTemplates(message) => not_ready(
                claim_cond::REASON_VOLUME_CLAIM_TEMPLATES_ERROR,
                message.clone(),
            ),
            ClaimProblem::Error(message) => not_ready(
                claim_cond::REASON_RECONCILER_ERROR,
                format!("Error seen: {message}"),
            ),
        };
    }
    if expired {
        return not_ready(
            claim_cond::REASON_CLAIM_EXPIRED,
            "Claim expired. Sandbox cleanup initiated.".into(),
        );
    }
    let Some(sandbox) = sandbox else {
        return not_ready(
            claim_cond::REASON_SANDBOX_MISSING,
            "Sandbox does not exist".into(),
        );
    };
    let conditions = sandbox
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    match find_condition(conditions, sandbox_cond::READY) {
        Some(ready) if ready.reason == sandbox_cond::REASON_EXPIRED => not_ready(
            claim_cond::REASON_SANDBOX_EXPIRED,
            "Underlying Sandbox resource has expired independently of the Claim.".into(),
        ),
        Some(ready) => {
            let mut copy = ready.clone();
            copy.observed_generation = generation;
            copy
        }
        None => not_ready(
            claim_cond::REASON_SANDBOX_NOT_READY,
            "Sandbox is not ready".into(),
        ),
    }
}

/// The claim's status after a pass that found `sandbox` (or not) and hit `problem` (or not).
pub fn status(
    claim: &SandboxClaim,
    sandbox: Option<&Sandbox>,
    problem: Option<&ClaimProblem>,
    expired: bool,
    now: Timestamp,
) -> SandboxClaimStatus {
    let mut status = claim.status.clone().unwrap_or_default();
    if matches!(problem, Some(ClaimProblem::CreatePending)) && !status.sandbox.name.is_empty() {
        return status;
    }
    set_condition(
        &mut status.conditions,
        ready_condition(claim, sandbox, problem, expired),
        now,
    );
    match sandbox {
        Some(sandbox) => {
            let finished = sandbox
                .status
                .as_ref()
                .and_then(|s| find_condition(&s.conditions, sandbox_cond::FINISHED))
                .cloned();
            match finished {
                Some(finished) => set_condition(&mut status.conditions, finished, now),
                None => remove_condition(&mut status.conditions, claim_cond::FINISHED),
            }
            status.sandbox = ClaimedSandbox {
                name: sandbox.metadata.name.clone().unwrap_or_default(),
                pod_ips: sandbox
                    .status
                    .as_ref()
                    .map(|s| s.pod_ips.clone())
                    .unwrap_or_default(),
                service_fqdn: sandbox
                    .status
                    .as_ref()
                    .map(|s| s.service_fqdn.clone())
                    .unwrap_or_default(),
            };
        }
        None => {
            if !expired {
                remove_condition(&mut status.conditions, claim_cond::FINISHED);
            }
            if problem.is_none() {
                status.sandbox = ClaimedSandbox::default();
            }
        }
    }
    status
}

/// How long a pass waits before looking again after every candidate went to a concurrent claim.
pub const CONFLICT_RETRY: Duration = Duration::from_millis(50);
/// How often a claim whose pool or template is missing is looked at again (watches also wake it).
pub const MISSING_RETRY: Duration = Duration::from_secs(60);
/// How many candidates one pass tries to adopt before giving up.
pub const ADOPTION_ATTEMPTS: usize = 3;
/// Added to the time left before expiry, so that the pass it schedules finds the claim expired.
const EXPIRY_SLACK: Duration = Duration::from_millis(5);

/// What one pass over a claim found, read before anything is decided: from the caches, and for a
/// sandbox the caches miss, from the API.
#[derive(Clone, Copy, Debug)]
pub struct Observed<'a> {
    /// The claim, with the freshest status this controller knows of.
    pub claim: &'a SandboxClaim,
    /// The sandbox the claim controls, if any.
    pub sandbox: Option<&'a Sandbox>,
    /// The pool the claim names, if it exists.
    pub pool: Option<&'a SandboxWarmPool>,
    /// The pool's template, if it exists.
    pub template: Option<&'a SandboxTemplate>,
    /// Members of the pool a claim may adopt ([`is_candidate`]) that no other pass holds.
    pub candidates: &'a [&'a Sandbox],
    /// The time of the pass.
    pub now: Timestamp,
}

/// The controller settings a claim pass follows.
#[derive(Clone, Copy, Debug)]
pub struct ClaimPolicy<'a> {
    /// DNS of sandboxes in the secure network mode (for cold sandboxes and staleness).
    pub dns: &'a DnsMode,
    /// Label domains a claim's `additionalPodMetadata` may use.
    pub allowed_label_domains: &'a [String],
    /// How long a claim waits for a starting member before adopting it anyway.
    pub warm_wait: Duration,
    /// Whether the claim's own Events (`ClaimExpired`) are emitted.
    pub claim_events: bool,
}

/// One pass's decision: its writes, in order, and when to look again.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan<'a> {
    /// What the pass writes.
    pub step: Step<'a>,
    /// The claim expires in this long: the next pass comes by then whatever the step says.
    pub expires_in: Option<Duration>,
}

/// What a pass writes. Where a write can lose to another writer (adoption, creation), the step
/// names what follows each outcome.
#[derive(Clone, Debug, PartialEq)]
pub enum Step<'a> {
    /// Write this status (`None`: it is unchanged, no write); look again after `retry`, if any.
    Report {
        /// The new status.
        status: Option<SandboxClaimStatus>,
        /// When to look again (beyond the watches).
        retry: Option<Duration>,
    },
    /// The claim holds `sandbox`: write the status mirroring it (`None`: unchanged), then observe
    /// the startup latency if the sandbox has just become Ready.
    Hold {
        /// The claim's sandbox.
        sandbox: &'a Sandbox,
        /// The new status.
        status: Option<SandboxClaimStatus>,
    },
    /// Members are still starting: no writes, look again after this long.
    Wait(Duration),
    /// Adopt the first of these members whose conditional write lands, then emit the
    /// `SandboxAdopted` Event and write the status mirroring it ([`held_status`]). When none
    /// lands, look again after [`CONFLICT_RETRY`] with a fresher cache.
    Adopt {
        /// The attempts, in order.
        adoptions: Vec<Adoption<'a>>,
        /// The pool's template, for the creation metric.
        template: String,
    },
    /// Create `sandbox`, then emit the `SandboxProvisioned` Event with `note` and write the status
    /// mirroring it ([`held_status`]). When a sandbox of that name exists that the claim does not
    /// control, write [`clash_status`] and look again after [`MISSING_RETRY`].
    Create {
        /// The cold sandbox.
        sandbox: Box<Sandbox>,
        /// Its template, for the creation metric.
        template: String,
        /// The Event's note.
        note: String,
    },
    /// The claim's lifetime is over.
    Expire(ExpiryWrites),
}

/// One adoption attempt: the member and the conditional write that moves it to the claim.
#[derive(Clone, Debug, PartialEq)]
pub struct Adoption<'a> {
    /// The member.
    pub member: &'a Sandbox,
    /// The merge patch ([`adoption_patch`]).
    pub patch: Value,
    /// The `SandboxAdopted` Event's note.
    pub note: String,
}

/// The writes of an expired claim, in order: mark it (status, then Event), then delete.
#[derive(Clone, Debug, PartialEq)]
pub struct ExpiryWrites {
    /// The status marking the claim expired (`None`: already marked, or unchanged).
    pub mark: Option<SandboxClaimStatus>,
    /// The `ClaimExpired` Event's note, when the claim is newly marked and claim Events are on.
    pub event: Option<String>,
    /// What is deleted.
    pub delete: ExpiryDelete,
}

/// What an expired claim's shutdown policy deletes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExpiryDelete {
    /// The claim itself (and, through the garbage collector, its sandbox), in the foreground
    /// (`DeleteForeground`) or the background (`Delete`); conditional on the claim's UID.
    Claim {
        /// Foreground propagation.
        foreground: bool,
    },
    /// Only its sandbox (`Retain`), conditional on the sandbox's UID; the claim stays, expired.
    Sandbox {
        /// The sandbox's name.
        name: String,
        /// The sandbox's UID.
        uid: Option<String>,
    },
    /// Nothing (`Retain` with no sandbox left).
    Nothing,
}

/// `status`, unless the claim already has it (an absent status counts as the default one).
pub fn changed_status(
    claim: &SandboxClaim,
    status: SandboxClaimStatus,
) -> Option<SandboxClaimStatus> {
    let unchanged = claim.status.as_ref() == Some(&status)
        || (claim.status.is_none() && status == SandboxClaimStatus::default());
    (!unchanged).then_some(status)
}

/// The status write after the claim got `sandbox` (adopted or created), if the status changes.
pub fn held_status(
    claim: &SandboxClaim,
    sandbox: &Sandbox,
    now: Timestamp,
) -> Option<SandboxClaimStatus> {
    changed_status(claim, status(claim, Some(sandbox), None, false, now))
}

/// The status write after the cold sandbox's name turned out to be taken by a sandbox the claim
/// does not control.
pub fn clash_status(claim: &SandboxClaim, now: Timestamp) -> Option<SandboxClaimStatus> {
    let problem = ClaimProblem::AdoptionConflict(format!(
        "a Sandbox named {} exists and is not controlled by this claim",
        claim.metadata.name.as_deref().unwrap_or_default()
    ));
    changed_status(claim, status(claim, None, Some(&problem), false, now))
}

/// The merge patch of the claim's annotations upstream's controller writes, with only the keys
/// the claim lacks (or holds with another value); `None` when it has them all.
///
/// - `agents.x-k8s.io/sandbox-name`: the sandbox the claim holds, when it is not named after the
///   claim (an adopted warm member); a cold sandbox carries the claim's name, and upstream writes
///   nothing for it either.
/// - `agents.x-k8s.io/controller-first-observed-at`: when this controller first saw the claim, in
///   RFC 3339 with nanoseconds, unless `observability` is off
///   (`--disable-claim-observability-annotations`). An existing value is never replaced.
pub fn annotation_patch(
    claim: &SandboxClaim,
    sandbox: Option<&str>,
    first_observed: Timestamp,
    observability: bool,
) -> Option<Value> {
    let current = claim.metadata.annotations.as_ref();
    let has = |key: &str| current.and_then(|all| all.get(key));
    let mut missing = Map::new();
    if let Some(name) = sandbox
        && Some(name) != claim.metadata.name.as_deref()
        && has(annotations::SANDBOX_NAME).map(String::as_str) != Some(name)
    {
        missing.insert(annotations::SANDBOX_NAME.to_owned(), json!(name));
    }
    if observability && has(annotations::CONTROLLER_FIRST_OBSERVED_AT).is_none() {
        missing.insert(
            annotations::CONTROLLER_FIRST_OBSERVED_AT.to_owned(),
            json!(first_observed.to_string()),
        );
    }
    (!missing.is_empty()).then(|| json!({ "metadata": { "annotations": missing } }))
}

/// When the controller first observed the claim, by its `controller-first-observed-at`
/// annotation (written by us or by upstream's controller, also before a restart), if it holds a
/// valid time.
pub fn recorded_first_observed(claim: &SandboxClaim) -> Option<Timestamp> {
    claim
        .metadata
        .annotations
        .as_ref()?
        .get(annotations::CONTROLLER_FIRST_OBSERVED_AT)?
        .parse()
        .ok()
}

/// The sooner of a step's own `retry` and the claim's expiry: when the next pass must come.
pub fn requeue_after(retry: Option<Duration>, expires_in: Option<Duration>) -> Option<Duration> {
    match (retry, expires_in) {
        (Some(retry), Some(expiry)) => Some(retry.min(expiry)),
        (one, other) => one.or(other),
    }
}

/// Decides one pass over a claim. Expiry comes first (it must find and remove an adopted sandbox
/// too); then a claim that holds its sandbox mirrors it; else the pool and its template decide
/// how to get one, after the claim's pod metadata is validated (once).
pub fn plan<'a>(observed: &Observed<'a>, policy: &ClaimPolicy<'_>) -> Plan<'a> {
    let Observed {
        claim,
        sandbox,
        pool,
        now,
        ..
    } = *observed;
    let expires_at = expires_at(claim, pool, sandbox);
    if expires_at.is_some_and(|at| remaining(at, now).is_none()) {
        return Plan {
            step: Step::Expire(expiry(claim, pool, sandbox, policy, now)),
            expires_in: None,
        };
    }
    Plan {
        step: serve(observed, policy),
        expires_in: expires_at
            .and_then(|at| remaining(at, now))
            .map(|left| left.saturating_add(EXPIRY_SLACK)),
    }
}

fn serve<'a>(observed: &Observed<'a>, policy: &ClaimPolicy<'_>) -> Step<'a> {
    let Observed {
        claim,
        sandbox,
        pool,
        template,
        candidates,
        now,
    } = *observed;
    let report = |problem: ClaimProblem, retry: Option<Duration>| Step::Report {
        status: changed_status(claim, status(claim, None, Some(&problem), false, now)),
        retry,
    };
    if let Some(sandbox) = sandbox {
        return Step::Hold {
            sandbox,
            status: held_status(claim, sandbox, now),
        };
    }
    let Some(pool) = pool else {
        return report(ClaimProblem::WarmPoolNotFound, Some(MISSING_RETRY));
    };
    let valid = match ValidatedClaim::new(claim, policy.allowed_label_domains) {
        Ok(valid) => valid,
        Err(message) => return report(ClaimProblem::InvalidMetadata(message), None),
    };
    let template_name = pool.spec.sandbox_template_ref.name.clone();
    let idle = idle_lifecycle(claim, Some(pool), template);
    match pick(
        claim,
        pool,
        template,
        candidates,
        policy.dns,
        policy.warm_wait,
        now,
    ) {
        Pick::Wait(after) => Step::Wait(after),
        Pick::Adopt(names) => Step::Adopt {
            adoptions: adoptions(valid, candidates, &names)
                .into_iter()
                .map(|mut adoption| {
                    adoption.patch = with_idle_lifecycle(adoption.patch, idle.as_ref(), now);
                    adoption
                })
                .collect(),
            template: template_name,
        },
        Pick::Cold => {
            let Some(template) = template else {
                let problem = ClaimProblem::TemplateNotFound(format!(
                    "SandboxTemplate {template_name:?} not found"
                ));
                return report(problem, Some(MISSING_RETRY));
            };
            match cold_sandbox(valid, template, policy.dns) {
                Ok(mut sandbox) => Step::Create {
                    note: format!(
                        "created Sandbox {} from SandboxTemplate {template_name}",
                        sandbox.metadata.name.as_deref().unwrap_or_default()
                    ),
                    sandbox: Box::new({
                        sandbox.spec.idle_lifecycle = idle;
                        sandbox
                    }),
                    template: template_name,
                },
                Err(problem) => report(problem, None),
            }
        }
    }
}

/// The idle lifecycle of the claim's sandbox: the claim's own, else its pool's
/// `claimDefaults`, else its template's.
pub fn idle_lifecycle(
    claim: &SandboxClaim,
    pool: Option<&SandboxWarmPool>,
    template: Option<&SandboxTemplate>,
) -> Option<IdleLifecycle> {
    claim
        .spec
        .idle_lifecycle
        .clone()
        .or_else(|| {
            pool.and_then(|p| p.spec.claim_defaults.as_ref())
                .and_then(|d| d.idle_lifecycle.clone())
        })
        .or_else(|| template.and_then(|t| t.spec.idle_lifecycle.clone()))
}

/// An adoption patch that also sets the adopted sandbox's idle lifecycle (when there is one)
/// and starts its idle clock at `now` ([`annotations::ACTIVE_SINCE`]): the time it sat in the
/// pool does not count.
pub fn with_idle_lifecycle(
    mut patch: Value,
    idle: Option<&IdleLifecycle>,
    now: Timestamp,
) -> Value {
    let Some(idle) = idle else {
        return patch;
    };
    patch["metadata"]["annotations"][annotations::ACTIVE_SINCE] = json!(now.to_string());
    patch["spec"]["idleLifecycle"] = serde_json::to_value(idle).unwrap_or(Value::Null);
    patch
}

/// The first [`ADOPTION_ATTEMPTS`] of the picked `names` with their writes; a member whose pod
/// metadata conflicts with the claim's is skipped (it counts as an attempt).
fn adoptions<'a>(
    claim: ValidatedClaim<'_>,
    candidates: &[&'a Sandbox],
    names: &[String],
) -> Vec<Adoption<'a>> {
    names
        .iter()
        .take(ADOPTION_ATTEMPTS)
        .filter_map(|name| {
            let member = *candidates
                .iter()
                .find(|candidate| candidate.metadata.name.as_ref() == Some(name))?;
            let patch = adoption_patch(member, claim).ok()?;
            Some(Adoption {
                member,
                patch,
                note: format!(
                    "adopted warm Sandbox {name} from SandboxWarmPool {}",
                    claim.claim().spec.warm_pool_ref.name
                ),
            })
        })
        .collect()
}

/// The writes of an expired claim: mark it (once), then carry out its shutdown policy.
fn expiry(
    claim: &SandboxClaim,
    pool: Option<&SandboxWarmPool>,
    sandbox: Option<&Sandbox>,
    policy: &ClaimPolicy<'_>,
    now: Timestamp,
) -> ExpiryWrites {
    let newly = !marked_expired(claim);
    let shutdown = shutdown_policy(claim, pool);
    ExpiryWrites {
        mark: newly
            .then(|| changed_status(claim, status(claim, None, None, true, now)))
            .flatten(),
        event: (newly && policy.claim_events)
            .then(|| format!("claim lifecycle expired; shutdownPolicy is {shutdown:?}")),
        delete: match (shutdown, sandbox) {
            (ClaimShutdownPolicy::Delete, _) => ExpiryDelete::Claim { foreground: false },
            (ClaimShutdownPolicy::DeleteForeground, _) => ExpiryDelete::Claim { foreground: true },
            (ClaimShutdownPolicy::Retain, Some(sandbox)) => ExpiryDelete::Sandbox {
                name: sandbox.metadata.name.clone().unwrap_or_default(),
                uid: sandbox.metadata.uid.clone(),
            },
            (ClaimShutdownPolicy::Retain, None) => ExpiryDelete::Nothing,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::fixtures::{now, pod_spec, sandbox};
    use crate::decide::warm_pool::{MemberSettings, member};
    use agent_sandbox_api::claim::SandboxWarmPoolRef;
    use agent_sandbox_api::sandbox::{
        EmbeddedObjectMetadata, PodTemplate, SandboxBlueprint, SandboxStatus,
    };
    use agent_sandbox_api::warm_pool::SandboxTemplateRef;
    use agent_sandbox_api::{SandboxClaimSpec, SandboxTemplateSpec, SandboxWarmPoolSpec};
    use k8s_openapi::api::core::v1::EnvFromSource;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use pretty_assertions::assert_eq;

    fn dns() -> DnsMode {
        DnsMode::Public(vec!["8.8.8.8".into()])
    }

    fn allowed() -> Vec<String> {
        vec!["sandbox.users.io".into()]
    }

    fn valid(claim: &SandboxClaim) -> ValidatedClaim<'_> {
        ValidatedClaim::new(claim, &allowed()).unwrap()
    }

    fn template() -> SandboxTemplate {
        let mut t = SandboxTemplate::new(
            "python",
            SandboxTemplateSpec {
                blueprint: SandboxBlueprint {
                    pod_template: PodTemplate {
                        spec: pod_spec(),
                        ..PodTemplate::default()
                    },
                    ..SandboxBlueprint::default()
                },
                ..SandboxTemplateSpec::default()
            },
        );
        t.metadata.namespace = Some("default".into());
        t
    }

    fn pool() -> SandboxWarmPool {
        let mut p = SandboxWarmPool::new(
            "pool",
            SandboxWarmPoolSpec {
                replicas: 2,
                sandbox_template_ref: SandboxTemplateRef {
                    name: "python".into(),
                },
                update_strategy: None,
                claim_defaults: None,
            },
        );
        p.metadata.namespace = Some("default".into());
        p.metadata.uid = Some("pool-uid".into());
        p
    }

    fn claim(age_secs: i64) -> SandboxClaim {
        let mut c = SandboxClaim::new(
            "claim-a",
            SandboxClaimSpec {
                warm_pool_ref: SandboxWarmPoolRef {
                    name: "pool".into(),
                },
                ..SandboxClaimSpec::default()
            },
        );
        c.metadata.namespace = Some("default".into());
        c.metadata.uid = Some("claim-uid".into());
        c.metadata.generation = Some(1);
        c.metadata.labels = Some(BTreeMap::from([(
            labels::CREATED_BY.into(),
            "rust-client".into(),
        )]));
        c.metadata.creation_timestamp = Some(Time(
            now() - k8s_openapi::jiff::SignedDuration::from_secs(age_secs),
        ));
        c
    }

    fn warm(name: &str, age_secs: i64, ready: bool) -> Sandbox {
        let mut m = member(
            &pool(),
            &template(),
            &MemberSettings {
                dns: dns(),
                safe_to_evict: false,
            },
        );
        m.metadata.name = Some(name.into());
        m.metadata.resource_version = Some("42".into());
        m.metadata.creation_timestamp = Some(Time(
            now() - k8s_openapi::jiff::SignedDuration::from_secs(age_secs),
        ));
        let mut status = SandboxStatus::default();
        set_condition(
            &mut status.conditions,
            condition("Ready", ready, "DependenciesReady", "Pod is Ready", Some(1)),
            now(),
        );
        status.pod_ips = vec!["127.1.2.3".into()];
        m.status = Some(status);
        m
    }

    #[test]
    fn metadata_validation_matches_upstream_rules() {
        let ok = PodMetadata {
            labels: BTreeMap::from([
                ("sandbox.users.io/session".into(), "abc".into()),
                ("team.sandbox.users.io/x".into(), "y".into()),
            ]),
            annotations: BTreeMap::from([
                (annotations::SAFE_TO_EVICT.into(), "false".into()),
                ("example.com/note".into(), "hi there".into()),
            ]),
        };
        assert_eq!(validate_additional_pod_metadata(&ok, &allowed()), Ok(()));
        let bad = |labels: &[(&str, &str)], annotations: &[(&str, &str)]| {
            let meta = PodMetadata {
                labels: labels
                    .iter()
                    .map(|(k, v)| ((*k).into(), (*v).into()))
                    .collect(),
                annotations: annotations
                    .iter()
                    .map(|(k, v)| ((*k).into(), (*v).into()))
                    .collect(),
            };
            validate_additional_pod_metadata(&meta, &allowed()).unwrap_err()
        };
        assert!(bad(&[("team", "a")], &[]).contains("must have a domain prefix"));
        assert!(bad(&[("example.com/x", "a")], &[]).contains("not in the allowlist"));
        assert!(bad(&[("app", "sandbox-router")], &[]).contains("restricted system label value"));
        assert!(bad(&[("sandbox.users.io/x", "not valid!")], &[]).contains("invalid label value"));
        assert!(
            bad(&[], &[("agents.x-k8s.io/pod-name", "x")]).contains("restricted system domain")
        );
        assert!(bad(&[], &[("node.kubernetes.io/x", "x")]).contains("restricted system domain"));
    }

    #[test]
    fn env_injection_follows_the_policy() {
        let var = |name: &str| EnvVar {
            name: name.into(),
            value: "1".into(),
            container_name: String::new(),
        };
        let mut spec = pod_spec();
        spec.containers[0].env = Some(vec![KEnvVar {
            name: "EXISTING".into(),
            value: Some("0".into()),
            value_from: None,
        }]);
        assert!(
            inject_env(
                &mut spec.clone(),
                &[var("NEW")],
                EnvVarsInjectionPolicy::Disallowed
            )
            .unwrap_err()
            .contains("Disallowed")
        );
        let mut allowed_spec = spec.clone();
        inject_env(
            &mut allowed_spec,
            &[var("NEW")],
            EnvVarsInjectionPolicy::Allowed,
        )
        .unwrap();
        assert_eq!(allowed_spec.containers[0].env.as_ref().unwrap().len(), 2);
        assert!(
            inject_env(
                &mut spec.clone(),
                &[var("EXISTING")],
                EnvVarsInjectionPolicy::Allowed
            )
            .unwrap_err()
            .contains("override")
        );
        let mut overridden = spec.clone();
        inject_env(
            &mut overridden,
            &[var("EXISTING")],
            EnvVarsInjectionPolicy::Overrides,
        )
        .unwrap();
        assert_eq!(
            overridden.containers[0].env.as_ref().unwrap()[0]
                .value
                .as_deref(),
            Some("1")
        );
        let unknown = EnvVar {
            name: "X".into(),
            value: "1".into(),
            container_name: "nope".into(),
        };
        assert!(
            inject_env(
                &mut spec.clone(),
                &[unknown],
                EnvVarsInjectionPolicy::Overrides
            )
            .unwrap_err()
            .contains("no container")
        );
        let mut env_from = spec.clone();
        env_from.containers[0].env_from = Some(vec![EnvFromSource::default()]);
        assert!(
            inject_env(
                &mut env_from,
                &[var("NEW")],
                EnvVarsInjectionPolicy::Allowed
            )
            .unwrap_err()
            .contains("EnvFrom")
        );
    }

    #[test]
    fn volume_claim_template_merges() {
        let vct = |name: &str, size: &str| PersistentVolumeClaimTemplate {
            metadata: EmbeddedObjectMetadata {
                name: name.into(),
                ..Default::default()
            },
            spec: k8s_openapi::api::core::v1::PersistentVolumeClaimSpec {
                storage_class_name: Some(size.into()),
                ..Default::default()
            },
        };
        let base = vec![vct("data", "a")];
        assert_eq!(
            merge_volume_claim_templates(&base, &[], VolumeClaimTemplatesPolicy::Disallowed)
                .unwrap(),
            base
        );
        assert!(
            merge_volume_claim_templates(
                &base,
                &[vct("x", "b")],
                VolumeClaimTemplatesPolicy::Disallowed
            )
            .is_err()
        );
        assert_eq!(
            merge_volume_claim_templates(
                &base,
                &[vct("x", "b")],
                VolumeClaimTemplatesPolicy::Allowed
            )
            .unwrap()
            .len(),
            2
        );
        assert!(
            merge_volume_claim_templates(
                &base,
                &[vct("data", "b")],
                VolumeClaimTemplatesPolicy::Allowed
            )
            .is_err()
        );
        let over = merge_volume_claim_templates(
            &base,
            &[vct("data", "b")],
            VolumeClaimTemplatesPolicy::Overrides,
        )
        .unwrap();
        assert_eq!(over, vec![vct("data", "b")]);
        assert!(
            merge_volume_claim_templates(
                &base,
                &[vct("", "b")],
                VolumeClaimTemplatesPolicy::Overrides
            )
            .is_err()
        );
        assert!(
            merge_volume_claim_templates(
                &base,
                &[vct("y", "b"), vct("y", "c")],
                VolumeClaimTemplatesPolicy::Overrides
            )
            .is_err()
        );
    }

    #[test]
    fn cold_sandbox_is_named_after_the_claim_and_owned_by_it() {
        let mut c = claim(0);
        c.spec.env = vec![EnvVar {
            name: "TASK".into(),
            value: "42".into(),
            container_name: String::new(),
        }];
        let mut t = template();
        t.spec.env_vars_injection_policy = EnvVarsInjectionPolicy::Allowed;
        let sb = cold_sandbox(valid(&c), &t, &dns()).unwrap();
        assert_eq!(sb.metadata.name.as_deref(), Some("claim-a"));
        let l = sb.metadata.labels.clone().unwrap();
        assert_eq!(l[labels::LAUNCH_TYPE], "cold");
        assert_eq!(l[labels::CLAIM_UID], "claim-uid");
        assert_eq!(l[labels::CREATED_BY], "rust-client");
        assert_eq!(
            sb.metadata.owner_references.as_ref().unwrap()[0].kind,
            kinds::SANDBOX_CLAIM
        );
        let env = sb.spec.blueprint.pod_template.spec.containers[0]
            .env
            .clone()
            .unwrap();
        assert_eq!(env[0].name, "TASK");
        assert_eq!(
            sb.spec
                .blueprint
                .pod_template
                .spec
                .automount_service_account_token,
            Some(false)
        );
        let rejected = cold_sandbox(valid(&c), &template(), &dns()).unwrap_err();
        assert!(matches!(rejected, ClaimProblem::EnvRejected(_)));
    }

    #[test]
    fn picks_ready_members_first_oldest_first() {
        let (a, b, c) = (
            warm("a", 30, false),
            warm("b", 20, true),
            warm("c", 40, true),
        );
        let chosen = pick(
            &claim(0),
            &pool(),
            Some(&template()),
            &[&a, &b, &c],
            &dns(),
            Duration::from_secs(2),
            now(),
        );
        assert_eq!(chosen, Pick::Adopt(vec!["c".into(), "b".into()]));
    }

    #[test]
    fn waits_for_starting_members_then_takes_the_oldest() {
        let (a, b) = (warm("a", 30, false), warm("b", 40, false));
        let fresh = pick(
            &claim(0),
            &pool(),
            Some(&template()),
            &[&a, &b],
            &dns(),
            Duration::from_secs(2),
            now(),
        );
        assert_eq!(fresh, Pick::Wait(Duration::from_secs(2)));
        let late = pick(
            &claim(3),
            &pool(),
            Some(&template()),
            &[&a, &b],
            &dns(),
            Duration::from_secs(2),
            now(),
        );
        assert_eq!(late, Pick::Adopt(vec!["b".into(), "a".into()]));
        assert_eq!(
            pick(
                &claim(0),
                &pool(),
                Some(&template()),
                &[],
                &dns(),
                Duration::from_secs(2),
                now()
            ),
            Pick::Cold
        );
        let mut with_env = claim(0);
        with_env.spec.env = vec![EnvVar::default()];
        assert_eq!(
            pick(
                &with_env,
                &pool(),
                Some(&template()),
                &[&a],
                &dns(),
                Duration::from_secs(2),
                now()
            ),
            Pick::Cold
        );
    }

    #[test]
    fn candidates_belong_to_the_pool_and_are_not_deleting() {
        let m = warm("a", 1, true);
        assert!(is_candidate(&m, &pool()));
        let mut deleting = m.clone();
        deleting.metadata.deletion_timestamp = Some(Time(now()));
        assert!(!is_candidate(&deleting, &pool()));
        let mut other_pool = pool();
        other_pool.metadata.uid = Some("other".into());
        assert!(!is_candidate(&m, &other_pool));
        assert!(!is_candidate(&sandbox("plain"), &pool()));
    }

    #[test]
    fn plain_adoption_touches_metadata_only() {
        let m = warm("pool-x1", 10, true);
        let patch = adoption_patch(&m, valid(&claim(0))).unwrap();
        assert_eq!(
            patch,
            json!({"metadata": {
                "resourceVersion": "42",
                "ownerReferences": [{"apiVersion": agent_sandbox_api::EXTENSIONS_API_VERSION, "kind": kinds::SANDBOX_CLAIM,
                    "name": "claim-a", "uid": "claim-uid", "controller": true, "blockOwnerDeletion": true}],
                "labels": {
                    "agents.x-k8s.io/warm-pool-sandbox": null,
                    "agents.x-k8s.io/sandbox-pod-template-hash": null,
                    "agents.x-k8s.io/sandbox-template-hash": null,
                    "agents.x-k8s.io/launch-type": "warm",
                    "agents.x-k8s.io/claim-uid": "claim-uid",
                },
                "annotations": {"agents.x-k8s.io/pod-name": "pool-x1"},
            }})
        );
    }

    #[test]
    fn adoption_with_pod_metadata_or_evictable_member_patches_the_pod_template() {
        let mut m = warm("pool-x1", 10, true);
        m.spec
            .blueprint
            .pod_template
            .metadata
            .annotations
            .insert(annotations::SAFE_TO_EVICT.into(), "true".into());
        let mut c = claim(0);
        c.spec
            .additional_pod_metadata
            .labels
            .insert("sandbox.users.io/session".into(), "s1".into());
        let patch = adoption_patch(&m, valid(&c)).unwrap();
        assert_eq!(
            patch["spec"],
            json!({"podTemplate": {"metadata": {
                "labels": {"sandbox.users.io/session": "s1"},
                "annotations": {annotations::SAFE_TO_EVICT: null},
            }}})
        );
    }

    #[test]
    fn expiry_takes_the_earlier_of_the_two_deadlines() {
        let mut c = claim(0);
        assert_eq!(expires_at(&c, None, None), None);
        let at: Timestamp = "2026-11-29T12:10:00Z".parse().unwrap();
        c.spec.lifecycle = Some(ClaimLifecycle {
            shutdown_time: Some(Time(at)),
            ttl_seconds_after_finished: Some(60),
            shutdown_policy: ClaimShutdownPolicy::Delete,
        });
        assert_eq!(expires_at(&c, None, None), Some(at));
        let mut finished = warm("x", 1, false);
        set_condition(
            &mut finished.status.as_mut().unwrap().conditions,
            condition("Finished", true, "PodSucceeded", "", Some(1)),
            now(),
        );
        assert_eq!(
            expires_at(&c, None, Some(&finished)),
            Some("2026-11-29T12:01:00Z".parse().unwrap())
        );
        assert_eq!(shutdown_policy(&c, None), ClaimShutdownPolicy::Delete);
    }

    #[test]
    fn a_claim_without_a_lifecycle_takes_its_pools_default_and_its_own_wins() {
        use agent_sandbox_api::claim::{ClaimDefaults, DefaultClaimLifecycle};
        let mut finished = warm("x", 1, false);
        set_condition(
            &mut finished.status.as_mut().unwrap().conditions,
            condition("Finished", true, "PodSucceeded", "", Some(1)),
            now(),
        );
        let mut p = pool();
        assert_eq!(expires_at(&claim(0), Some(&p), Some(&finished)), None);
        assert_eq!(
            shutdown_policy(&claim(0), Some(&p)),
            ClaimShutdownPolicy::Retain
        );
        p.spec.claim_defaults = Some(ClaimDefaults {
            lifecycle: Some(DefaultClaimLifecycle {
                ttl_seconds_after_finished: Some(300),
                shutdown_policy: ClaimShutdownPolicy::Delete,
            }),
            idle_lifecycle: None,
        });
        let c = claim(0);
        assert_eq!(
            expires_at(&c, Some(&p), Some(&finished)),
            Some("2026-11-29T12:05:00Z".parse().unwrap())
        );
        assert_eq!(shutdown_policy(&c, Some(&p)), ClaimShutdownPolicy::Delete);
        // Expired by the default: the claim goes, as its policy says.
        let observed = Observed {
            claim: &c,
            sandbox: Some(&finished),
            pool: Some(&p),
            template: None,
            candidates: &[],
            now: "2026-11-29T12:06:00Z".parse().unwrap(),
        };
        let (dns, allowed) = (dns(), allowed());
        let plan = plan(&observed, &policy(&dns, &allowed));
        assert!(
            matches!(&plan.step, Step::Expire(writes) if writes.delete == ExpiryDelete::Claim { foreground: false }),
            "{plan:?}"
        );
        // The claim's own lifecycle wins over the default.
        let mut own = claim(0);
        own.spec.lifecycle = Some(ClaimLifecycle::default());
        assert_eq!(expires_at(&own, Some(&p), Some(&finished)), None);
        assert_eq!(shutdown_policy(&own, Some(&p)), ClaimShutdownPolicy::Retain);
    }

    #[test]
    fn status_mirrors_the_sandbox() {
        let mut m = warm("pool-x1", 10, true);
        m.status.as_mut().unwrap().service_fqdn = "pool-x1.default.svc.cluster.local".into();
        let s = status(&claim(0), Some(&m), None, false, now());
        assert_eq!(
            s.sandbox,
            ClaimedSandbox {
                name: "pool-x1".into(),
                pod_ips: vec!["127.1.2.3".into()],
                service_fqdn: "pool-x1.default.svc.cluster.local".into(),
            }
        );
        let ready = find_condition(&s.conditions, claim_cond::READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("True", "DependenciesReady")
        );
        let missing = status(
            &claim(0),
            None,
            Some(&ClaimProblem::WarmPoolNotFound),
            false,
            now(),
        );
        let ready = find_condition(&missing.conditions, claim_cond::READY).unwrap();
        assert_eq!(
            (ready.reason.as_str(), ready.message.as_str()),
            ("WarmPoolNotFound", "SandboxWarmPool \"pool\" not found")
        );
        let expired = status(&claim(0), None, None, true, now());
        assert_eq!(
            find_condition(&expired.conditions, claim_cond::READY)
                .unwrap()
                .reason,
            "ClaimExpired"
        );
        assert!(ClaimProblem::EnvRejected(String::new()).is_terminal());
        assert!(!ClaimProblem::WarmPoolNotFound.is_terminal());
    }

    const WAIT: Duration = Duration::from_secs(2);

    fn policy<'a>(dns: &'a DnsMode, allowed: &'a [String]) -> ClaimPolicy<'a> {
        ClaimPolicy {
            dns,
            allowed_label_domains: allowed,
            warm_wait: WAIT,
            claim_events: true,
        }
    }

    /// The plan for `claim` with the pool and template present and `candidates`.
    fn planned<'a>(
        claim: &'a SandboxClaim,
        sandbox: Option<&'a Sandbox>,
        pool: Option<&'a SandboxWarmPool>,
        template: Option<&'a SandboxTemplate>,
        candidates: &'a [&'a Sandbox],
    ) -> Plan<'a> {
        let (dns, allowed) = (dns(), allowed());
        plan(
            &Observed {
                claim,
                sandbox,
                pool,
                template,
                candidates,
                now: now(),
            },
            &policy(&dns, &allowed),
        )
    }

    fn expiring(policy: ClaimShutdownPolicy) -> SandboxClaim {
        let mut c = claim(0);
        c.spec.lifecycle = Some(ClaimLifecycle {
            shutdown_time: Some(Time(now())),
            ttl_seconds_after_finished: None,
            shutdown_policy: policy,
        });
        c
    }

    #[test]
    fn a_warm_claim_plans_the_adoption_of_its_ready_members() {
        let (c, p, t) = (claim(0), pool(), template());
        let (old, young) = (warm("old", 40, true), warm("young", 20, true));
        let candidates = [&young, &old];
        let plan = planned(&c, None, Some(&p), Some(&t), &candidates);
        assert_eq!(plan.expires_in, None);
        let Step::Adopt {
            adoptions,
            template,
        } = plan.step
        else {
            panic!("{:?}", plan.step)
        };
        assert_eq!(template, "python");
        let names: Vec<_> = adoptions
            .iter()
            .map(|a| a.member.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["old", "young"]);
        assert_eq!(adoptions[0].patch, adoption_patch(&old, valid(&c)).unwrap());
        assert_eq!(
            adoptions[0].note,
            "adopted warm Sandbox old from SandboxWarmPool pool"
        );
    }

    #[test]
    fn adoption_tries_at_most_three_members() {
        let (c, p, t) = (claim(0), pool(), template());
        let members: Vec<Sandbox> = (0..5)
            .map(|i| warm(&format!("m{i}"), 10 + i, true))
            .collect();
        let candidates: Vec<&Sandbox> = members.iter().collect();
        let Step::Adopt { adoptions, .. } = planned(&c, None, Some(&p), Some(&t), &candidates).step
        else {
            panic!("adoption expected")
        };
        assert_eq!(adoptions.len(), ADOPTION_ATTEMPTS);
    }

    #[test]
    fn annotations_upstream_writes_are_patched_once_with_only_what_is_missing() {
        let seen: Timestamp = "2026-09-17T10:11:12.123456789Z".parse().unwrap();
        let fresh = claim(1);
        // A warm member keeps its own name: both annotations, in one patch.
        assert_eq!(
            annotation_patch(&fresh, Some("pool-abcde"), seen, true),
            Some(json!({"metadata": {"annotations": {
                annotations::SANDBOX_NAME: "pool-abcde",
                annotations::CONTROLLER_FIRST_OBSERVED_AT: "2026-09-17T10:11:12.123456789Z",
            }}}))
        );
        // A cold sandbox carries the claim's name: no sandbox-name; the flag drops the time.
        assert_eq!(annotation_patch(&fresh, Some("claim-a"), seen, false), None);
        assert_eq!(
            annotation_patch(&fresh, None, seen, true),
            Some(json!({"metadata": {"annotations": {
                annotations::CONTROLLER_FIRST_OBSERVED_AT: "2026-09-17T10:11:12.123456789Z",
            }}}))
        );
        // Present values stay; a stale sandbox-name is corrected; an existing time is kept.
        let mut annotated = claim(1);
        annotated.metadata.annotations = Some(BTreeMap::from([
            (annotations::SANDBOX_NAME.into(), "old-member".into()),
            (
                annotations::CONTROLLER_FIRST_OBSERVED_AT.into(),
                "2026-09-17T10:00:00Z".into(),
            ),
        ]));
        assert_eq!(
            annotation_patch(&annotated, Some("pool-abcde"), seen, true),
            Some(json!({"metadata": {"annotations": {annotations::SANDBOX_NAME: "pool-abcde"}}}))
        );
        assert_eq!(
            annotation_patch(&annotated, Some("old-member"), seen, true),
            None
        );
        assert_eq!(
            recorded_first_observed(&annotated),
            Some("2026-09-17T10:00:00Z".parse().unwrap())
        );
        assert_eq!(recorded_first_observed(&fresh), None);
    }

    #[test]
    fn a_claim_holding_its_sandbox_writes_only_a_changed_status() {
        let (c, m) = (claim(0), warm("pool-x1", 10, true));
        let plan = planned(&c, Some(&m), None, None, &[]);
        let Step::Hold {
            sandbox,
            status: Some(first),
        } = plan.step
        else {
            panic!("{:?}", plan.step)
        };
        assert_eq!(sandbox.metadata.name.as_deref(), Some("pool-x1"));
        assert_eq!(first.sandbox.name, "pool-x1");
        // The next pass over the written status writes nothing.
        let mut written = c.clone();
        written.status = Some(first);
        let again = planned(&written, Some(&m), None, None, &[]);
        assert!(
            matches!(again.step, Step::Hold { status: None, .. }),
            "{:?}",
            again.step
        );
    }

    /// The Ready condition a `Report` step writes, and its retry.
    fn reported(step: Step<'_>) -> (Condition, Option<Duration>) {
        let Step::Report {
            status: Some(status),
            retry,
        } = step
        else {
            panic!("a status report expected: {step:?}")
        };
        let ready = find_condition(&status.conditions, claim_cond::READY).unwrap();
        (ready.clone(), retry)
    }

    #[test]
    fn missing_pools_and_templates_are_reported_and_looked_at_again() {
        let c = claim(0);
        let (ready, retry) = reported(planned(&c, None, None, None, &[]).step);
        assert_eq!(retry, Some(MISSING_RETRY));
        assert_eq!(ready.reason, claim_cond::REASON_WARM_POOL_NOT_FOUND);

        // No members: cold, but the template is missing.
        let p = pool();
        let (ready, retry) = reported(planned(&c, None, Some(&p), None, &[]).step);
        assert_eq!(retry, Some(MISSING_RETRY));
        assert_eq!(
            (ready.reason.as_str(), ready.message.as_str()),
            (
                claim_cond::REASON_TEMPLATE_NOT_FOUND,
                "SandboxTemplate \"python\" not found"
            )
        );
    }

    #[test]
    fn invalid_pod_metadata_is_reported_before_any_write_to_a_sandbox() {
        let mut c = claim(0);
        c.spec
            .additional_pod_metadata
            .labels
            .insert("example.com/x".into(), "a".into());
        let (p, t, m) = (pool(), template(), warm("a", 10, true));
        let candidates = [&m];
        let (ready, retry) = reported(planned(&c, None, Some(&p), Some(&t), &candidates).step);
        assert_eq!(retry, None);
        assert_eq!(ready.reason, claim_cond::REASON_INVALID_METADATA);
        assert!(
            ready.message.contains("not in the allowlist"),
            "{}",
            ready.message
        );
    }

    #[test]
    fn starting_members_are_waited_for_and_no_members_means_cold() {
        let (c, p, t) = (claim(0), pool(), template());
        let starting = warm("a", 1, false);
        let candidates = [&starting];
        assert_eq!(
            planned(&c, None, Some(&p), Some(&t), &candidates).step,
            Step::Wait(WAIT)
        );
        let plan = planned(&c, None, Some(&p), Some(&t), &[]);
        let Step::Create {
            sandbox,
            template,
            note,
        } = plan.step
        else {
            panic!("{:?}", plan.step)
        };
        assert_eq!(*sandbox, cold_sandbox(valid(&c), &t, &dns()).unwrap());
        assert_eq!(template, "python");
        assert_eq!(note, "created Sandbox claim-a from SandboxTemplate python");
    }

    #[test]
    fn an_expired_claim_is_marked_once_then_deleted_by_its_policy() {
        let c = expiring(ClaimShutdownPolicy::Delete);
        let Step::Expire(expiry) = planned(&c, None, None, None, &[]).step else {
            panic!("expiry expected")
        };
        let mark = expiry.mark.clone().unwrap();
        assert_eq!(
            find_condition(&mark.conditions, claim_cond::READY)
                .unwrap()
                .reason,
            claim_cond::REASON_CLAIM_EXPIRED
        );
        assert_eq!(
            expiry.event.as_deref(),
            Some("claim lifecycle expired; shutdownPolicy is Delete")
        );
        assert_eq!(expiry.delete, ExpiryDelete::Claim { foreground: false });

        let mut marked = c.clone();
        marked.status = Some(mark);
        let Step::Expire(again) = planned(&marked, None, None, None, &[]).step else {
            panic!("expiry expected")
        };
        assert_eq!((again.mark, again.event), (None, None));

        let foreground = expiring(ClaimShutdownPolicy::DeleteForeground);
        let Step::Expire(expiry) = planned(&foreground, None, None, None, &[]).step else {
            panic!("expiry expected")
        };
        assert_eq!(expiry.delete, ExpiryDelete::Claim { foreground: true });

        let retain = expiring(ClaimShutdownPolicy::Retain);
        let m = warm("pool-x1", 10, true);
        let Step::Expire(expiry) = planned(&retain, Some(&m), None, None, &[]).step else {
            panic!("expiry expected")
        };
        assert_eq!(
            expiry.delete,
            ExpiryDelete::Sandbox {
                name: "pool-x1".into(),
                uid: None
            }
        );
        let Step::Expire(expiry) = planned(&retain, None, None, None, &[]).step else {
            panic!("expiry expected")
        };
        assert_eq!(expiry.delete, ExpiryDelete::Nothing);
    }

    #[test]
    fn expiry_events_follow_the_setting_and_the_next_pass_comes_by_the_expiry() {
        let c = expiring(ClaimShutdownPolicy::Delete);
        let (dns, allowed) = (dns(), allowed());
        let quiet = ClaimPolicy {
            claim_events: false,
            ..policy(&dns, &allowed)
        };
        let observed = Observed {
            claim: &c,
            sandbox: None,
            pool: None,
            template: None,
            candidates: &[],
            now: now(),
        };
        let Step::Expire(expiry) = plan(&observed, &quiet).step else {
            panic!("expiry expected")
        };
        assert!(expiry.mark.is_some());
        assert_eq!(expiry.event, None);

        let later = Observed {
            now: now() - k8s_openapi::jiff::SignedDuration::from_secs(10),
            ..observed
        };
        let plan = plan(&later, &quiet);
        assert_eq!(plan.expires_in, Some(Duration::from_millis(10_005)));
        assert_eq!(
            requeue_after(Some(MISSING_RETRY), plan.expires_in),
            plan.expires_in
        );
        assert_eq!(
            requeue_after(Some(CONFLICT_RETRY), plan.expires_in),
            Some(CONFLICT_RETRY)
        );
        assert_eq!(requeue_after(None, None), None);
    }

    #[test]
    fn statuses_after_a_write_that_won_or_lost() {
        let (c, m) = (claim(0), warm("pool-x1", 10, true));
        let held = held_status(&c, &m, now()).unwrap();
        assert_eq!(held.sandbox.name, "pool-x1");
        let clash = clash_status(&c, now()).unwrap();
        let ready = find_condition(&clash.conditions, claim_cond::READY).unwrap();
        assert_eq!(ready.reason, claim_cond::REASON_ADOPTION_CONFLICT);
        assert!(
            ready.message.starts_with("a Sandbox named claim-a exists"),
            "{}",
            ready.message
        );
        assert_eq!(changed_status(&c, SandboxClaimStatus::default()), None);
    }
}
