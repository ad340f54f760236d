#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! End to end on the simulated cluster: the router's watch-fed index follows a Sandbox and its
//! Pod in the sim (the sim's kubelet runs the real runtime at a loopback pod IP), and requests
//! through the router reach that runtime. The Sandbox and Pod are written here the way the
//! controller writes them (ownerReference, name-hash label, `Ready` condition), without a
//! Service: the router needs no cluster DNS.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use agent_sandbox_api::{Sandbox, labels, name_hash};
use agent_sandbox_router::{Config, Router, SharedIndex};
use agent_sandbox_sim::{Isolation, Program, Sim, SimConfig, runtime_entry};
use bytes::Bytes;
use common::execute;
use hyper::{Method, StatusCode};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use pretty_assertions::assert_eq;
use serde_json::json;

async fn reply(addr: SocketAddr) -> common::Reply {
    common::send(
        addr,
        Method::POST,
        "/execute",
        &[("x-sandbox-id", "sim-box")],
        execute("echo hello from the sim"),
    )
    .await
}

#[tokio::test]
async fn the_router_follows_a_sandbox_in_the_simulated_cluster() {
    let runtime = agent_sandbox_sim::test_support::workspace_binary(
        "agent-sandbox-runtime",
        "sandbox-runtime",
    )
    .unwrap();
    let sim = Sim::start(
        SimConfig::default()
            .isolation(Isolation::None)
            .image(runtime_entry("*runtime*", Program::Path(runtime))),
    )
    .await
    .unwrap();
    sim.apply_crds().unwrap();
    let client = sim.client().unwrap();
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");

    let container = json!({"name": "runtime", "image": "sandbox-runtime:latest",
                           "ports": [{"containerPort": 8888}]});
    let sandbox: Sandbox = serde_json::from_value(json!({
        "apiVersion": agent_sandbox_api::API_VERSION, "kind": agent_sandbox_api::kinds::SANDBOX,
        "metadata": {"name": "sim-box", "namespace": "default"},
        "spec": {"podTemplate": {"spec": {"containers": [container.clone()]}}}
    }))
    .unwrap();
    let sandbox = sandboxes
        .create(&PostParams::default(), &sandbox)
        .await
        .unwrap();
    let uid = sandbox.metadata.uid.clone().unwrap();
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {
            "name": "sim-box", "namespace": "default",
            "labels": {labels::SANDBOX_NAME_HASH: name_hash("sim-box")},
            "ownerReferences": [{"apiVersion": agent_sandbox_api::API_VERSION, "kind": agent_sandbox_api::kinds::SANDBOX,
                "name": "sim-box", "uid": uid, "controller": true, "blockOwnerDeletion": true}]
        },
        "spec": {"containers": [container]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();

    let index = SharedIndex::new();
    let router = Router::bind(
        Config::new(SocketAddr::from(([127, 0, 0, 1], 0))),
        index.clone(),
    )
    .await
    .unwrap();
    let addr = router.local_addr();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(router.serve(async move {
        let _ = stop_rx.await;
    }));
    let watching = tokio::spawn(agent_sandbox_router::watch(client, index, None));
    let synced = common::eventually(Duration::from_secs(30), move || async move {
        let readyz = common::send(addr, Method::GET, "/readyz", &[], Bytes::new()).await;
        (readyz.status == StatusCode::OK).then_some(())
    })
    .await;
    assert!(synced.is_some(), "the index never synced");

    // Until the controller (here: the test) marks the sandbox Ready, it is not routable.
    let early = reply(addr).await;
    assert_eq!(early.status, StatusCode::NOT_FOUND);
    assert_eq!(
        early.detail(),
        "Sandbox default/sim-box is not Ready yet (no Ready condition)."
    );

    // The sim's kubelet starts the runtime and reports the pod Ready with a loopback IP.
    let pod_ip = common::eventually(Duration::from_secs(30), || {
        let pods = pods.clone();
        async move {
            let pod = pods.get("sim-box").await.ok()?;
            let status = pod.status?;
            let ready = status
                .conditions?
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            ready.then_some(status.pod_ip?)
        }
    })
    .await
    .expect("the sim ran the runtime pod");
    sandboxes
        .patch_status(
            "sim-box",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "podIPs": [pod_ip],
                "conditions": [{"type": "Ready", "status": "True", "reason": "DependenciesReady",
                    "message": "Pod is Ready", "lastTransitionTime": "2026-01-01T00:00:00Z",
                    "observedGeneration": 1}]
            }})),
        )
        .await
        .unwrap();
    let reached = common::eventually(Duration::from_secs(30), move || async move {
        let reply = reply(addr).await;
        (reply.status == StatusCode::OK).then_some(reply)
    })
    .await
    .expect("the router routed to the sandbox");
    assert_eq!(reached.json()["stdout"], "hello from the sim\n");

    // The pod goes away: the router stops routing to it.
    pods.delete("sim-box", &DeleteParams::default())
        .await
        .unwrap();
    let gone = common::eventually(Duration::from_secs(30), move || async move {
        let reply = reply(addr).await;
        (reply.status == StatusCode::NOT_FOUND).then(|| reply.detail())
    })
    .await
    .expect("the router noticed the pod's deletion");
    assert!(
        gone.starts_with("Sandbox default/sim-box is not Ready: its pod sim-box is"),
        "{gone}"
    );

    watching.abort();
    let _ = watching.await;
    stop_tx.send(()).unwrap();
    serving.await.unwrap().unwrap();
    sim.stop().await;
}

/// A suspended sandbox that does not wake before the request's deadline (no controller runs
/// here to resume it) gets 504 saying what the router waited for: which sandbox, that it asked
/// for the sandbox to be resumed, until when, what it last saw, and what to do.
#[tokio::test]
async fn a_suspended_sandbox_that_does_not_wake_in_time_gets_a_504_saying_what_was_waited_for() {
    let sim = Sim::start(SimConfig::default().isolation(Isolation::None))
        .await
        .unwrap();
    sim.apply_crds().unwrap();
    let client = sim.client().unwrap();
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), "default");
    let sandbox: Sandbox = serde_json::from_value(json!({
        "apiVersion": agent_sandbox_api::API_VERSION, "kind": agent_sandbox_api::kinds::SANDBOX,
        "metadata": {"name": "sleepy", "namespace": "default"},
        "spec": {"operatingMode": "Suspended", "podTemplate": {"spec": {"containers": [
            {"name": "runtime", "image": "sandbox-runtime:latest"}]}}}
    }))
    .unwrap();
    sandboxes
        .create(&PostParams::default(), &sandbox)
        .await
        .unwrap();

    let index = SharedIndex::new();
    let router = Router::bind_with(
        Config::new(SocketAddr::from(([127, 0, 0, 1], 0))),
        index.clone(),
        Some(client.clone()),
    )
    .await
    .unwrap();
    let addr = router.local_addr();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(router.serve(async move {
        let _ = stop_rx.await;
    }));
    let watching = tokio::spawn(agent_sandbox_router::watch(client, index, None));
    let synced = common::eventually(Duration::from_secs(30), move || async move {
        let readyz = common::send(addr, Method::GET, "/readyz", &[], Bytes::new()).await;
        (readyz.status == StatusCode::OK).then_some(())
    })
    .await;
    assert!(synced.is_some(), "the index never synced");

    let reply = common::send(
        addr,
        Method::POST,
        "/execute",
        &[("x-sandbox-id", "sleepy"), ("x-sandbox-timeout", "1.5")],
        execute("echo awake"),
    )
    .await;
    assert_eq!(
        reply.status,
        StatusCode::GATEWAY_TIMEOUT,
        "{}",
        reply.text()
    );
    assert_eq!(
        reply.detail(),
        "Sandbox default/sleepy was suspended: the router asked for it to be resumed (it \
         recorded the request as the sandbox's activity, status.lastActivityTime, for which the \
         controller resumes a suspended sandbox) and waited for it to become routable until \
         the request's deadline, 1.500s after it arrived (X-Sandbox-Timeout, at most \
         --max-timeout-seconds); last seen, it was still suspended (spec.operatingMode: \
         Suspended), so the controller has not resumed it (is the controller running?). Retry \
         with a longer X-Sandbox-Timeout, or resume it first (sandboxctl resume CLAIM) and \
         wait until it is Ready."
    );
    // The router did ask.
    let asked = sandboxes.get("sleepy").await.unwrap();
    assert!(
        asked
            .status
            .as_ref()
            .and_then(|s| s.last_activity_time.as_ref())
            .is_some(),
        "{:?}",
        asked.status
    );

    watching.abort();
    let _ = watching.await;
    stop_tx.send(()).unwrap();
    serving.await.unwrap().unwrap();
    sim.stop().await;
}

/// A request waiting for a suspended sandbox to wake is that sandbox's activity while it waits,
/// as a running command is: the router keeps recording it (here for a sandbox whose
/// `activeTTLSeconds` is 4, so at least every second), so that a wake slower than the TTL (a
/// real node starting a pod) does not let the controller suspend the sandbox again before the
/// request reaches it. No controller runs here, so the request ends in 504 after 4 s.
#[tokio::test]
async fn a_request_waiting_for_a_wake_keeps_recording_activity() {
    let sim = Sim::start(SimConfig::default().isolation(Isolation::None))
        .await
        .unwrap();
    sim.apply_crds().unwrap();
    let client = sim.client().unwrap();
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), "default");
    let sandbox: Sandbox = serde_json::from_value(json!({
        "apiVersion": agent_sandbox_api::API_VERSION, "kind": agent_sandbox_api::kinds::SANDBOX,
        "metadata": {"name": "drowsy", "namespace": "default"},
        "spec": {"operatingMode": "Suspended",
            "idleLifecycle": {"activeTTLSeconds": 4, "activeExpirationPolicy": "Suspend"},
            "podTemplate": {"spec": {"containers": [
                {"name": "runtime", "image": "sandbox-runtime:latest"}]}}}
    }))
    .unwrap();
    sandboxes
        .create(&PostParams::default(), &sandbox)
        .await
        .unwrap();

    let index = SharedIndex::new();
    let router = Router::bind_with(
        Config::new(SocketAddr::from(([127, 0, 0, 1], 0))),
        index.clone(),
        Some(client.clone()),
    )
    .await
    .unwrap();
    let addr = router.local_addr();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(router.serve(async move {
        let _ = stop_rx.await;
    }));
    let watching = tokio::spawn(agent_sandbox_router::watch(client, index, None));
    let synced = common::eventually(Duration::from_secs(30), move || async move {
        let readyz = common::send(addr, Method::GET, "/readyz", &[], Bytes::new()).await;
        (readyz.status == StatusCode::OK).then_some(())
    })
    .await;
    assert!(synced.is_some(), "the index never synced");

    let arrived = k8s_openapi::jiff::Timestamp::now();
    let reply = common::send(
        addr,
        Method::POST,
        "/execute",
        &[("x-sandbox-id", "drowsy"), ("x-sandbox-timeout", "4")],
        execute("echo awake"),
    )
    .await;
    assert_eq!(
        reply.status,
        StatusCode::GATEWAY_TIMEOUT,
        "{}",
        reply.text()
    );
    let recorded = sandboxes
        .get("drowsy")
        .await
        .unwrap()
        .status
        .and_then(|s| s.last_activity_time)
        .map(|t| t.0)
        .expect("the router recorded activity");
    // The resume alone would have left the arrival time (to the second); writes while waiting
    // moved it on.
    let floor = arrived.as_second() + 2;
    assert!(
        recorded.as_second() >= floor,
        "lastActivityTime {recorded} is not later than 2 s after the request arrived ({arrived})"
    );

    watching.abort();
    let _ = watching.await;
    stop_tx.send(()).unwrap();
    serving.await.unwrap().unwrap();
    sim.stop().await;
}
