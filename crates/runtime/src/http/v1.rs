//! `/v1` exec and processes: `POST /v1/exec` streams NDJSON events of one command;
//! `/v1/processes` starts background commands and reads, feeds, signals and forgets them.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use agent_sandbox_api::runtime::v1::{
    ErrorCode, ExecEvent, ExecRequest, HealthResponse, OutputQuery, ProcessList, SignalName,
    SignalRequest, StdinQuery, StdinResponse,
};
use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State as Extract};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use rustix::process::Signal;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use super::exec::{Refusal, StartError, Started, prepare};
use super::{ApiError, Flavor, State, json, ndjson_line, ndjson_response, read_body};
use crate::exec::ChannelSink;
use crate::exec::groups::signal_group;
use crate::exec::spawn::spawn_failure_message;
use crate::output::chunk_event;
use crate::processes::{LogSink, Process};

type Result<T, E = ApiError> = std::result::Result<T, E>;

pub(crate) async fn health(Extract(state): Extract<State>) -> Response {
    let uptime_seconds = state.started.elapsed().as_secs();
    if state.shutdown.is_cancelled() {
        json(
            StatusCode::SERVICE_UNAVAILABLE,
            &HealthResponse {
                status: "shutting_down".into(),
                uptime_seconds,
            },
        )
    } else {
        json(
            StatusCode::OK,
            &HealthResponse {
                status: "ok".into(),
                uptime_seconds,
            },
        )
    }
}

/// Parses a signal by name (`TERM`, `SIGTERM`) or number.
pub(crate) fn parse_signal(name: &SignalName) -> Option<Signal> {
    match name {
        SignalName::Number(n) => Signal::from_named_raw(*n),
        SignalName::Name(text) => {
            let upper = text.trim().to_ascii_uppercase();
            let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
            Some(match bare {
                "HUP" => Signal::HUP,
                "INT" => Signal::INT,
                "QUIT" => Signal::QUIT,
                "KILL" => Signal::KILL,
                "USR1" => Signal::USR1,
                "USR2" => Signal::USR2,
                "TERM" => Signal::TERM,
                "CONT" => Signal::CONT,
                "STOP" => Signal::STOP,
                "TSTP" => Signal::TSTP,
                "ALRM" => Signal::ALARM,
                "WINCH" => Signal::WINCH,
                "PIPE" => Signal::PIPE,
                _ => return None,
            })
        }
    }
}

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::v1(ErrorCode::InvalidArgument, message)
}

async fn parse_request(state: &State, headers: &HeaderMap, body: Body) -> Result<ExecRequest> {
    let bytes = read_body(headers, body, state.config.max_body_bytes)
        .await
        .map_err(|e| e.into_api(Flavor::V1))?;
    serde_json::from_slice(&bytes).map_err(|e| invalid(format!("invalid request body: {e}")))
}

/// Checks and starts `request` through the shared pipeline, with `/v1`'s answers to refusals.
fn start_command(
    state: &State,
    request: ExecRequest,
    default_timeout: Option<Duration>,
) -> Result<Started> {
    let prepared =
        prepare(state, request, default_timeout, Flavor::V1).map_err(|refusal| match refusal {
            Refusal::NoCommand => invalid("give exactly one of `command` and a non-empty `argv`"),
            Refusal::Nul => invalid("the command contains a NUL byte"),
            Refusal::Timeout => invalid("timeout_seconds must be a finite number above 0"),
            Refusal::Api(error) => error,
        })?;
    super::exec::start(state, prepared).map_err(|error| match error {
        StartError::ShuttingDown => ApiError::shutting_down(Flavor::V1),
        StartError::Busy => ApiError::busy(Flavor::V1, state.config.max_processes),
        StartError::Spawn { error, program } => ApiError::v1(
            ErrorCode::SpawnFailed,
            format!(
                "failed to start the command: {}",
                spawn_failure_message(&error, &program)
            ),
        ),
    })
}

pub(crate) async fn exec(
    Extract(state): Extract<State>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    match exec_inner(state, headers, body).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

async fn exec_inner(state: State, headers: HeaderMap, body: Body) -> Result<Response> {
    let request = parse_request(&state, &headers, body).await?;
    if request.stdin_open == Some(true) {
        return Err(invalid(
            "stdin_open is for background processes (POST /v1/processes)",
        ));
    }
    let started = start_command(&state, request, Some(state.config.exec_timeout))?;
    let (events_tx, mut events_rx) = mpsc::channel(32);
    // The channel is new and has room: the start event always fits.
    let _ = events_tx.try_send(ExecEvent::Start {
        pid: started.spawned.pid,
    });
    let cancel = state.shutdown.child_token();
    state.tracker.spawn(async move {
        let mut sink = ChannelSink::new(events_tx.clone());
        let outcome = started.drive(&mut sink, &cancel).await;
        let _ = events_tx.send(ExecEvent::Exit(outcome.exit_info())).await;
    });
    let stream = futures_util::stream::poll_fn(move |cx| {
        events_rx
            .poll_recv(cx)
            .map(|event| event.map(|event| Ok::<_, Infallible>(ndjson_line(&event))))
    });
    Ok(ndjson_response(Body::from_stream(stream)))
}

pub(crate) async fn start(
    Extract(state): Extract<State>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    match start_inner(state, headers, body).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

async fn start_inner(state: State, headers: HeaderMap, body: Body) -> Result<Response> {
    let request = parse_request(&state, &headers, body).await?;
    let stdin_open = request.stdin_open == Some(true);
    let (command, argv) = (request.command.clone(), request.argv.clone());
    let mut started = start_command(&state, request, None)?;
    // With `stdin_open` the pipe is the process's, for later writes; the initial bytes are
    // written through it below instead of by the driver.
    let (kept_stdin, initial_stdin) = if stdin_open {
        (started.spawned.stdin.take(), started.stdin.take())
    } else {
        (None, None)
    };
    let process = Arc::new(Process::new(
        state.processes.next_id(),
        command,
        argv,
        started.spawned.pid,
        started.spawned.group.pgid(),
        state.config.process_buffer_bytes,
        kept_stdin,
        state.shutdown.child_token(),
    ));
    if let Some(initial) = initial_stdin {
        // Taken before any later write can queue for it, so the initial bytes come first.
        let mut pipe = Arc::clone(&process.stdin).lock_owned().await;
        state.tracker.spawn(async move {
            if let Some(pipe) = pipe.as_mut() {
                let _ = pipe.write_all(&initial).await;
            }
        });
    }
    state.processes.insert(Arc::clone(&process));
    let info = process.info();
    let task_state = Arc::clone(&state);
    state.tracker.spawn(async move {
        let mut sink = LogSink::new(Arc::clone(&process));
        let outcome = started.drive(&mut sink, &process.cancel).await;
        process.finish(outcome.exit_info());
        *process.stdin.lock().await = None;
        task_state.processes.prune();
        tracing::debug!(id = %process.id, exit = ?outcome.exit_info(), "background process ended");
    });
    Ok(json(StatusCode::CREATED, &info))
}

fn find(state: &State, id: &str) -> Result<Arc<Process>> {
    state
        .processes
        .get(id)
        .ok_or_else(|| ApiError::v1(ErrorCode::NotFound, format!("no process with id '{id}'")))
}

pub(crate) async fn list(Extract(state): Extract<State>) -> Response {
    let processes = state.processes.list().iter().map(|p| p.info()).collect();
    json(StatusCode::OK, &ProcessList { processes })
}

pub(crate) async fn get(Extract(state): Extract<State>, Path(id): Path<String>) -> Response {
    match find(&state, &id) {
        Ok(process) => json(StatusCode::OK, &process.info()),
        Err(error) => error.into_response(),
    }
}

/// Kills a running process (its whole group), waits briefly for its end, and forgets it.
pub(crate) async fn delete(Extract(state): Extract<State>, Path(id): Path<String>) -> Response {
    let process = match find(&state, &id) {
        Ok(process) => process,
        Err(error) => return error.into_response(),
    };
    process.cancel.cancel();
    let mut changed_rx = process.subscribe();
    let wait = state.config.drain_timeout + Duration::from_secs(1);
    let _ = tokio::time::timeout(wait, async {
        while process.exit().is_none() {
            if changed_rx.changed().await.is_err() {
                break;
            }
        }
    })
    .await;
    state.processes.remove(&id);
    StatusCode::NO_CONTENT.into_response()
}

/// Chunks sent per read of the log before re-checking (keeps each step bounded).
const CHUNKS_PER_STEP: usize = 64;

pub(crate) async fn output(
    Extract(state): Extract<State>,
    Path(id): Path<String>,
    query: std::result::Result<Query<OutputQuery>, QueryRejection>,
) -> Response {
    let Query(query) = match query {
        Ok(query) => query,
        Err(error) => return invalid(error.body_text()).into_response(),
    };
    let process = match find(&state, &id) {
        Ok(process) => process,
        Err(error) => return error.into_response(),
    };
    let offset = query.offset.unwrap_or(0);
    let end = process.info().output_end;
    if offset > end {
        return invalid(format!(
            "offset {offset} is past the end of the output ({end})"
        ))
        .into_response();
    }
    let reader = OutputReader {
        changed_rx: process.subscribe(),
        process,
        offset,
        follow: query.follow == Some(true),
        pending: std::collections::VecDeque::new(),
        done: false,
    };
    let stream = futures_util::stream::unfold(reader, |mut reader| async move {
        reader
            .next()
            .await
            .map(|line| (Ok::<_, Infallible>(line), reader))
    });
    ndjson_response(Body::from_stream(stream))
}

/// Reads a process's output log from an offset, as NDJSON lines.
struct OutputReader {
    process: Arc<Process>,
    changed_rx: tokio::sync::watch::Receiver<u64>,
    offset: u64,
    follow: bool,
    pending: std::collections::VecDeque<ExecEvent>,
    done: bool,
}

impl OutputReader {
    async fn next(&mut self) -> Option<bytes::Bytes> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Some(ndjson_line(&event));
            }
            if self.done {
                return None;
            }
            self.changed_rx.borrow_and_update();
            // The exit is read before the log: output pushed before the exit was recorded is
            // then certainly in this read.
            let exit = self.process.exit();
            let read = self.process.read(self.offset, CHUNKS_PER_STEP);
            if read.dropped > 0 {
                self.pending.push_back(ExecEvent::Dropped {
                    offset: self.offset,
                    bytes: read.dropped,
                });
            }
            let progressed = read.dropped > 0 || !read.chunks.is_empty();
            for (kind, offset, bytes) in &read.chunks {
                self.pending.push_back(chunk_event(*kind, *offset, bytes));
            }
            self.offset = read.next.max(self.offset);
            if progressed {
                continue;
            }
            match exit {
                Some(exit) => {
                    self.pending.push_back(ExecEvent::Exit(exit));
                    self.done = true;
                }
                None if !self.follow => {
                    self.pending.push_back(ExecEvent::End {
                        next_offset: self.offset,
                    });
                    self.done = true;
                }
                None => {
                    if self.changed_rx.changed().await.is_err() {
                        self.done = true;
                    }
                }
            }
        }
    }
}

/// How long a write to a process's standard input may wait for it to read.
const STDIN_WRITE_TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) async fn stdin(
    Extract(state): Extract<State>,
    Path(id): Path<String>,
    query: std::result::Result<Query<StdinQuery>, QueryRejection>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let Query(query) = match query {
        Ok(query) => query,
        Err(error) => return invalid(error.body_text()).into_response(),
    };
    let process = match find(&state, &id) {
        Ok(process) => process,
        Err(error) => return error.into_response(),
    };
    let bytes = match read_body(&headers, body, state.config.max_body_bytes).await {
        Ok(bytes) => bytes,
        Err(error) => return error.into_api(Flavor::V1).into_response(),
    };
    let mut pipe = process.stdin.lock().await;
    let Some(writer) = pipe.as_mut() else {
        return ApiError::v1(
            ErrorCode::Conflict,
            format!("standard input of process '{id}' is closed"),
        )
        .into_response();
    };
    match tokio::time::timeout(STDIN_WRITE_TIMEOUT, writer.write_all(&bytes)).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => {
            *pipe = None;
            process.close_stdin_flag();
            return ApiError::v1(
                ErrorCode::Conflict,
                format!("process '{id}' closed its standard input: {error}"),
            )
            .into_response();
        }
        Err(_) => {
            return ApiError::v1(
                ErrorCode::Conflict,
                format!(
                    "process '{id}' did not read its standard input within {STDIN_WRITE_TIMEOUT:?}"
                ),
            )
            .into_response();
        }
    }
    if query.eof == Some(true) {
        *pipe = None;
        process.close_stdin_flag();
    }
    json(
        StatusCode::OK,
        &StdinResponse {
            written: bytes.len() as u64,
            stdin_open: pipe.is_some(),
        },
    )
}

pub(crate) async fn signal(
    Extract(state): Extract<State>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let process = match find(&state, &id) {
        Ok(process) => process,
        Err(error) => return error.into_response(),
    };
    let bytes = match read_body(&headers, body, state.config.max_body_bytes).await {
        Ok(bytes) => bytes,
        Err(error) => return error.into_api(Flavor::V1).into_response(),
    };
    let request: SignalRequest = match serde_json::from_slice(&bytes) {
        Ok(request) => request,
        Err(error) => return invalid(format!("invalid request body: {error}")).into_response(),
    };
    let Some(signal) = parse_signal(&request.signal) else {
        return invalid(format!("unknown signal {:?}", request.signal)).into_response();
    };
    if process.exit().is_some() || !signal_group(process.pgid, signal) {
        return ApiError::v1(ErrorCode::Conflict, format!("process '{id}' has exited"))
            .into_response();
    }
    json(StatusCode::OK, &process.info())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals() {
        assert_eq!(
            parse_signal(&SignalName::Name("TERM".into())),
            Some(Signal::TERM)
        );
        assert_eq!(
            parse_signal(&SignalName::Name("sigkill".into())),
            Some(Signal::KILL)
        );
        assert_eq!(parse_signal(&SignalName::Number(2)), Some(Signal::INT));
        assert_eq!(parse_signal(&SignalName::Name("NOPE".into())), None);
        assert_eq!(parse_signal(&SignalName::Number(0)), None);
    }
}
