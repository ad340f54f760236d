//! The SandboxClaim reconciler: find the claim's sandbox (also after a restart), expire the claim,
//! or give it a sandbox: adopt a warm member with one conditional write, or build one cold.
//!
//! A warm claim costs the controller two writes (the adoption patch and the claim's status) plus
//! the `SandboxAdopted` Event; with the client's create, four in all. See `docs/controller.md`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_sandbox_api::claim::ClaimShutdownPolicy;
use agent_sandbox_api::conditions::{claim as claim_cond, events as event_reasons};
use agent_sandbox_api::{
    Sandbox, SandboxClaim, SandboxClaimStatus, SandboxTemplate, SandboxWarmPool, annotations,
    labels,
};
use k8s_openapi::jiff::Timestamp;
use kube::api::{
    DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions, PropagationPolicy,
};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::context::{Context, now};
use crate::decide::claim::{self as decide, ClaimProblem, Pick};
use crate::decide::{is_condition_true, remaining};
use crate::error::{Result, is_conflict, is_not_found, kube_err};
use crate::metrics::{ClaimCreationLabels, ClaimLabels};

const KIND: &str = "SandboxClaim";
/// How long to wait before retrying after every candidate was taken by a concurrent claim.
const CONFLICT_RETRY: Duration = Duration::from_millis(50);
/// How often a claim whose pool or template is missing is looked at again (watches also wake it).
const MISSING_RETRY: Duration = Duration::from_secs(60);
/// How many candidates one pass tries to adopt before giving up.
const ADOPTION_ATTEMPTS: usize = 3;

/// Reconciles one SandboxClaim.
pub async fn reconcile(claim: Arc<SandboxClaim>, ctx: Arc<Context>) -> Result<Action> {
    tracing::debug!(claim = %crate::context::key(claim.as_ref()), rv = ?claim.metadata.resource_version, "reconcile");
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
    let now = now();

    let sandbox = find_sandbox(&claim, &ctx).await?;

    // Expiry comes first: it must find and remove an adopted sandbox too.
    if let Some(at) = decide::expires_at(&claim, sandbox.as_ref())
        && remaining(at, now).is_none()
    {
        return expire(&claim, sandbox.as_ref(), &ctx).await;
    }
    let expiry_requeue = decide::expires_at(&claim, sandbox.as_ref())
        .and_then(|at| remaining(at, now))
        .map(|left| left.saturating_add(Duration::from_millis(5)));
    // The sooner of the pass's own retry (if any) and the claim's expiry.
    let settle = |retry: Option<Duration>| match (retry, expiry_requeue) {
        (Some(retry), Some(expiry)) => Action::requeue(retry.min(expiry)),
        (Some(after), None) | (None, Some(after)) => Action::requeue(after),
        (None, None) => Action::await_change(),
    };

    if let Some(sandbox) = sandbox {
        write_status(
            &claim,
            decide::status(&claim, Some(&sandbox), None, false, now),
            &ctx,
        )
        .await?;
        record_ready(&claim, &sandbox, first_seen, &ctx);
        return Ok(settle(None));
    }

    // No sandbox yet: the pool and its template decide how to get one.
    let Some(pool) = ctx
        .caches
        .pools
        .get(&ObjectRef::<SandboxWarmPool>::new(&claim.spec.warm_pool_ref.name).within(&namespace))
    else {
        write_status(
            &claim,
            decide::status(
                &claim,
                None,
                Some(&ClaimProblem::WarmPoolNotFound),
                false,
                now,
            ),
            &ctx,
        )
        .await?;
        return Ok(settle(Some(MISSING_RETRY)));
    };
    let template_name = pool.spec.sandbox_template_ref.name.clone();
    let template = ctx
        .caches
        .templates
        .get(&ObjectRef::<SandboxTemplate>::new(&template_name).within(&namespace));

    if let Err(message) = decide::validate_additional_pod_metadata(
        &claim.spec.additional_pod_metadata,
        &ctx.config.allowed_label_domains,
    ) {
        write_status(
            &claim,
            decide::status(
                &claim,
                None,
                Some(&ClaimProblem::InvalidMetadata(message)),
                false,
                now,
            ),
            &ctx,
        )
        .await?;
        return Ok(settle(None));
    }

    let candidates: Vec<Arc<Sandbox>> = ctx.caches.sandboxes.state_filter(|sandbox| {
        decide::is_candidate(sandbox, &pool) && !ctx.is_reserved(&crate::context::key(sandbox))
    });
    let candidate_refs: Vec<&Sandbox> = candidates.iter().map(AsRef::as_ref).collect();
    let pick = decide::pick(
        &claim,
        &pool,
        template.as_deref(),
        &candidate_refs,
        &ctx.config.dns,
        ctx.config.claim_warm_wait,
        now,
    );

    match pick {
        Pick::Wait(after) => Ok(settle(Some(after))),
        Pick::Adopt(names) => {
            for name in names.iter().take(ADOPTION_ATTEMPTS) {
                let Some(candidate) = candidates
                    .iter()
                    .find(|c| c.metadata.name.as_ref() == Some(name))
                else {
                    continue;
                };
                if let Some(adopted) = adopt(&claim, candidate, &ctx).await? {
                    write_status(
                        &claim,
                        decide::status(&claim, Some(&adopted), None, false, now),
                        &ctx,
                    )
                    .await?;
                    count_creation(&claim, &template_name, labels::LAUNCH_TYPE_WARM, &ctx);
                    record_ready(&claim, &adopted, first_seen, &ctx);
                    return Ok(settle(None));
                }
            }
            // Every candidate went to a concurrent claim: look again at once with fresh caches.
            Ok(settle(Some(CONFLICT_RETRY)))
        }
        Pick::Cold => {
            let Some(template) = template else {
                let problem = ClaimProblem::TemplateNotFound(format!(
                    "SandboxTemplate {template_name:?} not found"
                ));
                write_status(
                    &claim,
                    decide::status(&claim, None, Some(&problem), false, now),
                    &ctx,
                )
                .await?;
                return Ok(settle(Some(MISSING_RETRY)));
            };
            let desired = match decide::cold_sandbox(
                &claim,
                &template,
                &ctx.config.dns,
                &ctx.config.allowed_label_domains,
            ) {
                Ok(desired) => desired,
                Err(problem) => {
                    write_status(
                        &claim,
                        decide::status(&claim, None, Some(&problem), false, now),
                        &ctx,
                    )
                    .await?;
                    return Ok(settle(None));
                }
            };
            let created = create_cold(&claim, &desired, &ctx).await?;
            match created {
                Some(sandbox) => {
                    ctx.event(
                        claim.as_ref(),
                        false,
                        event_reasons::SANDBOX_PROVISIONED,
                        "Provision",
                        format!(
                            "created Sandbox {} from SandboxTemplate {template_name}",
                            sandbox.name_any()
                        ),
                    );
                    count_creation(&claim, &template_name, labels::LAUNCH_TYPE_COLD, &ctx);
                    write_status(
                        &claim,
                        decide::status(&claim, Some(&sandbox), None, false, now),
                        &ctx,
                    )
                    .await?;
                    Ok(settle(None))
                }
                None => {
                    let problem = ClaimProblem::AdoptionConflict(format!(
                        "a Sandbox named {} exists and is not controlled by this claim",
                        claim.name_any()
                    ));
                    write_status(
                        &claim,
                        decide::status(&claim, None, Some(&problem), false, now),
                        &ctx,
                    )
                    .await?;
                    Ok(settle(Some(MISSING_RETRY)))
                }
            }
        }
    }
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
            KIND,
            &namespace,
            &claim.name_any(),
        ))?;
    Ok(listed.items.into_iter().find(|sandbox| owned(sandbox)))
}

/// One conditional write that moves `candidate` from its pool to `claim`. `None` when another
/// writer changed the candidate first (it then belongs to someone else or is gone).
async fn adopt(
    claim: &SandboxClaim,
    candidate: &Sandbox,
    ctx: &Context,
) -> Result<Option<Sandbox>> {
    let namespace = candidate.namespace().unwrap_or_default();
    let name = candidate.name_any();
    let reservation = crate::context::key(candidate);
    if !ctx.reserve(&reservation) {
        return Ok(None);
    }
    let patch = match decide::adoption_patch(candidate, claim, &ctx.config.allowed_label_domains) {
        Ok(patch) => patch,
        Err(_) => {
            ctx.release(&reservation);
            return Ok(None);
        }
    };
    let api: Api<Sandbox> = Api::namespaced(ctx.client.clone(), &namespace);
    match api
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(adopted) => {
            ctx.event(
                claim,
                false,
                event_reasons::SANDBOX_ADOPTED,
                "Adopt",
                format!(
                    "adopted warm Sandbox {name} from SandboxWarmPool {}",
                    claim.spec.warm_pool_ref.name
                ),
            );
            Ok(Some(adopted))
        }
        Err(error) if is_conflict(&error) || is_not_found(&error) => {
            ctx.release(&reservation);
            Ok(None)
        }
        Err(error) => {
            ctx.release(&reservation);
            Err(kube_err("adopt", "Sandbox", &namespace, &name)(error))
        }
    }
}

/// Creates the cold sandbox; on a name clash returns the existing one if the claim controls it.
async fn create_cold(
    claim: &SandboxClaim,
    desired: &Sandbox,
    ctx: &Context,
) -> Result<Option<Sandbox>> {
    let namespace = claim.namespace().unwrap_or_default();
    let name = desired.name_any();
    let api: Api<Sandbox> = Api::namespaced(ctx.client.clone(), &namespace);
    let params = PostParams {
        dry_run: false,
        field_manager: Some(agent_sandbox_api::wire::CONTROLLER_FIELD_MANAGER.to_owned()),
    };
    match api.create(&params, desired).await {
        Ok(created) => Ok(Some(created)),
        Err(error) if is_conflict(&error) => {
            let existing = api
                .get_opt(&name)
                .await
                .map_err(kube_err("get", "Sandbox", &namespace, &name))?;
            Ok(existing.filter(|sandbox| decide::is_owned_by(sandbox, claim)))
        }
        Err(error) => Err(kube_err("create", "Sandbox", &namespace, &name)(error)),
    }
}

/// Expiry: mark the claim, then delete it (background or foreground) or, under `Retain`, delete
/// its sandbox and keep it.
async fn expire(claim: &SandboxClaim, sandbox: Option<&Sandbox>, ctx: &Context) -> Result<Action> {
    let namespace = claim.namespace().unwrap_or_default();
    let name = claim.name_any();
    if !decide::marked_expired(claim) {
        write_status(claim, decide::status(claim, None, None, true, now()), ctx).await?;
        if !ctx.config.disable_claim_events {
            ctx.event(
                claim,
                false,
                event_reasons::CLAIM_EXPIRED,
                "Expire",
                format!(
                    "claim lifecycle expired; shutdownPolicy is {:?}",
                    decide::shutdown_policy(claim)
                ),
            );
        }
    }
    let uid = claim.metadata.uid.clone();
    match decide::shutdown_policy(claim) {
        policy @ (ClaimShutdownPolicy::Delete | ClaimShutdownPolicy::DeleteForeground) => {
            let api: Api<SandboxClaim> = Api::namespaced(ctx.client.clone(), &namespace);
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid,
                    resource_version: None,
                }),
                propagation_policy: Some(if policy == ClaimShutdownPolicy::Delete {
                    PropagationPolicy::Background
                } else {
                    PropagationPolicy::Foreground
                }),
                ..DeleteParams::default()
            };
            match api.delete(&name, &params).await {
                Ok(_) => Ok(Action::await_change()),
                Err(error) if is_not_found(&error) || is_conflict(&error) => {
                    Ok(Action::await_change())
                }
                Err(error) => Err(kube_err("delete expired", KIND, &namespace, &name)(error)),
            }
        }
        ClaimShutdownPolicy::Retain => {
            if let Some(sandbox) = sandbox {
                let api: Api<Sandbox> = Api::namespaced(ctx.client.clone(), &namespace);
                let params = DeleteParams {
                    preconditions: Some(Preconditions {
                        uid: sandbox.metadata.uid.clone(),
                        resource_version: None,
                    }),
                    ..DeleteParams::background()
                };
                match api.delete(&sandbox.name_any(), &params).await {
                    Ok(_) => {}
                    Err(error) if is_not_found(&error) || is_conflict(&error) => {}
                    Err(error) => {
                        return Err(kube_err(
                            "delete the sandbox of expired",
                            KIND,
                            &namespace,
                            &name,
                        )(error));
                    }
                }
            }
            let mut expired = claim.clone();
            expired.status = Some(decide::status(claim, None, None, true, now()));
            write_status(
                &expired,
                decide::status(&expired, None, None, true, now()),
                ctx,
            )
            .await?;
            Ok(Action::await_change())
        }
    }
}

/// Writes the claim's status with server-side apply when it changed.
async fn write_status(
    claim: &SandboxClaim,
    status: SandboxClaimStatus,
    ctx: &Context,
) -> Result<()> {
    if claim.status.as_ref() == Some(&status)
        || (claim.status.is_none() && status == SandboxClaimStatus::default())
    {
        return Ok(());
    }
    let namespace = claim.namespace().unwrap_or_default();
    let name = claim.name_any();
    let api: Api<SandboxClaim> = Api::namespaced(ctx.client.clone(), &namespace);
    let body = json!({
        "apiVersion": format!("{}/{}", agent_sandbox_api::EXTENSIONS_GROUP, agent_sandbox_api::VERSION),
        "kind": KIND,
        "status": status,
    });
    let params = PatchParams::apply(agent_sandbox_api::wire::CONTROLLER_FIELD_MANAGER).force();
    match api.patch_status(&name, &params, &Patch::Apply(&body)).await {
        Ok(_) => {
            ctx.remember_status(claim.metadata.uid.as_deref().unwrap_or_default(), &status);
            Ok(())
        }
        Err(error) if is_not_found(&error) => Ok(()),
        Err(error) => Err(kube_err("patch status of", KIND, &namespace, &name)(error)),
    }
}

fn count_creation(claim: &SandboxClaim, template: &str, launch_type: &str, ctx: &Context) {
    ctx.metrics
        .claim_creation
        .get_or_create(&ClaimCreationLabels {
            namespace: claim.namespace().unwrap_or_default(),
            sandbox_template: template.to_owned(),
            launch_type: launch_type.to_owned(),
            warmpool_name: claim.spec.warm_pool_ref.name.clone(),
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
    let client_latency = claim
        .annotations()
        .get(annotations::CLIENT_FIRST_REQUESTED_AT)
        .and_then(|at| at.parse::<Timestamp>().ok())
        .and_then(|at| remaining(Timestamp::now(), at));
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
    ctx.metrics
        .claim_ready(labels, first_seen.elapsed(), client_latency);
    ctx.forget_claim(claim.metadata.uid.as_deref().unwrap_or_default());
}
