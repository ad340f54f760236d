#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The Messages API client against a scripted fake API on 127.0.0.1.

use std::time::Duration;

use agent_sandbox_agent::fake::{FakeApi, Reply};
use agent_sandbox_agent::messages::{Message, MessagesRequest, StopReason};
use agent_sandbox_agent::retry::Backoff;
use agent_sandbox_agent::{ApiKey, Error, MessagesClient, MessagesConfig};
use pretty_assertions::assert_eq;
use serde_json::json;

const KEY: &str = "sk-ant-test-secret-0123456789";

fn client(api: &FakeApi, max_retries: u32) -> MessagesClient {
    let mut config = MessagesConfig::new(ApiKey::new(KEY));
    config.base_url = api.url();
    config.model = "claude-test".to_owned();
    config.max_tokens = 1234;
    config.retry = Backoff {
        max_retries,
        initial_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(50),
    };
    MessagesClient::new(config).unwrap()
}

fn request() -> MessagesRequest {
    MessagesRequest {
        model: "claude-test".to_owned(),
        max_tokens: 1234,
        system: Some("be brief".to_owned()),
        messages: vec![Message::user_text("hi")],
        tools: vec![],
        stream: false,
    }
}

#[tokio::test]
async fn sends_key_version_and_body_and_parses_the_answer() {
    let api = FakeApi::start(vec![Reply::text("hello")]).await.unwrap();
    let response = client(&api, 0).send(&request()).await.unwrap();
    assert_eq!(response.text(), "hello");
    assert_eq!(response.stop_reason, Some(StopReason::EndTurn));
    let requests = api.requests();
    assert_eq!(requests.len(), 1);
    let headers = &requests[0].headers;
    assert_eq!(headers["x-api-key"], KEY);
    assert_eq!(headers["anthropic-version"], "2023-06-01");
    assert_eq!(
        requests[0].body,
        json!({
            "model": "claude-test", "max_tokens": 1234, "system": "be brief",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
        })
    );
}

#[tokio::test]
async fn retries_429_honouring_retry_after_then_succeeds() {
    let mut limited = Reply::error(429, "rate_limit_error", "slow down");
    if let Reply::Json(_, headers, _) = &mut limited {
        headers.push(("retry-after", "0".to_owned()));
    }
    let api = FakeApi::start(vec![
        limited,
        Reply::error(529, "overloaded_error", "Overloaded"),
        Reply::text("finally"),
    ])
    .await
    .unwrap();
    let response = client(&api, 3).send(&request()).await.unwrap();
    assert_eq!(response.text(), "finally");
    assert_eq!(api.requests().len(), 3);
}

#[tokio::test]
async fn gives_up_after_the_retry_budget() {
    let api = FakeApi::start(vec![
        Reply::error(529, "overloaded_error", "Overloaded"),
        Reply::error(503, "api_error", "unavailable"),
        Reply::error(529, "overloaded_error", "Overloaded"),
        Reply::text("too late"),
    ])
    .await
    .unwrap();
    let error = client(&api, 2).send(&request()).await.unwrap_err();
    let Error::RetriesExhausted { attempts, source } = &error else {
        panic!("{error:?}");
    };
    assert_eq!(*attempts, 3);
    assert!(
        matches!(**source, Error::Api { status: 529, .. }),
        "{source:?}"
    );
    assert_eq!(api.remaining(), 1);
}

#[tokio::test]
async fn auth_and_request_errors_are_not_retried_and_say_what_to_fix() {
    for (status, kind, fix) in [
        (401, "authentication_error", "ANTHROPIC_API_KEY"),
        (403, "permission_error", "claude-test"),
        (400, "invalid_request_error", "--max-tokens (1234)"),
        (404, "not_found_error", "--model (claude-test)"),
    ] {
        let api = FakeApi::start(vec![Reply::error(status, kind, "nope"), Reply::text("no")])
            .await
            .unwrap();
        let error = client(&api, 3).send(&request()).await.unwrap_err();
        let text = error.to_string();
        assert!(matches!(error, Error::Api { .. }), "{error:?}");
        assert!(
            text.contains(&status.to_string()) && text.contains(kind),
            "{text}"
        );
        assert!(text.contains(fix), "{text}");
        assert!(text.contains("req_fake"), "{text}");
        assert!(!text.contains(KEY) && !format!("{error:?}").contains(KEY));
        assert_eq!(api.requests().len(), 1, "{status} must not be retried");
    }
}

#[tokio::test]
async fn unreachable_api_is_a_transport_error_without_secrets() {
    // Bind then drop: the port is closed, so connecting fails at once.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let mut config = MessagesConfig::new(ApiKey::new(KEY));
    config.base_url = format!("http://user:pw@{addr}");
    config.retry = Backoff {
        max_retries: 1,
        initial_backoff: Duration::from_millis(5),
        max_backoff: Duration::from_millis(5),
    };
    let error = MessagesClient::new(config)
        .unwrap()
        .send(&request())
        .await
        .unwrap_err();
    let text = format!("{error} {error:?}");
    assert!(
        matches!(error, Error::RetriesExhausted { attempts: 2, .. }),
        "{text}"
    );
    assert!(!text.contains(KEY) && !text.contains("pw@"), "{text}");
}

#[tokio::test]
async fn streaming_assembles_the_answer() {
    let sse = [
        json!({"type": "message_start", "message": {"id": "msg_s", "type": "message", "role": "assistant",
            "model": "claude-test", "content": [], "stop_reason": null,
            "usage": {"input_tokens": 9, "output_tokens": 1}}}),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "streamed "}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "answer"}}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 3}}),
        json!({"type": "message_stop"}),
    ]
    .iter()
    .map(|event| format!("event: {}\ndata: {event}\n\n", event["type"].as_str().unwrap()))
    .collect::<String>();
    let api = FakeApi::start(vec![
        Reply::error(529, "overloaded_error", "Overloaded"),
        Reply::Sse(sse),
    ])
    .await
    .unwrap();
    let mut config = client(&api, 2).config().clone();
    config.stream = true;
    let response = MessagesClient::new(config)
        .unwrap()
        .send(&request())
        .await
        .unwrap();
    assert_eq!(response.text(), "streamed answer");
    assert_eq!(response.usage.output_tokens, 3);
    assert_eq!(api.requests()[1].body["stream"], true);
}
