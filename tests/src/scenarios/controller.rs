//! The controller issue's scenarios: warm adoption and refill, concurrent claims, expiry,
//! deletion, suspend and resume, and the template's NetworkPolicy.

use std::collections::BTreeSet;

use agent_sandbox_api::claim::{ClaimLifecycle, ClaimShutdownPolicy};
use agent_sandbox_api::kinds;
use agent_sandbox_api::sandbox::OperatingMode;
use agent_sandbox_api::template::NetworkPolicyManagement;
use agent_sandbox_api::{
    Sandbox, SandboxClaim, SandboxSpec, SandboxTemplate, SandboxWarmPool, labels, name_hash,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, ResourceExt as _};
use serde_json::json;

use super::Verdict;
use crate::cluster::ClusterUnderTest;
use crate::ensure;
use crate::error::{Error, Result};
use crate::support::{
    Check, WAIT, claim, create, describe_conditions, get, pod_name, pool, run_labels,
    sandbox_ready, sandbox_suspended, wait_claim_ready, wait_for, wait_gone, wait_pool_ready,
};

/// The Sandboxes a pool owns, unclaimed.
async fn members(cluster: &ClusterUnderTest, pool: &str) -> Result<Vec<Sandbox>> {
    let sandboxes: Api<Sandbox> = cluster.api();
    Ok(sandboxes
        .list(&Default::default())
        .await
        .map_err(Error::kube("list sandboxes"))?
        .items
        .into_iter()
        .filter(|s| {
            s.owner_references()
                .iter()
                .any(|o| o.kind == kinds::SANDBOX_WARM_POOL && o.name == pool)
        })
        .collect())
}

async fn delete<K>(api: &Api<K>, kind: &str, name: &str) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 404 => {}
        Err(e) => return Err(Error::kube(format!("delete {kind} {name}"))(e)),
    }
    wait_gone(api, kind, name).await
}

/// A claim on a fresh pool of one adopts that pool's running member (same pod, not restarted,
/// relabelled as warm and owned by the claim), and the pool makes a new member.
pub(super) async fn a_warm_claim_adopts_a_running_member_and_the_pool_refills(
    cluster: &ClusterUnderTest,
) -> Result<Verdict> {
    let pools: Api<SandboxWarmPool> = cluster.api();
    let claims: Api<SandboxClaim> = cluster.api();
    let sandboxes: Api<Sandbox> = cluster.api();
    let pods: Api<Pod> = cluster.api();
    let pool_name = cluster.name("warm");
    create(
        &pools,
        &pool(&pool_name, &cluster.scenario_template, 1, &cluster.run),
    )
    .await?;
    wait_pool_ready(&pools, &pool_name, 1).await?;
    let before = members(cluster, &pool_name).await?;
    ensure!(
        before.len() == 1,
        "pool {pool_name} of one has {} members",
        before.len()
    );
    let member = before[0].name_any();
    let member_pod = get(&pods, &pod_name(&before[0]))
        .await?
        .ok_or_else(|| Error::Check(format!("the pod of ready member {member} is missing")))?;

    let claim_name = cluster.name("claim");
    create(&claims, &claim(&claim_name, &pool_name, &cluster.run)).await?;
    let ready = wait_claim_ready(&claims, &claim_name).await?;
    let adopted = ready.status.as_ref().map(|s| s.sandbox.name.clone());
    ensure!(
        adopted.as_deref() == Some(member.as_str()),
        "claim {claim_name} got sandbox {adopted:?}, not the pool's ready member {member}"
    );
    let sandbox = get(&sandboxes, &member)
        .await?
        .ok_or_else(|| Error::Check(format!("adopted sandbox {member} disappeared")))?;
    let owners: Vec<_> = sandbox
        .owner_references()
        .iter()
        .map(|o| format!("{}/{}", o.kind, o.name))
        .collect();
    ensure!(
        owners == [format!("SandboxClaim/{claim_name}")],
        "adopted sandbox {member} is owned by {owners:?}, not only by its claim"
    );
    ensure!(
        sandbox
            .labels()
            .get(labels::LAUNCH_TYPE)
            .map(String::as_str)
            == Some(labels::LAUNCH_TYPE_WARM),
        "adopted sandbox {member} has launch type {:?}",
        sandbox.labels().get(labels::LAUNCH_TYPE)
    );
    let pod_now = get(&pods, &pod_name(&sandbox)).await?;
    ensure!(
        pod_now.as_ref().and_then(|p| p.metadata.uid.clone()) == member_pod.metadata.uid,
        "adoption replaced the running pod of {member}"
    );

    wait_for(
        &format!("pool {pool_name} to make a new ready member"),
        WAIT,
        || async {
            let now = members(cluster, &pool_name).await?;
            let fresh = now
                .iter()
                .filter(|s| s.name_any() != member && sandbox_ready(s))
                .count();
            Ok(if fresh >= 1 {
                Check::Done(())
            } else {
                Check::NotYet(format!("{} members, none ready and new", now.len()))
            })
        },
    )
    .await?;
    delete(&claims, kinds::SANDBOX_CLAIM, &claim_name).await?;
    wait_gone(&sandboxes, kinds::SANDBOX, &member).await?;
    delete(&pools, kinds::SANDBOX_WARM_POOL, &pool_name).await?;
    Ok(Verdict::Passed)
}

/// Four claims at once on a pool of two: four Ready claims on four distinct sandboxes, the
/// pool's two members among them.
pub(super) async fn concurrent_claims_get_distinct_sandboxes_warm_then_cold(
    cluster: &ClusterUnderTest,
) -> Result<Verdict> {
    let pools: Api<SandboxWarmPool> = cluster.api();
    let claims: Api<SandboxClaim> = cluster.api();
    let pool_name = cluster.name("burst");
    create(
        &pools,
        &pool(&pool_name, &cluster.scenario_template, 2, &cluster.run),
    )
    .await?;
    wait_pool_ready(&pools, &pool_name, 2).await?;
    let warm: BTreeSet<String> = members(cluster, &pool_name)
        .await?
        .iter()
        .map(kube::ResourceExt::name_any)
        .collect();

    let names: Vec<String> = (0..4).map(|i| cluster.name(&format!("c{i}"))).collect();
    let creations = names.iter().map(|name| {
        let claims = claims.clone();
        let object = claim(name, &pool_name, &cluster.run);
        async move { create(&claims, &object).await }
    });
    for created in futures_util::future::join_all(creations).await {
        created?;
    }
    let mut sandboxes = BTreeSet::new();
    for name in &names {
        let ready = wait_claim_ready(&claims, name).await?;
        let sandbox = ready.status.map(|s| s.sandbox.name).unwrap_or_default();
        ensure!(
            sandboxes.insert(sandbox.clone()),
            "two claims share sandbox {sandbox}"
        );
    }
    let adopted = sandboxes.intersection(&warm).count();
    ensure!(
        adopted >= 1,
        "none of the pool's ready members {warm:?} was adopted (claims got {sandboxes:?})"
    );
    for name in &names {
        delete(&claims, kinds::SANDBOX_CLAIM, name).await?;
    }
    delete(&pools, kinds::SANDBOX_WARM_POOL, &pool_name).await?;
    Ok(Verdict::Passed)
}

/// A claim whose shutdown time passes with policy `Delete` is deleted, and so is the sandbox it
/// adopted (upstream's expiry missed adopted sandboxes).
pub(super) async fn an_expired_claim_is_deleted_with_its_sandbox(
    cluster: &ClusterUnderTest,
) -> Result<Verdict> {
    let claims: Api<SandboxClaim> = cluster.api();
    let sandboxes: Api<Sandbox> = cluster.api();
    let name = cluster.name("expiring");
    create(&claims, &claim(&name, &cluster.pool, &cluster.run)).await?;
    let ready = wait_claim_ready(&claims, &name).await?;
    let sandbox = ready.status.map(|s| s.sandbox.name).unwrap_or_default();
    let soon = Time(jiff::Timestamp::now() + jiff::SignedDuration::from_secs(2));
    let lifecycle = ClaimLifecycle {
        shutdown_time: Some(soon),
        ttl_seconds_after_finished: None,
        shutdown_policy: ClaimShutdownPolicy::Delete,
    };
    claims
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"lifecycle": lifecycle}})),
        )
        .await
        .map_err(Error::kube(format!(
            "set the shutdown time of claim {name}"
        )))?;
    wait_gone(&claims, "SandboxClaim (expired)", &name).await?;
    wait_gone(&sandboxes, "Sandbox of the expired claim", &sandbox).await?;
    Ok(Verdict::Passed)
}

/// Deleting a claim deletes its sandbox and the sandbox's pod.
pub(super) async fn deleting_a_claim_deletes_its_sandbox_and_pod(
    cluster: &ClusterUnderTest,
) -> Result<Verdict> {
    let claims: Api<SandboxClaim> = cluster.api();
    let sandboxes: Api<Sandbox> = cluster.api();
    let pods: Api<Pod> = cluster.api();
    let name = cluster.name("deleted");
    create(&claims, &claim(&name, &cluster.pool, &cluster.run)).await?;
    let ready = wait_claim_ready(&claims, &name).await?;
    let sandbox_name = ready.status.map(|s| s.sandbox.name).unwrap_or_default();
    let sandbox = get(&sandboxes, &sandbox_name).await?.ok_or_else(|| {
        Error::Check(format!(
            "sandbox {sandbox_name} of a Ready claim is missing"
        ))
    })?;
    let pod = pod_name(&sandbox);
    ensure!(
        get(&pods, &pod).await?.is_some(),
        "pod {pod} of Ready sandbox {sandbox_name} is missing"
    );
    delete(&claims, kinds::SANDBOX_CLAIM, &name).await?;
    wait_gone(&sandboxes, kinds::SANDBOX, &sandbox_name).await?;
    wait_gone(&pods, "Pod", &pod).await?;
    Ok(Verdict::Passed)
}

/// A Sandbox on the template's blueprint: suspending deletes its pod and reports
/// `Suspended=True`; resuming brings a new pod and Ready back.
pub(super) async fn a_suspended_sandbox_loses_its_pod_and_resumes(
    cluster: &ClusterUnderTest,
) -> Result<Verdict> {
    let templates: Api<SandboxTemplate> = cluster.api();
    let sandboxes: Api<Sandbox> = cluster.api();
    let pods: Api<Pod> = cluster.api();
    let template = get(&templates, &cluster.template)
        .await?
        .ok_or_else(|| Error::Check(format!("template {} is missing", cluster.template)))?;
    let name = cluster.name("suspend");
    let mut sandbox = Sandbox::new(
        &name,
        SandboxSpec {
            blueprint: template.spec.blueprint.clone(),
            ..SandboxSpec::default()
        },
    );
    sandbox.metadata.labels = Some(run_labels(&cluster.run));
    create(&sandboxes, &sandbox).await?;
    let ready = wait_sandbox(&sandboxes, &name, "Ready", sandbox_ready).await?;
    let pod = pod_name(&ready);
    let first = get(&pods, &pod)
        .await?
        .and_then(|p| p.metadata.uid)
        .ok_or_else(|| Error::Check(format!("pod {pod} of Ready sandbox {name} is missing")))?;

    set_mode(&sandboxes, &name, OperatingMode::Suspended).await?;
    wait_sandbox(&sandboxes, &name, "Suspended", sandbox_suspended).await?;
    wait_gone(&pods, "Pod of the suspended sandbox", &pod).await?;

    set_mode(&sandboxes, &name, OperatingMode::Running).await?;
    let resumed = wait_sandbox(&sandboxes, &name, "Ready again", sandbox_ready).await?;
    let second = get(&pods, &pod_name(&resumed))
        .await?
        .and_then(|p| p.metadata.uid);
    ensure!(
        second.is_some() && second.as_deref() != Some(first.as_str()),
        "resuming {name} did not create a new pod (first {first}, now {second:?})"
    );
    delete(&sandboxes, kinds::SANDBOX, &name).await?;
    Ok(Verdict::Passed)
}

async fn set_mode(api: &Api<Sandbox>, name: &str, mode: OperatingMode) -> Result<()> {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"operatingMode": mode}})),
    )
    .await
    .map_err(Error::kube(format!("set the operating mode of {name}")))?;
    Ok(())
}

async fn wait_sandbox(
    api: &Api<Sandbox>,
    name: &str,
    state: &str,
    check: fn(&Sandbox) -> bool,
) -> Result<Sandbox> {
    wait_for(&format!("sandbox {name} to be {state}"), WAIT, || async {
        Ok(match get(api, name).await? {
            Some(sandbox) if check(&sandbox) => Check::Done(sandbox),
            Some(sandbox) => {
                Check::NotYet(sandbox.status.as_ref().map_or("no status".to_owned(), |s| {
                    describe_conditions(&s.conditions)
                }))
            }
            None => Check::NotYet("the sandbox does not exist".to_owned()),
        })
    })
    .await
}

/// The template's managed NetworkPolicy selects its sandboxes, admits only the router's pods
/// and denies egress to private, link-local and metadata ranges.
pub(super) async fn the_template_policy_admits_only_the_router(
    cluster: &ClusterUnderTest,
) -> Result<Verdict> {
    let templates: Api<SandboxTemplate> = cluster.api();
    let template = get(&templates, &cluster.template)
        .await?
        .ok_or_else(|| Error::Check(format!("template {} is missing", cluster.template)))?;
    if template.spec.network_policy_management == NetworkPolicyManagement::Unmanaged {
        return Ok(Verdict::Skipped(format!(
            "template {} manages its network itself (networkPolicyManagement: Unmanaged)",
            cluster.template
        )));
    }
    let policies: Api<NetworkPolicy> = cluster.api();
    let name = format!("{}-network-policy", cluster.template);
    let policy = get(&policies, &name)
        .await?
        .ok_or_else(|| Error::Check(format!("NetworkPolicy {name} is missing")))?;
    let spec = serde_json::to_value(policy.spec)
        .map_err(|e| Error::Check(format!("NetworkPolicy {name}: {e}")))?;
    ensure!(
        spec["podSelector"]["matchLabels"][labels::SANDBOX_TEMPLATE_REF_HASH]
            == json!(name_hash(&cluster.template)),
        "{name} does not select the template's sandboxes: {}",
        spec["podSelector"]
    );
    ensure!(
        spec["policyTypes"] == json!(["Ingress", "Egress"]),
        "{name} has policy types {}",
        spec["policyTypes"]
    );
    let peer = &spec["ingress"][0]["from"][0];
    ensure!(
        peer["namespaceSelector"]["matchLabels"][labels::NAMESPACE_NAME]
            == json!(cluster.router.namespace)
            && peer["podSelector"]["matchLabels"][labels::ROUTER_APP]
                == json!(labels::ROUTER_APP_VALUE),
        "{name} admits {peer}, not the router pods of {}",
        cluster.router.namespace
    );
    let except = spec["egress"][0]["to"][0]["ipBlock"]["except"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for private in [
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "169.254.0.0/16",
    ] {
        ensure!(
            except.contains(&json!(private)),
            "{name} does not deny egress to {private} (except: {except:?})"
        );
    }
    Ok(Verdict::Passed)
}
