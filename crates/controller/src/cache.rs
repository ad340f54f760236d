//! The shared caches: one watch per kind, reflected into a store that every reconciler reads,
//! with a subscription per controller that consumes the kind's changes.
//!
//! One watch per kind (not one per controller) keeps memory at one copy of each object: the
//! Sandbox cache is read by three reconcilers. Fields no reconciler reads (`managedFields`, most
//! of a Pod's spec) are stripped before objects are stored.
//!
//! Objects are decoded one at a time ([`crate::lenient`]): one the controller cannot decode is
//! left out of the cache, reported once per version (a log line and a Warning Event on it, both
//! naming it and the field), and the rest of its kind is cached and reconciled as usual.

use std::collections::HashMap;
use std::fmt::Debug;
use std::time::Duration;

use agent_sandbox_api::Sandbox;
use agent_sandbox_api::conditions::events as event_reasons;
use agent_sandbox_api::{SandboxClaim, SandboxTemplate, SandboxWarmPool, labels};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ObjectReference, Pod, PodSpec, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::task::JoinSet;

use crate::lenient::{Lenient, Undecodable};

/// How many kinds are watched (each counts once towards readiness).
const KINDS: usize = 7;
/// How many of them only the claim, pool and template controllers read (not watched with
/// upstream's `--extensions=false`).
const EXTENSION_KINDS: usize = 4;

/// How many changes a slow consumer may lag behind before the watch waits for it.
const CONSUMER_BUFFER: usize = 4096;

/// A stream of changed objects (applied or deleted) of one kind, for one controller.
pub type Changes<K> = futures::stream::BoxStream<'static, Result<K, watcher::Error>>;
/// Read handles to every cache.
#[derive(Clone)]
pub struct Caches {
    /// Sandboxes.
    pub sandboxes: Store<Sandbox>,
    /// Pods that carry the sandbox name-hash label (spec stripped to `nodeName`).
    pub pods: Store<Pod>,
    /// Services that carry the sandbox name-hash label.
    pub services: Store<Service>,
    /// SandboxClaims.
    pub claims: Store<SandboxClaim>,
    /// SandboxWarmPools.
    pub pools: Store<SandboxWarmPool>,
    /// SandboxTemplates.
    pub templates: Store<SandboxTemplate>,
    /// NetworkPolicies.
    pub policies: Store<NetworkPolicy>,
    /// How many of the watches have completed their initial list.
    synced: tokio::sync::watch::Receiver<usize>,
}

/// The writers of [`Caches::detached`].
#[cfg(test)]
pub(crate) struct DetachedWriters {
    /// Sandboxes.
    pub sandboxes: kube::runtime::reflector::store::Writer<Sandbox>,
}

impl std::fmt::Debug for Caches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Caches")
            .field("sandboxes", &self.sandboxes.len())
            .field("pods", &self.pods.len())
            .field("claims", &self.claims.len())
            .finish_non_exhaustive()
    }
}

impl Caches {
    /// Caches with a writer per store and no watch, for tests that fill the stores by hand.
    #[cfg(test)]
    pub(crate) fn detached() -> (Self, DetachedWriters) {
        use kube::runtime::reflector::store::Writer;
        let mut sandboxes = Writer::<Sandbox>::default();
        let (_, synced) = tokio::sync::watch::channel(0);
        let caches = Caches {
            sandboxes: sandboxes.as_reader(),
            pods: Writer::<Pod>::default().as_reader(),
            services: Writer::<Service>::default().as_reader(),
            claims: Writer::<SandboxClaim>::default().as_reader(),
            pools: Writer::<SandboxWarmPool>::default().as_reader(),
            templates: Writer::<SandboxTemplate>::default().as_reader(),
            policies: Writer::<NetworkPolicy>::default().as_reader(),
            synced,
        };
        sandboxes.apply_watcher_event(&kube::runtime::watcher::Event::InitDone);
        (caches, DetachedWriters { sandboxes })
    }

    /// Waits until every cache has completed its initial list.
    ///
    /// (Not `Store::wait_until_ready`: its readiness signal wakes only the last of several
    /// concurrent waiters, and each controller already waits on its own store.)
    pub async fn wait_until_ready(&self) {
        let mut synced = self.synced.clone();
        // An error means every watch task ended (shutdown); readiness is moot then.
        let _ = synced.wait_for(|count| *count >= KINDS).await;
    }
}

/// The change streams the controllers consume.
#[allow(missing_debug_implementations)] // Boxed streams are not Debug.
pub struct Subscriptions {
    /// For the Sandbox controller.
    pub sandboxes_for_sandbox: Changes<Sandbox>,
    /// For the warm-pool controller (its members).
    pub sandboxes_for_pool: Changes<Sandbox>,
    /// For the claim controller (adopted sandboxes and pool members).
    pub sandboxes_for_claim: Changes<Sandbox>,
    /// For the Sandbox controller.
    pub pods: Changes<Pod>,
    /// For the Sandbox controller.
    pub services: Changes<Service>,
    /// For the claim controller.
    pub claims: Changes<SandboxClaim>,
    /// For the warm-pool controller: a member that a claim adopts stops naming the pool, so the
    /// claim's own change is what tells the pool to refill.
    pub claims_for_pool: Changes<SandboxClaim>,
    /// For the warm-pool controller.
    pub pools_for_pool: Changes<SandboxWarmPool>,
    /// For the claim controller.
    pub pools_for_claim: Changes<SandboxWarmPool>,
    /// For the template controller.
    pub templates_for_template: Changes<SandboxTemplate>,
    /// For the warm-pool controller.
    pub templates_for_pool: Changes<SandboxTemplate>,
    /// For the claim controller.
    pub templates_for_claim: Changes<SandboxTemplate>,
    /// For the template controller.
    pub policies: Changes<NetworkPolicy>,
}

/// The API of `K`, listed and watched one object at a time.
fn api<K>(client: &Client, namespace: Option<&str>) -> Api<Lenient<K>>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// At most this much of a watch error is logged: a decode error of kube's can carry a whole list.
const LOGGED_ERROR_CHARS: usize = 512;

/// How long reporting an undecodable object may hold up its watch.
const REPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// `text` cut to `limit` characters (marked when cut).
fn bounded(text: &str, limit: usize) -> String {
    match text.char_indices().nth(limit) {
        Some((at, _)) => format!("{}… ({} bytes in all)", &text[..at], text.len()),
        None => text.to_owned(),
    }
}

/// `namespace/name` of an object's metadata.
fn meta_key(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default()
    )
}

/// Logs an undecodable object and puts a Warning Event on it.
async fn report<K: Resource<DynamicType = ()>>(recorder: &Recorder, object: &Undecodable) {
    let kind = K::kind(&());
    let key = meta_key(&object.metadata);
    tracing::warn!(
        %kind,
        object = %key,
        error = %bounded(&object.error, LOGGED_ERROR_CHARS),
        "cannot decode this object; ignoring it until it is fixed (the others are reconciled)"
    );
    let reference = ObjectReference {
        api_version: Some(K::api_version(&()).into_owned()),
        kind: Some(kind.clone().into_owned()),
        name: object.metadata.name.clone(),
        namespace: object.metadata.namespace.clone(),
        uid: object.metadata.uid.clone(),
        resource_version: object.metadata.resource_version.clone(),
        ..ObjectReference::default()
    };
    let event = KubeEvent {
        type_: EventType::Warning,
        reason: event_reasons::UNDECODABLE_OBJECT.to_owned(),
        note: Some(bounded(
            &format!(
                "the controller cannot decode {kind} {key} and ignores it until it is fixed: {}",
                object.error
            ),
            1000,
        )),
        action: "Decode".to_owned(),
        secondary: None,
    };
    match tokio::time::timeout(REPORT_TIMEOUT, recorder.publish(&event, &reference)).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => tracing::debug!(%error, object = %key, "failed to publish an Event"),
        Err(_) => tracing::debug!(object = %key, "publishing an Event timed out"),
    }
}

/// Turns a watch event of [`Lenient`] objects into one of decoded objects for the store:
/// undecodable objects are reported (once per resourceVersion, in `reported`) and left out; one
/// that turned undecodable is removed from the store (its last decoded version goes as a delete).
async fn decoded<K>(
    event: watcher::Event<Lenient<K>>,
    store: &Store<K>,
    reported: &mut HashMap<String, Option<String>>,
    recorder: &Recorder,
) -> Option<watcher::Event<K>>
where
    K: Resource<DynamicType = ()> + Clone,
{
    let previous = |meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
        let mut reference = ObjectRef::<K>::new(meta.name.as_deref().unwrap_or_default());
        if let Some(namespace) = &meta.namespace {
            reference = reference.within(namespace);
        }
        store.get(&reference).map(|object| (*object).clone())
    };
    let (undecodable, gone) = match event {
        watcher::Event::Init => return Some(watcher::Event::Init),
        watcher::Event::InitDone => return Some(watcher::Event::InitDone),
        watcher::Event::InitApply(Lenient::Decoded(object)) => {
            reported.remove(&meta_key(object.meta()));
            return Some(watcher::Event::InitApply(object));
        }
        watcher::Event::Apply(Lenient::Decoded(object)) => {
            reported.remove(&meta_key(object.meta()));
            return Some(watcher::Event::Apply(object));
        }
        watcher::Event::Delete(Lenient::Decoded(object)) => {
            reported.remove(&meta_key(object.meta()));
            return Some(watcher::Event::Delete(object));
        }
        watcher::Event::Delete(Lenient::Undecodable(undecodable)) => {
            reported.remove(&meta_key(&undecodable.metadata));
            return previous(&undecodable.metadata).map(watcher::Event::Delete);
        }
        // Left out of the relist, so the store drops it at `InitDone`.
        watcher::Event::InitApply(Lenient::Undecodable(undecodable)) => (undecodable, None),
        watcher::Event::Apply(Lenient::Undecodable(undecodable)) => {
            let gone = previous(&undecodable.metadata);
            (undecodable, gone)
        }
    };
    let version = undecodable.metadata.resource_version.clone();
    if reported.insert(meta_key(&undecodable.metadata), version.clone()) != Some(version) {
        report::<K>(recorder, &undecodable).await;
    }
    gone.map(watcher::Event::Delete)
}

/// What every watch task shares: the readiness count and the Event recorder.
struct Watch {
    synced: std::sync::Arc<tokio::sync::watch::Sender<usize>>,
    recorder: Recorder,
}

/// Starts the watch of one kind as a task of `tasks`: every event updates the store first, then
/// each applied or deleted object goes to each of `consumers`.
///
/// (kube-runtime's shared-store subscriptions hand out object references and look them up in
/// the store; a reference to an object deleted before the lookup stalls that subscription for
/// good. Sending the objects themselves avoids that.)
fn spawn_watch<K, const N: usize>(
    tasks: &mut JoinSet<()>,
    api: Api<Lenient<K>>,
    config: watcher::Config,
    strip: fn(&mut K),
    watch: &Watch,
) -> (Store<K>, [Changes<K>; N])
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let kind = K::kind(&()).into_owned();
    let (reader, mut writer) = kube::runtime::reflector::store::<K>();
    let mut senders = Vec::with_capacity(N);
    let receivers: [Changes<K>; N] = std::array::from_fn(|_| {
        let (sender, receiver) = tokio::sync::mpsc::channel::<K>(CONSUMER_BUFFER);
        senders.push(sender);
        futures::stream::unfold(receiver, |mut receiver| async move {
            receiver.recv().await.map(|object| (Ok(object), receiver))
        })
        .boxed()
    });
    let synced = std::sync::Arc::clone(&watch.synced);
    let recorder = watch.recorder.clone();
    let store = reader.clone();
    tasks.spawn(async move {
        let mut counted = false;
        let mut reported = HashMap::new();
        let mut events = std::pin::pin!(watcher(api, config).default_backoff());
        while let Some(event) = events.next().await {
            let event = match event {
                Ok(event) => decoded(event, &store, &mut reported, &recorder)
                    .await
                    .map(|event| Ok(event.modify(strip))),
                Err(error) => Some(Err(error)),
            };
            let Some(event) = event else { continue };
            if let Ok(event) = &event {
                writer.apply_watcher_event(event);
            }
            let objects = match event {
                Ok(
                    watcher::Event::Apply(object)
                    | watcher::Event::InitApply(object)
                    | watcher::Event::Delete(object),
                ) => {
                    vec![object]
                }
                Ok(watcher::Event::InitDone) => {
                    if !counted {
                        counted = true;
                        synced.send_modify(|count| *count += 1);
                    }
                    continue;
                }
                Ok(watcher::Event::Init) => continue,
                Err(error) => {
                    let error = bounded(&error.to_string(), LOGGED_ERROR_CHARS);
                    tracing::warn!(%kind, %error, "watch failed; retrying with backoff");
                    continue;
                }
            };
            for object in objects {
                for sender in &senders {
                    // A closed receiver means its controller stopped (shutdown).
                    let _ = sender.send(object.clone()).await;
                }
            }
        }
    });
    (reader, receivers)
}

fn strip_managed_fields<K: Resource>(object: &mut K) {
    object.meta_mut().managed_fields = None;
}

fn strip_pod(pod: &mut Pod) {
    pod.metadata.managed_fields = None;
    // The controller reads only the node name of a pod's spec; the status and metadata stay.
    let node_name = pod.spec.as_ref().and_then(|spec| spec.node_name.clone());
    pod.spec = Some(PodSpec {
        node_name,
        ..PodSpec::default()
    });
}

/// An empty store and subscriptions that never yield, for a kind that is not watched.
fn unwatched<K, const N: usize>() -> (Store<K>, [Changes<K>; N])
where
    K: Resource<DynamicType = ()> + Clone + Send + 'static,
{
    let store = kube::runtime::reflector::store::Writer::<K>::default().as_reader();
    let never = || futures::stream::empty().boxed();
    (store, std::array::from_fn(|_| never()))
}

/// Starts every watch (without `extensions`, those of the Sandbox controller only), returning
/// the read handles and the subscriptions.
pub fn start(
    client: &Client,
    namespace: Option<&str>,
    extensions: bool,
    tasks: &mut JoinSet<()>,
) -> (Caches, Subscriptions) {
    let labelled = watcher::Config::default().labels(labels::SANDBOX_NAME_HASH);
    let all = watcher::Config::default();
    // Kinds left unwatched count as synced from the start.
    let unwatched_kinds = if extensions { 0 } else { EXTENSION_KINDS };
    let (synced, synced_rx) = tokio::sync::watch::channel(unwatched_kinds);
    let watch = Watch {
        synced: std::sync::Arc::new(synced),
        recorder: Recorder::new(client.clone(), crate::context::reporter()),
    };

    let (sandboxes, [sb1, sb2, sb3]) = spawn_watch(
        tasks,
        api::<Sandbox>(client, namespace),
        all.clone(),
        strip_managed_fields,
        &watch,
    );
    let (pods, [pods_sub]) = spawn_watch(
        tasks,
        api::<Pod>(client, namespace),
        labelled.clone(),
        strip_pod,
        &watch,
    );
    let (services, [services_sub]) = spawn_watch(
        tasks,
        api::<Service>(client, namespace),
        labelled,
        strip_managed_fields,
        &watch,
    );
    let (claims, [claims_sub, claims_for_pool]) = if extensions {
        spawn_watch(
            tasks,
            api::<SandboxClaim>(client, namespace),
            all.clone(),
            strip_managed_fields,
            &watch,
        )
    } else {
        unwatched()
    };
    let (pools, [pool1, pool2]) = if extensions {
        spawn_watch(
            tasks,
            api::<SandboxWarmPool>(client, namespace),
            all.clone(),
            strip_managed_fields,
            &watch,
        )
    } else {
        unwatched()
    };
    let (templates, [t1, t2, t3]) = if extensions {
        spawn_watch(
            tasks,
            api::<SandboxTemplate>(client, namespace),
            all.clone(),
            strip_managed_fields,
            &watch,
        )
    } else {
        unwatched()
    };
    let (policies, [policies_sub]) = if extensions {
        spawn_watch(
            tasks,
            api::<NetworkPolicy>(client, namespace),
            all,
            strip_managed_fields,
            &watch,
        )
    } else {
        unwatched()
    };

    (
        Caches {
            sandboxes,
            pods,
            services,
            claims,
            pools,
            templates,
            policies,
            synced: synced_rx,
        },
        Subscriptions {
            sandboxes_for_sandbox: sb1,
            sandboxes_for_pool: sb2,
            sandboxes_for_claim: sb3,
            pods: pods_sub,
            services: services_sub,
            claims: claims_sub,
            claims_for_pool,
            pools_for_pool: pool1,
            pools_for_claim: pool2,
            templates_for_template: t1,
            templates_for_pool: t2,
            templates_for_claim: t3,
            policies: policies_sub,
        },
    )
}
