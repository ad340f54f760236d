//! SPDY/3.1 sessions, the server side, as far as Kubernetes' streaming protocols use it: the API
//! server (and `kubectl port-forward`, through it) opens streams with SYN_STREAM, sends DATA,
//! half-closes with FIN, resets with RST_STREAM and pings; we reply to every stream, relay its
//! data and answer pings. Flow control (SETTINGS, WINDOW_UPDATE) is read and ignored, as the
//! Go peers (moby/spdystream) neither enforce nor expect it.
//!
//! [`serve`] runs one session over an upgraded connection and hands every new [`Stream`] to the
//! caller through a channel; the `codec` module holds the frame format.

pub(crate) mod codec;

pub use codec::CodecError;

use std::collections::HashMap;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::sync::mpsc;
use tokio_util::task::AbortOnDropHandle;

use codec::{Decoder, Encoder, Frame, Headers};

/// Chunks of a stream's data queued towards its reader before the session stops reading
/// (back-pressure on the whole connection, as one TCP connection has).
const INBOUND_QUEUE: usize = 16;
/// Frames queued towards the connection before writers wait.
const OUTBOUND_QUEUE: usize = 64;
/// The largest data frame we send.
const MAX_DATA_FRAME: usize = 32 << 10;

/// Why a session ended early.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The peer sent something that is not SPDY/3.1.
    #[error("the peer broke the SPDY/3.1 framing: {0}")]
    Codec(#[from] CodecError),
    /// Reading or writing the connection failed.
    #[error("the SPDY connection failed: {0}")]
    Io(#[from] std::io::Error),
}

/// A stream the peer opened.
#[derive(Debug)]
pub struct Stream {
    /// Its id (odd: opened by the client).
    pub id: u32,
    /// The SYN_STREAM's headers, names in lower case.
    pub headers: Headers,
    /// The peer's data, in order; ends when the peer half-closes (FIN) or resets the stream.
    pub incoming: mpsc::Receiver<Bytes>,
    /// Our side of the stream.
    pub outgoing: StreamWriter,
}

impl Stream {
    /// The value of header `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Sends on one stream.
#[derive(Clone, Debug)]
pub struct StreamWriter {
    id: u32,
    frames: mpsc::Sender<Frame>,
}

/// The session is gone: nothing more can be sent.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the SPDY session is closed")]
pub struct Closed;

impl StreamWriter {
    /// Sends `data` (in frames of at most 32 KiB).
    pub async fn send(&self, data: Bytes) -> Result<(), Closed> {
        let mut data = data;
        while !data.is_empty() {
            let chunk = data.split_to(data.len().min(MAX_DATA_FRAME));
            self.frame(Frame::Data {
                stream: self.id,
                fin: false,
                data: chunk,
            })
            .await?;
        }
        Ok(())
    }

    /// Half-closes our side: the peer's reader sees the end.
    pub async fn finish(&self) -> Result<(), Closed> {
        self.frame(Frame::Data {
            stream: self.id,
            fin: true,
            data: Bytes::new(),
        })
        .await
    }

    /// Resets the stream (both directions end).
    pub async fn reset(&self) -> Result<(), Closed> {
        self.frame(Frame::RstStream {
            stream: self.id,
            status: codec::status::REFUSED_STREAM,
        })
        .await
    }

    async fn frame(&self, frame: Frame) -> Result<(), Closed> {
        self.frames.send(frame).await.map_err(|_| Closed)
    }
}

/// Serves one SPDY/3.1 session on `io` until the peer closes it or sends GOAWAY: every stream
/// the peer opens is accepted (SYN_REPLY) and sent to `streams`. Returns once reading has ended
/// and every [`StreamWriter`] is dropped (so what handlers still send is written first).
pub async fn serve<IO>(io: IO, streams: mpsc::Sender<Stream>) -> Result<(), SessionError>
where
    IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (mut reader, writer) = tokio::io::split(io);
    let (frames_tx, frames_rx) = mpsc::channel::<Frame>(OUTBOUND_QUEUE);
    let encoder = Encoder::new()?;
    // Aborted if this future is dropped; awaited otherwise.
    let write = AbortOnDropHandle::new(tokio::spawn(write_frames(writer, frames_rx, encoder)));
    let read = read_frames(&mut reader, &frames_tx, &streams).await;
    // Our own sender goes; the writer ends once every stream's writer is dropped too.
    drop(frames_tx);
    drop(streams);
    let written = write
        .await
        .unwrap_or_else(|join| Err(std::io::Error::other(join)));
    read?;
    written.map_err(SessionError::Io)
}

async fn read_frames<R>(
    reader: &mut R,
    frames: &mpsc::Sender<Frame>,
    streams: &mpsc::Sender<Stream>,
) -> Result<(), SessionError>
where
    R: AsyncRead + Unpin,
{
    let mut decoder = Decoder::default();
    let mut inbound: HashMap<u32, mpsc::Sender<Bytes>> = HashMap::new();
    loop {
        while let Some(frame) = decoder.next()? {
            match frame {
                Frame::SynStream {
                    stream,
                    fin,
                    headers,
                } => {
                    if inbound.contains_key(&stream) {
                        let _ = frames
                            .send(Frame::RstStream {
                                stream,
                                status: codec::status::PROTOCOL_ERROR,
                            })
                            .await;
                        continue;
                    }
                    let (tx, rx) = mpsc::channel(INBOUND_QUEUE);
                    if !fin {
                        inbound.insert(stream, tx);
                    }
                    if frames
                        .send(Frame::SynReply {
                            stream,
                            fin: false,
                            headers: Vec::new(),
                        })
                        .await
                        .is_err()
                    {
                        return Ok(());
                    }
                    let accepted = Stream {
                        id: stream,
                        headers,
                        incoming: rx,
                        outgoing: StreamWriter {
                            id: stream,
                            frames: frames.clone(),
                        },
                    };
                    if streams.send(accepted).await.is_err() {
                        return Ok(());
                    }
                }
                Frame::Data { stream, fin, data } => {
                    if let Some(tx) = inbound.get(&stream) {
                        // A reader that went away only loses its own data.
                        if !data.is_empty() && tx.send(data).await.is_err() {
                            inbound.remove(&stream);
                        }
                    }
                    if fin {
                        inbound.remove(&stream);
                    }
                }
                Frame::Headers { stream, fin, .. } => {
                    if fin {
                        inbound.remove(&stream);
                    }
                }
                Frame::RstStream { stream, .. } => {
                    inbound.remove(&stream);
                }
                Frame::Ping { id } => {
                    if frames.send(Frame::Ping { id }).await.is_err() {
                        return Ok(());
                    }
                }
                Frame::GoAway { .. } => return Ok(()),
                Frame::SynReply { .. } | Frame::Ignored { .. } => {}
            }
        }
        let buffer: &mut BytesMut = decoder.buffer();
        buffer.reserve(16 << 10);
        if reader.read_buf(buffer).await? == 0 {
            return Ok(());
        }
    }
}

async fn write_frames<W>(
    mut writer: W,
    mut frames: mpsc::Receiver<Frame>,
    mut encoder: Encoder,
) -> std::io::Result<()>
where
    W: AsyncWrite + Unpin,
{
    let mut out = BytesMut::new();
    while let Some(frame) = frames.recv().await {
        encoder
            .encode(&frame, &mut out)
            .map_err(std::io::Error::other)?;
        // Whatever else is queued goes in the same write.
        while let Ok(frame) = frames.try_recv() {
            encoder
                .encode(&frame, &mut out)
                .map_err(std::io::Error::other)?;
            if out.len() >= 256 << 10 {
                break;
            }
        }
        writer.write_all(&out).await?;
        writer.flush().await?;
        out.clear();
    }
    let _ = writer.shutdown().await;
    Ok(())
}
