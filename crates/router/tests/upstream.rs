#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The `sandbox-router` binary started the way upstream's router manifests start upstream's
//! routers (kubernetes-sigs/agent-sandbox v1.0.3), against a fake API server and the real
//! runtime as the sandbox:
//!
//! - the Go router's Deployment (`sandbox-router/deploy/deployment.yaml`): its argument list,
//!   no environment, and its RBAC (pods only, so Sandboxes are 403); probes on 8081, metrics on
//!   9090, proxy on 8080, no authentication (the Go router's default);
//! - the same with Go's single-dash spelling and `--authz-mode=scoped-token` with a v2 key file:
//!   v2 tokens bound to the request are accepted, others refused;
//! - the Python router's Deployment (`clients/python/.../sandbox_router.yaml`): environment only,
//!   as shipped (`ALLOW_UNAUTHENTICATED_ROUTER="false"`, no token: the router refuses to start,
//!   as upstream's does), and with its `ROUTER_AUTH_TOKEN` line enabled (a static token);
//! - `examples/kata-aks/router.yaml`: `ALLOW_UNAUTHENTICATED_ROUTER=true` alone.
//!
//! Deviations from the manifests, all forced by the test machine: the API server is reached
//! through `KUBECONFIG` (a pod uses its service account), and every listener binds one loopback
//! address of its own with the manifests' ports (`127.x.y.z:8080` for `:8080`), so that tests
//! running at once do not collide. Every process started here is killed when its guard drops.

mod common;

use std::io::{BufRead as _, BufReader};
use std::net::{IpAddr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use agent_sandbox_api::token::v2;
use agent_sandbox_api::wire::{ROUTER_HEALTH_PORT, ROUTER_METRICS_PORT, ROUTER_PORT};
use bytes::Bytes;
use common::fake_api::FakeApi;
use common::{Runtime, execute, pod_for, sandbox};
use hyper::{Method, StatusCode};
use pretty_assertions::assert_eq;

/// `sandbox-router/deploy/deployment.yaml`'s `args`, with `:PORT` as `{ip}:PORT`.
const GO_DEPLOYMENT_ARGS: [&str; 7] = [
    "--http-bind-address={ip}:8080",
    "--metrics-bind-address={ip}:9090",
    "--health-probe-bind-address={ip}:8081",
    "--cluster-domain=cluster.local",
    "--proxy-timeout=180s",
    "--upstream-max-retries=3",
    "--cache-enabled=true",
];

/// `sandbox_router.yaml`'s `env`, as shipped.
const PYTHON_DEPLOYMENT_ENV: [(&str, &str); 6] = [
    ("PROXY_TIMEOUT_SECONDS", "180"),
    ("WEBSOCKET_IDLE_TIMEOUT_SECONDS", "3600"),
    ("WEBSOCKET_MAX_LIFETIME_SECONDS", "86400"),
    ("WEBSOCKET_MAX_MESSAGE_BYTES", "16777216"),
    ("WEBSOCKET_MAX_CONNECTIONS_PER_CLIENT", "0"),
    ("ALLOW_UNAUTHENTICATED_ROUTER", "false"),
];

/// The router process; killed (and reaped) when dropped.
struct RouterProcess {
    child: Child,
    lines: Receiver<String>,
    log: Vec<String>,
}

impl Drop for RouterProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl RouterProcess {
    /// Starts the binary with exactly `env` (plus `KUBECONFIG` and `HOME`) and `args`.
    fn start(kubeconfig: &std::path::Path, env: &[(&str, &str)], args: &[String]) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_sandbox-router"));
        command
            .env_clear()
            .env("KUBECONFIG", kubeconfig)
            .env("HOME", kubeconfig.parent().unwrap())
            .env("RUST_LOG", "info")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (name, value) in env {
            command.env(name, value);
        }
        let mut child = command.spawn().unwrap();
        let stderr = child.stderr.take().unwrap();
        let (lines_tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let _ = lines_tx.send(line);
            }
        });
        Self {
            child,
            lines,
            log: Vec::new(),
        }
    }

    /// Waits (bounded) for a log line containing `needle`; `None` if the process exited first.
    fn wait_for_line(&mut self, needle: &str) -> Option<String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.log.push(line.clone());
                    if line.contains(needle) {
                        return Some(line);
                    }
                }
                Err(RecvTimeoutError::Disconnected) => return None,
                Err(RecvTimeoutError::Timeout) => {
                    panic!("no line with {needle:?} within 30 s: {:#?}", self.log)
                }
            }
        }
    }

    /// Every line logged, once the process has exited.
    fn log_after_exit(&mut self) -> String {
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(10)) {
            self.log.push(line);
        }
        self.log.join("\n")
    }

    /// Every line logged so far.
    fn drain(&mut self) -> &[String] {
        self.log.extend(self.lines.try_iter());
        &self.log
    }
}

/// A router started with `args` (`{ip}` replaced by a fresh loopback address) that reached
/// "listening"; retried on another address if one was taken.
fn start_on_fresh_ip(
    kubeconfig: &std::path::Path,
    env: &[(&str, &str)],
    args: &[&str],
) -> (RouterProcess, IpAddr) {
    for _ in 0..5 {
        let ip = common::loopback_ip();
        let args: Vec<String> = args
            .iter()
            .map(|arg| arg.replace("{ip}", &ip.to_string()))
            .collect();
        let env: Vec<(&str, String)> = env
            .iter()
            .map(|(k, v)| (*k, v.replace("{ip}", &ip.to_string())))
            .collect();
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let mut router = RouterProcess::start(kubeconfig, &env, &args);
        if router
            .wait_for_line("sandbox-router listening on")
            .is_some()
        {
            return (router, ip);
        }
        let log = router.log_after_exit();
        assert!(log.contains("failed to listen"), "{log}");
    }
    panic!("no free loopback address after 5 attempts");
}

/// Waits until `GET /readyz` on `addr` answers 200; fails with the router's log otherwise.
async fn until_ready(addr: SocketAddr, router: &mut RouterProcess) {
    let ready = common::eventually(Duration::from_secs(30), move || async move {
        let readyz = common::send(addr, Method::GET, "/readyz", &[], Bytes::new()).await;
        (readyz.status == StatusCode::OK).then_some(())
    })
    .await;
    if ready.is_none() {
        let readyz = common::send(addr, Method::GET, "/readyz", &[], Bytes::new()).await;
        panic!(
            "{addr}/readyz never answered 200 (last: {} {}): {:#?}",
            readyz.status,
            readyz.text(),
            router.drain()
        );
    }
}

async fn exec(addr: SocketAddr, headers: &[(&str, &str)]) -> common::Reply {
    common::send(
        addr,
        Method::POST,
        "/execute",
        headers,
        execute("echo upstream manifests"),
    )
    .await
}

/// Upstream's RBAC for its Go router grants pods only: the fake API refuses Sandboxes.
async fn pods_only_cluster(runtime: &Runtime) -> (FakeApi, agent_sandbox_api::Sandbox) {
    let api = FakeApi::start().await;
    api.forbid_sandboxes();
    let box_ = sandbox("box");
    api.apply_pod(&pod_for(&box_, runtime.ip, &[]));
    (api, box_)
}

#[tokio::test]
async fn upstream_go_deployment_arguments_start_a_working_router_under_pods_only_rbac() {
    let runtime = Runtime::start();
    let (api, _) = pods_only_cluster(&runtime).await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = api.kubeconfig(dir.path());
    let (mut router, ip) = start_on_fresh_ip(&kubeconfig, &[], &GO_DEPLOYMENT_ARGS);
    let proxy = SocketAddr::new(ip, ROUTER_PORT);
    let probes = SocketAddr::new(ip, ROUTER_HEALTH_PORT);
    let metrics = SocketAddr::new(ip, ROUTER_METRICS_PORT);

    // The manifest's probes: /healthz and /readyz on 8081.
    let healthz = common::send(probes, Method::GET, "/healthz", &[], Bytes::new()).await;
    assert_eq!(healthz.status, StatusCode::OK);
    until_ready(probes, &mut router).await;
    // Each extra listener serves its own endpoints only.
    let scrape = common::send(metrics, Method::GET, "/metrics", &[], Bytes::new()).await;
    assert_eq!(scrape.status, StatusCode::OK);
    assert!(
        scrape.text().contains("sandbox_router_"),
        "{}",
        scrape.text()
    );
    let wrong = common::send(probes, Method::GET, "/metrics", &[], Bytes::new()).await;
    assert_eq!(wrong.status, StatusCode::NOT_FOUND);

    // No authz flag: the Go router's allow-all; routed from the pod alone.
    let reply = exec(proxy, &[("x-sandbox-id", "box")]).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(reply.json()["stdout"], "upstream manifests\n");
    let missing = exec(proxy, &[("x-sandbox-id", "nobody")]).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);

    let log = router.drain().join("\n");
    assert_eq!(
        log.matches("routing from pods alone").count(),
        1,
        "the degrade is said once: {log}"
    );
    for needle in [
        "--authz-mode=allow-all",
        "authentication is off",
        "--cluster-domain=\"cluster.local\" has no effect",
        "probes (/healthz, /readyz) listening on",
        "metrics (/metrics) listening on",
    ] {
        assert!(log.contains(needle), "{needle}: {log}");
    }
}

#[tokio::test]
async fn go_spellings_with_scoped_tokens_v2() {
    let runtime = Runtime::start();
    let (api, box_) = pods_only_cluster(&runtime).await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = api.kubeconfig(dir.path());
    let key = v2::PrivateKey::from_seed([5; 32]);
    let keys = dir.path().join("keys.json");
    std::fs::write(&keys, key.key_file("2026-12").unwrap()).unwrap();
    let keys_flag = format!(
        "-authz-scoped-token-verification-keys-file={}",
        keys.display()
    );
    // Single dashes, a bare boolean, a value after a space: all of Go's spellings.
    let (mut router, ip) = start_on_fresh_ip(
        &kubeconfig,
        &[],
        &[
            "-http-bind-address={ip}:8080",
            "-health-probe-bind-address",
            "{ip}:8081",
            "-metrics-bind-address=0",
            "--authz-mode",
            "scoped-token",
            &keys_flag,
            "-cache-enabled",
            "-proxy-timeout=1m",
        ],
    );
    let proxy = SocketAddr::new(ip, ROUTER_PORT);
    until_ready(SocketAddr::new(ip, ROUTER_HEALTH_PORT), &mut router).await;

    let uid = box_.metadata.uid.clone().unwrap();
    let mint = |path: &str| {
        let target = v2::Target {
            namespace: "default".to_owned(),
            name: "box".to_owned(),
            uid: uid.clone(),
            port: 8888,
            method: "POST".to_owned(),
            path: path.to_owned(),
        };
        let exp = i64::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs()
                + 600,
        )
        .unwrap();
        let claims = v2::Claims::for_target(&target, exp).unwrap();
        format!("Bearer {}", v2::mint(&key, "2026-12", &claims).unwrap())
    };
    let token = mint("/execute");
    let reply = exec(
        proxy,
        &[
            ("x-sandbox-id", "box"),
            ("x-sandbox-uid", &uid),
            ("authorization", &token),
        ],
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    // Without X-Sandbox-UID, for another path, without a token: refused.
    let no_uid = exec(proxy, &[("x-sandbox-id", "box"), ("authorization", &token)]).await;
    assert_eq!(no_uid.status, StatusCode::FORBIDDEN, "{}", no_uid.text());
    let other_path = mint("/upload");
    let wrong = exec(
        proxy,
        &[
            ("x-sandbox-id", "box"),
            ("x-sandbox-uid", &uid),
            ("authorization", &other_path),
        ],
    )
    .await;
    assert_eq!(wrong.status, StatusCode::FORBIDDEN);
    assert!(wrong.detail().contains("path"), "{}", wrong.detail());
    let anonymous = exec(proxy, &[("x-sandbox-id", "box")]).await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn upstream_python_deployment_environment() {
    let runtime = Runtime::start();
    let api = FakeApi::start().await;
    let box_ = sandbox("box");
    api.apply_sandbox(&box_);
    api.apply_pod(&pod_for(&box_, runtime.ip, &[]));
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = api.kubeconfig(dir.path());

    // As shipped (token commented out): refused, as upstream's router refuses, saying how.
    let mut shipped = RouterProcess::start(&kubeconfig, &PYTHON_DEPLOYMENT_ENV, &[]);
    let status = shipped.child.wait().unwrap();
    assert_eq!(status.code(), Some(2));
    let log = shipped.log_after_exit();
    assert!(
        log.contains("ALLOW_UNAUTHENTICATED_ROUTER is \"false\""),
        "{log}"
    );
    assert!(log.contains("ROUTER_AUTH_TOKEN"), "{log}");

    // With the ROUTER_AUTH_TOKEN lines enabled. The only addition is where to listen: the
    // Python router listens on every address at 8080, ours too by default, but a test keeps to
    // one loopback address.
    let mut env: Vec<(&str, &str)> = PYTHON_DEPLOYMENT_ENV.to_vec();
    env.push(("ROUTER_AUTH_TOKEN", "upstream-token-from-a-secret\n"));
    env.push(("SANDBOX_ROUTER_LISTEN", "{ip}:8080"));
    let (mut router, ip) = start_on_fresh_ip(&kubeconfig, &env, &[]);
    let addr = SocketAddr::new(ip, ROUTER_PORT);
    let healthz = common::send(addr, Method::GET, "/healthz", &[], Bytes::new()).await;
    assert_eq!(healthz.status, StatusCode::OK);
    until_ready(addr, &mut router).await;
    let anonymous = exec(addr, &[("x-sandbox-id", "box")]).await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
    let wrong = exec(
        addr,
        &[("x-sandbox-id", "box"), ("authorization", "Bearer nope")],
    )
    .await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    let reply = exec(
        addr,
        &[
            ("x-sandbox-id", "box"),
            ("authorization", "Bearer upstream-token-from-a-secret"),
        ],
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let log = router.drain().join("\n");
    for needle in [
        "WEBSOCKET_IDLE_TIMEOUT_SECONDS has no effect",
        "WEBSOCKET_MAX_LIFETIME_SECONDS has no effect",
        "WEBSOCKET_MAX_MESSAGE_BYTES has no effect",
        "WEBSOCKET_MAX_CONNECTIONS_PER_CLIENT has no effect",
        "tokens shorter than 32 bytes",
    ] {
        assert_eq!(log.matches(needle).count(), 1, "{needle}: {log}");
    }
}

#[tokio::test]
async fn allow_unauthenticated_router_alone_starts_an_open_router() {
    let runtime = Runtime::start();
    let api = FakeApi::start().await;
    let box_ = sandbox("box");
    api.apply_sandbox(&box_);
    api.apply_pod(&pod_for(&box_, runtime.ip, &[]));
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = api.kubeconfig(dir.path());
    // examples/kata-aks/router.yaml's env, plus the loopback listen address.
    let (mut router, ip) = start_on_fresh_ip(
        &kubeconfig,
        &[
            ("PROXY_TIMEOUT_SECONDS", "180"),
            ("ALLOW_UNAUTHENTICATED_ROUTER", "true"),
            ("SANDBOX_ROUTER_LISTEN", "{ip}:8080"),
        ],
        &[],
    );
    let addr = SocketAddr::new(ip, ROUTER_PORT);
    until_ready(addr, &mut router).await;
    let reply = exec(addr, &[("x-sandbox-id", "box")]).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
}
