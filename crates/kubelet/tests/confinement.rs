//! What code in a confined pod can reach of the machine, tried from inside pods as an LLM's
//! code would: the host's home directories, the kubeconfig, the checkout, another pod's
//! directory, `/var` and credentials in `/etc` are absent, and so are the host's processes;
//! the processes are an unprivileged user in a user namespace with no capabilities,
//! `no_new_privs` and the seccomp filter, each pod with a host uid of its own (as root), the
//! container's program PID 1 of its own namespace; a pod's storage is capped by its
//! ephemeral-storage limit and gone with the pod; an exec probe runs inside the container; and
//! a container's memory and CPU limits and the node's process limit are enforced by its
//! control group.
//!
//! Run as root (CI is): with fewer rights some protections do not exist, which the test
//! reports (and fails under `CI=true`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use agent_sandbox_local::testkit::{Tool, missing};
use agent_sandbox_sim::{Isolation, PodNetworks, Sim, SimConfig};
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
    run_with(pods, name, container, json!([])).await
}

/// The volumes of a pod that mounts claim `shared` at `/claim`.
const CLAIM: fn() -> Value =
    || json!([{"name": "shared", "persistentVolumeClaim": {"claimName": "shared"}}]);

/// [`run`] with the pod's `volumes`.
async fn run_with(pods: &Api<Pod>, name: &str, container: Value, volumes: Value) -> (Pod, String) {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"restartPolicy": "Never", "containers": [container], "volumes": volumes}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let pod = wait_phase(pods, name, &["Succeeded", "Failed"]).await;
    let logs = pods.logs(name, &LogParams::default()).await.unwrap();
    (pod, logs)
}

/// A sim whose pods are confined, or `None` (said why) where it cannot be.
async fn sim() -> Option<(Sim, tempfile::TempDir)> {
    if missing(Tool::Confinement) {
        return None;
    }
    let data = tempfile::tempdir().unwrap();
    let sim = Sim::start(
        SimConfig::default()
            .isolation(Isolation::Confined)
            .data_dir(data.path()),
    )
    .await
    .unwrap();
    // Pods have loopback only (the sim's default); networks on a bridge are
    // crates/kubelet/tests/network.rs's, in namespaces of its own.
    let protections = sim.protections().clone();
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
    // A neighbour with a file in its directory (its storage, mounted on this host path in
    // its own mount namespace only).
    let neighbour: Pod = serde_json::from_value(json!({
        "metadata": {"name": "neighbour"},
        "spec": {"containers": [{"name": "main", "image": "busybox",
            "command": ["sh", "-c", "echo private > $HOME/secret && echo written; sleep 60"]}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &neighbour)
        .await
        .unwrap();
    let neighbour = wait_phase(&pods, "neighbour", &["Running"]).await;
    let uid = neighbour.metadata.uid.unwrap();
    let neighbour_dir = data
        .path()
        .join(format!("pods/default/neighbour-{uid}/storage/app"));
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !pods
        .logs("neighbour", &LogParams::default())
        .await
        .unwrap()
        .contains("written")
    {
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
    // No host process is in sight: PID 1 is the container's own program, and only the
    // container's few processes are there.
    script.push_str(
        "case \"$(tr '\\0' ' ' < /proc/1/cmdline)\" in */sh' -c '*) echo own-pid-1;; \
         *) echo LEAK pid-1;; esac\n\
         [ \"$(ls /proc | grep -c '^[0-9]')\" -lt 10 ] || echo LEAK host-processes\n",
    );
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
    assert!(logs.ends_with("own-pid-1\n42\nusr-visible\n"), "{logs}");
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
        touch /claim/$(hostname) && echo claim-writable; \
        touch /usr/new 2>/dev/null && echo LEAK-usr || echo usr-read-only; \
        grep -c sandbox /etc/passwd";
    let container = |uid: Option<u32>| {
        let mut c = json!({"name": "main", "image": "busybox", "command": ["sh", "-c", script],
            "volumeMounts": [{"name": "shared", "mountPath": "/claim"}]});
        if let Some(uid) = uid {
            c["securityContext"] = json!({"runAsUser": uid, "runAsGroup": uid + 1});
        }
        c
    };
    let (default_pod, default_logs) =
        run_with(&pods, "default-user", container(None), CLAIM()).await;
    let (chosen_pod, chosen_logs) =
        run_with(&pods, "chosen-user", container(Some(2000)), CLAIM()).await;
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
            "claim-writable",
            "usr-read-only",
        ] {
            assert!(lines.iter().any(|l| l == wanted), "{wanted}: {logs}");
        }
    }
    // Each pod is a host uid of its own, far from any real user's: the owner of what it wrote
    // in the claim both mount. The claim's directory belongs to the namespace's group, which
    // both pods have (what they write there gets it too), so neither locks the other out.
    use std::os::unix::fs::MetadataExt as _;
    let claim = data.path().join("volumes/default/shared");
    let owner = |name: &str| std::fs::metadata(claim.join(name)).unwrap();
    let (a, b) = (owner("default-user"), owner("chosen-user"));
    assert_ne!(a.uid(), b.uid());
    assert!(
        a.uid() >= 0x7000_0000 && b.uid() >= 0x7000_0000,
        "{} {}",
        a.uid(),
        b.uid()
    );
    let directory = std::fs::metadata(&claim).unwrap();
    assert_eq!(directory.mode() & 0o7777, 0o2770);
    assert_eq!((a.gid(), b.gid()), (directory.gid(), directory.gid()));
    let _ = (default_pod, chosen_pod);
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
    if missing(Tool::Confinement) {
        return;
    }
    // Sharing the host's network, pods would lack one protection.
    let error = Sim::start(
        SimConfig::default()
            .isolation(Isolation::Strict)
            .pod_networks(PodNetworks::Host),
    )
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

#[tokio::test]
async fn a_pods_storage_is_capped_by_its_ephemeral_storage_limit_and_gone_with_it() {
    let Some((sim, data)) = sim().await else {
        return;
    };
    let pods: Api<Pod> = Api::default_namespaced(sim.client().unwrap());
    // 4 MiB for /app, /tmp and its emptyDir together: 3 MiB fit, 3 more do not.
    let script = "dd if=/dev/zero of=/app/a bs=1M count=3 2>/dev/null && echo first-fits; \
        dd if=/dev/zero of=/tmp/b bs=1M count=3 2>/dev/null && echo LEAK-over-the-cap \
        || echo cap-held; df -k /app /tmp /cache | tail -n +2 | awk '{print $2}'";
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "filler"},
        "spec": {"restartPolicy": "Never",
            "containers": [{"name": "main", "image": "busybox", "command": ["sh", "-c", script],
                "resources": {"limits": {"ephemeral-storage": "4Mi"}},
                "volumeMounts": [{"name": "cache", "mountPath": "/cache"}]}],
            "volumes": [{"name": "cache", "emptyDir": {}}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let pod = wait_phase(&pods, "filler", &["Succeeded", "Failed"]).await;
    let logs = pods.logs("filler", &LogParams::default()).await.unwrap();
    assert!(logs.starts_with("first-fits\ncap-held\n"), "{logs}");
    // One filesystem of 4 MiB behind all three.
    assert_eq!(
        logs.lines().skip(2).collect::<Vec<_>>(),
        ["4096", "4096", "4096"],
        "{logs}"
    );
    // Nothing of it on the host's disk, and once deleted, nothing at all.
    let uid = pod.metadata.uid.unwrap();
    let dir = data.path().join(format!("pods/default/filler-{uid}"));
    assert!(!dir.join("storage/app/a").exists());
    pods.delete("filler", &Default::default()).await.unwrap();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while dir.exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} outlived its pod",
            dir.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    sim.stop().await;
}

#[tokio::test]
async fn an_exec_probe_runs_inside_the_container_never_on_the_host() {
    let Some((sim, _data)) = sim().await else {
        return;
    };
    let canary = tempfile::tempdir().unwrap();
    let planted = canary.path().join("written-by-a-probe");
    let pods: Api<Pod> = Api::default_namespaced(sim.client().unwrap());
    // Ready only once the probe sees the file the container made in its own /tmp; the probe
    // also tries to write a file of the host's.
    let probe = format!(
        "test -f /tmp/ready; status=$?; touch {}; exit $status",
        planted.display()
    );
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "probed"},
        "spec": {"containers": [{"name": "main", "image": "busybox",
            "command": ["sh", "-c", "touch /tmp/ready; sleep 60"],
            "readinessProbe": {"exec": {"command": ["sh", "-c", probe]}, "periodSeconds": 1}}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let pod = pods.get("probed").await.unwrap();
        let ready = pod
            .status
            .and_then(|s| s.container_statuses)
            .is_some_and(|c| c.iter().all(|c| c.ready));
        if ready {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !planted.exists(),
        "an exec probe wrote {} on the host",
        planted.display()
    );
    pods.delete("probed", &Default::default()).await.unwrap();
    sim.stop().await;
}

#[tokio::test]
async fn names_from_a_pod_never_become_host_paths() {
    let Some((sim, data)) = sim().await else {
        return;
    };
    use std::os::unix::fs::MetadataExt as _;
    // A canary outside the data directory, and one inside it but outside the volumes.
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("file"), "canary").unwrap();
    let before = std::fs::metadata(outside.path().join("file")).unwrap();
    let etc = std::fs::metadata("/etc").unwrap();
    let escape = format!("../../../../../../../../..{}", outside.path().display());
    let cases = [
        (
            "claim-traversal",
            json!([{"name": "v", "persistentVolumeClaim": {"claimName": escape}}]),
            "spec.volumes[0].persistentVolumeClaim.claimName",
        ),
        (
            "claim-parent",
            json!([{"name": "v", "persistentVolumeClaim": {"claimName": "../x"}}]),
            "spec.volumes[0].persistentVolumeClaim.claimName",
        ),
        (
            "claim-absolute",
            json!([{"name": "v", "persistentVolumeClaim": {"claimName": "/etc"}}]),
            "spec.volumes[0].persistentVolumeClaim.claimName",
        ),
        (
            "volume-slash",
            json!([{"name": "a/../../../../../..", "emptyDir": {}}]),
            "spec.volumes[0].name",
        ),
    ];
    let pods: Api<Pod> = Api::default_namespaced(sim.client().unwrap());
    let events: Api<k8s_openapi::api::core::v1::Event> =
        Api::default_namespaced(sim.client().unwrap());
    for (name, volumes, field) in &cases {
        let mount = volumes[0]["name"].clone();
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"restartPolicy": "Never", "volumes": volumes,
                "containers": [{"name": "main", "image": "busybox", "command": ["true"],
                    "volumeMounts": [{"name": mount, "mountPath": "/v"}]}]}
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
        let pod = wait_phase(&pods, name, &["Failed"]).await;
        let message = pod.status.and_then(|s| s.message).unwrap_or_default();
        assert!(message.starts_with(field), "{name}: {message}");
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let found = events
                .list(&Default::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .any(|e| {
                    e.involved_object.name.as_deref() == Some(*name)
                        && e.reason.as_deref() == Some("FailedCreatePodSandBox")
                        && e.message.as_deref().is_some_and(|m| m.starts_with(field))
                });
            if found {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "{name}: no Event");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // Nothing outside the data directory was made, re-owned or emptied.
    let after = std::fs::metadata(outside.path().join("file")).unwrap();
    assert_eq!(
        (after.uid(), after.gid(), after.mode()),
        (before.uid(), before.gid(), before.mode())
    );
    assert_eq!(
        std::fs::read_dir(outside.path()).unwrap().count(),
        1,
        "something appeared in the canary directory"
    );
    let etc_after = std::fs::metadata("/etc").unwrap();
    assert_eq!(
        (etc_after.uid(), etc_after.gid(), etc_after.mode()),
        (etc.uid(), etc.gid(), etc.mode())
    );
    assert!(!data.path().join("volumes/x").exists());
    sim.stop().await;
}

#[tokio::test]
async fn a_killed_container_restarts_in_its_pod_with_its_storage() {
    let Some((sim, _data)) = sim().await else {
        return;
    };
    let pods: Api<Pod> = Api::default_namespaced(sim.client().unwrap());
    // The second start finds what the first left in the pod's storage.
    let script = "if [ -f /app/first ]; then echo second-start; else touch /app/first; \
                  echo first-start; fi; sleep 1000";
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "restarted"},
        "spec": {"containers": [{"name": "main", "image": "busybox",
            "command": ["sh", "-c", script]}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let running = wait_phase(&pods, "restarted", &["Running"]).await;
    // Killed only once the first start has left its file (it prints after `touch`): Running
    // comes before the script has run.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let logs = pods.logs("restarted", &LogParams::default()).await.unwrap();
        if logs == "first-start\n" {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{logs:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let helper = running.status.unwrap().container_statuses.unwrap()[0]
        .container_id
        .clone()
        .unwrap()
        .trim_start_matches("sim://")
        .parse::<i32>()
        .unwrap();
    let init: i32 = std::fs::read_to_string(format!("/proc/{helper}/task/{helper}/children"))
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    // The container's helper is killed (as `kill -KILL` of its id would): the container's
    // init dies with it (a survivor would hold the pod's ports, so that no restart could
    // listen on them).
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(helper).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while std::fs::read_to_string(format!("/proc/{init}/stat")).is_ok_and(|stat| {
        !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
    }) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the container's init {init} outlived its helper"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let pod = pods.get("restarted").await.unwrap();
        let status = pod.status.unwrap().container_statuses.unwrap().remove(0);
        let running = status.state.and_then(|s| s.running).is_some();
        if status.restart_count == 1 && running {
            break;
        }
        assert!(
            status.restart_count <= 1 && tokio::time::Instant::now() < deadline,
            "restart count {}, last state {:?}",
            status.restart_count,
            status.last_state
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let logs = pods.logs("restarted", &LogParams::default()).await.unwrap();
        if logs == "second-start\n" {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{logs:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    pods.delete("restarted", &Default::default()).await.unwrap();
    sim.stop().await;
}
