//! Output bookkeeping, sans IO: cutting chunks at UTF-8 boundaries, the bounded log that keeps
//! the tail of a background process's output with absolute byte offsets, and the incremental
//! JSON string encoding of captured output ([`JsonText`]), so that an answer is encoded in
//! bounded pieces instead of all at once.

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

/// Encodes bytes as the content of a JSON string, exactly as serde_json encodes
/// `String::from_utf8_lossy(bytes)` (invalid UTF-8 becomes U+FFFD; `"`, `\\` and control
/// characters are escaped, six bytes for most of them), a bounded piece at a time.
#[derive(Debug)]
pub(crate) struct JsonText {
    bytes: Vec<u8>,
    /// How far `bytes` has been encoded; always at a boundary where decoding can restart (a
    /// character boundary, or just after an invalid sequence).
    done: usize,
}

/// The replacement character's UTF-8.
const REPLACEMENT: &[u8] = "\u{FFFD}".as_bytes();

impl JsonText {
    pub(crate) fn new(bytes: Vec<u8>) -> Self {
        Self { bytes, done: 0 }
    }

    /// Whether everything has been encoded.
    pub(crate) fn is_done(&self) -> bool {
        self.done >= self.bytes.len()
    }

    /// The encoded length of everything (without encoding it).
    pub(crate) fn encoded_len(&self) -> u64 {
        let mut len: u64 = 0;
        for chunk in self.bytes.utf8_chunks() {
            len += chunk
                .valid()
                .bytes()
                .map(|b| escape(b).map_or(1, |e| e.len() as u64))
                .sum::<u64>();
            if !chunk.invalid().is_empty() {
                len += REPLACEMENT.len() as u64;
            }
        }
        len
    }

    /// Encodes about `budget` more input bytes (at least one character, unless done) onto
    /// `out`: at most `6 * (budget + 3)` bytes.
    pub(crate) fn encode_some(&mut self, out: &mut Vec<u8>, budget: usize) {
        let start = self.done;
        let rest = &self.bytes[start..];
        let mut used = 0;
        for chunk in rest.utf8_chunks() {
            let valid = chunk.valid().as_bytes();
            let room = budget.saturating_sub(used).max(1);
            if valid.len() > room {
                // Cut at a character boundary (at least one character, to make progress).
                let mut cut = room;
                while cut > 0 && (valid[cut] & 0xC0) == 0x80 {
                    cut -= 1;
                }
                if cut == 0 {
                    cut = 1;
                    while cut < valid.len() && (valid[cut] & 0xC0) == 0x80 {
                        cut += 1;
                    }
                }
                push_escaped(out, &valid[..cut]);
                used += cut;
                break;
            }
            push_escaped(out, valid);
            used += valid.len();
            if !chunk.invalid().is_empty() {
                out.extend_from_slice(REPLACEMENT);
                used += chunk.invalid().len();
            }
            if used >= budget {
                break;
            }
        }
        self.done = start + used;
    }
}

/// serde_json's escape for one byte of UTF-8 text, if it needs one.
fn escape(byte: u8) -> Option<&'static [u8]> {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    static CONTROL: [[u8; 6]; 32] = {
        let mut table = [[0u8; 6]; 32];
        let mut i = 0;
        while i < 32 {
            table[i] = [b'\\', b'u', b'0', b'0', HEX[i >> 4], HEX[i & 0xF]];
            i += 1;
        }
        table
    };
    Some(match byte {
        b'"' => b"\\\"",
        b'\\' => b"\\\\",
        b'\n' => b"\\n",
        b'\r' => b"\\r",
        b'\t' => b"\\t",
        0x08 => b"\\b",
        0x0C => b"\\f",
        0..=0x1F => &CONTROL[byte as usize],
        _ => return None,
    })
}

/// Appends `text` (valid UTF-8) escaped: runs that need no escape are copied whole.
fn push_escaped(out: &mut Vec<u8>, text: &[u8]) {
    let mut plain = 0;
    for (i, byte) in text.iter().enumerate() {
        if let Some(escaped) = escape(*byte) {
            out.extend_from_slice(&text[plain..i]);
            out.extend_from_slice(escaped);
            plain = i + 1;
        }
    }
    out.extend_from_slice(&text[plain..]);
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

    /// What serde_json makes of the lossy string, without the quotes.
    fn serde_text(bytes: &[u8]) -> Vec<u8> {
        let json = serde_json::to_vec(&String::from_utf8_lossy(bytes)).unwrap();
        json[1..json.len() - 1].to_vec()
    }

    fn encoded(bytes: &[u8], budget: usize) -> Vec<u8> {
        let mut text = JsonText::new(bytes.to_vec());
        let mut out = Vec::new();
        let mut steps = 0;
        while !text.is_done() {
            let before = out.len();
            text.encode_some(&mut out, budget);
            assert!(
                out.len() - before <= 6 * (budget + 3),
                "a piece over its bound"
            );
            steps += 1;
            assert!(steps <= bytes.len() + 1, "no progress");
        }
        assert_eq!(
            out.len() as u64,
            JsonText::new(bytes.to_vec()).encoded_len()
        );
        out
    }

    #[test]
    fn json_text_is_serde_jsons() {
        for bytes in [
            &b""[..],
            b"plain",
            b"\0\0\x1f\x7f\"\\\n\r\t\x08\x0c",
            "é€😀".as_bytes(),
            &[0xff, b'a', 0xc3, 0x28, 0xe2, 0x82, b'z', 0xf0, 0x9f, 0x98],
        ] {
            for budget in [1, 2, 3, 7, 1 << 16] {
                assert_eq!(
                    encoded(bytes, budget),
                    serde_text(bytes),
                    "{bytes:?} by {budget}"
                );
            }
        }
        assert_eq!(encoded(&[0; 4], 1), br"\u0000\u0000\u0000\u0000".to_vec());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 2048, ..Default::default() })]

        /// Piece by piece, any bytes encode exactly as serde_json encodes their lossy string.
        #[test]
        fn json_text_matches_serde_json_for_any_bytes(
            bytes in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::prelude::any::<u8>(),
                    proptest::sample::select(vec![0u8, b'"', b'\\', 0xc3, 0xa9, 0xe2, 0x82, 0xac, 0xf0, 0x9f]),
                ],
                0..64,
            ),
            budget in 1usize..20,
        ) {
            proptest::prop_assert_eq!(encoded(&bytes, budget), serde_text(&bytes));
        }
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
