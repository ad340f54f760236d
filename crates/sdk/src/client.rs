//! The [`Client`]: the entry point that ties the layers below it together: SandboxClaims
//! (create and wait, re-attach, list, extend, delete; from `claims`), warm pools (`pools`), pod
//! logs (`logs`), tokens (`token`), the connection to the router its sandboxes share
//! (`connection`), and auto cleanup on SIGINT/SIGTERM.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use agent_sandbox_api::{SandboxClaim, annotations};
use jiff::Timestamp;
use kube::api::{ListParams, PostParams};
use kube::{Api, ResourceExt as _};

use crate::claims::{
    self, ClaimInfo, ClaimKey, ClaimState, claim_object, claim_state, delete_claim, extend_claim,
};
use crate::connection::Connector;
use crate::error::{Error, Result};
use crate::kubeconfig::ApiConfig;
use crate::logs::{self, LogLines};
use crate::options::{ClientOptions, CreateOptions, Progress};
use crate::pools::{self, WarmPoolInfo};
use crate::sandbox::{Identity, Sandbox};
use crate::token::mint_token;

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
            .field("api_url", &self.api_url)
            .finish_non_exhaustive()
    }
}

struct Inner {
    kube: kube::Client,
    options: ClientOptions,
    /// The API server's URL, when the client was made from a loaded configuration.
    api_url: Option<String>,
    connector: Arc<Connector>,
    created: Arc<Mutex<BTreeSet<ClaimKey>>>,
}

impl Client {
    /// A client from the default kubeconfig (or the in-cluster configuration).
    pub async fn new(options: ClientOptions) -> Result<Self> {
        let kube = kube::Client::try_default()
            .await
            .map_err(Error::KubeConfig)?;
        Ok(Self::from_kube(kube, options))
    }

    /// A client for the API server of a loaded configuration
    /// ([`Kubeconfig::load`](crate::Kubeconfig::load)), which [`Client::api_url`] then names.
    ///
    /// ```no_run
    /// # async fn demo() -> agent_sandbox::Result<()> {
    /// use agent_sandbox::{Client, ClientOptions, Kubeconfig};
    ///
    /// let config = Kubeconfig::default().context("kind-dev").load().await?;
    /// let namespace = config.default_namespace().to_owned();
    /// let client = Client::from_config(config, ClientOptions::default().namespace(namespace))?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn from_config(config: ApiConfig, options: ClientOptions) -> Result<Self> {
        let kube = config.kube_client()?;
        Ok(Self::build(kube, options, Some(config.url())))
    }

    /// A client using an existing `kube::Client`.
    pub fn from_kube(kube: kube::Client, options: ClientOptions) -> Self {
        Self::build(kube, options, None)
    }

    fn build(kube: kube::Client, options: ClientOptions, api_url: Option<String>) -> Self {
        let connector = Arc::new(Connector::new(kube.clone(), options.clone()));
        Self {
            inner: Arc::new(Inner {
                kube,
                options,
                api_url,
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

    /// The Kubernetes API server's URL, for clients made with [`Client::from_config`].
    pub fn api_url(&self) -> Option<&str> {
        self.inner.api_url.as_deref()
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
        let report = |step: Progress| {
            if let Some(callback) = &options.progress {
                callback(&step);
            }
        };
        report(Progress::ClaimCreated {
            claim: name.clone(),
        });
        let timeout = options
            .ready_timeout
            .unwrap_or(self.inner.options.sandbox_ready_timeout);
        let result = async {
            let ready = claims::wait_ready(
                &self.inner.kube,
                &namespace,
                &name,
                warm_pool,
                timeout,
                &report,
            )
            .await?;
            report(Progress::Connecting);
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

    /// A handle to an existing claim's sandbox (it must be Ready, or suspended: the first
    /// request wakes it), e.g. one created by another
    /// process: attaches to the claim by name. Deleting through it ([`Sandbox::close`]) deletes
    /// the claim. [`Error::ClaimNotFound`] when there is no such claim.
    pub async fn get_sandbox(&self, claim: &str) -> Result<Sandbox> {
        let object = claims::get_claim(&self.inner.kube, self.namespace(), claim).await?;
        match claim_state(&object) {
            ClaimState::Ready { .. } => self.attach(object).await,
            // Suspended: the first request through the router wakes it.
            ClaimState::Pending {
                sandbox: Some(_),
                reason,
                ..
            } if reason == agent_sandbox_api::conditions::sandbox::REASON_SUSPENDED => {
                self.attach(object).await
            }
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
        let sandbox =
            claims::get_sandbox_object(&self.inner.kube, &namespace, &sandbox_name).await?;
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
            shutdown_time: claims::shutdown_time(&claim),
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

    /// One claim of the namespace with its sandbox, pod, readiness and expiry;
    /// [`Error::ClaimNotFound`] when there is none of that name.
    pub async fn claim(&self, claim: &str) -> Result<ClaimInfo> {
        claims::claim_info_of(&self.inner.kube, self.namespace(), claim).await
    }

    /// Lists the claims of the namespace with their sandbox, pod, readiness and expiry.
    pub async fn list(&self) -> Result<Vec<ClaimInfo>> {
        self.list_matching(&ListParams::default()).await
    }

    /// Lists the claims of the namespace matching `params` (e.g. a label selector).
    pub async fn list_matching(&self, params: &ListParams) -> Result<Vec<ClaimInfo>> {
        claims::list_claims(&self.inner.kube, Some(self.namespace()), params).await
    }

    /// Lists the claims of every namespace (the client's namespace aside), as
    /// [`Client::list`] does for one.
    pub async fn list_all_namespaces(&self) -> Result<Vec<ClaimInfo>> {
        claims::list_claims(&self.inner.kube, None, &ListParams::default()).await
    }

    /// The warm pools of the namespace with their template and warm sandboxes.
    pub async fn warm_pools(&self) -> Result<Vec<WarmPoolInfo>> {
        pools::list_pools(&self.inner.kube, Some(self.namespace())).await
    }

    /// The warm pools of every namespace.
    pub async fn warm_pools_all_namespaces(&self) -> Result<Vec<WarmPoolInfo>> {
        pools::list_pools(&self.inner.kube, None).await
    }

    /// The warm pool `name` of the namespace, if it exists.
    pub async fn warm_pool(&self, name: &str) -> Result<Option<WarmPoolInfo>> {
        pools::get_pool(&self.inner.kube, self.namespace(), name).await
    }

    /// The log of the pod of `claim`'s sandbox (what its runtime wrote), the last `tail_lines`
    /// lines when given. [`Error::ClaimNotFound`], or [`Error::ClaimNotReady`] while the claim
    /// has no sandbox.
    pub async fn logs(&self, claim: &str, tail_lines: Option<i64>) -> Result<String> {
        logs::read(&self.inner.kube, self.namespace(), claim, tail_lines).await
    }

    /// Follows the log of the pod of `claim`'s sandbox line by line, from the last `tail_lines`
    /// lines when given, until the pod's log ends.
    pub async fn follow_logs(&self, claim: &str, tail_lines: Option<i64>) -> Result<LogLines> {
        logs::follow(&self.inner.kube, self.namespace(), claim, tail_lines).await
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
        claims::delete_all(&self.inner.kube, &self.inner.created).await
    }

    /// Moves the expiry of `claim` to now + `ttl` (`spec.lifecycle.shutdownTime`, policy
    /// `Delete`), retrying on conflicts with the controller's writes. Returns the new time.
    /// [`Error::ClaimNotFound`] when there is no such claim.
    pub async fn extend(&self, claim: &str, ttl: Duration) -> Result<Timestamp> {
        extend_claim(&self.inner.kube, self.namespace(), claim, ttl).await
    }

    /// Mints a scoped router token for `sandbox` in this client's namespace, valid for `ttl`
    /// (`--auth scoped` routers). `key` is the router's signing key (at least 32 bytes).
    pub fn mint_token(&self, key: &[u8], sandbox: &str, ttl: Duration) -> Result<String> {
        mint_token(key, self.namespace(), sandbox, ttl)
    }

    /// Mints a scoped router token for the sandbox of `claim`, valid for `ttl`: what someone
    /// else needs to reach that one sandbox through an `--auth scoped` router.
    /// [`Error::ClaimNotFound`], or [`Error::ClaimNotReady`] while the claim has no sandbox.
    pub async fn mint_claim_token(&self, key: &[u8], claim: &str, ttl: Duration) -> Result<String> {
        let info = self.claim(claim).await?;
        self.mint_token(key, info.assigned_sandbox()?, ttl)
    }

    /// Suspends the sandbox of `claim` (its pod goes, volumes and Service stay); the next
    /// request through the router wakes it. Returns the sandbox's name.
    /// [`Error::ClaimNotFound`], or [`Error::ClaimNotReady`] while the claim has no sandbox.
    pub async fn suspend(&self, claim: &str) -> Result<String> {
        let info = self.claim(claim).await?;
        let sandbox = info.assigned_sandbox()?.to_owned();
        crate::claims::set_suspended(&self.inner.kube, self.namespace(), &sandbox, true).await?;
        Ok(sandbox)
    }

    /// Resumes the suspended sandbox of `claim` (its pod comes back). Returns its name.
    pub async fn resume(&self, claim: &str) -> Result<String> {
        let info = self.claim(claim).await?;
        let sandbox = info.assigned_sandbox()?.to_owned();
        crate::claims::set_suspended(&self.inner.kube, self.namespace(), &sandbox, false).await?;
        Ok(sandbox)
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
            match tokio::time::timeout(budget, claims::delete_all(&kube, &created)).await {
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
