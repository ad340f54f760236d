//! Decisions of the SandboxWarmPool reconciler: what a member looks like, which members are
//! stale, which to delete, how many to create, and the pool's status; [`plan`] puts them together
//! into one pass's writes, in order, which `reconcile::warm_pool` carries out.

use std::collections::BTreeMap;
use std::time::Duration;

use agent_sandbox_api::conditions::{sandbox as cond, warm_pool as pool_cond};
use agent_sandbox_api::sandbox::Sandbox;
use agent_sandbox_api::warm_pool::UpdateStrategyType;
use agent_sandbox_api::wire::controller_flags;
use agent_sandbox_api::{
    SandboxSpec, SandboxTemplate, SandboxWarmPool, SandboxWarmPoolStatus, annotations, fnv1a_32,
    labels, name_hash,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use super::secure_defaults::{self, DnsMode};
use super::{
    Ownership, after, condition, controller_reference, find_condition, is_condition_true,
    ownership, remaining, remove_condition, set_condition,
};

/// Settings that shape pool members.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberSettings {
    /// DNS of sandboxes in the secure network mode.
    pub dns: DnsMode,
    /// Whether idle members' pods may be evicted by the cluster autoscaler
    /// (`cluster-autoscaler.kubernetes.io/safe-to-evict: "true"` in their pod template).
    pub safe_to_evict: bool,
}

fn hex(hash: u32) -> String {
    format!("{hash:08x}")
}

/// Hash of the template's blueprint (pod template, volume claim templates, service), written to
/// the `sandbox-template-hash` label of members to detect staleness.
pub fn blueprint_hash(template: &SandboxTemplate) -> String {
    let json = serde_json::to_vec(&template.spec.blueprint).unwrap_or_default();
    hex(fnv1a_32(&json))
}

/// Hash of the template's pod template (upstream's deprecated `sandbox-pod-template-hash`).
pub fn pod_template_hash(template: &SandboxTemplate) -> String {
    let json = serde_json::to_vec(&template.spec.blueprint.pod_template).unwrap_or_default();
    hex(fnv1a_32(&json))
}

/// The label value that marks members of `pool`.
pub fn pool_hash(pool: &SandboxWarmPool) -> String {
    name_hash(pool.metadata.name.as_deref().unwrap_or_default())
}

/// The spec a sandbox built from `template` gets (blueprint plus secure defaults).
pub fn sandbox_spec(template: &SandboxTemplate, dns: &DnsMode) -> SandboxSpec {
    let mut blueprint = template.spec.blueprint.clone();
    secure_defaults::apply(template, dns, &mut blueprint.pod_template.spec);
    SandboxSpec {
        blueprint,
        ..SandboxSpec::default()
    }
}

/// A new member of `pool` (created with `generateName: <pool>-`).
pub fn member(
    pool: &SandboxWarmPool,
    template: &SandboxTemplate,
    settings: &MemberSettings,
) -> Sandbox {
    let pool_name = pool.metadata.name.as_deref().unwrap_or_default();
    let template_name = template.metadata.name.as_deref().unwrap_or_default();
    let mut spec = sandbox_spec(template, &settings.dns);
    if settings.safe_to_evict {
        spec.blueprint
            .pod_template
            .metadata
            .annotations
            .entry(annotations::SAFE_TO_EVICT.to_owned())
            .or_insert_with(|| "true".to_owned());
    }
    Sandbox {
        metadata: ObjectMeta {
            generate_name: Some(format!("{pool_name}-")),
            namespace: pool.metadata.namespace.clone(),
            labels: Some(BTreeMap::from([
                (labels::WARM_POOL_SANDBOX.to_owned(), pool_hash(pool)),
                (
                    labels::SANDBOX_TEMPLATE_REF_HASH.to_owned(),
                    name_hash(template_name),
                ),
                (
                    labels::LAUNCH_TYPE.to_owned(),
                    labels::LAUNCH_TYPE_WARM.to_owned(),
                ),
                (
                    labels::SANDBOX_POD_TEMPLATE_HASH.to_owned(),
                    pod_template_hash(template),
                ),
                (
                    labels::SANDBOX_TEMPLATE_HASH.to_owned(),
                    blueprint_hash(template),
                ),
                (
                    labels::CREATED_BY.to_owned(),
                    labels::CREATED_BY_CONTROLLER.to_owned(),
                ),
            ])),
            annotations: Some(BTreeMap::from([(
                annotations::SANDBOX_TEMPLATE_REF.to_owned(),
                template_name.to_owned(),
            )])),
            owner_references: Some(vec![controller_reference(pool)]),
            ..ObjectMeta::default()
        },
        spec,
        status: None,
    }
}

fn label<'a>(sandbox: &'a Sandbox, key: &str) -> Option<&'a str> {
    sandbox
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(key))
        .map(String::as_str)
}

/// True when `member` was built from something other than the current `template`: another
/// template, or an older blueprint that also differs semantically (pod spec after secure
/// defaults, volume claim templates, service).
pub fn is_stale(member: &Sandbox, template: &SandboxTemplate, dns: &DnsMode) -> bool {
    let template_name = template.metadata.name.as_deref().unwrap_or_default();
    if label(member, labels::SANDBOX_TEMPLATE_REF_HASH) != Some(name_hash(template_name).as_str()) {
        return true;
    }
    if label(member, labels::SANDBOX_TEMPLATE_HASH) == Some(blueprint_hash(template).as_str()) {
        return false;
    }
    let want = sandbox_spec(template, dns).blueprint;
    let have = &member.spec.blueprint;
    have.pod_template.spec != want.pod_template.spec
        || have.volume_claim_templates != want.volume_claim_templates
        || have.service != want.service
}

/// True when the member's sandbox is Ready.
pub fn is_ready(member: &Sandbox) -> bool {
    member
        .status
        .as_ref()
        .is_some_and(|status| is_condition_true(&status.conditions, cond::READY))
}

/// True when the member's pod cannot be scheduled (held, not replaced).
pub fn is_unschedulable(member: &Sandbox) -> bool {
    member
        .status
        .as_ref()
        .and_then(|status| find_condition(&status.conditions, cond::POD_SCHEDULED))
        .is_some_and(|scheduled| scheduled.status == "False" && scheduled.reason == "Unschedulable")
}

fn is_deleting(member: &Sandbox) -> bool {
    member.metadata.deletion_timestamp.is_some()
}

fn created(member: &Sandbox) -> Timestamp {
    member
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(Timestamp::UNIX_EPOCH, |time| time.0)
}

/// True while members are wanted for the pool with `uid`: `pool` (its metadata, from the cache
/// or the API) is that pool and is not being deleted. Creation stops the moment this turns false.
pub fn still_wanted(pool: Option<&ObjectMeta>, uid: &str) -> bool {
    pool.is_some_and(|meta| meta.uid.as_deref() == Some(uid) && meta.deletion_timestamp.is_none())
}

/// Tunables of [`plan_members`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanSettings {
    /// Members not Ready after this long are replaced (unschedulable ones are held).
    pub readiness_grace: Duration,
    /// At most this many members are created per pass.
    pub max_batch: usize,
    /// At most this many members are kept per pool, whatever `spec.replicas` says.
    pub max_replicas: usize,
    /// DNS of members, for staleness.
    pub dns: DnsMode,
}

/// What the pool reconciler should do in one pass.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MemberPlan {
    /// How many new members to create.
    pub create: usize,
    /// Members to delete, by name, with the reason.
    pub delete: Vec<(String, &'static str)>,
    /// Members held although not Ready in time, because they cannot be scheduled.
    pub unschedulable: Vec<String>,
    /// The status to write.
    pub status: SandboxWarmPoolStatus,
    /// When to look again (the earliest readiness deadline), if any.
    pub recheck_after: Option<Duration>,
}

/// Plans a pass over `members` (the pool's current members, from the cache) given `pending`
/// creations not yet visible in the cache.
pub fn plan_members(
    pool: &SandboxWarmPool,
    template: Option<&SandboxTemplate>,
    members: &[&Sandbox],
    pending: usize,
    settings: &PlanSettings,
    now: Timestamp,
) -> MemberPlan {
    let mut plan = MemberPlan::default();
    let requested = usize::try_from(pool.spec.replicas.max(0)).unwrap_or(0);
    let desired = requested.min(settings.max_replicas);
    let recreate = pool.spec.update_strategy_type() == UpdateStrategyType::Recreate;
    let (mut kept, deleting) = triage(
        members,
        template.filter(|_| recreate),
        settings,
        now,
        &mut plan,
    );
    scale_down(&mut kept, desired, &mut plan);
    // Members being deleted count against the target, so that a slow deletion cannot make the
    // pool overshoot; so do creations the cache has not shown yet.
    let present = kept.len() + deleting + pending;
    if template.is_some() {
        plan.create = desired.saturating_sub(present).min(settings.max_batch);
    }
    plan.status = pool_status(pool, &kept, requested, desired, now);
    plan
}

/// Sorts `members` into those kept and those to delete (stale under `recreate_for`'s template,
/// or not Ready within the grace period unless unschedulable); returns the kept ones and how
/// many are being deleted already.
fn triage<'a>(
    members: &[&'a Sandbox],
    recreate_for: Option<&SandboxTemplate>,
    settings: &PlanSettings,
    now: Timestamp,
    plan: &mut MemberPlan,
) -> (Vec<&'a Sandbox>, usize) {
    let mut kept: Vec<&Sandbox> = Vec::new();
    let mut deleting = 0usize;
    for member in members {
        let name = member.metadata.name.clone().unwrap_or_default();
        if is_deleting(member) {
            deleting += 1;
            continue;
        }
        if recreate_for.is_some_and(|template| is_stale(member, template, &settings.dns)) {
            plan.delete.push((name, "stale"));
            continue;
        }
        if !is_ready(member) {
            let deadline = after(created(member), settings.readiness_grace);
            match remaining(deadline, now) {
                None if is_unschedulable(member) => plan.unschedulable.push(name),
                None => {
                    plan.delete
                        .push((name, "not ready within the readiness grace period"));
                    continue;
                }
                Some(left) => {
                    plan.recheck_after =
                        Some(plan.recheck_after.map_or(left, |current| current.min(left)));
                }
            }
        }
        kept.push(member);
    }
    (kept, deleting)
}

/// Scale down to `desired`: unready members first, then the newest.
fn scale_down(kept: &mut Vec<&Sandbox>, desired: usize, plan: &mut MemberPlan) {
    if kept.len() <= desired {
        return;
    }
    let mut order = kept.clone();
    order.sort_by(|a, b| {
        is_ready(a)
            .cmp(&is_ready(b))
            .then(created(b).cmp(&created(a)))
            .then(b.metadata.name.cmp(&a.metadata.name))
    });
    let excess = kept.len() - desired;
    let doomed: Vec<String> = order
        .iter()
        .take(excess)
        .filter_map(|m| m.metadata.name.clone())
        .collect();
    kept.retain(|m| !doomed.contains(m.metadata.name.as_ref().unwrap_or(&String::new())));
    plan.delete
        .extend(doomed.into_iter().map(|name| (name, "scale down")));
}

/// The pool's status after a pass that keeps `kept`; `Capped` says when `requested` is more than
/// the `desired` this controller keeps.
fn pool_status(
    pool: &SandboxWarmPool,
    kept: &[&Sandbox],
    requested: usize,
    desired: usize,
    now: Timestamp,
) -> SandboxWarmPoolStatus {
    let ready = kept.iter().filter(|m| is_ready(m)).count();
    let mut conditions = pool
        .status
        .as_ref()
        .map(|status| status.conditions.clone())
        .unwrap_or_default();
    if requested > desired {
        let message = format!(
            "spec.replicas {requested} is more than this controller keeps per pool ({desired}, \
             --{}); keeping {desired}",
            controller_flags::WARM_POOL_MAX_REPLICAS
        );
        set_condition(
            &mut conditions,
            condition(
                pool_cond::CAPPED,
                true,
                pool_cond::REASON_MAX_REPLICAS_EXCEEDED,
                message,
                pool.metadata.generation,
            ),
            now,
        );
    } else {
        remove_condition(&mut conditions, pool_cond::CAPPED);
    }
    SandboxWarmPoolStatus {
        replicas: i32::try_from(kept.len()).unwrap_or(i32::MAX),
        ready_replicas: i32::try_from(ready).unwrap_or(i32::MAX),
        selector: format!("{}={}", labels::WARM_POOL_SANDBOX, pool_hash(pool)),
        observed_generation: pool.metadata.generation.unwrap_or(0),
        conditions,
    }
}

/// A pass's writes, in the order the reconciler carries them out: adopt orphans, delete
/// members, the `WarmPoolNotProgressing` Event, the status (before the creations, which are
/// paced and may take a while: a `Capped` pool says so at once), then the creations.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan<'a> {
    /// Sandboxes with the pool's label and no controller, and the conditional write that makes
    /// the pool their controller (they count as members from the next pass on).
    pub orphans: Vec<(&'a Sandbox, Value)>,
    /// Members to delete (conditional on their UID), with the reason.
    pub delete: Vec<(&'a Sandbox, &'static str)>,
    /// The Event's note, when members are held although not Ready in time.
    pub not_progressing: Option<String>,
    /// The status to write (`None`: unchanged).
    pub status: Option<SandboxWarmPoolStatus>,
    /// The member to create, and how many of it.
    pub create: Option<(Sandbox, usize)>,
    /// When to look again (the earliest readiness deadline), if any.
    pub recheck_after: Option<Duration>,
}

/// What one pass over a pool found in the caches.
#[derive(Clone, Copy, Debug)]
pub struct Observed<'a> {
    /// The pool's template, if it exists.
    pub template: Option<&'a SandboxTemplate>,
    /// The sandboxes carrying the pool's label.
    pub labelled: &'a [&'a Sandbox],
    /// Members created that the cache does not show yet.
    pub pending: usize,
    /// The freshest status known (what this controller wrote last, while the cache lags).
    pub current: Option<&'a SandboxWarmPoolStatus>,
    /// The time of the pass.
    pub now: Timestamp,
}

/// Decides one pass over `pool`.
pub fn plan<'a>(
    pool: &SandboxWarmPool,
    observed: &Observed<'a>,
    settings: &PlanSettings,
    member_settings: &MemberSettings,
) -> Plan<'a> {
    let Observed {
        template,
        labelled,
        pending,
        current,
        now,
    } = *observed;
    let uid = pool.metadata.uid.as_deref().unwrap_or_default();
    let mut members = Vec::new();
    let mut orphans = Vec::new();
    for sandbox in labelled {
        match ownership(&sandbox.metadata, uid) {
            Ownership::Owned => members.push(*sandbox),
            Ownership::Unowned => {
                let patch = json!({"metadata": {
                    "resourceVersion": sandbox.metadata.resource_version,
                    "ownerReferences": [controller_reference(pool)],
                }});
                orphans.push((*sandbox, patch));
            }
            Ownership::OwnedByOther(_) => {}
        }
    }
    let plan = plan_members(pool, template, &members, pending, settings, now);
    let delete = plan
        .delete
        .iter()
        .filter_map(|(name, reason)| {
            let member = members
                .iter()
                .find(|m| m.metadata.name.as_ref() == Some(name))?;
            Some((*member, *reason))
        })
        .collect();
    Plan {
        orphans,
        delete,
        not_progressing: (!plan.unschedulable.is_empty()).then(|| {
            format!(
                "members cannot be scheduled and are held instead of replaced: {}",
                plan.unschedulable.join(", ")
            )
        }),
        status: (current != Some(&plan.status)).then(|| plan.status.clone()),
        create: template
            .filter(|_| plan.create > 0)
            .map(|template| (member(pool, template, member_settings), plan.create)),
        recheck_after: plan.recheck_after,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::fixtures::{now, pod_spec};
    use crate::decide::{condition, set_condition};
    use agent_sandbox_api::sandbox::{PodTemplate, SandboxBlueprint, SandboxStatus};
    use agent_sandbox_api::warm_pool::{SandboxTemplateRef, UpdateStrategy};
    use agent_sandbox_api::{SandboxTemplateSpec, SandboxWarmPoolSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn template() -> SandboxTemplate {
        let mut template = SandboxTemplate::new(
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
        template.metadata.namespace = Some("default".into());
        template
    }

    fn pool(replicas: i32) -> SandboxWarmPool {
        let mut pool = SandboxWarmPool::new(
            "pool",
            SandboxWarmPoolSpec {
                replicas,
                sandbox_template_ref: SandboxTemplateRef {
                    name: "python".into(),
                },
                update_strategy: None,
                claim_defaults: None,
            },
        );
        pool.metadata.namespace = Some("default".into());
        pool.metadata.uid = Some("pool-uid".into());
        pool.metadata.generation = Some(3);
        pool
    }

    fn settings() -> MemberSettings {
        MemberSettings {
            dns: DnsMode::Public(vec!["8.8.8.8".into()]),
            safe_to_evict: false,
        }
    }

    fn plan_settings() -> PlanSettings {
        PlanSettings {
            readiness_grace: Duration::from_secs(300),
            max_batch: 300,
            max_replicas: 1000,
            dns: settings().dns,
        }
    }

    fn built(name: &str, age_secs: i64, ready: bool) -> Sandbox {
        let mut m = member(&pool(1), &template(), &settings());
        m.metadata.name = Some(name.into());
        m.metadata.creation_timestamp = Some(Time(
            now() - k8s_openapi::jiff::SignedDuration::from_secs(age_secs),
        ));
        let mut status = SandboxStatus::default();
        set_condition(
            &mut status.conditions,
            condition("Ready", ready, "r", "", Some(1)),
            now(),
        );
        m.status = Some(status);
        m
    }

    #[test]
    fn member_shape() {
        let m = member(&pool(1), &template(), &settings());
        assert_eq!(m.metadata.generate_name.as_deref(), Some("pool-"));
        let l = m.metadata.labels.clone().unwrap();
        assert_eq!(l[labels::WARM_POOL_SANDBOX], name_hash("pool"));
        assert_eq!(l[labels::SANDBOX_TEMPLATE_REF_HASH], name_hash("python"));
        assert_eq!(l[labels::LAUNCH_TYPE], "warm");
        assert_eq!(l[labels::CREATED_BY], "controller");
        assert_eq!(
            m.metadata.owner_references.unwrap()[0].kind,
            agent_sandbox_api::kinds::SANDBOX_WARM_POOL
        );
        assert_eq!(
            m.spec
                .blueprint
                .pod_template
                .spec
                .automount_service_account_token,
            Some(false)
        );
        assert!(
            m.spec
                .blueprint
                .pod_template
                .metadata
                .annotations
                .is_empty()
        );
        let evictable = member(
            &pool(1),
            &template(),
            &MemberSettings {
                safe_to_evict: true,
                ..settings()
            },
        );
        assert_eq!(
            evictable.spec.blueprint.pod_template.metadata.annotations[annotations::SAFE_TO_EVICT],
            "true"
        );
    }

    #[test]
    fn fills_up_to_replicas_counting_pending_and_deleting() {
        let a = built("a", 10, true);
        let mut b = built("b", 10, false);
        b.metadata.deletion_timestamp = Some(Time(now()));
        let plan = plan_members(
            &pool(5),
            Some(&template()),
            &[&a, &b],
            1,
            &plan_settings(),
            now(),
        );
        assert_eq!(plan.create, 2);
        assert_eq!(plan.status.replicas, 1);
        assert_eq!(plan.status.ready_replicas, 1);
        assert_eq!(plan.status.observed_generation, 3);
        assert_eq!(
            plan.status.selector,
            format!("agents.x-k8s.io/warm-pool-sandbox={}", name_hash("pool"))
        );
        let capped = super::plan_members(
            &pool(500),
            Some(&template()),
            &[],
            0,
            &PlanSettings {
                max_batch: 8,
                ..plan_settings()
            },
            now(),
        );
        assert_eq!(capped.create, 8);
        let no_template = super::plan_members(&pool(5), None, &[], 0, &plan_settings(), now());
        assert_eq!(no_template.create, 0);
    }

    /// Regression (issue 15): `replicas: 1000000` was pursued without limit.
    #[test]
    fn a_pool_above_the_maximum_is_capped_and_says_so() {
        let settings = PlanSettings {
            max_replicas: 4,
            ..plan_settings()
        };
        let members: Vec<Sandbox> = (0..3).map(|i| built(&format!("m{i}"), 10, true)).collect();
        let refs: Vec<&Sandbox> = members.iter().collect();
        let huge = pool(1_000_000);
        let capped = plan_members(&huge, Some(&template()), &refs, 0, &settings, now());
        assert_eq!(
            capped.create, 1,
            "filled to the maximum, not to spec.replicas"
        );
        let [condition] = capped.status.conditions.as_slice() else {
            panic!("one condition: {:?}", capped.status.conditions)
        };
        assert_eq!(
            (
                condition.type_.as_str(),
                condition.status.as_str(),
                condition.reason.as_str(),
                condition.observed_generation
            ),
            ("Capped", "True", "MaxReplicasExceeded", Some(3))
        );
        assert_eq!(
            condition.message,
            "spec.replicas 1000000 is more than this controller keeps per pool (4, \
             --sandbox-warm-pool-max-replicas); keeping 4"
        );

        // Members beyond a lowered maximum go; the condition stays while the pool asks for more.
        let five: Vec<Sandbox> = (0..5)
            .map(|i| built(&format!("m{i}"), 10 + i, true))
            .collect();
        let refs: Vec<&Sandbox> = five.iter().collect();
        let mut again = huge.clone();
        again.status = Some(capped.status.clone());
        let later = now() + k8s_openapi::jiff::SignedDuration::from_secs(60);
        let shrunk = plan_members(&again, Some(&template()), &refs, 0, &settings, later);
        assert_eq!(shrunk.delete, vec![("m0".into(), "scale down")]);
        assert_eq!(
            shrunk.status.conditions, capped.status.conditions,
            "unchanged: no status write"
        );

        // Back under the maximum: the condition goes.
        let mut fits = pool(4);
        fits.status = Some(capped.status);
        let within = plan_members(&fits, Some(&template()), &refs[..4], 0, &settings, later);
        assert!(within.status.conditions.is_empty());
        assert_eq!(within.create, 0);
    }

    #[test]
    fn members_are_wanted_only_while_their_pool_lives() {
        let live = pool(3);
        assert!(still_wanted(Some(&live.metadata), "pool-uid"));
        assert!(!still_wanted(None, "pool-uid"), "gone from the cache");
        assert!(
            !still_wanted(Some(&live.metadata), "other-uid"),
            "a new pool of the same name"
        );
        let mut deleting = live;
        deleting.metadata.deletion_timestamp = Some(Time(now()));
        assert!(!still_wanted(Some(&deleting.metadata), "pool-uid"));
    }

    #[test]
    fn scale_down_removes_unready_then_newest() {
        let old_ready = built("old-ready", 100, true);
        let new_ready = built("new-ready", 10, true);
        let unready = built("unready", 50, false);
        let plan = plan_members(
            &pool(1),
            Some(&template()),
            &[&old_ready, &new_ready, &unready],
            0,
            &plan_settings(),
            now(),
        );
        assert_eq!(
            plan.delete,
            vec![
                ("unready".into(), "scale down"),
                ("new-ready".into(), "scale down")
            ]
        );
        assert_eq!(plan.create, 0);
    }

    #[test]
    fn late_members_are_replaced_unless_unschedulable() {
        let late = built("late", 400, false);
        let mut stuck = built("stuck", 400, false);
        let status = stuck.status.as_mut().unwrap();
        set_condition(
            &mut status.conditions,
            condition("PodScheduled", false, "Unschedulable", "no node", Some(1)),
            now(),
        );
        let young = built("young", 100, false);
        let plan = plan_members(
            &pool(3),
            Some(&template()),
            &[&late, &stuck, &young],
            0,
            &plan_settings(),
            now(),
        );
        assert_eq!(
            plan.delete,
            vec![("late".into(), "not ready within the readiness grace period")]
        );
        assert_eq!(plan.unschedulable, vec!["stuck".to_owned()]);
        assert_eq!(plan.create, 1);
        assert_eq!(plan.recheck_after, Some(Duration::from_secs(200)));
    }

    #[test]
    fn staleness_and_recreate() {
        let fresh = built("fresh", 10, true);
        let mut changed = template();
        assert!(!is_stale(&fresh, &changed, &settings().dns));
        changed.spec.blueprint.pod_template.spec.containers[0].image = Some("other:1".into());
        assert!(is_stale(&fresh, &changed, &settings().dns));
        // A different hash with the same content (e.g. another serializer) is not stale.
        let mut relabelled = fresh.clone();
        relabelled
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(labels::SANDBOX_TEMPLATE_HASH.into(), "00000000".into());
        assert!(!is_stale(&relabelled, &template(), &settings().dns));

        let mut recreate = pool(1);
        recreate.spec.update_strategy = Some(UpdateStrategy {
            type_: UpdateStrategyType::Recreate,
        });
        let plan1 = plan_members(
            &recreate,
            Some(&changed),
            &[&fresh],
            0,
            &plan_settings(),
            now(),
        );
        assert_eq!(plan1.delete, vec![("fresh".into(), "stale")]);
        assert_eq!(plan1.create, 1);
        let plan2 = plan_members(
            &pool(1),
            Some(&changed),
            &[&fresh],
            0,
            &plan_settings(),
            now(),
        );
        assert!(plan2.delete.is_empty(), "OnReplenish keeps stale members");
    }

    #[test]
    fn a_pass_adopts_orphans_deletes_by_uid_and_writes_a_changed_status_only() {
        let p = pool(1);
        let (t, kept) = (template(), built("kept", 10, true));
        let mut extra = built("extra", 5, true);
        extra.metadata.uid = Some("uid-extra".into());
        let mut orphan = built("orphan", 5, true);
        orphan.metadata.owner_references = None;
        orphan.metadata.resource_version = Some("12".into());
        let mut foreign = built("foreign", 5, true);
        foreign.metadata.owner_references = Some(vec![controller_reference(&pool(9))]);
        foreign.metadata.owner_references.as_mut().unwrap()[0].uid = "other".into();
        let labelled = [&kept, &extra, &orphan, &foreign];
        let observed = Observed {
            template: Some(&t),
            labelled: &labelled,
            pending: 0,
            current: None,
            now: now(),
        };
        let pass = plan(&p, &observed, &plan_settings(), &settings());
        assert_eq!(pass.orphans.len(), 1);
        assert_eq!(pass.orphans[0].0.metadata.name.as_deref(), Some("orphan"));
        assert_eq!(
            pass.orphans[0].1,
            json!({"metadata": {
                "resourceVersion": "12",
                "ownerReferences": [controller_reference(&p)],
            }})
        );
        // The foreign member is neither adopted nor counted; the newer of the two owned goes.
        let deleted: Vec<_> = pass
            .delete
            .iter()
            .map(|(m, reason)| (m.metadata.uid.as_deref(), *reason))
            .collect();
        assert_eq!(deleted, [(Some("uid-extra"), "scale down")]);
        assert_eq!(pass.create, None);
        assert_eq!(pass.not_progressing, None);
        let status = pass.status.clone().unwrap();
        assert_eq!((status.replicas, status.ready_replicas), (1, 1));

        let only_kept = [&kept];
        let unchanged = pass_with(&p, Some(&t), &only_kept, Some(&status));
        assert_eq!(unchanged.status, None);
    }

    fn pass_with<'a>(
        pool: &SandboxWarmPool,
        template: Option<&'a SandboxTemplate>,
        labelled: &'a [&'a Sandbox],
        current: Option<&'a SandboxWarmPoolStatus>,
    ) -> Plan<'a> {
        let observed = Observed {
            template,
            labelled,
            pending: 0,
            current,
            now: now(),
        };
        plan(pool, &observed, &plan_settings(), &settings())
    }

    #[test]
    fn a_pass_creates_members_only_from_an_existing_template_and_reports_held_ones() {
        let (p, t) = (pool(3), template());
        let mut stuck = built("stuck", 600, false);
        let status = stuck.status.as_mut().unwrap();
        set_condition(
            &mut status.conditions,
            condition("PodScheduled", false, "Unschedulable", "", Some(1)),
            now(),
        );
        let labelled = [&stuck];
        let pass = pass_with(&p, Some(&t), &labelled, None);
        assert_eq!(pass.create, Some((member(&p, &t, &settings()), 2)));
        assert_eq!(
            pass.not_progressing.as_deref(),
            Some("members cannot be scheduled and are held instead of replaced: stuck")
        );
        assert_eq!(pass_with(&p, None, &labelled, None).create, None);
    }
}
