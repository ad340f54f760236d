//! The `kube-sim` binary: writes its kubeconfig once it answers, serves, and on SIGTERM stops and
//! takes every pod process with it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::process::Stdio;
use std::time::Duration;

use agent_sandbox_local::testkit::assert_configuration_error;
use common::{container_pid, eventually, group_alive};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::json;

/// Kills the process on drop (test failures included).
struct Guard(tokio::process::Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.start_kill();
    }
}

#[tokio::test]
async fn kube_sim_serves_until_sigterm_and_leaves_no_pod_behind() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("config");
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_kube-sim"))
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["--isolation", "none", "--data-dir"])
        .arg(dir.path().join("data"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut guard = Guard(child);
    let text = eventually("the kubeconfig", || async {
        std::fs::read_to_string(&kubeconfig).ok()
    })
    .await;
    // Once the file exists, the server answers.
    let kubeconfig_value = kube::config::Kubeconfig::from_yaml(&text).unwrap();
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig_value, &Default::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    let version = client.apiserver_version().await.unwrap();
    assert_eq!(version.major, "1");
    let pods: Api<Pod> = Api::default_namespaced(client);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "sleeper"},
        "spec": {"containers": [{"name": "main", "image": "busybox", "command": ["sleep", "1000"]}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let pid = eventually("the pod to run", || async {
        let pod = pods.get("sleeper").await.unwrap();
        let running = pod.status.as_ref()?.phase.as_deref() == Some("Running");
        running.then(|| container_pid(&pod))
    })
    .await;
    assert!(group_alive(pid));
    let sim_pid =
        rustix::process::Pid::from_raw(i32::try_from(guard.0.id().unwrap()).unwrap()).unwrap();
    rustix::process::kill_process(sim_pid, rustix::process::Signal::TERM).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), guard.0.wait())
        .await
        .expect("kube-sim stops on SIGTERM")
        .unwrap();
    assert!(status.success(), "{status}");
    eventually("the pod's processes to be gone", || async {
        (!group_alive(pid)).then_some(())
    })
    .await;
}

/// Runs `kube-sim` with `args` and backtraces requested, as a user debugging something would.
fn kube_sim(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_kube-sim"))
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .env("RUST_LIB_BACKTRACE", "1")
        .env("RUST_LOG", "error")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[tokio::test]
async fn configuration_errors_are_one_line_and_exit_code_2_even_with_backtraces_on() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("config");
    let kubeconfig = kubeconfig.to_str().unwrap();
    // A bad flag value and a missing flag (clap's own errors).
    assert_configuration_error(
        &kube_sim(&["--kubeconfig", kubeconfig, "--isolation", "docker"]),
        "--isolation",
    );
    assert_configuration_error(&kube_sim(&[]), "--kubeconfig");
    // A malformed image mapping.
    assert_configuration_error(
        &kube_sim(&["--kubeconfig", kubeconfig, "--image", "busybox"]),
        "PATTERN=PROGRAM",
    );
    // A port that is taken.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    assert_configuration_error(
        &kube_sim(&[
            "--kubeconfig",
            kubeconfig,
            "--isolation",
            "none",
            "--port",
            &port,
        ]),
        &format!("127.0.0.1:{port}"),
    );
    // A data directory that cannot be created, and a kubeconfig that cannot be written.
    let file = dir.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let below_file = file.join("data");
    assert_configuration_error(
        &kube_sim(&[
            "--kubeconfig",
            kubeconfig,
            "--isolation",
            "none",
            "--data-dir",
            below_file.to_str().unwrap(),
        ]),
        below_file.to_str().unwrap(),
    );
    assert_configuration_error(
        &kube_sim(&[
            "--kubeconfig",
            below_file.to_str().unwrap(),
            "--isolation",
            "none",
        ]),
        below_file.to_str().unwrap(),
    );
}
