//! A real node joined to the control-plane tier (`harness = false`: the run must first move
//! into namespaces of its own, [`netns::Layout::Node`]): the control plane of `cargo xtask
//! tools`, containerd, the real kubelet, CNI `bridge`/`host-local`/`portmap`/`loopback` and
//! the NetworkPolicy enforcer from `cargo xtask tools --node` (`node::Enforcer`:
//! kube-network-policies, or kube-router where the kernel lacks nftables' queue statement),
//! Debian's `runc`, `catatonit`, `iptables` and `ipset`.
//!
//! A pod under the `runc` RuntimeClass and one under `gvisor` reach Running with pod IPs from
//! the CNI range, and a pod connects to each over TCP (it prints what the server answered).
//! Then a NetworkPolicy that allows no ingress to the servers must make the connections to both
//! (runc and gVisor) fail, and deleting it must let them through again.
//!
//! The test image is one layer with Debian's static busybox (`busybox-static`, the host's
//! installed `/bin/busybox`), made here; the pause image is Debian's `catatonit`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use agent_sandbox_e2e::Error;
use agent_sandbox_e2e::control_plane::{ControlPlane, Tools};
use agent_sandbox_e2e::netns::{self, Layout};
use agent_sandbox_e2e::node::{NODE, NODE_IP, NodeTools, POD_SUBNET, RealNode};
use agent_sandbox_e2e::oci_archive::{LayerFile, OneLayerImage};
use agent_sandbox_local::testkit::{self, BUSYBOX, Tool};
use agent_sandbox_local::wait::{Check, wait_for};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::Api;
use kube::api::{DeleteParams, LogParams, PostParams};
use serde_json::json;

/// The test image.
const IMAGE: &str = "e2e.local/busybox:1";
/// Within this, a pod runs or ends (usually in a few seconds).
const POD_WITHIN: Duration = Duration::from_secs(120);
/// The servers' port.
const PORT: u16 = 8080;
/// The test's name in reports.
const TEST: &str = "a_real_node_runs_runc_and_gvisor_pods_and_enforces_network_policies";
/// How many pods try a connection before the enforcer's verdict must have shown.
const ATTEMPTS: usize = 5;
/// What a server answers.
const ANSWER: &str = "hello-from-the-server";

fn main() {
    // Asked on a thread named after the test, which the skip report names.
    let missing = std::thread::Builder::new()
        .name(TEST.to_owned())
        .spawn(|| testkit::missing(Tool::Node))
        .unwrap()
        .join();
    match missing {
        Ok(false) => {}
        Ok(true) => return,
        // Missing under CI=true: the report is on stderr; fail.
        Err(_) => std::process::exit(101),
    }
    match netns::run_inside_as(Layout::Node, &[]) {
        Ok(Some(code)) => std::process::exit(code),
        Ok(None) => {}
        Err(message) => panic!("{message}"),
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let code = runtime.block_on(async {
        tokio::select! {
            outcome = tokio::spawn(run()) => match outcome {
                Ok(()) => 0,
                // The panic's message is already on stderr; the node and the plane were
                // dropped (torn down) while it unwound.
                Err(_) => 101,
            },
            _ = tokio::signal::ctrl_c() => {
                eprintln!("node: interrupted; tearing down");
                130
            }
        }
    });
    // An interrupted run's task is dropped here, which tears its node and plane down.
    runtime.shutdown_timeout(Duration::from_secs(90));
    if code == 0 {
        println!("test {TEST} ... ok");
    }
    std::process::exit(code);
}

/// Security settings every test container has: a user that is not root, a read-only root,
/// no capabilities.
fn restricted() -> serde_json::Value {
    json!({
        "runAsUser": 1000,
        "runAsNonRoot": true,
        "readOnlyRootFilesystem": true,
        "allowPrivilegeEscalation": false,
        "capabilities": { "drop": ["ALL"] },
    })
}

/// A pod of the test image under `runtime_class`, running `command`.
fn pod(name: &str, runtime_class: &str, role: &str, command: &[&str], restart: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "labels": { "role": role } },
        "spec": {
            "runtimeClassName": runtime_class,
            "restartPolicy": restart,
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": false,
            "containers": [{
                "name": "main",
                "image": IMAGE,
                "imagePullPolicy": "Never",
                "command": command,
                "securityContext": restricted(),
            }],
        },
    }))
    .unwrap()
}

async fn wait_running(pods: &Api<Pod>, name: &str) -> String {
    wait_for(&format!("pod {name} to run"), POD_WITHIN, || {
        let pods = pods.clone();
        async move {
            let pod = pods
                .get(name)
                .await
                .map_err(|e| Error::Check(e.to_string()))?;
            let status = pod.status.unwrap_or_default();
            match (status.phase.as_deref(), status.pod_ip) {
                (Some("Running"), Some(ip)) => Ok::<_, Error>(Check::Done(ip)),
                (phase, _) => Ok(Check::NotYet(format!(
                    "phase {phase:?}, conditions {:?}",
                    status.conditions.unwrap_or_default()
                ))),
            }
        }
    })
    .await
    .unwrap()
}

/// Runs a client pod that connects to `ip`; whether it succeeded, and its log.
async fn connect(pods: &Api<Pod>, name: &str, ip: &str) -> (bool, String) {
    let command = ["/bin/busybox", "nc", "-w", "5", ip, &PORT.to_string()].map(str::to_owned);
    let command: Vec<&str> = command.iter().map(String::as_str).collect();
    pods.create(
        &PostParams::default(),
        &pod(name, "runc", "client", &command, "Never"),
    )
    .await
    .unwrap();
    let phase = wait_for(&format!("client pod {name} to end"), POD_WITHIN, || {
        let pods = pods.clone();
        async move {
            let pod = pods
                .get(name)
                .await
                .map_err(|e| Error::Check(e.to_string()))?;
            match pod.status.and_then(|status| status.phase).as_deref() {
                Some(phase @ ("Succeeded" | "Failed")) => {
                    Ok::<_, Error>(Check::Done(phase.to_owned()))
                }
                phase => Ok(Check::NotYet(format!("phase {phase:?}"))),
            }
        }
    })
    .await
    .unwrap();
    let log = pods
        .logs(name, &LogParams::default())
        .await
        .unwrap_or_else(|error| format!("(no log: {error})"));
    (phase == "Succeeded", log)
}

/// The test.
async fn run() {
    let plane_tools = Tools::in_dir(Tool::control_plane_dir().unwrap()).unwrap();
    let node_tools = NodeTools::in_dir(Tool::node_dir().unwrap()).unwrap();
    let plane = ControlPlane::start_for_node_at(plane_tools, NODE, &[&NODE_IP.to_string()])
        .await
        .unwrap();
    let node = match RealNode::start(&plane, node_tools).await {
        Ok(node) => node,
        Err(error) => panic!("the node did not start: {error}"),
    };
    let image = node.dir().join("busybox.tar");
    OneLayerImage {
        name: IMAGE.to_owned(),
        entrypoint: vec!["/bin/busybox".to_owned()],
        files: vec![LayerFile {
            image_path: "/bin/busybox".to_owned(),
            source: BUSYBOX.into(),
        }],
    }
    .write_to(&image)
    .unwrap();
    node.import_images(&[image.as_path()]).await.unwrap();

    let client = plane.client().await.unwrap();
    // Pods are admitted once the controller manager has made the namespace's ServiceAccount.
    let accounts: Api<ServiceAccount> = Api::default_namespaced(client.clone());
    wait_for("ServiceAccount default/default", POD_WITHIN, || {
        let accounts = accounts.clone();
        async move {
            match accounts.get_opt("default").await {
                Ok(Some(_)) => Ok::<_, Error>(Check::Done(())),
                Ok(None) => Ok(Check::NotYet("not yet made".to_owned())),
                Err(error) => Ok(Check::NotYet(error.to_string())),
            }
        }
    })
    .await
    .unwrap();
    let pods: Api<Pod> = Api::default_namespaced(client);
    let server = [
        "/bin/busybox",
        "nc",
        "-ll",
        "-p",
        &PORT.to_string(),
        "-e",
        "/bin/busybox",
        "echo",
        ANSWER,
    ]
    .map(str::to_owned);
    let server: Vec<&str> = server.iter().map(String::as_str).collect();
    let mut servers = Vec::new();
    for runtime_class in ["runc", "gvisor"] {
        let name = format!("server-{runtime_class}");
        pods.create(
            &PostParams::default(),
            &pod(&name, runtime_class, "server", &server, "Always"),
        )
        .await
        .unwrap();
        servers.push((name, runtime_class));
    }
    let (subnet, prefix) = POD_SUBNET;
    let mut addresses = Vec::new();
    for (name, runtime_class) in &servers {
        let ip = wait_running(&pods, name).await;
        let parsed: std::net::Ipv4Addr = ip.parse().unwrap();
        assert_eq!(
            u32::from(parsed) >> (32 - prefix),
            u32::from(subnet) >> (32 - prefix),
            "{name}'s IP {ip} is outside the CNI range {subnet}/{prefix}"
        );
        let runtime = node
            .crictl(&["pods", "--name", name, "-o", "json"])
            .await
            .unwrap();
        assert!(
            runtime.contains(&format!("\"runtimeHandler\": \"{runtime_class}\"")),
            "{name} does not run under the {runtime_class} handler: {runtime}"
        );
        eprintln!("node: {name} runs under {runtime_class} at {ip}");
        addresses.push((name.clone(), ip));
    }
    eprintln!("node: crictl ps -a\n{}", node.crictl_ps().await.unwrap());

    for (name, ip) in &addresses {
        let (ok, log) = connect(&pods, &format!("client-{name}"), ip).await;
        assert!(
            ok && log.contains(ANSWER),
            "a pod could not reach {name} at {ip}: {log}"
        );
    }

    // NetworkPolicies are programmed a moment after they are stored: each connection below is
    // tried in a new pod, a bounded number of times, until the enforcer's verdict shows.
    let enforcer = node.enforcer();
    eprintln!("node: NetworkPolicies enforced by {}", enforcer.describe());
    let policies: Api<k8s_openapi::api::networking::v1::NetworkPolicy> =
        Api::default_namespaced(plane.client().await.unwrap());
    let deny: k8s_openapi::api::networking::v1::NetworkPolicy = serde_json::from_value(json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": { "name": "servers-take-nothing" },
        "spec": {
            "podSelector": { "matchLabels": { "role": "server" } },
            "policyTypes": ["Ingress"],
        },
    }))
    .unwrap();
    policies
        .create(&PostParams::default(), &deny)
        .await
        .unwrap();
    for (name, ip) in &addresses {
        let mut seen = Vec::new();
        for attempt in 1..=ATTEMPTS {
            let (ok, log) = connect(&pods, &format!("blocked-{name}-{attempt}"), ip).await;
            if !ok && !log.contains(ANSWER) {
                eprintln!("node: blocked from {name} at try {attempt}: {}", log.trim());
                break;
            }
            seen.push(log);
        }
        assert!(
            seen.len() < ATTEMPTS,
            "the NetworkPolicy did not block a pod from {name} in {ATTEMPTS} tries: {seen:?}\n{}:\n{}",
            enforcer.program(),
            node.log_tail(enforcer.program(), 20)
        );
    }
    policies
        .delete("servers-take-nothing", &DeleteParams::default())
        .await
        .unwrap();
    for (name, ip) in &addresses {
        let mut seen = Vec::new();
        for attempt in 1..=ATTEMPTS {
            let (ok, log) = connect(&pods, &format!("allowed-again-{name}-{attempt}"), ip).await;
            if ok && log.contains(ANSWER) {
                eprintln!("node: reached {name} again at try {attempt}");
                break;
            }
            seen.push(log);
        }
        assert!(
            seen.len() < ATTEMPTS,
            "after the policy went, no pod reached {name} in {ATTEMPTS} tries: {seen:?}"
        );
    }
    drop(node);
    drop(plane);
}
