//! Running commands: spawning ([`spawn`]), the process-group registry ([`groups`]) and the
//! driver that reads a child's output to the end.
//!
//! The driver ([`drive`]) is one future per command, in the style of codex-rs: it reads stdout
//! and stderr in chunks, caps what it keeps, feeds standard input, and kills the **whole
//! process group** on timeout, on cancellation (client gone, `DELETE`, shutdown) or when the
//! consumer of its output goes away. After the leader exits (or is killed) it keeps draining
//! output for at most the drain timeout, then kills whatever still holds the pipes, so a
//! backgrounded grandchild can neither wedge a request nor survive it holding its output. It
//! returns a typed [`Outcome`]. Where the output goes is a [`Sink`]: a buffer for `/execute`, a
//! channel of NDJSON events for `/v1/exec`, the bounded log of a background process.

pub(crate) mod groups;
pub(crate) mod launch;
pub(crate) mod spawn;

use std::future::Future;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use agent_sandbox_api::runtime::v1::{ExecEvent, ExitInfo, StreamKind};
use tokio::io::AsyncWriteExt;
use tokio::net::unix::pipe;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::output::{Utf8Carry, chunk_event};
pub(crate) use spawn::{CommandSpec, Spawned};

/// Size of one read from a pipe.
const READ_CHUNK: usize = 32 * 1024;

/// Bounds of one command.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Kill the group after this long; `None` for no timeout (background processes).
    pub(crate) timeout: Option<Duration>,
    /// Bytes kept of each of stdout and stderr; the rest is read and discarded.
    pub(crate) max_output_bytes: u64,
    /// How long to keep reading after the leader exited or was killed.
    pub(crate) drain: Duration,
}

/// How a command ended.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Outcome {
    /// The leader's status; `None` only if it could not be reaped within the drain timeout.
    pub(crate) status: Option<ExitStatus>,
    /// The timeout killed the group.
    pub(crate) timed_out: bool,
    /// Cancellation (client gone, delete, shutdown) killed the group.
    pub(crate) cancelled: bool,
    pub(crate) stdout_truncated: bool,
    pub(crate) stderr_truncated: bool,
    pub(crate) duration: Duration,
}

impl Outcome {
    /// The `/v1` exit record.
    pub(crate) fn exit_info(&self) -> ExitInfo {
        let killed = self.timed_out || self.cancelled;
        ExitInfo {
            exit_code: self.status.and_then(|s| s.code()),
            signal: self
                .status
                .and_then(|s| s.signal())
                .or(if killed && self.status.is_none() {
                    Some(libc::SIGKILL)
                } else {
                    None
                }),
            timed_out: self.timed_out,
            stdout_truncated: self.stdout_truncated,
            stderr_truncated: self.stderr_truncated,
            duration_ms: u64::try_from(self.duration.as_millis()).unwrap_or(u64::MAX),
        }
    }

    /// The legacy `exit_code`: 124 after a timeout, the exit code, or minus the signal number
    /// (Python's `returncode`).
    pub(crate) fn legacy_exit_code(&self) -> i32 {
        if self.timed_out {
            return 124;
        }
        match self.status {
            Some(status) => status
                .code()
                .or_else(|| status.signal().map(|s| -s))
                .unwrap_or(1),
            None => -libc::SIGKILL,
        }
    }
}

/// The consumer went away; the command is killed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Gone;

/// Where a command's output goes.
pub(crate) trait Sink: Send {
    /// Takes a chunk of `kind`; waits when the consumer is slow (which in turn blocks the child
    /// on its pipe). `Err(Gone)` when the consumer has gone.
    fn output(
        &mut self,
        kind: StreamKind,
        bytes: &[u8],
    ) -> impl Future<Output = Result<(), Gone>> + Send;
    /// The end of `kind`.
    fn eof(&mut self, kind: StreamKind) -> impl Future<Output = Result<(), Gone>> + Send;
    /// Resolves when the consumer has gone away (never, for buffers).
    fn gone(&self) -> impl Future<Output = ()> + Send + 'static;
}

/// Keeps everything (within the driver's cap) in memory: the sync `/execute`. Each buffer grows
/// by doubling but never beyond the cap, so it holds at most `cap` bytes of capacity.
#[derive(Debug)]
pub(crate) struct Capture {
    pub(crate) stdout: Vec<u8>,
    pub(crate) stderr: Vec<u8>,
    cap: usize,
}

impl Capture {
    /// Buffers for at most `cap` bytes per stream (what [`Limits::max_output_bytes`] lets in).
    pub(crate) fn new(cap: u64) -> Self {
        Self {
            stdout: Vec::new(),
            stderr: Vec::new(),
            cap: usize::try_from(cap).unwrap_or(usize::MAX),
        }
    }
}

/// Appends `bytes`, doubling the capacity when full but never past `cap` (unless the bytes
/// themselves need it).
fn append_within(buffer: &mut Vec<u8>, bytes: &[u8], cap: usize) {
    let need = buffer.len().saturating_add(bytes.len());
    if need > buffer.capacity() {
        let target = buffer
            .capacity()
            .saturating_mul(2)
            .max(need)
            .min(cap.max(need));
        buffer.reserve_exact(target - buffer.len());
    }
    buffer.extend_from_slice(bytes);
}

impl Sink for Capture {
    async fn output(&mut self, kind: StreamKind, bytes: &[u8]) -> Result<(), Gone> {
        match kind {
            StreamKind::Stdout => append_within(&mut self.stdout, bytes, self.cap),
            StreamKind::Stderr => append_within(&mut self.stderr, bytes, self.cap),
        }
        Ok(())
    }

    async fn eof(&mut self, _: StreamKind) -> Result<(), Gone> {
        Ok(())
    }

    fn gone(&self) -> impl Future<Output = ()> + Send + 'static {
        std::future::pending()
    }
}

/// Sends output as [`ExecEvent`]s with offsets, cut at UTF-8 boundaries: `/v1/exec`.
#[derive(Debug)]
pub(crate) struct ChannelSink {
    events_tx: mpsc::Sender<ExecEvent>,
    offset: u64,
    carry: [Utf8Carry; 2],
}

impl ChannelSink {
    pub(crate) fn new(events_tx: mpsc::Sender<ExecEvent>) -> Self {
        Self {
            events_tx,
            offset: 0,
            carry: Default::default(),
        }
    }

    async fn send(&mut self, kind: StreamKind, bytes: Vec<u8>) -> Result<(), Gone> {
        if bytes.is_empty() {
            return Ok(());
        }
        let event = chunk_event(kind, self.offset, &bytes);
        self.offset += bytes.len() as u64;
        self.events_tx.send(event).await.map_err(|_| Gone)
    }
}

fn index(kind: StreamKind) -> usize {
    match kind {
        StreamKind::Stdout => 0,
        StreamKind::Stderr => 1,
    }
}

impl Sink for ChannelSink {
    async fn output(&mut self, kind: StreamKind, bytes: &[u8]) -> Result<(), Gone> {
        let ready = self.carry[index(kind)].push(bytes);
        self.send(kind, ready).await
    }

    async fn eof(&mut self, kind: StreamKind) -> Result<(), Gone> {
        let rest = self.carry[index(kind)].flush();
        self.send(kind, rest).await
    }

    fn gone(&self) -> impl Future<Output = ()> + Send + 'static {
        let events_tx = self.events_tx.clone();
        async move { events_tx.closed().await }
    }
}

/// Why the driver kills the group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kill {
    TimedOut,
    Cancelled,
}

/// Runs a spawned command to the end. `stdin` is written (then closed) concurrently with
/// reading output; `started` is when the command was spawned.
pub(crate) async fn drive<S: Sink>(
    spawned: Spawned,
    stdin: Option<Vec<u8>>,
    limits: Limits,
    sink: &mut S,
    cancel: &CancellationToken,
    started: Instant,
) -> Outcome {
    let Spawned {
        mut child,
        stdout,
        stderr,
        stdin: stdin_pipe,
        group,
        ..
    } = spawned;
    // One buffer for both pipes (a read waits for readiness, then takes what is there), its
    // memory taken at the first output: most commands print little or nothing.
    let mut buf: Vec<u8> = Vec::new();
    let mut open = [true, true];
    let mut kept = [0u64; 2];
    let mut truncated = [false, false];
    let mut status: Option<ExitStatus> = None;
    let mut killed: Option<Kill> = None;

    let deadline = limits.timeout.map(|t| started + t);
    let timeout = tokio::time::sleep_until(deadline.unwrap_or_else(far_future));
    tokio::pin!(timeout);
    let drain = tokio::time::sleep_until(far_future());
    tokio::pin!(drain);
    let mut drain_armed = false;
    let gone = sink.gone();
    tokio::pin!(gone);

    let mut feed = match (stdin, stdin_pipe) {
        (Some(bytes), Some(mut pipe)) => Some(Box::pin(async move {
            // A child that exits without reading gets EPIPE here; that is not our failure.
            let _ = pipe.write_all(&bytes).await;
        })),
        // An open pipe the caller did not take is closed here (dropped), as is a pipe with
        // nothing to write.
        _ => None,
    };

    loop {
        if status.is_some() && !open[0] && !open[1] {
            break;
        }
        let mut reason = None;
        tokio::select! {
            biased;
            () = cancel.cancelled(), if killed.is_none() => reason = Some(Kill::Cancelled),
            () = &mut gone, if killed.is_none() => reason = Some(Kill::Cancelled),
            () = &mut timeout, if killed.is_none() && deadline.is_some() => {
                reason = Some(Kill::TimedOut);
            }
            () = &mut drain, if drain_armed => {
                // Whatever still holds the pipes after the bound dies with the group.
                group.kill();
                open = [false, false];
                if status.is_none() {
                    break;
                }
            }
            ready = stdout.readable(), if open[0] => {
                if let Some(n) = read_ready(ready, &stdout, &mut buf) {
                    let delivery = deliver(
                        sink, StreamKind::Stdout, &buf, n, &mut kept[0], &mut truncated[0],
                        limits.max_output_bytes, killed.is_none().then_some(deadline).flatten(), cancel,
                    ).await;
                    buf.clear();
                    if n == 0 {
                        open[0] = false;
                    }
                    reason = delivery;
                }
            }
            ready = stderr.readable(), if open[1] => {
                if let Some(n) = read_ready(ready, &stderr, &mut buf) {
                    let delivery = deliver(
                        sink, StreamKind::Stderr, &buf, n, &mut kept[1], &mut truncated[1],
                        limits.max_output_bytes, killed.is_none().then_some(deadline).flatten(), cancel,
                    ).await;
                    buf.clear();
                    if n == 0 {
                        open[1] = false;
                    }
                    reason = delivery;
                }
            }
            exit = child.wait(), if status.is_none() => {
                status = exit.ok();
                if status.is_none() {
                    // Waiting failed (should not happen): stop waiting, reading is bounded below.
                    group.kill();
                    open = [false, false];
                }
                if !drain_armed {
                    drain.as_mut().reset(Instant::now() + limits.drain);
                    drain_armed = true;
                }
            }
            () = async { if let Some(f) = feed.as_mut() { f.await } }, if feed.is_some() => {
                feed = None;
            }
        }
        if let Some(why) = reason
            && killed.is_none()
        {
            killed = Some(why);
            group.kill();
            if !drain_armed {
                drain.as_mut().reset(Instant::now() + limits.drain);
                drain_armed = true;
            }
        }
    }
    drop(feed);
    if status.is_some() {
        group.finish();
    }
    // else: the guard kills the group on drop, and the `Child` kills the leader and reaps it in
    // the background.
    Outcome {
        status,
        timed_out: killed == Some(Kill::TimedOut),
        cancelled: killed == Some(Kill::Cancelled),
        stdout_truncated: truncated[0],
        stderr_truncated: truncated[1],
        duration: started.elapsed(),
    }
}

/// Reads what a pipe that was reported ready holds into `buf` (empty): `Some(0)` at its end (or
/// on an error, which ends it too), `None` when the readiness was spurious.
fn read_ready(ready: io::Result<()>, pipe: &pipe::Receiver, buf: &mut Vec<u8>) -> Option<usize> {
    if ready.is_err() {
        return Some(0);
    }
    buf.reserve(READ_CHUNK);
    match pipe.try_read_buf(buf) {
        Ok(n) => Some(n),
        Err(error) if error.kind() == io::ErrorKind::WouldBlock => None,
        Err(_) => Some(0),
    }
}

/// Hands `read` bytes (`n` of them; 0 means end of stream) to the sink within the cap, waiting
/// for a slow consumer no longer than the deadline. Returns why the command must be killed, if
/// it must.
#[allow(clippy::too_many_arguments)]
async fn deliver<S: Sink>(
    sink: &mut S,
    kind: StreamKind,
    read: &[u8],
    n: usize,
    kept: &mut u64,
    truncated: &mut bool,
    cap: u64,
    deadline: Option<Instant>,
    cancel: &CancellationToken,
) -> Option<Kill> {
    let delivery = if n == 0 {
        either_eof(sink, kind).await
    } else {
        let room = usize::try_from(cap.saturating_sub(*kept)).unwrap_or(usize::MAX);
        let take = n.min(room);
        if take < n {
            *truncated = true;
        }
        *kept += take as u64;
        if take == 0 {
            return None;
        }
        let send = sink.output(kind, &read[..take]);
        tokio::select! {
            result = send => result,
            () = tokio::time::sleep_until(deadline.unwrap_or_else(far_future)), if deadline.is_some() => {
                return Some(Kill::TimedOut);
            }
            () = cancel.cancelled() => return Some(Kill::Cancelled),
        }
    };
    delivery.err().map(|Gone| Kill::Cancelled)
}

async fn either_eof<S: Sink>(sink: &mut S, kind: StreamKind) -> Result<(), Gone> {
    sink.eof(kind).await
}

/// A deadline that never comes (about 30 years away).
fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(86_400 * 365 * 30)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use groups::Groups;

    fn spec(argv: &[&str]) -> CommandSpec {
        CommandSpec {
            argv: argv.iter().map(|s| (*s).to_owned()).collect(),
            cwd: std::env::temp_dir(),
            env: vec![("SANDBOX_TEST_VAR".into(), "value".into())],
            stdin_piped: false,
        }
    }

    fn limits() -> Limits {
        Limits {
            timeout: Some(Duration::from_secs(30)),
            max_output_bytes: 1 << 20,
            drain: Duration::from_millis(500),
        }
    }

    async fn run(spec: CommandSpec, stdin: Option<Vec<u8>>, limits: Limits) -> (Outcome, Capture) {
        let groups = Arc::new(Groups::default());
        let spawned = spawn::spawn(&spec, &groups, None).unwrap();
        let mut capture = Capture::new(limits.max_output_bytes);
        let outcome = drive(
            spawned,
            stdin,
            limits,
            &mut capture,
            &CancellationToken::new(),
            Instant::now(),
        )
        .await;
        (outcome, capture)
    }

    #[tokio::test]
    async fn captures_output_and_exit_code() {
        let (outcome, capture) = run(
            spec(&[
                "sh",
                "-c",
                "echo out; echo err >&2; echo $SANDBOX_TEST_VAR; exit 3",
            ]),
            None,
            limits(),
        )
        .await;
        assert_eq!(capture.stdout, b"out\nvalue\n");
        assert_eq!(capture.stderr, b"err\n");
        assert_eq!(outcome.legacy_exit_code(), 3);
        assert!(!outcome.timed_out);
    }

    #[tokio::test]
    async fn feeds_stdin() {
        let mut with_stdin = spec(&["cat"]);
        with_stdin.stdin_piped = true;
        let (outcome, capture) = run(with_stdin, Some(b"hello".to_vec()), limits()).await;
        assert_eq!(capture.stdout, b"hello");
        assert_eq!(outcome.legacy_exit_code(), 0);
    }

    #[tokio::test]
    async fn caps_output_and_says_so() {
        let mut small = limits();
        small.max_output_bytes = 10;
        let (outcome, capture) =
            run(spec(&["sh", "-c", "yes | head -c 100000"]), None, small).await;
        assert_eq!(capture.stdout.len(), 10);
        assert!(outcome.stdout_truncated);
        assert!(!outcome.stderr_truncated);
        assert_eq!(outcome.legacy_exit_code(), 0);
    }

    #[test]
    fn capture_buffers_grow_up_to_the_cap() {
        let mut buffer = Vec::new();
        for _ in 0..10 {
            append_within(&mut buffer, &[0; 3000], 10_000);
        }
        assert_eq!(buffer.len(), 30_000);
        let mut capped = Vec::new();
        for _ in 0..3 {
            append_within(&mut capped, &[0; 3000], 10_000);
        }
        assert_eq!((capped.len(), capped.capacity()), (9000, 10_000));
    }

    #[tokio::test]
    async fn timeout_kills_the_group() {
        let mut short = limits();
        short.timeout = Some(Duration::from_millis(200));
        let (outcome, _) = run(spec(&["sh", "-c", "sleep 1000 & sleep 1000"]), None, short).await;
        assert!(outcome.timed_out);
        assert_eq!(outcome.legacy_exit_code(), 124);
        assert_eq!(outcome.exit_info().signal, Some(libc::SIGKILL));
    }
}
