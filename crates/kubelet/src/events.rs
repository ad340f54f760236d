//! Events about pods: the core `v1` Event a node component records ([`pod_event`], sans IO,
//! also used by the sim's scheduler for its `Scheduled` Event), and the kubelet's [`Recorder`],
//! which posts them through the API in the order they were recorded without holding up the pod
//! workers.

use k8s_openapi::api::core::v1::Event;
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};
use tokio::sync::mpsc;

/// A strictly increasing nanosecond timestamp for event names.
fn event_stamp() -> u128 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    let previous = LAST.fetch_max(now, Ordering::SeqCst);
    let stamp = if previous >= now {
        LAST.fetch_add(1, Ordering::SeqCst) + 1
    } else {
        now
    };
    u128::from(stamp)
}

fn text<'a>(object: &'a Value, pointer: &str) -> &'a str {
    object
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// What an Event says.
#[derive(Clone, Copy, Debug)]
pub struct EventNote<'a> {
    /// `Normal` or `Warning`.
    pub type_: &'a str,
    /// The machine-readable reason (`Started`, `Failed`, ...).
    pub reason: &'a str,
    /// The human-readable message.
    pub message: &'a str,
}

/// The core Event `component` on `host` records about `pod` (a Pod as JSON), named like the
/// kubelet's: the pod's name and a timestamp, so that names sort by time.
pub fn pod_event(pod: &Value, component: &str, host: &str, note: EventNote<'_>) -> Value {
    let now = agent_sandbox_api::time::format(k8s_openapi::jiff::Timestamp::now());
    let name = text(pod, "/metadata/name");
    let namespace = text(pod, "/metadata/namespace");
    json!({
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": format!("{name}.{:x}", event_stamp()),
            "namespace": namespace,
        },
        "involvedObject": {
            "apiVersion": "v1", "kind": "Pod", "name": name,
            "namespace": namespace, "uid": text(pod, "/metadata/uid"),
            "resourceVersion": text(pod, "/metadata/resourceVersion"),
        },
        "reason": note.reason,
        "message": note.message,
        "type": note.type_,
        "source": {"component": component, "host": host},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
        "reportingComponent": component,
        "reportingInstance": host,
    })
}

/// Records the kubelet's Events: [`Recorder::pod`] queues one, [`post`] writes them.
#[derive(Clone, Debug)]
pub(crate) struct Recorder {
    node: String,
    events_tx: mpsc::UnboundedSender<Value>,
}

impl Recorder {
    /// A recorder for `node` and the receiver [`post`] drains.
    pub(crate) fn new(node: &str) -> (Self, mpsc::UnboundedReceiver<Value>) {
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        (
            Self {
                node: node.to_owned(),
                events_tx,
            },
            events_rx,
        )
    }

    /// Queues an Event about `pod` from the kubelet.
    pub(crate) fn pod(&self, pod: &Value, note: EventNote<'_>) {
        let _ = self
            .events_tx
            .send(pod_event(pod, "kubelet", &self.node, note));
    }
}

/// Posts queued Events until every [`Recorder`] is gone. Events are best effort, as a real
/// kubelet's: one that cannot be written is logged and dropped.
pub(crate) async fn post(client: kube::Client, mut events_rx: mpsc::UnboundedReceiver<Value>) {
    while let Some(event) = events_rx.recv().await {
        let namespace = text(&event, "/metadata/namespace").to_owned();
        let name = text(&event, "/metadata/name").to_owned();
        let typed: Event = match serde_json::from_value(event) {
            Ok(typed) => typed,
            Err(error) => {
                tracing::debug!(%error, %namespace, %name, "encoding an Event failed");
                continue;
            }
        };
        let api: Api<Event> = Api::namespaced(client.clone(), &namespace);
        if let Err(error) = api.create(&PostParams::default(), &typed).await {
            tracing::debug!(%error, %namespace, %name, "recording an Event failed");
        }
    }
}
