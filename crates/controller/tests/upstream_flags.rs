//! The `agent-sandbox-controller` binary started with upstream's argument lists, exactly as
//! upstream's manifests pass them (`k8s/controller.yaml`, `k8s/extensions.controller.yaml`, the
//! Helm chart's `_controller-args.tpl` with every value of its `values.yaml` set to the default
//! written there, and a 0.5 list with the webhook flags), against the simulated cluster: it
//! serves its probes, reconciles a Sandbox and binds a claim, names upstream's no-effect flags
//! in one warning, and exits 0 on SIGTERM. Also `--version`, and bad values of upstream's flags
//! (exit status 2, one line naming the flag).
//!
//! Every listener is on 127.0.0.1 (the lists' own `:8080`/`:8081` are overridden by later
//! flags, as Go's last-wins rule allows), and every process a test starts is ended by it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use agent_sandbox_api::claim::SandboxWarmPoolRef;
use agent_sandbox_api::conditions::{claim as claim_cond, sandbox as sandbox_cond};
use agent_sandbox_api::sandbox::{PodTemplate, SandboxBlueprint};
use agent_sandbox_api::warm_pool::SandboxTemplateRef;
use agent_sandbox_api::{
    Sandbox, SandboxClaim, SandboxClaimSpec, SandboxSpec, SandboxTemplate, SandboxTemplateSpec,
    SandboxWarmPool, SandboxWarmPoolSpec,
};
use agent_sandbox_local::testkit;
use agent_sandbox_local::{LocalCluster, LocalConfig};
use k8s_openapi::api::core::v1::{Container, ContainerPort, PodSpec};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Api;
use kube::api::{DeleteParams, PostParams};

const NS: &str = "default";
const WAIT: Duration = Duration::from_secs(90);
const BINARY: &str = env!("CARGO_BIN_EXE_agent-sandbox-controller");

/// `k8s/controller.yaml` (v1.0.3 and v0.5.6).
const CORE: &[&str] = &["--leader-elect=true"];
/// `k8s/extensions.controller.yaml` and the kustomization's patch (v1.0.3 and v0.5.6).
const EXTENSIONS: &[&str] = &["--leader-elect=true", "--extensions"];
/// `helm/templates/_controller-args.tpl` (v1.0.3) rendered with every value `values.yaml` lists
/// set to the default written beside it (`extensions` and `leaderElect` are set there already;
/// `leaderElectionNamespace: ""` renders as an empty value), in the template's order.
const HELM: &[&str] = &[
    "--leader-elect=true",
    "--cluster-domain=cluster.local",
    "--leader-election-namespace=",
    "--extensions=false",
    "--enable-tracing=false",
    "--enable-pprof=false",
    "--enable-pprof-debug=false",
    "--pprof-block-profile-rate=1000000",
    "--pprof-mutex-profile-fraction=10",
    "--kube-api-qps=-1.0",
    "--kube-api-burst=10",
    "--sandbox-concurrent-workers=100",
    "--sandbox-claim-concurrent-workers=50",
    "--sandbox-warm-pool-concurrent-workers=1",
    "--sandbox-template-concurrent-workers=1",
    "--sandbox-warm-pool-max-batch-size=300",
    "--sandbox-warm-pool-readiness-grace-period=5m",
    "--sandbox-warm-pool-unschedulable-recheck-interval=1m",
    "--enable-warm-pool-eviction=true",
];
/// The 0.5.6 controller's webhook flags at their defaults, in Go's other spellings (one dash,
/// a separate value, a bare boolean), after its manifests' own arguments.
const V05_WEBHOOK: &[&str] = &[
    "--leader-elect=true",
    "--extensions",
    "-webhook-port=9443",
    "--webhook-cert-dir",
    "/tmp/k8s-webhook-server/serving-certs",
    "-webhook-cert-name",
    "tls.crt",
    "--webhook-key-name=tls.key",
    "--webhook-service-name=agent-sandbox-webhook-service",
    "--webhook-namespace=agent-sandbox-system",
    "--manage-webhook-certs=true",
    "-enable-webhook",
];

/// The controller process; killed (and reaped) when dropped, so a failing assertion leaves no
/// process behind.
struct Controller {
    child: Child,
    log: PathBuf,
    health: SocketAddr,
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Controller {
    /// Starts the binary with `args`, then loopback listeners on free ports, against `cluster`.
    fn start(cluster: &LocalCluster, name: &str, args: &[&str]) -> Self {
        let metrics = free_addr();
        let health = free_addr();
        let log = cluster.data_dir().join(format!("{name}.controller.log"));
        let mut command = Command::new(BINARY);
        command
            .args(args)
            .arg(format!("--metrics-bind-address={metrics}"))
            .arg(format!("--health-probe-bind-address={health}"))
            .env("KUBECONFIG", cluster.kubeconfig_path())
            .env("POD_NAMESPACE", NS)
            .env("RUST_LOG", "info")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("KUBERNETES_SERVICE_PORT")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        clear_controller_env(&mut command);
        Self {
            child: command.spawn().unwrap(),
            log,
            health,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until `/healthz` and `/readyz` answer 200 (failing at once if the process ended).
    async fn wait_until_ready(&mut self) {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("the controller exited ({status}):\n{}", self.log());
            }
            let healthz = http_status(self.health, "/healthz").await;
            let readyz = http_status(self.health, "/readyz").await;
            if healthz == Some(200) && readyz == Some(200) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "not ready (healthz {healthz:?}, readyz {readyz:?}):\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Sends SIGTERM and waits for the exit status.
    async fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(sent.success(), "kill -TERM {pid}");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no exit 30 s after SIGTERM:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Our environment fallbacks would change what the flags say; the tests pass flags only.
fn clear_controller_env(command: &mut Command) {
    for (name, _) in std::env::vars() {
        if name.starts_with("SANDBOX_CONTROLLER_") {
            command.env_remove(name);
        }
    }
}

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

async fn http_status(addr: SocketAddr, path: &str) -> Option<u16> {
    let answer = testkit::http::get(&format!("http://{addr}{path}"))
        .await
        .ok()?;
    Some(answer.status.as_u16())
}

fn runtime_pod_spec() -> PodSpec {
    PodSpec {
        containers: vec![Container {
            name: "runtime".into(),
            image: Some("registry.example.com/python-runtime:latest".into()),
            ports: Some(vec![ContainerPort {
                container_port: 8888,
                ..ContainerPort::default()
            }]),
            ..Container::default()
        }],
        ..PodSpec::default()
    }
}

fn blueprint() -> SandboxBlueprint {
    SandboxBlueprint {
        pod_template: PodTemplate {
            spec: runtime_pod_spec(),
            ..PodTemplate::default()
        },
        ..SandboxBlueprint::default()
    }
}

fn is_true(conditions: &[Condition], type_: &str) -> bool {
    conditions
        .iter()
        .any(|c| c.type_ == type_ && c.status == "True")
}

/// Polls `get` until `check` holds, for at most [`WAIT`].
async fn wait_for<T, F, Fut>(
    controller: &Controller,
    what: &str,
    mut get: F,
    check: impl Fn(&T) -> bool,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(value) = get().await
            && check(&value)
        {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}:\n{}",
            controller.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn cluster() -> LocalCluster {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    LocalCluster::start(LocalConfig {
        runtime: testkit::runtime_program().unwrap(),
        ..LocalConfig::api_only()
    })
    .await
    .unwrap()
}

/// Which controllers an argument list runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Runs {
    /// All four.
    All,
    /// The Sandbox controller alone (upstream's `--extensions=false`).
    SandboxOnly,
}

/// Starts the binary with `args` against a fresh cluster and checks that it serves its probes
/// and reconciles ([`reconciles`]), then exits 0 on SIGTERM; returns its log.
async fn reconciles_with(name: &str, args: &[&str], runs: Runs) -> String {
    let cluster = cluster().await;
    let mut controller = Controller::start(&cluster, name, args);
    controller.wait_until_ready().await;
    reconciles(&cluster, &controller, runs).await;
    let status = controller.terminate().await;
    let log = controller.log();
    assert_eq!(status.code(), Some(0), "exit status after SIGTERM:\n{log}");
    log
}

/// Makes a Sandbox Ready; then, where the extension kinds are served, creates a template, a pool
/// and a claim, which are served with [`Runs::All`] and left alone with [`Runs::SandboxOnly`].
async fn reconciles(cluster: &LocalCluster, controller: &Controller, runs: Runs) {
    let client = cluster.client();
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), NS);
    sandboxes
        .create(
            &PostParams::default(),
            &Sandbox::new(
                "plain",
                SandboxSpec {
                    blueprint: blueprint(),
                    ..SandboxSpec::default()
                },
            ),
        )
        .await
        .unwrap();
    wait_for(
        controller,
        "Sandbox plain to be Ready",
        || async { sandboxes.get_opt("plain").await.ok().flatten() },
        |sandbox: &Sandbox| {
            sandbox
                .status
                .as_ref()
                .is_some_and(|s| is_true(&s.conditions, sandbox_cond::READY))
        },
    )
    .await;
    if runs == Runs::SandboxOnly
        && client
            .list_api_group_resources("extensions.agents.x-k8s.io/v1beta1")
            .await
            .is_err()
    {
        // Upstream's core-only install: no extension kinds to create.
        return;
    }

    let templates: Api<SandboxTemplate> = Api::namespaced(client.clone(), NS);
    templates
        .create(
            &PostParams::default(),
            &SandboxTemplate::new(
                "tpl",
                SandboxTemplateSpec {
                    blueprint: blueprint(),
                    ..SandboxTemplateSpec::default()
                },
            ),
        )
        .await
        .unwrap();
    let pools: Api<SandboxWarmPool> = Api::namespaced(client.clone(), NS);
    pools
        .create(
            &PostParams::default(),
            &SandboxWarmPool::new(
                "pool",
                SandboxWarmPoolSpec {
                    replicas: 1,
                    sandbox_template_ref: SandboxTemplateRef { name: "tpl".into() },
                    update_strategy: None,
                    claim_defaults: None,
                },
            ),
        )
        .await
        .unwrap();
    let claims: Api<SandboxClaim> = Api::namespaced(client.clone(), NS);
    claims
        .create(
            &PostParams::default(),
            &SandboxClaim::new(
                "claim",
                SandboxClaimSpec {
                    warm_pool_ref: SandboxWarmPoolRef {
                        name: "pool".into(),
                    },
                    ..SandboxClaimSpec::default()
                },
            ),
        )
        .await
        .unwrap();
    if runs == Runs::All {
        wait_for(
            controller,
            "SandboxClaim claim to be bound and Ready",
            || async { claims.get_opt("claim").await.ok().flatten() },
            |claim: &SandboxClaim| {
                claim.status.as_ref().is_some_and(|s| {
                    !s.sandbox.name.is_empty() && is_true(&s.conditions, claim_cond::READY)
                })
            },
        )
        .await;
        return;
    }
    // With the Sandbox controller alone the pool gets no member and the claim no status (the
    // pool controller creates a member within a second).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let names: Vec<String> = sandboxes
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|sandbox| sandbox.metadata.name)
        .collect();
    assert_eq!(names, ["plain"], "{}", controller.log());
    let claim = claims.get("claim").await.unwrap();
    assert!(claim.status.is_none(), "{claim:?}");
    let pool = pools.get("pool").await.unwrap();
    assert!(pool.status.is_none(), "{pool:?}");
}

/// The flags a warning line names (its `--` words; the field is `flags=--a --b`).
fn named_flags(line: &str) -> Vec<&str> {
    line.split_whitespace()
        .map(|word| word.strip_prefix("flags=").unwrap_or(word))
        .filter(|word| word.starts_with("--"))
        .collect()
}

/// The one warning line naming upstream's no-effect flags (asserting there is exactly one).
fn no_effect_line(log: &str) -> Option<String> {
    let lines: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("accepted with no effect"))
        .collect();
    assert!(lines.len() <= 1, "logged more than once:\n{log}");
    lines.first().map(|line| (*line).to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_core_manifest_arguments() {
    let log = reconciles_with("core", CORE, Runs::All).await;
    assert_eq!(no_effect_line(&log), None, "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_extensions_manifest_arguments() {
    let log = reconciles_with("extensions", EXTENSIONS, Runs::All).await;
    assert_eq!(no_effect_line(&log), None, "{log}");
    assert!(!log.contains("--extensions=false"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_helm_chart_arguments() {
    // The chart's default `extensions: false` means upstream's Sandbox controller alone.
    let log = reconciles_with("helm", HELM, Runs::SandboxOnly).await;
    let line = no_effect_line(&log).unwrap_or_else(|| panic!("no warning:\n{log}"));
    let named = named_flags(&line);
    for flag in [
        "--enable-tracing",
        "--enable-pprof",
        "--enable-pprof-debug",
        "--pprof-block-profile-rate",
        "--pprof-mutex-profile-fraction",
    ] {
        assert!(named.contains(&flag), "{flag} not named in {line}");
    }
    // Flags that act here are not named.
    for flag in [
        "--kube-api-qps",
        "--sandbox-concurrent-workers",
        "--leader-elect",
    ] {
        assert!(!line.contains(flag), "{flag} named in {line}");
    }
    assert_eq!(
        log.lines()
            .filter(|l| l.contains("--extensions=false: the Sandbox controller alone"))
            .count(),
        1,
        "{log}"
    );
    // The workers the chart asked for are the ones used.
    assert!(
        log.contains("sandbox: 100, claim: 50, warm_pool: 1, template: 1"),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_0_5_webhook_arguments() {
    let log = reconciles_with("v05", V05_WEBHOOK, Runs::All).await;
    let line = no_effect_line(&log).unwrap_or_else(|| panic!("no warning:\n{log}"));
    let named = named_flags(&line);
    for flag in [
        "--webhook-port",
        "--webhook-cert-dir",
        "--webhook-cert-name",
        "--webhook-key-name",
        "--webhook-service-name",
        "--webhook-namespace",
        "--manage-webhook-certs",
        "--enable-webhook",
    ] {
        assert!(named.contains(&flag), "{flag} not named in {line}");
    }
    assert_eq!(named.len(), 8, "only the webhook flags: {line}");
}

/// `--kube-api-qps`/`--kube-api-burst` limit what the binary sends: at 1 a second with a burst
/// of 1, its startup (CRD checks, the Lease, a list and a watch per kind: some twenty requests,
/// sent within a second without a limit, and well over five in three seconds on a loaded
/// machine) is spread out. It still shuts down cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_rate_limit_paces_every_request() {
    let cluster = cluster().await;
    let total = || cluster.request_counts().0.values().sum::<u64>();
    let before = total();
    let mut controller = Controller::start(
        &cluster,
        "qps",
        &[
            "-kube-api-qps",
            "1",
            "--kube-api-burst=1",
            "--leader-elect=true",
        ],
    );
    // From its first request (the burst) on, as a loaded machine may start it slowly.
    let deadline = tokio::time::Instant::now() + WAIT;
    while total() == before {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no request:\n{}",
            controller.log()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let first = total();
    let started = std::time::Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let sent = total() - first;
    let elapsed = started.elapsed().as_secs_f64();
    assert!(
        controller.child.try_wait().unwrap().is_none(),
        "the controller exited:\n{}",
        controller.log()
    );
    // 1 a second, plus one in flight at each end of the window.
    let allowed = 2 + elapsed.ceil() as u64;
    assert!(
        sent <= allowed,
        "{sent} requests in {elapsed:.2} s (at most {allowed}):\n{}",
        controller.log()
    );
    assert_eq!(
        controller.terminate().await.code(),
        Some(0),
        "{}",
        controller.log()
    );
}

/// Under upstream's core-only install (the Sandbox CRD alone) with upstream's core manifest
/// arguments the controller names the first missing CRD and exits 1 (docs/controller.md, "Flags
/// and defaults"); with `--extensions=false` it runs. The check reads API discovery, which
/// upstream's ClusterRoles do not restrict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_only_the_sandbox_crd_it_runs_the_sandbox_controller_alone() {
    let cluster = cluster().await;
    let client = cluster.client();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for kind in ["sandboxtemplates", "sandboxwarmpools", "sandboxclaims"] {
        crds.delete(
            &format!("{kind}.extensions.agents.x-k8s.io"),
            &DeleteParams::default(),
        )
        .await
        .unwrap();
    }
    let deadline = tokio::time::Instant::now() + WAIT;
    while client
        .list_api_group_resources("extensions.agents.x-k8s.io/v1beta1")
        .await
        .is_ok_and(|list| !list.resources.is_empty())
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the CRDs stay served"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Upstream's core-only manifest (`k8s/controller.yaml`: no `--extensions`, the Sandbox CRD
    // alone): the Sandbox controller runs alone and says which CRD is missing.
    let mut controller = Controller::start(&cluster, "core-only", CORE);
    controller.wait_until_ready().await;
    reconciles(&cluster, &controller, Runs::SandboxOnly).await;
    let log = controller.log();
    assert!(
        log.contains("running the Sandbox controller alone")
            && log.contains("sandboxtemplates.extensions.agents.x-k8s.io"),
        "{log}"
    );
    let status = controller.terminate().await;
    assert_eq!(status.code(), Some(0), "{}", controller.log());
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), NS);
    sandboxes
        .delete("plain", &DeleteParams::default())
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    while sandboxes.get_opt("plain").await.unwrap().is_some() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "Sandbox plain stays"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Asked for the extensions explicitly, it refuses to start and names the first missing CRD.
    let mut controller = Controller::start(
        &cluster,
        "core-only-extensions",
        &["--leader-elect=true", "--extensions"],
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = controller.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still running:\n{}",
            controller.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let log = controller.log();
    assert_eq!(status.code(), Some(1), "{log}");
    let last = log.lines().last().unwrap_or_default();
    assert!(
        last.contains("error")
            && last.contains("sandboxtemplates.extensions.agents.x-k8s.io")
            && last.contains("not installed"),
        "{log}"
    );
    drop(controller);

    // With `--extensions=false`, as upstream's Helm chart passes it, no warning either.
    let mut controller = Controller::start(
        &cluster,
        "core-only-sandboxes",
        &["--leader-elect=true", "--extensions=false"],
    );
    controller.wait_until_ready().await;
    reconciles(&cluster, &controller, Runs::SandboxOnly).await;
    assert!(
        !controller
            .log()
            .contains("running the Sandbox controller alone"),
        "{}",
        controller.log()
    );
    let status = controller.terminate().await;
    assert_eq!(status.code(), Some(0), "{}", controller.log());
}

/// Runs the binary to its end (it must end within 30 s) and returns its output.
fn run_to_end(args: &[&str]) -> std::process::Output {
    run_to_end_with(args, &[])
}

/// [`run_to_end`] with environment variables.
fn run_to_end_with(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut command = Command::new(BINARY);
    command
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .env("KUBECONFIG", "/nonexistent/agent-sandbox/kubeconfig")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    clear_controller_env(&mut command);
    for (name, value) in env {
        command.env(name, value);
    }
    let child = command.spawn().unwrap();
    let pid = child.id();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let output = child.wait_with_output();
        let _ = done_tx.send(());
        output
    });
    if done_rx.recv_timeout(Duration::from_secs(30)).is_err() {
        let _ = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
        let _ = waiter.join();
        panic!("{args:?} did not exit within 30 s");
    }
    waiter.join().unwrap().unwrap()
}

#[test]
fn version_prints_and_exits_0() {
    for args in [
        &["--version"][..],
        &["-version"][..],
        &["--version=true", "--leader-elect"][..],
    ] {
        let output = run_to_end(args);
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert_eq!(output.status.code(), Some(0), "{args:?}: {output:?}");
        assert_eq!(
            stdout.trim(),
            format!("agent-sandbox-controller {}", env!("CARGO_PKG_VERSION")),
            "{args:?}"
        );
    }
}

/// A bad value of one of upstream's flags: exit status 2 and one line that names the flag (and
/// no backtrace), before any attempt to reach a cluster.
#[track_caller]
fn assert_refused(args: &[&str], flag: &str) {
    let output = run_to_end(args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{args:?}: one line, not:\n{stderr}");
    assert!(
        lines[0].contains("error") && lines[0].contains(flag),
        "{args:?}: {flag} not named in {stderr}"
    );
    assert!(
        !stderr.to_ascii_lowercase().contains("backtrace") && !stderr.contains("panicked"),
        "{args:?}: {stderr}"
    );
}

#[test]
fn bad_values_of_upstream_flags_exit_2_naming_the_flag() {
    assert_refused(&["--kube-api-burst=0"], "--kube-api-burst");
    assert_refused(&["--kube-api-burst", "-3"], "--kube-api-burst");
    assert_refused(&["--kube-api-qps=NaN"], "--kube-api-qps");
    for rate in ["-1", "NaN", "Inf", "+Inf"] {
        assert_refused(
            &[&format!("--sandbox-warm-pool-max-refill-rate={rate}")],
            "--sandbox-warm-pool-max-refill-rate",
        );
    }
    assert_refused(
        &["--sandbox-warm-pool-max-refill-rate", "-1"],
        "--sandbox-warm-pool-max-refill-rate",
    );
    assert_refused(
        &["--sandbox-concurrent-workers=0"],
        "--sandbox-concurrent-workers",
    );
    assert_refused(
        &["--sandbox-template-concurrent-workers=0"],
        "--sandbox-template-concurrent-workers",
    );
    assert_refused(&["--api-connections=0"], "--api-connections");
    assert_refused(
        &["--sandbox-warm-pool-unschedulable-recheck-interval=0s"],
        "--sandbox-warm-pool-unschedulable-recheck-interval",
    );
    assert_refused(
        &["--sandbox-warm-pool-readiness-grace-period=0"],
        "--sandbox-warm-pool-readiness-grace-period",
    );
    // Malformed values are clap's errors, which name the flag too.
    assert_refused(&["--leader-elect=yes"], "--leader-elect");
    assert_refused(&["--zap-log-level=verbose"], "--zap-log-level");
    assert_refused(&["--zap-encoder=xml"], "--zap-encoder");
    assert_refused(
        &["--pprof-block-profile-rate=often"],
        "--pprof-block-profile-rate",
    );
    assert_refused(&["--webhook-port=https"], "--webhook-port");
    // A bare boolean never takes the next argument: here `false` is an unexpected argument.
    assert_refused(&["--leader-elect", "false"], "false");
}

/// Our environment fallbacks apply to upstream's flags that act here; a flag wins over them.
#[test]
fn environment_fallbacks_apply_and_flags_win() {
    let output = run_to_end_with(&[], &[("SANDBOX_CONTROLLER_KUBE_API_BURST", "0")]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--kube-api-burst"), "{stderr}");
    let output = run_to_end_with(
        &["--kube-api-burst=5", "--leader-elect=false"],
        &[
            ("SANDBOX_CONTROLLER_KUBE_API_BURST", "0"),
            ("SANDBOX_CONTROLLER_WARM_POOL_MAX_REFILL_RATE", "2.5"),
        ],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    // Past the flags, to the (missing) kubeconfig.
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("/nonexistent/agent-sandbox/kubeconfig") && !stderr.contains("burst"),
        "{stderr}"
    );
}

/// `--kubeconfig` (one dash, as Go allows) wins over `KUBECONFIG`: the error names its file.
#[test]
fn an_unreadable_kubeconfig_flag_is_a_configuration_error() {
    let output = run_to_end(&[
        "-kubeconfig",
        "/nonexistent/agent-sandbox/other-kubeconfig",
        "--leader-elect=false",
        "--metrics-bind-address=0",
        "--health-probe-bind-address=0",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("/nonexistent/agent-sandbox/other-kubeconfig"),
        "{stderr}"
    );
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
}
