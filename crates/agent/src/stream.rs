//! Streaming responses, sans IO: a server-sent-events line parser and an accumulator that turns
//! the Messages API's stream events (`message_start`, `content_block_*`, `message_delta`,
//! `error`) back into the [`MessagesResponse`] a plain request would have returned.

use serde_json::{Map, Value};

use crate::messages::{ContentBlock, MessagesResponse, StopReason, Usage};

/// One server-sent event: its `event:` name and joined `data:` lines.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field (empty when absent).
    pub event: String,
    /// The `data:` lines joined with `\n`.
    pub data: String,
}

/// Splits a byte stream into server-sent events.
#[derive(Debug, Default)]
pub struct SseParser {
    pending: Vec<u8>,
    event: String,
    data: Vec<String>,
}

impl SseParser {
    /// Feeds bytes; returns the events they completed.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        self.pending.extend_from_slice(bytes);
        let mut events = Vec::new();
        while let Some(end) = self.pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            let line = line.trim_end_matches(['\n', '\r']);
            if line.is_empty() {
                if !self.data.is_empty() || !self.event.is_empty() {
                    events.push(SseEvent {
                        event: std::mem::take(&mut self.event),
                        data: std::mem::take(&mut self.data).join("\n"),
                    });
                }
                continue;
            }
            if line.starts_with(':') {
                continue;
            }
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "event" => value.clone_into(&mut self.event),
                "data" => self.data.push(value.to_owned()),
                _ => {}
            }
        }
        events
    }
}

/// What went wrong in a stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StreamError {
    /// The server sent an `error` event: `(type, message)`.
    Server(String, String),
    /// An event was not the JSON it should be.
    Malformed(String),
    /// The stream ended before `message_stop`.
    Incomplete,
}

/// Builds a response from stream events.
#[derive(Debug, Default)]
pub struct Accumulator {
    response: Option<MessagesResponse>,
    /// Blocks as raw JSON while they stream; tool inputs arrive as JSON text.
    blocks: Vec<(Value, String)>,
    done: bool,
}

impl Accumulator {
    /// Applies one event.
    pub fn apply(&mut self, event: &SseEvent) -> Result<(), StreamError> {
        if event.data.is_empty() {
            return Ok(());
        }
        let value: Value = serde_json::from_str(&event.data)
            .map_err(|e| StreamError::Malformed(format!("{}: {e}", event.event)))?;
        let kind = value
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or(&event.event);
        match kind {
            "message_start" => {
                let message = value.get("message").cloned().unwrap_or(Value::Null);
                let response: MessagesResponse = serde_json::from_value(message)
                    .map_err(|e| StreamError::Malformed(format!("message_start: {e}")))?;
                self.response = Some(response);
            }
            "content_block_start" => {
                let index = index_of(&value)?;
                let block = value.get("content_block").cloned().unwrap_or(Value::Null);
                if self.blocks.len() <= index {
                    self.blocks.resize(index + 1, (Value::Null, String::new()));
                }
                self.blocks[index] = (block, String::new());
            }
            "content_block_delta" => {
                let index = index_of(&value)?;
                let Some((block, json)) = self.blocks.get_mut(index) else {
                    return Err(StreamError::Malformed(format!("delta for block {index}")));
                };
                let delta = value.get("delta").cloned().unwrap_or(Value::Null);
                apply_delta(block, json, &delta);
            }
            "message_delta" => {
                if let Some(response) = &mut self.response {
                    if let Some(reason) = value.pointer("/delta/stop_reason")
                        && !reason.is_null()
                    {
                        response.stop_reason = Some(
                            serde_json::from_value(reason.clone()).unwrap_or(StopReason::Other),
                        );
                    }
                    if let Some(usage) = value.get("usage") {
                        let usage: Usage =
                            serde_json::from_value(usage.clone()).unwrap_or_default();
                        // message_delta carries cumulative output tokens.
                        response.usage.output_tokens = usage.output_tokens;
                        if usage.input_tokens > 0 {
                            response.usage.input_tokens = usage.input_tokens;
                        }
                    }
                }
            }
            "message_stop" => self.done = true,
            "error" => {
                let kind = value
                    .pointer("/error/type")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                let message = value
                    .pointer("/error/message")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                return Err(StreamError::Server(kind.to_owned(), message.to_owned()));
            }
            _ => {}
        }
        Ok(())
    }

    /// Whether `message_stop` arrived.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// The assembled response.
    pub fn finish(self) -> Result<MessagesResponse, StreamError> {
        let (Some(mut response), true) = (self.response, self.done) else {
            return Err(StreamError::Incomplete);
        };
        let mut content = Vec::with_capacity(self.blocks.len());
        for (mut block, json) in self.blocks {
            if block.get("type").and_then(Value::as_str) == Some("tool_use") {
                let input = if json.trim().is_empty() {
                    Value::Object(Map::new())
                } else {
                    serde_json::from_str(&json)
                        .map_err(|e| StreamError::Malformed(format!("tool input: {e}")))?
                };
                block["input"] = input;
            }
            let block: ContentBlock = serde_json::from_value(block)
                .map_err(|e| StreamError::Malformed(format!("block: {e}")))?;
            content.push(block);
        }
        response.content = content;
        Ok(response)
    }
}

fn index_of(value: &Value) -> Result<usize, StreamError> {
    value
        .get("index")
        .and_then(Value::as_u64)
        .and_then(|i| usize::try_from(i).ok())
        .filter(|i| *i < 4096)
        .ok_or_else(|| StreamError::Malformed("event without a block index".to_owned()))
}

fn append(block: &mut Value, field: &str, text: &str) {
    let current = block.get(field).and_then(Value::as_str).unwrap_or("");
    let joined = format!("{current}{text}");
    block[field] = Value::String(joined);
}

fn apply_delta(block: &mut Value, json: &mut String, delta: &Value) {
    let text = |field: &str| delta.get(field).and_then(Value::as_str).unwrap_or("");
    match delta.get("type").and_then(Value::as_str).unwrap_or("") {
        "text_delta" => append(block, "text", text("text")),
        "input_json_delta" => json.push_str(text("partial_json")),
        "thinking_delta" => append(block, "thinking", text("thinking")),
        "signature_delta" => append(block, "signature", text("signature")),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    const STREAM: &str = "event: message_start\n\
data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"m\",\"content\":[],\"stop_reason\":null,\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n\
event: ping\ndata: {\"type\": \"ping\"}\n\n\
event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n\
event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Writing \"}}\n\n\
event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"it.\"}}\n\n\
event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n\
event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"write_file\",\"input\":{}}}\n\n\
event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"path\\\": \\\"fib\"}}\n\n\
event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\".py\\\"}\"}}\n\n\
event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":1}\n\n\
event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":40}}\n\n\
event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";

    #[test]
    fn stream_assembles_the_same_response_whatever_the_chunking() {
        for chunk in [1, 7, 64, STREAM.len()] {
            let mut parser = SseParser::default();
            let mut acc = Accumulator::default();
            for piece in STREAM.as_bytes().chunks(chunk) {
                for event in parser.push(piece) {
                    acc.apply(&event).unwrap();
                }
            }
            assert!(acc.is_done());
            let response = acc.finish().unwrap();
            assert_eq!(response.stop_reason, Some(StopReason::ToolUse));
            assert_eq!(response.usage.input_tokens, 25);
            assert_eq!(response.usage.output_tokens, 40);
            assert_eq!(
                serde_json::to_value(&response.content).unwrap(),
                json!([
                    {"type": "text", "text": "Writing it."},
                    {"type": "tool_use", "id": "toolu_1", "name": "write_file",
                     "input": {"path": "fib.py"}}
                ])
            );
        }
    }

    #[test]
    fn error_event_and_truncated_stream() {
        let mut parser = SseParser::default();
        let events = parser.push(
            b"event: error\r\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\r\n\r\n",
        );
        let mut acc = Accumulator::default();
        assert_eq!(
            acc.apply(&events[0]),
            Err(StreamError::Server(
                "overloaded_error".into(),
                "Overloaded".into()
            ))
        );
        assert_eq!(
            Accumulator::default().finish(),
            Err(StreamError::Incomplete)
        );
    }
}
