//! The shared caches: one watch per kind, reflected into a store that every reconciler reads,
//! with a subscription per controller that consumes the kind's changes.
//!
//! One watch per kind (not one per controller) keeps memory at one copy of each object: the
//! Sandbox cache is read by three reconcilers. Fields no reconciler reads (`managedFields`, most
//! of a Pod's spec) are stripped before objects are stored.

use std::fmt::Debug;

use agent_sandbox_api::Sandbox;
use agent_sandbox_api::{SandboxClaim, SandboxTemplate, SandboxWarmPool, labels};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, PodSpec, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{ReflectHandle, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::task::JoinSet;

/// How many changes a slow subscriber may lag behind before the watch waits for it.
const SUBSCRIBER_BUFFER: usize = 4096;

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
    /// Waits until every cache has completed its initial list.
    pub async fn wait_until_ready(&self) {
        // A dropped writer means the watch task ended (shutdown); readiness is moot then.
        let _ = futures::join!(
            self.sandboxes.wait_until_ready(),
            self.pods.wait_until_ready(),
            self.services.wait_until_ready(),
            self.claims.wait_until_ready(),
            self.pools.wait_until_ready(),
            self.templates.wait_until_ready(),
            self.policies.wait_until_ready(),
        );
    }
}

/// The change streams the controllers consume.
#[allow(missing_debug_implementations)] // ReflectHandle is not Debug.
pub struct Subscriptions {
    /// For the Sandbox controller.
    pub sandboxes_for_sandbox: ReflectHandle<Sandbox>,
    /// For the warm-pool controller (its members).
    pub sandboxes_for_pool: ReflectHandle<Sandbox>,
    /// For the claim controller (adopted sandboxes and pool members).
    pub sandboxes_for_claim: ReflectHandle<Sandbox>,
    /// For the Sandbox controller.
    pub pods: ReflectHandle<Pod>,
    /// For the Sandbox controller.
    pub services: ReflectHandle<Service>,
    /// For the claim controller.
    pub claims: ReflectHandle<SandboxClaim>,
    /// For the warm-pool controller.
    pub pools_for_pool: ReflectHandle<SandboxWarmPool>,
    /// For the claim controller.
    pub pools_for_claim: ReflectHandle<SandboxWarmPool>,
    /// For the template controller.
    pub templates_for_template: ReflectHandle<SandboxTemplate>,
    /// For the warm-pool controller.
    pub templates_for_pool: ReflectHandle<SandboxTemplate>,
    /// For the claim controller.
    pub templates_for_claim: ReflectHandle<SandboxTemplate>,
    /// For the template controller.
    pub policies: ReflectHandle<NetworkPolicy>,
}

fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Starts the watch of one kind into `writer`, as a task of `tasks`.
fn spawn_watch<K>(
    tasks: &mut JoinSet<()>,
    api: Api<K>,
    config: watcher::Config,
    writer: Writer<K>,
    strip: fn(&mut K),
) where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let kind = K::kind(&()).into_owned();
    tasks.spawn(async move {
        watcher(api, config)
            .default_backoff()
            .modify(strip)
            .reflect_shared(writer)
            .for_each(|event| {
                if let Err(error) = event {
                    tracing::warn!(%kind, %error, "watch failed; retrying with backoff");
                }
                futures::future::ready(())
            })
            .await;
    });
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

macro_rules! shared {
    ($kind:ty, $n:literal) => {{
        let (reader, writer) = kube::runtime::reflector::store_shared::<$kind>(SUBSCRIBER_BUFFER);
        let handles: [ReflectHandle<$kind>; $n] = std::array::from_fn(|_| {
            writer
                .subscribe()
                .expect("a shared store always has a dispatcher")
        });
        (reader, writer, handles)
    }};
}

/// Starts every watch, returning the read handles and the subscriptions.
#[allow(clippy::expect_used)] // `subscribe` on a store made by `store_shared` cannot fail.
pub fn start(
    client: &Client,
    namespace: Option<&str>,
    tasks: &mut JoinSet<()>,
) -> (Caches, Subscriptions) {
    let labelled = watcher::Config::default().labels(labels::SANDBOX_NAME_HASH);
    let all = watcher::Config::default();

    let (sandboxes, sandbox_writer, [sb1, sb2, sb3]) = shared!(Sandbox, 3);
    spawn_watch(
        tasks,
        api::<Sandbox>(client, namespace),
        all.clone(),
        sandbox_writer,
        strip_managed_fields,
    );
    let (pods, pod_writer, [pods_sub]) = shared!(Pod, 1);
    spawn_watch(
        tasks,
        api::<Pod>(client, namespace),
        labelled.clone(),
        pod_writer,
        strip_pod,
    );
    let (services, service_writer, [services_sub]) = shared!(Service, 1);
    spawn_watch(
        tasks,
        api::<Service>(client, namespace),
        labelled,
        service_writer,
        strip_managed_fields,
    );
    let (claims, claim_writer, [claims_sub]) = shared!(SandboxClaim, 1);
    spawn_watch(
        tasks,
        api::<SandboxClaim>(client, namespace),
        all.clone(),
        claim_writer,
        strip_managed_fields,
    );
    let (pools, pool_writer, [pool1, pool2]) = shared!(SandboxWarmPool, 2);
    spawn_watch(
        tasks,
        api::<SandboxWarmPool>(client, namespace),
        all.clone(),
        pool_writer,
        strip_managed_fields,
    );
    let (templates, template_writer, [t1, t2, t3]) = shared!(SandboxTemplate, 3);
    spawn_watch(
        tasks,
        api::<SandboxTemplate>(client, namespace),
        all.clone(),
        template_writer,
        strip_managed_fields,
    );
    let (policies, policy_writer, [policies_sub]) = shared!(NetworkPolicy, 1);
    spawn_watch(
        tasks,
        api::<NetworkPolicy>(client, namespace),
        all,
        policy_writer,
        strip_managed_fields,
    );

    (
        Caches {
            sandboxes,
            pods,
            services,
            claims,
            pools,
            templates,
            policies,
        },
        Subscriptions {
            sandboxes_for_sandbox: sb1,
            sandboxes_for_pool: sb2,
            sandboxes_for_claim: sb3,
            pods: pods_sub,
            services: services_sub,
            claims: claims_sub,
            pools_for_pool: pool1,
            pools_for_claim: pool2,
            templates_for_template: t1,
            templates_for_pool: t2,
            templates_for_claim: t3,
            policies: policies_sub,
        },
    )
}
