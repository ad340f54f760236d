//! Streamed answers: NDJSON exec events ([`ExecStream`]), background-process output that
//! reconnects ([`OutputFollower`]) and file downloads ([`Download`]).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use agent_sandbox_api::runtime::v1::{ExecEvent, ExitInfo};
use bytes::{Buf as _, Bytes, BytesMut};
use futures_util::{Stream, StreamExt as _, TryStreamExt as _};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use tokio::io::{AsyncRead, ReadBuf};
use tokio_util::io::StreamReader;

use crate::error::{Error, Result};

/// Longest NDJSON line accepted (a chunk is at most 32 KiB of output, base64 or escaped).
const MAX_LINE: usize = 1024 * 1024;

type EventStream = Pin<Box<dyn Stream<Item = Result<ExecEvent>> + Send>>;

/// The events of a streamed command (`start`, `stdout`/`stderr` chunks, `exit`), as they are
/// produced. Also a [`Stream`] of `Result<ExecEvent>`.
pub struct ExecStream {
    events: EventStream,
    /// What [`ExecStream::collect_output`] keeps at most, with the names for its error.
    collect_limit: (u64, String, String),
}

impl std::fmt::Debug for ExecStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecStream").finish_non_exhaustive()
    }
}

/// Everything a finished command produced, from [`ExecStream::collect_output`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExecOutput {
    /// Standard output bytes.
    pub stdout: Vec<u8>,
    /// Standard error bytes.
    pub stderr: Vec<u8>,
    /// How it ended (`None` when the stream ended without an `exit` event).
    pub exit: Option<ExitInfo>,
}

impl ExecOutput {
    /// The exit code, when the process exited by itself.
    pub fn exit_code(&self) -> Option<i32> {
        self.exit.as_ref().and_then(|e| e.exit_code)
    }
}

struct LineState {
    body: Incoming,
    buffer: BytesMut,
    done: bool,
    operation: String,
    sandbox: String,
    expired: bool,
}

impl ExecStream {
    pub(crate) fn new(
        body: Incoming,
        operation: String,
        sandbox: String,
        deadline: Option<Duration>,
    ) -> Self {
        let (operation_name, sandbox_name) = (operation.clone(), sandbox.clone());
        let state = LineState {
            body,
            buffer: BytesMut::new(),
            done: false,
            operation,
            sandbox,
            expired: false,
        };
        let deadline = deadline.map(|after| (Box::pin(tokio::time::sleep(after)), after));
        let events = futures_util::stream::unfold(
            (state, deadline),
            |(mut state, mut deadline)| async move {
                let item = match deadline.as_mut() {
                    None => next_line(&mut state).await?,
                    Some((sleep, after)) => {
                        tokio::select! {
                            item = next_line(&mut state) => item?,
                            () = sleep.as_mut() => {
                                // Past the deadline: end with a timeout error, then stop.
                                state.done = true;
                                state.buffer.clear();
                                let error = Error::Timeout {
                                    operation: state.operation.clone(),
                                    sandbox: state.sandbox.clone(),
                                    after: *after,
                                };
                                deadline = None;
                                state.expired = true;
                                Err(error)
                            }
                        }
                    }
                };
                Some((item, (state, deadline)))
            },
        );
        let events: EventStream = Box::pin(events);
        Self {
            events,
            collect_limit: (u64::MAX, operation_name, sandbox_name),
        }
    }

    /// Caps what [`ExecStream::collect_output`] buffers (stdout and stderr together).
    pub(crate) fn collecting_at_most(mut self, limit: u64) -> Self {
        self.collect_limit.0 = limit;
        self
    }

    /// The next event; `None` at the end of the stream.
    pub async fn next_event(&mut self) -> Option<Result<ExecEvent>> {
        self.events.next().await
    }

    /// Reads the stream to its end and returns the output and exit. At most
    /// `ClientOptions::max_response_bytes` of output is kept: a sandbox that sends more is
    /// [`Error::ResponseTooLarge`] (read the events one by one to handle more).
    pub async fn collect_output(mut self) -> Result<ExecOutput> {
        let mut output = ExecOutput::default();
        let (limit, operation, sandbox) = std::mem::take(&mut self.collect_limit);
        while let Some(event) = self.next_event().await {
            match event? {
                ExecEvent::Stdout(chunk) => output.stdout.extend(chunk.bytes().unwrap_or_default()),
                ExecEvent::Stderr(chunk) => output.stderr.extend(chunk.bytes().unwrap_or_default()),
                ExecEvent::Exit(exit) => output.exit = Some(exit),
                _ => {}
            }
            let kept = output.stdout.len().saturating_add(output.stderr.len());
            if u64::try_from(kept).unwrap_or(u64::MAX) > limit {
                return Err(Error::ResponseTooLarge {
                    operation,
                    sandbox,
                    limit,
                });
            }
        }
        Ok(output)
    }
}

impl Stream for ExecStream {
    type Item = Result<ExecEvent>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.events.as_mut().poll_next(cx)
    }
}

async fn next_line(state: &mut LineState) -> Option<Result<ExecEvent>> {
    if state.expired {
        return None;
    }
    loop {
        if let Some(at) = state.buffer.iter().position(|b| *b == b'\n') {
            let line = state.buffer.split_to(at + 1);
            let line = &line[..at];
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            return Some(serde_json::from_slice(line).map_err(|e| Error::Decode {
                operation: state.operation.clone(),
                sandbox: state.sandbox.clone(),
                message: format!("bad event line: {e}"),
            }));
        }
        if state.done {
            if state.buffer.iter().all(u8::is_ascii_whitespace) {
                return None;
            }
            let rest = state.buffer.split();
            return Some(serde_json::from_slice(&rest).map_err(|e| Error::Decode {
                operation: state.operation.clone(),
                sandbox: state.sandbox.clone(),
                message: format!("bad last event line: {e}"),
            }));
        }
        if state.buffer.len() > MAX_LINE {
            state.done = true;
            state.buffer.clear();
            return Some(Err(Error::Decode {
                operation: state.operation.clone(),
                sandbox: state.sandbox.clone(),
                message: format!("an event line is longer than {MAX_LINE} bytes"),
            }));
        }
        match state.body.frame().await {
            None => state.done = true,
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    state.buffer.extend_from_slice(data.chunk());
                }
            }
            Some(Err(e)) => {
                state.done = true;
                state.buffer.clear();
                return Some(Err(Error::Transport {
                    operation: state.operation.clone(),
                    sandbox: state.sandbox.clone(),
                    message: format!("the stream broke: {e}"),
                    source: Some(Box::new(e)),
                }));
            }
        }
    }
}

/// Opens a process's output stream from an offset, following it (the sandbox's side of an
/// [`OutputFollower`]).
pub(crate) type Reopen =
    Box<dyn Fn(u64) -> futures_util::future::BoxFuture<'static, Result<ExecStream>> + Send + Sync>;

/// Follows a background process's output until it exits, reconnecting from the last byte
/// seen after a broken connection. From [`Sandbox::follow_output`](crate::Sandbox::follow_output).
pub struct OutputFollower {
    reopen: Reopen,
    sandbox: String,
    id: String,
    offset: u64,
    current: Option<ExecStream>,
    failures: u32,
    finished: bool,
}

/// Reconnections in a row before [`OutputFollower`] gives up.
const MAX_RECONNECTS: u32 = 5;

impl std::fmt::Debug for OutputFollower {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutputFollower")
            .field("sandbox", &self.sandbox)
            .field("id", &self.id)
            .field("offset", &self.offset)
            .field("failures", &self.failures)
            .field("finished", &self.finished)
            .finish_non_exhaustive()
    }
}

impl OutputFollower {
    /// Follows process `id` of `sandbox` from `offset`, opening each stream with `reopen`.
    pub(crate) fn new(sandbox: String, id: String, offset: u64, reopen: Reopen) -> Self {
        Self {
            reopen,
            sandbox,
            id,
            offset,
            current: None,
            failures: 0,
            finished: false,
        }
    }

    /// The offset after the last byte returned: where a later reader would resume.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The next event (chunks, `dropped`, then `exit`); `None` after `exit`.
    pub async fn next_event(&mut self) -> Option<Result<ExecEvent>> {
        loop {
            if self.finished {
                return None;
            }
            let stream = match self.current.as_mut() {
                Some(stream) => stream,
                None => match (self.reopen)(self.offset).await {
                    Ok(stream) => self.current.insert(stream),
                    Err(error) => {
                        if let Some(result) = self.failed(error).await {
                            return Some(result);
                        }
                        continue;
                    }
                },
            };
            match stream.next_event().await {
                Some(Ok(event)) => {
                    self.failures = 0;
                    match &event {
                        ExecEvent::Stdout(chunk) | ExecEvent::Stderr(chunk) => {
                            self.offset = chunk.end_offset();
                        }
                        ExecEvent::Dropped { offset, bytes } => self.offset = offset + bytes,
                        ExecEvent::Exit(_) | ExecEvent::Error(_) => self.finished = true,
                        ExecEvent::End { next_offset } => self.offset = *next_offset,
                        ExecEvent::Start { .. } => {}
                    }
                    return Some(Ok(event));
                }
                Some(Err(error)) => {
                    self.current = None;
                    if let Some(result) = self.failed(error).await {
                        return Some(result);
                    }
                }
                None => {
                    // Ended without `exit`: the connection closed early; resume.
                    self.current = None;
                    let error = Error::Transport {
                        operation: format!("follow output of process {}", self.id),
                        sandbox: self.sandbox.clone(),
                        message: "the stream ended before the process exited".to_owned(),
                        source: None,
                    };
                    if let Some(result) = self.failed(error).await {
                        return Some(result);
                    }
                }
            }
        }
    }

    /// Counts a failure: `None` to try again after a pause, `Some(Err)` to give up.
    async fn failed(&mut self, error: Error) -> Option<Result<ExecEvent>> {
        let retryable = matches!(
            error,
            Error::Transport { .. }
                | Error::RouterUnreachable { .. }
                | Error::Timeout { .. }
                | Error::RetriesExhausted { .. }
        ) || matches!(error.status(), Some(502..=504));
        self.failures += 1;
        if !retryable || self.failures > MAX_RECONNECTS {
            self.finished = true;
            return Some(Err(error));
        }
        tokio::time::sleep(Duration::from_millis(100 << self.failures.min(5))).await;
        None
    }
}

/// A file being downloaded: an [`AsyncRead`] over the streamed body.
pub struct Download {
    length: Option<u64>,
    reader: Pin<Box<dyn AsyncRead + Send>>,
}

impl std::fmt::Debug for Download {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Download")
            .field("length", &self.length)
            .finish_non_exhaustive()
    }
}

impl Download {
    pub(crate) fn new(response: http::Response<Incoming>) -> Self {
        let length = response
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        let stream = response
            .into_body()
            .into_data_stream()
            .map_err(io::Error::other)
            .map_ok(|b: Bytes| b);
        Self {
            length,
            reader: Box::pin(StreamReader::new(stream)),
        }
    }

    /// The file's size as the server claims it (`Content-Length`), when it sent one. A
    /// sandbox is untrusted: never size a buffer by it (the stream ends with an error when
    /// the body does not match it).
    pub fn content_length(&self) -> Option<u64> {
        self.length
    }
}

impl AsyncRead for Download {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.reader.as_mut().poll_read(cx, buf)
    }
}
