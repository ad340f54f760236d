//! The SandboxClaim reconciler: reads what a pass needs (the claim's sandbox, also after a
//! restart; its pool, template and adoptable members), asks [`crate::decide::claim::plan`] for the
//! pass's one plan, and carries it out: adopt a warm member with one conditional write, build one
//! cold, mirror the sandbox in the claim's status, or expire the claim.
//!
//! A warm claim costs the controller three writes (the adoption patch, the claim's annotations
//! upstream's tools read, and the claim's status) plus the `SandboxAdopted` Event; with the
//! client's create, five in all. See `docs/controller.md`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_sandbox_api::conditions::{claim as claim_cond, events as event_reasons};
use agent_sandbox_api::{
    Sandbox, SandboxClaim, SandboxClaimStatus, SandboxTemplate, SandboxWarmPool, annotations,
    kinds, labels,
};
use k8s_openapi::jiff::Timestamp;
use kube::api::{
    DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions, PropagationPolicy,
};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};

use crate::context::{Context, FirstSeen, key, now};
use crate::decide::claim::{
    self as decide, Adoption, ClaimPolicy, ExpiryDelete, ExpiryWrites, MISSING_RETRY, Observed,
    Plan, Step,
};
use crate::decide::{is_condition_true, remaining};
use crate::error::{Result, is_conflict, is_not_found, kube_err};
use crate::metrics::{ClaimCreationLabels, ClaimLabels, CreationLabels};

/// Reconciles one SandboxClaim.
pub async fn reconcile(claim: Arc<SandboxClaim>, ctx: Arc<Context>) -> Result<Action> {
    tracing::debug!(claim = %key(claim.as_ref()), rv = ?claim.metadata.resource_version, "reconcile");
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    if claim.metadata.deletion_timestamp.is_some() {
        ctx.forget_claim(&uid);
        return Ok(Action::await_change());
    }
    let first_seen = ctx.claim_first_seen(&uid);
    // Work from the status this controller wrote last if the cache does not show it yet.
    let fresh = ctx.freshest_status(&uid, claim.status.as_ref());
    let claim = if fresh == claim.status {
        claim
    } else {
        Arc::new(SandboxClaim {
            status: fresh,
            ..(*claim).clone()
        })
    };
    let namespace = claim.namespace().unwrap_or_default();

    let sandbox = find_sandbox(&claim, &ctx).await?;
    let pool = ctx
        .caches
        .pools
        .get(&ObjectRef::<SandboxWarmPool>::new(&claim.spec.warm_pool_ref.name).within(&namespace));
    let template = pool.as_ref().and_then(|pool| {
        ctx.caches.templates.get(
            &ObjectRef::<SandboxTemplate>::new(&pool.spec.sandbox_template_ref.name)
                .within(&namespace),
        )
    });
    // Only a claim still without a sandbox looks at the pool's members (a scan of the cache).
    let candidates: Vec<Arc<Sandbox>> = match (&sandbox, &pool) {
        (None, Some(pool)) => ctx.caches.sandboxes.state_filter(|sandbox| {
            decide::is_candidate(sandbox, pool) && !ctx.is_reserved(&key(sandbox))
        }),
        _ => Vec::new(),
    };
    let candidates: Vec<&Sandbox> = candidates.iter().map(AsRef::as_ref).collect();
    let observed = Observed {
        claim: &claim,
        sandbox: sandbox.as_ref(),
        pool: pool.as_deref(),
        template: template.as_deref(),
        candidates: &candidates,
        now: now(),
    };
    let policy = ClaimPolicy {
        dns: &ctx.config.dns,
        allowed_label_domains: &ctx.config.allowed_label_domains,
        warm_wait: ctx.config.claim_warm_wait,
        claim_events: !ctx.config.disable_claim_events,
    };
    let plan = decide::plan(&observed, &policy);
    execute(
        &claim,
        plan,
        sandbox.as_ref(),
        first_seen,
        observed.now,
        &ctx,
    )
    .await
}

/// Carries out the pass's plan.
async fn execute(
    claim: &SandboxClaim,
    plan: Plan<'_>,
    sandbox: Option<&Sandbox>,
    first_seen: FirstSeen,
    now: Timestamp,
    ctx: &Context,
) -> Result<Action> {
    let retry = match plan.step {
        Step::Report { status, retry } => {
            record(claim, status, sandbox, first_seen, ctx).await?;
            retry
        }
        Step::Hold { sandbox, status } => {
            record(claim, status, Some(sandbox), first_seen, ctx).await?;
            record_ready(claim, sandbox, first_seen.at, ctx);
            None
        }
        Step::Wait(after) => Some(after),
        Step::Adopt {
            adoptions,
            template,
        } => adopt_first(claim, &adoptions, &template, first_seen, now, ctx).await?,
        Step::Create {
            sandbox,
            template,
            note,
        } => create_cold(claim, &sandbox, &template, note, first_seen, now, ctx).await?,
        Step::Expire(expiry) => {
            expire(claim, expiry, ctx).await?;
            return Ok(Action::await_change());
        }
    };
    Ok(decide::requeue_after(retry, plan.expires_in)
        .map_or_else(Action::await_change, Action::requeue))
}

/// The claim's sandbox: the one its status names, else any sandbox it controls (found by the
/// `claim-uid` label, in the cache and then, when the cache has none, from the API, so that an
/// adoption whose status write was lost to a crash or a stale cache is found again).
async fn find_sandbox(claim: &SandboxClaim, ctx: &Context) -> Result<Option<Sandbox>> {
    let namespace = claim.namespace().unwrap_or_default();
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    let owned = |sandbox: &Sandbox| {
        decide::is_owned_by(sandbox, claim) && sandbox.metadata.deletion_timestamp.is_none()
    };
    let recorded = claim
        .status
        .as_ref()
        .map(|s| s.sandbox.name.clone())
        .filter(|n| !n.is_empty());
    let legacy = claim
        .annotations()
        .get(annotations::SANDBOX_NAME)
        .or_else(|| claim.labels().get(annotations::SANDBOX_NAME))
        .cloned();
    for name in [recorded, Some(claim.name_any()), legacy]
        .into_iter()
        .flatten()
    {
        if let Some(sandbox) = ctx
            .caches
            .sandboxes
            .get(&ObjectRef::<Sandbox>::new(&name).within(&namespace))
            && owned(&sandbox)
        {
            return Ok(Some((*sandbox).clone()));
        }
    }
    if let Some(sandbox) = ctx
        .caches
        .sandboxes
        .find(|sandbox| sandbox.labels().get(labels::CLAIM_UID) == Some(&uid) && owned(sandbox))
    {
        return Ok(Some((*sandbox).clone()));
    }
    let api: Api<Sandbox> = Api::namespaced(ctx.client.clone(), &namespace);
    let listed = api
        .list(&ListParams::default().labels(&format!("{}={uid}", labels::CLAIM_UID)))
        .await
        .map_err(kube_err(
            "list sandboxes of",
            kinds::SANDBOX_CLAIM,
            &namespace,
            &claim.name_any(),
        ))?;
    Ok(listed.items.into_iter().find(|sandbox| owned(sandbox)))
}

/// Tries the adoptions in order until one lands, then records it (Event, status, metrics).
/// Returns when to look again: at once when every candidate went to a concurrent claim.
async fn adopt_first(
    claim: &SandboxClaim,
    adoptions: &[Adoption<'_>],
    template: &str,
    first_seen: FirstSeen,
    now: Timestamp,
    ctx: &Context,
) -> Result<Option<Duration>> {
    for adoption in adoptions {
        let Some(adopted) = adopt(adoption, ctx).await? else {
            continue;
        };
        ctx.event(
            claim,
            false,
            event_reasons::SANDBOX_ADOPTED,
            "Adopt",
            adoption.note.clone(),
        );
        let status = decide::held_status(claim, &adopted, now);
        record(claim, status, Some(&adopted), first_seen, ctx).await?;
        let ready = adopted
            .status
            .as_ref()
            .is_some_and(|status| is_condition_true(&status.conditions, claim_cond::READY));
        count_creation(claim, template, labels::LAUNCH_TYPE_WARM, ready, ctx);
        record_ready(claim, &adopted, first_seen.at, ctx);
        return Ok(None);
    }
    // Every candidate went to a concurrent claim: look again at once with fresh caches.
    Ok(Some(decide::CONFLICT_RETRY))
}

/// The conditional write that moves a member from its pool to the claim. `None` when another
/// pass holds the member, or another writer changed it first (it then belongs to someone else
/// or is gone).
async fn adopt(adoption: &Adoption<'_>, ctx: &Context) -> Result<Option<Sandbox>> {
    let member = adoption.member;
    let namespace = member.namespace().unwrap_or_default();
    let name = member.name_any();
    let reservation = key(member);
    if !ctx.reserve(&reservation) {
        return Ok(None);
    }
    let api: Api<Sandbox> = Api::namespaced(ctx.client.clone(), &namespace);
    match api
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(&adoption.patch),
        )
        .await
    {
        Ok(adopted) => Ok(Some(adopted)),
        Err(error) if is_conflict(&error) || is_not_found(&error) => {
            ctx.release(&reservation);
            Ok(None)
        }
        Err(error) => {
            ctx.release(&reservation);
            Err(kube_err("adopt", kinds::SANDBOX, &namespace, &name)(error))
        }
    }
}

/// Creates the cold sandbox and records it (Event, metrics, status); a name taken by a sandbox
/// the claim controls counts as created. Returns when to look again.
async fn create_cold(
    claim: &SandboxClaim,
    desired: &Sandbox,
    template: &str,
    note: String,
    first_seen: FirstSeen,
    now: Timestamp,
    ctx: &Context,
) -> Result<Option<Duration>> {
    let namespace = claim.namespace().unwrap_or_default();
    let name = desired.name_any();
    let api: Api<Sandbox> = Api::namespaced(ctx.client.clone(), &namespace);
    let params = PostParams {
        dry_run: false,
        field_manager: Some(agent_sandbox_api::wire::CONTROLLER_FIELD_MANAGER.to_owned()),
    };
    let created = match api.create(&params, desired).await {
        Ok(created) => Some(created),
        Err(error) if is_conflict(&error) => api
            .get_opt(&name)
            .await
            .map_err(kube_err("get", kinds::SANDBOX, &namespace, &name))?
            .filter(|sandbox| decide::is_owned_by(sandbox, claim)),
        Err(error) => return Err(kube_err("create", kinds::SANDBOX, &namespace, &name)(error)),
    };
    let Some(sandbox) = created else {
        write_status(claim, decide::clash_status(claim, now), ctx).await?;
        return Ok(Some(MISSING_RETRY));
    };
    ctx.event(
        claim,
        false,
        event_reasons::SANDBOX_PROVISIONED,
        "Provision",
        note,
    );
    count_creation(claim, template, labels::LAUNCH_TYPE_COLD, false, ctx);
    let status = decide::held_status(claim, &sandbox, now);
    record(claim, status, Some(&sandbox), first_seen, ctx).await?;
    Ok(None)
}

/// Expiry: mark the claim (status, then Event), then the deletion of its shutdown policy; an
/// object already gone or replaced (its UID changed) is no error.
async fn expire(claim: &SandboxClaim, expiry: ExpiryWrites, ctx: &Context) -> Result<()> {
    write_status(claim, expiry.mark, ctx).await?;
    if let Some(note) = expiry.event {
        ctx.event(claim, false, event_reasons::CLAIM_EXPIRED, "Expire", note);
    }
    let namespace = claim.namespace().unwrap_or_default();
    let name = claim.name_any();
    let result = match &expiry.delete {
        ExpiryDelete::Nothing => return Ok(()),
        ExpiryDelete::Claim { foreground } => {
            let api: Api<SandboxClaim> = Api::namespaced(ctx.client.clone(), &namespace);
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: claim.metadata.uid.clone(),
                    resource_version: None,
                }),
                propagation_policy: Some(if *foreground {
                    PropagationPolicy::Foreground
                } else {
                    PropagationPolicy::Background
                }),
                ..DeleteParams::default()
            };
            api.delete(&name, &params)
                .await
                .map(drop)
                .map_err(|error| (error, "delete expired"))
        }
        ExpiryDelete::Sandbox { name: sandbox, uid } => {
            let api: Api<Sandbox> = Api::namespaced(ctx.client.clone(), &namespace);
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: uid.clone(),
                    resource_version: None,
                }),
                ..DeleteParams::background()
            };
            api.delete(sandbox, &params)
                .await
                .map(drop)
                .map_err(|error| (error, "delete the sandbox of expired"))
        }
    };
    match result {
        Ok(()) => Ok(()),
        Err((error, _)) if is_not_found(&error) || is_conflict(&error) => Ok(()),
        Err((error, verb)) => Err(kube_err(verb, kinds::SANDBOX_CLAIM, &namespace, &name)(
            error,
        )),
    }
}

/// Writes the claim's status when the plan says it changed and, at the same time, the
/// annotations upstream's controller writes when the claim lacks them
/// ([`decide::annotation_patch`]): the two requests go out together, so the annotations add no
/// latency to the claim's readiness.
async fn record(
    claim: &SandboxClaim,
    status: Option<SandboxClaimStatus>,
    sandbox: Option<&Sandbox>,
    first_seen: FirstSeen,
    ctx: &Context,
) -> Result<()> {
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    let patch = if ctx.recently_annotated(&uid) {
        None
    } else {
        let first_observed = decide::recorded_first_observed(claim).unwrap_or(first_seen.wall);
        decide::annotation_patch(
            claim,
            sandbox.and_then(|sandbox| sandbox.metadata.name.as_deref()),
            first_observed,
            ctx.config.claim_observability_annotations,
        )
    };
    let Some(patch) = patch else {
        return write_status(claim, status, ctx).await;
    };
    let annotate = async {
        let namespace = claim.namespace().unwrap_or_default();
        let name = claim.name_any();
        let api: Api<SandboxClaim> = Api::namespaced(ctx.client.clone(), &namespace);
        match api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                ctx.remember_annotated(&uid);
                Ok(())
            }
            Err(error) if is_not_found(&error) => Ok(()),
            Err(error) => Err(kube_err(
                "annotate",
                kinds::SANDBOX_CLAIM,
                &namespace,
                &name,
            )(error)),
        }
    };
    let (annotated, written) = tokio::join!(annotate, write_status(claim, status, ctx));
    annotated.and(written)
}

/// Writes the claim's status when the plan says it changed.
async fn write_status(
    claim: &SandboxClaim,
    status: Option<SandboxClaimStatus>,
    ctx: &Context,
) -> Result<()> {
    match status {
        Some(status) => super::apply_status(claim, &status, ctx).await,
        None => Ok(()),
    }
}

/// Counts a claim that got a sandbox; `ready` when that sandbox was Ready as it got it.
fn count_creation(
    claim: &SandboxClaim,
    template: &str,
    launch_type: &str,
    ready: bool,
    ctx: &Context,
) {
    ctx.metrics
        .claim_creation
        .get_or_create(&ClaimCreationLabels {
            namespace: claim.namespace().unwrap_or_default(),
            sandbox_template: template.to_owned(),
            launch_type: launch_type.to_owned(),
            warmpool_name: claim.spec.warm_pool_ref.name.clone(),
            pod_condition: if ready { "ready" } else { "not_ready" },
            created_by: crate::decide::normalize_created_by(
                claim
                    .labels()
                    .get(labels::CREATED_BY)
                    .map_or("", String::as_str),
            )
            .to_owned(),
        })
        .inc();
}

/// Observes the startup latency once, when the claim is first seen Ready.
fn record_ready(claim: &SandboxClaim, sandbox: &Sandbox, first_seen: Instant, ctx: &Context) {
    let ready = sandbox
        .status
        .as_ref()
        .is_some_and(|status| is_condition_true(&status.conditions, claim_cond::READY));
    let already = claim
        .status
        .as_ref()
        .is_some_and(|status| is_condition_true(&status.conditions, claim_cond::READY));
    if !ready || already {
        return;
    }
    let now = Timestamp::now();
    let since = |key: &str| {
        claim
            .annotations()
            .get(key)
            .and_then(|at| at.parse::<Timestamp>().ok())
            .and_then(|at| remaining(now, at))
    };
    let client_latency = since(annotations::CLIENT_FIRST_REQUESTED_AT);
    let webhook_latency = since(annotations::WEBHOOK_FIRST_OBSERVED_AT);
    let controller_latency = decide::recorded_first_observed(claim)
        .and_then(|at| remaining(now, at))
        .unwrap_or_else(|| first_seen.elapsed());
    let labels = ClaimLabels {
        launch_type: sandbox
            .labels()
            .get(labels::LAUNCH_TYPE)
            .cloned()
            .unwrap_or_default(),
        sandbox_template: sandbox
            .annotations()
            .get(annotations::SANDBOX_TEMPLATE_REF)
            .cloned()
            .unwrap_or_default(),
    };
    // The sandbox's own creation latency, as upstream measures it: from its creation to its
    // Ready condition's transition (whole seconds, as the API keeps them).
    let sandbox_ready_at = sandbox
        .status
        .as_ref()
        .and_then(|status| crate::decide::find_condition(&status.conditions, claim_cond::READY))
        .map(|ready| ready.last_transition_time.0);
    if let (Some(ready_at), Some(created)) =
        (sandbox_ready_at, &sandbox.metadata.creation_timestamp)
        && let Ok(latency) = Duration::try_from(ready_at.duration_since(created.0))
    {
        ctx.metrics.sandbox_ready(
            CreationLabels {
                namespace: sandbox.namespace().unwrap_or_default(),
                launch_type: labels.launch_type.clone(),
                sandbox_template: labels.sandbox_template.clone(),
            },
            latency,
        );
    }
    ctx.metrics
        .claim_ready(labels, controller_latency, webhook_latency, client_latency);
    ctx.forget_claim(claim.metadata.uid.as_deref().unwrap_or_default());
}
