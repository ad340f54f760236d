//! The tool loop: send the conversation, run the tool calls the model asks for in the sandbox,
//! answer each `tool_use` with exactly one `tool_result`, push the claim's expiry forward after
//! every call, and stop at the answer or at the turn and token limits.

use std::time::Duration;

use agent_sandbox::SandboxHandle;

use crate::client::Model;
use crate::error::Result;
use crate::messages::{
    ContentBlock, Message, MessagesRequest, MessagesResponse, Role, StopReason, Usage, text_of,
};
use crate::tools::{self, ToolLimits};

/// Limits and lifecycle of one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoopConfig {
    /// Model requests at most.
    pub max_turns: u32,
    /// Tokens (input, cached input and output, summed over requests) after which no new
    /// request is sent.
    pub max_total_tokens: u64,
    /// The claim expires this long after the last tool call.
    pub ttl: Duration,
    /// Tool limits.
    pub tools: ToolLimits,
}

impl Default for LoopConfig {
    fn default() -> Self {
        Self {
            max_turns: 30,
            max_total_tokens: 1_000_000,
            ttl: Duration::from_secs(300),
            tools: ToolLimits::default(),
        }
    }
}

/// Where progress lines go (`[tool] …`, notes). The binary prints them to stderr.
pub trait Reporter: Send + Sync {
    /// One line.
    fn line(&self, line: &str);
}

/// Prints lines to stderr.
#[derive(Clone, Copy, Debug, Default)]
pub struct StderrReporter;

impl Reporter for StderrReporter {
    fn line(&self, line: &str) {
        eprintln!("{line}");
    }
}

/// Why the loop ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The model answered.
    Answered,
    /// The turn limit was reached.
    TurnLimit,
    /// The token budget was used up.
    TokenLimit,
    /// The model's answer was cut by `max_tokens`.
    MaxTokens,
    /// The model declined.
    Refusal,
}

impl Stop {
    /// Whether the run ended with an answer.
    pub fn is_answer(self) -> bool {
        self == Self::Answered
    }
}

/// What a run produced.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// The model's last text.
    pub text: String,
    /// Why it ended.
    pub stop: Stop,
    /// Model requests sent.
    pub turns: u32,
    /// Tool calls run.
    pub tool_calls: u32,
    /// Tokens used.
    pub usage: Usage,
    /// The whole conversation.
    pub messages: Vec<Message>,
}

/// Runs the loop for `prompt` with `system` as system prompt.
pub async fn run<M: Model, H: SandboxHandle>(
    model: &M,
    sandbox: &H,
    system: &str,
    prompt: &str,
    config: &LoopConfig,
    reporter: &dyn Reporter,
) -> Result<Outcome> {
    let definitions = tools::definitions(&config.tools);
    let mut messages = vec![Message::user_text(prompt)];
    let mut usage = Usage::default();
    let mut turns = 0u32;
    let mut tool_calls = 0u32;
    let mut last_text = String::new();
    let stop = loop {
        if turns >= config.max_turns {
            break Stop::TurnLimit;
        }
        if usage.total() >= config.max_total_tokens {
            break Stop::TokenLimit;
        }
        let request = MessagesRequest {
            model: model.model().to_owned(),
            max_tokens: model.max_tokens(),
            system: Some(system.to_owned()),
            messages: messages.clone(),
            tools: definitions.clone(),
            stream: false,
        };
        let response = model.create(&request).await?;
        turns += 1;
        usage.add(&response.usage);
        let text = response.text();
        if !text.is_empty() {
            last_text.clone_from(&text);
        }
        let MessagesResponse {
            content,
            stop_reason,
            ..
        } = response;
        let results = run_tools(sandbox, &content, config, reporter, &mut tool_calls).await;
        messages.push(Message {
            role: Role::Assistant,
            content,
        });
        if !results.is_empty() {
            // Whatever the stop reason, every tool_use is answered before anything else.
            if !text.is_empty() {
                tracing::debug!(%text, "model text between tool calls");
            }
            messages.push(Message {
                role: Role::User,
                content: results,
            });
            continue;
        }
        match stop_reason {
            // A paused server-side turn continues when the conversation is sent back as is.
            Some(StopReason::PauseTurn) => continue,
            Some(StopReason::MaxTokens) => break Stop::MaxTokens,
            Some(StopReason::Refusal) => break Stop::Refusal,
            _ => break Stop::Answered,
        }
    };
    Ok(Outcome {
        text: last_text,
        stop,
        turns,
        tool_calls,
        usage,
        messages,
    })
}

/// Runs every `tool_use` of `content` in order and returns one `tool_result` for each.
async fn run_tools<H: SandboxHandle>(
    sandbox: &H,
    content: &[ContentBlock],
    config: &LoopConfig,
    reporter: &dyn Reporter,
    tool_calls: &mut u32,
) -> Vec<ContentBlock> {
    let mut results = Vec::new();
    for block in content {
        let ContentBlock::ToolUse { id, name, input } = block else {
            continue;
        };
        reporter.line(&format!("[tool] {}", tools::describe(name, input)));
        let outcome = tools::execute(sandbox, name, input, &config.tools).await;
        *tool_calls += 1;
        if outcome.is_error {
            tracing::debug!(tool = %name, content = %outcome.content, "tool failed");
        }
        // Inactivity expiry: the claim lives `ttl` past the last tool call, so a crashed
        // agent's sandbox goes away by itself.
        if let Err(error) = sandbox.extend_ttl(config.ttl).await {
            reporter.line(&format!(
                "warning: failed to extend the claim's expiry: {}",
                tools::error_chain(&error)
            ));
        }
        results.push(ContentBlock::ToolResult {
            tool_use_id: id.clone(),
            content: outcome.content,
            is_error: outcome.is_error,
        });
    }
    results
}

/// The final text of a conversation (for callers holding only messages).
pub fn final_text(messages: &[Message]) -> String {
    messages
        .iter()
        .rev()
        .find(|m| m.role == Role::Assistant)
        .map(|m| text_of(&m.content))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use std::collections::VecDeque;
    use std::future::Future;
    use std::sync::Mutex;

    use agent_sandbox::ExecutionResult;
    use agent_sandbox::fake::FakeSandbox;
    use pretty_assertions::assert_eq;
    use serde_json::{Value, json};

    use super::*;

    /// A model that answers from a script and records requests.
    struct Scripted {
        replies: Mutex<VecDeque<MessagesResponse>>,
        requests: Mutex<Vec<MessagesRequest>>,
    }

    impl Scripted {
        fn new(replies: Vec<Value>) -> Self {
            Self {
                replies: Mutex::new(
                    replies
                        .into_iter()
                        .map(|v| serde_json::from_value(v).unwrap())
                        .collect(),
                ),
                requests: Mutex::default(),
            }
        }
    }

    impl Model for Scripted {
        fn model(&self) -> &str {
            "scripted"
        }
        fn max_tokens(&self) -> u32 {
            100
        }
        fn create(
            &self,
            request: &MessagesRequest,
        ) -> impl Future<Output = Result<MessagesResponse>> + Send {
            self.requests.lock().unwrap().push(request.clone());
            let reply = self
                .replies
                .lock()
                .unwrap()
                .pop_front()
                .expect("script exhausted");
            async move { Ok(reply) }
        }
    }

    #[derive(Default)]
    struct Lines(Mutex<Vec<String>>);

    impl Reporter for Lines {
        fn line(&self, line: &str) {
            self.0.lock().unwrap().push(line.to_owned());
        }
    }

    fn reply(content: Value, stop: &str) -> Value {
        json!({"id": "m", "model": "scripted", "content": content, "stop_reason": stop,
               "usage": {"input_tokens": 10, "output_tokens": 5}})
    }

    const FIB: &str = "def fib(n):\n    a, b = 0, 1\n    out = []\n    for _ in range(n):\n        out.append(a)\n        a, b = b, a + b\n    return out\n\nprint(fib(10))\n";

    #[tokio::test]
    async fn writes_runs_answers_and_extends_the_ttl() {
        let model = Scripted::new(vec![
            reply(
                json!([{"type": "thinking", "thinking": "plan", "signature": "sig"},
                       {"type": "tool_use", "id": "t1", "name": "write_file",
                        "input": {"path": "fib.py", "content": FIB}}]),
                "tool_use",
            ),
            reply(
                json!([{"type": "text", "text": "Running it."},
                       {"type": "tool_use", "id": "t2", "name": "run_command",
                        "input": {"command": "python3 fib.py"}},
                       {"type": "tool_use", "id": "t3", "name": "read_file",
                        "input": {"path": "missing.txt"}}]),
                "tool_use",
            ),
            reply(
                json!([{"type": "text", "text": "Output: [0, 1, 1, 2, 3, 5, 8, 13, 21, 34]"}]),
                "end_turn",
            ),
        ]);
        let sandbox = FakeSandbox::new().with_result(
            "python3 fib.py",
            ExecutionResult::ok("[0, 1, 1, 2, 3, 5, 8, 13, 21, 34]\n"),
        );
        let lines = Lines::default();
        let outcome = run(
            &model,
            &sandbox,
            "sys",
            "fib please",
            &LoopConfig::default(),
            &lines,
        )
        .await
        .unwrap();
        assert_eq!(outcome.stop, Stop::Answered);
        assert_eq!(outcome.text, "Output: [0, 1, 1, 2, 3, 5, 8, 13, 21, 34]");
        assert_eq!((outcome.turns, outcome.tool_calls), (3, 3));
        assert_eq!(outcome.usage.total(), 45);
        assert_eq!(sandbox.file("fib.py").unwrap(), FIB);
        assert!(sandbox.shutdown_time().is_some());
        assert_eq!(
            *lines.0.lock().unwrap(),
            [
                format!("[tool] write_file: fib.py ({} bytes)", FIB.len()),
                "[tool] run_command: python3 fib.py".to_owned(),
                "[tool] read_file: missing.txt".to_owned(),
            ]
        );
        let requests = model.requests.lock().unwrap();
        // The thinking block went back verbatim; each tool_use got exactly one result.
        let second = serde_json::to_value(&requests[1].messages).unwrap();
        assert_eq!(second[1]["content"][0]["type"], "thinking");
        assert_eq!(second[2]["content"].as_array().unwrap().len(), 1);
        let third = serde_json::to_value(&requests[2].messages).unwrap();
        let results = third[4]["content"].as_array().unwrap();
        assert_eq!(results.len(), 2);
        assert_eq!(results[0]["tool_use_id"], "t2");
        assert!(
            results[0]["content"]
                .as_str()
                .unwrap()
                .contains("13, 21, 34")
        );
        assert_eq!(results[1]["tool_use_id"], "t3");
        assert_eq!(results[1]["is_error"], true);
        assert_eq!(requests[0].system.as_deref(), Some("sys"));
        assert_eq!(requests[0].tools.len(), 4);
    }

    #[tokio::test]
    async fn stops_at_the_turn_and_token_limits() {
        let looping = || {
            (0..5)
                .map(|i| {
                    reply(
                        json!([{"type": "tool_use", "id": format!("t{i}"), "name": "list_files", "input": {}}]),
                        "tool_use",
                    )
                })
                .collect::<Vec<_>>()
        };
        let sandbox = FakeSandbox::new();
        let config = LoopConfig {
            max_turns: 2,
            ..LoopConfig::default()
        };
        let outcome = run(
            &Scripted::new(looping()),
            &sandbox,
            "s",
            "p",
            &config,
            &Lines::default(),
        )
        .await
        .unwrap();
        assert_eq!((outcome.stop, outcome.turns), (Stop::TurnLimit, 2));
        // The conversation ends with the last tool results: nothing is left unanswered.
        assert_eq!(outcome.messages.last().unwrap().role, Role::User);

        let config = LoopConfig {
            max_total_tokens: 30,
            ..LoopConfig::default()
        };
        let outcome = run(
            &Scripted::new(looping()),
            &sandbox,
            "s",
            "p",
            &config,
            &Lines::default(),
        )
        .await
        .unwrap();
        assert_eq!((outcome.stop, outcome.turns), (Stop::TokenLimit, 2));
    }
}
