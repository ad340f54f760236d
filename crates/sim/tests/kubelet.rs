//! The process kubelet through kube-rs: pods run as local process groups (with and without
//! bubblewrap), follow their restart policy, report status, logs and Events, honour readiness
//! probes, environment and init containers, and leave no process behind.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use agent_sandbox_sim::{Isolation, Sim, SimConfig};
use common::{container_pid, eventually, group_alive, sim};
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
    if isolation == Isolation::Bwrap {
        // Under bubblewrap the pod has its own UTS namespace named after the pod.
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
async fn pods_run_commands_and_follow_restart_policy_in_bubblewrap() {
    if !agent_sandbox_sim::bwrap_available() {
        eprintln!("skipped: bubblewrap (bwrap) is not installed or cannot create namespaces here");
        return;
    }
    runs_commands_and_follows_restart_policy(Isolation::Bwrap).await;
}

#[tokio::test]
async fn bubblewrap_gives_pods_a_read_only_root_and_a_writable_app_directory() {
    if !agent_sandbox_sim::bwrap_available() {
        eprintln!("skipped: bubblewrap (bwrap) is not installed or cannot create namespaces here");
        return;
    }
    let sim = sim(Isolation::Bwrap).await;
    let pods: Api<Pod> = Api::default_namespaced(sim.client().unwrap());
    let script = "pwd; echo ok > /app/file && cat /app/file; touch /etc/sim-test 2>/dev/null || echo read-only; \
                  touch /tmp/x && echo tmp-ok; echo pid $$";
    pods.create(&PostParams::default(), &pod("box", script, "Never"))
        .await
        .unwrap();
    wait_phase(&pods, "box", "Succeeded").await;
    let logs = pods.logs("box", &LogParams::default()).await.unwrap();
    // The shell is not pid 1: bubblewrap's init is, in the pod's own pid namespace.
    assert_eq!(logs, "/app\nok\nread-only\ntmp-ok\npid 2\n");
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
async fn deleting_a_pod_stops_its_processes_in_bubblewrap() {
    if !agent_sandbox_sim::bwrap_available() {
        eprintln!("skipped: bubblewrap (bwrap) is not installed or cannot create namespaces here");
        return;
    }
    deletion_stops_processes(Isolation::Bwrap).await;
}

#[tokio::test]
async fn dropping_the_sim_kills_every_pod_process() {
    for isolation in [Isolation::None, Isolation::Auto] {
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
    let sim = sim(Isolation::Auto).await;
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
    let sim = sim(Isolation::Auto).await;
    let pods: Api<Pod> = Api::default_namespaced(sim.client().unwrap());
    let probed: Pod = serde_json::from_value(json!({
        "metadata": {"name": "probed"},
        "spec": {"containers": [{"name": "main", "image": "busybox", "command": ["sleep", "1000"],
                 "readinessProbe": {"exec": {"command": ["test", "-f", "ready"]}, "periodSeconds": 1}}]}
    }))
    .unwrap();
    let created = pods.create(&PostParams::default(), &probed).await.unwrap();
    let running = wait_phase(&pods, "probed", "Running").await;
    assert_eq!(condition(&running, "Ready").as_deref(), Some("False"));
    let marker = sim
        .data_dir()
        .join("pods/default")
        .join(format!("probed-{}", created.uid().unwrap()))
        .join("app/ready");
    std::fs::write(&marker, "").unwrap();
    eventually("Ready", || async {
        let pod = pods.get("probed").await.unwrap();
        (condition(&pod, "Ready").as_deref() == Some("True")).then_some(())
    })
    .await;
}

#[tokio::test]
async fn environment_downward_api_config_maps_and_init_containers() {
    let sim = sim(Isolation::Auto).await;
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
