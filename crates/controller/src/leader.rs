//! Leader election on a `coordination.k8s.io/v1` Lease, so that one replica reconciles at a time.
//!
//! The leader renews the Lease every third of its duration. A replica takes the Lease when it is
//! free or its holder failed to renew within the duration; every write is conditional on the
//! resourceVersion read, so two replicas cannot both win. A leader that cannot renew in time stops
//! (the process exits and is restarted), as controller-runtime does. A leader that shuts down
//! gives the Lease up ([`release`]), so that a standby takes over at its next attempt rather than
//! after the lease duration: a rolling restart leaves no leaderless gap.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Api;
use kube::api::PostParams;

use crate::config::LeaderElection;
use crate::error::{Error, Result, is_conflict, kube_err};

/// What [`try_acquire`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Attempt {
    /// We hold the Lease now.
    Acquired,
    /// Someone else holds it; try again later.
    HeldBy(String),
}

fn lease_seconds(settings: &LeaderElection) -> i32 {
    i32::try_from(settings.lease_duration.as_secs())
        .unwrap_or(i32::MAX)
        .max(1)
}

/// True when the Lease is held by someone other than `identity` and still fresh at `now`.
pub fn held_by_other(spec: &LeaseSpec, identity: &str, now: Timestamp) -> bool {
    let Some(holder) = spec.holder_identity.as_deref().filter(|h| !h.is_empty()) else {
        return false;
    };
    if holder == identity {
        return false;
    }
    let renewed = spec
        .renew_time
        .as_ref()
        .or(spec.acquire_time.as_ref())
        .map(|t| t.0);
    let duration = SignedDuration::from_secs(i64::from(spec.lease_duration_seconds.unwrap_or(15)));
    // A renewal so far ahead that adding the duration overflows is fresh, not a panic.
    renewed.is_some_and(|renewed| {
        renewed
            .checked_add(duration)
            .ok()
            .is_none_or(|until| until > now)
    })
}

/// The spec that gives up a Lease `identity` holds (client-go's `ReleaseOnCancel`): no holder, a
/// one-second duration, renewed now. `None` when `identity` does not hold it.
pub fn released(spec: &LeaseSpec, identity: &str, now: Timestamp) -> Option<LeaseSpec> {
    if spec.holder_identity.as_deref() != Some(identity) {
        return None;
    }
    Some(LeaseSpec {
        holder_identity: Some(String::new()),
        lease_duration_seconds: Some(1),
        acquire_time: Some(MicroTime(now)),
        renew_time: Some(MicroTime(now)),
        ..spec.clone()
    })
}

/// One attempt to take or renew the Lease.
pub async fn try_acquire(api: &Api<Lease>, settings: &LeaderElection) -> Result<Attempt> {
    let now = Timestamp::now();
    let name = &settings.name;
    let namespace = &settings.namespace;
    let existing = api
        .get_opt(name)
        .await
        .map_err(kube_err("get", "Lease", namespace, name))?;
    let Some(mut lease) = existing else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(settings.identity.clone()),
                lease_duration_seconds: Some(lease_seconds(settings)),
                acquire_time: Some(MicroTime(now)),
                renew_time: Some(MicroTime(now)),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            }),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(Attempt::Acquired),
            Err(error) if is_conflict(&error) => Ok(Attempt::HeldBy(
                "a replica that created it first".to_owned(),
            )),
            Err(error) => Err(kube_err("create", "Lease", namespace, name)(error)),
        };
    };
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    if held_by_other(spec, &settings.identity, now) {
        return Ok(Attempt::HeldBy(
            spec.holder_identity.clone().unwrap_or_default(),
        ));
    }
    if spec.holder_identity.as_deref() != Some(settings.identity.as_str()) {
        spec.holder_identity = Some(settings.identity.clone());
        spec.acquire_time = Some(MicroTime(now));
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
    }
    spec.renew_time = Some(MicroTime(now));
    spec.lease_duration_seconds = Some(lease_seconds(settings));
    match api.replace(name, &PostParams::default(), &lease).await {
        Ok(_) => Ok(Attempt::Acquired),
        Err(error) if is_conflict(&error) => {
            Ok(Attempt::HeldBy("a replica that wrote it first".to_owned()))
        }
        Err(error) => Err(kube_err("update", "Lease", namespace, name)(error)),
    }
}

/// How often a standby tries to take the Lease: client-go's 2 s retry period, sooner for short
/// leases. A released Lease is taken within this.
fn retry_period(settings: &LeaderElection) -> Duration {
    (settings.lease_duration / 5).clamp(Duration::from_millis(200), Duration::from_secs(2))
}

/// Waits until this replica holds the Lease.
pub async fn acquire(api: &Api<Lease>, settings: &LeaderElection) -> Result<()> {
    let retry = retry_period(settings);
    let mut logged = false;
    loop {
        match try_acquire(api, settings).await {
            Ok(Attempt::Acquired) => {
                tracing::info!(lease = %settings.name, identity = %settings.identity, "became leader");
                return Ok(());
            }
            Ok(Attempt::HeldBy(holder)) => {
                if !logged {
                    tracing::info!(lease = %settings.name, %holder, "waiting for leadership");
                    logged = true;
                }
            }
            Err(error) => tracing::warn!(%error, "leader election attempt failed; retrying"),
        }
        tokio::time::sleep(retry).await;
    }
}

/// Renews the Lease until it cannot; returns the error that ended leadership.
pub async fn keep(api: &Api<Lease>, settings: &LeaderElection) -> Error {
    let every = (settings.lease_duration / 3).max(Duration::from_millis(200));
    let mut last_renewal = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(every).await;
        match try_acquire(api, settings).await {
            Ok(Attempt::Acquired) => last_renewal = tokio::time::Instant::now(),
            Ok(Attempt::HeldBy(holder)) => {
                return Error::LeadershipLost {
                    lease: format!("{}/{}", settings.namespace, settings.name),
                    reason: format!("now held by {holder}"),
                };
            }
            Err(error) => {
                tracing::warn!(%error, "failed to renew the leader Lease");
                if last_renewal.elapsed() >= settings.lease_duration {
                    return Error::LeadershipLost {
                        lease: format!("{}/{}", settings.namespace, settings.name),
                        reason: format!(
                            "not renewed within {:?}: {error}",
                            settings.lease_duration
                        ),
                    };
                }
            }
        }
    }
}

/// Gives the Lease up if this replica still holds it (see [`released`]). The write is
/// conditional on the resourceVersion read, so a Lease another replica took meanwhile is left
/// alone. True when it was released.
pub async fn release(api: &Api<Lease>, settings: &LeaderElection) -> Result<bool> {
    let name = &settings.name;
    let namespace = &settings.namespace;
    let Some(mut lease) = api
        .get_opt(name)
        .await
        .map_err(kube_err("get", "Lease", namespace, name))?
    else {
        return Ok(false);
    };
    let Some(spec) = lease
        .spec
        .as_ref()
        .and_then(|spec| released(spec, &settings.identity, Timestamp::now()))
    else {
        return Ok(false);
    };
    lease.spec = Some(spec);
    match api.replace(name, &PostParams::default(), &lease).await {
        Ok(_) => Ok(true),
        Err(error) if is_conflict(&error) => Ok(false),
        Err(error) => Err(kube_err("release", "Lease", namespace, name)(error)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freshness_of_another_holder() {
        let now: Timestamp = "2026-01-01T00:00:20Z".parse().unwrap();
        let spec = |holder: &str, renewed: &str| LeaseSpec {
            holder_identity: Some(holder.into()),
            renew_time: Some(MicroTime(renewed.parse().unwrap())),
            lease_duration_seconds: Some(15),
            ..LeaseSpec::default()
        };
        assert!(held_by_other(&spec("b", "2026-01-01T00:00:10Z"), "a", now));
        assert!(
            !held_by_other(&spec("b", "2026-01-01T00:00:04Z"), "a", now),
            "expired"
        );
        assert!(
            !held_by_other(&spec("a", "2026-01-01T00:00:10Z"), "a", now),
            "ours"
        );
        assert!(!held_by_other(&LeaseSpec::default(), "a", now), "free");
        let far = spec("b", "9999-12-30T00:00:00Z");
        assert!(held_by_other(
            &LeaseSpec {
                lease_duration_seconds: Some(i32::MAX),
                ..far
            },
            "a",
            now
        ));
    }

    #[test]
    fn a_released_lease_is_free_for_anyone() {
        let then: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let now: Timestamp = "2026-01-01T00:00:03Z".parse().unwrap();
        let held = LeaseSpec {
            holder_identity: Some("a".into()),
            lease_duration_seconds: Some(15),
            acquire_time: Some(MicroTime(then)),
            renew_time: Some(MicroTime(then)),
            lease_transitions: Some(4),
            ..LeaseSpec::default()
        };
        assert!(held_by_other(&held, "b", now));
        assert_eq!(released(&held, "b", now), None, "only the holder releases");
        let free = released(&held, "a", now).unwrap();
        assert_eq!(
            free,
            LeaseSpec {
                holder_identity: Some(String::new()),
                lease_duration_seconds: Some(1),
                acquire_time: Some(MicroTime(now)),
                renew_time: Some(MicroTime(now)),
                lease_transitions: Some(4),
                ..LeaseSpec::default()
            }
        );
        assert!(!held_by_other(&free, "b", now));
    }
}
