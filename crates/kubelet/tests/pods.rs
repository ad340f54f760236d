//! What a Deployment's pod needs from its node, through kube-rs against the sim (whose node is
//! this kubelet): Secret, ConfigMap and downward-API volumes at absolute paths under a read-only
//! root (with `items`, modes and `optional`), owned as a node owns them (root's, readable by a
//! pod that is not root only through `fsGroup` when the mode says so), a mount that waits for
//! its Secret, liveness probes that restart a container, and wildcard listen addresses narrowed
//! to the pod IP so that two pods can bind the same port.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use agent_sandbox_local::testkit::{Tool, missing};
use agent_sandbox_sim::{Isolation, Sim, SimConfig};
use k8s_openapi::api::core::v1::{ConfigMap, Event, Pod, Secret};
use kube::api::{Api, ListParams, LogParams, PostParams};
use serde_json::json;

/// A bound for waits (not a speed assertion).
const PATIENCE: Duration = Duration::from_secs(60);

async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn phase(pod: &Pod) -> String {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default()
}

async fn logs(pods: &Api<Pod>, name: &str) -> String {
    pods.logs(name, &LogParams::default()).await.unwrap()
}

#[tokio::test]
async fn projection_volumes_appear_at_their_mount_paths_read_only_with_their_modes() {
    if missing(Tool::Confinement) {
        return;
    }
    let sim = Sim::start(SimConfig::default().isolation(Isolation::Confined))
        .await
        .unwrap();
    let client = sim.client().unwrap();
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let script = "stat -c '%a %n' /etc/app/key/key /etc/app/settings/renamed; \
                  cat /etc/app/key/key /etc/app/settings/renamed /var/run/podinfo/name; echo; \
                  ls /etc/app/settings; test -e /etc/hostname && echo host-etc-still-there; \
                  touch /etc/app/key/new 2>/dev/null || echo volume-read-only; \
                  touch /etc/new 2>/dev/null || echo etc-read-only";
    // The pod runs as 1000 (this node's default user): the Secret's 0400 files are root's on a
    // node, readable through fsGroup.
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "mounts"},
        "spec": {"restartPolicy": "Never", "securityContext": {"fsGroup": 3000},
            "containers": [{"name": "main", "image": "busybox", "command": ["sh", "-c", script],
                "volumeMounts": [
                    {"name": "key", "mountPath": "/etc/app/key", "readOnly": true},
                    {"name": "settings", "mountPath": "/etc/app/settings"},
                    {"name": "podinfo", "mountPath": "/var/run/podinfo"}]}],
            "volumes": [
                {"name": "key", "secret": {"secretName": "signing", "defaultMode": 0o400}},
                {"name": "settings", "configMap": {"name": "settings",
                    "items": [{"key": "color", "path": "renamed", "mode": 0o640}]}},
                {"name": "podinfo", "downwardAPI": {"items": [
                    {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}}]}}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    // The Secret and ConfigMap do not exist yet: the mount fails, is reported, and is retried.
    let events: Api<Event> = Api::default_namespaced(client.clone());
    let failed_mount = eventually("a FailedMount event", || async {
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("FailedMount"))
    })
    .await;
    let message = failed_mount.message.unwrap_or_default();
    assert!(
        message.contains("\"signing\"") && message.contains("not found"),
        "{message}"
    );
    let waiting = pods.get("mounts").await.unwrap();
    assert_eq!(phase(&waiting), "Pending");
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "signing"}, "stringData": {"key": "s3cret"}}))
    .unwrap();
    Api::<Secret>::default_namespaced(client.clone())
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let map: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "settings"}, "data": {"color": "blue", "unused": "x"}}))
    .unwrap();
    Api::<ConfigMap>::default_namespaced(client.clone())
        .create(&PostParams::default(), &map)
        .await
        .unwrap();
    eventually("the pod to succeed", || async {
        (phase(&pods.get("mounts").await.unwrap()) == "Succeeded").then_some(())
    })
    .await;
    // A root kubelet applies fsGroup as a node does (group read added); one that is not root
    // cannot, and leaves the files its own (the pod's user's) with their modes.
    let key_mode = if sim.protections().host_ids {
        "440"
    } else {
        "400"
    };
    assert_eq!(
        logs(&pods, "mounts").await,
        format!(
            "{key_mode} /etc/app/key/key\n640 /etc/app/settings/renamed\ns3cretbluemounts\n\
             renamed\nhost-etc-still-there\nvolume-read-only\netc-read-only\n"
        )
    );
    sim.stop().await;
}

/// The router's signing key as deploy/base mounts it: a Secret volume with `defaultMode` 0400
/// in a pod that runs as 65532. On a node the key belongs to root, so without `fsGroup` the
/// router cannot read it (it crash-looped on the node tier while this kubelet gave the file to
/// the pod's user); with `fsGroup: 65532` it reads it as the file's group, mode 0440. Only a
/// root kubelet can own files as a node does: skipped otherwise (a failure under `CI=true`).
#[tokio::test]
async fn a_0400_secret_is_readable_by_a_pod_that_is_not_root_only_through_its_fs_group() {
    if missing(Tool::Confinement) {
        return;
    }
    let sim = Sim::start(SimConfig::default().isolation(Isolation::Confined))
        .await
        .unwrap();
    if !sim.protections().host_ids {
        let message = "a kubelet that is not root cannot give volume files to root or a group \
                       (run as root)";
        assert!(std::env::var_os("CI").is_none(), "{message}");
        eprintln!("skipping: {message}");
        sim.stop().await;
        return;
    }
    let client = sim.client().unwrap();
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "sandbox-router-signing-key"}, "stringData": {"key": "s3cret"}}))
    .unwrap();
    Api::<Secret>::default_namespaced(client.clone())
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::default_namespaced(client);
    let script = "stat -c '%a' /etc/sandbox-router/signing-key/key; \
                  cat /etc/sandbox-router/signing-key/key 2>/dev/null && echo || echo denied";
    for (name, fs_group, expected) in [
        ("without-fs-group", None, "400\ndenied\n"),
        ("with-fs-group", Some(65532), "440\ns3cret\n"),
    ] {
        let mut security = json!({"runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532});
        if let Some(group) = fs_group {
            security["fsGroup"] = json!(group);
        }
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"restartPolicy": "Never", "securityContext": security,
                "containers": [{"name": "router", "image": "busybox",
                    "command": ["sh", "-c", script],
                    "volumeMounts": [{"name": "signing-key",
                        "mountPath": "/etc/sandbox-router/signing-key", "readOnly": true}]}],
                "volumes": [{"name": "signing-key", "secret": {
                    "secretName": "sandbox-router-signing-key", "defaultMode": 0o400}}]}
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
        eventually("the pod to succeed", || async {
            (phase(&pods.get(name).await.unwrap()) == "Succeeded").then_some(())
        })
        .await;
        assert_eq!(logs(&pods, name).await, expected, "{name}");
    }
    sim.stop().await;
}

#[tokio::test]
async fn a_failing_liveness_probe_restarts_the_container() {
    let sim = Sim::start(SimConfig::default().isolation(Isolation::None))
        .await
        .unwrap();
    let client = sim.client().unwrap();
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    // Alive while the file exists; the first run removes it after a moment, later runs keep it.
    let script = "if [ -e restarted ]; then touch alive; else touch restarted alive; \
                  sleep 1; rm alive; fi; exec sleep 300";
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "lively"},
        "spec": {"restartPolicy": "Always", "terminationGracePeriodSeconds": 2,
            "containers": [{"name": "main", "image": "busybox", "command": ["sh", "-c", script],
                "livenessProbe": {"exec": {"command": ["test", "-e", "alive"]},
                                  "periodSeconds": 1, "failureThreshold": 2}}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let restarted = eventually("a restart after the liveness probe failed", || async {
        let pod = pods.get("lively").await.unwrap();
        let status = pod.status?.container_statuses?.into_iter().next()?;
        (status.restart_count >= 1 && status.state.as_ref()?.running.is_some()).then_some(status)
    })
    .await;
    assert_eq!(restarted.restart_count, 1);
    let events: Api<Event> = Api::default_namespaced(client);
    let reasons: Vec<String> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|e| e.reason)
        .collect();
    assert!(reasons.iter().any(|r| r == "Unhealthy"), "{reasons:?}");
    assert!(reasons.iter().any(|r| r == "Killing"), "{reasons:?}");
    // The second run stays alive: no further restart within a few probe periods.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let pod = pods.get("lively").await.unwrap();
    let status = pod.status.unwrap().container_statuses.unwrap();
    assert_eq!(status[0].restart_count, 1);
    sim.stop().await;
}

#[tokio::test]
async fn two_pods_binding_the_wildcard_address_on_one_port_both_run() {
    if missing(Tool::Python3) {
        return;
    }
    let sim = Sim::start(SimConfig::default().isolation(Isolation::None))
        .await
        .unwrap();
    let pods: Api<Pod> = Api::default_namespaced(sim.client().unwrap());
    let server = "import socket, sys, time\n\
                  host, port = sys.argv[1].rsplit(':', 1)\n\
                  s = socket.socket(); s.bind((host, int(port))); s.listen()\n\
                  print(sys.argv[1], flush=True)\n\
                  time.sleep(300)";
    for name in ["first", "second"] {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"terminationGracePeriodSeconds": 1, "containers": [{"name": "main",
                "image": "python:3", "command": ["python3", "-c", server, "0.0.0.0:18080"]}]}
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    for name in ["first", "second"] {
        let (ip, printed) = eventually("the server to listen", || async {
            let pod = pods.get(name).await.unwrap();
            let ip = pod.status?.pod_ip?;
            let printed = logs(&pods, name).await;
            (!printed.is_empty()).then_some((ip, printed))
        })
        .await;
        assert_eq!(printed, format!("{ip}:18080\n"));
        let pod = pods.get(name).await.unwrap();
        let status = pod.status.unwrap().container_statuses.unwrap();
        assert_eq!(status[0].restart_count, 0, "{name} did not crash");
    }
    sim.stop().await;
}
