//! Pods with networks of their own, tried from inside pods: the host's loopback services are
//! not theirs to reach, NetworkPolicies are enforced (dropped, not refused) and additive as on a
//! real cluster (the seed's gotcha 3 and its fix), the API server's Service is reachable only
//! where policy allows, and an address standing for the internet is reached.
//!
//! Each test runs in a network namespace it makes (it runs itself again under `unshare --net`):
//! the kubelet's bridge, its addresses and the "internet" namespace never touch the machine's
//! own network. Needs root, user namespaces, `ip`, `nft` and `unshare`; without them the tests say
//! so and skip (and fail under `CI=true`). The last test then drops root (`setpriv`) to run a
//! kubelet that is not root, whose pods' networks live in a namespace of its own, with
//! `slirp4netns` for their internet.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Stdio;
use std::time::Duration;

use agent_sandbox_local::testkit::{
    INTERNET_ADDRESS as INTERNET, Internet, Tool, missing, own_network_command,
};
use agent_sandbox_sim::{Isolation, PodNetworks, Sim, SimConfig};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, LogParams, PostParams};
use serde_json::{Value, json};

/// A bound for waits (not a speed assertion).
const PATIENCE: Duration = Duration::from_secs(60);
/// Set in the child run inside the test's own network namespace.
const INSIDE: &str = "AGENT_SANDBOX_TEST_OWN_NETWORK";

/// Runs test `name` again in a network namespace of its own and says whether to go on here
/// (`true` inside). Outside, waits for the child and fails with its output if it failed.
fn in_own_network(name: &str) -> bool {
    if std::env::var_os(INSIDE).is_some() {
        return true;
    }
    if missing(Tool::PodNetworks) {
        return false;
    }
    let output = own_network_command(std::env::current_exe().unwrap())
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(INSIDE, "1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "{name} in its own network namespace:\n{text}"
    );
    assert!(text.contains("1 passed"), "{text}");
    false
}

/// Set in the child run as an unprivileged user.
const NOT_ROOT: &str = "AGENT_SANDBOX_TEST_NOT_ROOT";
/// The user that child runs as (`nobody` on Debian).
const UNPRIVILEGED: &str = "65534";

/// Runs test `name` again, in a network and mount namespace of its own whose `/dev/net/tun` any
/// user may open (as on most distributions; a private node, so the machine's stays as it is),
/// with an internet of its own, as uid and gid [`UNPRIVILEGED`] without capabilities; says
/// whether to go on here (`true` in that last child).
fn as_user_not_root(name: &str) -> bool {
    if std::env::var_os(NOT_ROOT).is_some() {
        return true;
    }
    let exe = std::env::current_exe().unwrap();
    let run = |command: &mut std::process::Command, what: &str| {
        let output = command
            .args([name, "--exact", "--nocapture", "--test-threads=1"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(output.status.success(), "{name} {what}:\n{text}");
        assert!(text.contains("1 passed"), "{text}");
    };
    if std::env::var_os(INSIDE).is_none() {
        if missing(Tool::PodNetworks) || missing(Tool::Slirp4netns) {
            return false;
        }
        let script = "ip link set lo up && mount -t tmpfs -o mode=0755 tmpfs /dev/net && \
                      mknod -m 0666 /dev/net/tun c 10 200 && exec \"$0\" \"$@\"";
        run(
            std::process::Command::new("unshare")
                .args(["--net", "--mount", "--", "sh", "-c", script])
                .arg(&exe)
                .env(INSIDE, "1"),
            "in its own network namespace",
        );
        return false;
    }
    let _internet = Internet::start().unwrap();
    run(
        std::process::Command::new("setpriv")
            .args([
                &format!("--reuid={UNPRIVILEGED}"),
                &format!("--regid={UNPRIVILEGED}"),
                "--clear-groups",
                "--inh-caps=-all",
                "--",
            ])
            .arg(&exe)
            .env(NOT_ROOT, "1")
            .env("HOME", "/tmp")
            .env_remove("TMPDIR"),
        "as a user that is not root",
    );
    false
}

async fn sim() -> Sim {
    Sim::start(
        SimConfig::default()
            .isolation(Isolation::Confined)
            .pod_networks(PodNetworks::Own),
    )
    .await
    .unwrap()
}

async fn create(pods: &Api<Pod>, value: Value) -> Pod {
    let pod: Pod = serde_json::from_value(value).unwrap();
    let name = pod.metadata.name.clone().unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let pod = pods.get(&name).await.unwrap();
        let ready = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        if ready {
            return pod;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name}: {:?}",
            pod.status
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn ip(pod: &Pod) -> String {
    pod.status.as_ref().unwrap().pod_ip.clone().unwrap()
}

/// A pod (in `namespace`, with `labels`) whose container serves HTTP on 8888 and runs
/// `probe.py HOST PORT` when asked through its log-free stdin... (kept simple: a server).
fn server(namespace: &str, name: &str, labels: Value) -> Value {
    json!({
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"containers": [{"name": "main", "image": "python",
            "command": ["python3", "-m", "http.server", "--bind", "0.0.0.0", "8888"],
            "ports": [{"name": "http", "containerPort": 8888}],
            "readinessProbe": {"tcpSocket": {"port": 8888}, "periodSeconds": 1}}]}
    })
}

/// What a TCP connect from a new pod in `namespace` with `labels` to `host:port` gives:
/// `open`, `refused` or `timeout`.
async fn probe(
    client: &kube::Client,
    namespace: &str,
    labels: Value,
    host: &str,
    port: u16,
) -> String {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let name = format!("probe-{:08x}", fastrand::u32(..));
    let script = "import socket,sys\n\
        s=socket.socket()\ns.settimeout(2)\n\
        try:\n    s.connect((sys.argv[1],int(sys.argv[2]))); print('open')\n\
        except socket.timeout:\n    print('timeout')\n\
        except OSError as e:\n    print('refused' if e.errno==111 else 'error %s' % e)\n";
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "python",
            "command": ["python3", "-c", script, host, port.to_string()]}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let pod = pods.get(&name).await.unwrap();
        let phase = pod
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default();
        if phase == "Succeeded" || phase == "Failed" {
            let logs = pods.logs(&name, &LogParams::default()).await.unwrap();
            let _ = pods.delete(&name, &Default::default()).await;
            return logs.trim().to_owned();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name}: {:?}",
            pod.status
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Probes until the answer is `wanted` (policies take effect through a watch), at most a few
/// times; returns the last answer.
async fn probe_until(
    client: &kube::Client,
    namespace: &str,
    labels: Value,
    host: &str,
    port: u16,
    wanted: &str,
) -> String {
    let mut last = String::new();
    for _ in 0..5 {
        last = probe(client, namespace, labels.clone(), host, port).await;
        if last == wanted {
            break;
        }
    }
    last
}

async fn apply_policy(client: &kube::Client, value: Value) {
    let policy: NetworkPolicy = serde_json::from_value(value).unwrap();
    let namespace = policy.metadata.namespace.clone().unwrap();
    Api::<NetworkPolicy>::namespaced(client.clone(), &namespace)
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();
}

async fn namespace(client: &kube::Client, name: &str) {
    let ns: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    let _ = Api::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await;
}

/// The controller's default template policy (crates/controller/src/decide/network_policy.rs):
/// ingress only from the router in agent-sandbox-system, egress to public addresses only.
fn template_policy() -> Value {
    json!({
        "metadata": {"name": "python-sandbox-network-policy", "namespace": "default"},
        "spec": {
            "podSelector": {"matchLabels": {"sandbox": "yes"}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [{
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "agent-sandbox-system"}},
                "podSelector": {"matchLabels": {"app": "sandbox-router"}}}]}],
            "egress": [{"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": [
                "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
                "172.16.0.0/12", "192.168.0.0/16"]}}]}]
        }
    })
}

#[test]
fn network_policies_are_enforced_additive_and_dropped_not_refused() {
    if !in_own_network("network_policies_are_enforced_additive_and_dropped_not_refused") {
        return;
    }
    // A bridge a SIGKILLed kubelet left behind (its pid is gone): the next kubelet removes it.
    let dead = std::process::Command::new("true").spawn().unwrap();
    let dead_pid = dead.id();
    let _ = { dead }.wait();
    let ip_tool = |args: &[&str]| {
        std::process::Command::new("ip")
            .args(args)
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .success()
    };
    assert!(ip_tool(&["link", "add", "asbleftover", "type", "bridge"]));
    let alias = format!("agent-sandbox-kubelet-{dead_pid}");
    assert!(ip_tool(&["link", "set", "asbleftover", "alias", &alias]));
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let sim = sim().await;
        assert!(
            !ip_tool(&["link", "show", "asbleftover"]),
            "the dead kubelet's bridge is still there"
        );
        let client = sim.client().unwrap();
        namespace(&client, "agent-sandbox-system").await;
        apply_policy(&client, template_policy()).await;
        let pods: Api<Pod> = Api::default_namespaced(client.clone());
        let sandbox = create(&pods, server("default", "sandbox", json!({"sandbox": "yes"}))).await;
        let sandbox_ip = ip(&sandbox);
        let router = json!({"app": "sandbox-router"});
        // The admitted router gets through; a router in the sandboxes' namespace (gotcha 3)
        // and any other pod time out: dropped, not refused.
        assert_eq!(
            probe_until(&client, "agent-sandbox-system", router.clone(), &sandbox_ip, 8888, "open").await,
            "open"
        );
        assert_eq!(probe(&client, "default", router.clone(), &sandbox_ip, 8888).await, "timeout");
        assert_eq!(probe(&client, "default", json!({}), &sandbox_ip, 8888).await, "timeout");
        // The additive fix (deploy/sandboxes/namespace-router): the same-namespace router too.
        apply_policy(
            &client,
            json!({
                "metadata": {"name": "sandbox-router-same-namespace", "namespace": "default"},
                "spec": {"podSelector": {"matchLabels": {"sandbox": "yes"}},
                         "policyTypes": ["Ingress"],
                         "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "sandbox-router"}}}],
                                      "ports": [{"protocol": "TCP", "port": 8888}]}]}
            }),
        )
        .await;
        assert_eq!(
            probe_until(&client, "default", router.clone(), &sandbox_ip, 8888, "open").await,
            "open"
        );
        assert_eq!(probe(&client, "default", json!({}), &sandbox_ip, 8888).await, "timeout");
        // The node itself (probes, port-forward, a router on the host) always reaches pods.
        assert!(std::net::TcpStream::connect((sandbox_ip.as_str(), 8888)).is_ok());
        // Policies follow label changes: a pod no policy selects, then labelled as a sandbox.
        let late = create(&pods, server("default", "late", json!({}))).await;
        let late_ip = ip(&late);
        assert_eq!(probe(&client, "default", json!({}), &late_ip, 8888).await, "open");
        let patch = json!({"metadata": {"labels": {"sandbox": "yes"}}});
        pods.patch("late", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch))
            .await
            .unwrap();
        assert_eq!(
            probe_until(&client, "default", json!({}), &late_ip, 8888, "timeout").await,
            "timeout"
        );
        sim.stop().await;
    });
}

#[test]
fn a_sandbox_reaches_the_internet_but_not_the_api_server_or_the_hosts_services() {
    if !in_own_network(
        "a_sandbox_reaches_the_internet_but_not_the_api_server_or_the_hosts_services",
    ) {
        return;
    }
    let _internet = Internet::start().unwrap();
    // A service of the host's: on its loopback and on every address.
    let loopback = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let loopback_port = loopback.local_addr().unwrap().port();
    let everywhere = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let everywhere_port = everywhere.local_addr().unwrap().port();
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let sim = sim().await;
        let client = sim.client().unwrap();
        apply_policy(&client, template_policy()).await;
        let pods: Api<Pod> = Api::default_namespaced(client.clone());
        let other = create(&pods, server("default", "other", json!({}))).await;
        let gateway = {
            let octets: Vec<u8> = ip(&other).split('.').map(|o| o.parse().unwrap()).collect();
            format!("{}.{}.{}.1", octets[0], octets[1], octets[2])
        };
        let sandbox = json!({"sandbox": "yes"});
        let api = agent_sandbox_sim::KUBERNETES_SERVICE_IP.to_string();
        // From a sandbox: the internet yes; the API server's Service, the host's services (on
        // the node's address) and other pods no, silently.
        assert_eq!(
            probe(&client, "default", sandbox.clone(), INTERNET, 80).await,
            "open"
        );
        assert_eq!(
            probe(&client, "default", sandbox.clone(), &api, 443).await,
            "timeout"
        );
        assert_eq!(
            probe(
                &client,
                "default",
                sandbox.clone(),
                &gateway,
                everywhere_port
            )
            .await,
            "timeout"
        );
        assert_eq!(
            probe(&client, "default", sandbox.clone(), &ip(&other), 8888).await,
            "timeout"
        );
        // The host's loopback is not the pod's: nothing listens on the pod's own.
        assert_eq!(
            probe(
                &client,
                "default",
                sandbox.clone(),
                "127.0.0.1",
                loopback_port
            )
            .await,
            "refused"
        );
        // A pod no policy selects (a router) reaches the API server through its Service.
        assert_eq!(
            probe(&client, "default", json!({}), &api, 443).await,
            "open"
        );
        sim.stop().await;
    });
    drop((loopback, everywhere));
}

#[test]
fn without_root_pods_get_networks_of_their_own_in_a_namespace_of_the_kubelets() {
    if !as_user_not_root(
        "without_root_pods_get_networks_of_their_own_in_a_namespace_of_the_kubelets",
    ) {
        return;
    }
    let uid = std::fs::read_to_string("/proc/self/status").unwrap();
    assert!(
        uid.lines()
            .any(|l| l.starts_with("Uid:") && l.contains(UNPRIVILEGED)),
        "{uid}"
    );
    let interfaces = || -> Vec<String> {
        std::fs::read_dir("/sys/class/net")
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    };
    let before = interfaces();
    // A service of the host's on its loopback.
    let loopback = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let loopback_port = loopback.local_addr().unwrap().port();
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let sim = sim().await;
        let protections = sim.protections().clone();
        assert_eq!(protections.network, None, "{}", protections.summary());
        assert_eq!(protections.internet, None, "{}", protections.summary());
        assert!(!protections.host_ids);
        let client = sim.client().unwrap();
        namespace(&client, "agent-sandbox-system").await;
        apply_policy(&client, template_policy()).await;
        let pods: Api<Pod> = Api::default_namespaced(client.clone());
        // Ready: the kubelet's probe reached it through the node namespace.
        let sandbox = create(
            &pods,
            server("default", "sandbox", json!({"sandbox": "yes"})),
        )
        .await;
        let sandbox_ip = ip(&sandbox);
        let router = json!({"app": "sandbox-router"});
        assert_eq!(
            probe_until(
                &client,
                "agent-sandbox-system",
                router.clone(),
                &sandbox_ip,
                8888,
                "open"
            )
            .await,
            "open"
        );
        assert_eq!(
            probe(&client, "default", json!({}), &sandbox_ip, 8888).await,
            "timeout"
        );
        let sandboxed = json!({"sandbox": "yes"});
        let api = agent_sandbox_sim::KUBERNETES_SERVICE_IP.to_string();
        assert_eq!(
            probe(&client, "default", sandboxed.clone(), INTERNET, 80).await,
            "open"
        );
        assert_eq!(
            probe(&client, "default", sandboxed.clone(), &api, 443).await,
            "timeout"
        );
        // The host's loopback: not the pod's own, and not through slirp4netns's alias for it
        // (10.0.2.2), even for a pod no policy selects.
        assert_eq!(
            probe(
                &client,
                "default",
                sandboxed.clone(),
                "127.0.0.1",
                loopback_port
            )
            .await,
            "refused"
        );
        assert_ne!(
            probe(&client, "default", json!({}), "10.0.2.2", loopback_port).await,
            "open"
        );
        // A pod no policy selects reaches the API server through its Service.
        assert_eq!(
            probe(&client, "default", json!({}), &api, 443).await,
            "open"
        );
        // The host's network is untouched: no bridge here, no route to pods; the kubelet's
        // sockets reach them.
        assert_eq!(interfaces(), before);
        let addr: std::net::SocketAddr = format!("{sandbox_ip}:8888").parse().unwrap();
        assert!(
            tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(addr))
                .await
                .map_or(true, |connected| connected.is_err())
        );
        let sockets = sim
            .pod_sockets()
            .expect("pods are in the kubelet's namespace");
        assert!(sockets(addr.ip()).unwrap().connect(addr).await.is_ok());
        drop(sockets);
        sim.stop().await;
    });
    // slirp4netns and the helper end with the kubelet.
    let children = || -> Vec<String> {
        let me = std::process::id().to_string();
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|entry| {
                let stat = std::fs::read_to_string(entry.ok()?.path().join("stat")).ok()?;
                let after = stat.rsplit_once(") ")?.1;
                (after.split_whitespace().nth(1)? == me).then_some(stat)
            })
            .collect()
    };
    let deadline = std::time::Instant::now() + PATIENCE;
    while !children().is_empty() {
        assert!(std::time::Instant::now() < deadline, "{:?}", children());
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(loopback);
}
