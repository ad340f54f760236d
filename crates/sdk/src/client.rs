//! The [`Client`]: SandboxClaims (create and wait, re-attach, list, extend, delete), the shared
//! connection to the router, and auto cleanup on SIGINT/SIGTERM.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use agent_sandbox_api::claim::{ClaimLifecycle, ClaimShutdownPolicy, SandboxWarmPoolRef};
use agent_sandbox_api::conditions::claim as claim_cond;
use agent_sandbox_api::sandbox::PodMetadata;
use agent_sandbox_api::{
    Sandbox as SandboxObject, SandboxClaim, SandboxClaimSpec, annotations, labels,
};
use futures_util::StreamExt as _;
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{DeleteParams, ListParams, PostParams, WatchEvent, WatchParams};
use kube::{Api, ResourceExt as _};
use tokio::time::Instant;

use crate::connection::Connector;
use crate::error::{Error, Result};
use crate::options::{ClientOptions, CreateOptions, Progress, check_ttl};
use crate::sandbox::{Identity, Sandbox};

/// A claim this client created: `(namespace, claim name)`.
pub type ClaimKey = (String, String);

/// Entry point of the SDK: creates, finds, lists and deletes sandboxes.
///
/// Cheap to clone; clones share the connection to the router and the set of claims created.
///
/// ```no_run
/// # async fn demo() -> agent_sandbox::Result<()> {
/// use agent_sandbox::{Client, ClientOptions};
///
/// let client = Client::new(ClientOptions::default().namespace("default")).await?;
/// let sandbox = client.create_sandbox("python-sandbox-pool").await?;
/// let result = sandbox.run("python3 --version").await?;
/// println!("{}", result.stdout);
/// sandbox.close().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Client {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

struct Inner {
    kube: kube::Client,
    options: ClientOptions,
    connector: Arc<Connector>,
    created: Arc<Mutex<BTreeSet<ClaimKey>>>,
}

/// A claim as [`Client::list`] reports it.
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

impl Client {
    /// A client from the default kubeconfig (or the in-cluster configuration).
    pub async fn new(options: ClientOptions) -> Result<Self> {
        let kube = kube::Client::try_default()
            .await
            .map_err(Error::KubeConfig)?;
        Ok(Self::from_kube(kube, options))
    }

    /// A client using an existing `kube::Client`.
    pub fn from_kube(kube: kube::Client, options: ClientOptions) -> Self {
        let connector = Arc::new(Connector::new(kube.clone(), options.clone()));
        Self {
            inner: Arc::new(Inner {
                kube,
                options,
                connector,
                created: Arc::new(Mutex::new(BTreeSet::new())),
            }),
        }
    }

    /// The options.
    pub fn options(&self) -> &ClientOptions {
        &self.inner.options
    }

    /// The Kubernetes client.
    pub fn kube_client(&self) -> &kube::Client {
        &self.inner.kube
    }

    /// The claims' namespace.
    pub fn namespace(&self) -> &str {
        &self.inner.options.namespace
    }

    fn claims(&self) -> Api<SandboxClaim> {
        Api::namespaced(self.inner.kube.clone(), self.namespace())
    }

    /// Claims a sandbox from `warm_pool` and waits until it is Ready and reachable.
    ///
    /// See [`Client::create_sandbox_with`].
    pub async fn create_sandbox(&self, warm_pool: &str) -> Result<Sandbox> {
        self.create_sandbox_with(warm_pool, CreateOptions::default())
            .await
    }

    /// Claims a sandbox from `warm_pool` with options, waits until the claim has its sandbox
    /// and is Ready, connects, and returns the handle.
    ///
    /// The claim gets `generateName: sandbox-claim-`, the label
    /// `agents.x-k8s.io/created-by: rust-client` and the annotation
    /// `agents.x-k8s.io/client-first-requested-at`. Any failure after the claim was created
    /// deletes it again ([`Error::OrphanedClaim`] if that fails too).
    ///
    /// ```no_run
    /// # async fn demo(client: agent_sandbox::Client) -> agent_sandbox::Result<()> {
    /// use std::time::Duration;
    /// use agent_sandbox::{CreateOptions, Progress};
    ///
    /// let sandbox = client
    ///     .create_sandbox_with(
    ///         "python-sandbox-pool",
    ///         CreateOptions::default()
    ///             .shutdown_after(Duration::from_secs(600))
    ///             .on_progress(|step: &Progress| eprintln!("{step:?}")),
    ///     )
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn create_sandbox_with(
        &self,
        warm_pool: &str,
        options: CreateOptions,
    ) -> Result<Sandbox> {
        let namespace = self.namespace().to_owned();
        let claim = claim_object(warm_pool, &options, Timestamp::now())?;
        let created = self
            .claims()
            .create(&PostParams::default(), &claim)
            .await
            .map_err(|source| Error::Kube {
                operation: "create SandboxClaim in",
                object: namespace.clone(),
                source,
            })?;
        let name = created.name_any();
        self.track(&namespace, &name);
        progress(
            &options,
            Progress::ClaimCreated {
                claim: name.clone(),
            },
        );
        let timeout = options
            .ready_timeout
            .unwrap_or(self.inner.options.sandbox_ready_timeout);
        let result = async {
            let ready = self
                .wait_ready(&name, warm_pool, created, timeout, &options)
                .await?;
            progress(&options, Progress::Connecting);
            self.attach(ready).await
        }
        .await;
        match result {
            Ok(sandbox) => Ok(sandbox),
            Err(error) => match self.delete_with_budget(&name).await {
                Ok(()) => Err(error),
                Err(cleanup) => Err(Error::OrphanedClaim {
                    namespace,
                    claim: name,
                    cleanup: cleanup.to_string(),
                    source: Box::new(error),
                }),
            },
        }
    }

    /// A handle to an existing claim's sandbox (it must be Ready), e.g. one created by another
    /// process. Deleting through it ([`Sandbox::close`]) deletes the claim.
    pub async fn get_sandbox(&self, claim: &str) -> Result<Sandbox> {
        let object = self
            .claims()
            .get_opt(claim)
            .await
            .map_err(|source| Error::Kube {
                operation: "get SandboxClaim",
                object: format!("{}/{claim}", self.namespace()),
                source,
            })?
            .ok_or_else(|| Error::ClaimNotFound {
                namespace: self.namespace().to_owned(),
                claim: claim.to_owned(),
            })?;
        let state = claim_state(&object);
        match state {
            ClaimState::Ready { .. } => self.attach(object).await,
            other => Err(Error::NotConnected {
                sandbox: claim.to_owned(),
                reason: format!("the claim is not Ready ({other:?})"),
            }),
        }
    }

    /// Builds the handle of a Ready claim and connects it.
    async fn attach(&self, claim: SandboxClaim) -> Result<Sandbox> {
        let namespace = self.namespace().to_owned();
        let claim_name = claim.name_any();
        let status = claim.status.clone().unwrap_or_default();
        let sandbox_name = status.sandbox.name.clone();
        let sandboxes: Api<SandboxObject> = Api::namespaced(self.inner.kube.clone(), &namespace);
        let sandbox = sandboxes
            .get_opt(&sandbox_name)
            .await
            .map_err(|source| Error::Kube {
                operation: "get Sandbox",
                object: format!("{namespace}/{sandbox_name}"),
                source,
            })?;
        let pod_name = sandbox
            .as_ref()
            .and_then(|s| s.annotations().get(annotations::POD_NAME).cloned())
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| sandbox_name.clone());
        let pod_ips = if status.sandbox.pod_ips.is_empty() {
            sandbox
                .and_then(|s| s.status)
                .map(|s| s.pod_ips)
                .unwrap_or_default()
        } else {
            status.sandbox.pod_ips.clone()
        };
        let pod_ip = pod_ips
            .iter()
            .find(|ip| !ip.contains(':'))
            .or_else(|| pod_ips.first())
            .cloned();
        let identity = Identity {
            namespace,
            claim: claim_name,
            sandbox: sandbox_name,
            pod: pod_name,
            pod_ip,
            shutdown_time: claim
                .spec
                .lifecycle
                .as_ref()
                .and_then(|l| l.shutdown_time.as_ref())
                .map(|t| t.0),
        };
        let sandbox = Sandbox::new(
            identity,
            self.inner.kube.clone(),
            self.inner.options.clone(),
            self.inner.connector.clone(),
            self.inner.created.clone(),
        );
        sandbox.open().await?;
        Ok(sandbox)
    }

    /// Watches the claim until it is Ready (or fails, or the timeout passes).
    async fn wait_ready(
        &self,
        name: &str,
        pool: &str,
        created: SandboxClaim,
        timeout: Duration,
        options: &CreateOptions,
    ) -> Result<SandboxClaim> {
        let namespace = self.namespace().to_owned();
        // A timeout too long for the clock waits "forever" (a century), never panics.
        let deadline = Instant::now()
            .checked_add(timeout)
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600));
        let mut last = created;
        let mut last_reported = String::new();
        let mut assigned = false;
        loop {
            match claim_state(&last) {
                ClaimState::Ready { .. } => return Ok(last),
                ClaimState::Failed { reason, message } => {
                    return Err(failure(&namespace, name, pool, reason, message));
                }
                ClaimState::Pending {
                    sandbox,
                    reason,
                    message,
                } => {
                    if !assigned && let Some(sandbox) = sandbox {
                        assigned = true;
                        progress(options, Progress::SandboxAssigned { sandbox });
                    }
                    let now = format!("{reason}: {message}");
                    if !reason.is_empty() && now != last_reported {
                        last_reported = now;
                        progress(options, Progress::Waiting { reason, message });
                    }
                }
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(Error::ClaimTimeout {
                    namespace,
                    claim: name.to_owned(),
                    waited: timeout,
                    last: last_reported,
                });
            }
            // One watch from the version we have; it ends at the server's timeout, on errors
            // (410 Gone included) we get the claim again and watch anew.
            let version = last.resource_version().unwrap_or_default();
            let params = WatchParams::default()
                .fields(&format!("metadata.name={name}"))
                .timeout(remaining.as_secs().clamp(1, 290) as u32);
            let stream = self
                .claims()
                .watch(&params, &version)
                .await
                .map_err(|source| Error::Kube {
                    operation: "watch SandboxClaim",
                    object: format!("{namespace}/{name}"),
                    source,
                })?;
            let mut stream = std::pin::pin!(stream);
            let mut changed = false;
            let until = tokio::time::sleep(remaining);
            tokio::pin!(until);
            loop {
                tokio::select! {
                    _ = &mut until => break,
                    event = stream.next() => match event {
                        Some(Ok(WatchEvent::Added(claim) | WatchEvent::Modified(claim))) => {
                            last = claim;
                            changed = true;
                            break;
                        }
                        Some(Ok(WatchEvent::Deleted(_))) => {
                            return Err(Error::ClaimNotFound {
                                namespace,
                                claim: name.to_owned(),
                            });
                        }
                        Some(Ok(_)) => {}
                        Some(Err(_)) | None => break,
                    }
                }
            }
            if !changed {
                // Re-read: the watch ended (timeout, 410, network); the claim may have moved on.
                last = self
                    .claims()
                    .get_opt(name)
                    .await
                    .map_err(|source| Error::Kube {
                        operation: "get SandboxClaim",
                        object: format!("{namespace}/{name}"),
                        source,
                    })?
                    .ok_or_else(|| Error::ClaimNotFound {
                        namespace: namespace.clone(),
                        claim: name.to_owned(),
                    })?;
            }
        }
    }

    fn track(&self, namespace: &str, claim: &str) {
        self.inner
            .created
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert((namespace.to_owned(), claim.to_owned()));
    }

    /// Claims this client created and has not deleted.
    pub fn created_claims(&self) -> Vec<ClaimKey> {
        self.inner
            .created
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .cloned()
            .collect()
    }

    /// Lists the claims of the namespace with their sandbox, pod, readiness and expiry.
    pub async fn list(&self) -> Result<Vec<ClaimInfo>> {
        self.list_matching(&ListParams::default()).await
    }

    /// Lists the claims matching `params` (e.g. a label selector).
    pub async fn list_matching(&self, params: &ListParams) -> Result<Vec<ClaimInfo>> {
        let namespace = self.namespace().to_owned();
        let claims = self
            .claims()
            .list(params)
            .await
            .map_err(|source| Error::Kube {
                operation: "list SandboxClaims in",
                object: namespace.clone(),
                source,
            })?;
        let sandboxes: Api<SandboxObject> = Api::namespaced(self.inner.kube.clone(), &namespace);
        let sandboxes = sandboxes
            .list(&ListParams::default())
            .await
            .map_err(|source| Error::Kube {
                operation: "list Sandboxes in",
                object: namespace.clone(),
                source,
            })?;
        let pods: BTreeMap<String, String> = sandboxes
            .items
            .iter()
            .map(|s| {
                let pod = s
                    .annotations()
                    .get(annotations::POD_NAME)
                    .cloned()
                    .unwrap_or_else(|| s.name_any());
                (s.name_any(), pod)
            })
            .collect();
        Ok(claims
            .items
            .iter()
            .map(|claim| claim_info(claim, &pods))
            .collect())
    }

    /// Deletes a claim (and so its sandbox). Deleting a claim that is already gone is not an
    /// error.
    pub async fn delete(&self, claim: &str) -> Result<()> {
        let namespace = self.namespace().to_owned();
        delete_claim(&self.inner.kube, &namespace, claim).await?;
        self.inner
            .created
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&(namespace, claim.to_owned()));
        Ok(())
    }

    async fn delete_with_budget(&self, claim: &str) -> Result<()> {
        let budget = self.inner.options.cleanup_timeout;
        match tokio::time::timeout(budget, self.delete(claim)).await {
            Ok(result) => result,
            Err(_) => Err(Error::Timeout {
                operation: format!("delete SandboxClaim {claim}"),
                sandbox: claim.to_owned(),
                after: budget,
            }),
        }
    }

    /// Deletes every claim this client created (and did not delete yet). Returns how many were
    /// deleted; the first error, if any, after trying all of them.
    pub async fn delete_all(&self) -> Result<usize> {
        delete_all(&self.inner.kube, &self.inner.created).await
    }

    /// Moves the expiry of `claim` to now + `ttl` (`spec.lifecycle.shutdownTime`, policy
    /// `Delete`), retrying on conflicts with the controller's writes. Returns the new time.
    pub async fn extend(&self, claim: &str, ttl: Duration) -> Result<Timestamp> {
        extend_claim(&self.inner.kube, self.namespace(), claim, ttl).await
    }

    /// Mints a scoped router token for `sandbox` in this client's namespace, valid for `ttl`
    /// (`--auth scoped` routers). `key` is the router's signing key (at least 32 bytes).
    pub fn mint_token(&self, key: &[u8], sandbox: &str, ttl: Duration) -> Result<String> {
        mint_token(key, self.namespace(), sandbox, ttl)
    }

    /// On SIGINT or SIGTERM, deletes every claim this client created, then exits the process
    /// (status 130 for SIGINT, 143 for SIGTERM). Keeps working after the returned guard is
    /// dropped; call [`AutoCleanup::stop`] to turn it off.
    ///
    /// ```no_run
    /// # async fn demo(client: agent_sandbox::Client) -> agent_sandbox::Result<()> {
    /// let _cleanup = client.enable_auto_cleanup()?;
    /// let sandbox = client.create_sandbox("python-sandbox-pool").await?;
    /// // Ctrl-C from here on deletes the claim before the process exits.
    /// # Ok(())
    /// # }
    /// ```
    pub fn enable_auto_cleanup(&self) -> Result<AutoCleanup> {
        use tokio::signal::unix::{SignalKind, signal};
        let mut interrupt = signal(SignalKind::interrupt()).map_err(Error::Signals)?;
        let mut terminate = signal(SignalKind::terminate()).map_err(Error::Signals)?;
        let kube = self.inner.kube.clone();
        let created = self.inner.created.clone();
        let budget = self.inner.options.cleanup_timeout;
        let task = tokio::spawn(async move {
            let code = tokio::select! {
                _ = interrupt.recv() => 130,
                _ = terminate.recv() => 143,
            };
            match tokio::time::timeout(budget, delete_all(&kube, &created)).await {
                Ok(Ok(count)) => tracing::info!(count, "auto cleanup deleted the claims"),
                Ok(Err(error)) => tracing::error!(%error, "auto cleanup failed"),
                Err(_) => tracing::error!(?budget, "auto cleanup timed out"),
            }
            std::process::exit(code);
        });
        Ok(AutoCleanup { task })
    }
}

/// The SIGINT/SIGTERM handler installed by [`Client::enable_auto_cleanup`].
#[derive(Debug)]
pub struct AutoCleanup {
    task: tokio::task::JoinHandle<()>,
}

impl AutoCleanup {
    /// Removes the handler's effect: signals no longer delete claims (the process keeps the
    /// signal disposition tokio installed, so SIGINT/SIGTERM are then ignored).
    pub fn stop(self) {
        self.task.abort();
    }
}

fn progress(options: &CreateOptions, step: Progress) {
    if let Some(callback) = &options.progress {
        callback(&step);
    }
}

/// `now + ttl`, for a `ttl` of at most [`MAX_TTL`](crate::MAX_TTL): an error naming the
/// maximum otherwise, never a missing or saturated time.
pub(crate) fn expiry(option: &'static str, now: Timestamp, ttl: Duration) -> Result<Timestamp> {
    let ttl = check_ttl(option, ttl)?;
    let out_of_range = |e: jiff::Error| Error::InvalidOption {
        option,
        message: format!("now + {}s is not a valid time: {e}", ttl.as_secs()),
    };
    let signed = jiff::SignedDuration::try_from(ttl).map_err(out_of_range)?;
    now.checked_add(signed).map_err(out_of_range)
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

fn failure(namespace: &str, claim: &str, pool: &str, reason: String, message: String) -> Error {
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

fn claim_info(claim: &SandboxClaim, pods: &BTreeMap<String, String>) -> ClaimInfo {
    let status = claim.status.clone().unwrap_or_default();
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == claim_cond::READY);
    let sandbox = Some(status.sandbox.name.clone()).filter(|s| !s.is_empty());
    ClaimInfo {
        namespace: claim.namespace().unwrap_or_default(),
        claim: claim.name_any(),
        warm_pool: claim.spec.warm_pool_ref.name.clone(),
        pod: sandbox.as_ref().and_then(|s| pods.get(s).cloned()),
        sandbox,
        ready: ready.is_some_and(|c| c.status == "True"),
        reason: ready.map(|c| c.reason.clone()),
        message: ready.map(|c| c.message.clone()),
        shutdown_time: claim
            .spec
            .lifecycle
            .as_ref()
            .and_then(|l| l.shutdown_time.as_ref())
            .map(|t| t.0),
        created: claim.metadata.creation_timestamp.as_ref().map(|t| t.0),
        created_by: claim.labels().get(labels::CREATED_BY).cloned(),
    }
}

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

async fn delete_all(kube: &kube::Client, created: &Mutex<BTreeSet<ClaimKey>>) -> Result<usize> {
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
        let mut object = api
            .get_opt(claim)
            .await
            .map_err(|source| Error::Kube {
                operation: "get SandboxClaim",
                object: object_name.clone(),
                source,
            })?
            .ok_or_else(|| Error::ClaimNotFound {
                namespace: namespace.to_owned(),
                claim: claim.to_owned(),
            })?;
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

/// Mints a scoped router token for `namespace/sandbox`, valid for `ttl`.
pub fn mint_token(key: &[u8], namespace: &str, sandbox: &str, ttl: Duration) -> Result<String> {
    let expires = expiry("token ttl", Timestamp::now(), ttl)?.as_second();
    let token_error = |source| Error::Token {
        namespace: namespace.to_owned(),
        sandbox: sandbox.to_owned(),
        source,
    };
    let key = agent_sandbox_api::token::signing_key(key).map_err(token_error)?;
    agent_sandbox_api::token::mint(
        key,
        &agent_sandbox_api::token::Claims::new(namespace, sandbox, expires),
    )
    .map_err(token_error)
}

#[cfg(test)]
mod tests {
    use super::*;
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
                "apiVersion": agent_sandbox_api::EXTENSIONS_API_VERSION, "kind": agent_sandbox_api::kinds::SANDBOX_CLAIM,
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
}
