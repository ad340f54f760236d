//! The agent issue's scenario: the real `sandbox-agent` binary against the cluster, with a
//! scripted stand-in for the Messages API on 127.0.0.1 (no network, no API key): the seed's
//! conversation (write `fib.py`, run it, answer).

use std::time::Duration;

use agent_sandbox_agent::fake::{ANSWER, FIB_OUTPUT, FakeApi, seed_conversation};
use agent_sandbox_api::SandboxClaim;
use kube::Api;
use serde_json::Value;

use super::Verdict;
use crate::cluster::ClusterUnderTest;
use crate::ensure;
use crate::error::{Error, Result};
use crate::support::{binary, run_child, wait_gone};

/// The agent claims a sandbox, runs both tool calls in it, prints the model's answer, returns
/// each tool's result to the model, and deletes its claim on the way out.
pub(super) async fn the_agent_writes_and_runs_a_script_then_deletes_its_claim(
    cluster: &ClusterUnderTest,
) -> Result<Verdict> {
    let program = binary("agent-sandbox-agent", "sandbox-agent")?;
    let api = FakeApi::start(seed_conversation(Duration::ZERO))
        .await
        .map_err(Error::io("start the fake Messages API on", "127.0.0.1"))?;
    let mut command = cluster.command(&program);
    command
        .env(agent_sandbox_agent::client::ENV_API_KEY, "sk-ant-e2e")
        .env(agent_sandbox_agent::client::ENV_BASE_URL, api.url())
        .args(cluster.binary_args())
        .args(["--pool", &cluster.pool])
        .arg("write a python script that prints the first 10 fibonacci numbers and run it");
    let finished = run_child(&program, command, None, Duration::from_secs(300)).await?;
    ensure!(
        finished.status.success() && finished.stdout.trim_end() == ANSWER,
        "sandbox-agent: {}",
        finished.describe()
    );
    ensure!(
        api.remaining() == 0,
        "the agent stopped with {} scripted replies unused",
        api.remaining()
    );
    let requests = api.requests();
    let last = requests
        .last()
        .map(|r| r.body["messages"].clone())
        .unwrap_or_default();
    let result = tool_result(&last, "toolu_02");
    ensure!(
        result.contains(FIB_OUTPUT),
        "the result of `python3 fib.py` sent to the model was {result:?}"
    );

    let claim = finished
        .stderr
        .lines()
        .find_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix("claim=")))
        .map(|c| c.trim_end_matches(',').to_owned())
        .ok_or_else(|| {
            Error::Check(format!(
                "sandbox-agent did not name its claim:\n{}",
                finished.stderr
            ))
        })?;
    let claims: Api<SandboxClaim> = cluster.api();
    wait_gone(&claims, "the agent's SandboxClaim", &claim).await?;
    Ok(Verdict::Passed)
}

/// The text of the `tool_result` answering `id` in a conversation.
fn tool_result(messages: &Value, id: &str) -> String {
    messages
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["content"].as_array())
        .flatten()
        .find(|b| b["type"] == "tool_result" && b["tool_use_id"] == id)
        .map(|b| match &b["content"] {
            Value::String(text) => text.clone(),
            other => other.to_string(),
        })
        .unwrap_or_default()
}
