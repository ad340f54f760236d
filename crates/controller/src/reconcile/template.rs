//! The SandboxTemplate reconciler: stamps the template's name-hash label and keeps its shared
//! NetworkPolicy (see [`crate::decide::network_policy`]).

use std::sync::Arc;

use agent_sandbox_api::{SandboxTemplate, kinds, labels, name_hash};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::context::Context;
use crate::decide::network_policy::{desired_policy, drifted, policy_name};
use crate::decide::{Ownership, ownership};
use crate::error::{Error, Result, is_conflict, is_not_found, kube_err};

/// Reconciles one SandboxTemplate.
pub async fn reconcile(template: Arc<SandboxTemplate>, ctx: Arc<Context>) -> Result<Action> {
    if template.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let namespace = template.namespace().unwrap_or_default();
    let name = template.name_any();
    let hash = name_hash(&name);
    if template.labels().get(labels::SANDBOX_TEMPLATE_REF_HASH) != Some(&hash) {
        let api: Api<SandboxTemplate> = Api::namespaced(ctx.client.clone(), &namespace);
        let patch = json!({"metadata": {"labels": {labels::SANDBOX_TEMPLATE_REF_HASH: hash}}});
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(kube_err(
                "label",
                kinds::SANDBOX_TEMPLATE,
                &namespace,
                &name,
            ))?;
    }

    let policies: Api<NetworkPolicy> = Api::namespaced(ctx.client.clone(), &namespace);
    let policy = policy_name(&template);
    let existing = ctx
        .caches
        .policies
        .get(&ObjectRef::<NetworkPolicy>::new(&policy).within(&namespace));
    let owned = existing.as_ref().map(|p| {
        ownership(
            &p.metadata,
            template.metadata.uid.as_deref().unwrap_or_default(),
        )
    });
    match (desired_policy(&template, &ctx.config.policy), existing) {
        (None, Some(_)) if owned == Some(Ownership::Owned) => {
            match policies.delete(&policy, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(error) if is_not_found(&error) => {}
                Err(error) => {
                    return Err(kube_err("delete", "NetworkPolicy", &namespace, &policy)(
                        error,
                    ));
                }
            }
        }
        (None, _) => {}
        (Some(desired), None) => {
            let params = PostParams {
                dry_run: false,
                field_manager: Some(agent_sandbox_api::wire::CONTROLLER_FIELD_MANAGER.to_owned()),
            };
            match policies.create(&params, &desired).await {
                Ok(_) => {}
                // Created by an earlier pass the cache has not shown yet: the next pass checks it.
                Err(error) if is_conflict(&error) => {
                    return Ok(Action::requeue(std::time::Duration::from_secs(1)));
                }
                Err(error) => {
                    return Err(kube_err("create", "NetworkPolicy", &namespace, &policy)(
                        error,
                    ));
                }
            }
        }
        (Some(desired), Some(existing)) => {
            if owned != Some(Ownership::Owned) {
                return Err(Error::Ownership(format!(
                    "NetworkPolicy {namespace}/{policy} exists and is not controlled by SandboxTemplate {name}; \
                     delete it or set networkPolicyManagement: Unmanaged"
                )));
            }
            if drifted(&existing, &desired) {
                let patch = json!({"metadata": {"resourceVersion": existing.metadata.resource_version}, "spec": desired.spec});
                policies
                    .patch(&policy, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map_err(kube_err("correct", "NetworkPolicy", &namespace, &policy))?;
            }
        }
    }
    Ok(Action::await_change())
}
