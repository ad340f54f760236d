//! The SandboxWarmPool reconciler: keeps `replicas` unclaimed members built from the pool's
//! template (see [`crate::decide::warm_pool`]).

use std::sync::Arc;
use std::time::Duration;

use agent_sandbox_api::conditions::events as event_reasons;
use agent_sandbox_api::{Sandbox, SandboxTemplate, SandboxWarmPool, labels};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::context::{Context, key, now};
use crate::decide::warm_pool::{self as decide, MemberSettings, PlanSettings, pool_hash};
use crate::decide::{Ownership, controller_reference, ownership};
use crate::error::{Result, is_conflict, is_not_found, kube_err};

/// Reconciles one SandboxWarmPool.
pub async fn reconcile(pool: Arc<SandboxWarmPool>, ctx: Arc<Context>) -> Result<Action> {
    tracing::debug!(pool = %crate::context::key(pool.as_ref()), rv = ?pool.metadata.resource_version, "reconcile");
    if pool.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let namespace = pool.namespace().unwrap_or_default();
    let pool_name = pool.name_any();
    let pool_key = key(pool.as_ref());
    let uid = pool.metadata.uid.clone().unwrap_or_default();
    let hash = pool_hash(&pool);
    let api: Api<Sandbox> = Api::namespaced(ctx.client.clone(), &namespace);

    let template = ctx.caches.templates.get(
        &ObjectRef::<SandboxTemplate>::new(&pool.spec.sandbox_template_ref.name).within(&namespace),
    );

    // Members: sandboxes carrying the pool's label. Orphans (no controller) are adopted.
    let labelled: Vec<Arc<Sandbox>> = ctx.caches.sandboxes.state_filter(|sandbox| {
        sandbox.metadata.namespace.as_deref() == Some(namespace.as_str())
            && sandbox.labels().get(labels::WARM_POOL_SANDBOX) == Some(&hash)
    });
    let mut members: Vec<&Sandbox> = Vec::new();
    for sandbox in &labelled {
        match ownership(&sandbox.metadata, &uid) {
            Ownership::Owned => members.push(sandbox),
            Ownership::Unowned => {
                let patch = json!({"metadata": {
                    "resourceVersion": sandbox.metadata.resource_version,
                    "ownerReferences": [controller_reference(pool.as_ref())],
                }});
                match api
                    .patch(
                        &sandbox.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await
                {
                    Ok(_) => {}
                    Err(error) if is_conflict(&error) || is_not_found(&error) => {}
                    Err(error) => {
                        return Err(kube_err(
                            "adopt orphaned member",
                            "Sandbox",
                            &namespace,
                            &sandbox.name_any(),
                        )(error));
                    }
                }
            }
            Ownership::OwnedByOther(_) => {}
        }
    }
    let seen = |name: &str| {
        labelled
            .iter()
            .any(|s| s.metadata.name.as_deref() == Some(name))
    };
    let pending = ctx.pending_members(&pool_key, &seen);

    let settings = PlanSettings {
        readiness_grace: ctx.config.readiness_grace,
        max_batch: ctx.config.max_batch,
        max_replicas: ctx.config.max_pool_replicas,
        dns: ctx.config.dns.clone(),
    };
    let plan = decide::plan(
        &pool,
        template.as_deref(),
        &members,
        pending,
        &settings,
        now(),
    );

    for (name, reason) in &plan.delete {
        let member_uid = members
            .iter()
            .find(|m| m.metadata.name.as_ref() == Some(name))
            .and_then(|m| m.metadata.uid.clone());
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: member_uid,
                resource_version: None,
            }),
            ..DeleteParams::background()
        };
        tracing::info!(pool = %pool_key, member = %name, %reason, "deleting pool member");
        match api.delete(name, &params).await {
            Ok(_) => {}
            Err(error) if is_not_found(&error) || is_conflict(&error) => {}
            Err(error) => {
                return Err(kube_err("delete pool member", "Sandbox", &namespace, name)(
                    error,
                ));
            }
        }
    }
    if !plan.unschedulable.is_empty() {
        ctx.event(
            pool.as_ref(),
            true,
            event_reasons::WARM_POOL_NOT_PROGRESSING,
            "Replenish",
            format!(
                "members cannot be scheduled and are held instead of replaced: {}",
                plan.unschedulable.join(", ")
            ),
        );
    }

    // Status, when it changed (against what this controller wrote last, if the cache lags);
    // before the creations, which are paced and may take a while (a `Capped` pool says so at once).
    let current = ctx.freshest_status(&uid, pool.status.as_ref());
    if current.as_ref() != Some(&plan.status) {
        let pools: Api<SandboxWarmPool> = Api::namespaced(ctx.client.clone(), &namespace);
        let body = json!({
            "apiVersion": format!("{}/{}", agent_sandbox_api::EXTENSIONS_GROUP, agent_sandbox_api::VERSION),
            "kind": "SandboxWarmPool",
            "status": plan.status,
        });
        let params = PatchParams::apply(agent_sandbox_api::wire::CONTROLLER_FIELD_MANAGER).force();
        match pools
            .patch_status(&pool_name, &params, &Patch::Apply(&body))
            .await
        {
            Ok(_) => {}
            Err(error) if is_not_found(&error) => {}
            Err(error) => {
                return Err(kube_err(
                    "patch status of",
                    "SandboxWarmPool",
                    &namespace,
                    &pool_name,
                )(error));
            }
        }
    }

    if plan.create > 0
        && let Some(template) = &template
    {
        let member = decide::member(
            &pool,
            template,
            &MemberSettings {
                dns: ctx.config.dns.clone(),
                safe_to_evict: ctx.config.warm_pool_safe_to_evict,
            },
        );
        create_members(&api, &member, plan.create, &pool, &ctx).await?;
    }

    Ok(match plan.recheck_after {
        Some(after) => Action::requeue(after.saturating_add(Duration::from_millis(100))),
        // A template that does not exist yet: its creation wakes us through the template watch.
        None => Action::await_change(),
    })
}

/// Creates up to `count` members in slow-start batches (1, 2, 4, ...), each create paced by the
/// controller-wide creation rate; stops at the first failure, and the moment the pool is being
/// deleted or gone from the cache (checked before every create).
async fn create_members(
    api: &Api<Sandbox>,
    member: &Sandbox,
    count: usize,
    pool: &SandboxWarmPool,
    ctx: &Context,
) -> Result<()> {
    let params = PostParams {
        dry_run: false,
        field_manager: Some(agent_sandbox_api::wire::CONTROLLER_FIELD_MANAGER.to_owned()),
    };
    let pool_key = key(pool);
    let uid = pool.metadata.uid.clone().unwrap_or_default();
    let reference = ObjectRef::from_obj(pool);
    let wanted = || {
        let cached = ctx.caches.pools.get(&reference);
        decide::still_wanted(cached.as_ref().map(|pool| &pool.metadata), &uid)
    };
    let mut created = 0;
    let mut failure = None;
    let mut batch = 1;
    'batches: while created < count {
        let size = batch.min(count - created);
        let mut in_flight = FuturesUnordered::new();
        let mut issued = 0;
        let mut record = |result: kube::Result<Sandbox>| match result {
            Ok(sandbox) => {
                created += 1;
                ctx.expect_member(&pool_key, sandbox.name_any());
            }
            Err(error) => {
                failure.get_or_insert(error);
            }
        };
        let mut stopped = false;
        while issued < size {
            if !wanted() {
                tracing::info!(pool = %pool_key, "pool is being deleted; no more members");
                stopped = true;
                break;
            }
            match ctx.take_creation_token() {
                Ok(()) => {
                    in_flight.push(api.create(&params, member));
                    issued += 1;
                }
                Err(wait) => {
                    // The creates already sent complete while the next token comes.
                    let sleep = tokio::time::sleep(wait);
                    tokio::pin!(sleep);
                    loop {
                        tokio::select! {
                            () = &mut sleep => break,
                            Some(result) = in_flight.next() => record(result),
                        }
                    }
                }
            }
        }
        while let Some(result) = in_flight.next().await {
            record(result);
        }
        if stopped || failure.is_some() {
            break 'batches;
        }
        batch *= 2;
    }
    match failure {
        Some(error) => {
            let namespace = member.namespace().unwrap_or_default();
            Err(kube_err(
                "create pool member",
                "Sandbox",
                &namespace,
                &pool_key,
            )(error))
        }
        None => Ok(()),
    }
}
