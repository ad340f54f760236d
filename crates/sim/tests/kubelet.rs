//! The process kubelet through kube-rs: pods run as local process groups (confined and
//! plain), follow their restart policy, report status, logs and Events, honour readiness
//! probes, environment and init containers, and leave no process behind (not even one the
//! runtime started in its own session, when the runtime itself is SIGKILLed).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use agent_sandbox_local::testkit::{Tool, missing};
use agent_sandbox_sim::{Isolation, PodNetworks, Program, Sim, SimConfig, runtime_entry};
use common::{container_pid, eventually, group_alive, runtime_binary, sim};
use k8s_openapi::api::core::v1::{ConfigMap, Event as CoreEvent, Pod};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, LogParams, PostParams};
use serde_json::json;

fn pod(name: &str, script: &str, restart: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"restartPolicy": restart, "terminationGracePeriodSeconds": 5,
                 "containers": [{"name": "main", "image": "busybox:1.36",
                                 "command": ["sh", "-c", script]}]}
    }))
    .unwrap()
}

fn phase(pod: &Pod) -> String {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default()
}

async fn wait_phase(api: &Api<Pod>, name: &str, wanted: &str) -> Pod {
    eventually(&format!("pod {name} to be {wanted}"), || async {
        let pod = api.get(name).await.unwrap();
        (phase(&pod) == wanted).then_some(pod)
    })
    .await
}

fn condition(pod: &Pod, type_: &str) -> Option<String> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.status.clone())
}

async fn runs_commands_and_follows_restart_policy(isolation: Isolation) {
    let sim = sim(isolation).await;
    let pods: Api<Pod> = Api::default_namespaced(sim.client().unwrap());
    pods.create(
        &PostParams::default(),
        &pod("hello", "echo hello from $(hostname)", "Never"),
    )
    .await
    .unwrap();
    let done = wait_phase(&pods, "hello", "Succeeded").await;
    let ip = done.status.as_ref().unwrap().pod_ip.clone().unwrap();
    assert!(ip.starts_with("127.") && ip != "127.0.0.1", "{ip}");
    let logs = pods.logs("hello", &LogParams::default()).await.unwrap();
    if isolation == Isolation::Confined {
        // A confined pod has its own UTS namespace named after the pod.
        assert_eq!(logs, "hello from hello\n");
    } else {
        assert!(logs.starts_with("hello from "), "{logs}");
    }

    pods.create(&PostParams::default(), &pod("fails", "exit 3", "Never"))
        .await
        .unwrap();
    let failed = wait_phase(&pods, "fails", "Failed").await;
    let state = failed.status.unwrap().container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap();
    assert_eq!(state.terminated.unwrap().exit_code, 3);

    pods.create(
        &PostParams::default(),
        &pod("retries", "exit 1", "OnFailure"),
    )
    .await
    .unwrap();
    eventually("a restart", || async {
        let pod = pods.get("retries").await.unwrap();
        let restarts = pod.status?.container_statuses?.first()?.restart_count;
        (restarts >= 1).then_some(())
    })
    .await;
}

#[tokio::test]
async fn pods_run_commands_and_follow_restart_policy_without_isolation() {
    runs_commands_and_follows_restart_policy(Isolation::None).await;
}

#[tokio::test]
async fn confined_pods_run_commands_and_follow_restart_policy() {
    if missing(Tool::Confinement) {
        return;
    }
    runs_commands_and_follows_restart_policy(Isolation::Confined).await;
}

#[tokio::test]
async fn confined_pods_have_a_read_only_root_and_a_writable_app_directory() {
    if missing(Tool::Confinement) {
        return;
    }
    let sim = sim(Isolation::Confined).await;
    let pods: Api<Pod> = Api::default_namespaced(sim.client().unwrap());
    let script = "pwd; echo ok > /app/file && cat /app/file; touch /etc/sim-test 2>/dev/null || echo read-only; \
                  touch /tmp/x && echo tmp-ok; echo pid $$";
    pods.create(&PostParams::default(), &pod("box", script, "Never"))
        .await
        .unwrap();
    wait_phase(&pods, "box", "Succeeded").await;
    let logs = pods.logs("box", &LogParams::default()).await.unwrap();
    // The container's program is PID 1 of the pod's own PID namespace, as on a node.
    assert_eq!(logs, "/app\nok\nread-only\ntmp-ok\npid 1\n");
}

#[tokio::test]
async fn unknown_images_stay_pending_with_err_image_pull_and_an_event() {
    let sim = sim(Isolation::None).await;
    let client = sim.client().unwrap();
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let unknown: Pod = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"containers": [{"name": "nginx", "image": "nginx:1.27"}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &unknown).await.unwrap();
    let waiting = eventually("ErrImagePull", || async {
        let pod = pods.get("web").await.unwrap();
        let status = pod
            .status
            .clone()?
            .container_statuses?
            .first()?
            .state
            .clone()?
            .waiting?;
        (status.reason.as_deref() == Some("ErrImagePull")).then_some((pod, status))
    })
    .await;
    assert_eq!(phase(&waiting.0), "Pending");
    assert!(waiting.1.message.unwrap().contains("nginx:1.27"));
    let events: Api<CoreEvent> = Api::default_namespaced(client);
    let failed = events
        .list(&ListParams::default().fields("involvedObject.name=web,reason=Failed"))
        .await
        .unwrap();
    assert_eq!(failed.items.len(), 1);
    assert_eq!(failed.items[0].type_.as_deref(), Some("Warning"));
    // Deleting a pod that never started completes at once.
    pods.delete("web", &DeleteParams::default()).await.unwrap();
    eventually("the pod to be gone", || async {
        pods.get_opt("web").await.unwrap().is_none().then_some(())
    })
    .await;
}

async fn deletion_stops_processes(isolation: Isolation) {
    let sim = sim(isolation).await;
    let pods: Api<Pod> = Api::default_namespaced(sim.client().unwrap());
    // Exits on SIGTERM.
    let polite = "trap 'echo stopping; exit 0' TERM; while true; do sleep 0.05; done";
    pods.create(&PostParams::default(), &pod("polite", polite, "Always"))
        .await
        .unwrap();
    // Ignores SIGTERM; its grace period (1 s) runs out and it is killed.
    let mut stubborn = pod(
        "stubborn",
        "trap '' TERM; sleep 1000 & while true; do sleep 0.05; done",
        "Always",
    );
    stubborn
        .spec
        .as_mut()
        .unwrap()
        .termination_grace_period_seconds = Some(1);
    pods.create(&PostParams::default(), &stubborn)
        .await
        .unwrap();
    for name in ["polite", "stubborn"] {
        let running = wait_phase(&pods, name, "Running").await;
        let pid = container_pid(&running);
        assert!(group_alive(pid), "{name}'s processes run");
        pods.delete(name, &DeleteParams::default()).await.unwrap();
        eventually(&format!("{name} to be gone"), || async {
            pods.get_opt(name).await.unwrap().is_none().then_some(())
        })
        .await;
        // The object disappears only after its processes are gone.
        assert!(
            !group_alive(pid),
            "{name}'s process group {pid} outlived the pod"
        );
    }
    assert_eq!(sim.live_process_groups(), 0);
}

#[tokio::test]
async fn deleting_a_pod_stops_its_processes_without_isolation() {
    deletion_stops_processes(Isolation::None).await;
}

#[tokio::test]
async fn deleting_a_confined_pod_stops_its_processes() {
    if missing(Tool::Confinement) {
        return;
    }
    deletion_stops_processes(Isolation::Confined).await;
}

#[tokio::test]
async fn dropping_the_sim_kills_every_pod_process() {
    for isolation in [Isolation::None, Isolation::Confined] {
        let sim = sim(isolation).await;
        let pods: Api<Pod> = Api::default_namespaced(sim.client().unwrap());
        pods.create(
            &PostParams::default(),
            &pod("sleeper", "sleep 1000 & sleep 1000", "Always"),
        )
        .await
        .unwrap();
        let running = wait_phase(&pods, "sleeper", "Running").await;
        let pid = container_pid(&running);
        assert!(group_alive(pid));
        drop(sim);
        eventually("the pod's processes to die with the sim", || async {
            (!group_alive(pid)).then_some(())
        })
        .await;
    }
}

#[tokio::test]
async fn stopping_the_sim_kills_every_pod_process() {
    let sim = sim(Isolation::Confined).await;
    let pods: Api<Pod> = Api::default_namespaced(sim.client().unwrap());
    pods.create(
        &PostParams::default(),
        &pod("sleeper", "sleep 1000", "Always"),
    )
    .await
    .unwrap();
    let pid = container_pid(&wait_phase(&pods, "sleeper", "Running").await);
    sim.stop().await;
    eventually("the pod's processes to die", || async {
        (!group_alive(pid)).then_some(())
    })
    .await;
}

#[tokio::test]
async fn readiness_probes_gate_the_ready_condition() {
    let sim = sim(Isolation::Confined).await;
    let pods: Api<Pod> = Api::default_namespaced(sim.client().unwrap());
    let probed: Pod = serde_json::from_value(json!({
        "metadata": {"name": "probed"},
        "spec": {"containers": [{"name": "main", "image": "busybox", "command": ["sleep", "1000"],
                 "readinessProbe": {"exec": {"command": ["test", "-f", "/gate/ready"]}, "periodSeconds": 1},
                 "volumeMounts": [{"name": "gate", "mountPath": "/gate"}]}],
                 "volumes": [{"name": "gate", "persistentVolumeClaim": {"claimName": "gate"}}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &probed).await.unwrap();
    let running = wait_phase(&pods, "probed", "Running").await;
    assert_eq!(condition(&running, "Ready").as_deref(), Some("False"));
    // The probe runs inside the container: the file appears there through the claim.
    let marker = sim.data_dir().join("volumes/default/gate/ready");
    std::fs::write(&marker, "").unwrap();
    eventually("Ready", || async {
        let pod = pods.get("probed").await.unwrap();
        (condition(&pod, "Ready").as_deref() == Some("True")).then_some(())
    })
    .await;
}

#[tokio::test]
async fn environment_downward_api_config_maps_and_init_containers() {
    let sim = sim(Isolation::Confined).await;
    let client = sim.client().unwrap();
    let maps: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let map: ConfigMap = serde_json::from_value(
        json!({"metadata": {"name": "settings"}, "data": {"color": "blue"}}),
    )
    .unwrap();
    maps.create(&PostParams::default(), &map).await.unwrap();
    let pods: Api<Pod> = Api::default_namespaced(client);
    let spec: Pod = serde_json::from_value(json!({
        "metadata": {"name": "envy", "labels": {"app": "x"}},
        "spec": {"restartPolicy": "Never",
            "initContainers": [{"name": "first", "image": "busybox",
                                "command": ["sh", "-c", "echo init > init-ran"]}],
            "containers": [{"name": "main", "image": "busybox",
                "command": ["sh", "-c", "echo $(GREETING) $POD $NS $COLOR $APP; cat init-ran; test -n \"$IP\""],
                "env": [
                    {"name": "GREETING", "value": "hi"},
                    {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                    {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                    {"name": "COLOR", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "color"}}}
                ]}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &spec).await.unwrap();
    wait_phase(&pods, "envy", "Succeeded").await;
    let logs = pods
        .logs(
            "envy",
            &LogParams {
                container: Some("main".into()),
                ..LogParams::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(logs, "hi envy default blue x\ninit\n");
}

#[tokio::test]
async fn two_sims_run_side_by_side() {
    let a = Sim::start(SimConfig::default()).await.unwrap();
    let b = Sim::start(SimConfig::default()).await.unwrap();
    assert_ne!(a.base_url(), b.base_url());
    for sim in [&a, &b] {
        let pods: Api<Pod> = Api::default_namespaced(sim.client().unwrap());
        pods.create(
            &PostParams::default(),
            &pod("same-name", "sleep 1000", "Always"),
        )
        .await
        .unwrap();
    }
    let ip = |sim: &Sim| {
        let pods: Api<Pod> = Api::default_namespaced(sim.client().unwrap());
        async move {
            wait_phase(&pods, "same-name", "Running")
                .await
                .status
                .unwrap()
                .pod_ip
                .unwrap()
        }
    };
    assert_ne!(ip(&a).await, ip(&b).await);
    let names: Vec<String> = Api::<Pod>::default_namespaced(a.client().unwrap())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|p| p.name_any())
        .collect();
    assert_eq!(names, ["same-name"]);
}

/// The command line of `pid`, if it is alive (not a zombie).
fn live_cmdline(pid: i32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, after) = stat.rsplit_once(')')?;
    if after.split_whitespace().next() == Some("Z") {
        return None;
    }
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        raw.split(|b| *b == 0)
            .filter(|arg| !arg.is_empty())
            .map(|arg| String::from_utf8_lossy(arg).into_owned())
            .collect(),
    )
}

fn all_pids() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
        .collect()
}

/// Live processes with `marker` as one of their arguments.
fn processes_with(marker: &str) -> Vec<i32> {
    all_pids()
        .into_iter()
        .filter(|pid| live_cmdline(*pid).is_some_and(|args| args.iter().any(|a| a == marker)))
        .collect()
}

/// `root` and every process below it, from the parent links in `/proc`.
fn tree(root: i32) -> Vec<i32> {
    let parents: Vec<(i32, i32)> = all_pids()
        .into_iter()
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let (_, after) = stat.rsplit_once(')')?;
            Some((pid, after.split_whitespace().nth(1)?.parse().ok()?))
        })
        .collect();
    let mut found = vec![root];
    let mut index = 0;
    while let Some(parent) = found.get(index).copied() {
        found.extend(
            parents
                .iter()
                .filter(|(_, p)| *p == parent)
                .map(|(c, _)| *c),
        );
        index += 1;
    }
    found
}

/// Kills, when dropped, every process carrying the marker: a failing test leaves nothing behind.
struct Orphans(String);

impl Drop for Orphans {
    fn drop(&mut self) {
        for pid in processes_with(&self.0) {
            if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
    }
}

async fn http_post(addr: &str, path: &str, body: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.unwrap();
    let text = String::from_utf8_lossy(&response).into_owned();
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, text)
}

/// Creates a runtime pod and waits until the runtime answers.
async fn ready_runtime_pod(pods: &Api<Pod>, name: &str) -> Pod {
    let spec: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 5,
                 "containers": [{"name": "rt", "image": "sandbox-runtime"}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &spec).await.unwrap();
    eventually(&format!("pod {name} to be Ready"), || async {
        let pod = pods.get(name).await.unwrap();
        (condition(&pod, "Ready").as_deref() == Some("True")).then_some(pod)
    })
    .await
}

/// Has the pod's runtime start, as a background process, a `sleep` that leaves the runtime's
/// session (`setsid` forks, so the sleep is no direct child of the runtime and has no
/// parent-death signal). The sleep's last argument is `marker`, which finds it in `/proc`.
async fn start_escaping_sleep(pod: &Pod, marker: &str) {
    let ip = pod.status.as_ref().unwrap().pod_ip.clone().unwrap();
    let command = format!("setsid sleep 1000 {marker}");
    let (code, response) = http_post(
        &format!("{ip}:8888"),
        "/v1/processes",
        &json!({ "command": command }).to_string(),
    )
    .await;
    assert_eq!(code, 201, "{response}");
    eventually("the escaping sleep to run", || async {
        (!processes_with(marker).is_empty()).then_some(())
    })
    .await;
}

/// The runtime process of a pod whose container's process is `container`.
fn runtime_process(container: i32) -> i32 {
    let runtimes: Vec<i32> = tree(container)
        .into_iter()
        .filter(|pid| {
            live_cmdline(*pid)
                .and_then(|args| args.first().cloned())
                .is_some_and(|program| program.ends_with("sandbox-runtime"))
        })
        .collect();
    assert_eq!(
        runtimes.len(),
        1,
        "runtime processes under {container}: {runtimes:?}"
    );
    runtimes[0]
}

async fn no_process_outlives_its_pod(isolation: Isolation) {
    // On the host's network: the test talks to the runtime directly.
    let config = SimConfig::default()
        .isolation(isolation)
        .pod_networks(PodNetworks::Host)
        .image(runtime_entry("*runtime*", Program::Path(runtime_binary())));
    let sim = Sim::start(config).await.unwrap();
    let pods: Api<Pod> = Api::default_namespaced(sim.client().unwrap());
    // A fraction of a second, unique to this run: `sleep` adds up its arguments.
    let unique = || {
        format!(
            "0.{}{:09}",
            std::process::id(),
            fastrand::u32(..1_000_000_000)
        )
    };

    // The runtime is SIGKILLed (as by the OOM killer): the container ends, and with it
    // everything the runtime started, wherever it went.
    let marker = unique();
    let _orphans = Orphans(marker.clone());
    let pod = ready_runtime_pod(&pods, "killed").await;
    start_escaping_sleep(&pod, &marker).await;
    let runtime = runtime_process(container_pid(&pod));
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(runtime).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    let failed = wait_phase(&pods, "killed", "Failed").await;
    let state = failed.status.unwrap().container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap();
    assert_eq!(state.terminated.unwrap().exit_code, 137);
    assert_eq!(
        processes_with(&marker),
        Vec::<i32>::new(),
        "the runtime's background sleep outlived its pod (isolation {isolation:?})"
    );

    // The pod is deleted: the same holds once the object is gone.
    let marker = unique();
    let _orphans = Orphans(marker.clone());
    let pod = ready_runtime_pod(&pods, "deleted").await;
    start_escaping_sleep(&pod, &marker).await;
    pods.delete("deleted", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the pod to be gone", || async {
        pods.get_opt("deleted")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    assert_eq!(
        processes_with(&marker),
        Vec::<i32>::new(),
        "the runtime's background sleep outlived the deleted pod (isolation {isolation:?})"
    );
    assert_eq!(sim.live_process_groups(), 0);
}

#[tokio::test]
async fn no_process_outlives_its_pod_without_isolation() {
    no_process_outlives_its_pod(Isolation::None).await;
}

#[tokio::test]
async fn no_process_outlives_its_confined_pod() {
    if missing(Tool::Confinement) {
        return;
    }
    no_process_outlives_its_pod(Isolation::Confined).await;
}
