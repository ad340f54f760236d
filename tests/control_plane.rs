//! `deploy/` on a real Kubernetes API server: the CRDs, the RBAC and the manifests are applied
//! to the control plane that `cargo xtask tools` builds (etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler; no node), and the controller and the router run as
//! processes with the credentials of their own ServiceAccounts, not as cluster admin. What only
//! a real API server checks shows here: structural schemas and their pruning, server-side apply
//! with field managers, RBAC verbs, the status subresource, Events, leader election on a Lease.
//!
//! Without a node the pool's members stay Pending, and the reconcilers must still do all their
//! work up to that point without one error; with our kubelet joined as the one node (its own
//! credentials, as a real node's), a warm claim runs commands through the router.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use agent_sandbox::{ClientOptions, ConnectionMode, ExecOptions};
use agent_sandbox_api::{Sandbox, SandboxTemplate, SandboxWarmPool};
use agent_sandbox_e2e::control_plane::{ControlPlane, Tools};
use agent_sandbox_e2e::plane_target::{self, ControllerProcess};
use agent_sandbox_kubelet::{
    ApiServing, ImageTable, Isolation, Kubelet, KubeletConfig, Program, runtime_entry,
};
use agent_sandbox_local::testkit::{self, Tool, http};
use agent_sandbox_local::wait::{Check, Timeout, wait_for};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::Api;
use kube::ResourceExt;
use kube::api::{ListParams, LogParams};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _};

/// Within this, every step below happens on a machine of ours (usually in well under a tenth).
const STEP: Duration = Duration::from_secs(60);

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A process of ours, killed when the test ends however it ends; its log is printed when the
/// test fails.
struct Running(tokio::process::Child, PathBuf);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.start_kill();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.1).unwrap_or_default();
            eprintln!("--- {} ---\n{log}", self.1.display());
        }
    }
}

/// Waits until `look` returns `Some` (`None`: not yet, with what it saw), within [`STEP`].
async fn eventually<T, F, Fut>(what: &str, mut look: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let waited: Result<T, Timeout> = wait_for(what, STEP, || {
        let next = look();
        async move {
            Ok(match next.await {
                Ok(value) => Check::Done(value),
                Err(seen) => Check::NotYet(seen),
            })
        }
    })
    .await;
    waited.unwrap()
}

async fn ready(url: String, what: &str) {
    eventually(&format!("{what} to answer {url} with 200"), || {
        let url = url.clone();
        async move {
            match http::get(&url).await {
                Ok(response) if response.status == 200 => Ok(()),
                Ok(response) => Err(format!("status {}", response.status)),
                Err(error) => Err(error.to_string()),
            }
        }
    })
    .await;
}

/// What [`install`] leaves running: the controller and the router as processes of this test,
/// each with its own ServiceAccount's token.
struct Installation {
    controller: ControllerProcess,
    router: Running,
    router_url: String,
    signing_key: Vec<u8>,
}

/// `deploy/crds` and `deploy/base` applied as a user applies them, then the controller and the
/// router started with the credentials of their ServiceAccounts (what their ClusterRoles grant
/// must be all they need), both ready.
async fn install(plane: &ControlPlane) -> Installation {
    plane_target::apply_deploy(plane).await.unwrap();
    let controller = plane_target::start_controller(plane).await.unwrap();

    // The router watches Sandboxes and Pods cluster-wide, and is ready once both watches have
    // synced.
    let router_kubeconfig = plane
        .service_account_kubeconfig(
            "agent-sandbox-system",
            "sandbox-router",
            "router.kubeconfig",
        )
        .await
        .unwrap();
    let signing_key = b"0123456789abcdef0123456789abcdef".to_vec();
    let key = plane.dir().join("signing-key");
    std::fs::write(&key, &signing_key).unwrap();
    let router_port = free_port();
    let router_log = plane.dir().join("router.log");
    let router = Running(
        tokio::process::Command::new(testkit::router_binary().unwrap())
            .env("KUBECONFIG", &router_kubeconfig)
            .env("RUST_LOG", "info")
            .arg("--auth=scoped")
            .arg(format!("--signing-key-file={}", key.display()))
            .arg(format!("--listen=127.0.0.1:{router_port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&router_log).unwrap())
            .kill_on_drop(true)
            .spawn()
            .unwrap(),
        router_log,
    );
    let router_url = format!("http://127.0.0.1:{router_port}");
    ready(format!("{router_url}/readyz"), "the router").await;
    Installation {
        controller,
        router,
        router_url,
        signing_key,
    }
}

impl Installation {
    /// Nothing the controller or the router did was refused: no reconcile error counted, no
    /// error and no "forbidden" in their logs.
    async fn assert_nothing_refused(&self) {
        let metrics = self.controller.metrics_port();
        let scrape = http::get(&format!("http://127.0.0.1:{metrics}/metrics"))
            .await
            .unwrap()
            .text();
        let errors: Vec<&str> = scrape
            .lines()
            .filter(|line| {
                line.starts_with("agent_sandbox_reconcile_errors") && !line.ends_with(" 0")
            })
            .collect();
        let log = std::fs::read_to_string(self.controller.log()).unwrap_or_default();
        assert!(errors.is_empty(), "reconcile errors: {errors:?}\n{log}");
        for (what, log) in [
            ("controller", self.controller.log()),
            ("router", self.router.1.as_path()),
        ] {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            assert!(
                !text.to_ascii_lowercase().contains("forbidden"),
                "the {what} was refused something:\n{text}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deploy_installs_and_reconciles_on_a_real_api_server_with_its_own_rbac() {
    if testkit::missing(Tool::ControlPlane) {
        return;
    }
    let tools = Tools::in_dir(Tool::control_plane_dir().unwrap()).unwrap();
    let plane = ControlPlane::start(tools, "node-1").await.unwrap();
    let installation = install(&plane).await;
    let client = plane.client().await.unwrap();
    plane_target::apply_sandboxes(&plane, &client)
        .await
        .unwrap();

    let templates: Api<SandboxTemplate> = Api::namespaced(client.clone(), "default");
    assert!(
        templates
            .get_opt(testkit::TEMPLATE)
            .await
            .unwrap()
            .is_some()
    );
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), "default");
    eventually("the template's NetworkPolicy", || async {
        let found = policies.list(&ListParams::default()).await;
        match found.map(|list| list.items.len()) {
            Ok(count) if count >= 1 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let pool: Api<SandboxWarmPool> = Api::namespaced(client.clone(), "default");
    let replicas = pool.get(testkit::POOL).await.unwrap().spec.replicas;
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let want = usize::try_from(replicas).unwrap();
    eventually("the pool's members and their pods", || async {
        let sandboxes = sandboxes.list(&ListParams::default()).await;
        let pods = pods.list(&ListParams::default()).await;
        match (sandboxes, pods) {
            (Ok(s), Ok(p)) if s.items.len() == want && p.items.len() == want => Ok(()),
            (s, p) => Err(format!(
                "sandboxes {:?}, pods {:?}",
                s.map(|l| l.items.len()),
                p.map(|l| l.items.len())
            )),
        }
    })
    .await;
    let status = eventually("the pool's status", || async {
        match pool.get(testkit::POOL).await.map(|p| p.status) {
            Ok(Some(status)) if status.replicas == replicas => Ok(status),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(status.ready_replicas, 0, "no node, so no member is Ready");
    installation.assert_nothing_refused().await;
}

/// The whole path on a real control plane with our kubelet as its one node, joined with the
/// node's own credentials (`system:node:node-1`: the Node authorizer and NodeRestriction
/// apply): the Node registers Ready and renews its Lease, the pool's pods run on it and turn
/// Ready (pod IPs on loopback), a warm claim runs commands and moves files through the router,
/// and closing the claim removes its Sandbox and pod (kube-controller-manager's garbage
/// collector, then the kubelet's confirmation of the deletion).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_claim_runs_on_our_kubelet_through_the_router() {
    if testkit::missing(Tool::ControlPlane) {
        return;
    }
    let tools = Tools::in_dir(Tool::control_plane_dir().unwrap()).unwrap();
    let plane = ControlPlane::start(tools, "node-1").await.unwrap();
    let installation = install(&plane).await;
    let client = plane.client().await.unwrap();
    // deploy/base would also run the controller and the router as pods; here they run as the
    // processes above (as pods on this node: the next tier).
    plane_target::scale_deploy_base_to_zero(&plane)
        .await
        .unwrap();

    // The node. Pods run unconfined: the pods' directories are in this test's scratch
    // directory, which a confined pod (with its private /tmp) would not see.
    let runtime = testkit::workspace_binary("agent-sandbox-runtime", "sandbox-runtime").unwrap();
    let mut images = ImageTable::with_defaults();
    images.prepend(runtime_entry("*runtime*", Program::Path(runtime)));
    let credentials = plane.node().clone();
    let node = credentials.node.clone();
    let kubelet = Kubelet::new(
        plane.node_client().await.unwrap(),
        KubeletConfig {
            images,
            isolation: Isolation::None,
            // The kubelet API, which the API server calls for logs and port-forward.
            api: Some(ApiServing {
                listen: "127.0.0.1:0".parse().unwrap(),
                cert: credentials.serving_cert.clone(),
                key: credentials.serving_key.clone(),
                client_ca: credentials.client_ca.clone(),
            }),
            ..KubeletConfig::new(node.clone(), &plane.dir().join("kubelet"))
        },
    )
    .unwrap();
    kubelet.start().await.unwrap();
    // The kubelet API: TLS with the cluster's CA, and only for clients with a certificate its
    // client CA signed (the API server's kubelet-client certificate).
    let api = kubelet.api_addr().unwrap();
    let dir = plane.dir().to_path_buf();
    let (with, without) = tokio::task::spawn_blocking(move || {
        let client = Some((
            dir.join("apiserver-kubelet-client.crt"),
            dir.join("apiserver-kubelet-client.key"),
        ));
        (
            kubelet_get(api, &dir.join("ca.crt"), client),
            kubelet_get(api, &dir.join("ca.crt"), None),
        )
    })
    .await
    .unwrap();
    let with = String::from_utf8_lossy(&with.unwrap()).into_owned();
    assert!(
        with.starts_with("HTTP/1.1 200") && with.ends_with("ok"),
        "{with}"
    );
    assert!(
        without.is_err(),
        "answered without a client certificate: {without:?}"
    );
    let nodes: Api<Node> = Api::all(client.clone());
    eventually("our node to be Ready", || async {
        let found = nodes.get_opt(&node).await.map_err(|e| e.to_string())?;
        let ready = found
            .as_ref()
            .and_then(|n| n.status.as_ref())
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        if ready {
            Ok(())
        } else {
            Err(format!("{:?}", found.and_then(|n| n.status)))
        }
    })
    .await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let lease = leases.get(&node).await.unwrap();
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some(node.as_str())
    );

    plane_target::apply_sandboxes(&plane, &client)
        .await
        .unwrap();
    let pool: Api<SandboxWarmPool> = Api::namespaced(client.clone(), "default");
    let replicas = pool.get(testkit::POOL).await.unwrap().spec.replicas;
    eventually("every member of the pool Ready", || async {
        match pool.get(testkit::POOL).await.map(|p| p.status) {
            Ok(Some(status)) if status.ready_replicas == replicas => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for pod in pods.list(&ListParams::default()).await.unwrap() {
        let spec = pod.spec.clone().unwrap_or_default();
        let status = pod.status.clone().unwrap_or_default();
        assert_eq!(spec.node_name.as_deref(), Some(node.as_str()));
        assert_eq!(status.phase.as_deref(), Some("Running"), "{pod:?}");
        let ip = status.pod_ip.unwrap_or_default();
        assert!(ip.starts_with("127."), "pod IP {ip}");
    }

    // The kubelet API through the API server, as `kubectl logs` and `kubectl port-forward`
    // reach it: a member's log, and its runtime's port.
    let member = pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .first()
        .map(ResourceExt::name_any)
        .unwrap();
    let log = pods.logs(&member, &LogParams::default()).await.unwrap();
    assert!(log.contains("sandbox runtime listening on"), "{log}");
    let log = plane
        .kubectl(&["logs", "--namespace=default", "--tail=50", &member])
        .await
        .unwrap();
    assert!(log.contains("sandbox runtime listening on"), "{log}");
    let mut forwarder = pods.portforward(&member, &[8888]).await.unwrap();
    let mut stream = forwarder.take_stream(8888).unwrap();
    stream
        .write_all(b"GET /v1/health HTTP/1.1\r\nHost: pod\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(STEP, stream.read_to_end(&mut answer))
        .await
        .unwrap()
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    drop(stream);
    forwarder.abort();
    // kubectl's port-forward: WebSocket to the API server, which speaks SPDY to the kubelet.
    let mut forward = tokio::process::Command::new(plane.tools().path("kubectl"))
        .arg("--kubeconfig")
        .arg(plane.kubeconfig())
        .args(["port-forward", "--namespace=default", "--address=127.0.0.1"])
        .arg(format!("pod/{member}"))
        .arg(":8888")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(forward.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(STEP, lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap_or_default();
    // "Forwarding from 127.0.0.1:PORT -> 8888"
    let local = first
        .strip_prefix("Forwarding from ")
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("kubectl port-forward said {first:?}"))
        .to_owned();
    let health = http::get(&format!("http://{local}/v1/health"))
        .await
        .unwrap();
    assert_eq!(health.status, 200, "{}", health.text());
    forward.kill().await.unwrap();

    // A warm claim, straight to the router's URL, with a token minted per request.
    let sdk = agent_sandbox::Client::from_kube(
        client.clone(),
        ClientOptions::default()
            .namespace("default")
            .connection(ConnectionMode::direct(installation.router_url.clone()))
            .router_signing_key(installation.signing_key.clone())
            .sandbox_ready_timeout(STEP),
    );
    let sandbox = sdk.create_sandbox(testkit::POOL).await.unwrap();
    let answer = sandbox
        .run_with(ExecOptions::shell("echo hello; echo oops >&2; exit 3"))
        .await
        .unwrap();
    assert_eq!(
        (
            answer.stdout.as_str(),
            answer.stderr.as_str(),
            answer.exit_code
        ),
        ("hello\n", "oops\n", 3)
    );
    sandbox
        .write("notes/a.txt", b"written".to_vec())
        .await
        .unwrap();
    assert_eq!(&sandbox.read("notes/a.txt").await.unwrap()[..], b"written");
    let pod_name = sandbox.pod_name().to_owned();
    sandbox.close().await.unwrap();
    eventually("the claim's pod to be gone", || async {
        match pods.get_opt(&pod_name).await {
            Ok(None) => Ok(()),
            other => Err(format!("{:?}", other.map(|p| p.map(|p| p.status)))),
        }
    })
    .await;

    installation.assert_nothing_refused().await;
    kubelet.stop().await;
}

/// `GET /healthz` from the kubelet API at `addr` over TLS (trusting `ca`), with the client
/// certificate and key `client` or none; the raw answer.
fn kubelet_get(
    addr: std::net::SocketAddr,
    ca: &Path,
    client: Option<(PathBuf, PathBuf)>,
) -> std::io::Result<Vec<u8>> {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    use std::io::{Read as _, Write as _};
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let config = match client {
        Some((cert, key)) => builder
            .with_client_auth_cert(
                CertificateDer::pem_file_iter(&cert)
                    .unwrap()
                    .map(Result::unwrap)
                    .collect(),
                PrivateKeyDer::from_pem_file(&key).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    let name = ServerName::try_from("127.0.0.1").unwrap();
    let connection = rustls::ClientConnection::new(std::sync::Arc::new(config), name).unwrap();
    let socket = std::net::TcpStream::connect(addr)?;
    socket.set_read_timeout(Some(STEP))?;
    let mut tls = rustls::StreamOwned::new(connection, socket);
    tls.write_all(b"GET /healthz HTTP/1.1\r\nHost: kubelet\r\nConnection: close\r\n\r\n")?;
    let mut answer = Vec::new();
    tls.read_to_end(&mut answer)?;
    Ok(answer)
}
