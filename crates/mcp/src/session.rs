//! The claims of one server process, its session: which claims it may touch (those labelled
//! with its session id: [`SESSION_LABEL`]), their connected SDK handles and TTLs, pushing their
//! expiry forward on each use, an SDK client per namespace, and deleting its claims when it
//! stops.
//!
//! Ownership is the label on the claim, as upstream's server has it; the handles are a cache
//! of it. A claim that is not this session's is answered exactly like a missing one, so a
//! caller learns nothing about other people's sandboxes.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use agent_sandbox::{Client, Sandbox};
use agent_sandbox_api::SandboxClaim;
use jiff::{SignedDuration, Timestamp};
use kube::api::ListParams;
use kube::{Api, ResourceExt as _};

use crate::config::{McpConfig, SESSION_LABEL};
use crate::error::{ToolError, chain};

/// Budget of deleting the session's claims when the server stops.
const CLOSE_BUDGET: Duration = Duration::from_secs(30);
/// What a claim's expiry gets beyond the timeout of the operation running in it, so that it
/// does not expire under a long command.
const BUSY_MARGIN: Duration = Duration::from_secs(60);

/// `(namespace, claim)`.
type Key = (String, String);

/// A claim of this session: its connected handle and its TTL.
#[derive(Clone, Debug)]
pub(crate) struct Owned {
    pub(crate) sandbox: Sandbox,
    pub(crate) ttl: Duration,
}

/// The session of a server process.
#[derive(Debug)]
pub(crate) struct Session {
    config: McpConfig,
    base: Client,
    clients: Mutex<BTreeMap<String, Client>>,
    claims: Mutex<BTreeMap<Key, Owned>>,
}

/// The error for a claim that is missing, expired, or not this session's (the same words for
/// all three).
pub(crate) fn not_found(claim: &str, namespace: &str) -> ToolError {
    ToolError::new(format!(
        "Sandbox claim '{claim}' is not found in namespace '{namespace}'. This server only uses \
         the sandboxes it created in this session, and a sandbox is deleted after it goes unused \
         for its shutdown_after_seconds. Check the name and namespace (the resource \
         sandboxes://{namespace} lists this session's sandboxes), or call create_sandbox for a \
         new one."
    ))
}

/// Whether a claim whose expiry is `current` needs a push to `now + wanted` (sans IO): not
/// when it already expires within a tenth of `wanted` (at most a minute) of that, so that a
/// burst of tool calls costs one write.
pub(crate) fn needs_extension(
    now: Timestamp,
    current: Option<Timestamp>,
    wanted: Duration,
) -> bool {
    let Some(current) = current else {
        return true;
    };
    let slack = (wanted / 10).min(Duration::from_secs(60));
    let floor = SignedDuration::try_from(wanted.saturating_sub(slack))
        .ok()
        .and_then(|ahead| now.checked_add(ahead).ok());
    floor.is_none_or(|floor| current < floor)
}

impl Session {
    pub(crate) fn new(base: Client, config: McpConfig) -> Self {
        Self {
            config,
            base,
            clients: Mutex::default(),
            claims: Mutex::default(),
        }
    }

    pub(crate) fn id(&self) -> &str {
        &self.config.session_id
    }

    pub(crate) fn config(&self) -> &McpConfig {
        &self.config
    }

    /// The namespace a tool means: its argument, else the server's.
    pub(crate) fn namespace(&self, namespace: Option<&str>) -> String {
        namespace.unwrap_or(self.base.namespace()).to_owned()
    }

    /// The SDK client for `namespace` (one per namespace, sharing the Kubernetes client and
    /// the connection options).
    pub(crate) fn client(&self, namespace: &str) -> Client {
        if namespace == self.base.namespace() {
            return self.base.clone();
        }
        let mut clients = self.clients.lock().unwrap_or_else(PoisonError::into_inner);
        clients
            .entry(namespace.to_owned())
            .or_insert_with(|| {
                Client::from_kube(
                    self.base.kube_client().clone(),
                    self.base.options().clone().namespace(namespace),
                )
            })
            .clone()
    }

    /// Records a sandbox this session just created.
    pub(crate) fn adopt(&self, sandbox: Sandbox, ttl: Duration) -> Owned {
        let owned = Owned { sandbox, ttl };
        let key = (
            owned.sandbox.namespace().to_owned(),
            owned.sandbox.claim_name().to_owned(),
        );
        self.claims
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key, owned.clone());
        owned
    }

    fn cached(&self, namespace: &str, claim: &str) -> Option<Owned> {
        self.claims
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&(namespace.to_owned(), claim.to_owned()))
            .cloned()
    }

    /// Forgets a claim (deleted, or found gone).
    pub(crate) fn forget(&self, namespace: &str, claim: &str) -> Option<Owned> {
        self.claims
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&(namespace.to_owned(), claim.to_owned()))
    }

    /// Whether the claim exists and carries this session's label.
    async fn labelled(&self, namespace: &str, claim: &str) -> Result<bool, ToolError> {
        let api: Api<SandboxClaim> = Api::namespaced(self.base.kube_client().clone(), namespace);
        match api.get_opt(claim).await {
            Ok(object) => Ok(object.is_some_and(|object| {
                object.labels().get(SESSION_LABEL).map(String::as_str) == Some(self.id())
            })),
            Err(error) => Err(ToolError::new(format!(
                "could not look up sandbox claim '{claim}' in namespace '{namespace}': {}; \
                 retry in a moment, and if it keeps failing the server cannot reach the \
                 Kubernetes API (or may not read SandboxClaims there)",
                chain(&error)
            ))),
        }
    }

    /// The connected handle of a claim of this session: from the cache, else attached after
    /// checking the claim's label (a claim of an earlier server with the same session id).
    pub(crate) async fn owned(&self, namespace: &str, claim: &str) -> Result<Owned, ToolError> {
        if let Some(owned) = self.cached(namespace, claim) {
            return Ok(owned);
        }
        if !self.labelled(namespace, claim).await? {
            return Err(not_found(claim, namespace));
        }
        let sandbox = match self.client(namespace).get_sandbox(claim).await {
            Ok(sandbox) => sandbox,
            Err(error) if error.is_not_found() => return Err(not_found(claim, namespace)),
            Err(error) => {
                return Err(ToolError::new(format!(
                    "sandbox claim '{claim}' in namespace '{namespace}' cannot be used now: {}; \
                     wait a little and retry, or delete it and create a new one",
                    chain(&error)
                )));
            }
        };
        Ok(self.adopt(sandbox, self.config.default_ttl))
    }

    /// Pushes the claim's expiry to now + its TTL (at least `busy` plus a margin), unless it
    /// is already about that far. A claim found gone is forgotten and reported as not found;
    /// other failures are only logged (the sandbox still works until its current expiry).
    pub(crate) async fn touch(&self, owned: &Owned, busy: Duration) -> Result<(), ToolError> {
        let wanted = owned.ttl.max(busy.saturating_add(BUSY_MARGIN));
        if !needs_extension(Timestamp::now(), owned.sandbox.shutdown_time(), wanted) {
            return Ok(());
        }
        match owned.sandbox.extend_ttl(wanted).await {
            Ok(at) => {
                tracing::debug!(claim = owned.sandbox.claim_name(), %at, "pushed the expiry");
                Ok(())
            }
            Err(error) if error.is_not_found() => Err(self.gone(owned)),
            Err(error) => {
                tracing::warn!(
                    claim = owned.sandbox.claim_name(),
                    namespace = owned.sandbox.namespace(),
                    error = %chain(&error),
                    "could not push the claim's expiry; it expires at its current time"
                );
                Ok(())
            }
        }
    }

    /// Forgets a claim found gone and says so.
    pub(crate) fn gone(&self, owned: &Owned) -> ToolError {
        let (namespace, claim) = (owned.sandbox.namespace(), owned.sandbox.claim_name());
        self.forget(namespace, claim);
        not_found(claim, namespace)
    }

    /// After a failed operation: whether the claim is gone (then forgotten). Errors looking it
    /// up count as not gone (the operation's own error is reported then).
    pub(crate) async fn is_gone(&self, owned: &Owned) -> bool {
        let client = self.client(owned.sandbox.namespace());
        match client.claim(owned.sandbox.claim_name()).await {
            Err(error) if error.is_not_found() => {
                self.forget(owned.sandbox.namespace(), owned.sandbox.claim_name());
                true
            }
            _ => false,
        }
    }

    /// Deletes a claim of this session (also one that is not Ready).
    pub(crate) async fn delete(&self, namespace: &str, claim: &str) -> Result<(), ToolError> {
        let failed = |error: agent_sandbox::Error| {
            ToolError::new(format!(
                "failed to delete sandbox claim '{claim}' in namespace '{namespace}': {}; retry \
                 in a moment (it also expires by itself after its shutdown_after_seconds)",
                chain(&error)
            ))
        };
        if let Some(owned) = self.cached(namespace, claim) {
            owned.sandbox.close().await.map_err(failed)?;
            self.forget(namespace, claim);
            return Ok(());
        }
        if !self.labelled(namespace, claim).await? {
            return Err(not_found(claim, namespace));
        }
        self.client(namespace).delete(claim).await.map_err(failed)
    }

    /// The names of this session's claims in `namespace`, sorted.
    pub(crate) async fn names(&self, namespace: &str) -> agent_sandbox::Result<Vec<String>> {
        let selector = format!("{SESSION_LABEL}={}", self.id());
        let claims = self
            .client(namespace)
            .list_matching(&ListParams::default().labels(&selector))
            .await?;
        let mut names: Vec<String> = claims.into_iter().map(|info| info.claim).collect();
        names.sort();
        Ok(names)
    }

    /// When the server stops: deletes the session's claims (when configured to), within
    /// [`CLOSE_BUDGET`].
    pub(crate) async fn close(&self) {
        if !self.config.delete_on_exit {
            return;
        }
        let owned: Vec<Owned> =
            std::mem::take(&mut *self.claims.lock().unwrap_or_else(PoisonError::into_inner))
                .into_values()
                .collect();
        let mut clients = vec![self.base.clone()];
        clients.extend(
            self.clients
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .values()
                .cloned(),
        );
        let work = async {
            let mut deleted = 0_usize;
            for claim in &owned {
                match claim.sandbox.close().await {
                    Ok(()) => deleted += 1,
                    Err(error) => tracing::warn!(
                        claim = claim.sandbox.claim_name(),
                        error = %chain(&error),
                        "could not delete the claim; it expires by itself"
                    ),
                }
            }
            // Claims created but never handed out (a create cancelled half-way).
            for client in &clients {
                match client.delete_all().await {
                    Ok(count) => deleted += count,
                    Err(error) => tracing::warn!(
                        namespace = client.namespace(),
                        error = %chain(&error),
                        "could not delete the claims; they expire by themselves"
                    ),
                }
            }
            deleted
        };
        match tokio::time::timeout(CLOSE_BUDGET, work).await {
            Ok(0) => {}
            Ok(deleted) => tracing::info!(deleted, "deleted the session's sandbox claims"),
            Err(_) => tracing::warn!(
                budget = ?CLOSE_BUDGET,
                "deleting the session's claims took too long; the rest expire by themselves"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_and_foreign_claims_read_alike_and_say_what_to_do() {
        let message = not_found("sandbox-claim-x", "team-a").message().to_owned();
        assert!(
            message
                .starts_with("Sandbox claim 'sandbox-claim-x' is not found in namespace 'team-a'.")
        );
        assert!(message.contains("sandboxes://team-a"), "{message}");
        assert!(message.contains("create_sandbox"), "{message}");
    }

    #[test]
    fn extensions_are_skipped_while_the_expiry_is_nearly_as_far() {
        let now = Timestamp::from_second(1_000_000).unwrap_or(Timestamp::UNIX_EPOCH);
        let at = |seconds: i64| now.checked_add(SignedDuration::from_secs(seconds)).ok();
        let five_minutes = Duration::from_secs(300);
        assert!(needs_extension(now, None, five_minutes), "unknown expiry");
        assert!(!needs_extension(now, at(300), five_minutes), "just pushed");
        assert!(!needs_extension(now, at(271), five_minutes), "within 30 s");
        assert!(
            needs_extension(now, at(269), five_minutes),
            "half a minute later"
        );
        assert!(needs_extension(now, at(-5), five_minutes), "expired");
        // A long TTL has at most a minute of slack.
        let day = Duration::from_secs(86_400);
        assert!(needs_extension(now, at(86_400 - 61), day));
        assert!(!needs_extension(now, at(86_400 - 59), day));
    }
}
