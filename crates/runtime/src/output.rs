//! Output bookkeeping, sans IO: cutting chunks at UTF-8 boundaries, and the bounded log that
//! keeps the tail of a background process's output with absolute byte offsets.

use std::collections::VecDeque;

use agent_sandbox_api::runtime::v1::{ExecEvent, OutputChunk, StreamKind};
use bytes::Bytes;

/// Length of the longest prefix of `bytes` that does not end inside a UTF-8 sequence that the
/// next bytes could complete. Invalid bytes are not held back (they go out as base64).
pub(crate) fn complete_prefix_len(bytes: &[u8]) -> usize {
    // A sequence is at most 4 bytes: only the last 3 can be an incomplete start.
    let tail_start = bytes.len().saturating_sub(3);
    for start in (tail_start..bytes.len()).rev() {
        let byte = bytes[start];
        let needed = match byte {
            0xC2..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF4 => 4,
            // A continuation byte: keep looking for the lead byte.
            0x80..=0xBF => continue,
            // ASCII or invalid lead: nothing incomplete after it.
            _ => return bytes.len(),
        };
        let have = bytes.len() - start;
        if have < needed
            && std::str::from_utf8(&bytes[start..]).is_err_and(|e| e.error_len().is_none())
        {
            return start;
        }
        return bytes.len();
    }
    bytes.len()
}

/// Holds back an incomplete UTF-8 sequence at the end of one read until the next read of the
/// same stream completes it.
#[derive(Debug, Default)]
pub(crate) struct Utf8Carry {
    pending: Vec<u8>,
}

impl Utf8Carry {
    /// Returns the bytes to emit now: the carried bytes plus `bytes`, minus a new incomplete
    /// tail. Empty when everything is held back.
    pub(crate) fn push(&mut self, bytes: &[u8]) -> Vec<u8> {
        let mut joined = std::mem::take(&mut self.pending);
        joined.extend_from_slice(bytes);
        let cut = complete_prefix_len(&joined);
        self.pending = joined.split_off(cut);
        joined
    }

    /// Whatever is still held back (at end of stream).
    pub(crate) fn flush(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.pending)
    }
}

/// An output event for `kind` at `offset`.
pub(crate) fn chunk_event(kind: StreamKind, offset: u64, bytes: &[u8]) -> ExecEvent {
    let chunk = OutputChunk::from_bytes(offset, bytes);
    match kind {
        StreamKind::Stdout => ExecEvent::Stdout(chunk),
        StreamKind::Stderr => ExecEvent::Stderr(chunk),
    }
}

/// The bounded tail of a background process's output: chunks with absolute offsets; the oldest
/// are dropped when more than `capacity` bytes are kept.
#[derive(Debug)]
pub(crate) struct OutputLog {
    chunks: VecDeque<(StreamKind, u64, Bytes)>,
    /// Offset of the first kept byte.
    start: u64,
    /// Offset just past the last byte (total produced).
    end: u64,
    capacity: u64,
}

/// What a read from an offset yields.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Read {
    /// Bytes the reader asked for that are no longer kept (`offset..offset + dropped`).
    pub(crate) dropped: u64,
    /// Chunks from the (adjusted) offset on, the first one possibly cut at its start.
    pub(crate) chunks: Vec<(StreamKind, u64, Bytes)>,
    /// Offset just past what was returned.
    pub(crate) next: u64,
}

impl OutputLog {
    /// An empty log keeping at most `capacity` bytes (at least one chunk is always kept).
    pub(crate) fn new(capacity: u64) -> Self {
        Self {
            chunks: VecDeque::new(),
            start: 0,
            end: 0,
            capacity,
        }
    }

    /// Offset of the oldest kept byte.
    pub(crate) fn start(&self) -> u64 {
        self.start
    }

    /// Offset just past the newest byte.
    pub(crate) fn end(&self) -> u64 {
        self.end
    }

    /// Appends a chunk and drops the oldest chunks beyond the capacity.
    pub(crate) fn push(&mut self, kind: StreamKind, bytes: Bytes) {
        if bytes.is_empty() {
            return;
        }
        let len = bytes.len() as u64;
        self.chunks.push_back((kind, self.end, bytes));
        self.end += len;
        while self.end - self.start > self.capacity && self.chunks.len() > 1 {
            if let Some((_, _, dropped)) = self.chunks.pop_front() {
                self.start += dropped.len() as u64;
            }
        }
    }

    /// Everything kept from `offset` on (at most `max_chunks` chunks). An offset older than the
    /// kept tail reports the gap as dropped; one past the end yields nothing.
    pub(crate) fn read(&self, offset: u64, max_chunks: usize) -> Read {
        let dropped = self.start.saturating_sub(offset);
        let from = offset.max(self.start);
        let mut chunks = Vec::new();
        let mut next = from.min(self.end);
        for (kind, chunk_offset, bytes) in &self.chunks {
            if chunks.len() >= max_chunks {
                break;
            }
            let chunk_end = chunk_offset + bytes.len() as u64;
            if chunk_end <= from {
                continue;
            }
            let skip = usize::try_from(from.saturating_sub(*chunk_offset)).unwrap_or(usize::MAX);
            let piece = bytes.slice(skip.min(bytes.len())..);
            chunks.push((*kind, chunk_offset + skip as u64, piece));
            next = chunk_end;
        }
        Read {
            dropped,
            chunks,
            next,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn utf8_prefixes() {
        assert_eq!(complete_prefix_len(b"abc"), 3);
        assert_eq!(complete_prefix_len(b""), 0);
        let e_acute = "é".as_bytes(); // c3 a9
        assert_eq!(complete_prefix_len(&[b'a', e_acute[0]]), 1);
        assert_eq!(complete_prefix_len(&[b'a', e_acute[0], e_acute[1]]), 3);
        let euro = "€".as_bytes(); // e2 82 ac
        assert_eq!(complete_prefix_len(&euro[..2]), 0);
        let emoji = "😀".as_bytes(); // 4 bytes
        assert_eq!(complete_prefix_len(&emoji[..3]), 0);
        assert_eq!(complete_prefix_len(emoji), 4);
        // Invalid bytes are not held back.
        assert_eq!(complete_prefix_len(&[b'a', 0xff]), 2);
        assert_eq!(complete_prefix_len(&[0xc3, 0x28]), 2);
    }

    #[test]
    fn carry_joins_split_characters() {
        let text = "aé€😀z".as_bytes();
        let mut carry = Utf8Carry::default();
        let mut out = Vec::new();
        let mut pieces = Vec::new();
        for byte in text {
            let emitted = carry.push(std::slice::from_ref(byte));
            if !emitted.is_empty() {
                assert!(std::str::from_utf8(&emitted).is_ok());
                pieces.push(emitted.clone());
            }
            out.extend(emitted);
        }
        out.extend(carry.flush());
        assert_eq!(out, text);
        assert_eq!(pieces.len(), 5);
    }

    #[test]
    fn log_keeps_the_tail_and_reports_drops() {
        let mut log = OutputLog::new(8);
        log.push(StreamKind::Stdout, Bytes::from_static(b"aaaa"));
        log.push(StreamKind::Stderr, Bytes::from_static(b"bbbb"));
        assert_eq!((log.start(), log.end()), (0, 8));
        log.push(StreamKind::Stdout, Bytes::from_static(b"cccc"));
        assert_eq!((log.start(), log.end()), (4, 12));

        let read = log.read(0, 100);
        assert_eq!(read.dropped, 4);
        assert_eq!(
            read.chunks,
            vec![
                (StreamKind::Stderr, 4, Bytes::from_static(b"bbbb")),
                (StreamKind::Stdout, 8, Bytes::from_static(b"cccc")),
            ]
        );
        assert_eq!(read.next, 12);

        // Resuming in the middle of a chunk.
        let read = log.read(10, 100);
        assert_eq!(read.dropped, 0);
        assert_eq!(
            read.chunks,
            vec![(StreamKind::Stdout, 10, Bytes::from_static(b"cc"))]
        );
        assert_eq!(read.next, 12);

        // At or past the end: nothing.
        let read = log.read(12, 100);
        assert!(read.chunks.is_empty());
        assert_eq!(read.next, 12);

        // Bounded batches.
        let read = log.read(4, 1);
        assert_eq!(read.chunks.len(), 1);
        assert_eq!(read.next, 8);
    }

    #[test]
    fn one_oversized_chunk_is_kept() {
        let mut log = OutputLog::new(2);
        log.push(StreamKind::Stdout, Bytes::from_static(b"hello"));
        assert_eq!((log.start(), log.end()), (0, 5));
        log.push(StreamKind::Stdout, Bytes::from_static(b"!"));
        assert_eq!((log.start(), log.end()), (5, 6));
    }
}
