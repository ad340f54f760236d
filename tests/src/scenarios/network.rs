//! The seed's network probe, from inside a sandbox: the Kubernetes API server's Service
//! address is blocked by the template's NetworkPolicy, a public address is reachable; its
//! gotcha 3 (a router outside the admitted namespace is dropped) and the additive fix; and the
//! host's files a sandbox must not see.

use std::time::Duration;

use agent_sandbox::CreateOptions;
use k8s_openapi::api::core::v1::Service;
use kube::Api;

use super::Verdict;
use crate::cluster::{ClusterUnderTest, NetworkEnforcement, SdkMode};
use crate::ensure;
use crate::error::{Error, Result};
use crate::support::RUN_LABEL;

/// A TCP connect with a timeout; prints `open`, `refused`, `timeout` or `error …`. With a third
/// argument, it tries again every half second for that many seconds until it is `open` (for a
/// new pod whose address the NetworkPolicy enforcer has yet to learn).
const PROBE: &str = r#"import socket,sys,time
host,port=sys.argv[1],int(sys.argv[2])
until=time.time()+(float(sys.argv[3]) if len(sys.argv)>3 else 0)
while True:
    s=socket.socket(socket.AF_INET6 if ':' in host else socket.AF_INET)
    s.settimeout(5)
    try:
        s.connect((host,port)); r='open'
    except socket.timeout:
        r='timeout'
    except OSError as e:
        r='refused' if e.errno==111 else 'error %s' % e
    s.close()
    if r=='open' or time.time()>=until:
        print(r); break
    time.sleep(0.5)
"#;

/// Whether a probe's outcome is a connection a NetworkPolicy stopped: dropped (`timeout`: our
/// nftables enforcement, kube-network-policies, most CNIs) or rejected (`refused`: kube-router
/// ends a pod's chain with REJECT). Not `open`, and not an error that says the network itself
/// is broken.
fn blocked(outcome: &str) -> bool {
    matches!(outcome, "timeout" | "refused")
}

/// A sandbox of the pool (through port-forward, expiring after 10 minutes, labelled with the
/// run), for the probe named `what`.
async fn claim(cluster: &ClusterUnderTest, what: &str) -> Result<agent_sandbox::Sandbox> {
    let client = cluster.sdk(SdkMode::PortForward).map_err(Error::Config)?;
    client
        .create_sandbox_with(
            &cluster.pool,
            CreateOptions::default()
                .label(RUN_LABEL, cluster.run.clone())
                .shutdown_after(Duration::from_secs(600)),
        )
        .await
        .map_err(Error::sdk(format!("claim a sandbox for {what}")))
}

/// The API server (Service `kubernetes` in `default`) is out of a sandbox's reach (dropped or
/// rejected, see [`blocked`]); the public address connects.
pub(super) async fn a_sandbox_cannot_reach_the_api_server_but_reaches_the_internet(
    cluster: &ClusterUnderTest,
) -> Result<Verdict> {
    if let NetworkEnforcement::NotEnforced(reason) = &cluster.network {
        return Ok(Verdict::Skipped(reason.clone()));
    }
    let services: Api<Service> = Api::namespaced(cluster.kube.clone(), "default");
    let api_ip = services
        .get("kubernetes")
        .await
        .map_err(Error::kube("get Service default/kubernetes"))?
        .spec
        .and_then(|s| s.cluster_ip)
        .ok_or_else(|| Error::Check("Service default/kubernetes has no cluster IP".to_owned()))?;
    let (public_host, public_port) = cluster.public_address.rsplit_once(':').ok_or_else(|| {
        Error::Config(format!(
            "{} must be HOST:PORT, not {:?}",
            crate::env::PUBLIC_ADDRESS,
            cluster.public_address
        ))
    })?;
    let sandbox = claim(cluster, "the network probe").await?;
    let outcome = async {
        sandbox
            .write("probe.py", PROBE.as_bytes().to_vec())
            .await
            .map_err(Error::sdk("write probe.py"))?;
        let api = sandbox
            .run(&format!("python3 probe.py {api_ip} 443"))
            .await
            .map_err(Error::sdk("probe the API server"))?;
        ensure!(
            blocked(api.stdout.trim()),
            "from the sandbox, the API server {api_ip}:443 answered {:?} (expected the \
             NetworkPolicy to drop or reject it; stderr {:?})",
            api.stdout.trim(),
            api.stderr
        );
        let public = sandbox
            .run(&format!("python3 probe.py {public_host} {public_port}"))
            .await
            .map_err(Error::sdk("probe the public address"))?;
        ensure!(
            public.stdout.trim() == "open",
            "from the sandbox, {} gave {:?} (expected open; stderr {:?})",
            cluster.public_address,
            public.stdout.trim(),
            public.stderr
        );
        Ok(())
    }
    .await;
    let _ = sandbox.close().await;
    outcome.map(|()| Verdict::Passed)
}

/// A sandbox reaches neither another sandbox (only the router is admitted to a sandbox) nor the
/// kubelet of its node. Controls make each "blocked" mean something: the other sandbox reaches
/// its own runtime port at its pod IP, and the kubelet's port answers this suite (where it can
/// reach the node at all; otherwise that half says so and proves nothing).
pub(super) async fn a_sandbox_reaches_neither_another_sandbox_nor_its_nodes_kubelet(
    cluster: &ClusterUnderTest,
) -> Result<Verdict> {
    use k8s_openapi::api::core::v1::{Node, Pod};
    if let NetworkEnforcement::NotEnforced(reason) = &cluster.network {
        return Ok(Verdict::Skipped(reason.clone()));
    }
    let prober = claim(cluster, "the probing sandbox").await?;
    let target = match claim(cluster, "the probed sandbox").await {
        Ok(target) => target,
        Err(error) => {
            let _ = prober.close().await;
            return Err(error);
        }
    };
    let outcome = async {
        let port = agent_sandbox_api::wire::RUNTIME_PORT;
        let target_ip = target
            .pod_ip()
            .ok_or_else(|| Error::Check("the probed sandbox has no pod IP".to_owned()))?
            .to_owned();
        for sandbox in [&prober, &target] {
            sandbox
                .write("probe.py", PROBE.as_bytes().to_vec())
                .await
                .map_err(Error::sdk("write probe.py"))?;
        }
        let own = target
            .run(&format!("python3 probe.py {target_ip} {port}"))
            .await
            .map_err(Error::sdk("probe its own runtime port"))?;
        ensure!(
            own.stdout.trim() == "open",
            "the probed sandbox does not reach its own runtime port {target_ip}:{port} ({:?}, \
             stderr {:?}): the check below would prove nothing",
            own.stdout.trim(),
            own.stderr
        );
        let across = prober
            .run(&format!("python3 probe.py {target_ip} {port}"))
            .await
            .map_err(Error::sdk("probe the other sandbox"))?;
        ensure!(
            blocked(across.stdout.trim()),
            "a sandbox reached another sandbox's runtime port {target_ip}:{port} ({:?}, stderr \
             {:?}); the template's policy admits only the router",
            across.stdout.trim(),
            across.stderr
        );
        // The kubelet of the prober's node, at the address and port the Node advertises.
        let pod = cluster
            .api::<Pod>()
            .get(prober.pod_name())
            .await
            .map_err(Error::kube("get the probing sandbox's pod"))?;
        let host_ip = pod.status.and_then(|s| s.host_ip).unwrap_or_default();
        let node_name = pod.spec.and_then(|s| s.node_name).unwrap_or_default();
        let node = Api::<Node>::all(cluster.kube.clone())
            .get(&node_name)
            .await
            .map_err(Error::kube(format!("get Node {node_name}")))?;
        let kubelet_port = node
            .status
            .and_then(|s| s.daemon_endpoints)
            .and_then(|d| d.kubelet_endpoint)
            .and_then(|e| u16::try_from(e.port).ok())
            .unwrap_or(10250);
        let reachable_here = tokio::time::timeout(
            Duration::from_secs(3),
            tokio::net::TcpStream::connect((host_ip.as_str(), kubelet_port)),
        )
        .await
        .is_ok_and(|connected| connected.is_ok());
        if !reachable_here {
            println!(
                "        the kubelet at {host_ip}:{kubelet_port} does not answer this suite \
                 either: whether a sandbox reaches it proves nothing here"
            );
            return Ok(());
        }
        let kubelet = prober
            .run(&format!("python3 probe.py {host_ip} {kubelet_port}"))
            .await
            .map_err(Error::sdk("probe the node's kubelet"))?;
        ensure!(
            blocked(kubelet.stdout.trim()),
            "a sandbox reached its node's kubelet at {host_ip}:{kubelet_port} ({:?}, stderr {:?})",
            kubelet.stdout.trim(),
            kubelet.stderr
        );
        Ok(())
    }
    .await;
    let _ = prober.close().await;
    let _ = target.close().await;
    outcome.map(|()| Verdict::Passed)
}

/// What a TCP connect from a new pod (in `namespace`, with `labels`) to `host:port` gives:
/// `open`, `refused` or `timeout`; with `patience`, tried again within it until `open`. The pod
/// is deleted afterwards.
async fn probe_from_pod(
    cluster: &ClusterUnderTest,
    namespace: &str,
    labels: serde_json::Value,
    (host, port): (&str, u16),
    patience: Duration,
) -> Result<String> {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{LogParams, PostParams};
    let pods: Api<Pod> = Api::namespaced(cluster.kube.clone(), namespace);
    let name = format!(
        "e2e-{}-probe-{:06x}",
        cluster.run,
        fastrand::u32(..) & 0xff_ffff
    );
    let mut labels = labels;
    labels[RUN_LABEL] = serde_json::json!(cluster.run);
    // The sandboxes' image has Python, and every node of the cluster can run it.
    let (image, pull_policy) = cluster.sandbox_image().await?;
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"restartPolicy": "Never", "containers": [{
            "name": "probe", "image": image, "imagePullPolicy": pull_policy,
            "command": ["python3", "-c", PROBE, host, port.to_string(),
                        patience.as_secs().to_string()]}]}
    }))
    .map_err(|e| Error::Check(format!("the probe pod: {e}")))?;
    pods.create(&PostParams::default(), &pod)
        .await
        .map_err(Error::kube("create the probe pod"))?;
    let finished = crate::support::wait_for(
        &format!("probe pod {namespace}/{name} to finish"),
        Duration::from_secs(60) + patience,
        || async {
            let pod = pods
                .get(&name)
                .await
                .map_err(Error::kube("get the probe pod"))?;
            let phase = pod.status.and_then(|s| s.phase).unwrap_or_default();
            Ok(if phase == "Succeeded" || phase == "Failed" {
                crate::support::Check::Done(())
            } else {
                crate::support::Check::NotYet(phase)
            })
        },
    )
    .await;
    let logs = pods.logs(&name, &LogParams::default()).await;
    let _ = pods.delete(&name, &Default::default()).await;
    finished?;
    Ok(logs
        .map_err(Error::kube("read the probe pod's log"))?
        .trim()
        .to_owned())
}

/// The seed's gotcha 3 at the network: a router pod outside the namespace the template's policy
/// admits is stopped (dropped, so it times out as the router's proxy would before answering 504;
/// or rejected by enforcers that do, see [`blocked`]), and an
/// additive policy admitting that namespace's router lets it through; other pods of that
/// namespace stay out.
pub(super) async fn a_router_outside_the_admitted_namespace_times_out_until_an_additive_policy_admits_it(
    cluster: &ClusterUnderTest,
) -> Result<Verdict> {
    use agent_sandbox_api::labels;
    use k8s_openapi::api::core::v1::Namespace;
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    use kube::api::PostParams;
    use serde_json::json;
    if let NetworkEnforcement::NotEnforced(reason) = &cluster.network {
        return Ok(Verdict::Skipped(reason.clone()));
    }
    let sandbox = claim(cluster, "the gotcha-3 probe").await?;
    // A name of its own on each pass: the last pass's may still be terminating.
    let outside = cluster.name("routers");
    let policy_name = format!("e2e-{}-admit-{outside}", cluster.run);
    let outcome = async {
        let ip = sandbox
            .pod_ip()
            .ok_or_else(|| Error::Check("the sandbox has no pod IP".to_owned()))?
            .to_owned();
        let namespace: Namespace = serde_json::from_value(json!({
            "metadata": {"name": outside, "labels": {RUN_LABEL: cluster.run}}
        }))
        .map_err(|e| Error::Check(format!("the namespace: {e}")))?;
        Api::<Namespace>::all(cluster.kube.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .map_err(Error::kube("create the routers' namespace"))?;
        let router = json!({labels::ROUTER_APP: labels::ROUTER_APP_VALUE});
        let port = agent_sandbox_api::wire::RUNTIME_PORT;
        let before = probe_from_pod(
            cluster,
            &outside,
            router.clone(),
            (&ip, port),
            Duration::ZERO,
        )
        .await?;
        ensure!(
            blocked(&before),
            "a router pod in {outside} reached the sandbox's runtime port ({before}); the \
             template's policy admits only {}",
            cluster.router.namespace
        );
        // The additive fix: admit the router pods of that namespace too.
        let policy: NetworkPolicy = serde_json::from_value(json!({
            "metadata": {"name": policy_name, "namespace": cluster.namespace,
                         "labels": {RUN_LABEL: cluster.run}},
            "spec": {
                "podSelector": {"matchLabels": {
                    labels::SANDBOX_NAME_HASH: agent_sandbox_api::name_hash(sandbox.sandbox_name())}},
                "policyTypes": ["Ingress"],
                "ingress": [{"from": [{
                    "namespaceSelector": {"matchLabels": {labels::NAMESPACE_NAME: outside}},
                    "podSelector": {"matchLabels": router}}],
                    "ports": [{"protocol": "TCP", "port": port}]}]
            }
        }))
        .map_err(|e| Error::Check(format!("the policy: {e}")))?;
        let policies: Api<NetworkPolicy> = cluster.api();
        policies
            .create(&PostParams::default(), &policy)
            .await
            .map_err(Error::kube("create the additive policy"))?;
        // The node applies it through a watch, and learns each new pod's address the same way:
        // a new router pod keeps trying for a while, as a long-lived router's next request would
        // succeed.
        let mut after = String::new();
        for _ in 0..2 {
            after = probe_from_pod(
                cluster,
                &outside,
                router.clone(),
                (&ip, port),
                Duration::from_secs(20),
            )
            .await?;
            if after == "open" {
                break;
            }
        }
        ensure!(
            after == "open",
            "with the additive policy, the router pod in {outside} still got {after:?}"
        );
        let other = probe_from_pod(
            cluster,
            &outside,
            json!({"app": "other"}),
            (&ip, port),
            Duration::ZERO,
        )
        .await?;
        ensure!(
            blocked(&other),
            "the additive policy admits router pods only, but another pod of {outside} got \
             {other:?}"
        );
        Ok(())
    }
    .await;
    let _ = Api::<NetworkPolicy>::namespaced(cluster.kube.clone(), &cluster.namespace)
        .delete(&policy_name, &Default::default())
        .await;
    let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(cluster.kube.clone())
        .delete(&outside, &Default::default())
        .await;
    let _ = sandbox.close().await;
    outcome.map(|()| Verdict::Passed)
}

/// Code in a sandbox cannot read the home directory of the user running the suite, the
/// kubeconfig it uses, or root's home: on a real cluster they are on another machine; on the
/// simulated cluster and the control-plane tier the node runs pods on this machine, and they
/// must still not be there.
pub(super) async fn a_sandbox_cannot_read_the_users_home_or_kubeconfig(
    cluster: &ClusterUnderTest,
) -> Result<Verdict> {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".to_owned());
    // A real container has its image's own `/root` and `/home`: what would leak is the host's,
    // so each host directory gets a canary file the sandbox must not list, and each host file
    // is compared by checksum with what the sandbox reads at the same path.
    let directories = [
        home.clone(),
        format!("{home}/.ssh"),
        format!("{home}/.kube"),
        "/root".to_owned(),
        "/home".to_owned(),
        env!("CARGO_MANIFEST_DIR").to_owned(),
    ];
    let files = [
        format!("{home}/.kube/config"),
        cluster.kubeconfig.display().to_string(),
    ];
    let canaries = Canaries::plant(&cluster.run, &directories);
    let sandbox = claim(cluster, "the home-directory probe").await?;
    let outcome = async {
        let mut script = String::new();
        for directory in &directories {
            let canary = canaries.name();
            script.push_str(&format!(
                "if ls -A '{directory}' 2>/dev/null | grep -qxF '{canary}'; then \
                 echo 'LEAK {directory}'; else echo blocked; fi\n"
            ));
        }
        for file in &files {
            // Absent on the host: nothing of the host's to read there.
            let Some(sum) = host_checksum(file).await else {
                script.push_str("echo blocked\n");
                continue;
            };
            script.push_str(&format!(
                "if [ \"$(cksum < '{file}' 2>/dev/null)\" = '{sum}' ]; then \
                 echo 'LEAK {file}'; else echo blocked; fi\n"
            ));
        }
        sandbox
            .write("probe.sh", script.into_bytes())
            .await
            .map_err(Error::sdk("write probe.sh"))?;
        let run = sandbox
            .run("sh probe.sh")
            .await
            .map_err(Error::sdk("probe the host's files"))?;
        ensure!(
            !run.stdout.contains("LEAK"),
            "from the sandbox: {} (stderr {:?})",
            run.stdout.trim(),
            run.stderr
        );
        ensure!(
            run.stdout.matches("blocked").count() == directories.len() + files.len(),
            "the probe printed {:?} (stderr {:?})",
            run.stdout,
            run.stderr
        );
        ensure!(
            canaries.planted() > 0,
            "no canary could be planted in any of {directories:?} on this host"
        );
        Ok(())
    }
    .await;
    let _ = sandbox.close().await;
    drop(canaries);
    outcome.map(|()| Verdict::Passed)
}

/// Empty files named `.agent-sandbox-canary-<run>` in the host's directories that exist and
/// are writable; removed when dropped (also when the scenario fails).
struct Canaries {
    name: String,
    planted: Vec<std::path::PathBuf>,
}

impl Canaries {
    fn plant(run: &str, directories: &[String]) -> Self {
        let name = format!(".agent-sandbox-canary-{run}");
        let planted = directories
            .iter()
            .map(|directory| std::path::Path::new(directory).join(&name))
            .filter(|path| {
                std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(path)
                    .is_ok()
            })
            .collect();
        Self { name, planted }
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn planted(&self) -> usize {
        self.planted.len()
    }
}

impl Drop for Canaries {
    fn drop(&mut self) {
        for path in &self.planted {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// `cksum < file` on the host, as the sandbox's `cksum` prints it; `None` when unreadable.
async fn host_checksum(file: &str) -> Option<String> {
    let input = std::fs::File::open(file).ok()?;
    let output = tokio::process::Command::new("cksum")
        .stdin(input)
        .output()
        .await
        .ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
}
