#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The watch-fed index against a fake Kubernetes API (list + watch of Sandboxes and labelled
//! Pods): readiness after the initial lists, routes that follow Sandbox and Pod changes, the
//! label selector on pods, routing from pods alone while Sandboxes are forbidden (and the full
//! checks once they are granted); and the `sandbox-router` binary itself: kubeconfig, probes, a
//! request drained on SIGTERM, and exit status 0.

mod common;

use std::io::{BufRead as _, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use common::fake_api::FakeApi;
use common::{Runtime, execute, not_ready, pod_for, sandbox};
use hyper::{Method, StatusCode};
use pretty_assertions::assert_eq;

async fn status_of(addr: SocketAddr, id: &str) -> StatusCode {
    common::send(
        addr,
        Method::GET,
        "/",
        &[("x-sandbox-id", id)],
        Bytes::new(),
    )
    .await
    .status
}

/// Waits (bounded) until sandbox `id` answers `expected` through the router at `addr`.
async fn until_status(addr: SocketAddr, id: &'static str, expected: StatusCode) {
    let reached = common::eventually(Duration::from_secs(20), move || async move {
        (status_of(addr, id).await == expected).then_some(())
    })
    .await;
    assert!(reached.is_some(), "{id} never answered {expected}");
}

#[tokio::test]
async fn the_watch_fed_index_follows_the_cluster() {
    let runtime = Runtime::start();
    let api = FakeApi::start().await;
    let ready = sandbox("ready");
    let ready_pod = pod_for(&ready, runtime.ip, &[]);
    api.apply_sandbox(&ready);
    api.apply_pod(&ready_pod);

    // Bind on a port chosen by the OS, then run the watchers and the router as `run` does.
    let listener_config = {
        let mut config = agent_sandbox_router::Config::new(SocketAddr::from(([127, 0, 0, 1], 0)));
        config.connect_timeout = Duration::from_secs(2);
        config
    };
    let index = agent_sandbox_router::SharedIndex::new();
    let router = agent_sandbox_router::Router::bind(listener_config, index.clone())
        .await
        .unwrap();
    let addr = router.local_addr();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(router.serve(async move {
        let _ = stop_rx.await;
    }));
    let readyz = common::send(addr, Method::GET, "/readyz", &[], Bytes::new()).await;
    assert_eq!(readyz.status, StatusCode::SERVICE_UNAVAILABLE);
    let watching = tokio::spawn(agent_sandbox_router::watch(api.client(), index, None));

    let synced = common::eventually(Duration::from_secs(20), move || async move {
        let readyz = common::send(addr, Method::GET, "/readyz", &[], Bytes::new()).await;
        (readyz.status == StatusCode::OK).then_some(())
    })
    .await;
    assert!(synced.is_some(), "the index never synced");
    let reply = common::send(
        addr,
        Method::POST,
        "/execute",
        &[("x-sandbox-id", "ready")],
        execute("echo watched"),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(reply.json()["stdout"], "watched\n");

    // A new sandbox appears; its pod comes later.
    let late = sandbox("late");
    api.apply_sandbox(&late);
    until_status(addr, "late", StatusCode::NOT_FOUND).await;
    api.apply_pod(&pod_for(&late, runtime.ip, &[]));
    until_status(addr, "late", StatusCode::OK).await;

    // The first sandbox stops being Ready, then is deleted.
    api.apply_sandbox(&not_ready(ready.clone(), "SandboxSuspended", "suspended"));
    let detail = common::eventually(Duration::from_secs(20), move || async move {
        let reply = common::send(
            addr,
            Method::GET,
            "/",
            &[("x-sandbox-id", "ready")],
            Bytes::new(),
        )
        .await;
        (reply.status == StatusCode::NOT_FOUND).then(|| reply.detail())
    })
    .await
    .unwrap();
    assert_eq!(
        detail,
        "Sandbox default/ready is not Ready: SandboxSuspended: suspended"
    );
    api.delete_sandbox(&ready);
    api.delete_pod(&ready_pod);
    let gone = common::eventually(Duration::from_secs(20), move || async move {
        let reply = common::send(
            addr,
            Method::GET,
            "/",
            &[("x-sandbox-id", "ready")],
            Bytes::new(),
        )
        .await;
        (reply.detail() == "Sandbox default/ready not found.").then_some(())
    })
    .await;
    assert!(gone.is_some());
    assert_eq!(status_of(addr, "late").await, StatusCode::OK);

    // Pods are listed and watched with the name-hash label selector only.
    let pod_requests: Vec<String> = api
        .requests()
        .into_iter()
        .filter(|uri| uri.starts_with("/api/v1/pods"))
        .collect();
    assert!(pod_requests.len() >= 2, "{pod_requests:?}");
    for uri in &pod_requests {
        assert!(
            uri.contains("labelSelector=agents.x-k8s.io%2Fsandbox-name-hash"),
            "{uri}"
        );
    }

    watching.abort();
    let _ = watching.await;
    stop_tx.send(()).unwrap();
    serving.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_namespaced_router_sees_only_its_namespace() {
    let runtime = Runtime::start();
    let api = FakeApi::start().await;
    let here = common::sandbox_in("team-a", "box");
    let there = common::sandbox_in("team-b", "box");
    api.apply_sandbox(&here);
    api.apply_pod(&pod_for(&here, runtime.ip, &[]));
    api.apply_sandbox(&there);
    api.apply_pod(&pod_for(&there, runtime.ip, &[]));

    let index = agent_sandbox_router::SharedIndex::new();
    let router = agent_sandbox_router::Router::bind(
        agent_sandbox_router::Config::new(SocketAddr::from(([127, 0, 0, 1], 0))),
        index.clone(),
    )
    .await
    .unwrap();
    let addr = router.local_addr();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(router.serve(async move {
        let _ = stop_rx.await;
    }));
    let watching = tokio::spawn(agent_sandbox_router::watch(
        api.client(),
        index,
        Some("team-a".to_owned()),
    ));
    let synced = common::eventually(Duration::from_secs(20), move || async move {
        let readyz = common::send(addr, Method::GET, "/readyz", &[], Bytes::new()).await;
        (readyz.status == StatusCode::OK).then_some(())
    })
    .await;
    assert!(synced.is_some(), "never ready");
    let call = |namespace: &'static str| async move {
        common::send(
            addr,
            Method::GET,
            "/",
            &[("x-sandbox-id", "box"), ("x-sandbox-namespace", namespace)],
            Bytes::new(),
        )
        .await
    };
    assert_eq!(call("team-a").await.status, StatusCode::OK);
    let other = call("team-b").await;
    assert_eq!(other.status, StatusCode::NOT_FOUND);
    assert_eq!(other.detail(), "Sandbox team-b/box not found.");
    assert!(
        api.requests()
            .iter()
            .all(|uri| uri.contains("/namespaces/team-a/")),
        "{:?}",
        api.requests()
    );
    watching.abort();
    let _ = watching.await;
    stop_tx.send(()).unwrap();
    serving.await.unwrap().unwrap();
}

/// The binary, killed if the test fails before it exits.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn the_binary_serves_from_a_kubeconfig_and_drains_on_sigterm() {
    let runtime = Runtime::start();
    let api = FakeApi::start().await;
    let box_ = sandbox("box");
    api.apply_sandbox(&box_);
    api.apply_pod(&pod_for(&box_, runtime.ip, &[]));
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = api.kubeconfig(dir.path());

    let mut child = Command::new(env!("CARGO_BIN_EXE_sandbox-router"))
        .env_clear()
        .env("KUBECONFIG", &kubeconfig)
        .env("HOME", dir.path())
        .env("SANDBOX_ROUTER_LISTEN", "127.0.0.1:0")
        .env("SANDBOX_ROUTER_AUTH", "none")
        .env("SANDBOX_ROUTER_SHUTDOWN_GRACE_SECONDS", "20")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut guard = Guard(child);
    let (lines_tx, lines_rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            let _ = lines_tx.send(line);
        }
    });
    let mut log = Vec::new();
    let addr: SocketAddr = loop {
        let line = lines_rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("no listening line ({e}): {log:#?}"));
        log.push(line.clone());
        if let Some(rest) = line.split("sandbox-router listening on ").nth(1) {
            break rest.split_whitespace().next().unwrap().parse().unwrap();
        }
    };
    assert!(
        log.iter().any(|l| l.contains("authentication is off")),
        "--auth none is logged as a warning: {log:#?}"
    );
    let healthz = common::send(addr, Method::GET, "/healthz", &[], Bytes::new()).await;
    assert_eq!(healthz.status, StatusCode::OK);
    let synced = common::eventually(Duration::from_secs(20), move || async move {
        let readyz = common::send(addr, Method::GET, "/readyz", &[], Bytes::new()).await;
        (readyz.status == StatusCode::OK).then_some(())
    })
    .await;
    assert!(synced.is_some(), "never ready");

    let in_flight = tokio::spawn(async move {
        common::send(
            addr,
            Method::POST,
            "/execute",
            &[("x-sandbox-id", "box")],
            execute("touch started; sleep 2; echo drained"),
        )
        .await
    });
    let started = runtime.base.path().join("started");
    let seen = common::eventually(Duration::from_secs(20), move || {
        let started = started.clone();
        async move { started.exists().then_some(()) }
    })
    .await;
    assert!(seen.is_some(), "the command never started");
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(i32::try_from(guard.0.id()).unwrap()).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let reply = tokio::time::timeout(Duration::from_secs(30), in_flight)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(reply.json()["stdout"], "drained\n");
    let exited = common::eventually(Duration::from_secs(30), || {
        let status = guard.0.try_wait().unwrap();
        async move { status }
    })
    .await
    .expect("the router exits after SIGTERM");
    assert!(exited.success(), "{exited:?}");
    let rest: Vec<String> = lines_rx.try_iter().collect();
    assert!(
        rest.iter()
            .any(|l| l.contains("sandbox_router::access") || l.contains("request")),
        "an access-log line: {rest:#?}"
    );
}

#[test]
fn the_binary_refuses_to_start_without_an_auth_mode_or_its_secret() {
    let no_mode = Command::new(env!("CARGO_BIN_EXE_sandbox-router"))
        .env_clear()
        .output()
        .unwrap();
    assert!(!no_mode.status.success());
    assert!(
        String::from_utf8_lossy(&no_mode.stderr).contains("--auth"),
        "{no_mode:?}"
    );
    let no_key = Command::new(env!("CARGO_BIN_EXE_sandbox-router"))
        .env_clear()
        .args(["--auth", "scoped"])
        .output()
        .unwrap();
    assert!(!no_key.status.success());
    assert!(
        String::from_utf8_lossy(&no_key.stderr).contains("--signing-key-file"),
        "{no_key:?}"
    );
}

#[tokio::test]
async fn forbidden_sandboxes_route_from_pods_until_access_is_granted() {
    let runtime = Runtime::start();
    let api = FakeApi::start().await;
    api.forbid_sandboxes();
    let box_ = sandbox("box");
    api.apply_pod(&pod_for(&box_, runtime.ip, &[]));

    let index = agent_sandbox_router::SharedIndex::new();
    let router = agent_sandbox_router::Router::bind(
        agent_sandbox_router::Config::new(SocketAddr::from(([127, 0, 0, 1], 0))),
        index.clone(),
    )
    .await
    .unwrap();
    let addr = router.local_addr();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(router.serve(async move {
        let _ = stop_rx.await;
    }));
    let watching = tokio::spawn(agent_sandbox_router::watch(
        api.client(),
        index.clone(),
        None,
    ));
    // Pods alone: the pod controlled by Sandbox "box" is enough.
    until_status(addr, "box", StatusCode::OK).await;
    assert!(index.read().is_pods_only());

    // RBAC granted: the Sandbox watch lists, and the Sandbox's own state counts again.
    api.apply_sandbox(&not_ready(box_.clone(), "SandboxSuspended", "suspended"));
    api.allow_sandboxes();
    until_status(addr, "box", StatusCode::NOT_FOUND).await;
    assert!(!index.read().is_pods_only());
    api.apply_sandbox(&box_);
    until_status(addr, "box", StatusCode::OK).await;

    watching.abort();
    let _ = watching.await;
    stop_tx.send(()).unwrap();
    serving.await.unwrap().unwrap();
}
