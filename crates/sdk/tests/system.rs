#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! System tests of the SDK on the simulated cluster: the controller and router of this
//! workspace, the real runtime as sandbox pods, the default template and a warm pool (the
//! in-process cluster of `agent_sandbox_local`). The seed article's smoke test runs once per
//! connection mode.

use std::time::{Duration, Instant};

use agent_sandbox::{
    ClientOptions, ConnectionMode, CreateOptions, Error, ExecEvent, ExecOptions, FileType,
    Progress, RetryPolicy,
};
use agent_sandbox_api::{SandboxClaim, annotations, labels};
use agent_sandbox_local::testkit::{self, NAMESPACE, POOL};
use agent_sandbox_local::{
    ConnectionKind, Isolation, LocalCluster, LocalConfig, PodNetworks, RouterAuth,
};
use kube::Api;
use pretty_assertions::assert_eq;
use tokio::io::AsyncReadExt as _;

fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("agent_sandbox=debug")),
        )
        .with_test_writer()
        .try_init();
}

/// How long the pool may take to fill.
const WAIT: Duration = Duration::from_secs(120);

/// A local cluster with the workspace's runtime as sandbox pods, an unauthenticated in-process
/// router (the `hold` example sends no token), the Gateway, a router pod for port-forward mode
/// when asked, and the default pool of `replicas`, full and Ready.
async fn start(replicas: i32, router_pod: bool) -> LocalCluster {
    let config = LocalConfig {
        runtime: testkit::runtime_program().unwrap(),
        router_auth: RouterAuth::None,
        pool_replicas: replicas,
        gateway: true,
        router_pod: router_pod.then(|| testkit::router_binary().unwrap()),
        // A router pod reaches the API server and the sandboxes: on the host's network here
        // (a bridge would change this machine's network).
        networks: if router_pod {
            PodNetworks::Host
        } else {
            PodNetworks::Isolated
        },
        ..LocalConfig::default()
    };
    let harness = LocalCluster::start(config).await.unwrap();
    harness
        .wait_for_pool(replicas, WAIT, |_, _| {})
        .await
        .unwrap();
    harness
}

async fn claim(harness: &LocalCluster, name: &str) -> Option<SandboxClaim> {
    Api::<SandboxClaim>::namespaced(harness.client(), NAMESPACE)
        .get_opt(name)
        .await
        .unwrap()
}

fn shutdown_time(claim: &SandboxClaim) -> Option<jiff::Timestamp> {
    claim
        .spec
        .lifecycle
        .as_ref()
        .and_then(|l| l.shutdown_time.as_ref())
        .map(|t| t.0)
}

/// The seed's smoke test: claim from a warm pool, report the ready latency, run a shell
/// command that names the pod, round-trip a file in a subdirectory, extend the TTL.
async fn smoke(mode: ConnectionKind) {
    init_tracing();
    let harness = start(2, mode == ConnectionKind::PortForward).await;
    let client = harness.sdk_client(mode).unwrap();

    let started = Instant::now();
    let sandbox = client.create_sandbox(POOL).await.unwrap();
    eprintln!(
        "[{mode:?}] sandbox ready in {:?}: claim={} sandbox={} pod={} via {:?}",
        started.elapsed(),
        sandbox.claim_name(),
        sandbox.sandbox_name(),
        sandbox.pod_name(),
        sandbox.router_url(),
    );
    assert!(sandbox.claim_name().starts_with("sandbox-claim-"));
    assert!(
        sandbox.sandbox_name().starts_with(POOL),
        "a warm member was adopted"
    );
    assert!(sandbox.is_ready());
    match mode {
        ConnectionKind::PortForward => assert!(sandbox.local_addr().is_some()),
        ConnectionKind::Gateway | ConnectionKind::Direct => {
            assert_eq!(sandbox.router_url().as_deref(), harness.router_url());
        }
    }
    let object = claim(&harness, sandbox.claim_name()).await.unwrap();
    assert_eq!(
        object.metadata.labels.unwrap()[labels::CREATED_BY],
        labels::CREATED_BY_RUST_CLIENT
    );
    assert!(
        object.metadata.annotations.unwrap()[annotations::CLIENT_FIRST_REQUESTED_AT]
            .parse::<jiff::Timestamp>()
            .is_ok()
    );

    let hello = sandbox
        .run_with(ExecOptions::shell("echo hello from $(hostname)"))
        .await
        .unwrap();
    eprintln!("[{mode:?}] run: {:?}", hello.stdout);
    assert_eq!(hello.exit_code, 0, "{hello:?}");
    if harness.isolation() == Isolation::Confined {
        // A confined pod has its own UTS namespace named after the pod.
        assert_eq!(hello.stdout, format!("hello from {}\n", sandbox.pod_name()));
    } else {
        assert!(hello.stdout.starts_with("hello from ") && !hello.stdout.contains("$("));
    }

    sandbox
        .write("work/notes/hello.txt", "hi from the smoke test\n")
        .await
        .unwrap();
    assert_eq!(
        sandbox.read("work/notes/hello.txt").await.unwrap(),
        "hi from the smoke test\n"
    );
    let entries = sandbox.list("work/notes").await.unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].name, "hello.txt");
    assert_eq!(entries[0].file_type, FileType::File);
    assert_eq!(entries[0].size, 23);

    let before = shutdown_time(&claim(&harness, sandbox.claim_name()).await.unwrap());
    let first = sandbox.extend_ttl(Duration::from_secs(300)).await.unwrap();
    let seen = shutdown_time(&claim(&harness, sandbox.claim_name()).await.unwrap());
    assert_eq!(seen.map(|t| t.as_second()), Some(first.as_second()));
    assert_ne!(before, seen);
    let second = sandbox.extend_ttl(Duration::from_secs(900)).await.unwrap();
    assert!(second > first);
    let moved = shutdown_time(&claim(&harness, sandbox.claim_name()).await.unwrap()).unwrap();
    assert_eq!(moved.as_second(), second.as_second());

    sandbox.close().await.unwrap();
    assert!(claim(&harness, sandbox.claim_name()).await.is_none());
    harness.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smoke_direct() {
    smoke(ConnectionKind::Direct).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smoke_port_forward() {
    smoke(ConnectionKind::PortForward).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smoke_gateway() {
    smoke(ConnectionKind::Gateway).await;
}

/// Every handle operation against the real runtime, and the claim lifecycle around them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handle_operations_and_claim_lifecycle() {
    init_tracing();
    let harness = start(2, false).await;
    let client = harness.sdk_client(ConnectionKind::Direct).unwrap();
    let steps = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = steps.clone();
    let sandbox = client
        .create_sandbox_with(
            POOL,
            CreateOptions::default()
                .shutdown_after(Duration::from_secs(600))
                .label("team", "sdk")
                .on_progress(move |step| seen.lock().unwrap().push(step.clone())),
        )
        .await
        .unwrap();
    let steps = steps.lock().unwrap().clone();
    assert!(
        matches!(steps.first(), Some(Progress::ClaimCreated { claim }) if claim == sandbox.claim_name())
    );
    assert_eq!(steps.last(), Some(&Progress::Connecting));

    // run: upstream semantics (no shell) and our options.
    let plain = sandbox.run("echo $HOME 'a b'").await.unwrap();
    assert_eq!(plain.stdout, "$HOME a b\n");
    let with = sandbox
        .run_with(
            ExecOptions::shell("cd sub && echo $GREETING $(cat) && pwd | tail -c 4")
                .cwd(".")
                .env("GREETING", "hi")
                .stdin("there"),
        )
        .await;
    // `sub` does not exist yet: the shell reports it, the call itself succeeds.
    assert_ne!(with.unwrap().exit_code, 0);
    sandbox.mkdir("sub/deeper").await.unwrap();
    let with = sandbox
        .run_with(
            ExecOptions::shell("cd sub && echo $GREETING $(cat)")
                .env("GREETING", "hi")
                .stdin("there"),
        )
        .await
        .unwrap();
    assert_eq!(with.stdout, "hi there\n");
    let slow = sandbox
        .run_with(ExecOptions::shell("sleep 5").timeout(Duration::from_millis(300)))
        .await
        .unwrap();
    assert!(slow.timed_out);
    assert_eq!(slow.exit_code, 124);

    // exec_stream: events in order, exit last.
    let stream = sandbox
        .exec_stream(ExecOptions::shell("echo out; echo err >&2; exit 3"))
        .await
        .unwrap();
    let output = stream.collect_output().await.unwrap();
    assert_eq!(output.stdout, b"out\n");
    assert_eq!(output.stderr, b"err\n");
    assert_eq!(output.exit_code(), Some(3));
    let mut stream = sandbox
        .exec_stream(ExecOptions::argv(["printf", "%s", "x y"]))
        .await
        .unwrap();
    let mut events = Vec::new();
    while let Some(event) = stream.next_event().await {
        events.push(event.unwrap());
    }
    assert!(matches!(events.first(), Some(ExecEvent::Start { .. })));
    assert!(matches!(events.last(), Some(ExecEvent::Exit(exit)) if exit.exit_code == Some(0)));

    // Background processes: start, read, follow, signal.
    let process = sandbox
        .start_process(ExecOptions::shell("echo ready; sleep 30"))
        .await
        .unwrap();
    let mut follower = sandbox.follow_output(&process.id, 0);
    match follower.next_event().await.unwrap().unwrap() {
        ExecEvent::Stdout(chunk) => assert_eq!(chunk.bytes().unwrap(), b"ready\n"),
        other => panic!("expected stdout, got {other:?}"),
    }
    assert_eq!(follower.offset(), 6);
    let listed = sandbox.processes().await.unwrap();
    assert!(listed.iter().any(|p| p.id == process.id));
    let partial = sandbox
        .process_output(&process.id, 6)
        .await
        .unwrap()
        .collect_output()
        .await
        .unwrap();
    assert!(partial.stdout.is_empty() && partial.exit.is_none());
    sandbox.signal_process(&process.id, "TERM").await.unwrap();
    let mut exit = None;
    while let Some(event) = follower.next_event().await {
        if let ExecEvent::Exit(info) = event.unwrap() {
            exit = Some(info);
        }
    }
    assert_eq!(exit.unwrap().signal, Some(15));
    sandbox.kill_process(&process.id).await.unwrap();
    assert!(
        sandbox
            .process(&process.id)
            .await
            .unwrap_err()
            .is_not_found()
    );

    // Files: streaming upload and download, exists, remove.
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    sandbox
        .upload("data/big.bin", std::io::Cursor::new(big.clone()))
        .await
        .unwrap();
    let mut download = sandbox.download("data/big.bin").await.unwrap();
    assert_eq!(download.content_length(), Some(big.len() as u64));
    let mut back = Vec::new();
    download.read_to_end(&mut back).await.unwrap();
    assert!(back == big, "downloaded bytes differ");
    let local = std::env::temp_dir().join(format!("sdk-upload-{}", std::process::id()));
    std::fs::write(&local, b"from a local file").unwrap();
    sandbox.upload_file("data/local.txt", &local).await.unwrap();
    std::fs::remove_file(&local).unwrap();
    assert_eq!(
        sandbox.read("data/local.txt").await.unwrap(),
        "from a local file"
    );
    assert!(sandbox.exists("data/big.bin").await.unwrap());
    assert!(!sandbox.exists("data/nope").await.unwrap());
    let err = sandbox.read("data/nope").await.unwrap_err();
    assert_eq!(err.status(), Some(404), "{err}");
    assert_eq!(
        sandbox.remove("data", false).await.unwrap_err().status(),
        Some(409)
    );
    sandbox.remove("data", true).await.unwrap();
    assert!(!sandbox.exists("data").await.unwrap());
    let names: Vec<String> = sandbox
        .list(".")
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert!(names.contains(&"sub".to_owned()), "{names:?}");

    // Listing shows the claim with its sandbox, pod, readiness and expiry.
    let claims = client.list().await.unwrap();
    let info = claims
        .iter()
        .find(|c| c.claim == sandbox.claim_name())
        .unwrap();
    assert_eq!(info.sandbox.as_deref(), Some(sandbox.sandbox_name()));
    assert_eq!(info.pod.as_deref(), Some(sandbox.pod_name()));
    assert!(info.ready);
    assert!(info.shutdown_time.is_some());
    assert_eq!(info.warm_pool, POOL);

    // Re-attach by claim name; disconnect keeps the claim; open reconnects.
    let again = client.get_sandbox(sandbox.claim_name()).await.unwrap();
    assert_eq!(again.pod_name(), sandbox.pod_name());
    sandbox.disconnect().await;
    assert!(!sandbox.is_ready());
    assert!(matches!(
        sandbox.run("true").await,
        Err(Error::NotConnected { .. })
    ));
    assert!(claim(&harness, sandbox.claim_name()).await.is_some());
    sandbox.open().await.unwrap();
    assert_eq!(sandbox.run("true").await.unwrap().exit_code, 0);

    // A scoped token for this sandbox verifies with the key it was minted with.
    let key = [7u8; 32];
    let token = sandbox.mint_token(&key, Duration::from_secs(60)).unwrap();
    let granted =
        agent_sandbox_api::token::verify(&key, &token, jiff::Timestamp::now().as_second()).unwrap();
    assert_eq!(granted.name, sandbox.sandbox_name());

    // delete_all deletes what this client created.
    assert_eq!(client.created_claims().len(), 1);
    assert_eq!(client.delete_all().await.unwrap(), 1);
    assert!(claim(&harness, sandbox.claim_name()).await.is_none());
    assert!(client.created_claims().is_empty());
    harness.stop().await;
}

/// A missing pool is a typed error and the claim is rolled back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_pool_is_a_typed_error_and_the_claim_is_rolled_back() {
    init_tracing();
    let harness = start(1, false).await;
    let client = harness.sdk_client(ConnectionKind::Direct).unwrap();
    let error = client.create_sandbox("no-such-pool").await.unwrap_err();
    match &error {
        Error::WarmPoolNotFound { pool, .. } => assert_eq!(pool, "no-such-pool"),
        other => panic!("expected WarmPoolNotFound, got {other:?}"),
    }
    assert!(
        client.list().await.unwrap().is_empty(),
        "the claim was deleted"
    );
    assert!(client.created_claims().is_empty());

    // A claim that cannot get Ready in time is rolled back too.
    let impatient = agent_sandbox::Client::from_kube(
        harness.client(),
        harness.client_options(ConnectionKind::Direct).unwrap(),
    );
    let error = impatient
        .create_sandbox_with(POOL, CreateOptions::default().ready_timeout(Duration::ZERO))
        .await
        .unwrap_err();
    assert!(matches!(error, Error::ClaimTimeout { .. }), "{error:?}");
    assert!(impatient.list().await.unwrap().is_empty());
    harness.stop().await;
}

/// Port-forward: the router namespace is explicit in errors, and a dead tunnel is detected
/// at once and repaired by `open()`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn port_forward_finds_the_router_and_detects_a_dead_tunnel() {
    init_tracing();
    let harness = start(1, true).await;

    // No router in `kube-system`: the error says where it looked and what to set.
    let wrong = agent_sandbox::Client::from_kube(
        harness.client(),
        ClientOptions::default()
            .namespace(NAMESPACE)
            .connection(ConnectionMode::port_forward_in("kube-system")),
    );
    let error = wrong.create_sandbox(POOL).await.unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains("[\"kube-system\"]") && text.contains("router_namespace"),
        "{text}"
    );
    assert!(wrong.list().await.unwrap().is_empty(), "rolled back");

    let client = harness.sdk_client(ConnectionKind::PortForward).unwrap();
    let sandbox = client.create_sandbox(POOL).await.unwrap();
    assert_eq!(
        sandbox.run("echo via tunnel").await.unwrap().stdout,
        "via tunnel\n"
    );

    // Kill the router pod: the handle turns not-ready without waiting for a timeout.
    let pods: Api<k8s_openapi::api::core::v1::Pod> =
        Api::namespaced(harness.client(), agent_sandbox_api::wire::SYSTEM_NAMESPACE);
    pods.delete("sandbox-router-0", &Default::default())
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while sandbox.is_ready() {
        assert!(
            Instant::now() < deadline,
            "the dead tunnel was never noticed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(matches!(
        sandbox.run("true").await,
        Err(Error::NotConnected { .. })
    ));

    // A new router pod; open() reconnects through it.
    harness.create_router_pod("sandbox-router-1").await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match sandbox.open().await {
            Ok(()) => break,
            Err(error) => {
                assert!(Instant::now() < deadline, "never reconnected: {error}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    assert_eq!(sandbox.run("echo again").await.unwrap().stdout, "again\n");
    sandbox.close().await.unwrap();
    harness.stop().await;
}

/// Commands are not replayed: a router that is down fails `run` after one attempt, while a
/// file operation retries (and reports how often it tried).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_are_sent_once_and_file_operations_retry() {
    init_tracing();
    let harness = start(1, false).await;
    let client = harness.sdk_client(ConnectionKind::Direct).unwrap();
    let sandbox = client.create_sandbox(POOL).await.unwrap();
    let claim_name = sandbox.claim_name().to_owned();

    // A client whose router URL points at a port nobody listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let broken = agent_sandbox::Client::from_kube(
        harness.client(),
        harness
            .client_options(ConnectionKind::Direct)
            .unwrap()
            .connection(ConnectionMode::direct(dead_url.clone()))
            .retry(
                RetryPolicy::attempts(3)
                    .backoff(Duration::from_millis(10), Duration::from_millis(20)),
            ),
    );
    let handle = broken.get_sandbox(&claim_name).await.unwrap();
    match handle.run("echo once").await.unwrap_err() {
        Error::RouterUnreachable { url, cause, .. } => {
            assert_eq!(
                (url.as_str(), cause.as_str()),
                (dead_url.as_str(), "connection refused")
            );
        }
        other => panic!("run must fail after one attempt, got {other:?}"),
    }
    match handle.read("x").await.unwrap_err() {
        Error::RetriesExhausted { attempts, .. } => assert_eq!(attempts, 3),
        other => panic!("read must retry, got {other:?}"),
    }
    match handle
        .run_with(ExecOptions::new("echo twice").max_attempts(2))
        .await
        .unwrap_err()
    {
        Error::RetriesExhausted { attempts, .. } => assert_eq!(attempts, 2),
        other => panic!("an opted-in run retries, got {other:?}"),
    }
    sandbox.close().await.unwrap();
    harness.stop().await;
}

/// SIGTERM to a process that enabled auto cleanup deletes its claim before it exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_cleanup_deletes_the_claims_of_a_terminated_process() {
    use std::io::BufRead as _;
    init_tracing();
    let harness = start(1, false).await;
    let hold = example_binary("hold");
    let mut child = Child(
        std::process::Command::new(hold)
            .arg(POOL)
            .env("KUBECONFIG", harness.kubeconfig_path())
            .env("SANDBOX_ROUTER_URL", harness.router_url().unwrap())
            .env("SANDBOX_NAMESPACE", NAMESPACE)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stdout = child.0.stdout.take().unwrap();
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .unwrap();
        line
    })
    .await
    .unwrap();
    let claim_name = line.trim().strip_prefix("claim=").expect(&line).to_owned();
    assert!(claim(&harness, &claim_name).await.is_some());

    let pid = rustix::process::Pid::from_raw(i32::try_from(child.0.id()).unwrap()).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let status = tokio::task::spawn_blocking(move || {
        let status = child.0.wait().unwrap();
        drop(child);
        status
    })
    .await
    .unwrap();
    assert_eq!(status.code(), Some(143));
    assert!(
        claim(&harness, &claim_name).await.is_none(),
        "the claim was deleted before the process exited"
    );
    harness.stop().await;
}

/// A child process killed on drop.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Builds an example of this crate into the test's target directory and returns its path.
fn example_binary(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
    let target = profile_dir.parent().unwrap().to_path_buf();
    let mut command =
        std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    command
        .args([
            "build",
            "--quiet",
            // Features resolved as `cargo test --workspace` does: its artifacts are reused.
            "--workspace",
            "--example",
            name,
            "--target-dir",
        ])
        .arg(&target)
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    if profile_dir.file_name().unwrap() == "release" {
        command.arg("--release");
    }
    assert!(
        command.status().unwrap().success(),
        "building example {name}"
    );
    profile_dir.join("examples").join(name)
}
