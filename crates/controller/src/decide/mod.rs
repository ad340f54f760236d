//! Sans-IO decisions: what objects the cluster should hold, computed from what it holds.
//!
//! Every function here is pure (the current time is an argument), so each reconcile scenario is a
//! unit test without a server. The reconcilers in [`crate::reconcile`] read the caches, call these
//! functions and perform the writes they return.

pub mod claim;
pub mod network_policy;
pub mod sandbox;
pub mod secure_defaults;
pub mod warm_pool;

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Resource;

/// How an object relates to a would-be owner, by its controller ownerReference.
#[derive(Clone, Debug, PartialEq)]
pub enum Ownership {
    /// The object's controller is the owner in question.
    Owned,
    /// The object has no controller.
    Unowned,
    /// The object is controlled by someone else (kind, name, uid).
    OwnedByOther(OwnerReference),
}

/// The controller ownerReference of `meta`, if any.
pub fn controller_of(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|reference| reference.controller == Some(true))
}

/// Classifies `meta` against an owner with `owner_uid`.
pub fn ownership(meta: &ObjectMeta, owner_uid: &str) -> Ownership {
    match controller_of(meta) {
        None => Ownership::Unowned,
        Some(reference) if reference.uid == owner_uid => Ownership::Owned,
        Some(reference) => Ownership::OwnedByOther(reference.clone()),
    }
}

/// A controller ownerReference to `owner` (with `blockOwnerDeletion`, as controller-runtime
/// sets it, so that foreground deletion of the owner waits for the child).
pub fn controller_reference<K: Resource<DynamicType = ()>>(owner: &K) -> OwnerReference {
    let meta = owner.meta();
    OwnerReference {
        api_version: K::api_version(&()).into_owned(),
        kind: K::kind(&()).into_owned(),
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// A condition with the given fields (its transition time is set by [`set_condition`]).
pub fn condition(
    type_: &str,
    status: bool,
    reason: &str,
    message: impl Into<String>,
    generation: Option<i64>,
) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status: if status { "True" } else { "False" }.to_owned(),
        reason: reason.to_owned(),
        message: message.into(),
        observed_generation: generation,
        last_transition_time: Time(Timestamp::UNIX_EPOCH),
    }
}

/// Sets `new` in `conditions` like apimachinery's `meta.SetStatusCondition`: the transition time
/// moves to `now` only when the status changes (or the condition is new); reason, message and
/// observed generation are always updated.
pub fn set_condition(conditions: &mut Vec<Condition>, mut new: Condition, now: Timestamp) {
    match conditions
        .iter_mut()
        .find(|existing| existing.type_ == new.type_)
    {
        Some(existing) => {
            if existing.status != new.status {
                existing.status = new.status;
                existing.last_transition_time = Time(now);
            }
            existing.reason = new.reason;
            existing.message = new.message;
            existing.observed_generation = new.observed_generation;
        }
        None => {
            new.last_transition_time = Time(now);
            conditions.push(new);
        }
    }
}

/// Removes the condition of `type_`, if present.
pub fn remove_condition(conditions: &mut Vec<Condition>, type_: &str) {
    conditions.retain(|existing| existing.type_ != type_);
}

/// The condition of `type_`, if present.
pub fn find_condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|existing| existing.type_ == type_)
}

/// True when the condition of `type_` is present with status `True`.
pub fn is_condition_true(conditions: &[Condition], type_: &str) -> bool {
    find_condition(conditions, type_).is_some_and(|condition| condition.status == "True")
}

/// Time from `now` until `deadline`, or `None` once it has passed.
///
/// Exact for any two timestamps (the whole `Timestamp` range spans under 2^40 seconds); a
/// deadline beyond 584 years no longer overflows a `u64` of nanoseconds into "expired".
pub fn remaining(deadline: Timestamp, now: Timestamp) -> Option<Duration> {
    let nanos = deadline
        .as_nanosecond()
        .checked_sub(now.as_nanosecond())
        .unwrap_or(i128::MAX);
    if nanos <= 0 {
        return None;
    }
    let nanos = nanos.unsigned_abs();
    let seconds = u64::try_from(nanos / 1_000_000_000).unwrap_or(u64::MAX);
    let subsecond = u32::try_from(nanos % 1_000_000_000).unwrap_or(0);
    Some(Duration::new(seconds, subsecond))
}

/// `start` plus `span`, saturating at `Timestamp::MAX`: a deadline too far to represent is
/// "never", not an error or a panic.
pub fn after(start: Timestamp, span: Duration) -> Timestamp {
    i128::try_from(span.as_nanos())
        .ok()
        .and_then(|nanos| start.as_nanosecond().checked_add(nanos))
        .and_then(|nanos| Timestamp::from_nanosecond(nanos).ok())
        .unwrap_or(Timestamp::MAX)
}

/// Normalises a `created-by` label value the way upstream does (plus our Rust SDK's value).
pub fn normalize_created_by(value: &str) -> &'static str {
    use agent_sandbox_api::labels::*;
    match value {
        CREATED_BY_GO_CLIENT => CREATED_BY_GO_CLIENT,
        CREATED_BY_PYTHON_CLIENT => CREATED_BY_PYTHON_CLIENT,
        CREATED_BY_RUST_CLIENT => CREATED_BY_RUST_CLIENT,
        CREATED_BY_CONTROLLER => CREATED_BY_CONTROLLER,
        _ => CREATED_BY_UNKNOWN,
    }
}

/// True for keys the controller reserves for itself (`agents.x-k8s.io/...`,
/// `extensions.agents.x-k8s.io/...`).
pub fn is_system_key(key: &str) -> bool {
    agent_sandbox_api::labels::SYSTEM_PREFIXES
        .iter()
        .any(|prefix| key.starts_with(prefix))
}

#[cfg(test)]
pub(crate) mod fixtures {
    //! Builders for test objects, in the style of controller-rs (`Sandbox::test().expired()`).

    use k8s_openapi::api::core::v1::{Container, ContainerPort, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use k8s_openapi::jiff::Timestamp;

    use agent_sandbox_api::sandbox::{PodTemplate, SandboxBlueprint};
    use agent_sandbox_api::{Sandbox, SandboxSpec};

    pub(crate) fn now() -> Timestamp {
        "2026-11-29T12:00:00Z".parse().unwrap()
    }

    pub(crate) fn pod_spec() -> PodSpec {
        PodSpec {
            containers: vec![Container {
                name: "runtime".into(),
                image: Some("python-runtime-sandbox:latest".into()),
                ports: Some(vec![ContainerPort {
                    container_port: 8888,
                    ..ContainerPort::default()
                }]),
                ..Container::default()
            }],
            ..PodSpec::default()
        }
    }

    pub(crate) fn sandbox(name: &str) -> Sandbox {
        Sandbox {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                uid: Some(format!("uid-{name}")),
                generation: Some(1),
                resource_version: Some("7".into()),
                creation_timestamp: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    now(),
                )),
                ..ObjectMeta::default()
            },
            spec: SandboxSpec {
                blueprint: SandboxBlueprint {
                    pod_template: PodTemplate {
                        spec: pod_spec(),
                        ..PodTemplate::default()
                    },
                    ..SandboxBlueprint::default()
                },
                ..SandboxSpec::default()
            },
            status: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_condition_keeps_transition_time_when_status_is_unchanged() {
        let t0: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let t1: Timestamp = "2026-01-01T00:01:00Z".parse().unwrap();
        let mut conditions = Vec::new();
        set_condition(
            &mut conditions,
            condition("Ready", false, "A", "a", Some(1)),
            t0,
        );
        set_condition(
            &mut conditions,
            condition("Ready", false, "B", "b", Some(2)),
            t1,
        );
        assert_eq!(conditions.len(), 1);
        assert_eq!(conditions[0].last_transition_time, Time(t0));
        assert_eq!(conditions[0].reason, "B");
        assert_eq!(conditions[0].observed_generation, Some(2));
        set_condition(
            &mut conditions,
            condition("Ready", true, "C", "c", Some(2)),
            t1,
        );
        assert_eq!(conditions[0].last_transition_time, Time(t1));
        assert!(is_condition_true(&conditions, "Ready"));
        remove_condition(&mut conditions, "Ready");
        assert!(conditions.is_empty());
    }

    #[test]
    fn created_by_is_normalised() {
        assert_eq!(normalize_created_by("go-client"), "go-client");
        assert_eq!(normalize_created_by("rust-client"), "rust-client");
        assert_eq!(normalize_created_by("my-script"), "unknown");
    }

    #[test]
    fn ownership_by_controller_reference() {
        let owner = fixtures::sandbox("a");
        let mut meta = ObjectMeta::default();
        assert_eq!(ownership(&meta, "uid-a"), Ownership::Unowned);
        meta.owner_references = Some(vec![controller_reference(&owner)]);
        assert_eq!(ownership(&meta, "uid-a"), Ownership::Owned);
        assert!(matches!(
            ownership(&meta, "uid-b"),
            Ownership::OwnedByOther(_)
        ));
    }

    #[test]
    fn remaining_time() {
        let t0: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let t1: Timestamp = "2026-01-01T00:00:05Z".parse().unwrap();
        assert_eq!(remaining(t1, t0), Some(Duration::from_secs(5)));
        assert_eq!(remaining(t0, t1), None);
        assert_eq!(remaining(t0, t0), None);
    }

    /// Regression (issue 15): a deadline more than 584 years ahead overflowed into "expired".
    #[test]
    fn far_deadlines_are_far_not_expired() {
        let now: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let end = agent_sandbox_api::time::parse("9999-12-31T23:59:59Z").unwrap();
        let left = remaining(end, now).expect("the end of year 9999 is in the future");
        assert!(left > Duration::from_secs(7_900 * 365 * 86_400), "{left:?}");
        let in_600_years = after(now, Duration::from_secs(600 * 365 * 86_400));
        assert_eq!(
            remaining(in_600_years, now),
            Some(Duration::from_secs(600 * 365 * 86_400))
        );
        assert!(
            remaining(Timestamp::MAX, Timestamp::MIN)
                .is_some_and(|span| span.as_secs() > 600_000_000_000),
            "twenty thousand years"
        );
        assert_eq!(remaining(Timestamp::MIN, Timestamp::MAX), None);
        assert_eq!(after(now, Duration::MAX), Timestamp::MAX);
        assert_eq!(after(end, Duration::from_secs(1)), Timestamp::MAX);
        assert_eq!(
            after(now, Duration::from_secs(5)),
            "2026-01-01T00:00:05Z".parse::<Timestamp>().unwrap()
        );
    }
}
