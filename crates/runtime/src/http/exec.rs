//! The one exec pipeline behind `POST /execute`, `POST /v1/exec` and `POST /v1/processes`.
//!
//! A request arrives in `/v1` terms, as an [`ExecRequest`] (the legacy adapter translates
//! upstream's body into one). [`prepare`] checks it once (a command, no NUL byte, the working
//! directory confined, the environment, the timeout, the output cap) and [`start`] starts it
//! once (not while shutting down, within the process slots, one spawn path). Each endpoint turns
//! the typed refusals into its own wire shape and drives the started command with its own
//! [`Sink`]: a buffer for `/execute`, a stream for `/v1/exec`, a log for a background process.

use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agent_sandbox_api::runtime::v1::{ErrorCode, ExecRequest};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{ApiError, Flavor, State};
use crate::exec::spawn::spawn;
use crate::exec::{CommandSpec, Limits, Outcome, Sink, Spawned, drive};
use crate::paths::{Absolute, FsErrorKind, PathError, classify};

/// Why a request was refused before anything ran. The endpoint chooses the answer.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// Neither or both of `command` and `argv`, or an empty `argv`.
    NoCommand,
    /// The program or one of its arguments contains a NUL byte (the OS cannot pass it).
    Nul,
    /// `timeout_seconds` is not a finite number above 0.
    Timeout,
    /// The working directory or an environment variable, refused in the endpoint's error shape.
    Api(ApiError),
}

/// A checked request: what to spawn, what to feed it and its bounds.
#[derive(Debug)]
pub(crate) struct Prepared {
    pub(crate) spec: CommandSpec,
    pub(crate) stdin: Option<Vec<u8>>,
    pub(crate) limits: Limits,
}

/// Checks `request` and resolves it against the runtime's configuration. `default_timeout` is
/// the timeout when the request gives none (`None`: no timeout); `flavor` is the error shape of
/// the working-directory and environment refusals.
pub(crate) fn prepare(
    state: &State,
    request: ExecRequest,
    default_timeout: Option<Duration>,
    flavor: Flavor,
) -> Result<Prepared, Refusal> {
    let argv = match (request.command, request.argv) {
        (Some(command), None) => vec!["/bin/sh".to_owned(), "-c".to_owned(), command],
        (None, Some(argv)) if !argv.is_empty() => argv,
        _ => return Err(Refusal::NoCommand),
    };
    if argv.iter().any(|arg| arg.contains('\0')) {
        return Err(Refusal::Nul);
    }
    let cwd = resolve_cwd(state, request.cwd.as_deref(), flavor).map_err(Refusal::Api)?;
    let env = check_env(request.env, flavor).map_err(Refusal::Api)?;
    let timeout = match request.timeout_seconds {
        None => default_timeout,
        Some(seconds) => Some(check_timeout(seconds).ok_or(Refusal::Timeout)?),
    };
    let stdin = request.stdin.map(String::into_bytes);
    Ok(Prepared {
        spec: CommandSpec {
            argv,
            cwd,
            env,
            stdin_piped: stdin.is_some() || request.stdin_open == Some(true),
        },
        stdin,
        limits: Limits {
            timeout,
            max_output_bytes: request
                .max_output_bytes
                .unwrap_or(u64::MAX)
                .min(state.config.max_output_bytes),
            drain: state.config.drain_timeout,
        },
    })
}

/// The working directory a request asks for, confined to the base directory.
fn resolve_cwd(state: &State, cwd: Option<&str>, flavor: Flavor) -> Result<PathBuf, ApiError> {
    let Some(cwd) = cwd else {
        return Ok(state.root.canonical().to_path_buf());
    };
    let rel = state
        .root
        .relative(cwd, Absolute::Refuse)
        .map_err(|e| ApiError::path(flavor, e, cwd))?;
    state
        .root
        .directory(&rel)
        .map_err(|error| match classify(&error) {
            FsErrorKind::Escapes | FsErrorKind::Loop | FsErrorKind::PermissionDenied => {
                ApiError::path(flavor, PathError::Escapes, cwd)
            }
            FsErrorKind::NameTooLong => ApiError::path(flavor, PathError::TooLong, cwd),
            _ => ApiError::new(
                flavor,
                ErrorCode::NotFound,
                format!("working directory '{cwd}' is not a directory beneath the base directory"),
            ),
        })
}

/// Environment variables as given, refusing names and values the OS cannot take.
fn check_env(
    env: Option<BTreeMap<String, String>>,
    flavor: Flavor,
) -> Result<Vec<(String, String)>, ApiError> {
    let Some(env) = env else {
        return Ok(Vec::new());
    };
    if let Some((name, _)) = env.iter().find(|(name, value)| {
        name.is_empty() || name.contains('=') || name.contains('\0') || value.contains('\0')
    }) {
        return Err(ApiError::new(
            flavor,
            ErrorCode::InvalidArgument,
            format!("invalid environment variable name or value: {name:?}"),
        ));
    }
    Ok(env.into_iter().collect())
}

/// A requested timeout, when it is a finite number of seconds above 0.
fn check_timeout(seconds: f64) -> Option<Duration> {
    if seconds.is_finite() && seconds > 0.0 {
        // Beyond ~30 years a timeout means none; keep it representable.
        Duration::try_from_secs_f64(seconds.min(1e9)).ok()
    } else {
        None
    }
}

/// Why a prepared command did not start.
#[derive(Debug)]
pub(crate) enum StartError {
    /// Shutdown has begun.
    ShuttingDown,
    /// Every process slot is taken.
    Busy,
    /// `execve` (or the hardening hook) failed for `program`.
    Spawn { error: io::Error, program: String },
}

/// A running command with its process slot, ready to be driven.
#[derive(Debug)]
pub(crate) struct Started {
    pub(crate) spawned: Spawned,
    /// Written to standard input (then closed) while output is read.
    pub(crate) stdin: Option<Vec<u8>>,
    pub(crate) limits: Limits,
    permit: OwnedSemaphorePermit,
    started: Instant,
}

/// Takes a process slot and spawns `prepared`.
pub(crate) fn start(state: &State, prepared: Prepared) -> Result<Started, StartError> {
    if state.shutdown.is_cancelled() {
        return Err(StartError::ShuttingDown);
    }
    let permit = Arc::clone(&state.permits)
        .try_acquire_owned()
        .map_err(|_| StartError::Busy)?;
    let started = Instant::now();
    let Prepared {
        spec,
        stdin,
        limits,
    } = prepared;
    match spawn(&spec, &state.groups, state.hardening.as_ref()) {
        Ok(spawned) => Ok(Started {
            spawned,
            stdin,
            limits,
            permit,
            started,
        }),
        Err(error) => Err(StartError::Spawn {
            error,
            program: spec.argv.into_iter().next().unwrap_or_default(),
        }),
    }
}

impl Started {
    /// Runs the command to its end into `sink`; the process slot is given back then.
    pub(crate) async fn drive<S: Sink>(self, sink: &mut S, cancel: &CancellationToken) -> Outcome {
        let Self {
            spawned,
            stdin,
            limits,
            permit,
            started,
        } = self;
        let outcome = drive(spawned, stdin, limits, sink, cancel, started).await;
        drop(permit);
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts() {
        assert_eq!(check_timeout(1.5), Some(Duration::from_millis(1500)));
        assert_eq!(check_timeout(0.0), None);
        assert_eq!(check_timeout(-1.0), None);
        assert_eq!(check_timeout(f64::NAN), None);
        assert!(check_timeout(1e300).is_some());
    }
}
