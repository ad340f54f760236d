//! The SandboxWarmPool reconciler: keeps `replicas` unclaimed members built from the pool's
//! template. It reads the caches, asks [`crate::decide::warm_pool::plan`] for the pass's writes
//! and carries them out, the creations paced by the controller-wide rate, the pool's refill rate
//! and its replenish delay ([`crate::rate::PoolPacing`]).

use std::sync::Arc;
use std::time::Duration;

use agent_sandbox_api::conditions::events as event_reasons;
use agent_sandbox_api::{Sandbox, SandboxTemplate, SandboxWarmPool, kinds, labels};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};

use crate::context::{Context, key, now};
use crate::decide::warm_pool::{self as decide, MemberSettings, PlanSettings, pool_hash};
use crate::error::{Result, is_conflict, is_not_found, kube_err};

/// Reconciles one SandboxWarmPool.
pub async fn reconcile(pool: Arc<SandboxWarmPool>, ctx: Arc<Context>) -> Result<Action> {
    tracing::debug!(pool = %key(pool.as_ref()), rv = ?pool.metadata.resource_version, "reconcile");
    if pool.metadata.deletion_timestamp.is_some() {
        ctx.forget_pool_pacing(&key(pool.as_ref()));
        return Ok(Action::await_change());
    }
    let namespace = pool.namespace().unwrap_or_default();
    let pool_key = key(pool.as_ref());
    let hash = pool_hash(&pool);
    let template = ctx.caches.templates.get(
        &ObjectRef::<SandboxTemplate>::new(&pool.spec.sandbox_template_ref.name).within(&namespace),
    );
    // Sandboxes carrying the pool's label: its members, and orphans to adopt.
    let labelled: Vec<Arc<Sandbox>> = ctx.caches.sandboxes.state_filter(|sandbox| {
        sandbox.metadata.namespace.as_deref() == Some(namespace.as_str())
            && sandbox.labels().get(labels::WARM_POOL_SANDBOX) == Some(&hash)
    });
    let labelled: Vec<&Sandbox> = labelled.iter().map(AsRef::as_ref).collect();
    let seen = |name: &str| {
        labelled
            .iter()
            .any(|s| s.metadata.name.as_deref() == Some(name))
    };
    let pending = ctx.pending_members(&pool_key, &seen);
    // Against what this controller wrote last, if the cache lags.
    let current = ctx.freshest_status(
        pool.metadata.uid.as_deref().unwrap_or_default(),
        pool.status.as_ref(),
    );
    let observed = decide::Observed {
        template: template.as_deref(),
        labelled: &labelled,
        pending,
        current: current.as_ref(),
        now: now(),
    };
    let settings = PlanSettings {
        readiness_grace: ctx.config.readiness_grace,
        max_batch: ctx.config.max_batch,
        max_replicas: ctx.config.max_pool_replicas,
        dns: ctx.config.dns.clone(),
    };
    let member_settings = MemberSettings {
        dns: ctx.config.dns.clone(),
        safe_to_evict: ctx.config.warm_pool_safe_to_evict,
    };
    let mut plan = decide::plan(&pool, &observed, &settings, &member_settings);
    let mut recheck = plan.recheck_after;
    let mut sooner = |after: Duration| {
        recheck = Some(recheck.map_or(after, |current| current.min(after)));
    };
    if plan.not_progressing.is_some() {
        // Held unschedulable members: look again now and then, whatever the watches say.
        sooner(ctx.config.unschedulable_recheck);
    }
    let members = labelled
        .iter()
        .filter(|sandbox| sandbox.metadata.deletion_timestamp.is_none())
        .count()
        + pending;
    if let Some(hold) = ctx.replenish_hold(&pool_key, members, plan.create.is_some()) {
        tracing::debug!(pool = %pool_key, ?hold, "members left the pool; replacing them later");
        plan.create = None;
        sooner(hold);
    } else if let Some((_, count)) = plan.create.as_mut() {
        let (granted, wait) = ctx.grant_refills(&pool_key, *count);
        if let Some(wait) = wait {
            tracing::debug!(pool = %pool_key, wanted = *count, granted, "refill paced");
            sooner(wait);
        }
        if granted == 0 {
            plan.create = None;
        } else {
            *count = granted;
        }
    }
    write(&pool, &plan, &ctx).await?;
    Ok(match recheck {
        Some(after) => Action::requeue(after.saturating_add(Duration::from_millis(100))),
        // A template that does not exist yet: its creation wakes us through the template watch.
        None => Action::await_change(),
    })
}

/// Carries out a pass's writes, in its order.
async fn write(pool: &SandboxWarmPool, plan: &decide::Plan<'_>, ctx: &Context) -> Result<()> {
    let namespace = pool.namespace().unwrap_or_default();
    let api: Api<Sandbox> = Api::namespaced(ctx.client.clone(), &namespace);
    for (orphan, patch) in &plan.orphans {
        let name = orphan.name_any();
        match api
            .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(_) => {}
            Err(error) if is_conflict(&error) || is_not_found(&error) => {}
            Err(error) => {
                return Err(kube_err(
                    "adopt orphaned member",
                    kinds::SANDBOX,
                    &namespace,
                    &name,
                )(error));
            }
        }
    }
    for (member, reason) in &plan.delete {
        let name = member.name_any();
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: member.metadata.uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::background()
        };
        tracing::info!(pool = %key(pool), member = %name, %reason, "deleting pool member");
        match api.delete(&name, &params).await {
            Ok(_) => {}
            Err(error) if is_not_found(&error) || is_conflict(&error) => {}
            Err(error) => {
                return Err(kube_err(
                    "delete pool member",
                    kinds::SANDBOX,
                    &namespace,
                    &name,
                )(error));
            }
        }
    }
    if let Some(note) = &plan.not_progressing {
        ctx.event(
            pool,
            true,
            event_reasons::WARM_POOL_NOT_PROGRESSING,
            "Replenish",
            note.clone(),
        );
    }
    if let Some(status) = &plan.status {
        super::apply_status(pool, status, ctx).await?;
    }
    if let Some((member, count)) = &plan.create {
        create_members(&api, member, *count, pool, ctx).await?;
    }
    Ok(())
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
                kinds::SANDBOX,
                &namespace,
                &pool_key,
            )(error))
        }
        None => Ok(()),
    }
}
