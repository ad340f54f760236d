//! The kubelet against an API server it knows only through a `kube::Client` (the sim's, which
//! runs a kubelet of its own as `sim-node`; these tests add a second node): Node registration
//! and the heartbeat Lease, the Node's Ready condition, `pods/status` patches, logs, Events and
//! deletion confirmation, and that a node runs only the pods bound to it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::time::Duration;

use agent_sandbox_kubelet::{Isolation, Kubelet, KubeletConfig, LogOptions, PodKey};
use agent_sandbox_sim::{Sim, SimConfig};
use futures::StreamExt as _;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::{Condition, await_condition};
use kube::{Resource as _, ResourceExt as _};
use pretty_assertions::assert_eq;
use serde_json::json;

const NODE: &str = "node-a";

/// A bound for waits (not a speed assertion).
const PATIENCE: Duration = Duration::from_secs(30);

struct Cluster {
    sim: Sim,
    kubelet: Kubelet,
    _data: tempfile::TempDir,
}

/// A sim and a second node, `node-a`, with a fast heartbeat and status report.
async fn cluster() -> Cluster {
    let sim = Sim::start(SimConfig::default().isolation(Isolation::None))
        .await
        .unwrap();
    let data = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::new(
        sim.client().unwrap(),
        KubeletConfig {
            isolation: Isolation::None,
            heartbeat_interval: Duration::from_millis(50),
            node_status_interval: Duration::from_millis(200),
            kubelet_port: Some(10250),
            ..KubeletConfig::new(NODE, data.path())
        },
    )
    .unwrap();
    kubelet.start().await.unwrap();
    Cluster {
        sim,
        kubelet,
        _data: data,
    }
}

impl Cluster {
    async fn stop(self) {
        self.kubelet.stop().await;
        self.sim.stop().await;
    }
}

async fn wait_for<K>(api: &Api<K>, name: &str, what: &str, condition: impl Condition<K>) -> K
where
    K: kube::Resource
        + Clone
        + std::fmt::Debug
        + Send
        + k8s_openapi::serde::de::DeserializeOwned
        + 'static,
{
    tokio::time::timeout(PATIENCE, await_condition(api.clone(), name, condition))
        .await
        .unwrap_or_else(|_| panic!("gave up waiting for {what}"))
        .unwrap()
        .unwrap_or_else(|| panic!("{name} is gone while waiting for {what}"))
}

async fn wait_gone(api: &Api<Pod>, pod: &Pod) {
    let uid = pod.uid().unwrap();
    let condition = kube::runtime::conditions::is_deleted(&uid);
    tokio::time::timeout(
        PATIENCE,
        await_condition(api.clone(), &pod.name_any(), condition),
    )
    .await
    .unwrap_or_else(|_| panic!("gave up waiting for {} to be gone", pod.name_any()))
    .unwrap();
}

/// A pod bound to `node` (as the scheduler would have) running `script` in busybox.
fn pod(name: &str, node: &str, script: &str, restart: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"nodeName": node, "restartPolicy": restart, "terminationGracePeriodSeconds": 5,
                 "containers": [{"name": "main", "image": "busybox:1.36",
                                 "command": ["sh", "-c", script]}]}
    }))
    .unwrap()
}

fn is_ready(pod: Option<&Pod>) -> bool {
    pod.and_then(|p| p.status.as_ref())
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|list| {
            list.iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
}

#[tokio::test]
async fn the_kubelet_registers_its_node_and_renews_its_lease() {
    let cluster = cluster().await;
    let client = cluster.sim.client().unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    let node = nodes.get(NODE).await.unwrap();
    assert_eq!(node.labels()["kubernetes.io/hostname"], NODE);
    // Go's architecture names, as node selectors use them.
    #[cfg(target_arch = "x86_64")]
    assert_eq!(node.labels()["kubernetes.io/arch"], "amd64");
    // No label NodeRestriction forbids a kubelet to set on its own Node.
    assert!(
        node.labels()
            .keys()
            .all(|key| !key.starts_with("node-role.kubernetes.io/")),
        "{:?}",
        node.labels()
    );
    let status = node.status.clone().unwrap();
    let quantity = |map: &Option<BTreeMap<String, Quantity>>, key: &str| {
        map.as_ref().and_then(|m| m.get(key)).map(|q| q.0.clone())
    };
    assert_eq!(quantity(&status.capacity, "pods").as_deref(), Some("1000"));
    assert_eq!(quantity(&status.allocatable, "cpu").as_deref(), Some("2"));
    let addresses: Vec<(String, String)> = status
        .addresses
        .unwrap()
        .into_iter()
        .map(|a| (a.type_, a.address))
        .collect();
    assert_eq!(
        addresses,
        vec![
            ("InternalIP".to_owned(), "127.0.0.1".to_owned()),
            ("Hostname".to_owned(), NODE.to_owned())
        ]
    );
    let ready = status
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_deref()),
        ("True", Some("KubeletReady"))
    );
    assert_eq!(
        status
            .daemon_endpoints
            .unwrap()
            .kubelet_endpoint
            .unwrap()
            .port,
        10250
    );

    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let lease = leases.get(NODE).await.unwrap();
    let spec = lease.spec.clone().unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some(NODE));
    assert_eq!(spec.lease_duration_seconds, Some(40));
    let owner = &lease.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), Some(&owner.uid)),
        ("Node", NODE, node.meta().uid.as_ref())
    );
    // The heartbeat: the Lease is renewed, and the Ready condition reported again.
    let first = spec.renew_time.unwrap().0;
    wait_for(
        &leases,
        NODE,
        "the Lease to be renewed",
        move |lease: Option<&Lease>| {
            lease
                .and_then(|l| l.spec.as_ref())
                .and_then(|s| s.renew_time.as_ref())
                .is_some_and(|t| t.0 > first)
        },
    )
    .await;
    let heartbeat = ready.last_heartbeat_time.unwrap().0;
    let transition = ready.last_transition_time.unwrap().0;
    let reported = wait_for(
        &nodes,
        NODE,
        "Ready to be reported again",
        move |node: Option<&Node>| {
            node.and_then(|n| n.status.as_ref())
                .and_then(|s| s.conditions.as_ref())
                .into_iter()
                .flatten()
                .any(|c| {
                    c.type_ == "Ready"
                        && c.last_heartbeat_time
                            .as_ref()
                            .is_some_and(|t| t.0 > heartbeat)
                })
        },
    )
    .await;
    let ready = reported
        .status
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(ready.status, "True");
    assert_eq!(ready.last_transition_time.unwrap().0, transition);

    // The sim's own node is registered by the same kubelet.
    assert!(leases.get("sim-node").await.is_ok());
    cluster.stop().await;
}

#[tokio::test]
async fn the_kubelet_runs_its_pods_and_patches_their_status() {
    let cluster = cluster().await;
    let client = cluster.sim.client().unwrap();
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    pods.create(
        &PostParams::default(),
        &pod("runs", NODE, "echo hello; exec sleep 300", "Always"),
    )
    .await
    .unwrap();
    let ready = wait_for(&pods, "runs", "the pod to be Ready", is_ready).await;
    let status = ready.status.clone().unwrap();
    assert_eq!(status.phase.as_deref(), Some("Running"));
    let ip = status.pod_ip.clone().unwrap();
    assert!(ip.starts_with("127.") && ip != "127.0.0.1", "{ip}");
    let ips: Vec<String> = status.pod_ips.unwrap().into_iter().map(|i| i.ip).collect();
    assert_eq!(ips, vec![ip]);
    let mut conditions: Vec<(String, String)> = status
        .conditions
        .unwrap()
        .into_iter()
        .map(|c| (c.type_, c.status))
        .collect();
    conditions.sort();
    let expected: Vec<(String, String)> = [
        "ContainersReady",
        "Initialized",
        "PodReadyToStartContainers",
        "PodScheduled",
        "Ready",
    ]
    .iter()
    .map(|t| ((*t).to_owned(), "True".to_owned()))
    .collect();
    assert_eq!(conditions, expected);
    let container = &status.container_statuses.unwrap()[0];
    assert_eq!(
        (
            container.name.as_str(),
            container.ready,
            container.restart_count,
            container.started
        ),
        ("main", true, 0, Some(true))
    );
    assert!(container.state.as_ref().unwrap().running.is_some());
    // Run by its own node only.
    assert_eq!(cluster.kubelet.live_process_groups(), 1);
    assert_eq!(cluster.sim.live_process_groups(), 0);

    let key = PodKey {
        namespace: "default".to_owned(),
        name: "runs".to_owned(),
        uid: ready.uid().unwrap(),
    };
    // Ready means started (no probe), not that the echo has run yet: look until it has.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let log = loop {
        let log: Vec<bytes::Bytes> = cluster
            .kubelet
            .logs(&key, "main", &LogOptions::default())
            .await
            .unwrap()
            .collect()
            .await;
        let log = log.concat();
        if !log.is_empty() || tokio::time::Instant::now() > deadline {
            break log;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(log, b"hello\n");

    // A crashing container: restarts counted, the last state kept.
    pods.create(
        &PostParams::default(),
        &pod("crashes", NODE, "exit 3", "OnFailure"),
    )
    .await
    .unwrap();
    let crashed = wait_for(&pods, "crashes", "a restart", |pod: Option<&Pod>| {
        pod.and_then(|p| p.status.as_ref())
            .and_then(|s| s.container_statuses.as_ref())
            .is_some_and(|c| c.first().is_some_and(|c| c.restart_count >= 1))
    })
    .await;
    let container = &crashed.status.unwrap().container_statuses.unwrap()[0];
    assert_eq!(
        container
            .last_state
            .as_ref()
            .unwrap()
            .terminated
            .as_ref()
            .unwrap()
            .exit_code,
        3
    );
    assert!(!container.ready);

    let events: Api<Event> = Api::default_namespaced(client);
    let reasons = |uid: String| {
        let events = events.clone();
        async move {
            let list = events.list(&ListParams::default()).await.unwrap();
            let mut reasons: Vec<String> = list
                .items
                .into_iter()
                .filter(|e| e.involved_object.uid.as_deref() == Some(uid.as_str()))
                .filter(|e| e.source.as_ref().and_then(|s| s.host.as_deref()) == Some(NODE))
                .filter_map(|e| e.reason)
                .collect();
            reasons.sort();
            reasons
        }
    };
    // Events are posted after the status; the pod is Ready, so wait for them to arrive.
    let uid = ready.uid().unwrap();
    let mut seen = Vec::new();
    for _ in 0..1500 {
        seen = reasons(uid.clone()).await;
        if seen.len() >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(seen, vec!["Created", "Pulled", "Started"]);
    cluster.stop().await;
}

#[tokio::test]
async fn the_kubelet_confirms_a_deletion_once_the_processes_are_gone() {
    let cluster = cluster().await;
    let pods: Api<Pod> = Api::default_namespaced(cluster.sim.client().unwrap());
    let mut held = pod("held", NODE, "exec sleep 300", "Always");
    held.metadata.finalizers = Some(vec!["example.com/hold".to_owned()]);
    pods.create(&PostParams::default(), &held).await.unwrap();
    let ready = wait_for(&pods, "held", "the pod to be Ready", is_ready).await;
    assert_eq!(cluster.kubelet.live_process_groups(), 1);

    pods.delete("held", &DeleteParams::default()).await.unwrap();
    // Confirmed: grace period zero; the finalizer keeps the object.
    let confirmed = wait_for(
        &pods,
        "held",
        "the deletion to be confirmed",
        |pod: Option<&Pod>| {
            pod.is_some_and(|p| p.metadata.deletion_grace_period_seconds == Some(0))
        },
    )
    .await;
    assert_eq!(confirmed.uid(), ready.uid());
    assert_eq!(cluster.kubelet.live_process_groups(), 0);
    let container = &confirmed.status.unwrap().container_statuses.unwrap()[0];
    assert!(container.state.as_ref().unwrap().terminated.is_some());

    pods.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    wait_gone(&pods, &ready).await;

    // Without a finalizer the confirmation removes the pod.
    pods.create(
        &PostParams::default(),
        &pod("plain", NODE, "exec sleep 300", "Always"),
    )
    .await
    .unwrap();
    let plain = wait_for(&pods, "plain", "the pod to be Ready", is_ready).await;
    pods.delete("plain", &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(&pods, &plain).await;
    assert_eq!(cluster.kubelet.live_process_groups(), 0);
    cluster.stop().await;
}
