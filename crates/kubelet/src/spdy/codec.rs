//! SPDY/3.1 frames as bytes, without IO: [`Decoder`] turns received bytes into [`Frame`]s and
//! [`Encoder`] frames into bytes. Header blocks are zlib streams primed with SPDY/3's shared
//! dictionary, one stream per direction for the whole connection, so each side keeps one
//! compressor or decompressor for as long as the connection lives.

use bytes::{Buf as _, BufMut as _, Bytes, BytesMut};
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

/// The protocol version in every control frame.
pub(crate) const VERSION: u16 = 3;
/// The largest frame payload the 24-bit length field can carry.
pub(crate) const MAX_PAYLOAD: usize = (1 << 24) - 1;
/// The largest header block we inflate (a port-forward request has four short headers); a
/// larger one ends the connection instead of growing memory.
const MAX_HEADER_BLOCK: usize = 256 << 10;

/// Data-frame and SYN flag: the sender will send no more on this stream.
const FLAG_FIN: u8 = 0x01;

mod kind {
    pub(super) const SYN_STREAM: u16 = 1;
    pub(super) const SYN_REPLY: u16 = 2;
    pub(super) const RST_STREAM: u16 = 3;
    pub(super) const SETTINGS: u16 = 4;
    pub(super) const PING: u16 = 6;
    pub(super) const GOAWAY: u16 = 7;
    pub(super) const HEADERS: u16 = 8;
    pub(super) const WINDOW_UPDATE: u16 = 9;
}

/// RST_STREAM status codes we send.
pub(crate) mod status {
    /// The stream was refused (unknown kind, or a request we cannot serve).
    pub(crate) const REFUSED_STREAM: u32 = 3;
    /// The stream id is already in use or otherwise invalid.
    pub(crate) const PROTOCOL_ERROR: u32 = 1;
}

/// Header names and values of a SYN_STREAM, SYN_REPLY or HEADERS frame.
pub(crate) type Headers = Vec<(String, String)>;

/// One frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Frame {
    SynStream {
        stream: u32,
        fin: bool,
        headers: Headers,
    },
    SynReply {
        stream: u32,
        fin: bool,
        headers: Headers,
    },
    RstStream {
        stream: u32,
        status: u32,
    },
    Ping {
        id: u32,
    },
    GoAway {
        last_stream: u32,
        status: u32,
    },
    Headers {
        stream: u32,
        fin: bool,
        headers: Headers,
    },
    Data {
        stream: u32,
        fin: bool,
        data: Bytes,
    },
    /// SETTINGS, WINDOW_UPDATE and control frames of unknown types: read and ignored (the
    /// Kubernetes peers do not enforce flow control either).
    Ignored {
        kind: u16,
    },
}

/// Why the bytes received are not SPDY/3.1 as we speak it; the connection cannot go on.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("control frame of SPDY version {0}, expected 3")]
    Version(u16),
    #[error("{kind} frame of {len} bytes is too short")]
    Short { kind: &'static str, len: usize },
    #[error("the header block is malformed: {0}")]
    HeaderBlock(&'static str),
    #[error("the header block inflates beyond {MAX_HEADER_BLOCK} bytes")]
    HeaderBlockTooLarge,
    #[error("zlib: {0}")]
    Zlib(String),
}

/// The SPDY/3 header compression dictionary (draft-mbelshe-httpbis-spdy-00, section 2.6.10.1):
/// these 65 words, each after its length as a 32-bit big-endian number, then [`DICTIONARY_TAIL`].
const DICTIONARY_WORDS: [&str; 65] = [
    "options",
    "head",
    "post",
    "put",
    "delete",
    "trace",
    "accept",
    "accept-charset",
    "accept-encoding",
    "accept-language",
    "accept-ranges",
    "age",
    "allow",
    "authorization",
    "cache-control",
    "connection",
    "content-base",
    "content-encoding",
    "content-language",
    "content-length",
    "content-location",
    "content-md5",
    "content-range",
    "content-type",
    "date",
    "etag",
    "expect",
    "expires",
    "from",
    "host",
    "if-match",
    "if-modified-since",
    "if-none-match",
    "if-range",
    "if-unmodified-since",
    "last-modified",
    "location",
    "max-forwards",
    "pragma",
    "proxy-authenticate",
    "proxy-authorization",
    "range",
    "referer",
    "retry-after",
    "server",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "user-agent",
    "vary",
    "via",
    "warning",
    "www-authenticate",
    "method",
    "get",
    "status",
    "200 OK",
    "version",
    "HTTP/1.1",
    "url",
    "public",
    "set-cookie",
    "keep-alive",
    "origin",
];

/// The unprefixed text that ends the dictionary.
const DICTIONARY_TAIL: &str = concat!(
    "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505",
    "203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request",
    "401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented",
    "503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 ",
    "Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,image/jpg,image/gif,",
    "application/xml,application/xhtml+xml,text/plain,text/javascript,publicprivatemax-age=",
    "gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0."
);

/// The dictionary's bytes.
pub(crate) fn dictionary() -> Vec<u8> {
    let mut bytes = Vec::with_capacity(1423);
    for word in DICTIONARY_WORDS {
        bytes.extend_from_slice(&u32::try_from(word.len()).unwrap_or(0).to_be_bytes());
        bytes.extend_from_slice(word.as_bytes());
    }
    bytes.extend_from_slice(DICTIONARY_TAIL.as_bytes());
    bytes
}

/// Received bytes to frames.
pub(crate) struct Decoder {
    buffer: BytesMut,
    inflate: Decompress,
    dictionary: Vec<u8>,
}

impl std::fmt::Debug for Decoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoder")
            .field("buffered", &self.buffer.len())
            .finish_non_exhaustive()
    }
}

impl Default for Decoder {
    fn default() -> Self {
        Self {
            buffer: BytesMut::new(),
            inflate: Decompress::new(true),
            dictionary: dictionary(),
        }
    }
}

impl Decoder {
    /// Where received bytes go.
    pub(crate) fn buffer(&mut self) -> &mut BytesMut {
        &mut self.buffer
    }

    /// The next whole frame in the buffer, if one has arrived.
    pub(crate) fn next(&mut self) -> Result<Option<Frame>, CodecError> {
        if self.buffer.len() < 8 {
            return Ok(None);
        }
        let len = usize::from(self.buffer[5]) << 16
            | usize::from(self.buffer[6]) << 8
            | usize::from(self.buffer[7]);
        if self.buffer.len() < 8 + len {
            return Ok(None);
        }
        let mut frame = self.buffer.split_to(8 + len);
        let first = frame.get_u32();
        let flags = frame.get_u8();
        frame.advance(3);
        let fin = flags & FLAG_FIN != 0;
        if first & 0x8000_0000 == 0 {
            return Ok(Some(Frame::Data {
                stream: first,
                fin,
                data: frame.freeze(),
            }));
        }
        let version = u16::try_from((first >> 16) & 0x7fff).unwrap_or(u16::MAX);
        if version != VERSION {
            return Err(CodecError::Version(version));
        }
        let kind = u16::try_from(first & 0xffff).unwrap_or(u16::MAX);
        let need = |name: &'static str, min: usize| {
            if len < min {
                Err(CodecError::Short { kind: name, len })
            } else {
                Ok(())
            }
        };
        Ok(Some(match kind {
            kind::SYN_STREAM => {
                need("SYN_STREAM", 10)?;
                let stream = frame.get_u32() & 0x7fff_ffff;
                // Associated-to stream, priority and slot: unused by Kubernetes' protocols.
                frame.advance(6);
                Frame::SynStream {
                    stream,
                    fin,
                    headers: self.headers(&frame)?,
                }
            }
            kind::SYN_REPLY => {
                need("SYN_REPLY", 4)?;
                let stream = frame.get_u32() & 0x7fff_ffff;
                Frame::SynReply {
                    stream,
                    fin,
                    headers: self.headers(&frame)?,
                }
            }
            kind::HEADERS => {
                need("HEADERS", 4)?;
                let stream = frame.get_u32() & 0x7fff_ffff;
                Frame::Headers {
                    stream,
                    fin,
                    headers: self.headers(&frame)?,
                }
            }
            kind::RST_STREAM => {
                need("RST_STREAM", 8)?;
                Frame::RstStream {
                    stream: frame.get_u32() & 0x7fff_ffff,
                    status: frame.get_u32(),
                }
            }
            kind::PING => {
                need("PING", 4)?;
                Frame::Ping {
                    id: frame.get_u32(),
                }
            }
            kind::GOAWAY => {
                need("GOAWAY", 4)?;
                let last_stream = frame.get_u32() & 0x7fff_ffff;
                let status = if frame.remaining() >= 4 {
                    frame.get_u32()
                } else {
                    0
                };
                Frame::GoAway {
                    last_stream,
                    status,
                }
            }
            other => Frame::Ignored { kind: other },
        }))
    }

    /// Inflates and parses one header block.
    fn headers(&mut self, block: &[u8]) -> Result<Headers, CodecError> {
        let mut plain: Vec<u8> = Vec::with_capacity(block.len() * 4 + 64);
        let mut input = block;
        loop {
            if plain.len() == plain.capacity() {
                if plain.len() >= MAX_HEADER_BLOCK {
                    return Err(CodecError::HeaderBlockTooLarge);
                }
                plain.reserve(plain.len().max(256));
            }
            let before_in = self.inflate.total_in();
            let before_out = plain.len();
            match self
                .inflate
                .decompress_vec(input, &mut plain, FlushDecompress::Sync)
            {
                Ok(Status::StreamEnd) => break,
                Ok(_) => {}
                Err(error) if error.needs_dictionary().is_some() => {
                    self.inflate
                        .set_dictionary(&self.dictionary)
                        .map_err(|e| CodecError::Zlib(e.to_string()))?;
                }
                Err(error) => return Err(CodecError::Zlib(error.to_string())),
            }
            let consumed = usize::try_from(self.inflate.total_in() - before_in).unwrap_or(0);
            input = &input[consumed.min(input.len())..];
            if input.is_empty() && plain.len() < plain.capacity() {
                break;
            }
            if consumed == 0 && plain.len() == before_out && plain.len() < plain.capacity() {
                return Err(CodecError::Zlib(
                    "no progress inflating the header block".into(),
                ));
            }
        }
        parse_header_block(&plain)
    }
}

/// The pairs of an inflated header block: a 32-bit count, then each name and value after its
/// 32-bit length.
fn parse_header_block(mut block: &[u8]) -> Result<Headers, CodecError> {
    fn take<'a>(block: &mut &'a [u8]) -> Result<&'a [u8], CodecError> {
        if block.len() < 4 {
            return Err(CodecError::HeaderBlock("a length is cut short"));
        }
        let len = usize::try_from(block.get_u32()).unwrap_or(usize::MAX);
        if block.len() < len {
            return Err(CodecError::HeaderBlock("a name or value is cut short"));
        }
        let (text, rest) = block.split_at(len);
        *block = rest;
        Ok(text)
    }
    if block.len() < 4 {
        return Err(CodecError::HeaderBlock("no pair count"));
    }
    let count = block.get_u32();
    let mut headers = Vec::new();
    for _ in 0..count {
        let name = take(&mut block)?;
        let value = take(&mut block)?;
        let text = |bytes: &[u8]| {
            String::from_utf8(bytes.to_vec())
                .map_err(|_| CodecError::HeaderBlock("a name or value is not UTF-8"))
        };
        headers.push((text(name)?.to_ascii_lowercase(), text(value)?));
    }
    Ok(headers)
}

/// Frames to bytes.
pub(crate) struct Encoder {
    deflate: Compress,
}

impl std::fmt::Debug for Encoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encoder").finish_non_exhaustive()
    }
}

impl Encoder {
    pub(crate) fn new() -> Result<Self, CodecError> {
        let mut deflate = Compress::new(Compression::fast(), true);
        deflate
            .set_dictionary(&dictionary())
            .map_err(|e| CodecError::Zlib(e.to_string()))?;
        Ok(Self { deflate })
    }

    /// Appends `frame` to `out`. A data frame's payload must fit [`MAX_PAYLOAD`].
    pub(crate) fn encode(&mut self, frame: &Frame, out: &mut BytesMut) -> Result<(), CodecError> {
        match frame {
            Frame::Data { stream, fin, data } => {
                out.put_u32(stream & 0x7fff_ffff);
                put_flags_len(out, *fin, data.len());
                out.put_slice(data);
            }
            Frame::SynStream {
                stream,
                fin,
                headers,
            } => {
                let block = self.header_block(headers)?;
                control(out, kind::SYN_STREAM, *fin, 10 + block.len());
                out.put_u32(stream & 0x7fff_ffff);
                out.put_u32(0);
                out.put_u16(0);
                out.put_slice(&block);
            }
            Frame::SynReply {
                stream,
                fin,
                headers,
            } => {
                let block = self.header_block(headers)?;
                control(out, kind::SYN_REPLY, *fin, 4 + block.len());
                out.put_u32(stream & 0x7fff_ffff);
                out.put_slice(&block);
            }
            Frame::Headers {
                stream,
                fin,
                headers,
            } => {
                let block = self.header_block(headers)?;
                control(out, kind::HEADERS, *fin, 4 + block.len());
                out.put_u32(stream & 0x7fff_ffff);
                out.put_slice(&block);
            }
            Frame::RstStream { stream, status } => {
                control(out, kind::RST_STREAM, false, 8);
                out.put_u32(stream & 0x7fff_ffff);
                out.put_u32(*status);
            }
            Frame::Ping { id } => {
                control(out, kind::PING, false, 4);
                out.put_u32(*id);
            }
            Frame::GoAway {
                last_stream,
                status,
            } => {
                control(out, kind::GOAWAY, false, 8);
                out.put_u32(last_stream & 0x7fff_ffff);
                out.put_u32(*status);
            }
            Frame::Ignored { kind: k } if *k == kind::SETTINGS || *k == kind::WINDOW_UPDATE => {}
            Frame::Ignored { .. } => {}
        }
        Ok(())
    }

    fn header_block(&mut self, headers: &Headers) -> Result<Vec<u8>, CodecError> {
        let mut plain = BytesMut::new();
        plain.put_u32(u32::try_from(headers.len()).unwrap_or(u32::MAX));
        for (name, value) in headers {
            for text in [name.to_ascii_lowercase().as_str(), value.as_str()] {
                plain.put_u32(u32::try_from(text.len()).unwrap_or(u32::MAX));
                plain.put_slice(text.as_bytes());
            }
        }
        let mut compressed = Vec::with_capacity(plain.len() + 64);
        let mut input: &[u8] = &plain;
        loop {
            if compressed.len() == compressed.capacity() {
                compressed.reserve(256);
            }
            let before = self.deflate.total_in();
            self.deflate
                .compress_vec(input, &mut compressed, FlushCompress::Sync)
                .map_err(|e| CodecError::Zlib(e.to_string()))?;
            let consumed = usize::try_from(self.deflate.total_in() - before).unwrap_or(0);
            input = &input[consumed.min(input.len())..];
            // Done once the input is consumed and the sync flush fit in the buffer.
            if input.is_empty() && compressed.len() < compressed.capacity() {
                return Ok(compressed);
            }
        }
    }
}

fn put_flags_len(out: &mut BytesMut, fin: bool, len: usize) {
    out.put_u8(if fin { FLAG_FIN } else { 0 });
    let len = u32::try_from(len.min(MAX_PAYLOAD)).unwrap_or(0);
    out.put_slice(&len.to_be_bytes()[1..]);
}

fn control(out: &mut BytesMut, kind: u16, fin: bool, len: usize) {
    out.put_u16(0x8000 | VERSION);
    out.put_u16(kind);
    put_flags_len(out, fin, len);
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn the_dictionary_is_spdy_3s() {
        let bytes = dictionary();
        assert_eq!(bytes.len(), 1423);
        // zlib's dictionary id (Adler-32) of SPDY/3's dictionary, as peers put it in their
        // stream header.
        let (mut a, mut b) = (1u32, 0u32);
        for byte in &bytes {
            a = (a + u32::from(*byte)) % 65521;
            b = (b + a) % 65521;
        }
        assert_eq!((b << 16) | a, 0xe3c6_a7c2);
    }

    #[test]
    fn frames_round_trip_through_one_compression_stream_each_way() {
        let mut encoder = Encoder::new().unwrap();
        let mut decoder = Decoder::default();
        let frames = vec![
            Frame::SynStream {
                stream: 1,
                fin: false,
                headers: vec![
                    ("streamtype".into(), "error".into()),
                    ("port".into(), "8888".into()),
                    ("requestid".into(), "0".into()),
                ],
            },
            Frame::SynStream {
                stream: 3,
                fin: false,
                headers: vec![
                    ("streamtype".into(), "data".into()),
                    ("port".into(), "8888".into()),
                    ("requestid".into(), "0".into()),
                ],
            },
            Frame::SynReply {
                stream: 3,
                fin: false,
                headers: vec![],
            },
            Frame::Data {
                stream: 3,
                fin: false,
                data: Bytes::from_static(b"GET / HTTP/1.1\r\n\r\n"),
            },
            Frame::Data {
                stream: 3,
                fin: true,
                data: Bytes::new(),
            },
            Frame::Ping { id: 7 },
            Frame::RstStream {
                stream: 1,
                status: status::REFUSED_STREAM,
            },
            Frame::GoAway {
                last_stream: 3,
                status: 0,
            },
        ];
        let mut wire = BytesMut::new();
        for frame in &frames {
            encoder.encode(frame, &mut wire).unwrap();
        }
        // Delivered a byte at a time: frames come out whole, in order.
        let mut decoded = Vec::new();
        for byte in wire {
            decoder.buffer().put_u8(byte);
            while let Some(frame) = decoder.next().unwrap() {
                decoded.push(frame);
            }
        }
        assert_eq!(decoded, frames);
    }

    #[test]
    fn malformed_input_is_an_error_not_a_panic() {
        let mut decoder = Decoder::default();
        // Version 2 control frame.
        decoder
            .buffer()
            .put_slice(&[0x80, 0x02, 0x00, 0x01, 0, 0, 0, 0]);
        assert!(matches!(decoder.next(), Err(CodecError::Version(2))));
        // A SYN_STREAM too short for its fixed fields.
        let mut decoder = Decoder::default();
        decoder
            .buffer()
            .put_slice(&[0x80, 0x03, 0x00, 0x01, 0, 0, 0, 2, 0, 1]);
        assert!(matches!(decoder.next(), Err(CodecError::Short { .. })));
        // A header block that is not zlib.
        let mut decoder = Decoder::default();
        decoder
            .buffer()
            .put_slice(&[0x80, 0x03, 0x00, 0x02, 0, 0, 0, 8, 0, 0, 0, 1, 1, 2, 3, 4]);
        assert!(matches!(decoder.next(), Err(CodecError::Zlib(_))));
    }

    #[test]
    fn header_blocks_that_lie_about_lengths_are_refused() {
        let mut block = BytesMut::new();
        block.put_u32(1);
        block.put_u32(100);
        block.put_slice(b"short");
        assert!(matches!(
            parse_header_block(&block),
            Err(CodecError::HeaderBlock(_))
        ));
    }
}
