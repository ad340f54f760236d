//! The scheduler: binds every unscheduled pod to the sim's one node (setting `spec.nodeName`
//! and the `PodScheduled` condition, recording a `Scheduled` Event), after which the node's
//! kubelet sees it through its watch. It writes to the store directly, as the sim's other
//! controllers do.

use std::sync::Arc;

use agent_sandbox_kubelet::events::{EventNote, pod_event};
use serde_json::{Value, json};
use tokio::sync::broadcast::{self, error::RecvError};

use crate::meta;
use crate::ops::ApiObjects;
use crate::resources::StorageKey;
use crate::store::{Change, EventType};

fn pods_key() -> StorageKey {
    StorageKey::new("", "pods")
}

fn is_bound(pod: &Value) -> bool {
    pod.pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .is_some_and(|n| !n.is_empty())
}

/// Binds pods to `node`.
#[derive(Debug)]
pub(crate) struct Scheduler {
    objects: Arc<ApiObjects>,
    node: String,
}

impl Scheduler {
    pub(crate) fn new(objects: Arc<ApiObjects>, node: &str) -> Self {
        Self {
            objects,
            node: node.to_owned(),
        }
    }

    /// Binds `pod` unless it is bound already or being deleted.
    fn bind(&self, pod: &Value) {
        if is_bound(pod) || meta::is_deleting(pod) {
            return;
        }
        let now = meta::now();
        let node = self.node.clone();
        let bound = self.objects.mutate(
            &pods_key(),
            meta::namespace(pod),
            meta::name(pod),
            |object| {
                if is_bound(object) {
                    return false;
                }
                if let Some(spec) = object.get_mut("spec").and_then(Value::as_object_mut) {
                    spec.insert("nodeName".into(), json!(node));
                }
                let status = object
                    .as_object_mut()
                    .map(|map| map.entry("status").or_insert_with(|| json!({})));
                if let Some(Value::Object(status)) = status {
                    let conditions = status.entry("conditions").or_insert_with(|| json!([]));
                    if let Some(list) = conditions.as_array_mut() {
                        list.retain(|c| {
                            c.get("type").and_then(Value::as_str) != Some("PodScheduled")
                        });
                        list.push(json!({"type": "PodScheduled", "status": "True",
                                         "lastProbeTime": null, "lastTransitionTime": now}));
                    }
                }
                true
            },
        );
        let Some(bound) = bound else {
            return;
        };
        let message = format!(
            "Successfully assigned {}/{} to {}",
            meta::namespace(&bound),
            meta::name(&bound),
            self.node
        );
        let event = pod_event(
            &bound,
            "default-scheduler",
            &self.node,
            EventNote {
                type_: "Normal",
                reason: "Scheduled",
                message: &message,
            },
        );
        let created = self
            .objects
            .builtin("", "events")
            .and_then(|info| self.objects.create_internal(&info, event));
        if let Err(error) = created {
            tracing::debug!(%error, "recording the Scheduled event failed");
        }
    }

    fn resync(&self) {
        let (pods, _) = self.objects.store.list(&pods_key(), None);
        for pod in pods {
            self.bind(&pod);
        }
    }

    /// Runs until the change channel closes.
    pub(crate) async fn run(self, mut changes: broadcast::Receiver<Arc<Change>>) {
        self.resync();
        loop {
            match changes.recv().await {
                Ok(change)
                    if change.key == pods_key()
                        && matches!(change.kind, EventType::Added | EventType::Modified) =>
                {
                    self.bind(&change.object);
                }
                Ok(_) => {}
                Err(RecvError::Lagged(_)) => self.resync(),
                Err(RecvError::Closed) => return,
            }
        }
    }
}
