//! Keeps [`Context::policies`] in step with the cluster's NetworkPolicies and Namespaces
//! (watches of both), and the pods' rules with them: the IO half of [`crate::netpol`].

use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::Api;
use kube::runtime::watcher::{self, Event};

use crate::kubelet::Context;
use crate::netpol::namespace_labels;

/// How often every pod's rules are recomputed regardless of events.
const RESYNC: Duration = Duration::from_secs(5);

fn key(policy: &NetworkPolicy) -> (String, String) {
    (
        policy.metadata.namespace.clone().unwrap_or_default(),
        policy.metadata.name.clone().unwrap_or_default(),
    )
}

/// Watches until the kubelet stops; every change re-applies every pod's rules.
pub(crate) async fn watch(ctx: Arc<Context>) {
    let policies = watcher::watcher(
        Api::<NetworkPolicy>::all(ctx.client.clone()),
        watcher::Config::default(),
    )
    .map(|event| event.map(Change::Policy));
    let namespaces = watcher::watcher(
        Api::<Namespace>::all(ctx.client.clone()),
        watcher::Config::default(),
    )
    .map(|event| event.map(Change::Namespace));
    let mut changes = std::pin::pin!(futures::stream::select(policies, namespaces));
    let mut known: BTreeMap<(String, String), NetworkPolicy> = BTreeMap::new();
    let mut pending: BTreeMap<(String, String), NetworkPolicy> = BTreeMap::new();
    let mut labels: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut pending_labels: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    // Every few seconds the rules are brought in line again from scratch, whatever was missed
    // (cheap: a pod whose rules did not change is not touched).
    let mut resync = tokio::time::interval(RESYNC);
    resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let change = tokio::select! {
            change = changes.next() => match change {
                Some(change) => change,
                None => return,
            },
            _ = resync.tick() => {
                let ctx = ctx.clone();
                let _ = tokio::task::spawn_blocking(move || ctx.apply_policies()).await;
                continue;
            }
        };
        let publish = match change {
            Ok(Change::Policy(event)) => match event {
                Event::Apply(policy) => {
                    known.insert(key(&policy), policy);
                    true
                }
                Event::InitApply(policy) => {
                    pending.insert(key(&policy), policy);
                    false
                }
                Event::Delete(policy) => {
                    known.remove(&key(&policy));
                    true
                }
                Event::Init => {
                    pending.clear();
                    false
                }
                Event::InitDone => {
                    known = std::mem::take(&mut pending);
                    true
                }
            },
            Ok(Change::Namespace(event)) => match event {
                Event::Apply(namespace) => {
                    let name = namespace.metadata.name.clone().unwrap_or_default();
                    let value = namespace_labels(&name, namespace.metadata.labels.as_ref());
                    labels.insert(name, value);
                    true
                }
                Event::InitApply(namespace) => {
                    let name = namespace.metadata.name.clone().unwrap_or_default();
                    let value = namespace_labels(&name, namespace.metadata.labels.as_ref());
                    pending_labels.insert(name, value);
                    false
                }
                Event::Delete(namespace) => {
                    labels.remove(&namespace.metadata.name.clone().unwrap_or_default());
                    true
                }
                Event::Init => {
                    pending_labels.clear();
                    false
                }
                Event::InitDone => {
                    labels = std::mem::take(&mut pending_labels);
                    true
                }
            },
            Err(error) => {
                tracing::debug!(%error, "watching NetworkPolicies or Namespaces");
                tokio::time::sleep(Duration::from_millis(200)).await;
                false
            }
        };
        if publish {
            {
                let mut cluster = ctx.policies.lock().unwrap_or_else(PoisonError::into_inner);
                cluster.policies = known.values().cloned().collect();
                cluster.namespaces.clone_from(&labels);
            }
            let ctx = ctx.clone();
            // nft runs as a process: off the runtime's threads.
            let _ = tokio::task::spawn_blocking(move || ctx.apply_policies()).await;
        }
    }
}

enum Change {
    Policy(Event<NetworkPolicy>),
    Namespace(Event<Namespace>),
}
