//! SandboxClaims and the Sandboxes behind them as Kubernetes objects: the claim the SDK writes,
//! where a claim is, waiting until it is Ready (kube-runtime's `await_condition`), listing,
//! extending and deleting claims. The decisions are sans-IO functions; the async functions are
//! the thin calls that make them. [`Client`](crate::Client) and [`Sandbox`](crate::Sandbox) build
//! on this module; it knows neither.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use agent_sandbox_api::claim::{ClaimLifecycle, ClaimShutdownPolicy, SandboxWarmPoolRef};
use agent_sandbox_api::conditions::claim as claim_cond;
use agent_sandbox_api::sandbox::PodMetadata;
use agent_sandbox_api::{
    Sandbox as SandboxObject, SandboxClaim, SandboxClaimSpec, annotations, labels,
};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::runtime::wait::{self, await_condition};
use kube::runtime::watcher;
use kube::{Api, ResourceExt as _};

use crate::error::{Error, Result};
use crate::options::{CreateOptions, Progress, expiry};

/// A claim a client created: `(namespace, claim name)`.
pub type ClaimKey = (String, String);

/// A claim as [`Client::list`](crate::Client::list) and
/// [`Client::claim`](crate::Client::claim) report it.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ClaimInfo {
    /// Namespace.
    pub namespace: String,
    /// Claim name.
    pub claim: String,
    /// The warm pool it claims from.
    pub warm_pool: String,
    /// Its Sandbox, once assigned.
    pub sandbox: Option<String>,
    /// The sandbox's pod, once known.
    pub pod: Option<String>,
    /// `Ready=True`.
    pub ready: bool,
    /// Status of the `Ready` condition (`True`, `False`, `Unknown`); `None` before the
    /// controller set one.
    pub ready_status: Option<String>,
    /// Reason of the `Ready` condition.
    pub reason: Option<String>,
    /// Message of the `Ready` condition.
    pub message: Option<String>,
    /// `spec.lifecycle.shutdownTime`.
    pub shutdown_time: Option<Timestamp>,
    /// Creation time.
    pub created: Option<Timestamp>,
    /// The `agents.x-k8s.io/created-by` label.
    pub created_by: Option<String>,
}

impl ClaimInfo {
    /// The assigned sandbox's name, or [`Error::ClaimNotReady`] while the claim has none.
    pub fn assigned_sandbox(&self) -> Result<&str> {
        self.sandbox.as_deref().ok_or_else(|| Error::ClaimNotReady {
            namespace: self.namespace.clone(),
            claim: self.claim.clone(),
        })
    }
}

/// The claim `create_sandbox` writes (sans IO).
pub(crate) fn claim_object(
    pool: &str,
    options: &CreateOptions,
    now: Timestamp,
) -> Result<SandboxClaim> {
    let mut claim_labels = options.labels.clone();
    claim_labels.insert(
        labels::CREATED_BY.to_owned(),
        labels::CREATED_BY_RUST_CLIENT.to_owned(),
    );
    let lifecycle = match options.shutdown_after {
        None => None,
        Some(after) => Some(ClaimLifecycle {
            shutdown_time: Some(Time(expiry("shutdown_after", now, after)?)),
            ttl_seconds_after_finished: None,
            shutdown_policy: ClaimShutdownPolicy::Delete,
        }),
    };
    Ok(SandboxClaim {
        metadata: ObjectMeta {
            generate_name: Some("sandbox-claim-".to_owned()),
            labels: Some(claim_labels),
            annotations: Some(BTreeMap::from([(
                annotations::CLIENT_FIRST_REQUESTED_AT.to_owned(),
                format!("{now:.9}"),
            )])),
            ..ObjectMeta::default()
        },
        spec: SandboxClaimSpec {
            warm_pool_ref: SandboxWarmPoolRef {
                name: pool.to_owned(),
            },
            lifecycle,
            additional_pod_metadata: PodMetadata {
                labels: options.pod_labels.clone(),
                annotations: options.pod_annotations.clone(),
            },
            idle_lifecycle: options.idle_lifecycle.clone(),
            ..SandboxClaimSpec::default()
        },
        status: None,
    })
}

/// Where a claim is (sans IO).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ClaimState {
    Ready {
        sandbox: String,
    },
    Failed {
        reason: String,
        message: String,
    },
    Pending {
        sandbox: Option<String>,
        reason: String,
        message: String,
    },
}

pub(crate) fn claim_state(claim: &SandboxClaim) -> ClaimState {
    let status = claim.status.clone().unwrap_or_default();
    let sandbox = Some(status.sandbox.name.clone()).filter(|s| !s.is_empty());
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == claim_cond::READY);
    let (is_ready, reason, message) = match ready {
        Some(c) => (c.status == "True", c.reason.clone(), c.message.clone()),
        None => (false, String::new(), String::new()),
    };
    if is_ready && let Some(sandbox) = sandbox.clone() {
        return ClaimState::Ready { sandbox };
    }
    let fails_fast = claim_cond::TERMINAL_REASONS.contains(&reason.as_str())
        || reason == claim_cond::REASON_TEMPLATE_NOT_FOUND
        || reason == claim_cond::REASON_WARM_POOL_NOT_FOUND;
    if !is_ready && fails_fast {
        return ClaimState::Failed { reason, message };
    }
    ClaimState::Pending {
        sandbox,
        reason,
        message,
    }
}

/// The typed error of a claim that failed for good (sans IO).
pub(crate) fn failure(
    namespace: &str,
    claim: &str,
    pool: &str,
    reason: String,
    message: String,
) -> Error {
    let (namespace, claim, pool) = (namespace.to_owned(), claim.to_owned(), pool.to_owned());
    match reason.as_str() {
        claim_cond::REASON_WARM_POOL_NOT_FOUND => Error::WarmPoolNotFound {
            namespace,
            claim,
            pool,
            message,
        },
        claim_cond::REASON_TEMPLATE_NOT_FOUND => Error::TemplateNotFound {
            namespace,
            claim,
            pool,
            message,
        },
        _ => Error::ClaimFailed {
            namespace,
            claim,
            reason,
            message,
        },
    }
}

/// What the wait for a claim has reported so far, so that each step is reported once.
#[derive(Debug, Default)]
struct Reported {
    assigned: bool,
    last: String,
}

impl Reported {
    /// Reports a pending state: the sandbox once it is assigned, a waiting reason when it
    /// changes.
    fn pending(
        &mut self,
        sandbox: Option<String>,
        reason: String,
        message: String,
        progress: &dyn Fn(Progress),
    ) {
        if !self.assigned
            && let Some(sandbox) = sandbox
        {
            self.assigned = true;
            progress(Progress::SandboxAssigned { sandbox });
        }
        let now = format!("{reason}: {message}");
        if !reason.is_empty() && now != self.last {
            self.last = now;
            progress(Progress::Waiting { reason, message });
        }
    }
}

/// Waits until the claim `namespace/name` is Ready and returns it: [`failure`]'s typed error
/// when it fails for good, [`Error::ClaimNotFound`] when it is deleted, [`Error::ClaimTimeout`]
/// after `timeout`. Pending steps go to `progress`.
///
/// kube-runtime's `await_condition` does the watching (list, watch from that version, relist
/// after a `410 Gone`). A watch that breaks after it started ends `await_condition` with an
/// error; the wait then starts a new one after a short pause, as a broken watch says nothing
/// about the claim. Failing to list or to start watching at all is the caller's error.
pub(crate) async fn wait_ready(
    kube: &kube::Client,
    namespace: &str,
    name: &str,
    pool: &str,
    timeout: Duration,
    progress: &(dyn Fn(Progress) + Send + Sync),
) -> Result<SandboxClaim> {
    let api: Api<SandboxClaim> = Api::namespaced(kube.clone(), namespace);
    let reported = Mutex::new(Reported::default());
    // Settled: Ready, failed for good, or gone. Every pending state on the way is reported.
    let settled = |claim: Option<&SandboxClaim>| {
        let Some(claim) = claim else {
            return true;
        };
        match claim_state(claim) {
            ClaimState::Pending {
                sandbox,
                reason,
                message,
            } => {
                reported
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .pending(sandbox, reason, message, progress);
                false
            }
            ClaimState::Ready { .. } | ClaimState::Failed { .. } => true,
        }
    };
    let object = format!("{namespace}/{name}");
    // A zero budget waits for nothing (without this, a claim answered within the timer's
    // first tick would count as Ready in no time at all).
    let wait = tokio::time::timeout(timeout, async {
        let mut broken: u32 = 0;
        loop {
            match await_condition(api.clone(), name, &settled).await {
                Ok(found) => return Ok(found),
                Err(wait::Error::ProbeFailed(
                    watcher::Error::InitialListFailed(source)
                    | watcher::Error::WatchStartFailed(source),
                )) => {
                    return Err(Error::Kube {
                        operation: "watch SandboxClaim",
                        object: object.clone(),
                        source,
                    });
                }
                Err(error) => {
                    broken = broken.saturating_add(1);
                    tracing::debug!(%error, claim = %object, "the watch broke; watching anew");
                    let pause = Duration::from_millis(100 << broken.min(5));
                    tokio::time::sleep(pause).await;
                }
            }
        }
    });
    let waited = if timeout.is_zero() {
        None
    } else {
        wait.await.ok()
    };
    let claim = match waited {
        None => {
            let last =
                std::mem::take(&mut reported.lock().unwrap_or_else(PoisonError::into_inner).last);
            return Err(Error::ClaimTimeout {
                namespace: namespace.to_owned(),
                claim: name.to_owned(),
                waited: timeout,
                last,
            });
        }
        Some(found) => found?,
    };
    let Some(claim) = claim else {
        return Err(Error::ClaimNotFound {
            namespace: namespace.to_owned(),
            claim: name.to_owned(),
        });
    };
    match claim_state(&claim) {
        ClaimState::Failed { reason, message } => {
            Err(failure(namespace, name, pool, reason, message))
        }
        // `settled` only lets Ready and Failed through; a pending claim is not Ready.
        ClaimState::Ready { .. } | ClaimState::Pending { .. } => Ok(claim),
    }
}

/// The claim's expiry, `spec.lifecycle.shutdownTime` (sans IO).
pub(crate) fn shutdown_time(claim: &SandboxClaim) -> Option<Timestamp> {
    claim
        .spec
        .lifecycle
        .as_ref()
        .and_then(|l| l.shutdown_time.as_ref())
        .map(|t| t.0)
}

/// The pods of Sandboxes by `(namespace, name)`: the `agents.x-k8s.io/pod-name` annotation, else
/// the Sandbox's own name (sans IO).
fn pods_of(sandboxes: &[SandboxObject]) -> BTreeMap<(String, String), String> {
    sandboxes
        .iter()
        .map(|s| {
            let pod = s
                .annotations()
                .get(annotations::POD_NAME)
                .cloned()
                .unwrap_or_else(|| s.name_any());
            ((s.namespace().unwrap_or_default(), s.name_any()), pod)
        })
        .collect()
}

/// A claim's [`ClaimInfo`], with the pods of its namespace's sandboxes (sans IO).
pub(crate) fn claim_info(
    claim: &SandboxClaim,
    pods: &BTreeMap<(String, String), String>,
) -> ClaimInfo {
    let status = claim.status.clone().unwrap_or_default();
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == claim_cond::READY);
    let namespace = claim.namespace().unwrap_or_default();
    let sandbox = Some(status.sandbox.name.clone()).filter(|s| !s.is_empty());
    ClaimInfo {
        pod: sandbox
            .as_ref()
            .and_then(|s| pods.get(&(namespace.clone(), s.clone())).cloned()),
        namespace,
        claim: claim.name_any(),
        warm_pool: claim.spec.warm_pool_ref.name.clone(),
        sandbox,
        ready: ready.is_some_and(|c| c.status == "True"),
        ready_status: ready.map(|c| c.status.clone()),
        reason: ready.map(|c| c.reason.clone()),
        message: ready.map(|c| c.message.clone()),
        shutdown_time: shutdown_time(claim),
        created: claim.metadata.creation_timestamp.as_ref().map(|t| t.0),
        created_by: claim.labels().get(labels::CREATED_BY).cloned(),
    }
}

/// Claims and Sandboxes in `namespace`, or in every namespace for `None`.
fn apis(kube: &kube::Client, namespace: Option<&str>) -> (Api<SandboxClaim>, Api<SandboxObject>) {
    match namespace {
        Some(namespace) => (
            Api::namespaced(kube.clone(), namespace),
            Api::namespaced(kube.clone(), namespace),
        ),
        None => (Api::all(kube.clone()), Api::all(kube.clone())),
    }
}

/// The claims matching `params` in `namespace` (every namespace for `None`), in the API's
/// order, with their sandboxes' pods.
pub(crate) async fn list_claims(
    kube: &kube::Client,
    namespace: Option<&str>,
    params: &ListParams,
) -> Result<Vec<ClaimInfo>> {
    let (claims, sandboxes) = apis(kube, namespace);
    let scope = namespace.unwrap_or("all namespaces").to_owned();
    let claims = claims.list(params).await.map_err(|source| Error::Kube {
        operation: "list SandboxClaims in",
        object: scope.clone(),
        source,
    })?;
    let sandboxes = sandboxes
        .list(&ListParams::default())
        .await
        .map_err(|source| Error::Kube {
            operation: "list Sandboxes in",
            object: scope,
            source,
        })?;
    let pods = pods_of(&sandboxes.items);
    Ok(claims
        .items
        .iter()
        .map(|claim| claim_info(claim, &pods))
        .collect())
}

/// The claim `namespace/claim`, or [`Error::ClaimNotFound`].
pub(crate) async fn get_claim(
    kube: &kube::Client,
    namespace: &str,
    claim: &str,
) -> Result<SandboxClaim> {
    let api: Api<SandboxClaim> = Api::namespaced(kube.clone(), namespace);
    api.get_opt(claim)
        .await
        .map_err(|source| Error::Kube {
            operation: "get SandboxClaim",
            object: format!("{namespace}/{claim}"),
            source,
        })?
        .ok_or_else(|| Error::ClaimNotFound {
            namespace: namespace.to_owned(),
            claim: claim.to_owned(),
        })
}

/// The Sandbox `namespace/name`, if it exists.
pub(crate) async fn get_sandbox_object(
    kube: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<Option<SandboxObject>> {
    let api: Api<SandboxObject> = Api::namespaced(kube.clone(), namespace);
    api.get_opt(name).await.map_err(|source| Error::Kube {
        operation: "get Sandbox",
        object: format!("{namespace}/{name}"),
        source,
    })
}

/// The claim `namespace/claim` as [`ClaimInfo`] (its pod from its Sandbox, when that exists).
pub(crate) async fn claim_info_of(
    kube: &kube::Client,
    namespace: &str,
    claim: &str,
) -> Result<ClaimInfo> {
    let object = get_claim(kube, namespace, claim).await?;
    let sandbox = object
        .status
        .as_ref()
        .map(|s| s.sandbox.name.clone())
        .filter(|s| !s.is_empty());
    let sandboxes = match sandbox {
        Some(sandbox) => get_sandbox_object(kube, namespace, &sandbox)
            .await?
            .into_iter()
            .collect(),
        None => Vec::new(),
    };
    Ok(claim_info(&object, &pods_of(&sandboxes)))
}

/// Deletes a claim; one that is already gone is not an error.
pub(crate) async fn delete_claim(kube: &kube::Client, namespace: &str, claim: &str) -> Result<()> {
    let api: Api<SandboxClaim> = Api::namespaced(kube.clone(), namespace);
    match api.delete(claim, &DeleteParams::background()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(source) => Err(Error::Kube {
            operation: "delete SandboxClaim",
            object: format!("{namespace}/{claim}"),
            source,
        }),
    }
}

/// Deletes every claim in `created`, forgetting each one deleted. Returns how many were; the
/// first error, if any, after trying all of them.
pub(crate) async fn delete_all(
    kube: &kube::Client,
    created: &Mutex<BTreeSet<ClaimKey>>,
) -> Result<usize> {
    let claims: Vec<ClaimKey> = created
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .cloned()
        .collect();
    let mut first_error = None;
    let mut deleted = 0;
    for (namespace, claim) in claims {
        match delete_claim(kube, &namespace, &claim).await {
            Ok(()) => {
                deleted += 1;
                created
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&(namespace, claim));
            }
            Err(error) => {
                first_error.get_or_insert(error);
            }
        }
    }
    match first_error {
        Some(error) => Err(error),
        None => Ok(deleted),
    }
}

/// Moves the claim's expiry to now + `ttl` (policy `Delete`), retrying on 409 conflicts with
/// the controller's writes. Returns the new time.
/// Suspends (`suspend`) or resumes the Sandbox `namespace/name` with one merge patch.
pub(crate) async fn set_suspended(
    kube: &kube::Client,
    namespace: &str,
    name: &str,
    suspend: bool,
) -> Result<()> {
    let api: Api<agent_sandbox_api::Sandbox> = Api::namespaced(kube.clone(), namespace);
    let patch = if suspend {
        agent_sandbox_api::sandbox::suspend_patch(None)
    } else {
        agent_sandbox_api::sandbox::resume_patch(&Timestamp::now().to_string())
    };
    api.patch(
        name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await
    .map(drop)
    .map_err(|source| Error::Kube {
        operation: if suspend {
            "suspend Sandbox"
        } else {
            "resume Sandbox"
        },
        object: format!("{namespace}/{name}"),
        source,
    })
}

pub(crate) async fn extend_claim(
    kube: &kube::Client,
    namespace: &str,
    claim: &str,
    ttl: Duration,
) -> Result<Timestamp> {
    let api: Api<SandboxClaim> = Api::namespaced(kube.clone(), namespace);
    let object_name = format!("{namespace}/{claim}");
    let mut attempt: u32 = 0;
    loop {
        attempt += 1;
        let mut object = get_claim(kube, namespace, claim).await?;
        let at = expiry("ttl", Timestamp::now(), ttl)?;
        let mut lifecycle = object.spec.lifecycle.take().unwrap_or_default();
        lifecycle.shutdown_time = Some(Time(at));
        lifecycle.shutdown_policy = ClaimShutdownPolicy::Delete;
        object.spec.lifecycle = Some(lifecycle);
        match api.replace(claim, &PostParams::default(), &object).await {
            Ok(_) => return Ok(at),
            Err(kube::Error::Api(status)) if status.code == 409 && attempt < 10 => {
                tokio::time::sleep(Duration::from_millis(10 * u64::from(attempt))).await;
            }
            Err(source) => {
                return Err(Error::Kube {
                    operation: "update the lifecycle of SandboxClaim",
                    object: object_name,
                    source,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::token::mint_token;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    #[test]
    fn the_claim_carries_the_upstream_metadata() {
        let now: Timestamp = "2026-01-01T00:00:00Z"
            .parse()
            .unwrap_or(Timestamp::UNIX_EPOCH);
        let claim = claim_object(
            "pool",
            &CreateOptions::default().shutdown_after(Duration::from_secs(60)),
            now,
        )
        .unwrap();
        assert_eq!(
            serde_json::to_value(&claim).unwrap_or_default(),
            json!({
                "apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaim",
                "metadata": {
                    "generateName": "sandbox-claim-",
                    "labels": {"agents.x-k8s.io/created-by": "rust-client"},
                    "annotations": {"agents.x-k8s.io/client-first-requested-at": "2026-01-01T00:00:00.000000000Z"}
                },
                "spec": {"warmPoolRef": {"name": "pool"},
                         "lifecycle": {"shutdownTime": "2026-01-01T00:01:00Z", "shutdownPolicy": "Delete"}}
            })
        );
    }

    #[test]
    fn an_expiry_beyond_the_maximum_is_an_error_never_a_claim_without_one() {
        let now: Timestamp = "2026-01-01T00:00:00Z"
            .parse()
            .unwrap_or(Timestamp::UNIX_EPOCH);
        let hours = |h: u64| Duration::from_secs(h * 3600);
        // 100000000h is ~11400 years: past jiff's (and RFC 3339's) year 9999.
        for too_long in [hours(100_000_000), hours(87_601), Duration::MAX] {
            let claim = claim_object(
                "pool",
                &CreateOptions::default().shutdown_after(too_long),
                now,
            );
            let message = claim.err().map(|e| e.to_string()).unwrap_or_default();
            assert!(
                message.contains("87600h (10 years)"),
                "{too_long:?}: {message}"
            );
            assert!(expiry("ttl", now, too_long).is_err());
            assert!(mint_token(&[b'k'; 32], "ns", "sb", too_long).is_err());
        }
        let longest = claim_object(
            "pool",
            &CreateOptions::default().shutdown_after(hours(87_600)),
            now,
        )
        .unwrap();
        assert_eq!(
            longest
                .spec
                .lifecycle
                .and_then(|l| l.shutdown_time)
                .map(|t| t.0.to_string()),
            Some("2035-12-30T00:00:00Z".to_owned())
        );
    }

    fn with_ready(status: &str, reason: &str, sandbox: &str) -> SandboxClaim {
        let mut claim =
            claim_object("p", &CreateOptions::default(), Timestamp::UNIX_EPOCH).unwrap();
        let mut s = agent_sandbox_api::claim::SandboxClaimStatus::default();
        s.sandbox.name = sandbox.to_owned();
        s.conditions.push(Condition {
            type_: "Ready".into(),
            status: status.into(),
            reason: reason.into(),
            message: "m".into(),
            last_transition_time: Time(Timestamp::UNIX_EPOCH),
            observed_generation: None,
        });
        claim.status = Some(s);
        claim
    }

    #[test]
    fn claim_states() {
        assert_eq!(
            claim_state(&with_ready("True", "DependenciesReady", "p-abcde")),
            ClaimState::Ready {
                sandbox: "p-abcde".into()
            }
        );
        assert_eq!(
            claim_state(&with_ready("False", "WarmPoolNotFound", "")),
            ClaimState::Failed {
                reason: "WarmPoolNotFound".into(),
                message: "m".into()
            }
        );
        assert_eq!(
            claim_state(&with_ready("False", "ClaimExpired", "x")),
            ClaimState::Failed {
                reason: "ClaimExpired".into(),
                message: "m".into()
            }
        );
        assert_eq!(
            claim_state(&with_ready("False", "SandboxNotReady", "x")),
            ClaimState::Pending {
                sandbox: Some("x".into()),
                reason: "SandboxNotReady".into(),
                message: "m".into()
            }
        );
    }

    #[test]
    fn claim_infos_take_the_pod_of_their_own_namespace() {
        let mut claim = with_ready("False", "SandboxNotReady", "box");
        claim.metadata.name = Some("c".into());
        claim.metadata.namespace = Some("team-a".into());
        let pods = BTreeMap::from([
            (
                ("team-b".to_owned(), "box".to_owned()),
                "other-pod".to_owned(),
            ),
            (
                ("team-a".to_owned(), "box".to_owned()),
                "box-pod".to_owned(),
            ),
        ]);
        let info = claim_info(&claim, &pods);
        assert_eq!(info.pod.as_deref(), Some("box-pod"));
        assert_eq!(info.ready_status.as_deref(), Some("False"));
        assert!(!info.ready);
        assert_eq!(info.assigned_sandbox().ok(), Some("box"));
        let unassigned = claim_info(&with_ready("False", "WarmPoolEmpty", ""), &pods);
        assert_eq!(unassigned.pod, None);
        assert!(matches!(
            unassigned.assigned_sandbox(),
            Err(Error::ClaimNotReady { .. })
        ));
        let mut fresh = with_ready("True", "", "box");
        fresh.status = None;
        assert_eq!(claim_info(&fresh, &pods).ready_status, None);
    }

    #[test]
    fn each_pending_step_is_reported_once() {
        let steps = Mutex::new(Vec::new());
        let record = |step: Progress| steps.lock().unwrap().push(step);
        let mut reported = Reported::default();
        reported.pending(None, String::new(), String::new(), &record);
        reported.pending(None, "WarmPoolEmpty".into(), "m".into(), &record);
        reported.pending(None, "WarmPoolEmpty".into(), "m".into(), &record);
        reported.pending(
            Some("box".into()),
            "SandboxNotReady".into(),
            "m".into(),
            &record,
        );
        reported.pending(
            Some("box".into()),
            "SandboxNotReady".into(),
            "m".into(),
            &record,
        );
        assert_eq!(
            steps.into_inner().unwrap(),
            [
                Progress::Waiting {
                    reason: "WarmPoolEmpty".into(),
                    message: "m".into()
                },
                Progress::SandboxAssigned {
                    sandbox: "box".into()
                },
                Progress::Waiting {
                    reason: "SandboxNotReady".into(),
                    message: "m".into()
                },
            ]
        );
    }
}
