//! What every reconcile gets: the client, the caches, the configuration, metrics, the event
//! recorder, and the little in-memory state that keeps a stale cache from causing duplicate work
//! (pool creation expectations, claim reservations). That state only avoids wasted writes; the
//! correctness of adoption rests on the conditional write, not on it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Client, Resource, ResourceExt};

use crate::cache::Caches;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::rate::PoolPacing;

/// How long in-memory expectations are trusted before the cache is believed instead.
const EXPECTATION_TTL: Duration = Duration::from_secs(30);

/// Shared state of all reconcilers.
pub struct Context {
    /// API client.
    pub client: Client,
    /// Configuration.
    pub config: Config,
    /// Caches.
    pub caches: Caches,
    /// Metrics.
    pub metrics: Metrics,
    recorder: Recorder,
    /// Per pool (`ns/name`): members created and not yet seen in the cache.
    pool_expectations: Mutex<HashMap<String, Vec<(String, Instant)>>>,
    /// Sandboxes (`ns/name`) a claim reconcile is adopting right now, or adopted moments ago.
    reservations: Mutex<HashMap<String, Instant>>,
    /// When each claim (by UID) was first seen, for the startup-latency metric.
    claims_seen: Mutex<HashMap<String, FirstSeen>>,
    /// Claims (by UID) whose annotations this controller patched moments ago, so that a pass on
    /// a cache that does not show them yet does not patch them again.
    annotated: Mutex<HashMap<String, Instant>>,
    /// Statuses written recently (by object UID) that the cache may not show yet.
    written: Mutex<HashMap<String, (serde_json::Value, Instant)>>,
    /// The pace of pool member creation: over all pools, per pool, after members leave.
    creations: Mutex<PoolPacing>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Locks a mutex, recovering from poisoning (the maps hold hints, never invariants).
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Context {
    /// Builds the context.
    pub fn new(client: Client, config: Config, caches: Caches, metrics: Metrics) -> Self {
        Self {
            creations: Mutex::new(PoolPacing::new(
                config.create_rate,
                config.refill_rate,
                config.replenish_delay,
                Instant::now(),
            )),
            recorder: Recorder::new(client.clone(), reporter()),
            client,
            config,
            caches,
            metrics,
            pool_expectations: Mutex::default(),
            reservations: Mutex::default(),
            claims_seen: Mutex::default(),
            annotated: Mutex::default(),
            written: Mutex::default(),
        }
    }

    /// Publishes an Event about `object` in the background (a failed Event never fails a
    /// reconcile).
    pub fn event<K: Resource<DynamicType = ()>>(
        &self,
        object: &K,
        warning: bool,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let reference: ObjectReference = object.object_ref(&());
        let recorder = self.recorder.clone();
        let event = Event {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.to_owned(),
            note: Some(note.chars().take(1000).collect()),
            action: action.to_owned(),
            secondary: None,
        };
        tokio::spawn(async move {
            if let Err(error) = recorder.publish(&event, &reference).await {
                tracing::debug!(%error, reason = %event.reason, "failed to publish an Event");
            }
        });
    }

    /// Takes a token for one pool member creation, or says how long until one is there.
    pub fn take_creation_token(&self) -> Result<(), Duration> {
        lock(&self.creations).take_creation(Instant::now())
    }

    /// Grants up to `wanted` member creations to the pool `pool_key` under the per-pool refill
    /// rate: how many, and when short, how long until the next.
    pub fn grant_refills(&self, pool_key: &str, wanted: usize) -> (usize, Option<Duration>) {
        lock(&self.creations).grant_refills(pool_key, wanted, Instant::now())
    }

    /// Records the pool's member count (present and pending) and whether it lacks members, and
    /// says how long its replacements must still wait after members left it.
    pub fn replenish_hold(
        &self,
        pool_key: &str,
        members: usize,
        lacking: bool,
    ) -> Option<Duration> {
        lock(&self.creations).replenish_hold(pool_key, members, lacking, Instant::now())
    }

    /// Forgets the pacing state of a pool that is going away.
    pub fn forget_pool_pacing(&self, pool_key: &str) {
        lock(&self.creations).forget(pool_key);
    }

    /// Records that `name` was created for `pool_key`.
    pub fn expect_member(&self, pool_key: &str, name: String) {
        lock(&self.pool_expectations)
            .entry(pool_key.to_owned())
            .or_default()
            .push((name, Instant::now()));
    }

    /// Forgets a created member (its creation failed after all).
    pub fn forget_member(&self, pool_key: &str, name: &str) {
        if let Some(list) = lock(&self.pool_expectations).get_mut(pool_key) {
            list.retain(|(pending, _)| pending != name);
        }
    }

    /// How many members of `pool_key` were created but are not in `seen` yet.
    pub fn pending_members(&self, pool_key: &str, seen: &dyn Fn(&str) -> bool) -> usize {
        let mut map = lock(&self.pool_expectations);
        let Some(list) = map.get_mut(pool_key) else {
            return 0;
        };
        list.retain(|(name, at)| at.elapsed() < EXPECTATION_TTL && !seen(name));
        let pending = list.len();
        if pending == 0 {
            map.remove(pool_key);
        }
        pending
    }

    /// Tries to reserve sandbox `key` for one adoption attempt; false when another reconcile
    /// holds it.
    pub fn reserve(&self, key: &str) -> bool {
        let mut map = lock(&self.reservations);
        map.retain(|_, at| at.elapsed() < EXPECTATION_TTL);
        if map.contains_key(key) {
            return false;
        }
        map.insert(key.to_owned(), Instant::now());
        true
    }

    /// Releases a reservation after a failed attempt (a successful one stays reserved until the
    /// cache shows the new owner, or the TTL passes).
    pub fn release(&self, key: &str) {
        lock(&self.reservations).remove(key);
    }

    /// True when `key` is reserved.
    pub fn is_reserved(&self, key: &str) -> bool {
        lock(&self.reservations)
            .get(key)
            .is_some_and(|at| at.elapsed() < EXPECTATION_TTL)
    }

    /// When the claim with `uid` was first seen (now, on the first call).
    pub fn claim_first_seen(&self, uid: &str) -> FirstSeen {
        *lock(&self.claims_seen)
            .entry(uid.to_owned())
            .or_insert_with(|| FirstSeen {
                at: Instant::now(),
                wall: Timestamp::now(),
            })
    }

    /// True when the annotations of the claim with `uid` were patched moments ago.
    pub fn recently_annotated(&self, uid: &str) -> bool {
        lock(&self.annotated)
            .get(uid)
            .is_some_and(|at| at.elapsed() < EXPECTATION_TTL)
    }

    /// Remembers that the annotations of the claim with `uid` were just patched.
    pub fn remember_annotated(&self, uid: &str) {
        let mut map = lock(&self.annotated);
        map.retain(|_, at| at.elapsed() < EXPECTATION_TTL);
        map.insert(uid.to_owned(), Instant::now());
    }

    /// The freshest known status of the object with `uid`: the one this controller wrote last, while
    /// the cache (`cached`) does not show it yet; otherwise the cached one.
    ///
    /// Without this, a pass that runs on a stale cache recomputes the status from the old one and
    /// writes it again (with new transition times), costing an API write per stale pass.
    pub fn freshest_status<S>(&self, uid: &str, cached: Option<&S>) -> Option<S>
    where
        S: Clone + serde::Serialize + serde::de::DeserializeOwned,
    {
        let mut map = lock(&self.written);
        map.retain(|_, (_, at)| at.elapsed() < EXPECTATION_TTL);
        let Some((written, _)) = map.get(uid) else {
            return cached.cloned();
        };
        let cached_json = cached.and_then(|status| serde_json::to_value(status).ok());
        if cached_json.as_ref() == Some(written) {
            map.remove(uid);
            return cached.cloned();
        }
        serde_json::from_value(written.clone())
            .ok()
            .or_else(|| cached.cloned())
    }

    /// Remembers a status this controller wrote for the object with `uid`.
    pub fn remember_status<S: serde::Serialize>(&self, uid: &str, status: &S) {
        if let Ok(value) = serde_json::to_value(status) {
            lock(&self.written).insert(uid.to_owned(), (value, Instant::now()));
        }
    }

    /// Forgets a claim (deleted, or its latency recorded).
    pub fn forget_claim(&self, uid: &str) {
        lock(&self.claims_seen).remove(uid);
    }
}

/// When the controller first saw a claim: the monotonic instant for latencies, the wall-clock time
/// for its `controller-first-observed-at` annotation.
#[derive(Clone, Copy, Debug)]
pub struct FirstSeen {
    /// Monotonic.
    pub at: Instant,
    /// Wall clock.
    pub wall: Timestamp,
}

/// Who the controller's Events say they come from.
pub fn reporter() -> Reporter {
    Reporter {
        controller: agent_sandbox_api::wire::CONTROLLER_NAME.to_owned(),
        instance: std::env::var("POD_NAME").ok(),
    }
}

/// `namespace/name` of an object.
pub fn key<K: Resource>(object: &K) -> String {
    format!(
        "{}/{}",
        object.namespace().unwrap_or_default(),
        object.name_any()
    )
}

/// The current time, truncated to whole seconds: the API stores condition times with second
/// precision, so anything finer would make every freshly computed status differ from the stored
/// one and cause a write per reconcile.
pub fn now() -> Timestamp {
    let now = Timestamp::now();
    Timestamp::from_second(now.as_second()).unwrap_or(now)
}
