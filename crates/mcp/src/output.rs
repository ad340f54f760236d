//! What `execute_command` keeps of a command's output and what it streams while the command
//! runs, sans IO: [`CappedOutput`] keeps the beginning and the end of a stream within a byte
//! budget and says how much it left out (never a silent cut); [`ProgressBatch`] gathers output
//! into progress messages of bounded size and rate.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// One output stream (stdout or stderr) as the tool returns it: at most `cap` bytes, the first
/// half and the last half when the stream was longer, with a line in between saying how many
/// bytes were left out.
#[derive(Debug)]
pub(crate) struct CappedOutput {
    head_cap: usize,
    tail_cap: usize,
    head: Vec<u8>,
    tail: VecDeque<u8>,
    total: u64,
}

/// What [`CappedOutput::render`] returns.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Captured {
    /// The text (bytes that are not UTF-8 become U+FFFD).
    pub(crate) text: String,
    /// Bytes were left out.
    pub(crate) truncated: bool,
    /// How many bytes the stream had.
    pub(crate) total: u64,
}

impl CappedOutput {
    /// A stream kept within `cap` bytes.
    pub(crate) fn new(cap: usize) -> Self {
        let head_cap = cap.div_ceil(2);
        Self {
            head_cap,
            tail_cap: cap - head_cap,
            head: Vec::new(),
            tail: VecDeque::new(),
            total: 0,
        }
    }

    /// Adds bytes from the stream.
    pub(crate) fn push(&mut self, mut bytes: &[u8]) {
        self.total = self.total.saturating_add(bytes.len() as u64);
        let room = self.head_cap.saturating_sub(self.head.len());
        let (head, rest) = bytes.split_at(room.min(bytes.len()));
        self.head.extend_from_slice(head);
        bytes = rest;
        if bytes.len() > self.tail_cap {
            bytes = &bytes[bytes.len() - self.tail_cap..];
        }
        let overflow = (self.tail.len() + bytes.len()).saturating_sub(self.tail_cap);
        self.tail.drain(..overflow.min(self.tail.len()));
        self.tail.extend(bytes);
    }

    /// The text to return with at most `keep` of the bytes kept (the beginning and the end,
    /// half each), saying where `what` was cut and how much was left out. A `keep` below what
    /// was kept is for a result that must fit in one MCP message, and the text says so.
    pub(crate) fn render(&self, what: &str, keep: usize) -> Captured {
        let kept = self.head.len() + self.tail.len();
        let (head_len, tail_len) = if keep >= kept {
            (self.head.len(), self.tail.len())
        } else {
            let head_len = keep.div_ceil(2).min(self.head.len());
            (head_len, (keep - head_len).min(self.tail.len()))
        };
        let mut bytes = self.head[..head_len].to_vec();
        let mut tail: Vec<u8> = self
            .tail
            .range(self.tail.len() - tail_len..)
            .copied()
            .collect();
        let shown = (head_len + tail_len) as u64;
        let truncated = self.total > shown;
        if truncated {
            // Cut at character boundaries, so that the cut does not add replacement characters.
            trim_partial_char_end(&mut bytes);
            trim_partial_char_start(&mut tail);
            let omitted = self.total - shown;
            let why = if keep < kept {
                " (all that fits in one MCP result)"
            } else {
                ""
            };
            bytes.extend_from_slice(
                format!(
                    "\n[... {omitted} bytes of {what} left out: the command wrote {} bytes, of \
                     which the first {head_len} and the last {tail_len} are shown{why}; redirect \
                     the output to a file and read the part you need (head, tail, grep, or \
                     download_file) ...]\n",
                    self.total,
                )
                .as_bytes(),
            );
        }
        bytes.extend_from_slice(&tail);
        Captured {
            text: String::from_utf8_lossy(&bytes).into_owned(),
            truncated,
            total: self.total,
        }
    }

    /// Bytes kept (at most the cap).
    pub(crate) fn kept(&self) -> usize {
        self.head.len() + self.tail.len()
    }
}

/// Drops a UTF-8 sequence cut short at the end of `bytes` (at most 3 bytes).
fn trim_partial_char_end(bytes: &mut Vec<u8>) {
    let start = bytes.len().saturating_sub(3);
    for i in (start..bytes.len()).rev() {
        let byte = bytes[i];
        if byte & 0xC0 == 0x80 {
            continue;
        }
        let width = match byte {
            0x00..=0x7F => 1,
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            _ => 4,
        };
        if i + width > bytes.len() {
            bytes.truncate(i);
        }
        return;
    }
}

/// Drops continuation bytes at the start of `bytes` (the end of a character cut off).
fn trim_partial_char_start(bytes: &mut Vec<u8>) {
    let skip = bytes
        .iter()
        .take(3)
        .take_while(|b| **b & 0xC0 == 0x80)
        .count();
    bytes.drain(..skip);
}

/// Output gathered for progress notifications: flushed when it reaches [`ProgressBatch::max`]
/// bytes or [`ProgressBatch::interval`] after the last flush; output beyond `max` between two
/// flushes is counted, not kept.
#[derive(Debug)]
pub(crate) struct ProgressBatch {
    max: usize,
    interval: Duration,
    pending: Vec<u8>,
    skipped: u64,
    seen: u64,
    last_flush: Instant,
}

/// A progress notification to send.
#[derive(Debug, PartialEq)]
pub(crate) struct ProgressMessage {
    /// Bytes of output so far (stdout and stderr): increases with every message.
    pub(crate) progress: f64,
    /// The output since the previous message.
    pub(crate) message: String,
}

impl ProgressBatch {
    /// Messages of at most `max` bytes of output, at most one per `interval` unless full.
    pub(crate) fn new(max: usize, interval: Duration, now: Instant) -> Self {
        Self {
            max,
            interval,
            pending: Vec::new(),
            skipped: 0,
            seen: 0,
            last_flush: now,
        }
    }

    /// Adds output (stderr marked as such).
    pub(crate) fn push(&mut self, stderr: bool, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        self.seen = self.seen.saturating_add(bytes.len() as u64);
        let marked: Vec<u8> = if stderr {
            let mut marked = b"[stderr] ".to_vec();
            marked.extend_from_slice(bytes);
            marked
        } else {
            bytes.to_vec()
        };
        let room = self.max.saturating_sub(self.pending.len());
        let kept = room.min(marked.len());
        self.pending.extend_from_slice(&marked[..kept]);
        self.skipped = self.skipped.saturating_add((marked.len() - kept) as u64);
    }

    /// When the pending output is due ([`ProgressBatch::take`] then returns it).
    pub(crate) fn due(&self) -> Option<Instant> {
        (!self.pending.is_empty() || self.skipped > 0).then(|| self.last_flush + self.interval)
    }

    /// The message to send now, if one is due at `now` (or `force`d, at the end).
    pub(crate) fn take(&mut self, now: Instant, force: bool) -> Option<ProgressMessage> {
        let due = self.due()?;
        if !force && now < due && self.pending.len() < self.max {
            return None;
        }
        let mut message = String::from_utf8_lossy(&std::mem::take(&mut self.pending)).into_owned();
        if self.skipped > 0 {
            message.push_str(&format!(
                "\n[... {} more bytes of output not shown while running ...]",
                self.skipped
            ));
            self.skipped = 0;
        }
        self.last_flush = now;
        Some(ProgressMessage {
            progress: self.seen as f64,
            message,
        })
    }
}

#[cfg(test)]
mod tests {
    use pretty_assertions::assert_eq;

    use super::*;

    #[test]
    fn short_output_is_kept_whole() {
        let mut out = CappedOutput::new(10);
        out.push(b"hello");
        out.push(b" you");
        assert_eq!(
            out.render("stdout", usize::MAX),
            Captured {
                text: "hello you".to_owned(),
                truncated: false,
                total: 9
            }
        );
        let mut exact = CappedOutput::new(4);
        exact.push(b"ab");
        exact.push(b"cd");
        assert_eq!(exact.render("stdout", usize::MAX).text, "abcd");
    }

    #[test]
    fn long_output_keeps_both_ends_and_says_so() {
        let mut out = CappedOutput::new(8);
        for chunk in [&b"0123"[..], b"4567", b"89abcdef", b"XYZW"] {
            out.push(chunk);
        }
        let captured = out.render("stdout", usize::MAX);
        assert!(captured.truncated);
        assert_eq!(captured.total, 20);
        assert!(
            captured
                .text
                .starts_with("0123\n[... 12 bytes of stdout left out")
        );
        assert!(
            captured.text.contains("wrote 20 bytes"),
            "{}",
            captured.text
        );
        assert!(captured.text.ends_with("...]\nXYZW"), "{}", captured.text);
    }

    #[test]
    fn one_huge_chunk_is_cut_too() {
        let mut out = CappedOutput::new(6);
        out.push(&[b'a'; 1000]);
        out.push(b"end");
        let captured = out.render("stderr", usize::MAX);
        assert!(captured.text.starts_with("aaa\n[... 997 bytes of stderr"));
        assert!(captured.text.ends_with("]\nend"));
    }

    #[test]
    fn cuts_fall_between_characters() {
        let mut out = CappedOutput::new(6);
        out.push("ééééééé".as_bytes()); // 14 bytes, each é two.
        let captured = out.render("stdout", usize::MAX);
        assert!(!captured.text.contains('\u{FFFD}'), "{}", captured.text);
        assert!(captured.text.starts_with("é\n"), "{}", captured.text);
        assert!(captured.text.ends_with("]\né"), "{}", captured.text);
    }

    #[test]
    fn progress_is_batched_bounded_and_increasing() {
        let start = Instant::now();
        let second = Duration::from_secs(1);
        let mut batch = ProgressBatch::new(16, second, start);
        assert_eq!(batch.take(start, true), None, "nothing to send");
        batch.push(false, b"line 1\n");
        assert_eq!(batch.take(start, false), None, "not due yet");
        assert_eq!(batch.due(), Some(start + second));
        let first = batch.take(start + second, false);
        assert_eq!(
            first,
            Some(ProgressMessage {
                progress: 7.0,
                message: "line 1\n".to_owned()
            })
        );
        batch.push(true, b"oops");
        batch.push(false, b"0123456789");
        let full = batch.take(start + second, false);
        assert_eq!(
            full,
            Some(ProgressMessage {
                progress: 21.0,
                message: "[stderr] oops012\n[... 7 more bytes of output not shown while \
                          running ...]"
                    .to_owned()
            }),
            "a full batch goes at once"
        );
        assert_eq!(batch.due(), None);
    }
}
