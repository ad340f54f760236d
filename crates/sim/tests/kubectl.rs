//! Fidelity checked with a client nobody here wrote: the real `kubectl` against the sim.
//! Skipped, with a printed reason, where `kubectl` is not installed (`.ci/run` installs it);
//! under `CI=true` a missing kubectl fails instead.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use agent_sandbox_sim::{Isolation, PodNetworks, Sim, SimConfig};
use common::{Kubectl, group_alive, http_get, runtime_binary};
use tokio::io::AsyncWriteExt;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Skips the test without kubectl (reported as skipped; a failure under `CI=true`).
macro_rules! require_kubectl {
    () => {
        if agent_sandbox_local::testkit::missing(agent_sandbox_local::testkit::Tool::Kubectl) {
            return;
        }
    };
}

const CRDS: [&str; 4] = [
    "sandboxclaims.extensions.agents.x-k8s.io",
    "sandboxes.agents.x-k8s.io",
    "sandboxtemplates.extensions.agents.x-k8s.io",
    "sandboxwarmpools.extensions.agents.x-k8s.io",
];

#[tokio::test]
async fn kubectl_applies_the_generated_crds_and_lists_them() {
    require_kubectl!();
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let kubectl = Kubectl::new(&sim);
    let dir = workspace_root().join("deploy/crds/");
    let output = kubectl
        .run(&["apply", "--server-side", "-f", dir.to_str().unwrap()])
        .await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    for crd in CRDS {
        assert!(
            stdout.contains(&format!(
                "customresourcedefinition.apiextensions.k8s.io/{crd} serverside-applied"
            )),
            "{stdout}"
        );
    }
    // The directory also holds kustomization.yaml, which is not a Kubernetes object: kubectl
    // reports it against any cluster; nothing else may fail.
    let stderr = String::from_utf8_lossy(&output.stderr);
    for line in stderr.lines().filter(|l| !l.trim().is_empty()) {
        assert!(
            line.contains("kustomization.yaml"),
            "unexpected kubectl error: {line}"
        );
    }
    let listed = kubectl.ok(&["get", "crds"]).await;
    assert!(listed.starts_with("NAME"), "{listed}");
    let names: Vec<&str> = listed
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(names, CRDS);
    // Through kustomize, everything applies cleanly; re-applying is idempotent.
    let kustomized = kubectl
        .ok(&[
            "apply",
            "--server-side",
            "-k",
            workspace_root().join("deploy/crds").to_str().unwrap(),
        ])
        .await;
    assert_eq!(kustomized.lines().count(), 4, "{kustomized}");
}

#[tokio::test]
async fn kubectl_is_refused_without_the_kubeconfigs_credential() {
    require_kubectl!();
    let sim = Sim::start(SimConfig::default().isolation(Isolation::None))
        .await
        .unwrap();
    let kubectl = Kubectl::new(&sim);
    kubectl.ok(&["get", "pods"]).await;
    // The same kubeconfig with another token: the API server's 401, as kubectl reports it.
    // (Without any credential kubectl asks for a user name instead of sending the request.)
    let text = std::fs::read_to_string(sim.kubeconfig_path()).unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let guessing = Kubectl {
        kubeconfig: scratch.path().join("guessing"),
        cache: tempfile::tempdir().unwrap(),
    };
    let other_token: String = text
        .lines()
        .map(|line| {
            if line.trim_start().starts_with("token:") {
                "    token: not-the-kubeconfigs-token\n".to_owned()
            } else {
                format!("{line}\n")
            }
        })
        .collect();
    assert_ne!(other_token, text);
    std::fs::write(&guessing.kubeconfig, other_token).unwrap();
    let output = guessing.run(&["get", "pods"]).await;
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("error: You must be logged in to the server"),
        "{stderr}"
    );
    // A ServiceAccount's token (kubectl create token) is authenticated, and refused what its
    // RBAC does not allow.
    let token = kubectl.ok(&["create", "token", "default"]).await;
    let output = kubectl
        .run(&["--token", token.trim(), "get", "secrets"])
        .await;
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(
            "secrets is forbidden: User \"system:serviceaccount:default:default\" cannot list resource \"secrets\" in API group \"\" in the namespace \"default\""
        ),
        "{stderr}"
    );
    sim.stop().await;
}

#[tokio::test]
async fn kubectl_runs_waits_for_lists_and_deletes_a_runtime_pod() {
    require_kubectl!();
    // Built next to the test binaries, where the default image table finds it.
    runtime_binary();
    // On the host's network: the test talks to the pod directly.
    let sim = Sim::start(
        SimConfig::default()
            .isolation(Isolation::Confined)
            .pod_networks(PodNetworks::Host),
    )
    .await
    .unwrap();
    let kubectl = Kubectl::new(&sim);
    let manifest = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: rt\nspec:\n  containers:\n  - name: runtime\n    image: registry.example/agent-sandbox/python-runtime-sandbox:v0.1\n";
    let applied = kubectl
        .run_with_input(&["apply", "--server-side", "-f", "-"], Some(manifest))
        .await;
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );
    kubectl
        .ok(&["wait", "--for=condition=Ready", "pod/rt", "--timeout=60s"])
        .await;
    let wide = kubectl.ok(&["get", "pods", "-o", "wide"]).await;
    let row = wide
        .lines()
        .find(|l| l.starts_with("rt "))
        .expect("a row for the pod");
    let columns: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(&columns[..3], ["rt", "1/1", "Running"], "{wide}");
    let ip = columns[5];
    assert!(ip.starts_with("127.") && ip != "127.0.0.1", "{wide}");
    let (code, body) = http_get(&format!("{ip}:8888"), "/").await;
    assert_eq!(code, 200);
    let status: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status["status"], "ok");
    let id = kubectl
        .ok(&[
            "get",
            "pod",
            "rt",
            "-o",
            "jsonpath={.status.containerStatuses[0].containerID}",
        ])
        .await;
    let pid: i32 = id.trim_start_matches("sim://").parse().unwrap();
    assert!(group_alive(pid));
    let deleted = kubectl.ok(&["delete", "pod", "rt"]).await;
    // kubectl 1.35 and later add " from <namespace> namespace".
    assert!(
        deleted.trim().starts_with("pod \"rt\" deleted"),
        "{deleted}"
    );
    // kubectl returns once the object is gone, which happens after the processes are gone.
    assert!(
        !group_alive(pid),
        "the pod's processes outlived `kubectl delete`"
    );
    let empty = kubectl.run(&["get", "pod", "rt"]).await;
    assert!(String::from_utf8_lossy(&empty.stderr).contains("NotFound"));
}

#[tokio::test]
async fn kubectl_gets_sandboxes_and_scales_warm_pools() {
    require_kubectl!();
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    sim.apply_crds().unwrap();
    let kubectl = Kubectl::new(&sim);
    let manifests = "apiVersion: agents.x-k8s.io/v1beta1\nkind: Sandbox\nmetadata:\n  name: sb1\nspec:\n  podTemplate:\n    spec:\n      containers:\n      - name: c\n        image: busybox\n---\napiVersion: extensions.agents.x-k8s.io/v1beta1\nkind: SandboxWarmPool\nmetadata:\n  name: pool\nspec:\n  replicas: 1\n  sandboxTemplateRef:\n    name: t\n";
    let applied = kubectl
        .run_with_input(&["apply", "--server-side", "-f", "-"], Some(manifests))
        .await;
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );
    let sandboxes = kubectl.ok(&["get", "sandboxes"]).await;
    let mut lines = sandboxes.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "READY", "REASON", "AGE"]);
    assert!(lines.next().unwrap().starts_with("sb1 "), "{sandboxes}");
    let scaled = kubectl
        .ok(&["scale", "sandboxwarmpool", "pool", "--replicas=3"])
        .await;
    assert!(scaled.contains("scaled"), "{scaled}");
    let replicas = kubectl
        .ok(&["get", "swp", "pool", "-o", "jsonpath={.spec.replicas}"])
        .await;
    assert_eq!(replicas, "3");
    let short = kubectl.ok(&["get", "sandbox", "sb1", "-o", "name"]).await;
    assert_eq!(short.trim(), "sandbox.agents.x-k8s.io/sb1");
    // A null for a field that is not nullable is dropped, not refused, by apply and create alike.
    for (verb, name) in [("apply", "sb2"), ("create", "sb3")] {
        let manifest = format!(
            "apiVersion: agents.x-k8s.io/v1beta1\nkind: Sandbox\nmetadata:\n  name: {name}\nspec:\n  podTemplate:\n    spec:\n      containers:\n      - name: c\n        image: null\n"
        );
        let args: &[&str] = if verb == "apply" {
            &["apply", "--server-side", "-f", "-"]
        } else {
            &["create", "-f", "-"]
        };
        let written = kubectl.run_with_input(args, Some(&manifest)).await;
        assert!(written.status.success(), "{verb}: {written:?}");
        let container = kubectl
            .ok(&[
                "get",
                "sandbox",
                name,
                "-o",
                "jsonpath={.spec.podTemplate.spec.containers[0]}",
            ])
            .await;
        assert_eq!(container, r#"{"name":"c"}"#, "{verb}");
    }
}

#[tokio::test]
async fn kubectl_shows_logs_events_and_describes_pods() {
    require_kubectl!();
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let kubectl = Kubectl::new(&sim);
    let manifest = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: talker\nspec:\n  restartPolicy: Never\n  containers:\n  - name: main\n    image: busybox\n    command: [sh, -c, 'echo one; echo two']\n";
    let applied = kubectl
        .run_with_input(&["apply", "-f", "-"], Some(manifest))
        .await;
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );
    kubectl
        .ok(&[
            "wait",
            "--for=jsonpath={.status.phase}=Succeeded",
            "pod/talker",
            "--timeout=60s",
        ])
        .await;
    assert_eq!(kubectl.ok(&["logs", "talker"]).await, "one\ntwo\n");
    assert_eq!(kubectl.ok(&["logs", "talker", "--tail=1"]).await, "two\n");
    let events = kubectl.ok(&["get", "events"]).await;
    assert!(events.contains("Started container main"), "{events}");
    let described = kubectl.ok(&["describe", "pod", "talker"]).await;
    assert!(
        described.contains("Status:           Succeeded"),
        "{described}"
    );
    assert!(described.contains("Scheduled"), "{described}");
    // Several kinds at once: kubectl prefixes names with their kind (it finds the name column
    // by its format).
    let all = kubectl.ok(&["get", "all"]).await;
    assert!(all.contains("pod/talker"), "{all}");
    assert!(all.contains("service/kubernetes"), "{all}");
    // A label change through kubectl's strategic merge patch.
    kubectl.ok(&["label", "pod", "talker", "team=sim"]).await;
    let labels = kubectl
        .ok(&[
            "get",
            "pod",
            "talker",
            "-o",
            "jsonpath={.metadata.labels.team}",
        ])
        .await;
    assert_eq!(labels, "sim");
}

#[tokio::test]
async fn kubectl_get_follows_table_pages() {
    require_kubectl!();
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let kubectl = Kubectl::new(&sim);
    let manifests: String = (0..7)
        .map(|i| format!("---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: page-{i}}}\n"))
        .collect();
    let output = kubectl
        .run_with_input(&["create", "-f", "-"], Some(&manifests))
        .await;
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // Chunks of 3: kubectl must follow `continue` twice to print all seven.
    let listed = kubectl
        .ok(&[
            "get",
            "configmaps",
            "--chunk-size=3",
            "--no-headers",
            "-o",
            "name",
        ])
        .await;
    assert_eq!(
        listed.lines().filter(|l| l.contains("page-")).count(),
        7,
        "{listed}"
    );
    let table = kubectl
        .ok(&["get", "configmaps", "--chunk-size=3", "--no-headers"])
        .await;
    assert_eq!(
        table.lines().filter(|l| l.starts_with("page-")).count(),
        7,
        "{table}"
    );
}

/// A pod whose program echoes every byte it receives on `{pod IP}:7000`, per connection, and
/// closes its end once the client has closed its own.
const ECHO_POD: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: echo
spec:
  containers:
  - name: echo
    image: python:3
    command: ["python3", "-c"]
    args:
    - |
      import os, socket, threading
      def serve(conn):
          while True:
              data = conn.recv(65536)
              if not data:
                  break
              conn.sendall(data)
          conn.close()
      server = socket.socket()
      server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
      server.bind((os.environ["POD_IP"], 7000))
      server.listen()
      while True:
          conn, _ = server.accept()
          threading.Thread(target=serve, args=(conn,), daemon=True).start()
    env:
    - name: POD_IP
      valueFrom:
        fieldRef:
          fieldPath: status.podIP
    ports:
    - containerPort: 7000
    readinessProbe:
      tcpSocket:
        port: 7000
"#;

/// Sends `payload` through `addr` and returns what comes back once the far end closes.
async fn echo_through(addr: &str, payload: &[u8]) -> Vec<u8> {
    use tokio::io::AsyncReadExt as _;
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut reader, mut writer) = stream.into_split();
    let send = async {
        writer.write_all(payload).await.unwrap();
        // Half-close: the pod's program sees the end of its input and closes its side.
        writer.shutdown().await.unwrap();
    };
    let receive = async {
        let mut received = Vec::new();
        reader.read_to_end(&mut received).await.unwrap();
        received
    };
    let ((), received) = tokio::time::timeout(Duration::from_secs(60), async {
        tokio::join!(send, receive)
    })
    .await
    .expect("the echo came back in time");
    received
}

#[tokio::test]
async fn kubectl_port_forward_over_spdy_carries_bytes_both_ways() {
    require_kubectl!();
    // This forces the SPDY/3.1 dialer of client-go, the one upstream's Go SDK uses.
    port_forward_carries_bytes_both_ways(false).await;
}

#[tokio::test]
async fn kubectl_port_forward_through_the_websocket_tunnel_carries_bytes_both_ways() {
    require_kubectl!();
    // kubectl's default since 1.31: SPDY tunnelled through a WebSocket, with no fallback here.
    port_forward_carries_bytes_both_ways(true).await;
}

/// Runs `kubectl port-forward` to an echo pod, with the WebSocket tunnel (`websockets`) or plain
/// SPDY, and checks the bytes both ways over two connections of one session.
async fn port_forward_carries_bytes_both_ways(websockets: bool) {
    use tokio::io::AsyncBufReadExt as _;
    let sim = Sim::start(SimConfig::default().isolation(Isolation::Confined))
        .await
        .unwrap();
    let kubectl = Kubectl::new(&sim);
    let applied = kubectl
        .run_with_input(&["apply", "--server-side", "-f", "-"], Some(ECHO_POD))
        .await;
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );
    kubectl
        .ok(&["wait", "--for=condition=Ready", "pod/echo", "--timeout=60s"])
        .await;

    let mut forward = tokio::process::Command::new("kubectl")
        .env(
            "KUBECTL_PORT_FORWARD_WEBSOCKETS",
            if websockets { "true" } else { "false" },
        )
        // At this level client-go logs the tunnel's negotiation and any fallback to SPDY.
        .arg("-v=4")
        .arg("--kubeconfig")
        .arg(&kubectl.kubeconfig)
        .arg("--cache-dir")
        .arg(kubectl.cache.path())
        .args([
            "port-forward",
            "--address",
            "127.0.0.1",
            "pod/echo",
            ":7000",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = forward.stdout.take().unwrap();
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    // "Forwarding from 127.0.0.1:PORT -> 7000"
    let local = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(rest) = line.strip_prefix("Forwarding from ") {
                return rest.split_whitespace().next().unwrap().to_owned();
            }
        }
        panic!("kubectl port-forward ended without forwarding");
    })
    .await
    .expect("kubectl port-forward started in time");

    // Enough bytes to need many frames and flow-control windows in both directions, with every
    // byte value.
    let payload: Vec<u8> = (0..3 * 1024 * 1024 + 17)
        .map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let echoed = echo_through(&local, &payload).await;
    assert_eq!(echoed.len(), payload.len());
    assert!(echoed == payload, "the echo differs from what was sent");
    // A second connection over the same session: new streams, same upgrade.
    let echoed = echo_through(&local, b"second connection\n").await;
    assert_eq!(echoed, b"second connection\n");
    assert_eq!(
        sim.request_counts().get("connect", "", "pods/portforward"),
        1,
        "one upgrade carried both connections"
    );

    forward.start_kill().unwrap();
    let output = forward.wait_with_output().await.unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !stderr.contains("fallback to secondary dialer") && !stderr.contains("Unhandled"),
        "kubectl port-forward reported: {stderr}"
    );
    assert!(
        !stderr.lines().any(|l| l.starts_with('E')),
        "kubectl port-forward logged errors: {stderr}"
    );
    assert_eq!(
        stderr.contains("Before WebSocket Upgrade Connection"),
        websockets,
        "the WebSocket tunnel was {}used: {stderr}",
        if websockets { "not " } else { "" }
    );
}

#[tokio::test]
async fn kubectl_creates_and_deletes_a_namespace_and_its_content() {
    require_kubectl!();
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let kubectl = Kubectl::new(&sim);
    // kubectl's generators send these bodies as protobuf.
    assert_eq!(
        kubectl.ok(&["create", "namespace", "team-a"]).await.trim(),
        "namespace/team-a created"
    );
    kubectl
        .ok(&[
            "create",
            "configmap",
            "settings",
            "-n",
            "team-a",
            "--from-literal=mode=fast",
        ])
        .await;
    kubectl
        .ok(&[
            "create",
            "secret",
            "generic",
            "token",
            "-n",
            "team-a",
            "--from-literal=value=s3cr3t",
        ])
        .await;
    kubectl
        .ok(&["create", "serviceaccount", "bot", "-n", "team-a"])
        .await;
    let created = kubectl
        .ok(&[
            "get",
            "namespace",
            "team-a",
            "-o",
            "jsonpath={.spec.finalizers} {.status.phase}",
        ])
        .await;
    assert_eq!(created, r#"["kubernetes"] Active"#);
    assert_eq!(
        kubectl
            .ok(&[
                "get",
                "configmap",
                "settings",
                "-n",
                "team-a",
                "-o",
                "jsonpath={.data.mode}"
            ])
            .await,
        "fast"
    );
    assert_eq!(
        kubectl
            .ok(&[
                "get",
                "secret",
                "token",
                "-n",
                "team-a",
                "-o",
                "jsonpath={.data.value}"
            ])
            .await,
        "czNjcjN0"
    );
    // A finalizer on the content holds the namespace in Terminating, reported as the namespace
    // controller reports it.
    kubectl
        .ok(&[
            "patch",
            "configmap",
            "settings",
            "-n",
            "team-a",
            "--type=merge",
            "-p",
            r#"{"metadata":{"finalizers":["example.com/hold"]}}"#,
        ])
        .await;
    kubectl
        .ok(&["delete", "namespace", "team-a", "--wait=false"])
        .await;
    let mut terminating = String::new();
    for _ in 0..100 {
        terminating = kubectl
            .ok(&[
                "get",
                "namespace",
                "team-a",
                "-o",
                r#"jsonpath={.status.phase} {.status.conditions[?(@.type=="NamespaceContentRemaining")].message} {.status.conditions[?(@.type=="NamespaceFinalizersRemaining")].message}"#,
            ])
            .await;
        if terminating.contains("configmaps. has 1") && !terminating.contains("secrets") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        terminating,
        "Terminating Some resources are remaining: configmaps. has 1 resource instances \
         Some content in the namespace has finalizers remaining: example.com/hold in 1 resource instances"
    );
    let refused = kubectl
        .run(&["create", "configmap", "late", "-n", "team-a"])
        .await;
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("because it is being terminated"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    kubectl
        .ok(&[
            "patch",
            "configmap",
            "settings",
            "-n",
            "team-a",
            "--type=json",
            "-p",
            r#"[{"op":"remove","path":"/metadata/finalizers"}]"#,
        ])
        .await;
    kubectl
        .ok(&["wait", "--for=delete", "namespace/team-a", "--timeout=60s"])
        .await;
    let gone = kubectl.run(&["get", "namespace", "team-a"]).await;
    assert!(String::from_utf8_lossy(&gone.stderr).contains("NotFound"));
    // A plain `kubectl delete namespace` waits until the namespace is gone.
    kubectl.ok(&["create", "namespace", "team-b"]).await;
    kubectl
        .ok(&["create", "configmap", "c", "-n", "team-b"])
        .await;
    kubectl.ok(&["delete", "namespace", "team-b"]).await;
    let listed = kubectl.ok(&["get", "namespaces", "-o", "name"]).await;
    assert!(!listed.contains("team-"), "{listed}");
}

/// A file of upstream's released module (`sigs.k8s.io/agent-sandbox`, the version
/// `tests/upstream/go` pins), through `go mod download`; `None` (the test skips, saying why)
/// where Go is missing, except under `CI=true`, where that fails.
fn upstream_file(path: &str) -> Option<PathBuf> {
    let output = std::process::Command::new("go")
        .args([
            "mod",
            "download",
            "-json",
            "sigs.k8s.io/agent-sandbox@v1.0.3",
        ])
        .current_dir(std::env::temp_dir())
        .stdin(Stdio::null())
        .output();
    let dir = match output {
        Ok(output) if output.status.success() => {
            let info: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
            PathBuf::from(
                info["Dir"]
                    .as_str()
                    .expect("go mod download names the directory"),
            )
        }
        other => {
            let why =
                format!("upstream's module is not available through `go mod download`: {other:?}");
            assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}");
            eprintln!("skipped: {why}");
            return None;
        }
    };
    Some(dir.join(path))
}

/// A stand-in for upstream's router image: answers every GET with 200 on the pod's
/// `:8081`, where upstream's Deployment points its probes (it ignores the container's args).
const ROUTER_STAND_IN: &str = r#"#!/bin/sh
exec python3 -c '
import http.server, os
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer((os.environ["POD_IP"], 8081), Handler).serve_forever()
'
"#;

#[tokio::test]
async fn upstreams_router_deployment_applies_and_rolls_out() {
    use std::os::unix::fs::PermissionsExt as _;
    require_kubectl!();
    let Some(manifest) = upstream_file("sandbox-router/deploy/deployment.yaml") else {
        return;
    };
    let scratch = tempfile::tempdir().unwrap();
    let stand_in = scratch.path().join("router-stand-in");
    std::fs::write(&stand_in, ROUTER_STAND_IN).unwrap();
    std::fs::set_permissions(&stand_in, std::fs::Permissions::from_mode(0o755)).unwrap();
    let config = SimConfig::default().isolation(Isolation::None).image(
        agent_sandbox_sim::ImageEntry::new(
            "*sandbox-router-go*",
            agent_sandbox_sim::Program::Path(stand_in),
        )
        .env("POD_IP", "{pod_ip}"),
    );
    let sim = Sim::start(config).await.unwrap();
    let kubectl = Kubectl::new(&sim);
    kubectl
        .ok(&["create", "namespace", "agent-sandbox-system"])
        .await;
    kubectl
        .ok(&[
            "create",
            "serviceaccount",
            "sandbox-router",
            "-n",
            "agent-sandbox-system",
        ])
        .await;
    let applied = kubectl
        .ok(&[
            "apply",
            "--server-side",
            "--field-manager=e2e",
            "-f",
            manifest.to_str().unwrap(),
        ])
        .await;
    assert_eq!(
        applied.trim(),
        "deployment.apps/sandbox-router serverside-applied"
    );
    let ns = ["-n", "agent-sandbox-system"];
    let rolled = kubectl
        .ok(&[
            &[
                "rollout",
                "status",
                "deployment/sandbox-router",
                "--timeout=90s",
            ],
            &ns[..],
        ]
        .concat())
        .await;
    assert!(rolled.contains("successfully rolled out"), "{rolled}");
    let get = |args: &'static [&'static str]| {
        let kubectl = &kubectl;
        async move { kubectl.ok(&[args, &ns[..]].concat()).await }
    };
    let table = get(&["get", "deployment", "sandbox-router", "--no-headers"]).await;
    let columns: Vec<&str> = table.split_whitespace().collect();
    assert_eq!(
        &columns[..4],
        ["sandbox-router", "2/2", "2", "2"],
        "{table}"
    );
    // One ReplicaSet, named and labelled by the template's hash and owned by the Deployment; its
    // pods carry the hash and are owned by it.
    let rs = get(&[
        "get",
        "replicasets",
        "-o",
        "jsonpath={range .items[*]}{.metadata.name} {.metadata.labels.pod-template-hash} {.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name} {.status.readyReplicas}{\"\\n\"}{end}",
    ])
    .await;
    let rows: Vec<&str> = rs.lines().collect();
    assert_eq!(rows.len(), 1, "{rs}");
    let fields: Vec<&str> = rows[0].split(' ').collect();
    assert_eq!(fields[0], format!("sandbox-router-{}", fields[1]), "{rs}");
    assert_eq!(&fields[2..], ["Deployment/sandbox-router", "2"], "{rs}");
    let pods = get(&[
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/name=sandbox-router",
        "-o",
        "jsonpath={range .items[*]}{.metadata.labels.pod-template-hash} {.metadata.ownerReferences[0].kind} {.status.phase}{\"\\n\"}{end}",
    ])
    .await;
    assert_eq!(
        pods.lines().collect::<Vec<_>>(),
        vec![format!("{} ReplicaSet Running", fields[1]); 2],
        "{pods}"
    );
    let conditions = get(&[
        "get",
        "deployment",
        "sandbox-router",
        "-o",
        "jsonpath={range .status.conditions[*]}{.type}={.status}/{.reason} {end}",
    ])
    .await;
    assert_eq!(
        conditions.trim(),
        "Available=True/MinimumReplicasAvailable Progressing=True/NewReplicaSetAvailable"
    );
    // A template change rolls out a second ReplicaSet, which replaces the first.
    kubectl
        .ok(&[
            &["set", "env", "deployment/sandbox-router", "LOG_LEVEL=debug"],
            &ns[..],
        ]
        .concat())
        .await;
    kubectl
        .ok(&[
            &[
                "rollout",
                "status",
                "deployment/sandbox-router",
                "--timeout=90s",
            ],
            &ns[..],
        ]
        .concat())
        .await;
    let sets = get(&[
        "get",
        "replicasets",
        "-o",
        "jsonpath={range .items[*]}{.metadata.annotations.deployment\\.kubernetes\\.io/revision}:{.spec.replicas} {end}",
    ])
    .await;
    let mut sets: Vec<&str> = sets.split_whitespace().collect();
    sets.sort_unstable();
    assert_eq!(sets, ["1:0", "2:2"]);
    let scaled = get(&["scale", "deployment", "sandbox-router", "--replicas=1"]).await;
    assert!(scaled.contains("scaled"), "{scaled}");
    kubectl
        .ok(&[
            &[
                "rollout",
                "status",
                "deployment/sandbox-router",
                "--timeout=90s",
            ],
            &ns[..],
        ]
        .concat())
        .await;
    // Deleting the Deployment takes its ReplicaSets and pods with it.
    get(&[
        "delete",
        "deployment",
        "sandbox-router",
        "--cascade=foreground",
    ])
    .await;
    let mut left = String::from("?");
    for _ in 0..200 {
        left = get(&["get", "replicasets,pods", "-o", "name"]).await;
        if left.trim().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(left.trim(), "", "left behind");
}

#[tokio::test]
async fn upstreams_gateway_manifest_gets_an_address_and_an_accepted_v1beta1_route() {
    require_kubectl!();
    let Some(manifest) =
        upstream_file("clients/python/agentic-sandbox-client/gateway-kind/gateway-kind.yaml")
    else {
        return;
    };
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let kubectl = Kubectl::new(&sim);
    let applied = kubectl
        .ok(&["apply", "--server-side", "-f", manifest.to_str().unwrap()])
        .await;
    assert_eq!(
        applied.lines().collect::<Vec<_>>(),
        [
            "gateway.gateway.networking.k8s.io/kind-gateway serverside-applied",
            "httproute.gateway.networking.k8s.io/sandbox-router-route serverside-applied"
        ]
    );
    kubectl
        .ok(&[
            "wait",
            "--for=condition=Programmed",
            "gateway/kind-gateway",
            "--timeout=30s",
        ])
        .await;
    let gateway = kubectl
        .ok(&[
            "get",
            "gateway",
            "kind-gateway",
            "-o",
            "jsonpath={.status.addresses[0].type} {.status.addresses[0].value} {.status.listeners[0].attachedRoutes}",
        ])
        .await;
    let fields: Vec<&str> = gateway.split(' ').collect();
    assert_eq!(fields[0], "IPAddress", "{gateway}");
    assert!(fields[1].parse::<std::net::Ipv4Addr>().is_ok(), "{gateway}");
    assert_eq!(fields[2], "1", "{gateway}");
    // The route is served in both versions; its backend Service does not exist yet.
    let route_status = |version: &'static str| {
        let kubectl = &kubectl;
        async move {
            kubectl
                .ok(&[
                    "get",
                    &format!("httproutes.{version}.gateway.networking.k8s.io"),
                    "sandbox-router-route",
                    "-o",
                    "jsonpath={.apiVersion} {range .status.parents[0].conditions[*]}{.type}={.status}/{.reason} {end}",
                ])
                .await
        }
    };
    assert_eq!(
        route_status("v1beta1").await.trim(),
        "gateway.networking.k8s.io/v1beta1 Accepted=True/Accepted ResolvedRefs=False/BackendNotFound"
    );
    // Sent as protobuf by kubectl.
    kubectl
        .ok(&[
            "create",
            "service",
            "clusterip",
            "sandbox-router-svc",
            "--tcp=8080:8080",
        ])
        .await;
    let mut resolved = String::new();
    for _ in 0..100 {
        resolved = route_status("v1").await;
        if resolved.contains("ResolvedRefs=True") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        resolved.trim(),
        "gateway.networking.k8s.io/v1 Accepted=True/Accepted ResolvedRefs=True/ResolvedRefs"
    );
}

/// A CRD of this test's own with CEL rules: one on create and update, one transition rule in
/// the shape of upstream's immutable `volumeClaimTemplates`.
const WIDGET_CRD: &str = r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              min: {type: integer}
              max: {type: integer}
              claims:
                type: array
                items: {type: string}
                x-kubernetes-list-type: atomic
            x-kubernetes-validations:
            - rule: self.min <= self.max
              message: min must not exceed max
            - rule: has(self.claims) == has(oldSelf.claims) && (!has(self.claims) || self.claims == oldSelf.claims)
              message: claims is immutable
          status:
            type: object
            properties:
              note: {type: string}
"#;

#[tokio::test]
async fn kubectl_writes_are_checked_against_crd_validation_rules() {
    require_kubectl!();
    let sim = Sim::start(SimConfig::default()).await.unwrap();
    let kubectl = Kubectl::new(&sim);
    let applied = kubectl
        .run_with_input(&["apply", "--server-side", "-f", "-"], Some(WIDGET_CRD))
        .await;
    assert!(applied.status.success(), "{applied:?}");
    kubectl
        .ok(&[
            "wait",
            "--for=condition=Established",
            "crd/widgets.example.com",
        ])
        .await;
    let widget = |min: i64, claims: &str| {
        format!(
            "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: w\nspec:\n  min: {min}\n  max: 5\n  claims: {claims}\n"
        )
    };
    let refused = kubectl
        .run_with_input(&["create", "-f", "-"], Some(&widget(9, "[a]")))
        .await;
    assert_eq!(
        String::from_utf8_lossy(&refused.stderr).trim(),
        "The Widget \"w\" is invalid: spec: Invalid value: \"object\": min must not exceed max"
    );
    let created = kubectl
        .run_with_input(
            &["apply", "--server-side", "-f", "-"],
            Some(&widget(1, "[a]")),
        )
        .await;
    assert!(created.status.success(), "{created:?}");
    // A change that keeps the claims is an update the transition rule allows.
    let raised = kubectl
        .run_with_input(
            &["apply", "--server-side", "-f", "-"],
            Some(&widget(2, "[a]")),
        )
        .await;
    assert!(raised.status.success(), "{raised:?}");
    let changed = kubectl
        .run_with_input(
            &["apply", "--server-side", "-f", "-"],
            Some(&widget(2, "[b]")),
        )
        .await;
    assert!(!changed.status.success());
    assert!(
        String::from_utf8_lossy(&changed.stderr)
            .contains("spec: Invalid value: \"object\": claims is immutable"),
        "{}",
        String::from_utf8_lossy(&changed.stderr)
    );
    // A status write leaves spec as it is: its rules are not checked again.
    let patched = kubectl
        .ok(&[
            "patch",
            "widget",
            "w",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"note":"fine"}}"#,
        ])
        .await;
    assert!(patched.contains("patched"), "{patched}");
    let stored = kubectl
        .ok(&[
            "get",
            "widget",
            "w",
            "-o",
            "jsonpath={.spec.min} {.spec.claims} {.status.note}",
        ])
        .await;
    assert_eq!(stored, r#"2 ["a"] fine"#);
}

#[tokio::test]
async fn kubectl_create_deployment_rolls_out_and_scales() {
    require_kubectl!();
    let sim = Sim::start(SimConfig::default().isolation(Isolation::None))
        .await
        .unwrap();
    let kubectl = Kubectl::new(&sim);
    // Sent as protobuf by kubectl.
    kubectl
        .ok(&[
            "create",
            "deployment",
            "hello",
            "--image=busybox",
            "--replicas=2",
            "--",
            "sleep",
            "1000",
        ])
        .await;
    let rolled = kubectl
        .ok(&["rollout", "status", "deployment/hello", "--timeout=60s"])
        .await;
    assert!(rolled.contains("successfully rolled out"), "{rolled}");
    kubectl
        .ok(&["scale", "deployment", "hello", "--replicas=3"])
        .await;
    kubectl
        .ok(&["rollout", "status", "deployment/hello", "--timeout=60s"])
        .await;
    let pods = kubectl
        .ok(&["get", "pods", "-l", "app=hello", "-o", "name"])
        .await;
    assert_eq!(pods.lines().count(), 3, "{pods}");
    let replicas = kubectl
        .ok(&[
            "get",
            "deployment",
            "hello",
            "-o",
            "jsonpath={.status.readyReplicas}/{.spec.replicas}",
        ])
        .await;
    assert_eq!(replicas, "3/3");
}
