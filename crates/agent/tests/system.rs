#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! System tests on the simulated cluster (`agent_sandbox_local`'s in-process cluster: sim,
//! controller, router, the real runtime as sandbox pods, the default warm pool) with a scripted fake Messages API: the library's
//! session, the `sandbox-agent` binary against the cluster, the binary killed mid-run, and
//! `--local`.

use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use agent_sandbox_agent::agent::{LoopConfig, Reporter, Stop};
use agent_sandbox_agent::fake::{
    ANSWER, FIB, FIB_OUTPUT, FakeApi, Recorded, Reply, seed_conversation,
};
use agent_sandbox_agent::retry::Backoff;
use agent_sandbox_agent::session::{self, SessionOptions};
use agent_sandbox_agent::{ApiKey, MessagesClient, MessagesConfig};
use agent_sandbox_api::SandboxClaim;
use agent_sandbox_api::claim::ClaimShutdownPolicy;
use agent_sandbox_local::testkit::{self, NAMESPACE, POOL, Tool};
use agent_sandbox_local::{ConnectionKind, LocalCluster, LocalConfig, RouterAuth};
use jiff::Timestamp;
use kube::Api;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

#[derive(Default)]
struct Lines(Mutex<Vec<(Timestamp, String)>>);

impl Reporter for Lines {
    fn line(&self, line: &str) {
        self.0
            .lock()
            .unwrap()
            .push((Timestamp::now(), line.to_owned()));
    }
}

impl Lines {
    fn texts(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .map(|(_, l)| l.clone())
            .collect()
    }
}

fn model(api: &FakeApi) -> MessagesClient {
    let mut config = MessagesConfig::new(ApiKey::new("sk-ant-test"));
    config.base_url = api.url();
    config.retry = Backoff {
        max_retries: 3,
        initial_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(200),
    };
    MessagesClient::new(config).unwrap()
}

/// A local cluster with the workspace's runtime as sandbox pods, an unauthenticated router (the
/// binary is given only its URL) and a full default pool of one.
async fn harness() -> LocalCluster {
    let config = LocalConfig {
        runtime: testkit::runtime_program().unwrap(),
        router_auth: RouterAuth::None,
        pool_replicas: 1,
        ..LocalConfig::default()
    };
    let harness = LocalCluster::start(config).await.unwrap();
    harness
        .wait_for_pool(1, Duration::from_secs(120), |_, _| {})
        .await
        .unwrap();
    harness
}

fn claims(harness: &LocalCluster) -> Api<SandboxClaim> {
    Api::namespaced(harness.client(), NAMESPACE)
}

/// Live claims (those being deleted count as gone).
async fn live_claims(harness: &LocalCluster) -> Vec<SandboxClaim> {
    claims(harness)
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .collect()
}

/// Every assistant `tool_use` is answered by exactly one `tool_result` in the next message,
/// and no result answers anything else. Returns the results by tool_use id.
fn assert_every_tool_use_answered_once(messages: &Value) -> Vec<(String, Value)> {
    let messages = messages.as_array().unwrap();
    let mut answered = Vec::new();
    for (i, message) in messages.iter().enumerate() {
        let blocks = message["content"].as_array().unwrap();
        if message["role"] != "assistant" {
            continue;
        }
        let mut asked: Vec<&str> = blocks
            .iter()
            .filter(|b| b["type"] == "tool_use")
            .map(|b| b["id"].as_str().unwrap())
            .collect();
        if asked.is_empty() {
            continue;
        }
        let next = &messages[i + 1];
        assert_eq!(next["role"], "user");
        let results: Vec<&Value> = next["content"].as_array().unwrap().iter().collect();
        assert!(results.iter().all(|b| b["type"] == "tool_result"), "{next}");
        let mut ids: Vec<&str> = results
            .iter()
            .map(|b| b["tool_use_id"].as_str().unwrap())
            .collect();
        asked.sort_unstable();
        ids.sort_unstable();
        assert_eq!(ids, asked, "each tool_use needs exactly one tool_result");
        answered.extend(
            results
                .into_iter()
                .map(|b| (b["tool_use_id"].as_str().unwrap().to_owned(), b.clone())),
        );
    }
    answered
}

fn last_conversation(requests: &[Recorded]) -> Value {
    requests.last().unwrap().body["messages"].clone()
}

/// The library's session on the sim: a 429 first, the seed's fib conversation plus a failing
/// tool call, the claim kept to look inside it.
#[tokio::test]
async fn scripted_session_writes_runs_answers_and_keeps_the_claim_alive() {
    // The conversation runs `python3 fib.py` in the sandbox (pods run the host's tools).
    if testkit::missing(Tool::Python3) {
        return;
    }
    let harness = harness().await;
    let client = harness.sdk_client(ConnectionKind::Direct).unwrap();
    let mut limited = Reply::error(429, "rate_limit_error", "Number of request tokens exceeded");
    if let Reply::Json(_, headers, _) = &mut limited {
        headers.push(("retry-after", "0".to_owned()));
    }
    let mut script = vec![limited];
    let mut fib = seed_conversation(Duration::from_millis(1500));
    let answer = fib.pop().unwrap();
    script.extend(fib);
    script.push(Reply::tool_use(
        "toolu_03",
        "read_file",
        json!({"path": "no/such/file.txt"}),
    ));
    script.push(answer);
    let api = FakeApi::start(script).await.unwrap();
    let lines = Lines::default();
    let ttl = Duration::from_secs(600);
    let options = SessionOptions {
        pool: POOL.to_owned(),
        keep: true,
        loop_config: LoopConfig {
            ttl,
            ..LoopConfig::default()
        },
    };
    let outcome = session::run(&client, &model(&api), "fib please", &options, &lines)
        .await
        .unwrap();
    assert_eq!(outcome.stop, Stop::Answered);
    assert_eq!(outcome.text, ANSWER);
    assert_eq!(outcome.tool_calls, 3);
    assert_eq!(api.remaining(), 0);

    // The 429 was retried: one request more than the model's turns.
    let requests = api.requests();
    assert_eq!(requests.len(), 5);
    assert_eq!(requests[0].body, requests[1].body);

    let texts = lines.texts();
    assert!(
        texts[0].starts_with("sandbox ready in ") && texts[0].contains(" claim=sandbox-claim-"),
        "{texts:?}"
    );
    assert_eq!(
        texts[1..4],
        [
            format!("[tool] write_file: fib.py ({} bytes)", FIB.len()),
            "[tool] run_command: python3 fib.py".to_owned(),
            "[tool] read_file: no/such/file.txt".to_owned(),
        ]
    );
    let claim_name = texts[0]
        .split(" claim=")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .to_owned();

    // Every tool_use answered once; the output reached the model; the failure was an error
    // result and the loop went on.
    let results = assert_every_tool_use_answered_once(&last_conversation(&requests));
    assert_eq!(results.len(), 3);
    let ran = &results[1].1;
    assert!(
        ran["content"].as_str().unwrap().contains(FIB_OUTPUT),
        "{ran}"
    );
    assert!(ran.get("is_error").is_none(), "{ran}");
    let failed = &results[2].1;
    assert_eq!(failed["is_error"], true, "{failed}");
    assert!(
        failed["content"]
            .as_str()
            .unwrap()
            .starts_with("failed to read no/such/file.txt"),
        "{failed}"
    );
    // The system prompt tells the model where it is.
    let system = requests[1].body["system"].as_str().unwrap();
    assert!(system.contains("Working directory: /"), "{system}");
    assert!(system.contains("/bin/sh -c"), "{system}");

    // The file is in the sandbox.
    let sandbox = client.get_sandbox(&claim_name).await.unwrap();
    assert_eq!(sandbox.read("fib.py").await.unwrap(), FIB.as_bytes());

    // The expiry moved forward: at creation it was at most ready + ttl; the first tool call
    // came 1.5 s later and pushed it to then + ttl (Delete policy).
    let (ready_at, _) = lines.0.lock().unwrap()[0].clone();
    let claim = claims(&harness).get(&claim_name).await.unwrap();
    let lifecycle = claim.spec.lifecycle.unwrap();
    assert_eq!(lifecycle.shutdown_policy, ClaimShutdownPolicy::Delete);
    let shutdown = lifecycle.shutdown_time.unwrap().0;
    let created_bound = ready_at
        .checked_add(jiff::SignedDuration::try_from(ttl).unwrap())
        .unwrap();
    assert!(
        shutdown > created_bound,
        "shutdownTime {shutdown} not moved past {created_bound}"
    );

    sandbox.close().await.unwrap();
    harness.stop().await;
}

/// Kills the child on drop, also when an assertion fails.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn agent_command(api: &FakeApi) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_sandbox-agent"));
    command
        .env("ANTHROPIC_API_KEY", "sk-ant-test")
        .env("ANTHROPIC_BASE_URL", api.url())
        .env_remove("KUBECONFIG")
        .env_remove("ANTHROPIC_MODEL")
        .env_remove("SANDBOX_ROUTER_URL")
        .env_remove("SANDBOX_ROUTER_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

fn cluster_args(harness: &LocalCluster) -> Vec<String> {
    vec![
        "--kubeconfig".to_owned(),
        harness.kubeconfig_path().display().to_string(),
        "-n".to_owned(),
        NAMESPACE.to_owned(),
        "--router-url".to_owned(),
        harness.router_url().unwrap().to_owned(),
        "--pool".to_owned(),
        POOL.to_owned(),
    ]
}

/// Waits for the child with a bound, returning (status, stdout, stderr).
async fn finish(child: ChildGuard, limit: Duration) -> (std::process::ExitStatus, String, String) {
    let mut child = child;
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            let mut stdout = String::new();
            let mut stderr = String::new();
            std::io::Read::read_to_string(child.0.stdout.as_mut().unwrap(), &mut stdout).unwrap();
            std::io::Read::read_to_string(child.0.stderr.as_mut().unwrap(), &mut stderr).unwrap();
            return (status, stdout, stderr);
        }
        assert!(
            Instant::now() < deadline,
            "sandbox-agent did not exit in {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The binary against the cluster: ready line and tool lines on stderr, the answer on stdout,
/// exit 0, and the claim deleted at the end.
#[tokio::test]
async fn binary_runs_the_conversation_and_deletes_the_claim() {
    // The conversation runs `python3 fib.py` in the sandbox (pods run the host's tools).
    if testkit::missing(Tool::Python3) {
        return;
    }
    let harness = harness().await;
    let api = FakeApi::start(seed_conversation(Duration::ZERO))
        .await
        .unwrap();
    let child = agent_command(&api)
        .args(cluster_args(&harness))
        .arg("write a python script that prints the first 10 fibonacci numbers and run it")
        .spawn()
        .unwrap();
    let (status, stdout, stderr) = finish(ChildGuard(child), Duration::from_secs(120)).await;
    assert!(status.success(), "{status}\n{stderr}");
    assert_eq!(stdout.trim_end(), ANSWER);
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(lines[0].starts_with("sandbox ready in "), "{stderr}");
    assert!(
        lines[0].contains(" sandbox=") && lines[0].contains(" pod="),
        "{stderr}"
    );
    assert_eq!(
        lines[1..3],
        [
            format!("[tool] write_file: fib.py ({} bytes)", FIB.len()).as_str(),
            "[tool] run_command: python3 fib.py",
        ]
    );
    let results = assert_every_tool_use_answered_once(&last_conversation(&api.requests()));
    assert!(
        results[1].1["content"]
            .as_str()
            .unwrap()
            .contains(FIB_OUTPUT)
    );
    assert_eq!(
        live_claims(&harness).await.len(),
        0,
        "the claim must be gone"
    );
    harness.stop().await;
}

/// The process killed mid-run (SIGKILL: no cleanup runs) leaves a claim that the controller
/// deletes once its TTL, pushed forward by the last tool call, has passed.
#[tokio::test]
async fn killed_agent_leaves_no_claim_once_the_ttl_passes() {
    let harness = harness().await;
    let api = FakeApi::start(vec![
        Reply::tool_use(
            "toolu_01",
            "run_command",
            json!({"command": "echo working"}),
        ),
        Reply::Hang,
    ])
    .await
    .unwrap();
    let mut child = ChildGuard(
        agent_command(&api)
            .args(cluster_args(&harness))
            .args(["--ttl", "5s", "do something long"])
            .spawn()
            .unwrap(),
    );
    // Wait until the tool call ran and the model was asked again (the agent now hangs there).
    let deadline = Instant::now() + Duration::from_secs(90);
    while api.requests().len() < 2 {
        assert!(
            child.0.try_wait().unwrap().is_none(),
            "sandbox-agent exited early"
        );
        assert!(
            Instant::now() < deadline,
            "the agent never made its second request"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let results = assert_every_tool_use_answered_once(&last_conversation(&api.requests()));
    assert!(
        results[0].1["content"]
            .as_str()
            .unwrap()
            .contains("working")
    );
    // On a loaded machine the 5 s may already have passed, so the claim may be gone already;
    // if not, it carries the expiry that will remove it.
    for claim in live_claims(&harness).await {
        let lifecycle = claim.spec.lifecycle.clone().unwrap();
        assert_eq!(lifecycle.shutdown_policy, ClaimShutdownPolicy::Delete);
        assert!(lifecycle.shutdown_time.is_some());
    }

    rustix::process::kill_process(
        rustix::process::Pid::from_child(&child.0),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    let _ = child.0.wait();

    let deadline = Instant::now() + Duration::from_secs(60);
    while !live_claims(&harness).await.is_empty() {
        assert!(
            Instant::now() < deadline,
            "the claim outlived its TTL by a minute"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    harness.stop().await;
}

/// `--local`: the same conversation on the in-process local cluster (as `sandboxctl run
/// --local`), the binary serving its own runtime pods.
#[tokio::test]
async fn local_mode_runs_the_conversation() {
    // The conversation runs `python3 fib.py` in the sandbox (pods run the host's tools).
    if testkit::missing(Tool::Python3) {
        return;
    }
    let api = FakeApi::start(seed_conversation(Duration::ZERO))
        .await
        .unwrap();
    let child = agent_command(&api)
        // Pods with loopback only: nothing of this machine's network changes (the agent, not
        // the sandbox, talks to the fake Messages API on this machine's loopback).
        .args([
            "--local",
            "--network",
            "isolated",
            "write fib.py and run it",
        ])
        .spawn()
        .unwrap();
    let (status, stdout, stderr) = finish(ChildGuard(child), Duration::from_secs(180)).await;
    assert!(status.success(), "{status}\n{stderr}");
    assert_eq!(stdout.trim_end(), ANSWER);
    assert!(stderr.contains("sandbox ready in "), "{stderr}");
    assert!(
        stderr.contains(&format!("[tool] write_file: fib.py ({} bytes)", FIB.len())),
        "{stderr}"
    );
    let results = assert_every_tool_use_answered_once(&last_conversation(&api.requests()));
    assert!(
        results[1].1["content"]
            .as_str()
            .unwrap()
            .contains(FIB_OUTPUT),
        "{:?}",
        results[1]
    );
}

/// `sandbox-agent __runtime` (what its local pods run) refuses a bad flag as `sandbox-runtime`
/// does: one line naming the flag, exit status 2, no backtrace even with `RUST_BACKTRACE=1`
/// (issue 15, item 13).
#[test]
fn the_runtime_subcommand_refuses_a_bad_flag_in_one_line() {
    let output = Command::new(env!("CARGO_BIN_EXE_sandbox-agent"))
        .args(["__runtime", "--max-output-bytes", "lots"])
        .env("RUST_BACKTRACE", "1")
        .env("SANDBOX_LISTEN", "127.0.0.1:0")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    testkit::assert_configuration_error(&output, "--max-output-bytes");
}
