//! Port-forward to a pod, in the two protocols a kubelet speaks for `pods/portforward`:
//!
//! - SPDY/3.1 (`X-Stream-Protocol-Version: portforward.k8s.io`), what the API server speaks to
//!   a kubelet for `kubectl port-forward`: per forwarded connection the client opens an `error`
//!   stream and a `data` stream with the same `port` and `requestID` headers; the data stream is
//!   relayed to that port of the pod's IP, and a failure to connect is written to the error
//!   stream. Both streams are closed when the connection ends ([`serve_spdy`]).
//! - WebSocket with the `v4.channel.k8s.io` subprotocol, which kube-rs speaks and the API server
//!   passes through: for the i-th requested port (`?ports=`), channel 2i carries data and 2i+1
//!   errors; each channel's first frame is the port number, little endian
//!   ([`serve_websocket`]).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

use bytes::{Bytes, BytesMut};
use futures::{SinkExt as _, StreamExt as _};
use http::HeaderMap;
use http::header as http_header;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;

use crate::spdy::{self, SessionError, Stream};

/// The `X-Stream-Protocol-Version` of port-forward over SPDY.
pub const SPDY_PROTOCOL: &str = "portforward.k8s.io";

/// The WebSocket subprotocol of port-forward.
pub const WEBSOCKET_PROTOCOL: &str = "v4.channel.k8s.io";

/// Parses `ports=8888,9000` (repeated or comma-separated).
pub fn parse_ports(raw: &str) -> Result<Vec<u16>, String> {
    raw.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            p.trim()
                .parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| format!("invalid port {p:?}"))
        })
        .collect()
}

/// The `Sec-WebSocket-Accept` answer to a request asking for a WebSocket upgrade with
/// [`WEBSOCKET_PROTOCOL`], or `None` when it does not ask for one.
pub fn websocket_accept(headers: &HeaderMap) -> Option<String> {
    let is_websocket = headers
        .get(http_header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    let offers_protocol = headers
        .get_all(http_header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.split(',').any(|p| p.trim() == WEBSOCKET_PROTOCOL));
    let key = headers.get(http_header::SEC_WEBSOCKET_KEY)?;
    (is_websocket && offers_protocol).then(|| derive_accept_key(key.as_bytes()))
}

/// Header names of a port-forward stream (lower case, as SPDY carries them).
mod header {
    pub(super) const STREAM_TYPE: &str = "streamtype";
    pub(super) const PORT: &str = "port";
    pub(super) const REQUEST_ID: &str = "requestid";
}

/// The two streams of one forwarded connection, as they arrive.
#[derive(Debug, Default)]
struct Pair {
    data: Option<Stream>,
    error: Option<Stream>,
}

/// Which request a stream belongs to: its `requestID` header, or, for clients that send none,
/// the error stream's id (the client opens the error stream first, the data stream next, and
/// ids of one side go up by two).
fn request_id(stream: &Stream, is_data: bool) -> String {
    match stream.header(header::REQUEST_ID) {
        Some(id) if !id.is_empty() => id.to_owned(),
        _ if is_data => stream.id.saturating_sub(2).to_string(),
        _ => stream.id.to_string(),
    }
}

/// A connection to `addr` (a pod's), with a socket from `sockets` when the pods' network is
/// not this process's ([`crate::Kubelet::pod_sockets`]).
pub async fn connect(
    sockets: Option<&crate::PodSockets>,
    addr: SocketAddr,
) -> std::io::Result<TcpStream> {
    match sockets {
        Some(make) => make(addr.ip())?.connect(addr).await,
        None => TcpStream::connect(addr).await,
    }
}

/// Serves port-forward streams on an upgraded connection until the client closes it,
/// connecting to the pod with sockets from `sockets` when given (see [`connect`]).
pub async fn serve_spdy<IO>(
    io: IO,
    pod_ip: IpAddr,
    sockets: Option<crate::PodSockets>,
) -> Result<(), SessionError>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let (streams_tx, mut streams_rx) = mpsc::channel::<Stream>(8);
    let session = spdy::serve(io, streams_tx);
    tokio::pin!(session);
    let mut pending: HashMap<String, Pair> = HashMap::new();
    let mut forwards = JoinSet::new();
    let outcome = loop {
        tokio::select! {
            outcome = &mut session => break outcome,
            Some(stream) = streams_rx.recv() => {
                let kind = stream.header(header::STREAM_TYPE).unwrap_or_default().to_owned();
                let is_data = match kind.as_str() {
                    "data" => true,
                    "error" => false,
                    _ => {
                        // Neither kind we know: refuse it alone.
                        let _ = stream.outgoing.reset().await;
                        continue;
                    }
                };
                let id = request_id(&stream, is_data);
                let pair = pending.entry(id.clone()).or_default();
                if is_data {
                    pair.data = Some(stream);
                } else {
                    pair.error = Some(stream);
                }
                if pair.data.is_some()
                    && pair.error.is_some()
                    && let Some(Pair { data: Some(data), error: Some(error) }) = pending.remove(&id)
                {
                    forwards.spawn(forward(data, error, pod_ip, sockets.clone()));
                }
            }
            Some(_) = forwards.join_next(), if !forwards.is_empty() => {}
        }
    };
    // The session ended: the relays see their streams end and finish.
    while forwards.join_next().await.is_some() {}
    outcome
}

/// Relays one data stream to `pod_ip:port`; a failure goes to the error stream.
async fn forward(
    mut data: Stream,
    error: Stream,
    pod_ip: IpAddr,
    sockets: Option<crate::PodSockets>,
) {
    let port = data
        .header(header::PORT)
        .and_then(|p| p.parse::<u16>().ok())
        .filter(|p| *p > 0);
    let Some(port) = port else {
        let message = format!(
            "invalid port {:?}: a port-forward stream needs a port from 1 to 65535",
            data.header(header::PORT).unwrap_or_default()
        );
        let _ = error.outgoing.send(message.into_bytes().into()).await;
        let _ = error.outgoing.finish().await;
        let _ = data.outgoing.finish().await;
        return;
    };
    let target = SocketAddr::new(pod_ip, port);
    let connection = match connect(sockets.as_ref(), target).await {
        Ok(connection) => connection,
        Err(cause) => {
            let message = format!(
                "error forwarding port {port} to pod at {pod_ip}: failed to connect to {target}: {cause}"
            );
            let _ = error.outgoing.send(message.into_bytes().into()).await;
            let _ = error.outgoing.finish().await;
            let _ = data.outgoing.finish().await;
            return;
        }
    };
    let _ = connection.set_nodelay(true);
    let (mut from_pod, mut to_pod) = connection.into_split();
    let upstream = async {
        while let Some(chunk) = data.incoming.recv().await {
            if to_pod.write_all(&chunk).await.is_err() {
                break;
            }
        }
        let _ = to_pod.shutdown().await;
    };
    let writer = data.outgoing.clone();
    let downstream = async move {
        let mut buffer = BytesMut::with_capacity(32 << 10);
        loop {
            buffer.reserve(32 << 10);
            match from_pod.read_buf(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if writer.send(buffer.split().freeze()).await.is_err() {
                        return;
                    }
                }
            }
        }
        let _ = writer.finish().await;
    };
    tokio::join!(upstream, downstream);
    let _ = error.outgoing.finish().await;
}

fn frame(channel: u8, payload: &[u8]) -> Message {
    let mut bytes = Vec::with_capacity(payload.len() + 1);
    bytes.push(channel);
    bytes.extend_from_slice(payload);
    Message::Binary(Bytes::from(bytes))
}

/// Relays an upgraded WebSocket connection speaking [`WEBSOCKET_PROTOCOL`] to `ports` of a
/// pod, each reached through `connect`, until the client closes it or the pod has closed every
/// connection.
pub async fn serve_websocket<S, C, F>(socket: WebSocketStream<S>, ports: &[u16], connect: C)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    C: Fn(u16) -> F,
    F: std::future::Future<Output = crate::Result<TcpStream>>,
{
    let (mut sink, mut stream) = socket.split();
    let (from_pods, mut from_pods_rx) = mpsc::channel::<(u8, Option<Bytes>)>(64);
    let mut readers = JoinSet::new();
    let mut writers = Vec::new();
    let mut open = 0usize;
    for (index, port) in ports.iter().enumerate() {
        let Ok(data) = u8::try_from(index * 2) else {
            break;
        };
        let error = data + 1;
        let port_bytes = port.to_le_bytes();
        if sink.send(frame(data, &port_bytes)).await.is_err()
            || sink.send(frame(error, &port_bytes)).await.is_err()
        {
            return;
        }
        match connect(*port).await {
            Ok(tcp) => {
                let (mut read, write) = tcp.into_split();
                writers.push(Some(write));
                open += 1;
                let tx = from_pods.clone();
                readers.spawn(async move {
                    let mut buffer = vec![0u8; 64 * 1024];
                    loop {
                        match read.read(&mut buffer).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                if tx
                                    .send((data, Some(Bytes::copy_from_slice(&buffer[..n]))))
                                    .await
                                    .is_err()
                                {
                                    return;
                                }
                            }
                        }
                    }
                    let _ = tx.send((data, None)).await;
                });
            }
            Err(error) => {
                writers.push(None);
                let message = match std::error::Error::source(&error) {
                    Some(cause) => format!("{error}: {cause}"),
                    None => error.to_string(),
                };
                let _ = sink
                    .send(frame(error_channel(data), message.as_bytes()))
                    .await;
            }
        }
    }
    if open == 0 {
        let _ = sink.send(Message::Close(None)).await;
        return;
    }
    loop {
        tokio::select! {
            message = stream.next() => match message {
                Some(Ok(Message::Binary(bytes))) if !bytes.is_empty() => {
                    let channel = usize::from(bytes[0]);
                    if channel % 2 == 0
                        && let Some(Some(writer)) = writers.get_mut(channel / 2)
                        && writer.write_all(&bytes[1..]).await.is_err()
                    {
                        writers[channel / 2] = None;
                    }
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            },
            Some((channel, data)) = from_pods_rx.recv() => match data {
                Some(bytes) => {
                    if sink.send(frame(channel, &bytes)).await.is_err() {
                        break;
                    }
                }
                None => {
                    open -= 1;
                    if open == 0 {
                        // Like the kubelet: when every forwarded connection is closed by the pod,
                        // the stream ends.
                        break;
                    }
                }
            },
        }
    }
    readers.abort_all();
    // Completes the closing handshake (flushes the reply to a client's Close frame).
    let _ = sink.close().await;
}

fn error_channel(data: u8) -> u8 {
    data + 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spdy::codec::{Decoder, Encoder, Frame};
    use bytes::Bytes;
    use pretty_assertions::assert_eq;
    use std::time::Duration;
    use tokio::io::DuplexStream;

    /// The client's half of a session: writes frames, reads them back.
    struct Client {
        io: DuplexStream,
        encoder: Encoder,
        decoder: Decoder,
    }

    impl Client {
        async fn send(&mut self, frame: Frame) {
            let mut out = BytesMut::new();
            self.encoder.encode(&frame, &mut out).unwrap();
            self.io.write_all(&out).await.unwrap();
        }

        async fn next(&mut self) -> Option<Frame> {
            loop {
                if let Some(frame) = self.decoder.next().unwrap() {
                    return Some(frame);
                }
                let buffer = self.decoder.buffer();
                buffer.reserve(4096);
                let read = tokio::time::timeout(Duration::from_secs(10), self.io.read_buf(buffer))
                    .await
                    .expect("the server answers within 10 s")
                    .unwrap();
                if read == 0 {
                    return None;
                }
            }
        }

        fn open(stream: u32, kind: &str, port: u16) -> Frame {
            Frame::SynStream {
                stream,
                fin: false,
                headers: vec![
                    ("streamType".into(), kind.into()),
                    ("port".into(), port.to_string()),
                    ("requestID".into(), "0".into()),
                ],
            }
        }
    }

    fn start(pod_ip: IpAddr) -> (Client, tokio::task::JoinHandle<Result<(), SessionError>>) {
        let (client, server) = tokio::io::duplex(64 << 10);
        let session = tokio::spawn(serve_spdy(server, pod_ip, None));
        let client = Client {
            io: client,
            encoder: Encoder::new().unwrap(),
            decoder: Decoder::default(),
        };
        (client, session)
    }

    #[tokio::test]
    async fn a_data_stream_is_relayed_to_the_pod_port_both_ways() {
        let pod = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = pod.local_addr().unwrap().port();
        let echo = tokio::spawn(async move {
            let (mut socket, _) = pod.accept().await.unwrap();
            let mut buffer = vec![0u8; 5];
            socket.read_exact(&mut buffer).await.unwrap();
            socket.write_all(b"echo:").await.unwrap();
            socket.write_all(&buffer).await.unwrap();
        });
        let (mut client, session) = start("127.0.0.1".parse().unwrap());
        client.send(Client::open(1, "error", port)).await;
        client.send(Client::open(3, "data", port)).await;
        client
            .send(Frame::Data {
                stream: 3,
                fin: false,
                data: Bytes::from_static(b"hello"),
            })
            .await;
        client.send(Frame::Ping { id: 9 }).await;
        let mut replies = Vec::new();
        let mut received = Vec::new();
        let mut finished = Vec::new();
        while finished.len() < 2 {
            match client.next().await.expect("the session stays open") {
                Frame::SynReply { stream, .. } => replies.push(stream),
                Frame::Data { stream, fin, data } => {
                    if stream == 3 {
                        received.extend_from_slice(&data);
                    }
                    if fin {
                        finished.push(stream);
                    }
                    if stream == 3 && fin {
                        // The pod closed its side; so does the client.
                        client
                            .send(Frame::Data {
                                stream: 3,
                                fin: true,
                                data: Bytes::new(),
                            })
                            .await;
                    }
                }
                Frame::Ping { id } => assert_eq!(id, 9),
                other => panic!("unexpected frame {other:?}"),
            }
        }
        replies.sort_unstable();
        finished.sort_unstable();
        assert_eq!(replies, vec![1, 3]);
        assert_eq!(received, b"echo:hello");
        assert_eq!(finished, vec![1, 3]);
        echo.await.unwrap();
        drop(client);
        session.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn a_port_nobody_listens_on_is_reported_on_the_error_stream() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = closed.local_addr().unwrap().port();
        drop(closed);
        let (mut client, session) = start("127.0.0.1".parse().unwrap());
        client.send(Client::open(1, "error", port)).await;
        client.send(Client::open(3, "data", port)).await;
        let mut error = Vec::new();
        let mut finished = Vec::new();
        while finished.len() < 2 {
            match client.next().await.expect("the session stays open") {
                Frame::Data { stream, fin, data } => {
                    if stream == 1 {
                        error.extend_from_slice(&data);
                    }
                    if fin {
                        finished.push(stream);
                    }
                }
                Frame::SynReply { .. } => {}
                other => panic!("unexpected frame {other:?}"),
            }
        }
        let error = String::from_utf8(error).unwrap();
        assert!(
            error.contains(&format!("error forwarding port {port}")),
            "{error}"
        );
        drop(client);
        session.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn garbage_ends_the_session_with_an_error() {
        let (mut client, session) = start("127.0.0.1".parse().unwrap());
        client
            .io
            .write_all(&[0x80, 0x02, 0, 1, 0, 0, 0, 0])
            .await
            .unwrap();
        let outcome = session.await.unwrap();
        assert!(
            matches!(outcome, Err(SessionError::Codec(_))),
            "{outcome:?}"
        );
    }

    #[test]
    fn ports_parse() {
        assert_eq!(parse_ports("8888,9000"), Ok(vec![8888, 9000]));
        assert!(parse_ports("0").is_err());
        assert!(parse_ports("http").is_err());
        assert_eq!(parse_ports(""), Ok(vec![]));
    }
}
