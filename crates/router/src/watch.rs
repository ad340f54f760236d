//! Feeds the [`Index`](crate::Index) from the cluster: one kube-rs watcher for Sandboxes and one
//! for Pods carrying the `agents.x-k8s.io/sandbox-name-hash` label (selected server-side, so
//! the router never holds other pods). A complete list replaces the index's objects of that kind
//! (`reset`, which also marks them synced); later events apply or delete one object. Watch
//! errors are logged and retried with kube-runtime's default backoff.
//!
//! When the service account may not read Sandboxes (403, as under upstream's router RBAC, which
//! grants pods only) or the Sandbox CRD is missing (404), the index routes from pods alone
//! ([`Index::set_pods_only`]), said once in a warning; the Sandbox watch keeps retrying, and its
//! first complete list restores the full checks. When pods cannot be read, nothing can be
//! routed: that is said once too, with the permission to grant.
use std::fmt::Debug;

use agent_sandbox_api::{Sandbox, labels};
use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt as _, watcher as watch_stream};
use kube::{Api, Client, Resource, ResourceExt as _};
use serde::de::DeserializeOwned;

use crate::index::{self, Index, PodEntry, SandboxEntry, SharedIndex};

/// A kind the index holds summaries of.
trait Indexed: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + 'static {
    type Entry: Send;
    const KIND: &'static str;
    fn summary(&self) -> Option<(String, String, Self::Entry)>;
    fn insert(index: &mut Index, namespace: String, name: String, entry: Self::Entry);
    fn reset(index: &mut Index, entries: Vec<(String, String, Self::Entry)>);
    fn delete(index: &mut Index, namespace: &str, name: &str);
    /// The API answered `code` (403 or 404) to the list or watch: the warning to log once, after
    /// adapting the index.
    fn denied(index: &mut Index, code: u16) -> String;
}

impl Indexed for Sandbox {
    type Entry = SandboxEntry;
    const KIND: &'static str = agent_sandbox_api::kinds::SANDBOX;
    fn summary(&self) -> Option<(String, String, SandboxEntry)> {
        index::sandbox_entry(self)
    }
    fn insert(index: &mut Index, namespace: String, name: String, entry: SandboxEntry) {
        index.insert_sandbox(namespace, name, entry);
    }
    fn reset(index: &mut Index, entries: Vec<(String, String, SandboxEntry)>) {
        index.reset_sandbox_entries(entries);
    }
    fn delete(index: &mut Index, namespace: &str, name: &str) {
        index.delete_sandbox(namespace, name);
    }
    fn denied(index: &mut Index, code: u16) -> String {
        index.set_pods_only(true);
        let why = if code == 404 {
            "the Sandbox CRD (sandboxes.agents.x-k8s.io) is not installed (404)"
        } else {
            "this service account may not list/watch sandboxes.agents.x-k8s.io (403 Forbidden, \
             as under upstream's router RBAC, which grants pods only)"
        };
        format!(
            "routing from pods alone: {why}; a sandbox is routable when its Ready pod is \
             controlled by a Sandbox of that name (the Sandbox's own Ready condition and pod-name \
             annotation are not seen). Grant get/list/watch on sandboxes for the full checks; \
             the router picks them up without a restart"
        )
    }
}

impl Indexed for Pod {
    type Entry = PodEntry;
    const KIND: &'static str = "Pod";
    fn summary(&self) -> Option<(String, String, PodEntry)> {
        index::pod_entry(self)
    }
    fn insert(index: &mut Index, namespace: String, name: String, entry: PodEntry) {
        index.insert_pod(namespace, name, entry);
    }
    fn reset(index: &mut Index, entries: Vec<(String, String, PodEntry)>) {
        index.reset_pod_entries(entries);
    }
    fn delete(index: &mut Index, namespace: &str, name: &str) {
        index.delete_pod(namespace, name);
    }
    fn denied(_index: &mut Index, code: u16) -> String {
        format!(
            "cannot list/watch pods ({code}): no sandbox can be routed until this service account \
             may get/list/watch pods (upstream's router ClusterRole or ours, \
             deploy/base/router/rbac.yaml); retrying"
        )
    }
}

/// The HTTP status of an API refusal that retrying will not fix by itself (403, 404).
fn denial(error: &watcher::Error) -> Option<u16> {
    let status = match error {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status))
        | watcher::Error::WatchError(status) => status,
        _ => return None,
    };
    (status.is_forbidden() || status.is_not_found()).then_some(status.code)
}

fn api<K>(client: Client, namespace: Option<&str>) -> Api<K>
where
    K: Indexed + Resource<Scope = k8s_openapi::NamespaceResourceScope>,
{
    match namespace {
        Some(namespace) => Api::namespaced(client, namespace),
        None => Api::all(client),
    }
}

async fn feed<K: Indexed>(api: Api<K>, config: watcher::Config, index: SharedIndex) {
    let stream = watch_stream(api, config).default_backoff();
    futures_util::pin_mut!(stream);
    let mut listed = Vec::new();
    // The denial last reported, so that a retried refusal is logged once, not per retry.
    let mut denied: Option<u16> = None;
    while let Some(event) = stream.next().await {
        match event {
            Ok(Event::Init) => listed.clear(),
            Ok(Event::InitApply(object)) => listed.extend(object.summary()),
            Ok(Event::InitDone) => {
                let count = listed.len();
                K::reset(&mut index.write(), std::mem::take(&mut listed));
                if denied.take().is_some() {
                    tracing::warn!(kind = K::KIND, count, "listed again: access restored");
                } else {
                    tracing::info!(kind = K::KIND, count, "listed");
                }
            }
            Ok(Event::Apply(object)) => {
                if let Some((namespace, name, entry)) = object.summary() {
                    K::insert(&mut index.write(), namespace, name, entry);
                }
            }
            Ok(Event::Delete(object)) => {
                if let Some(namespace) = object.namespace() {
                    K::delete(&mut index.write(), &namespace, &object.name_any());
                }
            }
            Err(error) => match denial(&error) {
                Some(code) if denied != Some(code) => {
                    denied = Some(code);
                    let message = K::denied(&mut index.write(), code);
                    tracing::warn!(kind = K::KIND, %error, "{message}");
                }
                Some(_) => {
                    tracing::debug!(kind = K::KIND, %error, "still refused; retrying with backoff");
                }
                None => {
                    tracing::warn!(kind = K::KIND, %error, "watch failed; retrying with backoff");
                }
            },
        }
    }
}

/// Watches Sandboxes and their Pods (in `namespace`, or all namespaces) and keeps `index` up to
/// date. Runs until the task is dropped or aborted.
pub async fn watch(client: Client, index: SharedIndex, namespace: Option<String>) {
    let sandboxes: Api<Sandbox> = api(client.clone(), namespace.as_deref());
    let pods: Api<Pod> = api(client, namespace.as_deref());
    tokio::join!(
        feed(sandboxes, watcher::Config::default(), index.clone()),
        feed(
            pods,
            watcher::Config::default().labels(labels::SANDBOX_NAME_HASH),
            index
        ),
    );
}
