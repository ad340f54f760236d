//! What fits in one MCP message, sans IO: the encoded size of a tool result as it travels
//! ([`encoded_len`], [`structured_len`]), the largest part of a result that fits a budget
//! ([`largest_fitting`]), and the last guard before a result leaves ([`within_budget`]), which
//! withholds a result that still does not fit and says so.
//!
//! Why: MCP clients cap one message. The official Python SDK's streamable HTTP client refuses a
//! server-sent event over 1 MiB (and the call then fails without a result), and a successful
//! tool result carries its content twice: as `structuredContent` and as a text block holding the
//! same JSON, escaped once more. A byte of output can take 13 bytes that way (a control
//! character is `\u0001` in one copy and `\\u0001` in the other).

use std::io;

use rmcp::model::{CallToolResult, ContentBlock};
use serde::Serialize;

/// The most one encoded tool result may take: the Python SDK's 1 MiB limit on one server-sent
/// event, less room for what surrounds the result there (the JSON-RPC envelope with the
/// request's id, and the event's `data:`, `id:` and `event:` lines).
pub(crate) const MAX_RESULT_BYTES: usize = 1024 * 1024 - 16 * 1024;

/// How many sizes [`largest_fitting`] tries before it settles for nothing.
const ROUNDS: usize = 32;

/// Counts the bytes written to it.
#[derive(Debug, Default)]
struct Count(usize);

impl io::Write for Count {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.0 = self.0.saturating_add(bytes.len());
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The length of `value`'s JSON encoding (`usize::MAX` if it cannot be encoded).
pub(crate) fn encoded_len<T: Serialize + ?Sized>(value: &T) -> usize {
    let mut count = Count::default();
    match serde_json::to_writer(&mut count, value) {
        Ok(()) => count.0,
        Err(_) => usize::MAX,
    }
}

/// The encoded length of the result a tool returning `output` as structured content sends
/// (rmcp's `Json`: the structured content and a text block with its JSON).
pub(crate) fn structured_len<T: Serialize>(output: &T) -> usize {
    match serde_json::to_value(output) {
        Ok(value) => encoded_len(&CallToolResult::structured(value)),
        Err(_) => usize::MAX,
    }
}

/// The encoded length of an error result with `message` as its text.
pub(crate) fn error_len(message: &str) -> usize {
    encoded_len(&CallToolResult::error(vec![ContentBlock::text(message)]))
}

/// `make(n)` for the largest `n` at most `max` whose result fits `budget`, as far as a few
/// rounds find it: `make` returns the result and its encoded length, which must not grow when
/// `n` shrinks. Each round scales `n` by how far the last result was over, so a result whose
/// size is a fixed part plus a part proportional to `n` fits in one or two rounds; after
/// [`ROUNDS`] it is `make(0)`.
pub(crate) fn largest_fitting<T>(
    max: usize,
    budget: usize,
    mut make: impl FnMut(usize) -> (T, usize),
) -> T {
    let mut n = max;
    for _ in 0..ROUNDS {
        let (value, len) = make(n);
        if len <= budget || n == 0 {
            return value;
        }
        let scaled = u128::from(n as u64) * budget as u128 / len as u128 * 9 / 10;
        n = usize::try_from(scaled).unwrap_or(0).min(n - 1);
    }
    make(0).0
}

/// `result` of `tool` if its encoding fits `budget`, else an error result that says it was
/// withheld, how large it was, and what to ask for instead. Never a silent cut: the tools fit
/// their results themselves, so this is the guard for what they did not foresee.
pub(crate) fn within_budget(tool: &str, result: CallToolResult, budget: usize) -> CallToolResult {
    let len = encoded_len(&result);
    if len <= budget {
        return result;
    }
    tracing::warn!(%tool, len, budget, "withholding a tool result too large for one MCP message");
    CallToolResult::error(vec![ContentBlock::text(format!(
        "The result of {tool} was withheld: it takes {len} bytes encoded as JSON, more than the \
         {budget} bytes one MCP result may take (clients refuse larger messages). Ask for less: \
         a narrower path or fewer max_entries, part of a file (execute_command with head -c, \
         tail -c or split), or output redirected to a file."
    ))])
}

#[cfg(test)]
mod tests {
    use pretty_assertions::assert_eq;
    use serde_json::json;

    use super::*;

    #[test]
    fn encoded_lengths_count_both_copies_and_their_escapes() {
        let value = json!({"text": "\u{1}"});
        // {"text":"\u0001"} is 17 bytes; in the text block each escape is escaped again.
        assert_eq!(encoded_len(&value), 17);
        let result = CallToolResult::structured(value.clone());
        assert_eq!(
            structured_len(&value),
            serde_json::to_vec(&result).unwrap().len()
        );
        let text = serde_json::to_string(&result.content).unwrap();
        assert!(text.contains(r#"\\u0001"#), "{text}");
        assert_eq!(
            error_len("x"),
            serde_json::to_vec(&CallToolResult::error(vec![ContentBlock::text("x")]))
                .unwrap()
                .len()
        );
    }

    #[test]
    fn the_largest_fitting_part_is_found_and_nothing_is_the_last_resort() {
        // 100 bytes of envelope and 13 per unit: 1000 units fit 13,100 bytes.
        let size = |n: usize| 100 + 13 * n;
        let mut tried = Vec::new();
        let n = largest_fitting(100_000, 13_100, |n| {
            tried.push(n);
            (n, size(n))
        });
        assert!(size(n) <= 13_100 && n > 800, "{n} after {tried:?}");
        assert!(tried.len() <= 3, "{tried:?}");
        assert_eq!(largest_fitting(10, 1000, |n| (n, size(n))), 10);
        // Nothing fits: the result for 0.
        assert_eq!(largest_fitting(10, 50, |n| (n, size(n))), 0);
    }

    #[test]
    fn an_oversized_result_is_withheld_and_said_so() {
        let small = CallToolResult::structured(json!({"ok": true}));
        assert_eq!(within_budget("t", small.clone(), 1000), small);
        let big = CallToolResult::structured(json!({"data": "x".repeat(2000)}));
        let withheld = within_budget("download_file", big, 1000);
        assert_eq!(withheld.is_error, Some(true));
        let text = serde_json::to_string(&withheld.content).unwrap();
        assert!(
            text.contains("The result of download_file was withheld: it takes 4"),
            "{text}"
        );
        assert!(encoded_len(&withheld) <= 1000);
    }
}
