//! What code in a pod can reach of the machine under bubblewrap, tried from inside pods as an
//! LLM's code would: the host's home directories, the kubeconfig, the checkout, another pod's
//! directory, `/var` and credentials in `/etc` are absent; the processes are an unprivileged
//! user in a user namespace with no capabilities, `no_new_privs` and the seccomp filter, each
//! pod with a host uid of its own (as root); and a container's memory and CPU limits and the
//! node's process limit are enforced by its control group.
//!
//! Run as root (CI is): with fewer rights some protections do not exist, which the test
//! reports (and fails under `CI=true`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use agent_sandbox_local::testkit::{Tool, missing};
use agent_sandbox_sim::{Isolation, Sim, SimConfig};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, LogParams, PostParams};
use serde_json::{Value, json};

/// A bound for waits (not a speed assertion).
const PATIENCE: Duration = Duration::from_secs(60);

async fn wait_phase(pods: &Api<Pod>, name: &str, wanted: &[&str]) -> Pod {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let pod = pods.get(name).await.unwrap();
        let phase = pod
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default();
        if wanted.contains(&phase.as_str()) {
            return pod;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "pod {name} still {phase:?}: {:?}",
            pod.status
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn run(pods: &Api<Pod>, name: &str, container: Value) -> (Pod, String) {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"restartPolicy": "Never", "containers": [container]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let pod = wait_phase(pods, name, &["Succeeded", "Failed"]).await;
    let logs = pods.logs(name, &LogParams::default()).await.unwrap();
    (pod, logs)
}

/// A sim whose pods run in bubblewrap, or `None` (said why) where it cannot.
async fn sim() -> Option<(Sim, tempfile::TempDir)> {
    if missing(Tool::Bubblewrap) {
        return None;
    }
    let data = tempfile::tempdir().unwrap();
    let sim = Sim::start(
        SimConfig::default()
            .isolation(Isolation::Bwrap)
            .data_dir(data.path()),
    )
    .await
    .unwrap();
    // Everything but the network (crates/kubelet/tests/network.rs, in namespaces of its own).
    let protections = agent_sandbox_sim::Protections {
        network: None,
        ..sim.protections().clone()
    };
    let missing = protections.missing();
    if !missing.is_empty() {
        let message = format!(
            "pods here lack: {} (run as root with user namespaces enabled)",
            missing.join("; ")
        );
        assert!(std::env::var_os("CI").is_none(), "{message}");
        eprintln!("skipping: {message}");
        return None;
    }
    Some((sim, data))
}

#[tokio::test]
async fn a_pod_cannot_read_home_directories_the_kubeconfig_the_checkout_or_another_pod() {
    let Some((sim, data)) = sim().await else {
        return;
    };
    let pods: Api<Pod> = Api::default_namespaced(sim.client().unwrap());
    // A neighbour with a file in its directory.
    let neighbour: Pod = serde_json::from_value(json!({
        "metadata": {"name": "neighbour"},
        "spec": {"containers": [{"name": "main", "image": "busybox",
            "command": ["sh", "-c", "echo private > $HOME/secret; sleep 60"]}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &neighbour)
        .await
        .unwrap();
    let neighbour = wait_phase(&pods, "neighbour", &["Running"]).await;
    let uid = neighbour.metadata.uid.unwrap();
    let neighbour_dir = data
        .path()
        .join(format!("pods/default/neighbour-{uid}/app"));
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !neighbour_dir.join("secret").exists() {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".to_owned());
    let targets = [
        ("home", home.clone()),
        ("kubeconfig", sim.kubeconfig_path().display().to_string()),
        (
            "neighbour",
            neighbour_dir.join("secret").display().to_string(),
        ),
        ("data", data.path().display().to_string()),
        ("checkout", env!("CARGO_MANIFEST_DIR").to_owned()),
        ("kube", format!("{home}/.kube")),
        ("ssh", format!("{home}/.ssh")),
        ("root", "/root".to_owned()),
        ("homes", "/home".to_owned()),
        ("var", "/var/lib".to_owned()),
        ("shadow", "/etc/shadow".to_owned()),
        ("sshd", "/etc/ssh".to_owned()),
        ("run", "/run".to_owned()),
        ("opt", "/opt".to_owned()),
    ];
    let mut script = String::from(
        "try() { if ls -d \"$2\" >/dev/null 2>&1 || cat \"$2\" >/dev/null 2>&1; then \
         echo \"LEAK $1 $2\"; else echo \"blocked $1\"; fi; }\n",
    );
    let mut env = Vec::new();
    for (index, (label, path)) in targets.iter().enumerate() {
        script.push_str(&format!("try {label} \"$T{index}\"\n"));
        env.push(json!({"name": format!("T{index}"), "value": path}));
    }
    // What the image provides is there.
    script.push_str("python3 -c 'print(6*7)'; ls /usr/bin/env >/dev/null && echo usr-visible\n");
    let (pod, logs) = run(
        &pods,
        "prober",
        json!({"name": "main", "image": "busybox", "command": ["sh", "-c", script], "env": env}),
    )
    .await;
    assert!(!logs.contains("LEAK"), "{logs}");
    for (label, _) in &targets {
        assert!(
            logs.contains(&format!("blocked {label}\n")),
            "{label}: {logs}"
        );
    }
    assert!(logs.ends_with("42\nusr-visible\n"), "{logs}");
    assert_eq!(
        pod.status.unwrap().phase.as_deref(),
        Some("Succeeded"),
        "{logs}"
    );
    sim.stop().await;
}

#[tokio::test]
async fn pod_processes_are_an_unprivileged_user_without_capabilities_under_seccomp() {
    let Some((sim, data)) = sim().await else {
        return;
    };
    let pods: Api<Pod> = Api::default_namespaced(sim.client().unwrap());
    let script = "id -u; id -g; \
        grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status | tr -d '\\t'; \
        unshare -U true 2>/dev/null && echo LEAK-userns || echo no-user-namespace; \
        unshare -n true 2>/dev/null && echo LEAK-netns || echo no-network-namespace; \
        mount -t tmpfs none /tmp 2>/dev/null && echo LEAK-mount || echo no-mount; \
        touch /app/mine && echo pod-dir-writable; \
        touch /usr/new 2>/dev/null && echo LEAK-usr || echo usr-read-only; \
        grep -c sandbox /etc/passwd";
    let container = |uid: Option<u32>| {
        let mut c = json!({"name": "main", "image": "busybox", "command": ["sh", "-c", script]});
        if let Some(uid) = uid {
            c["securityContext"] = json!({"runAsUser": uid, "runAsGroup": uid + 1});
        }
        c
    };
    let (default_pod, default_logs) = run(&pods, "default-user", container(None)).await;
    let (chosen_pod, chosen_logs) = run(&pods, "chosen-user", container(Some(2000))).await;
    let lines = |logs: &str| logs.lines().map(str::to_owned).collect::<Vec<_>>();
    let default_lines = lines(&default_logs);
    let chosen_lines = lines(&chosen_logs);
    assert_eq!(default_lines[..2], ["1000", "1000"], "{default_logs}");
    assert_eq!(chosen_lines[..2], ["2000", "2001"], "{chosen_logs}");
    for (logs, lines) in [
        (&default_logs, &default_lines),
        (&chosen_logs, &chosen_lines),
    ] {
        assert_eq!(
            lines[2..6],
            [
                "CapEff:0000000000000000",
                "CapBnd:0000000000000000",
                "NoNewPrivs:1",
                "Seccomp:2"
            ],
            "{logs}"
        );
        assert!(!logs.contains("LEAK"), "{logs}");
        for wanted in [
            "no-user-namespace",
            "no-network-namespace",
            "no-mount",
            "pod-dir-writable",
            "usr-read-only",
        ] {
            assert!(lines.iter().any(|l| l == wanted), "{wanted}: {logs}");
        }
    }
    // Each pod is a host uid of its own, far from any real user's: the owner of what it wrote.
    let owner = |name: &str, pod: &Pod| {
        use std::os::unix::fs::MetadataExt as _;
        let uid = pod.metadata.uid.clone().unwrap();
        let file = data
            .path()
            .join(format!("pods/default/{name}-{uid}/app/mine"));
        std::fs::metadata(&file).unwrap().uid()
    };
    let (a, b) = (
        owner("default-user", &default_pod),
        owner("chosen-user", &chosen_pod),
    );
    assert_ne!(a, b);
    assert!(a >= 0x7000_0000 && b >= 0x7000_0000, "{a} {b}");
    sim.stop().await;
}

#[tokio::test]
async fn memory_and_cpu_limits_are_enforced_by_the_containers_control_group() {
    let Some((sim, _data)) = sim().await else {
        return;
    };
    let pods: Api<Pod> = Api::default_namespaced(sim.client().unwrap());
    // Allocates and touches 256 MiB under a 64 MiB limit.
    let (pod, logs) = run(
        &pods,
        "hungry",
        json!({"name": "main", "image": "python",
               "command": ["python3", "-c", "x = b'x' * (256 << 20); print('survived')"],
               "resources": {"limits": {"memory": "64Mi", "cpu": "500m"}}}),
    )
    .await;
    assert!(!logs.contains("survived"), "{logs}");
    let status = pod.status.unwrap();
    assert_eq!(status.phase.as_deref(), Some("Failed"));
    let terminated = status.container_statuses.unwrap()[0]
        .state
        .as_ref()
        .and_then(|s| s.terminated.clone())
        .unwrap();
    assert_eq!(
        terminated.reason.as_deref(),
        Some("OOMKilled"),
        "{terminated:?} {logs}"
    );
    // Within its limit the same program runs.
    let (pod, logs) = run(
        &pods,
        "fed",
        json!({"name": "main", "image": "python",
               "command": ["python3", "-c", "x = b'x' * (16 << 20); print('survived')"],
               "resources": {"limits": {"memory": "128Mi"}}}),
    )
    .await;
    assert_eq!(logs, "survived\n");
    assert_eq!(pod.status.unwrap().phase.as_deref(), Some("Succeeded"));
    // The CPU quota and the process limit, as the group holds them while the container runs.
    let sleeper: Pod = serde_json::from_value(json!({
        "metadata": {"name": "sleeper"},
        "spec": {"containers": [{"name": "main", "image": "busybox",
            "command": ["sleep", "60"], "resources": {"limits": {"cpu": "250m"}}}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &sleeper).await.unwrap();
    let sleeper = wait_phase(&pods, "sleeper", &["Running"]).await;
    let uid = sleeper.metadata.uid.unwrap();
    let found = cgroup_files(&uid);
    assert!(
        found
            .iter()
            .any(|(file, value)| file.ends_with("cpu.cfs_quota_us") && value == "25000")
            || found
                .iter()
                .any(|(file, value)| file.ends_with("cpu.max") && value == "25000 100000"),
        "{found:?}"
    );
    assert!(
        found
            .iter()
            .any(|(file, value)| file.ends_with("pids.max") && value == "4096"),
        "{found:?}"
    );
    pods.delete("sleeper", &Default::default()).await.unwrap();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !cgroup_files(&uid).is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the control group of pod {uid} outlived its container"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    sim.stop().await;
}

/// The limit files of container `main` of pod `uid` (in a group below this process's own
/// groups, in the kubelet's), with their values.
fn cgroup_files(uid: &str) -> Vec<(String, String)> {
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let mut found = Vec::new();
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next(), parts.next().unwrap(), parts.next().unwrap());
        let mount = if controllers.is_empty() {
            "/sys/fs/cgroup".to_owned()
        } else {
            format!("/sys/fs/cgroup/{controllers}")
        };
        let own = std::path::Path::new(&mount).join(path.trim_start_matches('/'));
        let prefix = format!("agent-sandbox-{}-", std::process::id());
        let Some(dir) = std::fs::read_dir(&own)
            .into_iter()
            .flatten()
            .flatten()
            .find_map(|e| {
                let kubelet = e.file_name().to_string_lossy().starts_with(&prefix);
                let dir = e.path().join(format!("{uid}-main"));
                (kubelet && dir.is_dir()).then_some(dir)
            })
        else {
            continue;
        };
        for file in [
            "cpu.cfs_quota_us",
            "cpu.max",
            "pids.max",
            "memory.limit_in_bytes",
        ] {
            if let Ok(value) = std::fs::read_to_string(dir.join(file)) {
                found.push((
                    dir.join(file).display().to_string(),
                    value.trim().to_owned(),
                ));
            }
        }
    }
    found
}

#[tokio::test]
async fn strict_isolation_refuses_to_start_without_every_protection() {
    if missing(Tool::Bubblewrap) {
        return;
    }
    // Without a network of their own (the sim's default), pods would lack one protection.
    let error = Sim::start(SimConfig::default().isolation(Isolation::Strict))
        .await
        .unwrap_err();
    let mut text = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    assert!(text.contains("strict isolation"), "{text}");
    assert!(text.contains("a network of their own"), "{text}");
    assert!(error.is_configuration(), "{text}");
}
