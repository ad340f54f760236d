//! The Messages API's wire types, as much of them as a tool loop needs: requests with a system
//! prompt and tools, messages whose content blocks are text, tool use and tool results, and the
//! response with its stop reason and token usage.
//!
//! Blocks this crate does not interpret (`thinking`, `redacted_thinking`, server tool blocks,
//! whatever comes next) are kept as raw JSON in [`ContentBlock::Other`] and sent back verbatim
//! in the assistant turn, as the API requires for thinking blocks.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Who wrote a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The user (and tool results).
    User,
    /// The model.
    Assistant,
}

/// One message of the conversation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Author.
    pub role: Role,
    /// Content blocks.
    pub content: Vec<ContentBlock>,
}

impl Message {
    /// A user message with one text block.
    pub fn user_text(text: impl Into<String>) -> Self {
        Self {
            role: Role::User,
            content: vec![ContentBlock::Text { text: text.into() }],
        }
    }
}

/// A content block.
#[derive(Clone, Debug, PartialEq)]
pub enum ContentBlock {
    /// Text.
    Text {
        /// The text.
        text: String,
    },
    /// The model asks for a tool call.
    ToolUse {
        /// Id the result must name.
        id: String,
        /// Tool name.
        name: String,
        /// Arguments (a JSON object, per the tool's input schema).
        input: Value,
    },
    /// The result of a tool call.
    ToolResult {
        /// The `tool_use` this answers.
        tool_use_id: String,
        /// What the tool produced (or why it failed).
        content: String,
        /// The tool failed.
        is_error: bool,
    },
    /// Any other block, kept as received.
    Other(Value),
}

/// The shapes of the blocks this crate interprets (the serde half of [`ContentBlock`]).
#[derive(Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum KnownBlock {
    Text {
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
    ToolResult {
        tool_use_id: String,
        content: String,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        is_error: bool,
    },
}

impl Serialize for ContentBlock {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let known = match self {
            Self::Other(value) => return value.serialize(serializer),
            Self::Text { text } => KnownBlock::Text { text: text.clone() },
            Self::ToolUse { id, name, input } => KnownBlock::ToolUse {
                id: id.clone(),
                name: name.clone(),
                input: input.clone(),
            },
            Self::ToolResult {
                tool_use_id,
                content,
                is_error,
            } => KnownBlock::ToolResult {
                tool_use_id: tool_use_id.clone(),
                content: content.clone(),
                is_error: *is_error,
            },
        };
        known.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for ContentBlock {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        let kind = value.get("type").and_then(Value::as_str).unwrap_or("");
        // A tool result whose content is a list of blocks is not ours to flatten: keep it raw.
        let known = matches!(kind, "text" | "tool_use")
            || (kind == "tool_result" && value.get("content").is_some_and(Value::is_string));
        if !known {
            return Ok(Self::Other(value));
        }
        match serde_json::from_value::<KnownBlock>(value).map_err(serde::de::Error::custom)? {
            KnownBlock::Text { text } => Ok(Self::Text { text }),
            KnownBlock::ToolUse { id, name, input } => Ok(Self::ToolUse { id, name, input }),
            KnownBlock::ToolResult {
                tool_use_id,
                content,
                is_error,
            } => Ok(Self::ToolResult {
                tool_use_id,
                content,
                is_error,
            }),
        }
    }
}

/// A tool the model may call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolDefinition {
    /// Name.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// JSON Schema of its input.
    pub input_schema: Value,
}

/// A request to `POST /v1/messages`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MessagesRequest {
    /// Model id.
    pub model: String,
    /// Cap on the tokens of the response.
    pub max_tokens: u32,
    /// System prompt.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// The conversation so far.
    pub messages: Vec<Message>,
    /// Tools offered.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<ToolDefinition>,
    /// Server-sent events instead of one JSON body.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub stream: bool,
}

/// Why the model stopped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// It finished its turn.
    EndTurn,
    /// It wants tool results.
    ToolUse,
    /// `max_tokens` cut it.
    MaxTokens,
    /// A stop sequence matched.
    StopSequence,
    /// A long server-side turn paused; send the conversation back to continue it.
    PauseTurn,
    /// It declined.
    Refusal,
    /// A reason this crate does not know.
    #[serde(other)]
    Other,
}

/// Tokens used by one response (or, summed, by a whole run).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Input tokens not read from or written to the cache.
    #[serde(default)]
    pub input_tokens: u64,
    /// Output tokens.
    #[serde(default)]
    pub output_tokens: u64,
    /// Input tokens written to the prompt cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_creation_input_tokens: Option<u64>,
    /// Input tokens read from the prompt cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_read_input_tokens: Option<u64>,
}

impl Usage {
    /// Every token counted, input (cached or not) and output.
    pub fn total(&self) -> u64 {
        self.input_tokens
            .saturating_add(self.output_tokens)
            .saturating_add(self.cache_creation_input_tokens.unwrap_or(0))
            .saturating_add(self.cache_read_input_tokens.unwrap_or(0))
    }

    /// Adds another response's usage.
    pub fn add(&mut self, other: &Usage) {
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        let add = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0).saturating_add(b.unwrap_or(0))),
        };
        self.cache_creation_input_tokens = add(
            self.cache_creation_input_tokens,
            other.cache_creation_input_tokens,
        );
        self.cache_read_input_tokens =
            add(self.cache_read_input_tokens, other.cache_read_input_tokens);
    }
}

/// A response of `POST /v1/messages`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MessagesResponse {
    /// Message id.
    #[serde(default)]
    pub id: String,
    /// Model that answered.
    #[serde(default)]
    pub model: String,
    /// Content blocks.
    pub content: Vec<ContentBlock>,
    /// Why it stopped.
    #[serde(default)]
    pub stop_reason: Option<StopReason>,
    /// Tokens used.
    #[serde(default)]
    pub usage: Usage,
}

impl MessagesResponse {
    /// The text blocks, joined.
    pub fn text(&self) -> String {
        text_of(&self.content)
    }

    /// The tool calls asked for, in order: `(id, name, input)`.
    pub fn tool_uses(&self) -> impl Iterator<Item = (&str, &str, &Value)> {
        self.content.iter().filter_map(|block| match block {
            ContentBlock::ToolUse { id, name, input } => Some((id.as_str(), name.as_str(), input)),
            _ => None,
        })
    }
}

/// The text blocks of `content`, joined with blank lines.
pub fn text_of(content: &[ContentBlock]) -> String {
    let texts: Vec<&str> = content
        .iter()
        .filter_map(|block| match block {
            ContentBlock::Text { text } => Some(text.trim()),
            _ => None,
        })
        .filter(|text| !text.is_empty())
        .collect();
    texts.join("\n\n")
}

/// The body of an error response: `{"type":"error","error":{"type":…,"message":…}}`.
#[derive(Clone, Debug, Deserialize)]
pub(crate) struct ErrorBody {
    pub(crate) error: ErrorDetail,
}

/// The `error` object of an error response.
#[derive(Clone, Debug, Deserialize)]
pub(crate) struct ErrorDetail {
    #[serde(rename = "type", default)]
    pub(crate) kind: String,
    #[serde(default)]
    pub(crate) message: String,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    #[test]
    fn blocks_round_trip_including_unknown_ones() {
        let wire = json!([
            {"type": "thinking", "thinking": "let me see", "signature": "c2ln"},
            {"type": "text", "text": "I'll write it."},
            {"type": "tool_use", "id": "toolu_1", "name": "write_file",
             "input": {"path": "fib.py", "content": "print(1)"}},
        ]);
        let blocks: Vec<ContentBlock> = serde_json::from_value(wire.clone()).unwrap();
        assert!(matches!(blocks[0], ContentBlock::Other(_)));
        assert_eq!(
            blocks[1],
            ContentBlock::Text {
                text: "I'll write it.".into()
            }
        );
        assert_eq!(serde_json::to_value(&blocks).unwrap(), wire);
    }

    #[test]
    fn tool_result_omits_is_error_when_false() {
        let ok = ContentBlock::ToolResult {
            tool_use_id: "t".into(),
            content: "fine".into(),
            is_error: false,
        };
        let failed = ContentBlock::ToolResult {
            tool_use_id: "t".into(),
            content: "boom".into(),
            is_error: true,
        };
        assert_eq!(
            serde_json::to_value(&ok).unwrap(),
            json!({"type": "tool_result", "tool_use_id": "t", "content": "fine"})
        );
        assert_eq!(
            serde_json::to_value(&failed).unwrap(),
            json!({"type": "tool_result", "tool_use_id": "t", "content": "boom", "is_error": true})
        );
    }

    #[test]
    fn response_parses_with_unknown_stop_reason_and_usage() {
        let response: MessagesResponse = serde_json::from_value(json!({
            "id": "msg_1", "type": "message", "role": "assistant", "model": "m",
            "content": [{"type": "text", "text": "done"}],
            "stop_reason": "something_new",
            "usage": {"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 3}
        }))
        .unwrap();
        assert_eq!(response.stop_reason, Some(StopReason::Other));
        assert_eq!(response.usage.total(), 18);
        assert_eq!(response.text(), "done");
    }
}
