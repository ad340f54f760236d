//! The Sandbox reconciler: PVCs, the pod, the optional headless Service, expiry, suspension and
//! status, with the decisions taken by [`crate::decide::sandbox`].

use std::sync::Arc;
use std::time::Duration;

use agent_sandbox_api::conditions::events as event_reasons;
use agent_sandbox_api::sandbox::{OperatingMode, SandboxStatus, ShutdownPolicy};
use agent_sandbox_api::{Sandbox, SandboxClaim, SandboxWarmPool, annotations, kinds};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Service};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use serde_json::Value;

use crate::context::{Context, now};
use crate::decide::sandbox::{self as decide, ChildDecision, Expiry, Idle, Observed, Problem};
use crate::decide::{Ownership, ownership};
use crate::error::{Error, Result, api_message, is_conflict, is_invalid, is_not_found, kube_err};
use crate::lenient::Lenient;

const KIND: &str = kinds::SANDBOX;

/// Reconciles one Sandbox.
pub async fn reconcile(sandbox: Arc<Sandbox>, ctx: Arc<Context>) -> Result<Action> {
    tracing::debug!(sandbox = %crate::context::key(sandbox.as_ref()), rv = ?sandbox.metadata.resource_version, "reconcile");
    if sandbox.metadata.deletion_timestamp.is_some() {
        // Children go with it through their ownerReferences.
        return Ok(Action::await_change());
    }
    // Work from the status this controller wrote last if the cache does not show it yet.
    let fresh = ctx.freshest_status(
        sandbox.metadata.uid.as_deref().unwrap_or_default(),
        sandbox.status.as_ref(),
    );
    let sandbox = if fresh == sandbox.status {
        sandbox
    } else {
        Arc::new(Sandbox {
            status: fresh,
            ..(*sandbox).clone()
        })
    };
    let now = now();
    let idle_in = match decide::idle(&sandbox, now) {
        Idle::Wait(left) => left,
        _ if matches!(decide::expiry(&sandbox, now), Expiry::Expired) => None,
        idle => return idle_out(&sandbox, idle, now, &ctx).await,
    };
    match decide::expiry(&sandbox, now) {
        Expiry::Expired => expire(&sandbox, &ctx).await,
        expiry => {
            let outcome = reconcile_children(&sandbox, &ctx).await;
            let mut status = decide::status(
                &sandbox,
                &outcome.observed(),
                &ctx.config.cluster_domain,
                now,
            );
            let expiry_in = match expiry {
                Expiry::In(left) => Some(left),
                _ => None,
            };
            let mut requeue = expiry_in
                .into_iter()
                .chain(idle_in)
                .min()
                .map_or_else(Action::await_change, |left| {
                    Action::requeue(left.saturating_add(Duration::from_millis(5)))
                });
            if matches!(
                decide::expiry(&sandbox, crate::context::now()),
                Expiry::Expired
            ) {
                status = decide::expired_status(
                    &Sandbox {
                        status: Some(status),
                        ..(*sandbox).clone()
                    },
                    now,
                    false,
                );
                requeue = Action::requeue(Duration::from_millis(1));
            }
            write_status(&sandbox, sandbox.status.as_ref(), status, &ctx).await?;
            match outcome.error {
                Some(error) => Err(error),
                None => Ok(requeue),
            }
        }
    }
}

/// What a pass did to the children.
#[derive(Default)]
struct Outcome {
    pod: Option<Pod>,
    pod_lookup_failed: bool,
    service: Option<Service>,
    problem: Option<Problem>,
    error: Option<Error>,
}

impl Outcome {
    fn observed(&self) -> Observed<'_> {
        Observed {
            pod: self.pod.as_ref(),
            pod_lookup_failed: self.pod_lookup_failed,
            service: self.service.as_ref(),
            problem: self.problem.clone(),
        }
    }

    fn fail(&mut self, error: Error) {
        if self.problem.is_none() {
            self.problem = Some(Problem::Error(error.to_string()));
        }
        if self.error.is_none() {
            self.error = Some(error);
        }
    }
}

async fn reconcile_children(sandbox: &Sandbox, ctx: &Context) -> Outcome {
    let mut outcome = Outcome::default();
    if let Err(error) = reconcile_pvcs(sandbox, ctx).await {
        outcome.fail(error);
    }
    match reconcile_pod(sandbox, ctx).await {
        Ok(pod) => outcome.pod = pod,
        Err(PodError::Multiple(count)) => {
            outcome.problem = Some(Problem::MultiplePods(count));
            let ready = sandbox.status.as_ref().and_then(|s| {
                crate::decide::find_condition(
                    &s.conditions,
                    agent_sandbox_api::conditions::sandbox::READY,
                )
            });
            if !ready.is_some_and(|c| {
                c.reason == agent_sandbox_api::conditions::sandbox::REASON_MULTIPLE_PODS
            }) {
                ctx.event(
                    sandbox,
                    true,
                    event_reasons::MULTIPLE_PODS,
                    "Reconciling",
                    Problem::multiple_pods_message(count),
                );
            }
            // No Service writes while the pod mapping is ambiguous.
            return outcome;
        }
        Err(PodError::Lookup(error)) => {
            outcome.pod_lookup_failed = true;
            outcome.fail(error);
        }
        // Not an error to retry: the status says why, and a spec change brings a new attempt.
        Err(PodError::Invalid(message)) => {
            outcome.problem = Some(Problem::InvalidPodTemplate(message));
        }
        Err(PodError::Other(pod, error)) => {
            outcome.pod = pod.map(|pod| *pod);
            outcome.fail(error);
        }
    }
    match reconcile_service(sandbox, ctx).await {
        Ok(service) => outcome.service = service,
        Err(error) => outcome.fail(error),
    }
    outcome
}

fn names(sandbox: &Sandbox) -> (String, String) {
    (sandbox.namespace().unwrap_or_default(), sandbox.name_any())
}

async fn reconcile_pvcs(sandbox: &Sandbox, ctx: &Context) -> Result<()> {
    let (namespace, _) = names(sandbox);
    let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &namespace);
    for desired in decide::desired_pvcs(sandbox) {
        let name = desired.name_any();
        match api.get_opt(&name).await.map_err(kube_err(
            "get",
            "PersistentVolumeClaim",
            &namespace,
            &name,
        ))? {
            Some(existing) => match decide::child_decision(sandbox, "PVC", &existing.metadata) {
                ChildDecision::Use => {}
                ChildDecision::Adopt => {
                    let patch = decide::adopt_child_patch(sandbox, &existing.metadata);
                    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                        .map_err(kube_err(
                            "adopt",
                            "PersistentVolumeClaim",
                            &namespace,
                            &name,
                        ))?;
                }
                ChildDecision::Refuse(reason) => return Err(Error::Ownership(reason)),
            },
            None => {
                match api.create(&create_params(), &desired).await {
                    Ok(_) => {}
                    Err(error) if is_conflict(&error) => {} // created by a concurrent pass
                    Err(error) => {
                        return Err(kube_err(
                            "create",
                            "PersistentVolumeClaim",
                            &namespace,
                            &name,
                        )(error));
                    }
                }
            }
        }
    }
    Ok(())
}

fn create_params() -> PostParams {
    PostParams {
        dry_run: false,
        field_manager: Some(agent_sandbox_api::wire::CONTROLLER_FIELD_MANAGER.to_owned()),
    }
}

enum PodError {
    Multiple(usize),
    Lookup(Error),
    /// The API server refused the pod as invalid (422), with its message.
    Invalid(String),
    Other(Option<Box<Pod>>, Error),
}

/// False when `sandbox` is a member of a pool that is being deleted or gone: its pod would only
/// be deleted again with it. The cache answers for a live pool; a pool missing from the cache is
/// looked up (decoded leniently, so that a pool the cache skipped as undecodable still counts as
/// there). When in doubt, the pod is created.
async fn pool_still_wants(sandbox: &Sandbox, ctx: &Context) -> bool {
    let Some((pool, uid)) = decide::owning_pool(sandbox) else {
        return true;
    };
    let namespace = sandbox.namespace().unwrap_or_default();
    let cached = ctx
        .caches
        .pools
        .get(&ObjectRef::<SandboxWarmPool>::new(pool).within(&namespace));
    if let Some(cached) = &cached
        && crate::decide::warm_pool::still_wanted(Some(&cached.metadata), uid)
    {
        return true;
    }
    let api: Api<Lenient<SandboxWarmPool>> = Api::namespaced(ctx.client.clone(), &namespace);
    match api.get_opt(pool).await {
        Ok(found) => {
            crate::decide::warm_pool::still_wanted(found.as_ref().map(|pool| pool.meta()), uid)
        }
        Err(_) => true,
    }
}

/// Finds the sandbox's pod in the cache: the tracked name and the sandbox's own name.
fn cached_pods(sandbox: &Sandbox, ctx: &Context) -> (Option<Pod>, Vec<Pod>) {
    let (namespace, name) = names(sandbox);
    let tracked = decide::pod_name(sandbox);
    let get = |pod_name: &str| {
        ctx.caches
            .pods
            .get(&ObjectRef::<Pod>::new(pod_name).within(&namespace))
            .map(|p| (*p).clone())
    };
    let uid = sandbox.metadata.uid.clone().unwrap_or_default();
    let mut owned: Vec<Pod> = Vec::new();
    let tracked_pod = get(&tracked);
    for pod in tracked_pod
        .iter()
        .cloned()
        .chain(if tracked == name { None } else { get(&name) })
    {
        if ownership(&pod.metadata, &uid) == Ownership::Owned {
            owned.push(pod);
        }
    }
    (tracked_pod, owned)
}

async fn reconcile_pod(sandbox: &Sandbox, ctx: &Context) -> Result<Option<Pod>, PodError> {
    let (namespace, name) = names(sandbox);
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    let (tracked, owned) = cached_pods(sandbox, ctx);
    if owned.len() > 1 {
        return Err(PodError::Multiple(owned.len()));
    }
    let clear_pod_name = || clear_pod_name(sandbox, ctx);
    // The owned pod wins over a tracked one that is not ours.
    let mut pod = match (tracked, owned.into_iter().next()) {
        (Some(tracked), Some(owned)) if tracked.name_any() != owned.name_any() => {
            clear_pod_name()
                .await
                .map_err(|e| PodError::Other(None, e))?;
            Some(owned)
        }
        (_, Some(owned)) => Some(owned),
        (tracked, None) => tracked,
    };

    if sandbox.spec.operating_mode == OperatingMode::Suspended {
        if pod.is_none() {
            // The cache holds labelled pods only: a pod of the sandbox's name that someone else
            // created (unlabelled) is read from the API, so that the status says the name is
            // taken (`PodNotOwned`) instead of `PodTerminated`. A read, not a write, and only
            // for a suspended sandbox without a pod.
            pod = api
                .get_opt(&name)
                .await
                .map_err(|e| PodError::Lookup(kube_err("get", "Pod", &namespace, &name)(e)))?;
        }
        if let Some(existing) = &pod
            && ownership(
                &existing.metadata,
                sandbox.metadata.uid.as_deref().unwrap_or_default(),
            ) == Ownership::Owned
            && existing.metadata.deletion_timestamp.is_none()
        {
            delete_pod(&api, existing)
                .await
                .map_err(|e| PodError::Other(pod.clone().map(Box::new), e))?;
        }
        if pod.is_none() {
            clear_pod_name()
                .await
                .map_err(|e| PodError::Other(None, e))?;
        }
        return Ok(pod);
    }

    if pod.is_none() {
        if decide::has_pod_name_annotation(sandbox) && decide::pod_name(sandbox) != name {
            // The tracked pod is gone: fall back to a pod named after the sandbox.
            clear_pod_name()
                .await
                .map_err(|e| PodError::Other(None, e))?;
        }
        if let Some(message) = decide::rejected_pod_template(sandbox) {
            return Err(PodError::Invalid(message));
        }
        if !pool_still_wants(sandbox, ctx).await {
            tracing::debug!(sandbox = %name, "its pool is being deleted; no pod");
            return Ok(None);
        }
        let desired = decide::desired_pod(sandbox);
        match api.create(&create_params(), &desired).await {
            Ok(created) => return Ok(Some(created)),
            Err(error) if is_invalid(&error) => {
                return Err(PodError::Invalid(api_message(&error)));
            }
            Err(error) if is_conflict(&error) => {
                // Created by an earlier pass the cache has not shown yet, or a foreign pod.
                pod = api
                    .get_opt(&name)
                    .await
                    .map_err(|e| PodError::Lookup(kube_err("get", "Pod", &namespace, &name)(e)))?;
            }
            Err(error) => {
                return Err(PodError::Other(
                    None,
                    kube_err("create", "Pod", &namespace, &name)(error),
                ));
            }
        }
    }
    let Some(existing) = pod else {
        return Ok(None);
    };
    existing_pod(sandbox, existing, &api, ctx).await
}

async fn existing_pod(
    sandbox: &Sandbox,
    pod: Pod,
    api: &Api<Pod>,
    ctx: &Context,
) -> Result<Option<Pod>, PodError> {
    let namespace = sandbox.namespace().unwrap_or_default();
    let pod_name = pod.name_any();
    let mut patch = match decide::child_decision(sandbox, "pod", &pod.metadata) {
        ChildDecision::Refuse(reason) => {
            clear_pod_name(sandbox, ctx)
                .await
                .map_err(|e| PodError::Other(None, e))?;
            return Err(PodError::Other(None, Error::Ownership(reason)));
        }
        ChildDecision::Adopt => decide::adopt_child_patch(sandbox, &pod.metadata),
        ChildDecision::Use => Value::Null,
    };
    if let Some(metadata) = decide::pod_metadata_patch(sandbox, &pod) {
        merge_json(&mut patch, metadata);
    }
    if patch.is_null() {
        return Ok(Some(pod));
    }
    match api
        .patch(&pod_name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(patched) => Ok(Some(patched)),
        Err(error) => Err(PodError::Other(
            Some(Box::new(pod)),
            kube_err("patch metadata of", "Pod", &namespace, &pod_name)(error),
        )),
    }
}

/// Removes the sandbox's `pod-name` annotation, when it has one (its pod is gone or not its own).
async fn clear_pod_name(sandbox: &Sandbox, ctx: &Context) -> Result<()> {
    if !decide::has_pod_name_annotation(sandbox) {
        return Ok(());
    }
    let (namespace, name) = names(sandbox);
    let sandboxes: Api<Sandbox> = Api::namespaced(ctx.client.clone(), &namespace);
    sandboxes
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(&decide::clear_pod_name_patch()),
        )
        .await
        .map(drop)
        .map_err(kube_err(
            "clear the pod-name annotation of",
            KIND,
            &namespace,
            &name,
        ))
}

/// Deep-merges `other` into `base` (objects merged key by key, anything else replaced).
fn merge_json(base: &mut Value, other: Value) {
    match (base, other) {
        (Value::Object(base), Value::Object(other)) => {
            for (key, value) in other {
                merge_json(base.entry(key).or_insert(Value::Null), value);
            }
        }
        (base, other) => *base = other,
    }
}

async fn delete_pod(api: &Api<Pod>, pod: &Pod) -> Result<()> {
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: pod.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(&pod.name_any(), &params).await {
        Ok(_) => Ok(()),
        Err(error) if is_not_found(&error) || is_conflict(&error) => Ok(()),
        Err(error) => Err(kube_err(
            "delete",
            "Pod",
            &pod.namespace().unwrap_or_default(),
            &pod.name_any(),
        )(error)),
    }
}

async fn reconcile_service(sandbox: &Sandbox, ctx: &Context) -> Result<Option<Service>> {
    let (namespace, name) = names(sandbox);
    let api: Api<Service> = Api::namespaced(ctx.client.clone(), &namespace);
    let wanted = sandbox.spec.blueprint.service;
    let cached = ctx
        .caches
        .services
        .get(&ObjectRef::<Service>::new(&name).within(&namespace))
        .map(|s| (*s).clone());
    // An unlabelled Service of that name is invisible to the cache; look it up when it matters.
    let existing = match cached {
        Some(service) => Some(service),
        None if wanted == Some(true) => api
            .get_opt(&name)
            .await
            .map_err(kube_err("get", "Service", &namespace, &name))?,
        None => None,
    };
    let Some(service) = existing else {
        if wanted == Some(true) {
            return match api
                .create(&create_params(), &decide::desired_service(sandbox))
                .await
            {
                Ok(created) => Ok(Some(created)),
                Err(error) if is_conflict(&error) => Ok(api
                    .get_opt(&name)
                    .await
                    .map_err(kube_err("get", "Service", &namespace, &name))?),
                Err(error) => Err(kube_err("create", "Service", &namespace, &name)(error)),
            };
        }
        return Ok(None);
    };
    let owned = ownership(
        &service.metadata,
        sandbox.metadata.uid.as_deref().unwrap_or_default(),
    );
    if wanted == Some(false) {
        if owned == Ownership::Owned {
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(error) if is_not_found(&error) => {}
                Err(error) => return Err(kube_err("delete", "Service", &namespace, &name)(error)),
            }
        }
        return Ok(None);
    }
    match decide::child_decision(sandbox, "service", &service.metadata) {
        ChildDecision::Refuse(reason) if wanted.is_some() || owned != Ownership::Unowned => {
            Err(Error::Ownership(reason))
        }
        ChildDecision::Refuse(_) => Ok(None),
        ChildDecision::Adopt if wanted.is_none() => Ok(None),
        ChildDecision::Adopt => {
            let cluster_ip = service
                .spec
                .as_ref()
                .and_then(|s| s.cluster_ip.clone())
                .unwrap_or_default();
            if !cluster_ip.is_empty() && cluster_ip != "None" {
                return Err(Error::Ownership(format!(
                    "cannot adopt service {name:?}: ClusterIP is {cluster_ip:?} (expected \"None\", field is immutable)"
                )));
            }
            let mut patch = decide::adopt_child_patch(sandbox, &service.metadata);
            if let Some(drift) = decide::service_drift_patch(sandbox, &service) {
                merge_json(&mut patch, drift);
            }
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map(Some)
                .map_err(kube_err("adopt", "Service", &namespace, &name))
        }
        ChildDecision::Use => match decide::service_drift_patch(sandbox, &service) {
            Some(patch) => api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map(Some)
                .map_err(kube_err("patch", "Service", &namespace, &name)),
            None => Ok(Some(service)),
        },
    }
}

/// Writes `status` when it differs from `current` (the stored one) in more than the node name.
pub(crate) async fn write_status(
    sandbox: &Sandbox,
    current: Option<&SandboxStatus>,
    status: SandboxStatus,
    ctx: &Context,
) -> Result<()> {
    let current = current.cloned().unwrap_or_default();
    if current == status || decide::only_node_name_changed(&current, &status) {
        return Ok(());
    }
    super::apply_status(sandbox, &status, ctx).await
}

/// Expiry: mark it, remove the pod and Service, then delete or retain the Sandbox.
/// Carries out what the idle lifecycle asks (not [`Idle::Wait`]): one conditional write. A
/// conflict (a router recorded activity, someone resumed it) is looked at again at once.
async fn idle_out(
    sandbox: &Sandbox,
    idle: Idle,
    now: k8s_openapi::jiff::Timestamp,
    ctx: &Context,
) -> Result<Action> {
    let (namespace, name) = names(sandbox);
    let sandboxes: Api<Sandbox> = Api::namespaced(ctx.client.clone(), &namespace);
    let conditional = |mut patch: Value| {
        patch["metadata"]["resourceVersion"] = sandbox.metadata.resource_version.clone().into();
        patch
    };
    let written = match idle {
        Idle::Wait(_) => return Ok(Action::await_change()),
        Idle::ClearMark => {
            let patch = conditional(serde_json::json!({"metadata": {"annotations": {
                annotations::IDLE_SUSPENDED_AT: null,
            }}}));
            sandboxes
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map(drop)
        }
        Idle::Resume => {
            let patch = conditional(agent_sandbox_api::sandbox::resume_patch(&now.to_string()));
            let written = sandboxes
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map(drop);
            if written.is_ok() {
                ctx.event(
                    sandbox,
                    false,
                    event_reasons::RESUMED_ON_TRAFFIC,
                    "Resume",
                    "a request arrived through the router".to_owned(),
                );
            }
            written
        }
        Idle::Suspend => {
            let at = now.to_string();
            let patch = conditional(agent_sandbox_api::sandbox::suspend_patch(Some(&at)));
            let written = sandboxes
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map(drop);
            if written.is_ok() {
                let ttl = sandbox
                    .spec
                    .idle_lifecycle
                    .as_ref()
                    .and_then(|l| l.active_ttl_seconds)
                    .unwrap_or_default();
                ctx.event(
                    sandbox,
                    false,
                    event_reasons::IDLE_SUSPENDED,
                    "Suspend",
                    format!("no activity for {ttl} s (activeTTLSeconds); the next request through the router resumes it"),
                );
            }
            written
        }
        Idle::Delete => {
            ctx.event(
                sandbox,
                false,
                event_reasons::IDLE_EXPIRED,
                "Delete",
                "idle lifecycle expired (activeExpirationPolicy or suspendedExpirationPolicy Delete)"
                    .to_owned(),
            );
            match decide::owning_claim(sandbox) {
                Some(claim) => {
                    let claim = claim.to_owned();
                    let uid = crate::decide::controller_of(&sandbox.metadata)
                        .map(|owner| owner.uid.clone());
                    let claims: Api<SandboxClaim> = Api::namespaced(ctx.client.clone(), &namespace);
                    let params = DeleteParams {
                        preconditions: Some(Preconditions {
                            uid,
                            resource_version: None,
                        }),
                        ..DeleteParams::background()
                    };
                    claims.delete(&claim, &params).await.map(drop)
                }
                None => {
                    let params = DeleteParams {
                        preconditions: Some(Preconditions {
                            uid: sandbox.metadata.uid.clone(),
                            resource_version: sandbox.metadata.resource_version.clone(),
                        }),
                        ..DeleteParams::background()
                    };
                    sandboxes.delete(&name, &params).await.map(drop)
                }
            }
        }
    };
    match written {
        Ok(()) => Ok(Action::await_change()),
        Err(error) if is_conflict(&error) => Ok(Action::requeue(Duration::from_millis(1))),
        Err(error) if is_not_found(&error) => Ok(Action::await_change()),
        Err(error) => Err(kube_err("idle lifecycle of", KIND, &namespace, &name)(
            error,
        )),
    }
}

async fn expire(sandbox: &Sandbox, ctx: &Context) -> Result<Action> {
    let (namespace, name) = names(sandbox);
    let now = now();
    let mut current = sandbox.status.clone();
    if !decide::marked_expired(sandbox) {
        let marked = decide::expired_status(sandbox, now, false);
        write_status(sandbox, current.as_ref(), marked.clone(), ctx).await?;
        current = Some(marked);
        ctx.event(
            sandbox,
            false,
            event_reasons::SANDBOX_EXPIRED,
            "Expire",
            format!(
                "shutdownTime passed; shutdownPolicy is {:?}",
                sandbox.spec.lifecycle.shutdown_policy
            ),
        );
    }
    let uid = sandbox.metadata.uid.clone().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    let pod_name = decide::pod_name(sandbox);
    if let Some(pod) = pods
        .get_opt(&pod_name)
        .await
        .map_err(kube_err("get", "Pod", &namespace, &pod_name))?
        && ownership(&pod.metadata, &uid) == Ownership::Owned
    {
        delete_pod(&pods, &pod).await?;
    }
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), &namespace);
    if let Some(service) = services
        .get_opt(&name)
        .await
        .map_err(kube_err("get", "Service", &namespace, &name))?
        && ownership(&service.metadata, &uid) == Ownership::Owned
    {
        match services.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(error) if is_not_found(&error) => {}
            Err(error) => return Err(kube_err("delete", "Service", &namespace, &name)(error)),
        }
    }
    if sandbox.spec.lifecycle.shutdown_policy == ShutdownPolicy::Delete {
        let api: Api<Sandbox> = Api::namespaced(ctx.client.clone(), &namespace);
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..DeleteParams::background()
        };
        return match api.delete(&name, &params).await {
            Ok(_) => Ok(Action::await_change()),
            Err(error) if is_not_found(&error) || is_conflict(&error) => Ok(Action::await_change()),
            Err(error) => Err(kube_err("delete expired", KIND, &namespace, &name)(error)),
        };
    }
    write_status(
        sandbox,
        current.as_ref(),
        decide::expired_status(sandbox, now, true),
        ctx,
    )
    .await?;
    Ok(Action::await_change())
}
